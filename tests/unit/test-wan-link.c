/* The WAN proxy's link model (tests/lib/wan_link.h) alone, without sockets: segments are never
 * handed over out of order under jitter and loss, the delay is a lower bound, the token bucket
 * holds the rate, a loss stalls the stream by one retransmission timeout, and the profiles
 * say what docs/ring.md states. */
#include "tests/lib/t.h"
#include "tests/lib/wan_link.h"

#define MS 1000000ull

/* Segments of mixed sizes arriving at mixed gaps through heavy jitter and loss: every one is
 * handed over no earlier than the one before it and no earlier than its own arrival plus the
 * delay less the jitter. */
T_CASE(order_under_jitter)
{
    struct wan_params p = {.delay_ms = 20, .jitter_ms = 19, .rate = 0, .burst = 65536, .loss = 0.05,
                           .rto_min_ms = 200};
    struct wan_dir d;
    wan_dir_init(&d, &p, 7);
    uint64_t now = 1000 * MS, prev = 0, rng = 88172645463325252ull;
    unsigned overtaken_would_be = 0;
    for (int i = 0; i < 20000; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        now += rng % (3 * MS);   /* 0-3 ms apart: closer than the jitter's spread */
        size_t n = 1 + rng % 9000;
        bool lost;
        uint64_t own = now + (uint64_t)((p.delay_ms - p.jitter_ms) * MS);
        uint64_t at = wan_dir_schedule(&d, now, n, &lost);
        T_CHECK(at >= prev, "segment %d handed over at %llu, before the previous one (%llu)", i,
                (unsigned long long)at, (unsigned long long)prev);
        T_CHECK(at >= own, "segment %d handed over %llu ns before its delay less the jitter", i,
                (unsigned long long)(own - at));
        if (lost)
            T_CHECK(at >= now + 200 * MS, "lost segment %d not stalled by the RTO", i);
        overtaken_would_be += at == prev;   /* held back behind an earlier, later-drawn one */
        prev = at;
    }
    /* the case means something only if jitter and loss did hold segments back */
    T_CHECK(overtaken_would_be > 100, "only %u segments were held back behind an earlier one", overtaken_would_be);
    T_CHECK(d.lost > 100, "only %llu of 20000 segments lost at 5%% per packet", (unsigned long long)d.lost);
}

/* No jitter, no rate, no loss: exactly the delay, and nothing at all with every knob at 0. */
T_CASE(plain_delay)
{
    struct wan_params p = {.delay_ms = 20, .burst = WAN_MSS, .rto_min_ms = 200};
    struct wan_dir d;
    wan_dir_init(&d, &p, 1);
    T_CHECK(wan_dir_schedule(&d, 5 * MS, 100, NULL) == 25 * MS, "20 ms delay");
    T_CHECK(wan_dir_schedule(&d, 6 * MS, 100, NULL) == 26 * MS, "20 ms delay, second segment");
    struct wan_params z = {.burst = WAN_MSS, .rto_min_ms = 200};
    wan_dir_init(&d, &z, 1);
    for (uint64_t t = 1; t < 1000; t += 7)
        T_CHECK(wan_dir_schedule(&d, t, 65536, NULL) == t, "no knob: handed over at once");
}

/* The token bucket queues: 10 MB offered at once through 1 MB/s with a 64 KiB bucket leaves
 * over 10 s less the bucket, and a segment after an idle second leaves at once. */
T_CASE(rate_limit)
{
    struct wan_params p = {.rate = 1e6, .burst = 65536, .rto_min_ms = 200};
    struct wan_dir d;
    wan_dir_init(&d, &p, 1);
    uint64_t at = 0;
    for (int i = 0; i < 1000; i++)
        at = wan_dir_schedule(&d, 1 * MS, 10000, NULL);
    double s = (double)(at - 1 * MS) / 1e9, want = (1e7 - 65536) / 1e6;
    T_CHECK(s >= want - 1e-6 && s <= want + 1e-3, "10 MB at 1 MB/s took %.6f s, expected %.6f", s, want);
    uint64_t later = at + 1000 * MS;
    T_CHECK(wan_dir_schedule(&d, later, 1000, NULL) == later, "after an idle second the bucket is full");
}

/* Every 10th segment lost (deterministic): those, and only those, pay max(200 ms, 2 RTT). */
T_CASE(loss_stalls)
{
    struct wan_params p = {.delay_ms = 80, .burst = WAN_MSS, .loss_every = 10, .rto_min_ms = 200};
    struct wan_dir d;
    wan_dir_init(&d, &p, 1);
    T_CHECK(wan_rto_ms(&p) == 320, "RTO at 80 ms one way: 2 x 160 ms RTT, got %.1f", wan_rto_ms(&p));
    for (uint64_t i = 1; i <= 30; i++) {
        bool lost;
        uint64_t now = i * 1000 * MS;   /* far apart: no segment waits behind another */
        uint64_t at = wan_dir_schedule(&d, now, 100, &lost);
        T_CHECK(lost == (i % 10 == 0), "segment %llu: lost %d", (unsigned long long)i, lost);
        T_CHECK(at == now + (lost ? 400 : 80) * MS, "segment %llu handed over after %.1f ms",
                (unsigned long long)i, (double)(at - now) / MS);
    }
    struct wan_params q = {.delay_ms = 20, .burst = WAN_MSS, .rto_min_ms = 200};
    T_CHECK(wan_rto_ms(&q) == 200, "RTO floor 200 ms at 20 ms one way");
    /* a segment behind a lost one waits for it (head-of-line blocking) */
    p.loss_every = 1;
    wan_dir_init(&d, &p, 1);
    uint64_t a = wan_dir_schedule(&d, 0, 100, NULL);
    p.loss_every = 0;
    d.p = p;
    uint64_t b = wan_dir_schedule(&d, 1 * MS, 100, NULL);
    T_CHECK(b == a, "the next segment waits behind the lost one (%llu vs %llu)", (unsigned long long)b,
            (unsigned long long)a);
}

/* Random loss is per packet: a 1% rate loses about 1% of one-packet segments and about 1 - 0.99^45
 * of 64 KiB ones. */
T_CASE(loss_per_packet)
{
    struct wan_params p = {.burst = WAN_MSS, .loss = 0.01, .rto_min_ms = 200};
    struct wan_dir d;
    wan_dir_init(&d, &p, 3);
    for (int i = 0; i < 100000; i++)
        wan_dir_schedule(&d, (uint64_t)i * 1000 * MS, 1000, NULL);
    T_CHECK(d.lost > 800 && d.lost < 1200, "%llu of 100000 small segments lost at 1%%", (unsigned long long)d.lost);
    wan_dir_init(&d, &p, 4);
    for (int i = 0; i < 10000; i++)
        wan_dir_schedule(&d, (uint64_t)i * 1000 * MS, 65536, NULL);
    double want = 1 - pow(0.99, 46);   /* 65536 B = 46 packets */
    T_CHECK(fabs((double)d.lost / 10000 - want) < 0.03, "%llu of 10000 64 KiB segments lost, expected ~%.0f",
            (unsigned long long)d.lost, want * 10000);
}

/* The profiles docs/ring.md states. */
T_CASE(profiles)
{
    struct wan_params p;
    T_ASSERT(wan_profile_get("lan", &p) == 0, "lan");
    T_CHECK(p.delay_ms == 0.2 && p.loss == 0, "lan: 0.2 ms, no loss");
    T_ASSERT(wan_profile_get("wan", &p) == 0, "wan");
    T_CHECK(p.delay_ms == 20 && p.jitter_ms == 2 && p.rate == 12.5e6 && p.loss == 0, "wan: 20 ms, 100 Mbit/s");
    T_ASSERT(wan_profile_get("phone", &p) == 0, "phone");
    T_CHECK(p.delay_ms == 50 && p.rate == 2.5e6 && p.loss == 0.01, "phone: 50 ms, 20 Mbit/s, 1%% loss");
    T_ASSERT(wan_profile_get("none", &p) == 0, "none");
    T_CHECK(p.delay_ms == 0 && p.jitter_ms == 0 && p.rate == 0 && p.loss == 0, "none: nothing");
    T_CHECK(wan_profile_get("moon", &p) == -ENOENT, "an unknown profile");
}

int main(int argc, char **argv)
{
    t_init(argc, argv);
    T_RUN(order_under_jitter);
    T_RUN(plain_delay);
    T_RUN(rate_limit);
    T_RUN(loss_stalls);
    T_RUN(loss_per_packet);
    T_RUN(profiles);
    return T_DONE();
}

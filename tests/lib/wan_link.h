/* wan_link.h — the link model of the WAN delay proxy (tests/tools/tool-wan-proxy.c): when a segment
 * that entered one direction of a link at time t is handed to the far end. Pure functions
 * with no I/O, so that tests/unit/test-wan-link.c checks the model alone.
 *
 * One direction of a link, in the order a segment meets them:
 *   1. a token bucket (rate bytes/s, burst bytes) that queues: a segment leaves once the
 *      bucket holds its bytes, so a burst beyond the bucket drains at the rate;
 *   2. a one-way delay plus jitter, uniform in [delay - jitter, delay + jitter] (never < 0);
 *   3. TCP-like loss: each packet of WAN_MSS bytes is lost with probability `loss` (and every
 *      `loss_every`-th segment, for tests that need a loss for sure); a segment with a lost
 *      packet arrives one retransmission timeout later, max(rto_min, 2 x RTT) with RTT taken
 *      as twice the one-way delay, as a TCP sender that saw no duplicate ACKs retransmits;
 *   4. in order: a segment is never handed over before the one ahead of it, as a TCP receiver
 *      gives the application its bytes in order whatever its packets did. So jitter and a
 *      loss stall the stream behind them (head-of-line blocking), and bytes are never
 *      reordered.
 * The kernel's TCP under the proxy runs on loopback and never loses anything: the stall is the
 * whole cost of a loss here, as it is for a TCP stream over a lossy path with little in flight
 * (the ring's decode frames are a few kB), where the retransmission timer fires before three
 * duplicate ACKs can arrive.
 *
 * Times are nanoseconds on the monotonic clock (uv_hrtime); one struct wan_dir per direction.
 */
#ifndef KV_TESTS_WAN_LINK_H
#define KV_TESTS_WAN_LINK_H

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define WAN_MSS 1448   /* payload bytes of one TCP packet on an Ethernet path */

/* What one direction of a link does (both directions of a proxied link get the same). */
struct wan_params {
    double delay_ms;     /* one-way delay */
    double jitter_ms;    /* +- uniform around delay_ms */
    double rate;         /* bytes per second; 0: unlimited */
    double burst;        /* token bucket depth in bytes (at least one packet) */
    double loss;         /* probability that one packet of WAN_MSS bytes is lost */
    uint64_t loss_every; /* also lose every N-th segment (0: never); deterministic, for tests */
    double rto_min_ms;   /* the retransmission timeout's floor (Linux: 200 ms) */
};

/* The stated profiles: one hop of each kind of path. Delays are one way; a ring pass of N
 * stages costs N of them. */
struct wan_profile {
    const char *name;
    const char *what;
    struct wan_params p;
};

static const struct wan_profile wan_profiles[] = {
    {"none", "no delay, no limit, no loss: the proxy's own overhead",
     {0, 0, 0, 0, 0, 0, 200}},
    {"lan", "a LAN hop: 0.2 ms, 1 Gbit/s",
     {0.2, 0.02, 125e6, 64 * 1024, 0, 0, 200}},
    {"wan", "a continental internet hop: 20 ms +- 2 ms, 100 Mbit/s",
     {20, 2, 12.5e6, 64 * 1024, 0, 0, 200}},
    {"phone", "a phone on a carrier network through a relay: 50 ms +- 10 ms, 20 Mbit/s, 1% loss",
     {50, 10, 2.5e6, 32 * 1024, 0.01, 0, 200}},
};

/* The profile called name into *p: 0, or -ENOENT. */
static inline int wan_profile_get(const char *name, struct wan_params *p)
{
    for (size_t i = 0; i < sizeof wan_profiles / sizeof wan_profiles[0]; i++)
        if (!strcmp(wan_profiles[i].name, name)) {
            *p = wan_profiles[i].p;
            return 0;
        }
    return -ENOENT;
}

/* The retransmission timeout a lost segment costs, in ms. */
static inline double wan_rto_ms(const struct wan_params *p)
{
    double rtt2 = 2 * (2 * p->delay_ms);
    return rtt2 > p->rto_min_ms ? rtt2 : p->rto_min_ms;
}

/* One direction's state. */
struct wan_dir {
    struct wan_params p;
    uint64_t rng;          /* xorshift64* state, never 0 */
    uint64_t tb_ns;        /* the bucket's clock: tokens were tb_tokens at tb_ns */
    double tb_tokens;      /* may be negative: bytes still owed by a segment in the queue */
    uint64_t last_ns;      /* when the last segment is handed over (order is kept from it) */
    uint64_t segments, bytes, lost;
};

static inline void wan_dir_init(struct wan_dir *d, const struct wan_params *p, uint64_t seed)
{
    memset(d, 0, sizeof *d);
    d->p = *p;
    d->rng = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    if (!d->rng)
        d->rng = 1;
    d->tb_tokens = p->burst;
}

/* A uniform double in [0, 1). */
static inline double wan_rand(struct wan_dir *d)
{
    d->rng ^= d->rng >> 12;
    d->rng ^= d->rng << 25;
    d->rng ^= d->rng >> 27;
    return (double)((d->rng * 0x2545F4914F6CDD1Dull) >> 11) * (1.0 / 9007199254740992.0);
}

/* A segment of n bytes entered the direction at now_ns (calls come in arrival order, with
 * now_ns never going back): the time it is handed to the far end, never before the previous
 * segment's. *lost says whether it paid a retransmission timeout. */
static inline uint64_t wan_dir_schedule(struct wan_dir *d, uint64_t now_ns, size_t n, bool *lost)
{
    const struct wan_params *p = &d->p;
    d->segments++;
    d->bytes += n;
    /* 1. the token bucket: refill since its clock (a clock ahead of now, set by a segment
     * still draining, takes tokens back), cap at the depth, take n; a debt is paid at rate */
    uint64_t leave = now_ns;
    if (p->rate > 0) {
        double tokens = d->tb_tokens + ((double)now_ns - (double)d->tb_ns) * 1e-9 * p->rate;
        if (tokens > p->burst)
            tokens = p->burst;
        tokens -= (double)n;
        if (tokens < 0) {
            leave = now_ns + (uint64_t)ceil(-tokens / p->rate * 1e9);
            d->tb_ns = leave;
            d->tb_tokens = 0;
        } else {
            d->tb_ns = now_ns;
            d->tb_tokens = tokens;
        }
    }
    /* 2. delay and jitter */
    double ms = p->delay_ms;
    if (p->jitter_ms > 0)
        ms += (2 * wan_rand(d) - 1) * p->jitter_ms;
    if (ms < 0)
        ms = 0;
    /* 3. loss: one lost packet of the segment's costs the whole segment a timeout */
    bool l = p->loss_every && d->segments % p->loss_every == 0;
    if (!l && p->loss > 0) {
        size_t pkts = n / WAN_MSS + (n % WAN_MSS != 0);
        double keep = pow(1 - p->loss, (double)(pkts ? pkts : 1));
        l = wan_rand(d) >= keep;
    }
    if (l) {
        ms += wan_rto_ms(p);
        d->lost++;
    }
    if (lost)
        *lost = l;
    uint64_t at = leave + (uint64_t)llround(ms * 1e6);
    /* 4. never ahead of the segment before it */
    if (at < d->last_ns)
        at = d->last_ns;
    d->last_ns = at;
    return at;
}

#endif

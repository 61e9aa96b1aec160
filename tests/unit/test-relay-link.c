/* The relay link transport (relay:// and relay+ws:// endpoints behind ring_link): malformed
 * endpoints are refused at dial time; an upstream and a downstream link through an
 * in-process relay carry ring frames both ways, whole and in order; the link's queued-byte
 * count drains to zero; when the relay closes the bridge, both links close with its reason. */
#include "ring/ring.h"
#include "tests/lib/ws_tc.h"
#include "util/err.h"

#define N_FRAMES 200

struct side {
    struct ring_link *l;
    int opened, frames, bad, closed;
    char reason[256];
};

static void l_open(struct ring_link *l, int status)
{
    struct side *s = ring_link_ud(l);
    s->opened = status == 0 ? 1 : -1;
}

static void l_frame(struct ring_link *l, const struct ring_frame_hdr *h, const uint8_t *p)
{
    struct side *s = ring_link_ud(l);
    bool ok = h->type == RING_F_ACT && h->pos == (uint32_t)s->frames && h->payload_len == (uint32_t)(s->frames * 97 % 5000);
    for (uint32_t i = 0; ok && i < h->payload_len; i++)
        ok = p[i] == (uint8_t)(i + h->pos);
    if (!ok)
        s->bad++;
    s->frames++;
}

static void l_close(struct ring_link *l, const char *reason)
{
    struct side *s = ring_link_ud(l);
    s->closed = 1;
    snprintf(s->reason, sizeof s->reason, "%s", reason);
    s->l = NULL;
}

static const struct ring_link_cbs cbs = {.on_open = l_open, .on_frame = l_frame, .on_close = l_close};

static void send_frames(struct ring_link *l)
{
    static uint8_t buf[5000];
    for (int k = 0; k < N_FRAMES; k++) {
        uint32_t n = (uint32_t)(k * 97 % 5000);
        for (uint32_t i = 0; i < n; i++)
            buf[i] = (uint8_t)(i + (uint32_t)k);
        struct ring_frame_hdr h = {.magic = RING_MAGIC, .type = RING_F_ACT, .session = 7, .pos = (uint32_t)k,
                                  .n_tokens = 1};
        ring_link_send(l, &h, buf, n);
    }
}

static void run_until(uv_loop_t *loop, bool (*done)(void *), void *arg, int ms)
{
    uint64_t t0 = tc_now_ms();
    while (!done(arg) && tc_now_ms() - t0 < (uint64_t)ms)
        uv_run(loop, UV_RUN_NOWAIT), usleep(1000);
}

static struct side up, down;

static bool both_open(void *a) { return up.opened && down.opened; }
static bool all_frames(void *a) { return up.frames == N_FRAMES && down.frames == N_FRAMES; }
static bool both_closed(void *a) { return up.closed && down.closed; }
static bool drained(void *a) { return ring_link_queued(up.l) == 0 && ring_link_queued(down.l) == 0; }

T_CASE(bad_endpoints_refused)
{
    T_ASSERT(net_relay_transport_register() == 0, "register");
    T_CHECK(net_relay_transport_register() == 0, "second registration must be harmless");
    uv_loop_t loop;
    uv_loop_init(&loop);
    static const char *bad[] = {
        "relay+ws://127.0.0.1:9/0123456789abcdef0123456789abcdef",      /* no /b/ */
        "relay+ws://127.0.0.1:9/b/",                                     /* empty id */
        "relay+ws://127.0.0.1:9/b/0123456789abcdef0123456789abcdef?role=side",
        "relay+ws:///b/0123456789abcdef0123456789abcdef",                /* no host */
    };
    struct side s = {0};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct ring_link *l = NULL;
        char err[KV_ERR_MAX] = "";
        int rc = ring_link_dial(&l, &loop, bad[i], &cbs, &s, 1 << 20, err, sizeof err);
        T_CHECK(rc < 0 && strstr(err, "expected HOST:PORT/b/BRIDGE-ID"), "endpoint %s: rc %d, %s",
                bad[i], rc, err);
    }
    T_CHECK(net_relay_endpoint("relay://h:443/b/00") && net_relay_endpoint("relay+ws://h:1/b/00") &&
            !net_relay_endpoint("tcp://h:1"), "net_relay_endpoint");
    uv_run(&loop, UV_RUN_DEFAULT);
    T_CHECK(uv_loop_close(&loop) == 0, "loop left handles");
}

/* Relay R started with cfg, a loop and a fresh bridge on R: the up side's endpoint and the
 * down side's, the up side's state zeroed. 0, or tc_relay_start's error (nothing started). */
static int relay_bridge(struct tc_relay *R, const struct kvd_relay_config *cfg, uv_loop_t *loop,
                        char ep[200], char ep_down[220])
{
    int rc = tc_relay_start(R, cfg);
    if (rc)
        return rc;
    uv_loop_init(loop);
    char id[33];
    tc_bridge_id(id);
    snprintf(ep, 200, "relay+ws://127.0.0.1:%d/b/%s", R->port, id);
    snprintf(ep_down, 220, "%s?role=down", ep);
    memset(&up, 0, sizeof up);
    return 0;
}

T_CASE(frames_through_the_relay)
{
    struct tc_relay R;
    struct kvd_relay_config cfg = {.plain = true};
    uv_loop_t loop;
    char ep[200], ep_down[220];
    T_ASSERT(relay_bridge(&R, &cfg, &loop, ep, ep_down) == 0, "relay start");
    memset(&down, 0, sizeof down);
    T_ASSERT(ring_link_dial(&down.l, &loop, ep_down, &cbs, &down, 1 << 20, NULL, 0) == 0, "dial down");
    T_ASSERT(ring_link_dial(&up.l, &loop, ep, &cbs, &up, 1 << 20, NULL, 0) == 0, "dial up");
    run_until(&loop, both_open, NULL, 5000);
    T_ASSERT(up.opened == 1 && down.opened == 1, "links open: up %d down %d", up.opened, down.opened);
    send_frames(up.l);
    send_frames(down.l);
    run_until(&loop, all_frames, NULL, 10000);
    T_CHECK(up.frames == N_FRAMES && down.frames == N_FRAMES, "frames: up got %d, down got %d of %d",
            up.frames, down.frames, N_FRAMES);
    T_CHECK(!up.bad && !down.bad, "frames changed or reordered: %d %d", up.bad, down.bad);
    run_until(&loop, drained, NULL, 3000); /* write callbacks may still be on their way */
    T_CHECK(ring_link_queued(up.l) == 0 && ring_link_queued(down.l) == 0, "queued bytes left: %zu %zu",
            ring_link_queued(up.l), ring_link_queued(down.l));
    /* the relay goes away: both links close, saying why */
    T_CHECK(tc_relay_stop(&R) == 0, "relay loop left handles");
    run_until(&loop, both_closed, NULL, 5000);
    T_CHECK(up.closed && down.closed, "links still open after the relay stopped");
    T_CHECK(strstr(up.reason, "relay") != NULL, "close reason: %s", up.reason);
    uv_run(&loop, UV_RUN_DEFAULT);
    T_CHECK(uv_loop_close(&loop) == 0, "loop left handles");
}

static struct side bigs;
static size_t big_got;
static void big_frame(struct ring_link *l, const struct ring_frame_hdr *h, const uint8_t *p)
{
    bool ok = h->payload_len == (3u << 20);
    for (uint32_t i = 0; ok && i < h->payload_len; i += 4093)
        ok = p[i] == (uint8_t)(i * 7);
    big_got = ok ? h->payload_len : 1;
}
static const struct ring_link_cbs big_cbs = {.on_open = l_open, .on_frame = big_frame, .on_close = l_close};
static bool big_done(void *a) { return big_got != 0; }

/* A frame larger than the relay's message limit still crosses: the transport splits it. */
T_CASE(frame_over_the_relay_message_limit)
{
    struct tc_relay R;
    struct kvd_relay_config cfg = {.plain = true, .max_msg_bytes = 2u << 20};
    uv_loop_t loop;
    char ep[200], ep_down[220];
    T_ASSERT(relay_bridge(&R, &cfg, &loop, ep, ep_down) == 0, "relay start");
    memset(&bigs, 0, sizeof bigs);
    big_got = 0;
    T_ASSERT(ring_link_dial(&bigs.l, &loop, ep_down, &big_cbs, &bigs, 4u << 20, NULL, 0) == 0, "dial down");
    T_ASSERT(ring_link_dial(&up.l, &loop, ep, &cbs, &up, 4u << 20, NULL, 0) == 0, "dial up");
    down.opened = 1;
    uint64_t t0 = tc_now_ms();
    while (!(up.opened && bigs.opened) && tc_now_ms() - t0 < 5000)
        uv_run(&loop, UV_RUN_NOWAIT), usleep(1000);
    T_ASSERT(up.opened == 1 && bigs.opened == 1, "links open");
    uint8_t *p = malloc(3u << 20);
    for (uint32_t i = 0; i < (3u << 20); i++)
        p[i] = (uint8_t)(i * 7);
    struct ring_frame_hdr h = {.magic = RING_MAGIC, .type = RING_F_ACT, .session = 1, .n_tokens = 1};
    T_CHECK(ring_link_send(up.l, &h, p, 3u << 20) == 0, "send");
    free(p);
    run_until(&loop, big_done, NULL, 10000);
    T_CHECK(big_got == (3u << 20), "3 MiB frame through a relay with a 2 MiB message limit: got %zu", big_got);
    if (up.l)
        ring_link_close(up.l, "done");
    if (bigs.l)
        ring_link_close(bigs.l, "done");
    uv_run(&loop, UV_RUN_DEFAULT);
    T_CHECK(uv_loop_close(&loop) == 0, "loop left handles");
    T_CHECK(tc_relay_stop(&R) == 0, "relay loop left handles");
}

T_CASE(dial_refused_reports_failure)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    bind(fd, (struct sockaddr *)&a, sizeof a);
    getsockname(fd, (struct sockaddr *)&a, &al);
    close(fd); /* a port with nobody listening */
    char ep[200];
    snprintf(ep, sizeof ep, "relay+ws://127.0.0.1:%d/b/0123456789abcdef0123456789abcdef", ntohs(a.sin_port));
    struct side s = {0};
    T_ASSERT(ring_link_dial(&s.l, &loop, ep, &cbs, &s, 1 << 20, NULL, 0) == 0, "dial");
    uv_run(&loop, UV_RUN_DEFAULT);
    T_CHECK(s.opened == -1 && s.closed, "refused dial: opened %d closed %d (%s)", s.opened, s.closed, s.reason);
    T_CHECK(uv_loop_close(&loop) == 0, "loop left handles");
}

int main(int argc, char **argv)
{
    t_init(argc, argv);
    srand((unsigned)getpid());
    /* process-wide: registered once here, before the cases (each runs in a child) */
    t_current = "setup";
    T_CHECK(net_relay_transport_register() == 0, "register the relay transports");
    T_RUN(bad_endpoints_refused);
    T_RUN(frames_through_the_relay);
    T_RUN(frame_over_the_relay_message_limit);
    T_RUN(dial_refused_reports_failure);
    return T_DONE();
}

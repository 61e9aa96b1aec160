/* tool-relay-load: load and latency benchmark for the relay (used by tests/bench.sh).
 *
 *   tool-relay-load --url ws[s]://HOST:PORT --bridges N --bytes B [--msg M]
 *       N bridges at once, each end sending B bytes to the other in messages of M bytes
 *       (both directions at the same time); every message is checked for content and order.
 *       Prints the aggregate throughput; exits 1 on any loss, corruption or reordering.
 *   tool-relay-load --url ws[s]://HOST:PORT --latency K
 *       K round trips of a 64-byte message through one bridge, then K round trips over a
 *       direct loopback TCP connection; prints both medians and the added one-way latency.
 * wss:// certificates are not checked (a benchmark against a local test relay). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <uv.h>

#include "net/net.h"
#include "util/util.h"
#include "util/err.h"

static const char *url_base;
static struct net_tls_ctx *tls;
static uint32_t n_bridges = 1000, msg_bytes = 32768;
static uint64_t bytes_each = 1 << 20;
static uint32_t latency_rounds;
static uint64_t done_ends, failed, opened, closed_ends;
static double t_start;

/* Message k of a direction: a 12-byte header (bridge, direction, k) then bytes of a random
 * base buffer starting at an offset that depends on k: a lost, reordered or altered message
 * fails the header check or the memcmp, and checking costs little CPU. */
static uint8_t *base_buf;

static void fill_msg(uint8_t *m, size_t n, uint32_t bridge, uint32_t dir, uint32_t seq)
{
    uint32_t h[3] = {bridge, dir, seq};
    memcpy(m, base_buf + seq % 61, n);
    memcpy(m, h, n < 12 ? n : 12);
}

static bool check_msg(const uint8_t *m, size_t n, uint32_t bridge, uint32_t dir, uint32_t seq)
{
    uint32_t h[3] = {bridge, dir, seq};
    size_t hn = n < 12 ? n : 12;
    return !memcmp(m, h, hn) && !memcmp(m + hn, base_buf + seq % 61 + hn, n - hn);
}

struct end {
    struct net_ws *ws;
    uint32_t bridge, role;
    uint64_t sent, recvd;
    uint32_t seq_out, seq_in;
    bool finished, open;
    struct end *peer;
};

static struct end *ends;
static uint8_t *sendbuf;

#define WINDOW (128u * 1024)

static void pump(struct end *e)
{
    while (e->open && e->sent < bytes_each && net_ws_pending(e->ws) < WINDOW) {
        uint64_t left = bytes_each - e->sent;
        size_t n = left < msg_bytes ? (size_t)left : msg_bytes;
        fill_msg(sendbuf, n, e->bridge, e->role, e->seq_out);
        if (net_ws_send(e->ws, NET_WS_BINARY, sendbuf, n) < 0)
            return;
        e->seq_out++;
        e->sent += n;
    }
}

static void finish_check(void)
{
    if (done_ends == 2ull * n_bridges) {
        double dt = util_now_s() - t_start;
        double total = 2.0 * n_bridges * (double)bytes_each;
        printf("relay load: %u bridges x %llu bytes each way: %.0f MB moved in %.2f s = %.1f MB/s, "
               "%llu messages checked, %llu failures\n",
               n_bridges, (unsigned long long)bytes_each, total / 1e6, dt, total / 1e6 / dt,
               (unsigned long long)(2ull * n_bridges * ((bytes_each + msg_bytes - 1) / msg_bytes)),
               (unsigned long long)failed);
        fflush(stdout);
        for (uint32_t i = 0; i < 2 * n_bridges; i++)
            if (ends[i].ws)
                net_ws_close(ends[i].ws, NET_WS_CODE_NORMAL, "done");
    }
}

static void dial_more(void);

/* Every end opens first (at most DIAL_AHEAD dials in flight, so the listen backlog never
 * overflows); the transfer starts on all bridges at once when the last one is up. */
static void on_open(struct net_ws *ws, void *ud)
{
    struct end *e = ud;
    uint8_t r = (uint8_t)e->role;
    net_ws_send(ws, NET_WS_BINARY, &r, 1);
    e->open = true;
    if (++opened == 2ull * n_bridges) {
        fprintf(stderr, "relay load: %u bridges open, transfer starts\n", n_bridges);
        t_start = util_now_s();
        for (uint32_t i = 0; i < 2 * n_bridges; i++)
            pump(&ends[i]);
    }
    dial_more();
}

static void on_msg(struct net_ws *ws, int op, const uint8_t *d, size_t n, void *ud)
{
    struct end *e = ud;
    uint32_t from = e->peer->role;
    size_t want = bytes_each - e->recvd < msg_bytes ? (size_t)(bytes_each - e->recvd) : msg_bytes;
    bool ok = op == NET_WS_BINARY && n == want && check_msg(d, n, e->bridge, from, e->seq_in);
    if (!ok) {
        if (failed++ < 5)
            fprintf(stderr, "bridge %u: message %u from role %u lost, changed or reordered (%zu bytes)\n",
                    e->bridge, e->seq_in, from, n);
    }
    e->seq_in++;
    e->recvd += n;
    if (e->recvd >= bytes_each && !e->finished) {
        e->finished = true;
        done_ends++;
        finish_check();
    }
}

static void on_drain(struct net_ws *ws, void *ud)
{
    pump(ud);
}

static void on_close(struct net_ws *ws, int code, const char *reason, void *ud)
{
    struct end *e = ud;
    if (!e->open && !e->finished)
        dial_more();
    e->ws = NULL;
    e->open = false;
    closed_ends++;
    if (!e->finished) {
        if (failed++ < 5)
            fprintf(stderr, "bridge %u role %u closed early: %d %s\n", e->bridge, e->role, code, reason);
        e->finished = true;
        done_ends++;
        finish_check();
    }
}

static const struct net_ws_handlers handlers = {
    .on_open = on_open, .on_msg = on_msg, .on_drain = on_drain, .on_close = on_close,
};

#define DIAL_AHEAD 64
static uint32_t next_dial;
static uint8_t rnd[4];

static void dial_more(void)
{
    uv_loop_t *loop = uv_default_loop();
    while (next_dial < 2 * n_bridges && next_dial < opened + closed_ends + DIAL_AHEAD) {
        uint32_t i = next_dial++;
        struct end *e = &ends[i];
        uint32_t b = i / 2;
        char url[300];
        snprintf(url, sizeof url, "%s/v1/bridge/%02x%02x%02x%02x%08x00000000%08x", url_base, rnd[0], rnd[1],
                 rnd[2], rnd[3], (unsigned)getpid(), b);
        e->bridge = b;
        e->role = i % 2 + 1;
        e->peer = &ends[i ^ 1];
        struct net_ws_limits lim = {.low_water = WINDOW / 4};
        char err[KV_ERR_MAX];
        if (net_ws_dial(&e->ws, loop, url, tls, &lim, &handlers, e, err, sizeof err) < 0) {
            fprintf(stderr, "dial %s failed: %s\n", url, err);
            exit(1);
        }
    }
}

static int run_load(void)
{
    uv_loop_t *loop = uv_default_loop();
    ends = calloc(2 * (size_t)n_bridges, sizeof *ends);
    sendbuf = malloc(msg_bytes);
    base_buf = malloc(msg_bytes + 64);
    if (!ends || !sendbuf || !base_buf)
        return 1;
    for (size_t i = 0; i < msg_bytes + 64; i++)
        base_buf[i] = (uint8_t)rand();
    for (int i = 0; i < 4; i++)
        rnd[i] = (uint8_t)rand();
    double t0 = util_now_s();
    dial_more();
    uv_run(loop, UV_RUN_DEFAULT);
    fprintf(stderr, "relay load: whole run %.2f s\n", util_now_s() - t0);
    if (opened < 2ull * n_bridges)
        fprintf(stderr, "only %llu of %u ends opened\n", (unsigned long long)opened, 2 * n_bridges);
    free(ends);
    free(sendbuf);
    free(base_buf);
    return failed || opened < 2ull * n_bridges ? 1 : 0;
}

/* ---------------------------------------------------------------- latency */

static double *rtts;
static uint32_t round_i;
static double t_sent;
static struct end lat[2];

static void lat_send(void)
{
    uint8_t m[64];
    memset(m, (int)round_i, sizeof m);
    t_sent = util_now_s();
    net_ws_send(lat[0].ws, NET_WS_BINARY, m, sizeof m);
}

static void lat_open(struct net_ws *ws, void *ud)
{
    struct end *e = ud;
    uint8_t r = (uint8_t)e->role;
    net_ws_send(ws, NET_WS_BINARY, &r, 1);
    e->open = true;
    if (lat[0].open && lat[1].open) {
        /* give the relay a moment to pair, then start the ping-pong */
        lat_send();
    }
}

static void lat_msg(struct net_ws *ws, int op, const uint8_t *d, size_t n, void *ud)
{
    struct end *e = ud;
    if (e->role == 2) {
        net_ws_send(ws, NET_WS_BINARY, d, n); /* echo */
        return;
    }
    rtts[round_i++] = util_now_s() - t_sent;
    if (round_i < latency_rounds) {
        lat_send();
    } else {
        net_ws_close(lat[0].ws, NET_WS_CODE_NORMAL, "done");
        net_ws_close(lat[1].ws, NET_WS_CODE_NORMAL, "done");
    }
}

static void lat_close(struct net_ws *ws, int code, const char *reason, void *ud)
{
    struct end *e = ud;
    e->ws = NULL;
}

static const struct net_ws_handlers lat_handlers = {.on_open = lat_open, .on_msg = lat_msg, .on_close = lat_close};

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double direct_tcp_median(uint32_t k)
{
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    if (bind(ls, (struct sockaddr *)&a, sizeof a) < 0 || listen(ls, 1) < 0 ||
        getsockname(ls, (struct sockaddr *)&a, &al) < 0)
        return -1;
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (struct sockaddr *)&a, sizeof a) < 0)
        return -1;
    int s = accept(ls, NULL, NULL);
    int one = 1;
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    double *d = malloc(k * sizeof *d);
    uint8_t m[64] = {0};
    for (uint32_t i = 0; i < k; i++) {
        double t0 = util_now_s();
        if (send(c, m, sizeof m, 0) != sizeof m || recv(s, m, sizeof m, MSG_WAITALL) != sizeof m ||
            send(s, m, sizeof m, 0) != sizeof m || recv(c, m, sizeof m, MSG_WAITALL) != sizeof m)
            return -1;
        d[i] = util_now_s() - t0;
    }
    qsort(d, k, sizeof *d, cmp_d);
    double med = d[k / 2];
    free(d);
    close(c);
    close(s);
    close(ls);
    return med;
}

static int run_latency(void)
{
    uv_loop_t *loop = uv_default_loop();
    rtts = calloc(latency_rounds, sizeof *rtts);
    char url[300];
    snprintf(url, sizeof url, "%s/v1/bridge/%08x%08x%08x%08x", url_base, (unsigned)getpid(), (unsigned)rand(),
             (unsigned)rand(), (unsigned)rand());
    lat[0].role = 1;
    lat[1].role = 2;
    /* downstream first, so the upstream's first message never waits in the relay */
    char err[KV_ERR_MAX];
    if (net_ws_dial(&lat[1].ws, loop, url, tls, NULL, &lat_handlers, &lat[1], err, sizeof err) < 0 ||
        net_ws_dial(&lat[0].ws, loop, url, tls, NULL, &lat_handlers, &lat[0], err, sizeof err) < 0) {
        fprintf(stderr, "dial %s failed: %s\n", url, err);
        return 1;
    }
    uv_run(loop, UV_RUN_DEFAULT);
    if (round_i < latency_rounds) {
        fprintf(stderr, "latency: only %u of %u round trips\n", round_i, latency_rounds);
        return 1;
    }
    /* the first rounds include pairing: drop them */
    uint32_t skip = latency_rounds / 10;
    qsort(rtts + skip, latency_rounds - skip, sizeof *rtts, cmp_d);
    double relay_med = rtts[skip + (latency_rounds - skip) / 2];
    double direct = direct_tcp_median(latency_rounds);
    printf("relay latency: round trip through one relay hop %.1f us (median of %u), direct loopback TCP %.1f us; "
           "added one-way latency per relay hop %.1f us\n",
           relay_med * 1e6, latency_rounds - skip, direct * 1e6, (relay_med - direct) / 2 * 1e6);
    free(rtts);
    return 0;
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--url") && i + 1 < argc)
            url_base = argv[++i];
        else if (!strcmp(argv[i], "--bridges") && i + 1 < argc)
            n_bridges = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--bytes") && i + 1 < argc)
            bytes_each = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--msg") && i + 1 < argc)
            msg_bytes = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--latency") && i + 1 < argc)
            latency_rounds = (uint32_t)strtoul(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "usage: tool-relay-load --url ws[s]://HOST:PORT (--bridges N --bytes B [--msg M] | --latency K)\n");
            return 2;
        }
    }
    if (!url_base || n_bridges == 0 || n_bridges > 100000 || msg_bytes == 0 || msg_bytes > (8u << 20) ||
        bytes_each == 0) {
        fprintf(stderr, "tool-relay-load: need --url, 1..100000 bridges, 1..8 MiB messages, bytes > 0\n");
        return 2;
    }
    srand((unsigned)getpid() ^ (unsigned)time(NULL));
    char err[KV_ERR_MAX];
    if (!strncmp(url_base, "wss://", 6) && net_tls_ctx_client_new(&tls, NULL, false, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    int rc = latency_rounds ? run_latency() : run_load();
    net_tls_ctx_free(tls);
    return rc;
}

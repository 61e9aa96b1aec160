/* ws_tc.h — helpers for the relay/WebSocket tests: a relay running on its own thread and
 * loop, and a raw blocking WebSocket client that can send any frame, malformed ones included
 * (the library under test must not be the only thing that speaks the protocol). */
#ifndef KV_TESTS_WS_TC_H
#define KV_TESTS_WS_TC_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>

#include <uv.h>

#include "kvd/kvd.h"
#include "net/net.h"
#include "tests/lib/t.h"
#include "util/util.h"
#include "util/err.h"

/* ---------------------------------------------------------------- relay on a thread */

struct tc_relay {
    pthread_t th;
    uv_loop_t loop;
    uv_async_t stop;
    struct kvd_relay *relay;
    struct kvd_relay_config cfg;
    int port;
    int loop_close_rc;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool started;
    int start_rc;
    struct kvd_relay_stats stats;   /* copied on request */
    bool closed;                    /* kvd_relay_close's done callback ran */
    char err[KV_ERR_MAX];           /* why the start failed */
    uv_async_t snap;
    bool snap_done;
};

static inline void tc_relay_closed(void *ud)
{
    struct tc_relay *t = ud;
    t->closed = true;
}

static inline void tc_relay_stop_cb(uv_async_t *a)
{
    struct tc_relay *t = a->data;
    kvd_relay_close(t->relay, tc_relay_closed, t);
    uv_close((uv_handle_t *)&t->stop, NULL);
    uv_close((uv_handle_t *)&t->snap, NULL);
}

static inline void tc_relay_snap_cb(uv_async_t *a)
{
    struct tc_relay *t = a->data;
    pthread_mutex_lock(&t->mu);
    kvd_relay_get_stats(t->relay, &t->stats);
    t->snap_done = true;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

static void *tc_relay_main(void *arg)
{
    struct tc_relay *t = arg;
    uv_loop_init(&t->loop);
    int rc = kvd_relay_new(&t->relay, &t->loop, &t->cfg, t->err, sizeof t->err);
    if (rc == 0) {
        t->port = kvd_relay_port(t->relay);
        uv_async_init(&t->loop, &t->stop, tc_relay_stop_cb);
        uv_async_init(&t->loop, &t->snap, tc_relay_snap_cb);
        t->stop.data = t;
        t->snap.data = t;
    }
    pthread_mutex_lock(&t->mu);
    t->started = true;
    t->start_rc = rc;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    if (rc == 0)
        uv_run(&t->loop, UV_RUN_DEFAULT);
    t->loop_close_rc = uv_loop_close(&t->loop);
    return NULL;
}

/* Start a relay with cfg (listen defaults to 127.0.0.1:0, plain unless certs given). */
static inline int tc_relay_start(struct tc_relay *t, const struct kvd_relay_config *cfg)
{
    memset(t, 0, sizeof *t);
    t->cfg = *cfg;
    if (!t->cfg.listen)
        t->cfg.listen = "127.0.0.1:0";
    t->cfg.quiet = true;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    pthread_create(&t->th, NULL, tc_relay_main, t);
    pthread_mutex_lock(&t->mu);
    while (!t->started)
        pthread_cond_wait(&t->cv, &t->mu);
    pthread_mutex_unlock(&t->mu);
    if (t->start_rc != 0)
        pthread_join(t->th, NULL);
    return t->start_rc;
}

static inline struct kvd_relay_stats tc_relay_stats(struct tc_relay *t)
{
    pthread_mutex_lock(&t->mu);
    t->snap_done = false;
    uv_async_send(&t->snap);
    while (!t->snap_done)
        pthread_cond_wait(&t->cv, &t->mu);
    struct kvd_relay_stats s = t->stats;
    pthread_mutex_unlock(&t->mu);
    return s;
}

/* Stop the relay; returns uv_loop_close's result (0: no handle left behind), or -1 when the
 * relay's close never reported done. */
static inline int tc_relay_stop(struct tc_relay *t)
{
    uv_async_send(&t->stop);
    pthread_join(t->th, NULL);
    return t->closed ? t->loop_close_rc : -1;
}

/* ---------------------------------------------------------------- raw client */

static inline uint64_t tc_now_ms(void)
{
    return util_now_ns() / 1000000;
}

static inline int tc_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    return fd;
}

static inline int tc_write_all(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n > 0) {
        ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
        if (w <= 0)
            return -1;
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

static inline int tc_read_full(int fd, void *p, size_t n)
{
    uint8_t *b = p;
    while (n > 0) {
        ssize_t r = recv(fd, b, n, 0);
        if (r <= 0)
            return -1;
        b += r;
        n -= (size_t)r;
    }
    return 0;
}

/* Send a request head; read the response head into resp (NUL-terminated); HTTP status or -1. */
static inline int tc_http(int fd, const char *req, char *resp, size_t cap)
{
    if (tc_write_all(fd, req, strlen(req)) < 0)
        return -1;
    size_t n = 0;
    resp[0] = 0;
    while (n + 1 < cap) {
        ssize_t r = recv(fd, resp + n, 1, 0);
        if (r <= 0)
            break;
        n++;
        resp[n] = 0;
        if (n >= 4 && !memcmp(resp + n - 4, "\r\n\r\n", 4))
            break;
    }
    int st = -1;
    if (sscanf(resp, "HTTP/1.1 %d", &st) != 1)
        return -1;
    return st;
}

/* A valid opening handshake for path; returns the HTTP status (101 expected). */
static inline int tc_upgrade(int fd, const char *path)
{
    char req[512], resp[1024];
    snprintf(req, sizeof req,
             "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
             "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
             path);
    int st = tc_http(fd, req, resp, sizeof resp);
    if (st == 101 && !strstr(resp, "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo="))
        return -2;
    return st;
}

/* Connect and upgrade on /v1/bridge/<id>; -1 on failure. */
static inline int tc_open(int port, const char *id)
{
    int fd = tc_connect(port);
    if (fd < 0)
        return -1;
    char path[160];
    snprintf(path, sizeof path, "/v1/bridge/%s", id);
    if (tc_upgrade(fd, path) != 101) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Any frame: fin, rsv bits (0..7), opcode, masked or not. */
static inline int tc_frame(int fd, bool fin, int rsv, int opcode, bool masked, const void *data, size_t len)
{
    uint8_t h[14];
    size_t hl = 0;
    h[hl++] = (uint8_t)((fin ? 0x80 : 0) | ((rsv & 7) << 4) | (opcode & 0xf));
    uint8_t mbit = masked ? 0x80 : 0;
    if (len < 126) {
        h[hl++] = mbit | (uint8_t)len;
    } else if (len < 65536) {
        h[hl++] = mbit | 126;
        h[hl++] = (uint8_t)(len >> 8);
        h[hl++] = (uint8_t)len;
    } else {
        h[hl++] = mbit | 127;
        for (int i = 7; i >= 0; i--)
            h[hl++] = (uint8_t)((uint64_t)len >> (8 * i));
    }
    uint8_t key[4] = {0x37, 0xfa, 0x21, 0x3d};
    if (masked) {
        memcpy(h + hl, key, 4);
        hl += 4;
    }
    uint8_t *buf = malloc(hl + len + 1);
    memcpy(buf, h, hl);
    for (size_t i = 0; i < len; i++)
        buf[hl + i] = ((const uint8_t *)data)[i] ^ (masked ? key[i & 3] : 0);
    int r = tc_write_all(fd, buf, hl + len);
    free(buf);
    return r;
}

static inline int tc_send(int fd, int opcode, const void *data, size_t len)
{
    return tc_frame(fd, true, 0, opcode, true, data, len);
}

/* Read one frame from the server (must be unmasked). Payload malloc'd into *data (NUL-
 * terminated). Returns the opcode, -1 on EOF/timeout, -2 on a masked server frame. */
static inline int tc_recv(int fd, uint8_t **data, size_t *len, bool *fin)
{
    uint8_t h[2];
    *data = NULL;
    *len = 0;
    if (tc_read_full(fd, h, 2) < 0)
        return -1;
    if (fin)
        *fin = h[0] & 0x80;
    if (h[1] & 0x80)
        return -2;
    uint64_t n = h[1] & 0x7f;
    if (n == 126) {
        uint8_t e[2];
        if (tc_read_full(fd, e, 2) < 0)
            return -1;
        n = ((uint64_t)e[0] << 8) | e[1];
    } else if (n == 127) {
        uint8_t e[8];
        if (tc_read_full(fd, e, 8) < 0)
            return -1;
        n = 0;
        for (int i = 0; i < 8; i++)
            n = (n << 8) | e[i];
    }
    if (n > (64u << 20))
        return -1;
    *data = malloc(n + 1);
    if (tc_read_full(fd, *data, n) < 0) {
        free(*data);
        *data = NULL;
        return -1;
    }
    (*data)[n] = 0;
    *len = n;
    return h[0] & 0xf;
}

/* Read frames until a close frame (pings answered, data skipped); returns the close code
 * (1005 none, -1 connection ended without one) and the reason into reason[cap]. */
static inline int tc_expect_close(int fd, char *reason, size_t cap)
{
    if (reason && cap)
        reason[0] = 0;
    for (;;) {
        uint8_t *d;
        size_t n;
        int op = tc_recv(fd, &d, &n, NULL);
        if (op < 0)
            return -1;
        if (op == 0x9)
            tc_send(fd, 0xa, d, n);
        if (op == 0x8) {
            int code = n >= 2 ? (d[0] << 8 | d[1]) : 1005;
            tc_send(fd, 0x8, d, n >= 2 ? 2 : 0); /* answer as RFC 6455 5.5.1 asks */
            if (reason && cap)
                snprintf(reason, cap, "%.*s", n > 2 ? (int)(n - 2) : 0, n > 2 ? (char *)d + 2 : "");
            free(d);
            return code;
        }
        free(d);
    }
}

/* Next data message (pings answered); opcode, -1 on EOF/timeout, 8 if a close came. */
static inline int tc_recv_msg(int fd, uint8_t **data, size_t *len)
{
    for (;;) {
        int op = tc_recv(fd, data, len, NULL);
        if (op == 0x9) {
            tc_send(fd, 0xa, *data, *len);
            free(*data);
            continue;
        }
        if (op == 0xa) {
            free(*data);
            continue;
        }
        return op;
    }
}

static inline void tc_bridge_id(char out[33])
{
    static unsigned counter;
    snprintf(out, 33, "%08x%08x%08x%08x", (unsigned)getpid(), (unsigned)tc_now_ms(),
             ++counter, (unsigned)rand());
}

#endif

/* test-net-http.c — the HTTP server: keep-alive, pipelining, limits (URL, header bytes, header
 * count, body, header timeout), path traversal, Range/If-Range/If-None-Match/HEAD, zstd
 * encoding, pushed and pulled bodies, upgrade, async answers, and a clean loop at the end.
 * Each case gets fresh servers on a loop of its own, run by a loop thread (the fixture); the
 * cases speak raw HTTP over blocking sockets and parse the answers with http-parser
 * (response mode). After each case the servers close, every body, filter state and upgraded
 * connection that was opened has been released, and the loop closes with no handle left. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <poll.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <http_parser.h>
#include <uv.h>
#include <zstd.h>

#include "net/net.h"
#include "tests/lib/t.h"
#include "util/err.h"

#define BIG (6u * 1024 * 1024)
static unsigned char *big;
static uv_loop_t loop;
static struct net_http_server *srv;
static int port;
static uv_async_t stop_async;
static uv_timer_t async_timer;
static struct net_http_req *pending_async;
static pthread_t loop_th;
static int bodies, released; /* bodies handed to the server, and their release() calls */

/* ---------------------------------------------------------------- server side */

static void h_hello(struct net_http_req *r, void *ud)
{
    net_http_reply(r, 200, "text/plain", NULL, "hello world\n", 12);
}

static ptrdiff_t big_read(void *ud, uint64_t off, void *scratch, size_t max, const void **ptr)
{
    (void)scratch;
    *ptr = big + off;
    return (ptrdiff_t)max;
}

/* copies into scratch, 1000 bytes at a time (the copy path) */
static ptrdiff_t gen_read(void *ud, uint64_t off, void *scratch, size_t max, const void **ptr)
{
    size_t n = max < 1000 ? max : 1000;
    memcpy(scratch, big + off, n);
    *ptr = scratch;
    return (ptrdiff_t)n;
}

static void big_release(void *ud) { released++; }

static void h_body(struct net_http_req *r, void *ud)
{
    bodies++;
    struct net_http_body b = {BIG, "\"big-1\"", true, big_read, big_release, NULL};
    net_http_reply_body(r, 200, "application/octet-stream", NULL, &b);
}

static void h_gen(struct net_http_req *r, void *ud)
{
    bodies++;
    struct net_http_body b = {300000, "\"gen-1\"", false, gen_read, big_release, NULL};
    net_http_reply_body(r, 200, "application/octet-stream", NULL, &b);
}

static void h_echo(struct net_http_req *r, void *ud)
{
    size_t n;
    const void *b = net_http_req_body(r, &n);
    net_http_reply(r, 200, "application/octet-stream", NULL, b, n);
}

static void h_push(struct net_http_req *r, void *ud)
{
    net_http_reply_begin(r, 200, "text/plain", NULL, UINT64_MAX, NULL, NULL);
    net_http_reply_write(r, "one,", 4);
    net_http_reply_write(r, "two,", 4);
    net_http_reply_write(r, "three", 5);
    net_http_reply_end(r);
}

static void on_async_timer(uv_timer_t *t)
{
    if (pending_async)
        net_http_reply(pending_async, 200, "text/plain", NULL, "later\n", 6);
    pending_async = NULL;
}

static void async_abort(void *ud) { pending_async = NULL; }

static void h_async(struct net_http_req *r, void *ud)
{
    pending_async = r;
    net_http_req_set_abort(r, async_abort, NULL);
    uv_timer_start(&async_timer, on_async_timer, 50, 0);
}

/* A pushed body that never ends by itself: a chunk every 5 ms until its client leaves. */
static uv_timer_t stream_timer;
static struct net_http_req *stream_req;
static int stream_aborted;   /* set on the loop thread, read by the case */

static void on_stream_tick(uv_timer_t *t)
{
    if (stream_req)
        net_http_reply_write(stream_req, "data: tick\n\n", 12);
}

static void stream_abort(void *ud)
{
    stream_req = NULL;
    uv_timer_stop(&stream_timer);
    __atomic_store_n(&stream_aborted, 1, __ATOMIC_SEQ_CST);
}

static void h_stream(struct net_http_req *r, void *ud)
{
    net_http_reply_begin(r, 200, "text/event-stream", NULL, UINT64_MAX, NULL, NULL);
    stream_req = r;
    net_http_req_set_abort(r, stream_abort, NULL);
    uv_timer_start(&stream_timer, on_stream_tick, 5, 5);
}

static void up_data(void *ud, struct net_http_conn *c, const void *buf, size_t n)
{
    if (n >= 4 && memcmp(buf, "QUIT", 4) == 0) {
        net_http_conn_close(c);
        return;
    }
    net_http_conn_write(c, buf, n);
}
static int up_opened, up_closed;
static void up_close(void *ud) { up_closed++; }
static const struct net_http_upgrade_ops up_ops = {up_data, up_close, NULL};

static void h_up(struct net_http_req *r, void *ud)
{
    if (!net_http_req_is_upgrade(r)) {
        net_http_reply_error(r, 426, "upgrade required");
        return;
    }
    up_opened++;
    net_http_upgrade(r, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n",
                     &up_ops, NULL, NULL);
}

static void h_hdr(struct net_http_req *r, void *ud)
{
    const char *v = net_http_req_header(r, "x-test");
    char out[256];
    int n = snprintf(out, sizeof out, "%s|%s|%s", net_http_req_path(r), net_http_req_query(r),
                     v ? v : "(none)");
    net_http_reply(r, 200, "text/plain", NULL, out, (size_t)n);
}

static void on_closed(void *ud) { *(int *)ud = 1; }
static int server_closed, server2_closed;
static struct net_http_server *srv2, *srv3;
static int port2, port3, server3_closed;

/* A toy filter (XOR 0x5a both ways) standing in for TLS. */
static int xf_opened, xf_closed;
static int xf_open(void *ud, struct net_http_conn *c, void **st)
{
    xf_opened++;
    *st = malloc(1);
    return *st ? 0 : -ENOMEM;
}
static int xf_recv(void *st, struct net_http_conn *c, const void *buf, size_t n)
{
    unsigned char tmp[4096];
    const unsigned char *p = buf;
    while (n) {
        size_t k = n < sizeof tmp ? n : sizeof tmp;
        for (size_t i = 0; i < k; i++)
            tmp[i] = p[i] ^ 0x5a;
        int rc = net_http_conn_feed(c, tmp, k);
        if (rc < 0)
            return rc;
        p += k;
        n -= k;
    }
    return 0;
}
static int xf_send(void *st, struct net_http_conn *c, const void *buf, size_t n)
{
    unsigned char *tmp = malloc(n ? n : 1);
    if (!tmp)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++)
        tmp[i] = ((const unsigned char *)buf)[i] ^ 0x5a;
    int rc = net_http_conn_send_raw(c, tmp, n);
    free(tmp);
    return rc;
}
static void xf_close(void *st) { free(st); xf_closed++; }
static const struct net_http_filter xfilter = {xf_open, xf_recv, xf_send, xf_close, NULL};

static void on_stop(uv_async_t *a)
{
    net_http_server_close(srv, on_closed, &server_closed);
    net_http_server_close(srv2, on_closed, &server2_closed);
    net_http_server_close(srv3, on_closed, &server3_closed);
    uv_close((uv_handle_t *)&stop_async, NULL);
    uv_close((uv_handle_t *)&async_timer, NULL);
    uv_close((uv_handle_t *)&stream_timer, NULL);
}

static void *loop_thread(void *arg)
{
    uv_run(&loop, UV_RUN_DEFAULT);
    return NULL;
}

/* ---------------------------------------------------------------- client side */

/* rcvbuf > 0 shrinks the receive buffer before connect, so the window is small from the start. */
static int dial_rcvbuf(int p, int rcvbuf)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (rcvbuf > 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

static int dial_port(int p) { return dial_rcvbuf(p, 0); }
static int dial(void) { return dial_port(port); }
static int dial3(void) { return dial_port(port3); }

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void sendall(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
        if (k <= 0)
            return;
        c += k;
        n -= (size_t)k;
    }
}

struct resp {
    int status;
    char hdrs[4096];
    size_t hlen;
    struct util_buf body;
    bool complete, closed;
    bool head;
    char field[128];
};

struct client {
    int fd;
    char buf[65536];
    size_t len, pos;
    http_parser p;
};

static int rc_on_hf(http_parser *p, const char *at, size_t n)
{
    struct resp *r = p->data;
    if (r->hlen + n + 2 < sizeof r->hdrs) {
        memcpy(r->hdrs + r->hlen, at, n);
        r->hlen += n;
        r->hdrs[r->hlen] = 0;
    }
    return 0;
}
static int rc_on_hv(http_parser *p, const char *at, size_t n)
{
    struct resp *r = p->data;
    if (r->hlen + n + 4 < sizeof r->hdrs) {
        if (r->hlen && r->hdrs[r->hlen - 1] != ' ' && r->hdrs[r->hlen - 1] != '\n') {
            memcpy(r->hdrs + r->hlen, ": ", 2);
            r->hlen += 2;
        }
        memcpy(r->hdrs + r->hlen, at, n);
        r->hlen += n;
        memcpy(r->hdrs + r->hlen, "\n", 2);
        r->hlen += 1;
    }
    return 0;
}
static int rc_on_hc(http_parser *p)
{
    struct resp *r = p->data;
    r->status = p->status_code;
    return r->head ? 1 : 0;
}
static int rc_on_body(http_parser *p, const char *at, size_t n)
{
    struct resp *r = p->data;
    if (util_buf_append(&r->body, at, n, SIZE_MAX) < 0)
        abort();
    return 0;
}
static int rc_on_done(http_parser *p)
{
    struct resp *r = p->data;
    r->complete = true;
    http_parser_pause(p, 1);
    return 0;
}
static http_parser_settings rc_settings = {
    .on_header_field = rc_on_hf, .on_header_value = rc_on_hv,
    .on_headers_complete = rc_on_hc, .on_body = rc_on_body, .on_message_complete = rc_on_done};

static void client_open(struct client *c)
{
    memset(c, 0, sizeof *c);
    c->fd = dial();
    http_parser_init(&c->p, HTTP_RESPONSE);
}

/* Read one response (keeps leftover bytes for the next one). */
static void client_read(struct client *c, struct resp *r, bool head)
{
    memset(r, 0, sizeof *r);
    r->head = head;
    c->p.data = r;
    for (;;) {
        if (c->pos < c->len) {
            size_t n = http_parser_execute(&c->p, &rc_settings, c->buf + c->pos, c->len - c->pos);
            c->pos += n;
            if (HTTP_PARSER_ERRNO(&c->p) == HPE_PAUSED) {
                http_parser_pause(&c->p, 0);
                return;
            }
            if (HTTP_PARSER_ERRNO(&c->p) != HPE_OK)
                return;
            if (r->complete)
                return;
        }
        c->pos = c->len = 0;
        ssize_t k = recv(c->fd, c->buf, sizeof c->buf, 0);
        if (k <= 0) {
            r->closed = true;
            /* EOF may complete a close-delimited body */
            http_parser_execute(&c->p, &rc_settings, c->buf, 0);
            return;
        }
        c->len = (size_t)k;
    }
}

/* The server closed the connection: an orderly end, or a reset (a server that closes with
 * bytes of ours still unread in its socket, such as a slowloris trickle after its 408, makes
 * the kernel answer with RST). */
static bool peer_closed(int fd)
{
    char b[256];
    for (;;) {
        ssize_t k = recv(fd, b, sizeof b, 0);
        if (k == 0)
            return true;
        if (k < 0)
            return errno == ECONNRESET;
    }
}

/* One request on a fresh connection. */
static void roundtrip(const char *req, struct resp *r, bool head)
{
    struct client c;
    client_open(&c);
    sendall(c.fd, req, strlen(req));
    client_read(&c, r, head);
    close(c.fd);
}

static const char *hdr(struct resp *r, const char *name)
{
    static char v[512];
    size_t nl = strlen(name);
    for (const char *p = r->hdrs; *p;) {
        const char *e = strchr(p, '\n');
        if (!e)
            break;
        if ((size_t)(e - p) > nl + 2 && strncasecmp(p, name, nl) == 0 && p[nl] == ':') {
            snprintf(v, sizeof v, "%.*s", (int)(e - p - nl - 2), p + nl + 2);
            return v;
        }
        p = e + 1;
    }
    return NULL;
}

/* ---------------------------------------------------------------- cases */

T_CASE(keepalive_and_basic)
{
    struct client c;
    client_open(&c);
    T_ASSERT(c.fd >= 0, "connect");
    struct resp r;
    for (int i = 0; i < 3; i++) {
        const char *q = "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n";
        sendall(c.fd, q, strlen(q));
        client_read(&c, &r, false);
        T_CHECK(r.status == 200 && r.body.len == 12 && memcmp(r.body.p, "hello world\n", 12) == 0,
                "request %d on one connection: status %d len %zu", i, r.status, r.body.len);
        T_CHECK(!r.closed, "connection kept alive");
        util_buf_free(&r.body);
    }
    const char *q = "GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    sendall(c.fd, q, strlen(q));
    client_read(&c, &r, false);
    T_CHECK(r.status == 200, "status %d", r.status);
    T_CHECK(peer_closed(c.fd), "Connection: close is honoured");
    util_buf_free(&r.body);
    close(c.fd);
    /* HTTP/1.0 without keep-alive closes */
    client_open(&c);
    q = "GET /hello HTTP/1.0\r\n\r\n";
    sendall(c.fd, q, strlen(q));
    client_read(&c, &r, false);
    T_CHECK(r.status == 200 && r.body.len == 12, "1.0 status %d", r.status);
    T_CHECK(peer_closed(c.fd), "HTTP/1.0 closes");
    util_buf_free(&r.body);
    close(c.fd);
}

T_CASE(pipelining_in_order)
{
    struct client c;
    client_open(&c);
    const char *q = "GET /hdr/a?x=1 HTTP/1.1\r\nHost: x\r\nX-Test: one\r\n\r\n"
                    "GET /async HTTP/1.1\r\nHost: x\r\n\r\n"
                    "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nabcde"
                    "GET /gen HTTP/1.1\r\nHost: x\r\n\r\n"
                    "GET /hdr/b HTTP/1.1\r\nHost: x\r\n\r\n";
    sendall(c.fd, q, strlen(q));
    struct resp r;
    client_read(&c, &r, false);
    T_CHECK(r.status == 200 && r.body.len == 14 && memcmp(r.body.p, "/hdr/a|x=1|one", 14) == 0,
            "first: %d %.*s", r.status, (int)r.body.len, r.body.p);
    util_buf_free(&r.body);
    client_read(&c, &r, false);
    T_CHECK(r.status == 200 && r.body.len == 6 && memcmp(r.body.p, "later\n", 6) == 0,
            "second (async): %d", r.status);
    util_buf_free(&r.body);
    client_read(&c, &r, false);
    T_CHECK(r.status == 200 && r.body.len == 5 && memcmp(r.body.p, "abcde", 5) == 0, "third (echo) %d",
            r.status);
    util_buf_free(&r.body);
    client_read(&c, &r, false);
    T_CHECK(r.status == 200 && r.body.len == 300000 && memcmp(r.body.p, big, 300000) == 0,
            "fourth (copied body) %d %zu", r.status, r.body.len);
    util_buf_free(&r.body);
    client_read(&c, &r, false);
    T_CHECK(r.status == 200 && r.body.len == 14 && memcmp(r.body.p, "/hdr/b||(none)", 14) == 0,
            "fifth: %d", r.status);
    util_buf_free(&r.body);
    close(c.fd);
}

T_CASE(expect_continue)
{
    struct client c;
    client_open(&c);
    const char *q = "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n";
    sendall(c.fd, q, strlen(q));
    char buf[64] = "";
    ssize_t k = recv(c.fd, buf, 25, MSG_WAITALL);
    T_CHECK(k == 25 && memcmp(buf, "HTTP/1.1 100 Continue\r\n\r\n", 25) == 0,
            "100 Continue before the body: %.25s", buf);
    sendall(c.fd, "abcd", 4);
    struct resp r;
    client_read(&c, &r, false);
    T_CHECK(r.status == 200 && r.body.len == 4 && memcmp(r.body.p, "abcd", 4) == 0, "echo %d", r.status);
    util_buf_free(&r.body);
    close(c.fd);
}

T_CASE(malformed_and_limits)
{
    struct resp r;
    roundtrip("GARBAGE\r\n\r\n", &r, false);
    T_CHECK(r.status == 400, "garbage request line: %d", r.status);
    util_buf_free(&r.body);
    roundtrip("GET /hello HTTP/1.1\r\nHost x\r\n\r\n", &r, false);
    T_CHECK(r.status == 400, "header without colon: %d", r.status);
    util_buf_free(&r.body);
    roundtrip("GET /hello HTTP/9.9\r\n\r\n", &r, false);
    T_CHECK(r.status == 505, "bad version: %d", r.status);
    util_buf_free(&r.body);
    /* URL too long (limit 2048) */
    char *q = malloc(40000);
    strcpy(q, "GET /hello?");
    memset(q + 11, 'a', 3000);
    strcpy(q + 3011, " HTTP/1.1\r\n\r\n");
    roundtrip(q, &r, false);
    T_CHECK(r.status == 414, "long URL: %d", r.status);
    util_buf_free(&r.body);
    /* one 20 KB header (limit 16 KB) */
    strcpy(q, "GET /hello HTTP/1.1\r\nX-Big: ");
    size_t l = strlen(q);
    memset(q + l, 'b', 20000);
    strcpy(q + l + 20000, "\r\n\r\n");
    roundtrip(q, &r, false);
    T_CHECK(r.status == 431, "big header: %d", r.status);
    util_buf_free(&r.body);
    /* 100 headers (limit 64) */
    strcpy(q, "GET /hello HTTP/1.1\r\n");
    for (int i = 0; i < 100; i++)
        sprintf(q + strlen(q), "X-H%d: v\r\n", i);
    strcat(q, "\r\n");
    roundtrip(q, &r, false);
    T_CHECK(r.status == 431, "many headers: %d", r.status);
    util_buf_free(&r.body);
    free(q);
    /* body over the limit (1 MiB) announced by Content-Length */
    roundtrip("POST /echo HTTP/1.1\r\nContent-Length: 5000000\r\n\r\n", &r, false);
    T_CHECK(r.status == 413, "big body: %d", r.status);
    util_buf_free(&r.body);
    /* ... also to a client that goes on sending that body and reads only afterwards: the
     * server lingers (reads and drops what comes) instead of closing with bytes unread, which
     * would reset the connection and lose the 413 */
    for (int round = 0; round < 3; round++) {
        struct client c;
        client_open(&c);
        const char *h = "POST /echo HTTP/1.1\r\nContent-Length: 5000000\r\n\r\n";
        sendall(c.fd, h, strlen(h));
        /* 2 MiB in 64 KiB pieces, as a client uploading would: every byte is taken (a
         * server that closed with bytes unread would reset the connection, and the client
         * would stop at a send error, as curl does, without reading the answer) */
        static char junk[64 << 10];
        size_t sent = 0;
        for (int i = 0; i < 32; i++) {
            size_t off = 0;
            while (off < sizeof junk) {
                ssize_t k = send(c.fd, junk + off, sizeof junk - off, MSG_NOSIGNAL);
                if (k <= 0)
                    break;
                off += (size_t)k;
            }
            sent += off;
            if (off < sizeof junk)
                break;
            usleep(2000);
        }
        T_CHECK(sent == 32 * sizeof junk, "big body still being sent (round %d): the server "
                "reset the connection after %zu of %zu bytes", round, sent, 32 * sizeof junk);
        client_read(&c, &r, false);
        T_CHECK(r.status == 413, "big body still being sent (round %d): %d", round, r.status);
        util_buf_free(&r.body);
        close(c.fd);
    }
    roundtrip("GET /nowhere HTTP/1.1\r\n\r\n", &r, false);
    T_CHECK(r.status == 404, "no route: %d", r.status);
    util_buf_free(&r.body);
    roundtrip("DELETE /hello HTTP/1.1\r\n\r\n", &r, false);
    T_CHECK(r.status == 405, "wrong method: %d", r.status);
    util_buf_free(&r.body);
    /* still up */
    roundtrip("GET /hello HTTP/1.1\r\n\r\n", &r, false);
    T_CHECK(r.status == 200, "server still answers: %d", r.status);
    util_buf_free(&r.body);
}

T_CASE(path_traversal)
{
    const char *bad[] = {
        "GET /hdr/../etc/passwd HTTP/1.1\r\n\r\n",
        "GET /hdr/%2e%2e/etc/passwd HTTP/1.1\r\n\r\n",
        "GET /hdr/%2E%2e%2fetc%2fpasswd HTTP/1.1\r\n\r\n",
        "GET /hdr/./x HTTP/1.1\r\n\r\n",
        "GET //etc/passwd HTTP/1.1\r\n\r\n",
        "GET /hdr//x HTTP/1.1\r\n\r\n",
        "GET /hdr/a%00b HTTP/1.1\r\n\r\n",
        "GET /hdr/a%5c..%5cb HTTP/1.1\r\n\r\n",
        "GET /hdr/%zz HTTP/1.1\r\n\r\n",
        "GET /hdr/%2 HTTP/1.1\r\n\r\n",
        "GET http://host/hdr/../../x HTTP/1.1\r\n\r\n",
        "GET etc/passwd HTTP/1.1\r\n\r\n",
        "GET * HTTP/1.1\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        struct resp r;
        roundtrip(bad[i], &r, false);
        T_CHECK(r.status == 400, "%s -> %d", bad[i], r.status);
        util_buf_free(&r.body);
    }
    struct resp r;
    roundtrip("GET http://host/hdr/ok%20x HTTP/1.1\r\n\r\n", &r, false);
    T_CHECK(r.status == 200 && r.body.len >= 9 && memcmp(r.body.p, "/hdr/ok x", 9) == 0,
            "absolute-form target and %%20 decoding: %d", r.status);
    util_buf_free(&r.body);
}

T_CASE(ranges_head_conditionals)
{
    struct resp r;
    roundtrip("GET /body HTTP/1.1\r\nRange: bytes=0-99\r\n\r\n", &r, false);
    T_CHECK(r.status == 206 && r.body.len == 100 && memcmp(r.body.p, big, 100) == 0, "0-99: %d %zu",
            r.status, r.body.len);
    const char *cr = hdr(&r, "Content-Range");
    T_CHECK(cr && strcmp(cr, "bytes 0-99/6291456") == 0, "Content-Range %s", cr ? cr : "-");
    util_buf_free(&r.body);
    roundtrip("GET /body HTTP/1.1\r\nRange: bytes=6291000-\r\n\r\n", &r, false);
    T_CHECK(r.status == 206 && r.body.len == 456 && memcmp(r.body.p, big + 6291000, 456) == 0,
            "open end: %d %zu", r.status, r.body.len);
    util_buf_free(&r.body);
    roundtrip("GET /body HTTP/1.1\r\nRange: bytes=-10\r\n\r\n", &r, false);
    T_CHECK(r.status == 206 && r.body.len == 10 && memcmp(r.body.p, big + BIG - 10, 10) == 0,
            "suffix: %d %zu", r.status, r.body.len);
    util_buf_free(&r.body);
    roundtrip("GET /body HTTP/1.1\r\nRange: bytes=100-99999999999\r\n\r\n", &r, false);
    T_CHECK(r.status == 206 && r.body.len == BIG - 100, "last past the end is clamped: %d %zu",
            r.status, r.body.len);
    util_buf_free(&r.body);
    roundtrip("GET /body HTTP/1.1\r\nRange: bytes=6291456-\r\n\r\n", &r, false);
    cr = hdr(&r, "Content-Range");
    T_CHECK(r.status == 416 && cr && strcmp(cr, "bytes */6291456") == 0, "past end: %d %s",
            r.status, cr ? cr : "-");
    util_buf_free(&r.body);
    roundtrip("GET /body HTTP/1.1\r\nRange: bytes=5-2\r\n\r\n", &r, false);
    T_CHECK(r.status == 200 && r.body.len == BIG, "invalid range ignored: %d", r.status);
    util_buf_free(&r.body);
    roundtrip("GET /body HTTP/1.1\r\nRange: bytes=0-1,5-6\r\n\r\n", &r, false);
    T_CHECK(r.status == 200 && r.body.len == BIG && memcmp(r.body.p, big, BIG) == 0,
            "multi-range served whole: %d", r.status);
    util_buf_free(&r.body);
    roundtrip("GET /body HTTP/1.1\r\nRange: bytes=10-19\r\nIf-Range: \"other\"\r\n\r\n", &r, false);
    T_CHECK(r.status == 200 && r.body.len == BIG, "If-Range mismatch gives all: %d", r.status);
    util_buf_free(&r.body);
    roundtrip("GET /body HTTP/1.1\r\nRange: bytes=10-19\r\nIf-Range: \"big-1\"\r\n\r\n", &r, false);
    T_CHECK(r.status == 206 && r.body.len == 10 && memcmp(r.body.p, big + 10, 10) == 0,
            "If-Range match: %d", r.status);
    util_buf_free(&r.body);
    roundtrip("GET /body HTTP/1.1\r\nIf-None-Match: \"big-1\"\r\n\r\n", &r, false);
    T_CHECK(r.status == 304 && r.body.len == 0, "If-None-Match: %d", r.status);
    util_buf_free(&r.body);
    roundtrip("HEAD /body HTTP/1.1\r\n\r\n", &r, true);
    const char *cl = hdr(&r, "Content-Length");
    T_CHECK(r.status == 200 && r.body.len == 0 && cl && strcmp(cl, "6291456") == 0,
            "HEAD: %d len %s [%s]", r.status, cl ? cl : "-", r.hdrs);
    const char *et = hdr(&r, "ETag");
    T_CHECK(et && strcmp(et, "\"big-1\"") == 0, "ETag %s", et ? et : "-");
    T_CHECK(hdr(&r, "Accept-Ranges") != NULL, "Accept-Ranges");
    util_buf_free(&r.body);
}

T_CASE(full_body_and_zstd)
{
    struct resp r;
    roundtrip("GET /body HTTP/1.1\r\n\r\n", &r, false);
    T_CHECK(r.status == 200 && r.body.len == BIG && memcmp(r.body.p, big, BIG) == 0,
            "6 MiB body streamed: %d %zu", r.status, r.body.len);
    util_buf_free(&r.body);
    roundtrip("GET /body HTTP/1.1\r\nAccept-Encoding: gzip, zstd\r\n\r\n", &r, false);
    const char *ce = hdr(&r, "Content-Encoding");
    T_CHECK(r.status == 200 && ce && strcmp(ce, "zstd") == 0, "zstd: %d %s", r.status,
            ce ? ce : "-");
    const char *et = hdr(&r, "ETag");
    T_CHECK(et && strcmp(et, "\"big-1-zst\"") == 0, "encoded ETag differs: %s", et ? et : "-");
    T_CHECK(r.body.len < BIG, "compressed %zu < %u", r.body.len, BIG);
    unsigned char *d = malloc(BIG + 16);
    size_t dn = ZSTD_decompress(d, BIG + 16, r.body.p, r.body.len);
    T_CHECK(!ZSTD_isError(dn) && dn == BIG && memcmp(d, big, BIG) == 0, "zstd round trip: %zu",
            dn);
    free(d);
    util_buf_free(&r.body);
    roundtrip("GET /body HTTP/1.1\r\nAccept-Encoding: zstd;q=0\r\n\r\n", &r, false);
    T_CHECK(hdr(&r, "Content-Encoding") == NULL && r.body.len == BIG, "q=0 refuses zstd");
    util_buf_free(&r.body);
    roundtrip("GET /body HTTP/1.1\r\nAccept-Encoding: zstd\r\nRange: bytes=0-9\r\n\r\n", &r, false);
    T_CHECK(r.status == 206 && hdr(&r, "Content-Encoding") == NULL && r.body.len == 10,
            "ranges are served identity: %d", r.status);
    util_buf_free(&r.body);
    roundtrip("GET /push HTTP/1.1\r\n\r\n", &r, false);
    T_CHECK(r.status == 200 && r.body.len == 13 && memcmp(r.body.p, "one,two,three", 13) == 0,
            "pushed chunked body: %d %zu", r.status, r.body.len);
    util_buf_free(&r.body);
}

T_CASE(slow_headers_timeout)
{
    int fd = dial();
    T_ASSERT(fd >= 0, "connect");
    const char *part = "GET /hello HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    sendall(fd, part, strlen(part));
    struct client c;
    memset(&c, 0, sizeof c);
    c.fd = fd;
    http_parser_init(&c.p, HTTP_RESPONSE);
    for (int i = 0; i < 3; i++) {
        usleep(100000);
        sendall(fd, "a", 1); /* trickle: does not extend the header deadline */
    }
    struct resp r;
    client_read(&c, &r, false);
    T_CHECK(r.status == 408, "partial headers get 408: %d", r.status);
    T_CHECK(peer_closed(fd), "and the connection is closed");
    util_buf_free(&r.body);
    close(fd);
    roundtrip("GET /hello HTTP/1.1\r\n\r\n", &r, false);
    T_CHECK(r.status == 200, "server still answers: %d", r.status);
    util_buf_free(&r.body);
}

/* Headers that announce a body, then nothing: the body has its own deadline (300 ms). */
T_CASE(stalled_body_timeout)
{
    uint64_t before = net_http_server_stats(srv)->timeouts_body;
    int fd = dial();
    T_ASSERT(fd >= 0, "connect");
    const char *q = "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc";
    sendall(fd, q, strlen(q));
    double t0 = now_s();
    struct client c;
    memset(&c, 0, sizeof c);
    c.fd = fd;
    http_parser_init(&c.p, HTTP_RESPONSE);
    struct resp r;
    client_read(&c, &r, false);
    double dt = now_s() - t0;
    T_CHECK(r.status == 408 && strstr((char *)r.body.p, "body"), "a stalled body gets 408: %d", r.status);
    T_CHECK(dt < 2.0, "within its deadline: %.2f s", dt);
    T_CHECK(peer_closed(fd), "and the connection is closed");
    T_CHECK(net_http_server_stats(srv)->timeouts_body == before + 1, "counted as a body timeout");
    util_buf_free(&r.body);
    close(fd);
}

/* A client that asks for 6 MiB and reads nothing is dropped after write_timeout_ms (400), not
 * before: the drop is timed from the request (a late server only makes it later). */
T_CASE(write_stall_dropped)
{
    const struct net_http_stats *st = net_http_server_stats(srv);
    uint64_t before = st->timeouts_write, open0 = st->conns_open;
    int fd = dial_rcvbuf(port, 4096);
    T_ASSERT(fd >= 0, "connect");
    const char *q = "GET /body HTTP/1.1\r\n\r\n";
    double t0 = now_s();
    sendall(fd, q, strlen(q));
    for (int i = 0; i < 200 && st->timeouts_write == before; i++)
        usleep(25000);
    double dt = now_s() - t0;
    T_CHECK(st->timeouts_write == before + 1, "a client that reads nothing is dropped: %llu",
            (unsigned long long)(st->timeouts_write - before));
    T_CHECK(dt >= 0.38, "not before its deadline: dropped %.2f s after its request", dt);
    for (int i = 0; i < 200 && st->conns_open != open0; i++)
        usleep(25000);
    T_CHECK(st->conns_open == open0, "its connection is gone: %llu open",
            (unsigned long long)st->conns_open);
    close(fd);
    struct resp r;
    roundtrip("GET /hello HTTP/1.1\r\n\r\n", &r, false);
    T_CHECK(r.status == 200, "server still answers: %d", r.status);
    util_buf_free(&r.body);
}

/* A client that reads slowly but steadily is not a stalled one: every byte the kernel takes
 * pushes the write-stall deadline back (400 ms here, 2 s of 32 KiB reads every 100 ms). */
T_CASE(slow_steady_reader_kept)
{
    const struct net_http_stats *st = net_http_server_stats(srv);
    uint64_t before = st->timeouts_write;
    int fd = dial_rcvbuf(port, 4096);
    T_ASSERT(fd >= 0, "connect");
    const char *q = "GET /body HTTP/1.1\r\nConnection: close\r\n\r\n";
    sendall(fd, q, strlen(q));
    size_t got = 0;
    char *b = malloc(1 << 16);
    for (int i = 0; i < 20; i++) {
        usleep(100000);
        for (size_t want = 32768; want > 0;) {
            ssize_t k = recv(fd, b, want, 0);
            if (k <= 0)
                break;
            got += (size_t)k;
            want -= (size_t)k;
        }
    }
    T_CHECK(st->timeouts_write == before, "a steady reader was dropped after %zu bytes", got);
    for (;;) {
        ssize_t k = recv(fd, b, 1 << 16, 0);
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    T_CHECK(got > BIG, "and gets the whole body: %zu bytes of %u + head", got, BIG);
    free(b);
    close(fd);
}

/* Every connection counts against the per-address cap (4 on server 3); with none idle (each
 * in the middle of its headers) the one over it gets a 503 and is closed at once; a slot
 * freed is usable again. */
T_CASE(per_address_cap)
{
    int fds[4];
    const struct net_http_stats *st = net_http_server_stats(srv3);
    uint64_t rx0 = st->bytes_received;
    for (int i = 0; i < 4; i++) {
        fds[i] = dial3();
        T_ASSERT(fds[i] >= 0, "connect %d", i);
        sendall(fds[i], "GET /body HTTP/1.1\r\n", 20);   /* busy: reading a request */
    }
    /* the server has read them all (until then they would count as silent, so evictable) */
    for (int i = 0; i < 200 && st->bytes_received < rx0 + 80; i++)
        usleep(25000);
    T_ASSERT(st->bytes_received >= rx0 + 80, "the server read the 4 partial requests");
    int x = dial3();
    T_ASSERT(x >= 0, "connect 5");
    char b[256] = "";
    ssize_t k = recv(x, b, sizeof b - 1, 0);
    T_CHECK(k > 0 && strncmp(b, "HTTP/1.1 503", 12) == 0, "the 5th connection gets 503: %s", b);
    T_CHECK(peer_closed(x), "and is closed");
    close(x);
    T_CHECK(net_http_server_stats(srv3)->conns_refused_addr == 1, "counted as a per-address refusal");
    close(fds[0]);
    for (int i = 0; i < 200 && st->conns_open > 3; i++)   /* its slot is freed on close */
        usleep(25000);
    fds[0] = dial3();
    const char *q = "GET /body HTTP/1.1\r\nRange: bytes=0-9\r\n\r\n";
    sendall(fds[0], q, strlen(q));
    k = recv(fds[0], b, sizeof b - 1, 0);
    T_CHECK(k > 0 && strncmp(b, "HTTP/1.1 206", 12) == 0, "a freed slot serves again: %.20s", b);
    for (int i = 0; i < 4; i++)
        close(fds[i]);
}

/* Over the per-address cap with idle connections there (kept alive after an answer, or silent
 * since their accept), the new one is served: the kept-alive one idle longest is closed for it
 * (counted in conns_evicted), not the new client refused. */
T_CASE(idle_evicted_for_new)
{
    int fds[4];
    char b[256];
    const char *q = "GET /body HTTP/1.1\r\nRange: bytes=0-9\r\n\r\n";
    for (int i = 0; i < 4; i++) {
        fds[i] = dial3();
        T_ASSERT(fds[i] >= 0, "connect %d", i);
        if (i < 2) {   /* two kept alive after one answer, the others silent */
            sendall(fds[i], q, strlen(q));
            ssize_t k = recv(fds[i], b, sizeof b - 1, 0);
            T_ASSERT(k > 0 && strncmp(b, "HTTP/1.1 206", 12) == 0, "answer %d", i);
        }
        usleep(20000);
    }
    uint64_t before = net_http_server_stats(srv3)->conns_evicted;
    int x = dial3();
    T_ASSERT(x >= 0, "connect 5");
    sendall(x, q, strlen(q));
    ssize_t k = recv(x, b, sizeof b - 1, 0);
    T_CHECK(k > 0 && strncmp(b, "HTTP/1.1 206", 12) == 0, "the 5th connection is served: %.20s", b);
    T_CHECK(net_http_server_stats(srv3)->conns_evicted == before + 1, "one idle connection closed for it");
    T_CHECK(peer_closed(fds[0]), "the kept-alive connection idle longest is the one closed");
    close(x);
    for (int i = 0; i < 4; i++)
        close(fds[i]);
}

T_CASE(upgrade_echo)
{
    struct client c;
    client_open(&c);
    const char *q = "GET /up HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\nearly";
    sendall(c.fd, q, strlen(q));
    char buf[512];
    size_t got = 0;
    while (got < sizeof buf - 1) {
        ssize_t k = recv(c.fd, buf + got, sizeof buf - 1 - got, 0);
        if (k <= 0)
            break;
        got += (size_t)k;
        buf[got] = 0;
        if (strstr(buf, "\r\n\r\nearly"))
            break;
    }
    buf[got] = 0;
    T_CHECK(strncmp(buf, "HTTP/1.1 101", 12) == 0, "101: %.40s", buf);
    T_CHECK(strstr(buf, "\r\n\r\nearly") != NULL, "bytes sent with the request are echoed");
    sendall(c.fd, "ping", 4);
    ssize_t k = recv(c.fd, buf, 4, MSG_WAITALL);
    T_CHECK(k == 4 && memcmp(buf, "ping", 4) == 0, "raw echo after upgrade");
    sendall(c.fd, "QUIT", 4);
    T_CHECK(peer_closed(c.fd), "handler closes");
    close(c.fd);
    struct resp r;
    roundtrip("GET /up HTTP/1.1\r\n\r\n", &r, false);
    T_CHECK(r.status == 426, "no upgrade header: %d", r.status);
    util_buf_free(&r.body);
}

T_CASE(filter_in_front)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port2)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    T_ASSERT(connect(fd, (struct sockaddr *)&a, sizeof a) == 0, "connect");
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char q[] = "GET /body HTTP/1.1\r\nRange: bytes=1000-300999\r\nConnection: close\r\n\r\n";
    for (size_t i = 0; i < strlen(q); i++)
        q[i] ^= 0x5a;
    sendall(fd, q, strlen(q));
    size_t cap = 1 << 20, got = 0;
    char *buf = malloc(cap);
    for (;;) {
        ssize_t k = recv(fd, buf + got, cap - got, 0);
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    close(fd);
    for (size_t i = 0; i < got; i++)
        buf[i] ^= 0x5a;
    char *e = memmem(buf, got, "\r\n\r\n", 4);
    T_CHECK(got > 12 && strncmp(buf, "HTTP/1.1 206", 12) == 0, "206 through the filter");
    T_CHECK(e && (size_t)(buf + got - (e + 4)) == 300000 && memcmp(e + 4, big + 1000, 300000) == 0,
            "body through the filter (%zu bytes)", got);
    free(buf);
}

T_CASE(send_rate_limit)
{
    int save = port;
    port = port3;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    struct resp r;
    roundtrip("GET /body HTTP/1.1\r\nRange: bytes=0-1048575\r\n\r\n", &r, false);
    clock_gettime(CLOCK_MONOTONIC, &b);
    port = save;
    double el = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
    T_CHECK(r.status == 206 && r.body.len == 1048576 && memcmp(r.body.p, big, 1048576) == 0,
            "paced body intact: %d %zu", r.status, r.body.len);
    /* 1 MiB at 2 MiB/s with a 100 ms burst cannot take less than 0.4 s */
    T_CHECK(el >= 0.35, "1 MiB at 2 MiB/s took only %.3f s", el);
    util_buf_free(&r.body);
}

/* A pushed body whose client leaves before net_http_reply_end: the abort callback runs (the
 * producer stops at once), and the server goes on. */
T_CASE(push_client_gone)
{
    signal(SIGPIPE, SIG_IGN);   /* the server writes on after the client left, as daemons do */
    struct client c;
    client_open(&c);
    const char *q = "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n";
    sendall(c.fd, q, strlen(q));
    char b[4096];
    size_t got = 0;
    while (got < 200) {
        ssize_t k = recv(c.fd, b, sizeof b, 0);
        T_ASSERT(k > 0, "the stream ended early");
        got += (size_t)k;
    }
    close(c.fd);
    int waited = 0;
    while (!__atomic_load_n(&stream_aborted, __ATOMIC_SEQ_CST) && waited < 1000) {
        usleep(10000);
        waited += 10;
    }
    T_CHECK(__atomic_load_n(&stream_aborted, __ATOMIC_SEQ_CST), "no abort callback within 1 s of the client leaving");
    struct resp r;
    roundtrip("GET /hello HTTP/1.1\r\n\r\n", &r, false);
    T_CHECK(r.status == 200, "server still answers: %d", r.status);
    util_buf_free(&r.body);
}

static bool body_has(const struct resp *r, const char *s)
{
    return r->body.p && memmem(r->body.p, r->body.len, s, strlen(s)) != NULL;
}

/* json_errors: the server's own refusals are JSON objects with the message and the status. */
T_CASE(json_errors)
{
    int save = port;
    port = port3;
    struct resp r;
    roundtrip("GET /nowhere HTTP/1.1\r\n\r\n", &r, false);
    const char *ct = hdr(&r, "Content-Type");
    T_CHECK(r.status == 404 && ct && strcmp(ct, "application/json") == 0, "404: %d %s", r.status,
            ct ? ct : "(no type)");
    T_CHECK(r.body.len > 0 && body_has(&r, "\"error\":{\"message\":\"no route for /nowhere\"") &&
            body_has(&r, "\"code\":404"), "404 body: %.*s", (int)r.body.len, r.body.p);
    util_buf_free(&r.body);
    roundtrip("POST /body HTTP/1.1\r\nContent-Length: 5000000\r\n\r\n", &r, false);
    T_CHECK(r.status == 413 && r.body.len > 0 && body_has(&r, "\"code\":413"), "413: %d %.*s",
            r.status, (int)r.body.len, r.body.p);
    util_buf_free(&r.body);
    port = save;
}

T_CASE(unit_helpers)
{
    uint64_t a, b;
    T_CHECK(net_http_range_parse("bytes=0-0", 10, &a, &b) == 1 && a == 0 && b == 0, "0-0");
    T_CHECK(net_http_range_parse("bytes=9-", 10, &a, &b) == 1 && a == 9 && b == 9, "9-");
    T_CHECK(net_http_range_parse("bytes=10-", 10, &a, &b) == -ERANGE, "10- unsatisfiable");
    T_CHECK(net_http_range_parse("bytes=-0", 10, &a, &b) == -ERANGE, "-0 unsatisfiable");
    T_CHECK(net_http_range_parse("bytes=-20", 10, &a, &b) == 1 && a == 0 && b == 9, "-20");
    T_CHECK(net_http_range_parse("bytes=0-", 0, &a, &b) == -ERANGE, "empty body");
    T_CHECK(net_http_range_parse("items=0-1", 10, &a, &b) == 0, "other unit ignored");
    T_CHECK(net_http_range_parse("bytes=1-2x", 10, &a, &b) == 0, "junk ignored");
    T_CHECK(net_http_range_parse("bytes=99999999999999999999-", 10, &a, &b) == 0,
            "overflowing number ignored");
    T_CHECK(net_http_range_parse("bytes=-", 10, &a, &b) == 0, "no numbers");
    char out[64], err[KV_ERR_MAX];
    T_CHECK(net_http_path_clean("/a%2Fb", 6, out, sizeof out, err, sizeof err) == 0 &&
            strcmp(out, "/a/b") == 0, "decoded %s", out);
    T_CHECK(net_http_path_clean("/a/..", 5, out, sizeof out, err, sizeof err) < 0, "trailing ..");
    T_CHECK(net_http_path_clean("/a/", 3, out, sizeof out, err, sizeof err) == 0, "trailing /");
    T_CHECK(net_http_path_clean("/...", 4, out, sizeof out, err, sizeof err) == 0, "... is a name");
    T_CHECK(net_http_path_clean("/a%", 3, out, sizeof out, err, sizeof err) < 0, "truncated %%");
    char longp[100];
    memset(longp, 'a', sizeof longp);
    longp[0] = '/';
    T_CHECK(net_http_path_clean(longp, sizeof longp, out, sizeof out, err, sizeof err) < 0,
            "too long for the buffer");
    T_CHECK(net_http_accepts("gzip, zstd;q=0.5", "zstd"), "q=0.5");
    T_CHECK(!net_http_accepts("gzip, zstd;q=0", "zstd"), "q=0");
    T_CHECK(!net_http_accepts("gzip, zstdx", "zstd"), "prefix is not a match");
    T_CHECK(!net_http_accepts(NULL, "zstd"), "absent");
}

/* ---------------------------------------------------------------- fixture */

/* Three servers on a fresh loop: the main one, one behind the XOR filter, one paced. */
static int servers_up(void)
{
    uv_loop_init(&loop);
    struct net_http_limits lim = {.header_timeout_ms = 300, .idle_timeout_ms = 5000,
                                  .body_timeout_ms = 300, .write_timeout_ms = 400};
    if (net_http_server_new(&srv, &loop, &lim) != 0 ||
        net_http_server_route(srv, "GET", "/hello", h_hello, NULL) != 0 ||
        net_http_server_route(srv, "GET", "/body", h_body, NULL) != 0 ||
        net_http_server_route(srv, "GET", "/gen", h_gen, NULL) != 0 ||
        net_http_server_route(srv, "POST", "/echo", h_echo, NULL) != 0 ||
        net_http_server_route(srv, "GET", "/push", h_push, NULL) != 0 ||
        net_http_server_route(srv, "GET", "/async", h_async, NULL) != 0 ||
        net_http_server_route(srv, "GET", "/up", h_up, NULL) != 0 ||
        net_http_server_route(srv, "GET", "/hdr/*", h_hdr, NULL) != 0 ||
        net_http_server_route(srv, "GET", "/stream", h_stream, NULL) != 0 ||
        net_http_server_listen(srv, "127.0.0.1:0") != 0) {
        fprintf(stderr, "server set-up failed\n");
        return -1;
    }
    port = net_http_server_port(srv);
    if (net_http_server_new(&srv2, &loop, NULL) != 0 ||
        net_http_server_route(srv2, "GET", "/body", h_body, NULL) != 0 ||
        net_http_server_listen(srv2, "127.0.0.1:0") != 0) {
        fprintf(stderr, "server 2 set-up failed\n");
        return -1;
    }
    net_http_server_set_filter(srv2, &xfilter);
    port2 = net_http_server_port(srv2);
    struct net_http_limits lim3 = {.max_send_rate = 2u << 20, .max_conns_per_addr = 4,
                                   .json_errors = true};
    if (net_http_server_new(&srv3, &loop, &lim3) != 0 ||
        net_http_server_route(srv3, "GET", "/body", h_body, NULL) != 0 ||
        net_http_server_listen(srv3, "127.0.0.1:0") != 0) {
        fprintf(stderr, "server 3 set-up failed\n");
        return -1;
    }
    port3 = net_http_server_port(srv3);
    uv_async_init(&loop, &stop_async, on_stop);
    uv_timer_init(&loop, &async_timer);
    uv_timer_init(&loop, &stream_timer);
    return pthread_create(&loop_th, NULL, loop_thread, NULL) == 0 ? 0 : -1;
}

static void servers_down(void)
{
    usleep(100000);
    uv_async_send(&stop_async);
    pthread_join(loop_th, NULL);
    T_CHECK(server_closed == 1 && server2_closed == 1 && server3_closed == 1,
            "server close callbacks ran");
    T_CHECK(xf_closed == xf_opened, "filter states closed: %d of %d", xf_closed, xf_opened);
    T_CHECK(up_closed == up_opened, "upgrade close callbacks ran once each: %d of %d", up_closed,
            up_opened);
    T_CHECK(released == bodies, "bodies released once each: %d of %d", released, bodies);
    T_CHECK(uv_loop_close(&loop) == 0, "loop closes with no handle left");
}

/* A socket bound on 127.0.0.1:0 and listening; its port in *port. */
static int bound_socket(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 8) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &len) != 0)
        return -1;
    *port = ntohs(sa.sin_port);
    return fd;
}

/* In a fresh process (this program run again with KV_T_HANDOVER set: the hand-over is read
 * once a process, and this one has listened already): two listening sockets as fds 3 and 4,
 * LISTEN_FDS=2 and LISTEN_PID naming this process (mine) or its parent. Exit status: 0 when
 * every step went as it should, else the step that did not. */
static int handover_child(bool mine)
{
    int pa = 0, pb = 0, a = bound_socket(&pa), b = bound_socket(&pb);
    if (a < 0 || b < 0)
        return 1;
    int ha = fcntl(a, F_DUPFD, 20), hb = fcntl(b, F_DUPFD, 20);
    close(a);
    close(b);
    if (ha < 0 || hb < 0 || dup2(ha, 3) != 3 || dup2(hb, 4) != 4)
        return 2;
    close(ha);
    close(hb);
    char v[24];
    snprintf(v, sizeof v, "%ld", (long)(mine ? getpid() : getppid()));
    setenv("LISTEN_PID", v, 1);
    setenv("LISTEN_FDS", "2", 1);
    uv_loop_t lp;
    uv_loop_init(&lp);
    struct net_http_server *s1, *s2, *s3;
    char addr_a[32], addr_b[32];
    snprintf(addr_a, sizeof addr_a, "127.0.0.1:%d", pa);
    snprintf(addr_b, sizeof addr_b, "127.0.0.1:%d", pb);
    if (net_http_server_new(&s1, &lp, NULL) || net_http_server_new(&s2, &lp, NULL) ||
        net_http_server_new(&s3, &lp, NULL))
        return 3;
    if (!mine) /* not ours: ignored, and a fresh bind meets the socket that holds the port */
        return net_http_server_listen(s1, addr_b) == UV_EADDRINUSE ? 0 : 4;
    /* matched by address, not by order: b's address takes fd 4 */
    if (net_http_server_listen(s1, addr_b) != 0 || net_http_server_port(s1) != pb)
        return 5;
    if (getenv("LISTEN_FDS") || getenv("LISTEN_PID"))
        return 6; /* meant for this process only: gone before a child could see them */
    if (net_http_server_listen(s2, addr_a) != 0 || net_http_server_port(s2) != pa)
        return 7;
    /* each socket serves one listener: a second at a's address binds afresh, and is refused */
    if (net_http_server_listen(s3, addr_a) != UV_EADDRINUSE)
        return 8;
    /* the taken sockets are the ones that accept */
    for (int i = 0; i < 2; i++) {
        int c = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET,
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                                 .sin_port = htons((uint16_t)(i ? pa : pb))};
        if (c < 0 || connect(c, (struct sockaddr *)&sa, sizeof sa) != 0)
            return 9;
        close(c);
    }
    return 0;
}

T_CASE(listen_takes_handed_over_socket)
{
    for (int mine = 1; mine >= 0; mine--) {
        pid_t pid = fork();
        T_ASSERT(pid >= 0, "fork");
        if (pid == 0) {
            setenv("KV_T_HANDOVER", mine ? "mine" : "other", 1);
            execl("/proc/self/exe", "test-net-http", (char *)NULL);
            _exit(100);
        }
        int st = 0;
        T_ASSERT(waitpid(pid, &st, 0) == pid, "waitpid");
        T_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                "sockets handed over to %s: step %d went wrong (handover_child)",
                mine ? "this process" : "another process", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    }
}

int main(int argc, char **argv)
{
    const char *ho = getenv("KV_T_HANDOVER");
    if (ho) /* listen_takes_handed_over_socket's fresh process (it frees nothing: _exit) */
        _exit(handover_child(strcmp(ho, "mine") == 0));
    t_init(argc, argv);
    big = malloc(BIG);
    uint32_t x = 12345;
    for (size_t i = 0; i < BIG; i++) { /* compressible but not trivial */
        x = x * 1103515245u + 12345u;
        big[i] = (unsigned char)((i / 64) % 7 == 0 ? (x >> 24) : (i & 0x3f));
    }
    T_FIXTURE(servers_up, servers_down);
    T_RUN(unit_helpers);
    T_RUN(keepalive_and_basic);
    T_RUN(pipelining_in_order);
    T_RUN(expect_continue);
    T_RUN(malformed_and_limits);
    T_RUN(path_traversal);
    T_RUN(ranges_head_conditionals);
    T_RUN(full_body_and_zstd);
    T_RUN(slow_headers_timeout);
    T_RUN(stalled_body_timeout);
    T_RUN(write_stall_dropped);
    T_RUN(slow_steady_reader_kept);
    T_RUN(per_address_cap);
    T_RUN(idle_evicted_for_new);
    T_RUN(upgrade_echo);
    T_RUN(filter_in_front);
    T_RUN(send_rate_limit);
    T_RUN(push_client_gone);
    T_RUN(json_errors);
    T_RUN(listen_takes_handed_over_socket);

    free(big);
    return T_DONE();
}

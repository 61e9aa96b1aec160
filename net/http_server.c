/* http_server.c — the HTTP/1.1 server on libuv (see net.h [http]).
 *
 * A connection moves through: IDLE (waiting for a request) -> HEADERS (bytes of a request
 * arrived, the header timer runs) -> DISPATCHED (the handler holds the request) -> the
 * response is queued (SIMPLE), pulled from a body as the socket drains (BODY) or pushed by the
 * handler (PUSH) -> back to IDLE (keep-alive) or closed; or UPGRADED (raw bytes). Reading
 * stops while a request is being answered, so pipelined requests wait in the socket and are
 * answered in order. The connection is freed only in the close callback of its last handle;
 * a close asked for while zstd work runs on the thread pool waits for that work.
 *
 * Every phase the client controls has a deadline on the connection's timer: the TLS
 * handshake (filtered connections, until the first request byte), the headers, the body,
 * keep-alive idle time; the handler's time to answer is the idle time. A second timer,
 * wtimer, runs whenever bytes wait for the socket and is pushed back by each write that
 * completes: a client that stops reading is dropped after write_timeout_ms in any state.
 * Connections are counted per address (IPv4, or IPv6 /64) from accept to close.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <arpa/inet.h>
#include <netinet/tcp.h>
#include <cjson/cJSON.h>
#include <http_parser.h>
#include <uv.h>
#include <zstd.h>

#include "net/internal.h"
#include "net/net.h"
#include "util/err.h"
#include "util/util.h"

#define HTTP_MAX_HEADERS_CAP 256
#define HTTP_CHUNK (256u * 1024)           /* bytes asked of a body per read */
#define HTTP_HIGH_WATER (4u * 1024 * 1024) /* stop pulling a body above this much queued */
#define HTTP_LOW_WATER (1u * 1024 * 1024)  /* writable callbacks below this */
#define HTTP_PATH_MAX 4096
#define HTTP_RBUF (64u * 1024)             /* socket read buffer */
#define HTTP_ADDR_BUCKETS 256
#define HTTP_ZPOOL_MAX 8                   /* idle zstd contexts kept per server */
#define HTTP_LOG_GAP_MS 1000               /* at most one log line a second */

enum conn_state { ST_IDLE, ST_HEADERS, ST_DISPATCHED, ST_UPGRADED };
enum resp_kind { R_NONE, R_SIMPLE, R_BODY, R_PUSH };

struct route {
    char method[16];
    char *path;
    size_t plen;
    bool prefix;
    net_http_handler_cb cb;
    void *ud;
};

/* Open connections from one address (IPv4, or an IPv6 /64). */
struct addr_ent {
    struct addr_ent *next;
    uint32_t n;
    char addr[INET6_ADDRSTRLEN + 4];
};

struct net_http_server {
    uv_loop_t *loop;
    uv_tcp_t listener;
    bool listening, closing, listener_closed;
    struct net_http_limits lim;
    const struct net_http_filter *filter;
    struct route *routes;
    size_t n_routes;
    struct net_http_conn *conns; /* doubly linked */
    struct net_http_stats stats;
    int port;
    void (*done)(void *);
    void *done_ud;
    struct addr_ent *addrs[HTTP_ADDR_BUCKETS];
    net_http_log_cb log;
    void *log_ud;
    uint64_t log_last;          /* loop ms of the last line */
    uint64_t log_skipped;       /* lines left out since */
    net_http_access_cb access;  /* one call per answered request (NULL: none) */
    void *access_ud;
    /* zstd contexts not in use, shared by the thread-pool jobs of every connection */
    uv_mutex_t zmu;
    ZSTD_CCtx *zpool[HTTP_ZPOOL_MAX];
    int zpool_n;
    char rbuf[HTTP_RBUF];       /* socket reads, shared (see on_alloc) */
};

/* A body being pulled: shared by the pump and by every write that borrows its memory. */
struct body_stream {
    struct net_http_body b;
    struct net_http_server *srv;
    int refs;
    uint64_t off, end;  /* next byte, one past the last */
    uint64_t t0, sent;  /* for the send-rate limit: start (loop ms) and bytes pulled */
    bool zstd, chunked;
};

struct net_http_req {
    struct net_http_conn *c;
    char method[16];
    char *url;
    size_t url_len;
    char path[HTTP_PATH_MAX];
    const char *query;
    char *hbuf;
    size_t hlen, hcap;
    uint32_t hname[HTTP_MAX_HEADERS_CAP], hval[HTTP_MAX_HEADERS_CAP];
    size_t nh;
    bool in_value;
    struct util_buf body;   /* under lim.max_body */
    bool head, upgrade, keep_alive, http10, answered;
    int err_status;      /* limit violated while parsing */
    void (*abort_cb)(void *);
    void *abort_ud;
    /* response */
    enum resp_kind kind;
    bool resp_done;      /* every byte queued */
    bool push_chunked;
    uint64_t push_left;
    void (*writable)(void *);
    void *writable_ud;
    struct body_stream *bs;
    /* for the access log */
    int status;
    uint64_t t0_ns, handed0;
};

struct net_http_conn {
    uv_tcp_t tcp;
    uv_timer_t timer;    /* the deadline of the phase the connection is in */
    uv_timer_t pace;     /* send-rate limit: resumes a body pull */
    uv_timer_t wtimer;   /* write stall: runs while bytes wait for the socket */
    struct addr_ent *ae; /* this connection's address count (NULL: not counted) */
    bool in_body;        /* headers done, the body is being received */
    bool got_request;    /* a request byte arrived (ends the handshake phase) */
    uint64_t idle_ms;    /* loop ms since when it waits for a request (accept, last answer) */
    struct net_http_server *srv;
    struct net_http_conn *prev, *next;
    int handles_open;
    bool closing, close_after_write, reading, user_paused, work_pending, in_process, again,
         pumping;
    bool linger;         /* the client may still be sending: close by lingering (conn_close) */
    bool lingering;      /* the write side is shut; the client's bytes are read and dropped */
    uint64_t linger_bytes;
    uv_shutdown_t sd;
    enum conn_state st;
    http_parser parser;
    http_parser_settings ps;
    char peer[64];
    char addr[64];       /* the counting key: an IPv4 address or an IPv6 /64 */
    void *fstate;
    const struct net_http_filter *filter;
    struct util_buf in;  /* read, not yet parsed from in_pos on; under in_max */
    size_t in_pos, in_max;
    size_t queued;
    uint64_t handed;     /* bytes ever handed to uv_write */
    uint64_t taken_mark; /* bytes the kernel had taken when wtimer was last started */
    char *scratch;
    struct net_http_req req;
    const struct net_http_upgrade_ops *up;
    void *up_ud;
};

struct wreq {
    uv_write_t w;
    struct net_http_conn *c;
    struct body_stream *bs; /* borrowed memory of this stream (NULL: owned copy) */
    char *owned;
    size_t n;
};

static void conn_close(struct net_http_conn *c);
static void conn_process(struct net_http_conn *c);
static void pump(struct net_http_conn *c);
static void req_finish(struct net_http_req *r);
static void access_log(struct net_http_req *r, bool complete);
static void read_start(struct net_http_conn *c);

/* ------------------------------------------------------------------ streams */

static void bs_unref(struct body_stream *bs)
{
    if (!bs || --bs->refs > 0)
        return;
    if (bs->b.release)
        bs->b.release(bs->b.ud);
    free((char *)bs->b.etag);
    if (bs->zstd)
        bs->srv->stats.zstd_active--;
    free(bs);
}

/* ------------------------------------------------------------------ log */

/* One line to the owner's log, at most one a second (refusals come in floods). */
static void srv_log(struct net_http_server *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void srv_log(struct net_http_server *s, const char *fmt, ...)
{
    if (!s->log)
        return;
    uint64_t now = uv_now(s->loop);
    if (s->log_last && now - s->log_last < HTTP_LOG_GAP_MS) {
        s->log_skipped++;
        return;
    }
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (s->log_skipped && n >= 0 && (size_t)n < sizeof line)
        snprintf(line + n, sizeof line - (size_t)n, " (%llu similar lines left out)",
                 (unsigned long long)s->log_skipped);
    s->log_last = now ? now : 1;
    s->log_skipped = 0;
    s->log(s->log_ud, line);
}

void net_http_server_set_log(struct net_http_server *s, net_http_log_cb cb, void *ud)
{
    s->log = cb;
    s->log_ud = ud;
}

/* ------------------------------------------------------------------ writes */

static void timer_arm(struct net_http_conn *c, uint32_t ms);

/* Linux's struct tcp_info goes on past glibc's copy of it: pacing rates, then the bytes the
 * peer has acknowledged (the kernel's ABI, include/uapi/linux/tcp.h). */
struct tcp_info_acked {
    struct tcp_info base;
    uint64_t pacing_rate, max_pacing_rate, bytes_acked;
};
_Static_assert(sizeof(struct tcp_info) == 104, "glibc's struct tcp_info is Linux's first 104 bytes");

/* A measure of the client's progress that grows whenever it takes bytes: what the kernel
 * took from libuv's write queue plus what the client acknowledged. Write completions alone
 * would punish a client that reads slowly but steadily (a request completes only when all
 * of it is in the socket buffer, which a large buffer fills long before it drains). */
static uint64_t bytes_taken(const struct net_http_conn *c)
{
    uint64_t n = c->handed - uv_stream_get_write_queue_size((const uv_stream_t *)&c->tcp);
    uv_os_fd_t fd;
    struct tcp_info_acked ti;
    socklen_t len = sizeof ti;
    if (uv_fileno((const uv_handle_t *)&c->tcp, &fd) == 0 &&
        getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) == 0 && len >= sizeof ti)
        n += ti.bytes_acked;
    return n;
}

static void on_write_stall(uv_timer_t *t);

static void wtimer_start(struct net_http_conn *c)
{
    c->taken_mark = bytes_taken(c);
    uv_timer_start(&c->wtimer, on_write_stall, c->srv->lim.write_timeout_ms, 0);
}

/* Nothing taken for write_timeout_ms although bytes wait: the client stopped reading. */
static void on_write_stall(uv_timer_t *t)
{
    struct net_http_conn *c = t->data;
    if (c->closing || c->queued == 0)
        return;
    if (bytes_taken(c) > c->taken_mark) {
        wtimer_start(c); /* slow, but moving */
        return;
    }
    c->srv->stats.timeouts_write++;
    srv_log(c->srv, "%s: dropped: %zu bytes queued and none taken for %u ms", c->peer, c->queued,
            c->srv->lim.write_timeout_ms);
    conn_close(c);
}

static void queued_add(struct net_http_conn *c, size_t n)
{
    c->handed += n;
    if (c->queued == 0)
        wtimer_start(c);
    c->queued += n;
    c->srv->stats.queued_bytes += n;
    c->srv->stats.bytes_sent += n;
}

static void on_write(uv_write_t *w, int status)
{
    struct wreq *wr = (struct wreq *)w;
    struct net_http_conn *c = wr->c;
    c->queued -= wr->n;
    c->srv->stats.queued_bytes -= wr->n;
    free(wr->owned);
    bs_unref(wr->bs);
    free(wr);
    if (c->closing)
        return;
    if (status < 0) {
        conn_close(c);
        return;
    }
    /* progress: the write-stall deadline starts again, or stops with the queue empty */
    if (c->queued > 0)
        wtimer_start(c);
    else
        uv_timer_stop(&c->wtimer);
    if (c->st == ST_DISPATCHED)
        timer_arm(c, c->srv->lim.idle_timeout_ms); /* progress: a slow reader gets idle time */
    if (c->close_after_write && c->queued == 0) {
        conn_close(c);
        return;
    }
    struct net_http_req *r = &c->req;
    if (c->st == ST_DISPATCHED && r->kind == R_BODY && !r->resp_done)
        pump(c);
    else if (c->st == ST_DISPATCHED && r->kind == R_PUSH && !r->resp_done && r->writable &&
             c->queued < HTTP_LOW_WATER)
        r->writable(r->writable_ud);
    else if (c->st == ST_UPGRADED && c->up && c->up->on_writable && c->queued < HTTP_LOW_WATER)
        c->up->on_writable(c->up_ud);
}

/* Queue bytes on the socket: borrowed from bs (kept alive by a reference) or copied. */
static int raw_write(struct net_http_conn *c, const void *buf, size_t n, struct body_stream *bs)
{
    if (c->closing)
        return -ECANCELED;
    if (n == 0)
        return 0;
    struct wreq *wr = calloc(1, sizeof *wr);
    if (!wr)
        return -ENOMEM;
    wr->c = c;
    wr->n = n;
    const char *p = buf;
    if (bs) {
        wr->bs = bs;
        bs->refs++;
    } else {
        wr->owned = malloc(n);
        if (!wr->owned) {
            free(wr);
            return -ENOMEM;
        }
        memcpy(wr->owned, buf, n);
        p = wr->owned;
    }
    uv_buf_t ub = uv_buf_init((char *)p, (unsigned)n);
    int rc = uv_write(&wr->w, (uv_stream_t *)&c->tcp, &ub, 1, on_write);
    if (rc < 0) {
        bs_unref(wr->bs);
        free(wr->owned);
        free(wr);
        return rc;
    }
    queued_add(c, n);
    return 0;
}

/* Queue owned memory without copying (takes ownership of buf, malloc'd). */
static int raw_write_owned(struct net_http_conn *c, char *buf, size_t n)
{
    if (c->closing || n == 0) {
        free(buf);
        return c->closing ? -ECANCELED : 0;
    }
    struct wreq *wr = calloc(1, sizeof *wr);
    if (!wr) {
        free(buf);
        return -ENOMEM;
    }
    wr->c = c;
    wr->n = n;
    wr->owned = buf;
    uv_buf_t ub = uv_buf_init(buf, (unsigned)n);
    int rc = uv_write(&wr->w, (uv_stream_t *)&c->tcp, &ub, 1, on_write);
    if (rc < 0) {
        free(buf);
        free(wr);
        return rc;
    }
    queued_add(c, n);
    return 0;
}

/* Plaintext out: through the filter when there is one. */
static int conn_send(struct net_http_conn *c, const void *buf, size_t n, struct body_stream *bs)
{
    if (c->closing)
        return -ECANCELED;
    if (c->filter)
        return c->filter->send(c->fstate, c, buf, n);
    return raw_write(c, buf, n, bs);
}

static int conn_send_owned(struct net_http_conn *c, char *buf, size_t n)
{
    if (c->filter) {
        int rc = c->closing ? -ECANCELED : c->filter->send(c->fstate, c, buf, n);
        free(buf);
        return rc;
    }
    return raw_write_owned(c, buf, n);
}

int net_http_conn_send_raw(struct net_http_conn *c, const void *buf, size_t n)
{
    return raw_write(c, buf, n, NULL);
}

int net_http_conn_write(struct net_http_conn *c, const void *buf, size_t n)
{
    return conn_send(c, buf, n, NULL);
}

size_t net_http_conn_queued(const struct net_http_conn *c) { return c->queued; }
const char *net_http_conn_peer(const struct net_http_conn *c) { return c->peer; }

/* ------------------------------------------------------------------ close */

static struct addr_ent **addr_slot(struct net_http_server *s, const char *addr)
{
    struct addr_ent **p = &s->addrs[util_hash_str(addr) & (HTTP_ADDR_BUCKETS - 1)];
    while (*p && strcmp((*p)->addr, addr) != 0)
        p = &(*p)->next;
    return p;
}

size_t net_http_server_addrs(const struct net_http_server *s,
                             void (*cb)(void *ud, const char *addr, uint32_t n), void *ud)
{
    size_t k = 0;
    for (size_t i = 0; i < HTTP_ADDR_BUCKETS; i++)
        for (const struct addr_ent *e = s->addrs[i]; e; e = e->next, k++)
            if (cb)
                cb(ud, e->addr, e->n);
    return k;
}

static void server_maybe_free(struct net_http_server *s)
{
    if (!s->closing || !s->listener_closed || s->conns)
        return;
    void (*done)(void *) = s->done;
    void *ud = s->done_ud;
    for (int i = 0; i < s->zpool_n; i++)
        ZSTD_freeCCtx(s->zpool[i]);
    uv_mutex_destroy(&s->zmu);
    for (size_t i = 0; i < s->n_routes; i++)
        free(s->routes[i].path);
    free(s->routes);
    free(s);
    if (done)
        done(ud);
}

static void req_reset(struct net_http_req *r)
{
    bs_unref(r->bs);
    util_buf_free(&r->body);
    struct net_http_conn *c = r->c;
    char *url = r->url, *hbuf = r->hbuf;
    size_t hcap = r->hcap;
    memset(r, 0, sizeof *r);
    r->c = c;
    r->url = url;
    r->hbuf = hbuf;
    r->hcap = hcap;
}

static void on_handle_closed(uv_handle_t *h)
{
    struct net_http_conn *c = h->data;
    if (--c->handles_open > 0)
        return;
    struct net_http_server *s = c->srv;
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    s->stats.conns_open--;
    if (c->ae && --c->ae->n == 0) {
        struct addr_ent **p = addr_slot(s, c->ae->addr);
        *p = c->ae->next;
        free(c->ae);
        s->stats.addrs--;
    }
    if (c->fstate && c->filter && c->filter->close)
        c->filter->close(c->fstate);
    if (c->st == ST_UPGRADED && c->up && c->up->on_close)
        c->up->on_close(c->up_ud);
    req_reset(&c->req);
    free(c->req.url);
    free(c->req.hbuf);
    util_buf_free(&c->in);
    free(c->scratch);
    free(c);
    server_maybe_free(s);
}

static void conn_close_handles(struct net_http_conn *c)
{
    uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
    uv_close((uv_handle_t *)&c->timer, on_handle_closed);
    uv_close((uv_handle_t *)&c->pace, on_handle_closed);
    uv_close((uv_handle_t *)&c->wtimer, on_handle_closed);
}

/* Lingering close (RFC 9112, section 9.6): a response sent before the request's body was read
 * (413, a malformed request mid-body) would be followed by a reset if the socket closed with
 * the client's bytes unread, and a client still sending may then never see the response. So
 * the write side is shut once the response is out (a FIN after it), the client's further
 * bytes are read and dropped until it closes, for at most LINGER_MS or LINGER_MAX bytes, and
 * only then is the connection closed. Not with a filter (TLS), whose records own the stream. */
#define LINGER_MS 2000
#define LINGER_MAX (16u << 20)

static void on_linger_shutdown(uv_shutdown_t *sd, int status)
{
    (void)sd;
    (void)status;   /* the close that follows is the lingering's end, whatever this says */
}

static void conn_close(struct net_http_conn *c)
{
    if (c->closing)
        return;
    if (c->linger && !c->lingering && !c->filter && !c->srv->closing &&
        uv_shutdown(&c->sd, (uv_stream_t *)&c->tcp, on_linger_shutdown) == 0) {
        c->lingering = true;
        timer_arm(c, LINGER_MS);
        if (!c->reading)
            read_start(c);
        return;
    }
    c->closing = true;
    struct net_http_req *r = &c->req;
    if (c->st == ST_DISPATCHED && r->answered && !r->resp_done)
        access_log(r, false);
    if (c->st == ST_DISPATCHED && (!r->answered || (r->kind == R_PUSH && !r->resp_done)) &&
        r->abort_cb) {
        void (*cb)(void *) = r->abort_cb;
        r->abort_cb = NULL;
        cb(r->abort_ud);
    }
    if (c->work_pending)
        return; /* the work's completion closes the handles */
    conn_close_handles(c);
}

void net_http_conn_close(struct net_http_conn *c)
{
    if (c->queued == 0)
        conn_close(c);
    else
        c->close_after_write = true;
}

void net_http_conn_abort(struct net_http_conn *c)
{
    conn_close(c);
}

/* ------------------------------------------------------------------ timers */

static void on_timer(uv_timer_t *t)
{
    struct net_http_conn *c = t->data;
    if (c->closing)
        return;
    if (c->lingering) {   /* the client did not finish: close now */
        conn_close(c);
        return;
    }
    struct net_http_server *s = c->srv;
    if (c->st == ST_HEADERS) {
        /* a request that never finishes its headers or its body (slowloris): 408, close */
        struct net_http_req *r = &c->req;
        r->keep_alive = false;
        c->st = ST_DISPATCHED;
        if (c->in_body) {
            s->stats.timeouts_body++;
            net_http_reply_error(r, 408, "request body not received within %u ms",
                                 s->lim.body_timeout_ms);
        } else {
            s->stats.timeouts_header++;
            net_http_reply_error(r, 408, "request headers not received within %u ms",
                                 s->lim.header_timeout_ms);
        }
        return;
    }
    if (c->st == ST_IDLE && !c->got_request && c->filter)
        s->stats.timeouts_handshake++;   /* TLS handshake (or silence after it) */
    else if (c->st == ST_IDLE && !c->got_request)
        s->stats.timeouts_header++;      /* connected and said nothing */
    else
        s->stats.timeouts_idle++;        /* keep-alive idle, or a handler that never answers */
    conn_close(c);
}

static void timer_arm(struct net_http_conn *c, uint32_t ms)
{
    if (!c->closing)
        uv_timer_start(&c->timer, on_timer, ms, 0);
}

/* ------------------------------------------------------------------ parsing */

static struct net_http_conn *pconn(http_parser *p) { return p->data; }

static int on_message_begin(http_parser *p)
{
    struct net_http_conn *c = pconn(p);
    req_reset(&c->req);
    return 0;
}

static int on_url(http_parser *p, const char *at, size_t len)
{
    struct net_http_conn *c = pconn(p);
    struct net_http_req *r = &c->req;
    if (len > c->srv->lim.max_url - r->url_len) {
        r->err_status = 414;
        return 1;
    }
    memcpy(r->url + r->url_len, at, len);
    r->url_len += len;
    r->url[r->url_len] = 0;
    return 0;
}

static int hb_append(struct net_http_req *r, const struct net_http_limits *lim, const char *at,
                     size_t len)
{
    /* hcap = max_header_bytes + room for a NUL after each name and value */
    if (len > r->hcap - 1 - r->hlen || r->hlen + len > lim->max_header_bytes + 2 * r->nh) {
        r->err_status = 431;
        return 1;
    }
    memcpy(r->hbuf + r->hlen, at, len);
    r->hlen += len;
    return 0;
}

static int on_header_field(http_parser *p, const char *at, size_t len)
{
    struct net_http_conn *c = pconn(p);
    struct net_http_req *r = &c->req;
    if (r->in_value || r->nh == 0) {
        if (r->nh > 0)
            r->hbuf[r->hlen++] = 0; /* end of the previous value (room reserved) */
        if (r->nh >= c->srv->lim.max_headers) {
            r->err_status = 431;
            return 1;
        }
        r->hname[r->nh++] = (uint32_t)r->hlen;
        r->in_value = false;
    }
    return hb_append(r, &c->srv->lim, at, len);
}

static int on_header_value(http_parser *p, const char *at, size_t len)
{
    struct net_http_conn *c = pconn(p);
    struct net_http_req *r = &c->req;
    if (!r->in_value) {
        r->hbuf[r->hlen++] = 0; /* end of the name */
        r->hval[r->nh - 1] = (uint32_t)r->hlen;
        r->in_value = true;
    }
    return hb_append(r, &c->srv->lim, at, len);
}

static int on_headers_complete(http_parser *p)
{
    struct net_http_conn *c = pconn(p);
    struct net_http_req *r = &c->req;
    if (r->nh > 0) {
        if (!r->in_value) { /* a name without a value */
            r->hbuf[r->hlen++] = 0;
            r->hval[r->nh - 1] = (uint32_t)r->hlen;
        }
        r->hbuf[r->hlen++] = 0;
    }
    snprintf(r->method, sizeof r->method, "%s", http_method_str(p->method));
    r->head = p->method == HTTP_HEAD;
    r->http10 = p->http_major == 1 && p->http_minor == 0;
    if (p->content_length != ULLONG_MAX && p->content_length > c->srv->lim.max_body) {
        r->err_status = 413;
        return -1;
    }
    /* the body has its own deadline; without one the dispatch arms the next */
    if (p->flags & F_CHUNKED || (p->content_length > 0 && p->content_length != ULLONG_MAX)) {
        c->in_body = true;
        timer_arm(c, c->srv->lim.body_timeout_ms);
    }
    /* a client waiting for permission to send its body (curl does for bodies over 1 KiB) */
    const char *ex = net_http_req_header(r, "Expect");
    if (ex && !r->http10 && strcasecmp(ex, "100-continue") == 0 &&
        (p->flags & F_CHUNKED || (p->content_length > 0 && p->content_length != ULLONG_MAX)))
        conn_send(c, "HTTP/1.1 100 Continue\r\n\r\n", 25, NULL);
    return 0;
}

static int on_body(http_parser *p, const char *at, size_t len)
{
    struct net_http_conn *c = pconn(p);
    struct net_http_req *r = &c->req;
    int rc = util_buf_append(&r->body, at, len, c->srv->lim.max_body);
    if (rc < 0) {
        r->err_status = rc == -E2BIG ? 413 : 500;
        return 1;
    }
    return 0;
}

static int on_message_complete(http_parser *p)
{
    struct net_http_conn *c = pconn(p);
    c->req.keep_alive = http_should_keep_alive(p);
    c->req.upgrade = p->upgrade;
    http_parser_pause(p, 1);
    return 0;
}

/* ------------------------------------------------------------------ dispatch */

static bool method_match(const struct route *rt, const struct net_http_req *r)
{
    if (rt->method[0] == '*')
        return true;
    if (strcmp(rt->method, r->method) == 0)
        return true;
    return r->head && strcmp(rt->method, "GET") == 0;
}

static void dispatch(struct net_http_conn *c)
{
    struct net_http_server *s = c->srv;
    struct net_http_req *r = &c->req;
    c->st = ST_DISPATCHED;
    c->in_body = false;
    s->stats.requests++;
    r->t0_ns = uv_hrtime();
    r->handed0 = c->handed;
    if (r->upgrade)
        r->keep_alive = false; /* unless the handler upgrades, the connection ends here */
    timer_arm(c, s->lim.idle_timeout_ms);
    struct http_parser_url u;
    http_parser_url_init(&u);
    char err[KV_ERR_MAX];
    if (c->parser.http_major != 1) {
        r->keep_alive = false;
        net_http_reply_error(r, 505, "HTTP/%u.%u not supported", c->parser.http_major,
                             c->parser.http_minor);
        return;
    }
    if (http_parser_parse_url(r->url, r->url_len, 0, &u) != 0 || !(u.field_set & (1 << UF_PATH))) {
        r->keep_alive = false;
        net_http_reply_error(r, 400, "malformed request target");
        return;
    }
    if (net_http_path_clean(r->url + u.field_data[UF_PATH].off, u.field_data[UF_PATH].len,
                            r->path, sizeof r->path, err, sizeof err) != 0) {
        net_http_reply_error(r, 400, "bad path: %s", err);
        return;
    }
    if (u.field_set & (1 << UF_QUERY)) {
        r->url[u.field_data[UF_QUERY].off + u.field_data[UF_QUERY].len] = 0;
        r->query = r->url + u.field_data[UF_QUERY].off;
    } else {
        r->query = "";
    }
    bool path_seen = false;
    for (size_t i = 0; i < s->n_routes; i++) {
        const struct route *rt = &s->routes[i];
        bool pm = rt->prefix ? strncmp(r->path, rt->path, rt->plen) == 0
                             : strcmp(r->path, rt->path) == 0;
        if (!pm)
            continue;
        path_seen = true;
        if (!method_match(rt, r))
            continue;
        rt->cb(r, rt->ud);
        return;
    }
    if (path_seen)
        net_http_reply_error(r, 405, "method %s not allowed on %s", r->method, r->path);
    else
        net_http_reply_error(r, 404, "no route for %s", r->path);
}

/* Parse what is buffered while the connection waits for requests; dispatch complete ones. */
static void conn_process(struct net_http_conn *c)
{
    if (c->in_process) {
        c->again = true;
        return;
    }
    c->in_process = true;
    do {
        c->again = false;
        while (!c->closing && (c->st == ST_IDLE || c->st == ST_HEADERS) && c->in_pos < c->in.len) {
            if (c->st == ST_IDLE) {
                c->st = ST_HEADERS;
                c->in_body = false;
                c->got_request = true;
                timer_arm(c, c->srv->lim.header_timeout_ms);
            }
            size_t avail = c->in.len - c->in_pos;
            size_t n = http_parser_execute(&c->parser, &c->ps, c->in.s + c->in_pos, avail);
            enum http_errno e = HTTP_PARSER_ERRNO(&c->parser);
            if (e == HPE_PAUSED) {
                c->in_pos += n;
                http_parser_pause(&c->parser, 0);
                dispatch(c);
                continue;
            }
            if (e != HPE_OK) {
                struct net_http_req *r = &c->req;
                int st = r->err_status ? r->err_status : 400;
                r->keep_alive = false;
                c->linger = true;   /* the client may still be sending the rest */
                c->in_pos = c->in.len;
                c->st = ST_DISPATCHED;
                if (st == 413)
                    net_http_reply_error(r, st, "request body over the limit %u bytes",
                                         c->srv->lim.max_body);
                else if (st == 414)
                    net_http_reply_error(r, st, "request target over the limit %u bytes",
                                         c->srv->lim.max_url);
                else if (st == 431)
                    net_http_reply_error(r, st, "headers over the limits (%u bytes, %u fields)",
                                         c->srv->lim.max_header_bytes, c->srv->lim.max_headers);
                else
                    net_http_reply_error(r, st, "malformed request: %s",
                                         http_errno_description(e));
                continue;
            }
            c->in_pos += n;
        }
        if (c->st == ST_UPGRADED && c->in_pos < c->in.len && c->up && !c->closing) {
            size_t n = c->in.len - c->in_pos;
            c->in_pos = c->in.len;
            c->up->on_data(c->up_ud, c, c->in.s + c->in.len - n, n);
        }
        if (c->in_pos == c->in.len)
            c->in_pos = c->in.len = 0;
    } while (c->again && !c->closing);
    c->in_process = false;
    /* read while waiting for a request (or upgraded), pause while answering */
    bool want = !c->closing && (c->lingering || (!c->user_paused && c->st != ST_DISPATCHED));
    if (want && !c->reading) {
        read_start(c);
    } else if (!want && c->reading && !c->closing) {
        uv_read_stop((uv_stream_t *)&c->tcp);
        c->reading = false;
    }
}

int net_http_conn_feed(struct net_http_conn *c, const void *buf, size_t n)
{
    if (c->closing)
        return -ECANCELED;
    if (n > c->in.cap - c->in.len) {   /* no room: drop what was parsed before growing */
        util_buf_consume(&c->in, c->in_pos);
        c->in_pos = 0;
    }
    int rc = util_buf_append(&c->in, buf, n, c->in_max);
    if (rc < 0) {
        conn_close(c); /* -E2BIG: more pipelined input than any request may hold */
        return rc == -E2BIG ? -ENOBUFS : rc;
    }
    conn_process(c);
    return 0;
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b)
{
    struct net_http_conn *c = h->data;
    (void)hint;
    /* one read buffer per server: on_read consumes it before the loop reads another socket,
     * so an idle or stalled connection holds none */
    b->base = c->srv->rbuf;
    b->len = HTTP_RBUF;
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *b)
{
    struct net_http_conn *c = st->data;
    if (nread < 0) {
        conn_close(c);
        return;
    }
    if (nread == 0 || c->closing)
        return;
    c->srv->stats.bytes_received += (uint64_t)nread;
    if (c->lingering) {   /* dropped; enough of it ends the lingering */
        c->linger_bytes += (uint64_t)nread;
        if (c->linger_bytes > LINGER_MAX)
            conn_close(c);
        return;
    }
    if (c->filter) {
        if (c->filter->recv(c->fstate, c, b->base, (size_t)nread) < 0)
            conn_close(c);
        return;
    }
    net_http_conn_feed(c, b->base, (size_t)nread);
}

static void read_start(struct net_http_conn *c)
{
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) == 0)
        c->reading = true;
}

void net_http_conn_read_pause(struct net_http_conn *c, bool pause)
{
    c->user_paused = pause;
    if (c->closing)
        return;
    if (pause && c->reading) {
        uv_read_stop((uv_stream_t *)&c->tcp);
        c->reading = false;
    } else if (!pause && !c->reading && c->st != ST_DISPATCHED) {
        read_start(c);
    }
}

/* ------------------------------------------------------------------ accept */

/* The counting key of a peer: its IPv4 address, or the /64 of an IPv6 one (a host holds a
 * whole /64, so counting single IPv6 addresses would count nothing). */
static void addr_key(const uv_tcp_t *tcp, char *out, size_t n)
{
    struct sockaddr_storage ss;
    int len = sizeof ss;
    snprintf(out, n, "?");
    if (uv_tcp_getpeername(tcp, (struct sockaddr *)&ss, &len) != 0)
        return;
    if (ss.ss_family == AF_INET) {
        inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, out, (socklen_t)n);
        return;
    }
    if (ss.ss_family != AF_INET6)
        return;
    struct in6_addr a = ((struct sockaddr_in6 *)&ss)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&a)) {
        inet_ntop(AF_INET, &a.s6_addr[12], out, (socklen_t)n);
        return;
    }
    memset(&a.s6_addr[8], 0, 8);
    char buf[INET6_ADDRSTRLEN];
    inet_ntop(AF_INET6, &a, buf, sizeof buf);
    snprintf(out, n, "%s/64", buf);
}

/* The connection to close so that c, over a cap, may stay: the one waiting longest for a
 * request, kept alive after an answer first, then one that has sent nothing yet (a TLS
 * handshake included); only from ae when given (the per-address cap). A connection
 * answering, reading a request, upgraded, or with bytes waiting for the socket is never
 * chosen. NULL: none is idle. */
static struct net_http_conn *idle_victim(struct net_http_server *s, struct net_http_conn *c,
                                         const struct addr_ent *ae, bool kept_only)
{
    struct net_http_conn *kept = NULL, *silent = NULL;
    for (struct net_http_conn *v = s->conns; v; v = v->next) {
        if (v == c || v->st != ST_IDLE || v->closing || v->lingering || v->queued ||
            v->work_pending || v->close_after_write || (ae && v->ae != ae))
            continue;
        struct net_http_conn **best = v->got_request ? &kept : &silent;
        if (!*best || v->idle_ms < (*best)->idle_ms)
            *best = v;
    }
    return kept ? kept : kept_only ? NULL : silent;
}

/* Close a connection over a cap at once: a plain server first tries a 503 without queueing
 * anything (what the socket does not take is dropped), then the close is logged. */
static void conn_refuse(struct net_http_conn *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void conn_refuse(struct net_http_conn *c, const char *fmt, ...)
{
    struct net_http_server *s = c->srv;
    if (!s->filter) {
        static const char busy[] = "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n"
                                   "Content-Length: 0\r\nRetry-After: 1\r\n\r\n";
        uv_buf_t b = uv_buf_init((char *)busy, sizeof busy - 1);
        uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
    }
    if (s->log && uv_now(s->loop) - s->log_last >= HTTP_LOG_GAP_MS) {
        char line[400];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(line, sizeof line, fmt, ap);
        va_end(ap);
        srv_log(s, "%s", line);
    } else {
        s->log_skipped += s->log != NULL;
    }
    conn_close(c);
}

static void on_connection(uv_stream_t *ls, int status)
{
    struct net_http_server *s = ls->data;
    if (status < 0 || s->closing)
        return;
    struct net_http_conn *c = calloc(1, sizeof *c);
    if (c) {
        c->in_max = (size_t)s->lim.max_url + s->lim.max_header_bytes + s->lim.max_body + 65536;
        c->req.url = malloc((size_t)s->lim.max_url + 1);
        c->req.hcap = (size_t)s->lim.max_header_bytes + 2 * (size_t)s->lim.max_headers + 2;
        c->req.hbuf = malloc(c->req.hcap);
    }
    if (!c || !c->req.url || !c->req.hbuf) {
        if (c) {
            free(c->req.url);
            free(c->req.hbuf);
            free(c);
        }
        return; /* the pending connection stays in the backlog; the client times out */
    }
    c->req.c = c;
    c->srv = s;
    uv_tcp_init(s->loop, &c->tcp);
    uv_timer_init(s->loop, &c->timer);
    uv_timer_init(s->loop, &c->pace);
    uv_timer_init(s->loop, &c->wtimer);
    c->pace.data = c;
    c->tcp.data = c;
    c->timer.data = c;
    c->wtimer.data = c;
    c->handles_open = 4;
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    s->stats.conns_open++;
    if (uv_accept(ls, (uv_stream_t *)&c->tcp) != 0) {
        conn_close(c);
        return;
    }
    net__tcp_peer(&c->tcp, c->peer, sizeof c->peer);
    char addr[sizeof c->ae->addr];
    addr_key(&c->tcp, addr, sizeof addr);
    snprintf(c->addr, sizeof c->addr, "%s", addr);
    struct addr_ent **as = addr_slot(s, addr);
    c->idle_ms = uv_now(s->loop);
    /* Over a cap: an idle connection makes room (it counts until its close callback, so the
     * count may pass the cap by the connections closing now). */
    bool over_addr = *as && (*as)->n >= s->lim.max_conns_per_addr;
    struct net_http_conn *v = NULL;
    /* Over the per-address cap only a kept-alive connection of that address makes room: its
     * silent ones are what a slow-loris host holds, and refusing its next one (counted and
     * logged, rate-limited) is what bounds it. Over the global cap a silent one may go too. */
    if (over_addr || s->stats.conns_open > s->lim.max_conns)
        v = idle_victim(s, c, over_addr ? *as : NULL, over_addr);
    if (v) {
        s->stats.conns_evicted++;
        srv_log(s, "closed an idle connection from %s (idle %.1f s) to make room for %s", v->peer,
                (double)(c->idle_ms - v->idle_ms) / 1000, c->peer);
        conn_close(v);
    } else if (s->stats.conns_open > s->lim.max_conns) {
        s->stats.conns_refused++;
        conn_refuse(c, "refused connection from %s: %u connections open (limit %u)", c->peer,
                    (unsigned)s->stats.conns_open - 1, s->lim.max_conns);
        return;
    } else if (over_addr) {
        s->stats.conns_refused_addr++;
        conn_refuse(c, "refused connection from %s: %u connections from %s (limit %u)", c->peer,
                    (*as)->n, addr, s->lim.max_conns_per_addr);
        return;
    }
    if (!*as) {
        *as = calloc(1, sizeof **as);
        if (!*as) {
            conn_close(c);
            return;
        }
        snprintf((*as)->addr, sizeof (*as)->addr, "%s", addr);
        s->stats.addrs++;
    }
    c->ae = *as;
    c->ae->n++;
    s->stats.conns_accepted++;
    uv_tcp_nodelay(&c->tcp, 1);
    http_parser_init(&c->parser, HTTP_REQUEST);
    c->parser.data = c;
    http_parser_settings_init(&c->ps);
    c->ps.on_message_begin = on_message_begin;
    c->ps.on_url = on_url;
    c->ps.on_header_field = on_header_field;
    c->ps.on_header_value = on_header_value;
    c->ps.on_headers_complete = on_headers_complete;
    c->ps.on_body = on_body;
    c->ps.on_message_complete = on_message_complete;
    c->st = ST_IDLE;
    /* a connection that says nothing, or never finishes its TLS handshake */
    timer_arm(c, s->filter ? s->lim.handshake_timeout_ms : s->lim.header_timeout_ms);
    if (s->filter) {
        c->filter = s->filter;
        if (s->filter->open(s->filter->ud, c, &c->fstate) < 0) {
            c->filter = NULL;
            conn_close(c);
            return;
        }
    }
    read_start(c);
}

/* ------------------------------------------------------------------ server */

int net_http_server_new(struct net_http_server **out, struct uv_loop_s *loop,
                        const struct net_http_limits *limits)
{
    struct net_http_server *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    s->loop = loop;
    struct net_http_limits d = {.max_url = 2048, .max_header_bytes = 16384, .max_headers = 64,
                                .max_body = 1u << 20, .header_timeout_ms = 10000,
                                .idle_timeout_ms = 60000, .max_conns = 1024, .zstd_level = 3,
                                .body_timeout_ms = 30000, .write_timeout_ms = 30000,
                                .handshake_timeout_ms = 10000, .max_conns_per_addr = 256,
                                .copy_high_water = 512u << 10, .max_zstd_streams = 16};
    if (limits) {
        if (limits->max_url) d.max_url = limits->max_url;
        if (limits->max_header_bytes) d.max_header_bytes = limits->max_header_bytes;
        if (limits->max_headers) d.max_headers = limits->max_headers;
        if (limits->max_body) d.max_body = limits->max_body;
        if (limits->header_timeout_ms) d.header_timeout_ms = limits->header_timeout_ms;
        if (limits->idle_timeout_ms) d.idle_timeout_ms = limits->idle_timeout_ms;
        d.keepalive_timeout_ms = limits->keepalive_timeout_ms;
        if (limits->max_conns) d.max_conns = limits->max_conns;
        if (limits->zstd_level) d.zstd_level = limits->zstd_level;
        d.max_send_rate = limits->max_send_rate;
        if (limits->body_timeout_ms) d.body_timeout_ms = limits->body_timeout_ms;
        if (limits->write_timeout_ms) d.write_timeout_ms = limits->write_timeout_ms;
        if (limits->handshake_timeout_ms) d.handshake_timeout_ms = limits->handshake_timeout_ms;
        if (limits->max_conns_per_addr) d.max_conns_per_addr = limits->max_conns_per_addr;
        if (limits->copy_high_water) d.copy_high_water = limits->copy_high_water;
        if (limits->max_zstd_streams) d.max_zstd_streams = limits->max_zstd_streams;
        d.json_errors = limits->json_errors;
    }
    if (!d.keepalive_timeout_ms)
        d.keepalive_timeout_ms = d.idle_timeout_ms;
    if (d.copy_high_water < HTTP_CHUNK)
        d.copy_high_water = HTTP_CHUNK;
    if (d.max_headers > HTTP_MAX_HEADERS_CAP)
        d.max_headers = HTTP_MAX_HEADERS_CAP;
    if (d.max_url > HTTP_PATH_MAX - 1)
        d.max_url = HTTP_PATH_MAX - 1;
    if (d.max_header_bytes > (1u << 20))
        d.max_header_bytes = 1u << 20;
    if (d.max_body > (1u << 30))
        d.max_body = 1u << 30;
    s->lim = d;
    if (uv_mutex_init(&s->zmu) != 0) {
        free(s);
        return -ENOMEM;
    }
    uv_tcp_init(loop, &s->listener);
    s->listener.data = s;
    *out = s;
    return 0;
}

void net_http_server_set_filter(struct net_http_server *s, const struct net_http_filter *f)
{
    s->filter = f;
}

int net_http_server_route(struct net_http_server *s, const char *method, const char *path,
                          net_http_handler_cb cb, void *ud)
{
    if (!method || !path || !cb || strlen(method) >= sizeof s->routes[0].method)
        return -EINVAL;
    struct route *nr = realloc(s->routes, (s->n_routes + 1) * sizeof *nr);
    if (!nr)
        return -ENOMEM;
    s->routes = nr;
    struct route *rt = &nr[s->n_routes];
    memset(rt, 0, sizeof *rt);
    snprintf(rt->method, sizeof rt->method, "%s", method);
    rt->path = strdup(path);
    if (!rt->path)
        return -ENOMEM;
    rt->plen = strlen(path);
    if (rt->plen && path[rt->plen - 1] == '*') {
        rt->prefix = true;
        rt->path[--rt->plen] = 0;
    }
    rt->cb = cb;
    rt->ud = ud;
    s->n_routes++;
    return 0;
}

int net_http_server_listen(struct net_http_server *s, const char *addr)
{
    struct sockaddr_storage ss;
    const char *why;
    int rc = net__listen_addr(addr, &ss, &why);
    if (rc < 0)
        return rc;
    if ((rc = net__listen_tcp(&s->listener, &ss)) < 0)
        return rc;
    if ((rc = uv_listen((uv_stream_t *)&s->listener, 511, on_connection)) < 0)
        return rc;
    int len = sizeof ss;
    if (uv_tcp_getsockname(&s->listener, (struct sockaddr *)&ss, &len) == 0)
        s->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                 : ((struct sockaddr_in *)&ss)->sin_port);
    s->listening = true;
    return 0;
}

int net_http_server_port(const struct net_http_server *s) { return s->port; }
const struct net_http_stats *net_http_server_stats(const struct net_http_server *s)
{
    return &s->stats;
}

static void on_listener_closed(uv_handle_t *h)
{
    struct net_http_server *s = h->data;
    s->listener_closed = true;
    server_maybe_free(s);
}

void net_http_server_close(struct net_http_server *s, void (*done)(void *), void *ud)
{
    if (s->closing)
        return;
    s->closing = true;
    s->done = done;
    s->done_ud = ud;
    for (struct net_http_conn *c = s->conns, *n; c; c = n) {
        n = c->next;
        conn_close(c);
    }
    uv_close((uv_handle_t *)&s->listener, on_listener_closed);
}

/* ------------------------------------------------------------------ requests */

const char *net_http_req_method(const struct net_http_req *r) { return r->method; }
const char *net_http_req_path(const struct net_http_req *r) { return r->path; }
const char *net_http_req_query(const struct net_http_req *r) { return r->query ? r->query : ""; }
bool net_http_req_is_head(const struct net_http_req *r) { return r->head; }
bool net_http_req_is_upgrade(const struct net_http_req *r) { return r->upgrade; }
bool net_http_req_is_http10(const struct net_http_req *r) { return r->http10; }
const char *net_http_req_peer(const struct net_http_req *r) { return r->c->peer; }
const char *net_http_req_addr(const struct net_http_req *r) { return r->c->addr; }
struct net_http_conn *net_http_req_conn(struct net_http_req *r) { return r->c; }
size_t net_http_req_header_count(const struct net_http_req *r) { return r->nh; }

void net_http_req_header_at(const struct net_http_req *r, size_t i, const char **name,
                            const char **value)
{
    *name = i < r->nh ? r->hbuf + r->hname[i] : NULL;
    *value = i < r->nh ? r->hbuf + r->hval[i] : NULL;
}

const char *net_http_req_header(const struct net_http_req *r, const char *name)
{
    for (size_t i = 0; i < r->nh; i++)
        if (strcasecmp(r->hbuf + r->hname[i], name) == 0)
            return r->hbuf + r->hval[i];
    return NULL;
}

const void *net_http_req_body(const struct net_http_req *r, size_t *len)
{
    if (len)
        *len = r->body.len;
    return r->body.p;
}

void net_http_req_set_abort(struct net_http_req *r, void (*abort_cb)(void *), void *ud)
{
    r->abort_cb = abort_cb;
    r->abort_ud = ud;
}

/* ------------------------------------------------------------------ responses */

static void count_status(struct net_http_req *r, int status)
{
    struct net_http_server *s = r->c->srv;
    r->status = status;
    if (status < 300) s->stats.responses_2xx++;
    else if (status < 400) s->stats.responses_3xx++;
    else if (status < 500) s->stats.responses_4xx++;
    else s->stats.responses_5xx++;
}

/* Response head into a malloc'd string. len_mode: >=0 Content-Length, -1 chunked, -2 none. */
static char *build_head(struct net_http_req *r, int status, const char *ctype, const char *extra,
                        int64_t clen, bool chunked, size_t *out_len)
{
    char date[64];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(date, sizeof date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    char lenh[64] = "";
    if (chunked)
        snprintf(lenh, sizeof lenh, "Transfer-Encoding: chunked\r\n");
    else if (clen >= 0)
        snprintf(lenh, sizeof lenh, "Content-Length: %lld\r\n", (long long)clen);
    const char *conn = !r->keep_alive ? "Connection: close\r\n"
                       : r->http10    ? "Connection: keep-alive\r\n" : "";
    char *h = NULL;
    int n = asprintf(&h, "HTTP/1.1 %d %s\r\nServer: kvasir\r\nDate: %s\r\n%s%s%s%s%s%s\r\n",
                     status, net_http_status_text(status), date, ctype ? "Content-Type: " : "",
                     ctype ? ctype : "", ctype ? "\r\n" : "", lenh, conn, extra ? extra : "");
    if (n < 0)
        return NULL;
    *out_len = (size_t)n;
    return h;
}

static int answer_check(struct net_http_req *r)
{
    if (r->answered || r->c->closing)
        return -EALREADY;
    r->answered = true;
    return 0;
}

/* One access-log line for r: complete (every byte queued) or cut short (the connection went
 * first). Upgrades are their handler's to log. */
static void access_log(struct net_http_req *r, bool complete)
{
    struct net_http_conn *c = r->c;
    struct net_http_server *s = c->srv;
    if (!s->access || !r->answered || r->status == 101)
        return;
    struct net_http_access a = {
        .peer = c->peer, .method = r->method, .path = r->path, .status = r->status,
        .bytes = c->handed - r->handed0, .ms = (double)(uv_hrtime() - r->t0_ns) / 1e6,
        .complete = complete,
    };
    s->access(s->access_ud, &a);
}

void net_http_server_set_access_log(struct net_http_server *s, net_http_access_cb cb, void *ud)
{
    s->access = cb;
    s->access_ud = ud;
}

/* The whole response is queued: next request (keep-alive) or close. */
static void req_finish(struct net_http_req *r)
{
    struct net_http_conn *c = r->c;
    r->resp_done = true;
    access_log(r, true);
    if (c->closing)
        return;
    if (!r->keep_alive) {
        net_http_conn_close(c);
        return;
    }
    req_reset(r);
    c->st = ST_IDLE;
    c->idle_ms = uv_now(c->srv->loop);
    timer_arm(c, c->srv->lim.keepalive_timeout_ms);
    conn_process(c);
}

int net_http_reply(struct net_http_req *r, int status, const char *content_type,
                   const char *extra_headers, const void *body, size_t len)
{
    int rc = answer_check(r);
    if (rc < 0)
        return rc;
    struct net_http_conn *c = r->c;
    count_status(r, status);
    r->kind = R_SIMPLE;
    bool nobody = status == 204 || status == 304 || (status >= 100 && status < 200);
    size_t hl;
    char *h = build_head(r, status, content_type, extra_headers, nobody ? -2 : (int64_t)len,
                         false, &hl);
    if (!h) {
        net_http_conn_close(c);
        return -ENOMEM;
    }
    size_t bl = (r->head || nobody) ? 0 : len;
    char *all = realloc(h, hl + bl + 1);
    if (!all) {
        free(h);
        net_http_conn_close(c);
        return -ENOMEM;
    }
    if (bl)
        memcpy(all + hl, body, bl);
    c->srv->stats.body_bytes_sent += bl;
    rc = conn_send_owned(c, all, hl + bl);
    req_finish(r);
    return rc;
}

int net_http_reply_error(struct net_http_req *r, int status, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    if ((size_t)n > sizeof msg - 2)
        n = (int)sizeof msg - 2;
    if (r->c->srv->lim.json_errors) {
        msg[n] = 0;
        cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(e, "message", msg);
        cJSON_AddStringToObject(e, "type", status >= 500 ? "server_error" : "invalid_request_error");
        cJSON_AddNumberToObject(e, "code", status);
        char *js = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        if (!js)
            return net_http_reply(r, 500, "text/plain; charset=utf-8", NULL, NULL, 0);
        int rc = net_http_reply(r, status, "application/json", NULL, js, strlen(js));
        free(js);
        return rc;
    }
    msg[n++] = '\n';
    msg[n] = 0;
    return net_http_reply(r, status, "text/plain; charset=utf-8", NULL, msg, (size_t)n);
}

/* ---- pulled bodies */

struct zwork {
    uv_work_t w;
    struct net_http_conn *c;
    struct body_stream *bs;
    const void *in;
    size_t in_n;
    char *in_copy;
    bool last;
    char *out;   /* chunk framing room in front: 18 bytes */
    size_t out_n;
    int err;
};

#define ZPRE 18

/* Each chunk becomes one whole zstd frame (a zstd stream may hold several; decoders,
 * curl's included, read them in turn), so no compressor outlives a job: a response whose
 * client stops reading holds only its queued output. Contexts are pooled per server. */
static void zwork_run(uv_work_t *w)
{
    struct zwork *z = (struct zwork *)w;
    struct net_http_server *s = z->c->srv;
    size_t cap = ZPRE + ZSTD_compressBound(z->in_n) + 8;
    z->out = malloc(cap);
    if (!z->out) {
        z->err = -ENOMEM;
        return;
    }
    ZSTD_CCtx *cc = NULL;
    uv_mutex_lock(&s->zmu);
    if (s->zpool_n > 0)
        cc = s->zpool[--s->zpool_n];
    uv_mutex_unlock(&s->zmu);
    if (!cc && !(cc = ZSTD_createCCtx())) {
        z->err = -ENOMEM;
        return;
    }
    size_t n = ZSTD_CCtx_setParameter(cc, ZSTD_c_compressionLevel, s->lim.zstd_level);
    if (!ZSTD_isError(n))
        n = ZSTD_compress2(cc, z->out + ZPRE, cap - ZPRE - 8, z->in, z->in_n);
    if (ZSTD_isError(n))
        z->err = -EIO;
    else
        z->out_n = n;
    uv_mutex_lock(&s->zmu);
    if (s->zpool_n < HTTP_ZPOOL_MAX) {
        s->zpool[s->zpool_n++] = cc;
        cc = NULL;
    }
    uv_mutex_unlock(&s->zmu);
    ZSTD_freeCCtx(cc);
}

static void zwork_done(uv_work_t *w, int status)
{
    struct zwork *z = (struct zwork *)w;
    struct net_http_conn *c = z->c;
    struct body_stream *bs = z->bs;
    c->work_pending = false;
    free(z->in_copy);
    if (c->closing) {
        free(z->out);
        bs_unref(bs);
        free(z);
        conn_close_handles(c);
        return;
    }
    if (status < 0 || z->err < 0) {
        free(z->out);
        bs_unref(bs);
        free(z);
        conn_close(c);
        return;
    }
    /* frame: "<hex>\r\n" right-aligned before the data, "\r\n" after (+ last chunk) */
    char *buf = z->out;
    size_t n = z->out_n;
    size_t start = ZPRE, total = 0;
    if (bs->chunked && n > 0) {
        char pre[ZPRE + 1];
        int pl = snprintf(pre, sizeof pre, "%zx\r\n", n);
        start = ZPRE - (size_t)pl;
        memcpy(buf + start, pre, (size_t)pl);
        memcpy(buf + ZPRE + n, "\r\n", 2);
        total = (size_t)pl + n + 2;
    } else {
        total = n;
    }
    c->srv->stats.body_bytes_sent += n;
    if (z->last && bs->chunked) {
        /* terminating chunk needs its own small write (buffer has 8 spare bytes only after data) */
        if (total)
            memmove(buf, buf + start, total);
        start = 0;
        char *nb = realloc(buf, total + 5);
        if (nb) {
            buf = nb;
            memcpy(buf + total, "0\r\n\r\n", 5);
            total += 5;
        }
    } else if (start) {
        memmove(buf, buf + start, total);
    }
    bool last = z->last;
    free(z);
    int rc = total ? conn_send_owned(c, buf, total) : (free(buf), 0);
    bs_unref(bs);
    if (rc < 0) {
        conn_close(c);
        return;
    }
    if (last) {
        req_finish(&c->req);
    } else {
        pump(c);
    }
}

static void on_pace(uv_timer_t *t)
{
    pump(t->data);
}

static void pump(struct net_http_conn *c)
{
    struct net_http_req *r = &c->req;
    struct body_stream *bs = r->bs;
    if (c->pumping || c->closing || !bs || r->resp_done || c->work_pending)
        return;
    c->pumping = true;
    /* a body sent from its own memory costs nothing queued; a copy (compressed or
     * encrypted) is held until written, so less of it is let wait */
    size_t high = bs->zstd || c->filter ? c->srv->lim.copy_high_water : HTTP_HIGH_WATER;
    while (!c->closing && c->queued < high && !c->work_pending) {
        if (bs->off >= bs->end && !bs->zstd) {
            c->pumping = false;
            req_finish(r);
            return;
        }
        size_t want = bs->end - bs->off > HTTP_CHUNK ? HTTP_CHUNK : (size_t)(bs->end - bs->off);
        uint64_t rate = c->srv->lim.max_send_rate;
        if (rate && want > 0) {
            /* allowance so far, with a 100 ms burst */
            uint64_t el = uv_now(c->srv->loop) - bs->t0;
            uint64_t allowed = rate * el / 1000 + rate / 10;
            if (bs->sent >= allowed) {
                uint64_t ms = (bs->sent - allowed) * 1000 / rate + 20;
                uv_timer_start(&c->pace, on_pace, ms, 0);
                break;
            }
            if (want > allowed - bs->sent)
                want = (size_t)(allowed - bs->sent);
        }
        const void *ptr = NULL;
        ptrdiff_t got = 0;
        if (want > 0) {
            if (!c->scratch && !(c->scratch = malloc(HTTP_CHUNK))) {
                got = -ENOMEM;
            } else {
                got = bs->b.read(bs->b.ud, bs->off, c->scratch, want, &ptr);
            }
            if (got <= 0 || (size_t)got > want || !ptr) {
                conn_close(c);
                break;
            }
        }
        if (bs->zstd) {
            struct zwork *z = calloc(1, sizeof *z);
            if (!z) {
                conn_close(c);
                break;
            }
            z->c = c;
            z->bs = bs;
            bs->refs++;
            z->in_n = (size_t)got;
            if (ptr == c->scratch && got > 0) {
                z->in_copy = malloc((size_t)got);
                if (!z->in_copy) {
                    bs_unref(bs);
                    free(z);
                    conn_close(c);
                    break;
                }
                memcpy(z->in_copy, ptr, (size_t)got);
                z->in = z->in_copy;
            } else {
                z->in = ptr;
            }
            bs->off += (uint64_t)got;
            bs->sent += (uint64_t)got;
            z->last = bs->off >= bs->end;
            if (uv_queue_work(c->srv->loop, &z->w, zwork_run, zwork_done) != 0) {
                free(z->in_copy);
                bs_unref(bs);
                free(z);
                conn_close(c);
                break;
            }
            c->work_pending = true;
            break;
        }
        int rc = conn_send(c, ptr, (size_t)got, ptr == c->scratch ? NULL : bs);
        if (rc < 0) {
            conn_close(c);
            break;
        }
        bs->off += (uint64_t)got;
        bs->sent += (uint64_t)got;
        c->srv->stats.body_bytes_sent += (uint64_t)got;
    }
    c->pumping = false;
}

static bool etag_match(const char *list, const char *etag)
{
    if (!list || !etag)
        return false;
    size_t el = strlen(etag);
    const char *p = list;
    while (*p) {
        while (*p == ' ' || *p == ',' || *p == '\t')
            p++;
        if (*p == '*')
            return true;
        if (p[0] == 'W' && p[1] == '/')
            p += 2;
        if (strncmp(p, etag, el) == 0 && (p[el] == 0 || p[el] == ',' || p[el] == ' '))
            return true;
        while (*p && *p != ',')
            p++;
    }
    return false;
}

int net_http_reply_body(struct net_http_req *r, int status, const char *content_type,
                        const char *extra_headers, const struct net_http_body *body)
{
    struct net_http_conn *c = r->c;
    if (r->answered || c->closing) {
        if (body->release)
            body->release(body->ud);
        return -EALREADY;
    }
    struct body_stream *bs = calloc(1, sizeof *bs);
    if (!bs) {
        if (body->release)
            body->release(body->ud);
        net_http_reply_error(r, 500, "out of memory");
        return -ENOMEM;
    }
    bs->b = *body;
    bs->b.etag = body->etag ? strdup(body->etag) : NULL;
    bs->refs = 1;
    bs->srv = c->srv;
    bs->off = 0;
    bs->t0 = uv_now(c->srv->loop);
    bs->end = body->size;
    /* conditional requests and ranges (only on a 200 answer to GET/HEAD) */
    char extra[1024];
    const char *etag = bs->b.etag;
    bool cond = status == 200 && (strcmp(r->method, "GET") == 0 || r->head);
    const char *ae = net_http_req_header(r, "Accept-Encoding");
    const char *range = net_http_req_header(r, "Range");
    const char *ifr = net_http_req_header(r, "If-Range");
    if (cond && etag && etag_match(net_http_req_header(r, "If-None-Match"), etag)) {
        snprintf(extra, sizeof extra, "ETag: %s\r\n%s", etag, extra_headers ? extra_headers : "");
        bs_unref(bs);
        return net_http_reply(r, 304, NULL, extra, NULL, 0);
    }
    char cr[128] = "";
    if (cond && range && (!ifr || (etag && strcmp(ifr, etag) == 0))) {
        uint64_t a, b;
        int k = net_http_range_parse(range, body->size, &a, &b);
        if (k == -ERANGE) {
            snprintf(extra, sizeof extra, "Content-Range: bytes */%llu\r\n%s%s%s%s",
                     (unsigned long long)body->size, etag ? "ETag: " : "", etag ? etag : "",
                     etag ? "\r\n" : "", extra_headers ? extra_headers : "");
            bs_unref(bs);
            return net_http_reply(r, 416, "text/plain; charset=utf-8", extra,
                                  "range not satisfiable\n", 22);
        }
        if (k == 1) {
            status = 206;
            bs->off = a;
            bs->end = b + 1;
            snprintf(cr, sizeof cr, "Content-Range: bytes %llu-%llu/%llu\r\n",
                     (unsigned long long)a, (unsigned long long)b,
                     (unsigned long long)body->size);
        }
    }
    bs->zstd = body->compressible && status == 200 && !r->http10 &&
               net_http_accepts(ae, "zstd");
    if (bs->zstd && c->srv->stats.zstd_active >= c->srv->lim.max_zstd_streams) {
        bs->zstd = false; /* every compressor is busy: identity is always acceptable */
        c->srv->stats.zstd_declined++;
    }
    char etag2[160] = "";
    if (etag) {
        size_t el = strlen(etag);
        if (bs->zstd && el >= 2 && el < sizeof etag2 - 8 && etag[el - 1] == '"')
            snprintf(etag2, sizeof etag2, "ETag: %.*s-zst\"\r\n", (int)(el - 1), etag);
        else
            snprintf(etag2, sizeof etag2, "ETag: %s\r\n", etag);
    }
    snprintf(extra, sizeof extra, "Accept-Ranges: bytes\r\n%s%s%s%s%s", etag2, cr,
             body->compressible ? "Vary: Accept-Encoding\r\n" : "",
             bs->zstd ? "Content-Encoding: zstd\r\n" : "", extra_headers ? extra_headers : "");
    r->answered = true;
    count_status(r, status);
    if (bs->zstd) {
        bs->chunked = true;
        c->srv->stats.zstd_active++; /* until the stream is released (bs_unref) */
    }
    size_t hl;
    char *h = build_head(r, status, content_type, extra, (int64_t)(bs->end - bs->off),
                         bs->chunked, &hl);
    if (!h) {
        bs_unref(bs);
        net_http_conn_close(c);
        return -ENOMEM;
    }
    int rc = conn_send_owned(c, h, hl);
    if (rc < 0 || r->head) {
        bs_unref(bs);
        if (rc < 0)
            net_http_conn_close(c);
        else
            req_finish(r);
        return rc;
    }
    r->kind = R_BODY;
    r->bs = bs;
    pump(c);
    return 0;
}

/* ---- pushed bodies */

int net_http_reply_begin(struct net_http_req *r, int status, const char *content_type,
                         const char *extra_headers, uint64_t len, void (*writable)(void *),
                         void *ud)
{
    int rc = answer_check(r);
    if (rc < 0)
        return rc;
    struct net_http_conn *c = r->c;
    count_status(r, status);
    r->kind = R_PUSH;
    r->writable = writable;
    r->writable_ud = ud;
    r->push_left = len;
    if (len == UINT64_MAX) {
        if (r->http10)
            r->keep_alive = false; /* close-delimited */
        else
            r->push_chunked = true;
    }
    size_t hl;
    char *h = build_head(r, status, content_type, extra_headers,
                         len == UINT64_MAX ? -2 : (int64_t)len, r->push_chunked, &hl);
    if (!h) {
        net_http_conn_close(c);
        return -ENOMEM;
    }
    rc = conn_send_owned(c, h, hl);
    if (r->head) {
        r->push_left = 0;
        r->push_chunked = false;
    }
    return rc;
}

int net_http_reply_write(struct net_http_req *r, const void *buf, size_t len)
{
    struct net_http_conn *c = r->c;
    if (r->kind != R_PUSH || r->resp_done || c->closing)
        return -EINVAL;
    if (r->head || len == 0)
        return 0;
    if (!r->push_chunked && r->push_left != UINT64_MAX) {
        if (len > r->push_left)
            return -EMSGSIZE;
        r->push_left -= len;
    }
    c->srv->stats.body_bytes_sent += len;
    if (!r->push_chunked)
        return conn_send(c, buf, len, NULL);
    char *b = malloc(len + 32);
    if (!b)
        return -ENOMEM;
    int pl = snprintf(b, 32, "%zx\r\n", len);
    memcpy(b + pl, buf, len);
    memcpy(b + pl + len, "\r\n", 2);
    return conn_send_owned(c, b, (size_t)pl + len + 2);
}

size_t net_http_reply_queued(const struct net_http_req *r) { return r->c->queued; }

int net_http_reply_end(struct net_http_req *r)
{
    struct net_http_conn *c = r->c;
    if (r->kind != R_PUSH || r->resp_done)
        return -EINVAL;
    int rc = 0;
    if (r->push_chunked)
        rc = conn_send(c, "0\r\n\r\n", 5, NULL);
    else if (r->push_left != UINT64_MAX && r->push_left != 0)
        r->keep_alive = false; /* short body: the client can only tell by the close */
    req_finish(r);
    return rc;
}

/* ---- upgrade */

int net_http_upgrade(struct net_http_req *r, const char *response_head,
                     const struct net_http_upgrade_ops *ops, void *ud,
                     struct net_http_conn **conn)
{
    int rc = answer_check(r);
    if (rc < 0)
        return rc;
    struct net_http_conn *c = r->c;
    if (!r->upgrade || !ops || !ops->on_data) {
        r->answered = false;
        return -EINVAL;
    }
    count_status(r, 101);
    c->up = ops;
    c->up_ud = ud;
    c->st = ST_UPGRADED;
    uv_timer_stop(&c->timer);
    rc = conn_send(c, response_head, strlen(response_head), NULL);
    if (conn)
        *conn = c;
    conn_process(c); /* bytes already received after the request, then reading resumes */
    return rc;
}

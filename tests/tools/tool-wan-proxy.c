/* tool-wan-proxy: a TCP proxy that makes a loopback link behave like a WAN path, for rings
 * measured under emulated latency (tests/lib/wan_ring.sh, tests/integration/test-ring-wan.sh, the `wan`
 * section of tests/bench.sh). This machine's kernel has no `tc netem`, so the path is
 * emulated in user space; what that costs is measured by the `ping` and `stream` modes below
 * and stated in docs/ring.md, "Over a WAN".
 *
 *   tool-wan-proxy [proxy] (--to HOST:PORT | --to-file FILE) [--listen HOST:PORT]
 *           [--port-file FILE] [--profile none|lan|wan|phone] [--delay-ms X] [--jitter-ms X]
 *           [--rate BYTES_PER_S] [--burst BYTES] [--loss P] [--loss-every N] [--rto-min-ms X]
 *           [--queue-max BYTES] [--max-conns N] [--dial-timeout-ms N] [--seed N]
 *       Listens (default 127.0.0.1:0; the port goes to --port-file, written whole by a
 *       rename), and for each connection dials the target and forwards both ways, each
 *       direction through the link model of tests/lib/wan_link.h (delay, jitter without
 *       reordering, a token bucket that queues, TCP-like loss). The profile sets every field
 *       (default none: no delay, no limit, no loss); the other options override its fields,
 *       wherever they stand.
 *       --to-file is read at each dial (a port, or HOST:PORT): a target that does not exist
 *       yet (a stage still starting) is dialled again every 100 ms up to --dial-timeout-ms
 *       (default 30000) while the client's bytes wait in the queue. Memory is bounded: at
 *       most --queue-max bytes (default 4 MiB) held per direction (queued or being written),
 *       beyond which the proxy stops reading that side (TCP backpressure to the sender), and
 *       at most --max-conns connections (default 64). Every lost segment is logged on stderr,
 *       every closed connection with its figures. SIGTERM or SIGINT: a clean stop, exit 0.
 *   tool-wan-proxy echo [--listen HOST:PORT] [--port-file FILE]
 *       An echo server (what it reads it writes back), for the two modes below.
 *   tool-wan-proxy ping --to HOST:PORT [--count N] [--size BYTES]
 *       N round trips (default 200) of a message of BYTES (default 64) to an echo server, one
 *       at a time; prints "ping: N round trips of S B: min A ms, median B ms, p99 C ms, max D ms".
 *   tool-wan-proxy stream --to HOST:PORT [--bytes N]
 *       Sends N bytes (default 64 MiB) of a position-dependent pattern to an echo server while
 *       reading the echo, and checks every byte came back in order; prints "stream: N B echoed
 *       in order in T s: R MB/s each way". Exits 1 on a wrong byte (its offset, what came,
 *       what was sent) or a short echo.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>
#include <uv.h>

#include "tests/lib/wan_link.h"
#include "util/util.h"

#define READ_MAX (64 * 1024)   /* one read: one segment of the link model */
#define DIAL_RETRY_MS 100

/* ------------------------------------------------------------------ options */

struct opts {
    const char *listen, *to, *to_file, *port_file;
    struct wan_params p;
    size_t queue_max;
    unsigned max_conns;
    uint64_t dial_timeout_ms, seed, count, size, bytes;
};

/* HOST:PORT (IPv4 or [IPv6]) into *ss: 0 or -EINVAL. */
static int addr_parse(const char *s, struct sockaddr_storage *ss)
{
    char host[64];
    const char *colon = strrchr(s, ':');
    uint64_t port;
    if (!colon || (size_t)(colon - s) >= sizeof host ||
        util_parse_u64(colon + 1, 0, 65535, 0, &port, NULL, 0) < 0)
        return -EINVAL;
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = 0;
    if (host[0] == '[' && colon > s + 1 && colon[-1] == ']') {
        host[colon - s - 1] = 0;
        return uv_ip6_addr(host + 1, (int)port, (struct sockaddr_in6 *)ss) ? -EINVAL : 0;
    }
    return uv_ip4_addr(host, (int)port, (struct sockaddr_in *)ss) ? -EINVAL : 0;
}

/* The target: --to, or what --to-file holds now (a port means 127.0.0.1:PORT): 0, or
 * -ENOENT while the file is missing, empty or not an address yet. */
static int target_get(const struct opts *o, struct sockaddr_storage *ss)
{
    if (o->to)
        return addr_parse(o->to, ss);
    char *buf;
    size_t len;
    if (util_file_read(o->to_file, 256, &buf, &len, NULL, 0) < 0)
        return -ENOENT;
    buf[strcspn(buf, " \t\r\n")] = 0;
    char a[300];
    snprintf(a, sizeof a, "%s%s", strchr(buf, ':') ? "" : "127.0.0.1:", buf);
    free(buf);
    return addr_parse(a, ss) < 0 ? -ENOENT : 0;
}

/* ------------------------------------------------------------------ the proxy */

struct pair;

/* One segment on its way: the bytes of one read (or the end of the stream), and when the far
 * end gets them. The write request is embedded, so the segment lives until its write ends. */
struct seg {
    uv_write_t req;
    struct dirq *q;
    struct seg *next;
    uint64_t due;
    size_t len;
    bool eof;
    char data[];
};

/* One direction of a connection: reads s[from], writes s[1 - from]. */
struct dirq {
    struct pair *pr;
    int from;
    const char *name;
    struct wan_dir m;
    struct seg *head, *tail;
    size_t queued;    /* bytes waiting for their time */
    size_t writing;   /* bytes handed to uv_write, not yet written */
    size_t held_max;  /* the most queued + writing at once */
    int tfd;          /* timerfd for the head's time (microsecond delays need more than uv_timer) */
    uv_poll_t poll;
    bool reading, eof_in, eof_out;
};

struct pair {
    unsigned id;
    struct pair *prev, *next;
    uv_tcp_t *s[2];   /* 0: the accepted client, 1: the target; freed in their close callbacks */
    bool connected, closing;
    struct dirq d[2]; /* 0: client -> target, 1: target -> client */
    uv_connect_t conn;
    uv_timer_t retry;
    uint64_t dial_start;
    int handles;      /* open handles: the pair is freed when the last has closed */
};

static struct opts O;
static uv_loop_t *loop;
static uv_tcp_t listener;
static uv_signal_t sig_term, sig_int;
static struct pair *pairs;
static unsigned n_pairs, next_id;
static bool stopping;

static void pair_close(struct pair *pr, const char *why);
static void dir_read(struct dirq *q);

static void pair_unref(struct pair *pr)
{
    if (--pr->handles > 0)
        return;
    for (int i = 0; i < 2; i++) {
        struct dirq *q = &pr->d[i];
        while (q->head) {
            struct seg *s = q->head;
            q->head = s->next;
            free(s);
        }
        if (q->tfd >= 0)
            close(q->tfd);
    }
    if (pr->prev)
        pr->prev->next = pr->next;
    else
        pairs = pr->next;
    if (pr->next)
        pr->next->prev = pr->prev;
    n_pairs--;
    free(pr);
}

static void on_timer_closed(uv_handle_t *h) { pair_unref(h->data); }

static void on_poll_closed(uv_handle_t *h) { pair_unref(((struct dirq *)h->data)->pr); }

static void on_tcp_closed(uv_handle_t *h)
{
    struct pair *pr = ((struct dirq *)h->data)->pr;
    free(h);
    pair_unref(pr);
}

static void dir_stats(const struct dirq *q, char *buf, size_t n)
{
    snprintf(buf, n, "%s %llu B in %llu segments, %llu lost, at most %zu B held", q->name,
             (unsigned long long)q->m.bytes, (unsigned long long)q->m.segments,
             (unsigned long long)q->m.lost, q->held_max);
}

static void pair_close(struct pair *pr, const char *why)
{
    if (pr->closing)
        return;
    pr->closing = true;
    char a[160], b[160];
    dir_stats(&pr->d[0], a, sizeof a);
    dir_stats(&pr->d[1], b, sizeof b);
    fprintf(stderr, "conn %u closed (%s): %s; %s\n", pr->id, why, a, b);
    for (int i = 0; i < 2; i++) {
        if (pr->s[i])
            uv_close((uv_handle_t *)pr->s[i], on_tcp_closed);
        uv_close((uv_handle_t *)&pr->d[i].poll, on_poll_closed);
    }
    uv_close((uv_handle_t *)&pr->retry, on_timer_closed);
}

/* Read again once what this direction holds has drained to half the cap. */
static void dir_resume(struct dirq *q)
{
    if (!q->reading && !q->eof_in && !q->pr->closing && q->queued + q->writing <= O.queue_max / 2)
        dir_read(q);
}

static void on_written(uv_write_t *req, int status)
{
    struct seg *s = (struct seg *)req;
    struct dirq *q = s->q;
    q->writing -= s->len;
    free(s);
    if (status < 0)
        pair_close(q->pr, uv_strerror(status));
    else
        dir_resume(q);
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
    struct dirq *q = req->data;
    free(req);
    q->eof_out = true;
    if (status < 0)
        pair_close(q->pr, uv_strerror(status));
    else if (q->pr->d[0].eof_out && q->pr->d[1].eof_out)
        pair_close(q->pr, "both ends closed");
}

/* Hand over every segment whose time has come, in order; arm the timer for the next. */
static void dir_flush(struct dirq *q)
{
    struct pair *pr = q->pr;
    if (!pr->connected || pr->closing)
        return;
    uv_stream_t *to = (uv_stream_t *)pr->s[1 - q->from];
    uint64_t now = uv_hrtime();
    while (q->head && q->head->due <= now) {
        struct seg *s = q->head;
        q->head = s->next;
        if (!q->head)
            q->tail = NULL;
        if (s->eof) {
            free(s);
            uv_shutdown_t *req = malloc(sizeof *req);
            if (!req || (req->data = q, uv_shutdown(req, to, on_shutdown) < 0)) {
                free(req);
                pair_close(pr, "shutdown failed");
                return;
            }
            continue;
        }
        q->queued -= s->len;
        q->writing += s->len;
        uv_buf_t b = uv_buf_init(s->data, (unsigned)s->len);
        int rc = uv_write(&s->req, to, &b, 1, on_written);
        if (rc < 0) {
            q->writing -= s->len;
            free(s);
            pair_close(pr, uv_strerror(rc));
            return;
        }
    }
    if (q->head) {
        struct itimerspec its = {.it_value = {.tv_sec = (time_t)(q->head->due / 1000000000ull),
                                              .tv_nsec = (long)(q->head->due % 1000000000ull)}};
        timerfd_settime(q->tfd, TFD_TIMER_ABSTIME, &its, NULL);
    }
    dir_resume(q);
}

static void on_tick(uv_poll_t *p, int status, int events)
{
    struct dirq *q = p->data;
    uint64_t n;
    if (read(q->tfd, &n, sizeof n) < 0 && errno != EAGAIN)
        return;
    dir_flush(q);
}

static void dir_enqueue(struct dirq *q, struct seg *s)
{
    uint64_t now = uv_hrtime();
    if (s->eof) {
        s->due = q->m.last_ns > now ? q->m.last_ns : now;
    } else {
        bool lost = false;
        s->due = wan_dir_schedule(&q->m, now, s->len, &lost);
        if (lost)
            fprintf(stderr, "conn %u %s: segment %llu lost (%zu B): the stream stalls %.0f ms\n",
                    q->pr->id, q->name, (unsigned long long)q->m.segments, s->len, wan_rto_ms(&q->m.p));
        q->queued += s->len;
        if (q->queued + q->writing > q->held_max)
            q->held_max = q->queued + q->writing;
    }
    s->q = q;
    s->next = NULL;
    if (q->tail)
        q->tail->next = s;
    else
        q->head = s;
    q->tail = s;
    if (q->reading && (s->eof || q->queued + q->writing > O.queue_max)) {
        uv_read_stop((uv_stream_t *)q->pr->s[q->from]);
        q->reading = false;
    }
    dir_flush(q);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct seg *s = malloc(sizeof *s + READ_MAX);
    *buf = uv_buf_init(s ? s->data : NULL, s ? READ_MAX : 0);
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    struct dirq *q = st->data;
    struct seg *s = buf->base ? (struct seg *)(buf->base - offsetof(struct seg, data)) : NULL;
    if (nread <= 0) {
        if (nread == UV_EOF && s) {   /* the end of the stream travels in order too */
            s->eof = true;
            s->len = 0;
            q->eof_in = true;
            dir_enqueue(q, s);
            return;
        }
        free(s);
        if (nread < 0)
            pair_close(q->pr, nread == UV_ENOBUFS ? "out of memory" : uv_strerror((int)nread));
        return;
    }
    struct seg *t = realloc(s, sizeof *s + (size_t)nread);   /* keep only what was read */
    s = t ? t : s;
    s->eof = false;
    s->len = (size_t)nread;
    dir_enqueue(q, s);
}

static void dir_read(struct dirq *q)
{
    q->reading = true;
    uv_read_start((uv_stream_t *)q->pr->s[q->from], on_alloc, on_read);
}

static void dial(struct pair *pr);

static void on_retry(uv_timer_t *t) { dial(t->data); }

static void dial_failed(struct pair *pr, const char *why)
{
    if ((uv_hrtime() - pr->dial_start) / 1000000 >= O.dial_timeout_ms) {
        char m[200];
        snprintf(m, sizeof m, "target not reached in %llu ms: %s", (unsigned long long)O.dial_timeout_ms, why);
        pair_close(pr, m);
        return;
    }
    uv_timer_start(&pr->retry, on_retry, DIAL_RETRY_MS, 0);
}

static void on_connect(uv_connect_t *c, int status)
{
    struct pair *pr = c->data;
    if (pr->closing)
        return;
    if (status < 0) {
        uv_close((uv_handle_t *)pr->s[1], on_tcp_closed);
        pr->s[1] = NULL;
        dial_failed(pr, uv_strerror(status));
        return;
    }
    pr->connected = true;
    uv_tcp_nodelay(pr->s[1], 1);
    dir_read(&pr->d[1]);
    dir_flush(&pr->d[0]);
}

static void dial(struct pair *pr)
{
    struct sockaddr_storage ss;
    if (pr->closing)
        return;
    if (target_get(&O, &ss) < 0) {
        dial_failed(pr, "no target address yet");
        return;
    }
    uv_tcp_t *t = malloc(sizeof *t);
    if (!t) {
        pair_close(pr, "out of memory");
        return;
    }
    uv_tcp_init(loop, t);
    t->data = &pr->d[1];
    pr->s[1] = t;
    pr->handles++;
    pr->conn.data = pr;
    int rc = uv_tcp_connect(&pr->conn, t, (struct sockaddr *)&ss, on_connect);
    if (rc < 0) {
        uv_close((uv_handle_t *)t, on_tcp_closed);
        pr->s[1] = NULL;
        dial_failed(pr, uv_strerror(rc));
    }
}

static void on_accept(uv_stream_t *ls, int status)
{
    if (status < 0)
        return;
    uv_tcp_t *c = malloc(sizeof *c);
    if (!c)
        return;
    uv_tcp_init(loop, c);
    if (uv_accept(ls, (uv_stream_t *)c) < 0 || n_pairs >= O.max_conns || stopping) {
        if (n_pairs >= O.max_conns)
            fprintf(stderr, "refused a connection: %u open (--max-conns)\n", n_pairs);
        uv_close((uv_handle_t *)c, (uv_close_cb)free);
        return;
    }
    struct pair *pr = calloc(1, sizeof *pr);
    if (!pr) {
        uv_close((uv_handle_t *)c, (uv_close_cb)free);
        return;
    }
    pr->id = ++next_id;
    pr->next = pairs;
    if (pairs)
        pairs->prev = pr;
    pairs = pr;
    n_pairs++;
    pr->s[0] = c;
    pr->handles = 1;
    c->data = &pr->d[0];
    uv_tcp_nodelay(c, 1);
    uv_timer_init(loop, &pr->retry);
    pr->retry.data = pr;
    pr->handles++;
    for (int i = 0; i < 2; i++) {
        struct dirq *q = &pr->d[i];
        q->pr = pr;
        q->from = i;
        q->name = i ? "target->client" : "client->target";
        /* each direction its own random stream, the same ones for a seed */
        wan_dir_init(&q->m, &O.p, O.seed * 1000003u + pr->id * 2u + (unsigned)i);
        q->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    }
    for (int i = 0; i < 2; i++) {
        struct dirq *q = &pr->d[i];
        if (pr->d[0].tfd < 0 || pr->d[1].tfd < 0 || uv_poll_init(loop, &q->poll, q->tfd) < 0) {
            /* the handles made so far close; the pair goes with the last */
            pr->closing = true;
            fprintf(stderr, "conn %u: no timer: %s\n", pr->id, strerror(errno));
            uv_close((uv_handle_t *)c, on_tcp_closed);
            uv_close((uv_handle_t *)&pr->retry, on_timer_closed);
            if (i == 1)
                uv_close((uv_handle_t *)&pr->d[0].poll, on_poll_closed);
            return;
        }
        q->poll.data = q;
        pr->handles++;
        uv_poll_start(&q->poll, UV_READABLE, on_tick);
    }
    dir_read(&pr->d[0]);
    pr->dial_start = uv_hrtime();
    dial(pr);
}

static void on_stop(uv_signal_t *s, int signum)
{
    stopping = true;
    uv_close((uv_handle_t *)&listener, NULL);
    for (struct pair *pr = pairs; pr; pr = pr->next)
        pair_close(pr, "stopping");
    uv_close((uv_handle_t *)&sig_term, NULL);
    uv_close((uv_handle_t *)&sig_int, NULL);
}

/* Bind and listen on o->listen; the port goes to stderr and, whole, to o->port_file. */
static int listen_on(uv_tcp_t *ls, uv_connection_cb cb)
{
    struct sockaddr_storage ss;
    int len = sizeof ss, rc;
    if (addr_parse(O.listen, &ss) < 0) {
        fprintf(stderr, "tool-wan-proxy: --listen '%s': expected HOST:PORT\n", O.listen);
        return -EINVAL;
    }
    uv_tcp_init(loop, ls);
    if ((rc = uv_tcp_bind(ls, (struct sockaddr *)&ss, 0)) < 0 || (rc = uv_listen((uv_stream_t *)ls, 128, cb)) < 0 ||
        (rc = uv_tcp_getsockname(ls, (struct sockaddr *)&ss, &len)) < 0) {
        fprintf(stderr, "tool-wan-proxy: listen on %s: %s\n", O.listen, uv_strerror(rc));
        return rc;
    }
    int port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                              : ((struct sockaddr_in *)&ss)->sin_port);
    if (O.port_file) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", O.port_file);
        FILE *f = fopen(tmp, "w");
        if (!f || fprintf(f, "%d\n", port) < 0 || fclose(f) != 0 || rename(tmp, O.port_file) < 0) {
            fprintf(stderr, "tool-wan-proxy: writing %s: %s\n", O.port_file, strerror(errno));
            return -errno;
        }
    }
    return port;
}

static int run_proxy(void)
{
    int port = listen_on(&listener, on_accept);
    if (port < 0)
        return 1;
    const struct wan_params *p = &O.p;
    fprintf(stderr, "listening on port %d, forwarding to %s%s: delay %.3f ms, jitter %.3f ms, rate %.0f B/s "
            "(burst %.0f B), loss %g%s, RTO %.0f ms, queue cap %zu B a direction\n",
            port, O.to ? O.to : "the address in ", O.to ? "" : O.to_file, p->delay_ms, p->jitter_ms, p->rate,
            p->burst, p->loss, p->loss_every ? " (and every Nth segment)" : "", wan_rto_ms(p), O.queue_max);
    uv_signal_init(loop, &sig_term);
    uv_signal_init(loop, &sig_int);
    uv_signal_start(&sig_term, on_stop, SIGTERM);
    uv_signal_start(&sig_int, on_stop, SIGINT);
    uv_run(loop, UV_RUN_DEFAULT);
    return uv_loop_close(loop) == 0 ? 0 : 1;
}

/* ------------------------------------------------------------------ echo server */

/* One echo connection: what it reads goes back; reading pauses while more than 4 MiB wait to
 * be written and resumes below 1 MiB. */
struct echo_conn {
    uv_tcp_t tcp;
    bool reading;
};

struct echo_wr {
    uv_write_t req;
    char *base;
};

static void echo_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    char *b = malloc(READ_MAX);
    *buf = uv_buf_init(b, b ? READ_MAX : 0);
}

static void echo_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);

static void echo_written(uv_write_t *req, int status)
{
    struct echo_wr *w = (struct echo_wr *)req;
    struct echo_conn *c = (struct echo_conn *)req->handle;
    free(w->base);
    free(w);
    if (status == 0 && !c->reading && !uv_is_closing((uv_handle_t *)c) &&
        uv_stream_get_write_queue_size((uv_stream_t *)c) < 1u << 20) {
        c->reading = true;
        uv_read_start((uv_stream_t *)c, echo_alloc, echo_read);
    }
}

static void echo_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    struct echo_conn *c = (struct echo_conn *)st;
    if (nread <= 0) {
        free(buf->base);
        if (nread < 0 && !uv_is_closing((uv_handle_t *)st))
            uv_close((uv_handle_t *)st, (uv_close_cb)free);
        return;
    }
    struct echo_wr *w = malloc(sizeof *w);
    uv_buf_t b = uv_buf_init(buf->base, (unsigned)nread);
    if (w)
        w->base = buf->base;
    if (!w || uv_write(&w->req, st, &b, 1, echo_written) < 0) {
        free(w);
        free(buf->base);
        uv_close((uv_handle_t *)st, (uv_close_cb)free);
        return;
    }
    if (uv_stream_get_write_queue_size(st) > 4u << 20) {
        uv_read_stop(st);
        c->reading = false;
    }
}

static void echo_accept(uv_stream_t *ls, int status)
{
    struct echo_conn *c = malloc(sizeof *c);
    if (status < 0 || !c) {
        free(c);
        return;
    }
    uv_tcp_init(loop, &c->tcp);
    if (uv_accept(ls, (uv_stream_t *)c) < 0) {
        uv_close((uv_handle_t *)c, (uv_close_cb)free);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    c->reading = true;
    uv_read_start((uv_stream_t *)c, echo_alloc, echo_read);
}

static int run_echo(void)
{
    int port = listen_on(&listener, echo_accept);
    if (port < 0)
        return 1;
    fprintf(stderr, "echo server on port %d\n", port);
    uv_run(loop, UV_RUN_DEFAULT);
    return 0;
}

/* ------------------------------------------------------------------ clients */

static int dial_blocking(const char *to)
{
    struct sockaddr_storage ss;
    if (addr_parse(to, &ss) < 0) {
        fprintf(stderr, "tool-wan-proxy: --to '%s': expected HOST:PORT\n", to);
        return -1;
    }
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    socklen_t len = ss.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    if (fd < 0 || connect(fd, (struct sockaddr *)&ss, len) < 0) {
        fprintf(stderr, "tool-wan-proxy: connect %s: %s\n", to, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int run_ping(void)
{
    int fd = dial_blocking(O.to);
    char *msg = malloc(O.size), *back = malloc(O.size);
    double *rtt = malloc(O.count * sizeof *rtt);
    int rc = 1;
    if (fd < 0 || !msg || !back || !rtt)
        goto out;
    memset(msg, 'k', O.size);
    for (uint64_t i = 0; i < O.count; i++) {
        double t0 = util_now_ms();
        for (size_t off = 0; off < O.size;) {
            ssize_t n = write(fd, msg + off, O.size - off);
            if (n <= 0) {
                fprintf(stderr, "ping: write: %s\n", strerror(errno));
                goto out;
            }
            off += (size_t)n;
        }
        for (size_t off = 0; off < O.size;) {
            ssize_t n = read(fd, back + off, O.size - off);
            if (n <= 0) {
                fprintf(stderr, "ping: the echo ended after %llu round trips\n", (unsigned long long)i);
                goto out;
            }
            off += (size_t)n;
        }
        rtt[i] = util_now_ms() - t0;
    }
    qsort(rtt, O.count, sizeof *rtt, cmp_double);
    printf("ping: %llu round trips of %llu B: min %.3f ms, median %.3f ms, p99 %.3f ms, max %.3f ms\n",
           (unsigned long long)O.count, (unsigned long long)O.size, rtt[0], rtt[O.count / 2],
           rtt[(O.count * 99) / 100 < O.count ? (O.count * 99) / 100 : O.count - 1], rtt[O.count - 1]);
    rc = 0;
out:
    if (fd >= 0)
        close(fd);
    free(msg);
    free(back);
    free(rtt);
    return rc;
}

/* The stream's bytes: a pseudo-random table repeated with a period of PATTERN_LEN, an odd
 * length that no read or write size divides, so bytes moved, doubled or dropped anywhere in
 * the stream show (compared with memcmp, so the client is not what limits the figure). */
#define PATTERN_LEN (1024 * 1024 + 7)
static uint8_t pattern_tab[PATTERN_LEN + READ_MAX];

static void pattern_init(void)
{
    uint64_t z = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < sizeof pattern_tab; i++) {
        size_t k = i % PATTERN_LEN;
        if (k != i) {   /* the tail repeats the head, so a slice never wraps */
            pattern_tab[i] = pattern_tab[k];
            continue;
        }
        z ^= z << 13, z ^= z >> 7, z ^= z << 17;
        pattern_tab[i] = (uint8_t)(z >> 24);
    }
}

/* the pattern's bytes from stream offset off */
static const uint8_t *pattern_at(uint64_t off) { return pattern_tab + off % PATTERN_LEN; }

static int run_stream(void)
{
    int fd = dial_blocking(O.to);
    if (fd < 0)
        return 1;
    static uint8_t in[READ_MAX];
    uint64_t sent = 0, got = 0;
    pattern_init();
    double t0 = util_now_s();
    while (got < O.bytes) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN | (sent < O.bytes ? POLLOUT : 0)};
        if (poll(&pfd, 1, 60000) <= 0) {
            fprintf(stderr, "stream: nothing moved for 60 s (%llu B sent, %llu B back)\n",
                    (unsigned long long)sent, (unsigned long long)got);
            close(fd);
            return 1;
        }
        if ((pfd.revents & POLLOUT) && sent < O.bytes) {
            size_t n = O.bytes - sent < READ_MAX ? (size_t)(O.bytes - sent) : READ_MAX;
            ssize_t w = send(fd, pattern_at(sent), n, MSG_DONTWAIT);
            if (w > 0)
                sent += (uint64_t)w;
            else if (w < 0 && errno != EAGAIN) {
                fprintf(stderr, "stream: send: %s\n", strerror(errno));
                close(fd);
                return 1;
            }
        }
        if (pfd.revents & (POLLIN | POLLHUP | POLLERR)) {
            ssize_t r = recv(fd, in, sizeof in, MSG_DONTWAIT);
            if (r == 0 || (r < 0 && errno != EAGAIN)) {
                fprintf(stderr, "stream: the echo ended after %llu of %llu B\n", (unsigned long long)got,
                        (unsigned long long)O.bytes);
                close(fd);
                return 1;
            }
            if (r > 0 && memcmp(in, pattern_at(got), (size_t)r) != 0) {
                ssize_t k = 0;
                while (in[k] == pattern_at(got)[k])
                    k++;
                fprintf(stderr, "stream: byte %llu is 0x%02x, expected 0x%02x (out of order)\n",
                        (unsigned long long)(got + (uint64_t)k), in[k], pattern_at(got)[k]);
                close(fd);
                return 1;
            }
            if (r > 0)
                got += (uint64_t)r;
        }
    }
    double dt = util_now_s() - t0;
    close(fd);
    printf("stream: %llu B echoed in order in %.3f s: %.1f MB/s each way\n", (unsigned long long)O.bytes, dt,
           dt > 0 ? (double)O.bytes / dt / 1e6 : 0.0);
    return 0;
}

/* ------------------------------------------------------------------ main */

static void usage(FILE *f)
{
    fprintf(f, "usage: tool-wan-proxy [proxy] (--to HOST:PORT | --to-file FILE) [--listen HOST:PORT]\n"
               "         [--port-file FILE] [--profile none|lan|wan|phone] [--delay-ms X] [--jitter-ms X]\n"
               "         [--rate BYTES_PER_S] [--burst BYTES] [--loss P] [--loss-every N] [--rto-min-ms X]\n"
               "         [--queue-max BYTES] [--max-conns N] [--dial-timeout-ms N] [--seed N]\n"
               "       tool-wan-proxy echo [--listen HOST:PORT] [--port-file FILE]\n"
               "       tool-wan-proxy ping --to HOST:PORT [--count N] [--size BYTES]\n"
               "       tool-wan-proxy stream --to HOST:PORT [--bytes N]\n"
               "profiles (one-way, each direction):\n");
    for (size_t i = 0; i < sizeof wan_profiles / sizeof wan_profiles[0]; i++)
        fprintf(f, "  %-6s %s\n", wan_profiles[i].name, wan_profiles[i].what);
}

int main(int argc, char **argv)
{
    const char *mode = "proxy";
    int i = 1;
    if (argc > 1 && argv[1][0] != '-')
        mode = argv[i++];
    if (util_args_split_eq(&argc, &argv) < 0)
        return 2;
    O = (struct opts){.listen = "127.0.0.1:0", .queue_max = 4u << 20, .max_conns = 64,
                      .dial_timeout_ms = 30000, .seed = 1, .count = 200, .size = 64, .bytes = 64u << 20};
    wan_profile_get("none", &O.p);
    /* the profile first, wherever it stands, so that every other option overrides its field */
    const char *profile = NULL;
    for (int k = i; k + 1 < argc; k++)
        if (!strcmp(argv[k], "--profile")) {
            if (profile) {
                fprintf(stderr, "tool-wan-proxy: --profile given twice\n");
                return 2;
            }
            profile = argv[k + 1];
        }
    if (profile && wan_profile_get(profile, &O.p) < 0) {
        fprintf(stderr, "tool-wan-proxy: --profile '%s': not one of none, lan, wan, phone\n", profile);
        return 2;
    }
    for (; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char err[200] = "";
        int rc = 0;
        uint64_t u;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!v) {
            fprintf(stderr, "tool-wan-proxy: %s needs a value (or is unknown)\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--listen"))
            O.listen = v;
        else if (!strcmp(a, "--to"))
            O.to = v;
        else if (!strcmp(a, "--to-file"))
            O.to_file = v;
        else if (!strcmp(a, "--port-file"))
            O.port_file = v;
        else if (!strcmp(a, "--profile"))
            ;   /* applied above */
        else if (!strcmp(a, "--delay-ms"))
            rc = util_parse_double(v, 0, 60000, 0, &O.p.delay_ms, err, sizeof err);
        else if (!strcmp(a, "--jitter-ms"))
            rc = util_parse_double(v, 0, 60000, 0, &O.p.jitter_ms, err, sizeof err);
        else if (!strcmp(a, "--rate"))
            rc = util_parse_double(v, 0, 1e12, UTIL_PARSE_SUFFIX, &O.p.rate, err, sizeof err);
        else if (!strcmp(a, "--burst"))
            rc = util_parse_double(v, WAN_MSS, 1 << 30, UTIL_PARSE_SUFFIX, &O.p.burst, err, sizeof err);
        else if (!strcmp(a, "--loss"))
            rc = util_parse_double(v, 0, 0.5, 0, &O.p.loss, err, sizeof err);
        else if (!strcmp(a, "--loss-every"))
            rc = util_parse_u64(v, 0, UINT32_MAX, 0, &O.p.loss_every, err, sizeof err);
        else if (!strcmp(a, "--rto-min-ms"))
            rc = util_parse_double(v, 0, 60000, 0, &O.p.rto_min_ms, err, sizeof err);
        else if (!strcmp(a, "--queue-max")) {
            rc = util_parse_u64(v, READ_MAX, 1ull << 30, UTIL_PARSE_SUFFIX, &u, err, sizeof err);
            O.queue_max = (size_t)u;
        } else if (!strcmp(a, "--max-conns")) {
            rc = util_parse_u64(v, 1, 4096, 0, &u, err, sizeof err);
            O.max_conns = (unsigned)u;
        } else if (!strcmp(a, "--dial-timeout-ms"))
            rc = util_parse_u64(v, 0, 3600000, 0, &O.dial_timeout_ms, err, sizeof err);
        else if (!strcmp(a, "--seed"))
            rc = util_parse_u64(v, 0, UINT64_MAX, 0, &O.seed, err, sizeof err);
        else if (!strcmp(a, "--count"))
            rc = util_parse_u64(v, 1, 1000000, 0, &O.count, err, sizeof err);
        else if (!strcmp(a, "--size"))
            rc = util_parse_u64(v, 1, 16u << 20, UTIL_PARSE_SUFFIX, &O.size, err, sizeof err);
        else if (!strcmp(a, "--bytes"))
            rc = util_parse_u64(v, 1, 1ull << 40, UTIL_PARSE_SUFFIX, &O.bytes, err, sizeof err);
        else {
            fprintf(stderr, "tool-wan-proxy: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (rc < 0) {
            fprintf(stderr, "tool-wan-proxy: %s: %s\n", a, err);
            return 2;
        }
    }
    if (O.p.burst < WAN_MSS)
        O.p.burst = WAN_MSS;
    signal(SIGPIPE, SIG_IGN);
    loop = uv_default_loop();
    if (!strcmp(mode, "proxy")) {
        if (!O.to == !O.to_file) {
            fprintf(stderr, "tool-wan-proxy: give one of --to HOST:PORT and --to-file FILE\n");
            return 2;
        }
        return run_proxy();
    }
    if (!strcmp(mode, "echo"))
        return run_echo();
    if (!strcmp(mode, "ping") || !strcmp(mode, "stream")) {
        if (!O.to) {
            fprintf(stderr, "tool-wan-proxy %s: --to HOST:PORT is required\n", mode);
            return 2;
        }
        return !strcmp(mode, "ping") ? run_ping() : run_stream();
    }
    fprintf(stderr, "tool-wan-proxy: unknown mode '%s'\n", mode);
    usage(stderr);
    return 2;
}

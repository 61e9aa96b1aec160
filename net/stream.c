/* stream.c — byte streams over a pluggable transport, the built-in TCP transport and the TCP
 * listener. Streams are closed through their transport and freed only after the transport
 * reports every handle closed (libuv close callbacks). The ring's framed, sealed links run on
 * top (ring/link.c). */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net/internal.h"
#include "net/net.h"
#include "util/err.h"

struct net_stream {
    uv_loop_t *loop;
    const struct net_transport *ops;
    void *tp;
    struct net_stream_cbs cbs;
    void *ud;
    char peer[96];
    char reason[KV_ERR_MAX];   /* whole: a TLS failure names the certificate and the fix */
    bool closing, opened;
    uint64_t bytes_in, bytes_out;
    size_t queued;
};

/* ---- transport registry ---- */

#define MAX_TRANSPORTS 8
extern const struct net_transport net__tcp_transport;
static const struct net_transport *transports[MAX_TRANSPORTS] = {&net__tcp_transport};

int net_transport_register(const struct net_transport *t)
{
    for (int i = 0; i < MAX_TRANSPORTS; i++) {
        if (transports[i] && !strcmp(transports[i]->scheme, t->scheme))
            return -EEXIST;
        if (!transports[i]) {
            transports[i] = t;
            return 0;
        }
    }
    return -ENOSPC;
}

static const struct net_transport *transport_find(const char *endpoint, const char **rest)
{
    const char *sep = strstr(endpoint, "://");
    if (!sep)
        return NULL;
    size_t n = (size_t)(sep - endpoint);
    for (int i = 0; i < MAX_TRANSPORTS && transports[i]; i++)
        if (strlen(transports[i]->scheme) == n && !strncmp(transports[i]->scheme, endpoint, n)) {
            *rest = sep + 3;
            return transports[i];
        }
    return NULL;
}

static struct net_stream *stream_new(uv_loop_t *loop, const struct net_transport *ops,
                                     const struct net_stream_cbs *cbs, void *ud)
{
    struct net_stream *l = calloc(1, sizeof *l);
    if (!l)
        return NULL;
    l->loop = loop;
    l->ops = ops;
    l->cbs = *cbs;
    l->ud = ud;
    snprintf(l->peer, sizeof l->peer, "?");
    return l;
}

int net_stream_dial(struct net_stream **out, uv_loop_t *loop, const char *endpoint,
                    const struct net_stream_cbs *cbs, void *ud, char *err, size_t errlen)
{
    const char *rest;
    const struct net_transport *ops = transport_find(endpoint, &rest);
    if (!ops) {
        snprintf(err, errlen, "endpoint %s: no transport for its scheme", endpoint);
        return -EPROTONOSUPPORT;
    }
    struct net_stream *l = stream_new(loop, ops, cbs, ud);
    if (!l) {
        snprintf(err, errlen, "endpoint %s: out of memory", endpoint);
        return -ENOMEM;
    }
    snprintf(l->peer, sizeof l->peer, "%s", rest);
    int rc = ops->dial(l, loop, rest, err, errlen);
    if (rc < 0) {
        free(l);
        return rc;
    }
    *out = l;
    return 0;
}

int net_stream_write(struct net_stream *l, void *buf, size_t len)
{
    if (l->closing || !l->opened) {
        free(buf);
        return l->closing ? -EPIPE : -ENOTCONN;
    }
    /* counted before the write: a transport may report it written before write returns */
    l->queued += len;
    int rc = l->ops->write(l, uv_buf_init(buf, (unsigned)len));
    if (rc < 0) {
        l->queued = len <= l->queued ? l->queued - len : 0;
        return rc;
    }
    l->bytes_out += len;
    return 0;
}

int net_stream_send(struct net_stream *l, const void *data, size_t len)
{
    if (l->closing)
        return -EPIPE;
    if (!l->opened)
        return -ENOTCONN;
    char *b = malloc(len ? len : 1);
    if (!b)
        return -ENOMEM;
    memcpy(b, data, len);
    return net_stream_write(l, b, len);
}

void net_stream_close(struct net_stream *l, const char *reason)
{
    if (l->closing)
        return;
    l->closing = true;
    snprintf(l->reason, sizeof l->reason, "%s", reason ? reason : "closed");
    l->ops->close(l);
}

void *net_stream_ud(const struct net_stream *l) { return l->ud; }
void net_stream_set_ud(struct net_stream *l, void *ud) { l->ud = ud; }
const char *net_stream_peer(const struct net_stream *l) { return l->peer; }
bool net_stream_is_closing(const struct net_stream *l) { return l->closing; }
uint64_t net_stream_bytes_in(const struct net_stream *l) { return l->bytes_in; }
uint64_t net_stream_bytes_out(const struct net_stream *l) { return l->bytes_out; }
size_t net_stream_queued(const struct net_stream *l) { return l->queued; }

void net_stream_tp_set(struct net_stream *l, void *tp) { l->tp = tp; }
void *net_stream_tp(const struct net_stream *l) { return l->tp; }
void net_stream_tp_set_peer(struct net_stream *l, const char *peer)
{
    snprintf(l->peer, sizeof l->peer, "%s", peer);
}

void net_stream_tp_opened(struct net_stream *l, int status)
{
    if (status == 0)
        l->opened = true;
    if (l->cbs.on_open && !l->closing)
        l->cbs.on_open(l, status);
    if (status < 0 && !l->closing) {
        char r[160];
        snprintf(r, sizeof r, "dial %s failed: %s", l->peer, uv_strerror(status));
        net_stream_close(l, r);
    }
}

void net_stream_tp_failed(struct net_stream *l, int status, const char *reason)
{
    if (l->cbs.on_open && !l->closing)
        l->cbs.on_open(l, status < 0 ? status : -ECONNREFUSED);
    if (!l->closing)
        net_stream_close(l, reason);
}

void net_stream_tp_data(struct net_stream *l, const void *data, size_t len)
{
    if (l->closing)
        return;
    l->bytes_in += len;
    if (l->cbs.on_data)
        l->cbs.on_data(l, data, len);
}

void net_stream_tp_written(struct net_stream *l, size_t len)
{
    l->queued = len <= l->queued ? l->queued - len : 0;
}

void net_stream_tp_error(struct net_stream *l, const char *reason)
{
    net_stream_close(l, reason);
}

void net_stream_tp_closed(struct net_stream *l)
{
    if (l->cbs.on_close)
        l->cbs.on_close(l, l->reason);
    free(l);
}

/* ============================== TCP transport ============================== */

struct tcp_tp {
    uv_tcp_t tcp;
    uv_getaddrinfo_t gai;
    uv_connect_t conn;
    uv_shutdown_t sd;
    struct net_stream *l;
    bool tcp_inited, resolving, close_wanted;
};

struct tcp_wr {
    uv_write_t req;
    uv_buf_t buf;
    struct net_stream *l;
};

static void tcp_alloc(uv_handle_t *h, size_t sug, uv_buf_t *buf)
{
    (void)sug;
    buf->base = malloc(65536);
    buf->len = buf->base ? 65536 : 0;
}

static void tcp_on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    struct tcp_tp *t = s->data;
    if (n > 0)
        net_stream_tp_data(t->l, buf->base, (size_t)n);
    else if (n < 0) {
        char r[128];
        snprintf(r, sizeof r, "%s", n == UV_EOF ? "peer closed the connection" : uv_strerror((int)n));
        net_stream_tp_error(t->l, r);
    }
    free(buf->base);
}

static void tcp_on_closed(uv_handle_t *h)
{
    struct tcp_tp *t = h->data;
    struct net_stream *l = t->l;
    free(t);
    net_stream_tp_closed(l);
}

int net__tcp_peer(const uv_tcp_t *tcp, char *out, size_t n)
{
    struct sockaddr_storage ss;
    int len = sizeof ss;
    int rc = uv_tcp_getpeername(tcp, (struct sockaddr *)&ss, &len);
    if (rc != 0)
        return rc;
    char ip[64] = "?";
    int port = 0;
    if (ss.ss_family == AF_INET) {
        uv_ip4_name((struct sockaddr_in *)&ss, ip, sizeof ip);
        port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
    } else if (ss.ss_family == AF_INET6) {
        uv_ip6_name((struct sockaddr_in6 *)&ss, ip, sizeof ip);
        port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    }
    snprintf(out, n, "%s:%d", ip, port);
    return 0;
}

static void tcp_set_peer(struct tcp_tp *t)
{
    char p[96];
    if (net__tcp_peer(&t->tcp, p, sizeof p) == 0)
        net_stream_tp_set_peer(t->l, p);
}

static void tcp_on_connect(uv_connect_t *req, int status)
{
    struct tcp_tp *t = req->data;
    if (status == 0 && !net_stream_is_closing(t->l)) {
        uv_tcp_nodelay(&t->tcp, 1);
        status = uv_read_start((uv_stream_t *)&t->tcp, tcp_alloc, tcp_on_read);
    }
    if (status != UV_ECANCELED)
        net_stream_tp_opened(t->l, status);
}

static void tcp_on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    struct tcp_tp *t = req->data;
    t->resolving = false;
    if (t->close_wanted) {
        uv_freeaddrinfo(res);
        uv_close((uv_handle_t *)&t->tcp, tcp_on_closed);
        return;
    }
    if (status == 0) {
        t->conn.data = t;
        status = uv_tcp_connect(&t->conn, &t->tcp, res->ai_addr, tcp_on_connect);
    }
    uv_freeaddrinfo(res);
    if (status < 0)
        net_stream_tp_opened(t->l, status);
}

/* Split "host:port" or "[v6]:port". */
static int split_hostport(const char *s, char *host, size_t hn, char *port, size_t pn)
{
    const char *colon;
    if (s[0] == '[') {
        const char *end = strchr(s, ']');
        if (!end || end[1] != ':')
            return -EINVAL;
        if ((size_t)(end - s - 1) >= hn)
            return -ENAMETOOLONG;
        memcpy(host, s + 1, (size_t)(end - s - 1));
        host[end - s - 1] = 0;
        colon = end + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon || (size_t)(colon - s) >= hn)
            return -EINVAL;
        memcpy(host, s, (size_t)(colon - s));
        host[colon - s] = 0;
    }
    if (snprintf(port, pn, "%s", colon + 1) >= (int)pn || !port[0])
        return -EINVAL;
    for (const char *p = port; *p; p++)
        if (*p < '0' || *p > '9')
            return -EINVAL;
    return 0;
}

int net__listen_addr(const char *addr, struct sockaddr_storage *ss, const char **why)
{
    char host[256], port[16];
    *why = " is not host:port";
    if (split_hostport(addr, host, sizeof host, port, sizeof port) < 0)
        return -EINVAL;
    long pn = strtol(port, NULL, 10);
    if (strlen(port) > 5 || pn > 65535) {
        *why = ": port over 65535";
        return -EINVAL;
    }
    int rc = strchr(host, ':') ? uv_ip6_addr(host, (int)pn, (struct sockaddr_in6 *)ss)
                               : uv_ip4_addr(host[0] ? host : "0.0.0.0", (int)pn, (struct sockaddr_in *)ss);
    if (rc == 0)
        return 0;
    /* A host name (a planned manifest's endpoints are often names): resolved once, here, at
     * start; the first address wins. Blocking is fine: listeners are made before serving. */
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    if (getaddrinfo(host, port, &hints, &res) != 0 || !res || res->ai_addrlen > sizeof *ss) {
        if (res)
            freeaddrinfo(res);
        *why = ": the host name does not resolve";
        return -EINVAL;
    }
    memset(ss, 0, sizeof *ss);
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    return 0;
}

int net_listen_fd(const char *addr, int *port)
{
    struct sockaddr_storage ss;
    const char *why;
    if (net__listen_addr(addr, &ss, &why) < 0)
        return -EINVAL;
    socklen_t len = ss.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (fd < 0)
        return -errno;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(fd, (struct sockaddr *)&ss, len) != 0 || listen(fd, 128) != 0 ||
        getsockname(fd, (struct sockaddr *)&ss, &len) != 0) {
        int e = -errno;
        close(fd);
        return e;
    }
    *port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                           : ((struct sockaddr_in *)&ss)->sin_port);
    return fd;
}

bool net_listen_addr_is_loopback(const char *addr)
{
    struct sockaddr_storage ss;
    const char *why;
    if (net__listen_addr(addr, &ss, &why) < 0)
        return false;
    if (ss.ss_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)&ss)->sin_addr.s_addr) >> 24) == 127;
    if (ss.ss_family != AF_INET6)
        return false;
    const struct in6_addr *a = &((const struct sockaddr_in6 *)&ss)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(a))
        return true;
    return IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127;
}

static int tcp_dial(struct net_stream *l, uv_loop_t *loop, const char *rest, char *err,
                    size_t errlen)
{
    char host[256], port[16];
    int rc = split_hostport(rest, host, sizeof host, port, sizeof port);
    if (rc < 0) {
        snprintf(err, errlen, "endpoint tcp://%s: expected HOST:PORT", rest);
        return rc;
    }
    struct tcp_tp *t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(err, errlen, "tcp://%s: out of memory", rest);
        return -ENOMEM;
    }
    t->l = l;
    t->gai.data = t;
    net_stream_tp_set(l, t);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    rc = uv_getaddrinfo(loop, &t->gai, tcp_on_resolved, host, port, &hints);
    if (rc < 0) {
        snprintf(err, errlen, "resolve %s: %s", host, uv_strerror(rc));
        free(t);
        return rc;
    }
    uv_tcp_init(loop, &t->tcp);   /* cannot fail on Unix; closed in tcp_close */
    t->tcp.data = t;
    t->tcp_inited = true;
    t->resolving = true;
    return 0;
}

static void tcp_on_written(uv_write_t *req, int status)
{
    struct tcp_wr *w = (struct tcp_wr *)req;
    net_stream_tp_written(w->l, w->buf.len);
    if (status < 0 && status != UV_ECANCELED)
        net_stream_tp_error(w->l, uv_strerror(status));
    free(w->buf.base);
    free(w);
}

static int tcp_write(struct net_stream *l, uv_buf_t buf)
{
    struct tcp_tp *t = net_stream_tp(l);
    struct tcp_wr *w = malloc(sizeof *w);
    if (!w || !t->tcp_inited) {
        free(w);
        free(buf.base);
        return w ? -ENOTCONN : -ENOMEM;
    }
    w->buf = buf;
    w->l = l;
    int rc = uv_write(&w->req, (uv_stream_t *)&t->tcp, &w->buf, 1, tcp_on_written);
    if (rc < 0) {
        free(buf.base);
        free(w);
    }
    return rc;
}

static void tcp_on_shutdown(uv_shutdown_t *req, int status)
{
    (void)status;
    struct tcp_tp *t = req->data;
    uv_close((uv_handle_t *)&t->tcp, tcp_on_closed);
}

static void tcp_close(struct net_stream *l)
{
    struct tcp_tp *t = net_stream_tp(l);
    if (t->resolving) {
        t->close_wanted = true;   /* finished in tcp_on_resolved */
        uv_cancel((uv_req_t *)&t->gai);
        return;
    }
    uv_read_stop((uv_stream_t *)&t->tcp);
    /* Flush queued frames (an ERROR with the reason) before closing. */
    if (net_stream_queued(l) > 0 && uv_is_writable((uv_stream_t *)&t->tcp)) {
        t->sd.data = t;
        if (uv_shutdown(&t->sd, (uv_stream_t *)&t->tcp, tcp_on_shutdown) == 0)
            return;
    }
    uv_close((uv_handle_t *)&t->tcp, tcp_on_closed);
}

const struct net_transport net__tcp_transport = {
    .scheme = "tcp", .dial = tcp_dial, .write = tcp_write, .close = tcp_close,
};

/* ================================ listener ================================ */

struct net_listener {
    uv_tcp_t tcp;
    struct net_stream_cbs cbs;
    net_accept_cb on_accept;
    void *ud;
    void (*done)(void *ud);      /* net_listener_close's callback */
    void *done_ud;
};

static void ls_on_conn(uv_stream_t *server, int status)
{
    struct net_listener *ls = server->data;
    if (status < 0)
        return;
    struct tcp_tp *t = calloc(1, sizeof *t);
    struct net_stream *l = t ? stream_new(server->loop, &net__tcp_transport, &ls->cbs, NULL)
                             : NULL;
    if (!l || uv_tcp_init(server->loop, &t->tcp) != 0) {
        free(t);
        free(l);
        return;
    }
    t->l = l;
    t->tcp.data = t;
    t->tcp_inited = true;
    net_stream_tp_set(l, t);
    if (uv_accept(server, (uv_stream_t *)&t->tcp) != 0 ||
        uv_read_start((uv_stream_t *)&t->tcp, tcp_alloc, tcp_on_read) != 0) {
        l->closing = true;
        snprintf(l->reason, sizeof l->reason, "accept failed");
        l->cbs.on_close = NULL;
        uv_close((uv_handle_t *)&t->tcp, tcp_on_closed);
        return;
    }
    uv_tcp_nodelay(&t->tcp, 1);
    tcp_set_peer(t);
    l->opened = true;
    ls->on_accept(ls, l, ls->ud);
}

int net_listener_new(struct net_listener **out, uv_loop_t *loop, const char *addr,
                     const struct net_stream_cbs *cbs, net_accept_cb on_accept, void *ud,
                     char *err, size_t errlen)
{
    struct sockaddr_storage ss;
    const char *why;
    int rc = net__listen_addr(addr, &ss, &why);
    if (rc < 0) {
        snprintf(err, errlen, "listen address '%s'%s", addr, why);
        return rc;
    }
    struct net_listener *ls = calloc(1, sizeof *ls);
    if (!ls)
        return -ENOMEM;
    ls->cbs = *cbs;
    ls->on_accept = on_accept;
    ls->ud = ud;
    uv_tcp_init(loop, &ls->tcp);
    ls->tcp.data = ls;
    rc = net__listen_tcp(&ls->tcp, &ss);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&ls->tcp, 16, ls_on_conn);
    if (rc < 0) {
        snprintf(err, errlen, "listen on %s: %s", addr, uv_strerror(rc));
        net_listener_close(ls, NULL, NULL);
        return rc;
    }
    *out = ls;
    return 0;
}

int net_listener_port(const struct net_listener *ls)
{
    struct sockaddr_storage ss;
    int len = sizeof ss;
    if (uv_tcp_getsockname(&ls->tcp, (struct sockaddr *)&ss, &len) != 0)
        return -1;
    if (ss.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
}

static void ls_on_closed(uv_handle_t *h)
{
    struct net_listener *ls = h->data;
    void (*done)(void *) = ls->done;
    void *ud = ls->done_ud;
    free(ls);
    if (done)
        done(ud);
}

void net_listener_close(struct net_listener *ls, void (*done)(void *ud), void *ud)
{
    if (!ls)
        return;
    ls->done = done;
    ls->done_ud = ud;
    uv_close((uv_handle_t *)&ls->tcp, ls_on_closed);
}

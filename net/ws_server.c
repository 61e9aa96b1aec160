/* The WebSocket server: a TCP listener (TLS optional) that reads one HTTP/1.1 request per
 * connection, answers plain GETs through on_get and upgrades valid WebSocket requests whose
 * path the owner accepts. Handshake errors get an HTTP status with a one-line reason:
 * 400 for a missing or malformed Sec-WebSocket-Key, Upgrade or Connection header,
 * 426 (with Sec-WebSocket-Version: 13) for another protocol version, 405 for other methods. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <http_parser.h>

#include "net/ws_internal.h"

#define WS_HANDSHAKE_MS 10000

struct net_ws_server {
    uv_tcp_t listener;
    struct net_tls_ctx *tls;
    struct net_ws_limits lim;
    struct net_ws_server_handlers h;
    void *ud;
    struct net_ws *conns;
    size_t n_conns;
    bool closing, listener_closed;
    int port;
};

static void server_maybe_free(struct net_ws_server *srv)
{
    if (srv->closing && srv->listener_closed && srv->n_conns == 0)
        free(srv);
}

void net__ws_server_conn_gone(struct net_ws *ws)
{
    struct net_ws_server *srv = ws->srv;
    if (ws->srv_prev)
        ws->srv_prev->srv_next = ws->srv_next;
    else
        srv->conns = ws->srv_next;
    if (ws->srv_next)
        ws->srv_next->srv_prev = ws->srv_prev;
    srv->n_conns--;
    ws->srv = NULL;
    server_maybe_free(srv);
}

static const char *status_text(int status)
{
    switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 426: return "Upgrade Required";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default:  return "Error";
    }
}

/* Write a complete response and close once it has gone out. */
static void server_reply(struct net_ws *ws, int status, const char *ctype, const char *extra,
                         const char *body, size_t body_len, bool head_only)
{
    char head[512];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                     "Cache-Control: no-store\r\n%sConnection: close\r\n\r\n",
                     status, status_text(status), ctype ? ctype : "text/plain; charset=utf-8",
                     body_len, extra ? extra : "");
    if (n < 0 || (size_t)n >= sizeof head) {
        net__ws_drop(ws, "reply too long");
        return;
    }
    if (net__ws_write_raw(ws, (const uint8_t *)head, (size_t)n) < 0 ||
        (!head_only && net__ws_write_raw(ws, (const uint8_t *)body, body_len) < 0)) {
        net__ws_drop(ws, "write failed");
        return;
    }
    ws->close_after_flush = true;
    ws->in_off = ws->in_len; /* ignore anything pipelined after this request */
    if (ws->pending == 0)
        net__ws_drop(ws, NULL);
}

static void server_error(struct net_ws *ws, int status, const char *extra, const char *why)
{
    char body[192];
    int n = snprintf(body, sizeof body, "%s\n", why);
    server_reply(ws, status, NULL, extra, body, (size_t)n < sizeof body ? (size_t)n : sizeof body - 1,
                 false);
}

static void server_request(struct net_ws *ws)
{
    struct net_ws_server *srv = ws->srv;
    struct net__http *h = ws->http;
    int method = net__http_method(h);
    const char *url = net__http_url(h);
    char path[1024];
    size_t ul = strcspn(url, "?#");
    if (ul >= sizeof path || url[0] != '/') {
        server_error(ws, 400, NULL, "request target must be an absolute path under 1024 bytes");
        return;
    }
    memcpy(path, url, ul);
    path[ul] = 0;

    if (!net__http_upgrade_ws(h)) {
        if (method != HTTP_GET && method != HTTP_HEAD) {
            server_error(ws, 405, "Allow: GET, HEAD\r\n", "only GET and HEAD are served");
            return;
        }
        struct net_ws_reply rep = {0};
        if (srv && srv->h.on_get)
            srv->h.on_get(srv, path, &rep, srv->ud);
        if (rep.status == 0) {
            free(rep.body);
            server_error(ws, 404, NULL, "not found");
            return;
        }
        server_reply(ws, rep.status, rep.content_type, NULL, rep.body ? rep.body : "",
                     rep.body ? rep.body_len : 0, method == HTTP_HEAD);
        free(rep.body);
        return;
    }

    /* RFC 6455 section 4.2.1: what a valid opening handshake must carry. */
    if (method != HTTP_GET || !net__http_is_11(h)) {
        server_error(ws, 400, NULL, "WebSocket upgrade needs GET over HTTP/1.1");
        return;
    }
    if (!net__http_connection_upgrade(h)) {
        server_error(ws, 400, NULL, "Connection header must contain \"Upgrade\"");
        return;
    }
    const char *ver = net__http_version(h);
    if (!ver || strcmp(ver, "13") != 0) {
        server_error(ws, 426, "Sec-WebSocket-Version: 13\r\n",
                     "Sec-WebSocket-Version must be 13");
        return;
    }
    char accept[29];
    if (net_ws_accept_key(net__http_key(h), accept) < 0) {
        server_error(ws, 400, NULL, "Sec-WebSocket-Key missing or not base64 of 16 bytes");
        return;
    }
    const struct net_ws_handlers *wh = NULL;
    void *wud = NULL;
    int st = srv && srv->h.on_upgrade ? srv->h.on_upgrade(srv, ws, path, &wh, &wud, srv->ud) : 404;
    if (st != 0) {
        server_error(ws, st >= 400 && st <= 599 ? st : 404, NULL,
                     st == 404 || st < 400 ? "no WebSocket endpoint at this path" : "refused");
        return;
    }
    char resp[256];
    int n = snprintf(resp, sizeof resp,
                     "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                     "Connection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n", accept);
    if (net__ws_write_raw(ws, (const uint8_t *)resp, (size_t)n) < 0 || net__ws_open(ws) < 0) {
        net__ws_drop(ws, "upgrade failed");
        return;
    }
    net__http_free(ws->http);
    ws->http = NULL;
    net_ws_set_user(ws, wh, wud);
    if (wh && wh->on_open)
        wh->on_open(ws, wud);
}

void net__ws_server_http_input(struct net_ws *ws)
{
    if (!ws->http) {
        ws->http = net__http_new(true);
        if (!ws->http) {
            net__ws_drop(ws, "out of memory");
            return;
        }
    }
    size_t used;
    int r = net__http_feed(ws->http, ws->in + ws->in_off, ws->in_len - ws->in_off, &used);
    if (r < 0) {
        const char *why = net__http_error(ws->http);
        server_error(ws, strstr(why, "bytes") ? 431 : 400, NULL, why);
        return;
    }
    ws->in_off += used;
    if (r == 1)
        server_request(ws);
}

static void server_on_conn(uv_stream_t *l, int status)
{
    struct net_ws_server *srv = l->data;
    if (status < 0 || srv->closing)
        return;
    struct net_ws *ws;
    if (net__ws_alloc(l->loop, srv->tls, true, NULL, &srv->lim, &ws) < 0)
        return;
    ws->srv = srv;
    ws->srv_next = srv->conns;
    if (srv->conns)
        srv->conns->srv_prev = ws;
    srv->conns = ws;
    srv->n_conns++;
    if (uv_accept(l, (uv_stream_t *)&ws->tcp) < 0) {
        net__ws_drop(ws, "accept failed");
        return;
    }
    uv_tcp_nodelay(&ws->tcp, 1);
    struct sockaddr_storage ss;
    int sl = sizeof ss;
    if (uv_tcp_getpeername(&ws->tcp, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET6)
            uv_ip6_name((struct sockaddr_in6 *)&ss, ws->peer, sizeof ws->peer);
        else
            uv_ip4_name((struct sockaddr_in *)&ss, ws->peer, sizeof ws->peer);
    }
    ws->state = ws->tls_on ? NET__WS_TLS : NET__WS_HTTP;
    net__ws_deadline(ws, WS_HANDSHAKE_MS, "handshake timeout");
    if (net__ws_start_read(ws) < 0)
        net__ws_drop(ws, "read failed");
}

/* Parse "host:port", "[v6]:port" or ":port" into a socket address. */
static int parse_addr(const char *addr, struct sockaddr_storage *ss)
{
    char host[128];
    const char *colon = strrchr(addr, ':');
    if (!colon)
        return -EINVAL;
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || colon[1] == 0 || port < 0 || port > 65535)
        return -EINVAL;
    size_t hl = (size_t)(colon - addr);
    const char *h = addr;
    if (hl >= 2 && addr[0] == '[' && addr[hl - 1] == ']') {
        h++;
        hl -= 2;
    }
    if (hl >= sizeof host)
        return -EINVAL;
    memcpy(host, h, hl);
    host[hl] = 0;
    if (hl == 0)
        snprintf(host, sizeof host, "0.0.0.0");
    if (uv_ip4_addr(host, (int)port, (struct sockaddr_in *)ss) == 0)
        return 0;
    if (uv_ip6_addr(host, (int)port, (struct sockaddr_in6 *)ss) == 0)
        return 0;
    return -EINVAL;
}

int net_ws_server_new(struct uv_loop_s *loop, const char *addr, struct net_tls_ctx *tls,
                      const struct net_ws_limits *lim, const struct net_ws_server_handlers *h,
                      void *ud, struct net_ws_server **out)
{
    *out = NULL;
    struct sockaddr_storage ss;
    if (!addr || parse_addr(addr, &ss) < 0) {
        fprintf(stderr, "ws: listen address \"%s\": expected HOST:PORT or [V6]:PORT\n",
                addr ? addr : "");
        return -EINVAL;
    }
    struct net_ws_server *srv = calloc(1, sizeof *srv);
    if (!srv)
        return -ENOMEM;
    srv->tls = tls;
    if (lim)
        srv->lim = *lim;
    srv->h = *h;
    srv->ud = ud;
    uv_tcp_init(loop, &srv->listener);
    srv->listener.data = srv;
    int r = uv_tcp_bind(&srv->listener, (struct sockaddr *)&ss, 0);
    if (r == 0)
        r = uv_listen((uv_stream_t *)&srv->listener, 1024, server_on_conn);
    if (r < 0) {
        fprintf(stderr, "ws: listen on %s: %s\n", addr, uv_strerror(r));
        srv->closing = true;
        uv_close((uv_handle_t *)&srv->listener, (uv_close_cb)free);
        return r;
    }
    struct sockaddr_storage bound;
    int bl = sizeof bound;
    uv_tcp_getsockname(&srv->listener, (struct sockaddr *)&bound, &bl);
    srv->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                  : ((struct sockaddr_in *)&bound)->sin_port);
    *out = srv;
    return 0;
}

int net_ws_server_port(const struct net_ws_server *srv)
{
    return srv->port;
}

static void server_listener_closed(uv_handle_t *h)
{
    struct net_ws_server *srv = h->data;
    srv->listener_closed = true;
    server_maybe_free(srv);
}

void net_ws_server_close(struct net_ws_server *srv)
{
    if (!srv || srv->closing)
        return;
    srv->closing = true;
    for (struct net_ws *ws = srv->conns; ws; ws = ws->srv_next)
        net__ws_drop(ws, "server shutting down");
    uv_close((uv_handle_t *)&srv->listener, server_listener_closed);
}

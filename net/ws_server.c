/* The WebSocket server, on top of net's HTTP server (net_http_*): that server reads and
 * bounds the requests (keep-alive, limits, timeouts), TLS sits in front of it as a byte
 * filter (tls.c), and this file answers plain GETs through on_get and upgrades valid
 * WebSocket requests whose path the owner accepts. Handshake errors get an HTTP status with
 * a one-line reason: 400 for a missing or malformed Sec-WebSocket-Key or Connection header
 * or a method other than GET, 426 (with Sec-WebSocket-Version: 13) for another version,
 * 404 for a path nobody serves, 405 for other methods on plain requests. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/ws_internal.h"

struct net_ws_server {
    uv_loop_t *loop;
    struct net_http_server *http;
    struct net_http_filter filter;
    struct net_ws_limits lim;
    struct net_ws_server_handlers h;
    void *ud;
    void (*done)(void *ud);      /* net_ws_server_close's callback */
    void *done_ud;
    uint64_t assembling;         /* payload bytes of messages being assembled, all connections */
};

static void ws_request(struct net_http_req *req, void *ud)
{
    struct net_ws_server *srv = ud;
    const char *method = net_http_req_method(req);
    const char *path = net_http_req_path(req);
    const char *upgrade = net_http_req_header(req, "Upgrade");

    if (!upgrade) {
        if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
            net_http_reply(req, 405, "text/plain; charset=utf-8", "Allow: GET, HEAD\r\n",
                           "only GET and HEAD are served\n", 29);
            return;
        }
        struct net_ws_reply rep = {0};
        if (srv->h.on_get)
            srv->h.on_get(srv, path, &rep, srv->ud);
        if (rep.status == 0) {
            free(rep.body);
            net_http_reply_error(req, 404, "not found");
            return;
        }
        net_http_reply(req, rep.status, rep.content_type ? rep.content_type : "text/plain; charset=utf-8",
                       "Cache-Control: no-store\r\n", rep.body, rep.body ? rep.body_len : 0);
        free(rep.body);
        return;
    }

    /* RFC 6455 section 4.2.1: what a valid opening handshake must carry. */
    if (strcmp(method, "GET") != 0 || net_http_req_is_http10(req) ||
        !net__http_has_token(upgrade, "websocket") || !net_http_req_is_upgrade(req)) {
        net_http_reply_error(req, 400, "WebSocket upgrade needs GET over HTTP/1.1 with Upgrade: websocket");
        return;
    }
    if (!net__http_has_token(net_http_req_header(req, "Connection"), "upgrade")) {
        net_http_reply_error(req, 400, "Connection header must contain \"Upgrade\"");
        return;
    }
    const char *ver = net_http_req_header(req, "Sec-WebSocket-Version");
    if (!ver || strcmp(ver, "13") != 0) {
        net_http_reply(req, 426, "text/plain; charset=utf-8", "Sec-WebSocket-Version: 13\r\n",
                       "Sec-WebSocket-Version must be 13\n", 33);
        return;
    }
    char accept[29];
    if (net_ws_accept_key(net_http_req_header(req, "Sec-WebSocket-Key"), accept) < 0) {
        net_http_reply_error(req, 400, "Sec-WebSocket-Key missing or not base64 of 16 bytes");
        return;
    }
    struct net_ws *ws;
    if (net__ws_alloc_http(&ws, srv->loop, net_http_req_peer(req), &srv->lim,
                           &srv->assembling) < 0) {
        net_http_reply_error(req, 503, "out of memory");
        return;
    }
    const struct net_ws_handlers *wh = NULL;
    void *wud = NULL;
    int st = srv->h.on_upgrade ? srv->h.on_upgrade(srv, ws, path, &wh, &wud, srv->ud) : 404;
    if (st != 0) {
        net__ws_drop(ws, "refused"); /* only its timer to close; no handler is told */
        if (st == 404 || st < 400 || st > 599)
            net_http_reply_error(req, 404, "no WebSocket endpoint at this path");
        else
            net_http_reply_error(req, st, "refused");
        return;
    }
    net_ws_set_user(ws, wh, wud);
    char head[256];
    snprintf(head, sizeof head,
             "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
             "Connection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n", accept);
    if (net__ws_upgrade_http(ws, req, head) < 0) {
        net__ws_drop(ws, "upgrade failed"); /* the owner's on_close tells it */
        return;
    }
    if (wh && wh->on_open)
        wh->on_open(ws, wud);
    net__ws_after_upgrade(ws);
}

int net_ws_server_new(struct net_ws_server **out, struct uv_loop_s *loop, const char *addr,
                      struct net_tls_ctx *tls, const struct net_ws_limits *lim,
                      const struct net_ws_server_handlers *h, void *ud, char *err,
                      size_t errlen)
{
    *out = NULL;
    struct net_ws_server *srv = calloc(1, sizeof *srv);
    if (!srv) {
        snprintf(err, errlen, "ws: out of memory");
        return -ENOMEM;
    }
    srv->loop = loop;
    if (lim)
        srv->lim = *lim;
    srv->h = *h;
    srv->ud = ud;
    /* Requests here are short GETs and upgrades: small heads, no bodies; the connection
     * count (WebSockets and connections still in their handshake) is capped as a whole. */
    struct net_http_limits hl = {.max_url = 1024, .max_header_bytes = 8192, .max_headers = 64,
                                 .max_body = 1, .header_timeout_ms = 10000,
                                 .max_conns = lim && lim->max_conns ? lim->max_conns : 65536};
    if (lim) {
        hl.max_conns_per_addr = lim->max_conns_per_addr;
        if (lim->header_timeout_ms) {
            hl.header_timeout_ms = lim->header_timeout_ms;
            hl.body_timeout_ms = lim->header_timeout_ms;
            hl.handshake_timeout_ms = lim->header_timeout_ms;
        }
        hl.write_timeout_ms = lim->write_timeout_ms;
    }
    int rc = net_http_server_new(&srv->http, loop, &hl);
    if (rc < 0) {
        snprintf(err, errlen, "ws: HTTP server: %s", uv_strerror(rc));
        free(srv);
        return rc;
    }
    if (tls) {
        net__tls_filter_init(&srv->filter, tls);
        net_http_server_set_filter(srv->http, &srv->filter);
    }
    rc = net_http_server_route(srv->http, "*", "/*", ws_request, srv);
    if (rc == 0)
        rc = net_http_server_listen(srv->http, addr);
    if (rc < 0) {
        snprintf(err, errlen, "ws: listen on %s: %s", addr ? addr : "", uv_strerror(rc));
        net_http_server_close(srv->http, free, srv);
        return rc;
    }
    *out = srv;
    return 0;
}

int net_ws_server_port(const struct net_ws_server *srv)
{
    return net_http_server_port(srv->http);
}

struct net_http_server *net_ws_server_http(struct net_ws_server *srv)
{
    return srv->http;
}

uint64_t net_ws_server_assembling(const struct net_ws_server *srv)
{
    return srv->assembling;
}

static void server_closed(void *ud)
{
    struct net_ws_server *srv = ud;
    void (*done)(void *) = srv->done;
    void *done_ud = srv->done_ud;
    free(srv);
    if (done)
        done(done_ud);
}

void net_ws_server_close(struct net_ws_server *srv, void (*done)(void *ud), void *ud)
{
    if (!srv)
        return;
    srv->done = done;
    srv->done_ud = ud;
    /* closes every connection (upgraded ones report to their WebSocket) and frees srv
     * once every handle is closed */
    net_http_server_close(srv->http, server_closed, srv);
}

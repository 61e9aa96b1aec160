/* The WebSocket client: resolve, connect, TLS handshake (wss), send the opening handshake
 * with a fresh random key, check the 101 response and its Sec-WebSocket-Accept, then frame.
 * The whole dial is bounded by one deadline. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>
#include <openssl/rand.h>

#include "net/ws_internal.h"
#include "util/err.h"

#define WS_DIAL_MS 10000

static void client_fail(struct net_ws *ws, const char *why)
{
    snprintf(ws->close_reason, sizeof ws->close_reason, "%.*s", (int)sizeof ws->close_reason - 1, why);
    net__ws_drop(ws, why);
}

static void client_send_request(struct net_ws *ws)
{
    unsigned char raw[16];
    char key[25];
    if (RAND_bytes(raw, sizeof raw) != 1) {
        client_fail(ws, "no randomness for the key");
        return;
    }
    EVP_EncodeBlock((unsigned char *)key, raw, sizeof raw);
    ws->key = strdup(key);
    ws->http = net__http_new();
    if (!ws->key || !ws->http) {
        client_fail(ws, "out of memory");
        return;
    }
    char req[1536];
    int n = snprintf(req, sizeof req,
                     "GET %s HTTP/1.1\r\nHost: %s:%d\r\nUpgrade: websocket\r\n"
                     "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\n"
                     "Sec-WebSocket-Version: 13\r\nUser-Agent: kvasir\r\n\r\n",
                     ws->path, ws->host, ws->port, key);
    if (n < 0 || (size_t)n >= sizeof req || net__ws_write_raw(ws, (const uint8_t *)req, (size_t)n) < 0)
        client_fail(ws, "cannot send the handshake");
}

static void client_http_input(struct net_ws *ws)
{
    if (!ws->http)
        return;
    size_t used;
    int r = net__http_feed(ws->http, ws->in.p + ws->in_off, ws->in.len - ws->in_off, &used);
    if (r < 0) {
        char why[128];
        snprintf(why, sizeof why, "handshake response: %s", net__http_error(ws->http));
        client_fail(ws, why);
        return;
    }
    ws->in_off += used;
    if (r == 0)
        return;
    char why[128];
    int st = net__http_status(ws->http);
    if (st != 101) {
        snprintf(why, sizeof why, "handshake refused: HTTP %d", st);
        client_fail(ws, why);
        return;
    }
    char want[29];
    const char *got = net__http_accept(ws->http);
    if (net_ws_accept_key(ws->key, want) < 0 || !got || strcmp(got, want) != 0 ||
        !net__http_upgrade_ws(ws->http) || !net__http_connection_upgrade(ws->http)) {
        client_fail(ws, "handshake response: bad Sec-WebSocket-Accept, Upgrade or Connection");
        return;
    }
    if (net__ws_open(ws) < 0) {
        client_fail(ws, "out of memory");
        return;
    }
    net__http_free(ws->http);
    ws->http = NULL;
    if (ws->h && ws->h->on_open)
        ws->h->on_open(ws, ws->ud);
}

static const struct net__ws_client_ops client_ops = {
    .tls_ready = client_send_request, .http_input = client_http_input,
};

static void client_connected(uv_connect_t *req, int status)
{
    struct net_ws *ws = req->data;
    if (ws->state == NET__WS_CLOSING)
        return;
    if (status < 0) {
        char why[128];
        snprintf(why, sizeof why, "connect to %s:%d: %s", ws->host, ws->port, uv_strerror(status));
        client_fail(ws, why);
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
    if (net__ws_start_read(ws) < 0) {
        client_fail(ws, "read failed");
        return;
    }
    if (ws->tls_on) {
        ws->state = NET__WS_TLS;
        char why[KV_ERR_MAX];
        if (net__tls_handshake(ws->tls, why, sizeof why) < 0) {
            client_fail(ws, why);
            return;
        }
        if (net__ws_tls_push(ws) < 0)
            client_fail(ws, "cannot send the TLS ClientHello");
    } else {
        ws->state = NET__WS_HTTP;
        client_send_request(ws);
    }
}

static void client_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    struct net_ws *ws = req->data;
    if (ws->state == NET__WS_CLOSING) {
        uv_freeaddrinfo(res);
        net__ws_unref(ws); /* the resolver request counted as a handle */
        return;
    }
    ws->handles_open--;
    if (status < 0 || !res) {
        char why[128];
        snprintf(why, sizeof why, "resolve %s: %s", ws->host, uv_strerror(status));
        uv_freeaddrinfo(res);
        client_fail(ws, why);
        return;
    }
    ws->connect.data = ws;
    int r = uv_tcp_connect(&ws->connect, &ws->tcp, res->ai_addr, client_connected);
    uv_freeaddrinfo(res);
    if (r < 0) {
        char why[128];
        snprintf(why, sizeof why, "connect to %s:%d: %s", ws->host, ws->port, uv_strerror(r));
        client_fail(ws, why);
    }
}

/* ws://host[:port][/path] or wss://...; host may be [v6]. */
static int parse_url(const char *url, bool *tls, char **host, int *port, char **path)
{
    const char *p;
    if (!strncmp(url, "ws://", 5)) {
        *tls = false;
        p = url + 5;
        *port = 80;
    } else if (!strncmp(url, "wss://", 6)) {
        *tls = true;
        p = url + 6;
        *port = 443;
    } else {
        return -EINVAL;
    }
    const char *hs = p, *he;
    if (*p == '[') {
        he = strchr(p, ']');
        if (!he)
            return -EINVAL;
        hs = p + 1;
        p = he + 1;
    } else {
        while (*p && *p != ':' && *p != '/')
            p++;
        he = p;
    }
    if (he == hs || (size_t)(he - hs) > 253)
        return -EINVAL;
    if (*p == ':') {
        char *end;
        long v = strtol(p + 1, &end, 10);
        if (end == p + 1 || v <= 0 || v > 65535)
            return -EINVAL;
        *port = (int)v;
        p = end;
    }
    if (*p && *p != '/')
        return -EINVAL;
    const char *ps = *p ? p : "/";
    if (strlen(ps) > 1024)
        return -EINVAL;
    for (const char *c = ps; *c; c++)
        if ((unsigned char)*c <= ' ' || *c == 0x7f)
            return -EINVAL;
    *host = strndup(hs, (size_t)(he - hs));
    *path = strdup(ps);
    if (!*host || !*path) {
        free(*host);
        free(*path);
        return -ENOMEM;
    }
    return 0;
}

int net_ws_dial(struct net_ws **out, struct uv_loop_s *loop, const char *url,
                struct net_tls_ctx *tls, const struct net_ws_limits *lim,
                const struct net_ws_handlers *h, void *ud, char *err, size_t errlen)
{
    *out = NULL;
    bool want_tls;
    char *host = NULL, *path = NULL;
    int port;
    if (!url || parse_url(url, &want_tls, &host, &port, &path) < 0) {
        snprintf(err, errlen, "ws: URL \"%s\": expected ws://HOST[:PORT]/PATH or wss://...",
                 url ? url : "");
        return -EINVAL;
    }
    if (want_tls && !tls) {
        snprintf(err, errlen, "ws: URL %s needs a TLS client context", url);
        free(host);
        free(path);
        return -EINVAL;
    }
    struct net_ws *ws;
    int r = net__ws_alloc(&ws, loop, want_tls ? tls : NULL, false, host, lim);
    if (r < 0) {
        snprintf(err, errlen, "ws: %s: %s", url, uv_strerror(r));
        free(host);
        free(path);
        return r;
    }
    ws->host = host;
    ws->path = path;
    ws->port = port;
    ws->client = &client_ops;
    ws->state = NET__WS_CONNECTING;
    net_ws_set_user(ws, h, ud);
    char port_s[8];
    snprintf(port_s, sizeof port_s, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    ws->gai.data = ws;
    r = uv_getaddrinfo(loop, &ws->gai, client_resolved, host, port_s, &hints);
    if (r < 0) {
        snprintf(err, errlen, "ws: resolve %s: %s", host, uv_strerror(r));
        net__ws_drop(ws, "resolver failed");
        /* handles close later; the caller sees the error now and on_close not at all */
        net_ws_set_user(ws, NULL, NULL);
        return r;
    }
    ws->handles_open++;
    net__ws_deadline(ws, WS_DIAL_MS, "dial timeout");
    *out = ws;
    return 0;
}

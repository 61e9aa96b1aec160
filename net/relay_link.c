/* The stream transport through a relay (what ring links run on): endpoint relay://HOST:PORT/b/<bridge-id> (wss)
 * or relay+ws://HOST:PORT/b/<bridge-id> (plain ws, tests and trusted LANs). The stage that
 * dials the endpoint is the upstream end of the edge (role 0x01); the stage that owns the
 * endpoint dials the same bridge with "?role=down" appended (role 0x02). Each stream write
 * becomes binary WebSocket messages of at most 1 MiB; the bytes are the ring's unchanged
 * frame stream (message boundaries carry no meaning), so
 * HELLO/AUTH still run end to end and the relay learns nothing it must be trusted with.
 *
 * TLS: the relay's certificate is checked against the system store, or against the PEM
 * file in $KV_RELAY_CA; KV_RELAY_INSECURE=1 skips the check (tests). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/net.h"
#include "util/err.h"

#define RELAY_MSG_MAX (1u << 20)

struct relay_tp {
    struct net_stream *l;
    struct net_ws *ws;
    uint8_t role;
    bool open, close_wanted;
    size_t unacked;              /* bytes sent while the WebSocket queue was above low water */
};

static struct net_tls_ctx *client_tls;

static struct net_tls_ctx *relay_client_tls(char *err, size_t errlen)
{
    if (client_tls)
        return client_tls;
    const char *ca = getenv("KV_RELAY_CA");
    const char *insecure = getenv("KV_RELAY_INSECURE");
    bool verify = !(insecure && !strcmp(insecure, "1"));
    if (net_tls_ctx_client_new(&client_tls, ca && ca[0] ? ca : NULL, verify, err, errlen) < 0) {
        client_tls = NULL;
        if (ca && ca[0]) {   /* name the setting the file came from */
            char e[KV_ERR_MAX];
            snprintf(e, sizeof e, "%s", err);
            snprintf(err, errlen, "KV_RELAY_CA (the stage's environment): %s", e);
        }
    }
    return client_tls;
}

/* Append to a rejected certificate's reason the setting that decides which relay
 * certificates a stage trusts. */
static void cert_hint(char *r, size_t n)
{
    const char *ca = getenv("KV_RELAY_CA");
    bool own = ca && ca[0];
    size_t k = strlen(r);
    snprintf(r + k, n - k, " (relay certificates are checked against %s%s: set KV_RELAY_CA in "
             "the stage's environment, or --relay-ca, to the PEM file of the CA that signed the "
             "relay's certificate, and name the relay by a host its certificate holds)",
             own ? "KV_RELAY_CA=" : "the system store", own ? ca : "");
}

static void rt_open(struct net_ws *ws, void *ud)
{
    struct relay_tp *t = ud;
    if (net_ws_send(ws, NET_WS_BINARY, &t->role, 1) < 0) {
        net_ws_abort(ws);
        return;
    }
    t->open = true;
    net_stream_tp_opened(t->l, 0);
}

static void rt_msg(struct net_ws *ws, int opcode, const uint8_t *data, size_t len, void *ud)
{
    struct relay_tp *t = ud;
    if (opcode != NET_WS_BINARY) {
        net_stream_tp_error(t->l, "relay sent a text message");
        return;
    }
    net_stream_tp_data(t->l, data, len);
}

static void rt_drain(struct net_ws *ws, void *ud)
{
    struct relay_tp *t = ud;
    if (t->unacked) {
        size_t n = t->unacked;
        t->unacked = 0;
        net_stream_tp_written(t->l, n);
    }
}

/* The WebSocket is gone (libuv close callback): finish the link's close, or start it. */
static void rt_close(struct net_ws *ws, int code, const char *reason, void *ud)
{
    struct relay_tp *t = ud;
    struct net_stream *l = t->l;
    t->ws = NULL;
    if (!t->close_wanted) {
        /* The relay's close reason is its text: printable and bounded before it is logged. */
        char why[512], r[KV_ERR_MAX];
        util_text_clean(why, sizeof why, (const uint8_t *)reason, strlen(reason));
        if (!t->open) {
            snprintf(r, sizeof r, "relay %s: %s", net_stream_peer(l), why);
            if (net_ws_cert_rejected(ws))
                cert_hint(r, sizeof r);
            /* on_open(-ECONNREFUSED), then net_stream_close -> relay_close below */
            net_stream_tp_failed(l, -ECONNREFUSED, r);
            return;
        }
        snprintf(r, sizeof r, "relay closed the bridge: %d %s", code, why);
        net_stream_tp_error(l, r); /* -> net_stream_close -> relay_close: ws already gone */
        return;
    }
    free(t);
    net_stream_tp_closed(l);
}

static const struct net_ws_handlers rt_handlers = {
    .on_open = rt_open, .on_msg = rt_msg, .on_drain = rt_drain, .on_close = rt_close,
};

/* rest: HOST:PORT/b/ID[?role=up|down] -> URL, role. */
static int relay_url(const char *scheme, const char *rest, char *url, size_t n, uint8_t *role)
{
    const char *b = strstr(rest, "/b/");
    if (!b || b == rest)
        return -EINVAL;
    const char *id = b + 3;
    size_t idl = strcspn(id, "?");
    if (idl == 0 || idl > 64)
        return -EINVAL;
    const char *q = id + idl;
    *role = 0x01;
    if (*q) {
        if (!strcmp(q, "?role=down"))
            *role = 0x02;
        else if (strcmp(q, "?role=up") != 0)
            return -EINVAL;
    }
    int w = snprintf(url, n, "%s://%.*s/v1/bridge/%.*s", scheme, (int)(b - rest), rest, (int)idl, id);
    return w < 0 || (size_t)w >= n ? -ENAMETOOLONG : 0;
}

static int relay_dial_common(struct net_stream *l, uv_loop_t *loop, const char *rest, bool tls,
                             char *err, size_t errlen)
{
    char url[512];
    uint8_t role;
    int rc = relay_url(tls ? "wss" : "ws", rest, url, sizeof url, &role);
    if (rc < 0) {
        snprintf(err, errlen, "relay endpoint \"%s\": expected HOST:PORT/b/BRIDGE-ID", rest);
        return rc;
    }
    struct net_tls_ctx *ctx = NULL;
    if (tls && !(ctx = relay_client_tls(err, errlen)))
        return -EINVAL;
    struct relay_tp *t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(err, errlen, "relay endpoint \"%s\": out of memory", rest);
        return -ENOMEM;
    }
    t->l = l;
    t->role = role;
    net_stream_tp_set(l, t);
    /* Anything a stream's owner may write at once; its own reader caps what it takes. */
    struct net_ws_limits lim = {.max_msg_bytes = NET_STREAM_MSG_MAX};
    rc = net_ws_dial(&t->ws, loop, url, ctx, &lim, &rt_handlers, t, err, errlen);
    if (rc < 0) {
        free(t);
        return rc;
    }
    return 0;
}

static int relay_dial_tls(struct net_stream *l, uv_loop_t *loop, const char *rest, char *err,
                          size_t errlen)
{
    return relay_dial_common(l, loop, rest, true, err, errlen);
}

static int relay_dial_plain(struct net_stream *l, uv_loop_t *loop, const char *rest, char *err,
                            size_t errlen)
{
    return relay_dial_common(l, loop, rest, false, err, errlen);
}

static int relay_write(struct net_stream *l, uv_buf_t buf)
{
    struct relay_tp *t = net_stream_tp(l);
    if (!t->ws || !t->open) {
        free(buf.base);
        return -ENOTCONN;
    }
    /* The link is a byte stream: a big frame goes out as several messages of at most
     * RELAY_MSG_MAX bytes, so the relay's message limit never caps the ring's frame size. */
    int rc = 0;
    for (size_t off = 0; off < buf.len && rc == 0; off += RELAY_MSG_MAX) {
        size_t n = buf.len - off < RELAY_MSG_MAX ? buf.len - off : RELAY_MSG_MAX;
        rc = net_ws_send(t->ws, NET_WS_BINARY, (const uint8_t *)buf.base + off, n);
    }
    free(buf.base);
    if (rc < 0)
        return rc;
    /* The link counts queued bytes for its own flow control: report them written at once
     * while the WebSocket queue is short, else when it drains. */
    if (net_ws_pending(t->ws) < (256u << 10) && t->unacked == 0)
        net_stream_tp_written(l, buf.len);
    else
        t->unacked += buf.len;
    return 0;
}

static void relay_close(struct net_stream *l)
{
    struct relay_tp *t = net_stream_tp(l);
    t->close_wanted = true;
    if (t->ws) {
        net_ws_close(t->ws, NET_WS_CODE_NORMAL, "link closed");
        return;
    }
    /* Reached from rt_close (the WebSocket is already gone): finish now. */
    free(t);
    net_stream_tp_closed(l);
}

static const struct net_transport relay_tls_transport = {
    .scheme = "relay", .dial = relay_dial_tls, .write = relay_write, .close = relay_close,
};
static const struct net_transport relay_plain_transport = {
    .scheme = "relay+ws", .dial = relay_dial_plain, .write = relay_write, .close = relay_close,
};

int net_relay_transport_register(void)
{
    int a = net_transport_register(&relay_tls_transport);
    int b = net_transport_register(&relay_plain_transport);
    if (a < 0 && a != -EEXIST)
        return a;
    if (b < 0 && b != -EEXIST)
        return b;
    return 0;
}

bool net_relay_endpoint(const char *endpoint)
{
    return !strncmp(endpoint, "relay://", 8) || !strncmp(endpoint, "relay+ws://", 11);
}

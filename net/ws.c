/* One WebSocket connection: a libuv TCP handle, optional TLS over memory BIOs, and wslay's
 * event API for RFC 6455 framing. wslay checks what the RFC demands of received frames
 * (masking by role, reserved bits and opcodes, control frames short and unfragmented,
 * UTF-8 in text and close reasons, message size) and answers with the matching close code;
 * we drop the TCP connection once our close frame has gone out and reading has ended.
 *
 * Buffers: plaintext input accumulates in ws->in (bounded: reading stops while paused);
 * everything wslay emits during one flush is batched into one uv_write whose buffer the
 * write request owns until its callback. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/rand.h>

#include "net/ws_internal.h"
#include "util/err.h"

#define WS_READ_CHUNK (64 * 1024)
#define WS_CLOSE_WAIT_MS 2000

struct ws_write {
    uv_write_t req;
    struct net_ws *ws;
    uint8_t *buf;
    size_t len;
};

static void ws_flush(struct net_ws *ws);
static void ws_process(struct net_ws *ws);

/* The message being assembled is complete or abandoned: its bytes are no longer counted. */
static void asm_release(struct net_ws *ws)
{
    if (ws->asm_total)
        *ws->asm_total -= ws->asm_bytes;
    ws->asm_bytes = 0;
    ws->asm_frags = 0;
}

/* Set the limits of a new connection (0 fields: defaults). */
static void ws_limits_set(struct net_ws *ws, const struct net_ws_limits *lim)
{
    ws->lim.max_msg_bytes = lim && lim->max_msg_bytes ? lim->max_msg_bytes : (16u << 20);
    ws->lim.low_water = lim && lim->low_water ? lim->low_water : (256u << 10);
    ws->lim.max_fragments = lim && lim->max_fragments ? lim->max_fragments : 1024;
    ws->lim.max_assembly = lim && lim->max_assembly ? lim->max_assembly : (256ull << 20);
}

/* ---------------------------------------------------------------- handles */

void net__ws_unref(struct net_ws *ws)
{
    if (--ws->handles_open > 0)
        return;
    asm_release(ws);
    if (ws->h && ws->h->on_close)
        ws->h->on_close(ws, ws->close_code, ws->close_reason, ws->ud);
    net__http_free(ws->http);
    if (ws->wslay)
        wslay_event_context_free(ws->wslay);
    net__tls_free(ws->tls);
    util_buf_free(&ws->in);
    util_buf_free(&ws->out);
    free(ws->host);
    free(ws->path);
    free(ws->key);
    free(ws);
}

static void ws_handle_closed(uv_handle_t *h)
{
    net__ws_unref(h->data);
}

bool net_ws_cert_rejected(const struct net_ws *ws)
{
    return ws && ws->tls && net__tls_cert_rejected(ws->tls);
}

void net__ws_drop(struct net_ws *ws, const char *reason)
{
    if (ws->state == NET__WS_CLOSING)
        return;
    ws->state = NET__WS_CLOSING;
    if (ws->handles_open > 2)
        uv_cancel((uv_req_t *)&ws->gai); /* still resolving */
    if (ws->close_code == NET_WS_CODE_ABNORMAL && reason)
        snprintf(ws->close_reason, sizeof ws->close_reason, "%s", reason);
    if (ws->hc) {
        /* over net's HTTP server: it closes the connection (after what is queued, or now
         * when aborting) and reports through hc_closed */
        if (ws->abort)
            net_http_conn_abort(ws->hc);
        else
            net_http_conn_close(ws->hc);
    } else if (!ws->over_http) {
        uv_close((uv_handle_t *)&ws->tcp, ws_handle_closed);
    }
    uv_close((uv_handle_t *)&ws->timer, ws_handle_closed);
}

static void ws_deadline_cb(uv_timer_t *t)
{
    struct net_ws *ws = t->data;
    const char *why = ws->http ? "handshake timeout" : "closing handshake timeout";
    if (ws->state == NET__WS_OPEN && !ws->wslay)
        why = "timeout";
    net__ws_drop(ws, why);
}

void net__ws_deadline(struct net_ws *ws, uint64_t ms, const char *reason)
{
    (void)reason;
    if (ws->state == NET__WS_CLOSING)
        return;
    if (ms == 0)
        uv_timer_stop(&ws->timer);
    else
        uv_timer_start(&ws->timer, ws_deadline_cb, ms, 0);
}

int net__ws_alloc(struct net_ws **out, uv_loop_t *loop, struct net_tls_ctx *tls, bool server,
                  const char *sni, const struct net_ws_limits *lim)
{
    *out = NULL;
    struct net_ws *ws = calloc(1, sizeof *ws);
    if (!ws)
        return -ENOMEM;
    ws->server = server;
    ws->close_code = NET_WS_CODE_ABNORMAL;
    snprintf(ws->close_reason, sizeof ws->close_reason, "connection dropped");
    ws_limits_set(ws, lim);
    if (tls) {
        int r = net__tls_new(&ws->tls, tls, server, sni);
        if (r < 0) {
            free(ws);
            return r;
        }
        ws->tls_on = true;
    }
    int r = uv_tcp_init(loop, &ws->tcp);
    if (r < 0) {
        net__tls_free(ws->tls);
        free(ws);
        return r;
    }
    uv_timer_init(loop, &ws->timer);
    ws->tcp.data = ws;
    ws->timer.data = ws;
    ws->handles_open = 2;
    ws->last_rx = uv_now(loop);
    *out = ws;
    return 0;
}

/* ---------------------------------------------------------------- output */

/* Bytes handed to the carrier and not yet taken by the kernel. */
static size_t ws_queued(const struct net_ws *ws)
{
    if (ws->over_http)
        return ws->hc ? net_http_conn_queued(ws->hc) : 0;
    return ws->pending;
}

static void ws_write_done(uv_write_t *req, int status)
{
    struct ws_write *w = (struct ws_write *)req;
    struct net_ws *ws = w->ws;
    ws->pending -= w->len;
    free(w->buf);
    free(w);
    if (ws->state == NET__WS_CLOSING)
        return;
    if (status < 0) {
        net__ws_drop(ws, "write failed");
        return;
    }
    if (ws->above_low && net_ws_pending(ws) < ws->lim.low_water) {
        ws->above_low = false;
        if (ws->h && ws->h->on_drain)
            ws->h->on_drain(ws, ws->ud);
    }
    if (ws->state != NET__WS_CLOSING && ws->close_after_flush && ws->pending == 0)
        net__ws_drop(ws, NULL);
}

/* Hand a malloc'd buffer (ownership passes) to libuv, or to the HTTP server's connection. */
static int ws_write_buf(struct net_ws *ws, uint8_t *buf, size_t len)
{
    if (ws->over_http) {
        int rc = ws->hc ? net_http_conn_write(ws->hc, buf, len) : -EPIPE;
        free(buf);
        if (rc == 0 && ws_queued(ws) >= ws->lim.low_water)
            ws->above_low = true;
        return rc;
    }
    struct ws_write *w = malloc(sizeof *w);
    if (!w) {
        free(buf);
        return -ENOMEM;
    }
    w->ws = ws;
    w->buf = buf;
    w->len = len;
    uv_buf_t b = uv_buf_init((char *)buf, (unsigned)len);
    int r = uv_write(&w->req, (uv_stream_t *)&ws->tcp, &b, 1, ws_write_done);
    if (r < 0) {
        free(buf);
        free(w);
        return r;
    }
    ws->pending += len;
    if (ws->pending >= ws->lim.low_water)
        ws->above_low = true;
    return 0;
}

/* Move TLS ciphertext waiting in the session to the socket. */
int net__ws_tls_push(struct net_ws *ws)
{
    uint8_t *buf;
    size_t n;
    while ((n = net__tls_take(ws->tls, &buf)) > 0) {
        int r = ws_write_buf(ws, buf, n);
        if (r < 0)
            return r;
    }
    return 0;
}

int net__ws_write_raw(struct net_ws *ws, const uint8_t *data, size_t len)
{
    if (len == 0)
        return 0;
    if (ws->tls_on) {
        int r = net__tls_write(ws->tls, data, len);
        if (r < 0)
            return r;
        return net__ws_tls_push(ws);
    }
    uint8_t *copy = malloc(len);
    if (!copy)
        return -ENOMEM;
    memcpy(copy, data, len);
    return ws_write_buf(ws, copy, len);
}

/* Let wslay emit what it has queued, then write the batch. */
static void ws_flush(struct net_ws *ws)
{
    if (ws->state != NET__WS_OPEN || !ws->wslay || ws->in_recv)
        return;
    if (wslay_event_want_write(ws->wslay)) {
        if (wslay_event_send(ws->wslay) < 0) {
            net__ws_drop(ws, "send failed");
            return;
        }
    }
    if (ws->out.len > 0) {
        int r;
        if (ws->tls_on) {
            r = net__tls_write(ws->tls, ws->out.p, ws->out.len);
            ws->out.len = 0;
            if (r == 0)
                r = net__ws_tls_push(ws);
        } else {
            r = ws_write_buf(ws, ws->out.p, ws->out.len);   /* the write owns the bytes now */
            ws->out = (struct util_buf){0};
        }
        if (r < 0) {
            net__ws_drop(ws, "write failed");
            return;
        }
    }
    /* Our close frame is out and nothing more will be read: the exchange is over. */
    if (wslay_event_get_close_sent(ws->wslay) && !wslay_event_get_read_enabled(ws->wslay)) {
        ws->close_after_flush = true;
        if (ws->over_http || ws->pending == 0)
            net__ws_drop(ws, NULL); /* the HTTP server closes after its queue is written */
    }
}

/* ---------------------------------------------------------------- wslay glue */

/* Hands wslay the received bytes, but looks at each frame header first: wslay answers a
 * fragmented or over-long control frame with an empty close (1005) instead of 1002, so such
 * a frame is failed here before wslay sees it. ws->fr_left counts the bytes of the current
 * frame not yet handed over; 0 means the next byte starts a header. */
static ssize_t ws_recv_cb(wslay_event_context_ptr ctx, uint8_t *buf, size_t len, int flags,
                          void *ud)
{
    struct net_ws *ws = ud;
    size_t avail = ws->in.len - ws->in_off;
    if (ws->paused || ws->state != NET__WS_OPEN || avail == 0) {
        wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
        return -1;
    }
    const uint8_t *src = ws->in.p + ws->in_off;
    size_t give = 0;
    while (give < len && give < avail) {
        if (ws->fr_left == 0) {
            const uint8_t *p = src + give;
            size_t have = avail - give;
            if (have < 2)
                break;
            unsigned len7 = p[1] & 0x7f;
            if ((p[0] & 0x08) && (!(p[0] & 0x80) || len7 > 125)) {
                if (give > 0)
                    break;
                static const char why[] = "control frame fragmented or over 125 bytes";
                wslay_event_queue_close(ctx, WSLAY_CODE_PROTOCOL_ERROR, (const uint8_t *)why,
                                        sizeof why - 1);
                wslay_event_shutdown_read(ctx);
                wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
                return -1;
            }
            size_t hl = 2 + (len7 == 126 ? 2 : len7 == 127 ? 8 : 0) + ((p[1] & 0x80) ? 4 : 0);
            if (have < hl)
                break;
            uint64_t pl = len7;
            if (len7 == 126)
                pl = (uint64_t)p[2] << 8 | p[3];
            else if (len7 == 127)
                for (int i = 0; i < 8; i++)
                    pl = (i ? pl << 8 : 0) | p[2 + i];
            ws->fr_left = pl > UINT64_MAX - hl ? UINT64_MAX : pl + hl;
        }
        size_t take = len - give < avail - give ? len - give : avail - give;
        if (take > ws->fr_left)
            take = (size_t)ws->fr_left;
        give += take;
        ws->fr_left -= take;
    }
    if (give == 0) {
        wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
        return -1;
    }
    memcpy(buf, src, give);
    ws->in_off += give;
    return (ssize_t)give;
}

static ssize_t ws_send_cb(wslay_event_context_ptr ctx, const uint8_t *data, size_t len, int flags,
                          void *ud)
{
    struct net_ws *ws = ud;
    if (util_buf_append(&ws->out, data, len, SIZE_MAX) < 0) {
        wslay_event_set_error(ctx, WSLAY_ERR_CALLBACK_FAILURE);
        return -1;
    }
    return (ssize_t)len;
}

static int ws_genmask_cb(wslay_event_context_ptr ctx, uint8_t *buf, size_t len, void *ud)
{
    return RAND_bytes(buf, (int)len) == 1 ? 0 : -1;
}

static void ws_frame_start_cb(wslay_event_context_ptr ctx,
                              const struct wslay_event_on_frame_recv_start_arg *arg, void *ud)
{
    struct net_ws *ws = ud;
    ws->last_rx = uv_now(ws->tcp.loop);
    /* Data frames: count the message being assembled. wslay keeps each frame of it as a
     * separate chunk until the last one arrives, so 1-byte fragments would cost many times
     * their size: the frame count is capped, and so are the bytes, here and server-wide. */
    if (arg->opcode <= WSLAY_BINARY_FRAME) {
        if (arg->opcode != WSLAY_CONTINUATION_FRAME)
            asm_release(ws);
        uint64_t pl = arg->payload_length < ws->lim.max_msg_bytes ? arg->payload_length
                                                                   : ws->lim.max_msg_bytes;
        char why[96];
        int code = 0;
        if (++ws->asm_frags > ws->lim.max_fragments) {
            code = NET_WS_CODE_TOO_BIG;
            snprintf(why, sizeof why, "message in more than %u fragments", ws->lim.max_fragments);
        } else if (ws->asm_total && *ws->asm_total + pl > ws->lim.max_assembly) {
            code = NET_WS_CODE_TRY_LATER;
            snprintf(why, sizeof why, "server busy: %llu bytes of messages being assembled",
                     (unsigned long long)*ws->asm_total);
        }
        if (code) {
            wslay_event_queue_close(ctx, (uint16_t)code, (const uint8_t *)why, strlen(why));
            wslay_event_shutdown_read(ctx);
            return;
        }
        ws->asm_bytes += pl;
        if (ws->asm_total)
            *ws->asm_total += pl;
    }
    /* RFC 6455 5.5.1: a close payload is empty or starts with a 2-byte code; wslay would
     * take one byte as "no code", so fail it here. */
    if (arg->opcode == WSLAY_CONNECTION_CLOSE && arg->payload_length == 1) {
        static const char why[] = "close frame with a 1-byte payload";
        wslay_event_queue_close(ctx, WSLAY_CODE_PROTOCOL_ERROR, (const uint8_t *)why, sizeof why - 1);
        wslay_event_shutdown_read(ctx);
    }
}

static void ws_msg_cb(wslay_event_context_ptr ctx, const struct wslay_event_on_msg_recv_arg *arg,
                      void *ud)
{
    struct net_ws *ws = ud;
    if (arg->opcode == WSLAY_CONNECTION_CLOSE) {
        ws->close_code = arg->status_code ? arg->status_code : NET_WS_CODE_NO_STATUS;
        size_t rl = arg->msg_length > 2 ? arg->msg_length - 2 : 0;
        if (rl > sizeof ws->close_reason - 1)
            rl = sizeof ws->close_reason - 1;
        if (rl)
            memcpy(ws->close_reason, arg->msg + 2, rl);
        ws->close_reason[rl] = 0;
        return;
    }
    if (arg->opcode != WSLAY_TEXT_FRAME && arg->opcode != WSLAY_BINARY_FRAME)
        return; /* ping is answered by wslay; pong only refreshes last_rx */
    asm_release(ws);
    if (ws->state != NET__WS_OPEN)
        return;
    if (ws->h && ws->h->on_msg)
        ws->h->on_msg(ws, arg->opcode, arg->msg, arg->msg_length, ws->ud);
}

int net__ws_open(struct net_ws *ws)
{
    static const struct wslay_event_callbacks cbs = {
        .recv_callback = ws_recv_cb,
        .send_callback = ws_send_cb,
        .genmask_callback = ws_genmask_cb,
        .on_frame_recv_start_callback = ws_frame_start_cb,
        .on_msg_recv_callback = ws_msg_cb,
    };
    int r = ws->server ? wslay_event_context_server_init(&ws->wslay, &cbs, ws)
                       : wslay_event_context_client_init(&ws->wslay, &cbs, ws);
    if (r != 0)
        return -ENOMEM;
    wslay_event_config_set_max_recv_msg_length(ws->wslay, ws->lim.max_msg_bytes);
    ws->state = NET__WS_OPEN;
    ws->last_rx = uv_now(ws->tcp.loop);
    net__ws_deadline(ws, 0, NULL);
    return 0;
}

/* ---------------------------------------------------------------- input */

static void ws_process(struct net_ws *ws)
{
    switch (ws->state) {
    case NET__WS_HTTP:
        if (ws->client) /* server sides arrive open (ws_server.c) */
            ws->client->http_input(ws);
        if (ws->state != NET__WS_OPEN)
            break;
        /* bytes after the handshake are frames */
        __attribute__((fallthrough));
    case NET__WS_OPEN:
        if (ws->paused || ws->in_recv || !ws->wslay)
            break;
        ws->in_recv = true;
        int r = wslay_event_recv(ws->wslay);
        ws->in_recv = false;
        if (r < 0) {
            /* wslay reports some framing violations (over-long or fragmented control
             * frames) as a callback failure of the call although our receive callback
             * only ever says "would block": answer them with 1002. */
            if (r == WSLAY_ERR_NOMEM || !wslay_event_get_write_enabled(ws->wslay)) {
                net__ws_drop(ws, "receive failed");
                return;
            }
            static const char why[] = "malformed frame";
            wslay_event_shutdown_read(ws->wslay);
            wslay_event_queue_close(ws->wslay, WSLAY_CODE_PROTOCOL_ERROR, (const uint8_t *)why,
                                    sizeof why - 1);
        }
        ws_flush(ws);
        break;
    default:
        break;
    }
    if (ws->in_off == ws->in.len) {
        ws->in_off = ws->in.len = 0;
        /* an idle connection keeps no input buffer: thousands of them stay cheap */
        if (ws->in.cap > 16384 && !ws->in_recv)
            util_buf_free(&ws->in);
    } else if (ws->in_off > 0 && ws->in_off >= ws->in.cap / 2) {
        util_buf_consume(&ws->in, ws->in_off);
        ws->in_off = 0;
    }
}

/* Room for extra more input bytes, dropping the consumed ones first when there is none. */
static int ws_in_reserve(struct net_ws *ws, size_t extra)
{
    if (extra > ws->in.cap - ws->in.len) {
        util_buf_consume(&ws->in, ws->in_off);
        ws->in_off = 0;
    }
    return util_buf_reserve(&ws->in, extra, SIZE_MAX) < 0 ? -ENOMEM : 0;
}

static _Thread_local char ws_read_buf[WS_READ_CHUNK];

static void ws_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    *buf = uv_buf_init(ws_read_buf, sizeof ws_read_buf);
}

static void ws_read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct net_ws *ws = s->data;
    if (nread == 0 || ws->state == NET__WS_CLOSING)
        return;
    if (nread < 0) {
        net__ws_drop(ws, nread == UV_EOF ? "peer closed the connection" : uv_strerror((int)nread));
        return;
    }
    const uint8_t *data = (const uint8_t *)buf->base;
    if (!ws->tls_on) {
        if (ws_in_reserve(ws, (size_t)nread) < 0) {
            net__ws_drop(ws, "out of memory");
            return;
        }
        util_buf_append(&ws->in, data, (size_t)nread, SIZE_MAX);   /* room reserved */
        ws_process(ws);
        return;
    }
    if (net__tls_feed(ws->tls, data, (size_t)nread) < 0) {
        net__ws_drop(ws, "out of memory");
        return;
    }
    if (ws->state == NET__WS_TLS) {
        char why[KV_ERR_MAX];
        int hs = net__tls_handshake(ws->tls, why, sizeof why);
        if (net__ws_tls_push(ws) < 0 || hs < 0) {
            net__ws_drop(ws, hs < 0 ? why : "TLS handshake failed");
            return;
        }
        if (hs == 0)
            return;
        ws->state = NET__WS_HTTP;
        if (ws->client)
            ws->client->tls_ready(ws);
        if (ws->state == NET__WS_CLOSING)
            return;
    }
    for (;;) {
        if (ws_in_reserve(ws, 16384) < 0) {
            net__ws_drop(ws, "out of memory");
            return;
        }
        ssize_t n = net__tls_read(ws->tls, ws->in.p + ws->in.len, ws->in.cap - ws->in.len);
        if (n == 0)
            break;
        if (n < 0) {
            net__ws_tls_push(ws); /* a TLS alert for the peer, if any */
            net__ws_drop(ws, n == -EPIPE ? "peer closed TLS" : "TLS error");
            return;
        }
        ws->in.len += (size_t)n;
    }
    if (net__ws_tls_push(ws) < 0) {
        net__ws_drop(ws, "write failed");
        return;
    }
    ws_process(ws);
}

int net__ws_start_read(struct net_ws *ws)
{
    if (ws->read_active || ws->state == NET__WS_CLOSING)
        return 0;
    if (ws->over_http) {
        if (ws->hc)
            net_http_conn_read_pause(ws->hc, false);
        ws->read_active = true;
        return 0;
    }
    int r = uv_read_start((uv_stream_t *)&ws->tcp, ws_alloc_cb, ws_read_cb);
    if (r == 0)
        ws->read_active = true;
    return r;
}

/* ---------------------------------------------------------------- public */

int net_ws_send(struct net_ws *ws, int opcode, const uint8_t *data, size_t len)
{
    if (ws->state != NET__WS_OPEN || !ws->wslay || !wslay_event_get_write_enabled(ws->wslay) ||
        wslay_event_get_close_sent(ws->wslay))
        return -EPIPE;
    if (opcode != NET_WS_TEXT && opcode != NET_WS_BINARY && opcode != NET_WS_PING &&
        opcode != NET_WS_PONG)
        return -EINVAL;
    struct wslay_event_msg m = {.opcode = (uint8_t)opcode, .msg = data, .msg_length = len};
    int r = wslay_event_queue_msg(ws->wslay, &m);
    if (r == WSLAY_ERR_NO_MORE_MSG)
        return -EPIPE;
    if (r == WSLAY_ERR_NOMEM)
        return -ENOMEM;
    if (r != 0)
        return -EINVAL;
    if (net_ws_pending(ws) >= ws->lim.low_water)
        ws->above_low = true;
    ws_flush(ws);
    return 0;
}

void net_ws_close(struct net_ws *ws, int code, const char *reason)
{
    if (ws->state == NET__WS_CLOSING)
        return;
    if (ws->state != NET__WS_OPEN || !ws->wslay) {
        net__ws_drop(ws, reason);
        return;
    }
    if (!wslay_event_get_close_sent(ws->wslay)) {
        size_t rl = reason ? strlen(reason) : 0;
        if (rl > 123)
            rl = 123;
        if (wslay_event_queue_close(ws->wslay, (uint16_t)code, (const uint8_t *)reason, rl) != 0) {
            net__ws_drop(ws, reason);
            return;
        }
        uv_timer_start(&ws->timer, ws_deadline_cb, WS_CLOSE_WAIT_MS, 0);
    }
    /* A paused side must still read the peer's close frame. */
    ws->paused = false;
    net__ws_start_read(ws);
    ws_flush(ws);
}

void net_ws_abort(struct net_ws *ws)
{
    ws->abort = true;
    net__ws_drop(ws, "aborted");
}

/* ---------------------------------------------------------------- over net's HTTP server */

static void hc_data(void *ud, struct net_http_conn *c, const void *buf, size_t n)
{
    struct net_ws *ws = ud;
    if (ws->state == NET__WS_CLOSING)
        return;
    if (ws_in_reserve(ws, n) < 0) {
        net__ws_drop(ws, "out of memory");
        return;
    }
    util_buf_append(&ws->in, buf, n, SIZE_MAX);   /* room reserved */
    if (!ws->upgrading)
        ws_process(ws);
}

static void hc_writable(void *ud)
{
    struct net_ws *ws = ud;
    if (ws->state == NET__WS_CLOSING)
        return;
    if (ws->above_low && net_ws_pending(ws) < ws->lim.low_water) {
        ws->above_low = false;
        if (ws->h && ws->h->on_drain)
            ws->h->on_drain(ws, ws->ud);
    }
}

static void hc_closed(void *ud)
{
    struct net_ws *ws = ud;
    ws->hc = NULL;
    /* the server's count may be gone before our timer closes: settle it now */
    asm_release(ws);
    ws->asm_total = NULL;
    if (ws->state != NET__WS_CLOSING) {
        ws->state = NET__WS_CLOSING;
        if (ws->close_code == NET_WS_CODE_ABNORMAL)
            snprintf(ws->close_reason, sizeof ws->close_reason, "peer closed the connection");
        uv_close((uv_handle_t *)&ws->timer, ws_handle_closed);
    }
    net__ws_unref(ws);
}

static const struct net_http_upgrade_ops hc_ops = {
    .on_data = hc_data, .on_close = hc_closed, .on_writable = hc_writable,
};

int net__ws_alloc_http(struct net_ws **out, uv_loop_t *loop, const char *peer,
                       const struct net_ws_limits *lim, uint64_t *asm_total)
{
    *out = NULL;
    struct net_ws *ws = calloc(1, sizeof *ws);
    if (!ws)
        return -ENOMEM;
    ws->server = true;
    ws->over_http = true;
    ws->asm_total = asm_total;
    ws->close_code = NET_WS_CODE_ABNORMAL;
    snprintf(ws->close_reason, sizeof ws->close_reason, "connection dropped");
    ws_limits_set(ws, lim);
    uv_timer_init(loop, &ws->timer);
    ws->timer.data = ws;
    ws->tcp.loop = loop; /* only the loop pointer is used (uv_now) */
    ws->handles_open = 1;
    ws->last_rx = uv_now(loop);
    /* "1.2.3.4:5678" or "[::1]:5678" -> the address alone */
    const char *p = peer ? peer : "?";
    size_t n = strlen(p);
    const char *colon = strrchr(p, ':');
    if (p[0] == '[' && colon && colon > p && colon[-1] == ']')
        snprintf(ws->peer, sizeof ws->peer, "%.*s", (int)(colon - p - 2), p + 1);
    else if (colon && !strchr(p, ']') && strchr(p, ':') == colon)
        snprintf(ws->peer, sizeof ws->peer, "%.*s", (int)(colon - p), p);
    else
        snprintf(ws->peer, sizeof ws->peer, "%.*s", (int)(n < sizeof ws->peer ? n : sizeof ws->peer - 1), p);
    *out = ws;
    return 0;
}

int net__ws_upgrade_http(struct net_ws *ws, struct net_http_req *req, const char *response_head)
{
    if (net__ws_open(ws) < 0)
        return -ENOMEM;
    ws->upgrading = true;  /* bytes that arrive with the upgrade wait for on_open */
    int rc = net_http_upgrade(req, response_head, &hc_ops, ws, &ws->hc);
    ws->upgrading = false;
    if (rc < 0) {
        ws->hc = NULL;
        return rc;
    }
    ws->handles_open++;    /* the connection, until hc_closed */
    ws->read_active = true;
    return 0;
}

void net__ws_after_upgrade(struct net_ws *ws)
{
    if (ws->state == NET__WS_OPEN && ws->in.len > ws->in_off)
        ws_process(ws);
}

size_t net_ws_pending(const struct net_ws *ws)
{
    size_t q = ws->wslay ? wslay_event_get_queued_msg_length(ws->wslay) : 0;
    return ws_queued(ws) + q;
}

void net_ws_pause(struct net_ws *ws, bool pause)
{
    if (ws->state == NET__WS_CLOSING || ws->paused == pause)
        return;
    ws->paused = pause;
    if (pause) {
        if (ws->read_active) {
            if (ws->over_http) {
                if (ws->hc)
                    net_http_conn_read_pause(ws->hc, true);
            } else {
                uv_read_stop((uv_stream_t *)&ws->tcp);
            }
            ws->read_active = false;
        }
        return;
    }
    net__ws_start_read(ws);
    if (ws->in.len > ws->in_off)
        ws_process(ws);
}

uint64_t net_ws_last_rx(const struct net_ws *ws)
{
    return ws->last_rx;
}

const char *net_ws_peer(const struct net_ws *ws)
{
    return ws->peer;
}

void net_ws_set_user(struct net_ws *ws, const struct net_ws_handlers *h, void *ud)
{
    ws->h = h;
    ws->ud = ud;
}

void *net_ws_user(const struct net_ws *ws)
{
    return ws->ud;
}

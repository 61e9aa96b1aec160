/* Cross-file internals of net's TLS + WebSocket part (tls.c, ws.c, ws_server.c, ws_client.c).
 * Kept apart from net/internal.h so the link and HTTP parts evolve independently. */
#ifndef KV_NET_WS_INTERNAL_H
#define KV_NET_WS_INTERNAL_H

#include <sys/types.h>
#include <uv.h>
#include <wslay/wslay.h>

#include "net/net.h"
#include "util/err.h"
#include "util/util.h"

/* ---- tls.c: one TLS session over memory BIOs ---- */
struct net__tls;
/* A session for a server (sni NULL) or client (sni: host name to send, may be NULL). */
int net__tls_new(struct net__tls **out, struct net_tls_ctx *ctx, bool server, const char *sni);
void net__tls_free(struct net__tls *t);
/* Hand ciphertext from the socket to the session. 0 or -ENOMEM. */
int net__tls_feed(struct net__tls *t, const uint8_t *data, size_t len);
/* Advance the handshake: 1 done, 0 needs more input, -EPROTO failed ("TLS handshake
 * failed: <OpenSSL's reason>" in err; err may be NULL). */
int net__tls_handshake(struct net__tls *t, char *err, size_t errlen);
/* Whether the last handshake failed because the peer's certificate did not verify. */
bool net__tls_cert_rejected(const struct net__tls *t);
/* Decrypted bytes into buf: > 0 count, 0 needs more input, -EPIPE peer closed TLS,
 * -EPROTO error (renegotiation attempts land here). */
ssize_t net__tls_read(struct net__tls *t, uint8_t *buf, size_t len);
/* Encrypt plaintext (all of it). 0 or -EPROTO. */
int net__tls_write(struct net__tls *t, const uint8_t *data, size_t len);
/* Ciphertext waiting for the socket: moves it into a fresh malloc'd buffer (*buf, length
 * returned), 0 when none. */
size_t net__tls_take(struct net__tls *t, uint8_t **buf);

/* The TLS byte filter for net's HTTP server (server side, borrowing ctx). */
void net__tls_filter_init(struct net_http_filter *f, struct net_tls_ctx *ctx);

/* ---- ws_http.c: the client handshake's HTTP/1.1 response head (http-parser) ---- */
struct net__http;
struct net__http *net__http_new(void);
void net__http_free(struct net__http *h);
/* Feed bytes: 1 head complete (*used = bytes of the head in data), 0 need more (*used =
 * len), -EPROTO malformed or too long (net__http_error says why). */
int net__http_feed(struct net__http *h, const uint8_t *data, size_t len, size_t *used);
const char *net__http_error(const struct net__http *h);
int net__http_status(const struct net__http *h);
const char *net__http_accept(const struct net__http *h);
bool net__http_upgrade_ws(const struct net__http *h);
bool net__http_connection_upgrade(const struct net__http *h);
/* Does the comma-separated header value v (may be NULL) list token (case-insensitive)? */
bool net__http_has_token(const char *v, const char *token);

/* ---- ws.c: the connection ---- */
struct net_ws;
/* The client side's handshake steps (ws_client.c), reached through the connection so that
 * the core (ws.c) does not depend on the client file that sits on top of it. */
struct net__ws_client_ops {
    void (*tls_ready)(struct net_ws *ws);   /* TLS is up: send the opening handshake */
    void (*http_input)(struct net_ws *ws);  /* plaintext arrived during NET__WS_HTTP */
};

enum net__ws_state {
    NET__WS_CONNECTING,  /* client: TCP connect in progress */
    NET__WS_TLS,         /* TLS handshake */
    NET__WS_HTTP,        /* reading the HTTP request (server) or response (client) */
    NET__WS_OPEN,        /* frames flow */
    NET__WS_CLOSING,     /* handle closing; waiting for the close callbacks */
};

struct net_ws {
    uv_tcp_t tcp;
    uv_timer_t timer;            /* handshake and closing-handshake deadlines */
    uv_connect_t connect;
    uv_getaddrinfo_t gai;
    int handles_open;            /* tcp + timer; freed when both closed */
    enum net__ws_state state;
    bool server;
    bool tls_on;
    bool paused;
    bool read_active;
    bool close_after_flush;      /* HTTP reply written / close frame exchanged */
    bool in_recv;                /* inside wslay_event_recv (defer frees) */
    bool over_http;              /* carried by net's HTTP server (hc), not our own tcp */
    bool upgrading;              /* inside net_http_upgrade: hold input */
    bool abort;                  /* drop without flushing */
    struct net_http_conn *hc;    /* over_http: the connection, NULL once it is gone */
    struct net__tls *tls;
    wslay_event_context_ptr wslay;
    struct net_ws_limits lim;
    const struct net_ws_handlers *h;
    void *ud;
    /* plaintext received, not yet consumed */
    struct util_buf in;          /* in.p[in_off..in.len) not consumed yet */
    size_t in_off;
    uint64_t fr_left;            /* bytes of the current frame not yet given to wslay */
    /* plaintext produced by one flush, batched into one uv_write */
    struct util_buf out;
    size_t pending;              /* bytes handed to uv_write, not yet written */
    bool above_low;
    uint64_t last_rx;
    /* the data message being assembled: its frames and payload bytes so far, counted also
     * in *asm_total (the server's, NULL on a client) */
    uint32_t asm_frags;
    uint64_t asm_bytes;
    uint64_t *asm_total;
    int close_code;              /* what the peer sent, 1006 if none */
    char close_reason[KV_ERR_MAX];   /* a local reason (a TLS failure) can be long */
    char peer[64];
    /* HTTP state (handshake) */
    struct net__http *http;      /* handshake parser, freed once open */
    /* client side */
    const struct net__ws_client_ops *client; /* NULL on a server */
    char *host, *path, *key;
    int port;
};

/* Allocate a connection on loop (tcp + timer initialised). */
int net__ws_alloc(struct net_ws **out, uv_loop_t *loop, struct net_tls_ctx *tls, bool server,
                  const char *sni, const struct net_ws_limits *lim);
/* Start reading the socket. */
int net__ws_start_read(struct net_ws *ws);
/* Send raw plaintext bytes (HTTP) through TLS when on. */
int net__ws_write_raw(struct net_ws *ws, const uint8_t *data, size_t len);
/* Switch to framing: creates the wslay context; leftover plaintext stays in the input. */
int net__ws_open(struct net_ws *ws);
/* Move TLS ciphertext to the socket. */
int net__ws_tls_push(struct net_ws *ws);
/* Drop one reference (handles + in-flight resolver); the last frees ws after on_close. */
void net__ws_unref(struct net_ws *ws);
/* Close handles with a local reason (1006 unless a close frame arrived). */
void net__ws_drop(struct net_ws *ws, const char *reason);
/* Arm the single deadline timer (ms); its expiry drops the connection with reason. */
void net__ws_deadline(struct net_ws *ws, uint64_t ms, const char *reason);
/* A server-side connection carried by net's HTTP server (peer "ip:port"): only its timer
 * is a handle; net__ws_upgrade_http answers the request with response_head (101) and opens
 * framing; net__ws_after_upgrade processes bytes that came with the request. */
int net__ws_alloc_http(struct net_ws **out, uv_loop_t *loop, const char *peer,
                       const struct net_ws_limits *lim, uint64_t *asm_total);
int net__ws_upgrade_http(struct net_ws *ws, struct net_http_req *req, const char *response_head);
void net__ws_after_upgrade(struct net_ws *ws);

#endif

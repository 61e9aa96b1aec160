/* net — transports: byte streams over TCP or a relay's WebSocket bridge, TCP listeners, node
 * identities, the HTTP server, TLS, WebSocket, the worker -> loop handoff. Knows nothing of
 * tensors or of the ring's frames (ring/ring.h) beyond byte payloads.
 *
 * Sections: [streams], [http], [tls + websocket], [worker -> loop handoff].
 */
#ifndef KV_NET_H
#define KV_NET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "util/util.h"

/* ================================ streams ================================ */
/* A stream is a byte stream to a peer, carried by a transport behind a small vtable: TCP here,
 * a WebSocket bridge through a relay for relay:// endpoints (net/relay_link.c). The ring's
 * framed, sealed links (ring/ring.h, struct ring_link) run on top of one. A stream is closed
 * through its transport and freed only after the transport reports every handle closed
 * (libuv close callbacks). */

/* Node identity: an Ed25519 key kept in DIR/node.key (PEM, 0600), created on first use. */
struct net_identity;
int net_identity_load(struct net_identity **out, const char *dir, char *err, size_t errlen);
void net_identity_free(struct net_identity *id);
const uint8_t *net_identity_pub(const struct net_identity *id);   /* 32 bytes, borrowed */
int net_identity_sign(const struct net_identity *id, const void *msg, size_t len,
                      uint8_t sig[64]);
bool net_sig_verify(const uint8_t pub[32], const void *msg, size_t len, const uint8_t sig[64]);


/* The most bytes one message of a message-based transport (the relay's WebSocket) may carry:
 * a stream's writers send far less at a time (relay_link.c chunks to 1 MiB); this bounds only
 * what a peer can make this side buffer for one message. It covers the largest write of a
 * stream's owner (ring/link.c checks that a whole sealed ring frame fits). */
#define NET_STREAM_MSG_MAX ((256u << 20) + 64u)

struct net_stream;
struct net_stream_cbs {
    /* Dial finished: status 0 (stream up) or negative (the stream then closes). */
    void (*on_open)(struct net_stream *s, int status);
    /* Bytes received (borrowed for the call). */
    void (*on_data)(struct net_stream *s, const void *data, size_t len);
    /* Last callback: the stream is closed and freed after it returns. */
    void (*on_close)(struct net_stream *s, const char *reason);
};

/* A transport moves a stream's bytes. Implementations call the net_stream_tp_* hooks below. */
struct net_transport {
    const char *scheme;     /* "tcp", "relay" (endpoint "scheme://rest") */
    /* Start connecting to rest; call net_stream_tp_opened when the stream is up or failed.
     * A start that fails at once returns a negative code with err filled. */
    int (*dial)(struct net_stream *s, uv_loop_t *loop, const char *rest, char *err, size_t errlen);
    /* Send buf (malloc'd; ownership passes: free it when written or on close). It may call
     * net_stream_tp_written before it returns. */
    int (*write)(struct net_stream *s, uv_buf_t buf);
    /* Close; call net_stream_tp_closed exactly once when every handle is closed. */
    void (*close)(struct net_stream *s);
};
/* Register a transport for its scheme (TCP is built in). 0, -EEXIST, -ENOSPC. */
int net_transport_register(const struct net_transport *t);

/* Dial endpoint "tcp://host:port" (or a registered scheme); callbacks on the loop. 0, or a
 * negative code with err filled when the dial cannot start (no on_open then). */
int net_stream_dial(struct net_stream **out, uv_loop_t *loop, const char *endpoint,
                    const struct net_stream_cbs *cbs, void *ud, char *err, size_t errlen);
/* Send buf[len], malloc'd: ownership passes to the stream whatever the result. 0, -EPIPE
 * (closing), -ENOTCONN (not open yet) or the transport's error. */
int net_stream_write(struct net_stream *s, void *buf, size_t len);
/* Send a copy of data[len]. */
int net_stream_send(struct net_stream *s, const void *data, size_t len);
/* Close with a reason (handed to on_close). Safe from any callback; idempotent. */
void net_stream_close(struct net_stream *s, const char *reason);
void *net_stream_ud(const struct net_stream *s);
void net_stream_set_ud(struct net_stream *s, void *ud);
const char *net_stream_peer(const struct net_stream *s);   /* "127.0.0.1:4100" */
bool net_stream_is_closing(const struct net_stream *s);
uint64_t net_stream_bytes_in(const struct net_stream *s);
uint64_t net_stream_bytes_out(const struct net_stream *s);
size_t net_stream_queued(const struct net_stream *s);      /* bytes handed to the transport, unwritten */

/* Transport hooks. */
void net_stream_tp_set(struct net_stream *s, void *tp);
void *net_stream_tp(const struct net_stream *s);
void net_stream_tp_set_peer(struct net_stream *s, const char *peer);
void net_stream_tp_opened(struct net_stream *s, int status);
void net_stream_tp_data(struct net_stream *s, const void *data, size_t len);
void net_stream_tp_written(struct net_stream *s, size_t len);
void net_stream_tp_closed(struct net_stream *s);
/* The dial failed (status < 0) for reason, which the stream keeps whole as its close reason
 * (net_stream_tp_opened's is "dial PEER failed: <status>"). */
void net_stream_tp_failed(struct net_stream *s, int status, const char *reason);
/* The stream ended or failed: closes the stream with this reason. */
void net_stream_tp_error(struct net_stream *s, const char *reason);

/* The listening sockets this process was handed as systemd's socket activation hands them
 * (LISTEN_PID, LISTEN_FDS: fds 3..). Every listener of this module (net_listener_new,
 * net_http_server_listen) whose address is exactly one of theirs takes it instead of binding.
 * Read once, on the first listen or here: call it first thing in a program that forks children
 * that listen (LISTEN_PID names the process that was started, not its children). */
void net_listen_inherit(void);
/* A TCP socket listening at addr ("host:port", "[v6]:port"; port 0: a free one), close-on-exec,
 * made to be handed to a child that listens there (LISTEN_FDS): the fd with its port in *port,
 * or a negative errno (-EINVAL: not an address). */
int net_listen_fd(const char *addr, int *port);

/* TCP listener: every accepted connection becomes a stream with cbs, handed to on_accept
 * (which may set its ud) before any of its bytes are read. */
struct net_listener;
typedef void (*net_accept_cb)(struct net_listener *ls, struct net_stream *s, void *ud);
/* addr "host:port" (port 0 picks one). */
int net_listener_new(struct net_listener **out, uv_loop_t *loop, const char *addr,
                     const struct net_stream_cbs *cbs, net_accept_cb on_accept, void *ud,
                     char *err, size_t errlen);
int net_listener_port(const struct net_listener *ls);
/* Whether a listen address "host:port" reaches this machine only: 127.0.0.0/8, ::1 or an
 * IPv4-mapped 127.x address, a host name resolving to one of those. An empty host (every
 * address), any other address, and a name that does not resolve are not loopback. */
bool net_listen_addr_is_loopback(const char *addr);
/* Stop listening; ls is freed once its handle has closed, and done (may be NULL) runs then. */
void net_listener_close(struct net_listener *ls, void (*done)(void *ud), void *ud);


/* ================================== http ================================== */
/* The project's one HTTP/1.1 server (net/http*.c, prefix net_http_), on a libuv loop.
 *
 * Requests are parsed with http-parser; every limit (URL length, header bytes, header count,
 * body bytes, the time of each phase a client controls: TLS handshake, headers, body,
 * keep-alive idle, a response it does not read; connections in all and per address) is
 * bounded and a violation gets a 4xx reply and a deferred close, or for a connection over a
 * cap an immediate close; the server stays up. Keep-alive and
 * pipelining are handled (responses go out in request order). The request path is
 * percent-decoded and refused with 400 when it is not absolute or holds "." / ".." segments,
 * NUL, backslashes or "//", so handlers only ever see a clean path.
 *
 * Routes map (method, path or path prefix) to a handler. A handler answers now or later
 * (the request stays valid until it is answered or its abort callback runs) with:
 *   - net_http_reply(): a small body, copied;
 *   - net_http_reply_body(): a body readable at any offset (a mapped file, a header built in
 *     memory followed by mapped tensors, ...). The server applies HEAD, Range (one range:
 *     206 / 416), If-Range, If-None-Match against the ETag, Content-Length, and zstd
 *     Content-Encoding (chunked, compressed off the loop thread) when the client accepts it
 *     and no Range is asked. Bytes are pulled as the socket drains (backpressure) and written
 *     straight from the pointers the body hands out (no copy of a mapped window);
 *   - net_http_reply_begin() / net_http_reply_write() / net_http_reply_end(): a pushed body
 *     (chunked when its length is unknown), with a writable callback for backpressure;
 *   - net_http_upgrade(): the connection leaves HTTP (WebSocket): the handler gets raw bytes.
 * A byte filter (struct net_http_filter) can sit between the socket and HTTP (TLS).
 *
 * Ownership: the server owns its connections; a connection owns its handles and is freed
 * only in their close callbacks, never inside one of its own callbacks. All calls happen on
 * the loop thread. */

struct uv_loop_s;
struct net_http_server;   /* opaque */
struct net_http_req;      /* opaque: one request, borrowed by its handler */
struct net_http_conn;     /* opaque: a connection (used by filters and upgraded handlers) */

struct net_http_limits {
    uint32_t max_url;          /* bytes of the request target (default 2048; 414) */
    uint32_t max_header_bytes; /* all header names + values (default 16384; 431) */
    uint32_t max_headers;      /* header count (default 64, at most 256; 431) */
    uint32_t max_body;         /* request body bytes (default 1 MiB; 413) */
    uint32_t header_timeout_ms;/* first byte to end of headers (default 10000; 408) */
    uint32_t idle_timeout_ms;  /* a handler's time to answer, and a slow reader's time
                                * between bytes taken (default 60000; close) */
    uint32_t keepalive_timeout_ms; /* a kept-alive connection with no request in flight
                                * closes after this long (default: idle_timeout_ms) */
    uint32_t max_conns;        /* open connections (default 1024; extra ones are closed) */
    int zstd_level;            /* zstd level for Content-Encoding (default 3) */
    uint64_t max_send_rate;    /* bytes/s per pulled body (default 0: unlimited) */
    /* Deadlines on the phases the client controls (every phase of a connection has one). */
    uint32_t body_timeout_ms;  /* end of headers to end of body (default 30000; 408) */
    uint32_t write_timeout_ms; /* bytes wait for the client and it takes none of them (none
                                * acknowledged, none taken from the write queue) for this
                                * long: dropped, in any state, upgraded too (default 30000) */
    uint32_t handshake_timeout_ms; /* with a filter (TLS): accept to the first request byte,
                                * the handshake included (default 10000; close) */
    /* Connection caps. Every connection counts (plain, TLS, upgraded) from accept to close.
     * A new connection over a cap first makes room: the connection idle longest between
     * requests (kept alive after an answer, else one that has sent nothing yet), from the
     * same address when that cap is the one reached, is closed. Only when none is idle is
     * the new one refused: closed at once (503 first on a plain server) and logged
     * (rate-limited). */
    uint32_t max_conns_per_addr; /* from one IPv4 address or IPv6 /64 (default 256) */
    /* Memory. A compressed or filtered (TLS) body is a copy: at most copy_high_water bytes
     * of it wait for the socket per connection (default 512 KiB). zstd works on independent
     * frames per chunk with contexts pooled per server, so a client that does not read holds
     * no compressor; at most max_zstd_streams responses are compressed at once, others go
     * out unencoded (default 16). */
    uint32_t copy_high_water;
    uint32_t max_zstd_streams;
    /* The server's own error replies (413, 408, 404, ...) and net_http_reply_error as
     * {"error": {"message", "type", "code"}} application/json (a JSON API's clients read
     * every error the same way); false: text/plain. */
    bool json_errors;
};

struct net_http_stats {
    uint64_t conns_accepted, conns_open, conns_refused;
    uint64_t requests, responses_2xx, responses_3xx, responses_4xx, responses_5xx;
    uint64_t body_bytes_sent;  /* body bytes on the wire (after compression, before framing) */
    uint64_t bytes_sent, bytes_received; /* everything on the socket */
    uint64_t conns_refused_addr;   /* over max_conns_per_addr (conns_refused: over max_conns) */
    uint64_t conns_evicted;        /* idle connections closed to make room for a new one */
    uint64_t addrs;                /* distinct addresses (IPv6: /64) with open connections */
    uint64_t timeouts_handshake, timeouts_header, timeouts_body, timeouts_idle, timeouts_write;
    uint64_t queued_bytes;         /* bytes waiting for the socket, every connection */
    uint64_t zstd_active;          /* responses being compressed now */
    uint64_t zstd_declined;        /* sent unencoded because max_zstd_streams were busy */
};

/* Byte filter between the socket and HTTP (TLS lives here). All callbacks on the loop thread.
 * open: per-connection state; recv: socket bytes in, hand plaintext to net_http_conn_feed()
 * and protocol bytes to net_http_conn_send_raw(); send: plaintext out, encrypt and call
 * net_http_conn_send_raw(); close: free the state. A negative return closes the connection. */
struct net_http_filter {
    int (*open)(void *ud, struct net_http_conn *c, void **state);
    int (*recv)(void *state, struct net_http_conn *c, const void *buf, size_t n);
    int (*send)(void *state, struct net_http_conn *c, const void *buf, size_t n);
    void (*close)(void *state);
    void *ud;
};

typedef void (*net_http_handler_cb)(struct net_http_req *req, void *ud);

/* Create a server on loop (limits NULL = defaults, zero fields = defaults). */
int net_http_server_new(struct net_http_server **out, struct uv_loop_s *loop,
                        const struct net_http_limits *limits);
/* Put a filter in front of every connection accepted from now on (borrowed; NULL = none). */
void net_http_server_set_filter(struct net_http_server *s, const struct net_http_filter *f);
/* Add a route: method "GET" (also answers HEAD), "POST", ... or "*" for any; path exact, or
 * a prefix when it ends with '*' ("/v1/windows/ *" without the space). First match wins;
 * no route gives 404, a path matched for another method 405. */
int net_http_server_route(struct net_http_server *s, const char *method, const char *path,
                          net_http_handler_cb cb, void *ud);
/* Listen on "HOST:PORT" (IPv4 or [IPv6]; port 0 picks one; see net_http_server_port). */
int net_http_server_listen(struct net_http_server *s, const char *addr);
int net_http_server_port(const struct net_http_server *s);
/* Counters; borrowed, live as long as s. */
const struct net_http_stats *net_http_server_stats(const struct net_http_server *s);
/* Where the server's own lines go (refused connections, dropped slow readers), at most one
 * line a second with a count of those left out; cb NULL: nowhere (the default). */
typedef void (*net_http_log_cb)(void *ud, const char *line);
void net_http_server_set_log(struct net_http_server *s, net_http_log_cb cb, void *ud);
/* The access log: cb once per answered request when its response is all queued (complete)
 * or its connection closed first (not complete): the peer address, method, path, status,
 * response bytes (head and body) and the time since the request was dispatched. No payload.
 * Upgrades (101) are their handler's to log. cb NULL: none (the default). */
struct net_http_access {
    const char *peer, *method, *path;
    int status;
    uint64_t bytes;
    double ms;
    bool complete;
};
typedef void (*net_http_access_cb)(void *ud, const struct net_http_access *a);
void net_http_server_set_access_log(struct net_http_server *s, net_http_access_cb cb, void *ud);
/* Call cb for each address with open connections (its text as counted: "1.2.3.4" or
 * "2001:db8:1:2::/64") and its count; returns the number of addresses. */
size_t net_http_server_addrs(const struct net_http_server *s,
                             void (*cb)(void *ud, const char *addr, uint32_t n), void *ud);
/* Stop listening, close every connection (pending requests get their abort callback), and
 * free the server once every handle is closed; done (may be NULL) runs then. */
void net_http_server_close(struct net_http_server *s, void (*done)(void *ud), void *ud);

/* Request accessors (borrowed, valid until the request is answered or aborted). */
const char *net_http_req_method(const struct net_http_req *r);   /* "GET", "HEAD", ... */
const char *net_http_req_path(const struct net_http_req *r);     /* decoded, clean */
const char *net_http_req_query(const struct net_http_req *r);    /* raw, "" when none */
/* Header value by name (case-insensitive), NULL when absent; the first when repeated. */
const char *net_http_req_header(const struct net_http_req *r, const char *name);
size_t net_http_req_header_count(const struct net_http_req *r);
void net_http_req_header_at(const struct net_http_req *r, size_t i, const char **name,
                            const char **value);
const void *net_http_req_body(const struct net_http_req *r, size_t *len);
bool net_http_req_is_head(const struct net_http_req *r);
bool net_http_req_is_upgrade(const struct net_http_req *r);
bool net_http_req_is_http10(const struct net_http_req *r);      /* HTTP/1.0 request */
/* Peer address as "ip:port". */
const char *net_http_req_peer(const struct net_http_req *r);
/* The peer's address as the server's per-address caps count it: an IPv4 address, or the /64
 * of an IPv6 one ("2001:db8::/64"). */
const char *net_http_req_addr(const struct net_http_req *r);
struct net_http_conn *net_http_req_conn(struct net_http_req *r);
/* Called if the connection goes away before the request is answered (async handlers), or
 * before a pushed body's net_http_reply_end (a streaming client that left): the request is
 * gone once it returns. */
void net_http_req_set_abort(struct net_http_req *r, void (*abort_cb)(void *ud), void *ud);

/* Answer with a copied body (NULL/0 for none). extra_headers: "Name: value\r\n" lines or
 * NULL. Returns 0 or a negative code (the request is then answered with 500). */
int net_http_reply(struct net_http_req *r, int status, const char *content_type,
                   const char *extra_headers, const void *body, size_t len);
/* Answer with a status and a plain-text reason (4xx/5xx helpers). */
int net_http_reply_error(struct net_http_req *r, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A body readable at any offset. read() returns the number of bytes (1..max) available at
 * off and sets *ptr either to memory that stays valid until release() (zero-copy) or to
 * scratch (max bytes, filled by read; the server copies it); negative on error (the
 * connection is closed). release() runs exactly once, when the server is done with it. */
struct net_http_body {
    uint64_t size;
    const char *etag;           /* strong ETag with quotes, or NULL (copied) */
    bool compressible;          /* zstd allowed when the client accepts it */
    ptrdiff_t (*read)(void *ud, uint64_t off, void *scratch, size_t max, const void **ptr);
    void (*release)(void *ud);
    void *ud;
};
int net_http_reply_body(struct net_http_req *r, int status, const char *content_type,
                        const char *extra_headers, const struct net_http_body *body);

/* Pushed body: len = UINT64_MAX for chunked. write() copies; writable (may be NULL) runs when
 * the queue has drained below the low-water mark. end() finishes the response. */
int net_http_reply_begin(struct net_http_req *r, int status, const char *content_type,
                         const char *extra_headers, uint64_t len,
                         void (*writable)(void *ud), void *ud);
int net_http_reply_write(struct net_http_req *r, const void *buf, size_t len);
size_t net_http_reply_queued(const struct net_http_req *r);   /* bytes not yet on the wire */
int net_http_reply_end(struct net_http_req *r);

/* Leave HTTP: send the response head (status line + headers, ending with an empty line,
 * copied), then every byte the client sends (including bytes already received after the
 * request) goes to on_data; on_close runs once when the connection is gone (last call). */
struct net_http_upgrade_ops {
    void (*on_data)(void *ud, struct net_http_conn *c, const void *buf, size_t n);
    void (*on_close)(void *ud);
    void (*on_writable)(void *ud);  /* write queue drained below the low-water mark; may be NULL */
};
int net_http_upgrade(struct net_http_req *r, const char *response_head,
                     const struct net_http_upgrade_ops *ops, void *ud,
                     struct net_http_conn **conn);

/* Connection-level calls (filters and upgraded handlers). */
int net_http_conn_write(struct net_http_conn *c, const void *buf, size_t n); /* copies; via filter */
int net_http_conn_send_raw(struct net_http_conn *c, const void *buf, size_t n); /* to the socket */
int net_http_conn_feed(struct net_http_conn *c, const void *buf, size_t n); /* filter plaintext in */
size_t net_http_conn_queued(const struct net_http_conn *c);   /* bytes waiting for the socket */
void net_http_conn_read_pause(struct net_http_conn *c, bool pause);
/* Close after what is queued has been written. */
void net_http_conn_close(struct net_http_conn *c);
/* Close now, dropping what is queued (a peer that stopped reading). */
void net_http_conn_abort(struct net_http_conn *c);
const char *net_http_conn_peer(const struct net_http_conn *c);

/* Helpers. Parse a Range header against size: 1 and [*first, *last] inclusive for one
 * satisfiable range, 0 when there is none or it is to be ignored (syntax, several ranges),
 * -ERANGE when unsatisfiable. */
int net_http_range_parse(const char *h, uint64_t size, uint64_t *first, uint64_t *last);
/* Percent-decode and check a request path; 0 or -EINVAL (why in err). */
int net_http_path_clean(const char *in, size_t n, char *out, size_t outlen, char *err,
                        size_t errlen);
/* Whether an Accept-Encoding value accepts coding ("zstd") with a non-zero q. */
bool net_http_accepts(const char *accept_encoding, const char *coding);
const char *net_http_status_text(int status);

/* =========================== tls + websocket ============================== */

/* TLS (OpenSSL over memory BIOs, driven from libuv): TLS 1.2 and 1.3 only, renegotiation
 * refused, compression off. WebSocket (RFC 6455 framing by wslay): a server built on net's
 * HTTP server above (its upgrade hook; TLS as its byte filter) that answers plain GETs and
 * upgrades requests to WebSocket, and a client (dial ws:// or wss://, its handshake parsed
 * with http-parser). All calls run on the loop thread; every connection is freed by the
 * library after its on_close callback. */

struct uv_loop_s;

/* A TLS configuration shared by many connections. */
struct net_tls_ctx;
/* Server context from PEM certificate chain and key files; 0, or -EINVAL/-ENOMEM with err
 * naming the file and OpenSSL's reason. */
int net_tls_ctx_server_new(struct net_tls_ctx **out, const char *cert_file, const char *key_file,
                           char *err, size_t errlen);
/* Client context; ca_file NULL and verify false accepts any certificate (tests, pinned by
 * the end-to-end HELLO); ca_file NULL and verify true uses the system store. 0, or negative
 * with err filled. */
int net_tls_ctx_client_new(struct net_tls_ctx **out, const char *ca_file, bool verify, char *err,
                           size_t errlen);
void net_tls_ctx_free(struct net_tls_ctx *ctx);
/* f: TLS as the byte filter of an HTTP server (net_http_server_set_filter), with a server
 * ctx; the filter borrows ctx, and both must outlive the server. */
void net_tls_filter_init(struct net_http_filter *f, struct net_tls_ctx *ctx);

/* WebSocket opcodes and the close codes Kvasir uses (RFC 6455 section 7.4; 4xxx are ours). */
enum {
    NET_WS_TEXT = 0x1, NET_WS_BINARY = 0x2, NET_WS_CLOSE = 0x8, NET_WS_PING = 0x9, NET_WS_PONG = 0xa,
};
enum {
    NET_WS_CODE_NORMAL = 1000, NET_WS_CODE_GOING_AWAY = 1001, NET_WS_CODE_PROTOCOL = 1002,
    NET_WS_CODE_NO_STATUS = 1005, NET_WS_CODE_ABNORMAL = 1006, NET_WS_CODE_BAD_DATA = 1007,
    NET_WS_CODE_POLICY = 1008, NET_WS_CODE_TOO_BIG = 1009, NET_WS_CODE_TRY_LATER = 1013,
    NET_WS_CODE_PARTNER_TIMEOUT = 4001, /* relay: no partner within the wait time */
    NET_WS_CODE_PARTNER_GONE = 4002,    /* relay: the other end of the bridge dropped */
    NET_WS_CODE_DUP_ROLE = 4003,        /* relay: that role of the bridge is already taken */
    NET_WS_CODE_BAD_ROLE = 4004,        /* relay: first message was not a 1-byte role */
    NET_WS_CODE_BAD_BRIDGE = 4005,      /* relay: bridge id not of the allowed form */
    NET_WS_CODE_IDLE = 4008,            /* relay: nothing received within the idle time */
};

/* Sec-WebSocket-Accept for a Sec-WebSocket-Key: base64(SHA-1(key + GUID)) into out[29]
 * (28 characters + NUL). 0 or -EINVAL when key is not base64 of 16 bytes. */
int net_ws_accept_key(const char *key, char out[29]);

/* One WebSocket connection (server or client side). Opaque; owned by the library. */
struct net_ws;
struct net_ws_handlers {
    /* The handshake completed (both sides; on a server right after the 101); can send. */
    void (*on_open)(struct net_ws *ws, void *ud);
    /* A complete data message (text or binary); data lives until the callback returns. */
    void (*on_msg)(struct net_ws *ws, int opcode, const uint8_t *data, size_t len, void *ud);
    /* Bytes queued for sending dropped below the low-water mark after being above it. */
    void (*on_drain)(struct net_ws *ws, void *ud);
    /* The connection is gone (any reason). code/reason: what the peer sent in its close
     * frame, or 1006 and a local description. ws is freed right after this returns. */
    void (*on_close)(struct net_ws *ws, int code, const char *reason, void *ud);
};
struct net_ws_limits {
    uint64_t max_msg_bytes;    /* a larger incoming message closes with 1009 (0: 16 MiB) */
    size_t low_water;          /* on_drain fires when pending send bytes fall below (0: 256 KiB) */
    uint32_t max_conns;        /* server: open connections, upgraded or not (0: 65536) */
    /* A message being assembled from fragments costs what its frames carry plus a little per
     * frame, so both are capped: more frames than max_fragments in one message close with
     * 1009 (0: 1024); on a server, the payload bytes of every message being assembled, all
     * connections together, stay under max_assembly (0: 256 MiB; a frame that would pass it
     * closes its connection with 1013). */
    uint32_t max_fragments;
    uint64_t max_assembly;
    /* server: passed to its HTTP server (struct net_http_limits; 0: that default) */
    uint32_t max_conns_per_addr, header_timeout_ms, write_timeout_ms;
};

/* Queue a message (copied). 0, -EPIPE once closing, -EINVAL for bad opcode or size. */
int net_ws_send(struct net_ws *ws, int opcode, const uint8_t *data, size_t len);
/* Start the closing handshake with code and reason (<= 123 bytes); the connection is
 * dropped after the peer answers or after 2 s. Idempotent. */
void net_ws_close(struct net_ws *ws, int code, const char *reason);
/* Drop the connection now, no closing handshake. */
void net_ws_abort(struct net_ws *ws);
/* Bytes queued for sending that the kernel has not taken yet. */
size_t net_ws_pending(const struct net_ws *ws);
/* Whether the connection failed because the peer's TLS certificate did not verify (a dialled
 * wss:// URL; the close reason names the problem). */
bool net_ws_cert_rejected(const struct net_ws *ws);
/* Stop (true) or resume (false) reading from the peer: the peer is slowed by TCP. */
void net_ws_pause(struct net_ws *ws, bool pause);
/* Loop time (uv_now, ms) when the last frame of any kind arrived. */
uint64_t net_ws_last_rx(const struct net_ws *ws);
/* The peer's address as text ("1.2.3.4", "::1"); borrowed, lives as long as ws. */
const char *net_ws_peer(const struct net_ws *ws);
void net_ws_set_user(struct net_ws *ws, const struct net_ws_handlers *h, void *ud);
void *net_ws_user(const struct net_ws *ws);

/* Dial a WebSocket URL: ws://host:port/path or wss://host:port/path (tls required for wss).
 * Handlers fire later on the loop; on failure before the handshake, on_close gets 1006
 * and a reason. 0, or negative errno with err filled for a malformed URL or a failed start
 * (no handler runs then). */
int net_ws_dial(struct net_ws **out, struct uv_loop_s *loop, const char *url,
                struct net_tls_ctx *tls, const struct net_ws_limits *lim,
                const struct net_ws_handlers *h, void *ud, char *err, size_t errlen);

/* The server side: net's HTTP server with one catch-all route (keep-alive for plain GETs). */
struct net_ws_server;
struct net_ws_reply {          /* filled by on_get for a plain GET */
    int status;                /* e.g. 200, 404 */
    const char *content_type;
    char *body;                /* malloc'd; the server frees it */
    size_t body_len;
};
struct net_ws_server_handlers {
    /* A valid upgrade request for path from peer: return 0 and set *h and *ud to accept (the 101
     * is sent and ws handlers take over), or an HTTP status (>= 400) to refuse. */
    int (*on_upgrade)(struct net_ws_server *srv, struct net_ws *ws, const char *path,
                      const struct net_ws_handlers **h, void **ud, void *srv_ud);
    /* A plain GET/HEAD: fill reply (status 404 if left 0). */
    void (*on_get)(struct net_ws_server *srv, const char *path, struct net_ws_reply *reply,
                   void *srv_ud);
};
/* Listen on addr "host:port" (port 0 picks one); tls NULL = plain ws (tests, trusted LAN).
 * The server borrows tls. 0, or negative errno with err filled. */
int net_ws_server_new(struct net_ws_server **out, struct uv_loop_s *loop, const char *addr,
                      struct net_tls_ctx *tls, const struct net_ws_limits *lim,
                      const struct net_ws_server_handlers *h, void *ud, char *err,
                      size_t errlen);
/* The bound port. */
int net_ws_server_port(const struct net_ws_server *srv);
/* The HTTP server underneath (borrowed, lives as long as srv): its stats, per-address counts
 * and log (net_http_server_stats, net_http_server_addrs, net_http_server_set_log). */
struct net_http_server *net_ws_server_http(struct net_ws_server *srv);
/* Payload bytes of messages being assembled from fragments, all connections. */
uint64_t net_ws_server_assembling(const struct net_ws_server *srv);
/* Stop listening and abort every connection; the server is freed once all handles have
 * closed (run the loop), and done (may be NULL) runs then. */
void net_ws_server_close(struct net_ws_server *srv, void (*done)(void *ud), void *ud);

/* Streams through a relay (a net_stream transport, what ring links run on): relay://HOST:PORT/b/<bridge-id> dials
 * wss://HOST:PORT/v1/bridge/<bridge-id>, relay+ws:// the same over plain ws. Dialling the
 * endpoint makes this side the upstream end (role 0x01); appending "?role=down" makes it the
 * downstream end (0x02), which is what the stage owning the endpoint does instead of
 * listening. Server certificates: system store, or $KV_RELAY_CA; KV_RELAY_INSECURE=1 skips
 * the check. Register once before dialling (idempotent): 0 or negative errno. */
int net_relay_transport_register(void);
/* Is endpoint a relay:// or relay+ws:// endpoint? */
bool net_relay_endpoint(const char *endpoint);

/* ========================= worker -> loop handoff ========================= */
/* How a worker thread hands results back to a libuv loop (the event loop never computes:
 * docs/design.md, "The ring data path"). Items are the caller's own structs with a struct
 * net_handoff_link inside (the queue never allocates per item, so a push cannot fail);
 * net_handoff_push appends from any thread under a mutex and wakes the loop (uv_async_send);
 * on the loop thread the whole list is taken under the mutex and each item goes to deliver
 * outside it, in push order (one thread's items in the order it pushed them). Items still
 * queued when the queue closes go to drop, never to deliver. */
struct net_handoff_link {
    struct net_handoff_link *next;   /* the queue's while the item is in it */
};
struct net_handoff;
/* An item handed back (its link cleared); ud is net_handoff_new's. The callee owns it. */
typedef void (*net_handoff_cb)(struct net_handoff_link *item, void *ud);
typedef void (*net_handoff_closed_cb)(void *ud);
/* On the loop thread: a queue whose items are delivered on loop's thread. drop takes the
 * items still queued at close (may be NULL when none can be). 0, -ENOMEM or libuv's error;
 * nothing to close on failure. */
int net_handoff_new(struct net_handoff **out, uv_loop_t *loop, net_handoff_cb deliver,
                    net_handoff_cb drop, void *ud);
/* From any thread: item queued (the queue owns it until deliver or drop), the loop woken. */
void net_handoff_push(struct net_handoff *q, struct net_handoff_link *item);
/* items[0..n) queued in order under one lock, one wake-up for all. */
void net_handoff_push_n(struct net_handoff *q, struct net_handoff_link **items, size_t n);
/* On the loop thread: deliver what is queued now, without waiting for the async callback
 * (an owner that has just joined its workers takes their last items this way). */
void net_handoff_drain(struct net_handoff *q);
/* On the loop thread, once no thread can push any more (the workers joined): closes the
 * async handle; in its close callback the items still queued go to drop, the queue is freed,
 * then closed(ud) runs (may be NULL). q NULL: nothing happens, closed is not called. */
void net_handoff_close(struct net_handoff *q, net_handoff_closed_cb closed, void *ud);

#endif

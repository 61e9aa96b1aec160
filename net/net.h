/* net — libuv links, ring framing and handshake, HTTP server/client, TLS, WebSocket bridge.
 * Knows nothing of tensors beyond byte payloads.
 *
 * Sections: [frames + links] (issue 5), [http] (issue 7), [tls + websocket] (issue 8).
 */
#ifndef KV_NET_H
#define KV_NET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ============================= frames + links ============================= */

/* ================================== http ================================== */
/* The project's one HTTP/1.1 server (net/http*.c, prefix net_http_), on a libuv loop.
 *
 * Requests are parsed with http-parser; every limit (URL length, header bytes, header count,
 * body bytes, time to receive the headers, keep-alive idle time, connections) is bounded and a
 * violation gets a 4xx reply and a deferred close; the server stays up. Keep-alive and
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
    uint32_t idle_timeout_ms;  /* keep-alive idle time (default 60000) */
    uint32_t max_conns;        /* open connections (default 1024; extra ones are closed) */
    int zstd_level;            /* zstd level for Content-Encoding (default 3) */
};

struct net_http_stats {
    uint64_t conns_accepted, conns_open, conns_refused;
    uint64_t requests, responses_2xx, responses_3xx, responses_4xx, responses_5xx;
    uint64_t body_bytes_sent;  /* body bytes on the wire (after compression, before framing) */
    uint64_t bytes_sent, bytes_received; /* everything on the socket */
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
const struct net_http_stats *net_http_server_stats(const struct net_http_server *s);
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
/* Peer address as "ip:port". */
const char *net_http_req_peer(const struct net_http_req *r);
struct net_http_conn *net_http_req_conn(struct net_http_req *r);
/* Called if the connection goes away before the request is answered (async handlers). */
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

#endif

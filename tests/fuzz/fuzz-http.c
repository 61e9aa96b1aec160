/* fuzz-http — libFuzzer target for what an HTTP client controls: the request byte stream to
 * the net_http server (over a real loopback connection, delivered in input-chosen pieces,
 * through routes with small, pulled (Range/zstd), pushed and upgraded answers), and the
 * pure helpers (path cleaning, Range and Accept-Encoding parsing).
 * The first byte picks the mode and the piece size; the server must answer or close, never
 * hang, and every connection must be gone after the client's EOF.
 * fuzz-modules: util net */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "net/net.h"
#include "tests/lib/fuzz_client.h"
#include "util/util.h"

static uv_loop_t loop;
static struct net_http_server *srv;
static int port;
static unsigned char body[200000];

static void h_hello(struct net_http_req *r, void *ud)
{
    (void)ud;
    net_http_reply(r, 200, "text/plain", NULL, "hi\n", 3);
}

static ptrdiff_t b_read(void *ud, uint64_t off, void *scratch, size_t max, const void **ptr)
{
    (void)ud;
    if (off & 1) { /* alternate the zero-copy and the copy paths */
        size_t n = max < 777 ? max : 777;
        memcpy(scratch, body + off, n);
        *ptr = scratch;
        return (ptrdiff_t)n;
    }
    *ptr = body + off;
    return (ptrdiff_t)max;
}

static void h_body(struct net_http_req *r, void *ud)
{
    (void)ud;
    struct net_http_body b = {sizeof body, "\"b\"", true, b_read, NULL, NULL};
    net_http_reply_body(r, 200, "application/octet-stream", NULL, &b);
}

static void h_push(struct net_http_req *r, void *ud)
{
    (void)ud;
    size_t n;
    const void *in = net_http_req_body(r, &n);
    net_http_reply_begin(r, 200, "text/plain", NULL, UINT64_MAX, NULL, NULL);
    net_http_reply_write(r, in ? in : "", in ? n : 0);
    net_http_reply_write(r, net_http_req_path(r), strlen(net_http_req_path(r)));
    net_http_reply_end(r);
}

static void up_data(void *ud, struct net_http_conn *c, const void *buf, size_t n)
{
    (void)ud;
    net_http_conn_write(c, buf, n);
}
static void up_close(void *ud) { (void)ud; }
static const struct net_http_upgrade_ops up_ops = {up_data, up_close, NULL};

static void h_up(struct net_http_req *r, void *ud)
{
    (void)ud;
    if (!net_http_req_is_upgrade(r) || net_http_req_header(r, "x-refuse")) {
        net_http_reply_error(r, 426, "no");
        return;
    }
    net_http_upgrade(r, "HTTP/1.1 101 Switching Protocols\r\n\r\n", &up_ops, NULL, NULL);
}

static void setup(void)
{
    if (srv)
        return;
    for (size_t i = 0; i < sizeof body; i++)
        body[i] = (unsigned char)(i * 7 + (i >> 9));
    uv_loop_init(&loop);
    struct net_http_limits lim = {.max_url = 512, .max_header_bytes = 2048, .max_headers = 16,
                                  .max_body = 4096, .header_timeout_ms = 2000,
                                  .idle_timeout_ms = 2000};
    if (net_http_server_new(&srv, &loop, &lim) || net_http_server_route(srv, "GET", "/hello", h_hello, NULL) ||
        net_http_server_route(srv, "GET", "/body*", h_body, NULL) ||
        net_http_server_route(srv, "*", "/push/*", h_push, NULL) ||
        net_http_server_route(srv, "GET", "/up", h_up, NULL) ||
        net_http_server_listen(srv, "127.0.0.1:0"))
        abort();
    port = net_http_server_port(srv);
}

static bool conns_open(void *ud)
{
    (void)ud;
    return net_http_server_stats(srv)->conns_open > 0;
}

/* Drive one client connection: send data in pieces, then EOF; read until the server closes;
 * the server side must go away too (close callbacks, pending zstd work). */
static void drive(const uint8_t *data, size_t size, size_t piece)
{
    fuzz_client_drive(&loop, port, data, size, piece, true, NULL, 0, "fuzz-http");
    fuzz_client_settle(&loop, conns_open, NULL, "fuzz-http", "a connection outlived its client");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    setup();
    uint8_t mode = data[0];
    data++;
    size--;
    if (mode < 32) { /* helpers on a NUL-terminated copy */
        char *s = malloc(size + 1);
        memcpy(s, data, size);
        s[size] = 0;
        char out[600], err[160];
        if (net_http_path_clean(s, strlen(s), out, sizeof out, err, sizeof err) == 0) {
            if (out[0] != '/' || strstr(out, "/../") || strstr(out, "//") || strchr(out, '\\'))
                abort(); /* a "clean" path that is not */
        }
        uint64_t a = 0, b = 0;
        int k = net_http_range_parse(s, (uint64_t)mode * 1000 + 1, &a, &b);
        if (k == 1 && (a > b || b >= (uint64_t)mode * 1000 + 1))
            abort();
        net_http_accepts(s, "zstd");
        free(s);
        return 0;
    }
    drive(data, size, (size_t)(mode - 31) * 16);
    return 0;
}

/* fuzz-ws — libFuzzer target for what a WebSocket client controls after the handshake: the
 * frame byte stream into net's WebSocket server (wslay under our header screening), over a
 * real loopback connection, delivered in input-chosen pieces, with an echo handler that
 * sends every message back. The first byte picks the piece size and whether messages are
 * echoed; the server must close the connection after the client's EOF, never hang.
 * fuzz-modules: util net */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <uv.h>

#include "net/net.h"
#include "util/util.h"

static uv_loop_t loop;
static struct net_ws_server *srv;
static int port;
static bool echo;
static int open_conns;

static void e_msg(struct net_ws *ws, int op, const uint8_t *d, size_t n, void *ud)
{
    if (echo)
        net_ws_send(ws, op, d, n);
    if (n == 3 && !memcmp(d, "bye", 3))
        net_ws_close(ws, NET_WS_CODE_NORMAL, "bye");
}

static void e_open(struct net_ws *ws, void *ud)
{
    open_conns++;
}

static void e_close(struct net_ws *ws, int code, const char *reason, void *ud)
{
    open_conns--;
}

static const struct net_ws_handlers eh = {.on_open = e_open, .on_msg = e_msg, .on_close = e_close};

static int up(struct net_ws_server *s, struct net_ws *ws, const char *path,
              const struct net_ws_handlers **h, void **ud, void *sud)
{
    *h = &eh;
    *ud = NULL;
    return 0;
}

static const struct net_ws_server_handlers sh = {.on_upgrade = up};

static int setup(void)
{
    uv_loop_init(&loop);
    struct net_ws_limits lim = {.max_msg_bytes = 8192, .low_water = 4096};
    if (net_ws_server_new(&srv, &loop, "127.0.0.1:0", NULL, &lim, &sh, NULL, NULL, 0) < 0)
        return -1;
    port = net_ws_server_port(srv);
    return 0;
}

static void spin(void)
{
    uv_run(&loop, UV_RUN_NOWAIT);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool ready;
    if (!ready) {
        if (setup() < 0)
            abort();
        ready = true;
    }
    if (size < 1)
        return 0;
    size_t piece = 1 + (data[0] & 0x3f) * 37;
    echo = data[0] & 0x40;
    data++;
    size--;
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    /* its TIME_WAIT must not hold the port against other tests' listeners (fuzz_client.h) */
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    fcntl(fd, F_SETFL, O_NONBLOCK);
    connect(fd, (struct sockaddr *)&a, sizeof a);
    static const char req[] = "GET /f HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                              "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";
    size_t off = 0, req_off = 0;
    char sink[65536];
    bool eof = false;
    double t0 = util_now_s();
    while (util_now_s() - t0 < 5) {
        spin();
        if (req_off < sizeof req - 1) {
            ssize_t w = send(fd, req + req_off, sizeof req - 1 - req_off, MSG_NOSIGNAL);
            if (w > 0)
                req_off += (size_t)w;
        } else if (off < size) {
            size_t n = size - off < piece ? size - off : piece;
            ssize_t w = send(fd, data + off, n, MSG_NOSIGNAL);
            if (w > 0)
                off += (size_t)w;
            else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != ENOTCONN)
                off = size; /* the server closed on us: done sending */
        } else if (!eof) {
            shutdown(fd, SHUT_WR);
            eof = true;
        }
        ssize_t r = recv(fd, sink, sizeof sink, 0);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != ENOTCONN))
            break; /* the server closed the connection */
    }
    close(fd);
    /* every connection must be gone once the client is */
    t0 = util_now_s();
    while (open_conns > 0 && util_now_s() - t0 < 5)
        spin();
    if (open_conns > 0) {
        fprintf(stderr, "fuzz-ws: %d connection(s) still open 5 s after the client left\n", open_conns);
        abort();
    }
    return 0;
}

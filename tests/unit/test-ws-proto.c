/* WebSocket protocol table (Autobahn-style): a raw client sends well-formed and malformed
 * handshakes and frames to the relay's WebSocket server and checks the answer: the HTTP
 * status for handshakes, the close code for frames, the echo for pings. */
#include "tests/lib/ws_tc.h"

static struct tc_relay R;

T_CASE(accept_key_rfc_example)
{
    char out[29];
    T_CHECK(net_ws_accept_key("dGhlIHNhbXBsZSBub25jZQ==", out) == 0, "valid key refused");
    T_CHECK(!strcmp(out, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="), "RFC 6455 example gave %s", out);
    T_CHECK(net_ws_accept_key("dGhlIHNhbXBsZSBub25jZQ", out) < 0, "unpadded key accepted");
    T_CHECK(net_ws_accept_key("dGhlIHNhbXBsZSBub25j", out) < 0, "12-byte key accepted");
    T_CHECK(net_ws_accept_key("dGhlIHNhbXBsZSBub2!jZQ==", out) < 0, "bad base64 accepted");
    T_CHECK(net_ws_accept_key(NULL, out) < 0, "NULL key accepted");
}

struct hs_case {
    const char *name;
    const char *req;
    int status;
    const char *must_contain;
};

#define KEY "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
#define ID "0123456789abcdef0123456789abcdef"

static const struct hs_case hs_cases[] = {
    {"valid", "GET /v1/bridge/" ID " HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
              "Connection: keep-alive, Upgrade\r\n" KEY "Sec-WebSocket-Version: 13\r\n\r\n",
     101, "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo="},
    {"missing key", "GET /v1/bridge/" ID " HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                    "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\r\n", 400, NULL},
    {"key of 12 bytes", "GET /v1/bridge/" ID " HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                        "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25j\r\n"
                        "Sec-WebSocket-Version: 13\r\n\r\n", 400, NULL},
    {"key not base64", "GET /v1/bridge/" ID " HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                       "Connection: Upgrade\r\nSec-WebSocket-Key: !!!!!!!!!!!!!!!!!!!!!!==\r\n"
                       "Sec-WebSocket-Version: 13\r\n\r\n", 400, NULL},
    {"version 8", "GET /v1/bridge/" ID " HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                  "Connection: Upgrade\r\n" KEY "Sec-WebSocket-Version: 8\r\n\r\n",
     426, "Sec-WebSocket-Version: 13"},
    {"no version", "GET /v1/bridge/" ID " HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                   "Connection: Upgrade\r\n" KEY "\r\n", 426, NULL},
    {"no Connection: Upgrade", "GET /v1/bridge/" ID " HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                               KEY "Sec-WebSocket-Version: 13\r\n\r\n", 400, NULL},
    {"POST upgrade", "POST /v1/bridge/" ID " HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                     "Connection: Upgrade\r\n" KEY "Sec-WebSocket-Version: 13\r\nContent-Length: 0\r\n\r\n",
     400, NULL},
    {"HTTP/1.0 upgrade", "GET /v1/bridge/" ID " HTTP/1.0\r\nHost: x\r\nUpgrade: websocket\r\n"
                         "Connection: Upgrade\r\n" KEY "Sec-WebSocket-Version: 13\r\n\r\n", 400, NULL},
    {"other path", "GET /v1/other HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                   "Connection: Upgrade\r\n" KEY "Sec-WebSocket-Version: 13\r\n\r\n", 404, NULL},
    {"plain GET unknown", "GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n", 404, NULL},
    {"plain GET status", "GET /v1/relay/status HTTP/1.1\r\nHost: x\r\n\r\n", 200, "application/json"},
    {"plain GET metrics", "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", 200, "text/plain; version=0.0.4"},
    {"DELETE", "DELETE /v1/relay/status HTTP/1.1\r\nHost: x\r\n\r\n", 405, "Allow: GET"},
    {"garbage", "\x16\x03\x01 not http at all\r\n\r\n", 400, NULL},
};

T_CASE(handshake_table)
{
    for (size_t i = 0; i < sizeof hs_cases / sizeof hs_cases[0]; i++) {
        const struct hs_case *c = &hs_cases[i];
        uint64_t t0 = tc_now_ms();
        int fd = tc_connect(R.port);
        T_ASSERT(fd >= 0, "connect to relay port %d", R.port);
        char resp[2048];
        int st = tc_http(fd, c->req, resp, sizeof resp);
        T_CHECK(st == c->status, "%s: HTTP %d, expected %d", c->name, st, c->status);
        if (c->must_contain)
            T_CHECK(strstr(resp, c->must_contain) != NULL, "%s: response lacks \"%s\": %s",
                    c->name, c->must_contain, resp);
        close(fd);
        T_CHECK(tc_now_ms() - t0 < 2000, "%s: took %llu ms", c->name, (unsigned long long)(tc_now_ms() - t0));
    }
}

T_CASE(oversized_head_refused)
{
    int fd = tc_connect(R.port);
    T_ASSERT(fd >= 0, "connect");
    char *req = malloc(20000);
    int n = snprintf(req, 20000, "GET / HTTP/1.1\r\nX-Big: ");
    memset(req + n, 'a', 16000);
    strcpy(req + n + 16000, "\r\n\r\n");
    char resp[1024];
    int st = tc_http(fd, req, resp, sizeof resp);
    T_CHECK(st == 431, "16 KB header: HTTP %d, expected 431", st);
    free(req);
    close(fd);
}

/* One frame-level case: frames to send after a valid upgrade, the close code expected. */
struct fr_case {
    const char *name;
    int code;             /* expected close code from the relay */
    void (*send)(int fd);
};

static void f_unmasked(int fd) { tc_frame(fd, true, 0, 0x2, false, "\x01", 1); }
static void f_bad_utf8(int fd) { tc_send(fd, 0x1, "ok \xc3\x28 bad", 10); }
static void f_utf8_split_bad(int fd)
{
    tc_frame(fd, false, 0, 0x1, true, "abc\xe2\x82", 5);
    tc_frame(fd, true, 0, 0x0, true, "\x41", 1); /* E2 82 41: truncated sequence */
}
static void f_frag_ping(int fd) { tc_frame(fd, false, 0, 0x9, true, "p", 1); }
static void f_long_ping(int fd)
{
    char p[126];
    memset(p, 'x', sizeof p);
    tc_send(fd, 0x9, p, sizeof p);
}
static void f_rsv1(int fd) { tc_frame(fd, true, 4, 0x2, true, "\x01", 1); }
static void f_rsv2(int fd) { tc_frame(fd, true, 2, 0x2, true, "\x01", 1); }
static void f_rsv3(int fd) { tc_frame(fd, true, 1, 0x2, true, "\x01", 1); }
static void f_op3(int fd) { tc_send(fd, 0x3, "x", 1); }
static void f_op7(int fd) { tc_send(fd, 0x7, "x", 1); }
static void f_opb(int fd) { tc_send(fd, 0xb, "x", 1); }
static void f_opf(int fd) { tc_send(fd, 0xf, "x", 1); }
static void f_cont_first(int fd) { tc_frame(fd, true, 0, 0x0, true, "x", 1); }
static void f_new_msg_in_frag(int fd)
{
    tc_frame(fd, false, 0, 0x2, true, "a", 1);
    tc_frame(fd, true, 0, 0x2, true, "b", 1);
}
static void f_oversize(int fd)
{
    size_t n = 70000; /* relay configured with max_msg_bytes 65536 */
    char *p = calloc(1, n);
    tc_send(fd, 0x2, "\x01", 1);
    tc_send(fd, 0x2, p, n);
    free(p);
}
static void f_oversize_frag(int fd)
{
    char *p = calloc(1, 40000);
    tc_send(fd, 0x2, "\x01", 1);
    tc_frame(fd, false, 0, 0x2, true, p, 40000);
    tc_frame(fd, true, 0, 0x0, true, p, 40000);
    free(p);
}
static void f_close_1_byte(int fd) { tc_send(fd, 0x8, "\x03", 1); }
static void f_close_bad_reason(int fd) { tc_send(fd, 0x8, "\x03\xe8\xff\xfe", 4); }
static void f_close_normal(int fd) { tc_send(fd, 0x8, "\x03\xe8" "bye", 5); }
static void f_bad_role(int fd) { tc_send(fd, 0x2, "\x09", 1); }
static void f_empty_role(int fd) { tc_send(fd, 0x2, "", 0); }
static void f_text_role(int fd) { tc_send(fd, 0x1, "\x01", 1); }

static const struct fr_case fr_cases[] = {
    {"unmasked client frame", 1002, f_unmasked},
    {"text with bad UTF-8", 1007, f_bad_utf8},
    {"fragmented text with bad UTF-8", 1007, f_utf8_split_bad},
    {"fragmented ping", 1002, f_frag_ping},
    {"ping over 125 bytes", 1002, f_long_ping},
    {"RSV1 set", 1002, f_rsv1},
    {"RSV2 set", 1002, f_rsv2},
    {"RSV3 set", 1002, f_rsv3},
    {"reserved opcode 0x3", 1002, f_op3},
    {"reserved opcode 0x7", 1002, f_op7},
    {"reserved control opcode 0xB", 1002, f_opb},
    {"reserved control opcode 0xF", 1002, f_opf},
    {"continuation without start", 1002, f_cont_first},
    {"new message inside a fragmented one", 1002, f_new_msg_in_frag},
    {"message over the size limit", 1009, f_oversize},
    {"fragmented message over the size limit", 1009, f_oversize_frag},
    {"close with a 1-byte payload", 1002, f_close_1_byte},
    {"close reason not UTF-8", 1007, f_close_bad_reason},
    {"client close 1000 echoed", 1000, f_close_normal},
    {"unknown role byte", 4004, f_bad_role},
    {"empty role message", 4004, f_empty_role},
    {"role in a text message", 1003, f_text_role},
};

T_CASE(frame_table)
{
    for (size_t i = 0; i < sizeof fr_cases / sizeof fr_cases[0]; i++) {
        const struct fr_case *c = &fr_cases[i];
        uint64_t t0 = tc_now_ms();
        char id[33];
        tc_bridge_id(id);
        int fd = tc_open(R.port, id);
        T_ASSERT(fd >= 0, "%s: upgrade failed", c->name);
        c->send(fd);
        char reason[128];
        int code = tc_expect_close(fd, reason, sizeof reason);
        T_CHECK(code == c->code, "%s: close code %d (%s), expected %d", c->name, code, reason, c->code);
        /* after its close frame the relay ends the TCP connection */
        uint8_t b;
        ssize_t r = recv(fd, &b, 1, 0);
        T_CHECK(r == 0 || (r < 0 && errno == ECONNRESET), "%s: connection still open after close (recv %zd: %s)",
                c->name, r, r < 0 ? strerror(errno) : "data");
        close(fd);
        T_CHECK(tc_now_ms() - t0 < 2000, "%s: took %llu ms", c->name, (unsigned long long)(tc_now_ms() - t0));
    }
}

T_CASE(ping_echoed_as_pong)
{
    char id[33];
    tc_bridge_id(id);
    int fd = tc_open(R.port, id);
    T_ASSERT(fd >= 0, "upgrade");
    tc_send(fd, 0x9, "are you there", 13);
    uint8_t *d;
    size_t n;
    int op = tc_recv(fd, &d, &n, NULL);
    T_CHECK(op == 0xa && n == 13 && !memcmp(d, "are you there", 13), "pong op %d len %zu", op, n);
    free(d);
    close(fd);
}

T_CASE(fragmented_binary_forwarded_whole)
{
    char id[33];
    tc_bridge_id(id);
    int up = tc_open(R.port, id), down = tc_open(R.port, id);
    T_ASSERT(up >= 0 && down >= 0, "upgrade");
    tc_send(up, 0x2, "\x01", 1);
    tc_send(down, 0x2, "\x02", 1);
    tc_frame(up, false, 0, 0x2, true, "hello ", 6);
    tc_send(up, 0x9, "mid", 3); /* a control frame between fragments is allowed */
    tc_frame(up, false, 0, 0x0, true, "ring ", 5);
    tc_frame(up, true, 0, 0x0, true, "edge", 4);
    uint8_t *d;
    size_t n;
    int op = tc_recv_msg(down, &d, &n);
    T_CHECK(op == 0x2 && n == 15 && !memcmp(d, "hello ring edge", 15),
            "downstream got op %d len %zu", op, n);
    free(d);
    close(up);
    close(down);
}

/* A relay of its own for each case, on its own loop thread. */
static int relay_up(void)
{
    struct kvd_relay_config cfg = {.plain = true, .max_msg_bytes = 65536};
    if (tc_relay_start(&R, &cfg) != 0) {
        fprintf(stderr, "cannot start the relay\n");
        return -1;
    }
    return 0;
}

static void relay_down(void)
{
    int rc = tc_relay_stop(&R);
    T_CHECK(rc == 0, "relay loop left handles open (uv_loop_close %d)", rc);
}

int main(int argc, char **argv)
{
    t_init(argc, argv);
    T_FIXTURE(relay_up, relay_down);
    T_RUN(accept_key_rfc_example);
    T_RUN(handshake_table);
    T_RUN(oversized_head_refused);
    T_RUN(frame_table);
    T_RUN(ping_echoed_as_pong);
    T_RUN(fragmented_binary_forwarded_whole);
    return T_DONE();
}

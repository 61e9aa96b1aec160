/* The relay over TLS: two ends of a bridge dialled with Kvasir's own WebSocket client
 * (wss://, certificate checked against the test CA, by IP name) exchange messages both
 * ways; a client limited to TLS 1.1 is refused; a client-initiated renegotiation fails;
 * a certificate for another name is rejected by the client. */
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <signal.h>

#include "tests/lib/ws_tc.h"

static char cert[512], key[512], other_cert[512], other_key[512];

static int make_cert(const char *c, const char *k, const char *san)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 "
             "-subj /CN=kvasir-test -addext subjectAltName=%s -keyout %s -out %s 2>/dev/null",
             san, k, c);
    return system(cmd);
}

/* ---------------------------------------------------------------- own client */

#define N_MSG 64

struct end {
    struct net_ws *ws;
    int role;
    int got;
    bool opened, closed, bad;
    int close_code;
    char close_reason[128];
    struct end *peer;
};

static size_t msg_len(int role, int k)
{
    return 1 + (size_t)((k * 4099 + role * 77) % 90000);
}

static void send_all(struct end *e)
{
    uint8_t *b = malloc(100000);
    for (int k = 0; k < N_MSG; k++) {
        size_t n = msg_len(e->role, k);
        for (size_t i = 0; i < n; i++)
            b[i] = (uint8_t)(k + i * e->role);
        net_ws_send(e->ws, NET_WS_BINARY, b, n);
    }
    free(b);
}

static void c_open(struct net_ws *ws, void *ud)
{
    struct end *e = ud;
    e->opened = true;
    uint8_t r = (uint8_t)e->role;
    net_ws_send(ws, NET_WS_BINARY, &r, 1);
    send_all(e);
}

static void c_msg(struct net_ws *ws, int op, const uint8_t *d, size_t n, void *ud)
{
    struct end *e = ud;
    int from = e->peer->role, k = e->got;
    bool ok = op == NET_WS_BINARY && k < N_MSG && n == msg_len(from, k);
    for (size_t i = 0; ok && i < n; i++)
        ok = d[i] == (uint8_t)(k + i * from);
    if (!ok)
        e->bad = true;
    e->got++;
    if (e->got == N_MSG && e->peer->got == N_MSG) {
        net_ws_close(e->ws, NET_WS_CODE_NORMAL, "done");
    }
}

static void c_close(struct net_ws *ws, int code, const char *reason, void *ud)
{
    struct end *e = ud;
    e->closed = true;
    e->close_code = code;
    snprintf(e->close_reason, sizeof e->close_reason, "%s", reason);
}

static const struct net_ws_handlers c_handlers = {.on_open = c_open, .on_msg = c_msg, .on_close = c_close};

T_CASE(wss_bridge_with_own_client)
{
    struct tc_relay R;
    struct kvd_relay_config cfg = {.tls_cert = cert, .tls_key = key};
    T_ASSERT(tc_relay_start(&R, &cfg) == 0, "relay start");
    struct net_tls_ctx *ctls;
    T_ASSERT(net_tls_ctx_client_new(&ctls, cert, true, NULL, 0) == 0, "client ctx");
    uv_loop_t loop;
    uv_loop_init(&loop);
    char id[33], url[200];
    tc_bridge_id(id);
    snprintf(url, sizeof url, "wss://127.0.0.1:%d/v1/bridge/%s", R.port, id);
    struct end up = {.role = 1}, down = {.role = 2};
    up.peer = &down;
    down.peer = &up;
    T_ASSERT(net_ws_dial(&up.ws, &loop, url, ctls, NULL, &c_handlers, &up, NULL, 0) == 0, "dial up");
    T_ASSERT(net_ws_dial(&down.ws, &loop, url, ctls, NULL, &c_handlers, &down, NULL, 0) == 0, "dial down");
    uv_run(&loop, UV_RUN_DEFAULT);
    T_CHECK(up.opened && down.opened, "handshakes: up %d down %d", up.opened, down.opened);
    T_CHECK(up.got == N_MSG && down.got == N_MSG, "messages: up got %d, down got %d of %d", up.got, down.got, N_MSG);
    T_CHECK(!up.bad && !down.bad, "a message was changed or reordered");
    /* whoever closed first saw 1000 echoed; the other was closed by the relay as partner-gone */
    T_CHECK((up.close_code == 1000 || up.close_code == NET_WS_CODE_PARTNER_GONE) &&
            (down.close_code == 1000 || down.close_code == NET_WS_CODE_PARTNER_GONE),
            "close codes up %d (%s) down %d (%s)", up.close_code, up.close_reason, down.close_code,
            down.close_reason);
    T_CHECK(uv_loop_close(&loop) == 0, "client loop left handles");

    /* a certificate for another name is refused by the client: on_close with 1006 */
    struct net_tls_ctx *wrong;
    T_ASSERT(net_tls_ctx_client_new(&wrong, other_cert, true, NULL, 0) == 0, "client ctx 2");
    uv_loop_init(&loop);
    struct end x = {.role = 1};
    x.peer = &x;
    T_ASSERT(net_ws_dial(&x.ws, &loop, url, wrong, NULL, &c_handlers, &x, NULL, 0) == 0, "dial");
    uv_run(&loop, UV_RUN_DEFAULT);
    T_CHECK(!x.opened && x.closed && x.close_code == 1006 && strstr(x.close_reason, "TLS"),
            "untrusted certificate: opened %d code %d %s", x.opened, x.close_code, x.close_reason);
    T_CHECK(uv_loop_close(&loop) == 0, "client loop left handles");
    net_tls_ctx_free(wrong);
    net_tls_ctx_free(ctls);
    T_CHECK(tc_relay_stop(&R) == 0, "relay loop left handles");
}

/* ---------------------------------------------------------------- protocol policy */

static SSL *blocking_tls(SSL_CTX *c, int port, int *fd_out)
{
    int fd = tc_connect(port);
    if (fd < 0)
        return NULL;
    SSL *s = SSL_new(c);
    SSL_set_fd(s, fd);
    *fd_out = fd;
    return s;
}

T_CASE(tls_policy)
{
    struct tc_relay R;
    struct kvd_relay_config cfg = {.tls_cert = cert, .tls_key = key};
    T_ASSERT(tc_relay_start(&R, &cfg) == 0, "relay start");
    int fd;

    /* TLS 1.1 and 1.0: refused */
    int vers[2] = {TLS1_1_VERSION, TLS1_VERSION};
    for (int i = 0; i < 2; i++) {
        SSL_CTX *c = SSL_CTX_new(TLS_client_method());
        SSL_CTX_set_security_level(c, 0);
        SSL_CTX_set_cipher_list(c, "ALL:@SECLEVEL=0");
        SSL_CTX_set_min_proto_version(c, vers[i]);
        SSL_CTX_set_max_proto_version(c, vers[i]);
        SSL *s = blocking_tls(c, R.port, &fd);
        T_ASSERT(s, "connect");
        int r = SSL_connect(s);
        T_CHECK(r != 1, "a TLS 0x%x-only client completed a handshake", vers[i]);
        SSL_free(s);
        close(fd);
        SSL_CTX_free(c);
        ERR_clear_error();
    }

    /* TLS 1.2: accepted; then a client-initiated renegotiation must not succeed */
    SSL_CTX *c = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_max_proto_version(c, TLS1_2_VERSION);
    SSL *s = blocking_tls(c, R.port, &fd);
    T_ASSERT(s, "connect");
    T_CHECK(SSL_connect(s) == 1, "TLS 1.2 handshake failed");
    T_CHECK(SSL_version(s) == TLS1_2_VERSION, "negotiated 0x%x", SSL_version(s));
    const char *req = "GET /v1/relay/status HTTP/1.1\r\nHost: x\r\n\r\n";
    int renego_ok = SSL_renegotiate(s);
    int hs = renego_ok == 1 ? SSL_do_handshake(s) : -1;
    /* The server refuses: either the handshake call fails or the next exchange does. */
    int w = SSL_write(s, req, (int)strlen(req));
    char buf[512];
    int n = w > 0 ? SSL_read(s, buf, sizeof buf - 1) : -1;
    bool renegotiated = hs == 1 && SSL_renegotiate_pending(s) == 0 && n > 0 &&
                        SSL_get_secure_renegotiation_support(s);
    T_CHECK(!renegotiated, "client-initiated renegotiation succeeded (hs %d write %d read %d)", hs, w, n);
    SSL_free(s);
    close(fd);
    ERR_clear_error();

    /* TLS 1.3 works too */
    SSL_CTX_set_max_proto_version(c, TLS1_3_VERSION);
    SSL_CTX_set_min_proto_version(c, TLS1_3_VERSION);
    s = blocking_tls(c, R.port, &fd);
    T_CHECK(SSL_connect(s) == 1 && SSL_version(s) == TLS1_3_VERSION, "TLS 1.3 handshake failed");
    SSL_write(s, req, (int)strlen(req));
    n = SSL_read(s, buf, sizeof buf - 1);
    buf[n > 0 ? n : 0] = 0;
    T_CHECK(n > 0 && strstr(buf, "HTTP/1.1 200"), "status over TLS 1.3: %s", buf);
    SSL_free(s);
    close(fd);
    SSL_CTX_free(c);
    T_CHECK(tc_relay_stop(&R) == 0, "relay loop left handles");
}

T_CASE(bad_cert_files_refused)
{
    struct tc_relay R;
    struct kvd_relay_config cfg = {.tls_cert = cert, .tls_key = other_key};
    T_CHECK(tc_relay_start(&R, &cfg) < 0 && strstr(R.err, "does not match"),
            "relay started with a key that does not match its certificate (%s)", R.err);
    cfg.tls_cert = "/nonexistent.pem";
    cfg.tls_key = key;
    T_CHECK(tc_relay_start(&R, &cfg) < 0 && strstr(R.err, "/nonexistent.pem: cannot load"),
            "relay started without its certificate file (%s)", R.err);
}

int main(int argc, char **argv)
{
    t_init(argc, argv);
    srand((unsigned)getpid());
    const char *d = t_tmpdir();
    snprintf(cert, sizeof cert, "%s/cert.pem", d);
    snprintf(key, sizeof key, "%s/key.pem", d);
    snprintf(other_cert, sizeof other_cert, "%s/other.pem", d);
    snprintf(other_key, sizeof other_key, "%s/other.key", d);
    if (make_cert(cert, key, "IP:127.0.0.1,DNS:localhost") != 0 ||
        make_cert(other_cert, other_key, "DNS:elsewhere.example") != 0) {
        fprintf(stderr, "cannot make test certificates with the openssl command (package openssl)\n");
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    T_RUN(wss_bridge_with_own_client);
    T_RUN(tls_policy);
    T_RUN(bad_cert_files_refused);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", d);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", d);
    return T_DONE();
}

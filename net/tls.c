/* TLS over memory BIOs: the socket is libuv's, OpenSSL only sees bytes we hand it.
 * Policy: TLS 1.2 minimum, no renegotiation (a ClientHello after the handshake is refused
 * by OpenSSL's SSL_OP_NO_RENEGOTIATION, stated even though OpenSSL 3 already refuses
 * client-initiated renegotiation by default), no compression, no session tickets. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>

#include <openssl/buffer.h>
#include <openssl/err.h>
#include <openssl/x509v3.h>
#include <openssl/ssl.h>

#include "net/ws_internal.h"
#include "util/err.h"

struct net_tls_ctx {
    SSL_CTX *ssl;
};

struct net__tls {
    SSL *ssl;
    BIO *rbio;   /* ciphertext from the peer (we write, OpenSSL reads) */
    BIO *wbio;   /* ciphertext for the peer (OpenSSL writes, we read) */
    bool cert_rejected;   /* the handshake failed on the peer's certificate */
};

/* "what: <OpenSSL's first queued reason>" (or what alone) into err, and the thread's
 * OpenSSL error queue emptied so that no stale reason reaches a later call. err may be NULL. */
static void tls_error(char *err, size_t errlen, const char *what)
{
    unsigned long e = ERR_get_error();
    if (err && errlen) {
        char buf[256];
        if (e) {
            ERR_error_string_n(e, buf, sizeof buf);
            snprintf(err, errlen, "%s: %s", what, buf);
        } else {
            snprintf(err, errlen, "%s", what);
        }
    }
    ERR_clear_error();
}

static SSL_CTX *tls_ctx_base(const SSL_METHOD *m)
{
    SSL_CTX *c = SSL_CTX_new(m);
    if (!c)
        return NULL;
    SSL_CTX_set_min_proto_version(c, TLS1_2_VERSION);
    SSL_CTX_set_options(c, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION |
                           SSL_OP_CIPHER_SERVER_PREFERENCE);
    /* RELEASE_BUFFERS: an idle connection gives its 2 x 16 KiB record buffers back */
    SSL_CTX_set_mode(c, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
                            SSL_MODE_RELEASE_BUFFERS);
    return c;
}

/* Own c in a new net_tls_ctx (c is freed when that fails). */
static int tls_ctx_wrap(struct net_tls_ctx **out, SSL_CTX *c)
{
    struct net_tls_ctx *t = calloc(1, sizeof *t);
    if (!t) {
        SSL_CTX_free(c);
        return -ENOMEM;
    }
    t->ssl = c;
    *out = t;
    return 0;
}

int net_tls_ctx_server_new(struct net_tls_ctx **out, const char *cert_file, const char *key_file,
                           char *err, size_t errlen)
{
    *out = NULL;
    if (!cert_file || !key_file) {
        snprintf(err, errlen, "tls: server needs a certificate and a key file");
        return -EINVAL;
    }
    SSL_CTX *c = tls_ctx_base(TLS_server_method());
    if (!c) {
        tls_error(err, errlen, "tls: SSL_CTX_new");
        return -ENOMEM;
    }
    SSL_CTX_set_options(c, SSL_OP_NO_TICKET);
    /* Forward secrecy only for TLS 1.2 (TLS 1.3 suites all have it). */
    if (SSL_CTX_set_cipher_list(c, "ECDHE+AESGCM:ECDHE+CHACHA20:!aNULL:!eNULL:!MD5:!RC4:!3DES") != 1) {
        tls_error(err, errlen, "tls: cipher list");
        SSL_CTX_free(c);
        return -EINVAL;
    }
    if (SSL_CTX_use_certificate_chain_file(c, cert_file) != 1) {
        char what[KV_ERR_MAX];
        snprintf(what, sizeof what, "tls: certificate file %s: cannot load", cert_file);
        tls_error(err, errlen, what);
        SSL_CTX_free(c);
        return -EINVAL;
    }
    if (SSL_CTX_use_PrivateKey_file(c, key_file, SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(c) != 1) {
        char what[KV_ERR_MAX];
        snprintf(what, sizeof what, "tls: key file %s: cannot load or does not match %s", key_file,
                 cert_file);
        tls_error(err, errlen, what);
        SSL_CTX_free(c);
        return -EINVAL;
    }
    return tls_ctx_wrap(out, c);
}

int net_tls_ctx_client_new(struct net_tls_ctx **out, const char *ca_file, bool verify, char *err,
                           size_t errlen)
{
    *out = NULL;
    SSL_CTX *c = tls_ctx_base(TLS_client_method());
    if (!c) {
        tls_error(err, errlen, "tls: SSL_CTX_new");
        return -ENOMEM;
    }
    if (ca_file) {
        if (SSL_CTX_load_verify_locations(c, ca_file, NULL) != 1) {
            char what[KV_ERR_MAX];
            snprintf(what, sizeof what, "tls: CA file %s: cannot load", ca_file);
            tls_error(err, errlen, what);
            SSL_CTX_free(c);
            return -EINVAL;
        }
        verify = true;
    } else if (verify) {
        SSL_CTX_set_default_verify_paths(c);
    }
    SSL_CTX_set_verify(c, verify ? SSL_VERIFY_PEER : SSL_VERIFY_NONE, NULL);
    return tls_ctx_wrap(out, c);
}

void net_tls_ctx_free(struct net_tls_ctx *ctx)
{
    if (!ctx)
        return;
    SSL_CTX_free(ctx->ssl);
    free(ctx);
}

int net__tls_new(struct net__tls **out, struct net_tls_ctx *ctx, bool server, const char *sni)
{
    *out = NULL;
    struct net__tls *t = calloc(1, sizeof *t);
    if (!t)
        return -ENOMEM;
    t->ssl = SSL_new(ctx->ssl);
    t->rbio = BIO_new(BIO_s_mem());
    t->wbio = BIO_new(BIO_s_mem());
    if (!t->ssl || !t->rbio || !t->wbio) {
        SSL_free(t->ssl);
        BIO_free(t->rbio);
        BIO_free(t->wbio);
        free(t);
        return -ENOMEM;
    }
    /* An empty memory BIO must report "retry", not EOF. */
    BIO_set_mem_eof_return(t->rbio, -1);
    BIO_set_mem_eof_return(t->wbio, -1);
    SSL_set_bio(t->ssl, t->rbio, t->wbio);
    if (server) {
        SSL_set_accept_state(t->ssl);
    } else {
        SSL_set_connect_state(t->ssl);
        /* An IP literal is checked against the certificate's IP names and never sent as
         * SNI (RFC 6066 section 3); a host name is both. */
        unsigned char ip[16];
        bool is_ip = sni && (inet_pton(AF_INET, sni, ip) == 1 || inet_pton(AF_INET6, sni, ip) == 1);
        if (sni && sni[0] && !is_ip)
            SSL_set_tlsext_host_name(t->ssl, sni);
        if (sni && sni[0] && SSL_get_verify_mode(t->ssl) != SSL_VERIFY_NONE) {
            if (is_ip)
                X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(t->ssl), sni);
            else
                SSL_set1_host(t->ssl, sni);
        }
    }
    *out = t;
    return 0;
}

void net__tls_free(struct net__tls *t)
{
    if (!t)
        return;
    SSL_free(t->ssl); /* frees both BIOs */
    free(t);
}

int net__tls_feed(struct net__tls *t, const uint8_t *data, size_t len)
{
    while (len > 0) {
        int chunk = len > (1u << 30) ? (1 << 30) : (int)len;
        int n = BIO_write(t->rbio, data, chunk);
        if (n <= 0)
            return -ENOMEM;
        data += n;
        len -= (size_t)n;
    }
    return 0;
}

int net__tls_handshake(struct net__tls *t, char *err, size_t errlen)
{
    if (SSL_is_init_finished(t->ssl))
        return 1;
    int r = SSL_do_handshake(t->ssl);
    if (r == 1)
        return 1;
    int e = SSL_get_error(t->ssl, r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
        return 0;
    /* A certificate that did not verify: OpenSSL's queue says only "certificate verify
     * failed"; the verify result names the problem ("certificate has expired", "unable to get
     * local issuer certificate", "hostname mismatch") and the certificate's subject who. */
    long v = SSL_get_verify_result(t->ssl);
    X509 *cert = SSL_get1_peer_certificate(t->ssl);
    if (v != X509_V_OK) {
        char subj[256] = "";
        if (cert) {
            memcpy(subj, " (subject ", 10);
            X509_NAME_oneline(X509_get_subject_name(cert), subj + 10, sizeof subj - 12);
            strcat(subj, ")");
        }
        if (err && errlen)
            snprintf(err, errlen, "TLS handshake failed: the peer's certificate%s was rejected: %s",
                     subj, X509_verify_cert_error_string(v));
        t->cert_rejected = true;
        ERR_clear_error();
    } else {
        tls_error(err, errlen, "TLS handshake failed");
    }
    X509_free(cert);
    return -EPROTO;
}

bool net__tls_cert_rejected(const struct net__tls *t)
{
    return t && t->cert_rejected;
}

ssize_t net__tls_read(struct net__tls *t, uint8_t *buf, size_t len)
{
    int cap = len > (1u << 30) ? (1 << 30) : (int)len;
    int r = SSL_read(t->ssl, buf, cap);
    if (r > 0)
        return r;
    int e = SSL_get_error(t->ssl, r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
        return 0;
    if (e == SSL_ERROR_ZERO_RETURN)
        return -EPIPE;
    tls_error(NULL, 0, "read");
    return -EPROTO;
}

int net__tls_write(struct net__tls *t, const uint8_t *data, size_t len)
{
    while (len > 0) {
        int chunk = len > (1u << 30) ? (1 << 30) : (int)len;
        int r = SSL_write(t->ssl, data, chunk);
        if (r <= 0) {
            tls_error(NULL, 0, "write");
            return -EPROTO;
        }
        data += r;
        len -= (size_t)r;
    }
    return 0;
}

size_t net__tls_take(struct net__tls *t, uint8_t **buf)
{
    *buf = NULL;
    size_t n = BIO_ctrl_pending(t->wbio);
    if (n == 0)
        return 0;
    uint8_t *b = malloc(n);
    if (!b)
        return 0;
    int r = BIO_read(t->wbio, b, (int)n);
    if (r <= 0) {
        free(b);
        return 0;
    }
    /* A memory BIO keeps the size of its largest burst: once drained, a big one is replaced
     * so that a connection that once sent a lot does not hold that memory forever. */
    BUF_MEM *bm = NULL;
    BIO_get_mem_ptr(t->wbio, &bm);
    if (BIO_ctrl_pending(t->wbio) == 0 && bm && bm->max > (64u << 10)) {
        BIO *fresh = BIO_new(BIO_s_mem());
        if (fresh) {
            BIO_set_mem_eof_return(fresh, -1);
            SSL_set0_wbio(t->ssl, fresh); /* frees the old one */
            t->wbio = fresh;
        }
    }
    *buf = b;
    return (size_t)r;
}

/* ---------------------------------------------------------------- HTTP server filter */

/* TLS as a byte filter of net's HTTP server: ciphertext from the socket in, plaintext to the
 * HTTP layer; plaintext from the HTTP layer out, ciphertext to the socket. */
static int tls_push_raw(struct net__tls *t, struct net_http_conn *c)
{
    uint8_t *buf;
    size_t n;
    while ((n = net__tls_take(t, &buf)) > 0) {
        int rc = net_http_conn_send_raw(c, buf, n);
        free(buf);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int tls_f_open(void *ud, struct net_http_conn *c, void **state)
{
    struct net__tls *t;
    int rc = net__tls_new(&t, ud, true, NULL);
    if (rc < 0)
        return rc;
    *state = t;
    return 0;
}

static int tls_f_recv(void *state, struct net_http_conn *c, const void *buf, size_t n)
{
    struct net__tls *t = state;
    if (net__tls_feed(t, buf, n) < 0)
        return -ENOMEM;
    if (!SSL_is_init_finished(t->ssl)) {
        int hs = net__tls_handshake(t, NULL, 0); /* a failed handshake just ends the connection */
        if (tls_push_raw(t, c) < 0 || hs < 0)
            return -EPROTO;
        if (hs == 0)
            return 0;
    }
    uint8_t plain[16384];
    for (;;) {
        ssize_t r = net__tls_read(t, plain, sizeof plain);
        if (r == 0)
            break;
        if (r < 0) {
            tls_push_raw(t, c); /* an alert for the peer, if any */
            return r == -EPIPE ? -EPIPE : -EPROTO;
        }
        if (net_http_conn_feed(c, plain, (size_t)r) < 0)
            return -ECANCELED;
    }
    return tls_push_raw(t, c);
}

static int tls_f_send(void *state, struct net_http_conn *c, const void *buf, size_t n)
{
    struct net__tls *t = state;
    if (net__tls_write(t, buf, n) < 0)
        return -EPROTO;
    return tls_push_raw(t, c);
}

static void tls_f_close(void *state)
{
    net__tls_free(state);
}

void net__tls_filter_init(struct net_http_filter *f, struct net_tls_ctx *ctx)
{
    f->open = tls_f_open;
    f->recv = tls_f_recv;
    f->send = tls_f_send;
    f->close = tls_f_close;
    f->ud = ctx;
}

void net_tls_filter_init(struct net_http_filter *f, struct net_tls_ctx *ctx)
{
    net__tls_filter_init(f, ctx);
}

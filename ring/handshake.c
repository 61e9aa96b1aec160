/* handshake.c — the link handshake state machine with its key exchange: HELLOs checked against
 * what the manifest expects, AUTH signatures over the transcript, session keys by X25519 and
 * HKDF (no I/O here, so the fuzz target can drive all of it). The protocol: ring/ring.h's
 * protocol section and docs/security.md. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>

#include "net/net.h"
#include "ring/ring.h"
#include "util/util.h"

enum { HS_WAIT_HELLO, HS_WAIT_AUTH, HS_DONE, HS_FAILED };

struct ring_handshake {
    const struct net_identity *id;
    struct ring_hello mine, peer;
    struct ring_hs_expect expect;
    enum ring_hs_side side;
    char ring[RING_RING_ID_MAX + 1];
    int state;
    EVP_PKEY *eph;                      /* own X25519 key, dropped once the keys are derived */
    uint8_t transcript[32];
    struct ring_link_keys keys;
    uint8_t hello_frame[RING_HDR_LEN + RING_HELLO_LEN];
    uint8_t auth_frame[RING_HDR_LEN + RING_AUTH_LEN];
    bool refused;                       /* the peer sent ERROR: refusal holds its reason */
    char refusal[RING_REFUSAL_MAX + 1];
};

/* The signed message: "KVR2-auth" | u8 signer's side | transcript. */
static size_t auth_msg(uint8_t m[42], enum ring_hs_side signer, const uint8_t transcript[32])
{
    memcpy(m, "KVR2-auth", 9);
    m[9] = (uint8_t)signer;
    memcpy(m + 10, transcript, 32);
    return 42;
}

/* SHA-256("KVR2-transcript" | HELLO of the up side | HELLO of the down side). */
static int transcript_hash(const uint8_t *up, const uint8_t *down, uint8_t out[32])
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned n = 0;
    int ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1 &&
             EVP_DigestUpdate(ctx, "KVR2-transcript", 15) == 1 &&
             EVP_DigestUpdate(ctx, up, RING_HELLO_LEN) == 1 &&
             EVP_DigestUpdate(ctx, down, RING_HELLO_LEN) == 1 &&
             EVP_DigestFinal_ex(ctx, out, &n) == 1 && n == 32;
    EVP_MD_CTX_free(ctx);
    return ok ? 0 : -EIO;
}

/* X25519 with the peer's key, then HKDF-SHA256 salted with the transcript: one key per
 * direction. The shared secret never leaves this function. */
static int derive_keys(struct ring_handshake *hs, const uint8_t peer_pub[32], char *err,
                       size_t errlen)
{
    uint8_t secret[32], okm[64];
    size_t slen = sizeof secret;
    int rc = -EIO;
    EVP_PKEY *peer = EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, NULL, peer_pub, 32);
    EVP_PKEY_CTX *dc = peer ? EVP_PKEY_CTX_new(hs->eph, NULL) : NULL;
    if (!dc || EVP_PKEY_derive_init(dc) != 1 || EVP_PKEY_derive_set_peer(dc, peer) != 1 ||
        EVP_PKEY_derive(dc, secret, &slen) != 1 || slen != 32) {
        /* OpenSSL refuses a low-order peer key (an all-zero secret) here */
        snprintf(err, errlen, "the peer's ephemeral X25519 key is unusable");
        goto out;
    }
    for (int dir = 0; dir < 2; dir++) {
        const char *info = dir == 0 ? "KVR2 up->down" : "KVR2 down->up";
        EVP_KDF *kdf = EVP_KDF_fetch(NULL, "HKDF", NULL);
        EVP_KDF_CTX *kc = kdf ? EVP_KDF_CTX_new(kdf) : NULL;
        EVP_KDF_free(kdf);
        OSSL_PARAM ps[] = {
            OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, (char *)"SHA256", 0),
            OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, secret, 32),
            OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, hs->transcript, 32),
            OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, (char *)info, strlen(info)),
            OSSL_PARAM_construct_end(),
        };
        int ok = kc && EVP_KDF_derive(kc, okm + 32 * dir, 32, ps) == 1;
        EVP_KDF_CTX_free(kc);
        if (!ok) {
            snprintf(err, errlen, "HKDF over the X25519 secret failed");
            goto out;
        }
    }
    bool up = hs->side == RING_HS_UP;
    memcpy(hs->keys.tx, okm + (up ? 0 : 32), 32);
    memcpy(hs->keys.rx, okm + (up ? 32 : 0), 32);
    rc = 0;
out:
    OPENSSL_cleanse(secret, sizeof secret);
    OPENSSL_cleanse(okm, sizeof okm);
    EVP_PKEY_CTX_free(dc);
    EVP_PKEY_free(peer);
    EVP_PKEY_free(hs->eph);
    hs->eph = NULL;
    return rc;
}

int ring_handshake_new(struct ring_handshake **out, const struct net_identity *id,
                      const struct ring_hello *mine, const struct ring_hs_expect *expect,
                      enum ring_hs_side side)
{
    if (side != RING_HS_UP && side != RING_HS_DOWN)
        return -EINVAL;
    struct ring_handshake *hs = calloc(1, sizeof *hs);
    if (!hs)
        return -ENOMEM;
    hs->id = id;
    hs->side = side;
    hs->mine = *mine;
    hs->mine.version = RING_VERSION;
    if (id)
        memcpy(hs->mine.node_key, net_identity_pub(id), 32);
    size_t n = 32;
    hs->eph = EVP_PKEY_Q_keygen(NULL, NULL, "X25519");
    if (!hs->eph || EVP_PKEY_get_raw_public_key(hs->eph, hs->mine.ephemeral, &n) != 1 || n != 32 ||
        RAND_bytes(hs->mine.nonce, 32) != 1) {
        ring_handshake_free(hs);
        return -EIO;
    }
    hs->expect = *expect;
    snprintf(hs->ring, sizeof hs->ring, "%s", expect->ring ? expect->ring : "");
    hs->expect.ring = hs->ring;
    struct ring_frame_hdr h = {.magic = RING_MAGIC, .type = RING_F_HELLO, .payload_len = RING_HELLO_LEN};
    ring_frame_hdr_encode(&h, hs->hello_frame);
    ring_hello_encode(&hs->mine, hs->hello_frame + RING_HDR_LEN);
    hs->state = HS_WAIT_HELLO;
    *out = hs;
    return 0;
}

void ring_handshake_free(struct ring_handshake *hs)
{
    if (!hs)
        return;
    EVP_PKEY_free(hs->eph);
    OPENSSL_cleanse(&hs->keys, sizeof hs->keys);
    free(hs);
}

void ring_handshake_hello(struct ring_handshake *hs, const uint8_t **bytes, size_t *len)
{
    *bytes = hs->hello_frame;
    *len = sizeof hs->hello_frame;
}

const struct ring_hello *ring_handshake_peer(const struct ring_handshake *hs)
{
    return &hs->peer;
}

int ring_handshake_expect_key(struct ring_handshake *hs, const uint8_t key[32])
{
    if (hs->state != HS_WAIT_HELLO)
        return -EALREADY;
    hs->expect.check_key = true;
    memcpy(hs->expect.node_key, key, 32);
    return 0;
}

bool ring_handshake_hello_ok(const struct ring_handshake *hs)
{
    return hs->state == HS_WAIT_AUTH || hs->state == HS_DONE;
}

int ring_handshake_keys(const struct ring_handshake *hs, struct ring_link_keys *keys)
{
    if (hs->state != HS_DONE)
        return -EAGAIN;
    *keys = hs->keys;
    return 0;
}

const char *ring_handshake_refusal(const struct ring_handshake *hs)
{
    return hs && hs->refused ? hs->refusal : NULL;
}

static int hs_fail(struct ring_handshake *hs, int rc)
{
    hs->state = HS_FAILED;
    OPENSSL_cleanse(&hs->keys, sizeof hs->keys);
    return rc;
}

/* Check the peer's HELLO against what we expect of it (own_rank: the rank our HELLO claims):
 * 0 or a negative code with err. The words name ranks, not "ours" and "theirs", because the
 * refusing side sends err to the peer, which logs it too. */
static int hello_check(const struct ring_hello *p, const struct ring_hs_expect *x, uint32_t own_rank,
                       char *err, size_t errlen)
{
    if (strcmp(p->ring, x->ring) != 0) {
        snprintf(err, errlen, "wrong ring '%s', expected '%s'", p->ring, x->ring);
        return -EPERM;
    }
    if (p->n_ranks != x->n_ranks) {
        snprintf(err, errlen, "peer's ring has %u ranks, expected %u", p->n_ranks, x->n_ranks);
        return -EPERM;
    }
    if (p->rank != x->rank) {
        snprintf(err, errlen, "wrong rank %u, expected %u", p->rank, x->rank);
        return -EPERM;
    }
    if (memcmp(p->manifest_hash, x->manifest_hash, 32) != 0) {
        char a[65], b[65];
        util_hex_encode(p->manifest_hash, 32, a);
        util_hex_encode(x->manifest_hash, 32, b);
        snprintf(err, errlen, "manifest hash mismatch: rank %u has %.16s..., rank %u has %.16s... "
                 "(every stage must run the same manifest file)", p->rank, a, own_rank, b);
        return -EPERM;
    }
    if (x->check_key && memcmp(p->node_key, x->node_key, 32) != 0) {
        char a[65];
        util_hex_encode(p->node_key, 32, a);
        snprintf(err, errlen, "node key %.16s... is not the one the manifest names for rank %u",
                 a, p->rank);
        return -EPERM;
    }
    return 0;
}

static int on_hello(struct ring_handshake *hs, const struct ring_frame_hdr *h, const uint8_t *payload,
                    const uint8_t **out, size_t *outlen, char *err, size_t errlen)
{
    if (h->type != RING_F_HELLO) {
        snprintf(err, errlen, "expected HELLO, got %s", ring_frame_type_name(h->type));
        return -EPROTO;
    }
    /* The version first, so an older peer gets a clear word rather than a length mismatch. */
    if (h->payload_len >= 4 && util_le32_get(payload) != RING_VERSION) {
        snprintf(err, errlen, "peer speaks ring protocol version %u, this kvd speaks %u "
                 "(run the same kvd release on every stage)", util_le32_get(payload), RING_VERSION);
        return -EPROTO;
    }
    struct ring_hello p;
    int rc = ring_hello_decode(payload, h->payload_len, &p, err, errlen);
    if (rc < 0)
        return rc;
    if ((rc = hello_check(&p, &hs->expect, hs->mine.rank, err, errlen)) < 0)
        return rc;
    if (!memcmp(p.nonce, hs->mine.nonce, 32) || !memcmp(p.ephemeral, hs->mine.ephemeral, 32)) {
        snprintf(err, errlen, "the peer's HELLO reflects our own nonce or key");
        return -EPERM;
    }
    hs->peer = p;
    /* Only now, with the peer's HELLO checked, does anything get signed. */
    const uint8_t *own = hs->hello_frame + RING_HDR_LEN;
    bool up = hs->side == RING_HS_UP;
    if (transcript_hash(up ? own : payload, up ? payload : own, hs->transcript) < 0) {
        snprintf(err, errlen, "hashing the handshake transcript failed");
        return -EIO;
    }
    if ((rc = derive_keys(hs, p.ephemeral, err, errlen)) < 0)
        return -EPROTO;
    uint8_t m[42], sig[64];
    size_t mlen = auth_msg(m, hs->side, hs->transcript);
    if (!hs->id || net_identity_sign(hs->id, m, mlen, sig) < 0) {
        snprintf(err, errlen, "signing the AUTH failed");
        return -EIO;
    }
    struct ring_frame_hdr ah = {.magic = RING_MAGIC, .type = RING_F_AUTH, .payload_len = RING_AUTH_LEN};
    ring_frame_hdr_encode(&ah, hs->auth_frame);
    memcpy(hs->auth_frame + RING_HDR_LEN, sig, 64);
    *out = hs->auth_frame;
    *outlen = sizeof hs->auth_frame;
    return 0;
}

int ring_handshake_feed(struct ring_handshake *hs, const struct ring_frame_hdr *h,
                       const uint8_t *payload, const uint8_t **out, size_t *outlen,
                       char *err, size_t errlen)
{
    *out = NULL;
    *outlen = 0;
    if (hs->state == HS_FAILED || hs->state == HS_DONE) {
        snprintf(err, errlen, "handshake already %s", hs->state == HS_DONE ? "done" : "failed");
        return -EPROTO;
    }
    if (h->type == RING_F_ERROR) {
        /* The reason as the peer gave it, bounded and printable (it reaches our log and,
         * through rank 0, a client). */
        size_t n = h->payload_len > 4 ? h->payload_len - 4 : 0;
        util_text_clean(hs->refusal, sizeof hs->refusal, payload + 4, n);
        hs->refused = true;
        snprintf(err, errlen, "peer refused the link: %s", hs->refusal);
        return hs_fail(hs, -ECONNREFUSED);
    }
    if (h->session || h->pos || h->n_tokens || h->flags) {
        snprintf(err, errlen, "%s frame during the handshake has non-zero session/pos/n_tokens/flags",
                 ring_frame_type_name(h->type));
        return hs_fail(hs, -EPROTO);
    }
    if (hs->state == HS_WAIT_HELLO) {
        int rc = on_hello(hs, h, payload, out, outlen, err, errlen);
        if (rc < 0)
            return hs_fail(hs, rc);
        hs->state = HS_WAIT_AUTH;
        return 0;
    }
    /* HS_WAIT_AUTH */
    if (h->type != RING_F_AUTH) {
        snprintf(err, errlen, "expected AUTH, got %s", ring_frame_type_name(h->type));
        return hs_fail(hs, -EPROTO);
    }
    if (h->payload_len != RING_AUTH_LEN) {
        snprintf(err, errlen, "AUTH payload_len %u is not %u", h->payload_len, RING_AUTH_LEN);
        return hs_fail(hs, -EPROTO);
    }
    uint8_t m[42];
    enum ring_hs_side other = hs->side == RING_HS_UP ? RING_HS_DOWN : RING_HS_UP;
    size_t mlen = auth_msg(m, other, hs->transcript);
    if (!net_sig_verify(hs->peer.node_key, m, mlen, payload)) {
        snprintf(err, errlen, "bad signature on the AUTH of rank %u: not its key's signature over "
                 "this link's transcript", hs->peer.rank);
        return hs_fail(hs, -EPERM);
    }
    hs->state = HS_DONE;
    return 1;
}

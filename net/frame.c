/* frame.c — ring frame headers, the streaming frame reader, OPEN and HELLO payloads, and the
 * link handshake state machine with its key exchange (no I/O here, so the fuzz target can
 * drive all of it). The protocol: net/net.h's frames section and docs/security.md. */
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
#include "util/util.h"

static void putf(uint8_t *p, float f) { uint32_t v; memcpy(&v, &f, 4); util_le32_put(p, v); }
static float getf(const uint8_t *p) { uint32_t v = util_le32_get(p); float f; memcpy(&f, &v, 4); return f; }

const char *net_frame_type_name(uint32_t type)
{
    static const char *names[] = {"?", "HELLO", "AUTH", "OPEN", "ACT", "TOKEN", "CLOSE",
                                  "ERROR", "PING", "PONG", "STATUS"};
    return type <= NET_F_MAX ? names[type] : "?";
}

void net_frame_hdr_encode(const struct net_frame_hdr *h, uint8_t out[NET_HDR_LEN])
{
    util_le32_put(out, h->magic ? h->magic : NET_MAGIC);
    out[4] = h->type;
    out[5] = h->flags;
    out[6] = (uint8_t)h->reserved;
    out[7] = (uint8_t)(h->reserved >> 8);
    util_le64_put(out + 8, h->session);
    util_le32_put(out + 16, h->pos);
    util_le32_put(out + 20, h->n_tokens);
    util_le32_put(out + 24, h->payload_len);
}

int net_frame_hdr_decode(const uint8_t in[NET_HDR_LEN], struct net_frame_hdr *h,
                         uint32_t max_payload, char *err, size_t errlen)
{
    h->magic = util_le32_get(in);
    h->type = in[4];
    h->flags = in[5];
    h->reserved = (uint16_t)(in[6] | in[7] << 8);
    h->session = util_le64_get(in + 8);
    h->pos = util_le32_get(in + 16);
    h->n_tokens = util_le32_get(in + 20);
    h->payload_len = util_le32_get(in + 24);
    if (h->magic != NET_MAGIC) {
        snprintf(err, errlen, "frame magic 0x%08x is not KVR1 (0x%08x)", h->magic, NET_MAGIC);
        return -EPROTO;
    }
    if (h->type < 1 || h->type > NET_F_MAX) {
        snprintf(err, errlen, "frame type %u unknown (1..%u)", h->type, NET_F_MAX);
        return -EPROTO;
    }
    if (h->reserved != 0) {
        snprintf(err, errlen, "frame reserved field %u is not 0", h->reserved);
        return -EPROTO;
    }
    if (h->flags & ~(NET_FL_LAST | NET_FL_LOGITS | NET_FL_REPLAY | NET_FL_DRAFT)) {
        snprintf(err, errlen, "frame flags 0x%02x has unknown bits", h->flags);
        return -EPROTO;
    }
    uint32_t cap = max_payload < NET_PAYLOAD_HARD_MAX ? max_payload : NET_PAYLOAD_HARD_MAX;
    if (h->payload_len > cap) {
        snprintf(err, errlen, "%s frame payload_len %u exceeds the cap %u",
                 net_frame_type_name(h->type), h->payload_len, cap);
        return -EMSGSIZE;
    }
    return 0;
}

size_t net_text_clean(char *out, size_t outn, const uint8_t *in, size_t n)
{
    if (outn < 4) {
        if (outn)
            out[0] = 0;
        return 0;
    }
    bool cut = n > outn - 1;
    size_t k = cut ? outn - 4 : n;
    for (size_t i = 0; i < k; i++)
        out[i] = in[i] >= 0x20 && in[i] < 0x7f ? (char)in[i] : '?';
    if (cut) {
        memcpy(out + k, "...", 3);
        k += 3;
    }
    out[k] = 0;
    return k;
}

void net_open_encode(const struct net_open_params *p, uint8_t out[NET_OPEN_LEN])
{
    memset(out, 0, NET_OPEN_LEN);
    util_le64_put(out, p->seed);
    putf(out + 8, p->temperature);
    putf(out + 12, p->top_p);
    putf(out + 16, p->min_p);
    putf(out + 20, p->repeat_penalty);
    putf(out + 24, p->freq_penalty);
    putf(out + 28, p->presence_penalty);
    util_le32_put(out + 32, (uint32_t)p->top_k);
    util_le32_put(out + 36, (uint32_t)p->penalty_last_n);
    util_le32_put(out + 40, p->max_tokens);
    util_le32_put(out + 44, p->n_ctx);
    util_le32_put(out + 48, p->draws);
    out[52] = p->draft_max;
    out[53] = p->draft_kind;
}

void net_open_decode(const uint8_t in[NET_OPEN_LEN], struct net_open_params *p)
{
    memset(p, 0, sizeof *p);
    p->seed = util_le64_get(in);
    p->temperature = getf(in + 8);
    p->top_p = getf(in + 12);
    p->min_p = getf(in + 16);
    p->repeat_penalty = getf(in + 20);
    p->freq_penalty = getf(in + 24);
    p->presence_penalty = getf(in + 28);
    p->top_k = (int32_t)util_le32_get(in + 32);
    p->penalty_last_n = (int32_t)util_le32_get(in + 36);
    p->max_tokens = util_le32_get(in + 40);
    p->n_ctx = util_le32_get(in + 44);
    p->draws = util_le32_get(in + 48);
    p->draft_max = in[52];
    p->draft_kind = in[53];
}

/* ---- reader ---- */

void net_frame_reader_init(struct net_frame_reader *r, uint32_t max_payload)
{
    memset(r, 0, sizeof *r);
    r->max_payload = max_payload;
}

void net_frame_reader_free(struct net_frame_reader *r)
{
    util_buf_free(&r->buf);
    memset(r, 0, sizeof *r);
}

int net_frame_reader_push(struct net_frame_reader *r, const void *data, size_t len)
{
    util_buf_consume(&r->buf, r->off);   /* drop consumed bytes before growing */
    r->off = 0;
    int rc = util_buf_append(&r->buf, data, len, SIZE_MAX);
    return rc == -E2BIG ? -EOVERFLOW : rc;
}

int net_frame_reader_next(struct net_frame_reader *r, struct net_frame_hdr *h,
                          const uint8_t **payload, char *err, size_t errlen)
{
    size_t avail = r->buf.len - r->off;
    if (avail < NET_HDR_LEN)
        return 0;
    int rc = net_frame_hdr_decode(r->buf.p + r->off, h, r->max_payload, err, errlen);
    if (rc < 0)
        return rc;
    if (avail - NET_HDR_LEN < h->payload_len)
        return 0;
    *payload = r->buf.p + r->off + NET_HDR_LEN;
    r->off += NET_HDR_LEN + (size_t)h->payload_len;
    if (r->off == r->buf.len)
        r->off = r->buf.len = 0;   /* payload stays valid: nothing overwrites it before next push */
    return 1;
}

/* ---- HELLO ---- */

void net_hello_encode(const struct net_hello *h, uint8_t out[NET_HELLO_LEN])
{
    memset(out, 0, NET_HELLO_LEN);
    util_le32_put(out, h->version);
    util_le32_put(out + 4, h->rank);
    util_le32_put(out + 8, h->n_ranks);
    size_t n = strnlen(h->ring, NET_RING_ID_MAX);
    memcpy(out + 12, h->ring, n);
    memcpy(out + 76, h->node_key, 32);
    memcpy(out + 108, h->manifest_hash, 32);
    memcpy(out + 140, h->nonce, 32);
    memcpy(out + 172, h->ephemeral, 32);
}

int net_hello_decode(const uint8_t *in, size_t len, struct net_hello *h, char *err, size_t errlen)
{
    if (len != NET_HELLO_LEN) {
        snprintf(err, errlen, "HELLO payload_len %zu is not %u", len, NET_HELLO_LEN);
        return -EPROTO;
    }
    memset(h, 0, sizeof *h);
    h->version = util_le32_get(in);
    h->rank = util_le32_get(in + 4);
    h->n_ranks = util_le32_get(in + 8);
    memcpy(h->ring, in + 12, NET_RING_ID_MAX);
    h->ring[NET_RING_ID_MAX] = 0;
    /* The ring id must be printable and NUL-padded (no bytes after the first NUL). */
    size_t n = strlen(h->ring);
    for (size_t i = 0; i < NET_RING_ID_MAX; i++) {
        uint8_t c = in[12 + i];
        if ((i < n && (c < 0x21 || c > 0x7e)) || (i >= n && c != 0)) {
            snprintf(err, errlen, "HELLO ring id byte %zu (0x%02x) is not printable/NUL-padded", i, c);
            return -EPROTO;
        }
    }
    memcpy(h->node_key, in + 76, 32);
    memcpy(h->manifest_hash, in + 108, 32);
    memcpy(h->nonce, in + 140, 32);
    memcpy(h->ephemeral, in + 172, 32);
    return 0;
}

/* ---- handshake ---- */

enum { HS_WAIT_HELLO, HS_WAIT_AUTH, HS_DONE, HS_FAILED };

struct net_handshake {
    const struct net_identity *id;
    struct net_hello mine, peer;
    struct net_hs_expect expect;
    enum net_hs_side side;
    char ring[NET_RING_ID_MAX + 1];
    int state;
    EVP_PKEY *eph;                      /* own X25519 key, dropped once the keys are derived */
    uint8_t transcript[32];
    struct net_link_keys keys;
    uint8_t hello_frame[NET_HDR_LEN + NET_HELLO_LEN];
    uint8_t auth_frame[NET_HDR_LEN + NET_AUTH_LEN];
    bool refused;                       /* the peer sent ERROR: refusal holds its reason */
    char refusal[NET_REFUSAL_MAX + 1];
};

/* The signed message: "KVR2-auth" | u8 signer's side | transcript. */
static size_t auth_msg(uint8_t m[42], enum net_hs_side signer, const uint8_t transcript[32])
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
             EVP_DigestUpdate(ctx, up, NET_HELLO_LEN) == 1 &&
             EVP_DigestUpdate(ctx, down, NET_HELLO_LEN) == 1 &&
             EVP_DigestFinal_ex(ctx, out, &n) == 1 && n == 32;
    EVP_MD_CTX_free(ctx);
    return ok ? 0 : -EIO;
}

/* X25519 with the peer's key, then HKDF-SHA256 salted with the transcript: one key per
 * direction. The shared secret never leaves this function. */
static int derive_keys(struct net_handshake *hs, const uint8_t peer_pub[32], char *err,
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
    bool up = hs->side == NET_HS_UP;
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

int net_handshake_new(struct net_handshake **out, const struct net_identity *id,
                      const struct net_hello *mine, const struct net_hs_expect *expect,
                      enum net_hs_side side)
{
    if (side != NET_HS_UP && side != NET_HS_DOWN)
        return -EINVAL;
    struct net_handshake *hs = calloc(1, sizeof *hs);
    if (!hs)
        return -ENOMEM;
    hs->id = id;
    hs->side = side;
    hs->mine = *mine;
    hs->mine.version = NET_VERSION;
    if (id)
        memcpy(hs->mine.node_key, net_identity_pub(id), 32);
    size_t n = 32;
    hs->eph = EVP_PKEY_Q_keygen(NULL, NULL, "X25519");
    if (!hs->eph || EVP_PKEY_get_raw_public_key(hs->eph, hs->mine.ephemeral, &n) != 1 || n != 32 ||
        RAND_bytes(hs->mine.nonce, 32) != 1) {
        net_handshake_free(hs);
        return -EIO;
    }
    hs->expect = *expect;
    snprintf(hs->ring, sizeof hs->ring, "%s", expect->ring ? expect->ring : "");
    hs->expect.ring = hs->ring;
    struct net_frame_hdr h = {.magic = NET_MAGIC, .type = NET_F_HELLO, .payload_len = NET_HELLO_LEN};
    net_frame_hdr_encode(&h, hs->hello_frame);
    net_hello_encode(&hs->mine, hs->hello_frame + NET_HDR_LEN);
    hs->state = HS_WAIT_HELLO;
    *out = hs;
    return 0;
}

void net_handshake_free(struct net_handshake *hs)
{
    if (!hs)
        return;
    EVP_PKEY_free(hs->eph);
    OPENSSL_cleanse(&hs->keys, sizeof hs->keys);
    free(hs);
}

void net_handshake_hello(struct net_handshake *hs, const uint8_t **bytes, size_t *len)
{
    *bytes = hs->hello_frame;
    *len = sizeof hs->hello_frame;
}

const struct net_hello *net_handshake_peer(const struct net_handshake *hs)
{
    return &hs->peer;
}

int net_handshake_expect_key(struct net_handshake *hs, const uint8_t key[32])
{
    if (hs->state != HS_WAIT_HELLO)
        return -EALREADY;
    hs->expect.check_key = true;
    memcpy(hs->expect.node_key, key, 32);
    return 0;
}

bool net_handshake_hello_ok(const struct net_handshake *hs)
{
    return hs->state == HS_WAIT_AUTH || hs->state == HS_DONE;
}

int net_handshake_keys(const struct net_handshake *hs, struct net_link_keys *keys)
{
    if (hs->state != HS_DONE)
        return -EAGAIN;
    *keys = hs->keys;
    return 0;
}

const char *net_handshake_refusal(const struct net_handshake *hs)
{
    return hs && hs->refused ? hs->refusal : NULL;
}

static int hs_fail(struct net_handshake *hs, int rc)
{
    hs->state = HS_FAILED;
    OPENSSL_cleanse(&hs->keys, sizeof hs->keys);
    return rc;
}

/* Check the peer's HELLO against what we expect of it (own_rank: the rank our HELLO claims):
 * 0 or a negative code with err. The words name ranks, not "ours" and "theirs", because the
 * refusing side sends err to the peer, which logs it too. */
static int hello_check(const struct net_hello *p, const struct net_hs_expect *x, uint32_t own_rank,
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

static int on_hello(struct net_handshake *hs, const struct net_frame_hdr *h, const uint8_t *payload,
                    const uint8_t **out, size_t *outlen, char *err, size_t errlen)
{
    if (h->type != NET_F_HELLO) {
        snprintf(err, errlen, "expected HELLO, got %s", net_frame_type_name(h->type));
        return -EPROTO;
    }
    /* The version first, so an older peer gets a clear word rather than a length mismatch. */
    if (h->payload_len >= 4 && util_le32_get(payload) != NET_VERSION) {
        snprintf(err, errlen, "peer speaks ring protocol version %u, this kvd speaks %u "
                 "(run the same kvd release on every stage)", util_le32_get(payload), NET_VERSION);
        return -EPROTO;
    }
    struct net_hello p;
    int rc = net_hello_decode(payload, h->payload_len, &p, err, errlen);
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
    const uint8_t *own = hs->hello_frame + NET_HDR_LEN;
    bool up = hs->side == NET_HS_UP;
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
    struct net_frame_hdr ah = {.magic = NET_MAGIC, .type = NET_F_AUTH, .payload_len = NET_AUTH_LEN};
    net_frame_hdr_encode(&ah, hs->auth_frame);
    memcpy(hs->auth_frame + NET_HDR_LEN, sig, 64);
    *out = hs->auth_frame;
    *outlen = sizeof hs->auth_frame;
    return 0;
}

int net_handshake_feed(struct net_handshake *hs, const struct net_frame_hdr *h,
                       const uint8_t *payload, const uint8_t **out, size_t *outlen,
                       char *err, size_t errlen)
{
    *out = NULL;
    *outlen = 0;
    if (hs->state == HS_FAILED || hs->state == HS_DONE) {
        snprintf(err, errlen, "handshake already %s", hs->state == HS_DONE ? "done" : "failed");
        return -EPROTO;
    }
    if (h->type == NET_F_ERROR) {
        /* The reason as the peer gave it, bounded and printable (it reaches our log and,
         * through rank 0, a client). */
        size_t n = h->payload_len > 4 ? h->payload_len - 4 : 0;
        net_text_clean(hs->refusal, sizeof hs->refusal, payload + 4, n);
        hs->refused = true;
        snprintf(err, errlen, "peer refused the link: %s", hs->refusal);
        return hs_fail(hs, -ECONNREFUSED);
    }
    if (h->session || h->pos || h->n_tokens || h->flags) {
        snprintf(err, errlen, "%s frame during the handshake has non-zero session/pos/n_tokens/flags",
                 net_frame_type_name(h->type));
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
    if (h->type != NET_F_AUTH) {
        snprintf(err, errlen, "expected AUTH, got %s", net_frame_type_name(h->type));
        return hs_fail(hs, -EPROTO);
    }
    if (h->payload_len != NET_AUTH_LEN) {
        snprintf(err, errlen, "AUTH payload_len %u is not %u", h->payload_len, NET_AUTH_LEN);
        return hs_fail(hs, -EPROTO);
    }
    uint8_t m[42];
    enum net_hs_side other = hs->side == NET_HS_UP ? NET_HS_DOWN : NET_HS_UP;
    size_t mlen = auth_msg(m, other, hs->transcript);
    if (!net_sig_verify(hs->peer.node_key, m, mlen, payload)) {
        snprintf(err, errlen, "bad signature on the AUTH of rank %u: not its key's signature over "
                 "this link's transcript", hs->peer.rank);
        return hs_fail(hs, -EPERM);
    }
    hs->state = HS_DONE;
    return 1;
}

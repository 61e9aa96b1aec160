/* frame.c — ring frame headers, the streaming frame reader, OPEN and HELLO payloads, and the
 * link handshake state machine (no I/O here, so the fuzz target can drive all of it). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/rand.h>

#include "net/net.h"
#include "util/util.h"

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24);
}
static void put64(uint8_t *p, uint64_t v) { put32(p, (uint32_t)v); put32(p + 4, (uint32_t)(v >> 32)); }
static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }
static void putf(uint8_t *p, float f) { uint32_t v; memcpy(&v, &f, 4); put32(p, v); }
static float getf(const uint8_t *p) { uint32_t v = get32(p); float f; memcpy(&f, &v, 4); return f; }

const char *net_frame_type_name(uint32_t type)
{
    static const char *names[] = {"?", "HELLO", "AUTH", "OPEN", "ACT", "TOKEN", "CLOSE",
                                  "ERROR", "PING", "PONG"};
    return type <= NET_F_MAX ? names[type] : "?";
}

void net_frame_hdr_encode(const struct net_frame_hdr *h, uint8_t out[NET_HDR_LEN])
{
    put32(out, h->magic ? h->magic : NET_MAGIC);
    out[4] = h->type;
    out[5] = h->flags;
    out[6] = (uint8_t)h->reserved;
    out[7] = (uint8_t)(h->reserved >> 8);
    put64(out + 8, h->session);
    put32(out + 16, h->pos);
    put32(out + 20, h->n_tokens);
    put32(out + 24, h->payload_len);
}

int net_frame_hdr_decode(const uint8_t in[NET_HDR_LEN], struct net_frame_hdr *h,
                         uint32_t max_payload, char *err, size_t errlen)
{
    h->magic = get32(in);
    h->type = in[4];
    h->flags = in[5];
    h->reserved = (uint16_t)(in[6] | in[7] << 8);
    h->session = get64(in + 8);
    h->pos = get32(in + 16);
    h->n_tokens = get32(in + 20);
    h->payload_len = get32(in + 24);
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
    if (h->flags & ~(NET_FL_LAST | NET_FL_LOGITS)) {
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

void net_open_encode(const struct net_open_params *p, uint8_t out[NET_OPEN_LEN])
{
    memset(out, 0, NET_OPEN_LEN);
    put64(out, p->seed);
    putf(out + 8, p->temperature);
    putf(out + 12, p->top_p);
    putf(out + 16, p->min_p);
    putf(out + 20, p->repeat_penalty);
    putf(out + 24, p->freq_penalty);
    putf(out + 28, p->presence_penalty);
    put32(out + 32, (uint32_t)p->top_k);
    put32(out + 36, (uint32_t)p->penalty_last_n);
    put32(out + 40, p->max_tokens);
    put32(out + 44, p->n_ctx);
}

void net_open_decode(const uint8_t in[NET_OPEN_LEN], struct net_open_params *p)
{
    memset(p, 0, sizeof *p);
    p->seed = get64(in);
    p->temperature = getf(in + 8);
    p->top_p = getf(in + 12);
    p->min_p = getf(in + 16);
    p->repeat_penalty = getf(in + 20);
    p->freq_penalty = getf(in + 24);
    p->presence_penalty = getf(in + 28);
    p->top_k = (int32_t)get32(in + 32);
    p->penalty_last_n = (int32_t)get32(in + 36);
    p->max_tokens = get32(in + 40);
    p->n_ctx = get32(in + 44);
}

/* ---- reader ---- */

void net_frame_reader_init(struct net_frame_reader *r, uint32_t max_payload)
{
    memset(r, 0, sizeof *r);
    r->max_payload = max_payload;
}

void net_frame_reader_free(struct net_frame_reader *r)
{
    free(r->buf);
    memset(r, 0, sizeof *r);
}

int net_frame_reader_push(struct net_frame_reader *r, const void *data, size_t len)
{
    if (r->off > 0) {   /* drop consumed bytes before growing */
        memmove(r->buf, r->buf + r->off, r->len - r->off);
        r->len -= r->off;
        r->off = 0;
    }
    if (len > SIZE_MAX - r->len)
        return -EOVERFLOW;
    size_t need = r->len + len;
    if (need > r->cap) {
        size_t cap = r->cap ? r->cap : 4096;
        while (cap < need)
            cap *= 2;
        uint8_t *nb = realloc(r->buf, cap);
        if (!nb)
            return -ENOMEM;
        r->buf = nb;
        r->cap = cap;
    }
    if (len)
        memcpy(r->buf + r->len, data, len);
    r->len += len;
    return 0;
}

int net_frame_reader_next(struct net_frame_reader *r, struct net_frame_hdr *h,
                          const uint8_t **payload, char *err, size_t errlen)
{
    size_t avail = r->len - r->off;
    if (avail < NET_HDR_LEN)
        return 0;
    int rc = net_frame_hdr_decode(r->buf + r->off, h, r->max_payload, err, errlen);
    if (rc < 0)
        return rc;
    if (avail - NET_HDR_LEN < h->payload_len)
        return 0;
    *payload = r->buf + r->off + NET_HDR_LEN;
    r->off += NET_HDR_LEN + (size_t)h->payload_len;
    if (r->off == r->len)
        r->off = r->len = 0;   /* payload stays valid: nothing overwrites it before next push */
    return 1;
}

/* ---- HELLO ---- */

void net_hello_encode(const struct net_hello *h, uint8_t out[NET_HELLO_LEN])
{
    memset(out, 0, NET_HELLO_LEN);
    put32(out, h->version);
    put32(out + 4, h->rank);
    put32(out + 8, h->n_ranks);
    size_t n = strnlen(h->ring, NET_RING_ID_MAX);
    memcpy(out + 12, h->ring, n);
    memcpy(out + 76, h->node_key, 32);
    memcpy(out + 108, h->manifest_hash, 32);
    memcpy(out + 140, h->nonce, 32);
}

int net_hello_decode(const uint8_t *in, size_t len, struct net_hello *h, char *err, size_t errlen)
{
    if (len != NET_HELLO_LEN) {
        snprintf(err, errlen, "HELLO payload_len %zu is not %u", len, NET_HELLO_LEN);
        return -EPROTO;
    }
    memset(h, 0, sizeof *h);
    h->version = get32(in);
    h->rank = get32(in + 4);
    h->n_ranks = get32(in + 8);
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
    return 0;
}

/* ---- handshake ---- */

enum { HS_WAIT_HELLO, HS_WAIT_AUTH, HS_DONE, HS_FAILED };

struct net_handshake {
    const struct net_identity *id;
    struct net_hello mine, peer;
    struct net_hs_expect expect;
    char ring[NET_RING_ID_MAX + 1];
    int state;
    uint8_t hello_frame[NET_HDR_LEN + NET_HELLO_LEN];
    uint8_t auth_frame[NET_HDR_LEN + NET_AUTH_LEN];
};

/* The signed message: "KVR1-auth" | nonce | signer key | u32 signer rank | ring[64]. */
static size_t auth_msg(uint8_t *m, const uint8_t nonce[32], const uint8_t key[32], uint32_t rank,
                       const char *ring)
{
    memcpy(m, "KVR1-auth", 9);
    memcpy(m + 9, nonce, 32);
    memcpy(m + 41, key, 32);
    put32(m + 73, rank);
    memset(m + 77, 0, NET_RING_ID_MAX);
    memcpy(m + 77, ring, strnlen(ring, NET_RING_ID_MAX));
    return 77 + NET_RING_ID_MAX;
}

int net_handshake_new(struct net_handshake **out, const struct net_identity *id,
                      const struct net_hello *mine, const struct net_hs_expect *expect)
{
    struct net_handshake *hs = calloc(1, sizeof *hs);
    if (!hs)
        return -ENOMEM;
    hs->id = id;
    hs->mine = *mine;
    if (id)
        memcpy(hs->mine.node_key, net_identity_pub(id), 32);
    if (RAND_bytes(hs->mine.nonce, 32) != 1) {
        free(hs);
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

static int hs_fail(struct net_handshake *hs, int rc)
{
    hs->state = HS_FAILED;
    return rc;
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
        size_t n = h->payload_len > 4 ? h->payload_len - 4 : 0;
        if (n > 200)
            n = 200;
        char msg[201];
        for (size_t i = 0; i < n; i++)
            msg[i] = (payload[4 + i] >= 0x20 && payload[4 + i] < 0x7f) ? (char)payload[4 + i] : '?';
        msg[n] = 0;
        snprintf(err, errlen, "peer refused the link: %s", msg);
        return hs_fail(hs, -ECONNREFUSED);
    }
    if (h->session || h->pos || h->n_tokens || h->flags) {
        snprintf(err, errlen, "%s frame during the handshake has non-zero session/pos/n_tokens/flags",
                 net_frame_type_name(h->type));
        return hs_fail(hs, -EPROTO);
    }
    if (hs->state == HS_WAIT_HELLO) {
        if (h->type != NET_F_HELLO) {
            snprintf(err, errlen, "expected HELLO, got %s", net_frame_type_name(h->type));
            return hs_fail(hs, -EPROTO);
        }
        struct net_hello p;
        int rc = net_hello_decode(payload, h->payload_len, &p, err, errlen);
        if (rc < 0)
            return hs_fail(hs, rc);
        const struct net_hs_expect *x = &hs->expect;
        if (p.version != NET_VERSION) {
            snprintf(err, errlen, "protocol version %u, expected %u", p.version, NET_VERSION);
            return hs_fail(hs, -EPROTO);
        }
        if (strcmp(p.ring, x->ring) != 0) {
            snprintf(err, errlen, "wrong ring '%s', expected '%s'", p.ring, x->ring);
            return hs_fail(hs, -EPERM);
        }
        if (p.n_ranks != x->n_ranks) {
            snprintf(err, errlen, "peer's ring has %u ranks, expected %u", p.n_ranks, x->n_ranks);
            return hs_fail(hs, -EPERM);
        }
        if (p.rank != x->rank) {
            snprintf(err, errlen, "wrong rank %u, expected %u", p.rank, x->rank);
            return hs_fail(hs, -EPERM);
        }
        if (memcmp(p.manifest_hash, x->manifest_hash, 32) != 0) {
            char a[65], b[65];
            util_hex_encode(p.manifest_hash, 32, a);
            util_hex_encode(x->manifest_hash, 32, b);
            snprintf(err, errlen, "manifest hash %.16s... differs from ours %.16s...", a, b);
            return hs_fail(hs, -EPERM);
        }
        if (x->check_key && memcmp(p.node_key, x->node_key, 32) != 0) {
            char a[65];
            util_hex_encode(p.node_key, 32, a);
            snprintf(err, errlen, "node key %.16s... is not the one the manifest names for rank %u",
                     a, p.rank);
            return hs_fail(hs, -EPERM);
        }
        hs->peer = p;
        uint8_t m[200], sig[64];
        size_t mlen = auth_msg(m, p.nonce, hs->mine.node_key, hs->mine.rank, hs->ring);
        if (!hs->id || net_identity_sign(hs->id, m, mlen, sig) < 0) {
            snprintf(err, errlen, "signing the AUTH failed");
            return hs_fail(hs, -EIO);
        }
        struct net_frame_hdr ah = {.magic = NET_MAGIC, .type = NET_F_AUTH, .payload_len = NET_AUTH_LEN};
        net_frame_hdr_encode(&ah, hs->auth_frame);
        memcpy(hs->auth_frame + NET_HDR_LEN, sig, 64);
        *out = hs->auth_frame;
        *outlen = sizeof hs->auth_frame;
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
    uint8_t m[200];
    size_t mlen = auth_msg(m, hs->mine.nonce, hs->peer.node_key, hs->peer.rank, hs->ring);
    if (!net_sig_verify(hs->peer.node_key, m, mlen, payload)) {
        snprintf(err, errlen, "bad signature from rank %u over our nonce", hs->peer.rank);
        return hs_fail(hs, -EPERM);
    }
    hs->state = HS_DONE;
    return 1;
}

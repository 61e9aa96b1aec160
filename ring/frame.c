/* frame.c — ring frame headers, the streaming frame reader, OPEN and HELLO payloads (no I/O
 * here, so the fuzz target can drive all of it). The protocol: ring/ring.h's protocol section
 * and docs/security.md. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ring/ring.h"
#include "util/util.h"

static void putf(uint8_t *p, float f) { uint32_t v; memcpy(&v, &f, 4); util_le32_put(p, v); }
static float getf(const uint8_t *p) { uint32_t v = util_le32_get(p); float f; memcpy(&f, &v, 4); return f; }

const char *ring_frame_type_name(uint32_t type)
{
    static const char *names[] = {"?", "HELLO", "AUTH", "OPEN", "ACT", "TOKEN", "CLOSE",
                                  "ERROR", "PING", "PONG", "STATUS"};
    return type <= RING_F_MAX ? names[type] : "?";
}

void ring_frame_hdr_encode(const struct ring_frame_hdr *h, uint8_t out[RING_HDR_LEN])
{
    util_le32_put(out, h->magic ? h->magic : RING_MAGIC);
    out[4] = h->type;
    out[5] = h->flags;
    out[6] = (uint8_t)h->reserved;
    out[7] = (uint8_t)(h->reserved >> 8);
    util_le64_put(out + 8, h->session);
    util_le32_put(out + 16, h->pos);
    util_le32_put(out + 20, h->n_tokens);
    util_le32_put(out + 24, h->payload_len);
}

int ring_frame_hdr_decode(const uint8_t in[RING_HDR_LEN], struct ring_frame_hdr *h,
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
    if (h->magic != RING_MAGIC) {
        snprintf(err, errlen, "frame magic 0x%08x is not KVR1 (0x%08x)", h->magic, RING_MAGIC);
        return -EPROTO;
    }
    if (h->type < 1 || h->type > RING_F_MAX) {
        snprintf(err, errlen, "frame type %u unknown (1..%u)", h->type, RING_F_MAX);
        return -EPROTO;
    }
    if (h->reserved != 0) {
        snprintf(err, errlen, "frame reserved field %u is not 0", h->reserved);
        return -EPROTO;
    }
    if (h->flags & ~(RING_FL_LAST | RING_FL_LOGITS | RING_FL_REPLAY | RING_FL_DRAFT)) {
        snprintf(err, errlen, "frame flags 0x%02x has unknown bits", h->flags);
        return -EPROTO;
    }
    uint32_t cap = max_payload < RING_PAYLOAD_HARD_MAX ? max_payload : RING_PAYLOAD_HARD_MAX;
    if (h->payload_len > cap) {
        snprintf(err, errlen, "%s frame payload_len %u exceeds the cap %u",
                 ring_frame_type_name(h->type), h->payload_len, cap);
        return -EMSGSIZE;
    }
    return 0;
}

void ring_open_encode(const struct ring_open_params *p, uint8_t out[RING_OPEN_LEN])
{
    memset(out, 0, RING_OPEN_LEN);
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

void ring_open_decode(const uint8_t in[RING_OPEN_LEN], struct ring_open_params *p)
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

void ring_frame_reader_init(struct ring_frame_reader *r, uint32_t max_payload)
{
    memset(r, 0, sizeof *r);
    r->max_payload = max_payload;
}

void ring_frame_reader_free(struct ring_frame_reader *r)
{
    util_buf_free(&r->buf);
    memset(r, 0, sizeof *r);
}

int ring_frame_reader_push(struct ring_frame_reader *r, const void *data, size_t len)
{
    util_buf_consume(&r->buf, r->off);   /* drop consumed bytes before growing */
    r->off = 0;
    int rc = util_buf_append(&r->buf, data, len, SIZE_MAX);
    return rc == -E2BIG ? -EOVERFLOW : rc;
}

int ring_frame_reader_next(struct ring_frame_reader *r, struct ring_frame_hdr *h,
                          const uint8_t **payload, char *err, size_t errlen)
{
    size_t avail = r->buf.len - r->off;
    if (avail < RING_HDR_LEN)
        return 0;
    int rc = ring_frame_hdr_decode(r->buf.p + r->off, h, r->max_payload, err, errlen);
    if (rc < 0)
        return rc;
    if (avail - RING_HDR_LEN < h->payload_len)
        return 0;
    *payload = r->buf.p + r->off + RING_HDR_LEN;
    r->off += RING_HDR_LEN + (size_t)h->payload_len;
    if (r->off == r->buf.len)
        r->off = r->buf.len = 0;   /* payload stays valid: nothing overwrites it before next push */
    return 1;
}

/* ---- HELLO ---- */

void ring_hello_encode(const struct ring_hello *h, uint8_t out[RING_HELLO_LEN])
{
    memset(out, 0, RING_HELLO_LEN);
    util_le32_put(out, h->version);
    util_le32_put(out + 4, h->rank);
    util_le32_put(out + 8, h->n_ranks);
    size_t n = strnlen(h->ring, RING_RING_ID_MAX);
    memcpy(out + 12, h->ring, n);
    memcpy(out + 76, h->node_key, 32);
    memcpy(out + 108, h->manifest_hash, 32);
    memcpy(out + 140, h->nonce, 32);
    memcpy(out + 172, h->ephemeral, 32);
}

int ring_hello_decode(const uint8_t *in, size_t len, struct ring_hello *h, char *err, size_t errlen)
{
    if (len != RING_HELLO_LEN) {
        snprintf(err, errlen, "HELLO payload_len %zu is not %u", len, RING_HELLO_LEN);
        return -EPROTO;
    }
    memset(h, 0, sizeof *h);
    h->version = util_le32_get(in);
    h->rank = util_le32_get(in + 4);
    h->n_ranks = util_le32_get(in + 8);
    memcpy(h->ring, in + 12, RING_RING_ID_MAX);
    h->ring[RING_RING_ID_MAX] = 0;
    /* The ring id must be printable and NUL-padded (no bytes after the first NUL). */
    size_t n = strlen(h->ring);
    for (size_t i = 0; i < RING_RING_ID_MAX; i++) {
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

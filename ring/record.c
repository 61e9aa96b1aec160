/* record.c — the sealed records of an established ring link: ChaCha20-Poly1305 (OpenSSL
 * EVP) with a key per direction and a 64-bit sequence number per direction in the nonce, so
 * no nonce is ever used twice under a key and a record that was altered, replayed, reordered,
 * dropped or cut short does not open. Layout: ring/ring.h's protocol section. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "ring/ring.h"
#include "util/util.h"

struct ring_rec {
    EVP_CIPHER_CTX *ctx;
    uint64_t seq;
    uint8_t *plain;             /* the last opened frame (ring_rec_next's payload lives here) */
    size_t cap;
};

int ring_rec_new(struct ring_rec **out, const uint8_t key[32])
{
    struct ring_rec *r = calloc(1, sizeof *r);
    if (!r)
        return -ENOMEM;
    r->ctx = EVP_CIPHER_CTX_new();
    if (!r->ctx || EVP_CipherInit_ex(r->ctx, EVP_chacha20_poly1305(), NULL, key, NULL, -1) != 1) {
        ring_rec_free(r);
        return -EIO;
    }
    *out = r;
    return 0;
}

void ring_rec_free(struct ring_rec *r)
{
    if (!r)
        return;
    EVP_CIPHER_CTX_free(r->ctx);   /* cleanses the key schedule */
    free(r->plain);
    free(r);
}

uint64_t ring_rec_seq(const struct ring_rec *r)
{
    return r->seq;
}



/* One AEAD pass over in[n] into out[n] with the length bytes as associated data: seal
 * (enc 1, tag written) or open (enc 0, tag checked). 0 or -EIO (open: not authentic). */
static int rec_crypt(struct ring_rec *r, int enc, const uint8_t lenb[4], const uint8_t *in, size_t n,
                 uint8_t *out, uint8_t tag[RING_REC_TAG])
{
    uint8_t iv[12] = {0};
    for (int i = 0; i < 8; i++)
        iv[4 + i] = (uint8_t)(r->seq >> (8 * i));
    int len = 0;
    if (EVP_CipherInit_ex(r->ctx, NULL, NULL, NULL, iv, enc) != 1 ||
        EVP_CipherUpdate(r->ctx, NULL, &len, lenb, 4) != 1)
        return -EIO;
    /* EVP lengths are int: large frames go in slices */
    for (size_t off = 0; off < n;) {
        size_t k = n - off > (1u << 30) ? (1u << 30) : n - off;
        if (EVP_CipherUpdate(r->ctx, out + off, &len, in + off, (int)k) != 1)
            return -EIO;
        off += k;
    }
    if (!enc && EVP_CIPHER_CTX_ctrl(r->ctx, EVP_CTRL_AEAD_SET_TAG, RING_REC_TAG, tag) != 1)
        return -EIO;
    if (EVP_CipherFinal_ex(r->ctx, out + n, &len) != 1)
        return -EIO;
    if (enc && EVP_CIPHER_CTX_ctrl(r->ctx, EVP_CTRL_AEAD_GET_TAG, RING_REC_TAG, tag) != 1)
        return -EIO;
    return 0;
}

int ring_rec_seal(struct ring_rec *r, uint8_t *rec, size_t len)
{
    if (len > RING_HDR_LEN + (size_t)RING_PAYLOAD_HARD_MAX)
        return -EMSGSIZE;
    if (r->seq == UINT64_MAX)
        return -EOVERFLOW;
    util_le32_put(rec, (uint32_t)(len + RING_REC_TAG));
    if (rec_crypt(r, 1, rec, rec + 4, len, rec + 4, rec + 4 + len) < 0)
        return -EIO;
    r->seq++;
    return 0;
}

int ring_rec_next(struct ring_rec *r, struct ring_frame_reader *rd, struct ring_frame_hdr *h,
                 const uint8_t **payload, char *err, size_t errlen)
{
    size_t avail = rd->buf.len - rd->off;
    if (avail < 4)
        return 0;
    const uint8_t *p = rd->buf.p + rd->off;
    uint32_t n = util_le32_get(p);
    uint32_t cap = rd->max_payload < RING_PAYLOAD_HARD_MAX ? rd->max_payload : RING_PAYLOAD_HARD_MAX;
    if (n < RING_HDR_LEN + RING_REC_TAG || n - RING_HDR_LEN - RING_REC_TAG > cap) {
        snprintf(err, errlen, "record %llu: length %u outside [%u, %u + the payload cap %u]",
                 (unsigned long long)r->seq, n, RING_HDR_LEN + RING_REC_TAG,
                 RING_HDR_LEN + RING_REC_TAG, cap);
        return -EMSGSIZE;
    }
    if (avail - 4 < n)
        return 0;
    if (r->seq == UINT64_MAX) {
        snprintf(err, errlen, "record sequence numbers spent: the link must be re-established");
        return -EOVERFLOW;
    }
    size_t plen = n - RING_REC_TAG;
    if (plen > r->cap) {
        uint8_t *nb = realloc(r->plain, plen);
        if (!nb) {
            snprintf(err, errlen, "out of memory opening a %u-byte record", n);
            return -ENOMEM;
        }
        r->plain = nb;
        r->cap = plen;
    }
    uint8_t tag[RING_REC_TAG];
    memcpy(tag, p + 4 + plen, RING_REC_TAG);
    if (rec_crypt(r, 0, p, p + 4, plen, r->plain, tag) < 0) {
        snprintf(err, errlen, "record %llu (%u bytes) does not authenticate: altered, replayed, "
                 "reordered or dropped on the way", (unsigned long long)r->seq, n);
        return -EBADMSG;
    }
    r->seq++;
    rd->off += 4 + (size_t)n;
    if (rd->off == rd->buf.len)
        rd->off = rd->buf.len = 0;
    int rc = ring_frame_hdr_decode(r->plain, h, rd->max_payload, err, errlen);
    if (rc < 0)
        return rc;
    if (h->payload_len != plen - RING_HDR_LEN) {
        snprintf(err, errlen, "%s frame payload_len %u, but its record holds %zu bytes",
                 ring_frame_type_name(h->type), h->payload_len, plen - RING_HDR_LEN);
        return -EPROTO;
    }
    *payload = r->plain + RING_HDR_LEN;
    return 1;
}

/* merkle.c — the Merkle tree a stage's work receipts commit to (docs/market.md, "Audits"):
 * one leaf per position of a session, SHA-256(0x00 || u32le pos || row bytes), an inner node
 * SHA-256(0x01 || left || right), a level's odd last node promoted unchanged. The two prefixes
 * keep a leaf from passing for an inner node; the position inside the leaf binds each row to
 * where it was in the session, so an opened row cannot be shown at another position. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "ring/ring.h"
#include "util/util.h"

static void sha(const void *a, size_t na, const void *b, size_t nb, const void *c, size_t nc,
                uint8_t out[32])
{
    EVP_MD_CTX *m = EVP_MD_CTX_new();
    unsigned dl = 0;
    if (!m || !EVP_DigestInit_ex(m, EVP_sha256(), NULL) || !EVP_DigestUpdate(m, a, na) ||
        !EVP_DigestUpdate(m, b, nb) || (nc && !EVP_DigestUpdate(m, c, nc)) ||
        !EVP_DigestFinal_ex(m, out, &dl))
        memset(out, 0, 32);   /* OpenSSL out of memory: a root nobody else computes */
    EVP_MD_CTX_free(m);
}

void ring_merkle_leaf(uint32_t pos, const void *row, size_t len, uint8_t out[32])
{
    uint8_t h[5] = {0x00, (uint8_t)pos, (uint8_t)(pos >> 8), (uint8_t)(pos >> 16),
                    (uint8_t)(pos >> 24)};
    sha(h, sizeof h, row ? row : "", row ? len : 0, NULL, 0, out);
}

void ring_merkle_node(const uint8_t l[32], const uint8_t r[32], uint8_t out[32])
{
    static const uint8_t one = 0x01;
    sha(&one, 1, l, 32, r, 32, out);
}

/* One level up in place: lv[0..n) becomes lv[0..(n+1)/2). */
static size_t level_up(uint8_t (*lv)[32], size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i += 2, k++) {
        if (i + 1 < n)
            ring_merkle_node(lv[i], lv[i + 1], lv[k]);
        else
            memmove(lv[k], lv[i], 32);   /* the odd one out is promoted */
    }
    return k;
}

/* Climb the tree of leaves[n] to its root; with path, collect leaf idx's siblings on the way. */
static int climb(const uint8_t (*leaves)[32], size_t n, size_t idx, uint8_t (*path)[32],
                 size_t *len, uint8_t root[32])
{
    if (n > RING_MERKLE_LEAVES_MAX)
        return -E2BIG;
    uint8_t (*lv)[32] = malloc(n * 32);
    if (!lv)
        return -ENOMEM;
    memcpy(lv, leaves, n * 32);
    while (n > 1) {
        if (path && !(idx == n - 1 && (n & 1)))   /* a promoted node has no sibling */
            memcpy(path[(*len)++], lv[idx ^ 1], 32);
        n = level_up(lv, n);
        idx /= 2;
    }
    memcpy(root, lv[0], 32);
    free(lv);
    return 0;
}

int ring_merkle_root(const uint8_t (*leaves)[32], size_t n, uint8_t root[32])
{
    if (n == 0) {
        sha("", 0, "", 0, NULL, 0, root);
        return 0;
    }
    return climb(leaves, n, 0, NULL, NULL, root);
}

int ring_merkle_proof(const uint8_t (*leaves)[32], size_t n, size_t idx,
                      uint8_t (*path)[32], size_t *len)
{
    uint8_t root[32];
    *len = 0;
    if (idx >= n)
        return -EINVAL;
    return climb(leaves, n, idx, path, len, root);
}

bool ring_merkle_root_from(const uint8_t leaf[32], size_t idx, size_t n,
                           const uint8_t (*path)[32], size_t len, uint8_t root[32])
{
    if (idx >= n || n > RING_MERKLE_LEAVES_MAX)
        return false;
    uint8_t h[32];
    size_t k = 0;
    memcpy(h, leaf, 32);
    while (n > 1) {
        if (!(idx == n - 1 && (n & 1))) {
            if (k >= len)
                return false;
            if (idx & 1)
                ring_merkle_node(path[k], h, h);
            else
                ring_merkle_node(h, path[k], h);
            k++;
        }
        idx /= 2;
        n = (n + 1) / 2;
    }
    memcpy(root, h, 32);
    return k == len;
}

bool ring_merkle_verify(const uint8_t leaf[32], size_t idx, size_t n, const uint8_t (*path)[32],
                        size_t len, const uint8_t root[32])
{
    uint8_t r[32];
    return ring_merkle_root_from(leaf, idx, n, path, len, r) && memcmp(r, root, 32) == 0;
}

void ring_receipt_fold(const uint8_t root[32], const uint8_t sampling[RING_SAMPLING_LEN],
                       uint8_t out[32])
{
    static const uint8_t two = 0x02;
    uint8_t hs[32];
    sha(sampling, RING_SAMPLING_LEN, NULL, 0, NULL, 0, hs);
    sha(&two, 1, hs, 32, root, 32, out);
}

/* ---- a TOKEN frame's leaf: its summary (ring.h) ---- */

int ring_token_leaf_make(const uint8_t *payload, size_t len, uint32_t n, uint32_t n_vocab,
                         uint8_t out[RING_TOKEN_LEAF_MAX], size_t *out_len, size_t *logits)
{
    *out_len = 0;
    *logits = 0;
    if (n < 1 || n > RING_TOKENS_MAX || len < 8u * n)
        return -EINVAL;
    size_t rest = len - 8u * n, lg = (size_t)n * n_vocab * 4u, d;
    if (rest % 4)
        return -EINVAL;
    if (rest <= 4u * RING_DRAFTS_MAX) {
        d = rest / 4;
        lg = 0;
    } else if (n_vocab > 0 && rest >= lg && rest - lg <= 4u * RING_DRAFTS_MAX) {
        d = (rest - lg) / 4;
    } else {
        return -EINVAL;
    }
    util_le32_put(out, RING_TOKEN_LEAF_MAGIC);
    out[4] = (uint8_t)n;
    out[5] = 0;
    out[6] = (uint8_t)d;
    out[7] = 0;
    size_t head = 8u * n + 4u * d, o = 8 + head;
    memcpy(out + 8, payload, head);
    if (lg) {
        *logits = head;
        for (uint32_t i = 0; i < n; i++, o += 32)
            sha(payload + head + (size_t)i * n_vocab * 4u, (size_t)n_vocab * 4u, NULL, 0, NULL, 0,
                out + o);
    }
    *out_len = o;
    return 0;
}

int ring_token_leaf_parse(const uint8_t *row, size_t len, struct ring_token_leaf *t)
{
    memset(t, 0, sizeof *t);
    if (!row || len < 8 || util_le32_get(row) != RING_TOKEN_LEAF_MAGIC)
        return -ENOENT;
    uint32_t n = row[4] | (uint32_t)row[5] << 8, d = row[6] | (uint32_t)row[7] << 8;
    if (n < 1 || n > RING_TOKENS_MAX || d > RING_DRAFTS_MAX)
        return -EINVAL;
    size_t body = 8 + 8u * n + 4u * d;
    if (len != body && len != body + 32u * n)
        return -EINVAL;
    t->n = n;
    t->n_drafts = d;
    t->tokens = row + 8;
    t->logprobs = row + 8 + 4u * n;
    t->drafts = row + 8 + 8u * n;
    t->logits_sha = len > body ? row + body : NULL;
    return 0;
}

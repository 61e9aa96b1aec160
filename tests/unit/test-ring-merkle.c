/* test-ring-merkle — the receipts' Merkle tree (ring/merkle.c): leaf and node hashes
 * against SHA-256 computed here, the shapes of small trees (the odd node promoted), every
 * proof of every leaf of trees of 1 to 70 leaves verifying, and refusals: another row, another
 * position, another index, a path cut short or too long, a flipped bit. A TOKEN's leaf: its
 * summary made from payloads with and without drafts and logits, read back, and refusals of
 * payloads and summaries of the wrong shape. */
#include <openssl/evp.h>

#include <string.h>

#include "ring/ring.h"
#include "util/util.h"
#include "tests/lib/t.h"

static void sha(const void *p, size_t n, uint8_t out[32])
{
    unsigned dl = 32;
    EVP_Digest(p, n, out, &dl, EVP_sha256(), NULL);
}

T_CASE(merkle_hashes)
{
    uint8_t buf[5 + 8] = {0x00, 0x07, 0x01, 0x00, 0x00, 'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'};
    uint8_t want[32], got[32];
    sha(buf, sizeof buf, want);
    ring_merkle_leaf(263, "abcdefgh", 8, got);
    T_CHECK(!memcmp(want, got, 32), "leaf = SHA-256(0x00 || u32le pos || row)");
    uint8_t l[32], r[32], cat[65];
    ring_merkle_leaf(0, "x", 1, l);
    ring_merkle_leaf(1, "y", 1, r);
    cat[0] = 0x01;
    memcpy(cat + 1, l, 32);
    memcpy(cat + 33, r, 32);
    sha(cat, sizeof cat, want);
    ring_merkle_node(l, r, got);
    T_CHECK(!memcmp(want, got, 32), "node = SHA-256(0x01 || left || right)");
    ring_merkle_leaf(1, "x", 1, got);
    T_CHECK(memcmp(l, got, 32) != 0, "the same row at another position is another leaf");
}

T_CASE(merkle_shapes)
{
    uint8_t lv[3][32], root[32], n01[32], want[32];
    for (uint32_t i = 0; i < 3; i++)
        ring_merkle_leaf(i, &i, sizeof i, lv[i]);
    T_CHECK(ring_merkle_root((const uint8_t (*)[32])lv, 1, root) == 0 && !memcmp(root, lv[0], 32),
            "one leaf is its own root");
    ring_merkle_node(lv[0], lv[1], n01);
    T_CHECK(ring_merkle_root((const uint8_t (*)[32])lv, 2, root) == 0 && !memcmp(root, n01, 32),
            "two leaves");
    ring_merkle_node(n01, lv[2], want);
    T_CHECK(ring_merkle_root((const uint8_t (*)[32])lv, 3, root) == 0 && !memcmp(root, want, 32),
            "three leaves: the third promoted, then joined");
    uint8_t empty[32];
    sha("", 0, want);
    T_CHECK(ring_merkle_root(NULL, 0, empty) == 0 && !memcmp(empty, want, 32), "no leaves");
}

T_CASE(merkle_proofs)
{
    enum { N = 70 };
    static uint8_t lv[N][32];
    for (uint32_t i = 0; i < N; i++)
        ring_merkle_leaf(100 + i, &i, sizeof i, lv[i]);
    int bad = 0, accepted_wrong = 0;
    for (size_t n = 1; n <= N; n++) {
        uint8_t root[32];
        T_ASSERT(ring_merkle_root((const uint8_t (*)[32])lv, n, root) == 0, "root of %zu", n);
        for (size_t i = 0; i < n; i++) {
            uint8_t path[RING_MERKLE_DEPTH_MAX][32], x[32];
            size_t len = 0;
            if (ring_merkle_proof((const uint8_t (*)[32])lv, n, i, path, &len) ||
                !ring_merkle_verify(lv[i], i, n, (const uint8_t (*)[32])path, len, root)) {
                bad++;
                continue;
            }
            /* another leaf or index; the path cut, lengthened or flipped (the leaf count is not
             * bound by the root, so it is not tried: the verifier knows it from the receipt) */
            accepted_wrong += n > 1 && ring_merkle_verify(lv[(i + 1) % n], i, n,
                                                          (const uint8_t (*)[32])path, len, root);
            accepted_wrong += n > 1 && ring_merkle_verify(lv[i], (i + 1) % n, n,
                                                          (const uint8_t (*)[32])path, len, root);
            accepted_wrong += len > 0 && ring_merkle_verify(lv[i], i, n, (const uint8_t (*)[32])path,
                                                            len - 1, root);
            memcpy(path[len], lv[0], 32);
            accepted_wrong += len < RING_MERKLE_DEPTH_MAX &&
                              ring_merkle_verify(lv[i], i, n, (const uint8_t (*)[32])path, len + 1, root);
            if (len) {
                path[len / 2][7] ^= 0x10;
                accepted_wrong += ring_merkle_verify(lv[i], i, n, (const uint8_t (*)[32])path, len, root);
            }
            memcpy(x, lv[i], 32);
            x[31] ^= 1;
            accepted_wrong += ring_merkle_verify(x, i, n, (const uint8_t (*)[32])path, len, root);
            accepted_wrong += ring_merkle_verify(lv[i], n, n, (const uint8_t (*)[32])path, len, root);
        }
    }
    T_CHECK(bad == 0, "%d proofs did not verify", bad);
    T_CHECK(accepted_wrong == 0, "%d wrong proofs were accepted", accepted_wrong);
    uint8_t path[RING_MERKLE_DEPTH_MAX][32];
    size_t len;
    T_CHECK(ring_merkle_proof((const uint8_t (*)[32])lv, 3, 3, path, &len) == -EINVAL,
            "a proof of a leaf past the end");
}

/* A TOKEN payload of n tokens, d drafts and (V > 0) n rows of V logits into p: its length. */
static size_t token_payload(uint8_t *p, uint32_t n, uint32_t d, uint32_t V)
{
    size_t o = 0;
    for (uint32_t i = 0; i < n; i++, o += 4)
        util_le32_put(p + o, 100 + i);
    for (uint32_t i = 0; i < n; i++, o += 4) {
        float lp = -0.25f * (float)i;
        memcpy(p + o, &lp, 4);
    }
    for (uint32_t i = 0; i < d; i++, o += 4)
        util_le32_put(p + o, 200 + i);
    for (uint32_t i = 0; i < n * V; i++, o += 4) {
        float l = (float)i * 0.5f;
        memcpy(p + o, &l, 4);
    }
    return o;
}

T_CASE(token_leaf)
{
    enum { V = 40 };
    static uint8_t p[8 * RING_TOKENS_MAX + 4 * RING_DRAFTS_MAX + 4 * RING_TOKENS_MAX * V];
    uint8_t sum[RING_TOKEN_LEAF_MAX], want[32];
    size_t sl, lg;
    struct ring_token_leaf t;
    const uint32_t shapes[][3] = {{1, 0, 0}, {1, 0, V}, {3, 5, 0}, {3, 5, V}, {15, 14, V},
                                  {1, 14, 0}, {15, 0, 0}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        uint32_t n = shapes[s][0], d = shapes[s][1], v = shapes[s][2];
        size_t len = token_payload(p, n, d, v);
        T_CHECK(ring_token_leaf_make(p, len, n, V, sum, &sl, &lg) == 0, "shape %zu made", s);
        T_CHECK(sl == 8 + 8 * n + 4 * d + (v ? 32 * n : 0) && lg == (v ? 8 * n + 4 * d : 0),
                "shape %zu: %zu bytes, logits at %zu", s, sl, lg);
        T_CHECK(ring_token_leaf_parse(sum, sl, &t) == 0 && t.n == n && t.n_drafts == d &&
                (t.logits_sha != NULL) == (v > 0), "shape %zu read back", s);
        T_CHECK(util_le32_get(t.tokens + 4 * (n - 1)) == 100 + n - 1 &&
                (!d || util_le32_get(t.drafts + 4 * (d - 1)) == 200 + d - 1) &&
                memcmp(t.logprobs, p + 4 * n, 4 * n) == 0, "shape %zu: its fields", s);
        for (uint32_t i = 0; v && i < n; i++) {
            sha(p + lg + (size_t)i * V * 4, V * 4, want);
            T_CHECK(memcmp(t.logits_sha + 32 * i, want, 32) == 0, "shape %zu: logits %u hash", s, i);
        }
        /* cut by a byte, or a summary cut or grown: refused */
        T_CHECK(ring_token_leaf_make(p, len - 1, n, V, sum, &sl, &lg) == -EINVAL ||
                len - 1 < 8 * n, "shape %zu: a payload a byte short", s);
        T_CHECK(ring_token_leaf_parse(sum, sl - 4, &t) == -EINVAL, "shape %zu: summary cut", s);
    }
    size_t len = token_payload(p, 2, 0, V);
    T_CHECK(ring_token_leaf_make(p, len, 2, V, sum, &sl, &lg) == 0, "two tokens");
    T_CHECK(ring_token_leaf_make(p, len, 3, V, sum, &sl, &lg) == -EINVAL, "logits of 2 tokens as 3");
    T_CHECK(ring_token_leaf_make(p, len, 0, V, sum, &sl, &lg) == -EINVAL, "no token");
    T_CHECK(ring_token_leaf_make(p, len + 4 * (RING_DRAFTS_MAX + 1), 2, V, sum, &sl, &lg) == -EINVAL,
            "15 drafts beside logits");
    T_CHECK(ring_token_leaf_make(p, len, RING_TOKENS_MAX + 1, V, sum, &sl, &lg) == -EINVAL,
            "more tokens than a TOKEN carries");
    /* a raw payload (an older protocol's leaf) is no summary; a bad count is malformed */
    T_CHECK(ring_token_leaf_parse(p, len, &t) == -ENOENT, "a raw payload");
    T_CHECK(ring_token_leaf_parse(sum, 4, &t) == -ENOENT, "4 bytes");
    ring_token_leaf_make(p, token_payload(p, 1, 0, 0), 1, V, sum, &sl, &lg);
    sum[4] = 0;
    T_CHECK(ring_token_leaf_parse(sum, sl, &t) == -EINVAL, "0 tokens");
    sum[4] = RING_TOKENS_MAX + 1;
    T_CHECK(ring_token_leaf_parse(sum, sl, &t) == -EINVAL, "16 tokens");
    sum[4] = 1;
    sum[6] = RING_DRAFTS_MAX + 1;
    T_CHECK(ring_token_leaf_parse(sum, sl, &t) == -EINVAL, "15 drafts");
}

int main(int argc, char **argv)
{
    t_init(argc, argv);
    T_RUN(merkle_hashes);
    T_RUN(merkle_shapes);
    T_RUN(merkle_proofs);
    T_RUN(token_leaf);
    return T_DONE();
}

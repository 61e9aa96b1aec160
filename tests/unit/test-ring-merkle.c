/* test-ring-merkle — the receipts' Merkle tree (ring/merkle.c): leaf and node hashes
 * against SHA-256 computed here, the shapes of small trees (the odd node promoted), every
 * proof of every leaf of trees of 1 to 70 leaves verifying, and refusals: another row, another
 * position, another index, a path cut short or too long, a flipped bit. */
#include <openssl/evp.h>

#include "ring/ring.h"
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

int main(int argc, char **argv)
{
    t_init(argc, argv);
    T_RUN(merkle_hashes);
    T_RUN(merkle_shapes);
    T_RUN(merkle_proofs);
    return T_DONE();
}

/* test-kern-dev: the kernel device seam. Devices by name; buffers (weights viewed, state and
 * activations zeroed, a large state buffer untouched until written, reads and writes bounded,
 * weights read-only); the boundary buffer bound
 * to caller memory; every op's operands checked against their buffers (out of range, another
 * device's buffer, a missing operand: -EINVAL, nothing written); and the ops' results: "cpu"
 * bit-identical to kern_* on a pool, "ref" to kern_ref_*. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kernels/internal.h"
#include "tests/lib/kern_util.h"
#include "tests/lib/t.h"
#include "util/err.h"

static struct kern_dev *dev_open(const char *name, int threads)
{
    char err[KV_ERR_MAX] = "";
    struct kern_dev *d = NULL;
    int rc = kern_dev_new(&d, name, threads, err, sizeof err);
    T_CHECK(rc == 0, "kern_dev_new %s: %d %s", name, rc, err);
    return d;
}

static struct kern_buf *buf(struct kern_dev *d, enum kern_buf_kind kind, size_t bytes,
                            const void *src)
{
    struct kern_buf *b = NULL;
    int rc = kern_buf_new(&b, d, kind, bytes, src);
    T_CHECK(rc == 0, "kern_buf_new kind %d, %zu bytes: %d", (int)kind, bytes, rc);
    return b;
}

T_CASE(devices_by_name)
{
    char err[KV_ERR_MAX] = "";
    struct kern_dev *d = (struct kern_dev *)1;
    T_CHECK(kern_dev_new(&d, "gpu9", 1, err, sizeof err) == -ENODEV && d == NULL, "unknown");
    T_CHECK(strstr(err, "gpu9") && strstr(err, kern_dev_names()), "message: %s", err);
    T_CHECK(kern_dev_new(&d, NULL, 1, err, sizeof err) == -ENODEV, "no name");
    d = dev_open("cpu", 3);
    T_CHECK(d && !strcmp(kern_dev_name(d), "cpu") && kern_dev_threads(d) == 3, "cpu, 3 threads");
    kern_dev_free(d);
    d = dev_open("ref", 3);
    T_CHECK(d && !strcmp(kern_dev_name(d), "ref") && kern_dev_threads(d) == 1, "ref, 1 thread");
    T_CHECK(kern_dev_sync(d) == 0, "sync");
    kern_dev_free(d);
    kern_dev_free(NULL);
}

T_CASE(buffers)
{
    struct kern_dev *d = dev_open("cpu", 1);
    T_ASSERT(d, "dev");
    uint8_t w[64], out[64];
    for (int i = 0; i < 64; i++)
        w[i] = (uint8_t)i;
    struct kern_buf *wb = buf(d, KERN_BUF_WEIGHT, sizeof w, w);
    struct kern_buf *sb = buf(d, KERN_BUF_STATE, 64, NULL);
    struct kern_buf *b = NULL;
    T_CHECK(kern_buf_new(&b, d, KERN_BUF_WEIGHT, 8, NULL) == -EINVAL && !b, "weight needs bytes");
    T_CHECK(kern_buf_new(&b, d, KERN_BUF_ACT, 8, w) == -EINVAL && !b, "act takes none");
    T_CHECK(kern_buf_new(&b, d, (enum kern_buf_kind)9, 8, NULL) == -EINVAL, "bad kind");
    T_CHECK(kern_buf_size(wb) == 64 && kern_buf_size(sb) == 64, "sizes");
    T_CHECK(kern_buf_read(wb, 0, out, 64) == 0 && !memcmp(out, w, 64), "weight bytes");
    T_CHECK(kern_buf_write(wb, 0, out, 1) == -EINVAL, "weights are read-only");
    memset(out, 7, sizeof out);
    T_CHECK(kern_buf_read(sb, 0, out, 64) == 0, "read state");
    bool zero = true;
    for (int i = 0; i < 64; i++)
        zero &= out[i] == 0;
    T_CHECK(zero, "state starts zeroed");
    T_CHECK(kern_buf_write(sb, 60, w, 4) == 0 && kern_buf_read(sb, 60, out, 4) == 0 &&
            !memcmp(out, w, 4), "write, read back");
    T_CHECK(kern_buf_write(sb, 61, w, 4) == -EINVAL, "write past the end");
    T_CHECK(kern_buf_read(sb, 65, out, 0) == -EINVAL, "offset past the end");
    T_CHECK(kern_buf_read(sb, SIZE_MAX, out, 2) == -EINVAL, "offset overflow");
    kern_buf_free(wb);
    kern_buf_free(sb);
    kern_buf_free(NULL);
    kern_dev_free(d);
}

/* Pages of [p, p + n) resident in memory (mincore), or -1. */
static long resident_pages(const void *p, size_t n)
{
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)(pg - 1);
    size_t len = (uintptr_t)p + n - a, np = (len + (size_t)pg - 1) / (size_t)pg;
    unsigned char *v = malloc(np);
    long r = -1;
    if (v && mincore((void *)a, len, v) == 0)
        for (size_t i = r = 0; i < np; i++)
            r += v[i] & 1;
    free(v);
    return r;
}

/* A large state buffer (a session's KV cache) reads as zeros but costs no memory or time
 * until written: opening a session does not write its whole context. Several in turn, as
 * sessions open and close, so the allocator's reuse of a freed one is covered too. */
T_CASE(large_state_untouched)
{
    struct kern_dev *d = dev_open("cpu", 1);
    T_ASSERT(d, "dev");
    /* 24 MiB: a TinyLlama session's K or V at 2048 positions, and under glibc's largest
     * mmap threshold (32 MiB), past which malloc would map it anyway */
    const size_t big = (size_t)24 << 20;
    for (int round = 0; round < 3; round++) {
        struct kern_buf *kv = buf(d, KERN_BUF_STATE, big, NULL);
        T_ASSERT(kv, "a 24 MiB state buffer");
        long res = resident_pages(kv->host, big), all = (long)(big / (size_t)sysconf(_SC_PAGESIZE));
        T_CHECK(res >= 0 && res < all / 8, "round %d: %ld of the state's %ld pages resident before "
                "any write", round, res, all);
        uint8_t out[4096];
        bool zero = true;
        for (size_t off = 0; off + sizeof out <= big; off += big / 16) {
            memset(out, 7, sizeof out);
            T_CHECK(kern_buf_read(kv, off, out, sizeof out) == 0, "read at %zu", off);
            for (size_t i = 0; i < sizeof out; i++)
                zero &= out[i] == 0;
        }
        T_CHECK(zero, "round %d: the state reads as zeros", round);
        /* dirty it all, as a long session does, before it is freed and the next one made */
        int bad = 0;
        memset(out, 0x5a, sizeof out);
        for (size_t off = 0; off < big; off += sizeof out)
            bad += kern_buf_write(kv, off, out, sizeof out) != 0;
        T_CHECK(bad == 0, "round %d: %d writes failed", round, bad);
        kern_buf_free(kv);
    }
    kern_dev_free(d);
}

/* The boundary buffer works on the caller's memory while bound, and on nothing after. */
T_CASE(io_binding)
{
    struct kern_dev *d = dev_open("cpu", 1);
    T_ASSERT(d, "dev");
    struct kern_buf *io = buf(d, KERN_BUF_IO, 8 * sizeof(float), NULL);
    struct kern_buf *sb = buf(d, KERN_BUF_STATE, 8 * sizeof(float), NULL);
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, one[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    float big[9];
    T_CHECK(kern_buf_size(io) == 0, "unbound: nothing addressable");
    T_CHECK(kern_buf_bind(io, big, sizeof big, true) == -EINVAL, "over the capacity");
    T_CHECK(kern_buf_bind(sb, x, sizeof x, true) == -EINVAL, "not an IO buffer");
    T_CHECK(kern_buf_write(sb, 0, one, sizeof one) == 0, "ones");
    T_CHECK(kern_buf_bind(io, x, 4 * sizeof(float), true) == 0, "bind 4 floats");
    T_CHECK(kern_buf_bind(io, x, 4 * sizeof(float), true) == -EINVAL, "bound twice");
    T_CHECK(kern_dev_add(d, kern_at_make(io, 0), kern_at_make(sb, 0), 5) == -EINVAL,
            "past the bound bytes");
    T_CHECK(kern_dev_add(d, kern_at_make(io, 0), kern_at_make(sb, 0), 4) == 0, "add");
    T_CHECK(kern_buf_unbind(io, true) == 0, "unbind");
    T_CHECK(x[0] == 2 && x[3] == 5 && x[4] == 5, "the caller's rows changed in place, no more");
    T_CHECK(kern_dev_add(d, kern_at_make(io, 0), kern_at_make(sb, 0), 1) == -EINVAL,
            "unbound again");
    kern_buf_free(io);
    kern_buf_free(sb);
    kern_dev_free(d);
}

/* Each operand out of its buffer, of another device, or missing is refused before the op. */
T_CASE(operand_checks)
{
    struct kern_dev *d = dev_open("cpu", 2), *d2 = dev_open("ref", 1);
    T_ASSERT(d && d2, "devs");
    enum { R = 8, C = 32, N = 2 };
    float w[R * C], x[N * C];
    ku_seed(1);
    ku_fill(w, R * C, 1);
    ku_fill(x, N * C, 1);
    struct kern_buf *wb = buf(d, KERN_BUF_WEIGHT, sizeof w, w);
    struct kern_buf *xb = buf(d, KERN_BUF_ACT, sizeof x, NULL);
    struct kern_buf *yb = buf(d, KERN_BUF_ACT, N * R * sizeof(float), NULL);
    struct kern_buf *other = buf(d2, KERN_BUF_ACT, N * R * sizeof(float), NULL);
    struct kern_at none = {NULL, 0};
    T_ASSERT(wb && xb && yb && other, "buffers");
    kern_buf_write(xb, 0, x, sizeof x);
    struct kern_at W = kern_at_make(wb, 0), X = kern_at_make(xb, 0), Y = kern_at_make(yb, 0);
    T_CHECK(kern_dev_matmul(d, KERN_T_F32, W, R, C, X, N, Y) == 0, "fits");
    T_CHECK(kern_dev_matmul(d, KERN_T_F32, W, R + 1, C, X, N, Y) == -EINVAL, "W rows");
    T_CHECK(kern_dev_matmul(d, KERN_T_F32, W, R, C, X, N + 1, Y) == -EINVAL, "x rows");
    T_CHECK(kern_dev_matmul(d, KERN_T_F32, W, R, C, X, N, kern_at_make(yb, 4)) == -EINVAL,
            "y offset");
    T_CHECK(kern_dev_matmul(d, KERN_T_F32, W, R, C, X, N, kern_at_make(other, 0)) == -EINVAL,
            "another device's buffer");
    T_CHECK(kern_dev_matmul(d, KERN_T_F32, none, R, C, X, N, Y) == -EINVAL, "no weight");
    T_CHECK(kern_dev_matmul(d, KERN_T_F32, W, -1, C, X, N, Y) == -EINVAL, "negative rows");
    T_CHECK(kern_dev_matmul(d, KERN_T_Q4_0, W, R, 33, X, N, Y) == -EINVAL, "cols not blocks");
    T_CHECK(kern_dev_add_rows(d, Y, none, N, R) == -EINVAL, "missing bias");
    T_CHECK(kern_dev_kv_store(d, KERN_T_Q8_0, Y, R, X, 1, R) == -EINVAL, "cache type");
    T_CHECK(kern_dev_attention(d, KERN_T_F32, Y, X, X, X, 1, 0, 3, 2, 4, 8, 1.0f) == -EINVAL,
            "kv heads must divide heads");
    uint32_t bad[2] = {0, 5};
    struct kern_buf *ib = buf(d, KERN_BUF_ACT, sizeof bad, NULL);
    kern_buf_write(ib, 0, bad, sizeof bad);
    T_CHECK(kern_dev_copy_rows(d, Y, 4, X, 4, 4, kern_at_make(ib, 0), 2, 4) == -EINVAL,
            "index past the source rows");
    T_CHECK(kern_dev_axpy_rows(d, Y, 4, X, X, kern_at_make(ib, 0), 2, 1) == -EINVAL,
            "index past the destination rows");
    T_CHECK(kern_dev_rope_angles(d, Y, X, 1, 0, 8, 10000.0f, 1.0f, none) == 0,
            "no frequency divisors is allowed");
    T_CHECK(kern_dev_zero(d, Y, N * R * sizeof(float) + 1) == -EINVAL, "zero past the end");
    kern_buf_free(ib);
    kern_buf_free(wb);
    kern_buf_free(xb);
    kern_buf_free(yb);
    kern_buf_free(other);
    kern_dev_free(d);
    kern_dev_free(d2);
}

/* One matmul, one layer op and the attention on both devices against the functions they wrap. */
T_CASE(ops_are_the_kernels)
{
    enum { R = 24, C = 64, N = 3, H = 4, HD = 16, P = 5 };
    static uint8_t wq[R * C * 2];  /* Q8_0 rows */
    float w[R * C], x[N * C], y[N * R], ref[N * R];
    ku_seed(7);
    ku_fill(w, R * C, 1);
    ku_fill(x, N * C, 1);
    size_t rb = kern_row_bytes(KERN_T_Q8_0, C);
    T_ASSERT(rb * R <= sizeof wq, "room");
    for (int r = 0; r < R; r++)
        kern_ref_quant_row(KERN_T_Q8_0, w + r * C, wq + r * rb, C);
    struct kern_pool *pool;
    T_ASSERT(kern_pool_new(&pool, 2) == 0 && kern_pool_reserve(pool, 1 << 16) == 0, "pool");
    const char *names[] = {"cpu", "ref"};
    for (int dv = 0; dv < 2; dv++) {
        struct kern_dev *d = dev_open(names[dv], 2);
        T_ASSERT(d && kern_dev_reserve(d, 1 << 16) == 0, "dev");
        struct kern_buf *wb = buf(d, KERN_BUF_WEIGHT, rb * R, wq);
        struct kern_buf *xb = buf(d, KERN_BUF_ACT, sizeof x, NULL);
        struct kern_buf *yb = buf(d, KERN_BUF_ACT, sizeof y, NULL);
        kern_buf_write(xb, 0, x, sizeof x);
        T_CHECK(kern_dev_matmul(d, KERN_T_Q8_0, kern_at_make(wb, 0), R, C, kern_at_make(xb, 0), N,
                                kern_at_make(yb, 0)) == 0, "%s matmul", names[dv]);
        kern_buf_read(yb, 0, y, sizeof y);
        if (dv == 0)
            kern_matmul(pool, KERN_T_Q8_0, wq, R, C, x, N, ref);
        else
            kern_ref_matmul(KERN_T_Q8_0, wq, R, C, x, N, ref);
        T_CHECK(!memcmp(y, ref, sizeof y), "%s matmul is its kernel's", names[dv]);

        /* attention over an F16 cache of P positions, 4 heads sharing 2 KV heads */
        float q[H * HD], kv[P * 2 * HD], o[H * HD], oref[H * HD], sc[P];
        uint16_t cache[P * 2 * HD];
        ku_fill(q, H * HD, 1);
        ku_fill(kv, P * 2 * HD, 1);
        struct kern_buf *qb = buf(d, KERN_BUF_ACT, sizeof q, NULL);
        struct kern_buf *kb = buf(d, KERN_BUF_ACT, sizeof kv, NULL);
        struct kern_buf *cb = buf(d, KERN_BUF_STATE, sizeof cache, NULL);
        struct kern_buf *ob = buf(d, KERN_BUF_ACT, sizeof o, NULL);
        kern_buf_write(qb, 0, q, sizeof q);
        kern_buf_write(kb, 0, kv, sizeof kv);
        T_CHECK(kern_dev_kv_store(d, KERN_T_F16, kern_at_make(cb, 0), 2 * HD, kern_at_make(kb, 0),
                                  P, 2 * HD) == 0, "%s kv store", names[dv]);
        T_CHECK(kern_dev_attention(d, KERN_T_F16, kern_at_make(ob, 0), kern_at_make(qb, 0),
                                   kern_at_make(cb, 0), kern_at_make(cb, 0), 1, P - 1, H, 2, HD,
                                   2 * HD, 0.25f) == 0, "%s attention", names[dv]);
        kern_buf_read(ob, 0, o, sizeof o);
        kern_ref_kv_store(KERN_T_F16, cache, 2 * HD, kv, P, 2 * HD);
        if (dv == 0)
            kern_attention(pool, KERN_T_F16, oref, q, cache, cache, 1, P - 1, H, 2, HD, 2 * HD,
                           0.25f, sc);
        else
            kern_ref_attention(KERN_T_F16, oref, q, cache, cache, 1, P - 1, H, 2, HD, 2 * HD,
                               0.25f, sc);
        T_CHECK(!memcmp(o, oref, sizeof o), "%s attention is its kernel's", names[dv]);
        struct kern_buf *bufs[] = {wb, xb, yb, qb, kb, cb, ob};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            kern_buf_free(bufs[i]);
        kern_dev_free(d);
    }
    kern_pool_free(pool);
}

/* Weight buffers said to be matmul-only (kern_buf_weight_use): "cpu" repacks Q4_0/Q8_0/Q4_K/Q5_K/Q6_K where
 * its level has the kernels (kern_buf_weight_own > 0) and its matmul is kern_matmul_packed bit
 * for bit, per matrix of a buffer of several; a matmul of another shape on the same bytes
 * still reads them as given; the shape must fill the buffer; "ref" keeps the file layout. */
T_CASE(weights_repacked)
{
    enum { R = 21, C = 256, N = 5, M = 2 };
    static uint8_t wq[M * R * C * 2];
    float w[M * R * C], x[N * C], y[N * R], ref[N * R];
    ku_seed(11);
    ku_fill(w, M * R * C, 1);
    ku_fill(x, N * C, 1);
    struct kern_pool *pool;
    T_ASSERT(kern_pool_new(&pool, 2) == 0 && kern_pool_reserve(pool, 1 << 16) == 0, "pool");
    const uint32_t types[] = {KERN_T_Q4_0, KERN_T_Q8_0, KERN_T_Q4_K, KERN_T_Q5_K, KERN_T_Q6_K,
                              KERN_T_Q4_1, KERN_T_Q5_0, KERN_T_Q5_1, KERN_T_F16};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        uint32_t t = types[ti];
        size_t rb = kern_row_bytes(t, C), mb = rb * R;
        for (int r = 0; r < M * R; r++)
            kern_ref_quant_row(t, w + r * C, wq + r * rb, C);
        const char *names[] = {"cpu", "ref"};
        for (int dv = 0; dv < 2; dv++) {
            struct kern_dev *d = dev_open(names[dv], 2);
            T_ASSERT(d && kern_dev_reserve(d, 1 << 16) == 0, "dev");
            struct kern_buf *wb = buf(d, KERN_BUF_WEIGHT, M * mb, wq);
            struct kern_buf *xb = buf(d, KERN_BUF_ACT, sizeof x, NULL);
            struct kern_buf *yb = buf(d, KERN_BUF_ACT, sizeof y, NULL);
            kern_buf_write(xb, 0, x, sizeof x);
            T_CHECK(kern_buf_weight_use(wb, t, R, C, 1, false) == -EINVAL, "must fill the buffer");
            T_CHECK(kern_buf_weight_use(xb, t, 1, C, 1, false) == -EINVAL, "weights only");
            T_CHECK(kern_buf_weight_use(wb, t, R, C, M, false) == 0, "%s weight use", names[dv]);
            T_CHECK(kern_buf_weight_use(wb, t, R, C, M, false) == 0, "said twice");
            bool packs = dv == 0 && kern_pack_supported(t, C);
            T_CHECK((kern_buf_weight_own(wb) > 0) == packs, "%s %s: own bytes %zu", names[dv],
                    kern_type_name(t), kern_buf_weight_own(wb));
            struct kern_packed *pk = NULL;
            if (packs)
                T_ASSERT(kern_pack_new(NULL, &pk, t, wq, R, C, M) == 0, "pack");
            for (int m = 0; m < M; m++) {
                T_CHECK(kern_dev_matmul(d, t, kern_at_make(wb, m * mb), R, C, kern_at_make(xb, 0),
                                        N, kern_at_make(yb, 0)) == 0, "matmul");
                kern_buf_read(yb, 0, y, sizeof y);
                if (pk)
                    kern_matmul_packed(pool, pk, m, x, N, ref);
                else if (dv == 0)
                    kern_matmul(pool, t, wq + m * mb, R, C, x, N, ref);
                else
                    kern_ref_matmul(t, wq + m * mb, R, C, x, N, ref);
                T_CHECK(!memcmp(y, ref, sizeof y), "%s %s matrix %d is its kernel's", names[dv],
                        kern_type_name(t), m);
            }
            /* rows 1..R of matrix 0 (another offset and shape): the bytes as given */
            T_CHECK(kern_dev_matmul(d, t, kern_at_make(wb, rb), R - 1, C, kern_at_make(xb, 0), N,
                                    kern_at_make(yb, 0)) == 0, "matmul of a slice");
            kern_buf_read(yb, 0, y, (R - 1) * N * sizeof(float));
            if (dv == 0)
                kern_matmul(pool, t, wq + rb, R - 1, C, x, N, ref);
            else
                kern_ref_matmul(t, wq + rb, R - 1, C, x, N, ref);
            T_CHECK(!memcmp(y, ref, (R - 1) * N * sizeof(float)), "%s %s slice", names[dv],
                    kern_type_name(t));
            kern_pack_free(pk);
            kern_buf_free(wb);
            kern_buf_free(xb);
            kern_buf_free(yb);
            kern_dev_free(d);
        }
    }
    kern_pool_free(pool);
}

/* The ref device's scratch: an op beyond its reservation is -ENOSPC, never an allocation. */
T_CASE(ref_scratch_bounded)
{
    struct kern_dev *d = dev_open("ref", 1);
    T_ASSERT(d, "dev");
    T_CHECK(kern_dev_attention_scratch(d, 4, 8) == 4 * sizeof(float), "attention scratch");
    T_CHECK(kern_dev_reserve(d, kern_dev_attention_scratch(d, 4, 8)) == 0, "reserve");
    struct kern_buf *b = buf(d, KERN_BUF_ACT, 1024, NULL);
    struct kern_at a = kern_at_make(b, 0);
    T_CHECK(kern_dev_attention(d, KERN_T_F32, a, a, a, a, 1, 3, 1, 1, 8, 8, 1.0f) == 0,
            "4 positions fit");
    T_CHECK(kern_dev_attention(d, KERN_T_F32, a, a, a, a, 1, 4, 1, 1, 8, 8, 1.0f) == -ENOSPC,
            "5 do not");
    kern_buf_free(b);
    kern_dev_free(d);
}

int main(int argc, char **argv)
{
    t_init(argc, argv);
    T_RUN(devices_by_name);
    T_RUN(buffers);
    T_RUN(large_state_untouched);
    T_RUN(io_binding);
    T_RUN(operand_checks);
    T_RUN(ops_are_the_kernels);
    T_RUN(ref_scratch_bounded);
    T_RUN(weights_repacked);
    return T_DONE();
}

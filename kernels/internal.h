/* kernels/internal.h — cross-file internals of the kern module: quant block layouts (ggml's,
 * byte for byte, sizes pinned), the type-traits table and helpers shared by ref/ and cpu/.
 * Not part of the public API; tests may include it to build blocks by hand.
 */
#ifndef KV_KERN_INTERNAL_H
#define KV_KERN_INTERNAL_H

#include <assert.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "kernels/kern.h"
#include "wtype/wtype.h"

#define KERN_QK   32   /* elements per block of the *_0 / *_1 types */
#define KERN_QK_K 256  /* elements per super-block of the K types */

/* f16 fields are stored as raw IEEE half bits. */
struct kern_block_q4_0 { uint16_t d; uint8_t qs[KERN_QK / 2]; };
struct kern_block_q4_1 { uint16_t d, m; uint8_t qs[KERN_QK / 2]; };
struct kern_block_q5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[KERN_QK / 2]; };
struct kern_block_q5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[KERN_QK / 2]; };
struct kern_block_q8_0 { uint16_t d; int8_t qs[KERN_QK]; };
/* s = d * sum(qs), used by the *_1 dot products for the min term. */
struct kern_block_q8_1 { uint16_t d, s; int8_t qs[KERN_QK]; };
/* scales: 8 sub-blocks of 32, 6-bit scale and 6-bit min each, packed in 12 bytes. */
struct kern_block_q4_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[KERN_QK_K / 2]; };
struct kern_block_q5_K {
    uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[KERN_QK_K / 8]; uint8_t qs[KERN_QK_K / 2];
};
/* 16 sub-blocks of 16 with int8 scales; 4 low bits in ql, 2 high bits in qh, offset 32. */
struct kern_block_q6_K {
    uint8_t ql[KERN_QK_K / 2]; uint8_t qh[KERN_QK_K / 4]; int8_t scales[KERN_QK_K / 16];
    uint16_t d;
};
/* Q2_K and Q3_K: layouts pinned for their sizes (no kernels read them yet). */
struct kern_block_q2_K { uint8_t scales[KERN_QK_K / 16]; uint8_t qs[KERN_QK_K / 4]; uint16_t d, dmin; };
struct kern_block_q3_K {
    uint8_t hmask[KERN_QK_K / 8]; uint8_t qs[KERN_QK_K / 4]; uint8_t scales[12]; uint16_t d;
};
/* Activation blocks for the K types: f32 scale, bsums = sums of 16 quants. */
struct kern_block_q8_K { float d; int8_t qs[KERN_QK_K]; int16_t bsums[KERN_QK_K / 16]; };

static_assert(sizeof(struct kern_block_q4_0) == 18, "q4_0 block size");
static_assert(sizeof(struct kern_block_q4_1) == 20, "q4_1 block size");
static_assert(sizeof(struct kern_block_q5_0) == 22, "q5_0 block size");
static_assert(sizeof(struct kern_block_q5_1) == 24, "q5_1 block size");
static_assert(sizeof(struct kern_block_q8_0) == 34, "q8_0 block size");
static_assert(sizeof(struct kern_block_q8_1) == 36, "q8_1 block size");
static_assert(sizeof(struct kern_block_q2_K) == 84, "q2_K block size");
static_assert(sizeof(struct kern_block_q3_K) == 110, "q3_K block size");
static_assert(sizeof(struct kern_block_q4_K) == 144, "q4_K block size");
static_assert(sizeof(struct kern_block_q5_K) == 176, "q5_K block size");
static_assert(sizeof(struct kern_block_q6_K) == 210, "q6_K block size");
static_assert(sizeof(struct kern_block_q8_K) == 292, "q8_K block size");

/* One row dot product: w is one weight row of n elements, xq the activation row already
 * converted to the weight type's vec_dot_type. */
typedef float (*kern__dot_fn)(const void *w, const void *xq, int64_t n);
/* nb blocks of a type to f32, and f32 to nb blocks (ggml's reference rounding). */
typedef void (*kern__to_float_fn)(const void *src, float *dst, int64_t nb);
typedef void (*kern__from_float_fn)(const float *src, void *dst, int64_t nb);

/* The type-traits table (ggml's type_traits), one entry per enum kern_type: what the kernels
 * do with a type. Its name and block geometry are wtype_info(type)'s. */
struct kern__type_traits {
    bool known;                          /* an enum kern_type the kernels have an entry for */
    bool weight;                         /* the matmuls take it as a weight type */
    uint32_t vec_dot_type;               /* the activation type its dot consumes */
    kern__to_float_fn to_float;          /* reference dequantiser, NULL when none */
    kern__from_float_fn from_float_ref;  /* reference quantiser, NULL when none */
    kern__dot_fn vec_dot;                /* reference dot against vec_dot_type, NULL when none */
    /* A matmul row's result does not depend on how many rows the matmul takes (below
     * KERN_ROWS_EXACT_MAX): the multi-row dot repeats the one-row dot's floating-point
     * operations, in the same order, for each row (docs/model.md). */
    bool rows_exact;
};
/* The traits of type, NULL for a type number the table does not have. */
const struct kern__type_traits *kern__type_traits(uint32_t type);

/* The reference functions the table points at (ref_quant.c, ref_dot.c). */
#define KERN__TYPE_FNS(t) \
    void kern__dequant_##t(const void *src, float *y, int64_t nb); \
    void kern__quant_##t(const float *x, void *dst, int64_t nb)
KERN__TYPE_FNS(f32); KERN__TYPE_FNS(f16); KERN__TYPE_FNS(bf16);
KERN__TYPE_FNS(q4_0); KERN__TYPE_FNS(q4_1); KERN__TYPE_FNS(q5_0); KERN__TYPE_FNS(q5_1);
KERN__TYPE_FNS(q8_0); KERN__TYPE_FNS(q8_1);
KERN__TYPE_FNS(q4_K); KERN__TYPE_FNS(q5_K); KERN__TYPE_FNS(q6_K); KERN__TYPE_FNS(q8_K);
#undef KERN__TYPE_FNS
float kern__dot_f32(const void *w, const void *xq, int64_t n);
float kern__dot_f16(const void *w, const void *xq, int64_t n);
float kern__dot_bf16(const void *w, const void *xq, int64_t n);
float kern__dot_q4_0(const void *w, const void *xq, int64_t n);
float kern__dot_q4_1(const void *w, const void *xq, int64_t n);
float kern__dot_q5_0(const void *w, const void *xq, int64_t n);
float kern__dot_q5_1(const void *w, const void *xq, int64_t n);
float kern__dot_q8_0(const void *w, const void *xq, int64_t n);
float kern__dot_q4_K(const void *w, const void *xq, int64_t n);
float kern__dot_q5_K(const void *w, const void *xq, int64_t n);
float kern__dot_q6_K(const void *w, const void *xq, int64_t n);

/* Round to nearest, ties to even (ggml's nearest_int), for |f| < 2^22. */
static inline int kern__nearest_int(float f)
{
    return (int)lrintf(f);
}

static inline float kern__h2f(uint16_t h) { return wtype_f16_to_f32(h); }

/* The 32 five-bit quants (0..31) of a Q5_0/Q5_1 block: low nibbles in qs (element j and
 * j + 16 share byte j), fifth bits in the 32-bit little-endian qh. */
static inline void kern__q5_unpack(const uint8_t qs[KERN_QK / 2], const uint8_t qh_bytes[4],
                                   int q[KERN_QK])
{
    uint32_t qh;
    memcpy(&qh, qh_bytes, 4);
    for (int j = 0; j < KERN_QK / 2; j++) {
        q[j] = (qs[j] & 0xF) | (int)((qh >> j) & 1) << 4;
        q[j + 16] = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
    }
}

/* The inverse: 32 quants (0..31) into qs and qh. */
static inline void kern__q5_pack(const int q[KERN_QK], uint8_t qs[KERN_QK / 2], uint8_t qh_bytes[4])
{
    uint32_t qh = 0;
    for (int j = 0; j < KERN_QK / 2; j++) {
        qs[j] = (uint8_t)((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
        qh |= (uint32_t)((q[j] >> 4) & 1) << j;
        qh |= (uint32_t)((q[j + 16] >> 4) & 1) << (j + 16);
    }
    memcpy(qh_bytes, &qh, 4);
}

/* 6-bit scale and min j (0..7) of a Q4_K/Q5_K scales array. */
static inline void kern__scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m)
{
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* The 256 levels (0..31) of a Q4_K or Q5_K super-block, in element order: sub-blocks 2j and
 * 2j + 1 are the low and high nibbles of qs[32j .. 32j + 32), each with its fifth bit from qh
 * (bits 2j and 2j + 1 of qh[l]; NULL for Q4_K, whose levels are the nibbles, 0..15). */
static inline void kern__k45_levels(const uint8_t qs[KERN_QK_K / 2], const uint8_t *qh,
                                    uint8_t q[KERN_QK_K])
{
    for (int j = 0; j < 4; j++)
        for (int l = 0; l < 32; l++) {
            int h1 = qh ? (qh[l] >> (2 * j)) & 1 : 0, h2 = qh ? (qh[l] >> (2 * j + 1)) & 1 : 0;
            q[64 * j + l] = (uint8_t)((qs[32 * j + l] & 0xF) | (h1 << 4));
            q[64 * j + 32 + l] = (uint8_t)((qs[32 * j + l] >> 4) | (h2 << 4));
        }
}

/* ---- fast CPU path internals ---- */

/* A parallel task: called once on each of nth threads with ith = 0..nth-1 (0 = caller). */
typedef void (*kern__task_fn)(void *ctx, int ith, int nth);
/* Run fn on every pool thread and return when all are done; p NULL runs it inline. */
void kern__pool_run(struct kern_pool *p, kern__task_fn fn, void *ctx);
/* The same for a task that hands out its work itself (an atomic counter): any subset of the
 * threads finishes it, each call returning once the items it took are done. Workers that are
 * not running when the caller has taken the rest are not waited for (a busy machine). */
void kern__pool_run_dyn(struct kern_pool *p, kern__task_fn fn, void *ctx);
/* Guided self-scheduling: claims the next piece of total items from *next, 1/(2*nth) of those
 * left, clamped to [lo, hi], so the pieces shrink towards the end and the threads finish
 * close together. Its length (0: nothing left), its first item in *first. */
static inline int64_t kern__claim(_Atomic int64_t *next, int64_t total, int nth, int64_t lo,
                                  int64_t hi, int64_t *first)
{
    int64_t s = atomic_load_explicit(next, memory_order_relaxed), c;
    do {
        if (s >= total)
            return 0;
        c = (total - s) / (2 * nth);
        c = c > hi ? hi : c;
        c = c < lo ? lo : c;
        c = c > total - s ? total - s : c;
    } while (!atomic_compare_exchange_weak_explicit(next, &s, s + c, memory_order_relaxed,
                                                    memory_order_relaxed));
    *first = s;
    return c;
}

/* Convert n f32 values into the activation type (Q8_0/Q8_1/Q8_K/F16/BF16). */
typedef void (*kern__quant_fn)(const float *x, void *dst, int64_t n);
/* Convert n activation rows (cols f32 values each, src rows cols apart) into dst rows dst_stride
 * bytes apart with quant (NULL: the reference quantiser of type vt), the rows handed out one
 * at a time through an atomic counter on the pool (inline for fewer than 4 rows or 1 thread),
 * as the matmuls do before their dot products. */
void kern__act_quant(struct kern_pool *p, kern__quant_fn quant, uint32_t vt, const float *x,
                     int64_t cols, int64_t n, void *dst, size_t dst_stride);

/* The pool's reserved scratch (64-byte aligned) when it holds size bytes, else NULL (the op
 * returns -ENOSPC): it never grows here, only in kern_pool_reserve. One op at a time uses it. */
void *kern__pool_scratch(struct kern_pool *p, size_t size);

/* One value head of kern_ref_deltanet: the same contract with q, k, v, o that head's
 * vectors (rows stride / o_stride apart) and beta, alpha rows g_stride apart;
 * dt_bias and a that head's values. kern_deltanet runs it per head on the pool. */
void kern__deltanet_head(float *o, size_t o_stride, float *S, const float *q, const float *k,
                         const float *v, size_t stride, const float *beta, const float *alpha,
                         size_t g_stride, float dt_bias, float a, int64_t n, int d,
                         float *scratch);

/* Multi-column dot: out[c] = dot(w row, activation row c) for c < nc (nc <= KERN_MAXCOL);
 * activation rows are xstride bytes apart. */
#define KERN_MAXCOL 8
typedef void (*kern__dotn_fn)(const void *w, const void *xq, size_t xstride, int nc,
                              int64_t n, float *out);

/* A repacked group of rp_rows weight rows against nc (<= KERN_RP_MAXCOL) activation rows
 * xs bytes apart (kern__rp_act_bytes each), nb the row's blocks (super-blocks for the K types):
 * out[c * rp_rows + r] for row r of the group. */
#define KERN_RP_MAXCOL 8
typedef void (*kern__rp_fn)(const void *grp, int64_t nb, const void *xq, size_t xs, int nc,
                            float *out);
/* Bytes of one activation row of the repacked kernels of a weight type, padded to 64: Q4_K's
 * Q5_K's and Q6_K's are Q8_K blocks, the others' nb x (32 quants, f32 scale, int32 correction
 * or, for Q4_1/Q5_1, the f32 s). */
static inline size_t kern__rp_act_bytes(uint32_t type, int64_t cols)
{
    size_t b = type == KERN_T_Q4_K || type == KERN_T_Q5_K || type == KERN_T_Q6_K
                   ? (size_t)(cols / KERN_QK_K) * sizeof(struct kern_block_q8_K)
                   : (size_t)(cols / KERN_QK) * 40;
    return (b + 63) / 64 * 64;
}

/* One SIMD level's kernels; NULL entries fall back to the reference. */
struct kern__simd {
    const char *name;
    kern__dot_fn dot[KERN_T_COUNT];
    kern__dotn_fn dotn[KERN_T_COUNT];
    kern__quant_fn quant[KERN_T_COUNT]; /* indexed by activation type */
    /* Weight types whose dots take a private activation layout (indexed by weight type):
     * its quantiser and its bytes per pair of 32-blocks (rows padded to whole pairs). */
    kern__quant_fn actq[KERN_T_COUNT];
    uint32_t act_pair_bytes[KERN_T_COUNT];
    float (*dot_f32)(const float *a, const float *b, int64_t n);
    void (*axpy_f32)(float *y, float a, const float *x, int64_t n); /* y += a x */
    void (*axpy_f16)(float *y, float a, const uint16_t *x, int64_t n); /* y += a x, x f16 */
    void (*f16_to_f32)(const uint16_t *x, float *y, int64_t n);
    /* kern_ref_softmax's contract with a vector exp (within 2 ulp of expf). */
    void (*softmax)(float *x, int64_t n);
    /* Attention over an F16 cache for nh query heads sharing one KV head (head_dim hd, a
     * multiple of 8): sc[h*n_ctx + p] = scale * dot(k row p, qf head h), then
     * out[h*ostride + d] = sum over p of w[h*n_ctx + p] * v row p [d] (in order of p). */
    void (*att_kq_f16)(const uint16_t *k, size_t kstride, int64_t n_ctx, const float *qf,
                       int nh, int hd, float scale, float *sc);
    void (*att_v_f16)(const uint16_t *v, size_t vstride, int64_t n_ctx, const float *w, int nh,
                      int hd, float *out, size_t ostride);
    /* Repacked weights (kernels/cpu/cpu_repack.c, simd_repack.inc): rows per interleaved
     * group (0: none at this level), whether Q8_0 quants are stored +128 as bytes, and per
     * weight type the group kernel and its activation quantiser (kern__rp_act_bytes). */
    int rp_rows;
    bool rp_q8_u8;
    kern__rp_fn rp_gemm[KERN_T_COUNT];
    kern__quant_fn rp_quant[KERN_T_COUNT];
};
extern const struct kern__simd kern__simd_avx2, kern__simd_avx512; /* x86-64 */
extern const struct kern__simd kern__simd_neon, kern__simd_neon_dotprod; /* aarch64 only */
/* The level chosen for this CPU (detected once; KV_KERN_SIMD=<level name> caps it). */
const struct kern__simd *kern__simd_get(void);
/* Tests: force a level by name ("scalar", "avx2", "avx512", "neon", "neon-dotprod"; NULL =
 * detect). -ENOTSUP when this CPU or build lacks it. Not thread-safe; call before any op. */
int kern__simd_force(const char *name);

/* ---- devices (kern_dev_*, kern_buf_*; docs/devices.md) ---- */

struct kern_dev {
    const struct kern__dev_ops *ops;
    int n_threads;
    struct kern_pool *pool;        /* "cpu": the thread pool its ops run on */
    void *scratch;                 /* "ref": attention and DeltaNet rows (kern_dev_reserve) */
    size_t scratch_size;
    void *impl;                    /* a non-host device's own state */
    char msg[4096];                /* why open failed, when it says (kern_dev_new's err) */
};

struct kern_buf {
    struct kern_dev *dev;
    enum kern_buf_kind kind;
    size_t size;                   /* bytes the ops may address (IO: those bound, else 0) */
    size_t cap;                    /* bytes at creation (IO: the most a binding may take) */
    void *host;                    /* host device: the bytes (IO: the bound memory or NULL) */
    bool owned;                    /* host is ours to free */
    void *impl;                    /* a non-host device's handle; a host device's own
                                      layout of a weight buffer (kern_buf_weight_use) */
    void *bound;                   /* IO: the caller memory bound now */
};

/* Host address of an operand on a host device (NULL for "no operand"). */
static inline void *kern__at_host(struct kern_at a)
{
    return a.buf ? (char *)a.buf->host + a.off : NULL;
}
#define KERN__F(a) ((float *)kern__at_host(a))

/* What a device implements. Host devices (buffers in host memory, allocated and viewed by
 * kernels/dev.c) leave the buffer entries NULL; others fill them. The ops have the public
 * kern_dev_* signatures and get operands already checked against their buffers. */
struct kern__dev_ops {
    const char *name;
    bool host;
    int (*open)(struct kern_dev *d, const struct kern_dev_opts *o);
    void (*close)(struct kern_dev *d);
    int (*sync)(struct kern_dev *d);
    size_t (*matmul_scratch)(const struct kern_dev *d, uint32_t type, int64_t cols, int64_t n);
    size_t (*attention_scratch)(const struct kern_dev *d, int64_t n_ctx, int head_dim);
    size_t (*deltanet_scratch)(const struct kern_dev *d, int d_state);
    int (*reserve)(struct kern_dev *d, size_t bytes);
    /* non-host buffers: b's dev, kind and size are set; src as for kern_buf_new */
    int (*buf_new)(struct kern_buf *b, const void *src);
    void (*buf_free)(struct kern_buf *b);
    int (*buf_write)(struct kern_buf *b, size_t off, const void *src, size_t n);
    int (*buf_read)(struct kern_buf *b, size_t off, void *dst, size_t n);
    /* optional: kern_buf_weight_use (shape checked) and what it keeps (in b->impl on a host
     * device, freed by weight_free before the buffer), and its size */
    int (*weight_use)(struct kern_buf *b, uint32_t type, int64_t rows, int64_t cols,
                      int64_t n_mat, bool release);
    void (*weight_free)(struct kern_buf *b);
    size_t (*weight_own)(const struct kern_buf *b);
    /* optional: kern_dev_rows_exact for a kern_type_rows_exact type (NULL: any number) */
    uint32_t (*rows_exact)(const struct kern_dev *d, uint32_t type);

    int (*matmul)(struct kern_dev *d, uint32_t type, struct kern_at w, int64_t rows,
                  int64_t cols, struct kern_at x, int64_t n, struct kern_at y);
    int (*rmsnorm_rows)(struct kern_dev *d, struct kern_at out, struct kern_at x,
                        struct kern_at w, int64_t n_rows, int64_t cols, float eps);
    int (*rope_angles)(struct kern_dev *d, struct kern_at cs, struct kern_at sn, int64_t n,
                       int64_t pos0, int n_rot, float freq_base, float freq_scale,
                       struct kern_at freq_div);
    int (*rope_rows)(struct kern_dev *d, struct kern_at x, int64_t n, size_t stride,
                     int n_head, int head_dim, int n_rot, struct kern_at cs, struct kern_at sn,
                     bool neox);
    int (*kv_store)(struct kern_dev *d, uint32_t kv_type, struct kern_at dst,
                    size_t dst_stride, struct kern_at src, int64_t n, int64_t dim);
    int (*attention)(struct kern_dev *d, uint32_t kv_type, struct kern_at out,
                     struct kern_at q, struct kern_at k, struct kern_at v, int64_t n,
                     int64_t pos0, int n_head, int n_kv_head, int head_dim, size_t kv_stride,
                     float scale);
    int (*swiglu)(struct kern_dev *d, struct kern_at out, struct kern_at gate,
                  struct kern_at up, int64_t n);
    int (*add)(struct kern_dev *d, struct kern_at y, struct kern_at x, int64_t n);
    int (*add_rows)(struct kern_dev *d, struct kern_at y, struct kern_at b, int64_t n,
                    int64_t cols);
    int (*axpy_rows)(struct kern_dev *d, struct kern_at y, int64_t y_rows, struct kern_at a,
                     struct kern_at x, struct kern_at idx, int64_t n, int64_t cols);
    int (*sigmoid)(struct kern_dev *d, struct kern_at x, int64_t n);
    int (*mul_sigmoid)(struct kern_dev *d, struct kern_at x, struct kern_at g, int64_t n);
    int (*l2norm)(struct kern_dev *d, struct kern_at x, int64_t n, size_t stride, int nh,
                  int dim, float eps);
    int (*rmsnorm_silu)(struct kern_dev *d, struct kern_at out, struct kern_at x,
                        struct kern_at w, struct kern_at z, int64_t n, int64_t cols, float eps);
    int (*conv_silu)(struct kern_dev *d, struct kern_at out, struct kern_at x,
                     struct kern_at w, int64_t n, int64_t channels, int kernel);
    int (*moe_route)(struct kern_dev *d, struct kern_at sel, struct kern_at w,
                     struct kern_at logits, int64_t n, int n_expert, int k);
    int (*deltanet)(struct kern_dev *d, struct kern_at o, struct kern_at S, struct kern_at q,
                    struct kern_at k, struct kern_at v, size_t stride, struct kern_at beta,
                    struct kern_at alpha, struct kern_at dt_bias, struct kern_at a, int64_t n,
                    int n_k_head, int n_v_head, int dim);
    int (*get_rows)(struct kern_dev *d, uint32_t type, struct kern_at table, int64_t rows,
                    int64_t cols, struct kern_at ids, int64_t n, struct kern_at out);
    int (*copy_rows)(struct kern_dev *d, struct kern_at dst, size_t dst_stride,
                     struct kern_at src, size_t src_stride, int64_t src_rows,
                     struct kern_at idx, int64_t n, size_t row_bytes);
    int (*zero)(struct kern_dev *d, struct kern_at dst, size_t bytes);
};
/* The ops table of a host device whose file defines its entries as static functions named
 * after them (open_, close_, sync_, matmul, ...); the data-movement ops are the shared ones. */
#define KERN__HOST_DEV_OPS \
    .open = open_, .close = close_, .sync = sync_, .matmul_scratch = matmul_scratch, \
    .attention_scratch = attention_scratch, .deltanet_scratch = deltanet_scratch, \
    .reserve = reserve, .matmul = matmul, .rmsnorm_rows = rmsnorm_rows, \
    .rope_angles = rope_angles, .rope_rows = rope_rows, .kv_store = kv_store, \
    .attention = attention, .swiglu = swiglu, .add = add, .add_rows = add_rows, \
    .axpy_rows = axpy_rows, .sigmoid = sigmoid, .mul_sigmoid = mul_sigmoid, \
    .l2norm = l2norm, .rmsnorm_silu = rmsnorm_silu, .conv_silu = conv_silu, \
    .moe_route = moe_route, .deltanet = deltanet, .get_rows = kern__host_get_rows, \
    .copy_rows = kern__host_copy_rows, .zero = kern__host_zero
extern const struct kern__dev_ops kern__dev_cpu, kern__dev_ref, kern__dev_opencl;
/* Tests: opencl device d's prompt GEMMs report CLBlast status (a CLBlastStatusCode; 0: run
 * them again) instead of calling CLBlast, as a failing library would. -EINVAL off opencl. */
int kern__cl_gemm_fault(struct kern_dev *d, int status);

/* Ops every host device shares (kernels/dev_host.c): no arithmetic that a device could do
 * differently, only moves and look-ups. */
int kern__host_get_rows(struct kern_dev *d, uint32_t type, struct kern_at table, int64_t rows,
                        int64_t cols, struct kern_at ids, int64_t n, struct kern_at out);
int kern__host_copy_rows(struct kern_dev *d, struct kern_at dst, size_t dst_stride,
                         struct kern_at src, size_t src_stride, int64_t src_rows,
                         struct kern_at idx, int64_t n, size_t row_bytes);
int kern__host_zero(struct kern_dev *d, struct kern_at dst, size_t bytes);
/* The indices idx[0..n) all below rows (host memory). */
bool kern__host_idx_ok(const uint32_t *idx, int64_t n, int64_t rows);

#endif

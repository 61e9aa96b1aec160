/* simd_neon.c — the aarch64 kernels for the hot dot products: F32, F16, BF16, Q4_0, Q4_1,
 * Q5_0, Q5_1, Q8_0, Q4_K and Q6_K, one-row dots and their multi-row forms (docs/kernels.md,
 * "arm64"). Two levels come from the one body below, which this file includes into itself
 * twice: "neon" (baseline ARMv8-A
 * Advanced SIMD: int8 products widened with vmull/vpadal) and "neon-dotprod" (the same with
 * the ARMv8.2 SDOT instruction, compiled under a target pragma and chosen at run time from
 * getauxval(AT_HWCAP) in cpu_matmul.c). Built only for aarch64 (the Makefile leaves it out
 * elsewhere).
 *
 * Row exactness (docs/model.md): every kernel is one always-inlined "columns" body that walks
 * the weight row once and keeps separate accumulators per activation row; the one-row dot is
 * that body with one column, so each column of a multi-row dot repeats the one-row dot's
 * operations in the same order and gives the same bits. Activations use the reference
 * layouts (Q8_0, Q8_K, F16, F32) and the reference quantisers (table entries NULL), so no
 * weight or activation is repacked on these levels. */
#ifndef NEON_BODY

#include "kernels/internal.h"

#if defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>

#define ALWAYS_INLINE inline __attribute__((always_inline))

static ALWAYS_INLINE float h2f(uint16_t h)
{
    __fp16 f;
    memcpy(&f, &h, sizeof f);
    return (float)f;
}

/* 16 bytes of packed nibbles -> low nibbles (elements 0..15), high nibbles (16..31). */
static ALWAYS_INLINE void nibbles(const uint8_t *p, uint8x16_t *lo, uint8x16_t *hi)
{
    uint8x16_t raw = vld1q_u8(p);
    *lo = vandq_u8(raw, vdupq_n_u8(0x0F));
    *hi = vshrq_n_u8(raw, 4);
}

/* The one-row dot and the multi-row dot of type t from an always-inlined columns body taking
 * (leading args..., w, xq, xs, nc, n, out); SFX is the level's at expansion. */
#define COLS_DOTS(t, cols, ...)                                                                \
    static float SFX(dot_##t)(const void *w, const void *xq, int64_t n)                        \
    {                                                                                          \
        float out;                                                                             \
        SFX(cols)(__VA_ARGS__, w, xq, 0, 1, n, &out);                                          \
        return out;                                                                            \
    }                                                                                          \
    static void SFX(dotn_##t)(const void *w, const void *xq, size_t xs, int nc, int64_t n,      \
                              float *out)                                                      \
    {                                                                                          \
        SFX(cols)(__VA_ARGS__, w, xq, xs, nc, n, out);                                         \
    }

/* The kinds of the Q4_1/Q5_0/Q5_1 body. */
enum { Q41, Q50, Q51 };

/* A Q5 block's fifth bits as 0x10 in the lanes whose bit of qh is set: elements 0..15 (bits
 * 0..15) into lo, 16..31 (bits 16..31) into hi, as kern__q5_unpack takes them. */
static ALWAYS_INLINE void q5_high(const uint8_t qh[4], uint8x16_t *lo, uint8x16_t *hi)
{
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t m = vld1q_u8(bit), b4 = vdupq_n_u8(0x10);
    *lo = vandq_u8(vtstq_u8(vcombine_u8(vdup_n_u8(qh[0]), vdup_n_u8(qh[1])), m), b4);
    *hi = vandq_u8(vtstq_u8(vcombine_u8(vdup_n_u8(qh[2]), vdup_n_u8(qh[3])), m), b4);
}

/* Eight bf16 -> two float32x4 (a bf16 is the top half of an f32). */
static ALWAYS_INLINE void ld_bf16x8(const uint16_t *p, float32x4_t *a, float32x4_t *b)
{
    uint16x8_t u = vld1q_u16(p);
    *a = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(u), 16));
    *b = vreinterpretq_f32_u32(vshll_high_n_u16(u, 16));
}

/* Eight f16 -> two float32x4. */
static ALWAYS_INLINE void ld_f16x8(const uint16_t *p, float32x4_t *a, float32x4_t *b)
{
    float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(p));
    *a = vcvt_f32_f16(vget_low_f16(h));
    *b = vcvt_high_f32_f16(h);
}

/* Baseline level: acc + the sums of 4 adjacent int8 products, widened through int16 (two
 * products of |a|,|b| <= 128 fit in int16 for every pairing the kernels make). */
static ALWAYS_INLINE int32x4_t i8dot_neon(int32x4_t acc, int8x16_t a, int8x16_t b)
{
    int16x8_t p = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    p = vmlal_high_s8(p, a, b);
    return vpadalq_s16(acc, p);
}

#define NEON_BODY 1
#define SFX(name) name##_neon
#define I8DOT i8dot_neon
#include "kernels/cpu/simd_neon.c"
#undef SFX
#undef I8DOT

#undef NEON_BODY
#define NEON_BODY 2
#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod")
static ALWAYS_INLINE int32x4_t i8dot_dp(int32x4_t acc, int8x16_t a, int8x16_t b)
{
    return vdotq_s32(acc, a, b);
}
#define SFX(name) name##_dp
#define I8DOT i8dot_dp
#include "kernels/cpu/simd_neon.c"
#undef SFX
#undef I8DOT
#pragma GCC pop_options

/* What both levels share: entries without an int8 product are the baseline's. */
#define NEON_TABLE(sfx, lname)                                                                 \
    {                                                                                          \
        .name = lname,                                                                         \
        .dot = {                                                                               \
            [KERN_T_F32] = dot_f32_neon, [KERN_T_F16] = dot_f16_neon,                          \
            [KERN_T_Q4_0] = dot_q4_0_##sfx, [KERN_T_Q8_0] = dot_q8_0_##sfx,                    \
            [KERN_T_Q4_K] = dot_q4_K_##sfx, [KERN_T_Q6_K] = dot_q6_K_##sfx,                    \
            [KERN_T_Q4_1] = dot_q4_1_##sfx, [KERN_T_Q5_0] = dot_q5_0_##sfx,                    \
            [KERN_T_Q5_1] = dot_q5_1_##sfx, [KERN_T_BF16] = dot_bf16_neon,                     \
        },                                                                                     \
        .dotn = {                                                                              \
            [KERN_T_F16] = dotn_f16_neon, [KERN_T_Q4_0] = dotn_q4_0_##sfx,                     \
            [KERN_T_Q8_0] = dotn_q8_0_##sfx, [KERN_T_Q4_K] = dotn_q4_K_##sfx,                  \
            [KERN_T_Q6_K] = dotn_q6_K_##sfx, [KERN_T_Q4_1] = dotn_q4_1_##sfx,                  \
            [KERN_T_Q5_0] = dotn_q5_0_##sfx, [KERN_T_Q5_1] = dotn_q5_1_##sfx,                  \
            [KERN_T_BF16] = dotn_bf16_neon,                                                    \
        },                                                                                     \
        .dot_f32 = dot_f32_row_neon,                                                           \
    }

const struct kern__simd kern__simd_neon = NEON_TABLE(neon, "neon");
const struct kern__simd kern__simd_neon_dotprod = NEON_TABLE(dp, "neon-dotprod");

#else /* not aarch64 with NEON: empty tables, never selected */
const struct kern__simd kern__simd_neon = {.name = "neon"};
const struct kern__simd kern__simd_neon_dotprod = {.name = "neon-dotprod"};
#endif

#else /* NEON_BODY: the kernels of one level; SFX names them, I8DOT is its int8 product */

/* ---- F32 and F16: no int8 products, so only the baseline pass defines them ---- */
#if NEON_BODY == 1

static float SFX(dot_f32_row)(const float *a, const float *b, int64_t n)
{
    float32x4_t s0 = vdupq_n_f32(0), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
        s1 = vfmaq_f32(s1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
        s2 = vfmaq_f32(s2, vld1q_f32(a + i + 8), vld1q_f32(b + i + 8));
        s3 = vfmaq_f32(s3, vld1q_f32(a + i + 12), vld1q_f32(b + i + 12));
    }
    for (; i + 4 <= n; i += 4)
        s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
    float s = vaddvq_f32(vaddq_f32(vaddq_f32(s0, s1), vaddq_f32(s2, s3)));
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

static float SFX(dot_f32)(const void *w, const void *xq, int64_t n)
{
    return SFX(dot_f32_row)(w, xq, n);
}

/* out[c] = dot(f16 row w, f16 activation row c), or bf16 rows when bf, two accumulators per
 * column. A product of two f16 (bf16) values is exact in f32 (22 or 16 significant bits); the
 * products are summed in f64 as the reference sums them, so the dot rounds to the
 * reference's float but for exact ties.
 * Attention on an F16 cache rounds its softmax weights to f16 after these dots: with f32
 * sums a score one ulp off the reference's flipped such a rounding now and then (an error of
 * 2^-11 of one weight), beyond test-kern-cpu's bound for attention against the reference. */
static ALWAYS_INLINE void SFX(f16_cols)(const bool bf, const void *w, const void *xq, size_t xs,
                                        const int nc, int64_t n, float *out)
{
    const uint16_t *a = w;
    float64x2_t acc[KERN_MAXCOL][2];
    for (int c = 0; c < nc; c++)
        acc[c][0] = acc[c][1] = vdupq_n_f64(0);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        float32x4_t w0, w1;
        if (bf)
            ld_bf16x8(a + i, &w0, &w1);
        else
            ld_f16x8(a + i, &w0, &w1);
        for (int c = 0; c < nc; c++) {
            float32x4_t x0, x1;
            const uint16_t *b = (const uint16_t *)((const char *)xq + c * xs) + i;
            if (bf)
                ld_bf16x8(b, &x0, &x1);
            else
                ld_f16x8(b, &x0, &x1);
            float32x4_t p0 = vmulq_f32(w0, x0), p1 = vmulq_f32(w1, x1); /* exact */
            acc[c][0] = vaddq_f64(acc[c][0], vcvt_f64_f32(vget_low_f32(p0)));
            acc[c][1] = vaddq_f64(acc[c][1], vcvt_high_f64_f32(p0));
            acc[c][0] = vaddq_f64(acc[c][0], vcvt_f64_f32(vget_low_f32(p1)));
            acc[c][1] = vaddq_f64(acc[c][1], vcvt_high_f64_f32(p1));
        }
    }
    for (int c = 0; c < nc; c++) {
        const uint16_t *b = (const uint16_t *)((const char *)xq + c * xs);
        double s = vaddvq_f64(vaddq_f64(acc[c][0], acc[c][1]));
        for (int64_t k = i; k < n; k++)
            s += bf ? (double)(wtype_bf16_to_f32(a[k]) * wtype_bf16_to_f32(b[k]))
                    : (double)(h2f(a[k]) * h2f(b[k]));
        out[c] = (float)s;
    }
}

COLS_DOTS(f16, f16_cols, false)
COLS_DOTS(bf16, f16_cols, true)
#endif

/* ---- Q4_0 and Q8_0 against Q8_0 activations ---- */

/* Per 32-block: the integer dot as 4 lanes, scaled by d_w * d_x into 4 float lanes. */
static ALWAYS_INLINE void SFX(q4_0_cols)(const void *w, const void *xq, size_t xs, const int nc,
                                         int64_t n, float *out)
{
    const struct kern_block_q4_0 *x = w;
    float32x4_t acc[KERN_MAXCOL];
    for (int c = 0; c < nc; c++)
        acc[c] = vdupq_n_f32(0);
    for (int64_t b = 0; b < n / KERN_QK; b++) {
        uint8x16_t ulo, uhi;
        nibbles(x[b].qs, &ulo, &uhi);
        int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(ulo), vdupq_n_s8(8));
        int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(uhi), vdupq_n_s8(8));
        float dw = h2f(x[b].d);
        for (int c = 0; c < nc; c++) {
            const struct kern_block_q8_0 *y = (const struct kern_block_q8_0 *)((const char *)xq + c * xs) + b;
            int32x4_t p = I8DOT(I8DOT(vdupq_n_s32(0), lo, vld1q_s8(y->qs)), hi, vld1q_s8(y->qs + 16));
            acc[c] = vfmaq_n_f32(acc[c], vcvtq_f32_s32(p), dw * h2f(y->d));
        }
    }
    for (int c = 0; c < nc; c++)
        out[c] = vaddvq_f32(acc[c]);
}

static float SFX(dot_q4_0)(const void *w, const void *xq, int64_t n)
{
    float out;
    SFX(q4_0_cols)(w, xq, 0, 1, n, &out);
    return out;
}

static void SFX(dotn_q4_0)(const void *w, const void *xq, size_t xs, int nc, int64_t n, float *out)
{
    SFX(q4_0_cols)(w, xq, xs, nc, n, out);
}

static ALWAYS_INLINE void SFX(q8_0_cols)(const void *w, const void *xq, size_t xs, const int nc,
                                         int64_t n, float *out)
{
    const struct kern_block_q8_0 *x = w;
    float32x4_t acc[KERN_MAXCOL];
    for (int c = 0; c < nc; c++)
        acc[c] = vdupq_n_f32(0);
    for (int64_t b = 0; b < n / KERN_QK; b++) {
        int8x16_t w0 = vld1q_s8(x[b].qs), w1 = vld1q_s8(x[b].qs + 16);
        float dw = h2f(x[b].d);
        for (int c = 0; c < nc; c++) {
            const struct kern_block_q8_0 *y = (const struct kern_block_q8_0 *)((const char *)xq + c * xs) + b;
            int32x4_t p = I8DOT(I8DOT(vdupq_n_s32(0), w0, vld1q_s8(y->qs)), w1, vld1q_s8(y->qs + 16));
            acc[c] = vfmaq_n_f32(acc[c], vcvtq_f32_s32(p), dw * h2f(y->d));
        }
    }
    for (int c = 0; c < nc; c++)
        out[c] = vaddvq_f32(acc[c]);
}

static float SFX(dot_q8_0)(const void *w, const void *xq, int64_t n)
{
    float out;
    SFX(q8_0_cols)(w, xq, 0, 1, n, &out);
    return out;
}

static void SFX(dotn_q8_0)(const void *w, const void *xq, size_t xs, int nc, int64_t n, float *out)
{
    SFX(q8_0_cols)(w, xq, xs, nc, n, out);
}

/* ---- Q4_1 and Q5_1 against Q8_1, Q5_0 against Q8_0 ---- */

/* One body for the three (kind is a constant once inlined): the levels as int8 (Q4_1 and Q5_1
 * unsigned, 0..15 and 0..31; Q5_0 offset by 16) times the activation bytes as in Q4_0, the _1
 * types adding m_w * s_x per block in f32 beside the lanes. */
static ALWAYS_INLINE void SFX(q45_cols)(const int kind, const void *w, const void *xq, size_t xs,
                                        const int nc, int64_t n, float *out)
{
    float32x4_t acc[KERN_MAXCOL];
    float mins[KERN_MAXCOL];
    for (int c = 0; c < nc; c++) {
        acc[c] = vdupq_n_f32(0);
        mins[c] = 0;
    }
    for (int64_t b = 0; b < n / KERN_QK; b++) {
        uint16_t d, m = 0;
        const uint8_t *qs, *qh = NULL;
        if (kind == Q41) {
            const struct kern_block_q4_1 *x = (const struct kern_block_q4_1 *)w + b;
            d = x->d, m = x->m, qs = x->qs;
        } else if (kind == Q50) {
            const struct kern_block_q5_0 *x = (const struct kern_block_q5_0 *)w + b;
            d = x->d, qs = x->qs, qh = x->qh;
        } else {
            const struct kern_block_q5_1 *x = (const struct kern_block_q5_1 *)w + b;
            d = x->d, m = x->m, qs = x->qs, qh = x->qh;
        }
        uint8x16_t ulo, uhi;
        nibbles(qs, &ulo, &uhi);
        if (kind != Q41) {
            uint8x16_t hlo, hhi;
            q5_high(qh, &hlo, &hhi);
            ulo = vorrq_u8(ulo, hlo);
            uhi = vorrq_u8(uhi, hhi);
        }
        int8x16_t lo = vreinterpretq_s8_u8(ulo), hi = vreinterpretq_s8_u8(uhi);
        if (kind == Q50) {
            lo = vsubq_s8(lo, vdupq_n_s8(16));
            hi = vsubq_s8(hi, vdupq_n_s8(16));
        }
        float dw = h2f(d), mw = h2f(m);
        for (int c = 0; c < nc; c++) {
            const int8_t *yq;
            float dx;
            if (kind == Q50) {
                const struct kern_block_q8_0 *y = (const struct kern_block_q8_0 *)((const char *)xq + c * xs) + b;
                yq = y->qs, dx = h2f(y->d);
            } else {
                const struct kern_block_q8_1 *y = (const struct kern_block_q8_1 *)((const char *)xq + c * xs) + b;
                yq = y->qs, dx = h2f(y->d);
                mins[c] += mw * h2f(y->s);
            }
            int32x4_t p = I8DOT(I8DOT(vdupq_n_s32(0), lo, vld1q_s8(yq)), hi, vld1q_s8(yq + 16));
            acc[c] = vfmaq_n_f32(acc[c], vcvtq_f32_s32(p), dw * dx);
        }
    }
    for (int c = 0; c < nc; c++)
        out[c] = vaddvq_f32(acc[c]) + mins[c];
}

COLS_DOTS(q4_1, q45_cols, Q41)
COLS_DOTS(q5_0, q45_cols, Q50)
COLS_DOTS(q5_1, q45_cols, Q51)

/* ---- Q4_K and Q6_K against Q8_K activations ---- */

/* A super-block's integer sums are exact whatever their order; each column then adds
 * d * isum - dmin * imin (Q4_K) or d * isum (Q6_K) in f32, block after block, as the
 * reference does. */
static ALWAYS_INLINE void SFX(q4_K_cols)(const void *w, const void *xq, size_t xs, const int nc,
                                         int64_t n, float *out)
{
    const struct kern_block_q4_K *x = w;
    float sum[KERN_MAXCOL];
    for (int c = 0; c < nc; c++)
        sum[c] = 0;
    for (int64_t b = 0; b < n / KERN_QK_K; b++) {
        uint8_t sc[8], mn[8];
        for (int j = 0; j < 8; j++)
            kern__scale_min_k4(j, x[b].scales, &sc[j], &mn[j]);
        /* q[s][h]: sub-block s (32 levels 0..15), halves of 16 */
        int8x16_t q[8][2];
        for (int j = 0; j < 4; j++) {
            uint8x16_t l0, h0, l1, h1;
            nibbles(x[b].qs + 32 * j, &l0, &h0);      /* bytes 0..15 of the chunk */
            nibbles(x[b].qs + 32 * j + 16, &l1, &h1); /* bytes 16..31 */
            q[2 * j][0] = vreinterpretq_s8_u8(l0);
            q[2 * j][1] = vreinterpretq_s8_u8(l1);
            q[2 * j + 1][0] = vreinterpretq_s8_u8(h0);
            q[2 * j + 1][1] = vreinterpretq_s8_u8(h1);
        }
        float dw = h2f(x[b].d), dminw = h2f(x[b].dmin);
        for (int c = 0; c < nc; c++) {
            const struct kern_block_q8_K *y = (const struct kern_block_q8_K *)((const char *)xq + c * xs) + b;
            int32x4_t acc = vdupq_n_s32(0);
            int imin = 0;
            for (int s = 0; s < 8; s++) {
                int32x4_t p = I8DOT(I8DOT(vdupq_n_s32(0), q[s][0], vld1q_s8(y->qs + 32 * s)),
                                    q[s][1], vld1q_s8(y->qs + 32 * s + 16));
                acc = vmlaq_n_s32(acc, p, sc[s]);
                imin += mn[s] * (y->bsums[2 * s] + y->bsums[2 * s + 1]);
            }
            int isum = vaddvq_s32(acc);
            sum[c] += dw * y->d * isum - dminw * y->d * imin;
        }
    }
    for (int c = 0; c < nc; c++)
        out[c] = sum[c];
}

static float SFX(dot_q4_K)(const void *w, const void *xq, int64_t n)
{
    float out;
    SFX(q4_K_cols)(w, xq, 0, 1, n, &out);
    return out;
}

static void SFX(dotn_q4_K)(const void *w, const void *xq, size_t xs, int nc, int64_t n, float *out)
{
    /* Four columns at a time keep the decoded block and the sums in registers. */
    SFX(q4_K_cols)(w, xq, xs, nc < 4 ? nc : 4, n, out);
    if (nc > 4)
        SFX(q4_K_cols)(w, (const char *)xq + 4 * xs, xs, nc - 4, n, out + 4);
}

/* Q6_K: the 6-bit levels of one half (128 elements) as 8 vectors of 16, each one sub-block
 * (the reference's o[l], o[l + 32], o[l + 64], o[l + 96] for l = 0..31), offset by -32. */
static ALWAYS_INLINE void SFX(q6_half)(const uint8_t *ql, const uint8_t *qh, int8x16_t o[8])
{
    const uint8x16_t m4 = vdupq_n_u8(0x0F), m3 = vdupq_n_u8(3);
    for (int k = 0; k < 2; k++) { /* l = 16k .. 16k + 15 */
        uint8x16_t la = vld1q_u8(ql + 16 * k), lb = vld1q_u8(ql + 32 + 16 * k);
        uint8x16_t h = vld1q_u8(qh + 16 * k);
        uint8x16_t v0 = vorrq_u8(vandq_u8(la, m4), vshlq_n_u8(vandq_u8(h, m3), 4));
        uint8x16_t v1 = vorrq_u8(vandq_u8(lb, m4), vshlq_n_u8(vandq_u8(vshrq_n_u8(h, 2), m3), 4));
        uint8x16_t v2 = vorrq_u8(vshrq_n_u8(la, 4), vshlq_n_u8(vandq_u8(vshrq_n_u8(h, 4), m3), 4));
        uint8x16_t v3 = vorrq_u8(vshrq_n_u8(lb, 4), vshlq_n_u8(vshrq_n_u8(h, 6), 4));
        o[0 + k] = vsubq_s8(vreinterpretq_s8_u8(v0), vdupq_n_s8(32));
        o[2 + k] = vsubq_s8(vreinterpretq_s8_u8(v1), vdupq_n_s8(32));
        o[4 + k] = vsubq_s8(vreinterpretq_s8_u8(v2), vdupq_n_s8(32));
        o[6 + k] = vsubq_s8(vreinterpretq_s8_u8(v3), vdupq_n_s8(32));
    }
}

static ALWAYS_INLINE void SFX(q6_K_cols)(const void *w, const void *xq, size_t xs, const int nc,
                                         int64_t n, float *out)
{
    const struct kern_block_q6_K *x = w;
    float sum[KERN_MAXCOL];
    for (int c = 0; c < nc; c++)
        sum[c] = 0;
    for (int64_t b = 0; b < n / KERN_QK_K; b++) {
        int8x16_t o[16];
        SFX(q6_half)(x[b].ql, x[b].qh, o);
        SFX(q6_half)(x[b].ql + 64, x[b].qh + 32, o + 8);
        float dw = h2f(x[b].d);
        for (int c = 0; c < nc; c++) {
            const struct kern_block_q8_K *y = (const struct kern_block_q8_K *)((const char *)xq + c * xs) + b;
            int32x4_t acc = vdupq_n_s32(0);
            for (int j = 0; j < 16; j++)
                acc = vmlaq_n_s32(acc, I8DOT(vdupq_n_s32(0), o[j], vld1q_s8(y->qs + 16 * j)),
                                  x[b].scales[j]);
            sum[c] += dw * y->d * vaddvq_s32(acc);
        }
    }
    for (int c = 0; c < nc; c++)
        out[c] = sum[c];
}

static float SFX(dot_q6_K)(const void *w, const void *xq, int64_t n)
{
    float out;
    SFX(q6_K_cols)(w, xq, 0, 1, n, &out);
    return out;
}

static void SFX(dotn_q6_K)(const void *w, const void *xq, size_t xs, int nc, int64_t n, float *out)
{
    SFX(q6_K_cols)(w, xq, xs, nc < 4 ? nc : 4, n, out);
    if (nc > 4)
        SFX(q6_K_cols)(w, (const char *)xq + 4 * xs, xs, nc - 4, n, out + 4);
}

#endif /* NEON_BODY */

/* Reference dot products with ggml's CPU semantics: one weight row against one activation
 * row already converted to the weight type's vec_dot_type (Q8_0, Q8_1, Q8_K, F16, BF16 or
 * F32), block by block, integer sums scaled in f32. The type-traits table (ref_types.c)
 * points at them. */
#include <errno.h>
#include <stdlib.h>

#include "kernels/internal.h"

float kern__dot_f32(const void *w, const void *xq, int64_t n)
{
    const float *a = w, *b = xq;
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += (double)(a[i] * b[i]);
    return (float)s;
}

/* A dot of two 16-bit float rows widened by cvt (f16 or bf16), summed in double. */
static float dot_16(const uint16_t *a, const uint16_t *b, int64_t n, float (*cvt)(uint16_t))
{
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += (double)(cvt(a[i]) * cvt(b[i]));
    return (float)s;
}

float kern__dot_f16(const void *w, const void *xq, int64_t n)
{
    return dot_16(w, xq, n, wtype_f16_to_f32);
}

float kern__dot_bf16(const void *w, const void *xq, int64_t n)
{
    return dot_16(w, xq, n, wtype_bf16_to_f32);
}

float kern__dot_q4_0(const void *w, const void *xq, int64_t n)
{
    const struct kern_block_q4_0 *x = w;
    const struct kern_block_q8_0 *y = xq;
    float sumf = 0;
    for (int64_t i = 0; i < n / KERN_QK; i++) {
        int sumi = 0;
        for (int j = 0; j < KERN_QK / 2; j++) {
            sumi += ((x[i].qs[j] & 0xF) - 8) * y[i].qs[j];
            sumi += ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + 16];
        }
        sumf += sumi * (kern__h2f(x[i].d) * kern__h2f(y[i].d));
    }
    return sumf;
}

float kern__dot_q4_1(const void *w, const void *xq, int64_t n)
{
    const struct kern_block_q4_1 *x = w;
    const struct kern_block_q8_1 *y = xq;
    float sumf = 0;
    for (int64_t i = 0; i < n / KERN_QK; i++) {
        int sumi = 0;
        for (int j = 0; j < KERN_QK / 2; j++) {
            sumi += (x[i].qs[j] & 0xF) * y[i].qs[j];
            sumi += (x[i].qs[j] >> 4) * y[i].qs[j + 16];
        }
        sumf += sumi * (kern__h2f(x[i].d) * kern__h2f(y[i].d)) +
                kern__h2f(x[i].m) * kern__h2f(y[i].s);
    }
    return sumf;
}

float kern__dot_q5_0(const void *w, const void *xq, int64_t n)
{
    const struct kern_block_q5_0 *x = w;
    const struct kern_block_q8_0 *y = xq;
    float sumf = 0;
    for (int64_t i = 0; i < n / KERN_QK; i++) {
        int q[KERN_QK], sumi = 0;
        kern__q5_unpack(x[i].qs, x[i].qh, q);
        for (int j = 0; j < KERN_QK; j++)
            sumi += (q[j] - 16) * y[i].qs[j];
        sumf += sumi * (kern__h2f(x[i].d) * kern__h2f(y[i].d));
    }
    return sumf;
}

float kern__dot_q5_1(const void *w, const void *xq, int64_t n)
{
    const struct kern_block_q5_1 *x = w;
    const struct kern_block_q8_1 *y = xq;
    float sumf = 0;
    for (int64_t i = 0; i < n / KERN_QK; i++) {
        int q[KERN_QK], sumi = 0;
        kern__q5_unpack(x[i].qs, x[i].qh, q);
        for (int j = 0; j < KERN_QK; j++)
            sumi += q[j] * y[i].qs[j];
        sumf += sumi * (kern__h2f(x[i].d) * kern__h2f(y[i].d)) +
                kern__h2f(x[i].m) * kern__h2f(y[i].s);
    }
    return sumf;
}

float kern__dot_q8_0(const void *w, const void *xq, int64_t n)
{
    const struct kern_block_q8_0 *x = w;
    const struct kern_block_q8_0 *y = xq;
    float sumf = 0;
    for (int64_t i = 0; i < n / KERN_QK; i++) {
        int sumi = 0;
        for (int j = 0; j < KERN_QK; j++)
            sumi += x[i].qs[j] * y[i].qs[j];
        sumf += sumi * (kern__h2f(x[i].d) * kern__h2f(y[i].d));
    }
    return sumf;
}

/* Q4_K and Q5_K share the scale/min structure; q holds the 256 unsigned levels. */
static float dot_k_levels(const uint8_t *q, const uint8_t *scales, float d, float dmin,
                          const struct kern_block_q8_K *y)
{
    int isum = 0, imin = 0;
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        kern__scale_min_k4(j, scales, &sc, &m);
        int s = 0;
        for (int l = 0; l < 32; l++)
            s += q[32 * j + l] * y->qs[32 * j + l];
        isum += sc * s;
        imin += m * (y->bsums[2 * j] + y->bsums[2 * j + 1]);
    }
    return d * y->d * isum - dmin * y->d * imin;
}

float kern__dot_q4_K(const void *w, const void *xq, int64_t n)
{
    const struct kern_block_q4_K *x = w;
    const struct kern_block_q8_K *y = xq;
    float sumf = 0;
    uint8_t q[KERN_QK_K];
    for (int64_t i = 0; i < n / KERN_QK_K; i++) {
        kern__k45_levels(x[i].qs, NULL, q);
        sumf += dot_k_levels(q, x[i].scales, kern__h2f(x[i].d), kern__h2f(x[i].dmin), &y[i]);
    }
    return sumf;
}

float kern__dot_q5_K(const void *w, const void *xq, int64_t n)
{
    const struct kern_block_q5_K *x = w;
    const struct kern_block_q8_K *y = xq;
    float sumf = 0;
    uint8_t q[KERN_QK_K];
    for (int64_t i = 0; i < n / KERN_QK_K; i++) {
        kern__k45_levels(x[i].qs, x[i].qh, q);
        sumf += dot_k_levels(q, x[i].scales, kern__h2f(x[i].d), kern__h2f(x[i].dmin), &y[i]);
    }
    return sumf;
}

float kern__dot_q6_K(const void *w, const void *xq, int64_t n)
{
    const struct kern_block_q6_K *x = w;
    const struct kern_block_q8_K *y = xq;
    float sumf = 0;
    int8_t q[KERN_QK_K];
    for (int64_t i = 0; i < n / KERN_QK_K; i++) {
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        for (int h = 0; h < 2; h++, ql += 64, qh += 32) {
            int8_t *o = q + 128 * h;
            for (int l = 0; l < 32; l++) {
                o[l] = (int8_t)(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
                o[l + 32] = (int8_t)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
                o[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                o[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
            }
        }
        int isum = 0;
        for (int j = 0; j < 16; j++) {
            int s = 0;
            for (int l = 0; l < 16; l++)
                s += q[16 * j + l] * y[i].qs[16 * j + l];
            isum += x[i].scales[j] * s;
        }
        sumf += kern__h2f(x[i].d) * y[i].d * isum;
    }
    return sumf;
}

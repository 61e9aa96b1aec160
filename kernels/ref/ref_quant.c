/* The reference dequantisers and quantisers of every type (the type-traits table in
 * ref_types.c points at them).
 * Quantisers follow ggml's reference rounding so that files we write quantise like
 * llama.cpp's and our activation blocks match its CPU path. */
#include <errno.h>
#include <stdlib.h>

#include "kernels/internal.h"

#define MAXI(a, b) ((a) > (b) ? (a) : (b))
#define MINI(a, b) ((a) < (b) ? (a) : (b))

/* ---- dequantisation (nb blocks each) ---- */

void kern__dequant_f32(const void *src, float *y, int64_t nb)
{
    memcpy(y, src, (size_t)nb * sizeof *y);
}

void kern__dequant_f16(const void *src, float *y, int64_t nb)
{
    const uint16_t *h = src;
    for (int64_t i = 0; i < nb; i++)
        y[i] = wtype_f16_to_f32(h[i]);
}

void kern__dequant_bf16(const void *src, float *y, int64_t nb)
{
    const uint16_t *h = src;
    for (int64_t i = 0; i < nb; i++)
        y[i] = wtype_bf16_to_f32(h[i]);
}

void kern__dequant_q4_0(const void *src, float *y, int64_t nb)
{
    const struct kern_block_q4_0 *b = src;
    for (int64_t i = 0; i < nb; i++, y += KERN_QK) {
        float d = kern__h2f(b[i].d);
        for (int j = 0; j < KERN_QK / 2; j++) {
            y[j] = ((b[i].qs[j] & 0xF) - 8) * d;
            y[j + 16] = ((b[i].qs[j] >> 4) - 8) * d;
        }
    }
}

void kern__dequant_q4_1(const void *src, float *y, int64_t nb)
{
    const struct kern_block_q4_1 *b = src;
    for (int64_t i = 0; i < nb; i++, y += KERN_QK) {
        float d = kern__h2f(b[i].d), m = kern__h2f(b[i].m);
        for (int j = 0; j < KERN_QK / 2; j++) {
            y[j] = (b[i].qs[j] & 0xF) * d + m;
            y[j + 16] = (b[i].qs[j] >> 4) * d + m;
        }
    }
}

void kern__dequant_q5_0(const void *src, float *y, int64_t nb)
{
    const struct kern_block_q5_0 *b = src;
    for (int64_t i = 0; i < nb; i++, y += KERN_QK) {
        float d = kern__h2f(b[i].d);
        int q[KERN_QK];
        kern__q5_unpack(b[i].qs, b[i].qh, q);
        for (int j = 0; j < KERN_QK; j++)
            y[j] = (q[j] - 16) * d;
    }
}

void kern__dequant_q5_1(const void *src, float *y, int64_t nb)
{
    const struct kern_block_q5_1 *b = src;
    for (int64_t i = 0; i < nb; i++, y += KERN_QK) {
        float d = kern__h2f(b[i].d), m = kern__h2f(b[i].m);
        int q[KERN_QK];
        kern__q5_unpack(b[i].qs, b[i].qh, q);
        for (int j = 0; j < KERN_QK; j++)
            y[j] = q[j] * d + m;
    }
}

/* One block of 32 int8 quants with scale d (Q8_0 and Q8_1 differ only in what follows d). */
static void dequant_q8_block(const int8_t *qs, float d, float *y)
{
    for (int j = 0; j < KERN_QK; j++)
        y[j] = qs[j] * d;
}

void kern__dequant_q8_0(const void *src, float *y, int64_t nb)
{
    const struct kern_block_q8_0 *b = src;
    for (int64_t i = 0; i < nb; i++, y += KERN_QK)
        dequant_q8_block(b[i].qs, kern__h2f(b[i].d), y);
}

void kern__dequant_q8_1(const void *src, float *y, int64_t nb)
{
    const struct kern_block_q8_1 *b = src;
    for (int64_t i = 0; i < nb; i++, y += KERN_QK)
        dequant_q8_block(b[i].qs, kern__h2f(b[i].d), y);
}

/* One Q4_K or Q5_K super-block (qh NULL for Q4_K): each level times its sub-block's scale,
 * less its min (6-bit scales and mins, times the block's d and dmin). */
static void dequant_k45(const uint8_t *scales, float d, float dmin, const uint8_t *qs,
                        const uint8_t *qh, float *y)
{
    uint8_t q[KERN_QK_K];
    kern__k45_levels(qs, qh, q);
    for (int j = 0; j < 8; j++, y += 32) {
        uint8_t sc, m;
        kern__scale_min_k4(j, scales, &sc, &m);
        float dj = d * sc, mj = dmin * m;
        for (int l = 0; l < 32; l++)
            y[l] = dj * q[32 * j + l] - mj;
    }
}

void kern__dequant_q4_K(const void *src, float *y, int64_t nb)
{
    const struct kern_block_q4_K *b = src;
    for (int64_t i = 0; i < nb; i++, y += KERN_QK_K)
        dequant_k45(b[i].scales, kern__h2f(b[i].d), kern__h2f(b[i].dmin), b[i].qs, NULL, y);
}

void kern__dequant_q5_K(const void *src, float *y, int64_t nb)
{
    const struct kern_block_q5_K *b = src;
    for (int64_t i = 0; i < nb; i++, y += KERN_QK_K)
        dequant_k45(b[i].scales, kern__h2f(b[i].d), kern__h2f(b[i].dmin), b[i].qs, b[i].qh, y);
}

void kern__dequant_q6_K(const void *src, float *y, int64_t nb)
{
    const struct kern_block_q6_K *b = src;
    for (int64_t i = 0; i < nb; i++) {
        float d = kern__h2f(b[i].d);
        const uint8_t *ql = b[i].ql, *qh = b[i].qh;
        const int8_t *sc = b[i].scales;
        for (int n = 0; n < KERN_QK_K; n += 128, ql += 64, qh += 32, sc += 8, y += 128) {
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * sc[is + 0] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
        }
    }
}

void kern__dequant_q8_K(const void *src, float *y, int64_t nb)
{
    const struct kern_block_q8_K *b = src;
    for (int64_t i = 0; i < nb; i++, y += KERN_QK_K)
        for (int j = 0; j < KERN_QK_K; j++)
            y[j] = b[i].d * b[i].qs[j];
}

/* ---- quantisation (nb blocks each) ---- */

void kern__quant_f32(const float *x, void *dst, int64_t nb)
{
    memcpy(dst, x, (size_t)nb * sizeof *x);
}

void kern__quant_f16(const float *x, void *dst, int64_t nb)
{
    uint16_t *h = dst;
    for (int64_t i = 0; i < nb; i++)
        h[i] = wtype_f32_to_f16(x[i]);
}

void kern__quant_bf16(const float *x, void *dst, int64_t nb)
{
    uint16_t *h = dst;
    for (int64_t i = 0; i < nb; i++)
        h[i] = wtype_f32_to_bf16(x[i]);
}

/* Largest |x| of a block and the signed value that has it. */
static float abs_max(const float *x, int n, float *signed_max)
{
    float amax = 0, max = 0;
    for (int j = 0; j < n; j++) {
        float a = fabsf(x[j]);
        if (a > amax) {
            amax = a;
            max = x[j];
        }
    }
    if (signed_max)
        *signed_max = max;
    return amax;
}

void kern__quant_q4_0(const float *x, void *dst, int64_t nb)
{
    struct kern_block_q4_0 *b = dst;
    for (int64_t i = 0; i < nb; i++, x += KERN_QK) {
        float max;
        abs_max(x, KERN_QK, &max);
        float d = max / -8, id = d != 0 ? 1.0f / d : 0.0f;
        b[i].d = wtype_f32_to_f16(d);
        for (int j = 0; j < KERN_QK / 2; j++) {
            int q0 = MINI(15, (int8_t)(x[j] * id + 8.5f));
            int q1 = MINI(15, (int8_t)(x[j + 16] * id + 8.5f));
            b[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

/* The least and greatest of x[0..n). */
static void min_max(const float *x, int n, float *min, float *max)
{
    *min = INFINITY;
    *max = -INFINITY;
    for (int j = 0; j < n; j++) {
        *min = x[j] < *min ? x[j] : *min;
        *max = x[j] > *max ? x[j] : *max;
    }
}

void kern__quant_q4_1(const float *x, void *dst, int64_t nb)
{
    struct kern_block_q4_1 *b = dst;
    for (int64_t i = 0; i < nb; i++, x += KERN_QK) {
        float min, max;
        min_max(x, KERN_QK, &min, &max);
        float d = (max - min) / 15, id = d != 0 ? 1.0f / d : 0.0f;
        b[i].d = wtype_f32_to_f16(d);
        b[i].m = wtype_f32_to_f16(min);
        for (int j = 0; j < KERN_QK / 2; j++) {
            int q0 = MINI(15, (int8_t)((x[j] - min) * id + 0.5f));
            int q1 = MINI(15, (int8_t)((x[j + 16] - min) * id + 0.5f));
            b[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

void kern__quant_q5_0(const float *x, void *dst, int64_t nb)
{
    struct kern_block_q5_0 *b = dst;
    for (int64_t i = 0; i < nb; i++, x += KERN_QK) {
        float max;
        abs_max(x, KERN_QK, &max);
        float d = max / -16, id = d != 0 ? 1.0f / d : 0.0f;
        b[i].d = wtype_f32_to_f16(d);
        int q[KERN_QK];
        for (int j = 0; j < KERN_QK; j++)
            q[j] = MINI(31, (int8_t)(x[j] * id + 16.5f));
        kern__q5_pack(q, b[i].qs, b[i].qh);
    }
}

void kern__quant_q5_1(const float *x, void *dst, int64_t nb)
{
    struct kern_block_q5_1 *b = dst;
    for (int64_t i = 0; i < nb; i++, x += KERN_QK) {
        float min, max;
        min_max(x, KERN_QK, &min, &max);
        float d = (max - min) / 31, id = d != 0 ? 1.0f / d : 0.0f;
        b[i].d = wtype_f32_to_f16(d);
        b[i].m = wtype_f32_to_f16(min);
        int q[KERN_QK];
        for (int j = 0; j < KERN_QK; j++)
            q[j] = MINI(31, (uint8_t)((x[j] - min) * id + 0.5f));
        kern__q5_pack(q, b[i].qs, b[i].qh);
    }
}

void kern__quant_q8_0(const float *x, void *dst, int64_t nb)
{
    struct kern_block_q8_0 *b = dst;
    for (int64_t i = 0; i < nb; i++, x += KERN_QK) {
        float d = abs_max(x, KERN_QK, NULL) / 127, id = d != 0 ? 1.0f / d : 0.0f;
        b[i].d = wtype_f32_to_f16(d);
        for (int j = 0; j < KERN_QK; j++)
            b[i].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

void kern__quant_q8_1(const float *x, void *dst, int64_t nb)
{
    struct kern_block_q8_1 *b = dst;
    for (int64_t i = 0; i < nb; i++, x += KERN_QK) {
        float d = abs_max(x, KERN_QK, NULL) / 127, id = d != 0 ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < KERN_QK; j++) {
            b[i].qs[j] = (int8_t)roundf(x[j] * id);
            sum += b[i].qs[j];
        }
        b[i].d = wtype_f32_to_f16(d);
        b[i].s = wtype_f32_to_f16(sum * d);
    }
}

void kern__quant_q8_K(const float *x, void *dst, int64_t nb)
{
    struct kern_block_q8_K *b = dst;
    for (int64_t i = 0; i < nb; i++, x += KERN_QK_K) {
        float max;
        if (abs_max(x, KERN_QK_K, &max) == 0) {
            memset(&b[i], 0, sizeof b[i]);
            continue;
        }
        float iscale = -127.0f / max;
        for (int j = 0; j < KERN_QK_K; j++)
            b[i].qs[j] = (int8_t)MINI(127, kern__nearest_int(iscale * x[j]));
        for (int j = 0; j < KERN_QK_K / 16; j++) {
            int s = 0;
            for (int l = 0; l < 16; l++)
                s += b[i].qs[16 * j + l];
            b[i].bsums[j] = (int16_t)s;
        }
        b[i].d = 1 / iscale;
    }
}

/* Weighted search for the scale and min of an asymmetric block (ggml's make_qkx2_quants):
 * try a few scales around nmax/(max-min), fit scale and min by weighted least squares for
 * each assignment, keep the one with the least weighted squared error. */
static float fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L,
                           float *the_min, float rmin, float rdelta, int nstep)
{
    uint8_t Laux[32];
    float min = x[0], max = x[0], sum_w = w[0], sum_x = w[0] * x[0];
    for (int i = 1; i < n; i++) {
        min = x[i] < min ? x[i] : min;
        max = x[i] > max ? x[i] : max;
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0)
        min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0;
    }
    float iscale = nmax / (max - min), scale = 1 / iscale, best = 0;
    for (int i = 0; i < n; i++) {
        int l = kern__nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)MAXI(0, MINI(nmax, l));
        float diff = scale * L[i] + min - x[i];
        best += w[i] * diff * diff;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = MAXI(0, MINI(nmax, kern__nearest_int(iscale * (x[i] - min))));
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float err = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                err += w[i] * diff * diff;
            }
            if (err < best) {
                memcpy(L, Laux, (size_t)n);
                best = err;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* Symmetric scale search (ggml's make_qx_quants with x^2 weights, rmse_type 1). */
static float fit_scale_sym(int n, int nmax, const float *x, int8_t *L)
{
    float max = 0, amax = abs_max(x, n, &max);
    if (amax < 1e-15f) {
        memset(L, 0, (size_t)n);
        return 0;
    }
    float iscale = -nmax / max, sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = MAXI(-nmax, MINI(nmax - 1, kern__nearest_int(iscale * x[i])));
        L[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 != 0 ? sumlx / suml2 : 0, best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0)
            continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = MAXI(-nmax, MINI(nmax - 1, kern__nearest_int(iscale * x[i])));
            float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) {
                int l = kern__nearest_int(iscale * x[i]);
                L[i] = (int8_t)(nmax + MAXI(-nmax, MINI(nmax - 1, l)));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Shared by Q4_K and Q5_K: per sub-block scales/mins, packed 6-bit, then the final levels
 * L (0..nmax) recomputed from the rounded scales. */
static void q_k_scales(const float *x, int nmax, float rmin, int nstep, uint8_t *scales_out,
                       uint16_t *d_out, uint16_t *dmin_out, uint8_t *L)
{
    float mins[8], scales[8], weights[32], max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        const float *xs = x + 32 * j;
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++)
            sum_x2 += xs[l] * xs[l];
        float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++)
            weights[l] = av_x + fabsf(xs[l]);
        scales[j] = fit_scale_min(32, nmax, xs, weights, L + 32 * j, &mins[j], rmin, 0.1f, nstep);
        max_scale = scales[j] > max_scale ? scales[j] : max_scale;
        max_min = mins[j] > max_min ? mins[j] : max_min;
    }
    float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    memset(scales_out, 0, 12);
    for (int j = 0; j < 8; j++) {
        int ls = MINI(63, kern__nearest_int(inv_scale * scales[j]));
        int lm = MINI(63, kern__nearest_int(inv_min * mins[j]));
        if (j < 4) {
            scales_out[j] = (uint8_t)ls;
            scales_out[j + 4] = (uint8_t)lm;
        } else {
            scales_out[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
            scales_out[j - 4] |= (uint8_t)((ls >> 4) << 6);
            scales_out[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    *d_out = wtype_f32_to_f16(max_scale / 63.0f);
    *dmin_out = wtype_f32_to_f16(max_min / 63.0f);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        kern__scale_min_k4(j, scales_out, &sc, &m);
        float d = kern__h2f(*d_out) * sc;
        if (d == 0)
            continue;
        float dm = kern__h2f(*dmin_out) * m;
        for (int l = 0; l < 32; l++) {
            int q = kern__nearest_int((x[32 * j + l] + dm) / d);
            L[32 * j + l] = (uint8_t)MAXI(0, MINI(nmax, q));
        }
    }
}

void kern__quant_q4_K(const float *x, void *dst, int64_t nb)
{
    struct kern_block_q4_K *b = dst;
    uint8_t L[KERN_QK_K];
    for (int64_t i = 0; i < nb; i++, x += KERN_QK_K) {
        q_k_scales(x, 15, -1.0f, 20, b[i].scales, &b[i].d, &b[i].dmin, L);
        uint8_t *q = b[i].qs;
        for (int j = 0; j < KERN_QK_K; j += 64, q += 32)
            for (int l = 0; l < 32; l++)
                q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
    }
}

void kern__quant_q5_K(const float *x, void *dst, int64_t nb)
{
    struct kern_block_q5_K *b = dst;
    uint8_t L[KERN_QK_K];
    for (int64_t i = 0; i < nb; i++, x += KERN_QK_K) {
        q_k_scales(x, 31, -0.5f, 15, b[i].scales, &b[i].d, &b[i].dmin, L);
        memset(b[i].qh, 0, sizeof b[i].qh);
        uint8_t *q = b[i].qs, m1 = 1, m2 = 2;
        for (int n = 0; n < KERN_QK_K; n += 64, q += 32, m1 <<= 2, m2 <<= 2) {
            for (int j = 0; j < 32; j++) {
                int l1 = L[n + j], l2 = L[n + j + 32];
                if (l1 > 15) {
                    l1 -= 16;
                    b[i].qh[j] |= m1;
                }
                if (l2 > 15) {
                    l2 -= 16;
                    b[i].qh[j] |= m2;
                }
                q[j] = (uint8_t)(l1 | (l2 << 4));
            }
        }
    }
}

void kern__quant_q6_K(const float *x, void *dst, int64_t nb)
{
    struct kern_block_q6_K *b = dst;
    int8_t L[KERN_QK_K];
    float scales[16];
    for (int64_t i = 0; i < nb; i++, x += KERN_QK_K) {
        float max_scale = 0, max_abs = 0;
        for (int ib = 0; ib < 16; ib++) {
            scales[ib] = fit_scale_sym(16, 32, x + 16 * ib, L + 16 * ib);
            if (fabsf(scales[ib]) > max_abs) {
                max_abs = fabsf(scales[ib]);
                max_scale = scales[ib];
            }
        }
        if (max_abs < 1e-15f) {
            memset(&b[i], 0, sizeof b[i]);
            continue;
        }
        float iscale = -128.0f / max_scale;
        b[i].d = wtype_f32_to_f16(1 / iscale);
        for (int ib = 0; ib < 16; ib++)
            b[i].scales[ib] = (int8_t)MINI(127, kern__nearest_int(iscale * scales[ib]));
        for (int j = 0; j < 16; j++) {
            float d = kern__h2f(b[i].d) * b[i].scales[j];
            if (d == 0)
                continue;
            for (int l = 0; l < 16; l++) {
                int q = kern__nearest_int(x[16 * j + l] / d);
                L[16 * j + l] = (int8_t)(MAXI(-32, MINI(31, q)) + 32);
            }
        }
        uint8_t *ql = b[i].ql, *qh = b[i].qh;
        for (int j = 0; j < KERN_QK_K; j += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; l++) {
                int q1 = L[j + l] & 0xF, q2 = L[j + l + 32] & 0xF;
                int q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
                ql[l] = (uint8_t)(q1 | (q3 << 4));
                ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
                qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
                                  ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
            }
        }
    }
}

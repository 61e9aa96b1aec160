/* The scalar reference kernels: conversions, hand-built blocks, quantisation error bounds,
 * matmul against an independent dequantise-then-dot, and the ops' defining properties. */
#include <errno.h>

#include "kernels/internal.h"
#include "tests/lib/kern_util.h"
#include "tests/lib/t.h"

static const uint32_t weight_types[] = {
    KERN_T_F32, KERN_T_F16, KERN_T_BF16, KERN_T_Q8_0, KERN_T_Q4_0, KERN_T_Q4_1,
    KERN_T_Q5_0, KERN_T_Q5_1, KERN_T_Q4_K, KERN_T_Q5_K, KERN_T_Q6_K,
};
#define N_WT (sizeof weight_types / sizeof weight_types[0])

static float bits_f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

T_CASE(traits)
{
    T_CHECK(kern_block_bytes(KERN_T_Q4_0) == 18 && kern_block_elems(KERN_T_Q4_0) == 32, "q4_0");
    T_CHECK(kern_block_bytes(KERN_T_Q6_K) == 210 && kern_block_elems(KERN_T_Q6_K) == 256, "q6_K");
    T_CHECK(kern_row_bytes(KERN_T_Q4_K, 2048) == 8 * 144, "q4_K row");
    T_CHECK(kern_row_bytes(KERN_T_Q4_0, 33) == 0, "not a block multiple");
    T_CHECK(kern_row_bytes(KERN_T_F16, 7) == 14, "f16 row");
    T_CHECK(kern_row_bytes(4, 32) == 0, "type 4 unknown");
    T_CHECK(kern_row_bytes(KERN_T_F32, INT64_MAX) == 0 || sizeof(size_t) > 8,
            "overflowing row size must be refused");
    for (size_t i = 0; i < N_WT; i++)
        T_CHECK(kern_type_supported(weight_types[i]), "%s supported", kern_type_name(weight_types[i]));
    T_CHECK(!kern_type_supported(KERN_T_Q2_K) && !kern_type_supported(KERN_T_Q8_K) &&
            !kern_type_supported(99), "unsupported types");
    T_CHECK(!strcmp(kern_type_name(KERN_T_Q4_K), "q4_K") && !strcmp(kern_type_name(KERN_T_BF16), "bf16"),
            "ggml's names");
    T_CHECK(kern_type_name(16) == NULL && kern_row_bytes(16, 256) == 0 && wtype_info(16),
            "a type the file format knows and the kernels do not");
    /* The block layouts here against the weight-type table's sizes. */
    static const struct { uint32_t t; size_t size; } blocks[] = {
        {KERN_T_Q4_0, sizeof(struct kern_block_q4_0)}, {KERN_T_Q4_1, sizeof(struct kern_block_q4_1)},
        {KERN_T_Q5_0, sizeof(struct kern_block_q5_0)}, {KERN_T_Q5_1, sizeof(struct kern_block_q5_1)},
        {KERN_T_Q8_0, sizeof(struct kern_block_q8_0)}, {KERN_T_Q8_1, sizeof(struct kern_block_q8_1)},
        {KERN_T_Q2_K, sizeof(struct kern_block_q2_K)}, {KERN_T_Q3_K, sizeof(struct kern_block_q3_K)},
        {KERN_T_Q4_K, sizeof(struct kern_block_q4_K)}, {KERN_T_Q5_K, sizeof(struct kern_block_q5_K)},
        {KERN_T_Q6_K, sizeof(struct kern_block_q6_K)}, {KERN_T_Q8_K, sizeof(struct kern_block_q8_K)},
    };
    for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++)
        T_CHECK(kern_block_bytes(blocks[i].t) == blocks[i].size, "%s: %u bytes in wtype, block struct %zu",
                kern_type_name(blocks[i].t), kern_block_bytes(blocks[i].t), blocks[i].size);
}

T_CASE(f16_conversion)
{
    T_CHECK(wtype_f32_to_f16(1.0f) == 0x3c00, "1.0");
    T_CHECK(wtype_f32_to_f16(-2.0f) == 0xc000, "-2.0");
    T_CHECK(wtype_f32_to_f16(65504.0f) == 0x7bff, "max");
    T_CHECK(wtype_f32_to_f16(65519.0f) == 0x7bff, "just below the inf threshold");
    T_CHECK(wtype_f32_to_f16(65520.0f) == 0x7c00, "rounds to inf");
    T_CHECK(wtype_f32_to_f16(INFINITY) == 0x7c00 && wtype_f32_to_f16(-INFINITY) == 0xfc00, "inf");
    T_CHECK((wtype_f32_to_f16(NAN) & 0x7c00) == 0x7c00 && (wtype_f32_to_f16(NAN) & 0x3ff), "nan");
    T_CHECK(wtype_f32_to_f16(ldexpf(1, -24)) == 0x0001, "smallest subnormal");
    T_CHECK(wtype_f32_to_f16(ldexpf(1, -25)) == 0x0000, "half of it ties to even zero");
    T_CHECK(wtype_f32_to_f16(ldexpf(1.5f, -25)) == 0x0001, "above the tie");
    T_CHECK(wtype_f32_to_f16(ldexpf(3, -25)) == 0x0002, "1.5 units ties to even 2");
    T_CHECK(wtype_f32_to_f16(1.0f + ldexpf(1, -11)) == 0x3c00, "tie to even down");
    T_CHECK(wtype_f32_to_f16(1.0f + ldexpf(3, -11)) == 0x3c02, "tie to even up");
    T_CHECK(wtype_f32_to_f16(ldexpf(1023, -24) + ldexpf(1, -25)) == 0x0400, "subnormal to normal");
    /* Every finite half converts to f32 and back unchanged. */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff))
            continue;
        if (wtype_f32_to_f16(wtype_f16_to_f32((uint16_t)h)) != h)
            bad++;
    }
    T_CHECK(bad == 0, "%d halves do not round-trip", bad);
    T_CHECK(wtype_f16_to_f32(0x0001) == ldexpf(1, -24) && wtype_f16_to_f32(0x3555) == 0x1.554p-2f,
            "decode");
    /* Rounding picks the nearest representable half for random floats of every magnitude. */
    ku_seed(1);
    bad = 0;
    for (int i = 0; i < 200000; i++) {
        float f = ldexpf(ku_unif() * 2 - 1, (int)(ku_u32() % 44) - 28);
        uint16_t h = wtype_f32_to_f16(f);
        double e = fabs((double)f - wtype_f16_to_f32(h));
        for (int dlt = -1; dlt <= 1; dlt += 2) {
            uint16_t g = (uint16_t)(h + dlt);
            if ((g & 0x7c00) == 0x7c00 || ((g ^ h) & 0x8000))
                continue;
            if (fabs((double)f - wtype_f16_to_f32(g)) < e)
                bad++;
        }
    }
    T_CHECK(bad == 0, "%d conversions not to the nearest half", bad);
}

T_CASE(bf16_conversion)
{
    T_CHECK(wtype_f32_to_bf16(1.0f) == 0x3f80, "1.0");
    T_CHECK(wtype_f32_to_bf16(bits_f(0x3f808000)) == 0x3f80, "tie to even down");
    T_CHECK(wtype_f32_to_bf16(bits_f(0x3f818000)) == 0x3f82, "tie to even up");
    T_CHECK(wtype_f32_to_bf16(bits_f(0x3f808001)) == 0x3f81, "above tie");
    T_CHECK(wtype_bf16_to_f32(0xc040) == -3.0f, "decode");
    uint16_t n = wtype_f32_to_bf16(NAN);
    T_CHECK((n & 0x7f80) == 0x7f80 && (n & 0x7f), "nan stays nan");
}

/* Hand-built blocks with values worked out from the documented layouts. */
T_CASE(dequant_known_q4_q5_q8)
{
    float y[32];
    struct kern_block_q4_0 b40 = {.d = 0x3800}; /* 0.5 */
    for (int j = 0; j < 16; j++)
        b40.qs[j] = (uint8_t)(j | ((15 - j) << 4));
    kern_ref_dequant_row(KERN_T_Q4_0, &b40, y, 32);
    int bad = 0;
    for (int j = 0; j < 16; j++)
        bad += y[j] != (j - 8) * 0.5f || y[j + 16] != (7 - j) * 0.5f;
    T_CHECK(bad == 0, "q4_0: %d wrong", bad);

    struct kern_block_q4_1 b41 = {.d = 0x3c00, .m = 0xc000}; /* 1, -2 */
    for (int j = 0; j < 16; j++)
        b41.qs[j] = (uint8_t)(j | (3 << 4));
    kern_ref_dequant_row(KERN_T_Q4_1, &b41, y, 32);
    bad = 0;
    for (int j = 0; j < 16; j++)
        bad += y[j] != j - 2.0f || y[j + 16] != 1.0f;
    T_CHECK(bad == 0, "q4_1: %d wrong", bad);

    /* Q5_0: high bits of element j in bit j of qh (little-endian u32), of j+16 in bit j+16. */
    struct kern_block_q5_0 b50 = {.d = 0x4000}; /* 2 */
    for (int j = 0; j < 16; j++)
        b50.qs[j] = (uint8_t)(j | ((15 - j) << 4));
    b50.qh[0] = 0x05; /* elements 0 and 2 get +16 */
    b50.qh[2] = 0x02; /* element 17 gets +16 */
    kern_ref_dequant_row(KERN_T_Q5_0, &b50, y, 32);
    T_CHECK(y[0] == 0.0f && y[1] == -30.0f && y[2] == 4.0f && y[3] == -26.0f, "q5_0 low half");
    T_CHECK(y[16] == -2.0f && y[17] == 28.0f && y[31] == -32.0f, "q5_0 high half %g %g %g",
            y[16], y[17], y[31]);

    struct kern_block_q5_1 b51 = {.d = 0x3c00, .m = 0x3c00}; /* 1, 1 */
    memset(b51.qh, 0xff, 4);
    kern_ref_dequant_row(KERN_T_Q5_1, &b51, y, 32);
    bad = 0;
    for (int j = 0; j < 32; j++)
        bad += y[j] != 17.0f;
    T_CHECK(bad == 0, "q5_1 all high bits: %d wrong", bad);

    struct kern_block_q8_0 b80 = {.d = 0x3400}; /* 0.25 */
    for (int j = 0; j < 32; j++)
        b80.qs[j] = (int8_t)(j * 8 - 128);
    kern_ref_dequant_row(KERN_T_Q8_0, &b80, y, 32);
    bad = 0;
    for (int j = 0; j < 32; j++)
        bad += y[j] != (j * 8 - 128) * 0.25f;
    T_CHECK(bad == 0, "q8_0: %d wrong", bad);
    T_CHECK(kern_ref_dequant_row(KERN_T_Q8_0, &b80, y, 31) == -EINVAL, "partial block refused");
    T_CHECK(kern_ref_dequant_row(KERN_T_Q2_K, &b80, y, 256) == -ENOTSUP, "q2_K not supported");
}

T_CASE(dequant_known_k)
{
    float y[256];
    /* Q4_K: sub-block j has scale sc[j] and min mn[j]; 6-bit values split as the layout says:
     * j<4: low 6 bits of bytes j (scale) and j+4 (min); j>=4: low/high nibble of byte j+4,
     * top two bits in bits 6-7 of bytes j-4 (scale) and j (min). */
    const int sc[8] = {1, 2, 3, 63, 33, 17, 48, 5}, mn[8] = {0, 1, 40, 2, 3, 50, 7, 63};
    struct kern_block_q4_K k4 = {.d = 0x3800, .dmin = 0x3400}; /* 0.5, 0.25 */
    for (int j = 0; j < 4; j++) {
        k4.scales[j] = (uint8_t)sc[j];
        k4.scales[j + 4] = (uint8_t)mn[j];
    }
    for (int j = 4; j < 8; j++) {
        k4.scales[j + 4] = (uint8_t)((sc[j] & 15) | ((mn[j] & 15) << 4));
        k4.scales[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
        k4.scales[j] |= (uint8_t)((mn[j] >> 4) << 6);
    }
    /* qs byte l of chunk c (32 bytes) holds element 64c+l (low) and 64c+32+l (high). */
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++)
            k4.qs[32 * c + l] = (uint8_t)((l & 15) | ((15 - (l & 15)) << 4));
    kern_ref_dequant_row(KERN_T_Q4_K, &k4, y, 256);
    int bad = 0;
    for (int e = 0; e < 256; e++) {
        int sb = e / 32, l = e % 32, q = (e % 64) < 32 ? (l & 15) : 15 - (l & 15);
        float want = 0.5f * sc[sb] * q - 0.25f * mn[sb];
        bad += fabsf(y[e] - want) > 1e-6f;
    }
    T_CHECK(bad == 0, "q4_K: %d wrong", bad);

    /* Q5_K: same scales, fifth bit of element 64c+l in bit 2c of qh[l], of 64c+32+l in 2c+1. */
    struct kern_block_q5_K k5 = {.d = 0x3800, .dmin = 0x3400};
    memcpy(k5.scales, k4.scales, 12);
    memcpy(k5.qs, k4.qs, 128);
    for (int l = 0; l < 32; l++)
        k5.qh[l] = (uint8_t)(l % 2 ? 0xAA : 0x01);
    kern_ref_dequant_row(KERN_T_Q5_K, &k5, y, 256);
    bad = 0;
    for (int e = 0; e < 256; e++) {
        int c = e / 64, hi = (e % 64) >= 32, l = e % 32, sb = e / 32;
        int q = hi ? 15 - (l & 15) : (l & 15);
        int bit = 2 * c + hi, h = ((l % 2 ? 0xAA : 0x01) >> bit) & 1;
        float want = 0.5f * sc[sb] * (q + 16 * h) - 0.25f * mn[sb];
        bad += fabsf(y[e] - want) > 1e-6f;
    }
    T_CHECK(bad == 0, "q5_K: %d wrong", bad);

    /* Q6_K: element 128h + 32k + l: low nibble from ql[64h + l + 32*(k&1)] (k<2 low nibble,
     * k>=2 high), two high bits from qh[32h + l] bits 2k..2k+1; scale index 8h + 2k + l/16. */
    struct kern_block_q6_K k6 = {.d = 0x3c00};
    for (int i = 0; i < 16; i++)
        k6.scales[i] = (int8_t)(i - 8);
    for (int i = 0; i < 128; i++)
        k6.ql[i] = (uint8_t)(i * 37);
    for (int i = 0; i < 64; i++)
        k6.qh[i] = (uint8_t)(i * 91 + 3);
    kern_ref_dequant_row(KERN_T_Q6_K, &k6, y, 256);
    bad = 0;
    for (int e = 0; e < 256; e++) {
        int h = e / 128, k = (e % 128) / 32, l = e % 32;
        int byte = k6.ql[64 * h + l + 32 * (k & 1)];
        int lo = k < 2 ? byte & 15 : byte >> 4;
        int hb = (k6.qh[32 * h + l] >> (2 * k)) & 3;
        int q = (lo | (hb << 4)) - 32;
        float want = (float)k6.scales[8 * h + 2 * k + l / 16] * q;
        bad += y[e] != want;
    }
    T_CHECK(bad == 0, "q6_K: %d wrong", bad);
}

/* Quantise -> dequantise on gaussian data: normalised MSE within each type's budget, no
 * element off by more than the block's step allows, zero blocks stay zero. */
T_CASE(quant_roundtrip)
{
    const int64_t n = 4096;
    float *x = malloc(n * 4), *y = malloc(n * 4);
    void *q = malloc(kern_row_bytes(KERN_T_F32, n));
    ku_seed(2);
    ku_fill(x, n, 1.0f);
    /* Budgets about 1.5x what these quantisers reach on gaussian data. */
    struct { uint32_t t; double max_nmse; } cases[] = {
        {KERN_T_F32, 0}, {KERN_T_F16, 7e-8}, {KERN_T_BF16, 4.2e-6}, {KERN_T_Q8_0, 4e-5},
        {KERN_T_Q8_1, 4e-5}, {KERN_T_Q8_K, 6.5e-5}, {KERN_T_Q4_0, 1.05e-2}, {KERN_T_Q4_1, 9e-3},
        {KERN_T_Q5_0, 2.6e-3}, {KERN_T_Q5_1, 2.1e-3}, {KERN_T_Q4_K, 7.3e-3}, {KERN_T_Q5_K, 1.9e-3},
        {KERN_T_Q6_K, 4.5e-4},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        uint32_t t = cases[c].t;
        T_CHECK(kern_ref_quant_row(t, x, q, n) == 0, "%s quant", kern_type_name(t));
        T_CHECK(kern_ref_dequant_row(t, q, y, n) == 0, "%s dequant", kern_type_name(t));
        double e = t_nmse(y, x, n);
        fprintf(stderr, "  %-5s nmse %.3g\n", kern_type_name(t), e);
        T_CHECK(e <= cases[c].max_nmse, "%s: nmse %g > %g", kern_type_name(t), e, cases[c].max_nmse);
        /* A block of zeros quantises to exact zeros, never NaN. */
        float z[256] = {0}, zy[256];
        kern_ref_quant_row(t, z, q, 256);
        kern_ref_dequant_row(t, q, zy, 256);
        int nz = 0;
        for (int i = 0; i < 256; i++)
            nz += zy[i] != 0;
        T_CHECK(nz == 0, "%s: zero block gives %d non-zeros", kern_type_name(t), nz);
    }
    /* Symmetric 32-blocks: |error| within one step d (half a step plus the clamped edge). */
    struct kern_block_q4_0 *b4 = q;
    kern_ref_quant_row(KERN_T_Q4_0, x, q, n);
    kern_ref_dequant_row(KERN_T_Q4_0, q, y, n);
    int bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += fabsf(y[i] - x[i]) > fabsf(wtype_f16_to_f32(b4[i / 32].d)) * 1.01f;
    T_CHECK(bad == 0, "q4_0: %d elements off by more than a step", bad);
    struct kern_block_q8_0 *b8 = q;
    kern_ref_quant_row(KERN_T_Q8_0, x, q, n);
    kern_ref_dequant_row(KERN_T_Q8_0, q, y, n);
    bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += fabsf(y[i] - x[i]) > fabsf(wtype_f16_to_f32(b8[i / 32].d)) * 0.51f + 1e-3f * fabsf(x[i]);
    T_CHECK(bad == 0, "q8_0: %d elements off by more than half a step", bad);
    /* Q8_1's s is d times the sum of its quants; Q8_K's bsums are sums of 16 quants. */
    struct kern_block_q8_1 *b81 = q;
    kern_ref_quant_row(KERN_T_Q8_1, x, q, 64);
    int s = 0;
    for (int j = 0; j < 32; j++)
        s += b81[1].qs[j];
    T_CHECK(fabsf(wtype_f16_to_f32(b81[1].s) - s * wtype_f16_to_f32(b81[1].d)) <=
            fabsf(s * wtype_f16_to_f32(b81[1].d)) * 1e-3f + 1e-6f, "q8_1 s");
    struct kern_block_q8_K *bk = q;
    kern_ref_quant_row(KERN_T_Q8_K, x, q, 256);
    int bs = 0, qmax = 0;
    for (int j = 48; j < 64; j++)
        bs += bk->qs[j];
    for (int j = 0; j < 256; j++)
        qmax = abs(bk->qs[j]) > qmax ? abs(bk->qs[j]) : qmax;
    T_CHECK(bs == bk->bsums[3], "q8_K bsums[3] %d, sum %d", bk->bsums[3], bs);
    T_CHECK(qmax == 127, "q8_K uses the full range (%d)", qmax);
    free(x);
    free(y);
    free(q);
}

/* kern_ref_matmul equals dequantised weights dotted with the dequantised activation blocks
 * (computed here in double), and stays close to the exact f32 product. */
T_CASE(matmul_vs_dequant)
{
    const int64_t rows = 7, cols = 512, n = 3;
    float *w = malloc(rows * cols * 4), *x = malloc(n * cols * 4), *y = malloc(n * rows * 4);
    float *wd = malloc(rows * cols * 4), *xd = malloc(cols * 4);
    void *wq = malloc(rows * cols * 4), *xq = malloc(cols * 4 + 1024);
    double *want = malloc(n * rows * 8), *exact = malloc(n * rows * 8);
    ku_seed(3);
    ku_fill(w, rows * cols, 0.05f);
    ku_fill(x, n * cols, 1.0f);
    for (size_t c = 0; c < N_WT; c++) {
        uint32_t t = weight_types[c], vt = kern__type_traits(t)->vec_dot_type;
        size_t rb = kern_row_bytes(t, cols);
        for (int64_t r = 0; r < rows; r++) {
            kern_ref_quant_row(t, w + r * cols, (char *)wq + r * rb, cols);
            kern_ref_dequant_row(t, (char *)wq + r * rb, wd + r * cols, cols);
        }
        for (int64_t i = 0; i < n; i++) {
            kern_ref_quant_row(vt, x + i * cols, xq, cols);
            kern_ref_dequant_row(vt, xq, xd, cols);
            for (int64_t r = 0; r < rows; r++) {
                double s = 0, e = 0;
                for (int64_t k = 0; k < cols; k++) {
                    s += (double)wd[r * cols + k] * xd[k];
                    e += (double)wd[r * cols + k] * x[i * cols + k];
                }
                want[i * rows + r] = s;
                exact[i * rows + r] = e;
            }
        }
        T_CHECK(kern_ref_matmul(t, wq, rows, cols, x, n, y) == 0, "%s matmul", kern_type_name(t));
        double e1 = t_nmse(y, want, n * rows), e2 = t_nmse(y, exact, n * rows);
        /* The *_1 types take their min term from Q8_1's s, stored as f16: not exact. */
        double lim = vt == KERN_T_Q8_1 ? 2e-6 : 1e-11;
        T_CHECK(e1 < lim, "%s: nmse vs dequantised dot %g", kern_type_name(t), e1);
        T_CHECK(e2 < 1e-3, "%s: nmse vs exact activations %g", kern_type_name(t), e2);
    }
    T_CHECK(kern_ref_matmul(KERN_T_Q4_0, wq, rows, 100, x, n, y) == -EINVAL, "cols not a block multiple");
    T_CHECK(kern_ref_matmul(KERN_T_Q8_K, wq, rows, cols, x, n, y) == -EINVAL, "q8_K weights");
    free(w); free(x); free(y); free(wd); free(xd); free(wq); free(xq); free(want); free(exact);
}

T_CASE(norm_and_activations)
{
    float x[96], w[96], o[96];
    ku_seed(4);
    ku_fill(x, 96, 3.0f);
    for (int i = 0; i < 96; i++)
        w[i] = 1.0f;
    kern_ref_rmsnorm(o, x, w, 96, 0.0f);
    double ss = 0;
    for (int i = 0; i < 96; i++)
        ss += (double)o[i] * o[i];
    T_CHECK(fabs(ss / 96 - 1) < 1e-5, "rms after norm %g", ss / 96);
    for (int i = 0; i < 96; i++)
        w[i] = (float)i;
    float o2[96];
    kern_ref_rmsnorm(o2, x, w, 96, 0.0f);
    int bad = 0;
    for (int i = 0; i < 96; i++)
        bad += fabsf(o2[i] - o[i] * i) > 1e-5f * fabsf(o[i] * i) + 1e-7f;
    T_CHECK(bad == 0, "weights scale each element");

    float s[5] = {1, 2, 3, 4, 1000};
    kern_ref_softmax(s, 5);
    T_CHECK(fabsf(s[4] - 1) < 1e-6f && s[0] >= 0, "large logit dominates without overflow");
    float a[6] = {0.5f, -1, 2, 0, 3, -7}, b[6];
    for (int i = 0; i < 6; i++)
        b[i] = a[i] + 100;
    kern_ref_softmax(a, 6);
    kern_ref_softmax(b, 6);
    double sum = 0;
    for (int i = 0; i < 6; i++) {
        sum += a[i];
        T_CHECK(fabsf(a[i] - b[i]) < 1e-6f, "shift invariance at %d", i);
    }
    T_CHECK(fabs(sum - 1) < 1e-6, "sums to 1 (%g)", sum);
    T_CHECK(a[4] > a[2] && a[2] > a[0] && a[0] > a[3], "order kept");

    float v[4] = {0, 20, -20, 1};
    kern_ref_silu(v, 4);
    T_CHECK(v[0] == 0 && fabsf(v[1] - 20) < 1e-5f && fabsf(v[2]) < 1e-6f &&
            fabsf(v[3] - 0.7310586f) < 1e-6f, "silu values");
    float g[3] = {1, -2, 0.5f}, u[3] = {2, 3, -4}, out[3];
    kern_ref_swiglu(out, g, u, 3);
    for (int i = 0; i < 3; i++) {
        float want = g[i] / (1 + expf(-g[i])) * u[i];
        T_CHECK(fabsf(out[i] - want) < 1e-6f, "swiglu %d", i);
    }
}

static double dot_d(const float *a, const float *b, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

T_CASE(rope_properties)
{
    enum { HD = 64, NH = 2 };
    float q[NH * HD], k[NH * HD], q0[NH * HD];
    ku_seed(5);
    ku_fill(q0, NH * HD, 1.0f);
    for (int neox = 0; neox <= 1; neox++) {
        /* Position 0 is the identity. */
        memcpy(q, q0, sizeof q);
        kern_ref_rope(q, NH, HD, HD, 0, 10000, 1, neox);
        T_CHECK(memcmp(q, q0, sizeof q) == 0, "neox=%d pos 0 identity", neox);
        /* Rotation keeps each pair's norm. */
        memcpy(q, q0, sizeof q);
        kern_ref_rope(q, NH, HD, HD, 1234, 10000, 1, neox);
        int bad = 0;
        for (int i = 0; i < HD / 2; i++) {
            int a = neox ? i : 2 * i, b = neox ? i + HD / 2 : 2 * i + 1;
            float n0 = q0[a] * q0[a] + q0[b] * q0[b], n1 = q[a] * q[a] + q[b] * q[b];
            bad += fabsf(n0 - n1) > 1e-4f * n0 + 1e-6f;
        }
        T_CHECK(bad == 0, "neox=%d pair norms changed (%d)", neox, bad);
        /* q.k after rotation depends only on the distance. */
        ku_fill(k, NH * HD, 1.0f);
        float qa[HD], ka[HD], qb[HD], kb[HD];
        memcpy(qa, q0, sizeof qa); memcpy(ka, k, sizeof ka);
        memcpy(qb, q0, sizeof qb); memcpy(kb, k, sizeof kb);
        kern_ref_rope(qa, 1, HD, HD, 10, 10000, 1, neox);
        kern_ref_rope(ka, 1, HD, HD, 3, 10000, 1, neox);
        kern_ref_rope(qb, 1, HD, HD, 27, 10000, 1, neox);
        kern_ref_rope(kb, 1, HD, HD, 20, 10000, 1, neox);
        double da = dot_d(qa, ka, HD), db = dot_d(qb, kb, HD);
        T_CHECK(fabs(da - db) < 1e-4 * (fabs(da) + 1), "neox=%d relative position %g vs %g",
                neox, da, db);
        /* freq_scale s at position p equals scale 1 at position p*s. */
        memcpy(qa, q0, sizeof qa); memcpy(qb, q0, sizeof qb);
        kern_ref_rope(qa, 1, HD, HD, 40, 10000, 0.25f, neox);
        kern_ref_rope(qb, 1, HD, HD, 10, 10000, 1, neox);
        bad = 0;
        for (int i = 0; i < HD; i++)
            bad += fabsf(qa[i] - qb[i]) > 1e-5f;
        T_CHECK(bad == 0, "neox=%d freq_scale", neox);
        /* Partial rotation leaves the tail alone; the second head rotates like the first. */
        memcpy(q, q0, sizeof q);
        memcpy(q + HD, q0, HD * 4);
        kern_ref_rope(q, NH, HD, 32, 77, 500000, 1, neox);
        T_CHECK(memcmp(q + 32, q0 + 32, 32 * 4) == 0, "neox=%d n_rot tail untouched", neox);
        T_CHECK(memcmp(q, q + HD, HD * 4) == 0, "neox=%d heads rotate alike", neox);
    }
    /* Known angle: normal layout, first pair rotates by pos radians, second by pos*base^(-2/n). */
    float r[4] = {1, 0, 1, 0};
    kern_ref_rope(r, 1, 4, 4, 1, 100, 1, false);
    T_CHECK(fabsf(r[0] - cosf(1)) < 1e-6f && fabsf(r[1] - sinf(1)) < 1e-6f, "pair 0 angle");
    T_CHECK(fabsf(r[2] - cosf(0.1f)) < 1e-6f && fabsf(r[3] - sinf(0.1f)) < 1e-6f, "pair 1 angle");
    /* NeoX pairs (i, i + n_rot/2). */
    float nx[4] = {1, 1, 0, 0};
    kern_ref_rope(nx, 1, 4, 4, 1, 100, 1, true);
    T_CHECK(fabsf(nx[0] - cosf(1)) < 1e-6f && fabsf(nx[2] - sinf(1)) < 1e-6f &&
            fabsf(nx[1] - cosf(0.1f)) < 1e-6f && fabsf(nx[3] - sinf(0.1f)) < 1e-6f, "neox angles");
}

/* Attention against a direct double-precision evaluation of the formula in this file. */
static void naive_attention(double *out, const float *q, const float *k, const float *v,
                            int64_t n, int64_t pos0, int nh, int nkv, int hd, size_t stride,
                            float scale)
{
    double sc[512];
    for (int64_t i = 0; i < n; i++)
        for (int h = 0; h < nh; h++) {
            int kh = h / (nh / nkv);
            int64_t m = pos0 + i + 1;
            double mx = -INFINITY, sum = 0;
            for (int64_t p = 0; p < m; p++) {
                sc[p] = scale * dot_d(q + (i * nh + h) * hd, k + p * stride + kh * hd, hd);
                mx = sc[p] > mx ? sc[p] : mx;
            }
            for (int64_t p = 0; p < m; p++)
                sum += sc[p] = exp(sc[p] - mx);
            for (int d = 0; d < hd; d++) {
                double s = 0;
                for (int64_t p = 0; p < m; p++)
                    s += sc[p] / sum * v[p * stride + kh * hd + d];
                out[(i * nh + h) * hd + d] = s;
            }
        }
}

T_CASE(attention)
{
    enum { NH = 8, NKV = 2, HD = 32, CTX = 40 };
    const size_t stride = NKV * HD + 8; /* padded rows */
    float *k = malloc(CTX * stride * 4), *v = malloc(CTX * stride * 4);
    uint16_t *k16 = malloc(CTX * stride * 2), *v16 = malloc(CTX * stride * 2);
    float *q = malloc(CTX * NH * HD * 4), *o = malloc(CTX * NH * HD * 4), scratch[CTX];
    double *want = malloc(CTX * NH * HD * 8);
    float *kr = malloc(CTX * stride * 4), *vr = malloc(CTX * stride * 4);
    ku_seed(6);
    ku_fill(k, CTX * stride, 1.0f);
    ku_fill(v, CTX * stride, 1.0f);
    ku_fill(q, CTX * NH * HD, 1.0f);
    float scale = 1.0f / sqrtf(HD);
    const int64_t pos0 = 30, n = 10;
    naive_attention(want, q, k, v, n, pos0, NH, NKV, HD, stride, scale);
    kern_ref_attention(KERN_T_F32, o, q, k, v, n, pos0, NH, NKV, HD, stride, scale, scratch);
    double e = t_nmse(o, want, n * NH * HD);
    T_CHECK(e < 1e-12, "f32 cache nmse %g", e);
    /* F16 cache: the same formula over the rounded cache, within f16 rounding of q and p. */
    for (size_t i = 0; i < CTX * stride; i++) {
        k16[i] = wtype_f32_to_f16(k[i]);
        v16[i] = wtype_f32_to_f16(v[i]);
        kr[i] = wtype_f16_to_f32(k16[i]);
        vr[i] = wtype_f16_to_f32(v16[i]);
    }
    naive_attention(want, q, kr, vr, n, pos0, NH, NKV, HD, stride, scale);
    kern_ref_attention(KERN_T_F16, o, q, k16, v16, n, pos0, NH, NKV, HD, stride, scale, scratch);
    e = t_nmse(o, want, n * NH * HD);
    T_CHECK(e < 1e-5 && e > 0, "f16 cache nmse %g (rounded q and weights)", e);
    /* A batch equals the rows one at a time. */
    float *o1 = malloc(NH * HD * 4);
    kern_ref_attention(KERN_T_F32, o, q, k, v, n, pos0, NH, NKV, HD, stride, scale, scratch);
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        kern_ref_attention(KERN_T_F32, o1, q + i * NH * HD, k, v, 1, pos0 + i, NH, NKV, HD,
                           stride, scale, scratch);
        bad += memcmp(o1, o + i * NH * HD, NH * HD * 4) != 0;
    }
    T_CHECK(bad == 0, "%d batch rows differ from single-row calls", bad);
    /* Position 0 attends only to itself: the output is v[0] of the head's KV group. */
    kern_ref_attention(KERN_T_F32, o1, q, k, v, 1, 0, NH, NKV, HD, stride, scale, scratch);
    bad = 0;
    for (int h = 0; h < NH; h++)
        bad += memcmp(o1 + h * HD, v + (h / (NH / NKV)) * HD, HD * 4) != 0;
    T_CHECK(bad == 0, "pos 0 output is v0 (%d heads wrong)", bad);
    free(k); free(v); free(k16); free(v16); free(q); free(o); free(want); free(kr); free(vr);
    free(o1);
}

/* The forward pass's other ops against values worked by hand. */
T_CASE(layer_ops)
{
    /* RoPE tables: pair i of position p turns by p * base^(-2i/n_rot) / div[i] */
    float cs[4], sn[4], div[2] = {2, 1};
    kern_ref_rope_angles(cs, sn, 2, 1, 4, 100, 1, NULL);
    T_CHECK(fabsf(cs[0] - cosf(1)) < 1e-6f && fabsf(sn[1] - sinf(0.1f)) < 1e-6f &&
            fabsf(cs[2] - cosf(2)) < 1e-6f && fabsf(sn[3] - sinf(0.2f)) < 1e-6f, "angles");
    kern_ref_rope_angles(cs, sn, 1, 1, 4, 100, 1, div);
    T_CHECK(fabsf(cs[0] - cosf(0.5f)) < 1e-6f && fabsf(sn[1] - sinf(0.1f)) < 1e-6f, "freq_div");
    /* tables + rows give kern_ref_rope, bit for bit, for both layouts and partial rotation */
    enum { HD = 64, NH = 3 };
    float x[2 * NH * HD + 8], y[NH * HD], c2[2 * 24], s2[2 * 24];
    for (int neox = 0; neox <= 1; neox++) {
        ku_seed(50);
        ku_fill(x, 2 * NH * HD + 8, 1.0f);
        memcpy(y, x + NH * HD + 8, sizeof y);
        kern_ref_rope_angles(c2, s2, 2, 41, 48, 10000, 0.5f, NULL);
        kern_ref_rope_rows(x, 2, NH * HD + 8, NH, HD, 48, c2, s2, neox);
        kern_ref_rope(y, NH, HD, 48, 42, 10000, 0.5f, neox);
        T_CHECK(memcmp(x + NH * HD + 8, y, sizeof y) == 0, "rope rows = kern_ref_rope, neox=%d", neox);
    }
    /* KV store: F16 rounding, F32 copy, cache rows stride apart (the padding untouched) */
    float kv[4] = {1, 0.5f, -2, 1.0009765625f + 0.00048828125f}; /* the last: a tie, to even */
    uint16_t h[2 * 3] = {7, 7, 7, 7, 7, 7};
    kern_ref_kv_store(KERN_T_F16, h, 3, kv, 2, 2);
    T_CHECK(h[0] == 0x3C00 && h[1] == 0x3800 && h[2] == 7 && h[3] == 0xC000 && h[4] == 0x3C02 &&
            h[5] == 7, "f16 store %04x %04x %04x %04x", h[0], h[1], h[3], h[4]);
    float f[5] = {9, 9, 9, 9, 9};
    kern_ref_kv_store(KERN_T_F32, f, 3, kv, 2, 2);
    T_CHECK(f[0] == 1 && f[1] == 0.5f && f[2] == 9 && f[3] == -2 && f[4] == kv[3], "f32 store");
    /* adds and gates */
    float r[6] = {1, 2, 3, 4, 5, 6}, b[3] = {10, 20, 30}, w2[2] = {2, -1};
    kern_ref_add_rows(r, b, 2, 3);
    T_CHECK(r[0] == 11 && r[2] == 33 && r[3] == 14 && r[5] == 36, "add_rows");
    kern_ref_add(r, r + 3, 3);
    T_CHECK(r[0] == 25 && r[1] == 47 && r[2] == 69, "add");
    float acc[6] = {0};
    uint32_t idx[2] = {1, 0};
    kern_ref_axpy_rows(acc, w2, b, idx, 1, 3);             /* row 1 += 2 b */
    kern_ref_axpy_rows(acc, w2 + 1, b, NULL, 1, 3);        /* row 0 -= b */
    T_CHECK(acc[0] == -10 && acc[2] == -30 && acc[3] == 20 && acc[5] == 60, "axpy_rows");
    float g[3] = {0, 100, -100}, m[3] = {4, 4, 4};
    kern_ref_mul_sigmoid(m, g, 3);
    T_CHECK(m[0] == 2 && m[1] == 4 && m[2] < 1e-30f, "mul_sigmoid");
    kern_ref_sigmoid(g, 3);
    T_CHECK(g[0] == 0.5f && g[1] == 1 && g[2] < 1e-30f, "sigmoid");
    /* norms: (3, 4) / 5; a zero vector stays zero (eps); RMS 1 times w times silu(z) */
    float l[4] = {3, 4, 0, 0};
    kern_ref_l2norm(l, 2, 2, 1, 2, 1e-6f);
    T_CHECK(fabsf(l[0] - 0.6f) < 1e-7f && fabsf(l[1] - 0.8f) < 1e-7f && l[2] == 0 && l[3] == 0,
            "l2norm");
    float rx[2] = {1, -1}, rw[2] = {1, 2}, rz[2] = {0, 20}, ro[2];
    kern_ref_rmsnorm_silu(ro, rx, rw, rz, 1, 2, 0);
    T_CHECK(ro[0] == 0 && fabsf(ro[1] + 2 * 20 / (1 + expf(-20))) < 1e-5f, "rmsnorm_silu %g %g",
            ro[0], ro[1]);
    /* causal conv, kernel 2: out[t] = silu(0.5 x[t] + x[t+1]) */
    float cx[3] = {1, 2, 3}, cw[2] = {0.5f, 1}, co[2];
    kern_ref_conv_silu(co, cx, cw, 2, 1, 2);
    T_CHECK(fabsf(co[0] - 2.5f / (1 + expf(-2.5f))) < 1e-6f &&
            fabsf(co[1] - 4 / (1 + expf(-4.0f))) < 1e-6f, "conv_silu");
    /* router: p = (1, 2, 3, 1)/7, the best two renormalised: 3/5, 2/5; ties to the lower id */
    float lg[7] = {0, logf(2), logf(3), 0, 1, 1, 0};
    uint32_t sel[3];
    float sw[3];
    kern_ref_moe_route(sel, sw, lg, 1, 4, 2);
    T_CHECK(sel[0] == 2 && sel[1] == 1 && fabsf(sw[0] - 0.6f) < 1e-6f &&
            fabsf(sw[1] - 0.4f) < 1e-6f, "route %u %u %g %g", sel[0], sel[1], sw[0], sw[1]);
    kern_ref_moe_route(sel + 2, sw + 2, lg + 4, 1, 3, 1);
    T_CHECK(sel[2] == 0 && sw[2] == 1, "route tie");
    /* DeltaNet, d = 1, q = k = 1, v = 2, beta = sigmoid(0) = 1/2, decay exp(-softplus(0)) =
     * 1/2: S = 0 -> delta 1, S 1, o 1; then S 1/2, kv 1/2, delta 3/4, S 5/4, o 5/4 */
    float qkv[6] = {1, 1, 2, 1, 1, 2}, beta[2] = {0, 0}, alpha[2] = {0, 0}, dtb = 0, a = -1;
    float S = 0, o[2], scr[2];
    kern_ref_deltanet(o, &S, qkv, qkv + 1, qkv + 2, 3, beta, alpha, &dtb, &a, 2, 1, 1, 1, scr);
    T_CHECK(fabsf(o[0] - 1) < 1e-6f && fabsf(o[1] - 1.25f) < 1e-6f && fabsf(S - 1.25f) < 1e-6f,
            "deltanet o %g %g S %g", o[0], o[1], S);
}

int main(int argc, char **argv)
{
    t_init(argc, argv);
    T_RUN(traits);
    T_RUN(f16_conversion);
    T_RUN(bf16_conversion);
    T_RUN(dequant_known_q4_q5_q8);
    T_RUN(dequant_known_k);
    T_RUN(quant_roundtrip);
    T_RUN(matmul_vs_dequant);
    T_RUN(norm_and_activations);
    T_RUN(rope_properties);
    T_RUN(attention);
    T_RUN(layer_ops);
    return T_DONE();
}

/* The fast CPU path against the reference: every SIMD level this CPU has, every weight type,
 * odd shapes (rows not a multiple of the threads, one row and batches, several blocks), 1-3
 * threads; batched rows bit-identical to rows alone; per-type dots and activation quantisers
 * on identical inputs; attention; the forward pass's layer ops (bit-identical); the pool and
 * its reserved scratch. */
#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>

#include "kernels/internal.h"
#include "tests/lib/kern_util.h"
#include "tests/lib/t.h"

static const uint32_t weight_types[] = {
    KERN_T_F32, KERN_T_F16, KERN_T_BF16, KERN_T_Q8_0, KERN_T_Q4_0, KERN_T_Q4_1,
    KERN_T_Q5_0, KERN_T_Q5_1, KERN_T_Q4_K, KERN_T_Q5_K, KERN_T_Q6_K,
};
#define N_WT (sizeof weight_types / sizeof weight_types[0])
static const char *levels[] = {"scalar", "avx2", "avx512", "neon", "neon-dotprod"};
#define N_LEVELS (sizeof levels / sizeof levels[0])

/* Activation rows quantised by the fast path may differ from the reference by one level in
 * rare ties (llama.cpp's x86 rounding); everything else is the same arithmetic. */
static double budget(uint32_t t)
{
    uint32_t vt = kern__type_traits(t)->vec_dot_type;
    return vt == KERN_T_Q8_0 || vt == KERN_T_Q8_1 ? 1e-7 : 1e-9;
}

/* The rows x cols matrix w quantised row by row into wq as type t (the reference
 * quantiser); false when cols is not a whole number of t's blocks. */
static bool quant_weights(uint32_t t, const float *w, int64_t rows, int64_t cols, void *wq)
{
    size_t rb = kern_row_bytes(t, cols);
    for (int64_t r = 0; rb && r < rows; r++)
        kern_ref_quant_row(t, w + r * cols, (char *)wq + r * rb, cols);
    return rb != 0;
}

T_CASE(matmul_all_levels)
{
    struct { int64_t rows, cols, n; } shapes[] = {
        {1, 256, 1}, {37, 512, 1}, {67, 768, 5}, {130, 256, 9}, {200, 512, 17}, {96, 1024, 4},
        {33, 96, 6}, {70, 224, 1}, /* odd block counts (K types skip these) */
        {11, 104, 9}, {7, 101, 5}, /* F32/F16/BF16 only: the dots' 8-wide and scalar tails */
    };
    struct kern_pool *pools[3];
    for (int nt = 1; nt <= 3; nt++) {
        int rc = kern_pool_new(&pools[nt - 1], nt); /* T_ASSERT evaluates its condition twice */
        T_ASSERT(rc == 0, "pool");
        rc = kern_pool_reserve(pools[nt - 1], 17 * 1024 * 4); /* every shape, any type */
        T_ASSERT(rc == 0, "reserve");
    }
    bool have[N_LEVELS];
    for (size_t lv = 0; lv < N_LEVELS; lv++) {
        have[lv] = kern__simd_force(levels[lv]) == 0;
        if (!have[lv])
            fprintf(stderr, "  level %s not available here\n", levels[lv]);
    }
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int64_t rows = shapes[si].rows, cols = shapes[si].cols, n = shapes[si].n;
        float *w = malloc(rows * cols * 4), *x = malloc(n * cols * 4);
        float *y = malloc(n * rows * 4), *yr = malloc(n * rows * 4), *y1 = malloc(n * rows * 4);
        void *wq = malloc(rows * cols * 4);
        ku_seed(100 + si);
        ku_fill(w, rows * cols, 0.1f);
        ku_fill(x, n * cols, 1.0f);
        for (size_t c = 0; c < N_WT; c++) {
            uint32_t t = weight_types[c];
            if (!quant_weights(t, w, rows, cols, wq))
                continue;
            kern_ref_matmul(t, wq, rows, cols, x, n, yr);
            for (size_t lv = 0; lv < N_LEVELS; lv++) {
                if (!have[lv])
                    continue;
                kern__simd_force(levels[lv]);
                for (int nt = 1; nt <= 3; nt++) {
                    for (int64_t i = 0; i < n * rows; i++)
                        y[i] = NAN;
                    int rc = kern_matmul(pools[nt - 1], t, wq, rows, cols, x, n, y);
                    double e = t_nmse(y, yr, n * rows);
                    T_CHECK(rc == 0 && e <= budget(t), "%s t=%u %d threads %lldx%lld n=%lld: nmse %g",
                            levels[lv], t, nt, (long long)rows, (long long)cols, (long long)n, e);
                    /* The thread count never changes a result (the ring relies on it). */
                    if (nt == 1)
                        memcpy(y1, y, n * rows * 4);
                    else
                        T_CHECK(memcmp(y1, y, n * rows * 4) == 0, "%s t=%u: %d threads differ from 1",
                                levels[lv], t, nt);
                }
            }
        }
        free(w); free(x); free(y); free(yr); free(y1); free(wq);
    }
    for (int nt = 1; nt <= 3; nt++)
        kern_pool_free(pools[nt - 1]);
    /* Without a pool, and refusing bad shapes. */
    kern__simd_force(NULL);
    float w[64] = {0}, x[64] = {0}, y[4];
    T_CHECK(kern_matmul(NULL, KERN_T_F32, w, 2, 32, x, 2, y) == 0 && y[0] == 0, "no pool");
    T_CHECK(kern_matmul(NULL, KERN_T_Q4_0, w, 2, 31, x, 1, y) == -EINVAL, "bad cols");
    T_CHECK(kern_matmul(NULL, KERN_T_Q2_K, w, 1, 256, x, 1, y) == -EINVAL, "unsupported");
}

/* The first index where a and b differ bit for bit, -1 when none. */
static int64_t first_diff(const float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof a[i]) != 0)
            return i;
    return -1;
}

/* A batch-against-alone case of one shape: a rows x cols weight w (uniform +-0.1 from the
 * seed) with room for its quantised copy wq, nx activation rows x (+-1), and the results of
 * each row alone (solo) and of a batch (y). */
struct batch_case {
    int64_t rows, cols;
    float *w, *x, *solo, *y;
    void *wq;
};

static void batch_case_new(struct batch_case *c, int64_t rows, int64_t cols, int64_t nx, uint64_t seed)
{
    c->rows = rows;
    c->cols = cols;
    c->w = malloc(rows * cols * 4);
    c->x = malloc(nx * cols * 4);
    c->solo = malloc(nx * rows * 4);
    c->y = malloc(nx * rows * 4);
    c->wq = malloc(rows * cols * 4);
    ku_seed(seed);
    ku_fill(c->w, rows * cols, 0.1f);
    ku_fill(c->x, nx * cols, 1.0f);
}

static void batch_case_free(struct batch_case *c)
{
    free(c->w); free(c->x); free(c->solo); free(c->y); free(c->wq);
}

/* Checks that each of the first n rows of the batch (c->y) is bit for bit that row alone
 * (c->solo), naming the first that is not. */
static void batch_case_check(const struct batch_case *c, const char *level, uint32_t t, int64_t n)
{
    int64_t rows = c->rows, i = first_diff(c->y, c->solo, n * rows);
    T_CHECK(i < 0, "%s %s %lldx%lld: batch of %lld, row %lld differs from the row alone at index "
            "%lld: %.9g vs %.9g", level, kern_type_name(t), (long long)rows, (long long)c->cols,
            (long long)n, (long long)(i / rows), (long long)(i % rows), c->y[i < 0 ? 0 : i],
            c->solo[i < 0 ? 0 : i]);
}

/* Batched rows bit-identical to rows alone: for every weight type and SIMD level, row i of a
 * matmul over n = 1..16 activation rows (KERN_ROWS_EXACT_MAX for F32, whose larger batches go
 * to OpenBLAS) is the very float the same row gets in a matmul of its own. The ring batches
 * several sessions' steps through one window on this (kern_type_rows_exact); odd block counts
 * take every tail of the kernels, and rows past 64 split across the threads. */
T_CASE(matmul_rows_exact)
{
    /* 104 and 101 columns (F32/F16/BF16 only): the 8-wide and scalar tails of the F16/BF16
     * multi-row dots */
    struct { int64_t rows, cols; } shapes[] = {{70, 416}, {19, 768}, {5, 96}, {33, 1280},
                                               {12, 104}, {9, 101}};
    struct kern_pool *p;
    int rc = kern_pool_new(&p, 2);
    T_ASSERT(rc == 0, "pool");
    /* Batches of 2..16 rows, then prompt-sized ones (every type but F32 holds for any count;
     * a stage runs prompt chunks of up to 64 rows with decode rows of other sessions). */
    const int64_t NX = 64, big[] = {24, 40, 64};
    rc = kern_pool_reserve(p, NX * 1280 * 4);
    T_ASSERT(rc == 0, "reserve");
    for (size_t c = 0; c < N_WT; c++)
        T_CHECK(kern_type_rows_exact(weight_types[c]), "type %s not row-exact",
                kern_type_name(weight_types[c]));
    for (size_t lv = 0; lv < N_LEVELS; lv++) {
        if (kern__simd_force(levels[lv]) != 0)
            continue;
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            int64_t rows = shapes[si].rows, cols = shapes[si].cols;
            struct batch_case bc;
            batch_case_new(&bc, rows, cols, NX, 500 + si);
            for (size_t c = 0; c < N_WT; c++) {
                uint32_t t = weight_types[c];
                if (!quant_weights(t, bc.w, rows, cols, bc.wq))
                    continue;
                for (int64_t i = 0; i < NX; i++)
                    T_ASSERT(kern_matmul(p, t, bc.wq, rows, cols, bc.x + i * cols, 1,
                                         bc.solo + i * rows) == 0, "matmul");
                int64_t nmax = t == KERN_T_F32 ? KERN_ROWS_EXACT_MAX : 16 + 3;
                for (int64_t k = 2; k <= nmax; k++) {
                    int64_t n = k <= 16 ? k : big[k - 17];
                    T_ASSERT(kern_matmul(p, t, bc.wq, rows, cols, bc.x, n, bc.y) == 0, "matmul");
                    batch_case_check(&bc, levels[lv], t, n);
                }
            }
            batch_case_free(&bc);
        }
    }
    kern__simd_force(NULL);
    kern_pool_free(p);
}

/* The paired activation layout of the nibble types (see kernels/cpu/simd.inc), built here
 * from reference Q8_0/Q8_1 blocks: per pair 64 bytes [b0 0..15|b1 0..15|b0 16..31|b1 16..31],
 * then dy[] = d and ys[] = d * sum(q) (Q8_1: its stored s). */
static void to_pairs(uint32_t vt, const void *blocks, int64_t cols, void *dst)
{
    int64_t nb = cols / 32, np = (nb + 1) / 2;
    uint8_t *q = dst;
    float *dy = (float *)(q + 64 * np), *ys = dy + 2 * np;
    memset(dst, 0, 80 * np);
    for (int64_t b = 0; b < nb; b++) {
        const int8_t *qs;
        float d, sy;
        if (vt == KERN_T_Q8_0) {
            const struct kern_block_q8_0 *k = (const struct kern_block_q8_0 *)blocks + b;
            qs = k->qs;
            d = wtype_f16_to_f32(k->d);
            int sum = 0;
            for (int e = 0; e < 32; e++)
                sum += qs[e];
            sy = d * sum;
        } else {
            const struct kern_block_q8_1 *k = (const struct kern_block_q8_1 *)blocks + b;
            qs = k->qs;
            d = wtype_f16_to_f32(k->d);
            sy = wtype_f16_to_f32(k->s);
        }
        memcpy(q + 64 * (b / 2) + 16 * (b % 2), qs, 16);
        memcpy(q + 64 * (b / 2) + 32 + 16 * (b % 2), qs + 16, 16);
        dy[b] = d;
        ys[b] = sy;
    }
}

/* The flat layout of Q8_0 weights: nb x 32 quants, then dy[nb], ys[nb] = d * sum(q). */
static void to_flat(const void *blocks, int64_t cols, void *dst)
{
    int64_t nb = cols / 32;
    int8_t *q = dst;
    float *dy = (float *)(q + 32 * nb), *ys = dy + nb;
    for (int64_t b = 0; b < nb; b++) {
        const struct kern_block_q8_0 *k = (const struct kern_block_q8_0 *)blocks + b;
        int sum = 0;
        for (int e = 0; e < 32; e++)
            sum += k->qs[e];
        memcpy(q + 32 * b, k->qs, 32);
        dy[b] = wtype_f16_to_f32(k->d);
        ys[b] = dy[b] * sum;
    }
}

/* Each SIMD dot on the very activation blocks the reference dot sees. */
T_CASE(dots_exact_inputs)
{
    int64_t cols; /* 800 = 25 blocks: an odd tail for the paired layouts; 768 for K types */
    float w[800], x[800];
    char wq[800 * 4], xq[800 * 4], xp[800 * 4];
    for (size_t lv = 1; lv < N_LEVELS; lv++) {
        if (kern__simd_force(levels[lv]) != 0)
            continue;
        const struct kern__simd *s = kern__simd_get();
        for (size_t c = 0; c < N_WT; c++) {
            uint32_t t = weight_types[c], vt = kern__type_traits(t)->vec_dot_type;
            if (!s->dot[t])
                continue; /* this level runs the reference's dot */
            cols = kern_block_elems(t) == 256 ? 768 : 800;
            double e = 0, r = 0;
            for (int rep = 0; rep < 20; rep++) {
                ku_seed(200 + rep);
                ku_fill(w, cols, rep == 0 ? 0.0f : 0.2f);
                ku_fill(x, cols, rep == 1 ? 0.0f : 3.0f);
                kern_ref_quant_row(t, w, wq, cols);
                kern_ref_quant_row(vt, x, xq, cols);
                const char *fx = xq;
                if (t == KERN_T_Q8_0 && s->actq[t]) {
                    to_flat(xq, cols, xp);
                    fx = xp;
                } else if (s->actq[t]) {
                    to_pairs(vt, xq, cols, xp);
                    fx = xp;
                }
                double a = s->dot[t](wq, fx, cols), b = kern__type_traits(t)->vec_dot(wq, xq, cols);
                e += (a - b) * (a - b);
                r += b * b;
                if (s->dotn[t]) {
                    /* every column of the multi-row dot is the one-row dot, bit for bit */
                    float one = s->dot[t](wq, fx, cols), out[KERN_MAXCOL];
                    for (int nc = 1; nc <= KERN_MAXCOL; nc++) {
                        s->dotn[t](wq, fx, 0, nc, cols, out);
                        for (int k = 0; k < nc; k++)
                            T_CHECK(memcmp(&out[k], &one, sizeof one) == 0,
                                    "%s dotn t=%u rep %d: %d columns, column %d: %.9g vs %.9g",
                                    s->name, t, rep, nc, k, out[k], one);
                    }
                    T_CHECK(fabs(out[2] - b) <= 1e-5 * (fabs(b) + 1), "%s dotn t=%u rep %d: %g vs %g", s->name, t, rep, out[2], b);
                }
            }
            T_CHECK(e <= 1e-12 * r, "%s t=%u dot nmse %g", s->name, t, e / r);
        }
        /* Quantisers: Q8_K and F16 exactly as the reference; Q8_0/Q8_1 within one level
         * (a level without its own quantisers, such as neon, uses the reference's). */
        if (!s->quant[KERN_T_Q8_K] || !s->quant[KERN_T_F16] || !s->quant[KERN_T_Q8_0] ||
            !s->quant[KERN_T_Q8_1])
            continue;
        cols = 768;
        ku_seed(300);
        ku_fill(x, cols, 2.0f);
        x[5] = 0.5f; /* ties are likely somewhere with scale 127/amax */
        char a[800 * 4], b[800 * 4];
        s->quant[KERN_T_Q8_K](x, a, cols);
        kern_ref_quant_row(KERN_T_Q8_K, x, b, cols);
        T_CHECK(memcmp(a, b, kern_row_bytes(KERN_T_Q8_K, cols)) == 0, "%s q8_K bytes", s->name);
        s->quant[KERN_T_F16](x, a, cols);
        kern_ref_quant_row(KERN_T_F16, x, b, cols);
        T_CHECK(memcmp(a, b, cols * 2) == 0, "%s f16 bytes", s->name);
        uint32_t q8[2] = {KERN_T_Q8_0, KERN_T_Q8_1};
        for (int k = 0; k < 2; k++) {
            s->quant[q8[k]](x, a, cols);
            kern_ref_quant_row(q8[k], x, b, cols);
            float da[800], db[800];
            kern_ref_dequant_row(q8[k], a, da, cols);
            kern_ref_dequant_row(q8[k], b, db, cols);
            int bad = 0;
            for (int i = 0; i < cols; i++)
                bad += fabsf(da[i] - db[i]) > 1.01f * fabsf(db[i] - x[i]) + 0.02f;
            T_CHECK(bad == 0, "%s q8 type %u: %d elements differ by more than a level",
                    s->name, q8[k], bad);
        }
    }
    kern__simd_force(NULL);
}

/* ---- K-quant dots on arbitrary blocks ----
 * The quantiser never writes some bit patterns (every level at its top, every fifth or sixth
 * bit set, extreme 6-bit scales and mins, Q6_K's -128 scale); random bytes reach them all, and
 * activations at +-127 push every int16 pair sum in the dots to its largest. Each SIMD dot
 * against the reference on those blocks, and each column of the multi-row dot (distinct
 * activation rows per column) bit for bit its own one-row dot. */
static void random_k_blocks(uint32_t t, void *dst, int64_t nb)
{
    size_t bs = kern_row_bytes(t, KERN_QK_K);
    uint8_t *p = dst;
    for (size_t i = 0; i < (size_t)nb * bs; i++)
        p[i] = (uint8_t)ku_u32();
    for (int64_t b = 0; b < nb; b++) {
        uint16_t d = wtype_f32_to_f16(0.001f + 0.01f * ku_unif());
        uint16_t dmin = wtype_f32_to_f16(0.001f + 0.01f * ku_unif());
        uint8_t *blk = p + b * bs;
        if (t == KERN_T_Q6_K) {
            memcpy(blk + offsetof(struct kern_block_q6_K, d), &d, 2);
        } else { /* Q4_K, Q5_K: d, dmin first */
            memcpy(blk, &d, 2);
            memcpy(blk + 2, &dmin, 2);
        }
    }
}

T_CASE(kquant_dots_arbitrary_blocks)
{
    const uint32_t kt[] = {KERN_T_Q4_K, KERN_T_Q5_K, KERN_T_Q6_K};
    enum { NB = 5, COLS = NB * KERN_QK_K };
    static float x[KERN_MAXCOL][COLS];
    static char wq[COLS * 2], xq[KERN_MAXCOL][COLS * 2];
    for (size_t lv = 1; lv < 3; lv++) {
        if (kern__simd_force(levels[lv]) != 0)
            continue;
        const struct kern__simd *s = kern__simd_get();
        for (size_t c = 0; c < sizeof kt / sizeof kt[0]; c++) {
            uint32_t t = kt[c];
            size_t xrow = kern_row_bytes(KERN_T_Q8_K, COLS);
            T_ASSERT(s->dot[t] && xrow <= sizeof xq[0], "%s: no dot for %s", s->name, kern_type_name(t));
            double e = 0, r = 0;
            for (int rep = 0; rep < 40; rep++) {
                ku_seed(900 + rep);
                random_k_blocks(t, wq, NB);
                for (int k = 0; k < KERN_MAXCOL; k++) {
                    for (int i = 0; i < COLS; i++) /* half the reps at +-127 everywhere */
                        x[k][i] = rep % 2 ? ((ku_u32() & 1) ? 1.0f : -1.0f) : ku_gauss();
                    kern_ref_quant_row(KERN_T_Q8_K, x[k], xq[k], COLS);
                }
                float one[KERN_MAXCOL], out[KERN_MAXCOL];
                for (int k = 0; k < KERN_MAXCOL; k++) {
                    one[k] = s->dot[t](wq, xq[k], COLS);
                    double b = kern__type_traits(t)->vec_dot(wq, xq[k], COLS);
                    e += (one[k] - b) * (one[k] - b);
                    r += b * b;
                }
                if (!s->dotn[t])
                    continue;
                const size_t xs = sizeof xq[0];
                for (int nc = 1; nc <= KERN_MAXCOL; nc++) {
                    s->dotn[t](wq, xq[0], xs, nc, COLS, out);
                    for (int k = 0; k < nc; k++)
                        T_CHECK(memcmp(&out[k], &one[k], sizeof one[k]) == 0,
                                "%s %s rep %d: %d columns, column %d: %.9g vs %.9g alone",
                                s->name, kern_type_name(t), rep, nc, k, out[k], one[k]);
                }
            }
            T_CHECK(e <= 1e-12 * r, "%s %s on arbitrary blocks: nmse %g", s->name,
                    kern_type_name(t), e / r);
        }
    }
    kern__simd_force(NULL);
}

/* Attention for one head layout: against the reference (F32 and F16 caches), batches and
 * single rows, and bit-identical across thread counts. */
static void attention_shape(int NH, int NKV, int HD)
{
    enum { CTX = 45 };
    const size_t stride = (size_t)NKV * HD;
    float *k = malloc(CTX * stride * 4), *v = malloc(CTX * stride * 4);
    uint16_t *k16 = malloc(CTX * stride * 2), *v16 = malloc(CTX * stride * 2);
    float *q = malloc(CTX * NH * HD * 4), *o = malloc(CTX * NH * HD * 4);
    float *orf = malloc(CTX * NH * HD * 4), scratch[CTX];
    float *o1 = malloc(4 * CTX * NH * HD * 4);
    ku_seed(7);
    ku_fill(k, CTX * stride, 1.0f);
    ku_fill(v, CTX * stride, 1.0f);
    ku_fill(q, CTX * NH * HD, 1.0f);
    for (size_t i = 0; i < CTX * stride; i++) {
        k16[i] = wtype_f32_to_f16(k[i]);
        v16[i] = wtype_f32_to_f16(v[i]);
    }
    struct { int64_t n, pos0; } cases[] = {{1, 0}, {1, 44}, {7, 0}, {13, 32}};
    for (int nt = 1; nt <= 3; nt += 2) {
        struct kern_pool *pool;
        int rc = kern_pool_new(&pool, nt);
        T_ASSERT(rc == 0, "pool");
        rc = kern_pool_reserve(pool, kern_attention_scratch(pool, CTX, HD));
        T_ASSERT(rc == 0, "reserve");
        for (size_t c = 0; c < 4; c++) {
            int64_t n = cases[c].n, pos0 = cases[c].pos0;
            float sc = 0.125f;
            kern_ref_attention(KERN_T_F32, orf, q, k, v, n, pos0, NH, NKV, HD, stride, sc, scratch);
            rc = kern_attention(pool, KERN_T_F32, o, q, k, v, n, pos0, NH, NKV, HD, stride, sc, scratch);
            T_CHECK(rc == 0, "attention f32: %d", rc);
            double e = t_nmse(o, orf, n * NH * HD);
            T_CHECK(e < 1e-11, "%d/%d x %d f32 %d threads n=%lld pos0=%lld nmse %g", NH, NKV, HD,
                    nt, (long long)n, (long long)pos0, e);
            kern_ref_attention(KERN_T_F16, orf, q, k16, v16, n, pos0, NH, NKV, HD, stride, sc, scratch);
            rc = kern_attention(pool, KERN_T_F16, o, q, k16, v16, n, pos0, NH, NKV, HD, stride, sc, scratch);
            T_CHECK(rc == 0, "attention f16: %d", rc);
            if (nt == 1)
                memcpy(o1 + c * CTX * NH * HD, o, n * NH * HD * 4);
            else
                T_CHECK(memcmp(o1 + c * CTX * NH * HD, o, n * NH * HD * 4) == 0,
                        "%d/%d x %d f16 case %zu: threads change the result", NH, NKV, HD, c);
            e = t_nmse(o, orf, n * NH * HD);
            T_CHECK(e < 1e-10, "%d/%d x %d f16 %d threads n=%lld pos0=%lld nmse %g", NH, NKV, HD,
                    nt, (long long)n, (long long)pos0, e);
        }
        kern_pool_free(pool);
    }
    free(k); free(v); free(k16); free(v16); free(q); free(o); free(orf); free(o1);
}

T_CASE(attention_fast)
{
    attention_shape(6, 2, 64);  /* groups of 3 */
    attention_shape(20, 2, 32); /* groups of 10: blocks of 8, 4 and singles */
    attention_shape(4, 4, 24);  /* no grouping */
    attention_shape(8, 1, 20);  /* head_dim not a multiple of 8: the generic path */
}

/* The SIMD softmax (own vector exp) against the reference: every element within a few ulp,
 * underflow to exact zeros, odd lengths. */
T_CASE(softmax_simd)
{
    for (size_t lv = 1; lv < N_LEVELS; lv++) {
        if (kern__simd_force(levels[lv]) != 0)
            continue;
        const struct kern__simd *s = kern__simd_get();
        if (!s->softmax)
            continue; /* this level runs the reference's */
        const int64_t lens[] = {1, 7, 8, 9, 100, 1000};
        for (size_t li = 0; li < 6; li++) {
            int64_t n = lens[li];
            float a[1000], b[1000];
            ku_seed(400 + li);
            for (int64_t i = 0; i < n; i++)
                a[i] = ku_gauss() * (li % 2 ? 30.0f : 3.0f); /* wide: some weights underflow */
            memcpy(b, a, n * 4);
            s->softmax(a, n);
            kern_ref_softmax(b, n);
            int bad = 0;
            double sum = 0;
            for (int64_t i = 0; i < n; i++) {
                sum += a[i];
                bad += fabsf(a[i] - b[i]) > 4e-7f * b[i] + 1e-37f;
            }
            T_CHECK(bad == 0, "%s softmax n=%lld: %d elements off", s->name, (long long)n, bad);
            T_CHECK(fabs(sum - 1) < 1e-5, "%s softmax n=%lld sums to %g", s->name, (long long)n, sum);
        }
        float e[9] = {0, 0, 0, 0, 0, 0, 0, 0, 0};
        s->softmax(e, 9);
        T_CHECK(fabsf(e[8] - 1.0f / 9) < 1e-7f && fabsf(e[0] - 1.0f / 9) < 1e-7f, "equal inputs");
    }
    kern__simd_force(NULL);
}

struct count_ctx {
    _Atomic int hits[8];
    _Atomic int calls;
};

static void count_task(void *ctx, int ith, int nth)
{
    struct count_ctx *c = ctx;
    atomic_fetch_add(&c->hits[ith], 1);
    atomic_fetch_add(&c->calls, nth);
}

T_CASE(pool_dispatch)
{
    struct kern_pool *p;
    int rc = kern_pool_new(&p, 0);
    T_ASSERT(rc == 0, "default pool");
    cpu_set_t set;
    T_ASSERT(sched_getaffinity(0, sizeof set, &set) == 0, "affinity");
    T_CHECK(kern_pool_threads(p) == CPU_COUNT(&set), "default = usable cpus (%d)", kern_pool_threads(p));
    kern_pool_free(p);
    rc = kern_pool_new(&p, 4);
    T_ASSERT(rc == 0, "pool of 4");
    struct count_ctx c = {0};
    for (int i = 0; i < 3000; i++)
        kern__pool_run(p, count_task, &c);
    /* and again after the workers have gone to sleep */
    usleep(300000);
    kern__pool_run(p, count_task, &c);
    int bad = 0;
    for (int t = 0; t < 4; t++)
        bad += atomic_load(&c.hits[t]) != 3001;
    T_CHECK(bad == 0 && atomic_load(&c.calls) == 3001 * 16, "every thread runs every job once");
    kern_pool_free(p);
    kern_pool_free(NULL);
    T_CHECK(kern_pool_threads(NULL) == 1, "no pool = one thread");
}

struct dyn_ctx {
    _Atomic int next;
    int items;
    _Atomic int hits[64];
    _Atomic int bad_ith;
};

static void dyn_task(void *ctx, int ith, int nth)
{
    struct dyn_ctx *c = ctx;
    if (ith < 0 || ith >= nth)
        atomic_fetch_add(&c->bad_ith, 1);
    for (;;) {
        int i = atomic_fetch_add(&c->next, 1);
        if (i >= c->items)
            break;
        atomic_fetch_add(&c->hits[i], 1);
    }
}

/* Dynamic jobs (work handed out by the task itself) interleaved with static ones: every item
 * done exactly once before the call returns, static jobs still reach every thread, also when
 * the workers have gone to sleep, and with a caller that is much faster than its workers. */
T_CASE(pool_dynamic)
{
    for (int nt = 2; nt <= 4; nt++) {
        struct kern_pool *p;
        T_ASSERT(kern_pool_new(&p, nt) == 0, "pool of %d", nt);
        struct count_ctx cc = {0};
        int bad = 0, runs = 0, stat = 0;
        for (int r = 0; r < 4000; r++) {
            struct dyn_ctx d = {.items = r % 65};
            kern__pool_run_dyn(p, dyn_task, &d);
            for (int i = 0; i < d.items; i++)
                bad += atomic_load(&d.hits[i]) != 1;
            bad += atomic_load(&d.bad_ith) != 0;
            runs++;
            if (r % 7 == 0) {
                kern__pool_run(p, count_task, &cc);
                stat++;
            }
            if (r == 2000)
                usleep(300000);
        }
        for (int t = 0; t < nt; t++)
            bad += atomic_load(&cc.hits[t]) != stat;
        T_CHECK(bad == 0 && runs == 4000, "%d threads: dynamic items once each, static jobs on "
                "every thread (%d bad)", nt, bad);
        kern_pool_free(p);
    }
}

/* The pool's element-wise ops are the reference's, bit for bit, at any thread count. */
T_CASE(elementwise_on_pool)
{
    const int64_t rows = 37, cols = 301, n = rows * cols;
    float *g = malloc(n * sizeof *g), *u = malloc(n * sizeof *u), *w = malloc(cols * sizeof *w);
    float *ref = malloc(n * sizeof *ref), *out = malloc(n * sizeof *out);
    T_ASSERT(g && u && w && ref && out, "alloc");
    for (int64_t i = 0; i < n; i++) {
        g[i] = (float)((i * 7919) % 2001) / 100.0f - 10.0f;
        u[i] = (float)((i * 104729) % 1999) / 500.0f - 2.0f;
    }
    for (int64_t i = 0; i < cols; i++)
        w[i] = 0.5f + (float)(i % 13) / 7.0f;
    for (int nt = 1; nt <= 3; nt++) {
        struct kern_pool *p;
        T_ASSERT(kern_pool_new(&p, nt) == 0, "pool");
        for (int64_t len = 1; len <= n; len = len * 3 + 1) {
            kern_ref_swiglu(ref, g, u, len);
            memcpy(out, g, len * sizeof *out); /* in place, as the model calls it */
            kern_swiglu(p, out, out, u, len);
            T_CHECK(memcmp(out, ref, len * sizeof *out) == 0, "swiglu %d threads n=%lld", nt,
                    (long long)len);
        }
        for (int64_t r = 1; r <= rows; r += 9) {
            for (int64_t i = 0; i < r; i++)
                kern_ref_rmsnorm(ref + i * cols, g + i * cols, w, cols, 1e-5f);
            kern_rmsnorm_rows(p, out, g, w, r, cols, 1e-5f);
            T_CHECK(memcmp(out, ref, r * cols * sizeof *out) == 0, "rmsnorm %d threads %lld rows",
                    nt, (long long)r);
        }
        kern_pool_free(p);
    }
    free(g); free(u); free(w); free(ref); free(out);
}

/* fast == reference, bit for bit (reported as NMSE when not) */
#define SAME(a, b, n, ...)                                                          \
    T_CHECK(memcmp((a), (b), (size_t)(n) * sizeof *(a)) == 0, __VA_ARGS__)

static float *fill_new(int64_t n, float sd)
{
    float *x = malloc((size_t)n * sizeof *x);
    if (x)
        ku_fill(x, n, sd);
    return x;
}

/* The forward pass's layer ops on the pool against their references: odd shapes, padded
 * strides, a single row and batches big enough to split, 1-3 threads, every SIMD level (the
 * KV store converts with the level's F16 instructions). All must be bit-identical. */
T_CASE(layer_ops_on_pool)
{
    enum { N = 37, NH = 6, HD = 64, ROT = 48, BIG = 300 * 301 };
    float *a = fill_new(BIG, 1.0f), *b = fill_new(BIG, 1.0f), *c = fill_new(BIG, 1.0f);
    float *r1 = malloc(BIG * 4), *r2 = malloc(BIG * 4), *f1 = malloc(BIG * 4), *f2 = malloc(BIG * 4);
    float *div = fill_new(ROT / 2, 0.2f);
    T_ASSERT(a && b && c && r1 && r2 && f1 && f2 && div, "alloc");
    for (int i = 0; i < ROT / 2; i++)
        div[i] = 1.0f + fabsf(div[i]);
    for (int nt = 1; nt <= 3; nt++) {
        struct kern_pool *p;
        T_ASSERT(kern_pool_new(&p, nt) == 0, "pool");
        T_ASSERT(kern_pool_reserve(p, kern_deltanet_scratch(p, 24)) == 0, "reserve");
        for (int64_t n = 1; n <= N; n += N - 1) {
            for (int fd = 0; fd < 2; fd++) { /* RoPE tables and rows, padded rows */
                kern_ref_rope_angles(r1, r2, n, 100, ROT, 10000, 0.5f, fd ? div : NULL);
                kern_rope_angles(p, f1, f2, n, 100, ROT, 10000, 0.5f, fd ? div : NULL);
                SAME(f1, r1, n * ROT / 2, "rope cos %d threads n=%lld", nt, (long long)n);
                SAME(f2, r2, n * ROT / 2, "rope sin %d threads n=%lld", nt, (long long)n);
                size_t stride = NH * HD + 5;
                memcpy(f1 + 4096, a, n * stride * 4);
                memcpy(r1 + 4096, a, n * stride * 4);
                kern_ref_rope_rows(r1 + 4096, n, stride, NH, HD, ROT, r1, r2, fd);
                kern_rope_rows(p, f1 + 4096, n, stride, NH, HD, ROT, r1, r2, fd);
                SAME(f1 + 4096, r1 + 4096, n * stride, "rope rows %d threads n=%lld neox=%d",
                     nt, (long long)n, fd);
            }
            /* L2 norm of 8 heads of 32 in rows 273 apart; conv over 1003 channels */
            memcpy(r1, a, n * 273 * 4);
            memcpy(f1, a, n * 273 * 4);
            kern_ref_l2norm(r1, n, 273, 8, 32, 1e-6f);
            kern_l2norm(p, f1, n, 273, 8, 32, 1e-6f);
            SAME(f1, r1, n * 273, "l2norm %d threads n=%lld", nt, (long long)n);
            kern_ref_conv_silu(r1, a, b, n, 1003, 4);
            kern_conv_silu(p, f1, a, b, n, 1003, 4);
            SAME(f1, r1, n * 1003, "conv %d threads n=%lld", nt, (long long)n);
            /* router: 13 experts, 3 chosen, some equal logits */
            for (int i = 0; i < 13 * N; i += 5)
                c[i + 1] = c[i];
            uint32_t sr[3 * N], sf[3 * N];
            memcpy(r1, c, n * 13 * 4);
            memcpy(f1, c, n * 13 * 4);
            kern_ref_moe_route(sr, r2, r1, n, 13, 3);
            kern_moe_route(p, sf, f2, f1, n, 13, 3);
            SAME(sf, sr, n * 3, "route choices %d threads", nt);
            SAME(f2, r2, n * 3, "route weights %d threads", nt);
            SAME(f1, r1, n * 13, "route softmax %d threads", nt);
        }
        for (size_t lv = 0; lv < N_LEVELS; lv++) { /* KV store, F16 and F32, padded cache rows */
            if (kern__simd_force(levels[lv]) != 0)
                continue;
            uint16_t h1[N * 203], h2[N * 203];
            kern_ref_kv_store(KERN_T_F16, h1, 203, a, N, 200);
            kern_kv_store(p, KERN_T_F16, h2, 203, a, N, 200);
            bool same = true;
            for (int r = 0; r < N; r++)
                same &= memcmp(h1 + r * 203, h2 + r * 203, 400) == 0;
            T_CHECK(same, "kv store f16 %s %d threads", levels[lv], nt);
            kern_ref_kv_store(KERN_T_F32, r1, 203, a, N, 200);
            kern_kv_store(p, KERN_T_F32, f1, 203, a, N, 200);
            same = true;
            for (int r = 0; r < N; r++)
                same &= memcmp(r1 + r * 203, f1 + r * 203, 800) == 0;
            T_CHECK(same, "kv store f32 %s %d threads", levels[lv], nt);
        }
        kern__simd_force(NULL);
        for (int64_t n = 1; n <= BIG; n = n * 7 + 3) { /* element-wise, in place */
            memcpy(r1, a, n * 4); memcpy(f1, a, n * 4);
            kern_ref_add(r1, b, n);
            kern_add(p, f1, b, n);
            SAME(f1, r1, n, "add %d threads n=%lld", nt, (long long)n);
            kern_ref_sigmoid(r1, n);
            kern_sigmoid(p, f1, n);
            SAME(f1, r1, n, "sigmoid %d threads n=%lld", nt, (long long)n);
            kern_ref_mul_sigmoid(r1, c, n);
            kern_mul_sigmoid(p, f1, c, n);
            SAME(f1, r1, n, "mul_sigmoid %d threads n=%lld", nt, (long long)n);
        }
        for (int64_t rows = 1; rows <= 300; rows += 299) { /* row ops on 301 columns */
            uint32_t idx[300];
            for (int64_t i = 0; i < rows; i++)
                idx[i] = (uint32_t)((i * 97) % rows); /* a permutation: 97 is prime */
            memcpy(r1, a, rows * 301 * 4); memcpy(f1, a, rows * 301 * 4);
            kern_ref_add_rows(r1, b, rows, 301);
            kern_add_rows(p, f1, b, rows, 301);
            SAME(f1, r1, rows * 301, "add_rows %d threads %lld rows", nt, (long long)rows);
            for (int u = 0; u < 2; u++) {
                kern_ref_axpy_rows(r1, c, b, u ? idx : NULL, rows, 301);
                kern_axpy_rows(p, f1, c, b, u ? idx : NULL, rows, 301);
                SAME(f1, r1, rows * 301, "axpy_rows %d threads %lld rows idx=%d", nt,
                     (long long)rows, u);
            }
            kern_ref_rmsnorm_silu(r2, a, b, c, rows, 301, 1e-5f);
            kern_rmsnorm_silu(p, f2, a, b, c, rows, 301, 1e-5f);
            SAME(f2, r2, rows * 301, "rmsnorm_silu %d threads %lld rows", nt, (long long)rows);
            kern_ref_rmsnorm_silu(r1, r1, b, c, rows, 301, 1e-5f); /* in place */
            kern_rmsnorm_silu(p, f1, f1, b, c, rows, 301, 1e-5f);
            SAME(f1, r1, rows * 301, "rmsnorm_silu in place %d threads", nt);
        }
        /* DeltaNet: 2 key heads, 6 value heads of 24, rows padded; state carried over two
         * calls (a batch, then one token) */
        enum { HK = 2, HV = 6, D = 24, STRIDE = 2 * HK * D + HV * D + 3, T = 9 };
        float *qkv = fill_new(T * STRIDE, 1.0f), *g = fill_new(2 * T * HV, 1.0f);
        float *bias = fill_new(HV, 1.0f), *av = fill_new(HV, 1.0f);
        float *Sr = fill_new(HV * D * D, 0.1f), *Sf = malloc(HV * D * D * 4), sc[2 * D];
        T_ASSERT(qkv && g && bias && av && Sr && Sf, "alloc");
        memcpy(Sf, Sr, HV * D * D * 4);
        kern_ref_l2norm(qkv, T, STRIDE, 2 * HK, D, 1e-6f);
        for (int call = 0; call < 2; call++) {
            int64_t t0 = call ? T - 1 : 0, n = call ? 1 : T - 1;
            const float *q = qkv + t0 * STRIDE, *k = q + HK * D, *v = k + HK * D;
            kern_ref_deltanet(r1, Sr, q, k, v, STRIDE, g + t0 * HV, g + T * HV + t0 * HV, bias,
                              av, n, HK, HV, D, sc);
            int rc = kern_deltanet(p, f1, Sf, q, k, v, STRIDE, g + t0 * HV, g + T * HV + t0 * HV,
                                   bias, av, n, HK, HV, D, NULL);
            T_CHECK(rc == 0, "deltanet: %d", rc);
            SAME(f1, r1, n * HV * D, "deltanet out %d threads call %d (nmse %g)", nt, call,
                 t_nmse(f1, r1, n * HV * D));
            SAME(Sf, Sr, HV * D * D, "deltanet state %d threads call %d", nt, call);
        }
        free(qkv); free(g); free(bias); free(av); free(Sr); free(Sf);
        kern_pool_free(p);
    }
    free(a); free(b); free(c); free(r1); free(r2); free(f1); free(f2); free(div);
}

/* The pool's scratch is reserved once and never grows: an op whose need is over the
 * reservation returns -ENOSPC (and a reservation that fits lets it run). */
T_CASE(scratch_reserved)
{
    struct kern_pool *p;
    T_ASSERT(kern_pool_new(&p, 2) == 0, "pool");
    float w[2 * 64], x[2 * 64], y[4], o[64], S[16 * 16], sc[32];
    ku_fill(w, 128, 1.0f);
    ku_fill(x, 128, 1.0f);
    memset(S, 0, sizeof S);
    uint8_t wq[2 * 68];
    kern_ref_quant_row(KERN_T_Q8_0, w, wq, 64);
    kern_ref_quant_row(KERN_T_Q8_0, w + 64, wq + 68, 64);
    uint16_t kc[2 * 64];
    for (int i = 0; i < 128; i++)
        kc[i] = wtype_f32_to_f16(w[i]);
    T_CHECK(kern_matmul(p, KERN_T_Q8_0, wq, 2, 64, x, 2, y) == -ENOSPC, "matmul without scratch");
    T_CHECK(kern_matmul(p, KERN_T_F32, w, 2, 64, x, 1, y) == 0, "f32 matmul needs none");
    T_CHECK(kern_attention(p, KERN_T_F16, o, x, kc, kc, 1, 1, 2, 1, 32, 64, 0.1f, sc) == -ENOSPC,
            "attention without scratch");
    T_CHECK(kern_deltanet(p, o, S, x, x + 16, x + 32, 64, x, x, x, x, 1, 1, 1, 16, sc) == -ENOSPC,
            "deltanet without scratch");
    T_CHECK(kern_matmul_scratch(KERN_T_Q8_0, 64, 2) > 0 && kern_matmul_scratch(KERN_T_F32, 64, 2) == 0,
            "matmul scratch sizes");
    size_t need = kern_matmul_scratch(KERN_T_Q8_0, 64, 2);
    size_t att = kern_attention_scratch(p, 2, 32), dn = kern_deltanet_scratch(p, 16);
    need = need > att ? need : att;
    need = need > dn ? need : dn;
    T_ASSERT(kern_pool_reserve(p, need) == 0, "reserve");
    T_CHECK(kern_matmul(p, KERN_T_Q8_0, wq, 2, 64, x, 2, y) == 0, "matmul within the reservation");
    T_CHECK(kern_attention(p, KERN_T_F16, o, x, kc, kc, 1, 1, 2, 1, 32, 64, 0.1f, sc) == 0,
            "attention within the reservation");
    T_CHECK(kern_deltanet(p, o, S, x, x + 16, x + 32, 64, x, x, x, x, 1, 1, 1, 16, sc) == 0,
            "deltanet within the reservation");
    T_CHECK(kern_pool_reserve(p, 1) == 0, "a smaller reservation keeps the buffer");
    kern_pool_free(p);
}

/* F16/BF16: the AVX-512 dots keep a column's accumulators in zmm pairs, lane for lane the
 * AVX2 ymm operations, so both levels give the same bits (odd and tail column counts, batches
 * of 1, 3 and 9 rows: the one-row dot and the multi-row one). */
T_CASE(f16_levels_same_bits)
{
    struct { int64_t rows, cols; } shapes[] = {{12, 104}, {9, 101}, {19, 768}, {5, 2048}};
    const uint32_t types[] = {KERN_T_F16, KERN_T_BF16};
    const int64_t ns[] = {1, 3, 9};
    if (kern__simd_force("avx2") != 0 || kern__simd_force("avx512") != 0) {
        kern__simd_force(NULL);
        fprintf(stderr, "  avx2 and avx512 not both here\n");
        return;
    }
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int64_t rows = shapes[si].rows, cols = shapes[si].cols;
        float *w = malloc(rows * cols * 4), *x = malloc(9 * cols * 4);
        float *ya = malloc(9 * rows * 4), *yb = malloc(9 * rows * 4);
        void *wq = malloc(rows * cols * 2);
        ku_seed(1300 + si);
        ku_fill(w, rows * cols, 0.1f);
        ku_fill(x, 9 * cols, 1.0f);
        for (size_t ti = 0; ti < 2; ti++) {
            T_ASSERT(quant_weights(types[ti], w, rows, cols, wq), "quant");
            for (size_t ni = 0; ni < 3; ni++) {
                int64_t n = ns[ni];
                kern__simd_force("avx2");
                T_ASSERT(kern_matmul(NULL, types[ti], wq, rows, cols, x, n, ya) == 0, "matmul");
                kern__simd_force("avx512");
                T_ASSERT(kern_matmul(NULL, types[ti], wq, rows, cols, x, n, yb) == 0, "matmul");
                T_CHECK(memcmp(ya, yb, n * rows * 4) == 0, "%s %lldx%lld n=%lld: avx2 and "
                        "avx512 differ", kern_type_name(types[ti]), (long long)rows,
                        (long long)cols, (long long)n);
            }
        }
        free(w); free(x); free(ya); free(yb); free(wq);
    }
    kern__simd_force(NULL);
}

/* Repacked weights (kernels/cpu/cpu_repack.c) at every level that has them, Q4_0, Q4_1,
 * Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K, odd shapes (rows not a multiple of the group, odd block counts), 1-3 threads and
 * several batch sizes: agree with the reference by NMSE, the thread count changes no bit, and
 * the AVX2 and AVX-512 layouts give the very same floats (one chain of operations per output). */
static const uint32_t packed_types[] = {KERN_T_Q4_0, KERN_T_Q4_1, KERN_T_Q5_0, KERN_T_Q5_1,
                                        KERN_T_Q8_0, KERN_T_Q4_K, KERN_T_Q5_K, KERN_T_Q6_K};

/* Whether cols is a whole number of t's blocks (the K types' super-blocks are 256). */
static bool whole_blocks(uint32_t t, int64_t cols)
{
    return kern_row_bytes(t, cols) != 0;
}

/* Scratch for n activation rows of cols values, whichever packed type. */
static size_t packed_act(int64_t cols, int64_t n)
{
    size_t a = kern__rp_act_bytes(KERN_T_Q4_0, cols), b = kern__rp_act_bytes(KERN_T_Q4_K, cols);
    return n * (a > b ? a : b);
}

T_CASE(packed_matmul)
{
    struct { int64_t rows, cols, n_mat; } shapes[] = {
        {1, 32, 1}, {17, 96, 1}, {33, 160, 2}, {16, 64, 3}, {100, 2048, 1}, {70, 416, 1},
        {8, 224, 1}, {17, 512, 2}, {1, 256, 1}, {9, 768, 1},
    };
    const int64_t ns[] = {1, 3, 8, 13, 33};
    struct kern_pool *pools[3];
    for (int nt = 1; nt <= 3; nt++) {
        int rc = kern_pool_new(&pools[nt - 1], nt);
        T_ASSERT(rc == 0, "pool");
        rc = kern_pool_reserve(pools[nt - 1], packed_act(2048, 33));
        T_ASSERT(rc == 0, "reserve");
    }
    T_ASSERT(kern__simd_force("scalar") == 0, "scalar level");
    struct kern_packed *none = NULL;
    uint8_t blk[34] = {0};
    T_CHECK(!kern_pack_supported(KERN_T_Q4_0, 32) &&
                kern_pack_new(NULL, &none, KERN_T_Q4_0, blk, 1, 32, 1) == -ENOTSUP && !none,
            "the scalar level has no repacked kernels");
    int levels_run = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int64_t rows = shapes[si].rows, cols = shapes[si].cols, nm = shapes[si].n_mat, N = 33;
        float *w = malloc(nm * rows * cols * 4), *x = malloc(N * cols * 4);
        float *y = malloc(N * rows * 4), *yr = malloc(N * rows * 4), *y1 = malloc(N * rows * 4);
        float *ylv = malloc(N * rows * 4);
        void *wq = malloc(nm * rows * cols * 4);
        ku_seed(700 + si);
        ku_fill(w, nm * rows * cols, 0.1f);
        ku_fill(x, N * cols, 1.0f);
        for (size_t ti = 0; ti < sizeof packed_types / sizeof packed_types[0]; ti++) {
            uint32_t t = packed_types[ti];
            if (!whole_blocks(t, cols))
                continue;
            size_t mb = kern_row_bytes(t, cols) * rows;
            T_ASSERT(quant_weights(t, w, nm * rows, cols, wq), "quant");
            bool have_lv = false;
            for (size_t lv = 1; lv < 3; lv++) {
                if (kern__simd_force(levels[lv]) != 0)
                    continue;
                levels_run++;
                struct kern_packed *pk;
                int rc = kern_pack_new(pools[1], &pk, t, wq, rows, cols, nm);
                T_ASSERT(rc == 0, "%s pack %s: %d", levels[lv], kern_type_name(t), rc);
                /* packed by the caller alone and by three threads: the same layout */
                struct kern_packed *pk_one, *pk_three;
                T_ASSERT(kern_pack_new(NULL, &pk_one, t, wq, rows, cols, nm) == 0 &&
                             kern_pack_new(pools[2], &pk_three, t, wq, rows, cols, nm) == 0,
                         "pack on other thread counts");
                T_CHECK(kern_pack_bytes(pk) >= (size_t)nm * mb, "packed bytes");
                for (int64_t m = 0; m < nm; m++) {
                    T_CHECK(kern_pack_find(pk, t, rows, cols, m * mb) == m, "find matrix %lld",
                            (long long)m);
                    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
                        int64_t n = ns[ni];
                        kern_ref_matmul(t, (char *)wq + m * mb, rows, cols, x, n, yr);
                        for (int nt = 1; nt <= 3; nt++) {
                            for (int64_t i = 0; i < n * rows; i++)
                                y[i] = NAN;
                            rc = kern_matmul_packed(pools[nt - 1], pk, m, x, n, y);
                            double e = t_nmse(y, yr, n * rows);
                            T_CHECK(rc == 0 && e <= budget(t),
                                    "%s %s %d threads %lldx%lld mat %lld n=%lld: rc %d nmse %g",
                                    levels[lv], kern_type_name(t), nt, (long long)rows,
                                    (long long)cols, (long long)m, (long long)n, rc, e);
                            if (nt == 1)
                                memcpy(y1, y, n * rows * 4);
                            else
                                T_CHECK(memcmp(y1, y, n * rows * 4) == 0,
                                        "%s %s: %d threads differ from 1", levels[lv],
                                        kern_type_name(t), nt);
                        }
                        if (ni == sizeof ns / sizeof ns[0] - 1) {
                            const struct kern_packed *alt[2] = {pk_one, pk_three};
                            for (int k = 0; k < 2; k++) {
                                rc = kern_matmul_packed(pools[0], alt[k], m, x, n, y);
                                T_CHECK(rc == 0 && memcmp(y1, y, n * rows * 4) == 0,
                                        "%s %s %lldx%lld mat %lld: packed on %d threads differs",
                                        levels[lv], kern_type_name(t), (long long)rows,
                                        (long long)cols, (long long)m, k ? 3 : 1);
                            }
                        }
                        if (m == nm - 1 && ni == sizeof ns / sizeof ns[0] - 1) {
                            if (have_lv)
                                T_CHECK(memcmp(ylv, y1, n * rows * 4) == 0,
                                        "%s %s %lldx%lld: avx2 and avx512 layouts differ",
                                        levels[lv], kern_type_name(t), (long long)rows,
                                        (long long)cols);
                            memcpy(ylv, y1, n * rows * 4);
                            have_lv = true;
                        }
                    }
                }
                T_CHECK(kern_pack_find(pk, t, rows + 1, cols, 0) == -1 &&
                            kern_pack_find(pk, t, rows, cols, nm * mb) == -1 &&
                            kern_pack_find(pk, t == KERN_T_Q4_0 ? KERN_T_Q8_0 : KERN_T_Q4_0,
                                           rows, cols, 0) == -1 &&
                            (mb == 0 || kern_pack_find(pk, t, rows, cols, 1) == -1),
                        "find refuses what the pack does not hold");
                T_CHECK(kern_matmul_packed(pools[0], pk, nm, x, 1, y) == -EINVAL, "bad matrix");
                int other = lv == 1 ? 2 : 1;
                if (kern__simd_force(levels[other]) == 0) {
                    T_CHECK(kern_pack_find(pk, t, rows, cols, 0) == -1 &&
                                kern_matmul_packed(pools[0], pk, 0, x, 1, y) == -EINVAL,
                            "a pack of another level is refused");
                }
                kern_pack_free(pk);
                kern_pack_free(pk_one);
                kern_pack_free(pk_three);
            }
        }
        free(w); free(x); free(y); free(yr); free(y1); free(ylv); free(wq);
    }
    if (levels_run == 0)
        fprintf(stderr, "  no level with repacked kernels here\n");
    struct kern_pool *small;
    T_ASSERT(kern_pool_new(&small, 2) == 0, "pool");
    if (kern__simd_force("avx2") == 0) {
        struct kern_packed *pk;
        float w1[64], x1[64], y1[4];
        uint8_t q[2 * 34];
        ku_fill(w1, 64, 0.1f);
        ku_fill(x1, 64, 1.0f);
        quant_weights(KERN_T_Q8_0, w1, 2, 32, q);
        T_ASSERT(kern_pack_new(NULL, &pk, KERN_T_Q8_0, q, 2, 32, 1) == 0, "pack");
        T_CHECK(kern_matmul_packed(small, pk, 0, x1, 2, y1) == -ENOSPC, "no scratch reserved");
        T_CHECK(kern_matmul_scratch(KERN_T_Q8_0, 32, 2) >= kern_pack_scratch(KERN_T_Q8_0, 32, 2) &&
                    kern_pack_scratch(KERN_T_Q8_0, 32, 2) > 0,
                "kern_matmul_scratch covers the packed kernels");
        T_CHECK(kern_matmul_packed(NULL, pk, 0, x1, 2, y1) == 0, "no pool");
        kern_pack_free(pk);
    }
    kern_pool_free(small);
    kern_pack_free(NULL);
    kern__simd_force(NULL);
    for (int nt = 1; nt <= 3; nt++)
        kern_pool_free(pools[nt - 1]);
}

/* Repacked K-quant weights on arbitrary blocks (random_k_blocks: every 6-bit level at its
 * top, every fifth and sixth bit, extreme scales, Q6_K's -128 scale), which the quantiser
 * seldom writes and the repacking rearranges bit by bit: at every level with repacked
 * kernels, against the reference within the integer-exact budget, each activation row of a
 * batch bit for bit that row alone, and the AVX2 and AVX-512 layouts the same floats. */
T_CASE(packed_kquant_arbitrary_blocks)
{
    const uint32_t kt[] = {KERN_T_Q4_K, KERN_T_Q5_K, KERN_T_Q6_K};
    enum { ROWS = 37, NB = 3, COLS = NB * KERN_QK_K, N = 5 };
    static float x[N * COLS], y[N * ROWS], yr[N * ROWS], y1[ROWS], ylv[N * ROWS];
    static uint8_t wq[ROWS * NB * 210];
    struct kern_pool *pool;
    T_ASSERT(kern_pool_new(&pool, 1) == 0 && kern_pool_reserve(pool, packed_act(COLS, N)) == 0,
             "pool");
    for (size_t c = 0; c < sizeof kt / sizeof kt[0]; c++) {
        const uint32_t t = kt[c];
        T_ASSERT(kern_row_bytes(t, COLS) * ROWS <= sizeof wq, "weights buffer");
        for (int rep = 0; rep < 6; rep++) {
            ku_seed(1300 + rep);
            random_k_blocks(t, wq, (int64_t)ROWS * NB);
            for (int i = 0; i < N * COLS; i++) /* half the reps at +-127 everywhere */
                x[i] = rep % 2 ? ((ku_u32() & 1) ? 1.0f : -1.0f) : ku_gauss();
            T_ASSERT(kern_ref_matmul(t, wq, ROWS, COLS, x, N, yr) == 0, "reference");
            bool have_lv = false;
            for (size_t lv = 1; lv < 3; lv++) {
                if (kern__simd_force(levels[lv]) != 0)
                    continue;
                struct kern_packed *pk;
                T_ASSERT(kern_pack_new(pool, &pk, t, wq, ROWS, COLS, 1) == 0, "%s pack %s",
                         levels[lv], kern_type_name(t));
                T_ASSERT(kern_matmul_packed(pool, pk, 0, x, N, y) == 0, "matmul");
                double e = t_nmse(y, yr, N * ROWS);
                T_CHECK(e <= 1e-12, "%s %s rep %d on arbitrary blocks: nmse %g", levels[lv],
                        kern_type_name(t), rep, e);
                for (int k = 0; k < N; k++) {
                    T_ASSERT(kern_matmul_packed(pool, pk, 0, x + k * COLS, 1, y1) == 0, "one row");
                    T_CHECK(memcmp(y1, y + k * ROWS, sizeof y1) == 0,
                            "%s %s rep %d: row %d of %d differs from it alone", levels[lv],
                            kern_type_name(t), rep, k, N);
                }
                if (have_lv)
                    T_CHECK(memcmp(ylv, y, sizeof y) == 0, "%s %s rep %d: avx2 and avx512 differ",
                            levels[lv], kern_type_name(t), rep);
                memcpy(ylv, y, sizeof y);
                have_lv = true;
                kern_pack_free(pk);
            }
        }
    }
    kern__simd_force(NULL);
    kern_pool_free(pool);
}

/* Row r of an n-row packed matmul (n = 1..70: decode rows, prompt chunks, both mixed) is
 * bit for bit the row alone: the ring batches sessions' rows through one window on this. */
T_CASE(packed_rows_exact)
{
    struct { int64_t rows, cols; } shapes[] = {{70, 416}, {19, 768}, {33, 96}, {40, 512}};
    const int64_t NX = 70;
    struct kern_pool *p;
    int rc = kern_pool_new(&p, 2);
    T_ASSERT(rc == 0, "pool");
    rc = kern_pool_reserve(p, packed_act(768, NX));
    T_ASSERT(rc == 0, "reserve");
    for (size_t lv = 1; lv < 3; lv++) {
        if (kern__simd_force(levels[lv]) != 0)
            continue;
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            int64_t rows = shapes[si].rows, cols = shapes[si].cols;
            struct batch_case bc;
            batch_case_new(&bc, rows, cols, NX, 900 + si);
            for (size_t ti = 0; ti < sizeof packed_types / sizeof packed_types[0]; ti++) {
                uint32_t t = packed_types[ti];
                struct kern_packed *pk;
                if (!whole_blocks(t, cols))
                    continue;
                T_ASSERT(quant_weights(t, bc.w, rows, cols, bc.wq), "quant");
                T_ASSERT(kern_pack_new(p, &pk, t, bc.wq, rows, cols, 1) == 0, "pack");
                for (int64_t i = 0; i < NX; i++)
                    T_ASSERT(kern_matmul_packed(p, pk, 0, bc.x + i * cols, 1, bc.solo + i * rows) == 0,
                             "matmul");
                for (int64_t n = 2; n <= NX; n++) {
                    T_ASSERT(kern_matmul_packed(p, pk, 0, bc.x, n, bc.y) == 0, "matmul");
                    batch_case_check(&bc, levels[lv], t, n);
                }
                kern_pack_free(pk);
            }
            batch_case_free(&bc);
        }
    }
    kern__simd_force(NULL);
    kern_pool_free(p);
}

int main(int argc, char **argv)
{
    t_init(argc, argv);
    T_RUN(pool_dynamic);
    T_RUN(elementwise_on_pool);
    T_RUN(layer_ops_on_pool);
    T_RUN(scratch_reserved);
    T_RUN(matmul_all_levels);
    T_RUN(matmul_rows_exact);
    T_RUN(f16_levels_same_bits);
    T_RUN(dots_exact_inputs);
    T_RUN(kquant_dots_arbitrary_blocks);
    T_RUN(attention_fast);
    T_RUN(softmax_simd);
    T_RUN(pool_dispatch);
    T_RUN(packed_matmul);
    T_RUN(packed_kquant_arbitrary_blocks);
    T_RUN(packed_rows_exact);
    fprintf(stderr, "cpu level: %s\n", kern_cpu_level());
    return T_DONE();
}

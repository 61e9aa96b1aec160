/* kern_matmul: the fast matmul. Activations are converted once per call to the weight
 * type's dot type (in parallel for batches), then weight rows are handed out in chunks to the
 * pool's threads; a batch is walked KERN_MAXCOL activation rows at a time so each decoded
 * weight block serves several dot products, each row's result the bits it gets alone
 * (kern_type_rows_exact). F32 weights with a large batch go to OpenBLAS sgemm. */
#include <cblas.h>
#include <errno.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__aarch64__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif
#include <stdatomic.h>
#include <stdlib.h>

#include "kernels/internal.h"

/* ---- SIMD level ---- */

static const struct kern__simd simd_scalar = {.name = "scalar"};
static const struct kern__simd *simd_forced;

#if defined(__x86_64__) && defined(__GNUC__)
/* F16C by CPUID (not every compiler's __builtin_cpu_supports knows it). */
static bool has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}

static bool has_avx2(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
}

static bool has_avx512(void)
{
    return has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bf16");
}
#endif

#if defined(__aarch64__)
/* Advanced SIMD is part of ARMv8-A; SDOT (ARMv8.2 dotprod) is optional: the kernel says. */
static bool has_neon(void)
{
    return (getauxval(AT_HWCAP) & HWCAP_ASIMD) != 0;
}

static bool has_neon_dotprod(void)
{
    return has_neon() && (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
}
#endif

/* The levels this build has, lowest first, and whether this CPU runs each. */
static const struct {
    const struct kern__simd *s;
    bool (*ok)(void);
} simd_levels[] = {
    {&simd_scalar, NULL},
#if defined(__x86_64__) && defined(__GNUC__)
    {&kern__simd_avx2, has_avx2},
    {&kern__simd_avx512, has_avx512},
#endif
#if defined(__aarch64__)
    {&kern__simd_neon, has_neon},
    {&kern__simd_neon_dotprod, has_neon_dotprod},
#endif
};
#define N_LEVELS (sizeof simd_levels / sizeof simd_levels[0])

static bool level_ok(size_t i)
{
    return !simd_levels[i].ok || simd_levels[i].ok();
}

/* The highest level this CPU runs; KV_KERN_SIMD=<name> caps it at that level. */
static const struct kern__simd *detect(void)
{
    const char *env = getenv("KV_KERN_SIMD");
    size_t cap = N_LEVELS - 1;
    for (size_t i = 0; env && i < N_LEVELS; i++)
        if (strcmp(env, simd_levels[i].s->name) == 0)
            cap = i;
    for (size_t i = cap + 1; i-- > 0;)
        if (level_ok(i))
            return simd_levels[i].s;
    return &simd_scalar;
}

const struct kern__simd *kern__simd_get(void)
{
    static const struct kern__simd *_Atomic chosen;
    if (simd_forced)
        return simd_forced;
    const struct kern__simd *s = atomic_load(&chosen);
    if (!s) {
        s = detect();
        atomic_store(&chosen, s);
    }
    return s;
}

int kern__simd_force(const char *name)
{
    static const char *const known[] = {"scalar", "avx2", "avx512", "neon", "neon-dotprod"};
    if (!name) {
        simd_forced = NULL;
        return 0;
    }
    for (size_t i = 0; i < N_LEVELS; i++) {
        if (strcmp(name, simd_levels[i].s->name) == 0) {
            if (!level_ok(i))
                return -ENOTSUP;
            simd_forced = simd_levels[i].s;
            return 0;
        }
    }
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strcmp(name, known[i]) == 0)
            return -ENOTSUP; /* a level of another architecture */
    return -EINVAL;
}

const char *kern_cpu_level(void)
{
    return kern__simd_get()->name;
}

/* ---- matmul ---- */

struct aq_job {
    kern__quant_fn quant;
    uint32_t vt;
    const float *x;
    int64_t cols, n;
    char *dst;
    size_t stride;
    _Atomic int64_t next; /* next row to convert */
};

static void aq_task(void *ctx, int ith, int nth)
{
    struct aq_job *j = ctx;
    (void)ith;
    (void)nth;
    for (;;) {
        int64_t i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (i >= j->n)
            break;
        if (j->quant)
            j->quant(j->x + i * j->cols, j->dst + i * j->stride, j->cols);
        else
            kern_ref_quant_row(j->vt, j->x + i * j->cols, j->dst + i * j->stride, j->cols);
    }
}

void kern__act_quant(struct kern_pool *p, kern__quant_fn quant, uint32_t vt, const float *x,
                     int64_t cols, int64_t n, void *dst, size_t dst_stride)
{
    struct aq_job j = {
        .quant = quant, .vt = vt, .x = x, .cols = cols, .n = n, .dst = dst,
        .stride = dst_stride,
    };
    atomic_store(&j.next, 0);
    if (n >= 4 && kern_pool_threads(p) > 1)
        kern__pool_run_dyn(p, aq_task, &j);
    else
        aq_task(&j, 0, 1);
}

struct mm_job {
    const char *w;
    int64_t rows, cols, n;
    float *y;
    char *xq;
    size_t wrow, xrow;
    kern__dot_fn dot;
    kern__dotn_fn dotn;
    int64_t chunk;        /* fewest rows per work item */
    int64_t max_chunk;    /* most rows per work item */
    _Atomic int64_t next; /* first row not yet handed out */
};

static void compute_rows(struct mm_job *j, int64_t r0, int64_t r1)
{
    if (j->n == 1) {
        for (int64_t r = r0; r < r1; r++)
            j->y[r] = j->dot(j->w + r * j->wrow, j->xq, j->cols);
        return;
    }
    float out[KERN_MAXCOL];
    for (int64_t i = 0; i < j->n; i += KERN_MAXCOL) {
        int nc = j->n - i < KERN_MAXCOL ? (int)(j->n - i) : KERN_MAXCOL;
        const char *xq = j->xq + i * j->xrow;
        for (int64_t r = r0; r < r1; r++) {
            const char *wr = j->w + r * j->wrow;
            if (j->dotn) {
                j->dotn(wr, xq, j->xrow, nc, j->cols, out);
            } else {
                for (int c = 0; c < nc; c++)
                    out[c] = j->dot(wr, xq + c * j->xrow, j->cols);
            }
            for (int c = 0; c < nc; c++)
                j->y[(i + c) * j->rows + r] = out[c];
        }
    }
}

/* Guided self-scheduling (kern__claim): at least j->chunk rows a claim, at most j->max_chunk
 * (a batch re-reads its piece per 8 rows: keep it in L2). */
static void compute_task(void *ctx, int ith, int nth)
{
    struct mm_job *j = ctx;
    (void)ith;
    int64_t r0, c;
    while ((c = kern__claim(&j->next, j->rows, nth, j->chunk, j->max_chunk, &r0)) > 0)
        compute_rows(j, r0, r0 + c);
}

size_t kern_matmul_scratch(uint32_t type, int64_t cols, int64_t n)
{
    const struct kern__simd *s = kern__simd_get();
    const struct kern__type_traits *tt = kern__type_traits(type);
    if (!tt || cols <= 0 || n <= 0 || tt->vec_dot_type == KERN_T_F32)
        return 0;
    size_t xrow = wtype_row_bytes(tt->vec_dot_type, cols);
    if (type < KERN_T_COUNT && s->actq[type]) {
        size_t own = (size_t)((cols / KERN_QK + 1) / 2) * s->act_pair_bytes[type];
        xrow = own > xrow ? own : xrow;
    }
    if (type < KERN_T_COUNT && s->rp_gemm[type] && cols % wtype_info(type)->block_elems == 0) {
        /* kern_matmul_packed */
        size_t rp = kern__rp_act_bytes(type, cols);
        xrow = rp > xrow ? rp : xrow;
    }
    return (uint64_t)n > SIZE_MAX / (xrow ? xrow : 1) ? SIZE_MAX : (size_t)n * xrow;
}

int kern_matmul(struct kern_pool *p, uint32_t type, const void *w, int64_t rows, int64_t cols,
                const float *x, int64_t n, float *y)
{
    const struct kern__simd *s = kern__simd_get();
    const struct kern__type_traits *tt = kern__type_traits(type);
    if (!tt)
        return -EINVAL;
    kern__dot_fn dot = s->dot[type] ? s->dot[type] : tt->vec_dot;
    uint32_t vt = tt->vec_dot_type;
    size_t wrow = wtype_row_bytes(type, cols), xrow = wtype_row_bytes(vt, cols);
    if (!dot || rows < 0 || n < 0 || cols <= 0 || wrow == 0 || xrow == 0)
        return -EINVAL;
    kern__quant_fn quant = s->quant[vt];
    if (type < KERN_T_COUNT && s->actq[type]) { /* the SIMD level's own activation layout */
        quant = s->actq[type];
        xrow = (size_t)((cols / KERN_QK + 1) / 2) * s->act_pair_bytes[type];
    }
    if (rows == 0 || n == 0)
        return 0;

    if (type == KERN_T_F32 && n > KERN_ROWS_EXACT_MAX && rows >= 64 && n <= INT32_MAX && rows <= INT32_MAX &&
        cols <= INT32_MAX) {
        /* y (n x rows) = x (n x cols) . W^T */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)rows, (int)cols, 1.0f,
                    x, (int)cols, w, (int)cols, 0.0f, y, (int)rows);
        return 0;
    }

    struct mm_job j = {
        .w = w, .rows = rows, .cols = cols, .n = n, .y = y, .wrow = wrow, .xrow = xrow,
        .dot = dot, .dotn = s->dotn[type],
    };
    if (vt == KERN_T_F32) {
        j.xq = (char *)x; /* the activations are used as they are */
    } else {
        if ((uint64_t)n > SIZE_MAX / xrow)
            return -EINVAL;
        j.xq = p ? kern__pool_scratch(p, (size_t)n * xrow) : malloc((size_t)n * xrow);
        if (!j.xq)
            return p ? -ENOSPC : -ENOMEM;
        kern__act_quant(p, quant, vt, x, cols, n, j.xq, xrow);
    }
    /* Smallest work item: ~16 KB of weights (and at least 8 rows), so a claim (an atomic on
     * a shared line) stays well under the work it hands out. */
    int64_t chunk = (int64_t)(16384 / wrow);
    j.chunk = chunk < 8 ? 8 : chunk;
    j.max_chunk = (int64_t)((256 << 10) / wrow);
    atomic_store(&j.next, 0);
    kern__pool_run_dyn(p, compute_task, &j);
    if (!p && j.xq != (char *)x)
        free(j.xq);
    return 0;
}

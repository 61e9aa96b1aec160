/* test-kern-opencl: the "opencl" device against the scalar oracle (kern_ref_*), op by op, by
 * normalised MSE: every weight type's matmul (one and several activation rows, rows not a
 * multiple of the work-group's activation tile, K/32 not a multiple of 4) and embedding rows,
 * both with the device's own allocation cap and with a forced 4 KiB cap that splits the
 * weights over several allocations; the norms, RoPE, KV store, attention (F16 and F32 caches,
 * grouped heads, contexts longer than a work-group), the element-wise ops, the MoE router, the
 * causal conv, Gated DeltaNet and the row moves; the adreno layout (Q4_0/Q8_0 split,
 * transposed, read through images) on PoCL. The prompt GEMMs through CLBlast: every weight
 * type against the oracle and the fused kernels, rows exact below the threshold, a CLBlast
 * failure computed by the fused kernels, the threshold's settings. Every variant of the
 * kernels the device offers (work-group sizes, fp16, native subgroups) runs the op cases, one
 * log line each saying it ran or which extension the device lacks, and every variant is
 * compiled by clang-14's OpenCL front end. Then the program cache (the second open takes the
 * binary), -ENODEV naming what exists, and devices with settings of their own side by side.
 * Needs an OpenCL device: PoCL here (pocl-opencl-icd, a test package); without one every case
 * fails saying so. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/internal.h"
#include "tests/lib/kern_util.h"
#include "tests/lib/t.h"
#include "util/err.h"

#define FLOAT_BOUND 5e-6   /* f32 arithmetic in another order (ref rounds F16 x to f16) */
#define QUANT_BOUND 2e-4   /* ref quantises activations to Q8_0/Q8_K; opencl keeps f32 */
#define OP_BOUND 1e-9

static char cache[256];
static const char *weights_mode;   /* the weights setting of cl_open (NULL: auto) */

/* kern_dev_new_opts of "opencl" with settings o (err: KV_ERR_MAX bytes). */
static int cl_new(struct kern_dev **d, const struct kern_cl_opts *o, char *err)
{
    struct kern_dev_opts dopts = {.n_threads = 1, .cl = o};
    return kern_dev_new_opts(d, "opencl", &dopts, err, KV_ERR_MAX);
}

/* The kernels' variant the devices of cl_open_opts are built with (variants_run sets it;
 * zero fields: the defaults). */
static struct {
    int wg, fp16, subgroups;
} variant;

/* The opencl device with settings o (and the variant), failing the case without one. */
static struct kern_dev *cl_open_opts(const struct kern_cl_opts *o)
{
    char err[KV_ERR_MAX] = "";
    struct kern_dev *d = NULL;
    struct kern_cl_opts v = *o;
    v.wg = variant.wg ? variant.wg : v.wg;
    v.fp16 = variant.fp16 ? variant.fp16 : v.fp16;
    v.subgroups = variant.subgroups ? variant.subgroups : v.subgroups;
    int rc = cl_new(&d, &v, err);
    T_CHECK(rc == 0, "no OpenCL device to test on (install pocl-opencl-icd): %d %s", rc, err);
    return d;
}

/* The opencl device with allocations capped at cap bytes (0: the device's own cap). */
static struct kern_dev *cl_open(size_t cap)
{
    struct kern_cl_opts o = {.platform = -1, .device = -1, .alloc_cap = cap, .cache_dir = cache,
                             .weights = weights_mode};
    return cl_open_opts(&o);
}

static struct kern_buf *act(struct kern_dev *d, const void *src, size_t bytes)
{
    struct kern_buf *b = NULL;
    T_CHECK(kern_buf_new(&b, d, KERN_BUF_ACT, bytes, NULL) == 0, "act buffer %zu", bytes);
    if (b && src)
        T_CHECK(kern_buf_write(b, 0, src, bytes) == 0, "write");
    return b;
}

static void get(struct kern_buf *b, void *dst, size_t bytes)
{
    T_CHECK(b && kern_buf_read(b, 0, dst, bytes) == 0, "read");
}

#define A(b) kern_at_make((b), 0)

static float *fl(int64_t n, float sd)
{
    float *x = malloc((size_t)n * sizeof *x);
    ku_fill(x, n, sd);
    return x;
}

static const uint32_t types[] = {KERN_T_F32, KERN_T_F16, KERN_T_BF16, KERN_T_Q4_0, KERN_T_Q4_1,
                                 KERN_T_Q5_0, KERN_T_Q5_1, KERN_T_Q8_0, KERN_T_Q4_K,
                                 KERN_T_Q5_K, KERN_T_Q6_K};

static bool is_float(uint32_t t) { return t == KERN_T_F32 || t == KERN_T_F16 || t == KERN_T_BF16; }

/* A weight type's test shape: 37 rows (not a multiple of anything); columns 203 for the
 * float types (a short last unit), 224 (K/32 = 7) for the 32-blocks, 768 for the K types. */
static int64_t cols_of(uint32_t t)
{
    return is_float(t) ? 203 : kern_row_bytes(t, 32) ? 224 : 768;
}

/* The weights rows x cols of type t from gaussian floats, after `pad` rows of other ones (the
 * operand's offset is then not 0). */
static uint8_t *weights(uint32_t t, int64_t rows, int64_t cols, int64_t pad)
{
    size_t rb = kern_row_bytes(t, cols);
    uint8_t *w = malloc((size_t)(rows + pad) * rb);
    float *f = fl(cols, 1);
    for (int64_t r = 0; r < rows + pad; r++) {
        ku_fill(f, cols, 1);
        T_CHECK(kern_ref_quant_row(t, f, w + (size_t)r * rb, cols) == 0, "quant %u", t);
    }
    free(f);
    return w;
}

static void matmul_case(size_t cap)
{
    enum { R = 37, PAD = 3 };
    struct kern_dev *d = cl_open(cap);
    T_ASSERT(d, "dev");
    ku_seed(11);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        uint32_t t = types[ti];
        int64_t C = cols_of(t);
        size_t rb = kern_row_bytes(t, C);
        uint8_t *w = weights(t, R, C, PAD);
        struct kern_buf *wb = NULL;
        T_ASSERT(kern_buf_new(&wb, d, KERN_BUF_WEIGHT, (R + PAD) * rb, w) == 0, "weights");
        if (cap)
            T_CHECK(kern_cl_buf_pieces(wb) > 2, "%s: %zu bytes split at %zu: %d pieces",
                    kern_type_name(t), (R + PAD) * rb, cap, kern_cl_buf_pieces(wb));
        /* mapped in place (PoCL shares host memory: auto maps) or copied, every byte */
        struct kern_cl_info ci;
        T_ASSERT(kern_cl_info(d, &ci) == 0, "info");
        bool map = !weights_mode || !strcmp(weights_mode, "map");
        T_CHECK(ci.unified && !strcmp(ci.weights, map ? "map" : "copy"), "weights %s, unified %d",
                ci.weights, ci.unified);
        T_CHECK(map ? ci.weights_mapped >= (R + PAD) * rb && !ci.weights_copied
                    : ci.weights_copied >= (R + PAD) * rb && !ci.weights_mapped,
                "%s %s: %" PRIu64 " bytes mapped, %" PRIu64 " copied of %zu",
                kern_type_name(t), ci.weights, ci.weights_mapped, ci.weights_copied,
                (R + PAD) * rb);
        for (int64_t n = 1; n <= 5; n += 4) {
            float *x = fl(n * C, 1), y[5 * R], ref[5 * R];
            struct kern_buf *xb = act(d, x, (size_t)(n * C) * 4), *yb = act(d, NULL, sizeof y);
            T_CHECK(kern_dev_matmul(d, t, kern_at_make(wb, PAD * rb), R, C, A(xb), n, A(yb)) == 0,
                    "%s matmul", kern_type_name(t));
            get(yb, y, (size_t)(n * R) * 4);
            kern_ref_matmul(t, w + PAD * rb, R, C, x, n, ref);
            double e = t_nmse(y, ref, n * R), bound = is_float(t) ? FLOAT_BOUND : QUANT_BOUND;
            T_CHECK(e <= bound, "%s matmul %dx%d n=%d cap %zu: nmse %.3g > %.3g",
                    kern_type_name(t), R, (int)C, (int)n, cap, e, bound);
            kern_buf_free(xb);
            kern_buf_free(yb);
            free(x);
        }
        /* embedding rows: the first, the last, and ones across the pieces' seams */
        int32_t ids[] = {0, R + PAD - 1, 7, 8, 9, 21, 22, 30, 3};
        enum { NI = sizeof ids / sizeof ids[0] };
        float *out = malloc(NI * C * 4), *ref = malloc(NI * C * 4);
        struct kern_buf *ib = act(d, ids, sizeof ids), *ob = act(d, NULL, NI * C * 4);
        T_CHECK(kern_dev_get_rows(d, t, A(wb), R + PAD, C, A(ib), NI, A(ob)) == 0, "get_rows");
        get(ob, out, NI * C * 4);
        for (int i = 0; i < NI; i++)
            kern_ref_dequant_row(t, w + (size_t)ids[i] * rb, ref + i * C, C);
        double e = t_nmse(out, ref, NI * C);
        T_CHECK(e <= OP_BOUND, "%s get_rows cap %zu: nmse %.3g", kern_type_name(t), cap, e);
        kern_buf_free(ib);
        kern_buf_free(ob);
        free(out);
        free(ref);
        kern_buf_free(wb);
        free(w);
    }
    kern_dev_free(d);
}

T_CASE(matmul_every_type) { matmul_case(0); }
T_CASE(matmul_every_type_split) { matmul_case(4096); }
T_CASE(matmul_every_type_copy)
{
    weights_mode = "copy";
    matmul_case(0);
    matmul_case(4096);
    weights_mode = NULL;
}
T_CASE(matmul_every_type_map)
{
    weights_mode = "map";
    matmul_case(4096);
    weights_mode = NULL;
}

/* Weights whose bytes are not 16-byte aligned are copied even when mapping (the kernels' reads
 * keep the alignment an upload gives), and compute the same; freeing a buffer gives its bytes
 * back in the counts. */
T_CASE(map_unaligned_copies)
{
    enum { R = 37, C = 224 };
    weights_mode = "map";
    struct kern_dev *d = cl_open(0);
    weights_mode = NULL;
    T_ASSERT(d, "dev");
    ku_seed(5);
    uint32_t t = KERN_T_Q8_0;
    size_t rb = kern_row_bytes(t, C);
    uint8_t *w = weights(t, R, C, 0), *odd = malloc(R * rb + 64);
    uint8_t *at = odd + (16 - (uintptr_t)odd % 16) % 16 + 4;   /* 4 past a 16-byte boundary */
    memcpy(at, w, R * rb);
    struct kern_buf *wb = NULL, *wa = NULL;
    T_ASSERT(kern_buf_new(&wb, d, KERN_BUF_WEIGHT, R * rb, at) == 0, "weights");
    struct kern_cl_info ci;
    kern_cl_info(d, &ci);
    T_CHECK(ci.weights_copied == R * rb && ci.weights_mapped == 0,
            "unaligned: %" PRIu64 " mapped, %" PRIu64 " copied", ci.weights_mapped, ci.weights_copied);
    T_ASSERT(kern_buf_new(&wa, d, KERN_BUF_WEIGHT, R * rb, w) == 0, "weights");
    kern_cl_info(d, &ci);
    T_CHECK(ci.weights_mapped >= R * rb, "aligned malloc'd bytes not mapped: %" PRIu64, ci.weights_mapped);
    float *x = fl(C, 1), y[R], y2[R], ref[R];
    struct kern_buf *xb = act(d, x, C * 4), *yb = act(d, NULL, sizeof y);
    T_CHECK(kern_dev_matmul(d, t, A(wb), R, C, A(xb), 1, A(yb)) == 0, "matmul");
    get(yb, y, sizeof y);
    T_CHECK(kern_dev_matmul(d, t, A(wa), R, C, A(xb), 1, A(yb)) == 0, "matmul");
    get(yb, y2, sizeof y2);
    kern_ref_matmul(t, w, R, C, x, 1, ref);
    T_CHECK(t_nmse(y, ref, R) <= QUANT_BOUND && !memcmp(y, y2, sizeof y),
            "copied and mapped weights differ (nmse %.3g)", t_nmse(y, ref, R));
    kern_buf_free(wa);
    kern_buf_free(wb);
    kern_cl_info(d, &ci);
    T_CHECK(!ci.weights_mapped && !ci.weights_copied, "after free: %" PRIu64 " mapped, %" PRIu64 " copied",
            ci.weights_mapped, ci.weights_copied);
    kern_buf_free(xb);
    kern_buf_free(yb);
    kern_dev_free(d);
    free(x);
    free(w);
    free(odd);
}

/* The adreno layout on PoCL: Q4_0 and Q8_0 matrices split into scales and quants, transposed,
 * quants read as image texels; a slice of rows (an expert's) and embedding rows from it. */
T_CASE(adreno_layout)
{
    enum { R = 37, PAD = 5, C = 224 };
    struct kern_cl_opts o = {.platform = -1, .device = -1, .cache_dir = cache, .layout = "adreno"};
    struct kern_dev *d = cl_open_opts(&o);
    T_ASSERT(d, "open");
    struct kern_cl_info info;
    T_CHECK(kern_cl_info(d, &info) == 0 && !strcmp(info.layout, "adreno"), "layout %s", info.layout);
    ku_seed(13);
    const uint32_t ts[] = {KERN_T_Q4_0, KERN_T_Q8_0, KERN_T_Q4_K};
    for (int ti = 0; ti < 3; ti++) {
        uint32_t t = ts[ti];
        int64_t cols = t == KERN_T_Q4_K ? 256 : C;
        size_t rb = kern_row_bytes(t, cols);
        uint8_t *w = weights(t, R, cols, PAD);
        struct kern_buf *wb = NULL;
        T_ASSERT(kern_buf_new(&wb, d, KERN_BUF_WEIGHT, (R + PAD) * rb, w) == 0, "weights");
        for (int64_t n = 1; n <= 6; n += 5) {
            float *x = fl(n * cols, 1), y[6 * R], ref[6 * R];
            struct kern_buf *xb = act(d, x, (size_t)(n * cols) * 4), *yb = act(d, NULL, sizeof y);
            T_CHECK(kern_dev_matmul(d, t, kern_at_make(wb, PAD * rb), R, cols, A(xb), n, A(yb)) == 0,
                    "matmul");
            get(yb, y, (size_t)(n * R) * 4);
            kern_ref_matmul(t, w + PAD * rb, R, cols, x, n, ref);
            double e = t_nmse(y, ref, n * R);
            T_CHECK(e <= QUANT_BOUND, "%s split matmul n=%d: nmse %.3g", kern_type_name(t),
                    (int)n, e);
            kern_buf_free(xb), kern_buf_free(yb), free(x);
        }
        T_CHECK(kern_cl_buf_split(wb) == (t != KERN_T_Q4_K), "%s: split layout %d",
                kern_type_name(t), kern_cl_buf_split(wb));
        int32_t ids[] = {0, R + PAD - 1, 7, 3};
        float *out = malloc(4 * cols * 4), *ref = malloc(4 * cols * 4);
        struct kern_buf *ib = act(d, ids, sizeof ids), *ob = act(d, NULL, 4 * cols * 4);
        T_CHECK(kern_dev_get_rows(d, t, A(wb), R + PAD, cols, A(ib), 4, A(ob)) == 0, "get_rows");
        get(ob, out, 4 * cols * 4);
        for (int i = 0; i < 4; i++)
            kern_ref_dequant_row(t, w + (size_t)ids[i] * rb, ref + i * cols, cols);
        double e = t_nmse(out, ref, 4 * cols);
        T_CHECK(e <= OP_BOUND, "%s split get_rows: nmse %.3g", kern_type_name(t), e);
        kern_buf_free(ib), kern_buf_free(ob), free(out), free(ref);
        kern_buf_free(wb);
        free(w);
    }
    kern_dev_free(d);
}

/* ---- prompt GEMMs through CLBlast (docs/opencl.md, "Prompt GEMMs") ---- */

/* CLBlast's SGEMM on the dequantised tile against the fused kernels: f32 sums in another
 * order (seen on PoCL: at most 3e-13). Against the oracle the fused kernels' bounds hold
 * (seen: 8e-14 F32, 5e-8 F16, 3e-6 BF16, 3e-5 the 32-blocks, 5e-5 the K types). */
#define GEMM_FUSED_BOUND 1e-10
#define BLAST_LOCAL_MEM (-2046)   /* CLBlastInvalidLocalMemUsage, one of CLBlast's statuses */

/* The opencl device with prompt GEMMs from gemm_rows rows (negative: off), allocations capped
 * at cap (0: the device's), in layout (NULL: auto). */
static struct kern_dev *cl_gemm_open(int gemm_rows, size_t cap, const char *layout)
{
    struct kern_cl_opts o = {.platform = -1, .device = -1, .alloc_cap = cap, .cache_dir = cache,
                             .layout = layout, .gemm_rows = gemm_rows};
    return cl_open_opts(&o);
}

static uint64_t gemm_calls(struct kern_dev *d)
{
    struct kern_cl_info ci;
    return kern_cl_info(d, &ci) == 0 ? ci.gemm_calls : 0;
}

/* Every weight type's matmul at and above the threshold through CLBlast (the device says it
 * took that path) against the oracle and against the fused kernels of a device without
 * GEMMs; one row below it the fused kernels, bit for bit. cap splits the weights over
 * pieces and seams and shrinks the f32 tile to a few rows (several tiles a matmul); the
 * adreno layout dequantises its split Q4_0/Q8_0 matrices. */
static void gemm_case(size_t cap, const char *layout)
{
    enum { R = 37, PAD = 3, T = KERN_CL_GEMM_MIN, NMAX = T + 5 };
    struct kern_dev *d = cl_gemm_open(T, cap, layout), *f = cl_gemm_open(-1, cap, layout);
    T_ASSERT(d && f, "devices");
    ku_seed(17);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        uint32_t t = types[ti];
        int64_t C = cols_of(t);
        size_t rb = kern_row_bytes(t, C);
        uint8_t *w = weights(t, R, C, PAD);
        struct kern_buf *wd = NULL, *wf = NULL;
        T_ASSERT(kern_buf_new(&wd, d, KERN_BUF_WEIGHT, (R + PAD) * rb, w) == 0 &&
                 kern_buf_new(&wf, f, KERN_BUF_WEIGHT, (R + PAD) * rb, w) == 0, "weights");
        T_CHECK(kern_dev_rows_exact(d, t) == T - 1 && kern_dev_rows_exact(f, t) == UINT32_MAX,
                "%s: row-exact up to %u with GEMMs from %d, %u without", kern_type_name(t),
                kern_dev_rows_exact(d, t), T, kern_dev_rows_exact(f, t));
        double worst_ref = 0, worst_fused = 0;
        const int64_t ns[] = {T - 1, T, NMAX};
        for (int k = 0; k < 3; k++) {
            int64_t n = ns[k];
            float *x = fl(n * C, 1), *y = malloc(NMAX * R * 4), *yf = malloc(NMAX * R * 4),
                  *ref = malloc(NMAX * R * 4);
            struct kern_buf *xd = act(d, x, (size_t)(n * C) * 4), *yd = act(d, NULL, NMAX * R * 4);
            struct kern_buf *xf = act(f, x, (size_t)(n * C) * 4), *yb = act(f, NULL, NMAX * R * 4);
            uint64_t before = gemm_calls(d);
            T_CHECK(kern_dev_matmul(d, t, kern_at_make(wd, PAD * rb), R, C, A(xd), n, A(yd)) == 0 &&
                    kern_dev_matmul(f, t, kern_at_make(wf, PAD * rb), R, C, A(xf), n, A(yb)) == 0,
                    "%s matmul n=%d", kern_type_name(t), (int)n);
            get(yd, y, (size_t)(n * R) * 4);
            get(yb, yf, (size_t)(n * R) * 4);
            kern_ref_matmul(t, w + PAD * rb, R, C, x, n, ref);
            uint64_t took = gemm_calls(d) - before;
            if (n < T) {
                T_CHECK(took == 0 && !memcmp(y, yf, (size_t)(n * R) * 4),
                        "%s n=%d (below the threshold): %" PRIu64 " GEMMs, fused kernels' bits %s",
                        kern_type_name(t), (int)n, took, memcmp(y, yf, (size_t)(n * R) * 4) ? "differ" : "kept");
            } else {
                double er = t_nmse(y, ref, n * R), ef = t_nmse(y, yf, n * R);
                double bound = is_float(t) ? FLOAT_BOUND : QUANT_BOUND;
                T_CHECK(took == 1, "%s n=%d cap %zu: %" PRIu64 " matmuls through CLBlast, want 1",
                        kern_type_name(t), (int)n, cap, took);
                T_CHECK(er <= bound, "%s GEMM n=%d cap %zu: nmse vs ref %.3g > %.3g",
                        kern_type_name(t), (int)n, cap, er, bound);
                T_CHECK(ef <= GEMM_FUSED_BOUND, "%s GEMM n=%d cap %zu: nmse vs fused %.3g > %.3g",
                        kern_type_name(t), (int)n, cap, ef, GEMM_FUSED_BOUND);
                worst_ref = er > worst_ref ? er : worst_ref;
                worst_fused = ef > worst_fused ? ef : worst_fused;
            }
            kern_buf_free(xd), kern_buf_free(yd), kern_buf_free(xf), kern_buf_free(yb);
            free(x), free(y), free(yf), free(ref);
        }
        printf("gemm %-5s cap %-5zu %-6s nmse vs ref %.3g, vs fused %.3g\n", kern_type_name(t),
               cap, layout ? layout : "plain", worst_ref, worst_fused);
        struct kern_cl_info ci;
        T_CHECK(kern_cl_info(d, &ci) == 0 && ci.gemm_tile_bytes > 0 &&
                ci.gemm_tile_bytes <= (cap ? cap : (size_t)32 << 20),
                "the f32 tile: %" PRIu64 " bytes (cap %zu)", ci.gemm_tile_bytes, cap);
        kern_buf_free(wd);
        kern_buf_free(wf);
        free(w);
    }
    kern_dev_free(d);
    kern_dev_free(f);
}

T_CASE(gemm_every_type) { gemm_case(0, NULL); }

/* A prompt-sized GEMM (96 rows by 2000 x 1024 weights), where CLBlast takes its indirect
 * kernel with padded copies in its temporary buffer (the device reports one), for an F32
 * weight (multiplied where it lies) and a quantised one, against the oracle and the fused
 * kernels. */
T_CASE(gemm_large)
{
    enum { R = 2000, C = 1024, N = 96, T = KERN_CL_GEMM_MIN };
    struct kern_dev *d = cl_gemm_open(T, 0, NULL), *f = cl_gemm_open(-1, 0, NULL);
    T_ASSERT(d && f, "devices");
    ku_seed(29);
    const uint32_t ts[] = {KERN_T_F32, KERN_T_Q4_K};
    float *x = fl(N * C, 1), *y = malloc((size_t)N * R * 4), *yf = malloc((size_t)N * R * 4),
          *ref = malloc((size_t)N * R * 4);
    for (int ti = 0; ti < 2; ti++) {
        uint32_t t = ts[ti];
        size_t rb = kern_row_bytes(t, C);
        uint8_t *w = weights(t, R, C, 0);
        struct kern_buf *wd = NULL, *wf = NULL, *xd = act(d, x, N * C * 4),
                        *yd = act(d, NULL, (size_t)N * R * 4), *xf = act(f, x, N * C * 4),
                        *yb = act(f, NULL, (size_t)N * R * 4);
        T_ASSERT(kern_buf_new(&wd, d, KERN_BUF_WEIGHT, R * rb, w) == 0 &&
                 kern_buf_new(&wf, f, KERN_BUF_WEIGHT, R * rb, w) == 0, "weights");
        uint64_t before = gemm_calls(d);
        T_CHECK(kern_dev_matmul(d, t, A(wd), R, C, A(xd), N, A(yd)) == 0 &&
                kern_dev_matmul(f, t, A(wf), R, C, A(xf), N, A(yb)) == 0, "matmul");
        get(yd, y, (size_t)N * R * 4);
        get(yb, yf, (size_t)N * R * 4);
        kern_ref_matmul(t, w, R, C, x, N, ref);
        double er = t_nmse(y, ref, N * R), ef = t_nmse(y, yf, N * R);
        double bound = is_float(t) ? FLOAT_BOUND : QUANT_BOUND;
        T_CHECK(gemm_calls(d) == before + 1, "%s: not through CLBlast", kern_type_name(t));
        T_CHECK(er <= bound && ef <= GEMM_FUSED_BOUND, "%s %dx%dx%d: nmse vs ref %.3g, vs fused %.3g",
                kern_type_name(t), N, R, C, er, ef);
        printf("gemm %-5s %dx%dx%d nmse vs ref %.3g, vs fused %.3g\n", kern_type_name(t), N, R,
               C, er, ef);
        kern_buf_free(wd), kern_buf_free(wf), kern_buf_free(xd), kern_buf_free(yd);
        kern_buf_free(xf), kern_buf_free(yb);
        free(w);
    }
    struct kern_cl_info ci;
    T_CHECK(kern_cl_info(d, &ci) == 0 && ci.gemm_tmp_bytes > 0 && ci.gemm_tmp_bytes <= ci.max_alloc,
            "CLBlast's temporary buffer: %" PRIu64 " bytes (its indirect kernel not taken?)",
            ci.gemm_tmp_bytes);
    printf("tile %" PRIu64 " bytes, CLBlast's temporary buffer %" PRIu64 " bytes\n",
           ci.gemm_tile_bytes, ci.gemm_tmp_bytes);
    kern_dev_free(d);
    kern_dev_free(f);
    free(x), free(y), free(yf), free(ref);
}
T_CASE(gemm_every_type_split) { gemm_case(4096, NULL); }
T_CASE(gemm_adreno_layout) { gemm_case(0, "adreno"); }

/* What batching across sessions relies on: below the GEMM threshold a row's result is the one
 * it has alone, bit for bit, for every type (kern_dev_rows_exact's promise). */
T_CASE(gemm_rows_exact_below)
{
    enum { R = 37, T = KERN_CL_GEMM_MIN };
    struct kern_dev *d = cl_gemm_open(T, 0, NULL);
    T_ASSERT(d, "dev");
    ku_seed(19);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        uint32_t t = types[ti];
        int64_t C = cols_of(t), n = kern_dev_rows_exact(d, t);
        size_t rb = kern_row_bytes(t, C);
        uint8_t *w = weights(t, R, C, 0);
        float *x = fl(n * C, 1), *y = malloc((size_t)(n * R) * 4), one[R];
        struct kern_buf *wb = NULL, *xb = act(d, x, (size_t)(n * C) * 4),
                        *yb = act(d, NULL, (size_t)(n * R) * 4);
        T_ASSERT(kern_buf_new(&wb, d, KERN_BUF_WEIGHT, R * rb, w) == 0, "weights");
        T_CHECK(kern_dev_matmul(d, t, A(wb), R, C, A(xb), n, A(yb)) == 0, "matmul");
        get(yb, y, (size_t)(n * R) * 4);
        for (int64_t i = 0; i < n; i += 7) {
            T_CHECK(kern_dev_matmul(d, t, A(wb), R, C, kern_at_make(xb, (size_t)(i * C) * 4), 1,
                                    A(yb)) == 0, "one row");
            get(yb, one, sizeof one);
            T_CHECK(!memcmp(one, y + i * R, sizeof one), "%s: row %d of %d differs from alone",
                    kern_type_name(t), (int)i, (int)n);
        }
        kern_buf_free(wb), kern_buf_free(xb), kern_buf_free(yb);
        free(w), free(x), free(y);
    }
    kern_dev_free(d);
}

/* A GEMM that CLBlast fails (an error status) is computed by the fused kernels instead, bit
 * for bit what a device without GEMMs gives; the device says why and keeps to its own kernels
 * from then on (and then promises row-exactness at any number of rows). */
T_CASE(gemm_failure_falls_back)
{
    enum { R = 37, T = KERN_CL_GEMM_MIN, N = T + 2 };
    struct kern_dev *d = cl_gemm_open(T, 0, NULL), *f = cl_gemm_open(-1, 0, NULL);
    T_ASSERT(d && f, "devices");
    ku_seed(23);
    uint32_t t = KERN_T_Q4_K;
    int64_t C = cols_of(t);
    size_t rb = kern_row_bytes(t, C);
    uint8_t *w = weights(t, R, C, 0);
    float *x = fl(N * C, 1), y[N * R], yf[N * R];
    struct kern_buf *wd = NULL, *wf = NULL, *xd = act(d, x, N * C * 4), *yd = act(d, NULL, sizeof y);
    struct kern_buf *xf = act(f, x, N * C * 4), *yb = act(f, NULL, sizeof yf);
    T_ASSERT(kern_buf_new(&wd, d, KERN_BUF_WEIGHT, R * rb, w) == 0 &&
             kern_buf_new(&wf, f, KERN_BUF_WEIGHT, R * rb, w) == 0, "weights");
    T_CHECK(kern__cl_gemm_fault(d, BLAST_LOCAL_MEM) == 0, "fault");
    T_CHECK(kern_dev_matmul(d, t, A(wd), R, C, A(xd), N, A(yd)) == 0, "matmul after a failure");
    T_CHECK(kern_dev_matmul(f, t, A(wf), R, C, A(xf), N, A(yb)) == 0, "fused");
    get(yd, y, sizeof y);
    get(yb, yf, sizeof yf);
    T_CHECK(!memcmp(y, yf, sizeof y), "the failed GEMM's rows are not the fused kernels'");
    struct kern_cl_info ci;
    T_ASSERT(kern_cl_info(d, &ci) == 0, "info");
    T_CHECK(ci.gemm_fallbacks == 1 && ci.gemm_calls == 0 && ci.gemm_rows == 0,
            "fallbacks %" PRIu64 ", calls %" PRIu64 ", rows %u", ci.gemm_fallbacks, ci.gemm_calls,
            ci.gemm_rows);
    T_CHECK(strstr(ci.gemm_error, "CLBlast SGEMM") && strstr(ci.gemm_error, "-2046") &&
            strstr(ci.gemm_error, "local memory"), "says why: %s", ci.gemm_error);
    printf("%s\n", ci.gemm_error);
    T_CHECK(kern_dev_rows_exact(d, t) == UINT32_MAX, "row-exact at any number once off");
    /* the device stays on its own kernels: the next matmul does not call CLBlast */
    T_CHECK(kern__cl_gemm_fault(d, 0) == 0 &&
            kern_dev_matmul(d, t, A(wd), R, C, A(xd), N, A(yd)) == 0 && gemm_calls(d) == 0,
            "GEMMs stay off");
    T_CHECK(kern__cl_gemm_fault(NULL, 1) == -EINVAL, "not an opencl device");
    kern_buf_free(wd), kern_buf_free(wf), kern_buf_free(xd), kern_buf_free(yd);
    kern_buf_free(xf), kern_buf_free(yb);
    kern_dev_free(d);
    kern_dev_free(f);
    free(w), free(x);
}

/* The threshold: the option, KV_CL_GEMM_ROWS ("off", a number), the default; below
 * KERN_CL_GEMM_MIN or not a number refused, naming the value. */
T_CASE(gemm_options)
{
    char err[KV_ERR_MAX] = "";
    struct kern_dev *d = NULL;
    struct kern_cl_info ci;
    unsetenv("KV_CL_GEMM_ROWS");
    struct kern_cl_opts o = {.platform = -1, .device = -1, .cache_dir = cache};
    T_ASSERT(cl_new(&d, &o, err) == 0 && kern_cl_info(d, &ci) == 0, "default: %s", err);
    T_CHECK(ci.gemm_rows == KERN_CL_GEMM_MIN, "default threshold %u", ci.gemm_rows);
    kern_dev_free(d);
    static const struct { const char *env; int opt, rc; uint32_t rows; const char *says; } c[] = {
        {"off", 0, 0, 0, NULL}, {"0", 0, 0, 0, NULL}, {"24", 0, 0, 24, NULL},
        {"24", 40, 0, 40, NULL}, {"24", -1, 0, 0, NULL}, {NULL, 8, -EINVAL, 0, "GEMM rows 8"},
        {"8", 0, -EINVAL, 0, "KV_CL_GEMM_ROWS 8"}, {"lots", 0, -EINVAL, 0, "KV_CL_GEMM_ROWS lots"},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        if (c[i].env)
            setenv("KV_CL_GEMM_ROWS", c[i].env, 1);
        else
            unsetenv("KV_CL_GEMM_ROWS");
        o.gemm_rows = c[i].opt;
        d = NULL;
        int rc = cl_new(&d, &o, err);
        T_CHECK(rc == c[i].rc, "env %s, option %d: %d, want %d (%s)", c[i].env ? c[i].env : "-",
                c[i].opt, rc, c[i].rc, err);
        if (rc == 0)
            T_CHECK(kern_cl_info(d, &ci) == 0 && ci.gemm_rows == c[i].rows,
                    "env %s, option %d: threshold %u, want %u", c[i].env ? c[i].env : "-",
                    c[i].opt, ci.gemm_rows, c[i].rows);
        else
            T_CHECK(!d && strstr(err, c[i].says) && strstr(err, "16"), "message: %s", err);
        kern_dev_free(d);
    }
    unsetenv("KV_CL_GEMM_ROWS");
}

/* The kernels' variants for devices PoCL is not (cl_khr_fp16 arithmetic, native subgroup
 * reductions, other work-group sizes) compile in clang's OpenCL front end. */
T_CASE(variants_compile)
{
    extern const unsigned char kern__cl_src[];
    extern const unsigned long kern__cl_src_len;
    char src[300];
    snprintf(src, sizeof src, "%s-kern.cl", cache);
    FILE *f = fopen(src, "wb");
    T_ASSERT(f && fwrite(kern__cl_src, 1, kern__cl_src_len, f) == kern__cl_src_len, "write");
    fclose(f);
    static const char *const variants[] = {
        "-cl-std=CL2.0 -DKV_SUBGROUPS -DKV_FP16 -DKV_WG=64",
        "-cl-std=CL2.0 -DKV_SUBGROUPS -DKV_WG=128",
        "-cl-std=CL2.0 -DKV_FP16 -DKV_WG=128",
        "-cl-std=CL1.2 -DKV_WG=256",
    };
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "clang-14 -x cl %s -Xclang -finclude-default-header "
                 "-fsyntax-only -Werror '%s' 2>&1", variants[i], src);
        T_CHECK(system(cmd) == 0, "clang-14 (a test package) compiles the kernels with %s",
                variants[i]);
    }
    unlink(src);
}

/* Every variant of the kernels the device offers runs the op cases against the oracle (every
 * weight type's matmul plain and split at 4 KiB, the adreno layout, the norms, RoPE, the
 * element-wise ops and attention); each variant gets one line in the log saying it ran (and
 * how it went) or which extension the device lacks (then only variants_compile checks it,
 * for syntax), and asking a device for a variant it lacks is refused, naming it. */
static void norms_rope_elementwise(void);
static void kv_store_attention(void);

T_CASE(variants_run)
{
    struct kern_cl_opts o = {.platform = -1, .device = -1, .cache_dir = cache};
    struct kern_dev *d = cl_open_opts(&o);
    T_ASSERT(d, "dev");
    struct kern_cl_info ci;
    T_ASSERT(kern_cl_info(d, &ci) == 0, "info");
    kern_dev_free(d);
    static const struct {
        const char *name;
        int wg, fp16, subgroups;
    } vs[] = {
        {"work-groups of 32 (KV_WG=32)", 32, 0, 0},
        {"work-groups of 128 (KV_WG=128)", 128, 0, 0},
        {"work-groups of 256 (KV_WG=256)", 256, 0, 0},
        {"fp16 (KV_FP16: half arithmetic in the split dequantiser, cl_khr_fp16)", 0, 1, 0},
        {"subgroups (KV_SUBGROUPS: native subgroup reductions, cl_khr_subgroups)", 0, 0, 1},
        {"fp16 and subgroups", 0, 1, 1},
    };
    printf("variant work-groups of 64 (KV_WG=64, the default): RAN on %s: every case of this "
           "test\n", ci.device);
    for (size_t i = 0; i < sizeof vs / sizeof vs[0]; i++) {
        struct kern_cl_opts vo = {.platform = -1, .device = -1, .cache_dir = cache,
                                  .wg = vs[i].wg, .fp16 = vs[i].fp16, .subgroups = vs[i].subgroups};
        char err[KV_ERR_MAX] = "", lacks[300] = "";
        if (vs[i].fp16 && !ci.has_fp16)
            snprintf(lacks, sizeof lacks, "cl_khr_fp16");
        if (vs[i].subgroups && !ci.has_subgroups)
            snprintf(lacks + strlen(lacks), sizeof lacks - strlen(lacks), "%scl_khr_subgroups",
                     lacks[0] ? " and " : "");
        if (vs[i].wg && (size_t)vs[i].wg > ci.max_wg)
            snprintf(lacks, sizeof lacks, "work-groups of %d (at most %zu)", vs[i].wg, ci.max_wg);
        d = NULL;
        int rc = cl_new(&d, &vo, err);
        if (lacks[0]) {
            T_CHECK(rc == -ENODEV && !d && strstr(err, vs[i].fp16 && !ci.has_fp16 ? "cl_khr_fp16"
                                                                                   : "cl_khr_subgroups"),
                    "%s asked of a device without it: %d %s", vs[i].name, rc, err);
            printf("variant %s: NOT RUN: %s lacks %s (compiled for syntax only: variants_compile)\n",
                   vs[i].name, ci.device, lacks);
            kern_dev_free(d);
            continue;
        }
        struct kern_cl_info vi;
        if (rc == -EINVAL && strstr(err, "at most")) {   /* its compiled kernels take fewer */
            printf("variant %s: NOT RUN: %s: %s\n", vs[i].name, ci.device, err);
            continue;
        }
        T_ASSERT(rc == 0 && kern_cl_info(d, &vi) == 0, "%s: %d %s", vs[i].name, rc, err);
        T_CHECK((!vs[i].wg || vi.wg == vs[i].wg) && vi.fp16 == (vs[i].fp16 > 0) &&
                vi.subgroups == (vs[i].subgroups > 0), "%s: built with wg %d, fp16 %d, subgroups %d",
                vs[i].name, vi.wg, vi.fp16, vi.subgroups);
        kern_dev_free(d);
        int failed = t_failures;
        variant.wg = vs[i].wg, variant.fp16 = vs[i].fp16, variant.subgroups = vs[i].subgroups;
        matmul_case(0);
        matmul_case(4096);
        adreno_layout();
        norms_rope_elementwise();
        kv_store_attention();
        variant.wg = variant.fp16 = variant.subgroups = 0;
        printf("variant %s: RAN on %s (matmul every type, split weights, adreno layout, norms, "
               "RoPE, element-wise, attention): %s\n", vs[i].name, ci.device,
               t_failures == failed ? "agrees with the oracle" : "FAILED");
    }
    /* the environment's settings: a value that is neither on nor off is refused */
    char err[KV_ERR_MAX] = "";
    setenv("KV_CL_FP16", "maybe", 1);
    d = NULL;
    T_CHECK(cl_new(&d, &o, err) == -EINVAL && !d && strstr(err, "KV_CL_FP16 maybe"), "%s", err);
    setenv("KV_CL_FP16", ci.has_fp16 ? "on" : "off", 1);
    setenv("KV_CL_SUBGROUPS", ci.has_subgroups ? "1" : "0", 1);
    struct kern_cl_info vi;
    T_CHECK(cl_new(&d, &o, err) == 0 && kern_cl_info(d, &vi) == 0 && vi.fp16 == ci.has_fp16 &&
            vi.subgroups == ci.has_subgroups, "every variant the device offers: %s", err);
    kern_dev_free(d);
    unsetenv("KV_CL_FP16");
    unsetenv("KV_CL_SUBGROUPS");
}

/* out of the device and ref of n floats agree within OP_BOUND */
#define SAME(what, b, ref, n)                                                           \
    do {                                                                                \
        float *got_ = malloc((size_t)(n) * 4);                                          \
        get((b), got_, (size_t)(n) * 4);                                                \
        double e_ = t_nmse(got_, (ref), (n));                                           \
        T_CHECK(e_ <= OP_BOUND, "%s: nmse %.3g", (what), e_);                           \
        free(got_);                                                                     \
    } while (0)

T_CASE(norms_rope_elementwise)
{
    struct kern_dev *d = cl_open(0);
    T_ASSERT(d, "dev");
    ku_seed(3);
    enum { N = 3, C = 301 };
    float *x = fl(N * C, 2), *w = fl(C, 1), *z = fl(N * C, 1), *ref = malloc(N * C * 4);
    struct kern_buf *xb = act(d, x, N * C * 4), *wb = act(d, w, C * 4), *zb = act(d, z, N * C * 4);
    struct kern_buf *ob = act(d, NULL, N * C * 4);
    T_CHECK(kern_dev_rmsnorm_rows(d, A(ob), A(xb), A(wb), N, C, 1e-5f) == 0, "rmsnorm");
    for (int r = 0; r < N; r++)
        kern_ref_rmsnorm(ref + r * C, x + r * C, w, C, 1e-5f);
    SAME("rmsnorm_rows", ob, ref, N * C);
    T_CHECK(kern_dev_rmsnorm_silu(d, A(ob), A(xb), A(wb), A(zb), N, C, 1e-6f) == 0, "norm silu");
    kern_ref_rmsnorm_silu(ref, x, w, z, N, C, 1e-6f);
    SAME("rmsnorm_silu", ob, ref, N * C);

    /* l2norm over 3 heads of 37 in rows 120 apart */
    float *l = fl(N * 120, 1);
    struct kern_buf *lb = act(d, l, N * 120 * 4);
    T_CHECK(kern_dev_l2norm(d, A(lb), N, 120, 3, 37, 1e-6f) == 0, "l2norm");
    kern_ref_l2norm(l, N, 120, 3, 37, 1e-6f);
    SAME("l2norm", lb, l, N * 120);

    /* RoPE: angles with and without divisors; rows of 5 heads of 24 with 16 rotated, both modes */
    enum { NR = 16, HALF = NR / 2, NH = 5, HD = 24, ST = NH * HD + 7 };
    float cs[N * HALF], sn[N * HALF], div[HALF], rcs[N * HALF], rsn[N * HALF];
    for (int i = 0; i < HALF; i++)
        div[i] = 1.0f + (float)i * 0.5f;
    struct kern_buf *cb = act(d, NULL, sizeof cs), *sb = act(d, NULL, sizeof sn);
    struct kern_buf *db = act(d, div, sizeof div);
    for (int wd = 0; wd < 2; wd++) {
        T_CHECK(kern_dev_rope_angles(d, A(cb), A(sb), N, 17, NR, 10000.0f, 0.5f,
                                     kern_at_make(wd ? db : NULL, 0)) == 0, "angles");
        kern_ref_rope_angles(rcs, rsn, N, 17, NR, 10000.0f, 0.5f, wd ? div : NULL);
        SAME("rope cos", cb, rcs, N * HALF);
        SAME("rope sin", sb, rsn, N * HALF);
    }
    for (int neox = 0; neox < 2; neox++) {
        float *r = fl(N * ST, 1);
        struct kern_buf *rb = act(d, r, N * ST * 4);
        T_CHECK(kern_dev_rope_rows(d, A(rb), N, ST, NH, HD, NR, A(cb), A(sb), neox) == 0, "rope");
        kern_ref_rope_rows(r, N, ST, NH, HD, NR, rcs, rsn, neox);
        SAME(neox ? "rope neox" : "rope normal", rb, r, N * ST);
        kern_buf_free(rb);
        free(r);
    }

    /* element-wise */
    enum { E = 1001 };
    float *a = fl(E, 2), *g = fl(E, 2), *e = malloc(E * 4);
    struct kern_buf *ab = act(d, a, E * 4), *gb = act(d, g, E * 4), *eb = act(d, NULL, E * 4);
    T_CHECK(kern_dev_swiglu(d, A(eb), A(ab), A(gb), E) == 0, "swiglu");
    kern_ref_swiglu(e, a, g, E);
    SAME("swiglu", eb, e, E);
    T_CHECK(kern_dev_add(d, A(eb), A(ab), E) == 0, "add");
    kern_ref_add(e, a, E);
    SAME("add", eb, e, E);
    T_CHECK(kern_dev_add_rows(d, A(eb), A(gb), 7, 143) == 0, "add_rows");
    kern_ref_add_rows(e, g, 7, 143);
    SAME("add_rows", eb, e, E);
    T_CHECK(kern_dev_mul_sigmoid(d, A(eb), A(gb), E) == 0, "mul_sigmoid");
    kern_ref_mul_sigmoid(e, g, E);
    SAME("mul_sigmoid", eb, e, E);
    T_CHECK(kern_dev_sigmoid(d, A(eb), E) == 0, "sigmoid");
    kern_ref_sigmoid(e, E);
    SAME("sigmoid", eb, e, E);

    /* axpy rows: 4 rows into rows 5, 0, 2, 1 of 6; then in place */
    enum { AC = 77 };
    float *y = fl(6 * AC, 1), *xs = fl(4 * AC, 1), coef[4] = {0.5f, -1.0f, 2.0f, 0.25f};
    uint32_t idx[4] = {5, 0, 2, 1};
    struct kern_buf *yb = act(d, y, 6 * AC * 4), *xsb = act(d, xs, 4 * AC * 4);
    struct kern_buf *cfb = act(d, coef, sizeof coef), *ixb = act(d, idx, sizeof idx);
    T_CHECK(kern_dev_axpy_rows(d, A(yb), 6, A(cfb), A(xsb), A(ixb), 4, AC) == 0, "axpy idx");
    kern_ref_axpy_rows(y, coef, xs, idx, 4, AC);
    SAME("axpy_rows idx", yb, y, 6 * AC);
    T_CHECK(kern_dev_axpy_rows(d, A(yb), 6, A(cfb), A(xsb), kern_at_make(NULL, 0), 4, AC) == 0,
            "axpy");
    kern_ref_axpy_rows(y, coef, xs, NULL, 4, AC);
    SAME("axpy_rows", yb, y, 6 * AC);

    /* causal conv: 5 outputs, 3 taps, 19 channels */
    float *cx = fl(7 * 19, 1), *cw = fl(19 * 3, 1), co[5 * 19];
    struct kern_buf *cxb = act(d, cx, 7 * 19 * 4), *cwb = act(d, cw, 19 * 3 * 4);
    struct kern_buf *cob = act(d, NULL, sizeof co);
    T_CHECK(kern_dev_conv_silu(d, A(cob), A(cxb), A(cwb), 5, 19, 3) == 0, "conv");
    kern_ref_conv_silu(co, cx, cw, 5, 19, 3);
    SAME("conv_silu", cob, co, 5 * 19);

    struct kern_buf *all[] = {xb, wb, zb, ob, lb, cb, sb, db, ab, gb, eb, yb, xsb, cfb, ixb,
                              cxb, cwb, cob};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        kern_buf_free(all[i]);
    free(x), free(w), free(z), free(ref), free(l), free(a), free(g), free(e), free(y), free(xs);
    free(cx), free(cw);
    kern_dev_free(d);
}

/* Attention after a KV store, both cache types: 6 heads on 2 KV heads of 40, three new rows at
 * positions 147..149 (longer than a work-group), rows 2*40+5 apart in the cache. */
T_CASE(kv_store_attention)
{
    struct kern_dev *d = cl_open(0);
    T_ASSERT(d, "dev");
    ku_seed(5);
    enum { H = 6, KVH = 2, HD = 40, P = 150, N = 3, KS = KVH * HD + 5 };
    float *kv = fl(P * KVH * HD, 1), *q = fl(N * H * HD, 1), *o = malloc(N * H * HD * 4);
    float *sc = malloc(P * 4);
    for (int f16 = 0; f16 < 2; f16++) {
        uint32_t t = f16 ? KERN_T_F16 : KERN_T_F32;
        size_t es = f16 ? 2 : 4;
        void *cache = calloc(P * KS, es);
        struct kern_buf *kvb = act(d, kv, P * KVH * HD * 4), *qb = act(d, q, N * H * HD * 4);
        struct kern_buf *cb = NULL, *ob = act(d, NULL, N * H * HD * 4);
        T_ASSERT(kern_buf_new(&cb, d, KERN_BUF_STATE, P * KS * es, NULL) == 0, "cache");
        T_CHECK(kern_dev_kv_store(d, t, A(cb), KS, A(kvb), P, KVH * HD) == 0, "store");
        kern_ref_kv_store(t, cache, KS, kv, P, KVH * HD);
        void *got = malloc(P * KS * es);
        get(cb, got, P * KS * es);
        T_CHECK(!memcmp(got, cache, P * KS * es), "kv_store %s is ref's", f16 ? "f16" : "f32");
        T_CHECK(kern_dev_attention(d, t, A(ob), A(qb), A(cb), A(cb), N, P - N, H, KVH, HD, KS,
                                   0.15f) == 0, "attention");
        kern_ref_attention(t, o, q, cache, cache, N, P - N, H, KVH, HD, KS, 0.15f, sc);
        float *oo = malloc(N * H * HD * 4);
        get(ob, oo, N * H * HD * 4);
        double e = t_nmse(oo, o, N * H * HD);
        /* f16: the weights are rounded before normalising here, after in ref */
        T_CHECK(e <= (f16 ? 1e-6 : OP_BOUND), "attention %s: nmse %.3g", f16 ? "f16" : "f32", e);
        free(oo), free(got), free(cache);
        kern_buf_free(kvb), kern_buf_free(qb), kern_buf_free(cb), kern_buf_free(ob);
    }
    free(kv), free(q), free(o), free(sc);
    kern_dev_free(d);
}

T_CASE(moe_deltanet_moves)
{
    struct kern_dev *d = cl_open(0);
    T_ASSERT(d, "dev");
    ku_seed(9);
    /* router: 5 tokens, 13 experts, top 4 */
    enum { T = 5, NE = 13, K = 4 };
    float *lg = fl(T * NE, 2), wr[T * K], wo[T * K];
    uint32_t sel[T * K], selo[T * K];
    struct kern_buf *lb = act(d, lg, T * NE * 4), *sb = act(d, NULL, sizeof sel);
    struct kern_buf *wb = act(d, NULL, sizeof wo);
    T_CHECK(kern_dev_moe_route(d, A(sb), A(wb), A(lb), T, NE, K) == 0, "route");
    kern_ref_moe_route(sel, wr, lg, T, NE, K);
    get(sb, selo, sizeof selo);
    T_CHECK(!memcmp(sel, selo, sizeof sel), "moe_route picks ref's experts");
    SAME("moe_route weights", wb, wr, T * K);
    SAME("moe_route probabilities", lb, lg, T * NE);

    /* DeltaNet: 4 tokens, 2 key heads, 4 value heads of 16, q/k/v rows 150 apart */
    enum { N = 4, KH = 2, VH = 4, D = 16, ST = 150 };
    float *qkv = fl(N * ST, 0.5f), *S = fl(VH * D * D, 0.1f), *beta = fl(N * VH, 1);
    float *alpha = fl(N * VH, 1), dt[VH], aa[VH], *o = malloc(N * VH * D * 4);
    float *scr = malloc(2 * D * 4);
    for (int h = 0; h < VH; h++)
        dt[h] = 0.1f * (float)h, aa[h] = -0.5f - 0.1f * (float)h;
    struct kern_buf *qb = act(d, qkv, N * ST * 4), *Sb = NULL, *bb = act(d, beta, N * VH * 4);
    T_ASSERT(kern_buf_new(&Sb, d, KERN_BUF_STATE, VH * D * D * 4, NULL) == 0, "state");
    kern_buf_write(Sb, 0, S, VH * D * D * 4);
    struct kern_buf *ab = act(d, alpha, N * VH * 4), *dtb = act(d, dt, sizeof dt);
    struct kern_buf *aab = act(d, aa, sizeof aa), *ob = act(d, NULL, N * VH * D * 4);
    T_CHECK(kern_dev_deltanet(d, A(ob), A(Sb), kern_at_make(qb, 0), kern_at_make(qb, 4 * KH * D),
                              kern_at_make(qb, 8 * KH * D), ST, A(bb), A(ab), A(dtb), A(aab), N,
                              KH, VH, D) == 0, "deltanet");
    kern_ref_deltanet(o, S, qkv, qkv + KH * D, qkv + 2 * KH * D, ST, beta, alpha, dt, aa, N, KH,
                      VH, D, scr);
    SAME("deltanet out", ob, o, N * VH * D);
    SAME("deltanet state", Sb, S, VH * D * D);

    /* copy_rows: gathered odd-sized rows, then word-aligned strided ones; zero */
    uint8_t src[6 * 23], dst[4 * 29], ref[4 * 29];
    for (size_t i = 0; i < sizeof src; i++)
        src[i] = (uint8_t)(i * 7 + 1);
    uint32_t idx[4] = {5, 1, 1, 3};
    struct kern_buf *srb = act(d, src, sizeof src), *dsb = act(d, NULL, sizeof dst);
    struct kern_buf *ixb = act(d, idx, sizeof idx);
    T_CHECK(kern_dev_copy_rows(d, A(dsb), 29, A(srb), 23, 6, A(ixb), 4, 21) == 0, "copy idx");
    memset(ref, 0, sizeof ref);
    for (int i = 0; i < 4; i++)
        memcpy(ref + i * 29, src + idx[i] * 23, 21);
    get(dsb, dst, sizeof dst);
    T_CHECK(!memcmp(dst, ref, sizeof dst), "copy_rows gathered");
    T_CHECK(kern_dev_copy_rows(d, kern_at_make(dsb, 4), 28, kern_at_make(srb, 8), 24, 0,
                               kern_at_make(NULL, 0), 3, 16) == 0, "copy words");
    for (int i = 0; i < 3; i++)
        memcpy(ref + 4 + i * 28, src + 8 + i * 24, 16);
    get(dsb, dst, sizeof dst);
    T_CHECK(!memcmp(dst, ref, sizeof dst), "copy_rows strided words");
    T_CHECK(kern_dev_zero(d, kern_at_make(dsb, 3), 50) == 0, "zero");
    memset(ref + 3, 0, 50);
    get(dsb, dst, sizeof dst);
    T_CHECK(!memcmp(dst, ref, sizeof dst), "zero");

    struct kern_buf *all[] = {lb, sb, wb, qb, Sb, bb, ab, dtb, aab, ob, srb, dsb, ixb};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        kern_buf_free(all[i]);
    free(lg), free(qkv), free(S), free(beta), free(alpha), free(o), free(scr);
    kern_dev_free(d);
}

/* The boundary: bound rows go up, an op runs on them, the result comes back on unbind; the
 * buffer kinds' rules hold as on the host devices. */
T_CASE(io_and_buffers)
{
    struct kern_dev *d = cl_open(0);
    T_ASSERT(d, "dev");
    float x[10], y[10];
    for (int i = 0; i < 10; i++)
        x[i] = (float)i, y[i] = 1.0f;
    struct kern_buf *io = NULL, *one = act(d, y, sizeof y), *w = NULL;
    T_ASSERT(kern_buf_new(&io, d, KERN_BUF_IO, sizeof x, NULL) == 0, "io");
    T_CHECK(kern_buf_size(io) == 0, "unbound io addresses nothing");
    T_CHECK(kern_buf_bind(io, x, sizeof x, true) == 0, "bind");
    T_CHECK(kern_dev_add(d, A(io), A(one), 10) == 0, "add on the boundary");
    T_CHECK(kern_buf_unbind(io, true) == 0, "unbind");
    T_CHECK(x[0] == 1.0f && x[9] == 10.0f, "downloaded: %g %g", x[0], x[9]);
    T_ASSERT(kern_buf_new(&w, d, KERN_BUF_WEIGHT, sizeof y, y) == 0, "weight");
    T_CHECK(kern_buf_write(w, 0, x, 4) == -EINVAL, "weights are read-only");
    float back[10];
    T_CHECK(kern_buf_read(w, 0, back, sizeof back) == 0 && !memcmp(back, y, sizeof y), "read");
    struct kern_cl_info info;
    struct kern_buf *big = NULL;
    T_ASSERT(kern_cl_info(d, &info) == 0, "info");
    T_CHECK(kern_buf_new(&big, d, KERN_BUF_STATE, info.alloc_cap + 1, NULL) == -ENOMEM && !big,
            "a state buffer over the device's cap is refused (only weights are split)");
    kern_buf_free(io), kern_buf_free(one), kern_buf_free(w);
    kern_dev_free(d);
    d = cl_open(8192);
    T_ASSERT(d, "capped");
    T_CHECK(kern_buf_new(&big, d, KERN_BUF_STATE, 1 << 20, NULL) == 0 && big,
            "a forced cap splits weights only");
    kern_buf_free(big);
    kern_dev_free(d);
}

/* The program binary is cached: a fresh folder gets one, the next open takes it. */
T_CASE(program_cache)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/fresh", cache);
    struct kern_cl_opts o = {.platform = -1, .device = -1, .cache_dir = dir};
    char err[KV_ERR_MAX] = "";
    struct kern_dev *d = NULL;
    struct kern_cl_info info;
    T_ASSERT(cl_new(&d, &o, err) == 0, "open: %s", err);
    T_CHECK(kern_cl_info(d, &info) == 0 && !info.from_cache && info.build_ms > 0, "built");
    struct stat st;
    T_CHECK(stat(info.cache_file, &st) == 0 && st.st_size > 0, "cached in %s", info.cache_file);
    T_CHECK(strstr(info.cache_file, dir) == info.cache_file, "in the folder asked for");
    printf("device %s (%s), build %.0f ms, cap %zu, wg %d\n", info.device, info.platform,
           info.build_ms, info.alloc_cap, info.wg);
    kern_dev_free(d);
    T_ASSERT(cl_new(&d, &o, err) == 0, "reopen: %s", err);
    T_CHECK(kern_cl_info(d, &info) == 0 && info.from_cache, "the second open takes the binary");
    kern_dev_free(d);
    /* a corrupt binary is rebuilt from source */
    FILE *f = fopen(info.cache_file, "wb");
    T_ASSERT(f, "open cache file");
    fputs("not a binary", f);
    fclose(f);
    T_ASSERT(cl_new(&d, &o, err) == 0, "corrupt cache: %s", err);
    T_CHECK(kern_cl_info(d, &info) == 0 && !info.from_cache, "rebuilt");
    kern_dev_free(d);
    /* another work-group size is another program, another file */
    o.wg = 128;
    T_ASSERT(cl_new(&d, &o, err) == 0, "wg 128: %s", err);
    T_CHECK(kern_cl_info(d, &info) == 0 && info.wg == 128 && !info.from_cache, "wg 128 built");
    kern_dev_free(d);
}

T_CASE(no_such_device)
{
    struct kern_cl_opts o = {.platform = 7, .device = -1, .cache_dir = cache};
    char err[KV_ERR_MAX] = "";
    struct kern_dev *d = NULL;
    T_CHECK(cl_new(&d, &o, err) == -ENODEV && !d, "platform 7");
    T_CHECK(strstr(err, "platform 7") && strstr(err, "0: "), "names what exists: %s", err);
    o = (struct kern_cl_opts){.platform = 0, .device = 5, .cache_dir = cache};
    T_CHECK(cl_new(&d, &o, err) == -ENODEV && !d, "device 5");
    T_CHECK(strstr(err, "device 5") && strstr(err, "0: "), "names what exists: %s", err);
    /* the settings were that device's alone: the next one made without any opens */
    T_CHECK(kern_dev_new(&d, "opencl", 1, err, sizeof err) == 0, "defaults again: %s", err);
    kern_dev_free(d);
    /* two devices made side by side, each with its own settings */
    struct kern_cl_opts a = {.platform = -1, .device = -1, .cache_dir = cache, .wg = 32};
    struct kern_cl_opts b = {.platform = -1, .device = -1, .cache_dir = cache, .wg = 128,
                             .layout = "adreno"};
    struct kern_dev *da = NULL, *db = NULL;
    struct kern_cl_info ia, ib;
    T_ASSERT(cl_new(&da, &a, err) == 0 && cl_new(&db, &b, err) == 0, "two devices: %s", err);
    T_CHECK(kern_cl_info(da, &ia) == 0 && kern_cl_info(db, &ib) == 0 && ia.wg == 32 &&
            ib.wg == 128 && !strcmp(ia.layout, "plain") && !strcmp(ib.layout, "adreno"),
            "each its own: wg %d/%d, layout %s/%s", ia.wg, ib.wg, ia.layout, ib.layout);
    kern_dev_free(da);
    kern_dev_free(db);
}

int main(int argc, char **argv)
{
    t_init(argc, argv);
    snprintf(cache, sizeof cache, "/tmp/kv-test-kern-opencl.%d", (int)getpid());
    T_RUN_TIMEOUT(matmul_every_type, 600);
    T_RUN_TIMEOUT(matmul_every_type_split, 600);
    T_RUN_TIMEOUT(matmul_every_type_copy, 600);
    T_RUN_TIMEOUT(matmul_every_type_map, 600);
    T_RUN_TIMEOUT(map_unaligned_copies, 600);
    T_RUN_TIMEOUT(norms_rope_elementwise, 600);
    T_RUN_TIMEOUT(kv_store_attention, 600);
    T_RUN_TIMEOUT(moe_deltanet_moves, 600);
    T_RUN_TIMEOUT(io_and_buffers, 600);
    T_RUN_TIMEOUT(adreno_layout, 600);
    T_RUN_TIMEOUT(gemm_every_type, 600);
    T_RUN_TIMEOUT(gemm_large, 600);
    T_RUN_TIMEOUT(gemm_every_type_split, 600);
    T_RUN_TIMEOUT(gemm_adreno_layout, 600);
    T_RUN_TIMEOUT(gemm_rows_exact_below, 600);
    T_RUN_TIMEOUT(gemm_failure_falls_back, 600);
    T_RUN_TIMEOUT(gemm_options, 600);
    T_RUN_TIMEOUT(variants_compile, 600);
    T_RUN_TIMEOUT(variants_run, 900);
    T_RUN_TIMEOUT(program_cache, 600);
    T_RUN_TIMEOUT(no_such_device, 600);
    int rc = T_DONE();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", cache);
    return rc;
}

/* tool-kernbench: matvec throughput per weight type on TinyLlama-1.1B-shaped matrices
 * (q/o 2048x2048, k/v 256x2048, gate/up 5632x2048, down 2048x5632), with enough layers that
 * the weights do not fit in cache, against the measured read bandwidth.
 *   tool-kernbench [-t threads] [-l layers] [-n batch] [-c [-r rounds]] [-p] [types...]
 *   (types: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k q5_k q6_k)
 * -a CTX: attention instead: one query row at position CTX-1 over an F16 cache, TinyLlama
 * heads (32 query, 4 KV, head_dim 64), CPU time per call and per token (22 layers).
 * -c: compute efficiency instead: one thread, a cache-resident slice, CPU time (not wall
 * time), so the figure holds on a busy machine: G weights per CPU-second, the best of -r
 * rounds (default 5).
 * -p: the weights repacked at load (kern_pack_new: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the K types at the AVX2/AVX-512
 * levels), as the cpu device runs them; other types stay in the file layout.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>

#include "kernels/kern.h"
#include "util/util.h"
#include "wtype/wtype.h"

/* CPU seconds on clock id (wall time is util_now_s): CLOCK_PROCESS_CPUTIME_ID (every thread's)
 * or CLOCK_THREAD_CPUTIME_ID (the caller's: -c's one-thread pool runs the work on the caller,
 * OpenBLAS held to it too for F32 batches past KERN_ROWS_EXACT_MAX, while the process's time
 * would also count OpenBLAS's worker, which spins for its first fraction of a second after the
 * library loads: about half of a short -c run on a 2-core host). */
static double cpu_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The matmul by w, or by its repacked copy pk when there is one. */
static void mm(struct kern_pool *p, uint32_t t, const void *w, const struct kern_packed *pk,
               int64_t rows, int64_t cols, const float *x, int batch, float *y)
{
    if (pk)
        kern_matmul_packed(p, pk, 0, x, batch, y);
    else
        kern_matmul(p, t, w, rows, cols, x, batch, y);
}

/* w repacked when asked and possible, else NULL. */
static struct kern_packed *pack(int packed, uint32_t t, const void *w, int64_t rows, int64_t cols)
{
    struct kern_packed *pk = NULL;
    if (packed && kern_pack_new(NULL, &pk, t, w, rows, cols, 1) != 0)
        pk = NULL;
    return pk;
}

static const struct { const char *name; uint32_t type; } tnames[] = {
    {"f32", KERN_T_F32}, {"f16", KERN_T_F16}, {"bf16", KERN_T_BF16}, {"q8_0", KERN_T_Q8_0},
    {"q4_0", KERN_T_Q4_0}, {"q4_1", KERN_T_Q4_1}, {"q5_0", KERN_T_Q5_0}, {"q5_1", KERN_T_Q5_1},
    {"q4_k", KERN_T_Q4_K}, {"q5_k", KERN_T_Q5_K}, {"q6_k", KERN_T_Q6_K},
};

int main(int argc, char **argv)
{
    int threads = 0, layers = 0, batch = 1, resident = 0, att_ctx = 0, packed = 0, rounds = 5;
    const char *want[16];
    int nwant = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-l") && i + 1 < argc)
            layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-n") && i + 1 < argc)
            batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-a") && i + 1 < argc)
            att_ctx = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-c"))
            resident = 1;
        else if (!strcmp(argv[i], "-p"))
            packed = 1;
        else if (nwant < 16)
            want[nwant++] = argv[i];
    }
    if (nwant == 0) {
        want[0] = "q4_0";
        want[1] = "q8_0";
        nwant = 2;
    }
    if (batch < 1 || batch > 512)
        batch = 1;
    if (rounds < 1 || rounds > 1000)
        rounds = 5;
    if (att_ctx > 0) {
        if (att_ctx > 65536)
            att_ctx = 65536;
        struct kern_pool *ap;
        const int nh = 32, nkv = 4, hd = 64;
        if (kern_pool_new(&ap, threads) != 0)
            return 1;
        if (kern_pool_reserve(ap, kern_attention_scratch(ap, att_ctx, hd)) != 0)
            return 1;
        size_t stride = (size_t)nkv * hd;
        uint16_t *k = calloc((size_t)att_ctx * stride, 2), *v = calloc((size_t)att_ctx * stride, 2);
        float *q = calloc((size_t)nh * hd, 4), *o = calloc((size_t)nh * hd, 4);
        float *scratch = calloc((size_t)att_ctx, 4);
        for (size_t i = 0; i < (size_t)att_ctx * stride; i++) {
            k[i] = wtype_f32_to_f16((float)((i * 37) % 101) / 50.0f - 1.0f);
            v[i] = wtype_f32_to_f16((float)((i * 53) % 97) / 48.0f - 1.0f);
        }
        for (int i = 0; i < nh * hd; i++)
            q[i] = (float)((i * 29) % 89) / 44.0f - 1.0f;
        int reps = (int)(2000000 / att_ctx) + 1;
        double t0 = util_now_s(), c0 = cpu_s(CLOCK_PROCESS_CPUTIME_ID);
        for (int r = 0; r < reps; r++)
            kern_attention(ap, KERN_T_F16, o, q, k, v, 1, att_ctx - 1, nh, nkv, hd, stride, 0.125f,
                           scratch);
        double dt = (util_now_s() - t0) / reps, dc = (cpu_s(CLOCK_PROCESS_CPUTIME_ID) - c0) / reps;
        printf("attention ctx %d, %d threads: %.1f us per call (%.1f us CPU), %.2f ms per token "
               "(22 layers)\n", att_ctx, kern_pool_threads(ap), dt * 1e6, dc * 1e6, dt * 22e3);
        free(k); free(v); free(q); free(o); free(scratch);
        kern_pool_free(ap);
        return 0;
    }
    struct kern_pool *pool;
    if (kern_pool_new(&pool, resident ? 1 : threads) != 0)
        return 1;
    if (resident)
        openblas_set_num_threads(1); /* one thread, the caller: what the thread clock counts */
    /* the widest activations: batch rows of 5632 against any type */
    if (kern_pool_reserve(pool, (size_t)batch * 5632 * 4) != 0)
        return 1;
    double bw = resident ? 0 : kern_bench_bandwidth(pool, (size_t)512 << 20);
    printf("kernbench: %s, %d threads, read bandwidth %.1f GB/s%s\n", kern_cpu_level(),
           kern_pool_threads(pool), bw, packed ? ", repacked weights" : "");
    const int64_t shapes[7][2] = {{2048, 2048}, {256, 2048}, {256, 2048}, {2048, 2048},
                                  {5632, 2048}, {5632, 2048}, {2048, 5632}};
    float *x = malloc(5632 * sizeof(float) * batch), *y = malloc(5632 * sizeof(float) * batch);
    for (int i = 0; i < 5632 * batch; i++)
        x[i] = (float)((i * 7919) % 1000) / 500.0f - 1.0f;
    for (int wi = 0; wi < nwant; wi++) {
        uint32_t t = 99;
        for (size_t k = 0; k < sizeof tnames / sizeof tnames[0]; k++)
            if (!strcasecmp(want[wi], tnames[k].name))
                t = tnames[k].type;
        if (t == 99) {
            fprintf(stderr, "unknown type %s\n", want[wi]);
            continue;
        }
        size_t layer_bytes = 0;
        for (int m = 0; m < 7; m++)
            layer_bytes += (size_t)shapes[m][0] * kern_row_bytes(t, shapes[m][1]);
        if (resident) { /* 256 rows of 2048 (and their batch): stays in L2 */
            int64_t rows = 256, cols = 2048;
            size_t rb = kern_row_bytes(t, cols);
            char *w = malloc(rb * rows);
            float row[2048];
            for (int i = 0; i < 2048; i++)
                row[i] = (float)(((i * 2654435761u) >> 7) % 2001) / 1000.0f - 1.0f;
            for (int64_t r = 0; r < rows; r++)
                kern_ref_quant_row(t, row, w + r * rb, cols);
            struct kern_packed *pk = pack(packed, t, w, rows, cols);
            mm(pool, t, w, pk, rows, cols, x, batch, y);
            int reps = 2000 / batch + 1;
            double dt = 1e30; /* the best of several rounds: a busy host steals cache and cycles */
            for (int round = 0; round < rounds; round++) {
                double t0 = cpu_s(CLOCK_THREAD_CPUTIME_ID);
                for (int rep = 0; rep < reps; rep++)
                    mm(pool, t, w, pk, rows, cols, x, batch, y);
                double d = cpu_s(CLOCK_THREAD_CPUTIME_ID) - t0;
                dt = d < dt ? d : dt;
            }
            kern_pack_free(pk);
            printf("  %-5s batch %d: %.2f G weight-products per CPU-second (%.2f GB/s of weights "
                   "per core)\n", want[wi], batch, (double)rows * cols * batch * reps / dt / 1e9,
                   (double)rb * rows * reps / dt / 1e9);
            free(w);
            continue;
        }
        /* enough layers for ~400 MB of weights unless told: far beyond any cache */
        int nl = layers > 0 ? layers : (int)((400u << 20) / layer_bytes + 1);
        char *w = malloc(layer_bytes * nl);
        if (!w) {
            fprintf(stderr, "out of memory for %d layers\n", nl);
            continue;
        }
        /* random-looking but valid blocks: quantise one row of noise, replicate it */
        float row[5632];
        for (int i = 0; i < 5632; i++)
            row[i] = (float)(((i * 2654435761u) >> 7) % 2001) / 1000.0f - 1.0f;
        char qrow[5632 * 4];
        size_t off = 0;
        for (int l = 0; l < nl; l++)
            for (int m = 0; m < 7; m++) {
                size_t rb = kern_row_bytes(t, shapes[m][1]);
                kern_ref_quant_row(t, row, qrow, shapes[m][1]);
                for (int64_t r = 0; r < shapes[m][0]; r++, off += rb)
                    memcpy(w + off, qrow, rb);
            }
        struct kern_packed **pks = calloc((size_t)nl * 7, sizeof *pks);
        off = 0;
        for (int i = 0; pks && i < nl * 7; i++) {
            pks[i] = pack(packed, t, w + off, shapes[i % 7][0], shapes[i % 7][1]);
            off += (size_t)shapes[i % 7][0] * kern_row_bytes(t, shapes[i % 7][1]);
        }
        double best = 1e30, best_cpu = 1e30;
        for (int rep = 0; rep < 3; rep++) {
            double t0 = util_now_s(), c0 = cpu_s(CLOCK_PROCESS_CPUTIME_ID);
            off = 0;
            for (int l = 0; l < nl; l++)
                for (int m = 0; m < 7; m++) {
                    mm(pool, t, w + off, pks ? pks[l * 7 + m] : NULL, shapes[m][0], shapes[m][1],
                       x, batch, y);
                    off += (size_t)shapes[m][0] * kern_row_bytes(t, shapes[m][1]);
                }
            double dt = util_now_s() - t0, dc = cpu_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
            best = dt < best ? dt : best;
            best_cpu = dc < best_cpu ? dc : best_cpu;
        }
        double gbs = (double)layer_bytes * nl / best / 1e9;
        double per_layer_ms = best / nl * 1e3;
        if (batch == 1)
            printf("  %-5s matvec %6.1f GB/s = %3.0f%% of bandwidth (%.2f ms per layer, 22 layers "
                   "%.1f tok/s; %.1f GB/s per CPU-second)\n", want[wi], gbs,
                   bw > 0 ? 100 * gbs / bw : 0, per_layer_ms, 1e3 / (per_layer_ms * 22),
                   (double)layer_bytes * nl / best_cpu / 1e9);
        else
            printf("  %-5s batch %d: %.2f ms per layer, %.1f GFLOP/s, 22 layers %.1f tok/s\n",
                   want[wi], batch, per_layer_ms,
                   2.0 * (double)layer_bytes / kern_row_bytes(t, 2048) * 2048 * batch * nl / best / 1e9,
                   batch * 1e3 / (per_layer_ms * 22));
        for (int i = 0; pks && i < nl * 7; i++)
            kern_pack_free(pks[i]);
        free(pks);
        free(w);
    }
    free(x);
    free(y);
    kern_pool_free(pool);
    return 0;
}

/* Element-wise ops on the pool: pieces handed out through an atomic counter (dynamic jobs),
 * each piece computed by the reference function, so results do not depend on the split. */
#include <stdatomic.h>

#include "kernels/internal.h"

/* Elements per SwiGLU piece: a few microseconds of expf, well above a claim's cost. */
#define SWIGLU_PIECE 1024

struct ew_job {
    float *out;
    const float *a, *b, *w;
    int64_t n, cols;
    float eps;
    _Atomic int64_t next;
};

static void swiglu_task(void *ctx, int ith, int nth)
{
    struct ew_job *j = ctx;
    (void)ith;
    (void)nth;
    for (;;) {
        int64_t i = atomic_fetch_add_explicit(&j->next, SWIGLU_PIECE, memory_order_relaxed);
        if (i >= j->n)
            return;
        int64_t m = j->n - i < SWIGLU_PIECE ? j->n - i : SWIGLU_PIECE;
        kern_ref_swiglu(j->out + i, j->a + i, j->b + i, m);
    }
}

void kern_swiglu(struct kern_pool *p, float *out, const float *gate, const float *up, int64_t n)
{
    if (n <= 0)
        return;
    if (!p || kern_pool_threads(p) <= 1 || n <= SWIGLU_PIECE) {
        kern_ref_swiglu(out, gate, up, n);
        return;
    }
    struct ew_job j = {.out = out, .a = gate, .b = up, .n = n};
    atomic_store(&j.next, 0);
    kern__pool_run_dyn(p, swiglu_task, &j);
}

static void rmsnorm_task(void *ctx, int ith, int nth)
{
    struct ew_job *j = ctx;
    (void)ith;
    (void)nth;
    for (;;) {
        int64_t r = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (r >= j->n)
            return;
        kern_ref_rmsnorm(j->out + r * j->cols, j->a + r * j->cols, j->w, j->cols, j->eps);
    }
}

void kern_rmsnorm_rows(struct kern_pool *p, float *out, const float *x, const float *w,
                       int64_t n_rows, int64_t cols, float eps)
{
    if (n_rows <= 0)
        return;
    if (!p || kern_pool_threads(p) <= 1 || n_rows < 4) {
        for (int64_t r = 0; r < n_rows; r++)
            kern_ref_rmsnorm(out + r * cols, x + r * cols, w, cols, eps);
        return;
    }
    struct ew_job j = {.out = out, .a = x, .w = w, .n = n_rows, .cols = cols, .eps = eps};
    atomic_store(&j.next, 0);
    kern__pool_run_dyn(p, rmsnorm_task, &j);
}

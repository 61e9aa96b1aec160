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

/* The other element-wise ops: pieces of elements (or of rows) handed out like SwiGLU's, each
 * computed by the reference on its slice. */
enum ew_op { EW_ADD, EW_SIGMOID, EW_MUL_SIGMOID, EW_ADD_ROWS, EW_AXPY_ROWS, EW_RMSNORM_SILU };

struct ew2_job {
    enum ew_op op;
    float *y;
    const float *x, *b, *a, *z;
    const uint32_t *idx;
    int64_t n, cols, piece;
    float eps;
    _Atomic int64_t next;
};

/* Elements [i, i + m) of an element op, or rows [i, i + m) of a row op. */
static void ew2_piece(struct ew2_job *j, int64_t i, int64_t m)
{
    switch (j->op) {
    case EW_ADD:
        kern_ref_add(j->y + i, j->x + i, m);
        break;
    case EW_SIGMOID:
        kern_ref_sigmoid(j->y + i, m);
        break;
    case EW_MUL_SIGMOID:
        kern_ref_mul_sigmoid(j->y + i, j->x + i, m);
        break;
    case EW_ADD_ROWS:
        kern_ref_add_rows(j->y + i * j->cols, j->b, m, j->cols);
        break;
    case EW_AXPY_ROWS:
        for (int64_t r = i; r < i + m; r++)
            kern_ref_axpy_rows(j->y + (j->idx ? (int64_t)j->idx[r] : r) * j->cols, j->a + r,
                               j->x + r * j->cols, NULL, 1, j->cols);
        break;
    case EW_RMSNORM_SILU:
        kern_ref_rmsnorm_silu(j->y + i * j->cols, j->x + i * j->cols, j->b, j->z + i * j->cols,
                              m, j->cols, j->eps);
        break;
    }
}

static void ew2_task(void *ctx, int ith, int nth)
{
    struct ew2_job *j = ctx;
    (void)ith;
    (void)nth;
    for (;;) {
        int64_t i = atomic_fetch_add_explicit(&j->next, j->piece, memory_order_relaxed);
        if (i >= j->n)
            return;
        ew2_piece(j, i, j->n - i < j->piece ? j->n - i : j->piece);
    }
}

/* Runs j over its n items in pieces of `piece` (elements or rows), on the pool when there is
 * more than one piece. */
static void ew2_run(struct kern_pool *p, struct ew2_job *j)
{
    if (j->n <= 0)
        return;
    if (!p || kern_pool_threads(p) <= 1 || j->n <= j->piece) {
        ew2_piece(j, 0, j->n);
        return;
    }
    atomic_store(&j->next, 0);
    kern__pool_run_dyn(p, ew2_task, j);
}

/* Pieces of a memory-bound element op (add): a few microseconds of loads and stores. */
#define ADD_PIECE 16384

/* Rows per piece for row ops of cols: about a SwiGLU piece of work, at least one row. */
static int64_t row_piece(int64_t cols, int64_t elems)
{
    return cols >= elems ? 1 : elems / cols;
}

void kern_add(struct kern_pool *p, float *y, const float *x, int64_t n)
{
    struct ew2_job j = {.op = EW_ADD, .y = y, .x = x, .n = n, .piece = ADD_PIECE};
    ew2_run(p, &j);
}

void kern_sigmoid(struct kern_pool *p, float *x, int64_t n)
{
    struct ew2_job j = {.op = EW_SIGMOID, .y = x, .n = n, .piece = SWIGLU_PIECE};
    ew2_run(p, &j);
}

void kern_mul_sigmoid(struct kern_pool *p, float *x, const float *g, int64_t n)
{
    struct ew2_job j = {.op = EW_MUL_SIGMOID, .y = x, .x = g, .n = n, .piece = SWIGLU_PIECE};
    ew2_run(p, &j);
}

void kern_add_rows(struct kern_pool *p, float *y, const float *b, int64_t n, int64_t cols)
{
    struct ew2_job j = {.op = EW_ADD_ROWS, .y = y, .b = b, .n = n, .cols = cols,
                        .piece = row_piece(cols, ADD_PIECE)};
    ew2_run(p, &j);
}

void kern_axpy_rows(struct kern_pool *p, float *y, const float *a, const float *x,
                    const uint32_t *idx, int64_t n, int64_t cols)
{
    struct ew2_job j = {.op = EW_AXPY_ROWS, .y = y, .a = a, .x = x, .idx = idx, .n = n,
                        .cols = cols, .piece = row_piece(cols, ADD_PIECE)};
    ew2_run(p, &j);
}

void kern_rmsnorm_silu(struct kern_pool *p, float *out, const float *x, const float *w,
                       const float *z, int64_t n, int64_t cols, float eps)
{
    struct ew2_job j = {.op = EW_RMSNORM_SILU, .y = out, .x = x, .b = w, .z = z, .n = n,
                        .cols = cols, .eps = eps, .piece = row_piece(cols, SWIGLU_PIECE)};
    ew2_run(p, &j);
}

/* Fast CPU path, first cut: the pool records its size and the ops delegate to the reference.
 * The threaded SIMD versions replace these bodies without changing their contracts. */
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include "kernels/internal.h"

struct kern_pool {
    int n_threads;
};

int kern_pool_new(struct kern_pool **out, int n_threads)
{
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    struct kern_pool *p = calloc(1, sizeof *p);
    if (!p)
        return -ENOMEM;
    p->n_threads = n_threads;
    *out = p;
    return 0;
}

void kern_pool_free(struct kern_pool *p)
{
    free(p);
}

int kern_pool_threads(const struct kern_pool *p)
{
    return p ? p->n_threads : 1;
}

const char *kern_cpu_level(void)
{
    return "scalar";
}

int kern_matmul(struct kern_pool *p, uint32_t type, const void *w, int64_t rows, int64_t cols,
                const float *x, int64_t n, float *y)
{
    return kern_ref_matmul(type, w, rows, cols, x, n, y);
}

void kern_attention(struct kern_pool *p, uint32_t kv_type, float *out, const float *q,
                    const void *k, const void *v, int64_t n, int64_t pos0, int n_head,
                    int n_kv_head, int head_dim, size_t kv_stride, float scale, float *scratch)
{
    kern_ref_attention(kv_type, out, q, k, v, n, pos0, n_head, n_kv_head, head_dim, kv_stride,
                       scale, scratch);
}

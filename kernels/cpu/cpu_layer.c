/* The forward pass's per-layer ops on the pool: RoPE over (row, head) pairs, the KV store, the
 * norms and the causal conv over rows, the router over rows, the Gated DeltaNet over value heads.
 * Each piece is the reference's own computation on a slice of the work, so the results are
 * the reference's bit for bit at any thread count; small work runs inline. */
#include <errno.h>
#include <stdatomic.h>

#include "kernels/internal.h"

/* Below this many scalar operations an op runs on the calling thread: a pool dispatch costs
 * about a microsecond. */
#define MIN_SPLIT 8192

struct layer_job {
    float *x, *out, *cs_out, *sn_out;
    const float *cs, *sn, *src, *w, *q, *k, *v, *beta, *alpha, *dt_bias, *a;
    uint32_t *sel;
    void *dst;
    uint32_t kv_type;
    int64_t n, pos0, cols, channels;
    size_t stride, dst_stride;
    int n_head, head_dim, n_rot, n_k_head, n_v_head, d, kernel, n_expert, k_sel;
    float freq_base, freq_scale, eps;
    const float *freq_div;
    bool neox;
    char *scratch;
    size_t per_thread;
    _Atomic int64_t next;
};

/* Items 0..total-1 handed out one at a time to fn(j, item, ith). */
typedef void (*item_fn)(struct layer_job *j, int64_t item, int ith);
struct item_job {
    struct layer_job *j;
    item_fn fn;
    int64_t total;
    _Atomic int64_t next;
};

static void items_task(void *ctx, int ith, int nth)
{
    struct item_job *ij = ctx;
    (void)nth;
    for (;;) {
        int64_t i = atomic_fetch_add_explicit(&ij->next, 1, memory_order_relaxed);
        if (i >= ij->total)
            return;
        ij->fn(ij->j, i, ith);
    }
}

/* Runs fn on every item, on the pool when the work (total items of `cost` operations each)
 * is worth splitting. */
static void run_items(struct kern_pool *p, struct layer_job *j, item_fn fn, int64_t total,
                      int64_t cost)
{
    if (total <= 0)
        return;
    if (!p || kern_pool_threads(p) <= 1 || total < 2 || total * cost < MIN_SPLIT) {
        for (int64_t i = 0; i < total; i++)
            fn(j, i, 0);
        return;
    }
    struct item_job ij = {.j = j, .fn = fn, .total = total};
    atomic_store(&ij.next, 0);
    kern__pool_run_dyn(p, items_task, &ij);
}

static void angles_item(struct layer_job *j, int64_t r, int ith)
{
    (void)ith;
    int64_t half = j->n_rot / 2;
    kern_ref_rope_angles(j->cs_out + r * half, j->sn_out + r * half, 1, j->pos0 + r, j->n_rot,
                         j->freq_base, j->freq_scale, j->freq_div);
}

void kern_rope_angles(struct kern_pool *p, float *cs, float *sn, int64_t n, int64_t pos0,
                      int n_rot, float freq_base, float freq_scale, const float *freq_div)
{
    struct layer_job j = {.cs_out = cs, .sn_out = sn, .pos0 = pos0, .n_rot = n_rot,
                          .freq_base = freq_base, .freq_scale = freq_scale,
                          .freq_div = freq_div};
    run_items(p, &j, angles_item, n, (int64_t)n_rot * 16);
}

static void rope_item(struct layer_job *j, int64_t t, int ith)
{
    (void)ith;
    int64_t r = t / j->n_head, h = t % j->n_head, half = j->n_rot / 2;
    kern_ref_rope_rows(j->x + (size_t)r * j->stride + (size_t)h * j->head_dim, 1, 0, 1,
                       j->head_dim, j->n_rot, j->cs + r * half, j->sn + r * half, j->neox);
}

void kern_rope_rows(struct kern_pool *p, float *x, int64_t n, size_t stride, int n_head,
                    int head_dim, int n_rot, const float *cs, const float *sn, bool neox)
{
    struct layer_job j = {.x = x, .stride = stride, .n_head = n_head, .head_dim = head_dim,
                          .n_rot = n_rot, .cs = cs, .sn = sn, .neox = neox};
    run_items(p, &j, rope_item, n * n_head, (int64_t)n_rot * 3);
}

static void kv_item(struct layer_job *j, int64_t r, int ith)
{
    (void)ith;
    const struct kern__simd *s = kern__simd_get();
    if (j->kv_type == KERN_T_F16 && s->quant[KERN_T_F16]) /* IEEE round to nearest even */
        s->quant[KERN_T_F16](j->src + r * j->cols, (uint16_t *)j->dst + (size_t)r * j->dst_stride,
                             j->cols);
    else
        kern_ref_kv_store(j->kv_type, (char *)j->dst + (size_t)r * j->dst_stride *
                          (j->kv_type == KERN_T_F16 ? 2 : 4), 0, j->src + r * j->cols, 1, j->cols);
}

void kern_kv_store(struct kern_pool *p, uint32_t kv_type, void *dst, size_t dst_stride,
                   const float *src, int64_t n, int64_t dim)
{
    assert(kv_type == KERN_T_F16 || kv_type == KERN_T_F32);
    struct layer_job j = {.kv_type = kv_type, .dst = dst, .dst_stride = dst_stride, .src = src,
                          .cols = dim};
    run_items(p, &j, kv_item, n, dim);
}

static void l2_item(struct layer_job *j, int64_t t, int ith)
{
    (void)ith;
    kern_ref_l2norm(j->x + (size_t)t * j->stride, 1, 0, j->n_head, j->d, j->eps);
}

void kern_l2norm(struct kern_pool *p, float *x, int64_t n, size_t stride, int nh, int d,
                 float eps)
{
    struct layer_job j = {.x = x, .stride = stride, .n_head = nh, .d = d, .eps = eps};
    run_items(p, &j, l2_item, n, (int64_t)nh * d * 3);
}

static void conv_item(struct layer_job *j, int64_t t, int ith)
{
    (void)ith;
    kern_ref_conv_silu(j->out + t * j->channels, j->src + t * j->channels, j->w, 1,
                       j->channels, j->kernel);
}

void kern_conv_silu(struct kern_pool *p, float *out, const float *x, const float *w,
                    int64_t n, int64_t channels, int kernel)
{
    struct layer_job j = {.out = out, .src = x, .w = w, .channels = channels, .kernel = kernel};
    run_items(p, &j, conv_item, n, channels * (kernel * 2 + 8));
}

static void route_item(struct layer_job *j, int64_t t, int ith)
{
    (void)ith;
    kern_ref_moe_route(j->sel + t * j->k_sel, j->out + t * j->k_sel, j->x + t * j->n_expert, 1,
                       j->n_expert, j->k_sel);
}

void kern_moe_route(struct kern_pool *p, uint32_t *sel, float *w, float *logits, int64_t n,
                    int n_expert, int k)
{
    struct layer_job j = {.sel = sel, .out = w, .x = logits, .n_expert = n_expert, .k_sel = k};
    run_items(p, &j, route_item, n, (int64_t)n_expert * (k + 8));
}

size_t kern_deltanet_scratch(const struct kern_pool *p, int d)
{
    size_t per = ((size_t)2 * (size_t)d * sizeof(float) + 63) & ~(size_t)63;
    return per * (size_t)kern_pool_threads(p);
}

static void deltanet_item(struct layer_job *j, int64_t h, int ith)
{
    size_t d = (size_t)j->d, kh = (size_t)(h % j->n_k_head) * d;
    float *scratch = (float *)(j->scratch + (size_t)ith * j->per_thread);
    kern__deltanet_head(j->out + h * d, (size_t)j->n_v_head * d, j->x + h * d * d, j->q + kh,
                        j->k + kh, j->v + h * d, j->stride, j->beta + h, j->alpha + h,
                        (size_t)j->n_v_head, j->dt_bias[h], j->a[h], j->n, j->d, scratch);
}

int kern_deltanet(struct kern_pool *p, float *o, float *S, const float *q, const float *k,
                  const float *v, size_t stride, const float *beta, const float *alpha,
                  const float *dt_bias, const float *a, int64_t n, int n_k_head, int n_v_head,
                  int d, float *scratch)
{
    if (!p) {
        kern_ref_deltanet(o, S, q, k, v, stride, beta, alpha, dt_bias, a, n, n_k_head,
                          n_v_head, d, scratch);
        return 0;
    }
    char *buf = kern__pool_scratch(p, kern_deltanet_scratch(p, d));
    if (!buf)
        return -ENOSPC;
    struct layer_job j = {.out = o, .x = S, .q = q, .k = k, .v = v, .stride = stride,
                          .beta = beta, .alpha = alpha, .dt_bias = dt_bias, .a = a, .n = n,
                          .n_k_head = n_k_head, .n_v_head = n_v_head, .d = d, .scratch = buf,
                          .per_thread = kern_deltanet_scratch(p, d) / kern_pool_threads(p)};
    run_items(p, &j, deltanet_item, n_v_head, n * (int64_t)d * d * 6);
    return 0;
}

/* kern_attention: the reference algorithm with (query row, head) pairs spread over the pool
 * and SIMD dot products. Same roundings as kern_ref_attention for an F16 cache. */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "kernels/internal.h"

struct att_job {
    const struct kern__simd *s;
    bool f16;
    float *out;
    const float *q;
    const void *k, *v;
    int64_t n, pos0;
    int n_head, group, head_dim;
    size_t kv_stride;
    float scale;
    char *scratch;     /* per thread: scores (ctx floats), q16 (head_dim), p16 (ctx) */
    size_t per_thread;
    _Atomic int64_t next;
};

static void att_one(struct att_job *j, int64_t i, int h, float *sc, uint16_t *q16, uint16_t *p16)
{
    const struct kern__simd *s = j->s;
    const int hd = j->head_dim;
    const int64_t n_ctx = j->pos0 + i + 1;
    const float *qh = j->q + (i * j->n_head + h) * hd;
    const size_t koff = (size_t)(h / j->group) * hd;
    float *o = j->out + (i * j->n_head + h) * hd;
    if (j->f16) {
        /* q rounded to f16 for K.q, the weights rounded to f16 for the V product */
        kern__dot_fn dot = s->dot[KERN_T_F16] ? s->dot[KERN_T_F16] : kern__dot_f16;
        if (s->quant[KERN_T_F16])
            s->quant[KERN_T_F16](qh, q16, hd);
        else
            kern_ref_quant_row(KERN_T_F16, qh, q16, hd);
        const uint16_t *k = j->k;
        for (int64_t p = 0; p < n_ctx; p++)
            sc[p] = dot(k + p * j->kv_stride + koff, q16, hd) * j->scale;
    } else {
        kern__dot_fn dot = s->dot[KERN_T_F32] ? s->dot[KERN_T_F32] : kern__dot_f32;
        const float *k = j->k;
        for (int64_t p = 0; p < n_ctx; p++)
            sc[p] = dot(k + p * j->kv_stride + koff, qh, hd) * j->scale;
    }
    if (s->softmax)
        s->softmax(sc, n_ctx);
    else
        kern_ref_softmax(sc, n_ctx);
    memset(o, 0, (size_t)hd * sizeof *o);
    if (j->f16) {
        if (s->quant[KERN_T_F16])
            s->quant[KERN_T_F16](sc, p16, n_ctx);
        else
            kern_ref_quant_row(KERN_T_F16, sc, p16, n_ctx);
        const uint16_t *v = j->v;
        for (int64_t p = 0; p < n_ctx; p++) {
            const uint16_t *vr = v + p * j->kv_stride + koff;
            float w = wtype_f16_to_f32(p16[p]);
            if (s->axpy_f16) {
                s->axpy_f16(o, w, vr, hd);
            } else {
                for (int d = 0; d < hd; d++)
                    o[d] += w * wtype_f16_to_f32(vr[d]);
            }
        }
    } else {
        const float *v = j->v;
        for (int64_t p = 0; p < n_ctx; p++) {
            const float *vr = v + p * j->kv_stride + koff;
            if (s->axpy_f32) {
                s->axpy_f32(o, sc[p], vr, hd);
            } else {
                for (int d = 0; d < hd; d++)
                    o[d] += sc[p] * vr[d];
            }
        }
    }
}

/* F16 cache, SIMD: the query heads sharing KV head g for row i, up to GROUP_MAX at a time,
 * so each key and value row is converted once for all of them. */
#define GROUP_MAX 8

static void att_group(struct att_job *j, int64_t i, int g, float *sc, uint16_t *h16, float *qf)
{
    const struct kern__simd *s = j->s;
    const int hd = j->head_dim;
    const int64_t n_ctx = j->pos0 + i + 1;
    const uint16_t *k = (const uint16_t *)j->k + (size_t)g * hd;
    const uint16_t *v = (const uint16_t *)j->v + (size_t)g * hd;
    for (int h0 = g * j->group; h0 < (g + 1) * j->group; h0 += GROUP_MAX) {
        int nh = (g + 1) * j->group - h0 < GROUP_MAX ? (g + 1) * j->group - h0 : GROUP_MAX;
        for (int h = 0; h < nh; h++) { /* q rounded to f16 */
            s->quant[KERN_T_F16](j->q + (i * j->n_head + h0 + h) * hd, h16, hd);
            s->f16_to_f32(h16, qf + (size_t)h * hd, hd);
        }
        s->att_kq_f16(k, j->kv_stride, n_ctx, qf, nh, hd, j->scale, sc);
        for (int h = 0; h < nh; h++) { /* softmax, weights rounded to f16 */
            float *w = sc + (size_t)h * n_ctx;
            s->softmax(w, n_ctx);
            s->quant[KERN_T_F16](w, h16, n_ctx);
            s->f16_to_f32(h16, w, n_ctx);
        }
        s->att_v_f16(v, j->kv_stride, n_ctx, sc, nh, hd, j->out + (i * j->n_head + h0) * hd, hd);
    }
}

static void att_group_task(void *ctx, int ith, int nth)
{
    struct att_job *j = ctx;
    int64_t ctx_len = j->pos0 + j->n;
    float *sc = (float *)(j->scratch + (size_t)ith * j->per_thread);
    float *qf = sc + (size_t)GROUP_MAX * ctx_len;
    uint16_t *h16 = (uint16_t *)(qf + (size_t)GROUP_MAX * j->head_dim);
    int n_kv = j->n_head / j->group;
    int64_t total = j->n * n_kv;
    for (;;) {
        int64_t t = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (t >= total)
            break;
        att_group(j, t / n_kv, (int)(t % n_kv), sc, h16, qf);
    }
}

static void att_task(void *ctx, int ith, int nth)
{
    struct att_job *j = ctx;
    char *base = j->scratch + (size_t)ith * j->per_thread;
    int64_t ctx_len = j->pos0 + j->n;
    float *sc = (float *)base;
    uint16_t *q16 = (uint16_t *)(sc + ctx_len);
    uint16_t *p16 = q16 + j->head_dim;
    int64_t total = j->n * j->n_head;
    for (;;) {
        int64_t t = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (t >= total)
            break;
        att_one(j, t / j->n_head, (int)(t % j->n_head), sc, q16, p16);
    }
}

/* Bytes per thread: the grouped F16 layout (scores and q rows of up to GROUP_MAX heads, an
 * f16 row) or the per-head one (scores, f16 q and weights), whichever the level uses. */
static size_t att_per_thread(bool grouped, int64_t ctx_len, int head_dim)
{
    size_t h16 = (size_t)(ctx_len > head_dim ? ctx_len : head_dim) * 2;
    size_t per = grouped ? (size_t)GROUP_MAX * ((size_t)ctx_len + (size_t)head_dim) * 4 + h16
                         : (size_t)ctx_len * 4 + (size_t)head_dim * 2 + (size_t)ctx_len * 2;
    return (per + 63) & ~(size_t)63;
}

size_t kern_attention_scratch(const struct kern_pool *p, int64_t n_ctx, int head_dim)
{
    /* the larger layout, so that a change of SIMD level never needs more */
    size_t a = att_per_thread(true, n_ctx, head_dim), b = att_per_thread(false, n_ctx, head_dim);
    return (a > b ? a : b) * (size_t)kern_pool_threads(p);
}

int kern_attention(struct kern_pool *p, uint32_t kv_type, float *out, const float *q,
                   const void *k, const void *v, int64_t n, int64_t pos0, int n_head,
                   int n_kv_head, int head_dim, size_t kv_stride, float scale, float *scratch)
{
    assert(n_kv_head > 0 && n_head % n_kv_head == 0 && (kv_type == KERN_T_F16 || kv_type == KERN_T_F32));
    if (!p) {
        kern_ref_attention(kv_type, out, q, k, v, n, pos0, n_head, n_kv_head, head_dim,
                           kv_stride, scale, scratch);
        return 0;
    }
    int nth = kern_pool_threads(p);
    int64_t ctx_len = pos0 + n;
    const struct kern__simd *s = kern__simd_get();
    bool grouped = kv_type == KERN_T_F16 && s->att_kq_f16 && s->softmax && head_dim % 8 == 0;
    size_t per = att_per_thread(grouped, ctx_len, head_dim);
    char *buf = kern__pool_scratch(p, per * (size_t)nth);
    if (!buf)
        return -ENOSPC;
    struct att_job j = {
        .s = s, .f16 = kv_type == KERN_T_F16, .out = out, .q = q, .k = k,
        .v = v, .n = n, .pos0 = pos0, .n_head = n_head, .group = n_head / n_kv_head,
        .head_dim = head_dim, .kv_stride = kv_stride, .scale = scale, .scratch = buf,
        .per_thread = per,
    };
    atomic_store(&j.next, 0);
    kern__pool_run_dyn(p, grouped ? att_group_task : att_task, &j);
    return 0;
}

/* exec.c — the window executor: the forward pass of layers [first, last) on a batch of rows
 * for one session, the per-session K/V caches, and the rank-0 embedding / last-rank head.
 *
 * Numerics follow llama.cpp's CPU graph (what the references were made with): matmuls with
 * ggml's activation rounding (kern_matmul), K and V stored as F16, attention over the cache
 * with scale 1/sqrt(head_dim), RMSNorm then the weight product, SwiGLU FFN. Every row is
 * computed the same way whatever the batch, so a window split into several consecutive
 * windows gives bit-identical results. Scratch is allocated once in model_exec_new; the
 * forward pass does not allocate. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kern.h"
#include "model/internal.h"

/* One session: the K/V of every position so far, for every layer of the window. */
struct model_session {
    uint64_t id;
    uint32_t n_past;    /* positions 0..n_past-1 hold K/V */
    uint16_t *k, *v;    /* F16 [n_layers][n_ctx][kv_dim] */
};

/* Scratch for up to max_batch rows (B); q_dim = n_head*head_dim, kv_dim = n_head_kv*head_dim. */
struct model_state {
    float *xb;          /* [B][n_embd] normalised input of a sub-block */
    float *q;           /* [B][q_dim] */
    float *k, *v;       /* [B][kv_dim] */
    float *att;         /* [B][q_dim] attention output, heads concatenated */
    float *hb, *hb2;    /* [B][n_ff] gate and up */
    float *proj;        /* [B][n_embd] output projection before the residual add */
    float *headtmp;     /* [head_dim] one head for the QK-norm */
    float *att_scratch; /* [n_ctx] softmax row (kern_attention keeps its threads' own) */
};

struct model_exec {
    struct model *m;
    struct kern_pool *pool;
    int n_threads;
    uint32_t n_ctx, max_batch;
    size_t kv_layer;                 /* elements of one layer's K (or V) cache: n_ctx*kv_dim */
    struct model_state s;
    struct model_session **sess;     /* n_sess of cap_sess */
    uint32_t n_sess, cap_sess;
};

/* ---- kernels used by the forward pass ---- */

/* y[n][rows] = x[n][cols] W^T */
static void matmul(struct model_exec *e, const struct model_mat *w, const float *x, uint32_t n,
                   float *y)
{
    kern_matmul(e->pool, w->type, w->data, w->rows, w->cols, x, n, y);
}

/* kern_ref_rope with a frequency divisor per rotated pair (Llama 3.1's rope_freqs): the
 * angle of pair i is freq_scale * theta_i / factor[i], the theta_i built as kern_ref_rope
 * and ggml build them. */
static void rope_factors(float *x, int n_head, int head_dim, int n_rot, int64_t pos,
                         float freq_base, float freq_scale, bool neox, const float *factor)
{
    float theta_scale = powf(freq_base, -2.0f / n_rot);
    for (int h = 0; h < n_head; h++) {
        float *v = x + (int64_t)h * head_dim;
        float theta = (float)pos;
        for (int i0 = 0; i0 < n_rot; i0 += 2) {
            float t = freq_scale * (theta / factor[i0 / 2]);
            float c = cosf(t), s = sinf(t);
            int a = neox ? i0 / 2 : i0, b = neox ? i0 / 2 + n_rot / 2 : i0 + 1;
            float x0 = v[a], x1 = v[b];
            v[a] = x0 * c - x1 * s;
            v[b] = x0 * s + x1 * c;
            theta *= theta_scale;
        }
    }
}

static void rope(const struct model *m, float *x, int n_head, int64_t pos)
{
    const struct model_hparams *hp = &m->hp;
    if (m->rope_freqs)
        rope_factors(x, n_head, hp->head_dim, hp->n_rot, pos, hp->rope_base, hp->rope_scale,
                     hp->rope_neox, m->rope_freqs);
    else
        kern_ref_rope(x, n_head, hp->head_dim, hp->n_rot, pos, hp->rope_base, hp->rope_scale,
                      hp->rope_neox);
}

static void add_rows(float *x, const float *b, uint32_t n, uint32_t dim)
{
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < dim; j++)
            x[(size_t)i * dim + j] += b[j];
}

/* ---- executor ---- */

static void *xcalloc(size_t n, size_t size, int *rc)
{
    void *p = n ? calloc(n, size) : NULL;
    if (n && !p)
        *rc = -ENOMEM;
    return p;
}

int model_exec_new(struct model_exec **out, struct model *m, int n_threads, uint32_t n_ctx,
                   uint32_t max_batch)
{
    *out = NULL;
    const struct model_hparams *hp = &m->hp;
    if (n_ctx == 0 || n_ctx > MODEL_MAX_CTX || max_batch == 0)
        return -EINVAL;
    if (max_batch > n_ctx)
        max_batch = n_ctx;
    struct model_exec *e = calloc(1, sizeof *e);
    if (!e)
        return -ENOMEM;
    int rc = 0;
    e->m = m;
    e->n_ctx = n_ctx;
    e->max_batch = max_batch;
    if ((rc = kern_pool_new(&e->pool, n_threads)) < 0)
        goto fail;
    e->n_threads = kern_pool_threads(e->pool);
    size_t B = max_batch;
    size_t q_dim = (size_t)hp->n_head * hp->head_dim, kv_dim = (size_t)hp->n_head_kv * hp->head_dim;
    e->kv_layer = (size_t)n_ctx * kv_dim;
    struct model_state *s = &e->s;
    s->xb = xcalloc(B * hp->n_embd, sizeof(float), &rc);
    s->q = xcalloc(B * q_dim, sizeof(float), &rc);
    s->k = xcalloc(B * kv_dim, sizeof(float), &rc);
    s->v = xcalloc(B * kv_dim, sizeof(float), &rc);
    s->att = xcalloc(B * q_dim, sizeof(float), &rc);
    s->hb = xcalloc(B * hp->n_ff, sizeof(float), &rc);
    s->hb2 = xcalloc(B * hp->n_ff, sizeof(float), &rc);
    s->proj = xcalloc(B * hp->n_embd, sizeof(float), &rc);
    s->headtmp = xcalloc(hp->head_dim, sizeof(float), &rc);
    s->att_scratch = xcalloc(n_ctx, sizeof(float), &rc);
    if (rc < 0)
        goto fail;
    *out = e;
    return 0;
fail:
    model_exec_free(e);
    return rc;
}

int model_exec_threads(const struct model_exec *e) { return e->n_threads; }

static void session_free(struct model_session *s)
{
    if (!s)
        return;
    free(s->k);
    free(s->v);
    free(s);
}

void model_exec_free(struct model_exec *e)
{
    if (!e)
        return;
    for (uint32_t i = 0; i < e->n_sess; i++)
        session_free(e->sess[i]);
    free(e->sess);
    struct model_state *s = &e->s;
    free(s->xb);
    free(s->q);
    free(s->k);
    free(s->v);
    free(s->att);
    free(s->hb);
    free(s->hb2);
    free(s->proj);
    free(s->headtmp);
    free(s->att_scratch);
    kern_pool_free(e->pool);
    free(e);
}

static struct model_session *session_find(struct model_exec *e, uint64_t id, uint32_t *idx)
{
    for (uint32_t i = 0; i < e->n_sess; i++)
        if (e->sess[i]->id == id) {
            if (idx)
                *idx = i;
            return e->sess[i];
        }
    return NULL;
}

int model_session_new(struct model_exec *e, uint64_t id)
{
    if (session_find(e, id, NULL))
        return -EEXIST;
    if (e->n_sess == e->cap_sess) {
        uint32_t cap = e->cap_sess ? e->cap_sess * 2 : 8;
        struct model_session **p = realloc(e->sess, cap * sizeof *p);
        if (!p)
            return -ENOMEM;
        e->sess = p;
        e->cap_sess = cap;
    }
    /* n_layers * n_ctx * kv_dim F16 values each for K and V; bounded by MODEL_MAX_CTX and the
     * hyperparameter caps, checked here anyway. The pages are touched only as positions fill. */
    size_t nl = e->m->last - e->m->first;
    if (e->kv_layer && nl > SIZE_MAX / sizeof(uint16_t) / e->kv_layer)
        return -ENOMEM;
    struct model_session *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    s->id = id;
    s->k = calloc(nl * e->kv_layer, sizeof(uint16_t));
    s->v = calloc(nl * e->kv_layer, sizeof(uint16_t));
    if (!s->k || !s->v) {
        session_free(s);
        return -ENOMEM;
    }
    e->sess[e->n_sess++] = s;
    return 0;
}

int model_session_free(struct model_exec *e, uint64_t id)
{
    uint32_t i;
    struct model_session *s = session_find(e, id, &i);
    if (!s)
        return -ENOENT;
    session_free(s);
    e->sess[i] = e->sess[--e->n_sess];
    return 0;
}

uint32_t model_session_pos(struct model_exec *e, uint64_t id)
{
    struct model_session *s = session_find(e, id, NULL);
    return s ? s->n_past : 0;
}

/* ---- rank 0 ---- */

int model_embed(struct model_exec *e, const int32_t *tokens, uint32_t n, float *out)
{
    const struct model *m = e->m;
    if (!m->has_embed)
        return -ENOTSUP;
    uint32_t E = m->hp.n_embd;
    size_t rb = kern_row_bytes(m->tok_embd.type, E);
    for (uint32_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= m->hp.n_vocab)
            return -EINVAL;
        const uint8_t *row = (const uint8_t *)m->tok_embd.data + (size_t)tokens[i] * rb;
        kern_ref_dequant_row(m->tok_embd.type, row, out + (size_t)i * E, E);
    }
    return 0;
}

/* ---- the layers ---- */

/* Layers of the window on x[n][n_embd] (n <= max_batch) at positions pos..pos+n-1. */
static void forward(struct model_exec *e, struct model_session *ss, uint32_t pos, uint32_t n,
                    float *x)
{
    const struct model *m = e->m;
    const struct model_hparams *hp = &m->hp;
    struct model_state *s = &e->s;
    const uint32_t E = hp->n_embd, F = hp->n_ff, hd = hp->head_dim;
    const uint32_t q_dim = hp->n_head * hd, kv_dim = hp->n_head_kv * hd;
    const float scale = 1.0f / sqrtf((float)hd);

    for (uint32_t l = 0; l < m->last - m->first; l++) {
        const struct model_layer *L = &m->layers[l];
        uint16_t *kc = ss->k + l * e->kv_layer;   /* [n_ctx][kv_dim] */
        uint16_t *vc = ss->v + l * e->kv_layer;

        /* attention: xb = rmsnorm(x) * attn_norm; q, k, v = xb Wq, xb Wk, xb Wv */
        for (uint32_t i = 0; i < n; i++)
            kern_ref_rmsnorm(s->xb + (size_t)i * E, x + (size_t)i * E, L->attn_norm, E, hp->rms_eps);
        matmul(e, &L->wq, s->xb, n, s->q);      /* [n][q_dim] */
        matmul(e, &L->wk, s->xb, n, s->k);      /* [n][kv_dim] */
        matmul(e, &L->wv, s->xb, n, s->v);      /* [n][kv_dim] */
        if (L->bq) {
            add_rows(s->q, L->bq, n, q_dim);
            add_rows(s->k, L->bk, n, kv_dim);
            add_rows(s->v, L->bv, n, kv_dim);
        }
        if (L->q_norm) {                        /* per-head RMSNorm (qwen3) */
            for (size_t h = 0; h < (size_t)n * hp->n_head; h++) {
                kern_ref_rmsnorm(s->headtmp, s->q + h * hd, L->q_norm, hd, hp->rms_eps);
                memcpy(s->q + h * hd, s->headtmp, hd * sizeof(float));
            }
            for (size_t h = 0; h < (size_t)n * hp->n_head_kv; h++) {
                kern_ref_rmsnorm(s->headtmp, s->k + h * hd, L->k_norm, hd, hp->rms_eps);
                memcpy(s->k + h * hd, s->headtmp, hd * sizeof(float));
            }
        }
        for (uint32_t i = 0; i < n; i++) {
            rope(m, s->q + (size_t)i * q_dim, hp->n_head, pos + i);
            rope(m, s->k + (size_t)i * kv_dim, hp->n_head_kv, pos + i);
        }
        /* K/V of these positions into the cache as F16 (llama.cpp's default cache type) */
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t j = 0; j < kv_dim; j++) {
                kc[(size_t)(pos + i) * kv_dim + j] = kern_f32_to_f16(s->k[(size_t)i * kv_dim + j]);
                vc[(size_t)(pos + i) * kv_dim + j] = kern_f32_to_f16(s->v[(size_t)i * kv_dim + j]);
            }
        kern_attention(e->pool, KERN_T_F16, s->att, s->q, kc, vc, n, pos, hp->n_head,
                       hp->n_head_kv, hd, kv_dim, scale, s->att_scratch);
        matmul(e, &L->wo, s->att, n, s->proj);  /* [n][E] */
        for (size_t i = 0; i < (size_t)n * E; i++)
            x[i] += s->proj[i];

        /* feed-forward: x += W_down (silu(xb W_gate) * (xb W_up)), xb = rmsnorm(x) * ffn_norm */
        for (uint32_t i = 0; i < n; i++)
            kern_ref_rmsnorm(s->xb + (size_t)i * E, x + (size_t)i * E, L->ffn_norm, E, hp->rms_eps);
        matmul(e, &L->w_gate, s->xb, n, s->hb);  /* [n][F] */
        matmul(e, &L->w_up, s->xb, n, s->hb2);   /* [n][F] */
        kern_ref_swiglu(s->hb, s->hb, s->hb2, (int64_t)n * F);
        matmul(e, &L->w_down, s->hb, n, s->proj); /* [n][E] */
        for (size_t i = 0; i < (size_t)n * E; i++)
            x[i] += s->proj[i];
    }
}

int model_window_run(struct model_exec *e, uint64_t id, uint32_t pos, uint32_t n, float *x)
{
    struct model_session *ss = session_find(e, id, NULL);
    if (!ss)
        return -ENOENT;
    if ((uint64_t)pos + n > e->n_ctx)
        return -ERANGE;
    if (pos > ss->n_past)          /* positions must follow on (a rewind is allowed) */
        return -EINVAL;
    for (uint32_t done = 0; done < n;) {
        uint32_t nb = n - done < e->max_batch ? n - done : e->max_batch;
        forward(e, ss, pos + done, nb, x + (size_t)done * e->m->hp.n_embd);
        done += nb;
    }
    ss->n_past = pos + n;
    return 0;
}

/* ---- last rank ---- */

int model_head(struct model_exec *e, const float *x, uint32_t n, float *logits)
{
    const struct model *m = e->m;
    if (!m->has_head)
        return -ENOTSUP;
    const uint32_t E = m->hp.n_embd;
    for (uint32_t done = 0; done < n;) {
        uint32_t nb = n - done < e->max_batch ? n - done : e->max_batch;
        for (uint32_t i = 0; i < nb; i++)
            kern_ref_rmsnorm(e->s.xb + (size_t)i * E, x + (size_t)(done + i) * E, m->output_norm,
                             E, m->hp.rms_eps);
        matmul(e, &m->output, e->s.xb, nb, logits + (size_t)done * m->hp.n_vocab);
        done += nb;
    }
    return 0;
}

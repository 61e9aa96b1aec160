/* exec.c — the window executor: the forward pass of layers [first, last) on a batch of rows
 * of one or several sessions, the per-session K/V caches, and the rank-0 embedding / last-rank head.
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

/* One session: the K/V of every position so far for the window's full-attention layers, and
 * the fixed-size recurrent state of its Gated DeltaNet layers. */
struct model_session {
    uint64_t id;
    uint32_t n_past;    /* positions 0..n_past-1 have been run */
    uint16_t *k, *v;    /* F16 [n_attn][n_ctx][kv_dim] */
    float *conv;        /* F32 [n_rec][conv_kernel-1][conv_dim]: previous pre-conv rows */
    float *ssm;         /* F32 [n_rec][dt_rank][d_state][d_state]: S per value head */
};

/* Scratch for up to max_batch rows (B); q_dim = n_head*head_dim, kv_dim = n_head_kv*head_dim. */
struct model_state {
    float *xb;          /* [B][n_embd] normalised input of a sub-block */
    float *q;           /* [B][q_dim] */
    float *k, *v;       /* [B][kv_dim] */
    float *att;         /* [B][q_dim] attention output, heads concatenated */
    float *hb, *hb2;    /* [B][n_ff] gate and up */
    float *proj;        /* [B][n_embd] output projection before the residual add */
    float *att_scratch; /* [n_ctx] softmax row (kern_attention keeps its threads' own) */
    float *rope_cs, *rope_sn; /* [B][n_rot/2] RoPE cos/sin of the batch's positions */
    /* gated attention (qwen35*) */
    float *qg;          /* [B][2 q_dim] per head [q | gate] */
    float *gate;        /* [B][q_dim] */
    /* Gated DeltaNet */
    float *mixed;       /* [conv_kernel-1 + B][conv_dim] conv input: state rows, then the batch */
    float *conv_out;    /* [B][conv_dim] */
    float *z;           /* [B][d_inner] */
    float *beta, *alpha;/* [B][dt_rank] */
    float *lin_o;       /* [B][d_inner] */
    float *dvec;        /* [2][d_state] kern_deltanet's vectors without a pool */
    /* routed experts */
    float *router;      /* [B][n_expert] */
    uint32_t *sel;      /* [B][n_expert_used] selected experts, best first */
    float *selw;        /* [B][n_expert_used] their renormalised weights */
    uint32_t *ex_off;   /* [n_expert + 1] start of each expert's group in ex_tok */
    uint32_t *ex_tok;   /* [B * n_expert_used] token rows grouped by expert */
    float *ex_w;        /* [B * n_expert_used] their weights */
    float *xe;          /* [B][n_embd] gathered rows of one expert's group */
    float *ye;          /* [B][n_embd] that group's expert output */
    float *shg;         /* [B] shared-expert gate */
};

/* A batch's rows of one session: rows off..off+n-1 at positions pos..pos+n-1. */
struct model_seg {
    struct model_session *ss;
    uint32_t off, n, pos;
};

struct model_exec {
    struct model *m;
    struct kern_pool *pool;
    uint32_t n_ctx, max_batch;
    size_t kv_layer;                 /* elements of one layer's K (or V) cache: n_ctx*kv_dim */
    uint32_t n_attn, n_rec;          /* full-attention and recurrent layers of the window */
    uint32_t *slot;                  /* [window layers]: index among its kind */
    uint32_t conv_dim;               /* 2 n_group d_state + d_inner */
    size_t conv_layer, ssm_layer;    /* floats of one layer's conv state and S */
    struct model_state s;
    struct model_seg *seg;           /* [max_batch]: the sessions of the batch being run */
    struct model_session **sess;     /* n_sess of cap_sess */
    uint32_t n_sess, cap_sess;
};

/* ---- kernels used by the forward pass ---- */

/* An op's error (-ENOSPC: scratch reserved too small, -EINVAL: a shape) ends the pass. */
#define TRY(call)                   \
    do {                            \
        int rc_ = (call);           \
        if (rc_ < 0)                \
            return rc_;             \
    } while (0)

/* y[n][rows] = x[n][cols] W^T */
static int matmul(struct model_exec *e, const struct model_mat *w, const float *x, uint32_t n,
                  float *y)
{
    return kern_matmul(e->pool, w->type, w->data, w->rows, w->cols, x, n, y);
}

/* Pool scratch a matmul by w of up to B rows needs (0 for an absent matrix). */
static size_t mat_scratch(const struct model_mat *w, size_t B)
{
    return w->data ? kern_matmul_scratch(w->type, w->cols, (int64_t)B) : 0;
}

static void grow(size_t *need, size_t bytes)
{
    if (bytes > *need)
        *need = bytes;
}

/* Reserves the pool's scratch for the largest op of a forward pass at n_ctx positions and
 * max_batch rows: the widest matmul's quantised activations, attention over the full context,
 * the DeltaNet vectors. Ops never grow it, so the forward pass does not allocate. */
static int reserve_scratch(struct model_exec *e)
{
    const struct model *m = e->m;
    const struct model_hparams *hp = &m->hp;
    size_t B = e->max_batch, need = 0;
    for (uint32_t l = 0; l < m->last - m->first; l++) {
        const struct model_layer *L = &m->layers[l];
        const struct model_mat *mats[] = {
            &L->wq, &L->wk, &L->wv, &L->wo, &L->wqkv, &L->wz, &L->w_beta, &L->w_alpha,
            &L->ssm_out, &L->w_gate, &L->w_up, &L->w_down, &L->gate_inp, &L->gate_exps.m,
            &L->up_exps.m, &L->down_exps.m, &L->gate_shexp, &L->up_shexp, &L->down_shexp,
            &L->gate_inp_shexp,
        };
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
            grow(&need, mat_scratch(mats[i], B));
    }
    if (m->has_head)
        grow(&need, mat_scratch(&m->output, B));
    if (e->n_attn)
        grow(&need, kern_attention_scratch(e->pool, e->n_ctx, (int)hp->head_dim));
    if (e->n_rec)
        grow(&need, kern_deltanet_scratch(e->pool, (int)hp->ssm_d_state));
    return kern_pool_reserve(e->pool, need);
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
    size_t B = max_batch;
    size_t q_dim = (size_t)hp->n_head * hp->head_dim, kv_dim = (size_t)hp->n_head_kv * hp->head_dim;
    uint32_t nl = m->last - m->first;
    e->slot = xcalloc(nl, sizeof *e->slot, &rc);
    if (rc < 0)
        goto fail;
    bool gated = false;
    for (uint32_t l = 0; l < nl; l++) {
        e->slot[l] = m->layers[l].recurrent ? e->n_rec++ : e->n_attn++;
        gated |= m->layers[l].attn_gated;
    }
    e->kv_layer = (size_t)n_ctx * kv_dim;
    e->conv_dim = 2 * hp->ssm_n_group * hp->ssm_d_state + hp->ssm_d_inner;
    size_t K1 = hp->ssm_conv_kernel ? hp->ssm_conv_kernel - 1 : 0;
    e->conv_layer = K1 * e->conv_dim;
    e->ssm_layer = (size_t)hp->ssm_dt_rank * hp->ssm_d_state * hp->ssm_d_state;
    size_t F = hp->n_ff;
    if (hp->n_ff_exp > F)
        F = hp->n_ff_exp;
    if (hp->n_ff_shexp > F)
        F = hp->n_ff_shexp;
    e->seg = xcalloc(B, sizeof *e->seg, &rc);
    struct model_state *s = &e->s;
    s->xb = xcalloc(B * hp->n_embd, sizeof(float), &rc);
    s->q = xcalloc(B * q_dim, sizeof(float), &rc);
    s->k = xcalloc(B * kv_dim, sizeof(float), &rc);
    s->v = xcalloc(B * kv_dim, sizeof(float), &rc);
    s->att = xcalloc(B * q_dim, sizeof(float), &rc);
    s->hb = xcalloc(B * F, sizeof(float), &rc);
    s->hb2 = xcalloc(B * F, sizeof(float), &rc);
    s->proj = xcalloc(B * hp->n_embd, sizeof(float), &rc);
    s->att_scratch = xcalloc(n_ctx, sizeof(float), &rc);
    if (e->n_attn) {
        s->rope_cs = xcalloc(B * (hp->n_rot / 2), sizeof(float), &rc);
        s->rope_sn = xcalloc(B * (hp->n_rot / 2), sizeof(float), &rc);
    }
    if (gated) {
        s->qg = xcalloc(B * 2 * q_dim, sizeof(float), &rc);
        s->gate = xcalloc(B * q_dim, sizeof(float), &rc);
    }
    if (e->n_rec) {
        s->mixed = xcalloc((K1 + B) * e->conv_dim, sizeof(float), &rc);
        s->conv_out = xcalloc(B * e->conv_dim, sizeof(float), &rc);
        s->z = xcalloc(B * hp->ssm_d_inner, sizeof(float), &rc);
        s->beta = xcalloc(B * hp->ssm_dt_rank, sizeof(float), &rc);
        s->alpha = xcalloc(B * hp->ssm_dt_rank, sizeof(float), &rc);
        s->lin_o = xcalloc(B * hp->ssm_d_inner, sizeof(float), &rc);
        s->dvec = xcalloc(2 * (size_t)hp->ssm_d_state, sizeof(float), &rc);
    }
    if (hp->n_expert) {
        size_t X = hp->n_expert, k = hp->n_expert_used;
        s->router = xcalloc(B * X, sizeof(float), &rc);
        s->sel = xcalloc(B * k, sizeof(uint32_t), &rc);
        s->selw = xcalloc(B * k, sizeof(float), &rc);
        s->ex_off = xcalloc(X + 1, sizeof(uint32_t), &rc);
        s->ex_tok = xcalloc(B * k, sizeof(uint32_t), &rc);
        s->ex_w = xcalloc(B * k, sizeof(float), &rc);
        s->xe = xcalloc(B * hp->n_embd, sizeof(float), &rc);
        s->ye = xcalloc(B * hp->n_embd, sizeof(float), &rc);
        s->shg = xcalloc(B, sizeof(float), &rc);
    }
    if (rc < 0 || (rc = reserve_scratch(e)) < 0)
        goto fail;
    *out = e;
    return 0;
fail:
    model_exec_free(e);
    return rc;
}

int model_exec_threads(const struct model_exec *e) { return kern_pool_threads(e->pool); }

static void session_free(struct model_session *s)
{
    if (!s)
        return;
    free(s->k);
    free(s->v);
    free(s->conv);
    free(s->ssm);
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
    free(s->att_scratch);
    free(s->rope_cs);
    free(s->rope_sn);
    free(s->qg);
    free(s->gate);
    free(s->mixed);
    free(s->conv_out);
    free(s->z);
    free(s->beta);
    free(s->alpha);
    free(s->lin_o);
    free(s->dvec);
    free(s->router);
    free(s->sel);
    free(s->selw);
    free(s->ex_off);
    free(s->ex_tok);
    free(s->ex_w);
    free(s->xe);
    free(s->ye);
    free(s->shg);
    free(e->slot);
    free(e->seg);
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
    /* n_attn * n_ctx * kv_dim F16 values each for K and V; bounded by MODEL_MAX_CTX and the
     * hyperparameter caps, checked here anyway. The pages are touched only as positions fill.
     * Recurrent layers: conv state and S, fixed size. */
    size_t na = e->n_attn, nr = e->n_rec;
    if ((e->kv_layer && na > SIZE_MAX / sizeof(uint16_t) / e->kv_layer) ||
        (e->ssm_layer && nr > SIZE_MAX / sizeof(float) / (e->ssm_layer + e->conv_layer)))
        return -ENOMEM;
    struct model_session *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    s->id = id;
    int rc = 0;
    s->k = xcalloc(na * e->kv_layer, sizeof(uint16_t), &rc);
    s->v = xcalloc(na * e->kv_layer, sizeof(uint16_t), &rc);
    s->conv = xcalloc(nr * e->conv_layer, sizeof(float), &rc);
    s->ssm = xcalloc(nr * e->ssm_layer, sizeof(float), &rc);
    if (rc < 0) {
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

/* Gated attention's wq rows are per head [q | gate]: q and gate each [n][q_dim] (a copy, the
 * ops below take contiguous heads). */
static void split_q_gate(const float *qg, float *q, float *gate, size_t n, size_t n_head,
                         size_t hd)
{
    for (size_t i = 0; i < n * n_head; i++) {
        memcpy(q + i * hd, qg + i * 2 * hd, hd * sizeof(float));
        memcpy(gate + i * hd, qg + i * 2 * hd + hd, hd * sizeof(float));
    }
}

/* Attention mixer on xb[n] into proj[n]: the projections over all rows, then per session
 * (seg[0..nseg)) the K/V store into its cache (layer `slot`) and attention over it.
 * Gated (qwen35*): wq gives per head [q | gate], the output is scaled by sigmoid(gate). */
static int attention(struct model_exec *e, const struct model_layer *L, size_t slot,
                     uint32_t nseg, uint32_t n)
{
    const struct model_hparams *hp = &e->m->hp;
    struct model_state *s = &e->s;
    struct kern_pool *p = e->pool;
    const uint32_t hd = hp->head_dim, q_dim = hp->n_head * hd, kv_dim = hp->n_head_kv * hd;
    const float scale = 1.0f / sqrtf((float)hd);

    if (L->attn_gated) {
        TRY(matmul(e, &L->wq, s->xb, n, s->qg));                 /* [n][n_head][q | gate] */
        split_q_gate(s->qg, s->q, s->gate, n, hp->n_head, hd);   /* [n][q_dim] each */
    } else {
        TRY(matmul(e, &L->wq, s->xb, n, s->q));                  /* [n][q_dim] */
    }
    TRY(matmul(e, &L->wk, s->xb, n, s->k));                      /* [n][kv_dim] */
    TRY(matmul(e, &L->wv, s->xb, n, s->v));                      /* [n][kv_dim] */
    if (L->bq) {
        kern_add_rows(p, s->q, L->bq, n, q_dim);                 /* [n][q_dim] += [q_dim] */
        kern_add_rows(p, s->k, L->bk, n, kv_dim);                /* [n][kv_dim] += [kv_dim] */
        kern_add_rows(p, s->v, L->bv, n, kv_dim);
    }
    if (L->q_norm) {                         /* per-head RMSNorm (qwen3 and later), in place */
        kern_rmsnorm_rows(p, s->q, s->q, L->q_norm, (int64_t)n * hp->n_head, hd, hp->rms_eps);
        kern_rmsnorm_rows(p, s->k, s->k, L->k_norm, (int64_t)n * hp->n_head_kv, hd,
                          hp->rms_eps);                          /* [n * n_head(_kv)][hd] */
    }
    /* the first n_rot dims of each head, by the batch's angles [n][n_rot/2] */
    kern_rope_rows(p, s->q, n, q_dim, hp->n_head, hd, hp->n_rot, s->rope_cs, s->rope_sn,
                   hp->rope_neox);                               /* [n][n_head][hd] */
    kern_rope_rows(p, s->k, n, kv_dim, hp->n_head_kv, hd, hp->n_rot, s->rope_cs, s->rope_sn,
                   hp->rope_neox);                               /* [n][n_head_kv][hd] */
    for (uint32_t j = 0; j < nseg; j++) {
        const struct model_seg *g = &e->seg[j];
        uint16_t *kc = g->ss->k + slot * e->kv_layer, *vc = g->ss->v + slot * e->kv_layer;
        /* K/V of these positions into the cache as F16 (llama.cpp's default cache type) */
        kern_kv_store(p, KERN_T_F16, kc + (size_t)g->pos * kv_dim, kv_dim,
                      s->k + (size_t)g->off * kv_dim, g->n, kv_dim);
        kern_kv_store(p, KERN_T_F16, vc + (size_t)g->pos * kv_dim, kv_dim,
                      s->v + (size_t)g->off * kv_dim, g->n, kv_dim);
        TRY(kern_attention(p, KERN_T_F16, s->att + (size_t)g->off * q_dim,
                           s->q + (size_t)g->off * q_dim, kc, vc, g->n, g->pos, hp->n_head,
                           hp->n_head_kv, hd, kv_dim, scale, s->att_scratch)); /* [g.n][q_dim] */
    }
    if (L->attn_gated)
        kern_mul_sigmoid(p, s->att, s->gate, (int64_t)n * q_dim); /* [n][q_dim] */
    return matmul(e, &L->wo, s->att, n, s->proj);                /* [n][E] */
}

/* Gated DeltaNet mixer on xb[n] into proj[n], carrying each session's conv state
 * (conv_kernel-1 rows) and S (dt_rank heads of d x d, S[i][j]: key dim i, value dim j) of
 * recurrent layer `slot`. The projections run over all rows, the conv and the recurrence per
 * session (token by token for a prompt chunk too, in F32). */
static int deltanet(struct model_exec *e, const struct model_layer *L, size_t slot,
                    uint32_t nseg, uint32_t n)
{
    const struct model_hparams *hp = &e->m->hp;
    struct model_state *s = &e->s;
    struct kern_pool *p = e->pool;
    const uint32_t d = hp->ssm_d_state, Hk = hp->ssm_n_group, Hv = hp->ssm_dt_rank;
    const uint32_t CD = e->conv_dim, K = hp->ssm_conv_kernel;
    const size_t K1 = K - 1;

    /* mixed = [K1 free rows | the batch's rows of xb Wqkv]; z, beta, alpha projections */
    TRY(matmul(e, &L->wqkv, s->xb, n, s->mixed + K1 * CD));      /* [n][CD] */
    TRY(matmul(e, &L->wz, s->xb, n, s->z));                      /* [n][Hv][d] */
    TRY(matmul(e, &L->w_beta, s->xb, n, s->beta));               /* [n][Hv] */
    TRY(matmul(e, &L->w_alpha, s->xb, n, s->alpha));             /* [n][Hv] */
    /* Per session, in batch order: its conv state goes into the K1 rows before its own rows
     * (the previous session's rows, already convolved), then the conv of its rows, and the
     * last K1 rows of [state | rows] are its new state. */
    for (uint32_t j = 0; j < nseg; j++) {
        const struct model_seg *g = &e->seg[j];
        float *conv_state = g->ss->conv + slot * e->conv_layer, *in = s->mixed + (size_t)g->off * CD;
        memcpy(in, conv_state, K1 * CD * sizeof(float));
        kern_conv_silu(p, s->conv_out + (size_t)g->off * CD, in, L->conv1d, g->n, CD,
                       (int)K);                                  /* [g.n][CD] */
        memcpy(conv_state, in + (size_t)g->n * CD, K1 * CD * sizeof(float));
    }

    /* conv_out rows: [q: Hk][d] | [k: Hk][d] | [v: Hv][d] */
    kern_l2norm(p, s->conv_out, n, CD, (int)(2 * Hk), (int)d, hp->rms_eps); /* q, k heads */
    for (uint32_t j = 0; j < nseg; j++) {
        const struct model_seg *g = &e->seg[j];
        const float *q = s->conv_out + (size_t)g->off * CD, *k = q + (size_t)Hk * d,
                    *v = k + (size_t)Hk * d;
        TRY(kern_deltanet(p, s->lin_o + (size_t)g->off * Hv * d,
                          g->ss->ssm + slot * e->ssm_layer, q, k, v, CD,
                          s->beta + (size_t)g->off * Hv, s->alpha + (size_t)g->off * Hv,
                          L->dt_bias, L->ssm_a, g->n, (int)Hk, (int)Hv, (int)d,
                          s->dvec));                             /* [g.n][Hv][d] */
    }
    kern_rmsnorm_silu(p, s->lin_o, s->lin_o, L->ssm_norm, s->z, (int64_t)n * Hv, d,
                      hp->rms_eps);                              /* [n * Hv][d] */
    return matmul(e, &L->ssm_out, s->lin_o, n, s->proj);         /* [n][E] */
}

/* SwiGLU FFN on x[n] into y[n]: y = W_down (silu(x W_gate) * (x W_up)). */
static int swiglu_ffn(struct model_exec *e, const struct model_mat *gate,
                      const struct model_mat *up, const struct model_mat *down, const float *x,
                      uint32_t n, float *y)
{
    struct model_state *s = &e->s;
    TRY(matmul(e, gate, x, n, s->hb));                           /* [n][F] */
    TRY(matmul(e, up, x, n, s->hb2));                            /* [n][F] */
    kern_swiglu(e->pool, s->hb, s->hb, s->hb2, (int64_t)n * gate->rows); /* [n][F] */
    return matmul(e, down, s->hb, n, y);                         /* [n][E] */
}

/* The n x k routing choices grouped by expert (a counting sort): expert x's rows are
 * ex_tok/ex_w[ex_off[x] .. ex_off[x+1]), so each selected expert's slice is read once per
 * batch. Index bookkeeping, no arithmetic. */
static void group_by_expert(struct model_state *s, uint32_t n, uint32_t X, uint32_t k)
{
    memset(s->ex_off, 0, (X + 1) * sizeof(uint32_t));
    for (size_t i = 0; i < (size_t)n * k; i++)
        s->ex_off[s->sel[i] + 1]++;
    for (uint32_t x = 0; x < X; x++)                     /* group starts */
        s->ex_off[x + 1] += s->ex_off[x];
    for (size_t i = 0; i < (size_t)n * k; i++) {
        uint32_t at = s->ex_off[s->sel[i]]++;
        s->ex_tok[at] = (uint32_t)(i / k);
        s->ex_w[at] = s->selw[i];
    }
    for (uint32_t x = X; x > 0; x--)                     /* back to starts */
        s->ex_off[x] = s->ex_off[x - 1];
    s->ex_off[0] = 0;
}

/* Routed experts on xb[n] into proj[n]: p = softmax(router), the top n_expert_used by p with
 * weights p / sum(p_sel); rows grouped by expert (and no other expert is touched); then the
 * shared expert, gated by a sigmoid. */
static int moe(struct model_exec *e, const struct model_layer *L, uint32_t n)
{
    const struct model_hparams *hp = &e->m->hp;
    struct model_state *s = &e->s;
    struct kern_pool *p = e->pool;
    const uint32_t X = hp->n_expert, k = hp->n_expert_used, E = hp->n_embd;

    TRY(matmul(e, &L->gate_inp, s->xb, n, s->router));           /* [n][X] */
    kern_moe_route(p, s->sel, s->selw, s->router, n, (int)X, (int)k); /* [n][k] */
    group_by_expert(s, n, X, k);

    memset(s->proj, 0, (size_t)n * E * sizeof(float));
    for (uint32_t x = 0; x < X; x++) {
        uint32_t a = s->ex_off[x], ne = s->ex_off[x + 1] - a;
        if (!ne)
            continue;
        for (uint32_t j = 0; j < ne; j++)                        /* gather [ne][E] */
            memcpy(s->xe + (size_t)j * E, s->xb + (size_t)s->ex_tok[a + j] * E, E * sizeof(float));
        struct model_mat g = model_expert(&L->gate_exps, x), u = model_expert(&L->up_exps, x),
                         dn = model_expert(&L->down_exps, x);
        TRY(swiglu_ffn(e, &g, &u, &dn, s->xe, ne, s->ye));       /* [ne][E] */
        kern_axpy_rows(p, s->proj, s->ex_w + a, s->ye, s->ex_tok + a, ne, E); /* proj[tok] += w ye */
    }
    if (L->gate_shexp.data) {
        TRY(matmul(e, &L->gate_inp_shexp, s->xb, n, s->shg));    /* [n][1] */
        kern_sigmoid(p, s->shg, n);
        TRY(swiglu_ffn(e, &L->gate_shexp, &L->up_shexp, &L->down_shexp, s->xb, n, s->ye));
        kern_axpy_rows(p, s->proj, s->shg, s->ye, NULL, n, E);   /* [n][E] += shg ye */
    }
    return 0;
}

/* Layers of the window on x[n][n_embd] (n <= max_batch), the rows of sessions seg[0..nseg)
 * (consecutive, covering all n rows). */
static int forward(struct model_exec *e, uint32_t nseg, uint32_t n, float *x)
{
    const struct model *m = e->m;
    const struct model_hparams *hp = &m->hp;
    struct model_state *s = &e->s;
    struct kern_pool *p = e->pool;
    const uint32_t E = hp->n_embd;

    const size_t half = hp->n_rot / 2;
    for (uint32_t j = 0; e->n_attn && j < nseg; j++) { /* RoPE angles of the rows' positions */
        const struct model_seg *g = &e->seg[j];
        kern_rope_angles(p, s->rope_cs + g->off * half, s->rope_sn + g->off * half, g->n, g->pos,
                         (int)hp->n_rot, hp->rope_base, hp->rope_scale,
                         m->rope_freqs);                         /* [g.n][n_rot/2] each */
    }
    for (uint32_t l = 0; l < m->last - m->first; l++) {
        const struct model_layer *L = &m->layers[l];
        size_t slot = e->slot[l];

        /* mixer: x += mixer(rmsnorm(x) * attn_norm) */
        kern_rmsnorm_rows(p, s->xb, x, L->attn_norm, n, E, hp->rms_eps); /* [n][E] */
        if (L->recurrent)
            TRY(deltanet(e, L, slot, nseg, n));
        else
            TRY(attention(e, L, slot, nseg, n));
        kern_add(p, x, s->proj, (int64_t)n * E);                 /* [n][E] */

        /* feed-forward: x += ffn(rmsnorm(x) * ffn_norm), dense SwiGLU or routed experts */
        kern_rmsnorm_rows(p, s->xb, x, L->ffn_norm, n, E, hp->rms_eps); /* [n][E] */
        if (L->gate_inp.data)
            TRY(moe(e, L, n));
        else
            TRY(swiglu_ffn(e, &L->w_gate, &L->w_up, &L->w_down, s->xb, n, s->proj));
        kern_add(p, x, s->proj, (int64_t)n * E);                 /* [n][E] */
    }
    return 0;
}

/* Whether session ss may run n positions from pos: -ERANGE past the context, -EINVAL for a
 * skip or (with recurrent layers) a rewind other than to 0. */
static int check_pos(const struct model_exec *e, const struct model_session *ss, uint32_t pos,
                     uint32_t n)
{
    if ((uint64_t)pos + n > e->n_ctx)
        return -ERANGE;
    if (pos > ss->n_past)          /* positions must follow on (a rewind is allowed) */
        return -EINVAL;
    if (e->n_rec && pos != ss->n_past && pos != 0)
        return -EINVAL;            /* recurrent state cannot be rewound, only restarted */
    return 0;
}

/* A checked rewind: the recurrent state restarts from position 0. */
static void rewind_state(struct model_exec *e, struct model_session *ss, uint32_t pos)
{
    if (e->n_rec && pos != ss->n_past) {
        memset(ss->conv, 0, e->n_rec * e->conv_layer * sizeof(float));
        memset(ss->ssm, 0, e->n_rec * e->ssm_layer * sizeof(float));
    }
}

int model_window_run(struct model_exec *e, uint64_t id, uint32_t pos, uint32_t n, float *x)
{
    struct model_session *ss = session_find(e, id, NULL);
    if (!ss)
        return -ENOENT;
    int rc = check_pos(e, ss, pos, n);
    if (rc < 0)
        return rc;
    rewind_state(e, ss, pos);
    for (uint32_t done = 0; done < n;) {
        uint32_t nb = n - done < e->max_batch ? n - done : e->max_batch;
        e->seg[0] = (struct model_seg){ss, 0, nb, pos + done};
        rc = forward(e, 1, nb, x + (size_t)done * e->m->hp.n_embd);
        if (rc < 0) {
            ss->n_past = pos + done;   /* positions before the failed batch stand */
            return rc;
        }
        done += nb;
    }
    ss->n_past = pos + n;
    return 0;
}

int model_window_run_batch(struct model_exec *e, const struct model_batch_row *rows, uint32_t n,
                           float *x)
{
    if (n > e->max_batch)
        return -EINVAL;
    /* Check every row and find the sessions' runs before anything changes. */
    uint32_t nseg = 0;
    for (uint32_t i = 0; i < n;) {
        struct model_session *ss = session_find(e, rows[i].id, NULL);
        if (!ss)
            return -ENOENT;
        uint32_t len = 1;
        while (i + len < n && rows[i + len].id == rows[i].id) {
            if ((uint64_t)rows[i + len].pos != (uint64_t)rows[i].pos + len)
                return -EINVAL;    /* a session's rows are at consecutive positions */
            len++;
        }
        for (uint32_t j = 0; j < nseg; j++)
            if (e->seg[j].ss == ss)
                return -EINVAL;    /* a session's rows are consecutive in the batch */
        int rc = check_pos(e, ss, rows[i].pos, len);
        if (rc < 0)
            return rc;
        e->seg[nseg++] = (struct model_seg){ss, i, len, rows[i].pos};
        i += len;
    }
    if (!nseg)
        return 0;
    for (uint32_t j = 0; j < nseg; j++)
        rewind_state(e, e->seg[j].ss, e->seg[j].pos);
    int rc = forward(e, nseg, n, x);
    for (uint32_t j = 0; j < nseg; j++)   /* on an error each session stays before the batch */
        e->seg[j].ss->n_past = e->seg[j].pos + (rc < 0 ? 0 : e->seg[j].n);
    return rc < 0 ? rc : 0;
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
        kern_rmsnorm_rows(e->pool, e->s.xb, x + (size_t)done * E, m->output_norm, nb, E,
                          m->hp.rms_eps);
        TRY(matmul(e, &m->output, e->s.xb, nb, logits + (size_t)done * m->hp.n_vocab));
        done += nb;
    }
    return 0;
}

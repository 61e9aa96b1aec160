/* exec.c — the window executor: the forward pass of layers [first, last) on a batch of rows
 * of one or several sessions, the per-session K/V caches, and the rank-0 embedding / last-rank head.
 *
 * Numerics follow llama.cpp's CPU graph (what the references were made with): matmuls with
 * ggml's activation rounding (kern_dev_matmul), K and V stored as F16, attention over the cache
 * with scale 1/sqrt(head_dim), RMSNorm then the weight product, SwiGLU FFN. Every row is
 * computed the same way whatever the batch, so a window split into several consecutive
 * windows gives bit-identical results. Scratch is allocated once in model_exec_new; the
 * forward pass does not allocate.
 *
 * Everything runs on a kernel device (docs/devices.md): weights, scratch and sessions' K/V
 * and state are its buffers, ops name operands as (buffer, offset), and the caller's rows
 * are bound to boundary buffers for one call (in place on "cpu"). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "kernels/kern.h"
#include "model/internal.h"
#include "util/util.h"

/* One session: the K/V of every position so far for the window's full-attention layers, and
 * the fixed-size recurrent state of its Gated DeltaNet layers, in buffers of the device. */
struct model_session {
    uint64_t id;
    uint32_t n_past;        /* positions 0..n_past-1 have been run */
    uint32_t mtp_past;      /* MTP block: its entries 0..mtp_past-1 hold (model_mtp_draft) */
    struct kern_buf *k, *v; /* F16 [n_attn (+1: the MTP block's, last)][n_ctx][kv_dim] */
    struct kern_buf *conv;  /* F32 [n_rec][conv_kernel-1][conv_dim]: previous pre-conv rows */
    struct kern_buf *ssm;   /* F32 [n_rec][dt_rank][d_state][d_state]: S per value head */
    uint8_t *ckpt;          /* host copy of conv then ssm at n_past ckpt_pos (drafting) */
    uint32_t ckpt_pos;
    bool has_ckpt;
};

/* Scratch for up to max_batch rows (B), device buffers; q_dim = n_head*head_dim, kv_dim =
 * n_head_kv*head_dim. */
struct model_state {
    struct kern_buf *xb;    /* [B][n_embd] normalised input of a sub-block */
    struct kern_buf *q;     /* [B][q_dim] */
    struct kern_buf *k, *v; /* [B][kv_dim] */
    struct kern_buf *att;   /* [B][q_dim] attention output, heads concatenated */
    struct kern_buf *hb, *hb2; /* [B][n_ff] gate and up */
    struct kern_buf *proj;  /* [B][n_embd] output projection before the residual add */
    struct kern_buf *rope_cs, *rope_sn; /* [B][n_rot/2] RoPE cos/sin of the batch's positions */
    struct kern_buf *tok;   /* [B] int32 token ids of an embedding */
    /* multi-token prediction */
    struct kern_buf *mcat;  /* [B][2 n_embd] [enorm(embedding) | hnorm(hidden)] */
    struct kern_buf *mx;    /* [B][n_embd] the MTP block's rows */
    /* gated attention (qwen35*) */
    struct kern_buf *qg;    /* [B][2 q_dim] per head [q | gate] */
    struct kern_buf *gate;  /* [B][q_dim] */
    /* Gated DeltaNet */
    struct kern_buf *mixed; /* [conv_kernel-1 + B][conv_dim] conv input: state rows, then the batch */
    struct kern_buf *conv_out; /* [B][conv_dim] */
    struct kern_buf *z;     /* [B][d_inner] */
    struct kern_buf *beta, *alpha; /* [B][dt_rank] */
    struct kern_buf *lin_o; /* [B][d_inner] */
    /* routed experts */
    struct kern_buf *router; /* [B][n_expert] */
    struct kern_buf *sel;   /* [B][n_expert_used] uint32 selected experts, best first */
    struct kern_buf *selw;  /* [B][n_expert_used] their renormalised weights */
    struct kern_buf *ex_tok; /* [B * n_expert_used] uint32 token rows grouped by expert */
    struct kern_buf *ex_w;  /* [B * n_expert_used] their weights */
    struct kern_buf *xe;    /* [B][n_embd] gathered rows of one expert's group */
    struct kern_buf *ye;    /* [B][n_embd] that group's expert output */
    struct kern_buf *shg;   /* [B] shared-expert gate */
    /* the routing read back to the host, where the rows are grouped by expert */
    uint32_t *h_sel;        /* [B][n_expert_used] */
    float *h_selw;          /* [B][n_expert_used] */
    uint32_t *h_ex_off;     /* [n_expert + 1] start of each expert's group in h_ex_tok */
    uint32_t *h_ex_tok;     /* [B * n_expert_used] */
    float *h_ex_w;          /* [B * n_expert_used] */
};

/* A batch's rows of one session: rows off..off+n-1 at positions pos..pos+n-1. */
struct model_seg {
    struct model_session *ss;
    uint32_t off, n, pos;
};

/* A weight tensor of the window as a buffer of the device (a view on a host device). */
struct model_wbuf {
    const uint8_t *p;
    size_t size;
    struct kern_buf *b;
};

struct model_exec {
    struct model *m;
    struct kern_dev *dev;
    uint32_t n_ctx, max_batch;
    size_t kv_layer;                 /* elements of one layer's K (or V) cache: n_ctx*kv_dim */
    uint32_t n_attn, n_rec;          /* full-attention and recurrent layers of the window */
    uint32_t n_kv;                   /* K/V slots of a session: n_attn, + 1 with the MTP block */
    uint32_t *slot;                  /* [window layers]: index among its kind */
    uint32_t conv_dim;               /* 2 n_group d_state + d_inner */
    size_t conv_layer, ssm_layer;    /* floats of one layer's conv state and S */
    struct model_wbuf *w;            /* n_w weight tensors, by address */
    uint32_t n_w;
    /* The weights the forward pass reads, as the model's views with each one's operand bound
     * (bind_weights): n_blocks(m) blocks (the window's, then its MTP block), the globals. */
    struct model_layer *blk;
    struct model_mat tok_embd, output;
    struct model_vec output_norm, rope_freqs;
    struct kern_buf *io_x;           /* boundary: [B][n_embd] rows in and out */
    struct kern_buf *io_logits;      /* boundary: [B][n_vocab] logits out (last rank) */
    struct model_state s;
    struct model_seg *seg;           /* [max_batch]: the sessions of the batch being run */
    float *h_rows;                   /* MTP: host [B][n_embd] hidden rows of a call */
    float *h_logits;                 /* MTP: host [n_vocab] a draft's logits */
    struct model_session **sess;     /* n_sess of cap_sess */
    uint32_t n_sess, cap_sess;
};

/* ---- operands of the forward pass ---- */

/* An op's error (-ENOSPC: scratch reserved too small, -EINVAL: a shape) ends the pass. */
#define TRY(call)                   \
    do {                            \
        int rc_ = (call);           \
        if (rc_ < 0)                \
            return rc_;             \
    } while (0)

/* Element i of a buffer of 4-byte elements (f32, or uint32/int32 indices). */
static inline struct kern_at AT(struct kern_buf *b, size_t i)
{
    return kern_at_make(b, i * sizeof(float));
}

/* The buffer and offset of weight bytes p (a view into the mapping: a tensor, or a part of one
 * such as a fused tensor's second half); no operand for NULL or bytes outside every tensor of
 * the window. Only bind_weights looks a weight up: the forward pass reads bound operands. */
static struct kern_at wat(const struct model_exec *e, const void *p)
{
    const uint8_t *q = p;
    struct kern_at none = {NULL, 0};
    if (!q)
        return none;
    uint32_t lo = 0, hi = e->n_w;                   /* the last tensor starting at or before q */
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (e->w[mid].p <= q)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0 || (size_t)(q - e->w[lo - 1].p) >= e->w[lo - 1].size)
        return none;
    return kern_at_make(e->w[lo - 1].b, (size_t)(q - e->w[lo - 1].p));
}

/* y[n][rows] = x[n][cols] W^T */
static int matmul(struct model_exec *e, const struct model_mat *w, struct kern_at x, uint32_t n,
                  struct kern_at y)
{
    return kern_dev_matmul(e->dev, w->type, w->at, w->rows, w->cols, x, n, y);
}

/* bytes from src to dst on the device. */
static int copy(struct model_exec *e, struct kern_at dst, struct kern_at src, size_t bytes)
{
    return kern_dev_copy_rows(e->dev, dst, 0, src, 0, 1, (struct kern_at){NULL, 0}, 1, bytes);
}

/* Device scratch a matmul by w of up to B rows needs (0 for an absent matrix). */
static size_t mat_scratch(const struct model_exec *e, const struct model_mat *w, size_t B)
{
    return w->data ? kern_dev_matmul_scratch(e->dev, w->type, w->cols, (int64_t)B) : 0;
}

static void grow(size_t *need, size_t bytes)
{
    if (bytes > *need)
        *need = bytes;
}

/* The matrices of layer L (absent ones have no data), experts as their expert 0. With
 * LAYER_VECS, every weight of a block: bind_weights binds exactly these, so a new field of
 * struct model_layer goes in one of the two lists. */
#define LAYER_MATS(L)                                                                            \
    {                                                                                            \
        &(L)->wq, &(L)->wk, &(L)->wv, &(L)->wo, &(L)->wqkv, &(L)->wz, &(L)->w_beta,              \
        &(L)->w_alpha, &(L)->ssm_out, &(L)->w_gate, &(L)->w_up, &(L)->w_down, &(L)->gate_inp,    \
        &(L)->gate_exps.m, &(L)->up_exps.m, &(L)->down_exps.m, &(L)->gate_shexp,                 \
        &(L)->up_shexp, &(L)->down_shexp, &(L)->gate_inp_shexp, &(L)->eh_proj,                   \
    }

/* The vectors of layer L (absent ones have no data). */
#define LAYER_VECS(L)                                                                            \
    {                                                                                            \
        &(L)->attn_norm, &(L)->bq, &(L)->bk, &(L)->bv, &(L)->q_norm, &(L)->k_norm,               \
        &(L)->conv1d, &(L)->dt_bias, &(L)->ssm_a, &(L)->ssm_norm, &(L)->ffn_norm, &(L)->enorm,   \
        &(L)->hnorm, &(L)->head_norm,                                                            \
    }

/* The window's blocks and, last, its MTP block: what the executor holds weights and scratch
 * for (the model's block_at(m, i), i < n_blocks(m); bound, the executor's blk[i]). */
static uint32_t n_blocks(const struct model *m)
{
    return m->last - m->first + (m->has_mtp ? 1u : 0u);
}

static const struct model_layer *block_at(const struct model *m, uint32_t i)
{
    return i < m->last - m->first ? &m->layers[i] : &m->mtp;
}

/* n matrices like w, back to back from w's data, as what fills their weight buffer, which
 * only matmuls read: the device may keep it in a layout of its own (docs/devices.md). */
static int weight_use(struct model_exec *e, const struct model_mat *w, uint32_t n)
{
    struct kern_at a = w->at;
    size_t rb = kern_row_bytes(w->type, w->cols);
    if (!a.buf || a.off != 0 || w->data == e->m->tok_embd.data || rb == 0 ||
        kern_buf_size(a.buf) != (size_t)n * w->rows * rb)
        return 0; /* a slice of a tensor, or the embedding get_rows reads */
    return kern_buf_weight_use(a.buf, w->type, w->rows, w->cols, n, true);
}

/* Every matrix of the window read only by matmuls, offered to the device for its layout; the
 * mapping's pages of those it keeps in its own are dropped, so the window is resident once. */
static int weights_use(struct model_exec *e)
{
    const struct model *m = e->m;
    int rc = 0;
    for (uint32_t l = 0; rc == 0 && l < n_blocks(m); l++) {
        const struct model_layer *L = &e->blk[l];
        const struct model_mat *mats[] = LAYER_MATS(L);
        const struct model_exps *exps[] = {&L->gate_exps, &L->up_exps, &L->down_exps};
        for (size_t i = 0; rc == 0 && i < sizeof mats / sizeof mats[0]; i++) {
            uint32_t n = 1;
            for (size_t k = 0; k < 3; k++)
                if (mats[i] == &exps[k]->m)
                    n = exps[k]->stride == kern_row_bytes(mats[i]->type, mats[i]->cols) *
                                               mats[i]->rows ? exps[k]->n : 0;
            if (mats[i]->data && n)
                rc = weight_use(e, mats[i], n);
        }
    }
    if (rc == 0 && m->has_head && e->output.data)
        rc = weight_use(e, &e->output, 1);
    return rc;
}

/* Reserves the device's scratch for the largest op of a forward pass at n_ctx positions and
 * max_batch rows: the widest matmul's quantised activations, attention over the full context,
 * the DeltaNet vectors. Ops never grow it, so the forward pass does not allocate. */
static int reserve_scratch(struct model_exec *e)
{
    const struct model *m = e->m;
    const struct model_hparams *hp = &m->hp;
    size_t B = e->max_batch, need = 0;
    for (uint32_t l = 0; l < n_blocks(m); l++) {
        const struct model_mat *mats[] = LAYER_MATS(&e->blk[l]);
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
            grow(&need, mat_scratch(e, mats[i], B));
    }
    if (m->has_head)
        grow(&need, mat_scratch(e, &e->output, B));
    if (e->n_kv)
        grow(&need, kern_dev_attention_scratch(e->dev, e->n_ctx, (int)hp->head_dim));
    if (e->n_rec)
        grow(&need, kern_dev_deltanet_scratch(e->dev, (int)hp->ssm_d_state));
    return kern_dev_reserve(e->dev, need);
}

/* ---- executor ---- */

static void *xcalloc(size_t n, size_t size, int *rc)
{
    void *p = n ? calloc(n, size) : NULL;
    if (n && !p)
        *rc = -ENOMEM;
    return p;
}

/* A zeroed buffer of n elements of size bytes (none for n 0) of kind on the device; the
 * first failure stays in *rc and later calls do nothing. */
static struct kern_buf *dbuf(struct model_exec *e, enum kern_buf_kind kind, size_t n,
                             size_t size, int *rc)
{
    struct kern_buf *b = NULL;
    if (n && *rc == 0) {
        int r = n > SIZE_MAX / size ? -ENOMEM : kern_buf_new(&b, e->dev, kind, n * size, NULL);
        if (r < 0)
            *rc = r;
    }
    return b;
}

/* The same with 4-byte elements (f32, uint32 and int32 indices). */
static struct kern_buf *xbuf(struct model_exec *e, enum kern_buf_kind kind, size_t n, int *rc)
{
    return dbuf(e, kind, n, sizeof(float), rc);
}

static int wbuf_cmp(const void *a, const void *b)
{
    const uint8_t *p = ((const struct model_wbuf *)a)->p, *q = ((const struct model_wbuf *)b)->p;
    return p < q ? -1 : p > q;
}

/* Every mapped tensor of the window as a weight buffer of the device, sorted by address. */
static int weights_open(struct model_exec *e)
{
    const struct gguf_file *f = e->m->gf;
    uint64_t nt = gguf_tensor_count(f);
    if (nt > UINT32_MAX)
        return -EINVAL;
    int rc = 0;
    e->w = xcalloc(nt, sizeof *e->w, &rc);
    if (rc < 0)
        return rc;
    for (uint64_t i = 0; i < nt; i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        if (!t->data || !t->size)
            continue;
        struct model_wbuf *w = &e->w[e->n_w];
        w->p = t->data;
        w->size = (size_t)t->size;
        if ((rc = kern_buf_new(&w->b, e->dev, KERN_BUF_WEIGHT, w->size, t->data)) < 0)
            return rc;
        e->n_w++;
    }
    qsort(e->w, e->n_w, sizeof *e->w, wbuf_cmp);
    return 0;
}

/* Binds a weight view's operand to the buffer holding its bytes: -EINVAL if none does. */
static int bind_at(const struct model_exec *e, const void *data, struct kern_at *at)
{
    *at = wat(e, data);
    return data && !at->buf ? -EINVAL : 0;
}

/* The executor's own copy of the weights the forward pass reads (the window's blocks, its MTP
 * block, the embedding, the head, the RoPE divisors), each weight's operand bound once here:
 * the model may be run by several executors, each on its own device's buffers, and no op
 * looks a weight up. An expert's operand is its tensor's, offset by the expert's stride
 * (model_expert). */
static int bind_weights(struct model_exec *e)
{
    const struct model *m = e->m;
    int rc = 0;
    e->blk = xcalloc(n_blocks(m), sizeof *e->blk, &rc);
    for (uint32_t l = 0; rc == 0 && l < n_blocks(m); l++) {
        struct model_layer *L = &e->blk[l];
        *L = *block_at(m, l);
        struct model_mat *mats[] = LAYER_MATS(L);
        struct model_vec *vecs[] = LAYER_VECS(L);
        for (size_t i = 0; rc == 0 && i < sizeof mats / sizeof mats[0]; i++)
            rc = bind_at(e, mats[i]->data, &mats[i]->at);
        for (size_t i = 0; rc == 0 && i < sizeof vecs / sizeof vecs[0]; i++)
            rc = bind_at(e, vecs[i]->data, &vecs[i]->at);
    }
    e->tok_embd = m->tok_embd;
    e->output = m->output;
    e->output_norm = m->output_norm;
    e->rope_freqs = m->rope_freqs;   /* an optional operand: absent only if the model has none */
    if (rc == 0)
        rc = bind_at(e, e->tok_embd.data, &e->tok_embd.at);
    if (rc == 0)
        rc = bind_at(e, e->output.data, &e->output.at);
    if (rc == 0)
        rc = bind_at(e, e->output_norm.data, &e->output_norm.at);
    if (rc == 0)
        rc = bind_at(e, e->rope_freqs.data, &e->rope_freqs.at);
    return rc;
}

void model_exec_opts_default(struct model_exec_opts *o)
{
    *o = (struct model_exec_opts){.device = "cpu", .n_threads = 0, .n_ctx = 512, .max_batch = 32};
}

int model_exec_new(struct model_exec **out, struct model *m, int n_threads, uint32_t n_ctx,
                   uint32_t max_batch)
{
    struct model_exec_opts o = {"cpu", n_threads, n_ctx, max_batch, NULL};
    return model_exec_new_opts(out, m, &o, NULL, 0);
}

int model_exec_new_opts(struct model_exec **out, struct model *m,
                        const struct model_exec_opts *o, char *err, size_t errlen)
{
    *out = NULL;
    const struct model_hparams *hp = &m->hp;
    uint32_t n_ctx = o->n_ctx, max_batch = o->max_batch;
    if (n_ctx == 0 || n_ctx > MODEL_MAX_CTX || max_batch == 0) {
        util_seterr(err, errlen, "n_ctx %" PRIu32 " (1..%u), max_batch %" PRIu32 " (>= 1)", n_ctx,
                    MODEL_MAX_CTX, max_batch);
        return -EINVAL;
    }
    if (max_batch > n_ctx)
        max_batch = n_ctx;
    struct model_exec *e = calloc(1, sizeof *e);
    if (!e)
        return -ENOMEM;
    int rc = 0;
    e->m = m;
    e->n_ctx = n_ctx;
    e->max_batch = max_batch;
    struct kern_dev_opts dopts = {.n_threads = o->n_threads, .cl = o->cl};
    if ((rc = kern_dev_new_opts(&e->dev, o->device ? o->device : "cpu", &dopts, err, errlen)) < 0)
        goto fail;
    if ((rc = weights_open(e)) < 0 || (rc = bind_weights(e)) < 0 || (rc = weights_use(e)) < 0)
        goto fail;
    size_t B = max_batch, E = hp->n_embd;
    size_t q_dim = (size_t)hp->n_head * hp->head_dim, kv_dim = (size_t)hp->n_head_kv * hp->head_dim;
    uint32_t nl = m->last - m->first;
    e->slot = xcalloc(nl, sizeof *e->slot, &rc);
    if (rc < 0)
        goto fail;
    bool gated = m->has_mtp && m->mtp.attn_gated;
    for (uint32_t l = 0; l < nl; l++) {
        e->slot[l] = m->layers[l].recurrent ? e->n_rec++ : e->n_attn++;
        gated |= m->layers[l].attn_gated;
    }
    e->n_kv = e->n_attn + (m->has_mtp ? 1u : 0u);
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
    e->io_x = xbuf(e, KERN_BUF_IO, B * E, &rc);
    if (m->has_head)
        e->io_logits = xbuf(e, KERN_BUF_IO, B * hp->n_vocab, &rc);
    struct model_state *s = &e->s;
    s->xb = xbuf(e, KERN_BUF_ACT, B * E, &rc);
    s->q = xbuf(e, KERN_BUF_ACT, B * q_dim, &rc);
    s->k = xbuf(e, KERN_BUF_ACT, B * kv_dim, &rc);
    s->v = xbuf(e, KERN_BUF_ACT, B * kv_dim, &rc);
    s->att = xbuf(e, KERN_BUF_ACT, B * q_dim, &rc);
    s->hb = xbuf(e, KERN_BUF_ACT, B * F, &rc);
    s->hb2 = xbuf(e, KERN_BUF_ACT, B * F, &rc);
    s->proj = xbuf(e, KERN_BUF_ACT, B * E, &rc);
    if (m->has_embed || m->has_mtp)
        s->tok = xbuf(e, KERN_BUF_ACT, B, &rc);
    if (m->has_mtp) {
        s->mcat = xbuf(e, KERN_BUF_ACT, B * 2 * E, &rc);
        s->mx = xbuf(e, KERN_BUF_ACT, B * E, &rc);
        e->h_rows = xcalloc(B * E, sizeof(float), &rc);
        e->h_logits = xcalloc(hp->n_vocab, sizeof(float), &rc);
    }
    if (e->n_kv) {
        s->rope_cs = xbuf(e, KERN_BUF_ACT, B * (hp->n_rot / 2), &rc);
        s->rope_sn = xbuf(e, KERN_BUF_ACT, B * (hp->n_rot / 2), &rc);
    }
    if (gated) {
        s->qg = xbuf(e, KERN_BUF_ACT, B * 2 * q_dim, &rc);
        s->gate = xbuf(e, KERN_BUF_ACT, B * q_dim, &rc);
    }
    if (e->n_rec) {
        s->mixed = xbuf(e, KERN_BUF_ACT, (K1 + B) * e->conv_dim, &rc);
        s->conv_out = xbuf(e, KERN_BUF_ACT, B * e->conv_dim, &rc);
        s->z = xbuf(e, KERN_BUF_ACT, B * hp->ssm_d_inner, &rc);
        s->beta = xbuf(e, KERN_BUF_ACT, B * hp->ssm_dt_rank, &rc);
        s->alpha = xbuf(e, KERN_BUF_ACT, B * hp->ssm_dt_rank, &rc);
        s->lin_o = xbuf(e, KERN_BUF_ACT, B * hp->ssm_d_inner, &rc);
    }
    if (hp->n_expert) {
        size_t X = hp->n_expert, k = hp->n_expert_used;
        s->router = xbuf(e, KERN_BUF_ACT, B * X, &rc);
        s->sel = xbuf(e, KERN_BUF_ACT, B * k, &rc);
        s->selw = xbuf(e, KERN_BUF_ACT, B * k, &rc);
        s->ex_tok = xbuf(e, KERN_BUF_ACT, B * k, &rc);
        s->ex_w = xbuf(e, KERN_BUF_ACT, B * k, &rc);
        s->xe = xbuf(e, KERN_BUF_ACT, B * E, &rc);
        s->ye = xbuf(e, KERN_BUF_ACT, B * E, &rc);
        s->shg = xbuf(e, KERN_BUF_ACT, B, &rc);
        s->h_sel = xcalloc(B * k, sizeof(uint32_t), &rc);
        s->h_selw = xcalloc(B * k, sizeof(float), &rc);
        s->h_ex_off = xcalloc(X + 1, sizeof(uint32_t), &rc);
        s->h_ex_tok = xcalloc(B * k, sizeof(uint32_t), &rc);
        s->h_ex_w = xcalloc(B * k, sizeof(float), &rc);
    }
    if (rc < 0 || (rc = reserve_scratch(e)) < 0)
        goto fail;
    *out = e;
    return 0;
fail:
    if (rc == -ENOMEM)
        util_seterr(err, errlen, "executor (n_ctx %" PRIu32 ", max_batch %" PRIu32 "): %s", n_ctx,
                    max_batch, strerror(ENOMEM));
    model_exec_free(e);
    return rc;
}

int model_exec_threads(const struct model_exec *e) { return kern_dev_threads(e->dev); }

const char *model_exec_device(const struct model_exec *e) { return kern_dev_name(e->dev); }
const struct kern_dev *model_exec_kern_dev(const struct model_exec *e) { return e->dev; }

static void session_free(struct model_session *s)
{
    if (!s)
        return;
    kern_buf_free(s->k);
    kern_buf_free(s->v);
    kern_buf_free(s->conv);
    kern_buf_free(s->ssm);
    free(s->ckpt);
    free(s);
}

void model_exec_free(struct model_exec *e)
{
    if (!e)
        return;
    if (e->dev)
        kern_dev_sync(e->dev);
    for (uint32_t i = 0; i < e->n_sess; i++)
        session_free(e->sess[i]);
    free(e->sess);
    struct model_state *s = &e->s;
    struct kern_buf *bufs[] = {
        s->xb, s->q, s->k, s->v, s->att, s->hb, s->hb2, s->proj, s->rope_cs, s->rope_sn,
        s->tok, s->mcat, s->mx, s->qg, s->gate, s->mixed, s->conv_out, s->z, s->beta, s->alpha, s->lin_o,
        s->router, s->sel, s->selw, s->ex_tok, s->ex_w, s->xe, s->ye, s->shg, e->io_x,
        e->io_logits,
    };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        kern_buf_free(bufs[i]);
    free(s->h_sel);
    free(s->h_selw);
    free(s->h_ex_off);
    free(s->h_ex_tok);
    free(s->h_ex_w);
    free(e->h_rows);
    free(e->h_logits);
    for (uint32_t i = 0; i < e->n_w; i++)
        kern_buf_free(e->w[i].b);
    free(e->w);
    free(e->blk);
    free(e->slot);
    free(e->seg);
    kern_dev_free(e->dev);
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
     * hyperparameter caps, checked here anyway. On a host device the pages are touched only
     * as positions fill. Recurrent layers: conv state and S, fixed size. */
    size_t na = e->n_kv, nr = e->n_rec;
    if ((e->kv_layer && na > SIZE_MAX / sizeof(uint16_t) / e->kv_layer) ||
        (e->ssm_layer && nr > SIZE_MAX / sizeof(float) / (e->ssm_layer + e->conv_layer)))
        return -ENOMEM;
    struct model_session *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    s->id = id;
    int rc = 0;
    s->k = dbuf(e, KERN_BUF_STATE, na * e->kv_layer, sizeof(uint16_t), &rc);
    s->v = dbuf(e, KERN_BUF_STATE, na * e->kv_layer, sizeof(uint16_t), &rc);
    s->conv = dbuf(e, KERN_BUF_STATE, nr * e->conv_layer, sizeof(float), &rc);
    s->ssm = dbuf(e, KERN_BUF_STATE, nr * e->ssm_layer, sizeof(float), &rc);
    if (rc < 0) {
        session_free(s);
        return rc;
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
    kern_dev_sync(e->dev);                 /* no op may still use its buffers */
    session_free(s);
    e->sess[i] = e->sess[--e->n_sess];
    return 0;
}

/* Bytes of a session's conv state and DeltaNet state, all recurrent layers. */
static void rec_bytes(const struct model_exec *e, size_t *nc, size_t *ns)
{
    *nc = (size_t)e->n_rec * e->conv_layer * sizeof(float);
    *ns = (size_t)e->n_rec * e->ssm_layer * sizeof(float);
}

int model_session_checkpoint(struct model_exec *e, uint64_t id)
{
    struct model_session *s = session_find(e, id, NULL);
    if (!s)
        return -ENOENT;
    size_t nc, ns;
    rec_bytes(e, &nc, &ns);
    if (nc + ns && !s->ckpt && !(s->ckpt = malloc(nc + ns)))
        return -ENOMEM;
    int rc = nc ? kern_buf_read(s->conv, 0, s->ckpt, nc) : 0;
    if (!rc && ns)
        rc = kern_buf_read(s->ssm, 0, s->ckpt + nc, ns);
    if (rc)
        return rc;
    s->ckpt_pos = s->n_past;
    s->has_ckpt = true;
    return 0;
}

int model_session_restore(struct model_exec *e, uint64_t id)
{
    struct model_session *s = session_find(e, id, NULL);
    if (!s)
        return -ENOENT;
    if (!s->has_ckpt)
        return -EINVAL;
    size_t nc, ns;
    rec_bytes(e, &nc, &ns);
    int rc = nc ? kern_buf_write(s->conv, 0, s->ckpt, nc) : 0;
    if (!rc && ns)
        rc = kern_buf_write(s->ssm, 0, s->ckpt + nc, ns);
    if (rc)
        return rc;
    s->n_past = s->ckpt_pos;   /* attention K/V past it is overwritten as positions run again */
    return 0;
}

bool model_exec_can_rewind(const struct model_exec *e)
{
    return e->n_rec == 0;
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
    const uint32_t E = m->hp.n_embd;
    for (uint32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= m->hp.n_vocab)
            return -EINVAL;
    for (uint32_t done = 0; done < n;) {
        uint32_t nb = n - done < e->max_batch ? n - done : e->max_batch;
        TRY(kern_buf_write(e->s.tok, 0, tokens + done, (size_t)nb * sizeof(int32_t)));
        TRY(kern_buf_bind(e->io_x, out + (size_t)done * E, (size_t)nb * E * sizeof(float), false));
        int rc = kern_dev_get_rows(e->dev, e->tok_embd.type, e->tok_embd.at,
                                   m->hp.n_vocab, E, AT(e->s.tok, 0), nb,
                                   AT(e->io_x, 0));      /* [nb][E] */
        int rc2 = kern_buf_unbind(e->io_x, rc == 0);
        TRY(rc < 0 ? rc : rc2);
        done += nb;
    }
    return 0;
}

/* ---- the layers ---- */

/* Attention mixer on xb[n] into proj[n]: the projections over all rows, then per session
 * (seg[0..nseg)) the K/V store into its cache (layer `slot`) and attention over it.
 * Gated (qwen35*): wq gives per head [q | gate], the output is scaled by sigmoid(gate). */
static int attention(struct model_exec *e, const struct model_layer *L, size_t slot,
                     uint32_t nseg, uint32_t n)
{
    const struct model_hparams *hp = &e->m->hp;
    struct model_state *s = &e->s;
    struct kern_dev *d = e->dev;
    const uint32_t hd = hp->head_dim, q_dim = hp->n_head * hd, kv_dim = hp->n_head_kv * hd;
    const float scale = 1.0f / sqrtf((float)hd);

    if (L->attn_gated) {
        TRY(matmul(e, &L->wq, AT(s->xb, 0), n, AT(s->qg, 0)));  /* [n][n_head][q | gate] */
        /* q and gate each [n][q_dim] (the ops below take contiguous heads) */
        TRY(kern_dev_copy_rows(d, AT(s->q, 0), hd * sizeof(float), AT(s->qg, 0),
                               2 * hd * sizeof(float), 0, (struct kern_at){NULL, 0},
                               (int64_t)n * hp->n_head, hd * sizeof(float)));
        TRY(kern_dev_copy_rows(d, AT(s->gate, 0), hd * sizeof(float), AT(s->qg, hd),
                               2 * hd * sizeof(float), 0, (struct kern_at){NULL, 0},
                               (int64_t)n * hp->n_head, hd * sizeof(float)));
    } else {
        TRY(matmul(e, &L->wq, AT(s->xb, 0), n, AT(s->q, 0)));   /* [n][q_dim] */
    }
    TRY(matmul(e, &L->wk, AT(s->xb, 0), n, AT(s->k, 0)));       /* [n][kv_dim] */
    TRY(matmul(e, &L->wv, AT(s->xb, 0), n, AT(s->v, 0)));       /* [n][kv_dim] */
    if (L->bq.data) {
        TRY(kern_dev_add_rows(d, AT(s->q, 0), L->bq.at, n, q_dim)); /* [n][q_dim] += [q_dim] */
        TRY(kern_dev_add_rows(d, AT(s->k, 0), L->bk.at, n, kv_dim)); /* [n][kv_dim] += .. */
        TRY(kern_dev_add_rows(d, AT(s->v, 0), L->bv.at, n, kv_dim));
    }
    if (L->q_norm.data) {                    /* per-head RMSNorm (qwen3 and later), in place */
        TRY(kern_dev_rmsnorm_rows(d, AT(s->q, 0), AT(s->q, 0), L->q_norm.at,
                                  (int64_t)n * hp->n_head, hd, hp->rms_eps));
        TRY(kern_dev_rmsnorm_rows(d, AT(s->k, 0), AT(s->k, 0), L->k_norm.at,
                                  (int64_t)n * hp->n_head_kv, hd,
                                  hp->rms_eps));                 /* [n * n_head(_kv)][hd] */
    }
    /* the first n_rot dims of each head, by the batch's angles [n][n_rot/2] */
    TRY(kern_dev_rope_rows(d, AT(s->q, 0), n, q_dim, hp->n_head, hd, hp->n_rot,
                           AT(s->rope_cs, 0), AT(s->rope_sn, 0),
                           hp->rope_neox));                      /* [n][n_head][hd] */
    TRY(kern_dev_rope_rows(d, AT(s->k, 0), n, kv_dim, hp->n_head_kv, hd, hp->n_rot,
                           AT(s->rope_cs, 0), AT(s->rope_sn, 0),
                           hp->rope_neox));                      /* [n][n_head_kv][hd] */
    for (uint32_t j = 0; j < nseg; j++) {
        const struct model_seg *g = &e->seg[j];
        size_t c0 = slot * e->kv_layer * sizeof(uint16_t);   /* this layer's cache, bytes */
        struct kern_at kc = kern_at_make(g->ss->k, c0), vc = kern_at_make(g->ss->v, c0);
        size_t at = (size_t)g->pos * kv_dim * sizeof(uint16_t);
        /* K/V of these positions into the cache as F16 (llama.cpp's default cache type) */
        TRY(kern_dev_kv_store(d, KERN_T_F16, kern_at_make(g->ss->k, c0 + at), kv_dim,
                              AT(s->k, (size_t)g->off * kv_dim), g->n, kv_dim));
        TRY(kern_dev_kv_store(d, KERN_T_F16, kern_at_make(g->ss->v, c0 + at), kv_dim,
                              AT(s->v, (size_t)g->off * kv_dim), g->n, kv_dim));
        TRY(kern_dev_attention(d, KERN_T_F16, AT(s->att, (size_t)g->off * q_dim),
                               AT(s->q, (size_t)g->off * q_dim), kc, vc, g->n, g->pos,
                               hp->n_head, hp->n_head_kv, hd, kv_dim,
                               scale));                          /* [g.n][q_dim] */
    }
    if (L->attn_gated)
        TRY(kern_dev_mul_sigmoid(d, AT(s->att, 0), AT(s->gate, 0),
                                 (int64_t)n * q_dim));           /* [n][q_dim] */
    return matmul(e, &L->wo, AT(s->att, 0), n, AT(s->proj, 0)); /* [n][E] */
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
    struct kern_dev *dv = e->dev;
    const uint32_t d = hp->ssm_d_state, Hk = hp->ssm_n_group, Hv = hp->ssm_dt_rank;
    const uint32_t CD = e->conv_dim, K = hp->ssm_conv_kernel;
    const size_t K1 = K - 1;

    /* mixed = [K1 free rows | the batch's rows of xb Wqkv]; z, beta, alpha projections */
    TRY(matmul(e, &L->wqkv, AT(s->xb, 0), n, AT(s->mixed, K1 * CD))); /* [n][CD] */
    TRY(matmul(e, &L->wz, AT(s->xb, 0), n, AT(s->z, 0)));       /* [n][Hv][d] */
    TRY(matmul(e, &L->w_beta, AT(s->xb, 0), n, AT(s->beta, 0))); /* [n][Hv] */
    TRY(matmul(e, &L->w_alpha, AT(s->xb, 0), n, AT(s->alpha, 0))); /* [n][Hv] */
    /* Per session, in batch order: its conv state goes into the K1 rows before its own rows
     * (the previous session's rows, already convolved), then the conv of its rows, and the
     * last K1 rows of [state | rows] are its new state. */
    for (uint32_t j = 0; j < nseg; j++) {
        const struct model_seg *g = &e->seg[j];
        struct kern_at state = AT(g->ss->conv, slot * e->conv_layer);
        TRY(copy(e, AT(s->mixed, (size_t)g->off * CD), state, K1 * CD * sizeof(float)));
        TRY(kern_dev_conv_silu(dv, AT(s->conv_out, (size_t)g->off * CD),
                               AT(s->mixed, (size_t)g->off * CD), L->conv1d.at, g->n, CD,
                               (int)K));                         /* [g.n][CD] */
        TRY(copy(e, state, AT(s->mixed, (size_t)(g->off + g->n) * CD), K1 * CD * sizeof(float)));
    }

    /* conv_out rows: [q: Hk][d] | [k: Hk][d] | [v: Hv][d] */
    TRY(kern_dev_l2norm(dv, AT(s->conv_out, 0), n, CD, (int)(2 * Hk), (int)d,
                        hp->rms_eps));                           /* q, k heads */
    for (uint32_t j = 0; j < nseg; j++) {
        const struct model_seg *g = &e->seg[j];
        size_t q = (size_t)g->off * CD, k = q + (size_t)Hk * d, v = k + (size_t)Hk * d;
        TRY(kern_dev_deltanet(dv, AT(s->lin_o, (size_t)g->off * Hv * d),
                              AT(g->ss->ssm, slot * e->ssm_layer), AT(s->conv_out, q),
                              AT(s->conv_out, k), AT(s->conv_out, v), CD,
                              AT(s->beta, (size_t)g->off * Hv), AT(s->alpha, (size_t)g->off * Hv),
                              L->dt_bias.at, L->ssm_a.at, g->n, (int)Hk, (int)Hv,
                              (int)d));                          /* [g.n][Hv][d] */
    }
    TRY(kern_dev_rmsnorm_silu(dv, AT(s->lin_o, 0), AT(s->lin_o, 0), L->ssm_norm.at,
                              AT(s->z, 0), (int64_t)n * Hv, d, hp->rms_eps)); /* [n * Hv][d] */
    return matmul(e, &L->ssm_out, AT(s->lin_o, 0), n, AT(s->proj, 0)); /* [n][E] */
}

/* SwiGLU FFN on x[n] into y[n]: y = W_down (silu(x W_gate) * (x W_up)). */
static int swiglu_ffn(struct model_exec *e, const struct model_mat *gate,
                      const struct model_mat *up, const struct model_mat *down, struct kern_at x,
                      uint32_t n, struct kern_at y)
{
    struct model_state *s = &e->s;
    TRY(matmul(e, gate, x, n, AT(s->hb, 0)));                   /* [n][F] */
    TRY(matmul(e, up, x, n, AT(s->hb2, 0)));                    /* [n][F] */
    TRY(kern_dev_swiglu(e->dev, AT(s->hb, 0), AT(s->hb, 0), AT(s->hb2, 0),
                        (int64_t)n * gate->rows));               /* [n][F] */
    return matmul(e, down, AT(s->hb, 0), n, y);                  /* [n][E] */
}

/* The n x k routing choices grouped by expert (a counting sort), on the host: expert x's rows
 * are ex_tok/ex_w[ex_off[x] .. ex_off[x+1]), so each selected expert's slice is read once per
 * batch. Index bookkeeping, no arithmetic. */
static void group_by_expert(struct model_state *s, uint32_t n, uint32_t X, uint32_t k)
{
    memset(s->h_ex_off, 0, (X + 1) * sizeof(uint32_t));
    for (size_t i = 0; i < (size_t)n * k; i++)
        s->h_ex_off[s->h_sel[i] + 1]++;
    for (uint32_t x = 0; x < X; x++)                     /* group starts */
        s->h_ex_off[x + 1] += s->h_ex_off[x];
    for (size_t i = 0; i < (size_t)n * k; i++) {
        uint32_t at = s->h_ex_off[s->h_sel[i]]++;
        s->h_ex_tok[at] = (uint32_t)(i / k);
        s->h_ex_w[at] = s->h_selw[i];
    }
    for (uint32_t x = X; x > 0; x--)                     /* back to starts */
        s->h_ex_off[x] = s->h_ex_off[x - 1];
    s->h_ex_off[0] = 0;
}

/* Routed experts on xb[n] into proj[n]: p = softmax(router), the top n_expert_used by p with
 * weights p / sum(p_sel); rows grouped by expert (and no other expert is touched); then the
 * shared expert, gated by a sigmoid. The choices come back to the host (n * k indices and
 * weights) to pick which expert slices run. */
static int moe(struct model_exec *e, const struct model_layer *L, uint32_t n)
{
    const struct model_hparams *hp = &e->m->hp;
    struct model_state *s = &e->s;
    struct kern_dev *d = e->dev;
    const uint32_t X = hp->n_expert, k = hp->n_expert_used, E = hp->n_embd;
    const size_t nk = (size_t)n * k;

    TRY(matmul(e, &L->gate_inp, AT(s->xb, 0), n, AT(s->router, 0))); /* [n][X] */
    TRY(kern_dev_moe_route(d, AT(s->sel, 0), AT(s->selw, 0), AT(s->router, 0), n, (int)X,
                           (int)k));                             /* [n][k] */
    TRY(kern_buf_read(s->sel, 0, s->h_sel, nk * sizeof(uint32_t)));
    TRY(kern_buf_read(s->selw, 0, s->h_selw, nk * sizeof(float)));
    for (size_t i = 0; i < nk; i++)
        if (s->h_sel[i] >= X)
            return -EINVAL;
    group_by_expert(s, n, X, k);
    TRY(kern_buf_write(s->ex_tok, 0, s->h_ex_tok, nk * sizeof(uint32_t)));
    TRY(kern_buf_write(s->ex_w, 0, s->h_ex_w, nk * sizeof(float)));

    TRY(kern_dev_zero(d, AT(s->proj, 0), (size_t)n * E * sizeof(float)));
    for (uint32_t x = 0; x < X; x++) {
        uint32_t a = s->h_ex_off[x], ne = s->h_ex_off[x + 1] - a;
        if (!ne)
            continue;
        TRY(kern_dev_copy_rows(d, AT(s->xe, 0), E * sizeof(float), AT(s->xb, 0),
                               E * sizeof(float), n, AT(s->ex_tok, a), ne,
                               E * sizeof(float)));             /* gather [ne][E] */
        struct model_mat g = model_expert(&L->gate_exps, x), u = model_expert(&L->up_exps, x),
                         dn = model_expert(&L->down_exps, x);
        TRY(swiglu_ffn(e, &g, &u, &dn, AT(s->xe, 0), ne, AT(s->ye, 0))); /* [ne][E] */
        TRY(kern_dev_axpy_rows(d, AT(s->proj, 0), n, AT(s->ex_w, a), AT(s->ye, 0),
                               AT(s->ex_tok, a), ne, E));        /* proj[tok] += w ye */
    }
    if (L->gate_shexp.data) {
        TRY(matmul(e, &L->gate_inp_shexp, AT(s->xb, 0), n, AT(s->shg, 0))); /* [n][1] */
        TRY(kern_dev_sigmoid(d, AT(s->shg, 0), n));
        TRY(swiglu_ffn(e, &L->gate_shexp, &L->up_shexp, &L->down_shexp, AT(s->xb, 0), n,
                       AT(s->ye, 0)));
        TRY(kern_dev_axpy_rows(d, AT(s->proj, 0), n, AT(s->shg, 0), AT(s->ye, 0),
                               (struct kern_at){NULL, 0}, n, E)); /* [n][E] += shg ye */
    }
    return 0;
}

/* RoPE angles of the positions of the rows of sessions seg[0..nseg). */
static int rope_angles(struct model_exec *e, uint32_t nseg)
{
    const struct model_hparams *hp = &e->m->hp;
    struct model_state *s = &e->s;
    const size_t half = hp->n_rot / 2;
    for (uint32_t j = 0; j < nseg; j++) {
        const struct model_seg *g = &e->seg[j];
        TRY(kern_dev_rope_angles(e->dev, AT(s->rope_cs, g->off * half),
                                 AT(s->rope_sn, g->off * half), g->n, g->pos, (int)hp->n_rot,
                                 hp->rope_base, hp->rope_scale,
                                 e->rope_freqs.at));                /* [g.n][n_rot/2] each */
    }
    return 0;
}

/* One block L (its K/V or state slot `slot`) on x[n][n_embd], the rows of seg[0..nseg). */
static int block_run(struct model_exec *e, const struct model_layer *L, size_t slot,
                     uint32_t nseg, uint32_t n, struct kern_at x)
{
    const struct model_hparams *hp = &e->m->hp;
    struct model_state *s = &e->s;
    struct kern_dev *d = e->dev;
    const uint32_t E = hp->n_embd;

    /* mixer: x += mixer(rmsnorm(x) * attn_norm) */
    TRY(kern_dev_rmsnorm_rows(d, AT(s->xb, 0), x, L->attn_norm.at, n, E,
                              hp->rms_eps));                     /* [n][E] */
    if (L->recurrent)
        TRY(deltanet(e, L, slot, nseg, n));
    else
        TRY(attention(e, L, slot, nseg, n));
    TRY(kern_dev_add(d, x, AT(s->proj, 0), (int64_t)n * E));     /* [n][E] */

    /* feed-forward: x += ffn(rmsnorm(x) * ffn_norm), dense SwiGLU or routed experts */
    TRY(kern_dev_rmsnorm_rows(d, AT(s->xb, 0), x, L->ffn_norm.at, n, E,
                              hp->rms_eps));                     /* [n][E] */
    if (L->gate_inp.data)
        TRY(moe(e, L, n));
    else
        TRY(swiglu_ffn(e, &L->w_gate, &L->w_up, &L->w_down, AT(s->xb, 0), n, AT(s->proj, 0)));
    return kern_dev_add(d, x, AT(s->proj, 0), (int64_t)n * E);  /* [n][E] */
}

/* Layers of the window on x[n][n_embd] (n <= max_batch, the bound boundary buffer), the rows
 * of sessions seg[0..nseg) (consecutive, covering all n rows). */
static int forward(struct model_exec *e, uint32_t nseg, uint32_t n, struct kern_at x)
{
    const struct model *m = e->m;
    if (e->n_attn)
        TRY(rope_angles(e, nseg));
    for (uint32_t l = 0; l < m->last - m->first; l++)
        TRY(block_run(e, &e->blk[l], e->slot[l], nseg, n, x));
    return 0;
}

/* forward() on the caller's rows x[n][n_embd], bound to the boundary buffer for the pass
 * (in place on a host device; copied in and out on another). */
static int forward_io(struct model_exec *e, uint32_t nseg, uint32_t n, float *x)
{
    TRY(kern_buf_bind(e->io_x, x, (size_t)n * e->m->hp.n_embd * sizeof(float), true));
    int rc = forward(e, nseg, n, AT(e->io_x, 0));
    int rc2 = kern_buf_unbind(e->io_x, rc == 0);
    return rc < 0 ? rc : rc2;
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
static int rewind_state(struct model_exec *e, struct model_session *ss, uint32_t pos)
{
    if (e->n_rec && pos != ss->n_past) {
        TRY(kern_dev_zero(e->dev, AT(ss->conv, 0), e->n_rec * e->conv_layer * sizeof(float)));
        TRY(kern_dev_zero(e->dev, AT(ss->ssm, 0), e->n_rec * e->ssm_layer * sizeof(float)));
    }
    return 0;
}

int model_window_run(struct model_exec *e, uint64_t id, uint32_t pos, uint32_t n, float *x)
{
    struct model_session *ss = session_find(e, id, NULL);
    if (!ss)
        return -ENOENT;
    int rc = check_pos(e, ss, pos, n);
    if (rc < 0 || (rc = rewind_state(e, ss, pos)) < 0)
        return rc;
    for (uint32_t done = 0; done < n;) {
        uint32_t nb = n - done < e->max_batch ? n - done : e->max_batch;
        e->seg[0] = (struct model_seg){ss, 0, nb, pos + done};
        rc = forward_io(e, 1, nb, x + (size_t)done * e->m->hp.n_embd);
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
    int rc = 0;
    for (uint32_t j = 0; j < nseg && rc == 0; j++)
        rc = rewind_state(e, e->seg[j].ss, e->seg[j].pos);
    if (rc == 0)
        rc = forward_io(e, nseg, n, x);
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
    const uint32_t E = m->hp.n_embd, V = m->hp.n_vocab;
    for (uint32_t done = 0; done < n;) {
        uint32_t nb = n - done < e->max_batch ? n - done : e->max_batch;
        /* the rows are only read: binding them without const is the boundary's one shape */
        TRY(kern_buf_bind(e->io_x, (float *)(uintptr_t)(x + (size_t)done * E),
                          (size_t)nb * E * sizeof(float), true));
        int rc = kern_buf_bind(e->io_logits, logits + (size_t)done * V,
                               (size_t)nb * V * sizeof(float), false);
        if (rc == 0)
            rc = kern_dev_rmsnorm_rows(e->dev, AT(e->s.xb, 0), AT(e->io_x, 0),
                                       e->output_norm.at, nb, E, m->hp.rms_eps); /* [nb][E] */
        if (rc == 0)
            rc = matmul(e, &e->output, AT(e->s.xb, 0), nb, AT(e->io_logits, 0)); /* [nb][V] */
        int rc2 = kern_buf_unbind(e->io_x, false);
        int rc3 = kern_buf_unbind(e->io_logits, rc == 0);
        TRY(rc < 0 ? rc : rc2 < 0 ? rc2 : rc3);
        done += nb;
    }
    return 0;
}

/* ---- multi-token prediction (last rank) ---- */

bool model_has_mtp(const struct model *m) { return m->has_mtp; }

/* The MTP block on n rows (n <= max_batch) of session ss at its entries pos..pos+n-1: row i
 * embeds tokens[i] and takes the hidden row h[i] (host; the main pass's output before the
 * final norm when prenorm, else already normalised: the block's own h_out); the last row's
 * normalised output into h_out[n_embd] and its logits into logits[n_vocab] (either may be
 * NULL). llama.cpp's MTP graph: x = eh_proj [enorm(embedding) | hnorm(h)], one gated
 * full-attention block with its own K/V (slot n_attn), shared_head_norm, the model's head. */
static int mtp_rows(struct model_exec *e, struct model_session *ss, uint32_t pos, uint32_t n,
                    const int32_t *tokens, const float *h, bool prenorm, float *h_out,
                    float *logits)
{
    const struct model *m = e->m;
    const struct model_hparams *hp = &m->hp;
    const struct model_layer *L = &e->blk[m->last - m->first];   /* the MTP block */
    struct model_state *s = &e->s;
    struct kern_dev *d = e->dev;
    const uint32_t E = hp->n_embd;
    const struct kern_at none = {NULL, 0};
    for (uint32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= hp->n_vocab)
            return -EINVAL;
    /* [enorm(embedding) | hnorm(h)] */
    TRY(kern_buf_write(s->tok, 0, tokens, (size_t)n * sizeof(int32_t)));
    TRY(kern_dev_get_rows(d, e->tok_embd.type, e->tok_embd.at, hp->n_vocab, E,
                          AT(s->tok, 0), n, AT(s->mx, 0)));      /* [n][E] */
    TRY(kern_dev_rmsnorm_rows(d, AT(s->xb, 0), AT(s->mx, 0), L->enorm.at, n, E,
                              hp->rms_eps));
    TRY(kern_dev_copy_rows(d, AT(s->mcat, 0), 2 * E * sizeof(float), AT(s->xb, 0),
                           E * sizeof(float), 0, none, n, E * sizeof(float)));
    TRY(kern_buf_bind(e->io_x, (float *)(uintptr_t)h, (size_t)n * E * sizeof(float), true));
    int rc = 0;
    if (prenorm)
        rc = kern_dev_rmsnorm_rows(d, AT(s->xb, 0), AT(e->io_x, 0), e->output_norm.at, n, E,
                                   hp->rms_eps);
    if (rc == 0)
        rc = kern_dev_rmsnorm_rows(d, AT(s->xb, 0), prenorm ? AT(s->xb, 0) : AT(e->io_x, 0),
                                   L->hnorm.at, n, E, hp->rms_eps);
    int rc2 = kern_buf_unbind(e->io_x, false);
    TRY(rc < 0 ? rc : rc2);
    TRY(kern_dev_copy_rows(d, AT(s->mcat, E), 2 * E * sizeof(float), AT(s->xb, 0),
                           E * sizeof(float), 0, none, n, E * sizeof(float)));
    TRY(matmul(e, &L->eh_proj, AT(s->mcat, 0), n, AT(s->mx, 0))); /* [n][E] */
    /* the block, at the entries' positions */
    e->seg[0] = (struct model_seg){ss, 0, n, pos};
    TRY(rope_angles(e, 1));
    TRY(block_run(e, L, e->n_attn, 1, n, AT(s->mx, 0)));
    /* the last row: shared_head_norm, then the head */
    TRY(kern_dev_rmsnorm_rows(d, AT(s->xb, 0), AT(s->mx, (size_t)(n - 1) * E),
                              L->head_norm.at, 1, E, hp->rms_eps));
    if (logits) {
        TRY(kern_buf_bind(e->io_logits, logits, (size_t)hp->n_vocab * sizeof(float), false));
        rc = matmul(e, &e->output, AT(s->xb, 0), 1, AT(e->io_logits, 0)); /* [1][V] */
        rc2 = kern_buf_unbind(e->io_logits, rc == 0);
        TRY(rc < 0 ? rc : rc2);
    }
    return h_out ? kern_buf_read(s->xb, 0, h_out, E * sizeof(float)) : 0;
}

int model_mtp_draft(struct model_exec *e, uint64_t id, uint32_t pos, uint32_t n, const float *x,
                    const int32_t *hist, uint32_t n_hist, uint32_t k, int32_t *out,
                    float *logits)
{
    const struct model *m = e->m;
    const uint32_t E = m->hp.n_embd;
    if (!m->has_mtp)
        return -ENOTSUP;
    struct model_session *ss = session_find(e, id, NULL);
    if (!ss)
        return -ENOENT;
    if ((uint64_t)pos + n > e->n_ctx || n_hist > e->n_ctx || n_hist == 0)
        return -ERANGE;
    /* entry p takes token p and the hidden row of position p - 1 (zeros before position 0):
     * this pass writes the entries from pos + 1 (from 0 on a first pass) */
    uint32_t p0 = pos == 0 ? 0 : pos + 1;
    if (ss->mtp_past < p0)
        return -EINVAL;           /* an entry before them was never written */
    uint64_t p1 = (uint64_t)pos + n < n_hist - 1 ? (uint64_t)pos + n : n_hist - 1;
    bool last = p1 == n_hist - 1 && p1 >= p0 && n > 0;
    float *lg = logits ? logits : e->h_logits;
    for (uint64_t p = p0; p <= p1;) {
        uint32_t nb = p1 + 1 - p < e->max_batch ? (uint32_t)(p1 + 1 - p) : e->max_batch;
        /* the hidden rows of positions p - 1..: the pass's own rows, but for entry 0 a zero
         * row before them */
        const float *h = x + (size_t)(p - (p > 0) - pos) * E;
        if (p == 0) {
            memset(e->h_rows, 0, E * sizeof(float));
            memcpy(e->h_rows + E, x, (size_t)(nb - 1) * E * sizeof(float));
            h = e->h_rows;
        }
        bool end = p + nb > p1;
        int rc = mtp_rows(e, ss, (uint32_t)p, nb, hist + p, h, true,
                          end && last && k ? e->h_rows : NULL, end && last ? lg : NULL);
        if (rc < 0) {
            ss->mtp_past = (uint32_t)p;
            return rc;
        }
        p += nb;
    }
    if (p1 + 1 >= p0)
        ss->mtp_past = (uint32_t)(p1 + 1);
    if (!last || !k)
        return 0;
    /* drafts, greedy: the next from the entry of the previous one and the block's own output;
     * these entries are scratch, written over by the next pass */
    uint32_t nd = 0;
    out[nd++] = model_argmax(lg, m->hp.n_vocab);
    for (uint64_t p = p1 + 1; nd < k && p < e->n_ctx; p++) {
        int rc = mtp_rows(e, ss, (uint32_t)p, 1, &out[nd - 1], e->h_rows, false, e->h_rows,
                          e->h_logits);
        if (rc < 0)
            return rc;
        out[nd++] = model_argmax(e->h_logits, m->hp.n_vocab);
    }
    return (int)nd;
}

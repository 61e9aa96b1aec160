/* model.c — architectures and window weights: hyperparameters from GGUF metadata, the
 * tensors of layers [first, last) bound as views into the mapping (nothing is copied), every
 * shape and type checked against the hyperparameters before anything uses it. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "kernels/kern.h"
#include "model/internal.h"

/* What each supported architecture needs beyond the common llama block. */
struct arch_desc {
    const char *name;
    bool rope_neox;      /* rotate pairs (i, i + n_rot/2) instead of (2i, 2i+1) */
    bool qkv_bias;       /* attn_q/k/v.bias required */
    bool qk_norm;        /* attn_q_norm / attn_k_norm required (per-head RMSNorm before RoPE) */
};

static const struct arch_desc archs[] = {
    {"llama", false, false, false},
    {"qwen2", true,  true,  false},
    {"qwen3", true,  false, true},
};

static void seterr(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* <arch>.<key> as u32: 0, or -ENOENT when absent and not required (*out keeps its default). */
static int get_u32(const struct gguf_file *f, const char *arch, const char *key, uint32_t *out,
                   bool required, uint32_t lo, uint32_t hi, char *err, size_t errlen)
{
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    int rc = gguf_get_u32(f, full, out);
    if (rc == -ENOENT && !required)
        return 0;
    if (rc == -ENOENT) {
        seterr(err, errlen, "metadata %s missing", full);
        return -EINVAL;
    }
    if (rc < 0) {
        seterr(err, errlen, "metadata %s: not an integer that fits 32 bits", full);
        return -EINVAL;
    }
    if (*out < lo || *out > hi) {
        seterr(err, errlen, "metadata %s = %" PRIu32 " out of range [%" PRIu32 ", %" PRIu32 "]",
               full, *out, lo, hi);
        return -EINVAL;
    }
    return 0;
}

static int get_f32(const struct gguf_file *f, const char *arch, const char *key, float *out,
                   float lo, float hi, char *err, size_t errlen)
{
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    int rc = gguf_get_f32(f, full, out);
    if (rc == -ENOENT)
        return 0;
    if (rc < 0 || !(*out >= lo && *out <= hi)) {
        seterr(err, errlen, "metadata %s: not a number in [%g, %g]", full, lo, hi);
        return -EINVAL;
    }
    return 0;
}

static int read_hparams(struct gguf_file *f, struct model_hparams *hp,
                        const struct arch_desc **ad, char *err, size_t errlen)
{
    memset(hp, 0, sizeof *hp);
    int rc = gguf_get_str(f, "general.architecture", hp->arch, sizeof hp->arch);
    if (rc < 0) {
        seterr(err, errlen, "metadata general.architecture missing or not a short string");
        return -EINVAL;
    }
    *ad = NULL;
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (!strcmp(hp->arch, archs[i].name))
            *ad = &archs[i];
    if (!*ad) {
        seterr(err, errlen, "architecture '%s' is not supported (supported: llama, qwen2, qwen3)",
               hp->arch);
        return -ENOTSUP;
    }
    const char *a = hp->arch;
    if ((rc = get_u32(f, a, "block_count", &hp->n_layer, true, 1, MODEL_MAX_LAYERS, err, errlen)) ||
        (rc = get_u32(f, a, "embedding_length", &hp->n_embd, true, 1, MODEL_MAX_EMBD, err, errlen)) ||
        (rc = get_u32(f, a, "feed_forward_length", &hp->n_ff, true, 1, MODEL_MAX_FF, err, errlen)) ||
        (rc = get_u32(f, a, "attention.head_count", &hp->n_head, true, 1, MODEL_MAX_HEADS, err, errlen)))
        return rc;
    uint32_t n_expert = 0;
    if ((rc = get_u32(f, a, "expert_count", &n_expert, false, 0, UINT32_MAX, err, errlen)))
        return rc;
    if (n_expert > 0) {
        seterr(err, errlen, "metadata %s.expert_count = %" PRIu32 ": mixture-of-experts %s "
               "models are not supported", a, n_expert, a);
        return -ENOTSUP;
    }
    hp->n_head_kv = hp->n_head;
    if ((rc = get_u32(f, a, "attention.head_count_kv", &hp->n_head_kv, false, 1, hp->n_head, err, errlen)))
        return rc;
    if (hp->n_head % hp->n_head_kv) {
        seterr(err, errlen, "metadata %s.attention.head_count %" PRIu32 " not a multiple of "
               "head_count_kv %" PRIu32, a, hp->n_head, hp->n_head_kv);
        return -EINVAL;
    }
    hp->head_dim = hp->n_embd / hp->n_head;
    if ((rc = get_u32(f, a, "attention.key_length", &hp->head_dim, false, 1, MODEL_MAX_HEAD_DIM, err, errlen)))
        return rc;
    uint32_t vlen = hp->head_dim;
    if ((rc = get_u32(f, a, "attention.value_length", &vlen, false, 1, MODEL_MAX_HEAD_DIM, err, errlen)))
        return rc;
    if (vlen != hp->head_dim) {
        seterr(err, errlen, "metadata %s.attention.value_length %" PRIu32 " != key_length %" PRIu32
               " (not supported)", a, vlen, hp->head_dim);
        return -ENOTSUP;
    }
    if (hp->head_dim == 0 || hp->head_dim > MODEL_MAX_HEAD_DIM) {
        seterr(err, errlen, "head dimension %" PRIu32 " out of range", hp->head_dim);
        return -EINVAL;
    }
    hp->n_rot = hp->head_dim;
    if ((rc = get_u32(f, a, "rope.dimension_count", &hp->n_rot, false, 2, hp->head_dim, err, errlen)))
        return rc;
    if (hp->n_rot % 2) {
        seterr(err, errlen, "metadata %s.rope.dimension_count %" PRIu32 " is odd", a, hp->n_rot);
        return -EINVAL;
    }
    hp->n_ctx_train = 2048;
    if ((rc = get_u32(f, a, "context_length", &hp->n_ctx_train, false, 1, UINT32_MAX, err, errlen)))
        return rc;
    hp->rms_eps = 1e-5f;
    if ((rc = get_f32(f, a, "attention.layer_norm_rms_epsilon", &hp->rms_eps, 0.0f, 1.0f, err, errlen)))
        return rc;
    hp->rope_base = 10000.0f;
    if ((rc = get_f32(f, a, "rope.freq_base", &hp->rope_base, 1.0f, 1e30f, err, errlen)))
        return rc;
    /* Linear RoPE scaling: positions divided by the factor. YaRN and friends are not built. */
    float factor = 1.0f;
    char stype[32] = "";
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    if (gguf_get_str(f, key, stype, sizeof stype) == 0 && strcmp(stype, "none") &&
        strcmp(stype, "linear")) {
        seterr(err, errlen, "metadata %s = '%s': only linear RoPE scaling is supported", key, stype);
        return -ENOTSUP;
    }
    if ((rc = get_f32(f, a, "rope.scale_linear", &factor, 1e-6f, 1e6f, err, errlen)))
        return rc;
    if (strcmp(stype, "none") &&
        (rc = get_f32(f, a, "rope.scaling.factor", &factor, 0.0f, 1e6f, err, errlen)))
        return rc;
    hp->rope_scale = factor > 0.0f ? 1.0f / factor : 1.0f;
    hp->rope_neox = (*ad)->rope_neox;

    /* Vocabulary size: from whichever of the vocabulary-sized tensors or arrays is present. */
    const struct gguf_tensor *t = gguf_tensor_find(f, "token_embd.weight");
    if (!t)
        t = gguf_tensor_find(f, "output.weight");
    uint64_t nv = 0;
    const struct gguf_value *arr;
    if (t)
        nv = t->ne[1];
    else if (gguf_get_arr(f, "tokenizer.ggml.tokens", &arr) == 0)
        nv = arr->v.arr.n;
    else {
        uint32_t v = 0;
        if (get_u32(f, a, "vocab_size", &v, true, 1, MODEL_MAX_VOCAB, err, errlen))
            return -EINVAL;
        nv = v;
    }
    if (nv == 0 || nv > MODEL_MAX_VOCAB) {
        seterr(err, errlen, "vocabulary size %" PRIu64 " out of range [1, %u]", nv, MODEL_MAX_VOCAB);
        return -EINVAL;
    }
    hp->n_vocab = (uint32_t)nv;
    return 0;
}

/* ---- binding tensors ---- */

static int bind_mat(struct model *m, const char *name, uint32_t cols, uint32_t rows,
                    struct model_mat *out, char *err, size_t errlen)
{
    const struct gguf_tensor *t = gguf_tensor_find(m->gf, name);
    if (!t) {
        seterr(err, errlen, "tensor %s missing", name);
        return -ENOENT;
    }
    if (t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != 1 || t->ne[3] != 1) {
        seterr(err, errlen, "tensor %s: shape [%" PRIu64 ", %" PRIu64 ", %" PRIu64 ", %" PRIu64
               "], expected [%" PRIu32 ", %" PRIu32 "]", name, t->ne[0], t->ne[1], t->ne[2],
               t->ne[3], cols, rows);
        return -EINVAL;
    }
    if (!kern_type_supported(t->type)) {
        const struct gguf_type_info *ti = gguf_type_info(t->type);
        seterr(err, errlen, "tensor %s: weight type %s (%" PRIu32 ") is not supported", name,
               ti ? ti->name : "unknown", t->type);
        return -ENOTSUP;
    }
    size_t rb = kern_row_bytes(t->type, cols);
    if (rb == 0 || (uint64_t)rb * rows != t->size) {
        seterr(err, errlen, "tensor %s: %" PRIu64 " bytes, expected %zu x %" PRIu32, name,
               t->size, rb, rows);
        return -EINVAL;
    }
    if (!t->data) {
        seterr(err, errlen, "tensor %s: not mapped", name);
        return -EINVAL;
    }
    out->data = t->data;
    out->type = t->type;
    out->rows = rows;
    out->cols = cols;
    return 0;
}

/* A 1-D F32 vector of n elements; optional vectors may be absent (*out = NULL). */
static int bind_vec(struct model *m, const char *name, uint32_t n, bool optional,
                    const float **out, char *err, size_t errlen)
{
    *out = NULL;
    const struct gguf_tensor *t = gguf_tensor_find(m->gf, name);
    if (!t) {
        if (optional)
            return 0;
        seterr(err, errlen, "tensor %s missing", name);
        return -ENOENT;
    }
    if (t->ne[0] != n || t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1) {
        seterr(err, errlen, "tensor %s: shape [%" PRIu64 ", %" PRIu64 "], expected [%" PRIu32 "]",
               name, t->ne[0], t->ne[1], n);
        return -EINVAL;
    }
    if (t->type != GGUF_T_F32) {
        seterr(err, errlen, "tensor %s: type %" PRIu32 ", expected f32", name, t->type);
        return -ENOTSUP;
    }
    if (!t->data || ((uintptr_t)t->data % sizeof(float))) {
        seterr(err, errlen, "tensor %s: not mapped or misaligned", name);
        return -EINVAL;
    }
    *out = t->data;
    return 0;
}

static int bind_layer(struct model *m, const struct arch_desc *ad, uint32_t il,
                      struct model_layer *L, char *err, size_t errlen)
{
    const struct model_hparams *hp = &m->hp;
    uint32_t q_dim = hp->n_head * hp->head_dim, kv_dim = hp->n_head_kv * hp->head_dim;
    char n[96];
    int rc;
#define NAME(s) (snprintf(n, sizeof n, "blk.%" PRIu32 ".%s", il, s), n)
    if ((rc = bind_vec(m, NAME("attn_norm.weight"), hp->n_embd, false, &L->attn_norm, err, errlen)) ||
        (rc = bind_mat(m, NAME("attn_q.weight"), hp->n_embd, q_dim, &L->wq, err, errlen)) ||
        (rc = bind_mat(m, NAME("attn_k.weight"), hp->n_embd, kv_dim, &L->wk, err, errlen)) ||
        (rc = bind_mat(m, NAME("attn_v.weight"), hp->n_embd, kv_dim, &L->wv, err, errlen)) ||
        (rc = bind_mat(m, NAME("attn_output.weight"), q_dim, hp->n_embd, &L->wo, err, errlen)) ||
        (rc = bind_vec(m, NAME("attn_q.bias"), q_dim, !ad->qkv_bias, &L->bq, err, errlen)) ||
        (rc = bind_vec(m, NAME("attn_k.bias"), kv_dim, !ad->qkv_bias, &L->bk, err, errlen)) ||
        (rc = bind_vec(m, NAME("attn_v.bias"), kv_dim, !ad->qkv_bias, &L->bv, err, errlen)) ||
        (rc = bind_vec(m, NAME("attn_q_norm.weight"), hp->head_dim, !ad->qk_norm, &L->q_norm, err, errlen)) ||
        (rc = bind_vec(m, NAME("attn_k_norm.weight"), hp->head_dim, !ad->qk_norm, &L->k_norm, err, errlen)) ||
        (rc = bind_vec(m, NAME("ffn_norm.weight"), hp->n_embd, false, &L->ffn_norm, err, errlen)) ||
        (rc = bind_mat(m, NAME("ffn_gate.weight"), hp->n_embd, hp->n_ff, &L->w_gate, err, errlen)) ||
        (rc = bind_mat(m, NAME("ffn_up.weight"), hp->n_embd, hp->n_ff, &L->w_up, err, errlen)) ||
        (rc = bind_mat(m, NAME("ffn_down.weight"), hp->n_ff, hp->n_embd, &L->w_down, err, errlen)))
        return rc;
#undef NAME
    if (!L->q_norm != !L->k_norm) {
        seterr(err, errlen, "block %" PRIu32 ": attn_q_norm and attn_k_norm must come together", il);
        return -EINVAL;
    }
    return 0;
}

/* ---- which tensors a window maps ---- */

struct want_ctx {
    uint32_t first, last;
    bool embed, head, tied;
};

static bool want_tensor(const struct gguf_tensor *t, void *ud)
{
    const struct want_ctx *w = ud;
    int l = gguf_tensor_layer(t->name);
    if (l >= 0)
        return (uint32_t)l >= w->first && (uint32_t)l < w->last;
    if (!strcmp(t->name, "token_embd.weight"))
        return w->embed || (w->head && w->tied);
    if (!strcmp(t->name, "output_norm.weight") || !strcmp(t->name, "output.weight"))
        return w->head;
    return !strcmp(t->name, "rope_freqs.weight");    /* every layer rotates with it */
}

int model_open(struct model **out, const char *path, int first, int last, char *err,
               size_t errlen)
{
    *out = NULL;
    struct model *m = calloc(1, sizeof *m);
    if (!m)
        return -ENOMEM;
    int rc = gguf_file_open(&m->gf, path, err, errlen);
    if (rc < 0)
        goto fail;
    const struct arch_desc *ad;
    if ((rc = read_hparams(m->gf, &m->hp, &ad, err, errlen)) < 0)
        goto fail;
    const struct model_hparams *hp = &m->hp;

    /* The layers this file holds: a stage mini-GGUF says so, a full GGUF holds them all. */
    uint32_t ff = 0, fl = hp->n_layer;
    uint32_t wf, wl;
    if (gguf_get_u32(m->gf, "kvasir.window.first", &wf) == 0 &&
        gguf_get_u32(m->gf, "kvasir.window.last", &wl) == 0) {
        if (wf >= wl || wl > hp->n_layer) {
            seterr(err, errlen, "metadata kvasir.window [%" PRIu32 ", %" PRIu32 ") not inside "
                   "[0, %" PRIu32 ")", wf, wl, hp->n_layer);
            rc = -EINVAL;
            goto fail;
        }
        ff = wf;
        fl = wl;
    }
    if (first == -1 && last == -1) {
        m->first = ff;
        m->last = fl;
    } else if (first < 0 || last < 0 || (uint32_t)first < ff || (uint32_t)last > fl ||
               first >= last) {
        seterr(err, errlen, "window [%d, %d) not inside the file's layers [%" PRIu32 ", %" PRIu32
               ")", first, last, ff, fl);
        rc = -ERANGE;
        goto fail;
    } else {
        m->first = (uint32_t)first;
        m->last = (uint32_t)last;
    }
    m->has_embed = m->first == 0;
    m->has_head = m->last == hp->n_layer;

    struct want_ctx w = {m->first, m->last, m->has_embed, m->has_head,
                         gguf_tensor_find(m->gf, "output.weight") == NULL};
    if ((rc = gguf_file_map_tensors(m->gf, want_tensor, &w, err, errlen)) < 0)
        goto fail;

    m->layers = calloc(m->last - m->first, sizeof *m->layers);
    if (!m->layers) {
        rc = -ENOMEM;
        goto fail;
    }
    for (uint32_t il = m->first; il < m->last; il++)
        if ((rc = bind_layer(m, ad, il, &m->layers[il - m->first], err, errlen)) < 0)
            goto fail;
    /* Llama 3.1 style RoPE: one frequency divisor per rotated pair. */
    if ((rc = bind_vec(m, "rope_freqs.weight", hp->n_rot / 2, true, &m->rope_freqs, err,
                       errlen)) < 0)
        goto fail;
    if (m->has_embed || (m->has_head && w.tied))
        if ((rc = bind_mat(m, "token_embd.weight", hp->n_embd, hp->n_vocab, &m->tok_embd, err,
                           errlen)) < 0)
            goto fail;
    if (m->has_head) {
        if ((rc = bind_vec(m, "output_norm.weight", hp->n_embd, false, &m->output_norm, err,
                           errlen)) < 0)
            goto fail;
        if (w.tied)
            m->output = m->tok_embd;
        else if ((rc = bind_mat(m, "output.weight", hp->n_embd, hp->n_vocab, &m->output, err,
                                errlen)) < 0)
            goto fail;
    }
    *out = m;
    return 0;
fail:
    model_free(m);
    return rc;
}

void model_free(struct model *m)
{
    if (!m)
        return;
    free(m->layers);
    gguf_file_free(m->gf);
    free(m);
}

const struct model_hparams *model_get_hparams(const struct model *m) { return &m->hp; }

void model_get_window(const struct model *m, uint32_t *first, uint32_t *last)
{
    *first = m->first;
    *last = m->last;
}

bool model_has_embed(const struct model *m) { return m->has_embed; }
bool model_has_head(const struct model *m) { return m->has_head; }
const struct gguf_file *model_get_gguf(const struct model *m) { return m->gf; }

uint64_t model_kv_bytes_per_token(const struct model *m)
{
    /* K and V, F16, for each layer of the window. */
    return (uint64_t)(m->last - m->first) * 2u * m->hp.n_head_kv * m->hp.head_dim * 2u;
}

static uint64_t mat_bytes(const struct model_mat *w)
{
    return w->data ? (uint64_t)kern_row_bytes(w->type, w->cols) * w->rows : 0;
}

uint64_t model_weight_bytes(const struct model *m)
{
    const struct model_hparams *hp = &m->hp;
    uint32_t q_dim = hp->n_head * hp->head_dim, kv_dim = hp->n_head_kv * hp->head_dim;
    uint64_t b = 0;
    for (uint32_t i = 0; i < m->last - m->first; i++) {
        const struct model_layer *L = &m->layers[i];
        b += mat_bytes(&L->wq) + mat_bytes(&L->wk) + mat_bytes(&L->wv) + mat_bytes(&L->wo) +
             mat_bytes(&L->w_gate) + mat_bytes(&L->w_up) + mat_bytes(&L->w_down);
        b += 4ull * (2ull * hp->n_embd + (L->bq ? q_dim + 2ull * kv_dim : 0) +
                     (L->q_norm ? 2ull * hp->head_dim : 0));
    }
    if (m->has_head)
        b += mat_bytes(&m->output) + 4ull * hp->n_embd;
    return b;
}

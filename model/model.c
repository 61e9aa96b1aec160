/* model.c — architectures and window weights: hyperparameters from GGUF metadata, the
 * tensors of layers [first, last) bound as views into the mapping (nothing is copied), every
 * shape and type checked against the hyperparameters before anything uses it. */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "kernels/kern.h"
#include "model/internal.h"
#include "util/util.h"
#include "wtype/wtype.h"

/* Tensor types are ggml's numbers in both the file format and the kernels; model is where the
 * two meet (kernels/ includes no GGUF header), so this is where they are pinned together. */
#define SAME_TYPE(t) static_assert((int)KERN_T_##t == (int)GGUF_T_##t, #t " differs in kern and gguf")
SAME_TYPE(F32); SAME_TYPE(F16); SAME_TYPE(BF16);
SAME_TYPE(Q4_0); SAME_TYPE(Q4_1); SAME_TYPE(Q5_0); SAME_TYPE(Q5_1); SAME_TYPE(Q8_0); SAME_TYPE(Q8_1);
SAME_TYPE(Q2_K); SAME_TYPE(Q3_K); SAME_TYPE(Q4_K); SAME_TYPE(Q5_K); SAME_TYPE(Q6_K); SAME_TYPE(Q8_K);
SAME_TYPE(COUNT);
#undef SAME_TYPE

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
        util_seterr(err, errlen, "metadata %s missing", full);
        return -EINVAL;
    }
    if (rc < 0) {
        util_seterr(err, errlen, "metadata %s: not an integer that fits 32 bits", full);
        return -EINVAL;
    }
    if (*out < lo || *out > hi) {
        util_seterr(err, errlen, "metadata %s = %" PRIu32 " out of range [%" PRIu32 ", %" PRIu32 "]",
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
        util_seterr(err, errlen, "metadata %s: not a number in [%g, %g]", full, lo, hi);
        return -EINVAL;
    }
    return 0;
}

static int read_hparams(struct gguf_file *f, struct model_hparams *hp,
                        const struct model_arch **ad, char *err, size_t errlen)
{
    memset(hp, 0, sizeof *hp);
    int rc = gguf_get_str(f, "general.architecture", hp->arch, sizeof hp->arch);
    if (rc < 0) {
        util_seterr(err, errlen, "metadata general.architecture missing or not a short string");
        return -EINVAL;
    }
    *ad = model_arch_find(hp->arch);
    if (!*ad) {
        char names[128];
        model_arch_names(names, sizeof names);
        util_seterr(err, errlen, "architecture '%s' is not supported (supported: %s)", hp->arch,
                      names);
        return -ENOTSUP;
    }
    const char *a = hp->arch;
    /* A MoE model's feed_forward_length is unused (qwen3moe) or absent (qwen35moe). */
    if ((rc = get_u32(f, a, "block_count", &hp->n_block, true, 1, MODEL_MAX_LAYERS, err, errlen)) ||
        (rc = get_u32(f, a, "embedding_length", &hp->n_embd, true, 1, MODEL_MAX_EMBD, err, errlen)) ||
        (rc = get_u32(f, a, "feed_forward_length", &hp->n_ff, !(*ad)->moe, 1, MODEL_MAX_FF, err, errlen)) ||
        (rc = get_u32(f, a, "attention.head_count", &hp->n_head, true, 1, MODEL_MAX_HEADS, err, errlen)))
        return rc;
    /* Multi-token-prediction blocks sit after the main-pass layers and are not run. */
    if ((rc = get_u32(f, a, "nextn_predict_layers", &hp->n_nextn, false, 0, hp->n_block - 1, err, errlen)))
        return rc;
    hp->n_layer = hp->n_block - hp->n_nextn;
    if ((rc = get_u32(f, a, "expert_count", &hp->n_expert, false, 0, UINT32_MAX, err, errlen)))
        return rc;
    if (hp->n_expert > 0 && !(*ad)->moe) {
        util_seterr(err, errlen, "metadata %s.expert_count = %" PRIu32 ": mixture-of-experts %s "
                      "models are not supported", a, hp->n_expert, a);
        return -ENOTSUP;
    }
    if ((*ad)->moe) {
        if ((rc = get_u32(f, a, "expert_count", &hp->n_expert, true, 1, MODEL_MAX_EXPERTS, err, errlen)) ||
            (rc = get_u32(f, a, "expert_used_count", &hp->n_expert_used, true, 1, hp->n_expert, err, errlen)) ||
            (rc = get_u32(f, a, "expert_feed_forward_length", &hp->n_ff_exp, true, 1, MODEL_MAX_FF, err, errlen)))
            return rc;
        if ((*ad)->shexp &&
            (rc = get_u32(f, a, "expert_shared_feed_forward_length", &hp->n_ff_shexp, true, 1,
                          MODEL_MAX_FF, err, errlen)))
            return rc;
    }
    if ((*ad)->hybrid) {
        hp->full_attn_interval = MODEL_FULL_ATTN_INTERVAL_DEFAULT;
        if ((rc = get_u32(f, a, "full_attention_interval", &hp->full_attn_interval, false, 1, MODEL_MAX_LAYERS, err, errlen)) ||
            (rc = get_u32(f, a, "ssm.conv_kernel", &hp->ssm_conv_kernel, true, 1, MODEL_MAX_CONV, err, errlen)) ||
            (rc = get_u32(f, a, "ssm.state_size", &hp->ssm_d_state, true, 1, MODEL_MAX_HEAD_DIM, err, errlen)) ||
            (rc = get_u32(f, a, "ssm.group_count", &hp->ssm_n_group, true, 1, MODEL_MAX_HEADS, err, errlen)) ||
            (rc = get_u32(f, a, "ssm.time_step_rank", &hp->ssm_dt_rank, true, 1, MODEL_MAX_HEADS, err, errlen)) ||
            (rc = get_u32(f, a, "ssm.inner_size", &hp->ssm_d_inner, true, 1, MODEL_MAX_FF, err, errlen)))
            return rc;
        if (hp->ssm_d_inner != hp->ssm_dt_rank * hp->ssm_d_state) {
            util_seterr(err, errlen, "metadata %s.ssm.inner_size %" PRIu32 " != time_step_rank %" PRIu32
                          " x state_size %" PRIu32, a, hp->ssm_d_inner, hp->ssm_dt_rank, hp->ssm_d_state);
            return -EINVAL;
        }
    }
    hp->n_head_kv = hp->n_head;
    if ((rc = get_u32(f, a, "attention.head_count_kv", &hp->n_head_kv, false, 1, hp->n_head, err, errlen)))
        return rc;
    if (hp->n_head % hp->n_head_kv) {
        util_seterr(err, errlen, "metadata %s.attention.head_count %" PRIu32 " not a multiple of "
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
        util_seterr(err, errlen, "metadata %s.attention.value_length %" PRIu32 " != key_length %" PRIu32
                      " (not supported)", a, vlen, hp->head_dim);
        return -ENOTSUP;
    }
    if (hp->head_dim == 0 || hp->head_dim > MODEL_MAX_HEAD_DIM) {
        util_seterr(err, errlen, "head dimension %" PRIu32 " out of range", hp->head_dim);
        return -EINVAL;
    }
    hp->n_rot = hp->head_dim;
    if ((rc = get_u32(f, a, "rope.dimension_count", &hp->n_rot, false, 2, hp->head_dim, err, errlen)))
        return rc;
    if (hp->n_rot % 2) {
        util_seterr(err, errlen, "metadata %s.rope.dimension_count %" PRIu32 " is odd", a, hp->n_rot);
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
        util_seterr(err, errlen, "metadata %s = '%s': only linear RoPE scaling is supported", key, stype);
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
        util_seterr(err, errlen, "vocabulary size %" PRIu64 " out of range [1, %u]", nv, MODEL_MAX_VOCAB);
        return -EINVAL;
    }
    hp->n_vocab = (uint32_t)nv;
    return 0;
}

/* ---- binding tensors ---- */

/* A weight tensor of n_rows rows of cols elements: its type has kernels, its size is that
 * of the rows, it is mapped. 0 with *rb = bytes of one row, or -ENOTSUP / -EINVAL. */
static int check_weight(const struct gguf_tensor *t, const char *name, uint32_t cols,
                        uint64_t n_rows, size_t *rb, char *err, size_t errlen)
{
    if (!kern_type_supported(t->type)) {
        const struct wtype_info *ti = wtype_info(t->type);
        util_seterr(err, errlen, "tensor %s: weight type %s (%" PRIu32 ") is not supported", name,
                      ti ? ti->name : "unknown", t->type);
        return -ENOTSUP;
    }
    *rb = kern_row_bytes(t->type, cols);
    if (*rb == 0 || (uint64_t)*rb * n_rows != t->size) {
        util_seterr(err, errlen, "tensor %s: %" PRIu64 " bytes, expected %zu x %" PRIu64, name,
                      t->size, *rb, n_rows);
        return -EINVAL;
    }
    if (!t->data) {
        util_seterr(err, errlen, "tensor %s: not mapped", name);
        return -EINVAL;
    }
    return 0;
}

static int bind_mat(struct model *m, const char *name, uint32_t cols, uint32_t rows,
                    struct model_mat *out, char *err, size_t errlen)
{
    const struct gguf_tensor *t = gguf_tensor_find(m->gf, name);
    if (!t) {
        util_seterr(err, errlen, "tensor %s missing", name);
        return -ENOENT;
    }
    if (t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != 1 || t->ne[3] != 1) {
        util_seterr(err, errlen, "tensor %s: shape [%" PRIu64 ", %" PRIu64 ", %" PRIu64 ", %" PRIu64
                      "], expected [%" PRIu32 ", %" PRIu32 "]", name, t->ne[0], t->ne[1], t->ne[2],
                      t->ne[3], cols, rows);
        return -EINVAL;
    }
    size_t rb;
    int rc = check_weight(t, name, cols, rows, &rb, err, errlen);
    if (rc < 0)
        return rc;
    out->data = t->data;
    out->type = t->type;
    out->rows = rows;
    out->cols = cols;
    return 0;
}

/* A 1-D F32 vector of n elements. */
static int bind_vec(struct model *m, const char *name, uint32_t n, struct model_vec *out,
                    char *err, size_t errlen)
{
    const struct gguf_tensor *t = gguf_tensor_find(m->gf, name);
    if (!t) {
        util_seterr(err, errlen, "tensor %s missing", name);
        return -ENOENT;
    }
    if (t->ne[0] != n || t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1) {
        util_seterr(err, errlen, "tensor %s: shape [%" PRIu64 ", %" PRIu64 "], expected [%" PRIu32 "]",
                      name, t->ne[0], t->ne[1], n);
        return -EINVAL;
    }
    if (t->type != GGUF_T_F32) {
        util_seterr(err, errlen, "tensor %s: type %" PRIu32 ", expected f32", name, t->type);
        return -ENOTSUP;
    }
    if (!t->data || ((uintptr_t)t->data % sizeof(float))) {
        util_seterr(err, errlen, "tensor %s: not mapped or misaligned", name);
        return -EINVAL;
    }
    out->data = t->data;
    return 0;
}

/* A 2-D F32 array of rows x cols (ssm_conv1d). */
static int bind_f32(struct model *m, const char *name, uint32_t cols, uint32_t rows,
                    struct model_vec *out, char *err, size_t errlen)
{
    struct model_mat w;
    int rc = bind_mat(m, name, cols, rows, &w, err, errlen);
    if (rc < 0)
        return rc;
    if (w.type != GGUF_T_F32 || ((uintptr_t)w.data % sizeof(float))) {
        util_seterr(err, errlen, "tensor %s: type %" PRIu32 ", expected aligned f32", name, w.type);
        return -ENOTSUP;
    }
    out->data = w.data;
    return 0;
}

/* Routed experts: a 3-D tensor ne [cols, rows * parts, n]; part p (0 = gate, 1 = up of a fused
 * gate_up tensor) of expert e is rows p*rows.. of slice e, read in place. */
static int bind_exps(struct model *m, const char *name, uint32_t cols, uint32_t rows,
                     uint32_t n, uint32_t parts, struct model_exps *out, struct model_exps *out2,
                     char *err, size_t errlen)
{
    const struct gguf_tensor *t = gguf_tensor_find(m->gf, name);
    if (!t) {
        util_seterr(err, errlen, "tensor %s missing", name);
        return -ENOENT;
    }
    if (t->ne[0] != cols || t->ne[1] != (uint64_t)rows * parts || t->ne[2] != n || t->ne[3] != 1) {
        util_seterr(err, errlen, "tensor %s: shape [%" PRIu64 ", %" PRIu64 ", %" PRIu64 ", %" PRIu64
                      "], expected [%" PRIu32 ", %" PRIu64 ", %" PRIu32 "]", name, t->ne[0], t->ne[1],
                      t->ne[2], t->ne[3], cols, (uint64_t)rows * parts, n);
        return -EINVAL;
    }
    size_t rb;
    int rc = check_weight(t, name, cols, (uint64_t)rows * parts * n, &rb, err, errlen);
    if (rc < 0)
        return rc;
    struct model_exps x = {{t->data, t->type, rows, cols, {NULL, 0}}, n, rb * rows * parts};
    *out = x;
    if (parts == 2) {
        x.m.data = (const uint8_t *)t->data + rb * rows;
        *out2 = x;
    }
    return 0;
}

/* The tensor d describes, named name, as the view its form asks for, stored at its field of
 * base (a struct model_layer for block tensors, the struct model for globals). An optional
 * tensor that is absent leaves the field as it was (zero). */
static int bind_desc(struct model *m, const struct model_tensor_desc *d, const char *name,
                     void *base, bool optional, char *err, size_t errlen)
{
    if (optional && !gguf_tensor_find(m->gf, name))
        return 0;
    /* every dimension is capped through the hyperparameters' caps, far below 2^32 */
    uint32_t d0 = (uint32_t)model_dim_value(&m->hp, d->dims[0]);
    uint32_t d1 = (uint32_t)model_dim_value(&m->hp, d->dims[1]);
    uint32_t d2 = (uint32_t)model_dim_value(&m->hp, d->dims[2]);
    void *field = (char *)base + d->field;
    switch ((enum model_form)d->form) {
    case MODEL_FORM_VEC: return bind_vec(m, name, d0, field, err, errlen);
    case MODEL_FORM_ARR: return bind_f32(m, name, d0, d1, field, err, errlen);
    case MODEL_FORM_MAT: return bind_mat(m, name, d0, d1, field, err, errlen);
    case MODEL_FORM_EXPS: return bind_exps(m, name, d0, d1, d2, 1, field, NULL, err, errlen);
    case MODEL_FORM_EXPS2:
        return bind_exps(m, name, d0, d1 / 2, d2, 2, field, (struct model_exps *)field + 1, err,
                         errlen);
    }
    util_seterr(err, errlen, "tensor %s: no binding for form %u", name, d->form);
    return -EINVAL;
}

/* Block il into L: a main-pass block of its kind, or (mtp) a multi-token-prediction block: a
 * full-attention block of the architecture (gated on the hybrids) plus the nextn tensors. */
static int bind_block(struct model *m, uint32_t il, struct model_layer *L, bool mtp, char *err,
                      size_t errlen)
{
    L->recurrent = !mtp && m->recurrent[il];
    L->attn_gated = m->arch->hybrid && !L->recurrent;
    const struct model_tensor_desc *lists[] = {
        m->arch->layer[L->recurrent ? MODEL_LAYER_RECURRENT : MODEL_LAYER_ATTN],
        mtp ? model_tensors_nextn : NULL};
    bool fused = false;       /* gate and up experts came as one tensor */
    for (size_t k = 0; k < 2 && lists[k]; k++)
        for (const struct model_tensor_desc *d = lists[k]; d->name; d++) {
            char n[96];
            snprintf(n, sizeof n, "blk.%" PRIu32 ".%s", il, d->name);
            bool optional = (d->flags & MODEL_TF_OPTIONAL) ||
                            ((d->flags & MODEL_TF_UNFUSED) && fused);
            int rc = bind_desc(m, d, n, L, optional, err, errlen);
            if (rc < 0)
                return rc;
            if (d->form == MODEL_FORM_EXPS2)
                fused = L->gate_exps.m.data != NULL;
        }
    if (!L->recurrent && !L->q_norm.data != !L->k_norm.data) {
        util_seterr(err, errlen, "block %" PRIu32 ": attn_q_norm and attn_k_norm must come together", il);
        return -EINVAL;
    }
    return 0;
}

/* The hybrid layer schedule: attention.recurrent_layers (one flag per block) when present,
 * else layer i is full attention iff (i + 1) % full_attention_interval == 0. */
static int layer_schedule(struct model *m, char *err, size_t errlen)
{
    const struct model_hparams *hp = &m->hp;
    m->recurrent = calloc(hp->n_layer, sizeof *m->recurrent);
    if (!m->recurrent)
        return -ENOMEM;
    if (!m->arch->hybrid)
        return 0;
    char key[128];
    snprintf(key, sizeof key, "%s.attention.recurrent_layers", hp->arch);
    const struct gguf_value *arr;
    if (gguf_get_arr(m->gf, key, &arr) == 0) {
        static const uint8_t esz[GGUF_V_COUNT] = {
            [GGUF_V_U8] = 1, [GGUF_V_I8] = 1, [GGUF_V_BOOL] = 1, [GGUF_V_U16] = 2,
            [GGUF_V_I16] = 2, [GGUF_V_U32] = 4, [GGUF_V_I32] = 4, [GGUF_V_U64] = 8,
            [GGUF_V_I64] = 8};
        uint32_t et = arr->v.arr.type;
        if (et >= GGUF_V_COUNT || !esz[et] || arr->v.arr.n < hp->n_layer ||
            arr->v.arr.n > hp->n_block) {
            util_seterr(err, errlen, "metadata %s: %" PRIu64 " elements of type %" PRIu32 ", expected "
                          "%" PRIu32 " integers or booleans", key, arr->v.arr.n, et, hp->n_block);
            return -EINVAL;
        }
        const uint8_t *p = arr->v.arr.data;
        for (uint32_t i = 0; i < hp->n_layer; i++) {
            uint64_t v = 0;
            memcpy(&v, p + (size_t)i * esz[et], esz[et]);   /* little-endian, nonzero = true */
            m->recurrent[i] = v != 0;
        }
        return 0;
    }
    for (uint32_t i = 0; i < hp->n_layer; i++)
        m->recurrent[i] = model_arch_layer_kind(m->arch, hp, i) == MODEL_LAYER_RECURRENT;
    return 0;
}

/* ---- which tensors a window maps ---- */

struct want_ctx {
    uint32_t first, last;
    bool embed, head, tied;
    int32_t mtp;           /* the MTP block the window loads (-1: none) */
};

/* A global tensor a window with (or without) the embedding and the head reads: token_embd
 * for the embedding and a tied head, the head's own, and the rest (rope_freqs) everywhere. */
static bool global_wanted(const struct model_tensor_desc *d, const struct want_ctx *w)
{
    if (d->flags & MODEL_TF_EMBED)
        return w->embed || (w->head && (w->tied || w->mtp >= 0));
    if (d->flags & MODEL_TF_HEAD)
        return w->head && !((d->flags & MODEL_TF_UNTIED) && w->tied);
    return true;
}

static const struct model_tensor_desc *const globals[] = {model_tensors_input, model_tensors_output};

static bool want_tensor(const struct gguf_tensor *t, void *ud)
{
    const struct want_ctx *w = ud;
    int l = gguf_tensor_layer(t->name);
    if (l >= 0)
        return ((uint32_t)l >= w->first && (uint32_t)l < w->last) || l == w->mtp;
    for (size_t g = 0; g < sizeof globals / sizeof globals[0]; g++)
        for (const struct model_tensor_desc *d = globals[g]; d->name; d++)
            if (!strcmp(t->name, d->name))
                return global_wanted(d, w);
    return false;
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
    if ((rc = read_hparams(m->gf, &m->hp, &m->arch, err, errlen)) < 0)
        goto fail;
    const struct model_hparams *hp = &m->hp;

    /* The layers this file holds: a stage mini-GGUF says so, a full GGUF holds them all. */
    uint32_t ff = 0, fl = hp->n_layer;
    uint32_t wf, wl;
    if (gguf_get_u32(m->gf, "kvasir.window.first", &wf) == 0 &&
        gguf_get_u32(m->gf, "kvasir.window.last", &wl) == 0) {
        if (wf >= wl || wl > hp->n_block || wf >= hp->n_layer) {
            util_seterr(err, errlen, "metadata kvasir.window [%" PRIu32 ", %" PRIu32 ") not inside "
                          "[0, %" PRIu32 ")", wf, wl, hp->n_layer);
            rc = -EINVAL;
            goto fail;
        }
        ff = wf;
        fl = wl < hp->n_layer ? wl : hp->n_layer;   /* MTP blocks in a window are not run */
    }
    if (first == -1 && last == -1) {
        m->first = ff;
        m->last = fl;
    } else if (first < 0 || last < 0 || (uint32_t)first < ff || (uint32_t)last > fl ||
               first >= last) {
        util_seterr(err, errlen, "window [%d, %d) not inside the file's layers [%" PRIu32 ", %" PRIu32
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
                         gguf_tensor_find(m->gf, "output.weight") == NULL, -1};
    /* The last window loads the first MTP block when the file holds it and the embedding it
     * reads (a full GGUF, or a last-window slice that carries them). */
    char mtp_name[64];
    snprintf(mtp_name, sizeof mtp_name, "blk.%" PRIu32 ".nextn.eh_proj.weight", hp->n_layer);
    if (m->has_head && hp->n_nextn > 0 && gguf_tensor_find(m->gf, mtp_name) &&
        gguf_tensor_find(m->gf, "token_embd.weight"))
        w.mtp = (int32_t)hp->n_layer;
    m->has_mtp = w.mtp >= 0;
    if ((rc = gguf_file_map_tensors(m->gf, want_tensor, &w, err, errlen)) < 0)
        goto fail;

    m->layers = calloc(m->last - m->first, sizeof *m->layers);
    if (!m->layers) {
        rc = -ENOMEM;
        goto fail;
    }
    if ((rc = layer_schedule(m, err, errlen)) < 0)
        goto fail;
    for (uint32_t il = m->first; il < m->last; il++)
        if ((rc = bind_block(m, il, &m->layers[il - m->first], false, err, errlen)) < 0)
            goto fail;
    if (m->has_mtp && (rc = bind_block(m, hp->n_layer, &m->mtp, true, err, errlen)) < 0)
        goto fail;
    for (size_t g = 0; g < sizeof globals / sizeof globals[0]; g++)
        for (const struct model_tensor_desc *d = globals[g]; d->name; d++)
            if (global_wanted(d, &w) &&
                (rc = bind_desc(m, d, d->name, m, d->flags & MODEL_TF_OPTIONAL, err, errlen)) < 0)
                goto fail;
    if (m->has_head && w.tied)
        m->output = m->tok_embd;
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
    free(m->recurrent);
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
    /* K and V, F16, for each full-attention layer of the window. */
    uint64_t n = 0;
    for (uint32_t i = 0; i < m->last - m->first; i++)
        n += !m->layers[i].recurrent;
    n += m->has_mtp;   /* the MTP block's entries */
    return n * 2u * m->hp.n_head_kv * m->hp.head_dim * 2u;
}

uint64_t model_state_bytes(const struct model *m)
{
    const struct model_hparams *hp = &m->hp;
    uint64_t conv_dim = 2ull * hp->ssm_n_group * hp->ssm_d_state + hp->ssm_d_inner;
    uint64_t per = 4ull * ((hp->ssm_conv_kernel ? hp->ssm_conv_kernel - 1 : 0) * conv_dim +
                           (uint64_t)hp->ssm_dt_rank * hp->ssm_d_state * hp->ssm_d_state);
    uint64_t n = 0;
    for (uint32_t i = 0; i < m->last - m->first; i++)
        n += m->layers[i].recurrent;
    return n * per;
}

bool model_layer_is_recurrent(const struct model *m, uint32_t il)
{
    return il < m->hp.n_layer && m->recurrent[il];
}

static uint64_t mat_bytes(const struct model_mat *w)
{
    return w->data ? (uint64_t)kern_row_bytes(w->type, w->cols) * w->rows : 0;
}

/* One expert of each expert tensor (gate + up + down). */
static uint64_t expert_bytes(const struct model_layer *L)
{
    return mat_bytes(&L->gate_exps.m) + mat_bytes(&L->up_exps.m) + mat_bytes(&L->down_exps.m);
}

uint64_t model_expert_bytes(const struct model *m)
{
    uint64_t b = 0;
    for (uint32_t i = 0; i < m->last - m->first; i++)
        b += expert_bytes(&m->layers[i]) * m->hp.n_expert;
    return b;
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
        b += mat_bytes(&L->wqkv) + mat_bytes(&L->wz) + mat_bytes(&L->w_beta) +
             mat_bytes(&L->w_alpha) + mat_bytes(&L->ssm_out);
        b += mat_bytes(&L->gate_inp) + expert_bytes(L) * hp->n_expert_used +
             mat_bytes(&L->gate_shexp) + mat_bytes(&L->up_shexp) + mat_bytes(&L->down_shexp) +
             mat_bytes(&L->gate_inp_shexp);
        b += 4ull * (2ull * hp->n_embd + (L->bq.data ? q_dim + 2ull * kv_dim : 0) +
                     (L->q_norm.data ? 2ull * hp->head_dim : 0));
        if (L->recurrent)
            b += 4ull * ((2ull * hp->ssm_n_group * hp->ssm_d_state + hp->ssm_d_inner) *
                         hp->ssm_conv_kernel + 2ull * hp->ssm_dt_rank + hp->ssm_d_state);
    }
    if (m->has_head)
        b += mat_bytes(&m->output) + 4ull * hp->n_embd;
    return b;
}

/* arch.c — the architecture table: every supported architecture's tensors, block by block,
 * with their shapes as hyperparameter expressions. model.c binds weights from it, the
 * planner sizes models from it, `kvctl synth` writes files from it; nothing else lists
 * tensor names. */
#include <assert.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "model/internal.h"

/* A tensor of a block (field: the struct model_layer member model_open fills). */
#define T(nm, nd, d0, d1, d2, fm, fl, fld) \
    {nm, nd, {MODEL_DIM_##d0, MODEL_DIM_##d1, MODEL_DIM_##d2}, MODEL_FORM_##fm, fl, \
     offsetof(struct model_layer, fld)}
/* A global tensor (field: the struct model member). */
#define G(nm, nd, d0, d1, fm, fl, fld) \
    {nm, nd, {MODEL_DIM_##d0, MODEL_DIM_##d1, MODEL_DIM_ONE}, MODEL_FORM_##fm, fl, \
     offsetof(struct model, fld)}
#define END {NULL, 0, {0, 0, 0}, 0, 0, 0}

#define F32 MODEL_TF_F32
#define OPT MODEL_TF_OPTIONAL

/* Pieces of a block, in the order llama.cpp writes them. */
#define ATTN_NORM T("attn_norm.weight", 1, EMBD, ONE, ONE, VEC, F32, attn_norm)
/* Softmax attention; bias_fl / norm_fl are OPT where the architecture may leave them out. */
#define ATTN(q_rows, bias_fl, norm_fl) \
    T("attn_q.weight", 2, EMBD, q_rows, ONE, MAT, 0, wq), \
    T("attn_k.weight", 2, EMBD, KV, ONE, MAT, 0, wk), \
    T("attn_v.weight", 2, EMBD, KV, ONE, MAT, 0, wv), \
    T("attn_q.bias", 1, Q, ONE, ONE, VEC, F32 | (bias_fl), bq), \
    T("attn_k.bias", 1, KV, ONE, ONE, VEC, F32 | (bias_fl), bk), \
    T("attn_v.bias", 1, KV, ONE, ONE, VEC, F32 | (bias_fl), bv), \
    T("attn_q_norm.weight", 1, HEAD, ONE, ONE, VEC, F32 | (norm_fl), q_norm), \
    T("attn_k_norm.weight", 1, HEAD, ONE, ONE, VEC, F32 | (norm_fl), k_norm), \
    T("attn_output.weight", 2, Q, EMBD, ONE, MAT, 0, wo)
/* Gated DeltaNet: conv over [q | k | v], gate z, per-head decay (alpha) and step (beta). */
#define DELTANET \
    T("attn_qkv.weight", 2, EMBD, CONV, ONE, MAT, 0, wqkv), \
    T("attn_gate.weight", 2, EMBD, INNER, ONE, MAT, 0, wz), \
    T("ssm_conv1d.weight", 2, CONV_KERNEL, CONV, ONE, ARR, F32, conv1d), \
    T("ssm_dt.bias", 1, DT_RANK, ONE, ONE, VEC, F32, dt_bias), \
    T("ssm_a", 1, DT_RANK, ONE, ONE, VEC, F32, ssm_a), \
    T("ssm_beta.weight", 2, EMBD, DT_RANK, ONE, MAT, 0, w_beta), \
    T("ssm_alpha.weight", 2, EMBD, DT_RANK, ONE, MAT, 0, w_alpha), \
    T("ssm_norm.weight", 1, STATE, ONE, ONE, VEC, F32, ssm_norm), \
    T("ssm_out.weight", 2, INNER, EMBD, ONE, MAT, 0, ssm_out)
#define FFN_NORM T("ffn_norm.weight", 1, EMBD, ONE, ONE, VEC, F32, ffn_norm)
#define POST_ATTN_NORM T("post_attention_norm.weight", 1, EMBD, ONE, ONE, VEC, F32, ffn_norm)
#define FFN \
    T("ffn_gate.weight", 2, EMBD, FF, ONE, MAT, 0, w_gate), \
    T("ffn_up.weight", 2, EMBD, FF, ONE, MAT, 0, w_up), \
    T("ffn_down.weight", 2, FF, EMBD, ONE, MAT, 0, w_down)
/* Routed experts; gate and up may come fused in one tensor. */
#define MOE \
    T("ffn_gate_inp.weight", 2, EMBD, EXPERT, ONE, MAT, F32, gate_inp), \
    T("ffn_gate_up_exps.weight", 3, EMBD, FF_EXP2, EXPERT, EXPS2, OPT, gate_exps), \
    T("ffn_gate_exps.weight", 3, EMBD, FF_EXP, EXPERT, EXPS, MODEL_TF_UNFUSED, gate_exps), \
    T("ffn_up_exps.weight", 3, EMBD, FF_EXP, EXPERT, EXPS, MODEL_TF_UNFUSED, up_exps), \
    T("ffn_down_exps.weight", 3, FF_EXP, EMBD, EXPERT, EXPS, 0, down_exps)
/* Shared expert; its gate is one row, 1-D [n_embd] in files (2-D [n_embd, 1] also read). */
#define SHEXP \
    T("ffn_gate_inp_shexp.weight", 1, EMBD, ONE, ONE, MAT, F32, gate_inp_shexp), \
    T("ffn_gate_shexp.weight", 2, EMBD, FF_SHEXP, ONE, MAT, 0, gate_shexp), \
    T("ffn_up_shexp.weight", 2, EMBD, FF_SHEXP, ONE, MAT, 0, up_shexp), \
    T("ffn_down_shexp.weight", 2, FF_SHEXP, EMBD, ONE, MAT, 0, down_shexp)

static const struct model_tensor_desc llama_attn[] = {ATTN_NORM, ATTN(Q, OPT, OPT), FFN_NORM, FFN, END};
static const struct model_tensor_desc qwen2_attn[] = {ATTN_NORM, ATTN(Q, 0, OPT), FFN_NORM, FFN, END};
static const struct model_tensor_desc qwen3_attn[] = {ATTN_NORM, ATTN(Q, OPT, 0), FFN_NORM, FFN, END};
static const struct model_tensor_desc qwen3moe_attn[] = {ATTN_NORM, ATTN(Q, OPT, 0), FFN_NORM, MOE, END};
static const struct model_tensor_desc qwen35_attn[] = {
    ATTN_NORM, ATTN(Q_GATED, OPT, 0), POST_ATTN_NORM, FFN, END};
static const struct model_tensor_desc qwen35_rec[] = {ATTN_NORM, DELTANET, POST_ATTN_NORM, FFN, END};
static const struct model_tensor_desc qwen35moe_attn[] = {
    ATTN_NORM, ATTN(Q_GATED, OPT, 0), POST_ATTN_NORM, MOE, SHEXP, END};
static const struct model_tensor_desc qwen35moe_rec[] = {
    ATTN_NORM, DELTANET, POST_ATTN_NORM, MOE, SHEXP, END};

static const struct model_arch archs[] = {
    /* name        neox   bias   qknorm moe    hybrid shexp */
    {"llama",     false, false, false, false, false, false, {llama_attn, NULL}},
    {"qwen2",     true,  true,  false, false, false, false, {qwen2_attn, NULL}},
    {"qwen3",     true,  false, true,  false, false, false, {qwen3_attn, NULL}},
    {"qwen3moe",  true,  false, true,  true,  false, false, {qwen3moe_attn, NULL}},
    {"qwen35",    true,  false, true,  false, true,  false, {qwen35_attn, qwen35_rec}},
    {"qwen35moe", true,  false, true,  true,  true,  true,  {qwen35moe_attn, qwen35moe_rec}},
};

const struct model_tensor_desc model_tensors_input[] = {
    G("token_embd.weight", 2, EMBD, VOCAB, MAT, MODEL_TF_EMBED, tok_embd),
    /* Llama 3.1 style RoPE: one frequency divisor per rotated pair; every layer reads it. */
    G("rope_freqs.weight", 1, ROT_PAIRS, ONE, VEC, F32 | OPT, rope_freqs),
    END,
};

const struct model_tensor_desc model_tensors_output[] = {
    G("output_norm.weight", 1, EMBD, ONE, VEC, F32 | MODEL_TF_HEAD, output_norm),
    G("output.weight", 2, EMBD, VOCAB, MAT, MODEL_TF_HEAD | MODEL_TF_UNTIED, output),
    END,
};

/* Multi-token prediction: what an MTP block holds beside a full-attention block's tensors
 * (the embedding and the hidden state combined, the norm before the shared head). */
const struct model_tensor_desc model_tensors_nextn[] = {
    T("nextn.eh_proj.weight", 2, EMBD2, EMBD, ONE, MAT, 0, eh_proj),
    T("nextn.enorm.weight", 1, EMBD, ONE, ONE, VEC, F32, enorm),
    T("nextn.hnorm.weight", 1, EMBD, ONE, ONE, VEC, F32, hnorm),
    T("nextn.shared_head_norm.weight", 1, EMBD, ONE, ONE, VEC, F32, head_norm),
    END,
};

/* model.c binds the fused gate_up experts into gate_exps and the struct after it. */
static_assert(offsetof(struct model_layer, up_exps) ==
              offsetof(struct model_layer, gate_exps) + sizeof(struct model_exps),
              "up_exps follows gate_exps");
static_assert(sizeof(struct model_layer) <= UINT16_MAX && sizeof(struct model) <= UINT16_MAX,
              "fields fit model_tensor_desc.field");

const struct model_arch *model_arch_list(size_t *n)
{
    *n = sizeof archs / sizeof archs[0];
    return archs;
}

const struct model_arch *model_arch_find(const char *name)
{
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (!strcmp(name, archs[i].name))
            return &archs[i];
    return NULL;
}

void model_arch_names(char *buf, size_t n)
{
    size_t k = 0;
    if (n)
        buf[0] = 0;
    for (size_t i = 0; i < sizeof archs / sizeof archs[0] && k < n; i++) {
        int w = snprintf(buf + k, n - k, "%s%s", i ? ", " : "", archs[i].name);
        if (w < 0)
            break;
        k += (size_t)w;
    }
}

uint64_t model_dim_value(const struct model_hparams *hp, uint8_t dim)
{
    switch ((enum model_dim)dim) {
    case MODEL_DIM_ONE: return 1;
    case MODEL_DIM_EMBD: return hp->n_embd;
    case MODEL_DIM_EMBD2: return 2ull * hp->n_embd;
    case MODEL_DIM_VOCAB: return hp->n_vocab;
    case MODEL_DIM_FF: return hp->n_ff;
    case MODEL_DIM_Q: return (uint64_t)hp->n_head * hp->head_dim;
    case MODEL_DIM_Q_GATED: return 2ull * hp->n_head * hp->head_dim;
    case MODEL_DIM_KV: return (uint64_t)hp->n_head_kv * hp->head_dim;
    case MODEL_DIM_HEAD: return hp->head_dim;
    case MODEL_DIM_ROT_PAIRS: return hp->n_rot / 2;
    case MODEL_DIM_EXPERT: return hp->n_expert;
    case MODEL_DIM_FF_EXP: return hp->n_ff_exp;
    case MODEL_DIM_FF_EXP2: return 2ull * hp->n_ff_exp;
    case MODEL_DIM_FF_SHEXP: return hp->n_ff_shexp;
    case MODEL_DIM_CONV: return 2ull * hp->ssm_n_group * hp->ssm_d_state + hp->ssm_d_inner;
    case MODEL_DIM_CONV_KERNEL: return hp->ssm_conv_kernel;
    case MODEL_DIM_INNER: return hp->ssm_d_inner;
    case MODEL_DIM_DT_RANK: return hp->ssm_dt_rank;
    case MODEL_DIM_STATE: return hp->ssm_d_state;
    }
    return 0;
}

enum model_layer_kind model_arch_layer_kind(const struct model_arch *a,
                                            const struct model_hparams *hp, uint32_t il)
{
    if (!a->hybrid || il >= hp->n_layer || !hp->full_attn_interval)
        return MODEL_LAYER_ATTN;
    return (il + 1) % hp->full_attn_interval ? MODEL_LAYER_RECURRENT : MODEL_LAYER_ATTN;
}

/* The tensors of list l a written file holds (block il, or a global when il < 0). */
static int walk(const struct model_tensor_desc *l, const struct model_hparams *hp, bool tied,
                long il, model_tensor_cb cb, void *ud, int *count)
{
    for (; l->name; l++) {
        if ((l->flags & MODEL_TF_OPTIONAL) || ((l->flags & MODEL_TF_UNTIED) && tied))
            continue;
        ++*count;
        if (!cb)
            continue;
        char name[96];
        if (il >= 0)
            snprintf(name, sizeof name, "blk.%ld.%s", il, l->name);
        else
            snprintf(name, sizeof name, "%s", l->name);
        uint64_t ne[4] = {1, 1, 1, 1};
        for (uint32_t d = 0; d < l->n_dims && d < 3; d++)
            ne[d] = model_dim_value(hp, l->dims[d]);
        int rc = cb(ud, name, l, ne);
        if (rc < 0)
            return rc;
    }
    return 0;
}

int model_arch_tensors(const struct model_arch *a, const struct model_hparams *hp, bool tied,
                       model_tensor_cb cb, void *ud)
{
    int n = 0, rc;
    if ((rc = walk(model_tensors_input, hp, tied, -1, cb, ud, &n)) < 0)
        return rc;
    for (uint32_t il = 0; il < hp->n_block; il++) {
        const struct model_tensor_desc *l = a->layer[model_arch_layer_kind(a, hp, il)];
        if ((rc = walk(l, hp, tied, il, cb, ud, &n)) < 0)
            return rc;
        if (il >= hp->n_layer && (rc = walk(model_tensors_nextn, hp, tied, il, cb, ud, &n)) < 0)
            return rc;
    }
    if ((rc = walk(model_tensors_output, hp, tied, -1, cb, ud, &n)) < 0)
        return rc;
    return n;
}

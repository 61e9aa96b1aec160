/* shape.c — model shapes for the planner: from a tensor list (a GGUF header or a catalog),
 * and tensor lists synthesised from a family's hyperparameters (a model whose file is not at
 * hand) with the architecture table of model/. Pure arithmetic on caller-provided arrays. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "util/util.h"
#include "planner/plan.h"
#include "util/util.h"

#define NAME_LEN 64
#define MAX_TENSORS_PER_LAYER 32

/* "blk.N.rest" -> N and rest; -1 otherwise. */
static long blk_layer(const char *name, const char **rest)
{
    if (strncmp(name, "blk.", 4) != 0)
        return -1;
    const char *p = name + 4;
    long v = 0;
    if (*p < '0' || *p > '9')
        return -1;
    while (*p >= '0' && *p <= '9') {
        v = v * 10 + (*p - '0');
        if (v > 1000000) return -1;
        p++;
    }
    if (*p != '.')
        return -1;
    *rest = p + 1;
    return v;
}

static bool has_prefix(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

static double elems(const struct plan_tensor *t)
{
    double n = 1;
    for (uint32_t d = 0; d < t->n_dims && d < 4; d++) n *= (double)t->ne[d];
    return n;
}

int plan_shape_from_tensors(const struct plan_tensor *t, size_t n, const struct plan_model_info *mi,
                            struct plan_shape *s, struct plan_layer *layers, char *err, size_t errlen)
{
    if (!mi || !s || !layers || (n && !t)) { util_seterr(err, errlen, "shape: missing argument"); return -EINVAL; }
    uint32_t L = mi->n_layers;
    if (L == 0 || L > PLAN_MAX_LAYERS) {
        util_seterr(err, errlen, "shape: n_layers %u out of range [1, %u]", L, PLAN_MAX_LAYERS);
        return -EINVAL;
    }
    if (mi->n_expert_used > mi->n_expert) {
        util_seterr(err, errlen, "shape: expert_used_count %u exceeds expert_count %u", mi->n_expert_used,
                   mi->n_expert);
        return -EINVAL;
    }
    memset(layers, 0, L * sizeof *layers);
    double used_share = mi->n_expert ? (double)mi->n_expert_used / mi->n_expert : 1.0;
    uint32_t kvb = mi->kv_elem_bytes ? mi->kv_elem_bytes : 2;  /* the runtime caches K/V in f16 */
    uint64_t embed = 0, embed_row = 0, head = 0, head_norm = 0;
    double embed_elems = 0, head_elems = 0;
    bool have_output = false;
    uint64_t n_embd = mi->n_embd;
    /* per-layer recurrent-state pieces: conv rows, value heads, head size */
    uint64_t *conv = calloc(L, sizeof *conv), *hv = calloc(L, sizeof *hv), *dk = calloc(L, sizeof *dk);
    if (!conv || !hv || !dk) { free(conv); free(hv); free(dk); return -ENOMEM; }
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        const struct plan_tensor *x = &t[i];
        if (!x->name || x->n_dims > 4) {
            util_seterr(err, errlen, "shape: tensor %zu has no name or %u dims", i, x->n_dims);
            rc = -EINVAL;
            goto out;
        }
        if (x->bytes > (1ull << 50)) {
            util_seterr(err, errlen, "shape: tensor %s: %llu bytes is out of range", x->name,
                       (unsigned long long)x->bytes);
            rc = -EINVAL;
            goto out;
        }
        const char *rest;
        long li = blk_layer(x->name, &rest);
        if (li < 0) {
            if (!strcmp(x->name, "token_embd.weight")) {
                embed = x->bytes;
                embed_elems = elems(x);
                if (!n_embd) n_embd = x->ne[0];
                embed_row = x->n_dims >= 2 && x->ne[1] ? x->bytes / x->ne[1] : x->bytes;
            } else if (!strcmp(x->name, "output.weight")) {
                head += x->bytes;
                head_elems = elems(x);
                have_output = true;
            } else if (has_prefix(x->name, "output")) {
                head_norm += x->bytes;
            }
            /* other non-block tensors (rope_freqs, ...) are small; headroom covers them */
            continue;
        }
        if ((uint64_t)li >= L) {
            util_seterr(err, errlen, "shape: tensor %s: layer %ld is past n_layers %u", x->name, li, L);
            rc = -EINVAL;
            goto out;
        }
        struct plan_layer *l = &layers[li];
        bool expert = strstr(rest, "_exps") != NULL;
        l->weight_bytes += x->bytes;
        double act = (double)x->bytes, mac = x->n_dims >= 2 ? elems(x) : 0;
        if (expert) {
            l->expert_bytes += x->bytes;
            act *= used_share;
            mac *= used_share;
        }
        l->active_bytes += (uint64_t)(act + 0.5);
        l->macs += mac;
        if (has_prefix(rest, "attn_k.") || has_prefix(rest, "attn_v."))
            l->kv_bytes_per_token += (x->n_dims >= 2 ? x->ne[1] : x->ne[0]) * kvb;
        if (has_prefix(rest, "ssm_conv1d.") && x->n_dims >= 2 && x->ne[0] >= 1)
            conv[li] = (x->ne[0] - 1) * x->ne[1];
        if (has_prefix(rest, "ssm_a") && (rest[5] == 0 || rest[5] == '.'))
            hv[li] = x->ne[0];
        if (has_prefix(rest, "ssm_dt.") && !hv[li])
            hv[li] = x->ne[0];
        if (has_prefix(rest, "ssm_norm."))
            dk[li] = x->ne[0];
    }
    for (uint32_t i = 0; i < L; i++) {
        /* conv state (f32 rows) + the recurrent matrix S: value heads x d x d, f32 */
        layers[i].state_bytes = conv[i] * 4 + hv[i] * dk[i] * dk[i] * 4;
    }
    if (!have_output) {       /* tied: the last rank reads token_embd as its head */
        head += embed;
        head_elems = embed_elems;
    }
    memset(s, 0, sizeof *s);
    s->n_layers = L;
    s->n_embd = (uint32_t)n_embd;
    s->wire_bytes_per_token = n_embd * (mi->wire_elem_bytes ? mi->wire_elem_bytes : 4);
    s->layers = layers;
    s->embed_bytes = embed;
    s->embed_active_bytes = embed_row;
    s->head_bytes = head + head_norm;
    s->head_active_bytes = (have_output ? head : embed) + head_norm;
    s->head_macs = head_elems;
out:
    free(conv); free(hv); free(dk);
    return rc;
}

int plan_shape_of_model(const struct plan_model *m, struct plan_shape *shape, struct plan_layer *layers,
                        char *err, size_t errlen)
{
    if (!m) { util_seterr(err, errlen, "shape: missing argument"); return -EINVAL; }
    if (m->n_blocks && m->nextn_layers >= m->n_blocks) {
        util_seterr(err, errlen, "shape: nextn_layers %u must be below the block count %u", m->nextn_layers,
                    m->n_blocks);
        return -EINVAL;
    }
    struct plan_model_info mi = {.n_layers = m->n_blocks, .n_embd = m->n_embd, .n_expert = m->n_expert,
                                 .n_expert_used = m->n_expert_used,
                                 .kv_elem_bytes = m->kv_elem_bytes, .wire_elem_bytes = m->wire_elem_bytes};
    int rc = plan_shape_from_tensors(m->t, m->n_tensors, &mi, shape, layers, err, errlen);
    if (rc)
        return rc;
    bool tied = true;
    for (size_t i = 0; i < m->n_tensors && tied; i++)
        tied = strcmp(m->t[i].name, "output.weight") != 0;
    shape->n_layers = m->n_blocks - m->nextn_layers;   /* below n_blocks: checked above */
    plan_shape_set_mtp(shape, m->nextn_layers, tied);
    shape->name = m->name;
    shape->arch = m->arch;
    return 0;
}

void plan_shape_set_mtp(struct plan_shape *s, uint32_t n, bool tied)
{
    memset(&s->mtp, 0, sizeof s->mtp);
    s->mtp_blocks = n;
    for (uint32_t i = s->n_layers; i < s->n_layers + n; i++) {
        const struct plan_layer *l = &s->layers[i];
        s->mtp.weight_bytes += l->weight_bytes;
        s->mtp.expert_bytes += l->expert_bytes;
        s->mtp.active_bytes += l->active_bytes;
        s->mtp.macs += l->macs;
        s->mtp.kv_bytes_per_token += l->kv_bytes_per_token;
        s->mtp.state_bytes += l->state_bytes;
    }
    s->mtp_embed_bytes = n && !tied ? s->embed_bytes : 0;
}

/* ------------------------------------------------------------------------------------------
 * Tensor lists from hyperparameters: the architecture table (model/arch.c) says which tensors
 * a file of the family holds and their shapes; here they get sizes. */

struct gen {
    struct plan_tensor *t;
    size_t cap, n;
    char *names;
    double bpw;
};

/* Add a tensor: quantised matrices at bpw bits per weight (whole bytes), f32 otherwise. */
static int add(void *ud, const char *name, const struct model_tensor_desc *d, const uint64_t ne[4])
{
    struct gen *g = ud;
    if (g->n >= g->cap)
        return -ENOSPC;
    struct plan_tensor *x = &g->t[g->n];
    char *nb = g->names + g->n * NAME_LEN;
    snprintf(nb, NAME_LEN, "%s", name);
    x->name = nb;
    x->n_dims = d->n_dims;
    memcpy(x->ne, ne, sizeof x->ne);
    double e = (double)x->ne[0] * (double)x->ne[1] * (double)x->ne[2];
    x->bytes = (d->flags & MODEL_TF_F32) ? (uint64_t)(e * 4) : (uint64_t)(e * g->bpw / 8 + 0.999);
    g->n++;
    return 0;
}

size_t plan_hparams_tensor_count(const struct plan_hparams *h)
{
    if (!h || h->n_layers == 0 || h->n_layers > PLAN_MAX_LAYERS || h->nextn_layers > 16)
        return 0;
    return (size_t)(h->n_layers + h->nextn_layers) * MAX_TENSORS_PER_LAYER + 4;
}

int plan_tensors_from_hparams(const struct plan_hparams *h, struct plan_tensor *t, size_t cap,
                              char *names_buf, size_t *n_out, char *err, size_t errlen)
{
    *n_out = 0;
    size_t need = plan_hparams_tensor_count(h);
    if (!need) { util_seterr(err, errlen, "hparams: n_layers %u (+ %u MTP) out of range", h ? h->n_layers : 0, h ? h->nextn_layers : 0); return -EINVAL; }
    if (cap < need) { util_seterr(err, errlen, "hparams: room for %zu tensors, need %zu", cap, need); return -EINVAL; }
    const struct model_arch *a = model_arch_find(h->arch);
    if (!a) {
        char names[128];
        model_arch_names(names, sizeof names);
        util_seterr(err, errlen, "hparams: arch '%s' is not one of %s", h->arch, names);
        return -EINVAL;
    }
    const uint32_t cap32 = 1u << 20;
    if (!h->n_embd || !h->n_vocab || !h->n_head || !h->n_head_kv || !h->head_dim ||
        h->n_embd > cap32 || h->n_vocab > (1u << 24) || h->n_head > 4096 || h->n_head_kv > h->n_head ||
        h->head_dim > 4096) {
        util_seterr(err, errlen, "hparams: n_embd %u, n_vocab %u, n_head %u, n_head_kv %u, head_dim %u: each must be "
                   "non-zero and in range (n_head_kv <= n_head)", h->n_embd, h->n_vocab, h->n_head, h->n_head_kv, h->head_dim);
        return -EINVAL;
    }
    if (a->moe && (!h->n_expert || !h->n_expert_used || h->n_expert_used > h->n_expert || !h->n_ff_exp ||
                   h->n_expert > 4096 || h->n_ff_exp > cap32)) {
        util_seterr(err, errlen, "hparams: expert_count %u, expert_used_count %u, expert_feed_forward_length %u: "
                   "need 0 < used <= count <= 4096 and a non-zero length", h->n_expert, h->n_expert_used, h->n_ff_exp);
        return -EINVAL;
    }
    if (a->shexp && (!h->n_ff_shexp || h->n_ff_shexp > cap32)) {
        util_seterr(err, errlen, "hparams: expert_shared_feed_forward_length %u must be in (0, %u]",
                   h->n_ff_shexp, cap32);
        return -EINVAL;
    }
    if (!a->moe && (!h->n_ff || h->n_ff > cap32)) {
        util_seterr(err, errlen, "hparams: feed_forward_length %u must be in (0, %u]", h->n_ff, cap32);
        return -EINVAL;
    }
    if (a->hybrid && (!h->ssm_conv_kernel || !h->ssm_group_count || !h->ssm_time_step_rank || !h->ssm_state_size ||
                      h->ssm_conv_kernel > 64 || h->ssm_group_count > 4096 || h->ssm_time_step_rank > 4096 ||
                      h->ssm_state_size > 4096)) {
        util_seterr(err, errlen, "hparams: ssm conv_kernel %u, group_count %u, time_step_rank %u, state_size %u: each "
                   "must be non-zero and in range", h->ssm_conv_kernel, h->ssm_group_count, h->ssm_time_step_rank,
                   h->ssm_state_size);
        return -EINVAL;
    }
    if (!(h->bits_per_weight > 0 && h->bits_per_weight <= 32)) {
        util_seterr(err, errlen, "hparams: bits_per_weight %g out of range (0, 32]", h->bits_per_weight);
        return -EINVAL;
    }
    /* The descriptor's hyperparameters in the runtime's terms (the value heads of the
     * Gated DeltaNet are its time-step rank: d_inner = rank x state size). */
    struct model_hparams hp = {
        .n_layer = h->n_layers, .n_nextn = h->nextn_layers, .n_block = h->n_layers + h->nextn_layers,
        .n_embd = h->n_embd, .n_vocab = h->n_vocab, .n_ff = h->n_ff,
        .n_head = h->n_head, .n_head_kv = h->n_head_kv, .head_dim = h->head_dim, .n_rot = h->head_dim,
        .n_expert = h->n_expert, .n_expert_used = h->n_expert_used, .n_ff_exp = h->n_ff_exp,
        .n_ff_shexp = h->n_ff_shexp,
        .full_attn_interval = h->full_attention_interval ? h->full_attention_interval : MODEL_FULL_ATTN_INTERVAL_DEFAULT,
        .ssm_conv_kernel = h->ssm_conv_kernel, .ssm_d_state = h->ssm_state_size,
        .ssm_n_group = h->ssm_group_count, .ssm_dt_rank = h->ssm_time_step_rank,
        .ssm_d_inner = h->ssm_time_step_rank * h->ssm_state_size,
    };
    snprintf(hp.arch, sizeof hp.arch, "%s", a->name);
    struct gen g = {.t = t, .cap = cap, .names = names_buf, .bpw = h->bits_per_weight};
    int rc = model_arch_tensors(a, &hp, h->tied_embeddings, add, &g);
    if (rc < 0) { util_seterr(err, errlen, "hparams: tensor list overflow"); return -EINVAL; }
    *n_out = g.n;
    return 0;
}

/* kvctl/shape.c — the model shapes `kvctl plan` and `kvctl profile` read: a GGUF or mini-GGUF
 * header, a catalog, or a JSON shape descriptor (docs/planner.md), each into the planner's
 * struct plan_model and through plan_shape_of_model (planner/plan.h), which holds the rule for
 * multi-token-prediction blocks. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "gguf/gguf.h"
#include "kvctl/internal.h"
#include "model/model.h"
#include "planner/plan.h"
#include "util/err.h"
#include "util/util.h"

#define DESC_MAX_BYTES (16u << 20)

int kvctl__gguf_plan_model(const struct gguf_file *g, const char *arch, struct plan_model *pm,
                           struct plan_tensor **t)
{
    char key[128];
    uint64_t n = gguf_tensor_count(g);
    *pm = (struct plan_model){.arch = arch};
    gguf_block_count(g, &pm->n_blocks);
    /* as model_open reads it: a count that leaves no main block is the planner's error */
    snprintf(key, sizeof key, "%s.nextn_predict_layers", arch);
    gguf_get_u32(g, key, &pm->nextn_layers);
    snprintf(key, sizeof key, "%s.embedding_length", arch);
    gguf_get_u32(g, key, &pm->n_embd);
    snprintf(key, sizeof key, "%s.expert_count", arch);
    gguf_get_u32(g, key, &pm->n_expert);
    snprintf(key, sizeof key, "%s.expert_used_count", arch);
    gguf_get_u32(g, key, &pm->n_expert_used);
    *t = calloc(n ? n : 1, sizeof **t);
    if (!*t)
        return -ENOMEM;
    for (uint64_t i = 0; i < n; i++) {
        const struct gguf_tensor *gt = gguf_tensor_at(g, i);
        struct plan_tensor *x = &(*t)[i];
        x->name = gt->name;
        x->n_dims = gt->n_dims;
        for (int d = 0; d < 4; d++) x->ne[d] = d < GGUF_MAX_DIMS ? gt->ne[d] : 1;
        x->bytes = gt->size;
    }
    pm->t = *t;
    pm->n_tensors = (size_t)n;
    return 0;
}

void kvctl__model_free(struct kvctl_model *m)
{
    gguf_file_free(m->gf);
    gguf_catalog_free(m->cat);
    free(m->t);
    free(m->names);
    free(m->layers);
}

/* The planner's shape of the model m's source describes (plan_shape_of_model: the trailing MTP
 * blocks go to the last rank, beside the head). */
static int finish_shape(struct kvctl_model *m, char *err, size_t errlen)
{
    struct plan_model *pm = &m->pm;
    pm->name = m->name[0] ? m->name : NULL;
    pm->arch = m->arch;
    pm->t = m->t;
    pm->n_tensors = m->nt;
    pm->kv_elem_bytes = m->kv_bytes;
    pm->wire_elem_bytes = m->wire_bytes;
    m->layers = calloc(pm->n_blocks ? pm->n_blocks : 1, sizeof *m->layers);
    if (!m->layers) { snprintf(err, errlen, "out of memory"); return -ENOMEM; }
    return plan_shape_of_model(pm, &m->shape, m->layers, err, errlen);
}

/* Experts from the 3-D *_exps tensors when the metadata does not say. */
static uint32_t experts_in(const struct plan_tensor *t, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strstr(t[i].name, "_exps") && t[i].n_dims == 3)
            return (uint32_t)t[i].ne[2];
    return 0;
}

/* A stage mini-GGUF holds only its window's blocks (the last one also the head, the MTP
 * blocks and, with them, token_embd): take the blocks outside it from blocks of the same kind
 * inside it (full attention or not, for hybrids: every interval-th block; an MTP block is a
 * full-attention one), and the embedding / head it lacks from the vocabulary and the window's
 * bytes per weight. */
static void extrapolate_window(struct kvctl_model *m, uint32_t wf, uint32_t wl)
{
    struct plan_shape *s = &m->shape;
    uint32_t nl = m->pm.n_blocks, fai = 0, vocab = 0;
    char key[128];
    snprintf(key, sizeof key, "%s.full_attention_interval", m->arch);
    if (gguf_get_u32(m->gf, key, &fai) != 0 && (!strcmp(m->arch, "qwen35") || !strcmp(m->arch, "qwen35moe")))
        fai = MODEL_FULL_ATTN_INTERVAL_DEFAULT;
    snprintf(key, sizeof key, "%s.vocab_size", m->arch);
    if (gguf_get_u32(m->gf, key, &vocab) != 0) {
        const struct gguf_value *arr;
        if (gguf_get_arr(m->gf, "tokenizer.ggml.tokens", &arr) == 0 && arr->v.arr.n < (1u << 24))
            vocab = (uint32_t)arr->v.arr.n;
    }
    uint32_t main_last = nl - m->pm.nextn_layers; /* first MTP block */
    bool last = wl >= main_last;
    for (uint32_t i = 0; i < nl; i++) {
        bool mtp = i >= main_last;
        if ((i >= wf && i < wl) || (mtp && last)) continue;
        bool kind = fai && !mtp ? (i + 1) % fai == 0 : true;
        int src = -1;
        for (uint32_t j = wf; j < wl && j < main_last; j++) {
            bool kj = fai ? (j + 1) % fai == 0 : true;
            if (kj == kind) { src = (int)j; break; }
        }
        if (src < 0) src = (int)(wf < main_last ? wf : wl - 1);
        m->layers[i] = m->layers[src];   /* s->layers points at m->layers */
    }
    /* bytes per weight of the window's matrices */
    double bytes = 0, el = 0;
    for (size_t i = 0; i < m->nt; i++)
        if (m->t[i].n_dims >= 2) {
            bytes += (double)m->t[i].bytes;
            el += (double)m->t[i].ne[0] * (double)m->t[i].ne[1] * (double)m->t[i].ne[2];
        }
    double bpe = el > 0 ? bytes / el : 2;
    double table = (double)vocab * s->n_embd * bpe;
    if (wf > 0 && !gguf_tensor_find(m->gf, "token_embd.weight")) {
        s->embed_bytes = (uint64_t)table;
        s->embed_active_bytes = vocab ? (uint64_t)(table / vocab) : 0;
    }
    if (!last) {
        s->head_bytes = (uint64_t)table + 4ull * s->n_embd;
        s->head_active_bytes = s->head_bytes;
        s->head_macs = (double)vocab * s->n_embd;
    }
    /* the MTP blocks and the drafter's token_embd from the blocks and embedding just filled in
     * (a window without the head cannot say whether the model ties it: taken as untied) */
    plan_shape_set_mtp(s, m->pm.nextn_layers, last && !gguf_tensor_find(m->gf, "output.weight"));
    fprintf(stderr, "kvctl: %s is the window [%u, %u) of a %u-layer model: the other blocks, the "
            "embedding and the head are extrapolated from it\n", gguf_file_path(m->gf), wf, wl, nl);
}

static int load_gguf(struct kvctl_model *m, const char *path, char *err, size_t errlen)
{
    snprintf(m->kind, sizeof m->kind, "gguf");
    int rc = gguf_file_open(&m->gf, path, err, errlen);
    if (rc) return rc;
    if (gguf_get_str(m->gf, "general.architecture", m->arch, sizeof m->arch) != 0) {
        snprintf(err, errlen, "%s: no general.architecture", path);
        return -EINVAL;
    }
    gguf_get_str(m->gf, "general.name", m->name, sizeof m->name);
    uint32_t nl = 0;
    if (gguf_block_count(m->gf, &nl) != 0 || nl == 0 || nl > PLAN_MAX_LAYERS) {
        snprintf(err, errlen, "%s: %s.block_count missing or out of range (%u)", path, m->arch, nl);
        return -EINVAL;
    }
    /* A stage mini-GGUF keeps the source's metadata and block numbering: plan the whole model. */
    if ((rc = kvctl__gguf_plan_model(m->gf, m->arch, &m->pm, &m->t)) < 0) return rc;
    m->nt = m->pm.n_tensors;
    if (m->pm.n_expert && !m->pm.n_expert_used) {
        snprintf(err, errlen, "%s: %s.expert_count %u but no expert_used_count", path, m->arch, m->pm.n_expert);
        return -EINVAL;
    }
    rc = finish_shape(m, err, errlen);
    if (rc) return rc;
    uint32_t wf, wl;
    if (gguf_window_get(m->gf, &wf, &wl) == 0 && wf < wl && wl <= nl && (wf > 0 || wl < nl))
        extrapolate_window(m, wf, wl);
    return 0;
}

int kvctl__model_load_catalog(struct kvctl_model *m, const char *path, uint32_t used, int nextn, char *err,
                              size_t errlen)
{
    snprintf(m->kind, sizeof m->kind, "catalog");
    int rc = gguf_catalog_load(&m->cat, path, m->catalog, err, errlen);
    if (rc) return rc;
    snprintf(m->arch, sizeof m->arch, "%s", m->cat->arch);
    m->pm.n_blocks = m->cat->n_layers;
    m->t = calloc(m->cat->n_tensors ? m->cat->n_tensors : 1, sizeof *m->t);
    if (!m->t) return -ENOMEM;
    for (uint64_t i = 0; i < m->cat->n_tensors; i++) {
        const struct gguf_catalog_tensor *g = &m->cat->tensors[i];
        struct plan_tensor *x = &m->t[m->nt++];
        x->name = g->name;
        x->n_dims = g->n_dims;
        for (int d = 0; d < 4; d++) x->ne[d] = d < GGUF_MAX_DIMS ? g->ne[d] : 1;
        x->bytes = g->size;
    }
    m->pm.n_expert = experts_in(m->t, m->nt);
    if (m->pm.n_expert && !used) {
        snprintf(err, errlen, "%s: the model has %u experts per layer; a catalog does not say how many a "
                 "token uses: pass --experts-used N (or plan from the GGUF header with --model)",
                 path, m->pm.n_expert);
        return -EINVAL;
    }
    m->pm.n_expert_used = used;
    /* the MTP blocks: --nextn's, else the ones the catalog's model leaves out of its main pass */
    m->pm.nextn_layers = nextn >= 0 ? (uint32_t)nextn : m->cat->n_layers - m->cat->n_main;
    return finish_shape(m, err, errlen);
}

/* JSON helpers for the descriptor and the device profiles (numbers: util_json_number_in). */
int kvctl__json_u32(const cJSON *o, const char *key, uint32_t hi, bool required, uint32_t *out,
                const char *ctx, char *err, size_t errlen)
{
    double d = 0;
    int rc = util_json_number_in(o, key, 0, hi, required, &d, ctx, err, errlen);
    if (rc < 0) return rc;
    if (rc == 0) {
        if (d != floor(d)) { snprintf(err, errlen, "%s: '%s' must be an integer", ctx, key); return -EINVAL; }
        *out = (uint32_t)d;
    }
    return 0;
}

int kvctl__json_u64(const cJSON *o, const char *key, bool required, uint64_t *out, const char *ctx,
                char *err, size_t errlen)
{
    double d = 0;
    int rc = util_json_number_in(o, key, 0, 4503599627370496.0 /* 2^52 */, required, &d, ctx, err,
                                 errlen);
    if (rc < 0) return rc;
    if (rc == 0) {
        if (d != floor(d)) { snprintf(err, errlen, "%s: '%s' must be an integer", ctx, key); return -EINVAL; }
        *out = (uint64_t)d;
    }
    return 0;
}

void kvctl__json_str(const cJSON *o, const char *key, char *buf, size_t n)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsString(v) && v->valuestring) snprintf(buf, n, "%s", v->valuestring);
}

/* The shape descriptor of docs/planner.md: {"kvasir_shape": 1, "name", "arch",
 * "hparams": {...}} or {"kvasir_shape": 1, ..., "n_embd", "layers": [...], "embed_bytes", ...}. */
static int load_descriptor(struct kvctl_model *m, const char *path, const char *text, size_t len,
                           char *err, size_t errlen)
{
    snprintf(m->kind, sizeof m->kind, "descriptor");
    cJSON *root = cJSON_ParseWithLength(text, len);
    int rc = -EINVAL;
    if (!cJSON_IsObject(root)) {
        snprintf(err, errlen, "%s: neither a GGUF file (no 'GGUF' magic) nor a JSON shape descriptor "
                 "(not a JSON object; docs/planner.md)", path);
        goto out;
    }
    char ctx[160];
    snprintf(ctx, sizeof ctx, "%s", path);
    uint32_t ver = 0;
    if ((rc = kvctl__json_u32(root, "kvasir_shape", 1, true, &ver, ctx, err, errlen)) < 0) goto out;
    if (ver != 1) { snprintf(err, errlen, "%s: kvasir_shape %u is not 1", path, ver); rc = -EINVAL; goto out; }
    kvctl__json_str(root, "name", m->name, sizeof m->name);
    kvctl__json_str(root, "arch", m->arch, sizeof m->arch);
    uint32_t kvb = 0;
    if ((rc = kvctl__json_u32(root, "kv_type_bytes", 8, false, &kvb, ctx, err, errlen)) < 0) goto out;
    if (kvb && !m->kv_bytes) m->kv_bytes = kvb;
    const cJSON *hp = cJSON_GetObjectItemCaseSensitive(root, "hparams");
    const cJSON *ly = cJSON_GetObjectItemCaseSensitive(root, "layers");
    if (cJSON_IsObject(hp)) {
        struct plan_hparams h;
        memset(&h, 0, sizeof h);
        snprintf(h.arch, sizeof h.arch, "%.31s", m->arch);
        snprintf(ctx, sizeof ctx, "%s: hparams", path);
        struct { const char *k; uint32_t *p; uint32_t hi; bool req; } f[] = {
            {"n_layers", &h.n_layers, PLAN_MAX_LAYERS, true}, {"nextn_layers", &h.nextn_layers, 16, false},
            {"n_embd", &h.n_embd, 1u << 20, true}, {"n_vocab", &h.n_vocab, 1u << 24, true},
            {"n_ff", &h.n_ff, 1u << 20, false}, {"n_head", &h.n_head, 4096, true},
            {"n_head_kv", &h.n_head_kv, 4096, true}, {"head_dim", &h.head_dim, 4096, true},
            {"n_expert", &h.n_expert, 4096, false}, {"n_expert_used", &h.n_expert_used, 4096, false},
            {"n_ff_exp", &h.n_ff_exp, 1u << 20, false}, {"n_ff_shexp", &h.n_ff_shexp, 1u << 20, false},
            {"full_attention_interval", &h.full_attention_interval, 1024, false},
            {"ssm_conv_kernel", &h.ssm_conv_kernel, 64, false}, {"ssm_group_count", &h.ssm_group_count, 4096, false},
            {"ssm_time_step_rank", &h.ssm_time_step_rank, 4096, false},
            {"ssm_state_size", &h.ssm_state_size, 4096, false},
        };
        for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
            if ((rc = kvctl__json_u32(hp, f[i].k, f[i].hi, f[i].req, f[i].p, ctx, err, errlen)) < 0) goto out;
        if ((rc = util_json_number_in(hp, "bits_per_weight", 0.5, 32, true, &h.bits_per_weight, ctx, err,
                                      errlen)) < 0) goto out;
        const cJSON *tied = cJSON_GetObjectItemCaseSensitive(hp, "tied_embeddings");
        h.tied_embeddings = cJSON_IsTrue(tied);
        size_t cap = plan_hparams_tensor_count(&h);
        if (!cap) { snprintf(err, errlen, "%s: n_layers %u / nextn_layers %u out of range", ctx, h.n_layers, h.nextn_layers); rc = -EINVAL; goto out; }
        m->t = calloc(cap, sizeof *m->t);
        m->names = calloc(cap, 64);
        if (!m->t || !m->names) { rc = -ENOMEM; goto out; }
        if ((rc = plan_tensors_from_hparams(&h, m->t, cap, m->names, &m->nt, err, errlen)) < 0) goto out;
        m->pm.n_blocks = h.n_layers + h.nextn_layers;
        m->pm.nextn_layers = h.nextn_layers;
        m->pm.n_embd = h.n_embd;
        m->pm.n_expert = h.n_expert;
        m->pm.n_expert_used = h.n_expert_used;
        rc = finish_shape(m, err, errlen);
    } else if (cJSON_IsArray(ly)) {
        /* explicit layers, each optionally repeated */
        uint32_t total = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, ly) {
            uint32_t rep = 1;
            snprintf(ctx, sizeof ctx, "%s: layers[]", path);
            if ((rc = kvctl__json_u32(e, "repeat", PLAN_MAX_LAYERS, false, &rep, ctx, err, errlen)) < 0) goto out;
            if (rep == 0 || total + rep > PLAN_MAX_LAYERS) {
                snprintf(err, errlen, "%s: layers: repeat %u gives more than %u layers (or is 0)", path, rep, PLAN_MAX_LAYERS);
                rc = -EINVAL;
                goto out;
            }
            total += rep;
        }
        if (!total) { snprintf(err, errlen, "%s: layers is empty", path); rc = -EINVAL; goto out; }
        m->layers = calloc(total, sizeof *m->layers);
        if (!m->layers) { rc = -ENOMEM; goto out; }
        uint32_t k = 0, idx = 0;
        cJSON_ArrayForEach(e, ly) {
            struct plan_layer l = {0};
            uint32_t rep = 1;
            snprintf(ctx, sizeof ctx, "%s: layers[%u]", path, idx++);
            kvctl__json_u32(e, "repeat", PLAN_MAX_LAYERS, false, &rep, ctx, err, errlen);
            if ((rc = kvctl__json_u64(e, "weight_bytes", true, &l.weight_bytes, ctx, err, errlen)) < 0 ||
                (rc = kvctl__json_u64(e, "expert_bytes", false, &l.expert_bytes, ctx, err, errlen)) < 0 ||
                (rc = kvctl__json_u64(e, "kv_bytes_per_token", false, &l.kv_bytes_per_token, ctx, err, errlen)) < 0 ||
                (rc = kvctl__json_u64(e, "state_bytes", false, &l.state_bytes, ctx, err, errlen)) < 0)
                goto out;
            l.active_bytes = l.weight_bytes;
            if ((rc = kvctl__json_u64(e, "active_bytes", false, &l.active_bytes, ctx, err, errlen)) < 0) goto out;
            l.macs = (double)l.active_bytes;
            if ((rc = util_json_number_in(e, "macs", 0, 1e18, false, &l.macs, ctx, err, errlen)) < 0) goto out;
            for (uint32_t r = 0; r < rep; r++) m->layers[k++] = l;
        }
        snprintf(ctx, sizeof ctx, "%s", path);
        uint32_t n_embd = 0;
        if ((rc = kvctl__json_u32(root, "n_embd", 1u << 20, true, &n_embd, ctx, err, errlen)) < 0) goto out;
        struct plan_shape *s = &m->shape;
        s->n_layers = total;
        s->n_embd = n_embd;
        s->layers = m->layers;
        s->wire_bytes_per_token = (uint64_t)n_embd * (m->wire_bytes ? m->wire_bytes : 4);
        if ((rc = kvctl__json_u64(root, "embed_bytes", false, &s->embed_bytes, ctx, err, errlen)) < 0 ||
            (rc = kvctl__json_u64(root, "head_bytes", false, &s->head_bytes, ctx, err, errlen)) < 0)
            goto out;
        s->embed_active_bytes = (uint64_t)n_embd * 2;
        s->head_active_bytes = s->head_bytes;
        s->head_macs = (double)s->head_bytes;
        if ((rc = kvctl__json_u64(root, "embed_active_bytes", false, &s->embed_active_bytes, ctx, err, errlen)) < 0 ||
            (rc = kvctl__json_u64(root, "head_active_bytes", false, &s->head_active_bytes, ctx, err, errlen)) < 0 ||
            (rc = util_json_number_in(root, "head_macs", 0, 1e18, false, &s->head_macs, ctx, err,
                                      errlen)) < 0)
            goto out;
        s->name = m->name[0] ? m->name : NULL;
        s->arch = m->arch;
        rc = 0;
    } else {
        snprintf(err, errlen, "%s: a shape descriptor needs \"hparams\" (an object) or \"layers\" (an array)", path);
        rc = -EINVAL;
    }
out:
    cJSON_Delete(root);
    return rc;
}

int kvctl__model_load(struct kvctl_model *m, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) { snprintf(err, errlen, "%s: %s", path, strerror(errno)); return -errno; }
    unsigned char magic[4] = {0};
    size_t n = fread(magic, 1, 4, f);
    fclose(f);
    if (n == 4 && !memcmp(magic, "GGUF", 4))
        return load_gguf(m, path, err, errlen);
    size_t len;
    char *text;
    if (util_file_read(path, DESC_MAX_BYTES, &text, &len, err, errlen) < 0) return -EINVAL;
    int rc = load_descriptor(m, path, text, len, err, errlen);
    free(text);
    return rc;
}

/* kvctl/plan.c — `kvctl plan` and `kvctl profile`: the I/O around the pure planner.
 *
 * plan: read a model shape (a GGUF or mini-GGUF header, a catalog, or a JSON shape descriptor),
 * device profiles (docs/design.md, "The rank manifest"), plan, print a table and write the rank
 * manifest. profile: measure this machine for a model and print its device profile. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <openssl/rand.h>

#include "gguf/gguf.h"
#include "kernels/kern.h"
#include "kvctl/kvctl.h"
#include "net/net.h"
#include "model/model.h"
#include "planner/plan.h"
#include "ringlib/ring.h"
#include "util/err.h"
#include "util/util.h"

#define DESC_MAX_BYTES (16u << 20)
#define DEVICES_MAX_BYTES (64u << 20)
#define MAX_DEVICE_FILES 64
#define RING_MAX_RANKS 64 /* what a stage accepts (RING_MAX_RANKS) */

/* ------------------------------------------------------------------ helpers */

static int parse_num(const char *cmd, const char *opt, const char *s, double lo, double hi, double *out)
{
    char err[KV_ERR_MAX];
    if (util_parse_double(s, lo, hi, 0, out, err, sizeof err) < 0) {
        fprintf(stderr, "kvctl %s: %s %s\n", cmd, opt, err);
        return -1;
    }
    return 0;
}

static void hex_random(char *out, size_t nbytes)
{
    unsigned char b[32];
    if (nbytes > sizeof b) nbytes = sizeof b;
    if (RAND_bytes(b, (int)nbytes) != 1) {
        /* OpenSSL's generator failing is not recoverable here; fall back to urandom */
        FILE *f = fopen("/dev/urandom", "rb");
        if (!f || fread(b, 1, nbytes, f) != nbytes) memset(b, 0, nbytes);
        if (f) fclose(f);
    }
    for (size_t i = 0; i < nbytes; i++) sprintf(out + 2 * i, "%02x", b[i]);
    out[2 * nbytes] = 0;
}

/* ------------------------------------------------------------------ model shapes */

struct model_src {
    struct gguf_file *gf;          /* --model GGUF: names borrowed from it */
    struct gguf_catalog *cat;      /* --catalog */
    struct plan_tensor *t;
    size_t nt;
    char *names;                   /* descriptor hparams: synthesised names */
    struct plan_layer *layers;
    struct plan_shape shape;
    struct plan_model_info mi;
    char name[128], arch[64], catalog[65];
    uint32_t n_expert, n_expert_used;
    uint32_t kv_bytes, wire_bytes;
    char kind[16];                 /* "gguf", "catalog", "descriptor" */
    uint32_t mtp;                  /* trailing MTP blocks left out of the plan */
};

/* The runtime runs block_count - nextn_predict_layers blocks (model_hparams.n_layer) and
 * never loads the trailing multi-token-prediction blocks: plan (and write the manifest for)
 * the main blocks only. */
static void drop_mtp(struct model_src *m)
{
    uint32_t k = m->mi.nextn_layers;
    if (k && k < m->shape.n_layers) {
        m->shape.n_layers -= k;
        m->mtp = k;
    }
}

static void model_src_free(struct model_src *m)
{
    gguf_file_free(m->gf);
    gguf_catalog_free(m->cat);
    free(m->t);
    free(m->names);
    free(m->layers);
}

static int finish_shape(struct model_src *m, char *err, size_t errlen)
{
    m->mi.kv_elem_bytes = m->kv_bytes;
    m->mi.wire_elem_bytes = m->wire_bytes;
    m->layers = calloc(m->mi.n_layers ? m->mi.n_layers : 1, sizeof *m->layers);
    if (!m->layers) { snprintf(err, errlen, "out of memory"); return -ENOMEM; }
    int rc = plan_shape_from_tensors(m->t, m->nt, &m->mi, &m->shape, m->layers, err, errlen);
    if (rc) return rc;
    m->shape.name = m->name[0] ? m->name : NULL;
    m->shape.arch = m->arch;
    return 0;
}

/* Experts from the 3-D *_exps tensors when the metadata does not say. */
static uint32_t experts_in(const struct plan_tensor *t, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strstr(t[i].name, "_exps") && t[i].n_dims == 3)
            return (uint32_t)t[i].ne[2];
    return 0;
}

/* A stage mini-GGUF holds only its window's blocks: take the blocks outside it from blocks
 * of the same kind inside it (full attention or not, for hybrids: every interval-th block),
 * and the embedding / head from the vocabulary and the window's bytes per weight. */
static void extrapolate_window(struct model_src *m, uint32_t wf, uint32_t wl)
{
    struct plan_shape *s = &m->shape;
    uint32_t nl = s->n_layers, fai = 0, vocab = 0;
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
    uint32_t main_last = nl - m->mi.nextn_layers; /* first MTP block */
    for (uint32_t i = 0; i < nl; i++) {
        if (i >= wf && i < wl) continue;
        bool mtp = i >= main_last;
        bool kind = fai && !mtp ? (i + 1) % fai == 0 : true;
        int src = -1;
        for (uint32_t j = wf; j < wl && j < main_last; j++) {
            bool kj = fai ? (j + 1) % fai == 0 : true;
            if (kj == kind) { src = (int)j; break; }
        }
        if (src < 0) src = (int)(wf < main_last ? wf : wl - 1);
        m->layers[i] = m->layers[src];   /* s->layers points at m->layers */
        if (mtp) {
            m->layers[i].active_bytes = 0;
            m->layers[i].macs = 0;
            m->layers[i].kv_bytes_per_token = 0;
            m->layers[i].state_bytes = 0;
        }
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
    if (wf > 0) {
        s->embed_bytes = (uint64_t)table;
        s->embed_active_bytes = vocab ? (uint64_t)(table / vocab) : 0;
    }
    if (wl < nl) {
        s->head_bytes = (uint64_t)table + 4ull * s->n_embd;
        s->head_active_bytes = s->head_bytes;
        s->head_macs = (double)vocab * s->n_embd;
    }
    fprintf(stderr, "kvctl: %s is the window [%u, %u) of a %u-layer model: the other blocks, the "
            "embedding and the head are extrapolated from it\n", gguf_file_path(m->gf), wf, wl, nl);
}

static int load_gguf(struct model_src *m, const char *path, char *err, size_t errlen)
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
    m->mi.n_layers = nl;
    char key[128];
    uint32_t v;
    snprintf(key, sizeof key, "%s.embedding_length", m->arch);
    if (gguf_get_u32(m->gf, key, &v) == 0) m->mi.n_embd = v;
    snprintf(key, sizeof key, "%s.expert_count", m->arch);
    if (gguf_get_u32(m->gf, key, &v) == 0) m->mi.n_expert = v;
    snprintf(key, sizeof key, "%s.expert_used_count", m->arch);
    if (gguf_get_u32(m->gf, key, &v) == 0) m->mi.n_expert_used = v;
    snprintf(key, sizeof key, "%s.nextn_predict_layers", m->arch);
    if (gguf_get_u32(m->gf, key, &v) == 0) m->mi.nextn_layers = v;
    uint64_t n = gguf_tensor_count(m->gf);
    m->t = calloc(n ? n : 1, sizeof *m->t);
    if (!m->t) return -ENOMEM;
    for (uint64_t i = 0; i < n; i++) {
        const struct gguf_tensor *g = gguf_tensor_at(m->gf, i);
        struct plan_tensor *x = &m->t[m->nt++];
        x->name = g->name;
        x->n_dims = g->n_dims;
        for (int d = 0; d < 4; d++) x->ne[d] = d < GGUF_MAX_DIMS ? g->ne[d] : 1;
        x->bytes = g->size;
    }
    if (m->mi.n_expert && !m->mi.n_expert_used) {
        snprintf(err, errlen, "%s: %s.expert_count %u but no expert_used_count", path, m->arch, m->mi.n_expert);
        return -EINVAL;
    }
    rc = finish_shape(m, err, errlen);
    if (rc) return rc;
    uint32_t wf, wl;
    if (gguf_window_get(m->gf, &wf, &wl) == 0 && wf < wl && wl <= nl && (wf > 0 || wl < nl))
        extrapolate_window(m, wf, wl);
    return 0;
}

static int load_catalog(struct model_src *m, const char *path, uint32_t used, int nextn, char *err, size_t errlen)
{
    snprintf(m->kind, sizeof m->kind, "catalog");
    int rc = gguf_catalog_load(&m->cat, path, m->catalog, err, errlen);
    if (rc) return rc;
    snprintf(m->arch, sizeof m->arch, "%s", m->cat->arch);
    m->mi.n_layers = m->cat->n_layers;
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
    m->mi.n_expert = experts_in(m->t, m->nt);
    if (m->mi.n_expert && !used) {
        snprintf(err, errlen, "%s: the model has %u experts per layer; a catalog does not say how many a "
                 "token uses: pass --experts-used N (or plan from the GGUF header with --model)",
                 path, m->mi.n_expert);
        return -EINVAL;
    }
    m->mi.n_expert_used = used;
    if (nextn < 0 && (!strcmp(m->arch, "qwen35moe") || !strcmp(m->arch, "qwen35"))) {
        /* MTP blocks carry nextn.* tensors */
        uint32_t k = 0;
        for (uint32_t l = 0; l < m->mi.n_layers; l++) {
            char nm[64];
            snprintf(nm, sizeof nm, "blk.%u.nextn.eh_proj.weight", l);
            if (gguf_catalog_find(m->cat, nm)) k++;
        }
        nextn = (int)k;
    }
    m->mi.nextn_layers = nextn > 0 ? (uint32_t)nextn : 0;
    return finish_shape(m, err, errlen);
}

/* JSON helpers for the descriptor and the device profiles (numbers: util_json_number_in). */
static int ju32(const cJSON *o, const char *key, uint32_t hi, bool required, uint32_t *out,
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

static int ju64(const cJSON *o, const char *key, bool required, uint64_t *out, const char *ctx,
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

static void jstr(const cJSON *o, const char *key, char *buf, size_t n)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsString(v) && v->valuestring) snprintf(buf, n, "%s", v->valuestring);
}

/* The shape descriptor of docs/planner.md: {"kvasir_shape": 1, "name", "arch",
 * "hparams": {...}} or {"kvasir_shape": 1, ..., "n_embd", "layers": [...], "embed_bytes", ...}. */
static int load_descriptor(struct model_src *m, const char *path, const char *text, size_t len,
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
    if ((rc = ju32(root, "kvasir_shape", 1, true, &ver, ctx, err, errlen)) < 0) goto out;
    if (ver != 1) { snprintf(err, errlen, "%s: kvasir_shape %u is not 1", path, ver); rc = -EINVAL; goto out; }
    jstr(root, "name", m->name, sizeof m->name);
    jstr(root, "arch", m->arch, sizeof m->arch);
    uint32_t kvb = 0;
    if ((rc = ju32(root, "kv_type_bytes", 8, false, &kvb, ctx, err, errlen)) < 0) goto out;
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
            if ((rc = ju32(hp, f[i].k, f[i].hi, f[i].req, f[i].p, ctx, err, errlen)) < 0) goto out;
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
        m->mi.n_layers = h.n_layers + h.nextn_layers;
        m->mi.nextn_layers = h.nextn_layers;
        m->mi.n_embd = h.n_embd;
        m->mi.n_expert = h.n_expert;
        m->mi.n_expert_used = h.n_expert_used;
        rc = finish_shape(m, err, errlen);
    } else if (cJSON_IsArray(ly)) {
        /* explicit layers, each optionally repeated */
        uint32_t total = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, ly) {
            uint32_t rep = 1;
            snprintf(ctx, sizeof ctx, "%s: layers[]", path);
            if ((rc = ju32(e, "repeat", PLAN_MAX_LAYERS, false, &rep, ctx, err, errlen)) < 0) goto out;
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
            ju32(e, "repeat", PLAN_MAX_LAYERS, false, &rep, ctx, err, errlen);
            if ((rc = ju64(e, "weight_bytes", true, &l.weight_bytes, ctx, err, errlen)) < 0 ||
                (rc = ju64(e, "expert_bytes", false, &l.expert_bytes, ctx, err, errlen)) < 0 ||
                (rc = ju64(e, "kv_bytes_per_token", false, &l.kv_bytes_per_token, ctx, err, errlen)) < 0 ||
                (rc = ju64(e, "state_bytes", false, &l.state_bytes, ctx, err, errlen)) < 0)
                goto out;
            l.active_bytes = l.weight_bytes;
            if ((rc = ju64(e, "active_bytes", false, &l.active_bytes, ctx, err, errlen)) < 0) goto out;
            l.macs = (double)l.active_bytes;
            if ((rc = util_json_number_in(e, "macs", 0, 1e18, false, &l.macs, ctx, err, errlen)) < 0) goto out;
            for (uint32_t r = 0; r < rep; r++) m->layers[k++] = l;
        }
        snprintf(ctx, sizeof ctx, "%s", path);
        uint32_t n_embd = 0;
        if ((rc = ju32(root, "n_embd", 1u << 20, true, &n_embd, ctx, err, errlen)) < 0) goto out;
        struct plan_shape *s = &m->shape;
        s->n_layers = total;
        s->n_embd = n_embd;
        s->layers = m->layers;
        s->wire_bytes_per_token = (uint64_t)n_embd * (m->wire_bytes ? m->wire_bytes : 4);
        if ((rc = ju64(root, "embed_bytes", false, &s->embed_bytes, ctx, err, errlen)) < 0 ||
            (rc = ju64(root, "head_bytes", false, &s->head_bytes, ctx, err, errlen)) < 0)
            goto out;
        s->embed_active_bytes = (uint64_t)n_embd * 2;
        s->head_active_bytes = s->head_bytes;
        s->head_macs = (double)s->head_bytes;
        if ((rc = ju64(root, "embed_active_bytes", false, &s->embed_active_bytes, ctx, err, errlen)) < 0 ||
            (rc = ju64(root, "head_active_bytes", false, &s->head_active_bytes, ctx, err, errlen)) < 0 ||
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

/* --model FILE: a GGUF (magic) or a JSON shape descriptor. */
static int load_model(struct model_src *m, const char *path, char *err, size_t errlen)
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

/* ------------------------------------------------------------------ devices */

/* A profile's "backends": the kernel devices one machine offers (its CPU, an OpenCL GPU),
 * each with its own memory and speed; the planner picks one per machine (devset_choose). */
#define DEV_BACKENDS_MAX 8
struct devopt {
    size_t dev;                   /* the device (machine) it belongs to */
    struct plan_device d;         /* its figures; link fields are the machine's */
    char backend[32];
};

struct devset {
    struct plan_device *d;
    size_t n, cap;
    char **ids, **backends, **endpoints, **nodes; /* owned strings, per device */
    struct devopt *opt;
    size_t n_opt;
};

static void devset_free(struct devset *s)
{
    for (size_t i = 0; i < s->n; i++) {
        free(s->ids[i]); free(s->backends[i]); free(s->endpoints[i]); free(s->nodes[i]);
    }
    free(s->d); free(s->ids); free(s->backends); free(s->endpoints); free(s->nodes);
    free(s->opt);
}

/* A device's memory and speed figures from object o (ctx names it in messages). */
static int dev_figures(const cJSON *o, struct plan_device *d, const char *ctx, char *err, size_t errlen)
{
    int rc;
    if ((rc = ju64(o, "mem_bytes", true, &d->mem_bytes, ctx, err, errlen)) < 0 ||
        (rc = ju64(o, "max_alloc_bytes", false, &d->max_alloc_bytes, ctx, err, errlen)) < 0 ||
        (rc = util_json_number_in(o, "ms_per_layer_token", 0, 1e9, false, &d->ms_per_layer_token, ctx, err,
                                  errlen)) < 0 ||
        (rc = util_json_number_in(o, "flops", 0, 1e20, false, &d->flops, ctx, err, errlen)) < 0 ||
        (rc = util_json_number_in(o, "mem_bw_bytes_s", 0, 1e16, false, &d->mem_bw_bytes_s, ctx, err, errlen)) < 0)
        return rc;
    return 0;
}

/* The "backends" of device s->d[s->n] (about to be added), if any: each an object with a
 * "backend" name and its own figures. */
static int devset_add_backends(struct devset *s, const cJSON *o, const struct plan_device *base,
                               const char *ctx, char *err, size_t errlen)
{
    const cJSON *bs = cJSON_GetObjectItemCaseSensitive(o, "backends");
    if (!bs)
        return 0;
    int nb = cJSON_GetArraySize(bs);
    if (!cJSON_IsArray(bs) || nb < 1 || nb > DEV_BACKENDS_MAX) {
        snprintf(err, errlen, "%s: 'backends' must be an array of 1 to %d objects", ctx, DEV_BACKENDS_MAX);
        return -EINVAL;
    }
    struct devopt *no = realloc(s->opt, (s->n_opt + (size_t)nb) * sizeof *no);
    if (!no) { snprintf(err, errlen, "out of memory"); return -ENOMEM; }
    s->opt = no;
    const cJSON *b;
    cJSON_ArrayForEach(b, bs) {
        struct devopt *x = &s->opt[s->n_opt];
        *x = (struct devopt){.dev = s->n, .d = *base};
        x->d.ms_per_layer_token = x->d.flops = x->d.mem_bw_bytes_s = 0;
        x->d.max_alloc_bytes = 0;
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(b, "backend");
        if (!cJSON_IsObject(b) || !cJSON_IsString(name) || !name->valuestring[0] ||
            strlen(name->valuestring) >= sizeof x->backend) {
            snprintf(err, errlen, "%s: each of 'backends' needs a 'backend' name of at most %zu bytes", ctx,
                     sizeof x->backend - 1);
            return -EINVAL;
        }
        snprintf(x->backend, sizeof x->backend, "%s", name->valuestring);
        char c3[260];
        snprintf(c3, sizeof c3, "%s backend %s", ctx, x->backend);
        int rc = dev_figures(b, &x->d, c3, err, errlen);
        if (rc < 0)
            return rc;
        s->n_opt++;
    }
    return 0;
}

/* Each machine with "backends": the one the planner places its windows on for this model
 * (plan_device_choose), its figures and name in place of the profile's own. */
static int devset_choose(struct devset *s, const struct plan_shape *shape, const struct plan_opts *o,
                         char *err, size_t errlen)
{
    for (size_t i = 0; i < s->n; i++) {
        struct plan_device opts[DEV_BACKENDS_MAX];
        const char *names[DEV_BACKENDS_MAX];
        size_t n = 0;
        for (size_t k = 0; k < s->n_opt; k++)
            if (s->opt[k].dev == i && n < DEV_BACKENDS_MAX) {
                opts[n] = s->opt[k].d;
                names[n++] = s->opt[k].backend;
            }
        if (!n)
            continue;
        int c = plan_device_choose(opts, n, shape, o, NULL);
        if (c < 0)
            continue;   /* none holds a layer: the profile's own figures stand (and say so) */
        char *b = strdup(names[c]);
        if (!b) { snprintf(err, errlen, "out of memory"); return -ENOMEM; }
        free(s->backends[i]);
        s->backends[i] = b;
        s->d[i].backend = b;
        s->d[i].mem_bytes = opts[c].mem_bytes;
        s->d[i].ms_per_layer_token = opts[c].ms_per_layer_token;
        s->d[i].flops = opts[c].flops;
        s->d[i].mem_bw_bytes_s = opts[c].mem_bw_bytes_s;
        s->d[i].max_alloc_bytes = opts[c].max_alloc_bytes;
    }
    return 0;
}

static int devset_add(struct devset *s, const cJSON *o, const char *ctx, char *err, size_t errlen)
{
    if (s->n >= PLAN_MAX_DEVICES) {
        snprintf(err, errlen, "%s: more than %u devices", ctx, PLAN_MAX_DEVICES);
        return -EINVAL;
    }
    if (!cJSON_IsObject(o)) { snprintf(err, errlen, "%s: a device must be an object", ctx); return -EINVAL; }
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 16;
        struct plan_device *d = realloc(s->d, nc * sizeof *d);
        if (d) s->d = d;
        char **a = realloc(s->ids, nc * sizeof *a);
        if (a) s->ids = a;
        char **b = realloc(s->backends, nc * sizeof *b);
        if (b) s->backends = b;
        char **c = realloc(s->endpoints, nc * sizeof *c);
        if (c) s->endpoints = c;
        char **e = realloc(s->nodes, nc * sizeof *e);
        if (e) s->nodes = e;
        if (!d || !a || !b || !c || !e) { snprintf(err, errlen, "out of memory"); return -ENOMEM; }
        s->cap = nc;
    }
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(o, "id");
    if (!cJSON_IsString(id) || !id->valuestring[0] || strlen(id->valuestring) > 128) {
        snprintf(err, errlen, "%s: 'id' must be a non-empty string of at most 128 bytes", ctx);
        return -EINVAL;
    }
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->ids[i], id->valuestring)) {
            snprintf(err, errlen, "%s: device id '%s' appears twice", ctx, id->valuestring);
            return -EINVAL;
        }
    char c2[200];
    snprintf(c2, sizeof c2, "%s (%s)", ctx, id->valuestring);
    struct plan_device d = {.inbound = true};
    int rc;
    if ((rc = dev_figures(o, &d, c2, err, errlen)) < 0 ||
        (rc = util_json_number_in(o, "rtt_ms", 0, 1e6, false, &d.rtt_ms, c2, err, errlen)) < 0 ||
        (rc = util_json_number_in(o, "bw_bytes_s", 0, 1e15, false, &d.bw_bytes_s, c2, err, errlen)) < 0)
        return rc;
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(o, "inbound");
    if (in && !cJSON_IsBool(in)) { snprintf(err, errlen, "%s: 'inbound' must be true or false", c2); return -EINVAL; }
    if (in) d.inbound = cJSON_IsTrue(in);
    char backend[32] = "cpu", endpoint[256] = "", node[80] = "";
    jstr(o, "backend", backend, sizeof backend);
    jstr(o, "endpoint", endpoint, sizeof endpoint);
    jstr(o, "node", node, sizeof node);
    if (endpoint[0] && !strstr(endpoint, "://")) {
        snprintf(err, errlen, "%s: endpoint '%s' is not scheme://address", c2, endpoint);
        return -EINVAL;
    }
    uint8_t key[32];
    if (node[0] && (strlen(node) != 64 || util_hex_decode(node, key, 32) != 0)) {
        snprintf(err, errlen, "%s: node must be 64 hex digits (an Ed25519 key)", c2);
        return -EINVAL;
    }
    if ((rc = devset_add_backends(s, o, &d, c2, err, errlen)) < 0)
        return rc;
    s->ids[s->n] = strdup(id->valuestring);
    s->backends[s->n] = strdup(backend);
    s->endpoints[s->n] = strdup(endpoint);
    s->nodes[s->n] = strdup(node);
    if (!s->ids[s->n] || !s->backends[s->n] || !s->endpoints[s->n] || !s->nodes[s->n]) {
        free(s->ids[s->n]); free(s->backends[s->n]); free(s->endpoints[s->n]); free(s->nodes[s->n]);
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    d.id = s->ids[s->n];
    d.backend = s->backends[s->n];
    s->d[s->n] = d;
    s->n++;
    return 0;
}

/* devices.json: {"devices": [...]}, a bare array, or one device object. */
static int load_devices(struct devset *s, const char *path, char *err, size_t errlen)
{
    size_t len;
    char *text;
    if (util_file_read(path, DEVICES_MAX_BYTES, &text, &len, err, errlen) < 0) return -EINVAL;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    int rc = 0;
    const cJSON *arr = root;
    if (cJSON_IsObject(root)) {
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(root, "devices");
        if (d) arr = d;
        else {
            rc = devset_add(s, root, path, err, errlen);
            goto out;
        }
    }
    if (!cJSON_IsArray(arr)) {
        snprintf(err, errlen, "%s: expected {\"devices\": [...]}, an array of devices or one device", path);
        rc = -EINVAL;
        goto out;
    }
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
        char ctx[300];
        snprintf(ctx, sizeof ctx, "%s: devices[%d]", path, i++);
        if ((rc = devset_add(s, e, ctx, err, errlen)) < 0) goto out;
    }
out:
    cJSON_Delete(root);
    return rc;
}

/* ------------------------------------------------------------------ model identity */

/* The manifest's model name and catalog id, so that a planned manifest runs unedited (a
 * stage started with --catalog checks the id). --model and --catalog together: the shape
 * from the GGUF, the id from the catalog, and the GGUF's header must be the catalog's.
 * --model alone: a full GGUF is hashed into its catalog for the id; a stage window or a
 * shape descriptor cannot give one, which is said. --catalog alone: the name is --name or
 * ARCH-ID12, since a catalog keeps digests of the metadata, not its values. */
static int model_identity(struct model_src *m, const char *model, const char *catalog, const char *name,
                          char *err, size_t errlen)
{
    int rc;
    if (model && catalog) {
        if ((rc = gguf_catalog_load(&m->cat, catalog, m->catalog, err, errlen)) < 0) return rc;
        if (m->gf && (rc = gguf_catalog_verify_metadata(m->cat, m->gf, err, errlen)) < 0) {
            char why[KV_ERR_MAX];
            snprintf(why, sizeof why, "%s", err);
            snprintf(err, errlen, "%s is not the model of catalog %s: %.600s", model, catalog, why);
            return rc;
        }
        if (strcmp(m->arch, m->cat->arch) != 0 || m->mi.n_layers != m->cat->n_layers) {
            snprintf(err, errlen, "%s (%s, %u layers) is not the model of catalog %s (%s, %u layers)", model,
                     m->arch, m->mi.n_layers, catalog, m->cat->arch, m->cat->n_layers);
            return -EINVAL;
        }
    } else if (model && m->gf) {
        uint32_t wf, wl;
        if (gguf_window_get(m->gf, &wf, &wl) == 0) {
            fprintf(stderr, "kvctl plan: note: %s is a stage window; its model's catalog id is not known, so "
                    "the manifest has none (pass --catalog CAT to name it)\n", model);
        } else {
            fprintf(stderr, "kvctl plan: hashing %s for its catalog id (pass --catalog CAT to skip)\n", model);
            struct gguf_catalog *c;
            if ((rc = gguf_catalog_build(&c, m->gf, err, errlen)) < 0) return rc;
            char *js = NULL;
            size_t len;
            rc = gguf_catalog_to_json(c, &js, &len, m->catalog);
            free(js);
            gguf_catalog_free(c);
            if (rc < 0) { snprintf(err, errlen, "%s: catalog: %s", model, strerror(-rc)); return rc; }
        }
    } else if (model) {
        fprintf(stderr, "kvctl plan: note: %s is a shape descriptor: the manifest names no catalog id "
                "(pass --catalog CAT to name it)\n", model);
    }
    if (name)
        snprintf(m->name, sizeof m->name, "%s", name);
    else if (!m->name[0] && m->catalog[0])
        snprintf(m->name, sizeof m->name, "%s-%.12s", m->arch, m->catalog);
    return 0;
}

/* ------------------------------------------------------------------ plan */

static void plan_usage(FILE *o)
{
    fprintf(o,
        "usage: kvctl plan (--model FILE [--catalog CAT] | --catalog CAT) --devices devices.json [options]\n"
        "Plan a ring: cut the model's layers into windows over the devices and write the rank\n"
        "manifest (docs/design.md, \"The rank manifest\"), printing a table of the plan.\n"
        "  --model FILE         a GGUF or stage mini-GGUF (header only), or a JSON shape\n"
        "                       descriptor (docs/planner.md)\n"
        "  --catalog CAT        a catalog (kvctl catalog); MoE models need --experts-used N.\n"
        "                       The manifest names the model by catalog id: with --model alone\n"
        "                       a full GGUF is hashed for it; with both, the GGUF's header must\n"
        "                       match the catalog and the shape comes from the GGUF\n"
        "  --name NAME          the model's name in the manifest (default: general.name of the\n"
        "                       GGUF; with a catalog alone, ARCH-ID where ID is 12 hex digits)\n"
        "  --experts-used N     experts a token uses (catalogs only)\n"
        "  --nextn N            trailing MTP blocks (catalogs; default: found by tensor names)\n"
        "  --devices FILE       device profiles; repeat to merge several files\n"
        "  --objective O        latency (one session, default) or throughput (many sessions)\n"
        "  --ctx N              context tokens reserved per session (default 4096)\n"
        "  --sessions K         sessions reserved for and estimated (default 4)\n"
        "  --draft-max K        sessions draft K tokens a pass: recurrent windows keep a\n"
        "                       checkpoint of each session's state (default 0: no drafting)\n"
        "  --headroom F         fraction of each device's memory kept free (default 0.05)\n"
        "  --wire f32|f16       boundary dtype (default f32)\n"
        "  --kv-bytes N         bytes per cached K/V element (default 2, f16)\n"
        "  --relay HOST:PORT    relay for devices with \"inbound\": false (relay:// endpoints;\n"
        "                       ws://HOST:PORT for a plain relay: relay+ws://)\n"
        "  --max-ranks N        most ranks in the ring (default 64, what a stage accepts)\n"
        "  --allow-unpinned     write a manifest even where a device names no node key (its\n"
        "                       rank then admits whoever links first; the ranks are named)\n"
        "  -o FILE              write the manifest (default: print it only with --json)\n"
        "  --json               print the manifest on stdout instead of the table\n"
        "  --layers             also print the model's per-layer shape\n");
}

static const char *dev_endpoint(const struct devset *ds, uint32_t d, char *buf, size_t n)
{
    if (ds->endpoints[d][0]) return ds->endpoints[d];
    snprintf(buf, n, "tcp://%s:7100", ds->ids[d]);
    return buf;
}

/* src into a manifest field of n bytes: -EINVAL when it does not fit (cut, it would name
 * something else). */
static int field_set(char *dst, size_t n, const char *src, const char *what, char *err, size_t errlen)
{
    size_t len = strlen(src);
    if (len >= n) {
        snprintf(err, errlen, "%s '%s' is longer than a manifest takes (%zu bytes)", what, src, n - 1);
        return -EINVAL;
    }
    memcpy(dst, src, len + 1);
    return 0;
}

/* The manifest of the plan, with the planner's figures beside the ring's own fields: per rank
 * its device and estimates, and a "plan" object. */
static int manifest_json(cJSON **out, const struct model_src *m, const struct devset *ds,
                         const struct plan_result *r, const struct plan_opts *o, const char *wire,
                         const char *relay, bool plain, char *err, size_t errlen)
{
    *out = NULL;
    if (r->n_ranks > RING_MAX_RANKS) {
        snprintf(err, errlen, "%u ranks (--max-ranks); a stage accepts manifests of at most %d", r->n_ranks,
                 RING_MAX_RANKS);
        return -EINVAL;
    }
    struct ring_manifest *man = calloc(1, sizeof *man);
    if (!man) { snprintf(err, errlen, "out of memory"); return -ENOMEM; }
    man->version = 1;
    man->stated = RING_STATED_N_CTX | RING_STATED_MAX_SESSIONS | RING_STATED_ESTIMATES;
    hex_random(man->ring, 16);
    snprintf(man->model_name, sizeof man->model_name, "%s", m->name);
    snprintf(man->catalog, sizeof man->catalog, "%s", m->catalog);
    man->n_layers = m->shape.n_layers;
    man->n_embd = m->shape.n_embd;
    man->n_ctx = o->ctx < 8 ? 8 : o->ctx;
    man->max_sessions = o->sessions;
    man->n_ranks = r->n_ranks;
    int rc = field_set(man->arch, sizeof man->arch, m->arch, "arch", err, errlen);
    if (rc == 0) rc = field_set(man->dtype, sizeof man->dtype, wire, "wire dtype", err, errlen);
    for (uint32_t i = 0; rc == 0 && i < r->n_ranks; i++) {
        const struct plan_rank *k = &r->ranks[i];
        struct ring_rank_info *ri = &man->ranks[i];
        char ep[300], tmp[300], what[64];
        ri->rank = i;
        ri->first = k->first;
        ri->last = k->last;
        ri->embed = k->embed;
        ri->head = k->head;
        ri->mem_bytes = k->mem_bytes;
        ri->est_ms_per_token = k->est_ms_per_token;
        ri->has_node = ds->nodes[k->device][0] != 0;
        if (ri->has_node) util_hex_decode(ds->nodes[k->device], ri->node, 32);   /* checked by devset_add */
        if (k->relay && relay) {
            char bridge[33];
            hex_random(bridge, 16);
            snprintf(ep, sizeof ep, "%s://%s/b/%s", plain ? "relay+ws" : "relay", relay, bridge);
        } else {
            snprintf(ep, sizeof ep, "%s", dev_endpoint(ds, k->device, tmp, sizeof tmp));
        }
        snprintf(what, sizeof what, "rank %u: backend", i);
        rc = field_set(ri->backend, sizeof ri->backend, ds->backends[k->device], what, err, errlen);
        snprintf(what, sizeof what, "rank %u: endpoint", i);
        if (rc == 0) rc = field_set(ri->endpoint, sizeof ri->endpoint, ep, what, err, errlen);
    }
    cJSON *root = NULL;
    if (rc == 0) rc = ring_manifest_to_json(&root, man, err, errlen);
    free(man);
    if (rc < 0) return rc;
    cJSON *jr = cJSON_GetObjectItemCaseSensitive(root, "ranks");
    for (uint32_t i = 0; i < r->n_ranks; i++) {
        const struct plan_rank *k = &r->ranks[i];
        cJSON *x = cJSON_GetArrayItem(jr, (int)i);
        cJSON_AddStringToObject(x, "device", ds->ids[k->device]);
        cJSON_AddNumberToObject(x, "mem_avail_bytes", (double)k->mem_avail_bytes);
        cJSON_AddNumberToObject(x, "expert_bytes", (double)k->expert_bytes);
        cJSON_AddNumberToObject(x, "active_bytes_per_token", (double)k->active_bytes);
        cJSON_AddNumberToObject(x, "compute_ms", k->compute_ms);
        cJSON_AddNumberToObject(x, "link_ms", k->link_ms);
    }
    cJSON *jp = cJSON_AddObjectToObject(root, "plan");
    cJSON_AddStringToObject(jp, "objective", o->objective == PLAN_THROUGHPUT ? "throughput" : "latency");
    cJSON_AddNumberToObject(jp, "ctx", o->ctx);
    cJSON_AddNumberToObject(jp, "sessions", o->sessions);
    cJSON_AddNumberToObject(jp, "draft_max", o->draft_max);
    cJSON_AddNumberToObject(jp, "headroom", o->headroom);
    cJSON_AddNumberToObject(jp, "est_ms_per_token", r->ms_per_token);
    cJSON_AddNumberToObject(jp, "period_ms", r->period_ms);
    cJSON_AddNumberToObject(jp, "tokens_per_s_1", r->tokens_per_s_1);
    cJSON_AddNumberToObject(jp, "tokens_per_s_k", r->tokens_per_s_k);
    cJSON_AddNumberToObject(jp, "k", r->k);
    cJSON_AddBoolToObject(jp, "exhaustive", r->exhaustive);
    cJSON *je = cJSON_AddArrayToObject(jp, "excluded");
    for (uint32_t i = 0; i < r->n_excluded; i++) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "device", ds->ids[r->excluded[i].device]);
        cJSON_AddStringToObject(x, "reason", r->excluded[i].reason);
        cJSON_AddItemToArray(je, x);
    }
    *out = root;
    return 0;
}

static void print_table(FILE *out, const struct model_src *m, const struct devset *ds,
                        const struct plan_result *r, const struct plan_opts *o)
{
    char a[32], b[32];
    double total = 0, experts = 0;
    for (uint32_t i = 0; i < m->shape.n_layers; i++) {
        total += (double)m->shape.layers[i].weight_bytes;
        experts += (double)m->shape.layers[i].expert_bytes;
    }
    total += (double)m->shape.embed_bytes + (double)m->shape.head_bytes;
    util_fmt_bytes(a, sizeof a, total, 2, UTIL_FMT_SI);
    util_fmt_bytes(b, sizeof b, experts, 2, UTIL_FMT_SI);
    fprintf(out, "model %s (%s, %s): %u layers, n_embd %u, %s of weights", m->name[0] ? m->name : "?",
            m->arch, m->kind, m->shape.n_layers, m->shape.n_embd, a);
    if (experts > 0) fprintf(out, " (%s routed experts)", b);
    if (m->mtp) {
        double mb = 0;
        for (uint32_t i = m->shape.n_layers; i < m->shape.n_layers + m->mtp; i++) mb += (double)m->layers[i].weight_bytes;
        util_fmt_bytes(a, sizeof a, mb, 2, UTIL_FMT_SI);
        fprintf(out, "\n+ %u MTP block%s ([%u, %u), %s) skipped in the main pass: not loaded, not planned",
                m->mtp, m->mtp > 1 ? "s" : "", m->shape.n_layers, m->shape.n_layers + m->mtp, a);
    }
    fprintf(out, "\nobjective %s, ctx %u x %u sessions, headroom %.0f%%, %zu devices, %s search\n\n",
            o->objective == PLAN_THROUGHPUT ? "throughput" : "latency", o->ctx, o->sessions,
            o->headroom * 100, ds->n, r->exhaustive ? "exhaustive (optimal)" : "heuristic");
    fprintf(out, "%-4s %-16s %-8s %-10s %-24s %10s %10s %9s %s\n", "rank", "device", "backend", "layers",
            "memory used / avail", "compute", "link", "ms/token", "");
    for (uint32_t i = 0; i < r->n_ranks; i++) {
        const struct plan_rank *k = &r->ranks[i];
        char lay[32], mem[72];
        snprintf(lay, sizeof lay, "[%u, %u)", k->first, k->last);
        util_fmt_bytes(a, sizeof a, (double)k->mem_bytes, 2, UTIL_FMT_SI);
        util_fmt_bytes(b, sizeof b, (double)k->mem_avail_bytes, 2, UTIL_FMT_SI);
        snprintf(mem, sizeof mem, "%s / %s", a, b);
        fprintf(out, "%-4u %-16.16s %-8.8s %-10s %-24s %10.2f %10.2f %9.2f %s%s%s\n", i, ds->ids[k->device],
                ds->backends[k->device], lay, mem, k->compute_ms, k->link_ms, k->est_ms_per_token,
                k->embed ? "embed " : "", k->head ? "head " : "", k->relay ? "relay" : "");
    }
    fprintf(out, "\nestimate: %.1f ms/token for one session (%.2f tokens/s); period %.1f ms, "
            "%.2f tokens/s with %u sessions\n", r->ms_per_token, r->tokens_per_s_1, r->period_ms,
            r->tokens_per_s_k, r->k);
    if (r->n_excluded) {
        fprintf(out, "left out:\n");
        for (uint32_t i = 0; i < r->n_excluded; i++)
            fprintf(out, "  %s\n", r->excluded[i].reason);
    }
}

/* Per-layer shape, runs of equal layers folded into one line. */
static void print_layers(FILE *out, const struct plan_shape *s, uint32_t mtp, const struct plan_opts *o)
{
    char a[32], b[32], c[32], d[32], e[32];
    fprintf(out, "%-10s %11s %11s %13s %11s %11s %12s\n", "layers", "weights", "experts", "read/token",
            "KV/token", "state", "reserved");
    for (uint32_t i = 0; i < s->n_layers + mtp;) {
        const struct plan_layer *l = &s->layers[i];
        uint32_t j = i + 1;
        while (j < s->n_layers + mtp && (j < s->n_layers) == (i < s->n_layers) &&
               !memcmp(&s->layers[j], l, sizeof *l)) j++;
        char lay[32];
        if (j - i == 1) snprintf(lay, sizeof lay, "%u", i);
        else snprintf(lay, sizeof lay, "[%u, %u)", i, j);
        util_fmt_bytes(a, sizeof a, (double)l->weight_bytes, 2, UTIL_FMT_SI);
        util_fmt_bytes(b, sizeof b, (double)l->expert_bytes, 2, UTIL_FMT_SI);
        util_fmt_bytes(c, sizeof c, (double)l->active_bytes, 2, UTIL_FMT_SI);
        util_fmt_bytes(d, sizeof d, (double)l->kv_bytes_per_token, 2, UTIL_FMT_SI);
        util_fmt_bytes(e, sizeof e, (double)l->state_bytes, 2, UTIL_FMT_SI);
        char rs[32];
        util_fmt_bytes(rs, sizeof rs, (double)o->sessions * ((double)l->state_bytes + (double)l->kv_bytes_per_token * o->ctx), 2, UTIL_FMT_SI);
        fprintf(out, "%-9s %11s %11s %13s %11s %11s %12s%s\n", lay, a, b, c, d, e, rs,
                i >= s->n_layers ? "  MTP: not loaded" : "");
        i = j;
    }
    util_fmt_bytes(a, sizeof a, (double)s->embed_bytes, 2, UTIL_FMT_SI);
    util_fmt_bytes(b, sizeof b, (double)s->head_bytes, 2, UTIL_FMT_SI);
    util_fmt_bytes(c, sizeof c, (double)s->head_active_bytes, 2, UTIL_FMT_SI);
    fprintf(out, "embedding %s (rank 0); head %s, reads %s per token (last rank); wire %llu bytes per token\n"
            "(reserved = KV/state for ctx %u x %u sessions)\n\n", a, b, c,
            (unsigned long long)s->wire_bytes_per_token, o->ctx, o->sessions);
}

int kvctl_cmd_plan(int argc, char **argv)
{
    if (kvctl_is_help(argc, argv)) { plan_usage(stdout); return 0; }
    const char *model = NULL, *catalog = NULL, *outp = NULL, *relay = NULL, *wire = "f32";
    const char *name = NULL;
    const char *devfiles[MAX_DEVICE_FILES];
    int ndev = 0, nextn = -1;
    bool json = false, show_layers = false, relay_plain = false, allow_unpinned = false;
    struct plan_opts o;
    plan_opts_default(&o);
    o.max_ranks = RING_MAX_RANKS;
    double v;
    uint32_t used = 0, kvb = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has = i + 1 < argc;
        if (!strcmp(a, "--json")) { json = true; continue; }
        if (!strcmp(a, "--layers")) { show_layers = true; continue; }
        if (!strcmp(a, "--allow-unpinned")) { allow_unpinned = true; continue; }
        if (!has) { fprintf(stderr, "kvctl plan: %s needs a value (or is unknown)\n", a); plan_usage(stderr); return 2; }
        const char *val = argv[++i];
        if (!strcmp(a, "--model") || !strcmp(a, "-m")) model = val;
        else if (!strcmp(a, "--catalog")) catalog = val;
        else if (!strcmp(a, "--name")) {
            if (!val[0] || strlen(val) >= sizeof ((struct model_src *)0)->name) {
                fprintf(stderr, "kvctl plan: --name must be 1-%zu bytes\n", sizeof ((struct model_src *)0)->name - 1);
                return 2;
            }
            name = val;
        } else if (!strcmp(a, "--devices")) {
            if (ndev >= MAX_DEVICE_FILES) { fprintf(stderr, "kvctl plan: more than %d --devices files\n", MAX_DEVICE_FILES); return 2; }
            devfiles[ndev++] = val;
        } else if (!strcmp(a, "--objective")) {
            if (!strcmp(val, "latency")) o.objective = PLAN_LATENCY;
            else if (!strcmp(val, "throughput")) o.objective = PLAN_THROUGHPUT;
            else { fprintf(stderr, "kvctl plan: --objective '%s' is not latency or throughput\n", val); return 2; }
        } else if (!strcmp(a, "--ctx")) {
            if (parse_num("plan", a, val, 0, 1u << 26, &v)) return 2;
            o.ctx = (uint32_t)v;
        } else if (!strcmp(a, "--sessions")) {
            if (parse_num("plan", a, val, 1, 1u << 20, &v)) return 2;
            o.sessions = (uint32_t)v;
        } else if (!strcmp(a, "--draft-max")) {
            if (parse_num("plan", a, val, 0, NET_DRAFTS_MAX, &v)) return 2;
            o.draft_max = (uint32_t)v;
        } else if (!strcmp(a, "--headroom")) {
            if (parse_num("plan", a, val, 0, 0.95, &o.headroom)) return 2;
        } else if (!strcmp(a, "--max-ranks")) {
            if (parse_num("plan", a, val, 1, 100000, &v)) return 2;
            o.max_ranks = (uint32_t)v;
        } else if (!strcmp(a, "--experts-used")) {
            if (parse_num("plan", a, val, 1, 4096, &v)) return 2;
            used = (uint32_t)v;
        } else if (!strcmp(a, "--nextn")) {
            if (parse_num("plan", a, val, 0, 16, &v)) return 2;
            nextn = (int)v;
        } else if (!strcmp(a, "--kv-bytes")) {
            if (parse_num("plan", a, val, 1, 8, &v)) return 2;
            kvb = (uint32_t)v;
        } else if (!strcmp(a, "--wire")) {
            if (strcmp(val, "f32") && strcmp(val, "f16")) { fprintf(stderr, "kvctl plan: --wire '%s' is not f32 or f16\n", val); return 2; }
            wire = val;
        } else if (!strcmp(a, "--relay")) {
            /* HOST:PORT or wss://HOST:PORT (TLS, relay://); ws://HOST:PORT (plain, relay+ws://) */
            relay_plain = !strncmp(val, "ws://", 5);
            if (relay_plain) val += 5;
            else if (!strncmp(val, "wss://", 6)) val += 6;
            const char *colon = strrchr(val, ':');
            if (!colon || colon == val || !colon[1] || strlen(val) > 200 || strchr(val, '/')) {
                fprintf(stderr, "kvctl plan: --relay '%s' is not [ws://|wss://]HOST:PORT\n", argv[i]);
                return 2;
            }
            relay = val;
        } else if (!strcmp(a, "-o")) outp = val;
        else { fprintf(stderr, "kvctl plan: unknown option %s\n", a); plan_usage(stderr); return 2; }
    }
    if ((!model && !catalog) || ndev == 0) {
        fprintf(stderr, "kvctl plan: give --model and/or --catalog, and --devices\n");
        plan_usage(stderr);
        return 2;
    }
    struct model_src m;
    memset(&m, 0, sizeof m);
    m.kv_bytes = kvb;
    m.wire_bytes = !strcmp(wire, "f16") ? 2 : 4;
    struct devset ds;
    memset(&ds, 0, sizeof ds);
    char err[KV_ERR_MAX];
    int ret = 1, rc;
    struct plan_result *r = NULL;
    cJSON *root = NULL;
    rc = model ? load_model(&m, model, err, sizeof err) : load_catalog(&m, catalog, used, nextn, err, sizeof err);
    if (rc == 0) rc = model_identity(&m, model, catalog, name, err, sizeof err);
    if (rc) { fprintf(stderr, "kvctl plan: %s\n", err); goto out; }
    drop_mtp(&m);
    for (int i = 0; i < ndev; i++)
        if (load_devices(&ds, devfiles[i], err, sizeof err) < 0) { fprintf(stderr, "kvctl plan: %s\n", err); goto out; }
    if (show_layers && !json) print_layers(stdout, &m.shape, m.mtp, &o);
    if (devset_choose(&ds, &m.shape, &o, err, sizeof err) < 0) { fprintf(stderr, "kvctl plan: %s\n", err); goto out; }
    rc = plan_make(&r, &m.shape, ds.d, ds.n, &o, err, sizeof err);
    if (rc) {
        fprintf(stderr, "kvctl plan: %s\n", err);
        goto out;
    }
    if (!json) print_table(stdout, &m, &ds, r, &o);
    bool need_relay = false;
    for (uint32_t i = 0; i < r->n_ranks; i++)
        if (r->ranks[i].relay) need_relay = true;
    if (need_relay && !relay) {
        fprintf(stderr, "kvctl plan: ranks marked 'relay' accept no inbound connections: pass --relay HOST:PORT "
                "so their edges get relay:// endpoints (no manifest written)\n");
        goto out;
    }
    /* A rank without a node key admits whoever links first as that rank (a relay in the
     * middle, anyone on the path): the manifest's ranks name every key unless told otherwise. */
    char unpinned[600] = "";
    size_t at = 0;
    for (uint32_t i = 0; i < r->n_ranks && at < sizeof unpinned; i++)
        if (!ds.nodes[r->ranks[i].device][0])
            at += (size_t)snprintf(unpinned + at, sizeof unpinned - at, "%srank %u (device %s)",
                                   at ? ", " : "", i, ds.ids[r->ranks[i].device]);
    if (unpinned[0] && (json || outp) && !allow_unpinned) {
        fprintf(stderr, "kvctl plan: %s name%s no node key: whoever links first (a relay, anyone on "
                "the path) could serve %s and read or rewrite the ring's traffic. Profile each device "
                "with `kvctl profile --state-dir DIR` (DIR: the state dir its kvd runs with), or add "
                "\"node\": the output of `kvd stage --print-key --state-dir DIR` to its entry; "
                "--allow-unpinned writes the manifest anyway (no manifest written)\n", unpinned,
                strchr(unpinned, ',') ? "" : "s", strchr(unpinned, ',') ? "those ranks" : "that rank");
        goto out;
    }
    if (unpinned[0])
        fprintf(stderr, "kvctl plan: %s: %s name%s no node key%s\n",
                allow_unpinned ? "warning (--allow-unpinned)" : "note", unpinned,
                strchr(unpinned, ',') ? "" : "s",
                allow_unpinned ? ": any node may link as them" : " (a manifest written now would be refused)");
    if (r->n_ranks > RING_MAX_RANKS && !json && !outp)
        fprintf(stderr, "kvctl plan: note: %u ranks (--max-ranks); a stage accepts manifests of at most %d\n",
                r->n_ranks, RING_MAX_RANKS);
    if (!json && !outp) { ret = 0; goto out; }
    if (manifest_json(&root, &m, &ds, r, &o, wire, relay, relay_plain, err, sizeof err) < 0) {
        fprintf(stderr, "kvctl plan: %s (no manifest written)\n", err);
        goto out;
    }
    char *js = cJSON_Print(root);
    if (!js) { fprintf(stderr, "kvctl plan: out of memory\n"); goto out; }
    if (json) printf("%s\n", js);
    if (outp) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", outp);
        FILE *f = fopen(tmp, "w");
        if (!f || fputs(js, f) < 0 || fputc('\n', f) < 0 || fclose(f) != 0 || rename(tmp, outp) != 0) {
            fprintf(stderr, "kvctl plan: writing %s: %s\n", outp, strerror(errno));
            free(js);
            goto out;
        }
        if (!json) printf("manifest written to %s\n", outp);
    }
    free(js);
    ret = 0;
out:
    cJSON_Delete(root);
    plan_result_free(r);
    devset_free(&ds);
    model_src_free(&m);
    return ret;
}

/* ------------------------------------------------------------------ profile */

static uint64_t meminfo_kb(const char *key)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    uint64_t v = 0;
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl) && line[kl] == ':') {
            v = strtoull(line + kl + 1, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

/* Memory read bandwidth: sum a buffer larger than the caches a few times. */
static double measure_bw(void)
{
    size_t n = (size_t)64 << 20;
    uint64_t *buf = malloc(n);
    if (!buf) return 0;
    for (size_t i = 0; i < n / 8; i++) buf[i] = i;
    volatile uint64_t sink = 0;
    double best = 0;
    for (int rep = 0; rep < 4; rep++) {
        double t0 = util_now_s();
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (size_t i = 0; i + 4 <= n / 8; i += 4) { s0 += buf[i]; s1 += buf[i + 1]; s2 += buf[i + 2]; s3 += buf[i + 3]; }
        sink += s0 + s1 + s2 + s3;
        double dt = util_now_s() - t0;
        if (dt > 0 && n / dt > best) best = n / dt;
    }
    (void)sink;
    free(buf);
    return best;
}

/* Run the model's layers on kernel device dev: one session, `tokens` single-token steps; *ms
 * is the best step's time per working layer. 0, or -1 (said on stderr) when it cannot run. */
static int measure_layers(const struct model_src *m, const char *path, const char *dev, int threads,
                          int tokens, double *ms)
{
    struct model *md = NULL;
    struct model_exec *ex = NULL;
    char merr[KV_ERR_MAX] = "";
    int rc = -1;
    struct model_exec_opts eo = {dev, threads, (uint32_t)tokens + 8, 1};
    if (model_open(&md, path, -1, -1, merr, sizeof merr) < 0 ||
        model_exec_new_opts(&ex, md, &eo, merr, sizeof merr) < 0 || model_session_new(ex, 1) < 0) {
        fprintf(stderr, "kvctl profile: cannot run the model on %s here (%s)%s\n", dev,
                merr[0] ? merr : "executor", strcmp(dev, "cpu") ? "" : "; estimating from memory bandwidth");
        goto out;
    }
    const struct model_hparams *hp = model_get_hparams(md);
    uint32_t first, last;
    model_get_window(md, &first, &last);
    float *x = malloc((size_t)hp->n_embd * sizeof *x);
    if (!x)
        goto out;
    for (uint32_t k = 0; k < hp->n_embd; k++) x[k] = 0.01f * (float)((k * 7919u) % 200) - 1.0f;
    double best = 0;
    int ok = 1;
    for (int t = 0; t < tokens && ok; t++) {
        double t0 = util_now_s();
        ok = model_window_run(ex, 1, (uint32_t)t, 1, x) == 0;
        double dt = util_now_s() - t0;
        if (t >= 2 && (best == 0 || dt < best)) best = dt; /* skip warm-up steps */
        for (uint32_t k = 0; k < hp->n_embd; k++)  /* keep values tame */
            if (!(fabsf(x[k]) < 1e3f)) x[k] = 0;
    }
    free(x);
    uint32_t runs = last > first ? last - first : 0;
    if (ok && best > 0 && runs) {
        /* the file's MTP blocks are not run: count the layers that work */
        uint32_t work = 0;
        for (uint32_t l = first; l < last && l < m->shape.n_layers; l++)
            if (m->shape.layers[l].active_bytes) work++;
        *ms = best * 1000.0 / (work ? work : runs);
        rc = 0;
    }
out:
    model_exec_free(ex);
    model_free(md);
    return rc;
}

/* The OpenCL device's facts and a matmul (one activation row, as generation runs) per weight
 * type the model's blocks use: GB/s of weights read and GFLOP/s. NULL (said on stderr) when
 * no OpenCL device opens. *bw is its measured read bandwidth (bytes/s), *mem the memory a
 * window may use there: its global memory, and on a device that shares host memory at most
 * what the host has available. */
static cJSON *probe_opencl(const struct model_src *m, uint64_t host_avail, double *bw, uint64_t *mem,
                           uint64_t *max_alloc)
{
    struct kern_dev *d;
    char err[KV_ERR_MAX];
    if (kern_dev_new(&d, "opencl", 1, err, sizeof err) < 0) {
        fprintf(stderr, "kvctl profile: --backend opencl: %s\n", err);
        return NULL;
    }
    struct kern_cl_info ci;
    kern_cl_info(d, &ci);
    *bw = kern_cl_bench_bandwidth(d, (size_t)64 << 20) * 1e9;
    *mem = ci.global_mem;
    *max_alloc = ci.max_alloc;
    if (ci.unified && host_avail && host_avail < *mem)
        *mem = host_avail;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "platform", ci.platform);
    cJSON_AddStringToObject(o, "device", ci.device);
    cJSON_AddNumberToObject(o, "global_mem_bytes", (double)ci.global_mem);
    cJSON_AddNumberToObject(o, "max_alloc_bytes", (double)ci.max_alloc);
    cJSON_AddBoolToObject(o, "unified_memory", ci.unified);
    cJSON_AddStringToObject(o, "weights", ci.weights);
    cJSON_AddStringToObject(o, "layout", ci.layout);
    cJSON_AddNumberToObject(o, "read_bw_bytes_s", *bw);
    cJSON *mm = cJSON_AddArrayToObject(o, "matmul");
    bool seen[KERN_T_COUNT] = {false};
    const int64_t cols = 4096;
    for (uint64_t i = 0; m->gf && i < gguf_tensor_count(m->gf); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(m->gf, i);
        if (gguf_tensor_layer(t->name) < 0 || t->n_dims < 2 || t->type >= KERN_T_COUNT || seen[t->type] ||
            !kern_type_supported(t->type))
            continue;
        seen[t->type] = true;
        /* rows x 4096 of the type, about 16 MiB: bytes 0x11 make small finite scales */
        size_t rb = kern_row_bytes(t->type, cols);
        if (!rb)
            continue;
        int64_t rows = (int64_t)(((size_t)16 << 20) / rb);
        rows = rows < 64 ? 64 : rows;
        unsigned char *w = malloc((size_t)rows * rb);
        struct kern_buf *wb = NULL, *xb = NULL, *yb = NULL;
        double best = 0;
        if (w) {
            memset(w, 0x11, (size_t)rows * rb);
            if (kern_buf_new(&wb, d, KERN_BUF_WEIGHT, (size_t)rows * rb, w) == 0 &&
                kern_buf_new(&xb, d, KERN_BUF_ACT, (size_t)cols * 4, NULL) == 0 &&
                kern_buf_new(&yb, d, KERN_BUF_ACT, (size_t)rows * 4, NULL) == 0) {
                for (int rep = 0; rep < 4; rep++) {
                    double t0 = util_now_s();
                    int rc = kern_dev_matmul(d, t->type, kern_at_make(wb, 0), rows, cols,
                                             kern_at_make(xb, 0), 1, kern_at_make(yb, 0));
                    if (rc == 0) rc = kern_dev_sync(d);
                    double dt = util_now_s() - t0;
                    if (rc < 0) { best = 0; break; }
                    if (rep > 0 && (best == 0 || dt < best)) best = dt; /* the first builds layouts */
                }
            }
        }
        kern_buf_free(wb); kern_buf_free(xb); kern_buf_free(yb);
        free(w);
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "type", kern_type_name(t->type));
        cJSON_AddNumberToObject(e, "rows", (double)rows);
        cJSON_AddNumberToObject(e, "cols", (double)cols);
        cJSON_AddNumberToObject(e, "gb_s", best > 0 ? (double)rows * rb / best / 1e9 : 0);
        cJSON_AddNumberToObject(e, "gflops", best > 0 ? 2.0 * rows * cols / best / 1e9 : 0);
        cJSON_AddItemToArray(mm, e);
    }
    kern_dev_free(d);
    return o;
}

static void profile_usage(FILE *o)
{
    fprintf(o,
        "usage: kvctl profile --model FILE --state-dir DIR [-t N] [--id ID] [--endpoint URL]\n"
        "                     [--rtt-ms X] [--bw BYTES_PER_S] [--no-inbound] [--tokens N]\n"
        "                     [--estimate] [--backend cpu|opencl] [--cl-platform N]\n"
        "                     [--cl-device N] [--cl-weights map|copy|auto] [--allow-unpinned]\n"
        "Measure this machine for a model: ms per layer-token (the model's layers run on this\n"
        "CPU with N threads), free memory (MemAvailable), memory bandwidth; print the device\n"
        "profile JSON for `kvctl plan --devices`. --backend opencl also measures the OpenCL\n"
        "device (its memory, bandwidth, a matmul per weight type, the layers run on it) and\n"
        "lists both under \"backends\"; the planner places the windows on the faster. --estimate skips running the model and\n"
        "estimates from the measured bandwidth and the bytes a token reads. --state-dir DIR\n"
        "records the node key of the kvd that will run there (DIR/node.key, created if missing,\n"
        "as `kvd stage --state-dir DIR --print-key` does), so a planned manifest admits only\n"
        "that node on its rank; without it the profile is refused unless --allow-unpinned\n"
        "(and `kvctl plan` then refuses the manifest unless --allow-unpinned too).\n");
}

int kvctl_cmd_profile(int argc, char **argv)
{
    if (kvctl_is_help(argc, argv)) { profile_usage(stdout); return 0; }
    const char *model = NULL, *id = NULL, *endpoint = NULL, *state_dir = NULL;
    double v, rtt = 0, bw = 0;
    int threads = 0, tokens = 16;
    bool inbound = true, estimate = false, allow_unpinned = false;
    const char *backend = "cpu";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--no-inbound")) { inbound = false; continue; }
        if (!strcmp(a, "--estimate")) { estimate = true; continue; }
        if (!strcmp(a, "--allow-unpinned")) { allow_unpinned = true; continue; }
        if (i + 1 >= argc) { fprintf(stderr, "kvctl profile: %s needs a value (or is unknown)\n", a); profile_usage(stderr); return 2; }
        const char *val = argv[++i];
        if (!strcmp(a, "--model") || !strcmp(a, "-m")) model = val;
        else if (!strcmp(a, "-t")) { if (parse_num("profile", a, val, 0, 1024, &v)) return 2; threads = (int)v; }
        else if (!strcmp(a, "--tokens")) { if (parse_num("profile", a, val, 1, 4096, &v)) return 2; tokens = (int)v; }
        else if (!strcmp(a, "--id")) id = val;
        else if (!strcmp(a, "--endpoint")) endpoint = val;
        else if (!strcmp(a, "--state-dir")) state_dir = val;
        else if (!strcmp(a, "--backend") || !strcmp(a, "--device")) backend = val;
        else if (!strncmp(a, "--cl-", 5)) {
            int rc = kvctl_cl_option(a, val);
            if (rc == -ENOENT) { fprintf(stderr, "kvctl profile: unknown option %s\n", a); profile_usage(stderr); }
            if (rc < 0) return 2;
        }
        else if (!strcmp(a, "--rtt-ms")) { if (parse_num("profile", a, val, 0, 1e6, &rtt)) return 2; }
        else if (!strcmp(a, "--bw")) { if (parse_num("profile", a, val, 0, 1e15, &bw)) return 2; }
        else { fprintf(stderr, "kvctl profile: unknown option %s\n", a); profile_usage(stderr); return 2; }
    }
    if (!model) { fprintf(stderr, "kvctl profile: --model is required\n"); profile_usage(stderr); return 2; }
    if (!state_dir && !allow_unpinned) {
        fprintf(stderr, "kvctl profile: --state-dir DIR is required: the node key of the kvd that "
                "will run on this device (DIR/node.key, created if missing; the --state-dir its "
                "kvd stage runs with) goes into the profile, so a planned manifest admits only that "
                "node on its rank. --allow-unpinned profiles without it (any node could then link as "
                "its rank)\n");
        return 2;
    }
    bool cl = !strcmp(backend, "opencl");
    if (!cl && strcmp(backend, "cpu")) {
        fprintf(stderr, "kvctl profile: --backend %s: cpu or opencl\n", backend);
        return 2;
    }
    char host[128] = "localhost";
    gethostname(host, sizeof host - 1);
    if (!id) id = host;
    char err[KV_ERR_MAX];
    char node[65] = "";
    if (state_dir) {
        struct net_identity *ident;
        if (net_identity_load(&ident, state_dir, err, sizeof err) < 0) {
            fprintf(stderr, "kvctl profile: node key in %s: %s\n", state_dir, err);
            return 1;
        }
        util_hex_encode(net_identity_pub(ident), 32, node);
        net_identity_free(ident);
    }
    struct model_src m;
    memset(&m, 0, sizeof m);
    if (load_model(&m, model, err, sizeof err)) {
        fprintf(stderr, "kvctl profile: %s\n", err);
        model_src_free(&m);
        return 1;
    }
    uint64_t avail = meminfo_kb("MemAvailable") * 1024;
    double membw = measure_bw();
    /* the average working layer: what ms_per_layer_token means to the planner */
    double act = 0;
    uint32_t nwork = 0;
    for (uint32_t i = 0; i < m.shape.n_layers; i++)
        if (m.shape.layers[i].active_bytes) { act += (double)m.shape.layers[i].active_bytes; nwork++; }
    act = nwork ? act / nwork : 0;
    double ms = 0;
    const char *how = "estimate";
    if (!estimate && !strcmp(m.kind, "gguf") && measure_layers(&m, model, "cpu", threads, tokens, &ms) == 0)
        how = "measured";
    if (ms == 0 && membw > 0)
        ms = act / membw * 1000.0;
    /* --backend opencl: the OpenCL device as a second option of this machine */
    struct plan_device opt[2] = {
        {.backend = "cpu", .mem_bytes = avail, .ms_per_layer_token = ms, .mem_bw_bytes_s = membw},
        {.backend = "opencl"},
    };
    const char *opt_how[2] = {how, "estimate"};
    cJSON *clinfo = NULL;
    char clname[160] = "";
    if (cl) {
        double clbw = 0;
        uint64_t clmem = 0, clalloc = 0;
        if (!(clinfo = probe_opencl(&m, avail, &clbw, &clmem, &clalloc))) {
            model_src_free(&m);
            return 1;
        }
        double clms = 0;
        if (!estimate && !strcmp(m.kind, "gguf") && measure_layers(&m, model, "opencl", 1, tokens, &clms) == 0)
            opt_how[1] = "measured";
        else if (clbw > 0)
            clms = act / clbw * 1000.0;
        snprintf(clname, sizeof clname, "%s", cJSON_GetObjectItem(clinfo, "device")->valuestring);
        opt[1].mem_bytes = clmem;
        opt[1].max_alloc_bytes = clalloc;
        opt[1].ms_per_layer_token = clms;
        opt[1].mem_bw_bytes_s = clbw;
    }
    struct plan_opts po;
    plan_opts_default(&po);
    int pick = cl ? plan_device_choose(opt, 2, &m.shape, &po, NULL) : 0;
    if (pick < 0)
        pick = 0;
    cJSON *root = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(root, "devices");
    cJSON *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "id", id);
    cJSON_AddNumberToObject(d, "mem_bytes", (double)opt[pick].mem_bytes);
    cJSON_AddStringToObject(d, "backend", opt[pick].backend);
    cJSON_AddNumberToObject(d, "ms_per_layer_token", opt[pick].ms_per_layer_token);
    cJSON_AddNumberToObject(d, "mem_bw_bytes_s", opt[pick].mem_bw_bytes_s);
    if (opt[pick].max_alloc_bytes)
        cJSON_AddNumberToObject(d, "max_alloc_bytes", (double)opt[pick].max_alloc_bytes);
    cJSON_AddNumberToObject(d, "rtt_ms", rtt);
    cJSON_AddNumberToObject(d, "bw_bytes_s", bw);
    cJSON_AddBoolToObject(d, "inbound", inbound);
    if (endpoint) cJSON_AddStringToObject(d, "endpoint", endpoint);
    if (node[0]) cJSON_AddStringToObject(d, "node", node);
    cJSON_AddStringToObject(d, "ms_per_layer_token_is", opt_how[pick]);
    if (cl) {   /* both options, for `kvctl plan` to choose with its own context and sessions */
        cJSON *bs = cJSON_AddArrayToObject(d, "backends");
        for (int k = 0; k < 2; k++) {
            cJSON *b = cJSON_CreateObject();
            cJSON_AddStringToObject(b, "backend", opt[k].backend);
            cJSON_AddNumberToObject(b, "mem_bytes", (double)opt[k].mem_bytes);
            cJSON_AddNumberToObject(b, "ms_per_layer_token", opt[k].ms_per_layer_token);
            cJSON_AddNumberToObject(b, "mem_bw_bytes_s", opt[k].mem_bw_bytes_s);
            if (opt[k].max_alloc_bytes)
                cJSON_AddNumberToObject(b, "max_alloc_bytes", (double)opt[k].max_alloc_bytes);
            cJSON_AddStringToObject(b, "ms_per_layer_token_is", opt_how[k]);
            if (k == 1)
                cJSON_AddItemToObject(b, "opencl", clinfo);
            cJSON_AddItemToArray(bs, b);
        }
    }
    cJSON_AddItemToArray(arr, d);
    char *js = cJSON_Print(root);
    if (js) printf("%s\n", js);
    free(js);
    cJSON_Delete(root);
    char a[32], b[32];
    util_fmt_bytes(a, sizeof a, (double)avail, 2, UTIL_FMT_SI);
    util_fmt_bytes(b, sizeof b, membw, 2, UTIL_FMT_SI);
    fprintf(stderr, "profile: %s, %s available, %s/s memory bandwidth, %.4f ms per layer-token (%s, "
            "average layer reads %.0f bytes per token)\n", id, a, b, ms, how, act);
    if (cl) {
        util_fmt_bytes(a, sizeof a, (double)opt[1].mem_bytes, 2, UTIL_FMT_SI);
        util_fmt_bytes(b, sizeof b, opt[1].mem_bw_bytes_s, 2, UTIL_FMT_SI);
        fprintf(stderr, "profile: opencl %s, %s for windows, %s/s read bandwidth, %.4f ms per layer-token "
                "(%s); windows go on %s\n", clname, a, b,
                opt[1].ms_per_layer_token, opt_how[1], opt[pick].backend);
    }
    model_src_free(&m);
    return 0;
}

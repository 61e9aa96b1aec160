/* kvctl/synth.c — kvctl synth: a random-weight model of a dense architecture with a working
 * SPM vocabulary, or a copy of a hybrid model with random multi-token-prediction blocks
 * appended. Both walk the architecture table (model_arch_tensors) for the tensors to write. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "kernels/kern.h"
#include "kvctl/kvctl.h"
#include "model/model.h"
#include "util/err.h"
#include "wtype/wtype.h"

/* xoshiro256** seeded through splitmix64: fast, and per tensor (seed, name) so the bytes of a
 * tensor do not depend on which other tensors exist. */
struct rng {
    uint64_t s[4];
};

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(struct rng *r)
{
    uint64_t *s = r->s;
    uint64_t res = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return res;
}

static void rng_seed(struct rng *r, uint64_t seed, const char *name)
{
    uint64_t x = seed ^ 0x6b7661736972ull;
    for (const char *p = name; *p; p++)
        x = (x ^ (uint8_t)*p) * 1099511628211ull;
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
}

/* n uniform floats in [center - scale, center + scale). */
static void rng_fill(struct rng *r, float *x, uint64_t n, float center, float scale)
{
    const float k = 2.0f * scale / 16777216.0f;
    uint64_t i = 0;
    for (; i + 1 < n; i += 2) {
        uint64_t v = rng_next(r);
        x[i] = center - scale + (float)(v >> 40) * k;
        x[i + 1] = center - scale + (float)((v >> 8) & 0xffffff) * k;
    }
    if (i < n)
        x[i] = center - scale + (float)(rng_next(r) >> 40) * k;
}

struct synth_tensor {
    char name[96];
    uint32_t type, n_dims;
    uint64_t ne[4];               /* unused dimensions 1 */
    float center, scale;
    uint64_t seed;
};

/* Rows of ne[0] values (every dimension past the first counts rows: routed experts are
 * n_expert slices of rows), each quantized on its own. */
static int synth_fill(void *ud, const char *name, void *buf, uint64_t size)
{
    const struct synth_tensor *t = ud;
    struct rng r;
    rng_seed(&r, t->seed, name);
    uint64_t ne0 = t->ne[0], rows = t->ne[1] * t->ne[2] * t->ne[3];
    if (t->type == GGUF_T_F32) {
        if (size != ne0 * rows * sizeof(float))
            return -EINVAL;
        rng_fill(&r, buf, ne0 * rows, t->center, t->scale);
        return 0;
    }
    float *row = malloc(ne0 * sizeof *row);
    if (!row)
        return -ENOMEM;
    size_t rb = kern_row_bytes(t->type, (int64_t)ne0);
    int rc = 0;
    if (!rb || rb * rows != size)
        rc = -EINVAL;
    for (uint64_t i = 0; i < rows && !rc; i++) {
        uint8_t *dst = (uint8_t *)buf + i * rb;
        rng_fill(&r, row, ne0, t->center, t->scale);
        if (t->type == GGUF_T_F16) {
            uint16_t *h = (uint16_t *)dst;
            for (uint64_t j = 0; j < ne0; j++)
                h[j] = wtype_f32_to_f16(row[j]);
        } else {
            rc = kern_ref_quant_row(t->type, row, dst, (int64_t)ne0);
        }
    }
    free(row);
    return rc;
}

/* Tensor d of the architecture table, named name, to be filled in type from (seed, name):
 * 1-D vectors near 1 (norms) or 0 (biases), +-0.1; matrices and routed experts uniform in
 * +-sqrt(3 / ne0), which keeps activations near unit size (the embedding +-1). */
static void synth_tensor_init(struct synth_tensor *t, const char *name,
                              const struct model_tensor_desc *d, const uint64_t ne[4],
                              uint32_t type, uint64_t seed)
{
    snprintf(t->name, sizeof t->name, "%s", name);
    t->type = type;
    t->n_dims = d->n_dims;
    memcpy(t->ne, ne, sizeof t->ne);
    t->seed = seed;
    if (d->form == MODEL_FORM_VEC) {
        size_t len = strlen(name);
        bool bias = len >= 5 && !strcmp(name + len - 5, ".bias");
        t->center = bias ? 0.0f : 1.0f;
        t->scale = 0.1f;
    } else {
        t->center = 0.0f;
        t->scale = d->flags & MODEL_TF_EMBED ? 1.0f : sqrtf(3.0f / (float)ne[0]);
    }
}

/* The --type choices: the type of the 2-D weights and the llama_ftype number general.file_type
 * records. q4_k is every weight in Q4_K, which llama.cpp has no file type for: its nearest,
 * Q4_K_S (14), is what the file says. q4_k_m is llama.cpp's Q4_K_M mixture (synth_q4_k_m_type). */
struct synth_ftype {
    const char *name;
    uint32_t type;                /* every 2-D weight's, but those the mixture raises */
    uint32_t file_type;
    bool q4_k_m;
};

static const struct synth_ftype synth_ftypes[] = {
    {"f32", GGUF_T_F32, 0, false},   {"f16", GGUF_T_F16, 1, false},
    {"q8_0", GGUF_T_Q8_0, 7, false}, {"q4_0", GGUF_T_Q4_0, 2, false},
    {"q4_k", GGUF_T_Q4_K, 14, false}, {"q6_k", GGUF_T_Q6_K, 18, false},
    {"q4_k_m", GGUF_T_Q4_K, 15, true},
};
#define SYNTH_N_FTYPES (sizeof synth_ftypes / sizeof synth_ftypes[0])

/* The types synth writes matrices in (synth_fill makes them from floats): those of the --type
 * choices. --from takes them for its new blocks too. */
static bool synth_type_ok(uint32_t type)
{
    for (size_t i = 0; i < SYNTH_N_FTYPES; i++)
        if (synth_ftypes[i].type == type)
            return true;
    return false;
}

/* "f32, f16, ..." into buf: the --type choices, or (mixtures false) the weight types only. */
static void synth_type_names(char *buf, size_t n, bool mixtures)
{
    size_t len = 0;
    buf[0] = 0;
    for (size_t i = 0; i < SYNTH_N_FTYPES && len < n; i++)
        if (mixtures || !synth_ftypes[i].q4_k_m)
            len += (size_t)snprintf(buf + len, n - len, "%s%s", len ? ", " : "", synth_ftypes[i].name);
}

/* The layer of tensor name ("blk.N.part"), with *part after "blk.N.", or -1 (a global). */
static int synth_layer_part(const char *name, const char **part)
{
    int l = gguf_tensor_layer(name);
    *part = l >= 0 ? strchr(name + 4, '.') + 1 : name; /* gguf_tensor_layer parsed "blk.N." */
    return l;
}

/* llama.cpp's layers of n that get more bits in its _M mixtures: the first eighth, the last
 * eighth, and every third layer between. */
static bool synth_more_bits(uint32_t il, uint32_t n)
{
    return il < n / 8 || il >= 7 * n / 8 || (il - n / 8) % 3 == 2;
}

/* The type of 2-D weight name of a dense model in llama.cpp's Q4_K_M: Q6_K for output.weight
 * (for token_embd.weight when tied, as it is the head then) and for attn_v.weight and
 * ffn_down.weight of the layers synth_more_bits picks; Q4_K for the rest, token_embd included.
 * (llama.cpp also raises a 70B llama's attn_v to Q5_K; synth does not.) */
static uint32_t synth_q4_k_m_type(const char *name, uint32_t n_layer, bool tied)
{
    if (!strcmp(name, "output.weight") || (tied && !strcmp(name, "token_embd.weight")))
        return GGUF_T_Q6_K;
    const char *part;
    int il = synth_layer_part(name, &part);
    if (il >= 0 && synth_more_bits((uint32_t)il, n_layer) &&
        (!strcmp(part, "attn_v.weight") || !strcmp(part, "ffn_down.weight")))
        return GGUF_T_Q6_K;
    return GGUF_T_Q4_K;
}

/* The tensors being added to the writer. */
struct synth_ctx {
    struct gguf_writer *w;
    const struct synth_ftype *ft;
    uint32_t n_layer;
    bool tied;
    uint64_t seed;
    struct synth_tensor *ts;      /* live until the file is written (the fill callbacks) */
    size_t n;
};

/* Adds one tensor of the architecture table: matrices in the chosen type (or the mixture's),
 * the tensors llama.cpp keeps in f32 (norms, biases) in f32. */
static int synth_add(void *ud, const char *name, const struct model_tensor_desc *d,
                     const uint64_t ne[4])
{
    struct synth_ctx *c = ud;
    struct synth_tensor *t = &c->ts[c->n++];
    uint32_t type = d->flags & MODEL_TF_F32 ? GGUF_T_F32
                    : c->ft->q4_k_m         ? synth_q4_k_m_type(name, c->n_layer, c->tied)
                                            : c->ft->type;
    synth_tensor_init(t, name, d, ne, type, c->seed);
    return gguf_writer_add_tensor_fill(c->w, t->name, t->type, t->n_dims, t->ne, synth_fill, t);
}

/* SPM vocabulary: <unk>, <s>, </s>, the 256 byte tokens, then pieces: single characters,
 * "▁"+letter, then all lowercase strings of growing length with and without "▁". */
struct vocab {
    char **tok;
    float *score;
    int32_t *type;
    uint64_t n;
};

static void vocab_free(struct vocab *v)
{
    for (uint64_t i = 0; v->tok && i < v->n; i++)
        free(v->tok[i]);
    free(v->tok);
    free(v->score);
    free(v->type);
}

static int vocab_add(struct vocab *v, uint64_t cap, const char *s, float score, int32_t type)
{
    if (v->n >= cap)
        return 1;
    if (!(v->tok[v->n] = strdup(s)))
        return -ENOMEM;
    v->score[v->n] = score;
    v->type[v->n] = type;
    v->n++;
    return 0;
}

static int vocab_build(struct vocab *v, uint64_t n)
{
    memset(v, 0, sizeof *v);
    v->tok = calloc(n, sizeof *v->tok);
    v->score = calloc(n, sizeof *v->score);
    v->type = calloc(n, sizeof *v->type);
    if (!v->tok || !v->score || !v->type)
        return -ENOMEM;
    int rc = 0;
    rc = rc ? rc : vocab_add(v, n, "<unk>", 0, 2);
    rc = rc ? rc : vocab_add(v, n, "<s>", 0, 3);
    rc = rc ? rc : vocab_add(v, n, "</s>", 0, 3);
    char buf[64];
    for (int b = 0; b < 256 && !rc; b++) {
        snprintf(buf, sizeof buf, "<0x%02X>", b);
        rc = vocab_add(v, n, buf, 0, 6);
    }
    static const char singles[] =
        "etaoinshrdlucmfwypvbgkjqxzETAOINSHRDLUCMFWYPVBGKJQXZ0123456789.,!?'\"-:;()";
    const char *sp = "\xe2\x96\x81"; /* U+2581, SPM's word boundary */
    float score = -1;
    rc = rc ? rc : vocab_add(v, n, sp, score--, 1);
    for (const char *c = singles; *c && !rc; c++) {
        snprintf(buf, sizeof buf, "%c", *c);
        rc = vocab_add(v, n, buf, score--, 1);
    }
    for (const char *c = singles; *c && !rc && c < singles + 52; c++) {
        snprintf(buf, sizeof buf, "%s%c", sp, *c);
        rc = vocab_add(v, n, buf, score--, 1);
    }
    /* lowercase strings of length 2, 3, ...: "▁s" then "s" */
    for (int len = 2; !rc && len < 12; len++) {
        uint64_t count = 1;
        for (int i = 0; i < len; i++)
            count *= 26;
        for (uint64_t k = 0; k < count && !rc; k++) {
            char w[16];
            uint64_t x = k;
            for (int i = len - 1; i >= 0; i--) {
                w[i] = singles[x % 26];
                x /= 26;
            }
            w[len] = 0;
            snprintf(buf, sizeof buf, "%s%s", sp, w);
            rc = vocab_add(v, n, buf, score--, 1);
            rc = rc ? rc : vocab_add(v, n, w, score--, 1);
        }
    }
    return rc < 0 ? rc : 0;
}

/* ---- synth --from MODEL --nextn N: the model with N random multi-token-prediction blocks */

#define SYNTH_MAX_NEXTN 4

/* The new blocks being added after the copied tensors of src. */
struct nextn_ctx {
    struct gguf_writer *w;
    const struct gguf_file *src;
    uint32_t first;               /* the first new block: the source's block_count */
    uint32_t like;                /* the last full-attention layer of the main pass */
    uint64_t seed;
    struct synth_tensor *ts;      /* live until the file is written (the fill callbacks) */
    size_t n, cap;
    char err[KV_ERR_MAX];
};

/* One tensor of the architecture walk: a tensor of a new block gets the type its counterpart
 * in the layer `like` has (blk.<like>.attn_q.weight for blk.8.attn_q.weight); one with no
 * counterpart (the nextn.* tensors) is f32 when a vector or kept in f32 by llama.cpp, else in
 * the type of that layer's attn_q. Tensors of the source's blocks and globals are skipped:
 * they are copied as they are. */
static int nextn_add(void *ud, const char *name, const struct model_tensor_desc *d,
                     const uint64_t ne[4])
{
    struct nextn_ctx *c = ud;
    const char *part;
    int l = synth_layer_part(name, &part);
    if (l < 0 || (uint32_t)l < c->first)
        return 0;
    char like[128];
    snprintf(like, sizeof like, "blk.%" PRIu32 ".%s", c->like, part);
    const struct gguf_tensor *lt = gguf_tensor_find(c->src, like);
    if (!lt && d->form != MODEL_FORM_VEC && !(d->flags & MODEL_TF_F32)) {
        snprintf(like, sizeof like, "blk.%" PRIu32 ".attn_q.weight", c->like);
        if (!(lt = gguf_tensor_find(c->src, like))) {
            util_seterr(c->err, sizeof c->err, "tensor %s: the model has no %s to take its type from",
                     name, like);
            return -ENOENT;
        }
    }
    uint32_t type = lt ? lt->type : GGUF_T_F32;
    const struct wtype_info *ti = wtype_info(type);
    if (!synth_type_ok(type)) {
        char names[128];
        synth_type_names(names, sizeof names, false);
        util_seterr(c->err, sizeof c->err, "tensor %s: type %s (%" PRIu32 ", from %s) cannot be "
                 "written: only %s can", name, ti ? ti->name : "unknown", type, like, names);
        return -ENOTSUP;
    }
    if (ne[0] % ti->block_elems) {
        util_seterr(c->err, sizeof c->err, "tensor %s: row of %" PRIu64 " values is not a multiple of "
                 "the %s block (%" PRIu32 ")", name, ne[0], ti->name, ti->block_elems);
        return -EINVAL;
    }
    if (c->n == c->cap) {
        util_seterr(c->err, sizeof c->err, "tensor %s: more new tensors than counted (%zu)", name, c->cap);
        return -EOVERFLOW;
    }
    struct synth_tensor *t = &c->ts[c->n++];
    synth_tensor_init(t, name, d, ne, type, c->seed);
    int rc = gguf_writer_add_tensor_fill(c->w, t->name, t->type, t->n_dims, t->ne, synth_fill, t);
    if (rc)
        util_seterr(c->err, sizeof c->err, "adding tensor %s: %s", name, strerror(-rc));
    return rc;
}

/* Write out = from with n_new MTP blocks appended: every key and tensor of from as it is
 * (but <arch>.block_count and <arch>.nextn_predict_layers, each raised by n_new), then the
 * new blocks' tensors, random from (seed, name). The main pass reads none of them, so it is
 * the source's, bit for bit. Returns the exit status. */
static int synth_nextn(const char *from, uint32_t n_new, uint64_t seed, const char *out)
{
    struct stat si, so;   /* writing over the model while it is read would corrupt both */
    if (stat(from, &si) == 0 && stat(out, &so) == 0 && si.st_dev == so.st_dev && si.st_ino == so.st_ino) {
        fprintf(stderr, "kvctl synth: -o %s is the --from model itself: give another output file\n", out);
        return 2;
    }
    char err[KV_ERR_MAX] = "", key[96];
    struct model *m;
    if (model_open(&m, from, -1, -1, err, sizeof err)) {
        /* the gguf module's messages already start with the path */
        bool named = !strncmp(err, from, strlen(from)) && err[strlen(from)] == ':';
        fprintf(stderr, "kvctl synth: %s%s%s\n", named ? "" : from, named ? "" : ": ", err);
        return 1;
    }
    const struct gguf_file *src = model_get_gguf(m);
    const struct model_hparams *hp = model_get_hparams(m);
    const struct model_arch *ad = model_arch_find(hp->arch);
    struct nextn_ctx c = {.src = src, .first = hp->n_block, .like = UINT32_MAX, .seed = seed};
    struct model_hparams h2 = *hp;
    h2.n_block += n_new;
    h2.n_nextn += n_new;
    uint32_t wf, wl;
    int rc = -EINVAL;
    if (gguf_window_get(src, &wf, &wl) == 0) {
        util_seterr(err, sizeof err, "a stage window (layers [%" PRIu32 ", %" PRIu32 ")), not a whole model", wf, wl);
        goto out_model;
    }
    if (!ad || !ad->hybrid) {
        util_seterr(err, sizeof err, "architecture '%s' has no multi-token-prediction blocks (qwen35 and "
                 "qwen35moe have)", hp->arch);
        goto out_model;
    }
    for (uint32_t il = hp->n_layer; il-- > 0;)
        if (!model_layer_is_recurrent(m, il)) {
            c.like = il;
            break;
        }
    if (c.like == UINT32_MAX) {
        util_seterr(err, sizeof err, "no full-attention layer in the main pass to model the MTP block on");
        goto out_model;
    }
    bool tied = gguf_tensor_find(src, "output.weight") == NULL;
    int total = model_arch_tensors(ad, &h2, tied, NULL, NULL);
    if (total < 0 || !(c.ts = calloc((size_t)total, sizeof *c.ts))) {
        rc = total < 0 ? total : -ENOMEM;
        util_seterr(err, sizeof err, "sizing the new blocks: %s", strerror(-rc));
        goto out_model;
    }
    c.cap = (size_t)total;
    if ((rc = gguf_writer_new(&c.w))) {
        util_seterr(err, sizeof err, "a GGUF writer: %s", strerror(-rc));
        goto out_model;
    }
    rc = gguf_writer_copy_kv(c.w, src, NULL, NULL, err, sizeof err);
    snprintf(key, sizeof key, "%s.block_count", hp->arch);
    if (!rc)
        rc = gguf_writer_set_u32(c.w, key, h2.n_block);
    snprintf(key, sizeof key, "%s.nextn_predict_layers", hp->arch);
    if (!rc)
        rc = gguf_writer_set_u32(c.w, key, h2.n_nextn);
    if (rc && !err[0])
        util_seterr(err, sizeof err, "setting %s: %s", key, strerror(-rc));
    for (uint64_t i = 0; i < gguf_tensor_count(src) && !rc; i++) {
        const struct gguf_tensor *t = gguf_tensor_at(src, i);
        if ((rc = gguf_writer_add_tensor_copy(c.w, src, t)))
            util_seterr(err, sizeof err, "copying tensor %s: %s", t->name, strerror(-rc));
    }
    if (!rc && (rc = model_arch_tensors(ad, &h2, tied, nextn_add, &c)) < 0)
        util_seterr(err, sizeof err, "%s", c.err);
    else if (rc > 0)
        rc = 0;
    bool written = false;
    if (!rc)
        written = (rc = gguf_writer_write(c.w, out, err, sizeof err)) == 0;
    /* The copy must read back as the source with more MTP blocks (the reader's caps on
     * block_count apply too); one that does not is removed. */
    struct model *back = NULL;
    char berr[KV_ERR_MAX] = "";
    if (!rc && (rc = model_open(&back, out, -1, -1, berr, sizeof berr)) != 0) {
        util_seterr(err, sizeof err, "the written %s does not load: %s", out, berr);
    } else if (!rc) {
        const struct model_hparams *bh = model_get_hparams(back);
        if (bh->n_layer != hp->n_layer || bh->n_block != h2.n_block || bh->n_nextn != h2.n_nextn) {
            util_seterr(err, sizeof err, "written file reads back with %" PRIu32 " layers + %" PRIu32
                     " MTP blocks, not %" PRIu32 " + %" PRIu32, bh->n_layer, bh->n_nextn, hp->n_layer,
                     h2.n_nextn);
            rc = -EPROTO;
        }
    }
    model_free(back);
    if (rc && written)
        unlink(out);
    if (!rc) {
        char hb[32];
        util_fmt_bytes(hb, sizeof hb, (double)gguf_writer_file_size(c.w), 2, 0);
        printf("%s: %s of %s with %" PRIu32 " MTP block(s) appended: block_count %" PRIu32 " -> %" PRIu32
               ", nextn_predict_layers %" PRIu32 ", %" PRIu64 " tensors copied, %zu new (seed %" PRIu64
               ", types of layer %" PRIu32 "), %s\n", out, hp->arch, from, n_new, hp->n_block, h2.n_block,
               h2.n_nextn, gguf_tensor_count(src), c.n, seed, c.like, hb);
    }
out_model:
    if (rc)
        fprintf(stderr, "kvctl synth: --from %s: %s\n", from, err);
    gguf_writer_free(c.w);
    free(c.ts);
    model_free(m);
    return rc ? 1 : 0;
}

int kvctl_cmd_synth(int argc, char **argv)
{
    const char *arch = "llama", *out = NULL, *tname = "f32", *mname = NULL, *from = NULL,
               *shaped = NULL, *nextn_s = NULL;
    uint64_t layers = 2, embd = 256, ff = 768, heads = 8, kv_heads = 0, head_dim = 0, vocab = 512,
             seed = 1, ctx = 2048, nextn = 0;
    bool tied = false;
    if (kvctl_is_help(argc, argv)) {
        printf("usage: kvctl synth --arch llama|qwen2|qwen3 --layers N --embd D --ff F --heads H\n"
               "                   [--kv-heads K] [--head-dim E] --vocab V\n"
               "                   --type f32|f16|q8_0|q4_0|q4_k|q6_k|q4_k_m [--seed S] [--ctx C]\n"
               "                   [--tied] [--name NAME] -o OUT\n"
               "       kvctl synth --from MODEL --nextn N [--seed S] -o OUT\n"
               "  write a random-weight model with a working SPM vocabulary (<unk> <s> </s>, the 256\n"
               "  byte tokens, scored pieces); 2-D weights in --type, norms (and qwen2 biases) f32.\n"
               "  q4_k_m is llama.cpp's Q4_K_M mixture: Q4_K, but Q6_K for output.weight and for\n"
               "  attn_v and ffn_down of the first and last eighth of the layers and every third\n"
               "  layer between. K types need embd, ff and heads*head-dim multiples of 256.\n"
               "  --tied leaves out output.weight (the head reuses token_embd). Defaults: 2 layers,\n"
               "  256 embd, 768 ff, 8 heads, kv-heads = heads, head-dim = embd/heads, 512 vocab, f32.\n"
               "  --from MODEL --nextn N (1..4): a copy of a qwen35/qwen35moe model with N random\n"
               "  multi-token-prediction blocks appended (block_count and nextn_predict_layers + N);\n"
               "  every key and tensor of MODEL copied as is, so the main pass is MODEL's.\n");
        return 0;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "--tied")) { tied = true; shaped = a; continue; }
        if (!v) {
            fprintf(stderr, "kvctl synth: '%s' needs a value (see --help)\n", a);
            return 2;
        }
        i++;
        if (strcmp(a, "-o") && strcmp(a, "--seed") && strcmp(a, "--from") && strcmp(a, "--nextn"))
            shaped = a;   /* an option of the first form */
        if (!strcmp(a, "--arch")) arch = v;
        else if (!strcmp(a, "-o")) out = v;
        else if (!strcmp(a, "--from")) from = v;
        else if (!strcmp(a, "--nextn")) nextn_s = v;
        else if (!strcmp(a, "--type")) tname = v;
        else if (!strcmp(a, "--name")) mname = v;
        else if (!strcmp(a, "--layers")) bad = kvctl_parse_u64("synth", a, v, 4096, &layers);
        else if (!strcmp(a, "--embd")) bad = kvctl_parse_u64("synth", a, v, 1 << 20, &embd);
        else if (!strcmp(a, "--ff")) bad = kvctl_parse_u64("synth", a, v, 1 << 22, &ff);
        else if (!strcmp(a, "--heads")) bad = kvctl_parse_u64("synth", a, v, 4096, &heads);
        else if (!strcmp(a, "--kv-heads")) bad = kvctl_parse_u64("synth", a, v, 4096, &kv_heads);
        else if (!strcmp(a, "--head-dim")) bad = kvctl_parse_u64("synth", a, v, 1 << 16, &head_dim);
        else if (!strcmp(a, "--vocab")) bad = kvctl_parse_u64("synth", a, v, 1 << 22, &vocab);
        else if (!strcmp(a, "--seed")) bad = kvctl_parse_u64("synth", a, v, UINT64_MAX, &seed);
        else if (!strcmp(a, "--ctx")) bad = kvctl_parse_u64("synth", a, v, 1 << 24, &ctx);
        else {
            fprintf(stderr, "kvctl synth: unknown option '%s' (see --help)\n", a);
            return 2;
        }
        if (bad)
            return 2;
    }
    if (from || nextn_s) {
        char perr[KV_ERR_MAX];
        if (!from || !nextn_s) {
            fprintf(stderr, "kvctl synth: --from MODEL and --nextn N go together (see --help)\n");
            return 2;
        }
        if (shaped) {
            fprintf(stderr, "kvctl synth: %s does not go with --from (the model gives the shapes)\n", shaped);
            return 2;
        }
        if (util_parse_u64(nextn_s, 1, SYNTH_MAX_NEXTN, 0, &nextn, perr, sizeof perr) < 0) {
            fprintf(stderr, "kvctl synth: --nextn %s (MTP blocks to append)\n", perr);
            return 2;
        }
        if (!out) {
            fprintf(stderr, "kvctl synth: -o OUT is required\n");
            return 2;
        }
        return synth_nextn(from, (uint32_t)nextn, seed, out);
    }
    /* Dense attention-only architectures: the options above are all their shapes need. */
    const struct model_arch *ad = model_arch_find(arch);
    bool is_qwen2 = !strcmp(arch, "qwen2"), is_qwen3 = !strcmp(arch, "qwen3");
    if (!ad || ad->moe || ad->hybrid) {
        fprintf(stderr, "kvctl synth: --arch '%s' not one of llama, qwen2, qwen3\n", arch);
        return 2;
    }
    if (!out) {
        fprintf(stderr, "kvctl synth: -o OUT is required\n");
        return 2;
    }
    const struct synth_ftype *ft = NULL;
    for (size_t i = 0; i < SYNTH_N_FTYPES && !ft; i++)
        if (!strcasecmp(tname, synth_ftypes[i].name))
            ft = &synth_ftypes[i];
    if (!ft) {
        char names[128];
        synth_type_names(names, sizeof names, true);
        fprintf(stderr, "kvctl synth: --type '%s' not one of %s\n", tname, names);
        return 2;
    }
    uint32_t type = ft->type;
    if (!kv_heads)
        kv_heads = heads;
    const struct { const char *name; uint64_t v; } pos[] = {
        {"--layers", layers}, {"--embd", embd}, {"--ff", ff}, {"--heads", heads}};
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
        if (!pos[i].v) {
            fprintf(stderr, "kvctl synth: %s 0: must be at least 1\n", pos[i].name);
            return 2;
        }
    if (heads % kv_heads) {
        fprintf(stderr, "kvctl synth: --heads %" PRIu64 " is not a multiple of --kv-heads %" PRIu64
                "\n", heads, kv_heads);
        return 2;
    }
    if (!head_dim) {
        if (embd % heads) {
            fprintf(stderr, "kvctl synth: embd %" PRIu64 " is not a multiple of heads %" PRIu64
                    "; give --head-dim\n", embd, heads);
            return 2;
        }
        head_dim = embd / heads;
    }
    if (head_dim % 2) {
        fprintf(stderr, "kvctl synth: head-dim %" PRIu64 " must be even (RoPE pairs)\n", head_dim);
        return 2;
    }
    if (vocab < 259 + 1) {
        fprintf(stderr, "kvctl synth: vocab %" PRIu64 " too small (3 specials + 256 byte tokens + pieces: >= 260)\n", vocab);
        return 2;
    }
    uint32_t be = wtype_info(type)->block_elems; /* Q4_K_M's Q6_K has the same block */
    uint64_t q_dim = heads * head_dim;
    if (embd % be || ff % be || q_dim % be) {
        fprintf(stderr, "kvctl synth: embd %" PRIu64 ", ff %" PRIu64 " and heads*head-dim %" PRIu64
                " must be multiples of the %s block size %u\n", embd, ff, q_dim, ft->name, be);
        return 2;
    }

    struct gguf_writer *w;
    struct vocab voc;
    char key[128];
    int rc = gguf_writer_new(&w);
    if (rc)
        return 1;
    rc = vocab_build(&voc, vocab);
    char name[128];
    snprintf(name, sizeof name, "%s", mname ? mname : "kvasir-synth");
#define SETK(fmt, fn, val) do { snprintf(key, sizeof key, fmt, arch); if (!rc) rc = fn(w, key, val); } while (0)
    if (!rc) rc = gguf_writer_set_str(w, "general.architecture", arch);
    if (!rc) rc = gguf_writer_set_str(w, "general.name", name);
    if (!rc) rc = gguf_writer_set_u32(w, "general.file_type", ft->file_type);
    if (!rc && type != GGUF_T_F32 && type != GGUF_T_F16)
        rc = gguf_writer_set_u32(w, "general.quantization_version", 2);
    SETK("%s.context_length", gguf_writer_set_u32, (uint32_t)ctx);
    SETK("%s.embedding_length", gguf_writer_set_u32, (uint32_t)embd);
    SETK("%s.block_count", gguf_writer_set_u32, (uint32_t)layers);
    SETK("%s.feed_forward_length", gguf_writer_set_u32, (uint32_t)ff);
    SETK("%s.attention.head_count", gguf_writer_set_u32, (uint32_t)heads);
    SETK("%s.attention.head_count_kv", gguf_writer_set_u32, (uint32_t)kv_heads);
    SETK("%s.rope.dimension_count", gguf_writer_set_u32, (uint32_t)head_dim);
    SETK("%s.rope.freq_base", gguf_writer_set_f32, is_qwen2 || is_qwen3 ? 1000000.0f : 10000.0f);
    SETK("%s.attention.layer_norm_rms_epsilon", gguf_writer_set_f32, is_qwen2 || is_qwen3 ? 1e-6f : 1e-5f);
    SETK("%s.vocab_size", gguf_writer_set_u32, (uint32_t)vocab);
    if (is_qwen3 || head_dim * heads != embd) {
        SETK("%s.attention.key_length", gguf_writer_set_u32, (uint32_t)head_dim);
        SETK("%s.attention.value_length", gguf_writer_set_u32, (uint32_t)head_dim);
    }
#undef SETK
    if (!rc) rc = gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    if (!rc) rc = gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", voc.n, (const char *const *)voc.tok);
    if (!rc) rc = gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_V_F32, voc.n, voc.score);
    if (!rc) rc = gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_V_I32, voc.n, voc.type);
    if (!rc) rc = gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    if (!rc) rc = gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    if (!rc) rc = gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    if (!rc) rc = gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true);
    if (!rc) rc = gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", false);
    vocab_free(&voc);

    /* tensors: as the architecture table lists them for these hyperparameters */
    struct model_hparams hp = {
        .n_layer = (uint32_t)layers, .n_block = (uint32_t)layers, .n_embd = (uint32_t)embd,
        .n_ff = (uint32_t)ff, .n_head = (uint32_t)heads, .n_head_kv = (uint32_t)kv_heads,
        .head_dim = (uint32_t)head_dim, .n_rot = (uint32_t)head_dim, .n_vocab = (uint32_t)vocab,
    };
    snprintf(hp.arch, sizeof hp.arch, "%s", arch);
    struct synth_ctx sc = {.w = w, .ft = ft, .n_layer = (uint32_t)layers, .tied = tied, .seed = seed};
    int max_t = model_arch_tensors(ad, &hp, tied, NULL, NULL);
    sc.ts = calloc((size_t)max_t, sizeof *sc.ts);
    if (!sc.ts && !rc)
        rc = -ENOMEM;
    if (!rc) {
        int n = model_arch_tensors(ad, &hp, tied, synth_add, &sc);
        rc = n < 0 ? n : 0;
    }
    size_t nt = sc.n;
    char err[KV_ERR_MAX] = "";
    if (!rc)
        rc = gguf_writer_write(w, out, err, sizeof err);
    else
        snprintf(err, sizeof err, "building the model description: %s", strerror(-rc));
    if (!rc) {
        char hb[32];
        util_fmt_bytes(hb, sizeof hb, (double)gguf_writer_file_size(w), 2, 0);
        printf("%s: %s, %" PRIu64 " layers, embd %" PRIu64 ", ff %" PRIu64 ", heads %" PRIu64 "/%" PRIu64
               ", head_dim %" PRIu64 ", vocab %" PRIu64 ", %s, %zu tensors, %s\n", out, arch, layers, embd, ff,
               heads, kv_heads, head_dim, vocab, ft->name, nt, hb);
    } else {
        fprintf(stderr, "kvctl synth: %s\n", err);
    }
    free(sc.ts);
    gguf_writer_free(w);
    return rc ? 1 : 0;
}

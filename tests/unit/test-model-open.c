/* test-model-open: hostile or unsupported hyperparameters are refused by model_open with a
 * message naming the field (each case is stories260K rewritten with one metadata key changed
 * by the gguf writer), harmless changes still open; and Llama 3.1 style RoPE frequency
 * factors (rope_freqs.weight) act as they should, in every window. */
#include <errno.h>

#include "gguf/gguf.h"
#include "model/model.h"
#include "tests/lib/t.h"
#include "util/err.h"

struct override {
    const char *key;
    const char *str;     /* string value, or NULL for u32 */
    uint32_t u;
    const char *expect;  /* substring of the error message; NULL: must open */
};

static const struct override cases[] = {
    {"general.architecture", "gpt2", 0, "architecture 'gpt2' is not supported"},
    {"general.architecture", "mamba", 0, "architecture 'mamba'"},
    {"llama.attention.head_count", NULL, 0, "llama.attention.head_count"},
    {"llama.attention.head_count_kv", NULL, 3, "head_count_kv"},
    {"llama.attention.head_count_kv", NULL, 9, "llama.attention.head_count_kv = 9"},
    {"llama.embedding_length", NULL, 65, "blk.0.attn_norm.weight: shape [64, 1], expected [65]"},
    {"llama.feed_forward_length", NULL, 171, "blk.0.ffn_gate.weight: shape"},
    {"llama.rope.dimension_count", NULL, 7, "rope.dimension_count 7 is odd"},
    {"llama.rope.dimension_count", NULL, 16, "llama.rope.dimension_count = 16"},
    {"llama.block_count", NULL, 6, "tensor blk.5.attn_norm.weight missing"},
    {"llama.block_count", NULL, 100000, "llama.block_count = 100000 out of range"},
    {"llama.block_count", NULL, 0, "llama.block_count = 0 out of range"},
    {"llama.attention.key_length", NULL, 5000, "key_length = 5000 out of range"},
    {"llama.attention.key_length", NULL, 16, "blk.0.attn_q.weight: shape"},
    {"llama.attention.value_length", NULL, 16, "value_length 16 != key_length 8"},
    {"llama.expert_count", NULL, 8, "expert_count = 8"},
    {"llama.rope.scaling.type", "yarn", 0, "only linear RoPE scaling"},
    {"llama.rope.scaling.type", "linear", 0, NULL},
    {"llama.context_length", NULL, 4096, NULL},
};

/* An extra tensor for rewrite(). */
struct extra {
    const char *name;
    uint32_t type;
    uint64_t ne0;
    const void *data;
};

/* Copy src to dst with one key replaced (or added), maybe more keys set by keys(w), and maybe
 * one tensor added. */
static int rewrite_x(const char *src, const char *dst, const struct override *o,
                     int (*keys)(struct gguf_writer *w), const struct extra *x)
{
    char err[KV_ERR_MAX] = "";
    struct gguf_file *gf = NULL;
    struct gguf_writer *w = NULL;
    int rc = gguf_file_open(&gf, src, err, sizeof err);
    if (!rc)
        rc = gguf_file_map_tensors(gf, NULL, NULL, err, sizeof err);
    if (!rc)
        rc = gguf_writer_new(&w);
    for (uint64_t i = 0; !rc && i < gguf_kv_count(gf); i++) {
        const struct gguf_kv *kv = gguf_kv_at(gf, i);
        rc = gguf_writer_set(w, kv->key, &kv->val);
    }
    if (!rc && o)
        rc = o->str ? gguf_writer_set_str(w, o->key, o->str) : gguf_writer_set_u32(w, o->key, o->u);
    if (!rc && keys)
        rc = keys(w);
    if (!rc && x)
        rc = gguf_writer_add_tensor(w, x->name, x->type, 1, &x->ne0, x->data);
    for (uint64_t i = 0; !rc && i < gguf_tensor_count(gf); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(gf, i);
        rc = gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data);
    }
    if (!rc)
        rc = gguf_writer_write(w, dst, err, sizeof err);
    T_CHECK(rc == 0, "rewrite %s: %d %s", o ? o->key : x ? x->name : "keys", rc, err);
    gguf_writer_free(w);
    gguf_file_free(gf);
    return rc;
}

/* RoPE scaling keys of the linear copy: type "linear", factor 2.0 (an f32 key). */
static int linear_scaling(struct gguf_writer *w)
{
    int rc = gguf_writer_set_str(w, "llama.rope.scaling.type", "linear");
    return rc ? rc : gguf_writer_set_f32(w, "llama.rope.scaling.factor", 2.0f);
}

static int rewrite(const char *src, const char *dst, const struct override *o)
{
    return rewrite_x(src, dst, o, NULL, NULL);
}

/* Logits of a fixed token sequence through windows bounds[0..nw] of path (fed one batch). */
static float *logits_of(const char *path, const int *bounds, int nw, uint32_t *n_vocab)
{
    static const int32_t tok[] = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315};
    const uint32_t n = sizeof tok / sizeof tok[0];
    struct model *m[3] = {0};
    struct model_exec *e[3] = {0};
    float *x = NULL, *out = NULL;
    char err[KV_ERR_MAX] = "";
    int rc = 0;
    for (int i = 0; !rc && i < nw; i++) {
        rc = model_open(&m[i], path, bounds[i], bounds[i + 1], err, sizeof err);
        if (!rc)
            rc = model_exec_new(&e[i], m[i], 1, 32, 32);
        if (!rc)
            rc = model_session_new(e[i], 1);
    }
    T_CHECK(rc == 0, "open %s: %d %s", path, rc, err);
    if (!rc) {
        const struct model_hparams *hp = model_get_hparams(m[0]);
        *n_vocab = hp->n_vocab;
        x = malloc((size_t)n * hp->n_embd * sizeof(float));
        out = malloc((size_t)n * hp->n_vocab * sizeof(float));
        rc = model_embed(e[0], tok, n, x);
        for (int i = 0; !rc && i < nw; i++)
            rc = model_window_run(e[i], 1, 0, n, x);
        if (!rc)
            rc = model_head(e[nw - 1], x, n, out);
        T_CHECK(rc == 0, "run %s: %d", path, rc);
    }
    for (int i = 0; i < nw; i++) {
        model_exec_free(e[i]);
        model_free(m[i]);
    }
    free(x);
    if (rc) {
        free(out);
        return NULL;
    }
    return out;
}

T_CASE(rope_freqs)
{
    char src[1024], a[512], b[512];
    if (!t_data_path(src, sizeof src, "models/stories260K.gguf"))
        return;
    snprintf(a, sizeof a, "%s/ff.gguf", t_tmpdir());
    snprintf(b, sizeof b, "%s/lin.gguf", t_tmpdir());
    /* stories260K rotates n_rot = 8 dims: 4 pairs. Every factor 2 halves every angle, which
     * is what linear RoPE scaling by 2 does (an exact power of two: the same bits). */
    static const float two[4] = {2, 2, 2, 2}, mixed[4] = {1, 1, 4, 8}, bad[3] = {1, 1, 1};
    const struct extra ff = {"rope_freqs.weight", GGUF_T_F32, 4, two};
    if (rewrite_x(src, a, NULL, NULL, &ff))
        return;
    /* the linear copy: type "linear" and factor 2.0 (f32 key) */
    T_ASSERT(rewrite_x(src, b, NULL, linear_scaling, NULL) == 0, "linear copy");

    const int one[] = {0, 5}, three[] = {0, 1, 3, 5};
    uint32_t V = 0;
    float *plain = logits_of(src, one, 1, &V);
    float *with_ff = logits_of(a, one, 1, &V);
    float *with_ff3 = logits_of(a, three, 3, &V);
    float *linear = logits_of(b, one, 1, &V);
    size_t bytes = (size_t)12 * V * sizeof(float);
    if (plain && with_ff && with_ff3 && linear) {
        T_CHECK(memcmp(plain, with_ff, bytes) != 0, "rope_freqs had no effect");
        T_CHECK(!memcmp(with_ff, linear, bytes), "factors of 2 differ from linear scaling by 2");
        T_CHECK(!memcmp(with_ff, with_ff3, bytes), "rope_freqs: 3 windows differ from one");
    }
    free(plain);
    free(with_ff);
    free(with_ff3);
    free(linear);

    /* uneven factors still run; a factor vector of the wrong length is refused by name */
    const struct extra ffm = {"rope_freqs.weight", GGUF_T_F32, 4, mixed};
    if (!rewrite_x(src, a, NULL, NULL, &ffm)) {
        float *l = logits_of(a, one, 1, &V);
        T_CHECK(l != NULL, "mixed factors");
        free(l);
    }
    const struct extra ffb = {"rope_freqs.weight", GGUF_T_F32, 3, bad};
    if (!rewrite_x(src, a, NULL, NULL, &ffb)) {
        struct model *m = NULL;
        char merr[KV_ERR_MAX] = "";
        int rc = model_open(&m, a, -1, -1, merr, sizeof merr);
        T_CHECK(rc < 0 && strstr(merr, "rope_freqs.weight: shape [3, 1], expected [4]"),
                "short rope_freqs: %d '%s'", rc, merr);
        model_free(m);
    }
    unlink(a);
    unlink(b);
}

T_CASE(hostile_hparams)
{
    char src[1024], dst[512];
    if (!t_data_path(src, sizeof src, "models/stories260K.gguf"))
        return;
    snprintf(dst, sizeof dst, "%s/m.gguf", t_tmpdir());
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const struct override *o = &cases[i];
        if (rewrite(src, dst, o))
            continue;
        struct model *m = NULL;
        char err[KV_ERR_MAX] = "";
        int rc = model_open(&m, dst, -1, -1, err, sizeof err);
        if (o->expect)
            T_CHECK(rc < 0 && !m && strstr(err, o->expect),
                    "%s: rc %d, message '%s', expected '%s'", o->key, rc, err, o->expect);
        else
            T_CHECK(rc == 0, "%s: %d %s", o->key, rc, err);
        model_free(m);
        unlink(dst);
    }
}

int main(int argc, char **argv)
{
    t_init(argc, argv);
    T_RUN(hostile_hparams);
    T_RUN(rope_freqs);
    return T_DONE();
}

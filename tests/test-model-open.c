/* test-model-open: hostile or unsupported hyperparameters are refused by model_open with a
 * message naming the field (each case is stories260K rewritten with one metadata key changed
 * by the gguf writer), and the unmodified copy still opens. */
#include <errno.h>

#include "gguf/gguf.h"
#include "model/model.h"
#include "tests/t.h"

struct override {
    const char *key;
    const char *str;     /* string value, or NULL for u32 */
    uint32_t u;
    const char *expect;  /* substring of the error message; NULL: must open */
};

static const struct override cases[] = {
    {"general.architecture", "gpt2", 0, "architecture 'gpt2' is not supported"},
    {"general.architecture", "qwen35moe", 0, "architecture 'qwen35moe'"},
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

/* Copy src to dst with one key replaced (or added). */
static int rewrite(const char *src, const char *dst, const struct override *o)
{
    char err[GGUF_ERR_LEN] = "";
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
    if (!rc)
        rc = o->str ? gguf_writer_set_str(w, o->key, o->str) : gguf_writer_set_u32(w, o->key, o->u);
    for (uint64_t i = 0; !rc && i < gguf_tensor_count(gf); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(gf, i);
        rc = gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data);
    }
    if (!rc)
        rc = gguf_writer_write(w, dst, err, sizeof err);
    T_CHECK(rc == 0, "rewrite %s: %d %s", o->key, rc, err);
    gguf_writer_free(w);
    gguf_file_free(gf);
    return rc;
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
        char err[MODEL_ERR_LEN] = "";
        int rc = model_open(&m, dst, -1, -1, err, sizeof err);
        if (o->expect)
            T_CHECK(rc < 0 && !m && strstr(err, o->expect),
                    "%s: rc %d, message '%s', expected '%s'", o->key, rc, err, o->expect);
        else
            T_CHECK(rc == 0, "%s: %d %s", o->key, rc, err);
        model_free(m);
        unlink(dst);
    }
    rmdir(t_tmpdir());
}

int main(void)
{
    T_RUN(hostile_hparams);
    return T_DONE();
}

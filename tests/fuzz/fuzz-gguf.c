/* fuzz-gguf: libFuzzer target for the GGUF reader (and the catalog JSON parser on the side).
 * The input is a file prefix: parsed with its size known (must fail or succeed, never -EAGAIN)
 * and unknown (may say "need more"); whatever parses is walked completely, rewritten, and the
 * rewritten header must parse to the same shape.
 * fuzz-modules: util wtype gguf */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "util/err.h"
#include "wtype/wtype.h"

static volatile uint64_t sink;

static void walk_value(const struct gguf_value *v, int depth)
{
    if (depth > GGUF_MAX_NEST + 1)
        abort(); /* the parser promised a depth cap */
    switch (v->type) {
    case GGUF_V_STRING:
        if (v->v.str.len)
            sink += (uint8_t)v->v.str.p[0] + (uint8_t)v->v.str.p[v->v.str.len - 1];
        break;
    case GGUF_V_ARRAY:
        if (v->v.arr.items) {
            for (uint64_t i = 0; i < v->v.arr.n; i++)
                walk_value(&v->v.arr.items[i], depth + 1);
        } else if (v->v.arr.n) {
            static const uint8_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
            const uint8_t *p = v->v.arr.data;
            sink += p[0] + p[v->v.arr.n * sz[v->v.arr.type] - 1];
        }
        break;
    default:
        sink += v->v.u;
    }
}

static void walk(const struct gguf_file *f, size_t size)
{
    for (uint64_t i = 0; i < gguf_kv_count(f); i++) {
        const struct gguf_kv *kv = gguf_kv_at(f, i);
        if (gguf_kv_find(f, kv->key) != kv)
            abort(); /* keys are unique and findable */
        walk_value(&kv->val, 0);
    }
    uint32_t u32;
    uint64_t u64;
    int64_t i64;
    float fl;
    bool b;
    char s[64];
    const struct gguf_value *a;
    sink += gguf_get_u32(f, "general.alignment", &u32) + gguf_get_u64(f, "llama.block_count", &u64) +
            gguf_get_i64(f, "x", &i64) + gguf_get_f32(f, "llama.rope.freq_base", &fl) +
            gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &b) +
            gguf_get_str(f, "general.architecture", s, sizeof s) +
            gguf_get_arr(f, "tokenizer.ggml.tokens", &a) + gguf_block_count(f, &u32);
    for (uint64_t i = 0; i < gguf_tensor_count(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        if (gguf_tensor_find(f, t->name) != t || !wtype_info(t->type))
            abort();
        if (t->offset % gguf_file_alignment(f))
            abort();
        if (size != SIZE_MAX && gguf_file_data_offset(f) + t->offset + t->size > size)
            abort(); /* bounds were promised */
        sink += (uint64_t)gguf_tensor_layer(t->name) + gguf_window_wants(t->name, 0, 2, 4, 5, true);
    }
}

/* What parses must be writable, and the written header must parse to the same shape. */
static void rewrite(const struct gguf_file *f)
{
    struct gguf_writer *w;
    if (gguf_writer_new(&w))
        return;
    for (uint64_t i = 0; i < gguf_kv_count(f); i++) {
        const struct gguf_kv *kv = gguf_kv_at(f, i);
        if (gguf_writer_set(w, kv->key, &kv->val))
            abort();
    }
    for (uint64_t i = 0; i < gguf_tensor_count(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        if (gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, "") != 0)
            abort();
    }
    void *hdr;
    size_t len;
    if (gguf_writer_header(w, &hdr, &len) == 0) {
        struct gguf_file *g;
        size_t need;
        char err[KV_ERR_MAX];
        if (gguf_file_parse(&g, hdr, len, UINT64_MAX, &need, err, sizeof err) != 0)
            abort();
        if (gguf_kv_count(g) != gguf_kv_count(f) || gguf_tensor_count(g) != gguf_tensor_count(f) ||
            gguf_file_alignment(g) != gguf_file_alignment(f) || gguf_file_data_offset(g) != len)
            abort();
        gguf_file_free(g);
        free(hdr);
    }
    gguf_writer_free(w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[KV_ERR_MAX];
    struct gguf_file *f = NULL;
    size_t need = 0;
    int rc = gguf_file_parse(&f, data, size, size, &need, err, sizeof err);
    if (rc == -EAGAIN)
        abort(); /* with the file size known, a short file is an error, not "need more" */
    if (rc == 0) {
        walk(f, size);
        gguf_file_free(f);
    } else if (!err[0]) {
        abort(); /* every failure says why */
    }
    rc = gguf_file_parse(&f, data, size, UINT64_MAX, &need, err, sizeof err);
    if (rc == -EAGAIN && need <= size)
        abort();
    if (rc == 0) {
        walk(f, SIZE_MAX);
        if (gguf_tensor_count(f) < 4096)
            rewrite(f);
        /* the metadata digest over whatever the header holds, against an empty catalog */
        static const struct gguf_catalog empty;
        if (gguf_catalog_verify_metadata(&empty, f, err, sizeof err) == 0 && gguf_kv_count(f) > 3)
            abort(); /* a header with keys cannot match an empty list */
        gguf_file_free(f);
    }
    /* the same bytes as catalog JSON */
    struct gguf_catalog *c;
    if (gguf_catalog_from_json(&c, (const char *)data, size, NULL, err, sizeof err) == 0) {
        for (uint64_t i = 0; i < c->n_tensors; i++)
            sink += c->tensors[i].size;
        uint64_t lo, hi;   /* sums over hostile sizes saturate, never wrap */
        if (c->n_main && gguf_catalog_window_bound(c, 0, c->n_main, &lo, &hi) == 0 && hi < lo)
            abort();
        gguf_catalog_free(c);
    }
    return 0;
}

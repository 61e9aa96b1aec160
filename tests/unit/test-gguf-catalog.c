/* test-gguf-catalog.c — the catalog's metadata digest (docs/gguf.md, "The metadata digest"):
 * key order and the window keys do not count, a change of any value, of a type, or a key
 * more or less does and is named; the JSON round-trips and a list that does not hash to its
 * metadata_sha256, is unsorted or is version 1 is refused; a window's size lies inside
 * gguf_catalog_window_bound. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "tests/lib/t.h"
#include "util/err.h"

/* The variants of one small model file: which key (if any) to change, and how. */
enum variant {
    V_BASE, V_REORDER, V_U8, V_I32, V_F32, V_BOOL, V_STR, V_ARR_U32, V_ARR_STR, V_NESTED,
    V_TYPE, V_EXTRA, V_MISSING, V_COUNT
};
static const char *variant_key[V_COUNT] = {
    [V_U8] = "test.u8", [V_I32] = "test.i32", [V_F32] = "test.f32", [V_BOOL] = "test.bool",
    [V_STR] = "general.name", [V_ARR_U32] = "test.arr_u32", [V_ARR_STR] = "tokenizer.ggml.tokens",
    [V_NESTED] = "test.nested", [V_TYPE] = "llama.block_count", [V_EXTRA] = "test.extra",
    [V_MISSING] = "test.u8",
};

static void set_nested(struct gguf_writer *w, uint32_t last)
{
    uint32_t a[2] = {1, 2}, b[2] = {3, last};
    struct gguf_value items[2] = {
        {.type = GGUF_V_ARRAY, .v.arr = {.type = GGUF_V_U32, .n = 2, .data = a}},
        {.type = GGUF_V_ARRAY, .v.arr = {.type = GGUF_V_U32, .n = 2, .data = b}},
    };
    struct gguf_value v = {.type = GGUF_V_ARRAY, .v.arr = {.type = GGUF_V_ARRAY, .n = 2, .items = items}};
    T_CHECK(gguf_writer_set(w, "test.nested", &v) == 0, "nested array");
}

static void write_model(const char *path, enum variant var)
{
    struct gguf_writer *w;
    char err[KV_ERR_MAX];
    T_ASSERT(gguf_writer_new(&w) == 0, "writer");
    const char *toks[3] = {"a", var == V_ARR_STR ? "C" : "b", "c"};
    uint32_t arr[3] = {1, 2, var == V_ARR_U32 ? 4u : 3u};
    if (var == V_REORDER) { /* the same keys in another order, and the window keys */
        gguf_writer_set_u32(w, "kvasir.window.first", 0);
        gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", 3, toks);
        gguf_writer_set_arr(w, "test.arr_u32", GGUF_V_U32, 3, arr);
        set_nested(w, 4);
        gguf_writer_set_str(w, "general.name", "tiny");
        gguf_writer_set_u32(w, "llama.block_count", 2);
        gguf_writer_set_str(w, "general.architecture", "llama");
    } else {
        gguf_writer_set_str(w, "general.architecture", "llama");
        if (var == V_TYPE) { /* the same number as an i32 */
            struct gguf_value v = {.type = GGUF_V_I32, .v.i = 2};
            gguf_writer_set(w, "llama.block_count", &v);
        } else {
            gguf_writer_set_u32(w, "llama.block_count", 2);
        }
        gguf_writer_set_str(w, "general.name", var == V_STR ? "tinY" : "tiny");
        gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", 3, toks);
        gguf_writer_set_arr(w, "test.arr_u32", GGUF_V_U32, 3, arr);
        set_nested(w, var == V_NESTED ? 5 : 4);
    }
    struct gguf_value u8 = {.type = GGUF_V_U8, .v.u = var == V_U8 ? 8 : 7};
    struct gguf_value i32 = {.type = GGUF_V_I32, .v.i = var == V_I32 ? 5 : -5};
    struct gguf_value b = {.type = GGUF_V_BOOL, .v.u = var == V_BOOL ? 0 : 1};
    if (var != V_MISSING)
        gguf_writer_set(w, "test.u8", &u8);
    gguf_writer_set(w, "test.i32", &i32);
    gguf_writer_set_f32(w, "test.f32", var == V_F32 ? 0.5f + 1.0f / (1 << 20) : 0.5f);
    gguf_writer_set(w, "test.bool", &b);
    if (var == V_EXTRA)
        gguf_writer_set_u32(w, "test.extra", 1);
    if (var == V_REORDER) {
        gguf_writer_set_u32(w, "kvasir.window.last", 2);
        gguf_writer_set_str(w, "kvasir.source.sha256",
                            "0000000000000000000000000000000000000000000000000000000000000000");
    }
    static float data[4 * 8];
    uint64_t ne[2] = {8, 4};
    static const char *names[] = {"token_embd.weight", "blk.0.a.weight", "blk.1.a.weight", "output_norm.weight"};
    for (size_t i = 0; i < 4; i++)
        T_CHECK(gguf_writer_add_tensor(w, names[i], GGUF_T_F32, 2, ne, data) == 0, "add %s", names[i]);
    int rc = gguf_writer_write(w, path, err, sizeof err);
    gguf_writer_free(w);
    T_ASSERT(rc == 0, "write %s: %s", path, err);
}

static void base_catalog(struct gguf_catalog **out)
{
    char path[1024], err[KV_ERR_MAX];
    snprintf(path, sizeof path, "%s/base.gguf", t_tmpdir());
    write_model(path, V_BASE);
    struct gguf_file *f;
    T_ASSERT(gguf_file_open(&f, path, err, sizeof err) == 0, "%s", err);
    struct gguf_catalog *c;
    T_ASSERT(gguf_catalog_build(&c, f, err, sizeof err) == 0, "catalog: %s", err);
    gguf_file_free(f);
    *out = c;
}

/* Key order and the window keys do not count; every change names its key. */
T_CASE(metadata_digest)
{
    struct gguf_catalog *c;
    base_catalog(&c);
    T_CHECK(c->n_meta == 10, "%llu keys listed, want 10", (unsigned long long)c->n_meta);
    for (uint64_t i = 1; i < c->n_meta; i++)
        T_CHECK(strcmp(c->meta[i - 1].key, c->meta[i].key) < 0, "list not sorted at %s", c->meta[i].key);
    for (int v = V_REORDER; v < V_COUNT; v++) {
        char path[1024], err[KV_ERR_MAX] = "";
        snprintf(path, sizeof path, "%s/v%d.gguf", t_tmpdir(), v);
        write_model(path, (enum variant)v);
        struct gguf_file *f;
        T_ASSERT(gguf_file_open(&f, path, err, sizeof err) == 0, "%s", err);
        int rc = gguf_catalog_verify_metadata(c, f, err, sizeof err);
        if (v == V_REORDER) {
            T_CHECK(rc == 0, "reordered keys + window keys refused: %s", err);
        } else {
            char want[200];
            snprintf(want, sizeof want, "metadata %s: ", variant_key[v]);
            T_CHECK(rc == -EBADMSG && strstr(err, want), "variant %d: rc %d, '%s' lacks '%s'", v, rc, err, want);
        }
        gguf_file_free(f);
    }
    gguf_catalog_free(c);
}

/* JSON: round trip; a tampered digest, an unsorted list, version 1 refused. */
T_CASE(catalog_json)
{
    struct gguf_catalog *c, *d;
    base_catalog(&c);
    char *json, id[65], id2[65], err[KV_ERR_MAX];
    size_t len;
    T_ASSERT(gguf_catalog_to_json(c, &json, &len, id) == 0, "to_json");
    T_ASSERT(gguf_catalog_from_json(&d, json, len, id2, err, sizeof err) == 0, "from_json: %s", err);
    T_CHECK(!strcmp(id, id2), "id changed");
    T_CHECK(d->n_meta == c->n_meta && !strcmp(d->metadata_sha256, c->metadata_sha256) && d->n_main == 2,
            "metadata list or n_main not kept");
    for (uint64_t i = 0; i < c->n_meta && i < d->n_meta; i++)
        T_CHECK(!strcmp(c->meta[i].key, d->meta[i].key) && !strcmp(c->meta[i].sha256, d->meta[i].sha256),
                "entry %llu differs", (unsigned long long)i);
    gguf_catalog_free(d);

    /* one digit of one key's digest changed: the overall digest no longer matches */
    char *p = strstr(json, "\"key\":\t\"test.u8\"");
    T_ASSERT(p, "test.u8 entry not found in %.200s", json);
    p = strstr(p, "\"sha256\":\t\"") + 11;
    *p = *p == '0' ? '1' : '0';
    T_CHECK(gguf_catalog_from_json(&d, json, len, NULL, err, sizeof err) == -EBADMSG &&
            strstr(err, "is not the digest of its metadata list"), "tampered list: %s", err);
    *p = *p == '0' ? '1' : '0';
    /* two keys swapped: unsorted */
    char *a = strstr(json, "\"general.architecture\""), *b = strstr(json, "\"general.name\"");
    T_ASSERT(a && b, "keys not found");
    char *sw = malloc(len + 1);
    memcpy(sw, json, len + 1);
    memcpy(sw + (a - json), "\"general.name\"", 14);
    T_CHECK(gguf_catalog_from_json(&d, sw, len, NULL, err, sizeof err) == -EBADMSG, "repeated key accepted");
    free(sw);
    char *v = strstr(json, "\"version\":\t2");
    T_ASSERT(v, "version not found");
    v[11] = '1';
    T_CHECK(gguf_catalog_from_json(&d, json, len, NULL, err, sizeof err) == -EBADMSG &&
            strstr(err, "re-run kvctl catalog"), "version 1: %s", err);
    free(json);
    gguf_catalog_free(c);
}

/* Each window's file size lies inside the bound the catalog gives; a range outside refused. */
T_CASE(window_bound)
{
    char path[1024], out[1100], err[KV_ERR_MAX];
    snprintf(path, sizeof path, "%s/base.gguf", t_tmpdir());
    struct gguf_catalog *c;
    base_catalog(&c);
    struct gguf_file *f;
    T_ASSERT(gguf_file_open(&f, path, err, sizeof err) == 0, "%s", err);
    static const uint32_t win[][2] = {{0, 1}, {1, 2}, {0, 2}};
    for (size_t i = 0; i < 3; i++) {
        snprintf(out, sizeof out, "%s.w%zu", path, i);
        struct gguf_window_opts o = {win[i][0], win[i][1], NULL};
        T_ASSERT(gguf_window_write(f, &o, out, err, sizeof err) == 0, "window: %s", err);
        struct gguf_file *g;
        T_ASSERT(gguf_file_open(&g, out, err, sizeof err) == 0, "%s", err);
        uint64_t lo, hi, size = gguf_file_size(g);
        T_CHECK(gguf_catalog_window_bound(c, o.first, o.last, &lo, &hi) == 0, "bound");
        T_CHECK(lo <= size && size <= hi, "[%u,%u): %llu bytes outside [%llu, %llu]", o.first, o.last,
                (unsigned long long)size, (unsigned long long)lo, (unsigned long long)hi);
        /* the source's header, the window keys' room and at most the alignment per tensor */
        T_CHECK(hi <= gguf_file_size(f) + 4096 + 4 * 64, "[%u,%u): bound %llu beyond the source's %llu bytes + 4352",
                o.first, o.last, (unsigned long long)hi, (unsigned long long)gguf_file_size(f));
        T_CHECK(gguf_catalog_verify(c, g, err, sizeof err) == 0, "verify: %s", err);
        gguf_file_free(g);
    }
    uint64_t lo, hi;
    T_CHECK(gguf_catalog_window_bound(c, 1, 3, &lo, &hi) == -EINVAL, "[1,3) of 2 layers accepted");
    T_CHECK(gguf_catalog_window_bound(c, 1, 1, &lo, &hi) == -EINVAL, "empty window accepted");
    gguf_file_free(f);
    gguf_catalog_free(c);
}

int main(int argc, char **argv)
{
    t_init(argc, argv);
    T_RUN(metadata_digest);
    T_RUN(catalog_json);
    T_RUN(window_bound);
    return T_DONE();
}

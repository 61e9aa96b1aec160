/* test-gguf-models: the reader on every shared test model, write -> read round trips, and
 * stage windows (2 and 3 per model): right tensors, identical bytes, all metadata kept. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>

#include "gguf/gguf.h"
#include "tests/lib/t.h"
#include "util/err.h"

static bool value_eq(const struct gguf_value *a, const struct gguf_value *b)
{
    if (a->type != b->type)
        return false;
    switch (a->type) {
    case GGUF_V_STRING:
        return a->v.str.len == b->v.str.len && !memcmp(a->v.str.p, b->v.str.p, a->v.str.len);
    case GGUF_V_F32: case GGUF_V_F64:
        return !memcmp(&a->v.f, &b->v.f, sizeof a->v.f);
    case GGUF_V_ARRAY: {
        if (a->v.arr.type != b->v.arr.type || a->v.arr.n != b->v.arr.n)
            return false;
        if (a->v.arr.type == GGUF_V_STRING || a->v.arr.type == GGUF_V_ARRAY) {
            for (uint64_t i = 0; i < a->v.arr.n; i++)
                if (!value_eq(&a->v.arr.items[i], &b->v.arr.items[i]))
                    return false;
            return true;
        }
        static const uint8_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
        return !a->v.arr.n || !memcmp(a->v.arr.data, b->v.arr.data, a->v.arr.n * sz[a->v.arr.type]);
    }
    default:
        return a->v.u == b->v.u;
    }
}

/* Every key of a is in b with an equal value (except the ones named in skip). */
static int kv_subset(const struct gguf_file *a, const struct gguf_file *b, const char *what)
{
    int bad = 0;
    for (uint64_t i = 0; i < gguf_kv_count(a); i++) {
        const struct gguf_kv *ka = gguf_kv_at(a, i);
        if (!strncmp(ka->key, "kvasir.", 7))
            continue;
        const struct gguf_kv *kb = gguf_kv_find(b, ka->key);
        if (!kb || !value_eq(&ka->val, &kb->val)) {
            if (bad++ < 3)
                T_CHECK(0, "%s: key %s %s", what, ka->key, kb ? "differs" : "missing");
        }
    }
    return bad;
}

static bool want_all(const struct gguf_tensor *t, void *ud) { (void)t; (void)ud; return true; }

/* Tensor t of src and the tensor of the same name in dst: same shape/type and bytes. */
static bool tensor_same(const struct gguf_tensor *a, const struct gguf_tensor *b)
{
    if (!b || a->type != b->type || a->n_dims != b->n_dims || a->size != b->size)
        return false;
    for (int d = 0; d < GGUF_MAX_DIMS; d++)
        if (a->ne[d] != b->ne[d])
            return false;
    return a->data && b->data && !memcmp(a->data, b->data, a->size);
}

static int fill_read(void *ud, const char *name, void *buf, uint64_t size)
{
    const struct gguf_file *f = ud;
    const struct gguf_tensor *t = gguf_tensor_find(f, name);
    if (!t || t->size != size)
        return -EINVAL;
    return gguf_tensor_read(f, t, buf, NULL, 0);
}

static void round_trip(struct gguf_file *src, const char *name)
{
    char out[1024], err[KV_ERR_MAX];
    snprintf(out, sizeof out, "%s/rt-%s", t_tmpdir(), name);
    struct gguf_writer *w;
    T_ASSERT(gguf_writer_new(&w) == 0, "writer");
    for (uint64_t i = 0; i < gguf_kv_count(src); i++) {
        const struct gguf_kv *kv = gguf_kv_at(src, i);
        T_CHECK(gguf_writer_set(w, kv->key, &kv->val) == 0, "%s: set %s", name, kv->key);
    }
    for (uint64_t i = 0; i < gguf_tensor_count(src); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(src, i);
        /* alternate borrowed data and fill callbacks so both paths are exercised */
        int rc = (i % 2) ? gguf_writer_add_tensor_fill(w, t->name, t->type, t->n_dims, t->ne, fill_read, src)
                         : gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data);
        T_CHECK(rc == 0, "%s: add %s", name, t->name);
    }
    uint64_t expect_size = gguf_writer_file_size(w);
    int rc = gguf_writer_write(w, out, err, sizeof err);
    gguf_writer_free(w);
    T_ASSERT(rc == 0, "%s: write: %s", name, err);
    struct gguf_file *back;
    T_ASSERT(gguf_file_open(&back, out, err, sizeof err) == 0, "%s: reopen: %s", name, err);
    T_CHECK(gguf_file_size(back) == expect_size, "%s: size %" PRIu64 " vs %" PRIu64, name,
            gguf_file_size(back), expect_size);
    T_CHECK(gguf_kv_count(back) == gguf_kv_count(src), "%s: kv count", name);
    kv_subset(src, back, name);
    for (uint64_t i = 0; i < gguf_kv_count(src); i++)
        T_CHECK(!strcmp(gguf_kv_at(src, i)->key, gguf_kv_at(back, i)->key), "%s: key order %" PRIu64, name, i);
    T_CHECK(gguf_file_alignment(back) == gguf_file_alignment(src), "%s: alignment", name);
    T_ASSERT(gguf_file_map_tensors(back, want_all, NULL, err, sizeof err) == 0, "%s: map: %s", name, err);
    T_CHECK(gguf_tensor_count(back) == gguf_tensor_count(src), "%s: tensor count", name);
    int bad = 0;
    for (uint64_t i = 0; i < gguf_tensor_count(src); i++) {
        const struct gguf_tensor *a = gguf_tensor_at(src, i);
        const struct gguf_tensor *b = gguf_tensor_at(back, i);
        if (!b || strcmp(a->name, b->name) || !tensor_same(a, b))
            if (bad++ < 3)
                T_CHECK(0, "%s: tensor %s differs after round trip", name, a->name);
    }
    gguf_file_free(back);
    unlink(out);
}

static void check_window(struct gguf_file *src, const char *name, uint32_t first, uint32_t last,
                         uint32_t n_layers, int *covered)
{
    char out[1024], err[KV_ERR_MAX];
    snprintf(out, sizeof out, "%s/win-%u-%u-%s", t_tmpdir(), first, last, name);
    struct gguf_window_opts o = {.first = first, .last = last,
        .source_sha256_hex = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"};
    int rc = gguf_window_write(src, &o, out, err, sizeof err);
    T_ASSERT(rc == 0, "%s [%u,%u): %s", name, first, last, err);
    struct gguf_file *w;
    T_ASSERT(gguf_file_open(&w, out, err, sizeof err) == 0, "%s [%u,%u): reopen: %s", name, first, last, err);
    T_ASSERT(gguf_file_map_tensors(w, want_all, NULL, err, sizeof err) == 0, "map: %s", err);
    uint32_t a = 99, b = 99;
    T_CHECK(gguf_window_get(w, &a, &b) == 0 && a == first && b == last, "%s: window keys %u %u", name, a, b);
    char sha[80];
    T_CHECK(gguf_get_str(w, "kvasir.source.sha256", sha, sizeof sha) == 0 && !strcmp(sha, o.source_sha256_hex),
            "%s: source sha", name);
    kv_subset(src, w, name);
    T_CHECK(gguf_kv_count(w) == gguf_kv_count(src) + 3, "%s: kv count %" PRIu64, name, gguf_kv_count(w));
    bool has_output = gguf_tensor_find(src, "output.weight") != NULL;
    uint64_t expect = 0;
    for (uint64_t i = 0; i < gguf_tensor_count(src); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(src, i);
        int l = gguf_tensor_layer(t->name);
        bool in = l >= 0 ? (uint32_t)l >= first && (uint32_t)l < last
                : !strncmp(t->name, "token_embd.", 11) ? first == 0 || (last == n_layers && !has_output)
                : !strncmp(t->name, "output", 6) ? last == n_layers : true;
        const struct gguf_tensor *u = gguf_tensor_find(w, t->name);
        if (in) {
            expect++;
            covered[i]++;
            T_CHECK(u && tensor_same(t, u), "%s [%u,%u): tensor %s missing or differs", name, first, last, t->name);
        } else {
            T_CHECK(!u, "%s [%u,%u): tensor %s should not be in the window", name, first, last, t->name);
        }
    }
    T_CHECK(gguf_tensor_count(w) == expect, "%s: %" PRIu64 " tensors, expected %" PRIu64, name,
            gguf_tensor_count(w), expect);
    if (first == 0)
        T_CHECK(gguf_tensor_find(w, "token_embd.weight"), "%s: rank 0 holds token_embd", name);
    if (last == n_layers) {
        T_CHECK(gguf_tensor_find(w, "output_norm.weight"), "%s: last holds output_norm", name);
        T_CHECK(gguf_tensor_find(w, has_output ? "output.weight" : "token_embd.weight"),
                "%s: last holds the head (tied: token_embd)", name);
    }
    /* a window of the window keeps the original source hash and refuses layers outside it */
    if (last - first >= 2) {
        char out2[1100];
        snprintf(out2, sizeof out2, "%s.sub", out);
        struct gguf_window_opts o2 = {.first = first + 1, .last = last};
        T_CHECK(gguf_window_write(w, &o2, out2, err, sizeof err) == 0, "window of window: %s", err);
        struct gguf_file *w2;
        if (gguf_file_open(&w2, out2, err, sizeof err) == 0) {
            T_CHECK(gguf_get_str(w2, "kvasir.source.sha256", sha, sizeof sha) == 0 &&
                    !strcmp(sha, o.source_sha256_hex), "window of window keeps source sha");
            gguf_file_free(w2);
        }
        struct gguf_window_opts o3 = {.first = first == 0 ? 0 : first - 1, .last = last + (first == 0)};
        if (o3.last <= n_layers)
            T_CHECK(gguf_window_write(w, &o3, out2, err, sizeof err) == -EINVAL && strstr(err, "source window"),
                    "window of window outside: %s", err);
        unlink(out2);
    }
    gguf_file_free(w);
    unlink(out);
}

static void model_windows(struct gguf_file *src, const char *name)
{
    uint32_t n;
    T_ASSERT(gguf_block_count(src, &n) == 0 && n > 0, "%s: block count", name);
    for (uint32_t parts = 2; parts <= 3; parts++) {
        if (n < parts)
            continue;
        int *covered = calloc(gguf_tensor_count(src), sizeof *covered);
        uint32_t prev = 0;
        for (uint32_t p = 1; p <= parts; p++) {
            uint32_t end = (uint32_t)((uint64_t)n * p / parts);
            check_window(src, name, prev, end, n, covered);
            prev = end;
        }
        for (uint64_t i = 0; i < gguf_tensor_count(src); i++) {
            const char *tn = gguf_tensor_at(src, i)->name;
            int l = gguf_tensor_layer(tn);
            if (l >= 0 && (uint32_t)l < n)
                T_CHECK(covered[i] == 1, "%s: %u windows: %s in %d windows", name, parts, tn, covered[i]);
            else
                T_CHECK(covered[i] >= 1, "%s: %u windows: %s in none", name, parts, tn);
        }
        free(covered);
    }
    char out[1024], err[KV_ERR_MAX];
    snprintf(out, sizeof out, "%s/bad-%s", t_tmpdir(), name);
    struct gguf_window_opts bad = {.first = 0, .last = n + 1, .source_sha256_hex = NULL};
    T_CHECK(gguf_window_write(src, &bad, out, err, sizeof err) == -EINVAL && strstr(err, "layers"),
            "%s: window past the last layer refused: %s", name, err);
    bad.first = 1;
    bad.last = 1;
    T_CHECK(gguf_window_write(src, &bad, out, err, sizeof err) == -EINVAL, "%s: empty window refused", name);
}

/* Opens every .gguf under the test data folder sub and hands it to fn; returns how many opened
 * (-1 when the folder is missing). */
static int each_gguf(const char *sub, void (*fn)(struct gguf_file *f, const char *name))
{
    char dir[512];
    if (!t_data_path(dir, sizeof dir, sub))
        return -1;
    DIR *d = opendir(dir);
    T_CHECK(d, "opendir %s", dir);
    if (!d)
        return -1;
    struct dirent *e;
    int count = 0;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 6 || strcmp(e->d_name + l - 5, ".gguf"))
            continue;
        char path[1024], err[KV_ERR_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct gguf_file *f;
        int rc = gguf_file_open(&f, path, err, sizeof err);
        T_CHECK(rc == 0, "%s: %s", e->d_name, err);
        if (rc)
            continue;
        count++;
        fn(f, e->d_name);
        gguf_file_free(f);
    }
    closedir(d);
    return count;
}

static void check_model(struct gguf_file *f, const char *name)
{
    char err[KV_ERR_MAX];
    T_CHECK(gguf_tensor_count(f) > 0, "%s: no tensors", name);
    T_CHECK(gguf_file_map_tensors(f, want_all, NULL, err, sizeof err) == 0, "%s: map: %s", name, err);
    round_trip(f, name);
    model_windows(f, name);
}

T_CASE(every_model)
{
    int count = each_gguf("models", check_model);
    T_CHECK(count >= 10, "only %d models found", count);
}

static void check_vocab(struct gguf_file *f, const char *name)
{
    const struct gguf_value *tok;
    T_CHECK(gguf_get_arr(f, "tokenizer.ggml.tokens", &tok) == 0 && tok->v.arr.type == GGUF_V_STRING &&
            tok->v.arr.n > 100, "%s: no vocabulary", name);
    round_trip(f, name);
}

/* The vocab-only GGUFs of the tokenizer test data: parse, hold a vocabulary, round-trip. */
T_CASE(vocab_files)
{
    int count = each_gguf("tokenizer", check_vocab);
    T_CHECK(count >= 5, "only %d vocab files found", count);
}

/* A model with a multi-token-prediction block after its 3 main layers (block_count 4,
 * nextn_predict_layers 1): the last window, [k, 3) or [k, 4), holds the head, blk.3 (the MTP
 * block) and token_embd (its drafter embeds the sampled token, although the head is
 * output.weight); the first and middle windows hold neither the MTP block nor (the middle
 * one) token_embd. The catalog verifies each window and bounds its bytes by exactly the
 * tensors it holds; a window missing token_embd or the MTP block fails verification. */
T_CASE(nextn_windows)
{
    char path[1024], out[1100], err[KV_ERR_MAX];
    snprintf(path, sizeof path, "%s/nextn.gguf", t_tmpdir());
    static float data[8][64];
    uint64_t ne[1] = {64};
    struct gguf_writer *w;
    T_ASSERT(gguf_writer_new(&w) == 0, "writer");
    gguf_writer_set_str(w, "general.architecture", "qwen35moe");
    gguf_writer_set_u32(w, "qwen35moe.block_count", 4);
    gguf_writer_set_u32(w, "qwen35moe.nextn_predict_layers", 1);
    static const char *names[] = {"token_embd.weight", "blk.0.a.weight", "blk.1.a.weight", "blk.2.a.weight",
                                  "blk.3.a.weight", "blk.3.nextn.eh_proj.weight", "output_norm.weight",
                                  "output.weight"};
    enum { NT = sizeof names / sizeof names[0] };
    for (size_t i = 0; i < NT; i++) {
        for (size_t k = 0; k < 64; k++)
            data[i][k] = (float)(i * 64 + k);
        T_CHECK(gguf_writer_add_tensor(w, names[i], GGUF_T_F32, 1, ne, data[i]) == 0, "add %s", names[i]);
    }
    int rc = gguf_writer_write(w, path, err, sizeof err);
    gguf_writer_free(w);
    T_ASSERT(rc == 0, "write: %s", err);
    struct gguf_file *f;
    T_ASSERT(gguf_file_open(&f, path, err, sizeof err) == 0, "%s", err);
    uint32_t n;
    T_CHECK(gguf_main_layers(f, &n) == 0 && n == 3, "main layers %u", n);
    struct gguf_catalog *cat;
    T_ASSERT(gguf_catalog_build(&cat, f, err, sizeof err) == 0, "catalog: %s", err);
#define TAIL "blk.3.a.weight blk.3.nextn.eh_proj.weight output_norm.weight output.weight token_embd.weight"
    static const struct { uint32_t first, last; const char *has; } win[] = {
        {0, 1, "token_embd.weight blk.0.a.weight"},
        {1, 2, "blk.1.a.weight"},
        {0, 2, "token_embd.weight blk.0.a.weight blk.1.a.weight"},
        {2, 3, "blk.2.a.weight " TAIL},
        {2, 4, "blk.2.a.weight " TAIL},
        {1, 3, "blk.1.a.weight blk.2.a.weight " TAIL},
        {0, 3, "blk.0.a.weight blk.1.a.weight blk.2.a.weight " TAIL},
    };
#undef TAIL
    for (size_t i = 0; i < sizeof win / sizeof win[0]; i++) {
        snprintf(out, sizeof out, "%s.%zu", path, i);
        struct gguf_window_opts o = {win[i].first, win[i].last, NULL};
        T_CHECK(gguf_window_write(f, &o, out, err, sizeof err) == 0, "[%u,%u): %s", o.first, o.last, err);
        struct gguf_file *g;
        if (gguf_file_open(&g, out, err, sizeof err) != 0) {
            T_CHECK(0, "reopen: %s", err);
            continue;
        }
        uint64_t held = 0, lo = 0, hi = 0;
        for (size_t k = 0; k < NT; k++) {
            bool want = strstr(win[i].has, names[k]) != NULL;
            const struct gguf_tensor *t = gguf_tensor_find(g, names[k]);
            T_CHECK((t != NULL) == want, "[%u,%u): %s %s", o.first, o.last, names[k], want ? "missing" : "present");
            held += t ? t->size : 0;
        }
        T_CHECK(gguf_catalog_verify(cat, g, err, sizeof err) == 0, "[%u,%u) verify: %s", o.first, o.last, err);
        T_CHECK(gguf_catalog_window_bound(cat, o.first, o.last, &lo, &hi) == 0 && lo == held && hi >= held,
                "[%u,%u): catalog bound %llu, the window holds %llu bytes of tensors", o.first, o.last,
                (unsigned long long)lo, (unsigned long long)held);
        gguf_file_free(g);
        unlink(out);
    }
    /* a last window without token_embd or without the MTP block is not the window */
    static const char *tail[] = {"token_embd.weight", "blk.2.a.weight", "blk.3.a.weight",
                                 "blk.3.nextn.eh_proj.weight", "output_norm.weight", "output.weight"};
    T_ASSERT(gguf_file_map_tensors(f, NULL, NULL, err, sizeof err) == 0, "map: %s", err);
    for (int drop = 0; drop < 2; drop++) {
        const char *gone = drop ? "blk.3.nextn.eh_proj.weight" : "token_embd.weight";
        snprintf(out, sizeof out, "%s.drop", path);
        T_ASSERT(gguf_writer_new(&w) == 0, "writer");
        for (uint64_t i = 0; i < gguf_kv_count(f); i++)
            gguf_writer_set(w, gguf_kv_at(f, i)->key, &gguf_kv_at(f, i)->val);
        gguf_writer_set_u32(w, "kvasir.window.first", 2);
        gguf_writer_set_u32(w, "kvasir.window.last", 3);
        for (size_t k = 0; k < sizeof tail / sizeof tail[0]; k++)
            if (strcmp(tail[k], gone))
                gguf_writer_add_tensor(w, tail[k], GGUF_T_F32, 1, ne, gguf_tensor_find(f, tail[k])->data);
        T_CHECK(gguf_writer_write(w, out, err, sizeof err) == 0, "write: %s", err);
        gguf_writer_free(w);
        struct gguf_file *g;
        T_ASSERT(gguf_file_open(&g, out, err, sizeof err) == 0, "%s", err);
        T_CHECK(gguf_catalog_verify(cat, g, err, sizeof err) == -EBADMSG && strstr(err, gone) &&
                strstr(err, "missing"), "last window without %s: %s", gone, err);
        gguf_file_free(g);
        unlink(out);
    }
    struct gguf_window_opts bad = {3, 4, NULL};
    T_CHECK(gguf_window_write(f, &bad, out, err, sizeof err) == -EINVAL, "window of only the MTP block refused");
    gguf_catalog_free(cat);
    gguf_file_free(f);
    unlink(path);
}

T_CASE(known_models)
{
    char p[512], err[KV_ERR_MAX];
    struct gguf_file *f;
    uint32_t n;
    T_ASSERT(t_data_path(p, sizeof p, "models/stories260K.gguf"), "stories260K");
    T_ASSERT(gguf_file_open(&f, p, err, sizeof err) == 0, "%s", err);
    T_CHECK(gguf_tensor_count(f) == 48, "48 tensors");
    T_CHECK(gguf_block_count(f, &n) == 0 && n == 5, "5 layers");
    T_CHECK(gguf_tensor_find(f, "output.weight") != NULL, "separate output");
    const struct gguf_value *tok;
    T_CHECK(gguf_get_arr(f, "tokenizer.ggml.tokens", &tok) == 0 && tok->v.arr.n == 512 &&
            tok->v.arr.type == GGUF_V_STRING, "512 tokens");
    T_CHECK(gguf_file_size(f) == 1185376, "size");
    gguf_file_free(f);
    T_ASSERT(t_data_path(p, sizeof p, "models/TinyStories-656K-Q8_0.gguf"), "TinyStories");
    T_ASSERT(gguf_file_open(&f, p, err, sizeof err) == 0, "%s", err);
    T_CHECK(gguf_tensor_count(f) == 20, "20 tensors");
    T_CHECK(gguf_block_count(f, &n) == 0 && n == 2, "2 layers");
    T_CHECK(gguf_tensor_find(f, "output.weight") == NULL, "tied");
    const struct gguf_tensor *t = gguf_tensor_find(f, "token_embd.weight");
    T_CHECK(t && t->type == GGUF_T_Q8_0 && t->ne[0] == 128 && t->ne[1] == 2048, "token_embd shape");
    gguf_file_free(f);
    T_CHECK(gguf_file_open(&f, "/nonexistent/x.gguf", err, sizeof err) == -ENOENT && strstr(err, "/nonexistent"),
            "missing file: %s", err);
}

int main(int argc, char **argv)
{
    t_init(argc, argv);
    T_RUN(known_models);
    T_RUN(every_model);
    T_RUN(vocab_files);
    T_RUN(nextn_windows);
    return T_DONE();
}

/* test-model-window: what the ring relies on. The layers run as one window or split into 2
 * or 3 consecutive windows (from the full GGUF or from stage mini-GGUFs, with any thread
 * count) give bit-identical logits; sessions are independent (interleaving two gives the
 * same bits as running each alone); and the executor refuses what it must (context,
 * positions, ids, windows, unknown architectures, missing tensors) with the documented codes
 * and messages. */
#include <errno.h>

#include "gguf/gguf.h"
#include "tests/lib/model_ref.h"
#include "util/err.h"

#define MAXW 3

struct win {
    struct model *m;
    struct model_exec *e;
};

struct chain {
    struct win w[MAXW];
    int n;
    uint32_t n_embd, n_vocab;
};

static int chain_open(struct chain *c, const char *const *paths, const int *bounds, int n,
                      int threads)
{
    memset(c, 0, sizeof *c);
    for (int i = 0; i < n; i++) {
        char err[KV_ERR_MAX] = "";
        int first = bounds ? bounds[i] : -1, last = bounds ? bounds[i + 1] : -1;
        int rc = model_open(&c->w[i].m, paths[i], first, last, err, sizeof err);
        T_CHECK(rc == 0, "open %s [%d, %d): %s", paths[i], first, last, err);
        if (rc)
            return rc;
        c->n = i + 1;
        rc = model_exec_new(&c->w[i].e, c->w[i].m, threads, 64, 16);
        T_CHECK(rc == 0, "exec: %d", rc);
        if (rc)
            return rc;
        model_session_new(c->w[i].e, 42);
    }
    T_CHECK(model_has_embed(c->w[0].m) && model_has_head(c->w[n - 1].m), "ends of the chain");
    c->n_embd = model_get_hparams(c->w[0].m)->n_embd;
    c->n_vocab = model_get_hparams(c->w[0].m)->n_vocab;
    return 0;
}

static void chain_close(struct chain *c)
{
    for (int i = 0; i < c->n; i++) {
        model_exec_free(c->w[i].e);
        model_free(c->w[i].m);
    }
}

/* Prompt of np tokens as one batch, then the rest one by one; logits of every row. */
static float *chain_logits(struct chain *c, const int32_t *tok, uint32_t n, uint32_t np)
{
    float *out = calloc((size_t)n * c->n_vocab, sizeof(float));
    float *x = calloc((size_t)np * c->n_embd, sizeof(float));
    for (uint32_t pos = 0; pos < n;) {
        uint32_t nb = pos == 0 ? np : 1;
        int rc = model_embed(c->w[0].e, tok + pos, nb, x);
        for (int i = 0; !rc && i < c->n; i++)
            rc = model_window_run(c->w[i].e, 42, pos, nb, x);
        if (!rc)
            rc = model_head(c->w[c->n - 1].e, x, nb, out + (size_t)pos * c->n_vocab);
        T_CHECK(rc == 0, "step at %u: %d", pos, rc);
        if (rc)
            break;
        pos += nb;
    }
    free(x);
    return out;
}

static void check_splits(const char *model_rel, uint32_t n_layer)
{
    char path[1024];
    if (!t_data_path(path, sizeof path, model_rel))
        return;
    static const int32_t tok[] = {1, 5, 9, 200, 17, 300, 44, 2, 90, 11, 23};
    const uint32_t n = sizeof tok / sizeof tok[0], np = 5;
    const char *paths[MAXW] = {path, path, path};
    int L = (int)n_layer;
    int one[] = {0, L};
    int two[] = {0, L / 2, L};
    int three[] = {0, 1, 1 + (L - 1) / 2, L};   /* needs L >= 3 */
    int nsplit = L >= 3 ? 2 : 1;
    struct chain c;
    float *ref = NULL, *got;
    if (!chain_open(&c, paths, one, 1, 1))
        ref = chain_logits(&c, tok, n, np);
    chain_close(&c);
    if (!ref)
        return;
    const int *splits[] = {two, three};
    for (int s = 0; s < nsplit; s++) {
        /* other thread counts too: a stage's threads never change the bits */
        if (chain_open(&c, paths, splits[s], s + 2, s + 2)) {
            chain_close(&c);
            continue;
        }
        got = chain_logits(&c, tok, n, np);
        T_CHECK(!memcmp(got, ref, (size_t)n * c.n_vocab * sizeof(float)),
                "%s: %d windows differ from one", model_rel, s + 2);
        free(got);
        chain_close(&c);
    }

    /* The same through stage mini-GGUFs written by the gguf module. */
    struct gguf_file *gf;
    char err[KV_ERR_MAX] = "";
    int rc = gguf_file_open(&gf, path, err, sizeof err);
    T_CHECK(rc == 0, "gguf open: %s", err);
    if (rc) {
        free(ref);
        return;
    }
    char files[3][512];
    const char *fp[3] = {files[0], files[1], files[2]};
    const int *b = L >= 3 ? three : two;
    int nw = L >= 3 ? 3 : 2;
    bool ok = true;
    for (int i = 0; i < nw && ok; i++) {
        snprintf(files[i], sizeof files[i], "%s/w%d.gguf", t_tmpdir(), i);
        struct gguf_window_opts o = {(uint32_t)b[i], (uint32_t)b[i + 1], NULL};
        rc = gguf_window_write(gf, &o, files[i], err, sizeof err);
        T_CHECK(rc == 0, "window write %d: %s", i, err);
        ok = rc == 0;
    }
    gguf_file_free(gf);
    if (ok && !chain_open(&c, fp, NULL, nw, 2)) {
        got = chain_logits(&c, tok, n, np);
        T_CHECK(!memcmp(got, ref, (size_t)n * c.n_vocab * sizeof(float)),
                "%s: mini-GGUF windows differ from one window", model_rel);
        free(got);
    }
    chain_close(&c);
    for (int i = 0; i < nw; i++)
        unlink(files[i]);
    free(ref);
}

T_CASE(split_windows_bit_identical)
{
    check_splits("models/stories260K.gguf", 5);
    check_splits("models/synth-llama-spm512-q4_k_m.gguf", 4);
    check_splits("models/synth-qwen3-bpe1024-q8_0.gguf", 4);
    check_splits("models/TinyStories-656K-Q8_0.gguf", 2);
}

T_CASE(sessions_independent)
{
    char path[1024];
    if (!t_data_path(path, sizeof path, "models/stories260K.gguf"))
        return;
    struct model *m;
    struct model_exec *e;
    char err[KV_ERR_MAX];
    int rc = model_open(&m, path, -1, -1, err, sizeof err);
    T_ASSERT(rc == 0, "%s", err);
    rc = model_exec_new(&e, m, 1, 32, 8);
    T_ASSERT(rc == 0, "exec");
    const int32_t a[] = {1, 403, 407, 261, 378, 432, 383}, b[] = {1, 90, 91, 300, 301, 17, 18};
    const uint32_t n = 7, V = model_get_hparams(m)->n_vocab, E = model_get_hparams(m)->n_embd;
    float *alone = malloc(2 * n * V * sizeof(float)), *mixed = malloc(2 * n * V * sizeof(float));
    float x[64 * 8];
    T_ASSERT(E <= 64, "n_embd");
    /* each alone, then interleaved token by token with a third session in between */
    for (int s = 0; s < 2; s++) {
        T_CHECK(model_session_new(e, 100) == 0, "new");
        for (uint32_t i = 0; i < n; i++) {
            model_embed(e, s ? &b[i] : &a[i], 1, x);
            T_CHECK(model_window_run(e, 100, i, 1, x) == 0, "run");
            model_head(e, x, 1, alone + (s * n + i) * V);
        }
        T_CHECK(model_session_free(e, 100) == 0, "free");
    }
    T_CHECK(model_session_new(e, 1) == 0 && model_session_new(e, 2) == 0 &&
            model_session_new(e, 3) == 0, "three sessions");
    for (uint32_t i = 0; i < n; i++) {
        for (int s = 0; s < 2; s++) {
            model_embed(e, s ? &b[i] : &a[i], 1, x);
            T_CHECK(model_window_run(e, (uint64_t)s + 1, i, 1, x) == 0, "run");
            model_head(e, x, 1, mixed + (s * n + i) * V);
            model_embed(e, &b[n - 1 - i], 1, x);
            T_CHECK(model_window_run(e, 3, i, 1, x) == 0, "run 3");
        }
    }
    T_CHECK(!memcmp(alone, mixed, 2 * n * V * sizeof(float)), "interleaved sessions differ");
    T_CHECK(model_session_pos(e, 1) == n && model_session_pos(e, 99) == 0, "positions");

    /* A rewind recomputes the same logits (later positions are overwritten). */
    model_embed(e, &a[3], 1, x);
    T_CHECK(model_window_run(e, 1, 3, 1, x) == 0, "rewind");
    float *row = malloc(V * sizeof(float));
    model_head(e, x, 1, row);
    T_CHECK(!memcmp(row, alone + 3 * V, V * sizeof(float)), "rewound row differs");
    T_CHECK(model_session_pos(e, 1) == 4, "rewound position %u", model_session_pos(e, 1));
    free(row);
    free(alone);
    free(mixed);
    model_exec_free(e);
    model_free(m);
}

T_CASE(refusals)
{
    char path[1024];
    if (!t_data_path(path, sizeof path, "models/stories260K.gguf"))
        return;
    struct model *m = NULL, *mid = NULL;
    struct model_exec *e = NULL, *emid = NULL;
    char err[KV_ERR_MAX] = "";
    int rc = model_open(&m, path, -1, -1, err, sizeof err);
    T_ASSERT(rc == 0, "%s", err);
    T_CHECK(model_exec_new(&e, m, 1, 0, 1) == -EINVAL, "n_ctx 0");
    rc = model_exec_new(&e, m, 1, 4, 4);
    T_ASSERT(rc == 0, "exec");
    float x[64 * 5] = {0};
    int32_t t[5] = {1, 2, 3, 4, 5};
    T_CHECK(model_window_run(e, 9, 0, 1, x) == -ENOENT, "unknown session");
    T_CHECK(model_session_new(e, 9) == 0, "new");
    T_CHECK(model_session_new(e, 9) == -EEXIST, "duplicate session");
    T_CHECK(model_window_run(e, 9, 0, 5, x) == -ERANGE, "past the context");
    T_CHECK(model_window_run(e, 9, 3, 2, x) == -ERANGE, "past the context at 3");
    T_CHECK(model_window_run(e, 9, 1, 1, x) == -EINVAL, "skipped position");
    int32_t bad = 512;
    T_CHECK(model_embed(e, &bad, 1, x) == -EINVAL, "token past the vocabulary");
    bad = -1;
    T_CHECK(model_embed(e, &bad, 1, x) == -EINVAL, "negative token");
    T_CHECK(model_embed(e, t, 4, x) == 0 && model_window_run(e, 9, 0, 4, x) == 0, "fill");
    T_CHECK(model_window_run(e, 9, 4, 1, x) == -ERANGE, "full context");
    T_CHECK(model_session_free(e, 9) == 0 && model_session_free(e, 9) == -ENOENT, "free");

    T_CHECK(model_open(&mid, path, 1, 3, err, sizeof err) == 0, "%s", err);
    if (mid) {
        T_CHECK(!model_has_embed(mid) && !model_has_head(mid), "middle window");
        uint32_t f, l;
        model_get_window(mid, &f, &l);
        T_CHECK(f == 1 && l == 3, "window [%u, %u)", f, l);
        T_CHECK(model_exec_new(&emid, mid, 1, 8, 2) == 0, "exec");
        T_CHECK(model_embed(emid, t, 1, x) == -ENOTSUP, "embed outside rank 0");
        T_CHECK(model_head(emid, x, 1, x) == -ENOTSUP, "head outside the last rank");
    }
    struct model *m2 = NULL;
    T_CHECK(model_open(&m2, path, 3, 2, err, sizeof err) == -ERANGE, "empty window");
    T_CHECK(model_open(&m2, path, 0, 6, err, sizeof err) == -ERANGE && strstr(err, "[0, 6)"),
            "window past the layers: %s", err);
    model_exec_free(emid);
    model_free(mid);
    model_exec_free(e);
    model_free(m);

}

/* A copy of stories260K without one tensor must be refused, naming the tensor. */
T_CASE(missing_tensor_named)
{
    char path[1024], out[512], err[KV_ERR_MAX] = "";
    if (!t_data_path(path, sizeof path, "models/stories260K.gguf"))
        return;
    struct gguf_file *gf;
    int rc = gguf_file_open(&gf, path, err, sizeof err);
    T_ASSERT(rc == 0, "%s", err);
    rc = gguf_file_map_tensors(gf, NULL, NULL, err, sizeof err);
    struct gguf_writer *w = NULL;
    if (rc == 0)
        rc = gguf_writer_new(&w);
    T_CHECK(rc == 0, "map / writer: %s", err);
    if (rc) {
        gguf_file_free(gf);
        return;
    }
    for (uint64_t i = 0; i < gguf_kv_count(gf); i++) {
        const struct gguf_kv *kv = gguf_kv_at(gf, i);
        T_CHECK(gguf_writer_set(w, kv->key, &kv->val) == 0, "set %s", kv->key);
    }
    for (uint64_t i = 0; i < gguf_tensor_count(gf); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(gf, i);
        if (!strcmp(t->name, "blk.2.ffn_up.weight"))
            continue;
        T_CHECK(gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data) == 0,
                "add %s", t->name);
    }
    snprintf(out, sizeof out, "%s/missing.gguf", t_tmpdir());
    T_CHECK(gguf_writer_write(w, out, err, sizeof err) == 0, "write: %s", err);
    gguf_writer_free(w);
    gguf_file_free(gf);
    struct model *m = NULL;
    char merr[KV_ERR_MAX] = "";
    T_CHECK(model_open(&m, out, -1, -1, merr, sizeof merr) < 0 &&
            strstr(merr, "blk.2.ffn_up.weight"), "missing tensor: '%s'", merr);
    /* A window that does not need the tensor opens fine. */
    T_CHECK(model_open(&m, out, 0, 2, merr, sizeof merr) == 0, "window [0, 2): %s", merr);
    model_free(m);
    unlink(out);
}

int main(int argc, char **argv)
{
    t_init(argc, argv);
    T_RUN(split_windows_bit_identical);
    T_RUN(sessions_independent);
    T_RUN(refusals);
    T_RUN(missing_tensor_named);
    return T_DONE();
}

/* test-model-qwen35: the Qwen3.5 family (qwen3moe routed experts, qwen35 Gated DeltaNet
 * hybrid, qwen35moe hybrid + experts + shared expert) against llama.cpp's references, and
 * what the ring relies on for them: split windows (starting on a linear-attention layer, on a
 * full-attention layer, single-layer windows) give bit-identical logits; interleaved sessions
 * keep separate recurrent state; recurrent state is fixed-size; rewinds restart from 0. The
 * opencl_device case holds the "opencl" device to the same references and bounds (PoCL here;
 * without an OpenCL device it fails saying so). */
#include <errno.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "tests/lib/model_ref.h"
#include "util/err.h"

static const struct ref_spec specs[] = {
    {"synth-qwen3moe-bpe1024-q8_0.once", 2.3e-4, true, true},
    {"synth-qwen3moe-bpe1024-q4_k_m.once", 4.9e-4, true, false},
    {"synth-qwen35-bpe1024-f16.once", 8.8e-7, false, true},
    {"synth-qwen35moe-bpe1024-q8_0.once", 3.8e-4, true, true},
};

#define MAXW 8
#define SID 42

/* The kernel device the chains run on ("cpu"; the opencl_device case takes "opencl"). */
static const char *chain_device = "cpu";

struct chain {
    struct model *m[MAXW];
    struct model_exec *e[MAXW];
    int n;
    uint32_t n_embd, n_vocab;
};

static int chain_open(struct chain *c, const char *path, const int *bounds, int n,
                      uint32_t max_batch)
{
    memset(c, 0, sizeof *c);
    for (int i = 0; i < n; i++) {
        char err[KV_ERR_MAX] = "";
        int first = bounds ? bounds[i] : -1, last = bounds ? bounds[i + 1] : -1;
        int rc = model_open(&c->m[i], path, first, last, err, sizeof err);
        T_CHECK(rc == 0, "open %s [%d, %d): %s", path, first, last, err);
        if (rc)
            return rc;
        c->n = i + 1;
        struct model_exec_opts o = {chain_device, 1, 64, max_batch, NULL};
        rc = model_exec_new_opts(&c->e[i], c->m[i], &o, err, sizeof err);
        T_CHECK(rc == 0, "exec on %s: %d %s", chain_device, rc, err);
        if (rc)
            return rc;
        T_CHECK(model_session_new(c->e[i], SID) == 0, "session");
    }
    c->n_embd = model_get_hparams(c->m[0])->n_embd;
    c->n_vocab = model_get_hparams(c->m[0])->n_vocab;
    return 0;
}

static void chain_close(struct chain *c)
{
    for (int i = 0; i < c->n; i++) {
        model_exec_free(c->e[i]);
        model_free(c->m[i]);
    }
}

/* Feed tok[0..n) at pos through the chain for session id; logits of every row into out. */
static int chain_feed(struct chain *c, uint64_t id, uint32_t pos, const int32_t *tok, uint32_t n,
                      float *out)
{
    float *x = malloc((size_t)n * c->n_embd * sizeof(float));
    int rc = model_embed(c->e[0], tok, n, x);
    for (int i = 0; !rc && i < c->n; i++)
        rc = model_window_run(c->e[i], id, pos, n, x);
    if (!rc)
        rc = model_head(c->e[c->n - 1], x, n, out);
    free(x);
    T_CHECK(rc == 0, "feed at %u: %d", pos, rc);
    return rc;
}

/* Prompt of np tokens as one batch, then the rest one by one: logits of every row. */
static float *chain_logits(struct chain *c, uint64_t id, const int32_t *tok, uint32_t n,
                           uint32_t np)
{
    float *out = calloc((size_t)n * c->n_vocab, sizeof(float));
    int rc = chain_feed(c, id, 0, tok, np, out);
    for (uint32_t i = np; !rc && i < n; i++)
        rc = chain_feed(c, id, i, tok + i, 1, out + (size_t)i * c->n_vocab);
    return out;
}

static void check_case(const struct ref_spec *sp, const struct ref_case *rc, int mode)
{
    struct chain c;
    if (chain_open(&c, rc->model, NULL, 1, mode ? 8 : 64)) {
        chain_close(&c);
        return;
    }
    T_CHECK(c.n_vocab == rc->n_vocab, "%s: n_vocab %u vs %u", sp->name, c.n_vocab, rc->n_vocab);
    float *ours;
    if (mode == 0) {
        ours = chain_logits(&c, SID, rc->fed, rc->n_fed, rc->n_prompt);
    } else {
        ours = calloc((size_t)rc->n_fed * rc->n_vocab, sizeof(float));
        chain_feed(&c, SID, 0, rc->fed, rc->n_fed, ours);
    }
    uint32_t checked = ref_compare(sp, rc, ours, mode);
    T_CHECK(checked > rc->n_fed / 2, "%s: only %u rows with a clear argmax", sp->name, checked);
    free(ours);
    chain_close(&c);
}

T_CASE(teacher_forced_logits)
{
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        struct ref_case rc;
        if (ref_load(&rc, specs[i].name))
            continue;
        check_case(&specs[i], &rc, 0);
        if (specs[i].one_batch)
            check_case(&specs[i], &rc, 1);
        ref_free(&rc);
    }
}

/* The teacher-forced cases, both feeding modes, and a window split on the opencl device. */
T_CASE(opencl_device)
{
    chain_device = "opencl";
    teacher_forced_logits();
}

T_CASE(hparams_and_schedule)
{
    char path[1024];
    if (!t_data_path(path, sizeof path, "models/synth-qwen35moe-bpe1024-q8_0.gguf"))
        return;
    struct model *m;
    char err[KV_ERR_MAX] = "";
    T_ASSERT(model_open(&m, path, -1, -1, err, sizeof err) == 0, "open: %s", err);
    const struct model_hparams *hp = model_get_hparams(m);
    T_CHECK(hp->n_layer == 8 && hp->n_block == 8 && hp->n_nextn == 0, "layers %u/%u/%u",
            hp->n_layer, hp->n_block, hp->n_nextn);
    T_CHECK(hp->n_expert == 8 && hp->n_expert_used == 2 && hp->n_ff_exp == 256 &&
            hp->n_ff_shexp == 256, "experts");
    T_CHECK(hp->ssm_d_state == 64 && hp->ssm_n_group == 2 && hp->ssm_dt_rank == 4 &&
            hp->ssm_d_inner == 256 && hp->ssm_conv_kernel == 4 && hp->n_rot == 16, "ssm");
    for (uint32_t l = 0; l < 8; l++)
        T_CHECK(model_layer_is_recurrent(m, l) == (l != 3 && l != 7), "layer %u kind", l);
    /* state per session: 6 linear layers x (3 x 512 conv + 4 x 64 x 64 S) floats; K/V only
     * for the 2 attention layers. */
    T_CHECK(model_state_bytes(m) == 6ull * 4 * (3 * 512 + 4 * 64 * 64), "state bytes %llu",
            (unsigned long long)model_state_bytes(m));
    T_CHECK(model_kv_bytes_per_token(m) == 2ull * 2 * 2 * 64 * 2, "kv bytes %llu",
            (unsigned long long)model_kv_bytes_per_token(m));
    /* time per token counts 2 of 8 experts; memory all 8 */
    uint64_t xb = model_expert_bytes(m), wb = model_weight_bytes(m);
    T_CHECK(xb > 0 && wb < xb, "expert bytes %llu, weight bytes per token %llu",
            (unsigned long long)xb, (unsigned long long)wb);
    model_free(m);
    /* a stage keeps state only for its own layers: [0,3) three linear layers and no K/V;
     * [3,4) one full-attention layer and no recurrent state; [2,4) one of each */
    static const struct { int a, b; uint64_t lin, att; } w[] = {{0, 3, 3, 0}, {3, 4, 0, 1}, {2, 4, 1, 1}};
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
        T_ASSERT(model_open(&m, path, w[i].a, w[i].b, err, sizeof err) == 0, "open [%d,%d): %s", w[i].a, w[i].b, err);
        T_CHECK(model_state_bytes(m) == w[i].lin * 4 * (3 * 512 + 4 * 64 * 64) &&
                model_kv_bytes_per_token(m) == w[i].att * 2 * 2 * 64 * 2,
                "window [%d,%d): state %llu, kv/token %llu", w[i].a, w[i].b,
                (unsigned long long)model_state_bytes(m), (unsigned long long)model_kv_bytes_per_token(m));
        model_free(m);
    }
}

static const int32_t prompt[] = {46, 837, 263, 640, 11, 257, 1000, 500, 33, 101, 7, 290};
#define NP 7
#define NT (sizeof prompt / sizeof prompt[0])

/* The model as one window against split windows: bit-identical logits for every row. */
static void check_split(const char *rel, const int *bounds, int n, const char *what)
{
    char path[1024];
    if (!t_data_path(path, sizeof path, rel))
        return;
    struct chain one, split;
    if (chain_open(&one, path, NULL, 1, 16) || chain_open(&split, path, bounds, n, 16)) {
        chain_close(&one);
        return;
    }
    float *a = chain_logits(&one, SID, prompt, NT, NP);
    float *b = chain_logits(&split, SID, prompt, NT, NP);
    T_CHECK(!memcmp(a, b, NT * one.n_vocab * sizeof(float)), "%s: %s: split logits differ",
            rel, what);
    free(a);
    free(b);
    chain_close(&one);
    chain_close(&split);
}

T_CASE(split_windows_bit_identical)
{
    /* qwen35moe / qwen35: layers 3 and 7 are full attention, the rest linear. */
    static const int lin[] = {0, 1, 5, 8};       /* windows start on linear layers 1 and 5 */
    static const int full[] = {0, 3, 7, 8};      /* start on full-attention 3 and 7 (single) */
    static const int single[] = {0, 2, 3, 4, 6, 8}; /* single-layer windows: 2 (lin), 3 (full) */
    static const int every[] = {0, 1, 2, 3, 4, 5, 6, 7, 8};
    const char *hyb[] = {"models/synth-qwen35moe-bpe1024-q8_0.gguf",
                         "models/synth-qwen35-bpe1024-f16.gguf"};
    for (int i = 0; i < 2; i++) {
        check_split(hyb[i], lin, 3, "windows starting on linear layers");
        check_split(hyb[i], full, 3, "windows starting on full-attention layers");
        check_split(hyb[i], single, 5, "single-layer windows");
    }
    check_split(hyb[0], every, 8, "eight single-layer windows");
    static const int moe[] = {0, 1, 3, 4};
    check_split("models/synth-qwen3moe-bpe1024-q4_k_m.gguf", moe, 3, "qwen3moe split");
}

/* 8 sessions with different prompts, interleaved token by token, each equal to its solo run
 * (separate conv state, S and K/V). Run over a 3-window chain. */
T_CASE(sessions_independent)
{
    char path[1024];
    if (!t_data_path(path, sizeof path, "models/synth-qwen35moe-bpe1024-q8_0.gguf"))
        return;
    static const int bounds[] = {0, 2, 5, 8};
    enum { NS = 8, LEN = 10, PL = 4 };
    int32_t toks[NS][LEN];
    for (int s = 0; s < NS; s++)
        for (int i = 0; i < LEN; i++)
            toks[s][i] = (int32_t)((s * 131 + i * 37 + 11) % 1023);
    struct chain c;
    if (chain_open(&c, path, bounds, 3, 16)) {
        chain_close(&c);
        return;
    }
    size_t V = c.n_vocab;
    float *solo = calloc((size_t)NS * LEN * V, sizeof(float));
    for (int s = 0; s < NS; s++) {
        for (int i = 0; i < c.n; i++)
            model_session_new(c.e[i], 100 + s);
        float *l = chain_logits(&c, 100 + s, toks[s], LEN, PL);
        memcpy(solo + (size_t)s * LEN * V, l, LEN * V * sizeof(float));
        free(l);
        for (int i = 0; i < c.n; i++)
            T_CHECK(model_session_free(c.e[i], 100 + s) == 0, "free");
    }
    for (int s = 0; s < NS; s++)
        for (int i = 0; i < c.n; i++)
            model_session_new(c.e[i], 200 + s);
    float *row = calloc((size_t)PL * V, sizeof(float));
    int bad = 0;
    for (int s = 0; s < NS; s++) {      /* prompts, interleaved */
        chain_feed(&c, 200 + s, 0, toks[s], PL, row);
        bad += memcmp(row, solo + (size_t)s * LEN * V, PL * V * sizeof(float)) != 0;
    }
    for (int i = PL; i < LEN; i++)       /* then one token each, round robin */
        for (int s = NS - 1; s >= 0; s--) {
            chain_feed(&c, 200 + s, (uint32_t)i, &toks[s][i], 1, row);
            bad += memcmp(row, solo + ((size_t)s * LEN + i) * V, V * sizeof(float)) != 0;
        }
    T_CHECK(bad == 0, "%d interleaved rows differ from their solo runs", bad);
    /* A rewind to 0 restarts the recurrent state; a partial rewind is refused. */
    uint64_t id = 200;
    float *x = calloc((size_t)PL * c.n_embd, sizeof(float));
    T_CHECK(model_window_run(c.e[0], id, 2, 1, x) == -EINVAL, "partial rewind refused");
    T_CHECK(model_window_run(c.e[0], id, 12, 1, x) == -EINVAL, "skip refused");
    free(x);
    chain_feed(&c, id, 0, toks[0], PL, row);
    T_CHECK(!memcmp(row, solo, PL * V * sizeof(float)), "rewind to 0 = fresh session");
    free(row);
    free(solo);
    chain_close(&c);
}

/* ---- file variants written from the qwen35moe model ---- */

enum { V_NEXTN = 1, V_FUSED = 2, V_SHEXP_2D = 4, V_SCHEDULE = 8, V_BAD_SCHEDULE = 16 };

/* Copy src to out with the variant's changes: V_NEXTN adds an MTP block blk.8 (copies of blk.7's
 * tensors) with block_count 9 and nextn_predict_layers 1; V_FUSED replaces every
 * ffn_gate_exps/ffn_up_exps pair by one ffn_gate_up_exps; V_SHEXP_2D stores
 * ffn_gate_inp_shexp as [n_embd, 1]; V_SCHEDULE writes attention.recurrent_layers equal to
 * the default schedule, V_BAD_SCHEDULE one that calls layer 3 recurrent. */
static int write_variant_kv(const char *src, const char *out, int v, const char *key,
                            uint32_t val);

static int write_variant(const char *src, const char *out, int v)
{
    return write_variant_kv(src, out, v, NULL, 0);
}

/* ... and with metadata key set to val (UINT32_MAX: the key left out). */
static int write_variant_kv(const char *src, const char *out, int v, const char *key,
                            uint32_t val)
{
    char err[KV_ERR_MAX] = "";
    struct gguf_file *gf;
    int rc = gguf_file_open(&gf, src, err, sizeof err);
    if (!rc)
        rc = gguf_file_map_tensors(gf, NULL, NULL, err, sizeof err);
    struct gguf_writer *w = NULL;
    if (!rc)
        rc = gguf_writer_new(&w);
    T_CHECK(rc == 0, "variant source: %s", err);
    if (rc) {
        gguf_file_free(gf);
        return rc;
    }
    for (uint64_t i = 0; i < gguf_kv_count(gf); i++) {
        const struct gguf_kv *kv = gguf_kv_at(gf, i);
        if (!key || strcmp(kv->key, key) || val != UINT32_MAX)
            gguf_writer_set(w, kv->key, &kv->val);
    }
    if (key && val != UINT32_MAX)
        gguf_writer_set_u32(w, key, val);
    if (v & V_NEXTN) {
        gguf_writer_set_u32(w, "qwen35moe.block_count", 9);
        gguf_writer_set_u32(w, "qwen35moe.nextn_predict_layers", 1);
    }
    if (v & (V_SCHEDULE | V_BAD_SCHEDULE)) {
        uint8_t flags[8] = {1, 1, 1, 0, 1, 1, 1, 0};
        if (v & V_BAD_SCHEDULE)
            flags[3] = 1;
        gguf_writer_set_arr(w, "qwen35moe.attention.recurrent_layers", GGUF_V_BOOL, 8, flags);
    }
    void *bufs[16];
    int nb = 0;
    for (uint64_t i = 0; i < gguf_tensor_count(gf); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(gf, i);
        const char *up = strstr(t->name, "ffn_up_exps");
        if ((v & V_FUSED) && up)
            continue;
        if ((v & V_FUSED) && strstr(t->name, "ffn_gate_exps")) {
            /* per expert: the gate slice, then the up slice */
            char name[96];
            snprintf(name, sizeof name, "%.*sffn_up_exps.weight",
                     (int)(strstr(t->name, "ffn_gate_exps") - t->name), t->name);
            const struct gguf_tensor *u = gguf_tensor_find(gf, name);
            size_t slice = t->size / t->ne[2];
            uint8_t *f = malloc(2 * t->size);
            for (uint64_t e = 0; e < t->ne[2]; e++) {
                memcpy(f + 2 * e * slice, (const uint8_t *)t->data + e * slice, slice);
                memcpy(f + (2 * e + 1) * slice, (const uint8_t *)u->data + e * slice, slice);
            }
            bufs[nb++] = f;
            uint64_t ne[3] = {t->ne[0], 2 * t->ne[1], t->ne[2]};
            snprintf(name, sizeof name, "%.*sffn_gate_up_exps.weight",
                     (int)(strstr(t->name, "ffn_gate_exps") - t->name), t->name);
            gguf_writer_add_tensor(w, name, t->type, 3, ne, f);
            continue;
        }
        if ((v & V_SHEXP_2D) && strstr(t->name, "ffn_gate_inp_shexp")) {
            uint64_t ne[2] = {t->ne[0], 1};
            gguf_writer_add_tensor(w, t->name, t->type, 2, ne, t->data);
            continue;
        }
        gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data);
    }
    if (v & V_NEXTN)   /* an MTP block: never mapped nor run */
        for (uint64_t i = 0; i < gguf_tensor_count(gf); i++) {
            const struct gguf_tensor *t = gguf_tensor_at(gf, i);
            if (strncmp(t->name, "blk.7.", 6))
                continue;
            char name[96];
            snprintf(name, sizeof name, "blk.8.%s", t->name + 6);
            gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data);
        }
    rc = gguf_writer_write(w, out, err, sizeof err);
    T_CHECK(rc == 0, "write %s: %s", out, err);
    gguf_writer_free(w);
    for (int i = 0; i < nb; i++)
        free(bufs[i]);
    gguf_file_free(gf);
    return rc;
}

/* Logits of path (whole model, or the given windows) equal to ref bit for bit. */
static void expect_same(const char *path, const int *bounds, int n, const float *ref,
                        const char *what)
{
    struct chain c;
    if (!chain_open(&c, path, bounds, n, 16)) {
        float *l = chain_logits(&c, SID, prompt, NT, NP);
        T_CHECK(!memcmp(l, ref, NT * c.n_vocab * sizeof(float)), "%s: logits differ", what);
        free(l);
    }
    chain_close(&c);
}

T_CASE(file_variants)
{
    char path[1024], out[600];
    if (!t_data_path(path, sizeof path, "models/synth-qwen35moe-bpe1024-q8_0.gguf"))
        return;
    struct chain c;
    if (chain_open(&c, path, NULL, 1, 16)) {
        chain_close(&c);
        return;
    }
    float *ref = chain_logits(&c, SID, prompt, NT, NP);
    chain_close(&c);

    /* nextn: 8 main-pass layers of 9 blocks; the whole model and windows run as before */
    snprintf(out, sizeof out, "%s/nextn.gguf", t_tmpdir());
    if (!write_variant(path, out, V_NEXTN)) {
        struct model *m;
        char err[KV_ERR_MAX] = "";
        T_CHECK(model_open(&m, out, -1, -1, err, sizeof err) == 0, "nextn open: %s", err);
        if (m) {
            const struct model_hparams *hp = model_get_hparams(m);
            T_CHECK(hp->n_layer == 8 && hp->n_block == 9 && hp->n_nextn == 1,
                    "nextn layers %u/%u/%u", hp->n_layer, hp->n_block, hp->n_nextn);
            uint32_t f, l;
            model_get_window(m, &f, &l);
            T_CHECK(f == 0 && l == 8 && model_has_head(m), "nextn window [%u, %u)", f, l);
            model_free(m);
        }
        T_CHECK(model_open(&m, out, 4, 9, err, sizeof err) == -ERANGE, "window into the MTP block");
        expect_same(out, NULL, 1, ref, "nextn whole");
        static const int b[] = {0, 3, 8};
        expect_same(out, b, 2, ref, "nextn windows");
        /* a mini-GGUF reaching into the MTP block is clamped to the main pass */
        char mini[640], gerr[KV_ERR_MAX] = "";
        snprintf(mini, sizeof mini, "%s/nextn-w.gguf", t_tmpdir());
        struct gguf_file *gf;
        if (gguf_file_open(&gf, out, gerr, sizeof gerr) == 0) {
            struct gguf_window_opts o = {3, 9, NULL};
            T_CHECK(gguf_window_write(gf, &o, mini, gerr, sizeof gerr) == 0, "slice: %s", gerr);
            gguf_file_free(gf);
            T_CHECK(model_open(&m, mini, -1, -1, err, sizeof err) == 0, "mini open: %s", err);
            if (m) {
                uint32_t f, l;
                model_get_window(m, &f, &l);
                T_CHECK(f == 3 && l == 8 && model_has_head(m), "mini window [%u, %u)", f, l);
                model_free(m);
            }
            unlink(mini);
        }
        unlink(out);
    }
    /* fused gate_up experts and a 2-D shared-expert gate: same bits */
    snprintf(out, sizeof out, "%s/fused.gguf", t_tmpdir());
    if (!write_variant(path, out, V_FUSED | V_SHEXP_2D)) {
        expect_same(out, NULL, 1, ref, "fused ffn_gate_up_exps + 2-D ffn_gate_inp_shexp");
        unlink(out);
    }
    /* attention.recurrent_layers */
    snprintf(out, sizeof out, "%s/sched.gguf", t_tmpdir());
    if (!write_variant(path, out, V_SCHEDULE)) {
        expect_same(out, NULL, 1, ref, "explicit recurrent_layers");
        unlink(out);
    }
    if (!write_variant(path, out, V_BAD_SCHEDULE)) {
        struct model *m = NULL;
        char err[KV_ERR_MAX] = "";
        T_CHECK(model_open(&m, out, -1, -1, err, sizeof err) < 0 &&
                strstr(err, "blk.3.attn_qkv.weight missing"), "layer 3 recurrent: '%s'", err);
        unlink(out);
    }
    free(ref);
}

/* Hostile or inconsistent metadata is refused with a message naming the field. */
T_CASE(hostile_hparams)
{
    static const struct {
        const char *key;
        uint32_t val;
        const char *expect;
    } cases[] = {
        {"qwen35moe.expert_used_count", 9, "expert_used_count = 9 out of range [1, 8]"},
        {"qwen35moe.expert_count", 100000, "expert_count = 100000 out of range"},
        {"qwen35moe.expert_count", 4, "ffn_gate_inp.weight: shape"},
        {"qwen35moe.expert_feed_forward_length", 128, "ffn_gate_exps.weight: shape"},
        {"qwen35moe.expert_shared_feed_forward_length", UINT32_MAX,
         "expert_shared_feed_forward_length missing"},
        {"qwen35moe.ssm.inner_size", 300, "inner_size 300 != time_step_rank 4 x state_size 64"},
        {"qwen35moe.ssm.conv_kernel", 1000, "conv_kernel = 1000 out of range"},
        {"qwen35moe.ssm.state_size", UINT32_MAX, "ssm.state_size missing"},
        {"qwen35moe.ssm.group_count", 3, "attn_qkv.weight: shape"},
        {"qwen35moe.nextn_predict_layers", 8, "nextn_predict_layers = 8 out of range [0, 7]"},
        {"qwen35moe.full_attention_interval", 0, "full_attention_interval = 0 out of range"},
        {"qwen35moe.full_attention_interval", 2, "blk.1.attn_q.weight missing"},
    };
    char path[1024], out[600];
    if (!t_data_path(path, sizeof path, "models/synth-qwen35moe-bpe1024-q8_0.gguf"))
        return;
    snprintf(out, sizeof out, "%s/hostile.gguf", t_tmpdir());
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (write_variant_kv(path, out, 0, cases[i].key, cases[i].val))
            continue;
        struct model *m = NULL;
        char err[KV_ERR_MAX] = "";
        int rc = model_open(&m, out, -1, -1, err, sizeof err);
        T_CHECK(rc < 0 && !m && strstr(err, cases[i].expect), "%s = %u: rc %d, '%s', expected '%s'",
                cases[i].key, cases[i].val, rc, err, cases[i].expect);
        model_free(m);
    }
    unlink(out);
}

/* Stage mini-GGUFs of the MoE hybrid (3-D expert tensors included) verify against the
 * model's catalog and run bit-identically to the whole model. */
T_CASE(mini_gguf_windows)
{
    char path[1024], files[3][600], err[KV_ERR_MAX] = "";
    if (!t_data_path(path, sizeof path, "models/synth-qwen35moe-bpe1024-q8_0.gguf"))
        return;
    struct gguf_file *gf;
    T_ASSERT(gguf_file_open(&gf, path, err, sizeof err) == 0, "%s", err);
    struct gguf_catalog *cat = NULL;
    T_CHECK(gguf_catalog_build(&cat, gf, err, sizeof err) == 0, "catalog: %s", err);
    static const int b[] = {0, 3, 4, 8};
    bool ok = cat != NULL;
    for (int i = 0; i < 3 && ok; i++) {
        snprintf(files[i], sizeof files[i], "%s/w%d.gguf", t_tmpdir(), i);
        struct gguf_window_opts o = {(uint32_t)b[i], (uint32_t)b[i + 1], NULL};
        ok = gguf_window_write(gf, &o, files[i], err, sizeof err) == 0;
        T_CHECK(ok, "window %d: %s", i, err);
        struct gguf_file *w;
        if (ok && gguf_file_open(&w, files[i], err, sizeof err) == 0) {
            T_CHECK(gguf_tensor_find(w, "blk.3.ffn_gate_exps.weight") ? i == 1 : i != 1,
                    "expert tensor placement");
            ok = gguf_catalog_verify(cat, w, err, sizeof err) == 0;
            T_CHECK(ok, "verify window %d: %s", i, err);
            gguf_file_free(w);
        }
    }
    gguf_catalog_free(cat);
    gguf_file_free(gf);
    if (ok) {
        struct chain one, split;
        memset(&split, 0, sizeof split);
        if (!chain_open(&one, path, NULL, 1, 16)) {
            float *ref = chain_logits(&one, SID, prompt, NT, NP);
            for (int i = 0; i < 3; i++) {
                char merr[KV_ERR_MAX] = "";
                int rc = model_open(&split.m[i], files[i], -1, -1, merr, sizeof merr);
                T_CHECK(rc == 0, "open mini %d: %s", i, merr);
                if (rc)
                    break;
                split.n = i + 1;
                model_exec_new(&split.e[i], split.m[i], 1, 64, 16);
                model_session_new(split.e[i], SID);
            }
            split.n_embd = one.n_embd;
            split.n_vocab = one.n_vocab;
            if (split.n == 3) {
                float *l = chain_logits(&split, SID, prompt, NT, NP);
                T_CHECK(!memcmp(l, ref, NT * one.n_vocab * sizeof(float)),
                        "mini-GGUF windows differ from one window");
                free(l);
            }
            free(ref);
        }
        chain_close(&one);
        chain_close(&split);
    }
    for (int i = 0; i < 3; i++)
        unlink(files[i]);
}

/* Only the selected experts are read: poison one expert's slice of blk.0.ffn_gate_exps (every
 * Q8_0 block scale set to NaN) at a time and run one token. A poisoned expert that the router
 * did not pick must leave the logits bit-identical (had its rows been read, even with weight 0,
 * NaN would spread); exactly expert_used_count of them change the logits. */
T_CASE(unselected_experts_untouched)
{
    char path[1024], err[KV_ERR_MAX] = "";
    if (!t_data_path(path, sizeof path, "models/synth-qwen35moe-bpe1024-q8_0.gguf"))
        return;
    struct gguf_file *gf;
    T_ASSERT(gguf_file_open(&gf, path, err, sizeof err) == 0, "%s", err);
    const struct gguf_tensor *t = gguf_tensor_find(gf, "blk.0.ffn_gate_exps.weight");
    T_ASSERT(t && t->n_dims == 3 && t->type == GGUF_T_Q8_0 && t->size % (34 * t->ne[2]) == 0,
             "blk.0.ffn_gate_exps.weight: a 3-D Q8_0 tensor expected");
    uint64_t X = t->ne[2], slice = t->size / X, off = gguf_file_data_offset(gf) + t->offset;
    gguf_file_free(gf);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s/poison.gguf", t_tmpdir());
    FILE *in = fopen(path, "rb"), *out = fopen(tmp, "wb");
    T_ASSERT(in && out, "copy %s to %s", path, tmp);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        T_ASSERT(fwrite(buf, 1, n, out) == n, "write %s", tmp);
    fclose(in);
    fclose(out);
    static const int32_t tok[1] = {46};
    struct chain c;
    if (chain_open(&c, tmp, NULL, 1, 8)) {
        chain_close(&c);
        return;
    }
    uint32_t V = c.n_vocab, used = model_get_hparams(c.m[0])->n_expert_used;
    float *clean = chain_logits(&c, SID, tok, 1, 1);
    chain_close(&c);
    unsigned changed = 0;
    uint8_t *orig = malloc(slice), *bad = malloc(slice);
    T_ASSERT(orig && bad, "oom");
    for (uint64_t e = 0; e < X; e++) {
        FILE *f = fopen(tmp, "r+b");
        T_ASSERT(f && fseek(f, (long)(off + e * slice), SEEK_SET) == 0 && fread(orig, 1, slice, f) == slice,
                 "read expert %llu", (unsigned long long)e);
        memcpy(bad, orig, slice);
        for (uint64_t b = 0; b < slice; b += 34) {   /* f16 NaN scale */
            bad[b] = 0x00;
            bad[b + 1] = 0x7e;
        }
        fseek(f, (long)(off + e * slice), SEEK_SET);
        T_ASSERT(fwrite(bad, 1, slice, f) == slice, "poison expert %llu", (unsigned long long)e);
        fclose(f);
        if (chain_open(&c, tmp, NULL, 1, 8) == 0) {
            float *l = chain_logits(&c, SID, tok, 1, 1);
            changed += memcmp(l, clean, V * sizeof(float)) != 0;
            free(l);
        }
        chain_close(&c);
        f = fopen(tmp, "r+b");
        T_ASSERT(f && fseek(f, (long)(off + e * slice), SEEK_SET) == 0 && fwrite(orig, 1, slice, f) == slice,
                 "restore expert %llu", (unsigned long long)e);
        fclose(f);
    }
    T_CHECK(changed == used, "%u of %llu poisoned experts changed the logits of one token; %u are routed",
            changed, (unsigned long long)X, used);
    free(orig);
    free(bad);
    free(clean);
    unlink(tmp);
}

int main(int argc, char **argv)
{
    t_init(argc, argv);
    T_RUN(teacher_forced_logits);
    T_RUN(hparams_and_schedule);
    T_RUN(split_windows_bit_identical);
    T_RUN(sessions_independent);
    T_RUN(file_variants);
    T_RUN(hostile_hparams);
    T_RUN(mini_gguf_windows);
    T_RUN(unselected_experts_untouched);
    T_RUN_TIMEOUT(opencl_device, 900);
    return T_DONE();
}

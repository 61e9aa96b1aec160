/* test-model-batch: model_window_run_batch, rows of several sessions in one pass. For a dense
 * (llama), a routed-expert (qwen3moe) and a hybrid (qwen35) model, sessions with different
 * prompt lengths run (a) each on its own through model_window_run (the prompt as one batch,
 * then one row per call) and (b) interleaved in mixed batches (decode rows of some sessions
 * plus prefill chunks of others, in changing orders) through model_window_run_batch: every
 * hidden row and every logit row is bit-identical (the kernels compute each row on its own,
 * whatever the batch). Bad batches are refused before anything runs and change nothing (the
 * interleaved run goes on after them and still matches). A last case prints the time of 8
 * decode rows of 8 sessions as one batch against 8 single runs (no timed assertion). */
#include <errno.h>
#include <time.h>

#include "model/model.h"
#include "tests/lib/t.h"
#include "util/err.h"

#define NS 6          /* sessions */
#define ND 6          /* teacher-forced decode steps after each prompt */
#define MAXB 16       /* executors' max_batch */
#define CHUNK 4       /* prefill rows per session per batch */
#define NCTX 64

static const uint32_t plen[NS] = {5, 11, 1, 8, 3, 13};
static const uint32_t start_round[NS] = {0, 0, 1, 2, 2, 4}; /* staggered: prefill meets decode */

static int32_t token(uint32_t s, uint32_t i, uint32_t n_vocab)
{
    return (int32_t)((s * 131u + i * 17u + 3u) % n_vocab);
}

struct outs {
    float *h[NS];     /* [plen + ND][n_embd] hidden rows after the window */
    float *lg[NS];    /* [plen + ND][n_vocab] logits */
};

static int open_exec(struct model **m, struct model_exec **e, const char *rel)
{
    char path[512], err[KV_ERR_MAX] = "";
    if (!t_data_path(path, sizeof path, rel))
        return -1;
    int rc = model_open(m, path, -1, -1, err, sizeof err);
    T_CHECK(rc == 0, "open %s: %s", rel, err);
    if (rc)
        return rc;
    rc = model_exec_new(e, *m, 2, NCTX, MAXB);
    T_CHECK(rc == 0, "exec: %d", rc);
    if (rc) {
        model_free(*m);
        return rc;
    }
    for (uint32_t s = 0; s < NS; s++)
        T_CHECK(model_session_new(*e, 100 + s) == 0, "session %u", s);
    return 0;
}

/* (a) each session alone: the prompt in one call, then one row per call. */
static void run_solo(struct model_exec *e, const struct model_hparams *hp, struct outs *o)
{
    const uint32_t E = hp->n_embd, V = hp->n_vocab;
    for (uint32_t s = 0; s < NS; s++) {
        uint32_t L = plen[s] + ND;
        int32_t tok[64];
        for (uint32_t i = 0; i < L; i++)
            tok[i] = token(s, i, V);
        float *x = o->h[s];
        T_CHECK(model_embed(e, tok, plen[s], x) == 0, "embed");
        T_CHECK(model_window_run(e, 100 + s, 0, plen[s], x) == 0, "prompt %u", s);
        for (uint32_t i = plen[s]; i < L; i++) {
            T_CHECK(model_embed(e, &tok[i], 1, x + (size_t)i * E) == 0, "embed");
            T_CHECK(model_window_run(e, 100 + s, i, 1, x + (size_t)i * E) == 0, "decode %u", s);
        }
        for (uint32_t i = 0; i < L; i++)   /* one row at a time: see check_model */
            T_CHECK(model_head(e, x + (size_t)i * E, 1, o->lg[s] + (size_t)i * V) == 0, "head");
    }
}

/* Batches the interleaved run's checks refuse: each must leave every session as it was. */
static void check_refused(struct model_exec *e, const uint32_t *done, float *x, bool recurrent)
{
    uint32_t pos0[NS];
    for (uint32_t s = 0; s < NS; s++)
        pos0[s] = model_session_pos(e, 100 + s);
    struct model_batch_row r[MAXB + 1];
    memset(r, 0, sizeof r);
    r[0] = (struct model_batch_row){100, done[0]};
    r[1] = (struct model_batch_row){999, 0};
    T_CHECK(model_window_run_batch(e, r, 2, x) == -ENOENT, "unknown session");
    r[1] = (struct model_batch_row){101, done[1] + 1};
    T_CHECK(model_window_run_batch(e, r, 2, x) == -EINVAL, "skip");
    r[1] = (struct model_batch_row){101, done[1]};
    r[2] = (struct model_batch_row){100, done[0] + 1};
    T_CHECK(model_window_run_batch(e, r, 3, x) == -EINVAL, "session twice");
    r[1] = (struct model_batch_row){100, done[0] + 2};
    T_CHECK(model_window_run_batch(e, r, 2, x) == -EINVAL, "positions not consecutive");
    r[1] = (struct model_batch_row){101, NCTX};
    T_CHECK(model_window_run_batch(e, r, 2, x) == -ERANGE, "past the context");
    for (uint32_t i = 0; i <= MAXB; i++)
        r[i] = (struct model_batch_row){100, done[0] + i};
    T_CHECK(model_window_run_batch(e, r, MAXB + 1, x) == -EINVAL, "more than max_batch");
    if (recurrent && done[0] > 1) {
        r[0] = (struct model_batch_row){101, done[1]};
        r[1] = (struct model_batch_row){100, 1};
        T_CHECK(model_window_run_batch(e, r, 2, x) == -EINVAL, "recurrent rewind to 1");
    }
    for (uint32_t s = 0; s < NS; s++)
        T_CHECK(model_session_pos(e, 100 + s) == pos0[s], "session %u moved: %u -> %u", s,
                pos0[s], model_session_pos(e, 100 + s));
}

/* (b) interleaved: each round, every started session adds one decode row or a prefill chunk,
 * in an order rotated by the round, up to MAXB rows. */
static void run_batched(struct model_exec *e, const struct model_hparams *hp, struct outs *o,
                        bool recurrent)
{
    const uint32_t E = hp->n_embd, V = hp->n_vocab;
    uint32_t done[NS] = {0};
    float *x = calloc((size_t)(MAXB + 1) * E, sizeof(float));
    float *lg = calloc((size_t)MAXB * V, sizeof(float));
    T_ASSERT(x && lg, "alloc");
    bool mixed = false;
    for (uint32_t round = 0; round < 100; round++) {
        struct model_batch_row rows[MAXB];
        uint32_t who[MAXB], n = 0, n_dec = 0, n_pre = 0;
        for (uint32_t k = 0; k < NS; k++) {
            uint32_t s = (k + round) % NS, L = plen[s] + ND;
            if (round < start_round[s] || done[s] == L)
                continue;
            uint32_t take = done[s] < plen[s] ? plen[s] - done[s] : 1;
            if (take > CHUNK)
                take = CHUNK;
            if (take > MAXB - n)
                take = MAXB - n;
            if (done[s] < plen[s])
                n_pre++;
            else
                n_dec++;
            for (uint32_t i = 0; i < take; i++) {
                int32_t t = token(s, done[s] + i, V);
                T_CHECK(model_embed(e, &t, 1, x + (size_t)(n + i) * E) == 0, "embed");
                rows[n + i] = (struct model_batch_row){100 + s, done[s] + i};
                who[n + i] = s;
            }
            n += take;
        }
        if (!n)
            break;
        mixed |= n_dec >= 2 && n_pre >= 1;
        if (round == 3)
            check_refused(e, done, x + (size_t)n * E, recurrent);
        int rc = model_window_run_batch(e, rows, n, x);
        T_ASSERT(rc == 0, "round %u: %d", round, rc);
        for (uint32_t i = 0; i < n; i++)
            T_ASSERT(model_head(e, x + (size_t)i * E, 1, lg + (size_t)i * V) == 0, "head");
        for (uint32_t i = 0; i < n; i++) {
            uint32_t s = who[i], p = rows[i].pos;
            memcpy(o->h[s] + (size_t)p * E, x + (size_t)i * E, E * sizeof(float));
            memcpy(o->lg[s] + (size_t)p * V, lg + (size_t)i * V, V * sizeof(float));
            done[s] = p + 1;
        }
    }
    for (uint32_t s = 0; s < NS; s++)
        T_CHECK(done[s] == plen[s] + ND && model_session_pos(e, 100 + s) == done[s],
                "session %u ran %u", s, done[s]);
    T_CHECK(mixed, "no batch mixed decode rows and a prefill chunk");
    free(x);
    free(lg);
}

static uint32_t argmax(const float *v, uint32_t n)
{
    uint32_t b = 0;
    for (uint32_t i = 1; i < n; i++)
        if (v[i] > v[b])
            b = i;
    return b;
}

static double nmse(const float *a, const float *b, uint32_t n)
{
    double num = 0, den = 0;
    for (uint32_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)a[i] * a[i];
    }
    return den > 0 ? num / den : num;
}

/* exact: the model's matmuls give a row the same bits whatever the batch size (every weight
 * type: the multi-row dots repeat the one-row dot's operations per row, kern_type_rows_exact),
 * so solo and batched rows are bit-identical; checked at every SIMD level this CPU has when
 * run with KV_KERN_SIMD=avx2|scalar. exact false would check a row NMSE under 1e-3 with the
 * same greedy token. The head runs one row at a time on both sides (F32 heads go to
 * OpenBLAS's sgemm from 16 rows), so the logits compare what the window did. */
static void check_model(const char *rel, bool exact)
{
    struct model *ma = NULL, *mb = NULL;
    struct model_exec *ea = NULL, *eb = NULL;
    if (open_exec(&ma, &ea, rel) || open_exec(&mb, &eb, rel))
        goto out;
    const struct model_hparams *hp = model_get_hparams(ma);
    bool recurrent = false;
    for (uint32_t l = 0; l < hp->n_layer; l++)
        recurrent |= model_layer_is_recurrent(ma, l);
    struct outs a, b;
    for (uint32_t s = 0; s < NS; s++) {
        size_t L = plen[s] + ND;
        a.h[s] = calloc(L * hp->n_embd, sizeof(float));
        b.h[s] = calloc(L * hp->n_embd, sizeof(float));
        a.lg[s] = calloc(L * hp->n_vocab, sizeof(float));
        b.lg[s] = calloc(L * hp->n_vocab, sizeof(float));
        T_ASSERT(a.h[s] && b.h[s] && a.lg[s] && b.lg[s], "alloc");
    }
    run_solo(ea, hp, &a);
    run_batched(eb, hp, &b, recurrent);
    double worst = 0;
    for (uint32_t s = 0; s < NS; s++) {
        size_t L = plen[s] + ND;
        for (size_t i = 0; i < L; i++) {
            const float *ha = a.h[s] + i * hp->n_embd, *hb = b.h[s] + i * hp->n_embd;
            const float *la = a.lg[s] + i * hp->n_vocab, *lb = b.lg[s] + i * hp->n_vocab;
            if (exact) {
                T_CHECK(!memcmp(ha, hb, hp->n_embd * sizeof(float)),
                        "%s: session %u position %zu: hidden row differs", rel, s, i);
                T_CHECK(!memcmp(la, lb, hp->n_vocab * sizeof(float)),
                        "%s: session %u position %zu: logits differ", rel, s, i);
            }
            double eh = nmse(ha, hb, hp->n_embd), el = nmse(la, lb, hp->n_vocab);
            worst = eh > worst ? eh : worst;
            worst = el > worst ? el : worst;
            T_CHECK(eh < 1e-3 && el < 1e-3, "%s: session %u position %zu: NMSE hidden %.3g logits %.3g",
                    rel, s, i, eh, el);
            T_CHECK(argmax(a.lg[s] + i * hp->n_vocab, hp->n_vocab) ==
                        argmax(b.lg[s] + i * hp->n_vocab, hp->n_vocab),
                    "%s: session %u position %zu: greedy token differs", rel, s, i);
        }
        free(a.h[s]);
        free(b.h[s]);
        free(a.lg[s]);
        free(b.lg[s]);
    }
    fprintf(stderr, "%s: batched vs solo, worst row NMSE %.3g%s\n", rel, worst,
            exact ? " (bit-identical)" : "");
out:
    model_exec_free(ea);
    model_exec_free(eb);
    model_free(ma);
    model_free(mb);
}

T_CASE(batch_dense_stories) { check_model("models/stories260K.gguf", true); }
T_CASE(batch_dense_q4_0) { check_model("models/synth-llama-spm512-q4_0.gguf", true); }
T_CASE(batch_dense_q4_k) { check_model("models/synth-llama-spm512-q4_k.gguf", true); }
T_CASE(batch_dense_f32) { check_model("models/synth-llama-spm512-f32.gguf", true); }
T_CASE(batch_moe) { check_model("models/synth-qwen3moe-bpe1024-q8_0.gguf", true); }
T_CASE(batch_moe_q4_k) { check_model("models/synth-qwen3moe-bpe1024-q4_k_m.gguf", true); }
T_CASE(batch_hybrid) { check_model("models/synth-qwen35-bpe1024-f16.gguf", true); }
T_CASE(batch_hybrid_moe) { check_model("models/synth-qwen35moe-bpe1024-q8_0.gguf", true); }

/* An empty batch runs nothing; a session's rewind (attention-only) is allowed in a batch. */
T_CASE(batch_edges)
{
    struct model *m = NULL;
    struct model_exec *e = NULL;
    if (open_exec(&m, &e, "models/stories260K.gguf"))
        return;
    const struct model_hparams *hp = model_get_hparams(m);
    float *x = calloc((size_t)4 * hp->n_embd, sizeof(float));
    T_ASSERT(x, "alloc");
    T_CHECK(model_window_run_batch(e, NULL, 0, x) == 0, "empty batch");
    struct model_batch_row r[4] = {{100, 0}, {100, 1}, {101, 0}, {102, 0}};
    T_CHECK(model_window_run_batch(e, r, 4, x) == 0, "first batch");
    T_CHECK(model_session_pos(e, 100) == 2 && model_session_pos(e, 101) == 1, "positions");
    r[0] = (struct model_batch_row){100, 1};
    r[1] = (struct model_batch_row){101, 1};
    T_CHECK(model_window_run_batch(e, r, 2, x) == 0, "rewind of 100 to 1");
    T_CHECK(model_session_pos(e, 100) == 2 && model_session_pos(e, 101) == 2, "positions");
    r[0] = (struct model_batch_row){100, NCTX - 1};
    T_CHECK(model_window_run_batch(e, r, 1, x) == -EINVAL, "skip");
    free(x);
    model_exec_free(e);
    model_free(m);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* 8 sessions past a 16-token prompt, one decode row each: 8 single runs (positions 16..35)
 * against one batch of 8 (positions 36..55). Printed, not asserted. */
static void bench(const char *rel)
{
    char path[512], err[KV_ERR_MAX] = "";
    if (!t_data_path(path, sizeof path, rel))
        return;
    struct model *m = NULL;
    struct model_exec *e = NULL;
    T_ASSERT(model_open(&m, path, -1, -1, err, sizeof err) == 0, "open: %s", err);
    T_ASSERT(model_exec_new(&e, m, 1, NCTX, 8) == 0, "exec");
    const struct model_hparams *hp = model_get_hparams(m);
    const uint32_t E = hp->n_embd, P = 16, R = 20;
    float *x = calloc((size_t)P * E, sizeof(float));
    T_ASSERT(x, "alloc");
    struct model_batch_row rows[8];
    for (uint32_t s = 0; s < 8; s++) {
        T_CHECK(model_session_new(e, s) == 0, "session");
        int32_t tok[16];
        for (uint32_t i = 0; i < P; i++)
            tok[i] = token(s, i, hp->n_vocab);
        T_CHECK(model_embed(e, tok, P, x) == 0, "embed");
        T_CHECK(model_window_run(e, s, 0, P, x) == 0, "prompt");
        rows[s] = (struct model_batch_row){s, P};
    }
    double t0 = now_s();
    for (uint32_t r = 0; r < R; r++)
        for (uint32_t s = 0; s < 8; s++)
            T_CHECK(model_window_run(e, s, P + r, 1, x + (size_t)s * E) == 0, "single");
    double t1 = now_s();
    for (uint32_t r = 0; r < R; r++) {
        for (uint32_t s = 0; s < 8; s++)
            rows[s].pos = P + R + r;
        T_CHECK(model_window_run_batch(e, rows, 8, x) == 0, "batch");
    }
    double t2 = now_s();
    fprintf(stderr, "%s: 8 decode rows of 8 sessions: 8 single runs %.3f ms, one batch %.3f ms "
            "(x%.2f), 1 thread\n", rel, (t1 - t0) * 1e3 / R, (t2 - t1) * 1e3 / R,
            (t1 - t0) / (t2 - t1));
    free(x);
    model_exec_free(e);
    model_free(m);
}

T_CASE(batch_timing)
{
    bench("models/synth-llama-spm512-q4_0.gguf");
    bench("models/synth-qwen3moe-bpe1024-q8_0.gguf");
    bench("models/synth-qwen35-bpe1024-f16.gguf");
}

int main(int argc, char **argv)
{
    t_init(argc, argv);
    T_RUN(batch_dense_stories);
    T_RUN(batch_dense_q4_0);
    T_RUN(batch_dense_q4_k);
    T_RUN(batch_dense_f32);
    T_RUN(batch_moe);
    T_RUN(batch_moe_q4_k);
    T_RUN(batch_hybrid);
    T_RUN(batch_hybrid_moe);
    T_RUN(batch_edges);
    T_RUN(batch_timing);
    return T_DONE();
}

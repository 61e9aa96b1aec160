/* test-model-ref: the executor against llama.cpp's references (shared testdata ref/).
 * Teacher forcing: feed tokens_fed (prompt as one batch, then one token per call, as the
 * references were made) and compare every logits row: normalised MSE at most 10x the
 * model's "f64 max" in MANIFEST.md (never below 1e-5), argmax equal wherever the reference's
 * top-2 margin exceeds 0.1 (F32/F16/BF16) or 0.5 (quantised). Greedy generation from the
 * prompt must reproduce generated_tokens exactly for the stories260K cases and the synthetic
 * F32 and F16 models. The ref_device case holds the executor on the "ref" kernel device (the
 * scalar oracle behind the device seam) to the same references and bounds; the opencl_*
 * cases hold the "opencl" device (PoCL here; without an OpenCL device they fail saying so)
 * to them too, the greedy generations included, and every case's rows in one batch through
 * CLBlast's GEMMs (opencl_gemm). */
#include "kernels/kern.h"
#include "tests/lib/model_ref.h"
#include "util/err.h"

/* Every llama / qwen2 / qwen3 case of the public set (the MoE and hybrid ones are in
 * test-model-qwen35). */
static const struct ref_spec specs[] = {
    {"TinyStories-656K-Q8_0.lily", 2.5e-4, true, false},
    {"TinyStories-656K-Q8_0.once", 4.5e-4, true, true},
    {"stories260K.lily", 1.7e-6, false, false},
    {"stories260K.once", 2.2e-6, false, true},
    {"synth-llama-spm512-f32.once", 2.1e-7, false, false},
    {"synth-llama-spm512-f16.once", 6.1e-7, false, true},
    {"synth-llama-spm512-bf16.once", 2.9e-5, false, true},
    {"synth-llama-spm512-q4_0.once", 3.0e-4, true, false},
    {"synth-llama-spm512-q4_1.once", 3.7e-4, true, false},
    {"synth-llama-spm512-q4_k.once", 7.5e-4, true, false},
    {"synth-llama-spm512-q4_k_m.once", 7.3e-4, true, true},
    {"synth-llama-spm512-q5_0.once", 3.2e-4, true, false},
    {"synth-llama-spm512-q5_1.once", 3.2e-4, true, true},
    {"synth-llama-spm512-q5_k.once", 6.4e-4, true, false},
    {"synth-llama-spm512-q6_k.once", 8.2e-4, true, false},
    {"synth-llama-spm512-q8_0.once", 3.0e-4, true, false},
    {"synth-qwen2-bpe1024-q4_k_m.once", 4.7e-4, true, true},
    {"synth-qwen2-bpe1024-q8_0.once", 2.1e-4, true, false},
    {"synth-qwen3-bpe1024-q8_0.once", 2.9e-4, true, true},
    {"synth-qwen3-bpe1024-f16.once", 4.8e-7, false, true},
};

/* The kernel device the executor runs on ("cpu"; the ref_device case takes "ref"), and the
 * opencl device's settings (NULL: the environment's). */
static const char *run_device = "cpu";
static const struct kern_cl_opts *run_cl;

struct run {
    struct model *m;
    struct model_exec *e;
    uint32_t n_vocab, n_embd;
};

static int run_open(struct run *r, const char *path, uint32_t n_ctx, uint32_t max_batch)
{
    char err[KV_ERR_MAX] = "";
    memset(r, 0, sizeof *r);
    int rc = model_open(&r->m, path, -1, -1, err, sizeof err);
    T_CHECK(rc == 0, "model_open %s: %d %s", path, rc, err);
    if (rc)
        return rc;
    struct model_exec_opts o = {run_device, 1, n_ctx, max_batch, run_cl};
    rc = model_exec_new_opts(&r->e, r->m, &o, err, sizeof err);
    T_CHECK(rc == 0, "model_exec_new on %s: %d %s", run_device, rc, err);
    if (rc) {
        model_free(r->m);
        return rc;
    }
    r->n_vocab = model_get_hparams(r->m)->n_vocab;
    r->n_embd = model_get_hparams(r->m)->n_embd;
    rc = model_session_new(r->e, 7);
    T_CHECK(rc == 0, "session: %d", rc);
    return rc;
}

static void run_close(struct run *r)
{
    model_exec_free(r->e);
    model_free(r->m);
}

/* Feed n tokens at pos as one batch; logits of every row into out[n][n_vocab]. */
static int run_feed(struct run *r, uint32_t pos, const int32_t *tok, uint32_t n, float *out)
{
    float *x = malloc((size_t)n * r->n_embd * sizeof(float));
    int rc = model_embed(r->e, tok, n, x);
    if (!rc)
        rc = model_window_run(r->e, 7, pos, n, x);
    if (!rc)
        rc = model_head(r->e, x, n, out);
    free(x);
    T_CHECK(rc == 0, "feed at %u: %d", pos, rc);
    return rc;
}

/* Mode 0: as the references were made (prompt as one batch, then one token per call).
 * Mode 1: every row in one call, run in chunks of 8 rows (the batch path over many rows).
 * Mode 2: every row in one call and one chunk (on opencl: CLBlast's GEMMs, which must run). */
static void check_case(const struct ref_spec *sp, const struct ref_case *rc, int mode)
{
    struct run r;
    if (run_open(&r, rc->model, rc->n_fed + 1, mode == 1 ? 8 : 64))
        return;
    T_CHECK(r.n_vocab == rc->n_vocab, "%s: n_vocab %u vs %u", sp->name, r.n_vocab, rc->n_vocab);
    float *ours = calloc((size_t)rc->n_fed * rc->n_vocab, sizeof(float));
    int err;
    if (mode == 0) {
        err = run_feed(&r, 0, rc->fed, rc->n_prompt, ours);
        for (uint32_t i = rc->n_prompt; !err && i < rc->n_fed; i++)
            err = run_feed(&r, i, &rc->fed[i], 1, ours + (size_t)i * rc->n_vocab);
    } else {
        err = run_feed(&r, 0, rc->fed, rc->n_fed, ours);
    }
    struct kern_cl_info ci;
    if (mode == 2 && kern_cl_info(model_exec_kern_dev(r.e), &ci) == 0)
        T_CHECK(ci.gemm_calls > 0, "%s: %u rows in one batch, no matmul through CLBlast",
                sp->name, rc->n_fed);
    if (!err)   /* a failed feed has failed the case already */
        ref_compare(sp, rc, ours, mode);
    free(ours);
    run_close(&r);
}

/* Every teacher-forced case on run_device: as the references were made, and in one batch
 * where the spec asks for it and one_batch is set. */
static void forced_cases(bool one_batch)
{
    for (size_t c = 0; c < sizeof specs / sizeof specs[0]; c++) {
        struct ref_case rc;
        if (ref_load(&rc, specs[c].name))
            continue;
        check_case(&specs[c], &rc, 0);
        if (one_batch && specs[c].one_batch)
            check_case(&specs[c], &rc, 1);
        ref_free(&rc);
    }
}

/* Every teacher-forced case with all its rows (28 to 30) in one batch: on opencl through
 * CLBlast's GEMMs (from KERN_CL_GEMM_MIN rows), to the same bounds. */
static void gemm_cases(void)
{
    for (size_t c = 0; c < sizeof specs / sizeof specs[0]; c++) {
        struct ref_case rc;
        if (ref_load(&rc, specs[c].name))
            continue;
        T_CHECK(rc.n_fed >= KERN_CL_GEMM_MIN, "%s: %u rows", specs[c].name, rc.n_fed);
        check_case(&specs[c], &rc, 2);
        ref_free(&rc);
    }
}

T_CASE(teacher_forced_logits) { forced_cases(true); }

/* The teacher-forced cases as the references were made, on the ref device. */
T_CASE(ref_device)
{
    run_device = "ref";
    forced_cases(false);
}

/* Every teacher-forced case (both feeding modes) on the opencl device. */
T_CASE(opencl_device)
{
    run_device = "opencl";
    forced_cases(true);
}

T_CASE(opencl_gemm)
{
    static const struct kern_cl_opts gemm = {.platform = -1, .device = -1,
                                             .gemm_rows = KERN_CL_GEMM_MIN};
    run_device = "opencl";
    run_cl = &gemm;
    gemm_cases();
}

static void greedy(void)
{
    static const char *cases[] = {"stories260K.once", "stories260K.lily",
                                  "synth-llama-spm512-f32.once", "synth-llama-spm512-f16.once"};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        struct ref_case rc;
        if (ref_load(&rc, cases[c]))
            continue;
        struct run r;
        if (run_open(&r, rc.model, rc.n_prompt + rc.n_gen, 64)) {
            ref_free(&rc);
            continue;
        }
        float *logits = malloc((size_t)rc.n_prompt * r.n_vocab * sizeof(float));
        int err = run_feed(&r, 0, rc.prompt, rc.n_prompt, logits);
        const float *last = logits + (size_t)(rc.n_prompt - 1) * r.n_vocab;
        uint32_t pos = rc.n_prompt, match = 0;
        for (uint32_t g = 0; !err && g < rc.n_gen; g++) {
            int32_t tok = (int32_t)argmax2(last, r.n_vocab, NULL);
            if (tok != rc.gen[g]) {
                T_CHECK(0, "%s: generated token %u is %d, reference %d", cases[c], g, tok,
                        rc.gen[g]);
                break;
            }
            match++;
            if (g + 1 < rc.n_gen)
                err = run_feed(&r, pos++, &tok, 1, logits);
            last = logits;
        }
        fprintf(stderr, "  %-34s %u/%u greedy tokens equal\n", cases[c], match, rc.n_gen);
        free(logits);
        run_close(&r);
        ref_free(&rc);
    }
}

T_CASE(greedy_generation) { greedy(); }

T_CASE(opencl_greedy)
{
    run_device = "opencl";
    greedy();
}

int main(int argc, char **argv)
{
    t_init(argc, argv);
    T_RUN(teacher_forced_logits);
    T_RUN(greedy_generation);
    T_RUN(ref_device);
    T_RUN_TIMEOUT(opencl_device, 900);
    T_RUN_TIMEOUT(opencl_greedy, 600);
    T_RUN_TIMEOUT(opencl_gemm, 900);
    return T_DONE();
}

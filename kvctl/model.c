/* kvctl/model.c — one-process use of the window executor: generate, logits, bench.
 * One window covers every layer; the same calls a ring's stages make (embed, window run,
 * head, sampler) run one after the other here. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gguf/gguf.h"
#include "kernels/kern.h"
#include "kvctl/kvctl.h"
#include "model/model.h"
#include "util/err.h"

#define MAX_TOKENS (1u << 20)

/* CPU seconds used by the whole process (every thread). */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Tokenise a prompt as llama.cpp's tools do: BOS/EOS as the vocabulary asks, special-token
 * text recognised. */
static int tokenize_prompt(const struct model_vocab *v, const char *text, int32_t **out,
                           uint32_t *n)
{
    size_t len = strlen(text), cnt = 0;
    if (len > MAX_TOKENS) {
        fprintf(stderr, "prompt longer than %u bytes\n", MAX_TOKENS);
        return -EINVAL;
    }
    size_t cap = len + 4;
    int32_t *t = malloc(cap * sizeof *t);
    if (!t)
        return -ENOMEM;
    int rc = model_tokenize(v, text, len, true, true, t, cap, &cnt);
    if (rc == -ENOSPC) {
        free(t);
        cap = cnt;
        t = malloc(cap * sizeof *t);
        rc = t ? model_tokenize(v, text, len, true, true, t, cap, &cnt) : -ENOMEM;
    }
    if (rc < 0 || cnt > MAX_TOKENS) {
        fprintf(stderr, "tokenize: %s\n", rc < 0 ? strerror(-rc) : "too many tokens");
        free(t);
        return rc < 0 ? rc : -EINVAL;
    }
    *out = t;
    *n = (uint32_t)cnt;
    return 0;
}

/* A whole model in one window, an executor and its buffers. */
struct runner {
    struct model *m;
    struct model_exec *e;
    const struct model_hparams *hp;
    uint32_t n_ctx, max_batch;
    float *x;        /* [max_batch][n_embd] */
    float *logits;   /* [max_batch][n_vocab] */
    bool mtp;        /* drafting with the MTP block: a prompt feeds it as it runs */
};

static void runner_free(struct runner *r)
{
    /* the matmuls CLBlast ran; a prompt GEMM that failed was computed by the fused kernels */
    struct kern_cl_info ci;
    if (r->e && kern_cl_info(model_exec_kern_dev(r->e), &ci) == 0) {
        if (ci.gemm_calls)
            fprintf(stderr, "opencl: %" PRIu64 " matmuls through CLBlast\n", ci.gemm_calls);
        if (ci.gemm_fallbacks)
            fprintf(stderr, "opencl: %s\n", ci.gemm_error);
    }
    model_exec_free(r->e);
    model_free(r->m);
    free(r->x);
    free(r->logits);
}

static int runner_open(struct runner *r, const char *path, int n_threads, uint32_t n_ctx,
                       uint32_t max_batch, const char *device, const struct kern_cl_opts *cl,
                       const char *cmd)
{
    memset(r, 0, sizeof *r);
    char err[KV_ERR_MAX];
    int rc = model_open(&r->m, path, -1, -1, err, sizeof err);
    if (rc < 0) {
        /* the gguf module's messages already start with the path */
        bool named = !strncmp(err, path, strlen(path)) && err[strlen(path)] == ':';
        fprintf(stderr, "kvctl %s: %s%s%s\n", cmd, named ? "" : path, named ? "" : ": ", err);
        return rc;
    }
    r->hp = model_get_hparams(r->m);
    err[0] = 0;
    if (!model_has_embed(r->m) || !model_has_head(r->m)) {
        fprintf(stderr, "kvctl %s: %s holds a window, not the whole model\n", cmd, path);
        runner_free(r);
        return -EINVAL;
    }
    if (n_ctx == 0)
        n_ctx = r->hp->n_ctx_train < 4096 ? r->hp->n_ctx_train : 4096;
    if (max_batch > n_ctx)
        max_batch = n_ctx;
    r->n_ctx = n_ctx;
    r->max_batch = max_batch;
    struct model_exec_opts o = {device, n_threads, n_ctx, max_batch, cl};
    if ((rc = model_exec_new_opts(&r->e, r->m, &o, err, sizeof err)) < 0) {
        fprintf(stderr, "kvctl %s: executor: %s\n", cmd, err[0] ? err : strerror(-rc));
        runner_free(r);
        return rc;
    }
    struct kern_cl_info ci;
    if (kern_cl_info(model_exec_kern_dev(r->e), &ci) == 0) {
        char gemm[48] = "off";
        if (ci.gemm_rows)
            snprintf(gemm, sizeof gemm, "from %u rows", ci.gemm_rows);
        fprintf(stderr, "opencl: %s, %s layout, weights %s (%" PRIu64 " bytes wrapped in place, %" PRIu64
                " copied), prompt GEMMs (CLBlast) %s\n", ci.device, ci.layout, ci.weights,
                ci.weights_mapped, ci.weights_copied, gemm);
    }
    r->x = malloc((size_t)max_batch * r->hp->n_embd * sizeof(float));
    r->logits = malloc((size_t)max_batch * r->hp->n_vocab * sizeof(float));
    if (!r->x || !r->logits) {
        runner_free(r);
        return -ENOMEM;
    }
    return 0;
}

/* Feed tokens[0..n) at pos.. for session 1; the logits of every row go to all_logits
 * (n x n_vocab) when given, the last row's always to r->logits. */
static int runner_feed(struct runner *r, uint32_t pos, const int32_t *tokens, uint32_t n,
                       float *all_logits)
{
    int rc;
    for (uint32_t done = 0; done < n;) {
        uint32_t nb = n - done < r->max_batch ? n - done : r->max_batch;
        if ((rc = model_embed(r->e, tokens + done, nb, r->x)) < 0)
            return rc;
        if ((rc = model_window_run(r->e, 1, pos + done, nb, r->x)) < 0)
            return rc;
        /* the MTP block's entries of a prompt's rows (tokens is the prompt, from 0) */
        if (r->mtp && pos == 0 &&
            (rc = model_mtp_draft(r->e, 1, done, nb, r->x, tokens, n, 0, NULL, NULL)) < 0)
            return rc;
        if (all_logits) {
            float *dst = all_logits + (size_t)done * r->hp->n_vocab;
            if ((rc = model_head(r->e, r->x, nb, dst)) < 0)
                return rc;
            if (done + nb == n)
                memcpy(r->logits, dst + (size_t)(nb - 1) * r->hp->n_vocab,
                       r->hp->n_vocab * sizeof(float));
        } else if (done + nb == n) {
            if ((rc = model_head(r->e, r->x + (size_t)(nb - 1) * r->hp->n_embd, 1,
                                 r->logits)) < 0)
                return rc;
        }
        done += nb;
    }
    return 0;
}

/* Every id below n_vocab, or an error naming the first that is not. */
static int check_ids(const char *cmd, const int32_t *t, uint32_t n, uint32_t n_vocab)
{
    for (uint32_t i = 0; i < n; i++)
        if (t[i] < 0 || (uint32_t)t[i] >= n_vocab) {
            fprintf(stderr, "kvctl %s: --tokens: tokens[%u] = %d is not a token id in [0, %u) (the vocabulary)\n",
                    cmd, i, t[i], n_vocab);
            return -EINVAL;
        }
    return 0;
}

static const char *feed_error(int rc)
{
    switch (rc) {
    case -EINVAL: return "a token id outside the vocabulary";
    case -ERANGE: return "past the context length (--ctx)";
    default: return strerror(-rc);
    }
}

/* ---- generate ---- */

/* --device NAME (or --backend NAME, the ring's word) and the opencl device's choice. */
#define DEVICE_OPTIONS \
    {"device", required_argument, 0, OPT_DEVICE}, {"backend", required_argument, 0, OPT_DEVICE}, \
    {"cl-platform", required_argument, 0, OPT_CL_PLATFORM}, \
    {"cl-device", required_argument, 0, OPT_CL_DEVICE}, \
    {"cl-weights", required_argument, 0, OPT_CL_WEIGHTS}
#define DEVICE_USAGE \
    "  --device NAME      kernel device: cpu (default), ref (the scalar oracle) or opencl\n" \
    "                     (--backend NAME is the same)\n" \
    "  --cl-platform N, --cl-device N  the OpenCL platform and device, numbered as clinfo\n" \
    "                     lists them (default 0, 0)\n" \
    "  --cl-weights MODE  opencl weights: map (wrapped in place over the mapped file), copy\n" \
    "                     (uploaded), auto (map where the device shares host memory; default)\n"

static void generate_usage(FILE *f)
{
    fprintf(f,
        "usage: kvctl generate -m FILE (-p TEXT | --tokens 1,2,3) [-n N] [options]\n"
        "  -n N               tokens to generate (default 64)\n"
        "  --temp T           temperature (default 0.8; 0 = greedy)\n"
        "  --top-k K          keep the K most likely (default 40; 0 = off)\n"
        "  --top-p P          keep the smallest set with mass >= P (default 0.95; 1 = off)\n"
        "  --min-p P          drop tokens below P x the best one's probability (default 0.05)\n"
        "  --repeat-penalty R penalise the last --repeat-last-n tokens (default 1 = off)\n"
        "  --repeat-last-n N  (default 64)\n"
        "  --freq-penalty F, --presence-penalty F  (default 0)\n"
        "  --seed S           RNG seed: the same seed reproduces a run (default: random, printed)\n"
        "  -t N               threads (default: one per CPU)\n"
        DEVICE_USAGE
        "  --ctx N            context length (default: the model's, at most 4096)\n"
        "  --ignore-eos       keep going past the end-of-text token\n"
        "  --ids              print token ids instead of text\n"
        "  --stop S           stop when the generated text contains S (repeatable)\n"
        "  --dump-logits FILE write the last sampled position's logits (raw f32) to FILE\n"
        "  --draft MODE       speculative decoding (default none): lookup (prompt-lookup drafts,\n"
        "                     any model), mtp (the model's MTP block: Qwen3.5), auto (mtp where\n"
        "                     the model has the block, else lookup), none: the same tokens in\n"
        "                     fewer passes when drafts are accepted\n"
        "  --draft-max K      drafts verified per pass, 1..14 (default 8)\n"
        "Streams the generated text to stdout; prompt and generation speed go to stderr.\n"
        "Through a running ring: kvctl generate --ring DIR|ring.json|unix:SOCKET ... (the same\n"
        "options; kvctl generate --ring DIR --help).\n");
}

enum { OPT_TOKENS = KVCTL_OPT_SAMPLING_END, OPT_CTX, OPT_IGNORE_EOS, OPT_IDS, OPT_STOP, OPT_DUMP,
       OPT_BATCH, OPT_BW, OPT_DEVICE, OPT_SESSIONS, OPT_CL_PLATFORM, OPT_CL_DEVICE,
       OPT_CL_WEIGHTS, OPT_DRAFT, OPT_DRAFT_MAX };

static int cl_opt(struct kern_cl_opts *o, int c, const char *arg)
{
    return kvctl_cl_option(o, c == OPT_CL_PLATFORM ? "--cl-platform"
                           : c == OPT_CL_DEVICE ? "--cl-device" : "--cl-weights", arg);
}

/* Draw a token from logits[n_vocab] (the sampler may change them), their raw values kept in
 * dump first when given (--dump-logits, as a ring's). The token, or -1 with the generation
 * failed and the reason said. */
static int32_t draw(struct model_gen *gen, struct model_sampler *smp, float *logits,
                    uint32_t n_vocab, float *dump, bool *dumped)
{
    if (dump) {
        memcpy(dump, logits, (size_t)n_vocab * sizeof *dump);
        *dumped = true;
    }
    int32_t tok = model_sampler_sample(smp, logits, NULL);
    if (tok < 0) {
        model_gen_fail(gen);
        fprintf(stderr, "kvctl generate: no token can be sampled (logits all -inf/NaN)\n");
    }
    return tok;
}

/* Push tok into the generation and print what it adds: true when the generation ended (tok
 * not taken, or it ended it). */
static bool emit_token(struct model_gen *gen, struct model_sampler *smp, int32_t tok, bool print_ids)
{
    struct model_gen_step st;
    model_gen_push(gen, tok, &st);
    if (!st.emit)
        return true;
    model_sampler_accept(smp, tok);
    if (print_ids)
        printf("%s%d", model_gen_n_gen(gen) > 1 ? " " : "", tok);
    else
        fwrite(st.text, 1, st.len, stdout);
    fflush(stdout);
    return st.reason != MODEL_GEN_RUNNING;
}

int kvctl_cmd_generate(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"prompt", required_argument, 0, 'p'},
        {"n-predict", required_argument, 0, 'n'}, {"threads", required_argument, 0, 't'},
        KVCTL_SAMPLING_OPTIONS, {"tokens", required_argument, 0, OPT_TOKENS},
        {"ctx", required_argument, 0, OPT_CTX}, {"ignore-eos", no_argument, 0, OPT_IGNORE_EOS},
        {"ids", no_argument, 0, OPT_IDS}, {"stop", required_argument, 0, OPT_STOP},
        {"dump-logits", required_argument, 0, OPT_DUMP}, {"help", no_argument, 0, 'h'},
        {"draft", required_argument, 0, OPT_DRAFT}, {"draft-max", required_argument, 0, OPT_DRAFT_MAX},
        DEVICE_OPTIONS, {0, 0, 0, 0}};
    for (int i = 1; i < argc; i++)   /* through a running ring: kvctl/ring.c */
        if (!strcmp(argv[i], "--ring") || !strncmp(argv[i], "--ring=", 7))
            return kvctl_ring_generate(argc, argv);
    const char *path = NULL, *prompt = NULL, *toks = NULL, *dump = NULL, *device = "cpu";
    struct kern_cl_opts cl = KERN_CL_OPTS_INIT;
    const char *stops[MODEL_GEN_MAX_STOPS];
    uint32_t n_stops = 0;
    long n_gen = 64, threads = 0, ctx = 0, draft_max = 8;
    bool ignore_eos = false, print_ids = false;
    int dmode = MODEL_DRAFT_NONE;
    struct model_sampler_params sp;
    model_sampler_params_default(&sp);
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:p:n:t:h", opts, NULL)) != -1) {
        int rc = 0;
        switch (c) {
        case 'm': path = optarg; break;
        case 'p': prompt = optarg; break;
        case 'n': rc = kvctl_parse_long("-n", optarg, 0, MAX_TOKENS, &n_gen); break;
        case 't': rc = kvctl_parse_long("-t", optarg, 0, 1024, &threads); break;
        case OPT_TOKENS: toks = optarg; break;
        case OPT_CTX: rc = kvctl_parse_long("--ctx", optarg, 1, 1 << 20, &ctx); break;
        case OPT_IGNORE_EOS: ignore_eos = true; break;
        case OPT_IDS: print_ids = true; break;
        case OPT_STOP: rc = kvctl_stop_add(optarg, stops, MODEL_GEN_MAX_STOPS, &n_stops); break;
        case OPT_DUMP: dump = optarg; break;
        case OPT_DRAFT:
            if ((dmode = model_draft_mode(optarg)) < 0) {
                fprintf(stderr, "kvctl generate: --draft '%s': lookup, mtp, auto or none\n", optarg);
                return 2;
            }
            break;
        case OPT_DRAFT_MAX: rc = kvctl_parse_long("--draft-max", optarg, 1, MODEL_DRAFT_MAX, &draft_max); break;
        case OPT_DEVICE: device = optarg; break;
        case OPT_CL_PLATFORM: case OPT_CL_DEVICE: case OPT_CL_WEIGHTS: rc = cl_opt(&cl, c, optarg); break;
        case 'h': generate_usage(stdout); return 0;
        default:
            if ((rc = kvctl_sampling_opt(c, optarg, &sp)) > 0) {
                generate_usage(stderr);
                return 2;
            }
        }
        if (rc < 0)
            return 2;
    }
    if (!path || (!prompt && !toks) || optind != argc) {
        generate_usage(stderr);
        if (optind != argc)
            fprintf(stderr, "kvctl generate: unexpected argument '%s' (quote the prompt: -p \"...\")\n",
                    argv[optind]);
        else
            fprintf(stderr, "kvctl generate: %s is required\n",
                    !path ? "-m FILE (or --ring DIR)" : "-p TEXT or --tokens 1,2,3");
        return 2;
    }
    if (kvctl_sampling_seed(&sp, "kvctl generate") < 0)
        return 2;
    if (prompt && toks) {
        fprintf(stderr, "kvctl generate: -p and --tokens exclude each other\n");
        return 2;
    }
    int32_t *tokens = NULL;
    uint32_t n_prompt = 0;
    int ret = 1;
    struct runner r;
    struct model_sampler *smp = NULL;
    struct model_vocab *voc = NULL;
    struct model_gen *gen = NULL;
    float *last_logits = NULL, *dlogits = NULL;
    if (runner_open(&r, path, (int)threads, (uint32_t)ctx, 512, device, &cl, "generate") < 0)
        return 1;
    if (dmode == MODEL_DRAFT_AUTO)
        dmode = model_has_mtp(r.m) ? MODEL_DRAFT_MTP : MODEL_DRAFT_LOOKUP;
    if (dmode == MODEL_DRAFT_MTP && !model_has_mtp(r.m)) {
        fprintf(stderr, "kvctl generate: --draft mtp: %s has no MTP block (%s.nextn_predict_layers)\n",
                path, r.hp->arch);
        runner_free(&r);
        return 2;
    }
    bool draft = dmode != MODEL_DRAFT_NONE;
    r.mtp = dmode == MODEL_DRAFT_MTP;
    char err[KV_ERR_MAX];
    int rc = model_vocab_load(&voc, model_get_gguf(r.m), err, sizeof err);
    if (rc < 0 && (prompt || !print_ids)) {
        fprintf(stderr, "kvctl generate: %s: vocabulary: %s%s\n", path, err,
                prompt ? "" : " (--ids prints token ids without it)");
        goto out;
    }
    if (prompt)
        rc = tokenize_prompt(voc, prompt, &tokens, &n_prompt);
    else
        rc = kvctl_parse_tokens(toks, MAX_TOKENS, &tokens, &n_prompt);
    if (rc < 0) {
        ret = 2;
        goto out;
    }
    if (check_ids("generate", tokens, n_prompt, r.hp->n_vocab) < 0)
        goto out;   /* exit 1, as through a ring */
    if (n_prompt == 0) {
        fprintf(stderr, "kvctl generate: empty prompt\n");
        ret = 2;
        goto out;
    }
    /* As through a ring: the prompt must fit; the generation stops at the context. */
    if (n_prompt >= r.n_ctx) {
        fprintf(stderr, "kvctl generate: the prompt's %u tokens do not fit the context of %u "
                "(--ctx): at most %u\n", n_prompt, r.n_ctx, r.n_ctx - 1);
        goto out;
    }
    /* Rank 0's bookkeeping: without a vocabulary (--ids) no token ends the text, as before. */
    struct model_gen_params gp = {.n_ctx = r.n_ctx, .max_gen = (uint32_t)n_gen, .eos = -1,
                                  .ignore_eos = ignore_eos};
    if ((rc = model_gen_new(&gen, voc, &gp, tokens, n_prompt)) < 0 ||
        (rc = model_gen_set_stops(gen, stops, n_stops)) < 0) {
        fprintf(stderr, "kvctl generate: %s\n", strerror(-rc));
        goto out;
    }
    if (dump && !(last_logits = malloc((size_t)r.hp->n_vocab * sizeof *last_logits)))
        goto out;
    rc = model_sampler_new(&smp, &sp, r.hp->n_vocab);
    if (rc < 0) {
        fprintf(stderr, "kvctl generate: sampler: %s\n", strerror(-rc));
        goto out;
    }
    if ((rc = model_session_new(r.e, 1)) < 0)
        goto out;
    for (uint32_t i = 0; i < n_prompt; i++)
        model_sampler_accept(smp, tokens[i]);

    double t0 = util_now_s();
    if ((rc = runner_feed(&r, 0, tokens, n_prompt, NULL)) < 0) {
        fprintf(stderr, "kvctl generate: prompt: %s\n", feed_error(rc));
        goto out;
    }
    double t1 = util_now_s();
    bool dumped = false;
    uint32_t pos = n_prompt;
    /* a window with recurrent layers cannot rewind: its state is checkpointed before a pass
     * of drafts and, when one is rejected, restored and the accepted rows run again */
    bool ckpt = draft && !model_exec_can_rewind(r.e);
    /* Speculative decoding (docs/model.md, "Drafting"): each pass feeds the sampled token with
     * up to draft_max prompt-lookup drafts; the sampler draws at each verified row in turn,
     * exactly as it would one token at a time, and a draft counts while it equals the token
     * drawn. So greedy and seeded output are the output without drafts; a pass yields the
     * accepted drafts and one token more. */
    int32_t drafts[MODEL_DRAFT_MAX + 1];
    dlogits = draft ? malloc((size_t)(MODEL_DRAFT_MAX + 1) * r.hp->n_vocab * sizeof(float)) : NULL;
    if (draft && !dlogits)
        goto out;
    uint64_t n_passes = 0, n_proposed = 0, n_accepted = 0, n_recomputed = 0;
    int32_t next = -1;   /* a token drawn at a rejected draft's row: fed without drawing again */
    float *lg = r.logits;
    /* the rows of the last pass whose tokens stand (r.x), which the MTP block reads next:
     * after the prompt its last row */
    uint32_t xpos = n_prompt - 1, xn = 1;
    const float *xrows = r.x + (size_t)((n_prompt - 1) % r.max_batch) * r.hp->n_embd;
    while (model_gen_reason(gen) == MODEL_GEN_RUNNING) {
        int32_t tok = next;
        if (tok < 0) {
            if ((tok = draw(gen, smp, lg, r.hp->n_vocab, last_logits, &dumped)) < 0)
                goto out;
            if (emit_token(gen, smp, tok, print_ids))
                break;
        }
        next = -1;
        /* drafts: what followed the last n-gram before, or the MTP block's guesses after the
         * rows that stand, no further than the context and -n */
        uint32_t nd = 0;
        if (draft) {
            uint32_t nh;
            const int32_t *h = model_gen_history(gen, &nh);
            uint32_t room = r.n_ctx - 1 - pos, left = (uint32_t)n_gen - model_gen_n_gen(gen);
            uint32_t k = (uint32_t)draft_max < room ? (uint32_t)draft_max : room;
            k = k < left ? k : left;
            if (!r.mtp) {
                nd = model_draft_lookup(h, nh, k, drafts + 1);
            } else if ((rc = model_mtp_draft(r.e, 1, xpos, xn, xrows, h, nh, k, drafts + 1,
                                             NULL)) < 0) {
                fprintf(stderr, "kvctl generate: MTP drafts: %s\n", strerror(-rc));
                goto out;
            } else {
                nd = (uint32_t)rc;
            }
        }
        drafts[0] = tok;
        n_passes++;
        n_proposed += nd;
        if (ckpt && nd && (rc = model_session_checkpoint(r.e, 1)) < 0) {
            fprintf(stderr, "kvctl generate: checkpoint: %s\n", strerror(-rc));
            goto out;
        }
        uint32_t pos0 = pos;
        if ((rc = runner_feed(&r, pos, drafts, nd + 1, nd ? dlogits : NULL)) < 0) {
            fprintf(stderr, "kvctl generate: %s\n", feed_error(rc));
            goto out;
        }
        pos++;
        lg = r.logits;
        xpos = pos0;
        xn = nd + 1;
        xrows = r.x;
        for (uint32_t i = 0; i < nd; i++) {   /* row i: the distribution after drafts[0..i] */
            int32_t t = draw(gen, smp, dlogits + (size_t)i * r.hp->n_vocab, r.hp->n_vocab,
                             last_logits, &dumped);
            if (t < 0)
                goto out;
            if (emit_token(gen, smp, t, print_ids))
                goto done;
            if (t != drafts[i + 1]) {   /* rejected: t goes in at drafts[i + 1]'s position */
                next = t;
                xn = i + 1;
                /* the recurrent state ran past it: back to before the pass, and the rows
                 * kept (the token and i accepted drafts) again */
                if (ckpt && ((rc = model_session_restore(r.e, 1)) < 0 ||
                             (rc = runner_feed(&r, pos0, drafts, i + 1, NULL)) < 0)) {
                    fprintf(stderr, "kvctl generate: restoring the state: %s\n", strerror(-rc));
                    goto out;
                }
                n_recomputed += ckpt ? i + 1 : 0;
                break;
            }
            n_accepted++;
            pos++;
            lg = dlogits + (size_t)(i + 1) * r.hp->n_vocab;
        }
    }
done:;
    const char *txt;
    size_t len;
    if (!print_ids && model_gen_flush(gen, &txt, &len) == 0 && txt)
        fwrite(txt, 1, len, stdout);
    printf("\n");
    fflush(stdout);   /* the text before the statistics, also when both go to one pipe */
    double t2 = util_now_s();
    uint32_t n_done = model_gen_n_gen(gen);
    fprintf(stderr, "prompt: %u tokens in %.3f s (%.2f tok/s); generation: %u tokens in %.3f s "
            "(%.2f tok/s)\n", n_prompt, t1 - t0, n_prompt / (t1 - t0), n_done, t2 - t1,
            n_done > 0 ? n_done / (t2 - t1) : 0.0);
    if (draft)
        fprintf(stderr, "drafts: %" PRIu64 " proposed, %" PRIu64 " accepted; %" PRIu64 " passes for "
                "%u tokens (%.2f tokens a pass)\n", n_proposed, n_accepted, n_passes, n_done,
                n_passes ? (double)n_done / (double)n_passes : 0.0);
    if (draft && !model_exec_can_rewind(r.e))
        fprintf(stderr, "drafts: recurrent state restored after rejected drafts, %" PRIu64
                " rows run again\n", n_recomputed);
    if (model_gen_reason(gen) == MODEL_GEN_CONTEXT)
        fprintf(stderr, "kvctl generate: stopped at the context length: %u prompt + %u generated "
                "tokens (--ctx %u)\n", n_prompt, n_done, r.n_ctx);
    ret = 0;
    if (dump && kvctl_dump_logits(dump, dumped ? last_logits : NULL, r.hp->n_vocab) < 0)
        ret = 1;
out:
    free(dlogits);
    free(last_logits);
    model_gen_free(gen);
    model_vocab_free(voc);
    model_sampler_free(smp);
    runner_free(&r);
    free(tokens);
    return ret;
}

/* ---- logits ---- */

static void logits_usage(FILE *f)
{
    fprintf(f,
        "usage: kvctl logits -m FILE (--tokens 1,2,3 | -p TEXT) -o OUT.f32 [-t N] [--batch B]\n"
        "                    [--device cpu|ref|opencl] [--cl-platform N] [--cl-device N]\n"
        "Teacher-forced logits: row i = logits after feeding tokens[0..i] at positions 0..i,\n"
        "written as raw little-endian float32 [n_tokens][n_vocab]. The tokens are fed in\n"
        "batches of B rows (default: all at once). --device ref runs the scalar oracle,\n"
        "--device opencl (or --backend opencl) an OpenCL device (docs/opencl.md).\n");
}

int kvctl_cmd_logits(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"tokens", required_argument, 0, OPT_TOKENS},
        {"prompt", required_argument, 0, 'p'},
        {"output", required_argument, 0, 'o'}, {"threads", required_argument, 0, 't'},
        {"batch", required_argument, 0, OPT_BATCH}, {"ctx", required_argument, 0, OPT_CTX},
        DEVICE_OPTIONS, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    const char *path = NULL, *toks = NULL, *outp = NULL, *prompt = NULL, *device = "cpu";
    struct kern_cl_opts cl = KERN_CL_OPTS_INIT;
    long threads = 0, batch = 0, ctx = 0;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:o:t:p:h", opts, NULL)) != -1) {
        int rc = 0;
        switch (c) {
        case 'm': path = optarg; break;
        case 'p': prompt = optarg; break;
        case 'o': outp = optarg; break;
        case 't': rc = kvctl_parse_long("-t", optarg, 0, 1024, &threads); break;
        case OPT_TOKENS: toks = optarg; break;
        case OPT_BATCH: rc = kvctl_parse_long("--batch", optarg, 1, 1 << 20, &batch); break;
        case OPT_CTX: rc = kvctl_parse_long("--ctx", optarg, 1, 1 << 20, &ctx); break;
        case OPT_DEVICE: device = optarg; break;
        case OPT_CL_PLATFORM: case OPT_CL_DEVICE: case OPT_CL_WEIGHTS: rc = cl_opt(&cl, c, optarg); break;
        case 'h': logits_usage(stdout); return 0;
        default: logits_usage(stderr); return 2;
        }
        if (rc < 0)
            return 2;
    }
    if (!path || !toks == !prompt || !outp || optind != argc) {
        logits_usage(stderr);
        return 2;
    }
    int32_t *tokens;
    uint32_t n;
    if (toks && kvctl_parse_tokens(toks, MAX_TOKENS, &tokens, &n) < 0)
        return 2;
    if (prompt) {           /* the vocabulary alone: metadata, no tensors mapped */
        struct gguf_file *gf = NULL;
        struct model_vocab *voc = NULL;
        char err[KV_ERR_MAX];
        int rc = gguf_file_open(&gf, path, err, sizeof err);
        if (rc == 0)
            rc = model_vocab_load(&voc, gf, err, sizeof err);
        if (rc == 0)
            rc = tokenize_prompt(voc, prompt, &tokens, &n);
        else
            fprintf(stderr, "kvctl logits: %s: %s\n", path, err);
        model_vocab_free(voc);
        gguf_file_free(gf);
        if (rc < 0)
            return rc == -EINVAL ? 2 : 1;
    }
    if (n == 0) {
        fprintf(stderr, "kvctl logits: no tokens\n");
        free(tokens);
        return 2;
    }
    if (ctx == 0)
        ctx = n;
    if (batch == 0 || batch > n)
        batch = n;
    int ret = 1;
    float *all = NULL;
    FILE *fo = NULL;
    struct runner r;
    if (runner_open(&r, path, (int)threads, (uint32_t)ctx, (uint32_t)batch, device, &cl, "logits") < 0) {
        free(tokens);
        return 1;
    }
    int rc;
    if (check_ids("logits", tokens, n, r.hp->n_vocab) < 0)
        goto out;
    if ((rc = model_session_new(r.e, 1)) < 0)
        goto out;
    all = malloc((size_t)n * r.hp->n_vocab * sizeof(float));
    if (!all) {
        fprintf(stderr, "kvctl logits: out of memory for %u x %u logits\n", n, r.hp->n_vocab);
        goto out;
    }
    if ((rc = runner_feed(&r, 0, tokens, n, all)) < 0) {
        fprintf(stderr, "kvctl logits: %s\n", feed_error(rc));
        goto out;
    }
    fo = fopen(outp, "wb");
    if (!fo || fwrite(all, sizeof(float) * r.hp->n_vocab, n, fo) != n) {
        fprintf(stderr, "kvctl logits: %s: %s\n", outp, strerror(errno));
        goto out;
    }
    if (fclose(fo) != 0) {
        fo = NULL;
        fprintf(stderr, "kvctl logits: %s: %s\n", outp, strerror(errno));
        goto out;
    }
    fo = NULL;
    fprintf(stderr, "%u rows x %u logits -> %s\n", n, r.hp->n_vocab, outp);
    ret = 0;
out:
    if (fo)
        fclose(fo);
    free(all);
    runner_free(&r);
    free(tokens);
    return ret;
}

/* ---- bench ---- */

static void bench_usage(FILE *f)
{
    fprintf(f,
        "usage: kvctl bench -m FILE [-p 64] [-n 32] [-t N] [-r 1] [--bandwidth] [--sessions K,..]\n"
        "Prompt processing (one batch of -p tokens) and text generation (-n tokens one at a\n"
        "time) speed in tokens/s, like llama-bench's pp and tg; -r repetitions (best kept).\n"
        "Also prints the bytes of weights read per generated token; --bandwidth measures the\n"
        "memory read bandwidth too (the ceiling for generation: bandwidth / those bytes).\n"
        "--sessions 1,4,8: for each K, K sessions (each prefilled with its own -p tokens)\n"
        "generate -n tokens together, one row per session in each batched window pass (what a\n"
        "ring stage does with concurrent sessions): aggregate tok/s and its ratio to K = 1.\n"
        DEVICE_USAGE);
}

/* K sessions decoding together: each prefilled alone with its own n_pp tokens (untimed), then
 * n_tg steps of one row per session in one model_window_run_batch, the head over the K rows
 * and a greedy pick each. The best aggregate tok/s of reps runs into *tok_s. */
static int bench_sessions(struct runner *r, const int32_t *tokens, long n_pp, long n_tg, long reps,
                          uint32_t k, double *tok_s)
{
    uint32_t nv = r->hp->n_vocab;
    struct model_batch_row *rows = calloc(k, sizeof *rows);
    int32_t *tok = calloc(k, sizeof *tok), *prompt = calloc((size_t)n_pp + 1, sizeof *prompt);
    int rc = rows && tok && prompt ? 0 : -ENOMEM;
    *tok_s = 0;
    for (long rep = 0; rc == 0 && rep <= reps; rep++) {   /* rep 0 warms up */
        for (uint32_t s = 0; rc == 0 && s < k; s++) {
            uint64_t id = 100 + s;
            model_session_free(r->e, id);
            if ((rc = model_session_new(r->e, id)) < 0)
                break;
            /* session s's prompt: the bench's tokens rotated by s, so no two are equal */
            for (long i = 0; i <= n_pp; i++)
                prompt[i] = tokens[(i + s) % (n_pp + 1)];
            for (long done = 0; rc == 0 && done < n_pp;) {
                uint32_t nb = (uint32_t)(n_pp - done < (long)r->max_batch ? n_pp - done : r->max_batch);
                if ((rc = model_embed(r->e, prompt + done, nb, r->x)) == 0)
                    rc = model_window_run(r->e, id, (uint32_t)done, nb, r->x);
                done += nb;
            }
            rows[s] = (struct model_batch_row){.id = id, .pos = (uint32_t)n_pp};
            tok[s] = prompt[n_pp];
        }
        long steps = rep == 0 ? (n_tg < 2 ? n_tg : 2) : n_tg;
        double t0 = util_now_s();
        for (long g = 0; rc == 0 && g < steps; g++) {
            if ((rc = model_embed(r->e, tok, k, r->x)) < 0 ||
                (rc = model_window_run_batch(r->e, rows, k, r->x)) < 0 ||
                (rc = model_head(r->e, r->x, k, r->logits)) < 0)
                break;
            for (uint32_t s = 0; s < k; s++) {
                const float *lg = r->logits + (size_t)s * nv;
                uint32_t best = 0;
                for (uint32_t i = 1; i < nv; i++)
                    if (lg[i] > lg[best])
                        best = i;
                tok[s] = (int32_t)best;
                rows[s].pos++;
            }
        }
        double t = util_now_s() - t0;
        if (rc == 0 && rep > 0 && steps > 0 && k * steps / t > *tok_s)
            *tok_s = k * steps / t;
    }
    for (uint32_t s = 0; s < k; s++)
        model_session_free(r->e, 100 + s);
    free(rows);
    free(tok);
    free(prompt);
    return rc;
}

int kvctl_cmd_bench(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"threads", required_argument, 0, 't'},
        {"n-prompt", required_argument, 0, 'p'}, {"n-gen", required_argument, 0, 'n'},
        {"repetitions", required_argument, 0, 'r'}, {"help", no_argument, 0, 'h'},
        {"bandwidth", no_argument, 0, OPT_BW}, {"sessions", required_argument, 0, OPT_SESSIONS},
        DEVICE_OPTIONS, {0, 0, 0, 0}};
    bool want_bw = false;
    const char *path = NULL, *device = "cpu";
    struct kern_cl_opts cl = KERN_CL_OPTS_INIT;
    long sess[16], n_sess = 0, max_sess = 1;
    long threads = 0, n_pp = 64, n_tg = 32, reps = 1;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:t:p:n:r:h", opts, NULL)) != -1) {
        int rc = 0;
        switch (c) {
        case 'm': path = optarg; break;
        case 't': rc = kvctl_parse_long("-t", optarg, 0, 1024, &threads); break;
        case 'p': rc = kvctl_parse_long("-p", optarg, 0, 65536, &n_pp); break;
        case 'n': rc = kvctl_parse_long("-n", optarg, 0, 65536, &n_tg); break;
        case 'r': rc = kvctl_parse_long("-r", optarg, 1, 100, &reps); break;
        case OPT_BW: want_bw = true; break;
        case OPT_DEVICE: device = optarg; break;
        case OPT_CL_PLATFORM: case OPT_CL_DEVICE: case OPT_CL_WEIGHTS: rc = cl_opt(&cl, c, optarg); break;
        case OPT_SESSIONS:
            for (char *save = NULL, *t = strtok_r(optarg, ",", &save); t && rc == 0;
                 t = strtok_r(NULL, ",", &save)) {
                if (n_sess == (long)(sizeof sess / sizeof sess[0])) {
                    fprintf(stderr, "kvctl bench: --sessions: at most %zu counts\n", sizeof sess / sizeof sess[0]);
                    rc = -EINVAL;
                } else if ((rc = kvctl_parse_long("--sessions", t, 1, 64, &sess[n_sess])) == 0 &&
                           sess[n_sess++] > max_sess) {
                    max_sess = sess[n_sess - 1];
                }
            }
            break;
        case 'h': bench_usage(stdout); return 0;
        default: bench_usage(stderr); return 2;
        }
        if (rc < 0)
            return 2;
    }
    if (!path || optind != argc) {
        bench_usage(stderr);
        return 2;
    }
    uint32_t ctx = (uint32_t)(n_pp + n_tg + 1);
    struct runner r;
    uint32_t mb = n_pp > max_sess ? (uint32_t)n_pp : (uint32_t)max_sess;
    if (runner_open(&r, path, (int)threads, ctx, mb, device, &cl, "bench") < 0)
        return 1;
    int ret = 1, rc;
    int32_t *tokens = malloc((size_t)(n_pp + 1) * sizeof *tokens);
    if (!tokens)
        goto out;
    /* Deterministic pseudo-random token ids. */
    uint64_t st = 12345;
    for (long i = 0; i <= n_pp; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        tokens[i] = (int32_t)((st >> 33) % r.hp->n_vocab);
    }
    double best_pp = 0, best_tg = 0, best_tg_cpu = 0;
    for (long rep = 0; rep <= reps; rep++) {    /* rep 0 warms up (pages in the weights) */
        model_session_free(r.e, 1);
        if ((rc = model_session_new(r.e, 1)) < 0)
            goto out;
        double t0 = util_now_s();
        if (n_pp > 0 && (rc = runner_feed(&r, 0, tokens, (uint32_t)n_pp, NULL)) < 0) {
            fprintf(stderr, "kvctl bench: %s\n", feed_error(rc));
            goto out;
        }
        double t1 = util_now_s();
        /* Generation: each step feeds the greedy choice of the previous one. */
        int32_t tok = tokens[n_pp];
        uint32_t pos = (uint32_t)n_pp;
        double c1 = cpu_s();
        long n_steps = rep == 0 ? (n_tg < 2 ? n_tg : 2) : n_tg;
        for (long g = 0; g < n_steps; g++) {
            if ((rc = runner_feed(&r, pos++, &tok, 1, NULL)) < 0) {
                fprintf(stderr, "kvctl bench: %s\n", feed_error(rc));
                goto out;
            }
            uint32_t best = 0;
            for (uint32_t i = 1; i < r.hp->n_vocab; i++)
                if (r.logits[i] > r.logits[best])
                    best = i;
            tok = (int32_t)best;
        }
        double t2 = util_now_s(), c2 = cpu_s();
        if (rep == 0)
            continue;
        if (n_tg > 0 && (best_tg_cpu == 0 || (c2 - c1) / n_tg < best_tg_cpu))
            best_tg_cpu = (c2 - c1) / n_tg;
        if (n_pp > 0 && n_pp / (t1 - t0) > best_pp)
            best_pp = n_pp / (t1 - t0);
        if (n_tg > 0 && n_tg / (t2 - t1) > best_tg)
            best_tg = n_tg / (t2 - t1);
    }
    uint32_t first, last;
    model_get_window(r.m, &first, &last);
    printf("model %s: %s, %u layers, n_embd %u, n_vocab %u\n", path, r.hp->arch, r.hp->n_layer,
           r.hp->n_embd, r.hp->n_vocab);
    printf("threads %d, cpu %s\n", model_exec_threads(r.e), kern_cpu_level());
    printf("weight_bytes_per_token %" PRIu64 "\n", model_weight_bytes(r.m));
    if (n_pp > 0)
        printf("pp%ld %.2f tok/s\n", n_pp, best_pp);
    if (n_tg > 0) {
        printf("tg%ld %.2f tok/s\n", n_tg, best_tg);
        /* CPU time per token over all threads: what the speed would be with the threads'
         * cores to itself (and no bandwidth limit), whatever else the machine runs. */
        printf("tg_cpu_ms_per_token %.2f\n", best_tg_cpu * 1e3);
    }
    double base = 0;
    for (long i = 0; i < n_sess; i++) {
        double ts;
        if ((rc = bench_sessions(&r, tokens, n_pp, n_tg, reps, (uint32_t)sess[i], &ts)) < 0) {
            fprintf(stderr, "kvctl bench: %ld sessions: %s\n", sess[i], feed_error(rc));
            goto out;
        }
        if (sess[i] == 1)
            base = ts;
        printf("tg%ld_sessions %ld %.2f tok/s aggregate", n_tg, sess[i], ts);
        /* and what a step of K rows (one per session) costs in one-row steps: K / the ratio */
        if (base > 0)
            printf(" = %.2fx one session; a step of %ld rows costs %.2f one-row steps", ts / base,
                   sess[i], (double)sess[i] * base / ts);
        printf("\n");
    }
    if (want_bw) {
        struct kern_pool *pool = NULL;
        struct kern_dev *cld = NULL;
        char cerr[KV_ERR_MAX];
        bool on_cl = !strcmp(device, "opencl");   /* then the device's memory, not the host's */
        struct kern_dev_opts dopts = {.n_threads = 1, .cl = &cl};
        if (on_cl ? kern_dev_new_opts(&cld, "opencl", &dopts, cerr, sizeof cerr) == 0
                  : kern_pool_new(&pool, model_exec_threads(r.e)) == 0) {
            double bw = on_cl ? kern_cl_bench_bandwidth(cld, (size_t)512 << 20)
                              : kern_bench_bandwidth(pool, (size_t)512 << 20);
            kern_dev_free(cld);
            kern_pool_free(pool);
            double ceil = bw * 1e9 / (double)model_weight_bytes(r.m);
            printf("bandwidth %.2f GB/s%s\n", bw, on_cl ? " (OpenCL device)" : "");
            if (n_tg > 0 && bw > 0)
                printf("tg ceiling %.2f tok/s (bandwidth / weight bytes), reached %.0f%%\n", ceil,
                       100.0 * best_tg / ceil);
        }
    }
    ret = 0;
out:
    free(tokens);
    runner_free(&r);
    return ret;
}

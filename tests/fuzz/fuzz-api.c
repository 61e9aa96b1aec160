/* fuzz-api — libFuzzer target for what a client of the OpenAI-compatible API controls: the
 * route, the JSON body (completions and chat, streamed or not), an Authorization header, and
 * whether it half-closes at once (a client gone mid-answer), against a stand-in generator that
 * answers with awkward token texts (quotes, control bytes, cut UTF-8, stop-string pieces) and
 * sometimes refuses or fails. It checks what the API promises the generators behind it (kvd's
 * ring and kvctl serve): a prompt of 1 to n_ctx - 1 ids each in the vocabulary, bounded stops
 * and drafts, sampling parameters the sampler takes and samples with; that every answer with a
 * length is one JSON document; that the server answers or closes within 5 s; and that every
 * generation it started ends (done or cancelled) once the client is gone.
 * The first byte picks the route and the behaviours; the rest is the body.
 * fuzz-modules: util wtype gguf net api model/tok model/chat model/sampler model/gen */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <uv.h>

#include "api/api.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "tests/lib/fuzz_client.h"
#include "util/util.h"

#define N_CTX 64
#define RESP_MAX (1u << 20)

static uv_loop_t loop;
static struct api_server *srv;
static struct model_vocab *vocab;
static uint32_t n_vocab;
static int port;
static int behaviour;   /* the generator's answer to the next start: 0 ok, 1 busy, 2 error at end */
static int live;        /* generations started and not yet ended or cancelled */

/* Token texts a model can produce, the awkward ones on purpose: JSON escapes, control bytes,
 * a 3-byte character cut in two, an invalid byte, a piece of a likely stop string. */
static const char *const texts[] = {"Hello", " \"quoted\"", "\\", "\n\t", "\x01\x1f", "\xe2\x82",
                                    "\xac", "\xff", "</s", "top>", "", " world"};
#define N_TEXTS (sizeof texts / sizeof texts[0])

struct fgen {
    uv_timer_t t;
    struct api_gen_sink sink;
    void *ud;
    uint32_t left, k;
    bool logits, fail;
    float *lg;
};

static void fgen_closed(uv_handle_t *h)
{
    struct fgen *g = h->data;
    free(g->lg);
    free(g);
}

static void fgen_end(struct fgen *g)
{
    uv_timer_stop(&g->t);
    uv_close((uv_handle_t *)&g->t, fgen_closed);
    live--;
}

static void fgen_tick(uv_timer_t *t)
{
    struct fgen *g = t->data;
    if (g->left == 0) {
        struct api_gen_sink s = g->sink;
        void *ud = g->ud;
        bool fail = g->fail;
        fgen_end(g);   /* before done: the API may free what ud points at */
        if (fail)
            s.done(ud, NULL, "the stand-in generator failed", NULL, 0);
        else
            s.done(ud, "length", NULL, "", 0);
        return;
    }
    const char *tx = texts[g->k % N_TEXTS];
    struct api_gen_token tok = {(int32_t)((g->k * 37u) % n_vocab), tx, strlen(tx), NULL};
    if (g->logits) {
        for (uint32_t i = 0; i < n_vocab; i++)
            g->lg[i] = (float)((i * 13u + g->k) % 29u) - 14.0f;
        tok.logits = g->lg;
    }
    g->k++;
    g->left--;
    g->sink.token(g->ud, &tok);
}

static int fgen_start(void *impl, const struct api_gen_req *r, const struct api_gen_sink *sink,
                      void *sink_ud, void **handle, char *err, size_t errlen)
{
    (void)impl;
    /* what the API must have checked before a generator sees the request */
    if (r->n_prompt < 1 || r->n_prompt >= N_CTX || !r->prompt)
        abort();
    for (uint32_t i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || (uint32_t)r->prompt[i] >= n_vocab)
            abort();
    if (r->n_stops > MODEL_GEN_MAX_STOPS || (r->n_stops && !r->stops))
        abort();
    for (uint32_t i = 0; i < r->n_stops; i++)
        if (!r->stops[i] || strlen(r->stops[i]) > MODEL_GEN_STOP_MAX)
            abort();
    if (r->draft_max > MODEL_DRAFT_MAX || r->draft < -1)
        abort();
    /* the sampling parameters go to the sampler as they are (kvctl serve does this) */
    struct model_sampler *smp = NULL;
    if (model_sampler_new(&smp, &r->sp, n_vocab) < 0) {
        fprintf(stderr, "fuzz-api: the API passed sampling parameters the sampler refuses\n");
        abort();
    }
    float *lg = malloc(n_vocab * sizeof *lg);
    if (!lg)
        abort();
    for (uint32_t i = 0; i < r->n_prompt; i++)
        model_sampler_accept(smp, r->prompt[i]);
    for (uint32_t i = 0; i < n_vocab; i++)
        lg[i] = (float)((i * 7u) % 23u) - 11.0f;
    int32_t tok = model_sampler_sample(smp, lg, NULL);
    if (tok < 0 || (uint32_t)tok >= n_vocab)
        abort();
    model_sampler_free(smp);
    if (behaviour == 1) {
        free(lg);
        snprintf(err, errlen, "busy");
        return -EBUSY;
    }
    struct fgen *g = calloc(1, sizeof *g);
    if (!g)
        abort();
    g->sink = *sink;
    g->ud = sink_ud;
    g->left = r->max_tokens < 6 ? r->max_tokens : 6;
    g->logits = r->logits;
    g->fail = behaviour == 2;
    g->lg = lg;
    uv_timer_init(&loop, &g->t);
    g->t.data = g;
    uv_timer_start(&g->t, fgen_tick, 0, 1);
    live++;
    *handle = g;
    return 0;
}

static void fgen_cancel(void *impl, void *handle)
{
    (void)impl;
    fgen_end(handle);
}

static bool fgen_ready(void *impl, char *why, size_t n)
{
    (void)impl;
    (void)why;
    (void)n;
    return true;
}

static void fgen_metrics(void *impl, char *buf, size_t cap)
{
    (void)impl;
    snprintf(buf, cap, "fuzz_stand_in 1\n");
}

static const struct api_gen_ops fgen_ops = {fgen_start, fgen_cancel, fgen_ready, fgen_metrics};

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *root = getenv("KV_TESTDATA");
    char path[1024], err[256];
    snprintf(path, sizeof path, "%s/models/stories260K.gguf", root ? root : "../shared/testdata");
    struct gguf_file *f = NULL;
    if (gguf_file_open(&f, path, err, sizeof err) || model_vocab_load(&vocab, f, err, sizeof err)) {
        fprintf(stderr, "fuzz-api: %s: %s\n", path, err);
        abort();
    }
    gguf_file_free(f);
    n_vocab = model_vocab_n_tokens(vocab);
    uv_loop_init(&loop);
    struct api_config c = {.listen = "127.0.0.1:0", .max_sessions = 4, .max_body = 8192,
                           .chat_template = "chatml"};
    struct api_generator g = {&fgen_ops, NULL, vocab, NULL, N_CTX, n_vocab, "fuzz"};
    if (api_server_new(&srv, &loop, &c, &g, err, sizeof err) < 0) {
        fprintf(stderr, "fuzz-api: %s\n", err);
        abort();
    }
    port = api_server_port(srv);
    return 0;
}

static bool generating(void *ud)
{
    (void)ud;
    return live > 0 || api_server_sessions(srv) > 0;
}

static void drive(const char *req, size_t size, bool half_close, bool metrics)
{
    char *resp = malloc(RESP_MAX);
    if (!resp)
        abort();
    size_t got = fuzz_client_drive(&loop, port, req, size, size, half_close, resp, RESP_MAX, "fuzz-api");
    fuzz_client_answer(resp, got, !metrics, "fuzz-api");   /* JSON, every route but /metrics */
    free(resp);
    fuzz_client_settle(&loop, generating, NULL, "fuzz-api", "a generation outlived its client");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 8000)
        return 0;
    uint8_t mode = data[0];
    data++;
    size--;
    static const char *const routes[] = {"POST /v1/completions", "POST /v1/chat/completions",
                                         "POST /v1/completions", "POST /v1/chat/completions",
                                         "GET /v1/models", "GET /health", "GET /metrics",
                                         "POST /v1/models"};
    const char *route = routes[mode & 7];
    behaviour = (mode >> 3 & 3) == 3 ? 0 : mode >> 3 & 3;
    bool half_close = mode >> 5 & 1;
    const char *auth = mode >> 6 & 1 ? "Authorization: Bearer not-a-key\r\n" : "";
    size_t cap = size + 512;
    char *req = malloc(cap);
    if (!req)
        abort();
    int h = snprintf(req, cap,
                     "%s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%s"
                     "Connection: close\r\nContent-Length: %zu\r\n\r\n",
                     route, auth, size);
    memcpy(req + h, data, size);
    drive(req, (size_t)h + size, half_close, (mode & 7) == 6);
    free(req);
    return 0;
}

/* test-model-noalloc: the forward pass does not allocate (scratch is allocated once per
 * executor). malloc/calloc/realloc/aligned allocations are interposed here (forwarding to
 * the next definition, glibc's) and counted, on every thread, while a session that already
 * exists runs a prefill batch and decode steps (embed, window, head) with a thread pool: the
 * count must stay 0, also over a long context (n_ctx >= 1024, hundreds of decode steps). A warm-up run of the same shapes comes first (lazy one-time set-up of
 * libraries such as OpenBLAS is not the forward pass). ASan replaces malloc itself, so under
 * SAN=1 the interposition is left out and the case says so; the normal build checks it. */
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "tests/lib/t.h"
#include "util/err.h"

#if defined(__SANITIZE_ADDRESS__)
#define KV_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KV_ASAN 1
#endif
#endif

#ifndef KV_ASAN
static atomic_int counting;
static atomic_long n_allocs;

static void *(*next_malloc)(size_t);
static void *(*next_calloc)(size_t, size_t);
static void *(*next_realloc)(void *, size_t);
static int (*next_posix_memalign)(void **, size_t, size_t);
static void *(*next_aligned_alloc)(size_t, size_t);

/* dlsym may itself call calloc before next_calloc is known: serve that from a static pool. */
static _Alignas(16) char boot[4096];
static size_t boot_used;

static void resolve(void)
{
    static atomic_int busy;
    if (next_malloc || atomic_exchange(&busy, 1))
        return;
    next_calloc = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "calloc");
    next_realloc = (void *(*)(void *, size_t))dlsym(RTLD_NEXT, "realloc");
    next_posix_memalign = (int (*)(void **, size_t, size_t))dlsym(RTLD_NEXT, "posix_memalign");
    next_aligned_alloc = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "aligned_alloc");
    next_malloc = (void *(*)(size_t))dlsym(RTLD_NEXT, "malloc");
}

static void count(void)
{
    if (atomic_load(&counting))
        atomic_fetch_add(&n_allocs, 1);
}

void *malloc(size_t n)
{
    resolve();
    count();
    return next_malloc(n);
}

void *calloc(size_t k, size_t n)
{
    if (!next_calloc) {   /* during resolve(): from the static pool */
        size_t b = (k * n + 15) & ~(size_t)15;
        if (boot_used + b > sizeof boot)
            return NULL;
        void *p = boot + boot_used;
        boot_used += b;
        memset(p, 0, b);
        return p;
    }
    count();
    return next_calloc(k, n);
}

void *realloc(void *p, size_t n)
{
    resolve();
    count();
    return next_realloc(p, n);
}

void free(void *p)
{
    static void (*next_free)(void *);
    if ((char *)p >= boot && (char *)p < boot + sizeof boot)
        return;
    if (!next_free)
        next_free = (void (*)(void *))dlsym(RTLD_NEXT, "free");
    next_free(p);
}

int posix_memalign(void **out, size_t align, size_t n)
{
    resolve();
    count();
    return next_posix_memalign(out, align, n);
}

void *aligned_alloc(size_t align, size_t n)
{
    resolve();
    count();
    return next_aligned_alloc(align, n);
}

/* prefill np tokens as one batch, then nd decode steps, on session id */
static int forward(struct model_exec *e, uint64_t id, const struct model_hparams *hp, float *x,
                   float *logits, uint32_t np, uint32_t nd)
{
    int32_t tok[16];
    for (uint32_t i = 0; i < 16; i++)
        tok[i] = (int32_t)(1 + (i * 37) % (hp->n_vocab - 1));
    int rc = model_embed(e, tok, np, x);
    if (!rc)
        rc = model_window_run(e, id, 0, np, x);
    if (!rc)
        rc = model_head(e, x, np, logits);
    for (uint32_t i = 0; !rc && i < nd; i++) {
        int32_t t = tok[(np + i) % 16];
        rc = model_embed(e, &t, 1, x);
        if (!rc)
            rc = model_window_run(e, id, np + i, 1, x);
        if (!rc)
            rc = model_head(e, x, 1, logits);
    }
    return rc;
}

/* Counts the allocations of a forward pass (prefill np as one batch, then nd decode steps) on
 * rel's model with an executor for n_ctx positions; a warm-up of the same shapes runs first
 * on another session. */
static void check_model_ctx(const char *rel, uint32_t n_ctx, uint32_t np, uint32_t nd)
{
    char path[4096], err[KV_ERR_MAX] = "";
    if (!t_data_path(path, sizeof path, rel))
        return;
    struct model *m = NULL;
    struct model_exec *e = NULL;
    int rc = model_open(&m, path, -1, -1, err, sizeof err);
    T_ASSERT(rc == 0, "%s: %s", rel, err);
    rc = model_exec_new(&e, m, 2, n_ctx, 16);
    T_ASSERT(rc == 0, "%s: executor: %d", rel, rc);
    const struct model_hparams *hp = model_get_hparams(m);
    float *x = malloc(sizeof(float) * 16 * hp->n_embd);
    float *logits = malloc(sizeof(float) * 16 * hp->n_vocab);
    T_ASSERT(x && logits, "buffers");
    T_CHECK(model_session_new(e, 1) == 0 && model_session_new(e, 2) == 0, "sessions");
    T_CHECK(forward(e, 1, hp, x, logits, np, 4) == 0, "%s: warm-up", rel);
    atomic_store(&n_allocs, 0);
    atomic_store(&counting, 1);
    rc = forward(e, 2, hp, x, logits, np, nd);
    /* and one batch across sessions: a decode row of each */
    struct model_batch_row rows[2] = {{1, np + 4}, {2, np + nd}};
    if (!rc && np + nd < n_ctx)
        rc = model_window_run_batch(e, rows, 2, x);
    atomic_store(&counting, 0);
    T_CHECK(rc == 0, "%s: forward: %d", rel, rc);
    T_CHECK(model_session_pos(e, 2) == np + nd + (np + nd < n_ctx), "%s: at position %u", rel,
            model_session_pos(e, 2));
    T_CHECK(atomic_load(&n_allocs) == 0, "%s: the forward pass (n_ctx %u: prefill %u + %u decode "
            "steps and a 2-session batch, 2 threads) allocated %ld times", rel, n_ctx, np, nd,
            (long)atomic_load(&n_allocs));
    free(x);
    free(logits);
    model_exec_free(e);
    model_free(m);
}

static void check_model(const char *rel)
{
    check_model_ctx(rel, 64, 8, 8);
}
#endif

T_CASE(forward_does_not_allocate)
{
#ifdef KV_ASAN
    fprintf(stderr, "note: ASan build: allocation counting is left out (the normal build checks it)\n");
#else
    /* the counter itself counts: a malloc between the flags must show */
    atomic_store(&n_allocs, 0);
    atomic_store(&counting, 1);
    void *volatile p = malloc(32);
    atomic_store(&counting, 0);
    free(p);
    T_ASSERT(atomic_load(&n_allocs) == 1, "the malloc counter does not count (%ld)", (long)atomic_load(&n_allocs));
    check_model("models/stories260K.gguf");
    check_model("models/synth-llama-spm512-q4_0.gguf");
    check_model("models/TinyStories-656K-Q8_0.gguf");
    check_model("models/synth-llama-spm512-q4_k.gguf");
    check_model("models/synth-llama-spm512-f16.gguf");
    check_model("models/synth-qwen2-bpe1024-q8_0.gguf");
    check_model("models/synth-qwen3-bpe1024-q8_0.gguf");
    check_model("models/synth-qwen3moe-bpe1024-q4_k_m.gguf");
    check_model("models/synth-qwen35-bpe1024-f16.gguf");
#endif
}

/* A long context: the scratch is reserved for n_ctx at load, so attention over hundreds of
 * positions (and a batch of 16, the widest activations) never grows it: dense models, a
 * routed-expert one and a hybrid (attention + Gated DeltaNet) one. F32 weights in batches of
 * 16 or more go to OpenBLAS's sgemm, whose threaded path mallocs its job list per call (a
 * library's allocation, outside the executor): the F32 model prefills 8 rows. */
T_CASE(long_decode_does_not_allocate)
{
#ifdef KV_ASAN
    fprintf(stderr, "note: ASan build: allocation counting is left out (the normal build checks it)\n");
#else
    check_model_ctx("models/stories260K.gguf", 1024, 8, 400);
    check_model_ctx("models/synth-llama-spm512-q4_k.gguf", 2048, 16, 300);
    check_model_ctx("models/synth-qwen3moe-bpe1024-q4_k_m.gguf", 1024, 16, 300);
    check_model_ctx("models/synth-qwen35-bpe1024-f16.gguf", 1024, 16, 400);
#endif
}

int main(int argc, char **argv)
{
    t_init(argc, argv);
    T_RUN(forward_does_not_allocate);
    T_RUN(long_decode_does_not_allocate);
    return T_DONE();
}

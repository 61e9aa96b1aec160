/* backend_model.c — the stage's compute backend on model/model.h: the window's weights (only
 * they are mapped), an executor with per-session KV, and the sampler on the last rank. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "kernels/kern.h"
#include "kvd/stage/internal.h"
#include "model/model.h"
#include "util/err.h"

struct mb {
    struct model *m;
    struct model_exec *e;
    uint32_t n_vocab;
};

static int mb_session_new(void *impl, uint64_t id) { return model_session_new(((struct mb *)impl)->e, id); }
static int mb_session_free(void *impl, uint64_t id) { return model_session_free(((struct mb *)impl)->e, id); }
static int mb_embed(void *impl, const int32_t *tok, uint32_t n, float *out)
{
    return model_embed(((struct mb *)impl)->e, tok, n, out);
}
static int mb_run(void *impl, uint64_t id, uint32_t pos, uint32_t n, float *x)
{
    return model_window_run(((struct mb *)impl)->e, id, pos, n, x);
}
static int mb_run_batch(void *impl, const struct model_batch_row *rows, uint32_t n, float *x)
{
    return model_window_run_batch(((struct mb *)impl)->e, rows, n, x);
}
static int mb_head(void *impl, const float *x, uint32_t n, float *logits)
{
    return model_head(((struct mb *)impl)->e, x, n, logits);
}

static void *mb_sampler_new(void *impl, const struct net_open_params *p)
{
    struct mb *b = impl;
    struct model_sampler_params sp;
    model_sampler_params_default(&sp);
    sp.seed = p->seed;
    sp.temperature = p->temperature;
    sp.top_k = p->top_k;
    sp.top_p = p->top_p;
    sp.min_p = p->min_p;
    sp.repeat_penalty = p->repeat_penalty;
    sp.freq_penalty = p->freq_penalty;
    sp.presence_penalty = p->presence_penalty;
    sp.penalty_last_n = p->penalty_last_n;
    struct model_sampler *s = NULL;
    if (model_sampler_new(&s, &sp, b->n_vocab) < 0)
        return NULL;
    return s;
}
static void mb_sampler_free(void *impl, void *s) { (void)impl; model_sampler_free(s); }
static void mb_sampler_accept(void *impl, void *s, int32_t tok) { (void)impl; model_sampler_accept(s, tok); }
static int32_t mb_sampler_sample(void *impl, void *s, float *logits, float *logprob)
{
    (void)impl;
    return model_sampler_sample(s, logits, logprob);
}

static void mb_free(void *impl)
{
    struct mb *b = impl;
    if (!b)
        return;
    model_exec_free(b->e);
    model_free(b->m);
    free(b);
}

const struct gguf_file *kvd_backend_gguf(const struct kvd_backend *b)
{
    extern const struct kvd_backend_ops kvd__mb_ops;
    if (b->ops != &kvd__mb_ops)
        return NULL;
    return model_get_gguf(((const struct mb *)b->impl)->m);
}

const struct kvd_backend_ops kvd__mb_ops = {
    .session_new = mb_session_new, .session_free = mb_session_free, .embed = mb_embed,
    .run = mb_run, .run_batch = mb_run_batch, .head = mb_head, .sampler_new = mb_sampler_new,
    .sampler_free = mb_sampler_free, .sampler_accept = mb_sampler_accept,
    .sampler_sample = mb_sampler_sample, .free = mb_free,
};

/* Rows a window run of several sessions may take with each row's result its solo one: 0 when a
 * weight of the window's layers has a type whose matmul rounds differently for several rows. */
static uint32_t batch_rows_exact(const struct gguf_file *g, uint32_t first, uint32_t last)
{
    uint64_t n = gguf_tensor_count(g);
    for (uint64_t i = 0; i < n; i++) {
        const struct gguf_tensor *t = gguf_tensor_at(g, i);
        int l = gguf_tensor_layer(t->name);
        if (l >= 0 && (uint32_t)l >= first && (uint32_t)l < last && t->n_dims >= 2 &&
            !kern_type_rows_exact(t->type))
            return 0;
    }
    return KERN_ROWS_EXACT_MAX;
}

int kvd_backend_open_model(struct kvd_backend *b, const char *path, int first, int last,
                           int n_threads, uint32_t n_ctx, uint32_t max_batch, char *err,
                           size_t errlen)
{
    struct mb *mb = calloc(1, sizeof *mb);
    if (!mb)
        return -ENOMEM;
    int rc = model_open(&mb->m, path, first, last, err, errlen);
    if (rc < 0) {
        free(mb);
        return rc;
    }
    const struct model_hparams *hp = model_get_hparams(mb->m);
    if (max_batch > n_ctx)
        max_batch = n_ctx;
    rc = model_exec_new(&mb->e, mb->m, n_threads, n_ctx, max_batch);
    if (rc < 0) {
        snprintf(err, errlen, "executor (n_ctx %u, max_batch %u): %s", n_ctx, max_batch, strerror(-rc));
        model_free(mb->m);
        free(mb);
        return rc;
    }
    mb->n_vocab = hp->n_vocab;
    memset(b, 0, sizeof *b);
    b->ops = &kvd__mb_ops;
    b->impl = mb;
    b->n_embd = hp->n_embd;
    b->n_vocab = hp->n_vocab;
    b->n_layer = hp->n_layer;
    model_get_window(mb->m, &b->first, &b->last);
    b->n_ctx_train = hp->n_ctx_train;
    b->embed = model_has_embed(mb->m);
    b->head = model_has_head(mb->m);
    snprintf(b->arch, sizeof b->arch, "%s", hp->arch);
    b->weight_bytes = model_weight_bytes(mb->m);
    uint32_t v;
    const struct gguf_file *g = model_get_gguf(mb->m);
    b->batch_rows = batch_rows_exact(g, b->first, b->last);
    b->eos = gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &v) == 0 ? (int32_t)v : -1;
    b->bos = gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &v) == 0 ? (int32_t)v : -1;
    if (b->embed) {   /* rank 0 tokenizes prompts and turns tokens into text */
        char verr[KV_ERR_MAX];
        if (model_vocab_load(&b->vocab, g, verr, sizeof verr) < 0) {
            b->vocab = NULL;
            snprintf(err, errlen, "no tokenizer: %s", verr);   /* informative only */
        }
    }
    return 0;
}

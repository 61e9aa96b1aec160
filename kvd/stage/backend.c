/* backend.c — what every compute backend shares, and the deterministic stand-in backend that
 * network tests use without a model file: per-session state makes each step depend on the
 * session's history, so mixed-up sessions or positions change the tokens. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kern.h"
#include "kvd/stage/internal.h"
#include "model/model.h"

void kvd_backend_close(struct kvd_backend *b)
{
    if (b)
        model_vocab_free(b->vocab);
    if (b && b->ops && b->ops->free)
        b->ops->free(b->impl);
    if (b)
        memset(b, 0, sizeof *b);
}

int kvd_backend_tokenize(struct kvd_backend *b, const char *text, int32_t **toks, uint32_t *n)
{
    if (!b->vocab)
        return -ENOSYS;
    size_t len = strlen(text), cnt = 0, cap = len + 8;
    int32_t *t = malloc(cap * sizeof *t);
    if (!t)
        return -ENOMEM;
    int rc = model_tokenize(b->vocab, text, len, true, true, t, cap, &cnt);
    if (rc == -ENOSPC) {
        int32_t *nt = realloc(t, cnt * sizeof *t);
        if (!nt) {
            free(t);
            return -ENOMEM;
        }
        t = nt;
        rc = model_tokenize(b->vocab, text, len, true, true, t, cnt, &cnt);
    }
    if (rc < 0 || cnt > UINT32_MAX) {
        free(t);
        return rc < 0 ? rc : -E2BIG;
    }
    *toks = t;
    *n = (uint32_t)cnt;
    return 0;
}

/* ---- stub ---- */

#define STUB_VOCAB 256
#define STUB_MAX_SESS 4096

struct stub_sess {
    uint64_t id;
    uint32_t next_pos;
    double acc;     /* running state: stands in for the KV cache */
};

struct stub {
    uint32_t n_embd, first, last, n_ctx;
    struct stub_sess *s;
    size_t n, cap;
};

struct stub_sampler {
    struct net_open_params p;
    uint64_t rng;
};

static struct stub_sess *stub_find(struct stub *st, uint64_t id)
{
    for (size_t i = 0; i < st->n; i++)
        if (st->s[i].id == id)
            return &st->s[i];
    return NULL;
}

static int stub_session_new(void *impl, uint64_t id)
{
    struct stub *st = impl;
    if (stub_find(st, id))
        return -EEXIST;
    if (st->n == st->cap &&
        (st->cap >= STUB_MAX_SESS || util_grow((void **)&st->s, &st->cap, sizeof *st->s, 16)))
        return -ENOMEM;
    st->s[st->n++] = (struct stub_sess){.id = id};
    return 0;
}

static int stub_session_free(void *impl, uint64_t id)
{
    struct stub *st = impl;
    struct stub_sess *s = stub_find(st, id);
    if (!s)
        return -ENOENT;
    *s = st->s[--st->n];
    return 0;
}

static int stub_embed(void *impl, const int32_t *tok, uint32_t n, float *out)
{
    struct stub *st = impl;
    for (uint32_t r = 0; r < n; r++)
        for (uint32_t i = 0; i < st->n_embd; i++)
            out[(size_t)r * st->n_embd + i] = sinf((float)(tok[r] + 1) * 0.37f * (float)(i + 1));
    return 0;
}

static int stub_run(void *impl, uint64_t id, uint32_t pos, uint32_t n, float *x)
{
    struct stub *st = impl;
    struct stub_sess *s = stub_find(st, id);
    if (!s)
        return -ENOENT;
    if ((uint64_t)pos + n > st->n_ctx)
        return -ERANGE;
    if (pos != s->next_pos)
        return -EINVAL;  /* positions must follow each other, as a KV cache needs */
    for (uint32_t r = 0; r < n; r++) {
        float *row = x + (size_t)r * st->n_embd;
        for (uint32_t l = st->first; l < st->last; l++) {
            double sum = 0;
            for (uint32_t i = 0; i < st->n_embd; i++)
                sum += row[i];
            s->acc = fmod(s->acc * 0.5 + sum, 1000.0);
            for (uint32_t i = 0; i < st->n_embd; i++)
                row[i] = tanhf(row[i] * 0.9f +
                               0.5f * sinf((float)s->acc + (float)(pos + r) * 0.1f + (float)l + (float)i * 0.01f));
        }
    }
    s->next_pos = pos + n;
    return 0;
}

/* The stub's batch: every session's row group checked first (nothing runs on a refusal, as
 * model_window_run_batch promises), then each group runs as stub_run would alone. */
static int stub_run_batch(void *impl, const struct model_batch_row *rows, uint32_t n, float *x)
{
    struct stub *st = impl;
    for (int pass = 0; pass < 2; pass++)
        for (uint32_t i = 0; i < n;) {
            uint32_t g = 1;
            while (i + g < n && rows[i + g].id == rows[i].id) {
                if (rows[i + g].pos != rows[i].pos + g)
                    return -EINVAL;
                g++;
            }
            if (pass == 1) {
                int rc = stub_run(impl, rows[i].id, rows[i].pos, g, x + (size_t)i * st->n_embd);
                if (rc < 0)
                    return rc;
            } else {
                struct stub_sess *s = stub_find(st, rows[i].id);
                if (!s)
                    return -ENOENT;
                if ((uint64_t)rows[i].pos + g > st->n_ctx)
                    return -ERANGE;
                if (rows[i].pos != s->next_pos)
                    return -EINVAL;
                for (uint32_t k = 0; k < i; k++)
                    if (rows[k].id == rows[i].id)
                        return -EINVAL;   /* a session's rows not consecutive */
            }
            i += g;
        }
    return 0;
}

static int stub_head(void *impl, const float *x, uint32_t n, float *logits)
{
    struct stub *st = impl;
    for (uint32_t r = 0; r < n; r++)
        for (uint32_t v = 0; v < STUB_VOCAB; v++) {
            float acc = 0;
            for (uint32_t i = 0; i < st->n_embd; i++)
                acc += x[(size_t)r * st->n_embd + i] * cosf((float)(v * (i + 3)) * 0.11f);
            logits[(size_t)r * STUB_VOCAB + v] = acc;
        }
    return 0;
}

static void *stub_sampler_new(void *impl, const struct net_open_params *p)
{
    struct stub_sampler *s = calloc(1, sizeof *s);
    if (s) {
        s->p = *p;
        s->rng = p->seed * 0x9e3779b97f4a7c15ull + 1;
    }
    return s;
}

static void stub_sampler_free(void *impl, void *s) { free(s); }
static void stub_sampler_accept(void *impl, void *s, int32_t tok) { (void)s; (void)tok; }

static int32_t stub_sampler_sample(void *impl, void *sp, float *logits, float *logprob)
{
    struct stub_sampler *s = sp;
    int32_t best = 0;
    for (int32_t v = 1; v < STUB_VOCAB; v++)
        if (logits[v] > logits[best])
            best = v;
    if (s->p.temperature > 0) {  /* a seeded pick among the 4 best, enough to test seeding */
        s->rng ^= s->rng << 13;
        s->rng ^= s->rng >> 7;
        s->rng ^= s->rng << 17;
        best = (int32_t)((best + (int32_t)(s->rng % 4)) % STUB_VOCAB);
    }
    if (logprob)
        *logprob = 0;
    return best;
}

static void stub_free(void *impl)
{
    struct stub *st = impl;
    if (st) {
        free(st->s);
        free(st);
    }
}

static const struct kvd_backend_ops stub_ops = {
    .session_new = stub_session_new, .session_free = stub_session_free, .embed = stub_embed,
    .run = stub_run, .run_batch = stub_run_batch, .head = stub_head, .sampler_new = stub_sampler_new,
    .sampler_free = stub_sampler_free, .sampler_accept = stub_sampler_accept,
    .sampler_sample = stub_sampler_sample, .free = stub_free,
};

int kvd_backend_open_stub(struct kvd_backend *b, uint32_t n_embd, uint32_t n_layer,
                          uint32_t first, uint32_t last, uint32_t n_ctx)
{
    struct stub *st = calloc(1, sizeof *st);
    if (!st)
        return -ENOMEM;
    st->n_embd = n_embd;
    st->first = first;
    st->last = last;
    st->n_ctx = n_ctx;
    memset(b, 0, sizeof *b);
    b->ops = &stub_ops;
    b->impl = st;
    b->n_embd = n_embd;
    b->n_vocab = STUB_VOCAB;
    b->n_layer = n_layer;
    b->first = first;
    b->last = last;
    b->n_ctx_train = n_ctx;
    b->embed = first == 0;
    b->head = last == n_layer;
    snprintf(b->arch, sizeof b->arch, "stub");
    b->batch_rows = KERN_ROWS_EXACT_MAX;   /* rows are independent of each other */
    b->eos = -1;
    b->bos = -1;
    return 0;
}

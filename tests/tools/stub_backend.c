/* stub_backend.c — the deterministic stand-in compute backend of the network tests, linked
 * only into the test build of kvd (build/tests/kvd-stub), where `kvd stage --stub` selects it:
 * cheap maths with per-session state, so each step depends on the session's history and
 * mixed-up sessions or positions change the tokens; n_vocab 256, no model file. It registers
 * itself in kvd/stage's backend table before main runs, with two wrappers of the model that
 * return wrong boundaries (the market probe tests'; below). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kern.h"
#include "kvd/stage/internal.h"
#include "model/model.h"

#define STUB_VOCAB 256
#define STUB_MAX_SESS 4096

struct stub_sess {
    uint64_t id;
    uint32_t next_pos;
    double acc;     /* running state: stands in for the KV cache */
    uint32_t ck_pos;   /* the checkpoint (ops->checkpoint): like a recurrent state, the */
    double ck_acc;     /* running state cannot go back without one */
    bool ck;
};

struct stub {
    uint32_t n_embd, first, last, n_ctx;
    struct stub_sess *s;
    size_t n, cap;
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

/* One session's rows x[n][n_embd] at positions pos.. through the window's "layers". */
static void stub_layers(struct stub *st, struct stub_sess *s, uint32_t pos, uint32_t n, float *x)
{
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
}

/* Every session's row group checked first (nothing runs on a refusal, as the backend contract
 * asks), then the tokens embedded, each group run as it would alone, and the heads. */
static int stub_run(void *impl, const struct kvd_backend_batch *bt, char *err, size_t errlen)
{
    struct stub *st = impl;
    const struct model_batch_row *rows = bt->rows;
    for (uint32_t i = 0; bt->tokens && i < bt->n; i++)
        if (bt->tokens[i] < 0 || bt->tokens[i] >= STUB_VOCAB) {
            snprintf(err, errlen, "embedding: token %d not below n_vocab %d", bt->tokens[i], STUB_VOCAB);
            return -EINVAL;
        }
    for (uint32_t i = 0; i < bt->n;) {
        uint32_t g = 1;
        while (i + g < bt->n && rows[i + g].id == rows[i].id) {
            if (rows[i + g].pos != rows[i].pos + g)
                goto bad_rows;
            g++;
        }
        struct stub_sess *s = stub_find(st, rows[i].id);
        if (!s) {
            snprintf(err, errlen, "layers %u..%u: no session %016llx", st->first, st->last,
                     (unsigned long long)rows[i].id);
            return -ENOENT;
        }
        if ((uint64_t)rows[i].pos + g > st->n_ctx) {
            snprintf(err, errlen, "layers %u..%u: past the context", st->first, st->last);
            return -ERANGE;
        }
        if (rows[i].pos != s->next_pos)
            goto bad_rows;   /* positions must follow each other, as a KV cache needs */
        for (uint32_t k = 0; k < i; k++)
            if (rows[k].id == rows[i].id)
                goto bad_rows;   /* a session's rows not consecutive */
        i += g;
    }
    for (uint32_t r = 0; bt->tokens && r < bt->n; r++)
        for (uint32_t i = 0; i < st->n_embd; i++)
            bt->x[(size_t)r * st->n_embd + i] = sinf((float)(bt->tokens[r] + 1) * 0.37f * (float)(i + 1));
    for (uint32_t i = 0; i < bt->n;) {
        uint32_t g = 1;
        while (i + g < bt->n && rows[i + g].id == rows[i].id)
            g++;
        stub_layers(st, stub_find(st, rows[i].id), rows[i].pos, g, bt->x + (size_t)i * st->n_embd);
        i += g;
    }
    for (uint32_t k = 0; k < bt->n_head; k++) {
        const float *x = bt->x + (size_t)bt->head[k] * st->n_embd;
        for (uint32_t v = 0; v < STUB_VOCAB; v++) {
            float acc = 0;
            for (uint32_t i = 0; i < st->n_embd; i++)
                acc += x[i] * cosf((float)(v * (i + 3)) * 0.11f);
            bt->logits[(size_t)k * STUB_VOCAB + v] = acc;
        }
    }
    return 0;
bad_rows:
    snprintf(err, errlen, "layers %u..%u: rows out of order", st->first, st->last);
    return -EINVAL;
}

static void stub_free(void *impl)
{
    struct stub *st = impl;
    if (st) {
        free(st->s);
        free(st);
    }
}

static int stub_checkpoint(void *impl, uint64_t id)
{
    struct stub_sess *s = stub_find(impl, id);
    if (!s)
        return -ENOENT;
    s->ck_pos = s->next_pos;
    s->ck_acc = s->acc;
    s->ck = true;
    return 0;
}

static int stub_restore(void *impl, uint64_t id)
{
    struct stub_sess *s = stub_find(impl, id);
    if (!s)
        return -ENOENT;
    if (!s->ck)
        return -EINVAL;
    s->next_pos = s->ck_pos;
    s->acc = s->ck_acc;
    return 0;
}

static const struct kvd_backend_ops stub_ops = {
    .session_new = stub_session_new, .session_free = stub_session_free, .run = stub_run,
    .free = stub_free, .checkpoint = stub_checkpoint, .restore = stub_restore,
};

static int stub_open(struct kvd_backend *b, const struct kvd_backend_args *a, char *err,
                     size_t errlen)
{
    struct stub *st = calloc(1, sizeof *st);
    if (!st) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    st->n_embd = a->n_embd;
    st->first = a->win_first;
    st->last = a->win_last;
    st->n_ctx = a->n_ctx;
    memset(b, 0, sizeof *b);
    b->ops = &stub_ops;
    b->impl = st;
    b->n_embd = a->n_embd;
    b->n_vocab = STUB_VOCAB;
    b->n_layer = a->n_layer;
    b->first = a->win_first;
    b->last = a->win_last;
    b->n_ctx_train = a->n_ctx;
    b->embed = a->win_first == 0;
    b->head = a->win_last == a->n_layer;
    snprintf(b->arch, sizeof b->arch, "stub");
    b->batch_rows = KERN_ROWS_EXACT_MAX;   /* rows are independent of each other */
    b->chunk_exact = true;   /* a session's rows run one by one, in order, however split */
    b->eos = -1;
    b->bos = -1;
    return 0;
}

static const struct kvd_backend_kind stub_kind = {
    .name = "stub", .option = "--stub",
    .help = "tests only: stand-in compute instead of a model", .open = stub_open,
};

__attribute__((constructor)) static void stub_register(void)
{
    if (kvd_backend_register(&stub_kind) < 0)
        abort();   /* a build that cannot offer --stub must not pretend to */
}

/* Wrong boundaries, for the market's probe tests (docs/market.md, "Probes"): the model
 * backend wrapped so that each run's output boundary (and, on the last rank, its logits) comes
 * out perturbed — x scaled by 1.5 plus 0.25, the logits rotated by one token — from the start
 * (`wrong`) or only in backend instances after the first this process opens (`wrong-late`:
 * kvd join's activation probe opens the first and passes; the stage it forks next and every
 * spot check after run wrong, as a node that turns bad once active), or, in `wrong-traffic`, only
 * in one ring session in KVD_WRONG_TRAFFIC_EVERY (default 2): a node honest on every probe
 * (known by the probes' session ids) and wrong on real traffic, which only the market's audits
 * of credited work can catch (docs/market.md, "Audits"). */
#define WRONG_TRAFFIC_MAX 256
struct wrong {
    struct kvd_backend in;
    bool wrong, traffic;
    uint32_t every, sessions;           /* traffic: one ring session in every; seen so far */
    uint64_t bad[WRONG_TRAFFIC_MAX];    /* traffic: the sessions run wrong (0: free slot) */
};

/* Whether row i of a batch is perturbed. */
static bool wrong_row(const struct wrong *w, const struct kvd_backend_batch *bt, uint32_t i)
{
    if (!w->traffic)
        return w->wrong;
    for (int k = 0; k < WRONG_TRAFFIC_MAX; k++)
        if (w->bad[k] && w->bad[k] == bt->rows[i].id)
            return true;
    return false;
}

static int wrong_session_new(void *impl, uint64_t id)
{
    struct wrong *w = impl;
    int rc = w->in.ops->session_new(w->in.impl, id);
    /* a probe numbers its sessions from KVD_PROBE_ID0 (kvd/stage/internal.h), "probe" */
    if (rc == 0 && w->traffic && id >> 24 != 0x70726f6265ull && ++w->sessions % w->every == 0)
        for (int k = 0; k < WRONG_TRAFFIC_MAX; k++)
            if (!w->bad[k]) {
                w->bad[k] = id;
                fprintf(stderr, "wrong-traffic: session %016llx runs wrong (ring session %u)\n",
                        (unsigned long long)id, w->sessions);
                break;
            }
    return rc;
}

static int wrong_session_free(void *impl, uint64_t id)
{
    struct wrong *w = impl;
    for (int k = 0; k < WRONG_TRAFFIC_MAX; k++)
        if (w->bad[k] == id)
            w->bad[k] = 0;
    return w->in.ops->session_free(w->in.impl, id);
}

static int wrong_run(void *impl, const struct kvd_backend_batch *bt, char *err, size_t errlen)
{
    struct wrong *w = impl;
    int rc = w->in.ops->run(w->in.impl, bt, err, errlen);
    if (rc < 0 || !w->wrong)
        return rc;
    for (uint32_t r = 0; r < bt->n; r++)
        for (size_t i = 0; wrong_row(w, bt, r) && i < w->in.n_embd; i++)
            bt->x[(size_t)r * w->in.n_embd + i] = bt->x[(size_t)r * w->in.n_embd + i] * 1.5f + 0.25f;
    for (uint32_t k = 0; k < bt->n_head; k++) {
        if (!wrong_row(w, bt, bt->head[k]))
            continue;
        float *lg = bt->logits + (size_t)k * w->in.n_vocab, first = lg[0];
        memmove(lg, lg + 1, (w->in.n_vocab - 1) * sizeof *lg);
        lg[w->in.n_vocab - 1] = first;
    }
    return 0;
}

static void wrong_free(void *impl)
{
    struct wrong *w = impl;
    if (w) {
        kvd_backend_close(&w->in);
        free(w);
    }
}

static int wrong_checkpoint(void *impl, uint64_t id)
{
    struct wrong *w = impl;
    return w->in.ops->checkpoint(w->in.impl, id);
}

static int wrong_restore(void *impl, uint64_t id)
{
    struct wrong *w = impl;
    return w->in.ops->restore(w->in.impl, id);
}

static const struct kvd_backend_ops wrong_ops = {
    .session_new = wrong_session_new, .session_free = wrong_session_free, .run = wrong_run,
    .free = wrong_free, .checkpoint = wrong_checkpoint, .restore = wrong_restore,
};

static int wrong_open_as(struct kvd_backend *b, const struct kvd_backend_args *a, int mode,
                         char *err, size_t errlen)
{
    bool late = mode == 1;
    static int opened;   /* backend instances this process opened so far */
    struct wrong *w = calloc(1, sizeof *w);
    if (!w) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    int rc = kvd_backend_open_model(&w->in, a, err, errlen);
    if (rc < 0) {
        free(w);
        return rc;
    }
    w->wrong = !late || opened > 0;
    opened++;
    if (mode == 2) {
        const char *e = getenv("KVD_WRONG_TRAFFIC_EVERY");
        w->traffic = true;
        w->every = e && atoi(e) > 0 ? (uint32_t)atoi(e) : 2;
    }
    *b = w->in;
    w->in.vocab = NULL;   /* the outer backend owns the tokenizer (kvd_backend_close frees it) */
    b->ops = &wrong_ops;
    b->impl = w;
    return 0;
}

static int wrong_open(struct kvd_backend *b, const struct kvd_backend_args *a, char *err,
                      size_t errlen)
{
    return wrong_open_as(b, a, 0, err, errlen);
}

static int wrong_late_open(struct kvd_backend *b, const struct kvd_backend_args *a, char *err,
                           size_t errlen)
{
    return wrong_open_as(b, a, 1, err, errlen);
}

static int wrong_traffic_open(struct kvd_backend *b, const struct kvd_backend_args *a, char *err,
                              size_t errlen)
{
    return wrong_open_as(b, a, 2, err, errlen);
}

static const struct kvd_backend_kind wrong_kind = {
    .name = "wrong", .option = "--wrong-boundaries",
    .help = "tests only: the model with every output boundary perturbed", .open = wrong_open,
};

static const struct kvd_backend_kind wrong_late_kind = {
    .name = "wrong-late", .option = "--wrong-boundaries-late",
    .help = "tests only: the model, perturbed in every instance after the process's first",
    .open = wrong_late_open,
};

static const struct kvd_backend_kind wrong_traffic_kind = {
    .name = "wrong-traffic", .option = "--wrong-traffic",
    .help = "tests only: the model, honest on probes, perturbed in one ring session in "
            "KVD_WRONG_TRAFFIC_EVERY (default 2)",
    .open = wrong_traffic_open,
};

__attribute__((constructor)) static void wrong_register(void)
{
    if (kvd_backend_register(&wrong_kind) < 0 || kvd_backend_register(&wrong_late_kind) < 0 ||
        kvd_backend_register(&wrong_traffic_kind) < 0)
        abort();
}

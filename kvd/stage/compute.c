/* compute.c — the stage's compute thread. The loop submits jobs (open a session, run a step,
 * close a session) to a queue; one thread runs them on the backend, each session's in order,
 * steps of several sessions as one batched run picked by the scheduler (decode steps first,
 * prompts sharing the rest in chunks: docs/ring.md, "The batching scheduler"), and hands them
 * back through a net_handoff, so the event loop never computes. On the last rank the sessions'
 * samplers (model/model.h) live here too. */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/kern.h"
#include "kvd/stage/internal.h"
#include "model/model.h"
#include "ring/ring.h"

/* A session on the compute thread: where its rows end, and what drafting needs. */
struct csess {
    uint64_t id;
    uint32_t end;               /* the position after the last row run */
    uint32_t n_ctx;
    /* A window that cannot rewind (kvd_backend.can_rewind false): the state before the last
     * verifying pass, at ck_pos, and that pass's input rows (tokens on rank 0, the boundary
     * in the wire dtype elsewhere), so that the next run may start inside it: restored, the
     * rows kept run again. ck_n 0: none. */
    uint32_t ck_pos, ck_n;
    int32_t *ck_tok;
    uint8_t *ck_in;
    /* last rank */
    struct model_sampler *sampler;
    bool logits;
    uint32_t draft_max;         /* 0: no drafting */
    bool mtp;                   /* drafting with the window's MTP block, not prompt lookup */
    int32_t *hist;              /* drafting: the prompt and every token sampled since */
    uint32_t n_hist, hist_cap;
    int32_t prop[RING_DRAFTS_MAX];   /* the drafts the last TOKEN carried */
    uint32_t n_prop;
    struct csess *next;
};

static void cs_free(struct csess *s)
{
    model_sampler_free(s->sampler);
    free(s->hist);
    free(s->ck_tok);
    free(s->ck_in);
    free(s);
}

static struct csess *cs_find(struct kvd_compute *c, uint64_t id, struct csess ***prevp)
{
    struct csess **pp = &c->sessions;
    for (; *pp; pp = &(*pp)->next)
        if ((*pp)->id == id) {
            if (prevp)
                *prevp = pp;
            return *pp;
        }
    return NULL;
}

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24);
}

/* *p holds at least n elements of size bytes (*cap counts them): 0 or -ENOMEM. */
static int reserve(void **p, size_t *cap, size_t n, size_t size)
{
    if (n <= *cap)
        return 0;
    void *q = realloc(*p, n * size);
    if (!q)
        return -ENOMEM;
    *p = q;
    *cap = n;
    return 0;
}

/* Make room in the scratch for a batch of rows (rows, tokens, boundary) and n_head logits
 * rows: 0 or -ENOMEM. */
static int scratch_reserve(struct kvd_compute *c, uint32_t rows, uint32_t n_head)
{
    size_t tok_cap = c->rows_cap;
    if (reserve((void **)&c->tok, &tok_cap, rows, sizeof *c->tok) < 0 ||
        reserve((void **)&c->rows, &c->rows_cap, rows, sizeof *c->rows) < 0 ||
        reserve((void **)&c->x, &c->x_cap, (size_t)rows * c->b->n_embd, sizeof *c->x) < 0 ||
        reserve((void **)&c->logits, &c->logits_cap, (size_t)n_head * c->b->n_vocab,
                sizeof *c->logits) < 0)
        return -ENOMEM;
    return 0;
}

static void step_run_failed(struct kvd_job *j, int rc, const char *berr)
{
    j->rc = rc;
    snprintf(j->err, sizeof j->err, "%s (at pos %u, %u rows)", berr[0] ? berr : strerror(-rc),
             j->pos, j->n);
}

/* model_sampler's parameters from an OPEN's. */
/* The rows of a STEP whose logits the last rank samples from: the last one when it ends a
 * prompt or decodes, every one of a verifying pass (RING_FL_DRAFT), none elsewhere. */
static uint32_t heads_of(const struct kvd_compute *c, const struct kvd_job *j)
{
    if (!c->b->head || !(j->flags & RING_FL_LAST) || j->n == 0)
        return 0;
    return (j->flags & RING_FL_DRAFT) ? j->n : 1;
}

/* Last rank: the tokens of a step from the logits of its head rows lg[n_lg][n_vocab] (one row
 * after a prompt or a decode step; every row of a verifying pass, whose rows after the first
 * are the drafts the last TOKEN proposed), then the next drafts, into the TOKEN payload
 * (net/net.h). The sampler draws at each row in turn exactly as one row at a time would, and a
 * draft is accepted while it equals the token drawn: the first token drawn that is not the
 * draft ends the pass (docs/ring.md, "Drafting"). So greedy and seeded tokens, and the number
 * of draws (one per token), are the ones without drafts. */
static void head_output(struct kvd_compute *c, struct kvd_job *j, const float *x, float *lg,
                        uint32_t n_lg)
{
    struct kvd_backend *b = c->b;
    struct csess *s = cs_find(c, j->session, NULL);
    if (!s) {
        j->rc = -ENOENT;
        snprintf(j->err, sizeof j->err, "no sampler for the session");
        return;
    }
    if (n_lg > 1 && n_lg - 1 > s->n_prop) {
        j->rc = -EPROTO;
        snprintf(j->err, sizeof j->err, "a verifying pass of %u drafts, but %u were proposed",
                 n_lg - 1, s->n_prop);
        return;
    }
    size_t lsz = s->logits ? (size_t)b->n_vocab * 4 : 0;
    /* the logits go last; they are kept at the end until the drafts' count is known */
    size_t head = (size_t)RING_TOKENS_MAX * 8 + (size_t)RING_DRAFTS_MAX * 4;
    uint8_t *out = malloc(head + (size_t)n_lg * lsz);
    if (!out) {
        j->rc = -ENOMEM;
        snprintf(j->err, sizeof j->err, "out of memory for logits");
        return;
    }
    int32_t toks[RING_TOKENS_MAX];
    float lps[RING_TOKENS_MAX];
    uint32_t nt = 0;
    for (uint32_t i = 0; i < n_lg && i < RING_TOKENS_MAX; i++) {
        float *row = lg + (size_t)i * b->n_vocab, lp = 0;
        if (lsz)   /* raw logits, before the sampler touches them */
            memcpy(out + head + (size_t)i * lsz, row, lsz);
        int32_t tok = model_sampler_sample(s->sampler, row, &lp);
        if (tok < 0 || (uint32_t)tok >= b->n_vocab) {
            free(out);
            j->rc = -EDOM;
            snprintf(j->err, sizeof j->err, "no token can be sampled (logits all -inf/NaN)");
            return;
        }
        model_sampler_accept(s->sampler, tok);
        if (s->hist && s->n_hist < s->hist_cap)
            s->hist[s->n_hist++] = tok;
        toks[nt] = tok;
        lps[nt++] = lp;
        if (i + 1 < n_lg && tok != s->prop[i])
            break;   /* the draft at row i + 1 is rejected, and the rows after it */
    }
    /* the next drafts: the next pass runs the last token at n_hist - 1 and each draft after
     * it, all below the context */
    s->n_prop = 0;
    if (s->draft_max && s->hist && s->n_hist < s->n_ctx) {
        uint32_t k = s->n_ctx - s->n_hist < s->draft_max ? s->n_ctx - s->n_hist : s->draft_max;
        if (!s->mtp) {
            s->n_prop = model_draft_lookup(s->hist, s->n_hist, k, s->prop);
        } else {
            /* the MTP block reads the rows whose tokens stand: those before the head rows and
             * the head rows that sampled the tokens kept */
            int rc = b->ops->mtp_draft(b->impl, j->session, j->pos, j->n - n_lg + nt, x,
                                       s->hist, s->n_hist, k, s->prop);
            if (rc < 0) {
                free(out);
                j->rc = rc;
                snprintf(j->err, sizeof j->err, "MTP drafts: %s", strerror(-rc));
                return;
            }
            s->n_prop = (uint32_t)rc;
        }
    }
    size_t ld = (size_t)nt * 8 + (size_t)s->n_prop * 4;
    for (uint32_t i = 0; i < nt; i++) {
        put32(out + 4 * i, (uint32_t)toks[i]);
        memcpy(out + 4 * (nt + i), &lps[i], 4);
    }
    for (uint32_t i = 0; i < s->n_prop; i++)
        put32(out + (size_t)nt * 8 + 4 * i, (uint32_t)s->prop[i]);
    if (lsz)
        memmove(out + ld, out + head, (size_t)nt * lsz);
    j->out = out;
    j->out_len = ld + (size_t)nt * lsz;
    j->out_type = RING_F_TOKEN;
    j->out_flags = lsz ? RING_FL_LOGITS : 0;
    j->token = toks[0];
    j->logprob = lps[0];
    j->out_pos = j->pos + j->n - n_lg + 1;   /* the token sampled from the first head row's */
    j->out_n = nt;
}

/* A STEP's window output x into its result: the tokens sampled from its head rows' logits lg
 * on the last rank (lg NULL: the step neither ends a prompt nor decodes), the ACT payload
 * elsewhere. */
static void step_output(struct kvd_compute *c, struct kvd_job *j, const float *x, float *lg)
{
    struct kvd_backend *b = c->b;
    size_t ne = (size_t)j->n * b->n_embd;
    if (b->head) {
        struct csess *s = lg ? NULL : cs_find(c, j->session, NULL);
        int rc = 0;
        /* a prompt's chunk before its last: the MTP block's entries of its rows */
        if (s && s->mtp && s->hist)
            rc = b->ops->mtp_draft(b->impl, j->session, j->pos, j->n, x, s->hist, s->n_hist, 0, NULL);
        if (rc < 0) {
            j->rc = rc;
            snprintf(j->err, sizeof j->err, "MTP block: %s", strerror(-rc));
        } else if (!lg) {
            j->out_type = 0;
        } else {
            head_output(c, j, x, lg, heads_of(c, j));
        }
        return;
    }
    size_t bytes = ne * c->wire_dsize;
    uint8_t *out = malloc(bytes);
    if (!out) {
        j->rc = -ENOMEM;
        snprintf(j->err, sizeof j->err, "out of memory for the boundary");
        return;
    }
    ring_wire_encode(x, ne, c->wire_dsize, out);
    j->out = out;
    j->out_len = bytes;
    j->out_type = RING_F_ACT;
    j->out_flags = j->flags & (RING_FL_LAST | RING_FL_DRAFT);
    j->out_pos = j->pos;
    j->out_n = j->n;
}


/* Run n rows of session id from position pos on their own, their output dropped: tokens on
 * rank 0, boundary rows in the wire dtype in elsewhere. 0 or the backend's error. */
static int rows_rerun(struct kvd_compute *c, uint64_t id, uint32_t pos, uint32_t n,
                      const int32_t *tokens, const uint8_t *in, char *err, size_t errlen)
{
    struct kvd_backend *b = c->b;
    struct model_batch_row rows[RING_TOKENS_MAX];
    float *x = malloc((size_t)n * b->n_embd * sizeof *x);
    if (!x)
        return -ENOMEM;
    for (uint32_t i = 0; i < n; i++)
        rows[i] = (struct model_batch_row){.id = id, .pos = pos + i};
    if (!b->embed)
        ring_wire_decode(in, (size_t)n * b->n_embd, c->wire_dsize, x);
    struct kvd_backend_batch bt = {.rows = rows, .n = n, .tokens = b->embed ? tokens : NULL, .x = x};
    int rc = b->ops->run(b->impl, &bt, err, errlen);
    free(x);
    return rc;
}

/* Before job j runs: a run that starts before its session's end drops the rows after its
 * start (the rejected drafts of a verifying pass). A window that can rewind overwrites them;
 * one that cannot is put back to its checkpoint and the rows kept run again. A verifying pass
 * on such a window takes a checkpoint first. 0, or j->rc set. */
static int step_prepare(struct kvd_compute *c, struct kvd_job *j)
{
    struct kvd_backend *b = c->b;
    struct csess *s = cs_find(c, j->session, NULL);
    if (!s)
        return 0;
    if (j->flags & RING_FL_DRAFT)
        c->dstats.draft_passes++;
    if (j->pos < s->end)
        c->dstats.rows_dropped += s->end - j->pos;
    if (b->can_rewind)
        return 0;
    char berr[KV_ERR_MAX] = "";
    int rc = 0;
    if (j->pos < s->end) {
        if (!s->ck_n || j->pos <= s->ck_pos || j->pos > s->ck_pos + s->ck_n) {
            rc = -EINVAL;
            snprintf(berr, sizeof berr, "a run from position %u, before the session's end %u, "
                     "and no checkpoint there", j->pos, s->end);
        } else if ((rc = b->ops->restore(b->impl, j->session)) < 0) {
            snprintf(berr, sizeof berr, "restoring the recurrent state: %s", strerror(-rc));
        } else {
            c->dstats.restores++;
            c->dstats.rows_rerun += j->pos - s->ck_pos;
            rc = rows_rerun(c, j->session, s->ck_pos, j->pos - s->ck_pos, s->ck_tok, s->ck_in,
                            berr, sizeof berr);
        }
    }
    s->ck_n = 0;
    if (rc == 0 && (j->flags & RING_FL_DRAFT) && j->n > 1) {
        if (!b->ops->checkpoint || !b->ops->restore) {
            rc = -ENOTSUP;
            snprintf(berr, sizeof berr, "this window cannot drop rejected drafts (recurrent "
                     "layers and no checkpoint)");
        } else if (j->n > RING_TOKENS_MAX) {
            rc = -EINVAL;
            snprintf(berr, sizeof berr, "a verifying pass of %u rows (at most %u)", j->n, RING_TOKENS_MAX);
        } else if ((rc = b->ops->checkpoint(b->impl, j->session)) < 0) {
            snprintf(berr, sizeof berr, "checkpointing the recurrent state: %s", strerror(-rc));
        } else {
            c->dstats.checkpoints++;
            size_t bytes = b->embed ? (size_t)j->n * sizeof *s->ck_tok : j->in_len;
            uint8_t *keep = malloc(bytes);
            if (!keep) {
                rc = -ENOMEM;
                snprintf(berr, sizeof berr, "out of memory for the checkpoint's rows");
            } else {
                memcpy(keep, b->embed ? (const void *)j->tokens : (const void *)j->in, bytes);
                free(s->ck_tok);
                free(s->ck_in);
                s->ck_tok = b->embed ? (int32_t *)keep : NULL;
                s->ck_in = b->embed ? NULL : keep;
                s->ck_pos = j->pos;
                s->ck_n = j->n;
            }
        }
    }
    if (rc < 0)
        step_run_failed(j, rc, berr);
    return rc;
}

/* Run STEP jobs of different sessions as one backend run: each job's rows (tokens on rank 0,
 * its decoded ACT payload elsewhere) are packed into the batch, run together, split back, and
 * each job ends (wire encoding, or sampling its head rows' logits) exactly as if run alone.
 * One job is a batch of one, the path of a session alone. A job that cannot start (a rewind
 * without its checkpoint) fails alone. */
static void step_run(struct kvd_compute *c, struct kvd_job **all, uint32_t n_all)
{
    struct kvd_backend *b = c->b;
    double t0 = util_now_ms();
    struct kvd_job *jobs[KVD_BATCH_JOBS_MAX];
    uint32_t n_jobs = 0, rows = 0, n_head = 0;
    for (uint32_t k = 0; k < n_all; k++) {
        all[k]->rc = 0;
        all[k]->out_type = 0;
        if (step_prepare(c, all[k]) < 0)
            continue;
        jobs[n_jobs++] = all[k];
        rows += all[k]->n;
        n_head += heads_of(c, all[k]);
    }
    if (n_jobs == 0)
        goto done;
    if (scratch_reserve(c, rows, n_head) < 0) {
        for (uint32_t k = 0; k < n_jobs; k++) {
            jobs[k]->rc = -ENOMEM;
            snprintf(jobs[k]->err, sizeof jobs[k]->err, "out of memory for %u boundary rows", rows);
        }
        goto done;
    }
    /* Pack the inputs; roff[k]: job k's first row, hk[k]: its first logits row (or -1). */
    uint32_t roff[KVD_BATCH_JOBS_MAX], head[KVD_BATCH_JOBS_MAX * RING_TOKENS_MAX];
    int32_t hk[KVD_BATCH_JOBS_MAX];
    uint32_t r = 0, h = 0;
    for (uint32_t k = 0; k < n_jobs; k++) {
        struct kvd_job *j = jobs[k];
        roff[k] = r;
        for (uint32_t i = 0; i < j->n; i++)
            c->rows[r + i] = (struct model_batch_row){.id = j->session, .pos = j->pos + i};
        if (b->embed)
            memcpy(c->tok + r, j->tokens, (size_t)j->n * sizeof *c->tok);
        else
            ring_wire_decode(j->in, (size_t)j->n * b->n_embd, c->wire_dsize,
                             c->x + (size_t)r * b->n_embd);
        uint32_t nh = heads_of(c, j);
        hk[k] = nh ? (int32_t)h : -1;
        for (uint32_t i = 0; i < nh; i++)
            head[h++] = r + j->n - nh + i;
        r += j->n;
    }
    struct kvd_backend_batch bt = {
        .rows = c->rows, .n = rows, .tokens = b->embed ? c->tok : NULL, .x = c->x,
        .head = head, .n_head = n_head, .logits = c->logits,
    };
    char berr[KV_ERR_MAX] = "";
    int rc = b->ops->run(b->impl, &bt, berr, sizeof berr);
    if (n_jobs > 1 && (rc == -ENOENT || rc == -EINVAL || rc == -ERANGE)) {
        /* Refused before anything ran (x and every session untouched): one session's fault,
         * so each job runs alone and only the faulty one fails. */
        for (uint32_t k = 0; k < n_jobs; k++) {
            struct kvd_backend_batch one = {
                .rows = c->rows + roff[k], .n = jobs[k]->n,
                .tokens = b->embed ? c->tok + roff[k] : NULL,
                .x = c->x + (size_t)roff[k] * b->n_embd, .head = head + (hk[k] >= 0 ? hk[k] : 0),
                .n_head = heads_of(c, jobs[k]),
                .logits = c->logits + (hk[k] >= 0 ? (size_t)hk[k] * b->n_vocab : 0),
            };
            /* the head rows as indices into this job's own rows */
            uint32_t hr[RING_TOKENS_MAX];
            for (uint32_t i = 0; i < one.n_head; i++)
                hr[i] = jobs[k]->n - one.n_head + i;
            one.head = hr;
            berr[0] = 0;
            int rk = b->ops->run(b->impl, &one, berr, sizeof berr);
            if (rk < 0)
                step_run_failed(jobs[k], rk, berr);
        }
    } else if (rc < 0) {
        for (uint32_t k = 0; k < n_jobs; k++)
            step_run_failed(jobs[k], rc, berr);
    }
    for (uint32_t k = 0; k < n_jobs; k++) {
        struct kvd_job *j = jobs[k];
        if (j->rc != 0)
            continue;
        struct csess *s = cs_find(c, j->session, NULL);
        if (s)
            s->end = j->pos + j->n;
        step_output(c, j, c->x + (size_t)roff[k] * b->n_embd,
                    hk[k] >= 0 ? c->logits + (size_t)hk[k] * b->n_vocab : NULL);
    }
done:;
    /* Each job's share of the batch's time, so the stage's compute total stays the wall time. */
    double ms = util_now_ms() - t0;
    for (uint32_t k = 0; k < n_all; k++)
        all[k]->ms = rows ? ms * all[k]->n / rows : 0;
}
static void job_run(struct kvd_compute *c, struct kvd_job *j)
{
    struct kvd_backend *b = c->b;
    const struct kvd_backend_ops *ops = b->ops;
    struct model_sampler_params sp;
    j->rc = 0;
    if (j->kind == KVD_JOB_OPEN) {
        int rc = ops->session_new(b->impl, j->session);
        if (rc < 0) {
            j->rc = rc;
            snprintf(j->err, sizeof j->err, "session %016llx: cannot create its KV on this stage: %s",
                     (unsigned long long)j->session, strerror(-rc));
            return;
        }
        struct csess *s = calloc(1, sizeof *s);
        if (s) {
            s->id = j->session;
            s->n_ctx = j->open.n_ctx;
        }
        if (s && b->head) {
            kvd_sampler_params(&sp, &j->open);
            s->logits = j->flags & RING_FL_LOGITS;
            s->draft_max = j->open.draft_max < RING_DRAFTS_MAX ? j->open.draft_max : RING_DRAFTS_MAX;
            s->mtp = s->draft_max && b->mtp && j->open.draft_kind != RING_DRAFT_LOOKUP;
            if (s->draft_max && j->open.draft_kind == RING_DRAFT_MTP && !b->mtp) {
                cs_free(s);
                ops->session_free(b->impl, j->session);
                j->rc = -ENOTSUP;
                snprintf(j->err, sizeof j->err, "session %016llx asks for MTP drafts, and the last "
                         "window holds no MTP block (the model has none, or this stage's file "
                         "lacks it or token_embd): use --draft lookup or auto",
                         (unsigned long long)j->session);
                return;
            }
            /* drafting looks its guesses up in the session's tokens (model_draft_lookup) */
            s->hist_cap = s->draft_max ? s->n_ctx + RING_TOKENS_MAX : 0;
            if (model_sampler_new(&s->sampler, &sp, b->n_vocab) < 0 ||
                (s->hist_cap && !(s->hist = malloc((size_t)s->hist_cap * sizeof *s->hist)))) {
                cs_free(s);
                s = NULL;
            }
        }
        if (!s) {
            ops->session_free(b->impl, j->session);
            j->rc = -ENOMEM;
            snprintf(j->err, sizeof j->err, "session %016llx: cannot create its %s",
                     (unsigned long long)j->session, b->head ? "sampler" : "state");
            return;
        }
        if (b->head) {
            model_sampler_skip(s->sampler, j->open.draws);   /* a replay: continue the draws */
            for (uint32_t i = 0; i < j->n_tokens; i++) {
                model_sampler_accept(s->sampler, j->tokens[i]);
                if (s->hist && s->n_hist < s->hist_cap)
                    s->hist[s->n_hist++] = j->tokens[i];
            }
        }
        s->next = c->sessions;
        c->sessions = s;
        return;
    }
    if (j->kind == KVD_JOB_PROBE) {
        /* its sessions' ids: a run of free ones (it runs whole, so none opens meanwhile) */
        uint64_t id0 = KVD_PROBE_ID0;
        for (bool taken = true; taken; ) {
            taken = false;
            for (uint32_t k = 0; k < RING_PROBE_SEQS_MAX && !taken; k++)
                taken = cs_find(c, id0 + k, NULL) != NULL;
            if (taken)
                id0 += RING_PROBE_SEQS_MAX;
        }
        char *outs = NULL;
        j->rc = kvd_probe_run(b, id0, c->max_batch, j->probe, &outs, j->err, sizeof j->err);
        j->out = (uint8_t *)outs;
        j->out_len = outs ? strlen(outs) : 0;
        return;
    }
    if (j->kind == KVD_JOB_CLOSE) {
        ops->session_free(b->impl, j->session);
        struct csess **pp = NULL, *s = cs_find(c, j->session, &pp);
        if (s) {
            *pp = s->next;
            cs_free(s);
        }
        return;
    }
    step_run(c, &j, 1);
}

/* A decode step: one row (or a verifying pass) that ends its step (LAST: a token follows), no
 * piece of a prompt the scheduler split here; a predecessor's one-row chunk of a prompt is
 * none. */
static bool is_decode(const struct kvd_job *j)
{
    return kvd_sched_step_whole(j) && (j->flags & RING_FL_LAST) && !j->piece;
}

/* Count a run of nb jobs that started at t_run and took run_ms into st: a batch of several
 * sessions' steps, and every step's wait from being submitted (or from its session's step
 * before it ending) to t_run, decode steps' apart. */
static void stats_note(struct kvd_compute_stats *st, struct kvd_job **batch, uint32_t nb,
                       double t_run, double run_ms)
{
    if (batch[0]->kind != KVD_JOB_STEP)
        return;
    uint32_t rows = 0;
    for (uint32_t k = 0; k < nb; k++) {
        double w = t_run - batch[k]->t_queued;
        uint32_t wr = batch[k]->runs_waited;
        st->wait_ms_total += w;
        st->wait_ms_max = fmax(st->wait_ms_max, w);
        if (wr > st->max_runs_waited)
            st->max_runs_waited = wr;
        if (is_decode(batch[k])) {
            st->dec_wait_ms_max = fmax(st->dec_wait_ms_max, w);
            if (wr > st->max_dec_runs_waited)
                st->max_dec_runs_waited = wr;
        }
        rows += batch[k]->n;
    }
    st->steps_waited += nb;
    st->step_runs++;
    st->run_ms_total += run_ms;
    st->run_ms_max = fmax(st->run_ms_max, run_ms);
    if (nb > 1) {
        st->batches++;
        st->batched_jobs += nb;
        st->batched_rows += rows;
        if (nb > st->max_jobs)
            st->max_jobs = nb;
        if (rows > st->max_rows)
            st->max_rows = rows;
    }
}

/* With c->mu held, after a step run: the queued steps waited one more run; a prompt's rest
 * waits from now; what ran decides the next pick (plan_make). */
static void after_step_run(struct kvd_compute *c, struct kvd_job **batch, uint32_t nb)
{
    for (struct kvd_job *q = c->in_head; q; q = q->next)
        q->runs_waited += q->kind == KVD_JOB_STEP;
    double now = util_now_ms();
    /* The next queued step of each session that ran waits from now: before, it could not run
     * (its session's steps run in order), so its wait is the scheduler's from here on. */
    for (uint32_t k = 0; k < nb; k++)
        for (struct kvd_job *q = c->in_head; q; q = q->next)
            if (q->session == batch[k]->session) {
                if (q->kind == KVD_JOB_STEP) {
                    q->t_queued = fmax(q->t_queued, now);
                    q->runs_waited = 0;
                }
                break;
            }
    c->last_solo = nb == 1 && batch[0]->n > kvd_sched_cap(c);
    c->last_prompt = false;
    for (uint32_t k = 0; k < nb; k++)
        c->last_prompt = c->last_prompt || !kvd_sched_step_whole(batch[k]);
}

static void *thread_main(void *arg)
{
    struct kvd_compute *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->stop && !c->in_head)
            pthread_cond_wait(&c->cv, &c->mu);
        if (c->stop)
            break;
        struct kvd_job *batch[KVD_BATCH_JOBS_MAX] = {0};
        uint32_t nb = kvd_sched_take(c, batch);
        pthread_mutex_unlock(&c->mu);
        double t_run = util_now_ms();
        if (nb == 1)
            job_run(c, batch[0]);
        else
            step_run(c, batch, nb);
        double run_ms = util_now_ms() - t_run;
        pthread_mutex_lock(&c->mu);
        stats_note(&c->stats, batch, nb, t_run, run_ms);
        c->stats.draft_passes = c->dstats.draft_passes;
        c->stats.rows_dropped = c->dstats.rows_dropped;
        c->stats.checkpoints = c->dstats.checkpoints;
        c->stats.restores = c->dstats.restores;
        c->stats.rows_rerun = c->dstats.rows_rerun;
        if (batch[0]->kind == KVD_JOB_STEP && !c->stop)
            after_step_run(c, batch, nb);
        struct net_handoff_link *back[KVD_BATCH_JOBS_MAX];
        for (uint32_t k = 0; k < nb; k++)
            back[k] = &batch[k]->back;
        net_handoff_push_n(c->results, back, nb);
    }
    pthread_mutex_unlock(&c->mu);
    /* Free what the thread owns: samplers and the sessions' KV. */
    while (c->sessions) {
        struct csess *s = c->sessions;
        c->sessions = s->next;
        cs_free(s);
    }
    return NULL;
}

static struct kvd_job *job_of(struct net_handoff_link *l)
{
    return (struct kvd_job *)((char *)l - offsetof(struct kvd_job, back));
}

/* On the loop thread: a job run, to the owner. */
static void on_result(struct net_handoff_link *l, void *ud)
{
    struct kvd_compute *c = ud;
    struct kvd_job *j = job_of(l);
    j->next = NULL;
    if (c->stop)
        kvd_job_free(j);
    else
        c->done(j, c->ud);
}

/* A job run that nobody will be told of: the queue closed with it in. */
static void on_result_dropped(struct net_handoff_link *l, void *ud)
{
    kvd_job_free(job_of(l));
}

int kvd_compute_new(struct kvd_compute **out, uv_loop_t *loop, struct kvd_backend *b,
                    uint32_t wire_dsize, uint32_t max_batch, uint32_t batch_wait_us,
                    kvd_job_done_cb done, void *ud)
{
    struct kvd_compute *c = calloc(1, sizeof *c);
    if (!c)
        return -ENOMEM;
    c->b = b;
    c->max_batch = max_batch;
    c->batch_wait_us = batch_wait_us;
    c->wire_dsize = wire_dsize;
    c->done = done;
    c->ud = ud;
    if (pthread_mutex_init(&c->mu, NULL) != 0) {
        free(c);
        return -ENOMEM;
    }
    if (pthread_cond_init(&c->cv, NULL) != 0) {
        pthread_mutex_destroy(&c->mu);
        free(c);
        return -ENOMEM;
    }
    /* The thread first: it touches the results' queue only for a job, and none can be
     * submitted before we return, so a failed queue is undone here without a loop turn. */
    int rc = -EAGAIN;
    if (pthread_create(&c->thread, NULL, thread_main, c) != 0)
        goto fail_thread;
    rc = net_handoff_new(&c->results, loop, on_result, on_result_dropped, c);
    if (rc < 0)
        goto fail_results;
    *out = c;
    return 0;
fail_results:
    pthread_mutex_lock(&c->mu);
    c->stop = true;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->thread, NULL);
fail_thread:
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
    return rc;
}

void kvd_compute_stats(struct kvd_compute *c, struct kvd_compute_stats *out)
{
    pthread_mutex_lock(&c->mu);
    *out = c->stats;
    pthread_mutex_unlock(&c->mu);
}

void kvd_compute_submit_n(struct kvd_compute *c, struct kvd_job **jobs, uint32_t n)
{
    double now = util_now_ms();
    pthread_mutex_lock(&c->mu);
    for (uint32_t i = 0; i < n; i++) {
        struct kvd_job *j = jobs[i];
        j->next = NULL;
        j->t_queued = now;
        if (c->in_tail)
            c->in_tail->next = j;
        else
            c->in_head = j;
        c->in_tail = j;
    }
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

void kvd_compute_submit(struct kvd_compute *c, struct kvd_job *j)
{
    kvd_compute_submit_n(c, &j, 1);
}

/* The results' queue is closed, its last jobs dropped: the rest of c goes. */
static void on_results_closed(void *arg)
{
    struct kvd_compute *c = arg;
    free(c->rows);
    free(c->tok);
    free(c->x);
    free(c->logits);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    kvd_compute_closed_cb closed = c->closed;
    void *ud = c->closed_ud;
    free(c);
    if (closed)
        closed(ud);
}

void kvd_compute_stop(struct kvd_compute *c, kvd_compute_closed_cb closed, void *ud)
{
    if (!c)
        return;
    c->closed = closed;
    c->closed_ud = ud;
    pthread_mutex_lock(&c->mu);
    c->stop = true;
    pthread_cond_signal(&c->cv);
    struct kvd_job *j = c->in_head;
    c->in_head = c->in_tail = NULL;
    pthread_mutex_unlock(&c->mu);
    while (j) {
        struct kvd_job *n = j->next;
        kvd_job_free(j);
        j = n;
    }
    pthread_join(c->thread, NULL);
    net_handoff_close(c->results, on_results_closed, c);
}

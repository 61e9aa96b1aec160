/* sched.c — the compute thread's batching scheduler (docs/ring.md, "The batching scheduler"):
 * which queued jobs the next window run takes (decode steps first, prompts sharing the rest in
 * chunks split off the queued job), and the jobs' freeing. compute.c calls it with its mutex
 * held. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "kvd/stage/internal.h"

/* A batch of several sessions' steps: at most this many rows (the backend's batch_rows caps
 * it further: KERN_ROWS_EXACT_MAX for a window with F32 matmul weights on the cpu device or
 * on opencl with prompt GEMMs) and KVD_BATCH_JOBS_MAX jobs, and this many distinct sessions
 * looked at in the queue while gathering it. 64 rows: a prompt chunk big enough to run at the
 * batched kernels' speed next to the decode rows of other sessions. */
#define KVD_BATCH_ROWS_MAX 64
#define KVD_BATCH_SEEN_MAX 64
/* The smallest share of a run's rows a prompt gets when several wait (fewer rows per chunk
 * would spread prompts thin: every one late). */
#define KVD_CHUNK_MIN 4

void kvd_job_free(struct kvd_job *j)
{
    if (!j)
        return;
    free(j->tokens);
    free(j->in);
    free(j->out);
    cJSON_Delete(j->probe);
    free(j);
}

static bool seen_has(const uint64_t *seen, uint32_t n, uint64_t id)
{
    for (uint32_t i = 0; i < n; i++)
        if (seen[i] == id)
            return true;
    return false;
}

/* Rows one run of several sessions may take: max_batch, the window's row-exact limit. 0 or
 * 1: every run takes one session's step. */
uint32_t kvd_sched_cap(const struct kvd_compute *c)
{
    uint32_t cap = c->max_batch < c->b->batch_rows ? c->max_batch : c->b->batch_rows;
    return cap > KVD_BATCH_ROWS_MAX ? KVD_BATCH_ROWS_MAX : cap;
}

/* What the next run takes: of each job take[k] its first rows_of[k] rows (all of them, or a
 * chunk split off a prompt). */
struct plan {
    struct kvd_job *take[KVD_BATCH_JOBS_MAX];
    uint32_t rows_of[KVD_BATCH_JOBS_MAX];
    uint32_t n, rows;
};

/* With c->mu held: the jobs that may run next, oldest first (queue order): the first queued
 * job of each session (so a session's jobs keep their order and none passes its session's
 * OPEN or CLOSE). The STEPs into out (returns how many), the first OPEN or CLOSE into *other
 * (NULL: none). */
static uint32_t runnable(struct kvd_compute *c, struct kvd_job **out, struct kvd_job **other)
{
    uint64_t seen[KVD_BATCH_SEEN_MAX];
    uint32_t ns = 0, n = 0;
    *other = NULL;
    for (struct kvd_job *q = c->in_head; q && ns < KVD_BATCH_SEEN_MAX; q = q->next) {
        if (seen_has(seen, ns, q->session))
            continue;
        seen[ns++] = q->session;
        if (q->kind == KVD_JOB_STEP)
            out[n++] = q;
        else if (!*other)
            *other = q;
    }
    return n;
}

/* A step the scheduler takes whole and first: a decode step (one row) or a verifying pass (a
 * decode step with its drafts, never split: its rows' logits are all sampled from). The rest
 * are prompts. */
bool kvd_sched_step_whole(const struct kvd_job *j)
{
    return j->n == 1 || (j->flags & RING_FL_DRAFT);
}

static void plan_add(struct plan *p, struct kvd_job *j, uint32_t rows)
{
    p->rows_of[p->n] = rows;
    p->take[p->n++] = j;
    p->rows += rows;
}

/* With c->mu held: the next run of steps into *p (docs/ring.md, "The batching scheduler");
 * returns the first runnable OPEN or CLOSE (NULL: none), which kvd_sched_take runs first. Decode
 * steps (one row) go first, oldest first, leaving room for the prompt that waited longest;
 * then prompts fill the rows left, the longest waiting first, each up to its share, split to
 * it when the window allows (chunk_exact). A prompt longer than the cap that cannot be split
 * runs alone, every other run at most, so other steps slip in between. With one session per
 * run, a decode step follows every prompt run. A step alone at the stage runs whole, as
 * ever. */
static struct kvd_job *plan_make(struct kvd_compute *c, struct plan *p)
{
    struct kvd_job *r[KVD_BATCH_SEEN_MAX], *other;
    uint32_t nr = runnable(c, r, &other), cap = kvd_sched_cap(c);
    memset(p, 0, sizeof *p);
    if (nr == 0)
        return other;
    if (nr == 1) {
        plan_add(p, r[0], r[0]->n);
        return other;
    }
    if (cap < 2) {
        struct kvd_job *pick = r[0];
        for (uint32_t i = 0; c->last_prompt && i < nr; i++)
            if (kvd_sched_step_whole(r[i])) {
                pick = r[i];
                break;
            }
        plan_add(p, pick, pick->n);
        return other;
    }
    /* The prompts by how long they have waited (their chunks' rest waits from its last run). */
    struct kvd_job *pr[KVD_BATCH_SEEN_MAX];
    uint32_t np = 0;
    for (uint32_t i = 0; i < nr; i++)
        if (!kvd_sched_step_whole(r[i])) {
            uint32_t k = np++;
            for (; k > 0 && pr[k - 1]->t_queued > r[i]->t_queued; k--)
                pr[k] = pr[k - 1];
            pr[k] = r[i];
        }
    if (np && pr[0]->n > cap && !c->b->chunk_exact && !c->last_solo) {
        plan_add(p, pr[0], pr[0]->n);   /* too long to batch or split: alone */
        return other;
    }
    uint32_t reserve = 0;
    for (uint32_t i = 0; i < np && !reserve; i++)
        if (pr[i]->n <= cap || c->b->chunk_exact)
            reserve = pr[i]->n < cap / 3 ? pr[i]->n : cap / 3;
    for (uint32_t i = 0; i < nr && p->n < KVD_BATCH_JOBS_MAX; i++)
        if (kvd_sched_step_whole(r[i]) && p->rows + r[i]->n + reserve <= cap)
            plan_add(p, r[i], r[i]->n);
    /* Each prompt's share of the rows left: several prompts progress in one run. */
    uint32_t share = np ? (cap - p->rows + np - 1) / np : 0;
    if (share < KVD_CHUNK_MIN)
        share = KVD_CHUNK_MIN;
    for (uint32_t i = 0; i < np && p->rows < cap && p->n < KVD_BATCH_JOBS_MAX; i++) {
        uint32_t room = cap - p->rows;
        if (pr[i]->n <= room && (pr[i]->n <= share || !c->b->chunk_exact))
            plan_add(p, pr[i], pr[i]->n);
        else if (c->b->chunk_exact)
            plan_add(p, pr[i], room < share ? room : share);
    }
    if (p->n == 0)   /* only prompts too long to batch, one of which just ran: the oldest */
        plan_add(p, np ? pr[0] : r[0], np ? pr[0]->n : r[0]->n);
    return other;
}

/* With c->mu held: unlink j from the queue. */
static void queue_unlink(struct kvd_compute *c, struct kvd_job *j)
{
    struct kvd_job *prev = NULL, *q = c->in_head;
    for (; q && q != j; q = q->next)
        prev = q;
    if (!q)
        return;
    if (prev)
        prev->next = j->next;
    else
        c->in_head = j->next;
    if (c->in_tail == j)
        c->in_tail = prev;
    j->next = NULL;
}

/* A new STEP job of j's first rows rows (same session and flags but LAST, which stays with
 * the rest); j keeps the rest, in the queue. NULL without memory. */
static struct kvd_job *split_off(struct kvd_compute *c, struct kvd_job *j, uint32_t rows)
{
    struct kvd_job *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    *h = (struct kvd_job){.kind = KVD_JOB_STEP, .session = j->session, .pos = j->pos, .n = rows,
                          .flags = j->flags & (uint8_t)~RING_FL_LAST, .t_queued = j->t_queued,
                          .runs_waited = j->runs_waited, .piece = true, .epoch = j->epoch};
    if (j->tokens) {
        h->tokens = malloc((size_t)rows * sizeof *h->tokens);
        if (!h->tokens)
            goto fail;
        memcpy(h->tokens, j->tokens, (size_t)rows * sizeof *h->tokens);
        h->n_tokens = rows;
    }
    size_t bytes = (size_t)rows * c->b->n_embd * c->wire_dsize;
    if (j->in) {
        h->in = malloc(bytes);
        if (!h->in)
            goto fail;
        memcpy(h->in, j->in, bytes);
        h->in_len = bytes;
    }
    if (j->tokens) {
        memmove(j->tokens, j->tokens + rows, (size_t)(j->n_tokens - rows) * sizeof *j->tokens);
        j->n_tokens -= rows;
    }
    if (j->in) {
        memmove(j->in, j->in + bytes, j->in_len - bytes);
        j->in_len -= bytes;
    }
    j->pos += rows;
    j->n -= rows;
    j->piece = true;
    return h;
fail:
    kvd_job_free(h);
    return NULL;
}

/* With c->mu held and the queue not empty: an OPEN or CLOSE that may run alone first (they
 * are quick, and a session's steps cannot pass its OPEN: run early, every session that has
 * arrived competes for the next runs), else the steps plan_make picks (waiting up to
 * batch_wait_us for more to fill the cap); a prompt a chunk is split off stays queued with
 * the rest. */
uint32_t kvd_sched_take(struct kvd_compute *c, struct kvd_job **batch)
{
    struct plan p;
    struct kvd_job *other = plan_make(c, &p);
    if (other || p.n == 0) {
        struct kvd_job *j = other ? other : c->in_head;
        queue_unlink(c, j);
        batch[0] = j;
        return 1;
    }
    uint32_t cap = kvd_sched_cap(c);
    if (c->batch_wait_us && p.n < KVD_BATCH_JOBS_MAX && p.rows < cap) {
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        uint64_t ns = (uint64_t)dl.tv_nsec + (uint64_t)c->batch_wait_us * 1000;
        dl.tv_sec += (time_t)(ns / 1000000000u);
        dl.tv_nsec = (long)(ns % 1000000000u);
        while (!c->stop && p.n < KVD_BATCH_JOBS_MAX && p.rows < cap &&
               pthread_cond_timedwait(&c->cv, &c->mu, &dl) == 0)
            plan_make(c, &p);
    }
    for (uint32_t k = 0; k < p.n; k++) {
        struct kvd_job *t = p.take[k];
        if (p.rows_of[k] < t->n) {
            struct kvd_job *h = split_off(c, t, p.rows_of[k]);
            if (h) {   /* without memory the prompt runs whole: the same results */
                batch[k] = h;
                c->stats.chunks++;
                continue;
            }
        }
        queue_unlink(c, t);
        batch[k] = t;
    }
    return p.n;
}

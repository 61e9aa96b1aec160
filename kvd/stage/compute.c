/* compute.c — the stage's compute thread. The loop submits jobs (open a session, run a step,
 * close a session) to a FIFO; one thread runs them in order on the backend and hands them back
 * through uv_async, so the event loop never computes. Per-session samplers live here too. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvd/stage/internal.h"
#include "ringlib/ring.h"

struct csess {
    uint64_t id;
    void *sampler;
    bool logits;
    struct csess *next;
};

struct kvd_compute {
    uv_async_t async;
    struct kvd_backend *b;
    uint32_t wire_dsize;
    kvd_job_done_cb done;
    void *ud;
    kvd_compute_closed_cb closed;   /* kvd_compute_stop's: after everything is freed */
    void *closed_ud;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct kvd_job *in_head, *in_tail, *out_head, *out_tail;
    bool stop;
    struct csess *sessions;     /* compute thread only */
    float *x, *logits;          /* compute thread scratch */
    size_t x_cap;
};

void kvd_job_free(struct kvd_job *j)
{
    if (!j)
        return;
    free(j->tokens);
    free(j->in);
    free(j->out);
    free(j);
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

static void job_run(struct kvd_compute *c, struct kvd_job *j)
{
    struct kvd_backend *b = c->b;
    const struct kvd_backend_ops *ops = b->ops;
    double t0 = util_now_ms();
    j->rc = 0;
    if (j->kind == KVD_JOB_OPEN) {
        int rc = ops->session_new(b->impl, j->session);
        if (rc < 0) {
            j->rc = rc;
            snprintf(j->err, sizeof j->err, "session %016llx: cannot create its KV on this stage: %s",
                     (unsigned long long)j->session, strerror(-rc));
            return;
        }
        if (b->head) {
            struct csess *s = calloc(1, sizeof *s);
            if (s)
                s->sampler = ops->sampler_new(b->impl, &j->open);
            if (!s || !s->sampler) {
                free(s);
                ops->session_free(b->impl, j->session);
                j->rc = -ENOMEM;
                snprintf(j->err, sizeof j->err, "session %016llx: cannot create its sampler",
                         (unsigned long long)j->session);
                return;
            }
            s->id = j->session;
            s->logits = j->flags & NET_FL_LOGITS;
            for (uint32_t i = 0; i < j->n_tokens; i++)
                ops->sampler_accept(b->impl, s->sampler, j->tokens[i]);
            s->next = c->sessions;
            c->sessions = s;
        }
        return;
    }
    if (j->kind == KVD_JOB_CLOSE) {
        ops->session_free(b->impl, j->session);
        struct csess **pp = NULL, *s = cs_find(c, j->session, &pp);
        if (s) {
            *pp = s->next;
            ops->sampler_free(b->impl, s->sampler);
            free(s);
        }
        return;
    }
    /* STEP */
    size_t ne = (size_t)j->n * b->n_embd;
    if (ne > c->x_cap) {
        float *nx = realloc(c->x, ne * sizeof *nx);
        if (!nx) {
            j->rc = -ENOMEM;
            snprintf(j->err, sizeof j->err, "out of memory for %u boundary rows", j->n);
            return;
        }
        c->x = nx;
        c->x_cap = ne;
    }
    float *x = c->x;
    int rc;
    if (b->embed) {
        rc = ops->embed(b->impl, j->tokens, j->n, x);
        if (rc < 0) {
            j->rc = rc;
            snprintf(j->err, sizeof j->err, "embedding %u tokens failed: %s", j->n, strerror(-rc));
            return;
        }
    } else {
        ring_wire_decode(j->in, ne, c->wire_dsize, x);
    }
    rc = ops->run(b->impl, j->session, j->pos, j->n, x);
    if (rc < 0) {
        j->rc = rc;
        snprintf(j->err, sizeof j->err, "layers %u..%u at pos %u (+%u rows) failed: %s",
                 b->first, b->last, j->pos, j->n, rc == -ERANGE ? "past the context" : strerror(-rc));
        return;
    }
    if (b->head) {
        if (!(j->flags & NET_FL_LAST)) {
            j->out_type = 0;
        } else {
            struct csess *s = cs_find(c, j->session, NULL);
            if (!s) {
                j->rc = -ENOENT;
                snprintf(j->err, sizeof j->err, "no sampler for the session");
                return;
            }
            size_t extra = s->logits ? (size_t)b->n_vocab * 4 : 0;
            uint8_t *out = malloc(8 + extra);
            float *lg = malloc((size_t)b->n_vocab * sizeof *lg);
            if (!out || !lg) {
                free(out);
                free(lg);
                j->rc = -ENOMEM;
                snprintf(j->err, sizeof j->err, "out of memory for logits");
                return;
            }
            rc = ops->head(b->impl, x + (size_t)(j->n - 1) * b->n_embd, 1, lg);
            if (rc < 0) {
                free(out);
                free(lg);
                j->rc = rc;
                snprintf(j->err, sizeof j->err, "output head failed: %s", strerror(-rc));
                return;
            }
            if (extra)
                memcpy(out + 8, lg, extra);   /* raw logits, before the sampler touches them */
            float lp = 0;
            int32_t tok = ops->sampler_sample(b->impl, s->sampler, lg, &lp);
            free(lg);
            if (tok < 0 || (uint32_t)tok >= b->n_vocab) {
                free(out);
                j->rc = -EDOM;
                snprintf(j->err, sizeof j->err, "no token can be sampled (logits all -inf/NaN)");
                return;
            }
            ops->sampler_accept(b->impl, s->sampler, tok);
            put32(out, (uint32_t)tok);
            memcpy(out + 4, &lp, 4);
            j->token = tok;
            j->logprob = lp;
            j->out = out;
            j->out_len = 8 + extra;
            j->out_type = NET_F_TOKEN;
            j->out_flags = extra ? NET_FL_LOGITS : 0;
        }
    } else {
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
        j->out_type = NET_F_ACT;
        j->out_flags = j->flags & NET_FL_LAST;
    }
    j->ms = util_now_ms() - t0;
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
        struct kvd_job *j = c->in_head;
        c->in_head = j->next;
        if (!c->in_head)
            c->in_tail = NULL;
        j->next = NULL;
        pthread_mutex_unlock(&c->mu);
        job_run(c, j);
        pthread_mutex_lock(&c->mu);
        if (c->out_tail)
            c->out_tail->next = j;
        else
            c->out_head = j;
        c->out_tail = j;
        uv_async_send(&c->async);
    }
    pthread_mutex_unlock(&c->mu);
    /* Free what the thread owns: samplers and the sessions' KV. */
    while (c->sessions) {
        struct csess *s = c->sessions;
        c->sessions = s->next;
        c->b->ops->sampler_free(c->b->impl, s->sampler);
        free(s);
    }
    return NULL;
}

static void on_async(uv_async_t *a)
{
    struct kvd_compute *c = a->data;
    pthread_mutex_lock(&c->mu);
    struct kvd_job *j = c->out_head;
    c->out_head = c->out_tail = NULL;
    pthread_mutex_unlock(&c->mu);
    while (j) {
        struct kvd_job *next = j->next;
        j->next = NULL;
        if (c->stop)
            kvd_job_free(j);
        else
            c->done(j, c->ud);
        j = next;
    }
}

int kvd_compute_new(struct kvd_compute **out, uv_loop_t *loop, struct kvd_backend *b,
                    uint32_t wire_dsize, kvd_job_done_cb done, void *ud)
{
    struct kvd_compute *c = calloc(1, sizeof *c);
    if (!c)
        return -ENOMEM;
    c->b = b;
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
    /* The thread first: it touches the async handle only for a job, and none can be submitted
     * before we return, so a failed handle is undone here without a loop turn. */
    int rc = -EAGAIN;
    if (pthread_create(&c->thread, NULL, thread_main, c) != 0)
        goto fail_thread;
    rc = uv_async_init(loop, &c->async, on_async);
    if (rc < 0)
        goto fail_async;
    c->async.data = c;
    *out = c;
    return 0;
fail_async:
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

void kvd_compute_submit(struct kvd_compute *c, struct kvd_job *j)
{
    j->next = NULL;
    pthread_mutex_lock(&c->mu);
    if (c->in_tail)
        c->in_tail->next = j;
    else
        c->in_head = j;
    c->in_tail = j;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void on_async_closed(uv_handle_t *h)
{
    struct kvd_compute *c = h->data;
    struct kvd_job *j = c->out_head;
    while (j) {
        struct kvd_job *n = j->next;
        kvd_job_free(j);
        j = n;
    }
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
    uv_close((uv_handle_t *)&c->async, on_async_closed);
}

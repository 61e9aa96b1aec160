/* test-kvd-compute.c — the stage's compute thread (kvd/stage/compute.c) on the stand-in backend
 * (tests/tools/stub_backend.c, registered by name as in build/tests/kvd-stub), one stage holding
 * the whole model (embedding, window, head and sampler): steps of several sessions batched
 * into one backend run give each session the token it gets alone; a batch the backend
 * refuses (an unknown session, a skipped position) fails only the faulty step; the status
 * figures (batches, every step's wait, run times) count what ran; with decoders stepping while
 * long prompts arrive, prompts are chunked, tokens stay the solo ones and no decode step
 * waits more than one run (counted in runs, not wall-clock time). */
#include "tests/lib/t.h"
#include "tests/tools/stub_backend.c"

#define N_EMBD 32
#define N_LAYER 4
#define MAX_JOBS 32

struct run {
    uv_loop_t loop;
    struct kvd_backend be;
    struct kvd_compute *c;
    struct kvd_job *done[MAX_JOBS];
    unsigned n_done, n_want;
    bool closed;
    kvd_job_done_cb hook;   /* set: takes every finished job instead (ud: this struct) */
};

static void on_done(struct kvd_job *j, void *ud)
{
    struct run *r = ud;
    if (r->hook) {
        r->hook(j, r);
        return;
    }
    if (r->n_done < MAX_JOBS)
        r->done[r->n_done++] = j;
    else
        kvd_job_free(j);
    if (r->n_done >= r->n_want)
        uv_stop(&r->loop);
}

static void on_closed(void *ud) { ((struct run *)ud)->closed = true; }

static int run_start(struct run *r, uint32_t max_batch, uint32_t wait_us)
{
    memset(r, 0, sizeof *r);
    char err[KV_ERR_MAX];
    const struct kvd_backend_kind *k = kvd_backend_kind_find("stub");
    if (!k || uv_loop_init(&r->loop) < 0)
        return -1;
    struct kvd_backend_args a = {.win_first = 0, .win_last = N_LAYER, .n_layer = N_LAYER,
                                 .n_embd = N_EMBD, .n_ctx = 256, .max_batch = max_batch};
    if (k->open(&r->be, &a, err, sizeof err) < 0)
        return -1;
    return kvd_compute_new(&r->c, &r->loop, &r->be, 4, max_batch, wait_us, on_done, r);
}

static void run_finish(struct run *r)
{
    for (unsigned i = 0; i < r->n_done; i++)
        kvd_job_free(r->done[i]);
    kvd_compute_stop(r->c, on_closed, r);
    uv_run(&r->loop, UV_RUN_DEFAULT);
    T_CHECK(r->closed, "the compute thread's close callback ran");
    T_CHECK(uv_loop_close(&r->loop) == 0, "the loop closes with no handle left");
    kvd_backend_close(&r->be);
}

static struct kvd_job *job(int kind, uint64_t session, uint32_t pos, const int32_t *toks, uint32_t n)
{
    struct kvd_job *j = calloc(1, sizeof *j);
    j->kind = kind;
    j->session = session;
    j->pos = pos;
    /* greedy, no penalties (what kvctl generate --temp 0 sends) */
    j->open = (struct ring_open_params){.temperature = 0, .top_p = 1, .repeat_penalty = 1};
    if (toks) {
        j->tokens = malloc(n * sizeof *j->tokens);
        memcpy(j->tokens, toks, n * sizeof *j->tokens);
        j->n_tokens = n;
    }
    if (kind == KVD_JOB_STEP) {
        j->n = n;
        j->flags = RING_FL_LAST;   /* the step ends its prompt: sample */
    }
    return j;
}

/* Submit the jobs (all at once, so the thread finds them queued) and wait for them. */
static void run_jobs(struct run *r, struct kvd_job **jobs, unsigned n)
{
    r->n_want = r->n_done + n;
    kvd_compute_submit_n(r->c, jobs, n);
    uv_run(&r->loop, UV_RUN_DEFAULT);
}

static const struct kvd_job *result(const struct run *r, int kind, uint64_t session)
{
    for (unsigned i = r->n_done; i-- > 0;)
        if (r->done[i]->kind == kind && r->done[i]->session == session)
            return r->done[i];
    return NULL;
}

static const int32_t prompts[3][4] = {{1, 7, 9, 11}, {1, 40, 41, 0}, {1, 200, 0, 0}};
static const uint32_t plen[3] = {4, 3, 2};

/* Sessions 1..3 opened and their prompts stepped; the sampled tokens into tok[3]. */
static void three_sessions(struct run *r, int32_t tok[3], bool *ok)
{
    struct kvd_job *jobs[6];
    for (unsigned s = 0; s < 3; s++)
        jobs[s] = job(KVD_JOB_OPEN, s + 1, 0, prompts[s], plen[s]);
    for (unsigned s = 0; s < 3; s++)
        jobs[3 + s] = job(KVD_JOB_STEP, s + 1, 0, prompts[s], plen[s]);
    run_jobs(r, jobs, 6);
    *ok = r->n_done == 6;
    for (unsigned s = 0; s < 3; s++) {
        const struct kvd_job *j = result(r, KVD_JOB_STEP, s + 1);
        *ok = *ok && j && j->rc == 0 && j->out_type == RING_F_TOKEN;
        tok[s] = j ? j->token : -1;
    }
}

T_CASE(batched_steps_give_each_session_its_own_token)
{
    struct run alone, batched;
    int32_t ta[3], tb[3];
    bool ok;
    /* max_batch 1: every step runs alone */
    T_ASSERT(run_start(&alone, 1, 0) == 0, "compute on the stub (one row a run)");
    three_sessions(&alone, ta, &ok);
    T_CHECK(ok, "every step alone gave a token");
    T_CHECK(ta[0] != ta[1] || ta[1] != ta[2], "three prompts, one token %d: the check below "
            "would not tell sessions apart", ta[0]);
    struct kvd_compute_stats cs;
    kvd_compute_stats(alone.c, &cs);
    T_CHECK(cs.batches == 0 && cs.step_runs == 3 && cs.steps_waited == 3,
            "alone: %llu batches, %llu step runs, %llu steps waited", (unsigned long long)cs.batches,
            (unsigned long long)cs.step_runs, (unsigned long long)cs.steps_waited);
    run_finish(&alone);
    /* a step waits up to 200 ms for company: the three prompts run as one backend run */
    T_ASSERT(run_start(&batched, 64, 200000) == 0, "compute on the stub (batching)");
    three_sessions(&batched, tb, &ok);
    T_CHECK(ok, "every batched step gave a token");
    for (unsigned s = 0; s < 3; s++)
        T_CHECK(ta[s] == tb[s], "session %u: token %d alone, %d batched", s + 1, ta[s], tb[s]);
    kvd_compute_stats(batched.c, &cs);
    T_CHECK(cs.batches == 1 && cs.batched_jobs == 3 && cs.batched_rows == 9 && cs.max_jobs == 3 &&
            cs.max_rows == 9, "one batch of 3 steps / 9 rows: %llu batches, %llu steps, %llu rows",
            (unsigned long long)cs.batches, (unsigned long long)cs.batched_jobs,
            (unsigned long long)cs.batched_rows);
    T_CHECK(cs.steps_waited == 3 && cs.step_runs == 1, "3 steps waited, 1 run: %llu, %llu",
            (unsigned long long)cs.steps_waited, (unsigned long long)cs.step_runs);
    /* the first step waited for company until all three were there, never past the budget
     * by much; prompts are not one-row steps */
    T_CHECK(cs.wait_ms_max >= 0 && cs.wait_ms_max < 2000 && cs.wait_ms_total <= 3 * cs.wait_ms_max,
            "waits: max %.3f ms, total %.3f ms", cs.wait_ms_max, cs.wait_ms_total);
    T_CHECK(cs.dec_wait_ms_max == 0, "no decode step, yet a decode wait of %.3f ms", cs.dec_wait_ms_max);
    T_CHECK(cs.run_ms_max > 0 && cs.run_ms_total == cs.run_ms_max, "run times: max %.3f, total %.3f",
            cs.run_ms_max, cs.run_ms_total);
    /* a decode step each: batched again, and the one-row steps' waits are counted */
    struct kvd_job *dec[3];
    for (unsigned s = 0; s < 3; s++)
        dec[s] = job(KVD_JOB_STEP, s + 1, plen[s], &tb[s], 1);
    run_jobs(&batched, dec, 3);
    for (unsigned s = 0; s < 3; s++) {
        const struct kvd_job *j = result(&batched, KVD_JOB_STEP, s + 1);
        T_CHECK(j && j->rc == 0 && j->pos == plen[s], "session %u's decode step: %s", s + 1,
                j ? j->err : "missing");
    }
    kvd_compute_stats(batched.c, &cs);
    T_CHECK(cs.batches == 2 && cs.steps_waited == 6, "%llu batches, %llu steps waited",
            (unsigned long long)cs.batches, (unsigned long long)cs.steps_waited);
    T_CHECK(cs.dec_wait_ms_max > 0 && cs.dec_wait_ms_max <= cs.wait_ms_max,
            "decode wait %.3f ms within the max %.3f ms", cs.dec_wait_ms_max, cs.wait_ms_max);
    run_finish(&batched);
}

T_CASE(refused_batch_fails_only_the_faulty_step)
{
    struct run alone, r;
    int32_t ta[3];
    bool ok;
    T_ASSERT(run_start(&alone, 1, 0) == 0, "compute on the stub (one row a run)");
    three_sessions(&alone, ta, &ok);
    T_CHECK(ok, "every step alone gave a token");
    run_finish(&alone);
    T_ASSERT(run_start(&r, 64, 200000) == 0, "compute on the stub (batching)");
    /* sessions 1 and 3 opened; session 2 never was (unknown to the backend); session 3's step
     * skips a position: the backend refuses the batch, each step then runs alone */
    struct kvd_job *jobs[5] = {
        job(KVD_JOB_OPEN, 1, 0, prompts[0], plen[0]),
        job(KVD_JOB_OPEN, 3, 0, prompts[2], plen[2]),
        job(KVD_JOB_STEP, 1, 0, prompts[0], plen[0]),
        job(KVD_JOB_STEP, 2, 0, prompts[1], plen[1]),
        job(KVD_JOB_STEP, 3, 5, prompts[2], plen[2]),
    };
    run_jobs(&r, jobs, 5);
    const struct kvd_job *j1 = result(&r, KVD_JOB_STEP, 1), *j2 = result(&r, KVD_JOB_STEP, 2),
                         *j3 = result(&r, KVD_JOB_STEP, 3);
    T_ASSERT(j1 && j2 && j3, "all three steps came back");
    T_CHECK(j1->rc == 0 && j1->token == ta[0], "session 1: rc %d, token %d (alone %d)", j1->rc,
            j1->token, ta[0]);
    T_CHECK(j2->rc == -ENOENT && strstr(j2->err, "no session"), "session 2: rc %d, '%s'", j2->rc, j2->err);
    T_CHECK(j3->rc == -EINVAL && strstr(j3->err, "at pos 5"), "session 3: rc %d, '%s'", j3->rc, j3->err);
    struct kvd_compute_stats cs;
    kvd_compute_stats(r.c, &cs);
    T_CHECK(cs.batches == 1 && cs.batched_jobs == 3, "the refused batch counts once: %llu, %llu",
            (unsigned long long)cs.batches, (unsigned long long)cs.batched_jobs);
    /* session 3 goes on from its real position */
    struct kvd_job *again = job(KVD_JOB_STEP, 3, 0, prompts[2], plen[2]);
    run_jobs(&r, &again, 1);
    T_CHECK(r.done[r.n_done - 1]->rc == 0 && r.done[r.n_done - 1]->token == ta[2],
            "session 3 at its position: rc %d, token %d (alone %d)", r.done[r.n_done - 1]->rc,
            r.done[r.n_done - 1]->token, ta[2]);
    run_finish(&r);
}

/* Many sessions at once: N_DEC sessions decode step after step (each next step submitted
 * when the last one's token comes back, as round a ring) while N_LONG prompts of LONG rows
 * each arrive at once. */
#define N_DEC 4
#define N_LONG 8
#define LONG 40
#define N_STEPS 10

struct mix {
    struct run r;
    int32_t tok[N_DEC + N_LONG][N_STEPS];
    unsigned got[N_DEC + N_LONG], left;
};

static void prompt_of(uint64_t s, int32_t *p, uint32_t *n)
{
    *n = s <= N_DEC ? 2 : LONG;
    for (uint32_t i = 0; i < *n; i++)
        p[i] = (int32_t)((s * 37 + i * 11) % 250) + 1;
}

/* A decoder's next step after token tok at position pos (NULL once it has N_STEPS tokens). */
static struct kvd_job *next_step(struct mix *m, uint64_t s, uint32_t pos, int32_t tok)
{
    return m->got[s - 1] < N_STEPS ? job(KVD_JOB_STEP, s, pos, &tok, 1) : NULL;
}

static void mix_on_done(struct kvd_job *j, void *ud)
{
    struct mix *m = ud;
    if (j->kind == KVD_JOB_STEP && j->out_type == RING_F_TOKEN && j->rc == 0) {
        unsigned i = (unsigned)j->session - 1;
        m->tok[i][m->got[i]++] = j->token;
        struct kvd_job *n = j->session <= N_DEC ? next_step(m, j->session, j->pos + j->n, j->token) : NULL;
        if (n)
            kvd_compute_submit(m->r.c, n);
        else
            m->left--;
    } else if (j->kind == KVD_JOB_STEP && j->rc < 0) {
        m->left = 0;   /* fails below: a token missing */
    }
    kvd_job_free(j);
    if (m->left == 0)
        uv_stop(&m->r.loop);
}

T_CASE(decode_steps_never_wait_behind_prompts)
{
    /* Each session's tokens alone, one job at a time: the reference. */
    struct run alone;
    int32_t want[N_DEC + N_LONG][N_STEPS], p[LONG];
    uint32_t n;
    T_ASSERT(run_start(&alone, 1, 0) == 0, "compute on the stub (one row a run)");
    for (uint64_t s = 1; s <= N_DEC + N_LONG; s++) {
        prompt_of(s, p, &n);
        struct kvd_job *o = job(KVD_JOB_OPEN, s, 0, p, n);
        run_jobs(&alone, &o, 1);
        struct kvd_job *st = job(KVD_JOB_STEP, s, 0, p, n);
        run_jobs(&alone, &st, 1);
        for (unsigned k = 0; k < (s <= N_DEC ? N_STEPS : 1u); k++) {
            const struct kvd_job *d = alone.done[alone.n_done - 1];
            T_ASSERT(d->rc == 0 && d->out_type == RING_F_TOKEN, "session %llu alone: %s",
                     (unsigned long long)s, d->err);
            want[s - 1][k] = d->token;
            if (k + 1 < (s <= N_DEC ? N_STEPS : 1u)) {
                struct kvd_job *nx = job(KVD_JOB_STEP, s, d->pos + d->n, &d->token, 1);
                run_jobs(&alone, &nx, 1);
            }
        }
        for (unsigned i = 0; i < alone.n_done; i++)
            kvd_job_free(alone.done[i]);
        alone.n_done = 0;
    }
    run_finish(&alone);

    /* All at once on a batching stage: decoders' prompts first, then their decode steps and
     * the long prompts together. */
    static struct mix m;
    memset(&m, 0, sizeof m);
    T_ASSERT(run_start(&m.r, 64, 0) == 0, "compute on the stub (batching)");
    struct kvd_job *jobs[2 * (N_DEC + N_LONG)];
    unsigned nj = 0;
    for (uint64_t s = 1; s <= N_DEC + N_LONG; s++) {
        prompt_of(s, p, &n);
        jobs[nj++] = job(KVD_JOB_OPEN, s, 0, p, n);
    }
    for (uint64_t s = 1; s <= N_DEC; s++) {
        prompt_of(s, p, &n);
        jobs[nj++] = job(KVD_JOB_STEP, s, 0, p, n);
    }
    run_jobs(&m.r, jobs, nj);
    T_ASSERT(m.r.n_done == nj, "opened and prompted: %u of %u jobs back", m.r.n_done, nj);
    for (uint64_t s = 1; s <= N_DEC; s++) {
        const struct kvd_job *d = result(&m.r, KVD_JOB_STEP, s);
        T_ASSERT(d && d->rc == 0, "decoder %llu's prompt", (unsigned long long)s);
        m.tok[s - 1][m.got[s - 1]++] = d->token;
    }
    struct kvd_compute_stats before;
    kvd_compute_stats(m.r.c, &before);
    for (unsigned i = 0; i < m.r.n_done; i++)
        kvd_job_free(m.r.done[i]);
    m.r.n_done = 0;
    m.r.hook = mix_on_done;   /* m.r is m's first member */
    m.left = N_DEC + N_LONG;
    nj = 0;
    for (uint64_t s = 1; s <= N_DEC; s++)
        jobs[nj++] = job(KVD_JOB_STEP, s, 2, &m.tok[s - 1][0], 1);
    for (uint64_t s = N_DEC + 1; s <= N_DEC + N_LONG; s++) {
        prompt_of(s, p, &n);
        jobs[nj++] = job(KVD_JOB_STEP, s, 0, p, n);
    }
    /* at once: submitted one by one, a busy machine lets the compute thread run each job
     * as it comes, alone, and the scheduling under test never happens */
    kvd_compute_submit_n(m.r.c, jobs, nj);
    uv_run(&m.r.loop, UV_RUN_DEFAULT);
    for (unsigned s = 0; s < N_DEC + N_LONG; s++) {
        unsigned nt = s < N_DEC ? N_STEPS : 1;
        T_CHECK(m.got[s] == nt, "session %u: %u tokens, expected %u", s + 1, m.got[s], nt);
        for (unsigned k = 0; k < nt && k < m.got[s]; k++)
            T_CHECK(m.tok[s][k] == want[s][k], "session %u token %u: %d, alone %d", s + 1, k,
                    m.tok[s][k], want[s][k]);
    }
    struct kvd_compute_stats cs;
    kvd_compute_stats(m.r.c, &cs);
    /* 8 prompts of 40 rows in runs of at most 15 rows: split into chunks; every decode step
     * ran in the first run that started after it was queued (or the one after), and every
     * prompt chunk waited at most one run per other prompt */
    T_CHECK(cs.chunks >= N_LONG * (LONG / 15), "%llu prompt chunks", (unsigned long long)cs.chunks);
    T_CHECK(cs.max_rows <= 15, "a run of %u rows", cs.max_rows);
    T_CHECK(cs.max_dec_runs_waited <= 1, "a decode step waited %u runs", cs.max_dec_runs_waited);
    T_CHECK(cs.max_runs_waited <= N_LONG, "a step waited %u runs", cs.max_runs_waited);
    T_CHECK(cs.step_runs - before.step_runs >= N_LONG * LONG / 15,
            "%llu step runs for %u rows", (unsigned long long)(cs.step_runs - before.step_runs),
            N_LONG * LONG + N_DEC * (N_STEPS - 1));
    run_finish(&m.r);
}

T_CASE(backend_table)
{
    const struct kvd_backend_kind *m = kvd_backend_kind_at(0), *s = kvd_backend_kind_find("stub");
    T_CHECK(m && !strcmp(m->name, "model") && !m->option, "the model comes first, with no option");
    T_CHECK(s && s->option && !strcmp(s->option, "--stub"), "the stub is registered as --stub");
    T_CHECK(kvd_backend_register(&stub_kind) == -EEXIST, "a name twice is refused");
    T_CHECK(!kvd_backend_kind_find("nothing"), "an unknown name is not found");
}

int main(int argc, char **argv)
{
    t_init(argc, argv);
    T_RUN(batched_steps_give_each_session_its_own_token);
    T_RUN(refused_batch_fails_only_the_faulty_step);
    T_RUN(decode_steps_never_wait_behind_prompts);
    T_RUN(backend_table);
    return T_DONE();
}

/* control.c — rank 0's (and every stage's) control socket: one JSON request per connection
 * (generate, status, shutdown), a generate request opened as a session whose tokens stream
 * back on the same connection, and the status object. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "kvd/kvd.h"
#include "kvd/stage/internal.h"
#include "model/model.h"
#include "net/net.h"

/* ================================ status ================================ */

/* This stage's status: its ring record (status.c) and the figures only a local caller gets:
 * the repair counters, the batching scheduler's waits, frames and bytes sent. */
static cJSON *status_json(struct stage *st)
{
    cJSON *o = kvd_status_record(st);
    cJSON_AddStringToObject(o, "ring", st->m.ring);
    cJSON_AddStringToObject(o, "model", st->m.model_name);
    cJSON_AddNumberToObject(o, "n_ranks", st->n);
    cJSON_AddNumberToObject(o, "n_layers", st->m.n_layers);
    cJSON_AddNumberToObject(o, "n_embd", st->m.n_embd);
    cJSON_AddStringToObject(o, "arch", st->be.arch);
    cJSON_AddStringToObject(o, "dtype", st->m.dtype);
    /* a local caller gets each link's last failure whole (the ring's records cut it) */
    for (int k = 0; k < 2; k++) {
        const struct kvd_link_note *ln = &st->links.note[k ? st->rank : st->pred];
        cJSON *l = cJSON_GetObjectItemCaseSensitive(o, k ? "out" : "in");
        if (ln->last_reason[0] && cJSON_GetObjectItemCaseSensitive(l, "error"))
            util_json_set(l, "error", cJSON_CreateString(ln->last_reason));
    }
    cJSON_AddStringToObject(cJSON_GetObjectItemCaseSensitive(o, "in"), "endpoint", "");
    cJSON_AddStringToObject(cJSON_GetObjectItemCaseSensitive(o, "out"), "endpoint",
                            st->m.ranks[st->succ].endpoint);
    if (st->be.device[0])
        cJSON_AddStringToObject(o, "device", st->be.device);
    if (st->be.cl_weights[0]) {   /* how the opencl device holds the window (docs/opencl.md) */
        cJSON_AddStringToObject(o, "cl_weights", st->be.cl_weights);
        cJSON_AddNumberToObject(o, "cl_weights_mapped_bytes", (double)st->be.cl_weights_mapped);
        cJSON_AddNumberToObject(o, "cl_weights_copied_bytes", (double)st->be.cl_weights_copied);
    }
    /* how long ago this stage last ran a token (absent before the first): the market's map
     * shows it (kvd join sends it in its heartbeats) */
    if (st->stats.last_step_ms)
        cJSON_AddNumberToObject(o, "last_token_age_s",
                                round(((uint64_t)util_now_ms() - st->stats.last_step_ms) / 100.0) / 10);
    uint32_t pend = 0;
    for (struct conn *p = st->links.pending; p; p = p->next)
        pend++;
    cJSON_AddNumberToObject(o, "pending_links", pend);
    /* the market's probes run on this stage's loaded window (kvd join asks them) */
    cJSON *pr = cJSON_AddObjectToObject(o, "probes");
    cJSON_AddNumberToObject(pr, "run", (double)st->probes.run);
    cJSON_AddNumberToObject(pr, "failed", (double)st->probes.failed);
    cJSON_AddNumberToObject(pr, "ms_max", round(st->probes.ms_max * 10) / 10);
    /* Repair, every stage: ranks it took over as a standby, sessions it opened as replays and
     * the history positions it recomputed for them, its boundary logs (bytes held now, part of
     * this stage's memory; logs dropped over a cap; replayed sessions served from a log instead
     * of recomputed) and the link deadlines in force (docs/ring.md, "Repair"). */
    cJSON_AddNumberToObject(o, "takeovers", (double)st->standby.takeovers);
    cJSON_AddNumberToObject(o, "replayed_sessions", (double)st->stats.replayed_sessions);
    cJSON_AddNumberToObject(o, "replayed_positions", (double)st->stats.replayed_positions);
    cJSON_AddNumberToObject(o, "boundary_log_bytes", (double)st->sessions.blog_bytes);
    cJSON_AddNumberToObject(o, "boundary_logs_dropped", (double)st->stats.blog_dropped);
    cJSON_AddNumberToObject(o, "replays_from_log", (double)st->stats.replays_from_log);
    if (st->links.in)
        cJSON_AddNumberToObject(o, "in_deadline_ms", kvd_conn_deadline_ms(st->links.in));
    if (st->links.out)
        cJSON_AddNumberToObject(o, "out_deadline_ms", kvd_conn_deadline_ms(st->links.out));
    /* Repair (docs/ring.md, "Repair"): rank 0's paused sessions, the ring breaks they saw,
     * the replays and how long a break cost, and the repairs seen (status.c). */
    if (st->rank == 0 && !st->standby.waiting) {
        cJSON *ro = cJSON_AddObjectToObject(o, "repair");
        cJSON_AddNumberToObject(ro, "wait_s", st->repair.wait_ms / 1000);
        cJSON_AddNumberToObject(ro, "paused_sessions", st->repair.n_paused);
        cJSON_AddNumberToObject(ro, "ring_breaks", (double)st->repair.ring_breaks);
        cJSON_AddNumberToObject(ro, "replays", (double)st->repair.replays);
        cJSON_AddNumberToObject(ro, "resumed_sessions", (double)st->repair.resumed);
        cJSON_AddNumberToObject(ro, "not_repaired", (double)st->repair.failed);
        cJSON_AddNumberToObject(ro, "last_resume_ms", st->repair.last_resume_ms);
        cJSON_AddNumberToObject(ro, "max_resume_ms", st->repair.max_resume_ms);
        cJSON_AddNumberToObject(ro, "repairs", (double)st->status.repairs);
        if (st->status.repairs) {
            cJSON_AddNumberToObject(ro, "last_repair_unix", (double)st->status.last_repair_unix);
            cJSON_AddNumberToObject(ro, "last_repair_rank", st->status.last_repair_rank);
        }
    }
    cJSON_AddNumberToObject(o, "rows", (double)st->stats.rows);
    cJSON_AddNumberToObject(o, "compute_ms", st->stats.compute_ms);
    if (st->comp) {   /* window runs that took several sessions' steps at once */
        struct kvd_compute_stats cs;
        kvd_compute_stats(st->comp, &cs);
        cJSON *bo = cJSON_AddObjectToObject(o, "batches");
        cJSON_AddNumberToObject(bo, "runs", (double)cs.batches);
        cJSON_AddNumberToObject(bo, "steps", (double)cs.batched_jobs);
        cJSON_AddNumberToObject(bo, "rows", (double)cs.batched_rows);
        cJSON_AddNumberToObject(bo, "max_steps", cs.max_jobs);
        cJSON_AddNumberToObject(bo, "max_rows", cs.max_rows);
        cJSON_AddNumberToObject(bo, "rows_allowed", st->be.batch_rows);   /* 0: never batched */
        /* Every step's wait from being queued to its run starting, against the budget a step
         * may wait for company, and the step runs' (window pass) times. */
        cJSON_AddNumberToObject(bo, "wait_budget_ms", st->o.batch_wait_us / 1000.0);
        cJSON_AddNumberToObject(bo, "waited_steps", (double)cs.steps_waited);
        cJSON_AddNumberToObject(bo, "max_wait_ms", cs.wait_ms_max);
        cJSON_AddNumberToObject(bo, "max_decode_wait_ms", cs.dec_wait_ms_max);
        /* the same waits counted in step runs that passed meanwhile, and the prompt chunks */
        cJSON_AddNumberToObject(bo, "max_wait_runs", cs.max_runs_waited);
        cJSON_AddNumberToObject(bo, "max_decode_wait_runs", cs.max_dec_runs_waited);
        cJSON_AddNumberToObject(bo, "prompt_chunks", (double)cs.chunks);
        cJSON_AddNumberToObject(bo, "mean_wait_ms",
                                cs.steps_waited ? cs.wait_ms_total / (double)cs.steps_waited : 0);
        cJSON_AddNumberToObject(bo, "step_runs", (double)cs.step_runs);
        cJSON_AddNumberToObject(bo, "max_run_ms", cs.run_ms_max);
        cJSON_AddNumberToObject(bo, "mean_run_ms",
                                cs.step_runs ? cs.run_ms_total / (double)cs.step_runs : 0);
    }
    /* Drafting (docs/ring.md, "Drafting"): every stage's verifying passes and the rows of
     * rejected drafts it dropped (and on a window that cannot rewind its checkpoints, restores
     * and rows run again); rank 0's passes sent, drafts in them and accepted, and the tokens
     * that came back per pass. */
    cJSON *dro = cJSON_AddObjectToObject(o, "drafts");
    if (st->comp) {
        struct kvd_compute_stats cs;
        kvd_compute_stats(st->comp, &cs);
        cJSON_AddNumberToObject(dro, "verifying_passes", (double)cs.draft_passes);
        cJSON_AddNumberToObject(dro, "rows_dropped", (double)cs.rows_dropped);
        cJSON_AddNumberToObject(dro, "checkpoints", (double)cs.checkpoints);
        cJSON_AddNumberToObject(dro, "restores", (double)cs.restores);
        cJSON_AddNumberToObject(dro, "rows_rerun", (double)cs.rows_rerun);
    }
    if (st->rank == 0) {
        cJSON_AddNumberToObject(dro, "passes_sent", (double)st->stats.draft_passes);
        cJSON_AddNumberToObject(dro, "drafts_sent", (double)st->stats.drafts_sent);
        cJSON_AddNumberToObject(dro, "drafts_accepted", (double)st->stats.drafts_accepted);
        cJSON_AddNumberToObject(dro, "token_frames", (double)st->stats.passes_in);
        cJSON_AddNumberToObject(dro, "tokens", (double)st->stats.tokens_in);
    }
    uint64_t frames = st->stats.act_frames_out + st->stats.tok_frames_out;
    cJSON_AddNumberToObject(o, "frames_out", (double)frames);
    cJSON_AddNumberToObject(o, "rows_out", (double)st->stats.rows);
    /* Boundary (or token) bytes this stage sent per token it processed, headers included. */
    cJSON_AddNumberToObject(o, "boundary_bytes_out", (double)st->stats.frame_bytes_out);
    return o;
}

/* The manifest's standbys: endpoint, the ranks each may serve, and the rank whose record names
 * its node now (-1: waiting, or not heard of over the ring). */
static cJSON *standbys_json(struct stage *st, const cJSON *ranks)
{
    cJSON *a = cJSON_CreateArray();
    for (uint32_t i = 0; i < st->m.n_standbys; i++) {
        const struct ring_standby_info *sb = &st->m.standbys[i];
        cJSON *e = cJSON_CreateObject();
        char node[17];
        util_hex_encode(sb->node, 8, node);
        cJSON_AddNumberToObject(e, "standby", i);
        cJSON_AddStringToObject(e, "endpoint", sb->endpoint);
        cJSON_AddStringToObject(e, "node", node);
        cJSON *may = cJSON_AddArrayToObject(e, "may_serve");
        for (uint32_t r = 0; r < st->n; r++)
            if (sb->ranks >> r & 1)
                cJSON_AddItemToArray(may, cJSON_CreateNumber(r));
        double serves = -1;
        const cJSON *rec;
        cJSON_ArrayForEach(rec, ranks) {
            const cJSON *nd = cJSON_GetObjectItemCaseSensitive(rec, "node");
            if (cJSON_IsString(nd) && !strcmp(nd->valuestring, node) &&
                cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(rec, "answer")))
                serves = util_json_number(rec, "rank", -1);
        }
        cJSON_AddNumberToObject(e, "serves", serves);
        cJSON_AddItemToArray(a, e);
    }
    return a;
}

/* =============================== requests =============================== */

/* The numbers of a generate request: every one is checked against its range here, before
 * any conversion (a double outside the target type's range is undefined behaviour). */
struct gen_nums {
    double n, seed, temp, top_k, top_p, min_p, repeat_penalty, freq_penalty, presence_penalty,
        repeat_last_n;
};

static const struct gen_num_field {
    const char *key;
    size_t at;                  /* offset in struct gen_nums */
    double def, lo, hi;
    bool integer;
} gen_num_fields[] = {
    /* n above the context is cut to it; a seed of 2^64 is what 2^64 - 1 (llama.cpp's
     * "--seed -1") becomes as a JSON double, and is read as 2^64 - 1 */
    {"n", offsetof(struct gen_nums, n), 32, 0, 4294967295.0, true},
    {"seed", offsetof(struct gen_nums, seed), 0, 0, 18446744073709551616.0, true},
    {"temp", offsetof(struct gen_nums, temp), 0, -1000, 1000, false},
    {"top_k", offsetof(struct gen_nums, top_k), 0, 0, 2147483647.0, true},
    {"top_p", offsetof(struct gen_nums, top_p), 1, 0, 1, false},
    {"min_p", offsetof(struct gen_nums, min_p), 0, 0, 1, false},
    {"repeat_penalty", offsetof(struct gen_nums, repeat_penalty), 1, 1e-6, 1000, false},
    {"freq_penalty", offsetof(struct gen_nums, freq_penalty), 0, -1000, 1000, false},
    {"presence_penalty", offsetof(struct gen_nums, presence_penalty), 0, -1000, 1000, false},
    {"repeat_last_n", offsetof(struct gen_nums, repeat_last_n), 64, 0, 1 << 20, true},
};

/* 0, or -EINVAL with msg naming the field, its value and its range. */
static int gen_nums_parse(const cJSON *req, struct gen_nums *g, char *msg, size_t n)
{
    for (size_t i = 0; i < sizeof gen_num_fields / sizeof gen_num_fields[0]; i++) {
        const struct gen_num_field *f = &gen_num_fields[i];
        double *d = (double *)((char *)g + f->at);
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(req, f->key);
        *d = f->def;
        if (!v)
            continue;
        *d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
        if (!(*d >= f->lo && *d <= f->hi) || (f->integer && *d != floor(*d))) {
            char val[40], range[80];
            if (cJSON_IsNumber(v))
                snprintf(val, sizeof val, "%.17g", *d);
            else
                snprintf(val, sizeof val, "not a number");
            if (f->integer)
                snprintf(range, sizeof range, "an integer in [%.0f, %.0f]", f->lo, f->hi);
            else
                snprintf(range, sizeof range, "a number in [%g, %g]", f->lo, f->hi);
            snprintf(msg, n, "%s: %s%s; %s", f->key, val, cJSON_IsNumber(v) ? " out of range" : "", range);
            return -EINVAL;
        }
    }
    return 0;
}

static void handle_generate(struct stage *st, struct client *c, const cJSON *req)
{
    char msg[KV_ERR_MAX];
    if (st->rank != 0) {
        kvd_client_error(c, "this stage is not rank 0: send generation requests to rank 0");
        return;
    }
    struct gen_nums g;
    if (gen_nums_parse(req, &g, msg, sizeof msg) < 0) {
        kvd_client_error(c, msg);
        return;
    }
    int32_t *toks = NULL;
    uint32_t n_toks = 0;
    const cJSON *jt = cJSON_GetObjectItemCaseSensitive(req, "tokens");
    const cJSON *jp = cJSON_GetObjectItemCaseSensitive(req, "prompt");
    if (cJSON_IsArray(jt)) {
        int n = cJSON_GetArraySize(jt);
        if (n < 1 || (uint32_t)n >= st->m.n_ctx) {
            snprintf(msg, sizeof msg, "tokens: %d tokens, need 1..%u", n, st->m.n_ctx - 1);
            kvd_client_error(c, msg);
            return;
        }
        toks = malloc((size_t)n * sizeof *toks);
        if (!toks)
            return;
        for (int i = 0; i < n; i++) {
            const cJSON *v = cJSON_GetArrayItem(jt, i);
            if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= st->be.n_vocab) {
                snprintf(msg, sizeof msg, "tokens[%d] is not a token id in [0, %u)", i, st->be.n_vocab);
                kvd_client_error(c, msg);
                free(toks);
                return;
            }
            toks[i] = (int32_t)v->valuedouble;
        }
        n_toks = (uint32_t)n;
    } else if (cJSON_IsString(jp)) {
        int rc = kvd_backend_tokenize(&st->be, jp->valuestring, &toks, &n_toks);
        if (rc < 0 || n_toks == 0 || n_toks >= st->m.n_ctx) {
            snprintf(msg, sizeof msg, "prompt: %s", rc == -ENOSYS ? "this stage has no tokenizer: send tokens"
                     : rc < 0 ? strerror(-rc) : n_toks == 0 ? "no tokens" : "longer than the context");
            free(toks);
            kvd_client_error(c, msg);
            return;
        }
    } else {
        kvd_client_error(c, "generate needs tokens (array) or prompt (string)");
        return;
    }
    uint32_t max_gen = g.n > st->m.n_ctx ? st->m.n_ctx : (uint32_t)g.n;
    struct kvd_sess_gen sg = {.toks = toks, .n_toks = n_toks, .max_gen = max_gen, .client = c};
    sg.ignore_eos = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(req, "ignore_eos"));
    sg.want_logits = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(req, "logits"));
    /* a paying client's key (kvctl generate --client-key): the socket is the node operator's */
    const cJSON *ck = cJSON_GetObjectItemCaseSensitive(req, "client_key");
    if (cJSON_IsString(ck)) {
        if (!ring_client_key_valid(ck->valuestring)) {
            free(toks);
            kvd_client_error(c, "client_key: expected " RING_CLIENT_KEY_PREFIX " and 64 hex digits");
            return;
        }
        sg.client_key = ck->valuestring;
    }
    /* Stop strings: up to MODEL_GEN_MAX_STOPS (a longer list is ignored); empty or overlong
     * entries are skipped. */
    const char *stops[MODEL_GEN_MAX_STOPS];
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(req, "stop");
    if (cJSON_IsArray(js) && cJSON_GetArraySize(js) > 0 && cJSON_GetArraySize(js) <= MODEL_GEN_MAX_STOPS) {
        for (int i = 0; i < cJSON_GetArraySize(js); i++) {
            const cJSON *v = cJSON_GetArrayItem(js, i);
            if (cJSON_IsString(v) && v->valuestring[0] && strlen(v->valuestring) <= MODEL_GEN_STOP_MAX)
                stops[sg.n_stops++] = v->valuestring;
        }
        sg.stops = stops;
    }
    struct ring_open_params *p = &sg.p;
    int draft;
    uint32_t draft_max;
    if (kvd_sess_draft_parse(req, &draft, &draft_max, msg, sizeof msg) < 0) {
        free(toks);
        kvd_client_error(c, msg);
        return;
    }
    kvd_sess_draft_set(st, draft, draft_max, p);
    p->seed = g.seed >= 18446744073709551616.0 ? UINT64_MAX : (uint64_t)g.seed;
    p->temperature = (float)g.temp;
    p->top_k = (int32_t)g.top_k;
    p->top_p = (float)g.top_p;
    p->min_p = (float)g.min_p;
    p->repeat_penalty = (float)g.repeat_penalty;
    p->freq_penalty = (float)g.freq_penalty;
    p->presence_penalty = (float)g.presence_penalty;
    p->penalty_last_n = (int32_t)g.repeat_last_n;
    struct sess *s;
    if (kvd_sess_start(st, &sg, &s, msg, sizeof msg) < 0)
        kvd_client_error(c, msg);
}

/* A market's known-answer probe (docs/market.md, "Probes"; kvd join asks it while this stage
 * serves the window): the challenge runs on the loaded backend between steps, as a PROBE job
 * of the compute thread, so a spot check costs no second copy of the window. The client gets
 * {"outputs": [...]} or {"error"} (kvd_ctl_probe_done). */
static void handle_probe(struct stage *st, struct client *c, const cJSON *req)
{
    const cJSON *ch = cJSON_GetObjectItemCaseSensitive(req, "challenge");
    if (!cJSON_IsObject(ch)) {
        kvd_client_error(c, "probe: expected a challenge object");
        kvd_client_close(c);
        return;
    }
    if (!st->comp || !st->be_open) {   /* "loaded": false tells kvd join to open it itself */
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "error", "probe: this stage has no window loaded (a standby "
                                "that has not taken a rank over)");
        cJSON_AddBoolToObject(o, "loaded", false);
        kvd_client_send_json(c, o);
        kvd_client_close(c);
        return;
    }
    struct kvd_job *j = calloc(1, sizeof *j);
    if (j)
        j->probe = cJSON_Duplicate(ch, 1);
    if (!j || !j->probe) {
        kvd_job_free(j);
        kvd_client_error(c, "probe: out of memory");
        kvd_client_close(c);
        return;
    }
    j->kind = KVD_JOB_PROBE;
    j->ticket = c->probe = ++st->probes.ticket;
    j->t_queued = util_now_ms();
    kvd_compute_submit(st->comp, j);
}

void kvd_ctl_probe_done(struct stage *st, struct kvd_job *j)
{
    double ms = util_now_ms() - j->t_queued;
    if (j->rc < 0) {
        st->probes.failed++;
        kvd_log(KVD_LOG_WARN, "%s", j->err);
    } else {
        st->probes.run++;
        st->probes.ms_total += ms;
        st->probes.ms_max = ms > st->probes.ms_max ? ms : st->probes.ms_max;
    }
    struct client *c = st->sessions.clients;
    while (c && c->probe != j->ticket)
        c = c->next;
    if (c && !c->closing) {   /* else the asker left: nobody to tell */
        cJSON *o = cJSON_CreateObject();
        if (j->rc < 0)
            cJSON_AddStringToObject(o, "error", j->err);
        else {
            cJSON_AddItemToObject(o, "outputs", cJSON_Parse((const char *)j->out));
            cJSON_AddNumberToObject(o, "ms", round(ms * 10) / 10);
        }
        kvd_client_send_json(c, o);
        kvd_client_close(c);
    }
    kvd_job_free(j);
}

static void handle_request(struct client *c, const char *line)
{
    struct stage *st = c->st;
    cJSON *req = cJSON_Parse(line);
    const cJSON *op = req ? cJSON_GetObjectItemCaseSensitive(req, "op") : NULL;
    if (!cJSON_IsString(op)) {
        kvd_client_error(c, "request must be a JSON object with an op");
        kvd_client_close(c);
    } else if (!strcmp(op->valuestring, "status")) {
        cJSON *o = status_json(st);
        /* "ring": true adds every rank's record as this stage last heard it, and the
         * manifest's standbys with the rank each serves now (docs/kvctl.md, "status") */
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(req, "ring"))) {
            cJSON *ranks = kvd_status_ring(st);
            cJSON_AddItemToObject(o, "ranks", ranks);
            cJSON_AddItemToObject(o, "standbys", standbys_json(st, ranks));
        }
        kvd_client_send_json(c, o);
        kvd_client_close(c);
    } else if (!strcmp(op->valuestring, "shutdown")) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddBoolToObject(o, "ok", 1);
        kvd_client_send_json(c, o);
        kvd_client_close(c);
        st->shutdown(st, "shutdown requested over the control socket");
    } else if (!strcmp(op->valuestring, "probe")) {
        handle_probe(st, c, req);
    } else if (!strcmp(op->valuestring, "generate")) {
        handle_generate(st, c, req);
        if (!c->sess)
            kvd_client_close(c);
    } else {
        kvd_client_error(c, "unknown op (generate, probe, status, shutdown)");
        kvd_client_close(c);
    }
    cJSON_Delete(req);
}

static void client_alloc(uv_handle_t *h, size_t sug, uv_buf_t *buf)
{
    (void)sug; (void)h;
    buf->base = malloc(16384);
    buf->len = buf->base ? 16384 : 0;
}

static void client_on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    struct client *c = s->data;
    if (n < 0) {
        free(buf->base);
        kvd_client_close(c);
        return;
    }
    if (n > 0 && !c->got_request && !c->closing) {
        int rc = util_buf_append(&c->buf, buf->base, (size_t)n, CTL_LINE_MAX);
        if (rc == -E2BIG) {
            kvd_client_error(c, "request line too long");
            kvd_client_close(c);
        } else if (rc == 0) {
            char *nl = strchr(c->buf.s, '\n');
            if (nl) {
                *nl = 0;
                c->got_request = true;
                handle_request(c, c->buf.s);
            }
        }
    }
    free(buf->base);
}

void kvd_ctl_on_conn(uv_stream_t *server, int status)
{
    struct stage *st = server->data;
    if (status < 0 || st->shutting_down)
        return;
    struct client *c = calloc(1, sizeof *c);
    if (!c)
        return;
    c->st = st;
    uv_pipe_init(st->loop, &c->pipe, 0);
    c->pipe.data = c;
    if (uv_accept(server, (uv_stream_t *)&c->pipe) != 0) {
        uv_close((uv_handle_t *)&c->pipe, kvd_client_on_closed);
        return;
    }
    kvd_client_add(c);
    uv_read_start((uv_stream_t *)&c->pipe, client_alloc, client_on_read);
}

/* api.c — rank 0's OpenAI-compatible API (`kvd stage --api HOST:PORT`, docs/api.md): the
 * generator of api/api.h over the ring's sessions, opened as the control socket opens them
 * (kvd_sess_start) with the request's sampling parameters in OPEN, so the last rank samples
 * exactly as for `kvctl generate --ring`. Logprobs ride on the TOKEN frames' logits
 * (RING_FL_LOGITS). A request whose client leaves ends its session round the ring at once. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "api/api.h"
#include "kvd/kvd.h"
#include "kvd/stage/internal.h"
#include "model/model.h"
#include "net/net.h"

/* One generation: the API's sink and the session it rides on. */
struct rgen {
    struct stage *st;
    struct sess *s;
    const struct api_gen_sink *sink;
    void *ud;
};

static void sess_token(void *ud, struct sess *s, int32_t tok, const char *text, size_t len,
                       const float *logits)
{
    (void)s;
    struct rgen *g = ud;
    struct api_gen_token t = {.id = tok, .text = text, .len = len, .logits = logits};
    g->sink->token(g->ud, &t);
}

static void sess_done(void *ud, struct sess *s, const char *reason, const char *error,
                      const char *tail, size_t tail_len)
{
    (void)s;
    struct rgen *g = ud;
    g->sink->done(g->ud, reason, error, tail, tail_len);
    free(g);
}

static const struct kvd_sess_sink sess_sink = {sess_token, sess_done};

static int gen_start(void *impl, const struct api_gen_req *r, const struct api_gen_sink *sink,
                     void *sink_ud, void **handle, char *err, size_t errlen)
{
    struct stage *st = impl;
    struct rgen *g = calloc(1, sizeof *g);
    int32_t *toks = malloc((size_t)r->n_prompt * sizeof *toks);
    if (!g || !toks) {
        free(g);
        free(toks);
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    memcpy(toks, r->prompt, (size_t)r->n_prompt * sizeof *toks);
    g->st = st;
    g->sink = sink;
    g->ud = sink_ud;
    struct kvd_sess_gen sg = {
        .toks = toks, .n_toks = r->n_prompt, .want_logits = r->logits, .ignore_eos = r->ignore_eos,
        .max_gen = r->max_tokens > st->m.n_ctx ? st->m.n_ctx : r->max_tokens,
        .stops = r->stops, .n_stops = r->n_stops, .sink = &sess_sink, .sink_ud = g,
        .client_key = r->api_key,
    };
    sg.p.seed = r->sp.seed;
    sg.p.temperature = r->sp.temperature;
    sg.p.top_k = r->sp.top_k;
    sg.p.top_p = r->sp.top_p;
    sg.p.min_p = r->sp.min_p;
    sg.p.repeat_penalty = r->sp.repeat_penalty;
    sg.p.freq_penalty = r->sp.freq_penalty;
    sg.p.presence_penalty = r->sp.presence_penalty;
    sg.p.penalty_last_n = r->sp.penalty_last_n;
    kvd_sess_draft_set(st, r->draft, r->draft_max, &sg.p);
    int rc = kvd_sess_start(st, &sg, &g->s, err, errlen);
    if (rc < 0) {
        free(g);
        return rc;
    }
    /* When the session ended already (done was called and freed g) nothing refers to g */
    *handle = g;
    return 0;
}

/* The client left: the session ends here and round the ring (CLOSE) with no word to it. */
static void gen_cancel(void *impl, void *handle)
{
    struct stage *st = impl;
    struct rgen *g = handle;
    struct sess *s = g->s;
    s->sink = NULL;
    free(g);
    kvd_sess_finish(st, s, "client gone", NULL);
}

static bool gen_ready(void *impl, char *why, size_t n)
{
    struct stage *st = impl;
    bool up = kvd_conn_out_up(st) && kvd_conn_in_up(st);
    if (!up)
        kvd_conn_ring_why(st, why, n);
    return up;
}

/* Append to buf[cap] at *at (nothing once full). */
static void put(char *buf, size_t cap, size_t *at, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void put(char *buf, size_t cap, size_t *at, const char *fmt, ...)
{
    if (*at >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *at, cap - *at, fmt, ap);
    va_end(ap);
    *at = n < 0 ? cap : *at + (size_t)n;
}

/* Per-stage series for every rank, labelled rank="N", from the ring's status records as rank
 * 0 last heard them (status.c): a rank not heard of has only kvasir_stage_up 0. */
static void gen_metrics(void *impl, char *buf, size_t cap)
{
    struct stage *st = impl;
    cJSON *ranks = kvd_status_ring(st);
    size_t at = 0;
    static const struct { const char *name, *key, *type, *help; } series[] = {
        {"kvasir_stage_ms_per_token", "ms_per_token", "gauge",
         "Mean compute time of one decode step on the stage."},
        {"kvasir_stage_ms_per_token_avg", "ms_per_token_avg", "gauge",
         "Moving average of the compute time of the stage's recent decode steps."},
        {"kvasir_stage_sessions", "sessions", "gauge", "Sessions open on the stage."},
        {"kvasir_stage_paused_sessions", "paused_sessions", "gauge", "Sessions paused for a repair."},
        {"kvasir_stage_steps_total", "steps", "counter", "Window runs of session steps."},
        {"kvasir_stage_rss_bytes", "rss_bytes", "gauge", "Resident memory of the stage's process."},
        {"kvasir_stage_kv_bytes", "kv_bytes", "gauge", "K/V and state reserved by open sessions."},
        {"kvasir_stage_uptime_seconds", "uptime_s", "gauge", "Seconds since the stage started."},
    };
    put(buf, cap, &at, "# HELP kvasir_stage_up Whether the rank answered within %u s.\n"
        "# TYPE kvasir_stage_up gauge\n", STATUS_ANSWER_MS / 1000);
    const cJSON *r;
    cJSON_ArrayForEach(r, ranks)
        put(buf, cap, &at, "kvasir_stage_up{rank=\"%.0f\"} %d\n", util_json_number(r, "rank", 0),
            cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "answer")));
    put(buf, cap, &at, "# HELP kvasir_stage_status_age_seconds Age of the rank's last status record.\n"
        "# TYPE kvasir_stage_status_age_seconds gauge\n");
    cJSON_ArrayForEach(r, ranks)
        if (cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(r, "age_ms")))
            put(buf, cap, &at, "kvasir_stage_status_age_seconds{rank=\"%.0f\"} %.3f\n",
                util_json_number(r, "rank", 0), util_json_number(r, "age_ms", 0) / 1000);
    for (size_t i = 0; i < sizeof series / sizeof series[0]; i++) {
        put(buf, cap, &at, "# HELP %s %s\n# TYPE %s %s\n", series[i].name, series[i].help,
            series[i].name, series[i].type);
        cJSON_ArrayForEach(r, ranks)
            if (cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(r, series[i].key)))
                put(buf, cap, &at, "%s{rank=\"%.0f\"} %.17g\n", series[i].name,
                    util_json_number(r, "rank", 0), util_json_number(r, series[i].key, 0));
    }
    put(buf, cap, &at, "# HELP kvasir_link_bytes_total Bytes on each stage's ring links, by link and "
        "direction.\n# TYPE kvasir_link_bytes_total counter\n");
    cJSON_ArrayForEach(r, ranks)
        for (int k = 0; k < 2; k++) {
            const cJSON *l = cJSON_GetObjectItemCaseSensitive(r, k ? "out" : "in");
            if (!cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(l, "bytes_in")))
                continue;
            put(buf, cap, &at, "kvasir_link_bytes_total{rank=\"%.0f\",link=\"%s\",dir=\"rx\"} %.0f\n"
                "kvasir_link_bytes_total{rank=\"%.0f\",link=\"%s\",dir=\"tx\"} %.0f\n",
                util_json_number(r, "rank", 0), k ? "out" : "in", util_json_number(l, "bytes_in", 0),
                util_json_number(r, "rank", 0), k ? "out" : "in", util_json_number(l, "bytes_out", 0));
        }
    put(buf, cap, &at, "# TYPE kvasir_ring_linked gauge\nkvasir_ring_linked %d\n",
        kvd_conn_out_up(st) && kvd_conn_in_up(st));
    cJSON_Delete(ranks);
}

static const struct api_gen_ops ring_gen_ops = {gen_start, gen_cancel, gen_ready, gen_metrics};

/* The API's configuration from the stage's options (max_sessions 0: the caller's default). */
static struct api_config api_config_of(const struct kvd_stage_opts *o)
{
    return (struct api_config){.listen = o->api_listen, .key_file = o->api_key_file,
                               .key_file_reload = o->api_keys_reload, .open = o->api_open, .tls_cert = o->api_tls_cert,
                               .tls_key = o->api_tls_key, .keepalive_s = o->api_keepalive_s,
                               .max_sessions = o->api_max_sessions,
                               .chat_template = o->chat_template};
}

int kvd_api_check(const struct kvd_stage_opts *o)
{
    if (!o->api_listen)
        return 0;
    struct api_config c = api_config_of(o);
    char err[KV_ERR_MAX];
    int rc = api_config_check(&c, err, sizeof err);
    if (rc < 0)
        kvd_log(KVD_LOG_ERROR, "--api: %s", err);
    return rc;
}

int kvd_api_start(struct stage *st)
{
    const struct kvd_stage_opts *o = &st->o;
    if (!o->api_listen)
        return 0;
    if (st->rank != 0) {
        kvd_log(KVD_LOG_ERROR, "--api: rank %u is not rank 0; the API is served by rank 0", st->rank);
        return -EINVAL;
    }
    const char *path = o->window ? o->window : o->model;
    const char *base = path ? strrchr(path, '/') : NULL;
    struct api_generator gen = {
        .ops = &ring_gen_ops, .impl = st, .vocab = st->be.vocab, .gguf = kvd_backend_gguf(&st->be),
        .n_ctx = st->m.n_ctx, .n_vocab = st->be.n_vocab,
        .model_id = st->m.model_name[0] ? st->m.model_name : base ? base + 1 : path ? path : st->m.ring,
    };
    struct api_config c = api_config_of(o);
    if (!c.max_sessions)
        c.max_sessions = st->m.max_sessions;
    char err[KV_ERR_MAX] = "";
    int rc = api_server_new(&st->io.api, st->loop, &c, &gen, err, sizeof err);
    if (rc < 0) {
        kvd_log(KVD_LOG_ERROR, "%s", err[0] ? err : strerror(-rc));
        return rc;
    }
    kvd_log(KVD_LOG_INFO, "OpenAI-compatible API on %s://%s (port %d)%s, at most %u sessions",
            o->api_tls_cert ? "https" : "http", o->api_listen, api_server_port(st->io.api), o->api_key_file ? ", API keys required" : "",
            c.max_sessions);
    return 0;
}

void kvd_api_stop(struct stage *st)
{
    api_server_close(st->io.api, NULL, NULL);
    st->io.api = NULL;
}

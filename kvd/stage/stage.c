/* stage.c — the stage role: links to predecessor and successor, session bookkeeping, frame
 * validation against the manifest, rank 0's client sessions (control socket), status and
 * clean shutdown. Everything here runs on the loop thread; compute goes to compute.c. */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <openssl/rand.h>

#include "gguf/gguf.h"
#include "kvd/stage/internal.h"
#include "kvd/kvd.h"
#include "ringlib/ring.h"
#include "seed/seed.h"
#include "model/model.h"
#include "net/net.h"
#include "util/err.h"

#define MAX_PENDING_LINKS 8
#define CLOSED_RING 256
#define CTL_LINE_MAX (1u << 20)
#define LINK_SILENCE_MS 15000   /* an established link with nothing received is dead */
#define PING_MS 1000
/* Until a link's handshake is done only HELLO, AUTH and ERROR may come: a small cap, so an
 * unauthenticated peer cannot make us buffer a boundary-sized frame. */
#define HS_MAX_PAYLOAD (4 + NET_ERR_MAX)

enum { CONN_PENDING, CONN_IN, CONN_OUT };

struct conn {
    struct stage *st;
    struct net_link *link;
    struct net_handshake *hs;
    int role;
    bool up;
    uint32_t peer_rank;
    uint64_t last_rx_ms, ping_sent_ns;
    double rtt_ms;
    bool relay_in;              /* our in-link, dialled out to a relay (relay:// endpoint) */
    struct conn *next;          /* pending list */
};

struct client;

struct sess {
    uint64_t id;
    struct sess *next;
    uint32_t n_ctx, next_pos;   /* next position expected on the in link */
    uint64_t last_active_ms;
    /* rank 0 */
    struct client *client;
    int32_t *hist;
    uint32_t n_hist, n_prompt, n_gen, max_gen;
    bool ignore_eos, want_logits, done;
    float *last_logits;
    double t_start, t_first;
    char **stop;
    uint32_t n_stop;
    struct model_detok *detok;  /* streaming text of the generated tokens */
    char *text;                 /* generated text so far (for stop strings) */
    size_t text_len;
};

struct client {
    uv_pipe_t pipe;
    struct stage *st;
    char *buf;
    size_t len;
    bool closing, got_request;
    struct sess *sess;
    struct client *next;
};

struct stage {
    uv_loop_t *loop;
    struct kvd_stage_opts o;
    struct ring_manifest m;
    uint32_t rank, n, pred, succ;
    bool is_last;
    struct net_identity *id;
    struct kvd_backend be;
    bool be_open;
    struct kvd_compute *comp;
    struct net_listener *ls;
    uv_pipe_t ctl;
    bool ctl_open;
    struct net_http_server *http; /* --seed: windows of what this stage holds */
    struct seed_server *seeder;
    uv_timer_t tick, redial;
    uv_timer_t redial_in;       /* relay:// endpoint: re-dial the relay for the in-link */
    uint32_t redial_in_ms;
    uv_signal_t sigterm, sigint;
    struct conn *in, *out, *pending;
    uint32_t redial_ms;
    struct sess *sessions;
    uint32_t n_sessions;
    uint64_t closed[CLOSED_RING];
    uint32_t closed_pos;
    struct client *clients;
    bool shutting_down;
    uint32_t max_payload, chunk;
    char sock_path[512];
    /* statistics */
    uint64_t steps, rows, act_frames_out, tok_frames_out, frame_bytes_out;
    double compute_ms;
    uint64_t dec_steps;
    double dec_ms;
};

static const struct net_link_cbs link_cbs;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void wr32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24);
}

/* ================================ sessions ================================ */

static struct sess *sess_find(struct stage *st, uint64_t id)
{
    for (struct sess *s = st->sessions; s; s = s->next)
        if (s->id == id)
            return s;
    return NULL;
}

static bool recently_closed(struct stage *st, uint64_t id)
{
    for (uint32_t i = 0; i < CLOSED_RING; i++)
        if (st->closed[i] == id && id != 0)
            return true;
    return false;
}

static struct sess *sess_new(struct stage *st, uint64_t id, uint32_t n_ctx)
{
    struct sess *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->id = id;
    s->n_ctx = n_ctx;
    s->last_active_ms = now_ms();
    s->next = st->sessions;
    st->sessions = s;
    st->n_sessions++;
    return s;
}

static void client_send(struct client *c, const char *line);
static void client_close(struct client *c);

/* Forget a session here: free its KV/state on the compute thread, remember its id so late
 * frames for it are dropped rather than treated as hostile. */
static void sess_drop(struct stage *st, struct sess *s)
{
    struct sess **pp = &st->sessions;
    while (*pp && *pp != s)
        pp = &(*pp)->next;
    if (*pp)
        *pp = s->next;
    st->n_sessions--;
    st->closed[st->closed_pos++ % CLOSED_RING] = s->id;
    struct kvd_job *j = calloc(1, sizeof *j);
    if (j && st->comp) {
        j->kind = KVD_JOB_CLOSE;
        j->session = s->id;
        kvd_compute_submit(st->comp, j);
    } else
        free(j);
    if (s->client) {
        s->client->sess = NULL;
        client_close(s->client);
    }
    free(s->hist);
    free(s->last_logits);
    for (uint32_t i = 0; i < s->n_stop; i++)
        free(s->stop[i]);
    free(s->stop);
    free(s->text);
    model_detok_free(s->detok);
    free(s);
}

static bool out_up(struct stage *st) { return st->out && st->out->up; }

static int send_frame(struct conn *c, uint8_t type, uint8_t flags, uint64_t session, uint32_t pos,
                      uint32_t n_tokens, const void *payload, size_t len)
{
    if (!c || !c->up)
        return -ENOTCONN;
    struct net_frame_hdr h = {.magic = NET_MAGIC, .type = type, .flags = flags, .session = session,
                              .pos = pos, .n_tokens = n_tokens};
    return net_link_send(c->link, &h, payload, len);
}

static void send_error(struct conn *c, uint64_t session, uint32_t code, const char *msg)
{
    size_t n = strlen(msg);
    if (n > NET_ERR_MAX)
        n = NET_ERR_MAX;
    uint8_t buf[4 + NET_ERR_MAX];
    wr32(buf, code);
    memcpy(buf + 4, msg, n);
    if (c && c->link && !net_link_is_closing(c->link)) {
        struct net_frame_hdr h = {.magic = NET_MAGIC, .type = NET_F_ERROR, .session = session};
        net_link_send(c->link, &h, buf, 4 + n);
    }
}

static void json_line_to_client(struct client *c, cJSON *o)
{
    char *s = cJSON_PrintUnformatted(o);
    if (s) {
        client_send(c, s);
        free(s);
    }
    cJSON_Delete(o);
}

static void client_error(struct client *c, const char *msg)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "error", msg);
    json_line_to_client(c, o);
}

/* Rank 0: end a session: tell the client, send CLOSE round the ring, free it here. */
static void sess_finish(struct stage *st, struct sess *s, const char *reason, const char *error)
{
    if (s->client) {
        cJSON *o = cJSON_CreateObject();
        if (error) {
            cJSON_AddStringToObject(o, "error", error);
        } else {
            double t_end = (double)now_ns() / 1e6;
            cJSON_AddBoolToObject(o, "done", 1);
            const char *tail = NULL;
            size_t tl = 0;
            if (s->detok && model_detok_flush(s->detok, &tail, &tl) == 0 && tl) {
                char *tmp = malloc(tl + 1);
                if (tmp) {
                    memcpy(tmp, tail, tl);
                    tmp[tl] = 0;
                    cJSON_AddStringToObject(o, "s", tmp);
                    free(tmp);
                }
            }
            cJSON_AddStringToObject(o, "reason", reason);
            cJSON_AddNumberToObject(o, "n_prompt", s->n_prompt);
            cJSON_AddNumberToObject(o, "n_gen", s->n_gen);
            cJSON_AddNumberToObject(o, "prompt_ms", s->t_first > 0 ? s->t_first - s->t_start : 0);
            cJSON_AddNumberToObject(o, "gen_ms", s->t_first > 0 ? t_end - s->t_first : 0);
            if (s->want_logits && s->last_logits) {
                cJSON *a = cJSON_CreateArray();
                char num[32];
                for (uint32_t i = 0; i < st->be.n_vocab; i++) {
                    /* %.9g round-trips a float exactly */
                    snprintf(num, sizeof num, "%.9g", s->last_logits[i]);
                    cJSON_AddItemToArray(a, cJSON_CreateRaw(num));
                }
                cJSON_AddItemToObject(o, "logits", a);
            }
        }
        json_line_to_client(s->client, o);
    }
    kvd_log(error ? KVD_LOG_WARN : KVD_LOG_INFO, "session %016" PRIx64 " ends: %s (prompt %u, generated %u)",
            s->id, error ? error : reason, s->n_prompt, s->n_gen);
    if (!st->is_last)
        send_frame(st->out, NET_F_CLOSE, 0, s->id, 0, 0, NULL, 0);
    sess_drop(st, s);
}

/* Any rank: the session failed here. Rank 0 tells its client; others pass ERROR on. */
static void sess_fail(struct stage *st, struct sess *s, const char *msg)
{
    if (st->rank == 0) {
        sess_finish(st, s, NULL, msg);
        return;
    }
    kvd_log(KVD_LOG_WARN, "session %016" PRIx64 " fails: %s", s->id, msg);
    /* Forward round the ring to rank 0, or, when the way forward is down, back the way the
     * session came: either way rank 0 hears of it and tells its client. */
    if (out_up(st))
        send_error(st->out, s->id, 1, msg);
    else if (st->in && st->in->up)
        send_error(st->in, s->id, 1, msg);
    sess_drop(st, s);
}

static void fail_all_sessions(struct stage *st, const char *msg)
{
    while (st->sessions)
        sess_fail(st, st->sessions, msg);
}

static void submit_step(struct stage *st, struct sess *s, const int32_t *tokens, uint32_t n,
                        uint32_t pos, uint8_t flags)
{
    struct kvd_job *j = calloc(1, sizeof *j);
    int32_t *t = malloc(n * sizeof *t);
    if (!j || !t) {
        free(j);
        free(t);
        sess_fail(st, s, "out of memory");
        return;
    }
    memcpy(t, tokens, n * sizeof *t);
    j->kind = KVD_JOB_STEP;
    j->session = s->id;
    j->pos = pos;
    j->n = n;
    j->flags = flags;
    j->tokens = t;
    j->n_tokens = n;
    kvd_compute_submit(st->comp, j);
}

/* ============================ rank 0: clients ============================ */

static void client_on_closed(uv_handle_t *h)
{
    struct client *c = h->data;
    free(c->buf);
    free(c);
}

static void client_on_shutdown(uv_shutdown_t *req, int status)
{
    (void)status;
    struct client *c = req->data;
    free(req);
    uv_close((uv_handle_t *)&c->pipe, client_on_closed);
}

static void client_close(struct client *c)
{
    if (c->closing)
        return;
    c->closing = true;
    struct stage *st = c->st;
    struct client **pp = &st->clients;
    while (*pp && *pp != c)
        pp = &(*pp)->next;
    if (*pp)
        *pp = c->next;
    if (c->sess) {   /* the client went away mid-session: end it round the ring */
        struct sess *s = c->sess;
        c->sess = NULL;
        s->client = NULL;
        sess_finish(st, s, "client gone", NULL);
    }
    uv_read_stop((uv_stream_t *)&c->pipe);
    uv_shutdown_t *sd = malloc(sizeof *sd);
    if (sd) {
        sd->data = c;
        if (uv_shutdown(sd, (uv_stream_t *)&c->pipe, client_on_shutdown) == 0)
            return;
        free(sd);
    }
    uv_close((uv_handle_t *)&c->pipe, client_on_closed);
}

struct wreq {
    uv_write_t req;
    uv_buf_t buf;
};

static void client_on_written(uv_write_t *req, int status)
{
    (void)status;
    struct wreq *w = (struct wreq *)req;
    free(w->buf.base);
    free(w);
}

static void client_send(struct client *c, const char *line)
{
    if (c->closing)
        return;
    size_t n = strlen(line);
    struct wreq *w = malloc(sizeof *w);
    char *b = malloc(n + 1);
    if (!w || !b) {
        free(w);
        free(b);
        return;
    }
    memcpy(b, line, n);
    b[n] = '\n';
    w->buf = uv_buf_init(b, (unsigned)(n + 1));
    if (uv_write(&w->req, (uv_stream_t *)&c->pipe, &w->buf, 1, client_on_written) < 0) {
        free(b);
        free(w);
    }
}

static cJSON *status_json(struct stage *st);

static double jnum(const cJSON *o, const char *k, double def)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : def;
}

static void stage_shutdown(struct stage *st, const char *why);

static void handle_generate(struct stage *st, struct client *c, const cJSON *req)
{
    char msg[300];
    if (st->rank != 0) {
        client_error(c, "this stage is not rank 0: send generation requests to rank 0");
        return;
    }
    if (!out_up(st) || !(st->in && st->in->up)) {
        snprintf(msg, sizeof msg, "ring not linked: out link to rank %u is %s, in link from rank %u is %s",
                 st->succ, out_up(st) ? "up" : "down", st->pred, st->in && st->in->up ? "up" : "down");
        client_error(c, msg);
        return;
    }
    if (st->n_sessions >= st->m.max_sessions) {
        snprintf(msg, sizeof msg, "too many sessions (%u, limit %u)", st->n_sessions, st->m.max_sessions);
        client_error(c, msg);
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
            client_error(c, msg);
            return;
        }
        toks = malloc((size_t)n * sizeof *toks);
        if (!toks)
            return;
        for (int i = 0; i < n; i++) {
            const cJSON *v = cJSON_GetArrayItem(jt, i);
            if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= st->be.n_vocab) {
                snprintf(msg, sizeof msg, "tokens[%d] is not a token id in [0, %u)", i, st->be.n_vocab);
                client_error(c, msg);
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
            client_error(c, msg);
            return;
        }
    } else {
        client_error(c, "generate needs tokens (array) or prompt (string)");
        return;
    }
    uint64_t id = 0;
    while (id == 0 || sess_find(st, id) || recently_closed(st, id))
        RAND_bytes((unsigned char *)&id, sizeof id);
    double n_gen = jnum(req, "n", 32);
    uint32_t max_gen = n_gen < 0 ? 0 : n_gen > st->m.n_ctx ? st->m.n_ctx : (uint32_t)n_gen;
    struct sess *s = sess_new(st, id, st->m.n_ctx);
    if (!s) {
        free(toks);
        return;
    }
    s->client = c;
    c->sess = s;
    s->hist = malloc((size_t)st->m.n_ctx * sizeof *s->hist);
    if (!s->hist) {
        free(toks);
        sess_finish(st, s, NULL, "out of memory");
        return;
    }
    memcpy(s->hist, toks, n_toks * sizeof *toks);
    s->n_hist = s->n_prompt = n_toks;
    s->max_gen = max_gen;
    const cJSON *ie = cJSON_GetObjectItemCaseSensitive(req, "ignore_eos");
    s->ignore_eos = cJSON_IsTrue(ie);
    s->want_logits = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(req, "logits"));
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(req, "stop");
    if (cJSON_IsArray(js) && cJSON_GetArraySize(js) > 0 && cJSON_GetArraySize(js) <= 16) {
        s->stop = calloc((size_t)cJSON_GetArraySize(js), sizeof *s->stop);
        for (int i = 0; s->stop && i < cJSON_GetArraySize(js); i++) {
            const cJSON *v = cJSON_GetArrayItem(js, i);
            if (cJSON_IsString(v) && v->valuestring[0] && strlen(v->valuestring) < 256)
                s->stop[s->n_stop++] = strdup(v->valuestring);
        }
    }
    s->t_start = (double)now_ns() / 1e6;
    if (st->be.vocab && model_detok_new(&s->detok, st->be.vocab, false, false) < 0)
        s->detok = NULL;
    struct net_open_params p = {0};
    p.seed = (uint64_t)jnum(req, "seed", 0);
    p.temperature = (float)jnum(req, "temp", 0);
    p.top_k = (int32_t)jnum(req, "top_k", 0);
    p.top_p = (float)jnum(req, "top_p", 1);
    p.min_p = (float)jnum(req, "min_p", 0);
    p.repeat_penalty = (float)jnum(req, "repeat_penalty", 1);
    p.freq_penalty = (float)jnum(req, "freq_penalty", 0);
    p.presence_penalty = (float)jnum(req, "presence_penalty", 0);
    p.penalty_last_n = (int32_t)jnum(req, "repeat_last_n", 64);
    p.max_tokens = max_gen;
    p.n_ctx = st->m.n_ctx;
    uint8_t flags = s->want_logits ? NET_FL_LOGITS : 0;
    kvd_log(KVD_LOG_INFO, "session %016" PRIx64 " opens: %u prompt tokens, up to %u new, temp %.2f seed %" PRIu64,
            id, n_toks, max_gen, p.temperature, p.seed);
    /* Here: create the session's KV (and the sampler when this rank is also the last). */
    struct kvd_job *j = calloc(1, sizeof *j);
    if (!j) {
        free(toks);
        sess_finish(st, s, NULL, "out of memory");
        return;
    }
    j->kind = KVD_JOB_OPEN;
    j->session = id;
    j->open = p;
    j->flags = flags;
    j->tokens = toks;
    j->n_tokens = n_toks;
    kvd_compute_submit(st->comp, j);
    if (!st->is_last) {
        size_t plen = NET_OPEN_LEN + (size_t)n_toks * 4;
        uint8_t *pl = malloc(plen);
        if (!pl) {
            sess_finish(st, s, NULL, "out of memory");
            return;
        }
        net_open_encode(&p, pl);
        for (uint32_t i = 0; i < n_toks; i++)
            wr32(pl + NET_OPEN_LEN + 4 * i, (uint32_t)s->hist[i]);
        send_frame(st->out, NET_F_OPEN, flags, id, 0, n_toks, pl, plen);
        free(pl);
    }
    if (max_gen == 0) {
        sess_finish(st, s, "length", NULL);
        return;
    }
    /* Chunked prefill: stages overlap on a long prompt. */
    for (uint32_t pos = 0; pos < n_toks; pos += st->chunk) {
        uint32_t n = n_toks - pos < st->chunk ? n_toks - pos : st->chunk;
        submit_step(st, s, s->hist + pos, n, pos, pos + n == n_toks ? NET_FL_LAST : 0);
    }
}

static void handle_request(struct client *c, const char *line)
{
    struct stage *st = c->st;
    cJSON *req = cJSON_Parse(line);
    const cJSON *op = req ? cJSON_GetObjectItemCaseSensitive(req, "op") : NULL;
    if (!cJSON_IsString(op)) {
        client_error(c, "request must be a JSON object with an op");
        client_close(c);
    } else if (!strcmp(op->valuestring, "status")) {
        json_line_to_client(c, status_json(st));
        client_close(c);
    } else if (!strcmp(op->valuestring, "shutdown")) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddBoolToObject(o, "ok", 1);
        json_line_to_client(c, o);
        client_close(c);
        stage_shutdown(st, "shutdown requested over the control socket");
    } else if (!strcmp(op->valuestring, "generate")) {
        handle_generate(st, c, req);
        if (!c->sess)
            client_close(c);
    } else {
        client_error(c, "unknown op (generate, status, shutdown)");
        client_close(c);
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
        client_close(c);
        return;
    }
    if (n > 0 && !c->got_request && !c->closing) {
        if (c->len + (size_t)n > CTL_LINE_MAX) {
            client_error(c, "request line too long");
            client_close(c);
        } else {
            char *nb = realloc(c->buf, c->len + (size_t)n + 1);
            if (nb) {
                c->buf = nb;
                memcpy(c->buf + c->len, buf->base, (size_t)n);
                c->len += (size_t)n;
                c->buf[c->len] = 0;
                char *nl = strchr(c->buf, '\n');
                if (nl) {
                    *nl = 0;
                    c->got_request = true;
                    handle_request(c, c->buf);
                }
            }
        }
    }
    free(buf->base);
}

static void ctl_on_conn(uv_stream_t *server, int status)
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
        uv_close((uv_handle_t *)&c->pipe, client_on_closed);
        return;
    }
    c->next = st->clients;
    st->clients = c;
    uv_read_start((uv_stream_t *)&c->pipe, client_alloc, client_on_read);
}

/* ============================== rank 0: tokens ============================== */

static void on_token(struct stage *st, struct sess *s, const struct net_frame_hdr *h,
                     const uint8_t *payload)
{
    int32_t tok = (int32_t)rd32(payload);
    float lp;
    memcpy(&lp, payload + 4, 4);
    if (s->n_gen == 0)
        s->t_first = (double)now_ns() / 1e6;
    s->hist[s->n_hist++] = tok;
    s->n_gen++;
    if ((h->flags & NET_FL_LOGITS) && s->want_logits) {
        if (!s->last_logits)
            s->last_logits = malloc((size_t)st->be.n_vocab * 4);
        if (s->last_logits)
            memcpy(s->last_logits, payload + 8, (size_t)st->be.n_vocab * 4);
    }
    /* End of generation as one process decides it: EOS, EOT and the like (the vocabulary's
     * list), or the file's EOS id without a vocabulary. */
    bool is_eos = !s->ignore_eos && (st->be.vocab ? model_vocab_is_eog(st->be.vocab, tok)
                                                   : st->be.eos >= 0 && tok == st->be.eos);
    const char *piece = NULL;
    size_t plen = 0;
    if (s->detok && !is_eos && model_detok_push(s->detok, tok, &piece, &plen) < 0)
        piece = NULL;
    if (s->client && !is_eos) {   /* EOS ends the text; it is not part of it */
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "t", tok);
        cJSON_AddNumberToObject(o, "lp", lp);
        if (s->detok) {
            char *tmp = malloc(plen + 1);
            if (tmp) {
                memcpy(tmp, piece ? piece : "", plen);
                tmp[plen] = 0;
                cJSON_AddStringToObject(o, "s", tmp);
                free(tmp);
            }
        }
        json_line_to_client(s->client, o);
    }
    const char *reason = NULL;
    if (is_eos)
        reason = "eos";
    else if (s->n_gen >= s->max_gen)
        reason = "length";
    else if (s->n_hist >= s->n_ctx)
        reason = "context";
    if (!reason && piece && plen && s->n_stop) {
        char *nt = realloc(s->text, s->text_len + plen + 1);
        if (nt) {
            size_t old = s->text_len;
            s->text = nt;
            memcpy(s->text + s->text_len, piece, plen);
            s->text_len += plen;
            s->text[s->text_len] = 0;
            /* Earlier tokens found no stop string, so a match now ends in this piece: search
             * only the tail it can start in, not the whole text on every token. */
            for (uint32_t i = 0; i < s->n_stop && !reason; i++) {
                size_t sl = strlen(s->stop[i]);
                if (strstr(s->text + (old >= sl ? old - sl + 1 : 0), s->stop[i]))
                    reason = "stop";
            }
        }
    }
    if (reason) {
        sess_finish(st, s, reason, NULL);
        return;
    }
    submit_step(st, s, &tok, 1, s->n_hist - 1, NET_FL_LAST);
}

/* ============================== compute results ============================== */

static void on_job_done(struct kvd_job *j, void *ud)
{
    struct stage *st = ud;
    struct sess *s = sess_find(st, j->session);
    if (j->kind == KVD_JOB_CLOSE || !s || st->shutting_down) {
        kvd_job_free(j);
        return;
    }
    s->last_active_ms = now_ms();
    if (j->rc < 0) {
        char msg[300];
        snprintf(msg, sizeof msg, "rank %u: %s", st->rank, j->err);
        sess_fail(st, s, msg);
        kvd_job_free(j);
        return;
    }
    if (j->kind == KVD_JOB_STEP) {
        st->steps++;
        st->rows += j->n;
        st->compute_ms += j->ms;
        if (j->n == 1) {
            st->dec_steps++;
            st->dec_ms += j->ms;
        }
        if (j->out_type) {
            uint32_t pos = j->out_type == NET_F_TOKEN ? j->pos + j->n : j->pos;
            uint32_t n = j->out_type == NET_F_TOKEN ? 1 : j->n;
            int rc = send_frame(st->out, (uint8_t)j->out_type, j->out_flags, j->session, pos, n,
                                j->out, j->out_len);
            if (rc < 0) {
                char msg[300];
                snprintf(msg, sizeof msg, "ring not linked: link rank %u -> rank %u is down", st->rank, st->succ);
                sess_fail(st, s, msg);
            } else {
                st->frame_bytes_out += NET_HDR_LEN + j->out_len;
                if (j->out_type == NET_F_ACT)
                    st->act_frames_out++;
                else
                    st->tok_frames_out++;
            }
        }
    }
    kvd_job_free(j);
}

/* ============================== link frames ============================== */

static void conn_close(struct conn *c, const char *reason)
{
    if (c->link)
        net_link_close(c->link, reason);
}

/* Close the link for a protocol violation: log, tell the peer, close. */
static void violation(struct conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void violation(struct conn *c, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kvd_log(KVD_LOG_WARN, "link %s (%s): closing: %s", c->role == CONN_OUT ? "out" : "in",
            net_link_peer(c->link), msg);
    send_error(c, 0, 2, msg);
    conn_close(c, msg);
}

/* Close the link for a violation and leave the calling handler. */
#define VIOLATION(c, ...) do { violation(c, __VA_ARGS__); return; } while (0)

static void stage_dial_out(struct stage *st);

static void send_ping(struct conn *c)
{
    uint8_t b[8];
    c->ping_sent_ns = now_ns();
    wr32(b, (uint32_t)c->ping_sent_ns);
    wr32(b + 4, (uint32_t)(c->ping_sent_ns >> 32));
    send_frame(c, NET_F_PING, 0, 0, 0, 0, b, 8);
}

static void on_established(struct conn *c)
{
    struct stage *st = c->st;
    const struct net_hello *p = net_handshake_peer(c->hs);
    c->peer_rank = p->rank;
    net_handshake_free(c->hs);
    c->hs = NULL;
    if (c->role == CONN_PENDING) {
        struct conn **pp = &st->pending;
        while (*pp && *pp != c)
            pp = &(*pp)->next;
        if (*pp)
            *pp = c->next;
        c->next = NULL;
        if (st->in) {
            char msg[300];
            snprintf(msg, sizeof msg, "rank %u already has a predecessor link (from %s); refusing a second one",
                     st->rank, net_link_peer(st->in->link));
            c->role = CONN_IN;   /* for the log line only; it never becomes st->in */
            c->up = true;
            violation(c, "%s", msg);
            c->up = false;
            return;
        }
        c->role = CONN_IN;
        st->in = c;
        if (c->relay_in)
            st->redial_in_ms = 0;
    } else {
        st->redial_ms = 0;
    }
    c->up = true;
    c->last_rx_ms = now_ms();
    net_link_set_max_payload(c->link, st->max_payload);   /* boundary frames from now on */
    kvd_log(KVD_LOG_INFO, "link %s up: rank %u at %s", c->role == CONN_OUT ? "out" : "in",
            c->peer_rank, net_link_peer(c->link));
    if (c->role == CONN_OUT)
        send_ping(c);   /* a first RTT right away */
}

static void on_frame_up(struct conn *c, const struct net_frame_hdr *h, const uint8_t *payload)
{
    struct stage *st = c->st;
    const char *tn = net_frame_type_name(h->type);
    switch (h->type) {
    case NET_F_PING:
        if (h->payload_len != 8)
            VIOLATION(c, "PING payload_len %u is not 8", h->payload_len);
        send_frame(c, NET_F_PONG, 0, 0, 0, 0, payload, 8);
        return;
    case NET_F_PONG:
        if (h->payload_len != 8)
            VIOLATION(c, "PONG payload_len %u is not 8", h->payload_len);
        if (c->role == CONN_OUT) {
            uint64_t sent = (uint64_t)rd32(payload) | (uint64_t)rd32(payload + 4) << 32;
            if (sent == c->ping_sent_ns)
                c->rtt_ms = (double)(now_ns() - sent) / 1e6;
        }
        return;
    case NET_F_HELLO:
    case NET_F_AUTH:
        VIOLATION(c, "%s after the handshake", tn);
    case NET_F_ERROR:
        if (h->payload_len < 4 || h->payload_len > 4 + NET_ERR_MAX)
            VIOLATION(c, "ERROR payload_len %u not in [4, %u]", h->payload_len, 4 + NET_ERR_MAX);
        break;
    default:
        break;
    }
    char emsg[NET_ERR_MAX + 1] = "";
    if (h->type == NET_F_ERROR) {
        size_t n = h->payload_len - 4;
        for (size_t i = 0; i < n; i++)
            emsg[i] = payload[4 + i] >= 0x20 && payload[4 + i] != 0x7f ? (char)payload[4 + i] : '?';
        emsg[n] = 0;
        if (h->session == 0) {   /* about the link itself */
            kvd_log(KVD_LOG_WARN, "link %s (%s): peer reports: %s", c->role == CONN_OUT ? "out" : "in",
                    net_link_peer(c->link), emsg);
            char r[NET_ERR_MAX + 40];
            snprintf(r, sizeof r, "peer reported: %s", emsg);
            conn_close(c, r);
            return;
        }
    }
    if (c->role == CONN_OUT) {
        if (h->type != NET_F_ERROR)
            VIOLATION(c, "%s frame from the successor (only PING/PONG/ERROR travel back)", tn);
        /* A session's ERROR coming back: pass it on towards rank 0. */
        struct sess *bs = sess_find(st, h->session);
        if (!bs)
            return;
        if (st->rank == 0) {
            sess_finish(st, bs, NULL, emsg);
        } else {
            kvd_log(KVD_LOG_WARN, "session %016" PRIx64 " fails downstream: %s", bs->id, emsg);
            if (st->in && st->in->up)
                send_frame(st->in, NET_F_ERROR, 0, h->session, 0, 0, payload, h->payload_len);
            sess_drop(st, bs);
        }
        return;
    }
    /* In link: the session frames of the ring. */
    struct sess *s = sess_find(st, h->session);
    bool stale = !s && recently_closed(st, h->session);
    switch (h->type) {
    case NET_F_OPEN: {
        if (st->rank == 0)
            VIOLATION(c, "OPEN arrived at rank 0 (rank 0 opens sessions)");
        if (s || stale)
            VIOLATION(c, "OPEN for session %016" PRIx64 " which %s", h->session,
                             s ? "is already open" : "was just closed");
        if (h->session == 0)
            VIOLATION(c, "OPEN for session 0");
        if (h->n_tokens < 1 || h->n_tokens >= st->m.n_ctx)
            VIOLATION(c, "OPEN n_tokens %u not in [1, %u)", h->n_tokens, st->m.n_ctx);
        if (h->payload_len != NET_OPEN_LEN + (uint64_t)h->n_tokens * 4)
            VIOLATION(c, "OPEN payload_len %u, expected %u + 4 x n_tokens %u", h->payload_len,
                             NET_OPEN_LEN, h->n_tokens);
        if (h->pos != 0)
            VIOLATION(c, "OPEN pos %u is not 0", h->pos);
        struct net_open_params p;
        net_open_decode(payload, &p);
        if (p.n_ctx > st->m.n_ctx || p.n_ctx <= h->n_tokens)
            VIOLATION(c, "OPEN n_ctx %u not in (%u, %u]", p.n_ctx, h->n_tokens, st->m.n_ctx);
        for (uint32_t i = 0; i < h->n_tokens; i++)
            if (rd32(payload + NET_OPEN_LEN + 4 * i) >= st->be.n_vocab)
                VIOLATION(c, "OPEN prompt token %u = %u not below n_vocab %u", i,
                                 rd32(payload + NET_OPEN_LEN + 4 * i), st->be.n_vocab);
        if (st->n_sessions >= st->m.max_sessions) {
            char msg[200];
            snprintf(msg, sizeof msg, "rank %u: too many sessions (limit %u)", st->rank, st->m.max_sessions);
            if (out_up(st))
                send_error(st->out, h->session, 3, msg);
            return;
        }
        s = sess_new(st, h->session, p.n_ctx);
        struct kvd_job *j = calloc(1, sizeof *j);
        int32_t *toks = st->is_last ? malloc((size_t)h->n_tokens * 4) : NULL;
        if (!s || !j || (st->is_last && !toks)) {
            free(j);
            free(toks);
            if (s)
                sess_fail(st, s, "out of memory");
            return;
        }
        j->kind = KVD_JOB_OPEN;
        j->session = h->session;
        j->open = p;
        j->flags = h->flags & NET_FL_LOGITS;
        if (toks) {
            for (uint32_t i = 0; i < h->n_tokens; i++)
                toks[i] = (int32_t)rd32(payload + NET_OPEN_LEN + 4 * i);
            j->tokens = toks;
            j->n_tokens = h->n_tokens;
        }
        kvd_compute_submit(st->comp, j);
        if (!st->is_last &&
            send_frame(st->out, NET_F_OPEN, h->flags, h->session, 0, h->n_tokens, payload, h->payload_len) < 0) {
            char msg[200];
            snprintf(msg, sizeof msg, "ring not linked: link rank %u -> rank %u is down", st->rank, st->succ);
            sess_fail(st, s, msg);
        }
        return;
    }
    case NET_F_ACT: {
        if (st->rank == 0)
            VIOLATION(c, "ACT arrived at rank 0 from rank %u (the last rank sends TOKEN)", c->peer_rank);
        if (!s) {
            if (stale)
                return;   /* in flight when the session ended */
            VIOLATION(c, "ACT for unknown session %016" PRIx64, h->session);
        }
        if (h->n_tokens < 1 || h->n_tokens > st->m.max_batch)
            VIOLATION(c, "ACT n_tokens %u not in [1, %u]", h->n_tokens, st->m.max_batch);
        uint64_t want = (uint64_t)h->n_tokens * st->m.n_embd * st->m.wire_dsize;
        if (h->payload_len != want)
            VIOLATION(c, "ACT payload_len %u, expected n_tokens %u x n_embd %u x %u bytes = %" PRIu64,
                             h->payload_len, h->n_tokens, st->m.n_embd, st->m.wire_dsize, want);
        if (h->pos != s->next_pos || (uint64_t)h->pos + h->n_tokens > s->n_ctx)
            VIOLATION(c, "ACT pos %u (+%u) for session %016" PRIx64 ": expected pos %u, context %u",
                             h->pos, h->n_tokens, h->session, s->next_pos, s->n_ctx);
        struct kvd_job *j = calloc(1, sizeof *j);
        uint8_t *in = malloc(h->payload_len);
        if (!j || !in) {
            free(j);
            free(in);
            sess_fail(st, s, "out of memory");
            return;
        }
        memcpy(in, payload, h->payload_len);
        j->kind = KVD_JOB_STEP;
        j->session = h->session;
        j->pos = h->pos;
        j->n = h->n_tokens;
        j->flags = h->flags & NET_FL_LAST;
        j->in = in;
        j->in_len = h->payload_len;
        s->next_pos += h->n_tokens;
        s->last_active_ms = now_ms();
        kvd_compute_submit(st->comp, j);
        return;
    }
    case NET_F_TOKEN: {
        if (st->rank != 0)
            VIOLATION(c, "TOKEN from rank %u, which is not the last rank (%u)", c->peer_rank,
                             st->n - 1);
        if (!s) {
            if (stale)
                return;
            VIOLATION(c, "TOKEN for unknown session %016" PRIx64, h->session);
        }
        size_t want = 8 + ((h->flags & NET_FL_LOGITS) ? (size_t)st->be.n_vocab * 4 : 0);
        if (h->n_tokens != 1 || h->payload_len != want)
            VIOLATION(c, "TOKEN n_tokens %u payload_len %u, expected 1 and %zu", h->n_tokens,
                             h->payload_len, want);
        if (h->pos != s->n_hist)
            VIOLATION(c, "TOKEN pos %u for session %016" PRIx64 ", expected %u", h->pos,
                             h->session, s->n_hist);
        uint32_t tok = rd32(payload);
        if (tok >= st->be.n_vocab)
            VIOLATION(c, "TOKEN id %u not below n_vocab %u", tok, st->be.n_vocab);
        if (s->n_hist >= s->n_ctx)
            VIOLATION(c, "TOKEN past the session's context %u", s->n_ctx);
        s->last_active_ms = now_ms();
        on_token(st, s, h, payload);
        return;
    }
    case NET_F_CLOSE:
        if (h->payload_len != 0)
            VIOLATION(c, "CLOSE payload_len %u is not 0", h->payload_len);
        if (st->rank == 0)
            return;   /* never sent to rank 0; harmless */
        if (s)
            sess_drop(st, s);
        if (!st->is_last)
            send_frame(st->out, NET_F_CLOSE, 0, h->session, 0, 0, NULL, 0);
        return;
    case NET_F_ERROR:
        if (!s)
            return;
        if (st->rank == 0) {
            sess_finish(st, s, NULL, emsg);
        } else {
            kvd_log(KVD_LOG_WARN, "session %016" PRIx64 " fails upstream: %s", s->id, emsg);
            send_frame(st->out, NET_F_ERROR, 0, h->session, 0, 0, payload, h->payload_len);
            sess_drop(st, s);
        }
        return;
    default:
        VIOLATION(c, "unexpected %s frame", tn);
    }
}

static void on_frame(struct net_link *l, const struct net_frame_hdr *h, const uint8_t *payload)
{
    struct conn *c = net_link_ud(l);
    c->last_rx_ms = now_ms();
    if (c->up) {
        on_frame_up(c, h, payload);
        return;
    }
    if (!c->hs)
        return;
    const uint8_t *out;
    size_t outlen;
    char err[300];
    int rc = net_handshake_feed(c->hs, h, payload, &out, &outlen, err, sizeof err);
    if (rc < 0) {
        kvd_log(KVD_LOG_WARN, "link %s (%s): handshake failed: %s", c->role == CONN_OUT ? "out" : "in",
                net_link_peer(l), err);
        if (rc != -ECONNREFUSED)
            send_error(c, 0, 2, err);
        conn_close(c, err);
        return;
    }
    if (outlen)
        net_link_send_raw(l, out, outlen);
    if (rc == 1)
        on_established(c);
}

static void start_handshake(struct conn *c, uint32_t expect_rank)
{
    struct stage *st = c->st;
    struct net_hello mine = {.version = NET_VERSION, .rank = st->rank, .n_ranks = st->n};
    snprintf(mine.ring, sizeof mine.ring, "%s", st->m.ring);
    memcpy(mine.manifest_hash, st->m.hash, 32);
    struct net_hs_expect x = {.rank = expect_rank, .n_ranks = st->n, .ring = st->m.ring};
    memcpy(x.manifest_hash, st->m.hash, 32);
    if (st->m.ranks[expect_rank].has_node) {
        x.check_key = true;
        memcpy(x.node_key, st->m.ranks[expect_rank].node, 32);
    }
    if (net_handshake_new(&c->hs, st->id, &mine, &x) < 0) {
        conn_close(c, "handshake set-up failed");
        return;
    }
    const uint8_t *b;
    size_t n;
    net_handshake_hello(c->hs, &b, &n);
    net_link_send_raw(c->link, b, n);
}

static void on_open(struct net_link *l, int status)
{
    struct conn *c = net_link_ud(l);
    if (status == 0)
        start_handshake(c, c->role == CONN_OUT ? c->st->succ : c->st->pred);
}

static void stage_dial_in(struct stage *st);

static void redial_in_cb(uv_timer_t *t)
{
    struct stage *st = t->data;
    if (!st->shutting_down && !st->in)
        stage_dial_in(st);
}

static void redial_cb(uv_timer_t *t)
{
    struct stage *st = t->data;
    if (!st->shutting_down && !st->out)
        stage_dial_out(st);
}

static void on_close(struct net_link *l, const char *reason)
{
    struct conn *c = net_link_ud(l);
    struct stage *st = c->st;
    if (c->up || c == st->in || c == st->out) {
        char msg[400];
        const char *peer = net_link_peer(l);
        if (c->role == CONN_OUT)
            snprintf(msg, sizeof msg, "ring link rank %u -> rank %u (%s) broke: %s", st->rank, st->succ,
                     peer, reason);
        else
            snprintf(msg, sizeof msg, "ring link rank %u -> rank %u (from %s) broke: %s", st->pred,
                     st->rank, peer, reason);
        if (c->up)
            kvd_log(st->shutting_down ? KVD_LOG_INFO : KVD_LOG_WARN, "%s", msg);
        if (c == st->in)
            st->in = NULL;
        if (c == st->out)
            st->out = NULL;
        if (c->up && !st->shutting_down)
            fail_all_sessions(st, msg);
    } else if (c->role == CONN_PENDING) {
        struct conn **pp = &st->pending;
        while (*pp && *pp != c)
            pp = &(*pp)->next;
        if (*pp)
            *pp = c->next;
        kvd_log(KVD_LOG_WARN, "link from %s closed during the handshake: %s", net_link_peer(l), reason);
    }
    if (c->relay_in && !st->shutting_down) {
        st->redial_in_ms = st->redial_in_ms ? (st->redial_in_ms * 2 > 2000 ? 2000 : st->redial_in_ms * 2) : 100;
        uv_timer_start(&st->redial_in, redial_in_cb, st->redial_in_ms, 0);
    }
    if (c->role == CONN_OUT && !st->shutting_down) {
        if (!c->up)
            kvd_log(KVD_LOG_DEBUG, "dial rank %u failed: %s", st->succ, reason);
        st->redial_ms = st->redial_ms ? (st->redial_ms * 2 > 2000 ? 2000 : st->redial_ms * 2) : 100;
        uv_timer_start(&st->redial, redial_cb, st->redial_ms, 0);
    }
    net_handshake_free(c->hs);
    free(c);
}

static const struct net_link_cbs link_cbs = {.on_open = on_open, .on_frame = on_frame, .on_close = on_close};

static void stage_dial_out(struct stage *st)
{
    struct conn *c = calloc(1, sizeof *c);
    if (!c)
        return;
    c->st = st;
    c->role = CONN_OUT;
    char err[KV_ERR_MAX];
    int rc = net_link_dial(&c->link, st->loop, st->m.ranks[st->succ].endpoint, &link_cbs, c,
                           HS_MAX_PAYLOAD, err, sizeof err);
    if (rc < 0) {
        kvd_log(KVD_LOG_ERROR, "cannot dial %s: %s", st->m.ranks[st->succ].endpoint, err);
        free(c);
        st->redial_ms = 2000;
        uv_timer_start(&st->redial, redial_cb, st->redial_ms, 0);
        return;
    }
    st->out = c;
}

/* A stage whose own endpoint is relay:// accepts nothing: it dials the relay as the
 * downstream end of its in-edge and treats that link like an accepted one. */
static void stage_dial_in(struct stage *st)
{
    const char *ep = st->m.ranks[st->rank].endpoint;
    char down[sizeof st->m.ranks[0].endpoint + 16];
    snprintf(down, sizeof down, "%s?role=down", ep);
    struct conn *c = calloc(1, sizeof *c);
    if (!c)
        return;
    c->st = st;
    c->role = CONN_PENDING;
    c->relay_in = true;
    c->last_rx_ms = now_ms();
    char err[KV_ERR_MAX];
    int rc = net_link_dial(&c->link, st->loop, down, &link_cbs, c, HS_MAX_PAYLOAD, err, sizeof err);
    if (rc < 0) {
        kvd_log(KVD_LOG_ERROR, "cannot dial the relay at %s: %s", ep, err);
        free(c);
        st->redial_in_ms = 2000;
        uv_timer_start(&st->redial_in, redial_in_cb, st->redial_in_ms, 0);
        return;
    }
    c->next = st->pending;
    st->pending = c;
}

static void on_accept(struct net_listener *ls, struct net_link *l, void *ud)
{
    struct stage *st = ud;
    uint32_t n = 0;
    for (struct conn *p = st->pending; p; p = p->next)
        n++;
    if (st->shutting_down || n >= MAX_PENDING_LINKS) {
        net_link_set_ud(l, NULL);
        struct conn *c = calloc(1, sizeof *c);
        if (!c) {
            net_link_close(l, "out of memory");   /* on_close needs a conn: see below */
            return;
        }
        c->st = st;
        c->role = CONN_PENDING;
        c->link = l;
        net_link_set_ud(l, c);
        c->next = st->pending;
        st->pending = c;
        kvd_log(KVD_LOG_WARN, "refusing link from %s: %s", net_link_peer(l),
                st->shutting_down ? "shutting down" : "too many links in handshake");
        net_link_close(l, "refused");
        return;
    }
    struct conn *c = calloc(1, sizeof *c);
    if (!c) {
        net_link_close(l, "out of memory");
        return;
    }
    c->st = st;
    c->role = CONN_PENDING;
    c->link = l;
    c->last_rx_ms = now_ms();
    net_link_set_ud(l, c);
    c->next = st->pending;
    st->pending = c;
    kvd_log(KVD_LOG_DEBUG, "link from %s: handshake", net_link_peer(l));
    start_handshake(c, st->pred);
}

/* ================================ periodic ================================ */

static void tick_cb(uv_timer_t *t)
{
    struct stage *st = t->data;
    uint64_t now = now_ms();
    if (out_up(st))
        send_ping(st->out);
    struct conn *links[2] = {st->in, st->out};
    for (int i = 0; i < 2; i++)
        if (links[i] && links[i]->up && now - links[i]->last_rx_ms > LINK_SILENCE_MS)
            conn_close(links[i], "nothing received for 15 s");
    for (struct conn *p = st->pending; p; p = p->next)
        if (now - p->last_rx_ms > 10000)
            conn_close(p, "handshake took more than 10 s");
    uint64_t idle = (uint64_t)st->o.idle_timeout_s * 1000;
    for (struct sess *s = st->sessions, *next; s; s = next) {
        next = s->next;
        if (now - s->last_active_ms > idle) {
            char msg[200];
            snprintf(msg, sizeof msg, "session idle for more than %u s on rank %u", st->o.idle_timeout_s, st->rank);
            if (st->rank == 0)
                sess_finish(st, s, NULL, msg);
            else {
                kvd_log(KVD_LOG_WARN, "session %016" PRIx64 ": %s", s->id, msg);
                sess_drop(st, s);
            }
        }
    }
}

/* ================================ status ================================ */

static cJSON *link_json(struct stage *st, struct conn *c, bool out)
{
    cJSON *o = cJSON_CreateObject();
    uint32_t peer = out ? st->succ : st->pred;
    cJSON_AddNumberToObject(o, "peer_rank", peer);
    cJSON_AddStringToObject(o, "endpoint", out ? st->m.ranks[peer].endpoint : "");
    cJSON_AddStringToObject(o, "state", !c ? "down" : c->up ? "up" : "handshake");
    if (c && c->link) {
        cJSON_AddStringToObject(o, "peer", net_link_peer(c->link));
        cJSON_AddNumberToObject(o, "bytes_in", (double)net_link_bytes_in(c->link));
        cJSON_AddNumberToObject(o, "bytes_out", (double)net_link_bytes_out(c->link));
    }
    if (out && c)
        cJSON_AddNumberToObject(o, "rtt_ms", c->rtt_ms);
    return o;
}

static cJSON *status_json(struct stage *st)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "ring", st->m.ring);
    cJSON_AddNumberToObject(o, "rank", st->rank);
    cJSON_AddNumberToObject(o, "n_ranks", st->n);
    cJSON *w = cJSON_AddArrayToObject(o, "window");
    cJSON_AddItemToArray(w, cJSON_CreateNumber(st->m.ranks[st->rank].first));
    cJSON_AddItemToArray(w, cJSON_CreateNumber(st->m.ranks[st->rank].last));
    cJSON_AddStringToObject(o, "arch", st->be.arch);
    cJSON_AddStringToObject(o, "dtype", st->m.dtype);
    cJSON_AddNumberToObject(o, "pid", getpid());
    cJSON_AddNumberToObject(o, "weight_bytes", (double)st->be.weight_bytes);
    cJSON_AddItemToObject(o, "in", link_json(st, st->in, false));
    cJSON_AddItemToObject(o, "out", link_json(st, st->out, true));
    uint32_t pend = 0;
    for (struct conn *p = st->pending; p; p = p->next)
        pend++;
    cJSON_AddNumberToObject(o, "pending_links", pend);
    cJSON_AddBoolToObject(o, "linked", out_up(st) && st->in && st->in->up);
    cJSON_AddNumberToObject(o, "sessions", st->n_sessions);
    cJSON_AddNumberToObject(o, "steps", (double)st->steps);
    cJSON_AddNumberToObject(o, "rows", (double)st->rows);
    cJSON_AddNumberToObject(o, "ms_per_token", st->dec_steps ? st->dec_ms / (double)st->dec_steps : 0);
    cJSON_AddNumberToObject(o, "compute_ms", st->compute_ms);
    uint64_t frames = st->act_frames_out + st->tok_frames_out;
    cJSON_AddNumberToObject(o, "frames_out", (double)frames);
    cJSON_AddNumberToObject(o, "rows_out", (double)st->rows);
    /* Boundary (or token) bytes this stage sent per token it processed, headers included. */
    cJSON_AddNumberToObject(o, "boundary_bytes_out", (double)st->frame_bytes_out);
    cJSON_AddNumberToObject(o, "bytes_per_token_out",
                            st->rows ? (double)st->frame_bytes_out / (double)st->rows : 0);
    return o;
}

/* ================================ lifecycle ================================ */

static void close_walk(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

static void stage_shutdown(struct stage *st, const char *why)
{
    if (st->shutting_down)
        return;
    kvd_log(KVD_LOG_INFO, "shutting down: %s", why);
    st->shutting_down = true;
    while (st->sessions)
        sess_finish(st, st->sessions, NULL, "the daemon is shutting down");
    while (st->clients)
        client_close(st->clients);
    if (st->in)
        conn_close(st->in, "shutting down");
    if (st->out)
        conn_close(st->out, "shutting down");
    for (struct conn *p = st->pending; p; p = p->next)
        conn_close(p, "shutting down");
    if (st->ls)
        net_listener_close(st->ls, NULL, NULL);
    st->ls = NULL;
    if (st->http)
        net_http_server_close(st->http, NULL, NULL);
    st->http = NULL;
    if (st->ctl_open)
        uv_close((uv_handle_t *)&st->ctl, NULL);
    st->ctl_open = false;
    unlink(st->sock_path);
    uv_close((uv_handle_t *)&st->tick, NULL);
    uv_close((uv_handle_t *)&st->redial, NULL);
    uv_close((uv_handle_t *)&st->redial_in, NULL);
    uv_close((uv_handle_t *)&st->sigterm, NULL);
    uv_close((uv_handle_t *)&st->sigint, NULL);
    kvd_compute_stop(st->comp);
    st->comp = NULL;
}

static void on_signal(uv_signal_t *h, int sig)
{
    struct stage *st = h->data;
    stage_shutdown(st, sig == SIGTERM ? "SIGTERM" : "SIGINT");
}

static int endpoint_hostport(const char *ep, char *out, size_t n)
{
    const char *p = strstr(ep, "://");
    if (!p || strncmp(ep, "tcp://", 6) != 0)
        return -EINVAL;
    snprintf(out, n, "%s", p + 3);
    return 0;
}

/* Model identity: the catalog's id must be the manifest's model.catalog, and every tensor of
 * the window that this stage mapped must match its catalog entry (type, shape, size and the
 * SHA-256 of its bytes). */
static int check_identity(struct stage *st, const struct kvd_stage_opts *o)
{
    if (!o->catalog) {
        if (st->m.catalog[0] && !o->stub)
            kvd_log(KVD_LOG_WARN, "manifest names model catalog %.16s... but no --catalog was given: "
                    "the window's identity is not checked", st->m.catalog);
        return 0;
    }
    char err[512], id[65];
    struct gguf_catalog *c;
    int rc = gguf_catalog_load(&c, o->catalog, id, err, sizeof err);
    if (rc < 0) {
        kvd_log(KVD_LOG_ERROR, "catalog %s: %s", o->catalog, err);
        return rc;
    }
    if (st->m.catalog[0] && strcmp(id, st->m.catalog) != 0) {
        kvd_log(KVD_LOG_ERROR, "catalog %s has id %.16s..., the manifest's model is %.16s...", o->catalog, id,
                st->m.catalog);
        gguf_catalog_free(c);
        return -EPERM;
    }
    if (o->stub) {
        gguf_catalog_free(c);
        return 0;
    }
    const struct gguf_file *f = kvd_backend_gguf(&st->be);
    uint64_t checked = 0, bytes = 0;
    for (uint64_t i = 0; f && i < gguf_tensor_count(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        if (!t->data)
            continue;   /* not part of this window */
        const struct gguf_catalog_tensor *ct = gguf_catalog_find(c, t->name);
        bool same = ct && ct->type == t->type && ct->n_dims == t->n_dims && ct->size == t->size;
        for (uint32_t d = 0; same && d < t->n_dims; d++)
            same = ct->ne[d] == t->ne[d];
        char hex[65] = "";
        if (same) {
            gguf_sha256_hex(t->data, t->size, hex);
            same = !strcmp(hex, ct->sha256);
        }
        if (!same) {
            kvd_log(KVD_LOG_ERROR, "tensor %s does not match catalog %s (%s)", t->name, o->catalog,
                    !ct ? "not in the catalog" : hex[0] ? "SHA-256 differs" : "type/shape/size differ");
            gguf_catalog_free(c);
            return -EBADMSG;
        }
        checked++;
        bytes += t->size;
    }
    gguf_catalog_free(c);
    if (checked == 0) {
        kvd_log(KVD_LOG_ERROR, "no mapped tensor to check against the catalog");
        return -EINVAL;
    }
    kvd_log(KVD_LOG_INFO, "window verified against catalog %.16s...: %" PRIu64 " tensors, %" PRIu64 " bytes",
            id, checked, bytes);
    return 0;
}

int kvd_stage_run(const struct kvd_stage_opts *o)
{
    char err[512];
    struct stage *st = calloc(1, sizeof *st);
    if (!st)
        return -ENOMEM;
    st->o = *o;
    if (!st->o.idle_timeout_s)
        st->o.idle_timeout_s = 300;
    int rc = ring_manifest_load(&st->m, o->manifest, err, sizeof err);
    if (rc < 0) {
        kvd_log(KVD_LOG_ERROR, "%s", err);
        free(st);
        return rc;
    }
    if (o->rank < 0 || (uint32_t)o->rank >= st->m.n_ranks) {
        kvd_log(KVD_LOG_ERROR, "--rank %d not in the manifest's ranks [0, %u)", o->rank, st->m.n_ranks);
        free(st);
        return -EINVAL;
    }
    st->rank = (uint32_t)o->rank;
    st->n = st->m.n_ranks;
    st->pred = (st->rank + st->n - 1) % st->n;
    st->succ = (st->rank + 1) % st->n;
    st->is_last = st->rank == st->n - 1;
    char prefix[64];
    snprintf(prefix, sizeof prefix, "stage %u/%u", st->rank, st->n);
    kvd_log_set_prefix(prefix);
    const struct ring_rank_info *me = &st->m.ranks[st->rank];
    const char *state_dir = o->state_dir ? o->state_dir : ".";
    rc = net_identity_load(&st->id, state_dir, err, sizeof err);
    if (rc < 0) {
        kvd_log(KVD_LOG_ERROR, "node key: %s", err);
        goto fail;
    }
    if (me->has_node && memcmp(me->node, net_identity_pub(st->id), 32) != 0) {
        kvd_log(KVD_LOG_ERROR, "this node's key (%s/node.key) is not the one the manifest names for rank %u",
                state_dir, st->rank);
        rc = -EPERM;
        goto fail;
    }
    /* Load only this rank's window. */
    if (o->stub) {
        rc = kvd_backend_open_stub(&st->be, st->m.n_embd, st->m.n_layers, me->first, me->last, st->m.n_ctx);
    } else {
        const char *path = o->window ? o->window : o->model;
        if (!path) {
            kvd_log(KVD_LOG_ERROR, "need --model FILE or --window MINI.gguf");
            rc = -EINVAL;
            goto fail;
        }
        rc = kvd_backend_open_model(&st->be, path, o->window ? -1 : (int)me->first,
                                    o->window ? -1 : (int)me->last, o->n_threads, st->m.n_ctx,
                                    st->m.max_batch, err, sizeof err);
        if (rc < 0)
            kvd_log(KVD_LOG_ERROR, "model %s: %s", path, err);
    }
    if (rc < 0)
        goto fail;
    st->be_open = true;
    if (st->be.first != me->first || st->be.last != me->last || st->be.n_layer != st->m.n_layers ||
        st->be.n_embd != st->m.n_embd || (!o->stub && strcmp(st->be.arch, st->m.arch) != 0)) {
        kvd_log(KVD_LOG_ERROR, "the model does not match the manifest: window [%u,%u) vs [%u,%u), n_layers %u vs %u, "
                "n_embd %u vs %u, arch %s vs %s", st->be.first, st->be.last, me->first, me->last,
                st->be.n_layer, st->m.n_layers, st->be.n_embd, st->m.n_embd, st->be.arch, st->m.arch);
        rc = -EINVAL;
        goto fail;
    }
    if ((rc = check_identity(st, o)) < 0)
        goto fail;
    st->chunk = o->chunk && o->chunk < st->m.max_batch ? o->chunk : st->m.max_batch;
    /* The largest payload a peer may send us: an ACT of max_batch rows, an OPEN with a full
     * context of prompt, a TOKEN with logits, or an ERROR. */
    uint64_t cap = (uint64_t)st->m.max_batch * st->m.n_embd * st->m.wire_dsize;
    uint64_t c2 = NET_OPEN_LEN + (uint64_t)st->m.n_ctx * 4, c3 = 8 + (uint64_t)st->be.n_vocab * 4;
    if (c2 > cap) cap = c2;
    if (c3 > cap) cap = c3;
    if (4 + NET_ERR_MAX > cap) cap = 4 + NET_ERR_MAX;
    if (NET_HELLO_LEN > cap) cap = NET_HELLO_LEN;
    st->max_payload = cap > NET_PAYLOAD_HARD_MAX ? NET_PAYLOAD_HARD_MAX : (uint32_t)cap;

    st->loop = uv_default_loop();
    rc = kvd_compute_new(&st->comp, st->loop, &st->be, st->m.wire_dsize, on_job_done, st);
    if (rc < 0) {
        kvd_log(KVD_LOG_ERROR, "compute thread: %s", uv_strerror(rc));
        goto fail;
    }
    char listen[300];
    net_relay_transport_register();
    bool via_relay = net_relay_endpoint(me->endpoint) && !o->listen;
    uv_timer_init(st->loop, &st->redial_in);
    st->redial_in.data = st;
    if (via_relay)
        snprintf(listen, sizeof listen, "nothing (in-link through the relay %s)", me->endpoint);
    else if (o->listen)
        snprintf(listen, sizeof listen, "%s", o->listen);
    else if (endpoint_hostport(me->endpoint, listen, sizeof listen) < 0) {
        kvd_log(KVD_LOG_ERROR, "endpoint %s is not tcp:// or relay://: pass --listen", me->endpoint);
        rc = -EINVAL;
        goto fail_loop;
    }
    if (!via_relay) {
        rc = net_listener_new(&st->ls, st->loop, listen, &link_cbs, on_accept, st, HS_MAX_PAYLOAD, err, sizeof err);
        if (rc < 0) {
            kvd_log(KVD_LOG_ERROR, "%s", err);
            goto fail_loop;
        }
    }
    /* Control socket. */
    snprintf(st->sock_path, sizeof st->sock_path, "%s/kvd.sock", state_dir);
    unlink(st->sock_path);
    uv_pipe_init(st->loop, &st->ctl, 0);
    st->ctl.data = st;
    st->ctl_open = true;
    rc = uv_pipe_bind(&st->ctl, st->sock_path);
    if (rc == 0 && chmod(st->sock_path, 0600) < 0)   /* the control socket is the owner's */
        rc = -errno;
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&st->ctl, 16, ctl_on_conn);
    if (rc < 0) {
        kvd_log(KVD_LOG_ERROR, "control socket %s: %s", st->sock_path, uv_strerror(rc));
        goto fail_loop;
    }
    uv_timer_init(st->loop, &st->tick);
    uv_timer_init(st->loop, &st->redial);
    st->tick.data = st->redial.data = st;
    uv_timer_start(&st->tick, tick_cb, PING_MS, PING_MS);
    if (o->seed_listen && !o->stub) { /* roles combine: this stage also seeds what it holds */
        char id[65];
        err[0] = 0;
        rc = net_http_server_new(&st->http, st->loop, NULL);
        if (!rc)
            rc = seed_server_new(&st->seeder, st->http);
        if (!rc)
            rc = seed_server_add(st->seeder, o->window ? o->window : o->model, o->catalog, id, err,
                                sizeof err);
        if (!rc)
            rc = net_http_server_listen(st->http, o->seed_listen);
        if (rc) {
            kvd_log(KVD_LOG_ERROR, "seeder on %s: %s", o->seed_listen, err[0] ? err : uv_strerror(rc));
            if (st->http)
                net_http_server_close(st->http, NULL, NULL);
            st->http = NULL;
            goto fail_loop;
        }
        kvd_log(KVD_LOG_INFO, "seeding %s (model %.16s...) on %s (port %d)",
                o->window ? o->window : o->model, id, o->seed_listen, net_http_server_port(st->http));
    }
    uv_signal_init(st->loop, &st->sigterm);
    uv_signal_init(st->loop, &st->sigint);
    st->sigterm.data = st->sigint.data = st;
    uv_signal_start(&st->sigterm, on_signal, SIGTERM);
    uv_signal_start(&st->sigint, on_signal, SIGINT);
    signal(SIGPIPE, SIG_IGN);
    char key[65];
    net_hex(net_identity_pub(st->id), 32, key);
    kvd_log(KVD_LOG_INFO, "ring %s: rank %u of %u, layers [%u,%u)%s%s, listening on %s (port %d), node %.16s..., "
            "wire %s, control %s", st->m.ring, st->rank, st->n, me->first, me->last, me->embed ? " +embed" : "",
            me->head ? " +head" : "", listen, st->ls ? net_listener_port(st->ls) : 0, key, st->m.dtype,
            st->sock_path);
    stage_dial_out(st);
    if (via_relay)
        stage_dial_in(st);
    uv_run(st->loop, UV_RUN_DEFAULT);
    rc = 0;
    goto done;
fail_loop:
    st->shutting_down = true;
    if (st->ls)
        net_listener_close(st->ls, NULL, NULL);
    if (st->ctl_open)
        uv_close((uv_handle_t *)&st->ctl, NULL);
    kvd_compute_stop(st->comp);
    uv_walk(st->loop, close_walk, NULL);
    uv_run(st->loop, UV_RUN_DEFAULT);
done:
    uv_loop_close(st->loop);
    seed_server_free(st->seeder);
fail:
    if (st->be_open)
        kvd_backend_close(&st->be);
    net_identity_free(st->id);
    kvd_log(rc < 0 ? KVD_LOG_ERROR : KVD_LOG_INFO, "stopped%s", rc < 0 ? " (start failed)" : "");
    free(st);
    return rc;
}

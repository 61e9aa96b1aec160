/* serve.c — `kvctl serve -m FILE --listen HOST:PORT`: the OpenAI-compatible API of api/api.h
 * (docs/api.md) from one process, the llama-server habit, so a client moves between one
 * machine and a ring without a change. The generator is the whole model on one worker thread:
 * it takes the running generations in turn, one token each (prompt first), samples with
 * model/'s sampler and keeps each one's history, text and stop conditions with model_gen, as
 * `kvctl generate -m` does; results cross to the loop thread through a net_handoff (net/). The
 * loop thread never computes. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "api/api.h"
#include "gguf/gguf.h"
#include "kvctl/kvctl.h"
#include "model/model.h"
#include "net/net.h"
#include "util/err.h"

/* One generation. Freed by the loop thread only, when its last event (done) is delivered. */
struct sgen {
    struct sgen *next;               /* the worker's list, or the incoming list */
    uint64_t id;                     /* its executor session */
    int32_t *prompt;
    uint32_t n_prompt, pos;
    struct model_sampler_params sp;
    struct model_gen_params gp;
    const char **stops;
    uint32_t n_stops;
    bool want_logits, started;
    struct model_sampler *smp;
    struct model_gen *gen;
    float *lg;                       /* [n_vocab]: the logits of its next token */
    bool cancelled;                  /* the loop asked (under mu) */
    const struct api_gen_sink *sink;
    void *ud;
};

enum { EV_TOKEN, EV_DONE };

struct event {
    struct net_handoff_link link;    /* the way back to the loop */
    int kind;
    struct sgen *g;
    int32_t tok;
    char *text;                      /* token text, or the tail at the end */
    size_t len;
    float *logits;
    const char *reason;              /* static */
    char err[KV_ERR_MAX];
};

struct server {
    uv_loop_t *loop;
    struct net_handoff *events;      /* the worker's events, to the loop thread */
    uv_signal_t sigint, sigterm;
    pthread_t thr;
    pthread_mutex_t mu;              /* the lists, stop, cancelled flags, the step figures */
    pthread_cond_t cv;               /* the worker waits on it for work or stop */
    struct model *m;
    struct model_exec *e;
    struct model_vocab *voc;
    const struct model_hparams *hp;
    uint32_t n_ctx, max_batch;
    float *x;                        /* [max_batch][n_embd], the worker's */
    struct sgen *active;             /* the worker's */
    struct sgen *incoming;           /* under mu */
    bool stop;                       /* under mu */
    uint64_t next_id;
    /* under mu: decode steps and their time, for the metrics */
    uint64_t dec_steps;
    double dec_ms;
    uint32_t n_running;              /* loop thread: generations not yet done */
    struct api_server *api;
};

/* ================================ worker ================================ */

static void post(struct server *sv, struct event *ev)
{
    net_handoff_push(sv->events, &ev->link);
}

static void post_done(struct server *sv, struct sgen *g, const char *reason, const char *err)
{
    struct event *ev = calloc(1, sizeof *ev);
    if (!ev)
        abort();   /* the loop would wait for this generation for ever */
    ev->kind = EV_DONE;
    ev->g = g;
    ev->reason = reason;
    if (err)
        snprintf(ev->err, sizeof ev->err, "%s", err);
    const char *tail = NULL;
    size_t tl = 0;
    if (!err && g->gen && model_gen_flush(g->gen, &tail, &tl) == 0 && tail && tl &&
        (ev->text = malloc(tl)))
        memcpy(ev->text, tail, ev->len = tl);
    post(sv, ev);
}

/* Run tokens[0..n) at g's positions; the last row's logits into g->lg. */
static int feed(struct server *sv, struct sgen *g, const int32_t *tokens, uint32_t n)
{
    int rc;
    for (uint32_t done = 0; done < n;) {
        uint32_t nb = n - done < sv->max_batch ? n - done : sv->max_batch;
        if ((rc = model_embed(sv->e, tokens + done, nb, sv->x)) < 0 ||
            (rc = model_window_run(sv->e, g->id, g->pos, nb, sv->x)) < 0)
            return rc;
        g->pos += nb;
        done += nb;
        if (done == n &&
            (rc = model_head(sv->e, sv->x + (size_t)(nb - 1) * sv->hp->n_embd, 1, g->lg)) < 0)
            return rc;
    }
    return 0;
}

/* One turn of g: its prompt when new, then one token sampled and run. false: g ended (its
 * done event posted). */
static bool step(struct server *sv, struct sgen *g)
{
    int rc;
    char msg[KV_ERR_MAX];
    if (!g->started) {
        g->started = true;
        if ((rc = model_sampler_new(&g->smp, &g->sp, sv->hp->n_vocab)) < 0 ||
            (rc = model_gen_new(&g->gen, sv->voc, &g->gp, g->prompt, g->n_prompt)) < 0 ||
            (g->n_stops && (rc = model_gen_set_stops(g->gen, g->stops, g->n_stops)) < 0) ||
            (rc = model_session_new(sv->e, g->id)) < 0) {
            snprintf(msg, sizeof msg, "starting the generation: %s", strerror(-rc));
            post_done(sv, g, NULL, msg);
            return false;
        }
        for (uint32_t i = 0; i < g->n_prompt; i++)
            model_sampler_accept(g->smp, g->prompt[i]);
        if ((rc = feed(sv, g, g->prompt, g->n_prompt)) < 0) {
            snprintf(msg, sizeof msg, "prompt: %s", strerror(-rc));
            post_done(sv, g, NULL, msg);
            return false;
        }
    }
    struct event *ev = calloc(1, sizeof *ev);
    if (!ev || (g->want_logits && !(ev->logits = malloc((size_t)sv->hp->n_vocab * sizeof(float))))) {
        free(ev);
        post_done(sv, g, NULL, "out of memory");
        return false;
    }
    if (ev->logits)   /* raw logits, before the sampler touches them (as a ring sends them) */
        memcpy(ev->logits, g->lg, (size_t)sv->hp->n_vocab * sizeof(float));
    int32_t tok = model_sampler_sample(g->smp, g->lg, NULL);
    if (tok < 0) {
        free(ev->logits);
        free(ev);
        post_done(sv, g, NULL, "no token can be sampled (logits all -inf/NaN)");
        return false;
    }
    struct model_gen_step st;
    model_gen_push(g->gen, tok, &st);
    if (st.emit) {
        model_sampler_accept(g->smp, tok);
        ev->kind = EV_TOKEN;
        ev->g = g;
        ev->tok = tok;
        if (st.text && st.len && (ev->text = malloc(st.len)))
            memcpy(ev->text, st.text, ev->len = st.len);
        post(sv, ev);
    } else {
        free(ev->logits);
        free(ev);
    }
    if (st.reason != MODEL_GEN_RUNNING) {
        post_done(sv, g, model_gen_reason_name(st.reason), NULL);
        return false;
    }
    double t0 = util_now_ms();
    if ((rc = feed(sv, g, &tok, 1)) < 0) {
        snprintf(msg, sizeof msg, "%s", rc == -ERANGE ? "past the context" : strerror(-rc));
        post_done(sv, g, NULL, msg);
        return false;
    }
    pthread_mutex_lock(&sv->mu);
    sv->dec_steps++;
    sv->dec_ms += util_now_ms() - t0;
    pthread_mutex_unlock(&sv->mu);
    return true;
}

static void *worker(void *arg)
{
    struct server *sv = arg;
    for (;;) {
        pthread_mutex_lock(&sv->mu);
        while (!sv->stop && !sv->incoming && !sv->active)
            pthread_cond_wait(&sv->cv, &sv->mu);
        if (sv->stop) {
            pthread_mutex_unlock(&sv->mu);
            break;
        }
        /* new ones join at the end, in the order they came */
        struct sgen **tail = &sv->active;
        while (*tail)
            tail = &(*tail)->next;
        struct sgen *in = NULL;
        while (sv->incoming) {   /* reverse the pushed list */
            struct sgen *g = sv->incoming;
            sv->incoming = g->next;
            g->next = in;
            in = g;
        }
        *tail = in;
        /* cancelled ones leave now (their done tells the loop it may free them) */
        for (struct sgen **pp = &sv->active; *pp;) {
            struct sgen *g = *pp;
            if (g->cancelled) {
                *pp = g->next;
                pthread_mutex_unlock(&sv->mu);
                if (g->started)
                    model_session_free(sv->e, g->id);
                post_done(sv, g, "cancelled", NULL);
                pthread_mutex_lock(&sv->mu);
            } else {
                pp = &g->next;
            }
        }
        pthread_mutex_unlock(&sv->mu);
        /* one turn each */
        for (struct sgen **pp = &sv->active; *pp;) {
            struct sgen *g = *pp;
            if (!step(sv, g)) {
                *pp = g->next;
                if (g->started)
                    model_session_free(sv->e, g->id);
            } else {
                pp = &g->next;
            }
        }
    }
    return NULL;
}

/* ================================ loop side ================================ */

static void sgen_free(struct sgen *g)
{
    model_sampler_free(g->smp);
    model_gen_free(g->gen);
    for (uint32_t i = 0; i < g->n_stops; i++)
        free((char *)g->stops[i]);
    free(g->stops);
    free(g->prompt);
    free(g->lg);
    free(g);
}

static struct event *event_of(struct net_handoff_link *l)
{
    return (struct event *)((char *)l - offsetof(struct event, link));
}

static void event_free(struct event *ev)
{
    free(ev->text);
    free(ev->logits);
    free(ev);
}

/* On the loop thread: one of the worker's events, to its request (unless cancelled). A done
 * is the generation's last event, so the generation goes with it. */
static void on_event(struct net_handoff_link *l, void *ud)
{
    struct server *sv = ud;
    struct event *ev = event_of(l);
    struct sgen *g = ev->g;
    pthread_mutex_lock(&sv->mu);
    bool cancelled = g->cancelled;
    pthread_mutex_unlock(&sv->mu);
    if (ev->kind == EV_TOKEN) {
        if (!cancelled) {
            struct api_gen_token t = {.id = ev->tok, .text = ev->text ? ev->text : "",
                                      .len = ev->len, .logits = ev->logits};
            g->sink->token(g->ud, &t);
        }
    } else {
        if (!cancelled)
            g->sink->done(g->ud, ev->err[0] ? NULL : ev->reason, ev->err[0] ? ev->err : NULL,
                          ev->text, ev->len);
        sv->n_running--;
        sgen_free(g);
    }
    event_free(ev);
}

/* An event the queue still held when it closed: the server drains it after joining the
 * worker, so none is expected; one would be freed, its request not told. */
static void on_event_dropped(struct net_handoff_link *l, void *ud)
{
    struct server *sv = ud;
    struct event *ev = event_of(l);
    if (ev->kind == EV_DONE) {
        sv->n_running--;
        sgen_free(ev->g);
    }
    event_free(ev);
}

static int gen_start(void *impl, const struct api_gen_req *r, const struct api_gen_sink *sink,
                     void *sink_ud, void **handle, char *err, size_t errlen)
{
    struct server *sv = impl;
    struct sgen *g = calloc(1, sizeof *g);
    if (!g || !(g->prompt = malloc((size_t)r->n_prompt * sizeof *g->prompt)) ||
        !(g->lg = malloc((size_t)sv->hp->n_vocab * sizeof *g->lg)) ||
        (r->n_stops && !(g->stops = calloc(r->n_stops, sizeof *g->stops)))) {
        if (g)
            sgen_free(g);
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < r->n_stops; i++) {
        if (!(g->stops[i] = strdup(r->stops[i]))) {
            sgen_free(g);
            snprintf(err, errlen, "out of memory");
            return -ENOMEM;
        }
        g->n_stops++;
    }
    memcpy(g->prompt, r->prompt, (size_t)r->n_prompt * sizeof *g->prompt);
    g->n_prompt = r->n_prompt;
    g->sp = r->sp;
    g->gp = (struct model_gen_params){.n_ctx = sv->n_ctx, .max_gen = r->max_tokens, .eos = -1,
                                         .ignore_eos = r->ignore_eos};
    g->want_logits = r->logits;
    g->sink = sink;
    g->ud = sink_ud;
    g->id = ++sv->next_id;
    sv->n_running++;
    pthread_mutex_lock(&sv->mu);
    g->next = sv->incoming;
    sv->incoming = g;
    pthread_cond_signal(&sv->cv);
    pthread_mutex_unlock(&sv->mu);
    *handle = g;
    return 0;
}

static void gen_cancel(void *impl, void *handle)
{
    struct server *sv = impl;
    struct sgen *g = handle;
    pthread_mutex_lock(&sv->mu);
    g->cancelled = true;
    pthread_cond_signal(&sv->cv);
    pthread_mutex_unlock(&sv->mu);
}

static bool gen_ready(void *impl, char *why, size_t n)
{
    (void)impl; (void)why; (void)n;
    return true;
}

static void gen_metrics(void *impl, char *buf, size_t cap)
{
    struct server *sv = impl;
    pthread_mutex_lock(&sv->mu);
    double ms = sv->dec_steps ? sv->dec_ms / (double)sv->dec_steps : 0;
    pthread_mutex_unlock(&sv->mu);
    snprintf(buf, cap,
        "# HELP kvasir_stage_ms_per_token Mean compute time of one decode step on this stage.\n"
        "# TYPE kvasir_stage_ms_per_token gauge\nkvasir_stage_ms_per_token{rank=\"0\"} %.4f\n",
        ms);
}

static const struct api_gen_ops serve_ops = {gen_start, gen_cancel, gen_ready, gen_metrics};

static void on_api_closed(void *ud)
{
    struct server *sv = ud;
    pthread_mutex_lock(&sv->mu);
    sv->stop = true;
    pthread_cond_signal(&sv->cv);
    pthread_mutex_unlock(&sv->mu);
    pthread_join(sv->thr, NULL);
    net_handoff_drain(sv->events);   /* the last events (the cancelled ones' ends) */
    /* those the worker had not swept yet: every request is gone, nobody is told */
    for (struct sgen *l = sv->active, *ln = sv->incoming; l || ln; l = ln, ln = NULL)
        while (l) {
            struct sgen *next = l->next;
            sgen_free(l);
            sv->n_running--;
            l = next;
        }
    sv->active = sv->incoming = NULL;
    net_handoff_close(sv->events, NULL, NULL);
    sv->events = NULL;
    uv_close((uv_handle_t *)&sv->sigint, NULL);
    uv_close((uv_handle_t *)&sv->sigterm, NULL);
}

static void on_signal(uv_signal_t *h, int sig)
{
    struct server *sv = h->data;
    fprintf(stderr, "kvctl serve: signal %d: stopping\n", sig);
    uv_signal_stop(&sv->sigint);
    uv_signal_stop(&sv->sigterm);
    struct api_server *api = sv->api;
    sv->api = NULL;
    api_server_close(api, on_api_closed, sv);
}

/* ================================ command ================================ */

static void serve_usage(FILE *f)
{
    fprintf(f,
        "usage: kvctl serve -m FILE --listen HOST:PORT [options]\n"
        "Serves the OpenAI-compatible API (docs/api.md) from this one process.\n"
        "  --api-key-file F   API keys, one a line: requests need Authorization: Bearer KEY\n"
        "                     (required on an address other than loopback, unless --api-open)\n"
        "  --api-open         serve without keys on an address other than loopback\n"
        "  --api-tls-cert PEM, --api-tls-key PEM  serve HTTPS (use it when keys cross a network)\n"
        "  --api-keepalive S  close a kept-alive connection idle for S seconds (default 30)\n"
        "  --max-sessions N   generations at once, 429 beyond (default 16)\n"
        "  --max-body BYTES   request body limit, 413 beyond (default 1048576)\n"
        "  --chat-template NAME  chat template family (chatml, llama3, ...; default: the model's)\n"
        "  --ctx N            context length of each generation (default: the model's, at most 4096)\n"
        "  --max-batch N      prompt rows run at once (default 64)\n"
        "  -t N               threads (default: one per CPU)\n"
        "  --device NAME      kernel device: cpu (default) or ref\n"
        "Runs until SIGINT or SIGTERM.\n");
}

enum { OPT_LISTEN = 2000, OPT_KEYS, OPT_MAXS, OPT_BODY, OPT_TEMPLATE, OPT_CTX, OPT_BATCH,
       OPT_DEVICE, OPT_OPEN, OPT_CERT, OPT_TLSKEY, OPT_KEEPALIVE };

int kvctl_cmd_serve(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"listen", required_argument, 0, OPT_LISTEN},
        {"api-key-file", required_argument, 0, OPT_KEYS}, {"api-open", no_argument, 0, OPT_OPEN},
        {"api-tls-cert", required_argument, 0, OPT_CERT},
        {"api-tls-key", required_argument, 0, OPT_TLSKEY},
        {"api-keepalive", required_argument, 0, OPT_KEEPALIVE},
        {"max-sessions", required_argument, 0, OPT_MAXS},
        {"max-body", required_argument, 0, OPT_BODY},
        {"chat-template", required_argument, 0, OPT_TEMPLATE},
        {"ctx", required_argument, 0, OPT_CTX}, {"max-batch", required_argument, 0, OPT_BATCH},
        {"threads", required_argument, 0, 't'}, {"device", required_argument, 0, OPT_DEVICE},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    const char *path = NULL, *listen = NULL, *keys = NULL, *tmpl = NULL, *device = "cpu";
    const char *cert = NULL, *tlskey = NULL;
    long maxs = 16, body = 1 << 20, ctx = 0, batch = 64, threads = 0, keepalive = 0;
    bool open = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:t:h", opts, NULL)) != -1) {
        int rc = 0;
        switch (c) {
        case 'm': path = optarg; break;
        case OPT_LISTEN: listen = optarg; break;
        case OPT_KEYS: keys = optarg; break;
        case OPT_OPEN: open = true; break;
        case OPT_CERT: cert = optarg; break;
        case OPT_TLSKEY: tlskey = optarg; break;
        case OPT_KEEPALIVE:
            rc = kvctl_parse_long("--api-keepalive", optarg, 1, API_ANSWER_MS / 1000, &keepalive);
            break;
        case OPT_TEMPLATE: tmpl = optarg; break;
        case OPT_DEVICE: device = optarg; break;
        case OPT_MAXS: rc = kvctl_parse_long("--max-sessions", optarg, 1, 65536, &maxs); break;
        case OPT_BODY: rc = kvctl_parse_long("--max-body", optarg, 1024, 1 << 30, &body); break;
        case OPT_CTX: rc = kvctl_parse_long("--ctx", optarg, 2, 1 << 20, &ctx); break;
        case OPT_BATCH: rc = kvctl_parse_long("--max-batch", optarg, 1, 4096, &batch); break;
        case 't': rc = kvctl_parse_long("-t", optarg, 0, 1024, &threads); break;
        case 'h': serve_usage(stdout); return 0;
        default: serve_usage(stderr); return 2;
        }
        if (rc < 0)
            return 2;
    }
    if (!path || !listen || optind < argc) {
        serve_usage(stderr);
        return 2;
    }
    char err[KV_ERR_MAX] = "";
    struct api_config cfg = {.listen = listen, .key_file = keys, .max_sessions = (uint32_t)maxs,
                             .max_body = (uint32_t)body, .chat_template = tmpl, .open = open,
                             .tls_cert = cert, .tls_key = tlskey, .keepalive_s = (uint32_t)keepalive};
    if (api_config_check(&cfg, err, sizeof err) < 0) {   /* before the model loads */
        fprintf(stderr, "kvctl serve: %s\n", err);
        return 2;
    }
    struct server *sv = calloc(1, sizeof *sv);
    if (!sv)
        return 1;
    int ret = 1, rc = model_open(&sv->m, path, -1, -1, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "kvctl serve: %s\n", err);
        free(sv);
        return 1;
    }
    sv->hp = model_get_hparams(sv->m);
    if (!model_has_embed(sv->m) || !model_has_head(sv->m)) {
        fprintf(stderr, "kvctl serve: %s holds a window, not the whole model\n", path);
        goto out_model;
    }
    sv->n_ctx = ctx ? (uint32_t)ctx : sv->hp->n_ctx_train < 4096 ? sv->hp->n_ctx_train : 4096;
    sv->max_batch = (uint32_t)batch > sv->n_ctx ? sv->n_ctx : (uint32_t)batch;
    struct model_exec_opts eo = {device, (int)threads, sv->n_ctx, sv->max_batch, NULL};
    if ((rc = model_exec_new_opts(&sv->e, sv->m, &eo, err, sizeof err)) < 0) {
        fprintf(stderr, "kvctl serve: executor: %s\n", err[0] ? err : strerror(-rc));
        goto out_model;
    }
    if ((rc = model_vocab_load(&sv->voc, model_get_gguf(sv->m), err, sizeof err)) < 0) {
        fprintf(stderr, "kvctl serve: %s: no tokenizer (%s): only token-id prompts work\n", path, err);
        sv->voc = NULL;
    }
    if (!(sv->x = malloc((size_t)sv->max_batch * sv->hp->n_embd * sizeof(float))))
        goto out_exec;
    sv->loop = uv_default_loop();
    if ((rc = pthread_mutex_init(&sv->mu, NULL)) != 0) {
        fprintf(stderr, "kvctl serve: the worker's lock: %s\n", strerror(rc));
        goto out_exec;
    }
    if ((rc = pthread_cond_init(&sv->cv, NULL)) != 0) {
        fprintf(stderr, "kvctl serve: the worker's lock: %s\n", strerror(rc));
        pthread_mutex_destroy(&sv->mu);
        goto out_exec;
    }
    if ((rc = net_handoff_new(&sv->events, sv->loop, on_event, on_event_dropped, sv)) < 0) {
        fprintf(stderr, "kvctl serve: the worker's queue: %s\n", uv_strerror(rc));
        goto out_loop;
    }
    const char *base = strrchr(path, '/');
    char name[256] = "";
    gguf_get_str(model_get_gguf(sv->m), "general.name", name, sizeof name);
    struct api_generator gen = {
        .ops = &serve_ops, .impl = sv, .vocab = sv->voc, .gguf = model_get_gguf(sv->m),
        .n_ctx = sv->n_ctx, .n_vocab = sv->hp->n_vocab,
        .model_id = name[0] ? name : base ? base + 1 : path,
    };
    if ((rc = pthread_create(&sv->thr, NULL, worker, sv)) != 0) {
        fprintf(stderr, "kvctl serve: worker thread: %s\n", strerror(rc));
        goto out_loop;
    }
    if ((rc = api_server_new(&sv->api, sv->loop, &cfg, &gen, err, sizeof err)) < 0) {
        fprintf(stderr, "kvctl serve: %s\n", err[0] ? err : strerror(-rc));
        pthread_mutex_lock(&sv->mu);
        sv->stop = true;
        pthread_cond_signal(&sv->cv);
        pthread_mutex_unlock(&sv->mu);
        pthread_join(sv->thr, NULL);
        goto out_loop;
    }
    signal(SIGPIPE, SIG_IGN);
    uv_signal_init(sv->loop, &sv->sigint);
    uv_signal_init(sv->loop, &sv->sigterm);
    sv->sigint.data = sv->sigterm.data = sv;
    uv_signal_start(&sv->sigint, on_signal, SIGINT);
    uv_signal_start(&sv->sigterm, on_signal, SIGTERM);
    printf("kvctl serve: %s on %s://%s (port %d), context %u, at most %ld sessions%s\n", gen.model_id,
           cert ? "https" : "http", listen, api_server_port(sv->api), sv->n_ctx, maxs,
           keys ? ", API keys required" : "");
    fflush(stdout);
    uv_run(sv->loop, UV_RUN_DEFAULT);
    ret = 0;
out_loop:
    net_handoff_close(sv->events, NULL, NULL);   /* NULL once on_api_closed closed it */
    uv_run(sv->loop, UV_RUN_DEFAULT);
    uv_loop_close(sv->loop);
    pthread_cond_destroy(&sv->cv);
    pthread_mutex_destroy(&sv->mu);
out_exec:
    free(sv->x);
    model_vocab_free(sv->voc);
    model_exec_free(sv->e);
out_model:
    model_free(sv->m);
    free(sv);
    return ret;
}

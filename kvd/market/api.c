/* api.c — the market's HTTP JSON API (docs/market.md): models and their windows, the
 * coverage map with demand and rewards, signed claims and lease heartbeats, the manifest
 * stages long-poll for, receipts and balances, and the coverage page at GET /.
 *
 * Every request runs in one store transaction: a mutating call checks its signature, spends
 * its nonce and writes, all committed together or not at all, so a refused call leaves the
 * ledger as it was and a retried one is never applied twice. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <uv.h>

#include "gguf/gguf.h"
#include "kvd/kvd.h"
#include "kvd/market/internal.h"
#include "net/net.h"
#include "planner/plan.h"
#include "ringlib/ring.h"
#include "util/err.h"
#include "util/util.h"

#define MAX_PROFILES 256         /* device profiles the planner looks at */
#define PROFILE_AGE_S 600.0      /* profiles older than this are not planned with */
#define NONCE_KEEP_FACTOR 2.0    /* nonces are kept for twice the clock skew allowed */
#define SWEEP_EVERY_S 2.0        /* how often pending sessions are looked at */
#define SESSION_TOKENS_MAX 16777216.0 /* the most tokens a session may be opened for */

struct poll {                    /* a manifest long-poll waiting for a change */
    struct kvd_market_api *a;
    struct net_http_req *req;
    char model[65], after[65];
    double deadline;
    struct poll *next;
};

struct probe {                   /* an activation waiting for its endpoint to answer */
    struct kvd_market_api *a;
    struct net_http_req *req;
    uv_tcp_t tcp;
    uv_connect_t conn;
    uv_timer_t timer;
    char model[65], node[65], endpoint[KVD_MARKET_EP_MAX];
    uint32_t window, first, last;
    int closing, answered;
};

struct kvd_market_api {
    uv_loop_t *loop;
    struct net_http_server *srv;
    struct kvd_market_store *st;
    struct kvd_market_config cfg;
    uv_timer_t tick;
    struct poll *polls;
    struct kvd_market_audit *audit;   /* audits of credited work (audit.c) */
    bool closed;
    struct kvd_market_admit *admit;
    char sweep_after[KVD_MARKET_KEY_MAX];   /* the settlement sweep's cursor */
    double sweep_next;
};

void kvd_market__config_default(struct kvd_market_config *c)
{
    memset(c, 0, sizeof *c);
    c->listen = "127.0.0.1:7490";
    c->lease_s = 20;
    c->reserve_s = 60;
    c->grace_s = 30;
    c->clock_skew_s = 300;
    c->reward_base = 0.001;
    c->demand_ref = 10;
    c->demand_tau_s = 300;
    c->poll_max_s = 25;
    c->probe = true;
    c->spot_check_s = 300;
    c->penalty_s = 600;
    c->pull_min_rate = 1 << 20;
    c->lapse_refuse_s = 600;
    c->claims_per_min_key = 12;
    c->claims_per_min_addr = 60;
    c->max_ranks_addr = 1;
    c->max_ranks_relay_addr = 4;
    c->settle_wait_s = 120;
    c->audit_rate = 0.05;
    c->audit_deadline_s = 300;
}


static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- answers ---- */

static void reply_json(struct net_http_req *req, int status, cJSON *o)
{
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    if (!s) {
        net_http_reply_error(req, 500, "out of memory");
    } else {
        size_t n = strlen(s);
        s[n] = '\n';   /* the terminator's byte becomes the newline; the length says where it ends */
        net_http_reply(req, status, "application/json", "Cache-Control: no-store\r\n", s, n + 1);
    }
    free(s);
    cJSON_Delete(o);
}

/* {"error": reason} with a 4xx/5xx status; extra (may be NULL) is merged in (taken). */
static void reply_err(struct net_http_req *req, int status, cJSON *extra, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void reply_err(struct net_http_req *req, int status, cJSON *extra, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cJSON *o = extra ? extra : cJSON_CreateObject();
    cJSON_AddStringToObject(o, "error", msg);
    reply_json(req, status, o);
}

static bool is_hex(const char *s, size_t lo, size_t hi)
{
    size_t n = strlen(s);
    if (n < lo || n > hi)
        return false;
    for (size_t i = 0; i < n; i++)
        if (util_hex_digit((unsigned char)s[i]) < 0 || (s[i] >= 'A' && s[i] <= 'F'))
            return false;
    return true;
}

/* ---- signed calls ---- */

/* Check the signature headers of req; node gets the caller's key (hex). The nonce is spent
 * in the open transaction. 0, or the HTTP status to refuse with (reason in why). */
static int auth(struct kvd_market_api *a, struct net_http_req *req, char node[65], char *why,
                size_t whylen)
{
    const char *k = net_http_req_header(req, "X-Kv-Node");
    const char *t = net_http_req_header(req, "X-Kv-Time");
    const char *n = net_http_req_header(req, "X-Kv-Nonce");
    const char *s = net_http_req_header(req, "X-Kv-Signature");
    if (!k || !t || !n || !s) {
        util_seterr(why, whylen, "unsigned call: X-Kv-Node, X-Kv-Time, X-Kv-Nonce and "
                    "X-Kv-Signature are required");
        return 401;
    }
    uint8_t pub[32], sig[64];
    if (!is_hex(k, 64, 64) || util_hex_decode(k, pub, 32)) {
        util_seterr(why, whylen, "X-Kv-Node: expected 64 lowercase hex digits (an Ed25519 key)");
        return 400;
    }
    if (!is_hex(s, 128, 128) || util_hex_decode(s, sig, 64)) {
        util_seterr(why, whylen, "X-Kv-Signature: expected 128 lowercase hex digits");
        return 400;
    }
    if (!is_hex(n, 16, 64)) {
        util_seterr(why, whylen, "X-Kv-Nonce: expected 16 to 64 lowercase hex digits");
        return 400;
    }
    int64_t ts;
    if (util_parse_i64(t, 0, INT64_MAX / 2, &ts, NULL, 0) < 0) {
        util_seterr(why, whylen, "X-Kv-Time '%.32s': expected Unix seconds", t);
        return 400;
    }
    double now = now_s();
    if (fabs((double)ts - now) > a->cfg.clock_skew_s) {
        util_seterr(why, whylen, "X-Kv-Time %lld is %.0f s from the market's clock (at most %.0f s)",
                    (long long)ts, fabs((double)ts - now), a->cfg.clock_skew_s);
        return 401;
    }
    size_t blen = 0;
    const void *body = net_http_req_body(req, &blen);
    char path[2100], canon[RING_MARKET_CANON_MAX];
    const char *q = net_http_req_query(req);
    snprintf(path, sizeof path, "%s%s%s", net_http_req_path(req), q[0] ? "?" : "", q);
    int cl = ring_market_canon(canon, net_http_req_method(req), path, body, blen, ts, n);
    if (cl < 0 || !net_sig_verify(pub, canon, (size_t)cl, sig)) {
        util_seterr(why, whylen, "bad signature for node %.16s... over %s %s", k,
                    net_http_req_method(req), path);
        return 401;
    }
    int rc = a->st->ops->nonce_use(a->st->impl, k, n, now,
                                   now - NONCE_KEEP_FACTOR * a->cfg.clock_skew_s);
    if (rc == -EEXIST) {
        util_seterr(why, whylen, "nonce %s was used before by this node (a replay)", n);
        return 409;
    }
    if (rc < 0) {
        util_seterr(why, whylen, "store: %s", a->st->err);
        return 503;
    }
    memcpy(node, k, 65);
    return 0;
}

/* Parse the request body as a JSON object: the object, or NULL with a 400 sent. */
static cJSON *body_json(struct net_http_req *req)
{
    size_t len = 0;
    const char *b = net_http_req_body(req, &len);
    cJSON *o = b && len ? cJSON_ParseWithLength(b, len) : NULL;
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        reply_err(req, 400, NULL, "the body must be a JSON object (%zu bytes given)", len);
        return NULL;
    }
    return o;
}

/* A whole number member in [lo, hi]: 0, or -EINVAL with why. */
static int juint(const cJSON *o, const char *key, double lo, double hi, uint64_t *out, char *why,
                 size_t whylen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi) ||
        v->valuedouble != floor(v->valuedouble)) {
        util_seterr(why, whylen, "%s: expected a whole number from %.0f to %.0f", key, lo, hi);
        return -EINVAL;
    }
    *out = (uint64_t)v->valuedouble;
    return 0;
}

/* ---- leases ---- */

enum { L_FREE = 0, L_RESERVED = 1, L_ACTIVE = 2, L_GRACE = 3 };
static const char *const lease_names[] = {"uncovered", "reserved", "active", "grace"};

/* What a lease row means now: held (reserved/active) until expires, then a grace period in
 * which only its node may take the window back, then free. */
static int lease_now(const struct kvd_market_api *a, const struct kvd_market_lease *l, double now)
{
    if (!l->node[0])
        return L_FREE;
    if (now < l->expires)
        return l->state == KVD_LEASE_ACTIVE ? L_ACTIVE : L_RESERVED;
    /* the grace period is for a serving stage that blinked; a reservation that lapsed frees
     * its window at once (else a squatter could hold it through its grace) */
    if (l->state == KVD_LEASE_ACTIVE && now < l->expires + a->cfg.grace_s)
        return L_GRACE;
    return L_FREE;
}

/* The model's windows and their leases (empty node for none). */
struct model_state {
    struct kvd_market_model m;
    struct kvd_market_window w[KVD_MARKET_MAX_WINDOWS];
    struct kvd_market_lease l[KVD_MARKET_MAX_WINDOWS];
    int ls[KVD_MARKET_MAX_WINDOWS];
    /* a standby took the window's rank over in generation took_sha (standby.c), and the
     * manifest of that generation names mnode at mendpoint for it: the manifest stays so while
     * the standby holds the window and nothing else changed */
    char took_sha[KVD_MARKET_MAX_WINDOWS][65], mnode[KVD_MARKET_MAX_WINDOWS][65];
    char mendpoint[KVD_MARKET_MAX_WINDOWS][KVD_MARKET_EP_MAX];
    size_t n;
};

static int model_state_load(struct kvd_market_api *a, const char *id, struct model_state *ms,
                            double now)
{
    const struct kvd_market_store_ops *o = a->st->ops;
    int rc = o->model_get(a->st->impl, id, &ms->m);
    if (rc)
        return rc;
    if ((rc = o->windows_get(a->st->impl, id, ms->w, KVD_MARKET_MAX_WINDOWS, &ms->n))) {
        kvd_market__model_clear(&ms->m);
        return rc;
    }
    cJSON *took = kvd_market__took_load(a->st, id);   /* standby.c: takeovers, one read */
    for (size_t i = 0; i < ms->n; i++) {
        rc = o->lease_get(a->st->impl, id, ms->w[i].idx, &ms->l[i]);
        if (rc && rc != -ENOENT) {
            cJSON_Delete(took);
            kvd_market__model_clear(&ms->m);
            return rc;
        }
        ms->ls[i] = lease_now(a, &ms->l[i], now);
        ms->took_sha[i][0] = 0;
        char w[16];
        snprintf(w, sizeof w, "%u", ms->w[i].idx);
        const cJSON *t = ms->l[i].node[0] ? cJSON_GetObjectItemCaseSensitive(took, w) : NULL;
        const char *tn = util_json_string(t, "node"), *tm = util_json_string(t, "manifest");
        const char *mn = util_json_string(t, "mnode"), *me = util_json_string(t, "mendpoint");
        if (tn && tm && mn && me && !strcmp(tn, ms->l[i].node) && strlen(tm) == 64) {
            snprintf(ms->took_sha[i], 65, "%s", tm);
            snprintf(ms->mnode[i], 65, "%s", mn);
            snprintf(ms->mendpoint[i], KVD_MARKET_EP_MAX, "%s", me);
        }
    }
    cJSON_Delete(took);
    return 0;
}

static double covered_of(int ls)
{
    return ls == L_ACTIVE ? 1.0 : ls == L_RESERVED ? 0.5 : 0.0;
}

static bool complete(const struct model_state *ms)
{
    if (!ms->n)
        return false;
    for (size_t i = 0; i < ms->n; i++)
        if (ms->ls[i] != L_ACTIVE)
            return false;
    return true;
}

static cJSON *free_windows(const struct model_state *ms, const char *node)
{
    cJSON *f = cJSON_CreateArray();
    for (size_t i = 0; i < ms->n; i++)
        if (ms->ls[i] == L_FREE || (ms->ls[i] == L_GRACE && node && !strcmp(ms->l[i].node, node)))
            cJSON_AddItemToArray(f, cJSON_CreateNumber(ms->w[i].idx));
    return f;
}

static cJSON *lease_json(const struct kvd_market_api *a, const struct kvd_market_lease *l, int ls,
                         double now)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "window", l->window);
    cJSON_AddStringToObject(o, "node", l->node);
    cJSON_AddStringToObject(o, "state", lease_names[ls]);
    cJSON_AddNumberToObject(o, "expires_in", ls == L_GRACE ? l->expires + a->cfg.grace_s - now
                                                          : l->expires - now);
    if (l->endpoint[0])
        cJSON_AddStringToObject(o, "endpoint", l->endpoint);
    return o;
}

/* A blob as JSON (caller deletes), NULL when there is none; and a blob put (store.c). */
static cJSON *blob_load(struct kvd_market_api *a, const char *key)
{
    return kvd_market__blob_load(a->st, key);
}

static int blob_save(struct kvd_market_api *a, const char *key, const cJSON *o)
{
    return kvd_market__blob_save(a->st, key, o);
}

/* ---- the manifest ---- */

/* The ring's manifest once every window has an active stage (else NULL); hash gets its
 * SHA-256. Built from the plan and leases only, so the same state gives the same bytes and a
 * replaced stage changes only its rank's entry. */
static char *manifest_build(const struct model_state *ms, const bool *keep, char hash[65]);

static char *manifest_of(const struct model_state *ms, char hash[65])
{
    if (!complete(ms))
        return NULL;
    /* a rank a standby took over keeps its published entry, as long as the manifest is the
     * generation it was taken over in (the ring runs it); otherwise the manifest names the
     * windows' holders as they are */
    bool keep[KVD_MARKET_MAX_WINDOWS] = {false}, any = false;
    for (size_t i = 0; i < ms->n; i++)
        any |= keep[i] = ms->took_sha[i][0] != 0;
    char *s = manifest_build(ms, keep, hash);
    if (!any || !s)
        return s;
    bool again = false;
    for (size_t i = 0; i < ms->n; i++)
        if (keep[i] && strcmp(ms->took_sha[i], hash))
            keep[i] = false, again = true;
    if (!again)
        return s;
    free(s);
    return manifest_build(ms, keep, hash);
}

static char *manifest_build(const struct model_state *ms, const bool *keep, char hash[65])
{
    struct ring_manifest *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->version = 1;
    snprintf(m->ring, sizeof m->ring, "mkt-%.16s", ms->m.id);
    snprintf(m->model_name, sizeof m->model_name, "%s", ms->m.name);
    snprintf(m->catalog, sizeof m->catalog, "%s", ms->m.id);
    snprintf(m->arch, sizeof m->arch, "%s", ms->m.arch);
    m->n_layers = ms->m.n_layers;
    m->n_embd = ms->m.n_embd;
    snprintf(m->dtype, sizeof m->dtype, "f32");
    m->n_ranks = (uint32_t)ms->n;
    for (size_t i = 0; i < ms->n; i++) {
        struct ring_rank_info *ri = &m->ranks[i];
        ri->rank = (uint32_t)i;
        ri->has_node = util_hex_decode(keep[i] ? ms->mnode[i] : ms->l[i].node, ri->node, 32) == 0;
        ri->first = ms->w[i].first;
        ri->last = ms->w[i].last;
        ri->embed = i == 0;
        ri->head = i + 1 == ms->n;
        snprintf(ri->endpoint, sizeof ri->endpoint, "%s", keep[i] ? ms->mendpoint[i] : ms->l[i].endpoint);
    }
    char *s = NULL, err[KV_ERR_MAX];
    uint8_t dg[32];
    if (ring_manifest_write(&s, dg, m, err, sizeof err) == 0)
        util_hex_encode(dg, 32, hash);
    else
        kvd_log(KVD_LOG_ERROR, "model %.16s...: no manifest: %s", ms->m.id, err);
    free(m);
    return s;
}

/* ---- planning ---- */

/* The planner's view of a catalog: shape (layers caller-freed through *layers). */
static int shape_of(const struct gguf_catalog *c, struct plan_shape *shape, struct plan_layer **layers,
                    char *err, size_t errlen)
{
    struct plan_tensor *t = calloc(c->n_tensors ? c->n_tensors : 1, sizeof *t);
    *layers = calloc(c->n_layers ? c->n_layers : 1, sizeof **layers);
    if (!t || !*layers) {
        free(t);
        free(*layers);
        *layers = NULL;
        return -ENOMEM;
    }
    uint32_t n_embd = 0;
    for (uint64_t i = 0; i < c->n_tensors; i++) {
        t[i].name = c->tensors[i].name;
        t[i].n_dims = c->tensors[i].n_dims;
        memcpy(t[i].ne, c->tensors[i].ne, sizeof t[i].ne);
        t[i].bytes = c->tensors[i].size;
        if (!strcmp(c->tensors[i].name, "token_embd.weight"))
            n_embd = (uint32_t)c->tensors[i].ne[0];
    }
    struct plan_model_info mi = {.n_layers = c->n_layers, .n_embd = n_embd,
                                 .nextn_layers = c->n_layers - c->n_main};
    memset(shape, 0, sizeof *shape);
    shape->arch = c->arch;
    int rc = plan_shape_from_tensors(t, (size_t)c->n_tensors, &mi, shape, *layers, err, errlen);
    shape->n_layers = c->n_main;
    free(t);
    if (rc) {
        free(*layers);
        *layers = NULL;
    }
    return rc;
}

static int cmp_mem(const void *x, const void *y)
{
    const struct kvd_market_node *a = x, *b = y;
    return a->mem_bytes < b->mem_bytes ? -1 : a->mem_bytes > b->mem_bytes;
}

/* Plan the model's windows from the device profiles seen lately: the planner over those
 * devices, the median one repeated until the population could hold the model (a crowd
 * like the nodes that came so far). With no profile yet, one window. 0 or negative. */
static int plan_windows(struct kvd_market_api *a, const struct kvd_market_model *m, double now,
                        struct kvd_market_window *w, size_t *n, char *err, size_t errlen)
{
    struct gguf_catalog *c = NULL;
    int rc = gguf_catalog_from_json(&c, m->catalog, strlen(m->catalog), NULL, err, errlen);
    if (rc)
        return rc;
    struct plan_shape shape;
    struct plan_layer *layers = NULL;
    struct kvd_market_node *nodes = calloc(MAX_PROFILES, sizeof *nodes);
    struct plan_device *devs = calloc(KVD_MARKET_MAX_WINDOWS, sizeof *devs);
    struct plan_result *pr = NULL;
    size_t nn = 0;
    if (!nodes || !devs) {
        rc = -ENOMEM;
        goto out;
    }
    if ((rc = shape_of(c, &shape, &layers, err, errlen)))
        goto out;
    shape.name = m->name;
    uint64_t total = shape.embed_bytes + shape.head_bytes;
    for (uint32_t i = 0; i < shape.n_layers; i++)
        total += layers[i].weight_bytes;
    if ((rc = a->st->ops->nodes_recent(a->st->impl, now - PROFILE_AGE_S, nodes, MAX_PROFILES, &nn)))
        goto out;
    qsort(nodes, nn, sizeof *nodes, cmp_mem);
    uint64_t med = nn ? nodes[nn / 2].mem_bytes : total * 4 + (256u << 20);
    /* the real devices (the largest first), then copies of the median one until it fits */
    size_t nd = 0;
    for (size_t i = nn; i-- > 0 && nd < KVD_MARKET_MAX_WINDOWS;)
        devs[nd++] = (struct plan_device){.id = nodes[i].id, .backend = "cpu",
                                          .mem_bytes = nodes[i].mem_bytes, .ms_per_layer_token = 1,
                                          .rtt_ms = 1, .inbound = nodes[i].inbound};
    struct plan_opts po;
    plan_opts_default(&po);
    po.objective = PLAN_LATENCY;
    po.ctx = 1024;
    po.max_ranks = KVD_MARKET_MAX_WINDOWS;
    for (;;) {
        rc = nd ? plan_make(&pr, &shape, devs, nd, &po, err, errlen) : -ENOSPC;
        if (rc != -ENOSPC || nd >= KVD_MARKET_MAX_WINDOWS)
            break;
        devs[nd++] = (struct plan_device){.id = "median", .backend = "cpu", .mem_bytes = med,
                                          .ms_per_layer_token = 1, .rtt_ms = 1, .inbound = true};
    }
    if (rc)
        goto out;
    *n = pr->n_ranks;
    for (uint32_t r = 0; r < pr->n_ranks; r++) {
        const struct plan_rank *k = &pr->ranks[r];
        w[r] = (struct kvd_market_window){.idx = r, .first = k->first, .last = k->last,
                                          .bytes = k->mem_bytes};
    }
out:
    plan_result_free(pr);
    free(devs);
    free(nodes);
    free(layers);
    gguf_catalog_free(c);
    return rc;
}

/* Re-plan a model whose windows nobody holds (nothing to disturb): 0 or negative. */
static int replan_if_idle(struct kvd_market_api *a, const char *id, double now, char *err,
                          size_t errlen)
{
    struct model_state *ms = calloc(1, sizeof *ms);
    if (!ms)
        return -ENOMEM;
    int rc = model_state_load(a, id, ms, now);
    if (rc)
        goto out;
    bool idle = true;
    for (size_t i = 0; i < ms->n; i++)
        if (ms->ls[i] != L_FREE)
            idle = false;
    if (idle) {
        struct kvd_market_window w[KVD_MARKET_MAX_WINDOWS];
        size_t n = 0;
        if ((rc = plan_windows(a, &ms->m, now, w, &n, err, errlen)) == 0)
            rc = a->st->ops->windows_set(a->st->impl, id, w, n);
    }
    kvd_market__model_clear(&ms->m);
out:
    free(ms);
    return rc;
}

/* ---- handlers ---- */

/* Begin the request's transaction: 0, or the 503 sent. */
static int begin(struct kvd_market_api *a, struct net_http_req *req)
{
    if (a->st->ops->begin(a->st->impl)) {
        reply_err(req, 503, NULL, "store: %s", a->st->err);
        return -EIO;
    }
    return 0;
}

/* Commit, then answer o with status; a failed commit answers 503 (nothing was written). */
static void commit_reply(struct kvd_market_api *a, struct net_http_req *req, int status, cJSON *o)
{
    if (a->st->ops->commit(a->st->impl)) {
        a->st->ops->rollback(a->st->impl);
        cJSON_Delete(o);
        reply_err(req, 503, NULL, "store: %s", a->st->err);
        return;
    }
    reply_json(req, status, o);
}

static void rollback_err(struct kvd_market_api *a, struct net_http_req *req, int status,
                         cJSON *extra, const char *why)
{
    a->st->ops->rollback(a->st->impl);
    reply_err(req, status, extra, "%s", why);
}

/* rollback_err with the reason formatted here. */
static void rollback_errf(struct kvd_market_api *a, struct net_http_req *req, int status,
                          const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void rollback_errf(struct kvd_market_api *a, struct net_http_req *req, int status,
                          const char *fmt, ...)
{
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    rollback_err(a, req, status, NULL, why);
}

/* Begin, then check the signature: 0 with node set, or the refusal sent. */
static int begin_signed(struct kvd_market_api *a, struct net_http_req *req, char node[65])
{
    char why[512];
    if (begin(a, req))
        return -EIO;
    int st = auth(a, req, node, why, sizeof why);
    if (st) {
        rollback_err(a, req, st, NULL, why);
        return -EPERM;
    }
    return 0;
}

static int path_model(struct net_http_req *req, const char *path, char id[65], const char **what);

/* The key that owns model id ("" when none is recorded: a model registered before owners
 * were kept, which only an operator may change), into buf. */
static const char *model_owner(struct kvd_market_api *a, const char *id, char *buf, size_t n)
{
    char key[80];
    snprintf(key, sizeof key, "owner/%s", id);
    cJSON *o = blob_load(a, key);
    snprintf(buf, n, "%s", util_json_string(o, "owner") ? util_json_string(o, "owner") : "");
    cJSON_Delete(o);
    return buf;
}

/* May node change model id? 0 (*exists says whether it is registered already), or the 403
 * (naming the owner) or 503 sent and the transaction rolled back. */
static int model_owner_check(struct kvd_market_api *a, struct net_http_req *req, const char *id,
                             const char *node, bool *exists)
{
    struct kvd_market_model old;
    int rc = a->st->ops->model_get(a->st->impl, id, &old);
    if (rc && rc != -ENOENT) {
        rollback_err(a, req, 503, NULL, a->st->err);
        return rc;
    }
    *exists = rc == 0;
    if (rc)
        return 0;
    kvd_market__model_clear(&old);
    char owner[65], why[256];
    model_owner(a, id, owner, sizeof owner);
    if (!strcmp(owner, node) || kvd_market__admit_operator(a->admit, node))
        return 0;
    if (owner[0])
        snprintf(why, sizeof why, "model %.16s... belongs to node %s: only its owner or a market "
                 "operator may change or remove it", id, owner);
    else
        snprintf(why, sizeof why, "model %.16s... has no recorded owner: only a market operator "
                 "(kvd market --operator-key) may change or remove it", id);
    rollback_err(a, req, 403, NULL, why);
    return -EPERM;
}

/* DELETE /v1/models/<id>: signed by its owner or an operator; its windows and leases go with it
 * (its stages' heartbeats are refused from then on). */
static void h_model_delete(struct net_http_req *req, void *ud)
{
    struct kvd_market_api *a = ud;
    char id[65], node[65];
    const char *what;
    if (path_model(req, net_http_req_path(req), id, &what))
        return;
    if (what[0]) {
        reply_err(req, 404, NULL, "DELETE takes /v1/models/<id>");
        return;
    }
    if (begin_signed(a, req, node))
        return;
    bool exists = false;
    if (model_owner_check(a, req, id, node, &exists))
        return;
    if (!exists) {
        rollback_err(a, req, 404, NULL, "no such model");
        return;
    }
    if (a->st->ops->model_delete(a->st->impl, id)) {
        rollback_err(a, req, 503, NULL, a->st->err);
        return;
    }
    kvd_log(KVD_LOG_INFO, "model %.16s... removed by node %.16s...", id, node);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "state", "removed");
    commit_reply(a, req, 200, o);
}

/* POST /v1/models {"catalog": CATALOG-JSON-TEXT, "name": S, "sources": [URL...]} */
static void h_models_post(struct net_http_req *req, void *ud)
{
    struct kvd_market_api *a = ud;
    char node[65], why[512];
    cJSON *b = body_json(req);
    if (!b)
        return;
    const char *cat = util_json_string(b, "catalog"), *name = util_json_string(b, "name");
    const cJSON *src = cJSON_GetObjectItemCaseSensitive(b, "sources");
    struct gguf_catalog *c = NULL;
    char id[65];
    if (!cat) {
        reply_err(req, 400, NULL, "catalog: expected the catalog's JSON text as a string");
        goto out;
    }
    if (name && strlen(name) > 127) {
        reply_err(req, 400, NULL, "name: at most 127 bytes");
        goto out;
    }
    if (!cJSON_IsArray(src) || cJSON_GetArraySize(src) < 1 || cJSON_GetArraySize(src) > 16) {
        reply_err(req, 400, NULL, "sources: expected an array of 1 to 16 URLs");
        goto out;
    }
    for (const cJSON *s = src->child; s; s = s->next)
        if (!cJSON_IsString(s) || (strncmp(s->valuestring, "http://", 7) &&
                                   strncmp(s->valuestring, "https://", 8)) ||
            strlen(s->valuestring) > 512) {
            reply_err(req, 400, NULL, "sources: every source is an http(s):// URL of at most 512 bytes");
            goto out;
        }
    if (gguf_catalog_from_json(&c, cat, strlen(cat), id, why, sizeof why) < 0) {
        reply_err(req, 400, NULL, "catalog: %s", why);
        goto out;
    }
    if (begin_signed(a, req, node))
        goto out;
    /* a model belongs to the key that registered it (and the operators) */
    bool exists = false;
    int orc = model_owner_check(a, req, id, node, &exists);
    if (orc)
        goto out;
    struct kvd_market_model m = {0};
    snprintf(m.id, sizeof m.id, "%s", id);
    snprintf(m.name, sizeof m.name, "%s", name ? name : c->arch);
    snprintf(m.arch, sizeof m.arch, "%.31s", c->arch);
    m.n_layers = c->n_main;
    for (uint64_t i = 0; i < c->n_tensors; i++) {
        m.bytes += c->tensors[i].size;
        if (!strcmp(c->tensors[i].name, "token_embd.weight"))
            m.n_embd = (uint32_t)c->tensors[i].ne[0];
    }
    m.catalog = (char *)cat;
    const cJSON *probes = cJSON_GetObjectItemCaseSensitive(b, "probes");
    char *pt = NULL;
    if (probes && kvd_market__probes_check(probes, m.n_layers, m.n_embd, why, sizeof why)) {
        rollback_err(a, req, 400, NULL, why);
        goto out;
    }
    m.sources = cJSON_PrintUnformatted(src);
    double now = now_s();
    int rc = m.sources ? a->st->ops->model_put(a->st->impl, &m) : -ENOMEM;
    free(m.sources);
    if (rc == 0 && probes) {   /* a registration without probes keeps the ones the model has */
        char key[80];
        snprintf(key, sizeof key, "probes/%s", id);
        rc = (pt = cJSON_PrintUnformatted(probes)) ? a->st->ops->blob_put(a->st->impl, key, pt) : -ENOMEM;
        free(pt);
    }
    if (rc == 0 && !exists) {
        char key[80];
        snprintf(key, sizeof key, "owner/%s", id);
        cJSON *ow = cJSON_CreateObject();
        cJSON_AddStringToObject(ow, "owner", node);
        cJSON_AddNumberToObject(ow, "at", now);
        rc = blob_save(a, key, ow);
        cJSON_Delete(ow);
    }
    if (rc == 0)
        rc = replan_if_idle(a, id, now, why, sizeof why);
    if (rc) {
        rollback_err(a, req, rc == -ENOSPC || rc == -EINVAL ? 422 : 503, NULL,
                     rc == -EIO ? a->st->err : why);
        goto out;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "name", m.name);
    cJSON_AddNumberToObject(o, "n_layers", m.n_layers);
    cJSON_AddBoolToObject(o, "probes", probes != NULL);
    cJSON_AddStringToObject(o, "owner", exists ? model_owner(a, id, why, sizeof why) : node);
    commit_reply(a, req, exists ? 200 : 201, o);
out:
    gguf_catalog_free(c);
    cJSON_Delete(b);
}

/* The complete ring's truth from its stages' reports (ringmap.c): each window's report into
 * reps (NULL where none counts), whether any says its links are down (why: the reason of the
 * first rank that gave one, else of the first down), and the API URLs of rank 0 into api. */
static bool ring_down(struct kvd_market_api *a, const struct model_state *ms, const char *hash,
                      double now, cJSON **reps, cJSON *api, char *why, size_t n)
{
    int down = 0;
    char w[600];
    for (size_t i = 0; i < ms->n; i++) {
        reps[i] = kvd_market__report_load(a->st, ms->m.id, ms->w[i].idx, ms->l[i].node, hash, now,
                                          3 * a->cfg.lease_s);
        int d = reps[i] ? kvd_market__report_down(reps[i], (uint32_t)i, w, sizeof w) : 0;
        if (d > down) {
            down = d;
            snprintf(why, n, "%s", w);
        }
        const char *u = util_json_string(reps[i], "api");
        if (i == 0 && u)
            cJSON_AddItemToArray(api, cJSON_CreateString(u));
    }
    return down > 0;
}

/* An active lease whose holder stopped heartbeating (it beats every quarter of the lease):
 * shown as silent, not active, for the rest of its lease, and its ring as no ring. */
static bool lease_silent(const struct kvd_market_api *a, const struct model_state *ms, size_t i,
                         double now)
{
    return ms->ls[i] == L_ACTIVE && now - (ms->l[i].expires - a->cfg.lease_s) > a->cfg.lease_s / 2 + 2;
}

static cJSON *coverage_json(struct kvd_market_api *a, const struct model_state *ms, double now)
{
    double d = kvd_market__demand_now(&a->cfg, &ms->m, now);
    cJSON *o = cJSON_CreateObject(), *ws = cJSON_CreateArray(), *rings = cJSON_CreateArray();
    cJSON *reps[KVD_MARKET_MAX_WINDOWS] = {0}, *api = cJSON_CreateArray();
    char hash[65], why[600] = "";
    char *man = manifest_of(ms, hash);
    bool down = man && ring_down(a, ms, hash, now, reps, api, why, sizeof why);
    cJSON *live = kvd_market__standby_list(a->st, ms->m.id, now);
    int n_silent = 0;
    char silent_why[300] = "";
    for (size_t i = 0; i < ms->n; i++)
        if (lease_silent(a, ms, i, now) && !n_silent++)
            snprintf(silent_why, sizeof silent_why, "window %u's stage (node %.16s...) has sent no "
                     "heartbeat for %.0f s", ms->w[i].idx, ms->l[i].node,
                     now - (ms->l[i].expires - a->cfg.lease_s));
    cJSON_AddStringToObject(o, "model", ms->m.id);
    cJSON_AddStringToObject(o, "name", ms->m.name);
    cJSON_AddStringToObject(o, "arch", ms->m.arch);
    cJSON_AddNumberToObject(o, "n_layers", ms->m.n_layers);
    cJSON_AddNumberToObject(o, "demand_rpm", d);
    for (size_t i = 0; i < ms->n; i++) {
        cJSON *w = cJSON_CreateObject(), *ly = cJSON_CreateArray(), *stg = cJSON_CreateArray();
        cJSON_AddNumberToObject(w, "window", ms->w[i].idx);
        cJSON_AddItemToArray(ly, cJSON_CreateNumber(ms->w[i].first));
        cJSON_AddItemToArray(ly, cJSON_CreateNumber(ms->w[i].last));
        cJSON_AddItemToObject(w, "layers", ly);
        cJSON_AddNumberToObject(w, "mem_bytes", (double)ms->w[i].bytes);
        /* a window in its grace period has no stage: uncovered, its stage entry says for whom
         * it is kept */
        double beat_age = now - (ms->l[i].expires - a->cfg.lease_s);
        bool silent = lease_silent(a, ms, i, now);
        cJSON_AddStringToObject(w, "state", silent ? "silent" :
                                lease_names[ms->ls[i] == L_GRACE ? L_FREE : ms->ls[i]]);
        if (ms->ls[i] != L_FREE) {
            cJSON *e = lease_json(a, &ms->l[i], ms->ls[i], now);
            if (silent) {
                util_json_set(e, "state", cJSON_CreateString("silent"));
                cJSON_AddNumberToObject(e, "silent_s", beat_age);
            }
            char key[100];
            snprintf(key, sizeof key, "check/%s/%u", ms->m.id, ms->w[i].idx);
            cJSON *chk = blob_load(a, key);
            const char *n = util_json_string(chk, "node");
            const cJSON *last = cJSON_GetObjectItemCaseSensitive(chk, "last");
            if (n && !strcmp(n, ms->l[i].node) && last)   /* the stage's last probe */
                cJSON_AddItemToObject(e, "probe", cJSON_Duplicate(last, 1));
            cJSON_Delete(chk);
            if (ms->took_sha[i][0]) {   /* a standby that took the rank over */
                cJSON *t = cJSON_AddObjectToObject(e, "took_over");
                cJSON_AddStringToObject(t, "from", ms->mnode[i]);
                cJSON_AddStringToObject(t, "manifest_sha256", ms->took_sha[i]);
            }
            if (reps[i]) {   /* what the stage reports of the ring it runs */
                cJSON_DeleteItemFromObjectCaseSensitive(reps[i], "node");
                cJSON_AddItemToObject(e, "ring", reps[i]);
                reps[i] = NULL;
            }
            cJSON_AddItemToArray(stg, e);
        }
        cJSON_AddItemToObject(w, "stages", stg);
        cJSON *sbs = cJSON_AddArrayToObject(w, "standbys");
        const cJSON *e;
        cJSON_ArrayForEach(e, live) {
            if (util_json_number(e, "window", -1) != (double)ms->w[i].idx)
                continue;
            cJSON *x = cJSON_CreateObject();
            cJSON_AddStringToObject(x, "node", util_json_string(e, "node"));
            cJSON_AddStringToObject(x, "state", util_json_string(e, "endpoint") ? "standby" : "pulling");
            if (util_json_string(e, "endpoint"))
                cJSON_AddStringToObject(x, "endpoint", util_json_string(e, "endpoint"));
            cJSON_AddNumberToObject(x, "expires_in", util_json_number(e, "expires", now) - now);
            cJSON_AddItemToArray(sbs, x);
        }
        cJSON *wr = cJSON_CreateArray();
        if (man && !down && !n_silent)
            cJSON_AddItemToArray(wr, cJSON_CreateNumber(0));
        cJSON_AddItemToObject(w, "rings", wr);
        cJSON_AddNumberToObject(w, "demand_rpm", d);
        cJSON_AddNumberToObject(w, "reward", kvd_market__reward(&a->cfg, d, covered_of(ms->ls[i])));
        cJSON_AddItemToArray(ws, w);
    }
    cJSON_AddItemToObject(o, "windows", ws);
    cJSON *unlinked = cJSON_CreateArray();
    if (man) {   /* every window has an active stage: a ring, unless its stages say otherwise */
        cJSON *r = cJSON_CreateObject();
        char ring[32];
        snprintf(ring, sizeof ring, "mkt-%.16s", ms->m.id);
        cJSON_AddNumberToObject(r, "ring", 0);
        cJSON_AddStringToObject(r, "id", ring);
        cJSON_AddStringToObject(r, "manifest_sha256", hash);
        cJSON_AddNumberToObject(r, "ranks", (double)ms->n);
        if (down || n_silent) {
            cJSON_AddStringToObject(r, "reason", down ? why : silent_why);
            cJSON_AddItemToArray(unlinked, r);
        } else {
            cJSON_AddItemToObject(r, "api", api);
            api = NULL;
            cJSON_AddItemToArray(rings, r);
        }
        free(man);
    }
    for (size_t i = 0; i < ms->n; i++)
        cJSON_Delete(reps[i]);
    cJSON_Delete(live);
    cJSON_Delete(api);
    cJSON_AddItemToObject(o, "rings", rings);
    cJSON_AddItemToObject(o, "unlinked", unlinked);
    return o;
}

/* /v1/models/<id>[/<what>]: id into out (0) or a 400/404 sent. */
static int path_model(struct net_http_req *req, const char *path, char id[65], const char **what)
{
    const char *p = path + strlen("/v1/models/");
    const char *slash = strchr(p, '/');
    size_t n = slash ? (size_t)(slash - p) : strlen(p);
    if (n != 64) {
        reply_err(req, 400, NULL, "model id: expected 64 hex digits (the catalog's SHA-256)");
        return -EINVAL;
    }
    memcpy(id, p, 64);
    id[64] = 0;
    if (!is_hex(id, 64, 64)) {
        reply_err(req, 400, NULL, "model id: expected 64 lowercase hex digits");
        return -EINVAL;
    }
    *what = slash ? slash + 1 : "";
    return 0;
}

static void answer_poll(struct poll *p, int status, char *man);

/* GET /v1/models/<id>/manifest?after=HASH&wait=S: the manifest once the ring is complete and
 * differs from HASH; waits up to S seconds for that (204 when it does not come). */
static void manifest_get(struct kvd_market_api *a, struct net_http_req *req, const char *id)
{
    const char *q = net_http_req_query(req);
    char after[65] = "";
    double wait = 0;
    const char *x = strstr(q, "after=");
    if (x) {
        size_t n = strcspn(x + 6, "&");
        if (n > 64) {
            reply_err(req, 400, NULL, "after: expected a manifest's SHA-256 (64 hex digits)");
            return;
        }
        memcpy(after, x + 6, n);
        after[n] = 0;
    }
    if ((x = strstr(q, "wait="))) {
        wait = atof(x + 5);
        if (!(wait >= 0))
            wait = 0;
        if (wait > a->cfg.poll_max_s)
            wait = a->cfg.poll_max_s;
    }
    struct poll *p = calloc(1, sizeof *p);
    if (!p) {
        reply_err(req, 503, NULL, "out of memory");
        return;
    }
    p->a = a;
    p->req = req;
    snprintf(p->model, sizeof p->model, "%s", id);
    snprintf(p->after, sizeof p->after, "%s", after);
    p->deadline = now_s() + wait;
    answer_poll(p, 0, NULL);
}

/* A rank's share of a session was paid: a share of the credited work is audited later
 * (audit.c). */
static int on_paid(void *ud, const struct kvd_market_paid *p, double now)
{
    struct kvd_market_api *a = ud;
    struct kvd_market_audit_work aw = {
        .model = p->model, .node = p->node, .session = p->session, .digest = p->digest,
        .key = p->key, .rank = p->rank, .n_ranks = p->n_ranks, .window = p->rank,
        .first = p->first, .last = p->last, .n_embd = p->n_embd, .t0 = p->t0, .t1 = p->t1};
    return kvd_market__audit_note(a->audit, &aw, now);
}

/* Record the generation of a manifest about to be served (its own transaction): its nodes are
 * the ones whose receipts for sessions on it count (docs/market.md, "Receipts and credit"). */
static int gen_note(struct kvd_market_api *a, const char *model, const char *sha, const char *man,
                    double now)
{
    int rc = a->st->ops->begin(a->st->impl);
    if (rc == 0)
        rc = kvd_market__gen_record(a->st, model, sha, man, now);
    if (rc == 0)
        rc = a->st->ops->commit(a->st->impl);
    if (rc) {
        a->st->ops->rollback(a->st->impl);
        kvd_log(KVD_LOG_ERROR, "recording ring generation %.16s... of model %.16s...: %s", sha, model,
                a->st->err);
    }
    return rc;
}

/* Answer p if its manifest changed or its time is up: true when answered (p freed). */
static bool poll_try(struct poll *p)
{
    struct kvd_market_api *a = p->a;
    double now = now_s();
    struct model_state *ms = calloc(1, sizeof *ms);
    if (!ms || model_state_load(a, p->model, ms, now)) {
        if (ms && ms->m.catalog)
            kvd_market__model_clear(&ms->m);
        free(ms);
        reply_err(p->req, 404, NULL, "model %s is not registered", p->model);
        free(p);
        return true;
    }
    char hash[65];
    char *man = manifest_of(ms, hash);
    kvd_market__model_clear(&ms->m);
    free(ms);
    if (man && strcmp(hash, p->after) && gen_note(a, p->model, hash, man, now)) {
        reply_err(p->req, 503, NULL, "store: %s", a->st->err);
        free(man);
        free(p);
        return true;
    }
    if (man && strcmp(hash, p->after)) {
        char hdr[128];
        snprintf(hdr, sizeof hdr, "X-Kv-Manifest-Sha256: %s\r\nCache-Control: no-store\r\n", hash);
        net_http_reply(p->req, 200, "application/json", hdr, man, strlen(man));
        free(man);
        free(p);
        return true;
    }
    free(man);
    if (now >= p->deadline) {
        net_http_reply(p->req, 204, NULL, "Cache-Control: no-store\r\n", NULL, 0);
        free(p);
        return true;
    }
    return false;
}

static void poll_abort(void *ud)
{
    struct poll *p = ud;
    struct kvd_market_api *a = p->a;
    for (struct poll **pp = &a->polls; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    free(p);
}

static void answer_poll(struct poll *p, int status, char *man)
{
    (void)status;
    (void)man;
    if (poll_try(p))
        return;
    p->next = p->a->polls;
    p->a->polls = p;
    net_http_req_set_abort(p->req, poll_abort, p);
}

/* Every 200 ms: the waiting long-polls whose manifest came or whose time is up. */
static void on_tick(uv_timer_t *t)
{
    struct kvd_market_api *a = t->data;
    double now = now_s();
    if (now >= a->sweep_next) {   /* sessions whose ring did not all submit: the settle wait */
        a->sweep_next = now + SWEEP_EVERY_S;
        size_t paid = 0;
        int rc = a->st->ops->begin(a->st->impl);
        if (rc == 0)
            rc = kvd_market__session_sweep(a->st, &a->cfg, now, a->sweep_after, on_paid, a, &paid);
        if (rc == 0)
            rc = a->st->ops->commit(a->st->impl);
        if (rc) {
            a->st->ops->rollback(a->st->impl);
            kvd_log(KVD_LOG_WARN, "settling pending sessions: %s", a->st->err);
        } else if (paid) {
            kvd_log(KVD_LOG_INFO, "settled %zu ranks' shares of sessions past their wait", paid);
        }
    }
    struct poll **pp = &a->polls;
    while (*pp) {
        struct poll *p = *pp;
        *pp = p->next;
        net_http_req_set_abort(p->req, NULL, NULL);
        if (!poll_try(p)) {
            net_http_req_set_abort(p->req, poll_abort, p);
            p->next = *pp;
            *pp = p;
            pp = &p->next;
        }
    }
}

static void roster_get(struct kvd_market_api *a, struct net_http_req *req, const char *id);

static void h_model_get(struct net_http_req *req, void *ud)
{
    struct kvd_market_api *a = ud;
    char id[65];
    const char *what;
    if (path_model(req, net_http_req_path(req), id, &what))
        return;
    if (!strcmp(what, "roster")) {
        roster_get(a, req, id);
        return;
    }
    if (!strcmp(what, "manifest")) {
        manifest_get(a, req, id);
        return;
    }
    double now = now_s();
    struct model_state *ms = calloc(1, sizeof *ms);
    int rc = ms ? model_state_load(a, id, ms, now) : -ENOMEM;
    if (rc == -ENOENT)
        reply_err(req, 404, NULL, "model %s is not registered", id);
    else if (rc)
        reply_err(req, 503, NULL, "store: %s", a->st->err);
    else if (!strcmp(what, "coverage") || !what[0])
        reply_json(req, 200, coverage_json(a, ms, now));
    else if (!strcmp(what, "catalog"))
        net_http_reply(req, 200, "application/json", NULL, ms->m.catalog, strlen(ms->m.catalog));
    else if (!strcmp(what, "sources"))
        net_http_reply(req, 200, "application/json", NULL, ms->m.sources, strlen(ms->m.sources));
    else
        reply_err(req, 404, NULL, "no such resource '%s' of a model (coverage, catalog, sources, manifest, roster)",
                  what);
    if (rc == 0)
        kvd_market__model_clear(&ms->m);
    free(ms);
}

/* GET /v1/models: every model with its windows' coverage in short. */
static void h_models_get(struct net_http_req *req, void *ud)
{
    struct kvd_market_api *a = ud;
    char (*ids)[65] = calloc(1024, sizeof *ids);
    struct model_state *ms = calloc(1, sizeof *ms);
    size_t n = 0;
    if (!ids || !ms || a->st->ops->model_ids(a->st->impl, ids, 1024, &n)) {
        free(ids);
        free(ms);
        reply_err(req, 503, NULL, "store: %s", a->st->err);
        return;
    }
    double now = now_s();
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++) {
        if (model_state_load(a, ids[i], ms, now))
            continue;
        cJSON *m = cJSON_CreateObject();
        size_t covered = 0;
        for (size_t k = 0; k < ms->n; k++)
            covered += ms->ls[k] == L_ACTIVE;
        cJSON_AddStringToObject(m, "id", ms->m.id);
        cJSON_AddStringToObject(m, "name", ms->m.name);
        cJSON_AddStringToObject(m, "arch", ms->m.arch);
        cJSON_AddNumberToObject(m, "n_layers", ms->m.n_layers);
        cJSON_AddNumberToObject(m, "bytes", (double)ms->m.bytes);
        cJSON_AddNumberToObject(m, "windows", (double)ms->n);
        cJSON_AddNumberToObject(m, "covered", (double)covered);
        cJSON_AddNumberToObject(m, "demand_rpm", kvd_market__demand_now(&a->cfg, &ms->m, now));
        cJSON_AddItemToObject(m, "sources", cJSON_Parse(ms->m.sources));
        cJSON_AddItemToArray(arr, m);
        kvd_market__model_clear(&ms->m);
    }
    cJSON_AddItemToObject(o, "models", arr);
    free(ids);
    free(ms);
    reply_json(req, 200, o);
}

/* POST /v1/nodes {"model": ID?, "mem_bytes": N, "backend": S, "inbound": B}: a profile. */
static void h_nodes_post(struct net_http_req *req, void *ud)
{
    struct kvd_market_api *a = ud;
    char node[65], why[512];
    cJSON *b = body_json(req);
    if (!b)
        return;
    struct kvd_market_node nd = {.inbound = true};
    const char *be = util_json_string(b, "backend"), *model = util_json_string(b, "model");
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(b, "inbound");
    if (juint(b, "mem_bytes", 1 << 16, 1e15, &nd.mem_bytes, why, sizeof why)) {
        reply_err(req, 400, NULL, "%s", why);
        goto out;
    }
    if (be && (strlen(be) >= sizeof nd.backend || !be[0])) {
        reply_err(req, 400, NULL, "backend: 1 to %zu bytes", sizeof nd.backend - 1);
        goto out;
    }
    if (model && !is_hex(model, 64, 64)) {
        reply_err(req, 400, NULL, "model: expected 64 lowercase hex digits");
        goto out;
    }
    snprintf(nd.backend, sizeof nd.backend, "%s", be ? be : "cpu");
    if (cJSON_IsBool(in))
        nd.inbound = cJSON_IsTrue(in);
    if (begin_signed(a, req, node))
        goto out;
    memcpy(nd.id, node, 65);
    double now = now_s();
    nd.seen = now;
    int rc = a->st->ops->node_put(a->st->impl, &nd);
    if (rc == 0 && model) {
        rc = replan_if_idle(a, model, now, why, sizeof why);
        if (rc == -ENOENT) {
            snprintf(why, sizeof why, "model %s is not registered", model);
            rollback_err(a, req, 404, NULL, why);
            goto out;
        }
    }
    if (rc) {
        rollback_err(a, req, rc == -EIO ? 503 : 422, NULL, rc == -EIO ? a->st->err : why);
        goto out;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "node", node);
    commit_reply(a, req, 200, o);
out:
    cJSON_Delete(b);
}

/* Refuse a call that loaded a model's state: its rows freed, the transaction rolled back,
 * the refusal sent. */
static void state_refuse(struct kvd_market_api *a, struct net_http_req *req,
                         struct model_state *ms, int status, cJSON *extra, const char *why)
{
    kvd_market__model_clear(&ms->m);
    rollback_err(a, req, status, extra, why);
}

/* The state of the call's model (64 hex digits, checked by the caller) in the open
 * transaction: 0, or the refusal sent (404 for a model not registered, 503 for the store)
 * and the transaction rolled back. */
static int state_load(struct kvd_market_api *a, struct net_http_req *req, const char *model,
                      struct model_state *ms, double now)
{
    char why[128];
    int rc = model_state_load(a, model, ms, now);
    if (rc == -ENOENT) {
        snprintf(why, sizeof why, "model %s is not registered", model);
        rollback_err(a, req, 404, NULL, why);
    } else if (rc) {
        rollback_err(a, req, 503, NULL, a->st->err);
    }
    return rc;
}

/* The body of a call about a model's windows, and room for the model's state: the body
 * (caller deletes; *ms caller frees), or NULL with the refusal sent. */
static cJSON *body_and_state(struct net_http_req *req, struct model_state **ms)
{
    cJSON *b = body_json(req);
    if (!b)
        return NULL;
    if (!(*ms = calloc(1, sizeof **ms))) {
        cJSON_Delete(b);
        reply_err(req, 503, NULL, "out of memory");
        return NULL;
    }
    return b;
}

/* The lease request's model and window: 0 with ms loaded and *wi the window's index in it,
 * or the refusal sent and the transaction rolled back. */
static int lease_target(struct kvd_market_api *a, struct net_http_req *req, const cJSON *b,
                        struct model_state *ms, size_t *wi, double now)
{
    char why[256];
    const char *model = util_json_string(b, "model");
    uint64_t w;
    if (!model || !is_hex(model, 64, 64)) {
        rollback_err(a, req, 400, NULL, "model: expected 64 lowercase hex digits");
        return -EINVAL;
    }
    if (juint(b, "window", 0, 1e9, &w, why, sizeof why)) {
        rollback_err(a, req, 400, NULL, why);
        return -EINVAL;
    }
    int rc = state_load(a, req, model, ms, now);
    if (rc)
        return rc;
    for (size_t i = 0; i < ms->n; i++)
        if (ms->w[i].idx == w) {
            *wi = i;
            return 0;
        }
    snprintf(why, sizeof why, "window %llu does not exist (the model has %zu windows)",
             (unsigned long long)w, ms->n);
    cJSON *x = cJSON_CreateObject();
    cJSON_AddItemToObject(x, "free", free_windows(ms, NULL));
    state_refuse(a, req, ms, 404, x, why);
    return -ENOENT;
}

/* A call on one window's lease (claims, heartbeats): its body, the signer, the model's state
 * and the window's index in it. */
struct lease_call {
    cJSON *b;
    struct model_state *ms;
    size_t wi;
    double now;
    char node[65];
};

/* Start a lease call: the body (check, when not NULL, says why it is malformed: a 400), the
 * signature, the model's state, the window: 0, or the refusal sent. lease_call_end frees c
 * either way. */
static int lease_call_open(struct lease_call *c, struct kvd_market_api *a,
                           struct net_http_req *req, const char *(*check)(const cJSON *b))
{
    *c = (struct lease_call){0};
    if (!(c->b = body_and_state(req, &c->ms)))
        return -EINVAL;
    c->now = now_s();
    const char *bad = check ? check(c->b) : NULL;
    if (bad) {
        reply_err(req, 400, NULL, "%s", bad);
        return -EINVAL;
    }
    if (begin_signed(a, req, c->node) || lease_target(a, req, c->b, c->ms, &c->wi, c->now))
        return -EPERM;
    return 0;
}

/* lease_call_open for a call only the lease's live holder may make (a probe's or an audit's
 * answer): 0, or the refusal sent (409 when the caller holds no live lease on the window). */
static int lease_call_held(struct lease_call *c, struct kvd_market_api *a, struct net_http_req *req)
{
    char why[128];
    if (lease_call_open(c, a, req, NULL))
        return -EPERM;
    const struct kvd_market_lease *l = &c->ms->l[c->wi];
    int ls = c->ms->ls[c->wi];
    if (strcmp(l->node, c->node) || ls == L_FREE || ls == L_GRACE) {
        snprintf(why, sizeof why, "this node holds no lease on window %u", c->ms->w[c->wi].idx);
        state_refuse(a, req, c->ms, 409, NULL, why);
        return -EPERM;
    }
    return 0;
}

static void lease_call_end(struct lease_call *c)
{
    free(c->ms);
    cJSON_Delete(c->b);
}

/* ---- known-answer probes (docs/market.md, "Probes") ----
 * Blobs: "probes/<model>" the model's probe set (kvctl market add); "check/<model>/<window>"
 * the lease's checks: {"node", "next": the next spot check, "pending": {id, kind, seqs,
 * deadline}, "last": {kind, result, nmse, why, at}}; "penalty/<node>" {"until", "reason"}. */

/* The checks of the lease of node on window (a fresh record when the last was another
 * node's); key gets the blob's key. The caller deletes. */
static cJSON *checks_load(struct kvd_market_api *a, const char *model, uint32_t window,
                          const char *node, char key[100])
{
    snprintf(key, 100, "check/%s/%u", model, window);
    cJSON *c = blob_load(a, key);
    const char *n = util_json_string(c, "node");
    if (!n || strcmp(n, node)) {
        cJSON_Delete(c);
        c = cJSON_CreateObject();
        cJSON_AddStringToObject(c, "node", node);
    }
    return c;
}

/* When the next spot check of a lease probed now is due: 0.5 to 1.5 x spot_check_s away, so
 * a stage cannot tell when it comes. */
static double spot_next(const struct kvd_market_api *a, double now)
{
    uint32_t r = 0;
    RAND_bytes((unsigned char *)&r, sizeof r);
    return now + a->cfg.spot_check_s * (0.5 + r / 4294967296.0);
}

/* A challenge as the stage gets it: its kind, window and the seconds left to answer. */
static cJSON *challenge_tag(cJSON *ch, const char *kind, uint32_t window, double deadline_s)
{
    cJSON_AddStringToObject(ch, "kind", kind);
    cJSON_AddNumberToObject(ch, "window", window);
    cJSON_AddNumberToObject(ch, "deadline_s", deadline_s);
    return ch;
}

/* A challenge (kind "activation" or "spot") for node's lease on window [first, last), kept as
 * the lease's pending check: the challenge to send (caller deletes); NULL when the model has no
 * probe set (*rc 0) or the store failed (*rc < 0). */
static cJSON *probe_issue(struct kvd_market_api *a, const char *model, uint32_t window,
                          uint32_t first, uint32_t last, const char *node, const char *kind,
                          double now, int *rc)
{
    char key[100];
    snprintf(key, sizeof key, "probes/%s", model);
    *rc = 0;
    cJSON *set = blob_load(a, key);
    if (!set)
        return NULL;
    cJSON *seqs;
    cJSON *ch = kvd_market__probe_challenge(set, first, last, &seqs);
    cJSON_Delete(set);
    double deadline = now + a->cfg.reserve_s;
    cJSON *chk = checks_load(a, model, window, node, key);
    cJSON_DeleteItemFromObject(chk, "pending");
    cJSON *pd = cJSON_AddObjectToObject(chk, "pending");
    cJSON_AddStringToObject(pd, "id", util_json_string(ch, "id"));
    cJSON_AddStringToObject(pd, "kind", kind);
    cJSON_AddItemToObject(pd, "seqs", seqs);
    cJSON_AddNumberToObject(pd, "deadline", deadline);
    challenge_tag(ch, kind, window, deadline - now);
    *rc = blob_save(a, key, chk);
    cJSON_Delete(chk);
    if (*rc) {
        cJSON_Delete(ch);
        return NULL;
    }
    kvd_log(KVD_LOG_INFO, "probe %s (%s) of window %u of %.16s... sent to node %.16s...",
            util_json_string(ch, "id"), kind, window, model, node);
    return ch;
}

/* The lease's last check result, the pending one cleared. */
static void probe_record(cJSON *chk, const char *kind, bool pass, double nmse, const char *why,
                         double now)
{
    cJSON_DeleteItemFromObject(chk, "pending");
    cJSON_DeleteItemFromObject(chk, "last");
    cJSON *l = cJSON_AddObjectToObject(chk, "last");
    cJSON_AddStringToObject(l, "kind", kind);
    cJSON_AddStringToObject(l, "result", pass ? "pass" : "fail");
    if (isfinite(nmse))
        cJSON_AddNumberToObject(l, "nmse", nmse);
    if (why)
        cJSON_AddStringToObject(l, "why", why);
    cJSON_AddNumberToObject(l, "at", now);
}

/* A failed probe (a wrong answer, or none in time): the lease ends at once, with no grace
 * (the window shows uncovered and is free for anyone), the node's claims are refused for
 * penalty_s, and after a spot check its unpaid credit is voided. msg gets the reason the
 * node is told. 0, or the store's failure. */
static int probe_fail(struct kvd_market_api *a, const char *model, struct kvd_market_lease *l,
                      const char *kind, const char *why, double now, char *msg, size_t n)
{
    snprintf(msg, n, "window %u: %s probe failed: %s", l->window, kind, why);
    l->expires = now - a->cfg.grace_s - 1;
    int rc = a->st->ops->lease_put(a->st->impl, model, l);
    char key[80];
    snprintf(key, sizeof key, "penalty/%s", l->node);
    cJSON *p = cJSON_CreateObject();
    cJSON_AddNumberToObject(p, "until", now + a->cfg.penalty_s);
    cJSON_AddStringToObject(p, "reason", msg);
    if (rc == 0)
        rc = blob_save(a, key, p);
    cJSON_Delete(p);
    uint64_t lt = 0;
    double cr = 0;
    bool spot = strcmp(kind, "activation") != 0;   /* a spot check or an audit */
    if (rc == 0 && spot)
        rc = a->st->ops->credit_void(a->st->impl, l->node, now, msg, &lt, &cr);
    if (rc == 0 && spot)
        kvd_log(KVD_LOG_WARN, "node %.16s...: %s; lease ended, claims refused for %.0f s, unpaid "
                "credit voided (%llu layer-tokens, %g credit)", l->node, msg, a->cfg.penalty_s,
                (unsigned long long)lt, cr);
    else if (rc == 0)
        kvd_log(KVD_LOG_WARN, "node %.16s...: %s; lease ended, claims refused for %.0f s", l->node,
                msg, a->cfg.penalty_s);
    return rc;
}

/* A failed audit (docs/market.md, "Audits"): as a failed spot check (probe_fail, kind
 * "audit") on the node's lease of the model; a node that holds none any more loses its credit
 * and its claims all the same. msg gets the reason. 0, or the store's failure. */
static int audit_fail(struct kvd_market_api *a, const char *model, const char *node,
                      const char *why, double now, char *msg, size_t n)
{
    struct kvd_market_window w[KVD_MARKET_MAX_WINDOWS];
    size_t nw = 0;
    int rc = a->st->ops->windows_get(a->st->impl, model, w, KVD_MARKET_MAX_WINDOWS, &nw);
    for (size_t i = 0; rc == 0 && i < nw; i++) {
        struct kvd_market_lease l;
        if (a->st->ops->lease_get(a->st->impl, model, w[i].idx, &l) == 0 && !strcmp(l.node, node) &&
            lease_now(a, &l, now) != L_FREE)
            return probe_fail(a, model, &l, "audit", why, now, msg, n);
    }
    if (rc)
        return rc;
    snprintf(msg, n, "audit failed: %s", why);
    char key[80];
    snprintf(key, sizeof key, "penalty/%s", node);
    cJSON *p = cJSON_CreateObject();
    cJSON_AddNumberToObject(p, "until", now + a->cfg.penalty_s);
    cJSON_AddStringToObject(p, "reason", msg);
    rc = blob_save(a, key, p);
    cJSON_Delete(p);
    uint64_t lt = 0;
    double cr = 0;
    if (rc == 0)
        rc = a->st->ops->credit_void(a->st->impl, node, now, msg, &lt, &cr);
    if (rc == 0)
        kvd_log(KVD_LOG_WARN, "node %.16s...: %s; claims refused for %.0f s, unpaid credit voided "
                "(%llu layer-tokens, %g credit)", node, msg, a->cfg.penalty_s,
                (unsigned long long)lt, cr);
    return rc;
}

static int audit_verdict(void *ud, const char *model, const char *node, const char *why, double now)
{
    char msg[700];
    return audit_fail(ud, model, node, why, now, msg, sizeof msg);
}

/* The pending spot check of an active lease that ran past its deadline (failed: msg set,
 * returns 1), or a new one when due (*ch set), on a heartbeat. 0, 1, or the store's failure. */
static int spot_tick(struct kvd_market_api *a, const struct model_state *ms, size_t wi,
                     struct kvd_market_lease *l, double now, cJSON **ch, char *msg, size_t n)
{
    char key[100];
    *ch = NULL;
    snprintf(key, sizeof key, "check/%s/%u", ms->m.id, l->window);
    cJSON *chk = blob_load(a, key);
    const char *node = util_json_string(chk, "node");
    int rc = 0;
    if (!node || strcmp(node, l->node)) {
        cJSON_Delete(chk);   /* no probe set, or activated without one: nothing to check */
        return 0;
    }
    const cJSON *pd = cJSON_GetObjectItemCaseSensitive(chk, "pending");
    if (pd && now <= util_json_number(pd, "deadline", 0)) {
        /* not answered yet (its answer lost, say): the same probe again, same deadline */
        char pkey[80];
        snprintf(pkey, sizeof pkey, "probes/%s", ms->m.id);
        cJSON *set = blob_load(a, pkey);
        const char *id = util_json_string(pd, "id"), *kind = util_json_string(pd, "kind");
        if (set && id && kind)
            *ch = challenge_tag(kvd_market__probe_build(set, ms->w[wi].first, ms->w[wi].last,
                                                        cJSON_GetObjectItemCaseSensitive(pd, "seqs"), id),
                                kind, l->window, util_json_number(pd, "deadline", 0) - now);
        cJSON_Delete(set);
    } else if (pd) {
        const char *kind = util_json_string(pd, "kind");
        char k[16];
        snprintf(k, sizeof k, "%s", kind ? kind : "spot");
        probe_record(chk, k, false, INFINITY, "no answer before its deadline", now);
        rc = blob_save(a, key, chk);
        if (rc == 0)
            rc = probe_fail(a, ms->m.id, l, k, "no answer before its deadline", now, msg, n);
        rc = rc ? rc : 1;
    } else if (a->cfg.spot_check_s > 0 && now >= util_json_number(chk, "next", 0)) {
        *ch = probe_issue(a, ms->m.id, l->window, ms->w[wi].first, ms->w[wi].last, l->node, "spot",
                          now, &rc);
    }
    cJSON_Delete(chk);
    return rc;
}

/* POST /v1/leases/probe {"model", "window", "id", "outputs": [{"output": F16-BASE64} |
 * {"tokens": [...]}, ...]}: the stage's answer to the probe pending on its lease. Right: an
 * activation makes the lease active, a spot check changes nothing; both set the next spot
 * check. Wrong or late: 403 with the reason, the lease ended (probe_fail). */
static void h_probe(struct net_http_req *req, void *ud)
{
    struct kvd_market_api *a = ud;
    char why[512], msg[700], key[100];
    struct lease_call c;
    cJSON *chk = NULL, *set = NULL;
    if (lease_call_held(&c, a, req))
        goto out;
    struct kvd_market_lease *l = &c.ms->l[c.wi];
    chk = checks_load(a, c.ms->m.id, l->window, c.node, key);
    const cJSON *pd = cJSON_GetObjectItemCaseSensitive(chk, "pending");
    const char *id = util_json_string(c.b, "id"), *pid = util_json_string(pd, "id"), *kind = util_json_string(pd, "kind");
    if (!id || !pid || !kind || strcmp(id, pid)) {
        snprintf(why, sizeof why, "no probe %s is pending on this node's lease of window %u",
                 id ? id : "(no id)", l->window);
        state_refuse(a, req, c.ms, 409, NULL, why);
        goto out;
    }
    char pkey[80], k[16];
    snprintf(k, sizeof k, "%s", kind);
    snprintf(pkey, sizeof pkey, "probes/%s", c.ms->m.id);
    set = blob_load(a, pkey);
    if (!set) {
        state_refuse(a, req, c.ms, 503, NULL, "the model's probe set is gone");
        goto out;
    }
    double nmse = 0;
    bool late = c.now > util_json_number(pd, "deadline", 0);
    int rc = late ? -EBADMSG : kvd_market__probe_judge(set, c.ms->w[c.wi].last,
                                                        cJSON_GetObjectItemCaseSensitive(pd, "seqs"),
                                                        cJSON_GetObjectItemCaseSensitive(c.b, "outputs"),
                                                        &nmse, why, sizeof why);
    if (late)
        snprintf(why, sizeof why, "answered after its deadline");
    if (rc && rc != -EBADMSG) {
        state_refuse(a, req, c.ms, rc == -EINVAL ? 400 : 503, NULL, why);
        goto out;
    }
    probe_record(chk, k, rc == 0, nmse, rc ? why : NULL, c.now);
    cJSON *last = cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(chk, "last"), 1);
    if (rc == 0) {
        cJSON_DeleteItemFromObject(chk, "next");
        cJSON_AddNumberToObject(chk, "next", spot_next(a, c.now));
        if (!strcmp(k, "activation")) {
            l->state = KVD_LEASE_ACTIVE;
            l->since = -fabs(l->since);   /* active once: no fixed end from here on */
            l->expires = c.now + a->cfg.lease_s;
        }
    }
    int src = blob_save(a, key, chk);
    if (src == 0 && rc == 0)
        src = a->st->ops->lease_put(a->st->impl, c.ms->m.id, l);
    if (src == 0 && rc)
        src = probe_fail(a, c.ms->m.id, l, k, why, c.now, msg, sizeof msg);
    if (src) {
        cJSON_Delete(last);
        state_refuse(a, req, c.ms, 503, NULL, a->st->err);
        goto out;
    }
    cJSON *o;
    if (rc == 0) {
        kvd_log(KVD_LOG_INFO, "probe %s (%s) of window %u by node %.16s...: pass (NMSE %.3g)", id, k,
                l->window, c.node, nmse);
        o = lease_json(a, l, lease_now(a, l, c.now), c.now);
        cJSON_AddStringToObject(o, "model", c.ms->m.id);
    } else {
        o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "error", msg);
    }
    cJSON_AddItemToObject(o, "probe", last);
    kvd_market__model_clear(&c.ms->m);
    commit_reply(a, req, rc == 0 ? 200 : 403, o);
out:
    cJSON_Delete(chk);
    cJSON_Delete(set);
    lease_call_end(&c);
}

/* POST /v1/leases/audit {"model", "window", "id", "outputs", "inputs" | "token_ids"}: the
 * node's answer to the audit pending on it (docs/market.md, "Audits"). 202 while its rows are
 * recomputed (a wrong verdict ends the lease then), 200 when judged on its proofs alone; 403
 * with the reason when wrong (the lease is over, as for a failed spot check); 409 when no
 * such audit is pending, or the node's received side of the session is not in yet. */
static void h_audit(struct net_http_req *req, void *ud)
{
    struct kvd_market_api *a = ud;
    char why[512], msg[700];
    struct lease_call c;
    if (lease_call_held(&c, a, req))
        goto out;
    struct kvd_market_lease *l = &c.ms->l[c.wi];
    bool settled = false;
    int rc = kvd_market__audit_answer(a->audit, c.ms->m.id, c.node, c.b, c.now, &settled, why,
                                      sizeof why);
    if (rc == -EBADMSG && probe_fail(a, c.ms->m.id, l, "audit", why, c.now, msg, sizeof msg))
        rc = -EIO;
    if (rc && rc != -EBADMSG) {
        state_refuse(a, req, c.ms, rc == -EINVAL ? 400 : rc == -ENOENT || rc == -EAGAIN ? 409 : 503,
                     NULL, rc == -EIO ? a->st->err : why);
        goto out;
    }
    cJSON *o = cJSON_CreateObject();
    if (rc == 0)
        cJSON_AddStringToObject(o, "audit", settled ? "pass" : "verifying");
    else
        cJSON_AddStringToObject(o, "error", msg);
    kvd_market__model_clear(&c.ms->m);
    commit_reply(a, req, rc ? 403 : settled ? 200 : 202, o);
out:
    lease_call_end(&c);
}

/* POST /v1/claims {"model": ID, "window": W}: a reserved lease on a free window, the same one
 * again to its holder; 409 with the free windows when someone else holds it. */
/* When the reservation of window wi ends whatever its heartbeats say: the claim time plus
 * the time its window takes at the slowest pull rate the market accepts (at least reserve_s). */
static double reserve_end(const struct kvd_market_api *a, const struct model_state *ms, size_t wi,
                          const struct kvd_market_lease *l)
{
    if (l->since <= 0)   /* active before (a restarted stage probed again): no fixed end */
        return INFINITY;
    double t = (double)ms->w[wi].bytes / a->cfg.pull_min_rate;
    return l->since + (t > a->cfg.reserve_s ? t : a->cfg.reserve_s);
}

/* A reserved lease's next expiry: reserve_s on, never past its end. */
static double reserve_expiry(const struct kvd_market_api *a, const struct model_state *ms,
                             size_t wi, const struct kvd_market_lease *l, double now)
{
    double e = now + a->cfg.reserve_s, end = reserve_end(a, ms, wi, l);
    return e < end ? e : end;
}

/* Blobs of the claims' checks: "refuse/<model>/<window>/<node>" {until, why}: a node whose
 * reservation ran out may not claim that window again until then; "addr/<model>/<window>"
 * {node, addr, relay}: where the holder of the window claimed it from. */
static int refuse_put(struct kvd_market_api *a, const char *model, uint32_t window,
                      const struct kvd_market_lease *l)
{
    char key[KVD_MARKET_KEY_MAX];
    snprintf(key, sizeof key, "refuse/%s/%u/%s", model, window, l->node);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "until", l->expires + a->cfg.lapse_refuse_s);
    cJSON_AddNumberToObject(o, "lapsed", l->expires);
    int rc = blob_save(a, key, o);
    cJSON_Delete(o);
    return rc;
}

/* Whether node's reservation of the window ran out lately (why says so), from the lease row
 * when it is still node's, else from the blob kept when another node took the window. */
static bool lapse_refused(struct kvd_market_api *a, const struct model_state *ms, size_t wi,
                          const char *node, double now, char *why, size_t n)
{
    const struct kvd_market_lease *l = &ms->l[wi];
    double lapsed = 0, until = 0;
    if (!strcmp(l->node, node) && l->state == KVD_LEASE_RESERVED && ms->ls[wi] == L_FREE &&
        l->since > 0) {
        lapsed = l->expires;
        until = l->expires + a->cfg.lapse_refuse_s;
    } else {
        char key[KVD_MARKET_KEY_MAX];
        snprintf(key, sizeof key, "refuse/%s/%u/%s", ms->m.id, ms->w[wi].idx, node);
        cJSON *o = blob_load(a, key);
        lapsed = util_json_number(o, "lapsed", 0);
        until = util_json_number(o, "until", 0);
        cJSON_Delete(o);
    }
    if (now >= until)
        return false;
    snprintf(why, n, "this node's reservation of window %u ran out %.0f s ago without becoming "
             "active; it may claim that window again in %.0f s", ms->w[wi].idx, now - lapsed,
             until - now);
    return true;
}

/* How many windows of the model other than wi are held from addr by nodes of the same kind
 * (reached through a relay or not); -1 when the store failed. */
static int addr_held(struct kvd_market_api *a, const struct model_state *ms, size_t wi,
                     const char *addr, bool relay)
{
    int k = 0;
    for (size_t i = 0; i < ms->n; i++) {
        if (i == wi || (ms->ls[i] != L_RESERVED && ms->ls[i] != L_ACTIVE && ms->ls[i] != L_GRACE))
            continue;
        char key[KVD_MARKET_KEY_MAX];
        snprintf(key, sizeof key, "addr/%s/%u", ms->m.id, ms->w[i].idx);
        cJSON *o = blob_load(a, key);
        const char *on = util_json_string(o, "node"), *oa = util_json_string(o, "addr");
        if (on && oa && !strcmp(on, ms->l[i].node) && !strcmp(oa, addr) &&
            cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "relay")) == relay)
            k++;
        cJSON_Delete(o);
    }
    return k;
}

/* The admission of every lease call that takes something (a claim, a standby lease, a
 * takeover): the allowlist, the claim rate (rate: a new lease, not a renewal), the penalties.
 * 0, or the refusal sent (403, 429) with the transaction rolled back. */
static int admit_or_refuse(struct kvd_market_api *a, struct net_http_req *req, struct lease_call *c,
                           bool rate)
{
    char why[512];
    int status = 0;
    if (!kvd_market__admit_allowed(a->admit, c->node)) {
        snprintf(why, sizeof why, "node %.16s... is not on this market's admission allowlist", c->node);
        status = 403;
    } else if (rate && kvd_market__admit_claim(a->admit, c->node, net_http_req_addr(req), c->now,
                                               why, sizeof why)) {
        status = 429;
    } else if (kvd_market__penalized(a->st, c->node, c->now, why, sizeof why)) {
        status = 403;
    }
    if (status)
        state_refuse(a, req, c->ms, status, NULL, why);
    return status ? -EPERM : 0;
}

/* The caps on the ranks of a model one address holds (--max-ranks-per-addr, and
 * --max-ranks-per-relay-addr for nodes reached through a relay), for the caller taking window
 * c->wi: 0, or the 409 sent with the transaction rolled back. */
static int addr_cap_or_refuse(struct kvd_market_api *a, struct net_http_req *req,
                              struct lease_call *c, bool relay)
{
    char why[512];
    const char *addr = net_http_req_addr(req);
    uint32_t cap = relay ? a->cfg.max_ranks_relay_addr : a->cfg.max_ranks_addr;
    int held = cap ? addr_held(a, c->ms, c->wi, addr, relay) : 0;
    if (!cap || held < (int)cap)
        return 0;
    snprintf(why, sizeof why, "address %s already holds %d %s of this model (at most %u for "
             "nodes %s; kvd market %s)", addr, held, held == 1 ? "rank" : "ranks", cap,
             relay ? "reached through a relay" : "with a direct endpoint",
             relay ? "--max-ranks-per-relay-addr" : "--max-ranks-per-addr");
    state_refuse(a, req, c->ms, 409, NULL, why);
    return -EPERM;
}

static void h_claims(struct net_http_req *req, void *ud)
{
    struct kvd_market_api *a = ud;
    char why[512];
    struct lease_call c;
    if (lease_call_open(&c, a, req, NULL))
        goto out;
    int ls = c.ms->ls[c.wi];
    struct kvd_market_lease *l = &c.ms->l[c.wi];
    const char *addr = net_http_req_addr(req);
    bool relay = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c.b, "relay"));
    if (admit_or_refuse(a, req, &c, true))
        goto out;
    if (lapse_refused(a, c.ms, c.wi, c.node, c.now, why, sizeof why)) {
        /* that window only: the node may claim another one (kvd join does) */
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "refused_window", c.ms->w[c.wi].idx);
        state_refuse(a, req, c.ms, 403, x, why);
        goto out;
    }
    if (ls != L_FREE && strcmp(l->node, c.node)) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddItemToObject(x, "free", free_windows(c.ms, c.node));
        snprintf(why, sizeof why, "window %u is %s by node %.16s...", c.ms->w[c.wi].idx,
                 ls == L_GRACE ? "in its grace period, kept for" : "held", l->node);
        state_refuse(a, req, c.ms, 409, x, why);
        goto out;
    }
    for (size_t i = 0; i < c.ms->n; i++)
        if (i != c.wi && (c.ms->ls[i] == L_RESERVED || c.ms->ls[i] == L_ACTIVE) &&
            !strcmp(c.ms->l[i].node, c.node)) {
            snprintf(why, sizeof why, "this node already holds window %u of the model", c.ms->w[i].idx);
            state_refuse(a, req, c.ms, 409, NULL, why);
            goto out;
        }
    if (addr_cap_or_refuse(a, req, &c, relay))
        goto out;
    int status = 200;
    if (ls == L_RESERVED || ls == L_ACTIVE) {   /* its holder again: as good as a heartbeat */
        l->expires = ls == L_ACTIVE ? c.now + a->cfg.lease_s
                                    : reserve_expiry(a, c.ms, c.wi, l, c.now);
        if (a->st->ops->lease_put(a->st->impl, c.ms->m.id, l)) {
            state_refuse(a, req, c.ms, 503, NULL, a->st->err);
            goto out;
        }
    } else {   /* a new lease (or the same node back in its grace) */
        /* the node before whose reservation ran out: it may not take the window back soon */
        if (l->node[0] && strcmp(l->node, c.node) && l->state == KVD_LEASE_RESERVED &&
            l->since > 0 && refuse_put(a, c.ms->m.id, c.ms->w[c.wi].idx, l)) {
            state_refuse(a, req, c.ms, 503, NULL, a->st->err);
            goto out;
        }
        *l = (struct kvd_market_lease){.window = c.ms->w[c.wi].idx, .state = KVD_LEASE_RESERVED,
                                       .since = c.now};
        l->expires = reserve_expiry(a, c.ms, c.wi, l, c.now);
        memcpy(l->node, c.node, 65);
        char key[KVD_MARKET_KEY_MAX];
        snprintf(key, sizeof key, "addr/%s/%u", c.ms->m.id, c.ms->w[c.wi].idx);
        cJSON *ao = cJSON_CreateObject();
        cJSON_AddStringToObject(ao, "node", c.node);
        cJSON_AddStringToObject(ao, "addr", addr);
        cJSON_AddBoolToObject(ao, "relay", relay);
        int arc = blob_save(a, key, ao);
        cJSON_Delete(ao);
        /* a standby that claims a window gives its standby lease up */
        cJSON *sb = kvd_market__standby_get(a->st, c.ms->m.id, c.node, c.now);
        if (!arc && sb)
            arc = kvd_market__standby_put(a->st, c.ms->m.id, c.node, 0, NULL, 0, 0);
        cJSON_Delete(sb);
        if (arc || a->st->ops->lease_put(a->st->impl, c.ms->m.id, l)) {
            state_refuse(a, req, c.ms, 503, NULL, a->st->err);
            goto out;
        }
        ls = L_RESERVED;
        status = 201;
    }
    cJSON *o = lease_json(a, l, ls, c.now);
    cJSON_AddStringToObject(o, "model", c.ms->m.id);
    cJSON *ly = cJSON_CreateArray();
    cJSON_AddItemToArray(ly, cJSON_CreateNumber(c.ms->w[c.wi].first));
    cJSON_AddItemToArray(ly, cJSON_CreateNumber(c.ms->w[c.wi].last));
    cJSON_AddItemToObject(o, "layers", ly);
    cJSON_AddNumberToObject(o, "lease_s", a->cfg.lease_s);
    cJSON_AddNumberToObject(o, "reserve_s", a->cfg.reserve_s);
    if (l->state == KVD_LEASE_RESERVED && l->since > 0)
        cJSON_AddNumberToObject(o, "reserve_ends_in", reserve_end(a, c.ms, c.wi, l) - c.now);
    kvd_market__model_clear(&c.ms->m);
    commit_reply(a, req, status, o);
out:
    lease_call_end(&c);
}

/* "tcp://HOST:PORT" into host and port: 0 or -EINVAL. */
static int endpoint_split(const char *ep, char *host, size_t hn, int *port)
{
    if (strncmp(ep, "tcp://", 6))
        return -EINVAL;
    const char *h = ep + 6, *colon = strrchr(h, ':');
    if (!colon || colon == h || (size_t)(colon - h) >= hn)
        return -EINVAL;
    memcpy(host, h, (size_t)(colon - h));
    host[colon - h] = 0;
    uint64_t p;
    if (util_parse_u64(colon + 1, 1, 65535, 0, &p, NULL, 0) < 0)
        return -EINVAL;
    *port = (int)p;
    return 0;
}

/* A heartbeat's endpoint, when it has one: NULL when well formed, else why not. */
_Static_assert(KVD_MARKET_EP_MAX == 256, "endpoint_bad's message names the limit");
static const char *endpoint_bad(const cJSON *b)
{
    const char *ep = util_json_string(b, "endpoint");
    char host[256];
    int port;
    if (ep && (strlen(ep) >= KVD_MARKET_EP_MAX ||
               (strncmp(ep, "relay://", 8) && endpoint_split(ep, host, sizeof host, &port))))
        return "endpoint: expected tcp://HOST:PORT or relay://HOST:PORT/b/ID (at most 255 bytes)";
    return NULL;
}

/* A heartbeat's fields: its endpoint and the ring report (ringmap.c) well formed or absent. */
static const char *heartbeat_bad(const cJSON *b)
{
    const char *bad = endpoint_bad(b);
    return bad ? bad : kvd_market__report_bad(b);
}

/* Make the lease active (its endpoint answered): a transaction of its own, since the probe
 * ran between the heartbeat's arrival and now. */
static void activate(struct probe *p, const char *fail)
{
    struct kvd_market_api *a = p->a;
    struct net_http_req *req = p->req;
    p->answered = 1;
    if (fail) {
        reply_err(req, 409, NULL, "endpoint %s did not answer: %s", p->endpoint, fail);
        return;
    }
    double now = now_s();
    struct kvd_market_lease l;
    if (begin(a, req))
        return;
    if (a->st->ops->lease_get(a->st->impl, p->model, p->window, &l) || strcmp(l.node, p->node) ||
        lease_now(a, &l, now) == L_FREE || lease_now(a, &l, now) == L_GRACE) {
        rollback_err(a, req, 409, NULL, "the lease lapsed while its endpoint was checked: claim again");
        return;
    }
    snprintf(l.endpoint, sizeof l.endpoint, "%s", p->endpoint);
    /* With a probe set, the lease waits (reserved) for the stage's answer to a known-answer
     * probe (h_probe): also an active one whose endpoint changed, a new stage process that
     * must show its window again. */
    int rc = 0;
    cJSON *ch = a->cfg.probe ?
        probe_issue(a, p->model, p->window, p->first, p->last, p->node, "activation", now, &rc) : NULL;
    if (rc) {
        rollback_err(a, req, 503, NULL, a->st->err);
        return;
    }
    if (!ch) {
        l.state = KVD_LEASE_ACTIVE;
        l.since = -fabs(l.since);   /* active once: no fixed end from here on */
        l.expires = now + a->cfg.lease_s;
    } else {
        l.state = KVD_LEASE_RESERVED;
        l.expires = now + a->cfg.reserve_s;
    }
    if (a->st->ops->lease_put(a->st->impl, p->model, &l)) {
        cJSON_Delete(ch);
        rollback_err(a, req, 503, NULL, a->st->err);
        return;
    }
    cJSON *o = lease_json(a, &l, ch ? L_RESERVED : L_ACTIVE, now);
    cJSON_AddStringToObject(o, "model", p->model);
    if (ch)
        cJSON_AddItemToObject(o, "probe", ch);
    commit_reply(a, req, 200, o);
}

static void probe_closed(uv_handle_t *h)
{
    struct probe *p = h->data;
    if (++p->closing == 2)
        free(p);
}

static void probe_end(struct probe *p, const char *fail)
{
    if (!p->answered) {
        net_http_req_set_abort(p->req, NULL, NULL);
        activate(p, fail);
    }
    if (!uv_is_closing((uv_handle_t *)&p->tcp)) {
        uv_close((uv_handle_t *)&p->tcp, probe_closed);
        uv_close((uv_handle_t *)&p->timer, probe_closed);
    }
}

static void probe_connected(uv_connect_t *c, int status)
{
    struct probe *p = c->data;
    if (status == UV_ECANCELED)
        return;
    probe_end(p, status ? uv_strerror(status) : NULL);
}

static void probe_timeout(uv_timer_t *t)
{
    probe_end(t->data, "no answer within 3 s");
}

static void probe_abort(void *ud)
{
    struct probe *p = ud;
    p->answered = 1;   /* the client left: nothing to answer */
    probe_end(p, NULL);
}

/* POST /v1/leases/release {"model", "window"}: the caller gives its lease up; the window is free
 * at once, with no grace period (a node moving to another window, docs/market.md, "Moving"). */
static void h_release(struct net_http_req *req, void *ud)
{
    struct kvd_market_api *a = ud;
    char why[512];
    struct lease_call c;
    if (lease_call_open(&c, a, req, NULL))
        goto out;
    struct kvd_market_lease *l = &c.ms->l[c.wi];
    if (strcmp(l->node, c.node) || c.ms->ls[c.wi] == L_FREE) {
        snprintf(why, sizeof why, "this node holds no lease on window %u", c.ms->w[c.wi].idx);
        state_refuse(a, req, c.ms, 409, NULL, why);
        goto out;
    }
    l->expires = c.now - a->cfg.grace_s - 1;   /* past its grace: free for anyone */
    l->since = 0;                              /* given back, not run out */
    if (a->st->ops->lease_put(a->st->impl, c.ms->m.id, l)) {
        state_refuse(a, req, c.ms, 503, NULL, a->st->err);
        goto out;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", c.ms->m.id);
    cJSON_AddNumberToObject(o, "window", c.ms->w[c.wi].idx);
    cJSON_AddStringToObject(o, "state", "released");
    kvd_market__model_clear(&c.ms->m);
    commit_reply(a, req, 200, o);
out:
    lease_call_end(&c);
}

/* POST /v1/leases/heartbeat {"model", "window", "progress"?, "endpoint"?}: renew the caller's
 * lease; with an endpoint, a reserved lease becomes active once that endpoint accepts a
 * connection (docs/market.md, "Leases"). */
static void h_heartbeat(struct net_http_req *req, void *ud)
{
    struct kvd_market_api *a = ud;
    char why[512];
    struct lease_call c;
    if (lease_call_open(&c, a, req, heartbeat_bad))
        goto out;
    const char *ep = util_json_string(c.b, "endpoint");
    char host[256];
    int port = 0;
    if (ep && strncmp(ep, "relay://", 8))
        endpoint_split(ep, host, sizeof host, &port);   /* checked by endpoint_bad */
    struct kvd_market_lease *l = &c.ms->l[c.wi];
    int ls = c.ms->ls[c.wi];
    if (strcmp(l->node, c.node) || ls == L_FREE || ls == L_GRACE) {
        snprintf(why, sizeof why, "this node holds no lease on window %u%s", c.ms->w[c.wi].idx,
                 !strcmp(l->node, c.node) ? " (it lapsed: claim it again)" : "");
        state_refuse(a, req, c.ms, 409, NULL, why);
        goto out;
    }
    bool activating = ep && (l->state != KVD_LEASE_ACTIVE || strcmp(l->endpoint, ep));
    if (activating && ep && strncmp(ep, "relay://", 8)) {
        /* a node that claimed as relay-reached (counted under the relay cap) must stay so */
        char key[KVD_MARKET_KEY_MAX];
        snprintf(key, sizeof key, "addr/%s/%u", c.ms->m.id, c.ms->w[c.wi].idx);
        cJSON *ao = blob_load(a, key);
        bool relayed = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(ao, "relay")) &&
                       util_json_string(ao, "node") && !strcmp(util_json_string(ao, "node"), c.node);
        cJSON_Delete(ao);
        if (relayed) {
            snprintf(why, sizeof why, "window %u was claimed as reached through a relay; endpoint "
                     "%s is not a relay:// one", c.ms->w[c.wi].idx, ep);
            state_refuse(a, req, c.ms, 409, NULL, why);
            goto out;
        }
    }
    if (!activating)
        l->expires = l->state == KVD_LEASE_ACTIVE ? c.now + a->cfg.lease_s
                                                  : reserve_expiry(a, c.ms, c.wi, l, c.now);
    else
        l->expires = c.now + a->cfg.reserve_s;   /* alive while its endpoint is checked */
    if (a->st->ops->lease_put(a->st->impl, c.ms->m.id, l) ||
        kvd_market__report_save(a->st, c.ms->m.id, c.ms->w[c.wi].idx, c.node, c.b,
                                net_http_req_addr(req), c.now)) {
        state_refuse(a, req, c.ms, 503, NULL, a->st->err);
        goto out;
    }
    if (!activating) {
        cJSON *ch = NULL;
        char msg[700];
        int rc = a->cfg.probe && l->state == KVD_LEASE_ACTIVE ?
            spot_tick(a, c.ms, c.wi, l, c.now, &ch, msg, sizeof msg) : 0;
        if (rc < 0) {
            state_refuse(a, req, c.ms, 503, NULL, a->st->err);
            goto out;
        }
        /* an audit of credited work pending on the node (audit.c): sent until its deadline */
        cJSON *au = NULL;
        char awhy[512];
        if (rc == 0 && (rc = kvd_market__audit_due(a->audit, c.ms->m.id, c.node, c.now, &au, awhy,
                                                  sizeof awhy)) == 1)
            rc = probe_fail(a, c.ms->m.id, l, "audit", awhy, c.now, msg, sizeof msg) ? -EIO : 1;
        if (rc < 0) {
            cJSON_Delete(ch);
            state_refuse(a, req, c.ms, 503, NULL, a->st->err);
            goto out;
        }
        cJSON *o;
        if (rc == 1) {   /* a spot check or an audit went unanswered: the lease is over */
            o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "error", msg);
        } else {
            o = lease_json(a, l, lease_now(a, l, c.now), c.now);
            cJSON_AddStringToObject(o, "model", c.ms->m.id);
            if (ch)
                cJSON_AddItemToObject(o, "probe", ch);
            if (au)
                cJSON_AddItemToObject(o, "audit", au);
            au = ch = NULL;
        }
        cJSON_Delete(ch);
        cJSON_Delete(au);
        kvd_market__model_clear(&c.ms->m);
        commit_reply(a, req, rc == 1 ? 403 : 200, o);
        goto out;
    }
    if (a->st->ops->commit(a->st->impl)) {
        a->st->ops->rollback(a->st->impl);
        kvd_market__model_clear(&c.ms->m);
        reply_err(req, 503, NULL, "store: %s", a->st->err);
        goto out;
    }
    struct probe *p = calloc(1, sizeof *p);
    if (!p) {
        kvd_market__model_clear(&c.ms->m);
        reply_err(req, 503, NULL, "out of memory");
        goto out;
    }
    p->a = a;
    p->req = req;
    p->window = c.ms->w[c.wi].idx;
    p->first = c.ms->w[c.wi].first;
    p->last = c.ms->w[c.wi].last;
    memcpy(p->model, c.ms->m.id, 65);
    memcpy(p->node, c.node, 65);
    snprintf(p->endpoint, sizeof p->endpoint, "%s", ep);
    kvd_market__model_clear(&c.ms->m);
    struct sockaddr_storage sa;
    if (!a->cfg.probe || port == 0 ||
        (uv_ip4_addr(host, port, (struct sockaddr_in *)&sa) &&
         uv_ip6_addr(host, port, (struct sockaddr_in6 *)&sa))) {
        /* relay endpoints (no inbound to probe) and probing switched off: active at once */
        activate(p, NULL);
        free(p);
        goto out;
    }
    uv_tcp_init(a->loop, &p->tcp);
    uv_timer_init(a->loop, &p->timer);
    p->tcp.data = p->timer.data = p->conn.data = p;
    net_http_req_set_abort(req, probe_abort, p);
    uv_timer_start(&p->timer, probe_timeout, 3000, 0);
    int rc = uv_tcp_connect(&p->conn, &p->tcp, (struct sockaddr *)&sa, probe_connected);
    if (rc)
        probe_end(p, uv_strerror(rc));
out:
    lease_call_end(&c);
}

/* ---- standbys (standby.c; docs/market.md, "Standbys") ---- */

#define STANDBYS_PER_WINDOW 2   /* standby leases one window may have at a time */

/* A standby's call: its endpoint (tcp:// only: a standby is dialled by its predecessor),
 * the ring report, and "serving"/"manifest" when it says it took a rank over. */
static const char *standby_bad(const cJSON *b)
{
    const char *ep = util_json_string(b, "endpoint");
    if (ep && !strncmp(ep, "relay://", 8))
        return "endpoint: a standby is dialled by the rank before it; relay:// endpoints are not "
               "supported for standbys";
    const char *bad = heartbeat_bad(b);
    if (bad)
        return bad;
    const cJSON *sv = cJSON_GetObjectItemCaseSensitive(b, "serving");
    const char *man = util_json_string(b, "manifest");
    if (sv && (!cJSON_IsNumber(sv) || !man || !is_hex(man, 64, 64)))
        return "serving: expected the rank taken over, with manifest (its SHA-256)";
    return NULL;
}

/* A standby that took its window's rank over: made the window's holder once the market has
 * it from another node: the holder of the rank before reports its link to its successor up
 * to the standby's endpoint, and the old holder missed a heartbeat (or its lease lapsed). So a
 * standby cannot push a live holder out by saying it took over: that takes the predecessor's
 * holder lying with it. 200 {"holder": true}, 202 while unconfirmed, 409 when this is not the
 * ring or rank the standby lease is for. */
static void standby_took(struct kvd_market_api *a, struct net_http_req *req, struct lease_call *c,
                         const cJSON *mine)
{
    char why[512], hash[65];
    size_t wi = c->wi;
    uint32_t idx = c->ms->w[wi].idx;
    struct kvd_market_lease *l = &c->ms->l[wi];
    int ls = c->ms->ls[wi];
    const char *man_sha = util_json_string(c->b, "manifest");
    double rank = util_json_number(c->b, "serving", -1);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", c->ms->m.id);
    cJSON_AddNumberToObject(o, "window", idx);
    if (!strcmp(l->node, c->node) && (ls == L_ACTIVE || ls == L_RESERVED)) {
        cJSON_AddBoolToObject(o, "holder", true);   /* recorded before: as good as a heartbeat */
        cJSON_AddNumberToObject(o, "lease_s", a->cfg.lease_s);
        kvd_market__model_clear(&c->ms->m);
        commit_reply(a, req, 200, o);
        return;
    }
    cJSON_Delete(o);
    if (!mine || util_json_number(mine, "window", -1) != (double)idx) {
        snprintf(why, sizeof why, "this node holds no standby lease on window %u", idx);
        state_refuse(a, req, c->ms, 409, NULL, why);
        return;
    }
    /* the ring the market serves: its manifest now, or, while the dead holder's lease is in
     * its grace (no complete ring), the last one published, which the ring still runs */
    char *man = manifest_of(c->ms, hash);
    bool have = man != NULL;
    free(man);
    if (!have) {
        char key[KVD_MARKET_KEY_MAX];
        snprintf(key, sizeof key, "genlast/%s", c->ms->m.id);
        cJSON *gl = blob_load(a, key);
        snprintf(hash, sizeof hash, "%s", util_json_string(gl, "sha") ? util_json_string(gl, "sha") : "");
        cJSON_Delete(gl);
        have = hash[0] && ls != L_ACTIVE && ls != L_RESERVED;
        for (size_t i = 0; have && i < c->ms->n; i++)
            have = i == wi || c->ms->ls[i] == L_ACTIVE;
    }
    if (!have || strcmp(hash, man_sha) || rank != (double)wi || wi == 0) {
        snprintf(why, sizeof why, "rank %.0f of manifest %.16s... is not window %u of the ring "
                 "this market serves (manifest %.16s...)", rank, man_sha, idx, have ? hash : "none");
        state_refuse(a, req, c->ms, 409, NULL, why);
        return;
    }
    /* the claim's rules hold for a takeover too */
    if (admit_or_refuse(a, req, c, false) || addr_cap_or_refuse(a, req, c, false))
        return;
    /* the holder's last heartbeat renewed its lease for lease_s; it beats every lease_s / 4,
     * so one silent for half a lease and 2 s has missed a heartbeat (as the map's "silent") */
    double beat_age = c->now - (l->expires - a->cfg.lease_s);
    bool missed = ls != L_ACTIVE || lease_silent(a, c->ms, wi, c->now);
    /* the predecessor's last report: its out link up to the standby's endpoint */
    const struct kvd_market_lease *pl = &c->ms->l[wi - 1];
    cJSON *rep = kvd_market__report_load(a->st, c->ms->m.id, pl->window, pl->node, hash, c->now,
                                         a->cfg.lease_s);
    const cJSON *lk = cJSON_GetObjectItemCaseSensitive(rep, "links");
    const char *peer = util_json_string(lk, "out_peer"), *sep = util_json_string(mine, "endpoint");
    bool seen = peer && sep && !strncmp(sep, "tcp://", 6) && !strcmp(peer, sep + 6) &&
                !strcmp(util_json_string(lk, "out") ? util_json_string(lk, "out") : "", "up");
    cJSON_Delete(rep);
    if (!missed || !seen) {
        o = cJSON_CreateObject();
        if (!seen)
            snprintf(why, sizeof why, "the holder of window %u (rank %zu) does not report its "
                     "link to its successor up to %s yet", pl->window, wi - 1, sep ? sep : "-");
        else
            snprintf(why, sizeof why, "the holder of window %u (node %.16s...) heartbeated %.1f s "
                     "ago; the takeover is recorded once it misses a heartbeat", idx, l->node,
                     beat_age);
        cJSON_AddStringToObject(o, "pending", why);
        kvd_market__model_clear(&c->ms->m);
        commit_reply(a, req, 202, o);
        return;
    }
    const char *mnode = c->ms->took_sha[wi][0] ? c->ms->mnode[wi] : l->node;
    const char *mep = c->ms->took_sha[wi][0] ? c->ms->mendpoint[wi] : l->endpoint;
    char old[65];
    snprintf(old, sizeof old, "%s", l->node);
    struct kvd_market_lease nl = {.window = idx, .state = KVD_LEASE_ACTIVE, .since = -c->now,
                                  .expires = c->now + a->cfg.lease_s};
    memcpy(nl.node, c->node, 65);
    snprintf(nl.endpoint, sizeof nl.endpoint, "%s", util_json_string(mine, "endpoint") ?
             util_json_string(mine, "endpoint") : "");
    char key[KVD_MARKET_KEY_MAX];
    snprintf(key, sizeof key, "addr/%s/%u", c->ms->m.id, idx);
    cJSON *ao = cJSON_CreateObject();
    cJSON_AddStringToObject(ao, "node", c->node);
    cJSON_AddStringToObject(ao, "addr", net_http_req_addr(req));
    cJSON_AddBoolToObject(ao, "relay", false);
    /* never probed for this window as its holder: a spot check at its first heartbeat */
    char pkey[KVD_MARKET_KEY_MAX], ckey[100];
    snprintf(pkey, sizeof pkey, "probes/%s", c->ms->m.id);
    cJSON *probes = blob_load(a, pkey), *chk = cJSON_CreateObject();
    cJSON_AddStringToObject(chk, "node", c->node);
    cJSON_AddNumberToObject(chk, "next", 0);
    snprintf(ckey, sizeof ckey, "check/%s/%u", c->ms->m.id, idx);
    int rc = probes ? blob_save(a, ckey, chk) : 0;
    cJSON_Delete(probes);
    cJSON_Delete(chk);
    if (!rc)
        rc = kvd_market__took_save(a->st, c->ms->m.id, idx, c->node, hash, mnode, mep, c->now);
    if (!rc)
        rc = kvd_market__gen_took(a->st, hash, (uint32_t)wi, c->node);
    if (!rc)
        rc = a->st->ops->lease_put(a->st->impl, c->ms->m.id, &nl);
    if (!rc)
        rc = kvd_market__standby_put(a->st, c->ms->m.id, c->node, idx, NULL, 0, 0);
    if (!rc)
        rc = blob_save(a, key, ao);
    cJSON_Delete(ao);
    if (rc) {
        state_refuse(a, req, c->ms, 503, NULL, rc == -ENOSPC ? "this rank was taken over too "
                     "often in this ring generation" : a->st->err);
        return;
    }
    kvd_log(KVD_LOG_INFO, "model %.16s...: standby %.16s... took rank %zu (window %u) over from "
            "node %.16s... in ring generation %.16s...", c->ms->m.id, c->node, wi, idx, old, hash);
    o = lease_json(a, &nl, L_ACTIVE, c->now);
    cJSON_AddStringToObject(o, "model", c->ms->m.id);
    cJSON_AddBoolToObject(o, "holder", true);
    cJSON_AddNumberToObject(o, "lease_s", a->cfg.lease_s);
    kvd_market__model_clear(&c->ms->m);
    commit_reply(a, req, 200, o);
}

/* POST /v1/standbys {"model", "window", "endpoint"?}: take or renew a standby lease on a
 * covered window (docs/market.md, "Standbys"); with "serving": RANK and "manifest", the
 * standby says it took that rank over (standby_took). A standby lease lives lease_s past its
 * last call, like a lease; with an endpoint (once its window is pulled and it listens) it is
 * named in the ring's roster. */
static void h_standbys(struct net_http_req *req, void *ud)
{
    struct kvd_market_api *a = ud;
    char why[512];
    struct lease_call c;
    if (lease_call_open(&c, a, req, standby_bad))
        goto out;
    uint32_t idx = c.ms->w[c.wi].idx;
    cJSON *mine = kvd_market__standby_get(a->st, c.ms->m.id, c.node, c.now);
    if (cJSON_GetObjectItemCaseSensitive(c.b, "serving")) {
        standby_took(a, req, &c, mine);
        cJSON_Delete(mine);
        goto out;
    }
    bool renew = mine && util_json_number(mine, "window", -1) == (double)idx;
    double since = renew ? util_json_number(mine, "since", c.now) : c.now;
    cJSON_Delete(mine);
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c.b, "release"))) {   /* given back */
        if (!renew) {
            snprintf(why, sizeof why, "this node holds no standby lease on window %u", idx);
            state_refuse(a, req, c.ms, 409, NULL, why);
            goto out;
        }
        if (kvd_market__standby_put(a->st, c.ms->m.id, c.node, idx, NULL, 0, 0)) {
            state_refuse(a, req, c.ms, 503, NULL, a->st->err);
            goto out;
        }
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "model", c.ms->m.id);
        cJSON_AddNumberToObject(o, "window", idx);
        cJSON_AddStringToObject(o, "state", "released");
        kvd_market__model_clear(&c.ms->m);
        commit_reply(a, req, 200, o);
        goto out;
    }
    for (size_t i = 0; i < c.ms->n; i++)
        if ((c.ms->ls[i] == L_RESERVED || c.ms->ls[i] == L_ACTIVE) && !strcmp(c.ms->l[i].node, c.node)) {
            snprintf(why, sizeof why, "this node holds window %u of the model: a holder is no "
                     "standby", c.ms->w[i].idx);
            state_refuse(a, req, c.ms, 409, NULL, why);
            goto out;
        }
    /* the same admission as a claim, on every call (a node penalized meanwhile loses it) */
    if (admit_or_refuse(a, req, &c, !renew))
        goto out;
    if (!renew) {
        if (c.ms->ls[c.wi] != L_ACTIVE || c.wi == 0 || c.wi + 1 == c.ms->n) {
            cJSON *x = cJSON_CreateObject();
            cJSON_AddItemToObject(x, "free", free_windows(c.ms, c.node));
            /* rank 0 holds the sessions' history; the last rank's TOKEN frames before a break
             * cannot be made again by a replacement, so its receipts would not match rank 0's */
            snprintf(why, sizeof why, c.wi == 0 ? "window %u is rank 0's, which holds the "
                     "sessions' history and has no standby" : c.wi + 1 == c.ms->n ? "window %u "
                     "is the last rank's, which has no standby (a replacement cannot attest the "
                     "tokens sampled before the break)" : "window %u has no active stage to "
                     "stand by for: claim it", idx);
            state_refuse(a, req, c.ms, 409, x, why);
            goto out;
        }
        cJSON *live = kvd_market__standby_list(a->st, c.ms->m.id, c.now);
        if (!live) {
            state_refuse(a, req, c.ms, 503, NULL, a->st->err);
            goto out;
        }
        int on = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, live)
            on += util_json_number(e, "window", -1) == (double)idx;
        cJSON_Delete(live);
        if (on >= STANDBYS_PER_WINDOW) {
            snprintf(why, sizeof why, "window %u has %d standbys already (at most %d)", idx, on,
                     STANDBYS_PER_WINDOW);
            state_refuse(a, req, c.ms, 409, NULL, why);
            goto out;
        }
    }
    const char *ep = util_json_string(c.b, "endpoint");
    if (kvd_market__standby_put(a->st, c.ms->m.id, c.node, idx, ep, since, c.now + a->cfg.lease_s)) {
        state_refuse(a, req, c.ms, 503, NULL, a->st->err);
        goto out;
    }
    char hash[65];
    char *man = manifest_of(c.ms, hash);
    bool have = man != NULL;
    free(man);
    cJSON *o = cJSON_CreateObject(), *ly = cJSON_CreateArray();
    cJSON_AddStringToObject(o, "model", c.ms->m.id);
    cJSON_AddNumberToObject(o, "window", idx);
    cJSON_AddStringToObject(o, "state", "standby");
    cJSON_AddItemToArray(ly, cJSON_CreateNumber(c.ms->w[c.wi].first));
    cJSON_AddItemToArray(ly, cJSON_CreateNumber(c.ms->w[c.wi].last));
    cJSON_AddItemToObject(o, "layers", ly);
    cJSON_AddNumberToObject(o, "rank", (double)c.wi);
    cJSON_AddNumberToObject(o, "lease_s", a->cfg.lease_s);
    if (have)
        cJSON_AddStringToObject(o, "manifest", hash);
    kvd_market__model_clear(&c.ms->m);
    commit_reply(a, req, renew ? 200 : 201, o);
out:
    lease_call_end(&c);
}

/* GET /v1/models/<id>/roster: the standbys of the ring the market serves now (standby.c), for
 * its stages to accept as a rank's node: {"manifest", "standby": [{node, endpoint, ranks}]}.
 * 404 while there is no ring. */
static void roster_get(struct kvd_market_api *a, struct net_http_req *req, const char *id)
{
    double now = now_s();
    struct model_state *ms = calloc(1, sizeof *ms);
    if (!ms) {
        reply_err(req, 503, NULL, "out of memory");
        return;
    }
    int rc = model_state_load(a, id, ms, now);
    if (rc) {
        free(ms);
        reply_err(req, rc == -ENOENT ? 404 : 503, NULL, rc == -ENOENT ? "model %s is not registered"
                  : "store: %s", rc == -ENOENT ? id : a->st->err);
        return;
    }
    char hash[65];
    char *man = manifest_of(ms, hash);
    bool have = man != NULL;
    free(man);
    bool took[KVD_MARKET_MAX_WINDOWS];
    for (size_t i = 0; i < ms->n; i++)
        took[i] = !strcmp(ms->took_sha[i], hash);
    cJSON *r = have ? kvd_market__roster(a->st, id, hash, ms->l, took, ms->n, now) : NULL;
    kvd_market__model_clear(&ms->m);
    free(ms);
    if (!r) {
        reply_err(req, have ? 503 : 404, NULL, have ? "store: %s" : "model %.16s... has no ring now",
                  have ? a->st->err : id);
        return;
    }
    char *text = cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    if (!text) {
        reply_err(req, 503, NULL, "out of memory");
        return;
    }
    net_http_reply(req, 200, "application/json", "Cache-Control: no-store\r\n", text, strlen(text));
    free(text);
}

/* POST /v1/receipts {"model", "manifest", "session", "rank", "tokens": [t0, t1], "side":
 * "sent"|"received", "digest"} or, from rank 0, {..., "side": "open", "tokens": [0, T],
 * "client", "proof"}: one signature of a session's receipt, from the node that held the
 * signing rank in the ring generation (manifest) the session ran on. The session is settled
 * (ledger.c) as its sides come in. */
static void h_receipts(struct net_http_req *req, void *ud)
{
    struct kvd_market_api *a = ud;
    char node[65], why[512], key[65];
    cJSON *b = body_json(req);
    if (!b)
        return;
    struct kvd_market_receipt r = {0};
    const char *model = util_json_string(b, "model"), *session = util_json_string(b, "session"), *digest = util_json_string(b, "digest");
    const char *side = util_json_string(b, "side"), *man = util_json_string(b, "manifest");
    const char *client = util_json_string(b, "client"), *proof = util_json_string(b, "proof");
    const cJSON *tk = cJSON_GetObjectItemCaseSensitive(b, "tokens");
    uint64_t rank;
    double now = now_s();
    struct kvd_market_gen g;
    struct kvd_market_client cl;
    if (!model || !is_hex(model, 64, 64) || !session || !is_hex(session, 16, 64) || !man ||
        !is_hex(man, 64, 64) || !side ||
        (strcmp(side, "sent") && strcmp(side, "received") && strcmp(side, "open"))) {
        reply_err(req, 400, NULL, "a receipt needs model (64 hex), manifest (the ring generation's "
                  "SHA-256, 64 hex), session (16-64 hex) and side (sent, received or open)");
        goto out;
    }
    r.side = !strcmp(side, "sent") ? KVD_SIDE_SENT : !strcmp(side, "received") ? KVD_SIDE_RECEIVED
                                                                                : KVD_SIDE_OPEN;
    if (r.side != KVD_SIDE_OPEN ? !digest || !is_hex(digest, 64, 64)
                                : !client || !is_hex(client, 64, 64) || !proof || !is_hex(proof, 64, 64)) {
        reply_err(req, 400, NULL, r.side != KVD_SIDE_OPEN ? "digest: expected 64 hex digits"
                  : "an open side needs client (the client's id, 64 hex) and proof (64 hex)");
        goto out;
    }
    if (juint(b, "rank", 0, KVD_MARKET_MAX_WINDOWS - 1, &rank, why, sizeof why)) {
        reply_err(req, 400, NULL, "%s", why);
        goto out;
    }
    if (!cJSON_IsArray(tk) || cJSON_GetArraySize(tk) != 2 ||
        !cJSON_IsNumber(tk->child) || !cJSON_IsNumber(tk->child->next) ||
        !(tk->child->valuedouble >= 0) || !(tk->child->next->valuedouble > tk->child->valuedouble) ||
        tk->child->next->valuedouble > SESSION_TOKENS_MAX ||
        tk->child->valuedouble != floor(tk->child->valuedouble) ||
        tk->child->next->valuedouble != floor(tk->child->next->valuedouble)) {
        reply_err(req, 400, NULL, "tokens: expected [first, last) whole numbers, first < last <= %.0f",
                  SESSION_TOKENS_MAX);
        goto out;
    }
    snprintf(r.model, sizeof r.model, "%s", model);
    snprintf(r.session, sizeof r.session, "%s", session);
    snprintf(r.digest, sizeof r.digest, "%s", r.side == KVD_SIDE_OPEN ? proof : digest);
    r.rank = (uint32_t)rank;
    r.t0 = (uint64_t)tk->child->valuedouble;
    r.t1 = (uint64_t)tk->child->next->valuedouble;
    if (r.side == KVD_SIDE_OPEN && (r.rank != 0 || r.t0 != 0)) {
        reply_err(req, 400, NULL, "an open side is rank 0's, for tokens [0, T)");
        goto out;
    }
    if (begin_signed(a, req, node))
        goto out;
    memcpy(r.node, node, 65);
    /* the ring generation: only a manifest the market published has sessions that count */
    int rc = kvd_market__gen_load(a->st, man, &g);
    if (rc == -ENOENT || (rc == 0 && strcmp(g.model, model))) {
        rollback_errf(a, req, 404, "manifest %.16s... is no ring generation of model %.16s... that "
                 "this market published", man, model);
        goto out;
    }
    if (rc) {
        rollback_err(a, req, 503, NULL, a->st->err);
        goto out;
    }
    if (rank >= g.n) {
        rollback_errf(a, req, 404, "rank %llu does not exist (ring generation %.16s... has %zu ranks)",
                 (unsigned long long)rank, man, g.n);
        goto out;
    }
    /* who may sign: the rank's node sends (and rank 0 opens); the next rank (rank 0 after the
     * last) receives; whoever held that rank in that generation, whatever it holds now */
    size_t signer = r.side == KVD_SIDE_RECEIVED ? (rank + 1) % g.n : rank;
    if (!kvd_market__gen_may_sign(&g, signer, node)) {
        rollback_errf(a, req, 403, "node %.16s... did not hold rank %zu, whose %s side this is, in "
                 "ring generation %.16s... (node %.16s... did)", node, signer, side, man,
                 g.node[signer]);
        goto out;
    }
    if (r.side == KVD_SIDE_OPEN) {   /* a paying client opened it: rank 0 holds the client's key */
        rc = kvd_market__client_get(a->st, client, &cl);
        if (rc == -ENOENT) {
            rollback_errf(a, req, 403, "client %.16s... is not known to this market", client);
            goto out;
        }
        char want[65];
        if (rc == 0)
            ring_client_proof(cl.verifier, model, man, session, r.t1, want);
        if (rc == 0 && CRYPTO_memcmp(want, proof, 64)) {
            rollback_errf(a, req, 403, "the proof does not bind session %s to client %.16s...: rank 0 "
                     "must hold the client's key", session, client);
            goto out;
        }
        if (rc) {
            rollback_err(a, req, 503, NULL, a->st->err);
            goto out;
        }
    }
    kvd_market__session_key(model, man, session, key);
    struct kvd_market_receipt kr = r;   /* the receipts table keys sessions by the ledger's key */
    memcpy(kr.session, key, 65);
    rc = a->st->ops->receipt_put(a->st->impl, &kr);
    if (rc == 0 && r.side == KVD_SIDE_OPEN) {   /* one client request more for the demand */
        struct kvd_market_model m;
        if ((rc = a->st->ops->model_get(a->st->impl, model, &m)) == 0) {
            double d = kvd_market__demand_now(&a->cfg, &m, now) + 60.0 / a->cfg.demand_tau_s;
            rc = a->st->ops->model_demand_set(a->st->impl, model, d, now);
            kvd_market__model_clear(&m);
        }
    }
    struct kvd_market_settled set = {0};
    if (rc == 0)
        rc = kvd_market__session_submit(a->st, &a->cfg, &r, man, key, client, now, on_paid, a, &set);
    if (rc == -EEXIST) {
        rollback_err(a, req, 409, NULL, "this side of the session's receipt was submitted before");
        goto out;
    }
    if (rc) {
        rollback_err(a, req, 503, NULL, a->st->err);
        goto out;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", !set.opened ? "waiting for rank 0's open side (a session "
                            "no client opened is never paid)" : set.done ? "settled" :
                            set.ranks_paid ? "credited" : "waiting for the ring's other sides");
    cJSON_AddBoolToObject(o, "credited", set.ranks_paid > 0);
    cJSON_AddNumberToObject(o, "ranks_paid", set.ranks_paid);
    cJSON_AddNumberToObject(o, "layer_tokens", (double)set.layer_tokens);
    cJSON_AddNumberToObject(o, "credit", set.credit);
    commit_reply(a, req, 200, o);
out:
    cJSON_Delete(b);
}

/* ---- clients (docs/market.md, "Clients") ---- */

static cJSON *client_json(const struct kvd_market_client *c)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "client", c->id);
    cJSON_AddStringToObject(o, "name", c->name);
    cJSON_AddNumberToObject(o, "balance", c->balance);
    cJSON_AddNumberToObject(o, "spent", c->spent);
    return o;
}

/* Begin a call only operators may make: 0 with node set, or the refusal sent. */
static int begin_operator(struct kvd_market_api *a, struct net_http_req *req, char node[65],
                          const char *what)
{
    if (begin_signed(a, req, node))
        return -EPERM;
    if (kvd_market__admit_operator(a->admit, node))
        return 0;
    char why[256];
    snprintf(why, sizeof why, "only the market's operators (kvd market --operator-key) may %s; node "
             "%.16s... is none", what, node);
    rollback_err(a, req, 403, NULL, why);
    return -EPERM;
}

/* A credit amount member: 0, or the 400 sent. */
static int credit_arg(struct net_http_req *req, const cJSON *b, double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(b, "credit");
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble <= 1e15)) {
        reply_err(req, 400, NULL, "credit: expected a number from 0 to 1e15");
        return -EINVAL;
    }
    *out = v->valuedouble;
    return 0;
}

/* POST /v1/clients {"client": ID, "verifier": HEX, "credit": N, "name"?: S}, by an operator:
 * a paying client's account (kvctl market client add made the key and sends only its id and
 * verifier). 201, 409 when the id is taken. */
static void h_clients_post(struct net_http_req *req, void *ud)
{
    struct kvd_market_api *a = ud;
    char node[65];
    cJSON *b = body_json(req);
    if (!b)
        return;
    struct kvd_market_client c = {0}, old;
    const char *id = util_json_string(b, "client"), *v = util_json_string(b, "verifier"), *name = util_json_string(b, "name");
    if (!id || !is_hex(id, 64, 64) || !v || !is_hex(v, 64, 64) || util_hex_decode(v, c.verifier, 32) ||
        (name && strlen(name) > 127)) {
        reply_err(req, 400, NULL, "a client needs client (its id, 64 hex), verifier (64 hex) and "
                  "credit; name at most 127 bytes");
        goto out;
    }
    if (credit_arg(req, b, &c.balance) || begin_operator(a, req, node, "add clients"))
        goto out;
    snprintf(c.id, sizeof c.id, "%s", id);
    snprintf(c.name, sizeof c.name, "%s", name ? name : "");
    c.created = now_s();
    int rc = kvd_market__client_get(a->st, id, &old);
    if (rc == 0) {
        rollback_err(a, req, 409, NULL, "a client with that id exists");
        goto out;
    }
    if ((rc == -ENOENT ? kvd_market__client_put(a->st, &c) : rc)) {
        rollback_err(a, req, 503, NULL, a->st->err);
        goto out;
    }
    kvd_log(KVD_LOG_INFO, "client %.16s... (%s) added by operator %.16s... with credit %g", id, c.name,
            node, c.balance);
    commit_reply(a, req, 201, client_json(&c));
out:
    cJSON_Delete(b);
}

/* GET /v1/clients: {"payable": [ids]}, the clients whose balance is above zero (what a ring's
 * API lets in); GET /v1/clients/<id>: the account. */
static void h_clients_get(struct net_http_req *req, void *ud)
{
    struct kvd_market_api *a = ud;
    const char *p = net_http_req_path(req);
    struct kvd_market_client c;
    if (!strcmp(p, "/v1/clients")) {
        char (*keys)[KVD_MARKET_KEY_MAX] = malloc(RING_CLIENTS_LIST_MAX * sizeof *keys);
        size_t n = 0;
        if (!keys || a->st->ops->blob_keys(a->st->impl, "client/", keys, RING_CLIENTS_LIST_MAX, &n)) {
            free(keys);
            reply_err(req, 503, NULL, "store: %s", keys ? a->st->err : "out of memory");
            return;
        }
        cJSON *o = cJSON_CreateObject(), *ids = cJSON_AddArrayToObject(o, "payable");
        for (size_t i = 0; i < n; i++)
            if (kvd_market__client_get(a->st, keys[i] + strlen("client/"), &c) == 0 && c.balance > 0)
                cJSON_AddItemToArray(ids, cJSON_CreateString(c.id));
        free(keys);
        reply_json(req, 200, o);
        return;
    }
    p += strlen("/v1/clients/");
    if (strlen(p) != 64 || !is_hex(p, 64, 64)) {
        reply_err(req, 404, NULL, "expected /v1/clients/<client id, 64 hex>");
        return;
    }
    int rc = kvd_market__client_get(a->st, p, &c);
    if (rc == -ENOENT)
        reply_err(req, 404, NULL, "client %.16s... is not known to this market", p);
    else if (rc)
        reply_err(req, 503, NULL, "store: %s", a->st->err);
    else
        reply_json(req, 200, client_json(&c));
}

/* POST /v1/clients/<id>/credit {"credit": N}, by an operator: add to the client's balance. */
static void h_client_credit(struct net_http_req *req, void *ud)
{
    struct kvd_market_api *a = ud;
    char node[65], id[65];
    const char *p = net_http_req_path(req) + strlen("/v1/clients/");
    double add;
    cJSON *b = body_json(req);
    if (!b)
        return;
    if (strlen(p) != 64 + strlen("/credit") || strcmp(p + 64, "/credit")) {
        reply_err(req, 404, NULL, "expected /v1/clients/<client id>/credit");
        goto out;
    }
    memcpy(id, p, 64);
    id[64] = 0;
    struct kvd_market_client c;
    if (!is_hex(id, 64, 64) || credit_arg(req, b, &add) ||
        begin_operator(a, req, node, "credit clients"))
        goto out;
    int rc = kvd_market__client_get(a->st, id, &c);
    if (rc == -ENOENT) {
        rollback_err(a, req, 404, NULL, "no such client");
        goto out;
    }
    c.balance += add;
    if (rc || kvd_market__client_put(a->st, &c)) {
        rollback_err(a, req, 503, NULL, a->st->err);
        goto out;
    }
    commit_reply(a, req, 200, client_json(&c));
out:
    cJSON_Delete(b);
}

/* GET /v1/nodes/<id>/balance -> {"node", "layer_tokens", "credit"} */
static void h_node_get(struct net_http_req *req, void *ud)
{
    struct kvd_market_api *a = ud;
    const char *p = net_http_req_path(req) + strlen("/v1/nodes/");
    char id[65];
    if (strlen(p) != 64 + strlen("/balance") || strcmp(p + 64, "/balance")) {
        reply_err(req, 404, NULL, "expected /v1/nodes/<64 hex>/balance");
        return;
    }
    memcpy(id, p, 64);
    id[64] = 0;
    if (!is_hex(id, 64, 64)) {
        reply_err(req, 400, NULL, "node id: expected 64 lowercase hex digits (its public key)");
        return;
    }
    uint64_t lt;
    double credit;
    if (a->st->ops->balance_get(a->st->impl, id, &lt, &credit)) {
        reply_err(req, 503, NULL, "store: %s", a->st->err);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "node", id);
    cJSON_AddNumberToObject(o, "layer_tokens", (double)lt);
    cJSON_AddNumberToObject(o, "credit", credit);
    reply_json(req, 200, o);
}

/* GET /: the coverage page (plain HTML and JavaScript over the JSON API). */
static const char page[] =
    "<!doctype html><html><head><meta charset=utf-8><title>Kvasir market</title><style>"
    "body{font:14px sans-serif;margin:20px;background:#fafafa}h2{margin:18px 0 6px}"
    ".bar{display:flex;height:44px;border:1px solid #444;width:900px}"
    ".w{border-right:1px solid #444;display:flex;align-items:center;justify-content:center;"
    "color:#000;font-size:12px;overflow:hidden}"
    "table{border-collapse:collapse;margin-top:8px}td,th{border:1px solid #bbb;padding:3px 8px}"
    "</style></head><body><h1>Kvasir market: coverage</h1><div id=models>loading...</div><script>\n"
    "function colour(w,max){if(w.state=='active')return 'hsl(120,60%,'+(75-30*w.reward/max)+'%)';"
    "if(w.state=='reserved')return 'hsl(50,90%,60%)';return 'hsl(0,80%,'+(80-30*w.reward/max)+'%)';}\n"
    "async function load(){const r=await fetch('/v1/models');const j=await r.json();"
    /* built aside and swapped in whole, so a reader (a screen, a DOM dump) never sees the
     * page half refilled by the periodic reload */
    "const root=document.createElement('div');"
    "if(!j.models.length)root.textContent='no models registered';"
    "for(const m of j.models){const c=await (await fetch('/v1/models/'+m.id+'/coverage')).json();"
    "const h=document.createElement('h2');h.textContent=m.name+' ('+m.n_layers+' layers, '+"
    "c.demand_rpm.toFixed(2)+' requests/min)';root.appendChild(h);"
    "const bar=document.createElement('div');bar.className='bar';"
    "const max=Math.max(...c.windows.map(w=>w.reward),1e-9);"
    "for(const w of c.windows){const d=document.createElement('div');d.className='w';"
    "d.style.width=(100*(w.layers[1]-w.layers[0])/m.n_layers)+'%';d.style.background=colour(w,max);"
    "d.title='window '+w.window+': layers ['+w.layers[0]+', '+w.layers[1]+'), '+w.state+', reward '+w.reward;"
    "d.textContent='['+w.layers[0]+', '+w.layers[1]+') '+w.state;bar.appendChild(d);}root.appendChild(bar);"
    "const t=document.createElement('table');t.innerHTML='<tr><th>window</th><th>layers</th>"
    "<th>state</th><th>stage</th><th>endpoint</th><th>links</th><th>last probe</th>"
    "<th>reward/layer-token</th></tr>';"
    "for(const w of c.windows){const s=w.stages[0]||{};const tr=document.createElement('tr');"
    "const g=s.state=='grace'?'grace (kept for its holder, '+Math.round(s.expires_in)+' s)':w.state;"
    "const l=s.ring&&s.ring.links?(s.ring.links.linked?'up':'down')+(s.ring.last_token_age_s!=null?"
    "', last token '+Math.round(s.ring.last_token_age_s)+' s ago':''):'';"
    "for(const v of [w.window,'['+w.layers[0]+', '+w.layers[1]+')',g,(s.node||'').slice(0,16),"
    "s.endpoint||'',l,s.probe?s.probe.kind+' '+s.probe.result:'',w.reward.toPrecision(3)]){"
    "const td=document.createElement('td');"
    "td.textContent=v;tr.appendChild(td);}t.appendChild(tr);}root.appendChild(t);"
    "const rg=document.createElement('p');rg.textContent=c.rings.length?'rings: '+"
    "c.rings.map(x=>x.id+' ('+x.ranks+' ranks'+(x.api&&x.api.length?', API '+x.api.join(' '):'')+')')"
    ".join(', '):'rings: none complete';"
    "for(const x of c.unlinked||[])rg.textContent+='; '+x.id+' not linked: '+x.reason;"
    "root.appendChild(rg);}document.getElementById('models').replaceChildren(...root.childNodes);"
    "document.title='Kvasir market ('+j.models.length+' models)';"
    "document.body.setAttribute('data-loaded','1');}\n"
    "load().catch(e=>{document.getElementById('models').textContent='error: '+e;});"
    "setInterval(()=>load().catch(()=>{}),5000);\n"
    "</script></body></html>\n";

static void h_page(struct net_http_req *req, void *ud)
{
    (void)ud;
    net_http_reply(req, 200, "text/html; charset=utf-8", "Cache-Control: no-store\r\n", page,
                   sizeof page - 1);
}

int kvd_market__api_new(struct kvd_market_api **out, struct uv_loop_s *loop,
                        struct net_http_server *srv, struct kvd_market_store *store,
                        const struct kvd_market_config *cfg, char *err, size_t errlen)
{
    *out = NULL;
    struct kvd_market_api *a = calloc(1, sizeof *a);
    if (!a)
        return -ENOMEM;
    a->loop = loop;
    a->srv = srv;
    a->st = store;
    a->cfg = *cfg;
    int arc = kvd_market__admit_new(&a->admit, cfg, err, errlen);
    if (arc) {
        free(a);
        return arc;
    }
    if (kvd_market__audit_new(&a->audit, loop, store, cfg, audit_verdict, a)) {
        kvd_market__admit_free(a->admit);
        free(a);
        return -ENOMEM;
    }
    static const struct {
        const char *method, *path;
        net_http_handler_cb cb;
    } routes[] = {
        {"GET", "/", h_page},
        {"GET", "/v1/models", h_models_get},
        {"POST", "/v1/models", h_models_post},
        {"GET", "/v1/models/*", h_model_get},
        {"POST", "/v1/nodes", h_nodes_post},
        {"GET", "/v1/nodes/*", h_node_get},
        {"POST", "/v1/claims", h_claims},
        {"POST", "/v1/leases/heartbeat", h_heartbeat},
        {"POST", "/v1/leases/release", h_release},
        {"POST", "/v1/leases/probe", h_probe},
        {"POST", "/v1/leases/audit", h_audit},
        {"POST", "/v1/standbys", h_standbys},
        {"POST", "/v1/receipts", h_receipts},
        {"DELETE", "/v1/models/*", h_model_delete},
        {"POST", "/v1/clients", h_clients_post},
        {"GET", "/v1/clients", h_clients_get},
        {"GET", "/v1/clients/*", h_clients_get},
        {"POST", "/v1/clients/*", h_client_credit},
    };
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        int rc = net_http_server_route(srv, routes[i].method, routes[i].path, routes[i].cb, a);
        if (rc) {
            util_seterr(err, errlen, "route %s %s: %s", routes[i].method, routes[i].path, strerror(-rc));
            kvd_market__admit_free(a->admit);
            kvd_market__audit_free(a->audit);
            free(a);
            return rc;
        }
    }
    uv_timer_init(loop, &a->tick);
    a->tick.data = a;
    uv_timer_start(&a->tick, on_tick, 200, 200);
    *out = a;
    return 0;
}

void kvd_market__api_close(struct kvd_market_api *a)
{
    if (!a || a->closed)
        return;
    a->closed = true;
    while (a->polls) {
        struct poll *p = a->polls;
        a->polls = p->next;
        net_http_req_set_abort(p->req, NULL, NULL);
        net_http_reply(p->req, 204, NULL, NULL, NULL, 0);
        free(p);
    }
    uv_timer_stop(&a->tick);
    uv_close((uv_handle_t *)&a->tick, NULL);
}

void kvd_market__api_free(struct kvd_market_api *a)
{
    if (a) {
        kvd_market__admit_free(a->admit);
        kvd_market__audit_free(a->audit);
    }
    free(a);
}

/* state.c — a model's state as a call sees it: its windows and their leases as they stand
 * now (held, in their grace period, free), loaded in the call's transaction; the opening of a
 * call on one window's lease, and the admission and per-address checks every call that takes
 * a window shares (claims, standby leases, takeovers). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kvd/market/internal.h"
#include "net/net.h"
#include "util/util.h"

const char *const kvd_market__lease_names[] = {"uncovered", "reserved", "active", "grace"};

/* What a lease row means now: held (reserved/active) until expires, then a grace period in
 * which only its node may take the window back, then free. */
int kvd_market__lease_now(const struct kvd_market_api *a, const struct kvd_market_lease *l,
                          double now)
{
    if (!l->node[0])
        return KVD_LS_FREE;
    if (now < l->expires)
        return l->state == KVD_LEASE_ACTIVE ? KVD_LS_ACTIVE : KVD_LS_RESERVED;
    /* the grace period is for a serving stage that blinked; a reservation that lapsed frees
     * its window at once (else a squatter could hold it through its grace) */
    if (l->state == KVD_LEASE_ACTIVE && now < l->expires + a->cfg.grace_s)
        return KVD_LS_GRACE;
    return KVD_LS_FREE;
}

int kvd_market__state_load(struct kvd_market_api *a, const char *id, struct kvd_market_state *ms,
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
        ms->ls[i] = kvd_market__lease_now(a, &ms->l[i], now);
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

cJSON *kvd_market__free_windows(const struct kvd_market_state *ms, const char *node)
{
    cJSON *f = cJSON_CreateArray();
    for (size_t i = 0; i < ms->n; i++)
        if (ms->ls[i] == KVD_LS_FREE || (ms->ls[i] == KVD_LS_GRACE && node && !strcmp(ms->l[i].node, node)))
            cJSON_AddItemToArray(f, cJSON_CreateNumber(ms->w[i].idx));
    return f;
}

cJSON *kvd_market__lease_json(const struct kvd_market_api *a, const struct kvd_market_lease *l,
                              int ls, double now)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "window", l->window);
    cJSON_AddStringToObject(o, "node", l->node);
    cJSON_AddStringToObject(o, "state", kvd_market__lease_names[ls]);
    cJSON_AddNumberToObject(o, "expires_in", ls == KVD_LS_GRACE ? l->expires + a->cfg.grace_s - now
                                                          : l->expires - now);
    if (l->endpoint[0])
        cJSON_AddStringToObject(o, "endpoint", l->endpoint);
    return o;
}

/* An active lease whose holder stopped heartbeating (it beats every quarter of the lease):
 * shown as silent, not active, for the rest of its lease, and its ring as no ring. */
bool kvd_market__lease_silent(const struct kvd_market_api *a, const struct kvd_market_state *ms,
                              size_t i, double now)
{
    return ms->ls[i] == KVD_LS_ACTIVE && now - (ms->l[i].expires - a->cfg.lease_s) > a->cfg.lease_s / 2 + 2;
}

/* Refuse a call that loaded a model's state: its rows freed, the transaction rolled back,
 * the refusal sent. */
void kvd_market__state_refuse(struct kvd_market_api *a, struct net_http_req *req,
                              struct kvd_market_state *ms, int status, cJSON *extra, const char *why)
{
    kvd_market__model_clear(&ms->m);
    kvd_market__rollback_err(a, req, status, extra, why);
}

/* The state of the call's model (64 hex digits, checked by the caller) in the open
 * transaction: 0, or the refusal sent (404 for a model not registered, 503 for the store)
 * and the transaction rolled back. */
static int state_load(struct kvd_market_api *a, struct net_http_req *req, const char *model,
                      struct kvd_market_state *ms, double now)
{
    char why[128];
    int rc = kvd_market__state_load(a, model, ms, now);
    if (rc == -ENOENT) {
        snprintf(why, sizeof why, "model %s is not registered", model);
        kvd_market__rollback_err(a, req, 404, NULL, why);
    } else if (rc) {
        kvd_market__rollback_err(a, req, 503, NULL, a->st->err);
    }
    return rc;
}

/* The body of a call about a model's windows, and room for the model's state: the body
 * (caller deletes; *ms caller frees), or NULL with the refusal sent. */
static cJSON *body_and_state(struct net_http_req *req, struct kvd_market_state **ms)
{
    cJSON *b = kvd_market__body_json(req);
    if (!b)
        return NULL;
    if (!(*ms = calloc(1, sizeof **ms))) {
        cJSON_Delete(b);
        kvd_market__reply_err(req, 503, NULL, "out of memory");
        return NULL;
    }
    return b;
}

/* The lease request's model and window: 0 with ms loaded and *wi the window's index in it,
 * or the refusal sent and the transaction rolled back. */
static int lease_target(struct kvd_market_api *a, struct net_http_req *req, const cJSON *b,
                        struct kvd_market_state *ms, size_t *wi, double now)
{
    char why[256];
    const char *model = util_json_string(b, "model");
    uint64_t w;
    if (!model || !kvd_market__is_hex(model, 64, 64)) {
        kvd_market__rollback_err(a, req, 400, NULL, "model: expected 64 lowercase hex digits");
        return -EINVAL;
    }
    if (kvd_market__juint(b, "window", 0, 1e9, &w, why, sizeof why)) {
        kvd_market__rollback_err(a, req, 400, NULL, why);
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
    cJSON_AddItemToObject(x, "free", kvd_market__free_windows(ms, NULL));
    kvd_market__state_refuse(a, req, ms, 404, x, why);
    return -ENOENT;
}

/* Start a lease call: the body (check, when not NULL, says why it is malformed: a 400), the
 * signature, the model's state, the window: 0, or the refusal sent. kvd_market__lease_call_end frees c
 * either way. */
int kvd_market__lease_call_open(struct kvd_market_lease_call *c, struct kvd_market_api *a,
                                struct net_http_req *req, const char *(*check)(const cJSON *b))
{
    *c = (struct kvd_market_lease_call){0};
    if (!(c->b = body_and_state(req, &c->ms)))
        return -EINVAL;
    c->now = kvd_market__now();
    const char *bad = check ? check(c->b) : NULL;
    if (bad) {
        kvd_market__reply_err(req, 400, NULL, "%s", bad);
        return -EINVAL;
    }
    if (kvd_market__begin_signed(a, req, c->node) || lease_target(a, req, c->b, c->ms, &c->wi, c->now))
        return -EPERM;
    return 0;
}

/* kvd_market__lease_call_open for a call only the lease's live holder may make (a probe's or an audit's
 * answer): 0, or the refusal sent (409 when the caller holds no live lease on the window). */
int kvd_market__lease_call_held(struct kvd_market_lease_call *c, struct kvd_market_api *a,
                                struct net_http_req *req)
{
    char why[128];
    if (kvd_market__lease_call_open(c, a, req, NULL))
        return -EPERM;
    const struct kvd_market_lease *l = &c->ms->l[c->wi];
    int ls = c->ms->ls[c->wi];
    if (strcmp(l->node, c->node) || ls == KVD_LS_FREE || ls == KVD_LS_GRACE) {
        snprintf(why, sizeof why, "this node holds no lease on window %u", c->ms->w[c->wi].idx);
        kvd_market__state_refuse(a, req, c->ms, 409, NULL, why);
        return -EPERM;
    }
    return 0;
}

void kvd_market__lease_call_end(struct kvd_market_lease_call *c)
{
    free(c->ms);
    cJSON_Delete(c->b);
}

/* How many windows of the model other than wi are held from addr by nodes of the same kind
 * (reached through a relay or not); -1 when the store failed. */
static int addr_held(struct kvd_market_api *a, const struct kvd_market_state *ms, size_t wi,
                     const char *addr, bool relay)
{
    int k = 0;
    for (size_t i = 0; i < ms->n; i++) {
        if (i == wi || (ms->ls[i] != KVD_LS_RESERVED && ms->ls[i] != KVD_LS_ACTIVE && ms->ls[i] != KVD_LS_GRACE))
            continue;
        char key[KVD_MARKET_KEY_MAX];
        snprintf(key, sizeof key, "addr/%s/%u", ms->m.id, ms->w[i].idx);
        cJSON *o = kvd_market__blob_load(a->st, key);
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
int kvd_market__admit_or_refuse(struct kvd_market_api *a, struct net_http_req *req,
                                struct kvd_market_lease_call *c, bool rate)
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
        kvd_market__state_refuse(a, req, c->ms, status, NULL, why);
    return status ? -EPERM : 0;
}

/* The caps on the ranks of a model one address holds (--max-ranks-per-addr, and
 * --max-ranks-per-relay-addr for nodes reached through a relay), for the caller taking window
 * c->wi: 0, or the 409 sent with the transaction rolled back. */
int kvd_market__addr_cap_or_refuse(struct kvd_market_api *a, struct net_http_req *req,
                                   struct kvd_market_lease_call *c, bool relay)
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
    kvd_market__state_refuse(a, req, c->ms, 409, NULL, why);
    return -EPERM;
}

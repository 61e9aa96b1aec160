/* leases.c — the calls on a window's lease (docs/market.md, "Leases"): claims (POST
 * /v1/claims) with their reservation's fixed end and the refusal of a node whose reservation
 * lapsed, heartbeats (POST /v1/leases/heartbeat) that activate a lease once its endpoint
 * answers and carry the spot checks and audits due, and releases (POST /v1/leases/release). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <uv.h>

#include "kvd/market/internal.h"
#include "net/net.h"
#include "util/util.h"

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

/* When the reservation of window wi ends whatever its heartbeats say: the claim time plus
 * the time its window takes at the slowest pull rate the market accepts (at least reserve_s). */
static double reserve_end(const struct kvd_market_api *a, const struct kvd_market_state *ms, size_t wi,
                          const struct kvd_market_lease *l)
{
    if (l->since <= 0)   /* active before (a restarted stage probed again): no fixed end */
        return INFINITY;
    double t = (double)ms->w[wi].bytes / a->cfg.pull_min_rate;
    return l->since + (t > a->cfg.reserve_s ? t : a->cfg.reserve_s);
}

/* A reserved lease's next expiry: reserve_s on, never past its end. */
static double reserve_expiry(const struct kvd_market_api *a, const struct kvd_market_state *ms,
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
    int rc = kvd_market__blob_save(a->st, key, o);
    cJSON_Delete(o);
    return rc;
}

/* Whether node's reservation of the window ran out lately (why says so), from the lease row
 * when it is still node's, else from the blob kept when another node took the window. */
static bool lapse_refused(struct kvd_market_api *a, const struct kvd_market_state *ms, size_t wi,
                          const char *node, double now, char *why, size_t n)
{
    const struct kvd_market_lease *l = &ms->l[wi];
    double lapsed = 0, until = 0;
    if (!strcmp(l->node, node) && l->state == KVD_LEASE_RESERVED && ms->ls[wi] == KVD_LS_FREE &&
        l->since > 0) {
        lapsed = l->expires;
        until = l->expires + a->cfg.lapse_refuse_s;
    } else {
        char key[KVD_MARKET_KEY_MAX];
        snprintf(key, sizeof key, "refuse/%s/%u/%s", ms->m.id, ms->w[wi].idx, node);
        cJSON *o = kvd_market__blob_load(a->st, key);
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

/* POST /v1/claims {"model": ID, "window": W}: a reserved lease on a free window, the same one
 * again to its holder; 409 with the free windows when someone else holds it. */

void kvd_market__h_claims(struct net_http_req *req, void *ud)
{
    struct kvd_market_api *a = ud;
    char why[512];
    struct kvd_market_lease_call c;
    if (kvd_market__lease_call_open(&c, a, req, NULL))
        goto out;
    int ls = c.ms->ls[c.wi];
    struct kvd_market_lease *l = &c.ms->l[c.wi];
    const char *addr = net_http_req_addr(req);
    bool relay = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c.b, "relay"));
    if (kvd_market__admit_or_refuse(a, req, &c, true))
        goto out;
    if (lapse_refused(a, c.ms, c.wi, c.node, c.now, why, sizeof why)) {
        /* that window only: the node may claim another one (kvd join does) */
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "refused_window", c.ms->w[c.wi].idx);
        kvd_market__state_refuse(a, req, c.ms, 403, x, why);
        goto out;
    }
    if (ls != KVD_LS_FREE && strcmp(l->node, c.node)) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddItemToObject(x, "free", kvd_market__free_windows(c.ms, c.node));
        snprintf(why, sizeof why, "window %u is %s by node %.16s...", c.ms->w[c.wi].idx,
                 ls == KVD_LS_GRACE ? "in its grace period, kept for" : "held", l->node);
        kvd_market__state_refuse(a, req, c.ms, 409, x, why);
        goto out;
    }
    for (size_t i = 0; i < c.ms->n; i++)
        if (i != c.wi && (c.ms->ls[i] == KVD_LS_RESERVED || c.ms->ls[i] == KVD_LS_ACTIVE) &&
            !strcmp(c.ms->l[i].node, c.node)) {
            snprintf(why, sizeof why, "this node already holds window %u of the model", c.ms->w[i].idx);
            kvd_market__state_refuse(a, req, c.ms, 409, NULL, why);
            goto out;
        }
    if (kvd_market__addr_cap_or_refuse(a, req, &c, relay))
        goto out;
    int status = 200;
    if (ls == KVD_LS_RESERVED || ls == KVD_LS_ACTIVE) {   /* its holder again: as good as a heartbeat */
        l->expires = ls == KVD_LS_ACTIVE ? c.now + a->cfg.lease_s
                                    : reserve_expiry(a, c.ms, c.wi, l, c.now);
        if (a->st->ops->lease_put(a->st->impl, c.ms->m.id, l)) {
            kvd_market__state_refuse(a, req, c.ms, 503, NULL, a->st->err);
            goto out;
        }
    } else {   /* a new lease (or the same node back in its grace) */
        /* the node before whose reservation ran out: it may not take the window back soon */
        if (l->node[0] && strcmp(l->node, c.node) && l->state == KVD_LEASE_RESERVED &&
            l->since > 0 && refuse_put(a, c.ms->m.id, c.ms->w[c.wi].idx, l)) {
            kvd_market__state_refuse(a, req, c.ms, 503, NULL, a->st->err);
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
        int arc = kvd_market__blob_save(a->st, key, ao);
        cJSON_Delete(ao);
        /* a standby that claims a window gives its standby lease up */
        cJSON *sb = kvd_market__standby_get(a->st, c.ms->m.id, c.node, c.now);
        if (!arc && sb)
            arc = kvd_market__standby_put(a->st, c.ms->m.id, c.node, 0, NULL, 0, 0);
        cJSON_Delete(sb);
        if (arc || a->st->ops->lease_put(a->st->impl, c.ms->m.id, l)) {
            kvd_market__state_refuse(a, req, c.ms, 503, NULL, a->st->err);
            goto out;
        }
        ls = KVD_LS_RESERVED;
        status = 201;
    }
    cJSON *o = kvd_market__lease_json(a, l, ls, c.now);
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
    kvd_market__commit_reply(a, req, status, o);
out:
    kvd_market__lease_call_end(&c);
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
const char *kvd_market__heartbeat_bad(const cJSON *b)
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
        kvd_market__reply_err(req, 409, NULL, "endpoint %s did not answer: %s", p->endpoint, fail);
        return;
    }
    double now = kvd_market__now();
    struct kvd_market_lease l;
    if (kvd_market__begin(a, req))
        return;
    if (a->st->ops->lease_get(a->st->impl, p->model, p->window, &l) || strcmp(l.node, p->node) ||
        kvd_market__lease_now(a, &l, now) == KVD_LS_FREE || kvd_market__lease_now(a, &l, now) == KVD_LS_GRACE) {
        kvd_market__rollback_err(a, req, 409, NULL, "the lease lapsed while its endpoint was checked: claim again");
        return;
    }
    snprintf(l.endpoint, sizeof l.endpoint, "%s", p->endpoint);
    /* With a probe set, the lease waits (reserved) for the stage's answer to a known-answer
     * probe (kvd_market__h_probe): also an active one whose endpoint changed, a new stage process that
     * must show its window again. */
    int rc = 0;
    cJSON *ch = a->cfg.probe ?
        kvd_market__probe_issue(a, p->model, p->window, p->first, p->last, p->node, "activation", now, &rc) : NULL;
    if (rc) {
        kvd_market__rollback_err(a, req, 503, NULL, a->st->err);
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
        kvd_market__rollback_err(a, req, 503, NULL, a->st->err);
        return;
    }
    cJSON *o = kvd_market__lease_json(a, &l, ch ? KVD_LS_RESERVED : KVD_LS_ACTIVE, now);
    cJSON_AddStringToObject(o, "model", p->model);
    if (ch)
        cJSON_AddItemToObject(o, "probe", ch);
    kvd_market__commit_reply(a, req, 200, o);
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
void kvd_market__h_release(struct net_http_req *req, void *ud)
{
    struct kvd_market_api *a = ud;
    char why[512];
    struct kvd_market_lease_call c;
    if (kvd_market__lease_call_open(&c, a, req, NULL))
        goto out;
    struct kvd_market_lease *l = &c.ms->l[c.wi];
    if (strcmp(l->node, c.node) || c.ms->ls[c.wi] == KVD_LS_FREE) {
        snprintf(why, sizeof why, "this node holds no lease on window %u", c.ms->w[c.wi].idx);
        kvd_market__state_refuse(a, req, c.ms, 409, NULL, why);
        goto out;
    }
    l->expires = c.now - a->cfg.grace_s - 1;   /* past its grace: free for anyone */
    l->since = 0;                              /* given back, not run out */
    if (a->st->ops->lease_put(a->st->impl, c.ms->m.id, l)) {
        kvd_market__state_refuse(a, req, c.ms, 503, NULL, a->st->err);
        goto out;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", c.ms->m.id);
    cJSON_AddNumberToObject(o, "window", c.ms->w[c.wi].idx);
    cJSON_AddStringToObject(o, "state", "released");
    kvd_market__model_clear(&c.ms->m);
    kvd_market__commit_reply(a, req, 200, o);
out:
    kvd_market__lease_call_end(&c);
}

/* POST /v1/leases/heartbeat {"model", "window", "progress"?, "endpoint"?}: renew the caller's
 * lease; with an endpoint, a reserved lease becomes active once that endpoint accepts a
 * connection (docs/market.md, "Leases"). */
void kvd_market__h_heartbeat(struct net_http_req *req, void *ud)
{
    struct kvd_market_api *a = ud;
    char why[512];
    struct kvd_market_lease_call c;
    if (kvd_market__lease_call_open(&c, a, req, kvd_market__heartbeat_bad))
        goto out;
    const char *ep = util_json_string(c.b, "endpoint");
    char host[256];
    int port = 0;
    if (ep && strncmp(ep, "relay://", 8))
        endpoint_split(ep, host, sizeof host, &port);   /* checked by endpoint_bad */
    struct kvd_market_lease *l = &c.ms->l[c.wi];
    int ls = c.ms->ls[c.wi];
    if (strcmp(l->node, c.node) || ls == KVD_LS_FREE || ls == KVD_LS_GRACE) {
        snprintf(why, sizeof why, "this node holds no lease on window %u%s", c.ms->w[c.wi].idx,
                 !strcmp(l->node, c.node) ? " (it lapsed: claim it again)" : "");
        kvd_market__state_refuse(a, req, c.ms, 409, NULL, why);
        goto out;
    }
    bool activating = ep && (l->state != KVD_LEASE_ACTIVE || strcmp(l->endpoint, ep));
    if (activating && ep && strncmp(ep, "relay://", 8)) {
        /* a node that claimed as relay-reached (counted under the relay cap) must stay so */
        char key[KVD_MARKET_KEY_MAX];
        snprintf(key, sizeof key, "addr/%s/%u", c.ms->m.id, c.ms->w[c.wi].idx);
        cJSON *ao = kvd_market__blob_load(a->st, key);
        bool relayed = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(ao, "relay")) &&
                       util_json_string(ao, "node") && !strcmp(util_json_string(ao, "node"), c.node);
        cJSON_Delete(ao);
        if (relayed) {
            snprintf(why, sizeof why, "window %u was claimed as reached through a relay; endpoint "
                     "%s is not a relay:// one", c.ms->w[c.wi].idx, ep);
            kvd_market__state_refuse(a, req, c.ms, 409, NULL, why);
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
        kvd_market__state_refuse(a, req, c.ms, 503, NULL, a->st->err);
        goto out;
    }
    if (!activating) {
        cJSON *ch = NULL;
        char msg[700];
        int rc = a->cfg.probe && l->state == KVD_LEASE_ACTIVE ?
            kvd_market__spot_tick(a, c.ms, c.wi, l, c.now, &ch, msg, sizeof msg) : 0;
        if (rc < 0) {
            kvd_market__state_refuse(a, req, c.ms, 503, NULL, a->st->err);
            goto out;
        }
        /* an audit of credited work pending on the node (audit.c): sent until its deadline */
        cJSON *au = NULL;
        char awhy[512];
        if (rc == 0 && (rc = kvd_market__audit_due(a->audit, c.ms->m.id, c.node, c.now, &au, awhy,
                                                  sizeof awhy)) == 1)
            rc = kvd_market__probe_fail(a, c.ms->m.id, l, "audit", awhy, c.now, msg, sizeof msg) ? -EIO : 1;
        if (rc < 0) {
            cJSON_Delete(ch);
            kvd_market__state_refuse(a, req, c.ms, 503, NULL, a->st->err);
            goto out;
        }
        cJSON *o;
        if (rc == 1) {   /* a spot check or an audit went unanswered: the lease is over */
            o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "error", msg);
        } else {
            o = kvd_market__lease_json(a, l, kvd_market__lease_now(a, l, c.now), c.now);
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
        kvd_market__commit_reply(a, req, rc == 1 ? 403 : 200, o);
        goto out;
    }
    if (a->st->ops->commit(a->st->impl)) {
        a->st->ops->rollback(a->st->impl);
        kvd_market__model_clear(&c.ms->m);
        kvd_market__reply_err(req, 503, NULL, "store: %s", a->st->err);
        goto out;
    }
    struct probe *p = calloc(1, sizeof *p);
    if (!p) {
        kvd_market__model_clear(&c.ms->m);
        kvd_market__reply_err(req, 503, NULL, "out of memory");
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
    kvd_market__lease_call_end(&c);
}

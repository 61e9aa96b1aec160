/* standbys.c — the standby calls (docs/market.md, "Standbys"): POST /v1/standbys takes,
 * renews or gives back a standby lease, or reports a takeover; GET /v1/models/<id>/roster
 * names the standbys of the ring served now. standby.c keeps their records. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kvd/kvd.h"
#include "kvd/market/internal.h"
#include "net/net.h"
#include "util/util.h"

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
    const char *bad = kvd_market__heartbeat_bad(b);
    if (bad)
        return bad;
    const cJSON *sv = cJSON_GetObjectItemCaseSensitive(b, "serving");
    const char *man = util_json_string(b, "manifest");
    if (sv && (!cJSON_IsNumber(sv) || !man || !kvd_market__is_hex(man, 64, 64)))
        return "serving: expected the rank taken over, with manifest (its SHA-256)";
    return NULL;
}

/* A standby that took its window's rank over: made the window's holder once the market has
 * it from another node: the holder of the rank before reports its link to its successor up
 * to the standby's endpoint, and the old holder missed a heartbeat (or its lease lapsed). So a
 * standby cannot push a live holder out by saying it took over: that takes the predecessor's
 * holder lying with it. 200 {"holder": true}, 202 while unconfirmed, 409 when this is not the
 * ring or rank the standby lease is for. */
static void standby_took(struct kvd_market_api *a, struct net_http_req *req, struct kvd_market_lease_call *c,
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
    if (!strcmp(l->node, c->node) && (ls == KVD_LS_ACTIVE || ls == KVD_LS_RESERVED)) {
        cJSON_AddBoolToObject(o, "holder", true);   /* recorded before: as good as a heartbeat */
        cJSON_AddNumberToObject(o, "lease_s", a->cfg.lease_s);
        kvd_market__model_clear(&c->ms->m);
        kvd_market__commit_reply(a, req, 200, o);
        return;
    }
    cJSON_Delete(o);
    if (!mine || util_json_number(mine, "window", -1) != (double)idx) {
        snprintf(why, sizeof why, "this node holds no standby lease on window %u", idx);
        kvd_market__state_refuse(a, req, c->ms, 409, NULL, why);
        return;
    }
    /* the ring the market serves: its manifest now, or, while the dead holder's lease is in
     * its grace (no complete ring), the last one published, which the ring still runs */
    char *man = kvd_market__manifest_of(c->ms, hash);
    bool have = man != NULL;
    free(man);
    if (!have) {
        char key[KVD_MARKET_KEY_MAX];
        snprintf(key, sizeof key, "genlast/%s", c->ms->m.id);
        cJSON *gl = kvd_market__blob_load(a->st, key);
        snprintf(hash, sizeof hash, "%s", util_json_string(gl, "sha") ? util_json_string(gl, "sha") : "");
        cJSON_Delete(gl);
        have = hash[0] && ls != KVD_LS_ACTIVE && ls != KVD_LS_RESERVED;
        for (size_t i = 0; have && i < c->ms->n; i++)
            have = i == wi || c->ms->ls[i] == KVD_LS_ACTIVE;
    }
    if (!have || strcmp(hash, man_sha) || rank != (double)wi || wi == 0) {
        snprintf(why, sizeof why, "rank %.0f of manifest %.16s... is not window %u of the ring "
                 "this market serves (manifest %.16s...)", rank, man_sha, idx, have ? hash : "none");
        kvd_market__state_refuse(a, req, c->ms, 409, NULL, why);
        return;
    }
    /* the claim's rules hold for a takeover too */
    if (kvd_market__admit_or_refuse(a, req, c, false) || kvd_market__addr_cap_or_refuse(a, req, c, false))
        return;
    /* the holder's last heartbeat renewed its lease for lease_s; it beats every lease_s / 4,
     * so one silent for half a lease and 2 s has missed a heartbeat (as the map's "silent") */
    double beat_age = c->now - (l->expires - a->cfg.lease_s);
    bool missed = ls != KVD_LS_ACTIVE || kvd_market__lease_silent(a, c->ms, wi, c->now);
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
        kvd_market__commit_reply(a, req, 202, o);
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
    cJSON *probes = kvd_market__blob_load(a->st, pkey), *chk = cJSON_CreateObject();
    cJSON_AddStringToObject(chk, "node", c->node);
    cJSON_AddNumberToObject(chk, "next", 0);
    snprintf(ckey, sizeof ckey, "check/%s/%u", c->ms->m.id, idx);
    int rc = probes ? kvd_market__blob_save(a->st, ckey, chk) : 0;
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
        rc = kvd_market__blob_save(a->st, key, ao);
    cJSON_Delete(ao);
    if (rc) {
        kvd_market__state_refuse(a, req, c->ms, 503, NULL, rc == -ENOSPC ? "this rank was taken over too "
                                 "often in this ring generation" : a->st->err);
        return;
    }
    kvd_log(KVD_LOG_INFO, "model %.16s...: standby %.16s... took rank %zu (window %u) over from "
            "node %.16s... in ring generation %.16s...", c->ms->m.id, c->node, wi, idx, old, hash);
    o = kvd_market__lease_json(a, &nl, KVD_LS_ACTIVE, c->now);
    cJSON_AddStringToObject(o, "model", c->ms->m.id);
    cJSON_AddBoolToObject(o, "holder", true);
    cJSON_AddNumberToObject(o, "lease_s", a->cfg.lease_s);
    kvd_market__model_clear(&c->ms->m);
    kvd_market__commit_reply(a, req, 200, o);
}

/* POST /v1/standbys {"model", "window", "endpoint"?}: take or renew a standby lease on a
 * covered window (docs/market.md, "Standbys"); with "serving": RANK and "manifest", the
 * standby says it took that rank over (standby_took). A standby lease lives lease_s past its
 * last call, like a lease; with an endpoint (once its window is pulled and it listens) it is
 * named in the ring's roster. */
void kvd_market__h_standbys(struct net_http_req *req, void *ud)
{
    struct kvd_market_api *a = ud;
    char why[512];
    struct kvd_market_lease_call c;
    if (kvd_market__lease_call_open(&c, a, req, standby_bad))
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
            kvd_market__state_refuse(a, req, c.ms, 409, NULL, why);
            goto out;
        }
        if (kvd_market__standby_put(a->st, c.ms->m.id, c.node, idx, NULL, 0, 0)) {
            kvd_market__state_refuse(a, req, c.ms, 503, NULL, a->st->err);
            goto out;
        }
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "model", c.ms->m.id);
        cJSON_AddNumberToObject(o, "window", idx);
        cJSON_AddStringToObject(o, "state", "released");
        kvd_market__model_clear(&c.ms->m);
        kvd_market__commit_reply(a, req, 200, o);
        goto out;
    }
    for (size_t i = 0; i < c.ms->n; i++)
        if ((c.ms->ls[i] == KVD_LS_RESERVED || c.ms->ls[i] == KVD_LS_ACTIVE) && !strcmp(c.ms->l[i].node, c.node)) {
            snprintf(why, sizeof why, "this node holds window %u of the model: a holder is no "
                     "standby", c.ms->w[i].idx);
            kvd_market__state_refuse(a, req, c.ms, 409, NULL, why);
            goto out;
        }
    /* the same admission as a claim, on every call (a node penalized meanwhile loses it) */
    if (kvd_market__admit_or_refuse(a, req, &c, !renew))
        goto out;
    if (!renew) {
        if (c.ms->ls[c.wi] != KVD_LS_ACTIVE || c.wi == 0) {
            cJSON *x = cJSON_CreateObject();
            cJSON_AddItemToObject(x, "free", kvd_market__free_windows(c.ms, c.node));
            /* rank 0 holds the sessions' history, which dies with it */
            snprintf(why, sizeof why, c.wi == 0 ? "window %u is rank 0's, which holds the "
                     "sessions' history and has no standby" : "window %u has no active stage to "
                     "stand by for: claim it", idx);
            kvd_market__state_refuse(a, req, c.ms, 409, x, why);
            goto out;
        }
        cJSON *live = kvd_market__standby_list(a->st, c.ms->m.id, c.now);
        if (!live) {
            kvd_market__state_refuse(a, req, c.ms, 503, NULL, a->st->err);
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
            kvd_market__state_refuse(a, req, c.ms, 409, NULL, why);
            goto out;
        }
    }
    const char *ep = util_json_string(c.b, "endpoint");
    if (kvd_market__standby_put(a->st, c.ms->m.id, c.node, idx, ep, since, c.now + a->cfg.lease_s)) {
        kvd_market__state_refuse(a, req, c.ms, 503, NULL, a->st->err);
        goto out;
    }
    char hash[65];
    char *man = kvd_market__manifest_of(c.ms, hash);
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
    kvd_market__commit_reply(a, req, renew ? 200 : 201, o);
out:
    kvd_market__lease_call_end(&c);
}

/* GET /v1/models/<id>/roster: the standbys of the ring the market serves now (standby.c), for
 * its stages to accept as a rank's node: {"manifest", "standby": [{node, endpoint, ranks}]}.
 * 404 while there is no ring. */
void kvd_market__roster_get(struct kvd_market_api *a, struct net_http_req *req, const char *id)
{
    double now = kvd_market__now();
    struct kvd_market_state *ms = calloc(1, sizeof *ms);
    if (!ms) {
        kvd_market__reply_err(req, 503, NULL, "out of memory");
        return;
    }
    int rc = kvd_market__state_load(a, id, ms, now);
    if (rc) {
        free(ms);
        kvd_market__reply_err(req, rc == -ENOENT ? 404 : 503, NULL, rc == -ENOENT ? "model %s is not registered"
                              : "store: %s", rc == -ENOENT ? id : a->st->err);
        return;
    }
    char hash[65];
    char *man = kvd_market__manifest_of(ms, hash);
    bool have = man != NULL;
    free(man);
    bool took[KVD_MARKET_MAX_WINDOWS];
    for (size_t i = 0; i < ms->n; i++)
        took[i] = !strcmp(ms->took_sha[i], hash);
    cJSON *r = have ? kvd_market__roster(a->st, id, hash, ms->l, took, ms->n, now) : NULL;
    kvd_market__model_clear(&ms->m);
    free(ms);
    if (!r) {
        kvd_market__reply_err(req, have ? 503 : 404, NULL, have ? "store: %s" : "model %.16s... has no ring now",
                              have ? a->st->err : id);
        return;
    }
    char *text = cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    if (!text) {
        kvd_market__reply_err(req, 503, NULL, "out of memory");
        return;
    }
    net_http_reply(req, 200, "application/json", "Cache-Control: no-store\r\n", text, strlen(text));
    free(text);
}

/* checks.c — the checks of a lease (docs/market.md, "Probes" and "Audits"): known-answer
 * probes issued at activation and as spot checks, kept as the lease's pending check, judged
 * (probe.c) when the stage answers (POST /v1/leases/probe); audits' answers (POST
 * /v1/leases/audit, audit.c) and verdicts; and what a failed check costs the node. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <openssl/rand.h>

#include "kvd/kvd.h"
#include "kvd/market/internal.h"
#include "util/util.h"

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
    cJSON *c = kvd_market__blob_load(a->st, key);
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
cJSON *kvd_market__probe_issue(struct kvd_market_api *a, const char *model, uint32_t window,
                               uint32_t first, uint32_t last, const char *node, const char *kind,
                               double now, int *rc)
{
    char key[100];
    snprintf(key, sizeof key, "probes/%s", model);
    *rc = 0;
    cJSON *set = kvd_market__blob_load(a->st, key);
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
    *rc = kvd_market__blob_save(a->st, key, chk);
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
int kvd_market__probe_fail(struct kvd_market_api *a, const char *model, struct kvd_market_lease *l,
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
        rc = kvd_market__blob_save(a->st, key, p);
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

/* A failed audit (docs/market.md, "Audits"): as a failed spot check (kvd_market__probe_fail, kind
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
            kvd_market__lease_now(a, &l, now) != KVD_LS_FREE)
            return kvd_market__probe_fail(a, model, &l, "audit", why, now, msg, n);
    }
    if (rc)
        return rc;
    snprintf(msg, n, "audit failed: %s", why);
    char key[80];
    snprintf(key, sizeof key, "penalty/%s", node);
    cJSON *p = cJSON_CreateObject();
    cJSON_AddNumberToObject(p, "until", now + a->cfg.penalty_s);
    cJSON_AddStringToObject(p, "reason", msg);
    rc = kvd_market__blob_save(a->st, key, p);
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

int kvd_market__audit_verdict(void *ud, const char *model, const char *node, const char *why,
                              double now)
{
    char msg[700];
    return audit_fail(ud, model, node, why, now, msg, sizeof msg);
}

/* The pending spot check of an active lease that ran past its deadline (failed: msg set,
 * returns 1), or a new one when due (*ch set), on a heartbeat. 0, 1, or the store's failure. */
int kvd_market__spot_tick(struct kvd_market_api *a, const struct kvd_market_state *ms, size_t wi,
                          struct kvd_market_lease *l, double now, cJSON **ch, char *msg, size_t n)
{
    char key[100];
    *ch = NULL;
    snprintf(key, sizeof key, "check/%s/%u", ms->m.id, l->window);
    cJSON *chk = kvd_market__blob_load(a->st, key);
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
        cJSON *set = kvd_market__blob_load(a->st, pkey);
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
        rc = kvd_market__blob_save(a->st, key, chk);
        if (rc == 0)
            rc = kvd_market__probe_fail(a, ms->m.id, l, k, "no answer before its deadline", now, msg, n);
        rc = rc ? rc : 1;
    } else if (a->cfg.spot_check_s > 0 && now >= util_json_number(chk, "next", 0)) {
        *ch = kvd_market__probe_issue(a, ms->m.id, l->window, ms->w[wi].first, ms->w[wi].last, l->node, "spot",
                                      now, &rc);
    }
    cJSON_Delete(chk);
    return rc;
}

/* POST /v1/leases/probe {"model", "window", "id", "outputs": [{"output": F16-BASE64} |
 * {"tokens": [...]}, ...]}: the stage's answer to the probe pending on its lease. Right: an
 * activation makes the lease active, a spot check changes nothing; both set the next spot
 * check. Wrong or late: 403 with the reason, the lease ended (kvd_market__probe_fail). */
void kvd_market__h_probe(struct net_http_req *req, void *ud)
{
    struct kvd_market_api *a = ud;
    char why[512], msg[700], key[100];
    struct kvd_market_lease_call c;
    cJSON *chk = NULL, *set = NULL;
    if (kvd_market__lease_call_held(&c, a, req))
        goto out;
    struct kvd_market_lease *l = &c.ms->l[c.wi];
    chk = checks_load(a, c.ms->m.id, l->window, c.node, key);
    const cJSON *pd = cJSON_GetObjectItemCaseSensitive(chk, "pending");
    const char *id = util_json_string(c.b, "id"), *pid = util_json_string(pd, "id"), *kind = util_json_string(pd, "kind");
    if (!id || !pid || !kind || strcmp(id, pid)) {
        snprintf(why, sizeof why, "no probe %s is pending on this node's lease of window %u",
                 id ? id : "(no id)", l->window);
        kvd_market__state_refuse(a, req, c.ms, 409, NULL, why);
        goto out;
    }
    char pkey[80], k[16];
    snprintf(k, sizeof k, "%s", kind);
    snprintf(pkey, sizeof pkey, "probes/%s", c.ms->m.id);
    set = kvd_market__blob_load(a->st, pkey);
    if (!set) {
        kvd_market__state_refuse(a, req, c.ms, 503, NULL, "the model's probe set is gone");
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
        kvd_market__state_refuse(a, req, c.ms, rc == -EINVAL ? 400 : 503, NULL, why);
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
    int src = kvd_market__blob_save(a->st, key, chk);
    if (src == 0 && rc == 0)
        src = a->st->ops->lease_put(a->st->impl, c.ms->m.id, l);
    if (src == 0 && rc)
        src = kvd_market__probe_fail(a, c.ms->m.id, l, k, why, c.now, msg, sizeof msg);
    if (src) {
        cJSON_Delete(last);
        kvd_market__state_refuse(a, req, c.ms, 503, NULL, a->st->err);
        goto out;
    }
    cJSON *o;
    if (rc == 0) {
        kvd_log(KVD_LOG_INFO, "probe %s (%s) of window %u by node %.16s...: pass (NMSE %.3g)", id, k,
                l->window, c.node, nmse);
        o = kvd_market__lease_json(a, l, kvd_market__lease_now(a, l, c.now), c.now);
        cJSON_AddStringToObject(o, "model", c.ms->m.id);
    } else {
        o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "error", msg);
    }
    cJSON_AddItemToObject(o, "probe", last);
    kvd_market__model_clear(&c.ms->m);
    kvd_market__commit_reply(a, req, rc == 0 ? 200 : 403, o);
out:
    cJSON_Delete(chk);
    cJSON_Delete(set);
    kvd_market__lease_call_end(&c);
}

/* POST /v1/leases/audit {"model", "window", "id", "outputs", "inputs" | "token_ids"}: the
 * node's answer to the audit pending on it (docs/market.md, "Audits"). 202 while its rows are
 * recomputed (a wrong verdict ends the lease then), 200 when judged on its proofs alone; 403
 * with the reason when wrong (the lease is over, as for a failed spot check); 409 when no
 * such audit is pending, or the node's received side of the session is not in yet. */
void kvd_market__h_audit(struct net_http_req *req, void *ud)
{
    struct kvd_market_api *a = ud;
    char why[512], msg[700];
    struct kvd_market_lease_call c;
    if (kvd_market__lease_call_held(&c, a, req))
        goto out;
    struct kvd_market_lease *l = &c.ms->l[c.wi];
    bool settled = false;
    const char *verdict = "pass";
    int rc = kvd_market__audit_answer(a->audit, c.ms->m.id, c.node, c.b, c.now, &settled, &verdict,
                                      why, sizeof why);
    if (rc == -EBADMSG && kvd_market__probe_fail(a, c.ms->m.id, l, "audit", why, c.now, msg, sizeof msg))
        rc = -EIO;
    if (rc && rc != -EBADMSG) {
        kvd_market__state_refuse(a, req, c.ms, rc == -EINVAL ? 400 : rc == -ENOENT || rc == -EAGAIN ? 409 : 503,
                                 NULL, rc == -EIO ? a->st->err : why);
        goto out;
    }
    /* an answer (or a part of one) the market took counts as a heartbeat: a node sending a
     * large answer in parts over a slow link is busy with the market's own request, not gone */
    if (rc == 0 && l->state == KVD_LEASE_ACTIVE) {
        l->expires = c.now + a->cfg.lease_s;
        if (a->st->ops->lease_put(a->st->impl, c.ms->m.id, l)) {
            kvd_market__state_refuse(a, req, c.ms, 503, NULL, a->st->err);
            goto out;
        }
    }
    cJSON *o = cJSON_CreateObject();
    if (rc == 0)
        cJSON_AddStringToObject(o, "audit", settled || !strcmp(verdict, "more") ? verdict : "verifying");
    else
        cJSON_AddStringToObject(o, "error", msg);
    kvd_market__model_clear(&c.ms->m);
    kvd_market__commit_reply(a, req, rc ? 403 : settled ? 200 : 202, o);
out:
    kvd_market__lease_call_end(&c);
}

/* lease.c — the lease on a window: heartbeats (with what they tell the market of the ring),
 * the probes and audits the market sends with their answers, a standby's lease and takeover,
 * taking the window back after a lapse, giving it up. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cjson/cJSON.h>

#include "kvd/join/internal.h"
#include "util/err.h"
#include "util/util.h"

static int status_obj(const char *line, void *ud)
{
    cJSON_Delete(*(cJSON **)ud);
    *(cJSON **)ud = cJSON_Parse(line);
    return 1;
}

/* Whether our stage's process still runs (one that exited is left for the hold loop to reap). */
static bool stage_alive(const struct join *j)
{
    siginfo_t si = {0};
    return waitid(P_PID, (id_t)j->stage, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == 0;
}

/* The probe p run by our stage on the window it has loaded (its control socket's "probe" op):
 * 0 with *outs (the outputs array's JSON), or negative with err filled: -ENOENT when no stage
 * could run it (none runs, a standby that has not taken a rank over, a stage that did not come
 * up in half the time), another error when the stage that serves the window failed it or did
 * not answer in time. */
static int probe_in_stage(struct join *j, const char *text, const cJSON *p, char **outs,
                          char *err, size_t errlen)
{
    if (j->stage <= 0 || j->rank < 0) {   /* none, or a standby's, which loads no window yet */
        snprintf(err, errlen, "no stage serves the window");
        return -ENOENT;
    }
    char sock[4200];
    snprintf(sock, sizeof sock, "%s/kvd.sock", j->dir);
    size_t n = strlen(text) + 40;
    char *req = malloc(n);
    if (!req)
        return -ENOMEM;
    snprintf(req, n, "{\"op\":\"probe\",\"challenge\":%s}", text);
    /* within the market's deadline for the answer (--reserve-s), less a margin to post it */
    double dl = util_json_number(p, "deadline_s", 30), t0 = util_now_ms();
    dl = dl > 4 ? (dl < 3600 ? dl : 3600) : 4;   /* a market's number, bounded before use */
    int ms = (int)(dl * 1000) - 2000;
    cJSON *o = NULL;
    int rc;
    /* A stage that is still loading its window (its control socket opens after that) is
     * waited for, up to half the time: opening a second copy beside its load would double the
     * node's memory just then. */
    while ((rc = ring_ctl_request(sock, req, status_obj, &o, ms, err, errlen)) == -ECONNREFUSED ||
           rc == -ENOENT) {
        if (util_now_ms() - t0 > ms / 2 || !stage_alive(j))
            break;
        kvd_join__sleep_ms(200);
    }
    free(req);
    if (rc == -ECONNREFUSED)
        rc = -ENOENT;   /* not listening (yet): no stage to run it */
    const cJSON *out = cJSON_GetObjectItemCaseSensitive(o, "outputs");
    if (rc == 0 && !cJSON_IsArray(out)) {
        const char *e = kvd_join__jstr_or(o, "error", "no outputs in the stage's answer");
        snprintf(err, errlen, "%s", e);
        rc = cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(o, "loaded")) ? -ENOENT : -EIO;
    }
    if (rc == 0 && !(*outs = cJSON_PrintUnformatted(out)))
        rc = -ENOMEM;
    cJSON_Delete(o);
    return rc;
}

/* Answer a known-answer probe the market sent with a heartbeat's answer (docs/market.md,
 * "Probes") and post the outputs: run by the stage that serves the window, on the backend it
 * has loaded, or, while none does, through a new instance of this node's compute backend on
 * the pulled window. 0 when the market found them right, -EPERM when it found them wrong (the
 * lease is over and this node's claims are refused for a while: the market's reason is
 * logged), -EAGAIN when the probe could not run or the market did not answer. */
static int probe_answer(struct join *j, const cJSON *p)
{
    char err[KV_ERR_MAX], serr[KV_ERR_MAX], *outs = NULL, *text = cJSON_PrintUnformatted(p);
    const cJSON *jid = cJSON_GetObjectItemCaseSensitive(p, "id");
    const cJSON *jk = cJSON_GetObjectItemCaseSensitive(p, "kind");
    const char *id = cJSON_IsString(jid) ? jid->valuestring : "?";
    const char *kind = cJSON_IsString(jk) ? jk->valuestring : "?";
    double t0 = util_now_ms();
    if (!text)
        return -EAGAIN;
    /* Only where no stage could run it is the window opened here: a stage that serves it and
     * failed or was too slow would leave a second copy no time and the node's memory doubled
     * beside its own. */
    int rc = probe_in_stage(j, text, p, &outs, serr, sizeof serr);
    bool in_stage = rc == 0;
    if (rc == -ENOENT)
        rc = kvd_stage_probe(strcmp(j->backend, "cpu") ? j->backend : NULL, j->window_path,
                             j->n_threads, text, &outs, err, sizeof err);
    else if (rc < 0)
        snprintf(err, sizeof err, "the stage that serves the window could not run it: %.900s", serr);
    free(text);
    if (rc < 0) {
        kvd_log(KVD_LOG_WARN, "probe %s (%s) of window %u: %s", id, kind, j->window, err);
        return -EAGAIN;
    }
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "model", j->model);
    cJSON_AddNumberToObject(b, "window", j->window);
    cJSON_AddStringToObject(b, "id", id);
    cJSON_AddItemToObject(b, "outputs", cJSON_Parse(outs));
    free(outs);
    long st;
    cJSON *o = kvd_join__call(j, "POST", "/v1/leases/probe", b, true, &st);
    const cJSON *res = cJSON_GetObjectItemCaseSensitive(o, "probe");
    if (st == 200)
        kvd_log(KVD_LOG_INFO, "probe %s (%s) of window %u: the market found it right (NMSE %.3g, "
                "%.0f ms, %s)", id, kind, j->window, util_json_number(res, "nmse", 0),
                util_now_ms() - t0, in_stage ? "run by the serving stage" : "window opened for it");
    else if (st == 403)
        kvd_log(KVD_LOG_ERROR, "probe %s (%s) of window %u: the market found it wrong; the lease "
                "is over and this node's claims are refused for a while", id, kind, j->window);
    cJSON_Delete(o);
    return st == 200 ? 0 : st >= 400 && st < 500 ? -EPERM : -EAGAIN;
}

/* The answer split into parts of at most RING_AUDIT_PART_BYTES (docs/market.md, "Audits"): the
 * items of its arrays in order, each part an object with its "id", its pieces of the arrays,
 * "part" and "parts"; an array of the parts (one: the answer itself, as it is). ans is taken. */
static cJSON *audit_parts(cJSON *ans, size_t len)
{
    static const char *const names[] = RING_AUDIT_ARRAYS;
    cJSON *parts = cJSON_CreateArray();
    if (len <= RING_AUDIT_PART_BYTES) {
        cJSON_AddItemToArray(parts, ans);
        return parts;
    }
    const char *id = kvd_join__jstr_or(ans, "id", "?");
    cJSON *cur = NULL, *it;
    size_t used = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        cJSON *arr = cJSON_GetObjectItemCaseSensitive(ans, names[i]);
        while (cJSON_IsArray(arr) && (it = cJSON_DetachItemFromArray(arr, 0))) {
            char *t = cJSON_PrintUnformatted(it);
            size_t l = t ? strlen(t) + 1 : 0;
            free(t);
            if (!cur || used + l > RING_AUDIT_PART_BYTES - 4096) {
                cur = cJSON_CreateObject();
                cJSON_AddStringToObject(cur, "id", id);
                const cJSON *smp = cJSON_GetObjectItemCaseSensitive(ans, "sampling");
                if (smp)   /* the session's sampling, which the market reads from the last part */
                    cJSON_AddItemToObject(cur, "sampling", cJSON_Duplicate(smp, 0));
                cJSON_AddItemToArray(parts, cur);
                used = 256;
            }
            cJSON *to = cJSON_GetObjectItemCaseSensitive(cur, names[i]);
            if (!to)
                to = cJSON_AddArrayToObject(cur, names[i]);
            cJSON_AddItemToArray(to, it);
            used += l;
        }
    }
    int n = cJSON_GetArraySize(parts), k = 0;
    cJSON_ArrayForEach(it, parts) {
        cJSON_AddNumberToObject(it, "part", k++);
        cJSON_AddNumberToObject(it, "parts", n);
    }
    cJSON_Delete(ans);
    return parts;
}

/* Answer an audit of this node's past work the market sent with a heartbeat's answer
 * (docs/market.md, "Audits"): the rows of that session from the stage's row log, with their
 * Merkle proofs, posted to POST /v1/leases/audit. 0 when the market took the answer (it
 * recomputes it later; a wrong one ends the lease at a later heartbeat), -EPERM when it found
 * it wrong (the lease is over, the claims refused), -EAGAIN when it could not be answered now
 * (the market sends it again until its deadline). */
static int audit_answer(struct join *j, const cJSON *a)
{
    char err[KV_ERR_MAX], *ans = NULL, *text = cJSON_PrintUnformatted(a);
    const char *id = kvd_join__jstr_or(a, "id", "?");
    int rc = text ? kvd_stage_audit(j->dir, text, &ans, err, sizeof err) : -ENOMEM;
    free(text);
    if (rc < 0) {
        kvd_log(KVD_LOG_WARN, "audit %s: %s", id, err);
        return -EAGAIN;
    }
    size_t len = strlen(ans);
    cJSON *b = cJSON_Parse(ans);
    free(ans);
    if (!b)
        return -EAGAIN;
    /* a large answer in parts, in order: the market keeps each until the last */
    cJSON *parts = audit_parts(b, len), *o = NULL;
    int np = cJSON_GetArraySize(parts);
    long st = 0;
    for (int k = 0; k < np; k++) {
        cJSON *part = cJSON_DetachItemFromArray(parts, 0);
        cJSON_AddStringToObject(part, "model", j->model);
        cJSON_AddNumberToObject(part, "window", j->window);
        cJSON_Delete(o);
        o = kvd_join__call(j, "POST", "/v1/leases/audit", part, true, &st);
        if (k + 1 < np && (st != 202 || strcmp(kvd_join__jstr_or(o, "audit", ""), "more"))) {
            if (st != 403)
                st = 0;   /* the market did not keep it: the answer goes again with a later beat */
            break;
        }
    }
    cJSON_Delete(parts);
    if (np > 1 && (st == 200 || st == 202))
        kvd_log(KVD_LOG_INFO, "audit %s: answer of %zu bytes sent in %d parts", id, len, np);
    bool inconclusive = !strcmp(kvd_join__jstr_or(o, "audit", ""), "inconclusive");
    if (st == 200 || st == 202)
        kvd_log(KVD_LOG_INFO, "audit %s of session %.16s: answered (%s)", id,
                kvd_join__jstr_or(a, "session", "?"),
                st == 202 ? "the market recomputes it" : inconclusive ? "inconclusive: no token in "
                "what an answer holds, nothing to judge" : "passed on its proofs");
    else if (st == 403)
        kvd_log(KVD_LOG_ERROR, "audit %s: the market found this node's work wrong; the lease is "
                "over and this node's claims are refused for a while", id);
    cJSON_Delete(o);
    return st == 200 || st == 202 ? 0 : st == 403 ? -EPERM : -EAGAIN;
}

/* Our stage's status over its control socket (caller deletes), NULL when none runs or it does
 * not answer. */
cJSON *kvd_join__stage_status(struct join *j)
{
    char sock[4200], err[KV_ERR_MAX];
    cJSON *o = NULL;
    if (j->stage <= 0)
        return NULL;
    snprintf(sock, sizeof sock, "%s/kvd.sock", j->dir);
    if (ring_ctl_request(sock, "{\"op\":\"status\"}", status_obj, &o, 3000, err, sizeof err) < 0) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* What a heartbeat tells the market of the ring (docs/market.md, "The map"): the manifest our
 * stage runs, its links' state (and why one is down), how long ago it last ran a token, and on
 * rank 0 the API's URL. Nothing while no stage runs. */
static void ring_report(struct join *j, cJSON *b)
{
    if (j->stage <= 0 || !j->manifest_sha[0])
        return;
    cJSON_AddStringToObject(b, "manifest", j->manifest_sha);
    cJSON *s = kvd_join__stage_status(j), *l = cJSON_CreateObject();
    if (!s) {
        cJSON_AddBoolToObject(l, "linked", false);
        cJSON_AddStringToObject(l, "error", "the stage does not answer on its control socket");
    } else {
        cJSON_AddBoolToObject(l, "linked",
                              cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, "linked")));
        for (int k = 0; k < 2; k++) {
            const char *side = k ? "out" : "in";
            const cJSON *x = cJSON_GetObjectItemCaseSensitive(s, side);
            char key[16];
            cJSON_AddStringToObject(l, side, kvd_join__jstr_or(x, "state", "down"));
            const char *e = kvd_join__jstr_or(x, "error", NULL);
            snprintf(key, sizeof key, "%s_error", side);
            if (e && strcmp(kvd_join__jstr_or(x, "state", "down"), "up"))
                cJSON_AddStringToObject(l, key, e);
            /* the address our successor was dialled at: the market's evidence of which node
             * serves the next rank after a takeover */
            if (k && !strcmp(kvd_join__jstr_or(x, "state", "down"), "up") && kvd_join__jstr_or(x, "peer", NULL))
                cJSON_AddStringToObject(l, "out_peer", kvd_join__jstr_or(x, "peer", NULL));
        }
        double age = util_json_number(s, "last_token_age_s", -1);
        if (age >= 0)
            cJSON_AddNumberToObject(b, "last_token_age_s", age);
    }
    cJSON_AddItemToObject(b, "links", l);
    if (j->rank == 0 && j->api_url[0])
        cJSON_AddStringToObject(b, "api", j->api_url);
    cJSON_Delete(s);
}

/* Renew the lease (with the endpoint once the window is here), answering a probe the market
 * sends with it: 0, -EPERM when the lease is gone (or a probe failed), -EINVAL when the
 * market found the heartbeat malformed (an endpoint it refuses: its reason is logged),
 * -EAGAIN when the market did not answer. */
static int standby_beat(struct join *j, const char *endpoint);
int kvd_join__heartbeat(struct join *j, const char *endpoint, uint64_t progress)
{
    if (j->standby)
        return standby_beat(j, endpoint);
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "model", j->model);
    cJSON_AddNumberToObject(b, "window", j->window);
    cJSON_AddNumberToObject(b, "progress", (double)progress);
    if (endpoint)
        cJSON_AddStringToObject(b, "endpoint", endpoint);
    ring_report(j, b);
    long st;
    cJSON *o = kvd_join__call(j, "POST", "/v1/leases/heartbeat", b, true, &st);
    int rc = st == 200 ? 0 : st == 400 ? -EINVAL : st >= 400 && st < 500 ? -EPERM : -EAGAIN;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "probe");
    if (rc == 0 && cJSON_IsObject(p))
        rc = probe_answer(j, p);
    const cJSON *au = cJSON_GetObjectItemCaseSensitive(o, "audit");
    if (rc == 0 && cJSON_IsObject(au) && audit_answer(j, au) == -EPERM)
        rc = -EPERM;
    cJSON_Delete(o);
    return rc;
}

/* Renew our standby lease (with our endpoint once the window is here and the stage may
 * listen): 0, -EPERM when the market no longer has it for us, -EINVAL when it refused the
 * call's form (logged), -EAGAIN when it did not answer. */
static int standby_beat(struct join *j, const char *endpoint)
{
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "model", j->model);
    cJSON_AddNumberToObject(b, "window", j->window);
    if (endpoint)
        cJSON_AddStringToObject(b, "endpoint", endpoint);
    long st;
    cJSON *o = kvd_join__call(j, "POST", "/v1/standbys", b, true, &st);
    if (st >= 400 && st < 500)
        kvd_log(KVD_LOG_WARN, "the market refused the standby lease on window %u (HTTP %ld): %s",
                j->window, st, kvd_join__jstr_or(o, "error", "?"));
    cJSON_Delete(o);
    return st == 200 || st == 201 ? 0 : st == 400 ? -EINVAL : st >= 400 && st < 500 ? -EPERM : -EAGAIN;
}

/* Tell the market our standby stage took its rank over (it was dialled for it): 1 when the
 * market made us the window's holder, 0 while it waits for the old holder to lapse (or did not
 * answer), -EPERM when it refused. */
int kvd_join__standby_took(struct join *j, int rank)
{
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "model", j->model);
    cJSON_AddNumberToObject(b, "window", j->window);
    cJSON_AddNumberToObject(b, "serving", rank);
    ring_report(j, b);   /* with the manifest the stage runs */
    if (!cJSON_GetObjectItemCaseSensitive(b, "manifest"))
        cJSON_AddStringToObject(b, "manifest", j->manifest_sha);
    long st;
    cJSON *o = kvd_join__call(j, "POST", "/v1/standbys", b, true, &st);
    int rc = 0;
    if (st == 200 && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "holder"))) {
        kvd_log(KVD_LOG_INFO, "took rank %d over; the market made this node the holder of window "
                "%u", rank, j->window);
        rc = 1;
    } else if (st == 202) {
        if (!j->took_pending_logged)
            kvd_log(KVD_LOG_INFO, "took rank %d over; the market waits: %s", rank,
                    kvd_join__jstr_or(o, "pending", "?"));
        j->took_pending_logged = true;
    } else if (st >= 400 && st < 500) {
        kvd_log(KVD_LOG_WARN, "took rank %d over; the market refused to record it (HTTP %ld): %s",
                rank, st, kvd_join__jstr_or(o, "error", "?"));
        rc = -EPERM;
    }
    cJSON_Delete(o);
    return rc;
}

/* Take our window back after our lease lapsed (the market was unreachable for longer than
 * a lease, say): during its grace period only we may, and the stage keeps running meanwhile,
 * so the ring is not disturbed. 0 when the lease is ours and active again. */
int kvd_join__reclaim(struct join *j)
{
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "model", j->model);
    cJSON_AddNumberToObject(b, "window", j->window);
    long st;
    cJSON *o = kvd_join__call(j, "POST", "/v1/claims", b, true, &st);
    cJSON_Delete(o);
    if (st != 200 && st != 201)
        return -EPERM;
    return kvd_join__heartbeat(j, j->endpoint, 0);
}

/* Give our lease up (moving, a clean stop): the window is free at once; a standby's lease
 * leaves the roster at once. */
void kvd_join__release(struct join *j)
{
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "model", j->model);
    cJSON_AddNumberToObject(b, "window", j->window);
    if (j->standby)
        cJSON_AddBoolToObject(b, "release", true);
    long st;
    cJSON_Delete(kvd_join__call(j, "POST", j->standby ? "/v1/standbys" : "/v1/leases/release", b, true, &st));
}

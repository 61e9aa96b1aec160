/* claim.c — getting a window: the node's profile to the market, the coverage map read and
 * the best-rewarded window that fits claimed (or, once every window has a stage, a standby
 * lease on one). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kvd/join/internal.h"
#include "util/err.h"
#include "util/util.h"

int kvd_join__profile(struct join *j)
{
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "model", j->model);
    cJSON_AddNumberToObject(b, "mem_bytes", (double)j->mem);
    cJSON_AddStringToObject(b, "backend", j->backend);
    cJSON_AddBoolToObject(b, "inbound", j->relay == NULL);
    long st;
    cJSON *o = kvd_join__call(j, "POST", "/v1/nodes", b, true, &st);
    cJSON_Delete(o);
    return st == 200 ? 0 : st >= 400 && st < 500 ? -EINVAL : -EAGAIN;
}

/* The window to claim from a coverage map: free (or kept for this node), fits in memory
 * (the planner's estimate), the best reward; ties: the largest window (the fewest devices
 * left to complete the ring). -1 when none; then *kept names a window that fits but is kept
 * for its holder in its grace period (borrowed from cov; NULL when none). */
static int pick(struct join *j, const cJSON *cov, const cJSON **kept_w)
{
    const cJSON *w, *ws = cJSON_GetObjectItemCaseSensitive(cov, "windows");
    int best = -1;
    double best_r = -1, best_mem = -1;
    *kept_w = NULL;
    cJSON_ArrayForEach(w, ws) {
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(w, "state");
        const cJSON *stg = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(w, "stages"), 0);
        const cJSON *holder = cJSON_GetObjectItemCaseSensitive(stg, "node");
        const cJSON *hs = cJSON_GetObjectItemCaseSensitive(stg, "state");
        bool mine = cJSON_IsString(holder) && !strcmp(holder->valuestring, j->node);
        bool kept = cJSON_IsString(hs) && !strcmp(hs->valuestring, "grace") && !mine;
        double mem = util_json_number(w, "mem_bytes", 0), r = util_json_number(w, "reward", 0);
        if (kept && mem <= (double)j->mem && !*kept_w)
            *kept_w = w;
        if (!cJSON_IsString(st) || kept || (strcmp(st->valuestring, "uncovered") && !mine))
            continue;
        if (mem > (double)j->mem ||
            ((int)util_json_number(w, "window", -1) == j->avoid && util_now_s() < j->avoid_until))
            continue;
        if (mine || (int)util_json_number(w, "window", -1) == j->prefer)
            return (int)util_json_number(w, "window", 0);   /* ours to take back first, or
                                                             * the one we are moving to */
        if (r > best_r || (r == best_r && mem > best_mem)) {
            best = (int)util_json_number(w, "window", 0);
            best_r = r;
            best_mem = mem;
        }
    }
    return best;
}

/* Once every window has an active stage, the window to stand by for (docs/market.md,
 * "Standbys"): any rank's but rank 0's (which has none) that fits, with the
 * fewest standbys (ties: the largest window, the costliest to lose). -1 when none (or the ring
 * is not complete yet). */
static int standby_pick(struct join *j, const cJSON *cov)
{
    const cJSON *w, *ws = cJSON_GetObjectItemCaseSensitive(cov, "windows");
    int best = -1, best_n = 0, last = cJSON_GetArraySize(ws) - 1;
    double best_mem = -1;
    cJSON_ArrayForEach(w, ws) {
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(w, "state");
        if (!cJSON_IsString(st) || strcmp(st->valuestring, "active"))
            return -1;   /* a window still free or reserved: the ring is not complete */
        int idx = (int)util_json_number(w, "window", -1);
        int n = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(w, "standbys"));
        double mem = util_json_number(w, "mem_bytes", 0);
        if (idx <= 0 || idx > last || mem > (double)j->mem)
            continue;
        if (best < 0 || n < best_n || (n == best_n && mem > best_mem)) {
            best = idx;
            best_n = n;
            best_mem = mem;
        }
    }
    return best;
}

/* Take a standby lease on window w: 0 with j->window/first/last set and j->standby, -EAGAIN to
 * read the map again later, -EINVAL when the market refuses in a way no retry changes. */
static int standby_claim(struct join *j, int w)
{
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "model", j->model);
    cJSON_AddNumberToObject(b, "window", w);
    long st;
    cJSON *o = kvd_join__call(j, "POST", "/v1/standbys", b, true, &st);
    int rc = -EAGAIN;
    const cJSON *ly = cJSON_GetObjectItemCaseSensitive(o, "layers");
    if ((st == 200 || st == 201) && cJSON_GetArraySize(ly) == 2) {
        j->window = (uint32_t)w;
        j->first = (uint32_t)cJSON_GetArrayItem(ly, 0)->valuedouble;
        j->last = (uint32_t)cJSON_GetArrayItem(ly, 1)->valuedouble;
        j->lease_s = util_json_number(o, "lease_s", 20);
        j->reserve_s = j->lease_s;
        j->standby = true;
        j->standby_rank = (int)util_json_number(o, "rank", w);
        j->took_pending_logged = false;
        kvd_log(KVD_LOG_INFO, "every window of %.16s... has a stage: standing by for window %d "
                "(layers [%u, %u), rank %d), its window pulled ahead", j->model, w, j->first, j->last,
                j->standby_rank);
        rc = 0;
    } else if (st == 403 || st == 400) {
        kvd_log(KVD_LOG_ERROR, "the market refused a standby lease on window %d (HTTP %ld): %s; "
                "not claiming again", w, st, kvd_join__jstr_or(o, "error", "?"));
        rc = -EINVAL;
    } else if (st >= 400) {
        kvd_log(KVD_LOG_INFO, "no standby lease on window %d (HTTP %ld): %s; reading the map again",
                w, st, kvd_join__jstr_or(o, "error", "?"));
    }
    cJSON_Delete(o);
    return rc;
}

/* Claim a window: 0 with j->window/first/last set, -EAGAIN to try again later, -EINVAL when
 * the market refused in a way no retry changes (the model is gone, the claim is malformed,
 * this node's claims are refused: its reason is logged). */
int kvd_join__claim(struct join *j)
{
    char path[128];
    long st;
    snprintf(path, sizeof path, "/v1/models/%s/coverage", j->model);
    kvd_join__sleep_ms(j->jitter_ms ? kvd_join__rand_u32() % j->jitter_ms : 0);
    cJSON *cov = kvd_join__call(j, "GET", path, NULL, false, &st);
    if (!cov || st != 200) {
        cJSON_Delete(cov);
        return st == 404 ? -EINVAL : -EAGAIN;
    }
    const cJSON *kept;
    int w = pick(j, cov, &kept);
    if (w < 0 && kept) {
        const cJSON *stg = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(kept, "stages"), 0);
        kvd_log(KVD_LOG_INFO, "window %d of %.16s... fits in %llu bytes but is kept for its holder "
                "%.16s... in its grace period (%.0f s more); waiting",
                (int)util_json_number(kept, "window", -1), j->model, (unsigned long long)j->mem,
                kvd_join__jstr_or(stg, "node", "?"), util_json_number(stg, "expires_in", 0));
    } else if (w < 0 && !j->relay && (w = standby_pick(j, cov)) >= 0) {
        cJSON_Delete(cov);
        return standby_claim(j, w);
    } else if (w < 0) {
        kvd_log(KVD_LOG_INFO, "no free window of %.16s... fits in %llu bytes; waiting", j->model,
                (unsigned long long)j->mem);
    }
    cJSON_Delete(cov);
    if (w < 0)
        return -EAGAIN;
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "model", j->model);
    cJSON_AddNumberToObject(b, "window", w);
    if (j->relay)   /* counted under the market's cap for nodes behind carrier NAT */
        cJSON_AddBoolToObject(b, "relay", true);
    cJSON *o = kvd_join__call(j, "POST", "/v1/claims", b, true, &st);
    int rc = -EAGAIN;
    if (o && (st == 200 || st == 201)) {
        const cJSON *ly = cJSON_GetObjectItemCaseSensitive(o, "layers");
        j->window = (uint32_t)w;
        j->first = (uint32_t)cJSON_GetArrayItem(ly, 0)->valuedouble;
        j->last = (uint32_t)cJSON_GetArrayItem(ly, 1)->valuedouble;
        j->lease_s = util_json_number(o, "lease_s", 20);
        j->reserve_s = util_json_number(o, "reserve_s", 60);
        kvd_log(KVD_LOG_INFO, "claimed window %d (layers [%u, %u)) of %.16s...", w, j->first, j->last,
                j->model);
        j->prefer = -1;
        rc = 0;
    } else if (o && st == 409) {
        kvd_log(KVD_LOG_INFO, "window %d went to another node; reading the map again", w);
    } else if (st == 429 || st == 404) {
        /* over a rate limit: later; no such window: the plan changed, read the map again */
        const char *e = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "error"));
        kvd_log(KVD_LOG_WARN, "the market refused the claim of window %d: %s", w, e ? e : "?");
    } else if (st == 403 && cJSON_GetObjectItemCaseSensitive(o, "refused_window")) {
        /* our reservation of that window ran out: another window may be claimed meanwhile */
        const char *e = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "error"));
        kvd_log(KVD_LOG_WARN, "the market refused the claim of window %d: %s", w, e ? e : "?");
        j->avoid = w;
        j->avoid_until = util_now_s() + 60;
    } else if (st >= 400 && st < 500) {
        const char *e = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "error"));
        kvd_log(KVD_LOG_ERROR, "the market refused the claim of window %d (HTTP %ld): %s; not "
                "claiming again", w, st, e ? e : "?");
        rc = -EINVAL;
    }
    cJSON_Delete(o);
    return rc;
}

/* hold.c — holding the window: heartbeats, manifests and the stage's health in one loop, and
 * moving to a better window when one stays better long enough. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cjson/cJSON.h>

#include "kvd/join/internal.h"
#include "util/err.h"
#include "util/util.h"

/* What a window is worth to the node that covers it, per token it runs: its layers times the
 * reward it pays once covered (the published reward without its coverage factor, 1 + 2 x (1 -
 * c): docs/market.md, "Rewards"). */
static double window_value(const cJSON *w)
{
    const cJSON *ly = cJSON_GetObjectItemCaseSensitive(w, "layers");
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(w, "state");
    double layers = cJSON_GetArraySize(ly) == 2 ?
        cJSON_GetArrayItem(ly, 1)->valuedouble - cJSON_GetArrayItem(ly, 0)->valuedouble : 0;
    double c = !cJSON_IsString(st) ? 0 : !strcmp(st->valuestring, "active") ? 1 :
               !strcmp(st->valuestring, "reserved") ? 0.5 : 0;
    return layers * util_json_number(w, "reward", 0) / (1 + 2 * (1 - c));
}

/* Sessions open on our stage now; -1 when its control socket does not answer. */
static int stage_sessions(struct join *j)
{
    if (j->stage <= 0)
        return 0;   /* no stage runs (no ring yet): nothing to interrupt */
    cJSON *s = kvd_join__stage_status(j);
    int n = s ? (int)util_json_number(s, "sessions", -1) : -1;
    cJSON_Delete(s);
    return n;
}

/* The hysteresis of moving (docs/market.md, "Moving"): the free window to move to now, or -1.
 * A window qualifies while it is free, fits, and is worth move_ratio times ours or more; the
 * move happens once one has qualified at every look for move_after_s and our stage has no
 * session open. Rewards that change by less, or for less long, move nobody. */
static int move_target(struct join *j)
{
    char path[128];
    long st;
    snprintf(path, sizeof path, "/v1/models/%s/coverage", j->model);
    cJSON *cov = kvd_join__call(j, "GET", path, NULL, false, &st);
    if (!cov || st != 200) {
        cJSON_Delete(cov);
        return -1;   /* no map: no judgement (the window we hold is not at stake) */
    }
    double mine = 0, best = 0;
    int bw = -1;
    const cJSON *w;
    cJSON_ArrayForEach(w, cJSON_GetObjectItemCaseSensitive(cov, "windows")) {
        int idx = (int)util_json_number(w, "window", -1);
        const cJSON *state = cJSON_GetObjectItemCaseSensitive(w, "state");
        const cJSON *stg = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(w, "stages"), 0);
        const cJSON *hs = cJSON_GetObjectItemCaseSensitive(stg, "state");
        if (idx == (int)j->window) {
            mine = window_value(w);
            continue;
        }
        if (!cJSON_IsString(state) || strcmp(state->valuestring, "uncovered") ||
            (cJSON_IsString(hs) && !strcmp(hs->valuestring, "grace")) ||
            util_json_number(w, "mem_bytes", 0) > (double)j->mem)
            continue;
        double v = window_value(w);
        if (v > best) {
            best = v;
            bw = idx;
        }
    }
    cJSON_Delete(cov);
    if (bw < 0 || mine <= 0 || best < j->move_ratio * mine) {
        if (j->better_since)
            kvd_log(KVD_LOG_INFO, "no free window is worth %.2gx ours any more; staying",
                    j->move_ratio);
        j->better_since = 0;
        return -1;
    }
    double now = util_now_s();
    if (!j->better_since || bw != j->better) {
        kvd_log(KVD_LOG_INFO, "window %d is worth %.2fx ours (window %u); moving there if that "
                "lasts %.0f s", bw, best / mine, j->window, j->move_after_s);
        j->better_since = now;
        j->better = bw;
    }
    if (now - j->better_since < j->move_after_s)
        return -1;
    int n = stage_sessions(j);
    if (n != 0) {
        kvd_log(KVD_LOG_DEBUG, "window %d still better, but %d session(s) run here", bw, n);
        return -1;   /* never in the middle of sessions */
    }
    return bw;
}

/* Hold the window: heartbeats, manifests, the stage's health. Returns when the lease is lost
 * (-EPERM), to move to a better window (-EXDEV, j->prefer set) or on a stop (0). The market being down changes nothing here but the retries:
 * the ring keeps serving (docs/market.md). */
int kvd_join__hold(struct join *j)
{
    double next_hb = 0;
    uint32_t backoff = 1000;
    while (!kvd_join__stop_flag) {
        if (util_now_s() >= next_hb) {
            int rc = kvd_join__heartbeat(j, j->endpoint, 0);
            if (rc == -EPERM && j->standby) {
                /* the market may have made us the holder already (its answer to our takeover
                 * lost): say it again before giving anything up */
                kvd_join__standby_tick(j);
                if (!j->standby)
                    rc = kvd_join__heartbeat(j, j->endpoint, 0);
            }
            if (rc == -EINVAL || (rc == -EPERM && (j->standby || kvd_join__reclaim(j))))
                return rc;
            next_hb = util_now_s() + j->lease_s / 4;
            int to = j->standby ? -1 : move_target(j);
            if (to >= 0) {
                j->prefer = to;
                return -EXDEV;
            }
        }
        kvd_join__receipts_tick(j);
        kvd_join__clients_refresh(j);
        kvd_join__roster_refresh(j);
        kvd_join__standby_tick(j);
        if (j->stage > 0 && waitpid(j->stage, NULL, WNOHANG) == j->stage) {
            kvd_log(KVD_LOG_WARN, "the stage exited; starting it again");
            j->stage = 0;
            j->manifest_sha[0] = 0;
        }
        /* a standby waiting for the roster to name it looks again soon; nobody waits past
         * its next heartbeat */
        double wait = j->standby && j->stage <= 0 ? 1 : j->lease_s / 4 - 1;
        if (wait > next_hb - util_now_s())
            wait = next_hb - util_now_s();
        if (kvd_join__manifest_poll(j, wait < 1 ? 1 : wait) == -EAGAIN) {
            kvd_join__sleep_ms(backoff);   /* the market is unreachable: back off */
            backoff = backoff < 8000 ? backoff * 2 : 8000;
        } else {
            backoff = 1000;
        }
    }
    return 0;
}

/* join.c — the join role (docs/market.md, "Joining"): a node that knows only a market and a
 * model id profiles itself, reads the coverage map, claims the best-rewarded window it can
 * hold (after a random delay, so a crowd does not herd onto one window), pulls just that
 * window verified against the model's catalog while heartbeats keep the reserved lease,
 * shows the market its endpoint answers, waits for the ring's manifest and runs as that
 * rank's stage, renewing its lease. A new manifest (a replaced rank) restarts the stage on
 * it; a lost lease sends the node back to claiming.
 *
 * The stage runs in a child process (kvd_stage_run, the stage role's entry point) that dies
 * with this one, so a restart on a new manifest starts from a clean loop. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include "gguf/gguf.h"
#include "kvd/kvd.h"
#include "net/net.h"
#include "ringlib/ring.h"
#include "seed/seed.h"
#include "util/err.h"
#include "util/util.h"

#define CALL_MS 15000
#define CLIENTS_EVERY_S 3.0      /* how often a ring's API learns the market's paying clients */

struct join {
    const char *market, *model, *dir, *listen, *relay, *backend, *api;
    const char *api_keys;       /* --api-key-file: keys let in besides the market's clients */
    const char *chat_template;  /* --chat-template: the API's template family (NULL: the model's) */
    const char *advertise;      /* --advertise HOST:PORT: the endpoint others dial, when not --listen */
    char api_url[300];          /* rank 0's API as clients reach it (http://HOST:PORT) */
    char *market_clients;       /* the market's paying clients, as the lines last written */
    uint64_t mem;
    int n_threads;
    uint32_t jitter_ms;
    struct net_identity *id;
    char node[65];
    char catalog_path[4096], window_path[4096], manifest_path[4096];
    char receipts_path[4096], offset_path[4096], clients_path[4096];
    double clients_next;        /* the next refresh of the paying clients' list */
    double receipts_next;       /* the next try at submitting receipts (a backoff) */
    uint32_t receipts_backoff_ms;
    /* moving (docs/market.md, "Moving"): to a free window worth move_ratio x ours or more,
     * held so for move_after_s, with no session open on our stage */
    double move_ratio, move_after_s;
    double better_since;        /* when a window first looked that much better (0: none) */
    int better, prefer;         /* that window; the one to claim first (-1: none) */
    int avoid;                  /* a window the market refuses us for a while (-1: none) ... */
    double avoid_until;         /* ... until then */
    char endpoint[RING_ENDPOINT_MAX];
    uint32_t window, first, last;
    double lease_s, reserve_s;
    char manifest_sha[65];
    int rank;                   /* our rank in the manifest the stage runs (-1: none) */
    /* a standby (docs/market.md, "Standbys"): holds a standby lease on window, its window
     * pulled ahead, its stage waiting to be dialled for rank standby_rank */
    bool standby;
    int standby_rank;
    bool took_pending_logged;   /* the market said a takeover waits for the holder to lapse */
    char roster_path[4096];
    char roster_sha[65];        /* the manifest the roster last written is for ("": none) */
    bool roster_me;             /* ... and whether it names this node */
    char *roster_text;          /* its text as last written */
    bool held;                  /* we hold a lease on window (given back on a clean exit) */
    int probe_fd;
    pid_t stage;
};

static volatile sig_atomic_t stop_flag;
static void on_stop(int sig) { (void)sig; stop_flag = 1; }

static void sleep_ms(uint32_t ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) && !stop_flag)
        ;
}

static uint32_t rand_u32(void)
{
    uint32_t v = 0;
    if (RAND_bytes((unsigned char *)&v, sizeof v) != 1)
        v = (uint32_t)getpid() * 2654435761u ^ (uint32_t)time(NULL);
    return v;
}

/* A call whose answer is JSON: the object (caller deletes) or NULL; *status the HTTP status
 * (0 when the market did not answer). signed_: with the node key. */
static cJSON *call(struct join *j, const char *method, const char *path, cJSON *body, bool signed_,
                   long *status)
{
    char err[KV_ERR_MAX], *resp = NULL, *b = body ? cJSON_PrintUnformatted(body) : NULL;
    cJSON_Delete(body);
    int rc = ring_market_call(j->market, method, path, b, signed_ ? j->id : NULL, CALL_MS, status,
                              &resp, err, sizeof err);
    free(b);
    if (rc < 0) {
        kvd_log(KVD_LOG_WARN, "market: %s", err);
        *status = 0;
        return NULL;
    }
    cJSON *o = cJSON_Parse(resp);
    if (*status >= 400) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, "error");
        kvd_log(KVD_LOG_WARN, "market: %s %s: HTTP %ld: %s", method, path, *status,
                cJSON_IsString(e) ? e->valuestring : resp);
    }
    free(resp);
    return o;
}

static const char *jstr_or(const cJSON *o, const char *key, const char *def)
{
    const char *v = util_json_string(o, key);
    return v ? v : def;
}

static int profile(struct join *j)
{
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "model", j->model);
    cJSON_AddNumberToObject(b, "mem_bytes", (double)j->mem);
    cJSON_AddStringToObject(b, "backend", j->backend);
    cJSON_AddBoolToObject(b, "inbound", j->relay == NULL);
    long st;
    cJSON *o = call(j, "POST", "/v1/nodes", b, true, &st);
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
 * "Standbys"): a middle rank's (rank 0 and the last rank have none) that fits, with the
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
        if (idx <= 0 || idx >= last || mem > (double)j->mem)
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
    cJSON *o = call(j, "POST", "/v1/standbys", b, true, &st);
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
                "not claiming again", w, st, jstr_or(o, "error", "?"));
        rc = -EINVAL;
    } else if (st >= 400) {
        kvd_log(KVD_LOG_INFO, "no standby lease on window %d (HTTP %ld): %s; reading the map again",
                w, st, jstr_or(o, "error", "?"));
    }
    cJSON_Delete(o);
    return rc;
}

/* Claim a window: 0 with j->window/first/last set, -EAGAIN to try again later, -EINVAL when
 * the market refused in a way no retry changes (the model is gone, the claim is malformed,
 * this node's claims are refused: its reason is logged). */
static int claim(struct join *j)
{
    char path[128];
    long st;
    snprintf(path, sizeof path, "/v1/models/%s/coverage", j->model);
    sleep_ms(j->jitter_ms ? rand_u32() % j->jitter_ms : 0);
    cJSON *cov = call(j, "GET", path, NULL, false, &st);
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
                jstr_or(stg, "node", "?"), util_json_number(stg, "expires_in", 0));
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
    cJSON *o = call(j, "POST", "/v1/claims", b, true, &st);
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

/* Answer a known-answer probe the market sent with a heartbeat's answer (docs/market.md,
 * "Probes"): run it through this node's compute backend on the pulled window and post the
 * outputs. 0 when the market found them right, -EPERM when it found them wrong (the lease is
 * over and this node's claims are refused for a while: the market's reason is logged),
 * -EAGAIN when the probe could not run or the market did not answer. */
static int probe_answer(struct join *j, const cJSON *p)
{
    char err[KV_ERR_MAX], *outs = NULL, *text = cJSON_PrintUnformatted(p);
    const cJSON *jid = cJSON_GetObjectItemCaseSensitive(p, "id");
    const cJSON *jk = cJSON_GetObjectItemCaseSensitive(p, "kind");
    const char *id = cJSON_IsString(jid) ? jid->valuestring : "?";
    const char *kind = cJSON_IsString(jk) ? jk->valuestring : "?";
    double t0 = util_now_ms();
    int rc = text ? kvd_stage_probe(strcmp(j->backend, "cpu") ? j->backend : NULL, j->window_path,
                                    j->n_threads, text, &outs, err, sizeof err) : -ENOMEM;
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
    cJSON *o = call(j, "POST", "/v1/leases/probe", b, true, &st);
    const cJSON *res = cJSON_GetObjectItemCaseSensitive(o, "probe");
    if (st == 200)
        kvd_log(KVD_LOG_INFO, "probe %s (%s) of window %u: the market found it right (NMSE %.3g, "
                "%.0f ms)", id, kind, j->window, util_json_number(res, "nmse", 0), util_now_ms() - t0);
    else if (st == 403)
        kvd_log(KVD_LOG_ERROR, "probe %s (%s) of window %u: the market found it wrong; the lease "
                "is over and this node's claims are refused for a while", id, kind, j->window);
    cJSON_Delete(o);
    return st == 200 ? 0 : st >= 400 && st < 500 ? -EPERM : -EAGAIN;
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
    const char *id = jstr_or(a, "id", "?");
    int rc = text ? kvd_stage_audit(j->dir, text, &ans, err, sizeof err) : -ENOMEM;
    free(text);
    if (rc < 0) {
        kvd_log(KVD_LOG_WARN, "audit %s: %s", id, err);
        return -EAGAIN;
    }
    cJSON *b = cJSON_Parse(ans);
    free(ans);
    if (!b)
        return -EAGAIN;
    cJSON_AddStringToObject(b, "model", j->model);
    cJSON_AddNumberToObject(b, "window", j->window);
    long st;
    cJSON *o = call(j, "POST", "/v1/leases/audit", b, true, &st);
    cJSON_Delete(o);
    if (st == 200 || st == 202)
        kvd_log(KVD_LOG_INFO, "audit %s of session %.16s: answered (%s)", id,
                jstr_or(a, "session", "?"),
                st == 200 ? "passed on its proofs" : "the market recomputes it");
    else if (st == 403)
        kvd_log(KVD_LOG_ERROR, "audit %s: the market found this node's work wrong; the lease is "
                "over and this node's claims are refused for a while", id);
    return st == 200 || st == 202 ? 0 : st == 403 ? -EPERM : -EAGAIN;
}

static int status_obj(const char *line, void *ud)
{
    cJSON_Delete(*(cJSON **)ud);
    *(cJSON **)ud = cJSON_Parse(line);
    return 1;
}

/* Our stage's status over its control socket (caller deletes), NULL when none runs or it does
 * not answer. */
static cJSON *stage_status(struct join *j)
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
    cJSON *s = stage_status(j), *l = cJSON_CreateObject();
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
            cJSON_AddStringToObject(l, side, jstr_or(x, "state", "down"));
            const char *e = jstr_or(x, "error", NULL);
            snprintf(key, sizeof key, "%s_error", side);
            if (e && strcmp(jstr_or(x, "state", "down"), "up"))
                cJSON_AddStringToObject(l, key, e);
            /* the address our successor was dialled at: the market's evidence of which node
             * serves the next rank after a takeover */
            if (k && !strcmp(jstr_or(x, "state", "down"), "up") && jstr_or(x, "peer", NULL))
                cJSON_AddStringToObject(l, "out_peer", jstr_or(x, "peer", NULL));
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
static int heartbeat(struct join *j, const char *endpoint, uint64_t progress)
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
    cJSON *o = call(j, "POST", "/v1/leases/heartbeat", b, true, &st);
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
    cJSON *o = call(j, "POST", "/v1/standbys", b, true, &st);
    if (st >= 400 && st < 500)
        kvd_log(KVD_LOG_WARN, "the market refused the standby lease on window %u (HTTP %ld): %s",
                j->window, st, jstr_or(o, "error", "?"));
    cJSON_Delete(o);
    return st == 200 || st == 201 ? 0 : st == 400 ? -EINVAL : st >= 400 && st < 500 ? -EPERM : -EAGAIN;
}

/* Tell the market our standby stage took its rank over (it was dialled for it): 1 when the
 * market made us the window's holder, 0 while it waits for the old holder to lapse (or did not
 * answer), -EPERM when it refused. */
static int standby_took(struct join *j, int rank)
{
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "model", j->model);
    cJSON_AddNumberToObject(b, "window", j->window);
    cJSON_AddNumberToObject(b, "serving", rank);
    ring_report(j, b);   /* with the manifest the stage runs */
    if (!cJSON_GetObjectItemCaseSensitive(b, "manifest"))
        cJSON_AddStringToObject(b, "manifest", j->manifest_sha);
    long st;
    cJSON *o = call(j, "POST", "/v1/standbys", b, true, &st);
    int rc = 0;
    if (st == 200 && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "holder"))) {
        kvd_log(KVD_LOG_INFO, "took rank %d over; the market made this node the holder of window "
                "%u", rank, j->window);
        rc = 1;
    } else if (st == 202) {
        if (!j->took_pending_logged)
            kvd_log(KVD_LOG_INFO, "took rank %d over; the market waits: %s", rank,
                    jstr_or(o, "pending", "?"));
        j->took_pending_logged = true;
    } else if (st >= 400 && st < 500) {
        kvd_log(KVD_LOG_WARN, "took rank %d over; the market refused to record it (HTTP %ld): %s",
                rank, st, jstr_or(o, "error", "?"));
        rc = -EPERM;
    }
    cJSON_Delete(o);
    return rc;
}

/* The roster of the ring the market serves (GET /v1/models/<id>/roster: standbys named beside
 * the manifest) into DIR/roster.json, which the stage re-reads when it changes. Written only
 * when its text changed, through a rename; a market that does not answer leaves it as it was. */
static void roster_refresh(struct join *j)
{
    char path[128], err[KV_ERR_MAX], *resp = NULL;
    long st;
    snprintf(path, sizeof path, "/v1/models/%s/roster", j->model);
    if (ring_market_call(j->market, "GET", path, NULL, NULL, CALL_MS, &st, &resp, err, sizeof err) < 0 ||
        st != 200) {
        free(resp);
        return;
    }
    cJSON *o = cJSON_Parse(resp);
    const char *sha = util_json_string(o, "manifest");
    bool me = false;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(o, "standby"))
        me |= util_json_string(e, "node") && !strcmp(util_json_string(e, "node"), j->node);
    if (!sha || strlen(sha) != 64 || (j->roster_text && !strcmp(j->roster_text, resp))) {
        cJSON_Delete(o);
        free(resp);
        return;
    }
    int wrc = util_file_replace(j->roster_path, resp, strlen(resp));
    if (wrc) {
        kvd_log(KVD_LOG_WARN, "%s: %s", j->roster_path, strerror(-wrc));
        cJSON_Delete(o);
        free(resp);
        return;
    }
    snprintf(j->roster_sha, sizeof j->roster_sha, "%s", sha);
    j->roster_me = me;
    free(j->roster_text);
    j->roster_text = resp;
    cJSON_Delete(o);
}

/* The model's catalog from the market into DIR, checked against the model id. */
static int fetch_catalog(struct join *j)
{
    char path[128], err[KV_ERR_MAX], *resp = NULL, id[65];
    long st;
    snprintf(path, sizeof path, "/v1/models/%s/catalog", j->model);
    if (ring_market_call(j->market, "GET", path, NULL, NULL, CALL_MS, &st, &resp, err, sizeof err) < 0 ||
        st != 200) {
        kvd_log(KVD_LOG_ERROR, "catalog of %s: %s", j->model, resp ? resp : err);
        free(resp);
        return -EIO;
    }
    struct gguf_catalog *c;
    int rc = gguf_catalog_from_json(&c, resp, strlen(resp), id, err, sizeof err);
    if (rc == 0 && strcmp(id, j->model)) {
        snprintf(err, sizeof err, "its SHA-256 is %s", id);
        rc = -EINVAL;
    }
    gguf_catalog_free(rc == 0 ? c : NULL);
    if (rc) {
        kvd_log(KVD_LOG_ERROR, "the market's catalog for %s: %s", j->model, err);
        free(resp);
        return rc;
    }
    snprintf(j->catalog_path, sizeof j->catalog_path, "%s/catalog-%.16s.json", j->dir, j->model);
    FILE *f = fopen(j->catalog_path, "w");
    if (!f || fwrite(resp, 1, strlen(resp), f) != strlen(resp) || fclose(f)) {
        kvd_log(KVD_LOG_ERROR, "%s: %s", j->catalog_path, strerror(errno));
        free(resp);
        return -EIO;
    }
    free(resp);
    return 0;
}

struct pull_job {
    struct seed_pull_opts o;
    int rc;
    volatile int done;
    char err[KV_ERR_MAX];
    struct seed_pull_stats st;
};

static void *pull_thread(void *ud)
{
    struct pull_job *p = ud;
    p->rc = seed_pull(&p->o, &p->st, p->err, sizeof p->err);
    __atomic_store_n(&p->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void pull_log(void *ud, int kind, const char *line)
{
    (void)ud;
    if (kind == SEED_PULL_LINE)
        kvd_log(KVD_LOG_INFO, "%s", line);
}

/* Pull the claimed window from the model's sources (each in turn), heartbeating meanwhile:
 * 0, -EPERM when the lease was lost, or another negative code. */
static int pull(struct join *j)
{
    snprintf(j->window_path, sizeof j->window_path, "%s/window-%u-%u.gguf", j->dir, j->first, j->last);
    struct stat sb;
    if (stat(j->window_path, &sb) == 0) {
        kvd_log(KVD_LOG_INFO, "window %s is here already", j->window_path);
        return 0;
    }
    char path[128];
    long st;
    snprintf(path, sizeof path, "/v1/models/%s/sources", j->model);
    cJSON *src = call(j, "GET", path, NULL, false, &st);
    if (!cJSON_IsArray(src)) {
        cJSON_Delete(src);
        return -EAGAIN;
    }
    int rc = -ENOENT;
    const cJSON *s;
    cJSON_ArrayForEach(s, src) {
        if (!cJSON_IsString(s))
            continue;
        static volatile int cancel;
        cancel = 0;
        struct pull_job *p = calloc(1, sizeof *p);
        if (!p) {
            rc = -ENOMEM;
            break;
        }
        p->o = (struct seed_pull_opts){.url = s->valuestring, .first = j->first, .last = j->last,
                                       .catalog_path = j->catalog_path, .model_id = j->model,
                                       .out_path = j->window_path, .progress = 1, .log = pull_log,
                                       .cancel = &cancel};
        pthread_t t;
        if (pthread_create(&t, NULL, pull_thread, p)) {
            free(p);
            rc = -EAGAIN;
            break;
        }
        double next = 0;
        bool lost = false;
        while (!__atomic_load_n(&p->done, __ATOMIC_ACQUIRE)) {
            if (util_now_s() >= next) {
                if (heartbeat(j, NULL, 0) == -EPERM) {
                    lost = true;
                    cancel = 1;
                }
                next = util_now_s() + j->reserve_s / 4;
            }
            if (stop_flag)
                cancel = 1;
            sleep_ms(200);
        }
        pthread_join(t, NULL);
        rc = p->rc;
        if (rc == 0)
            kvd_log(KVD_LOG_INFO, "pulled window [%u, %u) from %s (%llu bytes), verified", j->first,
                    j->last, s->valuestring, (unsigned long long)p->st.bytes_fetched);
        else
            kvd_log(KVD_LOG_WARN, "pull from %s: %s", s->valuestring, p->err);
        free(p);
        if (lost)
            rc = -EPERM;
        if (rc == 0 || lost || stop_flag)
            break;
    }
    cJSON_Delete(src);
    return rc;
}

/* A listening TCP socket on hostport (IPv4 HOST:PORT; PORT 0: any free one): its fd, with the
 * port bound in *port; a negative errno. */
static int tcp_listen(const char *hostport, uint16_t *port)
{
    char host[256];
    const char *colon = strrchr(hostport, ':');
    if (!colon || (size_t)(colon - hostport) >= sizeof host)
        return -EINVAL;
    memcpy(host, hostport, (size_t)(colon - hostport));
    host[colon - hostport] = 0;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    socklen_t sl = sizeof sa;
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        return -EINVAL;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (fd < 0)
        return -errno;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) || listen(fd, 16) ||
        getsockname(fd, (struct sockaddr *)&sa, &sl)) {
        int e = -errno;
        close(fd);
        return e;
    }
    *port = ntohs(sa.sin_port);
    return fd;
}

/* Listen on the stage's address until the stage takes it over, so the market's probe finds
 * the endpoint answering (connections wait in the backlog, unanswered). An address still in
 * use (a stage of a node stopped a moment ago on this port) is tried again every second,
 * keeping the reservation meanwhile: 0, -EPERM when the lease was lost, or another negative
 * code. */
static int heartbeat(struct join *j, const char *endpoint, uint64_t progress);
static int probe_listen(struct join *j)
{
    if (j->relay || j->probe_fd >= 0)
        return 0;
    uint16_t port;
    double next_hb = util_now_s() + j->reserve_s / 4, logged = 0;
    for (;;) {
        int fd = tcp_listen(j->listen, &port);
        if (fd >= 0) {
            j->probe_fd = fd;
            return 0;
        }
        if (fd != -EADDRINUSE || stop_flag)
            return fd;
        if (util_now_s() - logged >= 10) {
            kvd_log(KVD_LOG_INFO, "listen on %s: address in use (a process stopped a moment ago "
                    "may still hold it); trying again every second", j->listen);
            logged = util_now_s();
        }
        sleep_ms(1000);
        if (util_now_s() >= next_hb) {
            if (heartbeat(j, NULL, 0) == -EPERM)
                return -EPERM;
            next_hb = util_now_s() + j->reserve_s / 4;
        }
    }
}

static void probe_close(struct join *j)
{
    if (j->probe_fd >= 0)
        close(j->probe_fd);
    j->probe_fd = -1;
}

static void stage_stop(struct join *j)
{
    if (j->stage <= 0)
        return;
    kill(j->stage, SIGTERM);
    for (int i = 0; i < 100; i++) {
        if (waitpid(j->stage, NULL, WNOHANG) == j->stage) {
            j->stage = 0;
            return;
        }
        sleep_ms(50);
    }
    kill(j->stage, SIGKILL);
    waitpid(j->stage, NULL, 0);
    j->stage = 0;
}

/* Run the stage of our rank in the manifest in a child that dies with us. */
static int stage_start(struct join *j, int rank)
{
    probe_close(j);
    pid_t pid = fork();
    if (pid < 0)
        return -errno;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() == 1)
            _exit(1);
        signal(SIGTERM, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        char prefix[32];
        snprintf(prefix, sizeof prefix, "join/stage %d", rank);
        kvd_log_set_prefix(prefix);
        struct kvd_stage_opts o = {.manifest = j->manifest_path, .rank = rank,
                                   .window = j->window_path, .state_dir = j->dir,
                                   .catalog = j->catalog_path, .n_threads = j->n_threads,
                                   .listen = j->relay ? NULL : j->listen,
                                   .receipts = j->receipts_path, .roster = j->roster_path};
        if (rank < 0)   /* the roster's standby entry for our key, for our window's rank */
            o.is_standby = o.standby_by_key = true;
        if (rank == 0 && j->api) {   /* the ring's API: paying clients and --api-key-file's */
            o.api_listen = j->api;
            o.api_key_file = j->clients_path;
            o.api_keys_reload = true;
            o.chat_template = j->chat_template;
        }
        if (strcmp(j->backend, "cpu"))
            o.backend = j->backend;
        _exit(kvd_stage_run(&o) < 0 ? 1 : 0);
    }
    j->stage = pid;
    j->rank = rank;
    j->clients_next = 0;   /* rank 0's API wants the paying clients at once */
    if (rank < 0)
        kvd_log(KVD_LOG_INFO, "standby stage for rank %d (window %u) started (pid %d) on manifest "
                "%.16s...", j->standby_rank, j->window, (int)pid, j->manifest_sha);
    else
        kvd_log(KVD_LOG_INFO, "stage of rank %d started (pid %d) on manifest %.16s...", rank,
                (int)pid, j->manifest_sha);
    return 0;
}

/* Wait (long-poll) for a manifest other than the one we run: 1 when one came and the stage
 * was (re)started, 0 when none came, negative when it does not name us. */
static int manifest_poll(struct join *j, double wait_s)
{
    char path[256], err[KV_ERR_MAX], *resp = NULL;
    long st;
    snprintf(path, sizeof path, "/v1/models/%s/manifest?after=%s&wait=%.0f", j->model,
             j->manifest_sha[0] ? j->manifest_sha : "none", wait_s);
    if (ring_market_call(j->market, "GET", path, NULL, NULL, (int)(wait_s * 1000) + CALL_MS, &st,
                         &resp, err, sizeof err) < 0) {
        kvd_log(KVD_LOG_WARN, "market: %s", err);
        return -EAGAIN;
    }
    if (st != 200) {
        free(resp);
        return 0;
    }
    struct ring_manifest *m = calloc(1, sizeof *m);
    int rc = m ? ring_manifest_parse(m, resp, strlen(resp), err, sizeof err) : -ENOMEM;
    int rank = -1;
    uint8_t me[32];
    util_hex_decode(j->node, me, 32);
    for (uint32_t r = 0; rc == 0 && r < m->n_ranks; r++)
        if (m->ranks[r].has_node && !memcmp(m->ranks[r].node, me, 32))
            rank = (int)r;
    free(m);
    /* as a standby we wait on the manifest whatever it names (a node back after its rank was
     * taken over is still named in it); a holder that it does not name took the rank over in
     * it, and the roster names us for that rank: either way the stage is the roster's standby */
    bool standby = j->standby || (rank < 0 && j->held);
    if (rc || (rank < 0 && !standby)) {
        kvd_log(KVD_LOG_WARN, "the market's manifest %s", rc ? err : "does not name this node");
        free(resp);
        return rc ? rc : -ENOENT;
    }
    int wrc = util_file_replace(j->manifest_path, resp, strlen(resp));
    if (wrc) {
        kvd_log(KVD_LOG_ERROR, "%s: %s", j->manifest_path, strerror(-wrc));
        free(resp);
        return -EIO;
    }
    unsigned char dg[32];
    unsigned dl = 32;
    EVP_Digest(resp, strlen(resp), dg, &dl, EVP_sha256(), NULL);
    util_hex_encode(dg, 32, j->manifest_sha);
    free(resp);
    stage_stop(j);
    if (standby) {   /* started once the roster names us (standby_tick) */
        j->rank = -1;
        kvd_log(KVD_LOG_INFO, "manifest %.16s... does not name this node: standing by for rank "
                "%d", j->manifest_sha, j->standby_rank);
        return 1;
    }
    if ((rc = stage_start(j, rank)))
        return rc;
    return 1;
}

/* A standby's part of the hold loop: its stage started once the roster for the manifest we
 * have names us; a takeover (the stage was dialled for its rank) reported to the market, which
 * makes us the window's holder. */
static void standby_tick(struct join *j)
{
    if (!j->manifest_sha[0] || j->rank >= 0)
        return;
    if (j->stage <= 0) {
        if (j->roster_me && !strcmp(j->roster_sha, j->manifest_sha))
            stage_start(j, -1);
        return;
    }
    cJSON *s = stage_status(j);
    int rank = s ? (int)util_json_number(s, "rank", -1) : -1;
    bool waiting = !s || cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, "waiting"));
    cJSON_Delete(s);
    if (rank < 0 || waiting)
        return;
    int rc = j->standby ? standby_took(j, rank) : 1;
    if (rc == 1) {
        j->standby = false;
        j->held = true;
        j->rank = rank;
        j->clients_next = 0;
    }
}

/* Take our window back after our lease lapsed (the market was unreachable for longer than
 * a lease, say): during its grace period only we may, and the stage keeps running meanwhile,
 * so the ring is not disturbed. 0 when the lease is ours and active again. */
static int reclaim(struct join *j)
{
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "model", j->model);
    cJSON_AddNumberToObject(b, "window", j->window);
    long st;
    cJSON *o = call(j, "POST", "/v1/claims", b, true, &st);
    cJSON_Delete(o);
    if (st != 200 && st != 201)
        return -EPERM;
    return heartbeat(j, j->endpoint, 0);
}

/* Submit the receipts the stage wrote (DIR/receipts.jsonl, one JSON line a side of a
 * session's receipt) past the offset kept in DIR/receipts.offset, each signed with the node
 * key. A receipt the market answered (2xx, or 4xx: refused, or 409: submitted before) is done;
 * one it did not answer (no answer, 5xx) is tried again later with backoff. The market never
 * credits a (session, rank, range, side) twice, so a resubmission after a timeout or after a
 * crash before the offset was saved is answered 409 and changes nothing: that key is the
 * receipt's idempotency key. Returns how many are still pending (0: all done). */
static int receipts_submit(struct join *j)
{
    FILE *f = fopen(j->receipts_path, "r");
    if (!f)
        return 0;
    long off = 0;
    FILE *of = fopen(j->offset_path, "r");
    if (of) {
        if (fscanf(of, "%ld", &off) != 1 || off < 0)
            off = 0;
        fclose(of);
    }
    int pending = 0;
    char line[1024];
    if (fseek(f, off, SEEK_SET))
        off = 0;
    long start = off;
    while (fgets(line, sizeof line, f)) {
        size_t n = strlen(line);
        if (n == 0 || line[n - 1] != '\n') {
            pending++;   /* written in part so far */
            break;
        }
        cJSON *b = cJSON_Parse(line);
        if (!cJSON_IsObject(b)) {
            kvd_log(KVD_LOG_WARN, "%s: skipping a line that is not a receipt", j->receipts_path);
            cJSON_Delete(b);
            off += (long)n;
            continue;
        }
        if (!cJSON_GetObjectItemCaseSensitive(b, "model"))
            cJSON_AddStringToObject(b, "model", j->model);
        long st;
        cJSON *o = call(j, "POST", "/v1/receipts", b, true, &st);
        if (st >= 400 && st < 500 && st != 409) {
            const char *e = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "error"));
            kvd_log(KVD_LOG_WARN, "the market refused a receipt (%ld): %s", st, e ? e : "?");
        }
        cJSON_Delete(o);
        if (st == 0 || st >= 500) {
            pending++;
            break;
        }
        off += (long)n;
    }
    fclose(f);
    if (off != start) {
        char num[32];
        int k = snprintf(num, sizeof num, "%ld\n", off), wrc = util_file_replace(j->offset_path, num, (size_t)k);
        if (wrc)
            kvd_log(KVD_LOG_WARN, "%s: %s", j->offset_path, strerror(-wrc));
    }
    return pending;
}

/* Write DIR/clients.keys, the keys the ring's API lets in (the stage's API reads it again when
 * it changes): the market's paying clients as last fetched ("sha256:<client id>" lines) and
 * the lines of --api-key-file as they are now (plain keys or "sha256:" lines; the API checks
 * them). Written only when its text changed, through a rename. */
static void clients_write(struct join *j)
{
    size_t cap = 1 << 20, n = 0;   /* the API caps its keys far below this */
    char *text = malloc(cap), line[600];
    if (!text)
        return;
    n = (size_t)snprintf(text, cap, "# the market's paying clients and --api-key-file's keys, "
                         "written by kvd join\n");
    if (j->market_clients) {
        size_t k = strlen(j->market_clients);
        if (n + k < cap) {
            memcpy(text + n, j->market_clients, k + 1);
            n += k;
        }
    }
    FILE *kf = j->api_keys ? fopen(j->api_keys, "r") : NULL;
    if (j->api_keys && !kf)
        kvd_log(KVD_LOG_WARN, "--api-key-file %s: %s (its keys are not let in now)", j->api_keys,
                strerror(errno));
    while (kf && fgets(line, sizeof line, kf)) {
        size_t k = strlen(line);
        if (k && line[k - 1] != '\n' && k + 1 < sizeof line)
            line[k++] = '\n', line[k] = 0;
        if (n + k + 1 >= cap)
            break;
        memcpy(text + n, line, k + 1);
        n += k;
    }
    if (kf)
        fclose(kf);
    FILE *old = fopen(j->clients_path, "r");
    bool same = false;
    if (old) {
        char *cur = malloc(n + 2);
        size_t got = cur ? fread(cur, 1, n + 1, old) : 0;
        same = cur && got == n && !memcmp(cur, text, n);
        free(cur);
        fclose(old);
    }
    int wrc = same ? 0 : util_file_replace(j->clients_path, text, n);
    if (wrc)
        kvd_log(KVD_LOG_WARN, "%s: %s", j->clients_path, strerror(-wrc));
    free(text);
}

/* The paying clients a market ring's API lets in: refreshed from the market every few
 * seconds (with --api-key-file's keys, clients_write); a market that does not answer leaves
 * its part as it was. */
static void clients_refresh(struct join *j)
{
    if (!j->api || j->rank != 0 || util_now_s() < j->clients_next)
        return;   /* only rank 0 serves the API */
    j->clients_next = util_now_s() + CLIENTS_EVERY_S;
    long st;
    cJSON *o = call(j, "GET", "/v1/clients", NULL, false, &st);
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(o, "payable"), *id;
    if (st == 200 && cJSON_IsArray(ids)) {
        /* each line 72 bytes, at most RING_CLIENTS_LIST_MAX of them whatever the market sends */
        int cnt = cJSON_GetArraySize(ids);
        size_t cap = (size_t)(cnt < RING_CLIENTS_LIST_MAX ? cnt : RING_CLIENTS_LIST_MAX) * 72 + 1, n = 0;
        char *lines = malloc(cap);
        if (lines) {
            lines[0] = 0;
            cJSON_ArrayForEach(id, ids)
                if (cJSON_IsString(id) && strlen(id->valuestring) == 64 &&
                    strspn(id->valuestring, "0123456789abcdef") == 64 && n + 73 <= cap)
                    n += (size_t)snprintf(lines + n, cap - n, "sha256:%s\n", id->valuestring);
            free(j->market_clients);
            j->market_clients = lines;
        }
    }
    cJSON_Delete(o);
    clients_write(j);
}

/* Submit receipts when due: now, or after the backoff a market that did not answer set. */
static void receipts_tick(struct join *j)
{
    /* a standby whose takeover the market has not recorded yet: its sides of the sessions it
     * ran would be refused as from a node that held no rank (they go once it has) */
    if (j->standby || util_now_s() < j->receipts_next)
        return;
    if (receipts_submit(j)) {
        j->receipts_backoff_ms = j->receipts_backoff_ms ? j->receipts_backoff_ms * 2 : 1000;
        if (j->receipts_backoff_ms > 30000)
            j->receipts_backoff_ms = 30000;
        j->receipts_next = util_now_s() + j->receipts_backoff_ms / 1000.0;
    } else {
        j->receipts_backoff_ms = 0;
        j->receipts_next = 0;
    }
}

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
    cJSON *s = stage_status(j);
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
    cJSON *cov = call(j, "GET", path, NULL, false, &st);
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

/* Give our lease up (moving, a clean stop): the window is free at once; a standby's lease
 * leaves the roster at once. */
static void release(struct join *j)
{
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "model", j->model);
    cJSON_AddNumberToObject(b, "window", j->window);
    if (j->standby)
        cJSON_AddBoolToObject(b, "release", true);
    long st;
    cJSON_Delete(call(j, "POST", j->standby ? "/v1/standbys" : "/v1/leases/release", b, true, &st));
}

/* Hold the window: heartbeats, manifests, the stage's health. Returns when the lease is lost
 * (-EPERM), to move to a better window (-EXDEV, j->prefer set) or on a stop (0). The market being down changes nothing here but the retries:
 * the ring keeps serving (docs/market.md). */
static int hold(struct join *j)
{
    double next_hb = 0;
    uint32_t backoff = 1000;
    while (!stop_flag) {
        if (util_now_s() >= next_hb) {
            int rc = heartbeat(j, j->endpoint, 0);
            if (rc == -EPERM && j->standby) {
                /* the market may have made us the holder already (its answer to our takeover
                 * lost): say it again before giving anything up */
                standby_tick(j);
                if (!j->standby)
                    rc = heartbeat(j, j->endpoint, 0);
            }
            if (rc == -EINVAL || (rc == -EPERM && (j->standby || reclaim(j))))
                return rc;
            next_hb = util_now_s() + j->lease_s / 4;
            int to = j->standby ? -1 : move_target(j);
            if (to >= 0) {
                j->prefer = to;
                return -EXDEV;
            }
        }
        receipts_tick(j);
        clients_refresh(j);
        roster_refresh(j);
        standby_tick(j);
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
        if (manifest_poll(j, wait < 1 ? 1 : wait) == -EAGAIN) {
            sleep_ms(backoff);   /* the market is unreachable: back off */
            backoff = backoff < 8000 ? backoff * 2 : 8000;
        } else {
            backoff = 1000;
        }
    }
    return 0;
}

static void join_usage(FILE *f)
{
    fprintf(f,
        "usage: kvd join --market URL --model ID --state-dir DIR [options]\n"
        "  Claims the best-rewarded free window of the model that fits, pulls it, waits for the\n"
        "  ring's manifest and runs as its stage (docs/market.md). Rank 0 serves clients on\n"
        "  DIR/kvd.sock. Once every window has a stage, it stands by for a middle window\n"
        "  instead: pulled ahead, named in the ring's roster, taking the rank over when its\n"
        "  stage dies (docs/market.md, \"Standbys\"; not with --relay).\n"
        "  --mem BYTES         memory for the window (K/M/G suffixes; default: half of MemAvailable)\n"
        "  --listen HOST:PORT  where the predecessor connects (default 127.0.0.1 and a free port;\n"
        "                      PORT 0: a free one, bound first and advertised)\n"
        "  --advertise HOST:PORT  the endpoint the market publishes, when not --listen's (a\n"
        "                      forwarded port)\n"
        "  --relay URL         no inbound: the in-edge goes through this relay (relay://HOST:PORT)\n"
        "  --relay-ca PEM      relay certificates chain to this CA (as KV_RELAY_CA does)\n"
        "  --api HOST:PORT     as rank 0, serve the OpenAI-compatible API there to the market's\n"
        "                      paying clients (Authorization: Bearer <client key>); the market\n"
        "                      publishes it in the map. A node of another rank serves nothing\n"
        "  --api-key-file F    keys let in besides the market's clients (plain or sha256:HEX lines)\n"
        "  --chat-template NAME  the API's chat template family (default: the model's)\n"
        "  --backend NAME      compute backend (default cpu)\n"
        "  --ca PEM            an https:// market's certificate must chain to this CA\n"
        "  -t N                compute threads (default: all cores)\n"
        "  --jitter-ms MS      random delay before each claim (default 1500)\n"
        "  --move-ratio R      move to a free window worth R x ours or more (default 1.5) ...\n"
        "  --move-after-s S    ... once that has lasted S s and no session runs (default 120)\n"
        "  --log-level L       error|warn|info|debug (default info)\n");
}

static uint64_t mem_default(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    uint64_t kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lu kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb ? kb * 1024 / 2 : 1ull << 30;
}

static int free_port(char *out, size_t n)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) ||
        getsockname(fd, (struct sockaddr *)&sa, &sl)) {
        if (fd >= 0)
            close(fd);
        return -EADDRNOTAVAIL;
    }
    snprintf(out, n, "127.0.0.1:%d", ntohs(sa.sin_port));
    close(fd);
    return 0;
}

/* The URL clients reach --api HOST:PORT at: http://HOST:PORT (a wildcard host is sent as it
 * is; the market puts the address the heartbeat came from in its place). 0, or -EINVAL
 * without a port. */
static int api_url_of(const char *api, char *out, size_t n)
{
    const char *colon = strrchr(api, ':');
    if (!colon || atoi(colon + 1) <= 0 || atoi(colon + 1) > 65535 || colon == api)
        return -EINVAL;
    return snprintf(out, n, "http://%s", api) < (int)n ? 0 : -EINVAL;
}

int kvd_join_main(int argc, char **argv)
{
    struct join j = {.backend = "cpu", .jitter_ms = 1500, .probe_fd = -1, .move_ratio = 1.5,
                     .move_after_s = 120, .prefer = -1, .avoid = -1, .rank = -1};
    static char listen_buf[64];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            join_usage(stdout);
            return 0;
        }
        if (!v) {
            fprintf(stderr, "kvd join: unknown or incomplete option '%s'\n", a);
            join_usage(stderr);
            return 2;
        }
        i++;
        uint64_t x;
        if (!strcmp(a, "--market"))
            j.market = v;
        else if (!strcmp(a, "--model"))
            j.model = v;
        else if (!strcmp(a, "--state-dir"))
            j.dir = v;
        else if (!strcmp(a, "--listen"))
            j.listen = v;
        else if (!strcmp(a, "--relay"))
            j.relay = v;
        else if (!strcmp(a, "--api"))
            j.api = v;
        else if (!strcmp(a, "--api-key-file"))
            j.api_keys = v;
        else if (!strcmp(a, "--chat-template"))
            j.chat_template = v;
        else if (!strcmp(a, "--advertise"))
            j.advertise = v;
        else if (!strcmp(a, "--relay-ca")) {
            /* the stage's relay links read it from the environment (net/relay_link.c) */
            if (access(v, R_OK)) {
                fprintf(stderr, "kvd join: --relay-ca %s: %s\n", v, strerror(errno));
                return 2;
            }
            setenv("KV_RELAY_CA", v, 1);
        }
        else if (!strcmp(a, "--backend"))
            j.backend = v;
        else if (!strcmp(a, "--move-ratio") || !strcmp(a, "--move-after-s")) {
            double d;
            bool ratio = !strcmp(a, "--move-ratio");
            if (util_parse_double(v, ratio ? 1 : 0, 1e6, 0, &d, NULL, 0) < 0) {
                fprintf(stderr, "kvd join: bad value '%s' for %s\n", v, a);
                return 2;
            }
            *(ratio ? &j.move_ratio : &j.move_after_s) = d;
        } else if (!strcmp(a, "--ca"))
            ring_market_set_ca(v);   /* an https:// market's certificate chains to this CA */
        else if (!strcmp(a, "--mem") || !strcmp(a, "-t") || !strcmp(a, "--jitter-ms")) {
            bool mem = a[2] == 'm';
            if (util_parse_u64(v, mem ? 1 << 16 : 0, mem ? 1ull << 50 : 600000,
                               mem ? UTIL_PARSE_SUFFIX : 0, &x, NULL, 0) < 0) {
                fprintf(stderr, "kvd join: bad value '%s' for %s\n", v, a);
                return 2;
            }
            if (mem)
                j.mem = x;
            else if (a[1] == 't')
                j.n_threads = (int)x;
            else
                j.jitter_ms = (uint32_t)x;
        } else if (!strcmp(a, "--log-level")) {
            static const char *names[] = {"error", "warn", "info", "debug"};
            int k = 0;
            while (k < 4 && strcmp(v, names[k]))
                k++;
            if (k == 4) {
                fprintf(stderr, "kvd join: --log-level '%s': error|warn|info|debug\n", v);
                return 2;
            }
            kvd_log_set_level(k);
        } else {
            fprintf(stderr, "kvd join: unknown option '%s'\n", a);
            join_usage(stderr);
            return 2;
        }
    }
    if (!j.market || !j.model || !j.dir) {
        fprintf(stderr, "kvd join: --market, --model and --state-dir are required\n");
        return 2;
    }
    if (strlen(j.model) != 64 || strspn(j.model, "0123456789abcdef") != 64) {
        fprintf(stderr, "kvd join: --model '%s': expected the model id (64 hex digits)\n", j.model);
        return 2;
    }
    if (j.relay && strncmp(j.relay, "relay://", 8)) {
        fprintf(stderr, "kvd join: --relay '%s': expected relay://HOST:PORT\n", j.relay);
        return 2;
    }
    if ((j.api_keys || j.chat_template) && !j.api) {
        fprintf(stderr, "kvd join: --api-key-file and --chat-template are the API's: pass --api\n");
        return 2;
    }
    if (j.api_keys && access(j.api_keys, R_OK)) {
        fprintf(stderr, "kvd join: --api-key-file %s: %s\n", j.api_keys, strerror(errno));
        return 2;
    }
    if (j.advertise && (j.relay || !strrchr(j.advertise, ':') || !atoi(strrchr(j.advertise, ':') + 1))) {
        fprintf(stderr, "kvd join: --advertise '%s': expected HOST:PORT (not with --relay)\n",
                j.advertise);
        return 2;
    }
    if (j.api && api_url_of(j.api, j.api_url, sizeof j.api_url)) {
        fprintf(stderr, "kvd join: --api '%s': expected HOST:PORT with a port\n", j.api);
        return 2;
    }
    if (!j.mem)
        j.mem = mem_default();
    kvd_log_set_prefix("join");
    mkdir(j.dir, 0700);
    char err[KV_ERR_MAX];
    if (net_identity_load(&j.id, j.dir, err, sizeof err) < 0) {
        fprintf(stderr, "kvd join: %s\n", err);
        return 1;
    }
    util_hex_encode(net_identity_pub(j.id), 32, j.node);
    if (!j.listen && !j.relay) {
        if (free_port(listen_buf, sizeof listen_buf)) {
            fprintf(stderr, "kvd join: no free port on 127.0.0.1 (pass --listen)\n");
            return 1;
        }
        j.listen = listen_buf;
    }
    const char *lc = j.listen && !j.relay ? strrchr(j.listen, ':') : NULL;
    if (lc && !strcmp(lc, ":0")) {   /* bind first, then advertise the port bound */
        uint16_t port;
        int fd = tcp_listen(j.listen, &port);
        if (fd < 0) {
            fprintf(stderr, "kvd join: --listen %s: %s\n", j.listen, strerror(-fd));
            return 1;
        }
        snprintf(listen_buf, sizeof listen_buf, "%.*s:%u", (int)(lc - j.listen), j.listen, port);
        j.listen = listen_buf;
        j.probe_fd = fd;
    }
    if (j.relay) {
        uint8_t b[16];
        char hex[33];
        RAND_bytes(b, sizeof b);
        util_hex_encode(b, sizeof b, hex);
        snprintf(j.endpoint, sizeof j.endpoint, "%s/b/%s", j.relay, hex);
    } else {
        snprintf(j.endpoint, sizeof j.endpoint, "tcp://%s", j.advertise ? j.advertise : j.listen);
    }
    snprintf(j.manifest_path, sizeof j.manifest_path, "%s/manifest.json", j.dir);
    snprintf(j.receipts_path, sizeof j.receipts_path, "%s/receipts.jsonl", j.dir);
    snprintf(j.offset_path, sizeof j.offset_path, "%s/receipts.offset", j.dir);
    snprintf(j.clients_path, sizeof j.clients_path, "%s/clients.keys", j.dir);
    snprintf(j.roster_path, sizeof j.roster_path, "%s/roster.json", j.dir);
    unlink(j.roster_path);   /* a roster of an earlier run names nothing we know of */
    if (j.api) {   /* --api-key-file's keys only until the market's list came */
        unlink(j.clients_path);
        clients_write(&j);
    }
    /* kvctl ring down --dir DIR stops this node through it (a clean stop gives the lease back) */
    char pid_path[4200];
    snprintf(pid_path, sizeof pid_path, "%s/join.pid", j.dir);
    FILE *pf = fopen(pid_path, "w");
    if (!pf || fprintf(pf, "%d\n", (int)getpid()) < 0 || fclose(pf))
        kvd_log(KVD_LOG_WARN, "%s: %s", pid_path, strerror(errno));
    kvd_log(KVD_LOG_INFO, "node %s joining model %.16s... at %s (memory %llu bytes, endpoint %s)",
            j.node, j.model, j.market, (unsigned long long)j.mem, j.endpoint);
    signal(SIGTERM, on_stop);
    signal(SIGINT, on_stop);
    signal(SIGPIPE, SIG_IGN);
    /* what a previous run of this node owes is submitted first: its receipts count for the
     * ranks it held when the sessions ran, whatever it will hold now */
    receipts_submit(&j);
    int rc = 0;
    uint32_t backoff = 500;
    while (!stop_flag) {
        rc = profile(&j);
        if (rc == 0)
            rc = fetch_catalog(&j);
        if (rc == 0)
            rc = claim(&j);
        if (rc == -EINVAL)
            break;   /* the market refuses this node or serves a wrong catalog: no retry helps */
        if (rc) {
            rc = 0;
            sleep_ms(backoff);
            backoff = backoff < 8000 ? backoff * 2 : 8000;
            continue;
        }
        j.held = !j.standby;
        backoff = 500;
        rc = pull(&j);
        if (rc == -EPERM || rc == -EAGAIN) {
            j.held = rc != -EPERM && !j.standby;
            j.standby = j.standby && rc != -EPERM;
            rc = 0;
            continue;
        }
        if (rc)
            break;
        if ((rc = probe_listen(&j)) == -EPERM) {
            j.held = j.standby = false;
            rc = 0;
            continue;
        }
        if (rc) {
            kvd_log(KVD_LOG_ERROR, "listen on %s: %s", j.listen, strerror(-rc));
            break;
        }
        if ((rc = heartbeat(&j, j.endpoint, 0)) == -EINVAL) {
            kvd_log(KVD_LOG_ERROR, "the market refused endpoint %s; stopping", j.endpoint);
            break;
        }
        if (rc) {
            kvd_log(KVD_LOG_WARN, "the market did not activate the lease; claiming again");
            probe_close(&j);
            rc = 0;
            continue;
        }
        if (j.standby)
            kvd_log(KVD_LOG_INFO, "standby for window %u at %s; waiting for the ring's roster to "
                    "name it", j.window, j.endpoint);
        else
            kvd_log(KVD_LOG_INFO, "lease on window %u active; waiting for the ring's manifest", j.window);
        rc = hold(&j);
        stage_stop(&j);
        probe_close(&j);
        j.manifest_sha[0] = 0;
        j.better_since = 0;
        j.rank = -1;
        if (rc == -EINVAL)
            break;
        if (rc == -EXDEV) {   /* moving: what we owe is submitted while we hold the rank */
            kvd_log(KVD_LOG_INFO, "moving from window %u to window %d", j.window, j.prefer);
            receipts_submit(&j);
            release(&j);
            j.held = false;
            unlink(j.window_path);   /* a node keeps only the window it serves */
            rc = 0;
            continue;
        }
        if (rc == -EPERM) {
            kvd_log(KVD_LOG_WARN, "lost the %slease on window %u; claiming again",
                    j.standby ? "standby " : "", j.window);
            j.held = j.standby = false;
            rc = 0;
        }
    }
    stage_stop(&j);
    probe_close(&j);
    if (j.held || j.standby) {   /* the window is free at once, not after the lease and its grace */
        release(&j);
        kvd_log(KVD_LOG_INFO, "gave the %slease on window %u back", j.standby ? "standby " : "",
                j.window);
    }
    /* on a clean exit, what the stage wrote last (its sessions end as it stops) */
    for (int i = 0; i < 3 && receipts_submit(&j); i++)
        sleep_ms(1000);
    unlink(pid_path);
    free(j.market_clients);
    free(j.roster_text);
    net_identity_free(j.id);
    kvd_log(KVD_LOG_INFO, "stopped");
    return rc < 0 ? 1 : 0;
}

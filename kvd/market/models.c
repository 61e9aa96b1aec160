/* models.c — the models (docs/market.md): registration and removal by their owner (POST,
 * DELETE /v1/models), the list, and one model's coverage map with demand, rewards and what
 * its stages report of their ring, its catalog and sources (GET). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "gguf/gguf.h"
#include "kvd/kvd.h"
#include "kvd/market/internal.h"
#include "net/net.h"
#include "util/util.h"

/* A window's coverage as the reward counts it (kvd_market__reward). */
static double covered_of(int ls)
{
    return ls == KVD_LS_ACTIVE ? 1.0 : ls == KVD_LS_RESERVED ? 0.5 : 0.0;
}

/* The key that owns model id ("" when none is recorded: a model registered before owners
 * were kept, which only an operator may change), into buf. */
static const char *model_owner(struct kvd_market_api *a, const char *id, char *buf, size_t n)
{
    char key[80];
    snprintf(key, sizeof key, "owner/%s", id);
    cJSON *o = kvd_market__blob_load(a->st, key);
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
        kvd_market__rollback_err(a, req, 503, NULL, a->st->err);
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
    kvd_market__rollback_err(a, req, 403, NULL, why);
    return -EPERM;
}

/* DELETE /v1/models/<id>: signed by its owner or an operator; its windows and leases go with it
 * (its stages' heartbeats are refused from then on). */
void kvd_market__h_model_delete(struct net_http_req *req, void *ud)
{
    struct kvd_market_api *a = ud;
    char id[65], node[65];
    const char *what;
    if (kvd_market__path_model(req, net_http_req_path(req), id, &what))
        return;
    if (what[0]) {
        kvd_market__reply_err(req, 404, NULL, "DELETE takes /v1/models/<id>");
        return;
    }
    if (kvd_market__begin_signed(a, req, node))
        return;
    bool exists = false;
    if (model_owner_check(a, req, id, node, &exists))
        return;
    if (!exists) {
        kvd_market__rollback_err(a, req, 404, NULL, "no such model");
        return;
    }
    if (a->st->ops->model_delete(a->st->impl, id)) {
        kvd_market__rollback_err(a, req, 503, NULL, a->st->err);
        return;
    }
    kvd_log(KVD_LOG_INFO, "model %.16s... removed by node %.16s...", id, node);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "state", "removed");
    kvd_market__commit_reply(a, req, 200, o);
}

/* POST /v1/models {"catalog": CATALOG-JSON-TEXT, "name": S, "sources": [URL...]} */
void kvd_market__h_models_post(struct net_http_req *req, void *ud)
{
    struct kvd_market_api *a = ud;
    char node[65], why[512];
    cJSON *b = kvd_market__body_json(req);
    if (!b)
        return;
    const char *cat = util_json_string(b, "catalog"), *name = util_json_string(b, "name");
    const cJSON *src = cJSON_GetObjectItemCaseSensitive(b, "sources");
    struct gguf_catalog *c = NULL;
    char id[65];
    if (!cat) {
        kvd_market__reply_err(req, 400, NULL, "catalog: expected the catalog's JSON text as a string");
        goto out;
    }
    if (name && strlen(name) > 127) {
        kvd_market__reply_err(req, 400, NULL, "name: at most 127 bytes");
        goto out;
    }
    if (!cJSON_IsArray(src) || cJSON_GetArraySize(src) < 1 || cJSON_GetArraySize(src) > 16) {
        kvd_market__reply_err(req, 400, NULL, "sources: expected an array of 1 to 16 URLs");
        goto out;
    }
    for (const cJSON *s = src->child; s; s = s->next)
        if (!cJSON_IsString(s) || (strncmp(s->valuestring, "http://", 7) &&
                                   strncmp(s->valuestring, "https://", 8)) ||
            strlen(s->valuestring) > 512) {
            kvd_market__reply_err(req, 400, NULL, "sources: every source is an http(s):// URL of at most 512 bytes");
            goto out;
        }
    if (gguf_catalog_from_json(&c, cat, strlen(cat), id, why, sizeof why) < 0) {
        kvd_market__reply_err(req, 400, NULL, "catalog: %s", why);
        goto out;
    }
    if (kvd_market__begin_signed(a, req, node))
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
        kvd_market__rollback_err(a, req, 400, NULL, why);
        goto out;
    }
    m.sources = cJSON_PrintUnformatted(src);
    double now = kvd_market__now();
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
        rc = kvd_market__blob_save(a->st, key, ow);
        cJSON_Delete(ow);
    }
    if (rc == 0)
        rc = kvd_market__replan_if_idle(a, id, now, why, sizeof why);
    if (rc) {
        kvd_market__rollback_err(a, req, rc == -ENOSPC || rc == -EINVAL ? 422 : 503, NULL,
                                 rc == -EIO ? a->st->err : why);
        goto out;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "name", m.name);
    cJSON_AddNumberToObject(o, "n_layers", m.n_layers);
    cJSON_AddBoolToObject(o, "probes", probes != NULL);
    cJSON_AddStringToObject(o, "owner", exists ? model_owner(a, id, why, sizeof why) : node);
    kvd_market__commit_reply(a, req, exists ? 200 : 201, o);
out:
    gguf_catalog_free(c);
    cJSON_Delete(b);
}

/* The complete ring's truth from its stages' reports (ringmap.c): each window's report into
 * reps (NULL where none counts), whether any says its links are down (why: the reason of the
 * first rank that gave one, else of the first down), and the API URLs of rank 0 into api. */
static bool ring_down(struct kvd_market_api *a, const struct kvd_market_state *ms, const char *hash,
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

static cJSON *coverage_json(struct kvd_market_api *a, const struct kvd_market_state *ms, double now)
{
    double d = kvd_market__demand_now(&a->cfg, &ms->m, now);
    cJSON *o = cJSON_CreateObject(), *ws = cJSON_CreateArray(), *rings = cJSON_CreateArray();
    cJSON *reps[KVD_MARKET_MAX_WINDOWS] = {0}, *api = cJSON_CreateArray();
    char hash[65], why[600] = "";
    char *man = kvd_market__manifest_of(ms, hash);
    bool down = man && ring_down(a, ms, hash, now, reps, api, why, sizeof why);
    cJSON *live = kvd_market__standby_list(a->st, ms->m.id, now);
    int n_silent = 0;
    char silent_why[300] = "";
    for (size_t i = 0; i < ms->n; i++)
        if (kvd_market__lease_silent(a, ms, i, now) && !n_silent++)
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
        bool silent = kvd_market__lease_silent(a, ms, i, now);
        cJSON_AddStringToObject(w, "state", silent ? "silent" :
                                kvd_market__lease_names[ms->ls[i] == KVD_LS_GRACE ? KVD_LS_FREE : ms->ls[i]]);
        if (ms->ls[i] != KVD_LS_FREE) {
            cJSON *e = kvd_market__lease_json(a, &ms->l[i], ms->ls[i], now);
            if (silent) {
                util_json_set(e, "state", cJSON_CreateString("silent"));
                cJSON_AddNumberToObject(e, "silent_s", beat_age);
            }
            char key[100];
            snprintf(key, sizeof key, "check/%s/%u", ms->m.id, ms->w[i].idx);
            cJSON *chk = kvd_market__blob_load(a->st, key);
            const char *n = util_json_string(chk, "node");
            const cJSON *last = cJSON_GetObjectItemCaseSensitive(chk, "last");
            if (n && !strcmp(n, ms->l[i].node) && last)   /* the stage's last probe */
                cJSON_AddItemToObject(e, "probe", cJSON_Duplicate(last, 1));
            cJSON_Delete(chk);
            /* its node's audits of this model: how many of each verdict, the last one, and
             * whether one is pending (docs/market.md, "Audits") */
            char akey[160];
            snprintf(akey, sizeof akey, "audit/%s/%s", ms->m.id, ms->l[i].node);
            cJSON *au = kvd_market__blob_load(a->st, akey);
            const cJSON *cnt = cJSON_GetObjectItemCaseSensitive(au, "counts");
            if (cJSON_IsObject(cnt)) {
                cJSON *ao = cJSON_AddObjectToObject(e, "audits");
                cJSON_AddItemToObject(ao, "counts", cJSON_Duplicate(cnt, 1));
                const cJSON *al = cJSON_GetObjectItemCaseSensitive(au, "last");
                if (al)
                    cJSON_AddItemToObject(ao, "last", cJSON_Duplicate(al, 1));
                cJSON_AddBoolToObject(ao, "pending", cJSON_GetObjectItemCaseSensitive(au, "pending") != NULL);
                cJSON_AddNumberToObject(ao, "queued",
                                        cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(au, "queued")));
            }
            cJSON_Delete(au);
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

void kvd_market__h_model_get(struct net_http_req *req, void *ud)
{
    struct kvd_market_api *a = ud;
    char id[65];
    const char *what;
    if (kvd_market__path_model(req, net_http_req_path(req), id, &what))
        return;
    if (!strcmp(what, "roster")) {
        kvd_market__roster_get(a, req, id);
        return;
    }
    if (!strcmp(what, "manifest")) {
        kvd_market__manifest_get(a, req, id);
        return;
    }
    double now = kvd_market__now();
    struct kvd_market_state *ms = calloc(1, sizeof *ms);
    int rc = ms ? kvd_market__state_load(a, id, ms, now) : -ENOMEM;
    if (rc == -ENOENT)
        kvd_market__reply_err(req, 404, NULL, "model %s is not registered", id);
    else if (rc)
        kvd_market__reply_err(req, 503, NULL, "store: %s", a->st->err);
    else if (!strcmp(what, "coverage") || !what[0])
        kvd_market__reply_json(req, 200, coverage_json(a, ms, now));
    else if (!strcmp(what, "catalog"))
        net_http_reply(req, 200, "application/json", NULL, ms->m.catalog, strlen(ms->m.catalog));
    else if (!strcmp(what, "sources"))
        net_http_reply(req, 200, "application/json", NULL, ms->m.sources, strlen(ms->m.sources));
    else
        kvd_market__reply_err(req, 404, NULL, "no such resource '%s' of a model (coverage, catalog, sources, manifest, roster)",
                              what);
    if (rc == 0)
        kvd_market__model_clear(&ms->m);
    free(ms);
}

/* GET /v1/models: every model with its windows' coverage in short. */
void kvd_market__h_models_get(struct net_http_req *req, void *ud)
{
    struct kvd_market_api *a = ud;
    char (*ids)[65] = calloc(1024, sizeof *ids);
    struct kvd_market_state *ms = calloc(1, sizeof *ms);
    size_t n = 0;
    if (!ids || !ms || a->st->ops->model_ids(a->st->impl, ids, 1024, &n)) {
        free(ids);
        free(ms);
        kvd_market__reply_err(req, 503, NULL, "store: %s", a->st->err);
        return;
    }
    double now = kvd_market__now();
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++) {
        if (kvd_market__state_load(a, ids[i], ms, now))
            continue;
        cJSON *m = cJSON_CreateObject();
        size_t covered = 0;
        for (size_t k = 0; k < ms->n; k++)
            covered += ms->ls[k] == KVD_LS_ACTIVE;
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
    kvd_market__reply_json(req, 200, o);
}

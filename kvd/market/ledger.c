/* ledger.c — what the market owes and to whom (docs/market.md, "Receipts and credit"): the
 * ring generations (who held each rank of each published manifest, and when), the paying
 * clients' accounts, and the settlement of a session's receipts into credit for the ranks and
 * a debit for the client who opened it.
 *
 * Everything here runs inside the caller's store transaction and keeps its state in blobs:
 *   "gen/<manifest sha>"     {model, ranks: [{node, first, last}], since, until}
 *   "genlast/<model>"        {sha}: the model's newest generation
 *   "client/<id>"            {name, verifier, balance, spent, created}
 *   "sess/<key>"             {model, manifest, session, first, sides: {"s<r>"|"r<r>": {t0,
 *                            t1, d, node}}, client, tokens, opened, paid: {"<r>": credit},
 *                            held: {"<r>": why}}
 *   "pend/<key>"             {at}: an opened session not settled yet (the sweep looks at
 *                            these; "at" is when it was opened)
 * where key = hex(SHA-256(model "|" manifest "|" session)): a session id is rank 0's choice,
 * so it is only unique within its model and generation. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "kvd/kvd.h"
#include "kvd/market/internal.h"
#include "ring/ring.h"
#include "util/util.h"

#define SWEEP_MAX 256            /* pending sessions one sweep looks at */
#define PENDING_MAX_AGE_S (7 * 86400.0) /* the sweep gives up on a session after this (a late
                                         * side still settles it when it comes) */

/* reward = base x (1 + d / (d + D)) x (1 + 2 (1 - covered)), within [base, 6 base]: demand
 * at most doubles it, a window without a stage triples it (docs/market.md, "Rewards"). */
double kvd_market__reward(const struct kvd_market_config *c, double demand, double covered)
{
    if (!(demand > 0))
        demand = 0;
    if (!(covered >= 0))
        covered = 0;
    if (covered > 1)
        covered = 1;
    double r = c->reward_base * (1 + demand / (demand + c->demand_ref)) * (1 + 2 * (1 - covered));
    if (r < c->reward_base)
        r = c->reward_base;
    if (r > 6 * c->reward_base)
        r = 6 * c->reward_base;
    return r;
}

double kvd_market__demand_now(const struct kvd_market_config *c, const struct kvd_market_model *m,
                              double now)
{
    if (m->demand_t <= 0 || now <= m->demand_t)
        return m->demand;
    return m->demand * exp(-(now - m->demand_t) / c->demand_tau_s);
}

bool kvd_market__penalized(struct kvd_market_store *st, const char *node, double now, char *why,
                           size_t n)
{
    char key[80];
    snprintf(key, sizeof key, "penalty/%s", node);
    cJSON *p = kvd_market__blob_load(st, key);
    bool on = p && util_json_number(p, "until", 0) > now;
    if (on)
        snprintf(why, n, "this node's claims are refused for %.0f s more: %s",
                 util_json_number(p, "until", 0) - now, util_json_string(p, "reason") ? util_json_string(p, "reason") : "it failed a probe");
    cJSON_Delete(p);
    return on;
}

/* ---- generations ---- */

int kvd_market__gen_record(struct kvd_market_store *st, const char *model, const char *sha,
                           const char *manifest, double now)
{
    char key[KVD_MARKET_KEY_MAX], last[KVD_MARKET_KEY_MAX];
    snprintf(key, sizeof key, "gen/%s", sha);
    cJSON *g = kvd_market__blob_load(st, key);
    if (g) {   /* known: the common case, a stage polling again */
        cJSON_Delete(g);
        return 0;
    }
    cJSON *m = cJSON_Parse(manifest), *ranks = cJSON_GetObjectItemCaseSensitive(m, "ranks");
    if (!cJSON_IsArray(ranks)) {
        cJSON_Delete(m);
        return -EINVAL;
    }
    g = cJSON_CreateObject();
    cJSON_AddStringToObject(g, "model", model);
    cJSON *out = cJSON_AddArrayToObject(g, "ranks");
    const cJSON *r;
    cJSON_ArrayForEach(r, ranks) {
        const cJSON *ly = cJSON_GetObjectItemCaseSensitive(r, "layers");
        double f = 0, l = 0;
        if (cJSON_IsArray(ly) && cJSON_GetArraySize(ly) == 2) {
            f = ly->child->valuedouble;
            l = ly->child->next->valuedouble;
        }
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "node", util_json_string(r, "node") ? util_json_string(r, "node") : "");
        cJSON_AddNumberToObject(o, "first", f);
        cJSON_AddNumberToObject(o, "last", l);
        cJSON_AddItemToArray(out, o);
    }
    cJSON_Delete(m);
    cJSON_AddNumberToObject(g, "since", now);
    int rc = kvd_market__blob_save(st, key, g);
    cJSON_Delete(g);
    /* the model's previous generation ended now */
    snprintf(last, sizeof last, "genlast/%s", model);
    cJSON *l = kvd_market__blob_load(st, last);
    if (rc == 0 && l && util_json_string(l, "sha") && strcmp(util_json_string(l, "sha"), sha)) {
        char pk[KVD_MARKET_KEY_MAX];
        snprintf(pk, sizeof pk, "gen/%.64s", util_json_string(l, "sha"));
        cJSON *pg = kvd_market__blob_load(st, pk);
        if (pg && !cJSON_GetObjectItemCaseSensitive(pg, "until")) {
            cJSON_AddNumberToObject(pg, "until", now);
            rc = kvd_market__blob_save(st, pk, pg);
        }
        cJSON_Delete(pg);
    }
    cJSON_Delete(l);
    if (rc == 0) {
        l = cJSON_CreateObject();
        cJSON_AddStringToObject(l, "sha", sha);
        rc = kvd_market__blob_save(st, last, l);
        cJSON_Delete(l);
    }
    return rc;
}

int kvd_market__gen_load(struct kvd_market_store *st, const char *sha, struct kvd_market_gen *g)
{
    char key[KVD_MARKET_KEY_MAX];
    snprintf(key, sizeof key, "gen/%s", sha);
    memset(g, 0, sizeof *g);
    cJSON *o = kvd_market__blob_load(st, key);
    if (!o)
        return -ENOENT;
    const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(o, "ranks"), *r;
    snprintf(g->model, sizeof g->model, "%s", util_json_string(o, "model") ? util_json_string(o, "model") : "");
    g->since = util_json_number(o, "since", 0);
    g->until = util_json_number(o, "until", 0);
    cJSON_ArrayForEach(r, ranks) {
        if (g->n == KVD_MARKET_MAX_WINDOWS)
            break;
        snprintf(g->node[g->n], 65, "%s", util_json_string(r, "node") ? util_json_string(r, "node") : "");
        const cJSON *t;
        cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(r, "took"))
            if (cJSON_IsString(t) && g->n_took[g->n] < KVD_MARKET_MAX_TOOK)
                snprintf(g->took[g->n][g->n_took[g->n]++], 65, "%s", t->valuestring);
        g->first[g->n] = (uint32_t)util_json_number(r, "first", 0);
        g->last[g->n] = (uint32_t)util_json_number(r, "last", 0);
        g->n++;
    }
    cJSON_Delete(o);
    return g->n ? 0 : -EINVAL;
}

bool kvd_market__gen_may_sign(const struct kvd_market_gen *g, size_t rank, const char *node)
{
    if (rank >= g->n)
        return false;
    if (!strcmp(g->node[rank], node))
        return true;
    for (uint32_t k = 0; k < g->n_took[rank]; k++)
        if (!strcmp(g->took[rank][k], node))
            return true;
    return false;
}

int kvd_market__gen_took(struct kvd_market_store *st, const char *sha, uint32_t rank, const char *node)
{
    char key[KVD_MARKET_KEY_MAX];
    snprintf(key, sizeof key, "gen/%s", sha);
    cJSON *g = kvd_market__blob_load(st, key);
    cJSON *r = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(g, "ranks"), (int)rank);
    if (!r) {
        cJSON_Delete(g);
        return -ENOENT;
    }
    cJSON *took = cJSON_GetObjectItemCaseSensitive(r, "took");
    if (!took)
        took = cJSON_AddArrayToObject(r, "took");
    const cJSON *t;
    int rc = 0;
    cJSON_ArrayForEach(t, took)
        if (cJSON_IsString(t) && !strcmp(t->valuestring, node))
            goto out;   /* known */
    if (cJSON_GetArraySize(took) >= KVD_MARKET_MAX_TOOK) {
        rc = -ENOSPC;
        goto out;
    }
    cJSON_AddItemToArray(took, cJSON_CreateString(node));
    rc = kvd_market__blob_save(st, key, g);
out:
    cJSON_Delete(g);
    return rc;
}

/* ---- clients ---- */

int kvd_market__client_get(struct kvd_market_store *st, const char *id, struct kvd_market_client *c)
{
    char key[KVD_MARKET_KEY_MAX];
    snprintf(key, sizeof key, "client/%s", id);
    memset(c, 0, sizeof *c);
    cJSON *o = kvd_market__blob_load(st, key);
    if (!o)
        return -ENOENT;
    snprintf(c->id, sizeof c->id, "%s", id);
    snprintf(c->name, sizeof c->name, "%s", util_json_string(o, "name") ? util_json_string(o, "name") : "");
    const char *v = util_json_string(o, "verifier");
    int rc = v && strlen(v) == 64 && !util_hex_decode(v, c->verifier, 32) ? 0 : -EINVAL;
    c->balance = util_json_number(o, "balance", 0);
    c->spent = util_json_number(o, "spent", 0);
    c->created = util_json_number(o, "created", 0);
    cJSON_Delete(o);
    return rc;
}

int kvd_market__client_put(struct kvd_market_store *st, const struct kvd_market_client *c)
{
    char key[KVD_MARKET_KEY_MAX], v[65];
    snprintf(key, sizeof key, "client/%s", c->id);
    util_hex_encode(c->verifier, 32, v);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", c->name);
    cJSON_AddStringToObject(o, "verifier", v);
    cJSON_AddNumberToObject(o, "balance", c->balance);
    cJSON_AddNumberToObject(o, "spent", c->spent);
    cJSON_AddNumberToObject(o, "created", c->created);
    int rc = kvd_market__blob_save(st, key, o);
    cJSON_Delete(o);
    return rc;
}

/* ---- sessions ---- */

void kvd_market__session_key(const char *model, const char *manifest, const char *session,
                             char out[65])
{
    char buf[256];
    int n = snprintf(buf, sizeof buf, "%.64s|%.64s|%.64s", model, manifest, session);
    uint8_t d[32];
    unsigned dl = 32;
    EVP_Digest(buf, (size_t)n, d, &dl, EVP_sha256(), NULL);
    util_hex_encode(d, 32, out);
}

/* The session's record (a fresh one when it has none yet). */
static cJSON *sess_load(struct kvd_market_store *st, const char *key, const char *model,
                        const char *manifest, const char *session, double now)
{
    char k[KVD_MARKET_KEY_MAX];
    snprintf(k, sizeof k, "sess/%s", key);
    cJSON *s = kvd_market__blob_load(st, k);
    if (s)
        return s;
    s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "model", model);
    cJSON_AddStringToObject(s, "manifest", manifest);
    cJSON_AddStringToObject(s, "session", session);
    cJSON_AddNumberToObject(s, "first", now);
    cJSON_AddObjectToObject(s, "sides");
    cJSON_AddObjectToObject(s, "paid");
    cJSON_AddObjectToObject(s, "held");
    return s;
}


enum { E_NONE, E_HALF, E_OK, E_BAD };

/* The state of edge e (rank e -> e + 1): both sides in and equal, only one in, none, or two
 * that disagree (digest or range). */
static int edge_state(const cJSON *sides, uint32_t e)
{
    char sn[16], rn[16];
    snprintf(sn, sizeof sn, "s%u", e);
    snprintf(rn, sizeof rn, "r%u", e);
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(sides, sn);
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(sides, rn);
    if (!s && !r)
        return E_NONE;
    if (!s || !r)
        return E_HALF;
    const char *a = util_json_string(s, "d"), *b = util_json_string(r, "d");
    bool same = a && b && !strcmp(a, b) && util_json_number(s, "t0", -1) == util_json_number(r, "t0", -2) &&
                util_json_number(s, "t1", -1) == util_json_number(r, "t1", -2);
    return same ? E_OK : E_BAD;
}

/* Settle the session record s (its key: key) in place: *changed when s must be saved. */
static int settle_doc(struct kvd_market_store *st, const struct kvd_market_config *cfg,
                      const char *key, cJSON *s, double now, kvd_market_paid_cb on_paid, void *ud,
                      struct kvd_market_settled *out, bool *changed)
{
    char k[KVD_MARKET_KEY_MAX], why[256];
    memset(out, 0, sizeof *out);
    *changed = false;
    struct kvd_market_gen g;
    struct kvd_market_client c;
    struct kvd_market_model m = {0};
    const char *client = util_json_string(s, "client"), *man = util_json_string(s, "manifest");
    const char *model = util_json_string(s, "model");
    int rc = 0;
    out->opened = client != NULL;
    if (!client || !man || !model)   /* no paying client opened it (yet): nothing is owed */
        goto out;
    if ((rc = kvd_market__gen_load(st, man, &g)) || (rc = st->ops->model_get(st->impl, model, &m)))
        goto out;
    if ((rc = kvd_market__client_get(st, client, &c)))
        goto out;
    cJSON *sides = cJSON_GetObjectItemCaseSensitive(s, "sides");
    cJSON *paid = cJSON_GetObjectItemCaseSensitive(s, "paid");
    cJSON *held = cJSON_GetObjectItemCaseSensitive(s, "held");
    uint64_t tokens = (uint64_t)util_json_number(s, "tokens", 0);
    int es[KVD_MARKET_MAX_WINDOWS];
    bool all_ok = true, attested = true;
    for (uint32_t e = 0; e < g.n; e++) {
        es[e] = edge_state(sides, e);
        all_ok = all_ok && es[e] == E_OK;
        attested = attested && es[e] != E_NONE;
    }
    /* a rank whose node is gone holds back only its own share: once the wait is over, the
     * others are paid when every edge of the ring has at least one side in (an edge whose two
     * sides disagree holds back the two ranks at its ends, not the rest) */
    bool late = now >= util_json_number(s, "opened", now) + cfg->settle_wait_s;
    double reward = kvd_market__reward(cfg, kvd_market__demand_now(cfg, &m, now), 1.0);
    uint32_t settled = 0;
    for (uint32_t r = 0; r < g.n; r++) {
        char rk[16], sn[16], rn[16];
        snprintf(rk, sizeof rk, "%u", r);
        if (cJSON_GetObjectItemCaseSensitive(paid, rk) || cJSON_GetObjectItemCaseSensitive(held, rk)) {
            settled++;
            continue;
        }
        uint32_t pred = (r + g.n - 1) % g.n;
        snprintf(sn, sizeof sn, "s%u", r);
        snprintf(rn, sizeof rn, "r%u", pred);
        const cJSON *own = cJSON_GetObjectItemCaseSensitive(sides, sn);
        if (!own || !cJSON_GetObjectItemCaseSensitive(sides, rn))
            continue;   /* this rank's node has not signed both its sides yet */
        /* the node that signed the rank's sent side: the rank's node in the generation, or
         * the standby that took the rank over and ran this session to its end */
        const char *own_node = util_json_string(own, "node") ? util_json_string(own, "node") : g.node[r];
        const char *hold = NULL;
        if (es[r] == E_BAD || es[pred] == E_BAD)
            hold = "the digests of an edge of this rank disagree";
        else if (util_json_number(own, "t1", 0) > (double)tokens)
            hold = "its token range is past what rank 0 opened for the client";
        else if (kvd_market__penalized(st, own_node, now, why, sizeof why))
            hold = "the node failed a probe";
        if (!hold && !(all_ok || (late && attested)))
            continue;   /* wait for the rest of the ring */
        if (hold) {
            cJSON_AddStringToObject(held, rk, hold);
            *changed = true;
            settled++;
            continue;
        }
        uint64_t t0 = (uint64_t)util_json_number(own, "t0", 0);
        uint64_t t1 = (uint64_t)util_json_number(own, "t1", 0);
        uint64_t lt = (t1 - t0) * (uint64_t)(g.last[r] - g.first[r]);
        double credit = (double)lt * reward;
        rc = st->ops->credit_add(st->impl, key, r, t0, t1, own_node, lt, credit);
        if (rc == -EEXIST) {   /* paid before (the record was lost with a rollback): never twice */
            rc = 0;
        } else if (rc) {
            goto out;
        } else {
            c.balance -= credit;
            c.spent += credit;
            out->layer_tokens += lt;
            out->credit += credit;
            out->ranks_paid++;
            struct kvd_market_paid p = {
                .model = model, .manifest = man, .session = util_json_string(s, "session"),
                .key = key, .node = own_node, .digest = util_json_string(own, "d"), .rank = r,
                .n_ranks = (uint32_t)g.n, .first = g.first[r], .last = g.last[r],
                .n_embd = m.n_embd, .t0 = t0, .t1 = t1};
            if (on_paid && p.session && p.digest && (rc = on_paid(ud, &p, now)))
                goto out;
        }
        cJSON_AddNumberToObject(paid, rk, credit);
        *changed = true;
        settled++;
    }
    if (out->ranks_paid && (rc = kvd_market__client_put(st, &c)))
        goto out;
    out->done = settled == g.n;
    if (out->done) {
        snprintf(k, sizeof k, "pend/%s", key);
        rc = st->ops->blob_put(st->impl, k, NULL);
    }
out:
    kvd_market__model_clear(&m);
    return rc;
}

int kvd_market__session_settle(struct kvd_market_store *st, const struct kvd_market_config *cfg,
                               const char *key, double now, kvd_market_paid_cb on_paid, void *ud,
                               struct kvd_market_settled *out)
{
    char k[KVD_MARKET_KEY_MAX];
    snprintf(k, sizeof k, "sess/%s", key);
    memset(out, 0, sizeof *out);
    cJSON *s = kvd_market__blob_load(st, k);
    if (!s)
        return -ENOENT;
    bool changed;
    int rc = settle_doc(st, cfg, key, s, now, on_paid, ud, out, &changed);
    if (rc == 0 && changed)
        rc = kvd_market__blob_save(st, k, s);
    cJSON_Delete(s);
    return rc;
}

int kvd_market__session_submit(struct kvd_market_store *st, const struct kvd_market_config *cfg,
                               const struct kvd_market_receipt *r, const char *manifest,
                               const char *key, const char *client, double now,
                               kvd_market_paid_cb on_paid, void *ud,
                               struct kvd_market_settled *out)
{
    cJSON *s = sess_load(st, key, r->model, manifest, r->session, now);
    int rc = 0;
    memset(out, 0, sizeof *out);
    if (r->side == KVD_SIDE_OPEN) {
        if (cJSON_GetObjectItemCaseSensitive(s, "client")) {
            rc = -EEXIST;
            goto out;
        }
        cJSON_AddStringToObject(s, "client", client);
        cJSON_AddNumberToObject(s, "tokens", (double)r->t1);
        cJSON_AddNumberToObject(s, "opened", now);
    } else {
        char name[16];
        snprintf(name, sizeof name, "%c%u", r->side == KVD_SIDE_SENT ? 's' : 'r', r->rank);
        cJSON *sides = cJSON_GetObjectItemCaseSensitive(s, "sides");
        if (cJSON_GetObjectItemCaseSensitive(sides, name)) {
            rc = -EEXIST;
            goto out;
        }
        cJSON *o = cJSON_AddObjectToObject(sides, name);
        cJSON_AddNumberToObject(o, "t0", (double)r->t0);
        cJSON_AddNumberToObject(o, "t1", (double)r->t1);
        cJSON_AddStringToObject(o, "d", r->digest);
        cJSON_AddStringToObject(o, "node", r->node);
    }
    char k[KVD_MARKET_KEY_MAX];
    /* an opened session is pending until every rank is settled: the sweep pays the ranks that
     * submitted once the wait is over (a session no client opened is owed nothing, so it
     * never waits there) */
    if (r->side == KVD_SIDE_OPEN) {
        char at[64];
        snprintf(k, sizeof k, "pend/%s", key);
        snprintf(at, sizeof at, "{\"at\":%.17g}", now);
        rc = st->ops->blob_put(st->impl, k, at);
    }
    bool changed;
    if (rc == 0)
        rc = settle_doc(st, cfg, key, s, now, on_paid, ud, out, &changed);
    snprintf(k, sizeof k, "sess/%s", key);
    if (rc == 0)
        rc = kvd_market__blob_save(st, k, s);
out:
    cJSON_Delete(s);
    return rc;
}

int kvd_market__session_sweep(struct kvd_market_store *st, const struct kvd_market_config *cfg,
                              double now, char after[KVD_MARKET_KEY_MAX], kvd_market_paid_cb on_paid,
                              void *ud, size_t *paid)
{
    static char keys[SWEEP_MAX][KVD_MARKET_KEY_MAX];
    size_t n = 0;
    *paid = 0;
    /* a cursor through the pending sessions: each sweep takes up to SWEEP_MAX past the last
     * one it looked at, and starts again from the first when none is left past it (so every
     * pending session is looked at however many there are) */
    int rc = st->ops->blob_keys(st->impl, "pend/", after, keys, SWEEP_MAX, &n);
    if (rc == 0 && n == 0 && after[0]) {
        after[0] = 0;
        rc = st->ops->blob_keys(st->impl, "pend/", NULL, keys, SWEEP_MAX, &n);
    }
    if (rc)
        return rc;
    for (size_t i = 0; i < n; i++) {
        cJSON *p = kvd_market__blob_load(st, keys[i]);
        double at = util_json_number(p, "at", now);
        cJSON_Delete(p);
        memcpy(after, keys[i], KVD_MARKET_KEY_MAX);   /* a key and its terminator */
        if (now < at + cfg->settle_wait_s)
            continue;   /* its ring may still be submitting: its own receipts settle it */
        struct kvd_market_settled s;
        rc = kvd_market__session_settle(st, cfg, keys[i] + strlen("pend/"), now, on_paid, ud, &s);
        if (rc == -ENOENT || (rc == 0 && now > at + PENDING_MAX_AGE_S)) {
            rc = st->ops->blob_put(st->impl, keys[i], NULL);
        }
        if (rc)
            return rc;
        *paid += s.ranks_paid;
    }
    return 0;
}

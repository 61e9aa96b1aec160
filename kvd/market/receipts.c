/* receipts.c — POST /v1/receipts (docs/market.md, "Receipts and credit"): one signature
 * of a session's receipt, checked against the ring generation it ran on and settled by the
 * ledger (ledger.c); a share paid is noted for the audits (audit.c). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <openssl/crypto.h>

#include "kvd/market/internal.h"
#include "ring/ring.h"
#include "util/util.h"

#define SESSION_TOKENS_MAX 16777216.0 /* the most tokens a session may be opened for */

/* A rank's share of a session was paid: a share of the credited work is audited later
 * (audit.c). */
int kvd_market__on_paid(void *ud, const struct kvd_market_paid *p, double now)
{
    struct kvd_market_api *a = ud;
    struct kvd_market_audit_work aw = {
        .model = p->model, .node = p->node, .session = p->session, .digest = p->digest,
        .key = p->key, .rank = p->rank, .n_ranks = p->n_ranks, .window = p->rank,
        .first = p->first, .last = p->last, .n_embd = p->n_embd, .t0 = p->t0, .t1 = p->t1};
    return kvd_market__audit_note(a->audit, &aw, now);
}

/* POST /v1/receipts {"model", "manifest", "session", "rank", "tokens": [t0, t1], "side":
 * "sent"|"received", "digest"} or, from rank 0, {..., "side": "open", "tokens": [0, T],
 * "client", "proof"}: one signature of a session's receipt, from the node that held the
 * signing rank in the ring generation (manifest) the session ran on. The session is settled
 * (ledger.c) as its sides come in. */
void kvd_market__h_receipts(struct net_http_req *req, void *ud)
{
    struct kvd_market_api *a = ud;
    char node[65], why[512], key[65];
    cJSON *b = kvd_market__body_json(req);
    if (!b)
        return;
    struct kvd_market_receipt r = {0};
    const char *model = util_json_string(b, "model"), *session = util_json_string(b, "session"), *digest = util_json_string(b, "digest");
    const char *side = util_json_string(b, "side"), *man = util_json_string(b, "manifest");
    const char *client = util_json_string(b, "client"), *proof = util_json_string(b, "proof");
    const cJSON *tk = cJSON_GetObjectItemCaseSensitive(b, "tokens");
    uint64_t rank;
    double now = kvd_market__now();
    struct kvd_market_gen g;
    struct kvd_market_client cl;
    if (!model || !kvd_market__is_hex(model, 64, 64) || !session || !kvd_market__is_hex(session, 16, 64) || !man ||
        !kvd_market__is_hex(man, 64, 64) || !side ||
        (strcmp(side, "sent") && strcmp(side, "received") && strcmp(side, "open"))) {
        kvd_market__reply_err(req, 400, NULL, "a receipt needs model (64 hex), manifest (the ring generation's "
                  "SHA-256, 64 hex), session (16-64 hex) and side (sent, received or open)");
        goto out;
    }
    r.side = !strcmp(side, "sent") ? KVD_SIDE_SENT : !strcmp(side, "received") ? KVD_SIDE_RECEIVED
                                                                                : KVD_SIDE_OPEN;
    if (r.side != KVD_SIDE_OPEN ? !digest || !kvd_market__is_hex(digest, 64, 64)
                                : !client || !kvd_market__is_hex(client, 64, 64) || !proof || !kvd_market__is_hex(proof, 64, 64)) {
        kvd_market__reply_err(req, 400, NULL, r.side != KVD_SIDE_OPEN ? "digest: expected 64 hex digits"
                              : "an open side needs client (the client's id, 64 hex) and proof (64 hex)");
        goto out;
    }
    if (kvd_market__juint(b, "rank", 0, KVD_MARKET_MAX_WINDOWS - 1, &rank, why, sizeof why)) {
        kvd_market__reply_err(req, 400, NULL, "%s", why);
        goto out;
    }
    if (!cJSON_IsArray(tk) || cJSON_GetArraySize(tk) != 2 ||
        !cJSON_IsNumber(tk->child) || !cJSON_IsNumber(tk->child->next) ||
        !(tk->child->valuedouble >= 0) || !(tk->child->next->valuedouble > tk->child->valuedouble) ||
        tk->child->next->valuedouble > SESSION_TOKENS_MAX ||
        tk->child->valuedouble != floor(tk->child->valuedouble) ||
        tk->child->next->valuedouble != floor(tk->child->next->valuedouble)) {
        kvd_market__reply_err(req, 400, NULL, "tokens: expected [first, last) whole numbers, first < last <= %.0f",
                              SESSION_TOKENS_MAX);
        goto out;
    }
    snprintf(r.model, sizeof r.model, "%s", model);
    snprintf(r.session, sizeof r.session, "%s", session);
    snprintf(r.digest, sizeof r.digest, "%s", r.side == KVD_SIDE_OPEN ? proof : digest);
    r.rank = (uint32_t)rank;
    r.t0 = (uint64_t)tk->child->valuedouble;
    r.t1 = (uint64_t)tk->child->next->valuedouble;
    if (r.side == KVD_SIDE_OPEN && (r.rank != 0 || r.t0 != 0)) {
        kvd_market__reply_err(req, 400, NULL, "an open side is rank 0's, for tokens [0, T)");
        goto out;
    }
    if (kvd_market__begin_signed(a, req, node))
        goto out;
    memcpy(r.node, node, 65);
    /* the ring generation: only a manifest the market published has sessions that count */
    int rc = kvd_market__gen_load(a->st, man, &g);
    if (rc == -ENOENT || (rc == 0 && strcmp(g.model, model))) {
        kvd_market__rollback_errf(a, req, 404, "manifest %.16s... is no ring generation of model %.16s... that "
                 "this market published", man, model);
        goto out;
    }
    if (rc) {
        kvd_market__rollback_err(a, req, 503, NULL, a->st->err);
        goto out;
    }
    if (rank >= g.n) {
        kvd_market__rollback_errf(a, req, 404, "rank %llu does not exist (ring generation %.16s... has %zu ranks)",
                 (unsigned long long)rank, man, g.n);
        goto out;
    }
    /* who may sign: the rank's node sends (and rank 0 opens); the next rank (rank 0 after the
     * last) receives; whoever held that rank in that generation, whatever it holds now */
    size_t signer = r.side == KVD_SIDE_RECEIVED ? (rank + 1) % g.n : rank;
    if (!kvd_market__gen_may_sign(&g, signer, node)) {
        kvd_market__rollback_errf(a, req, 403, "node %.16s... did not hold rank %zu, whose %s side this is, in "
                 "ring generation %.16s... (node %.16s... did)", node, signer, side, man,
                 g.node[signer]);
        goto out;
    }
    if (r.side == KVD_SIDE_OPEN) {   /* a paying client opened it: rank 0 holds the client's key */
        rc = kvd_market__client_get(a->st, client, &cl);
        if (rc == -ENOENT) {
            kvd_market__rollback_errf(a, req, 403, "client %.16s... is not known to this market", client);
            goto out;
        }
        char want[65];
        if (rc == 0)
            ring_client_proof(cl.verifier, model, man, session, r.t1, want);
        if (rc == 0 && CRYPTO_memcmp(want, proof, 64)) {
            kvd_market__rollback_errf(a, req, 403, "the proof does not bind session %s to client %.16s...: rank 0 "
                     "must hold the client's key", session, client);
            goto out;
        }
        if (rc) {
            kvd_market__rollback_err(a, req, 503, NULL, a->st->err);
            goto out;
        }
    }
    kvd_market__session_key(model, man, session, key);
    struct kvd_market_receipt kr = r;   /* the receipts table keys sessions by the ledger's key */
    memcpy(kr.session, key, 65);
    rc = a->st->ops->receipt_put(a->st->impl, &kr);
    if (rc == 0 && r.side == KVD_SIDE_OPEN) {   /* one client request more for the demand */
        struct kvd_market_model m;
        if ((rc = a->st->ops->model_get(a->st->impl, model, &m)) == 0) {
            double d = kvd_market__demand_now(&a->cfg, &m, now) + 60.0 / a->cfg.demand_tau_s;
            rc = a->st->ops->model_demand_set(a->st->impl, model, d, now);
            kvd_market__model_clear(&m);
        }
    }
    struct kvd_market_settled set = {0};
    if (rc == 0)
        rc = kvd_market__session_submit(a->st, &a->cfg, &r, man, key, client, now, kvd_market__on_paid, a, &set);
    if (rc == -EEXIST) {
        kvd_market__rollback_err(a, req, 409, NULL, "this side of the session's receipt was submitted before");
        goto out;
    }
    if (rc) {
        kvd_market__rollback_err(a, req, 503, NULL, a->st->err);
        goto out;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", !set.opened ? "waiting for rank 0's open side (a session "
                            "no client opened is never paid)" : set.done ? "settled" :
                            set.ranks_paid ? "credited" : "waiting for the ring's other sides");
    cJSON_AddBoolToObject(o, "credited", set.ranks_paid > 0);
    cJSON_AddNumberToObject(o, "ranks_paid", set.ranks_paid);
    cJSON_AddNumberToObject(o, "layer_tokens", (double)set.layer_tokens);
    cJSON_AddNumberToObject(o, "credit", set.credit);
    kvd_market__commit_reply(a, req, 200, o);
out:
    cJSON_Delete(b);
}

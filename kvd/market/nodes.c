/* nodes.c — a node's device profile (POST /v1/nodes, what the planner plans with) and its
 * balance (GET /v1/nodes/<id>/balance). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kvd/market/internal.h"
#include "net/net.h"
#include "util/util.h"

/* POST /v1/nodes {"model": ID?, "mem_bytes": N, "backend": S, "inbound": B}: a profile. */
void kvd_market__h_nodes_post(struct net_http_req *req, void *ud)
{
    struct kvd_market_api *a = ud;
    char node[65], why[512];
    cJSON *b = kvd_market__body_json(req);
    if (!b)
        return;
    struct kvd_market_node nd = {.inbound = true};
    const char *be = util_json_string(b, "backend"), *model = util_json_string(b, "model");
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(b, "inbound");
    if (kvd_market__juint(b, "mem_bytes", 1 << 16, 1e15, &nd.mem_bytes, why, sizeof why)) {
        kvd_market__reply_err(req, 400, NULL, "%s", why);
        goto out;
    }
    if (be && (strlen(be) >= sizeof nd.backend || !be[0])) {
        kvd_market__reply_err(req, 400, NULL, "backend: 1 to %zu bytes", sizeof nd.backend - 1);
        goto out;
    }
    if (model && !kvd_market__is_hex(model, 64, 64)) {
        kvd_market__reply_err(req, 400, NULL, "model: expected 64 lowercase hex digits");
        goto out;
    }
    snprintf(nd.backend, sizeof nd.backend, "%s", be ? be : "cpu");
    if (cJSON_IsBool(in))
        nd.inbound = cJSON_IsTrue(in);
    if (kvd_market__begin_signed(a, req, node))
        goto out;
    memcpy(nd.id, node, 65);
    double now = kvd_market__now();
    nd.seen = now;
    int rc = a->st->ops->node_put(a->st->impl, &nd);
    if (rc == 0 && model) {
        rc = kvd_market__replan_if_idle(a, model, now, why, sizeof why);
        if (rc == -ENOENT) {
            snprintf(why, sizeof why, "model %s is not registered", model);
            kvd_market__rollback_err(a, req, 404, NULL, why);
            goto out;
        }
    }
    if (rc) {
        kvd_market__rollback_err(a, req, rc == -EIO ? 503 : 422, NULL, rc == -EIO ? a->st->err : why);
        goto out;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "node", node);
    kvd_market__commit_reply(a, req, 200, o);
out:
    cJSON_Delete(b);
}

/* GET /v1/nodes/<id>/balance -> {"node", "layer_tokens", "credit"} */
void kvd_market__h_node_get(struct net_http_req *req, void *ud)
{
    struct kvd_market_api *a = ud;
    const char *p = net_http_req_path(req) + strlen("/v1/nodes/");
    char id[65];
    if (strlen(p) != 64 + strlen("/balance") || strcmp(p + 64, "/balance")) {
        kvd_market__reply_err(req, 404, NULL, "expected /v1/nodes/<64 hex>/balance");
        return;
    }
    memcpy(id, p, 64);
    id[64] = 0;
    if (!kvd_market__is_hex(id, 64, 64)) {
        kvd_market__reply_err(req, 400, NULL, "node id: expected 64 lowercase hex digits (its public key)");
        return;
    }
    uint64_t lt;
    double credit;
    if (a->st->ops->balance_get(a->st->impl, id, &lt, &credit)) {
        kvd_market__reply_err(req, 503, NULL, "store: %s", a->st->err);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "node", id);
    cJSON_AddNumberToObject(o, "layer_tokens", (double)lt);
    cJSON_AddNumberToObject(o, "credit", credit);
    kvd_market__reply_json(req, 200, o);
}

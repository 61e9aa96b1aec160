/* clients.c — paying clients' accounts (docs/market.md, "Clients"): added and credited by
 * an operator (POST /v1/clients, /v1/clients/<id>/credit), read by anyone (GET). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kvd/kvd.h"
#include "kvd/market/internal.h"
#include "net/net.h"
#include "ring/ring.h"
#include "util/util.h"

/* ---- clients (docs/market.md, "Clients") ---- */

static cJSON *client_json(const struct kvd_market_client *c)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "client", c->id);
    cJSON_AddStringToObject(o, "name", c->name);
    cJSON_AddNumberToObject(o, "balance", c->balance);
    cJSON_AddNumberToObject(o, "spent", c->spent);
    return o;
}

/* Begin a call only operators may make: 0 with node set, or the refusal sent. */
static int begin_operator(struct kvd_market_api *a, struct net_http_req *req, char node[65],
                          const char *what)
{
    if (kvd_market__begin_signed(a, req, node))
        return -EPERM;
    if (kvd_market__admit_operator(a->admit, node))
        return 0;
    char why[256];
    snprintf(why, sizeof why, "only the market's operators (kvd market --operator-key) may %s; node "
             "%.16s... is none", what, node);
    kvd_market__rollback_err(a, req, 403, NULL, why);
    return -EPERM;
}

/* A credit amount member: 0, or the 400 sent. */
static int credit_arg(struct net_http_req *req, const cJSON *b, double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(b, "credit");
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble <= 1e15)) {
        kvd_market__reply_err(req, 400, NULL, "credit: expected a number from 0 to 1e15");
        return -EINVAL;
    }
    *out = v->valuedouble;
    return 0;
}

/* POST /v1/clients {"client": ID, "verifier": HEX, "credit": N, "name"?: S}, by an operator:
 * a paying client's account (kvctl market client add made the key and sends only its id and
 * verifier). 201, 409 when the id is taken. */
void kvd_market__h_clients_post(struct net_http_req *req, void *ud)
{
    struct kvd_market_api *a = ud;
    char node[65];
    cJSON *b = kvd_market__body_json(req);
    if (!b)
        return;
    struct kvd_market_client c = {0}, old;
    const char *id = util_json_string(b, "client"), *v = util_json_string(b, "verifier"), *name = util_json_string(b, "name");
    if (!id || !kvd_market__is_hex(id, 64, 64) || !v || !kvd_market__is_hex(v, 64, 64) || util_hex_decode(v, c.verifier, 32) ||
        (name && strlen(name) > 127)) {
        kvd_market__reply_err(req, 400, NULL, "a client needs client (its id, 64 hex), verifier (64 hex) and "
                  "credit; name at most 127 bytes");
        goto out;
    }
    if (credit_arg(req, b, &c.balance) || begin_operator(a, req, node, "add clients"))
        goto out;
    snprintf(c.id, sizeof c.id, "%s", id);
    snprintf(c.name, sizeof c.name, "%s", name ? name : "");
    c.created = kvd_market__now();
    int rc = kvd_market__client_get(a->st, id, &old);
    if (rc == 0) {
        kvd_market__rollback_err(a, req, 409, NULL, "a client with that id exists");
        goto out;
    }
    if ((rc == -ENOENT ? kvd_market__client_put(a->st, &c) : rc)) {
        kvd_market__rollback_err(a, req, 503, NULL, a->st->err);
        goto out;
    }
    kvd_log(KVD_LOG_INFO, "client %.16s... (%s) added by operator %.16s... with credit %g", id, c.name,
            node, c.balance);
    kvd_market__commit_reply(a, req, 201, client_json(&c));
out:
    cJSON_Delete(b);
}

/* GET /v1/clients: {"payable": [ids]}, the clients whose balance is above zero (what a ring's
 * API lets in); GET /v1/clients/<id>: the account. */
void kvd_market__h_clients_get(struct net_http_req *req, void *ud)
{
    struct kvd_market_api *a = ud;
    const char *p = net_http_req_path(req);
    struct kvd_market_client c;
    if (!strcmp(p, "/v1/clients")) {
        char (*keys)[KVD_MARKET_KEY_MAX] = malloc(RING_CLIENTS_LIST_MAX * sizeof *keys);
        size_t n = 0;
        if (!keys || a->st->ops->blob_keys(a->st->impl, "client/", NULL, keys,
                                           RING_CLIENTS_LIST_MAX, &n)) {
            free(keys);
            kvd_market__reply_err(req, 503, NULL, "store: %s", keys ? a->st->err : "out of memory");
            return;
        }
        cJSON *o = cJSON_CreateObject(), *ids = cJSON_AddArrayToObject(o, "payable");
        for (size_t i = 0; i < n; i++)
            if (kvd_market__client_get(a->st, keys[i] + strlen("client/"), &c) == 0 && c.balance > 0)
                cJSON_AddItemToArray(ids, cJSON_CreateString(c.id));
        free(keys);
        kvd_market__reply_json(req, 200, o);
        return;
    }
    p += strlen("/v1/clients/");
    if (strlen(p) != 64 || !kvd_market__is_hex(p, 64, 64)) {
        kvd_market__reply_err(req, 404, NULL, "expected /v1/clients/<client id, 64 hex>");
        return;
    }
    int rc = kvd_market__client_get(a->st, p, &c);
    if (rc == -ENOENT)
        kvd_market__reply_err(req, 404, NULL, "client %.16s... is not known to this market", p);
    else if (rc)
        kvd_market__reply_err(req, 503, NULL, "store: %s", a->st->err);
    else
        kvd_market__reply_json(req, 200, client_json(&c));
}

/* POST /v1/clients/<id>/credit {"credit": N}, by an operator: add to the client's balance. */
void kvd_market__h_client_credit(struct net_http_req *req, void *ud)
{
    struct kvd_market_api *a = ud;
    char node[65], id[65];
    const char *p = net_http_req_path(req) + strlen("/v1/clients/");
    double add;
    cJSON *b = kvd_market__body_json(req);
    if (!b)
        return;
    if (strlen(p) != 64 + strlen("/credit") || strcmp(p + 64, "/credit")) {
        kvd_market__reply_err(req, 404, NULL, "expected /v1/clients/<client id>/credit");
        goto out;
    }
    memcpy(id, p, 64);
    id[64] = 0;
    struct kvd_market_client c;
    if (!kvd_market__is_hex(id, 64, 64) || credit_arg(req, b, &add) ||
        begin_operator(a, req, node, "credit clients"))
        goto out;
    int rc = kvd_market__client_get(a->st, id, &c);
    if (rc == -ENOENT) {
        kvd_market__rollback_err(a, req, 404, NULL, "no such client");
        goto out;
    }
    c.balance += add;
    if (rc || kvd_market__client_put(a->st, &c)) {
        kvd_market__rollback_err(a, req, 503, NULL, a->st->err);
        goto out;
    }
    kvd_market__commit_reply(a, req, 200, client_json(&c));
out:
    cJSON_Delete(b);
}

/* standby.c — a market ring's standbys and takeovers (docs/market.md, "Standbys"): nodes that
 * join once every window is covered hold a standby lease on one window, pull it ahead, and
 * take its rank over when its stage dies, without the market in the loop.
 *
 * Standbys are named beside the manifest, in a roster ({"manifest": sha, "standby": [...]}),
 * not in it: adding one changes nothing the ring's links check, so no stage restarts. A
 * takeover is reported by the standby and recorded here; the manifest the market serves stays
 * the one the ring runs (its rank entry keeps the node it was published with), the roster
 * goes on naming the standby for that rank, and the ring generation lists the standby as a
 * node whose receipts count for the rank (ledger.c).
 *
 * Blobs:
 *   "stby/<model>/<node>"   {window, endpoint, expires, since}: a standby lease (expires 0:
 *                           given up or taken over)
 *   "took/<model>"          {"<window>": {node, manifest, mnode, mendpoint, at}}: node took
 *                           the window's rank over in ring generation manifest, whose rank
 *                           entry names mnode at mendpoint */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kvd/market/internal.h"
#include "ring/ring.h"
#include "util/util.h"

static void stby_key(char key[KVD_MARKET_KEY_MAX], const char *model, const char *node)
{
    snprintf(key, KVD_MARKET_KEY_MAX, "stby/%s/%s", model, node);
}

cJSON *kvd_market__standby_get(struct kvd_market_store *st, const char *model, const char *node,
                               double now)
{
    char key[KVD_MARKET_KEY_MAX];
    stby_key(key, model, node);
    cJSON *o = kvd_market__blob_load(st, key);
    if (o && util_json_number(o, "expires", 0) <= now) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

int kvd_market__standby_put(struct kvd_market_store *st, const char *model, const char *node,
                            uint32_t window, const char *endpoint, double since, double expires)
{
    char key[KVD_MARKET_KEY_MAX];
    stby_key(key, model, node);
    if (expires <= 0)   /* given up or taken over: gone, so lists read only live ones */
        return st->ops->blob_put(st->impl, key, NULL);
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return -ENOMEM;
    cJSON_AddStringToObject(o, "node", node);
    cJSON_AddNumberToObject(o, "window", window);
    if (endpoint)
        cJSON_AddStringToObject(o, "endpoint", endpoint);
    cJSON_AddNumberToObject(o, "since", since);
    cJSON_AddNumberToObject(o, "expires", expires);
    int rc = kvd_market__blob_save(st, key, o);
    cJSON_Delete(o);
    return rc;
}

cJSON *kvd_market__standby_list(struct kvd_market_store *st, const char *model, double now)
{
    char prefix[KVD_MARKET_KEY_MAX];
    snprintf(prefix, sizeof prefix, "stby/%s/", model);
    char (*keys)[KVD_MARKET_KEY_MAX] = malloc(KVD_MARKET_MAX_STANDBYS * sizeof *keys);
    cJSON *arr = cJSON_CreateArray();
    size_t n = 0;
    if (!keys || !arr ||
        st->ops->blob_keys(st->impl, prefix, NULL, keys, KVD_MARKET_MAX_STANDBYS, &n)) {
        free(keys);
        cJSON_Delete(arr);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        cJSON *o = kvd_market__blob_load(st, keys[i]);
        if (o && util_json_number(o, "expires", 0) > now)
            cJSON_AddItemToArray(arr, o);
        else
            cJSON_Delete(o);   /* lapsed: removed when its node calls again or claims */
    }
    free(keys);
    return arr;
}

cJSON *kvd_market__took_load(struct kvd_market_store *st, const char *model)
{
    char key[KVD_MARKET_KEY_MAX];
    snprintf(key, sizeof key, "took/%s", model);
    return kvd_market__blob_load(st, key);
}

int kvd_market__took_save(struct kvd_market_store *st, const char *model, uint32_t window,
                          const char *node, const char *manifest, const char *mnode,
                          const char *mendpoint, double now)
{
    char key[KVD_MARKET_KEY_MAX], w[16];
    snprintf(key, sizeof key, "took/%s", model);
    snprintf(w, sizeof w, "%u", window);
    cJSON *all = kvd_market__blob_load(st, key);
    if (!cJSON_IsObject(all)) {
        cJSON_Delete(all);
        all = cJSON_CreateObject();
    }
    cJSON *o = cJSON_CreateObject();
    if (!all || !o) {
        cJSON_Delete(all);
        cJSON_Delete(o);
        return -ENOMEM;
    }
    cJSON_DeleteItemFromObjectCaseSensitive(all, w);
    cJSON_AddItemToObject(all, w, o);
    cJSON_AddStringToObject(o, "node", node);
    cJSON_AddStringToObject(o, "manifest", manifest);
    cJSON_AddStringToObject(o, "mnode", mnode);
    cJSON_AddStringToObject(o, "mendpoint", mendpoint);
    cJSON_AddNumberToObject(o, "at", now);
    int rc = kvd_market__blob_save(st, key, all);
    cJSON_Delete(all);
    return rc;
}

/* One roster entry, unless a node is named twice (the first kept). */
static void entry_add(cJSON *arr, const char *node, const char *endpoint, uint32_t rank)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, arr)
        if (!strcmp(util_json_string(e, "node"), node))
            return;
    cJSON *o = cJSON_CreateObject(), *rk = cJSON_CreateArray();
    cJSON_AddStringToObject(o, "node", node);
    cJSON_AddStringToObject(o, "endpoint", endpoint);
    cJSON_AddItemToArray(rk, cJSON_CreateNumber(rank));
    cJSON_AddItemToObject(o, "ranks", rk);
    cJSON_AddItemToArray(arr, o);
}

cJSON *kvd_market__roster(struct kvd_market_store *st, const char *model, const char *sha,
                          const struct kvd_market_lease *leases, const bool *took, size_t n,
                          double now)
{
    cJSON *r = cJSON_CreateObject(), *sb = cJSON_CreateArray();
    cJSON *live = kvd_market__standby_list(st, model, now);
    if (!r || !sb || !live) {
        cJSON_Delete(r);
        cJSON_Delete(sb);
        cJSON_Delete(live);
        return NULL;
    }
    cJSON_AddStringToObject(r, "manifest", sha);
    /* the nodes that took a rank over in this generation first: the ring's links accept
     * them as that rank's node from then on */
    for (size_t i = 1; i < n; i++)
        if (took[i] && leases[i].endpoint[0])
            entry_add(sb, leases[i].node, leases[i].endpoint, (uint32_t)i);
    const cJSON *e;
    cJSON_ArrayForEach(e, live) {
        double w = util_json_number(e, "window", -1);
        const char *ep = util_json_string(e, "endpoint"), *node = util_json_string(e, "node");
        for (size_t i = 1; ep && node && i < n; i++)   /* not rank 0 */
            if ((double)leases[i].window == w && cJSON_GetArraySize(sb) < RING_MAX_STANDBYS)
                entry_add(sb, node, ep, (uint32_t)i);
    }
    cJSON_Delete(live);
    cJSON_AddItemToObject(r, "standby", sb);
    return r;
}

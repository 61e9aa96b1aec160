/* ringmap.c — what the map says of a model's ring, from what its stages report (docs/market.md,
 * "The map"): each heartbeat of a joined node whose stage runs carries the manifest the stage
 * runs, its links' state (and why one is down), how long ago it last ran a token, and on rank 0
 * the URL of the ring's OpenAI-compatible API. The market checks each field (a node is a
 * stranger), keeps the last report per window as the blob "report/<model>/<window>", and reads
 * it back when it shows the map: a ring whose stages say a link is down is no ring there, and
 * the reason is shown in its place; rank 0's URL is where clients reach it.
 *
 * A report counts only while it is fresh (three lease periods), comes from the window's holder
 * and names the manifest the market serves now; a stage that reports nothing (an older node,
 * a stage not started yet) leaves the ring as the leases alone make it. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kvd/market/internal.h"
#include "util/util.h"

#define REPORT_STR_MAX 512       /* a link's error as kept and shown, in bytes */
#define REPORT_API_MAX 256       /* an API URL */

static bool link_state_ok(const char *s)
{
    return !strcmp(s, "up") || !strcmp(s, "down") || !strcmp(s, "handshake");
}

/* Every byte printable ASCII: a URL or reason shown on the page and in terminals. */
static bool printable(const char *s, bool spaces)
{
    for (; *s; s++)
        if ((unsigned char)*s < (spaces ? 0x20 : 0x21) || (unsigned char)*s >= 0x7f)
            return false;
    return true;
}

const char *kvd_market__report_bad(const cJSON *b)
{
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(b, "manifest");
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(b, "links");
    const cJSON *age = cJSON_GetObjectItemCaseSensitive(b, "last_token_age_s");
    const cJSON *api = cJSON_GetObjectItemCaseSensitive(b, "api");
    if (m && (!cJSON_IsString(m) || strlen(m->valuestring) != 64 ||
              strspn(m->valuestring, "0123456789abcdef") != 64))
        return "manifest: expected the SHA-256 of the manifest the stage runs (64 hex digits)";
    if (l) {
        if (!cJSON_IsObject(l) || !cJSON_IsBool(cJSON_GetObjectItemCaseSensitive(l, "linked")))
            return "links: expected {\"linked\": BOOL, \"in\"?, \"out\"?, \"in_error\"?, "
                   "\"out_error\"?, \"error\"?}";
        static const char *const sides[] = {"in", "out"};
        for (int k = 0; k < 2; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(l, sides[k]);
            if (v && (!cJSON_IsString(v) || !link_state_ok(v->valuestring)))
                return "links: in and out are \"up\", \"down\" or \"handshake\"";
        }
        static const char *const errs[] = {"in_error", "out_error", "error"};
        for (int k = 0; k < 3; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(l, errs[k]);
            if (v && (!cJSON_IsString(v) || !printable(v->valuestring, true)))
                return "links: an error is a string of printable ASCII";
        }
        const cJSON *op = cJSON_GetObjectItemCaseSensitive(l, "out_peer");
        if (op && (!cJSON_IsString(op) || strlen(op->valuestring) > 96 ||
                   !printable(op->valuestring, false)))
            return "links: out_peer is HOST:PORT (printable, at most 96 bytes)";
    }
    if (age && (!cJSON_IsNumber(age) || !(age->valuedouble >= 0 && age->valuedouble <= 1e9)))
        return "last_token_age_s: expected seconds, 0 to 1e9";
    if (api) {
        const char *u = cJSON_IsString(api) ? api->valuestring : NULL;
        if (!u || strlen(u) >= REPORT_API_MAX || !printable(u, false) ||
            (strncmp(u, "http://", 7) && strncmp(u, "https://", 8)) || !strchr(u + 8, ':'))
            return "api: expected http(s)://HOST:PORT (printable, at most 255 bytes)";
    }
    return NULL;
}

/* s cut to REPORT_STR_MAX bytes into o[k]. */
static void add_cut(cJSON *o, const char *k, const char *s)
{
    char b[REPORT_STR_MAX + 1];
    snprintf(b, sizeof b, "%s", s);
    cJSON_AddStringToObject(o, k, b);
}

/* An API URL with a wildcard host (0.0.0.0, [::]) names the address the heartbeat came from. */
static void api_add(cJSON *o, const char *url, const char *peer)
{
    const char *host = strstr(url, "://") + 3;
    char b[REPORT_API_MAX + 64];
    bool any4 = !strncmp(host, "0.0.0.0:", 8), any6 = !strncmp(host, "[::]:", 5);
    if ((any4 || any6) && peer && !strchr(peer, '/') && !strchr(peer, ':'))   /* IPv4 peers */
        snprintf(b, sizeof b, "%.*s%s%s", (int)(host - url), url, peer,
                 strchr(host, ']') ? strchr(host, ']') + 1 : strchr(host, ':'));
    else
        snprintf(b, sizeof b, "%s", url);
    cJSON_AddStringToObject(o, "api", b);
}

int kvd_market__report_save(struct kvd_market_store *st, const char *model, uint32_t window,
                            const char *node, const cJSON *b, const char *peer, double now)
{
    const char *man = util_json_string(b, "manifest");
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(b, "links");
    if (!man)
        return 0;   /* no stage runs: nothing to say of a ring */
    cJSON *o = cJSON_CreateObject(), *lo = cJSON_CreateObject();
    if (!o || !lo) {
        cJSON_Delete(o);
        cJSON_Delete(lo);
        return -ENOMEM;
    }
    cJSON_AddStringToObject(o, "node", node);
    cJSON_AddStringToObject(o, "manifest", man);
    cJSON_AddNumberToObject(o, "at", now);
    if (l) {
        cJSON_AddBoolToObject(lo, "linked", cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(l, "linked")));
        static const char *const keys[] = {"in", "out", "in_error", "out_error", "error", "out_peer"};
        for (int k = 0; k < 6; k++)
            if (util_json_string(l, keys[k]))
                add_cut(lo, keys[k], util_json_string(l, keys[k]));
    }
    cJSON_AddItemToObject(o, "links", lo);
    const cJSON *age = cJSON_GetObjectItemCaseSensitive(b, "last_token_age_s");
    if (cJSON_IsNumber(age))   /* kept as a time on the market's clock */
        cJSON_AddNumberToObject(o, "last_token_at", now - age->valuedouble);
    if (util_json_string(b, "api"))
        api_add(o, util_json_string(b, "api"), peer);
    char key[KVD_MARKET_KEY_MAX];
    snprintf(key, sizeof key, "report/%s/%u", model, window);
    int rc = kvd_market__blob_save(st, key, o);
    cJSON_Delete(o);
    return rc;
}

cJSON *kvd_market__report_load(struct kvd_market_store *st, const char *model, uint32_t window,
                               const char *node, const char *manifest, double now, double fresh_s)
{
    char key[KVD_MARKET_KEY_MAX];
    snprintf(key, sizeof key, "report/%s/%u", model, window);
    cJSON *o = kvd_market__blob_load(st, key);
    const char *n = util_json_string(o, "node"), *m = util_json_string(o, "manifest");
    if (!n || !m || strcmp(n, node) || !manifest || strcmp(m, manifest) ||
        now - util_json_number(o, "at", 0) > fresh_s) {
        cJSON_Delete(o);
        return NULL;
    }
    /* as the map shows it: seconds, not the market's clock */
    double at = util_json_number(o, "last_token_at", -1);
    cJSON_DeleteItemFromObjectCaseSensitive(o, "last_token_at");
    if (at >= 0)
        cJSON_AddNumberToObject(o, "last_token_age_s", now - at > 0 ? now - at : 0);
    cJSON_AddNumberToObject(o, "age_s", now - util_json_number(o, "at", now));
    cJSON_DeleteItemFromObjectCaseSensitive(o, "at");
    return o;
}

int kvd_market__report_down(const cJSON *rep, uint32_t rank, char *why, size_t n)
{
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(rep, "links");
    if (!l || cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(l, "linked")))
        return 0;
    const char *in = util_json_string(l, "in"), *out = util_json_string(l, "out");
    const char *ie = util_json_string(l, "in_error"), *oe = util_json_string(l, "out_error"), *e = util_json_string(l, "error");
    if (e)
        snprintf(why, n, "rank %u: %s", rank, e);
    else if (out && strcmp(out, "up"))
        snprintf(why, n, "rank %u reports its link to its successor %s%s%s", rank, out,
                 oe ? ": " : "", oe ? oe : "");
    else if (in && strcmp(in, "up"))
        snprintf(why, n, "rank %u reports its link from its predecessor %s%s%s", rank, in,
                 ie ? ": " : "", ie ? ie : "");
    else
        snprintf(why, n, "rank %u reports its links down", rank);
    /* a link down with its reason says more than one that waits for its peer */
    return e || (out && strcmp(out, "up") && oe) || (in && strcmp(in, "up") && ie) ? 2 : 1;
}

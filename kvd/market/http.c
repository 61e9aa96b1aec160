/* http.c — the HTTP glue of the market's API (docs/market.md): JSON answers and refusals,
 * signed calls (signature, clock, nonce), a request's store transaction, and the checks of
 * numbers and ids every handler shares.
 *
 * Every request runs in one store transaction: a mutating call checks its signature, spends
 * its nonce and writes, all committed together or not at all, so a refused call leaves the
 * ledger as it was and a retried one is never applied twice. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "kvd/market/internal.h"
#include "net/net.h"
#include "ring/ring.h"
#include "util/err.h"
#include "util/util.h"

#define NONCE_KEEP_FACTOR 2.0    /* nonces are kept for twice the clock skew allowed */

double kvd_market__now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- answers ---- */

void kvd_market__reply_json(struct net_http_req *req, int status, cJSON *o)
{
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    if (!s) {
        net_http_reply_error(req, 500, "out of memory");
    } else {
        size_t n = strlen(s);
        s[n] = '\n';   /* the terminator's byte becomes the newline; the length says where it ends */
        net_http_reply(req, status, "application/json", "Cache-Control: no-store\r\n", s, n + 1);
    }
    free(s);
    cJSON_Delete(o);
}

/* {"error": reason} with a 4xx/5xx status; extra (may be NULL) is merged in (taken). */
void kvd_market__reply_err(struct net_http_req *req, int status, cJSON *extra, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cJSON *o = extra ? extra : cJSON_CreateObject();
    cJSON_AddStringToObject(o, "error", msg);
    kvd_market__reply_json(req, status, o);
}

bool kvd_market__is_hex(const char *s, size_t lo, size_t hi)
{
    size_t n = strlen(s);
    if (n < lo || n > hi)
        return false;
    for (size_t i = 0; i < n; i++)
        if (util_hex_digit((unsigned char)s[i]) < 0 || (s[i] >= 'A' && s[i] <= 'F'))
            return false;
    return true;
}

/* ---- signed calls ---- */

/* Check the signature headers of req; node gets the caller's key (hex). The nonce is spent
 * in the open transaction. 0, or the HTTP status to refuse with (reason in why). */
static int auth(struct kvd_market_api *a, struct net_http_req *req, char node[65], char *why,
                size_t whylen)
{
    const char *k = net_http_req_header(req, "X-Kv-Node");
    const char *t = net_http_req_header(req, "X-Kv-Time");
    const char *n = net_http_req_header(req, "X-Kv-Nonce");
    const char *s = net_http_req_header(req, "X-Kv-Signature");
    if (!k || !t || !n || !s) {
        util_seterr(why, whylen, "unsigned call: X-Kv-Node, X-Kv-Time, X-Kv-Nonce and "
                    "X-Kv-Signature are required");
        return 401;
    }
    uint8_t pub[32], sig[64];
    if (!kvd_market__is_hex(k, 64, 64) || util_hex_decode(k, pub, 32)) {
        util_seterr(why, whylen, "X-Kv-Node: expected 64 lowercase hex digits (an Ed25519 key)");
        return 400;
    }
    if (!kvd_market__is_hex(s, 128, 128) || util_hex_decode(s, sig, 64)) {
        util_seterr(why, whylen, "X-Kv-Signature: expected 128 lowercase hex digits");
        return 400;
    }
    if (!kvd_market__is_hex(n, 16, 64)) {
        util_seterr(why, whylen, "X-Kv-Nonce: expected 16 to 64 lowercase hex digits");
        return 400;
    }
    int64_t ts;
    if (util_parse_i64(t, 0, INT64_MAX / 2, &ts, NULL, 0) < 0) {
        util_seterr(why, whylen, "X-Kv-Time '%.32s': expected Unix seconds", t);
        return 400;
    }
    double now = kvd_market__now();
    if (fabs((double)ts - now) > a->cfg.clock_skew_s) {
        util_seterr(why, whylen, "X-Kv-Time %lld is %.0f s from the market's clock (at most %.0f s)",
                    (long long)ts, fabs((double)ts - now), a->cfg.clock_skew_s);
        return 401;
    }
    size_t blen = 0;
    const void *body = net_http_req_body(req, &blen);
    char path[2100], canon[RING_MARKET_CANON_MAX];
    const char *q = net_http_req_query(req);
    snprintf(path, sizeof path, "%s%s%s", net_http_req_path(req), q[0] ? "?" : "", q);
    int cl = ring_market_canon(canon, net_http_req_method(req), path, body, blen, ts, n);
    if (cl < 0 || !net_sig_verify(pub, canon, (size_t)cl, sig)) {
        util_seterr(why, whylen, "bad signature for node %.16s... over %s %s", k,
                    net_http_req_method(req), path);
        return 401;
    }
    int rc = a->st->ops->nonce_use(a->st->impl, k, n, now,
                                   now - NONCE_KEEP_FACTOR * a->cfg.clock_skew_s);
    if (rc == -EEXIST) {
        util_seterr(why, whylen, "nonce %s was used before by this node (a replay)", n);
        return 409;
    }
    if (rc < 0) {
        util_seterr(why, whylen, "store: %s", a->st->err);
        return 503;
    }
    memcpy(node, k, 65);
    return 0;
}

/* Parse the request body as a JSON object: the object, or NULL with a 400 sent. */
cJSON *kvd_market__body_json(struct net_http_req *req)
{
    size_t len = 0;
    const char *b = net_http_req_body(req, &len);
    cJSON *o = b && len ? cJSON_ParseWithLength(b, len) : NULL;
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        kvd_market__reply_err(req, 400, NULL, "the body must be a JSON object (%zu bytes given)", len);
        return NULL;
    }
    return o;
}

/* A whole number member in [lo, hi]: 0, or -EINVAL with why. */
int kvd_market__juint(const cJSON *o, const char *key, double lo, double hi, uint64_t *out,
                      char *why, size_t whylen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi) ||
        v->valuedouble != floor(v->valuedouble)) {
        util_seterr(why, whylen, "%s: expected a whole number from %.0f to %.0f", key, lo, hi);
        return -EINVAL;
    }
    *out = (uint64_t)v->valuedouble;
    return 0;
}

/* ---- a request's transaction ---- */

/* Begin the request's transaction: 0, or the 503 sent. */
int kvd_market__begin(struct kvd_market_api *a, struct net_http_req *req)
{
    if (a->st->ops->begin(a->st->impl)) {
        kvd_market__reply_err(req, 503, NULL, "store: %s", a->st->err);
        return -EIO;
    }
    return 0;
}

/* Commit, then answer o with status; a failed commit answers 503 (nothing was written). */
void kvd_market__commit_reply(struct kvd_market_api *a, struct net_http_req *req, int status,
                              cJSON *o)
{
    if (a->st->ops->commit(a->st->impl)) {
        a->st->ops->rollback(a->st->impl);
        cJSON_Delete(o);
        kvd_market__reply_err(req, 503, NULL, "store: %s", a->st->err);
        return;
    }
    kvd_market__reply_json(req, status, o);
}

void kvd_market__rollback_err(struct kvd_market_api *a, struct net_http_req *req, int status,
                              cJSON *extra, const char *why)
{
    a->st->ops->rollback(a->st->impl);
    kvd_market__reply_err(req, status, extra, "%s", why);
}

/* kvd_market__rollback_err with the reason formatted here. */
void kvd_market__rollback_errf(struct kvd_market_api *a, struct net_http_req *req, int status,
                               const char *fmt, ...)
{
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    kvd_market__rollback_err(a, req, status, NULL, why);
}

/* Begin, then check the signature: 0 with node set, or the refusal sent. */
int kvd_market__begin_signed(struct kvd_market_api *a, struct net_http_req *req, char node[65])
{
    char why[512];
    if (kvd_market__begin(a, req))
        return -EIO;
    int st = auth(a, req, node, why, sizeof why);
    if (st) {
        kvd_market__rollback_err(a, req, st, NULL, why);
        return -EPERM;
    }
    return 0;
}

/* /v1/models/<id>[/<what>]: id into out (0) or a 400/404 sent. */
int kvd_market__path_model(struct net_http_req *req, const char *path, char id[65],
                           const char **what)
{
    const char *p = path + strlen("/v1/models/");
    const char *slash = strchr(p, '/');
    size_t n = slash ? (size_t)(slash - p) : strlen(p);
    if (n != 64) {
        kvd_market__reply_err(req, 400, NULL, "model id: expected 64 hex digits (the catalog's SHA-256)");
        return -EINVAL;
    }
    memcpy(id, p, 64);
    id[64] = 0;
    if (!kvd_market__is_hex(id, 64, 64)) {
        kvd_market__reply_err(req, 400, NULL, "model id: expected 64 lowercase hex digits");
        return -EINVAL;
    }
    *what = slash ? slash + 1 : "";
    return 0;
}

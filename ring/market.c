/* market.c — the client side of the market's API (docs/market.md): canonical bytes of a
 * signed call and one JSON request over libcurl, signed with the node key. */
#include <errno.h>
#include <math.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "net/net.h"
#include "ring/ring.h"
#include "util/util.h"
#include "wtype/wtype.h"

int ring_market_canon(char *out, const char *method, const char *path, const void *body,
                     size_t len, int64_t ts, const char *nonce)
{
    uint8_t dg[32];
    char hex[65];
    unsigned dl = 0;
    if (!EVP_Digest(body ? body : "", body ? len : 0, dg, &dl, EVP_sha256(), NULL))
        return -EIO;
    util_hex_encode(dg, 32, hex);
    int n = snprintf(out, RING_MARKET_CANON_MAX, "KVMKT1\n%s\n%s\n%s\n%" PRId64 "\n%s", method,
                     path, hex, ts, nonce);
    if (n < 0 || n >= RING_MARKET_CANON_MAX)
        return -ENAMETOOLONG;
    return n;
}

int ring_market_sign(const struct net_identity *id, const struct net_identity *as, const char *method,
                     const char *path, const void *body, size_t len, int64_t ts, const char *nonce,
                     char lines[4][RING_MARKET_HDR_MAX])
{
    char canon[RING_MARKET_CANON_MAX], pub[65], sighex[129];
    uint8_t sig[64];
    int n = ring_market_canon(canon, method, path, body, len, ts, nonce);
    if (n < 0)
        return n;
    if (strlen(nonce) > 64 || net_identity_sign(id, canon, (size_t)n, sig) < 0)
        return -EINVAL;
    util_hex_encode(net_identity_pub(as ? as : id), 32, pub);
    util_hex_encode(sig, 64, sighex);
    snprintf(lines[0], RING_MARKET_HDR_MAX, "X-Kv-Node: %s", pub);
    snprintf(lines[1], RING_MARKET_HDR_MAX, "X-Kv-Time: %" PRId64, ts);
    snprintf(lines[2], RING_MARKET_HDR_MAX, "X-Kv-Nonce: %s", nonce);
    snprintf(lines[3], RING_MARKET_HDR_MAX, "X-Kv-Signature: %s", sighex);
    return 0;
}

static const char *market_ca;

void ring_market_set_ca(const char *ca_file)
{
    market_ca = ca_file;
}

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *ud)
{
    size_t n = size * nmemb;
    /* an answer of 64 MiB or more is hostile: curl then stops with a write error */
    if (util_buf_append(ud, ptr, n, (size_t)RING_MARKET_BODY_MAX * 64 - 1))
        return 0;
    return n;
}

int ring_market_call(const char *base, const char *method, const char *path, const char *body,
                    const struct net_identity *id, int timeout_ms, long *status, char **resp,
                    char *err, size_t errlen)
{
    *resp = NULL;
    *status = 0;
    size_t blen = body ? strlen(body) : 0;
    char url[2600];
    if (snprintf(url, sizeof url, "%s%s", base, path) >= (int)sizeof url) {
        util_seterr(err, errlen, "market URL %s%s: longer than %zu bytes", base, path, sizeof url - 1);
        return -ENAMETOOLONG;
    }
    CURL *c = curl_easy_init();
    if (!c) {
        util_seterr(err, errlen, "libcurl: cannot start a request");
        return -ENOMEM;
    }
    struct curl_slist *hd = curl_slist_append(NULL, "Content-Type: application/json");
    int rc = 0;
    if (id) {
        uint8_t nb[16];
        char nonce[33], lines[4][RING_MARKET_HDR_MAX];
        if (RAND_bytes(nb, sizeof nb) != 1) {
            util_seterr(err, errlen, "no random bytes for the nonce");
            rc = -EIO;
            goto out;
        }
        util_hex_encode(nb, sizeof nb, nonce);
        if ((rc = ring_market_sign(id, NULL, method, path, body, blen, (int64_t)time(NULL), nonce, lines))) {
            util_seterr(err, errlen, "signing %s %s failed", method, path);
            goto out;
        }
        for (int k = 0; k < 4; k++)
            hd = curl_slist_append(hd, lines[k]);
    }
    hd = curl_slist_append(hd, "Expect:");
    struct util_buf b = {0};
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hd);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)(timeout_ms < 5000 ? timeout_ms : 5000));
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    if (market_ca)   /* https://: the market's certificate must chain to this CA */
        curl_easy_setopt(c, CURLOPT_CAINFO, market_ca);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)blen);
    }
    CURLcode cr = curl_easy_perform(c);
    if (cr != CURLE_OK) {
        util_seterr(err, errlen, "%s %s: %s", method, url, curl_easy_strerror(cr));
        util_buf_free(&b);
        rc = cr == CURLE_OPERATION_TIMEDOUT ? -ETIMEDOUT : -ECONNREFUSED;
        goto out;
    }
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, status);
    *resp = b.p ? b.s : strdup("");
    if (!*resp)
        rc = -ENOMEM;
out:
    curl_slist_free_all(hd);
    curl_easy_cleanup(c);
    return rc;
}

char *ring_probe_rows_encode(const float *x, size_t n)
{
    if (n > RING_PROBE_BYTES_MAX)
        return NULL;
    uint8_t *h = malloc(n * 2 + 1);
    char *out = malloc((n * 2 + 2) / 3 * 4 + 1);
    if (h && out) {
        for (size_t i = 0; i < n; i++) {
            uint16_t v = wtype_f32_to_f16(x[i]);
            h[2 * i] = (uint8_t)v;
            h[2 * i + 1] = (uint8_t)(v >> 8);
        }
        EVP_EncodeBlock((unsigned char *)out, h, (int)(n * 2));
    } else {
        free(out);
        out = NULL;
    }
    free(h);
    return out;
}

int ring_probe_rows_decode(const char *s, float *x, size_t n)
{
    size_t len = strlen(s);
    if (n > RING_PROBE_BYTES_MAX || len != (n * 2 + 2) / 3 * 4)
        return -EINVAL;
    uint8_t *h = malloc(len / 4 * 3 + 1);
    if (!h)
        return -ENOMEM;
    /* EVP_DecodeBlock counts the padding as zero bytes: the length is checked above */
    int got = EVP_DecodeBlock(h, (const unsigned char *)s, (int)len);
    int rc = got < (int)(n * 2) ? -EINVAL : 0;
    for (size_t i = 0; rc == 0 && i < n; i++)
        x[i] = wtype_f16_to_f32((uint16_t)(h[2 * i] | h[2 * i + 1] << 8));
    free(h);
    return rc;
}

double ring_probe_nmse(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]))
            return INFINITY;
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? num / den : num > 0 ? INFINITY : 0;
}

/* ---- client keys ---- */

bool ring_client_key_valid(const char *key)
{
    size_t p = strlen(RING_CLIENT_KEY_PREFIX);
    if (!key || strlen(key) != RING_CLIENT_KEY_LEN || strncmp(key, RING_CLIENT_KEY_PREFIX, p))
        return false;
    for (const char *c = key + p; *c; c++)
        if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f')))
            return false;
    return true;
}

int ring_client_key_new(char out[RING_CLIENT_KEY_LEN + 1])
{
    uint8_t b[32];
    if (RAND_bytes(b, sizeof b) != 1)
        return -EIO;
    memcpy(out, RING_CLIENT_KEY_PREFIX, strlen(RING_CLIENT_KEY_PREFIX));
    util_hex_encode(b, sizeof b, out + strlen(RING_CLIENT_KEY_PREFIX));
    OPENSSL_cleanse(b, sizeof b);
    return 0;
}

void ring_client_id(const char *key, char out[65])
{
    uint8_t d[32];
    unsigned dl = 32;
    EVP_Digest(key, strlen(key), d, &dl, EVP_sha256(), NULL);
    util_hex_encode(d, 32, out);
}

void ring_client_verifier(const char *key, uint8_t out[32])
{
    unsigned ol = 32;
    HMAC(EVP_sha256(), key, (int)strlen(key), (const unsigned char *)RING_CLIENT_VERIFIER_MSG,
         strlen(RING_CLIENT_VERIFIER_MSG), out, &ol);
}

void ring_client_proof(const uint8_t v[32], const char *model, const char *manifest,
                       const char *session, uint64_t tokens, char out[65])
{
    char msg[256];
    int n = snprintf(msg, sizeof msg, "KVSESS1\n%.64s\n%.64s\n%.64s\n%" PRIu64, model, manifest,
                     session, tokens);
    uint8_t d[32];
    unsigned dl = 32;
    HMAC(EVP_sha256(), v, 32, (const unsigned char *)msg, (size_t)(n > 0 ? n : 0), d, &dl);
    util_hex_encode(d, 32, out);
}

/* fuzz-market — libFuzzer target for what a stranger controls at the market (kvd market): the
 * route (every one of its API), the path of the routes that name a model or client, and the
 * JSON body, sent over a loopback connection to the market's own HTTP server and store
 * (SQLite, in a scratch directory), signed the way nodes sign (by the operator's key, one of
 * two node keys, or not at all), so that the checks behind the signature are reached. State
 * carries over from input to input (a model registered by one is claimed by the next), as it
 * does for a market facing many calls. The market must answer every call within 5 s, what it
 * calls JSON must be one JSON document, and never with a 500: a malformed or hostile call is
 * the caller's error (4xx), not the market's.
 * The first byte picks the route (low 5 bits) and the key (next 2); up to the first newline
 * comes the path's last part for the routes that take one; the rest is the body.
 * fuzz-modules: util wtype gguf net ring kernels gen/kern_cl model planner kvd/log kvd/market/a
 * fuzz-modules: kvd/sampling
 * fuzz-modules: gen/market_page kvd/market/c
 * fuzz-modules: kvd/market/h kvd/market/l kvd/market/mo kvd/market/man kvd/market/n
 * fuzz-modules: kvd/market/p kvd/market/r kvd/market/st */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <uv.h>

#include "kvd/kvd.h"
#include "kvd/market/internal.h"
#include "net/net.h"
#include "ring/ring.h"
#include "tests/lib/fuzz_client.h"
#include "tests/lib/fuzz_scratch.h"
#include "util/err.h"
#include "util/util.h"

#define RESP_MAX (1u << 20)

static uv_loop_t loop;
static struct net_http_server *srv;
static struct kvd_market_store *store;
static struct kvd_market_api *api;
static struct net_identity *keys[3];   /* the operator, node a, node b */
static int port;
static uint64_t nonce_n;

static const struct {
    const char *method, *path;   /* a trailing '*': the input's path part goes there */
} routes[] = {
    {"GET", "/"}, {"GET", "/v1/models"}, {"POST", "/v1/models"}, {"GET", "/v1/models/*"},
    {"POST", "/v1/nodes"}, {"GET", "/v1/nodes/*"}, {"POST", "/v1/claims"},
    {"POST", "/v1/leases/heartbeat"}, {"POST", "/v1/leases/release"}, {"POST", "/v1/leases/probe"},
    {"POST", "/v1/leases/audit"}, {"POST", "/v1/standbys"}, {"POST", "/v1/receipts"},
    {"DELETE", "/v1/models/*"}, {"POST", "/v1/clients"}, {"GET", "/v1/clients"},
    {"GET", "/v1/clients/*"}, {"POST", "/v1/clients/*"},
};
#define N_ROUTES (sizeof routes / sizeof routes[0])

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    char sub[160], err[KV_ERR_MAX];
    const char *dir = fuzz_scratch("market");   /* keys, the operator file, the database */
    for (int i = 0; i < 3; i++) {
        snprintf(sub, sizeof sub, "%s/key-%d", dir, i);
        if (net_identity_load(&keys[i], sub, err, sizeof err) < 0) {
            fprintf(stderr, "fuzz-market: %s\n", err);
            abort();
        }
    }
    /* the operator's key file, and a fresh database */
    char ops[160], db[160], hex[65];
    snprintf(ops, sizeof ops, "%s/operators.txt", dir);
    snprintf(db, sizeof db, "%s/market.db", dir);
    util_hex_encode(net_identity_pub(keys[0]), 32, hex);
    FILE *f = fopen(ops, "w");
    if (!f || fprintf(f, "%s\n", hex) < 0 || fclose(f))
        abort();
    unlink(db);
    kvd_log_set_level(KVD_LOG_ERROR);
    struct kvd_market_config cfg;
    kvd_market__config_default(&cfg);
    cfg.db = db;
    cfg.probe = false;            /* no calls out to the nodes' endpoints */
    cfg.poll_max_s = 1;           /* a long-poll ends within the client's patience */
    cfg.audit_rate = 0;
    cfg.claims_per_min_key = 0;   /* no rate limits: every claim reaches the checks behind */
    cfg.claims_per_min_addr = 0;
    cfg.max_ranks_addr = 0;
    cfg.operator_keys = ops;
    uv_loop_init(&loop);
    struct net_http_limits lim = {.max_body = RING_MARKET_BODY_MAX, .idle_timeout_ms = 3000};
    if (kvd_market__store_open(&store, db, err, sizeof err) ||
        net_http_server_new(&srv, &loop, &lim) ||
        kvd_market__api_new(&api, &loop, srv, store, &cfg, err, sizeof err) ||
        net_http_server_listen(srv, "127.0.0.1:0")) {
        fprintf(stderr, "fuzz-market: %s\n", err);
        abort();
    }
    port = net_http_server_port(srv);
    return 0;
}

static bool conns_open(void *ud)
{
    (void)ud;
    return net_http_server_stats(srv)->conns_open > 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 65536)
        return 0;
    unsigned ri = (data[0] & 31) % N_ROUTES, ki = data[0] >> 5 & 3;
    data++;
    size--;
    const uint8_t *nl = memchr(data, '\n', size);
    size_t plen = nl ? (size_t)(nl - data) : 0;
    const char *body = nl ? (const char *)nl + 1 : (const char *)data;
    size_t blen = nl ? size - plen - 1 : size;
    /* the path: the route's, its '*' replaced by the input's part, which a client would
     * percent-encode: bytes outside [A-Za-z0-9._~-] go as %XX */
    char path[512];
    size_t pl = 0;
    for (const char *p = routes[ri].path; *p && pl < 200; p++) {
        if (*p != '*') {
            path[pl++] = *p;
            continue;
        }
        for (size_t i = 0; i < plen && pl < 500; i++) {
            unsigned char c = data[i];
            if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                strchr("._~-", c))
                path[pl++] = (char)c;
            else
                pl += (size_t)snprintf(path + pl, 4, "%%%02X", c);
        }
    }
    path[pl] = 0;
    char head[2048];
    int h = snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     "Connection: close\r\nContent-Length: %zu\r\n", routes[ri].method, path, blen);
    if (ki < 3) {
        char nonce[33], lines[4][RING_MARKET_HDR_MAX];
        snprintf(nonce, sizeof nonce, "%016" PRIx64 "%016" PRIx64, (uint64_t)getpid(), ++nonce_n);
        if (ring_market_sign(keys[ki], NULL, routes[ri].method, path, body, blen, (int64_t)time(NULL),
                             nonce, lines) < 0)
            abort();
        for (int k = 0; k < 4; k++)
            h += snprintf(head + h, sizeof head - (size_t)h, "%s\r\n", lines[k]);
    }
    h += snprintf(head + h, sizeof head - (size_t)h, "\r\n");
    char *req = malloc((size_t)h + blen + 1);
    char *resp = malloc(RESP_MAX);
    if (!req || !resp)
        abort();
    memcpy(req, head, (size_t)h);
    memcpy(req + h, body, blen);
    req[(size_t)h + blen] = 0;
    size_t got = fuzz_client_drive(&loop, port, req, (size_t)h + blen, (size_t)h + blen, false, resp,
                                   RESP_MAX, "fuzz-market");
    if (getenv("FUZZ_MARKET_SHOW"))   /* what the market answered each input (seed work) */
        fprintf(stderr, "%s %s -> %.*s\n", routes[ri].method, path, (int)(got < 12 ? got : 12), resp);
    /* what it calls JSON is JSON (the HTTP layer's own refusals, a bad path or no such route,
     * are text, as is the page), and no 500 */
    if (fuzz_client_answer(resp, got, false, "fuzz-market") == 500) {
        fprintf(stderr, "fuzz-market: a 500 for the request\n%s\nanswer:\n%.*s\n", req,
                (int)(got < 600 ? got : 600), resp);
        abort();
    }
    fuzz_client_settle(&loop, conns_open, NULL, "fuzz-market", "a connection outlived its client");
    free(req);
    free(resp);
    return 0;
}

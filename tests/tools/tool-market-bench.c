/* tool-market-bench — a simulated population against a running market, speaking its whole
 * protocol with real signatures (make bench, section "market"; docs/market.md, "Storage"):
 *   tool-market-bench --url URL --catalog CAT.json --operator DIR [--nodes 10000]
 *                     [--models 100] [--clients 100] [--threads 8] [--seconds 20]
 *                     [--heartbeat-s 5] [--session-s 10]
 * The market must run with --no-probe (a lease activates on its heartbeat's endpoint alone),
 * with DIR's node key among its --operator-key keys, and without claim rate limits or address
 * caps (every node here comes from 127.0.0.1): --max-ranks-per-addr 0 --claims-per-min-addr 0
 * --claims-per-min-key 0.
 *
 * Set-up: NODES Ed25519 keys; MODELS models registered from one catalog whose source_sha256
 * is varied (a distinct id each); the first node of each model profiles, reads the model's
 * planned windows and claims window 0 (which fixes the plan); the operator creates CLIENTS
 * client accounts (key, id, verifier).
 * Claims (timed): every other node profiles and claims window k mod W of its model (k: its
 * place among the model's nodes, W: the model's windows). One ring per model, so the first
 * claimant of each window wins and the rest are refused (409), as a crowd's race is.
 * Activation: every holder's heartbeat carries its endpoint; the holder of rank 0 fetches the
 * model's manifest (which records the ring generation) and learns who holds each rank.
 * Steady state (timed, SECONDS): heartbeats and whole sessions in the proportion of their
 * natural rates: a heartbeat every HEARTBEAT_S s from each of the NODES nodes (sent by the
 * lease holders, the only nodes with a lease to renew) against a session every SESSION_S s
 * per ring. A session is rank 0's open side (a random client's proof) and both sides of every
 * edge, each signed by the node the generation names; its last receipt must settle it.
 * Prints requests/s and p50/p99 latency per kind, then checks that every session was settled,
 * that the nodes were paid exactly the layer-tokens the sessions were worth, and that the
 * credit paid equals what the clients were debited: exit 1 when not. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include "net/net.h"
#include "ring/ring.h"
#include "util/err.h"
#include "util/util.h"

#define MAX_WINDOWS 64          /* ranks of one ring (the market's own limit) */
#define RESP_MAX (256u << 10)   /* bytes of an answer kept (the manifest is the largest) */
#define CLIENT_CREDIT 1e9       /* each client's opening balance: never runs out here */
#define SESSION_TOKENS_MAX 256  /* a session's length: 1 to this many tokens */

/* A signer: a simulated node (its raw key) or the operator (its key file's identity). */
struct node {
    EVP_PKEY *key;
    const struct net_identity *id;
    char pub[65];
    int model;
    int window;     /* the window it holds, -1 none */
};

/* A model's ring: who holds each rank in the generation its manifest names. */
struct ring {
    char id[65], manifest[65];
    int n;                      /* windows (ranks) */
    int holder[MAX_WINDOWS];    /* node index per rank, -1 none */
    uint64_t layers;            /* sum of last - first over the ranks: layer-tokens per token */
};

struct client {
    char key[RING_CLIENT_KEY_LEN + 1], id[65];
    uint8_t verifier[32];
};

enum { K_PROFILE, K_CLAIM, K_ACTIVATE, K_HEARTBEAT, K_RECEIPT, K_SESSION, K_N };
static const char *kind_names[K_N] = {"profile", "claim", "activate", "heartbeat", "receipt",
                                      "session"};

struct lat {
    double *v;
    size_t n, cap;
    uint64_t codes[6];   /* 0: no answer, then 1xx..5xx */
};

/* One keep-alive connection and the answer of its last call. */
struct conn {
    CURL *c;
    char *resp;
    size_t len;
};

struct worker {
    int id;
    unsigned seed;
    struct conn conn;
    struct lat lat[K_N];
    uint64_t sessions, settled, heartbeats, layer_tokens, unexpected;
    char first_bad[512];    /* the first answer that was not what the protocol promises */
};

static struct node *nodes, operator_node;
static struct ring *rings;
static struct client *clients;
static int n_nodes = 10000, n_models = 100, n_clients = 100, n_threads = 8;
static double seconds = 20, heartbeat_s = 5, session_s = 10;
static double hb_per_session;   /* the steady state's mix */
static const char *url;
static int *holders, n_holders;

static size_t on_body(char *p, size_t s, size_t n, void *ud)
{
    struct conn *k = ud;
    size_t len = s * n, room = RESP_MAX - 1 - k->len;
    memcpy(k->resp + k->len, p, len < room ? len : room);
    k->len += len < room ? len : room;
    k->resp[k->len] = 0;
    return len;
}

static int conn_init(struct conn *k)
{
    k->c = curl_easy_init();
    k->resp = malloc(RESP_MAX);
    if (!k->c || !k->resp)
        return -ENOMEM;
    curl_easy_setopt(k->c, CURLOPT_TIMEOUT, 30L);
    curl_easy_setopt(k->c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(k->c, CURLOPT_WRITEDATA, k);
    return 0;
}

static void conn_free(struct conn *k)
{
    if (k->c)
        curl_easy_cleanup(k->c);
    free(k->resp);
}

static void lat_add(struct lat *l, double ms, long code)
{
    if (l->n == l->cap && util_grow((void **)&l->v, &l->cap, sizeof *l->v, 4096)) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    l->v[l->n++] = ms;
    l->codes[code >= 100 && code < 600 ? code / 100 : 0]++;
}

/* One call, signed by nd (NULL: unsigned; body NULL: a GET): its HTTP status (0 when no answer
 * came), the answer's body in k->resp. */
static long call(struct conn *k, const struct node *nd, const char *path, const char *body)
{
    char full[512];
    struct curl_slist *hd = curl_slist_append(NULL, "Content-Type: application/json");
    hd = curl_slist_append(hd, "Expect:");
    if (nd) {
        char nonce[33], canon[RING_MARKET_CANON_MAX], sighex[129], h[200];
        uint8_t r[16], sig[64];
        size_t sl = sizeof sig;
        RAND_bytes(r, sizeof r);
        util_hex_encode(r, sizeof r, nonce);
        int64_t ts = (int64_t)time(NULL);
        int n = ring_market_canon(canon, body ? "POST" : "GET", path, body ? body : "",
                                  body ? strlen(body) : 0, ts, nonce);
        if (n < 0)
            return 0;
        if (nd->id) {
            net_identity_sign(nd->id, canon, (size_t)n, sig);
        } else {
            EVP_MD_CTX *mc = EVP_MD_CTX_new();
            EVP_DigestSignInit(mc, NULL, NULL, NULL, nd->key);
            EVP_DigestSign(mc, sig, &sl, (const unsigned char *)canon, (size_t)n);
            EVP_MD_CTX_free(mc);
        }
        util_hex_encode(sig, 64, sighex);
        snprintf(h, sizeof h, "X-Kv-Node: %s", nd->pub);
        hd = curl_slist_append(hd, h);
        snprintf(h, sizeof h, "X-Kv-Time: %" PRId64, ts);
        hd = curl_slist_append(hd, h);
        snprintf(h, sizeof h, "X-Kv-Nonce: %s", nonce);
        hd = curl_slist_append(hd, h);
        snprintf(h, sizeof h, "X-Kv-Signature: %s", sighex);
        hd = curl_slist_append(hd, h);
    }
    snprintf(full, sizeof full, "%s%s", url, path);
    curl_easy_setopt(k->c, CURLOPT_URL, full);
    curl_easy_setopt(k->c, CURLOPT_HTTPHEADER, hd);
    if (body) {
        curl_easy_setopt(k->c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(k->c, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    } else {
        curl_easy_setopt(k->c, CURLOPT_HTTPGET, 1L);
    }
    k->len = 0;
    k->resp[0] = 0;
    long code = 0;
    if (curl_easy_perform(k->c) == CURLE_OK)
        curl_easy_getinfo(k->c, CURLINFO_RESPONSE_CODE, &code);
    curl_slist_free_all(hd);
    return code;
}

/* A timed call of a kind: its status. */
static long timed(struct worker *w, int kind, const struct node *nd, const char *path,
                  const char *body)
{
    double t0 = util_now_ms();
    long code = call(&w->conn, nd, path, body);
    lat_add(&w->lat[kind], util_now_ms() - t0, code);
    return code;
}

/* An answer the protocol does not give a well-behaved caller: counted, the first one kept. */
static void unexpected(struct worker *w, const char *what, long code, const char *resp)
{
    if (!w->unexpected++)
        snprintf(w->first_bad, sizeof w->first_bad, "%s: HTTP %ld %.300s", what, code, resp);
}

static int rnd(struct worker *w, int n)
{
    return (int)((unsigned)rand_r(&w->seed) % (unsigned)n);
}

static void hex_random(char *out, size_t bytes)
{
    uint8_t b[32];
    RAND_bytes(b, (int)bytes);
    util_hex_encode(b, bytes, out);
}

static void body_profile(char *b, size_t n, const struct node *nd)
{
    snprintf(b, n, "{\"model\":\"%s\",\"mem_bytes\":1800000}", rings[nd->model].id);
}

static void body_heartbeat(char *b, size_t n, int i)
{
    snprintf(b, n, "{\"model\":\"%s\",\"window\":%d,\"endpoint\":\"tcp://127.0.0.1:%d\"}",
             rings[nodes[i].model].id, nodes[i].window, 20000 + i % 40000);
}

/* Claims: this thread's share of the nodes (the first of each model did so at set-up)
 * profiles and claims window k mod W. 201 for a window's first claimant, 409 for the rest. */
static void phase_claims(struct worker *w)
{
    char body[512], what[64];
    for (int i = n_models + w->id; i < n_nodes; i += n_threads) {
        struct node *nd = &nodes[i];
        const struct ring *r = &rings[nd->model];
        body_profile(body, sizeof body, nd);
        long code = timed(w, K_PROFILE, nd, "/v1/nodes", body);
        if (code != 200)
            unexpected(w, "profile", code, w->conn.resp);
        int win = (i / n_models) % r->n;
        snprintf(body, sizeof body, "{\"model\":\"%s\",\"window\":%d}", r->id, win);
        code = timed(w, K_CLAIM, nd, "/v1/claims", body);
        nd->window = code == 201 ? win : -1;
        if (code != 201 && code != 409) {
            snprintf(what, sizeof what, "claim of window %d", win);
            unexpected(w, what, code, w->conn.resp);
        }
    }
}

/* Activation: this thread's share of the holders heartbeats with its endpoint (active at
 * once: --no-probe), then its share of the models' rank-0 holders fetch the manifest. */
static void phase_activate(struct worker *w)
{
    char body[512];
    for (int h = w->id; h < n_holders; h += n_threads) {
        body_heartbeat(body, sizeof body, holders[h]);
        long code = timed(w, K_ACTIVATE, &nodes[holders[h]], "/v1/leases/heartbeat", body);
        if (code != 200 || !strstr(w->conn.resp, "\"state\":\"active\""))
            unexpected(w, "activating heartbeat", code, w->conn.resp);
    }
}

static void phase_manifests(struct worker *w)
{
    char path[128], what[160];
    for (int m = w->id; m < n_models; m += n_threads) {
        struct ring *r = &rings[m];
        snprintf(path, sizeof path, "/v1/models/%s/manifest", r->id);
        long code = call(&w->conn, NULL, path, NULL);
        cJSON *o = code == 200 ? cJSON_Parse(w->conn.resp) : NULL;
        const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(o, "ranks"), *rk;
        snprintf(what, sizeof what, "manifest of model %d", m);
        if (!cJSON_IsArray(ranks) || cJSON_GetArraySize(ranks) != r->n) {
            unexpected(w, what, code, w->conn.resp);
            cJSON_Delete(o);
            continue;
        }
        /* the generation: the SHA-256 of the bytes served (X-Kv-Manifest-Sha256) */
        uint8_t dg[32];
        unsigned dl = 32;
        EVP_Digest(w->conn.resp, w->conn.len, dg, &dl, EVP_sha256(), NULL);
        util_hex_encode(dg, 32, r->manifest);
        int i = 0;
        r->layers = 0;
        cJSON_ArrayForEach(rk, ranks) {
            const cJSON *node = cJSON_GetObjectItemCaseSensitive(rk, "node");
            const cJSON *ly = cJSON_GetObjectItemCaseSensitive(rk, "layers");
            if (!cJSON_IsString(node) || r->holder[i] < 0 || strcmp(node->valuestring, nodes[r->holder[i]].pub) ||
                !cJSON_IsArray(ly) || cJSON_GetArraySize(ly) != 2) {
                unexpected(w, "a manifest's rank is not its window's holder", code, w->conn.resp);
                break;
            }
            r->layers += (uint64_t)(ly->child->next->valuedouble - ly->child->valuedouble);
            i++;
        }
        cJSON_Delete(o);
    }
}

/* One session on a random ring for a random client: rank 0's open side, then both sides of
 * every edge, each signed by the node of the rank the side belongs to. */
static void session(struct worker *w)
{
    const struct ring *r = &rings[rnd(w, n_models)];
    const struct client *cl = &clients[rnd(w, n_clients)];
    uint64_t tokens = 1 + (uint64_t)rnd(w, SESSION_TOKENS_MAX);
    char sid[33], proof[65], digest[65], body[1024];
    hex_random(sid, 16);
    ring_client_proof(cl->verifier, r->id, r->manifest, sid, tokens, proof);
    snprintf(body, sizeof body, "{\"model\":\"%s\",\"manifest\":\"%s\",\"session\":\"%s\",\"rank\":0,"
             "\"tokens\":[0,%" PRIu64 "],\"side\":\"open\",\"client\":\"%s\",\"proof\":\"%s\"}",
             r->id, r->manifest, sid, tokens, cl->id, proof);
    double t0 = util_now_ms();
    w->sessions++;
    long code = timed(w, K_RECEIPT, &nodes[r->holder[0]], "/v1/receipts", body);
    bool ok = code == 200;
    if (!ok)
        unexpected(w, "open side", code, w->conn.resp);
    for (int e = 0; ok && e < r->n; e++) {
        hex_random(digest, 32);
        for (int s = 0; ok && s < 2; s++) {
            int signer = r->holder[s ? (e + 1) % r->n : e];
            snprintf(body, sizeof body, "{\"model\":\"%s\",\"manifest\":\"%s\",\"session\":\"%s\","
                     "\"rank\":%d,\"tokens\":[0,%" PRIu64 "],\"digest\":\"%s\",\"side\":\"%s\"}",
                     r->id, r->manifest, sid, e, tokens, digest, s ? "received" : "sent");
            code = timed(w, K_RECEIPT, &nodes[signer], "/v1/receipts", body);
            if (code != 200) {
                unexpected(w, s ? "received side" : "sent side", code, w->conn.resp);
                ok = false;
            }
        }
    }
    /* the last side completes the ring: every rank is paid by it */
    if (ok && !strstr(w->conn.resp, "\"status\":\"settled\"")) {
        unexpected(w, "the session's last receipt did not settle it", code, w->conn.resp);
        ok = false;
    }
    lat_add(&w->lat[K_SESSION], util_now_ms() - t0, ok ? 200 : 0);
    if (ok) {
        w->settled++;
        w->layer_tokens += tokens * r->layers;
    }
}

static void phase_steady(struct worker *w)
{
    char body[512];
    double end = util_now_s() + seconds;
    while (util_now_s() < end) {
        if ((double)w->heartbeats < hb_per_session * (double)w->sessions) {
            int i = holders[rnd(w, n_holders)];
            body_heartbeat(body, sizeof body, i);
            long code = timed(w, K_HEARTBEAT, &nodes[i], "/v1/leases/heartbeat", body);
            w->heartbeats++;
            if (code != 200)
                unexpected(w, "heartbeat", code, w->conn.resp);
        } else {
            session(w);
        }
    }
}

struct job {
    struct worker *w;
    void (*fn)(struct worker *w);
};

static void *job_run(void *ud)
{
    struct job *j = ud;
    j->fn(j->w);
    return NULL;
}

/* Run fn on every worker at once: the wall time it took. */
static double phase(struct worker *ws, void (*fn)(struct worker *w))
{
    pthread_t th[256];
    struct job jobs[256];
    double t0 = util_now_s();
    for (int i = 0; i < n_threads; i++) {
        jobs[i] = (struct job){&ws[i], fn};
        if (pthread_create(&th[i], NULL, job_run, &jobs[i])) {
            fprintf(stderr, "pthread_create failed\n");
            exit(1);
        }
    }
    for (int i = 0; i < n_threads; i++)
        pthread_join(th[i], NULL);
    return util_now_s() - t0;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One line of figures for a kind over span seconds. */
static void report(struct worker *ws, int k, double span, const char *unit)
{
    struct lat all = {0};
    for (int i = 0; i < n_threads; i++) {
        for (size_t j = 0; j < ws[i].lat[k].n; j++)
            lat_add(&all, ws[i].lat[k].v[j], 0);
        for (int s = 0; s < 6; s++)
            all.codes[s] += ws[i].lat[k].codes[s];
    }
    all.codes[0] -= all.n;   /* lat_add above counted each as "no answer" */
    if (!all.n)
        return;
    qsort(all.v, all.n, sizeof *all.v, cmp_d);
    printf("%-10s %8zu %-8s %8.1f/s  p50 %7.2f ms  p99 %7.2f ms  (2xx %" PRIu64 ", 4xx %" PRIu64
           ", 5xx %" PRIu64 ", no answer %" PRIu64 ")\n", kind_names[k], all.n, unit, all.n / span,
           all.v[all.n / 2], all.v[(size_t)(all.n * 0.99)], all.codes[2], all.codes[4], all.codes[5],
           all.codes[0]);
    free(all.v);
}

/* The first unexpected answer any worker saw: 0 when none, else 1 with it printed. */
static int any_unexpected(struct worker *ws, const char *phase_name)
{
    uint64_t n = 0;
    const char *first = NULL;
    for (int i = 0; i < n_threads; i++) {
        n += ws[i].unexpected;
        if (ws[i].unexpected && !first)
            first = ws[i].first_bad;
    }
    if (!n)
        return 0;
    fprintf(stderr, "FAILED: %" PRIu64 " unexpected answers during %s; the first: %s\n", n,
            phase_name, first);
    return 1;
}

/* A number member of a JSON answer, NAN when absent. */
static double jnum(const char *json, const char *key)
{
    cJSON *o = cJSON_Parse(json);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    cJSON_Delete(o);
    return d;
}

/* The models: one catalog, a different source digest each (a distinct id each), registered
 * by node 0. 0 or 1 with the reason printed. */
static int register_models(struct conn *k, char *cat, size_t clen)
{
    char *src = strstr(cat, "\"source_sha256\":");
    if (src)
        src = strchr(src + strlen("\"source_sha256\":"), '"');
    if (!src) {
        fprintf(stderr, "the catalog has no source_sha256\n");
        return 1;
    }
    src++;
    char *body = malloc(clen * 2 + 256);
    if (!body)
        return 1;
    for (int m = 0; m < n_models; m++) {
        char hex[9], *q = body;
        snprintf(hex, sizeof hex, "%08x", (unsigned)m);
        memcpy(src, hex, 8);
        q += sprintf(q, "{\"name\":\"bench-%d\",\"sources\":[\"http://127.0.0.1:1\"],\"catalog\":\"", m);
        for (size_t i = 0; i < clen; i++) {
            if (cat[i] == '"' || cat[i] == '\\')
                *q++ = '\\';
            if (cat[i] == '\n' || cat[i] == '\t') {
                *q++ = '\\';
                *q++ = cat[i] == '\n' ? 'n' : 't';
                continue;
            }
            *q++ = cat[i];
        }
        strcpy(q, "\"}");
        unsigned char dg[32];
        unsigned dl = 32;
        EVP_Digest(cat, clen, dg, &dl, EVP_sha256(), NULL);
        util_hex_encode(dg, 32, rings[m].id);
        long code = call(k, &nodes[0], "/v1/models", body);
        if (code != 201) {
            fprintf(stderr, "registering model %d: HTTP %ld %s\n", m, code, k->resp);
            free(body);
            return 1;
        }
    }
    free(body);
    return 0;
}

/* The first node of each model profiles (the market plans its windows), reads the plan and
 * claims window 0, which fixes it. 0 or 1 with the reason printed. */
static int plan_models(struct conn *k)
{
    char body[512], path[128];
    for (int m = 0; m < n_models; m++) {
        struct ring *r = &rings[m];
        body_profile(body, sizeof body, &nodes[m]);
        long code = call(k, &nodes[m], "/v1/nodes", body);
        snprintf(path, sizeof path, "/v1/models/%s/coverage", r->id);
        long cc = code == 200 ? call(k, NULL, path, NULL) : 0;
        cJSON *o = cc == 200 ? cJSON_Parse(k->resp) : NULL;
        const cJSON *ws = cJSON_GetObjectItemCaseSensitive(o, "windows");
        r->n = cJSON_IsArray(ws) ? cJSON_GetArraySize(ws) : 0;
        cJSON_Delete(o);
        if (r->n < 1 || r->n > MAX_WINDOWS) {
            fprintf(stderr, "model %d: profile HTTP %ld, coverage HTTP %ld with %d windows: %s\n", m,
                    code, cc, r->n, k->resp);
            return 1;
        }
        snprintf(body, sizeof body, "{\"model\":\"%s\",\"window\":0}", r->id);
        if ((code = call(k, &nodes[m], "/v1/claims", body)) != 201) {
            fprintf(stderr, "model %d: the first claim: HTTP %ld %s\n", m, code, k->resp);
            return 1;
        }
        nodes[m].window = 0;
    }
    return 0;
}

/* The operator's client accounts. 0 or 1 with the reason printed. */
static int add_clients(struct conn *k)
{
    char body[512], v[65];
    for (int c = 0; c < n_clients; c++) {
        struct client *cl = &clients[c];
        if (ring_client_key_new(cl->key)) {
            fprintf(stderr, "no randomness for a client key\n");
            return 1;
        }
        ring_client_id(cl->key, cl->id);
        ring_client_verifier(cl->key, cl->verifier);
        util_hex_encode(cl->verifier, 32, v);
        snprintf(body, sizeof body, "{\"client\":\"%s\",\"verifier\":\"%s\",\"credit\":%.0f,"
                 "\"name\":\"bench-%d\"}", cl->id, v, CLIENT_CREDIT, c);
        long code = call(k, &operator_node, "/v1/clients", body);
        if (code != 201) {
            fprintf(stderr, "adding client %d: HTTP %ld %s (is the --operator key among the "
                    "market's --operator-key keys?)\n", c, code, k->resp);
            return 1;
        }
    }
    return 0;
}

/* The ledger after the run: every settled session paid its layer-tokens, the credit paid is
 * what the clients were debited, each client's balance and spending add up to its opening
 * credit. 0 or 1 with the reason printed. */
static int check_ledger(struct conn *k, uint64_t want_lt)
{
    char path[160];
    double paid = 0, spent = 0;
    uint64_t lt = 0;
    for (int h = 0; h < n_holders; h++) {
        snprintf(path, sizeof path, "/v1/nodes/%s/balance", nodes[holders[h]].pub);
        long code = call(k, NULL, path, NULL);
        double l = jnum(k->resp, "layer_tokens"), c = jnum(k->resp, "credit");
        if (code != 200 || isnan(l) || isnan(c)) {
            fprintf(stderr, "FAILED: the balance of node %.16s...: HTTP %ld %s\n", nodes[holders[h]].pub,
                    code, k->resp);
            return 1;
        }
        lt += (uint64_t)l;
        paid += c;
    }
    for (int c = 0; c < n_clients; c++) {
        snprintf(path, sizeof path, "/v1/clients/%s", clients[c].id);
        long code = call(k, NULL, path, NULL);
        double b = jnum(k->resp, "balance"), s = jnum(k->resp, "spent");
        if (code != 200 || isnan(b) || isnan(s) || fabs(b + s - CLIENT_CREDIT) > 1e-6) {
            fprintf(stderr, "FAILED: client %d's account: HTTP %ld %s (opening credit %.0f)\n", c,
                    code, k->resp, CLIENT_CREDIT);
            return 1;
        }
        spent += s;
    }
    bool ok = lt == want_lt && fabs(paid - spent) <= 1e-9 * (paid > 1 ? paid : 1);
    printf("ledger: %" PRIu64 " layer-tokens paid (the sessions were worth %" PRIu64 "), credit paid "
           "%.9f, clients debited %.9f: %s\n", lt, want_lt, paid, spent, ok ? "ok" : "MISMATCH");
    if (!ok)
        fprintf(stderr, "FAILED: the ledger does not add up\n");
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    const char *cat_path = NULL, *op_dir = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *o = argv[i], *v = argv[i + 1];
        if (!strcmp(o, "--url")) url = v;
        else if (!strcmp(o, "--catalog")) cat_path = v;
        else if (!strcmp(o, "--operator")) op_dir = v;
        else if (!strcmp(o, "--nodes")) n_nodes = atoi(v);
        else if (!strcmp(o, "--models")) n_models = atoi(v);
        else if (!strcmp(o, "--clients")) n_clients = atoi(v);
        else if (!strcmp(o, "--threads")) n_threads = atoi(v);
        else if (!strcmp(o, "--seconds")) seconds = atof(v);
        else if (!strcmp(o, "--heartbeat-s")) heartbeat_s = atof(v);
        else if (!strcmp(o, "--session-s")) session_s = atof(v);
        else { fprintf(stderr, "tool-market-bench: unknown option %s\n", o); return 2; }
    }
    if (!url || !cat_path || !op_dir || n_models < 1 || n_nodes < n_models || n_clients < 1 ||
        n_threads < 1 || n_threads > 256 || !(seconds > 0) || !(heartbeat_s > 0) || !(session_s > 0)) {
        fprintf(stderr, "usage: tool-market-bench --url URL --catalog CAT.json --operator DIR "
                "[--nodes N >= models] [--models M] [--clients C] [--threads T <= 256] [--seconds S] "
                "[--heartbeat-s S] [--session-s S]\n");
        return 2;
    }
    char err[KV_ERR_MAX], *cat;
    size_t clen;
    if (util_file_read(cat_path, 64u << 20, &cat, &clen, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    struct net_identity *op;
    if (net_identity_load(&op, op_dir, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    operator_node.id = op;
    util_hex_encode(net_identity_pub(op), 32, operator_node.pub);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    nodes = calloc((size_t)n_nodes, sizeof *nodes);
    rings = calloc((size_t)n_models, sizeof *rings);
    clients = calloc((size_t)n_clients, sizeof *clients);
    holders = calloc((size_t)n_nodes, sizeof *holders);
    struct worker *ws = calloc((size_t)n_threads, sizeof *ws);
    struct conn k = {0};
    if (!nodes || !rings || !clients || !holders || !ws || conn_init(&k)) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    for (int i = 0; i < n_threads; i++) {
        ws[i].id = i;
        ws[i].seed = (unsigned)(i * 7919 + 1);
        if (conn_init(&ws[i].conn)) {
            fprintf(stderr, "out of memory\n");
            return 1;
        }
    }
    double t0 = util_now_s();
    for (int i = 0; i < n_nodes; i++) {
        uint8_t raw[32], pub[32];
        size_t pl = 32;
        RAND_bytes(raw, sizeof raw);
        nodes[i].key = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, raw, 32);
        if (!nodes[i].key || EVP_PKEY_get_raw_public_key(nodes[i].key, pub, &pl) != 1) {
            fprintf(stderr, "making node key %d failed\n", i);
            return 1;
        }
        util_hex_encode(pub, 32, nodes[i].pub);
        nodes[i].model = i % n_models;
        nodes[i].window = -1;
    }
    if (register_models(&k, cat, clen) || plan_models(&k) || add_clients(&k))
        return 1;
    int wmin = MAX_WINDOWS, wmax = 0;
    for (int m = 0; m < n_models; m++) {
        wmin = rings[m].n < wmin ? rings[m].n : wmin;
        wmax = rings[m].n > wmax ? rings[m].n : wmax;
    }
    printf("set-up: %d node keys, %d models registered (%d to %d windows each; the first node of "
           "each claimed window 0), %d clients added by the operator, in %.1f s\n", n_nodes, n_models,
           wmin, wmax, n_clients, util_now_s() - t0);

    double t_claims = phase(ws, phase_claims);
    if (any_unexpected(ws, "the claims"))
        return 1;
    for (int m = 0; m < n_models; m++)
        for (int w = 0; w < rings[m].n; w++)
            rings[m].holder[w] = -1;
    for (int i = 0; i < n_nodes; i++)
        if (nodes[i].window >= 0) {
            rings[nodes[i].model].holder[nodes[i].window] = i;
            holders[n_holders++] = i;
        }
    for (int m = 0; m < n_models; m++)
        for (int w = 0; w < rings[m].n; w++)
            if (rings[m].holder[w] < 0) {
                fprintf(stderr, "FAILED: window %d of model %d has no holder after the claims\n", w, m);
                return 1;
            }
    double t_act = phase(ws, phase_activate);
    t_act += phase(ws, phase_manifests);
    if (any_unexpected(ws, "the activation"))
        return 1;
    printf("claims: %d nodes profiled and claimed in %.1f s, %d won a window; %d leases activated "
           "and %d manifests fetched in %.1f s\n", n_nodes - n_models, t_claims, n_holders - n_models,
           n_holders, n_models, t_act);

    /* the natural rates: a heartbeat every heartbeat_s s from each node, a session every
     * session_s s per ring (1 open side and 2 sides per rank) */
    double nat_hb = n_nodes / heartbeat_s, nat_sess = n_models / session_s, nat_rc = 0;
    for (int m = 0; m < n_models; m++)
        nat_rc += (1 + 2.0 * rings[m].n) / session_s;
    hb_per_session = nat_hb / nat_sess;
    double t_run = phase(ws, phase_steady);
    report(ws, K_PROFILE, t_claims, "requests");
    report(ws, K_CLAIM, t_claims, "requests");
    report(ws, K_ACTIVATE, t_act, "requests");
    report(ws, K_HEARTBEAT, t_run, "requests");
    report(ws, K_RECEIPT, t_run, "requests");
    report(ws, K_SESSION, t_run, "settled");
    uint64_t sessions = 0, settled = 0, hb = 0, lt = 0;
    for (int i = 0; i < n_threads; i++) {
        sessions += ws[i].sessions;
        settled += ws[i].settled;
        hb += ws[i].heartbeats;
        lt += ws[i].layer_tokens;
    }
    printf("natural rates of %d nodes on %d rings: %.0f heartbeats/s, %.0f sessions/s (%.0f receipts/s); "
           "the mix ran at %.1fx them (%.1f heartbeats/s, %.1f sessions/s)\n", n_nodes, n_models,
           nat_hb, nat_sess, nat_rc, hb / t_run / nat_hb, hb / t_run, settled / t_run);
    int bad = any_unexpected(ws, "the steady state");
    if (settled != sessions) {
        fprintf(stderr, "FAILED: %" PRIu64 " of %" PRIu64 " sessions were not settled\n",
                sessions - settled, sessions);
        bad = 1;
    }
    if (check_ledger(&k, lt))
        bad = 1;
    if (!bad)
        printf("settled: all %" PRIu64 " sessions\n", sessions);
    for (int i = 0; i < n_threads; i++) {
        conn_free(&ws[i].conn);
        for (int j = 0; j < K_N; j++)
            free(ws[i].lat[j].v);
    }
    conn_free(&k);
    for (int i = 0; i < n_nodes; i++)
        EVP_PKEY_free(nodes[i].key);
    net_identity_free(op);
    free(ws);
    free(holders);
    free(clients);
    free(rings);
    free(nodes);
    free(cat);
    curl_global_cleanup();
    return bad;
}

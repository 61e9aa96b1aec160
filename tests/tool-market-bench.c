/* tool-market-bench — a simulated population against a running market (make bench, section
 * "market"): NODES nodes with their own Ed25519 keys spread over MODELS models (registered
 * from one catalog whose source_sha256 is varied, so each is a distinct model id) send their
 * profile and a claim, then heartbeats and receipts in the proportion of their natural rates
 * (a heartbeat every lease_s / 4 = 5 s per node; one receipt per session step, here one
 * every 10 s per node) from THREADS client threads over keep-alive connections.
 *   tool-market-bench --url URL --catalog CAT.json [--nodes 10000] [--models 100]
 *                     [--threads 8] [--seconds 10]
 * Prints requests/s and p50/p99 latency per kind. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include "ringlib/ring.h"
#include "util/err.h"
#include "util/util.h"

struct node {
    EVP_PKEY *key;
    char pub[65];
    int model;
    int window;     /* claimed window, -1 none */
};

enum { K_PROFILE, K_CLAIM, K_HEARTBEAT, K_RECEIPT, K_N };
static const char *kind_names[K_N] = {"profile", "claim", "heartbeat", "receipt"};

struct lat {
    double *v;
    size_t n, cap;
    uint64_t codes[6];   /* 0: none, 1xx..5xx */
};

static struct node *nodes;
static int n_nodes = 10000, n_models = 100, n_threads = 8;
static double seconds = 10;
static const char *url;
static char (*model_ids)[65];
static int *holders, n_holders;   /* nodes whose claim won (all nodes when none did) */

static size_t sink(char *p, size_t s, size_t n, void *ud) { (void)p; (void)ud; return s * n; }

static void lat_add(struct lat *l, double ms, long code)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 4096;
        l->v = realloc(l->v, l->cap * sizeof *l->v);
    }
    l->v[l->n++] = ms;
    l->codes[code >= 100 && code < 600 ? code / 100 : 0]++;
}

/* One signed call: its HTTP status (0 on a transport failure). */
static long call(CURL *c, const struct node *nd, const char *method, const char *path,
                 const char *body)
{
    char nonce[33], canon[RING_MARKET_CANON_MAX], sighex[129], h[4][200], full[512];
    uint8_t r[16], sig[64];
    size_t sl = sizeof sig;
    RAND_bytes(r, sizeof r);
    util_hex_encode(r, sizeof r, nonce);
    int64_t ts = (int64_t)time(NULL);
    int n = ring_market_canon(canon, method, path, body, strlen(body), ts, nonce);
    EVP_MD_CTX *mc = EVP_MD_CTX_new();
    EVP_DigestSignInit(mc, NULL, NULL, NULL, nd->key);
    EVP_DigestSign(mc, sig, &sl, (const unsigned char *)canon, (size_t)n);
    EVP_MD_CTX_free(mc);
    util_hex_encode(sig, 64, sighex);
    snprintf(h[0], sizeof h[0], "X-Kv-Node: %s", nd->pub);
    snprintf(h[1], sizeof h[1], "X-Kv-Time: %" PRId64, ts);
    snprintf(h[2], sizeof h[2], "X-Kv-Nonce: %s", nonce);
    snprintf(h[3], sizeof h[3], "X-Kv-Signature: %s", sighex);
    struct curl_slist *hd = curl_slist_append(NULL, "Content-Type: application/json");
    hd = curl_slist_append(hd, "Expect:");
    for (int i = 0; i < 4; i++)
        hd = curl_slist_append(hd, h[i]);
    snprintf(full, sizeof full, "%s%s", url, path);
    curl_easy_setopt(c, CURLOPT_URL, full);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hd);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sink);
    long code = 0;
    if (curl_easy_perform(c) == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    curl_slist_free_all(hd);
    return code;
}

struct worker {
    int id;
    struct lat lat[K_N];
    pthread_barrier_t *bar;
};

static void timed(CURL *c, struct worker *w, int kind, const struct node *nd, const char *path,
                  const char *body)
{
    double t0 = util_now_ms();
    long code = call(c, nd, "POST", path, body);
    lat_add(&w->lat[kind], util_now_ms() - t0, code);
}

static void *work(void *ud)
{
    struct worker *w = ud;
    CURL *c = curl_easy_init();
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
    char body[512];
    /* set-up: this thread's share of the nodes sends a profile and claims a window */
    for (int i = w->id; i < n_nodes; i += n_threads) {
        struct node *nd = &nodes[i];
        snprintf(body, sizeof body, "{\"model\":\"%s\",\"mem_bytes\":1800000}", model_ids[nd->model]);
        timed(c, w, K_PROFILE, nd, "/v1/nodes", body);
        snprintf(body, sizeof body, "{\"model\":\"%s\",\"window\":%d}", model_ids[nd->model],
                 (i / n_models) % 3);
        double t0 = util_now_ms();
        long code = call(c, nd, "POST", "/v1/claims", body);
        lat_add(&w->lat[K_CLAIM], util_now_ms() - t0, code);
        nd->window = code == 200 || code == 201 ? (i / n_models) % 3 : -1;
    }
    pthread_barrier_wait(w->bar);   /* set-up done */
    pthread_barrier_wait(w->bar);   /* holders listed */
    /* steady state: two heartbeats per receipt, from random nodes that hold a window */
    double end = util_now_s() + seconds;
    uint64_t seq = 0;
    while (util_now_s() < end) {
        struct node *nd = &nodes[holders[(uint32_t)rand_r(&(unsigned){(unsigned)(seq * 7919 + w->id)}) % n_holders]];
        seq++;
        int win = nd->window >= 0 ? nd->window : 0;
        if (seq % 3) {
            snprintf(body, sizeof body, "{\"model\":\"%s\",\"window\":%d}", model_ids[nd->model], win);
            timed(c, w, K_HEARTBEAT, nd, "/v1/leases/heartbeat", body);
        } else {
            snprintf(body, sizeof body, "{\"model\":\"%s\",\"session\":\"%08x%08x%016" PRIx64 "\",\"rank\":%d,"
                     "\"tokens\":[0,16],\"digest\":\"%064x\",\"side\":\"sent\"}", model_ids[nd->model],
                     (unsigned)w->id, (unsigned)(seq >> 32), seq, win, 7);
            timed(c, w, K_RECEIPT, nd, "/v1/receipts", body);
        }
    }
    curl_easy_cleanup(c);
    return NULL;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    const char *cat_path = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--url")) url = argv[i + 1];
        else if (!strcmp(argv[i], "--catalog")) cat_path = argv[i + 1];
        else if (!strcmp(argv[i], "--nodes")) n_nodes = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--models")) n_models = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) n_threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seconds")) seconds = atof(argv[i + 1]);
    }
    if (!url || !cat_path || n_nodes < 1 || n_models < 1 || n_threads < 1 || n_threads > 256) {
        fprintf(stderr, "usage: tool-market-bench --url URL --catalog CAT.json [--nodes N] "
                "[--models M] [--threads T] [--seconds S]\n");
        return 2;
    }
    char err[KV_ERR_MAX], *cat;
    size_t clen;
    if (util_file_read(cat_path, 64u << 20, &cat, &clen, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    char *src = strstr(cat, "\"source_sha256\":");
    if (src)
        src = strchr(src + strlen("\"source_sha256\":"), '"');
    if (!src) {
        fprintf(stderr, "%s: no source_sha256\n", cat_path);
        return 1;
    }
    src++;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    nodes = calloc((size_t)n_nodes, sizeof *nodes);
    model_ids = calloc((size_t)n_models, sizeof *model_ids);
    double t0 = util_now_s();
    for (int i = 0; i < n_nodes; i++) {
        uint8_t raw[32], pub[32];
        size_t pl = 32;
        RAND_bytes(raw, sizeof raw);
        nodes[i].key = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, raw, 32);
        EVP_PKEY_get_raw_public_key(nodes[i].key, pub, &pl);
        util_hex_encode(pub, 32, nodes[i].pub);
        nodes[i].model = i % n_models;
    }
    /* the models: one catalog, a different source digest each (a distinct id each) */
    CURL *c = curl_easy_init();
    for (int m = 0; m < n_models; m++) {
        char hex[9];
        snprintf(hex, sizeof hex, "%08x", (unsigned)m);
        memcpy(src, hex, 8);
        size_t bl = clen * 2 + 256;
        char *body = malloc(bl), *q = body;
        q += sprintf(q, "{\"name\":\"bench-%d\",\"sources\":[\"http://127.0.0.1:1\"],\"catalog\":\"", m);
        for (size_t k = 0; k < clen; k++) {
            if (cat[k] == '"' || cat[k] == '\\')
                *q++ = '\\';
            if (cat[k] == '\n' || cat[k] == '\t') {
                *q++ = '\\';
                *q++ = cat[k] == '\n' ? 'n' : 't';
                continue;
            }
            *q++ = cat[k];
        }
        strcpy(q, "\"}");
        unsigned char dg[32];
        unsigned dl = 32;
        EVP_Digest(cat, clen, dg, &dl, EVP_sha256(), NULL);
        util_hex_encode(dg, 32, model_ids[m]);
        long code = call(c, &nodes[0], "POST", "/v1/models", body);
        free(body);
        if (code != 201) {
            fprintf(stderr, "registering model %d: HTTP %ld\n", m, code);
            return 1;
        }
    }
    curl_easy_cleanup(c);
    printf("set-up: %d keys, %d models registered in %.1f s\n", n_nodes, n_models, util_now_s() - t0);
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)n_threads + 1);
    struct worker *ws = calloc((size_t)n_threads, sizeof *ws);
    pthread_t *th = calloc((size_t)n_threads, sizeof *th);
    t0 = util_now_s();
    for (int i = 0; i < n_threads; i++) {
        ws[i].id = i;
        ws[i].bar = &bar;
        pthread_create(&th[i], NULL, work, &ws[i]);
    }
    pthread_barrier_wait(&bar);
    double t_setup = util_now_s() - t0;
    holders = calloc((size_t)n_nodes, sizeof *holders);
    for (int i = 0; i < n_nodes; i++)
        if (nodes[i].window >= 0)
            holders[n_holders++] = i;
    if (!n_holders)
        for (int i = 0; i < n_nodes; i++)
            holders[n_holders++] = i;
    pthread_barrier_wait(&bar);
    t0 = util_now_s();
    for (int i = 0; i < n_threads; i++)
        pthread_join(th[i], NULL);
    double t_run = util_now_s() - t0;
    for (int k = 0; k < K_N; k++) {
        struct lat all = {0};
        for (int i = 0; i < n_threads; i++) {
            for (size_t j = 0; j < ws[i].lat[k].n; j++)
                lat_add(&all, ws[i].lat[k].v[j], 0);
            for (int s = 0; s < 6; s++)
                all.codes[s] += ws[i].lat[k].codes[s];
        }
        all.codes[0] -= all.n;   /* lat_add above counted them as "no status" */
        if (!all.n)
            continue;
        qsort(all.v, all.n, sizeof *all.v, cmp_d);
        double span = k <= K_CLAIM ? t_setup : t_run;
        printf("%-10s %8zu requests  %8.0f req/s  p50 %6.2f ms  p99 %6.2f ms  (2xx %" PRIu64
               ", 4xx %" PRIu64 ", 5xx %" PRIu64 ", failed %" PRIu64 ")\n", kind_names[k], all.n,
               all.n / span, all.v[all.n / 2], all.v[(size_t)(all.n * 0.99)], all.codes[2],
               all.codes[4], all.codes[5], all.codes[0]);
        free(all.v);
    }
    printf("simulated population: %d nodes, %d models; natural rates: %.0f heartbeats/s, %.0f receipts/s\n",
           n_nodes, n_models, n_nodes / 5.0, n_nodes / 10.0);
    return 0;
}

/* market.c — `kvctl market add|status|balance`: register a model with a market, read its
 * coverage map, read a node's balance (docs/market.md; the API's client is ringlib's). */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include <openssl/rand.h>

#include "kvctl/kvctl.h"
#include "model/model.h"
#include "net/net.h"
#include "ringlib/ring.h"
#include "util/err.h"
#include "util/util.h"

#define CALL_MS 30000

static void market_usage(FILE *f)
{
    fprintf(f,
        "usage: kvctl market add URL --catalog CAT.json --source URL... [--name NAME] [--state-dir DIR]\n"
        "                        [--model GGUF]\n"
        "       kvctl market status URL [--model ID] [--json]\n"
        "       kvctl market balance URL NODE [--json]\n"
        "       (each also takes --ca PEM)\n"
        "  add      register a model (its id is the catalog's SHA-256) with its sources (seeders\n"
        "           or GGUF URLs); signed with the node key in --state-dir (default .); --model:\n"
        "           the whole model, to compute the known-answer probes stages must answer\n"
        "  status   the coverage map: windows, stages, demand, reward, rings (--json: as data)\n"
        "  balance  a node's credited work (layer-tokens) and credit; NODE is its public key\n"
        "  --ca PEM  an https:// market's certificate must chain to this CA (default: the\n"
        "           system's store)\n");
}

/* GET/POST and parse: the JSON answer (caller deletes), or NULL after a message. */
static cJSON *call(const char *url, const char *method, const char *path, const char *body,
                   const struct net_identity *id, long *status)
{
    char err[KV_ERR_MAX], *resp = NULL;
    if (ring_market_call(url, method, path, body, id, CALL_MS, status, &resp, err, sizeof err) < 0) {
        fprintf(stderr, "kvctl market: %s\n", err);
        return NULL;
    }
    cJSON *o = cJSON_Parse(resp);
    if (*status >= 400 || !o) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, "error");
        fprintf(stderr, "kvctl market: %s %s: HTTP %ld: %s\n", method, path, *status,
                cJSON_IsString(e) ? e->valuestring : resp);
        cJSON_Delete(o);
        o = NULL;
    }
    free(resp);
    return o;
}

/* Known-answer probes (docs/market.md, "Probes"): a few short random token sequences run
 * through the whole model one layer at a time (so only one layer is mapped at once), keeping
 * each sequence's boundary after every layer but the last (f16, base64) and the greedy token
 * at each position, with whether its lead over the runner-up is clear enough to compare
 * (PROBE_MARGIN logits). As many sequences of PROBE_TOKENS tokens (fewer when one does not
 * fit) as RING_PROBE_BYTES_MAX holds, at most PROBE_SEQS. The probe set (caller deletes), or
 * NULL with err filled. */
#define PROBE_TOKENS 4
#define PROBE_SEQS 4
#define PROBE_MARGIN 0.05f
static cJSON *probes_make(const char *path, char *err, size_t errlen)
{
    struct model *m = NULL;
    struct model_exec *e = NULL;
    cJSON *out = NULL;
    float *h = NULL, *logits = NULL;
    int32_t *toks = NULL;
    if (model_open(&m, path, 0, 1, err, errlen) < 0)
        return NULL;
    const struct model_hparams *hp = model_get_hparams(m);
    uint32_t L = hp->n_layer, E = hp->n_embd, V = hp->n_vocab;
    model_free(m);
    m = NULL;
    uint64_t row = (uint64_t)(L > 1 ? L - 1 : 0) * E * 2;   /* f16 bytes of one position */
    uint32_t T = PROBE_TOKENS, S = PROBE_SEQS;
    while (T > 1 && (uint64_t)T * row > RING_PROBE_BYTES_MAX)
        T--;
    while (S > 1 && (uint64_t)S * T * row > RING_PROBE_BYTES_MAX)
        S--;
    if ((uint64_t)S * T * row > RING_PROBE_BYTES_MAX) {
        snprintf(err, errlen, "one position's boundaries (%llu bytes as f16) exceed the probe "
                 "budget (%u bytes)", (unsigned long long)row, RING_PROBE_BYTES_MAX);
        return NULL;
    }
    uint32_t n = S * T;
    h = malloc((size_t)n * E * sizeof *h);
    logits = malloc((size_t)T * V * sizeof *logits);
    toks = malloc((size_t)n * sizeof *toks);
    if (!h || !logits || !toks || RAND_bytes((unsigned char *)toks, (int)(n * sizeof *toks)) != 1) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    for (uint32_t i = 0; i < n; i++)
        toks[i] = (int32_t)((uint32_t)toks[i] % V);
    out = cJSON_CreateObject();
    cJSON *seqs = cJSON_AddArrayToObject(out, "seqs");
    cJSON_AddNumberToObject(out, "n_layers", L);
    cJSON_AddNumberToObject(out, "n_embd", E);
    for (uint32_t s = 0; s < S; s++) {
        cJSON *q = cJSON_CreateObject();
        cJSON *t = cJSON_AddArrayToObject(q, "tokens");
        for (uint32_t i = 0; i < T; i++)
            cJSON_AddItemToArray(t, cJSON_CreateNumber(toks[s * T + i]));
        cJSON_AddArrayToObject(q, "bounds");
        cJSON_AddItemToArray(seqs, q);
    }
    for (uint32_t l = 0; l < L; l++) {
        int rc = model_open(&m, path, (int)l, (int)l + 1, err, errlen);
        if (rc == 0 && (rc = model_exec_new(&e, m, 0, T, T)) < 0)
            snprintf(err, errlen, "layer %u: executor: %s", l, strerror(-rc));
        for (uint32_t s = 0; rc == 0 && s < S; s++) {
            float *x = h + (size_t)s * T * E;
            if (l == 0 && (rc = model_embed(e, toks + s * T, T, x)) < 0)
                break;
            if ((rc = model_session_new(e, s)) < 0 || (rc = model_window_run(e, s, 0, T, x)) < 0)
                break;
            cJSON *q = cJSON_GetArrayItem(seqs, (int)s);
            if (l + 1 < L) {
                char *b = ring_probe_rows_encode(x, (size_t)T * E);
                if (!b) {
                    rc = -ENOMEM;
                    break;
                }
                cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(q, "bounds"), cJSON_CreateString(b));
                free(b);
                continue;
            }
            if ((rc = model_head(e, x, T, logits)) < 0)
                break;
            cJSON *g = cJSON_AddArrayToObject(q, "greedy"), *c = cJSON_AddArrayToObject(q, "clear");
            for (uint32_t i = 0; i < T; i++) {
                const float *lg = logits + (size_t)i * V;
                uint32_t best = 0;
                float second = -INFINITY;
                for (uint32_t v = 1; v < V; v++)
                    if (lg[v] > lg[best]) {
                        second = lg[best];
                        best = v;
                    } else if (lg[v] > second) {
                        second = lg[v];
                    }
                cJSON_AddItemToArray(g, cJSON_CreateNumber(best));
                cJSON_AddItemToArray(c, cJSON_CreateBool(lg[best] - second >= PROBE_MARGIN));
            }
        }
        if (rc < 0 && !err[0])
            snprintf(err, errlen, "layer %u: %s", l, strerror(-rc));
        model_exec_free(e);
        model_free(m);
        e = NULL;
        m = NULL;
        if (rc < 0)
            goto fail;
    }
    free(h);
    free(logits);
    free(toks);
    return out;
fail:
    cJSON_Delete(out);
    free(h);
    free(logits);
    free(toks);
    return NULL;
}

static int market_add(int argc, char **argv)
{
    const char *cat = NULL, *name = NULL, *dir = ".", *model = NULL;
    const char *src[16];
    int n_src = 0;
    static const struct option lo[] = {
        {"catalog", required_argument, 0, 'c'}, {"source", required_argument, 0, 's'},
        {"name", required_argument, 0, 'n'}, {"state-dir", required_argument, 0, 'd'},
        {"ca", required_argument, 0, 'C'}, {"model", required_argument, 0, 'm'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'c': cat = optarg; break;
        case 'm': model = optarg; break;
        case 'n': name = optarg; break;
        case 'd': dir = optarg; break;
        case 's':
            if (n_src == 16) {
                fprintf(stderr, "kvctl market add: at most 16 --source\n");
                return 2;
            }
            src[n_src++] = optarg;
            break;
        case 'C': ring_market_set_ca(optarg); break;
        case 'h': market_usage(stdout); return 0;
        default: market_usage(stderr); return 2;
        }
    }
    if (optind + 1 != argc || !cat || !n_src) {
        fprintf(stderr, "kvctl market add: URL, --catalog and at least one --source are required\n");
        return 2;
    }
    const char *url = argv[optind];
    char err[KV_ERR_MAX], *text;
    size_t len;
    if (util_file_read(cat, 256u << 20, &text, &len, err, sizeof err) < 0) {
        fprintf(stderr, "kvctl market add: --catalog %s\n", err);
        return 1;
    }
    struct net_identity *id;
    if (net_identity_load(&id, dir, err, sizeof err) < 0) {
        fprintf(stderr, "kvctl market add: %s\n", err);
        free(text);
        return 1;
    }
    cJSON *probes = NULL;
    if (model && !(probes = probes_make(model, err, sizeof err))) {
        fprintf(stderr, "kvctl market add: --model %s: probes: %s\n", model, err);
        free(text);
        net_identity_free(id);
        return 1;
    }
    cJSON *b = cJSON_CreateObject(), *s = cJSON_CreateArray();
    cJSON_AddStringToObject(b, "catalog", text);
    if (probes)
        cJSON_AddItemToObject(b, "probes", probes);
    if (name)
        cJSON_AddStringToObject(b, "name", name);
    for (int i = 0; i < n_src; i++)
        cJSON_AddItemToArray(s, cJSON_CreateString(src[i]));
    cJSON_AddItemToObject(b, "sources", s);
    char *body = cJSON_PrintUnformatted(b);
    cJSON_Delete(b);
    free(text);
    long status;
    cJSON *o = body ? call(url, "POST", "/v1/models", body, id, &status) : NULL;
    free(body);
    net_identity_free(id);
    if (!o)
        return 1;
    const cJSON *mid = cJSON_GetObjectItemCaseSensitive(o, "id");
    printf("%s\n", cJSON_IsString(mid) ? mid->valuestring : "?");
    cJSON_Delete(o);
    return 0;
}

static void status_table(const cJSON *cov)
{
    const cJSON *w, *ws = cJSON_GetObjectItemCaseSensitive(cov, "windows");
    const cJSON *rings = cJSON_GetObjectItemCaseSensitive(cov, "rings");
    printf("model %s  %s  %d layers  demand %.2f requests/min  rings %d\n",
           cJSON_GetObjectItemCaseSensitive(cov, "model")->valuestring,
           cJSON_GetObjectItemCaseSensitive(cov, "name")->valuestring,
           (int)util_json_number(cov, "n_layers", 0), util_json_number(cov, "demand_rpm", 0),
           cJSON_GetArraySize(rings));
    printf("  %-6s %-9s %-10s %-10s %-18s %-28s %s\n", "window", "layers", "state", "mem", "stage",
           "endpoint", "reward/layer-token");
    cJSON_ArrayForEach(w, ws) {
        const cJSON *ly = cJSON_GetObjectItemCaseSensitive(w, "layers");
        const cJSON *st = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(w, "stages"), 0);
        const cJSON *node = cJSON_GetObjectItemCaseSensitive(st, "node");
        const cJSON *ep = cJSON_GetObjectItemCaseSensitive(st, "endpoint");
        char range[32], mem[32], nd[20] = "-";
        snprintf(range, sizeof range, "%d-%d", (int)cJSON_GetArrayItem(ly, 0)->valuedouble,
                 (int)cJSON_GetArrayItem(ly, 1)->valuedouble);
        util_fmt_bytes(mem, sizeof mem, util_json_number(w, "mem_bytes", 0), 1, 0);
        if (cJSON_IsString(node))
            snprintf(nd, sizeof nd, "%.16s", node->valuestring);
        printf("  %-6d %-9s %-10s %-10s %-18s %-28s %.6g\n", (int)util_json_number(w, "window", 0),
               range, cJSON_GetObjectItemCaseSensitive(w, "state")->valuestring, mem, nd,
               cJSON_IsString(ep) ? ep->valuestring : "-", util_json_number(w, "reward", 0));
    }
}

static int market_status(int argc, char **argv)
{
    const char *model = NULL;
    bool json = false;
    static const struct option lo[] = {
        {"model", required_argument, 0, 'm'}, {"json", no_argument, 0, 'j'},
        {"ca", required_argument, 0, 'C'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'j': json = true; break;
        case 'C': ring_market_set_ca(optarg); break;
        case 'h': market_usage(stdout); return 0;
        default: market_usage(stderr); return 2;
        }
    }
    if (optind + 1 != argc) {
        fprintf(stderr, "kvctl market status: the market's URL is required\n");
        return 2;
    }
    const char *url = argv[optind];
    long status;
    cJSON *list = NULL, *out = cJSON_CreateArray();
    if (!model) {
        if (!(list = call(url, "GET", "/v1/models", NULL, NULL, &status))) {
            cJSON_Delete(out);
            return 1;
        }
    }
    const cJSON *m, *models = list ? cJSON_GetObjectItemCaseSensitive(list, "models") : NULL;
    int rc = 0, i = 0;
    for (;;) {
        const char *id = model;
        if (!model) {
            m = cJSON_GetArrayItem(models, i++);
            if (!m)
                break;
            id = cJSON_GetObjectItemCaseSensitive(m, "id")->valuestring;
        }
        char path[128];
        snprintf(path, sizeof path, "/v1/models/%.64s/coverage", id);
        cJSON *cov = call(url, "GET", path, NULL, NULL, &status);
        if (!cov) {
            rc = 1;
        } else if (json) {
            cJSON_AddItemToArray(out, cov);
        } else {
            status_table(cov);
            cJSON_Delete(cov);
        }
        if (model)
            break;
    }
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToObject(o, "models", out);
        char *s = cJSON_Print(o);
        printf("%s\n", s ? s : "{}");
        free(s);
        cJSON_Delete(o);
    } else {
        if (!model && !cJSON_GetArraySize(models))
            printf("no models registered\n");
        cJSON_Delete(out);
    }
    cJSON_Delete(list);
    return rc;
}

static int market_balance(int argc, char **argv)
{
    bool json = false;
    static const struct option lo[] = {
        {"json", no_argument, 0, 'j'}, {"ca", required_argument, 0, 'C'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'j': json = true; break;
        case 'C': ring_market_set_ca(optarg); break;
        case 'h': market_usage(stdout); return 0;
        default: market_usage(stderr); return 2;
        }
    }
    if (optind + 2 != argc) {
        fprintf(stderr, "kvctl market balance: URL and NODE (a public key, 64 hex) are required\n");
        return 2;
    }
    char path[160];
    snprintf(path, sizeof path, "/v1/nodes/%.64s/balance", argv[optind + 1]);
    long status;
    cJSON *o = call(argv[optind], "GET", path, NULL, NULL, &status);
    if (!o)
        return 1;
    if (json) {
        char *s = cJSON_Print(o);
        printf("%s\n", s ? s : "{}");
        free(s);
    } else {
        printf("node %s\nlayer_tokens %.0f\ncredit %.6f\n", argv[optind + 1],
               util_json_number(o, "layer_tokens", 0), util_json_number(o, "credit", 0));
    }
    cJSON_Delete(o);
    return 0;
}

int kvctl_cmd_market(int argc, char **argv)
{
    if (argc < 2 || util_is_help(argv[1])) {
        market_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "add"))
        return market_add(argc - 1, argv + 1);
    if (!strcmp(argv[1], "status"))
        return market_status(argc - 1, argv + 1);
    if (!strcmp(argv[1], "balance"))
        return market_balance(argc - 1, argv + 1);
    fprintf(stderr, "kvctl market: unknown subcommand '%s' (add, status, balance)\n", argv[1]);
    return 2;
}

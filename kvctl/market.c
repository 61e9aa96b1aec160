/* market.c — `kvctl market add|remove|status|balance|client`: register or remove a model at a
 * market, read its coverage map, read a node's balance, keep paying clients' accounts
 * (docs/market.md; the API's client is ring's). */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include <openssl/rand.h>

#include "kvctl/kvctl.h"
#include "model/model.h"
#include "net/net.h"
#include "ring/ring.h"
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
        "       kvctl market remove URL ID [--state-dir DIR]\n"
        "       kvctl market client add URL --credit N [--name NAME] [--state-dir DIR]\n"
        "       kvctl market client credit URL CLIENT --credit N [--state-dir DIR]\n"
        "       kvctl market client show URL CLIENT [--json]\n"
        "       (each also takes --ca PEM)\n"
        "  add      register a model (its id is the catalog's SHA-256) with its sources (seeders\n"
        "           or GGUF URLs); signed with the node key in --state-dir (default .); --model:\n"
        "           the whole model, to compute the known-answer probes stages must answer\n"
        "  status   the coverage map: windows, stages, demand, reward, rings (--json: as data)\n"
        "  balance  a node's credited work (layer-tokens) and credit; NODE is its public key\n"
        "  remove   remove a model (signed by its owner or a market operator)\n"
        "  client add     make a paying client's key and open its account with N credit (signed\n"
        "           by a market operator, kvd market --operator-key); prints the key, which the\n"
        "           client sends as Authorization: Bearer KEY to a ring's API (kept nowhere else:\n"
        "           the market holds only its id and verifier)\n"
        "  client credit  add N to a client's balance (an operator); CLIENT: its key or its id\n"
        "  client show    a client's balance and what it spent\n"
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

/* o[k] when it is a string, else "?" (the market's answer, printed as it came). */
static const char *str_or_q(const cJSON *o, const char *k)
{
    const char *v = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, k));
    return v ? v : "?";
}

static void status_table(const cJSON *cov)
{
    const cJSON *w, *r, *ws = cJSON_GetObjectItemCaseSensitive(cov, "windows");
    const cJSON *rings = cJSON_GetObjectItemCaseSensitive(cov, "rings");
    const cJSON *unlinked = cJSON_GetObjectItemCaseSensitive(cov, "unlinked");
    printf("model %s  %s  %d layers  demand %.2f requests/min  rings %d\n",
           cJSON_GetObjectItemCaseSensitive(cov, "model")->valuestring,
           cJSON_GetObjectItemCaseSensitive(cov, "name")->valuestring,
           (int)util_json_number(cov, "n_layers", 0), util_json_number(cov, "demand_rpm", 0),
           cJSON_GetArraySize(rings));
    printf("  %-6s %-9s %-10s %-10s %-18s %-28s %-20s %s\n", "window", "layers", "state", "mem",
           "stage", "endpoint", "links", "reward/layer-token");
    cJSON_ArrayForEach(w, ws) {
        const cJSON *ly = cJSON_GetObjectItemCaseSensitive(w, "layers");
        const cJSON *st = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(w, "stages"), 0);
        const cJSON *node = cJSON_GetObjectItemCaseSensitive(st, "node");
        const cJSON *ep = cJSON_GetObjectItemCaseSensitive(st, "endpoint");
        const cJSON *sst = cJSON_GetObjectItemCaseSensitive(st, "state");
        const cJSON *rep = cJSON_GetObjectItemCaseSensitive(st, "ring");
        const cJSON *lk = cJSON_GetObjectItemCaseSensitive(rep, "links");
        const char *state = cJSON_GetObjectItemCaseSensitive(w, "state")->valuestring;
        char range[32], mem[32], nd[20] = "-", links[40] = "-";
        snprintf(range, sizeof range, "[%d, %d)", (int)cJSON_GetArrayItem(ly, 0)->valuedouble,
                 (int)cJSON_GetArrayItem(ly, 1)->valuedouble);
        util_fmt_bytes(mem, sizeof mem, util_json_number(w, "mem_bytes", 0), 1, 0);
        if (cJSON_IsString(node))
            snprintf(nd, sizeof nd, "%.16s", node->valuestring);
        /* a window in its grace period is kept for the stage shown, its holder */
        if (cJSON_IsString(sst) && !strcmp(sst->valuestring, "grace"))
            state = "grace";
        if (lk) {
            double age = util_json_number(rep, "last_token_age_s", -1);
            int k = snprintf(links, sizeof links, "%s",
                             cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(lk, "linked")) ? "up" : "down");
            if (age >= 0)
                snprintf(links + k, sizeof links - (size_t)k, ", token %.0fs ago", age);
        }
        printf("  %-6d %-9s %-10s %-10s %-18s %-28s %-20s %.6g\n", (int)util_json_number(w, "window", 0),
               range, state, mem, nd, cJSON_IsString(ep) ? ep->valuestring : "-", links,
               util_json_number(w, "reward", 0));
        const cJSON *took = cJSON_GetObjectItemCaseSensitive(st, "took_over"), *sb;
        if (took)   /* a standby took the rank over: the manifest still names the node before */
            printf("  %-6s %-9s took over from %.16s (the manifest's node for this rank)\n", "", "",
                   str_or_q(took, "from"));
        const cJSON *aud = cJSON_GetObjectItemCaseSensitive(st, "audits");
        if (aud) {   /* its node's audits: each verdict's count, the last one */
            const cJSON *c, *al = cJSON_GetObjectItemCaseSensitive(aud, "last");
            char line[256];
            int k = snprintf(line, sizeof line, "audits");
            cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(aud, "counts"))
                if (k > 0 && (size_t)k < sizeof line && cJSON_IsNumber(c))
                    k += snprintf(line + k, sizeof line - (size_t)k, "%s %d %s", k > 6 ? "," : "",
                                  (int)c->valuedouble, c->string);
            if (al && k > 0 && (size_t)k < sizeof line)
                k += snprintf(line + k, sizeof line - (size_t)k, "; last %s %.0f s ago",
                              str_or_q(al, "result"), (double)time(NULL) - util_json_number(al, "at", 0));
            if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(aud, "pending")) && k > 0 &&
                (size_t)k < sizeof line)
                k += snprintf(line + k, sizeof line - (size_t)k, "; one pending");
            if (util_json_number(aud, "queued", 0) > 0 && k > 0 && (size_t)k < sizeof line)
                snprintf(line + k, sizeof line - (size_t)k, ", %.0f queued",
                         util_json_number(aud, "queued", 0));
            printf("  %-6s %-9s %s\n", "", "", line);
        }
        cJSON_ArrayForEach(sb, cJSON_GetObjectItemCaseSensitive(w, "standbys"))
            printf("  %-6s %-9s %-10s %-10s %-18.16s %-28s\n", "", "", str_or_q(sb, "state"), "",
                   str_or_q(sb, "node"), cJSON_IsString(cJSON_GetObjectItemCaseSensitive(sb, "endpoint")) ?
                   str_or_q(sb, "endpoint") : "- (pulling its window)");
    }
    cJSON_ArrayForEach(r, rings) {
        const cJSON *api = cJSON_GetObjectItemCaseSensitive(r, "api"), *u;
        printf("  ring %s  %d ranks  API", str_or_q(r, "id"),
               (int)util_json_number(r, "ranks", 0));
        if (!cJSON_GetArraySize(api))
            printf(" - (rank 0 serves none)");
        cJSON_ArrayForEach(u, api)
            printf(" %s", cJSON_IsString(u) ? u->valuestring : "?");
        printf("\n");
    }
    cJSON_ArrayForEach(r, unlinked)
        printf("  not a ring: %s (%d ranks, every window active): %s\n",
               str_or_q(r, "id"), (int)util_json_number(r, "ranks", 0), str_or_q(r, "reason"));
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

/* Options shared by the client and remove commands. */
struct acct_opts {
    const char *dir, *name;
    double credit;
    bool have_credit, json;
};

static int acct_parse(int argc, char **argv, struct acct_opts *o)
{
    static const struct option lo[] = {
        {"state-dir", required_argument, 0, 'd'}, {"name", required_argument, 0, 'n'},
        {"credit", required_argument, 0, 'c'}, {"json", no_argument, 0, 'j'},
        {"ca", required_argument, 0, 'C'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    *o = (struct acct_opts){.dir = "."};
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'd': o->dir = optarg; break;
        case 'n': o->name = optarg; break;
        case 'j': o->json = true; break;
        case 'C': ring_market_set_ca(optarg); break;
        case 'c':
            if (util_parse_double(optarg, 0, 1e15, 0, &o->credit, NULL, 0) < 0) {
                fprintf(stderr, "kvctl market: --credit '%s': expected a number from 0 to 1e15\n", optarg);
                return 2;
            }
            o->have_credit = true;
            break;
        case 'h': market_usage(stdout); return 1;
        default: market_usage(stderr); return 2;
        }
    }
    return 0;
}

/* A client named by its key or its id: the id (64 hex) into out, or -EINVAL. */
static int client_ref(const char *s, char out[65])
{
    if (ring_client_key_valid(s)) {
        ring_client_id(s, out);
        return 0;
    }
    if (strlen(s) == 64 && strspn(s, "0123456789abcdef") == 64) {
        memcpy(out, s, 65);
        return 0;
    }
    fprintf(stderr, "kvctl market client: '%.80s' is neither a client key (%s and 64 hex) nor a "
            "client id (64 hex)\n", s, RING_CLIENT_KEY_PREFIX);
    return -EINVAL;
}

/* A signed call with the node key in dir: 0 with the answer printed (json) or summed up. */
static int acct_call(const char *url, const char *method, const char *path, cJSON *body,
                     const char *dir, cJSON **out)
{
    char err[KV_ERR_MAX];
    struct net_identity *id = NULL;
    if (dir && net_identity_load(&id, dir, err, sizeof err) < 0) {
        fprintf(stderr, "kvctl market: %s\n", err);
        cJSON_Delete(body);
        return 1;
    }
    char *b = body ? cJSON_PrintUnformatted(body) : NULL;
    cJSON_Delete(body);
    long status;
    *out = call(url, method, path, b, id, &status);
    free(b);
    net_identity_free(id);
    return *out ? 0 : 1;
}

static void client_print(const cJSON *o, bool json)
{
    if (json) {
        char *s = cJSON_Print(o);
        printf("%s\n", s ? s : "{}");
        free(s);
        return;
    }
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(o, "name");
    printf("client %s\nname %s\nbalance %.6f\nspent %.6f\n",
           cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "client")),
           cJSON_IsString(n) ? n->valuestring : "", util_json_number(o, "balance", 0),
           util_json_number(o, "spent", 0));
}

static int market_client(int argc, char **argv)
{
    if (argc < 2) {
        market_usage(stderr);
        return 2;
    }
    const char *sub = argv[1];
    struct acct_opts o;
    int rc = acct_parse(argc - 1, argv + 1, &o);
    if (rc)
        return rc == 1 ? 0 : rc;
    int rest = argc - 1 - optind;   /* positional arguments after the subcommand */
    char **pos = argv + 1 + optind;
    cJSON *ans = NULL;
    char path[200], cid[65];
    if (!strcmp(sub, "add")) {
        if (rest != 1 || !o.have_credit) {
            fprintf(stderr, "kvctl market client add: URL and --credit N are required\n");
            return 2;
        }
        char key[RING_CLIENT_KEY_LEN + 1], v[65];
        uint8_t vb[32];
        if (ring_client_key_new(key)) {
            fprintf(stderr, "kvctl market client add: no randomness for a key\n");
            return 1;
        }
        ring_client_id(key, cid);
        ring_client_verifier(key, vb);
        util_hex_encode(vb, 32, v);
        cJSON *b = cJSON_CreateObject();
        cJSON_AddStringToObject(b, "client", cid);
        cJSON_AddStringToObject(b, "verifier", v);
        cJSON_AddNumberToObject(b, "credit", o.credit);
        if (o.name)
            cJSON_AddStringToObject(b, "name", o.name);
        if ((rc = acct_call(pos[0], "POST", "/v1/clients", b, o.dir, &ans)))
            return rc;
        if (o.json) {
            cJSON_AddStringToObject(ans, "key", key);
            client_print(ans, true);
        } else {
            printf("%s\n", key);
            fprintf(stderr, "client %s: give the key above to the client (it is not kept anywhere "
                    "else)\n", cid);
        }
    } else if (!strcmp(sub, "credit") || !strcmp(sub, "show")) {
        bool credit = !strcmp(sub, "credit");
        if (rest != 2 || (credit && !o.have_credit)) {
            fprintf(stderr, "kvctl market client %s: URL and CLIENT%s are required\n", sub,
                    credit ? " and --credit N" : "");
            return 2;
        }
        if (client_ref(pos[1], cid))
            return 2;
        snprintf(path, sizeof path, "/v1/clients/%s%s", cid, credit ? "/credit" : "");
        cJSON *b = NULL;
        if (credit) {
            b = cJSON_CreateObject();
            cJSON_AddNumberToObject(b, "credit", o.credit);
        }
        if ((rc = acct_call(pos[0], credit ? "POST" : "GET", path, b, credit ? o.dir : NULL, &ans)))
            return rc;
        client_print(ans, o.json);
    } else {
        fprintf(stderr, "kvctl market client: unknown subcommand '%s' (add, credit, show)\n", sub);
        return 2;
    }
    cJSON_Delete(ans);
    return 0;
}

static int market_remove(int argc, char **argv)
{
    struct acct_opts o;
    int rc = acct_parse(argc, argv, &o);
    if (rc)
        return rc == 1 ? 0 : rc;
    if (optind + 2 != argc || strlen(argv[optind + 1]) != 64) {
        fprintf(stderr, "kvctl market remove: URL and the model's ID (64 hex) are required\n");
        return 2;
    }
    char path[160];
    snprintf(path, sizeof path, "/v1/models/%s", argv[optind + 1]);
    cJSON *ans = NULL;
    if ((rc = acct_call(argv[optind], "DELETE", path, NULL, o.dir, &ans)))
        return rc;
    printf("removed %s\n", argv[optind + 1]);
    cJSON_Delete(ans);
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
    if (!strcmp(argv[1], "client"))
        return market_client(argc - 1, argv + 1);
    if (!strcmp(argv[1], "remove"))
        return market_remove(argc - 1, argv + 1);
    fprintf(stderr, "kvctl market: unknown subcommand '%s' (add, remove, status, balance, client)\n",
            argv[1]);
    return 2;
}

/* probe.c — known-answer probes of a window (docs/market.md, "Probes"): the checks of a
 * model's probe set when it is registered, the challenge a stage gets for its window (a
 * random subset of the set's sequences in a random order, each with its input boundary or
 * tokens), and the judgement of the stage's answer against the expected output boundary (by
 * NMSE) or greedy tokens. Pure functions of JSON: checks.c keeps them in the store. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <openssl/rand.h>

#include "kvd/market/internal.h"
#include "ring/ring.h"

#define CHALLENGE_SEQS 2   /* sequences a challenge asks for (fewer when the set has fewer) */

static uint32_t rnd(uint32_t n)
{
    uint32_t v = 0;
    if (RAND_bytes((unsigned char *)&v, sizeof v) != 1)
        v = (uint32_t)rand();
    return n ? v % n : 0;
}

static bool int_array(const cJSON *a, int n, double lo, double hi)
{
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != n)
        return false;
    const cJSON *v;
    cJSON_ArrayForEach(v, a)
        if (!cJSON_IsNumber(v) || v->valuedouble < lo || v->valuedouble > hi ||
            v->valuedouble != floor(v->valuedouble))
            return false;
    return true;
}

int kvd_market__probes_check(const cJSON *set, uint32_t n_layers, uint32_t n_embd, char *why,
                             size_t n)
{
    const cJSON *seqs = cJSON_GetObjectItemCaseSensitive(set, "seqs");
    const cJSON *nl = cJSON_GetObjectItemCaseSensitive(set, "n_layers");
    const cJSON *ne = cJSON_GetObjectItemCaseSensitive(set, "n_embd");
    if (!cJSON_IsObject(set) || !cJSON_IsNumber(nl) || nl->valuedouble != n_layers ||
        !cJSON_IsNumber(ne) || ne->valuedouble != n_embd) {
        snprintf(why, n, "probes: expected an object with the catalog's n_layers (%u) and n_embd (%u)",
                 n_layers, n_embd);
        return -EINVAL;
    }
    int ns = cJSON_GetArraySize(seqs);
    if (!cJSON_IsArray(seqs) || ns < 1 || ns > RING_PROBE_SEQS_MAX) {
        snprintf(why, n, "probes.seqs: expected 1 to %d sequences", RING_PROBE_SEQS_MAX);
        return -EINVAL;
    }
    int T = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(seqs->child, "tokens"));
    if (T < 1 || T > RING_PROBE_TOKENS_MAX) {
        snprintf(why, n, "probes.seqs[0].tokens: expected 1 to %d tokens", RING_PROBE_TOKENS_MAX);
        return -EINVAL;
    }
    size_t rows = (size_t)T * n_embd;
    if ((uint64_t)ns * rows * 2 * (n_layers - 1) > RING_PROBE_BYTES_MAX) {
        snprintf(why, n, "probes: %d x %d positions of %u boundaries exceed %u f16 bytes", ns, T,
                 n_layers - 1, RING_PROBE_BYTES_MAX);
        return -E2BIG;
    }
    float *x = malloc(rows * sizeof *x);
    if (!x) {
        snprintf(why, n, "out of memory");
        return -ENOMEM;
    }
    int i = 0, rc = 0;
    const cJSON *q;
    cJSON_ArrayForEach(q, seqs) {
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(q, "bounds");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(q, "clear"), *v;
        bool ok = int_array(cJSON_GetObjectItemCaseSensitive(q, "tokens"), T, 0, 1e9) &&
                  int_array(cJSON_GetObjectItemCaseSensitive(q, "greedy"), T, 0, 1e9) &&
                  cJSON_IsArray(c) && cJSON_GetArraySize(c) == T && cJSON_IsArray(b) &&
                  cJSON_GetArraySize(b) == (int)n_layers - 1;
        cJSON_ArrayForEach(v, c)
            ok = ok && cJSON_IsBool(v);
        cJSON_ArrayForEach(v, b)
            ok = ok && cJSON_IsString(v) && ring_probe_rows_decode(v->valuestring, x, rows) == 0;
        if (!ok) {
            snprintf(why, n, "probes.seqs[%d]: expected %d tokens, %u boundaries of %d x %u f16 "
                     "(base64), %d greedy tokens and %d clear flags", i, T, n_layers - 1, T,
                     n_embd, T, T);
            rc = -EINVAL;
            break;
        }
        i++;
    }
    free(x);
    return rc;
}

cJSON *kvd_market__probe_build(const cJSON *set, uint32_t first, uint32_t last, const cJSON *seqs,
                               const char *id)
{
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(set, "seqs"), *k;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddItemToObject(o, "n_layers", cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(set, "n_layers"), 0));
    cJSON_AddItemToObject(o, "n_embd", cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(set, "n_embd"), 0));
    cJSON *ly = cJSON_AddArrayToObject(o, "layers");
    cJSON_AddItemToArray(ly, cJSON_CreateNumber(first));
    cJSON_AddItemToArray(ly, cJSON_CreateNumber(last));
    cJSON *qs = cJSON_AddArrayToObject(o, "seqs");
    cJSON_ArrayForEach(k, seqs) {
        const cJSON *q = cJSON_GetArrayItem(all, (int)k->valuedouble);
        cJSON *c = cJSON_CreateObject();
        if (first == 0)
            cJSON_AddItemToObject(c, "tokens",
                                  cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(q, "tokens"), 1));
        else
            cJSON_AddStringToObject(c, "input", cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(q, "bounds"),
                                                                   (int)first - 1)->valuestring);
        cJSON_AddNumberToObject(c, "n", cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(q, "tokens")));
        cJSON_AddItemToArray(qs, c);
    }
    return o;
}

cJSON *kvd_market__probe_challenge(const cJSON *set, uint32_t first, uint32_t last, cJSON **seqs)
{
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(set, "seqs");
    int ns = cJSON_GetArraySize(all), k = ns < CHALLENGE_SEQS ? ns : CHALLENGE_SEQS;
    int idx[RING_PROBE_SEQS_MAX];
    for (int i = 0; i < ns && i < RING_PROBE_SEQS_MAX; i++)
        idx[i] = i;
    for (int i = ns - 1; i > 0; i--) {   /* a random order; the first k are the subset */
        int j = (int)rnd((uint32_t)i + 1), t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
    }
    *seqs = cJSON_CreateArray();
    for (int i = 0; i < k; i++)
        cJSON_AddItemToArray(*seqs, cJSON_CreateNumber(idx[i]));
    uint8_t id[8];
    char hex[17];
    if (RAND_bytes(id, sizeof id) != 1)
        memset(id, 0, sizeof id);
    for (int i = 0; i < 8; i++)
        snprintf(hex + 2 * i, 3, "%02x", id[i]);
    return kvd_market__probe_build(set, first, last, *seqs, hex);
}

int kvd_market__probe_judge(const cJSON *set, uint32_t last, const cJSON *seqs,
                            const cJSON *outputs, double *nmse, char *why, size_t n)
{
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(set, "seqs");
    uint32_t L = (uint32_t)cJSON_GetObjectItemCaseSensitive(set, "n_layers")->valuedouble;
    uint32_t E = (uint32_t)cJSON_GetObjectItemCaseSensitive(set, "n_embd")->valuedouble;
    int k = cJSON_GetArraySize(seqs);
    *nmse = 0;
    if (!cJSON_IsArray(outputs) || cJSON_GetArraySize(outputs) != k) {
        snprintf(why, n, "outputs: expected %d answers, one per sequence asked", k);
        return -EINVAL;
    }
    int rc = 0;
    float *got = NULL, *want = NULL;
    for (int i = 0; rc == 0 && i < k; i++) {
        const cJSON *q = cJSON_GetArrayItem(all, (int)cJSON_GetArrayItem(seqs, i)->valuedouble);
        const cJSON *out = cJSON_GetArrayItem(outputs, i);
        int T = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(q, "tokens"));
        if (last == L) {   /* the head's greedy tokens, where the lead was clear */
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(out, "tokens");
            if (!int_array(t, T, 0, 1e9)) {
                snprintf(why, n, "outputs[%d].tokens: expected %d token ids", i, T);
                return -EINVAL;
            }
            const cJSON *g = cJSON_GetObjectItemCaseSensitive(q, "greedy");
            const cJSON *c = cJSON_GetObjectItemCaseSensitive(q, "clear");
            for (int p = 0; p < T; p++)
                if (cJSON_IsTrue(cJSON_GetArrayItem(c, p)) &&
                    cJSON_GetArrayItem(t, p)->valuedouble != cJSON_GetArrayItem(g, p)->valuedouble) {
                    snprintf(why, n, "sequence %d, position %d: token %.0f, expected %.0f", i, p,
                             cJSON_GetArrayItem(t, p)->valuedouble, cJSON_GetArrayItem(g, p)->valuedouble);
                    *nmse = INFINITY;
                    return -EBADMSG;
                }
            continue;
        }
        size_t rows = (size_t)T * E;
        float *g2 = realloc(got, rows * sizeof *got), *w2 = g2 ? realloc(want, rows * sizeof *want) : NULL;
        if (g2)
            got = g2;
        if (w2)
            want = w2;
        if (!g2 || !w2) {
            snprintf(why, n, "out of memory");
            rc = -ENOMEM;
            break;
        }
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(out, "output");
        if (!cJSON_IsString(o) || ring_probe_rows_decode(o->valuestring, got, rows)) {
            snprintf(why, n, "outputs[%d].output: expected %d x %u f16 (base64)", i, T, E);
            rc = -EINVAL;
            break;
        }
        ring_probe_rows_decode(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(q, "bounds"),
                                                  (int)last - 1)->valuestring, want, rows);
        double e = ring_probe_nmse(got, want, rows);
        if (!(e <= *nmse))
            *nmse = e;
        if (!(e <= RING_PROBE_TOL)) {
            snprintf(why, n, "sequence %d: output boundary off by NMSE %.3g (tolerance %g)", i, e,
                     RING_PROBE_TOL);
            rc = -EBADMSG;
        }
    }
    free(got);
    free(want);
    return rc;
}

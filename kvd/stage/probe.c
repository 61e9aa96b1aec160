/* probe.c — a market's known-answer probe of a stage's window (docs/market.md, "Probes"), run
 * through the stage's own compute backend, each sequence a fresh session through the
 * backend's one batched run: the code that serves real traffic, not a separate maths path.
 * A serving stage runs it on its compute thread, on the backend it has loaded (the control
 * socket's "probe" op, compute.c's PROBE job), so a spot check costs no second copy of the
 * window; kvd join opens the window for it only while no stage of it runs (the activation
 * probe, a standby that has not taken over). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kvd/stage/internal.h"
#include "model/model.h"
#include "util/err.h"

/* One sequence of the challenge through b, in runs of at most max_rows rows: its answer
 * object, or NULL with err set. */
static cJSON *probe_seq(struct kvd_backend *b, uint64_t id, uint32_t max_rows, const cJSON *q,
                        char *err, size_t errlen)
{
    double nd = util_json_number(q, "n", 0);   /* range-checked before it is converted */
    uint32_t n = nd >= 1 && nd <= RING_PROBE_TOKENS_MAX ? (uint32_t)nd : 0;
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(q, "tokens");
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(q, "input");
    if (n < 1 || (b->embed ? cJSON_GetArraySize(toks) != (int)n : !cJSON_IsString(in))) {
        snprintf(err, errlen, "probe: a sequence needs n (1..%d) and, for layers [%u, %u), %s",
                 RING_PROBE_TOKENS_MAX, b->first, b->last, b->embed ? "n tokens" : "an input");
        return NULL;
    }
    size_t rows = (size_t)n * b->n_embd;
    float *x = calloc(rows, sizeof *x);
    float *logits = b->head ? malloc((size_t)n * b->n_vocab * sizeof *logits) : NULL;
    int32_t tk[RING_PROBE_TOKENS_MAX];
    struct model_batch_row r[RING_PROBE_TOKENS_MAX];
    cJSON *out = NULL;
    if (!x || (b->head && !logits)) {
        snprintf(err, errlen, "probe: out of memory");
        goto done;
    }
    for (uint32_t i = 0; i < n; i++) {
        const cJSON *t = b->embed ? cJSON_GetArrayItem(toks, (int)i) : NULL;
        if (b->embed && (!cJSON_IsNumber(t) || t->valuedouble < 0 || t->valuedouble >= b->n_vocab)) {
            snprintf(err, errlen, "probe: token %u is not an id below the vocabulary's %u", i,
                     b->n_vocab);
            goto done;
        }
        r[i] = (struct model_batch_row){.id = id, .pos = i};
        tk[i] = t ? (int32_t)t->valuedouble : 0;
    }
    if (!b->embed && ring_probe_rows_decode(in->valuestring, x, rows)) {
        snprintf(err, errlen, "probe: input is not %u x %u f16 (base64)", n, b->n_embd);
        goto done;
    }
    int rc = b->ops->session_new(b->impl, id);
    if (rc < 0) {
        snprintf(err, errlen, "probe: session: %s", strerror(-rc));
        goto done;
    }
    if (max_rows < 1)
        max_rows = 1;
    /* the rows in order, as a prompt of that many rows would run on this stage */
    for (uint32_t i = 0; rc >= 0 && i < n; i += max_rows) {
        uint32_t k = n - i < max_rows ? n - i : max_rows;
        uint32_t hd[RING_PROBE_TOKENS_MAX];
        for (uint32_t h = 0; h < k; h++)
            hd[h] = h;
        struct kvd_backend_batch bt = {
            .rows = r + i, .n = k, .tokens = b->embed ? tk + i : NULL,
            .x = x + (size_t)i * b->n_embd, .head = b->head ? hd : NULL,
            .n_head = b->head ? k : 0, .logits = logits ? logits + (size_t)i * b->n_vocab : NULL};
        rc = b->ops->run(b->impl, &bt, err, errlen);
    }
    b->ops->session_free(b->impl, id);
    if (rc < 0)
        goto done;
    out = cJSON_CreateObject();
    if (b->head) {
        cJSON *t = cJSON_AddArrayToObject(out, "tokens");
        for (uint32_t i = 0; i < n; i++) {
            const float *lg = logits + (size_t)i * b->n_vocab;
            uint32_t best = 0;
            for (uint32_t v = 1; v < b->n_vocab; v++)
                if (lg[v] > lg[best])
                    best = v;
            cJSON_AddItemToArray(t, cJSON_CreateNumber(best));
        }
    } else {
        char *enc = ring_probe_rows_encode(x, rows);
        if (!enc) {
            cJSON_Delete(out);
            out = NULL;
            snprintf(err, errlen, "probe: out of memory");
            goto done;
        }
        cJSON_AddStringToObject(out, "output", enc);
        free(enc);
    }
done:
    free(x);
    free(logits);
    return out;
}

/* The challenge's shape checked, every number before it is converted: its window, and the
 * model's layers and width it names (0: not named). 0, or -EINVAL with err filled. */
static int probe_check(const cJSON *c, uint32_t *first, uint32_t *last, uint32_t *n_layers,
                       uint32_t *n_embd, char *err, size_t errlen)
{
    const cJSON *seqs = cJSON_GetObjectItemCaseSensitive(c, "seqs");
    const cJSON *ly = cJSON_GetObjectItemCaseSensitive(c, "layers");
    const cJSON *l0 = cJSON_GetArrayItem(ly, 0), *l1 = cJSON_GetArrayItem(ly, 1);
    double nl = util_json_number(c, "n_layers", 0), ne = util_json_number(c, "n_embd", 0);
    if (!cJSON_IsObject(c) || !cJSON_IsArray(seqs) || cJSON_GetArraySize(seqs) < 1 ||
        cJSON_GetArraySize(seqs) > RING_PROBE_SEQS_MAX || cJSON_GetArraySize(ly) != 2 ||
        !cJSON_IsNumber(l0) || !cJSON_IsNumber(l1) || !(l0->valuedouble >= 0) ||
        !(l1->valuedouble <= 65536) || !(l0->valuedouble < l1->valuedouble) ||
        !(nl >= 0 && nl <= 65536) || !(ne >= 0 && ne <= 1048576)) {
        snprintf(err, errlen, "probe: expected seqs (1..%d), layers [first, last) and the "
                 "model's n_layers and n_embd", RING_PROBE_SEQS_MAX);
        return -EINVAL;
    }
    *first = (uint32_t)l0->valuedouble;
    *last = (uint32_t)l1->valuedouble;
    *n_layers = (uint32_t)nl;
    *n_embd = (uint32_t)ne;
    return 0;
}

int kvd_probe_run(struct kvd_backend *b, uint64_t id0, uint32_t max_rows, const cJSON *c,
                  char **outputs, char *err, size_t errlen)
{
    *outputs = NULL;
    uint32_t first, last, nl, ne;
    int rc = probe_check(c, &first, &last, &nl, &ne, err, errlen);
    if (rc < 0)
        return rc;
    nl = nl ? nl : b->n_layer;
    ne = ne ? ne : b->n_embd;
    if (first != b->first || last != b->last || nl != b->n_layer || ne != b->n_embd) {
        snprintf(err, errlen, "probe: layers [%u, %u) of %u (n_embd %u) asked, the window holds "
                 "[%u, %u) of %u (n_embd %u)", first, last, nl, ne, b->first, b->last, b->n_layer,
                 b->n_embd);
        return -EINVAL;
    }
    cJSON *outs = cJSON_CreateArray();
    const cJSON *q;
    uint64_t id = id0;
    cJSON_ArrayForEach(q, cJSON_GetObjectItemCaseSensitive(c, "seqs")) {
        cJSON *o = probe_seq(b, id++, max_rows, q, err, errlen);
        if (!o) {
            rc = -EIO;
            break;
        }
        cJSON_AddItemToArray(outs, o);
    }
    if (rc >= 0 && !(*outputs = cJSON_PrintUnformatted(outs)))
        rc = -ENOMEM;
    cJSON_Delete(outs);
    return rc;
}

int kvd_stage_probe(const char *backend, const char *window, int n_threads, const char *challenge,
                    char **outputs, char *err, size_t errlen)
{
    *outputs = NULL;
    uint32_t first, last, nl, ne;
    cJSON *c = cJSON_Parse(challenge);
    if (probe_check(c, &first, &last, &nl, &ne, err, errlen) < 0) {
        cJSON_Delete(c);
        return -EINVAL;
    }
    const struct kvd_backend_kind *kind = kvd_backend_kind_find(backend ? backend : "model");
    if (!kind) {
        snprintf(err, errlen, "probe: no compute backend named '%s' in this kvd", backend);
        cJSON_Delete(c);
        return -EINVAL;
    }
    struct kvd_backend b = {0};
    struct kvd_backend_args ba = {
        .path = window, .first = -1, .last = -1, .win_first = first, .win_last = last,
        .n_layer = nl, .n_embd = ne,
        .n_ctx = RING_PROBE_TOKENS_MAX, .max_batch = RING_PROBE_TOKENS_MAX,
        .n_threads = n_threads, .device = "cpu",
    };
    int rc = kind->open(&b, &ba, err, errlen);
    if (rc >= 0) {
        rc = kvd_probe_run(&b, KVD_PROBE_ID0, RING_PROBE_TOKENS_MAX, c, outputs, err, errlen);
        kvd_backend_close(&b);
    }
    cJSON_Delete(c);
    return rc < 0 ? rc : 0;
}

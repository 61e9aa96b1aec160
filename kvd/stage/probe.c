/* probe.c — a market's known-answer probe of a stage's window (docs/market.md, "Probes"), run
 * through the stage's own compute backend (the table's kind, opened on the pulled window as
 * the stage opens it, each sequence a fresh session through the backend's one batched run: the
 * code that serves real traffic, not a separate maths path). kvd join runs it before its
 * lease is active and again for each spot check. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kvd/stage/internal.h"
#include "model/model.h"
#include "util/err.h"

#define PROBE_ID0 0x70726f6265000000ull   /* session ids of a probe (a fresh backend: any) */

/* One sequence of the challenge through b: its answer object, or NULL with err set. */
static cJSON *probe_seq(struct kvd_backend *b, uint64_t id, const cJSON *q, char *err, size_t errlen)
{
    uint32_t n = (uint32_t)util_json_number(q, "n", 0);
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(q, "tokens");
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(q, "input");
    if (n < 1 || n > RING_PROBE_TOKENS_MAX || (b->embed ? cJSON_GetArraySize(toks) != (int)n
                                                        : !cJSON_IsString(in))) {
        snprintf(err, errlen, "probe: a sequence needs n (1..%d) and, for layers [%u, %u), %s",
                 RING_PROBE_TOKENS_MAX, b->first, b->last, b->embed ? "n tokens" : "an input");
        return NULL;
    }
    size_t rows = (size_t)n * b->n_embd;
    float *x = calloc(rows, sizeof *x);
    float *logits = b->head ? malloc((size_t)n * b->n_vocab * sizeof *logits) : NULL;
    int32_t tk[RING_PROBE_TOKENS_MAX];
    struct model_batch_row r[RING_PROBE_TOKENS_MAX];
    uint32_t head[RING_PROBE_TOKENS_MAX];
    cJSON *out = NULL;
    if (!x || (b->head && !logits)) {
        snprintf(err, errlen, "probe: out of memory");
        goto done;
    }
    for (uint32_t i = 0; i < n; i++) {
        r[i] = (struct model_batch_row){.id = id, .pos = i};
        head[i] = i;
        tk[i] = b->embed ? (int32_t)cJSON_GetArrayItem(toks, (int)i)->valuedouble : 0;
    }
    if (!b->embed && ring_probe_rows_decode(in->valuestring, x, rows)) {
        snprintf(err, errlen, "probe: input is not %u x %u f16 (base64)", n, b->n_embd);
        goto done;
    }
    struct kvd_backend_batch bt = {.rows = r, .n = n, .tokens = b->embed ? tk : NULL, .x = x,
                                   .head = b->head ? head : NULL, .n_head = b->head ? n : 0,
                                   .logits = logits};
    int rc = b->ops->session_new(b->impl, id);
    if (rc < 0) {
        snprintf(err, errlen, "probe: session: %s", strerror(-rc));
        goto done;
    }
    rc = b->ops->run(b->impl, &bt, err, errlen);
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

int kvd_stage_probe(const char *backend, const char *window, int n_threads, const char *challenge,
                    char **outputs, char *err, size_t errlen)
{
    *outputs = NULL;
    cJSON *c = cJSON_Parse(challenge);
    const cJSON *seqs = cJSON_GetObjectItemCaseSensitive(c, "seqs");
    const cJSON *ly = cJSON_GetObjectItemCaseSensitive(c, "layers");
    int rc = -EINVAL;
    if (!cJSON_IsArray(seqs) || cJSON_GetArraySize(seqs) < 1 ||
        cJSON_GetArraySize(seqs) > RING_PROBE_SEQS_MAX || cJSON_GetArraySize(ly) != 2) {
        snprintf(err, errlen, "probe: expected seqs (1..%d) and layers", RING_PROBE_SEQS_MAX);
        cJSON_Delete(c);
        return rc;
    }
    const struct kvd_backend_kind *kind = kvd_backend_kind_find(backend ? backend : "model");
    if (!kind) {
        snprintf(err, errlen, "probe: no compute backend named '%s' in this kvd", backend);
        cJSON_Delete(c);
        return rc;
    }
    struct kvd_backend b = {0};
    struct kvd_backend_args ba = {
        .path = window, .first = -1, .last = -1,
        .win_first = (uint32_t)cJSON_GetArrayItem(ly, 0)->valuedouble,
        .win_last = (uint32_t)cJSON_GetArrayItem(ly, 1)->valuedouble,
        .n_layer = (uint32_t)util_json_number(c, "n_layers", 0),
        .n_embd = (uint32_t)util_json_number(c, "n_embd", 0),
        .n_ctx = RING_PROBE_TOKENS_MAX, .max_batch = RING_PROBE_TOKENS_MAX,
        .n_threads = n_threads, .device = "cpu",
    };
    if ((rc = kind->open(&b, &ba, err, errlen)) < 0) {
        cJSON_Delete(c);
        return rc;
    }
    if (b.first != ba.win_first || b.last != ba.win_last) {
        snprintf(err, errlen, "probe: layers [%u, %u) asked, the window holds [%u, %u)", ba.win_first,
                 ba.win_last, b.first, b.last);
        rc = -EINVAL;
    }
    cJSON *outs = cJSON_CreateArray();
    const cJSON *q;
    uint64_t id = PROBE_ID0;
    cJSON_ArrayForEach(q, seqs) {
        if (rc < 0)
            break;
        cJSON *o = probe_seq(&b, id++, q, err, errlen);
        if (!o)
            rc = rc < 0 ? rc : -EIO;
        else
            cJSON_AddItemToArray(outs, o);
    }
    if (rc >= 0 && !(*outputs = cJSON_PrintUnformatted(outs)))
        rc = -ENOMEM;
    cJSON_Delete(outs);
    kvd_backend_close(&b);
    cJSON_Delete(c);
    return rc < 0 ? rc : 0;
}

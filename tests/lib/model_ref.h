/* model_ref.h — shared by the model tests: load a llama.cpp reference case (ref/<stem>.<case>
 * .json + .logits.f32, see the test data's MANIFEST.md) and run a model the way the
 * references were made (prompt as one batch, then each fed token alone). */
#ifndef KV_TESTS_MODEL_REF_H
#define KV_TESTS_MODEL_REF_H

#include <cjson/cJSON.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "model/model.h"
#include "tests/lib/t.h"
#include "util/util.h"

#define REF_FILE_MAX (1u << 30) /* reference JSON and logits files */
#include "tests/lib/util.h"

struct ref_case {
    char model[1024];               /* full path of the GGUF */
    int32_t *prompt, *gen, *fed;
    uint32_t n_prompt, n_gen, n_fed;
    uint32_t n_vocab;
    float *logits;                 /* [n_fed][n_vocab] */
};

static inline void ref_free(struct ref_case *r)
{
    free(r->prompt);
    free(r->gen);
    free(r->fed);
    free(r->logits);
    memset(r, 0, sizeof *r);
}

static inline int ref_ints(const cJSON *j, const char *key, int32_t **out, uint32_t *n)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsArray(a))
        return -1;
    *n = (uint32_t)cJSON_GetArraySize(a);
    *out = malloc((*n ? *n : 1) * sizeof **out);
    uint32_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a) {
        if (!cJSON_IsNumber(e))
            return -1;
        (*out)[i++] = (int32_t)e->valuedouble;
    }
    return 0;
}

/* Load ref/<name>.json ("stories260K.once"); 0 or -1 with a failed check. */
static inline int ref_load(struct ref_case *r, const char *name)
{
    memset(r, 0, sizeof *r);
    char rel[256], path[1024];
    snprintf(rel, sizeof rel, "ref/%s.json", name);
    if (!t_data_path(path, sizeof path, rel))
        return -1;
    size_t len;
    char *txt;
    util_file_read(path, REF_FILE_MAX, &txt, &len, NULL, 0);
    cJSON *j = txt ? cJSON_ParseWithLength(txt, len) : NULL;
    free(txt);
    T_CHECK(j != NULL, "%s: not JSON", path);
    if (!j)
        return -1;
    int rc = -1;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(j, "model");
    const cJSON *nv = cJSON_GetObjectItemCaseSensitive(j, "n_vocab");
    const cJSON *lf = cJSON_GetObjectItemCaseSensitive(j, "logits_file");
    if (!cJSON_IsString(model) || !cJSON_IsNumber(nv) || !cJSON_IsString(lf) ||
        ref_ints(j, "prompt_tokens", &r->prompt, &r->n_prompt) ||
        ref_ints(j, "generated_tokens", &r->gen, &r->n_gen) ||
        ref_ints(j, "tokens_fed", &r->fed, &r->n_fed)) {
        T_CHECK(0, "%s: fields missing", path);
        goto out;
    }
    r->n_vocab = (uint32_t)nv->valuedouble;
    snprintf(rel, sizeof rel, "models/%s", model->valuestring);
    if (!t_data_path(r->model, sizeof r->model, rel))
        goto out;
    snprintf(rel, sizeof rel, "ref/%s", lf->valuestring);
    if (!t_data_path(path, sizeof path, rel))
        goto out;
    util_file_read(path, REF_FILE_MAX, &txt, &len, NULL, 0);
    T_CHECK(txt && len == (size_t)r->n_fed * r->n_vocab * sizeof(float),
            "%s: %zu bytes, expected %u x %u floats", path, txt ? len : 0, r->n_fed, r->n_vocab);
    if (!txt || len != (size_t)r->n_fed * r->n_vocab * sizeof(float)) {
        free(txt);
        goto out;
    }
    r->logits = (float *)txt;
    rc = 0;
out:
    cJSON_Delete(j);
    if (rc)
        ref_free(r);
    return rc;
}

/* argmax, ties to the lowest id; *margin = best - second best. */
static inline uint32_t argmax2(const float *x, uint32_t n, float *margin)
{
    uint32_t b = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    float second = -INFINITY;
    for (uint32_t i = 0; i < n; i++)
        if (i != b && x[i] > second)
            second = x[i];
    if (margin)
        *margin = x[b] - second;
    return b;
}

/* A teacher-forced reference case and what to hold it to. */
struct ref_spec {
    const char *name;      /* ref/<name>.json */
    double f64_max;        /* MANIFEST "f64 max" column */
    bool quantised;
    bool one_batch;        /* also fed as one batch of every row (chunks of 8; a subset, for time) */
};

/* Checks our logits ours[n_fed][n_vocab] against the reference: the worst row's NMSE within
 * 10x the f64 run's (at least 1e-5), and the same argmax on every row whose reference top-2
 * margin exceeds 0.1 (0.5 quantised). Prints a summary line; returns the rows with a clear
 * argmax. mode names the feeding (0 as the references were made, 1 one batch). */
static inline uint32_t ref_compare(const struct ref_spec *sp, const struct ref_case *rc,
                                   const float *ours, int mode)
{
    double tol = fmax(10.0 * sp->f64_max, 1e-5), worst = 0;
    float thr = sp->quantised ? 0.5f : 0.1f;
    uint32_t checked = 0, bad = 0;
    for (uint32_t i = 0; i < rc->n_fed; i++) {
        const float *a = ours + (size_t)i * rc->n_vocab, *b = rc->logits + (size_t)i * rc->n_vocab;
        double e = t_nmse(a, b, rc->n_vocab);
        worst = e > worst ? e : worst;
        float margin;
        uint32_t ab = argmax2(b, rc->n_vocab, &margin);
        if (margin > thr) {
            checked++;
            uint32_t aa = argmax2(a, rc->n_vocab, NULL);
            if (aa != ab) {
                bad++;
                T_CHECK(0, "%s (mode %d) row %u: argmax %u, reference %u (margin %.3f)",
                        sp->name, mode, i, aa, ab, margin);
            }
        }
    }
    T_CHECK(worst <= tol, "%s (mode %d): NMSE max %.3g > tolerance %.3g", sp->name, mode, worst,
            tol);
    fprintf(stderr, "  %-36s %s NMSE max %.3g (tol %.3g, f64 %.2g), argmax %u/%u rows\n",
            sp->name, mode ? "one batch" : "as ref   ", worst, tol, sp->f64_max, checked - bad,
            checked);
    return checked;
}

#endif

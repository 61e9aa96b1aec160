/* gen.c — the bookkeeping of one generation (model.h, [generation]): token history, streamed
 * text, stop strings and the reason it ends. Rank 0 of a ring and the one-process generate
 * both push their sampled tokens through it, so the two end a generation the same way. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "util/util.h"

struct model_gen {
    const struct model_vocab *v;
    struct model_gen_params p;
    int32_t *hist;              /* [n_ctx]: prompt, then generated */
    uint32_t n_hist, n_prompt;
    enum model_gen_reason reason;
    struct model_detok *detok;  /* NULL without a vocabulary */
    char **stop;
    uint32_t n_stop;
    size_t stop_max;            /* longest stop string */
    /* The end of the generated text a new match can start in: the last stop_max - 1 bytes
     * before the newest piece, then the piece. */
    struct util_buf tail;
};

int model_gen_new(struct model_gen **out, const struct model_vocab *v,
                  const struct model_gen_params *p, const int32_t *prompt, uint32_t n_prompt)
{
    *out = NULL;
    if (n_prompt < 1 || n_prompt >= p->n_ctx)
        return -EINVAL;
    struct model_gen *g = calloc(1, sizeof *g);
    if (!g)
        return -ENOMEM;
    g->v = v;
    g->p = *p;
    g->hist = malloc((size_t)p->n_ctx * sizeof *g->hist);
    if (!g->hist)
        goto fail;
    memcpy(g->hist, prompt, (size_t)n_prompt * sizeof *prompt);
    g->n_hist = g->n_prompt = n_prompt;
    if (v && model_detok_new(&g->detok, v, false, false) < 0)
        goto fail;
    if (p->max_gen == 0)
        g->reason = MODEL_GEN_LENGTH;
    *out = g;
    return 0;
fail:
    model_gen_free(g);
    return -ENOMEM;
}

static void stops_clear(struct model_gen *g)
{
    for (uint32_t i = 0; i < g->n_stop; i++)
        free(g->stop[i]);
    free(g->stop);
    g->stop = NULL;
    g->n_stop = 0;
    g->stop_max = 0;
    g->tail.len = 0;
}

void model_gen_free(struct model_gen *g)
{
    if (!g)
        return;
    stops_clear(g);
    util_buf_free(&g->tail);
    model_detok_free(g->detok);
    free(g->hist);
    free(g);
}

int model_gen_set_stops(struct model_gen *g, const char *const *stops, uint32_t n)
{
    if (n > MODEL_GEN_MAX_STOPS)
        return -EINVAL;
    for (uint32_t i = 0; i < n; i++) {
        size_t l = strlen(stops[i]);
        if (l == 0 || l > MODEL_GEN_STOP_MAX)
            return -EINVAL;
    }
    stops_clear(g);
    if (n == 0)
        return 0;
    g->stop = calloc(n, sizeof *g->stop);
    if (!g->stop)
        return -ENOMEM;
    for (uint32_t i = 0; i < n; i++) {
        if (!(g->stop[i] = strdup(stops[i]))) {
            stops_clear(g);
            return -ENOMEM;
        }
        g->n_stop++;
        size_t l = strlen(stops[i]);
        if (l > g->stop_max)
            g->stop_max = l;
    }
    return 0;
}

/* Append the newest piece to the tail and look for a stop string that ends inside it (earlier
 * pieces found none, so a match must). Keeps only the bytes a later match can start in. */
static bool stop_found(struct model_gen *g, const char *piece, size_t len)
{
    size_t old = g->tail.len;
    if (util_buf_append(&g->tail, piece, len, SIZE_MAX))
        return false;   /* as when the text could not be kept: no match */
    bool hit = false;
    for (uint32_t i = 0; i < g->n_stop && !hit; i++) {
        size_t sl = strlen(g->stop[i]);
        size_t from = old >= sl ? old - sl + 1 : 0;
        hit = memmem(g->tail.p + from, g->tail.len - from, g->stop[i], sl) != NULL;
    }
    size_t keep = g->stop_max - 1;
    if (g->tail.len > keep)
        util_buf_consume(&g->tail, g->tail.len - keep);
    return hit;
}

int model_gen_push(struct model_gen *g, int32_t tok, struct model_gen_step *st)
{
    memset(st, 0, sizeof *st);
    if (g->reason != MODEL_GEN_RUNNING) {
        st->reason = g->reason;
        return -EINVAL;
    }
    g->hist[g->n_hist++] = tok;
    bool eos = !g->p.ignore_eos && (g->v ? model_vocab_is_eog(g->v, tok)
                                          : g->p.eos >= 0 && tok == g->p.eos);
    st->emit = !eos;   /* the end-of-text token ends the text; it is not part of it */
    if (g->detok) {
        st->text = "";
        const char *piece;
        size_t len;
        if (!eos && model_detok_push(g->detok, tok, &piece, &len) == 0) {
            st->text = piece;
            st->len = len;
        }
    }
    uint32_t n_gen = g->n_hist - g->n_prompt;
    if (eos)
        g->reason = MODEL_GEN_EOS;
    else if (n_gen >= g->p.max_gen)
        g->reason = MODEL_GEN_LENGTH;
    else if (g->n_hist >= g->p.n_ctx)
        g->reason = MODEL_GEN_CONTEXT;
    else if (g->n_stop && st->len && stop_found(g, st->text, st->len))
        g->reason = MODEL_GEN_STOP;
    st->reason = g->reason;
    return 0;
}

void model_gen_fail(struct model_gen *g)
{
    if (g->reason == MODEL_GEN_RUNNING)
        g->reason = MODEL_GEN_ERROR;
}

enum model_gen_reason model_gen_reason(const struct model_gen *g)
{
    return g->reason;
}

const char *model_gen_reason_name(enum model_gen_reason r)
{
    switch (r) {
    case MODEL_GEN_EOS: return "eos";
    case MODEL_GEN_LENGTH: return "length";
    case MODEL_GEN_CONTEXT: return "context";
    case MODEL_GEN_STOP: return "stop";
    case MODEL_GEN_ERROR: return "error";
    default: return "";
    }
}

const int32_t *model_gen_history(const struct model_gen *g, uint32_t *n)
{
    *n = g->n_hist;
    return g->hist;
}

uint32_t model_draft_lookup(const int32_t *hist, uint32_t n, uint32_t k, int32_t *out)
{
    if (k > MODEL_DRAFT_MAX)
        k = MODEL_DRAFT_MAX;
    for (uint32_t g = n > MODEL_DRAFT_NGRAM_MAX ? MODEL_DRAFT_NGRAM_MAX : n - (n > 0); g >= 1 && k; g--) {
        const int32_t *tail = hist + n - g;
        /* the most recent earlier occurrence with k tokens after it, else the one with the
         * most (an occurrence near the end has only the tail itself after it) */
        uint32_t best = 0, at = 0;
        for (uint32_t s = n - g; s-- > 0 && best < k;) {
            if (memcmp(hist + s, tail, g * sizeof *hist))
                continue;
            uint32_t m = n - (s + g) < k ? n - (s + g) : k;
            if (m > best)
                best = m, at = s + g;
        }
        if (best) {
            memcpy(out, hist + at, best * sizeof *hist);
            return best;
        }
    }
    return 0;
}

static const char *const draft_names[] = {
    [MODEL_DRAFT_NONE] = "none", [MODEL_DRAFT_LOOKUP] = "lookup", [MODEL_DRAFT_MTP] = "mtp",
    [MODEL_DRAFT_AUTO] = "auto",
};

int model_draft_mode(const char *name)
{
    for (int i = 0; name && i < (int)(sizeof draft_names / sizeof draft_names[0]); i++)
        if (!strcmp(name, draft_names[i]))
            return i;
    return -EINVAL;
}

uint32_t model_gen_n_prompt(const struct model_gen *g)
{
    return g->n_prompt;
}

uint32_t model_gen_n_gen(const struct model_gen *g)
{
    return g->n_hist - g->n_prompt;
}

int model_gen_flush(struct model_gen *g, const char **text, size_t *len)
{
    *text = NULL;
    *len = 0;
    if (!g->detok)
        return 0;
    int rc = model_detok_flush(g->detok, text, len);
    if (rc < 0) {
        *text = NULL;
        *len = 0;
    }
    return rc;
}

/* sampler.c — next-token choice from a logits row, in llama.cpp's order: penalties
 * (repetition, frequency, presence over the last penalty_last_n tokens), then top-k, top-p
 * and min-p on the distribution at temperature 1, then temperature, then a draw from the
 * kept set with a seeded RNG (splitmix64), so a seed reproduces a run exactly.
 * temperature <= 0 is greedy: the highest logit, ties to the lowest id. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/internal.h"

struct cand {
    int32_t id;
    float logit;
};

struct model_sampler {
    struct model_sampler_params p;
    uint32_t n_vocab;
    uint64_t rng;
    int32_t *hist;      /* ring of the last p.penalty_last_n accepted tokens */
    uint32_t hist_len, hist_head;
    uint32_t *counts;   /* [n_vocab] occurrences of each token in hist */
    uint32_t *seen;     /* [n_vocab] stamp: penalised in the call numbered gen */
    uint32_t gen;
    struct cand *cand;  /* [n_vocab] */
    int32_t *kept_id;   /* [n_vocab] the kept set of the last call, best first */
    float *kept_p;      /* [n_vocab] its probabilities (sum 1) */
};

void model_sampler_params_default(struct model_sampler_params *p)
{
    memset(p, 0, sizeof *p);
    p->seed = 0x4b5641534952ull;
    p->temperature = 0.8f;
    p->top_k = 40;
    p->top_p = 0.95f;
    p->min_p = 0.05f;
    p->repeat_penalty = 1.0f;
    p->penalty_last_n = 64;
}

int model_sampler_new(struct model_sampler **out, const struct model_sampler_params *p,
                      uint32_t n_vocab)
{
    *out = NULL;
    if (n_vocab == 0 || n_vocab > (1u << 24) || p->penalty_last_n > (1 << 20) ||
        !(p->repeat_penalty > 0.0f) || !isfinite(p->temperature))
        return -EINVAL;
    struct model_sampler *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    s->p = *p;
    s->n_vocab = n_vocab;
    s->rng = p->seed;
    uint32_t nh = p->penalty_last_n > 0 ? (uint32_t)p->penalty_last_n : 0;
    s->hist = calloc(nh ? nh : 1, sizeof *s->hist);
    s->counts = calloc(n_vocab, sizeof *s->counts);
    s->seen = calloc(n_vocab, sizeof *s->seen);
    s->cand = calloc(n_vocab, sizeof *s->cand);
    s->kept_id = calloc(n_vocab, sizeof *s->kept_id);
    s->kept_p = calloc(n_vocab, sizeof *s->kept_p);
    if (!s->hist || !s->counts || !s->seen || !s->cand || !s->kept_id || !s->kept_p) {
        model_sampler_free(s);
        return -ENOMEM;
    }
    *out = s;
    return 0;
}

void model_sampler_free(struct model_sampler *s)
{
    if (!s)
        return;
    free(s->hist);
    free(s->counts);
    free(s->seen);
    free(s->cand);
    free(s->kept_id);
    free(s->kept_p);
    free(s);
}

void model_sampler_accept(struct model_sampler *s, int32_t token)
{
    uint32_t nh = s->p.penalty_last_n > 0 ? (uint32_t)s->p.penalty_last_n : 0;
    if (nh == 0 || token < 0 || (uint32_t)token >= s->n_vocab)
        return;
    if (s->hist_len == nh) {            /* evict the oldest */
        s->counts[s->hist[s->hist_head]]--;
        s->hist_len--;
    }
    s->hist[s->hist_head] = token;
    s->hist_head = (s->hist_head + 1) % nh;
    s->hist_len++;
    s->counts[token]++;
}

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void model_sampler_skip(struct model_sampler *s, uint64_t n)
{
    s->rng += n * 0x9e3779b97f4a7c15ull;   /* splitmix64's state moves by one constant a draw */
}

/* Best first; equal logits by id so the order never depends on the sort. */
static int cand_cmp(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    if (x->logit != y->logit)
        return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Heap of the k best seen so far in c[0..k), the worst of them at the root. */
static void sift_down(struct cand *c, uint32_t k, uint32_t i)
{
    for (;;) {
        uint32_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < k && cand_cmp(&c[l], &c[w]) > 0) w = l;
        if (r < k && cand_cmp(&c[r], &c[w]) > 0) w = r;
        if (w == i)
            return;
        struct cand t = c[i]; c[i] = c[w]; c[w] = t;
        i = w;
    }
}

/* Put the k best of c[0..n) first, in any order (k <= n). */
static void select_top(struct cand *c, uint32_t n, uint32_t k)
{
    for (uint32_t i = k / 2; i-- > 0;)
        sift_down(c, k, i);
    for (uint32_t i = k; i < n; i++)
        if (cand_cmp(&c[i], &c[0]) < 0) {
            struct cand t = c[0]; c[0] = c[i]; c[i] = t;
            sift_down(c, k, 0);
        }
}

static void apply_penalties(struct model_sampler *s, float *logits)
{
    const struct model_sampler_params *p = &s->p;
    if (s->hist_len == 0 || (p->repeat_penalty == 1.0f && p->freq_penalty == 0.0f &&
                             p->presence_penalty == 0.0f))
        return;
    if (++s->gen == 0) {                /* stamps wrapped: forget them all */
        memset(s->seen, 0, s->n_vocab * sizeof *s->seen);
        s->gen = 1;
    }
    for (uint32_t i = 0; i < s->hist_len; i++) {
        int32_t t = s->hist[i];
        if (s->seen[t] == s->gen)
            continue;                   /* each distinct token once */
        s->seen[t] = s->gen;
        float l = logits[t];
        l = l > 0.0f ? l / p->repeat_penalty : l * p->repeat_penalty;
        logits[t] = l - (float)s->counts[t] * p->freq_penalty - p->presence_penalty;
    }
}

int model_sampler_kept(struct model_sampler *s, float *logits, const int32_t **ids,
                       const float **probs)
{
    const struct model_sampler_params *p = &s->p;
    apply_penalties(s, logits);
    uint32_t n = s->n_vocab;
    if (p->temperature <= 0.0f) {
        s->kept_id[0] = model_argmax(logits, n);
        s->kept_p[0] = 1.0f;
        *ids = s->kept_id;
        *probs = s->kept_p;
        return 1;
    }
    struct cand *c = s->cand;
    for (uint32_t i = 0; i < n; i++) {
        c[i].id = (int32_t)i;
        c[i].logit = isnan(logits[i]) ? -INFINITY : logits[i];
    }
    if (p->top_k > 0 && (uint32_t)p->top_k < n) {
        select_top(c, n, (uint32_t)p->top_k);
        n = (uint32_t)p->top_k;
    }
    qsort(c, n, sizeof *c, cand_cmp);
    if (c[0].logit == -INFINITY)
        return -EINVAL;

    /* top-p and min-p on the distribution at temperature 1 */
    double sum = 0.0;
    for (uint32_t i = 0; i < n; i++)
        sum += exp((double)c[i].logit - c[0].logit);
    if (p->top_p < 1.0f) {
        double cum = 0.0;
        uint32_t keep = n;
        for (uint32_t i = 0; i < n; i++) {
            cum += exp((double)c[i].logit - c[0].logit) / sum;
            if (cum >= p->top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    if (p->min_p > 0.0f) {
        /* p_i >= min_p * p_max  <=>  logit_i >= logit_max + log(min_p) */
        double cut = c[0].logit + log(p->min_p);
        uint32_t keep = 1;
        while (keep < n && c[keep].logit >= cut)
            keep++;
        n = keep;
    }

    /* temperature, then the kept set's probabilities */
    sum = 0.0;
    for (uint32_t i = 0; i < n; i++)
        sum += exp(((double)c[i].logit - c[0].logit) / p->temperature);
    for (uint32_t i = 0; i < n; i++) {
        s->kept_id[i] = c[i].id;
        s->kept_p[i] = (float)(exp(((double)c[i].logit - c[0].logit) / p->temperature) / sum);
    }
    *ids = s->kept_id;
    *probs = s->kept_p;
    return (int)n;
}

int32_t model_sampler_sample(struct model_sampler *s, float *logits, float *logprob)
{
    const int32_t *ids;
    const float *probs;
    int n = model_sampler_kept(s, logits, &ids, &probs);
    if (n <= 0)
        return n < 0 ? n : -EINVAL;
    if (s->p.temperature <= 0.0f) {
        if (logprob) {      /* log softmax of the (penalised) logits at the choice */
            double sum = 0.0;
            float mx = logits[ids[0]];
            for (uint32_t i = 0; i < s->n_vocab; i++)
                sum += exp((double)logits[i] - mx);
            *logprob = (float)-log(sum);
        }
        return ids[0];
    }
    double u = (double)(splitmix64(&s->rng) >> 11) * 0x1.0p-53;
    double cum = 0.0;
    int k = n - 1;
    for (int i = 0; i < n; i++) {
        cum += probs[i];
        if (u < cum) {
            k = i;
            break;
        }
    }
    if (logprob)
        *logprob = logf(probs[k]);
    return ids[k];
}

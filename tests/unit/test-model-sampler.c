/* test-model-sampler: the sampler's properties on random logits. The same seed gives the
 * same tokens (and another seed other tokens); top-k 1 is greedy; the kept set's
 * probabilities sum to 1 and respect top-k / top-p / min-p; draws follow the kept
 * distribution; penalties lower repeated tokens. */
#include <math.h>

#include "model/model.h"
#include "tests/lib/t.h"

#define V 1000

static uint64_t lcg = 88172645463325252ull;
static float frand(void)
{
    lcg ^= lcg << 13; lcg ^= lcg >> 7; lcg ^= lcg << 17;
    return (float)((lcg >> 11) * 0x1.0p-53);
}

static void random_logits(float *x, float spread)
{
    for (int i = 0; i < V; i++)
        x[i] = (frand() - 0.5f) * spread;
}

static int32_t argmax(const float *x)
{
    int32_t b = 0;
    for (int i = 1; i < V; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

/* Default parameters with the given temperature and cut-offs. */
static struct model_sampler_params params(float temperature, int32_t top_k, float top_p,
                                          float min_p)
{
    struct model_sampler_params p;
    model_sampler_params_default(&p);
    p.temperature = temperature;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    return p;
}

static void draw(const struct model_sampler_params *p, int32_t *out, int n)
{
    struct model_sampler *s;
    int rc = model_sampler_new(&s, p, V);
    T_ASSERT(rc == 0, "new");
    uint64_t save = lcg;
    lcg = 1234567;      /* the same logits for every call of draw() */
    float x[V];
    for (int i = 0; i < n; i++) {
        random_logits(x, 8.0f);
        out[i] = model_sampler_sample(s, x, NULL);
        model_sampler_accept(s, out[i]);
    }
    lcg = save;
    model_sampler_free(s);
}

T_CASE(same_seed_same_tokens)
{
    struct model_sampler_params p = params(1.5f, 0, 1.0f, 0.0f);
    p.repeat_penalty = 1.1f;
    p.seed = 7;
    int32_t a[200], b[200], c[200];
    draw(&p, a, 200);
    draw(&p, b, 200);
    p.seed = 8;
    draw(&p, c, 200);
    T_CHECK(!memcmp(a, b, sizeof a), "same seed, different tokens");
    int diff = 0;
    for (int i = 0; i < 200; i++)
        diff += a[i] != c[i];
    T_CHECK(diff > 20, "another seed changed only %d of 200 tokens", diff);
}

T_CASE(top_k_1_is_greedy)
{
    struct model_sampler_params p = params(2.0f, 1, 1.0f, 0.0f);
    struct model_sampler *s, *g;
    int rc = model_sampler_new(&s, &p, V);
    T_ASSERT(rc == 0, "new");
    p.temperature = 0.0f;
    rc = model_sampler_new(&g, &p, V);
    T_ASSERT(rc == 0, "new greedy");
    float x[V], y[V];
    for (int i = 0; i < 100; i++) {
        random_logits(x, 4.0f);
        memcpy(y, x, sizeof x);
        int32_t want = argmax(x);
        float lp;
        T_CHECK(model_sampler_sample(s, x, &lp) == want, "top-k 1 not the argmax");
        T_CHECK(lp == 0.0f, "logprob of a certain token %g", lp);
        T_CHECK(model_sampler_sample(g, y, NULL) == want, "greedy not the argmax");
    }
    /* ties go to the lowest id */
    for (int i = 0; i < V; i++)
        x[i] = 0.0f;
    x[500] = x[20] = 3.0f;
    T_CHECK(model_sampler_sample(g, x, NULL) == 20, "tie not to the lowest id");
    model_sampler_free(s);
    model_sampler_free(g);
}

T_CASE(kept_set_properties)
{
    const struct { float temp, top_p, min_p; int top_k; } cfg[] = {
        {1.0f, 1.0f, 0.0f, 0}, {0.7f, 0.9f, 0.0f, 0}, {1.3f, 1.0f, 0.1f, 0},
        {0.8f, 0.95f, 0.05f, 40}, {1.0f, 0.5f, 0.0f, 5}, {0.5f, 1.0f, 0.0f, 999},
    };
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        struct model_sampler_params p = params(cfg[c].temp, cfg[c].top_k, cfg[c].top_p,
                                               cfg[c].min_p);
        struct model_sampler *s;
        int rc = model_sampler_new(&s, &p, V);
        T_ASSERT(rc == 0, "new");
        float x[V], orig[V];
        for (int it = 0; it < 20; it++) {
            random_logits(x, 10.0f);
            memcpy(orig, x, sizeof x);
            const int32_t *ids;
            const float *pr;
            int n = model_sampler_kept(s, x, &ids, &pr);
            T_ASSERT(n >= 1 && n <= V, "kept %d", n);
            double sum = 0;
            for (int i = 0; i < n; i++) {
                sum += pr[i];
                T_CHECK(i == 0 || pr[i] <= pr[i - 1], "cfg %zu: not best first", c);
                T_CHECK(i == 0 || orig[ids[i]] <= orig[ids[i - 1]], "cfg %zu: order", c);
            }
            T_CHECK(fabs(sum - 1.0) < 1e-5, "cfg %zu: kept probabilities sum to %.8f", c, sum);
            T_CHECK(ids[0] == argmax(orig), "cfg %zu: best token not kept first", c);
            if (p.top_k > 0)
                T_CHECK(n <= p.top_k, "cfg %zu: %d kept > top-k %d", c, n, p.top_k);
            /* at temperature 1 on the whole vocabulary, what top-p / min-p may keep */
            double z = 0, mx = orig[ids[0]];
            for (int i = 0; i < V; i++)
                z += exp(orig[i] - mx);
            double before_last = 0;
            for (int i = 0; i < n - 1; i++)
                before_last += exp(orig[ids[i]] - mx) / z;
            if (p.top_p < 1.0f && p.top_k == 0)
                T_CHECK(before_last < p.top_p, "cfg %zu: top-p kept too many", c);
            if (p.min_p > 0.0f)
                T_CHECK(exp(orig[ids[n - 1]] - mx) >= p.min_p * 0.999,
                        "cfg %zu: min-p kept a token below the cut", c);
            if (p.top_k == 0 && p.top_p >= 1.0f && p.min_p <= 0.0f)
                T_CHECK(n == V, "cfg %zu: nothing to cut but %d kept", c, n);
        }
        model_sampler_free(s);
    }
}

T_CASE(draws_follow_probabilities)
{
    struct model_sampler_params p = params(1.0f, 4, 1.0f, 0.0f);
    struct model_sampler *s;
    int rc = model_sampler_new(&s, &p, V);
    T_ASSERT(rc == 0, "new");
    float x[V];
    for (int i = 0; i < V; i++)
        x[i] = -10.0f;
    x[3] = 2.0f; x[7] = 1.0f; x[11] = 0.0f; x[13] = -1.0f;
    const double z = exp(2) + exp(1) + 1 + exp(-1);
    const double want[4] = {exp(2) / z, exp(1) / z, 1 / z, exp(-1) / z};
    int count[4] = {0};
    const int N = 20000;
    for (int i = 0; i < N; i++) {
        float y[V];
        memcpy(y, x, sizeof x);
        int32_t t = model_sampler_sample(s, y, NULL);
        int k = t == 3 ? 0 : t == 7 ? 1 : t == 11 ? 2 : t == 13 ? 3 : -1;
        T_ASSERT(k >= 0, "drew %d outside the top 4", t);
        count[k]++;
    }
    for (int k = 0; k < 4; k++) {
        double f = (double)count[k] / N, sd = sqrt(want[k] * (1 - want[k]) / N);
        T_CHECK(fabs(f - want[k]) < 5 * sd, "token %d: frequency %.4f, probability %.4f", k, f,
                want[k]);
    }
    model_sampler_free(s);
}

T_CASE(penalties)
{
    struct model_sampler_params p;
    model_sampler_params_default(&p);
    p.temperature = 0.0f;
    p.repeat_penalty = 2.0f;
    p.freq_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    p.penalty_last_n = 3;
    struct model_sampler *s;
    int rc = model_sampler_new(&s, &p, V);
    T_ASSERT(rc == 0, "new");
    float x[V];
    for (int i = 0; i < V; i++)
        x[i] = 0.0f;
    x[1] = 4.0f; x[2] = -4.0f; x[3] = 3.0f;
    model_sampler_accept(s, 1);
    model_sampler_accept(s, 1);
    model_sampler_accept(s, 2);
    float lp;
    T_CHECK(model_sampler_sample(s, x, &lp) == 3, "repeated token 1 still chosen");
    T_CHECK(fabsf(x[1] - (4.0f / 2 - 2 * 0.5f - 0.25f)) < 1e-6, "penalised logit %g", x[1]);
    T_CHECK(fabsf(x[2] - (-4.0f * 2 - 0.5f - 0.25f)) < 1e-6, "penalised negative logit %g", x[2]);
    T_CHECK(x[3] == 3.0f, "unseen token changed");
    double z = 0;       /* log softmax of the penalised row at token 3 */
    for (int i = 0; i < V; i++)
        z += exp((double)x[i] - 3.0);
    T_CHECK(fabs(lp + log(z)) < 1e-5, "logprob %g, expected %g", lp, -log(z));
    /* only the last 3 count: after three other tokens, 1 is free again */
    model_sampler_accept(s, 5);
    model_sampler_accept(s, 6);
    model_sampler_accept(s, 7);
    x[1] = 4.0f;
    T_CHECK(model_sampler_sample(s, x, NULL) == 1, "penalty outlived the window");
    model_sampler_free(s);
}

int main(int argc, char **argv)
{
    t_init(argc, argv);
    T_RUN(same_seed_same_tokens);
    T_RUN(top_k_1_is_greedy);
    T_RUN(kept_set_properties);
    T_RUN(draws_follow_probabilities);
    T_RUN(penalties);
    return T_DONE();
}

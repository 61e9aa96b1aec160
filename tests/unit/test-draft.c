/* test-draft.c — prompt-lookup drafting (model_draft_lookup, docs/model.md "Drafting"): the
 * drafts are what followed the most recent earlier occurrence of the history's longest
 * matching tail n-gram (at most MODEL_DRAFT_NGRAM_MAX tokens), capped at k and at
 * MODEL_DRAFT_MAX, and nothing when the tail never occurred before. */
#include "tests/lib/t.h"
#include "model/model.h"

#define N(a) ((uint32_t)(sizeof(a) / sizeof((a)[0])))

static bool same(const int32_t *a, const int32_t *b, uint32_t n)
{
    return !memcmp(a, b, n * sizeof *a);
}

T_CASE(most_recent_longest)
{
    /* tail "1 2 3" occurred at 0 (then 9 ...) and at 5 (then 7 8 ...): the most recent wins */
    int32_t h[] = {1, 2, 3, 9, 4, 1, 2, 3, 7, 8, 5, 1, 2, 3};
    int32_t out[MODEL_DRAFT_MAX];
    uint32_t n = model_draft_lookup(h, N(h), 4, out);
    int32_t want[] = {7, 8, 5, 1};
    T_CHECK(n == 4 && same(out, want, 4), "drafts %u: %d %d %d %d", n, out[0], out[1], out[2], out[3]);
    /* for 15, no occurrence has 15 tokens after it: the one with the most (at 0: 11) */
    n = model_draft_lookup(h, N(h), 15, out);
    int32_t all[] = {9, 4, 1, 2, 3, 7, 8, 5, 1, 2, 3};
    T_CHECK(n == 11 && same(out, all, 11), "drafts to the end: %u", n);
}

T_CASE(longest_ngram_first)
{
    /* tail "... 6 2": the bigram "6 2" occurred at 1 (then 5); the unigram "2" more recently
     * at 4 (then 0): the longer match wins */
    int32_t h[] = {9, 6, 2, 5, 2, 0, 6, 2};
    int32_t out[MODEL_DRAFT_MAX];
    uint32_t n = model_draft_lookup(h, N(h), 2, out);
    T_CHECK(n == 2 && out[0] == 5 && out[1] == 2, "drafts %u: %d %d", n, out[0], out[1]);
}

T_CASE(no_match_and_caps)
{
    int32_t h[] = {1, 2, 3, 4, 5};
    int32_t out[MODEL_DRAFT_MAX];
    T_CHECK(model_draft_lookup(h, N(h), 8, out) == 0, "a tail that never occurred drafts nothing");
    T_CHECK(model_draft_lookup(h, 1, 8, out) == 0, "one token drafts nothing");
    T_CHECK(model_draft_lookup(h, 0, 8, out) == 0, "no history drafts nothing");
    int32_t rep[64];
    for (int i = 0; i < 64; i++)
        rep[i] = i % 3;
    /* a period-3 history: the most recent occurrence of its tail has 3 tokens after it, an
     * earlier one the 15 asked for, the period continued */
    uint32_t n = model_draft_lookup(rep, 64, 100, out);
    T_CHECK(n == MODEL_DRAFT_MAX, "k is capped at MODEL_DRAFT_MAX: %u", n);
    for (uint32_t i = 0; i < n; i++)
        T_CHECK(out[i] == (int32_t)((64 + i) % 3), "draft %u: %d", i, out[i]);
    T_CHECK(model_draft_lookup(rep, 64, 0, out) == 0, "k 0 drafts nothing");
}

int main(int argc, char **argv)
{
    t_init(argc, argv);
    T_RUN(most_recent_longest);
    T_RUN(longest_ngram_first);
    T_RUN(no_match_and_caps);
    return T_DONE();
}

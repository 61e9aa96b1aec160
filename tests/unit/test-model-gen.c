/* test-model-gen: the generation bookkeeping (model_gen): history and counts, each stop
 * reason (eos, length, context, stop string, error) and their order, stop strings that span
 * token boundaries and UTF-8 characters split across byte tokens, the end-of-text token kept
 * out of the text, the pending text at the end, refused stop lists, and a randomised check
 * that searching only the tail finds a stop string exactly when the whole text first holds
 * it. */
#include <errno.h>
#include <stdint.h>

#include "gguf/gguf.h"
#include "model/model.h"
#include "tests/lib/t.h"

static struct model_vocab *load_spm(void)
{
    char path[1024], err[256] = "";
    if (!t_data_path(path, sizeof path, "tokenizer/ggml-vocab-llama-spm.gguf"))
        return NULL;
    struct gguf_file *f = NULL;
    int rc = gguf_file_open(&f, path, err, sizeof err);
    T_CHECK(rc == 0, "gguf_file_open: %d %s", rc, err);
    if (rc)
        return NULL;
    struct model_vocab *v = NULL;
    rc = model_vocab_load(&v, f, err, sizeof err);
    T_CHECK(rc == 0, "model_vocab_load: %d %s", rc, err);
    gguf_file_free(f);
    return v;
}

static int32_t tok_of(const struct model_vocab *v, const char *s)
{
    return model_vocab_find(v, s, strlen(s));
}

/* Tokenise text without BOS. */
static uint32_t toks_of(const struct model_vocab *v, const char *text, int32_t *out, size_t max)
{
    size_t n = 0;
    int rc = model_tokenize(v, text, strlen(text), false, false, out, max, &n);
    T_CHECK(rc == 0 && n > 0, "tokenize '%s': %d", text, rc);
    return rc == 0 ? (uint32_t)n : 0;
}

static const int32_t prompt[] = {1, 2, 3};

T_CASE(history_and_counts)
{
    struct model_gen *g;
    struct model_gen_params p = {.n_ctx = 16, .max_gen = 8, .eos = -1};
    T_ASSERT(model_gen_new(&g, NULL, &p, prompt, 3) == 0, "new");
    struct model_gen_step st;
    for (int32_t t = 10; t < 14; t++) {
        T_CHECK(model_gen_push(g, t, &st) == 0, "push %d", t);
        T_CHECK(st.emit && st.reason == MODEL_GEN_RUNNING && !st.text, "step of %d", t);
    }
    uint32_t n;
    const int32_t *h = model_gen_history(g, &n);
    T_CHECK(n == 7 && model_gen_n_prompt(g) == 3 && model_gen_n_gen(g) == 4, "n %u", n);
    const int32_t want[] = {1, 2, 3, 10, 11, 12, 13};
    T_CHECK(!memcmp(h, want, sizeof want), "history");
    const char *txt;
    size_t len;
    T_CHECK(model_gen_flush(g, &txt, &len) == 0 && !txt && len == 0, "flush without a vocabulary");
    model_gen_fail(g);
    T_CHECK(model_gen_reason(g) == MODEL_GEN_ERROR, "fail");
    T_CHECK(model_gen_push(g, 5, &st) == -EINVAL && st.reason == MODEL_GEN_ERROR, "push after the end");
    T_CHECK(!strcmp(model_gen_reason_name(MODEL_GEN_ERROR), "error"), "name");
    model_gen_free(g);
    model_gen_free(NULL);
}

T_CASE(length_context_eos_order)
{
    struct model_gen *g;
    struct model_gen_step st;
    /* length */
    struct model_gen_params p = {.n_ctx = 16, .max_gen = 2, .eos = 7};
    T_ASSERT(model_gen_new(&g, NULL, &p, prompt, 3) == 0, "new");
    model_gen_push(g, 4, &st);
    T_CHECK(st.reason == MODEL_GEN_RUNNING, "first");
    model_gen_push(g, 4, &st);
    T_CHECK(st.reason == MODEL_GEN_LENGTH && st.emit, "length: %d", st.reason);
    T_CHECK(!strcmp(model_gen_reason_name(model_gen_reason(g)), "length"), "name");
    model_gen_fail(g);
    T_CHECK(model_gen_reason(g) == MODEL_GEN_LENGTH, "fail after the end changes nothing");
    model_gen_free(g);
    /* context: prompt 3 + 2 generated = n_ctx 5 */
    p = (struct model_gen_params){.n_ctx = 5, .max_gen = 10, .eos = 7};
    T_ASSERT(model_gen_new(&g, NULL, &p, prompt, 3) == 0, "new");
    model_gen_push(g, 4, &st);
    model_gen_push(g, 4, &st);
    T_CHECK(st.reason == MODEL_GEN_CONTEXT, "context: %d", st.reason);
    model_gen_free(g);
    /* length before context when both hold */
    p = (struct model_gen_params){.n_ctx = 4, .max_gen = 1, .eos = 7};
    T_ASSERT(model_gen_new(&g, NULL, &p, prompt, 3) == 0, "new");
    model_gen_push(g, 4, &st);
    T_CHECK(st.reason == MODEL_GEN_LENGTH, "length first: %d", st.reason);
    model_gen_free(g);
    /* eos by id without a vocabulary: not emitted, counted, before length */
    p = (struct model_gen_params){.n_ctx = 16, .max_gen = 1, .eos = 7};
    T_ASSERT(model_gen_new(&g, NULL, &p, prompt, 3) == 0, "new");
    model_gen_push(g, 7, &st);
    T_CHECK(st.reason == MODEL_GEN_EOS && !st.emit && model_gen_n_gen(g) == 1, "eos: %d", st.reason);
    model_gen_free(g);
    p.ignore_eos = true;
    p.max_gen = 2;
    T_ASSERT(model_gen_new(&g, NULL, &p, prompt, 3) == 0, "new");
    model_gen_push(g, 7, &st);
    T_CHECK(st.reason == MODEL_GEN_RUNNING && st.emit, "ignore_eos");
    model_gen_free(g);
    /* max_gen 0 ends at once; a prompt must be 1..n_ctx-1 tokens */
    p = (struct model_gen_params){.n_ctx = 16, .max_gen = 0, .eos = -1};
    T_ASSERT(model_gen_new(&g, NULL, &p, prompt, 3) == 0, "new");
    T_CHECK(model_gen_reason(g) == MODEL_GEN_LENGTH, "max_gen 0");
    model_gen_free(g);
    p.max_gen = 4;
    p.n_ctx = 3;
    T_CHECK(model_gen_new(&g, NULL, &p, prompt, 3) == -EINVAL && !g, "prompt fills the context");
    T_CHECK(model_gen_new(&g, NULL, &p, prompt, 0) == -EINVAL && !g, "empty prompt");
}

T_CASE(stop_lists_refused)
{
    struct model_gen *g;
    struct model_gen_params p = {.n_ctx = 16, .max_gen = 4, .eos = -1};
    T_ASSERT(model_gen_new(&g, NULL, &p, prompt, 3) == 0, "new");
    const char *empty[] = {"a", ""};
    T_CHECK(model_gen_set_stops(g, empty, 2) == -EINVAL, "empty stop");
    char lng[MODEL_GEN_STOP_MAX + 2];
    memset(lng, 'x', sizeof lng - 1);
    lng[sizeof lng - 1] = 0;
    const char *longs[] = {lng};
    T_CHECK(model_gen_set_stops(g, longs, 1) == -EINVAL, "too long");
    lng[MODEL_GEN_STOP_MAX] = 0;
    T_CHECK(model_gen_set_stops(g, longs, 1) == 0, "longest allowed");
    const char *many[MODEL_GEN_MAX_STOPS + 1];
    for (int i = 0; i <= MODEL_GEN_MAX_STOPS; i++)
        many[i] = "s";
    T_CHECK(model_gen_set_stops(g, many, MODEL_GEN_MAX_STOPS + 1) == -EINVAL, "too many");
    T_CHECK(model_gen_set_stops(g, many, MODEL_GEN_MAX_STOPS) == 0, "as many as allowed");
    T_CHECK(model_gen_set_stops(g, NULL, 0) == 0, "none");
    model_gen_free(g);
}

/* Push toks; returns the index of the push that ended it (-1: none), text appended to out. */
static int run(struct model_gen *g, const int32_t *toks, uint32_t n, char *out, size_t cap,
               struct model_gen_step *last)
{
    size_t ol = strlen(out);
    for (uint32_t i = 0; i < n; i++) {
        if (model_gen_push(g, toks[i], last) < 0)
            return -2;
        if (last->text && ol + last->len < cap) {
            memcpy(out + ol, last->text, last->len);
            out[ol += last->len] = 0;
        }
        if (last->reason != MODEL_GEN_RUNNING)
            return (int)i;
    }
    return -1;
}

T_CASE(stop_across_tokens)
{
    struct model_vocab *v = load_spm();
    T_ASSERT(v, "vocabulary");
    int32_t toks[64];
    uint32_t n = toks_of(v, "Hello world, hello again", toks, 64);
    T_ASSERT(n >= 4, "n %u", n);
    struct model_gen *g;
    struct model_gen_params p = {.n_ctx = 128, .max_gen = 64, .eos = -1};
    T_ASSERT(model_gen_new(&g, v, &p, prompt, 3) == 0, "new");
    const char *stops[] = {"zzz", "lo wor"};   /* "Hello" and " world" are separate tokens */
    T_ASSERT(model_gen_set_stops(g, stops, 2) == 0, "stops");
    char out[256] = "";
    struct model_gen_step st;
    int at = run(g, toks, n, out, sizeof out, &st);
    T_CHECK(at >= 1 && st.reason == MODEL_GEN_STOP && st.emit, "stopped at %d, reason %d", at, st.reason);
    T_CHECK(strstr(out, "lo wor") != NULL, "the token completing the stop is emitted: '%s'", out);
    /* and not one token earlier: the text without the last piece does not hold it */
    out[strlen(out) - st.len] = 0;
    T_CHECK(!strstr(out, "lo wor"), "stopped late: '%s'", out);
    T_CHECK(!strcmp(model_gen_reason_name(model_gen_reason(g)), "stop"), "name");
    model_gen_free(g);
    model_vocab_free(v);
}

T_CASE(utf8_split_and_eos)
{
    struct model_vocab *v = load_spm();
    T_ASSERT(v, "vocabulary");
    /* "é" = C3 A9 as two byte tokens; "€" = E2 82 AC */
    int32_t c3 = tok_of(v, "<0xC3>"), a9 = tok_of(v, "<0xA9>"), e2 = tok_of(v, "<0xE2>");
    int32_t x82 = tok_of(v, "<0x82>"), eos = model_vocab_eos(v);
    T_ASSERT(c3 >= 0 && a9 >= 0 && e2 >= 0 && x82 >= 0 && eos >= 0, "byte tokens");
    struct model_gen *g;
    struct model_gen_params p = {.n_ctx = 64, .max_gen = 16, .eos = -1};
    T_ASSERT(model_gen_new(&g, v, &p, prompt, 3) == 0, "new");
    const char *stops[] = {"\xc3\xa9"};
    T_ASSERT(model_gen_set_stops(g, stops, 1) == 0, "stops");
    struct model_gen_step st;
    model_gen_push(g, c3, &st);
    T_CHECK(st.text && st.len == 0 && st.reason == MODEL_GEN_RUNNING, "half a character: %zu", st.len);
    model_gen_push(g, a9, &st);
    T_CHECK(st.len == 2 && !memcmp(st.text, "\xc3\xa9", 2), "the character, whole");
    T_CHECK(st.reason == MODEL_GEN_STOP, "stop string split across byte tokens: %d", st.reason);
    model_gen_free(g);

    /* EOS: not in the text; an unfinished character is flushed as U+FFFD */
    T_ASSERT(model_gen_new(&g, v, &p, prompt, 3) == 0, "new");
    model_gen_push(g, e2, &st);
    model_gen_push(g, x82, &st);
    T_CHECK(st.len == 0, "two of three bytes");
    model_gen_push(g, eos, &st);
    T_CHECK(st.reason == MODEL_GEN_EOS && !st.emit && st.len == 0, "eos: %d %zu", st.reason, st.len);
    const char *txt;
    size_t len;
    T_CHECK(model_gen_flush(g, &txt, &len) == 0 && len == 3 && !memcmp(txt, "\xef\xbf\xbd", 3),
            "flush: %zu bytes", len);
    uint32_t n;
    const int32_t *h = model_gen_history(g, &n);
    T_CHECK(n == 6 && h[5] == eos && model_gen_n_gen(g) == 3, "eos is in the history");
    model_gen_free(g);
    model_vocab_free(v);
}

/* Random pieces, stops cut from the text: the tail search stops exactly at the first token
 * after which the whole text holds a stop string. */
T_CASE(tail_search_matches_whole_text)
{
    struct model_vocab *v = load_spm();
    T_ASSERT(v, "vocabulary");
    uint64_t rng = 12345;
    int32_t toks[200];
    uint32_t nv = model_vocab_n_tokens(v);
    for (int round = 0; round < 200; round++) {
        uint32_t n = 0;
        while (n < 200) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            int32_t t = (int32_t)((rng >> 33) % nv);
            size_t pl;
            const char *pc = model_token_piece(v, t, false, &pl);
            if (!model_vocab_is_control(v, t) && !model_vocab_is_eog(v, t) && pc &&
                !memchr(pc, 0, pl))   /* no NUL byte: the test compares C strings */
                toks[n++] = t;
        }
        /* The whole text, then stops cut from it */
        struct model_gen *g;
        struct model_gen_params p = {.n_ctx = 1024, .max_gen = 500, .eos = -1};
        T_ASSERT(model_gen_new(&g, v, &p, prompt, 3) == 0, "new");
        char full[8192] = "";
        struct model_gen_step st;
        run(g, toks, n, full, sizeof full, &st);
        model_gen_free(g);
        size_t fl = strlen(full);
        if (fl < 40)
            continue;
        char s1[32], s2[32];
        size_t o1 = (rng >> 20) % (fl - 30), l1 = 1 + (rng >> 40) % 12;
        size_t o2 = (rng >> 8) % (fl - 30), l2 = 1 + (rng >> 50) % 20;
        memcpy(s1, full + o1, l1);
        s1[l1] = 0;
        memcpy(s2, full + o2, l2);
        s2[l2] = 0;
        const char *stops[] = {s1, s2};
        T_ASSERT(model_gen_new(&g, v, &p, prompt, 3) == 0, "new");
        T_ASSERT(model_gen_set_stops(g, stops, 2) == 0, "stops");
        char out[8192] = "";
        int at = run(g, toks, n, out, sizeof out, &st);
        T_CHECK(at >= 0 && st.reason == MODEL_GEN_STOP, "round %d: no stop", round);
        if (at >= 0) {
            T_CHECK(strstr(out, s1) || strstr(out, s2), "round %d: stopped without a match", round);
            out[strlen(out) - st.len] = 0;
            T_CHECK(!strstr(out, s1) && !strstr(out, s2), "round %d: stopped late", round);
        }
        model_gen_free(g);
    }
    model_vocab_free(v);
}

int main(int argc, char **argv)
{
    t_init(argc, argv);
    T_RUN(history_and_counts);
    T_RUN(length_context_eos_order);
    T_RUN(stop_lists_refused);
    T_RUN(stop_across_tokens);
    T_RUN(utf8_split_and_eos);
    T_RUN(tail_search_matches_whole_text);
    return T_DONE();
}

/* test-model-tokenizer: llama.cpp's tokenizer vectors (every .inp/.out pair under
 * tokenizer/), the prompt tokens of every reference case, decode round trips, special-token
 * parsing, the streaming detokeniser, and malformed metadata refused with a clear error. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>

#include "gguf/gguf.h"
#include "model/model.h"
#include "tests/lib/t.h"
#include "util/util.h"
#include "util/err.h"

#define VEC_FILE_MAX (64u << 20) /* a test vector or reference JSON file */

static struct model_vocab *load_vocab(const char *rel, struct gguf_file **gf)
{
    char path[1024], err[256] = "";
    if (!t_data_path(path, sizeof path, rel))
        return NULL;
    struct gguf_file *f = NULL;
    int rc = gguf_file_open(&f, path, err, sizeof err);
    T_CHECK(rc == 0, "%s: gguf_file_open: %d %s", rel, rc, err);
    if (rc)
        return NULL;
    struct model_vocab *v = NULL;
    rc = model_vocab_load(&v, f, err, sizeof err);
    T_CHECK(rc == 0, "%s: model_vocab_load: %d %s", rel, rc, err);
    if (gf)
        *gf = f;
    else
        gguf_file_free(f);
    return v;
}

/* tokenise into a fresh array (caller frees) */
static int32_t *tokenize(const struct model_vocab *v, const char *s, size_t len, bool add_special,
                         bool parse_special, size_t *n)
{
    size_t cap = len + 8;
    int32_t *ids = malloc(cap * sizeof *ids);
    int rc = model_tokenize(v, s, len, add_special, parse_special, ids, cap, n);
    if (rc == -ENOSPC) {
        free(ids);
        ids = malloc((*n ? *n : 1) * sizeof *ids);
        rc = model_tokenize(v, s, len, add_special, parse_special, ids, *n, n);
    }
    T_CHECK(rc == 0, "model_tokenize: %d", rc);
    return ids;
}

static char *detokenize(const struct model_vocab *v, const int32_t *ids, size_t n, unsigned flags,
                        size_t *len)
{
    size_t cap = 64;
    char *b = malloc(cap);
    int rc = model_detokenize(v, ids, n, flags, b, cap, len);
    if (rc == -ENOSPC) {
        free(b);
        cap = *len;
        b = malloc(cap ? cap : 1);
        rc = model_detokenize(v, ids, n, flags, b, cap, len);
    }
    T_CHECK(rc == 0, "model_detokenize: %d", rc);
    return b;
}

static void print_ids(const char *what, const int32_t *ids, size_t n)
{
    fprintf(stderr, "    %s:", what);
    for (size_t i = 0; i < n && i < 64; i++)
        fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "%s\n", n > 64 ? " ..." : "");
}

/* hex line -> bytes (returns the length) */
static size_t unhex(const char *h, char *out, size_t cap)
{
    size_t n = 0;
    for (; h[0] && h[1] && n < cap; h += 2) {
        unsigned x;
        if (sscanf(h, "%2x", &x) != 1)
            break;
        out[n++] = (char)x;
    }
    return n;
}

/* Check a vocabulary against vectors: inp (cases separated by the llama.cpp marker), out
 * (expected ids per line), optionally det (hex of llama.cpp's llama_detokenize of those ids,
 * compared with MODEL_DETOK_CLEAN_SPACES). With det absent the ids must decode to the input. */
static void check_vectors(const char *vocab_rel, const char *inp_path, const char *out_path,
                          const char *det_path, bool parse_special)
{
    const char *name = strrchr(inp_path, '/') ? strrchr(inp_path, '/') + 1 : inp_path;
    struct model_vocab *v = load_vocab(vocab_rel, NULL);
    if (!v)
        return;
    size_t ilen, olen, dlen;
    char *inp, *outp, *detp = NULL;
    util_file_read(inp_path, VEC_FILE_MAX, &inp, &ilen, NULL, 0);
    util_file_read(out_path, VEC_FILE_MAX, &outp, &olen, NULL, 0);
    if (det_path)
        util_file_read(det_path, VEC_FILE_MAX, &detp, &dlen, NULL, 0);
    T_CHECK(inp && outp && (!det_path || detp), "%s: vectors unreadable", name);
    if (!inp || !outp || (det_path && !detp))
        goto done;
    static const char sep[] = "\n__ggml_vocab_test__\n";
    char *ip = inp, *op = outp, *dp = detp;
    int cases = 0, bad = 0, rt_bad = 0;
    for (;;) {
        char *iend = strstr(ip, sep);
        if (!iend)
            break;
        char *oend = strchr(op, '\n');
        T_CHECK(oend, "%s: .out has fewer lines than .inp has cases", name);
        if (!oend)
            break;
        *oend = 0;
        size_t nexp = 0;
        int32_t exp[1024];
        for (char *q = op; *q;) {
            char *e;
            long x = strtol(q, &e, 10);
            if (e == q)
                break;
            if (nexp < 1024)
                exp[nexp++] = (int32_t)x;
            q = e;
        }
        size_t n, ilen1 = (size_t)(iend - ip);
        int32_t *got = tokenize(v, ip, ilen1, false, parse_special, &n);
        bool ok = n == nexp && (n == 0 || !memcmp(got, exp, n * sizeof *got));
        cases++;
        if (!ok) {
            bad++;
            T_CHECK(ok, "%s: case %d '%.*s'", name, cases, (int)(ilen1 > 60 ? 60 : ilen1), ip);
            print_ids("want", exp, nexp);
            print_ids("got ", got, n);
        }
        size_t dl;
        char *dec = detokenize(v, exp, nexp, (parse_special ? MODEL_DETOK_SPECIAL : 0) |
                               (dp ? MODEL_DETOK_CLEAN_SPACES : 0), &dl);
        if (dp) {
            char *dend = strchr(dp, '\n');
            T_CHECK(dend, "%s: .det has fewer lines than cases", name);
            if (!dend)
                break;
            *dend = 0;
            char want[8192];
            size_t wl = unhex(dp, want, sizeof want);
            if (dl != wl || memcmp(dec, want, wl)) {
                rt_bad++;
                T_CHECK(0, "%s: case %d decodes to '%.*s' not '%.*s'", name, cases, (int)dl, dec,
                        (int)wl, want);
            }
            dp = dend + 1;
        } else if (dl != ilen1 || memcmp(dec, ip, dl)) {
            rt_bad++;
            T_CHECK(0, "%s: case %d decodes to '%.*s' not '%.*s'", name, cases, (int)dl, dec,
                    (int)ilen1, ip);
        }
        free(dec);
        free(got);
        ip = iend + sizeof sep - 1;
        op = oend + 1;
    }
    T_CHECK(cases > 10, "%s: only %d cases parsed", name, cases);
    fprintf(stderr, "    %s: %d cases, %d wrong, %d decode mismatches\n", name, cases, bad, rt_bad);
done:
    free(inp);
    free(outp);
    free(detp);
    model_vocab_free(v);
}

/* One vocabulary's .inp/.out pairs from the shared test data (llama.cpp's own vectors). */
static void run_vectors(const char *name)
{
    char rel[256], inp[1024], out[1024];
    snprintf(rel, sizeof rel, "tokenizer/ggml-vocab-%s.gguf.inp", name);
    if (!t_data_path(inp, sizeof inp, rel))
        return;
    snprintf(rel, sizeof rel, "tokenizer/ggml-vocab-%s.gguf.out", name);
    if (!t_data_path(out, sizeof out, rel))
        return;
    snprintf(rel, sizeof rel, "tokenizer/ggml-vocab-%s.gguf", name);
    check_vectors(rel, inp, out, NULL, false);
}

/* Vectors made with llama.cpp on random mixed-script text (tests/data/tokenizer/gen.mjs):
 * the pre-tokenizers without shared vectors, special-token parsing, and llama.cpp's decoding. */
T_CASE(vectors_llamacpp_random)
{
    static const struct { const char *vocab, *set; bool parse; } sets[] = {
        {"deepseek-llm", "deepseek-llm-plain", false}, {"falcon", "falcon-plain", false},
        {"refact", "refact-plain", false},             {"gpt-neox", "gpt-neox-plain", false},
        {"deepseek-coder", "deepseek-coder-parse", true}, {"qwen2", "qwen2-parse", true},
        {"phi-3", "phi-3-parse", true},                {"llama-spm", "llama-spm-parse", true},
    };
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) {
        char rel[256], inp[512], out[512], det[512];
        snprintf(rel, sizeof rel, "tokenizer/ggml-vocab-%s.gguf", sets[i].vocab);
        snprintf(inp, sizeof inp, "tests/data/tokenizer/%s.inp", sets[i].set);
        snprintf(out, sizeof out, "tests/data/tokenizer/%s.out", sets[i].set);
        snprintf(det, sizeof det, "tests/data/tokenizer/%s.det", sets[i].set);
        check_vectors(rel, inp, out, det, sets[i].parse);
    }
}

T_CASE(vectors_spm)
{
    run_vectors("llama-spm");
    run_vectors("phi-3");
}

T_CASE(vectors_bpe)
{
    run_vectors("gpt-2");
    run_vectors("gpt-neox");
    run_vectors("mpt");
    run_vectors("starcoder");
    run_vectors("deepseek-coder");
    run_vectors("qwen2");
}

/* The prompt tokens of every reference case, with BOS as the JSON says llama.cpp added. */
T_CASE(reference_prompts)
{
    char dir[1024];
    if (!t_data_path(dir, sizeof dir, "ref"))
        return;
    DIR *d = opendir(dir);
    T_ASSERT(d, "opendir %s", dir);
    struct dirent *e;
    int cases = 0;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 5 || strcmp(e->d_name + l - 5, ".json"))
            continue;
        char path[2048];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        size_t jl;
        char *js;
        util_file_read(path, VEC_FILE_MAX, &js, &jl, NULL, 0);
        cJSON *j = js ? cJSON_Parse(js) : NULL;
        free(js);
        T_CHECK(j, "%s: unreadable JSON", e->d_name);
        if (!j)
            continue;
        const cJSON *model = cJSON_GetObjectItem(j, "model"), *prompt = cJSON_GetObjectItem(j, "prompt");
        const cJSON *toks = cJSON_GetObjectItem(j, "prompt_tokens");
        const cJSON *add_bos = cJSON_GetObjectItem(j, "add_bos");
        if (cJSON_IsString(model) && cJSON_IsString(prompt) && cJSON_IsArray(toks)) {
            char rel[512];
            snprintf(rel, sizeof rel, "models/%s", model->valuestring);
            struct model_vocab *v = load_vocab(rel, NULL);
            if (v) {
                T_CHECK(model_vocab_add_bos(v) == cJSON_IsTrue(add_bos), "%s: add_bos %d, JSON says %d",
                        e->d_name, model_vocab_add_bos(v), cJSON_IsTrue(add_bos));
                size_t n;
                int32_t *got = tokenize(v, prompt->valuestring, strlen(prompt->valuestring), true,
                                        true, &n);
                int want_n = cJSON_GetArraySize(toks);
                bool ok = (int)n == want_n;
                for (int i = 0; ok && i < want_n; i++)
                    ok = got[i] == cJSON_GetArrayItem(toks, i)->valueint;
                T_CHECK(ok, "%s: prompt '%s' tokenised differently", e->d_name, prompt->valuestring);
                if (!ok)
                    print_ids("got", got, n);
                /* and back: the text after the BOS decodes to the prompt (llama.cpp strips
                 * the SPM leading space only from the first token decoded, so a BOS in front
                 * would keep it) */
                size_t dl, skip = n && got[0] == model_vocab_bos(v) && model_vocab_add_bos(v);
                char *dec = detokenize(v, got + skip, n - skip, 0, &dl);
                T_CHECK(dl == strlen(prompt->valuestring) && !memcmp(dec, prompt->valuestring, dl),
                        "%s: decodes to '%.*s'", e->d_name, (int)dl, dec);
                free(dec);
                free(got);
                model_vocab_free(v);
                cases++;
            }
        }
        cJSON_Delete(j);
    }
    closedir(d);
    T_CHECK(cases >= 10, "only %d reference cases", cases);
}

/* Vocabularies without vectors load, and their round trip holds on varied text. */
T_CASE(other_vocabs_roundtrip)
{
    static const char *names[] = {"deepseek-llm", "falcon", "refact"};
    static const char text[] =
        "Hello world! It's 2024-05-01, and 12345 apples cost $6.78.\n\n"
        "  indented\tcode: for (int i = 0; i < 10; i++) { x += i; }\n"
        "Ünïcödé: naïve café, Привет мир, 你好世界, 안녕하세요, \xF0\x9F\xA6\x99 llama\n";
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "tokenizer/ggml-vocab-%s.gguf", names[i]);
        struct model_vocab *v = load_vocab(rel, NULL);
        if (!v)
            continue;
        size_t n, dl;
        int32_t *ids = tokenize(v, text, sizeof text - 1, false, false, &n);
        T_CHECK(n > 20 && n < sizeof text, "%s: %zu tokens", names[i], n);
        for (size_t k = 0; k < n; k++)
            T_CHECK(ids[k] >= 0 && (uint32_t)ids[k] < model_vocab_n_tokens(v), "%s: id %d", names[i], ids[k]);
        char *dec = detokenize(v, ids, n, 0, &dl);
        T_CHECK(dl == sizeof text - 1 && !memcmp(dec, text, dl), "%s: round trip gives '%.*s'",
                names[i], (int)dl, dec);
        free(dec);
        free(ids);
        model_vocab_free(v);
    }
}

/* WordPiece vocabularies are refused with a message that says so. */
T_CASE(bert_refused)
{
    char path[1024], err[256] = "";
    if (!t_data_path(path, sizeof path, "tokenizer/ggml-vocab-bert-bge.gguf"))
        return;
    struct gguf_file *f = NULL;
    T_ASSERT(gguf_file_open(&f, path, err, sizeof err) == 0, "%s", err);
    struct model_vocab *v = NULL;
    int rc = model_vocab_load(&v, f, err, sizeof err);
    T_CHECK(rc == -ENOTSUP && !v && strstr(err, "bert"), "rc %d err '%s'", rc, err);
    gguf_file_free(f);
}

/* parse_special: control-token text becomes the token only when asked. */
T_CASE(special_parsing)
{
    struct model_vocab *v = load_vocab("tokenizer/ggml-vocab-qwen2.gguf", NULL);
    if (!v)
        return;
    static const char s[] = "<|im_start|>user\nhi<|im_end|>";
    size_t n1, n2, len;
    int32_t *a = tokenize(v, s, sizeof s - 1, false, true, &n1);
    int32_t *b = tokenize(v, s, sizeof s - 1, false, false, &n2);
    const char *t0 = model_vocab_text(v, a[0], &len);
    T_CHECK(n1 >= 4 && len == 12 && !memcmp(t0, "<|im_start|>", 12), "first token %d", a[0]);
    T_CHECK(model_vocab_is_eog(v, a[n1 - 1]), "<|im_end|> (%d) is end of generation", a[n1 - 1]);
    T_CHECK(n2 > n1, "without parse_special the markers are plain text (%zu vs %zu tokens)", n2, n1);
    for (size_t i = 0; i < n2; i++)
        T_CHECK(!model_vocab_is_control(v, b[i]), "control token %d from plain text", b[i]);
    /* decoding hides control tokens unless asked */
    size_t dl;
    char *d1 = detokenize(v, a, n1, 0, &dl);
    T_CHECK(dl == 7 && !memcmp(d1, "user\nhi", 7), "decode without specials: '%.*s'", (int)dl, d1);
    free(d1);
    char *d2 = detokenize(v, a, n1, MODEL_DETOK_SPECIAL, &dl);
    T_CHECK(dl == sizeof s - 1 && !memcmp(d2, s, dl), "decode with specials: '%.*s'", (int)dl, d2);
    free(d2);
    free(a);
    free(b);
    model_vocab_free(v);
}

/* llama.cpp's clean-up of spaces in decoding: only with MODEL_DETOK_CLEAN_SPACES, only for
 * vocabularies that ask for it (gpt-2 does, qwen2 does not). */
T_CASE(clean_spaces)
{
    static const char s[] = "Hello , world ! y 'all 're ok ?";
    struct model_vocab *g = load_vocab("tokenizer/ggml-vocab-gpt-2.gguf", NULL);
    struct model_vocab *q = load_vocab("tokenizer/ggml-vocab-qwen2.gguf", NULL);
    if (!g || !q)
        goto done;
    size_t n, dl;
    int32_t *ids = tokenize(g, s, sizeof s - 1, false, false, &n);
    char *d = detokenize(g, ids, n, 0, &dl);
    T_CHECK(dl == sizeof s - 1 && !memcmp(d, s, dl), "plain decode: '%.*s'", (int)dl, d);
    free(d);
    d = detokenize(g, ids, n, MODEL_DETOK_CLEAN_SPACES, &dl);
    static const char want[] = "Hello, world! y 'all're ok?";
    T_CHECK(dl == sizeof want - 1 && !memcmp(d, want, dl), "cleaned: '%.*s'", (int)dl, d);
    free(d);
    free(ids);
    ids = tokenize(q, s, sizeof s - 1, false, false, &n);
    d = detokenize(q, ids, n, MODEL_DETOK_CLEAN_SPACES, &dl);
    T_CHECK(dl == sizeof s - 1 && !memcmp(d, s, dl), "qwen2 has no clean-up: '%.*s'", (int)dl, d);
    free(d);
    free(ids);
done:
    model_vocab_free(g);
    model_vocab_free(q);
}

/* The streaming detokeniser: every chunk is whole UTF-8, the chunks add up to the text, and
 * broken byte sequences come out as U+FFFD. */
static bool utf8_ok(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t k = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 :
                   c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (!k || i + k > n)
            return false;
        for (size_t j = 1; j < k; j++)
            if (((unsigned char)s[i + j] & 0xC0) != 0x80)
                return false;
        i += k;
    }
    return true;
}

static void stream_check(const char *rel, const char *text)
{
    struct model_vocab *v = load_vocab(rel, NULL);
    if (!v)
        return;
    size_t n, tl = strlen(text);
    int32_t *ids = tokenize(v, text, tl, false, false, &n);
    struct model_detok *d = NULL;
    T_ASSERT(model_detok_new(&d, v, false, true) == 0, "detok_new");
    char acc[1024];
    size_t al = 0;
    int split_chars = 0;
    for (size_t i = 0; i < n; i++) {
        const char *t;
        size_t l;
        T_CHECK(model_detok_push(d, ids[i], &t, &l) == 0, "push");
        T_CHECK(utf8_ok(t, l), "%s: chunk %zu is not whole UTF-8", rel, i);
        size_t pl;
        const char *p = model_token_piece(v, ids[i], false, &pl);
        split_chars += p && !utf8_ok(p, pl);
        if (al + l < sizeof acc) {
            memcpy(acc + al, t, l);
            al += l;
        }
    }
    const char *t;
    size_t l;
    T_CHECK(model_detok_flush(d, &t, &l) == 0 && l == 0, "nothing pending at the end");
    T_CHECK(al == tl && !memcmp(acc, text, tl), "%s: stream gives '%.*s'", rel, (int)al, acc);
    T_CHECK(split_chars > 0, "%s: the text should need byte tokens that split characters", rel);
    model_detok_free(d);

    /* a lone lead byte, then a stray continuation byte, then an unfinished character */
    int32_t bad[3] = {-1, -1, -1};
    for (uint32_t id = 0; id < model_vocab_n_tokens(v); id++) {
        size_t pl;
        const char *p = model_token_piece(v, (int32_t)id, false, &pl);
        if (pl == 1 && (unsigned char)p[0] == 0xE2)
            bad[0] = (int32_t)id;
        if (pl == 1 && (unsigned char)p[0] == 0x80)
            bad[1] = (int32_t)id;
    }
    T_ASSERT(bad[0] >= 0 && bad[1] >= 0, "%s: byte tokens for 0xE2 and 0x80", rel);
    bad[2] = bad[0];
    T_ASSERT(model_detok_new(&d, v, false, false) == 0, "detok_new");
    char out[64];
    size_t ol = 0;
    int32_t seq[5] = {bad[0], ids[n - 1], bad[1], bad[2], -5};
    for (int i = 0; i < 4; i++) {
        T_CHECK(model_detok_push(d, seq[i], &t, &l) == 0, "push");
        T_CHECK(utf8_ok(t, l), "chunk %d broken", i);
        memcpy(out + ol, t, l);
        ol += l;
    }
    T_CHECK(model_detok_push(d, seq[4], &t, &l) == -ERANGE, "id out of range");
    T_CHECK(model_detok_flush(d, &t, &l) == 0 && l == 3 && !memcmp(t, "\xEF\xBF\xBD", 3),
            "unfinished character flushed as U+FFFD");
    T_CHECK(ol >= 6 && !memcmp(out, "\xEF\xBF\xBD", 3), "lone lead byte becomes U+FFFD");
    T_CHECK(utf8_ok(out, ol), "output whole");
    model_detok_free(d);
    free(ids);
    model_vocab_free(v);
}

T_CASE(streaming)
{
    stream_check("tokenizer/ggml-vocab-llama-spm.gguf", "Hello \xF0\x9F\xA6\x99 world \xE1\x9E\x80!");
    stream_check("tokenizer/ggml-vocab-gpt-2.gguf", "Hello \xF0\x9F\xA6\x99 world \xE1\x9E\x80!");
}

/* --- malformed metadata: copies of a small model's metadata with one thing broken ---- */

typedef void (*mutate_cb)(struct gguf_writer *w, const struct gguf_file *src);

static int load_mutated(const struct gguf_file *src, const char *skip, mutate_cb mut, char *err, size_t errlen)
{
    struct gguf_writer *w = NULL;
    if (gguf_writer_new(&w) != 0)
        return -999;
    for (uint64_t i = 0; i < gguf_kv_count(src); i++) {
        const struct gguf_kv *kv = gguf_kv_at(src, i);
        if (skip && !strcmp(kv->key, skip))
            continue;
        gguf_writer_set(w, kv->key, &kv->val);
    }
    if (mut)
        mut(w, src);
    char path[512], werr[256];
    static int seq;
    snprintf(path, sizeof path, "%s/m%d.gguf", t_tmpdir(), seq++);
    int rc = gguf_writer_write(w, path, werr, sizeof werr);
    gguf_writer_free(w);
    T_CHECK(rc == 0, "write %s: %s", path, werr);
    struct gguf_file *f = NULL;
    rc = gguf_file_open(&f, path, werr, sizeof werr);
    T_CHECK(rc == 0, "reopen: %s", werr);
    if (rc)
        return -999;
    struct model_vocab *v = NULL;
    err[0] = 0;
    rc = model_vocab_load(&v, f, err, errlen);
    model_vocab_free(v);
    gguf_file_free(f);
    unlink(path);
    return rc;
}

static void mut_short_scores(struct gguf_writer *w, const struct gguf_file *src)
{
    const struct gguf_value *t;
    gguf_get_arr(src, "tokenizer.ggml.tokens", &t);
    uint64_t n = t->v.arr.n - 1;
    float *s = calloc(n, sizeof *s);
    gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_V_F32, n, s);
    free(s);
}
static void mut_bos_range(struct gguf_writer *w, const struct gguf_file *src)
{
    (void)src;
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 70000);
}
static void mut_pre_unknown(struct gguf_writer *w, const struct gguf_file *src)
{
    (void)src;
    gguf_writer_set_str(w, "tokenizer.ggml.pre", "no-such-pre");
}
static void mut_merge_nospace(struct gguf_writer *w, const struct gguf_file *src)
{
    (void)src;
    const char *m[] = {"\xC4\xA0 t", "ab"};
    gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", 2, m);
}
static void mut_tokens_not_str(struct gguf_writer *w, const struct gguf_file *src)
{
    (void)src;
    uint32_t x[4] = {1, 2, 3, 4};
    gguf_writer_set_arr(w, "tokenizer.ggml.tokens", GGUF_V_U32, 4, x);
}
static void mut_types_short(struct gguf_writer *w, const struct gguf_file *src)
{
    (void)src;
    int32_t x[3] = {1, 1, 1};
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_V_I32, 3, x);
}
static void mut_model_unknown(struct gguf_writer *w, const struct gguf_file *src)
{
    (void)src;
    gguf_writer_set_str(w, "tokenizer.ggml.model", "zebra");
}
static void mut_add_bos_str(struct gguf_writer *w, const struct gguf_file *src)
{
    (void)src;
    gguf_writer_set_str(w, "tokenizer.ggml.add_bos_token", "yes");
}

T_CASE(malformed_metadata)
{
    struct gguf_file *bpe = NULL, *spm = NULL;
    struct model_vocab *v1 = load_vocab("models/synth-qwen2-bpe1024-q8_0.gguf", &bpe);
    struct model_vocab *v2 = load_vocab("models/stories260K.gguf", &spm);
    model_vocab_free(v1);
    model_vocab_free(v2);
    T_ASSERT(bpe && spm, "source models");
    char err[KV_ERR_MAX];
    int rc;

    /* the unmodified copies load */
    rc = load_mutated(bpe, NULL, NULL, err, sizeof err);
    T_CHECK(rc == 0, "plain BPE copy: %d %s", rc, err);
    rc = load_mutated(spm, NULL, NULL, err, sizeof err);
    T_CHECK(rc == 0, "plain SPM copy: %d %s", rc, err);

    rc = load_mutated(bpe, "tokenizer.ggml.merges", NULL, err, sizeof err);
    T_CHECK(rc == -EINVAL && strstr(err, "tokenizer.ggml.merges") && strstr(err, "missing"),
            "missing merges: %d '%s'", rc, err);
    rc = load_mutated(spm, NULL, mut_short_scores, err, sizeof err);
    T_CHECK(rc == -EINVAL && strstr(err, "scores") && strstr(err, "511") && strstr(err, "512"),
            "short scores: %d '%s'", rc, err);
    rc = load_mutated(bpe, NULL, mut_bos_range, err, sizeof err);
    T_CHECK(rc == -EINVAL && strstr(err, "bos_token_id") && strstr(err, "70000") && strstr(err, "1024"),
            "bos out of range: %d '%s'", rc, err);
    rc = load_mutated(bpe, NULL, mut_pre_unknown, err, sizeof err);
    T_CHECK(rc == -ENOTSUP && strstr(err, "no-such-pre"), "unknown pre: %d '%s'", rc, err);
    rc = load_mutated(bpe, NULL, mut_merge_nospace, err, sizeof err);
    T_CHECK(rc == -EINVAL && strstr(err, "merges[1]"), "merge without space: %d '%s'", rc, err);
    rc = load_mutated(bpe, NULL, mut_tokens_not_str, err, sizeof err);
    T_CHECK(rc == -EINVAL && strstr(err, "tokenizer.ggml.tokens"), "tokens not strings: %d '%s'", rc, err);
    rc = load_mutated(spm, NULL, mut_types_short, err, sizeof err);
    T_CHECK(rc == -EINVAL && strstr(err, "token_type") && strstr(err, "3 entries"),
            "short token types: %d '%s'", rc, err);
    rc = load_mutated(spm, "tokenizer.ggml.tokens", NULL, err, sizeof err);
    T_CHECK(rc == -EINVAL && strstr(err, "tokenizer.ggml.tokens"), "no tokens: %d '%s'", rc, err);
    rc = load_mutated(spm, NULL, mut_model_unknown, err, sizeof err);
    T_CHECK(rc == -ENOTSUP && strstr(err, "zebra"), "unknown model: %d '%s'", rc, err);
    rc = load_mutated(spm, NULL, mut_add_bos_str, err, sizeof err);
    T_CHECK(rc == -EINVAL && strstr(err, "add_bos_token"), "add_bos as string: %d '%s'", rc, err);
    gguf_file_free(bpe);
    gguf_file_free(spm);
}

/* Every pre-tokenizer name llama.cpp knows that we implement loads (its regexes compile) and
 * tokenises; the BPE model's metadata with the name swapped in. */
static const char *g_pre;
static void mut_pre(struct gguf_writer *w, const struct gguf_file *src)
{
    (void)src;
    gguf_writer_set_str(w, "tokenizer.ggml.pre", g_pre);
}

T_CASE(pre_tokenizers_compile)
{
    static const char *names[] = {
        "default", "gpt-2", "llama3", "llama-bpe", "qwen2", "deepseek-coder", "deepseek-llm",
        "deepseek-v3", "starcoder", "falcon", "mpt", "refact", "command-r", "stablelm2", "olmo",
        "dbrx", "smaug-bpe", "poro-chat", "chatglm-bpe", "glm4", "viking", "jais", "smollm",
        "codeshell", "bloom", "gpt3-finnish", "exaone", "minerva-7b", "qwen35", "laguna",
        "bailingmoe", "seed-coder", "minicpm5", "megrez", "falcon3", "phi-2"};
    struct gguf_file *bpe = NULL;
    model_vocab_free(load_vocab("models/synth-qwen2-bpe1024-q8_0.gguf", &bpe));
    T_ASSERT(bpe, "source model");
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char err[KV_ERR_MAX];
        g_pre = names[i];
        int rc = load_mutated(bpe, NULL, mut_pre, err, sizeof err);
        T_CHECK(rc == 0, "pre '%s': %d %s", names[i], rc, err);
    }
    gguf_file_free(bpe);
}

/* Long runs of one kind of character (regex backtracking, heap sizes): tokenised without
 * error and decoded back. */
T_CASE(long_runs)
{
    static const char *vocabs[] = {"tokenizer/ggml-vocab-deepseek-llm.gguf",
                                   "tokenizer/ggml-vocab-deepseek-coder.gguf",
                                   "tokenizer/ggml-vocab-qwen2.gguf", "tokenizer/ggml-vocab-llama-spm.gguf"};
    static const char *units[] = {"\xe4\xb8\xad", "\xea\xb0\x80", " ", "a", "7", "!", "\n",
                                  "\xe3\x80\x80", "\xf0\x9f\xa6\x99", "a ", "'s"};
    for (size_t vi = 0; vi < sizeof vocabs / sizeof vocabs[0]; vi++) {
        struct model_vocab *v = load_vocab(vocabs[vi], NULL);
        if (!v)
            continue;
        for (size_t u = 0; u < sizeof units / sizeof units[0]; u++) {
            size_t ul = strlen(units[u]), reps = 100000, len = ul * reps;
            char *t = malloc(len);
            for (size_t i = 0; i < reps; i++)
                memcpy(t + i * ul, units[u], ul);
            size_t n, dl;
            int32_t *ids = tokenize(v, t, len, false, false, &n);
            char *dec = detokenize(v, ids, n, 0, &dl);
            T_CHECK(n > 0 && dl == len && !memcmp(dec, t, len), "%s: %zu x '%s' does not round-trip",
                    vocabs[vi], reps, units[u]);
            free(dec);
            free(ids);
            free(t);
        }
        model_vocab_free(v);
    }
}

/* One vocabulary, several threads tokenising and decoding at once: the same results. */
struct thr_arg {
    const struct model_vocab *v;
    const char *text;
    size_t len, n;
    int32_t *ids;
    bool ok;
};

static void *thr_main(void *p)
{
    struct thr_arg *a = p;
    a->ok = true;
    for (int r = 0; r < 20 && a->ok; r++) {
        size_t n;
        int rc = model_tokenize(a->v, a->text, a->len, true, true, a->ids, a->len + 8, &n);
        a->ok = rc == 0 && (r == 0 || n == a->n);
        a->n = n;
        char buf[4096];
        size_t dl;
        a->ok = a->ok && model_detokenize(a->v, a->ids, n, MODEL_DETOK_REMOVE_SPECIAL | MODEL_DETOK_SPECIAL, buf,
                                                 sizeof buf, &dl) == 0;
    }
    return NULL;
}

T_CASE(threads)
{
    static const char text[] = "<|im_start|>user\nHow many r's are in 'strawberry'? 123456 \xe4\xbd\xa0\xe5\xa5\xbd"
                               " \xf0\x9f\xa6\x99<|im_end|>\n";
    struct model_vocab *v = load_vocab("tokenizer/ggml-vocab-qwen2.gguf", NULL);
    if (!v)
        return;
    struct thr_arg a[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (struct thr_arg){v, text, sizeof text - 1, 0, malloc((sizeof text + 8) * sizeof(int32_t)), false};
        T_ASSERT(pthread_create(&th[i], NULL, thr_main, &a[i]) == 0, "pthread_create");
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) {
        T_CHECK(a[i].ok && a[i].n == a[0].n && !memcmp(a[i].ids, a[0].ids, a[0].n * sizeof(int32_t)),
                "thread %d differs", i);
    }
    for (int i = 0; i < 4; i++)
        free(a[i].ids);
    int32_t id = model_vocab_find(v, "<|im_end|>", 10);
    T_CHECK(id >= 0 && model_vocab_is_eog(v, id), "find <|im_end|>: %d", id);
    T_CHECK(model_vocab_find(v, "no such token text", 18) == -1, "find of a missing text");
    model_vocab_free(v);
}

/* Buffer contracts: -ENOSPC reports the size needed; empty text with and without BOS. */
T_CASE(buffers)
{
    struct model_vocab *v = load_vocab("models/stories260K.gguf", NULL);
    if (!v)
        return;
    int32_t ids[2];
    size_t n;
    int rc = model_tokenize(v, "Once upon a time", 16, true, false, ids, 2, &n);
    T_CHECK(rc == -ENOSPC && n == 5, "rc %d n %zu", rc, n);
    rc = model_tokenize(v, "", 0, true, false, ids, 2, &n);
    T_CHECK(rc == 0 && n == 1 && ids[0] == model_vocab_bos(v), "empty with BOS: rc %d n %zu", rc, n);
    rc = model_tokenize(v, "", 0, false, false, ids, 2, &n);
    T_CHECK(rc == 0 && n == 0, "empty: rc %d n %zu", rc, n);
    char b[4];
    size_t len;
    int32_t seq[3] = {403, 407, 1};
    rc = model_detokenize(v, seq, 2, 0, b, sizeof b, &len);
    T_CHECK(rc == -ENOSPC && len == 9, "detokenize needs 9 bytes ('Once upon'): rc %d len %zu", rc, len);
    rc = model_detokenize(v, seq + 2, 1, MODEL_DETOK_SPECIAL, b, sizeof b, &len);
    T_CHECK(rc == 0 && len == 3 && !memcmp(b, "<s>", 3), "BOS printed as special: rc %d len %zu", rc, len);
    seq[1] = 512;
    rc = model_detokenize(v, seq, 3, MODEL_DETOK_REMOVE_SPECIAL, b, sizeof b, &len);
    T_CHECK(rc == -ERANGE, "id out of range: rc %d", rc);
    model_vocab_free(v);
}

int main(int argc, char **argv)
{
    t_init(argc, argv);
    T_RUN(vectors_spm);
    T_RUN(vectors_bpe);
    T_RUN(vectors_llamacpp_random);
    T_RUN(reference_prompts);
    T_RUN(other_vocabs_roundtrip);
    T_RUN(bert_refused);
    T_RUN(special_parsing);
    T_RUN(clean_spaces);
    T_RUN(streaming);
    T_RUN(malformed_metadata);
    T_RUN(pre_tokenizers_compile);
    T_RUN(long_runs);
    T_RUN(threads);
    T_RUN(buffers);
    return T_DONE();
}

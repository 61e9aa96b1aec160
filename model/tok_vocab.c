/* tok_vocab.c — loading a vocabulary from GGUF metadata: token texts, scores and types
 * checked and indexed, merges indexed by token pair (and by text when needed), special ids,
 * the end-of-generation / fill-in-the-middle tokens llama.cpp finds by their text, the
 * per-model attributes it sets, the special-token list and the decoded pieces; then the
 * look-ups the tokenizer's algorithms use (token by text, merge ranks) and the public getters.
 * Uses tok_util.c, and tok_pre.c to compile a BPE vocabulary's pre-tokenizer.
 *
 * The rules follow llama.cpp's llama-vocab.cpp (read for its behaviour, not copied). Every
 * count and id from the file is checked before use; a refusal names the key, the value and
 * the limit. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "model/internal.h"
#include "model/tok_internal.h"
#include "util/util.h"

/* ---------------------------------------------------------------- hashing */

static uint64_t hash_bytes(const char *s, size_t n, uint64_t seed)
{
    uint64_t h = seed * 0x9E3779B97F4A7C15ull ^ (uint64_t)n * 0xC2B2AE3D27D4EB4Full;
    while (n >= 8) {
        uint64_t k;
        memcpy(&k, s, 8);
        h = (h ^ k) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    uint64_t k = 0;
    memcpy(&k, s, n);
    h = (h ^ k) * 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 29;
    h *= 0x94D049BB133111EBull;
    h ^= h >> 31;
    return h;
}

static uint32_t table_size(uint32_t n)
{
    uint32_t sz = 16;
    while (sz < n * 2u)
        sz <<= 1;
    return sz;
}

int32_t tok_find(const struct model_vocab *v, const char *s, size_t n)
{
    uint64_t h = hash_bytes(s, n, 0), tag = h >> 32 << 32;
    uint32_t i = (uint32_t)h & v->tmap_mask;
    for (;;) {
        uint64_t e = v->tmap[i];
        if (!e)
            return -1;
        /* the stored hash bits spare most mismatching probes a look at the text */
        if ((e & 0xFFFFFFFF00000000ull) == tag) {
            const struct tok_token *t = &v->tok[(uint32_t)e - 1];
            if (t->len == n && !memcmp(v->pool.s + t->off, s, n))
                return (int32_t)((uint32_t)e - 1);
        }
        i = (i + 1) & v->tmap_mask;
    }
}

/* Insert id (its text already in the pool); a later id with the same text replaces the
 * earlier one, as llama.cpp's token_to_id map does. */
static void tok_index(struct model_vocab *v, uint32_t id)
{
    const struct tok_token *t = &v->tok[id];
    uint64_t h = hash_bytes(v->pool.s + t->off, t->len, 0), tag = h >> 32 << 32;
    uint32_t i = (uint32_t)h & v->tmap_mask;
    for (;;) {
        uint64_t e = v->tmap[i];
        if (!e) {
            v->tmap[i] = tag | (id + 1);
            return;
        }
        const struct tok_token *o = &v->tok[(uint32_t)e - 1];
        if ((e & 0xFFFFFFFF00000000ull) == tag && o->len == t->len &&
            !memcmp(v->pool.s + o->off, v->pool.s + t->off, t->len)) {
            v->tmap[i] = tag | (id + 1);
            return;
        }
        i = (i + 1) & v->tmap_mask;
    }
}

int32_t tok_merge_rank(const struct model_vocab *v, const char *a, size_t alen, size_t blen)
{
    if (!v->mmap)
        return -1;
    size_t n = alen + blen;
    uint32_t i = (uint32_t)hash_bytes(a, n, alen) & v->mmap_mask;
    for (;;) {
        uint32_t e = v->mmap[i];
        if (!e)
            return -1;
        const struct tok_merge *m = &v->merges[e - 1];
        if (m->first_len == alen && m->second_len == blen && !memcmp(v->pool.s + m->off, a, n))
            return (int32_t)m->rank;
        i = (i + 1) & v->mmap_mask;
    }
}

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    x *= 0xC4CEB9FE1A85EC53ull;
    x ^= x >> 33;
    return x;
}

int32_t tok_pair_rank(const struct model_vocab *v, int32_t a, int32_t b)
{
    if (!v->pairs)
        return -1;
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint32_t i = (uint32_t)mix64(key) & v->pairs_mask;
    for (;;) {
        const struct tok_pair *p = &v->pairs[i];
        if (p->rank < 0)
            return -1;
        if (p->key == key)
            return p->rank;
        i = (i + 1) & v->pairs_mask;
    }
}

static void pair_index(struct model_vocab *v, int32_t a, int32_t b, int32_t rank)
{
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint32_t i = (uint32_t)mix64(key) & v->pairs_mask;
    for (;;) {
        struct tok_pair *p = &v->pairs[i];
        if (p->rank < 0) {
            p->key = key;
            p->rank = rank;
            return;
        }
        if (p->key == key)
            return; /* the first merge of a pair keeps its rank */
        i = (i + 1) & v->pairs_mask;
    }
}

/* The first merge of a pair keeps its rank (llama.cpp emplaces). */
static void merge_index(struct model_vocab *v, uint32_t idx)
{
    const struct tok_merge *m = &v->merges[idx];
    size_t n = (size_t)m->first_len + m->second_len;
    uint32_t i = (uint32_t)hash_bytes(v->pool.s + m->off, n, m->first_len) & v->mmap_mask;
    for (;;) {
        uint32_t e = v->mmap[i];
        if (!e) {
            v->mmap[i] = idx + 1;
            return;
        }
        const struct tok_merge *o = &v->merges[e - 1];
        if (o->first_len == m->first_len && o->second_len == m->second_len &&
            !memcmp(v->pool.s + o->off, v->pool.s + m->off, n))
            return;
        i = (i + 1) & v->mmap_mask;
    }
}

static int pool_add(struct model_vocab *v, const void *s, size_t n, uint32_t *off)
{
    if (n > TOK_MAX_TEXT)
        return -EINVAL;
    size_t at = v->pool.len;
    int rc = util_buf_append(&v->pool, s, n, TOK_POOL_MAX);
    if (rc)
        return rc;
    *off = (uint32_t)at;
    return 0;
}

/* ---------------------------------------------------------------- metadata helpers */

static size_t elem_size(uint32_t t)
{
    switch (t) {
    case GGUF_V_U8: case GGUF_V_I8: case GGUF_V_BOOL: return 1;
    case GGUF_V_U16: case GGUF_V_I16: return 2;
    case GGUF_V_U32: case GGUF_V_I32: case GGUF_V_F32: return 4;
    case GGUF_V_U64: case GGUF_V_I64: case GGUF_V_F64: return 8;
    default: return 0;
    }
}

/* Integer element i of a fixed-size integer array, as int64 (u64 above INT64_MAX clamps). */
static int64_t arr_int(const struct gguf_value *a, uint64_t i)
{
    const unsigned char *p = (const unsigned char *)a->v.arr.data + i * elem_size(a->v.arr.type);
    switch (a->v.arr.type) {
    case GGUF_V_U8: return p[0];
    case GGUF_V_I8: return (int8_t)p[0];
    case GGUF_V_U16: { uint16_t x; memcpy(&x, p, 2); return x; }
    case GGUF_V_I16: { int16_t x; memcpy(&x, p, 2); return x; }
    case GGUF_V_U32: { uint32_t x; memcpy(&x, p, 4); return x; }
    case GGUF_V_I32: { int32_t x; memcpy(&x, p, 4); return x; }
    case GGUF_V_U64: { uint64_t x; memcpy(&x, p, 8); return x > INT64_MAX ? INT64_MAX : (int64_t)x; }
    case GGUF_V_I64: { int64_t x; memcpy(&x, p, 8); return x; }
    default: return 0;
    }
}

static bool is_int_type(uint32_t t)
{
    return t == GGUF_V_U8 || t == GGUF_V_I8 || t == GGUF_V_U16 || t == GGUF_V_I16 ||
           t == GGUF_V_U32 || t == GGUF_V_I32 || t == GGUF_V_U64 || t == GGUF_V_I64;
}

static bool is_float_type(uint32_t t)
{
    return t == GGUF_V_F32 || t == GGUF_V_F64;
}

/* An optional array with one entry per token (n of them), of a type that ok accepts (what
 * names that kind in the message): 0 with *out set, or NULL when the key is absent; -EINVAL
 * with err for any other type or length. */
static int get_token_arr(const struct gguf_file *f, const char *key, uint64_t n,
                         bool (*ok)(uint32_t), const char *what, const struct gguf_value **out,
                         char *err, size_t errlen)
{
    const struct gguf_value *a;
    int rc = gguf_get_arr(f, key, &a);
    *out = NULL;
    if (rc == -ENOENT)
        return 0;
    if (rc) {
        util_seterr(err, errlen, "%s: unreadable (%d)", key, rc);
        return -EINVAL;
    }
    if (a->type != GGUF_V_ARRAY || !ok(a->v.arr.type) || (a->v.arr.n && !a->v.arr.data)) {
        util_seterr(err, errlen, "%s: not an array of %s", key, what);
        return -EINVAL;
    }
    if (a->v.arr.n != n) {
        util_seterr(err, errlen, "%s: %llu entries for %llu tokens", key,
                      (unsigned long long)a->v.arr.n, (unsigned long long)n);
        return -EINVAL;
    }
    *out = a;
    return 0;
}

/* A string array under key: 0, -ENOENT, or -EINVAL with err. */
static int get_str_arr(const struct gguf_file *f, const char *key, const struct gguf_value **out,
                       char *err, size_t errlen)
{
    int rc = gguf_get_arr(f, key, out);
    if (rc == -ENOENT)
        return rc;
    if (rc < 0 || (*out)->type != GGUF_V_ARRAY || (*out)->v.arr.type != GGUF_V_STRING ||
        ((*out)->v.arr.n && !(*out)->v.arr.items)) {
        util_seterr(err, errlen, "%s: not an array of strings", key);
        return -EINVAL;
    }
    return 0;
}

/* An optional bool flag; a present key of another type is an error. */
static int get_flag(const struct gguf_file *f, const char *key, bool *val, char *err, size_t errlen)
{
    bool b;
    int rc = gguf_get_bool(f, key, &b);
    if (rc == -ENOENT)
        return 0;
    if (rc < 0) {
        util_seterr(err, errlen, "%s: not a bool", key);
        return -EINVAL;
    }
    *val = b;
    return 0;
}

/* An optional token id. -1 / 0xFFFFFFFF mean "none given" (llama.cpp then keeps its default,
 * as for stories260K's padding id); any other id past the vocabulary is an error. */
static int get_id(const struct gguf_file *f, const char *key, uint32_t n_tokens, int32_t *id,
                  char *err, size_t errlen)
{
    const struct gguf_kv *kv = gguf_kv_find(f, key);
    if (!kv)
        return 0;
    int64_t x;
    if (!is_int_type(kv->val.type) || gguf_get_i64(f, key, &x) < 0) {
        util_seterr(err, errlen, "%s: not an integer token id", key);
        return -EINVAL;
    }
    if (x == -1 || x == (int64_t)UINT32_MAX)
        return 0;
    if (x < 0 || x >= (int64_t)n_tokens) {
        util_seterr(err, errlen, "%s: id %lld out of range (vocabulary has %u tokens)", key,
                      (long long)x, n_tokens);
        return -EINVAL;
    }
    *id = (int32_t)x;
    return 0;
}

/* ---------------------------------------------------------------- pre-tokenizer names */

struct pre_name {
    const char *name;
    enum tok_pre pre;
    int8_t clean_spaces;   /* -1 keep the BPE default (true) */
    int8_t ignore_merges;
    int8_t add_bos;
};

/* tokenizer.ggml.pre values llama.cpp knows, with the flags it sets for each. */
static const struct pre_name pre_names[] = {
    {"default",          TOK_PRE_DEFAULT,        -1, 0, -1},
    {"llama3",           TOK_PRE_LLAMA3,         -1, 1, 1},
    {"llama-v3",         TOK_PRE_LLAMA3,         -1, 1, 1},
    {"llama-bpe",        TOK_PRE_LLAMA3,         -1, 1, 1},
    {"falcon3",          TOK_PRE_LLAMA3,         -1, 1, 1},
    {"falcon-h1",        TOK_PRE_LLAMA3,         -1, 1, 1},
    {"pixtral",          TOK_PRE_LLAMA3,         -1, 1, 1},
    {"midm-2.0",         TOK_PRE_LLAMA3,         -1, 1, 1},
    {"lfm2",             TOK_PRE_LLAMA3,         -1, 1, 1},
    {"jina-v5-nano",     TOK_PRE_LLAMA3,         -1, 1, 1},
    {"dbrx",             TOK_PRE_LLAMA3,         -1, 0, -1},
    {"smaug-bpe",        TOK_PRE_LLAMA3,         -1, 0, -1},
    {"deepseek-llm",     TOK_PRE_DEEPSEEK_LLM,    0, 0, -1},
    {"deepseek-coder",   TOK_PRE_DEEPSEEK_CODER,  0, 0, -1},
    {"deepseek-v3",      TOK_PRE_DEEPSEEK3_LLM,   0, 0, -1},
    {"hunyuan-dense",    TOK_PRE_DEEPSEEK3_LLM,   0, 0, -1},
    {"joyai-llm",        TOK_PRE_DEEPSEEK3_LLM,   0, 0, -1},
    {"falcon",           TOK_PRE_FALCON,         -1, 0, -1},
    {"mpt",              TOK_PRE_GPT2,           -1, 0, -1},
    {"starcoder",        TOK_PRE_STARCODER,      -1, 0, -1},
    {"refact",           TOK_PRE_STARCODER,      -1, 0, -1},
    {"command-r",        TOK_PRE_STARCODER,       0, 0, -1},
    {"smollm",           TOK_PRE_STARCODER,       0, 0, -1},
    {"codeshell",        TOK_PRE_STARCODER,      -1, 0, -1},
    {"exaone",           TOK_PRE_STARCODER,      -1, 0, -1},
    {"minerva-7b",       TOK_PRE_STARCODER,      -1, 0, -1},
    {"mellum2",          TOK_PRE_STARCODER,      -1, 0, -1},
    {"gpt-2",            TOK_PRE_GPT2,           -1, 0, -1},
    {"phi-2",            TOK_PRE_GPT2,           -1, 0, -1},
    {"jina-es",          TOK_PRE_GPT2,           -1, 0, -1},
    {"jina-de",          TOK_PRE_GPT2,           -1, 0, -1},
    {"gigachat",         TOK_PRE_GPT2,           -1, 0, -1},
    {"jina-v1-en",       TOK_PRE_GPT2,           -1, 0, -1},
    {"jina-v2-es",       TOK_PRE_GPT2,           -1, 0, -1},
    {"jina-v2-de",       TOK_PRE_GPT2,           -1, 0, -1},
    {"jina-v2-code",     TOK_PRE_GPT2,           -1, 0, -1},
    {"roberta-bpe",      TOK_PRE_GPT2,           -1, 0, -1},
    {"a.x-4.0",          TOK_PRE_GPT2,           -1, 0, -1},
    {"mellum",           TOK_PRE_GPT2,           -1, 0, -1},
    {"modern-bert",      TOK_PRE_GPT2,           -1, 0, -1},
    {"exaone4",          TOK_PRE_GPT2,           -1, 0, -1},
    {"olmo",             TOK_PRE_GPT2,           -1, 0, -1},
    {"jais",             TOK_PRE_GPT2,           -1, 0, -1},
    {"trillion",         TOK_PRE_GPT2,            0, 0, -1},
    {"granite-docling",  TOK_PRE_GPT2,            0, 0, -1},
    {"qwen2",            TOK_PRE_QWEN2,           0, 0, -1},
    {"deepseek-r1-qwen", TOK_PRE_QWEN2,           0, 0, -1},
    {"kormo",            TOK_PRE_QWEN2,           0, 0, -1},
    {"f2llmv2",          TOK_PRE_QWEN2,           0, 0, -1},
    {"hunyuan",          TOK_PRE_QWEN2,           0, 0, -1},
    {"solar-open",       TOK_PRE_QWEN2,           0, 0, -1},
    {"grok-2",           TOK_PRE_QWEN2,           0, 0, -1},
    {"megrez",           TOK_PRE_QWEN2,          -1, 0, -1},
    {"stablelm2",        TOK_PRE_QWEN2,          -1, 0, -1},
    {"qwen35",           TOK_PRE_QWEN35,          0, 0, -1},
    {"laguna",           TOK_PRE_LAGUNA,          0, 0, -1},
    {"bailingmoe",       TOK_PRE_BAILINGMOE,      0, 0, -1},
    {"bailingmoe2",      TOK_PRE_BAILINGMOE,      0, 0, -1},
    {"llada-moe",        TOK_PRE_BAILINGMOE,      0, 0, -1},
    {"seed-coder",       TOK_PRE_SEED_CODER,      0, 0, -1},
    {"minicpm5",         TOK_PRE_MINICPM5,       -1, 1, -1},
    {"poro-chat",        TOK_PRE_PORO,            0, 0, -1},
    {"bloom",            TOK_PRE_PORO,           -1, 0, -1},
    {"gpt3-finnish",     TOK_PRE_PORO,           -1, 0, -1},
    {"viking",           TOK_PRE_VIKING,          0, 0, -1},
    {"chatglm-bpe",      TOK_PRE_CHATGLM4,       -1, 0, -1},
    {"glm4",             TOK_PRE_CHATGLM4,       -1, 0, -1},
};

/* ---------------------------------------------------------------- special tokens by text */

/* End-of-turn, end-of-message, fill-in-the-middle and end-of-generation tokens llama.cpp
 * recognises by their text when the metadata does not name them. */
#define FW_BAR "\xEF\xBD\x9C"   /* U+FF5C, DeepSeek's fullwidth bar */
#define SP_MK "\xE2\x96\x81"    /* U+2581 */
static const char *const eot_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<" FW_BAR "end" SP_MK "of" SP_MK "sentence" FW_BAR ">",
    "<end_of_utterance>", NULL};
static const char *const eom_texts[] = {"<|eom_id|>", NULL};
static const char *const fim_pre_texts[] = {
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<" FW_BAR "fim" SP_MK "begin" FW_BAR ">",
    "<PRE>", SP_MK "<PRE>", "<|code_prefix|>", "<|prefix|>", NULL};
static const char *const fim_suf_texts[] = {
    "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<" FW_BAR "fim" SP_MK "hole" FW_BAR ">",
    "<SUF>", SP_MK "<SUF>", "<|code_suffix|>", "<|suffix|>", NULL};
static const char *const fim_mid_texts[] = {
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<" FW_BAR "fim" SP_MK "end" FW_BAR ">",
    "<MID>", SP_MK "<MID>", "<|code_middle|>", "<|middle|>", NULL};
static const char *const fim_pad_texts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL};
static const char *const fim_rep_texts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>",
                                             "<reponame>", NULL};
static const char *const fim_sep_texts[] = {"<|file_sep|>", NULL};
static const char *const eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<" FW_BAR "end" SP_MK "of" SP_MK "sentence" FW_BAR ">", "[e~[", NULL};
/* always rendered (llama.cpp's gpt-oss rule) */
static const char *const user_texts[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", NULL};

static int32_t find_str(const struct model_vocab *v, const char *s)
{
    return tok_find(v, s, strlen(s));
}

/* When id is still unset, take the first text of the list the vocabulary has, and make it a
 * control token (llama.cpp overrides a wrong type the same way). */
static void detect(struct model_vocab *v, int32_t *id, const char *const *texts)
{
    if (*id >= 0)
        return;
    for (; *texts; texts++) {
        int32_t t = find_str(v, *texts);
        if (t >= 0) {
            *id = t;
            v->tok[t].attr |= TOK_ATTR_CONTROL;
            return;
        }
    }
}

static void eog_set(struct model_vocab *v, int32_t id)
{
    if (id >= 0 && (uint32_t)id < v->n_tokens)
        v->eog[id >> 3] |= (uint8_t)(1u << (id & 7));
}

static void eog_clear(struct model_vocab *v, int32_t id)
{
    if (id >= 0 && (uint32_t)id < v->n_tokens)
        v->eog[id >> 3] &= (uint8_t)~(1u << (id & 7));
}

static bool eog_has_text(const struct model_vocab *v, const char *s, int32_t *id)
{
    int32_t t = find_str(v, s);
    if (t >= 0 && model_vocab_is_eog(v, t)) {
        if (id)
            *id = t;
        return true;
    }
    return false;
}

static int cmp_special(const void *a, const void *b, void *ud)
{
    const struct model_vocab *v = ud;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = v->tok[x].len, ly = v->tok[y].len;
    if (lx != ly)
        return lx > ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* ---------------------------------------------------------------- pieces */

/* "<0xHH>" -> byte, or -1. */
static int byte_token_value(const char *s, size_t n)
{
    if (n != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>')
        return -1;
    int h = util_hex_digit(s[3]), l = util_hex_digit(s[4]);
    return h < 0 || l < 0 ? -1 : h * 16 + l;
}

/* The piece of token id with special = true (llama.cpp's token_to_piece cache). */
static int make_piece(const struct model_vocab *v, uint32_t id, struct util_buf *b)
{
    const struct tok_token *t = &v->tok[id];
    const char *s = v->pool.s + t->off;
    size_t n = t->len;
    if (t->attr & (TOK_ATTR_UNKNOWN | TOK_ATTR_CONTROL | TOK_ATTR_USER_DEFINED))
        return util_buf_append(b, s, n, SIZE_MAX);
    if (v->type == MODEL_VOCAB_SPM) {
        if (t->attr & TOK_ATTR_NORMAL) {
            for (size_t i = 0; i < n;) {
                if (i + 3 <= n && !memcmp(s + i, "\xE2\x96\x81", 3)) {
                    if (util_buf_append(b, " ", 1, SIZE_MAX)) return -ENOMEM;
                    i += 3;
                } else {
                    if (util_buf_append(b, s + i, 1, SIZE_MAX)) return -ENOMEM;
                    i++;
                }
            }
            return 0;
        }
        if (t->attr & TOK_ATTR_BYTE) {
            char c = (char)byte_token_value(s, n);
            return util_buf_append(b, &c, 1, SIZE_MAX);
        }
        return 0;
    }
    if (!(t->attr & TOK_ATTR_NORMAL))
        return 0;
    /* BPE: every codepoint of the text stands for one byte. */
    for (size_t i = 0; i < n;) {
        uint32_t cp = 0xFFFD;
        size_t k = tok_utf8_decode((const unsigned char *)s + i, n - i, &cp);
        if (!k) {
            k = 1;
            cp = 0xFFFD;
        }
        int byte = cp <= 0x10FFFF ? tok_cp_byte(cp) : -1;
        if (byte >= 0) {
            char c = (char)byte;
            if (util_buf_append(b, &c, 1, SIZE_MAX)) return -ENOMEM;
        } else {
            /* llama.cpp writes the codepoint's bytes and the whole text in brackets */
            char u[4], hx[16];
            size_t ul = cp <= 0x10FFFF ? tok_utf8_put(cp, u) : 0;
            if (util_buf_append(b, "[UNK_BYTE_0x", 12, SIZE_MAX)) return -ENOMEM;
            for (size_t j = 0; j < ul; j++) {
                snprintf(hx, sizeof hx, "%02x", (unsigned char)u[j]);
                if (util_buf_append(b, hx, 2, SIZE_MAX)) return -ENOMEM;
            }
            if (util_buf_append(b, s, n, SIZE_MAX) || util_buf_append(b, "]", 1, SIZE_MAX))
                return -ENOMEM;
        }
        i += k;
    }
    return 0;
}

/* ---------------------------------------------------------------- loading */

static bool has_substr_ci(const char *hay, const char *needle)
{
    size_t hn = strlen(hay), nn = strlen(needle);
    for (size_t i = 0; i + nn <= hn; i++) {
        size_t j = 0;
        while (j < nn && tolower((unsigned char)hay[i + j]) == needle[j])
            j++;
        if (j == nn)
            return true;
    }
    return false;
}

static void set_attr_by_text(struct model_vocab *v, const char *s, uint16_t bit, bool on)
{
    int32_t id = find_str(v, s);
    if (id < 0)
        return;
    if (on)
        v->tok[id].attr |= bit;
    else
        v->tok[id].attr &= (uint16_t)~bit;
}

static int load_tokens(struct model_vocab *v, const struct gguf_file *f, char *err, size_t errlen)
{
    const struct gguf_value *toks, *scores = NULL, *types = NULL;
    int rc = get_str_arr(f, "tokenizer.ggml.tokens", &toks, err, errlen);
    if (rc == -ENOENT) {
        util_seterr(err, errlen, "tokenizer.ggml.tokens: missing (no vocabulary in this file)");
        return -EINVAL;
    }
    if (rc)
        return rc;
    uint64_t n = toks->v.arr.n;
    if (n == 0 || n > TOK_MAX_TOKENS) {
        util_seterr(err, errlen, "tokenizer.ggml.tokens: %llu tokens (must be 1..%u)",
                      (unsigned long long)n, TOK_MAX_TOKENS);
        return -EINVAL;
    }
    if ((rc = get_token_arr(f, "tokenizer.ggml.scores", n, is_float_type, "floats", &scores, err,
                            errlen)) ||
        (rc = get_token_arr(f, "tokenizer.ggml.token_type", n, is_int_type, "integers", &types, err,
                            errlen)))
        return rc;

    v->n_tokens = (uint32_t)n;
    v->tok = calloc(n, sizeof *v->tok);
    v->tmap_mask = table_size((uint32_t)n) - 1;
    v->tmap = calloc((size_t)v->tmap_mask + 1, sizeof *v->tmap);
    v->eog = calloc((n + 7) / 8, 1);
    if (!v->tok || !v->tmap || !v->eog)
        return -ENOMEM;
    for (uint32_t i = 0; i < n; i++) {
        const struct gguf_value *it = &toks->v.arr.items[i];
        if (it->type != GGUF_V_STRING || (it->v.str.len && !it->v.str.p)) {
            util_seterr(err, errlen, "tokenizer.ggml.tokens[%u]: not a string", i);
            return -EINVAL;
        }
        if (it->v.str.len > TOK_MAX_TEXT) {
            util_seterr(err, errlen, "tokenizer.ggml.tokens[%u]: %llu bytes (limit %u)", i,
                          (unsigned long long)it->v.str.len, TOK_MAX_TEXT);
            return -EINVAL;
        }
        struct tok_token *t = &v->tok[i];
        if (it->v.str.len == 0) {
            char tmp[32];
            int k = snprintf(tmp, sizeof tmp, "[EMPTY_%u]", i);
            rc = pool_add(v, tmp, (size_t)k, &t->off);
            t->len = (uint32_t)k;
        } else {
            rc = pool_add(v, it->v.str.p, (size_t)it->v.str.len, &t->off);
            t->len = (uint32_t)it->v.str.len;
        }
        if (rc) {
            util_seterr(err, errlen, "tokenizer.ggml.tokens: text pool too large");
            return rc;
        }
        if (scores) {
            if (scores->v.arr.type == GGUF_V_F32) {
                float s;
                memcpy(&s, (const char *)scores->v.arr.data + 4 * (size_t)i, 4);
                t->score = s;
            } else {
                double s;
                memcpy(&s, (const char *)scores->v.arr.data + 8 * (size_t)i, 8);
                t->score = (float)s;
            }
        }
        t->attr = TOK_ATTR_NORMAL;
        if (types) {
            switch (arr_int(types, i)) {
            case 1: t->attr = TOK_ATTR_NORMAL; break;
            case 2: t->attr = TOK_ATTR_UNKNOWN; break;
            case 3: t->attr = TOK_ATTR_CONTROL; break;
            case 4: t->attr = TOK_ATTR_USER_DEFINED; break;
            case 5: t->attr = TOK_ATTR_UNUSED; break;
            case 6: t->attr = TOK_ATTR_BYTE; break;
            default: t->attr = TOK_ATTR_UNDEFINED; break;
            }
        }
        if (v->type == MODEL_VOCAB_SPM && (t->attr & TOK_ATTR_BYTE) &&
            byte_token_value(v->pool.s + t->off, t->len) < 0) {
            util_seterr(err, errlen, "tokenizer.ggml.tokens[%u]: byte token '%.*s' is not <0xHH>", i,
                          (int)(t->len > 32 ? 32 : t->len), v->pool.s + t->off);
            return -EINVAL;
        }
        tok_index(v, i);
    }
    return 0;
}

static int load_merges(struct model_vocab *v, const struct gguf_file *f, char *err, size_t errlen)
{
    const struct gguf_value *m;
    int rc = get_str_arr(f, "tokenizer.ggml.merges", &m, err, errlen);
    if (rc == -ENOENT) {
        util_seterr(err, errlen, "tokenizer.ggml.merges: missing (a gpt2 BPE vocabulary needs its merges)");
        return -EINVAL;
    }
    if (rc)
        return rc;
    uint64_t n = m->v.arr.n;
    if (n > TOK_MAX_MERGES) {
        util_seterr(err, errlen, "tokenizer.ggml.merges: %llu merges (limit %u)",
                      (unsigned long long)n, TOK_MAX_MERGES);
        return -EINVAL;
    }
    v->n_merges = (uint32_t)n;
    v->merges = calloc(n ? n : 1, sizeof *v->merges);
    v->mmap_mask = table_size((uint32_t)n) - 1;
    v->mmap = calloc((size_t)v->mmap_mask + 1, sizeof *v->mmap);
    v->pairs_mask = v->mmap_mask;
    v->pairs = malloc(((size_t)v->pairs_mask + 1) * sizeof *v->pairs);
    if (!v->merges || !v->mmap || !v->pairs)
        return -ENOMEM;
    for (size_t i = 0; i <= v->pairs_mask; i++)
        v->pairs[i] = (struct tok_pair){0, -1};
    for (uint32_t i = 0; i < n; i++) {
        const struct gguf_value *it = &m->v.arr.items[i];
        if (it->type != GGUF_V_STRING || (it->v.str.len && !it->v.str.p)) {
            util_seterr(err, errlen, "tokenizer.ggml.merges[%u]: not a string", i);
            return -EINVAL;
        }
        const char *s = it->v.str.p;
        size_t len = (size_t)it->v.str.len;
        if (len > TOK_MAX_TEXT) {
            util_seterr(err, errlen, "tokenizer.ggml.merges[%u]: %zu bytes (limit %u)", i, len, TOK_MAX_TEXT);
            return -EINVAL;
        }
        /* "first second", split at the first space after the first byte */
        const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
        if (!sp) {
            util_seterr(err, errlen, "tokenizer.ggml.merges[%u]: '%.*s' has no space between the pair",
                          i, (int)(len > 40 ? 40 : len), s);
            return -EINVAL;
        }
        struct tok_merge *mg = &v->merges[i];
        mg->first_len = (uint32_t)(sp - s);
        mg->second_len = (uint32_t)(len - mg->first_len - 1);
        mg->rank = i;
        uint32_t off2;
        if (pool_add(v, s, mg->first_len, &mg->off) ||
            pool_add(v, sp + 1, mg->second_len, &off2)) {
            util_seterr(err, errlen, "tokenizer.ggml.merges: text pool too large");
            return -ENOMEM;
        }
        (void)off2; /* second follows first in the pool */
        const char *t = v->pool.s + mg->off;
        int32_t a = tok_find(v, t, mg->first_len), b = tok_find(v, t + mg->first_len, mg->second_len);
        mg->result = tok_find(v, t, (size_t)mg->first_len + mg->second_len);
        if (a >= 0 && b >= 0)
            pair_index(v, a, b, (int32_t)i);
        else
            v->text_merges = true;
    }
    /* the index by text is needed only for merges of texts that are no tokens */
    if (v->text_merges)
        for (uint32_t i = 0; i < n; i++)
            merge_index(v, i);
    return 0;
}

int model_vocab_load(struct model_vocab **out, const struct gguf_file *f, char *err, size_t errlen)
{
    char model[64];
    int rc;
    *out = NULL;
    rc = gguf_get_str(f, "tokenizer.ggml.model", model, sizeof model);
    if (rc == -ENOENT) {
        util_seterr(err, errlen, "tokenizer.ggml.model: missing (no vocabulary in this file)");
        return -EINVAL;
    }
    if (rc < 0) {
        util_seterr(err, errlen, "tokenizer.ggml.model: not a short string");
        return -EINVAL;
    }
    struct model_vocab *v = calloc(1, sizeof *v);
    if (!v)
        return -ENOMEM;
    v->bos = v->eos = v->eot = v->eom = v->unk = v->sep = v->pad = v->mask = -1;
    v->fim_pre = v->fim_suf = v->fim_mid = v->fim_pad = v->fim_rep = v->fim_sep = -1;
    snprintf(v->pre_name, sizeof v->pre_name, "default");

    if (!strcmp(model, "llama")) {
        v->type = MODEL_VOCAB_SPM;
        v->bos = 1; v->eos = 2; v->unk = 0;
        v->add_space_prefix = true;
        v->add_bos = true;
    } else if (!strcmp(model, "gpt2")) {
        v->type = MODEL_VOCAB_BPE;
        v->bos = 11; v->eos = 11;
        v->clean_spaces = true;
        char pre[64];
        rc = gguf_get_str(f, "tokenizer.ggml.pre", pre, sizeof pre);
        if (rc == 0) {
            snprintf(v->pre_name, sizeof v->pre_name, "%s", pre);
        } else if (rc == -ENAMETOOLONG) {
            util_seterr(err, errlen, "tokenizer.ggml.pre: unknown pre-tokenizer type (name longer than %zu bytes)",
                          sizeof pre - 1);
            rc = -ENOTSUP;
            goto fail;
        } else if (rc != -ENOENT) {
            util_seterr(err, errlen, "tokenizer.ggml.pre: not a string");
            rc = -EINVAL;
            goto fail;
        }
        /* absent: llama.cpp falls back to "default" with a warning */
        const struct pre_name *pn = NULL;
        for (size_t i = 0; i < sizeof pre_names / sizeof pre_names[0]; i++)
            if (!strcmp(pre_names[i].name, v->pre_name))
                pn = &pre_names[i];
        if (!pn) {
            util_seterr(err, errlen, "tokenizer.ggml.pre: unknown pre-tokenizer type '%s'", v->pre_name);
            rc = -ENOTSUP;
            goto fail;
        }
        v->pre = pn->pre;
        if (pn->clean_spaces >= 0) v->clean_spaces = pn->clean_spaces;
        if (pn->ignore_merges > 0) v->ignore_merges = true;
        if (pn->add_bos >= 0) v->add_bos = pn->add_bos;
        if (pn->pre == TOK_PRE_CHATGLM4)
            v->bos = -1;
    } else if (!strcmp(model, "bert")) {
        util_seterr(err, errlen, "tokenizer.ggml.model: 'bert' (WordPiece) vocabularies are not supported");
        rc = -ENOTSUP;
        goto fail;
    } else if (!strcmp(model, "t5") || !strcmp(model, "rwkv") || !strcmp(model, "plamo2") ||
               !strcmp(model, "no_vocab") || !strcmp(model, "none")) {
        util_seterr(err, errlen, "tokenizer.ggml.model: '%s' vocabularies are not supported", model);
        rc = -ENOTSUP;
        goto fail;
    } else {
        util_seterr(err, errlen, "tokenizer.ggml.model: unknown tokenizer '%s'", model);
        rc = -ENOTSUP;
        goto fail;
    }

    if ((rc = get_flag(f, "tokenizer.ggml.add_space_prefix", &v->add_space_prefix, err, errlen)))
        goto fail;
    if ((rc = load_tokens(v, f, err, errlen)))
        goto fail;
    if (v->type == MODEL_VOCAB_BPE && (rc = load_merges(v, f, err, errlen)))
        goto fail;

    /* the defaults above may not exist in a small vocabulary */
    int32_t *defaults[] = {&v->bos, &v->eos, &v->unk, &v->pad};
    for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
        if (*defaults[i] >= (int32_t)v->n_tokens)
            *defaults[i] = -1;

    static const struct { const char *key; size_t off; } ids[] = {
        {"tokenizer.ggml.bos_token_id", offsetof(struct model_vocab, bos)},
        {"tokenizer.ggml.eos_token_id", offsetof(struct model_vocab, eos)},
        {"tokenizer.ggml.eot_token_id", offsetof(struct model_vocab, eot)},
        {"tokenizer.ggml.eom_token_id", offsetof(struct model_vocab, eom)},
        {"tokenizer.ggml.unknown_token_id", offsetof(struct model_vocab, unk)},
        {"tokenizer.ggml.seperator_token_id", offsetof(struct model_vocab, sep)},
        {"tokenizer.ggml.padding_token_id", offsetof(struct model_vocab, pad)},
        {"tokenizer.ggml.mask_token_id", offsetof(struct model_vocab, mask)},
        {"tokenizer.ggml.fim_pre_token_id", offsetof(struct model_vocab, fim_pre)},
        {"tokenizer.ggml.fim_suf_token_id", offsetof(struct model_vocab, fim_suf)},
        {"tokenizer.ggml.fim_mid_token_id", offsetof(struct model_vocab, fim_mid)},
        {"tokenizer.ggml.fim_pad_token_id", offsetof(struct model_vocab, fim_pad)},
        {"tokenizer.ggml.fim_rep_token_id", offsetof(struct model_vocab, fim_rep)},
        {"tokenizer.ggml.fim_sep_token_id", offsetof(struct model_vocab, fim_sep)},
        {"tokenizer.ggml.prefix_token_id", offsetof(struct model_vocab, fim_pre)},
        {"tokenizer.ggml.suffix_token_id", offsetof(struct model_vocab, fim_suf)},
        {"tokenizer.ggml.middle_token_id", offsetof(struct model_vocab, fim_mid)},
    };
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
        if ((rc = get_id(f, ids[i].key, v->n_tokens, (int32_t *)((char *)v + ids[i].off), err, errlen)))
            goto fail;
    if ((rc = get_flag(f, "tokenizer.ggml.add_bos_token", &v->add_bos, err, errlen)) ||
        (rc = get_flag(f, "tokenizer.ggml.add_eos_token", &v->add_eos, err, errlen)))
        goto fail;
    if (v->add_bos && v->bos < 0) {
        util_seterr(err, errlen, "tokenizer.ggml.add_bos_token: set but the vocabulary has no BOS token");
        rc = -EINVAL;
        goto fail;
    }
    if (v->add_eos && v->eos < 0) {
        util_seterr(err, errlen, "tokenizer.ggml.add_eos_token: set but the vocabulary has no EOS token");
        rc = -EINVAL;
        goto fail;
    }

    detect(v, &v->eot, eot_texts);
    detect(v, &v->eom, eom_texts);
    detect(v, &v->fim_pre, fim_pre_texts);
    detect(v, &v->fim_suf, fim_suf_texts);
    detect(v, &v->fim_mid, fim_mid_texts);
    detect(v, &v->fim_pad, fim_pad_texts);
    detect(v, &v->fim_rep, fim_rep_texts);
    detect(v, &v->fim_sep, fim_sep_texts);
    eog_set(v, v->fim_pad);
    eog_set(v, v->fim_rep);
    eog_set(v, v->fim_sep);
    for (const char *const *t = eog_texts; *t; t++) {
        int32_t id = find_str(v, *t);
        if (id >= 0) {
            eog_set(v, id);
            v->tok[id].attr |= TOK_ATTR_CONTROL;
        }
    }
    for (const char *const *t = user_texts; *t; t++) {
        int32_t id = find_str(v, *t);
        if (id >= 0)
            v->tok[id].attr = TOK_ATTR_USER_DEFINED;
    }
    eog_set(v, v->eos);
    eog_set(v, v->eot);
    eog_set(v, v->eom);
    {
        /* harmony-style vocabularies end a message with <|end|> but not the generation */
        int32_t end_id = -1;
        bool has_end = eog_has_text(v, "<|end|>", &end_id);
        bool has_return = eog_has_text(v, "<|return|>", NULL);
        bool has_call = eog_has_text(v, "<|call|>", NULL) || eog_has_text(v, "<|calls|>", NULL);
        bool has_flush = eog_has_text(v, "<|flush|>", NULL);
        if (has_end && ((has_return && has_call) || (has_call && has_flush))) {
            eog_clear(v, end_id);
            v->tok[end_id].attr = TOK_ATTR_USER_DEFINED;
        }
        /* and vocabularies with <|tool_response> do not end on </s> */
        int32_t s_id = -1;
        if (eog_has_text(v, "<|tool_response>", NULL) && eog_has_text(v, "</s>", &s_id)) {
            eog_clear(v, s_id);
            v->tok[s_id].attr = TOK_ATTR_NORMAL;
        }
    }

    /* special tokens, longest text first */
    v->special = malloc((size_t)v->n_tokens * sizeof *v->special);
    if (!v->special) {
        rc = -ENOMEM;
        goto fail;
    }
    for (uint32_t i = 0; i < v->n_tokens; i++)
        if (v->tok[i].attr & (TOK_ATTR_CONTROL | TOK_ATTR_USER_DEFINED | TOK_ATTR_UNKNOWN))
            v->special[v->n_special++] = (int32_t)i;
    qsort_r(v->special, v->n_special, sizeof *v->special, cmp_special, v);
    for (uint32_t i = 0; i < v->n_tokens; i++)
        v->tok[i].special_pos = -1;
    for (uint32_t i = 0; i < v->n_special; i++) {
        const struct tok_token *t = &v->tok[v->special[i]];
        v->tok[v->special[i]].special_pos = (int32_t)i;
        unsigned char c = (unsigned char)v->pool.s[t->off];
        v->special_first[1][c >> 3] |= (uint8_t)(1u << (c & 7));
        if (!(t->attr & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN)))
            v->special_first[0][c >> 3] |= (uint8_t)(1u << (c & 7));
        /* the prefilter finds specials by text: a text shared with another id defeats it */
        if (tok_find(v, v->pool.s + t->off, t->len) != v->special[i])
            v->special_lens_many = true;
        if (i == 0 || t->len != v->tok[v->special[i - 1]].len) {
            if (v->n_special_lens == sizeof v->special_lens / sizeof v->special_lens[0])
                v->special_lens_many = true;
            else
                v->special_lens[v->n_special_lens++] = t->len;
        }
    }

    /* per-model attributes llama.cpp sets by name */
    char name[256] = "";
    gguf_get_str(f, "general.name", name, sizeof name);
    char arch[64] = "";
    gguf_get_str(f, "general.architecture", arch, sizeof arch);
    if (strstr(v->pre_name, "jina-v2-de") || strstr(v->pre_name, "jina-v2-es") ||
        strstr(v->pre_name, "jina-v2-code") || strstr(arch, "nomic-bert-moe") ||
        strstr(arch, "jina-bert-v3")) {
        set_attr_by_text(v, "<mask>", TOK_ATTR_LSTRIP, true);
    } else if (has_substr_ci(name, "modern-bert")) {
        set_attr_by_text(v, "[MASK]", TOK_ATTR_LSTRIP, true);
    } else if (has_substr_ci(name, "phi-3") || has_substr_ci(name, "phi3")) {
        for (uint32_t i = 0; i < v->n_special; i++)
            v->tok[v->special[i]].attr |= TOK_ATTR_RSTRIP;
        set_attr_by_text(v, "</s>", TOK_ATTR_RSTRIP, true);
        set_attr_by_text(v, "<unk>", TOK_ATTR_RSTRIP, false);
        set_attr_by_text(v, "<s>", TOK_ATTR_RSTRIP, false);
        set_attr_by_text(v, "<|endoftext|>", TOK_ATTR_RSTRIP, false);
    }

    /* byte fallback table */
    for (int b = 0; b < 256; b++) {
        char s[8];
        if (v->type == MODEL_VOCAB_SPM) {
            snprintf(s, sizeof s, "<0x%02X>", b);
            int32_t id = tok_find(v, s, 6);
            if (id < 0) {
                s[0] = (char)b;
                id = tok_find(v, s, 1);
            }
            v->byte_tok[b] = id;
        } else {
            const struct tok_byte_enc *e = &tok_byte_table()[b];
            v->byte_tok[b] = tok_find(v, e->s, e->n);
        }
    }

    if (v->type == MODEL_VOCAB_BPE && (rc = tok_regex_new(&v->re, v->pre, v->pre_name, err, errlen)))
        goto fail;
    if (v->type == MODEL_VOCAB_SPM) {
        /* Words can be tokenised one by one when no token holds U+2581 after another
         * character: then no merge can join the end of one word to the next. */
        v->spm_cut = true;
        for (uint32_t i = 0; i < v->n_tokens && v->spm_cut; i++) {
            const char *t = v->pool.s + v->tok[i].off;
            size_t n = v->tok[i].len, k = 0;
            while (k + 3 <= n && !memcmp(t + k, "\xE2\x96\x81", 3))
                k += 3;
            for (; k + 3 <= n; k++)
                if (!memcmp(t + k, "\xE2\x96\x81", 3)) {
                    v->spm_cut = false;
                    break;
                }
        }
    }

    /* decoded pieces */
    {
        struct util_buf pb = {0};
        for (uint32_t i = 0; i < v->n_tokens; i++) {
            size_t before = pb.len;
            if (make_piece(v, i, &pb)) {
                util_buf_free(&pb);
                rc = -ENOMEM;
                goto fail;
            }
            if (pb.len > UINT32_MAX) {
                util_buf_free(&pb);
                util_seterr(err, errlen, "tokenizer.ggml.tokens: decoded pieces too large");
                rc = -E2BIG;
                goto fail;
            }
            v->tok[i].poff = (uint32_t)before;
            v->tok[i].plen = (uint32_t)(pb.len - before);
        }
        v->ppool = pb.p ? pb.s : malloc(1);
        v->ppool_len = pb.len;
        if (!v->ppool) {
            rc = -ENOMEM;
            goto fail;
        }
    }
    *out = v;
    return 0;
fail:
    model_vocab_free(v);
    return rc;
}

void model_vocab_free(struct model_vocab *v)
{
    if (!v)
        return;
    tok_regex_free(v->re);
    free(v->tok);
    util_buf_free(&v->pool);
    free(v->ppool);
    free(v->tmap);
    free(v->merges);
    free(v->mmap);
    free(v->pairs);
    free(v->special);
    free(v->eog);
    free(v);
}

/* ---------------------------------------------------------------- getters */

enum model_vocab_type model_vocab_get_type(const struct model_vocab *v) { return v->type; }
uint32_t model_vocab_n_tokens(const struct model_vocab *v) { return v->n_tokens; }
const char *model_vocab_pre(const struct model_vocab *v) { return v->pre_name; }
int32_t model_vocab_bos(const struct model_vocab *v) { return v->bos; }
int32_t model_vocab_eos(const struct model_vocab *v) { return v->eos; }
int32_t model_vocab_eot(const struct model_vocab *v) { return v->eot; }
int32_t model_vocab_pad(const struct model_vocab *v) { return v->pad; }
int32_t model_vocab_unk(const struct model_vocab *v) { return v->unk; }
bool model_vocab_add_bos(const struct model_vocab *v) { return v->add_bos; }
bool model_vocab_add_eos(const struct model_vocab *v) { return v->add_eos; }

bool model_vocab_is_eog(const struct model_vocab *v, int32_t id)
{
    return id >= 0 && (uint32_t)id < v->n_tokens && (v->eog[id >> 3] >> (id & 7) & 1);
}

bool model_vocab_is_control(const struct model_vocab *v, int32_t id)
{
    return id >= 0 && (uint32_t)id < v->n_tokens &&
           (v->tok[id].attr & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN));
}

const char *model_vocab_text(const struct model_vocab *v, int32_t id, size_t *len)
{
    if (id < 0 || (uint32_t)id >= v->n_tokens) {
        *len = 0;
        return NULL;
    }
    *len = v->tok[id].len;
    return v->pool.s + v->tok[id].off;
}

int32_t model_vocab_find(const struct model_vocab *v, const char *s, size_t len)
{
    return len > TOK_MAX_TEXT ? -1 : tok_find(v, s, len);
}

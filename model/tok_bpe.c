/* tok_bpe.c — byte-level BPE: the pre-tokenizer regexes (PCRE2, Unicode mode) and the merge
 * loop, as llama.cpp runs them.
 *
 * Pre-tokenisation applies a list of regexes in turn. Each regex runs over every piece the
 * previous ones left, on its own (so "end of subject" and lookaheads stop at the piece's end);
 * both the matches and the text between them become pieces. The patterns are llama.cpp's,
 * written for PCRE2 with two adjustments that keep its behaviour exact:
 *  - whitespace is llama.cpp's set (the Unicode White_Space property), spelled out as WS
 *    below, because PCRE2's \s in UCP mode differs by version (U+0085 in particular);
 *  - llama.cpp runs a regex without \p{..} classes on text where every non-ASCII whitespace
 *    character was replaced by a vertical tab, so such characters never match the explicit
 *    character ranges of those regexes (the CJK range U+0800-U+4E00 of deepseek spans some):
 *    the ranges below exclude them.
 * Invalid UTF-8 in the input becomes U+FFFD first, as llama.cpp's codepoint decoding does.
 *
 * Each piece is then turned into the byte-level alphabet (every byte one printable codepoint)
 * and merged: adjacent symbols whose pair has a merge rank are candidates, the lowest rank
 * (ties: leftmost) merges first, in a heap, O(n log n) per piece. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <errno.h>
#include <pcre2.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/tok_internal.h"

/* ---------------------------------------------------------------- patterns */

#define WS "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

/* the GPT-2 pattern: contractions, letters, digits, other, trailing whitespace */
#define RE_GPT2 \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS "\\p{L}\\p{N}]+|[" WS "]+(?![^" WS "])"

/* Llama 3 / Qwen 2: case-insensitive contractions, one optional non-letter before letters,
 * digits in runs of up to 3 (Llama 3) or one by one (Qwen 2), newlines kept with the
 * punctuation or whitespace before them. */
#define RE_LLAMA3_HEAD \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
#define RE_LLAMA3_TAIL \
    "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+"
#define RE_LLAMA3 RE_LLAMA3_HEAD "\\p{N}{1,3}" RE_LLAMA3_TAIL
#define RE_QWEN2  RE_LLAMA3_HEAD "\\p{N}" RE_LLAMA3_TAIL
#define RE_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
/* Qwen 3.5: combining marks count with the letters */
#define RE_QWEN35 \
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^" WS "\\p{L}\\p{M}\\p{N}]+[\\r\\n]*" \
    "|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+"
#define RE_BAILINGMOE \
    "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*" \
    "|[" WS "]*[\\r\\n]|[" WS "]+(?![^" WS "])|[" WS "]+"
#define RE_SEED_CODER \
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^" WS "\\p{L}\\p{N}\\r\\n]+" \
    "|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+"
#define RE_MINICPM5 RE_LLAMA3_HEAD "\\p{N}+" RE_LLAMA3_TAIL

/* CJK runs (U+4E00-U+9FA5, U+0800-U+4E00, U+AC00-U+D7FF), whitespace excluded */
#define RE_DEEPSEEK_CJK \
    "(?:(?![" WS "])[\\x{4E00}-\\x{9FA5}\\x{0800}-\\x{4E00}\\x{AC00}-\\x{D7FF}])++"

/* DeepSeek LLM's cased letters (its tokenizer lists them as ranges) */
#define RE_DEEPSEEK_LETTERS \
    "A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}" \
    "\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}" \
    "\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}" \
    "\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}" \
    "\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}" \
    "\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}" \
    "\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}" \
    "\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}" \
    "\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}" \
    "\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}" \
    "\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}" \
    "\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}" \
    "\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}" \
    "\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}" \
    "\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}" \
    "\\x{1E900}-\\x{1E943}"

/* Poro / BLOOM / GPT-3 Finnish: anything but whitespace and sentence punctuation (the
 * pattern's parentheses and bar are literal class members, as in the original) */
#define RE_PORO \
    " ?[^(" WS "|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{0964}\\x{06D4}\\x{060C})]+"

static const char *const pre_regexes[TOK_PRE_COUNT][TOK_MAX_REGEX] = {
    [TOK_PRE_DEFAULT] = {"[\\p{P}$+<=>^~|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"},
    [TOK_PRE_LLAMA3] = {RE_LLAMA3},
    [TOK_PRE_CHATGLM4] = {RE_LLAMA3},
    [TOK_PRE_QWEN2] = {RE_QWEN2},
    [TOK_PRE_GPT2] = {RE_GPT2},
    [TOK_PRE_STARCODER] = {"\\p{N}", RE_GPT2},
    [TOK_PRE_FALCON] = {"[\\p{P}$+<=>^~|`]+", RE_GPT2, "[0-9][0-9][0-9]"},
    [TOK_PRE_DEEPSEEK_CODER] = {"[\\r\\n]", "[" WS "]?\\p{L}+", "[" WS "]?\\p{P}+", RE_DEEPSEEK_CJK,
                                "\\p{N}"},
    [TOK_PRE_DEEPSEEK_LLM] = {
        "[\\r\\n]",
        "[" WS "]?[" RE_DEEPSEEK_LETTERS "]+",
        "[" WS "]?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3001}-\\x{3002}]+",
        "[" WS "]+\\z",
        RE_DEEPSEEK_CJK,
        "\\p{N}+"},
    /* DeepSeek V3: llama.cpp's symbol class lacks '~' (an ASCII symbol it does not list) */
    [TOK_PRE_DEEPSEEK3_LLM] = {
        "\\p{N}{1,3}",
        "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
        "|(?:~|[^\\r\\n\\p{L}\\p{P}\\p{S}])?[\\p{L}\\p{M}]+"
        "| ?(?:(?!~)[\\p{P}\\p{S}])++[\\r\\n]*|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+"},
    [TOK_PRE_QWEN35] = {RE_QWEN35},
    [TOK_PRE_LAGUNA] = {"[^\\n]+|[\\n]+", RE_QWEN2},
    [TOK_PRE_BAILINGMOE] = {RE_BAILINGMOE},
    [TOK_PRE_SEED_CODER] = {RE_SEED_CODER},
    [TOK_PRE_MINICPM5] = {"\\p{N}{1,3}", RE_MINICPM5},
    [TOK_PRE_PORO] = {RE_PORO},
    [TOK_PRE_VIKING] = {RE_PORO, "\\p{N}"},
};

struct tok_regex {
    unsigned n;
    pcre2_code *code[TOK_MAX_REGEX];
    bool jit[TOK_MAX_REGEX];
};

/* ---------------------------------------------------------------- byte-level alphabet */

/* GPT-2's map: printable Latin-1 bytes stand for themselves, the others (controls, space,
 * 0x7F-0xA0, 0xAD) for U+0100 onwards in byte order. */
static bool byte_printable(unsigned b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

/* Encoded forms of every byte and the way back, computed once. */
struct byte_enc {
    char s[2];
    uint8_t n;
};
static struct byte_enc enc_table[256];
static uint32_t enc_cp[256];
static int16_t dec_table[256 + 68];   /* codepoint -> byte for codepoints < 324, -1 none */
static pthread_once_t enc_once = PTHREAD_ONCE_INIT;

static void enc_init(void)
{
    uint32_t k = 0;
    for (unsigned i = 0; i < sizeof dec_table / sizeof dec_table[0]; i++)
        dec_table[i] = -1;
    for (unsigned b = 0; b < 256; b++) {
        uint32_t cp = byte_printable(b) ? b : 256 + k++;
        char buf[4];
        size_t n = tok_utf8_put(cp, buf);
        enc_cp[b] = cp;
        memcpy(enc_table[b].s, buf, n);
        enc_table[b].n = (uint8_t)n;
        dec_table[cp] = (int16_t)b;
    }
}

uint32_t tok_bpe_byte_cp(uint8_t b)
{
    pthread_once(&enc_once, enc_init);
    return enc_cp[b];
}

int tok_bpe_cp_byte(uint32_t cp)
{
    pthread_once(&enc_once, enc_init);
    return cp < sizeof dec_table / sizeof dec_table[0] ? dec_table[cp] : -1;
}

/* ---------------------------------------------------------------- init */

int tok_bpe_init(struct model_vocab *v, char *err, size_t errlen)
{
    pthread_once(&enc_once, enc_init);
    struct tok_regex *re = calloc(1, sizeof *re);
    if (!re)
        return -ENOMEM;
    v->re = re;
    for (unsigned i = 0; i < TOK_MAX_REGEX && pre_regexes[v->pre][i]; i++) {
        const char *pat = pre_regexes[v->pre][i];
        int ec;
        PCRE2_SIZE eo;
        pcre2_code *c = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                      &ec, &eo, NULL);
        if (!c) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(ec, msg, sizeof msg);
            snprintf(err, errlen, "pre-tokenizer '%s': regex %u does not compile at %zu: %s",
                     v->pre_name, i, (size_t)eo, (const char *)msg);
            return -EINVAL;
        }
        re->code[i] = c;
        re->jit[i] = pcre2_jit_compile(c, PCRE2_JIT_COMPLETE) == 0;
        re->n = i + 1;
    }
    return 0;
}

void tok_bpe_free(struct model_vocab *v)
{
    if (!v->re)
        return;
    for (unsigned i = 0; i < v->re->n; i++)
        pcre2_code_free(v->re->code[i]);
    free(v->re);
    v->re = NULL;
}

/* ---------------------------------------------------------------- UTF-8 clean-up */

/* Is s[0..n) valid UTF-8 that PCRE2 accepts (no overlongs, surrogates, > U+10FFFF)? */
static bool utf8_valid(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        int k = tok_utf8_check(s + i, n - i);
        if (k <= 0)
            return false;
        i += (size_t)k;
    }
    return true;
}

/* llama.cpp decodes leniently (overlong forms accepted) and turns each undecodable byte into
 * U+FFFD; we do the same, and also replace what it would pass on but PCRE2 cannot hold
 * (surrogates, codepoints past U+10FFFF). out holds at least 3 * n bytes. */
static size_t utf8_sanitize(const unsigned char *s, size_t n, char *out)
{
    size_t w = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        uint32_t cp = 0;
        size_t k = 0;
        if (c < 0x80) { cp = c; k = 1; }
        else if ((c & 0xE0) == 0xC0) {
            if (n - i >= 2 && (s[i + 1] & 0xC0) == 0x80) { cp = ((uint32_t)(c & 0x1F) << 6) | (s[i + 1] & 0x3F); k = 2; }
        } else if ((c & 0xF0) == 0xE0) {
            if (n - i >= 3 && (s[i + 1] & 0xC0) == 0x80 && (s[i + 2] & 0xC0) == 0x80) {
                cp = ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
                k = 3;
            }
        } else if ((c & 0xF8) == 0xF0) {
            if (n - i >= 4 && (s[i + 1] & 0xC0) == 0x80 && (s[i + 2] & 0xC0) == 0x80 &&
                (s[i + 3] & 0xC0) == 0x80) {
                cp = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[i + 1] & 0x3F) << 12) |
                     ((uint32_t)(s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
                k = 4;
            }
        }
        if (!k) {
            cp = 0xFFFD;
            k = 1;
        }
        if ((cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)
            cp = 0xFFFD;
        w += tok_utf8_put(cp, out + w);
        i += k;
    }
    return w;
}

/* ---------------------------------------------------------------- splitting */

struct span {
    size_t off, len;
};

struct spans {
    struct span *s;
    size_t n, cap;
};

static int spans_push(struct spans *v, size_t off, size_t len)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        if (cap > SIZE_MAX / sizeof(struct span))
            return -ENOMEM;
        struct span *p = realloc(v->s, cap * sizeof *p);
        if (!p)
            return -ENOMEM;
        v->s = p;
        v->cap = cap;
    }
    v->s[v->n++] = (struct span){off, len};
    return 0;
}

static int run_match(const struct tok_regex *re, unsigned i, const char *subj, size_t len,
                     size_t start, pcre2_match_data *md)
{
    int rc;
    if (re->jit[i]) {
        rc = pcre2_jit_match(re->code[i], (PCRE2_SPTR)subj, len, start, 0, md, NULL);
        if (rc != PCRE2_ERROR_JIT_STACKLIMIT)
            return rc;
    }
    return pcre2_match(re->code[i], (PCRE2_SPTR)subj, len, start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                       md, NULL);
}

/* Apply regex i to every span of in, writing the finer spans to out. */
static int split_pass(const struct tok_regex *re, unsigned i, const char *text, const struct spans *in,
                      struct spans *out, pcre2_match_data *md)
{
    out->n = 0;
    for (size_t k = 0; k < in->n; k++) {
        const char *subj = text + in->s[k].off;
        size_t len = in->s[k].len, last = 0, pos = 0;
        while (pos <= len) {
            int rc = run_match(re, i, subj, len, pos, md);
            if (rc == PCRE2_ERROR_NOMATCH)
                break;
            if (rc < 0)
                return -EIO;
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            size_t ms = ov[0], me = ov[1];
            if (me == ms) {
                /* an empty match splits nothing; step over one character */
                pos = ms + 1;
                while (pos < len && ((unsigned char)subj[pos] & 0xC0) == 0x80)
                    pos++;
                continue;
            }
            if (ms > last && spans_push(out, in->s[k].off + last, ms - last))
                return -ENOMEM;
            if (spans_push(out, in->s[k].off + ms, me - ms))
                return -ENOMEM;
            last = pos = me;
        }
        if (last < len && spans_push(out, in->s[k].off + last, len - last))
            return -ENOMEM;
    }
    return 0;
}

/* ---------------------------------------------------------------- merging */

struct bsym {
    int32_t prev, next;
    uint32_t off, n;
    int32_t id;           /* token with this text, -1 if none */
};

struct bpe_work {
    char *word;           /* byte-level encoded piece */
    size_t word_cap;
    struct bsym *sym;
    size_t sym_cap;
    struct tok_heap heap;
};

static int add_bigram(const struct model_vocab *v, struct bpe_work *w, int32_t left, int32_t right)
{
    if (left < 0 || right < 0)
        return 0;
    const struct bsym *l = &w->sym[left], *r = &w->sym[right];
    /* by ids; by text only when the file has merges of texts that are no tokens */
    int32_t rank = l->id >= 0 && r->id >= 0 ? tok_pair_rank(v, l->id, r->id)
                   : v->text_merges ? tok_merge_rank(v, w->word + l->off, l->n, r->n) : -1;
    if (rank < 0)
        return 0;
    return tok_heap_push(&w->heap, (struct tok_bigram){rank, left, right, l->n + r->n, rank});
}

static int emit(const struct model_vocab *v, const char *s, size_t n, struct tok_out *o)
{
    int32_t id = tok_find(v, s, n);
    if (id >= 0)
        return tok_out_push(o, id);
    /* llama.cpp then looks up each byte of the encoded text on its own */
    for (size_t k = 0; k < n; k++) {
        id = tok_find(v, s + k, 1);
        if (id >= 0) {
            int rc = tok_out_push(o, id);
            if (rc)
                return rc;
        }
    }
    return 0;
}

static int bpe_word(const struct model_vocab *v, struct bpe_work *w, const char *raw, size_t rn,
                    struct tok_out *o)
{
    /* encode: every raw byte one codepoint (1 or 2 UTF-8 bytes) */
    if (rn > SIZE_MAX / 2 - 1)
        return -E2BIG;
    if (2 * rn > w->word_cap) {
        char *p = realloc(w->word, 2 * rn);
        if (!p)
            return -ENOMEM;
        w->word = p;
        w->word_cap = 2 * rn;
    }
    if (rn > w->sym_cap) {
        if (rn > INT32_MAX || rn > SIZE_MAX / sizeof(struct bsym))
            return -E2BIG;
        struct bsym *p = realloc(w->sym, rn * sizeof *p);
        if (!p)
            return -ENOMEM;
        w->sym = p;
        w->sym_cap = rn;
    }
    size_t wn = 0;
    for (size_t k = 0; k < rn; k++) {
        const struct byte_enc *e = &enc_table[(unsigned char)raw[k]];
        w->sym[k] = (struct bsym){(int32_t)k - 1, k + 1 == rn ? -1 : (int32_t)k + 1, (uint32_t)wn,
                                  e->n, v->byte_tok[(unsigned char)raw[k]]};
        memcpy(w->word + wn, e->s, e->n);
        wn += e->n;
    }
    if (v->ignore_merges) {
        int32_t id = tok_find(v, w->word, wn);
        if (id >= 0)
            return tok_out_push(o, id);
    }
    w->heap.n = 0;
    int rc;
    for (size_t k = 1; k < rn; k++)
        if ((rc = add_bigram(v, w, (int32_t)k - 1, (int32_t)k)))
            return rc;
    while (w->heap.n) {
        struct tok_bigram bg = tok_heap_pop(&w->heap);
        struct bsym *l = &w->sym[bg.left], *r = &w->sym[bg.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != bg.size)
            continue; /* outdated: one side has merged since */
        l->n += r->n;
        l->id = v->merges[bg.rank].result;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            w->sym[r->next].prev = bg.left;
        if ((rc = add_bigram(v, w, l->prev, bg.left)) || (rc = add_bigram(v, w, bg.left, l->next)))
            return rc;
    }
    for (int32_t k = 0; k != -1; k = w->sym[k].next) {
        const struct bsym *sy = &w->sym[k];
        rc = sy->id >= 0 ? tok_out_push(o, sy->id) : emit(v, w->word + sy->off, sy->n, o);
        if (rc)
            return rc;
    }
    return 0;
}

int tok_bpe_encode(const struct model_vocab *v, const char *text, size_t len, struct tok_out *o)
{
    const struct tok_regex *re = v->re;
    char *clean = NULL;
    struct spans a = {0}, b = {0};
    struct bpe_work w = {0};
    pcre2_match_data *md = NULL;
    int rc = 0;
    if (!len)
        return 0;
    if (!utf8_valid((const unsigned char *)text, len)) {
        if (len > SIZE_MAX / 3)
            return -E2BIG;
        clean = malloc(3 * len);
        if (!clean)
            return -ENOMEM;
        len = utf8_sanitize((const unsigned char *)text, len, clean);
        text = clean;
    }
    md = pcre2_match_data_create(1, NULL);
    if (!md) {
        rc = -ENOMEM;
        goto done;
    }
    if ((rc = spans_push(&a, 0, len)))
        goto done;
    for (unsigned i = 0; i < re->n; i++) {
        if ((rc = split_pass(re, i, text, &a, &b, md)))
            goto done;
        struct spans t = a;
        a = b;
        b = t;
    }
    for (size_t k = 0; k < a.n; k++)
        if ((rc = bpe_word(v, &w, text + a.s[k].off, a.s[k].len, o)))
            goto done;
done:
    pcre2_match_data_free(md);
    free(clean);
    free(a.s);
    free(b.s);
    free(w.word);
    free(w.sym);
    free(w.heap.b);
    return rc;
}

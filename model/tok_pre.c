/* tok_pre.c — the BPE pre-tokenizer: the regexes (PCRE2, Unicode mode) that cut a text into
 * the pieces the merge loop (tok_bpe.c) then works on, as llama.cpp runs them.
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
 * Uses tok_util.c only: the vocabulary keeps the compiled list, but nothing here reads it. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <errno.h>
#include <pcre2.h>
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

/* ---------------------------------------------------------------- compiling */

int tok_regex_new(struct tok_regex **out, enum tok_pre pre, const char *pre_name, char *err,
                  size_t errlen)
{
    *out = NULL;
    struct tok_regex *re = calloc(1, sizeof *re);
    if (!re)
        return -ENOMEM;
    for (unsigned i = 0; i < TOK_MAX_REGEX && pre_regexes[pre][i]; i++) {
        const char *pat = pre_regexes[pre][i];
        int ec;
        PCRE2_SIZE eo;
        pcre2_code *c = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                      &ec, &eo, NULL);
        if (!c) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(ec, msg, sizeof msg);
            snprintf(err, errlen, "pre-tokenizer '%s': regex %u does not compile at %zu: %s",
                     pre_name, i, (size_t)eo, (const char *)msg);
            tok_regex_free(re);
            return -EINVAL;
        }
        re->code[i] = c;
        re->jit[i] = pcre2_jit_compile(c, PCRE2_JIT_COMPLETE) == 0;
        re->n = i + 1;
    }
    *out = re;
    return 0;
}

void tok_regex_free(struct tok_regex *re)
{
    if (!re)
        return;
    for (unsigned i = 0; i < re->n; i++)
        pcre2_code_free(re->code[i]);
    free(re);
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
        uint32_t cp = 0xFFFD;
        size_t k = tok_utf8_decode(s + i, n - i, &cp);
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
    if (v->n == v->cap && util_grow((void **)&v->s, &v->cap, sizeof *v->s, 64))
        return -ENOMEM;
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

int tok_regex_split(const struct tok_regex *re, const char *text, size_t len, tok_piece_cb cb,
                    void *ud)
{
    char *clean = NULL;
    struct spans a = {0}, b = {0};
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
        if ((rc = cb(ud, text + a.s[k].off, a.s[k].len)))
            goto done;
done:
    pcre2_match_data_free(md);
    free(clean);
    free(a.s);
    free(b.s);
    return rc;
}

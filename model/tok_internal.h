/* tok_internal.h — what the tokenizer's files share (not public).
 *
 * The files form one dependency order, lowest first; a file uses only those above it, and the
 * declarations below follow the same order:
 *   tok_util.c    error setter, growing buffers, the candidate heap, UTF-8, byte-level alphabet
 *   tok_pre.c     the BPE pre-tokenizer: regex lists compiled, a text cut into pieces
 *   tok_vocab.c   loading a vocabulary (compiles its pre-tokenizer), look-ups, public getters
 *   tok_spm.c     SentencePiece merging of one fragment
 *   tok_bpe.c     byte-level BPE merging of one fragment (pieces from tok_pre.c)
 *   tokenizer.c   the public entry points: tokenize, detokenize, the streaming detokeniser
 *
 * The vocabulary keeps every token text in one pool, a hash index from text to id (the last
 * id wins for duplicate texts, as llama.cpp's map does), and for BPE a hash index of merges
 * keyed by the pair of texts. Token attributes use llama.cpp's bit values so that the rules
 * ported from it read the same. */
#ifndef KV_MODEL_TOK_INTERNAL_H
#define KV_MODEL_TOK_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "util/util.h"

#define TOK_MAX_TOKENS   (1u << 24)   /* ids in one vocabulary */
#define TOK_MAX_MERGES   (1u << 24)
#define TOK_MAX_TEXT     (1u << 16)   /* bytes of one token text or merge */
#define TOK_POOL_MAX     ((size_t)1 << 31)   /* bytes of all of them: offsets are 32-bit */
#define TOK_MAX_REGEX    8            /* pre-tokenizer regexes applied in sequence */

/* Token attributes (llama.cpp's llama_token_attr bits). */
enum {
    TOK_ATTR_UNDEFINED    = 0,
    TOK_ATTR_UNKNOWN      = 1 << 0,
    TOK_ATTR_UNUSED       = 1 << 1,
    TOK_ATTR_NORMAL       = 1 << 2,
    TOK_ATTR_CONTROL      = 1 << 3,
    TOK_ATTR_USER_DEFINED = 1 << 4,
    TOK_ATTR_BYTE         = 1 << 5,
    TOK_ATTR_LSTRIP       = 1 << 7,
    TOK_ATTR_RSTRIP       = 1 << 8,
};

/* Pre-tokenizer families (each a list of regexes; see tok_bpe.c). */
enum tok_pre {
    TOK_PRE_DEFAULT = 0, TOK_PRE_LLAMA3, TOK_PRE_DEEPSEEK_LLM, TOK_PRE_DEEPSEEK_CODER,
    TOK_PRE_DEEPSEEK3_LLM, TOK_PRE_FALCON, TOK_PRE_STARCODER, TOK_PRE_GPT2, TOK_PRE_QWEN2,
    TOK_PRE_PORO, TOK_PRE_VIKING, TOK_PRE_CHATGLM4, TOK_PRE_QWEN35, TOK_PRE_LAGUNA,
    TOK_PRE_BAILINGMOE, TOK_PRE_SEED_CODER, TOK_PRE_MINICPM5,
    TOK_PRE_COUNT
};

struct tok_token {
    uint32_t off, len;    /* text in pool */
    uint32_t poff, plen;  /* decoded piece (special = true) in piece pool */
    float score;
    int32_t special_pos;  /* index in the special list, -1 if none */
    uint16_t attr;
};

struct tok_merge {
    uint32_t off;         /* first then second, back to back, in pool */
    uint32_t first_len, second_len;
    uint32_t rank;
    int32_t result;       /* id of first + second, -1 if that text is no token */
};

/* Merge index by token ids: (first id, second id) -> rank. */
struct tok_pair {
    uint64_t key;         /* first << 32 | second; 0 with rank -1 = empty */
    int32_t rank;
};

struct tok_regex; /* compiled pre-tokenizer list (tok_pre.c) */

struct model_vocab {
    enum model_vocab_type type;
    enum tok_pre pre;
    char pre_name[64];
    uint32_t n_tokens;
    struct tok_token *tok;
    struct util_buf pool; /* token texts, then merge strings (under TOK_POOL_MAX) */
    char *ppool;          /* decoded pieces */
    size_t ppool_len;

    uint64_t *tmap;       /* open addressing: hash high 32 bits << 32 | id + 1; 0 = empty */
    uint32_t tmap_mask;

    struct tok_merge *merges;
    uint32_t n_merges;
    uint32_t *mmap;       /* index + 1 into merges */
    uint32_t mmap_mask;
    struct tok_pair *pairs;
    uint32_t pairs_mask;
    bool text_merges;     /* some merge has a side that is no token: look up by text too */
    bool spm_cut;         /* no token has U+2581 after another character: cut before words */

    uint8_t special_first[2][32];   /* first bytes of active specials [parse_special] */
    uint32_t special_lens[64];      /* distinct special text lengths, longest first */
    uint32_t n_special_lens;        /* 0 with special_lens_many: too many, no prefilter */
    bool special_lens_many;

    int32_t bos, eos, eot, eom, unk, sep, pad, mask;
    int32_t fim_pre, fim_suf, fim_mid, fim_pad, fim_rep, fim_sep;
    bool add_bos, add_eos, add_space_prefix, ignore_merges, clean_spaces;

    int32_t *special;     /* control / user-defined / unknown ids, longest text first */
    uint32_t n_special;
    uint8_t *eog;         /* bitmap over ids */

    int32_t byte_tok[256];/* SPM: <0xXX> (or the single byte); BPE: the byte's unicode char */
    struct tok_regex *re;
};

/* ---- tok_util.c */

/* A growing list of token ids. */
struct tok_out {
    int32_t *ids;
    size_t n, cap;
};
int tok_out_push(struct tok_out *o, int32_t id);

/* A candidate merge of symbols left and right (size bytes together, which tells a stale
 * candidate once one side has merged since). The heap pops the smallest key first, the leftmost
 * among equal keys: BPE keys by merge rank, SPM by minus the merged token's score. */
struct tok_bigram {
    double key;
    int32_t left, right;
    uint32_t size;
    int32_t rank;         /* BPE: the merge's rank (SPM: unused) */
};
struct tok_heap {
    struct tok_bigram *b;
    size_t n, cap;
};
int tok_heap_push(struct tok_heap *h, struct tok_bigram x);
/* Removes and returns the first candidate; h->n must be > 0. */
struct tok_bigram tok_heap_pop(struct tok_heap *h);

/* UTF-8 length of a sequence from its lead byte, llama.cpp's rule (1 for stray bytes). */
static inline size_t tok_utf8_len(unsigned char c)
{
    static const uint8_t lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lookup[c >> 4];
}
/* Length of the complete, valid UTF-8 sequence at s (n >= 1 bytes available): > 0 valid,
 * 0 a valid but unfinished prefix, < 0 minus the bytes of an invalid (maximal) prefix. */
int tok_utf8_check(const unsigned char *s, size_t n);
/* Encode a codepoint (<= 0x10FFFF) as UTF-8 into b (4 bytes room); returns the length. */
size_t tok_utf8_put(uint32_t cp, char *b);
/* Decode one codepoint at s (n >= 1 bytes available) the way llama.cpp does, leniently (no
 * overlong, surrogate or range checks); returns the bytes used, 0 for an invalid sequence. */
size_t tok_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);

/* The byte-level alphabet of BPE vocabularies: every byte stands for one printable codepoint. */
struct tok_byte_enc {
    char s[2];            /* that codepoint in UTF-8 */
    uint8_t n;
};
/* The encoded form of every byte, indexed by byte; static, built on the first call. */
const struct tok_byte_enc *tok_byte_table(void);
/* The byte a codepoint stands for, or -1 if none. */
int tok_cp_byte(uint32_t cp);

/* ---- tok_pre.c */

/* Compiles the regex list of pre-tokenizer pre (pre_name names it in errors) into *out. */
int tok_regex_new(struct tok_regex **out, enum tok_pre pre, const char *pre_name, char *err,
                  size_t errlen);
void tok_regex_free(struct tok_regex *re);
/* Called with each piece in order; a non-zero return stops the split and is returned. s lives
 * for the call only. */
typedef int (*tok_piece_cb)(void *ud, const char *s, size_t n);
/* Cuts text[0..len) into pieces (invalid UTF-8 replaced first) and hands them to cb. */
int tok_regex_split(const struct tok_regex *re, const char *text, size_t len, tok_piece_cb cb,
                    void *ud);

/* ---- tok_vocab.c (model_vocab_load and the public getters, declared in model/model.h) */

/* Id of the token whose text is s[0..n), or -1. */
int32_t tok_find(const struct model_vocab *v, const char *s, size_t n);
/* Rank of the merge (a, b) or -1; a and b are adjacent in memory (a + alen == b). */
int32_t tok_merge_rank(const struct model_vocab *v, const char *a, size_t alen, size_t blen);
/* Rank of the merge of tokens a and b (both >= 0) or -1. */
int32_t tok_pair_rank(const struct model_vocab *v, int32_t a, int32_t b);

/* ---- tok_spm.c */

/* SPM: tokenise one fragment (already space-escaped). */
int tok_spm_encode(const struct model_vocab *v, const char *text, size_t len, struct tok_out *o);

/* ---- tok_bpe.c */

/* BPE: tokenise one fragment (pre-tokenized with v->re, then merged). */
int tok_bpe_encode(const struct model_vocab *v, const char *text, size_t len, struct tok_out *o);

#endif

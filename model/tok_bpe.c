/* tok_bpe.c — byte-level BPE merging of one fragment, as llama.cpp does it.
 *
 * The pre-tokenizer (tok_pre.c) first cuts the fragment into pieces. Each piece is then turned
 * into the byte-level alphabet (every byte one printable codepoint) and merged: adjacent
 * symbols whose pair has a merge rank are candidates, the lowest rank (ties: leftmost) merges
 * first, in a heap, O(n log n) per piece. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "model/tok_internal.h"

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
    const struct tok_byte_enc *enc = tok_byte_table();
    size_t wn = 0;
    for (size_t k = 0; k < rn; k++) {
        const struct tok_byte_enc *e = &enc[(unsigned char)raw[k]];
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

/* The state one fragment's pieces share (tok_regex_split's callback argument). */
struct bpe_run {
    const struct model_vocab *v;
    struct bpe_work w;
    struct tok_out *o;
};

static int bpe_piece(void *ud, const char *s, size_t n)
{
    struct bpe_run *r = ud;
    return bpe_word(r->v, &r->w, s, n, r->o);
}

int tok_bpe_encode(const struct model_vocab *v, const char *text, size_t len, struct tok_out *o)
{
    struct bpe_run r = {.v = v, .o = o};
    int rc = tok_regex_split(v->re, text, len, bpe_piece, &r);
    free(r.w.word);
    free(r.w.sym);
    free(r.w.heap.b);
    return rc;
}

/* tok_spm.c — SentencePiece (BPE-by-score) tokenisation of one fragment, as llama.cpp does.
 *
 * The text (spaces already escaped as U+2581) starts as one symbol per UTF-8 character.
 * Every adjacent pair whose concatenation is a token is a candidate; the candidate with the
 * highest score (ties: the leftmost) is merged, and the pairs around the merged symbol become
 * new candidates. A heap holds the candidates; stale ones are recognised by their size, which
 * changes whenever either side has merged since. Symbols that are not tokens at the end fall
 * back to one byte token per byte. O(n log n) in the text length. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "model/tok_internal.h"

struct spm_sym {
    int32_t prev, next;
    uint32_t off, n;
};

static int try_bigram(const struct model_vocab *v, const char *text, const struct spm_sym *sym,
                      int32_t left, int32_t right, struct tok_heap *h)
{
    if (left < 0 || right < 0)
        return 0;
    uint32_t size = sym[left].n + sym[right].n;
    int32_t id = tok_find(v, text + sym[left].off, size);
    if (id < 0)
        return 0;
    return tok_heap_push(h, (struct tok_bigram){-(double)v->tok[id].score, left, right, size, -1});
}

static bool is_space_sym(const char *text, const struct spm_sym *s)
{
    return s->n == 3 && !memcmp(text + s->off, "\xE2\x96\x81", 3);
}

/* Merge symbols [a, b) (linked among themselves) and emit their tokens. */
static int encode_segment(const struct model_vocab *v, const char *text, struct spm_sym *sym,
                          int32_t a, int32_t b, struct tok_heap *h, struct tok_out *o)
{
    int rc;
    sym[a].prev = -1;
    sym[b - 1].next = -1;
    h->n = 0;
    for (int32_t i = a + 1; i < b; i++)
        if ((rc = try_bigram(v, text, sym, i - 1, i, h)))
            return rc;
    while (h->n) {
        struct tok_bigram bg = tok_heap_pop(h);
        struct spm_sym *l = &sym[bg.left], *r = &sym[bg.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != bg.size)
            continue; /* outdated: one side has merged since */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            sym[r->next].prev = bg.left;
        if ((rc = try_bigram(v, text, sym, l->prev, bg.left, h)) ||
            (rc = try_bigram(v, text, sym, bg.left, l->next, h)))
            return rc;
    }
    for (int32_t i = a; i != -1; i = sym[i].next) {
        const struct spm_sym *s = &sym[i];
        int32_t id = tok_find(v, text + s->off, s->n);
        if (id >= 0) {
            if ((rc = tok_out_push(o, id)))
                return rc;
            continue;
        }
        /* byte fallback; a vocabulary without byte tokens gets its unknown token */
        for (uint32_t k = 0; k < s->n; k++) {
            int32_t t = v->byte_tok[(unsigned char)text[s->off + k]];
            if (t < 0)
                t = v->unk;
            if (t >= 0 && (rc = tok_out_push(o, t)))
                return rc;
        }
    }
    return 0;
}

int tok_spm_encode(const struct model_vocab *v, const char *text, size_t len, struct tok_out *o)
{
    struct spm_sym *sym = NULL;
    struct tok_heap h = {0};
    int rc = 0;
    if (!len)
        return 0;
    if (len > INT32_MAX)
        return -E2BIG;
    sym = malloc(len * sizeof *sym);
    if (!sym)
        return -ENOMEM;
    int32_t ns = 0;
    for (size_t off = 0; off < len;) {
        size_t n = tok_utf8_len((unsigned char)text[off]);
        if (n > len - off)
            n = len - off;
        sym[ns] = (struct spm_sym){ns - 1, ns + 1, (uint32_t)off, (uint32_t)n};
        ns++;
        off += n;
    }
    /* With v->spm_cut, a word (a run of U+2581 and what follows up to the next run) merges
     * on its own: same result, and a small heap instead of one over the whole text. */
    int32_t a = 0;
    for (int32_t i = 1; i <= ns; i++) {
        if (i < ns && !(v->spm_cut && is_space_sym(text, &sym[i]) && !is_space_sym(text, &sym[i - 1])))
            continue;
        if ((rc = encode_segment(v, text, sym, a, i, &h, o)))
            break;
        a = i;
    }
    free(sym);
    free(h.b);
    return rc;
}

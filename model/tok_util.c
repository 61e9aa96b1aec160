/* tok_util.c — the tokenizer's lowest layer, used by every other tok*.c file: the growing
 * list of ids, the candidate heap of the merge loops, UTF-8 helpers and the byte-level alphabet
 * of BPE vocabularies. Knows nothing of a vocabulary. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/internal.h"
#include "model/tok_internal.h"

/* ---------------------------------------------------------------- ids */

int tok_out_push(struct tok_out *o, int32_t id)
{
    if (o->n == o->cap && util_grow((void **)&o->ids, &o->cap, sizeof *o->ids, 64))
        return -ENOMEM;
    o->ids[o->n++] = id;
    return 0;
}

/* ---------------------------------------------------------------- candidate heap */

/* a before b: smaller key, then smaller left index */
static bool bigram_before(const struct tok_bigram *a, const struct tok_bigram *b)
{
    return a->key < b->key || (a->key == b->key && a->left < b->left);
}

int tok_heap_push(struct tok_heap *h, struct tok_bigram x)
{
    if (h->n == h->cap && util_grow((void **)&h->b, &h->cap, sizeof x, 64))
        return -ENOMEM;
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!bigram_before(&x, &h->b[parent]))
            break;
        h->b[i] = h->b[parent];
        i = parent;
    }
    h->b[i] = x;
    return 0;
}

struct tok_bigram tok_heap_pop(struct tok_heap *h)
{
    struct tok_bigram top = h->b[0];
    struct tok_bigram last = h->b[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && bigram_before(&h->b[c + 1], &h->b[c]))
            c++;
        if (!bigram_before(&h->b[c], &last))
            break;
        h->b[i] = h->b[c];
        i = c;
    }
    if (h->n)
        h->b[i] = last;
    return top;
}

/* ---------------------------------------------------------------- UTF-8 */

size_t tok_utf8_put(uint32_t cp, char *b)
{
    if (cp < 0x80) {
        b[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        b[0] = (char)(0xC0 | (cp >> 6));
        b[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        b[0] = (char)(0xE0 | (cp >> 12));
        b[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        b[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    b[0] = (char)(0xF0 | (cp >> 18));
    b[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    b[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    b[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

int tok_utf8_check(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else
        return -1;
    for (size_t i = 1; i < need; i++) {
        if (i >= n)
            return 0;
        unsigned char x = s[i];
        if (i == 1 ? (x < lo || x > hi) : (x < 0x80 || x > 0xBF))
            return -(int)i;
    }
    return (int)need;
}

size_t tok_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp)
{
    unsigned char c = s[0];
    if (!(c & 0x80)) { *cp = c; return 1; }
    if (!(c & 0x40)) return 0;
    if (!(c & 0x20)) {
        if (n < 2 || (s[1] & 0xC0) != 0x80) return 0;
        *cp = ((uint32_t)(c & 0x1F) << 6) | (s[1] & 0x3F);
        return 2;
    }
    if (!(c & 0x10)) {
        if (n < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80) return 0;
        *cp = ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
        return 3;
    }
    if (!(c & 0x08)) {
        if (n < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80)
            return 0;
        *cp = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
              ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
        return 4;
    }
    return 0;
}

/* ---------------------------------------------------------------- byte-level alphabet */

/* GPT-2's map: printable Latin-1 bytes stand for themselves, the others (controls, space,
 * 0x7F-0xA0, 0xAD) for U+0100 onwards in byte order. */
static bool byte_printable(unsigned b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

/* Encoded forms of every byte and the way back, computed once. */
static struct tok_byte_enc enc_table[256];
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
        memcpy(enc_table[b].s, buf, n);
        enc_table[b].n = (uint8_t)n;
        dec_table[cp] = (int16_t)b;
    }
}

const struct tok_byte_enc *tok_byte_table(void)
{
    pthread_once(&enc_once, enc_init);
    return enc_table;
}

int tok_cp_byte(uint32_t cp)
{
    pthread_once(&enc_once, enc_init);
    return cp < sizeof dec_table / sizeof dec_table[0] ? dec_table[cp] : -1;
}

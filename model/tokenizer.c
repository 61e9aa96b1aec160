/* tokenizer.c — tokenize / detokenize: special-token partitioning (longest first, as
 * llama.cpp), dispatch to SPM or BPE, whole-sequence decoding and the streaming detokeniser.
 * The top of the tokenizer's files: loading and the getters live in tok_vocab.c, the
 * helpers in tok_util.c. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/tok_internal.h"

#define TOK_MAX_INPUT (256u << 20)   /* bytes of text per tokenize call */

/* ---------------------------------------------------------------- tokenize */

struct frag {
    size_t off, len;   /* text fragment (id < 0) */
    int32_t id;        /* special token (>= 0) */
};

struct frags {
    struct frag *f;
    size_t n, cap;
};

static int frags_push(struct frags *fs, size_t off, size_t len, int32_t id)
{
    if (fs->n == fs->cap && util_grow((void **)&fs->f, &fs->cap, sizeof *fs->f, 16))
        return -ENOMEM;
    fs->f[fs->n++] = (struct frag){off, len, id};
    return 0;
}

/* Split the special tokens out of the text, longest first (llama.cpp's
 * tokenizer_st_partition): control and unknown tokens only with parse_special, user-defined
 * tokens always. */
static int partition(const struct model_vocab *v, const char *text, size_t len, bool parse_special,
                     struct frags *out)
{
    struct frags cur = {0}, next = {0};
    uint8_t *present = NULL;
    int rc = 0;
    if (len && (rc = frags_push(&cur, 0, len, -1)))
        goto done;
    if (!v->n_special || !len)
        goto skip;
    if (!v->special_lens_many) {
        /* Which specials occur in the text at all: only those can split a fragment. One pass
         * over the bytes that can start one, a lookup per distinct length. */
        present = calloc(v->n_special, 1);
        if (!present) {
            rc = -ENOMEM;
            goto done;
        }
        const uint8_t *first = v->special_first[parse_special];
        bool any = false;
        for (size_t i = 0; i < len; i++) {
            unsigned char c = (unsigned char)text[i];
            if (!(first[c >> 3] >> (c & 7) & 1))
                continue;
            for (uint32_t k = 0; k < v->n_special_lens; k++) {
                size_t l = v->special_lens[k];
                if (l > len - i)
                    continue;
                int32_t id = tok_find(v, text + i, l);
                if (id >= 0 && v->tok[id].special_pos >= 0) {
                    present[v->tok[id].special_pos] = 1;
                    any = true;
                }
            }
        }
        if (!any)
            goto skip;
    }
    for (uint32_t si = 0; si < v->n_special && cur.n; si++) {
        int32_t sid = v->special[si];
        const struct tok_token *st = &v->tok[sid];
        if (!parse_special && (st->attr & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN)))
            continue;
        if (present && !present[si])
            continue;
        const char *stext = v->pool.s + st->off;
        size_t slen = st->len;
        bool any = false;
        next.n = 0;
        for (size_t fi = 0; fi < cur.n; fi++) {
            struct frag fr = cur.f[fi];
            if (fr.id >= 0 || fr.len < slen) {
                if ((rc = frags_push(&next, fr.off, fr.len, fr.id)))
                    goto done;
                continue;
            }
            size_t off = fr.off, flen = fr.len;
            for (;;) {
                const char *m = flen >= slen ? memmem(text + off, flen, stext, slen) : NULL;
                if (!m) {
                    if (flen && (rc = frags_push(&next, off, flen, -1)))
                        goto done;
                    break;
                }
                any = true;
                size_t mpos = (size_t)(m - text);
                size_t llen = mpos - off;
                if (st->attr & TOK_ATTR_LSTRIP)
                    while (llen && isspace((unsigned char)text[off + llen - 1]))
                        llen--;
                if (llen && (rc = frags_push(&next, off, llen, -1)))
                    goto done;
                if ((rc = frags_push(&next, 0, 0, sid)))
                    goto done;
                size_t roff = mpos + slen, rlen = off + flen - roff;
                if (st->attr & TOK_ATTR_RSTRIP)
                    while (rlen && isspace((unsigned char)text[roff])) {
                        roff++;
                        rlen--;
                    }
                off = roff;
                flen = rlen;
                if (!flen)
                    break;
            }
        }
        if (any) {
            struct frags t = cur;
            cur = next;
            next = t;
        }
    }
skip:
    *out = cur;
    cur.f = NULL;
done:
    free(present);
    free(cur.f);
    free(next.f);
    return rc;
}

static int tokenize_all(const struct model_vocab *v, const char *text, size_t len, bool add_special,
                        bool parse_special, struct tok_out *o)
{
    struct frags fs = {0};
    char *buf = NULL;
    int rc;
    if (len > TOK_MAX_INPUT)
        return -E2BIG;
    if ((rc = partition(v, text, len, parse_special, &fs)))
        return rc;
    if (v->type == MODEL_VOCAB_SPM) {
        bool prev_special = true;   /* the first fragment gets the leading space */
        if (add_special && v->add_bos && (rc = tok_out_push(o, v->bos)))
            goto done;
        for (size_t i = 0; i < fs.n; i++) {
            const struct frag *fr = &fs.f[i];
            if (fr->id >= 0) {
                if ((rc = tok_out_push(o, fr->id)))
                    goto done;
                prev_special = true;
                continue;
            }
            /* escape spaces as U+2581, with the leading space when asked */
            size_t nsp = 0;
            for (size_t k = 0; k < fr->len; k++)
                nsp += text[fr->off + k] == ' ';
            bool lead = v->add_space_prefix && prev_special;
            size_t n = fr->len + 2 * nsp + (lead ? 3 : 0);
            char *nb = realloc(buf, n ? n : 1);
            if (!nb) {
                rc = -ENOMEM;
                goto done;
            }
            buf = nb;
            size_t w = 0;
            if (lead) {
                memcpy(buf, "\xE2\x96\x81", 3);
                w = 3;
            }
            for (size_t k = 0; k < fr->len; k++) {
                char c = text[fr->off + k];
                if (c == ' ') {
                    memcpy(buf + w, "\xE2\x96\x81", 3);
                    w += 3;
                } else {
                    buf[w++] = c;
                }
            }
            if ((rc = tok_spm_encode(v, buf, w, o)))
                goto done;
            prev_special = false;
        }
        if (add_special && v->add_eos && (rc = tok_out_push(o, v->eos)))
            goto done;
    } else {
        if (add_special && v->add_bos && (rc = tok_out_push(o, v->bos)))
            goto done;
        for (size_t i = 0; i < fs.n; i++) {
            const struct frag *fr = &fs.f[i];
            rc = fr->id >= 0 ? tok_out_push(o, fr->id) : tok_bpe_encode(v, text + fr->off, fr->len, o);
            if (rc)
                goto done;
        }
        if (add_special && v->add_eos && (rc = tok_out_push(o, v->eos)))
            goto done;
    }
done:
    free(buf);
    free(fs.f);
    return rc;
}

int model_tokenize(const struct model_vocab *v, const char *text, size_t len, bool add_special,
                   bool parse_special, int32_t *out, size_t max, size_t *n)
{
    struct tok_out o = {0};
    int rc = tokenize_all(v, text, len, add_special, parse_special, &o);
    *n = o.n;
    if (!rc) {
        if (o.n > max)
            rc = -ENOSPC;
        else if (o.n)
            memcpy(out, o.ids, o.n * sizeof *out);
    }
    free(o.ids);
    return rc;
}

int model_tokenize_alloc(const struct model_vocab *v, const char *text, int32_t **out,
                         uint32_t *n)
{
    size_t len = strlen(text), cnt = 0, cap = len + 8;
    int32_t *t = malloc(cap * sizeof *t);
    if (!t)
        return -ENOMEM;
    int rc = model_tokenize(v, text, len, true, true, t, cap, &cnt);
    if (rc == -ENOSPC) {
        int32_t *nt = realloc(t, cnt * sizeof *t);
        if (!nt) {
            free(t);
            return -ENOMEM;
        }
        t = nt;
        rc = model_tokenize(v, text, len, true, true, t, cnt, &cnt);
    }
    if (rc < 0 || cnt > UINT32_MAX) {
        free(t);
        return rc < 0 ? rc : -E2BIG;
    }
    *out = t;
    *n = (uint32_t)cnt;
    return 0;
}

/* ---------------------------------------------------------------- detokenize */

const char *model_token_piece(const struct model_vocab *v, int32_t id, bool special, size_t *len)
{
    if (id < 0 || (uint32_t)id >= v->n_tokens) {
        *len = 0;
        return NULL;
    }
    const struct tok_token *t = &v->tok[id];
    if (!special && (t->attr & (TOK_ATTR_UNKNOWN | TOK_ATTR_CONTROL))) {
        *len = 0;
        return v->ppool + t->poff;
    }
    *len = t->plen;
    return v->ppool + t->poff;
}

/* llama.cpp's clean_up_tokenization_spaces passes, in place; returns the new length. */
static size_t clean_spaces(char *t, size_t n)
{
    size_t w;
    if (n < 2)
        return n;
    /* " ?", " !", " .", " ," lose the space */
    w = 1;
    for (size_t i = 1; i < n; i++) {
        char x = t[i];
        if (t[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ','))
            w--;
        t[w++] = x;
    }
    n = w;
    /* " 's", " 'm", " 're", " 've" lose the space */
    w = n ? 1 : 0;
    for (size_t i = 1; i < n; i++) {
        char x = t[i];
        if (t[i - 1] == ' ' && x == '\'' && i + 1 < n) {
            char x1 = t[i + 1];
            if (x1 == 's' || x1 == 'm')
                w--;
            else if (i + 2 < n && ((x1 == 'r' && t[i + 2] == 'e') || (x1 == 'v' && t[i + 2] == 'e')))
                w--;
        }
        t[w++] = x;
    }
    return w;
}

int model_detokenize(const struct model_vocab *v, const int32_t *ids, size_t n, unsigned flags,
                     char *buf, size_t cap, size_t *len)
{
    struct util_buf b = {0};
    bool strip = v->add_space_prefix;
    bool remove_special = flags & MODEL_DETOK_REMOVE_SPECIAL, special = flags & MODEL_DETOK_SPECIAL;
    int rc = 0;
    *len = 0;
    if (remove_special && v->add_bos && n > 0 && ids[0] == v->bos) {
        strip = false;
        ids++;
        n--;
    }
    if (remove_special && v->add_eos && n > 0 && ids[n - 1] == v->eos)
        n--;
    for (size_t i = 0; i < n; i++) {
        size_t pl;
        const char *p = model_token_piece(v, ids[i], special, &pl);
        if (!p) {
            rc = -ERANGE;
            goto done;
        }
        if (strip && pl && p[0] == ' ') {
            p++;
            pl--;
        }
        strip = false;
        if ((rc = util_buf_append(&b, p, pl, SIZE_MAX)))
            goto done;
    }
    if ((flags & MODEL_DETOK_CLEAN_SPACES) && v->clean_spaces)
        b.len = clean_spaces(b.s, b.len);
    *len = b.len;
    if (b.len > cap)
        rc = -ENOSPC;
    else if (b.len)
        memcpy(buf, b.p, b.len);
done:
    util_buf_free(&b);
    return rc;
}

/* ---------------------------------------------------------------- streaming */

struct model_detok {
    const struct model_vocab *v;
    bool special, strip;
    unsigned char pend[4];
    size_t npend;
    struct util_buf out;
};

int model_detok_new(struct model_detok **out, const struct model_vocab *v, bool special,
                    bool strip_leading_space)
{
    struct model_detok *d = calloc(1, sizeof *d);
    if (!d)
        return -ENOMEM;
    d->v = v;
    d->special = special;
    d->strip = strip_leading_space && v->add_space_prefix;
    *out = d;
    return 0;
}

void model_detok_free(struct model_detok *d)
{
    if (!d)
        return;
    util_buf_free(&d->out);
    free(d);
}

/* Move the complete characters of pend + piece into out; keep an unfinished tail. */
static int detok_feed(struct model_detok *d, const char *p, size_t pl, bool final)
{
    d->out.len = 0;
    while (pl || d->npend) {
        /* work on pend topped up from the piece, at most 4 bytes at a time */
        while (d->npend < 4 && pl) {
            d->pend[d->npend++] = (unsigned char)*p++;
            pl--;
        }
        int k = tok_utf8_check(d->pend, d->npend);
        if (k == 0 && !final && !pl)
            break; /* wait for the rest of the character */
        size_t used;
        if (k > 0) {
            if (util_buf_append(&d->out, d->pend, (size_t)k, SIZE_MAX))
                return -ENOMEM;
            used = (size_t)k;
        } else {
            if (util_buf_append(&d->out, "\xEF\xBF\xBD", 3, SIZE_MAX))
                return -ENOMEM;
            used = k < 0 ? (size_t)-k : d->npend;
        }
        memmove(d->pend, d->pend + used, d->npend - used);
        d->npend -= used;
        /* fast path: copy a run of ASCII straight from the piece */
        if (!d->npend) {
            size_t a = 0;
            while (a < pl && !((unsigned char)p[a] & 0x80))
                a++;
            if (a) {
                if (util_buf_append(&d->out, p, a, SIZE_MAX))
                    return -ENOMEM;
                p += a;
                pl -= a;
            }
        }
    }
    return 0;
}

int model_detok_push(struct model_detok *d, int32_t id, const char **text, size_t *len)
{
    size_t pl;
    const char *p = model_token_piece(d->v, id, d->special, &pl);
    *text = "";
    *len = 0;
    if (!p)
        return -ERANGE;
    if (d->strip && pl && p[0] == ' ') {
        p++;
        pl--;
    }
    d->strip = false;
    int rc = detok_feed(d, p, pl, false);
    if (rc)
        return rc;
    *text = d->out.len ? d->out.s : "";
    *len = d->out.len;
    return 0;
}

int model_detok_flush(struct model_detok *d, const char **text, size_t *len)
{
    int rc = detok_feed(d, NULL, 0, true);
    *text = "";
    *len = 0;
    if (rc)
        return rc;
    *text = d->out.len ? d->out.s : "";
    *len = d->out.len;
    return 0;
}

/* chat.c — chat templates: the families of tokenizer.chat_template a model ships with,
 * recognised from the template text and rendered byte for byte as their Jinja templates
 * render them (docs/chat.md).
 *
 * Kvasir has no Jinja interpreter: every family (and each variant of it seen in published
 * models) is a row of the style table below plus a render function per family that follows
 * the template's logic step by step: which roles it renders, where the system message goes,
 * which conversations it refuses (the templates' raise_exception), where bos_token and
 * eos_token appear, and Python's str.strip() wherever a template trims. tests/lib/chat_render.py
 * renders the templates' own text with python3-jinja2 and compares. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "model/model.h"
#include "util/err.h"
#include "util/util.h"

#define TEMPLATE_MAX (1u << 20)   /* bytes of a tokenizer.chat_template we read */
#define SYS_MAX 1024              /* bytes of a default system prompt taken from a template */
#define DATE_MAX 64               /* bytes of a default date taken from a template */

enum fam { FAM_CHATML, FAM_LLAMA3, FAM_LLAMA2, FAM_MISTRAL, FAM_PHI3, FAM_GEMMA };

enum {
    F_BOS = 1u << 0,        /* emits bos_token */
    F_USER_OPENS = 1u << 1, /* every user turn opens the assistant's; add_generation_prompt unused */
    F_SYS_ALWAYS = 1u << 2, /* chatml: a system block always (given or default), then only user
                             * and assistant turns */
    F_SYS_DROP = 1u << 3,   /* phi3: system messages are not rendered */
    F_SYS_NONEMPTY = 1u << 4, /* phi3: system messages rendered only when not empty */
    F_EOS_NO_GEN = 1u << 5, /* phi3: eos_token closes a conversation without a generation prompt */
    F_DATE = 1u << 6,       /* llama3: the Llama 3.1 system block with its knowledge/today dates */
    F_FOLD_FIRST = 1u << 7, /* the system message is folded into the first turn */
    F_FOLD_LAST = 1u << 8,  /* ... into the last turn when that is a user turn (Mistral v0.3) */
    F_TRIM = 1u << 9,       /* mistral: assistant content trimmed */
    F_GEN_ALWAYS = 1u << 10, /* llama3: the assistant header ends every rendering */
    F_THINK = 1u << 11,     /* chatml: Qwen3's <think> handling of assistant turns */
};

/* One family variant: how its template renders. Texts are the template's literals. */
struct style {
    const char *name;
    enum fam fam;
    unsigned flags;
    const char *sys_def;     /* chatml: the default system prompt, NULL for none */
    const char *date;        /* F_DATE: the template's default "Today Date" */
    const char *user_pre, *user_post, *asst_pre;  /* mistral's turn texts */
    const char *bos, *eos;   /* the family's usual token texts, used without a GGUF */
};

/* The names users give (--chat-template): a family name picks its first row. */
static const struct style styles[] = {
    {"chatml", FAM_CHATML, 0, NULL, NULL, NULL, NULL, NULL, "", "<|im_end|>"},
    {"qwen2", FAM_CHATML, 0, "You are a helpful assistant.", NULL, NULL, NULL, NULL, "",
     "<|im_end|>"},
    {"qwen2.5", FAM_CHATML, 0, "You are Qwen, created by Alibaba Cloud. You are a helpful "
     "assistant.", NULL, NULL, NULL, NULL, "", "<|im_end|>"},
    {"qwen3", FAM_CHATML, F_THINK, NULL, NULL, NULL, NULL, NULL, "", "<|im_end|>"},
    {"llama3", FAM_LLAMA3, F_BOS, NULL, NULL, NULL, NULL, NULL, "<|begin_of_text|>",
     "<|eot_id|>"},
    {"llama3.1", FAM_LLAMA3, F_BOS | F_DATE, NULL, "26 Jul 2024", NULL, NULL, NULL,
     "<|begin_of_text|>", "<|eot_id|>"},
    {"llama2", FAM_LLAMA2, F_BOS | F_FOLD_FIRST, NULL, NULL, NULL, NULL, NULL, "<s>", "</s>"},
    {"mistral", FAM_MISTRAL, F_BOS | F_FOLD_LAST | F_TRIM, NULL, NULL, "[INST] ", "[/INST]", " ",
     "<s>", "</s>"},
    {"mistral-v1", FAM_MISTRAL, F_BOS, NULL, NULL, "[INST] ", " [/INST]", "", "<s>", "</s>"},
    {"mistral-v2", FAM_MISTRAL, F_BOS | F_FOLD_FIRST, NULL, NULL, " [INST] ", " [/INST]", " ",
     "<s>", "</s>"},
    {"phi3", FAM_PHI3, F_EOS_NO_GEN, NULL, NULL, NULL, NULL, NULL, "<s>", "<|endoftext|>"},
    {"phi3.5", FAM_PHI3, F_EOS_NO_GEN | F_SYS_NONEMPTY, NULL, NULL, NULL, NULL, NULL, "<s>",
     "<|endoftext|>"},
    {"gemma", FAM_GEMMA, F_BOS | F_FOLD_FIRST, NULL, NULL, NULL, NULL, NULL, "<bos>", "<eos>"},
    {"gemma2", FAM_GEMMA, F_BOS, NULL, NULL, NULL, NULL, NULL, "<bos>", "<eos>"},
};
#define N_STYLES (sizeof styles / sizeof styles[0])

static const char *const fam_names[] = {
    [FAM_CHATML] = "chatml", [FAM_LLAMA3] = "llama3", [FAM_LLAMA2] = "llama2",
    [FAM_MISTRAL] = "mistral", [FAM_PHI3] = "phi3", [FAM_GEMMA] = "gemma",
};

/* A style recognised from a template: a table row with the texts the template itself gives
 * (its default system prompt, its date). */
struct rec {
    struct style s;
    char sys[SYS_MAX];
    char date[DATE_MAX];
};

/* ---- output buffer ---- */

struct buf {
    struct util_buf u;
    int rc;          /* first failure, sticky */
};

static void put_n(struct buf *b, const char *s, size_t n)
{
    if (!b->rc)
        b->rc = util_buf_append(&b->u, s, n, SIZE_MAX);
}

static void put(struct buf *b, const char *s)
{
    put_n(b, s, strlen(s));
}

/* ---- Python's str.strip(), which Jinja's trim filter and the templates' .strip() call ---- */

/* Length of the whitespace character (as Python's str.isspace() sees it) at s[0..n), or 0. */
static size_t space_len(const unsigned char *s, size_t n)
{
    if (s[0] == ' ' || (s[0] >= '\t' && s[0] <= '\r') || (s[0] >= 0x1c && s[0] <= 0x1f))
        return 1;
    if (n >= 2 && s[0] == 0xc2 && (s[1] == 0x85 || s[1] == 0xa0))
        return 2;
    if (n < 3)
        return 0;
    unsigned c = ((s[0] & 0x0fu) << 12) | ((s[1] & 0x3fu) << 6) | (s[2] & 0x3fu);
    if ((s[0] & 0xf0) != 0xe0 || (s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80)
        return 0;
    if (c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
        c == 0x202f || c == 0x205f || c == 0x3000)
        return 3;
    return 0;
}

/* Whether the character ending at s[n) (the last one) is whitespace: its length, or 0. */
static size_t space_len_back(const unsigned char *s, size_t n)
{
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        size_t l = space_len(s + n - k, k);
        if (l == k)
            return k;
    }
    return 0;
}

/* The stripped part of s: *start and *n. */
static void strip(const char *s, size_t len, const char **start, size_t *n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t a = 0, b = len, l;
    while (a < b && (l = space_len(p + a, b - a)) > 0)
        a += l;
    while (b > a && (l = space_len_back(p + a, b - a)) > 0)
        b -= l;
    *start = s + a;
    *n = b - a;
}

static void put_trim(struct buf *b, const char *s)
{
    const char *t;
    size_t n;
    strip(s, strlen(s), &t, &n);
    put_n(b, t, n);
}

/* ---- the renderers: one per family, each following its template's logic ---- */

struct conv {
    const struct style *s;
    const struct model_chat_msg *m;
    size_t n;
    bool gen;               /* add_generation_prompt */
    const char *bos, *eos;
    char *err;
    size_t errlen;
};

static const char *role(const struct conv *c, size_t i)
{
    return c->m[i].role;
}

static const char *content(const struct conv *c, size_t i)
{
    return c->m[i].content ? c->m[i].content : "";
}

static bool is(const struct conv *c, size_t i, const char *r)
{
    return strcmp(role(c, i), r) == 0;
}

/* The templates' alternation check over messages [from, n): user at even places, anything
 * else at odd ones; -EINVAL naming the first message out of place. */
static int alternate(const struct conv *c, size_t from)
{
    for (size_t i = from; i < c->n; i++) {
        if (is(c, i, "user") != ((i - from) % 2 == 0)) {
            util_seterr(c->err, c->errlen, "chat template %s: roles must alternate user/"
                        "assistant after an optional system message (message %zu is '%s')",
                        c->s->name, i, role(c, i));
            return -EINVAL;
        }
    }
    return 0;
}

static int only_user_assistant(const struct conv *c, size_t from)
{
    for (size_t i = from; i < c->n; i++) {
        if (!is(c, i, "user") && !is(c, i, "assistant")) {
            util_seterr(c->err, c->errlen, "chat template %s: only user and assistant roles "
                        "after an optional first system message (message %zu is '%s')",
                        c->s->name, i, role(c, i));
            return -EINVAL;
        }
    }
    return 0;
}

/* One ChatML turn: "<|im_start|>ROLE\nTEXT<|im_end|>\n". */
static void chatml_turn(struct buf *b, const char *r, const char *text)
{
    put(b, "<|im_start|>");
    put(b, r);
    put(b, "\n");
    put(b, text);
    put(b, "<|im_end|>\n");
}

/* s[0..n) without the characters in set at its start (lstrip) and/or end (rstrip). */
static void strip_set(const char **s, size_t *n, const char *set, bool left, bool right)
{
    while (left && *n && strchr(set, (*s)[0]) && (*s)[0]) {
        (*s)++;
        (*n)--;
    }
    while (right && *n && strchr(set, (*s)[*n - 1]) && (*s)[*n - 1])
        (*n)--;
}

/* The last occurrence of needle in s[0..n), or NULL. */
static const char *find_last(const char *s, size_t n, const char *needle)
{
    const char *last = NULL;
    size_t k = strlen(needle);
    for (const char *p = s; p + k <= s + n; p++)
        if (memcmp(p, needle, k) == 0)
            last = p;
    return last;
}

/* Qwen3: ChatML where assistant turns lose any "<think>...</think>" reasoning, except those
 * after the last user turn, which keep it (the last one always gets a think block, empty or
 * not). The first system message opens the conversation. */
static int qwen3(const struct conv *c, struct buf *b)
{
    if (is(c, 0, "system"))
        chatml_turn(b, "system", content(c, 0));
    size_t last_query = c->n - 1;
    for (size_t i = c->n; i-- > 0;) {
        const char *t = content(c, i);
        size_t n = strlen(t), k = strlen("</tool_response>");
        bool tool = strncmp(t, "<tool_response>", strlen("<tool_response>")) == 0 && n >= k &&
                    strcmp(t + n - k, "</tool_response>") == 0;
        if (is(c, i, "user") && !tool) {
            last_query = i;
            break;
        }
    }
    for (size_t i = 0; i < c->n; i++) {
        const char *t = content(c, i);
        if (is(c, i, "user") || (is(c, i, "system") && i > 0)) {
            chatml_turn(b, role(c, i), t);
            continue;
        }
        if (!is(c, i, "assistant"))
            continue;
        /* Python: reasoning = t.split('</think>')[0].rstrip('\n').split('<think>')[-1]
         * .lstrip('\n'); answer = t.split('</think>')[-1].lstrip('\n') */
        const char *ans = t, *rsn = "";
        size_t n_ans = strlen(t), n_rsn = 0;
        const char *end = strstr(t, "</think>");
        if (end) {
            rsn = t;
            n_rsn = (size_t)(end - t);
            strip_set(&rsn, &n_rsn, "\n", false, true);
            const char *open = find_last(rsn, n_rsn, "<think>");
            if (open) {
                n_rsn -= (size_t)(open + strlen("<think>") - rsn);
                rsn = open + strlen("<think>");
            }
            strip_set(&rsn, &n_rsn, "\n", true, false);
            ans = find_last(t, n_ans, "</think>") + strlen("</think>");
            n_ans = strlen(ans);
            strip_set(&ans, &n_ans, "\n", true, false);
        }
        put(b, "<|im_start|>assistant\n");
        if (i > last_query && (i + 1 == c->n || n_rsn > 0)) {
            strip_set(&rsn, &n_rsn, "\n", true, true);
            put(b, "<think>\n");
            put_n(b, rsn, n_rsn);
            put(b, "\n</think>\n\n");
            strip_set(&ans, &n_ans, "\n", true, false);
        }
        put_n(b, ans, n_ans);
        put(b, "<|im_end|>\n");
    }
    if (c->gen)
        put(b, "<|im_start|>assistant\n");
    return 0;
}

static int chatml(const struct conv *c, struct buf *b)
{
    const struct style *s = c->s;
    bool first_sys = is(c, 0, "system");
    if (s->flags & F_SYS_ALWAYS) {
        /* A system block always: the first system message's or the default; then only the
         * user and assistant turns, each user turn opening the assistant's. */
        chatml_turn(b, "system", first_sys ? content(c, 0) : s->sys_def ? s->sys_def : "");
        for (size_t i = 0; i < c->n; i++) {
            if (is(c, i, "user")) {
                put(b, "<|im_start|>user\n");
                put(b, content(c, i));
                put(b, "<|im_end|>\n<|im_start|>assistant\n");
            } else if (is(c, i, "assistant")) {
                put(b, content(c, i));
                put(b, "<|im_end|>\n");
            }
        }
        return 0;
    }
    if (s->sys_def && !first_sys)
        chatml_turn(b, "system", s->sys_def);
    if (s->flags & F_THINK)
        return qwen3(c, b);
    for (size_t i = 0; i < c->n; i++)
        chatml_turn(b, role(c, i), content(c, i));
    if (c->gen)
        put(b, "<|im_start|>assistant\n");
    return 0;
}

static void llama3_header(struct buf *b, const char *r)
{
    put(b, "<|start_header_id|>");
    put(b, r);
    put(b, "<|end_header_id|>\n\n");
}

static int llama3(const struct conv *c, struct buf *b)
{
    const struct style *s = c->s;
    size_t from = 0;
    if (s->flags & F_DATE) {
        /* Llama 3.1/3.2: BOS, then a system block always, dated, with the (trimmed) system
         * message if there is one. */
        put(b, c->bos);
        llama3_header(b, "system");
        put(b, "Cutting Knowledge Date: December 2023\nToday Date: ");
        put(b, s->date);
        put(b, "\n\n");
        from = is(c, 0, "system") ? 1 : 0;
        if (from)
            put_trim(b, content(c, 0));
        put(b, "<|eot_id|>");
    }
    for (size_t i = from; i < c->n; i++) {
        if (i == 0 && !(s->flags & F_DATE))   /* the dated form began with BOS */
            put(b, c->bos);
        llama3_header(b, role(c, i));
        put_trim(b, content(c, i));
        put(b, "<|eot_id|>");
    }
    if (c->gen || (s->flags & F_GEN_ALWAYS))
        llama3_header(b, "assistant");
    return 0;
}

static int llama2(const struct conv *c, struct buf *b)
{
    size_t from = is(c, 0, "system") ? 1 : 0;
    int rc = alternate(c, from);
    if (rc < 0)
        return rc;
    for (size_t i = from; i < c->n; i++) {
        /* The system message is folded into the first turn, then the whole is stripped. */
        struct buf t = {0};
        if (i == from && from == 1) {
            put(&t, "<<SYS>>\n");
            put(&t, content(c, 0));
            put(&t, "\n<</SYS>>\n\n");
        }
        put(&t, content(c, i));
        if (t.rc) {
            util_buf_free(&t.u);
            return t.rc;
        }
        const char *p = "";
        size_t n = 0;
        if (t.u.p)
            strip(t.u.s, t.u.len, &p, &n);
        if (is(c, i, "user")) {
            put(b, c->bos);
            put(b, "[INST] ");
            put_n(b, p, n);
            put(b, " [/INST]");
        } else if (is(c, i, "assistant")) {
            put(b, " ");
            put_n(b, p, n);
            put(b, " ");
            put(b, c->eos);
        }
        util_buf_free(&t.u);
    }
    return 0;
}

static int mistral(const struct conv *c, struct buf *b)
{
    const struct style *s = c->s;
    bool fold = s->flags & (F_FOLD_FIRST | F_FOLD_LAST);
    size_t from = fold && is(c, 0, "system") ? 1 : 0;
    int rc = alternate(c, from);
    if (rc == 0)
        rc = only_user_assistant(c, from);
    if (rc < 0)
        return rc;
    put(b, c->bos);
    for (size_t i = from; i < c->n; i++) {
        if (is(c, i, "user")) {
            put(b, s->user_pre);
            bool here = (s->flags & F_FOLD_FIRST) ? i == from : i + 1 == c->n;
            if (from == 1 && here) {
                put(b, content(c, 0));
                put(b, "\n\n");
            }
            put(b, content(c, i));
            put(b, s->user_post);
        } else {
            put(b, s->asst_pre);
            if (s->flags & F_TRIM)
                put_trim(b, content(c, i));
            else
                put(b, content(c, i));
            put(b, c->eos);
        }
    }
    return 0;
}

static int phi3(const struct conv *c, struct buf *b)
{
    const struct style *s = c->s;
    if (s->flags & F_BOS)
        put(b, c->bos);
    for (size_t i = 0; i < c->n; i++) {
        const char *t = content(c, i);
        if (is(c, i, "system")) {
            if ((s->flags & F_SYS_DROP) || ((s->flags & F_SYS_NONEMPTY) && !*t))
                continue;
            put(b, "<|system|>\n");
        } else if (is(c, i, "user")) {
            put(b, "<|user|>\n");
        } else if (is(c, i, "assistant")) {
            if (!(s->flags & F_USER_OPENS))
                put(b, "<|assistant|>\n");
        } else {
            continue;
        }
        put(b, t);
        put(b, "<|end|>\n");
        if ((s->flags & F_USER_OPENS) && is(c, i, "user"))
            put(b, "<|assistant|>\n");
    }
    if (!(s->flags & F_USER_OPENS)) {
        if (c->gen)
            put(b, "<|assistant|>\n");
        else if (s->flags & F_EOS_NO_GEN)
            put(b, c->eos);
    }
    return 0;
}

static int gemma(const struct conv *c, struct buf *b)
{
    const struct style *s = c->s;
    size_t from = 0;
    if (is(c, 0, "system")) {
        if (!(s->flags & F_FOLD_FIRST)) {
            util_seterr(c->err, c->errlen, "chat template %s: the system role is not "
                        "supported", s->name);
            return -EINVAL;
        }
        from = 1;
    }
    int rc = alternate(c, from);
    if (rc < 0)
        return rc;
    if (s->flags & F_BOS)
        put(b, c->bos);
    for (size_t i = from; i < c->n; i++) {
        put(b, "<start_of_turn>");
        put(b, is(c, i, "assistant") ? "model" : role(c, i));
        put(b, "\n");
        if (from == 1 && i == from) {
            put(b, content(c, 0));
            put(b, "\n\n");
        }
        put_trim(b, content(c, i));
        put(b, "<end_of_turn>\n");
    }
    if (c->gen)
        put(b, "<start_of_turn>model\n");
    return 0;
}

typedef int (*render_fn)(const struct conv *c, struct buf *b);
static const render_fn renderers[] = {
    [FAM_CHATML] = chatml, [FAM_LLAMA3] = llama3, [FAM_LLAMA2] = llama2,
    [FAM_MISTRAL] = mistral, [FAM_PHI3] = phi3, [FAM_GEMMA] = gemma,
};

/* ---- recognition ---- */

/* The template with Jinja's "\n" escapes as newlines and double quotes as single ones, so one
 * marker matches however a template spells its literals. malloc'd, or NULL. */
static char *normalise(const char *t)
{
    size_t n = strlen(t);
    char *o = malloc(n + 1), *q = o;
    if (!o)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        if (t[i] == '\\' && t[i + 1] == 'n') {
            *q++ = '\n';
            i++;
        } else {
            *q++ = t[i] == '"' ? '\'' : t[i];
        }
    }
    *q = 0;
    return o;
}

/* Copy the literal text from p up to the first unescaped quote or the terminator term (when
 * not NULL), undoing \' escapes, into out[n]. False when it does not end or does not fit. */
static bool literal(const char *p, const char *term, char *out, size_t n)
{
    size_t k = 0;
    for (; *p; p++) {
        if (term && strncmp(p, term, strlen(term)) == 0)
            break;
        if (*p == '\'' && !term)
            break;
        if (*p == '\'' && term)
            return false;
        if (*p == '\\' && p[1] == '\'')
            p++;
        if (k + 1 >= n)
            return false;
        out[k++] = *p;
    }
    if (!*p)
        return false;
    out[k] = 0;
    return true;
}

/* The default system prompt of a ChatML template (Qwen's): a "system_message = '...'"
 * assignment or a literal system block with its text; false when there is none. */
static bool chatml_default_system(const char *t, char *out, size_t n)
{
    const char *p = strstr(t, "system_message = '");
    if (p && literal(p + strlen("system_message = '"), NULL, out, n))
        return true;
    const char *mark = "<|im_start|>system\n";
    for (p = strstr(t, mark); p; p = strstr(p + 1, mark)) {
        const char *q = p + strlen(mark);
        if (*q != '\'' && literal(q, "<|im_end|>", out, n))
            return true;
    }
    return false;
}

static const struct style *style_find(const char *name)
{
    for (size_t i = 0; i < N_STYLES; i++)
        if (strcmp(styles[i].name, name) == 0)
            return &styles[i];
    return NULL;
}

/* Recognise a template (normalised) into r: 0, or -ENOTSUP. */
static int recognise(const char *t, struct rec *r)
{
    const struct style *base;
    unsigned add = 0, drop = 0;
    bool gen = strstr(t, "add_generation_prompt") != NULL;
    bool bos = strstr(t, "bos_token") != NULL;
    /* Relatives that share a family's markers but lay turns out otherwise (Phi-4's
     * "<|im_sep|>", Mistral's "[SYSTEM_PROMPT]" block) are refused, never misrendered. */
    if (strstr(t, "<|im_sep|>") || strstr(t, "[SYSTEM_PROMPT]"))
        return -ENOTSUP;
    if (strstr(t, "<|im_start|>")) {
        base = style_find("chatml");
        r->s = *base;
        if (strstr(t, "</think>") && strstr(t, "last_query_index"))
            add |= F_THINK;
        else if (chatml_default_system(t, r->sys, sizeof r->sys))
            r->s.sys_def = r->sys;
        if (!gen)
            add |= F_SYS_ALWAYS;
    } else if (strstr(t, "<|start_header_id|>")) {
        const char *d = strstr(t, "date_string = '");
        base = style_find(strstr(t, "Cutting Knowledge Date") ? "llama3.1" : "llama3");
        r->s = *base;
        if (d && literal(d + strlen("date_string = '"), NULL, r->date, sizeof r->date))
            r->s.date = r->date;
        if (!gen)
            add |= F_GEN_ALWAYS;
    } else if (strstr(t, "<start_of_turn>")) {
        base = style_find(strstr(t, "first_user_prefix") ? "gemma" : "gemma2");
        r->s = *base;
        if (!bos)
            drop |= F_BOS;
    } else if (strstr(t, "<|user|>")) {
        r->s = *style_find("phi3");
        if (bos)
            add |= F_BOS;
        if (!gen) {
            add |= F_USER_OPENS;
            drop |= F_EOS_NO_GEN;
        } else if (!strstr(t, "eos_token")) {
            drop |= F_EOS_NO_GEN;
        }
        if (!strstr(t, "'system'"))
            add |= F_SYS_DROP;
        else if (strstr(t, "'system' and message['content']") ||
                 strstr(t, "'system' and message.content"))
            add |= F_SYS_NONEMPTY;
    } else if (strstr(t, "[INST]")) {
        if (strstr(t, "<<SYS>>"))
            r->s = *style_find("llama2");
        else if (strstr(t, "loop.last and system_message"))
            r->s = *style_find("mistral");
        else if (strstr(t, "loop.first and system_message"))
            r->s = *style_find("mistral-v2");
        else
            r->s = *style_find("mistral-v1");
    } else {
        return -ENOTSUP;
    }
    r->s.flags = (r->s.flags | add) & ~drop;
    return 0;
}

int model_chat_family(const char *tmpl, const char **name)
{
    char *t = normalise(tmpl);
    if (!t)
        return -ENOMEM;
    struct rec *r = malloc(sizeof *r);
    int rc = r ? recognise(t, r) : -ENOMEM;
    if (rc == 0)
        *name = fam_names[r->s.fam];
    free(r);
    free(t);
    return rc;
}

void model_chat_names(char *buf, size_t n)
{
    size_t k = 0;
    if (n)
        buf[0] = 0;
    for (size_t i = 0; i < N_STYLES && k < n; i++) {
        int w = snprintf(buf + k, n - k, "%s%s", i ? ", " : "", styles[i].name);
        if (w < 0)
            break;
        k += (size_t)w;
    }
}

int model_chat_render_text(char **out, const char *tmpl, const char *name, const char *bos,
                           const char *eos, const struct model_chat_msg *msgs, size_t n,
                           bool add_assistant, char *err, size_t errlen)
{
    *out = NULL;
    struct rec *r = calloc(1, sizeof *r);
    if (!r)
        return -ENOMEM;
    int rc = 0;
    if (name) {
        const struct style *s = style_find(name);
        if (!s) {
            char names[256];
            model_chat_names(names, sizeof names);
            util_seterr(err, errlen, "chat template '%s' unknown (known: %s)", name, names);
            rc = -ENOTSUP;
            goto out_rec;
        }
        r->s = *s;
    } else if (!tmpl) {
        util_seterr(err, errlen, "the model has no tokenizer.chat_template: name a family "
                    "with --chat-template");
        rc = -ENOTSUP;
        goto out_rec;
    } else {
        char *t = normalise(tmpl);
        if (!t) {
            rc = -ENOMEM;
            goto out_rec;
        }
        rc = recognise(t, r);
        free(t);
        if (rc < 0) {
            /* The first 40 characters, control characters shown as spaces. */
            char head[41];
            size_t k = 0;
            for (; k < 40 && tmpl[k]; k++)
                head[k] = (unsigned char)tmpl[k] < 0x20 ? ' ' : tmpl[k];
            while (k > 0 && tmpl[k] && ((unsigned char)tmpl[k] & 0xc0) == 0x80)
                k--;   /* never half a UTF-8 character */
            head[k] = 0;
            util_seterr(err, errlen, "chat template not recognised (starts \"%s\"%s): name a "
                        "family with --chat-template", head, tmpl[k] ? "..." : "");
            goto out_rec;
        }
    }
    if (n == 0) {
        util_seterr(err, errlen, "chat template %s: no messages", r->s.name);
        rc = -EINVAL;
        goto out_rec;
    }
    for (size_t i = 0; i < n; i++) {
        const char *ro = msgs[i].role ? msgs[i].role : "(null)";
        if (strcmp(ro, "system") && strcmp(ro, "user") && strcmp(ro, "assistant")) {
            util_seterr(err, errlen, "chat message %zu: role '%.64s' (system, user or "
                        "assistant)", i, ro);
            rc = -EINVAL;
            goto out_rec;
        }
    }
    struct conv c = {
        .s = &r->s, .m = msgs, .n = n, .gen = add_assistant,
        .bos = bos ? bos : r->s.bos, .eos = eos ? eos : r->s.eos, .err = err, .errlen = errlen,
    };
    struct buf b = {0};
    put(&b, "");
    if (b.rc == 0)
        rc = renderers[r->s.fam](&c, &b);
    if (rc == 0)
        rc = b.rc;
    if (rc < 0)
        util_buf_free(&b.u);
    else
        *out = b.u.s;
out_rec:
    free(r);
    return rc;
}

/* The text of the token whose id is at key, NUL-terminated in out[n]; false when absent. */
static bool token_text(const struct gguf_file *g, const char *key, char *out, size_t n)
{
    uint32_t id;
    const struct gguf_value *arr;
    if (!g || gguf_get_u32(g, key, &id) < 0 || gguf_get_arr(g, "tokenizer.ggml.tokens", &arr) < 0)
        return false;
    if (arr->v.arr.type != GGUF_V_STRING || id >= arr->v.arr.n)
        return false;
    const struct gguf_value *s = &arr->v.arr.items[id];
    if (s->v.str.len >= n)
        return false;
    memcpy(out, s->v.str.p, s->v.str.len);
    out[s->v.str.len] = 0;
    return true;
}

int model_chat_render(char **out, const struct gguf_file *g, const char *name,
                      const struct model_chat_msg *msgs, size_t n, bool add_assistant,
                      char *err, size_t errlen)
{
    *out = NULL;
    char bos[256], eos[256];
    bool has_bos = token_text(g, "tokenizer.ggml.bos_token_id", bos, sizeof bos);
    bool has_eos = token_text(g, "tokenizer.ggml.eos_token_id", eos, sizeof eos);
    char *tmpl = NULL;
    if (!name && g) {
        const struct gguf_kv *kv = gguf_kv_find(g, "tokenizer.chat_template");
        if (kv && kv->val.type == GGUF_V_STRING) {
            if (kv->val.v.str.len > TEMPLATE_MAX) {
                util_seterr(err, errlen, "tokenizer.chat_template: %llu bytes (limit %u)",
                            (unsigned long long)kv->val.v.str.len, TEMPLATE_MAX);
                return -EINVAL;
            }
            tmpl = malloc(kv->val.v.str.len + 1);
            if (!tmpl)
                return -ENOMEM;
            memcpy(tmpl, kv->val.v.str.p, kv->val.v.str.len);
            tmpl[kv->val.v.str.len] = 0;
        }
    }
    int rc = model_chat_render_text(out, tmpl, name, has_bos ? bos : NULL, has_eos ? eos : NULL,
                                    msgs, n, add_assistant, err, errlen);
    free(tmpl);
    return rc;
}

bool model_chat_has_bos(const struct gguf_file *g, const char *text)
{
    char bos[256];
    return token_text(g, "tokenizer.ggml.bos_token_id", bos, sizeof bos) && bos[0] &&
           strncmp(text, bos, strlen(bos)) == 0;
}

/* pull.c — fetch a stage window from a seeder or from a plain HTTP(S) GGUF URL (libcurl).
 *
 * Seeder: GET /v1/models, the catalog (/v1/catalog/<id>, checked to hash to its id, unless a
 * local catalog is given), then the window stream /v1/windows/<id>/<first>-<last> appended to
 * OUT.part; a restart resumes with Range + If-Range from the part's length.
 * Plain URL: the header is read with ranges that grow until gguf_file_parse has all it needs;
 * the window's header is built locally by the gguf window writer (so the result is the same
 * bytes `kvctl slice` writes), then only the window's tensor byte ranges are fetched (adjacent
 * tensors in one request) and written at their place in OUT.part; OUT.part.state records the
 * source's ETag and size and how far the ranges got.
 * Either way the window is verified tensor by tensor against the catalog, fsync'ed and renamed
 * to OUT; a window that fails verification is deleted, naming the first bad tensor.
 */
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>

#include "gguf/gguf.h"
#include "ring/ring.h"
#include "seed/seed.h"
#include "util/err.h"
#include "util/util.h"

#define PULL_HDR_FIRST (64u * 1024)
#define PULL_MEM_MAX (256u << 20)   /* models list / catalog / header held in memory */
#define PULL_STATE_EVERY (4u << 20) /* save the resume state this often */
#define PULL_MAX_GAP 4096           /* merge tensor ranges closer than this in the source */

struct pull {
    const struct seed_pull_opts *o;
    struct seed_pull_stats *st;
    CURL *curl;
    char *err;
    size_t errlen;
    /* progress */
    uint64_t total, done;
    double t0, last_draw;
    int last_decile;
    /* last response */
    long status;
    char etag[256];
    uint64_t cr_first, cr_last, cr_total; /* Content-Range */
    bool have_cr;
    uint64_t clen;
    bool have_clen;
};

static void seterr(struct pull *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void seterr(struct pull *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err, p->errlen, fmt, ap);
    va_end(ap);
}

/* Copy with truncation (NUL-terminated, n > 0). */
static void scopy(char *d, size_t n, const char *s)
{
    size_t l = strlen(s);
    if (l >= n)
        l = n - 1;
    memcpy(d, s, l);
    d[l] = 0;
}

void seed_pull_log_file(void *ud, int kind, const char *line)
{
    FILE *f = ud;
    if (kind == SEED_PULL_BAR)
        fprintf(f, "\r%s", line);
    else if (kind == SEED_PULL_BAR_END)
        fputc('\n', f);
    else
        fprintf(f, "%s\n", line);
    fflush(f);
}

/* A line for the caller's log (nothing when it gave none). */
static void pull_say(const struct seed_pull_opts *o, int kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void pull_say(const struct seed_pull_opts *o, int kind, const char *fmt, ...)
{
    if (!o->log)
        return;
    char line[KV_ERR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    o->log(o->log_ud, kind, line);
}

static void progress(struct pull *p, bool final)
{
    if (!p->o->progress || !p->o->log || !p->total)
        return;
    double t = util_now_s(), el = t - p->t0;
    double rate = el > 0 ? (double)(p->done - p->st->bytes_resumed) / el : 0;
    int pct = (int)(p->done * 100 / p->total);
    char d[32], tot[32], r[32];
    util_fmt_bytes(d, sizeof d, (double)p->done, 1, 0);
    util_fmt_bytes(tot, sizeof tot, (double)p->total, 1, 0);
    util_fmt_bytes(r, sizeof r, rate, 1, 0);
    double eta = rate > 0 ? (double)(p->total - p->done) / rate : 0;
    if (p->o->progress == 2) {
        if (!final && t - p->last_draw < 0.1)
            return;
        p->last_draw = t;
        char bar[31];
        int fill = pct * 30 / 100;
        for (int i = 0; i < 30; i++)
            bar[i] = i < fill ? '#' : '-';
        bar[30] = 0;
        pull_say(p->o, SEED_PULL_BAR, "[%s] %3d%% %s / %s  %s/s  ETA %.0fs   ", bar, pct, d, tot,
                 r, eta);
        if (final)
            pull_say(p->o, SEED_PULL_BAR_END, "%s", "");
    } else {
        int dec = pct / 10;
        if (dec > p->last_decile || (final && dec != p->last_decile)) {
            p->last_decile = dec;
            pull_say(p->o, SEED_PULL_LINE, "pull: %3d%% %s / %s  %s/s  ETA %.0fs", pct, d, tot, r,
                     eta);
        }
    }
}

/* ------------------------------------------------------------------ curl plumbing */

static size_t on_header(char *b, size_t sz, size_t n, void *ud)
{
    struct pull *p = ud;
    size_t len = sz * n;
    char line[512];
    size_t l = len < sizeof line - 1 ? len : sizeof line - 1;
    memcpy(line, b, l);
    line[l] = 0;
    while (l && (line[l - 1] == '\r' || line[l - 1] == '\n'))
        line[--l] = 0;
    if (strncmp(line, "HTTP/", 5) == 0) { /* a new response (redirects, 100): forget the last */
        p->etag[0] = 0;
        p->have_cr = p->have_clen = false;
        const char *sp = strchr(line, ' ');
        p->status = sp ? strtol(sp + 1, NULL, 10) : 0;
    } else if (strncasecmp(line, "ETag:", 5) == 0) {
        const char *v = line + 5;
        while (*v == ' ')
            v++;
        scopy(p->etag, sizeof p->etag, v);
    } else if (strncasecmp(line, "Content-Range:", 14) == 0) {
        unsigned long long a, b2, t;
        if (sscanf(line + 14, " bytes %llu-%llu/%llu", &a, &b2, &t) == 3 && a <= b2 && b2 < t) {
            p->cr_first = a;
            p->cr_last = b2;
            p->cr_total = t;
            p->have_cr = true;
        }
    } else if (strncasecmp(line, "Content-Length:", 15) == 0) {
        p->clen = strtoull(line + 15, NULL, 10);
        p->have_clen = true;
    }
    return len;
}

/* libcurl's progress hook, used only to honour o->cancel while nothing arrives. */
static int on_xfer(void *ud, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
    struct pull *p = ud;
    (void)dt; (void)dn; (void)ut; (void)un;
    return p->o->cancel && *p->o->cancel ? 1 : 0;
}

static void curl_setup(struct pull *p, const char *url)
{
    CURL *c = p->curl;
    curl_easy_reset(c);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 5L);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, p);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 15L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, p->o->timeout_s > 0 ? p->o->timeout_s : 30L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "kvasir-pull/1");
    curl_easy_setopt(c, CURLOPT_BUFFERSIZE, 512L * 1024); /* fewer, larger writes */
    if (p->o->cancel) {
        curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_xfer);
        curl_easy_setopt(c, CURLOPT_XFERINFODATA, p);
    }
    if (p->o->ca_file)
        curl_easy_setopt(c, CURLOPT_CAINFO, p->o->ca_file);
    if (p->o->max_rate)
        curl_easy_setopt(c, CURLOPT_MAX_RECV_SPEED_LARGE, (curl_off_t)p->o->max_rate);
    p->status = 0;
    p->st->requests++;
}

struct membuf {
    struct util_buf u;
    size_t max;
    struct pull *pull;  /* set by get_mem for a range request: */
    int64_t a, b;       /* the bytes asked for, [a, b] */
};

/* Whether the last answer is exactly a 206 for the bytes [a, b] asked for (b clipped to the
 * end of the file); with the reason in p->err when it is not. */
static bool range_ok(struct pull *p, const char *url, uint64_t a, uint64_t b)
{
    if (p->status != 206 || !p->have_cr) {
        seterr(p, "%s does not answer range requests (HTTP %ld without Content-Range)", url, p->status);
        return false;
    }
    uint64_t want_last = b < p->cr_total ? b : p->cr_total - 1;
    if (p->cr_first != a || p->cr_last != want_last) {
        seterr(p, "%s answered bytes %" PRIu64 "-%" PRIu64 "/%" PRIu64 " to a request for %" PRIu64
               "-%" PRIu64, url, p->cr_first, p->cr_last, p->cr_total, a, b);
        return false;
    }
    if (p->have_clen && p->clen != p->cr_last - p->cr_first + 1) {
        seterr(p, "%s: Content-Length %" PRIu64 " is not that of its Content-Range %" PRIu64 "-%" PRIu64,
               url, p->clen, p->cr_first, p->cr_last);
        return false;
    }
    return true;
}

static size_t on_mem(char *b, size_t sz, size_t n, void *ud)
{
    struct membuf *m = ud;
    size_t len = sz * n;
    if (m->pull && m->a >= 0 && (m->pull->status != 206 || !m->pull->have_cr ||
                                 m->pull->cr_first != (uint64_t)m->a))
        return 0; /* not the bytes asked for: nothing is kept (get_mem says why) */
    if (util_buf_append(&m->u, b, len, m->max))
        return 0; /* over the cap (or out of memory): curl stops with a write error */
    return len;
}

/* GET url (optionally bytes [a, b] inclusive) into m; 0 or negative with err. */
static int get_mem(struct pull *p, const char *url, int64_t a, int64_t b, struct membuf *m)
{
    curl_setup(p, url);
    char range[64];
    if (a >= 0) {
        snprintf(range, sizeof range, "%lld-%lld", (long long)a, (long long)b);
        curl_easy_setopt(p->curl, CURLOPT_RANGE, range);
    }
    m->pull = p;
    m->a = a;
    m->b = b;
    curl_easy_setopt(p->curl, CURLOPT_WRITEFUNCTION, on_mem);
    curl_easy_setopt(p->curl, CURLOPT_WRITEDATA, m);
    size_t before = m->u.len;
    CURLcode cc = curl_easy_perform(p->curl);
    p->st->bytes_fetched += m->u.len - before;
    if (a >= 0 && (p->status == 200 || p->status == 206)) {
        /* a range: the answer must be those bytes, all of them */
        if (!range_ok(p, url, (uint64_t)a, (uint64_t)b))
            return -EPROTO;
        if (cc == CURLE_OK && m->u.len - before != p->cr_last - p->cr_first + 1) {
            seterr(p, "GET %s: %zu bytes for the range %" PRIu64 "-%" PRIu64, url, m->u.len - before,
                   p->cr_first, p->cr_last);
            return -EPROTO;
        }
    }
    if (cc != CURLE_OK) {
        seterr(p, "GET %s: %s", url, curl_easy_strerror(cc));
        return -EIO;
    }
    if (p->status != 200 && p->status != 206) {
        /* a text reason from a seeder is worth showing */
        char reason[200] = "";
        if (m->u.len > before) {
            size_t n = m->u.len - before < sizeof reason - 1 ? m->u.len - before : sizeof reason - 1;
            memcpy(reason, m->u.s + before, n);
            reason[n] = 0;
            char *nl = strchr(reason, '\n');
            if (nl)
                *nl = 0;
        }
        seterr(p, "GET %s: HTTP %ld%s%s", url, p->status, reason[0] ? ": " : "", reason);
        return p->status == 404 ? -ENOENT : -EPROTO;
    }
    return 0;
}

/* ------------------------------------------------------------------ state file */

struct state {
    char url[2048], etag[256];
    uint64_t size, wsize, run, runoff;
};

static int state_load(const char *path, struct state *s)
{
    FILE *fp = fopen(path, "r");
    if (!fp)
        return -errno;
    memset(s, 0, sizeof *s);
    char line[2400];
    int magic = 0;
    while (fgets(line, sizeof line, fp)) {
        line[strcspn(line, "\n")] = 0;
        if (!strcmp(line, "kvasir-pull 1"))
            magic = 1;
        else if (!strncmp(line, "url ", 4))
            scopy(s->url, sizeof s->url, line + 4);
        else if (!strncmp(line, "etag ", 5))
            scopy(s->etag, sizeof s->etag, line + 5);
        else if (!strncmp(line, "size ", 5))
            s->size = strtoull(line + 5, NULL, 10);
        else if (!strncmp(line, "wsize ", 6))
            s->wsize = strtoull(line + 6, NULL, 10);
        else if (!strncmp(line, "run ", 4))
            s->run = strtoull(line + 4, NULL, 10);
        else if (!strncmp(line, "runoff ", 7))
            s->runoff = strtoull(line + 7, NULL, 10);
    }
    fclose(fp);
    return magic ? 0 : -EINVAL;
}

static int state_save(const char *path, const struct state *s)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *fp = fopen(tmp, "w");
    if (!fp)
        return -errno;
    fprintf(fp, "kvasir-pull 1\nurl %s\netag %s\nsize %" PRIu64 "\nwsize %" PRIu64
                "\nrun %" PRIu64 "\nrunoff %" PRIu64 "\n",
            s->url, s->etag, s->size, s->wsize, s->run, s->runoff);
    if (fclose(fp) != 0)
        return -errno;
    return rename(tmp, path) == 0 ? 0 : -errno;
}

/* ------------------------------------------------------------------ verify + install */

static int finish_inner(struct pull *p, const char *part, const char *statep,
                        const struct gguf_catalog *cat);
static int finish(struct pull *p, const char *part, const char *statep,
                  const struct gguf_catalog *cat)
{
    double t0 = util_now_s();
    int rc = finish_inner(p, part, statep, cat);
    p->st->verify_seconds = util_now_s() - t0;
    return rc;
}

static int finish_inner(struct pull *p, const char *part, const char *statep,
                        const struct gguf_catalog *cat)
{
    const struct seed_pull_opts *o = p->o;
    char err[KV_ERR_MAX] = "";
    struct gguf_file *f = NULL;
    int rc = gguf_file_open(&f, part, err, sizeof err);
    uint32_t a, b;
    if (rc) {
        seterr(p, "downloaded window does not parse: %s", err);
    } else if (gguf_window_get(f, &a, &b) != 0 || a != o->first || b != o->last) {
        seterr(p, "downloaded file is not the window [%u, %u)", o->first, o->last);
        rc = -EBADMSG;
    } else if (cat && (rc = gguf_catalog_verify(cat, f, err, sizeof err)) != 0) {
        seterr(p, "window refused: %s", err);
    }
    gguf_file_free(f);
    if (rc) {
        unlink(part); /* never resume from bytes that failed verification */
        unlink(statep);
        return rc;
    }
    int fd = open(part, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    if (rename(part, o->out_path) != 0) {
        rc = -errno;
        seterr(p, "rename %s -> %s: %s", part, o->out_path, strerror(errno));
        return rc;
    }
    unlink(statep);
    return 0;
}

/* ------------------------------------------------------------------ from a seeder */

struct filew {
    struct pull *p;
    int fd;
    uint64_t pos, limit;
    bool restart_ok;
    bool checked, bad;  /* answer checked before its first byte; failed a check (p->err) */
    bool encoded;       /* zstd asked for: Content-Length is not the window's */
    const char *url;
};

/* The answer to a window request, before its first byte is written: a 200 of the announced
 * size, or a 206 from exactly where the part ends to the end of the window. */
static bool window_answer_ok(struct filew *w)
{
    struct pull *p = w->p;
    if (p->status == 206) {
        if (!w->restart_ok) {
            seterr(p, "GET %s: a 206 to a request without Range", w->url);
            return false;
        }
        if (p->have_cr && p->cr_total != w->limit) {
            seterr(p, "GET %s: Content-Range total %" PRIu64 " is not the window's %" PRIu64 " bytes",
                   w->url, p->cr_total, w->limit);
            return false;
        }
        return range_ok(p, w->url, w->pos, w->limit - 1);
    }
    if (!w->encoded && p->have_clen && p->clen != w->limit) {
        seterr(p, "GET %s: Content-Length %" PRIu64 " is not the window's %" PRIu64 " bytes", w->url,
               p->clen, w->limit);
        return false;
    }
    return true;
}

static size_t on_file(char *b, size_t sz, size_t n, void *ud)
{
    struct filew *w = ud;
    struct pull *p = w->p;
    size_t len = sz * n;
    if (p->status != 200 && p->status != 206)
        return 0; /* an error page is not window bytes */
    if (!w->checked) {
        w->checked = true;
        if (!window_answer_ok(w)) {
            w->bad = true;
            return 0;
        }
    }
    if (w->restart_ok && p->status == 200 && w->pos > 0) {
        /* the server sent the whole window instead of the rest: start over */
        if (ftruncate(w->fd, 0) != 0)
            return 0;
        p->done -= w->pos;
        p->st->bytes_resumed = 0;
        w->pos = 0;
    }
    w->restart_ok = false;
    if (len > w->limit - w->pos) {
        seterr(p, "GET %s: more than the %" PRIu64 " bytes announced", w->url, w->limit);
        w->bad = true;
        return 0;
    }
    const char *c = b;
    size_t left = len;
    while (left) {
        ssize_t k = pwrite(w->fd, c, left, (off_t)w->pos);
        if (k <= 0)
            return 0;
        c += k;
        left -= (size_t)k;
        w->pos += (uint64_t)k;
    }
    p->done += len;
    p->st->bytes_fetched += len;
    progress(p, false);
    return len;
}

static int pick_model(struct pull *p, const char *base, const char *want_id, char id[65],
                      uint32_t *lf, uint32_t *ll)
{
    char url[2200];
    snprintf(url, sizeof url, "%s/v1/models", base);
    struct membuf m = {.max = 16u << 20};
    int rc = get_mem(p, url, -1, -1, &m);
    if (rc) {
        util_buf_free(&m.u);
        return rc;
    }
    cJSON *root = cJSON_ParseWithLength(m.u.s, m.u.len);
    util_buf_free(&m.u);
    cJSON *arr = root ? cJSON_GetObjectItemCaseSensitive(root, "models") : NULL;
    if (!cJSON_IsArray(arr)) {
        cJSON_Delete(root);
        seterr(p, "%s: not a seeder's model list", url);
        return -EPROTO;
    }
    int n = cJSON_GetArraySize(arr), found = 0;
    char ids[512] = "";
    for (int i = 0; i < n; i++) {
        cJSON *it = cJSON_GetArrayItem(arr, i);
        cJSON *jid = cJSON_GetObjectItemCaseSensitive(it, "id");
        cJSON *jl = cJSON_GetObjectItemCaseSensitive(it, "layers");
        if (!cJSON_IsString(jid) || strlen(jid->valuestring) != 64 || !cJSON_IsArray(jl) ||
            cJSON_GetArraySize(jl) != 2)
            continue;
        if (strlen(ids) + 70 < sizeof ids)
            snprintf(ids + strlen(ids), sizeof ids - strlen(ids), " %s", jid->valuestring);
        if (want_id && strcmp(want_id, jid->valuestring) != 0)
            continue;
        found++;
        memcpy(id, jid->valuestring, 65);
        double a = cJSON_GetArrayItem(jl, 0)->valuedouble, b = cJSON_GetArrayItem(jl, 1)->valuedouble;
        *lf = a >= 0 && a < 1e6 ? (uint32_t)a : 0;
        *ll = b >= 0 && b < 1e6 ? (uint32_t)b : 0;
    }
    cJSON_Delete(root);
    if (found == 1)
        return 0;
    if (want_id)
        seterr(p, "the seeder at %s does not serve model %s (it serves:%s)", base, want_id,
               ids[0] ? ids : " nothing");
    else
        seterr(p, "the seeder at %s serves %d models; choose one with --model (it serves:%s)",
               base, n, ids[0] ? ids : " nothing");
    return -ENOENT;
}

static int pull_seeder(struct pull *p, const char *base, struct gguf_catalog **catp,
                       const char *part, const char *statep)
{
    const struct seed_pull_opts *o = p->o;
    char id[65], cat_id[65] = "";
    uint32_t hf = 0, hl = 0;
    const char *want = o->model_id;
    if (*catp) {
        char *json;
        size_t len;
        int rc = gguf_catalog_to_json(*catp, &json, &len, cat_id);
        if (rc) {
            seterr(p, "catalog: %s", strerror(-rc));
            return rc;
        }
        free(json);
        if (want && strcmp(want, cat_id) != 0) {
            seterr(p, "--model %s is not the catalog's id %s", want, cat_id);
            return -EINVAL;
        }
        want = cat_id;
    }
    int rc = pick_model(p, base, want, id, &hf, &hl);
    if (rc)
        return rc;
    if (o->first < hf || o->last > hl) {
        seterr(p, "the seeder holds layers [%u, %u) of %s, not [%u, %u)", hf, hl, id, o->first,
               o->last);
        return -ENOENT;
    }
    char url[2300];
    if (!*catp) { /* the seeder's catalog, checked to be the one its id names */
        snprintf(url, sizeof url, "%s/v1/catalog/%s", base, id);
        struct membuf m = {.max = GGUF_CATALOG_MAX_JSON};
        if ((rc = get_mem(p, url, -1, -1, &m))) {
            util_buf_free(&m.u);
            return rc;
        }
        char got[65], err[KV_ERR_MAX] = "";
        rc = gguf_catalog_from_json(catp, m.u.s, m.u.len, got, err, sizeof err);
        util_buf_free(&m.u);
        if (rc) {
            seterr(p, "catalog from %s: %s", url, err);
            return rc;
        }
        if (strcmp(got, id) != 0) {
            seterr(p, "catalog from %s hashes to %s, not to its id", url, got);
            return -EBADMSG;
        }
    }
    snprintf(url, sizeof url, "%s/v1/windows/%s/%u-%u", base, id, o->first, o->last);
    /* HEAD: the identity size and ETag, for the state and for If-Range */
    curl_setup(p, url);
    curl_easy_setopt(p->curl, CURLOPT_NOBODY, 1L);
    CURLcode cc = curl_easy_perform(p->curl);
    if (cc != CURLE_OK || p->status != 200 || !p->have_clen) {
        if (cc != CURLE_OK)
            seterr(p, "HEAD %s: %s", url, curl_easy_strerror(cc));
        else
            seterr(p, "HEAD %s: HTTP %ld", url, p->status);
        return -EPROTO;
    }
    uint64_t size = p->clen, lo, hi;
    if ((rc = gguf_catalog_window_bound(*catp, o->first, o->last, &lo, &hi)) != 0) {
        seterr(p, "layers [%u, %u) are not a window of the catalog's model (%u layers)", o->first,
               o->last, (*catp)->n_main);
        return rc;
    }
    if (size < lo || size > hi) {
        seterr(p, "HEAD %s: %" PRIu64 " bytes announced; the catalog's window [%u, %u) has %" PRIu64
                  " to %" PRIu64, url, size, o->first, o->last, lo, hi);
        return -EBADMSG;
    }
    char etag[256];
    scopy(etag, sizeof etag, p->etag);
    struct state s;
    uint64_t have = 0;
    struct stat sb;
    if (state_load(statep, &s) == 0 && !strcmp(s.url, url) && !strcmp(s.etag, etag) &&
        s.wsize == size && stat(part, &sb) == 0 && (uint64_t)sb.st_size <= size)
        have = (uint64_t)sb.st_size;
    memset(&s, 0, sizeof s);
    scopy(s.url, sizeof s.url, url);
    scopy(s.etag, sizeof s.etag, etag);
    s.wsize = size;
    int fd = open(part, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        seterr(p, "%s: %s", part, strerror(errno));
        return -errno;
    }
    if (!have && ftruncate(fd, 0) != 0) {
        close(fd);
        seterr(p, "%s: %s", part, strerror(errno));
        return -EIO;
    }
    if ((rc = state_save(statep, &s))) {
        close(fd);
        seterr(p, "%s: %s", statep, strerror(-rc));
        return rc;
    }
    p->total = size;
    p->done = have;
    p->st->bytes_resumed = have;
    if (have && o->progress)
        pull_say(o, SEED_PULL_LINE, "pull: resuming at %" PRIu64 " of %" PRIu64 " bytes", have, size);
    struct filew w = {p, fd, have, size, have > 0, false, false, !have && o->zstd, url};
    if (have < size) {
        curl_setup(p, url);
        char range[64];
        struct curl_slist *hl2 = NULL;
        char ifr[300];
        if (have) {
            snprintf(range, sizeof range, "%" PRIu64 "-", have);
            curl_easy_setopt(p->curl, CURLOPT_RANGE, range);
            if (etag[0] && strncmp(etag, "W/", 2) != 0) { /* weak tags cannot guard ranges */
                snprintf(ifr, sizeof ifr, "If-Range: %s", etag);
                hl2 = curl_slist_append(hl2, ifr);
                curl_easy_setopt(p->curl, CURLOPT_HTTPHEADER, hl2);
            }
        } else if (o->zstd) {
            curl_easy_setopt(p->curl, CURLOPT_ACCEPT_ENCODING, "zstd");
        }
        curl_easy_setopt(p->curl, CURLOPT_WRITEFUNCTION, on_file);
        curl_easy_setopt(p->curl, CURLOPT_WRITEDATA, &w);
        cc = curl_easy_perform(p->curl);
        curl_slist_free_all(hl2);
        if (w.bad) { /* a failed check: drop the bytes, the next run starts clean */
            close(fd);
            unlink(part);
            unlink(statep);
            return -EPROTO;
        }
        if (cc != CURLE_OK || (p->status != 200 && p->status != 206)) {
            close(fd);
            if (cc != CURLE_OK)
                seterr(p, "transfer of %s interrupted at %" PRIu64 " of %" PRIu64
                          " bytes (%s); run again to resume",
                       url, w.pos, size, curl_easy_strerror(cc));
            else
                seterr(p, "GET %s: HTTP %ld", url, p->status);
            return -EIO;
        }
    }
    close(fd);
    if (w.pos != size) {
        seterr(p, "GET %s: got %" PRIu64 " of %" PRIu64 " bytes; run again to resume", url, w.pos,
               size);
        return -EIO;
    }
    progress(p, true);
    return finish(p, part, statep, *catp);
}

/* ------------------------------------------------------------------ from a plain URL */

struct piece {
    uint64_t src, dst, size; /* absolute in the source file; position in the window file */
};
struct run {
    uint64_t src_first, src_end; /* byte range to fetch */
    size_t p0, p1;               /* pieces [p0, p1) */
};

struct runw {
    struct pull *p;
    int fd;
    const struct piece *pieces;
    const struct run *r;
    uint64_t pos;        /* absolute source position of the next byte */
    struct state *s;
    const char *statep;
    uint64_t since_save;
    bool checked, stale;  /* the answer is still the same file (size, ETag)? */
    bool bad;             /* the answer failed a check (p->err says which): nothing is kept */
    const char *url;
};

static size_t on_run(char *b, size_t sz, size_t n, void *ud)
{
    struct runw *w = ud;
    struct pull *p = w->p;
    size_t len = sz * n;
    if (p->status != 206)
        return 0; /* the server ignored the range or the source changed: stop */
    if (!w->checked) { /* before the first byte is written */
        w->checked = true;
        if (!p->have_cr || p->cr_total != w->s->size ||
            (w->s->etag[0] && strcmp(p->etag, w->s->etag) != 0)) {
            w->stale = true;
            return 0;
        }
        if (!range_ok(p, w->url, w->pos, w->r->src_end - 1)) {
            w->bad = true;
            return 0;
        }
    }
    if (len > w->r->src_end - w->pos) {
        seterr(p, "%s sent more than the %" PRIu64 " bytes of range %" PRIu64 "-%" PRIu64, w->url,
               w->r->src_end - w->r->src_first, w->r->src_first, w->r->src_end - 1);
        w->bad = true;
        return 0;
    }
    uint64_t a = w->pos, e = w->pos + len;
    for (size_t i = w->r->p0; i < w->r->p1; i++) {
        const struct piece *pc = &w->pieces[i];
        uint64_t lo = a > pc->src ? a : pc->src, hi = e < pc->src + pc->size ? e : pc->src + pc->size;
        if (lo >= hi)
            continue;
        const char *c = b + (lo - a);
        uint64_t left = hi - lo, at = pc->dst + (lo - pc->src);
        while (left) {
            ssize_t k = pwrite(w->fd, c, (size_t)left, (off_t)at);
            if (k <= 0)
                return 0;
            c += k;
            left -= (uint64_t)k;
            at += (uint64_t)k;
        }
    }
    w->pos = e;
    p->done += len;
    p->st->bytes_fetched += len;
    w->since_save += len;
    if (w->since_save >= PULL_STATE_EVERY) {
        w->since_save = 0;
        w->s->runoff = w->pos - w->r->src_first;
        state_save(w->statep, w->s);
    }
    progress(p, false);
    return len;
}

static int pull_plain(struct pull *p, const char *url, const struct gguf_catalog *cat,
                      const char *part, const char *statep)
{
    const struct seed_pull_opts *o = p->o;
    /* 1. the source header, with ranges that grow until it parses */
    struct membuf m = {.max = (size_t)GGUF_MAX_HEADER};
    int rc = get_mem(p, url, 0, PULL_HDR_FIRST - 1, &m);
    if (rc) {
        util_buf_free(&m.u);
        return rc;
    }
    if (p->status != 206 || !p->have_cr) {
        util_buf_free(&m.u);
        seterr(p, "%s does not answer range requests (HTTP %ld without Content-Range)", url,
               p->status);
        return -EPROTO;
    }
    uint64_t size = p->cr_total;
    if (cat && size != cat->source_size) {
        util_buf_free(&m.u);
        seterr(p, "%s is %" PRIu64 " bytes, the catalog's source is %" PRIu64, url, size,
               cat->source_size);
        return -EBADMSG;
    }
    char etag[256];
    scopy(etag, sizeof etag, p->etag);
    struct gguf_file *src = NULL;
    char err[KV_ERR_MAX] = "";
    /* the header ends before the catalog's first tensor: no more is read for it */
    uint64_t hdr_cap = GGUF_MAX_HEADER;
    for (uint64_t i = 0; cat && i < cat->n_tensors; i++)
        if (cat->tensors[i].offset < hdr_cap)
            hdr_cap = cat->tensors[i].offset;
    for (;;) {
        size_t need = 0;
        err[0] = 0;
        rc = gguf_file_parse(&src, m.u.s, m.u.len, size, &need, err, sizeof err);
        if (rc != -EAGAIN)
            break;
        uint64_t want = need > 2 * m.u.len ? need : 2 * m.u.len;
        if (want > size)
            want = size;
        if (want > hdr_cap && need <= hdr_cap)
            want = hdr_cap;
        if (want <= m.u.len || want > hdr_cap) {
            rc = -EPROTO;
            snprintf(err, sizeof err, "header needs %zu bytes of a %" PRIu64 "-byte file (at most %" PRIu64
                     "%s)", need, size, hdr_cap, cat ? ", where the catalog's first tensor starts" : "");
            break;
        }
        if ((rc = get_mem(p, url, (int64_t)m.u.len, (int64_t)want - 1, &m)))
            break;
        if (strcmp(p->etag, etag) != 0 || p->cr_total != size) {
            rc = -ESTALE;
            snprintf(err, sizeof err, "the source changed while its header was read");
            break;
        }
    }
    util_buf_free(&m.u);
    if (rc) {
        if (err[0])
            seterr(p, "%s: %s", url, err);
        return rc;
    }
    /* 2. the window's header, built here exactly as `kvctl slice` builds it */
    char zero_sha[65];
    memset(zero_sha, '0', 64);
    zero_sha[64] = 0;
    const char *sha = cat ? cat->source_sha256 : o->source_sha256;
    if (!sha) {
        if (o->progress)
            pull_say(o, SEED_PULL_LINE, "pull: warning: no catalog and no --source-sha256: the "
                     "window's kvasir.source.sha256 is zeros and nothing is verified");
        sha = zero_sha;
    }
    struct gguf_window_opts wo = {o->first, o->last, sha};
    struct gguf_writer *wr = NULL;
    void *hdr = NULL;
    size_t hlen = 0;
    if ((rc = gguf_window_writer(&wr, src, &wo, err, sizeof err))) {
        gguf_file_free(src);
        seterr(p, "%s", err);
        return rc;
    }
    uint64_t wsize = gguf_writer_file_size(wr);
    rc = gguf_writer_header(wr, &hdr, &hlen);
    gguf_writer_free(wr);
    struct gguf_file *wf = NULL;
    size_t need = 0;
    if (!rc)
        rc = gguf_file_parse(&wf, hdr, hlen, wsize, &need, err, sizeof err);
    if (rc) {
        gguf_file_free(src);
        free(hdr);
        seterr(p, "window header: %s", err[0] ? err : strerror(-rc));
        return rc;
    }
    /* 3. pieces (window tensors) and runs (merged source ranges) */
    uint64_t nt = gguf_tensor_count(wf);
    struct piece *pc = calloc(nt ? nt : 1, sizeof *pc);
    struct run *runs = calloc(nt ? nt : 1, sizeof *runs);
    size_t nr = 0;
    uint64_t sds = gguf_file_data_offset(src), wds = gguf_file_data_offset(wf), fetch = 0;
    rc = pc && runs ? 0 : -ENOMEM;
    for (uint64_t i = 0; i < nt && !rc; i++) {
        const struct gguf_tensor *t = gguf_tensor_at(wf, i);
        const struct gguf_tensor *st = gguf_tensor_find(src, t->name);
        if (!st || st->size != t->size) {
            seterr(p, "window tensor %s missing from the source", t->name);
            rc = -EPROTO;
            break;
        }
        pc[i] = (struct piece){sds + st->offset, wds + t->offset, t->size};
        if (cat) {
            const struct gguf_catalog_tensor *ct = gguf_catalog_find(cat, t->name);
            if (!ct || ct->offset != pc[i].src || ct->size != t->size || ct->type != t->type) {
                seterr(p, "tensor %s at %s does not match the catalog (offset %" PRIu64
                          ", size %" PRIu64 ")", t->name, url, pc[i].src, t->size);
                rc = -EBADMSG;
                break;
            }
        }
        if (nr && pc[i].src >= runs[nr - 1].src_end &&
            pc[i].src - runs[nr - 1].src_end <= PULL_MAX_GAP) {
            fetch += pc[i].src + pc[i].size - runs[nr - 1].src_end;
            runs[nr - 1].src_end = pc[i].src + pc[i].size;
            runs[nr - 1].p1 = i + 1;
        } else {
            runs[nr++] = (struct run){pc[i].src, pc[i].src + pc[i].size, i, i + 1};
            fetch += pc[i].size;
        }
    }
    gguf_file_free(wf);
    gguf_file_free(src);
    if (rc) {
        free(pc);
        free(runs);
        free(hdr);
        return rc;
    }
    /* 4. resume state */
    struct state s;
    bool resume = state_load(statep, &s) == 0 && !strcmp(s.url, url) && !strcmp(s.etag, etag) &&
                  s.size == size && s.wsize == wsize && s.run <= nr && access(part, W_OK) == 0;
    if (!resume) {
        memset(&s, 0, sizeof s);
        scopy(s.url, sizeof s.url, url);
        scopy(s.etag, sizeof s.etag, etag);
        s.size = size;
        s.wsize = wsize;
    }
    int fd = open(part, O_WRONLY | O_CREAT | O_CLOEXEC | (resume ? 0 : O_TRUNC), 0644);
    if (fd < 0 || ftruncate(fd, (off_t)wsize) != 0 ||
        pwrite(fd, hdr, hlen, 0) != (ssize_t)hlen) {
        seterr(p, "%s: %s", part, strerror(errno));
        if (fd >= 0)
            close(fd);
        free(pc);
        free(runs);
        free(hdr);
        return -EIO;
    }
    free(hdr);
    state_save(statep, &s);
    p->total = fetch;
    p->done = 0;
    for (uint64_t r = 0; r < s.run && r < nr; r++)
        p->done += runs[r].src_end - runs[r].src_first;
    p->done += s.runoff;
    p->st->bytes_resumed = p->done;
    if (resume && p->done && o->progress)
        pull_say(o, SEED_PULL_LINE, "pull: resuming at %" PRIu64 " of %" PRIu64 " bytes", p->done,
                 fetch);
    /* 5. the ranges */
    for (size_t r = (size_t)s.run; r < nr && !rc; r++) {
        uint64_t from = runs[r].src_first + (r == s.run ? s.runoff : 0);
        if (from >= runs[r].src_end) {
            s.run = r + 1;
            s.runoff = 0;
            continue;
        }
        struct runw w = {p, fd, pc, &runs[r], from, &s, statep, 0, false, false, false, url};
        curl_setup(p, url);
        char range[80], ifr[300];
        snprintf(range, sizeof range, "%" PRIu64 "-%" PRIu64, from, runs[r].src_end - 1);
        curl_easy_setopt(p->curl, CURLOPT_RANGE, range);
        struct curl_slist *hl2 = NULL;
        if (etag[0] && strncmp(etag, "W/", 2) != 0) { /* weak tags cannot guard ranges */
            snprintf(ifr, sizeof ifr, "If-Range: %s", etag);
            hl2 = curl_slist_append(hl2, ifr);
            curl_easy_setopt(p->curl, CURLOPT_HTTPHEADER, hl2);
        }
        curl_easy_setopt(p->curl, CURLOPT_WRITEFUNCTION, on_run);
        curl_easy_setopt(p->curl, CURLOPT_WRITEDATA, &w);
        CURLcode cc = curl_easy_perform(p->curl);
        curl_slist_free_all(hl2);
        s.run = r;
        s.runoff = w.pos - runs[r].src_first;
        if (w.bad) {
            rc = -EPROTO;
        } else if (p->status == 200 || w.stale) {
            seterr(p, "%s changed since the partial download began (or ignores ranges); "
                      "run again to start over", url);
            rc = -ESTALE;
        } else if (cc != CURLE_OK || p->status != 206) {
            if (cc != CURLE_OK)
                seterr(p, "transfer from %s interrupted at %" PRIu64 " of %" PRIu64
                          " bytes (%s); run again to resume",
                       url, p->done, fetch, curl_easy_strerror(cc));
            else
                seterr(p, "GET %s (range %s): HTTP %ld", url, range, p->status);
            rc = -EIO;
        } else if (w.pos != runs[r].src_end) {
            seterr(p, "GET %s (range %s): short answer; run again to resume", url, range);
            rc = -EIO;
        } else {
            s.run = r + 1;
            s.runoff = 0;
        }
        if (!rc || rc == -EIO)
            state_save(statep, &s);
    }
    close(fd);
    free(pc);
    free(runs);
    if (rc && rc != -EIO) { /* a failed check: drop the bytes, the next run starts clean */
        unlink(part);
        unlink(statep);
    }
    if (rc)
        return rc;
    progress(p, true);
    return finish(p, part, statep, cat);
}

/* ------------------------------------------------------------------ entry */

static void curl_once(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

int seed_pull(const struct seed_pull_opts *o, struct seed_pull_stats *st, char *err, size_t errlen)
{
    struct seed_pull_stats dummy;
    if (!st)
        st = &dummy;
    memset(st, 0, sizeof *st);
    struct pull p = {.o = o, .st = st, .err = err, .errlen = errlen, .last_decile = 0};
    err[0] = 0;
    if (!o->url || !o->out_path || o->first >= o->last) {
        snprintf(err, errlen, "pull: need a URL, an output path and layers first < last");
        return -EINVAL;
    }
    size_t ul = strlen(o->url);
    if (ul > 2000 || (strncmp(o->url, "http://", 7) && strncmp(o->url, "https://", 8))) {
        snprintf(err, errlen, "pull: URL must be http:// or https:// (and under 2000 bytes)");
        return -EINVAL;
    }
    p.t0 = util_now_s();
    char part[4200], statep[4300];
    snprintf(part, sizeof part, "%s.part", o->out_path);
    snprintf(statep, sizeof statep, "%s.part.state", o->out_path);
    struct gguf_catalog *cat = NULL;
    int rc;
    if (o->catalog_path) {
        char e2[KV_ERR_MAX] = "", cid[65];
        if ((rc = gguf_catalog_load(&cat, o->catalog_path, cid, e2, sizeof e2))) {
            snprintf(err, errlen, "catalog %s: %s", o->catalog_path, e2);
            return rc;
        }
        if (o->model_id && strcmp(o->model_id, cid) != 0) {
            snprintf(err, errlen, "catalog %s is model %s, not %s", o->catalog_path, cid,
                     o->model_id);
            gguf_catalog_free(cat);
            return -EINVAL;
        }
    }
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, curl_once);
    p.curl = curl_easy_init();
    if (!p.curl) {
        gguf_catalog_free(cat);
        snprintf(err, errlen, "pull: cannot start libcurl");
        return -ENOMEM;
    }
    /* a seeder is named by its origin alone; anything with a path is a GGUF URL */
    const char *slash = strchr(o->url + (o->url[4] == 's' ? 8 : 7), '/');
    bool seeder = !slash || slash[1] == 0;
    if (seeder) {
        char base[2100];
        snprintf(base, sizeof base, "%.*s", (int)(slash ? (size_t)(slash - o->url) : ul), o->url);
        rc = pull_seeder(&p, base, &cat, part, statep);
    } else {
        rc = pull_plain(&p, o->url, cat, part, statep);
    }
    if (o->progress == 2 && rc)
        pull_say(o, SEED_PULL_BAR_END, "%s", "");
    if (rc && o->cancel && *o->cancel) {
        snprintf(err, errlen, "pull cancelled; run again to resume");
        rc = -ECANCELED;
    }
    st->seconds = util_now_s() - p.t0;
    curl_easy_cleanup(p.curl);
    gguf_catalog_free(cat);
    return rc;
}

int seed_window_from(const char *manifest, int rank, const char *url, const char *catalog_path,
                    const char *dir, int progress, seed_pull_log_cb log, void *log_ud, char *out,
                    size_t outlen, char *err, size_t errlen)
{
    struct ring_manifest *m = calloc(1, sizeof *m);
    if (!m)
        return -ENOMEM;
    int rc = ring_manifest_load(m, manifest, err, errlen);
    if (rc < 0) {
        free(m);
        return rc;
    }
    const struct ring_rank_info *me = NULL;
    for (uint32_t i = 0; i < m->n_ranks; i++)
        if ((int)m->ranks[i].rank == rank)
            me = &m->ranks[i];
    if (!me) {
        snprintf(err, errlen, "rank %d is not in %s", rank, manifest);
        free(m);
        return -ENOENT;
    }
    int n = snprintf(out, outlen, "%s/window-%u-%u.gguf", dir ? dir : ".", me->first, me->last);
    if (n < 0 || (size_t)n >= outlen) {
        snprintf(err, errlen, "window path too long");
        free(m);
        return -ENAMETOOLONG;
    }
    bool has_id = strlen(m->catalog) == 64;
    struct seed_pull_opts o = {.url = url, .first = me->first, .last = me->last,
                              .catalog_path = catalog_path,
                              .model_id = has_id ? m->catalog : NULL,
                              .out_path = out, .progress = progress, .log = log, .log_ud = log_ud};
    if (access(out, R_OK) == 0) {
        pull_say(&o, SEED_PULL_LINE, "pull: %s is there already; not pulled again", out);
        free(m);
        return 0;
    }
    rc = seed_pull(&o, NULL, err, errlen);
    free(m);
    return rc;
}

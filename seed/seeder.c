/* seed/seeder.c — the seeder: serves models and windows over the project's HTTP server.
 *
 * A window is never written anywhere: its mini-GGUF is described as a header (built by the
 * gguf module's window writer, held in memory) followed by segments that point into the
 * mapped source, with zero padding in between. The HTTP server pulls bytes from that
 * description at any offset, so Content-Length and ETag are known up front and Range works.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <uv.h>

#include "gguf/gguf.h"
#include "seed/seed.h"
#include "net/net.h"
#include "util/err.h"

#define SEED_WIN_CACHE 8 /* built window descriptions kept per model (headers can be MBs) */

struct win_body;

struct seed_model {
    char id[65];
    char *path;
    char name[128], arch[64];
    struct gguf_file *f;
    struct gguf_catalog *cat;
    char *cat_json;
    size_t cat_len;
    uint32_t n_layers, first, last; /* layers held */
    struct win_body *cache[SEED_WIN_CACHE];
    unsigned cache_next;
};

struct seed_server {
    struct net_http_server *srv;
    struct seed_model *m[SEED_MAX_MODELS];
    size_t n;
    uint64_t windows_served, window_errors, catalogs_served;
};

struct seg {
    uint64_t start, len;     /* in the window file */
    const uint8_t *src;      /* mapped source bytes */
};

struct win_body {
    int refs;                /* the cache's and each response's */
    uint32_t first, last;
    char etag[80];
    char *hdr;
    size_t hdr_len;
    uint64_t size;
    struct seg *segs;
    size_t nseg;
};

static const uint8_t zeros[4096];

static ptrdiff_t win_read(void *ud, uint64_t off, void *scratch, size_t max, const void **ptr)
{
    struct win_body *w = ud;
    (void)scratch;
    if (off >= w->size)
        return -EINVAL;
    if (off < w->hdr_len) {
        size_t n = w->hdr_len - (size_t)off;
        *ptr = w->hdr + off;
        return (ptrdiff_t)(n < max ? n : max);
    }
    /* last segment starting at or before off */
    size_t lo = 0, hi = w->nseg;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (w->segs[mid].start <= off)
            lo = mid;
        else
            hi = mid;
    }
    uint64_t gap_end = w->size;
    if (w->nseg && w->segs[lo].start <= off) {
        const struct seg *s = &w->segs[lo];
        if (off < s->start + s->len) {
            uint64_t n = s->start + s->len - off;
            *ptr = s->src + (off - s->start);
            return (ptrdiff_t)(n < max ? n : max);
        }
        if (lo + 1 < w->nseg)
            gap_end = w->segs[lo + 1].start;
    } else if (w->nseg) {
        gap_end = w->segs[0].start;
    }
    uint64_t n = gap_end - off;
    if (n > sizeof zeros)
        n = sizeof zeros;
    *ptr = zeros;
    return (ptrdiff_t)(n < max ? n : max);
}

static void win_release(void *ud)
{
    struct win_body *w = ud;
    if (--w->refs > 0)
        return;
    free(w->hdr);
    free(w->segs);
    free(w);
}

/* Describe the mini-GGUF of [first, last) of m: 0 or negative with err. */
static int win_build(struct seed_model *m, uint32_t first, uint32_t last, struct win_body **out,
                     char *etag, size_t etaglen, char *err, size_t errlen)
{
    struct gguf_window_opts o = {first, last, m->cat->source_sha256};
    struct gguf_writer *w = NULL;
    int rc = gguf_window_writer(&w, m->f, &o, err, errlen);
    if (rc)
        return rc;
    struct win_body *b = calloc(1, sizeof *b);
    if (b)
        b->refs = 1;
    void *hdr = NULL;
    size_t hl = 0;
    if (!b || (rc = gguf_writer_header(w, &hdr, &hl)) != 0) {
        snprintf(err, errlen, "window header: %s", strerror(rc ? -rc : ENOMEM));
        gguf_writer_free(w);
        free(b);
        return rc ? rc : -ENOMEM;
    }
    b->hdr = hdr;
    b->hdr_len = hl;
    b->size = gguf_writer_file_size(w);
    gguf_writer_free(w);
    /* parse our own header to learn where each tensor lands */
    struct gguf_file *wf = NULL;
    size_t need = 0;
    rc = gguf_file_parse(&wf, hdr, hl, b->size, &need, err, errlen);
    if (rc) {
        win_release(b);
        return rc;
    }
    uint64_t nt = gguf_tensor_count(wf);
    b->segs = calloc(nt ? nt : 1, sizeof *b->segs);
    if (!b->segs) {
        gguf_file_free(wf);
        win_release(b);
        return -ENOMEM;
    }
    uint64_t ds = gguf_file_data_offset(wf);
    for (uint64_t i = 0; i < nt; i++) {
        const struct gguf_tensor *t = gguf_tensor_at(wf, i);
        const struct gguf_tensor *st = gguf_tensor_find(m->f, t->name);
        if (!st || !st->data || st->size != t->size || ds + t->offset < hl ||
            ds + t->offset + t->size > b->size ||
            (i > 0 && ds + t->offset < b->segs[i - 1].start + b->segs[i - 1].len)) {
            snprintf(err, errlen, "window tensor %s: no mapped source of %" PRIu64 " bytes",
                     t->name, t->size);
            gguf_file_free(wf);
            win_release(b);
            return -EIO;
        }
        b->segs[b->nseg++] = (struct seg){ds + t->offset, t->size, st->data};
    }
    gguf_file_free(wf);
    /* ETag: the catalog (tensor bytes) and the header bytes determine every byte */
    char hx[65], *buf = malloc(hl + 64);
    if (!buf) {
        win_release(b);
        return -ENOMEM;
    }
    memcpy(buf, m->id, 64);
    memcpy(buf + 64, hdr, hl);
    gguf_sha256_hex(buf, hl + 64, hx);
    free(buf);
    snprintf(etag, etaglen, "\"%.32s\"", hx);
    *out = b;
    return 0;
}

/* The description of [first, last) from the cache, or built and cached; one reference is
 * the caller's. */
static int win_get(struct seed_model *m, uint32_t first, uint32_t last, struct win_body **out,
                   char *err, size_t errlen)
{
    for (unsigned i = 0; i < SEED_WIN_CACHE; i++) {
        struct win_body *w = m->cache[i];
        if (w && w->first == first && w->last == last) {
            w->refs++;
            *out = w;
            return 0;
        }
    }
    struct win_body *w;
    char etag[80];
    int rc = win_build(m, first, last, &w, etag, sizeof etag, err, errlen);
    if (rc)
        return rc;
    w->first = first;
    w->last = last;
    memcpy(w->etag, etag, sizeof etag);
    unsigned slot = m->cache_next++ % SEED_WIN_CACHE;
    if (m->cache[slot])
        win_release(m->cache[slot]);
    m->cache[slot] = w;
    w->refs++; /* the cache's */
    *out = w;
    return 0;
}

static struct seed_model *find_model(struct seed_server *s, const char *id)
{
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->m[i]->id, id) == 0)
            return s->m[i];
    return NULL;
}

static bool is_hex64(const char *p, size_t n)
{
    if (n != 64)
        return false;
    for (size_t i = 0; i < 64; i++)
        if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f')))
            return false;
    return true;
}

/* Decimal layer index of 1..6 digits; the rest of the string in *end. */
static int parse_layer(const char *p, const char **end, uint32_t *out)
{
    uint32_t v = 0;
    int n = 0;
    while (*p >= '0' && *p <= '9') {
        if (++n > 6)
            return -EINVAL;
        v = v * 10 + (uint32_t)(*p - '0');
        p++;
    }
    if (n == 0)
        return -EINVAL;
    *end = p;
    *out = v;
    return 0;
}

static void h_models(struct net_http_req *r, void *ud)
{
    struct seed_server *s = ud;
    cJSON *root = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(root, "models");
    for (size_t i = 0; i < s->n; i++) {
        struct seed_model *m = s->m[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "id", m->id);
        cJSON_AddStringToObject(o, "name", m->name);
        cJSON_AddStringToObject(o, "arch", m->arch);
        cJSON_AddNumberToObject(o, "n_layers", m->n_layers);
        cJSON *l = cJSON_AddArrayToObject(o, "layers");
        cJSON_AddItemToArray(l, cJSON_CreateNumber(m->first));
        cJSON_AddItemToArray(l, cJSON_CreateNumber(m->last));
        cJSON_AddNumberToObject(o, "size", (double)gguf_file_size(m->f));
        cJSON_AddItemToArray(arr, o);
    }
    char *txt = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!txt) {
        net_http_reply_error(r, 500, "out of memory");
        return;
    }
    net_http_reply(r, 200, "application/json", NULL, txt, strlen(txt));
    free(txt);
}

static ptrdiff_t mem_read(void *ud, uint64_t off, void *scratch, size_t max, const void **ptr)
{
    const struct seed_model *m = ud;
    (void)scratch;
    if (off >= m->cat_len)
        return -EINVAL;
    size_t n = m->cat_len - (size_t)off;
    *ptr = m->cat_json + off;
    return (ptrdiff_t)(n < max ? n : max);
}

static void h_catalog(struct net_http_req *r, void *ud)
{
    struct seed_server *s = ud;
    const char *id = net_http_req_path(r) + strlen("/v1/catalog/");
    if (!is_hex64(id, strlen(id))) {
        net_http_reply_error(r, 400, "model id '%.80s' is not 64 lowercase hex digits", id);
        return;
    }
    struct seed_model *m = find_model(s, id);
    if (!m) {
        net_http_reply_error(r, 404, "model %s is not served here", id);
        return;
    }
    s->catalogs_served++;
    char etag[72];
    snprintf(etag, sizeof etag, "\"%s\"", m->id);
    struct net_http_body b = {m->cat_len, etag, true, mem_read, NULL, m};
    net_http_reply_body(r, 200, "application/json", NULL, &b);
}

static void h_window(struct net_http_req *r, void *ud)
{
    struct seed_server *s = ud;
    const char *p = net_http_req_path(r) + strlen("/v1/windows/");
    const char *slash = strchr(p, '/');
    uint32_t first, last;
    const char *e;
    if (!slash || !is_hex64(p, (size_t)(slash - p))) {
        net_http_reply_error(r, 400, "expected /v1/windows/<64 hex id>/<first>-<last>");
        return;
    }
    if (parse_layer(slash + 1, &e, &first) != 0 || *e != '-' || parse_layer(e + 1, &e, &last) != 0 ||
        *e != 0) {
        net_http_reply_error(r, 400, "bad layer range '%.40s': expected <first>-<last> (half-open)",
                             slash + 1);
        return;
    }
    char id[65];
    memcpy(id, p, 64);
    id[64] = 0;
    struct seed_model *m = find_model(s, id);
    if (!m) {
        net_http_reply_error(r, 404, "model %s is not served here", id);
        return;
    }
    if (first >= last || last > m->n_layers) {
        net_http_reply_error(r, 400, "layers [%u, %u) are not a window of a %u-layer model",
                             first, last, m->n_layers);
        return;
    }
    if (first < m->first || last > m->last) {
        net_http_reply_error(r, 404, "layers [%u, %u) not held: this seeder holds [%u, %u) of %s",
                             first, last, m->first, m->last, id);
        return;
    }
    struct win_body *w;
    char err[KV_ERR_MAX] = "";
    int rc = win_get(m, first, last, &w, err, sizeof err);
    if (rc) {
        s->window_errors++;
        net_http_reply_error(r, 500, "window [%u, %u): %s", first, last, err);
        return;
    }
    s->windows_served++;
    char extra[128];
    snprintf(extra, sizeof extra, "X-Kvasir-Window: %u-%u\r\n", first, last);
    struct net_http_body b = {w->size, w->etag, true, win_read, win_release, w};
    net_http_reply_body(r, 200, "application/octet-stream", extra, &b);
}

static void h_stats(struct net_http_req *r, void *ud)
{
    struct seed_server *s = ud;
    const struct net_http_stats *st = net_http_server_stats(s->srv);
    char buf[1024];
    int n = snprintf(buf, sizeof buf,
                     "{\"requests\":%" PRIu64 ",\"windows_served\":%" PRIu64
                     ",\"catalogs_served\":%" PRIu64 ",\"body_bytes_sent\":%" PRIu64
                     ",\"bytes_sent\":%" PRIu64 ",\"responses_4xx\":%" PRIu64
                     ",\"conns_open\":%" PRIu64 ",\"addrs\":%" PRIu64
                     ",\"conns_refused\":%" PRIu64 ",\"conns_refused_addr\":%" PRIu64
                     ",\"timeouts\":{\"handshake\":%" PRIu64 ",\"header\":%" PRIu64
                     ",\"body\":%" PRIu64 ",\"idle\":%" PRIu64 ",\"write\":%" PRIu64
                     "},\"queued_bytes\":%" PRIu64 ",\"zstd_active\":%" PRIu64
                     ",\"zstd_declined\":%" PRIu64 "}",
                     st->requests, s->windows_served, s->catalogs_served, st->body_bytes_sent,
                     st->bytes_sent, st->responses_4xx, st->conns_open, st->addrs,
                     st->conns_refused, st->conns_refused_addr, st->timeouts_handshake,
                     st->timeouts_header, st->timeouts_body, st->timeouts_idle,
                     st->timeouts_write, st->queued_bytes, st->zstd_active, st->zstd_declined);
    net_http_reply(r, 200, "application/json", NULL, buf, (size_t)n);
}

int seed_server_new(struct seed_server **out, struct net_http_server *srv)
{
    struct seed_server *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    s->srv = srv;
    int rc = net_http_server_route(srv, "GET", "/v1/models", h_models, s);
    if (!rc)
        rc = net_http_server_route(srv, "GET", "/v1/catalog/*", h_catalog, s);
    if (!rc)
        rc = net_http_server_route(srv, "GET", "/v1/windows/*", h_window, s);
    if (!rc)
        rc = net_http_server_route(srv, "GET", "/v1/seeder/stats", h_stats, s);
    if (rc) {
        free(s);
        return rc;
    }
    *out = s;
    return 0;
}

static void model_free(struct seed_model *m)
{
    if (!m)
        return;
    for (unsigned i = 0; i < SEED_WIN_CACHE; i++)
        if (m->cache[i])
            win_release(m->cache[i]);
    gguf_file_free(m->f);
    gguf_catalog_free(m->cat);
    free(m->cat_json);
    free(m->path);
    free(m);
}

void seed_server_free(struct seed_server *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n; i++)
        model_free(s->m[i]);
    free(s);
}

/* Cheap consistency check (no hashing): every tensor of the file is in the catalog with the
 * same type and size, at the same absolute offset when the file is the full model. */
static int check_against_catalog(struct seed_model *m, bool is_window, char *err, size_t errlen)
{
    if (m->cat->n_layers && m->cat->n_layers != m->n_layers) {
        snprintf(err, errlen, "%s: %u layers, the catalog says %u", m->path, m->n_layers,
                 m->cat->n_layers);
        return -EBADMSG;
    }
    for (uint64_t i = 0; i < gguf_tensor_count(m->f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(m->f, i);
        const struct gguf_catalog_tensor *ct = gguf_catalog_find(m->cat, t->name);
        if (!ct || ct->type != t->type || ct->size != t->size ||
            (!is_window && ct->offset != gguf_file_data_offset(m->f) + t->offset)) {
            snprintf(err, errlen, "%s: tensor %s does not match the catalog", m->path, t->name);
            return -EBADMSG;
        }
    }
    return 0;
}

int seed_server_add(struct seed_server *s, const char *path, const char *catalog_path,
                   char id_hex[65], char *err, size_t errlen)
{
    if (s->n >= SEED_MAX_MODELS) {
        snprintf(err, errlen, "%s: more than %d served files", path, SEED_MAX_MODELS);
        return -ENOSPC;
    }
    struct seed_model *m = calloc(1, sizeof *m);
    if (!m)
        return -ENOMEM;
    int rc = -ENOMEM;
    if (!(m->path = strdup(path)))
        goto fail;
    if ((rc = gguf_file_open(&m->f, path, err, errlen)))
        goto fail;
    if ((rc = gguf_block_count(m->f, &m->n_layers))) {
        snprintf(err, errlen, "%s: no <arch>.block_count", path);
        goto fail;
    }
    bool is_window = gguf_window_get(m->f, &m->first, &m->last) == 0;
    if (!is_window) {
        m->first = 0;
        m->last = m->n_layers;
    } else if (m->first >= m->last || m->last > m->n_layers) {
        snprintf(err, errlen, "%s: window [%u, %u) outside [0, %u)", path, m->first, m->last,
                 m->n_layers);
        rc = -EINVAL;
        goto fail;
    }
    if (gguf_get_str(m->f, "general.name", m->name, sizeof m->name) != 0)
        m->name[0] = 0;
    if (gguf_get_str(m->f, "general.architecture", m->arch, sizeof m->arch) != 0)
        m->arch[0] = 0;
    char id[65];
    if (catalog_path) {
        if ((rc = gguf_catalog_load(&m->cat, catalog_path, id, err, errlen)))
            goto fail;
    } else if (is_window) {
        snprintf(err, errlen, "%s: a window file needs its model's catalog to be served", path);
        rc = -EINVAL;
        goto fail;
    } else if ((rc = gguf_catalog_build(&m->cat, m->f, err, errlen))) {
        goto fail;
    }
    if ((rc = gguf_catalog_to_json(m->cat, &m->cat_json, &m->cat_len, id)))
        goto fail;
    /* what is served must be what the catalog says */
    if ((rc = check_against_catalog(m, is_window, err, errlen)))
        goto fail;
    memcpy(m->id, id, 65);
    if (find_model(s, m->id)) {
        snprintf(err, errlen, "%s: model %s is already served", path, m->id);
        rc = -EEXIST;
        goto fail;
    }
    if ((rc = gguf_file_map_tensors(m->f, NULL, NULL, err, errlen)))
        goto fail;
    s->m[s->n++] = m;
    if (id_hex)
        memcpy(id_hex, m->id, 65);
    return 0;
fail:
    model_free(m);
    return rc;
}

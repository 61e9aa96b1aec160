/* catalog.c — model catalogs: per-tensor SHA-256 of a model file (one sequential pass),
 * canonical JSON whose own SHA-256 is the model id, and verification of windows. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <openssl/evp.h>

#include "gguf/gguf.h"
#include "gguf/internal.h"
#include "util/util.h"
#include "util/err.h"
#include "wtype/wtype.h"

void gguf_sha256_hex(const void *p, size_t n, char hex[65])
{
    unsigned char md[32];
    unsigned int l = 0;
    EVP_Digest(p, n, md, &l, EVP_sha256(), NULL);
    util_hex_encode(md, 32, hex);
}

static void meta_list_free(struct gguf_catalog_meta *m, uint64_t n)
{
    for (uint64_t i = 0; m && i < n; i++)
        free(m[i].key);
    free(m);
}

void gguf_catalog_free(struct gguf_catalog *c)
{
    if (!c)
        return;
    meta_list_free(c->meta, c->n_meta);
    free(c->tensors);
    free(c);
}

/* ---- the metadata digest (docs/gguf.md, "The metadata digest") */

bool gguf_catalog_window_key(const char *key)
{
    return !strcmp(key, "kvasir.window.first") || !strcmp(key, "kvasir.window.last") ||
           !strcmp(key, "kvasir.source.sha256");
}

static void md_le(EVP_MD_CTX *ctx, uint64_t v, size_t n)
{
    unsigned char b[8];
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)(v >> (8 * i));
    EVP_DigestUpdate(ctx, b, n);
}

/* A value's bytes as GGUF encodes them after its type (no type prefix): what a reader gets. */
static void md_body(EVP_MD_CTX *ctx, uint32_t type, const struct gguf_value *v)
{
    size_t w = gguf__vtype_size(type);
    switch (type) {
    case GGUF_V_I8: case GGUF_V_I16: case GGUF_V_I32: case GGUF_V_I64:
        md_le(ctx, (uint64_t)v->v.i, w);
        break;
    case GGUF_V_F32: {
        float x = (float)v->v.f;
        uint32_t u;
        memcpy(&u, &x, 4);
        md_le(ctx, u, 4);
        break;
    }
    case GGUF_V_F64: {
        uint64_t u;
        memcpy(&u, &v->v.f, 8);
        md_le(ctx, u, 8);
        break;
    }
    case GGUF_V_STRING:
        md_le(ctx, v->v.str.len, 8);
        EVP_DigestUpdate(ctx, v->v.str.p, (size_t)v->v.str.len);
        break;
    case GGUF_V_ARRAY: {
        uint32_t et = v->v.arr.type;
        md_le(ctx, et, 4);
        md_le(ctx, v->v.arr.n, 8);
        size_t ew = gguf__vtype_size(et);
        if (ew) /* the parser bounded n * ew by the header it read */
            EVP_DigestUpdate(ctx, v->v.arr.data, (size_t)(v->v.arr.n * ew));
        else
            for (uint64_t i = 0; i < v->v.arr.n; i++)
                md_body(ctx, et, &v->v.arr.items[i]);
        break;
    }
    default: /* U8..U64, BOOL */
        md_le(ctx, v->v.u, w);
        break;
    }
}

static int cmp_meta_key(const void *a, const void *b)
{
    return strcmp(((const struct gguf_catalog_meta *)a)->key, ((const struct gguf_catalog_meta *)b)->key);
}

/* The overall digest of a sorted key list: per key, its bytes, a NUL, its 32 digest bytes. */
static void meta_digest(const struct gguf_catalog_meta *m, uint64_t n, char hex[65])
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned char md[32];
    unsigned int l = 0;
    if (!ctx) {
        hex[0] = 0;
        return;
    }
    EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
    for (uint64_t i = 0; i < n; i++) {
        EVP_DigestUpdate(ctx, m[i].key, strlen(m[i].key) + 1);
        util_hex_decode(m[i].sha256, md, 32);
        EVP_DigestUpdate(ctx, md, 32);
    }
    EVP_DigestFinal_ex(ctx, md, &l);
    EVP_MD_CTX_free(ctx);
    util_hex_encode(md, 32, hex);
}

/* A file's metadata as a sorted list of (key, SHA-256 of type and value), window keys left out. */
static int meta_list(const struct gguf_file *f, struct gguf_catalog_meta **out, uint64_t *n_out,
                     char digest[65])
{
    uint64_t nkv = gguf_kv_count(f), n = 0;
    struct gguf_catalog_meta *m = calloc(nkv ? nkv : 1, sizeof *m);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!m || !ctx) {
        free(m);
        EVP_MD_CTX_free(ctx);
        return -ENOMEM;
    }
    for (uint64_t i = 0; i < nkv; i++) {
        const struct gguf_kv *kv = gguf_kv_at(f, i);
        if (gguf_catalog_window_key(kv->key))
            continue;
        if (!(m[n].key = strdup(kv->key))) {
            meta_list_free(m, n);
            EVP_MD_CTX_free(ctx);
            return -ENOMEM;
        }
        unsigned char md[32];
        unsigned int l = 0;
        EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
        md_le(ctx, kv->val.type, 4);
        md_body(ctx, kv->val.type, &kv->val);
        EVP_DigestFinal_ex(ctx, md, &l);
        util_hex_encode(md, 32, m[n].sha256);
        n++;
    }
    EVP_MD_CTX_free(ctx);
    qsort(m, n, sizeof *m, cmp_meta_key);
    meta_digest(m, n, digest);
    *out = m;
    *n_out = n;
    return 0;
}

int gguf_catalog_verify_metadata(const struct gguf_catalog *c, const struct gguf_file *f,
                                 char *err, size_t errlen)
{
    struct gguf_catalog_meta *m;
    uint64_t n;
    char digest[65];
    int rc = meta_list(f, &m, &n, digest);
    if (rc) {
        util_seterr(err, errlen, "metadata: %s", strerror(-rc));
        return rc;
    }
    if (!strcmp(digest, c->metadata_sha256)) {
        meta_list_free(m, n);
        return 0;
    }
    /* Both lists are sorted: walk them together to name the first difference. */
    uint64_t i = 0, j = 0;
    rc = -EBADMSG;
    while (i < n || j < c->n_meta) {
        int d = i == n ? 1 : j == c->n_meta ? -1 : strcmp(m[i].key, c->meta[j].key);
        if (d < 0) {
            util_seterr(err, errlen, "metadata %s: not in the catalog", m[i].key);
            goto out;
        }
        if (d > 0) {
            util_seterr(err, errlen, "metadata %s: missing (the catalog has it)", c->meta[j].key);
            goto out;
        }
        if (strcmp(m[i].sha256, c->meta[j].sha256)) {
            util_seterr(err, errlen, "metadata %s: sha256 %s differs from the catalog's %s", m[i].key,
                        m[i].sha256, c->meta[j].sha256);
            goto out;
        }
        i++;
        j++;
    }
    util_seterr(err, errlen, "metadata: digest %s differs from the catalog's %s", digest, c->metadata_sha256);
out:
    meta_list_free(m, n);
    return rc;
}

const struct gguf_catalog_tensor *gguf_catalog_find(const struct gguf_catalog *c, const char *name)
{
    for (uint64_t i = 0; i < c->n_tensors; i++)
        if (!strcmp(c->tensors[i].name, name))
            return &c->tensors[i];
    return NULL;
}

static int cmp_abs_offset(const void *a, const void *b)
{
    const struct gguf_catalog_tensor *x = *(const struct gguf_catalog_tensor *const *)a;
    const struct gguf_catalog_tensor *y = *(const struct gguf_catalog_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static int pread_full(int fd, void *buf, size_t n, uint64_t off)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        if (r == 0)
            return -EIO;
        got += (size_t)r;
    }
    return 0;
}

int gguf_catalog_build(struct gguf_catalog **out, const struct gguf_file *f, char *err, size_t errlen)
{
    *out = NULL;
    const char *path = gguf_file_path(f);
    if (!path) {
        util_seterr(err, errlen, "catalog: the file was parsed from memory");
        return -EBADF;
    }
    struct gguf_catalog *c = calloc(1, sizeof *c);
    uint64_t n = gguf_tensor_count(f);
    if (!c || !(c->tensors = calloc(n ? n : 1, sizeof *c->tensors))) {
        free(c);
        return -ENOMEM;
    }
    c->n_tensors = n;
    c->source_size = gguf_file_size(f);
    if (gguf_get_str(f, "general.architecture", c->arch, sizeof c->arch))
        c->arch[0] = 0;
    if (gguf_block_count(f, &c->n_layers))
        c->n_layers = 0;
    if (gguf_main_layers(f, &c->n_main))
        c->n_main = c->n_layers;
    int mrc = meta_list(f, &c->meta, &c->n_meta, c->metadata_sha256);
    if (mrc) {
        gguf_catalog_free(c);
        return mrc;
    }
    for (uint64_t i = 0; i < n; i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        struct gguf_catalog_tensor *ct = &c->tensors[i];
        snprintf(ct->name, sizeof ct->name, "%s", t->name);
        ct->type = t->type;
        ct->n_dims = t->n_dims;
        memcpy(ct->ne, t->ne, sizeof ct->ne);
        ct->offset = gguf_file_data_offset(f) + t->offset;
        ct->size = t->size;
    }
    /* One sequential pass: the file digest sees every byte; each tensor digest its range.
     * Tensors are disjoint (the parser checked), so sorted by offset they are met in order. */
    struct gguf_catalog_tensor **order = malloc((n ? n : 1) * sizeof *order);
    size_t bufsz = 4u << 20;
    unsigned char *buf = malloc(bufsz);
    EVP_MD_CTX *whole = EVP_MD_CTX_new(), *part = EVP_MD_CTX_new();
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    int rc = 0;
    if (!order || !buf || !whole || !part) {
        rc = -ENOMEM;
        goto out;
    }
    if (fd < 0) {
        rc = -errno;
        util_seterr(err, errlen, "catalog: %s: %s", path, strerror(errno));
        goto out;
    }
    for (uint64_t i = 0; i < n; i++)
        order[i] = &c->tensors[i];
    qsort(order, n, sizeof *order, cmp_abs_offset);
    EVP_DigestInit_ex(whole, EVP_sha256(), NULL);
    uint64_t pos = 0, size = c->source_size, k = 0;
    bool in_part = false;
    while (pos < size) {
        size_t len = size - pos < bufsz ? (size_t)(size - pos) : bufsz;
        if ((rc = pread_full(fd, buf, len, pos))) {
            util_seterr(err, errlen, "catalog: %s: read at %" PRIu64 ": %s", path, pos, strerror(-rc));
            goto out;
        }
        EVP_DigestUpdate(whole, buf, len);
        uint64_t cend = pos + len;
        while (k < n) {
            struct gguf_catalog_tensor *t = order[k];
            uint64_t ts = t->offset, te = t->offset + t->size;
            if (ts >= cend)
                break;
            uint64_t s = ts > pos ? ts : pos, e = te < cend ? te : cend;
            if (!in_part) {
                EVP_DigestInit_ex(part, EVP_sha256(), NULL);
                in_part = true;
            }
            EVP_DigestUpdate(part, buf + (s - pos), (size_t)(e - s));
            if (te > cend)
                break;
            unsigned char md[32];
            unsigned int l;
            EVP_DigestFinal_ex(part, md, &l);
            util_hex_encode(md, 32, t->sha256);
            in_part = false;
            k++;
        }
        pos = cend;
    }
    if (k != n) {
        rc = -EIO;
        util_seterr(err, errlen, "catalog: %s: file ended before tensor '%s'", path, order[k]->name);
        goto out;
    }
    unsigned char md[32];
    unsigned int l;
    EVP_DigestFinal_ex(whole, md, &l);
    util_hex_encode(md, 32, c->source_sha256);
out:
    if (fd >= 0)
        close(fd);
    EVP_MD_CTX_free(whole);
    EVP_MD_CTX_free(part);
    free(buf);
    free(order);
    if (rc) {
        gguf_catalog_free(c);
        return rc;
    }
    *out = c;
    return 0;
}

int gguf_catalog_to_json(const struct gguf_catalog *c, char **json, size_t *len, char id_hex[65])
{
    cJSON *root = cJSON_CreateObject(), *arr;
    if (!root)
        return -ENOMEM;
    cJSON_AddNumberToObject(root, "version", GGUF_CATALOG_VERSION);
    cJSON_AddStringToObject(root, "source_sha256", c->source_sha256);
    cJSON_AddNumberToObject(root, "source_size", (double)c->source_size);
    cJSON_AddStringToObject(root, "arch", c->arch);
    cJSON_AddNumberToObject(root, "n_layers", c->n_layers);
    cJSON_AddNumberToObject(root, "n_main_layers", c->n_main);
    cJSON_AddStringToObject(root, "metadata_sha256", c->metadata_sha256);
    cJSON *meta = cJSON_AddArrayToObject(root, "metadata");
    for (uint64_t i = 0; meta && i < c->n_meta; i++) {
        cJSON *o = cJSON_CreateObject();
        if (!o)
            break;
        cJSON_AddItemToArray(meta, o);
        cJSON_AddStringToObject(o, "key", c->meta[i].key);
        cJSON_AddStringToObject(o, "sha256", c->meta[i].sha256);
    }
    arr = cJSON_AddArrayToObject(root, "tensors");
    for (uint64_t i = 0; arr && i < c->n_tensors; i++) {
        const struct gguf_catalog_tensor *t = &c->tensors[i];
        cJSON *o = cJSON_CreateObject();
        if (!o)
            break;
        cJSON_AddItemToArray(arr, o);
        cJSON_AddStringToObject(o, "name", t->name);
        const struct wtype_info *ti = wtype_info(t->type);
        cJSON_AddStringToObject(o, "type", ti ? ti->name : "?");
        cJSON *sh = cJSON_AddArrayToObject(o, "shape");
        for (uint32_t d = 0; sh && d < t->n_dims; d++)
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->ne[d]));
        cJSON_AddNumberToObject(o, "offset", (double)t->offset);
        cJSON_AddNumberToObject(o, "size", (double)t->size);
        cJSON_AddStringToObject(o, "sha256", t->sha256);
    }
    char *s = cJSON_Print(root);
    cJSON_Delete(root);
    if (!s)
        return -ENOMEM;
    size_t l = strlen(s);
    char *withnl = realloc(s, l + 2);
    if (!withnl) {
        free(s);
        return -ENOMEM;
    }
    withnl[l] = '\n';
    withnl[l + 1] = 0;
    *json = withnl;
    *len = l + 1;
    if (id_hex)
        gguf_sha256_hex(withnl, l + 1, id_hex);
    return 0;
}

static bool is_hex64(const char *s)
{
    if (!s || strlen(s) != 64)
        return false;
    for (int i = 0; i < 64; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return true;
}

/* A non-negative integer JSON number below 2^53 (exact in a double). */
static bool json_u64(const cJSON *o, uint64_t *out)
{
    if (!cJSON_IsNumber(o))
        return false;
    double d = o->valuedouble;
    if (!(d >= 0 && d <= 9007199254740992.0) || d != (double)(uint64_t)d)
        return false;
    *out = (uint64_t)d;
    return true;
}

/* The metadata list: keys strictly increasing (so sorted and unique), each digest 64 hex
 * digits, and metadata_sha256 the digest over them. */
static int meta_from_json(struct gguf_catalog *c, const cJSON *root, char *err, size_t errlen)
{
    const char *s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(root, "metadata_sha256"));
    if (!is_hex64(s)) {
        util_seterr(err, errlen, "catalog: metadata_sha256 must be 64 lowercase hex digits");
        return -EBADMSG;
    }
    memcpy(c->metadata_sha256, s, 65);
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(root, "metadata");
    int n = cJSON_IsArray(arr) ? cJSON_GetArraySize(arr) : -1;
    if (n < 0 || (uint64_t)n > GGUF_MAX_KV) {
        util_seterr(err, errlen, "catalog: metadata must be an array of at most %u keys", GGUF_MAX_KV);
        return -EBADMSG;
    }
    if (!(c->meta = calloc(n ? (size_t)n : 1, sizeof *c->meta)))
        return -ENOMEM;
    const cJSON *o;
    cJSON_ArrayForEach(o, arr) {
        const char *key = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "key"));
        s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "sha256"));
        if (!key || !key[0] || strlen(key) > GGUF_MAX_KEY || !is_hex64(s)) {
            util_seterr(err, errlen, "catalog: metadata entry %" PRIu64 ": key (1..%d bytes) and sha256 "
                        "(64 lowercase hex digits) required", c->n_meta, GGUF_MAX_KEY);
            return -EBADMSG;
        }
        if (c->n_meta && strcmp(c->meta[c->n_meta - 1].key, key) >= 0) {
            util_seterr(err, errlen, "catalog: metadata key '%s' out of order or repeated", key);
            return -EBADMSG;
        }
        if (!(c->meta[c->n_meta].key = strdup(key)))
            return -ENOMEM;
        memcpy(c->meta[c->n_meta].sha256, s, 65);
        c->n_meta++;
    }
    char digest[65];
    meta_digest(c->meta, c->n_meta, digest);
    if (strcmp(digest, c->metadata_sha256)) {
        util_seterr(err, errlen, "catalog: metadata_sha256 %s is not the digest of its metadata list (%s)",
                    c->metadata_sha256, digest);
        return -EBADMSG;
    }
    return 0;
}

int gguf_catalog_from_json(struct gguf_catalog **out, const char *json, size_t len, char id_hex[65],
                           char *err, size_t errlen)
{
    *out = NULL;
    if (len > GGUF_CATALOG_MAX_JSON) {
        util_seterr(err, errlen, "catalog: %zu bytes exceeds cap %u", len, GGUF_CATALOG_MAX_JSON);
        return -EMSGSIZE;
    }
    if (id_hex)
        gguf_sha256_hex(json, len, id_hex);
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) {
        util_seterr(err, errlen, "catalog: not valid JSON");
        return -EBADMSG;
    }
    int rc = -EBADMSG;
    struct gguf_catalog *c = calloc(1, sizeof *c);
    if (!c) {
        rc = -ENOMEM;
        goto out;
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "version");
    uint64_t u;
    if (json_u64(v, &u) && u == 1) {
        util_seterr(err, errlen, "catalog: version 1 does not cover the window's metadata; "
                    "re-run kvctl catalog on the model to write version %d", GGUF_CATALOG_VERSION);
        goto out;
    }
    if (!json_u64(v, &u) || u != GGUF_CATALOG_VERSION) {
        util_seterr(err, errlen, "catalog: version must be %d", GGUF_CATALOG_VERSION);
        goto out;
    }
    const char *s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(root, "source_sha256"));
    if (!is_hex64(s)) {
        util_seterr(err, errlen, "catalog: source_sha256 must be 64 lowercase hex digits");
        goto out;
    }
    memcpy(c->source_sha256, s, 65);
    if (!json_u64(cJSON_GetObjectItemCaseSensitive(root, "source_size"), &c->source_size)) {
        util_seterr(err, errlen, "catalog: source_size must be a non-negative integer");
        goto out;
    }
    s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(root, "arch"));
    if (!s || strlen(s) >= sizeof c->arch) {
        util_seterr(err, errlen, "catalog: arch must be a string shorter than %zu", sizeof c->arch);
        goto out;
    }
    strcpy(c->arch, s);
    if (!json_u64(cJSON_GetObjectItemCaseSensitive(root, "n_layers"), &u) || u > 1000000) {
        util_seterr(err, errlen, "catalog: n_layers must be an integer in [0, 1000000]");
        goto out;
    }
    c->n_layers = (uint32_t)u;
    if (!json_u64(cJSON_GetObjectItemCaseSensitive(root, "n_main_layers"), &u) || u > c->n_layers) {
        util_seterr(err, errlen, "catalog: n_main_layers must be an integer in [0, n_layers %u]", c->n_layers);
        goto out;
    }
    c->n_main = (uint32_t)u;
    if ((rc = meta_from_json(c, root, err, errlen)))
        goto out;
    rc = -EBADMSG;
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(root, "tensors");
    if (!cJSON_IsArray(arr)) {
        util_seterr(err, errlen, "catalog: tensors must be an array");
        goto out;
    }
    int n = cJSON_GetArraySize(arr);
    if (n < 0 || (uint64_t)n > GGUF_MAX_TENSORS) {
        util_seterr(err, errlen, "catalog: %d tensors exceeds cap %u", n, GGUF_MAX_TENSORS);
        goto out;
    }
    c->tensors = calloc(n ? (size_t)n : 1, sizeof *c->tensors);
    if (!c->tensors) {
        rc = -ENOMEM;
        goto out;
    }
    c->n_tensors = (uint64_t)n;
    int i = 0;
    const cJSON *o;
    cJSON_ArrayForEach(o, arr) {
        struct gguf_catalog_tensor *t = &c->tensors[i];
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "name"));
        if (!name || !name[0] || strlen(name) > GGUF_MAX_NAME) {
            util_seterr(err, errlen, "catalog: tensor %d: name missing or longer than %d", i, GGUF_MAX_NAME);
            goto out;
        }
        strcpy(t->name, name);
        const char *ty = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "type"));
        int tid = ty ? wtype_by_name(ty) : -1;
        if (tid < 0) {
            util_seterr(err, errlen, "catalog: tensor %s: type '%s' unknown", name, ty ? ty : "(none)");
            goto out;
        }
        t->type = (uint32_t)tid;
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(o, "shape");
        int nd = cJSON_IsArray(sh) ? cJSON_GetArraySize(sh) : -1;
        if (nd < 1 || nd > GGUF_MAX_DIMS) {
            util_seterr(err, errlen, "catalog: tensor %s: shape must have 1..%d dims", name, GGUF_MAX_DIMS);
            goto out;
        }
        t->n_dims = (uint32_t)nd;
        uint64_t nel = 1;
        for (int d = 0; d < GGUF_MAX_DIMS; d++) {
            t->ne[d] = 1;
            if (d < nd && (!json_u64(cJSON_GetArrayItem(sh, d), &t->ne[d]) || t->ne[d] == 0 ||
                           nel > UINT64_MAX / t->ne[d])) {
                util_seterr(err, errlen, "catalog: tensor %s: dim %d invalid", name, d);
                goto out;
            }
            nel *= t->ne[d];
        }
        uint64_t want;
        if (!json_u64(cJSON_GetObjectItemCaseSensitive(o, "offset"), &t->offset) ||
            !json_u64(cJSON_GetObjectItemCaseSensitive(o, "size"), &t->size) ||
            wtype_bytes(t->type, nel, &want) || want != t->size) {
            util_seterr(err, errlen, "catalog: tensor %s: offset/size missing or size not that of its shape", name);
            goto out;
        }
        if (t->offset > c->source_size || t->size > c->source_size - t->offset) {
            util_seterr(err, errlen, "catalog: tensor %s: offset %" PRIu64 " + size %" PRIu64
                        " past the source's end (%" PRIu64 ")", name, t->offset, t->size, c->source_size);
            goto out;
        }
        s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "sha256"));
        if (!is_hex64(s)) {
            util_seterr(err, errlen, "catalog: tensor %s: sha256 must be 64 lowercase hex digits", name);
            goto out;
        }
        memcpy(t->sha256, s, 65);
        i++;
    }
    rc = 0;
out:
    cJSON_Delete(root);
    if (rc) {
        gguf_catalog_free(c);
        return rc;
    }
    *out = c;
    return 0;
}

int gguf_catalog_save(const struct gguf_catalog *c, const char *path, char id_hex[65], char *err, size_t errlen)
{
    char *json;
    size_t len;
    int rc = gguf_catalog_to_json(c, &json, &len, id_hex);
    if (rc)
        return rc;
    size_t pl = strlen(path);
    char *tmp = malloc(pl + 5);
    if (!tmp) {
        free(json);
        return -ENOMEM;
    }
    memcpy(tmp, path, pl);
    memcpy(tmp + pl, ".tmp", 5);
    FILE *fp = fopen(tmp, "wb");
    if (!fp) {
        rc = -errno;
        util_seterr(err, errlen, "%s: %s", tmp, strerror(errno));
    } else {
        if (fwrite(json, 1, len, fp) != len)
            rc = -EIO;
        if (fclose(fp) != 0 && !rc)
            rc = -errno;
        if (!rc && rename(tmp, path) != 0)
            rc = -errno;
        if (rc) {
            util_seterr(err, errlen, "%s: write failed: %s", path, strerror(-rc));
            unlink(tmp);
        }
    }
    free(tmp);
    free(json);
    return rc;
}

int gguf_catalog_load(struct gguf_catalog **out, const char *path, char id_hex[65], char *err, size_t errlen)
{
    *out = NULL;
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        int e = errno;
        util_seterr(err, errlen, "%s: %s", path, strerror(e));
        return -e;
    }
    struct stat st;
    if (fstat(fileno(fp), &st) != 0 || st.st_size < 0 || (uint64_t)st.st_size > GGUF_CATALOG_MAX_JSON) {
        util_seterr(err, errlen, "%s: catalog larger than the cap %u bytes", path, GGUF_CATALOG_MAX_JSON);
        fclose(fp);
        return -EMSGSIZE;
    }
    size_t len = (size_t)st.st_size;
    char *buf = malloc(len ? len : 1);
    if (!buf) {
        fclose(fp);
        return -ENOMEM;
    }
    size_t got = fread(buf, 1, len, fp);
    fclose(fp);
    if (got != len) {
        free(buf);
        util_seterr(err, errlen, "%s: short read", path);
        return -EIO;
    }
    char e2[KV_ERR_MAX];
    int rc = gguf_catalog_from_json(out, buf, len, id_hex, e2, sizeof e2);
    free(buf);
    if (rc)
        util_seterr(err, errlen, "%s: %s", path, e2);
    return rc;
}

static uint64_t sat_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

int gguf_catalog_window_bound(const struct gguf_catalog *c, uint32_t first, uint32_t last,
                              uint64_t *min_bytes, uint64_t *max_bytes)
{
    if (first >= last || last > c->n_layers || first >= c->n_main)
        return -EINVAL;
    /* The alignment divides every tensor's absolute offset (data section and tensor offsets
     * are both multiples of it): the lowest bit they share bounds it. */
    uint64_t bits = 0, all = 0, want = 0, pad = 0;
    bool has_output = gguf_catalog_find(c, "output.weight") != NULL;
    for (uint64_t i = 0; i < c->n_tensors; i++)
        bits |= c->tensors[i].offset;
    uint64_t align = bits ? bits & -bits : GGUF_MAX_ALIGNMENT;
    if (align > GGUF_MAX_ALIGNMENT)
        align = GGUF_MAX_ALIGNMENT;
    for (uint64_t i = 0; i < c->n_tensors; i++) {
        const struct gguf_catalog_tensor *t = &c->tensors[i];
        /* a hostile catalog may overlap its tensors: the sums saturate */
        all = sat_add(all, t->size);
        if (gguf_window_wants(t->name, first, last, c->n_main, c->n_layers, has_output)) {
            want = sat_add(want, t->size);
            pad = sat_add(pad, align - 1);
        }
    }
    /* source header + padding (below 2^53), and room for the three window keys */
    uint64_t header = (c->source_size > all ? c->source_size - all : 0) + 4096;
    *min_bytes = want;
    *max_bytes = sat_add(sat_add(want, pad), header);
    return 0;
}

/* SHA-256 of a tensor's bytes, read in chunks. */
static int tensor_sha(const struct gguf_file *w, const struct gguf_tensor *t, int fd, unsigned char *buf,
                      size_t bufsz, char hex[65])
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx)
        return -ENOMEM;
    EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
    uint64_t off = gguf_file_data_offset(w) + t->offset, done = 0;
    int rc = 0;
    while (done < t->size) {
        size_t n = t->size - done < bufsz ? (size_t)(t->size - done) : bufsz;
        if ((rc = pread_full(fd, buf, n, off + done)))
            break;
        EVP_DigestUpdate(ctx, buf, n);
        done += n;
    }
    unsigned char md[32];
    unsigned int l;
    EVP_DigestFinal_ex(ctx, md, &l);
    EVP_MD_CTX_free(ctx);
    if (!rc)
        util_hex_encode(md, 32, hex);
    return rc;
}

int gguf_catalog_verify(const struct gguf_catalog *c, const struct gguf_file *w, char *err, size_t errlen)
{
    const char *path = gguf_file_path(w);
    if (!path) {
        util_seterr(err, errlen, "verify: the file was parsed from memory");
        return -EBADF;
    }
    char src[80];
    if (gguf_get_str(w, "kvasir.source.sha256", src, sizeof src) == 0 && strcmp(src, c->source_sha256)) {
        util_seterr(err, errlen, "verify: window comes from source %.64s, the catalog describes %s",
                     src, c->source_sha256);
        return -EBADMSG;
    }
    int mrc = gguf_catalog_verify_metadata(c, w, err, errlen);
    if (mrc)
        return mrc;
    for (uint64_t i = 0; i < gguf_tensor_count(w); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(w, i);
        const struct gguf_catalog_tensor *ct = gguf_catalog_find(c, t->name);
        if (!ct) {
            util_seterr(err, errlen, "tensor %s: not in the catalog", t->name);
            return -EBADMSG;
        }
        if (ct->type != t->type || ct->n_dims != t->n_dims || memcmp(ct->ne, t->ne, sizeof ct->ne) ||
            ct->size != t->size) {
            util_seterr(err, errlen, "tensor %s: type/shape differ from the catalog", t->name);
            return -EBADMSG;
        }
    }
    /* which tensors must be there */
    uint32_t first = 0, last = c->n_layers, n_main = c->n_main;
    bool is_window = gguf_window_get(w, &first, &last) == 0;
    bool has_output = gguf_catalog_find(c, "output.weight") != NULL;
    for (uint64_t i = 0; i < c->n_tensors; i++) {
        const char *name = c->tensors[i].name;
        bool need = is_window ? gguf_window_wants(name, first, last, n_main, c->n_layers, has_output) : true;
        if (need && !gguf_tensor_find(w, name)) {
            util_seterr(err, errlen, "tensor %s: missing (window [%u, %u) needs it)", name, first, last);
            return -EBADMSG;
        }
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        util_seterr(err, errlen, "verify: %s: %s", path, strerror(e));
        return -e;
    }
    size_t bufsz = 4u << 20;
    unsigned char *buf = malloc(bufsz);
    int rc = buf ? 0 : -ENOMEM;
    for (uint64_t i = 0; i < gguf_tensor_count(w) && !rc; i++) {
        const struct gguf_tensor *t = gguf_tensor_at(w, i);
        const struct gguf_catalog_tensor *ct = gguf_catalog_find(c, t->name);
        char hex[65];
        if ((rc = tensor_sha(w, t, fd, buf, bufsz, hex))) {
            util_seterr(err, errlen, "tensor %s: read failed: %s", t->name, strerror(-rc));
        } else if (strcmp(hex, ct->sha256)) {
            util_seterr(err, errlen, "tensor %s: sha256 %s differs from the catalog's %s", t->name, hex, ct->sha256);
            rc = -EBADMSG;
        }
    }
    free(buf);
    close(fd);
    return rc;
}

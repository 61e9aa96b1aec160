/* gguf.c — the GGUF reader: parse a header prefix (validating everything), typed getters,
 * and mapping of selected tensors' page ranges (tensor types are wtype/'s). The lowest file
 * of the module: it also holds the helpers the others share (gguf/internal.h). */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "gguf/internal.h"
#include "util/err.h"
#include "util/util.h"
#include "wtype/wtype.h"

static_assert(GGUF_T_COUNT == WTYPE_COUNT, "tensor type ids are wtype's");

static const char *vtype_names[GGUF_V_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};

const char *gguf_vtype_name(uint32_t type)
{
    return type < GGUF_V_COUNT ? vtype_names[type] : "?";
}

/* Size of a fixed-size value type, 0 for STRING/ARRAY/unknown. */
size_t gguf__vtype_size(uint32_t type)
{
    static const uint8_t sz[GGUF_V_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return type < GGUF_V_COUNT ? sz[type] : 0;
}

/* ------------------------------------------------------------------ the file object */

struct gguf_map {
    void *addr;
    size_t len;
};

struct gguf_file {
    uint32_t version;
    uint64_t alignment;
    uint64_t header_len;   /* bytes of the header proper (before the padding) */
    uint64_t data_offset;
    uint64_t file_size;    /* UINT64_MAX when unknown */
    uint8_t *hdr;          /* copy of the header bytes; string values point into it */
    char *path;
    int fd;

    struct gguf_kv *kv;
    uint64_t n_kv, cap_kv;
    struct gguf_tensor *t;
    uint64_t n_t, cap_t;

    uint64_t *kv_hash;     /* open addressing: index + 1, 0 empty */
    uint64_t kv_hash_cap;
    uint64_t *t_hash;
    uint64_t t_hash_cap;

    struct gguf_map *maps;
    size_t n_maps;
    uint64_t mapped;
};

/* Free the item arrays of a value tree (the data itself lives in hdr). */
static void value_free(struct gguf_value *v)
{
    if (v->type != GGUF_V_ARRAY || !v->v.arr.items)
        return;
    struct gguf_value *items = (struct gguf_value *)v->v.arr.items;
    for (uint64_t i = 0; i < v->v.arr.n; i++)
        value_free(&items[i]);
    free(items);
}

static void unmap_all(struct gguf_file *f)
{
    for (size_t i = 0; i < f->n_maps; i++)
        munmap(f->maps[i].addr, f->maps[i].len);
    free(f->maps);
    f->maps = NULL;
    f->n_maps = 0;
    f->mapped = 0;
    for (uint64_t i = 0; i < f->n_t; i++)
        f->t[i].data = NULL;
}

void gguf_file_free(struct gguf_file *f)
{
    if (!f)
        return;
    unmap_all(f);
    for (uint64_t i = 0; i < f->n_kv; i++) {
        free((char *)f->kv[i].key);
        value_free(&f->kv[i].val);
    }
    for (uint64_t i = 0; i < f->n_t; i++)
        free((char *)f->t[i].name);
    free(f->kv);
    free(f->t);
    free(f->kv_hash);
    free(f->t_hash);
    free(f->hdr);
    free(f->path);
    if (f->fd >= 0)
        close(f->fd);
    free(f);
}

/* ------------------------------------------------------------------ parser */

struct rd {
    const uint8_t *b;
    size_t len;
    uint64_t pos;
    uint64_t fsize;
    size_t *need;
    char *err;
    size_t errlen;
    uint64_t mem;          /* bytes of index the parse has allocated so far */
};

/* Account n more bytes of index memory against GGUF_MAX_MEMORY. */
static int rd_mem(struct rd *r, uint64_t n, const char *what)
{
    if (n > GGUF_MAX_MEMORY - r->mem) {
        util_seterr(r->err, r->errlen, "%s: parsing the header would take more than %llu bytes of memory (cap)",
                     what, (unsigned long long)GGUF_MAX_MEMORY);
        return -ENOMEM;
    }
    r->mem += n;
    return 0;
}

/* Make sure n bytes at the read position are present: 0, -EAGAIN (with *need) or an error. */
static int rd_have(struct rd *r, uint64_t n, const char *what)
{
    if (n <= r->len && r->pos <= r->len - n)
        return 0;
    if (n > UINT64_MAX - r->pos || r->pos + n > GGUF_MAX_HEADER) {
        util_seterr(r->err, r->errlen, "%s: header would need more than %llu bytes (cap) at offset %" PRIu64,
                     what, (unsigned long long)GGUF_MAX_HEADER, r->pos);
        return -EFBIG;
    }
    uint64_t want = r->pos + n;
    if (r->fsize != UINT64_MAX && want > r->fsize) {
        util_seterr(r->err, r->errlen, "%s: needs %" PRIu64 " bytes at offset %" PRIu64
                     " but the file has %" PRIu64 " (truncated)", what, n, r->pos, r->fsize);
        return -EPROTO;
    }
    if (r->need)
        *r->need = (size_t)want;
    util_seterr(r->err, r->errlen, "header incomplete: need %" PRIu64 " bytes, have %zu", want, r->len);
    return -EAGAIN;
}

static uint32_t ld32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t ld64(const uint8_t *p)
{
    return (uint64_t)ld32(p) | (uint64_t)ld32(p + 4) << 32;
}

static int rd_u32(struct rd *r, uint32_t *out, const char *what)
{
    int rc = rd_have(r, 4, what);
    if (rc)
        return rc;
    *out = ld32(r->b + r->pos);
    r->pos += 4;
    return 0;
}

static int rd_u64(struct rd *r, uint64_t *out, const char *what)
{
    int rc = rd_have(r, 8, what);
    if (rc)
        return rc;
    *out = ld64(r->b + r->pos);
    r->pos += 8;
    return 0;
}

/* A string: pointer into the buffer and its length (capped at cap). */
static int rd_str(struct rd *r, const char **p, uint64_t *len, uint64_t cap, const char *what)
{
    uint64_t n;
    int rc = rd_u64(r, &n, what);
    if (rc)
        return rc;
    if (n > cap) {
        util_seterr(r->err, r->errlen, "%s: string length %" PRIu64 " exceeds cap %" PRIu64, what, n, cap);
        return -EMSGSIZE;
    }
    rc = rd_have(r, n, what);
    if (rc)
        return rc;
    *p = (const char *)r->b + r->pos;
    *len = n;
    r->pos += n;
    return 0;
}

/* NUL-terminated copy of a key / name; refuses empty names and embedded NULs. */
static int dup_name(struct rd *r, const char *p, uint64_t len, char **out, const char *what)
{
    if (len == 0) {
        util_seterr(r->err, r->errlen, "%s: empty name", what);
        return -EPROTO;
    }
    if (memchr(p, 0, len)) {
        util_seterr(r->err, r->errlen, "%s: name contains a NUL byte", what);
        return -EPROTO;
    }
    int rc = rd_mem(r, len + 1 + 16, what);
    if (rc)
        return rc;
    char *s = malloc(len + 1);
    if (!s)
        return -ENOMEM;
    memcpy(s, p, len);
    s[len] = 0;
    *out = s;
    return 0;
}

static int rd_value(struct rd *r, uint32_t type, struct gguf_value *v, int depth, const char *what);

static int rd_array(struct rd *r, struct gguf_value *v, int depth, const char *what)
{
    uint32_t et;
    uint64_t n;
    int rc;
    if (depth >= GGUF_MAX_NEST) {
        util_seterr(r->err, r->errlen, "%s: arrays nested deeper than %d", what, GGUF_MAX_NEST);
        return -EPROTO;
    }
    if ((rc = rd_u32(r, &et, what)) || (rc = rd_u64(r, &n, what)))
        return rc;
    if (et >= GGUF_V_COUNT) {
        util_seterr(r->err, r->errlen, "%s: array element type %u unknown (max %u)", what, et, GGUF_V_COUNT - 1);
        return -EPROTO;
    }
    if (n > GGUF_MAX_ARRAY) {
        util_seterr(r->err, r->errlen, "%s: array of %" PRIu64 " elements exceeds cap %u", what, n, GGUF_MAX_ARRAY);
        return -EMSGSIZE;
    }
    v->type = GGUF_V_ARRAY;
    v->v.arr.type = et;
    v->v.arr.n = n;
    v->v.arr.data = NULL;
    v->v.arr.items = NULL;
    size_t es = gguf__vtype_size(et);
    if (es) {
        if ((rc = rd_have(r, n * es, what)))
            return rc;
        v->v.arr.data = r->b + r->pos;
        if (et == GGUF_V_BOOL)
            for (uint64_t i = 0; i < n; i++)
                if (r->b[r->pos + i] > 1) {
                    util_seterr(r->err, r->errlen, "%s: bool element %" PRIu64 " has value %u (not 0 or 1)",
                                 what, i, r->b[r->pos + i]);
                    return -EPROTO;
                }
        r->pos += n * es;
        return 0;
    }
    if (n == 0)
        return 0;
    /* Every element takes at least 8 (string) or 12 (array) bytes: make sure they are here
     * before sizing the item index, so allocation stays proportional to the input. */
    if ((rc = rd_have(r, n * (et == GGUF_V_STRING ? 8 : 12), what)))
        return rc;
    if ((rc = rd_mem(r, n * sizeof(struct gguf_value), what)))
        return rc;
    struct gguf_value *items = calloc(n, sizeof *items);
    if (!items)
        return -ENOMEM;
    v->v.arr.items = items;
    for (uint64_t i = 0; i < n; i++) {
        items[i].type = et;
        if ((rc = rd_value(r, et, &items[i], depth + 1, what))) {
            v->v.arr.n = i + 1; /* free what was built */
            return rc;
        }
    }
    return 0;
}

static int rd_value(struct rd *r, uint32_t type, struct gguf_value *v, int depth, const char *what)
{
    int rc;
    v->type = type;
    if (type == GGUF_V_STRING)
        return rd_str(r, &v->v.str.p, &v->v.str.len, GGUF_MAX_STRING, what);
    if (type == GGUF_V_ARRAY)
        return rd_array(r, v, depth, what);
    size_t es = gguf__vtype_size(type);
    if (!es) {
        util_seterr(r->err, r->errlen, "%s: value type %u unknown (max %u)", what, type, GGUF_V_COUNT - 1);
        return -EPROTO;
    }
    if ((rc = rd_have(r, es, what)))
        return rc;
    const uint8_t *p = r->b + r->pos;
    r->pos += es;
    switch (type) {
    case GGUF_V_U8: v->v.u = p[0]; break;
    case GGUF_V_I8: v->v.i = (int8_t)p[0]; break;
    case GGUF_V_U16: v->v.u = (uint16_t)(p[0] | p[1] << 8); break;
    case GGUF_V_I16: v->v.i = (int16_t)(uint16_t)(p[0] | p[1] << 8); break;
    case GGUF_V_U32: v->v.u = ld32(p); break;
    case GGUF_V_I32: v->v.i = (int32_t)ld32(p); break;
    case GGUF_V_U64: v->v.u = ld64(p); break;
    case GGUF_V_I64: v->v.i = (int64_t)ld64(p); break;
    case GGUF_V_BOOL:
        if (p[0] > 1) {
            util_seterr(r->err, r->errlen, "%s: bool value %u (not 0 or 1)", what, p[0]);
            return -EPROTO;
        }
        v->v.u = p[0];
        break;
    case GGUF_V_F32: { uint32_t u = ld32(p); float x; memcpy(&x, &u, 4); v->v.f = x; break; }
    case GGUF_V_F64: { uint64_t u = ld64(p); double x; memcpy(&x, &u, 8); v->v.f = x; break; }
    }
    return 0;
}

/* Insert name (index idx) into a hash set; -EEXIST when already there. */
static int hash_insert(uint64_t **tab, uint64_t *cap, uint64_t count, const char *name, uint64_t idx,
                       const char *(*name_of)(const struct gguf_file *, uint64_t), const struct gguf_file *f)
{
    if ((count + 1) * 2 > *cap) {
        uint64_t ncap = *cap ? *cap * 2 : 64;
        uint64_t *nt = calloc(ncap, sizeof *nt);
        if (!nt)
            return -ENOMEM;
        for (uint64_t i = 0; i < *cap; i++) {
            uint64_t e = (*tab)[i];
            if (!e)
                continue;
            uint64_t h = util_hash_str(name_of(f, e - 1)) & (ncap - 1);
            while (nt[h])
                h = (h + 1) & (ncap - 1);
            nt[h] = e;
        }
        free(*tab);
        *tab = nt;
        *cap = ncap;
    }
    uint64_t h = util_hash_str(name) & (*cap - 1);
    while ((*tab)[h]) {
        if (!strcmp(name_of(f, (*tab)[h] - 1), name))
            return -EEXIST;
        h = (h + 1) & (*cap - 1);
    }
    (*tab)[h] = idx + 1;
    return 0;
}

static int64_t hash_find(const uint64_t *tab, uint64_t cap, const char *name,
                         const char *(*name_of)(const struct gguf_file *, uint64_t), const struct gguf_file *f)
{
    if (!cap)
        return -1;
    uint64_t h = util_hash_str(name) & (cap - 1);
    while (tab[h]) {
        if (!strcmp(name_of(f, tab[h] - 1), name))
            return (int64_t)tab[h] - 1;
        h = (h + 1) & (cap - 1);
    }
    return -1;
}

static const char *kv_name(const struct gguf_file *f, uint64_t i) { return f->kv[i].key; }
static const char *t_name(const struct gguf_file *f, uint64_t i) { return f->t[i].name; }

/* Grow an array of elements by one slot (doubling); capacity never exceeds what the input
 * has shown so far, so a lying count cannot force a large allocation. */
static int grow(void **arr, uint64_t *cap, uint64_t n, size_t es)
{
    if (n < *cap)
        return 0;
    uint64_t ncap = *cap ? *cap * 2 : 16;
    void *p = realloc(*arr, ncap * es);
    if (!p)
        return -ENOMEM;
    memset((char *)p + *cap * es, 0, (ncap - *cap) * es);
    *arr = p;
    *cap = ncap;
    return 0;
}

/* Rebase string / data pointers of a value tree from the caller's buffer into our copy. */
static void value_rebase(struct gguf_value *v, const uint8_t *from, uint8_t *to)
{
    if (v->type == GGUF_V_STRING) {
        if (v->v.str.p)
            v->v.str.p = (const char *)to + ((const uint8_t *)v->v.str.p - from);
    } else if (v->type == GGUF_V_ARRAY) {
        if (v->v.arr.data)
            v->v.arr.data = to + ((const uint8_t *)v->v.arr.data - from);
        struct gguf_value *items = (struct gguf_value *)v->v.arr.items;
        if (items)
            for (uint64_t i = 0; i < v->v.arr.n; i++)
                value_rebase(&items[i], from, to);
    }
}

static int cmp_by_offset(const void *a, const void *b)
{
    const struct gguf_tensor *x = *(const struct gguf_tensor *const *)a;
    const struct gguf_tensor *y = *(const struct gguf_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static int parse(struct gguf_file *f, struct rd *r)
{
    uint32_t magic, version;
    uint64_t n_t, n_kv;
    int rc;
    char what[160];

    if ((rc = rd_u32(r, &magic, "magic")))
        return rc;
    if (magic != GGUF_MAGIC) {
        util_seterr(r->err, r->errlen, "magic: 0x%08x is not \"GGUF\" (0x%08x)", magic, GGUF_MAGIC);
        return -EPROTO;
    }
    if ((rc = rd_u32(r, &version, "version")))
        return rc;
    if (version == 1) {
        util_seterr(r->err, r->errlen, "version: GGUF version 1 is not supported (only versions 2 and 3); "
                     "convert the file with a current llama.cpp");
        return -EPROTONOSUPPORT;
    }
    if ((version & 0xffff) == 0 && version != 0) {
        util_seterr(r->err, r->errlen,
                     "version: 0x%08x looks byte-swapped (big-endian GGUF is not supported)", version);
        return -EPROTONOSUPPORT;
    }
    if (version < 2 || version > 3) {
        util_seterr(r->err, r->errlen, "version: %u is not supported (only versions 2 and 3)", version);
        return -EPROTONOSUPPORT;
    }
    f->version = version;
    if ((rc = rd_u64(r, &n_t, "tensor count")) || (rc = rd_u64(r, &n_kv, "metadata key count")))
        return rc;
    if (n_t > GGUF_MAX_TENSORS) {
        util_seterr(r->err, r->errlen, "tensor count: %" PRIu64 " exceeds cap %u", n_t, GGUF_MAX_TENSORS);
        return -EMSGSIZE;
    }
    if (n_kv > GGUF_MAX_KV) {
        util_seterr(r->err, r->errlen, "metadata key count: %" PRIu64 " exceeds cap %u", n_kv, GGUF_MAX_KV);
        return -EMSGSIZE;
    }

    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    for (uint64_t i = 0; i < n_kv; i++) {
        const char *kp;
        uint64_t kl;
        uint32_t vt;
        snprintf(what, sizeof what, "key %" PRIu64, i);
        if ((rc = rd_str(r, &kp, &kl, GGUF_MAX_KEY, what)))
            return rc;
        if ((rc = grow((void **)&f->kv, &f->cap_kv, f->n_kv, sizeof *f->kv)))
            return rc;
        struct gguf_kv *kv = &f->kv[f->n_kv];
        if ((rc = dup_name(r, kp, kl, (char **)&kv->key, what)))
            return rc;
        f->n_kv++;
        snprintf(what, sizeof what, "key '%.100s'", kv->key);
        if ((rc = hash_insert(&f->kv_hash, &f->kv_hash_cap, f->n_kv - 1, kv->key, f->n_kv - 1, kv_name, f))) {
            if (rc == -EEXIST) {
                util_seterr(r->err, r->errlen, "%s: duplicate key (entry %" PRIu64 ")", what, i);
                return -EPROTO;
            }
            return rc;
        }
        if ((rc = rd_u32(r, &vt, what)))
            return rc;
        if (vt >= GGUF_V_COUNT) {
            kv->val.type = GGUF_V_U8;
            util_seterr(r->err, r->errlen, "%s: value type %u unknown (max %u)", what, vt, GGUF_V_COUNT - 1);
            return -EPROTO;
        }
        if ((rc = rd_value(r, vt, &kv->val, 0, what)))
            return rc;
        if (!strcmp(kv->key, "general.alignment")) {
            if (vt != GGUF_V_U32) {
                util_seterr(r->err, r->errlen, "general.alignment: type %s, must be u32", gguf_vtype_name(vt));
                return -EPROTO;
            }
            uint64_t a = kv->val.v.u;
            if (a == 0 || (a & (a - 1)) || a > GGUF_MAX_ALIGNMENT) {
                util_seterr(r->err, r->errlen, "general.alignment: %" PRIu64 " is not a power of two in [1, %u]",
                             a, GGUF_MAX_ALIGNMENT);
                return -EPROTO;
            }
            f->alignment = a;
        }
    }

    for (uint64_t i = 0; i < n_t; i++) {
        const char *np;
        uint64_t nl;
        uint32_t nd, type;
        snprintf(what, sizeof what, "tensor %" PRIu64 " name", i);
        if ((rc = rd_str(r, &np, &nl, GGUF_MAX_NAME, what)))
            return rc;
        if ((rc = grow((void **)&f->t, &f->cap_t, f->n_t, sizeof *f->t)))
            return rc;
        struct gguf_tensor *t = &f->t[f->n_t];
        if ((rc = dup_name(r, np, nl, (char **)&t->name, what)))
            return rc;
        f->n_t++;
        snprintf(what, sizeof what, "tensor '%.100s'", t->name);
        if ((rc = hash_insert(&f->t_hash, &f->t_hash_cap, f->n_t - 1, t->name, f->n_t - 1, t_name, f))) {
            if (rc == -EEXIST) {
                util_seterr(r->err, r->errlen, "%s: duplicate tensor name (entry %" PRIu64 ")", what, i);
                return -EPROTO;
            }
            return rc;
        }
        if ((rc = rd_u32(r, &nd, what)))
            return rc;
        if (nd == 0 || nd > GGUF_MAX_DIMS) {
            util_seterr(r->err, r->errlen, "%s: n_dims %u not in [1, %d]", what, nd, GGUF_MAX_DIMS);
            return -EPROTO;
        }
        t->n_dims = nd;
        uint64_t nel = 1;
        for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
            uint64_t ne = 1;
            if (d < nd) {
                if ((rc = rd_u64(r, &ne, what)))
                    return rc;
                if (ne == 0 || ne > (uint64_t)INT64_MAX) {
                    util_seterr(r->err, r->errlen, "%s: dim %u is %" PRIu64 " (must be in [1, %" PRId64 "])",
                                 what, d, ne, INT64_MAX);
                    return -EPROTO;
                }
                if (nel > (uint64_t)INT64_MAX / ne) {
                    util_seterr(r->err, r->errlen, "%s: element count overflows at dim %u (%" PRIu64 ")",
                                 what, d, ne);
                    return -EOVERFLOW;
                }
                nel *= ne;
            }
            t->ne[d] = ne;
        }
        if ((rc = rd_u32(r, &type, what)))
            return rc;
        const struct wtype_info *ti = wtype_info(type);
        if (!ti) {
            util_seterr(r->err, r->errlen, "%s: type id %u unknown", what, type);
            return -EPROTO;
        }
        t->type = type;
        if (t->ne[0] % ti->block_elems) {
            util_seterr(r->err, r->errlen, "%s: row length %" PRIu64 " is not a multiple of the %s block size %u",
                         what, t->ne[0], ti->name, ti->block_elems);
            return -EPROTO;
        }
        if (wtype_bytes(type, nel, &t->size)) {
            util_seterr(r->err, r->errlen, "%s: byte size of %" PRIu64 " %s elements overflows", what, nel, ti->name);
            return -EOVERFLOW;
        }
        if ((rc = rd_u64(r, &t->offset, what)))
            return rc;
        if (t->offset % f->alignment) {
            util_seterr(r->err, r->errlen, "%s: offset %" PRIu64 " is not a multiple of the alignment %" PRIu64,
                         what, t->offset, f->alignment);
            return -EPROTO;
        }
        if (t->size > UINT64_MAX - t->offset) {
            util_seterr(r->err, r->errlen, "%s: offset %" PRIu64 " + size %" PRIu64 " overflows", what,
                         t->offset, t->size);
            return -EOVERFLOW;
        }
    }

    f->header_len = r->pos;
    uint64_t pad = (f->alignment - f->header_len % f->alignment) % f->alignment;
    f->data_offset = f->header_len + pad;

    /* Tensor ranges: in bounds, not overlapping. */
    uint64_t data_size = UINT64_MAX;
    if (r->fsize != UINT64_MAX) {
        if (f->data_offset > r->fsize && f->n_t) {
            util_seterr(r->err, r->errlen, "data section: starts at %" PRIu64 " past the end of the file (%" PRIu64 ")",
                         f->data_offset, r->fsize);
            return -EPROTO;
        }
        data_size = f->data_offset <= r->fsize ? r->fsize - f->data_offset : 0;
    }
    if (f->n_t) {
        struct gguf_tensor **order = malloc(f->n_t * sizeof *order);
        if (!order)
            return -ENOMEM;
        for (uint64_t i = 0; i < f->n_t; i++)
            order[i] = &f->t[i];
        qsort(order, f->n_t, sizeof *order, cmp_by_offset);
        rc = 0;
        for (uint64_t i = 0; i < f->n_t && !rc; i++) {
            const struct gguf_tensor *t = order[i];
            uint64_t end = t->offset + t->size;
            if (end > data_size) {
                util_seterr(r->err, r->errlen, "tensor '%.100s': offset %" PRIu64 " + size %" PRIu64
                             " past the end of the data section (%" PRIu64 " bytes; data section shorter than the tensors)",
                             t->name, t->offset, t->size, data_size);
                rc = -EPROTO;
            } else if (i + 1 < f->n_t && end > order[i + 1]->offset) {
                util_seterr(r->err, r->errlen, "tensor '%.100s': bytes [%" PRIu64 ", %" PRIu64
                             ") overlap tensor '%.100s' at offset %" PRIu64,
                             t->name, t->offset, end, order[i + 1]->name, order[i + 1]->offset);
                rc = -EPROTO;
            }
        }
        free(order);
        if (rc)
            return rc;
    }
    return 0;
}

int gguf_file_parse(struct gguf_file **out, const void *buf, size_t len, uint64_t file_size,
                    size_t *need, char *err, size_t errlen)
{
    *out = NULL;
    if (need)
        *need = 0;
    if (err && errlen)
        err[0] = 0;
    if (file_size != UINT64_MAX && len > file_size)
        len = (size_t)file_size;
    struct gguf_file *f = calloc(1, sizeof *f);
    if (!f)
        return -ENOMEM;
    f->fd = -1;
    f->file_size = file_size;
    struct rd r = {.b = buf, .len = len, .pos = 0, .fsize = file_size, .need = need, .err = err, .errlen = errlen};
    int rc = parse(f, &r);
    if (rc == 0) {
        f->hdr = malloc(f->header_len ? f->header_len : 1);
        if (!f->hdr) {
            rc = -ENOMEM;
        } else {
            memcpy(f->hdr, buf, f->header_len);
            for (uint64_t i = 0; i < f->n_kv; i++)
                value_rebase(&f->kv[i].val, buf, f->hdr);
        }
    }
    if (rc) {
        if (rc == -ENOMEM && err && errlen && !err[0])
            util_seterr(err, errlen, "out of memory while parsing the header");
        gguf_file_free(f);
        return rc;
    }
    *out = f;
    return 0;
}

int gguf_file_open(struct gguf_file **out, const char *path, char *err, size_t errlen)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        util_seterr(err, errlen, "%s: %s", path, strerror(e));
        return -e;
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        int e = errno ? errno : EINVAL;
        util_seterr(err, errlen, "%s: not a regular file", path);
        close(fd);
        return -e;
    }
    uint64_t fsize = (uint64_t)st.st_size;
    size_t len = fsize < (1u << 20) ? (size_t)fsize : (1u << 20);
    uint8_t *buf = NULL;
    int rc;
    for (;;) {
        uint8_t *nb = realloc(buf, len ? len : 1);
        if (!nb) {
            rc = -ENOMEM;
            util_seterr(err, errlen, "%s: out of memory reading %zu header bytes", path, len);
            break;
        }
        buf = nb;
        size_t got = 0;
        while (got < len) {
            ssize_t n = pread(fd, buf + got, len - got, (off_t)got);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                break;
            got += (size_t)n;
        }
        if (got < len) {
            rc = -EIO;
            util_seterr(err, errlen, "%s: short read (%zu of %zu bytes)", path, got, len);
            break;
        }
        size_t need = 0;
        char e2[KV_ERR_MAX];
        rc = gguf_file_parse(out, buf, len, fsize, &need, e2, sizeof e2);
        if (rc == -EAGAIN) {
            /* grow geometrically so a huge vocabulary costs a few reads, not many */
            size_t nl = need > len * 2 ? need : len * 2;
            len = nl > fsize ? (size_t)fsize : nl;
            continue;
        }
        if (rc)
            util_seterr(err, errlen, "%s: %s", path, e2);
        break;
    }
    free(buf);
    if (rc) {
        close(fd);
        return rc;
    }
    (*out)->fd = fd;
    (*out)->path = strdup(path);
    if (!(*out)->path) {
        gguf_file_free(*out);
        *out = NULL;
        return -ENOMEM;
    }
    return 0;
}

uint32_t gguf_file_version(const struct gguf_file *f) { return f->version; }
uint64_t gguf_file_alignment(const struct gguf_file *f) { return f->alignment; }
uint64_t gguf_file_data_offset(const struct gguf_file *f) { return f->data_offset; }
uint64_t gguf_file_size(const struct gguf_file *f) { return f->file_size; }
uint64_t gguf_file_header_len(const struct gguf_file *f) { return f->header_len; }
const char *gguf_file_path(const struct gguf_file *f) { return f->path; }
int gguf_file_fd(const struct gguf_file *f) { return f->fd; }

/* ------------------------------------------------------------------ metadata */

uint64_t gguf_kv_count(const struct gguf_file *f) { return f->n_kv; }

const struct gguf_kv *gguf_kv_at(const struct gguf_file *f, uint64_t i)
{
    return i < f->n_kv ? &f->kv[i] : NULL;
}

const struct gguf_kv *gguf_kv_find(const struct gguf_file *f, const char *key)
{
    int64_t i = hash_find(f->kv_hash, f->kv_hash_cap, key, kv_name, f);
    return i < 0 ? NULL : &f->kv[i];
}

static bool is_signed(uint32_t t) { return t == GGUF_V_I8 || t == GGUF_V_I16 || t == GGUF_V_I32 || t == GGUF_V_I64; }
static bool is_unsigned(uint32_t t) { return t == GGUF_V_U8 || t == GGUF_V_U16 || t == GGUF_V_U32 || t == GGUF_V_U64; }

int gguf_value_u64(const struct gguf_value *v, uint64_t *out)
{
    if (is_unsigned(v->type)) {
        *out = v->v.u;
        return 0;
    }
    if (is_signed(v->type) && v->v.i >= 0) {
        *out = (uint64_t)v->v.i;
        return 0;
    }
    return -EINVAL;
}

int gguf_value_i64(const struct gguf_value *v, int64_t *out)
{
    if (is_signed(v->type)) {
        *out = v->v.i;
        return 0;
    }
    if (is_unsigned(v->type) && v->v.u <= (uint64_t)INT64_MAX) {
        *out = (int64_t)v->v.u;
        return 0;
    }
    return -EINVAL;
}

int gguf_get_u64(const struct gguf_file *f, const char *key, uint64_t *out)
{
    const struct gguf_kv *kv = gguf_kv_find(f, key);
    if (!kv)
        return -ENOENT;
    return gguf_value_u64(&kv->val, out);
}

int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out)
{
    uint64_t v;
    int rc = gguf_get_u64(f, key, &v);
    if (rc)
        return rc;
    if (v > UINT32_MAX)
        return -EINVAL;
    *out = (uint32_t)v;
    return 0;
}

int gguf_get_i64(const struct gguf_file *f, const char *key, int64_t *out)
{
    const struct gguf_kv *kv = gguf_kv_find(f, key);
    if (!kv)
        return -ENOENT;
    return gguf_value_i64(&kv->val, out);
}

int gguf_get_f32(const struct gguf_file *f, const char *key, float *out)
{
    const struct gguf_kv *kv = gguf_kv_find(f, key);
    if (!kv)
        return -ENOENT;
    if (kv->val.type != GGUF_V_F32 && kv->val.type != GGUF_V_F64)
        return -EINVAL;
    *out = (float)kv->val.v.f;
    return 0;
}

int gguf_get_bool(const struct gguf_file *f, const char *key, bool *out)
{
    const struct gguf_kv *kv = gguf_kv_find(f, key);
    if (!kv)
        return -ENOENT;
    if (kv->val.type != GGUF_V_BOOL)
        return -EINVAL;
    *out = kv->val.v.u != 0;
    return 0;
}

int gguf_get_str(const struct gguf_file *f, const char *key, char *buf, size_t n)
{
    const struct gguf_kv *kv = gguf_kv_find(f, key);
    if (!kv)
        return -ENOENT;
    if (kv->val.type != GGUF_V_STRING)
        return -EINVAL;
    if (kv->val.v.str.len >= n)
        return -ENAMETOOLONG;
    memcpy(buf, kv->val.v.str.p, kv->val.v.str.len);
    buf[kv->val.v.str.len] = 0;
    return 0;
}

int gguf_get_arr(const struct gguf_file *f, const char *key, const struct gguf_value **out)
{
    const struct gguf_kv *kv = gguf_kv_find(f, key);
    if (!kv)
        return -ENOENT;
    if (kv->val.type != GGUF_V_ARRAY)
        return -EINVAL;
    *out = &kv->val;
    return 0;
}

/* ------------------------------------------------------------------ tensors */

uint64_t gguf_tensor_count(const struct gguf_file *f) { return f->n_t; }

const struct gguf_tensor *gguf_tensor_at(const struct gguf_file *f, uint64_t i)
{
    return i < f->n_t ? &f->t[i] : NULL;
}

const struct gguf_tensor *gguf_tensor_find(const struct gguf_file *f, const char *name)
{
    int64_t i = hash_find(f->t_hash, f->t_hash_cap, name, t_name, f);
    return i < 0 ? NULL : &f->t[i];
}

int gguf_tensor_layer(const char *name)
{
    if (strncmp(name, "blk.", 4))
        return -1;
    const char *p = name + 4;
    long v = 0;
    if (*p < '0' || *p > '9')
        return -1;
    for (; *p >= '0' && *p <= '9'; p++) {
        v = v * 10 + (*p - '0');
        if (v > 1000000)
            return -1;
    }
    return *p == '.' ? (int)v : -1;
}

/* ------------------------------------------------------------------ mapping */

struct range {
    uint64_t start, end;
};

static int cmp_range(const void *a, const void *b)
{
    const struct range *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

int gguf_file_map_tensors(struct gguf_file *f, gguf_want_cb want, void *ud, char *err, size_t errlen)
{
    if (f->fd < 0) {
        util_seterr(err, errlen, "map: the file was parsed from memory (no file to map)");
        return -EBADF;
    }
    unmap_all(f);
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    struct range *rg = malloc((f->n_t ? f->n_t : 1) * sizeof *rg);
    if (!rg)
        return -ENOMEM;
    size_t n = 0;
    for (uint64_t i = 0; i < f->n_t; i++) {
        if (want && !want(&f->t[i], ud))
            continue;
        uint64_t s = f->data_offset + f->t[i].offset, e = s + f->t[i].size;
        rg[n].start = s / page * page;
        rg[n].end = (e + page - 1) / page * page;
        n++;
    }
    qsort(rg, n, sizeof *rg, cmp_range);
    size_t m = 0; /* merge overlapping and adjacent ranges */
    for (size_t i = 0; i < n; i++) {
        if (m && rg[i].start <= rg[m - 1].end) {
            if (rg[i].end > rg[m - 1].end)
                rg[m - 1].end = rg[i].end;
        } else {
            rg[m++] = rg[i];
        }
    }
    int rc = 0;
    f->maps = calloc(m ? m : 1, sizeof *f->maps);
    if (!f->maps) {
        free(rg);
        return -ENOMEM;
    }
    for (size_t i = 0; i < m; i++) {
        size_t len = (size_t)(rg[i].end - rg[i].start);
        void *p = mmap(NULL, len, PROT_READ, MAP_PRIVATE, f->fd, (off_t)rg[i].start);
        if (p == MAP_FAILED) {
            rc = -errno;
            util_seterr(err, errlen, "map: mmap of bytes [%" PRIu64 ", %" PRIu64 ") of %s failed: %s",
                         rg[i].start, rg[i].end, f->path, strerror(errno));
            break;
        }
        f->maps[f->n_maps].addr = p;
        f->maps[f->n_maps].len = len;
        f->n_maps++;
        f->mapped += len;
    }
    if (rc) {
        free(rg);
        unmap_all(f);
        return rc;
    }
    for (uint64_t i = 0; i < f->n_t; i++) {
        if (want && !want(&f->t[i], ud))
            continue;
        uint64_t s = f->data_offset + f->t[i].offset;
        for (size_t j = 0; j < m; j++)
            if (s >= rg[j].start && s < rg[j].end) {
                f->t[i].data = (const uint8_t *)f->maps[j].addr + (s - rg[j].start);
                break;
            }
    }
    free(rg);
    return 0;
}

uint64_t gguf_file_mapped_bytes(const struct gguf_file *f) { return f->mapped; }

int gguf_tensor_read(const struct gguf_file *f, const struct gguf_tensor *t, void *buf,
                     char *err, size_t errlen)
{
    if (f->fd < 0) {
        util_seterr(err, errlen, "read: the file was parsed from memory");
        return -EBADF;
    }
    uint64_t off = f->data_offset + t->offset, got = 0;
    while (got < t->size) {
        size_t chunk = t->size - got > (1u << 30) ? (1u << 30) : (size_t)(t->size - got);
        ssize_t n = pread(f->fd, (uint8_t *)buf + got, chunk, (off_t)(off + got));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            util_seterr(err, errlen, "tensor '%s': short read at offset %" PRIu64 " of %s",
                         t->name, off + got, f->path);
            return n < 0 ? -errno : -EIO;
        }
        got += (uint64_t)n;
    }
    return 0;
}

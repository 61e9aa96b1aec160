/* write.c — the GGUF writer: metadata (deep copies) and tensors (borrowed or filled at write
 * time), written as version 3 with the chosen alignment to path.tmp, synced, renamed. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "gguf/internal.h"
#include "util/util.h"
#include "wtype/wtype.h"

struct wkv {
    char *key;
    struct gguf_value val; /* owned deep copy */
};

struct wtensor {
    char *name;
    uint32_t type, n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    uint64_t size, offset;
    const void *data;
    gguf_fill_cb fill;
    void *ud;
};

struct gguf_writer {
    uint32_t alignment;
    struct wkv *kv;
    size_t n_kv, cap_kv;
    struct wtensor *t;
    size_t n_t, cap_t;
};

static void wvalue_free(struct gguf_value *v)
{
    if (v->type == GGUF_V_STRING) {
        free((char *)v->v.str.p);
    } else if (v->type == GGUF_V_ARRAY) {
        free((void *)v->v.arr.data);
        struct gguf_value *items = (struct gguf_value *)v->v.arr.items;
        if (items) {
            for (uint64_t i = 0; i < v->v.arr.n; i++)
                wvalue_free(&items[i]);
            free(items);
        }
    }
}

/* Deep copy of v into d (d zeroed on failure). */
static int wvalue_copy(struct gguf_value *d, const struct gguf_value *v, int depth)
{
    memset(d, 0, sizeof *d);
    if (v->type >= GGUF_V_COUNT || depth > GGUF_MAX_NEST)
        return -EINVAL;
    d->type = v->type;
    if (v->type == GGUF_V_STRING) {
        if (v->v.str.len > GGUF_MAX_STRING)
            return -EMSGSIZE;
        char *s = malloc(v->v.str.len + 1);
        if (!s)
            return -ENOMEM;
        if (v->v.str.len)
            memcpy(s, v->v.str.p, v->v.str.len);
        s[v->v.str.len] = 0;
        d->v.str.p = s;
        d->v.str.len = v->v.str.len;
        return 0;
    }
    if (v->type != GGUF_V_ARRAY) {
        d->v = v->v;
        return 0;
    }
    uint32_t et = v->v.arr.type;
    uint64_t n = v->v.arr.n;
    if (et >= GGUF_V_COUNT || n > GGUF_MAX_ARRAY)
        return -EINVAL;
    d->v.arr.type = et;
    size_t es = gguf__vtype_size(et);
    if (es) {
        void *p = malloc(n ? n * es : 1);
        if (!p)
            return -ENOMEM;
        if (n)
            memcpy(p, v->v.arr.data, n * es);
        d->v.arr.data = p;
        d->v.arr.n = n;
        return 0;
    }
    if (!n)
        return 0;
    struct gguf_value *items = calloc(n, sizeof *items);
    if (!items)
        return -ENOMEM;
    d->v.arr.items = items;
    for (uint64_t i = 0; i < n; i++) {
        if (v->v.arr.items[i].type != et) {
            d->v.arr.n = i;
            wvalue_free(d);
            return -EINVAL;
        }
        int rc = wvalue_copy(&items[i], &v->v.arr.items[i], depth + 1);
        if (rc) {
            d->v.arr.n = i;
            wvalue_free(d);
            return rc;
        }
    }
    d->v.arr.n = n;
    return 0;
}

int gguf_writer_new(struct gguf_writer **out)
{
    *out = calloc(1, sizeof **out);
    if (!*out)
        return -ENOMEM;
    (*out)->alignment = GGUF_DEFAULT_ALIGNMENT;
    return 0;
}

void gguf_writer_free(struct gguf_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        wvalue_free(&w->kv[i].val);
    }
    for (size_t i = 0; i < w->n_t; i++)
        free(w->t[i].name);
    free(w->kv);
    free(w->t);
    free(w);
}

int gguf_writer_set(struct gguf_writer *w, const char *key, const struct gguf_value *v)
{
    size_t kl = strlen(key);
    if (!kl || kl > GGUF_MAX_KEY)
        return -EINVAL;
    if (!strcmp(key, "general.alignment")) {
        uint64_t a;
        if (v->type != GGUF_V_U32 || gguf_value_u64(v, &a) || !a || (a & (a - 1)) || a > GGUF_MAX_ALIGNMENT)
            return -EINVAL;
        w->alignment = (uint32_t)a;
    }
    struct gguf_value copy;
    int rc = wvalue_copy(&copy, v, 0);
    if (rc)
        return rc;
    for (size_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->kv[i].key, key)) {
            wvalue_free(&w->kv[i].val);
            w->kv[i].val = copy;
            return 0;
        }
    if (w->n_kv == w->cap_kv && util_grow((void **)&w->kv, &w->cap_kv, sizeof *w->kv, 32)) {
        wvalue_free(&copy);
        return -ENOMEM;
    }
    char *k = strdup(key);
    if (!k) {
        wvalue_free(&copy);
        return -ENOMEM;
    }
    w->kv[w->n_kv].key = k;
    w->kv[w->n_kv].val = copy;
    w->n_kv++;
    return 0;
}

int gguf_writer_set_alignment(struct gguf_writer *w, uint32_t alignment)
{
    return gguf_writer_set_u32(w, "general.alignment", alignment);
}

int gguf_writer_set_u32(struct gguf_writer *w, const char *key, uint32_t v)
{
    struct gguf_value x = {.type = GGUF_V_U32, .v.u = v};
    return gguf_writer_set(w, key, &x);
}

int gguf_writer_set_f32(struct gguf_writer *w, const char *key, float v)
{
    struct gguf_value x = {.type = GGUF_V_F32, .v.f = v};
    return gguf_writer_set(w, key, &x);
}

int gguf_writer_set_bool(struct gguf_writer *w, const char *key, bool v)
{
    struct gguf_value x = {.type = GGUF_V_BOOL, .v.u = v ? 1 : 0};
    return gguf_writer_set(w, key, &x);
}

int gguf_writer_set_str(struct gguf_writer *w, const char *key, const char *s)
{
    struct gguf_value x = {.type = GGUF_V_STRING};
    x.v.str.p = s;
    x.v.str.len = strlen(s);
    return gguf_writer_set(w, key, &x);
}

int gguf_writer_set_arr(struct gguf_writer *w, const char *key, uint32_t elem_type, uint64_t n,
                        const void *data)
{
    if (!gguf__vtype_size(elem_type))
        return -EINVAL;
    struct gguf_value x = {.type = GGUF_V_ARRAY};
    x.v.arr.type = elem_type;
    x.v.arr.n = n;
    x.v.arr.data = data;
    return gguf_writer_set(w, key, &x);
}

int gguf_writer_set_arr_str(struct gguf_writer *w, const char *key, uint64_t n, const char *const *strs)
{
    if (n > GGUF_MAX_ARRAY)
        return -EINVAL;
    struct gguf_value *items = calloc(n ? n : 1, sizeof *items);
    if (!items)
        return -ENOMEM;
    for (uint64_t i = 0; i < n; i++) {
        items[i].type = GGUF_V_STRING;
        items[i].v.str.p = strs[i];
        items[i].v.str.len = strlen(strs[i]);
    }
    struct gguf_value x = {.type = GGUF_V_ARRAY};
    x.v.arr.type = GGUF_V_STRING;
    x.v.arr.n = n;
    x.v.arr.items = items;
    int rc = gguf_writer_set(w, key, &x);
    free(items);
    return rc;
}

static int add_tensor(struct gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                      const uint64_t *ne, const void *data, gguf_fill_cb fill, void *ud)
{
    size_t nl = strlen(name);
    const struct wtype_info *ti = wtype_info(type);
    if (!nl || nl > GGUF_MAX_NAME || !ti || n_dims == 0 || n_dims > GGUF_MAX_DIMS)
        return -EINVAL;
    for (size_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name))
            return -EEXIST;
    struct wtensor t = {.type = type, .n_dims = n_dims, .data = data, .fill = fill, .ud = ud};
    uint64_t nel = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        t.ne[d] = d < n_dims ? ne[d] : 1;
        if (t.ne[d] == 0 || t.ne[d] > (uint64_t)INT64_MAX || nel > (uint64_t)INT64_MAX / t.ne[d])
            return -EINVAL;
        nel *= t.ne[d];
    }
    if (t.ne[0] % ti->block_elems || wtype_bytes(type, nel, &t.size))
        return -EINVAL;
    if (w->n_t == w->cap_t && util_grow((void **)&w->t, &w->cap_t, sizeof *w->t, 64))
        return -ENOMEM;
    t.name = strdup(name);
    if (!t.name)
        return -ENOMEM;
    w->t[w->n_t++] = t;
    return 0;
}

int gguf_writer_add_tensor(struct gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                           const uint64_t *ne, const void *data)
{
    return add_tensor(w, name, type, n_dims, ne, data, NULL, NULL);
}

int gguf_writer_add_tensor_fill(struct gguf_writer *w, const char *name, uint32_t type,
                                uint32_t n_dims, const uint64_t *ne, gguf_fill_cb fill, void *ud)
{
    if (!fill)
        return -EINVAL;
    return add_tensor(w, name, type, n_dims, ne, NULL, fill, ud);
}

int gguf_writer_copy_kv(struct gguf_writer *w, const struct gguf_file *src, gguf_key_cb skip,
                        void *ud, char *err, size_t errlen)
{
    for (uint64_t i = 0; i < gguf_kv_count(src); i++) {
        const struct gguf_kv *kv = gguf_kv_at(src, i);
        if (skip && skip(kv->key, ud))
            continue;
        int rc = gguf_writer_set(w, kv->key, &kv->val);
        if (rc) {
            util_seterr(err, errlen, "copying metadata key '%s': %s", kv->key, strerror(-rc));
            return rc;
        }
    }
    return 0;
}

/* The bytes of the tensor of src named name: the writer's fill callback for copied tensors.
 * The size is checked again, since src is only borrowed. */
static int fill_from_src(void *ud, const char *name, void *buf, uint64_t size)
{
    const struct gguf_file *src = ud;
    const struct gguf_tensor *t = gguf_tensor_find(src, name);
    if (!t || t->size != size)
        return -EINVAL;
    if (t->data) {
        memcpy(buf, t->data, size);
        return 0;
    }
    return gguf_tensor_read(src, t, buf, NULL, 0);
}

int gguf_writer_add_tensor_copy(struct gguf_writer *w, const struct gguf_file *src,
                                const struct gguf_tensor *t)
{
    /* the callback only reads src: the cast drops const for the void * of gguf_fill_cb */
    return gguf_writer_add_tensor_fill(w, t->name, t->type, t->n_dims, t->ne, fill_from_src,
                                       (void *)src);
}

/* ------------------------------------------------------------------ serialisation */

struct out {
    FILE *fp;
    uint64_t pos;
    int err;
};

static void put(struct out *o, const void *p, size_t n)
{
    if (o->err || !n)
        return;
    if (o->fp && fwrite(p, 1, n, o->fp) != n)
        o->err = errno ? -errno : -EIO;
    o->pos += n;
}

static void put_u32(struct out *o, uint32_t v)
{
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put(o, b, 4);
}

static void put_u64(struct out *o, uint64_t v)
{
    put_u32(o, (uint32_t)v);
    put_u32(o, (uint32_t)(v >> 32));
}

static void put_str(struct out *o, const char *s, uint64_t len)
{
    put_u64(o, len);
    put(o, s, len);
}

static void put_pad(struct out *o, uint64_t align)
{
    static const uint8_t zeros[64];
    uint64_t pad = (align - o->pos % align) % align;
    while (pad) {
        size_t n = pad > sizeof zeros ? sizeof zeros : (size_t)pad;
        put(o, zeros, n);
        pad -= n;
    }
}

static void put_value(struct out *o, const struct gguf_value *v)
{
    switch (v->type) {
    case GGUF_V_U8: case GGUF_V_I8: case GGUF_V_BOOL: {
        uint8_t b = (uint8_t)v->v.u;
        put(o, &b, 1);
        break;
    }
    case GGUF_V_U16: case GGUF_V_I16: {
        uint8_t b[2] = {(uint8_t)v->v.u, (uint8_t)(v->v.u >> 8)};
        put(o, b, 2);
        break;
    }
    case GGUF_V_U32: case GGUF_V_I32: put_u32(o, (uint32_t)v->v.u); break;
    case GGUF_V_U64: case GGUF_V_I64: put_u64(o, v->v.u); break;
    case GGUF_V_F32: {
        float x = (float)v->v.f;
        uint32_t u;
        memcpy(&u, &x, 4);
        put_u32(o, u);
        break;
    }
    case GGUF_V_F64: {
        uint64_t u;
        memcpy(&u, &v->v.f, 8);
        put_u64(o, u);
        break;
    }
    case GGUF_V_STRING: put_str(o, v->v.str.p, v->v.str.len); break;
    case GGUF_V_ARRAY: {
        put_u32(o, v->v.arr.type);
        put_u64(o, v->v.arr.n);
        size_t es = gguf__vtype_size(v->v.arr.type);
        if (es) {
            /* raw little-endian element bytes, written as stored */
            put(o, v->v.arr.data, v->v.arr.n * es);
        } else {
            for (uint64_t i = 0; i < v->v.arr.n; i++)
                put_value(o, &v->v.arr.items[i]);
        }
        break;
    }
    }
}

/* Header (with tensor offsets assigned); o->fp NULL only measures. */
static void put_header(struct gguf_writer *w, struct out *o)
{
    put_u32(o, GGUF_MAGIC);
    put_u32(o, 3);
    put_u64(o, w->n_t);
    put_u64(o, w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++) {
        put_str(o, w->kv[i].key, strlen(w->kv[i].key));
        put_u32(o, w->kv[i].val.type);
        put_value(o, &w->kv[i].val);
    }
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        struct wtensor *t = &w->t[i];
        put_str(o, t->name, strlen(t->name));
        put_u32(o, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++)
            put_u64(o, t->ne[d]);
        put_u32(o, t->type);
        t->offset = off;
        put_u64(o, off);
        off += t->size;
        off += (w->alignment - off % w->alignment) % w->alignment;
    }
    put_pad(o, w->alignment);
}

uint64_t gguf_writer_file_size(const struct gguf_writer *cw)
{
    struct gguf_writer *w = (struct gguf_writer *)cw; /* assigns offsets only */
    struct out o = {0};
    put_header(w, &o);
    if (!w->n_t)
        return o.pos;
    const struct wtensor *last = &w->t[w->n_t - 1];
    return o.pos + last->offset + last->size;
}

int gguf_writer_write(struct gguf_writer *w, const char *path, char *err, size_t errlen)
{
    size_t pl = strlen(path);
    char *tmp = malloc(pl + 5);
    if (!tmp)
        return -ENOMEM;
    memcpy(tmp, path, pl);
    memcpy(tmp + pl, ".tmp", 5);
    int rc = 0;
    void *fillbuf = NULL;
    uint64_t fillmax = 0;
    for (size_t i = 0; i < w->n_t; i++)
        if (w->t[i].fill && w->t[i].size > fillmax)
            fillmax = w->t[i].size;
    if (fillmax) {
        if (fillmax > SIZE_MAX || !(fillbuf = malloc((size_t)fillmax))) {
            util_seterr(err, errlen, "%s: cannot allocate %" PRIu64 " bytes for one tensor", path, fillmax);
            free(tmp);
            return -ENOMEM;
        }
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = -errno;
        util_seterr(err, errlen, "%s: %s", tmp, strerror(errno));
        goto out_buf;
    }
    FILE *fp = fdopen(fd, "wb");
    if (!fp) {
        rc = -errno;
        close(fd);
        util_seterr(err, errlen, "%s: %s", tmp, strerror(-rc));
        goto out_unlink;
    }
    setvbuf(fp, NULL, _IOFBF, 1 << 20);
    struct out o = {.fp = fp};
    put_header(w, &o);
    uint64_t data_start = o.pos;
    for (size_t i = 0; i < w->n_t && !o.err && !rc; i++) {
        struct wtensor *t = &w->t[i];
        put_pad(&o, w->alignment);
        const void *src = t->data;
        if (t->fill) {
            rc = t->fill(t->ud, t->name, fillbuf, t->size);
            if (rc)
                util_seterr(err, errlen, "%s: producing tensor '%s' failed: %s", path, t->name, strerror(-rc));
            src = fillbuf;
        } else if (!src) {
            rc = -EINVAL;
            util_seterr(err, errlen, "%s: tensor '%s' has no data", path, t->name);
        }
        if (!rc) {
            if (o.pos - data_start != t->offset) {
                rc = -EPROTO;
                util_seterr(err, errlen, "%s: internal: tensor '%s' at %" PRIu64 " instead of %" PRIu64,
                             path, t->name, o.pos - data_start, t->offset);
            } else {
                put(&o, src, (size_t)t->size);
            }
        }
    }
    if (!rc && !o.err && fflush(fp) != 0)
        o.err = -errno;
    if (!rc && !o.err && fsync(fileno(fp)) != 0)
        o.err = -errno;
    if (fclose(fp) != 0 && !o.err && !rc)
        o.err = -errno;
    if (!rc && o.err) {
        rc = o.err;
        util_seterr(err, errlen, "%s: write failed: %s", tmp, strerror(-rc));
    }
    if (!rc && rename(tmp, path) != 0) {
        rc = -errno;
        util_seterr(err, errlen, "rename %s -> %s: %s", tmp, path, strerror(-rc));
    }
out_unlink:
    if (rc)
        unlink(tmp);
out_buf:
    free(fillbuf);
    free(tmp);
    return rc;
}

int gguf_writer_header(struct gguf_writer *w, void **buf, size_t *len)
{
    char *p = NULL;
    size_t n = 0;
    FILE *fp = open_memstream(&p, &n);
    if (!fp)
        return -errno;
    struct out o = {.fp = fp};
    put_header(w, &o);
    if (fclose(fp) != 0 && !o.err)
        o.err = -EIO;
    if (o.err || n != o.pos) {
        free(p);
        return o.err ? o.err : -EIO;
    }
    *buf = p;
    *len = n;
    return 0;
}

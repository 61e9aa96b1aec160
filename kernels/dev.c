/* dev.c — the device seam's entry points: open a device by name, its buffers, and the ops,
 * each checked (operands inside buffers of this device, shapes that make sense) before the
 * device's own function runs it. Host devices' buffers live here (malloc'd or viewed);
 * other devices supply theirs through the buffer entries of their ops table. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "kernels/internal.h"
#include "util/util.h"

static const struct kern__dev_ops *const devices[] = {&kern__dev_cpu, &kern__dev_ref,
                                                     &kern__dev_opencl};

const char *kern_dev_names(void) { return "cpu, ref, opencl"; }

int kern_dev_new(struct kern_dev **out, const char *name, int n_threads, char *err,
                 size_t errlen)
{
    struct kern_dev_opts o = {.n_threads = n_threads};
    return kern_dev_new_opts(out, name, &o, err, errlen);
}

int kern_dev_new_opts(struct kern_dev **out, const char *name, const struct kern_dev_opts *o,
                      char *err, size_t errlen)
{
    static const struct kern_dev_opts none;
    *out = NULL;
    const struct kern__dev_ops *ops = NULL;
    for (size_t i = 0; i < sizeof devices / sizeof devices[0]; i++)
        if (name && !strcmp(name, devices[i]->name))
            ops = devices[i];
    if (!ops) {
        util_seterr(err, errlen, "device %s: unknown (there are %s)", name ? name : "(none)",
                    kern_dev_names());
        return -ENODEV;
    }
    struct kern_dev *d = calloc(1, sizeof *d);
    if (!d)
        return -ENOMEM;
    d->ops = ops;
    int rc = ops->open(d, o ? o : &none);
    if (rc < 0) {
        util_seterr(err, errlen, "device %s: %s", name, d->msg[0] ? d->msg : strerror(-rc));
        free(d);
        return rc;
    }
    *out = d;
    return 0;
}

void kern_dev_free(struct kern_dev *d)
{
    if (!d)
        return;
    d->ops->close(d);
    free(d);
}

uint32_t kern_dev_rows_exact(const struct kern_dev *d, uint32_t type)
{
    if (!kern_type_rows_exact(type))
        return 0;
    return d->ops->rows_exact ? d->ops->rows_exact(d, type) : UINT32_MAX;
}

const char *kern_dev_name(const struct kern_dev *d) { return d->ops->name; }
int kern_dev_threads(const struct kern_dev *d) { return d->n_threads; }
int kern_dev_sync(struct kern_dev *d) { return d->ops->sync(d); }

size_t kern_dev_matmul_scratch(const struct kern_dev *d, uint32_t type, int64_t cols, int64_t n)
{
    return d->ops->matmul_scratch(d, type, cols, n);
}

size_t kern_dev_attention_scratch(const struct kern_dev *d, int64_t n_ctx, int head_dim)
{
    return d->ops->attention_scratch(d, n_ctx, head_dim);
}

size_t kern_dev_deltanet_scratch(const struct kern_dev *d, int d_state)
{
    return d->ops->deltanet_scratch(d, d_state);
}

int kern_dev_reserve(struct kern_dev *d, size_t bytes) { return d->ops->reserve(d, bytes); }

/* ---- buffers ---- */

/* Host buffers of this size or more are anonymous mappings of their own (kern_buf_new). */
#define KERN_BUF_MAP_MIN ((size_t)1 << 20)

int kern_buf_new(struct kern_buf **out, struct kern_dev *d, enum kern_buf_kind kind,
                 size_t bytes, const void *src)
{
    *out = NULL;
    if (kind > KERN_BUF_IO || (kind == KERN_BUF_WEIGHT) != (src != NULL))
        return -EINVAL;
    struct kern_buf *b = calloc(1, sizeof *b);
    if (!b)
        return -ENOMEM;
    b->dev = d;
    b->kind = kind;
    b->cap = bytes;
    b->size = kind == KERN_BUF_IO ? 0 : bytes;
    int rc = 0;
    if (!d->ops->host) {
        rc = d->ops->buf_new(b, src);
    } else if (kind == KERN_BUF_WEIGHT) {
        b->host = (void *)src;          /* a view: the caller's bytes outlive the buffer */
    } else if (kind != KERN_BUF_IO) {
        /* Zeroed bytes. A large one (a session's KV cache, tens of MiB) is its own anonymous
         * mapping: untouched zero pages, faulted in as positions fill them. calloc would not
         * do: once glibc has freed such a chunk it serves the next from its heap and clears
         * it whole, so every session opened would write its full context first. */
        b->owned = true;
        if (bytes >= KERN_BUF_MAP_MIN) {
            void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            b->host = p == MAP_FAILED ? NULL : p;
        } else {
            b->host = calloc(1, bytes ? bytes : 1);
        }
        rc = b->host ? 0 : -ENOMEM;
    }
    if (rc < 0) {
        free(b);
        return rc;
    }
    *out = b;
    return 0;
}

void kern_buf_free(struct kern_buf *b)
{
    if (!b)
        return;
    if (b->dev->ops->host && b->dev->ops->weight_free && b->kind == KERN_BUF_WEIGHT)
        b->dev->ops->weight_free(b);
    if (!b->dev->ops->host)
        b->dev->ops->buf_free(b);
    else if (b->owned && b->cap >= KERN_BUF_MAP_MIN)   /* kern_buf_new mapped it */
        munmap(b->host, b->cap);
    else if (b->owned)
        free(b->host);
    free(b);
}

size_t kern_buf_size(const struct kern_buf *b) { return b->size; }

static bool in_buf(const struct kern_buf *b, size_t off, size_t n)
{
    return off <= b->size && n <= b->size - off;
}

int kern_buf_write(struct kern_buf *b, size_t off, const void *src, size_t n)
{
    if (!in_buf(b, off, n) || b->kind == KERN_BUF_WEIGHT)
        return -EINVAL;
    if (!b->dev->ops->host)
        return b->dev->ops->buf_write(b, off, src, n);
    if (n)
        memcpy((char *)b->host + off, src, n);
    return 0;
}

int kern_buf_read(struct kern_buf *b, size_t off, void *dst, size_t n)
{
    if (!in_buf(b, off, n))
        return -EINVAL;
    if (!b->dev->ops->host)
        return b->dev->ops->buf_read(b, off, dst, n);
    int rc = kern_dev_sync(b->dev);
    if (rc == 0 && n)
        memcpy(dst, (char *)b->host + off, n);
    return rc;
}

int kern_buf_bind(struct kern_buf *b, void *host, size_t bytes, bool upload)
{
    if (b->kind != KERN_BUF_IO || bytes > b->cap || b->bound || (bytes && !host))
        return -EINVAL;
    b->bound = host;
    b->size = bytes;
    if (b->dev->ops->host) {
        b->host = host;
        return 0;
    }
    int rc = upload ? b->dev->ops->buf_write(b, 0, host, bytes) : 0;
    if (rc < 0) {
        b->bound = NULL;
        b->size = 0;
    }
    return rc;
}

int kern_buf_unbind(struct kern_buf *b, bool download)
{
    if (b->kind != KERN_BUF_IO)
        return -EINVAL;
    int rc = kern_dev_sync(b->dev);
    if (rc == 0 && download && !b->dev->ops->host && b->size)
        rc = b->dev->ops->buf_read(b, 0, b->bound, b->size);
    b->bound = NULL;
    b->host = b->dev->ops->host ? NULL : b->host;
    b->size = 0;
    return rc;
}

/* ---- operand checks ---- */

/* a * b * c bytes, SIZE_MAX (which no buffer holds) for a negative count or an overflow. */
static size_t bytes3(int64_t a, int64_t b, size_t c)
{
    size_t r;
    if (a < 0 || b < 0 || __builtin_mul_overflow((size_t)a, (size_t)b, &r) ||
        __builtin_mul_overflow(r, c, &r))
        return SIZE_MAX;
    return r;
}

/* Bytes spanned by n rows of width elements of elem bytes, stride elements apart. */
static size_t strided(int64_t n, size_t stride, int64_t width, size_t elem)
{
    if (n <= 0 || width < 0)
        return n == 0 && width >= 0 ? 0 : SIZE_MAX;
    size_t r;
    if (__builtin_mul_overflow((size_t)(n - 1), stride, &r) ||
        __builtin_add_overflow(r, (size_t)width, &r) || __builtin_mul_overflow(r, elem, &r))
        return SIZE_MAX;
    return r;
}

/* Operand a is a buffer of d holding bytes from its offset. */
static bool ok(const struct kern_dev *d, struct kern_at a, size_t bytes)
{
    return a.buf && a.buf->dev == d && bytes != SIZE_MAX && in_buf(a.buf, a.off, bytes);
}

/* The same, or no operand. */
static bool opt(const struct kern_dev *d, struct kern_at a, size_t bytes)
{
    return !a.buf || ok(d, a, bytes);
}

#define FL(a, b) bytes3((a), (b), sizeof(float))
#define CHECK(cond)                 \
    do {                            \
        if (!(cond))                \
            return -EINVAL;         \
    } while (0)

/* Bytes of a KV cache element: F16 or F32, 0 otherwise. */
static size_t kv_elem(uint32_t kv_type)
{
    return kv_type == KERN_T_F16 ? 2 : kv_type == KERN_T_F32 ? 4 : 0;
}

int kern_buf_weight_use(struct kern_buf *b, uint32_t type, int64_t rows, int64_t cols,
                        int64_t n_mat, bool release)
{
    size_t rb = kern_row_bytes(type, cols);
    if (b->kind != KERN_BUF_WEIGHT || rows <= 0 || n_mat <= 0 || rb == 0 ||
        bytes3(rows, n_mat, rb) != b->size)
        return -EINVAL;
    const struct kern__dev_ops *ops = b->dev->ops;
    return ops->weight_use ? ops->weight_use(b, type, rows, cols, n_mat, release) : 0;
}

size_t kern_buf_weight_own(const struct kern_buf *b)
{
    return b->kind == KERN_BUF_WEIGHT && b->dev->ops->weight_own ? b->dev->ops->weight_own(b) : 0;
}

/* ---- ops ---- */

int kern_dev_matmul(struct kern_dev *d, uint32_t type, struct kern_at w, int64_t rows,
                    int64_t cols, struct kern_at x, int64_t n, struct kern_at y)
{
    size_t rb = kern_row_bytes(type, cols);
    CHECK(rb && ok(d, w, bytes3(rows, 1, rb)) && ok(d, x, FL(n, cols)) && ok(d, y, FL(n, rows)));
    return d->ops->matmul(d, type, w, rows, cols, x, n, y);
}

int kern_dev_rmsnorm_rows(struct kern_dev *d, struct kern_at out, struct kern_at x,
                          struct kern_at w, int64_t n_rows, int64_t cols, float eps)
{
    CHECK(ok(d, out, FL(n_rows, cols)) && ok(d, x, FL(n_rows, cols)) && ok(d, w, FL(cols, 1)));
    return d->ops->rmsnorm_rows(d, out, x, w, n_rows, cols, eps);
}

int kern_dev_rope_angles(struct kern_dev *d, struct kern_at cs, struct kern_at sn, int64_t n,
                         int64_t pos0, int n_rot, float freq_base, float freq_scale,
                         struct kern_at freq_div)
{
    CHECK(n_rot >= 0 && pos0 >= 0 && ok(d, cs, FL(n, n_rot / 2)) && ok(d, sn, FL(n, n_rot / 2)) &&
          opt(d, freq_div, FL(n_rot / 2, 1)));
    return d->ops->rope_angles(d, cs, sn, n, pos0, n_rot, freq_base, freq_scale, freq_div);
}

int kern_dev_rope_rows(struct kern_dev *d, struct kern_at x, int64_t n, size_t stride,
                       int n_head, int head_dim, int n_rot, struct kern_at cs,
                       struct kern_at sn, bool neox)
{
    CHECK(n_head >= 0 && head_dim >= 0 && n_rot >= 0 && n_rot <= head_dim &&
          ok(d, x, strided(n, stride, (int64_t)n_head * head_dim, sizeof(float))) &&
          ok(d, cs, FL(n, n_rot / 2)) && ok(d, sn, FL(n, n_rot / 2)));
    return d->ops->rope_rows(d, x, n, stride, n_head, head_dim, n_rot, cs, sn, neox);
}

int kern_dev_kv_store(struct kern_dev *d, uint32_t kv_type, struct kern_at dst,
                      size_t dst_stride, struct kern_at src, int64_t n, int64_t dim)
{
    size_t es = kv_elem(kv_type);
    CHECK(es && ok(d, dst, strided(n, dst_stride, dim, es)) && ok(d, src, FL(n, dim)));
    return d->ops->kv_store(d, kv_type, dst, dst_stride, src, n, dim);
}

int kern_dev_attention(struct kern_dev *d, uint32_t kv_type, struct kern_at out,
                       struct kern_at q, struct kern_at k, struct kern_at v, int64_t n,
                       int64_t pos0, int n_head, int n_kv_head, int head_dim,
                       size_t kv_stride, float scale)
{
    size_t es = kv_elem(kv_type);
    int64_t qd = (int64_t)n_head * head_dim, kvd = (int64_t)n_kv_head * head_dim;
    CHECK(es && n_head > 0 && n_kv_head > 0 && n_head % n_kv_head == 0 && head_dim > 0 &&
          n >= 0 && pos0 >= 0 && ok(d, out, FL(n, qd)) && ok(d, q, FL(n, qd)) &&
          ok(d, k, strided(pos0 + n, kv_stride, kvd, es)) &&
          ok(d, v, strided(pos0 + n, kv_stride, kvd, es)));
    return d->ops->attention(d, kv_type, out, q, k, v, n, pos0, n_head, n_kv_head, head_dim,
                             kv_stride, scale);
}

int kern_dev_swiglu(struct kern_dev *d, struct kern_at out, struct kern_at gate,
                    struct kern_at up, int64_t n)
{
    CHECK(ok(d, out, FL(n, 1)) && ok(d, gate, FL(n, 1)) && ok(d, up, FL(n, 1)));
    return d->ops->swiglu(d, out, gate, up, n);
}

int kern_dev_add(struct kern_dev *d, struct kern_at y, struct kern_at x, int64_t n)
{
    CHECK(ok(d, y, FL(n, 1)) && ok(d, x, FL(n, 1)));
    return d->ops->add(d, y, x, n);
}

int kern_dev_add_rows(struct kern_dev *d, struct kern_at y, struct kern_at b, int64_t n,
                      int64_t cols)
{
    CHECK(ok(d, y, FL(n, cols)) && ok(d, b, FL(cols, 1)));
    return d->ops->add_rows(d, y, b, n, cols);
}

int kern_dev_axpy_rows(struct kern_dev *d, struct kern_at y, int64_t y_rows, struct kern_at a,
                       struct kern_at x, struct kern_at idx, int64_t n, int64_t cols)
{
    CHECK(ok(d, y, FL(idx.buf ? y_rows : n, cols)) && ok(d, a, FL(n, 1)) &&
          ok(d, x, FL(n, cols)) && opt(d, idx, bytes3(n, 1, sizeof(uint32_t))));
    return d->ops->axpy_rows(d, y, y_rows, a, x, idx, n, cols);
}

int kern_dev_sigmoid(struct kern_dev *d, struct kern_at x, int64_t n)
{
    CHECK(ok(d, x, FL(n, 1)));
    return d->ops->sigmoid(d, x, n);
}

int kern_dev_mul_sigmoid(struct kern_dev *d, struct kern_at x, struct kern_at g, int64_t n)
{
    CHECK(ok(d, x, FL(n, 1)) && ok(d, g, FL(n, 1)));
    return d->ops->mul_sigmoid(d, x, g, n);
}

int kern_dev_l2norm(struct kern_dev *d, struct kern_at x, int64_t n, size_t stride, int nh,
                    int dim, float eps)
{
    CHECK(nh >= 0 && dim >= 0 && ok(d, x, strided(n, stride, (int64_t)nh * dim, sizeof(float))));
    return d->ops->l2norm(d, x, n, stride, nh, dim, eps);
}

int kern_dev_rmsnorm_silu(struct kern_dev *d, struct kern_at out, struct kern_at x,
                          struct kern_at w, struct kern_at z, int64_t n, int64_t cols,
                          float eps)
{
    CHECK(ok(d, out, FL(n, cols)) && ok(d, x, FL(n, cols)) && ok(d, w, FL(cols, 1)) &&
          ok(d, z, FL(n, cols)));
    return d->ops->rmsnorm_silu(d, out, x, w, z, n, cols, eps);
}

int kern_dev_conv_silu(struct kern_dev *d, struct kern_at out, struct kern_at x,
                       struct kern_at w, int64_t n, int64_t channels, int kernel)
{
    CHECK(kernel >= 1 && n >= 0 && ok(d, out, FL(n, channels)) &&
          ok(d, x, FL(n + kernel - 1, channels)) && ok(d, w, FL(channels, kernel)));
    return d->ops->conv_silu(d, out, x, w, n, channels, kernel);
}

int kern_dev_moe_route(struct kern_dev *d, struct kern_at sel, struct kern_at w,
                       struct kern_at logits, int64_t n, int n_expert, int k)
{
    CHECK(k > 0 && k <= n_expert && ok(d, sel, bytes3(n, k, sizeof(uint32_t))) &&
          ok(d, w, FL(n, k)) && ok(d, logits, FL(n, n_expert)));
    return d->ops->moe_route(d, sel, w, logits, n, n_expert, k);
}

int kern_dev_deltanet(struct kern_dev *d, struct kern_at o, struct kern_at S, struct kern_at q,
                      struct kern_at k, struct kern_at v, size_t stride, struct kern_at beta,
                      struct kern_at alpha, struct kern_at dt_bias, struct kern_at a,
                      int64_t n, int n_k_head, int n_v_head, int dim)
{
    int64_t kd = (int64_t)n_k_head * dim, vd = (int64_t)n_v_head * dim;
    CHECK(n_k_head > 0 && n_v_head > 0 && dim > 0 && ok(d, o, FL(n, vd)) &&
          ok(d, S, FL(vd, dim)) && ok(d, q, strided(n, stride, kd, sizeof(float))) &&
          ok(d, k, strided(n, stride, kd, sizeof(float))) &&
          ok(d, v, strided(n, stride, vd, sizeof(float))) && ok(d, beta, FL(n, n_v_head)) &&
          ok(d, alpha, FL(n, n_v_head)) && ok(d, dt_bias, FL(n_v_head, 1)) &&
          ok(d, a, FL(n_v_head, 1)));
    return d->ops->deltanet(d, o, S, q, k, v, stride, beta, alpha, dt_bias, a, n, n_k_head,
                            n_v_head, dim);
}

int kern_dev_get_rows(struct kern_dev *d, uint32_t type, struct kern_at table, int64_t rows,
                      int64_t cols, struct kern_at ids, int64_t n, struct kern_at out)
{
    size_t rb = kern_row_bytes(type, cols);
    CHECK(rb && ok(d, table, bytes3(rows, 1, rb)) && ok(d, ids, bytes3(n, 1, sizeof(int32_t))) &&
          ok(d, out, FL(n, cols)));
    return d->ops->get_rows(d, type, table, rows, cols, ids, n, out);
}

int kern_dev_copy_rows(struct kern_dev *d, struct kern_at dst, size_t dst_stride,
                       struct kern_at src, size_t src_stride, int64_t src_rows,
                       struct kern_at idx, int64_t n, size_t row_bytes)
{
    CHECK(row_bytes <= (size_t)INT64_MAX &&
          ok(d, dst, strided(n, dst_stride, (int64_t)row_bytes, 1)) &&
          ok(d, src, strided(idx.buf ? src_rows : n, src_stride, (int64_t)row_bytes, 1)) &&
          opt(d, idx, bytes3(n, 1, sizeof(uint32_t))));
    return d->ops->copy_rows(d, dst, dst_stride, src, src_stride, src_rows, idx, n, row_bytes);
}

int kern_dev_zero(struct kern_dev *d, struct kern_at dst, size_t bytes)
{
    CHECK(ok(d, dst, bytes));
    return d->ops->zero(d, dst, bytes);
}

/* cpu_dev.c — the "cpu" device: the kern_* fast path on the device's thread pool. Buffers are
 * host memory (weights viewed in the mapping), so each op is the kern_* call on the
 * operands' addresses: bit-identical to calling kern_* directly. Weight buffers said to be
 * matmul-only (kern_buf_weight_use) of a type with repacked kernels are repacked
 * (kern_pack_new) and their matmuls are kern_matmul_packed; their mapped pages are dropped.
 * Ops are synchronous. */
#include <errno.h>

#include "kernels/internal.h"
#include "util/util.h"

#define F KERN__F
#define H kern__at_host

static int open_(struct kern_dev *d, const struct kern_dev_opts *o)
{
    int rc = kern_pool_new(&d->pool, o->n_threads);
    if (rc == 0)
        d->n_threads = kern_pool_threads(d->pool);
    return rc;
}

static void close_(struct kern_dev *d) { kern_pool_free(d->pool); }

static int sync_(struct kern_dev *d)
{
    (void)d;
    return 0;
}

static size_t matmul_scratch(const struct kern_dev *d, uint32_t type, int64_t cols, int64_t n)
{
    (void)d;
    return kern_matmul_scratch(type, cols, n);
}

static size_t attention_scratch(const struct kern_dev *d, int64_t n_ctx, int head_dim)
{
    return kern_attention_scratch(d->pool, n_ctx, head_dim);
}

static size_t deltanet_scratch(const struct kern_dev *d, int d_state)
{
    return kern_deltanet_scratch(d->pool, d_state);
}

static int reserve(struct kern_dev *d, size_t bytes) { return kern_pool_reserve(d->pool, bytes); }

static int weight_use(struct kern_buf *b, uint32_t type, int64_t rows, int64_t cols,
                      int64_t n_mat, bool release)
{
    if (b->impl || !kern_pack_supported(type, cols))
        return 0; /* said twice, or no repacked kernels: the file layout serves */
    struct kern_packed *pk;
    int rc = kern_pack_new(b->dev->pool, &pk, type, b->host, rows, cols, n_mat);
    if (rc < 0)
        return rc == -ENOTSUP ? 0 : rc;
    b->impl = pk;
    if (release)
        util_pages_drop(b->host, b->size); /* the resident set keeps the copy only */
    return 0;
}

static void weight_free(struct kern_buf *b)
{
    kern_pack_free(b->impl);
    b->impl = NULL;
}

static size_t weight_own(const struct kern_buf *b) { return kern_pack_bytes(b->impl); }

/* A repacked weight whose matrix this is runs the interleaved kernels; anything else (another
 * shape or offset, a pack of another SIMD level) reads the bytes as given. */
static int matmul(struct kern_dev *d, uint32_t type, struct kern_at w, int64_t rows,
                  int64_t cols, struct kern_at x, int64_t n, struct kern_at y)
{
    const struct kern_packed *pk = w.buf->impl;
    int64_t mat = pk ? kern_pack_find(pk, type, rows, cols, w.off) : -1;
    if (mat >= 0)
        return kern_matmul_packed(d->pool, pk, mat, F(x), n, F(y));
    return kern_matmul(d->pool, type, H(w), rows, cols, F(x), n, F(y));
}

static int rmsnorm_rows(struct kern_dev *d, struct kern_at out, struct kern_at x,
                        struct kern_at w, int64_t n_rows, int64_t cols, float eps)
{
    kern_rmsnorm_rows(d->pool, F(out), F(x), F(w), n_rows, cols, eps);
    return 0;
}

static int rope_angles(struct kern_dev *d, struct kern_at cs, struct kern_at sn, int64_t n,
                       int64_t pos0, int n_rot, float freq_base, float freq_scale,
                       struct kern_at freq_div)
{
    kern_rope_angles(d->pool, F(cs), F(sn), n, pos0, n_rot, freq_base, freq_scale, F(freq_div));
    return 0;
}

static int rope_rows(struct kern_dev *d, struct kern_at x, int64_t n, size_t stride, int n_head,
                     int head_dim, int n_rot, struct kern_at cs, struct kern_at sn, bool neox)
{
    kern_rope_rows(d->pool, F(x), n, stride, n_head, head_dim, n_rot, F(cs), F(sn), neox);
    return 0;
}

static int kv_store(struct kern_dev *d, uint32_t kv_type, struct kern_at dst, size_t dst_stride,
                    struct kern_at src, int64_t n, int64_t dim)
{
    kern_kv_store(d->pool, kv_type, H(dst), dst_stride, F(src), n, dim);
    return 0;
}

/* The pool keeps its threads' softmax rows in its scratch; the NULL row is for no pool. */
static int attention(struct kern_dev *d, uint32_t kv_type, struct kern_at out, struct kern_at q,
                     struct kern_at k, struct kern_at v, int64_t n, int64_t pos0, int n_head,
                     int n_kv_head, int head_dim, size_t kv_stride, float scale)
{
    return kern_attention(d->pool, kv_type, F(out), F(q), H(k), H(v), n, pos0, n_head,
                          n_kv_head, head_dim, kv_stride, scale, NULL);
}

static int swiglu(struct kern_dev *d, struct kern_at out, struct kern_at gate, struct kern_at up,
                  int64_t n)
{
    kern_swiglu(d->pool, F(out), F(gate), F(up), n);
    return 0;
}

static int add(struct kern_dev *d, struct kern_at y, struct kern_at x, int64_t n)
{
    kern_add(d->pool, F(y), F(x), n);
    return 0;
}

static int add_rows(struct kern_dev *d, struct kern_at y, struct kern_at b, int64_t n,
                    int64_t cols)
{
    kern_add_rows(d->pool, F(y), F(b), n, cols);
    return 0;
}

static int axpy_rows(struct kern_dev *d, struct kern_at y, int64_t y_rows, struct kern_at a,
                     struct kern_at x, struct kern_at idx, int64_t n, int64_t cols)
{
    const uint32_t *ix = H(idx);
    if (ix && !kern__host_idx_ok(ix, n, y_rows))
        return -EINVAL;
    kern_axpy_rows(d->pool, F(y), F(a), F(x), ix, n, cols);
    return 0;
}

static int sigmoid(struct kern_dev *d, struct kern_at x, int64_t n)
{
    kern_sigmoid(d->pool, F(x), n);
    return 0;
}

static int mul_sigmoid(struct kern_dev *d, struct kern_at x, struct kern_at g, int64_t n)
{
    kern_mul_sigmoid(d->pool, F(x), F(g), n);
    return 0;
}

static int l2norm(struct kern_dev *d, struct kern_at x, int64_t n, size_t stride, int nh,
                  int dim, float eps)
{
    kern_l2norm(d->pool, F(x), n, stride, nh, dim, eps);
    return 0;
}

static int rmsnorm_silu(struct kern_dev *d, struct kern_at out, struct kern_at x,
                        struct kern_at w, struct kern_at z, int64_t n, int64_t cols, float eps)
{
    kern_rmsnorm_silu(d->pool, F(out), F(x), F(w), F(z), n, cols, eps);
    return 0;
}

static int conv_silu(struct kern_dev *d, struct kern_at out, struct kern_at x, struct kern_at w,
                     int64_t n, int64_t channels, int kernel)
{
    kern_conv_silu(d->pool, F(out), F(x), F(w), n, channels, kernel);
    return 0;
}

static int moe_route(struct kern_dev *d, struct kern_at sel, struct kern_at w,
                     struct kern_at logits, int64_t n, int n_expert, int k)
{
    kern_moe_route(d->pool, H(sel), F(w), F(logits), n, n_expert, k);
    return 0;
}

static int deltanet(struct kern_dev *d, struct kern_at o, struct kern_at S, struct kern_at q,
                    struct kern_at k, struct kern_at v, size_t stride, struct kern_at beta,
                    struct kern_at alpha, struct kern_at dt_bias, struct kern_at a, int64_t n,
                    int n_k_head, int n_v_head, int dim)
{
    return kern_deltanet(d->pool, F(o), F(S), F(q), F(k), F(v), stride, F(beta), F(alpha),
                         F(dt_bias), F(a), n, n_k_head, n_v_head, dim, NULL);
}

/* F32 matmuls of more rows go to OpenBLAS's sgemm (kernels/cpu/cpu_matmul.c), whose sums
 * depend on the shape; every other type's rows are exact at any number. */
static uint32_t rows_exact(const struct kern_dev *d, uint32_t type)
{
    (void)d;
    return type == KERN_T_F32 ? KERN_ROWS_EXACT_MAX : UINT32_MAX;
}

const struct kern__dev_ops kern__dev_cpu = {
    .name = "cpu", .host = true, KERN__HOST_DEV_OPS,
    .weight_use = weight_use, .weight_free = weight_free, .weight_own = weight_own,
    .rows_exact = rows_exact,
};

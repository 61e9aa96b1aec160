/* ref_dev.c — the "ref" device: the kern_ref_* oracle on the calling thread, behind the same
 * seam as the fast devices. It proves the seam carries a whole forward pass and gives every
 * other device something to be compared with (tests/unit/test-model-dev.c). Buffers are host
 * memory; its scratch holds the attention row and the DeltaNet vectors. The matmul
 * quantises its activations into a buffer of its own (the oracle allocates; the forward
 * pass on "cpu" does not). Ops are synchronous. */
#include <errno.h>
#include <stdlib.h>

#include "kernels/internal.h"

#define F KERN__F
#define H kern__at_host

static int open_(struct kern_dev *d, const struct kern_dev_opts *o)
{
    (void)o;
    d->n_threads = 1;
    return 0;
}

static void close_(struct kern_dev *d) { free(d->scratch); }

static int sync_(struct kern_dev *d)
{
    (void)d;
    return 0;
}

static size_t matmul_scratch(const struct kern_dev *d, uint32_t type, int64_t cols, int64_t n)
{
    (void)d, (void)type, (void)cols, (void)n;
    return 0;
}

static size_t attention_scratch(const struct kern_dev *d, int64_t n_ctx, int head_dim)
{
    (void)d, (void)head_dim;
    return n_ctx > 0 ? (size_t)n_ctx * sizeof(float) : 0;
}

static size_t deltanet_scratch(const struct kern_dev *d, int d_state)
{
    (void)d;
    return d_state > 0 ? 2 * (size_t)d_state * sizeof(float) : 0;
}

static int reserve(struct kern_dev *d, size_t bytes)
{
    if (bytes <= d->scratch_size)
        return 0;
    void *p = malloc(bytes);
    if (!p)
        return -ENOMEM;
    free(d->scratch);
    d->scratch = p;
    d->scratch_size = bytes;
    return 0;
}

static int matmul(struct kern_dev *d, uint32_t type, struct kern_at w, int64_t rows,
                  int64_t cols, struct kern_at x, int64_t n, struct kern_at y)
{
    (void)d;
    return kern_ref_matmul(type, H(w), rows, cols, F(x), n, F(y));
}

static int rmsnorm_rows(struct kern_dev *d, struct kern_at out, struct kern_at x,
                        struct kern_at w, int64_t n_rows, int64_t cols, float eps)
{
    (void)d;
    for (int64_t r = 0; r < n_rows; r++)
        kern_ref_rmsnorm(F(out) + r * cols, F(x) + r * cols, F(w), cols, eps);
    return 0;
}

static int rope_angles(struct kern_dev *d, struct kern_at cs, struct kern_at sn, int64_t n,
                       int64_t pos0, int n_rot, float freq_base, float freq_scale,
                       struct kern_at freq_div)
{
    (void)d;
    kern_ref_rope_angles(F(cs), F(sn), n, pos0, n_rot, freq_base, freq_scale, F(freq_div));
    return 0;
}

static int rope_rows(struct kern_dev *d, struct kern_at x, int64_t n, size_t stride, int n_head,
                     int head_dim, int n_rot, struct kern_at cs, struct kern_at sn, bool neox)
{
    (void)d;
    kern_ref_rope_rows(F(x), n, stride, n_head, head_dim, n_rot, F(cs), F(sn), neox);
    return 0;
}

static int kv_store(struct kern_dev *d, uint32_t kv_type, struct kern_at dst, size_t dst_stride,
                    struct kern_at src, int64_t n, int64_t dim)
{
    (void)d;
    kern_ref_kv_store(kv_type, H(dst), dst_stride, F(src), n, dim);
    return 0;
}

static int attention(struct kern_dev *d, uint32_t kv_type, struct kern_at out, struct kern_at q,
                     struct kern_at k, struct kern_at v, int64_t n, int64_t pos0, int n_head,
                     int n_kv_head, int head_dim, size_t kv_stride, float scale)
{
    if ((size_t)(pos0 + n) > d->scratch_size / sizeof(float))
        return -ENOSPC;
    kern_ref_attention(kv_type, F(out), F(q), H(k), H(v), n, pos0, n_head, n_kv_head, head_dim,
                       kv_stride, scale, d->scratch);
    return 0;
}

static int swiglu(struct kern_dev *d, struct kern_at out, struct kern_at gate, struct kern_at up,
                  int64_t n)
{
    (void)d;
    kern_ref_swiglu(F(out), F(gate), F(up), n);
    return 0;
}

static int add(struct kern_dev *d, struct kern_at y, struct kern_at x, int64_t n)
{
    (void)d;
    kern_ref_add(F(y), F(x), n);
    return 0;
}

static int add_rows(struct kern_dev *d, struct kern_at y, struct kern_at b, int64_t n,
                    int64_t cols)
{
    (void)d;
    kern_ref_add_rows(F(y), F(b), n, cols);
    return 0;
}

static int axpy_rows(struct kern_dev *d, struct kern_at y, int64_t y_rows, struct kern_at a,
                     struct kern_at x, struct kern_at idx, int64_t n, int64_t cols)
{
    (void)d;
    const uint32_t *ix = H(idx);
    if (ix && !kern__host_idx_ok(ix, n, y_rows))
        return -EINVAL;
    kern_ref_axpy_rows(F(y), F(a), F(x), ix, n, cols);
    return 0;
}

static int sigmoid(struct kern_dev *d, struct kern_at x, int64_t n)
{
    (void)d;
    kern_ref_sigmoid(F(x), n);
    return 0;
}

static int mul_sigmoid(struct kern_dev *d, struct kern_at x, struct kern_at g, int64_t n)
{
    (void)d;
    kern_ref_mul_sigmoid(F(x), F(g), n);
    return 0;
}

static int l2norm(struct kern_dev *d, struct kern_at x, int64_t n, size_t stride, int nh,
                  int dim, float eps)
{
    (void)d;
    kern_ref_l2norm(F(x), n, stride, nh, dim, eps);
    return 0;
}

static int rmsnorm_silu(struct kern_dev *d, struct kern_at out, struct kern_at x,
                        struct kern_at w, struct kern_at z, int64_t n, int64_t cols, float eps)
{
    (void)d;
    kern_ref_rmsnorm_silu(F(out), F(x), F(w), F(z), n, cols, eps);
    return 0;
}

static int conv_silu(struct kern_dev *d, struct kern_at out, struct kern_at x, struct kern_at w,
                     int64_t n, int64_t channels, int kernel)
{
    (void)d;
    kern_ref_conv_silu(F(out), F(x), F(w), n, channels, kernel);
    return 0;
}

static int moe_route(struct kern_dev *d, struct kern_at sel, struct kern_at w,
                     struct kern_at logits, int64_t n, int n_expert, int k)
{
    (void)d;
    kern_ref_moe_route(H(sel), F(w), F(logits), n, n_expert, k);
    return 0;
}

static int deltanet(struct kern_dev *d, struct kern_at o, struct kern_at S, struct kern_at q,
                    struct kern_at k, struct kern_at v, size_t stride, struct kern_at beta,
                    struct kern_at alpha, struct kern_at dt_bias, struct kern_at a, int64_t n,
                    int n_k_head, int n_v_head, int dim)
{
    if (2 * (size_t)dim > d->scratch_size / sizeof(float))
        return -ENOSPC;
    kern_ref_deltanet(F(o), F(S), F(q), F(k), F(v), stride, F(beta), F(alpha), F(dt_bias), F(a),
                      n, n_k_head, n_v_head, dim, d->scratch);
    return 0;
}

const struct kern__dev_ops kern__dev_ref = {.name = "ref", .host = true, KERN__HOST_DEV_OPS};

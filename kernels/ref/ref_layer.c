/* Reference ops of the forward pass beyond matmul and attention: RoPE tables and rotation,
 * the KV store, bias and residual adds, gates, the norms of the hybrid layers, the causal
 * conv, the MoE router and the Gated DeltaNet recurrence. Plain scalar loops in the order
 * llama.cpp's CPU graph computes them (sums in double where ggml uses ggml_float). */
#include "kernels/internal.h"

static inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float siluf(float x) { return x / (1.0f + expf(-x)); }
static inline float softplusf(float x) { return x > 20.0f ? x : logf(1.0f + expf(x)); }

void kern_ref_rope_angles(float *cs, float *sn, int64_t n, int64_t pos0, int n_rot,
                          float freq_base, float freq_scale, const float *freq_div)
{
    const int half = n_rot / 2;
    const float theta_scale = powf(freq_base, -2.0f / (float)n_rot);
    for (int64_t r = 0; r < n; r++) {
        float theta = (float)(pos0 + r);
        for (int i = 0; i < half; i++) {
            float t = freq_scale * (freq_div ? theta / freq_div[i] : theta);
            cs[r * half + i] = cosf(t);
            sn[r * half + i] = sinf(t);
            theta *= theta_scale;
        }
    }
}

void kern_ref_rope_rows(float *x, int64_t n, size_t stride, int n_head, int head_dim,
                        int n_rot, const float *cs, const float *sn, bool neox)
{
    const int half = n_rot / 2;
    for (int64_t r = 0; r < n; r++) {
        const float *c = cs + r * half, *s = sn + r * half;
        for (int h = 0; h < n_head; h++) {
            float *v = x + (size_t)r * stride + (size_t)h * head_dim;
            for (int i = 0; i < half; i++) {
                int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
                float x0 = v[a], x1 = v[b];
                v[a] = x0 * c[i] - x1 * s[i];
                v[b] = x0 * s[i] + x1 * c[i];
            }
        }
    }
}

void kern_ref_kv_store(uint32_t kv_type, void *dst, size_t dst_stride, const float *src,
                       int64_t n, int64_t dim)
{
    assert(kv_type == KERN_T_F16 || kv_type == KERN_T_F32);
    for (int64_t r = 0; r < n; r++) {
        const float *x = src + r * dim;
        if (kv_type == KERN_T_F16) {
            uint16_t *y = (uint16_t *)dst + (size_t)r * dst_stride;
            for (int64_t i = 0; i < dim; i++)
                y[i] = wtype_f32_to_f16(x[i]);
        } else {
            memcpy((float *)dst + (size_t)r * dst_stride, x, (size_t)dim * sizeof *x);
        }
    }
}

void kern_ref_add(float *y, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] += x[i];
}

void kern_ref_add_rows(float *y, const float *b, int64_t n, int64_t cols)
{
    for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < cols; c++)
            y[r * cols + c] += b[c];
}

void kern_ref_axpy_rows(float *y, const float *a, const float *x, const uint32_t *idx,
                        int64_t n, int64_t cols)
{
    for (int64_t r = 0; r < n; r++) {
        float *yr = y + (idx ? (int64_t)idx[r] : r) * cols;
        for (int64_t c = 0; c < cols; c++)
            yr[c] += a[r] * x[r * cols + c];
    }
}

void kern_ref_sigmoid(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = sigmoidf(x[i]);
}

void kern_ref_mul_sigmoid(float *x, const float *g, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        x[i] *= sigmoidf(g[i]);
}

void kern_ref_l2norm(float *x, int64_t n, size_t stride, int nh, int d, float eps)
{
    for (int64_t t = 0; t < n; t++)
        for (int h = 0; h < nh; h++) {
            float *v = x + (size_t)t * stride + (size_t)h * d;
            double sum = 0;
            for (int i = 0; i < d; i++)
                sum += (double)(v[i] * v[i]);
            float scale = 1.0f / fmaxf(sqrtf((float)sum), eps);
            for (int i = 0; i < d; i++)
                v[i] *= scale;
        }
}

void kern_ref_rmsnorm_silu(float *out, const float *x, const float *w, const float *z,
                           int64_t n, int64_t cols, float eps)
{
    for (int64_t r = 0; r < n; r++) {
        /* in place is safe: kern_ref_rmsnorm reads every x before it writes out */
        kern_ref_rmsnorm(out + r * cols, x + r * cols, w, cols, eps);
        for (int64_t c = 0; c < cols; c++)
            out[r * cols + c] *= siluf(z[r * cols + c]);
    }
}

void kern_ref_conv_silu(float *out, const float *x, const float *w, int64_t n,
                        int64_t channels, int kernel)
{
    for (int64_t t = 0; t < n; t++)
        for (int64_t c = 0; c < channels; c++) {
            float sum = 0.0f;
            for (int j = 0; j < kernel; j++)
                sum += x[(t + j) * channels + c] * w[c * kernel + j];
            out[t * channels + c] = siluf(sum);
        }
}

void kern_ref_moe_route(uint32_t *sel, float *w, float *logits, int64_t n, int n_expert, int k)
{
    for (int64_t t = 0; t < n; t++) {
        float *p = logits + t * n_expert;
        uint32_t *s = sel + t * k;
        kern_ref_softmax(p, n_expert);
        double sum = 0;
        for (int j = 0; j < k; j++) {
            uint32_t best = UINT32_MAX;
            for (uint32_t x = 0; x < (uint32_t)n_expert; x++) {
                bool taken = false;
                for (int i = 0; i < j; i++)
                    taken |= s[i] == x;
                if (!taken && (best == UINT32_MAX || p[x] > p[best]))
                    best = x;
            }
            s[j] = best;
            sum += p[best];
        }
        for (int j = 0; j < k; j++)
            w[t * k + j] = p[s[j]] / (float)sum;
    }
}

void kern__deltanet_head(float *o, size_t o_stride, float *S, const float *q, const float *k,
                         const float *v, size_t stride, const float *beta, const float *alpha,
                         size_t g_stride, float dt_bias, float a, int64_t n, int d,
                         float *scratch)
{
    const float scale = 1.0f / sqrtf((float)d);
    float *kv = scratch, *delta = scratch + d;
    for (int64_t t = 0; t < n; t++) {
        const float *qt = q + (size_t)t * stride, *kt = k + (size_t)t * stride;
        const float *vt = v + (size_t)t * stride;
        float *ot = o + (size_t)t * o_stride;
        float b = sigmoidf(beta[(size_t)t * g_stride]);
        float decay = expf(softplusf(alpha[(size_t)t * g_stride] + dt_bias) * a);
        /* S <- exp(g) S; kv = S^T k */
        memset(kv, 0, (size_t)d * sizeof *kv);
        for (int i = 0; i < d; i++) {
            float *row = S + (size_t)i * d;
            for (int j = 0; j < d; j++)
                row[j] *= decay;
            for (int j = 0; j < d; j++)
                kv[j] += kt[i] * row[j];
        }
        for (int j = 0; j < d; j++)
            delta[j] = b * (vt[j] - kv[j]);
        /* S <- S + k delta^T; o = S^T q / sqrt(d) */
        memset(ot, 0, (size_t)d * sizeof *ot);
        for (int i = 0; i < d; i++) {
            float *row = S + (size_t)i * d;
            for (int j = 0; j < d; j++)
                row[j] += kt[i] * delta[j];
            for (int j = 0; j < d; j++)
                ot[j] += qt[i] * row[j];
        }
        for (int j = 0; j < d; j++)
            ot[j] *= scale;
    }
}

void kern_ref_deltanet(float *o, float *S, const float *q, const float *k, const float *v,
                       size_t stride, const float *beta, const float *alpha,
                       const float *dt_bias, const float *a, int64_t n, int n_k_head,
                       int n_v_head, int d, float *scratch)
{
    /* heads are independent: head by head gives the token-by-token results */
    for (int h = 0; h < n_v_head; h++) {
        size_t kh = (size_t)(h % n_k_head) * d;
        kern__deltanet_head(o + (size_t)h * d, (size_t)n_v_head * d, S + (size_t)h * d * d,
                            q + kh, k + kh, v + (size_t)h * d, stride, beta + h, alpha + h,
                            (size_t)n_v_head, dt_bias[h], a[h], n, d, scratch);
    }
}

/* Reference element-wise ops and attention, following ggml's CPU ops (sums in double where
 * ggml uses ggml_float, everything else in f32). */
#include "kernels/internal.h"

void kern_ref_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps)
{
    double sum = 0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)(x[i] * x[i]);
    float scale = 1.0f / sqrtf((float)(sum / n) + eps);
    for (int64_t i = 0; i < n; i++)
        out[i] = (x[i] * scale) * (w ? w[i] : 1.0f);
}

void kern_ref_rope(float *x, int n_head, int head_dim, int n_rot, int64_t pos,
                   float freq_base, float freq_scale, bool neox)
{
    /* theta_i = pos * freq_scale * base^(-2i/n_rot), the power built by repeated products
     * in f32 as ggml does, so angles match it to the last bit. The angles are the same for
     * every head: computed once (in chunks, without allocating). */
    float theta_scale = powf(freq_base, -2.0f / n_rot);
    enum { CHUNK = 64 };
    float cs[CHUNK], sn[CHUNK];
    float theta = (float)pos;
    for (int c0 = 0; c0 < n_rot / 2; c0 += CHUNK) {
        int cn = n_rot / 2 - c0 < CHUNK ? n_rot / 2 - c0 : CHUNK;
        for (int k = 0; k < cn; k++) {
            float t = freq_scale * theta;
            cs[k] = cosf(t);
            sn[k] = sinf(t);
            theta *= theta_scale;
        }
        for (int h = 0; h < n_head; h++) {
            float *v = x + (int64_t)h * head_dim;
            for (int k = 0; k < cn; k++) {
                int i = c0 + k;
                int a = neox ? i : 2 * i, b = neox ? i + n_rot / 2 : 2 * i + 1;
                float x0 = v[a], x1 = v[b];
                v[a] = x0 * cs[k] - x1 * sn[k];
                v[b] = x0 * sn[k] + x1 * cs[k];
            }
        }
    }
}

void kern_ref_softmax(float *x, int64_t n)
{
    float max = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        max = x[i] > max ? x[i] : max;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++)
        x[i] *= inv;
}

void kern_ref_silu(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = x[i] / (1.0f + expf(-x[i]));
}

void kern_ref_swiglu(float *out, const float *gate, const float *up, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

void kern_ref_attention(uint32_t kv_type, float *out, const float *q, const void *k,
                        const void *v, int64_t n, int64_t pos0, int n_head, int n_kv_head,
                        int head_dim, size_t kv_stride, float scale, float *scratch)
{
    /* For an F16 cache llama.cpp's matmuls round q to f16 for K.q and the softmax weights to
     * f16 for the V product; an F32 cache keeps everything f32. */
    assert(n_kv_head > 0 && n_head % n_kv_head == 0 && (kv_type == KERN_T_F16 || kv_type == KERN_T_F32));
    bool f16 = kv_type == KERN_T_F16;
    int group = n_head / n_kv_head;
    int64_t q_stride = (int64_t)n_head * head_dim;
    for (int64_t i = 0; i < n; i++) {
        int64_t n_ctx = pos0 + i + 1; /* causal: positions 0..pos0+i */
        for (int h = 0; h < n_head; h++) {
            const float *qh = q + i * q_stride + (int64_t)h * head_dim;
            int64_t koff = (int64_t)(h / group) * head_dim;
            for (int64_t p = 0; p < n_ctx; p++) {
                double s = 0;
                if (f16) {
                    const uint16_t *kr = (const uint16_t *)k + (size_t)p * kv_stride + koff;
                    for (int d = 0; d < head_dim; d++)
                        s += (double)(wtype_f16_to_f32(wtype_f32_to_f16(qh[d])) *
                                      wtype_f16_to_f32(kr[d]));
                } else {
                    const float *kr = (const float *)k + (size_t)p * kv_stride + koff;
                    for (int d = 0; d < head_dim; d++)
                        s += (double)(qh[d] * kr[d]);
                }
                scratch[p] = (float)s * scale;
            }
            kern_ref_softmax(scratch, n_ctx);
            float *o = out + i * q_stride + (int64_t)h * head_dim;
            for (int d = 0; d < head_dim; d++) {
                double s = 0;
                for (int64_t p = 0; p < n_ctx; p++) {
                    if (f16) {
                        const uint16_t *vr = (const uint16_t *)v + (size_t)p * kv_stride + koff;
                        s += (double)(wtype_f16_to_f32(wtype_f32_to_f16(scratch[p])) *
                                      wtype_f16_to_f32(vr[d]));
                    } else {
                        const float *vr = (const float *)v + (size_t)p * kv_stride + koff;
                        s += (double)(scratch[p] * vr[d]);
                    }
                }
                o[d] = (float)s;
            }
        }
    }
}

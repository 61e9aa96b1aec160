/* kern.cl — the "opencl" device's kernels (OpenCL C 1.2), embedded in the binary at build time
 * (the Makefile turns this file into a C array). Every kernel follows its kern_ref_* contract
 * (kernels/ref): f32 arithmetic and accumulation, weights dequantised inside the dot.
 *
 * Operands arrive as a buffer and a byte offset (the seam's (buffer, offset) operands, without
 * sub-buffers and their alignment rules). Build-time parameters (docs/opencl.md):
 *   KV_WG          work-group size of the reducing kernels (32, 64, 128, 256; KV_CL_WG)
 *   KV_SUBGROUPS   reduce through cl_khr_subgroups instead of local memory (KV_CL_SUBGROUPS)
 *   KV_FP16        half arithmetic where exact, with cl_khr_fp16 (KV_CL_FP16)
 * The last two never ran on a device here (PoCL has neither): clang-14 checks their syntax.
 */
#ifndef KV_WG
#define KV_WG 64
#endif
#define KV_NC 4        /* activation rows one matmul work-group takes */
#define KV_MAXD 512    /* the largest attention head the kernels hold */

#ifdef KV_SUBGROUPS
#pragma OPENCL EXTENSION cl_khr_subgroups : enable
#endif
#ifdef KV_FP16
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
#endif

/* Weight types: enum kern_type's numbers (ggml's). */
#define T_F32 0
#define T_F16 1
#define T_Q4_0 2
#define T_Q4_1 3
#define T_Q5_0 6
#define T_Q5_1 7
#define T_Q8_0 8
#define T_Q4_K 12
#define T_Q5_K 13
#define T_Q6_K 14
#define T_BF16 30

#define GF(base, off) ((__global float *)((base) + (off)))
#define CGF(base, off) ((__global const float *)((base) + (off)))

/* ---- the portability layer: work-group reductions ----
 * With subgroups (and a work-group of one subgroup) the reduce is the native one; without,
 * a tree in local memory. Every work-item of the group calls it; all get the result. */
#ifdef KV_SUBGROUPS
#define KV_REDUCE_DECL
static float wg_sum(float v, __local float *tmp)
{
    float s = sub_group_reduce_add(v);
    if (get_num_sub_groups() == 1)
        return s;
    if (get_sub_group_local_id() == 0)
        tmp[get_sub_group_id()] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    float t = 0.0f;
    for (uint i = 0; i < get_num_sub_groups(); i++)
        t += tmp[i];
    barrier(CLK_LOCAL_MEM_FENCE);
    return t;
}
static float wg_max(float v, __local float *tmp)
{
    float s = sub_group_reduce_max(v);
    if (get_num_sub_groups() == 1)
        return s;
    if (get_sub_group_local_id() == 0)
        tmp[get_sub_group_id()] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    float t = -INFINITY;
    for (uint i = 0; i < get_num_sub_groups(); i++)
        t = fmax(t, tmp[i]);
    barrier(CLK_LOCAL_MEM_FENCE);
    return t;
}
#else
static float wg_sum(float v, __local float *tmp)
{
    uint l = get_local_id(0), n = get_local_size(0);
    tmp[l] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint s = n / 2; s > 0; s >>= 1) {
        if (l < s)
            tmp[l] += tmp[l + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float r = tmp[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}
static float wg_max(float v, __local float *tmp)
{
    uint l = get_local_id(0), n = get_local_size(0);
    tmp[l] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint s = n / 2; s > 0; s >>= 1) {
        if (l < s)
            tmp[l] = fmax(tmp[l], tmp[l + s]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float r = tmp[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}
#endif

/* ---- dequantisation: one unit of 32 elements of a row ---- */

static float h2f(__global const uchar *p) { return vload_half(0, (__global const half *)p); }

static float bf2f(__global const uchar *p)
{
    uint b = (uint)p[0] | (uint)p[1] << 8;
    return as_float(b << 16);
}

/* Bytes per block and elements per block of a weight type. */
static uint blk_bytes(int t)
{
    switch (t) {
    case T_F32: return 4;
    case T_F16: case T_BF16: return 2;
    case T_Q4_0: return 18;
    case T_Q4_1: return 20;
    case T_Q5_0: return 22;
    case T_Q5_1: return 24;
    case T_Q8_0: return 34;
    case T_Q4_K: return 144;
    case T_Q5_K: return 176;
    default: return 210; /* T_Q6_K */
    }
}
static uint blk_elems(int t)
{
    return t == T_F32 || t == T_F16 || t == T_BF16 ? 1 : t >= T_Q4_K && t <= T_Q6_K ? 256 : 32;
}

static void scale_min_k4(int j, __global const uchar *q, float *d, float *m)
{
    if (j < 4) {
        *d = (float)(q[j] & 63);
        *m = (float)(q[j + 4] & 63);
    } else {
        *d = (float)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (float)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* Elements u*32 .. u*32+31 of the row at w (of `cols` elements; a float type's last unit may be
 * short: its missing elements are 0) into o. */
static void dq_unit(int t, __global const uchar *w, uint u, uint cols, float *o)
{
    if (t == T_F32 || t == T_F16 || t == T_BF16) {
        uint e0 = u * 32;
        for (int j = 0; j < 32; j++) {
            uint e = e0 + j;
            o[j] = e >= cols ? 0.0f
                 : t == T_F32 ? ((__global const float *)w)[e]
                 : t == T_F16 ? vload_half(e, (__global const half *)w) : bf2f(w + 2 * e);
        }
        return;
    }
    if (t == T_Q4_0 || t == T_Q4_1 || t == T_Q5_0 || t == T_Q5_1 || t == T_Q8_0) {
        __global const uchar *b = w + (size_t)u * blk_bytes(t);
        float d = h2f(b);
        if (t == T_Q8_0) {
            __global const char *qs = (__global const char *)(b + 2);
            for (int j = 0; j < 32; j++)
                o[j] = d * (float)qs[j];
            return;
        }
        float m = t == T_Q4_1 || t == T_Q5_1 ? h2f(b + 2) : 0.0f;
        __global const uchar *qs = b + (t == T_Q4_0 ? 2 : t == T_Q4_1 ? 4 : t == T_Q5_0 ? 6 : 8);
        uint qh = 0;
        if (t == T_Q5_0 || t == T_Q5_1) {
            __global const uchar *h = b + (t == T_Q5_0 ? 2 : 4);
            qh = (uint)h[0] | (uint)h[1] << 8 | (uint)h[2] << 16 | (uint)h[3] << 24;
        }
        for (int j = 0; j < 16; j++) {
            int lo = qs[j] & 0xF, hi = qs[j] >> 4;
            if (t == T_Q5_0 || t == T_Q5_1) {
                lo |= (int)((qh >> j) & 1) << 4;
                hi |= (int)((qh >> (j + 16)) & 1) << 4;
            }
            if (t == T_Q4_0) {
                lo -= 8, hi -= 8;
            } else if (t == T_Q5_0) {
                lo -= 16, hi -= 16;
            }
            o[j] = d * (float)lo + m;
            o[j + 16] = d * (float)hi + m;
        }
        return;
    }
    __global const uchar *b = w + (size_t)(u / 8) * blk_bytes(t);
    int j = u % 8;
    if (t == T_Q6_K) {
        __global const uchar *ql = b, *qh = b + 128;
        __global const char *sc = (__global const char *)(b + 192);
        float d = h2f(b + 208);
        int h = j / 4, k = j % 4;
        ql += 64 * h + (k & 1) * 32;
        qh += 32 * h;
        sc += 8 * h;
        for (int l = 0; l < 32; l++) {
            int q = ((k < 2 ? ql[l] & 0xF : ql[l] >> 4) | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
            o[l] = d * (float)sc[l / 16 + 2 * k] * (float)q;
        }
        return;
    }
    /* Q4_K, Q5_K: d, dmin, scales[12], (Q5_K: qh[32]), qs[128] */
    float d = h2f(b), dmin = h2f(b + 2), sc, mn;
    scale_min_k4(j, b + 4, &sc, &mn);
    float d1 = d * sc, m1 = dmin * mn;
    __global const uchar *qs = b + (t == T_Q4_K ? 16 : 48) + 32 * (j / 2);
    __global const uchar *qh = b + 16;
    for (int l = 0; l < 32; l++) {
        int q = j & 1 ? qs[l] >> 4 : qs[l] & 0xF;
        if (t == T_Q5_K)
            q += (qh[l] >> j) & 1 ? 16 : 0;
        o[l] = d1 * (float)q - m1;
    }
}

/* ---- matmul: y[i*ys + r0 + r] = dot(w row r, x row i) ----
 * One work-group per weight row and KV_NC activation rows; its work-items take the row's
 * 32-element units in turn, dequantise each once and dot it with every activation row. */
__kernel void matmul(int t, __global const uchar *W, ulong woff, ulong wrow, uint cols,
                     __global const uchar *X, ulong xoff, uint n, __global uchar *Y, ulong yoff,
                     uint ys, uint r0)
{
    __local float tmp[KV_WG];
    uint r = get_group_id(0), c0 = get_group_id(1) * KV_NC, l = get_local_id(0);
    __global const uchar *w = W + woff + (size_t)r * wrow;
    __global const float *x = CGF(X, xoff);
    uint units = (cols + 31) / 32;
    float acc[KV_NC] = {0.0f};
    float o[32];
    for (uint u = l; u < units; u += get_local_size(0)) {
        dq_unit(t, w, u, cols, o);
        uint e0 = u * 32, ne = min(32u, cols - e0);
        for (int c = 0; c < KV_NC; c++) {
            if (c0 + c >= n)
                break;
            __global const float *xr = x + (size_t)(c0 + c) * cols + e0;
            float s = 0.0f;
            for (uint j = 0; j < ne; j++)
                s += o[j] * xr[j];
            acc[c] += s;
        }
    }
    __global float *y = GF(Y, yoff);
    for (int c = 0; c < KV_NC; c++) {
        float s = wg_sum(acc[c], tmp);
        if (l == 0 && c0 + c < n)
            y[(size_t)(c0 + c) * ys + r0 + r] = s;
    }
}

/* get_rows: out row i = dequantised table row ids[i], for the rows lying in [lo, hi) of this
 * piece of the table (a weight split over several allocations: docs/opencl.md, "Caps") and,
 * when seam > 0, crossing byte seam. */
__kernel void get_rows(int t, __global const uchar *T, ulong toff, ulong lo, ulong hi, ulong seam,
                       ulong rb, uint rows, uint cols, __global const uchar *I, ulong ioff,
                       __global uchar *O, ulong ooff)
{
    uint i = get_global_id(1), u = get_global_id(0), units = (cols + 31) / 32;
    if (u >= units)
        return;
    int id = ((__global const int *)(I + ioff))[i];
    if (id < 0 || (uint)id >= rows)
        return;
    ulong s = toff + (ulong)id * rb, e = s + rb;
    if (s < lo || e > hi || (seam && !(s < seam && e > seam)))
        return;
    float o[32];
    dq_unit(t, T + (s - lo), u, cols, o);
    __global float *y = GF(O, ooff) + (size_t)i * cols + u * 32;
    uint ne = min(32u, cols - u * 32);
    for (uint j = 0; j < ne; j++)
        y[j] = o[j];
}

/* ---- dequantised weight tiles for the prompt GEMMs (docs/opencl.md, "Prompt GEMMs") ----
 * nrows rows of the weight (row r at W + woff + r * wrow) into an f32 tile O, row r at
 * r * cols floats: one work-item per (32-element unit, row), the matmul's dequantiser. */
__kernel void dequant_rows(int t, __global const uchar *W, ulong woff, ulong wrow, uint cols,
                           uint nrows, __global float *O)
{
    uint u = get_global_id(0), r = get_global_id(1), units = (cols + 31) / 32;
    if (u >= units || r >= nrows)
        return;
    float o[32];
    dq_unit(t, W + woff + (size_t)r * wrow, u, cols, o);
    __global float *y = O + (size_t)r * cols + u * 32;
    uint ne = min(32u, cols - u * 32);
    for (uint j = 0; j < ne; j++)
        y[j] = o[j];
}

/* ---- norms ---- */

/* out row = x row * 1/sqrt(mean(x^2) + eps) * w (w optional), then, with z, * silu(z row). */
__kernel void rmsnorm(__global uchar *O, ulong ooff, __global const uchar *X, ulong xoff,
                      __global const uchar *Wt, ulong woff, int has_w, __global const uchar *Z,
                      ulong zoff, int has_z, uint cols, float eps)
{
    __local float tmp[KV_WG];
    uint r = get_group_id(0), l = get_local_id(0);
    __global const float *x = CGF(X, xoff) + (size_t)r * cols;
    __global float *o = GF(O, ooff) + (size_t)r * cols;
    float s = 0.0f;
    for (uint i = l; i < cols; i += get_local_size(0))
        s += x[i] * x[i];
    s = wg_sum(s, tmp);
    float scale = 1.0f / sqrt(s / (float)cols + eps);
    for (uint i = l; i < cols; i += get_local_size(0)) {
        float v = x[i] * scale * (has_w ? CGF(Wt, woff)[i] : 1.0f);
        if (has_z) {
            float z = CGF(Z, zoff)[(size_t)r * cols + i];
            v *= z / (1.0f + exp(-z));
        }
        o[i] = v;
    }
}

/* x[t*stride + h*d ..] scaled to unit length (floor eps), one work-group per (t, h). */
__kernel void l2norm(__global uchar *X, ulong xoff, ulong stride, uint nh, uint d, float eps)
{
    __local float tmp[KV_WG];
    uint g = get_group_id(0), l = get_local_id(0);
    __global float *v = GF(X, xoff) + (size_t)(g / nh) * stride + (size_t)(g % nh) * d;
    float s = 0.0f;
    for (uint i = l; i < d; i += get_local_size(0))
        s += v[i] * v[i];
    s = wg_sum(s, tmp);
    float scale = 1.0f / fmax(sqrt(s), eps);
    for (uint i = l; i < d; i += get_local_size(0))
        v[i] *= scale;
}

/* ---- RoPE ---- */

/* cs/sn[r*half + i] for position pos0 + r: theta built by repeated products in f32 as
 * kern_ref_rope_angles does, so the angles match it. */
__kernel void rope_angles(__global uchar *C, ulong coff, __global uchar *S, ulong soff,
                          uint half_, ulong pos0, float theta_scale, float freq_scale,
                          __global const uchar *F, ulong foff, int has_f)
{
    uint i = get_global_id(0), r = get_global_id(1);
    if (i >= half_)
        return;
    float theta = (float)(pos0 + r);
    for (uint k = 0; k < i; k++)
        theta *= theta_scale;
    float t = freq_scale * (has_f ? theta / CGF(F, foff)[i] : theta);
    GF(C, coff)[(size_t)r * half_ + i] = cos(t);
    GF(S, soff)[(size_t)r * half_ + i] = sin(t);
}

__kernel void rope_rows(__global uchar *X, ulong xoff, ulong stride, uint n_head, uint hd,
                        uint half_, __global const uchar *C, ulong coff, __global const uchar *S,
                        ulong soff, int neox)
{
    uint i = get_global_id(0), h = get_global_id(1), r = get_global_id(2);
    if (i >= half_)
        return;
    __global float *v = GF(X, xoff) + (size_t)r * stride + (size_t)h * hd;
    float c = CGF(C, coff)[(size_t)r * half_ + i], s = CGF(S, soff)[(size_t)r * half_ + i];
    uint a = neox ? i : 2 * i, b = neox ? i + half_ : 2 * i + 1;
    float x0 = v[a], x1 = v[b];
    v[a] = x0 * c - x1 * s;
    v[b] = x0 * s + x1 * c;
}

/* ---- KV cache and attention ---- */

__kernel void kv_store(int f16, __global uchar *D, ulong doff, ulong dstride,
                       __global const uchar *Sr, ulong soff, uint dim)
{
    uint i = get_global_id(0), r = get_global_id(1);
    if (i >= dim)
        return;
    float v = CGF(Sr, soff)[(size_t)r * dim + i];
    if (f16)
        vstore_half_rte(v, (size_t)r * dstride + i, (__global half *)(D + doff));
    else
        GF(D, doff)[(size_t)r * dstride + i] = v;
}

/* v rounded to the nearest f16 (ties to even) and back: storage only, no half arithmetic. */
static float round_f16(float v)
{
    ushort h;
    vstore_half_rte(v, 0, (__private half *)&h);
    return vload_half(0, (__private const half *)&h);
}

static float kv_at(int f16, __global const uchar *B, size_t e)
{
    return f16 ? vload_half(e, (__global const half *)B) : ((__global const float *)B)[e];
}

/* One work-group per (token i, head h): a single pass over positions 0..pos0+i with a running
 * maximum (the softmax rescaled as it goes), each work-item holding head elements l, l+WG, ...
 * of the output. An F16 cache rounds q and the weights to f16 as llama.cpp's matmuls do. */
__kernel void attention(int f16, __global uchar *O, ulong ooff, __global const uchar *Q,
                        ulong qoff, __global const uchar *K, ulong koff, __global const uchar *V,
                        ulong voff, ulong pos0, uint n_head, uint group, uint hd, ulong kvs,
                        float scale)
{
    __local float tmp[KV_WG];
    __local float sc[KV_WG];
    __local float qh[KV_MAXD];
    uint g = get_group_id(0), l = get_local_id(0), wg = get_local_size(0);
    uint i = g / n_head, h = g % n_head;
    size_t qd = (size_t)n_head * hd, kvo = (size_t)(h / group) * hd;
    __global const float *q = CGF(Q, qoff) + i * qd + (size_t)h * hd;
    for (uint d = l; d < hd; d += wg) {
        qh[d] = f16 ? round_f16(q[d]) : q[d];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    __global const uchar *Kb = K + koff, *Vb = V + voff;
    float acc[KV_MAXD / 32];
    for (int k = 0; k < KV_MAXD / 32; k++)
        acc[k] = 0.0f;
    float m = -INFINITY, sum = 0.0f;
    ulong n_ctx = pos0 + i + 1;
    for (ulong p0 = 0; p0 < n_ctx; p0 += wg) {
        ulong p = p0 + l;
        float s = -INFINITY;
        if (p < n_ctx) {
            float dot = 0.0f;
            for (uint d = 0; d < hd; d++)
                dot += qh[d] * kv_at(f16, Kb, p * kvs + kvo + d);
            s = dot * scale;
        }
        float mc = wg_max(s, tmp), mn = fmax(m, mc);
        float e = p < n_ctx ? exp(s - mn) : 0.0f;
        float f = exp(m - mn);
        sum = sum * f + wg_sum(e, tmp);
        sc[l] = f16 ? round_f16(e) : e;
        barrier(CLK_LOCAL_MEM_FENCE);
        uint np = (uint)min((ulong)wg, n_ctx - p0);
        for (uint d = l, k = 0; d < hd; d += wg, k++) {
            float a = acc[k] * f;
            for (uint j = 0; j < np; j++)
                a += sc[j] * kv_at(f16, Vb, (p0 + j) * kvs + kvo + d);
            acc[k] = a;
        }
        m = mn;
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    __global float *o = GF(O, ooff) + i * qd + (size_t)h * hd;
    for (uint d = l, k = 0; d < hd; d += wg, k++)
        o[d] = acc[k] / sum;
}

/* ---- element-wise ---- */

__kernel void swiglu(__global uchar *O, ulong ooff, __global const uchar *G, ulong goff,
                     __global const uchar *U, ulong uoff, ulong n)
{
    size_t i = get_global_id(0);
    if (i >= n)
        return;
    float g = CGF(G, goff)[i];
    GF(O, ooff)[i] = g / (1.0f + exp(-g)) * CGF(U, uoff)[i];
}

/* y[i] += x[i % cols] (add: cols = n) */
__kernel void add(__global uchar *Y, ulong yoff, __global const uchar *X, ulong xoff, ulong n,
                  ulong cols)
{
    size_t i = get_global_id(0);
    if (i >= n)
        return;
    GF(Y, yoff)[i] += CGF(X, xoff)[i % cols];
}

/* y row idx[r] (or r) += a[r] * x row r, one work-item per column, rows in order. */
__kernel void axpy_rows(__global uchar *Y, ulong yoff, uint y_rows, __global const uchar *A,
                        ulong aoff, __global const uchar *X, ulong xoff, __global const uchar *I,
                        ulong ioff, int has_i, uint n, uint cols)
{
    uint c = get_global_id(0);
    if (c >= cols)
        return;
    __global float *y = GF(Y, yoff);
    __global const float *a = CGF(A, aoff), *x = CGF(X, xoff);
    for (uint r = 0; r < n; r++) {
        uint t = has_i ? ((__global const uint *)(I + ioff))[r] : r;
        if (t < y_rows)
            y[(size_t)t * cols + c] += a[r] * x[(size_t)r * cols + c];
    }
}

/* x = sigmoid(x) (has_g 0) or x *= sigmoid(g) */
__kernel void sigmoid(__global uchar *X, ulong xoff, __global const uchar *G, ulong goff,
                      int has_g, ulong n)
{
    size_t i = get_global_id(0);
    if (i >= n)
        return;
    __global float *x = GF(X, xoff);
    if (has_g)
        x[i] *= 1.0f / (1.0f + exp(-CGF(G, goff)[i]));
    else
        x[i] = 1.0f / (1.0f + exp(-x[i]));
}

__kernel void conv_silu(__global uchar *O, ulong ooff, __global const uchar *X, ulong xoff,
                        __global const uchar *Wt, ulong woff, uint ch, int kernel_)
{
    uint c = get_global_id(0), t = get_global_id(1);
    if (c >= ch)
        return;
    __global const float *x = CGF(X, xoff), *w = CGF(Wt, woff);
    float s = 0.0f;
    for (int j = 0; j < kernel_; j++)
        s += x[(size_t)(t + j) * ch + c] * w[(size_t)c * kernel_ + j];
    GF(O, ooff)[(size_t)t * ch + c] = s / (1.0f + exp(-s));
}

/* One work-item per token: softmax of the router logits (in place), the k largest in order
 * (ties to the lower expert), their weights renormalised. */
__kernel void moe_route(__global uchar *Sel, ulong seloff, __global uchar *Wo, ulong woff,
                        __global uchar *L, ulong loff, uint n, uint ne, uint k)
{
    uint t = get_global_id(0);
    if (t >= n)
        return;
    __global float *p = GF(L, loff) + (size_t)t * ne;
    __global uint *s = (__global uint *)(Sel + seloff) + (size_t)t * k;
    float mx = -INFINITY;
    for (uint x = 0; x < ne; x++)
        mx = fmax(mx, p[x]);
    float sum = 0.0f;
    for (uint x = 0; x < ne; x++) {
        p[x] = exp(p[x] - mx);
        sum += p[x];
    }
    float inv = 1.0f / sum;
    for (uint x = 0; x < ne; x++)
        p[x] *= inv;
    float tot = 0.0f;
    for (uint j = 0; j < k; j++) {
        uint best = 0xffffffffu;
        for (uint x = 0; x < ne; x++) {
            bool taken = false;
            for (uint i = 0; i < j; i++)
                taken |= s[i] == x;
            if (!taken && (best == 0xffffffffu || p[x] > p[best]))
                best = x;
        }
        s[j] = best;
        tot += p[best];
    }
    for (uint j = 0; j < k; j++)
        GF(Wo, woff)[(size_t)t * k + j] = p[s[j]] / tot;
}

/* Gated DeltaNet, one work-item per (value head h, state column j): every step of the
 * recurrence touches column j of S only through column j's own values, so the work-items
 * need no synchronisation; tokens in order. */
__kernel void deltanet(__global uchar *O, ulong ooff, __global uchar *Sb, ulong soff,
                       __global const uchar *Q, ulong qoff, __global const uchar *K, ulong koff,
                       __global const uchar *V, ulong voff, ulong stride,
                       __global const uchar *B, ulong boff, __global const uchar *A, ulong aoff,
                       __global const uchar *DT, ulong dtoff, __global const uchar *AA,
                       ulong aaoff, uint n, uint nkh, uint nvh, uint d)
{
    uint g = get_global_id(0);
    if (g >= nvh * d)
        return;
    uint h = g / d, j = g % d;
    size_t kh = (size_t)(h % nkh) * d;
    __global float *S = GF(Sb, soff) + (size_t)h * d * d;
    float dt = CGF(DT, dtoff)[h], a = CGF(AA, aaoff)[h], scale = 1.0f / sqrt((float)d);
    for (uint t = 0; t < n; t++) {
        __global const float *q = CGF(Q, qoff) + (size_t)t * stride + kh;
        __global const float *k = CGF(K, koff) + (size_t)t * stride + kh;
        float v = CGF(V, voff)[(size_t)t * stride + (size_t)h * d + j];
        float bt = CGF(B, boff)[(size_t)t * nvh + h], al = CGF(A, aoff)[(size_t)t * nvh + h];
        float b = 1.0f / (1.0f + exp(-bt));
        float sp = al + dt;
        sp = sp > 20.0f ? sp : log(1.0f + exp(sp));
        float decay = exp(sp * a);
        float kv = 0.0f;
        for (uint i = 0; i < d; i++) {
            float sv = S[(size_t)i * d + j] * decay;
            S[(size_t)i * d + j] = sv;
            kv += k[i] * sv;
        }
        float delta = b * (v - kv), o = 0.0f;
        for (uint i = 0; i < d; i++) {
            float sv = S[(size_t)i * d + j] + k[i] * delta;
            S[(size_t)i * d + j] = sv;
            o += q[i] * sv;
        }
        GF(O, ooff)[(size_t)t * nvh * d + (size_t)h * d + j] = o * scale;
    }
}

/* ---- data movement ---- */

/* dst row i = src row idx[i] (or i), row_bytes each; one work-item per (byte or word, row). */
__kernel void copy_rows(__global uchar *D, ulong doff, ulong dstride, __global const uchar *Sr,
                        ulong soff, ulong sstride, uint src_rows, __global const uchar *I,
                        ulong ioff, int has_i, ulong row_bytes, int words)
{
    size_t b = get_global_id(0), i = get_global_id(1);
    ulong unit = words ? 4 : 1;
    if (b * unit >= row_bytes)
        return;
    uint r = has_i ? ((__global const uint *)(I + ioff))[i] : (uint)i;
    if (has_i && r >= src_rows)
        return;
    __global uchar *d = D + doff + i * dstride;
    __global const uchar *s = Sr + soff + (size_t)r * sstride;
    if (words)
        ((__global uint *)d)[b] = ((__global const uint *)s)[b];
    else
        d[b] = s[b];
}

/* ---- the Adreno-minded layout of Q4_0 and Q8_0 (docs/opencl.md, "Layouts") ----
 * A matrix of R rows of nb blocks is split into its scales, d[b*R + r] (f16 bits), and its
 * quants, q[(b*R + r) * QB] — both transposed, block-major, so that work-items on adjacent
 * rows read adjacent memory — and the quants are read through an image1d_buffer_t of RGBA
 * uint32 texels (one Q4_0 block's quants a texel, a Q8_0 block's two), which puts them
 * through the texture cache. repack builds it on the device from the file's blocks. */
__kernel void repack_q(int t, __global const uchar *W, ulong woff, uint R, uint nb,
                       __global ushort *D, __global uchar *Q)
{
    uint r = get_global_id(0), b = get_global_id(1);
    if (r >= R)
        return;
    uint bb = t == T_Q4_0 ? 18 : 34, qb = bb - 2;
    __global const uchar *blk = W + woff + ((size_t)r * nb + b) * bb;
    size_t i = (size_t)b * R + r;
    D[i] = (ushort)((uint)blk[0] | (uint)blk[1] << 8);
    for (uint j = 0; j < qb; j++)
        Q[i * qb + j] = blk[2 + j];
}

/* The 32 weights of block i (transposed index) of the split layout. */
static void dq_split(int t, __global const ushort *D, read_only image1d_buffer_t Qi, size_t i,
                     float *w)
{
    float d = vload_half(i, (__global const half *)D);
    if (t == T_Q4_0) {
        uint4 q = read_imageui(Qi, (int)i);
        uint qa[4] = {q.x, q.y, q.z, q.w};
        for (int j = 0; j < 16; j++) {
            uint byte = (qa[j / 4] >> (8 * (j % 4))) & 0xFF;
#ifdef KV_FP16
            /* half arithmetic where the device has it: exact here (|q| <= 8 times an f16) */
            w[j] = (float)((half)((int)(byte & 0xF) - 8) * (half)d);
            w[j + 16] = (float)((half)((int)(byte >> 4) - 8) * (half)d);
#else
            w[j] = (float)((int)(byte & 0xF) - 8) * d;
            w[j + 16] = (float)((int)(byte >> 4) - 8) * d;
#endif
        }
    } else {
        uint4 q0 = read_imageui(Qi, (int)(2 * i)), q1 = read_imageui(Qi, (int)(2 * i + 1));
        uint qa[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
        for (int j = 0; j < 32; j++)
            w[j] = (float)(char)((qa[j / 4] >> (8 * (j % 4))) & 0xFF) * d;
    }
}

/* y[i*ys + r0 + r] = dot(source row sr0 + r, x row i): one work-item per row and KV_NC
 * activation rows, blocks in order. */
__kernel void matmul_split(int t, __global const ushort *D, read_only image1d_buffer_t Qi,
                           uint R, uint nb, uint sr0, uint nrows, uint cols,
                           __global const uchar *X, ulong xoff, uint n, __global uchar *Y,
                           ulong yoff, uint ys, uint r0)
{
    uint r = get_global_id(0), c0 = get_global_id(1) * KV_NC;
    if (r >= nrows)
        return;
    __global const float *x = CGF(X, xoff);
    float acc[KV_NC] = {0.0f};
    float w[32];
    for (uint b = 0; b < nb; b++) {
        dq_split(t, D, Qi, (size_t)b * R + sr0 + r, w);
        for (int c = 0; c < KV_NC; c++) {
            if (c0 + c >= n)
                break;
            __global const float *xr = x + (size_t)(c0 + c) * cols + b * 32;
            float s = 0.0f;
            for (int j = 0; j < 32; j++)
                s += w[j] * xr[j];
            acc[c] += s;
        }
    }
    __global float *y = GF(Y, yoff);
    for (int c = 0; c < KV_NC; c++)
        if (c0 + c < n)
            y[(size_t)(c0 + c) * ys + r0 + r] = acc[c];
}

/* get_rows on the split layout: out row i = row ids[i] (ids below R; others skipped). */
__kernel void get_rows_split(int t, __global const ushort *D, read_only image1d_buffer_t Qi,
                             uint R, uint nb, __global const uchar *I, ulong ioff,
                             __global uchar *O, ulong ooff)
{
    uint u = get_global_id(0), i = get_global_id(1);
    if (u >= nb)
        return;
    int id = ((__global const int *)(I + ioff))[i];
    if (id < 0 || (uint)id >= R)
        return;
    float w[32];
    dq_split(t, D, Qi, (size_t)u * R + id, w);
    __global float *y = GF(O, ooff) + (size_t)i * nb * 32 + u * 32;
    for (int j = 0; j < 32; j++)
        y[j] = w[j];
}

/* dequant_rows on the split layout: tile row r = source row sr0 + r (nrows rows). */
__kernel void dequant_split(int t, __global const ushort *D, read_only image1d_buffer_t Qi,
                            uint R, uint nb, uint sr0, uint nrows, __global float *O)
{
    uint u = get_global_id(0), r = get_global_id(1);
    if (u >= nb || r >= nrows)
        return;
    float w[32];
    dq_split(t, D, Qi, (size_t)u * R + sr0 + r, w);
    __global float *y = O + (size_t)r * nb * 32 + u * 32;
    for (int j = 0; j < 32; j++)
        y[j] = w[j];
}

/* ---- the device's read bandwidth (kern_cl_bench_bandwidth) ----
 * Each work-item sums a strided sweep of uint4s; the sums land in out so nothing is elided. */
__kernel void bw_read(__global const uint4 *src, ulong n, __global uint *out)
{
    size_t g = get_global_id(0), s = get_global_size(0);
    uint4 acc = (uint4)(0);
    for (size_t i = g; i < n; i += s)
        acc ^= src[i];
    out[g] = acc.x ^ acc.y ^ acc.z ^ acc.w;
}

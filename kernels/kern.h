/* kern — tensor math on raw pointers: the scalar oracle (kern_ref_*) and the fast CPU path
 * (kern_*: SIMD chosen at run time, a shared thread pool, OpenBLAS for batched prefill); and
 * over them the device seam (kern_dev_*, kern_buf_*: buffers and ops on (buffer, offset)
 * operands) that the executor uses, with "cpu" and "ref" devices (docs/devices.md).
 *
 * Weights are row-major: a matrix of `rows` rows of `cols` elements of a ggml type, each row
 * kern_row_bytes(type, cols) bytes, rows contiguous. Activations are f32, row-major, n rows.
 * Matmul semantics follow ggml's CPU path: for quantised weights the activations are first
 * quantised per block (Q8_0 for Q4_0, Q5_0 and Q8_0; Q8_1 for Q4_1 and Q5_1; Q8_K for the K
 * types), for F16/BF16 weights they are rounded to F16/BF16, then integer / rounded dot
 * products are accumulated in f32.
 * The fast versions have the same signatures and are tested against kern_ref_* by normalised
 * MSE. This module includes neither GGUF nor network headers; the type numbers are ggml's
 * (the same as enum gguf_ttype).
 */
#ifndef KV_KERN_H
#define KV_KERN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum kern_type {
    KERN_T_F32 = 0, KERN_T_F16 = 1, KERN_T_Q4_0 = 2, KERN_T_Q4_1 = 3,
    KERN_T_Q5_0 = 6, KERN_T_Q5_1 = 7, KERN_T_Q8_0 = 8, KERN_T_Q8_1 = 9,
    KERN_T_Q2_K = 10, KERN_T_Q3_K = 11, KERN_T_Q4_K = 12, KERN_T_Q5_K = 13,
    KERN_T_Q6_K = 14, KERN_T_Q8_K = 15, KERN_T_BF16 = 30,
    KERN_T_COUNT = 40
};

/* ggml's name of a type ("q4_K"), NULL for a type the kernels do not know. */
const char *kern_type_name(uint32_t type);
/* true when the kernels can compute with weights of this type. */
bool kern_type_supported(uint32_t type);
/* true when a weight type's matmul gives each row the result it has alone, whatever the
 * number of rows up to KERN_ROWS_EXACT_MAX: today every weight type, at every SIMD level
 * (docs/model.md). Beyond that a device may hand a matmul to a BLAS whose sums differ ("cpu":
 * F32 to OpenBLAS; "opencl": every type to CLBlast past its GEMM threshold): how many rows
 * one device keeps it to is kern_dev_rows_exact. */
#define KERN_ROWS_EXACT_MAX 15
bool kern_type_rows_exact(uint32_t type);
/* Elements per block and bytes per block (0 for an unknown type). */
uint32_t kern_block_elems(uint32_t type);
uint32_t kern_block_bytes(uint32_t type);
/* Bytes of one row of cols elements (cols a multiple of the block size), 0 if invalid. */
size_t kern_row_bytes(uint32_t type, int64_t cols);

/* ---- scalar reference (the oracle) ---- */
/* Dequantise n elements (a multiple of the block size) of type from src into dst. */
int kern_ref_dequant_row(uint32_t type, const void *src, float *dst, int64_t n);
/* Quantise n f32 elements into type (ggml's reference rounding). */
int kern_ref_quant_row(uint32_t type, const float *src, void *dst, int64_t n);
/* y[i][r] = dot(W[r], x[i]) for i < n, r < rows; x is n x cols, y is n x rows. */
int kern_ref_matmul(uint32_t type, const void *w, int64_t rows, int64_t cols,
                    const float *x, int64_t n, float *y);

void kern_ref_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps);
/* RoPE in place on n_head heads of head_dim at position pos: neox selects the NeoX layout
 * (pairs i, i+n_rot/2) instead of adjacent pairs; n_rot dims rotated (<= head_dim). */
void kern_ref_rope(float *x, int n_head, int head_dim, int n_rot, int64_t pos,
                   float freq_base, float freq_scale, bool neox);
void kern_ref_softmax(float *x, int64_t n);
void kern_ref_silu(float *x, int64_t n);
/* out[i] = silu(gate[i]) * up[i] */
void kern_ref_swiglu(float *out, const float *gate, const float *up, int64_t n);
/* Causal grouped-query attention for n query rows at positions pos0..pos0+n-1 over a cache
 * holding positions 0..pos0+n-1. q, out: n x (n_head*head_dim) f32. k, v: caches of kv_type
 * (F32 or F16), position p's row at p * kv_stride elements, n_kv_head*head_dim long; query
 * head h reads KV head h / (n_head / n_kv_head). Callers guarantee n_kv_head divides n_head
 * (asserted). scratch: at least (pos0 + n) floats. */
void kern_ref_attention(uint32_t kv_type, float *out, const float *q, const void *k,
                        const void *v, int64_t n, int64_t pos0, int n_head, int n_kv_head,
                        int head_dim, size_t kv_stride, float scale, float *scratch);

/* The forward pass's other ops (element-wise and per-layer; rows contiguous unless a stride
 * is given, in floats). */
/* RoPE angle tables for rows at positions pos0..pos0+n-1: cs/sn[r][i] (n x n_rot/2) = cos/sin
 * of freq_scale * theta_i (theta_i / freq_div[i] unless freq_div is NULL), theta_i =
 * pos * base^(-2i/n_rot) built by repeated f32 products, as kern_ref_rope and ggml do. */
void kern_ref_rope_angles(float *cs, float *sn, int64_t n, int64_t pos0, int n_rot,
                          float freq_base, float freq_scale, const float *freq_div);
/* RoPE in place on n rows (`stride` apart) of n_head heads of head_dim: row r's first n_rot
 * dims of each head rotated by cs/sn row r; neox: pairs (i, i + n_rot/2), else (2i, 2i+1). */
void kern_ref_rope_rows(float *x, int64_t n, size_t stride, int n_head, int head_dim,
                        int n_rot, const float *cs, const float *sn, bool neox);
/* n rows of dim f32 from src into a cache of kv_type (F16, rounded to nearest even, or F32):
 * row i at dst + i * dst_stride elements. */
void kern_ref_kv_store(uint32_t kv_type, void *dst, size_t dst_stride, const float *src,
                       int64_t n, int64_t dim);
/* y[i] += x[i] (the residual add). */
void kern_ref_add(float *y, const float *x, int64_t n);
/* y[r][c] += b[c] on n rows of cols (a bias). */
void kern_ref_add_rows(float *y, const float *b, int64_t n, int64_t cols);
/* y[idx[r]][c] += a[r] * x[r][c] on n rows of cols (idx NULL: row r itself); the rows idx
 * names are distinct (weighted expert outputs into the residual rows). */
void kern_ref_axpy_rows(float *y, const float *a, const float *x, const uint32_t *idx,
                        int64_t n, int64_t cols);
/* x[i] = 1 / (1 + exp(-x[i])) */
void kern_ref_sigmoid(float *x, int64_t n);
/* x[i] *= sigmoid(g[i]) (an output gate). */
void kern_ref_mul_sigmoid(float *x, const float *g, int64_t n);
/* In place on n groups (`stride` apart) of nh vectors of d: v / max(||v||, eps) (ggml_l2_norm). */
void kern_ref_l2norm(float *x, int64_t n, size_t stride, int nh, int d, float eps);
/* out[r] = rmsnorm(x[r]) * w * silu(z[r]) on n rows of cols; out may be x. */
void kern_ref_rmsnorm_silu(float *out, const float *x, const float *w, const float *z,
                           int64_t n, int64_t cols, float eps);
/* Causal depthwise conv + SiLU: x holds kernel-1 + n rows of `channels`, w[c][kernel] channel
 * c's taps (oldest first); out[t][c] = silu(sum over j of x[t + j][c] * w[c][j]), n rows. */
void kern_ref_conv_silu(float *out, const float *x, const float *w, int64_t n,
                        int64_t channels, int kernel);
/* MoE router on n rows of n_expert logits: each row softmaxed in place, sel[t] its k best
 * experts (best first, ties to the lower id), w[t][j] = p[sel] / sum of the k selected. */
void kern_ref_moe_route(uint32_t *sel, float *w, float *logits, int64_t n, int n_expert, int k);
/* Gated DeltaNet recurrence over n tokens (in order) for n_v_head value heads of d, state
 * S[h] (d x d, S[i][j]: key dim i, value dim j) updated in place. Token t's rows: q, k
 * (n_k_head heads of d, L2-normalised; value head h reads key head h % n_k_head) and v
 * (n_v_head heads) at t * stride; beta, alpha: [n][n_v_head]; dt_bias, a: [n_v_head]. Per
 * head: b = sigmoid(beta), S *= exp(softplus(alpha + dt_bias) * a), S += k (b (v - S^T k))^T,
 * o = S^T q / sqrt(d), o rows n x n_v_head*d contiguous. scratch: 2 d floats. */
void kern_ref_deltanet(float *o, float *S, const float *q, const float *k, const float *v,
                       size_t stride, const float *beta, const float *alpha,
                       const float *dt_bias, const float *a, int64_t n, int n_k_head,
                       int n_v_head, int d, float *scratch);

/* ---- fast CPU path ---- */
struct kern_pool; /* opaque thread pool shared by all ops; one op at a time per pool */
/* n_threads <= 0: one per CPU this process may use (its affinity mask; capped at 512); n-1
 * workers plus the calling thread. 0, -ENOMEM or the pthread_create error. */
int kern_pool_new(struct kern_pool **out, int n_threads);
/* Joins the workers; NULL is a no-op. */
void kern_pool_free(struct kern_pool *p);
/* Threads an op runs on (1 for NULL). */
int kern_pool_threads(const struct kern_pool *p);
/* Human-readable name of the SIMD level in use ("avx512", "avx2", "neon-dotprod", "neon",
 * "scalar"). */
const char *kern_cpu_level(void);

/* Reserves the pool's scratch (quantised activations, attention rows, DeltaNet vectors): at
 * least bytes, allocated now. The ops never grow it: one whose need is over the reservation
 * fails with -ENOSPC, so a forward pass never allocates. 0 or -ENOMEM. */
int kern_pool_reserve(struct kern_pool *p, size_t bytes);
/* Scratch bytes kern_matmul needs for n activation rows of cols against type weights. */
size_t kern_matmul_scratch(uint32_t type, int64_t cols, int64_t n);
/* Scratch bytes kern_attention needs on p for contexts up to n_ctx positions. */
size_t kern_attention_scratch(const struct kern_pool *p, int64_t n_ctx, int head_dim);
/* Scratch bytes kern_deltanet needs on p for heads of d. */
size_t kern_deltanet_scratch(const struct kern_pool *p, int d);

/* kern_ref_matmul's contract on the pool's threads (p NULL: the calling thread only, with a
 * buffer of its own); the result does not depend on the thread count. 0, -EINVAL (type,
 * shape), -ENOSPC (the pool's reserved scratch is too small) or -ENOMEM (no pool). */
int kern_matmul(struct kern_pool *p, uint32_t type, const void *w, int64_t rows, int64_t cols,
                const float *x, int64_t n, float *y);
/* Weights repacked for the interleaved kernels (kernels/cpu/cpu_repack.c; docs/kernels.md,
 * "Repacked layouts"): n_mat matrices of rows x cols of one type, groups of the SIMD level's
 * rows with their quants interleaved. A row's result is the same whatever the number of
 * activation rows (and the same at the AVX2 and AVX-512 levels); it agrees with
 * kern_ref_matmul by NMSE, not bit for bit. */
struct kern_packed;
/* true when the SIMD level in use has repacked kernels for type (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K)
 * and cols is a whole number of its blocks. */
bool kern_pack_supported(uint32_t type, int64_t cols);
/* Packs n_mat matrices stored back to back in w (the file layout) into memory of its own
 * (w is not kept), on p's threads (NULL: the caller's alone; like every op on p, not while
 * another runs on it). 0, -ENOTSUP (no repacked kernels for type here), -EINVAL, -ENOMEM. */
int kern_pack_new(struct kern_pool *p, struct kern_packed **out, uint32_t type, const void *w,
                  int64_t rows, int64_t cols, int64_t n_mat);
/* Frees it; NULL is a no-op. */
void kern_pack_free(struct kern_packed *pk);
/* Bytes it holds (0 for NULL). */
size_t kern_pack_bytes(const struct kern_packed *pk);
/* The matrix of pk that file-layout bytes at offset off of w would be, for a matmul of type,
 * rows and cols; -1 when pk does not hold it (another shape or type, another SIMD level). */
int64_t kern_pack_find(const struct kern_packed *pk, uint32_t type, int64_t rows, int64_t cols,
                       size_t off);
/* Scratch bytes kern_matmul_packed needs for n activation rows (0 without kernels). */
size_t kern_pack_scratch(uint32_t type, int64_t cols, int64_t n);
/* kern_matmul's contract with matrix mat of pk as the weights. 0, -EINVAL (mat, n, or pk made
 * at another SIMD level), -ENOSPC (reserved scratch too small), -ENOMEM (no pool). */
int kern_matmul_packed(struct kern_pool *p, const struct kern_packed *pk, int64_t mat,
                       const float *x, int64_t n, float *y);
/* kern_ref_attention's contract on the pool's threads; scratch is used only without a pool.
 * 0, or -ENOSPC when the pool's reserved scratch is too small. */
int kern_attention(struct kern_pool *p, uint32_t kv_type, float *out, const float *q,
                    const void *k, const void *v, int64_t n, int64_t pos0, int n_head,
                    int n_kv_head, int head_dim, size_t kv_stride, float scale, float *scratch);

/* kern_ref_swiglu over n elements split across the pool's threads (bit-identical to it). */
void kern_swiglu(struct kern_pool *p, float *out, const float *gate, const float *up, int64_t n);
/* kern_ref_rmsnorm on each of n_rows rows of `cols` (x and out rows `cols` apart), rows split
 * across the pool's threads (bit-identical to it). */
void kern_rmsnorm_rows(struct kern_pool *p, float *out, const float *x, const float *w,
                       int64_t n_rows, int64_t cols, float eps);

/* The ops above with kern_ref_*'s contracts, bit-identical to them at any thread count: on
 * the pool where the work is big enough to split (rows x heads, channels, heads), else a
 * plain loop. */
void kern_rope_angles(struct kern_pool *p, float *cs, float *sn, int64_t n, int64_t pos0,
                      int n_rot, float freq_base, float freq_scale, const float *freq_div);
void kern_rope_rows(struct kern_pool *p, float *x, int64_t n, size_t stride, int n_head,
                    int head_dim, int n_rot, const float *cs, const float *sn, bool neox);
void kern_kv_store(struct kern_pool *p, uint32_t kv_type, void *dst, size_t dst_stride,
                   const float *src, int64_t n, int64_t dim);
void kern_add(struct kern_pool *p, float *y, const float *x, int64_t n);
void kern_add_rows(struct kern_pool *p, float *y, const float *b, int64_t n, int64_t cols);
void kern_axpy_rows(struct kern_pool *p, float *y, const float *a, const float *x,
                    const uint32_t *idx, int64_t n, int64_t cols);
void kern_sigmoid(struct kern_pool *p, float *x, int64_t n);
void kern_mul_sigmoid(struct kern_pool *p, float *x, const float *g, int64_t n);
void kern_l2norm(struct kern_pool *p, float *x, int64_t n, size_t stride, int nh, int d,
                 float eps);
void kern_rmsnorm_silu(struct kern_pool *p, float *out, const float *x, const float *w,
                       const float *z, int64_t n, int64_t cols, float eps);
void kern_conv_silu(struct kern_pool *p, float *out, const float *x, const float *w,
                    int64_t n, int64_t channels, int kernel);
void kern_moe_route(struct kern_pool *p, uint32_t *sel, float *w, float *logits, int64_t n,
                    int n_expert, int k);
/* kern_ref_deltanet with value heads split across the pool's threads; scratch is used only
 * without a pool. 0, or -ENOSPC when the pool's reserved scratch is too small. */
int kern_deltanet(struct kern_pool *p, float *o, float *S, const float *q, const float *k,
                  const float *v, size_t stride, const float *beta, const float *alpha,
                  const float *dt_bias, const float *a, int64_t n, int n_k_head, int n_v_head,
                  int d, float *scratch);

/* ---- devices: the executor's seam (docs/devices.md) ----
 * A device runs the forward pass's ops on memory it owns: buffers of weights, of KV cache and
 * recurrent state, of activations. Operands are addressed as (buffer, byte offset), never as
 * raw pointers, so a device may keep its buffers where the host cannot read them (a GPU).
 * "cpu" runs the kern_* fast path on a thread pool (its buffers are host memory, weights
 * viewed in place); "ref" runs the kern_ref_* oracle on the calling thread. Ops are issued
 * from one thread at a time and may run asynchronously: only kern_buf_read, kern_buf_unbind
 * (with download) and kern_dev_sync wait for them. Every op checks its operands lie inside
 * their buffers and returns 0 or a negative errno (-EINVAL: an operand out of its buffer or
 * a shape; -ENOSPC: the device's reserved scratch is too small). */
struct kern_dev;  /* opaque: one device instance (its pool, its scratch) */
struct kern_buf;  /* opaque: memory of one device */

enum kern_buf_kind {
    KERN_BUF_WEIGHT = 0, /* read-only model bytes, given at creation (viewed or uploaded) */
    KERN_BUF_STATE,      /* per-session KV cache / recurrent state, zeroed at creation */
    KERN_BUF_ACT,        /* activations and other scratch of the forward pass, zeroed */
    KERN_BUF_IO,         /* the boundary: bound to caller memory for one call (kern_buf_bind) */
};

/* An operand: byte offset off into buf; buf NULL is "no operand" where an op allows one. */
struct kern_at {
    struct kern_buf *buf;
    size_t off;
};
static inline struct kern_at kern_at_make(struct kern_buf *buf, size_t off)
{
    struct kern_at a = {buf, off};
    return a;
}

/* What a device is made with: each device its own options, nothing process-wide. */
struct kern_cl_opts;
struct kern_dev_opts {
    int n_threads;                  /* <= 0: one per CPU; ref and opencl use one */
    const struct kern_cl_opts *cl;  /* the "opencl" device's settings (below), read while it
                                       opens; NULL: none given (the environment's, else the
                                       defaults); other devices ignore it */
};
/* Opens device `name` ("cpu", "ref", "opencl") with o's settings (NULL: the defaults). 0,
 * -ENODEV for an unknown name or no such hardware (message in err, naming what there is),
 * -EINVAL (an opencl setting out of its range, named in err), -ENOMEM, -EIO (opencl: its
 * program failed to build; the build log is in err). */
int kern_dev_new_opts(struct kern_dev **out, const char *name, const struct kern_dev_opts *o,
                      char *err, size_t errlen);
/* kern_dev_new_opts with n_threads threads and no opencl settings. */
int kern_dev_new(struct kern_dev **out, const char *name, int n_threads, char *err,
                 size_t errlen);
/* Frees the device (its buffers must be freed first); NULL is a no-op. */
void kern_dev_free(struct kern_dev *d);
/* The device's name (static) and the threads its ops run on. */
const char *kern_dev_name(const struct kern_dev *d);
int kern_dev_threads(const struct kern_dev *d);
/* Most activation rows a matmul of weight type on d may take with each row's result the one
 * it has alone: UINT32_MAX for any number, 0 when not even two (a type that is not
 * kern_type_rows_exact). At least KERN_ROWS_EXACT_MAX for every type d takes: "cpu" keeps F32
 * to KERN_ROWS_EXACT_MAX (OpenBLAS past it), "opencl" every type to one row below its GEMM
 * threshold (CLBlast from it); batching across sessions, replay and drafting rely on it. */
uint32_t kern_dev_rows_exact(const struct kern_dev *d, uint32_t type);
/* The names of the devices there are ("cpu, ref, opencl"), static. */
const char *kern_dev_names(void);
/* Waits for every op issued so far. 0 or the first failure of an asynchronous op. */
int kern_dev_sync(struct kern_dev *d);

/* Scratch bytes the ops need (kern_matmul_scratch and friends on this device); reserve the
 * largest once, before the forward pass: ops never grow it (-ENOSPC past it). */
size_t kern_dev_matmul_scratch(const struct kern_dev *d, uint32_t type, int64_t cols, int64_t n);
size_t kern_dev_attention_scratch(const struct kern_dev *d, int64_t n_ctx, int head_dim);
size_t kern_dev_deltanet_scratch(const struct kern_dev *d, int d_state);
int kern_dev_reserve(struct kern_dev *d, size_t bytes);

/* A buffer of bytes on d. KERN_BUF_WEIGHT: src holds the bytes (a host device views them,
 * so they must outlive the buffer; another uploads them now). STATE and ACT: zeroed, src
 * NULL. IO: no storage on a host device (kern_buf_bind points it at caller memory), a
 * staging area of `bytes` elsewhere. 0, -EINVAL, -ENOMEM. */
int kern_buf_new(struct kern_buf **out, struct kern_dev *d, enum kern_buf_kind kind,
                 size_t bytes, const void *src);
/* Says that weight buffer b holds n_mat matrices of rows x cols of type, back to back from
 * its start and filling it, read only as matmul weights (never by get_rows or copy_rows): the
 * device may then keep them in a layout of its own, in memory it owns ("cpu" repacks Q4_0,
 * Q8_0 and the K types for its interleaved kernels; docs/devices.md). release: b's bytes are
 * a private read-only file mapping whose pages the device may drop once it has its copy
 * (read again, they fault back in from the file). 0 (also when the device keeps the bytes as they are),
 * -EINVAL (not a weight buffer, a shape that does not fill it), -ENOMEM. */
int kern_buf_weight_use(struct kern_buf *b, uint32_t type, int64_t rows, int64_t cols,
                        int64_t n_mat, bool release);
/* Bytes the device holds for weight buffer b in a layout of its own (0: it reads b's). */
size_t kern_buf_weight_own(const struct kern_buf *b);
/* Frees the buffer (after kern_dev_sync when ops may still use it); NULL is a no-op. */
void kern_buf_free(struct kern_buf *b);
/* Its size in bytes. */
size_t kern_buf_size(const struct kern_buf *b);
/* Copies n bytes from host src to b at off, in order with the ops issued so far. 0, -EINVAL. */
int kern_buf_write(struct kern_buf *b, size_t off, const void *src, size_t n);
/* Waits for the ops issued so far, then copies n bytes of b at off to host dst. 0, -EINVAL. */
int kern_buf_read(struct kern_buf *b, size_t off, void *dst, size_t n);
/* Binds an IO buffer to caller memory host[bytes] (bytes <= its size) until kern_buf_unbind:
 * a host device's ops then read and write host itself (no copy); another device copies host
 * in when upload. 0, -EINVAL (not an IO buffer, too big). */
int kern_buf_bind(struct kern_buf *b, void *host, size_t bytes, bool upload);
/* Ends the binding: waits for the ops, and when download copies the buffer back into host. */
int kern_buf_unbind(struct kern_buf *b, bool download);

/* The ops: kern_ref_*'s contracts (above) on operands in buffers; floats are f32, strides
 * are in elements as there. On "cpu" they are bit-identical to kern_*; on "ref" they are
 * kern_ref_*. */
int kern_dev_matmul(struct kern_dev *d, uint32_t type, struct kern_at w, int64_t rows,
                    int64_t cols, struct kern_at x, int64_t n, struct kern_at y);
int kern_dev_rmsnorm_rows(struct kern_dev *d, struct kern_at out, struct kern_at x,
                          struct kern_at w, int64_t n_rows, int64_t cols, float eps);
/* freq_div.buf may be NULL (no divisors). */
int kern_dev_rope_angles(struct kern_dev *d, struct kern_at cs, struct kern_at sn, int64_t n,
                         int64_t pos0, int n_rot, float freq_base, float freq_scale,
                         struct kern_at freq_div);
int kern_dev_rope_rows(struct kern_dev *d, struct kern_at x, int64_t n, size_t stride,
                       int n_head, int head_dim, int n_rot, struct kern_at cs,
                       struct kern_at sn, bool neox);
int kern_dev_kv_store(struct kern_dev *d, uint32_t kv_type, struct kern_at dst,
                      size_t dst_stride, struct kern_at src, int64_t n, int64_t dim);
/* k, v: caches holding positions 0..pos0+n-1 (rows kv_stride elements apart). */
int kern_dev_attention(struct kern_dev *d, uint32_t kv_type, struct kern_at out,
                       struct kern_at q, struct kern_at k, struct kern_at v, int64_t n,
                       int64_t pos0, int n_head, int n_kv_head, int head_dim,
                       size_t kv_stride, float scale);
int kern_dev_swiglu(struct kern_dev *d, struct kern_at out, struct kern_at gate,
                    struct kern_at up, int64_t n);
int kern_dev_add(struct kern_dev *d, struct kern_at y, struct kern_at x, int64_t n);
int kern_dev_add_rows(struct kern_dev *d, struct kern_at y, struct kern_at b, int64_t n,
                      int64_t cols);
/* a: n floats, idx: n uint32 (idx.buf NULL: row r itself); y holds y_rows rows. Indices
 * below y_rows are the caller's invariant (the host devices check them: -EINVAL). */
int kern_dev_axpy_rows(struct kern_dev *d, struct kern_at y, int64_t y_rows, struct kern_at a,
                       struct kern_at x, struct kern_at idx, int64_t n, int64_t cols);
int kern_dev_sigmoid(struct kern_dev *d, struct kern_at x, int64_t n);
int kern_dev_mul_sigmoid(struct kern_dev *d, struct kern_at x, struct kern_at g, int64_t n);
int kern_dev_l2norm(struct kern_dev *d, struct kern_at x, int64_t n, size_t stride, int nh,
                    int dim, float eps);
int kern_dev_rmsnorm_silu(struct kern_dev *d, struct kern_at out, struct kern_at x,
                          struct kern_at w, struct kern_at z, int64_t n, int64_t cols,
                          float eps);
int kern_dev_conv_silu(struct kern_dev *d, struct kern_at out, struct kern_at x,
                       struct kern_at w, int64_t n, int64_t channels, int kernel);
/* sel: n*k uint32, w: n*k floats, logits: n*n_expert floats (softmaxed in place). */
int kern_dev_moe_route(struct kern_dev *d, struct kern_at sel, struct kern_at w,
                       struct kern_at logits, int64_t n, int n_expert, int k);
int kern_dev_deltanet(struct kern_dev *d, struct kern_at o, struct kern_at S, struct kern_at q,
                      struct kern_at k, struct kern_at v, size_t stride, struct kern_at beta,
                      struct kern_at alpha, struct kern_at dt_bias, struct kern_at a,
                      int64_t n, int n_k_head, int n_v_head, int dim);
/* Embedding rows: out[i] = dequantised row ids[i] of a table of `rows` rows of cols elements
 * of type; ids: n int32 in [0, rows) (the caller's invariant; host devices check: -EINVAL). */
int kern_dev_get_rows(struct kern_dev *d, uint32_t type, struct kern_at table, int64_t rows,
                      int64_t cols, struct kern_at ids, int64_t n, struct kern_at out);
/* n rows of row_bytes: dst + i * dst_stride <- src + j * src_stride, j = idx[i] (uint32,
 * below src_rows as for axpy_rows) or i when idx.buf is NULL. Strides in bytes; the rows
 * of dst and src do not overlap. */
int kern_dev_copy_rows(struct kern_dev *d, struct kern_at dst, size_t dst_stride,
                       struct kern_at src, size_t src_stride, int64_t src_rows,
                       struct kern_at idx, int64_t n, size_t row_bytes);
/* bytes zero bytes at dst. */
int kern_dev_zero(struct kern_dev *d, struct kern_at dst, size_t bytes);

/* ---- the "opencl" device's settings and facts (docs/opencl.md) ----
 * Settings of one opencl device, given when it is made (struct kern_dev_opts's cl): a field
 * left at its zero value (or -1 for the indices) takes the environment's KV_CL_PLATFORM,
 * KV_CL_DEVICE, KV_CL_ALLOC_CAP (bytes; k/M suffixes), KV_CL_CACHE (a folder, "off": no
 * cache), KV_CL_WG, KV_CL_LAYOUT, KV_CL_WEIGHTS, KV_CL_GEMM_ROWS (a number, "off" or 0),
 * KV_CL_FP16, KV_CL_SUBGROUPS ("on"/1, "off"/0), else the default: platform 0, device 0, the
 * device's own allocation cap, $XDG_CACHE_HOME/kvasir/opencl (or ~/.cache/kvasir/opencl),
 * work-groups of 64, weights "auto", prompt GEMMs from KERN_CL_GEMM_MIN (16) rows, neither
 * variant. The strings are read while the device opens, not kept. */
#define KERN_CL_GEMM_MIN (KERN_ROWS_EXACT_MAX + 1)   /* the lowest GEMM threshold */
struct kern_cl_opts {
    int platform, device;      /* indices as `clinfo -l` lists them; -1: not given */
    size_t alloc_cap;          /* bytes of one allocation at most (0: the device's) */
    const char *cache_dir;     /* program binaries' folder; "off": none; NULL: not given */
    int wg;                    /* work-group size 32..256, a power of two; 0: not given */
    const char *layout;        /* Q4_0/Q8_0 weights: "plain", "adreno" (split, transposed,
                                  read as images), "auto" (adreno on Adreno); NULL: not given */
    const char *weights;       /* "map" (weights wrapped in place over the caller's bytes,
                                  CL_MEM_USE_HOST_PTR), "copy" (uploaded), "auto" (map where the
                                  device shares host memory); NULL: not given */
    int gemm_rows;             /* matmuls of at least this many activation rows (at least
                                  KERN_CL_GEMM_MIN) dequantise the weights to f32 tiles and
                                  run CLBlast's SGEMM; fewer keep the fused kernels; negative:
                                  never; 0: not given */
    int fp16, subgroups;       /* the kernels' variants (docs/opencl.md, "Kernels and
                                  layouts"): half arithmetic in the split dequantiser
                                  (cl_khr_fp16), reductions through native subgroups
                                  (cl_khr_subgroups); 1: on (-ENODEV on a device without the
                                  extension), -1: off, 0: not given */
};
/* Options that give nothing (every field from the environment or the default). */
#define KERN_CL_OPTS_INIT {.platform = -1, .device = -1}
struct kern_cl_info {
    char platform[128], device[128];
    size_t alloc_cap;          /* the cap weights are split at */
    int wg;
    char layout[16];           /* "plain" or "adreno" */
    bool from_cache;           /* the program came from the binary cache */
    double build_ms;           /* compiling from source took (0 from the cache) */
    char cache_file[4200];     /* "" when no cache */
    uint64_t global_mem;       /* CL_DEVICE_GLOBAL_MEM_SIZE */
    uint64_t max_alloc;        /* CL_DEVICE_MAX_MEM_ALLOC_SIZE */
    bool unified;              /* CL_DEVICE_HOST_UNIFIED_MEMORY: the device shares host memory */
    size_t base_align;         /* CL_DEVICE_MEM_BASE_ADDR_ALIGN, in bytes */
    char weights[8];           /* the weights setting in effect: "map" or "copy" */
    uint64_t weights_mapped;   /* weight bytes wrapped in place so far (pieces, seams too) */
    uint64_t weights_copied;   /* weight bytes copied to the device so far */
    uint32_t gemm_rows;        /* the GEMM threshold in effect (0: off, or turned off by a
                                  CLBlast failure) */
    uint64_t gemm_calls;       /* matmuls CLBlast computed */
    uint64_t gemm_fallbacks;   /* GEMMs that failed, computed by the fused kernels instead */
    uint64_t gemm_tile_bytes;  /* device memory the GEMMs hold (0 before the first): the f32
                                  weight tile, at most 32 MiB and the allocation cap, */
    uint64_t gemm_tmp_bytes;   /* and CLBlast's temporary buffer, at most the largest
                                  allocation */
    char gemm_error[256];      /* why the last one failed ("" when none did) */
    size_t max_wg;             /* CL_DEVICE_MAX_WORK_GROUP_SIZE */
    bool has_fp16, has_subgroups;   /* the variants the device offers */
    bool fp16, subgroups;      /* the variants the kernels were built with */
};
/* d's facts; -EINVAL when d is not an opencl device. */
int kern_cl_info(const struct kern_dev *d, struct kern_cl_info *info);
/* Device allocations behind b (more than one: a weight split at the cap); 0 off opencl. */
int kern_cl_buf_pieces(const struct kern_buf *b);
/* b holds a Q4_0/Q8_0 matrix in the adreno layout (made at its first matmul or lookup). */
bool kern_cl_buf_split(const struct kern_buf *b);
/* Read bandwidth of d's memory in GB/s (best of 3 sweeps over bytes, capped at one
 * allocation); 0 on failure or when d is not an opencl device. */
double kern_cl_bench_bandwidth(struct kern_dev *d, size_t bytes);

/* Read bandwidth in GB/s (best of a few passes over a fresh buffer of `bytes`, split over the
 * pool's threads): the ceiling for bandwidth-bound generation. 0 on allocation failure. */
double kern_bench_bandwidth(struct kern_pool *p, size_t bytes);

#endif

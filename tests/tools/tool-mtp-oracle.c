/* tool-mtp-oracle — an independent scalar oracle of the MTP drafter (model_mtp_draft,
 * docs/model.md "The MTP drafter"), run by tests/integration/test-mtp-oracle.sh.
 *
 * usage: tool-mtp-oracle COPY ORIGINAL
 *   COPY      a Qwen3.5 model with one MTP block appended (kvctl synth --from ORIGINAL --nextn 1)
 *   ORIGINAL  the model without the block
 *
 * The oracle reads the MTP block's weights from COPY through the gguf module, dequantises them
 * with the kernels' scalar dequantiser (kern_ref_dequant_row) and computes the block in double
 * precision from the maths alone (llama.cpp's MTP graph), none of the executor's code: entry p
 * takes token t_p and h = rmsnorm(x_{p-1}) * output_norm, the main pass's hidden row of position
 * p - 1 after the final norm (zeros for p = 0);
 *     u = eh_proj [rmsnorm(embd(t_p)) * enorm | rmsnorm(h) * hnorm]
 *     u += wo (sigmoid(gate) * attn(rmsnorm(u) * attn_norm))   gated, QK-norm, NEOX RoPE at p
 *     u += ffn(rmsnorm(u) * post_attention_norm)               SwiGLU, or MoE + shared expert
 *     h_out = rmsnorm(u) * shared_head_norm ; logits = output h_out
 * and a chained draft is the entry (draft, h_out of the entry before).
 *
 * Two oracles: "exact" is the maths above; "rounded" also rounds where llama.cpp's CPU path
 * does (kernels/kern.h): each matmul's input to F16 for F16 weights and to Q8_0 blocks for Q8_0
 * weights, K and V to F16 in the cache, q and the softmax weights to F16 in the attention
 * products. The exact oracle says the executor computes the right function; the rounded one,
 * far tighter, that nothing small is off either (it agrees to 1e-7 where no rounding lands
 * the other way).
 *
 * The executor gives the main pass's rows x (model_embed + model_window_run) and the block's
 * logits through model_mtp_draft, on the "cpu" and "ref" devices; both oracles take the same
 * rows x. Checked, on each device:
 *   - every entry's logits, written in one call from position 0, and row by row (a pass at
 *     position q with q's row alone): within the exact oracle's bound, its argmax where the
 *     top-2 gap is clear; most entries within TOL_ROUND of the rounded oracle;
 *   - one call, row by row, two passes (as a generation: the prompt, then a pass at a later
 *     position), chunks of 4 rows and the last window alone give the same logits (TOL_SAME);
 *   - chained drafts (k = 4) from every entry: each draft the oracle's, its chain fed the
 *     executor's drafts;
 *   - -EINVAL for an entry past the written ones (nothing changed after), -ENOTSUP and no
 *     model_has_mtp on a window that is not the last and on ORIGINAL.
 *
 * Prints the measured figures and a last "ok ..." line, or a "FAIL: ..." line for each failed
 * check; exits 0 when every check passed, 1 otherwise, 2 on bad usage. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "kernels/kern.h"
#include "model/model.h"
#include "util/err.h"
#include "wtype/wtype.h"

/* Bounds on max |diff| / max |oracle| over an entry's logits.
 * Exact oracle, by the block's weight type: the executor's rounding against none. Measured on
 * the two test models (kvctl synth --seed 5, the tokens below), the larger of "cpu" and "ref":
 * 5.7e-4 (F16) and 1.5e-2 (Q8_0: 8-bit activations into every matmul); the bounds are 3.5
 * times those.
 * Rounded oracle: the same roundings, so what is left is float sums against double ones, about
 * 1e-7 (F16 and Q8_0 alike), and now and then a rounding that lands the other way (a value
 * within 1e-7 of an F16 or Q8_0 midpoint), which moves that entry, and those after it through
 * its K/V, by up to the exact oracle's difference (4e-4 on the F16 model, for 5 of 12 entries
 * on "cpu", 2 on "ref"; none on the Q8_0 one). So at least a third of the entries must be
 * within TOL_ROUND, 100 times the float noise.
 * A wrong wiring (the concat order swapped, the hidden row taken before the final norm, RoPE
 * at other positions, no shared_head_norm or another norm in its place, enorm and hnorm
 * swapped) moves the logits by 0.06 to 1.7 from the exact oracle and nearly every entry away
 * from the rounded one. */
#define TOL_EXACT_F16 2e-3
#define TOL_EXACT_Q8_0 5e-2
#define TOL_ROUND 1e-5
/* The ways of writing the same entries (one call, row by row, two passes, another max_batch,
 * another window): every matmul is row-exact (kern_type_rows_exact), so they agree bit for
 * bit; 1e-6 relative leaves room for nothing but float noise. */
#define TOL_SAME 1e-6
/* Routing near a tie: when the K-th and the (K+1)-th expert's probabilities are within this
 * log-ratio, the executor's rounding may pick either, and each oracle computes the entry with
 * both choices and takes the one nearer the executor's logits (a flip moves the logits by
 * 0.3 of their max). The exact oracle's router logits and the rounded one's (which are the
 * executor's to 1e-6) differed by up to 0.027 on the Q8_0 model, so a log-ratio can move by
 * twice that; the exact margin is about 3 times it, the rounded one 10 times the 1e-3 a rare
 * rounding the other way could move it by. */
#define ROUTE_TIE_EXACT 0.15
#define ROUTE_TIE_ROUNDED 0.01

#define L_TOK 12     /* tokens fed (teacher forcing) */
#define N_PROMPT 9   /* the first pass of the two-pass run */
#define N_CHAIN 4    /* drafts of a chained run */
#define N_ENT (L_TOK + N_CHAIN)
#define N_CTX 64

static const int32_t tokens[L_TOK] = {1, 400, 300, 200, 100, 17, 99, 5, 250, 251, 9, 640};

static int n_fail;

static void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("FAIL: ", stdout);
    vprintf(fmt, ap);
    fputc('\n', stdout);
    va_end(ap);
    n_fail++;
}

/* ---- the oracle's weights: the MTP block and the globals it reads, dequantised ---- */

/* A weight matrix W [rows][cols] (GGUF ne [cols, rows]) as f32, and its type in the file. */
struct omat {
    float *w;
    uint32_t type, rows, cols;
};

struct oracle {
    uint32_t E, V, n_head, n_head_kv, hd, n_rot;
    uint32_t X, K;                     /* experts and experts used (0: dense) */
    double eps, base;
    struct omat tok_embd, output, eh_proj;       /* [V][E], [V][E], [E][2E] */
    struct omat wq, wk, wv, wo;                  /* [n_head 2 hd][E], [kv][E] x 2, [E][n_head hd] */
    struct omat gate, up, down;                  /* dense: [F][E] x 2, [E][F] */
    struct omat router, g_exps, u_exps, d_exps;  /* [X][E], [X F_exp][E] x 2, [X E][F_exp] */
    struct omat sh_inp, g_sh, u_sh, d_sh;        /* [1][E], [F_sh][E] x 2, [E][F_sh] */
    float *output_norm, *enorm, *hnorm, *head_norm, *attn_norm, *post_norm;   /* [E] */
    float *q_norm, *k_norm;                                                     /* [hd] */
};

/* Tensor name into *m as f32, dequantised: it must have exactly the dims ne0 x ne1 x ne2
 * (rows = ne1 ne2). false (a failure said) when absent, of another shape, of a size that is
 * not its type's, or of a type the scalar dequantiser lacks. */
static bool load(struct gguf_file *f, const char *name, uint64_t ne0, uint64_t ne1, uint64_t ne2,
                 struct omat *m)
{
    const struct gguf_tensor *t = gguf_tensor_find(f, name);
    if (!t) {
        fail("oracle: tensor %s missing", name);
        return false;
    }
    if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != ne2 || t->ne[3] != 1) {
        fail("oracle: tensor %s is %" PRIu64 "x%" PRIu64 "x%" PRIu64 ", expected %" PRIu64
             "x%" PRIu64 "x%" PRIu64, name, t->ne[0], t->ne[1], t->ne[2], ne0, ne1, ne2);
        return false;
    }
    uint64_t n = ne0 * ne1 * ne2, bytes;
    if (n > (1u << 26) || wtype_bytes(t->type, n, &bytes) < 0 || bytes != t->size) {
        fail("oracle: tensor %s: %" PRIu64 " bytes of type %" PRIu32 " for %" PRIu64 " elements",
             name, t->size, t->type, n);
        return false;
    }
    void *raw = malloc(bytes ? bytes : 1);
    float *out = malloc(n * sizeof *out);
    char err[KV_ERR_MAX] = "";
    int rc = !raw || !out ? -ENOMEM : gguf_tensor_read(f, t, raw, err, sizeof err);
    if (rc == 0)
        rc = t->type == KERN_T_F32 ? (memcpy(out, raw, bytes), 0)
                                   : kern_ref_dequant_row(t->type, raw, out, (int64_t)n);
    free(raw);
    if (rc < 0) {
        fail("oracle: tensor %s: %s (%d)", name, err[0] ? err : "dequantise", rc);
        free(out);
        return false;
    }
    *m = (struct omat){out, t->type, (uint32_t)(ne1 * ne2), (uint32_t)ne0};
    return true;
}

/* A 1-D f32 tensor of n elements. */
static bool load_vec(struct gguf_file *f, const char *name, uint64_t n, float **v)
{
    struct omat m;
    if (!load(f, name, n, 1, 1, &m))
        return false;
    if (m.type != KERN_T_F32) {
        fail("oracle: tensor %s is not f32", name);
        free(m.w);
        return false;
    }
    *v = m.w;
    return true;
}

static bool meta_u32(struct gguf_file *f, const char *arch, const char *key, uint32_t *v)
{
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    int rc = gguf_get_u32(f, k, v);
    if (rc < 0)
        fail("oracle: metadata %s: %d", k, rc);
    return rc == 0;
}

static bool meta_f64(struct gguf_file *f, const char *arch, const char *key, double *v)
{
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    float x = 0;
    int rc = gguf_get_f32(f, k, &x);
    if (rc < 0)
        fail("oracle: metadata %s: %d", k, rc);
    *v = x;
    return rc == 0;
}

static void oracle_free(struct oracle *o)
{
    struct omat *mats[] = {&o->tok_embd, &o->output, &o->eh_proj, &o->wq, &o->wk, &o->wv,
                           &o->wo, &o->gate, &o->up, &o->down, &o->router, &o->g_exps,
                           &o->u_exps, &o->d_exps, &o->sh_inp, &o->g_sh, &o->u_sh, &o->d_sh};
    for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
        free(mats[i]->w);
    float *vecs[] = {o->output_norm, o->enorm, o->hnorm, o->head_norm, o->attn_norm,
                     o->post_norm, o->q_norm, o->k_norm};
    for (size_t i = 0; i < sizeof vecs / sizeof vecs[0]; i++)
        free(vecs[i]);
    memset(o, 0, sizeof *o);
}

/* The feed-forward weights of block il: dense SwiGLU, or routed experts + shared expert. */
static bool load_ffn(struct oracle *o, struct gguf_file *f, const char *arch, uint32_t il, bool moe)
{
    const uint32_t E = o->E;
    char n[128];
#define BLK(s) (snprintf(n, sizeof n, "blk.%" PRIu32 ".%s", il, (s)), n)
    if (!moe) {
        const struct gguf_tensor *t = gguf_tensor_find(f, BLK("ffn_gate.weight"));
        uint64_t F = t ? t->ne[1] : 0;
        return F > 0 && F <= (1u << 16) && load(f, BLK("ffn_gate.weight"), E, F, 1, &o->gate) &&
               load(f, BLK("ffn_up.weight"), E, F, 1, &o->up) &&
               load(f, BLK("ffn_down.weight"), F, E, 1, &o->down);
    }
    const struct gguf_tensor *t = gguf_tensor_find(f, BLK("ffn_gate_exps.weight"));
    const struct gguf_tensor *s = gguf_tensor_find(f, BLK("ffn_gate_shexp.weight"));
    uint64_t F = t ? t->ne[1] : 0, Fs = s ? s->ne[1] : 0;
    if (!meta_u32(f, arch, "expert_count", &o->X) || !meta_u32(f, arch, "expert_used_count", &o->K))
        return false;
    if (o->X == 0 || o->X > 256 || o->K == 0 || o->K >= o->X || F == 0 || F > (1u << 16) ||
        Fs == 0 || Fs > (1u << 16)) {
        fail("oracle: block %" PRIu32 ": %" PRIu32 " experts, %" PRIu32 " used, widths %" PRIu64
             " and %" PRIu64 " out of range", il, o->X, o->K, F, Fs);
        return false;
    }
    return load(f, BLK("ffn_gate_inp.weight"), E, o->X, 1, &o->router) &&
           load(f, BLK("ffn_gate_exps.weight"), E, F, o->X, &o->g_exps) &&
           load(f, BLK("ffn_up_exps.weight"), E, F, o->X, &o->u_exps) &&
           load(f, BLK("ffn_down_exps.weight"), F, E, o->X, &o->d_exps) &&
           load(f, BLK("ffn_gate_inp_shexp.weight"), E, 1, 1, &o->sh_inp) &&
           load(f, BLK("ffn_gate_shexp.weight"), E, Fs, 1, &o->g_sh) &&
           load(f, BLK("ffn_up_shexp.weight"), E, Fs, 1, &o->u_sh) &&
           load(f, BLK("ffn_down_shexp.weight"), Fs, E, 1, &o->d_sh);
#undef BLK
}

/* The hyperparameters from the file's metadata and the tensors' shapes, then the weights of
 * the first MTP block (blk.<block_count - nextn_predict_layers>) and the globals it reads. */
static int oracle_load(struct oracle *o, const char *path)
{
    memset(o, 0, sizeof *o);
    char err[KV_ERR_MAX] = "", arch[32], k[128];
    struct gguf_file *f;
    if (gguf_file_open(&f, path, err, sizeof err) < 0) {
        fail("oracle: %s", err);
        return -1;
    }
    uint32_t n_block = 0, n_nextn = 0;
    bool ok = gguf_get_str(f, "general.architecture", arch, sizeof arch) == 0;
    bool moe = ok && !strcmp(arch, "qwen35moe");
    if (!ok || (!moe && strcmp(arch, "qwen35"))) {
        fail("oracle: %s: general.architecture is not qwen35 or qwen35moe", path);
        goto out;
    }
    ok = meta_u32(f, arch, "block_count", &n_block) &&
         meta_u32(f, arch, "nextn_predict_layers", &n_nextn) &&
         meta_u32(f, arch, "embedding_length", &o->E) &&
         meta_u32(f, arch, "attention.head_count", &o->n_head) &&
         meta_u32(f, arch, "attention.head_count_kv", &o->n_head_kv) &&
         meta_u32(f, arch, "attention.key_length", &o->hd) &&
         meta_u32(f, arch, "rope.dimension_count", &o->n_rot) &&
         meta_f64(f, arch, "rope.freq_base", &o->base) &&
         meta_f64(f, arch, "attention.layer_norm_rms_epsilon", &o->eps);
    if (!ok)
        goto out;
    snprintf(k, sizeof k, "%s.rope.scaling.factor", arch);
    const struct gguf_tensor *te = gguf_tensor_find(f, "token_embd.weight");
    if (gguf_kv_find(f, k) || n_nextn < 1 || n_nextn >= n_block || !te || o->E == 0 ||
        o->E > 65536 || o->hd == 0 || o->hd > 1024 || o->n_rot > o->hd || o->n_rot % 2 ||
        o->n_head_kv == 0 || o->n_head % o->n_head_kv || o->n_head > 256 || te->ne[1] == 0 ||
        te->ne[1] > (1u << 20)) {
        fail("oracle: %s: hyperparameters out of the oracle's range (nextn %" PRIu32
             ", block_count %" PRIu32 ", or a RoPE scaling)", path, n_nextn, n_block);
        ok = false;
        goto out;
    }
    o->V = (uint32_t)te->ne[1];
    const uint32_t E = o->E, V = o->V, hd = o->hd, qd = o->n_head * hd, kvd = o->n_head_kv * hd;
    const uint32_t il = n_block - n_nextn;
    char n[128];
#define BLK(s) (snprintf(n, sizeof n, "blk.%" PRIu32 ".%s", il, (s)), n)
    ok = load(f, "token_embd.weight", E, V, 1, &o->tok_embd) &&
         load_vec(f, "output_norm.weight", E, &o->output_norm) &&
         load(f, gguf_tensor_find(f, "output.weight") ? "output.weight" : "token_embd.weight",
              E, V, 1, &o->output) &&
         load(f, BLK("nextn.eh_proj.weight"), 2 * E, E, 1, &o->eh_proj) &&
         load_vec(f, BLK("nextn.enorm.weight"), E, &o->enorm) &&
         load_vec(f, BLK("nextn.hnorm.weight"), E, &o->hnorm) &&
         load_vec(f, BLK("nextn.shared_head_norm.weight"), E, &o->head_norm) &&
         load_vec(f, BLK("attn_norm.weight"), E, &o->attn_norm) &&
         load(f, BLK("attn_q.weight"), E, 2 * qd, 1, &o->wq) &&
         load(f, BLK("attn_k.weight"), E, kvd, 1, &o->wk) &&
         load(f, BLK("attn_v.weight"), E, kvd, 1, &o->wv) &&
         load_vec(f, BLK("attn_q_norm.weight"), hd, &o->q_norm) &&
         load_vec(f, BLK("attn_k_norm.weight"), hd, &o->k_norm) &&
         load(f, BLK("attn_output.weight"), qd, E, 1, &o->wo) &&
         load_vec(f, BLK("post_attention_norm.weight"), E, &o->post_norm) &&
         load_ffn(o, f, arch, il, moe);
#undef BLK
    if (!ok)
        fail("oracle: the MTP block %" PRIu32 " of %s could not be read", il, path);
out:
    gguf_file_free(f);
    if (!ok)
        oracle_free(o);
    return ok ? 0 : -1;
}

/* ---- the oracle's maths, in double ---- */

/* One oracle: exact, or with llama.cpp's rounding; its K/V entries (one a position). */
struct otrack {
    const struct oracle *o;
    bool round;
    double tie;                        /* ROUTE_TIE_* */
    double *k, *v;                     /* [N_CTX][n_head_kv hd] */
};

/* out[n] = x[n] / sqrt(mean(x^2) + eps) * w[n]; out may be x. */
static void rmsnorm(double *out, const double *x, const float *w, uint32_t n, double eps)
{
    double ss = 0;
    for (uint32_t i = 0; i < n; i++)
        ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / n + eps);
    for (uint32_t i = 0; i < n; i++)
        out[i] = x[i] * r * w[i];
}

static double f16(double x) { return wtype_f16_to_f32(wtype_f32_to_f16((float)x)); }

/* y[rows] = W x. Rounded: x first as the matmul's activations are for W's type (F16 values for
 * F16 weights, Q8_0 blocks for Q8_0 weights, f32 otherwise). */
static void matvec(const struct otrack *t, double *y, const struct omat *W, size_t first_row,
                   uint32_t rows, const double *x)
{
    const uint32_t n = W->cols;
    double *xr = malloc(n * sizeof *xr);
    float *xf = malloc(n * sizeof *xf), *xd = malloc(n * sizeof *xd);
    void *q = malloc(wtype_row_bytes(KERN_T_Q8_0, n) + 1);
    for (uint32_t i = 0; i < n; i++)
        xr[i] = x[i];
    if (t->round && W->type == KERN_T_F16) {
        for (uint32_t i = 0; i < n; i++)
            xr[i] = f16(x[i]);
    } else if (t->round && W->type == KERN_T_Q8_0) {
        for (uint32_t i = 0; i < n; i++)
            xf[i] = (float)x[i];
        if (kern_ref_quant_row(KERN_T_Q8_0, xf, q, n) < 0 ||
            kern_ref_dequant_row(KERN_T_Q8_0, q, xd, n) < 0)
            fail("oracle: Q8_0 rounding of %" PRIu32 " values", n);
        for (uint32_t i = 0; i < n; i++)
            xr[i] = xd[i];
    } else if (t->round) {
        for (uint32_t i = 0; i < n; i++)
            xr[i] = (float)x[i];
    }
    for (uint32_t r = 0; r < rows; r++) {
        const float *row = W->w + (first_row + r) * n;
        double s = 0;
        for (uint32_t c = 0; c < n; c++)
            s += row[c] * xr[c];
        y[r] = s;
    }
    free(xr);
    free(xf);
    free(xd);
    free(q);
}

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
static double silu(double x) { return x * sigmoid(x); }

/* NEOX rotate-half of the first n_rot dims of one head at position p:
 * pairs (i, i + n_rot/2) by the angle p * base^(-2i / n_rot). */
static void rope(double *v, uint32_t n_rot, uint32_t p, double base)
{
    uint32_t half = n_rot / 2;
    for (uint32_t i = 0; i < half; i++) {
        double th = p * pow(base, -2.0 * i / n_rot);
        double a = v[i], b = v[i + half];
        v[i] = a * cos(th) - b * sin(th);
        v[i + half] = a * sin(th) + b * cos(th);
    }
}

/* y[E] = down (silu(gate x) * up x), with slice `slice` of each: F rows of gate and up, E rows
 * of down (an expert of the stacked experts; 0 for a dense FFN). */
static void swiglu(const struct otrack *t, double *y, const struct omat *g, const struct omat *u,
                   const struct omat *d, uint32_t slice, uint32_t F, const double *x)
{
    const uint32_t E = t->o->E;
    double *a = malloc(F * sizeof *a), *b = malloc(F * sizeof *b);
    matvec(t, a, g, (size_t)slice * F, F, x);
    matvec(t, b, u, (size_t)slice * F, F, x);
    for (uint32_t i = 0; i < F; i++)
        a[i] = silu(a[i]) * b[i];
    matvec(t, y, d, (size_t)slice * E, E, a);
    free(a);
    free(b);
}

/* y[2][E] = the block's feed-forward on x: dense SwiGLU, or the experts by softmax routing
 * over all of them, the top K by probability with weights renormalised to sum 1, plus the
 * shared expert scaled by sigmoid(sh_inp . x). Returns 1, or 2 when the K-th and (K+1)-th
 * probabilities are within t->tie: y[1] is then the output with those two swapped. */
static int ffn(const struct otrack *t, double *y, const double *x)
{
    const struct oracle *o = t->o;
    const uint32_t E = o->E;
    if (!o->X) {
        swiglu(t, y, &o->gate, &o->up, &o->down, 0, o->gate.rows, x);
        return 1;
    }
    const uint32_t F = o->g_exps.rows / o->X, Fs = o->g_sh.rows;
    double p[256], s, *ye = malloc(E * sizeof *ye), *ys = malloc(E * sizeof *ys);
    uint32_t sel[257];
    bool used[256] = {false};
    matvec(t, p, &o->router, 0, o->X, x);
    double mx = p[0], sum = 0;
    for (uint32_t i = 1; i < o->X; i++)
        mx = p[i] > mx ? p[i] : mx;
    for (uint32_t i = 0; i < o->X; i++)
        sum += (p[i] = exp(p[i] - mx));
    for (uint32_t i = 0; i < o->X; i++)
        p[i] /= sum;
    for (uint32_t j = 0; j <= o->K; j++) {      /* the top K, and the next one */
        uint32_t best = UINT32_MAX;
        for (uint32_t i = 0; i < o->X; i++)
            if (!used[i] && (best == UINT32_MAX || p[i] > p[best]))
                best = i;
        used[best] = true;
        sel[j] = best;
    }
    int n_var = log(p[sel[o->K - 1]] / p[sel[o->K]]) < t->tie ? 2 : 1;
    matvec(t, &s, &o->sh_inp, 0, 1, x);
    swiglu(t, ys, &o->g_sh, &o->u_sh, &o->d_sh, 0, Fs, x);
    for (int v = 0; v < n_var; v++) {
        double *yv = y + (size_t)v * E, wsum = 0;
        if (v == 1) {                           /* the other side of the tie */
            uint32_t tmp = sel[o->K - 1];
            sel[o->K - 1] = sel[o->K];
            sel[o->K] = tmp;
        }
        for (uint32_t j = 0; j < o->K; j++)
            wsum += p[sel[j]];
        for (uint32_t i = 0; i < E; i++)
            yv[i] = sigmoid(s) * ys[i];
        for (uint32_t j = 0; j < o->K; j++) {
            swiglu(t, ye, &o->g_exps, &o->u_exps, &o->d_exps, sel[j], F, x);
            for (uint32_t i = 0; i < E; i++)
                yv[i] += p[sel[j]] / wsum * ye[i];
        }
    }
    free(ye);
    free(ys);
    return n_var;
}

/* Attention of entry p: q [n_head][2 hd] per head [q | gate] (normed and roped in place),
 * over the K/V entries 0..p; att[n_head hd] = sigmoid(gate) * softmax(q k / sqrt(hd)) v.
 * Rounded: q and the softmax weights to F16 in the products, as over an F16 cache. */
static void attend(const struct otrack *t, uint32_t p, double *qg, double *att)
{
    const struct oracle *o = t->o;
    const uint32_t hd = o->hd, H = o->n_head, kvd = o->n_head_kv * hd;
    double *sc = malloc((p + 1) * sizeof *sc), *qr = malloc(hd * sizeof *qr);
    for (uint32_t h = 0; h < H; h++) {
        double *q = qg + (size_t)h * 2 * hd, *gate = q + hd;
        const uint32_t j = h / (H / o->n_head_kv);  /* grouped: its K/V head */
        rmsnorm(q, q, o->q_norm, hd, o->eps);
        rope(q, o->n_rot, p, o->base);
        for (uint32_t i = 0; i < hd; i++)
            qr[i] = t->round ? f16(q[i]) : q[i];
        double mx = -INFINITY, sum = 0;
        for (uint32_t s = 0; s <= p; s++) {
            const double *ks = t->k + (size_t)s * kvd + (size_t)j * hd;
            double d = 0;
            for (uint32_t i = 0; i < hd; i++)
                d += qr[i] * ks[i];
            sc[s] = d / sqrt((double)hd);
            mx = sc[s] > mx ? sc[s] : mx;
        }
        for (uint32_t s = 0; s <= p; s++)
            sum += (sc[s] = exp(sc[s] - mx));
        for (uint32_t s = 0; s <= p; s++)
            sc[s] = t->round ? f16(sc[s] / sum) : sc[s] / sum;
        for (uint32_t i = 0; i < hd; i++) {
            double d = 0;
            for (uint32_t s = 0; s <= p; s++)
                d += sc[s] * t->v[(size_t)s * kvd + (size_t)j * hd + i];
            att[(size_t)h * hd + i] = d * sigmoid(gate[i]);
        }
    }
    free(sc);
    free(qr);
}

/* Entry p: token tok with h (the hidden state after the final norm; NULL: zeros). Writes the
 * entry's K/V and gives its logits lg[n][V] and h_out[n][E] (the shared_head_norm output) for
 * each of the n routing choices it returns (ffn). */
static int oracle_entry(const struct otrack *t, uint32_t p, int32_t tok, const double *h,
                        double *lg, double *h_out)
{
    const struct oracle *o = t->o;
    const uint32_t E = o->E, hd = o->hd, kvd = o->n_head_kv * hd;
    double *cat = calloc(2 * (size_t)E, sizeof *cat), *u = malloc(E * sizeof *u);
    double *a = malloc(E * sizeof *a), *y = malloc(2 * (size_t)E * sizeof *y);
    double *qg = malloc(2 * (size_t)o->n_head * hd * sizeof *qg);
    double *att = malloc((size_t)o->n_head * hd * sizeof *att);
    double *kp = t->k + (size_t)p * kvd, *vp = t->v + (size_t)p * kvd;

    /* u = eh_proj [rmsnorm(embd) * enorm | rmsnorm(h) * hnorm] */
    for (uint32_t i = 0; i < E; i++)
        cat[i] = o->tok_embd.w[(size_t)tok * E + i];
    rmsnorm(cat, cat, o->enorm, E, o->eps);
    if (h)
        rmsnorm(cat + E, h, o->hnorm, E, o->eps);
    matvec(t, u, &o->eh_proj, 0, E, cat);

    /* u += wo (sigmoid(gate) * attn(rmsnorm(u) * attn_norm)), the entry's K/V stored first */
    rmsnorm(a, u, o->attn_norm, E, o->eps);
    matvec(t, qg, &o->wq, 0, o->wq.rows, a);
    matvec(t, kp, &o->wk, 0, kvd, a);
    matvec(t, vp, &o->wv, 0, kvd, a);
    for (uint32_t j = 0; j < o->n_head_kv; j++) {
        rmsnorm(kp + j * hd, kp + j * hd, o->k_norm, hd, o->eps);
        rope(kp + j * hd, o->n_rot, p, o->base);
    }
    for (uint32_t i = 0; t->round && i < kvd; i++) {    /* an F16 cache */
        kp[i] = f16(kp[i]);
        vp[i] = f16(vp[i]);
    }
    attend(t, p, qg, att);
    matvec(t, a, &o->wo, 0, E, att);
    for (uint32_t i = 0; i < E; i++)
        u[i] += a[i];

    /* u += ffn(rmsnorm(u) * post_attention_norm); h_out = rmsnorm(u) * shared_head_norm;
     * logits = output h_out */
    rmsnorm(a, u, o->post_norm, E, o->eps);
    int n_var = ffn(t, y, a);
    for (int v = 0; v < n_var; v++) {
        for (uint32_t i = 0; i < E; i++)
            a[i] = u[i] + y[(size_t)v * E + i];
        rmsnorm(h_out + (size_t)v * E, a, o->head_norm, E, o->eps);
        matvec(t, lg + (size_t)v * o->V, &o->output, 0, o->V, h_out + (size_t)v * E);
    }
    free(cat);
    free(u);
    free(a);
    free(y);
    free(qg);
    free(att);
    return n_var;
}

/* ---- comparisons ---- */

static uint32_t argmax_f(const float *x, uint32_t n)
{
    uint32_t b = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

static double absmax_d(const double *x, uint32_t n)
{
    double m = 0;
    for (uint32_t i = 0; i < n; i++)
        m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}

/* max |a - r| / max |r| */
static double rel_d(const float *a, const double *r, uint32_t n)
{
    double d = 0;
    for (uint32_t i = 0; i < n; i++)
        d = fabs(a[i] - r[i]) > d ? fabs(a[i] - r[i]) : d;
    double m = absmax_d(r, n);
    return m > 0 ? d / m : d;
}

static double rel_f(const float *a, const float *b, uint32_t n)
{
    double d = 0, m = 0;
    for (uint32_t i = 0; i < n; i++) {
        d = fabs((double)a[i] - b[i]) > d ? fabs((double)a[i] - b[i]) : d;
        m = fabs((double)b[i]) > m ? fabs((double)b[i]) : m;
    }
    return m > 0 ? d / m : d;
}

/* The oracle's argmax into *best, and whether its top-2 gap is clear of the tolerance: logits
 * within tol * max |r| of the oracle's cannot then have another argmax (each of the two moves
 * at most half the gap). */
static bool gap_clear(const double *r, uint32_t n, double tol, uint32_t *best)
{
    uint32_t b = 0, s = n > 1 ? 1 : 0;
    for (uint32_t i = 1; i < n; i++)
        if (r[i] > r[b])
            b = i;
    for (uint32_t i = 0; i < n; i++)
        if (i != b && (s == b || r[i] > r[s]))
            s = i;
    *best = b;
    return r[b] - r[s] > 2 * tol * absmax_d(r, n);
}

/* ---- the executor against the oracles ---- */

/* One oracle's results for a device: per entry, its logits and h_out for each routing choice
 * (n_var of them), the choice nearest the executor's logits (pick), and the difference. */
struct track {
    struct otrack t;
    const char *name;
    double tol;                        /* exact: every entry's bound; rounded: most entries' */
    double *lg, *h;                    /* [N_ENT][2][V], [N_ENT][2][E] */
    double diff[N_ENT];                /* max |executor - oracle| / max |oracle|, one call */
    uint8_t n_var[N_ENT], pick[N_ENT];
    uint32_t n_ties;
};

struct run {
    const char *dev, *path;
    const struct oracle *o;
    struct track tr[2];                /* exact, rounded */
    uint32_t n_argmax;                 /* argmaxes compared with the exact oracle's */
    uint32_t n_chain[3];               /* chained drafts compared with the rounded oracle, with
                                        * the exact one, not compared (near ties) */
    uint32_t n_second;                 /* second drafts compared */
    double worst, same_max;            /* the largest difference from the exact oracle, and
                                        * between two ways of writing an entry */
};

static int exec_open(struct model **m, struct model_exec **e, const char *path, int first,
                     int last, const char *dev, uint32_t max_batch)
{
    char err[KV_ERR_MAX] = "";
    *e = NULL;
    if (model_open(m, path, first, last, err, sizeof err) < 0) {
        fail("model_open %s [%d, %d): %s", path, first, last, err);
        return -1;
    }
    struct model_exec_opts eo;
    model_exec_opts_default(&eo);
    eo.device = dev;
    eo.n_threads = 2;
    eo.n_ctx = N_CTX;
    eo.max_batch = max_batch;
    if (model_exec_new_opts(e, *m, &eo, err, sizeof err) < 0) {
        fail("model_exec_new_opts %s on %s: %s", path, dev, err);
        model_free(*m);
        return -1;
    }
    if (model_session_new(*e, 1) < 0) {
        fail("model_session_new on %s", dev);
        model_exec_free(*e);
        model_free(*m);
        return -1;
    }
    return 0;
}

static const double *t_lg(const struct run *r, const struct track *t, uint32_t q, uint32_t v)
{
    return t->lg + ((size_t)q * 2 + v) * r->o->V;
}

static double *t_h(const struct run *r, const struct track *t, uint32_t q, uint32_t v)
{
    return t->h + ((size_t)q * 2 + v) * r->o->E;
}

/* The logits lg the executor gave for entry q, against each oracle's (the nearer routing
 * choice where there are two): within the exact oracle's bound, with its argmax where its
 * top-2 gap is clear; the rounded oracle's difference is kept for rounded_check. */
static void against_oracle(struct run *r, const char *how, uint32_t q, const float *lg)
{
    const uint32_t V = r->o->V;
    for (int i = 0; i < 2; i++) {
        struct track *t = &r->tr[i];
        double d = INFINITY;
        for (uint32_t v = 0; v < t->n_var[q]; v++) {
            double dv = rel_d(lg, t_lg(r, t, q, v), V);
            if (dv < d) {
                d = dv;
                t->pick[q] = (uint8_t)v;
            }
        }
        t->diff[q] = d;
        if (i == 1)
            continue;
        r->worst = d > r->worst ? d : r->worst;
        if (!(d <= t->tol))
            fail("%s %s: entry %" PRIu32 " (%s): logits differ from the %s oracle's by %.3g of "
                 "their max, over the bound %.3g", r->path, r->dev, q, how, t->name, d, t->tol);
        uint32_t best;
        if (gap_clear(t_lg(r, t, q, t->pick[q]), V, t->tol, &best)) {
            r->n_argmax++;
            if (argmax_f(lg, V) != best)
                fail("%s %s: entry %" PRIu32 " (%s): argmax %" PRIu32 ", the %s oracle's %" PRIu32,
                     r->path, r->dev, q, how, argmax_f(lg, V), t->name, best);
        }
    }
}

/* The rounded oracle: most entries agree within its bound (a third at least; a wrong term
 * moves every entry, a rounding that lands the other way one now and then). */
static void rounded_check(struct run *r)
{
    const struct track *t = &r->tr[1];
    uint32_t n_in = 0;
    double worst = 0, best = INFINITY;
    for (uint32_t q = 0; q < L_TOK; q++) {
        n_in += t->diff[q] <= t->tol;
        worst = t->diff[q] > worst ? t->diff[q] : worst;
        best = t->diff[q] < best ? t->diff[q] : best;
    }
    printf("  %s: rounded oracle: %" PRIu32 " of %d entries within %.3g (best %.3g, worst %.3g)\n",
           r->dev, n_in, L_TOK, t->tol, best, worst);
    if (n_in * 3 < L_TOK)
        fail("%s %s: only %" PRIu32 " of %d entries agree with the rounded oracle within %.3g",
             r->path, r->dev, n_in, L_TOK, t->tol);
}

/* Two ways of writing entry q must give the same logits. */
static void same(struct run *r, const char *what, uint32_t q, const float *a, const float *b)
{
    double d = rel_f(a, b, r->o->V);
    r->same_max = d > r->same_max ? d : r->same_max;
    if (!(d <= TOL_SAME))
        fail("%s %s: entry %" PRIu32 ": %s differ by %.3g of their max", r->path, r->dev, q,
             what, d);
}

/* Both oracles on the device's own main-pass rows x: entries 0..L_TOK-1 of the tokens. */
static void oracle_prompt(struct run *r, const float *x)
{
    const struct oracle *o = r->o;
    const uint32_t E = o->E;
    double *h = malloc(E * sizeof *h);
    for (int i = 0; i < 2; i++) {
        struct track *t = &r->tr[i];
        for (uint32_t q = 0; q < L_TOK; q++) {
            if (q > 0) {        /* position q - 1's row after the final norm */
                for (uint32_t c = 0; c < E; c++)
                    h[c] = x[(size_t)(q - 1) * E + c];
                rmsnorm(h, h, o->output_norm, E, o->eps);
            }
            t->n_var[q] = (uint8_t)oracle_entry(&t->t, q, tokens[q], q ? h : NULL,
                                                t->lg + (size_t)q * 2 * o->V,
                                                t->h + (size_t)q * 2 * E);
            t->n_ties += t->n_var[q] > 1;
        }
    }
    free(h);
}

/* Whether draft `tok` of the entry at idx that track t computed is its argmax: 1 yes, 0 no,
 * -1 not known (a top-2 gap within tol, for one of its routing choices; an entry of the prompt
 * has its choice picked, a chained one any). A chained entry's choice is known when one choice
 * only drafts tok: then pick[idx] is it, and *known says so. */
static int draft_is(const struct run *r, struct track *t, uint32_t idx, bool chained,
                    int32_t tok, double tol, bool *known)
{
    uint32_t v0 = chained ? 0 : t->pick[idx], v1 = chained ? t->n_var[idx] : v0 + 1u;
    uint32_t n_hit = 0;
    bool clear = true;
    for (uint32_t v = v0; v < v1; v++) {
        uint32_t best;
        clear = gap_clear(t_lg(r, t, idx, v), r->o->V, tol, &best) && clear;
        if (best == (uint32_t)tok) {
            n_hit++;
            t->pick[idx] = (uint8_t)v;
        }
    }
    *known = v1 - v0 == 1 || (clear && n_hit == 1);
    return clear ? n_hit > 0 : -1;
}

/* Chained drafts from entry q0 (the first draft from its logits, each next from the entry of
 * the previous draft and the entry before's h_out, at positions q0 + 1, ...). The oracles'
 * chains are fed the executor's drafts (their entries kept apart, at L_TOK.., and their K/V
 * put back after), so each draft is compared on its own: with the rounded oracle where its
 * top-2 gap is clear of twice the largest difference this device showed from it on the
 * teacher-forced entries, else with the exact one where the gap is clear of its bound; both
 * margins times (depth + 1). A[] holds the one-call logits. */
static void chain(struct run *r, struct model_exec *e, const float *x, const float *A, float *lg,
                  uint32_t q0)
{
    const uint32_t V = r->o->V, E = r->o->E;
    const size_t kv_bytes = N_CTX * (size_t)r->o->n_head_kv * r->o->hd * sizeof(double);
    int32_t out[N_CHAIN];
    int rc = model_mtp_draft(e, 1, 0, L_TOK, x, tokens, q0 + 1, N_CHAIN, out, lg);
    if (rc != N_CHAIN) {
        fail("%s %s: chained drafts from entry %" PRIu32 ": %d, expected %d", r->path, r->dev,
             q0, rc, N_CHAIN);
        return;
    }
    same(r, "logits of a chain's first entry and of one call", q0, lg, A + (size_t)q0 * V);
    double seen = TOL_ROUND;
    for (uint32_t q = 0; q < L_TOK; q++)
        seen = r->tr[1].diff[q] > seen ? r->tr[1].diff[q] : seen;
    double *save[2][2] = {{malloc(kv_bytes), malloc(kv_bytes)}, {malloc(kv_bytes), malloc(kv_bytes)}};
    for (int i = 0; i < 2; i++) {
        memcpy(save[i][0], r->tr[i].t.k, kv_bytes);
        memcpy(save[i][1], r->tr[i].t.v, kv_bytes);
    }
    bool known[2] = {true, true};       /* each oracle knows the routing of the entries so far */
    for (uint32_t j = 0; j < N_CHAIN; j++) {
        const uint32_t idx = j ? L_TOK - 1 + j : q0, prev = j == 1 ? q0 : L_TOK - 2 + j;
        if (out[j] < 0 || (uint32_t)out[j] >= V) {
            fail("%s %s: chained draft %" PRIu32 " from entry %" PRIu32 ": %d outside the "
                 "vocabulary", r->path, r->dev, j, q0, out[j]);
            break;
        }
        for (int i = 0; i < 2 && j > 0; i++) {
            struct track *t = &r->tr[i];
            if (known[i])
                t->n_var[idx] = (uint8_t)oracle_entry(&t->t, q0 + j, out[j - 1],
                                                      t_h(r, t, prev, t->pick[prev]),
                                                      t->lg + (size_t)idx * 2 * V,
                                                      t->h + (size_t)idx * 2 * E);
        }
        /* a chained entry carries the difference of the one before in its h: the margins
         * grow with the depth */
        int ro = -1, ex = -1;
        if (known[1])
            ro = draft_is(r, &r->tr[1], idx, j > 0, out[j], 2 * seen * (j + 1), &known[1]);
        if (known[0])
            ex = draft_is(r, &r->tr[0], idx, j > 0, out[j], r->tr[0].tol * (j + 1), &known[0]);
        if (ro == 0 || (ro < 0 && ex == 0))
            fail("%s %s: chained draft %" PRIu32 " from entry %" PRIu32 ": %d, not the %s "
                 "oracle's", r->path, r->dev, j, q0, out[j], ro == 0 ? "rounded" : "exact");
        r->n_chain[ro >= 0 ? 0 : ex >= 0 ? 1 : 2]++;
        r->n_second += j == 1 && (ro >= 0 || ex >= 0);
    }
    for (int i = 0; i < 2; i++) {
        memcpy(r->tr[i].t.k, save[i][0], kv_bytes);
        memcpy(r->tr[i].t.v, save[i][1], kv_bytes);
        free(save[i][0]);
        free(save[i][1]);
    }
}

/* Refusals: an entry past the written ones is -EINVAL, and changes nothing. A[] holds the
 * one-call logits. */
static void refusals(struct run *r, struct model_exec *e, const float *x, const float *A,
                     float *lg)
{
    const uint32_t E = r->o->E, V = r->o->V;
    int32_t out[1];
    int rc = model_mtp_draft(e, 1, L_TOK, 1, x, tokens, L_TOK, 1, out, lg);
    if (rc != -EINVAL)
        fail("%s %s: pos %d past the %d written entries: %d, expected -EINVAL", r->path, r->dev,
             L_TOK, L_TOK, rc);
    if ((rc = model_session_new(e, 2)) < 0 ||
        (rc = model_mtp_draft(e, 2, 1, 1, x + E, tokens, 3, 1, out, lg)) != -EINVAL)
        fail("%s %s: pos 1 on a session with no entries: %d, expected -EINVAL", r->path, r->dev,
             rc);
    rc = model_mtp_draft(e, 1, N_PROMPT, L_TOK - N_PROMPT, x + (size_t)N_PROMPT * E, tokens,
                         L_TOK, 1, out, lg);
    if (rc != 1)
        fail("%s %s: the second pass after the refusals: %d", r->path, r->dev, rc);
    same(r, "logits after the refusals and before", L_TOK - 1, lg, A + (size_t)(L_TOK - 1) * V);
}

/* Another max_batch (the entries in chunks of 4 rows) and the last window alone (its own
 * token_embd): the same logits for entry L_TOK - 1. */
static void other_execs(struct run *r, uint32_t n_layer, const float *x, const float *A,
                        float *lg)
{
    const uint32_t V = r->o->V;
    struct model *m;
    struct model_exec *e;
    int32_t out[1];
    if (exec_open(&m, &e, r->path, -1, -1, r->dev, 4) == 0) {
        int rc = model_mtp_draft(e, 1, 0, L_TOK, x, tokens, L_TOK, 1, out, lg);
        if (rc != 1)
            fail("%s %s: max_batch 4: %d", r->path, r->dev, rc);
        same(r, "logits with max_batch 4 and 32", L_TOK - 1, lg, A + (size_t)(L_TOK - 1) * V);
        model_exec_free(e);
        model_free(m);
    }
    if (exec_open(&m, &e, r->path, 4, (int)n_layer, r->dev, 32) == 0) {
        if (!model_has_mtp(m))
            fail("%s %s: the last window [4, %" PRIu32 ") has no MTP block", r->path, r->dev,
                 n_layer);
        int rc = model_mtp_draft(e, 1, 0, L_TOK, x, tokens, L_TOK, 1, out, lg);
        if (rc != 1)
            fail("%s %s: the last window: %d", r->path, r->dev, rc);
        same(r, "logits of the last window and of the whole model", L_TOK - 1, lg,
             A + (size_t)(L_TOK - 1) * V);
        model_exec_free(e);
        model_free(m);
    }
}

/* Every way of driving model_mtp_draft on one device, against the oracles and each other. */
static void run_device(struct run *r)
{
    const uint32_t E = r->o->E, V = r->o->V;
    struct model *m;
    struct model_exec *e;
    if (exec_open(&m, &e, r->path, -1, -1, r->dev, 32) < 0)
        return;
    float *A = malloc((size_t)L_TOK * V * sizeof *A), *B = malloc((size_t)L_TOK * V * sizeof *B);
    float *lg = malloc(V * sizeof *lg), *x = malloc((size_t)L_TOK * E * sizeof *x);
    int32_t out[1];
    int rc;
    if (!model_has_mtp(m))
        fail("%s %s: model_has_mtp false on the whole copy", r->path, r->dev);

    /* the main pass: x = the window's rows before the final norm, positions 0..L_TOK-1 */
    if ((rc = model_embed(e, tokens, L_TOK, x)) < 0 ||
        (rc = model_window_run(e, 1, 0, L_TOK, x)) < 0) {
        fail("%s %s: main pass: %d", r->path, r->dev, rc);
        goto out;
    }
    oracle_prompt(r, x);

    /* (A) one call: entries 0..q as one batch from position 0; the logits of entry q */
    for (uint32_t q = 0; q < L_TOK; q++) {
        rc = model_mtp_draft(e, 1, 0, L_TOK, x, tokens, q + 1, 1, out, A + (size_t)q * V);
        if (rc != 1 || out[0] != (int32_t)argmax_f(A + (size_t)q * V, V))
            fail("%s %s: one call up to entry %" PRIu32 ": %d drafts, draft %d", r->path,
                 r->dev, q, rc, out[0]);
    }
    /* (B) row by row: entry 0 alone, then entries 0 and 1 (a pass at position 0 writes both),
     * then each entry q + 1 from position q's row alone */
    if ((rc = model_mtp_draft(e, 1, 0, 1, x, tokens, 1, 1, out, B)) != 1)
        fail("%s %s: entry 0 alone: %d", r->path, r->dev, rc);
    for (uint32_t q = 0; q + 1 < L_TOK; q++) {
        rc = model_mtp_draft(e, 1, q, 1, x + (size_t)q * E, tokens, q + 2, 1, out,
                             B + (size_t)(q + 1) * V);
        if (rc != 1)
            fail("%s %s: row by row, entry %" PRIu32 ": %d", r->path, r->dev, q + 1, rc);
    }
    for (uint32_t q = 0; q < L_TOK; q++) {
        against_oracle(r, "row by row", q, B + (size_t)q * V);
        against_oracle(r, "one call", q, A + (size_t)q * V);
        same(r, "logits of one call and of row by row", q, A + (size_t)q * V, B + (size_t)q * V);
    }
    rounded_check(r);
    /* (C) two passes as a generation makes them: the prompt's rows with the token sampled
     * after them (entries 0..N_PROMPT), then the next rows in one call at position N_PROMPT */
    if ((rc = model_mtp_draft(e, 1, 0, N_PROMPT, x, tokens, N_PROMPT + 1, 1, out, lg)) != 1)
        fail("%s %s: first pass: %d", r->path, r->dev, rc);
    same(r, "logits of the first pass and of one call", N_PROMPT, lg, A + (size_t)N_PROMPT * V);
    rc = model_mtp_draft(e, 1, N_PROMPT, L_TOK - N_PROMPT, x + (size_t)N_PROMPT * E, tokens,
                         L_TOK, 1, out, lg);
    if (rc != 1)
        fail("%s %s: second pass: %d", r->path, r->dev, rc);
    same(r, "logits of the second pass and of one call", L_TOK - 1, lg,
         A + (size_t)(L_TOK - 1) * V);
    /* (D) chained drafts from every entry, (E) refusals, (F) other executors */
    for (uint32_t q0 = 0; q0 < L_TOK; q0++)
        chain(r, e, x, A, lg, q0);
    printf("  %s: %d chained drafts from each of %d entries: %" PRIu32 " = the rounded oracle's, %"
           PRIu32 " = the exact oracle's, %" PRIu32 " near ties not compared\n", r->dev,
           N_CHAIN, L_TOK, r->n_chain[0], r->n_chain[1], r->n_chain[2]);
    if (r->n_second * 3 < L_TOK * 2)
        fail("%s %s: only %" PRIu32 " of %d second drafts clear of a near tie (choose other "
             "tokens)", r->path, r->dev, r->n_second, L_TOK);
    refusals(r, e, x, A, lg);
    other_execs(r, model_get_hparams(m)->n_layer, x, A, lg);
    printf("  %s: exact oracle: max rel diff %.3g (bound %.3g), %" PRIu32 " argmaxes compared, "
           "%" PRIu32 " routing near-ties; the ways of writing an entry differ by %.3g\n",
           r->dev, r->worst, r->tr[0].tol, r->n_argmax, r->tr[0].n_ties, r->same_max);
out:
    free(x);
    free(A);
    free(B);
    free(lg);
    model_exec_free(e);
    model_free(m);
}

/* No MTP where the block is not: a window that is not the last, and the original model. */
static void no_mtp(const char *path, int first, int last, const char *what)
{
    struct model *m;
    struct model_exec *e;
    if (exec_open(&m, &e, path, first, last, "cpu", 32) < 0)
        return;
    float x[1] = {0};
    int32_t out[1];
    if (model_has_mtp(m))
        fail("%s: model_has_mtp true", what);
    int rc = model_mtp_draft(e, 1, 0, 1, x, tokens, 1, 1, out, NULL);
    if (rc != -ENOTSUP)
        fail("%s: model_mtp_draft %d, expected -ENOTSUP", what, rc);
    model_exec_free(e);
    model_free(m);
}

static void track_free(struct track *t)
{
    free(t->t.k);
    free(t->t.v);
    free(t->lg);
    free(t->h);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: tool-mtp-oracle COPY ORIGINAL\n");
        return 2;
    }
    const char *copy = argv[1], *orig = argv[2];
    struct oracle o;
    if (oracle_load(&o, copy) < 0)
        return 1;
    uint32_t wt = o.wq.type;
    if (wt != KERN_T_F16 && wt != KERN_T_Q8_0) {
        fail("%s: MTP weights of type %s: no bounds measured for it", copy, kern_type_name(wt));
        oracle_free(&o);
        return 1;
    }
    printf("%s: MTP block of %s weights, n_embd %" PRIu32 ", n_vocab %" PRIu32 ", %s\n", copy,
           kern_type_name(wt), o.E, o.V, o.X ? "MoE + shared expert" : "dense SwiGLU");
    static const char *const devs[] = {"cpu", "ref"};
    const size_t kvd = (size_t)o.n_head_kv * o.hd;
    for (size_t d = 0; d < sizeof devs / sizeof devs[0]; d++) {
        struct run r = {devs[d], copy, &o, {{.name = "exact"}, {.name = "rounded"}}, 0, {0, 0, 0}, 0, 0, 0};
        bool ok = true;
        for (int i = 0; i < 2; i++) {
            struct track *t = &r.tr[i];
            t->t = (struct otrack){&o, i == 1, i == 1 ? ROUTE_TIE_ROUNDED : ROUTE_TIE_EXACT,
                                   calloc(N_CTX * kvd, sizeof(double)),
                                   calloc(N_CTX * kvd, sizeof(double))};
            t->tol = i == 1 ? TOL_ROUND : wt == KERN_T_F16 ? TOL_EXACT_F16 : TOL_EXACT_Q8_0;
            t->lg = calloc((size_t)N_ENT * 2 * o.V, sizeof(double));
            t->h = calloc((size_t)N_ENT * 2 * o.E, sizeof(double));
            ok = ok && t->t.k && t->t.v && t->lg && t->h;
        }
        if (ok)
            run_device(&r);
        else
            fail("out of memory");
        track_free(&r.tr[0]);
        track_free(&r.tr[1]);
    }
    oracle_free(&o);
    no_mtp(copy, 0, 4, "the window [0, 4) of the copy");
    no_mtp(orig, -1, -1, "the original");
    if (n_fail) {
        printf("%d checks failed\n", n_fail);
        return 1;
    }
    printf("ok %s: the MTP logits match both oracles on cpu and ref; one call = row by row = two "
           "passes; chained drafts; refusals\n", copy);
    return 0;
}

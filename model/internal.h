/* model/internal.h — what model.c (architectures, weights) shares with exec.c (the forward
 * pass) and with tok_util.c (the error-message setter). Not a public interface. */
#ifndef KV_MODEL_INTERNAL_H
#define KV_MODEL_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kern.h"
#include "model/model.h"

/* Caps on hyperparameters read from a file (a file that needs more is refused). */
#define MODEL_MAX_LAYERS   4096u
#define MODEL_MAX_EMBD     (1u << 16)
#define MODEL_MAX_FF       (1u << 20)
#define MODEL_MAX_HEADS    1024u
#define MODEL_MAX_HEAD_DIM 1024u
#define MODEL_MAX_VOCAB    (1u << 22)
#define MODEL_MAX_CTX      (1u << 20)
#define MODEL_MAX_EXPERTS  4096u
#define MODEL_MAX_CONV     64u

/* A weight matrix: `rows` rows of `cols` elements of a ggml type, a view into the mapping.
 * y = W x takes x of length cols to y of length rows (GGUF ne[0] = cols, ne[1] = rows).
 * `at` is the same bytes as an operand of an executor's device: several executors may run one
 * model, so each binds its own copy of the weights once when it is made (model/exec.c); in
 * the model's own it stays {NULL, 0}. */
struct model_mat {
    const void *data;
    uint32_t type;
    uint32_t rows, cols;
    struct kern_at at;
};

/* An F32 weight vector (or a small F32 array: ssm_conv1d), a view into the mapping; `at` as
 * for struct model_mat. */
struct model_vec {
    const float *data;
    struct kern_at at;
};

/* The experts of a routed MoE tensor: n matrices of rows x cols, expert e's at
 * data + e * stride bytes (a 3-D GGUF tensor, read in place; a fused gate_up tensor gives two
 * views with the same stride), so at the same offset past expert 0's operand, in its buffer. */
struct model_exps {
    struct model_mat m;            /* expert 0 */
    uint32_t n;
    size_t stride;
};

/* The index of the largest of x[0..n) (the first of equals): greedy sampling and the MTP
 * block's drafts. */
static inline int32_t model_argmax(const float *x, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return (int32_t)best;
}

static inline struct model_mat model_expert(const struct model_exps *x, uint32_t e)
{
    struct model_mat r = x->m;
    r.data = (const uint8_t *)x->m.data + (size_t)e * x->stride;
    if (r.at.buf)
        r.at.off += (size_t)e * x->stride;
    return r;
}

/* One transformer block. q_dim = n_head * head_dim, kv_dim = n_head_kv * head_dim. */
struct model_layer {
    bool recurrent;                /* Gated DeltaNet mixer instead of attention (qwen35*) */
    bool attn_gated;               /* wq rows are per head [q | gate] (qwen35* full attention) */
    struct model_vec attn_norm;    /* [n_embd] */
    struct model_mat wq;           /* [q_dim][n_embd] */
    struct model_mat wk;           /* [kv_dim][n_embd] */
    struct model_mat wv;           /* [kv_dim][n_embd] */
    struct model_mat wo;           /* [n_embd][q_dim] */
    struct model_vec bq, bk, bv;   /* [q_dim], [kv_dim], [kv_dim] or absent (qwen2) */
    struct model_vec q_norm, k_norm; /* [head_dim] or absent (qwen3: per-head RMSNorm) */
    /* Gated DeltaNet (conv_dim = 2 * n_group * d_state + d_inner) */
    struct model_mat wqkv;         /* [conv_dim][n_embd] -> [q | k | v] */
    struct model_mat wz;           /* [d_inner][n_embd] output gate */
    struct model_mat w_beta;       /* [dt_rank][n_embd] */
    struct model_mat w_alpha;      /* [dt_rank][n_embd] */
    struct model_vec conv1d;       /* [conv_dim][conv_kernel]: channel c's taps, oldest first */
    struct model_vec dt_bias, ssm_a; /* [dt_rank] */
    struct model_vec ssm_norm;     /* [d_state] */
    struct model_mat ssm_out;      /* [n_embd][d_inner] */
    struct model_vec ffn_norm;     /* [n_embd] (post_attention_norm for qwen35*) */
    struct model_mat w_gate;       /* [n_ff][n_embd] (dense FFN) */
    struct model_mat w_up;         /* [n_ff][n_embd] */
    struct model_mat w_down;       /* [n_embd][n_ff] */
    /* routed experts (n_expert > 0) */
    struct model_mat gate_inp;     /* [n_expert][n_embd] router */
    struct model_exps gate_exps;   /* n_expert x [n_ff_exp][n_embd] */
    struct model_exps up_exps;     /* n_expert x [n_ff_exp][n_embd] */
    struct model_exps down_exps;   /* n_expert x [n_embd][n_ff_exp] */
    /* shared expert (qwen35moe) */
    struct model_mat gate_shexp, up_shexp;   /* [n_ff_shexp][n_embd] */
    struct model_mat down_shexp;   /* [n_embd][n_ff_shexp] */
    struct model_mat gate_inp_shexp; /* [1][n_embd] scalar gate */
    /* multi-token prediction (the MTP block only): the projection of
     * [enorm(embedding) | hnorm(hidden)] into the block, and the norm before the shared head */
    struct model_mat eh_proj;      /* [n_embd][2 n_embd] */
    struct model_vec enorm, hnorm; /* [n_embd] */
    struct model_vec head_norm;    /* [n_embd] shared_head_norm */
};

struct model {
    struct model_hparams hp;
    const struct model_arch *arch; /* the architecture table's entry for hp.arch */
    struct gguf_file *gf;          /* owns the mapping every pointer below points into */
    uint32_t first, last;          /* window [first, last) */
    bool has_embed, has_head;
    struct model_mat tok_embd;     /* [n_vocab][n_embd] (rank 0, or the head when tied) */
    struct model_vec output_norm;  /* [n_embd] (last rank) */
    struct model_mat output;       /* [n_vocab][n_embd] (last rank; = tok_embd when tied) */
    struct model_vec rope_freqs;   /* [n_rot/2] RoPE frequency divisors (Llama 3.1) or absent */
    struct model_layer *layers;    /* last - first blocks; layers[i] is block first + i */
    /* The first multi-token-prediction block (block n_layer), loaded on the last rank when the
     * file holds it and the token embedding it reads (has_mtp); never run in the main pass. */
    bool has_mtp;
    struct model_layer mtp;
    bool *recurrent;               /* [n_layer]: layer kind of every main-pass layer */
};


#endif

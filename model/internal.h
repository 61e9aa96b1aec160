/* model/internal.h — what model.c (architectures, weights) shares with exec.c (the forward
 * pass). Not a public interface. */
#ifndef KV_MODEL_INTERNAL_H
#define KV_MODEL_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "model/model.h"

/* Caps on hyperparameters read from a file (a file that needs more is refused). */
#define MODEL_MAX_LAYERS   4096u
#define MODEL_MAX_EMBD     (1u << 16)
#define MODEL_MAX_FF       (1u << 20)
#define MODEL_MAX_HEADS    1024u
#define MODEL_MAX_HEAD_DIM 1024u
#define MODEL_MAX_VOCAB    (1u << 22)
#define MODEL_MAX_CTX      (1u << 20)

/* A weight matrix: `rows` rows of `cols` elements of a ggml type, a view into the mapping.
 * y = W x takes x of length cols to y of length rows (GGUF ne[0] = cols, ne[1] = rows). */
struct model_mat {
    const void *data;
    uint32_t type;
    uint32_t rows, cols;
};

/* One transformer block. q_dim = n_head * head_dim, kv_dim = n_head_kv * head_dim. */
struct model_layer {
    const float *attn_norm;        /* [n_embd] */
    struct model_mat wq;           /* [q_dim][n_embd] */
    struct model_mat wk;           /* [kv_dim][n_embd] */
    struct model_mat wv;           /* [kv_dim][n_embd] */
    struct model_mat wo;           /* [n_embd][q_dim] */
    const float *bq, *bk, *bv;     /* [q_dim], [kv_dim], [kv_dim] or NULL (qwen2) */
    const float *q_norm, *k_norm;  /* [head_dim] or NULL (qwen3: per-head RMSNorm) */
    const float *ffn_norm;         /* [n_embd] */
    struct model_mat w_gate;       /* [n_ff][n_embd] */
    struct model_mat w_up;         /* [n_ff][n_embd] */
    struct model_mat w_down;       /* [n_embd][n_ff] */
};

struct model {
    struct model_hparams hp;
    struct gguf_file *gf;          /* owns the mapping every pointer below points into */
    uint32_t first, last;          /* window [first, last) */
    bool has_embed, has_head;
    struct model_mat tok_embd;     /* [n_vocab][n_embd] (rank 0, or the head when tied) */
    const float *output_norm;      /* [n_embd] (last rank) */
    struct model_mat output;       /* [n_vocab][n_embd] (last rank; = tok_embd when tied) */
    const float *rope_freqs;       /* [n_rot/2] RoPE frequency divisors (Llama 3.1) or NULL */
    struct model_layer *layers;    /* last - first blocks; layers[i] is block first + i */
};

#endif

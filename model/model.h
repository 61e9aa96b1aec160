/* model — what the tensors mean: architecture hyperparameters from GGUF metadata, the weights
 * of a layer window (mapped, never copied), the window executor with per-session KV/state,
 * the rank-0 embedding and last-rank head, the sampler, and the tokenizer.
 *
 * The same code serves a one-process run (one window covering every layer) and each stage
 * of a ring: rank 0 calls model_embed, every stage model_window_run on the boundary rows,
 * the last rank model_head and the sampler.
 *
 * Sections: [window + executor + sampler], [tokenizer], [generation] and [chat templates].
 */
#ifndef KV_MODEL_H
#define KV_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct gguf_file;
struct kern_cl_opts;


/* ======================= window + executor + sampler ======================= */

/* A hybrid's (qwen35, qwen35moe) full_attention_interval when its file does not say, as
 * llama.cpp defaults it: every fourth block is full attention. */
#define MODEL_FULL_ATTN_INTERVAL_DEFAULT 4u

struct model_hparams {
    char arch[32];            /* "llama", "qwen2", "qwen3", "qwen3moe", "qwen35", "qwen35moe" */
    uint32_t n_layer;         /* layers of the main pass: block_count - nextn_predict_layers.
                               * Windows, rings and manifests count these; the MTP blocks
                               * blk.n_layer.. never run in the main pass (the last window
                               * loads the first as its drafter: model_has_mtp). */
    uint32_t n_embd, n_ff, n_head, n_head_kv, head_dim, n_vocab, n_ctx_train;
    uint32_t n_rot;
    float rms_eps, rope_base, rope_scale;
    bool rope_neox;
    /* MoE and the Gated DeltaNet hybrid (0 when the model has none) */
    uint32_t n_block;         /* <arch>.block_count as in the file (n_layer + n_nextn) */
    uint32_t n_nextn;         /* nextn_predict_layers: multi-token-prediction blocks */
    uint32_t n_expert, n_expert_used, n_ff_exp, n_ff_shexp;
    uint32_t full_attn_interval; /* hybrid: layer i is full attention iff (i+1) % it == 0 */
    uint32_t ssm_conv_kernel, ssm_d_state, ssm_n_group, ssm_dt_rank, ssm_d_inner;
};

/* ---- architectures: one table of the tensors each architecture's blocks hold ----
 *
 * The one description of every supported architecture's tensors: model_open binds the
 * weights from it, the planner sizes a model it has only hyperparameters for from it, and
 * `kvctl synth` writes files from it. Plain data; a tensor's dimensions are hyperparameter
 * expressions (enum model_dim), evaluated by model_dim_value. */

/* A tensor dimension as a function of the hyperparameters. */
enum model_dim {
    MODEL_DIM_ONE = 0,       /* 1 (an unused dimension) */
    MODEL_DIM_EMBD,          /* n_embd */
    MODEL_DIM_EMBD2,         /* 2 n_embd (the MTP projection of [embedding | hidden]) */
    MODEL_DIM_VOCAB,         /* n_vocab */
    MODEL_DIM_FF,            /* n_ff */
    MODEL_DIM_Q,             /* n_head * head_dim */
    MODEL_DIM_Q_GATED,       /* 2 n_head * head_dim: per head [q | gate] */
    MODEL_DIM_KV,            /* n_head_kv * head_dim */
    MODEL_DIM_HEAD,          /* head_dim */
    MODEL_DIM_ROT_PAIRS,     /* n_rot / 2 */
    MODEL_DIM_EXPERT,        /* n_expert */
    MODEL_DIM_FF_EXP,        /* n_ff_exp */
    MODEL_DIM_FF_EXP2,       /* 2 n_ff_exp (gate and up experts fused) */
    MODEL_DIM_FF_SHEXP,      /* n_ff_shexp */
    MODEL_DIM_CONV,          /* 2 ssm_n_group * ssm_d_state + ssm_d_inner (q | k | v channels) */
    MODEL_DIM_CONV_KERNEL,   /* ssm_conv_kernel */
    MODEL_DIM_INNER,         /* ssm_d_inner */
    MODEL_DIM_DT_RANK,       /* ssm_dt_rank (value heads) */
    MODEL_DIM_STATE,         /* ssm_d_state */
};

/* How the runtime reads a tensor. */
enum model_form {
    MODEL_FORM_VEC = 1,      /* 1-D f32 vector */
    MODEL_FORM_ARR,          /* 2-D f32 array (ssm_conv1d) */
    MODEL_FORM_MAT,          /* weight matrix of any kernel type: ne [cols, rows] */
    MODEL_FORM_EXPS,         /* routed experts, ne [cols, rows, n_expert] */
    MODEL_FORM_EXPS2,        /* two routed-expert tensors fused along ne[1] (gate | up) */
};

enum {
    MODEL_TF_F32 = 1,        /* llama.cpp keeps it f32 (norms, biases, routers, SSM params) */
    MODEL_TF_OPTIONAL = 2,   /* may be absent; files we write leave it out */
    MODEL_TF_UNTIED = 4,     /* absent when the head reuses token_embd (tied embeddings) */
    MODEL_TF_UNFUSED = 8,    /* absent when the fused MODEL_FORM_EXPS2 tensor is there */
    MODEL_TF_EMBED = 16,     /* a global tensor the embedding (rank 0) reads */
    MODEL_TF_HEAD = 32,      /* a global tensor the head (last rank) reads */
};

struct model_tensor_desc {
    const char *name;        /* block tensors: the part after "blk.N."; globals: the name */
    uint8_t n_dims;          /* as llama.cpp writes it */
    uint8_t dims[3];         /* enum model_dim of ne[0], ne[1], ne[2] (MODEL_DIM_ONE past n_dims) */
    uint8_t form;            /* enum model_form */
    uint8_t flags;           /* MODEL_TF_* */
    uint16_t field;          /* model's own: where model_open stores the view (others ignore it) */
};

enum model_layer_kind {
    MODEL_LAYER_ATTN = 0,    /* full (softmax) attention block */
    MODEL_LAYER_RECURRENT,   /* Gated DeltaNet block (hybrid architectures) */
    MODEL_LAYER_KINDS
};

struct model_arch {
    const char *name;        /* general.architecture */
    bool rope_neox;          /* rotate pairs (i, i + n_rot/2) instead of (2i, 2i+1) */
    bool qkv_bias;           /* attn_q/k/v.bias required */
    bool qk_norm;            /* attn_q_norm / attn_k_norm required (per-head RMSNorm before RoPE) */
    bool moe;                /* routed experts instead of the dense FFN */
    bool hybrid;             /* Gated DeltaNet layers + gated full attention (qwen35 family) */
    bool shexp;              /* shared expert with a sigmoid gate */
    /* per layer kind: the block's tensors in file order, ended by a NULL name (NULL list:
     * the architecture has no such layers) */
    const struct model_tensor_desc *layer[MODEL_LAYER_KINDS];
};

/* The global (non-block) tensors: those written before the blocks (token_embd, ...) and after
 * them (output_norm, output), each list ended by a NULL name. Every architecture has them. */
extern const struct model_tensor_desc model_tensors_input[], model_tensors_output[];
/* What a multi-token-prediction block holds on top of a full-attention block. */
extern const struct model_tensor_desc model_tensors_nextn[];

/* The supported architectures (borrowed, static): *n of them. */
const struct model_arch *model_arch_list(size_t *n);
/* The architecture named name, or NULL. */
const struct model_arch *model_arch_find(const char *name);
/* "llama, qwen2, ...": the supported names, for messages, into buf[n] (cut to fit). */
void model_arch_names(char *buf, size_t n);
/* The value of a dimension expression for hp (0 for an unknown expression). */
uint64_t model_dim_value(const struct model_hparams *hp, uint8_t dim);
/* The layer kind of main-pass layer il when the schedule is hp->full_attn_interval (hybrid:
 * layer il is full attention iff (il + 1) % interval == 0). */
enum model_layer_kind model_arch_layer_kind(const struct model_arch *a,
                                            const struct model_hparams *hp, uint32_t il);

/* One tensor of a file of the architecture: its full name, dims and ne (ne[d] = 1 past
 * n_dims), and its description. Return a negative code to stop. */
typedef int (*model_tensor_cb)(void *ud, const char *name, const struct model_tensor_desc *d,
                               const uint64_t ne[4]);
/* Walk the tensors a file of architecture a with hyperparameters hp holds, in file order:
 * the input globals, blocks 0 .. n_block - 1 (hp->n_layer main-pass blocks, then the
 * n_nextn MTP blocks: full attention plus model_tensors_nextn), the output globals. Optional
 * tensors are left out, gate and up experts are written apart, output.weight only when not
 * tied. cb may be NULL (count only). Returns the number of tensors, or cb's negative code. */
int model_arch_tensors(const struct model_arch *a, const struct model_hparams *hp, bool tied,
                       model_tensor_cb cb, void *ud);

struct model;       /* opaque: hparams + mapped weights of one window */
struct model_exec;  /* opaque: scratch, thread pool, sessions (KV / state) of one window */

/* Open path (full GGUF or stage mini-GGUF) for layers [first, last); first = last = -1 takes
 * the whole model, or the mini-GGUF's own window. Maps only the window's tensors (plus
 * token_embd when first == 0 and the head when last == n_layer). */
int model_open(struct model **out, const char *path, int first, int last, char *err, size_t errlen);
void model_free(struct model *m);
const struct model_hparams *model_get_hparams(const struct model *m);
void model_get_window(const struct model *m, uint32_t *first, uint32_t *last);
bool model_has_embed(const struct model *m);
bool model_has_head(const struct model *m);
/* The parsed file (borrowed, lives as long as m): metadata for the tokenizer and others. */
const struct gguf_file *model_get_gguf(const struct model *m);
/* K/V bytes one session needs per position for the window's full-attention layers (F16 K
 * and V; recurrent layers keep none). */
uint64_t model_kv_bytes_per_token(const struct model *m);
/* Fixed bytes one session keeps for the window's recurrent (Gated DeltaNet) layers: conv
 * state and S, F32, independent of the context length; 0 for attention-only windows. */
uint64_t model_state_bytes(const struct model *m);
/* Bytes of weights one generated token reads: the window's layers (for MoE: router, the
 * n_expert_used selected experts and the shared expert), plus the head's norm and output
 * matrix on the last rank (one embedding row is not counted). */
uint64_t model_weight_bytes(const struct model *m);
/* Bytes of all routed-expert tensors of the window (memory, not time per token). */
uint64_t model_expert_bytes(const struct model *m);
/* true when main-pass layer il is a Gated DeltaNet (linear-attention) layer. */
bool model_layer_is_recurrent(const struct model *m, uint32_t il);

/* Executor: n_ctx bounds every session's positions; max_batch bounds the rows computed at
 * once (longer runs are done in chunks). n_threads <= 0: one per CPU. One call at a time per
 * executor (it owns one scratch state); sessions are independent. */
int model_exec_new(struct model_exec **out, struct model *m, int n_threads, uint32_t n_ctx,
                   uint32_t max_batch);
/* The executor's settings: model_exec_new's, plus the device its forward pass runs on. */
struct model_exec_opts {
    const char *device;      /* a kernel device ("cpu", "ref", "opencl"; docs/devices.md);
                                NULL: "cpu" */
    int n_threads;           /* <= 0: one per CPU */
    uint32_t n_ctx, max_batch;
    const struct kern_cl_opts *cl;  /* the opencl device's settings (kernels/kern.h), read
                                       while the executor is made; NULL: the environment's */
};
/* Fills o with the defaults: "cpu", one thread per CPU, n_ctx 512, max_batch 32. */
void model_exec_opts_default(struct model_exec_opts *o);
/* model_exec_new with o's device: the weights become buffers of the device (views on "cpu"),
 * sessions' K/V and state and the scratch live in its memory, and only the boundary rows
 * (embed out, window in and out, logits out) cross to the host. 0, -EINVAL, -ENODEV (an
 * unknown device), -ENOMEM; a message in err. */
int model_exec_new_opts(struct model_exec **out, struct model *m,
                        const struct model_exec_opts *o, char *err, size_t errlen);
void model_exec_free(struct model_exec *e);
int model_exec_threads(const struct model_exec *e);
/* The name of the device the executor runs on (static). */
const char *model_exec_device(const struct model_exec *e);
/* The kernel device itself (for its facts, e.g. kern_cl_info); borrowed, lives as long as e. */
const struct kern_dev *model_exec_kern_dev(const struct model_exec *e);
int model_session_new(struct model_exec *e, uint64_t id);   /* -EEXIST, -ENOMEM */
int model_session_free(struct model_exec *e, uint64_t id);  /* -ENOENT */
/* Positions the session holds (the next position to run), 0 for an unknown id. */
uint32_t model_session_pos(struct model_exec *e, uint64_t id);
/* Whether a session may rewind to any earlier position (model_window_run): true unless the
 * window has recurrent layers, whose state cannot go back (a rewind to 0 only). Drafting needs
 * it to drop the rows of rejected drafts. */
bool model_exec_can_rewind(const struct model_exec *e);
/* A checkpoint of session id at its position now (its recurrent state copied to the host; a
 * window without recurrent layers keeps only the position), and the session put back to it:
 * drafting on a hybrid model checkpoints before a pass of drafts and, when one is rejected,
 * restores and runs the accepted rows again. 0, -ENOENT (unknown session; restore: -EINVAL
 * without a checkpoint), -ENOMEM, or a device's error. The host copy is n_rec x (conv +
 * DeltaNet state) bytes a session, kept until the session ends. */
int model_session_checkpoint(struct model_exec *e, uint64_t id);
int model_session_restore(struct model_exec *e, uint64_t id);
/* Rank 0: out[n][n_embd] = embeddings of tokens (-EINVAL for an id outside the vocabulary,
 * -ENOTSUP when the window has no embedding). */
int model_embed(struct model_exec *e, const int32_t *tokens, uint32_t n, float *out);
/* Run the window's layers on x[n][n_embd] in place for session id at positions pos..pos+n-1.
 * pos may rewind (pos <= model_session_pos: later positions are overwritten) but not skip
 * (-EINVAL). -ERANGE past the context, -ENOENT unknown session, or a kernel's error (the
 * session then holds the positions before the failed batch). */
int model_window_run(struct model_exec *e, uint64_t id, uint32_t pos, uint32_t n, float *x);
/* One row of a batch across sessions: session id at position pos. */
struct model_batch_row {
    uint64_t id;
    uint32_t pos;
};
/* Run the window's layers on x[n][n_embd] in place, row i for rows[i].id at rows[i].pos: decode
 * steps of several sessions and prefill chunks in one pass, each weight matrix read once for
 * all n rows; attention, recurrent state and RoPE positions are per session. A session's rows
 * are consecutive in the batch at consecutive positions (a session appears once); its first
 * position follows the model_window_run rules (rewind allowed, no skip). n <= max_batch.
 * Every row is checked before anything runs: -ENOENT unknown session, -EINVAL (n > max_batch,
 * rows of a session not consecutive, a skip or a forbidden rewind), -ERANGE past the context;
 * no state changes then. A kernel's error leaves each session at its positions before the
 * batch. A row's result is bit-identical to a model_window_run of it alone where the weight
 * types' matmuls are row-exact for n rows on the executor's device (kern_dev_rows_exact:
 * every type, F32 on cpu and every type on opencl with prompt GEMMs only under 16 rows). */
int model_window_run_batch(struct model_exec *e, const struct model_batch_row *rows, uint32_t n,
                           float *x);
/* Last rank: logits[n][n_vocab] from x[n][n_embd] (final norm + output head; -ENOTSUP when
 * the window has no head, or a kernel's error). */
int model_head(struct model_exec *e, const float *x, uint32_t n, float *logits);

/* Multi-token prediction (docs/model.md, "Drafting"). Whether the window holds the model's
 * first MTP block (Qwen3.5's nextn block): the last window of a file that has the block and
 * token_embd, which the block reads. Its K/V is one more full-attention layer's a session
 * (model_kv_bytes_per_token counts it). */
bool model_has_mtp(const struct model *m);
/* Last rank with the MTP block: feed it what session id's main pass just gave, and draft.
 * The pass ran positions pos..pos+n-1 and x[n][n_embd] is its output (the window's rows
 * before the final norm; only rows whose tokens stand); hist[0..n_hist) is the session's
 * tokens, prompt first, its last the token sampled after those rows (a prompt chunk that
 * samples nothing: the prompt). The block keeps one entry a position: entry p embeds token p
 * with the normalised hidden row of position p - 1 (zeros at 0), as llama.cpp's MTP graph.
 * This writes the entries from pos + 1 (from 0 when pos is 0) up to min(pos + n, n_hist - 1);
 * when that reaches n_hist - 1 and k > 0, it drafts up to k tokens into out, greedy: the
 * first from that entry's logits (into logits[n_vocab] too, when not NULL), each next from an
 * entry of the previous draft and the block's own output, all below n_ctx. Returns how many
 * drafts, or -ENOTSUP (no MTP block), -ENOENT, -EINVAL (an entry before pos + 1 was never
 * written, or a token outside the vocabulary), -ERANGE (past the context), a kernel's error. */
int model_mtp_draft(struct model_exec *e, uint64_t id, uint32_t pos, uint32_t n, const float *x,
                    const int32_t *hist, uint32_t n_hist, uint32_t k, int32_t *out,
                    float *logits);

struct model_sampler_params {
    uint64_t seed;
    float temperature;        /* <= 0: greedy */
    int32_t top_k;            /* <= 0: off */
    float top_p;              /* >= 1: off */
    float min_p;              /* <= 0: off */
    float repeat_penalty;     /* 1: off */
    float freq_penalty, presence_penalty; /* 0: off */
    int32_t penalty_last_n;   /* tokens looked back for penalties (<= 0: penalties off) */
};
void model_sampler_params_default(struct model_sampler_params *p);
struct model_sampler;
int model_sampler_new(struct model_sampler **out, const struct model_sampler_params *p,
                      uint32_t n_vocab);
void model_sampler_free(struct model_sampler *s);
/* Move the RNG past n draws, as if n tokens had been sampled at temperature > 0: a sampler
 * rebuilt for a replayed history continues the sequence the first one was drawing. */
void model_sampler_skip(struct model_sampler *s, uint64_t n);
/* Record a token as part of the history (prompt and generated) for the penalties. */
void model_sampler_accept(struct model_sampler *s, int32_t token);
/* Sample from logits[n_vocab] (modified in place); *logprob may be NULL. Returns the token,
 * or a negative code when no token is possible (all logits -inf / NaN). */
int32_t model_sampler_sample(struct model_sampler *s, float *logits, float *logprob);
/* The set sampling would draw from for these logits (penalties, top-k, top-p, min-p,
 * temperature applied; logits modified in place): *ids best first and *probs summing to 1,
 * borrowed until the next call. Returns how many (>= 1) or a negative code. */
int model_sampler_kept(struct model_sampler *s, float *logits, const int32_t **ids,
                       const float **probs);

/* ================================ tokenizer ================================ */

/* Vocabularies read entirely from GGUF metadata (tokenizer.ggml.*), tokenising exactly as
 * llama.cpp does: SPM (tokenizer.ggml.model "llama": scores, byte fallback, the leading-space
 * rule) and byte-level BPE ("gpt2": merge ranks and the pre-tokenizer regexes selected by
 * tokenizer.ggml.pre, run with PCRE2). Special tokens in the text are recognised only when
 * asked (parse_special); user-defined tokens always are, as in llama.cpp. A loaded vocabulary
 * is immutable: every call below may run on any number of threads at once. See
 * docs/tokenizer.md. */

enum model_vocab_type { MODEL_VOCAB_SPM = 1, MODEL_VOCAB_BPE = 2 };

struct model_vocab; /* opaque */

/* Load the vocabulary of f (borrowed only during the call; the vocabulary copies what it
 * keeps). Returns 0, or a negative errno with err naming the field, the value and the limit
 * (-EINVAL malformed metadata, -ENOTSUP a tokenizer model or pre-tokenizer we do not have). */
int model_vocab_load(struct model_vocab **out, const struct gguf_file *f, char *err, size_t errlen);
void model_vocab_free(struct model_vocab *v);

enum model_vocab_type model_vocab_get_type(const struct model_vocab *v);
uint32_t model_vocab_n_tokens(const struct model_vocab *v);
/* tokenizer.ggml.pre as named in the file ("default" for SPM or when absent). Borrowed. */
const char *model_vocab_pre(const struct model_vocab *v);
/* Special ids, -1 when the vocabulary has none. */
int32_t model_vocab_bos(const struct model_vocab *v);
int32_t model_vocab_eos(const struct model_vocab *v);
int32_t model_vocab_eot(const struct model_vocab *v);
int32_t model_vocab_pad(const struct model_vocab *v);
int32_t model_vocab_unk(const struct model_vocab *v);
bool model_vocab_add_bos(const struct model_vocab *v);
bool model_vocab_add_eos(const struct model_vocab *v);
/* End of generation: EOS, EOT, EOM and the end-like control tokens llama.cpp stops on. */
bool model_vocab_is_eog(const struct model_vocab *v, int32_t id);
/* Control or unknown-type token (printed only when special text is asked for). */
bool model_vocab_is_control(const struct model_vocab *v, int32_t id);
/* Raw token text as stored in the file (not NUL-terminated), NULL for an id out of range. */
const char *model_vocab_text(const struct model_vocab *v, int32_t id, size_t *len);
/* Id of the token whose raw text is s[0..len) (the last one when several share it), or -1. */
int32_t model_vocab_find(const struct model_vocab *v, const char *s, size_t len);

/* Tokenise text[0..len) (any bytes). add_special adds BOS/EOS as the vocabulary asks;
 * parse_special turns control-token text ("<|im_end|>") into those tokens. Writes at most max
 * ids to out and the full count to *n; returns 0, or -ENOSPC when max < *n (nothing else is
 * wrong: call again with *n slots), -ENOMEM. */
int model_tokenize(const struct model_vocab *v, const char *text, size_t len, bool add_special,
                   bool parse_special, int32_t *out, size_t max, size_t *n);
/* A prompt's tokens as rank 0 and the API take them (special tokens added and parsed) into
 * *out (malloc'd, the caller frees) and *n: 0, -ENOMEM or -E2BIG (over UINT32_MAX). */
int model_tokenize_alloc(const struct model_vocab *v, const char *text, int32_t **out,
                         uint32_t *n);

/* The bytes one token stands for (byte tokens give one byte, which may be part of a UTF-8
 * character). Control/unknown tokens give "" unless special. Borrowed, lives as long as v;
 * NULL (with *len 0) for an id out of range. */
const char *model_token_piece(const struct model_vocab *v, int32_t id, bool special, size_t *len);

/* Whole-sequence detokenisation (llama.cpp's llama_detokenize). The SPM leading space of the
 * first piece is stripped (so decode what follows a BOS, not the BOS, to get a text back).
 * Flags: MODEL_DETOK_REMOVE_SPECIAL drops a leading BOS / trailing EOS the vocabulary adds (the
 * space then stays, as in llama.cpp); MODEL_DETOK_SPECIAL prints control tokens;
 * MODEL_DETOK_CLEAN_SPACES applies the clean-up some BPE vocabularies ask for (no space before
 * "? ! . ," and "'s 'm 're 've"), which llama_detokenize does and which can make the text differ
 * from the one tokenised. Writes at most cap bytes (no NUL) and the full length to *len;
 * returns 0, -ENOSPC (call again with *len bytes) or -ERANGE (an id out of range). */
enum {
    MODEL_DETOK_REMOVE_SPECIAL = 1,
    MODEL_DETOK_SPECIAL = 2,
    MODEL_DETOK_CLEAN_SPACES = 4,
};
int model_detokenize(const struct model_vocab *v, const int32_t *ids, size_t n, unsigned flags,
                     char *buf, size_t cap, size_t *len);

/* Streaming detokeniser: feed tokens one at a time, get back text that never ends inside a
 * UTF-8 character and never holds a broken sequence (invalid bytes become U+FFFD).
 * strip_leading_space: drop the SPM leading space of the first piece (set it when the stream
 * starts at the beginning of a text, not when it continues a prompt). */
struct model_detok;
int model_detok_new(struct model_detok **out, const struct model_vocab *v, bool special,
                    bool strip_leading_space);
void model_detok_free(struct model_detok *d);
/* Append one token; *text and *len receive the complete characters now available (borrowed,
 * valid until the next call on d). 0, -ERANGE for an id out of range, -ENOMEM. */
int model_detok_push(struct model_detok *d, int32_t id, const char **text, size_t *len);
/* End of stream: whatever is pending (an unfinished character becomes U+FFFD). */
int model_detok_flush(struct model_detok *d, const char **text, size_t *len);

/* ================================ generation ================================ */

/* The bookkeeping of one generation, as rank 0 of a ring and a one-process run keep it: the
 * token history (prompt, then generated), the streamed text (model_detok), stop strings and
 * the reason the generation ends. It runs and samples nothing: the caller pushes each sampled
 * token and is told what text to emit and whether to stop. Conditions, in the order they are
 * checked after each token: end of generation (the vocabulary's EOS/EOT list, or the eos id
 * without a vocabulary; the token is not part of the text), max_gen tokens generated, the
 * context full (prompt + generated = n_ctx), a stop string in the generated text (the token
 * that completes it is emitted). */

enum model_gen_reason {
    MODEL_GEN_RUNNING = 0,
    MODEL_GEN_EOS,      /* "eos" */
    MODEL_GEN_LENGTH,   /* "length" */
    MODEL_GEN_CONTEXT,  /* "context" */
    MODEL_GEN_STOP,     /* "stop": a stop string */
    MODEL_GEN_ERROR,    /* "error": model_gen_fail */
};

#define MODEL_GEN_MAX_STOPS 16   /* stop strings at most */
#define MODEL_GEN_STOP_MAX 255   /* bytes of one stop string at most */

struct model_gen_params {
    uint32_t n_ctx;     /* positions: the history holds at most n_ctx tokens */
    uint32_t max_gen;   /* tokens to generate; 0 ends at once (length) */
    int32_t eos;        /* end-of-text id used without a vocabulary, -1 none */
    bool ignore_eos;    /* never stop at end-of-text tokens */
};

struct model_gen;
/* v (may be NULL: no text, no stop strings) is borrowed for g's life. The prompt's
 * n_prompt ids (1 <= n_prompt < n_ctx, else -EINVAL) are copied into the history. -ENOMEM. */
int model_gen_new(struct model_gen **out, const struct model_vocab *v,
                  const struct model_gen_params *p, const int32_t *prompt, uint32_t n_prompt);
void model_gen_free(struct model_gen *g);
/* Stop strings, copied (replacing earlier ones): -EINVAL for more than MODEL_GEN_MAX_STOPS or
 * one empty or longer than MODEL_GEN_STOP_MAX bytes, -ENOMEM. A match is searched only in the
 * tail of the text where one can start after the newest piece. */
int model_gen_set_stops(struct model_gen *g, const char *const *stops, uint32_t n);

struct model_gen_step {
    const char *text;   /* the text this token completes (borrowed until the next call on g);
                         * NULL without a vocabulary, "" when nothing is complete yet */
    size_t len;
    bool emit;          /* the token is output (false for the end-of-text token) */
    enum model_gen_reason reason;   /* MODEL_GEN_RUNNING: generate the next one */
};
/* Record the sampled token tok: appended to the history, its text streamed (a token the
 * detokeniser refuses adds no text), the stop conditions checked. 0, or -EINVAL when g has
 * already ended. */
int model_gen_push(struct model_gen *g, int32_t tok, struct model_gen_step *st);
/* End with an error (reason MODEL_GEN_ERROR) unless g has already ended. */
void model_gen_fail(struct model_gen *g);
enum model_gen_reason model_gen_reason(const struct model_gen *g);
/* "eos", "length", "context", "stop", "error" ("" while running). Static. */
const char *model_gen_reason_name(enum model_gen_reason r);
/* The history, prompt first (borrowed, valid until the next push); its length in *n. */
const int32_t *model_gen_history(const struct model_gen *g, uint32_t *n);
uint32_t model_gen_n_prompt(const struct model_gen *g);
/* Prompt-lookup drafting (speculative decoding, docs/model.md "Drafting"): up to k tokens that
 * followed an earlier occurrence of the history's last n-gram (the longest n from
 * MODEL_DRAFT_NGRAM_MAX down to 1 that occurs; of its occurrences the most recent with k tokens
 * after it, else the one with the most) into out; how many. Any model, no extra weights:
 * it pays on text that repeats itself (code, lists, summaries, a story's names). */
#define MODEL_DRAFT_NGRAM_MAX 4
#define MODEL_DRAFT_MAX 14   /* rows verified in one pass: k + 1 <= KERN_ROWS_EXACT_MAX (15),
                              * where every weight type's matmul is row-exact on every device
                              * (F32 included: kern_dev_rows_exact), so a verified row is the
                              * row a one-row step would give */
uint32_t model_draft_lookup(const int32_t *hist, uint32_t n, uint32_t k, int32_t *out);
/* Drafting modes: none; prompt lookup (model_draft_lookup); the model's MTP block
 * (model_mtp_draft: models that have one); auto: the MTP block where the model has one,
 * else prompt lookup. */
enum model_draft {
    MODEL_DRAFT_NONE = 0,
    MODEL_DRAFT_LOOKUP = 1,
    MODEL_DRAFT_MTP = 2,
    MODEL_DRAFT_AUTO = 3,
};
/* A drafting mode's name, as every option and request field spells it ("none", "lookup",
 * "mtp", "auto"): its enum model_draft, -EINVAL for anything else (NULL included). */
int model_draft_mode(const char *name);
uint32_t model_gen_n_gen(const struct model_gen *g);
/* Whatever text is pending at the end (an unfinished UTF-8 character becomes U+FFFD):
 * borrowed until the next call; *text NULL without a vocabulary. 0 or -ENOMEM. */
int model_gen_flush(struct model_gen *g, const char **text, size_t *len);

/* ================================ chat templates ================================ */

/* A conversation rendered as the model's tokenizer.chat_template renders it (docs/chat.md):
 * the families chatml (Qwen), llama3, llama2, mistral, phi3 and gemma, recognised from the
 * template text, each rendered byte for byte as its Jinja template does. Roles are "system",
 * "user" and "assistant" (another is -EINVAL); a conversation the template
 * refuses (roles that do not alternate, a system message where none is allowed) is -EINVAL.
 *
 * BOS: the rendered text holds the BOS token's text exactly when the template emits
 * bos_token (llama3, llama2, mistral, gemma, some phi3). Tokenise it with parse_special and
 * add_special = !model_chat_has_bos(g, text), so that BOS is never doubled. */

struct model_chat_msg { const char *role; const char *content; };  /* NULL content is "" */

/* Renders msgs with the model's tokenizer.chat_template (family recognised from the
 * template text) or, when name != NULL, with the named family ("chatml", "llama3",
 * "llama2", "mistral", "phi3", "gemma"); add_assistant appends the assistant prefix.
 * *out is malloc'd NUL-terminated text; -ENOTSUP with the family/template named in err
 * when unknown. */
int model_chat_render(char **out, const struct gguf_file *g, const char *name,
                      const struct model_chat_msg *msgs, size_t n, bool add_assistant,
                      char *err, size_t errlen);
/* The same from a template text (NULL: only a name will do) and the BOS/EOS token texts
 * (NULL: the family's usual ones). */
int model_chat_render_text(char **out, const char *tmpl, const char *name, const char *bos,
                           const char *eos, const struct model_chat_msg *msgs, size_t n,
                           bool add_assistant, char *err, size_t errlen);
/* The family a template text belongs to (*name static: "chatml", ...): 0 or -ENOTSUP. */
int model_chat_family(const char *tmpl, const char **name);
/* Whether text starts with g's BOS token text (then tokenise it without adding BOS). */
bool model_chat_has_bos(const struct gguf_file *g, const char *text);
/* The names --chat-template takes, ", "-separated, into buf[n] (truncated to fit). */
void model_chat_names(char *buf, size_t n);

#endif

/* model — what the tensors mean: architecture hyperparameters from GGUF metadata, the weights
 * of a layer window (mapped, never copied), the window executor with per-session KV/state,
 * the rank-0 embedding and last-rank head, the sampler, and the tokenizer.
 *
 * The same code serves a one-process run (one window covering every layer) and each stage
 * of a ring: rank 0 calls model_embed, every stage model_window_run on the boundary rows,
 * the last rank model_head and the sampler.
 *
 * Sections: [window + executor + sampler] and [tokenizer].
 */
#ifndef KV_MODEL_H
#define KV_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct gguf_file;

#define MODEL_ERR_LEN 256

/* ======================= window + executor + sampler ======================= */

struct model_hparams {
    char arch[32];            /* "llama", "qwen2", "qwen3", "qwen3moe", "qwen35", "qwen35moe" */
    uint32_t n_layer;         /* layers of the main pass: block_count - nextn_predict_layers.
                               * Windows, rings and manifests count these; the MTP blocks
                               * blk.n_layer.. are never mapped or run. */
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
void model_exec_free(struct model_exec *e);
int model_exec_threads(const struct model_exec *e);
int model_session_new(struct model_exec *e, uint64_t id);   /* -EEXIST, -ENOMEM */
int model_session_free(struct model_exec *e, uint64_t id);  /* -ENOENT */
/* Positions the session holds (the next position to run), 0 for an unknown id. */
uint32_t model_session_pos(struct model_exec *e, uint64_t id);
/* Rank 0: out[n][n_embd] = embeddings of tokens (-EINVAL for an id outside the vocabulary,
 * -ENOTSUP when the window has no embedding). */
int model_embed(struct model_exec *e, const int32_t *tokens, uint32_t n, float *out);
/* Run the window's layers on x[n][n_embd] in place for session id at positions pos..pos+n-1.
 * pos may rewind (pos <= model_session_pos: later positions are overwritten) but not skip
 * (-EINVAL). -ERANGE past the context, -ENOENT unknown session. */
int model_window_run(struct model_exec *e, uint64_t id, uint32_t pos, uint32_t n, float *x);
/* Last rank: logits[n][n_vocab] from x[n][n_embd] (final norm + output head; -ENOTSUP when
 * the window has no head). */
int model_head(struct model_exec *e, const float *x, uint32_t n, float *logits);

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

#endif

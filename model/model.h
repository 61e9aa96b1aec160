/* model — what the tensors mean: architecture hyperparameters from GGUF metadata, the weights
 * of a layer window (mapped, never copied), the window executor with per-session KV/state,
 * the rank-0 embedding and last-rank head, the sampler, and the tokenizer.
 *
 * The same code serves a one-process run (one window covering every layer) and each stage
 * of a ring: rank 0 calls model_embed, every stage model_window_run on the boundary rows,
 * the last rank model_head and the sampler.
 *
 * Sections: [window + executor + sampler] (issue 3) and [tokenizer] (issue 4).
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
    char arch[32];            /* "llama", "qwen2", "qwen3", ... */
    uint32_t n_layer;         /* blocks in the whole model */
    uint32_t n_embd, n_ff, n_head, n_head_kv, head_dim, n_vocab, n_ctx_train;
    uint32_t n_rot;
    float rms_eps, rope_base, rope_scale;
    bool rope_neox;
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
/* K/V bytes one session needs per position for the window's layers (F16 K and V). */
uint64_t model_kv_bytes_per_token(const struct model *m);
/* Bytes of weights one generated token reads: the window's layers, plus the head's norm and
 * output matrix on the last rank (one embedding row is not counted). */
uint64_t model_weight_bytes(const struct model *m);

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

#endif

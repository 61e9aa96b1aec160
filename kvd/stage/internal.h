/* kvd/stage/internal.h — cross-file internals of the stage role: the compute backend vtable (the
 * model, or a deterministic stand-in for network tests) and the compute thread. */
#ifndef KV_KVD_INTERNAL_H
#define KV_KVD_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "net/net.h"
#include "util/util.h"

struct model_vocab;
struct gguf_file;

struct kvd_backend_ops {
    int (*session_new)(void *impl, uint64_t id);
    int (*session_free)(void *impl, uint64_t id);
    int (*embed)(void *impl, const int32_t *tok, uint32_t n, float *out);      /* rank 0 */
    int (*run)(void *impl, uint64_t id, uint32_t pos, uint32_t n, float *x);   /* in place */
    int (*head)(void *impl, const float *x, uint32_t n, float *logits);        /* last rank */
    void *(*sampler_new)(void *impl, const struct net_open_params *p);
    void (*sampler_free)(void *impl, void *s);
    void (*sampler_accept)(void *impl, void *s, int32_t tok);
    int32_t (*sampler_sample)(void *impl, void *s, float *logits, float *logprob);
    void (*free)(void *impl);
};

struct kvd_backend {
    const struct kvd_backend_ops *ops;
    void *impl;
    uint32_t n_embd, n_vocab, n_layer, first, last, n_ctx_train;
    bool embed, head;
    char arch[32];
    int32_t eos, bos;          /* -1 when unknown */
    bool add_bos;
    uint64_t weight_bytes;     /* bytes of the window's weights (mapped) */
    struct model_vocab *vocab; /* rank 0: the tokenizer (NULL without one); immutable */
};

/* The model backend (model/model.h): path is a full GGUF or a mini-GGUF. */
int kvd_backend_open_model(struct kvd_backend *b, const char *path, int first, int last,
                           int n_threads, uint32_t n_ctx, uint32_t max_batch, char *err,
                           size_t errlen);
/* Deterministic stand-in: cheap maths with per-session state, n_vocab 256. */
int kvd_backend_open_stub(struct kvd_backend *b, uint32_t n_embd, uint32_t n_layer,
                          uint32_t first, uint32_t last, uint32_t n_ctx);
void kvd_backend_close(struct kvd_backend *b);
/* The parsed model file with the window's tensors mapped (NULL for the stub). */
const struct gguf_file *kvd_backend_gguf(const struct kvd_backend *b);
/* Rank 0: text -> tokens (BOS as the vocabulary asks); -ENOSYS without a tokenizer. */
int kvd_backend_tokenize(struct kvd_backend *b, const char *text, int32_t **toks, uint32_t *n);

enum kvd_job_kind { KVD_JOB_OPEN, KVD_JOB_STEP, KVD_JOB_CLOSE };

struct kvd_job {
    struct kvd_job *next;
    int kind;
    uint64_t session;
    uint32_t pos, n;
    uint8_t flags;                  /* NET_FL_LAST, NET_FL_LOGITS */
    struct net_open_params open;    /* OPEN */
    int32_t *tokens;                /* OPEN: prompt (sampler history); STEP on rank 0: to embed */
    uint32_t n_tokens;
    uint8_t *in;                    /* STEP on rank > 0: the ACT payload (wire dtype) */
    size_t in_len;
    /* results */
    int rc;
    char err[200];
    int out_type;                   /* 0, NET_F_ACT or NET_F_TOKEN */
    uint8_t out_flags;
    uint8_t *out;
    size_t out_len;
    int32_t token;
    float logprob;
    double ms;                      /* compute time */
};

struct kvd_compute;
typedef void (*kvd_job_done_cb)(struct kvd_job *j, void *ud);
int kvd_compute_new(struct kvd_compute **out, uv_loop_t *loop, struct kvd_backend *b,
                    uint32_t wire_dsize, kvd_job_done_cb done, void *ud);
void kvd_compute_submit(struct kvd_compute *c, struct kvd_job *j);
/* Stop the thread (pending jobs are dropped) and close the async handle; freed later. */
void kvd_compute_stop(struct kvd_compute *c);
void kvd_job_free(struct kvd_job *j);


#endif

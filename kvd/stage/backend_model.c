/* backend_model.c — the stage's compute backend on model/model.h: the window's weights (only
 * they are mapped) and an executor with per-session KV; rank 0 embeds, the last rank's head
 * gives logits. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "kernels/kern.h"
#include "kvd/kvd.h"
#include "kvd/stage/internal.h"
#include "model/model.h"
#include "util/err.h"

struct mb {
    struct model *m;
    struct model_exec *e;
    uint32_t n_embd, n_vocab, first, last;
    uint32_t gemm_rows;             /* opencl: rows from which a matmul may go through CLBlast
                                     * (0: another device, or GEMMs off) */
    uint64_t cl_gemms, cl_fallbacks;   /* its prompt GEMMs and failed ones, logged so far */
};

/* After a run of n rows on the opencl device: its first prompt GEMM through CLBlast, and each
 * that failed (the fused kernels computed it; the device keeps to them from then on), in the
 * log. A run below the threshold holds no GEMM, so decode steps skip the look. */
static void cl_gemm_log(struct mb *b, uint32_t n)
{
    struct kern_cl_info ci;
    if (!b->gemm_rows || n < b->gemm_rows || kern_cl_info(model_exec_kern_dev(b->e), &ci) < 0)
        return;
    if (ci.gemm_calls && !b->cl_gemms)
        kvd_log(KVD_LOG_INFO, "opencl: prompt GEMMs through CLBlast (first in a run of %u rows)",
                n);
    if (ci.gemm_fallbacks > b->cl_fallbacks)
        kvd_log(KVD_LOG_WARN, "opencl: %s", ci.gemm_error);
    b->cl_gemms = ci.gemm_calls;
    b->cl_fallbacks = ci.gemm_fallbacks;
}

static int mb_session_new(void *impl, uint64_t id) { return model_session_new(((struct mb *)impl)->e, id); }
static int mb_session_free(void *impl, uint64_t id) { return model_session_free(((struct mb *)impl)->e, id); }

/* Whether the batch's rows are all one session's, at consecutive positions. */
static bool one_session(const struct kvd_backend_batch *bt)
{
    for (uint32_t i = 1; i < bt->n; i++)
        if (bt->rows[i].id != bt->rows[0].id || bt->rows[i].pos != bt->rows[0].pos + i)
            return false;
    return true;
}

/* One session's rows take model_window_run (any number of rows, the path of a session alone);
 * several sessions' model_window_run_batch. The head runs one row at a time, as each row's
 * logits are then the ones it has alone whatever the output weight's type. */
static int mb_run(void *impl, const struct kvd_backend_batch *bt, char *err, size_t errlen)
{
    struct mb *b = impl;
    int rc;
    if (bt->n == 0)
        return 0;
    if (bt->tokens) {
        for (uint32_t i = 0; i < bt->n; i++)   /* refused before x is touched */
            if (bt->tokens[i] < 0 || (uint32_t)bt->tokens[i] >= b->n_vocab) {
                snprintf(err, errlen, "embedding: token %d not below n_vocab %u", bt->tokens[i],
                         b->n_vocab);
                return -EINVAL;
            }
        rc = model_embed(b->e, bt->tokens, bt->n, bt->x);
        if (rc < 0) {
            snprintf(err, errlen, "embedding %u tokens: %s", bt->n, strerror(-rc));
            return rc == -EINVAL ? -EIO : rc;   /* not a refusal: x was written */
        }
    }
    if (one_session(bt))
        rc = model_window_run(b->e, bt->rows[0].id, bt->rows[0].pos, bt->n, bt->x);
    else
        rc = model_window_run_batch(b->e, bt->rows, bt->n, bt->x);
    cl_gemm_log(b, bt->n);
    if (rc < 0) {
        snprintf(err, errlen, "layers [%u, %u): %s", b->first, b->last,
                 rc == -ERANGE ? "past the context" : strerror(-rc));
        return rc;
    }
    for (uint32_t k = 0; k < bt->n_head; k++) {
        rc = model_head(b->e, bt->x + (size_t)bt->head[k] * b->n_embd, 1,
                        bt->logits + (size_t)k * b->n_vocab);
        if (rc < 0) {
            snprintf(err, errlen, "output head: %s", strerror(-rc));
            return rc == -EINVAL || rc == -ENOENT || rc == -ERANGE ? -EIO : rc;
        }
    }
    return 0;
}

static void mb_free(void *impl)
{
    struct mb *b = impl;
    if (!b)
        return;
    model_exec_free(b->e);
    model_free(b->m);
    free(b);
}

static int mb_checkpoint(void *impl, uint64_t id) { return model_session_checkpoint(((struct mb *)impl)->e, id); }
static int mb_restore(void *impl, uint64_t id) { return model_session_restore(((struct mb *)impl)->e, id); }

static int mb_mtp_draft(void *impl, uint64_t id, uint32_t pos, uint32_t n, const float *x,
                        const int32_t *hist, uint32_t n_hist, uint32_t k, int32_t *out)
{
    return model_mtp_draft(((struct mb *)impl)->e, id, pos, n, x, hist, n_hist, k, out, NULL);
}

static const struct kvd_backend_ops mb_ops = {
    .session_new = mb_session_new, .session_free = mb_session_free, .run = mb_run, .free = mb_free,
    .checkpoint = mb_checkpoint, .restore = mb_restore, .mtp_draft = mb_mtp_draft,
};

const struct gguf_file *kvd_backend_gguf(const struct kvd_backend *b)
{
    if (b->ops != &mb_ops)
        return NULL;
    return model_get_gguf(((const struct mb *)b->impl)->m);
}

/* Rows a window run of several sessions may take with each row's result its solo one, on
 * kernel device dev: the fewest kern_dev_rows_exact gives a matmul weight of the window's
 * layers (0 when a type rounds differently for several rows; KERN_ROWS_EXACT_MAX for F32 on
 * the cpu device, which goes to a BLAS past it; one below the GEMM threshold on opencl, where
 * CLBlast takes over), capped at max_rows (what the executor's scratch holds). *chunk_exact:
 * every such weight exact at any number of rows, so a prompt's rows give the same results in
 * chunks of any size; the causal conv's F32 kernel (ssm_conv1d) is no matmul's and runs row
 * by row. */
static uint32_t batch_rows_exact(const struct gguf_file *g, const struct kern_dev *dev,
                                 uint32_t first, uint32_t last, uint32_t max_rows,
                                 bool *chunk_exact)
{
    uint64_t n = gguf_tensor_count(g);
    uint32_t rows = UINT32_MAX;
    *chunk_exact = false;
    for (uint64_t i = 0; i < n; i++) {
        const struct gguf_tensor *t = gguf_tensor_at(g, i);
        int l = gguf_tensor_layer(t->name);
        if (l < 0 || (uint32_t)l < first || (uint32_t)l >= last || t->n_dims < 2 ||
            strstr(t->name, ".ssm_conv1d."))
            continue;
        uint32_t r = kern_dev_rows_exact(dev, t->type);
        if (r == 0)
            return 0;
        rows = r < rows ? r : rows;
    }
    *chunk_exact = rows == UINT32_MAX;
    return rows < max_rows ? rows : max_rows;
}

int kvd_backend_open_model(struct kvd_backend *b, const struct kvd_backend_args *a, char *err,
                           size_t errlen)
{
    const char *path = a->path;
    uint32_t n_ctx = a->n_ctx, max_batch = a->max_batch;
    if (!path) {
        snprintf(err, errlen, "need --model FILE or --window MINI.gguf");
        return -EINVAL;
    }
    struct mb *mb = calloc(1, sizeof *mb);
    if (!mb)
        return -ENOMEM;
    int rc = model_open(&mb->m, path, a->first, a->last, err, errlen);
    if (rc < 0) {
        free(mb);
        return rc;
    }
    const struct model_hparams *hp = model_get_hparams(mb->m);
    if (max_batch > n_ctx)
        max_batch = n_ctx;
    struct model_exec_opts eo = {a->device ? a->device : "cpu", a->n_threads, n_ctx, max_batch,
                                 a->cl};
    char xerr[KV_ERR_MAX] = "";
    rc = model_exec_new_opts(&mb->e, mb->m, &eo, xerr, sizeof xerr);
    if (rc < 0) {
        snprintf(err, errlen, "executor (backend %s, n_ctx %u, max_batch %u): %s", eo.device,
                 n_ctx, max_batch, xerr[0] ? xerr : strerror(-rc));
        model_free(mb->m);
        free(mb);
        return rc;
    }
    kvd_log(KVD_LOG_INFO, "kernel device %s", model_exec_device(mb->e));
    mb->n_embd = hp->n_embd;
    mb->n_vocab = hp->n_vocab;
    memset(b, 0, sizeof *b);
    b->ops = &mb_ops;
    b->impl = mb;
    b->n_embd = hp->n_embd;
    b->n_vocab = hp->n_vocab;
    b->n_layer = hp->n_layer;
    model_get_window(mb->m, &b->first, &b->last);
    mb->first = b->first;
    mb->last = b->last;
    b->n_ctx_train = hp->n_ctx_train;
    b->embed = model_has_embed(mb->m);
    b->head = model_has_head(mb->m);
    b->mtp = model_has_mtp(mb->m);
    if (b->mtp)
        kvd_log(KVD_LOG_INFO, "MTP block %u loaded: drafts for sessions that ask (--draft mtp|auto)",
                hp->n_layer);
    snprintf(b->arch, sizeof b->arch, "%s", hp->arch);
    b->weight_bytes = model_weight_bytes(mb->m);
    b->kv_bytes_per_session = model_kv_bytes_per_token(mb->m) * a->n_ctx + model_state_bytes(mb->m);
    snprintf(b->device, sizeof b->device, "%s", model_exec_device(mb->e));
    struct kern_cl_info ci;
    if (kern_cl_info(model_exec_kern_dev(mb->e), &ci) == 0) {
        mb->gemm_rows = ci.gemm_rows;
        snprintf(b->cl_weights, sizeof b->cl_weights, "%s", ci.weights);
        b->cl_weights_mapped = ci.weights_mapped;
        b->cl_weights_copied = ci.weights_copied;
        kvd_log(KVD_LOG_INFO, "opencl weights: %s (%" PRIu64 " bytes wrapped in place, %" PRIu64
                " copied)", ci.weights, (uint64_t)ci.weights_mapped, (uint64_t)ci.weights_copied);
        if (ci.gemm_rows)
            kvd_log(KVD_LOG_INFO, "opencl prompt GEMMs (CLBlast) from %u rows: runs of several "
                    "sessions take at most %u", ci.gemm_rows, ci.gemm_rows - 1);
        else
            kvd_log(KVD_LOG_INFO, "opencl prompt GEMMs off");
    }
    uint32_t v;
    const struct gguf_file *g = model_get_gguf(mb->m);
    b->batch_rows = batch_rows_exact(g, model_exec_kern_dev(mb->e), b->first, b->last, max_batch,
                                     &b->chunk_exact);
    b->can_rewind = model_exec_can_rewind(mb->e);
    b->eos = gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &v) == 0 ? (int32_t)v : -1;
    b->bos = gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &v) == 0 ? (int32_t)v : -1;
    if (b->embed) {   /* rank 0 tokenizes prompts and turns tokens into text */
        char verr[KV_ERR_MAX];
        if (model_vocab_load(&b->vocab, g, verr, sizeof verr) < 0) {
            b->vocab = NULL;
            snprintf(err, errlen, "no tokenizer: %s", verr);   /* informative only */
        }
    }
    return 0;
}

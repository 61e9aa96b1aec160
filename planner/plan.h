/* plan — device profiles + model shape -> rank manifest. Pure functions: no I/O, no globals.
 *
 * The planner cuts a model's blocks [0, n_layers) into contiguous windows, one per rank, and
 * gives each window to one device, in ring order: rank 0 also holds the token embedding, the
 * last rank the output head and the model's multi-token-prediction (MTP) blocks, which it runs
 * as its drafter (with a token_embd of its own to embed the tokens it samples). It never puts a window on a device whose memory (after headroom)
 * cannot hold the window's weights plus the KV cache / recurrent state reserved for
 * `sessions` sessions of `ctx` tokens.
 *
 * Cost model (docs/planner.md has the long form):
 *   - A device runs layer i in t(d, i) ms per token: its measured ms_per_layer_token scaled
 *     by layer i's share of the work (active bytes per token), or else the roofline
 *     max(2 * macs / flops, active_bytes / mem_bw). Only the bytes a token touches count for
 *     time (a MoE layer reads its used experts), all bytes count for memory.
 *   - The last rank also pays for the MTP blocks like a window's layers (weights, K/V reserved
 *     for `sessions` x `ctx`, a token's active bytes in its time) plus, unless it is rank 0, the
 *     drafter's token_embd (memory only); opts.no_mtp leaves them out.
 *   - Every device in a ring of two or more ranks has one link in and one out. Its share of
 *     the hop costs is its rtt_ms (half on each link) plus the bytes it receives and sends
 *     divided by its bandwidth: activations (wire bytes per token) between ranks, a token id
 *     (PLAN_TOKEN_BYTES) on the closing edge.
 *   - latency objective: ms per token of one session = sum over ranks of compute + hops.
 *   - throughput objective: the pipeline period = the slowest rank, max(compute, transfer);
 *     ties broken by the latency. tokens/s for K sessions = min(K / cycle, 1 / period).
 *
 * Search: for a fixed order of devices a dynamic programme over (device, layer prefix) in
 * which a device may also be skipped finds the best windows and subset exactly (min-sum for
 * latency; min-max, then min-sum under the optimal period, for throughput). Orders are tried
 * exhaustively when there are few devices (the result is then optimal over subsets, orders
 * and splits) and by ranked orders plus local search otherwise.
 */
#ifndef KV_PLAN_H
#define KV_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PLAN_TOKEN_BYTES 8u          /* the closing edge carries a token id + logprob */
#define PLAN_MAX_LAYERS 4096u
#define PLAN_MAX_DEVICES 100000u

/* One block (layer) of the model. */
struct plan_layer {
    uint64_t weight_bytes;        /* every weight of the block, all experts included */
    uint64_t expert_bytes;        /* of which routed-expert weights (memory only) */
    uint64_t active_bytes;        /* weight bytes one token reads (used experts only) */
    double macs;                  /* multiply-adds per token */
    uint64_t kv_bytes_per_token;  /* KV cache per token of context per session (attention) */
    uint64_t state_bytes;         /* fixed per-session state (recurrent S, conv rows) */
};

/* The model as the planner sees it. Pointers are borrowed. */
struct plan_shape {
    const char *name;             /* model name for the manifest (may be NULL) */
    const char *arch;             /* "llama", "qwen35moe", ... (may be NULL) */
    uint32_t n_layers;            /* blocks of the main pass, cut into windows (MTP blocks not included) */
    uint32_t n_embd;
    uint64_t wire_bytes_per_token; /* boundary bytes per token between ranks */
    const struct plan_layer *layers; /* n_layers of them (plan_shape_of_model: the MTP blocks follow) */
    uint64_t embed_bytes;         /* token_embd (rank 0) */
    uint64_t embed_active_bytes;  /* one row per token */
    uint64_t head_bytes;          /* output_norm + output (last rank; token_embd again if tied) */
    uint64_t head_active_bytes;
    double head_macs;
    /* Multi-token-prediction blocks after the main pass (Qwen3.5's nextn_predict_layers): the
     * last rank holds them beside the head and runs them as its drafter (docs/planner.md).
     * 0 blocks: the model has none. */
    uint32_t mtp_blocks;
    struct plan_layer mtp;        /* the MTP blocks summed: weights, the bytes and multiply-adds a
                                     token reads through them, K/V per token of context */
    uint64_t mtp_embed_bytes;     /* token_embd for the drafter to embed the token it sampled: the
                                     last rank's own copy, unless the head is token_embd (tied:
                                     0 here) or the last rank is rank 0 too (then not counted) */
};

/* One device profile (docs/design.md, "The rank manifest"). Strings are borrowed. */
struct plan_device {
    const char *id;
    const char *backend;          /* "cpu", "opencl", "cuda", "npu" */
    uint64_t mem_bytes;           /* memory available for weights + KV/state */
    double ms_per_layer_token;    /* measured for this model's average layer; 0: unknown */
    double flops;                 /* peak FLOP/s (2 per multiply-add); 0: unknown */
    double mem_bw_bytes_s;        /* memory bandwidth; 0: unknown */
    double rtt_ms;                /* round trip to its peers */
    double bw_bytes_s;            /* link bandwidth; 0: not limiting */
    bool inbound;                 /* false: needs a relay for its incoming edge */
    uint64_t max_alloc_bytes;     /* largest single allocation (an OpenCL device's
                                     CL_DEVICE_MAX_MEM_ALLOC_SIZE): a window's K cache plus
                                     recurrent state for one session must fit; 0: no limit */
};

enum plan_objective { PLAN_LATENCY = 0, PLAN_THROUGHPUT = 1 };

struct plan_opts {
    enum plan_objective objective;
    uint32_t ctx;                 /* context tokens reserved per session */
    uint32_t sessions;            /* sessions reserved for (KV/state) and the K of estimates */
    double headroom;              /* fraction of each device's memory kept free, [0, 0.95] */
    uint32_t exhaustive_max;      /* try every order up to this many devices (0: default 6) */
    uint32_t max_ranks;           /* most ranks a ring may have (0: no limit; stages take 64) */
    uint32_t draft_max;           /* drafts a verifying pass carries (docs/ring.md, "Drafting");
                                     0: no drafting. A window with recurrent layers keeps a
                                     checkpoint of each session's state (its size again) and
                                     the pass's rows (draft_max + 1 boundaries) */
    bool no_mtp;                  /* leave the shape's MTP blocks out (a ring that will not draft
                                     with them): the last rank then neither holds nor runs them */
};
/* Defaults: latency, ctx 4096, 4 sessions, headroom 0.05, exhaustive up to 6 devices. */
void plan_opts_default(struct plan_opts *o);

struct plan_rank {
    uint32_t device;              /* index into the devices given */
    uint32_t first, last;         /* window [first, last) */
    bool embed, head;
    bool relay;                   /* the device accepts no inbound: its in-edge needs a relay */
    uint64_t mem_bytes;           /* estimated use: weights + KV/state (+ embed / head / MTP) */
    uint64_t mem_avail_bytes;     /* the device's memory after headroom */
    uint64_t expert_bytes;        /* routed-expert bytes in the window */
    uint64_t active_bytes;        /* weight bytes read per token */
    double compute_ms;            /* per token: the window's layers (+ embed / head) */
    double link_ms;               /* per token: its share of the hops (rtt + transfer) */
    double transfer_ms;           /* of which bytes / bandwidth (limits the period) */
    double est_ms_per_token;      /* compute_ms + link_ms */
    uint32_t mtp_blocks;          /* MTP blocks it holds: the shape's on the last rank (unless
                                     opts.no_mtp), 0 elsewhere */
    uint64_t mtp_mem_bytes;       /* of mem_bytes: their weights and K/V, and the drafter's
                                     token_embd (shape.mtp_embed_bytes) unless it is rank 0 */
};

enum plan_exclusion {
    PLAN_EX_INVALID = 1,          /* bad profile (no speed, negative numbers) */
    PLAN_EX_NO_MEMORY,            /* cannot hold even the smallest layer */
    PLAN_EX_NOT_NEEDED,           /* the ring is as good or better without it */
    PLAN_EX_MAX_RANKS,            /* dropped to keep the ring within max_ranks */
};

struct plan_excluded {
    uint32_t device;
    enum plan_exclusion why;
    char reason[200];
};

struct plan_result {
    uint32_t n_ranks;
    struct plan_rank *ranks;      /* ring order */
    uint32_t n_excluded;
    struct plan_excluded *excluded;
    enum plan_objective objective;
    double ms_per_token;          /* one session: sum of compute and hops round the ring */
    double period_ms;             /* slowest rank: the pipeline period */
    double tokens_per_s_1;        /* one session */
    double tokens_per_s_k;        /* `sessions` sessions in flight */
    uint32_t k;                   /* = opts.sessions */
    bool exhaustive;              /* every device order was tried (optimal) */
    uint64_t orders_tried;
};

/* Plan. 0 and *out (free with plan_result_free); -EINVAL for malformed input, -ENOSPC when
 * the model does not fit (err says by how many bytes and which layers), -ENOMEM. err is
 * filled on failure (and may be NULL). */
int plan_make(struct plan_result **out, const struct plan_shape *shape,
              const struct plan_device *devs, size_t n_devs, const struct plan_opts *opts,
              char *err, size_t errlen);
void plan_result_free(struct plan_result *r);

/* One machine, several kernel devices (its CPU, an OpenCL GPU: the "backends" of a profile,
 * docs/planner.md): which of the n options opt[] its windows should run on. The fastest for
 * the model's layers (ms_per_layer_token scaled by each layer's work, or the roofline) among
 * those that have a speed figure and whose memory after headroom holds the smallest layer
 * with its KV for opts' sessions and context; ties go to the earlier option. Its index and, in *ms_model (may be NULL), its ms per token for all the layers;
 * -ENOENT when none qualifies, -EINVAL for missing arguments. */
int plan_device_choose(const struct plan_device *opt, size_t n, const struct plan_shape *shape,
                       const struct plan_opts *opts, double *ms_model);

/* ---- N local identical processes (for `kvctl ring up`, instead of an even split) ----
 * Build the shape from the model's tensor list with plan_shape_of_model (names, ne and
 * sizes from gguf_tensor_at; the blocks and the main pass's from the metadata, so that
 * shape.n_layers is block_count - nextn_predict_layers, the blocks the runtime runs), then either:
 *   - plan_even(shape, n, first, last): n non-empty windows balanced by work, or
 *   - plan_devices_local(devs, ids, n, mem_each, ms) + plan_make(..., &opts, ...) with
 *     opts.objective = PLAN_THROUGHPUT: windows that also respect each process's memory
 *     (it may use fewer than n ranks when more would not lower the period).
 * plan_devices_local: n devices that share one machine (mem_bytes each), backend cpu,
 * ms_per_layer_token ms, loopback links (rtt 0, unlimited bandwidth), inbound. Fills
 * devs[n] with ids borrowed from ids[] (caller-owned, n entries). */
void plan_devices_local(struct plan_device *devs, const char *const *ids, size_t n,
                        uint64_t mem_bytes, double ms_per_layer_token);
/* Even split for n identical local ranks: windows [first[r], last[r]) minimising the largest
 * window's work (layer work by active bytes; the embedding counts on rank 0 and the head on
 * the last rank), every window non-empty. first/last are caller-owned (n entries).
 * 0, or -EINVAL when n is 0 or exceeds n_layers. */
int plan_even(const struct plan_shape *shape, uint32_t n, uint32_t *first, uint32_t *last);

/* ---- model shapes from tensors or hyperparameters (pure arithmetic) ---- */

/* One tensor of the model, as read from a GGUF header or a catalog. */
struct plan_tensor {
    const char *name;             /* "blk.3.ffn_up_exps.weight", "token_embd.weight" */
    uint32_t n_dims;
    uint64_t ne[4];               /* ne[0] = row length */
    uint64_t bytes;
};

struct plan_model_info {
    uint32_t n_layers;            /* blocks, each planned as a window's layer */
    uint32_t n_embd;
    uint32_t n_expert, n_expert_used; /* 0 for dense models */
    uint32_t kv_elem_bytes;       /* bytes per cached K/V element (0: 2, f16 as the runtime keeps them) */
    uint32_t wire_elem_bytes;     /* bytes per boundary element (0: 4, f32) */
};

/* Build layers[n_layers] and the shape's byte fields from a tensor list: weight bytes per
 * block, routed-expert bytes ("*_exps" tensors), active bytes (non-expert + used/n_expert of
 * the experts), macs (elements of the matrices a token multiplies), KV bytes per token from
 * attn_k/attn_v widths, recurrent state from ssm_conv1d/ssm_a/ssm_norm shapes. layers is
 * caller-owned (n_layers entries); shape->layers is set to it. 0, or -EINVAL with err. */
int plan_shape_from_tensors(const struct plan_tensor *t, size_t n, const struct plan_model_info *mi,
                            struct plan_shape *shape, struct plan_layer *layers,
                            char *err, size_t errlen);

/* A model as a GGUF header, a catalog or a shape descriptor gives it (the caller fills it from
 * its source; everything borrowed). Its trailing nextn_layers blocks are multi-token
 * prediction (MTP) blocks: a GGUF's nextn_predict_layers (block_count - gguf_main_layers),
 * which a catalog records as n_layers - n_main_layers and a descriptor gives as nextn_layers. */
struct plan_model {
    const char *name, *arch;      /* NULL name: none */
    const struct plan_tensor *t;  /* [n_tensors] */
    size_t n_tensors;
    uint32_t n_blocks;            /* blk.N blocks, MTP blocks included */
    uint32_t nextn_layers;        /* the trailing MTP blocks among them */
    uint32_t n_embd;              /* 0: token_embd.weight's row length */
    uint32_t n_expert, n_expert_used; /* 0 for dense models */
    uint32_t kv_elem_bytes;       /* as plan_model_info */
    uint32_t wire_elem_bytes;
};

/* The shape the planner plans for model m: plan_shape_from_tensors over every block, then the
 * MTP blocks taken out of the windows (shape->n_layers is n_blocks - nextn_layers, the main
 * pass the wire and the manifest count) and given to the last rank (plan_shape_set_mtp: the
 * runtime runs them there as the drafter); layers[] keeps every block, the MTP ones last.
 * layers is caller-owned (n_blocks entries); shape's name and arch point at m's. 0, or -EINVAL
 * with err. */
int plan_shape_of_model(const struct plan_model *m, struct plan_shape *shape, struct plan_layer *layers,
                        char *err, size_t errlen);
/* The MTP part of shape s, the one rule for it: mtp_blocks = n, mtp the sum of the n blocks
 * that follow the main pass in s->layers (s->layers[s->n_layers .. + n), which must exist),
 * mtp_embed_bytes = s->embed_bytes when n > 0 and the head is not token_embd (!tied), else 0.
 * Call it again after changing those blocks or the embedding. */
void plan_shape_set_mtp(struct plan_shape *s, uint32_t n, bool tied);

/* Hyperparameters of a model family, enough to derive its tensors (for a model whose file is
 * not at hand: the JSON shape descriptor of docs/planner.md). */
struct plan_hparams {
    char arch[32];                /* llama, qwen2, qwen3, qwen3moe, qwen35, qwen35moe */
    uint32_t n_layers;            /* decoder blocks (MTP blocks not included) */
    uint32_t nextn_layers;        /* MTP blocks appended after them */
    uint32_t n_embd, n_vocab, n_ff;
    uint32_t n_head, n_head_kv, head_dim;
    uint32_t n_expert, n_expert_used, n_ff_exp, n_ff_shexp;
    uint32_t full_attention_interval;            /* qwen35*: 0 is MODEL_FULL_ATTN_INTERVAL_DEFAULT */
    uint32_t ssm_conv_kernel, ssm_group_count, ssm_time_step_rank, ssm_state_size;
    bool tied_embeddings;
    double bits_per_weight;       /* matrices; norms and small vectors are f32 */
};
/* Number of tensors plan_tensors_from_hparams writes (for sizing), or 0 if unsupported. */
size_t plan_hparams_tensor_count(const struct plan_hparams *h);
/* Synthesise the tensor list a file of the family holds, as model/'s architecture table
 * describes it (names point to names_buf, caller-owned, 64 bytes per tensor).
 * 0 or -EINVAL with err (unknown arch, zero sizes). */
int plan_tensors_from_hparams(const struct plan_hparams *h, struct plan_tensor *t, size_t cap,
                              char *names_buf, size_t *n_out, char *err, size_t errlen);

#endif

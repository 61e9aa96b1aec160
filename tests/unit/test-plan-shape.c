/* test-plan-shape: model shapes for the planner.
 * - From a real GGUF (synth-qwen35moe): bytes per layer add up to the file's tensors, routed
 *   experts counted apart, active bytes = the rest + used/total of the experts, KV only on
 *   full-attention layers, recurrent state on the others.
 * - The hyperparameter synthesiser reproduces that file's tensor list exactly (names, shapes,
 *   bytes) from its metadata: what makes the Qwen3.5-122B-A10B descriptor trustworthy.
 * - The Qwen3.5-122B-A10B example of docs/planner.md: 49 blocks, ~77.6 GB, 1.4-1.6 GB per
 *   block, memory with all 256 experts, time with 8 routed + 1 shared; planned over the mixed
 *   device set (one 24 GB GPU box, two 64 GB CPU servers, a 16 GB laptop, six 8 GB NAT'd
 *   phones) for both objectives: valid, nothing placed where it does not fit, relay flags on
 *   the phones; without the big machines it does not fit and says by how much.
 * - Its MTP block (the 49th) goes to the last rank: windows cover the 48 main blocks, the last
 *   rank's memory counts the block's 1.57 GB, its K/V for every session and a token_embd of
 *   its own (not on a rank 0 that is also last, not for a tied model), its time the block's
 *   active bytes; opts.no_mtp leaves all of that out. */
#include <errno.h>
#include <math.h>

#include "gguf/gguf.h"
#include "tests/lib/t.h"
#include "planner/plan.h"
#include "util/err.h"

#define MAXT 4096

static struct plan_tensor tens[MAXT], syn[MAXT];
static char names[MAXT * 64];
static struct plan_layer layers[256];

static uint32_t get32(struct gguf_file *f, const char *key)
{
    uint32_t v = 0;
    char k[128];
    snprintf(k, sizeof k, "qwen35moe.%s", key);
    gguf_get_u32(f, k, &v);
    return v;
}

T_CASE(gguf_shape_and_synthesis)
{
    char path[512], err[512];
    T_ASSERT(t_data_path(path, sizeof path, "models/synth-qwen35moe-bpe1024-q8_0.gguf"), "no model");
    struct gguf_file *f = NULL;
    T_ASSERT(gguf_file_open(&f, path, err, sizeof err) == 0, "open: %s", err);
    size_t n = gguf_tensor_count(f);
    T_ASSERT(n <= MAXT, "tensors %zu", n);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const struct gguf_tensor *g = gguf_tensor_at(f, i);
        tens[i].name = g->name;
        tens[i].n_dims = g->n_dims;
        for (int d = 0; d < 4; d++) tens[i].ne[d] = g->ne[d];
        tens[i].bytes = g->size;
        total += g->size;
    }
    struct plan_model_info mi = {.n_layers = get32(f, "block_count"), .n_embd = get32(f, "embedding_length"),
                                 .n_expert = get32(f, "expert_count"), .n_expert_used = get32(f, "expert_used_count")};
    struct plan_shape s;
    T_ASSERT(plan_shape_from_tensors(tens, n, &mi, &s, layers, err, sizeof err) == 0, "shape: %s", err);
    uint64_t sum = s.embed_bytes + s.head_bytes;
    for (uint32_t i = 0; i < s.n_layers; i++) sum += layers[i].weight_bytes;
    T_CHECK(sum == total, "layers + embed + head = %llu, file tensors %llu", (unsigned long long)sum, (unsigned long long)total);
    uint32_t fai = get32(f, "full_attention_interval"), d = get32(f, "ssm.state_size");
    uint32_t hv = get32(f, "ssm.time_step_rank"), hk = get32(f, "ssm.group_count");
    uint32_t kvh = get32(f, "attention.head_count_kv"), kl = get32(f, "attention.key_length");
    for (uint32_t i = 0; i < s.n_layers; i++) {
        const struct plan_layer *l = &layers[i];
        T_CHECK(l->expert_bytes > 0 && l->expert_bytes < l->weight_bytes, "layer %u expert bytes %llu", i, (unsigned long long)l->expert_bytes);
        double want = (double)(l->weight_bytes - l->expert_bytes) + (double)l->expert_bytes * mi.n_expert_used / mi.n_expert;
        T_CHECK(fabs((double)l->active_bytes - want) <= 4, "layer %u active %llu, want %.0f", i, (unsigned long long)l->active_bytes, want);
        bool full = (i + 1) % fai == 0;
        T_CHECK(l->kv_bytes_per_token == (full ? 2ull * kvh * kl * 2 : 0), "layer %u kv/token %llu", i, (unsigned long long)l->kv_bytes_per_token);
        uint64_t st = full ? 0 : 3ull * (2ull * hk * d + (uint64_t)hv * d) * 4 + (uint64_t)hv * d * d * 4;
        T_CHECK(l->state_bytes == st, "layer %u state %llu, want %llu", i, (unsigned long long)l->state_bytes, (unsigned long long)st);
    }
    T_CHECK(s.wire_bytes_per_token == 4ull * mi.n_embd, "wire %llu", (unsigned long long)s.wire_bytes_per_token);

    /* the synthesiser, from the metadata alone */
    struct plan_hparams h;
    memset(&h, 0, sizeof h);
    snprintf(h.arch, sizeof h.arch, "qwen35moe");
    h.n_layers = mi.n_layers;
    h.n_embd = mi.n_embd;
    h.n_vocab = get32(f, "vocab_size");
    h.n_head = get32(f, "attention.head_count");
    h.n_head_kv = kvh;
    h.head_dim = kl;
    h.n_expert = mi.n_expert;
    h.n_expert_used = mi.n_expert_used;
    h.n_ff_exp = get32(f, "expert_feed_forward_length");
    h.n_ff_shexp = get32(f, "expert_shared_feed_forward_length");
    h.full_attention_interval = fai;
    h.ssm_conv_kernel = get32(f, "ssm.conv_kernel");
    h.ssm_group_count = hk;
    h.ssm_time_step_rank = hv;
    h.ssm_state_size = d;
    h.bits_per_weight = 8.5;   /* q8_0 */
    size_t ns = 0;
    T_ASSERT(plan_hparams_tensor_count(&h) <= MAXT, "count");
    T_ASSERT(plan_tensors_from_hparams(&h, syn, MAXT, names, &ns, err, sizeof err) == 0, "synth: %s", err);
    T_CHECK(ns == n, "synthesised %zu tensors, the file has %zu", ns, n);
    for (size_t i = 0; i < ns; i++) {
        const struct gguf_tensor *g = gguf_tensor_find(f, syn[i].name);
        T_CHECK(g != NULL, "synthesised %s is not in the file", syn[i].name);
        if (!g) continue;
        T_CHECK(g->n_dims == syn[i].n_dims && g->ne[0] == syn[i].ne[0] && g->ne[1] == syn[i].ne[1] &&
                g->ne[2] == syn[i].ne[2], "%s: shape differs from the file's", syn[i].name);
        T_CHECK(g->size == syn[i].bytes, "%s: %llu bytes, the file has %llu", syn[i].name,
                (unsigned long long)syn[i].bytes, (unsigned long long)g->size);
    }
    gguf_file_free(f);
}

/* Qwen3.5-122B-A10B, as docs/examples/qwen3.5-122b-a10b.shape.json describes it. */
static int shape_122b(struct plan_shape *s, char *err, size_t errlen)
{
    struct plan_hparams h = {
        .arch = "qwen35moe", .n_layers = 48, .nextn_layers = 1, .n_embd = 3072, .n_vocab = 248320,
        .n_head = 32, .n_head_kv = 2, .head_dim = 256, .n_expert = 256, .n_expert_used = 8,
        .n_ff_exp = 1024, .n_ff_shexp = 1024, .full_attention_interval = 4, .ssm_conv_kernel = 4,
        .ssm_group_count = 16, .ssm_time_step_rank = 64, .ssm_state_size = 128, .bits_per_weight = 4.98,
    };
    size_t n = 0;
    int rc = plan_tensors_from_hparams(&h, syn, MAXT, names, &n, err, errlen);
    if (rc) return rc;
    struct plan_model pm = {.name = "q", .arch = h.arch, .t = syn, .n_tensors = n, .n_blocks = 49,
                            .nextn_layers = 1, .n_expert = 256, .n_expert_used = 8};
    return plan_shape_of_model(&pm, s, layers, err, errlen);
}

/* The MTP rule: a model's trailing nextn_layers blocks leave the windows (n_layers is the main
 * pass) and are summed for the last rank: their bytes, work and K/V like a full-attention
 * block's, and the drafter's token_embd unless the head is token_embd; all of them MTP blocks
 * is refused. */
T_CASE(mtp_blocks_to_the_last_rank)
{
    struct plan_hparams h = {
        .arch = "qwen35moe", .n_layers = 48, .nextn_layers = 1, .n_embd = 3072, .n_vocab = 248320,
        .n_head = 32, .n_head_kv = 2, .head_dim = 256, .n_expert = 256, .n_expert_used = 8,
        .n_ff_exp = 1024, .n_ff_shexp = 1024, .full_attention_interval = 4, .ssm_conv_kernel = 4,
        .ssm_group_count = 16, .ssm_time_step_rank = 64, .ssm_state_size = 128, .bits_per_weight = 4.98,
    };
    char err[KV_ERR_MAX];
    size_t n = 0;
    T_ASSERT(plan_tensors_from_hparams(&h, syn, MAXT, names, &n, err, sizeof err) == 0, "synth: %s", err);
    struct plan_model pm = {.name = "q", .arch = h.arch, .t = syn, .n_tensors = n, .n_blocks = 49,
                            .nextn_layers = 1, .n_expert = 256, .n_expert_used = 8};
    struct plan_shape s;
    T_ASSERT(plan_shape_of_model(&pm, &s, layers, err, sizeof err) == 0, "shape: %s", err);
    T_CHECK(s.n_layers == 48, "n_layers %u, want the 48 main blocks", s.n_layers);
    T_CHECK(s.n_embd == 3072, "n_embd %u from token_embd", s.n_embd);
    T_CHECK(s.arch == pm.arch && s.name == pm.name, "name and arch are the model's");
    T_CHECK(s.mtp_blocks == 1 && !memcmp(&s.mtp, &layers[48], sizeof s.mtp), "shape.mtp is block 48");
    T_CHECK(layers[48].weight_bytes > layers[47].weight_bytes && layers[48].active_bytes > layers[47].active_bytes &&
            layers[48].macs > layers[47].macs, "the MTP block: a full-attention block and its nextn projection");
    T_CHECK(layers[48].kv_bytes_per_token == 2ull * 2 * 256 * 2 && layers[48].state_bytes == 0,
            "MTP K/V: n_head_kv x head_dim x 2 f16 values per position (%llu bytes), no state",
            (unsigned long long)layers[48].kv_bytes_per_token);
    T_CHECK(s.mtp_embed_bytes == s.embed_bytes && s.embed_bytes > 400e6, "untied: the drafter needs token_embd (%llu)",
            (unsigned long long)s.mtp_embed_bytes);
    /* tied: the head is token_embd, the last rank has it already */
    h.tied_embeddings = true;
    T_ASSERT(plan_tensors_from_hparams(&h, syn, MAXT, names, &n, err, sizeof err) == 0, "synth: %s", err);
    pm.n_tensors = n;
    T_ASSERT(plan_shape_of_model(&pm, &s, layers, err, sizeof err) == 0, "shape: %s", err);
    T_CHECK(s.mtp_blocks == 1 && s.mtp.weight_bytes > 0 && s.mtp_embed_bytes == 0, "tied: no second token_embd");
    /* no MTP blocks: nothing for the last rank */
    pm.nextn_layers = 0;
    T_ASSERT(plan_shape_of_model(&pm, &s, layers, err, sizeof err) == 0, "shape: %s", err);
    T_CHECK(s.n_layers == 49 && s.mtp_blocks == 0 && s.mtp.weight_bytes == 0 && s.mtp_embed_bytes == 0,
            "no MTP blocks: every block in the windows");
    pm.nextn_layers = 49;
    T_CHECK(plan_shape_of_model(&pm, &s, layers, err, sizeof err) == -EINVAL, "no main block");
}

#define GiB (1024.0 * 1024 * 1024)

static size_t mixed_devices(struct plan_device *d, bool big)
{
    size_t n = 0;
    if (big) {
        d[n++] = (struct plan_device){.id = "gpu-box", .backend = "cuda", .mem_bytes = (uint64_t)(24 * GiB), .flops = 8e13,
                                      .mem_bw_bytes_s = 9e11, .rtt_ms = 1, .bw_bytes_s = 1.25e9, .inbound = true};
        for (int i = 0; i < 2; i++)
            d[n++] = (struct plan_device){.id = i ? "cpu-2" : "cpu-1", .backend = "cpu", .mem_bytes = (uint64_t)(64 * GiB),
                                          .flops = 2e12, .mem_bw_bytes_s = 1e11, .rtt_ms = 1, .bw_bytes_s = 1.25e9, .inbound = true};
    }
    d[n++] = (struct plan_device){.id = "laptop", .backend = "opencl", .mem_bytes = (uint64_t)(16 * GiB), .flops = 1e12,
                                  .mem_bw_bytes_s = 6e10, .rtt_ms = 15, .bw_bytes_s = 2.5e7, .inbound = true};
    static const char *ph[] = {"phone-1", "phone-2", "phone-3", "phone-4", "phone-5", "phone-6"};
    for (int i = 0; i < 6; i++)
        d[n++] = (struct plan_device){.id = ph[i], .backend = "opencl", .mem_bytes = (uint64_t)(8 * GiB), .flops = 1.5e12,
                                      .mem_bw_bytes_s = 3e10, .rtt_ms = 40, .bw_bytes_s = 2.5e6, .inbound = false};
    return n;
}

T_CASE(qwen35_122b_example)
{
    struct plan_shape s;
    char err[KV_ERR_MAX];
    T_ASSERT(shape_122b(&s, err, sizeof err) == 0, "122B shape: %s", err);
    T_CHECK(s.n_layers == 48 && s.mtp_blocks == 1 && s.n_embd == 3072, "layers %u + %u MTP, n_embd %u",
            s.n_layers, s.mtp_blocks, s.n_embd);
    double total = (double)s.embed_bytes + (double)s.head_bytes, active = (double)s.head_active_bytes;
    for (uint32_t i = 0; i < 49; i++) {
        const struct plan_layer *l = &layers[i];
        total += (double)l->weight_bytes;
        active += (double)l->active_bytes;
        T_CHECK(l->weight_bytes > 1.4e9 && l->weight_bytes < 1.6e9, "block %u: %.3f GB", i, l->weight_bytes / 1e9);
        /* memory: all 256 experts (3 matrices of 3072 x 1024 each) */
        double exp_bytes = 256.0 * 3 * 3072 * 1024 * 4.98 / 8;
        T_CHECK(fabs((double)l->expert_bytes - exp_bytes) < 1e3, "block %u experts %.0f, want %.0f", i, (double)l->expert_bytes, exp_bytes);
        if (i < 48) {
            /* time: 8 of 256 routed experts + the shared expert + attention / DeltaNet */
            double shared = 3.0 * 3072 * 1024 * 4.98 / 8;
            double want = (double)(l->weight_bytes - l->expert_bytes) + exp_bytes * 8 / 256;
            T_CHECK(fabs((double)l->active_bytes - want) < 1e3, "block %u active %.0f, want %.0f", i, (double)l->active_bytes, want);
            T_CHECK((double)l->active_bytes > exp_bytes * 8 / 256 + shared, "block %u active too small", i);
            T_CHECK(((i + 1) % 4 == 0) == (l->kv_bytes_per_token > 0), "block %u: KV only on full attention", i);
            T_CHECK(((i + 1) % 4 == 0) == (l->state_bytes == 0), "block %u: state only on DeltaNet", i);
        } else {
            /* the MTP block: a full-attention block (8 + 1 experts) and the nextn projection */
            double want = (double)(l->weight_bytes - l->expert_bytes) + exp_bytes * 8 / 256;
            T_CHECK(fabs((double)l->active_bytes - want) < 1e3 && l->kv_bytes_per_token == 2048 && !l->state_bytes,
                    "MTP block active %.0f, want %.0f; K/V %llu per token", (double)l->active_bytes, want,
                    (unsigned long long)l->kv_bytes_per_token);
        }
    }
    T_CHECK(total > 77.0e9 && total < 78.5e9, "total %.2f GB, expected about 77.6", total / 1e9);
    T_CHECK(active > 5.0e9 && active < 7.0e9, "bytes read per token %.2f GB (about 10B params at 5 bits)", active / 1e9);

    struct plan_device d[16];
    size_t nd = mixed_devices(d, true);
    for (int obj = 0; obj < 2; obj++) {
        struct plan_opts o;
        plan_opts_default(&o);
        o.objective = obj ? PLAN_THROUGHPUT : PLAN_LATENCY;
        if (obj) o.sessions = 16;
        struct plan_result *r = NULL;
        int rc = plan_make(&r, &s, d, nd, &o, err, sizeof err);
        T_ASSERT(rc == 0, "122B plan (%s): %s", obj ? "throughput" : "latency", err);
        uint32_t j = 0;
        for (uint32_t i = 0; i < r->n_ranks; i++) {
            const struct plan_rank *k = &r->ranks[i];
            T_CHECK(k->first == j && k->last > k->first, "rank %u window [%u,%u)", i, k->first, k->last);
            j = k->last;
            double mem = (double)k->embed * (double)s.embed_bytes + (double)k->head * (double)s.head_bytes;
            for (uint32_t l = k->first; l < k->last; l++)
                mem += (double)layers[l].weight_bytes + o.sessions * ((double)layers[l].state_bytes +
                       (double)layers[l].kv_bytes_per_token * o.ctx);
            /* the last rank: the MTP block, its K/V per session and its own token_embd */
            double mtp = (double)layers[48].weight_bytes + o.sessions * 2048.0 * o.ctx +
                         (k->embed ? 0 : (double)s.embed_bytes);
            if (k->head) {
                mem += mtp;
                T_CHECK(k->mtp_blocks == 1 && k->mtp_mem_bytes == mtp && layers[48].weight_bytes > 1.5e9 &&
                        s.embed_bytes > 470e6, "last rank (%s): MTP memory %llu, want %.0f (1.57 GB + 474.9 MB "
                        "+ K/V)", d[k->device].id, (unsigned long long)k->mtp_mem_bytes, mtp);
            } else {
                T_CHECK(k->mtp_blocks == 0 && k->mtp_mem_bytes == 0, "rank %u holds no MTP block", i);
            }
            T_CHECK(fabs((double)k->mem_bytes - mem) < 2, "rank %u (%s): %llu bytes, want %.0f", i, d[k->device].id,
                    (unsigned long long)k->mem_bytes, mem);
            double cap = floor((double)d[k->device].mem_bytes * (1 - o.headroom));
            T_CHECK(mem <= cap, "rank %u (%s) holds %.0f bytes, can hold %.0f", i, d[k->device].id, mem, cap);
            T_CHECK(k->relay == !d[k->device].inbound, "rank %u relay flag", i);
        }
        T_CHECK(j == 48, "windows cover %u of the 48 main blocks", j);
        if (!obj) {
            /* one session: the fast, big machines carry it; the phones would only add 40 ms hops */
            T_CHECK(r->n_ranks <= 3, "latency plan uses %u ranks", r->n_ranks);
            for (uint32_t i = 0; i < r->n_ranks; i++)
                T_CHECK(d[r->ranks[i].device].inbound, "latency plan puts a window on a phone");
            T_CHECK(r->ms_per_token < 60, "latency estimate %.1f ms", r->ms_per_token);
        } else {
            T_CHECK(r->n_ranks > 3, "throughput plan uses only %u ranks", r->n_ranks);
        }
        fprintf(stderr, "%s: %u ranks, %.1f ms/token, period %.2f ms, %.1f tok/s with %u sessions\n",
                obj ? "throughput" : "latency", r->n_ranks, r->ms_per_token, r->period_ms, r->tokens_per_s_k, r->k);
        plan_result_free(r);
    }
    /* laptop + phones only: 16 + 6 x 8 GiB < 77.7 GB */
    nd = mixed_devices(d, false);
    struct plan_opts o;
    plan_opts_default(&o);
    struct plan_result *r = NULL;
    T_CHECK(plan_make(&r, &s, d, nd, &o, err, sizeof err) == -ENOSPC, "fits without the big machines?");
    T_CHECK(strstr(err, "short by") && strstr(err, "layers"), "message: %s", err);
    fprintf(stderr, "without the big machines: %s\n", err);

    /* Drafting: every session's recurrent state is kept twice (the checkpoint) with the
     * verifying pass's rows, on the DeltaNet layers only; one device holding every layer */
    struct plan_device one = {.id = "big", .backend = "cpu", .mem_bytes = (uint64_t)(512 * GiB),
                              .flops = 2e12, .mem_bw_bytes_s = 1e11, .rtt_ms = 1, .inbound = true};
    uint64_t mem[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        plan_opts_default(&o);
        o.draft_max = k ? 8 : 0;
        T_ASSERT(plan_make(&r, &s, &one, 1, &o, err, sizeof err) == 0, "one device: %s", err);
        T_CHECK(r->n_ranks == 1, "one device, %u ranks", r->n_ranks);
        mem[k] = r->ranks[0].mem_bytes;
        plan_result_free(r);
    }
    double extra = 0;
    for (uint32_t i = 0; i < 48; i++)
        if (layers[i].state_bytes)
            extra += o.sessions * ((double)layers[i].state_bytes + 9.0 * 3072 * 4);
    T_CHECK(extra > 0 && (double)(mem[1] - mem[0]) == extra, "drafting adds %.0f bytes, want %.0f",
            (double)(mem[1] - mem[0]), extra);
    o.draft_max = 65;
    T_CHECK(plan_make(&r, &s, &one, 1, &o, err, sizeof err) == -EINVAL && strstr(err, "draft_max 65"),
            "draft_max 65: %s", err);
}

/* The 122B's MTP block with and without opts.no_mtp: on one device (rank 0 is the last rank:
 * no second token_embd) and on two (the last rank's own token_embd), memory and time. */
T_CASE(mtp_on_the_last_rank)
{
    struct plan_shape s;
    char err[KV_ERR_MAX];
    T_ASSERT(shape_122b(&s, err, sizeof err) == 0, "122B shape: %s", err);
    const struct plan_layer *b = &layers[48];
    struct plan_device one = {.id = "big", .backend = "cpu", .mem_bytes = (uint64_t)(512 * GiB),
                              .flops = 2e12, .mem_bw_bytes_s = 1e11, .rtt_ms = 1, .inbound = true};
    struct plan_opts o;
    plan_opts_default(&o);
    struct plan_result *r[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        o.no_mtp = k;
        T_ASSERT(plan_make(&r[k], &s, &one, 1, &o, err, sizeof err) == 0, "one device: %s", err);
        T_ASSERT(r[k]->n_ranks == 1, "one device, %u ranks", r[k]->n_ranks);
    }
    const struct plan_rank *w = &r[0]->ranks[0], *wo = &r[1]->ranks[0];
    double kv = o.sessions * (double)b->kv_bytes_per_token * o.ctx;
    T_CHECK(w->first == 0 && w->last == 48 && w->mtp_blocks == 1 && wo->mtp_blocks == 0 && !wo->mtp_mem_bytes,
            "one device: [%u, %u), MTP blocks %u / %u", w->first, w->last, w->mtp_blocks, wo->mtp_blocks);
    T_CHECK((double)(w->mem_bytes - wo->mem_bytes) == (double)b->weight_bytes + kv &&
            (double)w->mtp_mem_bytes == (double)b->weight_bytes + kv,
            "one device: the MTP block adds %llu bytes, want its weights and K/V %.0f (rank 0 has token_embd)",
            (unsigned long long)(w->mem_bytes - wo->mem_bytes), (double)b->weight_bytes + kv);
    double t = fmax(2.0 * b->macs / one.flops, (double)b->active_bytes / one.mem_bw_bytes_s) * 1000;
    T_CHECK(fabs(w->compute_ms - wo->compute_ms - t) < 0.05 * t && t > 0.5,
            "one device: the MTP block adds %.3f ms per token, want about %.3f", w->compute_ms - wo->compute_ms, t);
    T_CHECK(w->active_bytes - wo->active_bytes == b->active_bytes && w->expert_bytes - wo->expert_bytes == b->expert_bytes,
            "one device: active and expert bytes count the MTP block");
    plan_result_free(r[0]);
    plan_result_free(r[1]);
    /* two 64 GiB machines: the model needs both, the last rank keeps its own token_embd */
    struct plan_device two[2] = {one, one};
    two[0].id = "a";
    two[1].id = "b";
    two[0].mem_bytes = two[1].mem_bytes = (uint64_t)(64 * GiB);
    for (int k = 0; k < 2; k++) {
        o.no_mtp = k;
        T_ASSERT(plan_make(&r[k], &s, two, 2, &o, err, sizeof err) == 0, "two devices: %s", err);
        T_ASSERT(r[k]->n_ranks == 2, "two devices, %u ranks", r[k]->n_ranks);
    }
    w = &r[0]->ranks[1];
    wo = &r[1]->ranks[1];
    T_CHECK(w->head && w->mtp_blocks == 1 && (double)w->mtp_mem_bytes == (double)b->weight_bytes + kv + (double)s.embed_bytes,
            "two devices: last rank's MTP memory %llu, want %.0f (+ token_embd %llu)",
            (unsigned long long)w->mtp_mem_bytes, (double)b->weight_bytes + kv, (unsigned long long)s.embed_bytes);
    T_CHECK(r[0]->ranks[0].mtp_blocks == 0 && wo->mtp_blocks == 0 && wo->mtp_mem_bytes == 0, "rank 0 / --no-mtp: none");
    double per_layer = 0;
    for (uint32_t i = w->first; i < w->last; i++)
        per_layer += (double)layers[i].weight_bytes + o.sessions * ((double)layers[i].state_bytes +
                     (double)layers[i].kv_bytes_per_token * o.ctx);
    T_CHECK((double)w->mem_bytes == per_layer + (double)s.head_bytes + (double)w->mtp_mem_bytes,
            "two devices: last rank %llu bytes, want its layers, the head and the MTP part", (unsigned long long)w->mem_bytes);
    plan_result_free(r[0]);
    plan_result_free(r[1]);
    /* a last rank that could hold its window and the head but not the MTP part too */
    o.no_mtp = false;
    two[0].mem_bytes = (uint64_t)(512 * GiB);
    two[1].mem_bytes = (uint64_t)((per_layer + (double)s.head_bytes + 1e6) / (1 - o.headroom));
    two[1].flops = 1e15;   /* much faster: the planner wants it to hold as much as it can */
    two[1].mem_bw_bytes_s = 1e13;
    for (int k = 0; k < 2; k++) {
        o.no_mtp = k;
        T_ASSERT(plan_make(&r[k], &s, two, 2, &o, err, sizeof err) == 0, "tight last rank: %s", err);
        T_ASSERT(r[k]->n_ranks == 2, "tight: %u ranks", r[k]->n_ranks);
    }
    w = &r[0]->ranks[1];
    wo = &r[1]->ranks[1];
    T_CHECK(w->mem_bytes <= w->mem_avail_bytes && w->mtp_blocks == 1 && w->first > wo->first,
            "tight: last rank [%u, 48) %llu of %llu bytes with the MTP block, [%u, 48) without", w->first,
            (unsigned long long)w->mem_bytes, (unsigned long long)w->mem_avail_bytes, wo->first);
    plan_result_free(r[0]);
    plan_result_free(r[1]);
}

int main(int argc, char **argv)
{
    t_init(argc, argv);
    T_RUN(gguf_shape_and_synthesis);
    T_RUN(qwen35_122b_example);
    T_RUN(mtp_blocks_to_the_last_rank);
    T_RUN(mtp_on_the_last_rank);
    return T_DONE();
}

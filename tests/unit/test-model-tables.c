/* The tables model/ relies on:
 * - the file format and the kernels see the same types: the enum values are pinned at build
 *   time in model/model.c; here every type the kernels know is in the weight-type table gguf
 *   validates with (wtype/), with the same block size, bytes per block and name (ggml's
 *   spelling in the kernels, lower case in the files' listings);
 * - the architecture table is well formed: every entry has a name, 1-3 dims, a form, and no
 *   two tensors of a block share a name or (bound ones) a field; the flags each architecture
 *   declares match its lists; walking a file's tensors gives what the hyperparameters say;
 * - the windows gguf cuts agree with what the tables list: an MTP block's tensors (blk.N for
 *   N >= n_layer, nextn.* included) and token_embd for its drafter go to the last window only
 *   (token_embd also to the first), and every tensor of a file lands in some window. */
#include <string.h>
#include <strings.h>

#include "gguf/gguf.h"
#include "kernels/kern.h"
#include "model/model.h"
#include "tests/lib/t.h"
#include "wtype/wtype.h"

T_CASE(gguf_and_kern_type_tables_agree)
{
    int both = 0;
    for (uint32_t t = 0; t < KERN_T_COUNT; t++) {
        const char *kn = kern_type_name(t);
        const struct wtype_info *gi = wtype_info(t);
        if (!kn)
            continue;
        T_CHECK(gi != NULL, "kern type %u (%s) unknown to gguf", t, kn);
        if (!gi)
            continue;
        both++;
        T_CHECK(kern_block_elems(t) == gi->block_elems, "%s: %u elements per block in kern, %u in gguf",
                kn, kern_block_elems(t), gi->block_elems);
        T_CHECK(kern_block_bytes(t) == gi->block_bytes, "%s: %u bytes per block in kern, %u in gguf",
                kn, kern_block_bytes(t), gi->block_bytes);
        T_CHECK(!strcasecmp(kn, gi->name), "type %u: '%s' in kern, '%s' in gguf", t, kn, gi->name);
    }
    T_CHECK(both == 15, "%d types known to both, want 15", both);
    T_CHECK(kern_type_name(KERN_T_COUNT) == NULL && kern_type_name(4) == NULL, "unknown types");
}

static const struct model_tensor_desc *find(const struct model_tensor_desc *l, const char *name)
{
    for (; l && l->name; l++)
        if (!strcmp(l->name, name))
            return l;
    return NULL;
}

static void check_list(const char *arch, const char *what, const struct model_tensor_desc *l,
                       bool bound)
{
    for (const struct model_tensor_desc *d = l; d->name; d++) {
        T_CHECK(d->n_dims >= 1 && d->n_dims <= 3, "%s %s %s: %u dims", arch, what, d->name, d->n_dims);
        T_CHECK(d->form >= MODEL_FORM_VEC && d->form <= MODEL_FORM_EXPS2, "%s %s %s: form %u", arch,
                what, d->name, d->form);
        for (const struct model_tensor_desc *e = l; e < d; e++) {
            T_CHECK(strcmp(e->name, d->name) != 0, "%s %s: %s twice", arch, what, d->name);
            /* the fused experts share gate_exps' field with the tensors they replace */
            bool alt = (e->flags | d->flags) & MODEL_TF_UNFUSED || e->form == MODEL_FORM_EXPS2;
            T_CHECK(!bound || alt || e->field != d->field, "%s %s: %s and %s bind one field", arch, what,
                    e->name, d->name);
        }
    }
}

T_CASE(arch_table)
{
    size_t n;
    const struct model_arch *a = model_arch_list(&n);
    T_CHECK(n == 6, "%zu architectures", n);
    char names[256];
    model_arch_names(names, sizeof names);
    T_CHECK(!strcmp(names, "llama, qwen2, qwen3, qwen3moe, qwen35, qwen35moe"), "names '%s'", names);
    for (size_t i = 0; i < n; i++) {
        T_CHECK(model_arch_find(a[i].name) == &a[i], "find %s", a[i].name);
        const struct model_tensor_desc *at = a[i].layer[MODEL_LAYER_ATTN];
        const struct model_tensor_desc *rec = a[i].layer[MODEL_LAYER_RECURRENT];
        T_ASSERT(at != NULL, "%s: no attention layer", a[i].name);
        check_list(a[i].name, "attention", at, true);
        T_CHECK(!rec == !a[i].hybrid, "%s: recurrent layers iff hybrid", a[i].name);
        if (rec)
            check_list(a[i].name, "recurrent", rec, true);
        const struct model_tensor_desc *qb = find(at, "attn_q.bias"), *qn = find(at, "attn_q_norm.weight");
        T_CHECK(qb && !(qb->flags & MODEL_TF_OPTIONAL) == a[i].qkv_bias, "%s: qkv bias", a[i].name);
        T_CHECK(qn && !(qn->flags & MODEL_TF_OPTIONAL) == a[i].qk_norm, "%s: qk norm", a[i].name);
        T_CHECK(!find(at, "ffn_down_exps.weight") == !a[i].moe, "%s: experts iff moe", a[i].name);
        T_CHECK(!find(at, "ffn_down_shexp.weight") == !a[i].shexp, "%s: shared expert", a[i].name);
        T_CHECK(find(at, "ffn_gate.weight") ? !a[i].moe : a[i].moe, "%s: dense FFN iff not moe", a[i].name);
    }
    check_list("all", "input", model_tensors_input, true);
    check_list("all", "output", model_tensors_output, true);
    check_list("all", "nextn", model_tensors_nextn, false);
}

struct walk {
    int n, blk2;
    uint64_t q_ne1;
    bool has_output;
};

static int count(void *ud, const char *name, const struct model_tensor_desc *d, const uint64_t ne[4])
{
    struct walk *w = ud;
    w->n++;
    if (!strncmp(name, "blk.2.", 6))
        w->blk2++;
    if (!strcmp(name, "blk.3.attn_q.weight"))
        w->q_ne1 = ne[1];
    if (!strcmp(name, "output.weight"))
        w->has_output = true;
    T_CHECK(ne[3] == 1 && (d->n_dims > 1 || ne[1] == 1), "%s: ne", name);
    return 0;
}

/* A small qwen35moe with 4 main blocks (3 recurrent, 1 gated attention) and 1 MTP block. */
static struct model_hparams qwen35moe_mtp_hp(void)
{
    return (struct model_hparams){.n_layer = 4, .n_block = 5, .n_nextn = 1, .n_embd = 64, .n_ff = 96,
                                  .n_head = 4, .n_head_kv = 2, .head_dim = 16, .n_rot = 16,
                                  .n_vocab = 300, .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 32,
                                  .n_ff_shexp = 48, .full_attn_interval = 4, .ssm_conv_kernel = 4,
                                  .ssm_d_state = 16, .ssm_n_group = 2, .ssm_dt_rank = 4,
                                  .ssm_d_inner = 64};
}

T_CASE(arch_walk)
{
    struct model_hparams hp = qwen35moe_mtp_hp();
    /* qwen35moe: blocks 0-2 recurrent (19 tensors), 3 gated attention (16), 4 MTP (16 + 4);
     * token_embd, output_norm, output */
    const struct model_arch *a = model_arch_find("qwen35moe");
    T_ASSERT(a != NULL, "qwen35moe");
    struct walk w = {0};
    T_CHECK(model_arch_tensors(a, &hp, false, count, &w) == w.n, "count returned");
    T_CHECK(w.n == 3 * 19 + 16 + 20 + 3, "qwen35moe: %d tensors", w.n);
    T_CHECK(w.blk2 == 19 && w.q_ne1 == 2u * 4 * 16 && w.has_output, "qwen35moe: blocks");
    T_CHECK(model_arch_tensors(a, &hp, true, NULL, NULL) == w.n - 1, "tied: no output.weight");
    /* llama with 4 blocks, no MTP: 9 tensors a block */
    hp.n_block = 4;
    hp.n_nextn = 0;
    T_CHECK(model_arch_tensors(model_arch_find("llama"), &hp, false, NULL, NULL) == 4 * 9 + 3, "llama");
    T_CHECK(model_arch_tensors(model_arch_find("qwen2"), &hp, false, NULL, NULL) == 4 * 12 + 3, "qwen2");
}

/* Which windows of a qwen35moe with 4 main blocks and 1 MTP block take each tensor. */
struct wins {
    int n, mtp, in_last_only, embd_first_last, unplaced;
    bool tied;
};

static int place(void *ud, const char *name, const struct model_tensor_desc *d, const uint64_t ne[4])
{
    struct wins *w = ud;
    (void)d; (void)ne;
    static const uint32_t cut[][2] = {{0, 1}, {1, 3}, {3, 4}};   /* first, middle, last */
    bool in[3];
    for (int k = 0; k < 3; k++)
        in[k] = gguf_window_wants(name, cut[k][0], cut[k][1], 4, 5, !w->tied);
    w->n++;
    if (!in[0] && !in[1] && !in[2])
        w->unplaced++;
    if (!strncmp(name, "blk.4.", 6)) {
        w->mtp++;
        T_CHECK(in[2] && !in[0] && !in[1], "%s: the MTP block's tensor is the last window's alone", name);
    }
    if (!strncmp(name, "blk.4.nextn.", 12) || !strncmp(name, "output", 6))
        w->in_last_only += in[2] && !in[0] && !in[1];
    if (!strcmp(name, "token_embd.weight")) {
        T_CHECK(in[0] && !in[1] && in[2], "token_embd: in the first window and the last (the drafter's)");
        w->embd_first_last++;
    }
    return 0;
}

T_CASE(arch_windows)
{
    struct model_hparams hp = qwen35moe_mtp_hp();
    const struct model_arch *a = model_arch_find("qwen35moe");
    T_ASSERT(a != NULL, "qwen35moe");
    for (int tied = 0; tied < 2; tied++) {
        struct wins w = {.tied = tied};
        T_CHECK(model_arch_tensors(a, &hp, tied, place, &w) == w.n, "count returned");
        T_CHECK(w.mtp == 20 && w.unplaced == 0 && w.embd_first_last == 1, "tied %d: %d MTP tensors, %d in no window",
                tied, w.mtp, w.unplaced);
        T_CHECK(w.in_last_only == 4 + 2 - tied, "tied %d: nextn and output tensors in the last window alone: %d",
                tied, w.in_last_only);
    }
}

int main(int argc, char **argv)
{
    t_init(argc, argv);
    T_RUN(gguf_and_kern_type_tables_agree);
    T_RUN(arch_table);
    T_RUN(arch_walk);
    T_RUN(arch_windows);
    return T_DONE();
}

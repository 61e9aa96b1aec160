/* kvctl/gguf.c — the GGUF commands that read a file: inspect, slice, catalog, verify (synth,
 * which writes one, is kvctl/synth.c). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "gguf/gguf.h"
#include "kvctl/kvctl.h"
#include "util/err.h"
#include "wtype/wtype.h"

/* ------------------------------------------------------------------ helpers */

static void print_value(FILE *out, const struct gguf_value *v, int depth)
{
    switch (v->type) {
    case GGUF_V_STRING:
        fprintf(out, "\"%.*s%s\"", (int)(v->v.str.len > 80 ? 80 : v->v.str.len), v->v.str.p,
                v->v.str.len > 80 ? "..." : "");
        break;
    case GGUF_V_F32: case GGUF_V_F64: fprintf(out, "%g", v->v.f); break;
    case GGUF_V_BOOL: fprintf(out, "%s", v->v.u ? "true" : "false"); break;
    case GGUF_V_I8: case GGUF_V_I16: case GGUF_V_I32: case GGUF_V_I64: fprintf(out, "%" PRId64, v->v.i); break;
    case GGUF_V_ARRAY:
        fprintf(out, "[%s x %" PRIu64 "]", gguf_vtype_name(v->v.arr.type), v->v.arr.n);
        if (v->v.arr.items && v->v.arr.n && depth < 1) {
            fprintf(out, " ");
            print_value(out, &v->v.arr.items[0], depth + 1);
            if (v->v.arr.n > 1)
                fprintf(out, " ...");
        }
        break;
    default: fprintf(out, "%" PRIu64, v->v.u); break;
    }
}

/* ------------------------------------------------------------------ inspect */

static void hp_line(const struct gguf_file *f, const char *arch, const char *label, const char *suffix)
{
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    const struct gguf_kv *kv = gguf_kv_find(f, key);
    if (!kv)
        return;
    printf("  %-22s ", label);
    print_value(stdout, &kv->val, 0);
    printf("\n");
}

int kvctl_cmd_inspect(int argc, char **argv)
{
    const char *path = NULL;
    bool tensors = false, kvs = false;
    if (kvctl_is_help(argc, argv)) {
        printf("usage: kvctl inspect FILE [--tensors] [--kv]\n"
               "  what a GGUF model or stage window holds: architecture, hyperparameters, tokenizer,\n"
               "  tensor types, bytes per layer, embedding and head bytes.\n"
               "  --tensors  list every tensor (name, type, shape, bytes, offset)\n"
               "  --kv       list every metadata key\n");
        return 0;
    }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tensors"))
            tensors = true;
        else if (!strcmp(argv[i], "--kv"))
            kvs = true;
        else if (argv[i][0] == '-' || path) {
            fprintf(stderr, "kvctl inspect: unexpected argument '%s' (see --help)\n", argv[i]);
            return 2;
        } else
            path = argv[i];
    }
    if (!path) {
        fprintf(stderr, "usage: kvctl inspect FILE [--tensors] [--kv]\n");
        return 2;
    }
    char err[KV_ERR_MAX], hb[32], arch[64] = "?", name[128] = "";
    struct gguf_file *f;
    if (gguf_file_open(&f, path, err, sizeof err)) {
        fprintf(stderr, "kvctl inspect: %s\n", err);
        return 1;
    }
    gguf_get_str(f, "general.architecture", arch, sizeof arch);
    gguf_get_str(f, "general.name", name, sizeof name);
    util_fmt_bytes(hb, sizeof hb, (double)gguf_file_size(f), 2, 0);
    printf("file        %s\n", path);
    printf("format      GGUF v%u, %s, alignment %" PRIu64 ", %" PRIu64 " metadata keys, data at %" PRIu64 "\n",
           gguf_file_version(f), hb, gguf_file_alignment(f), gguf_kv_count(f), gguf_file_data_offset(f));
    printf("model       %s%s%s%s\n", arch, name[0] ? " \"" : "", name, name[0] ? "\"" : "");
    uint32_t n_layers = 0;
    gguf_block_count(f, &n_layers);
    uint32_t wf, wl;
    char src[80] = "";
    if (gguf_window_get(f, &wf, &wl) == 0) {
        gguf_get_str(f, "kvasir.source.sha256", src, sizeof src);
        printf("window      layers [%u, %u) of %u (stage mini-GGUF; source sha256 %s)\n", wf, wl, n_layers, src);
    }
    printf("hyperparameters\n");
    printf("  %-22s %u\n", "layers", n_layers);
    hp_line(f, arch, "embedding", "embedding_length");
    hp_line(f, arch, "feed-forward", "feed_forward_length");
    hp_line(f, arch, "heads", "attention.head_count");
    hp_line(f, arch, "kv heads", "attention.head_count_kv");
    hp_line(f, arch, "key length", "attention.key_length");
    hp_line(f, arch, "value length", "attention.value_length");
    hp_line(f, arch, "context (train)", "context_length");
    hp_line(f, arch, "rope base", "rope.freq_base");
    hp_line(f, arch, "rope dims", "rope.dimension_count");
    hp_line(f, arch, "rms eps", "attention.layer_norm_rms_epsilon");
    hp_line(f, arch, "experts", "expert_count");
    hp_line(f, arch, "experts used", "expert_used_count");
    hp_line(f, arch, "expert ff", "expert_feed_forward_length");
    hp_line(f, arch, "nextn (MTP) blocks", "nextn_predict_layers");
    hp_line(f, arch, "shared expert ff", "expert_shared_feed_forward_length");
    hp_line(f, arch, "full attn interval", "full_attention_interval");
    hp_line(f, arch, "ssm conv kernel", "ssm.conv_kernel");
    hp_line(f, arch, "ssm state size", "ssm.state_size");
    hp_line(f, arch, "ssm groups (k/q)", "ssm.group_count");
    hp_line(f, arch, "ssm v heads", "ssm.time_step_rank");
    hp_line(f, arch, "ssm inner", "ssm.inner_size");
    char tm[64] = "none";
    gguf_get_str(f, "tokenizer.ggml.model", tm, sizeof tm);
    const struct gguf_value *toks = NULL, *merges = NULL;
    gguf_get_arr(f, "tokenizer.ggml.tokens", &toks);
    gguf_get_arr(f, "tokenizer.ggml.merges", &merges);
    const char *kind = !strcmp(tm, "llama") ? "SPM" : !strcmp(tm, "gpt2") ? "BPE" : tm;
    printf("tokenizer   %s (%s), %" PRIu64 " tokens", tm, kind, toks ? toks->v.arr.n : 0);
    if (merges)
        printf(", %" PRIu64 " merges", merges->v.arr.n);
    uint32_t id;
    if (gguf_get_u32(f, "tokenizer.ggml.bos_token_id", &id) == 0)
        printf(", bos %u", id);
    if (gguf_get_u32(f, "tokenizer.ggml.eos_token_id", &id) == 0)
        printf(", eos %u", id);
    printf("\n");

    uint64_t per_type[GGUF_T_COUNT] = {0}, bytes_type[GGUF_T_COUNT] = {0}, total = 0;
    uint64_t embd = 0, head = 0, other = 0, exps = 0, blocks = 0;
    uint64_t *per_layer = calloc(n_layers + 1, sizeof *per_layer);
    for (uint64_t i = 0; i < gguf_tensor_count(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        per_type[t->type]++;
        bytes_type[t->type] += t->size;
        total += t->size;
        int l = gguf_tensor_layer(t->name);
        if (l >= 0 && (uint32_t)l < n_layers) {
            blocks += t->size;
            if (strstr(t->name, "_exps."))   /* routed experts: 3-D, one slice per expert */
                exps += t->size;
        }
        if (l >= 0 && per_layer && (uint32_t)l < n_layers)
            per_layer[l] += t->size;
        else if (!strncmp(t->name, "token_embd.", 11))
            embd += t->size;
        else if (!strncmp(t->name, "output", 6))
            head += t->size;
        else
            other += t->size;
    }
    printf("tensors     %" PRIu64 ":", gguf_tensor_count(f));
    for (int t = 0; t < GGUF_T_COUNT; t++)
        if (per_type[t]) {
            util_fmt_bytes(hb, sizeof hb, (double)bytes_type[t], 2, 0);
            printf(" %s %" PRIu64 " (%s)", wtype_info((uint32_t)t)->name, per_type[t], hb);
        }
    util_fmt_bytes(hb, sizeof hb, (double)total, 2, 0);
    printf("; %s in all\n", hb);
    bool is_window = gguf_window_get(f, &wf, &wl) == 0;
    util_fmt_bytes(hb, sizeof hb, (double)embd, 2, 0);
    printf("embedding   token_embd %s\n", embd || !is_window ? hb : "(not in this window)");
    util_fmt_bytes(hb, sizeof hb, (double)head, 2, 0);
    if (!head && is_window)
        printf("head        (not in this window)\n");
    else
        printf("head        output_norm + output %s%s\n", hb,
               gguf_tensor_find(f, "output.weight") ? "" : " (no output.weight: the head reuses token_embd)");
    if (other) {
        util_fmt_bytes(hb, sizeof hb, (double)other, 2, 0);
        printf("shared      %s (non-block tensors every stage holds)\n", hb);
    }
    char key[96];
    uint32_t n_exp = 0, n_used = 0;
    snprintf(key, sizeof key, "%s.expert_count", arch);
    gguf_get_u32(f, key, &n_exp);
    snprintf(key, sizeof key, "%s.expert_used_count", arch);
    gguf_get_u32(f, key, &n_used);
    if (exps && n_exp && n_used <= n_exp) {
        /* Memory needs every expert; a token reads only the n_used selected ones (plus the
         * router, the shared expert and everything else of its blocks). */
        char ab[32], tb[32];
        uint64_t active = blocks - exps + exps / n_exp * n_used;
        util_fmt_bytes(hb, sizeof hb, (double)exps, 2, 0);
        util_fmt_bytes(ab, sizeof ab, (double)(exps / n_exp * n_used), 2, 0);
        util_fmt_bytes(tb, sizeof tb, (double)(active + head), 2, 0);
        printf("experts     routed %s in all (memory), %u of %u used per token: %s; "
               "active per token %s (blocks + head)\n", hb, n_used, n_exp, ab, tb);
    }
    printf("per layer  ");
    int shown = 0;
    for (uint32_t l = 0; per_layer && l < n_layers; l++) {
        if (!per_layer[l])
            continue;
        uint32_t r = l;
        while (r + 1 < n_layers && per_layer[r + 1] == per_layer[l])
            r++;
        util_fmt_bytes(hb, sizeof hb, (double)per_layer[l], 2, 0);
        if (r > l)
            printf("%s [%u, %u): %s each", shown ? "," : "", l, r + 1, hb);
        else
            printf("%s %u: %s", shown ? "," : "", l, hb);
        shown++;
        l = r;
    }
    printf("%s\n", shown ? "" : " (no blocks in this file)");
    free(per_layer);
    if (kvs) {
        printf("metadata\n");
        for (uint64_t i = 0; i < gguf_kv_count(f); i++) {
            const struct gguf_kv *kv = gguf_kv_at(f, i);
            printf("  %-44s %-7s ", kv->key, gguf_vtype_name(kv->val.type));
            print_value(stdout, &kv->val, 0);
            printf("\n");
        }
    }
    if (tensors) {
        printf("tensors (name, type, shape, bytes, offset in the data section)\n");
        for (uint64_t i = 0; i < gguf_tensor_count(f); i++) {
            const struct gguf_tensor *t = gguf_tensor_at(f, i);
            char shape[96];
            int o = 0;
            for (uint32_t d = 0; d < t->n_dims; d++)
                o += snprintf(shape + o, sizeof shape - (size_t)o, "%s%" PRIu64, d ? "x" : "", t->ne[d]);
            printf("  %-36s %-6s %-16s %12" PRIu64 " %12" PRIu64 "\n", t->name, wtype_info(t->type)->name,
                   shape, t->size, t->offset);
        }
    }
    gguf_file_free(f);
    return 0;
}

/* ------------------------------------------------------------------ slice */

int kvctl_cmd_slice(int argc, char **argv)
{
    const char *path = NULL, *out = NULL, *layers = NULL, *sha = NULL;
    if (kvctl_is_help(argc, argv)) {
        printf("usage: kvctl slice FILE --layers A:B -o OUT [--source-sha256 HEX]\n"
               "  write the stage mini-GGUF of layers [A, B): all metadata, the window's tensors under\n"
               "  their original names (token_embd when A is 0, output_norm/output when B is the last\n"
               "  layer, with the MTP blocks past it and token_embd there too when the model ties them\n"
               "  or has MTP blocks), kvasir.window.first/last and\n"
               "  kvasir.source.sha256 (the source file's SHA-256, computed unless given).\n");
        return 0;
    }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--layers") && i + 1 < argc)
            layers = argv[++i];
        else if (!strcmp(argv[i], "-o") && i + 1 < argc)
            out = argv[++i];
        else if (!strcmp(argv[i], "--source-sha256") && i + 1 < argc)
            sha = argv[++i];
        else if (argv[i][0] != '-' && !path)
            path = argv[i];
        else {
            fprintf(stderr, "kvctl slice: unexpected argument '%s' (see --help)\n", argv[i]);
            return 2;
        }
    }
    if (!path || !out || !layers) {
        fprintf(stderr, "usage: kvctl slice FILE --layers A:B -o OUT\n");
        return 2;
    }
    char a[32], b[32];
    const char *colon = strchr(layers, ':');
    uint64_t first, last;
    if (!colon || (size_t)(colon - layers) >= sizeof a || strlen(colon + 1) >= sizeof b) {
        fprintf(stderr, "kvctl slice: --layers '%s' is not A:B\n", layers);
        return 2;
    }
    memcpy(a, layers, (size_t)(colon - layers));
    a[colon - layers] = 0;
    strcpy(b, colon + 1);
    if (kvctl_parse_u64("slice", "--layers A", a, 1000000, &first) || kvctl_parse_u64("slice", "--layers B", b, 1000000, &last))
        return 2;
    struct stat si, so;   /* -o FILE itself would replace the model by one of its windows */
    if (stat(path, &si) == 0 && stat(out, &so) == 0 && si.st_dev == so.st_dev && si.st_ino == so.st_ino) {
        fprintf(stderr, "kvctl slice: -o %s is the model itself: give another output file\n", out);
        return 2;
    }
    char err[KV_ERR_MAX];
    struct gguf_file *f;
    if (gguf_file_open(&f, path, err, sizeof err)) {
        fprintf(stderr, "kvctl slice: %s\n", err);
        return 1;
    }
    struct gguf_window_opts o = {.first = (uint32_t)first, .last = (uint32_t)last, .source_sha256_hex = sha};
    int rc = gguf_window_write(f, &o, out, err, sizeof err);
    gguf_file_free(f);
    if (rc) {
        fprintf(stderr, "kvctl slice: %s\n", err);
        return 1;
    }
    struct gguf_file *w;
    if (gguf_file_open(&w, out, err, sizeof err)) {
        fprintf(stderr, "kvctl slice: written window does not parse: %s\n", err);
        return 1;
    }
    char hb[32];
    util_fmt_bytes(hb, sizeof hb, (double)gguf_file_size(w), 2, 0);
    printf("%s: layers [%u, %u), %" PRIu64 " tensors, %s\n", out, o.first, o.last, gguf_tensor_count(w), hb);
    gguf_file_free(w);
    return 0;
}

/* ------------------------------------------------------------------ catalog / verify */

int kvctl_cmd_catalog(int argc, char **argv)
{
    const char *path = NULL, *out = NULL;
    if (kvctl_is_help(argc, argv)) {
        printf("usage: kvctl catalog FILE [-o CAT.json]\n"
               "  per-tensor catalog of a model: name, type, shape, absolute offset, size, SHA-256, and\n"
               "  the source file's SHA-256. Prints the model id (the SHA-256 of the catalog JSON)\n"
               "  on stdout; the JSON goes to CAT.json, or to stdout without -o.\n");
        return 0;
    }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-o") && i + 1 < argc)
            out = argv[++i];
        else if (argv[i][0] != '-' && !path)
            path = argv[i];
        else {
            fprintf(stderr, "kvctl catalog: unexpected argument '%s' (see --help)\n", argv[i]);
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "usage: kvctl catalog FILE [-o CAT.json]\n");
        return 2;
    }
    char err[KV_ERR_MAX], id[65];
    struct gguf_file *f;
    struct gguf_catalog *c;
    if (gguf_file_open(&f, path, err, sizeof err)) {
        fprintf(stderr, "kvctl catalog: %s\n", err);
        return 1;
    }
    int rc = gguf_catalog_build(&c, f, err, sizeof err);
    gguf_file_free(f);
    if (rc) {
        fprintf(stderr, "kvctl catalog: %s\n", err);
        return 1;
    }
    if (out) {
        rc = gguf_catalog_save(c, out, id, err, sizeof err);
        if (!rc) {
            printf("%s\n", id);
            fprintf(stderr, "catalog of %s: %" PRIu64 " tensors, source sha256 %s -> %s\n", path, c->n_tensors,
                    c->source_sha256, out);
        }
    } else {
        char *json;
        size_t len;
        rc = gguf_catalog_to_json(c, &json, &len, id);
        if (!rc) {
            fwrite(json, 1, len, stdout);
            fprintf(stderr, "model id %s\n", id);
            free(json);
        }
    }
    gguf_catalog_free(c);
    if (rc) {
        fprintf(stderr, "kvctl catalog: %s\n", err);
        return 1;
    }
    return 0;
}

int kvctl_cmd_verify(int argc, char **argv)
{
    const char *path = NULL, *cat = NULL;
    if (kvctl_is_help(argc, argv)) {
        printf("usage: kvctl verify WINDOW --catalog CAT.json\n"
               "  check a stage window (or a whole model) tensor by tensor against a catalog; names\n"
               "  the first tensor that is missing or differs. Exit 0 when everything matches.\n");
        return 0;
    }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--catalog") && i + 1 < argc)
            cat = argv[++i];
        else if (argv[i][0] != '-' && !path)
            path = argv[i];
        else {
            fprintf(stderr, "kvctl verify: unexpected argument '%s' (see --help)\n", argv[i]);
            return 2;
        }
    }
    if (!path || !cat) {
        fprintf(stderr, "usage: kvctl verify WINDOW --catalog CAT.json\n");
        return 2;
    }
    char err[KV_ERR_MAX], id[65];
    struct gguf_catalog *c;
    if (gguf_catalog_load(&c, cat, id, err, sizeof err)) {
        fprintf(stderr, "kvctl verify: %s\n", err);
        return 1;
    }
    struct gguf_file *w;
    if (gguf_file_open(&w, path, err, sizeof err)) {
        fprintf(stderr, "kvctl verify: %s\n", err);
        gguf_catalog_free(c);
        return 1;
    }
    int rc = gguf_catalog_verify(c, w, err, sizeof err);
    if (rc)
        fprintf(stderr, "kvctl verify: %s: %s\n", path, err);
    else
        printf("%s: %" PRIu64 " tensors match catalog %s\n", path, gguf_tensor_count(w), id);
    gguf_file_free(w);
    gguf_catalog_free(c);
    return rc ? 1 : 0;
}

/* tool-gguf-mtp IN OUT: copies the qwen35 / qwen35moe GGUF IN to OUT with one
 * multi-token-prediction block appended after its blocks, as Qwen3.5 files carry it:
 * blk.N.* (N = IN's block_count) a copy of IN's last block's tensors (a full-attention block in
 * the default 3:1 schedule) plus blk.N.nextn.{eh_proj, enorm, hnorm, shared_head_norm}, with
 * <arch>.block_count N + 1 and <arch>.nextn_predict_layers 1. Every other key and tensor is
 * kept as it is. For the tests of what carries and plans such a block (slice, catalog, verify,
 * pull, kvctl plan) without a real MTP checkpoint. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "util/err.h"

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: tool-gguf-mtp IN OUT\n");
        return 2;
    }
    char err[KV_ERR_MAX] = "", arch[64] = "", key[128];
    struct gguf_file *f = NULL;
    struct gguf_writer *w = NULL;
    float *eh = NULL, *norm = NULL;
    int rc = gguf_file_open(&f, argv[1], err, sizeof err);
    uint32_t nb = 0, embd = 0;
    if (!rc)
        rc = gguf_file_map_tensors(f, NULL, NULL, err, sizeof err);
    if (!rc && (gguf_get_str(f, "general.architecture", arch, sizeof arch) || gguf_block_count(f, &nb) || !nb)) {
        snprintf(err, sizeof err, "%s: no general.architecture or block_count", argv[1]);
        rc = -EINVAL;
    }
    snprintf(key, sizeof key, "%s.embedding_length", arch);
    if (!rc && (gguf_get_u32(f, key, &embd) || !embd || embd > 65536)) {
        snprintf(err, sizeof err, "%s: %s missing or out of range", argv[1], key);
        rc = -EINVAL;
    }
    if (!rc)
        rc = gguf_writer_new(&w);
    for (uint64_t i = 0; !rc && i < gguf_kv_count(f); i++)
        rc = gguf_writer_set(w, gguf_kv_at(f, i)->key, &gguf_kv_at(f, i)->val);
    snprintf(key, sizeof key, "%s.block_count", arch);
    if (!rc)
        rc = gguf_writer_set_u32(w, key, nb + 1);
    snprintf(key, sizeof key, "%s.nextn_predict_layers", arch);
    if (!rc)
        rc = gguf_writer_set_u32(w, key, 1);
    for (uint64_t i = 0; !rc && i < gguf_tensor_count(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        rc = gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data);
    }
    /* the MTP block: the last block's tensors under the next number */
    char prefix[32];
    snprintf(prefix, sizeof prefix, "blk.%u.", nb - 1);
    for (uint64_t i = 0; !rc && i < gguf_tensor_count(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        if (strncmp(t->name, prefix, strlen(prefix)))
            continue;
        char name[GGUF_MAX_NAME + 1];
        snprintf(name, sizeof name, "blk.%u.%s", nb, t->name + strlen(prefix));
        rc = gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data);
    }
    /* its own tensors: eh_proj [2 n_embd, n_embd] projects [embedding | hidden], three norms */
    eh = calloc((size_t)2 * embd * embd, sizeof *eh);
    norm = malloc((size_t)embd * sizeof *norm);
    if (!rc && (!eh || !norm))
        rc = -ENOMEM;
    if (!rc) {
        for (size_t k = 0; k < (size_t)2 * embd * embd; k++)
            eh[k] = (float)((k * 2654435761u) % 2001) / 1000.0f - 1.0f;
        for (uint32_t k = 0; k < embd; k++)
            norm[k] = 1.0f;
        uint64_t ne2[2] = {2ull * embd, embd}, ne1[1] = {embd};
        static const char *norms[] = {"enorm", "hnorm", "shared_head_norm"};
        char name[GGUF_MAX_NAME + 1];
        snprintf(name, sizeof name, "blk.%u.nextn.eh_proj.weight", nb);
        rc = gguf_writer_add_tensor(w, name, GGUF_T_F32, 2, ne2, eh);
        for (int k = 0; !rc && k < 3; k++) {
            snprintf(name, sizeof name, "blk.%u.nextn.%s.weight", nb, norms[k]);
            rc = gguf_writer_add_tensor(w, name, GGUF_T_F32, 1, ne1, norm);
        }
    }
    if (!rc)
        rc = gguf_writer_write(w, argv[2], err, sizeof err);
    if (rc)
        fprintf(stderr, "tool-gguf-mtp: %s\n", err[0] ? err : strerror(-rc));
    gguf_writer_free(w);
    gguf_file_free(f);
    free(eh);
    free(norm);
    return rc ? 1 : 0;
}

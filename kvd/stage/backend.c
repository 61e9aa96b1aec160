/* backend.c — what every compute backend shares: the table of backends by name (the model
 * first; a build adds others before main runs, as tests/tools/stub_backend.c does for the network
 * tests' stand-in), closing, and rank 0's tokenizer. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvd/stage/internal.h"
#include "model/model.h"

static const struct kvd_backend_kind model_kind = {
    .name = "model", .help = "the model's window on the CPU (--model or --window)",
    .open = kvd_backend_open_model,
};
static const struct kvd_backend_kind *kinds[KVD_BACKEND_KINDS_MAX] = {&model_kind};
static size_t n_kinds = 1;

int kvd_backend_register(const struct kvd_backend_kind *k)
{
    if (kvd_backend_kind_find(k->name))
        return -EEXIST;
    if (n_kinds == KVD_BACKEND_KINDS_MAX)
        return -ENOSPC;
    kinds[n_kinds++] = k;
    return 0;
}

const struct kvd_backend_kind *kvd_backend_kind_at(size_t i)
{
    return i < n_kinds ? kinds[i] : NULL;
}

const struct kvd_backend_kind *kvd_backend_kind_find(const char *name)
{
    for (size_t i = 0; i < n_kinds; i++)
        if (!strcmp(kinds[i]->name, name))
            return kinds[i];
    return NULL;
}

void kvd_backend_close(struct kvd_backend *b)
{
    if (b)
        model_vocab_free(b->vocab);
    if (b && b->ops && b->ops->free)
        b->ops->free(b->impl);
    if (b)
        memset(b, 0, sizeof *b);
}

int kvd_backend_tokenize(struct kvd_backend *b, const char *text, int32_t **toks, uint32_t *n)
{
    if (!b->vocab)
        return -ENOSYS;
    return model_tokenize_alloc(b->vocab, text, toks, n);
}

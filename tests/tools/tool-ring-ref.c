/* tool-ring-ref — the one-process reference for ring tests: the generate loop of
 * `kvctl generate` (embed, window over every layer, head, sampler) that also writes the
 * logits of the last sampled position, so a ring's --dump-logits can be compared bit for bit.
 *
 * usage: tool-ring-ref -m FILE --tokens 1,2,3 -n N [--temp T --top-k K --top-p P --min-p P
 *        --seed S] [--ignore-eos] --dump-logits OUT */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "model/model.h"
#include "util/err.h"

int main(int argc, char **argv)
{
    const char *path = NULL, *toks = NULL, *dump = NULL;
    long n_gen = 16;
    bool ignore_eos = false;
    struct model_sampler_params sp;
    model_sampler_params_default(&sp);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "-m")) path = v, i++;
        else if (!strcmp(a, "--tokens")) toks = v, i++;
        else if (!strcmp(a, "-n")) n_gen = atol(v), i++;
        else if (!strcmp(a, "--temp")) sp.temperature = strtof(v, NULL), i++;
        else if (!strcmp(a, "--top-k")) sp.top_k = atoi(v), i++;
        else if (!strcmp(a, "--top-p")) sp.top_p = strtof(v, NULL), i++;
        else if (!strcmp(a, "--min-p")) sp.min_p = strtof(v, NULL), i++;
        else if (!strcmp(a, "--seed")) sp.seed = strtoull(v, NULL, 10), i++;
        else if (!strcmp(a, "--dump-logits")) dump = v, i++;
        else if (!strcmp(a, "--ignore-eos")) ignore_eos = true;
        else {
            fprintf(stderr, "tool-ring-ref: unknown option %s\n", a);
            return 2;
        }
    }
    if (!path || !toks || !dump)
        return 2;
    int32_t tokens[4096];
    uint32_t n = 0;
    for (char *p = (char *)toks; *p && n < 4096;) {
        char *end;
        long t = strtol(p, &end, 10);
        if (end == p)
            break;
        tokens[n++] = (int32_t)t;
        p = end + (*end == ',');
    }
    char err[KV_ERR_MAX];
    struct model *m;
    struct model_exec *e;
    if (model_open(&m, path, -1, -1, err, sizeof err) < 0) {
        fprintf(stderr, "tool-ring-ref: %s\n", err);
        return 1;
    }
    const struct model_hparams *hp = model_get_hparams(m);
    uint32_t n_ctx = hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096;
    uint32_t max_batch = 512 < n_ctx ? 512 : n_ctx;
    if (model_exec_new(&e, m, 1, n_ctx, max_batch) < 0 || model_session_new(e, 1) < 0)
        return 1;
    struct model_sampler *s;
    if (model_sampler_new(&s, &sp, hp->n_vocab) < 0)
        return 1;
    uint32_t eos = UINT32_MAX;
    if (gguf_get_u32(model_get_gguf(m), "tokenizer.ggml.eos_token_id", &eos) < 0)
        eos = UINT32_MAX;
    float *x = malloc((size_t)max_batch * hp->n_embd * 4), *lg = malloc((size_t)hp->n_vocab * 4),
          *keep = malloc((size_t)hp->n_vocab * 4);
    for (uint32_t i = 0; i < n; i++)
        model_sampler_accept(s, tokens[i]);
    uint32_t pos = 0, feed_n = n;
    int32_t *feed = tokens;
    for (long g = 0; g < n_gen; g++) {
        for (uint32_t done = 0; done < feed_n;) {
            uint32_t nb = feed_n - done < max_batch ? feed_n - done : max_batch;
            if (model_embed(e, feed + done, nb, x) < 0 || model_window_run(e, 1, pos + done, nb, x) < 0)
                return 1;
            if (done + nb == feed_n && model_head(e, x + (size_t)(nb - 1) * hp->n_embd, 1, lg) < 0)
                return 1;
            done += nb;
        }
        pos += feed_n;
        memcpy(keep, lg, (size_t)hp->n_vocab * 4);
        int32_t tok = model_sampler_sample(s, lg, NULL);
        if (tok < 0)
            return 1;
        if ((uint32_t)tok == eos && !ignore_eos)
            break;
        model_sampler_accept(s, tok);
        printf("%s%d", g ? " " : "", tok);
        tokens[n] = tok;
        feed = &tokens[n];
        feed_n = 1;
        if (n + 1 < 4096)
            n++;
    }
    printf("\n");
    FILE *f = fopen(dump, "wb");
    if (!f || fwrite(keep, 4, hp->n_vocab, f) != hp->n_vocab || fclose(f) != 0)
        return 1;
    model_sampler_free(s);
    model_exec_free(e);
    model_free(m);
    free(x);
    free(lg);
    free(keep);
    return 0;
}

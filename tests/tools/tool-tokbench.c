/* tool-tokbench VOCAB.gguf TEXTFILE [REPS]: tokenizer speed (tests/bench.sh). Loads the
 * vocabulary once, tokenises the whole file REPS times (default 3) and prints the best time,
 * MB/s and the token count; then streams the tokens back through the detokeniser. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gguf/gguf.h"
#include "model/model.h"
#include "util/err.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: tool-tokbench VOCAB.gguf TEXTFILE [REPS]\n");
        return 2;
    }
    int reps = argc > 3 ? atoi(argv[3]) : 3;
    if (reps < 1)
        reps = 1;
    FILE *fp = fopen(argv[2], "rb");
    if (!fp) {
        perror(argv[2]);
        return 1;
    }
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *text = malloc(len > 0 ? (size_t)len : 1);
    if (!text || fread(text, 1, (size_t)len, fp) != (size_t)len) {
        fprintf(stderr, "%s: read failed\n", argv[2]);
        return 1;
    }
    fclose(fp);

    char err[KV_ERR_MAX];
    struct gguf_file *f = NULL;
    struct model_vocab *v = NULL;
    double t0 = now_s();
    if (gguf_file_open(&f, argv[1], err, sizeof err) || model_vocab_load(&v, f, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", argv[1], err);
        return 1;
    }
    double t_load = now_s() - t0;

    size_t cap = (size_t)len + 4, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        t0 = now_s();
        int rc = model_tokenize(v, text, (size_t)len, false, false, ids, cap, &n);
        double t = now_s() - t0;
        if (rc) {
            fprintf(stderr, "tokenize: %s\n", strerror(-rc));
            return 1;
        }
        if (t < best)
            best = t;
    }
    struct model_detok *d = NULL;
    size_t out = 0;
    t0 = now_s();
    model_detok_new(&d, v, false, true);
    for (size_t i = 0; i < n; i++) {
        const char *s;
        size_t l;
        model_detok_push(d, ids[i], &s, &l);
        out += l;
    }
    double t_detok = now_s() - t0;
    model_detok_free(d);
    printf("%-8s %7.1f KB: tokenize %6.3f s (%6.2f MB/s), %zu tokens; stream detokenize %6.3f s; load %5.3f s\n",
           model_vocab_get_type(v) == MODEL_VOCAB_SPM ? "SPM" : model_vocab_pre(v), len / 1024.0, best,
           len / best / 1e6, n, t_detok, t_load);
    (void)out;
    free(ids);
    free(text);
    model_vocab_free(v);
    gguf_file_free(f);
    return 0;
}

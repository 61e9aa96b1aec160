/* fuzz_seed.h — the seed tools' one way to write a seed (tests/tools/tool-seed-NAME.c, run by
 * tests/fuzz.sh with the corpus directory). */
#ifndef KV_TESTS_FUZZ_SEED_H
#define KV_TESTS_FUZZ_SEED_H

#include <stdio.h>
#include <stdlib.h>

/* DIR/seed-NAME: the head bytes (a target's mode bytes; hn may be 0), then the body. A
 * failure is said and ends the tool with status 1. */
static inline void fuzz_seed_put(const char *dir, const char *name, const void *head, size_t hn,
                                 const void *body, size_t bn)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/seed-%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || (hn && fwrite(head, 1, hn, f) != hn) || (bn && fwrite(body, 1, bn, f) != bn) || fclose(f)) {
        perror(path);
        exit(1);
    }
}

#endif

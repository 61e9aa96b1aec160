/* fuzz_scratch.h — a fuzz target's scratch directory (/tmp/kv-fuzz-NAME-PID: node keys, a
 * database), removed when the target exits. */
#ifndef KV_TESTS_FUZZ_SCRATCH_H
#define KV_TESTS_FUZZ_SCRATCH_H

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static char fuzz_scratch_path[96];

static int fuzz_scratch_rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(p);
    return 0;
}

static void fuzz_scratch_rm(void)
{
    nftw(fuzz_scratch_path, fuzz_scratch_rm_one, 8, FTW_DEPTH | FTW_PHYS);
}

/* The directory's path (made by whoever writes into it first); once per process. */
static inline const char *fuzz_scratch(const char *name)
{
    if (!fuzz_scratch_path[0]) {
        snprintf(fuzz_scratch_path, sizeof fuzz_scratch_path, "/tmp/kv-fuzz-%s-%d", name, (int)getpid());
        atexit(fuzz_scratch_rm);
    }
    return fuzz_scratch_path;
}

#endif

/* util/mem.c — growing arrays, hashing names, dropping mapped pages. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "util/util.h"

int util_grow(void **p, size_t *cap, size_t size, size_t first)
{
    size_t c = *cap ? *cap * 2 : first;
    if (c < *cap || c > SIZE_MAX / size)
        return -ENOMEM;
    void *q = realloc(*p, c * size);
    if (!q)
        return -ENOMEM;
    *p = q;
    *cap = c;
    return 0;
}

uint64_t util_hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

void util_pages_drop(const void *p, size_t n)
{
    long ps = sysconf(_SC_PAGESIZE);
    uintptr_t page = ps > 0 ? (uintptr_t)ps : 4096;
    uintptr_t a = ((uintptr_t)p + page - 1) / page * page, e = ((uintptr_t)p + n) / page * page;
    if (e > a)
        (void)madvise((void *)a, e - a, MADV_DONTNEED); /* a hint: failing keeps the pages */
}

/* util/mem.c — growing arrays and byte buffers, hashing names, dropping mapped pages. */
#include <assert.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
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

/* The first capacity of a byte buffer: small, as most hold a line or a frame header; doubling
 * reaches any size in a few steps. */
#define BUF_FIRST 64

int util_buf_reserve(struct util_buf *b, size_t n, size_t max)
{
    /* len + n must fit under max, and the NUL after it under size_t */
    if (n > max - (b->len < max ? b->len : max) || b->len + n == SIZE_MAX)
        return -E2BIG;
    size_t need = b->len + n;
    if (b->p && need <= b->cap)
        return 0;
    size_t c = b->cap > SIZE_MAX / 2 ? SIZE_MAX : b->cap ? b->cap * 2 : BUF_FIRST;
    if (c < need)
        c = need;
    if (c > max)
        c = max;   /* need <= max: the cap never makes room for more than max */
    if (c == SIZE_MAX)
        c = SIZE_MAX - 1;
    uint8_t *q = realloc(b->p, c + 1);
    if (!q)
        return -ENOMEM;
    q[b->len] = 0;
    b->p = q;
    b->cap = c;
    return 0;
}

int util_buf_append(struct util_buf *b, const void *src, size_t n, size_t max)
{
    int rc = util_buf_reserve(b, n, max);
    if (rc < 0)
        return rc;
    if (n)
        memcpy(b->p + b->len, src, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

void util_buf_consume(struct util_buf *b, size_t n)
{
    assert(n <= b->len);   /* the caller drops bytes it has */
    if (n == 0)
        return;
    memmove(b->p, b->p + n, b->len - n);
    b->len -= n;
    b->p[b->len] = 0;
}

void util_buf_free(struct util_buf *b)
{
    free(b->p);
    *b = (struct util_buf){0};
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

#define HUGE_PAGE ((size_t)2 << 20)

void *util_alloc_huge(size_t n)
{
    void *p = NULL;
    if (n < HUGE_PAGE)
        return posix_memalign(&p, 64, n ? n : 64) == 0 ? p : NULL;
    if (posix_memalign(&p, HUGE_PAGE, n) != 0)
        return NULL;
    /* the whole huge pages only: a tail past the last 2 MiB boundary stays in 4 KiB pages, so
     * no buffer holds up to 2 MiB more than it asked for */
    (void)madvise(p, n / HUGE_PAGE * HUGE_PAGE, MADV_HUGEPAGE); /* a hint */
    return p;
}

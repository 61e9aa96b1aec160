/* util/file.c — a whole file into memory, under a cap, for the small JSON and text inputs
 * (manifests, descriptors, device profiles, tokenizer input). */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/util.h"

#define SETERR(...) do { if (err && errlen) snprintf(err, errlen, __VA_ARGS__); } while (0)

int util_file_read_stream(FILE *f, const char *name, size_t max, char **buf, size_t *len, char *err,
                          size_t errlen)
{
    /* grow as the data comes (a stream has no size to ask), reading one byte past max to tell
     * "exactly max" from "more" */
    size_t lim = max < SIZE_MAX - 1 ? max + 1 : max;
    struct util_buf b = {0};
    *buf = NULL;
    *len = 0;
    for (;;) {
        /* 64 KiB to start with, then the room doubles (util_buf_reserve), up to lim */
        if (util_buf_reserve(&b, b.p ? 1 : lim < 65536 ? lim : 65536, lim) < 0) {
            util_buf_free(&b);
            SETERR("%s: out of memory", name);
            return -ENOMEM;
        }
        size_t k = fread(b.p + b.len, 1, b.cap - b.len, f);
        b.len += k;
        if (b.len > max) {
            util_buf_free(&b);
            SETERR("%s: larger than %zu bytes", name, max);
            return -EFBIG;
        }
        if (b.len < b.cap) { /* fread stops short only at the end or on an error */
            if (ferror(f)) {
                int e = errno ? errno : EIO;
                util_buf_free(&b);
                SETERR("%s: %s", name, strerror(e));
                return -e;
            }
            break;
        }
    }
    b.p[b.len] = 0;   /* fread wrote past the NUL util_buf_reserve left */
    *buf = b.s;
    *len = b.len;
    return 0;
}

int util_file_read(const char *path, size_t max, char **buf, size_t *len, char *err, size_t errlen)
{
    *buf = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        SETERR("%s: %s", path, strerror(e));
        return -e;
    }
    int rc = util_file_read_stream(f, path, max, buf, len, err, errlen);
    fclose(f);
    return rc;
}

int util_file_replace(const char *path, const void *data, size_t n)
{
    char tmp[4200];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp)
        return -ENAMETOOLONG;
    FILE *f = fopen(tmp, "w");
    if (!f)
        return -errno;
    bool ok = fwrite(data, 1, n, f) == n;
    int e = ok ? 0 : errno;
    if (fclose(f) && ok) {
        ok = false;
        e = errno;
    }
    if (ok && rename(tmp, path))
        ok = false, e = errno;
    if (!ok)
        unlink(tmp);
    return ok ? 0 : -(e ? e : EIO);
}

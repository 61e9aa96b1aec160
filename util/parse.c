/* util/parse.c — decimal numbers from option values and headers, bounded, whole-string. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>

#include "util/util.h"

#define SETERR(...) do { if (err && errlen) snprintf(err, errlen, __VA_ARGS__); } while (0)

int util_scan_u64(const char **p, uint64_t max, uint64_t *out)
{
    const char *s = *p;
    uint64_t v = 0;
    if (*s < '0' || *s > '9')
        return -EINVAL;
    for (; *s >= '0' && *s <= '9'; s++) {
        unsigned d = (unsigned)(*s - '0');
        if (d > max || v > (max - d) / 10)
            return -ERANGE;
        v = v * 10 + d;
    }
    *p = s;
    *out = v;
    return 0;
}

/* The multiplier for a K/M/G suffix at s (which must end the string), 0 for anything else. */
static uint64_t suffix_mult(const char *s)
{
    if (!s[0])
        return 1;
    if (s[1])
        return 0;
    switch (s[0]) {
    case 'k': case 'K': return 1ull << 10;
    case 'm': case 'M': return 1ull << 20;
    case 'g': case 'G': return 1ull << 30;
    default: return 0;
    }
}

int util_parse_u64(const char *s, uint64_t lo, uint64_t hi, unsigned flags, uint64_t *out,
                   char *err, size_t errlen)
{
    const char *p = s;
    uint64_t v = 0, m = 1;
    int rc = util_scan_u64(&p, UINT64_MAX, &v);
    if (rc == 0)
        m = (flags & UTIL_PARSE_SUFFIX) ? suffix_mult(p) : (*p ? 0 : 1);
    if (rc < 0 || m == 0 || v > UINT64_MAX / m || v * m < lo || v * m > hi) {
        SETERR("'%s' is not an integer in [%" PRIu64 ", %" PRIu64 "]%s", s, lo, hi,
               (flags & UTIL_PARSE_SUFFIX) ? " (K/M/G suffixes)" : "");
        return -EINVAL;
    }
    *out = v * m;
    return 0;
}

int util_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out, char *err, size_t errlen)
{
    const char *p = s + (*s == '-' || *s == '+');
    uint64_t mag = 0;
    /* the magnitude may reach 2^63 only for a negative number */
    int rc = util_scan_u64(&p, (uint64_t)INT64_MAX + (*s == '-'), &mag);
    int64_t v = 0;
    if (rc == 0 && !*p)
        v = *s == '-' ? (int64_t)(0 - mag) : (int64_t)mag;
    if (rc < 0 || *p || v < lo || v > hi) {
        SETERR("'%s' is not an integer in [%" PRId64 ", %" PRId64 "]", s, lo, hi);
        return -EINVAL;
    }
    *out = v;
    return 0;
}

int util_parse_double(const char *s, double lo, double hi, unsigned flags, double *out, char *err,
                      size_t errlen)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    uint64_t m = (flags & UTIL_PARSE_SUFFIX) ? suffix_mult(end) : (*end ? 0 : 1);
    if (end == s || m == 0 || errno || !isfinite(v) || !(v * (double)m >= lo && v * (double)m <= hi)) {
        SETERR("'%s' is not a number in [%g, %g]%s", s, lo, hi,
               (flags & UTIL_PARSE_SUFFIX) ? " (K/M/G suffixes)" : "");
        return -EINVAL;
    }
    *out = v * (double)m;
    return 0;
}

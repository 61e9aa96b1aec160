/* util/fmt.c — bytes and hex for people and for ids; error messages into err/errlen; a peer's
 * text made safe to log. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "util/util.h"

void util_fmt_bytes(char *buf, size_t n, double v, int decimals, unsigned flags)
{
    static const char *const iec[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    static const char *const si[] = {"B", "kB", "MB", "GB", "TB"};
    const char *const *u = (flags & UTIL_FMT_SI) ? si : iec;
    double base = (flags & UTIL_FMT_SI) ? 1000 : 1024;
    int i = 0;
    while (v >= base && i < 4) {
        v /= base;
        i++;
    }
    if (i == 0)
        snprintf(buf, n, "%.0f B", v);
    else
        snprintf(buf, n, "%.*f %s", decimals, v, u[i]);
}

void util_hex_encode(const void *src, size_t n, char *out)
{
    static const char d[] = "0123456789abcdef";
    const unsigned char *b = src;
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = d[b[i] >> 4];
        out[2 * i + 1] = d[b[i] & 15];
    }
    out[2 * n] = 0;
}

int util_hex_digit(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

int util_hex_decode(const char *s, void *dst, size_t n)
{
    unsigned char *b = dst;
    if (!s || strlen(s) != 2 * n)
        return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        int hi = util_hex_digit(s[2 * i]), lo = util_hex_digit(s[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -EINVAL;
        b[i] = (unsigned char)(hi << 4 | lo);
    }
    return 0;
}

void util_seterr(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

size_t util_text_clean(char *out, size_t outn, const uint8_t *in, size_t n)
{
    if (outn < 4) {
        if (outn)
            out[0] = 0;
        return 0;
    }
    bool cut = n > outn - 1;
    size_t k = cut ? outn - 4 : n;
    for (size_t i = 0; i < k; i++)
        out[i] = in[i] >= 0x20 && in[i] < 0x7f ? (char)in[i] : '?';
    if (cut) {
        memcpy(out + k, "...", 3);
        k += 3;
    }
    out[k] = 0;
    return k;
}

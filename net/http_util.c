/* http_util.c — pure helpers of the HTTP server: Range parsing, path cleaning, Accept-Encoding,
 * status texts. No I/O; tested directly by tests/unit/test-net-http.c. */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "net/net.h"
#include "util/util.h"

const char *net_http_status_text(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 101: return "Switching Protocols";
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 206: return "Partial Content";
    case 301: return "Moved Permanently";
    case 302: return "Found";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 416: return "Range Not Satisfiable";
    case 417: return "Expectation Failed";
    case 426: return "Upgrade Required";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default:  return status < 300 ? "OK" : status < 400 ? "Redirect" : status < 500 ? "Client Error"
                                                                               : "Server Error";
    }
}

int net_http_range_parse(const char *h, uint64_t size, uint64_t *first, uint64_t *last)
{
    if (!h)
        return 0;
    while (*h == ' ' || *h == '\t')
        h++;
    if (strncasecmp(h, "bytes", 5) != 0)
        return 0;
    h += 5;
    while (*h == ' ' || *h == '\t')
        h++;
    if (*h != '=')
        return 0;
    h++;
    while (*h == ' ' || *h == '\t')
        h++;
    if (strchr(h, ','))
        return 0; /* several ranges: served whole (RFC 9110 lets a server ignore Range) */
    uint64_t a = 0, b = 0;
    if (*h == '-') { /* suffix: the last N bytes */
        h++;
        if (util_scan_u64(&h, UINT64_MAX, &b) != 0)
            return 0;
        while (*h == ' ' || *h == '\t')
            h++;
        if (*h)
            return 0;
        if (b == 0 || size == 0)
            return -ERANGE;
        *first = b >= size ? 0 : size - b;
        *last = size - 1;
        return 1;
    }
    if (util_scan_u64(&h, UINT64_MAX, &a) != 0 || *h != '-')
        return 0;
    h++;
    bool open_end = true;
    if (*h >= '0' && *h <= '9') {
        if (util_scan_u64(&h, UINT64_MAX, &b) != 0)
            return 0;
        open_end = false;
    }
    while (*h == ' ' || *h == '\t')
        h++;
    if (*h)
        return 0;
    if (!open_end && b < a)
        return 0; /* invalid range-spec: ignored */
    if (a >= size)
        return -ERANGE;
    *first = a;
    *last = open_end || b >= size ? size - 1 : b;
    return 1;
}

int net_http_path_clean(const char *in, size_t n, char *out, size_t outlen, char *err,
                        size_t errlen)
{
    if (n == 0 || in[0] != '/') {
        snprintf(err, errlen, "path does not start with '/'");
        return -EINVAL;
    }
    if (outlen == 0 || n >= outlen) {
        snprintf(err, errlen, "path length %zu over the limit %zu", n, outlen ? outlen - 1 : 0);
        return -EINVAL;
    }
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int c = (unsigned char)in[i];
        if (c == '%') {
            if (i + 2 >= n) {
                snprintf(err, errlen, "truncated percent escape at byte %zu", i);
                return -EINVAL;
            }
            int h1 = util_hex_digit((unsigned char)in[i + 1]);
            int h2 = util_hex_digit((unsigned char)in[i + 2]);
            if (h1 < 0 || h2 < 0) {
                snprintf(err, errlen, "bad percent escape at byte %zu", i);
                return -EINVAL;
            }
            c = h1 * 16 + h2;
            i += 2;
        }
        if (c == 0 || c < 0x20 || c == 0x7f) {
            snprintf(err, errlen, "control byte 0x%02x in path", c);
            return -EINVAL;
        }
        if (c == '\\') {
            snprintf(err, errlen, "backslash in path");
            return -EINVAL;
        }
        out[o++] = (char)c;
    }
    out[o] = 0;
    /* Segment checks on the decoded path: no empty (except a trailing '/'), ".", "..". */
    const char *s = out + 1;
    for (;;) {
        const char *e = strchr(s, '/');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        if (len == 0 && e) {
            snprintf(err, errlen, "empty path segment ('//')");
            return -EINVAL;
        }
        if ((len == 1 && s[0] == '.') || (len == 2 && s[0] == '.' && s[1] == '.')) {
            snprintf(err, errlen, "'%.*s' segment in path", (int)len, s);
            return -EINVAL;
        }
        if (!e)
            break;
        s = e + 1;
    }
    return 0;
}

bool net_http_accepts(const char *ae, const char *coding)
{
    if (!ae || !coding)
        return false;
    size_t cl = strlen(coding);
    const char *p = ae;
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        const char *tok = p;
        while (*p && *p != ',' && *p != ';' && *p != ' ' && *p != '\t')
            p++;
        size_t tl = (size_t)(p - tok);
        bool match = tl == cl && strncasecmp(tok, coding, cl) == 0;
        double q = 1.0;
        /* parameters up to the next comma */
        while (*p && *p != ',') {
            if (*p == ';') {
                p++;
                while (*p == ' ' || *p == '\t')
                    p++;
                if ((p[0] == 'q' || p[0] == 'Q') && p[1] == '=') {
                    char buf[16];
                    size_t k = 0;
                    p += 2;
                    while (*p && *p != ',' && *p != ';' && k + 1 < sizeof buf)
                        buf[k++] = *p++;
                    buf[k] = 0;
                    q = 0;
                    for (size_t j = 0; j < k; j++)
                        if (buf[j] >= '1' && buf[j] <= '9')
                            q = 1; /* any non-zero digit: accepted */
                    continue;
                }
            } else {
                p++;
            }
        }
        if (match)
            return q > 0;
    }
    return false;
}

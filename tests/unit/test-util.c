/* test-util.c — the shared helpers: number parsers (bounds, suffixes, overflow, garbage), hex
 * round-trip and bad digits, byte formatting, whole-file reads under a cap, the clock, JSON
 * numbers. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "tests/lib/t.h"
#include "util/util.h"
#include "util/err.h"

T_CASE(parse_u64_bounds)
{
    uint64_t v = 7;
    char err[128];
    T_CHECK(util_parse_u64("0", 0, 10, 0, &v, err, sizeof err) == 0 && v == 0, "0");
    T_CHECK(util_parse_u64("10", 0, 10, 0, &v, err, sizeof err) == 0 && v == 10, "hi inclusive");
    T_CHECK(util_parse_u64("11", 0, 10, 0, &v, err, sizeof err) == -EINVAL && v == 10, "above hi");
    T_CHECK(strstr(err, "'11'") && strstr(err, "[0, 10]"), "message names value and bounds: %s", err);
    T_CHECK(util_parse_u64("2", 3, 10, 0, &v, err, sizeof err) == -EINVAL, "below lo");
    T_CHECK(util_parse_u64("18446744073709551615", 0, UINT64_MAX, 0, &v, NULL, 0) == 0 && v == UINT64_MAX,
            "UINT64_MAX");
    T_CHECK(util_parse_u64("18446744073709551616", 0, UINT64_MAX, 0, &v, NULL, 0) == -EINVAL, "2^64 overflows");
    T_CHECK(util_parse_u64("99999999999999999999999", 0, UINT64_MAX, 0, &v, NULL, 0) == -EINVAL, "long overflow");
    const char *bad[] = {"", "-1", "+1", " 1", "1 ", "1x", "x", "0x10", "1.5", "1K"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        T_CHECK(util_parse_u64(bad[i], 0, UINT64_MAX, 0, &v, err, sizeof err) == -EINVAL, "'%s' accepted", bad[i]);
}

T_CASE(parse_u64_suffix)
{
    uint64_t v = 0;
    T_CHECK(util_parse_u64("4k", 0, UINT64_MAX, UTIL_PARSE_SUFFIX, &v, NULL, 0) == 0 && v == 4096, "4k");
    T_CHECK(util_parse_u64("3M", 0, UINT64_MAX, UTIL_PARSE_SUFFIX, &v, NULL, 0) == 0 && v == 3u << 20, "3M");
    T_CHECK(util_parse_u64("2g", 0, UINT64_MAX, UTIL_PARSE_SUFFIX, &v, NULL, 0) == 0 && v == 2ull << 30, "2g");
    T_CHECK(util_parse_u64("5", 0, UINT64_MAX, UTIL_PARSE_SUFFIX, &v, NULL, 0) == 0 && v == 5, "no suffix");
    T_CHECK(util_parse_u64("2K", 0, 2047, UTIL_PARSE_SUFFIX, &v, NULL, 0) == -EINVAL, "bounds after the suffix");
    T_CHECK(util_parse_u64("1KB", 0, UINT64_MAX, UTIL_PARSE_SUFFIX, &v, NULL, 0) == -EINVAL, "two letters");
    T_CHECK(util_parse_u64("1T", 0, UINT64_MAX, UTIL_PARSE_SUFFIX, &v, NULL, 0) == -EINVAL, "unknown suffix");
    T_CHECK(util_parse_u64("K", 0, UINT64_MAX, UTIL_PARSE_SUFFIX, &v, NULL, 0) == -EINVAL, "suffix alone");
    T_CHECK(util_parse_u64("17179869184G", 0, UINT64_MAX, UTIL_PARSE_SUFFIX, &v, NULL, 0) == -EINVAL,
            "2^34 G overflows");
}

T_CASE(scan_u64)
{
    const char *s = "123-45", *p = s;
    uint64_t v = 0;
    T_CHECK(util_scan_u64(&p, UINT64_MAX, &v) == 0 && v == 123 && p == s + 3, "prefix");
    p = "-1";
    T_CHECK(util_scan_u64(&p, UINT64_MAX, &v) == -EINVAL, "no digit");
    s = p = "1000";
    T_CHECK(util_scan_u64(&p, 999, &v) == -ERANGE && p == s, "over max, cursor kept");
    p = "7";
    T_CHECK(util_scan_u64(&p, 5, &v) == -ERANGE, "one digit over a small max");
}

T_CASE(parse_i64)
{
    int64_t v = 0;
    T_CHECK(util_parse_i64("-5", -10, 10, &v, NULL, 0) == 0 && v == -5, "-5");
    T_CHECK(util_parse_i64("+5", -10, 10, &v, NULL, 0) == 0 && v == 5, "+5");
    T_CHECK(util_parse_i64("-11", -10, 10, &v, NULL, 0) == -EINVAL, "below lo");
    T_CHECK(util_parse_i64("-9223372036854775808", INT64_MIN, INT64_MAX, &v, NULL, 0) == 0 && v == INT64_MIN,
            "INT64_MIN");
    T_CHECK(util_parse_i64("9223372036854775807", INT64_MIN, INT64_MAX, &v, NULL, 0) == 0 && v == INT64_MAX,
            "INT64_MAX");
    T_CHECK(util_parse_i64("9223372036854775808", INT64_MIN, INT64_MAX, &v, NULL, 0) == -EINVAL, "2^63");
    T_CHECK(util_parse_i64("-9223372036854775809", INT64_MIN, INT64_MAX, &v, NULL, 0) == -EINVAL, "-2^63-1");
    const char *bad[] = {"", "-", "+", "--1", "1-", "1e3", " 1"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        T_CHECK(util_parse_i64(bad[i], INT64_MIN, INT64_MAX, &v, NULL, 0) == -EINVAL, "'%s' accepted", bad[i]);
}

T_CASE(parse_double)
{
    double v = 0;
    char err[128];
    T_CHECK(util_parse_double("0.5", 0, 1, 0, &v, err, sizeof err) == 0 && v == 0.5, "0.5");
    T_CHECK(util_parse_double("1e3", 0, 1e3, 0, &v, err, sizeof err) == 0 && v == 1000, "1e3");
    T_CHECK(util_parse_double("1.5", 0, 1, 0, &v, err, sizeof err) == -EINVAL, "above hi");
    T_CHECK(strstr(err, "'1.5'") && strstr(err, "[0, 1]"), "message: %s", err);
    T_CHECK(util_parse_double("1.5M", 0, 1e13, UTIL_PARSE_SUFFIX, &v, NULL, 0) == 0 && v == 1.5 * 1048576, "1.5M");
    T_CHECK(util_parse_double("1.5M", 0, 1e13, 0, &v, NULL, 0) == -EINVAL, "suffix without the flag");
    const char *bad[] = {"", "x", "1x", "nan", "inf", "-inf", "1e999", "1 "};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        T_CHECK(util_parse_double(bad[i], -HUGE_VAL, HUGE_VAL, 0, &v, NULL, 0) == -EINVAL, "'%s' accepted", bad[i]);
}

T_CASE(hex)
{
    uint8_t b[256], back[256];
    for (int i = 0; i < 256; i++)
        b[i] = (uint8_t)i;
    char hex[513];
    util_hex_encode(b, sizeof b, hex);
    T_CHECK(strlen(hex) == 512 && !strncmp(hex, "000102", 6) && !strcmp(hex + 506, "fdfeff"), "encode: %.8s", hex);
    T_CHECK(util_hex_decode(hex, back, sizeof back) == 0 && !memcmp(b, back, sizeof b), "round trip");
    uint8_t x[2];
    T_CHECK(util_hex_decode("aBcD", x, 2) == 0 && x[0] == 0xab && x[1] == 0xcd, "upper and lower case");
    T_CHECK(util_hex_decode("abc", x, 2) == -EINVAL, "odd length");
    T_CHECK(util_hex_decode("abcdef", x, 2) == -EINVAL, "too long");
    T_CHECK(util_hex_decode("abcg", x, 2) == -EINVAL, "bad digit");
    T_CHECK(util_hex_decode(" bcd", x, 2) == -EINVAL, "space");
    T_CHECK(util_hex_decode(NULL, x, 2) == -EINVAL, "NULL");
    util_hex_encode(b, 0, hex);
    T_CHECK(hex[0] == 0, "empty");
    T_CHECK(util_hex_digit('f') == 15 && util_hex_digit('G') == -1 && util_hex_digit(0) == -1, "digit");
}

T_CASE(fmt_bytes)
{
    char b[32];
    util_fmt_bytes(b, sizeof b, 0, 2, 0);
    T_CHECK(!strcmp(b, "0 B"), "%s", b);
    util_fmt_bytes(b, sizeof b, 1023, 2, 0);
    T_CHECK(!strcmp(b, "1023 B"), "%s", b);
    util_fmt_bytes(b, sizeof b, 1024, 2, 0);
    T_CHECK(!strcmp(b, "1.00 KiB"), "%s", b);
    util_fmt_bytes(b, sizeof b, 12.75 * 1048576, 2, 0);
    T_CHECK(!strcmp(b, "12.75 MiB"), "%s", b);
    util_fmt_bytes(b, sizeof b, 3.0 * 1024 * 1048576, 1, 0);
    T_CHECK(!strcmp(b, "3.0 GiB"), "%s", b);
    util_fmt_bytes(b, sizeof b, 5e15, 1, 0);
    T_CHECK(!strcmp(b, "4547.5 TiB"), "TiB is the largest unit: %s", b);
    util_fmt_bytes(b, sizeof b, 999, 2, UTIL_FMT_SI);
    T_CHECK(!strcmp(b, "999 B"), "%s", b);
    util_fmt_bytes(b, sizeof b, 1500, 1, UTIL_FMT_SI);
    T_CHECK(!strcmp(b, "1.5 kB"), "%s", b);
    util_fmt_bytes(b, sizeof b, 7.25e9, 2, UTIL_FMT_SI);
    T_CHECK(!strcmp(b, "7.25 GB"), "%s", b);
    util_fmt_bytes(b, 4, 7.25e9, 2, UTIL_FMT_SI);
    T_CHECK(!strcmp(b, "7.2"), "truncated to the buffer: %s", b);
}

static const char *write_tmp(const char *name, const char *data, size_t n)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", t_tmpdir(), name);
    FILE *f = fopen(path, "wb");
    if (!f)
        return NULL;
    fwrite(data, 1, n, f);
    fclose(f);
    return path;
}

T_CASE(file_read)
{
    char err[KV_ERR_MAX], *buf = NULL;
    size_t len = 0;
    const char *p = write_tmp("ten", "0123456789", 10);
    T_ASSERT(p, "scratch file");
    T_CHECK(util_file_read(p, 10, &buf, &len, err, sizeof err) == 0 && len == 10 && !strcmp(buf, "0123456789"),
            "exactly the cap: %s", err);
    free(buf);
    buf = NULL;
    T_CHECK(util_file_read(p, 9, &buf, &len, err, sizeof err) == -EFBIG && !buf, "one past the cap");
    T_CHECK(strstr(err, "ten: larger than 9 bytes"), "message: %s", err);
    T_CHECK(util_file_read("/nonexistent/kv-util", 10, &buf, &len, err, sizeof err) == -ENOENT, "missing");
    T_CHECK(!strcmp(err, "/nonexistent/kv-util: No such file or directory"), "message: %s", err);
    T_CHECK(util_file_read(t_tmpdir(), 10, &buf, &len, err, sizeof err) == -EISDIR, "a directory: %s", err);
    p = write_tmp("empty", "", 0);
    T_CHECK(util_file_read(p, 10, &buf, &len, err, sizeof err) == 0 && len == 0 && buf && !buf[0], "empty");
    free(buf);
    /* larger than the first read buffer, with NULs inside */
    size_t big = 300000;
    char *data = malloc(big);
    T_ASSERT(data, "malloc");
    for (size_t i = 0; i < big; i++)
        data[i] = (char)(i * 7);
    p = write_tmp("big", data, big);
    buf = NULL;
    T_CHECK(util_file_read(p, big, &buf, &len, err, sizeof err) == 0 && len == big && !memcmp(buf, data, big) &&
                buf[big] == 0, "big: %s", err);
    free(buf);
    T_CHECK(util_file_read(p, big - 1, &buf, &len, NULL, 0) == -EFBIG, "big, one past the cap");
    T_CHECK(util_file_read(p, 1u << 30, &buf, &len, NULL, 0) == 0 && len == big, "a large cap allocates as it goes");
    free(buf);
    free(data);
}

T_CASE(monotonic_clock)
{
    uint64_t a = util_now_ns();
    double ms = util_now_ms(), s = util_now_s();
    uint64_t b = util_now_ns();
    T_CHECK(b >= a, "monotonic");
    T_CHECK(fabs(ms / 1e3 - s) < 1 && fabs((double)a / 1e6 - ms) < 1000, "one clock: %f %f", ms, s);
}

T_CASE(json)
{
    cJSON *o = cJSON_Parse("{\"n\": 5, \"s\": \"x\", \"big\": 1e30}");
    T_ASSERT(o, "parse");
    T_CHECK(util_json_number(o, "n", 1) == 5, "present");
    T_CHECK(util_json_number(o, "s", 1) == 1, "not a number: default");
    T_CHECK(util_json_number(o, "none", -2) == -2, "absent: default");
    char err[128];
    double d = -1;
    T_CHECK(util_json_number_in(o, "n", 0, 10, true, &d, "ctx", err, sizeof err) == 0 && d == 5, "in range");
    T_CHECK(util_json_number_in(o, "none", 0, 10, false, &d, "ctx", err, sizeof err) == 1 && d == 5, "optional");
    T_CHECK(util_json_number_in(o, "none", 0, 10, true, &d, "ctx", err, sizeof err) == -EINVAL &&
                !strcmp(err, "ctx: 'none' is required"), "required: %s", err);
    T_CHECK(util_json_number_in(o, "big", 0, 10, true, &d, "ctx", err, sizeof err) == -EINVAL &&
                !strcmp(err, "ctx: 'big' must be a number in [0, 10]"), "range: %s", err);
    T_CHECK(util_json_number_in(o, "s", 0, 10, true, &d, "ctx", err, sizeof err) == -EINVAL, "string");
    cJSON_Delete(o);
}

T_CASE(grow)
{
    int32_t *a = NULL;
    size_t cap = 0;
    T_ASSERT(util_grow((void **)&a, &cap, sizeof *a, 4) == 0 && a && cap == 4, "first: cap %zu", cap);
    for (int i = 0; i < 4; i++)
        a[i] = i;
    T_ASSERT(util_grow((void **)&a, &cap, sizeof *a, 4) == 0 && cap == 8, "doubles: cap %zu", cap);
    T_CHECK(a[0] == 0 && a[3] == 3, "contents kept");
    size_t huge = SIZE_MAX / 2 + 1;
    int32_t *keep = a;
    T_CHECK(util_grow((void **)&a, &huge, sizeof *a, 4) == -ENOMEM && a == keep &&
            huge == SIZE_MAX / 2 + 1, "overflow refused, array and cap unchanged");
    free(a);
}

T_CASE(buf)
{
    struct util_buf b = {0};
    util_buf_free(&b);
    T_CHECK(!b.p && b.len == 0 && b.cap == 0, "free of an empty buffer");
    T_ASSERT(util_buf_reserve(&b, 0, 100) == 0 && b.p && b.cap > 0 && !strcmp(b.s, ""),
             "reserve 0: allocated, an empty string");
    char chunk[40];
    memset(chunk, 'x', sizeof chunk);
    T_ASSERT(util_buf_append(&b, "ab", 2, 100) == 0 && b.len == 2 && !strcmp(b.s, "ab"), "append");
    for (int i = 0; i < 2; i++)
        T_ASSERT(util_buf_append(&b, chunk, sizeof chunk, 100) == 0, "append %d", i);
    T_CHECK(b.len == 82 && b.cap >= 82 && b.cap <= 100 && b.s[82] == 0 && !memcmp(b.s, "abxx", 4),
            "grown under the cap: len %zu cap %zu", b.len, b.cap);
    size_t cap = b.cap;
    uint8_t *keep = b.p;
    T_CHECK(util_buf_append(&b, chunk, 19, 100) == -E2BIG && b.len == 82 && b.cap == cap &&
            b.p == keep && b.s[82] == 0, "an append across the cap refused, the buffer unchanged");
    T_CHECK(util_buf_append(&b, chunk, 18, 100) == 0 && b.len == 100 && b.cap == 100,
            "up to the cap exactly, never more room: cap %zu", b.cap);
    T_CHECK(util_buf_reserve(&b, 1, 100) == -E2BIG && util_buf_reserve(&b, 0, 100) == 0, "full");
    T_CHECK(util_buf_reserve(&b, SIZE_MAX, SIZE_MAX) == -E2BIG &&
            util_buf_reserve(&b, SIZE_MAX - 100, SIZE_MAX) == -E2BIG && b.len == 100 && b.cap == 100,
            "a size past size_t (with the NUL) refused");
    util_buf_consume(&b, 98);
    T_CHECK(b.len == 2 && !strcmp(b.s, "xx"), "consume moves the rest to the front");
    util_buf_consume(&b, 2);
    T_CHECK(b.len == 0 && !strcmp(b.s, ""), "consume all");
    util_buf_free(&b);
    T_CHECK(!b.p && b.len == 0 && b.cap == 0, "freed");
    T_CHECK(util_buf_append(&b, NULL, 0, 0) == 0 && b.p && b.cap == 0 && !strcmp(b.s, ""),
            "nothing under a zero cap: an empty string");
    T_CHECK(util_buf_append(&b, "a", 1, 0) == -E2BIG, "one byte over a zero cap");
    util_buf_free(&b);
    for (size_t i = 0; i < 1000; i++)
        T_ASSERT(util_buf_append(&b, chunk, 1 + i % 7, SIZE_MAX) == 0, "append %zu", i);
    T_CHECK(b.len == 3997 && b.cap >= b.len && b.cap < 2 * b.len && b.s[b.len] == 0,
            "doubling: len %zu cap %zu", b.len, b.cap);
    util_buf_free(&b);
}

static int cmd_a(int argc, char **argv) { return argc + (argv[0][0] == 'a' ? 10 : 20); }

T_CASE(cmd_table)
{
    static const struct util_cmd cmds[] = {{"alpha", cmd_a, "first"}, {"beta", cmd_a, "second"}};
    const struct util_cmd *c = util_cmd_find(cmds, 2, "beta");
    T_CHECK(c == &cmds[1], "found beta");
    T_CHECK(util_cmd_find(cmds, 2, "gamma") == NULL && util_cmd_find(cmds, 2, "alph") == NULL,
            "no prefix match, no unknown");
    char *argv[] = {(char *)"alpha", NULL};
    T_CHECK(util_cmd_find(cmds, 2, "alpha")->fn(1, argv) == 11, "calls the entry");
    char buf[256] = "";
    FILE *f = fmemopen(buf, sizeof buf, "w");
    T_ASSERT(f, "fmemopen");
    util_cmd_list(f, cmds, 2, 6);
    fclose(f);
    T_CHECK(!strcmp(buf, "  alpha  first\n  beta   second\n"), "list: '%s'", buf);
    T_CHECK(util_is_help("-h") && util_is_help("--help") && util_is_help("help") &&
            !util_is_help("--helpx") && !util_is_help(""), "help words");
}

T_CASE(seterr)
{
    char err[8];
    util_seterr(err, sizeof err, "value %d too big", 12345);
    T_CHECK(!strcmp(err, "value 1"), "cut to fit: '%s'", err);
    util_seterr(NULL, 0, "nothing %d", 1);
    util_seterr(err, 0, "nothing %d", 1);
    T_CHECK(!strcmp(err, "value 1"), "errlen 0 writes nothing");
}

/* util_alloc_huge: 64-byte aligned below 2 MiB, 2 MiB aligned from it, every byte usable
 * (whether the kernel gave huge pages depends on its THP setting, so it is not asserted). */
T_CASE(alloc_huge)
{
    const size_t sizes[] = {1, 100, ((size_t)2 << 20) - 1, (size_t)2 << 20, ((size_t)5 << 20) + 123};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i];
        unsigned char *p = util_alloc_huge(n);
        T_ASSERT(p, "alloc %zu", n);
        size_t align = n >= ((size_t)2 << 20) ? (size_t)2 << 20 : 64;
        T_CHECK((uintptr_t)p % align == 0, "%zu bytes at %p: not %zu-aligned", n, (void *)p, align);
        for (size_t k = 0; k < n; k++)
            p[k] = (unsigned char)(k * 131);
        size_t bad = 0;
        for (size_t k = 0; k < n; k++)
            bad += p[k] != (unsigned char)(k * 131);
        T_CHECK(bad == 0, "%zu bytes: %zu read back wrong", n, bad);
        free(p);
    }
}

int main(int argc, char **argv)
{
    t_init(argc, argv);
    T_RUN(parse_u64_bounds);
    T_RUN(parse_u64_suffix);
    T_RUN(scan_u64);
    T_RUN(parse_i64);
    T_RUN(parse_double);
    T_RUN(hex);
    T_RUN(fmt_bytes);
    T_RUN(file_read);
    T_RUN(monotonic_clock);
    T_RUN(json);
    T_RUN(grow);
    T_RUN(buf);
    T_RUN(cmd_table);
    T_RUN(seterr);
    T_RUN(alloc_huge);
    return T_DONE();
}

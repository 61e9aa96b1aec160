/* util — the small helpers every module shares: number parsing with bounds, growing arrays and
 * byte buffers, byte and hex formatting, reading a whole file under a cap, the monotonic clock,
 * numbers from cJSON objects. The bottom layer: it depends on no other module (docs/design.md,
 * "Module layout").
 *
 * Conventions as elsewhere: actions return 0 or a negative errno and put the reason in
 * err/errlen (err may be NULL when the caller prints its own message). */
#ifndef KVASIR_UTIL_H
#define KVASIR_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct cJSON;

/* ------------------------------------------------------------------ numbers (util/parse.c) */

/* A program's table of subcommands (kvd's roles, kvctl's commands): a name, its entry point
 * (argv[0] is the name; returns the exit status) and a one-line help. */
struct util_cmd {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
};
/* The entry of cmds[0..n) called name, or NULL. */
const struct util_cmd *util_cmd_find(const struct util_cmd *cmds, size_t n, const char *name);
/* One line per entry, "  NAME HELP" with names padded to width, on out. */
void util_cmd_list(FILE *out, const struct util_cmd *cmds, size_t n, int width);
/* True when arg asks for help: -h, --help or help. */
bool util_is_help(const char *arg);
/* Rewrites *argv so that each "--name=VALUE" is two arguments, "--name" and "VALUE", for
 * option loops written by hand (getopt_long does this itself). The new array lives until
 * exit. 0 or -ENOMEM. */
int util_args_split_eq(int *argc, char ***argv);

/* ------------------------------------------------------------------ memory (util/mem.c) */

/* Doubles the capacity *cap (first when 0) of the array *p of size-byte elements: 0, or
 * -ENOMEM with *p and *cap unchanged. */
int util_grow(void **p, size_t *cap, size_t size, size_t first);

/* A growable byte buffer: p[0..len) are the bytes; once anything was reserved p holds cap bytes
 * and a NUL after them, and p[len] is 0 after every call here, so text in it is a C string
 * (s is the same pointer as text). {0} is an empty buffer; util_buf_free releases it. */
struct util_buf {
    union {
        uint8_t *p;
        char *s;
    };
    size_t len, cap;
};
/* Room for n more bytes after len (cap >= len + n), doubling the capacity but never past max
 * bytes: 0; -E2BIG when len + n would pass max (or size_t), -ENOMEM; b is unchanged on
 * failure. A caller that writes into the room itself then sets len and p[len] = 0. */
int util_buf_reserve(struct util_buf *b, size_t n, size_t max);
/* Appends src[0..n) under the cap max: 0, -E2BIG or -ENOMEM as util_buf_reserve (nothing
 * appended on failure). */
int util_buf_append(struct util_buf *b, const void *src, size_t n, size_t max);
/* Drops the first n bytes (n <= len: input already used), moving the rest to the front. */
void util_buf_consume(struct util_buf *b, size_t n);
/* Frees the bytes and leaves b empty ({0}); an empty b is fine. */
void util_buf_free(struct util_buf *b);

/* Little-endian integers in byte buffers (wire frames, records, files), whatever the host's
 * byte order. */
static inline void util_le32_put(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24);
}
static inline uint32_t util_le32_get(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline void util_le64_put(uint8_t *p, uint64_t v)
{
    util_le32_put(p, (uint32_t)v);
    util_le32_put(p + 4, (uint32_t)(v >> 32));
}
static inline uint64_t util_le64_get(const uint8_t *p)
{
    return (uint64_t)util_le32_get(p) | (uint64_t)util_le32_get(p + 4) << 32;
}

/* Drops the pages wholly inside [p, p + n) of a private read-only file mapping from the
 * resident set (madvise MADV_DONTNEED; read again, they fault back in from the file). A hint:
 * never use it on memory that was written or is not a file mapping (its bytes would be lost). */
void util_pages_drop(const void *p, size_t n);
/* Memory for n bytes (at least 64-byte aligned) that the kernel may back with transparent huge
 * pages: when n is at least 2 MiB, 2 MiB aligned and its whole 2 MiB pieces madvise
 * MADV_HUGEPAGE (a hint: where THP is off it is ordinary memory). Large buffers streamed end to
 * end (weights) then take a fault and a TLB entry per 2 MiB, not per 4 KiB. NULL when out of
 * memory; free() frees it. */
void *util_alloc_huge(size_t n);
/* FNV-1a hash of a NUL-terminated string, for hash tables keyed by names. */
uint64_t util_hash_str(const char *s);

/* Formats a message into err[errlen] for the `char *err, size_t errlen` pair of fallible calls;
 * nothing when err is NULL or errlen is 0. */
void util_seterr(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Flag for util_parse_u64 and util_parse_double: accept one trailing K, M or G (either case)
 * that multiplies by 1024, 1024^2 or 1024^3 before the bounds are checked. */
#define UTIL_PARSE_SUFFIX 1u

/* Read decimal digits at *p, advancing *p past them: 0, -EINVAL when there is no digit,
 * -ERANGE when the value exceeds max (*p is then left unchanged). */
int util_scan_u64(const char **p, uint64_t max, uint64_t *out);
/* The whole of s as an unsigned decimal in [lo, hi] (no sign, no spaces): 0 or -EINVAL. */
int util_parse_u64(const char *s, uint64_t lo, uint64_t hi, unsigned flags, uint64_t *out,
                   char *err, size_t errlen);
/* The whole of s as a signed decimal in [lo, hi] (an optional + or -): 0 or -EINVAL. */
int util_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out, char *err, size_t errlen);
/* The whole of s as a finite number in [lo, hi] (strtod syntax; NaN never passes): 0 or
 * -EINVAL. */
int util_parse_double(const char *s, double lo, double hi, unsigned flags, double *out, char *err,
                      size_t errlen);

/* ------------------------------------------------------------------ formatting (util/fmt.c) */

/* Flag for util_fmt_bytes: powers of 1000 (kB, MB, GB, TB) instead of 1024 (KiB ... TiB). */
#define UTIL_FMT_SI 1u

/* v bytes for people: "512 B", or the largest unit that keeps the number >= 1 with
 * `decimals` places ("12.75 MiB"). Writes at most n bytes, NUL-terminated. */
void util_fmt_bytes(char *buf, size_t n, double v, int decimals, unsigned flags);
/* n bytes as 2n lower-case hex digits plus a NUL into out (2n + 1 bytes). */
void util_hex_encode(const void *src, size_t n, char *out);
/* Exactly 2n hex digits (either case) from s into n bytes: 0, or -EINVAL for another length
 * or a character that is not a hex digit (dst may then be partly written). */
int util_hex_decode(const char *s, void *dst, size_t n);
/* The value of one hex digit, or -1. */
int util_hex_digit(int c);
/* A peer's text (an ERROR message, a relay's close reason) made safe to log and pass on:
 * bytes outside printable ASCII become '?', and text longer than outn - 1 bytes is cut and
 * ends in "...". Returns the length written (out is always NUL-terminated; outn >= 4). */
size_t util_text_clean(char *out, size_t outn, const uint8_t *in, size_t n);

/* ------------------------------------------------------------------ files (util/file.c) */

/* The whole of path into *buf (malloc'd, NUL-terminated; the caller frees), its length in *len:
 * 0, -errno from opening or reading ("PATH: reason"), -EFBIG past max bytes ("PATH: larger
 * than MAX bytes") or -ENOMEM; on failure *buf is NULL and *len 0. */
int util_file_read(const char *path, size_t max, char **buf, size_t *len, char *err, size_t errlen);
/* The same from an open stream (not closed); name labels the messages. */
int util_file_read_stream(FILE *f, const char *name, size_t max, char **buf, size_t *len, char *err,
                          size_t errlen);
/* Replace path's content with data[0..n) whole: written to "path.tmp", then renamed over path,
 * so a reader sees the old content or the new, never a part. 0 or -errno. */
int util_file_replace(const char *path, const void *data, size_t n);

/* ------------------------------------------------------------------ clock (util/time.c) */

/* The monotonic clock (CLOCK_MONOTONIC) in nanoseconds, milliseconds and seconds. */
uint64_t util_now_ns(void);
double util_now_ms(void);
double util_now_s(void);

/* ------------------------------------------------------------------ JSON (util/json.c) */

/* The number under key in object o, or def when it is absent or not a number. */
double util_json_number(const struct cJSON *o, const char *key, double def);
/* The string under key in object o (borrowed from o), or NULL when it is absent or not one. */
const char *util_json_string(const struct cJSON *o, const char *key);
/* The number under key in [lo, hi] into *out: 0; 1 when absent and not required (*out
 * untouched); -EINVAL when required and absent, or not a number in range ("CTX: 'KEY' ..."). */
int util_json_number_in(const struct cJSON *o, const char *key, double lo, double hi, bool required,
                        double *out, const char *ctx, char *err, size_t errlen);
/* o[key] = v, whether or not o has key already (cJSON's replace does nothing, and keeps v
 * unowned, when it has not). v is taken: freed when it cannot be put in. */
void util_json_set(struct cJSON *o, const char *key, struct cJSON *v);

#endif

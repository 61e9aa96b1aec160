/* t.h — the tiny test harness every tests/test-*.c uses.
 *
 * A test file defines its cases with T_CASE(name) and lists them in main() with T_RUN(name);
 * T_CHECK records a failure with file, line and a formatted reason, and the case goes on.
 * main() returns T_DONE(), non-zero when any check failed. Test data lives under
 * $KV_TESTDATA (t_data_path); a missing file is a failure that says so, never a silent pass.
 */
#ifndef KV_TESTS_T_H
#define KV_TESTS_T_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdarg.h>
#include <unistd.h>

static int t_failures;
static int t_checks;
static const char *t_current = "";

#define T_CASE(name) static void name(void)
#define T_RUN(name) do { t_current = #name; int f0_ = t_failures; name(); \
    fprintf(stderr, "%s %s\n", t_failures == f0_ ? "ok  " : "FAIL", #name); } while (0)
#define T_DONE() (fprintf(stderr, "%d checks, %d failed\n", t_checks, t_failures), t_failures != 0)

/* Both evaluate cond exactly once (it may have side effects, e.g. a parse). */
#define T_CHECK(cond, ...) do { t_checks++; if (!(cond)) { t_failures++; \
    fprintf(stderr, "%s:%d: %s: check failed: %s: ", __FILE__, __LINE__, t_current, #cond); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)
#define T_ASSERT(cond, ...) do { t_checks++; if (!(cond)) { t_failures++; \
    fprintf(stderr, "%s:%d: %s: check failed: %s: ", __FILE__, __LINE__, t_current, #cond); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); return; } } while (0)

/* Full path of a file under the shared test data into buf; fails the case if it is missing. */
static inline const char *t_data_path(char *buf, size_t n, const char *rel)
{
    const char *root = getenv("KV_TESTDATA");
    snprintf(buf, n, "%s/%s", root ? root : "../shared/testdata", rel);
    if (access(buf, R_OK) != 0) {
        t_failures++;
        fprintf(stderr, "%s: test data missing: %s (set KV_TESTDATA or provide ../shared/testdata)\n",
                t_current, buf);
        return NULL;
    }
    return buf;
}

/* A scratch directory for this test process (created, not removed on failure for inspection). */
static inline const char *t_tmpdir(void)
{
    static char dir[256];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/kvtest.XXXXXX");
        if (!mkdtemp(dir)) { perror("mkdtemp"); exit(2); }
    }
    return dir;
}

#endif

/* t.h — the tiny test harness every tests/unit/test-*.c uses.
 *
 * A test file defines its cases with T_CASE(name); main() starts with t_init(argc, argv),
 * lists the cases with T_RUN(name) and returns T_DONE(). T_CHECK records a failure with
 * file, line and a formatted reason, and the case goes on; T_ASSERT also ends the case.
 *
 * Each case runs in a child process of its own (fork), so a crash, a hang or leftover state
 * in one case cannot hide or change the others: the child runs the case and exits with its
 * failure count, the parent waits with a timeout, kills a child that overruns, and reports
 * every case by name on stderr:
 *     ok   name (0.12 s)
 *     FAIL name (3 checks failed | signal 11 (Segmentation fault) | timeout after 120 s | ...)
 * The timeout is T_CASE_TIMEOUT_DEFAULT seconds, T_RUN_TIMEOUT(name, s) for one case; the
 * environment variable T_CASE_TIMEOUT (seconds) overrides both (slow machines, debuggers).
 * State a case needs is made by the case itself, or by the file's fixture: T_FIXTURE(setup,
 * teardown) in main() runs setup (returns 0, or non-zero when it failed and the case cannot
 * run) before and teardown after each case, in the case's process (threads do not survive fork, so a loop thread belongs in a fixture, not in main()).
 * Whatever main() sets up before the first T_RUN is inherited by every case (read-only use).
 *
 *     build/tests/test-x          every case, each in its own process
 *     build/tests/test-x CASE     only CASE, in this process (for gdb)
 *     build/tests/test-x --list   the case names
 *
 * Children end with exit(), never _exit(), so LeakSanitizer and atexit handlers still run;
 * stdio is flushed before each fork so nothing buffered is written twice.
 * Test data lives under $KV_TESTDATA (t_data_path); a missing file is a failure that says so,
 * never a silent pass.
 */
#ifndef KV_TESTS_T_H
#define KV_TESTS_T_H

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "util/util.h"

#define T_CASE_TIMEOUT_DEFAULT 120

static int t_failures;
static int t_checks;
static const char *t_current = "";

/* harness state: what argv asked for, the fixture, and the per-case tally */
static const char *t_only;           /* run just this case, unforked */
static bool t_only_found, t_list;
static int t_cases, t_cases_failed;
static int (*t_setup)(void);        /* 0, or non-zero: set-up failed, case not run */
static void (*t_teardown)(void);

#define T_CASE(name) static void name(void)
#define T_RUN(name) t_run(name, #name, 0)
#define T_RUN_TIMEOUT(name, seconds) t_run(name, #name, (seconds))
#define T_FIXTURE(setup, teardown) (t_setup = (setup), t_teardown = (teardown))
#define T_DONE() t_done()

/* Both evaluate cond exactly once (it may have side effects, e.g. a parse). */
#define T_CHECK(cond, ...) do { t_checks++; if (!(cond)) { t_failures++; \
    fprintf(stderr, "%s:%d: %s: check failed: %s: ", __FILE__, __LINE__, t_current, #cond); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)
#define T_ASSERT(cond, ...) do { t_checks++; if (!(cond)) { t_failures++; \
    fprintf(stderr, "%s:%d: %s: check failed: %s: ", __FILE__, __LINE__, t_current, #cond); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); return; } } while (0)

/* The scratch directory (see t_tmpdir) and the process that made it. */
static char t_tmp[256];
static pid_t t_tmp_owner;

/* A scratch directory for this test process (created on first use). A case's own directory
 * is removed after the case when empty, and kept for inspection otherwise; one made in
 * main() before the cases is shared by them, and main() removes it. */
static inline const char *t_tmpdir(void)
{
    if (!t_tmp[0]) {
        snprintf(t_tmp, sizeof t_tmp, "/tmp/kvtest.XXXXXX");
        if (!mkdtemp(t_tmp)) { perror("mkdtemp"); exit(2); }
        t_tmp_owner = getpid();
    }
    return t_tmp;
}

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

/* Reads the command line: no argument runs every case, CASE runs only CASE in this
 * process, --list prints the names. */
static inline void t_init(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--list") == 0)
        t_list = true;
    else if (argc > 1)
        t_only = argv[1];
}

/* One case with the fixture around it, in the calling process. */
static inline void t_run_here(void (*fn)(void), const char *name)
{
    t_current = name;
    if (t_setup && t_setup() != 0) {
        t_failures++;
        fprintf(stderr, "%s: set-up failed, case not run\n", name);
        return;
    }
    fn();
    if (t_teardown)
        t_teardown();
}

static inline void t_run(void (*fn)(void), const char *name, int timeout_s)
{
    if (t_list) {
        printf("%s\n", name);
        return;
    }
    if (t_only) {
        if (strcmp(t_only, name) != 0)
            return;
        t_only_found = true;
        t_cases++;
        int f0 = t_failures;
        t_run_here(fn, name);
        if (t_failures != f0)
            t_cases_failed++;
        fprintf(stderr, "%s %s\n", t_failures == f0 ? "ok  " : "FAIL", name);
        return;
    }
    const char *env = getenv("T_CASE_TIMEOUT");
    if (env && atoi(env) > 0)
        timeout_s = atoi(env);
    else if (timeout_s <= 0)
        timeout_s = T_CASE_TIMEOUT_DEFAULT;
    t_cases++;
    /* the child reports its counts through a pipe, so that an exit status that is not its
     * failure count (a sanitizer's, an abort's) is told apart from failed checks */
    int fds[2];
    if (pipe(fds) != 0) {
        perror("pipe");
        exit(2);
    }
    fflush(NULL);
    double t0 = util_now_s();
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        exit(2);
    }
    if (pid == 0) {
        close(fds[0]);
        t_failures = t_checks = 0;
        t_run_here(fn, name);
        if (t_tmp_owner == getpid())
            rmdir(t_tmp); /* only when empty */
        int counts[2] = {t_checks, t_failures};
        if (write(fds[1], counts, sizeof counts) != (ssize_t)sizeof counts)
            perror("write");
        close(fds[1]);
        exit(t_failures > 100 ? 100 : t_failures);
    }
    close(fds[1]);
    int st = 0;
    bool timed_out = false;
    struct timespec nap = {0, 1000000};
    for (;;) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid)
            break;
        if (w < 0 && errno != EINTR) {
            perror("waitpid");
            exit(2);
        }
        if (util_now_s() - t0 > timeout_s) {
            kill(pid, SIGKILL);
            while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
                ;
            timed_out = true;
            break;
        }
        nanosleep(&nap, NULL);
        if (nap.tv_nsec < 50000000)
            nap.tv_nsec *= 2;
    }
    double dt = util_now_s() - t0;
    int counts[2] = {0, 0};
    bool reported = read(fds[0], counts, sizeof counts) == (ssize_t)sizeof counts;
    close(fds[0]);
    t_checks += counts[0];
    t_failures += counts[1];
    char why[128] = "";
    if (timed_out)
        snprintf(why, sizeof why, "timeout after %d s", timeout_s);
    else if (WIFSIGNALED(st))
        snprintf(why, sizeof why, "signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    else if (!reported)
        snprintf(why, sizeof why, "exit status %d before the case ended", WEXITSTATUS(st));
    else if (counts[1])
        snprintf(why, sizeof why, "%d check%s failed", counts[1], counts[1] == 1 ? "" : "s");
    else if (WEXITSTATUS(st) != 0)
        snprintf(why, sizeof why, "exit status %d after the case (sanitizer?)", WEXITSTATUS(st));
    t_current = "main"; /* what main() checks after the cases is not the last case's */
    if (why[0]) {
        t_cases_failed++;
        fprintf(stderr, "FAIL %s (%s)\n", name, why);
    } else {
        fprintf(stderr, "ok   %s (%.2f s)\n", name, dt);
    }
}

/* The summary line; non-zero when any case failed or a check outside the cases did (or the
 * named case does not exist). */
static inline int t_done(void)
{
    if (t_list)
        return 0;
    if (t_only && !t_only_found) {
        fprintf(stderr, "no case named %s (--list shows them)\n", t_only);
        return 2;
    }
    if (t_tmp_owner == getpid())
        rmdir(t_tmp); /* only when empty */
    fprintf(stderr, "%d cases, %d failed; %d checks, %d failed\n", t_cases, t_cases_failed,
            t_checks, t_failures);
    return t_failures != 0 || t_cases_failed != 0;
}

#endif

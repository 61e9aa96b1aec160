/* log.c — one line per event on stderr: UTC time, level, prefix (role/rank), message.
 * The level is checked before anything is formatted. When stderr is the systemd journal
 * (JOURNAL_STREAM names it), the journal keeps the time: lines carry a syslog priority
 * prefix ("<6>") instead of a timestamp. */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <inttypes.h>

#include "kvd/kvd.h"
#include "net/net.h"

static int log_level = KVD_LOG_INFO;
static char log_prefix[64] = "kvd";

void kvd_log_set_level(int level) { log_level = level; }
void kvd_log_set_prefix(const char *prefix) { snprintf(log_prefix, sizeof log_prefix, "%s", prefix); }

int kvd_log_level_parse(const char *name)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++)
        if (!strcmp(name, names[i]))
            return i;
    return -EINVAL;
}

/* JOURNAL_STREAM is "DEV:INODE" of the journal's stream; it is ours only when it is still
 * stderr (a child may inherit the variable with another stderr). Checked once. */
static bool to_journal(void)
{
    static int cached = -1;
    if (cached < 0) {
        const char *js = getenv("JOURNAL_STREAM");
        unsigned long long dev, ino;
        struct stat st;
        cached = js && sscanf(js, "%llu:%llu", &dev, &ino) == 2 && fstat(2, &st) == 0 &&
                 (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
    }
    return cached;
}

void kvd_log(int level, const char *fmt, ...)
{
    if (level > log_level)
        return;
    static const char *names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
    static const int prio[] = {3, 4, 6, 7};   /* syslog's err, warning, info, debug */
    int lv = level < 0 ? 0 : level > 3 ? 3 : level;
    char line[2048];
    int n;
    if (to_journal()) {
        n = snprintf(line, sizeof line, "<%d>%-5s %s: ", prio[lv], names[lv], log_prefix);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        struct tm tm;
        gmtime_r(&ts.tv_sec, &tm);
        n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s %s: ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000, names[lv], log_prefix);
    }
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && n < (int)sizeof line)
        vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line);
}

void kvd_log_access(const struct net_http_access *a)
{
    kvd_log(a->status >= 500 ? KVD_LOG_WARN : KVD_LOG_INFO, "%s %s %s %d %" PRIu64 " bytes %.1f ms%s", a->peer,
            a->method, a->path, a->status, a->bytes, a->ms, a->complete ? "" : " (client gone)");
}

/* log.c — one line per event on stderr: UTC time, level, prefix (role/rank), message.
 * The level is checked before anything is formatted. */
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "kvd/kvd.h"

static int log_level = KVD_LOG_INFO;
static char log_prefix[64] = "kvd";

void kvd_log_set_level(int level) { log_level = level; }
void kvd_log_set_prefix(const char *prefix) { snprintf(log_prefix, sizeof log_prefix, "%s", prefix); }

void kvd_log(int level, const char *fmt, ...)
{
    if (level > log_level)
        return;
    static const char *names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char line[2048];
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s %s: ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000, names[level < 0 ? 0 : level > 3 ? 3 : level], log_prefix);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && n < (int)sizeof line)
        vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line);
}

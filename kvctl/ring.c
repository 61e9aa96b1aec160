/* kvctl/ring.c — `kvctl ring down` (and `kvctl ring`, which hands `up` to ring_up.c) and
 * `kvctl status --ring`. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvctl/internal.h"
#include "ring/ring.h"
#include "util/err.h"

/* Paths here are built from a directory path plus a short suffix; one longer than PATH_MAX is
 * cut, and then simply not found. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif

/* Wait up to s seconds for pid to be gone; whether it is. */
static bool wait_gone(int pid, double s)
{
    double t0 = util_now_s();
    while (kvctl__pid_alive(pid) && util_now_s() - t0 < s) {
        waitpid(pid, NULL, WNOHANG);
        usleep(10000);
    }
    return !kvctl__pid_alive(pid);
}

static int ignore_line(const char *line, void *ud)
{
    (void)line;
    (void)ud;
    return 1;
}

/* Stop the kvd of DIR/KIND-R (KIND rank or standby) through its control socket, else by signal
 * when its pid file names this ring's kvd; -ENOENT when there is no such directory. */
static int stop_node(const char *dir_abs, const char *kind, uint32_t r, int *stopped, int *refused)
{
    char sd[PATH_MAX + 16], pidf[PATH_MAX + 32], sock[PATH_MAX + 32];
    snprintf(sd, sizeof sd, "%s/%s-%u", dir_abs, kind, r);
    if (access(sd, F_OK) != 0)
        return -ENOENT;
    snprintf(pidf, sizeof pidf, "%s/kvd.pid", sd);
    snprintf(sock, sizeof sock, "%s/kvd.sock", sd);
    int pid = 0;
    struct stat pst;
    FILE *f = fopen(pidf, "r");
    if (f && (fscanf(f, "%d", &pid) != 1 || pid <= 0 || fstat(fileno(f), &pst) != 0))
        pid = 0;
    if (f)
        fclose(f);
    char err[KV_ERR_MAX];
    bool asked = ring_ctl_request(sock, "{\"op\":\"shutdown\"}", ignore_line, NULL, 2000, err,
                                  sizeof err) == 0;
    if (!pid) {
        *stopped += asked;
        return 0;
    }
    char why[PATH_MAX * 2 + 64] = "";
    bool ours = kvctl__pid_alive(pid) && kvctl__ring_kvd_is(pid, dir_abs, r, pst.st_mtime, why, sizeof why);
    if (!ours) {
        if (kvctl__pid_alive(pid)) {
            fprintf(stderr, "kvctl ring down: %s %u: pid %d in %s is not this ring's kvd (%s): "
                    "not signalled\n", kind, r, pid, pidf, why);
            (*refused)++;
        }
        *stopped += asked;
        unlink(pidf);
        return 0;
    }
    if (!wait_gone(pid, asked ? 5 : 0) &&
        kvctl__ring_kvd_is(pid, dir_abs, r, pst.st_mtime, why, sizeof why) &&
        kill(pid, SIGTERM) == 0 && !wait_gone(pid, 5) &&
        kvctl__ring_kvd_is(pid, dir_abs, r, pst.st_mtime, why, sizeof why)) {
        fprintf(stderr, "kvctl ring down: pid %d ignored SIGTERM for 5 s: SIGKILL\n", pid);
        kill(pid, SIGKILL);
    }
    (*stopped)++;
    unlink(pidf);
    return 0;
}

/* A node that kvd join runs in dir_abs (its state directory, with join.pid): stopped with
 * SIGTERM, on which it gives its lease back to the market at once (docs/market.md). 1 when
 * there was one and it stopped, 0 when there is none, -1 when it did not stop. */
static int stop_join(const char *dir_abs)
{
    char pidf[PATH_MAX + 16], why[PATH_MAX * 2 + 64] = "";
    snprintf(pidf, sizeof pidf, "%s/join.pid", dir_abs);
    int pid = 0;
    struct stat pst;
    FILE *f = fopen(pidf, "r");
    if (!f)
        return 0;
    if (fscanf(f, "%d", &pid) != 1 || pid <= 0 || fstat(fileno(f), &pst) != 0)
        pid = 0;
    fclose(f);
    if (!pid || !kvctl__pid_alive(pid))
        return 0;
    if (!kvctl__kvd_pid_is(pid, dir_abs, NULL, pst.st_mtime, why, sizeof why)) {
        fprintf(stderr, "kvctl ring down: pid %d in %s is not this node's kvd join (%s): not "
                "signalled\n", pid, pidf, why);
        return 0;
    }
    /* it stops its stage, gives its lease back and submits its last receipts: up to ~10 s */
    if (kill(pid, SIGTERM) == 0 && !wait_gone(pid, 20)) {
        fprintf(stderr, "kvctl ring down: kvd join (pid %d) did not stop within 20 s\n", pid);
        return -1;
    }
    return 1;
}

static int ring_down(int argc, char **argv)
{
    const char *dir = kvctl__ring_dir_default(), *v;
    for (int i = 1; i < argc; i++) {
        if ((v = kvctl__dir_opt(argc, argv, &i)))   /* --dir DIR, or --ring DIR as status spells it */
            dir = v;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: kvctl ring down [--dir DIR]   stop the local ring started in DIR\n"
                   "  (--ring DIR is the same, as kvctl status spells it); DIR may be a kvd join\n"
                   "  node's state directory: the node stops and gives its lease back. Without\n"
                   "  --dir: ./ring-state, or ./ring when only that holds a ring (an earlier\n"
                   "  version's default)\n");
            return 0;
        } else {
            fprintf(stderr, "kvctl ring down: unknown option '%s'\nusage: kvctl ring down [--dir DIR]\n", argv[i]);
            return 2;
        }
    }
    char dir_abs[PATH_MAX];
    if (!realpath(dir, dir_abs)) {
        printf("ring down: 0 stages stopped (%s)\n", dir);
        return 0;
    }
    int joined = stop_join(dir_abs);
    if (joined) {
        printf("ring down: %s (%s)\n", joined > 0 ? "the joined node stopped and gave its lease "
               "back" : "the joined node did not stop", dir);
        return joined > 0 ? 0 : 1;
    }
    int stopped = 0, refused = 0, sb_stopped = 0;
    for (uint32_t r = 0; r < RING_MAX_RANKS; r++)
        if (stop_node(dir_abs, "rank", r, &stopped, &refused) < 0)
            break;
    for (uint32_t i = 0; i < RING_MAX_STANDBYS; i++)
        if (stop_node(dir_abs, "standby", i, &sb_stopped, &refused) < 0)
            break;
    printf("ring down: %d stage%s stopped (%s)", stopped, stopped == 1 ? "" : "s", dir);
    if (sb_stopped)
        printf("; %d standby node%s", sb_stopped, sb_stopped == 1 ? "" : "s");
    if (refused)
        printf("; %d stale pid file%s named another process, left alone", refused, refused == 1 ? "" : "s");
    printf("\n");
    return 0;
}

int kvctl_cmd_ring(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "up"))
        return kvctl__ring_up(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "down"))
        return ring_down(argc - 1, argv + 1);
    fprintf(stderr, "usage: kvctl ring up --model FILE --stages N [--dtype f32|f16] [--base-port P] [--dir DIR]\n"
                    "       kvctl ring down [--dir DIR]\n");
    return (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) ? 0 : 2;
}

/* --watch: a SIGINT ends the loop (after the block being printed), as a closed pipe does. */
static volatile sig_atomic_t status_stop;
static void status_on_sigint(int sig) { (void)sig; status_stop = 1; }

static int parse_secs(const char *s, double *out)
{
    char *end;
    double d = strtod(s, &end);
    if (end == s || *end || !(d >= 0.1 && d <= 86400))
        return -1;
    *out = d;
    return 0;
}

static const char status_usage[] =
    "usage: kvctl status --ring DIR|MANIFEST.json|unix:SOCKET [--json] [--watch [SECONDS]]\n";

/* What `kvctl status` was asked for. */
struct status_opts {
    const char *arg;                    /* --ring: DIR, MANIFEST.json or unix:SOCKET */
    bool json, watch;
    double every;                       /* --watch: seconds between refreshes */
    bool help;                          /* the help went to stdout: nothing more to do */
};

static void status_help(void)
{
    printf("%s"
           "  the ring at a glance, one line per rank: window, pid, endpoint, in/out link\n"
           "  states, RTT of the out link, open sessions, ms per token, boundary bytes sent\n"
           "  per token, steps, host; a stage that does not answer shows as down, with the\n"
           "  reason (and, for a rank heard of through rank 0, when it was last heard);\n"
           "  then the links that are not up with the reason each last closed, the standby\n"
           "  nodes (waiting, or the rank each serves) and rank 0's repair figures (paused\n"
           "  sessions, ring breaks, resumed sessions, repairs).\n"
           "  --ring unix:SOCKET  rank 0's control socket: every rank as rank 0 gathers it\n"
           "          over the ring's own links (no connection to other hosts); a ring\n"
           "          directory or manifest asks each rank with a directory here on its own\n"
           "          socket and the others through rank 0\n"
           "  --json  each stage's status object, one per line, then each standby's\n"
           "  --watch [SECONDS]  refresh every SECONDS (default 2): a terminal is redrawn,\n"
           "          elsewhere a block per refresh; Ctrl-C ends it\n"
           "Exit status 1 when a stage is down.\n", status_usage);
}

/* The command line into o (its defaults already there); -h prints the help and sets o->help.
 * 0, or 2 for a malformed or missing option (said). */
static int status_parse(struct status_opts *o, int argc, char **argv)
{
    const char *v;
    for (int i = 1; i < argc; i++) {
        if ((v = kvctl__dir_opt(argc, argv, &i)))   /* --ring DIR, or --dir DIR as ring up/down spell it */
            o->arg = v;
        else if (!strcmp(argv[i], "--json"))
            o->json = true;
        else if (!strncmp(argv[i], "--json=", 7)) {
            fprintf(stderr, "kvctl status: option '--json' doesn't allow an argument\n%s", status_usage);
            return 2;
        } else if (!strcmp(argv[i], "--watch") || !strncmp(argv[i], "--watch=", 8)) {
            o->watch = true;
            const char *val = argv[i][7] == '=' ? argv[i] + 8 : NULL;
            double d;   /* the next word is its SECONDS when it is a number */
            if (!val && i + 1 < argc && parse_secs(argv[i + 1], &d) == 0)
                val = argv[++i];
            if (val && parse_secs(val, &o->every) < 0) {
                fprintf(stderr, "kvctl status: --watch '%s': not a number of seconds in [0.1, 86400]\n%s",
                        val, status_usage);
                return 2;
            }
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            status_help();
            o->help = true;
            return 0;
        } else {
            fprintf(stderr, "kvctl status: unknown option '%s'\n%s", argv[i], status_usage);
            return 2;
        }
    }
    if (!o->arg) {
        fprintf(stderr, "%s", status_usage);
        return 2;
    }
    return 0;
}

/* One look at the ring: each stage of the local ring in dir (manifest m), or, dir NULL, rank
 * 0's view through its socket; printed as o asks (under --watch after a header, the screen
 * cleared first on a terminal). 1 when a stage is down or the socket did not answer, else 0. */
static int status_show(const struct status_opts *o, const char *dir, const struct ring_manifest *m,
                       unsigned round, bool tty)
{
    struct kvctl_ring_view rv;
    char err[KV_ERR_MAX];
    int rc = 0;
    if (!dir) {
        if (kvctl__ring_view_sock(&rv, o->arg + 5, err, sizeof err) < 0) {
            fprintf(stderr, "kvctl status: %s\n", err);
            rc = 1;
        }
    } else {
        kvctl__ring_view_dir(&rv, dir, m);
    }
    if (rv.r0 || dir) {
        if (tty)
            printf("\033[H\033[2J");   /* home, clear: the table redrawn in place */
        if (o->watch) {
            time_t t = time(NULL);
            struct tm tm;
            char when[40];
            strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime_r(&t, &tm));
            printf(o->json ? "{\"watch\":%u,\"time\":\"%s\"}\n" : "-- %u  %s\n", round + 1, when);
        }
        rc = o->json ? kvctl__ring_view_json(&rv, stdout) : kvctl__ring_view_print(&rv, stdout) ? 1 : 0;
        if (o->watch && !o->json)
            printf("\n");
    }
    kvctl__ring_view_free(&rv);
    return rc;
}

int kvctl_cmd_status(int argc, char **argv)
{
    struct status_opts o = {.every = 2};
    int rc = status_parse(&o, argc, argv);
    if (rc != 0 || o.help)
        return rc;
    bool via_sock = !strncmp(o.arg, "unix:", 5);
    char dir[PATH_MAX];
    struct ring_manifest m;
    if (!via_sock && (kvctl__ring_dir(o.arg, dir, sizeof dir) < 0 || kvctl__load_ring_at(o.arg, dir, &m) < 0))
        return 1;
    bool tty = o.watch && isatty(STDOUT_FILENO);
    if (o.watch) {
        struct sigaction sa = {.sa_handler = status_on_sigint};
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        signal(SIGPIPE, SIG_IGN);   /* a closed pipe ends the loop through the failed write */
    }
    for (unsigned round = 0; !status_stop; round++) {
        rc = status_show(&o, via_sock ? NULL : dir, &m, round, tty);
        if (fflush(stdout) != 0 || ferror(stdout))
            return 0;   /* the reader went away: done */
        if (!o.watch)
            break;
        /* sleep in small steps, so Ctrl-C ends the wait at once */
        for (double slept = 0; slept < o.every && !status_stop; slept += 0.05)
            usleep(50000);
    }
    return o.watch ? 0 : rc;
}

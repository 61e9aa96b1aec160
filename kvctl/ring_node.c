/* kvctl/ring_node.c — the local nodes of kvctl's ring commands: directories, listening sockets
 * handed to the kvd they are for, whether a pid is a ring's kvd, control-socket status queries,
 * the ring directory and its manifest. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "kvctl/internal.h"
#include "ring/ring.h"

/* Paths here are built from a directory path plus a short suffix; one longer than PATH_MAX is
 * cut, and then simply not found. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif

int kvctl__mkdir_p(const char *dir)
{
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", dir);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0755) < 0 && errno != EEXIST)
                return -errno;
            *p = '/';
        }
    if (mkdir(tmp, 0755) < 0 && errno != EEXIST)
        return -errno;
    return 0;
}

/* The kvd binary to start: $KVD_BIN when set (the tests' build/tests/kvd-stub, which offers
 * --stub), else the kvd next to this kvctl. */
int kvctl__kvd_path(char *out, size_t n)
{
    const char *env = getenv("KVD_BIN");
    if (env && *env) {
        snprintf(out, n, "%s", env);
        return access(out, X_OK) == 0 ? 0 : -ENOENT;
    }
    char self[PATH_MAX];
    ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
    if (k <= 0)
        return -errno;
    self[k] = 0;
    snprintf(out, n, "%s/kvd", dirname(self));
    return access(out, X_OK) == 0 ? 0 : -ENOENT;
}

/* In a forked child before exec: fds[0..n) become fds 3.. with LISTEN_FDS/LISTEN_PID set, as
 * systemd hands listening sockets over (moved above 3 first, so none overwrites another). */
void kvctl__hand_over(const int *fds, int n)
{
    int high[2];
    char v[24];
    for (int i = 0; i < n; i++)
        high[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 16);
    for (int i = 0; i < n; i++)
        dup2(high[i], 3 + i); /* the copy at 3 + i is not close-on-exec */
    snprintf(v, sizeof v, "%d", n);
    setenv("LISTEN_FDS", v, 1);
    snprintf(v, sizeof v, "%ld", (long)getpid());
    setenv("LISTEN_PID", v, 1);
    unsetenv("LISTEN_FDNAMES");
}

void kvctl__close_fds(int *fds, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (fds[i] >= 0) {
            close(fds[i]);
            fds[i] = -1;
        }
}

/* A pid is gone when it no longer exists or is a zombie waiting for a parent to reap it
 * (the stages outlive the kvctl that forked them). */
bool kvctl__pid_alive(int pid)
{
    if (kill(pid, 0) != 0)
        return false;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *rp = strrchr(buf, ')');
    return !(rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X'));
}

/* Whether an argument of pid's command line is the path want (absolute): as written, or a
 * relative one resolved from the process's working directory. */
static bool arg_is_path(int pid, const char *arg, const char *want)
{
    char p[PATH_MAX + 64], real[PATH_MAX];
    if (!strcmp(arg, want))
        return true;
    if (arg[0] == '/' || !arg[0])
        return false;
    snprintf(p, sizeof p, "/proc/%d/cwd/%s", pid, arg);
    return realpath(p, real) && !strcmp(real, want);
}

/* Whether pid is rank r's kvd of the ring in dir_abs (an absolute path): kvctl__kvd_pid_is with the
 * rank's state directory or the ring's manifest. */
bool kvctl__ring_kvd_is(int pid, const char *dir_abs, uint32_t r, time_t pid_mtime, char *why,
                        size_t n)
{
    char want_sd[PATH_MAX + 16], want_m[PATH_MAX + 16];
    snprintf(want_sd, sizeof want_sd, "%s/rank-%u", dir_abs, r);
    snprintf(want_m, sizeof want_m, "%s/ring.json", dir_abs);
    return kvctl__kvd_pid_is(pid, want_sd, want_m, pid_mtime, why, n);
}

bool kvctl__kvd_pid_is(int pid, const char *want_sd, const char *want_m, time_t pid_mtime, char *why,
                       size_t n)
{
    char path[64], exe[PATH_MAX];
    snprintf(path, sizeof path, "/proc/%d/exe", pid);
    ssize_t el = readlink(path, exe, sizeof exe - 1);
    if (el < 0) {
        snprintf(why, n, "cannot read %s: %s", path, strerror(errno));
        return false;
    }
    exe[el] = 0;
    const char *base = strrchr(exe, '/');
    base = base ? base + 1 : exe;
    /* The executable ring up starts (kvctl__kvd_path fills the name even when the file is gone). */
    char want_path[PATH_MAX] = "kvd";
    (void)kvctl__kvd_path(want_path, sizeof want_path);
    const char *want = strrchr(want_path, '/') ? strrchr(want_path, '/') + 1 : want_path;
    size_t wl = strlen(want);
    bool is_kvd = strncmp(base, want, wl) == 0 && (!base[wl] || strcmp(base + wl, " (deleted)") == 0);
    if (!is_kvd) {
        snprintf(why, n, "its executable is %s, not %s", exe, want);
        return false;
    }
    char args[8192];
    snprintf(path, sizeof path, "/proc/%d/cmdline", pid);
    FILE *f = fopen(path, "r");
    size_t al = f ? fread(args, 1, sizeof args - 1, f) : 0;
    if (f)
        fclose(f);
    args[al] = 0;
    bool named = false;
    for (size_t i = 0; i < al; i += strlen(args + i) + 1)
        named |= arg_is_path(pid, args + i, want_sd) || (want_m && arg_is_path(pid, args + i, want_m));
    if (!named) {
        snprintf(why, n, "its command line names neither %s nor %s", want_sd, want_m ? want_m : "it");
        return false;
    }
    /* start time: field 22 of /proc/PID/stat (clock ticks after boot) + btime of /proc/stat */
    char buf[1024], line[256];
    unsigned long long ticks = 0, btime = 0;
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    f = fopen(path, "r");
    size_t bl = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[bl] = 0;
    const char *q = strrchr(buf, ')');
    for (int field = 2; q && *q && field < 22; q++)
        if (*q == ' ')
            field++;
    if (q && sscanf(q, "%llu", &ticks) != 1)
        q = NULL;
    f = fopen("/proc/stat", "r");
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "btime %llu", &btime) == 1)
            break;
    if (f)
        fclose(f);
    long hz = sysconf(_SC_CLK_TCK);
    if (!q || !btime || hz <= 0) {
        snprintf(why, n, "its start time cannot be read from %s", path);
        return false;
    }
    double started = (double)btime + (double)ticks / (double)hz;
    if (started > (double)pid_mtime + 2) { /* btime is whole seconds: allow for rounding */
        snprintf(why, n, "it started %.0f s after its pid file was written (a recycled pid)",
                 started - (double)pid_mtime);
        return false;
    }
    return true;
}

/* ---- status queries ---- */

struct grab {
    cJSON *obj;
};

static int grab_line(const char *line, void *ud)
{
    struct grab *g = ud;
    g->obj = cJSON_Parse(line);
    return 1;
}

/* A stage's status object; ring: with every rank as it last heard of them ("ranks") and the
 * standbys. */
cJSON *kvctl__query_status_ring(const char *sock, bool ring, char *err, size_t errlen)
{
    struct grab g = {0};
    const char *req = ring ? "{\"op\":\"status\",\"ring\":true}" : "{\"op\":\"status\"}";
    if (ring_ctl_request(sock, req, grab_line, &g, 3000, err, errlen) < 0)
        return NULL;
    if (!g.obj)
        snprintf(err, errlen, "no status reply");
    return g.obj;
}

cJSON *kvctl__query_status(const char *sock, char *err, size_t errlen)
{
    return kvctl__query_status_ring(sock, false, err, errlen);
}

/* Where rank r's control socket is for a ring directory. */
void kvctl__rank_sock(const char *dir, uint32_t r, char *out, size_t n)
{
    snprintf(out, n, "%s/rank-%u/kvd.sock", dir, r);
}

/* DIR, DIR/ring.json or a manifest path -> the ring directory. */
int kvctl__ring_dir(const char *arg, char *dir, size_t n)
{
    struct stat sb;
    if (stat(arg, &sb) < 0) {
        int e = errno;
        fprintf(stderr, "kvctl: ring %s: %s (give the directory of kvctl ring up --dir, its "
                "ring.json)\n", arg, strerror(e));
        return -e;
    }
    if (S_ISDIR(sb.st_mode))
        snprintf(dir, n, "%s", arg);
    else {
        char tmp[PATH_MAX];
        snprintf(tmp, sizeof tmp, "%s", arg);
        snprintf(dir, n, "%s", dirname(tmp));
    }
    return 0;
}

int kvctl__load_ring(const char *dir, struct ring_manifest *m)
{
    return kvctl__load_ring_at(NULL, dir, m);
}

/* DIR/ring.json, or the manifest file itself when the user named one (any file name). */
int kvctl__load_ring_at(const char *arg, const char *dir, struct ring_manifest *m)
{
    char path[PATH_MAX], err[512];
    struct stat sb;
    if (arg && stat(arg, &sb) == 0 && S_ISREG(sb.st_mode))
        snprintf(path, sizeof path, "%s", arg);
    else
        snprintf(path, sizeof path, "%s/ring.json", dir);
    if (ring_manifest_load(m, path, err, sizeof err) < 0) {
        if (strstr(err, path))
            fprintf(stderr, "kvctl: %s\n", err);
        else
            fprintf(stderr, "kvctl: %s: %s\n", path, err);
        return -EINVAL;
    }
    return 0;
}

/* The state directory `kvctl ring up` and `ring down` take without --dir: ./ring-state, or
 * ./ring where that holds a ring written by an earlier version (which used ./ring) and
 * ./ring-state does not exist, so an upgrade still finds and stops a running ring. The
 * source tree's ring/ module folder holds no ring.json, so it is never taken for one. */
const char *kvctl__ring_dir_default(void)
{
    struct stat st;
    if (stat(KVCTL_RING_DIR, &st) != 0 && stat("ring/ring.json", &st) == 0)
        return "ring";
    return KVCTL_RING_DIR;
}

/* The ring directory option of status and ring down: --dir DIR, --ring DIR, --dir=DIR or
 * --ring=DIR (both names mean the same). The value, with *i moved past it, or NULL. */
const char *kvctl__dir_opt(int argc, char **argv, int *i)
{
    const char *a = argv[*i];
    for (int k = 0; k < 2; k++) {
        const char *name = k ? "--ring" : "--dir";
        size_t n = strlen(name);
        if (!strncmp(a, name, n) && a[n] == '=' && a[n + 1])
            return a + n + 1;
        if (!strcmp(a, name) && *i + 1 < argc)
            return argv[++*i];
    }
    return NULL;
}

/* Each rank: ask its kvd over the control socket to stop, wait for it; only a pid that is
 * this ring's kvd (kvctl__ring_kvd_is, checked again before each signal) gets SIGTERM, then SIGKILL. */

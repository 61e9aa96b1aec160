/* kvctl_ring.c — local rings: `kvctl ring up|down`, `kvctl status --ring`, and
 * `kvctl generate --ring` (the one-process generate's options and output, through a ring). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
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
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <openssl/rand.h>

#include "api/api.h"
#include "gguf/gguf.h"
#include "kvctl/kvctl.h"
#include "ringlib/ring.h"
#include "seed/seed.h"
#include "model/model.h"
#include "net/net.h"
#include "planner/plan.h"
#include "util/err.h"

#define MAX_STAGES RING_MAX_RANKS

/* Paths here are built from a directory path plus a short suffix; one longer than PATH_MAX is
 * cut, and then simply not found. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif

static int mkdir_p(const char *dir)
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
static int kvd_path(char *out, size_t n)
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

/* A socket listening at host (numeric; "" = any IPv4 address) and port (0: a free one), its
 * port in *got: the fd (close-on-exec; the stage it is for gets it as systemd's socket
 * activation hands one over, LISTEN_FDS, net/listen.c), or a negative errno. Bound here and
 * handed over, a stage's port cannot be taken by another program between choosing and
 * binding it. */
static int listen_socket(const char *host, int port, int *got)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST | AI_PASSIVE},
                    *ai = NULL;
    char ps[8];
    snprintf(ps, sizeof ps, "%d", port);
    if (getaddrinfo(*host ? host : "0.0.0.0", ps, &hints, &ai) != 0 || !ai)
        return -EINVAL;
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1, e = 0;
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 128) != 0 ||
        getsockname(fd, (struct sockaddr *)&ss, &len) != 0)
        e = -errno;
    freeaddrinfo(ai);
    if (e) {
        if (fd >= 0)
            close(fd);
        return e;
    }
    *got = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                          : ((struct sockaddr_in *)&ss)->sin_port);
    return fd;
}

/* In a forked child before exec: fds[0..n) become fds 3.. with LISTEN_FDS/LISTEN_PID set, as
 * systemd hands listening sockets over (moved above 3 first, so none overwrites another). */
static void hand_over(const int *fds, int n)
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

static void close_fds(int *fds, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (fds[i] >= 0) {
            close(fds[i]);
            fds[i] = -1;
        }
}

/* A pid is gone when it no longer exists or is a zombie waiting for a parent to reap it
 * (the stages outlive the kvctl that forked them). */
static bool pid_alive(int pid)
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

/* Whether pid is the kvd that its pid file (modified at pid_mtime) says: its executable is
 * kvd, its command line names want_a or want_b (absolute paths; NULL: none), and it started
 * before the pid file was written. A pid file outlives a crash, and the kernel hands its
 * number to another process; that one must never be signalled. false with the reason in why. */
static bool kvd_pid_is(int pid, const char *want_a, const char *want_b, time_t pid_mtime, char *why,
                       size_t n);

/* Whether pid is rank r's kvd of the ring in dir_abs (an absolute path): kvd_pid_is with the
 * rank's state directory or the ring's manifest. */
static bool ring_kvd_is(int pid, const char *dir_abs, uint32_t r, time_t pid_mtime, char *why, size_t n)
{
    char want_sd[PATH_MAX + 16], want_m[PATH_MAX + 16];
    snprintf(want_sd, sizeof want_sd, "%s/rank-%u", dir_abs, r);
    snprintf(want_m, sizeof want_m, "%s/ring.json", dir_abs);
    return kvd_pid_is(pid, want_sd, want_m, pid_mtime, why, n);
}

static bool kvd_pid_is(int pid, const char *want_sd, const char *want_m, time_t pid_mtime, char *why,
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
    /* The executable ring up starts (kvd_path fills the name even when the file is gone). */
    char want_path[PATH_MAX] = "kvd";
    (void)kvd_path(want_path, sizeof want_path);
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
static cJSON *query_status_ring(const char *sock, bool ring, char *err, size_t errlen)
{
    struct grab g = {0};
    const char *req = ring ? "{\"op\":\"status\",\"ring\":true}" : "{\"op\":\"status\"}";
    if (ring_ctl_request(sock, req, grab_line, &g, 3000, err, errlen) < 0)
        return NULL;
    if (!g.obj)
        snprintf(err, errlen, "no status reply");
    return g.obj;
}

static cJSON *query_status(const char *sock, char *err, size_t errlen)
{
    return query_status_ring(sock, false, err, errlen);
}

/* Where rank r's control socket is for a ring directory. */
static void rank_sock(const char *dir, uint32_t r, char *out, size_t n)
{
    snprintf(out, n, "%s/rank-%u/kvd.sock", dir, r);
}

/* DIR, DIR/ring.json or a manifest path -> the ring directory. */
static int ring_dir(const char *arg, char *dir, size_t n)
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

/* DIR/ring.json, or the manifest file itself when the user named one (any file name). */
static int load_ring_at(const char *arg, const char *dir, struct ring_manifest *m);

static int load_ring(const char *dir, struct ring_manifest *m)
{
    return load_ring_at(NULL, dir, m);
}

static int load_ring_at(const char *arg, const char *dir, struct ring_manifest *m)
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

static const char *jstr(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

/* The ring as kvctl status shows it: one status object per rank, each its own control
 * socket's (a local ring's rank directory) or the record rank 0 heard over the ring's links
 * ("via": "rank 0", with its age), and rank 0's view of the ring. */
struct ring_view {
    uint32_t n;
    char ring[72], model[128], arch[32], dtype[8];
    uint32_t n_layers, n_embd;
    cJSON *rows[RING_MAX_RANKS];        /* NULL: nothing known of the rank (why[r] says why) */
    char why[RING_MAX_RANKS][300];
    bool down[RING_MAX_RANKS];          /* no answer: its socket did not, or its record is old */
    cJSON *r0;                          /* rank 0's "ring": true status; NULL: it did not answer */
    const char *dir;                    /* a local ring's directory (standby sockets), or NULL */
    uint32_t n_standbys;
    uint32_t self;                      /* the rank whose socket was asked (unix:SOCKET) */
};

static void view_free(struct ring_view *v)
{
    for (uint32_t r = 0; r < v->n; r++)
        cJSON_Delete(v->rows[r]);
    cJSON_Delete(v->r0);
    memset(v, 0, sizeof *v);
}

/* Row r from rank 0's "ranks": a copy of the record, marked as heard through rank 0. */
static void view_from_r0(struct ring_view *v, uint32_t r)
{
    const cJSON *ranks = v->r0 ? cJSON_GetObjectItemCaseSensitive(v->r0, "ranks") : NULL;
    const cJSON *e = cJSON_IsArray(ranks) ? cJSON_GetArrayItem(ranks, (int)r) : NULL;
    if (!e) {
        snprintf(v->why[r], sizeof v->why[r], "rank %u does not answer", v->self);
        v->down[r] = true;
        return;
    }
    cJSON *c = cJSON_Duplicate(e, 1);
    if (!c)
        return;
    char via[32];
    snprintf(via, sizeof via, "rank %u", v->self);
    cJSON_AddStringToObject(c, "via", via);
    if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "answer"))) {
        v->down[r] = true;
        const cJSON *age = cJSON_GetObjectItemCaseSensitive(c, "age_ms");
        if (jstr(c, "reason")[0])
            snprintf(v->why[r], sizeof v->why[r], "no answer: %s; last heard %.1f s ago", jstr(c, "reason"),
                     util_json_number(c, "age_ms", 0) / 1000);
        else if (cJSON_IsNumber(age))
            snprintf(v->why[r], sizeof v->why[r], "no answer: last heard %.1f s ago", age->valuedouble / 1000);
        else
            snprintf(v->why[r], sizeof v->why[r], "no answer: never heard of over the ring");
        cJSON_AddStringToObject(c, "error", v->why[r]);
        util_json_set(c, "linked", cJSON_CreateFalse());
    }
    v->rows[r] = c;
}

/* Rank 0's own object without the ring view it carries. */
static cJSON *r0_own(const cJSON *r0)
{
    cJSON *c = cJSON_Duplicate(r0, 1);
    cJSON_DeleteItemFromObjectCaseSensitive(c, "ranks");
    cJSON_DeleteItemFromObjectCaseSensitive(c, "standbys");
    return c;
}

/* A local ring directory (or a manifest next to rank directories): each rank with a
 * directory here answers on its own socket; the others through rank 0. */
static void view_dir(struct ring_view *v, const char *dir, const struct ring_manifest *m)
{
    memset(v, 0, sizeof *v);
    v->n = m->n_ranks;
    v->dir = dir;
    v->n_standbys = m->n_standbys;
    snprintf(v->ring, sizeof v->ring, "%s", m->ring);
    snprintf(v->model, sizeof v->model, "%s", m->model_name);
    snprintf(v->arch, sizeof v->arch, "%s", m->arch);
    snprintf(v->dtype, sizeof v->dtype, "%s", m->dtype);
    v->n_layers = m->n_layers;
    v->n_embd = m->n_embd;
    char sock[PATH_MAX], err[300];
    rank_sock(dir, 0, sock, sizeof sock);
    v->r0 = query_status_ring(sock, true, err, sizeof err);
    for (uint32_t r = 0; r < v->n; r++) {
        char rd[PATH_MAX + 16];
        snprintf(rd, sizeof rd, "%s/rank-%u", dir, r);
        if (r > 0 && access(rd, F_OK) != 0) {   /* not on this host: as rank 0 heard of it */
            view_from_r0(v, r);
            continue;
        }
        if (r == 0 && v->r0) {
            v->rows[0] = r0_own(v->r0);
            continue;
        }
        rank_sock(dir, r, sock, sizeof sock);
        v->rows[r] = query_status(sock, err, sizeof err);
        if (!v->rows[r]) {
            snprintf(v->why[r], sizeof v->why[r], "%s", err);
            v->down[r] = true;
        }
    }
}

/* Rank 0's control socket (unix:PATH): every rank as rank 0 heard of it. */
static int view_sock(struct ring_view *v, const char *sock, char *err, size_t errlen)
{
    memset(v, 0, sizeof *v);
    v->r0 = query_status_ring(sock, true, err, errlen);
    if (!v->r0)
        return -1;
    /* Any stage holds the ring's records; rank 0's view is the one to ask (it is the ring's
     * entry and hears every rank), another stage's shows the ring as that stage hears it. */
    double me = util_json_number(v->r0, "rank", -1);
    if (me < 0) {
        snprintf(err, errlen, "%s is a standby that serves no rank yet: ask rank 0's control socket", sock);
        cJSON_Delete(v->r0);
        v->r0 = NULL;
        return -1;
    }
    v->self = (uint32_t)me;
    const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(v->r0, "ranks");
    int n = cJSON_GetArraySize(ranks);
    v->n_standbys = (uint32_t)cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(v->r0, "standbys"));
    v->n = n < 0 ? 0 : n > RING_MAX_RANKS ? RING_MAX_RANKS : (uint32_t)n;
    snprintf(v->ring, sizeof v->ring, "%s", jstr(v->r0, "ring"));
    snprintf(v->model, sizeof v->model, "%s", jstr(v->r0, "model"));
    snprintf(v->arch, sizeof v->arch, "%s", jstr(v->r0, "arch"));
    snprintf(v->dtype, sizeof v->dtype, "%s", jstr(v->r0, "dtype"));
    v->n_layers = (uint32_t)util_json_number(v->r0, "n_layers", 0);
    v->n_embd = (uint32_t)util_json_number(v->r0, "n_embd", 0);
    for (uint32_t r = 0; r < v->n; r++) {
        if (r == v->self)
            v->rows[r] = r0_own(v->r0);
        else
            view_from_r0(v, r);
    }
    return 0;
}

/* The standby nodes (a local ring's own sockets, else rank 0's view) and rank 0's repair
 * figures. */
static void print_repair(const struct ring_view *v, FILE *out)
{
    char sock[PATH_MAX + 32], err[300];
    const cJSON *sbs = v->r0 ? cJSON_GetObjectItemCaseSensitive(v->r0, "standbys") : NULL;
    for (int i = 0; i < (int)v->n_standbys; i++) {
        const cJSON *e = cJSON_GetArrayItem(sbs, i);   /* NULL when rank 0 did not answer */
        const char *ep = jstr(e, "endpoint");
        if (!strncmp(ep, "tcp://", 6))
            ep += 6;
        snprintf(sock, sizeof sock, "%s/standby-%d/kvd.sock", v->dir ? v->dir : "", i);
        cJSON *s = v->dir && access(sock, F_OK) == 0 ? query_status(sock, err, sizeof err) : NULL;
        if (v->dir && access(sock, F_OK) == 0 && !s)
            fprintf(out, "standby %d  %-22s down (%s)\n", i, ep, err);
        else if (s && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, "waiting")))
            fprintf(out, "standby %d  %-22s pid %.0f  waiting\n", i, ep, util_json_number(s, "pid", 0));
        else if (s)
            fprintf(out, "standby %d  %-22s pid %.0f  serves rank %.0f (in %s, out %s, %.0f sessions, "
                    "%.0f replayed: %.0f positions recomputed)\n", i, ep,
                    util_json_number(s, "pid", 0), util_json_number(s, "rank", 0),
                    jstr(cJSON_GetObjectItemCaseSensitive(s, "in"), "state"),
                    jstr(cJSON_GetObjectItemCaseSensitive(s, "out"), "state"), util_json_number(s, "sessions", 0),
                    util_json_number(s, "replayed_sessions", 0), util_json_number(s, "replayed_positions", 0));
        else if (util_json_number(e, "serves", -1) >= 0)
            fprintf(out, "standby %d  %-22s node %.16s  serves rank %.0f\n", i, ep, jstr(e, "node"),
                    util_json_number(e, "serves", -1));
        else
            fprintf(out, "standby %d  %-22s node %.16s  serves no rank (waiting, or not heard of)\n", i, ep,
                    jstr(e, "node"));
        cJSON_Delete(s);
    }
    const cJSON *r = v->r0 ? cJSON_GetObjectItemCaseSensitive(v->r0, "repair") : NULL;
    if (r && (v->n_standbys || util_json_number(r, "wait_s", 0) > 0 ||
              util_json_number(r, "ring_breaks", 0) > 0)) {
        fprintf(out, "repair: wait %.0f s, %.0f paused sessions, %.0f ring breaks, %.0f sessions resumed "
                "(%.0f replays), %.0f not repaired in time, break to next token last %.0f ms, max %.0f ms",
                util_json_number(r, "wait_s", 0), util_json_number(r, "paused_sessions", 0),
                util_json_number(r, "ring_breaks", 0), util_json_number(r, "resumed_sessions", 0),
                util_json_number(r, "replays", 0), util_json_number(r, "not_repaired", 0),
                util_json_number(r, "last_resume_ms", 0), util_json_number(r, "max_resume_ms", 0));
        double reps = util_json_number(r, "repairs", 0);
        if (reps > 0) {
            time_t t = (time_t)util_json_number(r, "last_repair_unix", 0);
            char when[40];
            struct tm tm;
            strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime_r(&t, &tm));
            double rk = util_json_number(r, "last_repair_rank", -1);
            fprintf(out, "; %.0f repairs, the last at %s", reps, when);
            if (rk >= 0)
                fprintf(out, " (rank %.0f)", rk);
        }
        fprintf(out, "\n");
    }
    /* What each rank's own node recomputed for replays (a standby's is on its line above); a
     * rank's own socket gives it, a record heard over the ring does not carry it. */
    for (uint32_t i = 0; v->n_standbys && i < v->n; i++) {
        const cJSON *row = v->rows[i];
        if (!row || !cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(row, "replayed_sessions")))
            continue;
        fprintf(out, "replayed on rank %u: %.0f sessions, %.0f positions recomputed\n", i,
                util_json_number(row, "replayed_sessions", 0), util_json_number(row, "replayed_positions", 0));
    }
}

/* One link's last error, when it is not up. */
static void print_link_error(FILE *out, uint32_t r, const cJSON *s, bool is_out)
{
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(s, is_out ? "out" : "in");
    const char *e = jstr(l, "error");
    if (!l || !e[0] || !strcmp(jstr(l, "state"), "up"))
        return;
    fprintf(out, "  rank %u %s link %s rank %.0f: %s: %s (%.0f s ago)\n", r, is_out ? "out" : "in",
            is_out ? "to" : "from", util_json_number(l, "peer_rank", 0), jstr(l, "state"), e,
            util_json_number(l, "error_age_s", 0));
}

/* The table; returns how many stages did not answer. */
static int print_view(const struct ring_view *v, FILE *out)
{
    int n_down = 0;
    fprintf(out, "ring %s  model %s (%s, %u layers, n_embd %u)  wire %s  %u stages\n", v->ring,
            v->model, v->arch, v->n_layers, v->n_embd, v->dtype, v->n);
    fprintf(out, "%-4s %-9s %-7s %-22s %-9s %-9s %-8s %-5s %-9s %-9s %-7s %s\n", "rank", "layers", "pid",
            "endpoint", "in", "out", "rtt_ms", "sess", "ms/tok", "B/tok out", "steps", "host");
    for (uint32_t r = 0; r < v->n; r++) {
        const cJSON *s = v->rows[r];
        char layers[32] = "-";
        const cJSON *w = cJSON_GetObjectItemCaseSensitive(s, "window");
        if (cJSON_GetArraySize(w) == 2)
            snprintf(layers, sizeof layers, "[%.0f, %.0f)", cJSON_GetArrayItem(w, 0)->valuedouble,
                     cJSON_GetArrayItem(w, 1)->valuedouble);
        const char *ep = jstr(s, "endpoint");
        if (!strncmp(ep, "tcp://", 6))
            ep += 6;
        if (v->down[r]) {
            n_down++;
            if (!s || !cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(s, "pid")))
                fprintf(out, "%-4u %-9s %-7s %-22s down (%s)\n", r, layers, "-", ep, v->why[r]);
            else   /* rank 0 heard of it once: when, and from where */
                fprintf(out, "%-4u %-9s %-7.0f %-22s down (%s; host %s)\n", r, layers,
                        util_json_number(s, "pid", 0), ep, v->why[r], jstr(s, "host"));
            continue;
        }
        const cJSON *in = cJSON_GetObjectItemCaseSensitive(s, "in");
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(s, "out");
        fprintf(out, "%-4u %-9s %-7.0f %-22s %-9s %-9s %-8.3f %-5.0f %-9.3f %-9.0f %-7.0f %s\n", r, layers,
                util_json_number(s, "pid", 0), ep, jstr(in, "state"), jstr(o, "state"),
                util_json_number(o, "rtt_ms", 0), util_json_number(s, "sessions", 0),
                util_json_number(s, "ms_per_token", 0), util_json_number(s, "bytes_per_token_out", 0),
                util_json_number(s, "steps", 0), jstr(s, "host"));
    }
    bool errs = false;
    for (uint32_t r = 0; r < v->n; r++)
        for (int k = 0; k < 2; k++) {
            const cJSON *l = cJSON_GetObjectItemCaseSensitive(v->rows[r], k ? "out" : "in");
            if (jstr(l, "error")[0] && strcmp(jstr(l, "state"), "up") != 0) {
                if (!errs)
                    fprintf(out, "links not up, with the reason each last closed:\n");
                errs = true;
                print_link_error(out, r, v->rows[r], k);
            }
        }
    print_repair(v, out);
    return n_down;
}

/* The table of a local ring (DIR, or its manifest); returns how many stages did not answer. */
static int print_status_table(const char *dir, const struct ring_manifest *m, FILE *out)
{
    struct ring_view v;
    view_dir(&v, dir, m);
    int n = print_view(&v, out);
    view_free(&v);
    return n;
}

/* ---- ring up ---- */

/* Windows for n identical local stages from the planner (planner/plan.h plan_even): the
 * model's shape from its tensor list, the runtime's layers (MTP blocks left out). */
static int plan_split(const struct gguf_file *g, const char *arch, uint32_t n_layers, uint32_t nextn,
                      uint32_t n_embd, uint32_t n, uint32_t *first, uint32_t *last)
{
    uint64_t nt = gguf_tensor_count(g);
    struct plan_tensor *t = calloc(nt ? nt : 1, sizeof *t);
    struct plan_layer *layers = calloc(n_layers + nextn, sizeof *layers);
    int rc = -ENOMEM;
    if (t && layers) {
        for (uint64_t i = 0; i < nt; i++) {
            const struct gguf_tensor *gt = gguf_tensor_at(g, i);
            t[i].name = gt->name;
            t[i].n_dims = gt->n_dims;
            memcpy(t[i].ne, gt->ne, sizeof t[i].ne);
            t[i].bytes = gt->size;
        }
        struct plan_model_info mi = {.n_layers = n_layers + nextn, .n_embd = n_embd, .nextn_layers = nextn};
        char key[96];
        snprintf(key, sizeof key, "%s.expert_count", arch);
        gguf_get_u32(g, key, &mi.n_expert);
        snprintf(key, sizeof key, "%s.expert_used_count", arch);
        gguf_get_u32(g, key, &mi.n_expert_used);
        struct plan_shape shape = {.arch = arch};
        char err[KV_ERR_MAX];
        rc = plan_shape_from_tensors(t, (size_t)nt, &mi, &shape, layers, err, sizeof err);
        if (rc == 0) {
            shape.n_layers = n_layers;
            rc = plan_even(&shape, n, first, last);
        }
        if (rc < 0)
            fprintf(stderr, "kvctl ring up: planner: %s; splitting by layer bytes\n",
                    rc == -EINVAL ? err : strerror(-rc));
    }
    free(t);
    free(layers);
    return rc;
}

static void ring_up_usage(FILE *f)
{
    fprintf(f,
        "usage: kvctl ring up --model FILE --stages N [options]\n"
        "  --dtype f32|f16     boundary dtype on the wire (default f32: exact)\n"
        "  --base-port P       rank r listens on 127.0.0.1:P+r (default: free ports)\n"
        "  --dir DIR           manifest, state dirs and logs (default ./ring)\n"
        "  -t N                compute threads per stage (default 1)\n"
        "  --ctx N             context length (default: the model's, at most 4096)\n"
        "  --max-batch N       rows per ACT frame (prefill chunk, default 512)\n"
        "  --batch-wait-us N   each stage's compute waits up to N us for other sessions' steps\n"
        "                      to batch with (kvd stage --batch-wait-us; default 0)\n"
        "  --stub --layers L --embd E   tests: stand-in compute, no model file (needs the test\n"
        "                      build of kvd: KVD_BIN=build/tests/kvd-stub)\n"
        "  --window-from URL   stages pull their windows from a seeder or a GGUF URL\n"
        "                      (kvd stage --window-from) instead of mapping --model\n"
        "  --catalog FILE      the model's catalog (default: built into DIR/catalog.json);\n"
        "                      its id goes into the manifest, every stage verifies its window\n"
        "  --split A:B,B:C,... explicit windows, one per stage, contiguous from 0 to the\n"
        "                      model's layers (--stages may be left out)\n"
        "  --standby N         also start N standby nodes (DIR/standby-I) that may take over\n"
        "                      any rank but 0 when it dies (manifest standby entries)\n"
        "  --repair-wait S     rank 0 pauses sessions up to S s for a repair (kvd stage\n"
        "                      --repair-wait; default 30 with standbys, else 0: they end)\n"
        "  --link-timeout-ms N a link silent for N ms is dead (kvd stage --link-timeout-ms;\n"
        "                      default 3000 + 4 x the link's RTT)\n"
        "  --boundary-log-mb N each stage keeps up to N MiB (fractions allowed) of the\n"
        "                      boundaries it sent per session, for repairs (default 4; 0: none)\n"
        "  --backends B,B,...  each rank's kernel device (cpu, opencl) in the manifest's\n"
        "                      \"backend\" (default cpu for every rank)\n"
        "  --api HOST:PORT     rank 0 serves the OpenAI-compatible API there (docs/api.md; port\n"
        "                      0: a free one, printed),\n"
        "  --api-key-file F, --api-max-sessions N, --chat-template NAME, --api-open,\n"
        "  --api-tls-cert PEM, --api-tls-key PEM, --api-keepalive S  with these (kvd stage;\n"
        "                      an address other than loopback needs keys or --api-open)\n"
        "  --draft lookup|none, --draft-max K  rank 0's drafting for requests that do not say\n"
        "                      (kvd stage --draft; default none)\n"
        "Writes DIR/ring.json (the planner's even split by work unless --split), starts one kvd per\n"
        "stage on loopback, waits until the ring is linked and prints it.\n");
}

/* What `kvctl ring up` was asked for: its options, parsed (up_parse) and checked (up_check). */
struct up_opts {
    const char *model, *dtype, *dir;
    long stages, base_port, threads, ctx, max_batch;
    long batch_wait;                    /* -1: kvd stage's default */
    bool stub;
    long s_layers, s_embd;              /* --stub's stand-in shape */
    const char *window_from, *catalog, *backends;
    const char *split;                  /* --split as given (for messages) */
    uint32_t split_b[MAX_STAGES + 1];   /* its window bounds, split_n + 1 of them */
    long split_n;
    long n_standby, link_timeout;
    long repair_wait;                   /* -1: kvd stage's default */
    const char *blog_mb;                /* passed on as it is (kvd stage checks it) */
    /* rank 0's API and drafting options, passed on as they are (kvd stage checks them) */
    const char *api, *api_keys, *api_max, *chat_template, *api_cert, *api_tls_key, *api_keepalive;
    const char *draft, *draft_max;
    bool api_open;
    const char *extra;                  /* the first argument that is not an option */
    bool help;                          /* the usage went to stdout: nothing more to do */
};

/* A ring on its way up: what each step of ring_up works out for the steps after it. Nodes are
 * numbered ranks first, then the standbys (node stages + i is standby i). */
struct up {
    struct up_opts o;
    const char *api;                    /* --api as rank 0 gets it (a port 0 bound: api_bound) */
    int api_fd;                         /* rank 0's API socket when kvctl binds it (--api HOST:0) */
    char api_bound[160];
    /* the model */
    char arch[32], name[128];
    uint32_t n_layers, n_embd, n_ctx_train;
    uint64_t *lbytes;                   /* bytes per layer (NULL: every layer counts 1) */
    char model_abs[PATH_MAX];
    struct gguf_catalog *cat;           /* built here, saved into DIR (NULL: --catalog, --stub) */
    char cat_id[65], cat_path[PATH_MAX];
    /* the windows: rank r holds layers [bounds[r], bounds[r + 1]) */
    bool planned;                       /* the planner's split (plan_first, plan_last) */
    uint32_t plan_first[MAX_STAGES], plan_last[MAX_STAGES];
    uint32_t bounds[MAX_STAGES + 1];
    /* the ring on disk and its processes */
    char dir_abs[PATH_MAX], mpath[PATH_MAX], kvd[PATH_MAX];
    struct ring_manifest man;           /* the manifest written to mpath */
    struct ring_manifest loaded;        /* the same as the stages read it back */
    uint32_t n_procs;
    int lfd[MAX_STAGES + RING_MAX_STANDBYS];   /* each node's listening socket until it starts */
    pid_t pids[MAX_STAGES + RING_MAX_STANDBYS];
    double t0;                          /* when the wait for the links began */
};

static const struct option up_longopts[] = {
    {"model", required_argument, 0, 'm'}, {"stages", required_argument, 0, 's'},
    {"dtype", required_argument, 0, 'd'}, {"base-port", required_argument, 0, 'p'},
    {"dir", required_argument, 0, 'D'}, {"ctx", required_argument, 0, 'c'},
    {"max-batch", required_argument, 0, 'b'}, {"stub", no_argument, 0, 'S'},
    {"layers", required_argument, 0, 'L'}, {"embd", required_argument, 0, 'E'},
    {"window-from", required_argument, 0, 'W'}, {"catalog", required_argument, 0, 'C'},
    {"split", required_argument, 0, 'P'}, {"batch-wait-us", required_argument, 0, 'w'},
    {"standby", required_argument, 0, 'Y'}, {"repair-wait", required_argument, 0, 'R'},
    {"link-timeout-ms", required_argument, 0, 'T'}, {"backends", required_argument, 0, 'K'},
    {"api", required_argument, 0, 'A'}, {"api-key-file", required_argument, 0, 'k'},
    {"api-max-sessions", required_argument, 0, 'X'},
    {"api-open", no_argument, 0, 'O'}, {"api-tls-cert", required_argument, 0, 'Z'},
    {"api-tls-key", required_argument, 0, 'z'}, {"api-keepalive", required_argument, 0, 'V'},
    {"chat-template", required_argument, 0, 'J'},
    {"boundary-log-mb", required_argument, 0, 'G'},
    {"draft", required_argument, 0, 'F'}, {"draft-max", required_argument, 0, 'f'},
    {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};

/* --split "A:B,B:C,...": windows in ring order, non-empty, contiguous from 0, into o->split_b;
 * --stages becomes their count. 0, or 2 (said). */
static int up_parse_split(struct up_opts *o)
{
    const char *p = o->split;
    for (;;) {
        char *end;
        unsigned long a = strtoul(p, &end, 10);
        if (end == p || *end != ':' || o->split_n >= MAX_STAGES) {
            fprintf(stderr, "kvctl ring up: --split '%s': expected A:B,B:C,... (at most %d "
                    "windows)\n", o->split, MAX_STAGES);
            return 2;
        }
        p = end + 1;
        unsigned long b = strtoul(p, &end, 10);
        if (end == p || b <= a || b > 100000 ||
            (o->split_n == 0 ? a != 0 : a != o->split_b[o->split_n])) {
            fprintf(stderr, "kvctl ring up: --split '%s': windows must be non-empty, "
                    "contiguous and start at 0\n", o->split);
            return 2;
        }
        o->split_b[o->split_n] = (uint32_t)a;
        o->split_b[++o->split_n] = (uint32_t)b;
        if (*end == 0)
            break;
        if (*end != ',') {
            fprintf(stderr, "kvctl ring up: --split '%s': expected ',' after a window\n", o->split);
            return 2;
        }
        p = end + 1;
    }
    if (o->stages && o->stages != o->split_n) {
        fprintf(stderr, "kvctl ring up: --stages %ld but --split gives %ld windows\n", o->stages,
                o->split_n);
        return 2;
    }
    o->stages = o->split_n;
    return 0;
}

/* The command line into o (its defaults already there); --help prints the usage and sets
 * o->help. 0, or 2 for a malformed option (said). */
static int up_parse(struct up_opts *o, int argc, char **argv)
{
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:t:h", up_longopts, NULL)) != -1) {
        int rc = 0;
        switch (c) {
        case 'm': o->model = optarg; break;
        case 's': rc = kvctl_parse_long("--stages", optarg, 1, MAX_STAGES, &o->stages); break;
        case 'd': o->dtype = optarg; break;
        case 'p': rc = kvctl_parse_long("--base-port", optarg, 0, 65535 - MAX_STAGES, &o->base_port); break;
        case 'D': o->dir = optarg; break;
        case 't': rc = kvctl_parse_long("-t", optarg, 0, 1024, &o->threads); break;
        case 'c': rc = kvctl_parse_long("--ctx", optarg, 8, 1 << 20, &o->ctx); break;
        case 'b': rc = kvctl_parse_long("--max-batch", optarg, 1, 4096, &o->max_batch); break;
        case 'S': o->stub = true; break;
        case 'w': rc = kvctl_parse_long("--batch-wait-us", optarg, 0, 1000000, &o->batch_wait); break;
        case 'A': o->api = optarg; break;
        case 'k': o->api_keys = optarg; break;
        case 'X': o->api_max = optarg; break;
        case 'O': o->api_open = true; break;
        case 'Z': o->api_cert = optarg; break;
        case 'z': o->api_tls_key = optarg; break;
        case 'V': o->api_keepalive = optarg; break;
        case 'J': o->chat_template = optarg; break;
        case 'G': o->blog_mb = optarg; break;
        case 'F': o->draft = optarg; break;
        case 'f': o->draft_max = optarg; break;
        case 'W': o->window_from = optarg; break;
        case 'Y': rc = kvctl_parse_long("--standby", optarg, 0, RING_MAX_STANDBYS, &o->n_standby); break;
        case 'R': rc = kvctl_parse_long("--repair-wait", optarg, 0, 86400, &o->repair_wait); break;
        case 'T': rc = kvctl_parse_long("--link-timeout-ms", optarg, 100, 3600000, &o->link_timeout); break;
        case 'C': o->catalog = optarg; break;
        case 'P': o->split = optarg; break;
        case 'K': o->backends = optarg; break;
        case 'L': rc = kvctl_parse_long("--layers", optarg, 1, 100000, &o->s_layers); break;
        case 'E': rc = kvctl_parse_long("--embd", optarg, 1, 1 << 16, &o->s_embd); break;
        case 'h': ring_up_usage(stdout); o->help = true; return 0;
        default: ring_up_usage(stderr); return 2;
        }
        if (rc < 0)
            return 2;
    }
    o->extra = optind != argc ? argv[optind] : NULL;
    return o->split ? up_parse_split(o) : 0;
}

/* What the options must say together: a model (or --stub's shape), a stage count, a wire dtype,
 * and an API rank 0 will accept (it would refuse only after the ring started: say so now).
 * 0, or 2 (said). */
static int up_check(struct up *u)
{
    const struct up_opts *o = &u->o;
    const char *missing = o->extra ? "no arguments besides the options"
                        : !o->model && !o->stub ? "--model FILE"
                        : !o->stages ? "--stages N (or --split A:B,B:C,...)"
                        : o->stub && (!o->s_layers || !o->s_embd) ? "--layers L and --embd E with --stub"
                        : NULL;
    if (missing) {
        ring_up_usage(stderr);
        if (o->extra)
            fprintf(stderr, "kvctl ring up: unexpected argument '%s'\n", o->extra);
        else
            fprintf(stderr, "kvctl ring up: %s is required\n", missing);
        return 2;
    }
    if (strcmp(o->dtype, "f32") && strcmp(o->dtype, "f16")) {
        fprintf(stderr, "kvctl ring up: --dtype must be f32 or f16\n");
        return 2;
    }
    if (o->api) {
        struct api_config ac = {.listen = o->api, .key_file = o->api_keys, .open = o->api_open,
                                .tls_cert = o->api_cert, .tls_key = o->api_tls_key};
        char err[KV_ERR_MAX];
        if (api_config_check(&ac, err, sizeof err) < 0) {
            fprintf(stderr, "kvctl ring up: %s\n", err);
            return 2;
        }
    }
    return 0;
}

/* --api HOST:0: a free port, bound here and handed to rank 0 (and printed once the ring is up),
 * so that the address printed is the one it serves. 0, or 1 (said). */
static int up_bind_api(struct up *u)
{
    const char *api = u->o.api;
    const char *colon = api ? strrchr(api, ':') : NULL;
    if (!colon || strcmp(colon, ":0") != 0)
        return 0;
    char host[128];
    int port = 0;
    snprintf(host, sizeof host, "%.*s", (int)(colon - api), api);
    size_t hl = strlen(host);
    if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = 0;
    }
    u->api_fd = listen_socket(host, 0, &port);
    if (u->api_fd < 0) {
        fprintf(stderr, "kvctl ring up: --api %s: %s\n", api, strerror(-u->api_fd));
        return 1;
    }
    snprintf(u->api_bound, sizeof u->api_bound, "%.*s:%d", (int)(colon - api), api, port);
    u->api = u->api_bound;
    return 0;
}

/* The model's shape from its GGUF header: architecture, the layers of the main pass, width,
 * trained context and name; *nextn gets its multi-token-prediction blocks. 0, or 1 (said). */
static int up_model_shape(struct up *u, const struct gguf_file *g, uint32_t *nextn)
{
    const char *model = u->o.model;
    char key[96];
    int rc = gguf_get_str(g, "general.architecture", u->arch, sizeof u->arch);
    if (rc == 0)
        rc = gguf_block_count(g, &u->n_layers);
    /* Multi-token-prediction blocks (qwen35moe and others) are not part of the main pass:
     * the ring's layers are block_count - nextn_predict_layers (as model_open counts). */
    *nextn = 0;
    snprintf(key, sizeof key, "%s.nextn_predict_layers", u->arch);
    if (rc == 0 && gguf_get_u32(g, key, nextn) == 0 && *nextn < u->n_layers)
        u->n_layers -= *nextn;
    snprintf(key, sizeof key, "%s.embedding_length", u->arch);
    if (rc == 0)
        rc = gguf_get_u32(g, key, &u->n_embd);
    snprintf(key, sizeof key, "%s.context_length", u->arch);
    if (gguf_get_u32(g, key, &u->n_ctx_train) < 0)
        u->n_ctx_train = 4096;
    if (gguf_get_str(g, "general.name", u->name, sizeof u->name) < 0) {
        char tmp[PATH_MAX];
        snprintf(tmp, sizeof tmp, "%s", model);
        snprintf(u->name, sizeof u->name, "%s", basename(tmp));
    }
    if (rc < 0 || u->n_layers == 0) {
        fprintf(stderr, "kvctl ring up: %s: no architecture / block_count / embedding_length\n", model);
        return 1;
    }
    return 0;
}

/* Bytes of each of the first n_layers blocks (the tensors named blk.N.*), zeroed and malloc'd
 * (the caller frees); NULL when out of memory. */
static uint64_t *layer_bytes(const struct gguf_file *g, uint32_t n_layers)
{
    uint64_t *lbytes = calloc(n_layers, sizeof *lbytes);
    for (uint64_t i = 0; lbytes && i < gguf_tensor_count(g); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(g, i);
        int l = gguf_tensor_layer(t->name);
        if (l >= 0 && (uint32_t)l < n_layers)
            lbytes[l] += t->size;
    }
    return lbytes;
}

/* The model's identity: its catalog (per-tensor SHA-256), which every stage checks its window
 * against. --catalog's is used as it is (its id names the model in the manifest); else one is
 * built from g, to be saved into DIR. 0, or 1 (said). */
static int up_catalog(struct up *u, const struct gguf_file *g)
{
    char err[KV_ERR_MAX] = "";
    struct gguf_catalog *cat;
    if (u->o.catalog) {
        if (gguf_catalog_load(&cat, u->o.catalog, u->cat_id, err, sizeof err) < 0) {
            fprintf(stderr, "kvctl ring up: catalog %s: %s\n", u->o.catalog, err);
            return 1;
        }
        gguf_catalog_free(cat);
        if (!realpath(u->o.catalog, u->cat_path)) {
            fprintf(stderr, "kvctl ring up: catalog %s: %s\n", u->o.catalog, err);
            return 1;
        }
        return 0;
    }
    if (gguf_catalog_build(&cat, g, err, sizeof err) < 0) {
        fprintf(stderr, "kvctl ring up: catalog of %s: %s\n", u->o.model, err);
        return 1;
    }
    u->cat = cat;
    return 0;
}

/* The model: its shape, the planner's split when it has one, bytes per layer, identity and
 * absolute path (--stub: the stand-in shape and nothing else). The planner reads the tensor
 * list, so it runs here while the file is open. 0, or 1 (said). */
static int up_model(struct up *u)
{
    const struct up_opts *o = &u->o;
    snprintf(u->arch, sizeof u->arch, "stub");
    snprintf(u->name, sizeof u->name, "stub");
    u->n_layers = (uint32_t)o->s_layers;
    u->n_embd = (uint32_t)o->s_embd;
    u->n_ctx_train = 4096;
    if (o->stub)
        return 0;
    char err[KV_ERR_MAX];
    struct gguf_file *g;
    if (gguf_file_open(&g, o->model, err, sizeof err) < 0) {
        fprintf(stderr, "kvctl ring up: %s\n", err);   /* err names the file */
        return 1;
    }
    uint32_t nextn;
    int rc = up_model_shape(u, g, &nextn);
    if (rc == 0) {
        /* The planner's even split for identical local processes (balanced by the work per
         * token, embedding and head included); the byte split is the fallback. */
        if (!o->split && (uint32_t)o->stages <= u->n_layers)
            u->planned = plan_split(g, u->arch, u->n_layers, nextn, u->n_embd, (uint32_t)o->stages,
                                    u->plan_first, u->plan_last) == 0;
        u->lbytes = layer_bytes(g, u->n_layers);
        rc = up_catalog(u, g);
    }
    gguf_file_free(g);
    if (rc == 0 && !realpath(o->model, u->model_abs)) {
        fprintf(stderr, "kvctl ring up: %s: %s\n", o->model, strerror(errno));
        rc = 1;
    }
    return rc;
}

/* An even split by layer bytes (lbytes NULL: by layers) into bounds[0..n]: stage k ends where
 * the running total first reaches (k+1)/n of the whole, leaving at least one layer for every
 * later stage. n_layers >= n >= 1. */
static void split_by_bytes(const uint64_t *lbytes, uint32_t n_layers, uint32_t n, uint32_t *bounds)
{
    uint64_t total = 0;
    for (uint32_t l = 0; l < n_layers; l++)
        total += lbytes ? lbytes[l] : 1;
    bounds[0] = 0;
    uint64_t acc = 0;
    uint32_t l = 0;
    for (uint32_t k = 0; k < n; k++) {
        if (k == n - 1) {
            bounds[k + 1] = n_layers;
            break;
        }
        double target = (double)total * (k + 1) / (double)n;
        do {
            acc += lbytes ? lbytes[l] : 1;
            l++;
        } while (l < n_layers - (n - 1 - k) && (double)acc + 0.5 * (lbytes ? lbytes[l] : 1) < target);
        bounds[k + 1] = l;
    }
}

/* Each rank's window: --split's, else the planner's, else the byte split. 0, or 1 (said). */
static int up_windows(struct up *u)
{
    const struct up_opts *o = &u->o;
    uint32_t n = (uint32_t)o->stages;
    if (n > u->n_layers) {
        fprintf(stderr, "kvctl ring up: %ld stages but the model has only %u layers\n", o->stages,
                u->n_layers);
        return 1;
    }
    if (o->split) {
        if (o->split_b[o->split_n] != u->n_layers) {
            fprintf(stderr, "kvctl ring up: --split ends at layer %u but the model has %u layers\n",
                    o->split_b[o->split_n], u->n_layers);
            return 1;
        }
        memcpy(u->bounds, o->split_b, ((size_t)o->split_n + 1) * sizeof *u->bounds);
    } else if (u->planned) {
        for (uint32_t k = 0; k < n; k++)
            u->bounds[k] = u->plan_first[k];
        u->bounds[n] = u->plan_last[n - 1];
    } else
        split_by_bytes(u->lbytes, u->n_layers, n, u->bounds);
    return 0;
}

/* DIR made and resolved (dir_abs), unless a ring still runs there. 0, or 1 (said). */
static int up_dir(struct up *u)
{
    const char *dir = u->o.dir;
    if (mkdir_p(dir) < 0 || !realpath(dir, u->dir_abs)) {
        fprintf(stderr, "kvctl ring up: %s: %s\n", dir, strerror(errno));
        return 1;
    }
    for (uint32_t r = 0; r < MAX_STAGES; r++) {
        char pidf[PATH_MAX];
        snprintf(pidf, sizeof pidf, "%s/rank-%u/kvd.pid", u->dir_abs, r);
        FILE *f = fopen(pidf, "r");
        if (!f)
            break;
        int pid = 0;
        struct stat pst;
        char why[PATH_MAX * 2 + 64];
        bool running = fscanf(f, "%d", &pid) == 1 && pid > 0 && pid_alive(pid) &&
                       fstat(fileno(f), &pst) == 0 &&
                       ring_kvd_is(pid, u->dir_abs, r, pst.st_mtime, why, sizeof why);
        fclose(f);
        if (running) {
            fprintf(stderr, "kvctl ring up: a ring is already running in %s (rank %u, pid %d): "
                    "kvctl ring down --dir %s\n", dir, r, pid, dir);
            return 1;
        }
    }
    return 0;
}

/* The catalog built from the model, saved as DIR/catalog.json (its id for the manifest). 0, or
 * 1 (said). */
static int up_save_catalog(struct up *u)
{
    if (!u->cat)
        return 0;
    char err[KV_ERR_MAX];
    snprintf(u->cat_path, sizeof u->cat_path, "%s/catalog.json", u->dir_abs);
    int rc = gguf_catalog_save(u->cat, u->cat_path, u->cat_id, err, sizeof err);
    gguf_catalog_free(u->cat);
    u->cat = NULL;
    if (rc < 0) {
        fprintf(stderr, "kvctl ring up: %s\n", err);
        return 1;
    }
    return 0;
}

/* Node k's state dir: DIR/rank-k for a rank, DIR/standby-i for standby i. */
static void up_node_dir(const struct up *u, uint32_t k, char *out, size_t n)
{
    bool sb = k >= (uint32_t)u->o.stages;
    snprintf(out, n, "%s/%s-%u", u->dir_abs, sb ? "standby" : "rank", sb ? k - (uint32_t)u->o.stages : k);
}

/* The Ed25519 public key of the node whose state dir is sd (made there on first use). */
static int node_key(const char *sd, uint8_t key[32], char *err, size_t errlen)
{
    struct net_identity *id;
    int rc = net_identity_load(&id, sd, err, errlen);
    if (rc < 0)
        return rc;
    memcpy(key, net_identity_pub(id), 32);
    net_identity_free(id);
    return 0;
}

/* Node k's listening socket on loopback (--base-port + k, else a free port) into u->lfd[k], its
 * endpoint into ep; what and i name the node in a message. 0, or 1 (said). */
static int up_listen(struct up *u, uint32_t k, const char *what, uint32_t i, char *ep, size_t n)
{
    long base = u->o.base_port;
    int port = 0;
    int fd = listen_socket("127.0.0.1", base ? (int)base + (int)k : 0, &port);
    if (fd < 0) {
        fprintf(stderr, "kvctl ring up: %s %u: listening on 127.0.0.1:%ld: %s\n", what, i,
                base ? base + (long)k : 0L, strerror(-fd));
        return 1;
    }
    u->lfd[k] = fd;
    snprintf(ep, n, "tcp://127.0.0.1:%d", port);
    return 0;
}

/* Entry r of a comma-separated --backends list into out; a missing or empty one is cpu. */
static void backend_at(const char *list, uint32_t r, char *out, size_t n)
{
    const char *bp = list;
    for (uint32_t i = 0; bp && i < r; i++)
        bp = (bp = strchr(bp, ',')) ? bp + 1 : NULL;
    snprintf(out, n, "cpu");
    if (bp && *bp && *bp != ',')
        snprintf(out, n, "%.*s", (int)strcspn(bp, ","), bp);
}

/* Rank r's manifest entry: its node key, window, backend and endpoint (its socket bound). 0, or
 * 1 (said). */
static int up_rank(struct up *u, uint32_t r)
{
    struct ring_rank_info *ri = &u->man.ranks[r];
    char sd[PATH_MAX], err[300];
    up_node_dir(u, r, sd, sizeof sd);
    if (node_key(sd, ri->node, err, sizeof err) < 0) {
        fprintf(stderr, "kvctl ring up: %s\n", err);
        return 1;
    }
    ri->has_node = true;
    ri->rank = r;
    ri->first = u->bounds[r];
    ri->last = u->bounds[r + 1];
    ri->embed = r == 0;
    ri->head = r == (uint32_t)u->o.stages - 1;
    backend_at(u->o.backends, r, ri->backend, sizeof ri->backend);
    return up_listen(u, r, "rank", r, ri->endpoint, sizeof ri->endpoint);
}

/* Standby i's manifest entry: a node that may take over any rank but 0 (its socket bound). 0,
 * or 1 (said). */
static int up_standby(struct up *u, uint32_t i)
{
    struct ring_standby_info *si = &u->man.standbys[i];
    uint32_t k = (uint32_t)u->o.stages + i;
    char sd[PATH_MAX], err[300];
    up_node_dir(u, k, sd, sizeof sd);
    int rc = mkdir_p(sd);
    if (rc < 0)
        snprintf(err, sizeof err, "%s", strerror(-rc));
    if (rc < 0 || node_key(sd, si->node, err, sizeof err) < 0) {
        fprintf(stderr, "kvctl ring up: %s: %s\n", sd, err);
        return 1;
    }
    for (uint32_t r = 1; r < (uint32_t)u->o.stages; r++)
        si->ranks |= 1ull << r;
    return up_listen(u, k, "standby", i, si->endpoint, sizeof si->endpoint);
}

/* The manifest of a fresh ring: a random ring id, the model, the limits (--ctx, else the
 * model's context up to 4096; no batch longer than that), then every rank and standby. 0, or
 * 1 (said). */
static int up_manifest(struct up *u)
{
    const struct up_opts *o = &u->o;
    struct ring_manifest *m = &u->man;
    uint32_t n_ctx = o->ctx ? (uint32_t)o->ctx : u->n_ctx_train < 4096 ? u->n_ctx_train : 4096;
    uint32_t max_batch = (uint32_t)o->max_batch > n_ctx ? n_ctx : (uint32_t)o->max_batch;
    uint8_t rid[8];
    RAND_bytes(rid, sizeof rid);
    *m = (struct ring_manifest){.version = 1, .stated = RING_STATED_N_CTX | RING_STATED_MAX_BATCH,
                                .n_layers = u->n_layers, .n_embd = u->n_embd, .n_ctx = n_ctx,
                                .max_batch = max_batch, .n_ranks = (uint32_t)o->stages,
                                .n_standbys = (uint32_t)o->n_standby,
                                .n_own_standbys = (uint32_t)o->n_standby};
    util_hex_encode(rid, sizeof rid, m->ring);
    snprintf(m->model_name, sizeof m->model_name, "%s", u->name);
    snprintf(m->catalog, sizeof m->catalog, "%s", u->cat_id);
    snprintf(m->arch, sizeof m->arch, "%s", u->arch);
    snprintf(m->dtype, sizeof m->dtype, "%s", o->dtype);
    for (uint32_t r = 0; r < (uint32_t)o->stages; r++)
        if (up_rank(u, r) != 0)
            return 1;
    for (uint32_t i = 0; i < (uint32_t)o->n_standby; i++)
        if (up_standby(u, i) != 0)
            return 1;
    return 0;
}

/* The manifest as DIR/ring.json (mpath), with the local ring's bookkeeping that the stages
 * ignore: the model's path and whether the compute is the stand-in. 0, or 1 (said). */
static int up_write_manifest(struct up *u)
{
    cJSON *root;
    char err[KV_ERR_MAX];
    if (ring_manifest_to_json(&root, &u->man, err, sizeof err) < 0) {
        fprintf(stderr, "kvctl ring up: %s\n", err);
        return 1;
    }
    cJSON *jk = cJSON_AddObjectToObject(root, "local");
    cJSON_AddStringToObject(jk, "model_path", u->o.stub ? "" : u->model_abs);
    cJSON_AddBoolToObject(jk, "stub", u->o.stub);
    char *js = cJSON_Print(root);
    cJSON_Delete(root);
    snprintf(u->mpath, sizeof u->mpath, "%s/ring.json", u->dir_abs);
    FILE *f = fopen(u->mpath, "w");
    if (!f || fputs(js, f) < 0 || fputc('\n', f) < 0 || fclose(f) != 0) {
        fprintf(stderr, "kvctl ring up: writing %s: %s\n", u->mpath, strerror(errno));
        free(js);
        return 1;
    }
    free(js);
    return 0;
}

/* Text of the numbers on a node's command line. */
struct up_argtext {
    char index[16], threads[16], batch_wait[24], repair_wait[24], link_timeout[24];
};

/* Node k's `kvd stage` command line into args (room for 72, NULL-terminated); the strings live
 * in u, sd and t. */
static void up_stage_args(const struct up *u, uint32_t k, const char *sd, struct up_argtext *t,
                          const char **args)
{
    const struct up_opts *o = &u->o;
    bool sb = k >= (uint32_t)o->stages;
    snprintf(t->index, sizeof t->index, "%u", sb ? k - (uint32_t)o->stages : k);
    snprintf(t->threads, sizeof t->threads, "%ld", o->threads);
    snprintf(t->batch_wait, sizeof t->batch_wait, "%ld", o->batch_wait);
    snprintf(t->repair_wait, sizeof t->repair_wait, "%ld", o->repair_wait);
    snprintf(t->link_timeout, sizeof t->link_timeout, "%ld", o->link_timeout);
    int a = 0;
    args[a++] = u->kvd;
    args[a++] = "stage";
    args[a++] = "--manifest";
    args[a++] = u->mpath;
    args[a++] = sb ? "--standby" : "--rank";
    args[a++] = t->index;
    if (o->repair_wait >= 0) {
        args[a++] = "--repair-wait";
        args[a++] = t->repair_wait;
    }
    if (o->link_timeout) {
        args[a++] = "--link-timeout-ms";
        args[a++] = t->link_timeout;
    }
    if (o->blog_mb) {
        args[a++] = "--boundary-log-mb";
        args[a++] = o->blog_mb;
    }
    args[a++] = "--state-dir";
    args[a++] = sd;
    args[a++] = "-t";
    args[a++] = t->threads;
    if (o->batch_wait >= 0) {
        args[a++] = "--batch-wait-us";
        args[a++] = t->batch_wait;
    }
    if (k == 0) {
        const char *ao[][2] = {{"--api", u->api}, {"--api-key-file", o->api_keys},
                               {"--api-max-sessions", o->api_max},
                               {"--api-tls-cert", o->api_cert}, {"--api-tls-key", o->api_tls_key},
                               {"--api-keepalive", o->api_keepalive},
                               {"--chat-template", o->chat_template},
                               {"--draft", o->draft}, {"--draft-max", o->draft_max}};
        for (size_t i = 0; i < sizeof ao / sizeof ao[0]; i++)
            if (ao[i][1]) {
                args[a++] = ao[i][0];
                args[a++] = ao[i][1];
            }
        if (o->api_open)
            args[a++] = "--api-open";
    }
    if (o->stub)
        args[a++] = "--stub";
    else {
        if (o->window_from) {
            args[a++] = "--window-from";
            args[a++] = o->window_from;
        } else {
            args[a++] = "--model";
            args[a++] = u->model_abs;
        }
        args[a++] = "--catalog";
        args[a++] = u->cat_path;
    }
    args[a] = NULL;
}

/* In the forked child: become node k, a `kvd stage` in its own session, logging to its state
 * dir's kvd.log, with its listening socket (and rank 0's API socket) handed over. */
static _Noreturn void up_exec_node(const struct up *u, uint32_t k)
{
    char sd[PATH_MAX], logp[PATH_MAX];
    up_node_dir(u, k, sd, sizeof sd);
    snprintf(logp, sizeof logp, "%s/kvd.log", sd);
    setsid();
    int fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int nul = open("/dev/null", O_RDONLY);
    if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
    }
    if (nul >= 0)
        dup2(nul, 0);
    int hfd[2] = {u->lfd[k], u->api_fd};
    hand_over(hfd, k == 0 && u->api_fd >= 0 ? 2 : 1);
    const char *args[72];   /* the most options up_stage_args gives, with room */
    struct up_argtext t;
    up_stage_args(u, k, sd, &t, args);
    execv(u->kvd, (char **)args);
    _exit(127);
}

/* One kvd per node, ranks first, each pid in its state dir's kvd.pid; the parent's copies of
 * the sockets handed over are closed. 0, or 1 (said). */
static int up_start(struct up *u)
{
    if (kvd_path(u->kvd, sizeof u->kvd) < 0) {
        fprintf(stderr, "kvctl ring up: kvd not found %s (%s)\n",
                getenv("KVD_BIN") && *getenv("KVD_BIN") ? "at KVD_BIN" : "next to kvctl", u->kvd);
        return 1;
    }
    u->n_procs = (uint32_t)u->o.stages + (uint32_t)u->o.n_standby;
    for (uint32_t k = 0; k < u->n_procs; k++) {
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "kvctl ring up: fork: %s\n", strerror(errno));
            return 1;
        }
        if (pid == 0)
            up_exec_node(u, k);
        u->pids[k] = pid;
        close(u->lfd[k]);
        u->lfd[k] = -1;
        if (k == 0 && u->api_fd >= 0) {
            close(u->api_fd);
            u->api_fd = -1;
        }
        char pidf[PATH_MAX];
        up_node_dir(u, k, pidf, sizeof pidf);
        snprintf(pidf + strlen(pidf), sizeof pidf - strlen(pidf), "/kvd.pid");
        FILE *pf = fopen(pidf, "w");
        if (pf) {
            fprintf(pf, "%d\n", (int)pid);
            fclose(pf);
        }
    }
    return 0;
}

/* Node k exited before the ring linked: the others stopped, its log shown (with a hint when it
 * is a kvd without the stand-in compute that --stub needs). */
static void up_report_exit(const struct up *u, uint32_t k)
{
    char logp[PATH_MAX + 48], line[1024];
    up_node_dir(u, k, logp, sizeof logp);
    snprintf(logp + strlen(logp), sizeof logp - strlen(logp), "/kvd.log");
    for (uint32_t i = 0; i < u->n_procs; i++)
        if (i != k) {
            kill(u->pids[i], SIGTERM);
            waitpid(u->pids[i], NULL, 0);
        }
    fprintf(stderr, "kvctl ring up: stage %u exited; its log (%s):\n", k, logp);
    bool no_stub = false;
    FILE *lf = fopen(logp, "r");
    while (lf && fgets(line, sizeof line, lf)) {
        fprintf(stderr, "  %s", line);
        no_stub |= strstr(line, "unknown option '--stub'") != NULL;
    }
    if (lf)
        fclose(lf);
    if (no_stub)
        fprintf(stderr, "kvctl ring up: --stub needs the test build of kvd: "
                "KVD_BIN=build/tests/kvd-stub kvctl ring up ...\n");
}

/* Whether node k is up: a rank with both links up, a standby answering and waiting for a rank. */
static bool up_node_ready(const struct up *u, uint32_t k)
{
    char sock[PATH_MAX + 48], err[300];
    up_node_dir(u, k, sock, sizeof sock);
    snprintf(sock + strlen(sock), sizeof sock - strlen(sock), "/kvd.sock");
    cJSON *s = query_status(sock, err, sizeof err);
    const char *key = k >= (uint32_t)u->o.stages ? "waiting" : "linked";
    bool ready = s && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, key));
    cJSON_Delete(s);
    return ready;
}

/* Wait up to 60 s until every node is up; a node that exits, or the time running out, ends
 * the wait with a report. 0, or 1 (said). */
static int up_wait_linked(struct up *u)
{
    if (load_ring(u->dir_abs, &u->loaded) < 0)
        return 1;
    u->t0 = util_now_s();
    for (;;) {
        uint32_t ready = 0;
        for (uint32_t k = 0; k < u->n_procs; k++) {
            int st;
            if (waitpid(u->pids[k], &st, WNOHANG) == u->pids[k]) {
                up_report_exit(u, k);
                return 1;
            }
            ready += up_node_ready(u, k);
        }
        if (ready == u->n_procs)
            return 0;
        if (util_now_s() - u->t0 > 60) {
            fprintf(stderr, "kvctl ring up: the ring did not link within 60 s (logs in %s/rank-*/kvd.log)\n",
                    u->o.dir);
            print_status_table(u->dir_abs, &u->loaded, stderr);
            return 1;
        }
        usleep(50000);
    }
}

/* The ring that came up: how long it took, where its windows came from, its table, its API. */
static void up_print(const struct up *u)
{
    const struct up_opts *o = &u->o;
    printf("ring up in %.2f s (manifest %s)\n", util_now_s() - u->t0, u->mpath);
    printf("windows: %s\n", o->split ? "--split" : u->planned ? "the planner's split for identical local stages "
           "(balanced by work per token, embedding and head included)" : o->stub ? "even (stand-in compute)"
           : "by layer bytes (the planner refused: see above)");
    print_status_table(u->dir_abs, &u->loaded, stdout);
    if (u->api)
        printf("api: %s://%s/v1 (rank 0)\n", o->api_cert ? "https" : "http", u->api);
}

/* What ring_up still holds when it ends: the model's catalog and layer sizes, sockets not yet
 * handed over. */
static void up_free(struct up *u)
{
    free(u->lbytes);
    gguf_catalog_free(u->cat);
    close_fds(u->lfd, MAX_STAGES + RING_MAX_STANDBYS);
    if (u->api_fd >= 0)
        close(u->api_fd);
}

/* The steps of ring up after the options are parsed, in order: each returns 0 to go on, or
 * the command's exit status (said). */
static int (*const up_steps[])(struct up *) = {
    up_check, up_bind_api, up_model, up_windows, up_dir, up_save_catalog, up_manifest,
    up_write_manifest, up_start, up_wait_linked,
};

/* kvctl ring up: the options, the model and its windows, DIR with the catalog and manifest,
 * the stages started on sockets bound here, and the wait until they link. */
static int ring_up(int argc, char **argv)
{
    struct up u = {.o = {.dtype = "f32", .dir = "ring", .threads = 1, .max_batch = 512,
                         .batch_wait = -1, .repair_wait = -1},
                   .api_fd = -1};
    for (size_t i = 0; i < sizeof u.lfd / sizeof u.lfd[0]; i++)
        u.lfd[i] = -1;
    int rc = up_parse(&u.o, argc, argv);
    if (rc != 0 || u.o.help)
        return rc;
    u.api = u.o.api;
    for (size_t i = 0; rc == 0 && i < sizeof up_steps / sizeof up_steps[0]; i++)
        rc = up_steps[i](&u);
    if (rc == 0)
        up_print(&u);
    up_free(&u);
    return rc;
}

/* ---- ring down ---- */

/* Wait up to s seconds for pid to be gone; whether it is. */
static bool wait_gone(int pid, double s)
{
    double t0 = util_now_s();
    while (pid_alive(pid) && util_now_s() - t0 < s) {
        waitpid(pid, NULL, WNOHANG);
        usleep(10000);
    }
    return !pid_alive(pid);
}

static int ignore_line(const char *line, void *ud)
{
    (void)line;
    (void)ud;
    return 1;
}

/* The ring directory option of status and ring down: --dir DIR, --ring DIR, --dir=DIR or
 * --ring=DIR (both names mean the same). The value, with *i moved past it, or NULL. */
static const char *dir_opt(int argc, char **argv, int *i)
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
 * this ring's kvd (ring_kvd_is, checked again before each signal) gets SIGTERM, then SIGKILL. */
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
    bool ours = pid_alive(pid) && ring_kvd_is(pid, dir_abs, r, pst.st_mtime, why, sizeof why);
    if (!ours) {
        if (pid_alive(pid)) {
            fprintf(stderr, "kvctl ring down: %s %u: pid %d in %s is not this ring's kvd (%s): "
                    "not signalled\n", kind, r, pid, pidf, why);
            (*refused)++;
        }
        *stopped += asked;
        unlink(pidf);
        return 0;
    }
    if (!wait_gone(pid, asked ? 5 : 0) && ring_kvd_is(pid, dir_abs, r, pst.st_mtime, why, sizeof why) &&
        kill(pid, SIGTERM) == 0 && !wait_gone(pid, 5) &&
        ring_kvd_is(pid, dir_abs, r, pst.st_mtime, why, sizeof why)) {
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
    if (!pid || !pid_alive(pid))
        return 0;
    if (!kvd_pid_is(pid, dir_abs, NULL, pst.st_mtime, why, sizeof why)) {
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
    const char *dir = "ring", *v;
    for (int i = 1; i < argc; i++) {
        if ((v = dir_opt(argc, argv, &i)))   /* --dir DIR, or --ring DIR as status spells it */
            dir = v;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: kvctl ring down [--dir DIR]   stop the local ring started in DIR\n"
                   "  (--ring DIR is the same, as kvctl status spells it); DIR may be a kvd join\n"
                   "  node's state directory: the node stops and gives its lease back\n");
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
    for (uint32_t r = 0; r < MAX_STAGES; r++)
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
        return ring_up(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "down"))
        return ring_down(argc - 1, argv + 1);
    fprintf(stderr, "usage: kvctl ring up --model FILE --stages N [--dtype f32|f16] [--base-port P] [--dir DIR]\n"
                    "       kvctl ring down [--dir DIR]\n");
    return (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) ? 0 : 2;
}

/* --watch: a SIGINT ends the loop (after the block being printed), as a closed pipe does. */
static volatile sig_atomic_t status_stop;
static void status_on_sigint(int sig) { (void)sig; status_stop = 1; }

/* One status --json block: a status object per rank, one per line, then each standby's. */
static int print_view_json(const struct ring_view *v, FILE *out)
{
    int bad = 0;
    for (uint32_t r = 0; r < v->n; r++) {
        if (!v->rows[r]) {
            fprintf(out, "{\"rank\":%u,\"error\":\"unreachable\"}\n", r);
            bad = 1;
            continue;
        }
        bad |= v->down[r];
        char *t = cJSON_PrintUnformatted(v->rows[r]);
        fprintf(out, "%s\n", t ? t : "{}");
        free(t);
    }
    const cJSON *sbs = v->r0 ? cJSON_GetObjectItemCaseSensitive(v->r0, "standbys") : NULL;
    for (uint32_t i = 0; i < v->n_standbys; i++) {   /* a local ring's standby answers itself */
        char sock[PATH_MAX + 32], err[300];
        snprintf(sock, sizeof sock, "%s/standby-%u/kvd.sock", v->dir ? v->dir : "", i);
        cJSON *s = v->dir && access(sock, F_OK) == 0 ? query_status(sock, err, sizeof err) : NULL;
        if (v->dir && access(sock, F_OK) == 0 && !s) {
            fprintf(out, "{\"standby\":%u,\"error\":\"unreachable\"}\n", i);
            continue;
        }
        const cJSON *e = s ? s : cJSON_GetArrayItem(sbs, (int)i);
        char *t = e ? cJSON_PrintUnformatted(e) : NULL;
        if (t)
            fprintf(out, "%s\n", t);
        else
            fprintf(out, "{\"standby\":%u,\"error\":\"unreachable\"}\n", i);
        free(t);
        cJSON_Delete(s);
    }
    return bad;
}

/* A non-negative number of seconds (fractions allowed): 0, or -1. */
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
        if ((v = dir_opt(argc, argv, &i)))   /* --ring DIR, or --dir DIR as ring up/down spell it */
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
    struct ring_view rv;
    char err[KV_ERR_MAX];
    int rc = 0;
    if (!dir) {
        if (view_sock(&rv, o->arg + 5, err, sizeof err) < 0) {
            fprintf(stderr, "kvctl status: %s\n", err);
            rc = 1;
        }
    } else {
        view_dir(&rv, dir, m);
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
        rc = o->json ? print_view_json(&rv, stdout) : print_view(&rv, stdout) ? 1 : 0;
        if (o->watch && !o->json)
            printf("\n");
    }
    view_free(&rv);
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
    if (!via_sock && (ring_dir(o.arg, dir, sizeof dir) < 0 || load_ring_at(o.arg, dir, &m) < 0))
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

/* ---- generate --ring ---- */

struct gen_state {
    uint32_t n_done, resumed;
    bool ids, error, done;
    double t_first;
    const char *dump_logits;
    cJSON *done_obj;
};

static int gen_line(const char *line, void *ud)
{
    struct gen_state *g = ud;
    cJSON *o = cJSON_Parse(line);
    if (!o) {
        fprintf(stderr, "kvctl generate: unreadable reply from the ring: %.100s\n", line);
        g->error = true;
        return 1;
    }
    const cJSON *note = cJSON_GetObjectItemCaseSensitive(o, "note");
    if (cJSON_IsString(note)) {   /* the ring broke and was repaired: said here, not in the text */
        fprintf(stderr, "kvctl generate: %s\n", note->valuestring);
        if (!strncmp(note->valuestring, "resumed", 7))
            g->resumed++;
        cJSON_Delete(o);
        return 0;
    }
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, "error");
    if (cJSON_IsString(e)) {
        if (g->n_done)
            printf("\n");
        fflush(stdout);
        fprintf(stderr, "kvctl generate: ring error: %s\n", e->valuestring);
        g->error = true;
        cJSON_Delete(o);
        return 1;
    }
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "done"))) {
        const cJSON *tail = cJSON_GetObjectItemCaseSensitive(o, "s");
        if (cJSON_IsString(tail) && !g->ids)
            fputs(tail->valuestring, stdout);
        g->done = true;
        g->done_obj = o;
        return 1;
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "t");
    if (cJSON_IsNumber(t)) {
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "s");
        g->n_done++;
        if (g->n_done == 1)
            g->t_first = util_now_s();
        if (cJSON_IsString(s) && !g->ids)
            fputs(s->valuestring, stdout);
        else
            printf("%s%.0f", g->n_done > 1 ? " " : "", t->valuedouble);   /* no int cast of a peer's number */
        fflush(stdout);
    }
    cJSON_Delete(o);
    return 0;
}

static void gen_usage(FILE *f)
{
    fprintf(f,
        "usage: kvctl generate --ring DIR|ring.json|unix:SOCKET (-p TEXT | --tokens 1,2,3) [-n N]\n"
        "                      [sampling] [--ignore-eos] [--ids]\n"
        "  The options and output of the one-process generate (kvctl generate --help), through\n"
        "  a running ring: text on stdout, statistics on stderr. unix:SOCKET is rank 0's control\n"
        "  socket (STATE_DIR/kvd.sock on rank 0's host). -m, -t and --ctx are accepted and\n"
        "  ignored: the ring's manifest fixes them.\n"
        "  --dump-logits FILE  write the last position's logits (raw f32) to FILE\n"
        "  --stop S            stop when the text contains S (repeatable)\n"
        "  --client-key KEY    a market ring: the paying client the session is for (kvctl market\n"
        "                      client add), so the ring is credited for it\n"
        "  --draft lookup|none  prompt-lookup drafts: several tokens a ring pass, the same text\n"
        "                      (default: rank 0's kvd stage --draft, none unless set)\n"
        "  --draft-max K       drafts a pass verifies, 1..14 (default: rank 0's, 8)\n");
}

int kvctl_ring_generate(int argc, char **argv)
{
    enum { O_TOK = KVCTL_OPT_SAMPLING_END, O_CTX, O_IEOS, O_IDS, O_RING, O_DUMP, O_STOP, O_MODEL,
           O_CKEY, O_DRAFT, O_DRAFT_MAX };
    static const struct option opts[] = {
        {"ring", required_argument, 0, O_RING}, {"model", required_argument, 0, O_MODEL},
        {"draft", required_argument, 0, O_DRAFT}, {"draft-max", required_argument, 0, O_DRAFT_MAX},
        {"prompt", required_argument, 0, 'p'}, {"n-predict", required_argument, 0, 'n'},
        {"threads", required_argument, 0, 't'}, KVCTL_SAMPLING_OPTIONS,
        {"tokens", required_argument, 0, O_TOK}, {"ctx", required_argument, 0, O_CTX},
        {"ignore-eos", no_argument, 0, O_IEOS}, {"ids", no_argument, 0, O_IDS},
        {"dump-logits", required_argument, 0, O_DUMP}, {"stop", required_argument, 0, O_STOP},
        {"client-key", required_argument, 0, O_CKEY},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    const char *ring = NULL, *prompt = NULL, *toks = NULL, *dump = NULL, *ckey = NULL;
    long n_gen = 64, draft_max = 0;
    bool ignore_eos = false, ids = false;
    const char *draft = NULL;   /* not given: rank 0's --draft decides */
    struct model_sampler_params sp;
    model_sampler_params_default(&sp);
    const char *stops[MODEL_GEN_MAX_STOPS];
    uint32_t n_stops = 0;
    cJSON *req = cJSON_CreateObject();
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:p:n:t:h", opts, NULL)) != -1) {
        int rc = 0;
        switch (c) {
        case O_RING: ring = optarg; break;
        case 'm': case O_MODEL: break;   /* the ring holds the model */
        case 't': break;                 /* threads are the stages' business */
        case 'p': prompt = optarg; break;
        case 'n': rc = kvctl_parse_long("-n", optarg, 0, 1 << 20, &n_gen); break;
        case O_TOK: toks = optarg; break;
        case O_CTX: break;               /* the ring's context is in its manifest */
        case O_IEOS: ignore_eos = true; break;
        case O_IDS: ids = true; break;
        case O_DUMP: dump = optarg; break;
        case O_STOP: rc = kvctl_stop_add(optarg, stops, MODEL_GEN_MAX_STOPS, &n_stops); break;
        case O_CKEY: ckey = optarg; break;
        case O_DRAFT:
            if (model_draft_mode(optarg) < 0) {
                fprintf(stderr, "kvctl generate: --draft '%s': lookup or none\n", optarg);
                rc = -EINVAL;
            }
            draft = optarg;
            break;
        case O_DRAFT_MAX: rc = kvctl_parse_long("--draft-max", optarg, 1, MODEL_DRAFT_MAX, &draft_max); break;
        case 'h': gen_usage(stdout); cJSON_Delete(req); return 0;
        default:
            if ((rc = kvctl_sampling_opt(c, optarg, &sp)) > 0) {
                gen_usage(stderr);
                cJSON_Delete(req);
                return 2;
            }
        }
        if (rc < 0) {
            cJSON_Delete(req);
            return 2;
        }
    }
    if (!ring || (!prompt && !toks) || optind != argc) {
        gen_usage(stderr);
        cJSON_Delete(req);
        return 2;
    }
    if (kvctl_sampling_seed(&sp, "kvctl generate") < 0) {
        cJSON_Delete(req);
        return 2;
    }
    cJSON_AddStringToObject(req, "op", "generate");
    if (toks) {
        int32_t *t;
        uint32_t n;
        if (kvctl_parse_tokens(toks, 1u << 20, &t, &n) < 0) {
            cJSON_Delete(req);
            return 2;
        }
        cJSON *a = cJSON_AddArrayToObject(req, "tokens");
        for (uint32_t i = 0; i < n; i++)
            cJSON_AddItemToArray(a, cJSON_CreateNumber((double)t[i]));
        free(t);
    } else
        cJSON_AddStringToObject(req, "prompt", prompt);
    cJSON_AddNumberToObject(req, "n", (double)n_gen);
    cJSON_AddNumberToObject(req, "seed", (double)sp.seed);
    cJSON_AddNumberToObject(req, "temp", sp.temperature);
    cJSON_AddNumberToObject(req, "top_k", sp.top_k);
    cJSON_AddNumberToObject(req, "top_p", sp.top_p);
    cJSON_AddNumberToObject(req, "min_p", sp.min_p);
    cJSON_AddNumberToObject(req, "repeat_penalty", sp.repeat_penalty);
    cJSON_AddNumberToObject(req, "repeat_last_n", sp.penalty_last_n);
    cJSON_AddNumberToObject(req, "freq_penalty", sp.freq_penalty);
    cJSON_AddNumberToObject(req, "presence_penalty", sp.presence_penalty);
    cJSON_AddBoolToObject(req, "ignore_eos", ignore_eos);
    cJSON_AddBoolToObject(req, "logits", dump != NULL);
    if (ckey)
        cJSON_AddStringToObject(req, "client_key", ckey);
    if (draft)
        cJSON_AddStringToObject(req, "draft", draft);
    if (draft_max)
        cJSON_AddNumberToObject(req, "draft_max", (double)draft_max);
    cJSON *stop = cJSON_AddArrayToObject(req, "stop");
    for (uint32_t i = 0; i < n_stops; i++)
        cJSON_AddItemToArray(stop, cJSON_CreateString(stops[i]));
    if (sp.seed > (1ull << 53))
        fprintf(stderr, "kvctl generate: warning: --seed above 2^53 loses precision in the request\n");
    char *line = cJSON_PrintUnformatted(req);
    cJSON_Delete(req);
    char sock[PATH_MAX];
    if (!strncmp(ring, "unix:", 5))
        snprintf(sock, sizeof sock, "%s", ring + 5);
    else {
        char dir[PATH_MAX];
        if (ring_dir(ring, dir, sizeof dir) < 0) {
            free(line);
            return 1;
        }
        rank_sock(dir, 0, sock, sizeof sock);
    }
    struct gen_state g = {.ids = ids, .dump_logits = dump};
    char err[KV_ERR_MAX];
    double t0 = util_now_s();
    int rc = ring_ctl_request(sock, line, gen_line, &g, 120000, err, sizeof err);
    free(line);
    if (rc < 0) {
        fprintf(stderr, "kvctl generate: %s\n", err);
        return 1;
    }
    if (g.error)
        return 1;
    if (!g.done) {
        if (g.n_done)
            printf("\n");
        /* rank 0 holds every session's history: when its stream ends without "done" it is
         * gone (killed, crashed, stopped), and so is the session; no repair brings it back */
        fprintf(stderr, "kvctl generate: the ring closed the stream before the end: rank 0 (%s) died or "
                "stopped; the session's history lived there, so it cannot resume\n", sock);
        return 1;
    }
    printf("\n");
    fflush(stdout);   /* the text, then the statistics */
    double t2 = util_now_s();
    double pms = util_json_number(g.done_obj, "prompt_ms", 0) / 1e3;
    double gms = util_json_number(g.done_obj, "gen_ms", 0) / 1e3;
    uint32_t n_prompt = (uint32_t)util_json_number(g.done_obj, "n_prompt", 0);
    uint32_t n_gen_done = (uint32_t)util_json_number(g.done_obj, "n_gen", 0);
    (void)t0;
    (void)t2;
    /* Same statistics line as the one-process generate (token counts as it counts them). */
    fprintf(stderr, "prompt: %u tokens in %.3f s (%.2f tok/s); generation: %u tokens in %.3f s "
            "(%.2f tok/s)\n", n_prompt, pms, pms > 0 ? n_prompt / pms : 0.0, n_gen_done, gms,
            gms > 0 && n_gen_done > 1 ? (n_gen_done - 1) / gms : 0.0);
    /* drafting: as the one-process generate reports it, the passes being ring passes */
    double passes = util_json_number(g.done_obj, "passes", 0);
    double proposed = util_json_number(g.done_obj, "drafts", 0);
    if (proposed > 0)
        fprintf(stderr, "drafts: %.0f proposed, %.0f accepted; %.0f passes for %u tokens (%.2f "
                "tokens a pass)\n", proposed, util_json_number(g.done_obj, "drafts_accepted", 0),
                passes, n_gen_done, passes > 0 ? n_gen_done / passes : 0.0);
    if (g.resumed)
        fprintf(stderr, "kvctl generate: resumed %u time%s after the ring was repaired; the text is "
                "the uninterrupted one\n", g.resumed, g.resumed == 1 ? "" : "s");
    const cJSON *why = cJSON_GetObjectItemCaseSensitive(g.done_obj, "reason");
    if (cJSON_IsString(why) && !strcmp(why->valuestring, "context"))
        fprintf(stderr, "kvctl generate: stopped at the context length: %u prompt + %u generated "
                "tokens (the ring's ctx)\n", n_prompt, n_gen_done);
    int ret = 0;
    if (dump) {   /* as the one-process generate writes them */
        const cJSON *lg = cJSON_GetObjectItemCaseSensitive(g.done_obj, "logits");
        int n = cJSON_IsArray(lg) ? cJSON_GetArraySize(lg) : 0;
        float *v = n > 0 ? malloc((size_t)n * sizeof *v) : NULL;
        if (v) {
            int i = 0;
            for (const cJSON *x = lg->child; x && i < n; x = x->next)
                v[i++] = (float)x->valuedouble;
        }
        if (kvctl_dump_logits(dump, v, v ? (size_t)n : 0) < 0)
            ret = 1;
        free(v);
    }
    cJSON_Delete(g.done_obj);
    return ret;
}

/* listen.c — where a listening TCP socket comes from: one handed over by whoever started the
 * process (systemd's socket activation, `kvctl ring up`, the test suite's launcher), or a
 * fresh bind.
 *
 * The hand-over is systemd's protocol (sd_listen_fds(3)): LISTEN_PID names this process,
 * LISTEN_FDS counts the sockets, which are fds 3, 4, ... A listener whose address is exactly
 * the address of one of them takes it instead of binding: the starter chose and bound the
 * port (port 0 gives a free one with no window in which another program can take it) and
 * wrote it where the peers read it, and the daemon's configuration stays the one that names
 * that address. The protocol is read here rather than through libsystemd's sd_listen_fds,
 * because libsystemd is optional (builds for phones and the arm64 cross-build go without). */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net/internal.h"
#include "net/net.h"

#define FD_FIRST 3
#define FDS_MAX 64 /* more than any kvd role listens on; the rest are left alone */

static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int n_fds;
static bool taken[FDS_MAX];

/* A decimal number of at most 9 digits, or -1. */
static long env_num(const char *name)
{
    const char *s = getenv(name);
    if (!s || !*s || strlen(s) > 9)
        return -1;
    for (const char *p = s; *p; p++)
        if (*p < '0' || *p > '9')
            return -1;
    return strtol(s, NULL, 10);
}

static void read_env(void)
{
    long pid = env_num("LISTEN_PID"), n = env_num("LISTEN_FDS");
    /* the variables are meant for this process only: children started later must not take
     * them for theirs */
    unsetenv("LISTEN_PID");
    unsetenv("LISTEN_FDS");
    unsetenv("LISTEN_FDNAMES");
    if (pid != (long)getpid() || n <= 0)
        return;
    n_fds = n > FDS_MAX ? FDS_MAX : (int)n;
    for (int i = 0; i < n_fds; i++) {
        int fl = fcntl(FD_FIRST + i, F_GETFD);
        if (fl < 0)
            taken[i] = true; /* not open: nothing to take */
        else
            (void)fcntl(FD_FIRST + i, F_SETFD, fl | FD_CLOEXEC);
    }
}

/* Whether fd is a listening TCP socket bound to exactly *want (family, address, port). */
static bool fd_matches(int fd, const struct sockaddr_storage *want)
{
    int type = 0, acc = 0;
    socklen_t len = sizeof type;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM)
        return false;
    len = sizeof acc;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &len) != 0 || !acc)
        return false;
    struct sockaddr_storage ss;
    len = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0 || ss.ss_family != want->ss_family)
        return false;
    if (ss.ss_family == AF_INET) {
        const struct sockaddr_in *a = (const void *)&ss, *b = (const void *)want;
        return a->sin_port == b->sin_port && a->sin_addr.s_addr == b->sin_addr.s_addr;
    }
    if (ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const void *)&ss, *b = (const void *)want;
        return a->sin6_port == b->sin6_port &&
               memcmp(&a->sin6_addr, &b->sin6_addr, sizeof a->sin6_addr) == 0;
    }
    return false;
}

void net_listen_inherit(void)
{
    pthread_once(&once, read_env);
}

int net__listen_tcp(uv_tcp_t *tcp, const struct sockaddr_storage *ss)
{
    net_listen_inherit();
    int fd = -1;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < n_fds && fd < 0; i++) {
        if (!taken[i] && fd_matches(FD_FIRST + i, ss)) {
            taken[i] = true;
            fd = FD_FIRST + i;
        }
    }
    pthread_mutex_unlock(&mu);
    if (fd < 0)
        return uv_tcp_bind(tcp, (const struct sockaddr *)ss, 0);
    int rc = uv_tcp_open(tcp, fd);
    if (rc < 0)
        close(fd);
    return rc;
}

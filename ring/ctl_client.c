/* ctl_client.c — the client side of a stage's control socket (used by kvctl): one request
 * line out, reply lines in, with a timeout on silence. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "ring/ring.h"
#include "util/util.h"

int ring_ctl_request(const char *sock_path, const char *request, ring_ctl_line_cb on_line, void *ud,
                    int timeout_ms, char *err, size_t errlen)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(sock_path) >= sizeof sa.sun_path) {
        snprintf(err, errlen, "control socket path too long: %s", sock_path);
        return -ENAMETOOLONG;
    }
    strcpy(sa.sun_path, sock_path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return -errno;
    }
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        int e = errno;
        snprintf(err, errlen, "cannot reach the daemon at %s: %s", sock_path, strerror(e));
        close(fd);
        return -e;
    }
    size_t rl = strlen(request);
    char *req = malloc(rl + 2);
    if (!req) {
        close(fd);
        return -ENOMEM;
    }
    memcpy(req, request, rl);
    req[rl] = '\n';
    size_t off = 0;
    while (off < rl + 1) {
        ssize_t w = send(fd, req + off, rl + 1 - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            int e = errno;
            snprintf(err, errlen, "sending the request: %s", strerror(e));
            free(req);
            close(fd);
            return -e;
        }
        off += (size_t)w;
    }
    free(req);
    /* the reply's lines: 64 KiB of room to start with, doubling, a line of 64 MiB refused */
    struct util_buf b = {0};
    int rc = util_buf_reserve(&b, 65535, 65535);
    while (rc == 0) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int pr = poll(&p, 1, timeout_ms);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr == 0) {
            snprintf(err, errlen, "no reply from the daemon for %d ms", timeout_ms);
            rc = -ETIMEDOUT;
            break;
        }
        if (b.len == b.cap && (rc = util_buf_reserve(&b, 1, (64u << 20) - 1)) < 0) {
            if (rc == -E2BIG) {
                snprintf(err, errlen, "reply line longer than 64 MiB");
                rc = -EMSGSIZE;
            }
            break;
        }
        ssize_t n = recv(fd, b.p + b.len, b.cap - b.len, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n < 0) {
                snprintf(err, errlen, "reading the reply: %s", strerror(errno));
                rc = -EIO;
            }
            break;   /* daemon closed: done */
        }
        b.len += (size_t)n;
        b.p[b.len] = 0;
        char *start = b.s, *nl;
        int stop = 0;
        while ((nl = strchr(start, '\n'))) {
            *nl = 0;
            if ((stop = on_line(start, ud)) != 0)
                break;
            start = nl + 1;
        }
        if (stop)
            break;
        util_buf_consume(&b, (size_t)(start - b.s));
    }
    util_buf_free(&b);
    close(fd);
    return rc;
}

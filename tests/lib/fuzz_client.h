/* fuzz_client.h — the HTTP fuzz targets' client: one loopback connection to a server that runs
 * on the target's own loop (run between the client's steps, so one thread does both). */
#ifndef KV_TESTS_FUZZ_CLIENT_H
#define KV_TESTS_FUZZ_CLIENT_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <uv.h>

#include "util/util.h"

/* Send data in pieces of piece bytes, half-close (at once when half_close, else after a
 * second without the server's close, as a client giving up), and read until the server
 * closes. The answer's first cap bytes go to resp (NULL: none kept); returns how many. The
 * server must answer or close within 5 s: abort() otherwise, naming who. */
static inline size_t fuzz_client_drive(uv_loop_t *loop, int port, const void *data, size_t size,
                                       size_t piece, bool half_close, char *resp, size_t cap,
                                       const char *who)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    /* A client that closes first leaves its port in TIME_WAIT for a minute; thousands of runs
     * would hold much of the ephemeral range against listeners of tests running beside, unless
     * (SO_REUSEADDR on both sides) those may bind over it. */
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || (connect(fd, (struct sockaddr *)&a, sizeof a) != 0 && errno != EINPROGRESS))
        abort();
    size_t sent = 0, got = 0;
    bool shut = false, eof = false;
    double t0 = util_now_s();
    while (!eof) {
        uv_run(loop, UV_RUN_NOWAIT);
        if (sent < size) {
            size_t n = size - sent < piece ? size - sent : piece;
            ssize_t k = send(fd, (const char *)data + sent, n, MSG_NOSIGNAL);
            if (k > 0)
                sent += (size_t)k;
            else if (k < 0 && errno != EAGAIN && errno != ENOTCONN)
                sent = size;   /* the server closed on us: stop sending */
        } else if (!shut && (half_close || util_now_s() - t0 > 1)) {
            shutdown(fd, SHUT_WR);
            shut = true;
        }
        for (;;) {
            char buf[16384];
            ssize_t k = recv(fd, buf, sizeof buf, 0);
            if (k > 0) {
                size_t m = resp && got < cap ? ((size_t)k < cap - got ? (size_t)k : cap - got) : 0;
                if (m) {
                    memcpy(resp + got, buf, m);
                    got += m;
                }
                continue;
            }
            if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
                eof = true;
            break;
        }
        if (!eof) {
            struct pollfd p = {fd, POLLIN, 0};
            poll(&p, 1, 1);
        }
        if (util_now_s() - t0 > 5) {
            fprintf(stderr, "%s: the server neither answered nor closed in 5 s\n", who);
            abort();
        }
    }
    close(fd);
    return got;
}

/* Check an answer fuzz_client_drive kept: an HTTP answer (or nothing: the client's EOF came
 * first), and a body typed application/json that is all there is one JSON document; with
 * all_json every answer with a length must be typed so. Returns the status (0: no answer);
 * abort() otherwise, naming who. */
static inline int fuzz_client_answer(const char *resp, size_t n, bool all_json, const char *who)
{
    if (n == 0)
        return 0;
    if (n < 12 || memcmp(resp, "HTTP/1.1 ", 9) != 0) {
        fprintf(stderr, "%s: not an HTTP answer: %.40s\n", who, resp);
        abort();
    }
    int status = atoi(resp + 9);
    const char *end = memmem(resp, n, "\r\n\r\n", 4);
    const char *cl = end ? memmem(resp, (size_t)(end - resp), "Content-Length: ", 16) : NULL;
    if (!cl)
        return status;   /* cut by the client's EOF, or streamed */
    if (!memmem(resp, (size_t)(end - resp), "Content-Type: application/json", 30)) {
        if (all_json) {
            fprintf(stderr, "%s: an answer not typed JSON: %.*s\n", who, (int)(n < 300 ? n : 300), resp);
            abort();
        }
        return status;
    }
    size_t want = strtoul(cl + 16, NULL, 10), have = n - (size_t)(end + 4 - resp);
    if (have < want)
        return status;   /* cut short */
    cJSON *j = cJSON_ParseWithLength(end + 4, want);
    if (!j) {
        fprintf(stderr, "%s: an answer is not JSON: %.*s\n", who, (int)(want < 300 ? want : 300), end + 4);
        abort();
    }
    cJSON_Delete(j);
    return status;
}

/* Run the loop until pending(ud) is false: abort() after 5 s, saying what was left. */
static inline void fuzz_client_settle(uv_loop_t *loop, bool (*pending)(void *), void *ud,
                                      const char *who, const char *what)
{
    double t0 = util_now_s();
    while (pending(ud)) {
        uv_run(loop, UV_RUN_NOWAIT);
        usleep(100);
        if (util_now_s() - t0 > 5) {
            fprintf(stderr, "%s: %s\n", who, what);
            abort();
        }
    }
}

#endif

/* The relay's bridge semantics with a raw client: pairing by id and opposite roles, messages
 * forwarded unchanged and in order both ways, refusals with their close codes, every limit
 * (partner wait, idle time with and without pongs, message size, bridges in total, per
 * source address), partner-gone, backpressure with bounded memory, status and metrics. */
#include <fcntl.h>

#include "tests/lib/ws_tc.h"

static uint8_t pattern(uint32_t seq, size_t i)
{
    return (uint8_t)(seq * 131u + i * 7u + (i >> 8));
}

T_CASE(pair_and_forward_both_ways)
{
    struct tc_relay R;
    struct kvd_relay_config cfg = {.plain = true};
    T_ASSERT(tc_relay_start(&R, &cfg) == 0, "relay start");
    char id[33];
    tc_bridge_id(id);
    int up = tc_open(R.port, id), down = tc_open(R.port, id);
    T_ASSERT(up >= 0 && down >= 0, "upgrade");
    tc_send(down, 2, "\x02", 1);
    tc_send(up, 2, "\x01", 1);
    /* sizes across the 7-bit, 16-bit and 64-bit length forms */
    static const size_t sizes[] = {0, 1, 125, 126, 127, 65535, 65536, 200000};
    uint8_t *buf = malloc(200000);
    for (int dir = 0; dir < 2; dir++) {
        int src = dir ? down : up, dst = dir ? up : down;
        for (uint32_t k = 0; k < 8; k++) {
            for (size_t i = 0; i < sizes[k]; i++)
                buf[i] = pattern(k + 10 * (uint32_t)dir, i);
            tc_send(src, 2, buf, sizes[k]);
        }
        for (uint32_t k = 0; k < 8; k++) {
            uint8_t *d;
            size_t n;
            int op = tc_recv_msg(dst, &d, &n);
            T_CHECK(op == 2, "dir %d msg %u: opcode %d", dir, k, op);
            T_CHECK(n == sizes[k], "dir %d msg %u: %zu bytes, sent %zu (reordered or cut)", dir, k, n, sizes[k]);
            bool same = n == sizes[k];
            for (size_t i = 0; same && i < n; i++)
                same = d[i] == pattern(k + 10 * (uint32_t)dir, i);
            T_CHECK(same, "dir %d msg %u: payload changed", dir, k);
            free(d);
        }
    }
    free(buf);
    struct kvd_relay_stats st = tc_relay_stats(&R);
    T_CHECK(st.paired == 1 && st.bridges == 1 && st.connections == 2,
            "stats paired %llu bridges %llu conns %llu", (unsigned long long)st.paired,
            (unsigned long long)st.bridges, (unsigned long long)st.connections);
    T_CHECK(st.messages_total == 16, "messages_total %llu", (unsigned long long)st.messages_total);

    /* status JSON and metrics reflect it */
    int fd = tc_connect(R.port);
    char resp[4096];
    T_CHECK(tc_http(fd, "GET /v1/relay/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", resp, sizeof resp) == 200, "status");
    char body[2048] = {0};
    ssize_t n = recv(fd, body, sizeof body - 1, MSG_WAITALL);
    T_CHECK(n > 0 && strstr(body, "\"paired\":1") && strstr(body, "\"connections\":2"), "status body: %s", body);
    close(fd);
    fd = tc_connect(R.port);
    T_CHECK(tc_http(fd, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", resp, sizeof resp) == 200, "metrics");
    char *mb = calloc(1, 8192);
    n = recv(fd, mb, 8191, MSG_WAITALL);
    T_CHECK(n > 0 && strstr(mb, "kvasir_relay_bridges{state=\"paired\"} 1\n") &&
            strstr(mb, "# TYPE kvasir_relay_messages_total counter\nkvasir_relay_messages_total 16\n"),
            "metrics body: %s", mb);
    free(mb);
    close(fd);

    /* one end drops -> the other is closed with 4002 and a reason */
    close(up);
    char reason[128];
    int code = tc_expect_close(down, reason, sizeof reason);
    T_CHECK(code == NET_WS_CODE_PARTNER_GONE && strstr(reason, "partner gone"),
            "after upstream dropped: %d %s", code, reason);
    close(down);
    /* the bridge is gone: the id can be used again */
    up = tc_open(R.port, id);
    down = tc_open(R.port, id);
    tc_send(up, 2, "\x01", 1);
    tc_send(down, 2, "\x02", 1);
    tc_send(up, 2, "again", 5);
    uint8_t *d;
    size_t dn;
    T_CHECK(tc_recv_msg(down, &d, &dn) == 2 && dn == 5 && !memcmp(d, "again", 5), "bridge id reused");
    free(d);
    close(up);
    close(down);
    T_CHECK(tc_relay_stop(&R) == 0, "relay loop left handles");
}

T_CASE(duplicate_and_bad_roles)
{
    struct tc_relay R;
    struct kvd_relay_config cfg = {.plain = true};
    T_ASSERT(tc_relay_start(&R, &cfg) == 0, "relay start");
    char id[33], reason[128];
    tc_bridge_id(id);
    int a = tc_open(R.port, id), b = tc_open(R.port, id);
    tc_send(a, 2, "\x01", 1);
    usleep(50000);
    tc_send(b, 2, "\x01", 1);
    int code = tc_expect_close(b, reason, sizeof reason);
    T_CHECK(code == NET_WS_CODE_DUP_ROLE && strstr(reason, "upstream"), "dup role: %d %s", code, reason);
    /* the first end is unaffected and still pairs */
    int c = tc_open(R.port, id);
    tc_send(c, 2, "\x02", 1);
    tc_send(c, 2, "hi", 2);
    uint8_t *d;
    size_t n;
    T_CHECK(tc_recv_msg(a, &d, &n) == 2 && n == 2, "first end still pairs");
    free(d);
    close(a);
    close(b);
    close(c);
    int e = tc_open(R.port, "0123456789ABCDEF0123456789ABCDEF");
    code = tc_expect_close(e, reason, sizeof reason);
    T_CHECK(code == NET_WS_CODE_BAD_BRIDGE && strstr(reason, "hex"), "uppercase id: %d %s", code, reason);
    close(e);
    struct kvd_relay_stats st = tc_relay_stats(&R);
    T_CHECK(st.refused_dup_role == 1 && st.refused_bad_bridge == 1, "refusal counters %llu %llu",
            (unsigned long long)st.refused_dup_role, (unsigned long long)st.refused_bad_bridge);
    T_CHECK(tc_relay_stop(&R) == 0, "relay loop left handles");
}

T_CASE(partner_wait_limit)
{
    struct tc_relay R;
    struct kvd_relay_config cfg = {.plain = true, .pair_timeout_ms = 300};
    T_ASSERT(tc_relay_start(&R, &cfg) == 0, "relay start");
    char id[33], reason[128];
    tc_bridge_id(id);
    int a = tc_open(R.port, id);
    uint64_t t0 = tc_now_ms();
    tc_send(a, 2, "\x02", 1);
    int code = tc_expect_close(a, reason, sizeof reason);
    uint64_t dt = tc_now_ms() - t0;
    T_CHECK(code == NET_WS_CODE_PARTNER_TIMEOUT && strstr(reason, "no partner"), "wait: %d %s", code, reason);
    T_CHECK(dt >= 250 && dt < 2000, "closed after %llu ms, limit 300", (unsigned long long)dt);
    close(a);
    /* no role at all */
    a = tc_open(R.port, id);
    code = tc_expect_close(a, reason, sizeof reason);
    T_CHECK(code == NET_WS_CODE_PARTNER_TIMEOUT && strstr(reason, "role"), "no role: %d %s", code, reason);
    close(a);
    T_CHECK(tc_relay_stop(&R) == 0, "relay loop left handles");
}

T_CASE(idle_limit_and_pings)
{
    struct tc_relay R;
    struct kvd_relay_config cfg = {.plain = true, .idle_timeout_ms = 800, .ping_interval_ms = 100};
    T_ASSERT(tc_relay_start(&R, &cfg) == 0, "relay start");
    char ida[33], idb[33], reason[128];
    tc_bridge_id(ida);
    tc_bridge_id(idb);
    /* bridge A: both ends answer pings for 2.5x the idle limit and must stay;
     * bridge B: upstream silent (closed 4008), downstream answers (closed 4002) */
    int fd[4] = {tc_open(R.port, ida), tc_open(R.port, ida), tc_open(R.port, idb), tc_open(R.port, idb)};
    tc_send(fd[0], 2, "\x01", 1);
    tc_send(fd[1], 2, "\x02", 1);
    tc_send(fd[2], 2, "\x01", 1);
    tc_send(fd[3], 2, "\x02", 1);
    uint64_t t0 = tc_now_ms();
    int pings[4] = {0}, closes[4] = {0};
    char b_reason[128] = "";
    while (tc_now_ms() - t0 < 2000) {
        struct pollfd p[3] = {{.fd = fd[0], .events = POLLIN}, {.fd = fd[1], .events = POLLIN},
                              {.fd = fd[3], .events = POLLIN}};
        if (poll(p, 3, 50) <= 0)
            continue;
        for (int i = 0; i < 3; i++) {
            int k = i == 2 ? 3 : i;
            if (!(p[i].revents & POLLIN) || closes[k])
                continue;
            uint8_t *d;
            size_t n;
            int op = tc_recv(fd[k], &d, &n, NULL);
            if (op == 9) {
                pings[k]++;
                tc_send(fd[k], 0xa, d, n);
            } else if (op == 8 || op < 0) {
                closes[k] = op == 8 && n >= 2 ? (d[0] << 8 | d[1]) : -1;
                if (k == 3 && n > 2)
                    snprintf(b_reason, sizeof b_reason, "%.*s", (int)(n - 2), (char *)d + 2);
                if (op == 8)
                    tc_send(fd[k], 8, d, n >= 2 ? 2 : 0);
            }
            free(d);
        }
    }
    if (!closes[3])   /* a relay running late closes bridge B after the 2 s watched above */
        closes[3] = tc_expect_close(fd[3], b_reason, sizeof b_reason);
    T_CHECK(pings[0] >= 8 && pings[1] >= 8, "pings seen %d %d in 2 s at a 100 ms interval", pings[0], pings[1]);
    T_CHECK(!closes[0] && !closes[1], "ends that answer pings were closed (%d %d) within 3x the idle limit",
            closes[0], closes[1]);
    int code = tc_expect_close(fd[2], reason, sizeof reason);
    T_CHECK(code == NET_WS_CODE_IDLE && strstr(reason, "idle"), "silent end: %d %s", code, reason);
    T_CHECK(closes[3] == NET_WS_CODE_PARTNER_GONE && strstr(b_reason, "4008"), "partner of the idle end: %d %s",
            closes[3], b_reason);
    for (int i = 0; i < 4; i++)
        close(fd[i]);
    struct kvd_relay_stats st = tc_relay_stats(&R);
    T_CHECK(st.timeouts_idle == 1, "idle timeouts %llu", (unsigned long long)st.timeouts_idle);
    T_CHECK(tc_relay_stop(&R) == 0, "relay loop left handles");
}

T_CASE(bridge_and_address_limits)
{
    struct tc_relay R;
    struct kvd_relay_config cfg = {.plain = true, .max_bridges = 2, .max_per_addr = 5};
    T_ASSERT(tc_relay_start(&R, &cfg) == 0, "relay start");
    char ids[3][33], reason[128];
    int fds[6];
    for (int i = 0; i < 3; i++)
        tc_bridge_id(ids[i]);
    fds[0] = tc_open(R.port, ids[0]);
    tc_send(fds[0], 2, "\x01", 1);
    fds[1] = tc_open(R.port, ids[1]);
    tc_send(fds[1], 2, "\x01", 1);
    usleep(50000);
    fds[2] = tc_open(R.port, ids[2]); /* a third bridge */
    int code = tc_expect_close(fds[2], reason, sizeof reason);
    T_CHECK(code == NET_WS_CODE_TRY_LATER && strstr(reason, "relay full"), "3rd bridge: %d %s", code, reason);
    close(fds[2]);
    /* joining an existing bridge is not a new bridge */
    fds[2] = tc_open(R.port, ids[0]);
    tc_send(fds[2], 2, "\x02", 1);
    tc_send(fds[2], 2, "x", 1);
    uint8_t *d;
    size_t n;
    T_CHECK(tc_recv_msg(fds[0], &d, &n) == 2 && n == 1, "second end of bridge 0 accepted");
    free(d);
    fds[3] = tc_open(R.port, ids[1]);
    fds[4] = tc_open(R.port, ids[1]); /* 5th connection from 127.0.0.1: allowed */
    usleep(50000);
    fds[5] = tc_open(R.port, ids[1]); /* 6th: over max_per_addr */
    code = tc_expect_close(fds[5], reason, sizeof reason);
    T_CHECK(code == NET_WS_CODE_TRY_LATER && strstr(reason, "127.0.0.1"), "6th conn: %d %s", code, reason);
    for (int i = 0; i < 6; i++)
        close(fds[i]);
    T_CHECK(tc_relay_stop(&R) == 0, "relay loop left handles");
}

T_CASE(message_size_limit)
{
    struct tc_relay R;
    struct kvd_relay_config cfg = {.plain = true, .max_msg_bytes = 100000};
    T_ASSERT(tc_relay_start(&R, &cfg) == 0, "relay start");
    char id[33], reason[128];
    tc_bridge_id(id);
    int up = tc_open(R.port, id), down = tc_open(R.port, id);
    tc_send(up, 2, "\x01", 1);
    tc_send(down, 2, "\x02", 1);
    uint8_t *big = calloc(1, 100001);
    tc_send(up, 2, big, 100000); /* at the limit: forwarded */
    uint8_t *d;
    size_t n;
    T_CHECK(tc_recv_msg(down, &d, &n) == 2 && n == 100000, "100000-byte message at the limit: %zu", n);
    free(d);
    tc_send(up, 2, big, 100001);
    int code = tc_expect_close(up, reason, sizeof reason);
    T_CHECK(code == NET_WS_CODE_TOO_BIG, "over the limit: %d %s", code, reason);
    code = tc_expect_close(down, reason, sizeof reason);
    T_CHECK(code == NET_WS_CODE_PARTNER_GONE, "partner of the oversize sender: %d %s", code, reason);
    free(big);
    close(up);
    close(down);
    T_CHECK(tc_relay_stop(&R) == 0, "relay loop left handles");
}

struct writer {
    int fd;
    const uint8_t *p;
    size_t n;
};

static void *write_rest(void *arg)
{
    struct writer *w = arg;
    tc_write_all(w->fd, w->p, w->n);
    return NULL;
}

/* A receiver that does not read: the sender must be held back by TCP, the relay must not
 * buffer the stream; once the receiver reads, everything arrives in order. */
T_CASE(backpressure_bounds_memory)
{
    struct tc_relay R;
    struct kvd_relay_config cfg = {.plain = true, .high_water = 256 * 1024, .max_msg_bytes = 1 << 20};
    T_ASSERT(tc_relay_start(&R, &cfg) == 0, "relay start");
    char id[33];
    tc_bridge_id(id);
    int up = tc_open(R.port, id), down = tc_open(R.port, id);
    tc_send(up, 2, "\x01", 1);
    tc_send(down, 2, "\x02", 1);
    int rcv = 64 * 1024;
    setsockopt(down, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof rcv);
    usleep(50000);
    int fl = fcntl(up, F_GETFL);
    fcntl(up, F_SETFL, fl | O_NONBLOCK);
    enum { MSG = 16384 };
    uint8_t frame[MSG + 14];
    uint32_t sent_msgs = 0;
    size_t sent_bytes = 0;
    uint64_t last_progress = tc_now_ms();
    /* push until the sender has been blocked for 300 ms, at most 64 MB */
    uint8_t *pending = NULL;
    size_t pend_len = 0, pend_off = 0;
    while (tc_now_ms() - last_progress < 300 && sent_bytes < (64u << 20)) {
        if (pend_off == pend_len) {
            uint8_t msg[MSG];
            for (size_t i = 0; i < MSG; i++)
                msg[i] = pattern(sent_msgs, i);
            /* masked binary frame, 16-bit length */
            frame[0] = 0x82;
            frame[1] = 0x80 | 126;
            frame[2] = MSG >> 8;
            frame[3] = MSG & 0xff;
            memset(frame + 4, 0, 4); /* zero mask key: payload unchanged */
            memcpy(frame + 8, msg, MSG);
            pending = frame;
            pend_len = MSG + 8;
            pend_off = 0;
            sent_msgs++;
        }
        ssize_t w = send(up, pending + pend_off, pend_len - pend_off, MSG_NOSIGNAL);
        if (w > 0) {
            pend_off += (size_t)w;
            sent_bytes += (size_t)w;
            last_progress = tc_now_ms();
        } else {
            usleep(2000);
        }
    }
    struct kvd_relay_stats st = tc_relay_stats(&R);
    /* what the relay itself holds: under high water + one message + one read batch */
    T_CHECK(st.queued_bytes + st.held_bytes <= 256 * 1024 + MSG + 64 * 1024 + 4096,
            "relay queues %llu bytes toward a non-reading end (high water 256 KiB)",
            (unsigned long long)st.queued_bytes);
    T_CHECK(st.queued_bytes >= 64 * 1024, "relay queue %llu: the receiver was never backed up",
            (unsigned long long)st.queued_bytes);
    T_CHECK(sent_bytes < (24u << 20), "sender pushed %zu bytes into a non-reading receiver: no backpressure",
            sent_bytes);
    /* finish the partial frame, then read everything in order */
    fcntl(up, F_SETFL, fl);
    pthread_t wt;
    struct writer w = {up, pending + pend_off, pend_len - pend_off};
    pthread_create(&wt, NULL, write_rest, &w); /* blocks until the receiver reads */
    bool ok = true;
    for (uint32_t k = 0; k < sent_msgs && ok; k++) {
        uint8_t *d;
        size_t n;
        int op = tc_recv_msg(down, &d, &n);
        ok = op == 2 && n == MSG;
        for (size_t i = 0; ok && i < n; i++)
            ok = d[i] == pattern(k, i);
        T_CHECK(ok, "message %u of %u lost, cut or reordered (op %d, %zu bytes)", k, sent_msgs, op, n);
        free(d);
    }
    pthread_join(wt, NULL);
    fprintf(stderr, "backpressure: sender blocked after %zu bytes (%u messages)\n", sent_bytes, sent_msgs);
    close(up);
    close(down);
    T_CHECK(tc_relay_stop(&R) == 0, "relay loop left handles");
}

T_CASE(held_messages_bounded_before_pairing)
{
    struct tc_relay R;
    struct kvd_relay_config cfg = {.plain = true, .high_water = 128 * 1024, .pair_timeout_ms = 500};
    T_ASSERT(tc_relay_start(&R, &cfg) == 0, "relay start");
    char id[33];
    tc_bridge_id(id);
    int up = tc_open(R.port, id);
    tc_send(up, 2, "\x01", 1);
    int fl = fcntl(up, F_GETFL);
    fcntl(up, F_SETFL, fl | O_NONBLOCK);
    uint8_t *msg = calloc(1, 8192 + 8);
    msg[0] = 0x82;
    msg[1] = 0x80 | 126;
    msg[2] = 8192 >> 8;
    msg[3] = 0;
    size_t sent = 0;
    for (int i = 0; i < 4000; i++) {
        ssize_t w = send(up, msg, 8200, MSG_NOSIGNAL);
        if (w < 8200)
            break; /* a cut frame is fine: nothing more is sent */
        sent += 8192;
    }
    /* the most it holds, watched until it reaches its high water or the pair timeout (500 ms)
     * reclaims the end (or 5 s) */
    struct kvd_relay_stats st;
    uint64_t most = 0;
    for (int i = 0; i < 200; i++) {
        st = tc_relay_stats(&R);
        most = st.held_bytes > most ? st.held_bytes : most;
        if (most >= 128 * 1024 || !st.bridges)
            break;
        usleep(25000);
    }
    T_CHECK(most <= 128 * 1024 + 8192, "relay holds %llu bytes for an unpaired end (high water 128 KiB)",
            (unsigned long long)most);
    T_CHECK(most > 0, "nothing held although %zu bytes were sent", sent);
    free(msg);
    close(up); /* a paused end is not read: the partner wait limit reclaims it */
    st = tc_relay_stats(&R);
    for (int i = 0; i < 200 && (st.held_bytes || st.bridges); i++) {
        usleep(25000);
        st = tc_relay_stats(&R);
    }
    T_CHECK(st.held_bytes == 0 && st.bridges == 0, "after close: held %llu bridges %llu",
            (unsigned long long)st.held_bytes, (unsigned long long)st.bridges);
    T_CHECK(tc_relay_stop(&R) == 0, "relay loop left handles");
}

int main(int argc, char **argv)
{
    t_init(argc, argv);
    srand((unsigned)getpid());
    T_RUN(pair_and_forward_both_ways);
    T_RUN(duplicate_and_bad_roles);
    T_RUN(partner_wait_limit);
    T_RUN(idle_limit_and_pings);
    T_RUN(bridge_and_address_limits);
    T_RUN(message_size_limit);
    T_RUN(backpressure_bounds_memory);
    T_RUN(held_messages_bounded_before_pairing);
    return T_DONE();
}

/* tool-ring-peer — a scriptable ring peer for hostile-peer tests: connects to a stage as
 * if it were its predecessor, runs the real handshake (or breaks it on purpose), then sends
 * one chosen bad frame and reports how the stage closed the link.
 *
 * usage: tool-ring-peer --connect HOST:PORT --manifest FILE --as-rank R --state-dir DIR
 *                       --case CASE [--target R (the stage's rank; default as-rank + 1)]
 * CASE: random | magic | huge | n_embd | token | unknown | ping | idle (handshake only) |
 *       plain (an unsealed frame after the handshake) |
 *       open-idle (OPEN, then silence: exit 0 if the link stays up) | early-act (an ACT
 *       header of 100000 bytes before the handshake) |
 *       wrong-ring | wrong-manifest (handshake mismatches) |
 *       status-big | status-json | status-rank | status-type (bad STATUS records: over
 *       RING_STATUS_MAX, not JSON, a rank past the ring, a field of the wrong type) |
 *       status-ok (a record of --as-rank with control bytes and an unknown field, then a
 *       PING: exit 0 if the link stays up) |
 *       draft-max (OPEN asking for 15 drafts a pass) | draft-nolast (an ACT flagged DRAFT
 *       without LAST) | draft-big (a verifying pass of 16 rows) | draft-rewind (an open
 *       session's ACT at the position of its last one, with no verifying pass before) |
 *       draft-deep (after a verifying pass from pos 1, an ACT at 1: no row of it kept)
 * After the handshake every frame goes sealed with the link's keys, as a real peer's do, so the
 * stage's checks behind the record layer are what the bad frames meet.
 * Prints "established" after the handshake, every ERROR the stage sends ("error: ..."), and
 * "closed" when the stage closes the link, "pong" for a PONG. Exit 0 when the expected
 * outcome happened (the stage closed the link; for ping: a PONG came back), 1 otherwise. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/rand.h>

#include "kvd/kvd.h"
#include "ring/ring.h"
#include "net/net.h"
#include "util/err.h"

static int fd = -1;
static struct ring_rec *tx, *rx;   /* the link's record directions, once established */

static void send_frame(uint8_t type, uint8_t flags, uint64_t session, uint32_t pos,
                       uint32_t n_tokens, const void *payload, uint32_t len);
static int drain(struct ring_frame_reader *r, int timeout_ms, bool *pong, struct ring_handshake *hs,
                 bool *established, bool stop_when_established);
static uint64_t error_session;   /* the session of the last ERROR frame read */

/* Open a session of a one-token prompt that the stage accepts: a stage dials its successor
 * only once its predecessor has linked in, so an OPEN sent at once may fail with "ring not
 * linked": open again (a new session) until no ERROR comes for it within 300 ms. 0 and *sess,
 * 1 when the stage closed the link, -1 when every try failed. */
static int open_accepted(struct ring_frame_reader *r, uint8_t *buf, uint32_t n_ctx, uint64_t *sess)
{
    struct ring_open_params p = {.temperature = 0, .top_p = 1, .repeat_penalty = 1,
                                .max_tokens = 4, .n_ctx = n_ctx};
    for (int tries = 0; tries <= 20; tries++) {
        ring_open_encode(&p, buf);
        memset(buf + RING_OPEN_LEN, 0, 4);
        buf[RING_OPEN_LEN] = 1;
        send_frame(RING_F_OPEN, 0, *sess, 0, 1, buf, RING_OPEN_LEN + 4);
        error_session = 0;
        if (drain(r, 300, NULL, NULL, NULL, false) == 1)
            return 1;
        if (error_session != *sess)
            return 0;
        RAND_bytes((unsigned char *)sess, sizeof *sess);
    }
    return -1;
}

static void send_all(const void *b, size_t n)
{
    const uint8_t *p = b;
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0)
            return;
        p += w;
        n -= (size_t)w;
    }
}

/* Send header h (its payload_len as given, true or not) and len payload bytes, sealed as one
 * record once the link has keys. */
static void send_hdr(const struct ring_frame_hdr *h, const void *payload, size_t len)
{
    uint8_t *b = malloc(4 + RING_HDR_LEN + len + RING_REC_TAG);
    size_t pre = tx ? 4 : 0;
    ring_frame_hdr_encode(h, b + pre);
    if (len)
        memcpy(b + pre + RING_HDR_LEN, payload, len);
    if (tx && ring_rec_seal(tx, b, RING_HDR_LEN + len) < 0)
        fprintf(stderr, "seal failed\n");
    send_all(b, pre + RING_HDR_LEN + len + (tx ? RING_REC_TAG : 0));
    free(b);
}

static void send_frame(uint8_t type, uint8_t flags, uint64_t sess, uint32_t pos, uint32_t n,
                       const void *payload, uint32_t len)
{
    struct ring_frame_hdr h = {.magic = RING_MAGIC, .type = type, .flags = flags, .session = sess,
                              .pos = pos, .n_tokens = n, .payload_len = len};
    send_hdr(&h, payload, len);
}


/* Read frames until the stage closes the link or timeout_ms of silence; 1 if closed. */
static int drain(struct ring_frame_reader *r, int timeout_ms, bool *pong, struct ring_handshake *hs,
                 bool *established, bool stop_when_established)
{
    char err[KV_ERR_MAX];
    for (;;) {
        struct ring_frame_hdr h;
        const uint8_t *pl;
        int rc;
        while ((rc = rx ? ring_rec_next(rx, r, &h, &pl, err, sizeof err)
                        : ring_frame_reader_next(r, &h, &pl, err, sizeof err)) == 1) {
            if (h.type == RING_F_ERROR && h.payload_len >= 4) {
                printf("error: %.*s\n", (int)h.payload_len - 4, (const char *)pl + 4);
                if (h.session)   /* session 0: the link's, or a link report from further on */
                    error_session = h.session;
            }
            if (h.type == RING_F_PONG && pong) {
                *pong = true;
                printf("pong\n");
                return 0;
            }
            if (hs && !*established && h.type != RING_F_ERROR) {
                const uint8_t *out;
                size_t outlen;
                int hr = ring_handshake_feed(hs, &h, pl, &out, &outlen, err, sizeof err);
                if (hr < 0) {
                    printf("handshake failed here: %s\n", err);
                    return -1;
                }
                if (outlen)
                    send_all(out, outlen);
                if (hr == 1) {
                    struct ring_link_keys k;
                    if (ring_handshake_keys(hs, &k) < 0 || ring_rec_new(&tx, k.tx) < 0 ||
                        ring_rec_new(&rx, k.rx) < 0) {
                        printf("no session keys\n");
                        return -1;
                    }
                    *established = true;
                    printf("established\n");
                    if (stop_when_established)
                        return 0;
                }
            }
        }
        if (rc < 0) {
            printf("bad frame from the stage: %s\n", err);
            return -1;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, timeout_ms) <= 0)
            return 0;
        uint8_t buf[65536];
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n <= 0) {
            printf("closed\n");
            return 1;
        }
        ring_frame_reader_push(r, buf, (size_t)n);
    }
}

int main(int argc, char **argv)
{
    const char *connect_to = NULL, *manifest = NULL, *state = NULL, *kase = NULL;
    int as_rank = -1, target_rank = -1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--connect")) connect_to = argv[i + 1];
        else if (!strcmp(argv[i], "--manifest")) manifest = argv[i + 1];
        else if (!strcmp(argv[i], "--as-rank")) as_rank = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--state-dir")) state = argv[i + 1];
        else if (!strcmp(argv[i], "--case")) kase = argv[i + 1];
        else if (!strcmp(argv[i], "--target")) target_rank = atoi(argv[i + 1]);
    }
    if (!connect_to || !manifest || !state || !kase || as_rank < 0) {
        fprintf(stderr, "usage: tool-ring-peer --connect HOST:PORT --manifest F --as-rank R --state-dir D --case C\n");
        return 2;
    }
    char err[KV_ERR_MAX];
    struct ring_manifest m;
    if (ring_manifest_load(&m, manifest, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    struct net_identity *id;
    if (net_identity_load(&id, state, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    char host[64];
    int port;
    const char *colon = strrchr(connect_to, ':');
    snprintf(host, sizeof host, "%.*s", (int)(colon - connect_to), connect_to);
    port = atoi(colon + 1);
    fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, host, &sa.sin_addr);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        perror("connect");
        return 2;
    }
    struct ring_frame_reader r;
    ring_frame_reader_init(&r, RING_PAYLOAD_HARD_MAX);
    int ret = 1;
    struct ring_handshake *hs = NULL;
    uint8_t *buf = NULL;
    if (!strcmp(kase, "random")) {
        uint8_t junk[4096];
        RAND_bytes(junk, sizeof junk);
        send_all(junk, sizeof junk);
        ret = drain(&r, 5000, NULL, NULL, NULL, false) == 1 ? 0 : 1;
        goto out;
    }
    if (!strcmp(kase, "early-act")) {   /* a boundary-sized frame before any handshake */
        struct ring_frame_hdr h = {.magic = RING_MAGIC, .type = RING_F_ACT, .n_tokens = 1, .payload_len = 100000};
        uint8_t hb0[RING_HDR_LEN];
        ring_frame_hdr_encode(&h, hb0);
        send_all(hb0, sizeof hb0);
        ret = drain(&r, 5000, NULL, NULL, NULL, false) == 1 ? 0 : 1;
        goto out;
    }
    /* A hostile peer's words: control bytes (a terminal escape, a bell) that must never
     * reach the stage's log as they are. */
    static const char evil[] = "\x1b[2Jevil\x07 reason";
    if (!strcmp(kase, "hs-error")) {   /* an ERROR instead of a HELLO */
        uint8_t e[4 + sizeof evil] = {2};
        memcpy(e + 4, evil, sizeof evil - 1);
        send_frame(RING_F_ERROR, 0, 0, 0, 0, e, 4 + sizeof evil - 1);
        ret = drain(&r, 5000, NULL, NULL, NULL, false) == 1 ? 0 : 1;
        goto out;
    }
    uint32_t target = target_rank >= 0 ? (uint32_t)target_rank : ((uint32_t)as_rank + 1) % m.n_ranks;
    struct ring_hello mine = {.version = RING_VERSION, .rank = (uint32_t)as_rank, .n_ranks = m.n_ranks};
    snprintf(mine.ring, sizeof mine.ring, "%s", !strcmp(kase, "wrong-ring") ? "not-this-ring" : m.ring);
    memcpy(mine.manifest_hash, m.hash, 32);
    if (!strcmp(kase, "wrong-manifest"))
        mine.manifest_hash[0] ^= 1;
    struct ring_hs_expect x = {.rank = target, .n_ranks = m.n_ranks, .ring = m.ring};
    memcpy(x.manifest_hash, m.hash, 32);
    ring_handshake_new(&hs, id, &mine, &x, RING_HS_UP);
    const uint8_t *hb;
    size_t hl;
    ring_handshake_hello(hs, &hb, &hl);
    send_all(hb, hl);
    bool est = false;
    int rc = drain(&r, 5000, NULL, hs, &est, true);
    if (!est) {   /* refused in the handshake: fine when that was the point */
        ret = rc == 1 ? 0 : 1;
        goto out;
    }
    buf = calloc(1, (size_t)(m.n_embd + 1) * 4 + RING_OPEN_LEN + 64);
    uint64_t sess;
    RAND_bytes((unsigned char *)&sess, sizeof sess);
    if (!strcmp(kase, "magic")) {
        struct ring_frame_hdr h = {.magic = 0x58585858, .type = RING_F_PING, .payload_len = 8};
        uint8_t z[8] = {0};
        send_hdr(&h, z, 8);
    } else if (!strcmp(kase, "huge")) {
        struct ring_frame_hdr h = {.magic = RING_MAGIC, .type = RING_F_ACT, .session = sess,
                                  .n_tokens = 1, .payload_len = 0xffffffffu};
        send_hdr(&h, NULL, 0);
    } else if (!strcmp(kase, "n_embd")) {
        struct ring_open_params p = {.temperature = 0, .top_p = 1, .repeat_penalty = 1,
                                    .max_tokens = 4, .n_ctx = m.n_ctx};
        ring_open_encode(&p, buf);
        memset(buf + RING_OPEN_LEN, 0, 4);   /* one prompt token: id 0 */
        buf[RING_OPEN_LEN] = 1;
        send_frame(RING_F_OPEN, 0, sess, 0, 1, buf, RING_OPEN_LEN + 4);
        memset(buf, 0, (size_t)(m.n_embd + 1) * 4);
        send_frame(RING_F_ACT, RING_FL_LAST, sess, 0, 1, buf, (m.n_embd + 1) * m.wire_dsize);
    } else if (!strcmp(kase, "plain")) {   /* a frame outside the record layer */
        struct ring_frame_hdr h = {.magic = RING_MAGIC, .type = RING_F_PING, .payload_len = 8};
        uint8_t b[RING_HDR_LEN + 8] = {0};
        ring_frame_hdr_encode(&h, b);
        send_all(b, sizeof b);
    } else if (!strcmp(kase, "error-ctl")) {   /* the link's ERROR, sealed, with control bytes */
        buf[0] = RING_ERR_PROTO;
        memcpy(buf + 4, evil, sizeof evil - 1);
        send_frame(RING_F_ERROR, 0, 0, 0, 0, buf, 4 + sizeof evil - 1);
    } else if (!strcmp(kase, "error-huge")) {   /* an ERROR one byte over RING_ERRMSG_MAX */
        uint8_t *e = calloc(1, 4 + RING_ERRMSG_MAX + 1);
        memset(e + 4, 'A', RING_ERRMSG_MAX + 1);
        send_frame(RING_F_ERROR, 0, 0, 0, 0, e, 4 + RING_ERRMSG_MAX + 1);
        free(e);
    } else if (!strcmp(kase, "report-up")) {   /* a link report sent downstream, not back */
        buf[0] = RING_ERR_LINK_DOWN;
        memcpy(buf + 4, "down", 4);
        send_frame(RING_F_ERROR, 0, 0, 2, 0, buf, 8);
    } else if (!strcmp(kase, "token")) {
        send_frame(RING_F_TOKEN, 0, sess, 1, 1, buf, 8);
    } else if (!strcmp(kase, "unknown")) {
        send_frame(RING_F_ACT, RING_FL_LAST, sess, 0, 1, buf, m.n_embd * m.wire_dsize);
    } else if (!strcmp(kase, "open-idle")) {
        /* open a session and never feed it: the stage's idle timeout must end it while the
         * link itself stays up (exit 0 when the link was not closed within 3 s) */
        int oc = open_accepted(&r, buf, m.n_ctx, &sess);
        if (oc == 1)
            goto out;
        if (oc < 0) {
            printf("every OPEN failed\n");
            goto out;
        }
        for (int i = 0; i < 3; i++) {   /* answer nothing, but keep the link alive with PINGs */
            send_frame(RING_F_PING, 0, 0, 0, 0, buf, 8);
            bool pong = false;
            if (drain(&r, 1000, &pong, NULL, NULL, false) == 1)
                goto out;
            sleep(1);
        }
        printf("still open\n");
        ret = 0;
        goto out;
    } else if (!strcmp(kase, "draft-max")) {
        struct ring_open_params p = {.temperature = 0, .top_p = 1, .repeat_penalty = 1,
                                    .max_tokens = 4, .n_ctx = m.n_ctx, .draft_max = RING_DRAFTS_MAX + 1};
        ring_open_encode(&p, buf);
        memset(buf + RING_OPEN_LEN, 0, 4);
        buf[RING_OPEN_LEN] = 1;
        send_frame(RING_F_OPEN, 0, sess, 0, 1, buf, RING_OPEN_LEN + 4);
    } else if (!strcmp(kase, "draft-nolast") || !strcmp(kase, "draft-big")) {
        uint32_t n = !strcmp(kase, "draft-big") ? RING_TOKENS_MAX + 1 : 2;
        size_t len = (size_t)n * m.n_embd * m.wire_dsize;
        uint8_t *rows = calloc(1, len);
        send_frame(RING_F_ACT, n == 2 ? RING_FL_DRAFT : RING_FL_DRAFT | RING_FL_LAST, sess, 0, n, rows, (uint32_t)len);
        free(rows);
    } else if (!strcmp(kase, "draft-rewind") || !strcmp(kase, "draft-deep")) {
        /* a session the stage holds, one row run, then a frame that goes back */
        int oc = open_accepted(&r, buf, m.n_ctx, &sess);
        if (oc != 0) {
            printf(oc == 1 ? "closed at OPEN\n" : "every OPEN failed\n");
            goto out;
        }
        size_t row = (size_t)m.n_embd * m.wire_dsize;
        uint8_t *rows = calloc(4, row);
        send_frame(RING_F_ACT, RING_FL_LAST, sess, 0, 1, rows, (uint32_t)row);
        if (!strcmp(kase, "draft-deep"))   /* a verifying pass of 3 rows from pos 1 */
            send_frame(RING_F_ACT, RING_FL_LAST | RING_FL_DRAFT, sess, 1, 3, rows, (uint32_t)(3 * row));
        uint32_t back = !strcmp(kase, "draft-deep") ? 1 : 0;
        send_frame(RING_F_ACT, RING_FL_LAST, sess, back, 1, rows, (uint32_t)row);
        free(rows);
    } else if (!strncmp(kase, "status-", 7)) {
        char rec[RING_STATUS_MAX + 64];
        uint32_t rank = (uint32_t)as_rank, len;
        if (!strcmp(kase, "status-big")) {   /* a valid object, one byte over the cap */
            len = RING_STATUS_MAX + 1;
            int n = snprintf(rec, sizeof rec, "{\"rank\":%u,\"host\":\"", rank);
            memset(rec + n, 'x', len - (uint32_t)n - 2);
            memcpy(rec + len - 2, "\"}", 2);
        } else if (!strcmp(kase, "status-json")) {
            len = (uint32_t)snprintf(rec, sizeof rec, "not json");
        } else if (!strcmp(kase, "status-rank")) {
            rank = m.n_ranks + 4;
            len = (uint32_t)snprintf(rec, sizeof rec, "{\"rank\":%u}", rank);
        } else if (!strcmp(kase, "status-type")) {
            len = (uint32_t)snprintf(rec, sizeof rec, "{\"rank\":%u,\"sessions\":\"many\"}", rank);
        } else {   /* status-ok: the stage keeps it, cleaned, and the link stays up */
            len = (uint32_t)snprintf(rec, sizeof rec, "{\"rank\":%u,\"host\":\"evil\\u0001host\","
                                     "\"junk\":[1,2,3],\"sessions\":7,\"in\":{\"state\":\"up\","
                                     "\"extra\":1}}", rank);
            send_frame(RING_F_STATUS, 0, 0, 0, rank, rec, len);
            send_frame(RING_F_PING, 0, 0, 0, 0, buf, 8);
            bool pong = false;
            drain(&r, 5000, &pong, NULL, NULL, false);
            ret = pong ? 0 : 1;
            goto out;
        }
        send_frame(RING_F_STATUS, 0, 0, 0, rank, rec, len);
    } else if (!strcmp(kase, "ping")) {
        send_frame(RING_F_PING, 0, 0, 0, 0, buf, 8);
        bool pong = false;
        drain(&r, 5000, &pong, NULL, NULL, false);
        ret = pong ? 0 : 1;
        goto out;
    } else if (strcmp(kase, "idle") != 0) {
        fprintf(stderr, "unknown case %s\n", kase);
        ret = 2;
        goto out;
    }
    ret = drain(&r, 5000, NULL, NULL, NULL, false) == 1 ? 0 : 1;
out:
    free(buf);
    ring_handshake_free(hs);
    ring_rec_free(tx);
    ring_rec_free(rx);
    net_identity_free(id);
    ring_frame_reader_free(&r);
    close(fd);
    return ret;
}

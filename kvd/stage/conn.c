/* conn.c — one link of the stage as the other files use it: send a frame, send an ERROR,
 * ping, close, and close for a protocol violation. The lowest of the loop side's files. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "kvd/kvd.h"
#include "kvd/stage/internal.h"
#include "net/net.h"

bool kvd_conn_out_up(struct stage *st) { return st->links.out && st->links.out->up; }

bool kvd_conn_in_up(struct stage *st) { return st->links.in && st->links.in->up; }

int kvd_conn_send(struct conn *c, uint8_t type, uint8_t flags, uint64_t session, uint32_t pos,
                  uint32_t n_tokens, const void *payload, size_t len)
{
    if (!c || !c->up)
        return -ENOTCONN;
    struct ring_frame_hdr h = {.magic = RING_MAGIC, .type = type, .flags = flags, .session = session,
                              .pos = pos, .n_tokens = n_tokens};
    return ring_link_send(c->link, &h, payload, len);
}

void kvd_conn_send_error(struct conn *c, uint64_t session, uint32_t code, const char *msg)
{
    size_t n = strlen(msg);
    if (n > RING_ERRMSG_MAX)
        n = RING_ERRMSG_MAX;
    uint8_t buf[4 + RING_ERRMSG_MAX];
    util_le32_put(buf, code);
    memcpy(buf + 4, msg, n);
    if (c && c->link && !ring_link_is_closing(c->link)) {
        struct ring_frame_hdr h = {.magic = RING_MAGIC, .type = RING_F_ERROR, .session = session};
        ring_link_send(c->link, &h, buf, 4 + n);
    }
}

void kvd_conn_close(struct conn *c, const char *reason)
{
    if (c->link)
        ring_link_close(c->link, reason);
}

/* Close the link for a protocol violation: log, tell the peer, close. */
void kvd_conn_violation(struct conn *c, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kvd_log(KVD_LOG_WARN, "link %s (%s): closing: %s", c->role == CONN_OUT ? "out" : "in",
            ring_link_peer(c->link), msg);
    kvd_conn_send_error(c, 0, RING_ERR_PROTO, msg);
    kvd_conn_close(c, msg);
}

void kvd_conn_ping(struct conn *c)
{
    uint8_t b[8];
    c->ping_sent_ns = util_now_ns();
    util_le64_put(b, c->ping_sent_ns);
    kvd_conn_send(c, RING_F_PING, 0, 0, 0, 0, b, 8);
}

void kvd_conn_pong(struct conn *c, const uint8_t payload[8])
{
    uint64_t sent = util_le64_get(payload);
    if (c->role != CONN_OUT || sent != c->ping_sent_ns)
        return;
    c->rtt_ms = (double)(util_now_ns() - sent) / 1e6;
    c->st->links.succ_rtt_ms = c->rtt_ms;
}

uint32_t kvd_conn_deadline_ms(const struct conn *c)
{
    if (c->st->o.link_timeout_ms)
        return c->st->o.link_timeout_ms;
    double ms = LINK_SILENCE_MIN_MS + LINK_SILENCE_RTTS * c->rtt_ms;
    return ms < LINK_SILENCE_MAX_MS ? (uint32_t)ms : LINK_SILENCE_MAX_MS;
}

uint32_t kvd_conn_hs_deadline_ms(const struct stage *st)
{
    double ms = st->o.link_timeout_ms ? st->o.link_timeout_ms
                                      : LINK_HS_MIN_MS + LINK_HS_RTTS * st->links.succ_rtt_ms;
    return ms < LINK_HS_MAX_MS ? (uint32_t)ms : LINK_HS_MAX_MS;
}

void kvd_conn_note(struct stage *st, uint32_t r, bool down, uint32_t by, const char *reason)
{
    if (r >= st->n)
        return;
    struct kvd_link_note *ln = &st->links.note[r];
    ln->down = down;
    if (down && reason) {
        snprintf(ln->last_reason, sizeof ln->last_reason, "%s", reason);
        ln->last_reason_ms = (uint64_t)util_now_ms();
        ln->by_rank = by;
    }
}

/* A hash of the out link's state, to report each distinct one once (never 0: "none"). */
static uint32_t note_hash(const struct kvd_link_note *ln)
{
    uint64_t h = ln->down ? util_hash_str(ln->last_reason) : 0;
    uint32_t r = (uint32_t)(h ^ h >> 32) ^ (ln->down ? 0x9e3779b9u : 0);
    return r ? r : 1;
}

void kvd_conn_report_out(struct stage *st)
{
    const struct kvd_link_note *ln = &st->links.note[st->rank];
    uint32_t h = note_hash(ln);
    if (st->rank == 0 || !kvd_conn_in_up(st) || h == st->links.out_report_hash)
        return;
    st->links.out_report_hash = h;
    size_t n = ln->down ? strlen(ln->last_reason) : 0;
    uint8_t buf[4 + KVD_REASON_MAX];
    util_le32_put(buf, ln->down ? RING_ERR_LINK_DOWN : RING_ERR_LINK_UP);
    memcpy(buf + 4, ln->last_reason, n);
    struct ring_frame_hdr hd = {.magic = RING_MAGIC, .type = RING_F_ERROR, .pos = st->rank};
    ring_link_send(st->links.in->link, &hd, buf, 4 + n);
}

void kvd_conn_out_down_why(struct stage *st, char *msg, size_t n)
{
    const struct kvd_link_note *ln = &st->links.note[st->rank];
    snprintf(msg, n, "ring not linked: link rank %u -> rank %u is down%s%s", st->rank, st->succ,
             ln->last_reason[0] ? ": " : "", ln->last_reason);
}

void kvd_conn_ring_why(struct stage *st, char *msg, size_t n)
{
    bool out_up = kvd_conn_out_up(st), in_up = kvd_conn_in_up(st);
    /* The ring links from rank 0 outwards: the first link down in that order is the one to
     * fix; without a report, rank 0's own in link is. */
    uint32_t r = st->n - 1;
    if (!out_up)
        r = 0;
    else
        for (uint32_t i = 1; i < st->n; i++)
            if (st->links.note[i].down && st->links.note[i].last_reason[0]) {
                r = i;
                break;
            }
    const struct kvd_link_note *ln = &st->links.note[r];
    char ago[64] = "";
    if (ln->last_reason[0])
        snprintf(ago, sizeof ago, " (rank %u, %.0f s ago)", ln->by_rank,
                 (double)((uint64_t)util_now_ms() - ln->last_reason_ms) / 1000.0);
    snprintf(msg, n, "ring not linked: link rank %u -> rank %u is down: %s%s; out link to rank %u "
             "is %s, in link from rank %u is %s", r, (r + 1) % st->n,
             ln->last_reason[0] ? ln->last_reason : "no stage has said why yet (is every stage running?)",
             ago, st->succ, out_up ? "up" : "down", st->pred, in_up ? "up" : "down");
}

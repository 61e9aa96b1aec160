/* bridge.c — the relay's bridges: an end's role byte pairs it with the opposite end of the
 * same bridge id, binary messages are forwarded between the two (held while an end waits for
 * its partner, reads paused above the high-water mark), and the periodic checks of every end
 * (pairing and idle timeouts, pings). */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvd/relay/internal.h"
#include "util/util.h"

/* After kvd_relay_close: free r once its timer, its server and every end are gone (the TLS
 * context only then: the server's connections borrow it), then tell the owner. */
void kvd_relay__maybe_free(struct kvd_relay *r)
{
    if (!r->closing || r->ends || !r->tick_closed || !r->srv_closed)
        return;
    void (*done)(void *) = r->done;
    void *done_ud = r->done_ud;
    net_tls_ctx_free(r->tls);
    free(r);
    if (done)
        done(done_ud);
}

/* The relay's lines go to kvd's log (prefix "relay"); --quiet keeps only warnings and errors. */
void kvd_relay__log(struct kvd_relay *r, int level, const char *fmt, ...)
{
    if (r->cfg.quiet && level > KVD_LOG_WARN)
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    kvd_log(level, "%s", line);
}

static bool bridge_id_valid(const char *id)
{
    size_t n = strlen(id);
    if (n < BRIDGE_ID_MIN || n > BRIDGE_ID_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((id[i] >= '0' && id[i] <= '9') || (id[i] >= 'a' && id[i] <= 'f')))
            return false;
    return true;
}

static struct relay_bridge **bridge_slot(struct kvd_relay *r, const char *id)
{
    struct relay_bridge **p = &r->buckets[util_hash_str(id) & (r->n_buckets - 1)];
    while (*p && strcmp((*p)->id, id) != 0)
        p = &(*p)->hnext;
    return p;
}

static struct addr_count **addr_slot(struct kvd_relay *r, const char *addr)
{
    struct addr_count **p = &r->addrs[util_hash_str(addr) & (ADDR_BUCKETS - 1)];
    while (*p && strcmp((*p)->addr, addr) != 0)
        p = &(*p)->next;
    return p;
}

static const char *role_name(int role)
{
    return role == KVD_RELAY_UPSTREAM ? "upstream" : "downstream";
}

static void end_close(struct relay_end *e, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Take e out of its bridge; a partner still there is closed with e's reason. */
static void end_detach(struct relay_end *e, int code, const char *reason)
{
    struct kvd_relay *r = e->r;
    struct relay_bridge *b = e->b;
    if (!b)
        return;
    struct relay_end *p = b->end[3 - e->role];
    b->end[e->role] = NULL;
    e->b = NULL;
    if (p) {
        r->st.paired--;
        r->st.waiting++;
        r->st.partner_gone++;
        end_close(p, NET_WS_CODE_PARTNER_GONE, "partner gone: %d %.80s", code, reason);
        return;
    }
    r->st.waiting--;
    r->st.bridges--;
    *bridge_slot(r, b->id) = b->hnext;
    free(b);
}

static void end_close(struct relay_end *e, int code, const char *fmt, ...)
{
    if (e->closing)
        return;
    e->closing = true;
    char reason[124];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    if (code != NET_WS_CODE_PARTNER_GONE && code != NET_WS_CODE_NORMAL)
        kvd_relay__log(e->r, KVD_LOG_WARN, "%s: closing %s end of bridge %.12s: %d %s", net_ws_peer(e->ws),
                  e->role ? role_name(e->role) : "unpaired", e->id, code, reason);
    end_detach(e, code, reason);
    net_ws_close(e->ws, code, reason);
}

static struct relay_end *partner(struct relay_end *e)
{
    if (!e->b || !e->role)
        return NULL;
    return e->b->end[3 - e->role];
}

static void end_pause(struct relay_end *e, bool p)
{
    if (e->paused == p)
        return;
    e->paused = p;
    if (p)
        e->paused_at = uv_now(e->r->loop);
    net_ws_pause(e->ws, p);
}

/* Forward one message to the partner; pause the sender while the partner is backed up. */
static void forward(struct relay_end *from, struct relay_end *to, const uint8_t *data, size_t len)
{
    struct kvd_relay *r = from->r;
    if (to->closing)
        return;
    int rc = net_ws_send(to->ws, NET_WS_BINARY, data, len);
    if (rc < 0) {
        end_close(from, NET_WS_CODE_PARTNER_GONE, "partner gone: cannot send (%s)", strerror(-rc));
        return;
    }
    r->st.messages_total++;
    r->st.bytes_total += len;
    from->bytes_in += len;
    from->msgs_in++;
    if (net_ws_pending(to->ws) > r->cfg.high_water)
        end_pause(from, true);
}

static void flush_held(struct relay_end *from, struct relay_end *to)
{
    struct held_msg *m = from->held;
    from->held = from->held_tail = NULL;
    from->r->st.held_bytes -= from->held_bytes;
    from->held_bytes = 0;
    while (m) {
        struct held_msg *n = m->next;
        forward(from, to, m->data, m->len);
        free(m);
        m = n;
    }
    if (net_ws_pending(to->ws) <= from->r->cfg.high_water)
        end_pause(from, false);
}

static void end_set_role(struct relay_end *e, int role)
{
    struct kvd_relay *r = e->r;
    struct relay_bridge **slot = bridge_slot(r, e->id);
    struct relay_bridge *b = *slot;
    if (!b) {
        if (r->st.bridges >= r->cfg.max_bridges) {
            r->st.refused_limit++;
            end_close(e, NET_WS_CODE_TRY_LATER, "relay full: %u bridges", r->cfg.max_bridges);
            return;
        }
        b = calloc(1, sizeof *b);
        if (!b) {
            end_close(e, 1011, "out of memory");
            return;
        }
        snprintf(b->id, sizeof b->id, "%s", e->id);
        *slot = b;
        r->st.bridges++;
        r->st.waiting++;
    }
    if (b->end[role]) {
        r->st.refused_dup_role++;
        end_close(e, NET_WS_CODE_DUP_ROLE, "bridge %.16s: %s end already connected", e->id,
                  role_name(role));
        return;
    }
    b->end[role] = e;
    e->b = b;
    e->role = role;
    e->t_role = uv_now(r->loop);
    struct relay_end *p = b->end[3 - role];
    if (p) {
        r->st.waiting--;
        r->st.paired++;
        r->st.pairings_total++;
        kvd_relay__log(r, KVD_LOG_INFO, "bridge %.12s paired: upstream %s, downstream %s", b->id,
                  net_ws_peer(b->end[1]->ws), net_ws_peer(b->end[2]->ws));
        flush_held(e, p);
        flush_held(p, e);
    }
}

/* ---------------------------------------------------------------- ws handlers */

static void on_open(struct net_ws *ws, void *ud)
{
    struct relay_end *e = ud;
    if (e->refuse_code)
        end_close(e, e->refuse_code, "%s", e->refuse_reason);
}

static void on_msg(struct net_ws *ws, int opcode, const uint8_t *data, size_t len, void *ud)
{
    struct relay_end *e = ud;
    struct kvd_relay *r = e->r;
    if (e->closing)
        return;
    if (opcode != NET_WS_BINARY) {
        end_close(e, 1003, "the relay forwards binary messages only");
        return;
    }
    if (!e->role) {
        if (len != 1 || (data[0] != KVD_RELAY_UPSTREAM && data[0] != KVD_RELAY_DOWNSTREAM)) {
            r->st.refused_bad_role++;
            end_close(e, NET_WS_CODE_BAD_ROLE,
                      "first message must be one byte, 0x01 (upstream) or 0x02 (downstream); "
                      "got %zu bytes starting 0x%02x", len, len ? data[0] : 0);
            return;
        }
        end_set_role(e, data[0]);
        return;
    }
    struct relay_end *p = partner(e);
    if (p) {
        forward(e, p, data, len);
        return;
    }
    /* No partner yet: hold the message, and stop reading once high_water is held; a
     * message past the caps of what may be held closes the end. */
    if (e->held_bytes + len > r->cfg.max_held) {
        r->st.refused_held++;
        end_close(e, NET_WS_CODE_TOO_BIG, "no partner yet and %zu + %zu bytes to hold (limit %" PRIu64 ")",
                  e->held_bytes, len, r->cfg.max_held);
        return;
    }
    if (r->st.held_bytes + len > r->cfg.max_held_total) {
        r->st.refused_held++;
        end_close(e, NET_WS_CODE_TRY_LATER, "relay busy: %" PRIu64 " bytes held for ends without a partner",
                  r->st.held_bytes);
        return;
    }
    struct held_msg *m = malloc(sizeof *m + len);
    if (!m) {
        end_close(e, 1011, "out of memory");
        return;
    }
    m->next = NULL;
    m->len = len;
    memcpy(m->data, data, len);
    if (e->held_tail)
        e->held_tail->next = m;
    else
        e->held = m;
    e->held_tail = m;
    e->held_bytes += len;
    r->st.held_bytes += len;
    if (e->held_bytes > r->cfg.high_water)
        end_pause(e, true);
}

/* The partner drained what we sent it: read from this end's partner again. */
static void on_drain(struct net_ws *ws, void *ud)
{
    struct relay_end *e = ud;
    struct relay_end *p = partner(e);
    if (p && !p->closing)
        end_pause(p, false);
}

static void on_close(struct net_ws *ws, int code, const char *reason, void *ud)
{
    struct relay_end *e = ud;
    struct kvd_relay *r = e->r;
    /* one line per bridge end that took a role: who, which bridge, how long, how much (never
     * what); ends that never got that far are debug detail (a flood would fill the log) */
    kvd_relay__log(r, e->role ? KVD_LOG_INFO : KVD_LOG_DEBUG,
              "%s: %s end of bridge %.12s closed after %.1f s: %" PRIu64 " bytes in %" PRIu64
              " messages from it; %d %.80s", net_ws_peer(ws), e->role ? role_name(e->role) : "unpaired",
              e->id[0] ? e->id : "-", (double)(uv_now(r->loop) - e->t_open) / 1000.0, e->bytes_in, e->msgs_in,
              code, reason ? reason : "");
    end_detach(e, code, reason);
    for (struct held_msg *m = e->held; m;) {
        struct held_msg *n = m->next;
        free(m);
        m = n;
    }
    r->st.held_bytes -= e->held_bytes;
    if (e->ac && --e->ac->n == 0) {
        struct addr_count **s = addr_slot(r, e->ac->addr);
        *s = e->ac->next;
        free(e->ac);
    }
    if (e->prev)
        e->prev->next = e->next;
    else
        r->ends = e->next;
    if (e->next)
        e->next->prev = e->prev;
    r->st.connections--;
    free(e);
    kvd_relay__maybe_free(r);
}

static const struct net_ws_handlers end_handlers = {
    .on_open = on_open,
    .on_msg = on_msg,
    .on_drain = on_drain,
    .on_close = on_close,
};

int kvd_relay__on_upgrade(struct net_ws_server *srv, struct net_ws *ws, const char *path,
                      const struct net_ws_handlers **h, void **ud, void *srv_ud)
{
    struct kvd_relay *r = srv_ud;
    static const char prefix[] = "/v1/bridge/";
    if (strncmp(path, prefix, sizeof prefix - 1) != 0)
        return 404;
    const char *id = path + sizeof prefix - 1;
    struct relay_end *e = calloc(1, sizeof *e);
    if (!e)
        return 503;
    e->r = r;
    e->ws = ws;
    e->t_open = e->last_ping = uv_now(r->loop);
    snprintf(e->id, sizeof e->id, "%.*s", BRIDGE_ID_MAX, id);
    e->next = r->ends;
    if (r->ends)
        r->ends->prev = e;
    r->ends = e;
    r->st.connections++;
    const char *addr = net_ws_peer(ws);
    struct addr_count **as = addr_slot(r, addr);
    if (!*as) {
        *as = calloc(1, sizeof **as);
        if (*as)
            snprintf((*as)->addr, sizeof (*as)->addr, "%s", addr);
    }
    e->ac = *as;
    if (e->ac)
        e->ac->n++;

    if (!bridge_id_valid(id)) {
        r->st.refused_bad_bridge++;
        e->refuse_code = NET_WS_CODE_BAD_BRIDGE;
        snprintf(e->refuse_reason, sizeof e->refuse_reason,
                 "bridge id must be %d to %d lowercase hex characters (got %zu characters)",
                 BRIDGE_ID_MIN, BRIDGE_ID_MAX, strlen(id));
    } else if (e->ac && e->ac->n > r->cfg.max_per_addr) {
        r->st.refused_limit++;
        e->refuse_code = NET_WS_CODE_TRY_LATER;
        snprintf(e->refuse_reason, sizeof e->refuse_reason,
                 "too many connections from %s (limit %u)", addr, r->cfg.max_per_addr);
    } else if (!*bridge_slot(r, id) && r->st.bridges >= r->cfg.max_bridges) {
        r->st.refused_limit++;
        e->refuse_code = NET_WS_CODE_TRY_LATER;
        snprintf(e->refuse_reason, sizeof e->refuse_reason, "relay full: %u bridges",
                 r->cfg.max_bridges);
    }
    *h = &end_handlers;
    *ud = e;
    return 0;
}

/* ---------------------------------------------------------------- periodic checks */

void kvd_relay__on_tick(uv_timer_t *t)
{
    struct kvd_relay *r = t->data;
    uint64_t now = uv_now(r->loop);
    for (struct relay_end *e = r->ends; e; e = e->next) {
        if (e->closing)
            continue;
        if (!e->role && now - e->t_open >= r->cfg.pair_timeout_ms) {
            r->st.timeouts_partner++;
            end_close(e, NET_WS_CODE_PARTNER_TIMEOUT, "no role byte within %u ms",
                      r->cfg.pair_timeout_ms);
            continue;
        }
        if (e->role && !partner(e) && now - e->t_role >= r->cfg.pair_timeout_ms) {
            r->st.timeouts_partner++;
            end_close(e, NET_WS_CODE_PARTNER_TIMEOUT, "no partner within %u ms",
                      r->cfg.pair_timeout_ms);
            continue;
        }
        /* A paused end is not read, so its silence counts only from the pause: a partner
         * that drains nothing for the idle time is as dead as a silent end. */
        uint64_t rx = net_ws_last_rx(e->ws);
        if (e->paused && e->paused_at > rx)
            rx = e->paused_at;
        if (now - rx >= r->cfg.idle_timeout_ms) {
            r->st.timeouts_idle++;
            end_close(e, NET_WS_CODE_IDLE, "idle: nothing received for %u ms",
                      r->cfg.idle_timeout_ms);
            continue;
        }
        if (now - e->last_ping >= r->cfg.ping_interval_ms) {
            e->last_ping = now;
            net_ws_send(e->ws, NET_WS_PING, (const uint8_t *)"kv", 2);
        }
    }
}

/* The relay role: pairs two WebSocket ends by bridge id and opposite roles, then forwards
 * binary messages between them. Everything runs on one libuv loop.
 *
 * Memory per bridge stays bounded: an end whose partner has more than high_water bytes
 * queued stops being read (TCP then slows its sender) until the partner drains below the
 * low-water mark; an end without a partner yet may hold up to high_water bytes, then it
 * too stops being read. Limits and timeouts are checked by one periodic timer. */
#include <assert.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <uv.h>

#include "kvd/kvd.h"
#include "net/net.h"
#include "util/util.h"
#include "util/err.h"

#define BRIDGE_ID_MIN 32
#define BRIDGE_ID_MAX 64
#define ADDR_BUCKETS 256

struct held_msg {
    struct held_msg *next;
    size_t len;
    uint8_t data[];
};

struct relay_bridge;

struct relay_end {
    struct kvd_relay *r;
    struct net_ws *ws;
    struct relay_bridge *b;
    struct relay_end *next, *prev;   /* all ends */
    struct addr_count *ac;
    char id[BRIDGE_ID_MAX + 1];
    int role;                        /* 0 until the role byte arrived */
    int refuse_code;                 /* set at upgrade: refuse right after the 101 */
    char refuse_reason[124];
    bool closing;
    bool paused;
    uint64_t t_open, t_role, last_ping, paused_at;
    uint64_t bytes_in, msgs_in;      /* what this end sent (for the close line) */
    struct held_msg *held, *held_tail;
    size_t held_bytes;
};

struct relay_bridge {
    struct relay_bridge *hnext;
    struct relay_end *end[3];        /* [1] upstream, [2] downstream */
    char id[BRIDGE_ID_MAX + 1];
};

struct addr_count {
    struct addr_count *next;
    uint32_t n;
    char addr[64];
};

struct kvd_relay {
    uv_loop_t *loop;
    struct kvd_relay_config cfg;
    struct net_tls_ctx *tls;
    struct net_ws_server *srv;
    uv_timer_t tick;
    bool closing, tick_closed, srv_closed;
    void (*done)(void *ud);      /* kvd_relay_close's callback */
    void *done_ud;
    struct relay_end *ends;
    struct relay_bridge **buckets;
    size_t n_buckets;
    struct addr_count *addrs[ADDR_BUCKETS];
    struct kvd_relay_stats st;
};

/* After kvd_relay_close: free r once its timer, its server and every end are gone (the TLS
 * context only then: the server's connections borrow it), then tell the owner. */
static void relay_maybe_free(struct kvd_relay *r)
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
static void relay_log(struct kvd_relay *r, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void relay_log(struct kvd_relay *r, int level, const char *fmt, ...)
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
        relay_log(e->r, KVD_LOG_WARN, "%s: closing %s end of bridge %.12s: %d %s", net_ws_peer(e->ws),
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
        relay_log(r, KVD_LOG_INFO, "bridge %.12s paired: upstream %s, downstream %s", b->id,
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
    relay_log(r, e->role ? KVD_LOG_INFO : KVD_LOG_DEBUG,
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
    relay_maybe_free(r);
}

static const struct net_ws_handlers end_handlers = {
    .on_open = on_open,
    .on_msg = on_msg,
    .on_drain = on_drain,
    .on_close = on_close,
};

static int on_upgrade(struct net_ws_server *srv, struct net_ws *ws, const char *path,
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

/* ---------------------------------------------------------------- status */

/* The addresses with the most connections (the HTTP server counts every connection). */
#define TOP_ADDRS 16
struct top_addrs {
    size_t n;
    struct { char addr[64]; uint32_t n; } a[TOP_ADDRS];
};

static void top_addrs_add(void *ud, const char *addr, uint32_t n)
{
    struct top_addrs *t = ud;
    size_t i = t->n;
    if (i == TOP_ADDRS) {
        if (t->a[TOP_ADDRS - 1].n >= n)
            return;
        i = TOP_ADDRS - 1; /* the smallest makes room */
    } else {
        t->n++;
    }
    for (; i > 0 && t->a[i - 1].n < n; i--)
        t->a[i] = t->a[i - 1];
    snprintf(t->a[i].addr, sizeof t->a[i].addr, "%s", addr);
    t->a[i].n = n;
}

static void top_addrs_get(struct kvd_relay *r, struct top_addrs *t)
{
    memset(t, 0, sizeof *t);
    net_http_server_addrs(net_ws_server_http(r->srv), top_addrs_add, t);
}

static cJSON *stats_json(struct kvd_relay *r)
{
    cJSON *o = cJSON_CreateObject();
    struct kvd_relay_stats snap;
    kvd_relay_get_stats(r, &snap);
    const struct kvd_relay_stats *s = &snap;
    cJSON_AddNumberToObject(o, "connections", (double)s->connections);
    cJSON_AddNumberToObject(o, "bridges", (double)s->bridges);
    cJSON_AddNumberToObject(o, "paired", (double)s->paired);
    cJSON_AddNumberToObject(o, "waiting", (double)s->waiting);
    cJSON_AddNumberToObject(o, "pairings_total", (double)s->pairings_total);
    cJSON_AddNumberToObject(o, "messages_total", (double)s->messages_total);
    cJSON_AddNumberToObject(o, "bytes_total", (double)s->bytes_total);
    cJSON_AddNumberToObject(o, "held_bytes", (double)s->held_bytes);
    cJSON_AddNumberToObject(o, "queued_bytes", (double)s->queued_bytes);
    cJSON_AddNumberToObject(o, "assembling_bytes", (double)s->assembling_bytes);
    cJSON *http = cJSON_AddObjectToObject(o, "http");
    cJSON_AddNumberToObject(http, "connections", (double)s->http_conns);
    cJSON_AddNumberToObject(http, "addresses", (double)s->http_addrs);
    cJSON_AddNumberToObject(http, "refused_addr", (double)s->http_refused_addr);
    cJSON_AddNumberToObject(http, "refused_conns", (double)s->http_refused_conns);
    cJSON_AddNumberToObject(http, "timeouts", (double)s->http_timeouts);
    struct top_addrs top;
    top_addrs_get(r, &top);
    cJSON *pa = cJSON_AddObjectToObject(http, "per_addr");
    for (size_t i = 0; i < top.n; i++)
        cJSON_AddNumberToObject(pa, top.a[i].addr, top.a[i].n);
    cJSON *ref = cJSON_AddObjectToObject(o, "refused");
    cJSON_AddNumberToObject(ref, "bad_bridge", (double)s->refused_bad_bridge);
    cJSON_AddNumberToObject(ref, "bad_role", (double)s->refused_bad_role);
    cJSON_AddNumberToObject(ref, "dup_role", (double)s->refused_dup_role);
    cJSON_AddNumberToObject(ref, "limit", (double)s->refused_limit);
    cJSON_AddNumberToObject(ref, "held", (double)s->refused_held);
    cJSON *cl = cJSON_AddObjectToObject(o, "closed");
    cJSON_AddNumberToObject(cl, "partner_timeout", (double)s->timeouts_partner);
    cJSON_AddNumberToObject(cl, "idle_timeout", (double)s->timeouts_idle);
    cJSON_AddNumberToObject(cl, "partner_gone", (double)s->partner_gone);
    cJSON *lim = cJSON_AddObjectToObject(o, "limits");
    cJSON_AddNumberToObject(lim, "max_bridges", r->cfg.max_bridges);
    cJSON_AddNumberToObject(lim, "max_per_addr", r->cfg.max_per_addr);
    cJSON_AddNumberToObject(lim, "pair_timeout_ms", r->cfg.pair_timeout_ms);
    cJSON_AddNumberToObject(lim, "idle_timeout_ms", r->cfg.idle_timeout_ms);
    cJSON_AddNumberToObject(lim, "ping_interval_ms", r->cfg.ping_interval_ms);
    cJSON_AddNumberToObject(lim, "max_msg_bytes", (double)r->cfg.max_msg_bytes);
    cJSON_AddNumberToObject(lim, "max_held", (double)r->cfg.max_held);
    cJSON_AddNumberToObject(lim, "max_held_total", (double)r->cfg.max_held_total);
    cJSON_AddNumberToObject(lim, "max_fragments", r->cfg.max_fragments);
    cJSON_AddNumberToObject(lim, "max_assembly", (double)r->cfg.max_assembly);
    cJSON_AddNumberToObject(lim, "max_conns_per_addr", r->cfg.max_conns_per_addr);
    cJSON_AddBoolToObject(o, "tls", !r->cfg.plain);
    return o;
}

static char *metrics_text(struct kvd_relay *r, size_t *len)
{
    struct kvd_relay_stats snap;
    kvd_relay_get_stats(r, &snap);
    const struct kvd_relay_stats *s = &snap;
    char *buf = NULL;
    size_t cap = 0;
    FILE *f = open_memstream(&buf, &cap);
    if (!f)
        return NULL;
    fprintf(f, "# HELP kvasir_relay_connections Open WebSocket connections.\n"
               "# TYPE kvasir_relay_connections gauge\nkvasir_relay_connections %" PRIu64 "\n",
            s->connections);
    fprintf(f, "# HELP kvasir_relay_bridges Bridges by state.\n# TYPE kvasir_relay_bridges gauge\n"
               "kvasir_relay_bridges{state=\"paired\"} %" PRIu64 "\n"
               "kvasir_relay_bridges{state=\"waiting\"} %" PRIu64 "\n", s->paired, s->waiting);
    fprintf(f, "# HELP kvasir_relay_pairings_total Bridges that got both ends.\n"
               "# TYPE kvasir_relay_pairings_total counter\nkvasir_relay_pairings_total %" PRIu64 "\n",
            s->pairings_total);
    fprintf(f, "# HELP kvasir_relay_messages_total Messages forwarded.\n"
               "# TYPE kvasir_relay_messages_total counter\nkvasir_relay_messages_total %" PRIu64 "\n",
            s->messages_total);
    fprintf(f, "# HELP kvasir_relay_bytes_total Payload bytes forwarded.\n"
               "# TYPE kvasir_relay_bytes_total counter\nkvasir_relay_bytes_total %" PRIu64 "\n",
            s->bytes_total);
    fprintf(f, "# HELP kvasir_relay_held_bytes Bytes held for ends still waiting for a partner.\n"
               "# TYPE kvasir_relay_held_bytes gauge\nkvasir_relay_held_bytes %" PRIu64 "\n",
            s->held_bytes);
    fprintf(f, "# HELP kvasir_relay_queued_bytes Bytes queued toward ends, not yet sent.\n"
               "# TYPE kvasir_relay_queued_bytes gauge\nkvasir_relay_queued_bytes %" PRIu64 "\n",
            s->queued_bytes);
    fprintf(f, "# HELP kvasir_relay_refused_total Connections refused, by reason.\n"
               "# TYPE kvasir_relay_refused_total counter\n"
               "kvasir_relay_refused_total{reason=\"bad_bridge\"} %" PRIu64 "\n"
               "kvasir_relay_refused_total{reason=\"bad_role\"} %" PRIu64 "\n"
               "kvasir_relay_refused_total{reason=\"dup_role\"} %" PRIu64 "\n"
               "kvasir_relay_refused_total{reason=\"limit\"} %" PRIu64 "\n"
               "kvasir_relay_refused_total{reason=\"held\"} %" PRIu64 "\n"
               "kvasir_relay_refused_total{reason=\"http_per_addr\"} %" PRIu64 "\n"
               "kvasir_relay_refused_total{reason=\"http_conns\"} %" PRIu64 "\n",
            s->refused_bad_bridge, s->refused_bad_role, s->refused_dup_role, s->refused_limit,
            s->refused_held, s->http_refused_addr, s->http_refused_conns);
    fprintf(f, "# HELP kvasir_relay_held_bytes_by_kind Bytes the relay holds, by kind.\n"
               "# TYPE kvasir_relay_held_bytes_by_kind gauge\n"
               "kvasir_relay_held_bytes_by_kind{kind=\"unpaired\"} %" PRIu64 "\n"
               "kvasir_relay_held_bytes_by_kind{kind=\"queued\"} %" PRIu64 "\n"
               "kvasir_relay_held_bytes_by_kind{kind=\"assembling\"} %" PRIu64 "\n",
            s->held_bytes, s->queued_bytes, s->assembling_bytes);
    fprintf(f, "# HELP kvasir_relay_http_connections Open connections, every kind (handshaking, "
               "plain requests, upgraded).\n# TYPE kvasir_relay_http_connections gauge\n"
               "kvasir_relay_http_connections %" PRIu64 "\n", s->http_conns);
    fprintf(f, "# HELP kvasir_relay_http_timeouts_total Connections closed by a deadline "
               "(handshake, headers, body, idle, write stall).\n"
               "# TYPE kvasir_relay_http_timeouts_total counter\n"
               "kvasir_relay_http_timeouts_total %" PRIu64 "\n", s->http_timeouts);
    struct top_addrs top;
    top_addrs_get(r, &top);
    fprintf(f, "# HELP kvasir_relay_addr_connections Open connections from the %d busiest "
               "addresses (IPv6: /64).\n# TYPE kvasir_relay_addr_connections gauge\n", TOP_ADDRS);
    for (size_t i = 0; i < top.n; i++)
        fprintf(f, "kvasir_relay_addr_connections{addr=\"%s\"} %u\n", top.a[i].addr, top.a[i].n);
    fprintf(f, "# HELP kvasir_relay_closed_total Ends closed by the relay, by reason.\n"
               "# TYPE kvasir_relay_closed_total counter\n"
               "kvasir_relay_closed_total{reason=\"partner_timeout\"} %" PRIu64 "\n"
               "kvasir_relay_closed_total{reason=\"idle_timeout\"} %" PRIu64 "\n"
               "kvasir_relay_closed_total{reason=\"partner_gone\"} %" PRIu64 "\n",
            s->timeouts_partner, s->timeouts_idle, s->partner_gone);
    fprintf(f, "# HELP kvasir_relay_max_bridges Configured bridge limit.\n"
               "# TYPE kvasir_relay_max_bridges gauge\nkvasir_relay_max_bridges %u\n",
            r->cfg.max_bridges);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    *len = cap;
    return buf;
}

static void on_get(struct net_ws_server *srv, const char *path, struct net_ws_reply *rep, void *ud)
{
    struct kvd_relay *r = ud;
    if (!strcmp(path, "/v1/relay/status")) {
        cJSON *o = stats_json(r);
        char *s = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        if (!s) {
            rep->status = 500;
            return;
        }
        size_t n = strlen(s);
        rep->body = malloc(n + 2);
        if (!rep->body) {
            free(s);
            rep->status = 500;
            return;
        }
        memcpy(rep->body, s, n);
        rep->body[n] = '\n';
        rep->body[n + 1] = 0;
        free(s);
        rep->body_len = n + 1;
        rep->status = 200;
        rep->content_type = "application/json";
    } else if (!strcmp(path, "/metrics")) {
        rep->body = metrics_text(r, &rep->body_len);
        rep->status = rep->body ? 200 : 500;
        rep->content_type = "text/plain; version=0.0.4; charset=utf-8";
    } else if (!strcmp(path, "/") || !strcmp(path, "/healthz")) {
        rep->body = strdup("kvasir relay\n");
        rep->body_len = rep->body ? strlen(rep->body) : 0;
        rep->status = 200;
    }
}

/* ---------------------------------------------------------------- periodic checks */

static void on_tick(uv_timer_t *t)
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

/* ---------------------------------------------------------------- lifecycle */

static uint32_t min_u32(uint32_t a, uint32_t b)
{
    return a < b ? a : b;
}

/* The HTTP server's own lines (refused connections, dropped slow readers; rate-limited). */
static void http_log(void *ud, const char *line)
{
    relay_log(ud, KVD_LOG_WARN, "%s", line);
}

/* Plain HTTP requests (status, metrics; bridges are upgrades, logged per end): one line each. */
static void access_log(void *ud, const struct net_http_access *a)
{
    struct kvd_relay *r = ud;
    if (!r->cfg.quiet || a->status >= 500)
        kvd_log_access(a);
}

int kvd_relay_new(struct kvd_relay **out, struct uv_loop_s *loop,
                  const struct kvd_relay_config *cfg, char *err, size_t errlen)
{
    *out = NULL;
    struct kvd_relay *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    r->loop = loop;
    r->cfg = *cfg;
    struct kvd_relay_config *c = &r->cfg;
    if (!c->max_bridges) c->max_bridges = 4096;
    if (!c->max_per_addr) c->max_per_addr = 64;
    if (!c->pair_timeout_ms) c->pair_timeout_ms = 30000;
    if (!c->idle_timeout_ms) c->idle_timeout_ms = 90000;
    if (!c->ping_interval_ms) c->ping_interval_ms = 20000;
    if (!c->max_msg_bytes) c->max_msg_bytes = 16u << 20;
    if (!c->high_water) c->high_water = 64u << 10;
    if (!c->max_held) c->max_held = 1u << 20;
    if (!c->max_held_total) c->max_held_total = 64u << 20;
    if (!c->max_conns_per_addr) {
        uint64_t n = 2ull * c->max_per_addr + 16;
        c->max_conns_per_addr = n > (1u << 24) ? (1u << 24) : (uint32_t)n;
    }
    if (!c->max_fragments) c->max_fragments = 1024;
    if (!c->max_assembly) c->max_assembly = 256ull << 20;
    if (c->max_bridges > (1u << 24)) {
        snprintf(err, errlen, "max_bridges %u over the limit %u", c->max_bridges, 1u << 24);
        free(r);
        return -EINVAL;
    }
    if (c->max_msg_bytes > (1u << 30)) {
        snprintf(err, errlen, "max_msg_bytes %" PRIu64 " over the limit %u", c->max_msg_bytes,
                 1u << 30);
        free(r);
        return -EINVAL;
    }
    r->n_buckets = 64;
    while (r->n_buckets < c->max_bridges)
        r->n_buckets *= 2;
    r->buckets = calloc(r->n_buckets, sizeof *r->buckets);
    if (!r->buckets) {
        snprintf(err, errlen, "out of memory for %zu bridge slots", r->n_buckets);
        free(r);
        return -ENOMEM;
    }
    int rc;
    if (!c->plain) {
        rc = net_tls_ctx_server_new(&r->tls, c->tls_cert, c->tls_key, err, errlen);
        if (rc < 0)
            goto fail;
    }
    /* two ends per bridge, plus room for connections still in their handshake */
    uint64_t conns = 2ull * c->max_bridges + 1024;
    struct net_ws_limits lim = {.max_msg_bytes = c->max_msg_bytes, .low_water = c->high_water / 4,
                                .max_conns = conns > (1u << 24) ? (1u << 24) : (uint32_t)conns,
                                .max_fragments = c->max_fragments, .max_assembly = c->max_assembly,
                                .max_conns_per_addr = c->max_conns_per_addr,
                                .header_timeout_ms = c->header_timeout_ms,
                                .write_timeout_ms = c->write_timeout_ms};
    static const struct net_ws_server_handlers sh = {.on_upgrade = on_upgrade, .on_get = on_get};
    rc = net_ws_server_new(&r->srv, loop, c->listen, r->tls, &lim, &sh, r, err, errlen);
    if (rc < 0)
        goto fail;
    net_http_server_set_log(net_ws_server_http(r->srv), http_log, r);
    net_http_server_set_access_log(net_ws_server_http(r->srv), access_log, r);
    uv_timer_init(loop, &r->tick);
    r->tick.data = r;
    uint32_t period = min_u32(min_u32(c->pair_timeout_ms, c->idle_timeout_ms), c->ping_interval_ms) / 4;
    if (period < 20) period = 20;
    if (period > 1000) period = 1000;
    uv_timer_start(&r->tick, on_tick, period, period);
    *out = r;
    return 0;
fail:
    net_tls_ctx_free(r->tls);
    free(r->buckets);
    free(r);
    return rc;
}

int kvd_relay_port(const struct kvd_relay *r)
{
    return net_ws_server_port(r->srv);
}

void kvd_relay_get_stats(const struct kvd_relay *r, struct kvd_relay_stats *out)
{
    *out = r->st;
    out->queued_bytes = 0;
    for (const struct relay_end *e = r->ends; e; e = e->next)
        out->queued_bytes += net_ws_pending(e->ws);
    if (r->closing)
        return; /* the server may be gone */
    out->assembling_bytes = net_ws_server_assembling(r->srv);
    const struct net_http_stats *h = net_http_server_stats(net_ws_server_http(r->srv));
    out->http_conns = h->conns_open;
    out->http_addrs = h->addrs;
    out->http_refused_addr = h->conns_refused_addr;
    out->http_refused_conns = h->conns_refused;
    out->http_timeouts = h->timeouts_handshake + h->timeouts_header + h->timeouts_body +
                         h->timeouts_idle + h->timeouts_write;
}

static void tick_closed(uv_handle_t *h)
{
    struct kvd_relay *r = h->data;
    r->tick_closed = true;
    free(r->buckets);
    r->buckets = NULL;
    relay_maybe_free(r);
}

static void srv_closed(void *ud)
{
    struct kvd_relay *r = ud;
    r->srv_closed = true;
    relay_maybe_free(r);
}

void kvd_relay_close(struct kvd_relay *r, void (*done)(void *ud), void *ud)
{
    if (!r || r->closing)
        return;
    r->closing = true;
    r->done = done;
    r->done_ud = ud;
    /* Ends see their connections drop; the server frees itself once they are gone. The
     * bridge table is no longer consulted after this. */
    for (size_t i = 0; i < r->n_buckets; i++) {
        for (struct relay_bridge *b = r->buckets[i]; b; b = b->hnext)
            for (int k = 1; k <= 2; k++)
                if (b->end[k])
                    b->end[k]->b = NULL;
        while (r->buckets[i]) {
            struct relay_bridge *b = r->buckets[i];
            r->buckets[i] = b->hnext;
            free(b);
        }
    }
    net_ws_server_close(r->srv, srv_closed, r);
    uv_timer_stop(&r->tick);
    uv_close((uv_handle_t *)&r->tick, tick_closed);
}

/* ---------------------------------------------------------------- kvd --role relay */

static void relay_stop(void *ud)
{
    kvd_relay_close(ud, NULL, NULL);
}

static void relay_usage(FILE *f)
{
    fprintf(f,
            "usage: kvd --role relay --listen HOST:PORT (--tls-cert PEM --tls-key PEM | --plain)\n"
            "           [--max-bridges N] [--max-per-addr N] [--pair-timeout MS]\n"
            "           [--idle-timeout MS] [--ping-interval MS] [--max-msg BYTES]\n"
            "           [--high-water BYTES] [--max-held BYTES] [--max-held-total BYTES]\n"
            "           [--max-fragments N] [--max-assembly BYTES] [--max-conns-per-addr N]\n"
            "           [--header-timeout MS] [--write-timeout MS] [--quiet]\n"
            "Pairs the two ends of each ring edge on wss://HOST:PORT/v1/bridge/<id>.\n"
            "GET /v1/relay/status (JSON) and /metrics (Prometheus) report counts.\n");
}

static int parse_u64(const char *opt, const char *s, uint64_t max, uint64_t *out)
{
    if (util_parse_u64(s, 0, max, 0, out, NULL, 0) < 0) {
        fprintf(stderr, "kvd relay: %s \"%s\": expected a whole number up to %" PRIu64 "\n", opt, s, max);
        return -EINVAL;
    }
    return 0;
}

/* The numeric options: each a whole number up to max, stored into a field of the config of
 * the given width (4 or 8 bytes). */
struct relay_num_opt {
    const char *name;
    uint64_t max;
    size_t off, size;
};
#define NUM_OPT(n, max, field) {n, max, offsetof(struct kvd_relay_config, field), \
                                sizeof(((struct kvd_relay_config *)0)->field)}
static const struct relay_num_opt num_opts[] = {
    NUM_OPT("max-bridges", 1u << 24, max_bridges),
    NUM_OPT("max-per-addr", 1u << 24, max_per_addr),
    NUM_OPT("pair-timeout", 86400000, pair_timeout_ms),
    NUM_OPT("idle-timeout", 86400000, idle_timeout_ms),
    NUM_OPT("ping-interval", 86400000, ping_interval_ms),
    NUM_OPT("max-msg", 1u << 30, max_msg_bytes),
    NUM_OPT("high-water", 1u << 30, high_water),
    NUM_OPT("max-held", 1u << 30, max_held),
    NUM_OPT("max-held-total", 1ull << 40, max_held_total),
    NUM_OPT("max-fragments", 1u << 24, max_fragments),
    NUM_OPT("max-assembly", 1ull << 40, max_assembly),
    NUM_OPT("max-conns-per-addr", 1u << 24, max_conns_per_addr),
    NUM_OPT("header-timeout", 86400000, header_timeout_ms),
    NUM_OPT("write-timeout", 86400000, write_timeout_ms),
};
#undef NUM_OPT
#define N_NUM_OPTS (sizeof num_opts / sizeof num_opts[0])

static int set_num_opt(struct kvd_relay_config *cfg, const struct relay_num_opt *o, const char *s)
{
    uint64_t v;
    char name[48];
    snprintf(name, sizeof name, "--%s", o->name);
    if (parse_u64(name, s, o->max, &v)) return -EINVAL;
    uint8_t *f = (uint8_t *)cfg + o->off;
    if (o->size == sizeof(uint32_t)) {
        uint32_t w = (uint32_t)v;
        memcpy(f, &w, sizeof w);
    } else {
        assert(o->size == sizeof(uint64_t));
        memcpy(f, &v, sizeof v);
    }
    return 0;
}

enum { O_ROLE = 1, O_LISTEN, O_CERT, O_KEY, O_PLAIN, O_QUIET, O_HELP, O_LOG, O_NUM = 0x100 };
static const struct option fixed[] = {
    {"role", required_argument, 0, O_ROLE},
    {"listen", required_argument, 0, O_LISTEN},
    {"tls-cert", required_argument, 0, O_CERT},
    {"tls-key", required_argument, 0, O_KEY},
    {"plain", no_argument, 0, O_PLAIN},
    {"quiet", no_argument, 0, O_QUIET},
    {"log-level", required_argument, 0, O_LOG},
    {"help", no_argument, 0, O_HELP},
};

const struct kvd_optspec *kvd_relay_optspecs(void)
{
    static struct kvd_optspec specs[sizeof fixed / sizeof fixed[0] + N_NUM_OPTS + 1];
    if (!specs[0].name) {
        size_t n = 0;
        for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
            if (fixed[i].val != O_HELP && fixed[i].val != O_ROLE)
                specs[n++] = (struct kvd_optspec){fixed[i].name, fixed[i].has_arg == required_argument, false};
        for (size_t i = 0; i < N_NUM_OPTS; i++)
            specs[n++] = (struct kvd_optspec){num_opts[i].name, true, false};
    }
    return specs;
}

int kvd_relay_main(int argc, char **argv)
{
    struct kvd_relay_config cfg = {0};
    struct option opts[sizeof fixed / sizeof fixed[0] + N_NUM_OPTS + 1];
    size_t n = 0;
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) opts[n++] = fixed[i];
    for (size_t i = 0; i < N_NUM_OPTS; i++)
        opts[n++] = (struct option){num_opts[i].name, required_argument, 0, O_NUM + (int)i};
    opts[n] = (struct option){0, 0, 0, 0};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c >= O_NUM && c < O_NUM + (int)N_NUM_OPTS) {
            if (set_num_opt(&cfg, &num_opts[c - O_NUM], optarg)) return 2;
            continue;
        }
        switch (c) {
        case O_ROLE:
            if (strcmp(optarg, "relay") != 0) {
                fprintf(stderr, "kvd relay: --role %s: this entry point runs only the relay\n", optarg);
                return 2;
            }
            break;
        case O_LISTEN: cfg.listen = optarg; break;
        case O_CERT: cfg.tls_cert = optarg; break;
        case O_KEY: cfg.tls_key = optarg; break;
        case O_PLAIN: cfg.plain = true; break;
        case O_QUIET: cfg.quiet = true; break;
        case O_LOG: {
            int level = kvd_log_level_parse(optarg);
            if (level < 0) {
                fprintf(stderr, "kvd relay: --log-level '%s' is not error|warn|info|debug\n", optarg);
                return 2;
            }
            kvd_log_set_level(level);
            break;
        }
        case O_HELP:
            relay_usage(stdout);
            return 0;
        default:
            relay_usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kvd relay: unexpected argument \"%s\"\n", argv[optind]);
        return 2;
    }
    if (!cfg.listen) {
        fprintf(stderr, "kvd relay: --listen HOST:PORT is required\n");
        relay_usage(stderr);
        return 2;
    }
    if (!cfg.plain && (!cfg.tls_cert || !cfg.tls_key)) {
        fprintf(stderr, "kvd relay: --tls-cert and --tls-key are required (or --plain for ws://)\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    kvd_log_set_prefix("relay");
    uv_loop_t *loop = uv_default_loop();
    char err[KV_ERR_MAX];
    struct kvd_relay *main_relay;
    int rc = kvd_relay_new(&main_relay, loop, &cfg, err, sizeof err);
    if (rc < 0) {
        kvd_log(KVD_LOG_ERROR, "%s", err);
        return 1;
    }
    kvd_log(KVD_LOG_INFO, "listening on %s port %d (%s)", cfg.listen, kvd_relay_port(main_relay),
            cfg.plain ? "plain ws" : "TLS");
    char status[128];
    snprintf(status, sizeof status, "relay on port %d", kvd_relay_port(main_relay));
    kvd_role_run(loop, status, relay_stop, main_relay);
    uv_loop_close(loop);
    return 0;
}

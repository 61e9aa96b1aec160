/* kvd/relay/internal.h — cross-file internals of the relay role: pairs two WebSocket ends by
 * bridge id and opposite roles, then forwards binary messages between them. Everything runs
 * on one libuv loop.
 *
 * Memory per bridge stays bounded: an end whose partner has more than high_water bytes
 * queued stops being read (TCP then slows its sender) until the partner drains below the
 * low-water mark; an end without a partner yet may hold up to high_water bytes, then it
 * too stops being read. Limits and timeouts are checked by one periodic timer.
 *
 * The files form an order, each using only the ones below it:
 *   bridge.c    ends and bridges: pairing, forwarding, holding, the periodic checks
 *   status.c    the plain HTTP side: counters, status, metrics, health
 *   relay.c     the relay's life (new, close) and `kvd --role relay` */
#ifndef KV_KVD_RELAY_INTERNAL_H
#define KV_KVD_RELAY_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "kvd/kvd.h"
#include "net/net.h"

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
void kvd_relay__maybe_free(struct kvd_relay *r);
/* The relay's lines go to kvd's log (prefix "relay"); --quiet keeps only warnings and errors. */
void kvd_relay__log(struct kvd_relay *r, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The WebSocket server's upgrade handler (srv_ud: the relay): a bridge end, or a refusal. */
int kvd_relay__on_upgrade(struct net_ws_server *srv, struct net_ws *ws, const char *path,
                          const struct net_ws_handlers **h, void **ud, void *srv_ud);
/* The periodic timer (t->data: the relay): pairing and idle timeouts, pings. */
void kvd_relay__on_tick(uv_timer_t *t);
/* The server's plain GET handler (ud: the relay): status, metrics, health. */
void kvd_relay__on_get(struct net_ws_server *srv, const char *path, struct net_ws_reply *rep, void *ud);

#endif

/* link.c — the stage's two ring links: the successor dialled (out), the predecessor accepted
 * or, behind a relay:// endpoint, dialled through the relay (in). Each starts with the
 * handshake (net_handshake: manifest, ranks, node keys); established links pass their frames
 * to frames.c; a broken link fails the sessions that crossed it and is re-dialled with
 * backoff. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvd/kvd.h"
#include "kvd/stage/internal.h"
#include "net/net.h"
#include "util/err.h"

static void on_established(struct conn *c)
{
    struct stage *st = c->st;
    const struct net_hello *p = net_handshake_peer(c->hs);
    c->peer_rank = p->rank;
    net_handshake_free(c->hs);
    c->hs = NULL;
    if (c->role == CONN_PENDING) {
        struct conn **pp = &st->pending;
        while (*pp && *pp != c)
            pp = &(*pp)->next;
        if (*pp)
            *pp = c->next;
        c->next = NULL;
        if (st->in) {
            char msg[300];
            snprintf(msg, sizeof msg, "rank %u already has a predecessor link (from %s); refusing a second one",
                     st->rank, net_link_peer(st->in->link));
            c->role = CONN_IN;   /* for the log line only; it never becomes st->in */
            c->up = true;
            kvd_conn_violation(c, "%s", msg);
            c->up = false;
            return;
        }
        c->role = CONN_IN;
        st->in = c;
        if (c->relay_in)
            st->redial_in_ms = 0;
    } else {
        st->redial_ms = 0;
    }
    c->up = true;
    c->last_rx_ms = (uint64_t)util_now_ms();
    net_link_set_max_payload(c->link, st->max_payload);   /* boundary frames from now on */
    kvd_log(KVD_LOG_INFO, "link %s up: rank %u at %s", c->role == CONN_OUT ? "out" : "in",
            c->peer_rank, net_link_peer(c->link));
    if (c->role == CONN_OUT)
        kvd_conn_ping(c);   /* a first RTT right away */
}

static void on_frame(struct net_link *l, const struct net_frame_hdr *h, const uint8_t *payload)
{
    struct conn *c = net_link_ud(l);
    c->last_rx_ms = (uint64_t)util_now_ms();
    if (c->up) {
        kvd_frame_handle(c, h, payload);
        return;
    }
    if (!c->hs)
        return;
    const uint8_t *out;
    size_t outlen;
    char err[KV_ERR_MAX];
    int rc = net_handshake_feed(c->hs, h, payload, &out, &outlen, err, sizeof err);
    if (rc < 0) {
        kvd_log(KVD_LOG_WARN, "link %s (%s): handshake failed: %s", c->role == CONN_OUT ? "out" : "in",
                net_link_peer(l), err);
        if (rc != -ECONNREFUSED)
            kvd_conn_send_error(c, 0, 2, err);
        kvd_conn_close(c, err);
        return;
    }
    if (outlen)
        net_link_send_raw(l, out, outlen);
    if (rc == 1)
        on_established(c);
}

static void start_handshake(struct conn *c, uint32_t expect_rank)
{
    struct stage *st = c->st;
    struct net_hello mine = {.version = NET_VERSION, .rank = st->rank, .n_ranks = st->n};
    snprintf(mine.ring, sizeof mine.ring, "%s", st->m.ring);
    memcpy(mine.manifest_hash, st->m.hash, 32);
    struct net_hs_expect x = {.rank = expect_rank, .n_ranks = st->n, .ring = st->m.ring};
    memcpy(x.manifest_hash, st->m.hash, 32);
    if (st->m.ranks[expect_rank].has_node) {
        x.check_key = true;
        memcpy(x.node_key, st->m.ranks[expect_rank].node, 32);
    }
    if (net_handshake_new(&c->hs, st->id, &mine, &x) < 0) {
        kvd_conn_close(c, "handshake set-up failed");
        return;
    }
    const uint8_t *b;
    size_t n;
    net_handshake_hello(c->hs, &b, &n);
    net_link_send_raw(c->link, b, n);
}

static void on_open(struct net_link *l, int status)
{
    struct conn *c = net_link_ud(l);
    if (status == 0)
        start_handshake(c, c->role == CONN_OUT ? c->st->succ : c->st->pred);
}


static void redial_in_cb(uv_timer_t *t)
{
    struct stage *st = t->data;
    if (!st->shutting_down && !st->in)
        kvd_link_dial_in(st);
}

static void redial_cb(uv_timer_t *t)
{
    struct stage *st = t->data;
    if (!st->shutting_down && !st->out)
        kvd_link_dial_out(st);
}

static void on_close(struct net_link *l, const char *reason)
{
    struct conn *c = net_link_ud(l);
    struct stage *st = c->st;
    if (c->up || c == st->in || c == st->out) {
        char msg[400];
        const char *peer = net_link_peer(l);
        if (c->role == CONN_OUT)
            snprintf(msg, sizeof msg, "ring link rank %u -> rank %u (%s) broke: %s", st->rank, st->succ,
                     peer, reason);
        else
            snprintf(msg, sizeof msg, "ring link rank %u -> rank %u (from %s) broke: %s", st->pred,
                     st->rank, peer, reason);
        if (c->up)
            kvd_log(st->shutting_down ? KVD_LOG_INFO : KVD_LOG_WARN, "%s", msg);
        if (c == st->in)
            st->in = NULL;
        if (c == st->out)
            st->out = NULL;
        if (c->up && !st->shutting_down)
            kvd_sess_fail_all(st, msg);
    } else if (c->role == CONN_PENDING) {
        struct conn **pp = &st->pending;
        while (*pp && *pp != c)
            pp = &(*pp)->next;
        if (*pp)
            *pp = c->next;
        kvd_log(KVD_LOG_WARN, "link from %s closed during the handshake: %s", net_link_peer(l), reason);
    }
    if (c->relay_in && !st->shutting_down) {
        st->redial_in_ms = st->redial_in_ms ? (st->redial_in_ms * 2 > 2000 ? 2000 : st->redial_in_ms * 2) : 100;
        uv_timer_start(&st->redial_in, redial_in_cb, st->redial_in_ms, 0);
    }
    if (c->role == CONN_OUT && !st->shutting_down) {
        if (!c->up)
            kvd_log(KVD_LOG_DEBUG, "dial rank %u failed: %s", st->succ, reason);
        st->redial_ms = st->redial_ms ? (st->redial_ms * 2 > 2000 ? 2000 : st->redial_ms * 2) : 100;
        uv_timer_start(&st->redial, redial_cb, st->redial_ms, 0);
    }
    net_handshake_free(c->hs);
    free(c);
}

const struct net_link_cbs kvd_link_cbs = {.on_open = on_open, .on_frame = on_frame, .on_close = on_close};

void kvd_link_dial_out(struct stage *st)
{
    struct conn *c = calloc(1, sizeof *c);
    if (!c)
        return;
    c->st = st;
    c->role = CONN_OUT;
    char err[KV_ERR_MAX];
    int rc = net_link_dial(&c->link, st->loop, st->m.ranks[st->succ].endpoint, &kvd_link_cbs, c,
                           HS_MAX_PAYLOAD, err, sizeof err);
    if (rc < 0) {
        kvd_log(KVD_LOG_ERROR, "cannot dial %s: %s", st->m.ranks[st->succ].endpoint, err);
        free(c);
        st->redial_ms = 2000;
        uv_timer_start(&st->redial, redial_cb, st->redial_ms, 0);
        return;
    }
    st->out = c;
}

/* A stage whose own endpoint is relay:// accepts nothing: it dials the relay as the
 * downstream end of its in-edge and treats that link like an accepted one. */
void kvd_link_dial_in(struct stage *st)
{
    const char *ep = st->m.ranks[st->rank].endpoint;
    char down[sizeof st->m.ranks[0].endpoint + 16];
    snprintf(down, sizeof down, "%s?role=down", ep);
    struct conn *c = calloc(1, sizeof *c);
    if (!c)
        return;
    c->st = st;
    c->role = CONN_PENDING;
    c->relay_in = true;
    c->last_rx_ms = (uint64_t)util_now_ms();
    char err[KV_ERR_MAX];
    int rc = net_link_dial(&c->link, st->loop, down, &kvd_link_cbs, c, HS_MAX_PAYLOAD, err,
                           sizeof err);
    if (rc < 0) {
        kvd_log(KVD_LOG_ERROR, "cannot dial the relay at %s: %s", ep, err);
        free(c);
        st->redial_in_ms = 2000;
        uv_timer_start(&st->redial_in, redial_in_cb, st->redial_in_ms, 0);
        return;
    }
    c->next = st->pending;
    st->pending = c;
}

void kvd_link_on_accept(struct net_listener *ls, struct net_link *l, void *ud)
{
    struct stage *st = ud;
    uint32_t n = 0;
    for (struct conn *p = st->pending; p; p = p->next)
        n++;
    if (st->shutting_down || n >= MAX_PENDING_LINKS) {
        net_link_set_ud(l, NULL);
        struct conn *c = calloc(1, sizeof *c);
        if (!c) {
            net_link_close(l, "out of memory");   /* on_close needs a conn: see below */
            return;
        }
        c->st = st;
        c->role = CONN_PENDING;
        c->link = l;
        net_link_set_ud(l, c);
        c->next = st->pending;
        st->pending = c;
        kvd_log(KVD_LOG_WARN, "refusing link from %s: %s", net_link_peer(l),
                st->shutting_down ? "shutting down" : "too many links in handshake");
        net_link_close(l, "refused");
        return;
    }
    struct conn *c = calloc(1, sizeof *c);
    if (!c) {
        net_link_close(l, "out of memory");
        return;
    }
    c->st = st;
    c->role = CONN_PENDING;
    c->link = l;
    c->last_rx_ms = (uint64_t)util_now_ms();
    net_link_set_ud(l, c);
    c->next = st->pending;
    st->pending = c;
    kvd_log(KVD_LOG_DEBUG, "link from %s: handshake", net_link_peer(l));
    start_handshake(c, st->pred);
}

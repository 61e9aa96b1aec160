/* link.c — the stage's two ring links: the successor dialled (out), the predecessor accepted
 * or, behind a relay:// endpoint, dialled through the relay (in). Each starts with the
 * handshake (ring_handshake: manifest, ranks, node keys, the key exchange); an established
 * link seals every frame with its session keys and passes the frames it opens to frames.c; a
 * broken link fails the sessions that crossed it and is re-dialled with a backoff that only
 * a link that stayed up resets. Links in handshake are capped in all and per source address
 * (docs/security.md), and warnings about refused peers are rate-limited per address.
 *
 * Repair (docs/ring.md, "Repair"): the successor dialled is its manifest endpoint or, once that
 * fails, each standby that may serve its rank in turn; an accepted link reads the peer's HELLO
 * first, to expect the key of whichever node the manifest lets serve that rank, and a standby
 * that has no rank yet takes the one after its authenticated predecessor's. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#include "kvd/kvd.h"
#include "kvd/stage/internal.h"
#include "net/net.h"
#include "util/err.h"

/* The address part of a peer "ip:port" / "[v6]:port" into out[n]. */
static void peer_source(const char *peer, char *out, size_t n)
{
    const char *colon = strrchr(peer, ':');
    size_t k = colon ? (size_t)(colon - peer) : strlen(peer);
    snprintf(out, n, "%.*s", (int)k, peer);
}

/* A log line's hash, to tell repeats apart (0 is kept for "none"). */
static uint32_t line_hash(const char *s)
{
    uint64_t h = util_hash_str(s);
    uint32_t r = (uint32_t)(h ^ h >> 32);
    return r ? r : 1;
}

/* A warning about a peer from source address src (its port left out: "link from SRC: what").
 * Per source and per REJECT_LOG_MS: each distinct line once, at most REJECT_LOG_LINES lines;
 * the rest are counted, and the next line logged for that source says how many were left
 * out. A peer flooding refused links costs a few lines per interval. */
static void reject_log(struct stage *st, const char *peer, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void reject_log(struct stage *st, const char *peer, const char *fmt, ...)
{
    char src[64], what[500];
    peer_source(peer, src, sizeof src);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    uint64_t now = (uint64_t)util_now_ms();
    struct kvd_reject_log *e = NULL, *oldest = &st->links.rejects[0];
    for (int i = 0; i < REJECT_LOG_SOURCES; i++) {
        struct kvd_reject_log *r = &st->links.rejects[i];
        if (r->src[0] && !strcmp(r->src, src)) {
            e = r;
            break;
        }
        if (r->window_ms < oldest->window_ms)
            oldest = r;
    }
    if (!e) {
        e = oldest;
        memset(e, 0, sizeof *e);
        snprintf(e->src, sizeof e->src, "%s", src);
    }
    if (now - e->window_ms >= REJECT_LOG_MS) {
        e->window_ms = now;
        e->n_lines = 0;
    }
    uint32_t h = line_hash(what);
    for (uint32_t i = 0; i < e->n_lines; i++)
        if (e->lines[i] == h) {
            e->suppressed++;
            return;
        }
    if (e->n_lines >= REJECT_LOG_LINES) {
        e->suppressed++;
        return;
    }
    e->lines[e->n_lines++] = h;
    if (e->suppressed)
        kvd_log(KVD_LOG_WARN, "link from %s: %s (%u similar lines from %s left out)", src, what,
                e->suppressed, src);
    else
        kvd_log(KVD_LOG_WARN, "link from %s: %s", src, what);
    e->suppressed = 0;
}

/* The out link did not come up, or broke: keep the reason (the client's error and status
 * show it), tell rank 0 (a link report), and log it once per distinct reason, then once a
 * minute while it repeats, so a stage waiting for its successor says why (info while the
 * ring starts, warn after). */
static void out_failed(struct stage *st, const char *ep, const char *reason, bool logged)
{
    kvd_conn_note(st, st->rank, true, st->rank, reason);
    kvd_conn_report_out(st);
    uint32_t h = line_hash(reason);
    uint64_t now = (uint64_t)util_now_ms();
    if (h == st->links.out_fail_hash) {
        st->links.out_fail_n++;
        if (now - st->links.out_fail_log_ms < 60000)
            return;
    } else {
        st->links.out_fail_hash = h;
        st->links.out_fail_n = 1;
    }
    st->links.out_fail_log_ms = now;
    if (logged)
        return;
    bool starting = !st->links.out_was_up && now - st->start_ms < REPAIR_GRACE_MS;
    if (st->links.out_fail_n > 1)
        kvd_log(starting ? KVD_LOG_INFO : KVD_LOG_WARN, "link rank %u -> rank %u (%s) still down "
                "after %u attempts: %s", st->rank, st->succ, ep, st->links.out_fail_n, reason);
    else
        kvd_log(starting ? KVD_LOG_INFO : KVD_LOG_WARN, "link rank %u -> rank %u (%s) is down: %s "
                "(retrying)", st->rank, st->succ, ep, reason);
}

static void on_established(struct conn *c)
{
    struct stage *st = c->st;
    const struct ring_hello *p = ring_handshake_peer(c->hs);
    c->peer_rank = p->rank;
    if (c->role == CONN_PENDING && st->standby.waiting) {
        /* A standby's first predecessor, authenticated: take over the rank after it. */
        if (st->take_rank(st, c->as_rank) < 0) {
            kvd_conn_close(c, "taking over the rank failed");
            return;
        }
        st->links.out_was_up = true;   /* the ring ran: its successor may be dead too */
    } else if (c->role == CONN_PENDING && c->peer_rank != st->pred) {
        kvd_conn_violation(c, "rank %u is not this stage's predecessor (rank %u)", c->peer_rank, st->pred);
        return;
    }
    struct ring_link_keys keys;
    int rc = ring_handshake_keys(c->hs, &keys);
    if (rc == 0)
        rc = ring_link_set_keys(c->link, &keys);
    OPENSSL_cleanse(&keys, sizeof keys);
    ring_handshake_free(c->hs);
    c->hs = NULL;
    if (rc < 0) {
        kvd_conn_close(c, "installing the link's session keys failed");
        return;
    }
    if (c->role == CONN_PENDING) {
        struct conn **pp = &st->links.pending;
        while (*pp && *pp != c)
            pp = &(*pp)->next;
        if (*pp)
            *pp = c->next;
        c->next = NULL;
        if (st->links.in) {
            char msg[300];
            snprintf(msg, sizeof msg, "rank %u already has a predecessor link (from %s); refusing a second one",
                     st->rank, ring_link_peer(st->links.in->link));
            c->role = CONN_IN;   /* for the log line only; it never becomes st->links.in */
            c->up = true;
            kvd_conn_violation(c, "%s", msg);
            c->up = false;
            return;
        }
        c->role = CONN_IN;
        st->links.in = c;
        st->links.pred_wait_logged = false;
    }
    c->up = true;
    c->last_rx_ms = c->up_ms = (uint64_t)util_now_ms();
    ring_link_set_max_payload(c->link, st->max_payload);   /* boundary frames from now on */
    kvd_log(KVD_LOG_INFO, "link %s up: rank %u at %s", c->role == CONN_OUT ? "out" : "in",
            c->peer_rank, ring_link_peer(c->link));
    if (c->role == CONN_OUT) {
        st->links.out_was_up = true;
        st->links.out_fail_hash = 0;
        kvd_conn_note(st, st->rank, false, st->rank, NULL);
        kvd_conn_report_out(st);
        kvd_conn_ping(c);   /* a first RTT right away */
    } else if (st->rank == 0) {
        /* The ring is whole: every link in it is up, whatever report got lost on the way. */
        for (uint32_t r = 0; r < st->n; r++)
            kvd_conn_note(st, r, false, r, NULL);
    } else {
        kvd_conn_note(st, st->pred, false, st->pred, NULL);
        st->links.out_report_hash = 0;   /* a new predecessor hears the out link's next state */
    }
    if (c->role == CONN_IN && !st->links.out && !st->shutting_down &&
        !uv_is_active((uv_handle_t *)&st->links.redial))
        kvd_link_dial_out(st);   /* linked from rank 0 up to here: link the successor */
}

/* The key the manifest lets serve rank r that the peer's HELLO names, else the rank's own (the
 * handshake then refuses the peer's); NULL when the rank names no key (any key). */
static const uint8_t *expected_key(const struct stage *st, uint32_t r, const uint8_t hello_key[32])
{
    const struct ring_rank_info *ri = &st->m.ranks[r];
    if (!ri->has_node)
        return NULL;
    if (hello_key && ring_manifest_may_serve(&st->m, r, hello_key))
        return hello_key;
    return ri->node;
}

static void accept_hello(struct conn *c, const struct ring_frame_hdr *h, const uint8_t *payload);

static void on_frame(struct ring_link *l, const struct ring_frame_hdr *h, const uint8_t *payload)
{
    struct conn *c = ring_link_ud(l);
    if (c->up) {
        c->last_rx_ms = (uint64_t)util_now_ms();
        kvd_frame_handle(c, h, payload);
        return;
    }
    /* In handshake last_rx_ms stays the link's start: the deadline counts from there. */
    if (c->await_hello)
        accept_hello(c, h, payload);
    if (!c->hs)
        return;
    const uint8_t *out;
    size_t outlen;
    char err[KV_ERR_MAX];
    int rc = ring_handshake_feed(c->hs, h, payload, &out, &outlen, err, sizeof err);
    if (rc < 0) {
        /* The reason is logged when the link closes (out: once per distinct reason; in:
         * rate-limited per source). A refusal of ours goes to the peer first, in the clear
         * (no keys yet), so that its side logs why; a refusal of the peer's is not answered. */
        const char *refusal = ring_handshake_refusal(c->hs);
        char r[KV_ERR_MAX + 64];
        if (refusal && c->role == CONN_OUT)
            snprintf(r, sizeof r, "rank %u refused the link: %s", c->st->succ, refusal);
        else if (refusal)
            snprintf(r, sizeof r, "the peer refused the link: %s", refusal);
        else
            snprintf(r, sizeof r, "%s", err);
        if (rc != -ECONNREFUSED)
            kvd_conn_send_error(c, 0, RING_ERR_PROTO, err);
        kvd_conn_close(c, r);
        return;
    }
    if (!c->hello_ms && ring_handshake_hello_ok(c->hs))
        c->hello_ms = (uint64_t)util_now_ms();   /* its AUTH must follow (AUTH_AFTER_HELLO_MS) */
    if (outlen)
        ring_link_send_raw(l, out, outlen);
    if (rc == 1)
        on_established(c);
}

/* Start the handshake: our HELLO claims rank c->as_rank, the peer must be expect_rank with the
 * node key key (NULL: any). */
static void start_handshake(struct conn *c, uint32_t expect_rank, const uint8_t *key)
{
    struct stage *st = c->st;
    struct ring_hello mine = {.version = RING_VERSION, .rank = c->as_rank, .n_ranks = st->n};
    snprintf(mine.ring, sizeof mine.ring, "%s", st->m.ring);
    memcpy(mine.manifest_hash, st->m.hash, 32);
    struct ring_hs_expect x = {.rank = expect_rank, .n_ranks = st->n, .ring = st->m.ring};
    memcpy(x.manifest_hash, st->m.hash, 32);
    if (key) {
        x.check_key = true;
        memcpy(x.node_key, key, 32);
    }
    enum ring_hs_side side = c->role == CONN_OUT ? RING_HS_UP : RING_HS_DOWN;
    if (ring_handshake_new(&c->hs, st->id, &mine, &x, side) < 0) {
        kvd_conn_close(c, "handshake set-up failed");
        return;
    }
    const uint8_t *b;
    size_t n;
    ring_handshake_hello(c->hs, &b, &n);
    ring_link_send_raw(c->link, b, n);
}

/* The successor's k-th candidate: 0 its manifest entry, k > 0 the (k-1)-th standby that may
 * serve it, this node apart (endpoint and key; NULL key: any); false past the last. */
static bool out_target(const struct stage *st, uint32_t k, const char **ep, const uint8_t **key)
{
    const struct ring_rank_info *ri = &st->m.ranks[st->succ];
    if (k == 0) {
        *ep = ri->endpoint;
        *key = ri->has_node ? ri->node : NULL;
        return true;
    }
    for (uint32_t i = 0; i < st->m.n_standbys; i++)
        if ((st->m.standbys[i].ranks >> st->succ & 1) && (int)i != st->standby.index && --k == 0) {
            *ep = st->m.standbys[i].endpoint;
            *key = st->m.standbys[i].node;
            return true;
        }
    return false;
}

static void on_open(struct ring_link *l, int status)
{
    struct conn *c = ring_link_ud(l);
    struct stage *st = c->st;
    c->start_ms = (uint64_t)util_now_ms();   /* the handshake's deadline counts from here */
    if (status != 0)
        return;
    if (c->role == CONN_OUT) {
        const char *ep;
        const uint8_t *key;
        if (!out_target(st, st->links.out_target, &ep, &key))
            out_target(st, st->links.out_target = 0, &ep, &key);
        start_handshake(c, st->succ, key);
    } else {
        start_handshake(c, st->pred, expected_key(st, st->pred, NULL));
    }
}

/* An accepted link's first frame: the peer's HELLO says which key it claims. A stage expects
 * its predecessor with the key of any node the manifest lets serve that rank (its HELLO went
 * out on accept: only the expectation changes); a standby without a rank sends its HELLO only
 * now: it takes the rank after the peer's, if its entry lists it. Anything else meets the
 * usual handshake, which refuses it with the usual reason. */
static void accept_hello(struct conn *c, const struct ring_frame_hdr *h, const uint8_t *payload)
{
    struct stage *st = c->st;
    c->await_hello = false;
    struct ring_hello ph;
    char err[KV_ERR_MAX];
    bool ok = h->type == RING_F_HELLO &&
              ring_hello_decode(payload, h->payload_len, &ph, err, sizeof err) == 0 && ph.rank < st->n;
    if (!st->standby.waiting) {
        const uint8_t *key = expected_key(st, st->pred, ok ? ph.node_key : NULL);
        if (c->hs && key)
            ring_handshake_expect_key(c->hs, key);
        return;
    }
    uint32_t r = ok ? (ph.rank + 1) % st->n : 0;
    if (!ok || r == 0 || !(st->m.standbys[st->standby.index].ranks >> r & 1)) {
        reject_log(st, ring_link_peer(c->link), "a standby may not serve rank %u (after rank %u)", r,
                   ok ? ph.rank : 0);
        char msg[120];
        snprintf(msg, sizeof msg, "this standby may not serve rank %u (after rank %u)", r, ok ? ph.rank : 0);
        kvd_conn_send_error(c, 0, RING_ERR_PROTO, msg);
        kvd_conn_close(c, "not a rank this standby may serve");
        return;
    }
    /* A standby without a model file pulls the rank's window first (in the background): the
     * dialler is turned away until it is here and takes the rank on a later dial. */
    int pw = st->pull_window ? st->pull_window(st, r) : 1;
    if (pw <= 0) {
        kvd_conn_close(c, pw == 0 ? "pulling the window of that rank first; dial again"
                                  : "cannot pull the window of that rank");
        return;
    }
    c->as_rank = r;
    start_handshake(c, ph.rank, expected_key(st, ph.rank, ph.node_key));
}


static void redial_in_cb(uv_timer_t *t)
{
    struct stage *st = t->data;
    if (!st->shutting_down && !st->links.in)
        kvd_link_dial_in(st);
}

static void redial_cb(uv_timer_t *t)
{
    struct stage *st = t->data;
    if (!st->shutting_down && !st->links.out)
        kvd_link_dial_out(st);
}

/* The next redial delay: 100 ms after a link that stayed up, else doubled up to 2 s. */
static uint32_t backoff_next(uint32_t ms, bool stable)
{
    if (stable || ms == 0)
        return 100;
    return ms * 2 > 2000 ? 2000 : ms * 2;
}

static void on_close(struct ring_link *l, const char *reason)
{
    struct conn *c = ring_link_ud(l);
    struct stage *st = c->st;
    if (c->up || c == st->links.in || c == st->links.out) {
        char msg[400];
        const char *peer = ring_link_peer(l);
        if (c->role == CONN_OUT)
            snprintf(msg, sizeof msg, "ring link rank %u -> rank %u (%s) broke: %s", st->rank, st->succ,
                     peer, reason);
        else
            snprintf(msg, sizeof msg, "ring link rank %u -> rank %u (from %s) broke: %s", st->pred,
                     st->rank, peer, reason);
        if (c->up)
            kvd_log(st->shutting_down ? KVD_LOG_INFO : KVD_LOG_WARN, "%s", msg);
        kvd_status_link_closed(st);
        if (c->role != CONN_OUT) {   /* the out link's is kept below, with its redial */
            char why[KVD_REASON_MAX];
            snprintf(why, sizeof why, "%s%s", c->up ? "broke: " : "", reason);
            kvd_conn_note(st, st->pred, true, st->rank, why);
        }
        if (c == st->links.in)
            st->links.in = NULL;
        if (c == st->links.out)
            st->links.out = NULL;
        if (c->up && !st->shutting_down)
            kvd_sess_fail_all(st, msg, c->role == CONN_OUT);
        /* A stage without a predecessor lets its successor go too (after the sessions' ERRORs,
         * which name the link that broke, went out on it): the ring re-forms from rank 0
         * outwards (kvd_link_dial_out), so no node cut off upstream keeps a successor's
         * in-link that the node now serving its rank needs (docs/ring.md, "Repair"). */
        if (c->role != CONN_OUT && c->up && st->rank != 0 && st->links.out && !st->shutting_down)
            kvd_conn_close(st->links.out, "the predecessor's link broke: the ring links again from rank 0");
        /* A successor that did not link: try the next node that may serve its rank. */
        const char *ep;
        const uint8_t *key;
        /* Not while the ring starts (a successor not listening yet is no dead one), unless
         * the successor was up once or this node came to a running ring (a standby that took
         * over, a stage restarted) and has waited past the start. */
        bool may_rotate = st->links.out_was_up || (uint64_t)util_now_ms() - st->start_ms > REPAIR_GRACE_MS;
        /* A successor that went silent (a stopped process) would take the redial and then hang
         * in the handshake: try the next candidate for its rank first. */
        if (c->role == CONN_OUT && (!c->up || c->hung) && may_rotate) {
            if (out_target(st, ++st->links.out_target, &ep, &key))
                st->links.redial_ms = 0;   /* a new candidate: dialled after the shortest delay */
            else
                st->links.out_target = 0;
        }
    } else if (c->role == CONN_PENDING) {
        struct conn **pp = &st->links.pending;
        while (*pp && *pp != c)
            pp = &(*pp)->next;
        if (*pp)
            *pp = c->next;
        if (!c->relay_in) {
            reject_log(st, ring_link_peer(l), "handshake failed: %s", reason);
        } else {
            /* our in link through the relay: nothing upstream hears of it, so keep it here */
            kvd_conn_note(st, st->pred, true, st->rank, reason);
            bool unpaired = strstr(reason, "no partner") || strstr(reason, "no predecessor came");
            if (unpaired && ring_link_bytes_in(l) == 0 && !st->shutting_down) {
                /* nobody came through the relay: the predecessor does not run (yet), or cannot
                 * reach the relay; said once until the in-link comes up */
                if (!st->links.pred_wait_logged)
                    kvd_log(KVD_LOG_INFO, "waiting for rank %u (the predecessor) to link through "
                            "the relay %s (%s)", st->pred, ring_link_peer(l), reason);
                st->links.pred_wait_logged = true;
            } else {
                reject_log(st, ring_link_peer(l), "closed during the handshake: %s", reason);
            }
        }
    }
    /* Only a link that stayed up resets the backoff: a peer refused right after its handshake
     * (a second predecessor) keeps backing off instead of redialling ten times a second. */
    bool stable = c->up && (uint64_t)util_now_ms() - c->up_ms >= LINK_STABLE_MS;
    if (c->relay_in && !st->shutting_down) {
        st->links.redial_in_ms = backoff_next(st->links.redial_in_ms, stable);
        uv_timer_start(&st->links.redial_in, redial_in_cb, st->links.redial_in_ms, 0);
    }
    if (c->role == CONN_OUT && !st->shutting_down) {
        char why[KVD_REASON_MAX];
        snprintf(why, sizeof why, "%s%s", c->up ? "broke: " : "", reason);
        out_failed(st, ring_link_peer(l), why, c->up);
        st->links.redial_ms = backoff_next(st->links.redial_ms, stable);
        uv_timer_start(&st->links.redial, redial_cb, st->links.redial_ms, 0);
    }
    ring_handshake_free(c->hs);
    free(c);
}

const struct ring_link_cbs kvd_link_cbs = {.on_open = on_open, .on_frame = on_frame, .on_close = on_close};

void kvd_link_dial_out(struct stage *st)
{
    /* The ring links from rank 0 onwards: a stage dials its successor once its predecessor
     * linked it. So a node restarted while another serves its rank (nobody dials it) never
     * takes the successor's in-link from the node that serves the rank now (docs/ring.md,
     * "Repair"); on_established dials when the in-link comes up. */
    if (st->rank != 0 && !kvd_conn_in_up(st))
        return;
    struct conn *c = calloc(1, sizeof *c);
    if (!c)
        return;
    c->st = st;
    c->role = CONN_OUT;
    c->as_rank = st->rank;
    const char *ep;
    const uint8_t *key;
    if (!out_target(st, st->links.out_target, &ep, &key))
        out_target(st, st->links.out_target = 0, &ep, &key);
    if (st->links.out_target)
        kvd_log(KVD_LOG_INFO, "dialling standby %s for rank %u", ep, st->succ);
    char err[KV_ERR_MAX];
    int rc = ring_link_dial(&c->link, st->loop, ep, &kvd_link_cbs, c, HS_MAX_PAYLOAD, err, sizeof err);
    if (rc < 0) {
        char why[KVD_REASON_MAX];
        snprintf(why, sizeof why, "cannot dial %.200s: %.290s", ep, err);
        out_failed(st, ep, why, false);
        free(c);
        st->links.redial_ms = 2000;
        uv_timer_start(&st->links.redial, redial_cb, st->links.redial_ms, 0);
        return;
    }
    st->links.out = c;
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
    c->as_rank = st->rank;
    c->last_rx_ms = (uint64_t)util_now_ms();
    char err[KV_ERR_MAX];
    int rc = ring_link_dial(&c->link, st->loop, down, &kvd_link_cbs, c, HS_MAX_PAYLOAD, err,
                           sizeof err);
    if (rc < 0) {
        kvd_log(KVD_LOG_ERROR, "cannot dial the relay at %s: %s", ep, err);
        free(c);
        st->links.redial_in_ms = 2000;
        uv_timer_start(&st->links.redial_in, redial_in_cb, st->links.redial_in_ms, 0);
        return;
    }
    c->next = st->links.pending;
    st->links.pending = c;
}

/* Whether p is a link in handshake that counts against the limits. */
static bool pending_counts(const struct conn *p)
{
    return !p->relay_in && p->link && !ring_link_is_closing(p->link);
}

/* Make room for a link from src: 0 when it may start its handshake, after closing one pending
 * link when a limit is reached: the oldest that has not sent a valid HELLO (from src first),
 * else the oldest from src (its cap reached) or from the source holding the most pending links
 * (the total reached). A valid HELLO proves nothing (it is built from the manifest's public
 * data), so links that passed it cannot hold the slots against a neighbour that restarts; one
 * needs about a round trip to send its AUTH. -EBUSY: nothing to close (cannot happen while a
 * limit is reached, kept for safety). */
static int pending_make_room(struct stage *st, const char *src)
{
    uint32_t total = 0, from_src = 0, most = 0;
    struct conn *idle_src = NULL, *idle_any = NULL, *oldest_src = NULL, *oldest_most = NULL;
    char s2[64], s3[64];
    for (struct conn *p = st->links.pending; p; p = p->next) {
        if (!pending_counts(p))
            continue;
        total++;
        peer_source(ring_link_peer(p->link), s2, sizeof s2);
        bool same = !strcmp(s2, src);
        from_src += same;
        bool idle = !p->hs || !ring_handshake_hello_ok(p->hs);
        /* the list is newest first: the last match is the oldest */
        if (idle && same)
            idle_src = p;
        if (idle)
            idle_any = p;
        if (same)
            oldest_src = p;
        uint32_t n = 0;   /* links from p's source (a few dozen at most: quadratic is fine) */
        for (struct conn *q = st->links.pending; q; q = q->next) {
            if (!pending_counts(q))
                continue;
            peer_source(ring_link_peer(q->link), s3, sizeof s3);
            n += !strcmp(s2, s3);
        }
        if (n >= most) {
            most = n;
            oldest_most = p;
        }
    }
    struct conn *v = NULL;
    if (from_src >= MAX_PENDING_PER_SOURCE)
        v = idle_src ? idle_src : oldest_src;
    else if (total >= MAX_PENDING_LINKS)
        v = idle_src ? idle_src : idle_any ? idle_any : oldest_most;
    else
        return 0;
    if (!v)
        return -EBUSY;
    bool idle = !v->hs || !ring_handshake_hello_ok(v->hs);
    reject_log(st, ring_link_peer(v->link), "closing it: %s, and a newer link needs its place",
               idle ? "no valid HELLO" : "the oldest in handshake from the busiest source (no AUTH yet)");
    kvd_conn_close(v, idle ? "evicted: no valid HELLO while others waited"
                           : "evicted: no AUTH yet, the oldest link in handshake from the busiest source");
    return 0;
}

/* An accepted link's conn, pending until its handshake ends, at the head of the pending list;
 * NULL when out of memory (the link is then closed: its on_close finds no conn). */
static struct conn *pending_add(struct stage *st, struct ring_link *l)
{
    struct conn *c = calloc(1, sizeof *c);
    if (!c) {
        ring_link_set_ud(l, NULL);
        ring_link_close(l, "out of memory");
        return NULL;
    }
    c->st = st;
    c->role = CONN_PENDING;
    c->link = l;
    c->last_rx_ms = c->start_ms = (uint64_t)util_now_ms();
    ring_link_set_ud(l, c);
    c->next = st->links.pending;
    st->links.pending = c;
    return c;
}

void kvd_link_on_accept(struct ring_listener *ls, struct ring_link *l, void *ud)
{
    struct stage *st = ud;
    char src[64];
    peer_source(ring_link_peer(l), src, sizeof src);
    bool full = !st->shutting_down && pending_make_room(st, src) < 0;
    struct conn *c = pending_add(st, l);
    if (!c)
        return;
    if (st->shutting_down || full) {
        const char *why = st->shutting_down ? "shutting down" : "too many links in handshake";
        reject_log(st, ring_link_peer(l), "refusing it: %s", why);
        char msg[80];
        snprintf(msg, sizeof msg, "rank %u takes no link now: %s", st->rank, why);
        kvd_conn_send_error(c, 0, RING_ERR_PROTO, msg);   /* the peer logs why (in the clear: no keys) */
        ring_link_close(l, "refused");
        return;
    }
    kvd_log(KVD_LOG_DEBUG, "link from %s: handshake", ring_link_peer(l));
    c->await_hello = true;   /* the peer's HELLO picks the key expected (accept_hello) */
    c->as_rank = st->rank;
    if (!st->standby.waiting)
        start_handshake(c, st->pred, expected_key(st, st->pred, NULL));
}

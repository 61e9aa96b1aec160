/* receipt.c — the stage's receipts of work (docs/market.md, "Receipts and credit"): per
 * session, the positions this stage ran through its window and the Merkle roots (ring's
 * ring_merkle_*) over the boundary rows it sent and received, one leaf per position. When the
 * session ends here, its receipts go as JSON lines to the file kvd_stage_opts.receipts names
 * (kvd join signs and submits them); without that option nothing is kept.
 *
 * Every rank sees the same session end (rank 0 finishes it, CLOSE goes round), so the two
 * signers of one receipt cut it at the same place: the sender's "sent" side names the
 * positions it ran and the root over what it sent; its successor's "received" side names the
 * positions it received and the root over those rows; rank 0 attests the last rank with the
 * positions rank 0 ran (every rank runs the same ones) and the root over the TOKEN payloads.
 * An ACT frame of n rows at pos is n leaves (pos .. pos + n - 1); a TOKEN frame at pos is one
 * leaf at pos - 1, the row whose logits it was sampled from, so both trees are over the
 * positions run. The rows also go to the stage's row log (rowlog.c), from which the node
 * answers the market's audits with proofs against these roots. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvd/stage/internal.h"

/* The leaves of one side, by absolute position (set[p]: a row came for p); vp_lo, vp_hi: the
 * rows of the last ACT frame of a verifying pass this side saw (0, 0: the last was none). */
struct leaves {
    uint8_t (*h)[32];
    uint8_t *set;
    uint32_t cap;
    uint32_t vp_lo, vp_hi;
};

struct kvd_receipt {
    struct leaves sent, recv;
    uint32_t t0, t1;            /* positions this stage ran: [t0, t1) */
    uint32_t r0, r1;            /* positions of the boundaries received (ranks > 0) */
    bool ran, got;
    bool broken;                /* a leaf could not be kept: no receipt of this session */
    uint32_t clear_below;       /* a replay's TOKEN leaves to clear at its first TOKEN (0: none) */
    int log;                    /* the session's row log (rowlog.c); -1: none */
    bool has_sampling;          /* the last edge's ends: the OPEN's sampling, folded into */
    uint8_t sampling[RING_SAMPLING_LEN];   /* that edge's digests (ring_receipt_fold) */
};

/* The session's receipt, made on first use; NULL when receipts are off or memory is short. */
static struct kvd_receipt *receipt_of(struct stage *st, struct sess *s)
{
    if (!st->o.receipts)
        return NULL;
    if (!s->receipt) {
        struct kvd_receipt *r = calloc(1, sizeof *r);
        if (!r)
            return NULL;
        r->log = kvd_rowlog_open(st, s->id);
        s->receipt = r;
    }
    return s->receipt;
}

/* Leaf pos of a side, the array grown to hold it (positions are below the session's context,
 * checked by the frame handler): 0 or -ENOMEM. */
static int leaf_put(struct leaves *l, uint32_t pos, const void *row, size_t len)
{
    if (pos >= l->cap) {
        uint32_t cap = l->cap ? l->cap : 64;
        while (cap <= pos)
            cap *= 2;
        uint8_t (*h)[32] = realloc(l->h, (size_t)cap * 32);
        if (!h)
            return -ENOMEM;
        l->h = h;
        uint8_t *set = realloc(l->set, cap);
        if (!set)
            return -ENOMEM;
        memset(set + l->cap, 0, cap - l->cap);
        l->set = set;
        l->cap = cap;
    }
    ring_merkle_leaf(pos, row, len, l->h[pos]);
    l->set[pos] = 1;
    return 0;
}

/* The root over positions [a, b): a position with no row is an empty row's leaf. */
static int leaves_root(struct leaves *l, uint32_t a, uint32_t b, uint8_t root[32])
{
    uint8_t (*v)[32] = malloc((size_t)(b - a) * 32 + 32);
    if (!v)
        return -ENOMEM;
    for (uint32_t p = a; p < b; p++) {
        if (p < l->cap && l->set[p])
            memcpy(v[p - a], l->h[p], 32);
        else
            ring_merkle_leaf(p, NULL, 0, v[p - a]);
    }
    int rc = ring_merkle_root((const uint8_t (*)[32])v, b - a, root);
    free(v);
    return rc;
}

static void extend(uint32_t *a, uint32_t *b, bool *any, uint32_t pos, uint32_t n)
{
    if (!*any || pos < *a)
        *a = pos;
    if (!*any || pos + n > *b)
        *b = pos + n;
    *any = true;
}

void kvd_receipt_ran(struct stage *st, struct sess *s, uint32_t pos, uint32_t n,
                     const int32_t *tokens)
{
    struct kvd_receipt *r = receipt_of(st, s);
    if (!r || !n)
        return;
    extend(&r->t0, &r->t1, &r->ran, pos, n);
    for (uint32_t i = 0; tokens && i < n; i++)   /* rank 0: the ids it embedded */
        kvd_rowlog_put(r->log, KVD_ROWLOG_TOKEN, pos + i, &tokens[i], 4);
}

void kvd_receipt_sampling(struct stage *st, struct sess *s, const uint8_t open[RING_OPEN_LEN])
{
    if (st->rank != 0 && !st->is_last)
        return;   /* not an end of the last edge */
    struct kvd_receipt *r = receipt_of(st, s);
    if (!r)
        return;
    memcpy(r->sampling, open, RING_SAMPLING_LEN);
    r->has_sampling = true;
    kvd_rowlog_put(r->log, KVD_ROWLOG_SAMPLING, 0, open, RING_SAMPLING_LEN);
}

void kvd_receipt_replayed(struct stage *st, struct sess *s, uint32_t n)
{
    struct kvd_receipt *r = s->receipt;
    if (r && st->is_last != (st->rank == 0))   /* one stage alone replays nothing */
        r->clear_below = n;
}

/* At the first TOKEN after a replay (rows_put): its history's TOKEN leaves cleared, the row log
 * told (an empty record: no row here). */
static void replay_clear(struct kvd_receipt *r, struct leaves *l, int kind)
{
    for (uint32_t p = 0; p + 1 < r->clear_below && p < l->cap; p++)
        if (l->set[p]) {
            l->set[p] = 0;
            kvd_rowlog_put(r->log, kind, p, NULL, 0);
        }
    r->clear_below = 0;
}

/* A frame's rows as leaves of one side and records of the row log: an ACT's n rows at pos.., a
 * TOKEN's summary (ring_token_leaf_make) at pos - 1, and on the sending side its first
 * token's logits, which an audit of the last rank compares (the summary holds their hash). */
static void rows_put(const struct stage *st, struct kvd_receipt *r, struct leaves *l, int kind,
                     bool token, bool draft, uint32_t pos, uint32_t n, const uint8_t *payload,
                     size_t len)
{
    if (token) {
        uint8_t sum[RING_TOKEN_LEAF_MAX];
        size_t sl = 0, lg = 0;
        if (r->clear_below)
            replay_clear(r, l, kind);
        if (pos == 0 || ring_token_leaf_make(payload, len, n, st->be.n_vocab, sum, &sl, &lg) ||
            leaf_put(l, pos - 1, sum, sl)) {
            r->broken = true;   /* no honest receipt can be made of this session */
            return;
        }
        kvd_rowlog_put(r->log, kind, pos - 1, sum, sl);
        if (lg && kind == KVD_ROWLOG_SENT)
            kvd_rowlog_put(r->log, KVD_ROWLOG_LOGITS, pos - 1, payload + lg,
                           (size_t)st->be.n_vocab * 4);
        return;
    }
    /* A frame that starts inside the verifying pass before it and ends short of that pass's
     * end: the rows after it were rejected drafts, rolled back at every stage and out of the
     * boundary log, and the positions they held may never come again (the session ends). Their
     * leaves go, at both ends of the edge alike (the same frames, in order), and the range ends
     * here: what stays is what a run that never drafted them would have committed to. */
    if (pos > l->vp_lo && pos < l->vp_hi && pos + n < l->vp_hi) {
        for (uint32_t p = pos + n; p < l->vp_hi && p < l->cap; p++)
            if (l->set[p]) {
                l->set[p] = 0;
                kvd_rowlog_put(r->log, kind, p, NULL, 0);
            }
        if (r->t1 > pos + n)
            r->t1 = pos + n;
        if (kind == KVD_ROWLOG_RECEIVED && r->r1 > pos + n)
            r->r1 = pos + n;
    }
    l->vp_lo = draft ? pos : 0;
    l->vp_hi = draft ? pos + n : 0;
    size_t row = n ? len / n : 0;
    for (uint32_t i = 0; i < n; i++) {
        if (leaf_put(l, pos + i, payload + i * row, row))
            r->broken = true;
        kvd_rowlog_put(r->log, kind, pos + i, payload + i * row, row);
    }
}

void kvd_receipt_sent(struct stage *st, struct sess *s, uint32_t pos, uint32_t n, uint8_t flags,
                      const void *payload, size_t len)
{
    struct kvd_receipt *r = receipt_of(st, s);
    if (r)
        rows_put(st, r, &r->sent, KVD_ROWLOG_SENT, st->is_last, (flags & RING_FL_DRAFT) != 0, pos,
                 n, payload, len);
}

void kvd_receipt_received(struct stage *st, struct sess *s, uint32_t pos, uint32_t n,
                          uint8_t flags, const void *payload, size_t len)
{
    struct kvd_receipt *r = receipt_of(st, s);
    if (!r)
        return;
    rows_put(st, r, &r->recv, KVD_ROWLOG_RECEIVED, st->rank == 0, (flags & RING_FL_DRAFT) != 0,
             pos, n, payload, len);
    if (st->rank != 0)
        extend(&r->r0, &r->r1, &r->got, pos, n);
    else
        r->got = true;
}

/* One line of this stage's receipts: the session's model and ring generation (the manifest's
 * SHA-256) come first, then what varies. */
static void put(struct stage *st, int fd, uint64_t session, const char *rest)
{
    char man[65], line[640];
    util_hex_encode(st->m.hash, 32, man);
    int n = snprintf(line, sizeof line, "{\"model\":\"%s\",\"manifest\":\"%s\",\"session\":\"%016"
                     PRIx64 "\",%s}\n", st->m.catalog, man, session, rest);
    /* one write per line on an O_APPEND file: a reader never sees half of one that was
     * written whole */
    if (n > 0 && (size_t)n < sizeof line && write(fd, line, (size_t)n) != n)
        kvd_log(KVD_LOG_WARN, "receipts %s: %s", st->o.receipts, strerror(errno));
}

static void put_line(struct stage *st, int fd, uint64_t session, uint32_t rank, uint32_t t0,
                     uint32_t t1, struct leaves *l, const char *side, const uint8_t *sampling)
{
    unsigned char dg[32];
    char hex[65], rest[256];
    if (leaves_root(l, t0, t1, dg))
        return;
    if (sampling)   /* the last edge's */
        ring_receipt_fold(dg, sampling, dg);
    util_hex_encode(dg, 32, hex);
    snprintf(rest, sizeof rest, "\"rank\":%u,\"tokens\":[%u,%u],\"digest\":\"%s\",\"side\":\"%s\"",
             rank, t0, t1, hex, side);
    put(st, fd, session, rest);
}

/* Rank 0's open side: the paying client that opened the session, and the proof (made with the
 * client's verifier, which only a holder of its key can make) binding it to the positions
 * [0, t1) of this session in this ring generation. */
static void put_open(struct stage *st, int fd, const struct sess *s, uint32_t t1)
{
    char man[65], sid[17], proof[65], rest[320];
    util_hex_encode(st->m.hash, 32, man);
    snprintf(sid, sizeof sid, "%016" PRIx64, s->id);
    ring_client_proof(s->client_v, st->m.catalog, man, sid, t1, proof);
    snprintf(rest, sizeof rest, "\"rank\":0,\"tokens\":[0,%u],\"side\":\"open\",\"client\":\"%s\","
             "\"proof\":\"%s\"", t1, s->client_id, proof);
    put(st, fd, s->id, rest);
}

static void receipt_free(struct stage *st, struct kvd_receipt *r)
{
    kvd_rowlog_close(st, r->log);
    free(r->sent.h);
    free(r->sent.set);
    free(r->recv.h);
    free(r->recv.set);
    free(r);
}

/* Write session id's receipt r (s: the session, for rank 0's open side; NULL for a parked
 * one, never rank 0's) and free it. */
static void receipt_write(struct stage *st, uint64_t id, const struct sess *s, struct kvd_receipt *r)
{
    int fd = r->broken ? -1 : open(st->o.receipts, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (r->broken) {
        kvd_log(KVD_LOG_WARN, "session %016" PRIx64 ": out of memory for its receipt's rows; "
                "no receipt", id);
    } else if (fd < 0) {
        kvd_log(KVD_LOG_WARN, "receipts %s: %s", st->o.receipts, strerror(errno));
    } else {
        if (r->ran && st->rank == 0 && s && s->has_client)
            put_open(st, fd, s, r->t1);
        const uint8_t *smp = r->has_sampling ? r->sampling : NULL;
        if (r->ran)
            put_line(st, fd, id, st->rank, r->t0, r->t1, &r->sent, "sent",
                     st->is_last && st->rank != 0 ? smp : NULL);
        /* rank 0 attests the last rank over the positions it ran itself */
        if (r->got && st->rank != 0)
            put_line(st, fd, id, st->pred, r->r0, r->r1, &r->recv, "received", NULL);
        else if (r->got && r->ran)
            put_line(st, fd, id, st->pred, r->t0, r->t1, &r->recv, "received", smp);
        close(fd);
    }
    receipt_free(st, r);
}

void kvd_receipt_close(struct stage *st, struct sess *s)
{
    struct kvd_receipt *r = s->receipt;
    if (!r)
        return;
    s->receipt = NULL;
    receipt_write(st, s->id, s, r);
}

/* ---- parked receipts ----
 * A stage that loses a session to a ring break (its in link broke, or it cannot resume the
 * session from its log) may see it again: rank 0 replays it after the repair, and this stage
 * recomputes it as a new session. The receipt is one for the whole session, whichever
 * incarnations ran it: written at the break, it would name only the positions run so far, and
 * the market keeps the first side it gets of a (session, rank), so the edge with a neighbour
 * that kept the session whole would disagree and hold back both ranks' honest work. So the
 * receipt is parked at the break and adopted by the replay (the same rows come again: their
 * leaves are the same); it is written when rank 0 ends the session without a replay (CLOSE)
 * or after the idle timeout, and dropped at shutdown. */
struct parked {
    uint64_t id, at_ms;
    struct kvd_receipt *r;
};
#define PARKED_MAX 1024   /* the oldest parked receipt is written when one more comes */

void kvd_receipt_park(struct stage *st, struct sess *s)
{
    if (!s->receipt)
        return;
    if (!st->receipts.parked && !(st->receipts.parked = calloc(PARKED_MAX, sizeof(struct parked)))) {
        kvd_receipt_close(st, s);
        return;
    }
    struct parked *p = st->receipts.parked;
    if (st->receipts.n_parked == PARKED_MAX) {
        receipt_write(st, p[0].id, NULL, p[0].r);
        memmove(p, p + 1, (PARKED_MAX - 1) * sizeof *p);
        st->receipts.n_parked--;
    }
    p[st->receipts.n_parked++] = (struct parked){.id = s->id, .at_ms = (uint64_t)util_now_ms(),
                                                 .r = s->receipt};
    s->receipt = NULL;
}

static void parked_remove(struct stage *st, uint32_t i, bool write)
{
    struct parked *p = st->receipts.parked;
    if (write)
        receipt_write(st, p[i].id, NULL, p[i].r);
    memmove(p + i, p + i + 1, (st->receipts.n_parked - i - 1) * sizeof *p);
    st->receipts.n_parked--;
}

void kvd_receipt_adopt(struct stage *st, struct sess *s)
{
    struct parked *p = st->receipts.parked;
    for (uint32_t i = 0; i < st->receipts.n_parked; i++)
        if (p[i].id == s->id) {
            if (s->receipt)   /* cannot happen: a session's receipt starts at its first row */
                kvd_receipt_close(st, s);
            s->receipt = p[i].r;
            parked_remove(st, i, false);
            return;
        }
}

void kvd_receipt_unpark(struct stage *st, uint64_t id)
{
    for (uint32_t i = 0; i < st->receipts.n_parked; i++)
        if (((struct parked *)st->receipts.parked)[i].id == id) {
            parked_remove(st, i, true);
            return;
        }
}

void kvd_receipt_park_tick(struct stage *st, uint64_t now_ms, uint64_t keep_ms)
{
    while (st->receipts.n_parked && now_ms - ((struct parked *)st->receipts.parked)[0].at_ms > keep_ms)
        parked_remove(st, 0, true);
}

void kvd_receipt_park_free(struct stage *st)
{
    /* sessions still waiting for a replay when the stage stops (its node lost its rank to a
     * standby, say): the replay runs elsewhere, under a receipt that covers the whole session,
     * and a part of one written here would contradict it and hold back the ranks around */
    if (st->receipts.n_parked)
        kvd_log(KVD_LOG_INFO, "%u receipt(s) of sessions broken and not replayed here are not "
                "written (their replay is another stage's)", st->receipts.n_parked);
    for (uint32_t i = 0; i < st->receipts.n_parked; i++)
        receipt_free(st, ((struct parked *)st->receipts.parked)[i].r);
    st->receipts.n_parked = 0;
    free(st->receipts.parked);
    st->receipts.parked = NULL;
}

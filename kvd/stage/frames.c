/* frames.c — the frames of an established link, each checked against the manifest before
 * anything acts on it (a violation closes only that link, telling the peer why): PING/PONG
 * and STATUS (status.c) on both links; from the predecessor the session frames (OPEN, ACT,
 * TOKEN, CLOSE, ERROR); from the successor only a session's ERROR on its way back to rank 0. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvd/kvd.h"
#include "kvd/stage/internal.h"
#include "net/net.h"

/* A link report from the successor (RING_ERR_LINK_DOWN/UP, docs/design.md, "The ring data path"):
 * about a link further on (rank pos -> pos + 1, pos past this rank), kept and passed back
 * towards rank 0. Rank 0 logs each distinct state once; a report about any other link is a
 * violation. */
static void on_link_report(struct conn *c, const struct ring_frame_hdr *h, uint32_t code,
                           const uint8_t *msg, size_t n)
{
    struct stage *st = c->st;
    if (c->role != CONN_OUT)
        VIOLATION(c, "link report from the predecessor (they travel back towards rank 0)");
    if (h->pos <= st->rank || h->pos >= st->n)
        VIOLATION(c, "link report about rank %u's out link: not in (%u, %u)", h->pos, st->rank, st->n);
    char why[KVD_REASON_MAX];
    util_text_clean(why, sizeof why, msg, n);
    bool down = code == RING_ERR_LINK_DOWN;
    struct kvd_link_note *ln = &st->links.note[h->pos];
    bool same = ln->down == down && (!down || !strcmp(ln->last_reason, why));
    kvd_conn_note(st, h->pos, down, h->pos, why);
    if (!same)
        kvd_log(st->rank == 0 ? KVD_LOG_INFO : KVD_LOG_DEBUG, "rank %u reports: link rank %u -> rank %u is %s%s%s",
                h->pos, h->pos, (h->pos + 1) % st->n, down ? "down" : "up", down ? ": " : "",
                down ? why : "");
    if (st->rank != 0 && kvd_conn_in_up(st)) {   /* passed on cleaned */
        uint8_t b[4 + KVD_REASON_MAX];
        size_t k = down ? strlen(why) : 0;
        util_le32_put(b, code);
        memcpy(b + 4, why, k);
        kvd_conn_send(st->links.in, RING_F_ERROR, 0, 0, h->pos, 0, b, 4 + k);
    }
}

void kvd_frame_handle(struct conn *c, const struct ring_frame_hdr *h, const uint8_t *payload)
{
    struct stage *st = c->st;
    const char *tn = ring_frame_type_name(h->type);
    switch (h->type) {
    case RING_F_PING:
        if (h->payload_len != 8)
            VIOLATION(c, "PING payload_len %u is not 8", h->payload_len);
        kvd_conn_send(c, RING_F_PONG, 0, 0, 0, 0, payload, 8);
        return;
    case RING_F_PONG:
        if (h->payload_len != 8)
            VIOLATION(c, "PONG payload_len %u is not 8", h->payload_len);
        kvd_conn_pong(c, payload);
        return;
    case RING_F_STATUS: {   /* a rank's status record, either way round the ring */
        char why[300];
        if (kvd_status_on_frame(c, h, payload, why, sizeof why) < 0)
            VIOLATION(c, "%s", why);
        return;
    }
    case RING_F_HELLO:
    case RING_F_AUTH:
        VIOLATION(c, "%s after the handshake", tn);
    case RING_F_ERROR:
        if (h->payload_len < 4 || h->payload_len > 4 + RING_ERRMSG_MAX)
            VIOLATION(c, "ERROR payload_len %u not in [4, %u]", h->payload_len, 4 + RING_ERRMSG_MAX);
        break;
    default:
        break;
    }
    /* A peer's words: printable and bounded before they reach a log or a client. */
    char emsg[RING_ERRMSG_MAX + 1] = "";
    if (h->type == RING_F_ERROR) {
        util_text_clean(emsg, sizeof emsg, payload + 4, h->payload_len - 4);
        uint32_t code = util_le32_get(payload);
        if (h->session == 0 && (code == RING_ERR_LINK_DOWN || code == RING_ERR_LINK_UP)) {
            on_link_report(c, h, code, payload + 4, h->payload_len - 4);
            return;
        }
        if (h->session == 0) {   /* about the link itself: the peer closes it */
            char r[RING_ERRMSG_MAX + 64];
            if (c->role == CONN_OUT)
                snprintf(r, sizeof r, "rank %u refused the link: %s", c->peer_rank, emsg);
            else
                snprintf(r, sizeof r, "rank %u closed the link: %s", c->peer_rank, emsg);
            kvd_log(KVD_LOG_WARN, "link %s (%s): %s", c->role == CONN_OUT ? "out" : "in",
                    ring_link_peer(c->link), r);
            kvd_conn_close(c, r);
            return;
        }
    }
    if (c->role == CONN_OUT) {
        if (h->type != RING_F_ERROR)
            VIOLATION(c, "%s frame from the successor (only PING/PONG/ERROR travel back)", tn);
        /* A session's ERROR coming back: pass it on towards rank 0. */
        struct sess *bs = kvd_sess_find(st, h->session);
        if (!bs)
            return;
        if (st->rank == 0) {
            kvd_sess_on_error(st, bs, util_le32_get(payload), emsg);
        } else if (util_le32_get(payload) == RING_ERR_RING) {
            kvd_sess_hold(st, bs, emsg);   /* kept for the replay where its log is whole */
        } else {
            kvd_log(KVD_LOG_WARN, "session %016" PRIx64 " fails downstream: %s", bs->id, emsg);
            if (kvd_conn_in_up(st))
                kvd_conn_send(st->links.in, RING_F_ERROR, 0, h->session, 0, 0, payload, h->payload_len);
            kvd_sess_drop(st, bs);
        }
        return;
    }
    /* In link: the session frames of the ring. */
    struct sess *s = kvd_sess_find(st, h->session);
    bool stale = !s && kvd_sess_recently_closed(st, h->session);
    switch (h->type) {
    case RING_F_OPEN: {
        if (st->rank == 0)
            VIOLATION(c, "OPEN arrived at rank 0 (rank 0 opens sessions)");
        if (s && !(h->flags & RING_FL_REPLAY))
            VIOLATION(c, "OPEN for session %016" PRIx64 " which is already open", h->session);
        if (h->session == 0)
            VIOLATION(c, "OPEN for session 0");
        if (h->n_tokens < 1 || h->n_tokens >= st->m.n_ctx)
            VIOLATION(c, "OPEN n_tokens %u not in [1, %u)", h->n_tokens, st->m.n_ctx);
        if (h->payload_len != RING_OPEN_LEN + (uint64_t)h->n_tokens * 4)
            VIOLATION(c, "OPEN payload_len %u, expected %u + 4 x n_tokens %u", h->payload_len,
                             RING_OPEN_LEN, h->n_tokens);
        if (h->pos != 0)
            VIOLATION(c, "OPEN pos %u is not 0", h->pos);
        struct ring_open_params p;
        ring_open_decode(payload, &p);
        if (p.n_ctx > st->m.n_ctx || p.n_ctx <= h->n_tokens)
            VIOLATION(c, "OPEN n_ctx %u not in (%u, %u]", p.n_ctx, h->n_tokens, st->m.n_ctx);
        if (p.draft_max > RING_DRAFTS_MAX)
            VIOLATION(c, "OPEN draft_max %u above %u", p.draft_max, RING_DRAFTS_MAX);
        if (p.draft_kind > RING_DRAFT_KIND_MAX)
            VIOLATION(c, "OPEN draft_kind %u above %u", p.draft_kind, RING_DRAFT_KIND_MAX);
        for (uint32_t i = 0; i < h->n_tokens; i++)
            if (util_le32_get(payload + RING_OPEN_LEN + 4 * i) >= st->be.n_vocab)
                VIOLATION(c, "OPEN prompt token %u = %u not below n_vocab %u", i,
                                 util_le32_get(payload + RING_OPEN_LEN + 4 * i), st->be.n_vocab);
        if (s) {
            /* A replay of a session this stage still has (held when the ring broke downstream):
             * resent from its boundary log, or dropped here and recomputed (docs/ring.md,
             * "Repair"). */
            if (kvd_sess_resume(st, s, h, payload))
                return;
            kvd_receipt_park(st, s);   /* the replay recomputes it here, under the same receipt */
            kvd_sess_drop(st, s);
            s = NULL;
            stale = true;
        }
        if (st->sessions.n >= st->m.max_sessions) {
            char msg[200];
            snprintf(msg, sizeof msg, "rank %u: too many sessions (limit %u)", st->rank, st->m.max_sessions);
            if (kvd_conn_out_up(st))
                kvd_conn_send_error(st->links.out, h->session, RING_ERR_LIMIT, msg);
            return;
        }
        /* A session that ended here and opens again: rank 0 replays it after a repair
         * (docs/ring.md, "Repair"); it is no longer a closed one whose frames are dropped. */
        if (stale)
            kvd_sess_closed_forget(st, h->session);
        s = kvd_sess_new(st, h->session, p.n_ctx);
        int32_t *toks = st->is_last ? malloc((size_t)h->n_tokens * 4) : NULL;
        if (!s || (st->is_last && !toks)) {
            free(toks);
            if (s)
                kvd_sess_fail(st, s, "out of memory");
            return;
        }
        for (uint32_t i = 0; toks && i < h->n_tokens; i++)
            toks[i] = (int32_t)util_le32_get(payload + RING_OPEN_LEN + 4 * i);
        kvd_receipt_sampling(st, s, payload);
        if (h->flags & RING_FL_REPLAY) {
            s->replay_end = h->n_tokens;
            kvd_receipt_replayed(st, s, h->n_tokens);
            st->stats.replayed_sessions++;
            if (!stale)   /* a dropped one said why in kvd_sess_resume */
                kvd_log(KVD_LOG_INFO, "session %016" PRIx64 ": replay recomputes its %u positions "
                        "here (new to this stage)", h->session, h->n_tokens);
        }
        if (kvd_sess_submit_open(st, h->session, &p, h->flags & RING_FL_LOGITS, toks,
                                 h->n_tokens) < 0) {
            kvd_sess_fail(st, s, "out of memory");
            return;
        }
        if (!st->is_last &&
            kvd_conn_send(st->links.out, RING_F_OPEN, h->flags, h->session, 0, h->n_tokens, payload, h->payload_len) < 0) {
            char msg[KV_ERR_MAX];
            kvd_conn_out_down_why(st, msg, sizeof msg);
            kvd_sess_fail_code(st, s, RING_ERR_RING, msg);
        }
        return;
    }
    case RING_F_ACT: {
        if (st->rank == 0)
            VIOLATION(c, "ACT arrived at rank 0 from rank %u (the last rank sends TOKEN)", c->peer_rank);
        /* The frame's shape first: a malformed ACT is a violation whatever the state of its
         * session (one that just failed here, say, while the out link was still coming up). */
        if (h->n_tokens < 1 || h->n_tokens > st->m.max_batch)
            VIOLATION(c, "ACT n_tokens %u not in [1, %u]", h->n_tokens, st->m.max_batch);
        uint64_t want = (uint64_t)h->n_tokens * st->m.n_embd * st->m.wire_dsize;
        if (h->payload_len != want)
            VIOLATION(c, "ACT payload_len %u, expected n_tokens %u x n_embd %u x %u bytes = %" PRIu64,
                             h->payload_len, h->n_tokens, st->m.n_embd, st->m.wire_dsize, want);
        if ((h->flags & RING_FL_DRAFT) &&
            (!(h->flags & RING_FL_LAST) || h->n_tokens < 2 || h->n_tokens > RING_TOKENS_MAX))
            VIOLATION(c, "ACT flagged DRAFT with n_tokens %u%s (a verifying pass is the last chunk "
                      "of its step, 2 to %u rows)", h->n_tokens, (h->flags & RING_FL_LAST) ? "" :
                      " and without LAST", RING_TOKENS_MAX);
        if (!s) {
            if (stale)
                return;   /* in flight when the session ended */
            VIOLATION(c, "ACT for unknown session %016" PRIx64, h->session);
        }
        /* After a verifying pass the next step starts at the first row not kept: anywhere
         * after the pass's first row, up to its end (every draft accepted). */
        bool rewind = s->drafted && h->pos > s->draft_from && h->pos < s->next_pos;
        if ((h->pos != s->next_pos && !rewind) || (uint64_t)h->pos + h->n_tokens > s->n_ctx)
            VIOLATION(c, "ACT pos %u (+%u) for session %016" PRIx64 ": expected pos %u%s, context %u",
                      h->pos, h->n_tokens, h->session, s->next_pos, s->drafted ? " or a position "
                      "inside the verifying pass before it" : "", s->n_ctx);
        /* A session resumed from its log: the rows its KV holds already are not run again. */
        uint32_t skip = 0;
        if (h->pos < s->skip_below) {
            skip = s->skip_below - h->pos < h->n_tokens ? s->skip_below - h->pos : h->n_tokens;
            if (skip == h->n_tokens) {
                s->next_pos = h->pos + h->n_tokens;
                s->drafted = false;
                s->last_active_ms = (uint64_t)util_now_ms();
                return;
            }
        }
        size_t row = (size_t)st->m.n_embd * st->m.wire_dsize;
        uint32_t pos = h->pos + skip, n = h->n_tokens - skip;
        size_t len = (size_t)n * row;
        struct kvd_job *j = calloc(1, sizeof *j);
        uint8_t *in = malloc(len);
        if (!j || !in) {
            free(j);
            free(in);
            kvd_sess_fail(st, s, "out of memory");
            return;
        }
        memcpy(in, payload + (size_t)skip * row, len);
        j->kind = KVD_JOB_STEP;
        j->session = h->session;
        j->epoch = s->epoch;
        j->pos = pos;
        j->n = n;
        j->flags = h->flags & (RING_FL_LAST | RING_FL_DRAFT);
        j->in = in;
        j->in_len = len;
        if (pos < s->replay_end)   /* a replayed history's positions, recomputed here */
            st->stats.replayed_positions += (pos + n < s->replay_end ? pos + n : s->replay_end) - pos;
        s->next_pos = h->pos + h->n_tokens;
        s->drafted = (h->flags & RING_FL_DRAFT) != 0;
        s->draft_from = h->pos;
        s->kv_end = pos + n;
        s->last_active_ms = (uint64_t)util_now_ms();
        kvd_receipt_received(st, s, h->pos, h->n_tokens, h->flags, payload, h->payload_len);
        kvd_compute_submit(st->comp, j);
        return;
    }
    case RING_F_TOKEN: {
        if (st->rank != 0)
            VIOLATION(c, "TOKEN from rank %u, which is not the last rank (%u)", c->peer_rank,
                             st->n - 1);
        if (!s) {
            if (stale)
                return;
            VIOLATION(c, "TOKEN for unknown session %016" PRIx64, h->session);
        }
        if (s->paused)
            return;   /* computed before the ring broke; the replay computes it again */
        /* tokens, logprobs, drafts, logits (net/net.h): the tokens are the drafts the pass
         * verified, accepted in order, and one more; n_drafts follows from payload_len */
        uint32_t nt = h->n_tokens;
        if (nt < 1 || nt > s->n_drafts + 1)
            VIOLATION(c, "TOKEN n_tokens %u not in [1, %u] (the pass verified %u drafts)", nt,
                      s->n_drafts + 1, s->n_drafts);
        uint64_t fixed = (uint64_t)nt * (8 + ((h->flags & RING_FL_LOGITS) ? (uint64_t)st->be.n_vocab * 4 : 0));
        if (h->payload_len < fixed || (h->payload_len - fixed) % 4 ||
            (h->payload_len - fixed) / 4 > RING_DRAFTS_MAX)
            VIOLATION(c, "TOKEN payload_len %u: expected %" PRIu64 " for %u tokens%s and 4 bytes "
                      "for each of at most %u drafts", h->payload_len, fixed, nt,
                      (h->flags & RING_FL_LOGITS) ? " with logits" : "", RING_DRAFTS_MAX);
        uint32_t n_hist = kvd_sess_n_hist(s), nd = (uint32_t)((h->payload_len - fixed) / 4);
        if (h->pos != n_hist)
            VIOLATION(c, "TOKEN pos %u for session %016" PRIx64 ", expected %u", h->pos,
                             h->session, n_hist);
        if ((uint64_t)n_hist + nt > s->n_ctx)
            VIOLATION(c, "TOKEN past the session's context %u", s->n_ctx);
        for (uint32_t i = 0; i < nt; i++) {
            uint32_t tok = util_le32_get(payload + 4 * i);
            if (tok >= st->be.n_vocab)
                VIOLATION(c, "TOKEN id %u not below n_vocab %u", tok, st->be.n_vocab);
            if (i + 1 < nt && tok != (uint32_t)s->drafts[i])
                VIOLATION(c, "TOKEN's token %u at pos %u is not the draft %d the pass verified "
                          "there (only a token after the accepted drafts may differ)", tok,
                          h->pos + i, s->drafts[i]);
        }
        for (uint32_t i = 0; i < nd; i++)
            if (util_le32_get(payload + 8 * (size_t)nt + 4 * i) >= st->be.n_vocab)
                VIOLATION(c, "TOKEN draft %u = %u not below n_vocab %u", i,
                          util_le32_get(payload + 8 * (size_t)nt + 4 * i), st->be.n_vocab);
        s->last_active_ms = (uint64_t)util_now_ms();
        kvd_receipt_received(st, s, h->pos, nt, h->flags, payload, h->payload_len);
        kvd_sess_on_token(st, s, h, payload);
        return;
    }
    case RING_F_CLOSE:
        if (h->payload_len != 0)
            VIOLATION(c, "CLOSE payload_len %u is not 0", h->payload_len);
        if (st->rank == 0)
            return;   /* never sent to rank 0; harmless */
        if (s)
            kvd_sess_drop(st, s);
        else
            kvd_receipt_unpark(st, h->session);   /* ended without the replay it waited for */
        if (!st->is_last)
            kvd_conn_send(st->links.out, RING_F_CLOSE, 0, h->session, 0, 0, NULL, 0);
        return;
    case RING_F_ERROR:
        if (!s)
            return;
        if (st->rank == 0) {
            kvd_sess_on_error(st, s, util_le32_get(payload), emsg);
        } else {
            kvd_log(KVD_LOG_WARN, "session %016" PRIx64 " fails upstream: %s", s->id, emsg);
            kvd_conn_send(st->links.out, RING_F_ERROR, 0, h->session, 0, 0, payload, h->payload_len);
            kvd_sess_drop(st, s);
        }
        return;
    default:
        VIOLATION(c, "unexpected %s frame", tn);
    }
}

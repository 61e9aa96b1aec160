/* session.c — the stage's sessions: their table, how one ends (here and round the ring), the
 * compute jobs they submit and the results that come back, and at rank 0 the client that
 * asked for one: its stream of tokens and text, kept by the generation object (model_gen). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <openssl/rand.h>

#include "kvd/kvd.h"
#include "kvd/stage/internal.h"
#include "model/model.h"
#include "net/net.h"

/* ================================ sessions ================================ */

struct sess *kvd_sess_find(struct stage *st, uint64_t id)
{
    for (struct sess *s = st->sessions.list; s; s = s->next)
        if (s->id == id)
            return s;
    return NULL;
}

bool kvd_sess_recently_closed(struct stage *st, uint64_t id)
{
    for (uint32_t i = 0; i < CLOSED_RING; i++)
        if (st->sessions.closed[i] == id && id != 0)
            return true;
    return false;
}

void kvd_sess_closed_forget(struct stage *st, uint64_t id)
{
    for (uint32_t i = 0; i < CLOSED_RING; i++)
        if (st->sessions.closed[i] == id)
            st->sessions.closed[i] = 0;
}

uint32_t kvd_sess_epoch_next(struct stage *st)
{
    return ++st->sessions.epoch;
}

struct sess *kvd_sess_new(struct stage *st, uint64_t id, uint32_t n_ctx)
{
    struct sess *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->id = id;
    s->epoch = kvd_sess_epoch_next(st);
    s->n_ctx = n_ctx;
    s->last_active_ms = (uint64_t)util_now_ms();
    s->seq = ++st->sessions.seq;
    s->log_dropped = !st->sessions.blog_cap || st->is_last;   /* no log kept */
    s->next = st->sessions.list;
    st->sessions.list = s;
    st->sessions.n++;
    kvd_receipt_adopt(st, s);   /* a replay's receipt continues the one its break parked */
    return s;
}

uint32_t kvd_sess_n_hist(const struct sess *s)
{
    uint32_t n = 0;
    if (s->gen)
        model_gen_history(s->gen, &n);
    return n;
}

/* ============================ boundary logs ============================ */

/* Free s's boundary log; why != NULL: it outgrew a cap, and the session can no longer be
 * resumed from it (a replay recomputes it: docs/ring.md, "Repair"). */
static void blog_truncate(struct stage *st, struct sess *s, uint32_t pos);

static void blog_free(struct stage *st, struct sess *s, const char *why)
{
    uint32_t end = s->log_end;   /* what was logged stays known (the messages name it) */
    blog_truncate(st, s, 0);
    s->log_end = end;
    if (why && !s->log_dropped) {
        st->stats.blog_dropped++;
        kvd_log(KVD_LOG_INFO, "session %016" PRIx64 ": boundary log dropped (%s): a replay "
                "recomputes it from the first stage that still logs it", s->id, why);
    }
    if (why)
        s->log_dropped = true;
}

/* Cut s's log at position pos (the rows from pos on go: drafts a verifying pass rejected, or
 * rows past a replay's history). A row's result does not depend on the rows after it, so
 * what stays is what a run without those rows would have logged. */
static void blog_truncate(struct stage *st, struct sess *s, uint32_t pos)
{
    size_t row = (size_t)st->m.n_embd * st->m.wire_dsize;
    struct blog_entry **pp = &s->log_head, *last = NULL;
    while (*pp && (*pp)->pos < pos) {
        struct blog_entry *e = *pp;
        if (e->pos + e->n > pos) {
            size_t keep = (size_t)(pos - e->pos) * row;
            s->log_bytes -= e->len - keep;
            st->sessions.blog_bytes -= e->len - keep;
            e->n = pos - e->pos;
            e->len = keep;
        }
        last = e;
        pp = &e->next;
    }
    for (struct blog_entry *e = *pp, *next; e; e = next) {
        next = e->next;
        s->log_bytes -= e->len;
        st->sessions.blog_bytes -= e->len;
        free(e->data);
        free(e);
    }
    *pp = NULL;
    s->log_tail = last;
    if (s->log_end > pos)
        s->log_end = pos;
}

/* Keep the ACT frame j's result (rows [pos, pos + n)) in s's log: it takes j->out. Past the
 * session's cap its log goes. */
static void blog_append(struct stage *st, struct sess *s, struct kvd_job *j)
{
    if (s->log_dropped)
        return;
    char why[120];
    if (j->pos < s->log_end)   /* a step after a verifying pass: its rejected rows go */
        blog_truncate(st, s, j->pos);
    if (j->pos != s->log_end) {
        snprintf(why, sizeof why, "rows at %u after %u logged", j->pos, s->log_end);
        blog_free(st, s, why);
        return;
    }
    if (s->log_bytes + j->out_len > st->sessions.blog_cap) {
        snprintf(why, sizeof why, "over --boundary-log-mb: %zu bytes", s->log_bytes + j->out_len);
        blog_free(st, s, why);
        return;
    }
    struct blog_entry *e = malloc(sizeof *e);
    if (!e) {
        blog_free(st, s, "out of memory");
        return;
    }
    *e = (struct blog_entry){.pos = j->pos, .n = j->n, .data = j->out, .len = j->out_len};
    j->out = NULL;
    if (s->log_tail)
        s->log_tail->next = e;
    else
        s->log_head = e;
    s->log_tail = e;
    s->log_bytes += e->len;
    s->log_end = j->pos + j->n;
    st->sessions.blog_bytes += e->len;
}

/* Past the total cap the oldest sessions' logs go first. */
static void blog_trim(struct stage *st)
{
    while (st->sessions.blog_bytes > st->sessions.blog_total_cap) {
        struct sess *old = NULL;
        for (struct sess *o = st->sessions.list; o; o = o->next)
            if (o->log_head && (!old || o->seq < old->seq))
                old = o;
        if (!old)
            break;
        blog_free(st, old, "over --boundary-log-total-mb: the oldest sessions' logs go first");
    }
}

/* Send s's logged frames downstream again, for a replay of n_hist positions (the row at
 * n_hist - 1, if logged, flagged LAST: the last rank samples after it): 0, or -ENOTCONN. */
static int blog_resend(struct stage *st, struct sess *s, uint32_t n_hist)
{
    for (struct blog_entry *e = s->log_head; e; e = e->next) {
        uint8_t fl = e->pos + e->n == n_hist ? RING_FL_LAST : 0;
        if (kvd_conn_send(st->links.out, RING_F_ACT, fl, s->id, e->pos, e->n, e->data, e->len) < 0)
            return -ENOTCONN;
        /* sent now, if not before (rows computed while the session was held went only to
         * the log): the receipt's leaves are the rows as they go out */
        kvd_receipt_sent(st, s, e->pos, e->n, fl, e->data, e->len);
        st->stats.frame_bytes_out += RING_HDR_LEN + e->len;
        st->stats.act_frames_out++;
    }
    return 0;
}

/* Free session id's KV/state on the compute thread (after the jobs queued before). */
static void submit_close(struct stage *st, uint64_t id)
{
    struct kvd_job *j = calloc(1, sizeof *j);
    if (j && st->comp) {
        j->kind = KVD_JOB_CLOSE;
        j->session = id;
        kvd_compute_submit(st->comp, j);
    } else
        free(j);
}

/* Forget a session here: free its KV/state on the compute thread, remember its id so late
 * frames for it are dropped rather than treated as hostile. */
void kvd_sess_drop(struct stage *st, struct sess *s)
{
    struct sess **pp = &st->sessions.list;
    while (*pp && *pp != s)
        pp = &(*pp)->next;
    if (*pp)
        *pp = s->next;
    st->sessions.n--;
    if (s->paused)
        st->repair.n_paused--;
    st->sessions.closed[st->sessions.closed_pos++ % CLOSED_RING] = s->id;
    if (!s->paused || s->held)   /* a paused session's KV went when it paused, unless held */
        submit_close(st, s->id);
    blog_free(st, s, NULL);
    if (s->client) {
        s->client->sess = NULL;
        kvd_client_close(s->client);
    }
    if (s->sink) {   /* ended without kvd_sess_finish (shutdown) */
        const struct kvd_sess_sink *k = s->sink;
        s->sink = NULL;
        k->done(s->sink_ud, s, NULL, "the session was dropped", NULL, 0);
    }
    kvd_receipt_close(st, s);
    model_gen_free(s->gen);
    free(s->last_logits);
    free(s);
}

/* Rank 0: end a session: tell the client, send CLOSE round the ring, free it here. */
void kvd_sess_finish(struct stage *st, struct sess *s, const char *reason, const char *error)
{
    uint32_t n_prompt = s->gen ? model_gen_n_prompt(s->gen) : 0;
    uint32_t n_gen = s->gen ? model_gen_n_gen(s->gen) : 0;
    if (s->client) {
        cJSON *o = cJSON_CreateObject();
        if (error) {
            cJSON_AddStringToObject(o, "error", error);
        } else {
            double t_end = util_now_ms();
            cJSON_AddBoolToObject(o, "done", 1);
            const char *tail = NULL;
            size_t tl = 0;
            if (s->gen && model_gen_flush(s->gen, &tail, &tl) == 0 && tail && tl) {
                char *tmp = malloc(tl + 1);
                if (tmp) {
                    memcpy(tmp, tail, tl);
                    tmp[tl] = 0;
                    cJSON_AddStringToObject(o, "s", tmp);
                    free(tmp);
                }
            }
            cJSON_AddStringToObject(o, "reason", reason);
            cJSON_AddNumberToObject(o, "n_prompt", n_prompt);
            cJSON_AddNumberToObject(o, "n_gen", n_gen);
            cJSON_AddNumberToObject(o, "prompt_ms", s->t_first > 0 ? s->t_first - s->t_start : 0);
            cJSON_AddNumberToObject(o, "gen_ms", s->t_first > 0 ? t_end - s->t_first : 0);
            /* ring passes that brought tokens back, drafts sent and accepted */
            cJSON_AddNumberToObject(o, "passes", (double)s->passes);
            cJSON_AddNumberToObject(o, "drafts", (double)s->drafts_proposed);
            cJSON_AddNumberToObject(o, "drafts_accepted", (double)s->drafts_accepted);
            if (s->want_logits && s->last_logits) {
                cJSON *a = cJSON_CreateArray();
                char num[32];
                for (uint32_t i = 0; i < st->be.n_vocab; i++) {
                    /* %.9g round-trips a float exactly */
                    snprintf(num, sizeof num, "%.9g", s->last_logits[i]);
                    cJSON_AddItemToArray(a, cJSON_CreateRaw(num));
                }
                cJSON_AddItemToObject(o, "logits", a);
            }
        }
        kvd_client_send_json(s->client, o);
    }
    if (s->sink) {
        const struct kvd_sess_sink *k = s->sink;
        const char *tail = NULL;
        size_t tl = 0;
        if (!error && s->gen)
            model_gen_flush(s->gen, &tail, &tl);
        s->sink = NULL;
        k->done(s->sink_ud, s, error ? NULL : reason, error, tail, tail ? tl : 0);
    }
    kvd_log(error ? KVD_LOG_WARN : KVD_LOG_INFO, "session %016" PRIx64 " ends: %s (prompt %u, generated %u)",
            s->id, error ? error : reason, n_prompt, n_gen);
    if (!st->is_last)
        kvd_conn_send(st->links.out, RING_F_CLOSE, 0, s->id, 0, 0, NULL, 0);
    kvd_sess_drop(st, s);
}

/* Any rank: the session failed here (ERROR code: RING_ERR_SESSION, or RING_ERR_RING when a
 * ring link is down). Rank 0 tells its client, or pauses the session for a repair; others
 * pass ERROR on. */
void kvd_sess_fail_code(struct stage *st, struct sess *s, uint32_t code, const char *msg)
{
    if (st->rank == 0) {
        kvd_sess_on_error(st, s, code, msg);
        return;
    }
    kvd_log(KVD_LOG_WARN, "session %016" PRIx64 " fails: %s", s->id, msg);
    /* Forward round the ring to rank 0, or, when the way forward is down, back the way the
     * session came: either way rank 0 hears of it and tells its client. */
    if (kvd_conn_out_up(st))
        kvd_conn_send_error(st->links.out, s->id, code, msg);
    else if (kvd_conn_in_up(st))
        kvd_conn_send_error(st->links.in, s->id, code, msg);
    if (code == RING_ERR_RING)   /* a replay may bring it back: its receipt waits for it */
        kvd_receipt_park(st, s);
    kvd_sess_drop(st, s);
}

void kvd_sess_fail(struct stage *st, struct sess *s, const char *msg)
{
    kvd_sess_fail_code(st, s, RING_ERR_SESSION, msg);
}

void kvd_sess_hold(struct stage *st, struct sess *s, const char *msg)
{
    if (st->rank == 0 || st->is_last || s->log_dropped) {
        kvd_sess_fail_code(st, s, RING_ERR_RING, msg);
        return;
    }
    if (!s->held)
        kvd_log(KVD_LOG_WARN, "session %016" PRIx64 " held for a repair (%u positions in its KV, "
                "%u logged): %s", s->id, s->kv_end, s->log_end, msg);
    s->held = true;
    if (kvd_conn_out_up(st))
        kvd_conn_send_error(st->links.out, s->id, RING_ERR_RING, msg);
    else if (kvd_conn_in_up(st))
        kvd_conn_send_error(st->links.in, s->id, RING_ERR_RING, msg);
}

void kvd_sess_fail_all(struct stage *st, const char *msg, bool out)
{
    for (struct sess *s = st->sessions.list, *next; s; s = next) {
        next = s->next;
        if (out && st->rank != 0)
            kvd_sess_hold(st, s, msg);
        else
            kvd_sess_fail_code(st, s, RING_ERR_RING, msg);
    }
}

bool kvd_sess_resume(struct stage *st, struct sess *s, const struct ring_frame_hdr *h,
                     const uint8_t *payload)
{
    uint32_t n_hist = h->n_tokens;
    if (st->is_last || s->log_dropped || s->log_end > n_hist || s->kv_end > n_hist) {
        kvd_log(KVD_LOG_INFO, "session %016" PRIx64 ": replay recomputes its %u positions here "
                "(%s)", s->id, n_hist, st->is_last ? "the last rank keeps no log"
                : s->log_dropped ? "its boundary log was dropped"
                : "its log is past the history (drafts in flight when the ring broke)");
        return false;
    }
    s->held = false;
    s->next_pos = 0;              /* the history comes again from position 0 */
    s->drafted = false;           /* ... one row a token: no verifying pass to go back into */
    s->skip_below = s->kv_end;    /* what the KV holds is not computed again */
    /* nothing of this replay is computed here a second time: the KV keeps [0, kv_end), and
     * the rows past it (in flight when the ring broke) are computed here for the first time,
     * so they do not count as replayed positions */
    s->replay_end = 0;
    s->last_active_ms = (uint64_t)util_now_ms();
    st->stats.replayed_sessions++;
    st->stats.replays_from_log++;
    kvd_log(KVD_LOG_INFO, "session %016" PRIx64 ": replay from the boundary log: %u positions "
            "resent, %u in the KV kept, %u to compute", s->id, s->log_end, s->kv_end, n_hist - s->kv_end);
    if (kvd_conn_send(st->links.out, RING_F_OPEN, h->flags, h->session, 0, h->n_tokens, payload,
                      h->payload_len) < 0 || blog_resend(st, s, n_hist) < 0) {
        char msg[200];
        snprintf(msg, sizeof msg, "ring not linked: link rank %u -> rank %u is down", st->rank, st->succ);
        kvd_sess_hold(st, s, msg);
    }
    return true;
}

void kvd_sess_on_error(struct stage *st, struct sess *s, uint32_t code, const char *msg)
{
    if (code == RING_ERR_RING)
        kvd_sess_pause(st, s, msg);
    else
        kvd_sess_finish(st, s, NULL, msg);
}

static void client_note(struct client *c, const char *note)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "note", note);
    kvd_client_send_json(c, o);
}

static void repair_cb(uv_timer_t *t)
{
    kvd_sess_repair_tick(t->data);
}

void kvd_sess_pause(struct stage *st, struct sess *s, const char *why)
{
    if (s->paused)
        return;
    if (!st->repair.wait_ms || st->shutting_down) {
        kvd_sess_finish(st, s, NULL, why);
        return;
    }
    uint64_t now = (uint64_t)util_now_ms();
    if (!st->repair.n_paused && !s->broken_ms)
        st->repair.ring_breaks++;
    s->paused = true;
    st->repair.n_paused++;
    if (!s->log_dropped) {
        /* Held: its KV and boundary log stay, jobs in flight are logged when they come back,
         * and the stages upstream of the break keep theirs too (docs/ring.md, "Repair"). */
        s->held = true;
    } else {
        /* Jobs in flight for it are dropped when they come back; its KV here goes, and CLOSE
         * makes the stages that still hold it drop theirs: the replay starts from a clean ring. */
        s->epoch = kvd_sess_epoch_next(st);
        submit_close(st, s->id);
        if (!st->is_last)
            kvd_conn_send(st->links.out, RING_F_CLOSE, 0, s->id, 0, 0, NULL, 0);
    }
    bool first = !s->broken_ms;
    if (first)
        s->broken_ms = now;
    kvd_log(KVD_LOG_WARN, "session %016" PRIx64 " paused (%u positions kept): %s", s->id,
            kvd_sess_n_hist(s), why);
    if (s->client && first) {
        char note[KV_ERR_MAX + 100];
        snprintf(note, sizeof note, "paused: %s; waiting up to %u s for the ring's repair", why,
                 st->repair.wait_ms / 1000);
        client_note(s->client, note);
    }
    if (st->repair.timer_open && !uv_is_active((uv_handle_t *)&st->repair.timer)) {
        if (st->repair.backoff_ms == 0)
            st->repair.backoff_ms = 100;
        if (st->repair.next_replay_ms < now + 100)
            st->repair.next_replay_ms = now + 100;   /* let a redial start before the first replay */
        uv_timer_start(&st->repair.timer, repair_cb, REPAIR_TICK_MS, REPAIR_TICK_MS);
    }
}

void kvd_sess_repair_tick(struct stage *st)
{
    uint64_t now = (uint64_t)util_now_ms();
    for (struct sess *s = st->sessions.list, *next; s; s = next) {
        next = s->next;
        if (s->paused && now - s->broken_ms > st->repair.wait_ms) {
            char msg[200];
            snprintf(msg, sizeof msg, "the ring broke and was not repaired within %u s (rank 0's "
                     "links: out %s, in %s)", st->repair.wait_ms / 1000, kvd_conn_out_up(st) ? "up" : "down",
                     kvd_conn_in_up(st) ? "up" : "down");
            st->repair.failed++;
            kvd_sess_finish(st, s, NULL, msg);
        }
    }
    if (!st->repair.n_paused) {
        uv_timer_stop(&st->repair.timer);
        return;
    }
    bool linked = kvd_conn_out_up(st) && kvd_conn_in_up(st);
    if (!linked || now < st->repair.next_replay_ms)
        return;
    /* Both of rank 0's links are up: replay. A link further down still broken sends the
     * sessions back here with ERROR code 4 (RING_ERR_RING), and the next try waits twice as long. */
    st->repair.next_replay_ms = now + st->repair.backoff_ms;
    st->repair.backoff_ms = st->repair.backoff_ms * 2 > REPLAY_BACKOFF_MAX_MS ? REPLAY_BACKOFF_MAX_MS
                            : st->repair.backoff_ms * 2;
    for (struct sess *s = st->sessions.list, *next; s; s = next) {
        next = s->next;
        if (!s->paused)
            continue;
        s->paused = false;
        st->repair.n_paused--;
        s->replaying = true;
        s->replays++;
        st->repair.replays++;
        st->stats.replayed_sessions++;
        if (!s->held)   /* a held session's jobs in flight still count */
            s->epoch = kvd_sess_epoch_next(st);
        s->last_active_ms = now;
        kvd_log(KVD_LOG_INFO, "session %016" PRIx64 ": replaying %u positions (try %u)", s->id,
                kvd_sess_n_hist(s), s->replays);
        kvd_sess_launch(st, s);
    }
}

/* Rank 0: OPEN for s (its sampling, flags, the history hist[n_hist] as the prompt) to the
 * successor: 0, -ENOMEM, or kvd_conn_send's error. */
static int send_open(struct stage *st, struct sess *s, const int32_t *hist, uint32_t n_hist,
                     uint8_t flags)
{
    size_t plen = RING_OPEN_LEN + (size_t)n_hist * 4;
    uint8_t *pl = malloc(plen);
    if (!pl)
        return -ENOMEM;
    ring_open_encode(&s->open, pl);
    kvd_receipt_sampling(st, s, pl);
    for (uint32_t i = 0; i < n_hist; i++)
        util_le32_put(pl + RING_OPEN_LEN + 4 * i, (uint32_t)hist[i]);
    int rc = kvd_conn_send(st->links.out, RING_F_OPEN, flags, s->id, 0, n_hist, pl, plen);
    free(pl);
    return rc;
}

/* Rank 0: feed the history's positions [from, n_hist) into the ring. Chunked prefill: stages
 * overlap on a long prompt. A replay feeds the history as it was fed the first time, the prompt
 * in chunks and then one row per generated token, so that every stage computes each position
 * exactly as before even where a window's results depend on the rows run together (F32
 * weights past KERN_ROWS_EXACT_MAX rows); only the last row asks for a token. from is 0 or
 * where an earlier feed stopped (a chunk's end). */
static void launch_steps(struct stage *st, struct sess *s, const int32_t *hist, uint32_t n_hist,
                         uint32_t from)
{
    uint32_t n_prompt = model_gen_n_prompt(s->gen);
    for (uint32_t pos = from; pos < n_prompt; pos += st->chunk) {
        uint32_t n = n_prompt - pos < st->chunk ? n_prompt - pos : st->chunk;
        kvd_sess_submit_step(st, s, hist + pos, n, pos, pos + n == n_hist ? RING_FL_LAST : 0);
    }
    for (uint32_t pos = from > n_prompt ? from : n_prompt; pos < n_hist; pos++)
        kvd_sess_submit_step(st, s, hist + pos, 1, pos, pos + 1 == n_hist ? RING_FL_LAST : 0);
}

void kvd_sess_launch(struct stage *st, struct sess *s)
{
    uint32_t n_hist;
    const int32_t *hist = model_gen_history(s->gen, &n_hist);
    s->n_drafts = 0;   /* the history goes again one row a token: no pass of drafts in flight */
    /* The last rank's sampler drew once per generated token: a replay's sampler skips those
     * draws, so a seeded sampled session continues as it would have (docs/ring.md, "Repair"). */
    s->open.draws = model_gen_n_gen(s->gen);
    bool from_log = false;
    if (s->held && (s->log_dropped || s->kv_end > n_hist)) {
        /* held, but its log went since: recompute it from the start, as a new session */
        kvd_log(KVD_LOG_INFO, "session %016" PRIx64 ": replay recomputes all %u positions from "
                "rank 0 (its boundary log was dropped)", s->id, n_hist);
        s->epoch = kvd_sess_epoch_next(st);
        submit_close(st, s->id);
        s->held = false;
    } else if (s->held) {
        from_log = true;
        kvd_log(KVD_LOG_INFO, "session %016" PRIx64 ": replay from the boundary log: %u positions "
                "resent, %u to compute", s->id, s->log_end, n_hist - s->kv_end);
        st->stats.replays_from_log++;   /* positions past kv_end are new here, not recomputed */
    } else if (s->replaying) {
        kvd_log(KVD_LOG_INFO, "session %016" PRIx64 ": replay recomputes all %u positions from "
                "rank 0", s->id, n_hist);
    }
    if (!from_log) {
        if (s->replaying)
            st->stats.replayed_positions += n_hist;
        blog_free(st, s, NULL);   /* computed again from position 0 */
        s->log_end = s->kv_end = 0;
        s->log_dropped = !st->sessions.blog_cap || st->is_last;
    }
    s->held = false;
    if (from_log || s->replaying)   /* a replay: the last rank's TOKENs of it start again */
        kvd_receipt_replayed(st, s, n_hist);
    if (from_log) {
        int rc = send_open(st, s, hist, n_hist, s->open_flags | RING_FL_REPLAY);
        if (rc == -ENOMEM) {
            kvd_sess_finish(st, s, NULL, "out of memory");
            return;
        }
        if (rc < 0 || blog_resend(st, s, n_hist) < 0) {
            kvd_sess_pause(st, s, "the out link went down again");
            return;
        }
        launch_steps(st, s, hist, n_hist, s->kv_end);
        return;
    }
    /* Here: create the session's KV (and the sampler when this rank is also the last, which
     * takes the whole history: what the sampler has seen so far). */
    int32_t *toks = malloc((size_t)n_hist * sizeof *toks);
    if (!toks) {
        kvd_sess_finish(st, s, NULL, "out of memory");
        return;
    }
    memcpy(toks, hist, (size_t)n_hist * sizeof *toks);
    if (kvd_sess_submit_open(st, s->id, &s->open, s->open_flags, toks, n_hist) < 0) {
        kvd_sess_finish(st, s, NULL, "out of memory");
        return;
    }
    if (!st->is_last) {
        int rc = send_open(st, s, hist, n_hist, s->open_flags | (s->replaying ? RING_FL_REPLAY : 0));
        if (rc == -ENOMEM) {
            kvd_sess_finish(st, s, NULL, "out of memory");
            return;
        }
        if (rc < 0 && s->replaying) {
            kvd_sess_pause(st, s, "the out link went down again");
            return;
        }
    }
    if (model_gen_reason(s->gen) != MODEL_GEN_RUNNING) {   /* -n 0 */
        kvd_sess_finish(st, s, model_gen_reason_name(model_gen_reason(s->gen)), NULL);
        return;
    }
    launch_steps(st, s, hist, n_hist, 0);
}

int kvd_sess_submit_open(struct stage *st, uint64_t id, const struct ring_open_params *p,
                         uint8_t flags, int32_t *toks, uint32_t n_toks)
{
    struct kvd_job *j = calloc(1, sizeof *j);
    if (!j) {
        free(toks);
        return -ENOMEM;
    }
    j->kind = KVD_JOB_OPEN;
    j->session = id;
    struct sess *s = kvd_sess_find(st, id);
    j->epoch = s ? s->epoch : 0;
    j->open = *p;
    j->flags = flags;
    j->tokens = toks;
    j->n_tokens = toks ? n_toks : 0;
    kvd_compute_submit(st->comp, j);
    return 0;
}

void kvd_sess_submit_step(struct stage *st, struct sess *s, const int32_t *tokens, uint32_t n,
                          uint32_t pos, uint8_t flags)
{
    struct kvd_job *j = calloc(1, sizeof *j);
    int32_t *t = malloc(n * sizeof *t);
    if (!j || !t) {
        free(j);
        free(t);
        kvd_sess_fail(st, s, "out of memory");
        return;
    }
    memcpy(t, tokens, n * sizeof *t);
    j->kind = KVD_JOB_STEP;
    j->session = s->id;
    j->epoch = s->epoch;
    j->pos = pos;
    j->n = n;
    j->flags = flags;
    j->tokens = t;
    j->n_tokens = n;
    s->kv_end = pos + n;
    kvd_compute_submit(st->comp, j);
}

void kvd_sess_draft_set(const struct stage *st, int draft, uint32_t draft_max,
                        struct ring_open_params *p)
{
    int mode = draft >= 0 ? draft : st->o.draft > 0 ? st->o.draft :
               draft_max > 0 ? MODEL_DRAFT_LOOKUP : MODEL_DRAFT_NONE;
    p->draft_max = 0;
    p->draft_kind = RING_DRAFT_LOOKUP;
    if (mode <= MODEL_DRAFT_NONE)
        return;
    uint32_t k = draft_max ? draft_max : st->o.draft_max ? st->o.draft_max : KVD_DRAFT_MAX_DEFAULT;
    p->draft_max = (uint8_t)(k < RING_DRAFTS_MAX ? k : RING_DRAFTS_MAX);
    p->draft_kind = mode == MODEL_DRAFT_MTP ? RING_DRAFT_MTP :
                    mode == MODEL_DRAFT_AUTO ? RING_DRAFT_AUTO : RING_DRAFT_LOOKUP;
}

int kvd_sess_draft_parse(const void *json_obj, int *draft, uint32_t *draft_max, char *msg, size_t n)
{
    const cJSON *o = json_obj;
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(o, "draft");
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(o, "draft_max");
    *draft = -1;
    *draft_max = 0;
    if (d && !cJSON_IsNull(d)) {
        if ((*draft = model_draft_mode(cJSON_GetStringValue(d))) < 0) {
            snprintf(msg, n, "draft: expected \"lookup\", \"mtp\", \"auto\" or \"none\"");
            return -EINVAL;
        }
    }
    if (k && !cJSON_IsNull(k)) {
        if (!cJSON_IsNumber(k) || !(k->valuedouble >= 1 && k->valuedouble <= RING_DRAFTS_MAX) ||
            k->valuedouble != (double)(uint32_t)k->valuedouble) {
            snprintf(msg, n, "draft_max: expected an integer in [1, %u]", RING_DRAFTS_MAX);
            return -EINVAL;
        }
        *draft_max = (uint32_t)k->valuedouble;
    }
    return 0;
}

int kvd_sess_start(struct stage *st, struct kvd_sess_gen *g, struct sess **out, char *msg,
                   size_t n)
{
    *out = NULL;
    if (!kvd_conn_out_up(st) || !kvd_conn_in_up(st)) {
        kvd_conn_ring_why(st, msg, n);
        free(g->toks);
        return -ENOTCONN;
    }
    if (st->sessions.n >= st->m.max_sessions) {
        snprintf(msg, n, "too many sessions (%u, limit %u)", st->sessions.n, st->m.max_sessions);
        free(g->toks);
        return -EBUSY;
    }
    uint64_t id = 0;
    while (id == 0 || kvd_sess_find(st, id) || kvd_sess_recently_closed(st, id))
        RAND_bytes((unsigned char *)&id, sizeof id);
    struct sess *s = kvd_sess_new(st, id, st->m.n_ctx);
    if (!s) {
        free(g->toks);
        snprintf(msg, n, "out of memory");
        return -ENOMEM;
    }
    struct model_gen_params gp = {.n_ctx = st->m.n_ctx, .max_gen = g->max_gen, .eos = st->be.eos,
                                  .ignore_eos = g->ignore_eos};
    if (model_gen_new(&s->gen, st->be.vocab, &gp, g->toks, g->n_toks) < 0 ||
        (g->n_stops && model_gen_set_stops(s->gen, g->stops, g->n_stops) < 0)) {
        free(g->toks);
        kvd_sess_drop(st, s);
        snprintf(msg, n, "out of memory");
        return -ENOMEM;
    }
    s->want_logits = g->want_logits;
    s->client = g->client;
    if (g->client)
        g->client->sess = s;
    s->sink = g->sink;
    s->sink_ud = g->sink_ud;
    if (g->client_key && ring_client_key_valid(g->client_key)) {
        s->has_client = true;
        ring_client_id(g->client_key, s->client_id);
        ring_client_verifier(g->client_key, s->client_v);
    }
    s->t_start = util_now_ms();
    g->p.max_tokens = g->max_gen;
    g->p.n_ctx = st->m.n_ctx;
    s->open = g->p;   /* kept for a replay after a repair */
    s->open_flags = s->want_logits ? RING_FL_LOGITS : 0;
    kvd_log(KVD_LOG_INFO, "session %016" PRIx64 " opens: %u prompt tokens, up to %u new, temp %.2f seed %" PRIu64,
            id, g->n_toks, g->max_gen, g->p.temperature, g->p.seed);
    free(g->toks);   /* the generation holds the prompt from here on */
    g->toks = NULL;
    kvd_sess_launch(st, s);
    *out = kvd_sess_find(st, id);   /* NULL when a step could not be queued (and it failed) */
    return 0;
}

/* ============================ rank 0: clients ============================ */

static void client_on_shutdown(uv_shutdown_t *req, int status)
{
    (void)status;
    struct client *c = req->data;
    free(req);
    uv_close((uv_handle_t *)&c->pipe, kvd_client_on_closed);
}

void kvd_client_add(struct client *c)
{
    c->next = c->st->sessions.clients;
    c->st->sessions.clients = c;
}

void kvd_client_close(struct client *c)
{
    if (c->closing)
        return;
    c->closing = true;
    struct stage *st = c->st;
    struct client **pp = &st->sessions.clients;
    while (*pp && *pp != c)
        pp = &(*pp)->next;
    if (*pp)
        *pp = c->next;
    if (c->sess) {   /* the client went away mid-session: end it round the ring */
        struct sess *s = c->sess;
        c->sess = NULL;
        s->client = NULL;
        kvd_sess_finish(st, s, "client gone", NULL);
    }
    uv_read_stop((uv_stream_t *)&c->pipe);
    uv_shutdown_t *sd = malloc(sizeof *sd);
    if (sd) {
        sd->data = c;
        if (uv_shutdown(sd, (uv_stream_t *)&c->pipe, client_on_shutdown) == 0)
            return;
        free(sd);
    }
    uv_close((uv_handle_t *)&c->pipe, kvd_client_on_closed);
}

/* ============================== rank 0: tokens ============================== */

void kvd_sess_on_token(struct stage *st, struct sess *s, const struct ring_frame_hdr *h,
                       const uint8_t *payload)
{
    /* The payload (net/net.h), checked by the frame handler: tokens, logprobs, drafts, logits */
    uint32_t nt = h->n_tokens;
    size_t lsz = (h->flags & RING_FL_LOGITS) ? (size_t)st->be.n_vocab * 4 : 0;
    uint32_t nd = (uint32_t)((h->payload_len - (size_t)nt * (8 + lsz)) / 4);
    const uint8_t *dr = payload + (size_t)nt * 8, *lgs = dr + (size_t)nd * 4;
    if (s->replaying) {   /* the first token after a repair */
        double ms = util_now_ms() - (double)s->broken_ms;
        s->replaying = false;
        s->broken_ms = 0;
        st->repair.resumed++;
        st->repair.last_resume_ms = ms;
        if (ms > st->repair.max_resume_ms)
            st->repair.max_resume_ms = ms;
        st->repair.backoff_ms = 100;
        kvd_log(KVD_LOG_INFO, "session %016" PRIx64 " resumed: %.0f ms from the break to this token",
                s->id, ms);
        if (s->client) {
            char note[200];
            snprintf(note, sizeof note, "resumed: the ring was repaired; %u positions replayed, "
                     "%.0f ms from the break to this token", kvd_sess_n_hist(s), ms);
            client_note(s->client, note);
        }
    }
    st->stats.passes_in++;
    st->stats.tokens_in += nt;
    st->stats.drafts_accepted += nt - 1;   /* the frame handler checked them against the drafts sent */
    s->drafts_accepted += nt - 1;
    s->passes++;
    int32_t tok = 0;
    for (uint32_t i = 0; i < nt; i++) {
        tok = (int32_t)util_le32_get(payload + 4 * i);
        float lp;
        memcpy(&lp, payload + 4 * (nt + i), 4);
        if (model_gen_n_gen(s->gen) == 0)
            s->t_first = util_now_ms();
        if (lsz && s->want_logits) {
            if (!s->last_logits)
                s->last_logits = malloc(lsz);
            if (s->last_logits)
                memcpy(s->last_logits, lgs + i * lsz, lsz);
        }
        /* End of generation as one process decides it (model_gen): EOS, EOT and the like (the
         * vocabulary's list, or the file's EOS id without one), -n, the context, stop strings.
         * Tokens after the end (accepted drafts past it) are dropped. */
        struct model_gen_step g;
        model_gen_push(s->gen, tok, &g);
        if (s->client && g.emit) {   /* EOS ends the text; it is not part of it */
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "t", tok);
            cJSON_AddNumberToObject(o, "lp", lp);
            if (g.text) {
                char *tmp = malloc(g.len + 1);
                if (tmp) {
                    memcpy(tmp, g.text, g.len);
                    tmp[g.len] = 0;
                    cJSON_AddStringToObject(o, "s", tmp);
                    free(tmp);
                }
            }
            kvd_client_send_json(s->client, o);
        }
        if (s->sink && g.emit)
            s->sink->token(s->sink_ud, s, tok, g.text, g.text ? g.len : 0,
                           lsz && s->want_logits ? s->last_logits : NULL);
        if (g.reason != MODEL_GEN_RUNNING) {
            kvd_sess_finish(st, s, model_gen_reason_name(g.reason), NULL);
            return;
        }
    }
    /* The next pass: the last token and the drafts that fit below the context (its rows end
     * at n_hist - 1 + k, and a token there would be the context's last), within -n (a pass
     * yields up to k + 1 tokens) and within a run's rows. */
    uint32_t n_hist = kvd_sess_n_hist(s), n_gen = model_gen_n_gen(s->gen);
    uint32_t k = nd < s->open.draft_max ? nd : s->open.draft_max;
    uint32_t room = s->n_ctx > n_hist + 1 ? s->n_ctx - n_hist - 1 : 0;
    uint32_t left = s->open.max_tokens > n_gen + 1 ? s->open.max_tokens - n_gen - 1 : 0;
    if (k > room)
        k = room;
    if (k > left)
        k = left;
    if (k + 1 > st->m.max_batch)
        k = st->m.max_batch - 1;
    int32_t rows[RING_TOKENS_MAX];
    rows[0] = tok;
    for (uint32_t i = 0; i < k; i++)
        rows[1 + i] = s->drafts[i] = (int32_t)util_le32_get(dr + 4 * i);
    s->n_drafts = k;
    if (k) {
        st->stats.draft_passes++;
        st->stats.drafts_sent += k;
        s->drafts_proposed += k;
    }
    kvd_sess_submit_step(st, s, rows, k + 1, n_hist - 1, RING_FL_LAST | (k ? RING_FL_DRAFT : 0));
}

/* ============================== compute results ============================== */

void kvd_sess_on_job_done(struct kvd_job *j, void *ud)
{
    struct stage *st = ud;
    struct sess *s = kvd_sess_find(st, j->session);
    if (j->kind == KVD_JOB_CLOSE || !s || st->shutting_down || j->epoch != s->epoch ||
        (s->paused && !s->held)) {
        kvd_job_free(j);
        return;
    }
    s->last_active_ms = (uint64_t)util_now_ms();
    if (j->rc < 0) {
        char msg[KV_ERR_MAX + 32];
        snprintf(msg, sizeof msg, "rank %u: %s", st->rank, j->err);
        kvd_sess_fail(st, s, msg);
        kvd_job_free(j);
        return;
    }
    if (j->kind == KVD_JOB_STEP) {
        st->stats.steps++;
        st->stats.last_step_ms = s->last_active_ms;
        st->stats.rows += j->n;
        st->stats.compute_ms += j->ms;
        if (j->n == 1) {
            st->stats.dec_steps++;
            st->stats.dec_ms += j->ms;
            /* the status's moving average: the last few dozen decode steps weigh most */
            st->stats.ms_tok_avg = st->stats.dec_steps == 1 ? j->ms
                                                            : 0.9 * st->stats.ms_tok_avg + 0.1 * j->ms;
        }
        kvd_receipt_ran(st, s, j->pos, j->n, st->rank == 0 ? j->tokens : NULL);
        /* The boundary rows go into the log (a held session's only there, until its replay) */
        const uint8_t *out = j->out;
        if (j->out_type == RING_F_ACT && !s->log_dropped) {
            blog_append(st, s, j);
            if (!j->out && s->log_tail)
                out = s->log_tail->data;
        }
        if (s->held || s->paused || !out) {
            blog_trim(st);
            kvd_job_free(j);
            return;
        }
        if (j->out_type) {
            uint32_t pos = j->out_pos, n = j->out_n;
            int rc = kvd_conn_send(st->links.out, (uint8_t)j->out_type, j->out_flags, j->session, pos, n,
                                   out, j->out_len);
            if (rc < 0) {
                char msg[KV_ERR_MAX];
                kvd_conn_out_down_why(st, msg, sizeof msg);
                kvd_sess_hold(st, s, msg);
            } else {
                kvd_receipt_sent(st, s, pos, n, j->out_flags, out, j->out_len);
                st->stats.frame_bytes_out += RING_HDR_LEN + j->out_len;
                if (j->out_type == RING_F_ACT)
                    st->stats.act_frames_out++;
                else
                    st->stats.tok_frames_out++;
            }
        }
    }
    blog_trim(st);
    kvd_job_free(j);
}

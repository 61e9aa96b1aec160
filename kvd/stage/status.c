/* status.c — the ring-wide status (docs/design.md, "The ring data path", and docs/kvctl.md,
 * "status"): this stage's own record, and the last record heard from every other rank.
 *
 * Every stage sends its record in a STATUS frame on both of its links each tick; a stage that
 * gets a record fresher than the one it holds for that rank keeps it and passes it on along
 * the way it was going (from the in link to the out link and back). So rank 0 hears every
 * rank over the ring's own links, from both sides: a broken link upstream of a rank still
 * lets its record come round the other way. A record carries its age (pos), not a clock, so
 * no two hosts need the same time. A peer's record is checked field by field and re-encoded
 * before anything keeps or forwards it: a known field of the wrong type, a rank out of range,
 * a record over RING_STATUS_MAX bytes or not a JSON object closes the link; every string is
 * cut to STATUS_STR_MAX bytes of printable characters; unknown fields are dropped. The table
 * has one fixed slot per rank, so nothing a peer sends grows this stage's memory. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "kvd/kvd.h"
#include "kvd/stage/internal.h"
#include "net/net.h"

/* Resident set of this process in bytes (0 when /proc cannot say). */
static uint64_t rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long size = 0, res = 0;
    if (!f)
        return 0;
    if (fscanf(f, "%llu %llu", &size, &res) != 2)
        res = 0;
    fclose(f);
    long pg = sysconf(_SC_PAGESIZE);
    return (uint64_t)res * (uint64_t)(pg > 0 ? pg : 4096);
}

/* s cut to cap (at most STATUS_STR_MAX) bytes with every byte outside printable ASCII made
 * '?'. */
static void add_strn(cJSON *o, const char *k, const char *s, size_t cap)
{
    char b[STATUS_STR_MAX + 1];
    size_t i = 0;
    if (cap > STATUS_STR_MAX)
        cap = STATUS_STR_MAX;
    for (; s && s[i] && i < cap; i++)
        b[i] = (unsigned char)s[i] >= 0x20 && (unsigned char)s[i] < 0x7f ? s[i] : '?';
    b[i] = 0;
    cJSON_AddStringToObject(o, k, b);
}

static void add_str(cJSON *o, const char *k, const char *s) { add_strn(o, k, s, STATUS_STR_MAX); }

static cJSON *link_rec(struct stage *st, struct conn *c, bool out, size_t cap)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "peer_rank", out ? st->succ : st->pred);
    cJSON_AddStringToObject(o, "state", !c ? "down" : c->up ? "up" : "handshake");
    if (c && c->link) {
        add_strn(o, "peer", ring_link_peer(c->link), cap);
        cJSON_AddNumberToObject(o, "bytes_in", (double)ring_link_bytes_in(c->link));
        cJSON_AddNumberToObject(o, "bytes_out", (double)ring_link_bytes_out(c->link));
    }
    if (out && c)
        cJSON_AddNumberToObject(o, "rtt_ms", round(c->rtt_ms * 1000) / 1000);
    /* Why the link last failed, as conn.c's link note keeps it (a close, a dial failure, a
     * refusal from the peer) */
    const struct kvd_link_note *ln = &st->links.note[out ? st->rank : st->pred];
    const char *err = ln->last_reason;
    uint64_t err_ms = ln->last_reason[0] ? ln->last_reason_ms : 0;
    if (err_ms) {
        add_strn(o, "error", err, cap);
        cJSON_AddNumberToObject(o, "error_age_s", (double)((uint64_t)util_now_ms() - err_ms) / 1000);
    }
    return o;
}

/* The record with its strings cut to cap bytes. */
static cJSON *record(struct stage *st, size_t cap)
{
    cJSON *o = cJSON_CreateObject();
    char b[80];
    cJSON_AddNumberToObject(o, "rank", st->standby.waiting ? -1 : (double)st->rank);
    util_hex_encode(net_identity_pub(st->id), 8, b);
    cJSON_AddStringToObject(o, "node", b);
    if (gethostname(b, sizeof b) != 0)
        b[0] = 0;
    b[sizeof b - 1] = 0;
    add_strn(o, "host", b, cap);
    add_strn(o, "endpoint", st->standby.index >= 0 ? st->m.standbys[st->standby.index].endpoint
                                             : st->m.ranks[st->rank].endpoint, cap);
    cJSON_AddNumberToObject(o, "pid", getpid());
    cJSON *w = cJSON_AddArrayToObject(o, "window");
    cJSON_AddItemToArray(w, cJSON_CreateNumber(st->m.ranks[st->rank].first));
    cJSON_AddItemToArray(w, cJSON_CreateNumber(st->m.ranks[st->rank].last));
    add_str(o, "backend", st->backend_name);
    cJSON_AddNumberToObject(o, "uptime_s", (double)((uint64_t)util_now_ms() - st->start_ms) / 1000);
    cJSON_AddItemToObject(o, "in", link_rec(st, st->links.in, false, cap));
    cJSON_AddItemToObject(o, "out", link_rec(st, st->links.out, true, cap));
    cJSON_AddBoolToObject(o, "linked", kvd_conn_out_up(st) && kvd_conn_in_up(st));
    cJSON_AddNumberToObject(o, "sessions", st->sessions.n);
    cJSON_AddNumberToObject(o, "paused_sessions", st->repair.n_paused);
    cJSON_AddNumberToObject(o, "steps", (double)st->stats.steps);
    cJSON_AddNumberToObject(o, "ms_per_token", st->stats.dec_steps ? st->stats.dec_ms / (double)st->stats.dec_steps : 0);
    cJSON_AddNumberToObject(o, "ms_per_token_avg", round(st->stats.ms_tok_avg * 1000) / 1000);
    cJSON_AddNumberToObject(o, "bytes_per_token_out",
                            st->stats.rows ? (double)st->stats.frame_bytes_out / (double)st->stats.rows : 0);
    if (st->comp) {
        struct kvd_compute_stats cs;
        kvd_compute_stats(st->comp, &cs);
        cJSON_AddNumberToObject(o, "batch_runs", (double)cs.batches);
    }
    cJSON_AddNumberToObject(o, "rss_bytes", (double)rss_bytes());
    cJSON_AddNumberToObject(o, "weight_bytes", (double)st->be.weight_bytes);
    uint32_t live = st->sessions.n - (st->repair.n_paused <= st->sessions.n ? st->repair.n_paused : 0);
    cJSON_AddNumberToObject(o, "kv_bytes", (double)live * (double)st->be.kv_bytes_per_session);
    if (st->standby.index >= 0) {
        cJSON_AddNumberToObject(o, "standby", st->standby.index);
        cJSON_AddBoolToObject(o, "waiting", st->standby.waiting);
    }
    if (st->rank == 0 && !st->standby.waiting) {
        cJSON_AddNumberToObject(o, "repairs", (double)st->status.repairs);
        if (st->status.repairs) {
            cJSON_AddNumberToObject(o, "last_repair_unix", (double)st->status.last_repair_unix);
            cJSON_AddNumberToObject(o, "last_repair_rank", st->status.last_repair_rank);
        }
    }
    return o;
}

cJSON *kvd_status_record(struct stage *st) { return record(st, STATUS_STR_MAX); }

/* ============================ records from peers ============================ */

enum { F_NUM, F_STR, F_BOOL, F_LINK, F_WINDOW };

static const struct rec_field {
    const char *key;
    int kind;
} rec_fields[] = {
    {"rank", F_NUM}, {"node", F_STR}, {"host", F_STR}, {"endpoint", F_STR}, {"pid", F_NUM},
    {"window", F_WINDOW}, {"backend", F_STR}, {"uptime_s", F_NUM}, {"in", F_LINK},
    {"out", F_LINK}, {"linked", F_BOOL}, {"sessions", F_NUM}, {"paused_sessions", F_NUM},
    {"steps", F_NUM}, {"ms_per_token", F_NUM}, {"ms_per_token_avg", F_NUM},
    {"bytes_per_token_out", F_NUM}, {"batch_runs", F_NUM}, {"rss_bytes", F_NUM},
    {"weight_bytes", F_NUM}, {"kv_bytes", F_NUM}, {"standby", F_NUM}, {"waiting", F_BOOL},
    {"repairs", F_NUM}, {"last_repair_unix", F_NUM}, {"last_repair_rank", F_NUM},
};

static const struct rec_field link_fields[] = {
    {"peer_rank", F_NUM}, {"state", F_STR}, {"peer", F_STR}, {"bytes_in", F_NUM},
    {"bytes_out", F_NUM}, {"rtt_ms", F_NUM}, {"error", F_STR}, {"error_age_s", F_NUM},
};

/* A number a record may carry: finite, and no larger than a byte count can be. */
static bool num_ok(const cJSON *v)
{
    return cJSON_IsNumber(v) && isfinite(v->valuedouble) && fabs(v->valuedouble) <= 1e18;
}

/* Copy the known fields of in into out, each checked: false (why names the field) on a known
 * field of the wrong type. */
static bool copy_fields(const cJSON *in, cJSON *out, const struct rec_field *f, size_t nf,
                        const char *where, char *why, size_t n)
{
    for (size_t i = 0; i < nf; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(in, f[i].key);
        if (!v)
            continue;
        bool ok = true;
        switch (f[i].kind) {
        case F_NUM:
            if ((ok = num_ok(v)))
                cJSON_AddNumberToObject(out, f[i].key, v->valuedouble);
            break;
        case F_STR:
            if ((ok = cJSON_IsString(v)))
                add_str(out, f[i].key, v->valuestring);
            break;
        case F_BOOL:
            if ((ok = cJSON_IsBool(v)))
                cJSON_AddBoolToObject(out, f[i].key, cJSON_IsTrue(v));
            break;
        case F_WINDOW:
            ok = cJSON_IsArray(v) && cJSON_GetArraySize(v) == 2 && num_ok(cJSON_GetArrayItem(v, 0)) &&
                 num_ok(cJSON_GetArrayItem(v, 1));
            if (ok) {
                cJSON *w = cJSON_AddArrayToObject(out, f[i].key);
                cJSON_AddItemToArray(w, cJSON_CreateNumber(cJSON_GetArrayItem(v, 0)->valuedouble));
                cJSON_AddItemToArray(w, cJSON_CreateNumber(cJSON_GetArrayItem(v, 1)->valuedouble));
            }
            break;
        case F_LINK:
            if ((ok = cJSON_IsObject(v))) {
                cJSON *l = cJSON_AddObjectToObject(out, f[i].key);
                if (!copy_fields(v, l, link_fields, sizeof link_fields / sizeof link_fields[0],
                                 f[i].key, why, n))
                    return false;
            }
            break;
        }
        if (!ok) {
            snprintf(why, n, "STATUS record: field %s%s%s has the wrong type", where, where[0] ? "." : "",
                     f[i].key);
            return false;
        }
    }
    return true;
}

static uint32_t slot_age(const struct kvd_status_slot *sl, uint64_t now)
{
    uint64_t a = sl->age_rx + (now - sl->rx_ms);
    return a > UINT32_MAX ? UINT32_MAX : (uint32_t)a;
}

/* Who served a rank according to its record: node and pid. */
static void rec_who(const cJSON *r, char *out, size_t n)
{
    const cJSON *node = cJSON_GetObjectItemCaseSensitive(r, "node");
    snprintf(out, n, "%.16s/%.0f", cJSON_IsString(node) ? node->valuestring : "",
             util_json_number(r, "pid", 0));
}

static void send_rec(struct conn *c, uint32_t rank, uint32_t age, const char *rec, size_t len)
{
    if (c && c->up)
        kvd_conn_send(c, RING_F_STATUS, 0, 0, age, rank, rec, len);
}

int kvd_status_on_frame(struct conn *c, const struct ring_frame_hdr *h, const uint8_t *payload,
                        char *why, size_t n)
{
    struct stage *st = c->st;
    if (h->session != 0 || h->flags != 0) {
        snprintf(why, n, "STATUS with session %016" PRIx64 " flags 0x%02x (both must be 0)", h->session,
                 h->flags);
        return -EPROTO;
    }
    if (h->payload_len < 2 || h->payload_len > RING_STATUS_MAX) {
        snprintf(why, n, "STATUS payload_len %u not in [2, %u]", h->payload_len, RING_STATUS_MAX);
        return -EPROTO;
    }
    if (h->n_tokens >= st->n) {
        snprintf(why, n, "STATUS for rank %u of a ring of %u ranks", h->n_tokens, st->n);
        return -EPROTO;
    }
    cJSON *in = cJSON_ParseWithLength((const char *)payload, h->payload_len);
    const cJSON *rk = in ? cJSON_GetObjectItemCaseSensitive(in, "rank") : NULL;
    if (!cJSON_IsObject(in) || !num_ok(rk) || rk->valuedouble != h->n_tokens) {
        snprintf(why, n, "STATUS record for rank %u is not a JSON object with \"rank\": %u", h->n_tokens,
                 h->n_tokens);
        cJSON_Delete(in);
        return -EPROTO;
    }
    cJSON *rec = cJSON_CreateObject();
    bool ok = rec && copy_fields(in, rec, rec_fields, sizeof rec_fields / sizeof rec_fields[0], "", why, n);
    cJSON_Delete(in);
    if (!ok) {
        cJSON_Delete(rec);
        return rec ? -EPROTO : 0;
    }
    uint32_t r = h->n_tokens;
    struct kvd_status_slot *sl = &st->status.slot[r];
    uint64_t now = (uint64_t)util_now_ms();
    char *txt = NULL;
    /* This stage's own rank is never taken from a peer; an older record than the one held
     * is dropped (it came the long way round). */
    if (r != st->rank && !st->standby.waiting && (!sl->rx_ms || h->pos < slot_age(sl, now)) &&
        (txt = cJSON_PrintUnformatted(rec)) && strlen(txt) <= RING_STATUS_MAX) {
        size_t len = strlen(txt);
        memcpy(sl->rec, txt, len + 1);
        sl->rx_ms = now;
        sl->age_rx = h->pos;
        rec_who(rec, sl->who, sizeof sl->who);
        /* on along the way it came: from the in link to the out link and back */
        send_rec(c == st->links.in ? st->links.out : st->links.in, r, h->pos, sl->rec, len);
    }
    free(txt);
    cJSON_Delete(rec);
    return 0;
}

/* ================================ the tick ================================ */

/* Rank 0: a ring linked again after a break is a repair; the rank repaired is the one whose
 * node or process changed meanwhile, as its new record shows within STATUS_ANSWER_MS (-1 when
 * none did: a link came back by itself). */
static void note_repair(struct stage *st, bool linked)
{
    /* A rank whose record names another node or process than the one before was replaced
     * (a standby took it, or its node restarted): the rank a repair is named by. One repair
     * may see its ring link and break again before the replacement's record comes, so this
     * is kept apart from the counting below. */
    for (uint32_t r = 1; r < st->n; r++) {
        struct kvd_status_slot *sl = &st->status.slot[r];
        if (!sl->who[0])
            continue;
        if (sl->who_seen[0] && strcmp(sl->who, sl->who_seen) != 0)
            st->status.last_repair_rank = (int)r;
        memcpy(sl->who_seen, sl->who, sizeof sl->who_seen);
    }
    if (!linked) {
        st->status.broken = st->status.broken || st->status.was_linked;
        return;
    }
    if (st->status.broken) {
        st->status.broken = false;
        st->status.repairs++;
        st->status.last_repair_unix = (int64_t)time(NULL);
        kvd_log(KVD_LOG_INFO, "the ring is linked again (repair %" PRIu64 ")", st->status.repairs);
    }
    st->status.was_linked = true;
}

void kvd_status_tick(struct stage *st)
{
    if (st->standby.waiting)
        return;
    bool linked = kvd_conn_out_up(st) && kvd_conn_in_up(st);
    if (st->rank == 0)
        note_repair(st, linked);
    if (!kvd_conn_in_up(st) && !kvd_conn_out_up(st))
        return;
    /* The tick runs every TICK_MS; a record goes out once a STATUS_EVERY_MS. */
    uint64_t now = (uint64_t)util_now_ms();
    if (st->status.sent_ms && now - st->status.sent_ms < STATUS_EVERY_MS)
        return;
    st->status.sent_ms = now;
    /* Every string at its longest can pass RING_STATUS_MAX: then shorter ones. */
    char *txt = NULL;
    size_t len = 0;
    for (size_t cap = STATUS_STR_MAX; cap >= 24; cap /= 2) {
        cJSON *o = record(st, cap);
        free(txt);
        txt = o ? cJSON_PrintUnformatted(o) : NULL;
        cJSON_Delete(o);
        len = txt ? strlen(txt) : 0;
        if (len <= RING_STATUS_MAX)
            break;
    }
    if (txt && len <= RING_STATUS_MAX) {
        send_rec(st->links.in, st->rank, 0, txt, len);
        send_rec(st->links.out, st->rank, 0, txt, len);
    }
    free(txt);
}

void kvd_status_link_closed(struct stage *st)
{
    if (st->rank == 0 && st->status.was_linked)   /* even a break shorter than a tick */
        st->status.broken = true;
}

/* ================================ the view ================================ */

cJSON *kvd_status_ring(struct stage *st)
{
    cJSON *a = cJSON_CreateArray();
    uint64_t now = (uint64_t)util_now_ms();
    for (uint32_t r = 0; r < st->n; r++) {
        struct kvd_status_slot *sl = &st->status.slot[r];
        cJSON *e = NULL;
        if (r == st->rank && !st->standby.waiting) {
            e = kvd_status_record(st);
            cJSON_AddNumberToObject(e, "age_ms", 0);
            cJSON_AddBoolToObject(e, "answer", true);
        } else if (sl->rx_ms && (e = cJSON_Parse(sl->rec))) {
            uint32_t age = slot_age(sl, now);
            cJSON_AddNumberToObject(e, "age_ms", age);
            cJSON_AddBoolToObject(e, "answer", age <= STATUS_ANSWER_MS);
        } else {
            e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "rank", r);
            cJSON *w = cJSON_AddArrayToObject(e, "window");
            cJSON_AddItemToArray(w, cJSON_CreateNumber(st->m.ranks[r].first));
            cJSON_AddItemToArray(w, cJSON_CreateNumber(st->m.ranks[r].last));
            add_str(e, "endpoint", st->m.ranks[r].endpoint);
            cJSON_AddNullToObject(e, "age_ms");
            cJSON_AddBoolToObject(e, "answer", false);
        }
        cJSON_AddItemToArray(a, e);
    }
    /* A rank still answering by its record's age, but whose neighbours both answer and say
     * their links with it are down, is gone too: it shows so before its record grows old. */
    for (uint32_t r = 0; st->n > 2 && r < st->n; r++) {
        cJSON *e = cJSON_GetArrayItem(a, (int)r);
        const cJSON *p = cJSON_GetArrayItem(a, (int)((r + st->n - 1) % st->n));
        const cJSON *q = cJSON_GetArrayItem(a, (int)((r + 1) % st->n));
        if (r == st->rank || !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "answer")) ||
            !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "answer")) ||
            !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(q, "answer")))
            continue;
        const cJSON *po = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(p, "out"), "state");
        const cJSON *qi = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(q, "in"), "state");
        if (cJSON_IsString(po) && strcmp(po->valuestring, "up") != 0 && cJSON_IsString(qi) &&
            strcmp(qi->valuestring, "up") != 0) {
            util_json_set(e, "answer", cJSON_CreateFalse());
            cJSON_AddStringToObject(e, "reason", "both of its neighbours' links with it are down");
        }
    }
    return a;
}

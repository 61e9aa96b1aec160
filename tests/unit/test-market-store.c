/* test-market-store.c — the market's storage interface on SQLite (kvd/market/internal.h) and
 * its reward formula: nonces spent once, credit paid once per (session, rank, token range)
 * and never for an overlapping range, leases and windows round-trip, a rolled-back
 * transaction leaves nothing, the data survive a reopen, a newer schema is refused, blobs
 * round-trip and a version-1 database gains their table, voided credit leaves a zero balance,
 * the settlement sweep reaches every pending session however many there are; and the
 * known-answer probes' checks, challenges and judgements (kvd/market/probe.c), and an audit's
 * answer in parts: out of order, another count or past the budget refused, in order judged
 * whole with nothing left kept, rows out of place failing the node (kvd/market/audit.c); and
 * rank 0's audit: the ids it embedded after its prompt against the TOKENs it received, with
 * drafts accepted and rejected, a session ended with rejected drafts and a history a replay
 * cleared passing, and a rank 0 that fed a token no TOKEN gave failing; and the honest answers
 * to tests/lib/audit_fixture.h's audits (fuzz-audit's) passing, whole and in parts, the last
 * rank's refused without its TOKEN's logits, with logits not its own, and without the
 * session's sampling or with another (its digest folds it in).
 * With KV_MARKET_PG=postgres://... (tests/integration/test-market-pg.sh starts a throwaway server) the
 * same cases run on PostgreSQL; each case starts from an empty database. */
#include <math.h>
#include <cjson/cJSON.h>
#include <libpq-fe.h>
#include <openssl/evp.h>
#include <sqlite3.h>
#include <uv.h>

#include "tests/lib/t.h"
#include "kvd/market/internal.h"
#include "tests/lib/audit_fixture.h"
#include "ring/ring.h"
#include "util/err.h"
#include "util/util.h"

static const char *pg_url(void) { return getenv("KV_MARKET_PG"); }

/* Run sql on the case's database, bypassing the store (to wipe it or to tamper with it). */
static void raw_exec(const char *name, const char *sql)
{
    if (pg_url()) {
        PGconn *c = PQconnectdb(pg_url());
        PGresult *r = PQexec(c, sql);
        T_CHECK(PQresultStatus(r) == PGRES_COMMAND_OK, "%s: %s", sql, PQerrorMessage(c));
        PQclear(r);
        PQfinish(c);
        return;
    }
    char path[512];
    snprintf(path, sizeof path, "%s/%s", t_tmpdir(), name);
    sqlite3 *db;
    T_CHECK(sqlite3_open(path, &db) == SQLITE_OK, "sqlite open %s", path);
    T_CHECK(sqlite3_exec(db, sql, NULL, NULL, NULL) == SQLITE_OK, "%s: %s", sql, sqlite3_errmsg(db));
    sqlite3_close(db);
}

static struct kvd_market_store *open_store(const char *name, bool fresh)
{
    char path[512], err[KV_ERR_MAX];
    if (pg_url()) {
        if (fresh)
            raw_exec(name, "DROP SCHEMA public CASCADE; CREATE SCHEMA public");
        snprintf(path, sizeof path, "%s", pg_url());
    } else {
        snprintf(path, sizeof path, "%s/%s", t_tmpdir(), name);
    }
    struct kvd_market_store *s = NULL;
    int rc = kvd_market__store_open(&s, path, err, sizeof err);
    T_CHECK(rc == 0, "open %s: %s", path, err);
    return s;
}

T_CASE(nonce_once)
{
    struct kvd_market_store *s = open_store("n.db", true);
    T_ASSERT(s, "no store");
    const struct kvd_market_store_ops *o = s->ops;
    T_CHECK(o->nonce_use(s->impl, "aa", "0123456789abcdef", 100, 0) == 0, "first use");
    T_CHECK(o->nonce_use(s->impl, "aa", "0123456789abcdef", 101, 0) == -EEXIST, "replay refused");
    T_CHECK(o->nonce_use(s->impl, "bb", "0123456789abcdef", 101, 0) == 0, "another key's nonce");
    /* pruned once older than `before`: the caller keeps them for as long as ts is accepted */
    T_CHECK(o->nonce_use(s->impl, "cc", "ffff", 500, 200) == 0, "prune");
    T_CHECK(o->nonce_use(s->impl, "aa", "0123456789abcdef", 500, 200) == 0, "forgotten after prune");
    kvd_market__store_close(s);
}

T_CASE(credit_once)
{
    struct kvd_market_store *s = open_store("c.db", true);
    T_ASSERT(s, "no store");
    const struct kvd_market_store_ops *o = s->ops;
    uint64_t lt;
    double cr;
    T_CHECK(o->credit_add(s->impl, "s1", 0, 0, 10, "nodeA", 20, 0.02) == 0, "credit");
    T_CHECK(o->credit_add(s->impl, "s1", 0, 0, 10, "nodeA", 20, 0.02) == -EEXIST, "same range twice");
    T_CHECK(o->credit_add(s->impl, "s1", 0, 5, 15, "nodeA", 20, 0.02) == -EEXIST, "overlap");
    T_CHECK(o->credit_add(s->impl, "s1", 0, 9, 10, "nodeA", 2, 0.002) == -EEXIST, "inside");
    T_CHECK(o->credit_add(s->impl, "s1", 0, 10, 12, "nodeA", 4, 0.004) == 0, "adjacent range");
    T_CHECK(o->credit_add(s->impl, "s1", 1, 0, 10, "nodeB", 30, 0.03) == 0, "another rank");
    T_CHECK(o->credit_add(s->impl, "s2", 0, 0, 10, "nodeA", 20, 0.02) == 0, "another session");
    o->balance_get(s->impl, "nodeA", &lt, &cr);
    T_CHECK(lt == 44 && fabs(cr - 0.044) < 1e-12, "nodeA: %llu %g", (unsigned long long)lt, cr);
    o->balance_get(s->impl, "nobody", &lt, &cr);
    T_CHECK(lt == 0 && cr == 0, "unknown node: zero");
    kvd_market__store_close(s);
}

T_CASE(rollback_and_reopen)
{
    struct kvd_market_store *s = open_store("r.db", true);
    T_ASSERT(s, "no store");
    const struct kvd_market_store_ops *o = s->ops;
    struct kvd_market_lease l = {.window = 2, .node = "nodeA", .state = KVD_LEASE_ACTIVE,
                                 .expires = 123.5, .since = 100, .endpoint = "tcp://127.0.0.1:1"};
    struct kvd_market_window w[2] = {{0, 0, 3, 100}, {1, 3, 5, 50}}, g[4];
    size_t n;
    T_CHECK(o->begin(s->impl) == 0, "begin");
    o->lease_put(s->impl, "m", &l);
    o->credit_add(s->impl, "s", 0, 0, 1, "nodeA", 1, 1);
    o->rollback(s->impl);
    struct kvd_market_lease got;
    T_CHECK(o->lease_get(s->impl, "m", 2, &got) == -ENOENT, "rolled-back lease is gone");
    T_CHECK(o->begin(s->impl) == 0, "begin");
    T_CHECK(o->lease_put(s->impl, "m", &l) == 0 && o->windows_set(s->impl, "m", w, 2) == 0, "writes");
    T_CHECK(o->commit(s->impl) == 0, "commit");
    kvd_market__store_close(s);
    s = open_store("r.db", false);
    T_ASSERT(s, "reopen");
    o = s->ops;
    T_CHECK(o->lease_get(s->impl, "m", 2, &got) == 0 && !strcmp(got.node, "nodeA") &&
            got.state == KVD_LEASE_ACTIVE && got.expires == 123.5 &&
            !strcmp(got.endpoint, "tcp://127.0.0.1:1"), "lease after reopen");
    T_CHECK(o->windows_get(s->impl, "m", g, 4, &n) == 0 && n == 2 && g[1].first == 3 &&
            g[1].last == 5 && g[0].bytes == 100, "windows after reopen");
    uint64_t lt;
    double cr;
    o->balance_get(s->impl, "nodeA", &lt, &cr);
    T_CHECK(lt == 0, "rolled-back credit is gone");
    kvd_market__store_close(s);
}

T_CASE(newer_schema_refused)
{
    struct kvd_market_store *s = open_store("v.db", true);
    T_ASSERT(s, "no store");
    kvd_market__store_close(s);
    char path[512], err[KV_ERR_MAX] = "";
    snprintf(path, sizeof path, "%s/v.db", t_tmpdir());
    raw_exec("v.db", "UPDATE meta SET v='99' WHERE k='schema'");
    T_CHECK(kvd_market__store_open(&s, pg_url() ? pg_url() : path, err, sizeof err) < 0 &&
            strstr(err, "newer"), "a newer schema must be refused: %s", err);
    T_CHECK(kvd_market__store_open(&s, "postgres://127.0.0.1:1/x?connect_timeout=2", err, sizeof err) < 0 && err[0],
            "an unreachable postgres:// fails with a reason");
}

T_CASE(blobs_and_voids)
{
    struct kvd_market_store *s = open_store("b.db", true);
    T_ASSERT(s, "no store");
    const struct kvd_market_store_ops *o = s->ops;
    char *v = NULL;
    T_CHECK(o->blob_get(s->impl, "probes/m", &v) == -ENOENT && !v, "no blob yet");
    size_t big = 700 << 10;   /* a probe set's size */
    char *text = malloc(big + 1);
    T_ASSERT(text, "oom");
    memset(text, 'A', big);
    text[big] = 0;
    T_CHECK(o->blob_put(s->impl, "probes/m", text) == 0, "put");
    T_CHECK(o->blob_put(s->impl, "probes/m", "{\"x\":1}") == 0, "replace");
    T_CHECK(o->blob_put(s->impl, "check/m/0", text) == 0, "another");
    T_CHECK(o->credit_add(s->impl, "s1", 0, 0, 10, "nodeA", 20, 0.02) == 0, "credit");
    uint64_t lt;
    double cr;
    T_CHECK(o->credit_void(s->impl, "nodeA", 5, "spot probe failed", &lt, &cr) == 0 && lt == 20 &&
            fabs(cr - 0.02) < 1e-12, "void: %llu %g", (unsigned long long)lt, cr);
    o->balance_get(s->impl, "nodeA", &lt, &cr);
    T_CHECK(lt == 0 && cr == 0, "a voided balance is zero");
    T_CHECK(o->credit_add(s->impl, "s1", 0, 0, 10, "nodeA", 20, 0.02) == -EEXIST,
            "voided work is not credited again");
    T_CHECK(o->credit_void(s->impl, "nobody", 5, "x", &lt, &cr) == 0 && lt == 0 && cr == 0,
            "voiding nothing");
    kvd_market__store_close(s);
    s = open_store("b.db", false);
    T_ASSERT(s, "reopen");
    o = s->ops;
    T_CHECK(o->blob_get(s->impl, "probes/m", &v) == 0 && v && !strcmp(v, "{\"x\":1}"), "after reopen");
    free(v);
    T_CHECK(o->blob_get(s->impl, "check/m/0", &v) == 0 && v && strlen(v) == big, "a large blob");
    free(v);
    T_CHECK(o->blob_put(s->impl, "check/m/0", NULL) == 0 &&
            o->blob_get(s->impl, "check/m/0", &v) == -ENOENT, "deleted");
    kvd_market__store_close(s);
    /* a database of schema version 1 (before blobs and voids) gains their tables */
    raw_exec("b.db", "DROP TABLE blobs; DROP TABLE voids; UPDATE meta SET v='1' WHERE k='schema'");
    s = open_store("b.db", false);
    T_ASSERT(s, "open a version-1 database");
    T_CHECK(s->ops->blob_put(s->impl, "k", "v") == 0, "blobs after the upgrade");
    T_CHECK(s->ops->credit_void(s->impl, "nodeA", 6, "x", &lt, &cr) == 0, "voids after the upgrade");
    kvd_market__store_close(s);
    free(text);
}

/* A probe set of n_layers 3, n_embd 4, S sequences of 2 tokens: boundary l of sequence q is
 * filled with q + l + position/10. */
static cJSON *probe_set(int S)
{
    cJSON *set = cJSON_CreateObject(), *seqs = cJSON_AddArrayToObject(set, "seqs");
    cJSON_AddNumberToObject(set, "n_layers", 3);
    cJSON_AddNumberToObject(set, "n_embd", 4);
    for (int q = 0; q < S; q++) {
        cJSON *o = cJSON_CreateObject(), *t = cJSON_AddArrayToObject(o, "tokens");
        cJSON *b = cJSON_AddArrayToObject(o, "bounds"), *g = cJSON_AddArrayToObject(o, "greedy");
        cJSON *c = cJSON_AddArrayToObject(o, "clear");
        for (int i = 0; i < 2; i++) {
            cJSON_AddItemToArray(t, cJSON_CreateNumber(q * 2 + i));
            cJSON_AddItemToArray(g, cJSON_CreateNumber(100 + q * 2 + i));
            cJSON_AddItemToArray(c, cJSON_CreateBool(i == 0));
        }
        for (int l = 1; l < 3; l++) {
            float x[8];
            for (int i = 0; i < 8; i++)
                x[i] = (float)(q + l) + (float)(i / 4) / 10;
            char *e = ring_probe_rows_encode(x, 8);
            cJSON_AddItemToArray(b, cJSON_CreateString(e));
            free(e);
        }
        cJSON_AddItemToArray(seqs, o);
    }
    return set;
}

/* The answer an honest window [.., last) gives to challenge seqs, scaled by f (1: right). */
static cJSON *probe_answer(const cJSON *seqs, uint32_t last, float f, int wrong_token)
{
    cJSON *outs = cJSON_CreateArray();
    const cJSON *q;
    cJSON_ArrayForEach(q, seqs) {
        int k = (int)q->valuedouble;
        cJSON *o = cJSON_CreateObject();
        if (last == 3) {
            cJSON *t = cJSON_AddArrayToObject(o, "tokens");
            for (int i = 0; i < 2; i++)
                cJSON_AddItemToArray(t, cJSON_CreateNumber(100 + k * 2 + i + (i == wrong_token)));
        } else {
            float x[8];
            for (int i = 0; i < 8; i++)
                x[i] = ((float)(k + (int)last) + (float)(i / 4) / 10) * f;
            char *e = ring_probe_rows_encode(x, 8);
            cJSON_AddStringToObject(o, "output", e);
            free(e);
        }
        cJSON_AddItemToArray(outs, o);
    }
    return outs;
}

T_CASE(probe_judge)
{
    char why[512];
    cJSON *set = probe_set(4);
    T_CHECK(kvd_market__probes_check(set, 3, 4, why, sizeof why) == 0, "a good set: %s", why);
    T_CHECK(kvd_market__probes_check(set, 4, 4, why, sizeof why) == -EINVAL, "n_layers differs");
    T_CHECK(kvd_market__probes_check(set, 3, 8, why, sizeof why) == -EINVAL, "n_embd differs");
    cJSON *bad = cJSON_Duplicate(set, 1);
    cJSON *b0 = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(bad, "seqs"), 2), "bounds");
    cJSON_ReplaceItemInArray(b0, 1, cJSON_CreateString("AAAA"));
    T_CHECK(kvd_market__probes_check(bad, 3, 4, why, sizeof why) == -EINVAL && strstr(why, "seqs[2]"),
            "a short boundary: %s", why);
    cJSON_Delete(bad);
    cJSON *huge = cJSON_CreateObject();
    cJSON_AddNumberToObject(huge, "n_layers", 3);
    cJSON_AddNumberToObject(huge, "n_embd", 4);
    T_CHECK(kvd_market__probes_check(huge, 3, 4, why, sizeof why) == -EINVAL, "no seqs");
    cJSON_Delete(huge);

    /* challenges: a random subset in a random order, inputs where the window starts */
    bool orders[4][4] = {{0}};
    for (int r = 0; r < 40; r++) {
        cJSON *seqs, *ch = kvd_market__probe_challenge(set, 1, 2, &seqs);
        T_ASSERT(ch && cJSON_GetArraySize(seqs) == 2, "two sequences asked");
        int a = (int)cJSON_GetArrayItem(seqs, 0)->valuedouble, b = (int)cJSON_GetArrayItem(seqs, 1)->valuedouble;
        T_CHECK(a != b && a >= 0 && a < 4 && b >= 0 && b < 4, "distinct sequences %d %d", a, b);
        orders[a][b] = true;
        const cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(ch, "seqs"), 0);
        const cJSON *in = cJSON_GetObjectItemCaseSensitive(c0, "input");
        float x[8];
        T_CHECK(cJSON_IsString(in) && ring_probe_rows_decode(in->valuestring, x, 8) == 0 &&
                x[0] == (float)(a + 1), "the input is boundary 1 of sequence %d", a);
        double e;
        cJSON *ok = probe_answer(seqs, 2, 1, -1), *off = probe_answer(seqs, 2, 1.2f, -1);
        T_CHECK(kvd_market__probe_judge(set, 2, seqs, ok, &e, why, sizeof why) == 0 && e < 1e-6,
                "the right answer passes: %s", why);
        T_CHECK(kvd_market__probe_judge(set, 2, seqs, off, &e, why, sizeof why) == -EBADMSG &&
                e > RING_PROBE_TOL, "a 20%% error fails");
        cJSON_Delete(ok);
        cJSON_Delete(off);
        cJSON_Delete(seqs);
        cJSON_Delete(ch);
    }
    int seen = 0;
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++)
            seen += orders[a][b];
    T_CHECK(seen >= 4, "40 challenges asked only %d ordered pairs", seen);

    /* the first window gets tokens; the last is judged by its clear greedy tokens */
    cJSON *seqs, *ch = kvd_market__probe_challenge(set, 0, 3, &seqs);
    const cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(ch, "seqs"), 0);
    T_CHECK(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(c0, "tokens")) == 2 &&
            !cJSON_GetObjectItemCaseSensitive(c0, "input"), "window 0 gets tokens");
    double e;
    cJSON *ok = probe_answer(seqs, 3, 1, -1), *unclear = probe_answer(seqs, 3, 1, 1),
          *wrong = probe_answer(seqs, 3, 1, 0);
    T_CHECK(kvd_market__probe_judge(set, 3, seqs, ok, &e, why, sizeof why) == 0, "right tokens");
    T_CHECK(kvd_market__probe_judge(set, 3, seqs, unclear, &e, why, sizeof why) == 0,
            "a differing token where the lead was not clear is not held against it");
    T_CHECK(kvd_market__probe_judge(set, 3, seqs, wrong, &e, why, sizeof why) == -EBADMSG,
            "a wrong clear token fails");
    cJSON *none = cJSON_CreateArray();
    T_CHECK(kvd_market__probe_judge(set, 3, seqs, none, &e, why, sizeof why) == -EINVAL,
            "missing answers are malformed");
    cJSON_Delete(none);
    cJSON_Delete(ok);
    cJSON_Delete(unclear);
    cJSON_Delete(wrong);
    cJSON_Delete(seqs);
    cJSON_Delete(ch);
    cJSON_Delete(set);
}

/* The settlement sweep walks every pending session, however many: 300 pending sessions,
 * each kept pending (no paying client opened it, so nothing settles it), then one whose
 * record is gone, past the first page: a few sweeps reach it and drop its pending key. The
 * keys a page holds come in order and past the cursor (blob_keys' after). */
T_CASE(sweep_walks_every_pending)
{
    struct kvd_market_store *s = open_store("w.db", true);
    T_ASSERT(s, "no store");
    const struct kvd_market_store_ops *o = s->ops;
    enum { N = 300 };
    T_ASSERT(o->begin(s->impl) == 0, "begin");
    for (int i = 0; i < N; i++) {
        char k[64];
        snprintf(k, sizeof k, "pend/s%04d", i);
        T_ASSERT(o->blob_put(s->impl, k, "{\"at\":0}") == 0, "put %s", k);
        if (i < N - 1) {   /* the last one's record is gone */
            snprintf(k, sizeof k, "sess/s%04d", i);
            T_ASSERT(o->blob_put(s->impl, k, "{}") == 0, "put %s", k);
        }
    }
    T_ASSERT(o->commit(s->impl) == 0, "commit");
    char (*keys)[KVD_MARKET_KEY_MAX] = malloc(N * sizeof *keys);
    T_ASSERT(keys, "oom");
    size_t n = 0;
    T_CHECK(o->blob_keys(s->impl, "pend/", "pend/s0099", keys, N, &n) == 0 && n == N - 100 &&
                !strcmp(keys[0], "pend/s0100") && !strcmp(keys[n - 1], "pend/s0299"),
            "the keys past a cursor, in order: %zu", n);
    T_CHECK(o->blob_keys(s->impl, "pend/", "pend/s0299", keys, N, &n) == 0 && n == 0,
            "none past the last");
    free(keys);
    struct kvd_market_config cfg;
    kvd_market__config_default(&cfg);
    cfg.settle_wait_s = 1;
    char after[KVD_MARKET_KEY_MAX] = "";
    char *v = NULL;
    int sweeps = 0;
    while (sweeps < 4 && o->blob_get(s->impl, "pend/s0299", &v) == 0) {
        free(v);
        v = NULL;
        size_t paid = 0;
        T_ASSERT(o->begin(s->impl) == 0, "begin");
        T_CHECK(kvd_market__session_sweep(s, &cfg, 1000, after, NULL, NULL, &paid) == 0 &&
                    paid == 0, "sweep %d", sweeps);
        T_ASSERT(o->commit(s->impl) == 0, "commit");
        sweeps++;
    }
    free(v);
    T_CHECK(o->blob_get(s->impl, "pend/s0299", &v) == -ENOENT,
            "the pending session past the first page was never reached (%d sweeps)", sweeps);
    free(v);
    v = NULL;
    T_CHECK(o->blob_get(s->impl, "pend/s0000", &v) == 0, "a pending session was dropped");
    free(v);
    kvd_market__store_close(s);
}

T_CASE(reward_formula)
{
    struct kvd_market_config c;
    kvd_market__config_default(&c);
    double b = c.reward_base;
    T_CHECK(kvd_market__reward(&c, 0, 1) == b, "covered, no demand: the base");
    T_CHECK(fabs(kvd_market__reward(&c, 0, 0) - 3 * b) < 1e-15, "uncovered pays 3x");
    T_CHECK(fabs(kvd_market__reward(&c, c.demand_ref, 1) - 1.5 * b) < 1e-15, "demand D: 1.5x");
    T_CHECK(kvd_market__reward(&c, 1e9, 0) <= 6 * b, "clamped");
    T_CHECK(kvd_market__reward(&c, 5, 0) > kvd_market__reward(&c, 5, 0.5) &&
            kvd_market__reward(&c, 5, 0.5) > kvd_market__reward(&c, 5, 1), "falls with coverage");
    T_CHECK(kvd_market__reward(&c, 20, 1) > kvd_market__reward(&c, 2, 1), "rises with demand");
    T_CHECK(kvd_market__reward(&c, NAN, -3) >= b, "nonsense in: still within the clamp");
}

/* ---- an audit's answer in parts (kvd/market/audit.c; docs/market.md, "Audits") ---- */

#define AP_N 40   /* positions of the audited range: rows of 4 f32 values */
#define AP_E 4

static void ap_row(uint32_t pos, int side, float x[AP_E])
{
    for (int i = 0; i < AP_E; i++)
        x[i] = (float)(pos * 10 + i) * (side == KVD_SIDE_SENT ? 1.5f : 0.5f);
}

/* {"pos", "row", "path"}: position pos of one side's tree */
static cJSON *ap_opening(uint8_t (*leaves)[32], uint32_t pos, int side)
{
    float x[AP_E];
    ap_row(pos, side, x);
    return af_open((const uint8_t (*)[32])leaves, AP_N, x, sizeof x, pos);
}

/* A pending audit of rank 1 (receipt [0, AP_N)) with its received side in: its id. */
static void ap_pending(struct kvd_market_store *st, struct kvd_market_audit *au, const char *session,
                       uint8_t (*sent)[32], uint8_t (*recv)[32], char id[17], uint32_t *pos)
{
    for (uint32_t p = 0; p < AP_N; p++) {
        float x[AP_E];
        ap_row(p, KVD_SIDE_SENT, x);
        ring_merkle_leaf(p, x, sizeof x, sent[p]);
        ap_row(p, KVD_SIDE_RECEIVED, x);
        ring_merkle_leaf(p, x, sizeof x, recv[p]);
    }
    /* the audited position, drawn at random, set to 8: inputs to split over the parts */
    T_CHECK(af_pending_on(st, au, "n1", session, 1, (const uint8_t (*)[32])sent,
                          (const uint8_t (*)[32])recv, AP_N, NULL, NULL, 8, NULL, 1000, NULL) == 0,
            "audit drawn, its received side in");
    cJSON *ch = NULL;
    char why[512];
    T_CHECK(kvd_market__audit_due(au, "m", "n1", 1001, &ch, why, sizeof why) == 0 && ch, "a challenge");
    snprintf(id, 17, "%s", util_json_string(ch, "id") ? util_json_string(ch, "id") : "");
    *pos = (uint32_t)util_json_number(ch, "position", 0);
    cJSON_Delete(ch);
}

/* part k of n of the answer (the inputs split evenly over the parts, the output in part 0) */
static cJSON *ap_part(const char *id, uint8_t (*sent)[32], uint8_t (*recv)[32], uint32_t pos,
                      int k, int n, bool swap)
{
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "id", id);
    if (n > 1) {
        cJSON_AddNumberToObject(b, "part", k);
        cJSON_AddNumberToObject(b, "parts", n);
    }
    if (k == 0)
        cJSON_AddItemToArray(cJSON_AddArrayToObject(b, "outputs"), ap_opening(sent, pos, KVD_SIDE_SENT));
    cJSON *in = cJSON_AddArrayToObject(b, "inputs");
    uint32_t per = (pos + 1 + n - 1) / n, a = k * per, e = a + per < pos + 1 ? a + per : pos + 1;
    for (uint32_t p = a; p < e; p++)
        cJSON_AddItemToArray(in, ap_opening(recv, swap && p == a && p + 1 < e ? p + 1 :
                                           swap && p == a + 1 ? a : p, KVD_SIDE_RECEIVED));
    return b;
}

/* Node's answer b (taken) to the audit pending on it: the judge's code. */
static int answer_of(struct kvd_market_audit *au, const char *node, cJSON *b, const char **verdict,
                     bool *settled, char *why, size_t n)
{
    int rc = kvd_market__audit_answer(au, "m", node, b, 1002, settled, verdict, why, n);
    cJSON_Delete(b);
    return rc;
}

static int ap_send(struct kvd_market_audit *au, cJSON *b, const char **verdict, bool *settled,
                   char *why, size_t n)
{
    return answer_of(au, "n1", b, verdict, settled, why, n);
}

static size_t ap_kept(struct kvd_market_store *st)
{
    char keys[8][KVD_MARKET_KEY_MAX];
    size_t n = 0;
    st->ops->blob_keys(st->impl, "auditpart/", NULL, keys, 8, &n);
    return n;
}

/* A store of its own and the audits' state on it, audit_rate 1, answers of kib KiB at most
 * (0: the default). */
struct audit_env {
    struct kvd_market_store *st;
    uv_loop_t loop;
    struct kvd_market_audit *au;
};

static bool audit_env_open(struct audit_env *e, const char *db, double kib)
{
    struct kvd_market_config cfg;
    kvd_market__config_default(&cfg);
    cfg.audit_rate = 1;
    if (kib > 0)
        cfg.audit_answer_kib = kib;
    uv_loop_init(&e->loop);
    e->au = NULL;
    e->st = open_store(db, true);
    return e->st && kvd_market__audit_new(&e->au, &e->loop, e->st, &cfg, NULL, NULL) == 0;
}

static void audit_env_close(struct audit_env *e)
{
    kvd_market__audit_free(e->au);
    uv_loop_close(&e->loop);
    if (e->st)
        kvd_market__store_close(e->st);
}

T_CASE(audit_parts)
{
    struct audit_env e;   /* the parts a node keeps: at most 64 KiB and one request */
    T_ASSERT(audit_env_open(&e, "ap.db", 64), "audit state");
    struct kvd_market_store *st = e.st;
    struct kvd_market_audit *au = e.au;
    static uint8_t sent[AP_N][32], recv[AP_N][32];
    char id[17], why[512];
    uint32_t pos;
    const char *v;
    bool settled;
    ap_pending(st, au, "0123456789abcdef", sent, recv, id, &pos);
    T_ASSERT(pos == 8, "the audited position is %u", pos);
    /* out of order, a wrong count, too much: refused, nothing kept past part 0 */
    T_CHECK(ap_send(au, ap_part(id, sent, recv, pos, 1, 3, false), &v, &settled, why, sizeof why) == -EINVAL &&
            strstr(why, "out of order"), "part 1 before part 0: %s", why);
    T_CHECK(ap_send(au, ap_part(id, sent, recv, pos, 0, 3, false), &v, &settled, why, sizeof why) == 0 &&
            !strcmp(v, "more") && !settled, "part 0 kept");
    T_CHECK(ap_send(au, ap_part(id, sent, recv, pos, 2, 3, false), &v, &settled, why, sizeof why) == -EINVAL &&
            strstr(why, "out of order"), "part 2 after part 0: %s", why);
    T_CHECK(ap_send(au, ap_part(id, sent, recv, pos, 1, 4, false), &v, &settled, why, sizeof why) == -EINVAL &&
            strstr(why, "out of order"), "another count: %s", why);
    cJSON *big = ap_part(id, sent, recv, pos, 1, 3, false);
    cJSON *junk = cJSON_AddArrayToObject(big, "token_ids");
    for (int i = 0; i < 150000; i++)
        cJSON_AddItemToArray(junk, cJSON_CreateNumber(1234567));
    T_CHECK(ap_send(au, big, &v, &settled, why, sizeof why) == -EINVAL && strstr(why, "more than 64 KiB"),
            "parts past the budget: %s", why);
    T_CHECK(ap_kept(st) == 1, "only part 0 kept (%zu)", ap_kept(st));
    /* part 0 again starts over; then the parts in order: judged on their proofs, nothing kept */
    T_CHECK(ap_send(au, ap_part(id, sent, recv, pos, 0, 3, false), &v, &settled, why, sizeof why) == 0 &&
            !strcmp(v, "more"), "part 0 again");
    T_CHECK(ap_send(au, ap_part(id, sent, recv, pos, 1, 3, false), &v, &settled, why, sizeof why) == 0 &&
            !strcmp(v, "more"), "part 1: %s", why);
    int rc = ap_send(au, ap_part(id, sent, recv, pos, 2, 3, false), &v, &settled, why, sizeof why);
    T_CHECK(rc == 0 && settled && !strcmp(v, "pass"), "the whole answer passes on its proofs (rc %d: %s)", rc, why);
    T_CHECK(ap_kept(st) == 0, "the parts removed (%zu kept)", ap_kept(st));
    /* a second audit: two inputs swapped across the parts' order fail the node */
    ap_pending(st, au, "0123456789abcdee", sent, recv, id, &pos);
    T_ASSERT(pos == 8, "the audited position is %u", pos);
    T_CHECK(ap_send(au, ap_part(id, sent, recv, pos, 0, 2, false), &v, &settled, why, sizeof why) == 0, "part 0");
    rc = ap_send(au, ap_part(id, sent, recv, pos, 1, 2, true), &v, &settled, why, sizeof why);
    T_CHECK(rc == -EBADMSG, "inputs out of place in the parts fail the node (rc %d: %s)", rc, why);
    audit_env_close(&e);
}

/* ---- rank 0's audit: the ids it fed against the TOKENs it received ---- */

#define FC_N 12   /* positions [0, 12): a prompt of 4, then generation with drafts */

/* The session (one rank 0 of 3 ran): prompt 0..3; TOKEN at leaf 3 gives 4 = 50; the pass at 4
 * feeds 50 and drafts 61 62 63 at 5..7, and its TOKEN (leaf 4) accepts 61 62 and gives 70 at 7;
 * the pass at 7 feeds 70 with drafts 81 82, its TOKEN (leaf 7) rejects both and gives 90 at 8;
 * the pass at 8 gives 91 at 9 (leaf 8); the pass at 9 feeds 91 and drafts 101 102 at 10, 11,
 * and its TOKEN (leaf 9) accepts 101 and gives 110 at 11: the session ends there, 102 stays fed
 * at 11 (rejected). */
static const int32_t fc_ids[FC_N] = {1, 2, 3, 4, 50, 61, 62, 70, 90, 91, 101, 102};
struct fc_tok {
    uint32_t leaf, n;
    int32_t t[3];
};
static const struct fc_tok fc_toks[] = {{3, 1, {50}}, {4, 3, {61, 62, 70}}, {7, 1, {90}},
                                        {8, 1, {91}}, {9, 2, {101, 110}}};

/* leaf pos's received row (a TOKEN summary, or none) into row: its length */
static size_t fc_row(const struct fc_tok *toks, size_t nt, uint32_t pos, uint8_t *row)
{
    float lg[AF_V];
    for (size_t i = 0; i < nt; i++)
        if (toks[i].leaf == pos) {   /* as the last rank makes them (audit_fixture.h) */
            size_t sl = af_token_row(AF_LAST, pos, toks[i].n, toks[i].t, row, lg);
            T_CHECK(sl > 0, "summary at %u", pos);
            return sl;
        }
    return 0;
}
/* An audit of rank 0 at position q of a session whose received TOKENs are toks (its received
 * side, of rank 2, in), answered with the ids ids (the sent rows are the fixed ap_row ones):
 * the answer's return code, its verdict in *v. */
static int fc_audit(struct kvd_market_store *st, struct kvd_market_audit *au, const char *session,
                    const struct fc_tok *toks, size_t nt, const int32_t *ids, uint32_t q,
                    bool with_received, const char **v, char *why, size_t wn)
{
    static uint8_t sent[FC_N][32], recv[FC_N][32];
    uint8_t rows[FC_N][RING_TOKEN_LEAF_MAX];
    size_t lens[FC_N];
    for (uint32_t p = 0; p < FC_N; p++) {
        float x[AP_E];
        ap_row(p, KVD_SIDE_SENT, x);
        ring_merkle_leaf(p, x, sizeof x, sent[p]);
        lens[p] = fc_row(toks, nt, p, rows[p]);
        ring_merkle_leaf(p, lens[p] ? rows[p] : NULL, lens[p], recv[p]);
    }
    T_CHECK(af_pending_on(st, au, "n1", session, 0, (const uint8_t (*)[32])sent,
                          (const uint8_t (*)[32])recv, FC_N, NULL, NULL, q, NULL, 1000, NULL) == 0,
            "audit drawn, its received side in");
    cJSON *ch = NULL;
    T_CHECK(kvd_market__audit_due(au, "m", "n1", 1001, &ch, why, wn) == 0 && ch, "a challenge");
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "id", util_json_string(ch, "id") ? util_json_string(ch, "id") : "");
    cJSON_Delete(ch);
    float x[AP_E];
    ap_row(q, KVD_SIDE_SENT, x);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(b, "outputs"), af_open((const uint8_t (*)[32])sent, FC_N, x, sizeof x, q));
    cJSON *in = with_received ? cJSON_AddArrayToObject(b, "received") : NULL;
    cJSON *t = cJSON_AddArrayToObject(b, "token_ids");
    for (uint32_t p = 0; p <= q; p++) {
        if (in)
            cJSON_AddItemToArray(in, af_open((const uint8_t (*)[32])recv, FC_N, rows[p], lens[p], p));
        cJSON_AddItemToArray(t, cJSON_CreateNumber(ids[p]));
    }
    bool settled;
    return answer_of(au, "n1", b, v, &settled, why, wn);
}

T_CASE(audit_rank0_feed)
{
    struct audit_env e;
    T_ASSERT(audit_env_open(&e, "fc.db", 0), "audit state");
    struct kvd_market_store *st = e.st;
    struct kvd_market_audit *au = e.au;
    const size_t nt = sizeof fc_toks / sizeof fc_toks[0];
    char why[512], sid[17];
    const char *v = "";
    int32_t ids[FC_N];
    int k = 0, rc;
    /* honest: every position, drafts accepted and rejected, the session's end */
    for (uint32_t q = 0; q < FC_N; q++) {
        snprintf(sid, sizeof sid, "00000000000000%02x", k++);
        rc = fc_audit(st, au, sid, fc_toks, nt, fc_ids, q, true, &v, why, sizeof why);
        T_CHECK(rc == 0 && !strcmp(v, "pass"), "honest, position %u: rc %d (%s)", q, rc, why);
    }
    /* rank 0 fed a token no TOKEN gave: the one after a TOKEN, an accepted draft, the one
     * after a rejected draft, the last one whose TOKEN came */
    const uint32_t bad_at[] = {4, 6, 8, 9, 10};
    for (size_t i = 0; i < sizeof bad_at / sizeof bad_at[0]; i++) {
        memcpy(ids, fc_ids, sizeof ids);
        ids[bad_at[i]] += 7;
        snprintf(sid, sizeof sid, "00000000000000%02x", k++);
        rc = fc_audit(st, au, sid, fc_toks, nt, ids, FC_N - 1, true, &v, why, sizeof why);
        T_CHECK(rc == -EBADMSG && strstr(why, "rank 0 embedded token"),
                "fed wrong at %u: rc %d (%s)", bad_at[i], rc, why);
    }
    /* ... and audited at that position itself, or before it: caught, or nothing to see yet */
    memcpy(ids, fc_ids, sizeof ids);
    ids[8] = 33;
    snprintf(sid, sizeof sid, "00000000000000%02x", k++);
    rc = fc_audit(st, au, sid, fc_toks, nt, ids, 8, true, &v, why, sizeof why);
    T_CHECK(rc == -EBADMSG, "fed wrong at 8, audited at 8: rc %d (%s)", rc, why);
    snprintf(sid, sizeof sid, "00000000000000%02x", k++);
    rc = fc_audit(st, au, sid, fc_toks, nt, ids, 7, true, &v, why, sizeof why);
    T_CHECK(rc == 0 && !strcmp(v, "pass"), "fed wrong at 8, audited at 7: rc %d (%s)", rc, why);
    /* the rejected draft left at the end is no token of a TOKEN: any id passes there */
    memcpy(ids, fc_ids, sizeof ids);
    ids[11] = 5;
    snprintf(sid, sizeof sid, "00000000000000%02x", k++);
    rc = fc_audit(st, au, sid, fc_toks, nt, ids, FC_N - 1, true, &v, why, sizeof why);
    T_CHECK(rc == 0, "a rejected draft at the end: rc %d (%s)", rc, why);
    /* a TOKEN that does not follow from the one before (its leaf skips what that one gave) */
    const struct fc_tok gap[] = {{3, 1, {50}}, {4, 2, {61, 62}}, {7, 1, {90}}, {8, 1, {91}}};
    snprintf(sid, sizeof sid, "00000000000000%02x", k++);
    rc = fc_audit(st, au, sid, gap, 4, fc_ids, 9, true, &v, why, sizeof why);
    T_CHECK(rc == -EBADMSG && strstr(why, "the one before gave"), "a gap: rc %d (%s)", rc, why);
    /* a replay cleared the history's TOKENs: from the first one left on, checked */
    const struct fc_tok replayed[] = {{7, 1, {90}}, {8, 1, {91}}, {9, 2, {101, 110}}};
    memcpy(ids, fc_ids, sizeof ids);
    ids[5] = 3;   /* the history: not a TOKEN's any more */
    snprintf(sid, sizeof sid, "00000000000000%02x", k++);
    rc = fc_audit(st, au, sid, replayed, 3, ids, FC_N - 1, true, &v, why, sizeof why);
    T_CHECK(rc == 0 && !strcmp(v, "pass"), "a replayed history: rc %d (%s)", rc, why);
    ids[9] = 3;
    snprintf(sid, sizeof sid, "00000000000000%02x", k++);
    rc = fc_audit(st, au, sid, replayed, 3, ids, FC_N - 1, true, &v, why, sizeof why);
    T_CHECK(rc == -EBADMSG, "a replayed history, fed wrong after it: rc %d (%s)", rc, why);
    /* the received TOKENs left out: refused (a retry may bring them) */
    snprintf(sid, sizeof sid, "00000000000000%02x", k++);
    rc = fc_audit(st, au, sid, fc_toks, nt, fc_ids, FC_N - 1, false, &v, why, sizeof why);
    T_CHECK(rc == -EINVAL && strstr(why, "received"), "no received openings: rc %d (%s)", rc, why);
    audit_env_close(&e);
}

/* ---- the audits of tests/lib/audit_fixture.h (fuzz-audit's): honest answers of every kind
 * pass, whole and in parts; the last rank's TOKEN logits must come with it and be its own ---- */

T_CASE(audit_kinds)
{
    struct audit_env e;
    T_ASSERT(audit_env_open(&e, "fx.db", 0), "audit state");
    struct kvd_market_store *st = e.st;
    struct kvd_market_audit *au = e.au;
    static struct af fx[AF_KINDS];
    char *saved[AF_KINDS] = {0}, why[512];
    const char *v = "";
    bool settled;
    int rc;
    for (int k = 0; k < AF_KINDS; k++) {
        af_build(&fx[k], (enum af_kind)k);
        T_ASSERT(af_pending(st, au, &fx[k], 1000, &saved[k]) == 0, "kind %d pending", k);
        rc = answer_of(au, fx[k].node, af_answer(&fx[k]), &v, &settled, why, sizeof why);
        T_CHECK(rc == 0 && settled && !strcmp(v, "pass"), "kind %d, whole: rc %d (%s)", k, rc, why);
        T_CHECK(af_restore(st, &fx[k], saved[k]) == 0, "kind %d put back", k);
        for (int i = 0; i < 3; i++) {
            rc = answer_of(au, fx[k].node, af_part(&fx[k], i, 3), &v, &settled, why, sizeof why);
            T_CHECK(rc == 0 && !strcmp(v, i < 2 ? "more" : "pass"), "kind %d, part %d: rc %d %s (%s)",
                    k, i, rc, v, why);
        }
    }
    /* the last rank: its TOKEN's logits left out, or not its own */
    const struct af *l = &fx[AF_LAST];
    af_restore(st, l, saved[AF_LAST]);
    cJSON *b = af_answer(l);
    cJSON_DeleteItemFromObject(b, "logits");
    rc = answer_of(au, l->node, b, &v, &settled, why, sizeof why);
    T_CHECK(rc == -EINVAL && strstr(why, "logits"), "logits left out: rc %d (%s)", rc, why);
    struct af forged = *l;
    forged.logits[13][3] += 1.0f;
    rc = answer_of(au, l->node, af_answer(&forged), &v, &settled, why, sizeof why);
    T_CHECK(rc == -EBADMSG && strstr(why, "hash"), "logits not its own: rc %d (%s)", rc, why);
    /* the inputs only to the TOKEN's row, not to the row its second token was sampled from */
    af_restore(st, l, saved[AF_LAST]);
    b = af_answer(l);
    cJSON *ins = cJSON_GetObjectItemCaseSensitive(b, "inputs");
    cJSON_DeleteItemFromArray(ins, cJSON_GetArraySize(ins) - 1);
    rc = answer_of(au, l->node, b, &v, &settled, why, sizeof why);
    T_CHECK(rc == -EINVAL && strstr(why, "inputs: expected 15 openings"), "inputs short of the "
            "TOKEN's last row: rc %d (%s)", rc, why);
    /* the sampling its digest folds in: left out, or another one (a hotter temperature, so
     * that any token would pass), and the proofs fail */
    af_restore(st, l, saved[AF_LAST]);
    b = af_answer(l);
    cJSON_DeleteItemFromObject(b, "sampling");
    rc = answer_of(au, l->node, b, &v, &settled, why, sizeof why);
    T_CHECK(rc == -EBADMSG && strstr(why, "Merkle proof"), "sampling left out: rc %d (%s)", rc, why);
    af_restore(st, l, saved[AF_LAST]);
    forged = *l;
    struct ring_open_params op;
    ring_open_decode(forged.sampling, &op);
    op.temperature = 5.0f;
    op.top_k = 0;
    ring_open_encode(&op, forged.sampling);
    rc = answer_of(au, l->node, af_answer(&forged), &v, &settled, why, sizeof why);
    T_CHECK(rc == -EBADMSG && strstr(why, "Merkle proof"), "other sampling: rc %d (%s)", rc, why);
    for (int k = 0; k < AF_KINDS; k++)
        free(saved[k]);
    audit_env_close(&e);
}

/* ---- audits drawn while one is pending: queued behind it, at most 4, each with the
 * deadline's time from its turn; a failure clears the queue ---- */
T_CASE(audit_queue)
{
    struct audit_env e;
    T_ASSERT(audit_env_open(&e, "aq.db", 0), "audit state");
    static uint8_t sent[AP_N][32], recv[AP_N][32];
    char id[17], why[512], sid[17];
    uint32_t pos;
    const char *v = "";
    bool settled;
    ap_pending(e.st, e.au, "0123456789abcdef", sent, recv, id, &pos);
    /* six more of the node's receipts credited while it is pending (the draw is certain) */
    for (int i = 0; i < 6; i++) {
        snprintf(sid, sizeof sid, "00000000000001%02x", i);
        T_CHECK(af_pending_on(e.st, e.au, "n1", sid, 1, (const uint8_t (*)[32])sent,
                              (const uint8_t (*)[32])recv, AP_N, NULL, NULL, 8, NULL, 1000, NULL) == 0,
                "receipt %d credited", i);
    }
    cJSON *r = kvd_market__blob_load(e.st, "audit/m/n1");
    T_CHECK(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(r, "queued")) == 4 &&
            !strcmp(util_json_string(cJSON_GetObjectItemCaseSensitive(r, "pending"), "id"), id),
            "four queued behind the pending one, which stays");
    cJSON_Delete(r);
    /* the pending one answered: the first queued is due, its deadline from now */
    T_CHECK(ap_send(e.au, ap_part(id, sent, recv, pos, 0, 1, false), &v, &settled, why, sizeof why) == 0 &&
            !strcmp(v, "pass"), "the pending one passes: %s", why);
    cJSON *ch = NULL;
    T_CHECK(kvd_market__audit_due(e.au, "m", "n1", 1100, &ch, why, sizeof why) == 0 && ch,
            "the next one is due");
    T_CHECK(!strcmp(util_json_string(ch, "session") ? util_json_string(ch, "session") : "",
                    "0000000000000100") && strcmp(util_json_string(ch, "id"), id) &&
            util_json_number(ch, "deadline_s", 0) > 200,
            "it is the first queued, with its deadline's time (%.0f s)",
            util_json_number(ch, "deadline_s", 0));
    snprintf(id, sizeof id, "%s", util_json_string(ch, "id") ? util_json_string(ch, "id") : "");
    cJSON_Delete(ch);
    /* answered wrong (its position, drawn at random, set to 8): the node fails, and the queue
     * goes with its credit */
    r = kvd_market__blob_load(e.st, "audit/m/n1");
    util_json_set(cJSON_GetObjectItemCaseSensitive(r, "pending"), "position", cJSON_CreateNumber(8));
    T_CHECK(kvd_market__blob_save(e.st, "audit/m/n1", r) == 0, "position set");
    cJSON_Delete(r);
    cJSON *b = ap_part(id, sent, recv, 8, 0, 1, false), *o9 = ap_opening(sent, 9, KVD_SIDE_SENT);
    cJSON *o8 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(b, "outputs"), 0);
    util_json_set(o8, "row", cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(o9, "row"), 0));
    cJSON_Delete(o9);   /* the row sent at 9 shown as 8's: its proof fails */
    int rc = ap_send(e.au, b, &v, &settled, why, sizeof why);
    T_CHECK(rc == -EBADMSG, "a wrong answer fails the node (rc %d: %s)", rc, why);
    r = kvd_market__blob_load(e.st, "audit/m/n1");
    T_CHECK(!cJSON_GetObjectItemCaseSensitive(r, "queued") &&
            !cJSON_GetObjectItemCaseSensitive(r, "pending"), "after a failure nothing is queued");
    cJSON_Delete(r);
    audit_env_close(&e);
}

int main(int argc, char **argv)
{
    t_init(argc, argv);
    T_RUN(nonce_once);
    T_RUN(credit_once);
    T_RUN(rollback_and_reopen);
    T_RUN(newer_schema_refused);
    T_RUN(blobs_and_voids);
    T_RUN(probe_judge);
    T_RUN(sweep_walks_every_pending);
    T_RUN(reward_formula);
    T_RUN(audit_parts);
    T_RUN(audit_rank0_feed);
    T_RUN(audit_kinds);
    T_RUN(audit_queue);
    return T_DONE();
}

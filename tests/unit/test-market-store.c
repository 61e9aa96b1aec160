/* test-market-store.c — the market's storage interface on SQLite (kvd/market/internal.h) and
 * its reward formula: nonces spent once, credit paid once per (session, rank, token range)
 * and never for an overlapping range, leases and windows round-trip, a rolled-back
 * transaction leaves nothing, the data survive a reopen, a newer schema is refused, blobs
 * round-trip and a version-1 database gains their table, voided credit leaves a zero balance,
 * the settlement sweep reaches every pending session however many there are; and the
 * known-answer probes' checks, challenges and judgements (kvd/market/probe.c).
 * With KV_MARKET_PG=postgres://... (tests/integration/test-market-pg.sh starts a throwaway server) the
 * same cases run on PostgreSQL; each case starts from an empty database. */
#include <math.h>
#include <cjson/cJSON.h>
#include <libpq-fe.h>
#include <sqlite3.h>

#include "tests/lib/t.h"
#include "kvd/market/internal.h"
#include "ring/ring.h"
#include "util/err.h"

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
    return T_DONE();
}

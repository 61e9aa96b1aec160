/* test-market-store.c — the market's storage interface on SQLite (kvd/market/internal.h) and
 * its reward formula: nonces spent once, credit paid once per (session, rank, token range)
 * and never for an overlapping range, leases and windows round-trip, a rolled-back
 * transaction leaves nothing, the data survive a reopen, a newer schema is refused.
 * With KV_MARKET_PG=postgres://... (tests/test-market-pg.sh starts a throwaway server) the
 * same cases run on PostgreSQL; each case starts from an empty database. */
#include <math.h>
#include <libpq-fe.h>
#include <sqlite3.h>

#include "tests/t.h"
#include "kvd/market/internal.h"
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
    T_RUN(reward_formula);
    return T_DONE();
}

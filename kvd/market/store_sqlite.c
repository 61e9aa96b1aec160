/* store_sqlite.c — the market's storage interface on SQLite: one database file in WAL mode
 * (readers never wait for the writer), every request's writes in one transaction, the
 * schema's version kept in the file so a newer build can migrate and an older one refuses. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "kvd/market/internal.h"
#include "util/util.h"

struct sq {
    sqlite3 *db;
    struct kvd_market_store *s;
};

static const char schema[] =
    "CREATE TABLE IF NOT EXISTS meta(k TEXT PRIMARY KEY, v TEXT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS models(id TEXT PRIMARY KEY, name TEXT NOT NULL, arch TEXT NOT NULL,"
    " n_layers INTEGER NOT NULL, n_embd INTEGER NOT NULL, bytes INTEGER NOT NULL,"
    " catalog TEXT NOT NULL, sources TEXT NOT NULL, demand REAL NOT NULL DEFAULT 0,"
    " demand_t REAL NOT NULL DEFAULT 0);"
    "CREATE TABLE IF NOT EXISTS windows(model TEXT NOT NULL, idx INTEGER NOT NULL,"
    " first INTEGER NOT NULL, last INTEGER NOT NULL, bytes INTEGER NOT NULL,"
    " PRIMARY KEY(model, idx));"
    "CREATE TABLE IF NOT EXISTS nodes(id TEXT PRIMARY KEY, mem_bytes INTEGER NOT NULL,"
    " backend TEXT NOT NULL, inbound INTEGER NOT NULL, seen REAL NOT NULL);"
    "CREATE INDEX IF NOT EXISTS nodes_seen ON nodes(seen);"
    "CREATE TABLE IF NOT EXISTS leases(model TEXT NOT NULL, idx INTEGER NOT NULL, node TEXT NOT NULL,"
    " state INTEGER NOT NULL, expires REAL NOT NULL, since REAL NOT NULL, endpoint TEXT NOT NULL,"
    " PRIMARY KEY(model, idx));"
    "CREATE TABLE IF NOT EXISTS nonces(node TEXT NOT NULL, nonce TEXT NOT NULL, ts REAL NOT NULL,"
    " PRIMARY KEY(node, nonce));"
    "CREATE INDEX IF NOT EXISTS nonces_ts ON nonces(ts);"
    "CREATE TABLE IF NOT EXISTS receipts(session TEXT NOT NULL, rank INTEGER NOT NULL,"
    " t0 INTEGER NOT NULL, t1 INTEGER NOT NULL, side INTEGER NOT NULL, node TEXT NOT NULL,"
    " model TEXT NOT NULL, digest TEXT NOT NULL, PRIMARY KEY(session, rank, t0, t1, side));"
    "CREATE TABLE IF NOT EXISTS credits(session TEXT NOT NULL, rank INTEGER NOT NULL,"
    " t0 INTEGER NOT NULL, t1 INTEGER NOT NULL, node TEXT NOT NULL, layer_tokens INTEGER NOT NULL,"
    " credit REAL NOT NULL, PRIMARY KEY(session, rank, t0));"
    "CREATE TABLE IF NOT EXISTS balances(node TEXT PRIMARY KEY, layer_tokens INTEGER NOT NULL,"
    " credit REAL NOT NULL);"
    "CREATE TABLE IF NOT EXISTS blobs(k TEXT PRIMARY KEY, v TEXT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS voids(node TEXT NOT NULL, at REAL NOT NULL,"
    " layer_tokens INTEGER NOT NULL, credit REAL NOT NULL, reason TEXT NOT NULL);";

/* Prepare sql into *st, noting a failure in the store's err: 0 or -EIO. */
static int prep(struct sq *q, sqlite3_stmt **st, const char *sql)
{
    if (sqlite3_prepare_v2(q->db, sql, -1, st, NULL) != SQLITE_OK) {
        snprintf(q->s->err, sizeof q->s->err, "sqlite: %s", sqlite3_errmsg(q->db));
        return -EIO;
    }
    return 0;
}

/* Step a write statement to its end and finalize it: 0, -EEXIST (a key taken) or -EIO. */
static int run(struct sq *q, sqlite3_stmt *st)
{
    int rc = sqlite3_step(st);
    int out = 0;
    if (rc == SQLITE_CONSTRAINT)
        out = -EEXIST;
    else if (rc != SQLITE_DONE && rc != SQLITE_ROW) {
        snprintf(q->s->err, sizeof q->s->err, "sqlite: %s", sqlite3_errmsg(q->db));
        out = -EIO;
    }
    sqlite3_finalize(st);
    return out;
}

static int exec(struct sq *q, const char *sql)
{
    char *msg = NULL;
    if (sqlite3_exec(q->db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        snprintf(q->s->err, sizeof q->s->err, "sqlite: %s", msg ? msg : sqlite3_errmsg(q->db));
        sqlite3_free(msg);
        return -EIO;
    }
    return 0;
}

static void text(sqlite3_stmt *st, int col, char *out, size_t n)
{
    const unsigned char *t = sqlite3_column_text(st, col);
    snprintf(out, n, "%s", t ? (const char *)t : "");
}

static char *text_dup(sqlite3_stmt *st, int col)
{
    const unsigned char *t = sqlite3_column_text(st, col);
    return strdup(t ? (const char *)t : "");
}

static int sq_begin(void *impl) { return exec(impl, "BEGIN IMMEDIATE"); }
static int sq_commit(void *impl) { return exec(impl, "COMMIT"); }
static void sq_rollback(void *impl)
{
    struct sq *q = impl;
    if (!sqlite3_get_autocommit(q->db))
        sqlite3_exec(q->db, "ROLLBACK", NULL, NULL, NULL);
}

static int sq_model_put(void *impl, const struct kvd_market_model *m)
{
    struct sq *q = impl;
    sqlite3_stmt *st;
    if (prep(q, &st, "INSERT INTO models(id,name,arch,n_layers,n_embd,bytes,catalog,sources)"
                     " VALUES(?,?,?,?,?,?,?,?) ON CONFLICT(id) DO UPDATE SET name=excluded.name,"
                     " sources=excluded.sources"))
        return -EIO;
    sqlite3_bind_text(st, 1, m->id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, m->name, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, m->arch, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, m->n_layers);
    sqlite3_bind_int64(st, 5, m->n_embd);
    sqlite3_bind_int64(st, 6, (sqlite3_int64)m->bytes);
    sqlite3_bind_text(st, 7, m->catalog, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 8, m->sources, -1, SQLITE_STATIC);
    return run(q, st);
}

static int sq_model_get(void *impl, const char *id, struct kvd_market_model *m)
{
    struct sq *q = impl;
    sqlite3_stmt *st;
    memset(m, 0, sizeof *m);
    if (prep(q, &st, "SELECT id,name,arch,n_layers,n_embd,bytes,catalog,sources,demand,demand_t"
                     " FROM models WHERE id=?"))
        return -EIO;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    int rc = -ENOENT;
    if (sqlite3_step(st) == SQLITE_ROW) {
        text(st, 0, m->id, sizeof m->id);
        text(st, 1, m->name, sizeof m->name);
        text(st, 2, m->arch, sizeof m->arch);
        m->n_layers = (uint32_t)sqlite3_column_int64(st, 3);
        m->n_embd = (uint32_t)sqlite3_column_int64(st, 4);
        m->bytes = (uint64_t)sqlite3_column_int64(st, 5);
        m->catalog = text_dup(st, 6);
        m->sources = text_dup(st, 7);
        m->demand = sqlite3_column_double(st, 8);
        m->demand_t = sqlite3_column_double(st, 9);
        rc = m->catalog && m->sources ? 0 : -ENOMEM;
        if (rc)
            kvd_market__model_clear(m);
    }
    sqlite3_finalize(st);
    return rc;
}

static int sq_model_ids(void *impl, char (*ids)[65], size_t cap, size_t *n)
{
    struct sq *q = impl;
    sqlite3_stmt *st;
    *n = 0;
    if (prep(q, &st, "SELECT id FROM models ORDER BY name, id"))
        return -EIO;
    while (*n < cap && sqlite3_step(st) == SQLITE_ROW)
        text(st, 0, ids[(*n)++], 65);
    sqlite3_finalize(st);
    return 0;
}

static int sq_model_demand_set(void *impl, const char *id, double demand, double t)
{
    struct sq *q = impl;
    sqlite3_stmt *st;
    if (prep(q, &st, "UPDATE models SET demand=?, demand_t=? WHERE id=?"))
        return -EIO;
    sqlite3_bind_double(st, 1, demand);
    sqlite3_bind_double(st, 2, t);
    sqlite3_bind_text(st, 3, id, -1, SQLITE_STATIC);
    return run(q, st);
}

static int sq_windows_set(void *impl, const char *model, const struct kvd_market_window *w, size_t n)
{
    struct sq *q = impl;
    sqlite3_stmt *st;
    if (prep(q, &st, "DELETE FROM windows WHERE model=?"))
        return -EIO;
    sqlite3_bind_text(st, 1, model, -1, SQLITE_STATIC);
    int rc = run(q, st);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        if (prep(q, &st, "INSERT INTO windows(model,idx,first,last,bytes) VALUES(?,?,?,?,?)"))
            return -EIO;
        sqlite3_bind_text(st, 1, model, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, w[i].idx);
        sqlite3_bind_int64(st, 3, w[i].first);
        sqlite3_bind_int64(st, 4, w[i].last);
        sqlite3_bind_int64(st, 5, (sqlite3_int64)w[i].bytes);
        rc = run(q, st);
    }
    return rc;
}

static int sq_windows_get(void *impl, const char *model, struct kvd_market_window *w, size_t cap,
                          size_t *n)
{
    struct sq *q = impl;
    sqlite3_stmt *st;
    *n = 0;
    if (prep(q, &st, "SELECT idx,first,last,bytes FROM windows WHERE model=? ORDER BY idx"))
        return -EIO;
    sqlite3_bind_text(st, 1, model, -1, SQLITE_STATIC);
    while (*n < cap && sqlite3_step(st) == SQLITE_ROW) {
        struct kvd_market_window *x = &w[(*n)++];
        x->idx = (uint32_t)sqlite3_column_int64(st, 0);
        x->first = (uint32_t)sqlite3_column_int64(st, 1);
        x->last = (uint32_t)sqlite3_column_int64(st, 2);
        x->bytes = (uint64_t)sqlite3_column_int64(st, 3);
    }
    sqlite3_finalize(st);
    return 0;
}

static int sq_node_put(void *impl, const struct kvd_market_node *nd)
{
    struct sq *q = impl;
    sqlite3_stmt *st;
    if (prep(q, &st, "INSERT OR REPLACE INTO nodes(id,mem_bytes,backend,inbound,seen) VALUES(?,?,?,?,?)"))
        return -EIO;
    sqlite3_bind_text(st, 1, nd->id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)nd->mem_bytes);
    sqlite3_bind_text(st, 3, nd->backend, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 4, nd->inbound);
    sqlite3_bind_double(st, 5, nd->seen);
    return run(q, st);
}

static int sq_nodes_recent(void *impl, double since, struct kvd_market_node *out, size_t cap,
                           size_t *n)
{
    struct sq *q = impl;
    sqlite3_stmt *st;
    *n = 0;
    if (prep(q, &st, "SELECT id,mem_bytes,backend,inbound,seen FROM nodes WHERE seen>=?"
                     " ORDER BY seen DESC LIMIT ?"))
        return -EIO;
    sqlite3_bind_double(st, 1, since);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)cap);
    while (*n < cap && sqlite3_step(st) == SQLITE_ROW) {
        struct kvd_market_node *x = &out[(*n)++];
        text(st, 0, x->id, sizeof x->id);
        x->mem_bytes = (uint64_t)sqlite3_column_int64(st, 1);
        text(st, 2, x->backend, sizeof x->backend);
        x->inbound = sqlite3_column_int(st, 3) != 0;
        x->seen = sqlite3_column_double(st, 4);
    }
    sqlite3_finalize(st);
    return 0;
}

static int sq_lease_get(void *impl, const char *model, uint32_t window, struct kvd_market_lease *l)
{
    struct sq *q = impl;
    sqlite3_stmt *st;
    memset(l, 0, sizeof *l);
    if (prep(q, &st, "SELECT node,state,expires,since,endpoint FROM leases WHERE model=? AND idx=?"))
        return -EIO;
    sqlite3_bind_text(st, 1, model, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, window);
    int rc = -ENOENT;
    if (sqlite3_step(st) == SQLITE_ROW) {
        l->window = window;
        text(st, 0, l->node, sizeof l->node);
        l->state = sqlite3_column_int(st, 1);
        l->expires = sqlite3_column_double(st, 2);
        l->since = sqlite3_column_double(st, 3);
        text(st, 4, l->endpoint, sizeof l->endpoint);
        rc = 0;
    }
    sqlite3_finalize(st);
    return rc;
}

static int sq_lease_put(void *impl, const char *model, const struct kvd_market_lease *l)
{
    struct sq *q = impl;
    sqlite3_stmt *st;
    if (prep(q, &st, "INSERT OR REPLACE INTO leases(model,idx,node,state,expires,since,endpoint)"
                     " VALUES(?,?,?,?,?,?,?)"))
        return -EIO;
    sqlite3_bind_text(st, 1, model, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, l->window);
    sqlite3_bind_text(st, 3, l->node, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 4, l->state);
    sqlite3_bind_double(st, 5, l->expires);
    sqlite3_bind_double(st, 6, l->since);
    sqlite3_bind_text(st, 7, l->endpoint, -1, SQLITE_STATIC);
    return run(q, st);
}

static int sq_lease_count(void *impl, const char *model, size_t *n)
{
    struct sq *q = impl;
    sqlite3_stmt *st;
    *n = 0;
    if (prep(q, &st, "SELECT count(*) FROM leases WHERE model=?"))
        return -EIO;
    sqlite3_bind_text(st, 1, model, -1, SQLITE_STATIC);
    if (sqlite3_step(st) == SQLITE_ROW)
        *n = (size_t)sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return 0;
}

static int sq_nonce_use(void *impl, const char *node, const char *nonce, double ts, double before)
{
    struct sq *q = impl;
    sqlite3_stmt *st;
    if (prep(q, &st, "DELETE FROM nonces WHERE ts<?"))
        return -EIO;
    sqlite3_bind_double(st, 1, before);
    int rc = run(q, st);
    if (rc)
        return rc;
    if (prep(q, &st, "INSERT INTO nonces(node,nonce,ts) VALUES(?,?,?)"))
        return -EIO;
    sqlite3_bind_text(st, 1, node, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, nonce, -1, SQLITE_STATIC);
    sqlite3_bind_double(st, 3, ts);
    return run(q, st);
}

static int sq_receipt_put(void *impl, const struct kvd_market_receipt *r)
{
    struct sq *q = impl;
    sqlite3_stmt *st;
    if (prep(q, &st, "INSERT INTO receipts(session,rank,t0,t1,side,node,model,digest)"
                     " VALUES(?,?,?,?,?,?,?,?)"))
        return -EIO;
    sqlite3_bind_text(st, 1, r->session, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, r->rank);
    sqlite3_bind_int64(st, 3, (sqlite3_int64)r->t0);
    sqlite3_bind_int64(st, 4, (sqlite3_int64)r->t1);
    sqlite3_bind_int(st, 5, r->side);
    sqlite3_bind_text(st, 6, r->node, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 7, r->model, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 8, r->digest, -1, SQLITE_STATIC);
    return run(q, st);
}

static int sq_receipt_get(void *impl, const char *session, uint32_t rank, uint64_t t0, uint64_t t1,
                          int side, struct kvd_market_receipt *r)
{
    struct sq *q = impl;
    sqlite3_stmt *st;
    memset(r, 0, sizeof *r);
    if (prep(q, &st, "SELECT node,model,digest FROM receipts WHERE session=? AND rank=? AND t0=?"
                     " AND t1=? AND side=?"))
        return -EIO;
    sqlite3_bind_text(st, 1, session, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, rank);
    sqlite3_bind_int64(st, 3, (sqlite3_int64)t0);
    sqlite3_bind_int64(st, 4, (sqlite3_int64)t1);
    sqlite3_bind_int(st, 5, side);
    int rc = -ENOENT;
    if (sqlite3_step(st) == SQLITE_ROW) {
        snprintf(r->session, sizeof r->session, "%s", session);
        r->rank = rank;
        r->t0 = t0;
        r->t1 = t1;
        r->side = side;
        text(st, 0, r->node, sizeof r->node);
        text(st, 1, r->model, sizeof r->model);
        text(st, 2, r->digest, sizeof r->digest);
        rc = 0;
    }
    sqlite3_finalize(st);
    return rc;
}

static int sq_credit_add(void *impl, const char *session, uint32_t rank, uint64_t t0, uint64_t t1,
                         const char *node, uint64_t layer_tokens, double credit)
{
    struct sq *q = impl;
    sqlite3_stmt *st;
    /* any overlap with a credited range of this (session, rank) is a second payment */
    if (prep(q, &st, "SELECT 1 FROM credits WHERE session=? AND rank=? AND t0<? AND t1>?"))
        return -EIO;
    sqlite3_bind_text(st, 1, session, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, rank);
    sqlite3_bind_int64(st, 3, (sqlite3_int64)t1);
    sqlite3_bind_int64(st, 4, (sqlite3_int64)t0);
    int step = sqlite3_step(st);
    sqlite3_finalize(st);
    if (step == SQLITE_ROW)
        return -EEXIST;
    if (prep(q, &st, "INSERT INTO credits(session,rank,t0,t1,node,layer_tokens,credit)"
                     " VALUES(?,?,?,?,?,?,?)"))
        return -EIO;
    sqlite3_bind_text(st, 1, session, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, rank);
    sqlite3_bind_int64(st, 3, (sqlite3_int64)t0);
    sqlite3_bind_int64(st, 4, (sqlite3_int64)t1);
    sqlite3_bind_text(st, 5, node, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 6, (sqlite3_int64)layer_tokens);
    sqlite3_bind_double(st, 7, credit);
    int rc = run(q, st);
    if (rc)
        return rc;
    if (prep(q, &st, "INSERT INTO balances(node,layer_tokens,credit) VALUES(?,?,?)"
                     " ON CONFLICT(node) DO UPDATE SET layer_tokens=layer_tokens+excluded.layer_tokens,"
                     " credit=credit+excluded.credit"))
        return -EIO;
    sqlite3_bind_text(st, 1, node, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)layer_tokens);
    sqlite3_bind_double(st, 3, credit);
    return run(q, st);
}

static int sq_balance_get(void *impl, const char *node, uint64_t *layer_tokens, double *credit)
{
    struct sq *q = impl;
    sqlite3_stmt *st;
    *layer_tokens = 0;
    *credit = 0;
    if (prep(q, &st, "SELECT layer_tokens,credit FROM balances WHERE node=?"))
        return -EIO;
    sqlite3_bind_text(st, 1, node, -1, SQLITE_STATIC);
    if (sqlite3_step(st) == SQLITE_ROW) {
        *layer_tokens = (uint64_t)sqlite3_column_int64(st, 0);
        *credit = sqlite3_column_double(st, 1);
    }
    sqlite3_finalize(st);
    return 0;
}

static int sq_blob_put(void *impl, const char *key, const char *value)
{
    struct sq *q = impl;
    sqlite3_stmt *st;
    if (prep(q, &st, value ? "INSERT OR REPLACE INTO blobs(k,v) VALUES(?,?)" : "DELETE FROM blobs WHERE k=?"))
        return -EIO;
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    if (value)
        sqlite3_bind_text(st, 2, value, -1, SQLITE_STATIC);
    return run(q, st);
}

static int sq_blob_get(void *impl, const char *key, char **value)
{
    struct sq *q = impl;
    sqlite3_stmt *st;
    *value = NULL;
    if (prep(q, &st, "SELECT v FROM blobs WHERE k=?"))
        return -EIO;
    sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
    int rc = -ENOENT;
    if (sqlite3_step(st) == SQLITE_ROW)
        rc = (*value = text_dup(st, 0)) ? 0 : -ENOMEM;
    sqlite3_finalize(st);
    return rc;
}

static int sq_credit_void(void *impl, const char *node, double at, const char *reason,
                          uint64_t *layer_tokens, double *credit)
{
    struct sq *q = impl;
    sqlite3_stmt *st;
    int rc = sq_balance_get(impl, node, layer_tokens, credit);
    if (rc)
        return rc;
    if (prep(q, &st, "INSERT INTO voids(node,at,layer_tokens,credit,reason) VALUES(?,?,?,?,?)"))
        return -EIO;
    sqlite3_bind_text(st, 1, node, -1, SQLITE_STATIC);
    sqlite3_bind_double(st, 2, at);
    sqlite3_bind_int64(st, 3, (sqlite3_int64)*layer_tokens);
    sqlite3_bind_double(st, 4, *credit);
    sqlite3_bind_text(st, 5, reason, -1, SQLITE_STATIC);
    if ((rc = run(q, st)))
        return rc;
    if (prep(q, &st, "UPDATE balances SET layer_tokens=0, credit=0 WHERE node=?"))
        return -EIO;
    sqlite3_bind_text(st, 1, node, -1, SQLITE_STATIC);
    return run(q, st);
}

static int sq_blob_keys(void *impl, const char *prefix, const char *after,
                        char (*keys)[KVD_MARKET_KEY_MAX], size_t cap, size_t *n)
{
    struct sq *q = impl;
    sqlite3_stmt *st;
    *n = 0;
    /* a range over the primary key: every key that starts with prefix sorts in [prefix,
     * prefix || 0xff) */
    if (prep(q, &st, "SELECT k FROM blobs WHERE k >= ?1 AND k < ?1 || char(255) AND k > ?2 "
                     "ORDER BY k"))
        return -EIO;
    sqlite3_bind_text(st, 1, prefix, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, after ? after : "", -1, SQLITE_STATIC);
    while (*n < cap && sqlite3_step(st) == SQLITE_ROW) {
        const unsigned char *t = sqlite3_column_text(st, 0);
        if (t && strlen((const char *)t) < KVD_MARKET_KEY_MAX)
            snprintf(keys[(*n)++], KVD_MARKET_KEY_MAX, "%s", (const char *)t);
    }
    sqlite3_finalize(st);
    return 0;
}

static int sq_model_delete(void *impl, const char *id)
{
    struct sq *q = impl;
    static const char *const sql[] = {
        "DELETE FROM windows WHERE model=?1", "DELETE FROM leases WHERE model=?1",
        "DELETE FROM blobs WHERE k = 'probes/' || ?1 OR k = 'owner/' || ?1"
        " OR (k >= 'check/' || ?1 || '/' AND k < 'check/' || ?1 || '0')",
        "DELETE FROM models WHERE id=?1",
    };
    for (size_t i = 0; i < sizeof sql / sizeof sql[0]; i++) {
        sqlite3_stmt *st;
        if (prep(q, &st, sql[i]))
            return -EIO;
        sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
        int rc = run(q, st);
        if (rc)
            return rc;
    }
    return sqlite3_changes(q->db) ? 0 : -ENOENT;
}

static void sq_close(void *impl)
{
    struct sq *q = impl;
    if (!q)
        return;
    sqlite3_close(q->db);
    free(q);
}

static const struct kvd_market_store_ops sqlite_ops = {
    sq_begin, sq_commit, sq_rollback, sq_model_put, sq_model_get, sq_model_ids,
    sq_model_demand_set, sq_windows_set, sq_windows_get, sq_node_put, sq_nodes_recent,
    sq_lease_get, sq_lease_put, sq_lease_count, sq_nonce_use, sq_receipt_put, sq_receipt_get,
    sq_credit_add, sq_balance_get, sq_blob_put, sq_blob_get, sq_credit_void, sq_blob_keys,
    sq_model_delete, sq_close,
};

int kvd_market__sqlite_open(struct kvd_market_store **out, const char *path, char *err,
                            size_t errlen)
{
    *out = NULL;
    struct kvd_market_store *s = calloc(1, sizeof *s);
    struct sq *q = calloc(1, sizeof *q);
    if (!s || !q) {
        free(s);
        free(q);
        return -ENOMEM;
    }
    q->s = s;
    s->ops = &sqlite_ops;
    s->impl = q;
    if (sqlite3_open_v2(path, &q->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) != SQLITE_OK) {
        util_seterr(err, errlen, "market database %s: %s", path,
                    q->db ? sqlite3_errmsg(q->db) : "cannot open");
        goto fail;
    }
    sqlite3_busy_timeout(q->db, 5000);  /* another process on the same file: wait, then fail */
    /* WAL with synchronous=NORMAL: a committed transaction survives the process being killed
     * (the WAL is in the kernel's page cache before COMMIT returns); a power cut may lose
     * the last ones. FULL would also cover that, at an fsync per request. */
    if (exec(q, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;") ||
        exec(q, "BEGIN IMMEDIATE") || exec(q, schema)) {
        util_seterr(err, errlen, "market database %s: %s", path, s->err);
        goto fail;
    }
    sqlite3_stmt *st;
    int version = 0;
    if (prep(q, &st, "SELECT v FROM meta WHERE k='schema'") == 0) {
        if (sqlite3_step(st) == SQLITE_ROW)
            version = atoi((const char *)sqlite3_column_text(st, 0));
        sqlite3_finalize(st);
    }
    if (version > KVD_MARKET_SCHEMA) {
        util_seterr(err, errlen, "market database %s: schema version %d is newer than this kvd's %d",
                    path, version, KVD_MARKET_SCHEMA);
        goto fail;
    }
    char sql[96];
    snprintf(sql, sizeof sql, "INSERT OR REPLACE INTO meta(k,v) VALUES('schema','%d')", KVD_MARKET_SCHEMA);
    if (exec(q, sql) || exec(q, "COMMIT")) {
        util_seterr(err, errlen, "market database %s: %s", path, s->err);
        goto fail;
    }
    *out = s;
    return 0;
fail:
    sq_close(q);
    free(s);
    return -EIO;
}

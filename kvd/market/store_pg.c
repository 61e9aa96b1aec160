/* store_pg.c — the market's storage interface on PostgreSQL (libpq), for several market
 * instances sharing one database. The same tables as store_sqlite.c; every request's
 * transaction is SERIALIZABLE, so two instances racing for one window cannot both win (the
 * loser's commit fails and its caller gets a 503 to retry). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "kvd/market/internal.h"
#include "util/util.h"

struct pg {
    PGconn *c;
    struct kvd_market_store *s;
};

static const char schema[] =
    "CREATE TABLE IF NOT EXISTS meta(k TEXT PRIMARY KEY, v TEXT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS models(id TEXT PRIMARY KEY, name TEXT NOT NULL, arch TEXT NOT NULL,"
    " n_layers BIGINT NOT NULL, n_embd BIGINT NOT NULL, bytes BIGINT NOT NULL,"
    " catalog TEXT NOT NULL, sources TEXT NOT NULL, demand DOUBLE PRECISION NOT NULL DEFAULT 0,"
    " demand_t DOUBLE PRECISION NOT NULL DEFAULT 0);"
    "CREATE TABLE IF NOT EXISTS windows(model TEXT NOT NULL, idx BIGINT NOT NULL,"
    " first BIGINT NOT NULL, last BIGINT NOT NULL, bytes BIGINT NOT NULL, PRIMARY KEY(model, idx));"
    "CREATE TABLE IF NOT EXISTS nodes(id TEXT PRIMARY KEY, mem_bytes BIGINT NOT NULL,"
    " backend TEXT NOT NULL, inbound INT NOT NULL, seen DOUBLE PRECISION NOT NULL);"
    "CREATE INDEX IF NOT EXISTS nodes_seen ON nodes(seen);"
    "CREATE TABLE IF NOT EXISTS leases(model TEXT NOT NULL, idx BIGINT NOT NULL, node TEXT NOT NULL,"
    " state INT NOT NULL, expires DOUBLE PRECISION NOT NULL, since DOUBLE PRECISION NOT NULL,"
    " endpoint TEXT NOT NULL, PRIMARY KEY(model, idx));"
    "CREATE TABLE IF NOT EXISTS nonces(node TEXT NOT NULL, nonce TEXT NOT NULL,"
    " ts DOUBLE PRECISION NOT NULL, PRIMARY KEY(node, nonce));"
    "CREATE INDEX IF NOT EXISTS nonces_ts ON nonces(ts);"
    "CREATE TABLE IF NOT EXISTS receipts(session TEXT NOT NULL, rank BIGINT NOT NULL,"
    " t0 BIGINT NOT NULL, t1 BIGINT NOT NULL, side INT NOT NULL, node TEXT NOT NULL,"
    " model TEXT NOT NULL, digest TEXT NOT NULL, PRIMARY KEY(session, rank, t0, t1, side));"
    "CREATE TABLE IF NOT EXISTS credits(session TEXT NOT NULL, rank BIGINT NOT NULL,"
    " t0 BIGINT NOT NULL, t1 BIGINT NOT NULL, node TEXT NOT NULL, layer_tokens BIGINT NOT NULL,"
    " credit DOUBLE PRECISION NOT NULL, PRIMARY KEY(session, rank, t0));"
    "CREATE TABLE IF NOT EXISTS balances(node TEXT PRIMARY KEY, layer_tokens BIGINT NOT NULL,"
    " credit DOUBLE PRECISION NOT NULL);"
    "CREATE TABLE IF NOT EXISTS blobs(k TEXT PRIMARY KEY, v TEXT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS voids(node TEXT NOT NULL, at DOUBLE PRECISION NOT NULL,"
    " layer_tokens BIGINT NOT NULL, credit DOUBLE PRECISION NOT NULL, reason TEXT NOT NULL);";

/* Parameters are text: numbers are formatted into these slots. */
struct args {
    const char *v[8];
    char buf[8][40];
    int n;
};
static void a_str(struct args *a, const char *s) { a->v[a->n++] = s; }
static void a_u64(struct args *a, uint64_t x)
{
    snprintf(a->buf[a->n], sizeof a->buf[a->n], "%" PRIu64, x);
    a->v[a->n] = a->buf[a->n];
    a->n++;
}
static void a_dbl(struct args *a, double x)
{
    snprintf(a->buf[a->n], sizeof a->buf[a->n], "%.17g", x);
    a->v[a->n] = a->buf[a->n];
    a->n++;
}

/* Run sql: the result (caller clears) or NULL with the store's err set; *rc gets 0, -EEXIST
 * (a unique key taken) or -EIO. */
static PGresult *run(struct pg *p, const char *sql, const struct args *a, int *rc)
{
    PGresult *r = PQexecParams(p->c, sql, a ? a->n : 0, NULL, a ? a->v : NULL, NULL, NULL, 0);
    ExecStatusType st = PQresultStatus(r);
    if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) {
        *rc = 0;
        return r;
    }
    const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    *rc = state && !strcmp(state, "23505") ? -EEXIST : -EIO;
    snprintf(p->s->err, sizeof p->s->err, "postgres: %s", PQerrorMessage(p->c));
    PQclear(r);
    return NULL;
}

static int exec(struct pg *p, const char *sql, const struct args *a)
{
    int rc;
    PGresult *r = run(p, sql, a, &rc);
    PQclear(r);
    return rc;
}

/* Several statements at once (the schema): 0 or -EIO. */
static int exec_multi(struct pg *p, const char *sql)
{
    PGresult *r = PQexec(p->c, sql);
    int rc = PQresultStatus(r) == PGRES_COMMAND_OK ? 0 : -EIO;
    if (rc)
        snprintf(p->s->err, sizeof p->s->err, "postgres: %s", PQerrorMessage(p->c));
    PQclear(r);
    return rc;
}

static int pg_begin(void *impl) { return exec(impl, "BEGIN ISOLATION LEVEL SERIALIZABLE", NULL); }
static int pg_commit(void *impl) { return exec(impl, "COMMIT", NULL); }
static void pg_rollback(void *impl)
{
    struct pg *p = impl;
    if (PQtransactionStatus(p->c) != PQTRANS_IDLE)
        exec(p, "ROLLBACK", NULL);
}

static void col(PGresult *r, int row, int c, char *out, size_t n)
{
    snprintf(out, n, "%s", PQgetvalue(r, row, c));
}
static uint64_t col_u64(PGresult *r, int row, int c) { return strtoull(PQgetvalue(r, row, c), NULL, 10); }
static double col_dbl(PGresult *r, int row, int c) { return strtod(PQgetvalue(r, row, c), NULL); }

static int pg_model_put(void *impl, const struct kvd_market_model *m)
{
    struct args a = {0};
    a_str(&a, m->id);
    a_str(&a, m->name);
    a_str(&a, m->arch);
    a_u64(&a, m->n_layers);
    a_u64(&a, m->n_embd);
    a_u64(&a, m->bytes);
    a_str(&a, m->catalog);
    a_str(&a, m->sources);
    return exec(impl, "INSERT INTO models(id,name,arch,n_layers,n_embd,bytes,catalog,sources)"
                " VALUES($1,$2,$3,$4,$5,$6,$7,$8) ON CONFLICT(id) DO UPDATE SET name=excluded.name,"
                " sources=excluded.sources", &a);
}

static int pg_model_get(void *impl, const char *id, struct kvd_market_model *m)
{
    struct args a = {0};
    int rc;
    memset(m, 0, sizeof *m);
    a_str(&a, id);
    PGresult *r = run(impl, "SELECT id,name,arch,n_layers,n_embd,bytes,catalog,sources,demand,"
                      "demand_t FROM models WHERE id=$1", &a, &rc);
    if (!r)
        return rc;
    rc = -ENOENT;
    if (PQntuples(r) == 1) {
        col(r, 0, 0, m->id, sizeof m->id);
        col(r, 0, 1, m->name, sizeof m->name);
        col(r, 0, 2, m->arch, sizeof m->arch);
        m->n_layers = (uint32_t)col_u64(r, 0, 3);
        m->n_embd = (uint32_t)col_u64(r, 0, 4);
        m->bytes = col_u64(r, 0, 5);
        m->catalog = strdup(PQgetvalue(r, 0, 6));
        m->sources = strdup(PQgetvalue(r, 0, 7));
        m->demand = col_dbl(r, 0, 8);
        m->demand_t = col_dbl(r, 0, 9);
        rc = m->catalog && m->sources ? 0 : -ENOMEM;
        if (rc)
            kvd_market__model_clear(m);
    }
    PQclear(r);
    return rc;
}

static int pg_model_ids(void *impl, char (*ids)[65], size_t cap, size_t *n)
{
    int rc;
    *n = 0;
    PGresult *r = run(impl, "SELECT id FROM models ORDER BY name, id", NULL, &rc);
    if (!r)
        return rc;
    for (int i = 0; i < PQntuples(r) && *n < cap; i++)
        col(r, i, 0, ids[(*n)++], 65);
    PQclear(r);
    return 0;
}

static int pg_model_demand_set(void *impl, const char *id, double demand, double t)
{
    struct args a = {0};
    a_dbl(&a, demand);
    a_dbl(&a, t);
    a_str(&a, id);
    return exec(impl, "UPDATE models SET demand=$1, demand_t=$2 WHERE id=$3", &a);
}

static int pg_windows_set(void *impl, const char *model, const struct kvd_market_window *w, size_t n)
{
    struct args a = {0};
    a_str(&a, model);
    int rc = exec(impl, "DELETE FROM windows WHERE model=$1", &a);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        struct args b = {0};
        a_str(&b, model);
        a_u64(&b, w[i].idx);
        a_u64(&b, w[i].first);
        a_u64(&b, w[i].last);
        a_u64(&b, w[i].bytes);
        rc = exec(impl, "INSERT INTO windows(model,idx,first,last,bytes) VALUES($1,$2,$3,$4,$5)", &b);
    }
    return rc;
}

static int pg_windows_get(void *impl, const char *model, struct kvd_market_window *w, size_t cap,
                          size_t *n)
{
    struct args a = {0};
    int rc;
    *n = 0;
    a_str(&a, model);
    PGresult *r = run(impl, "SELECT idx,first,last,bytes FROM windows WHERE model=$1 ORDER BY idx",
                      &a, &rc);
    if (!r)
        return rc;
    for (int i = 0; i < PQntuples(r) && *n < cap; i++) {
        struct kvd_market_window *x = &w[(*n)++];
        x->idx = (uint32_t)col_u64(r, i, 0);
        x->first = (uint32_t)col_u64(r, i, 1);
        x->last = (uint32_t)col_u64(r, i, 2);
        x->bytes = col_u64(r, i, 3);
    }
    PQclear(r);
    return 0;
}

static int pg_node_put(void *impl, const struct kvd_market_node *nd)
{
    struct args a = {0};
    a_str(&a, nd->id);
    a_u64(&a, nd->mem_bytes);
    a_str(&a, nd->backend);
    a_u64(&a, nd->inbound);
    a_dbl(&a, nd->seen);
    return exec(impl, "INSERT INTO nodes(id,mem_bytes,backend,inbound,seen) VALUES($1,$2,$3,$4,$5)"
                " ON CONFLICT(id) DO UPDATE SET mem_bytes=excluded.mem_bytes,"
                " backend=excluded.backend, inbound=excluded.inbound, seen=excluded.seen", &a);
}

static int pg_nodes_recent(void *impl, double since, struct kvd_market_node *out, size_t cap,
                           size_t *n)
{
    struct args a = {0};
    int rc;
    *n = 0;
    a_dbl(&a, since);
    a_u64(&a, cap);
    PGresult *r = run(impl, "SELECT id,mem_bytes,backend,inbound,seen FROM nodes WHERE seen>=$1"
                      " ORDER BY seen DESC LIMIT $2", &a, &rc);
    if (!r)
        return rc;
    for (int i = 0; i < PQntuples(r) && *n < cap; i++) {
        struct kvd_market_node *x = &out[(*n)++];
        col(r, i, 0, x->id, sizeof x->id);
        x->mem_bytes = col_u64(r, i, 1);
        col(r, i, 2, x->backend, sizeof x->backend);
        x->inbound = col_u64(r, i, 3) != 0;
        x->seen = col_dbl(r, i, 4);
    }
    PQclear(r);
    return 0;
}

static int pg_lease_get(void *impl, const char *model, uint32_t window, struct kvd_market_lease *l)
{
    struct args a = {0};
    int rc;
    memset(l, 0, sizeof *l);
    a_str(&a, model);
    a_u64(&a, window);
    PGresult *r = run(impl, "SELECT node,state,expires,since,endpoint FROM leases WHERE model=$1"
                      " AND idx=$2", &a, &rc);
    if (!r)
        return rc;
    rc = -ENOENT;
    if (PQntuples(r) == 1) {
        l->window = window;
        col(r, 0, 0, l->node, sizeof l->node);
        l->state = (int)col_u64(r, 0, 1);
        l->expires = col_dbl(r, 0, 2);
        l->since = col_dbl(r, 0, 3);
        col(r, 0, 4, l->endpoint, sizeof l->endpoint);
        rc = 0;
    }
    PQclear(r);
    return rc;
}

static int pg_lease_put(void *impl, const char *model, const struct kvd_market_lease *l)
{
    struct args a = {0};
    a_str(&a, model);
    a_u64(&a, l->window);
    a_str(&a, l->node);
    a_u64(&a, (uint64_t)l->state);
    a_dbl(&a, l->expires);
    a_dbl(&a, l->since);
    a_str(&a, l->endpoint);
    return exec(impl, "INSERT INTO leases(model,idx,node,state,expires,since,endpoint)"
                " VALUES($1,$2,$3,$4,$5,$6,$7) ON CONFLICT(model, idx) DO UPDATE SET"
                " node=excluded.node, state=excluded.state, expires=excluded.expires,"
                " since=excluded.since, endpoint=excluded.endpoint", &a);
}

static int pg_lease_count(void *impl, const char *model, size_t *n)
{
    struct args a = {0};
    int rc;
    *n = 0;
    a_str(&a, model);
    PGresult *r = run(impl, "SELECT count(*) FROM leases WHERE model=$1", &a, &rc);
    if (!r)
        return rc;
    *n = (size_t)col_u64(r, 0, 0);
    PQclear(r);
    return 0;
}

static int pg_nonce_use(void *impl, const char *node, const char *nonce, double ts, double before)
{
    struct args a = {0}, b = {0};
    a_dbl(&a, before);
    int rc = exec(impl, "DELETE FROM nonces WHERE ts<$1", &a);
    if (rc)
        return rc;
    a_str(&b, node);
    a_str(&b, nonce);
    a_dbl(&b, ts);
    return exec(impl, "INSERT INTO nonces(node,nonce,ts) VALUES($1,$2,$3)", &b);
}

static int pg_receipt_put(void *impl, const struct kvd_market_receipt *r)
{
    struct args a = {0};
    a_str(&a, r->session);
    a_u64(&a, r->rank);
    a_u64(&a, r->t0);
    a_u64(&a, r->t1);
    a_u64(&a, (uint64_t)r->side);
    a_str(&a, r->node);
    a_str(&a, r->model);
    a_str(&a, r->digest);
    return exec(impl, "INSERT INTO receipts(session,rank,t0,t1,side,node,model,digest)"
                " VALUES($1,$2,$3,$4,$5,$6,$7,$8)", &a);
}

static int pg_receipt_get(void *impl, const char *session, uint32_t rank, uint64_t t0, uint64_t t1,
                          int side, struct kvd_market_receipt *out)
{
    struct args a = {0};
    int rc;
    memset(out, 0, sizeof *out);
    a_str(&a, session);
    a_u64(&a, rank);
    a_u64(&a, t0);
    a_u64(&a, t1);
    a_u64(&a, (uint64_t)side);
    PGresult *r = run(impl, "SELECT node,model,digest FROM receipts WHERE session=$1 AND rank=$2"
                      " AND t0=$3 AND t1=$4 AND side=$5", &a, &rc);
    if (!r)
        return rc;
    rc = -ENOENT;
    if (PQntuples(r) == 1) {
        snprintf(out->session, sizeof out->session, "%s", session);
        out->rank = rank;
        out->t0 = t0;
        out->t1 = t1;
        out->side = side;
        col(r, 0, 0, out->node, sizeof out->node);
        col(r, 0, 1, out->model, sizeof out->model);
        col(r, 0, 2, out->digest, sizeof out->digest);
        rc = 0;
    }
    PQclear(r);
    return rc;
}

static int pg_credit_add(void *impl, const char *session, uint32_t rank, uint64_t t0, uint64_t t1,
                         const char *node, uint64_t layer_tokens, double credit)
{
    struct args a = {0};
    int rc;
    a_str(&a, session);
    a_u64(&a, rank);
    a_u64(&a, t1);
    a_u64(&a, t0);
    /* any overlap with a credited range of this (session, rank) is a second payment */
    PGresult *r = run(impl, "SELECT 1 FROM credits WHERE session=$1 AND rank=$2 AND t0<$3 AND t1>$4",
                      &a, &rc);
    if (!r)
        return rc;
    int seen = PQntuples(r);
    PQclear(r);
    if (seen)
        return -EEXIST;
    struct args b = {0};
    a_str(&b, session);
    a_u64(&b, rank);
    a_u64(&b, t0);
    a_u64(&b, t1);
    a_str(&b, node);
    a_u64(&b, layer_tokens);
    a_dbl(&b, credit);
    if ((rc = exec(impl, "INSERT INTO credits(session,rank,t0,t1,node,layer_tokens,credit)"
                   " VALUES($1,$2,$3,$4,$5,$6,$7)", &b)))
        return rc;
    struct args c = {0};
    a_str(&c, node);
    a_u64(&c, layer_tokens);
    a_dbl(&c, credit);
    return exec(impl, "INSERT INTO balances(node,layer_tokens,credit) VALUES($1,$2,$3)"
                " ON CONFLICT(node) DO UPDATE SET layer_tokens=balances.layer_tokens+excluded.layer_tokens,"
                " credit=balances.credit+excluded.credit", &c);
}

static int pg_balance_get(void *impl, const char *node, uint64_t *layer_tokens, double *credit)
{
    struct args a = {0};
    int rc;
    *layer_tokens = 0;
    *credit = 0;
    a_str(&a, node);
    PGresult *r = run(impl, "SELECT layer_tokens,credit FROM balances WHERE node=$1", &a, &rc);
    if (!r)
        return rc;
    if (PQntuples(r) == 1) {
        *layer_tokens = col_u64(r, 0, 0);
        *credit = col_dbl(r, 0, 1);
    }
    PQclear(r);
    return 0;
}

static int pg_blob_put(void *impl, const char *key, const char *value)
{
    struct args a = {0};
    a_str(&a, key);
    if (!value)
        return exec(impl, "DELETE FROM blobs WHERE k=$1", &a);
    a_str(&a, value);
    return exec(impl, "INSERT INTO blobs(k,v) VALUES($1,$2) ON CONFLICT(k) DO UPDATE SET v=excluded.v",
                &a);
}

static int pg_blob_get(void *impl, const char *key, char **value)
{
    struct args a = {0};
    int rc;
    *value = NULL;
    a_str(&a, key);
    PGresult *r = run(impl, "SELECT v FROM blobs WHERE k=$1", &a, &rc);
    if (!r)
        return rc;
    rc = -ENOENT;
    if (PQntuples(r) == 1)
        rc = (*value = strdup(PQgetvalue(r, 0, 0))) ? 0 : -ENOMEM;
    PQclear(r);
    return rc;
}

static int pg_credit_void(void *impl, const char *node, double at, const char *reason,
                          uint64_t *layer_tokens, double *credit)
{
    int rc = pg_balance_get(impl, node, layer_tokens, credit);
    if (rc)
        return rc;
    struct args a = {0};
    a_str(&a, node);
    a_dbl(&a, at);
    a_u64(&a, *layer_tokens);
    a_dbl(&a, *credit);
    a_str(&a, reason);
    if ((rc = exec(impl, "INSERT INTO voids(node,at,layer_tokens,credit,reason) VALUES($1,$2,$3,$4,$5)",
                   &a)))
        return rc;
    struct args b = {0};
    a_str(&b, node);
    return exec(impl, "UPDATE balances SET layer_tokens=0, credit=0 WHERE node=$1", &b);
}

static int pg_blob_keys(void *impl, const char *prefix, const char *after,
                        char (*keys)[KVD_MARKET_KEY_MAX], size_t cap, size_t *n)
{
    struct args a = {0};
    int rc;
    *n = 0;
    a_str(&a, prefix);
    a_str(&a, after ? after : "");
    a_u64(&a, cap);
    /* starts_with keeps the prefix literal (LIKE would read % and _ in it) */
    PGresult *r = run(impl, "SELECT k FROM blobs WHERE starts_with(k, $1) AND k > $2 ORDER BY k "
                            "LIMIT $3", &a, &rc);
    if (!r)
        return rc;
    for (int i = 0; i < PQntuples(r) && *n < cap; i++)
        if (strlen(PQgetvalue(r, i, 0)) < KVD_MARKET_KEY_MAX)
            col(r, i, 0, keys[(*n)++], KVD_MARKET_KEY_MAX);
    PQclear(r);
    return 0;
}

static int pg_model_delete(void *impl, const char *id)
{
    static const char *const sql[] = {
        "DELETE FROM windows WHERE model=$1", "DELETE FROM leases WHERE model=$1",
        "DELETE FROM blobs WHERE k = 'probes/' || $1 OR k = 'owner/' || $1"
        " OR starts_with(k, 'check/' || $1 || '/')",
    };
    struct args a = {0};
    int rc;
    a_str(&a, id);
    for (size_t i = 0; i < sizeof sql / sizeof sql[0]; i++)
        if ((rc = exec(impl, sql[i], &a)))
            return rc;
    PGresult *r = run(impl, "DELETE FROM models WHERE id=$1", &a, &rc);
    if (!r)
        return rc;
    rc = atoi(PQcmdTuples(r)) > 0 ? 0 : -ENOENT;
    PQclear(r);
    return rc;
}

static void pg_close(void *impl)
{
    struct pg *p = impl;
    if (!p)
        return;
    PQfinish(p->c);
    free(p);
}

static const struct kvd_market_store_ops pg_ops = {
    pg_begin, pg_commit, pg_rollback, pg_model_put, pg_model_get, pg_model_ids,
    pg_model_demand_set, pg_windows_set, pg_windows_get, pg_node_put, pg_nodes_recent,
    pg_lease_get, pg_lease_put, pg_lease_count, pg_nonce_use, pg_receipt_put, pg_receipt_get,
    pg_credit_add, pg_balance_get, pg_blob_put, pg_blob_get, pg_credit_void, pg_blob_keys,
    pg_model_delete, pg_close,
};

int kvd_market__pg_open(struct kvd_market_store **out, const char *url, char *err, size_t errlen)
{
    *out = NULL;
    struct kvd_market_store *s = calloc(1, sizeof *s);
    struct pg *p = calloc(1, sizeof *p);
    if (!s || !p) {
        free(s);
        free(p);
        return -ENOMEM;
    }
    p->s = s;
    s->ops = &pg_ops;
    s->impl = p;
    p->c = PQconnectdb(url);
    if (PQstatus(p->c) != CONNECTION_OK) {
        util_seterr(err, errlen, "market database: %s", PQerrorMessage(p->c));
        goto fail;
    }
    PGresult *r = PQexec(p->c, "SET client_min_messages=warning");
    PQclear(r);
    /* the schema under an advisory lock: several instances may start at once */
    if (exec(p, "BEGIN", NULL) || exec(p, "SELECT pg_advisory_xact_lock(7490)", NULL) ||
        exec_multi(p, schema)) {
        util_seterr(err, errlen, "market database: %s", s->err);
        goto fail;
    }
    int rc;
    int version = 0;
    r = run(p, "SELECT v FROM meta WHERE k='schema'", NULL, &rc);
    if (r && PQntuples(r) == 1)
        version = atoi(PQgetvalue(r, 0, 0));
    PQclear(r);
    if (version > KVD_MARKET_SCHEMA) {
        util_seterr(err, errlen, "market database: schema version %d is newer than this kvd's %d",
                    version, KVD_MARKET_SCHEMA);
        goto fail;
    }
    struct args a = {0};
    a_u64(&a, KVD_MARKET_SCHEMA);
    if (exec(p, "INSERT INTO meta(k,v) VALUES('schema',$1) ON CONFLICT(k) DO UPDATE SET v=excluded.v", &a) ||
        exec(p, "COMMIT", NULL)) {
        util_seterr(err, errlen, "market database: %s", s->err);
        goto fail;
    }
    *out = s;
    return 0;
fail:
    pg_close(p);
    free(s);
    return -EIO;
}

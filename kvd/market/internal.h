/* kvd/market/internal.h — cross-file internals of the market role (docs/market.md): the
 * storage interface and the HTTP API around it. The files form an order, each using only
 * the ones below it:
 *   store_sqlite.c  the storage interface on SQLite (WAL; one transaction per request)
 *   store_pg.c      the same on PostgreSQL (SERIALIZABLE transactions; several instances)
 *   store.c         opening a store by its URL (the one place that knows the backends)
 *   probe.c         known-answer probes: a probe set's checks, challenges, judgements
 *   admit.c         operator keys, the admission allowlist, claim rate limits
 *   ledger.c        ring generations, client accounts, the settlement of sessions' receipts
 *   audit.c         audits of credited work: drawn at credit, delivered with heartbeats,
 *                   answers' Merkle proofs checked, rows recomputed on a pool thread
 *   ringmap.c       what the stages report of their ring (links, last token, rank 0's API):
 *                   checked, kept per window, read back for the map
 *   standby.c       standby leases, takeover records and the roster beside the manifest
 * and the HTTP JSON API over them, one concern a file:
 *   http.c          the glue: answers, signed calls, a request's transaction, id checks
 *   state.c         a model's windows and leases as they stand; a call on one window's lease
 *                   and the admission checks of every call that takes a window
 *   manifest.c      the manifest built from the state, ring generations, the long-poll
 *   plan.c          a model's windows planned from the nodes' device profiles
 *   checks.c        probes and audits of a lease: issued, answered, failed
 *   leases.c        claims, heartbeats (and activation), releases
 *   standbys.c      standby leases and takeovers as calls, the roster
 *   receipts.c      receipts of sessions, settled by the ledger
 *   clients.c       paying clients' accounts
 *   nodes.c         nodes' device profiles and balances
 *   models.c        models: registration, removal, the list, the coverage map
 *   api.c           the route table, the coverage page (page.html), the tick, the API's life
 *   main.c          `kvd market` options, the event loop
 * Both backends fill the same struct kvd_market_store_ops. */
#ifndef KV_KVD_MARKET_INTERNAL_H
#define KV_KVD_MARKET_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <uv.h>

#define KVD_MARKET_SCHEMA 2        /* the schema version stored in the database (2: blobs, voids;
                                    * a version-1 database gains those tables) */
#define KVD_MARKET_MAX_WINDOWS 64  /* windows of one model (the ranks a ring may have) */
#define KVD_MARKET_EP_MAX 256
#define KVD_MARKET_KEY_MAX 192   /* a blob key */
#define KVD_MARKET_MAX_STANDBYS 256   /* standby leases of one model */
#define KVD_MARKET_MAX_TOOK 4      /* nodes that took one rank over in one generation */

enum { KVD_LEASE_RESERVED = 1, KVD_LEASE_ACTIVE = 2 };
enum { KVD_SIDE_SENT = 1, KVD_SIDE_RECEIVED = 2, KVD_SIDE_OPEN = 3 };

/* A registered model: its catalog's id and the facts the market needs from it. */
struct kvd_market_model {
    char id[65], name[128], arch[32];
    uint32_t n_layers, n_embd;     /* blocks the runtime runs, boundary width */
    uint64_t bytes;                /* every tensor of the catalog */
    char *catalog;                 /* the catalog JSON (its SHA-256 is id); owned */
    char *sources;                 /* JSON array of source URLs; owned */
    double demand, demand_t;       /* requests per minute (moving average) at time demand_t */
};
static inline void kvd_market__model_clear(struct kvd_market_model *m)
{
    free(m->catalog);
    free(m->sources);
    m->catalog = m->sources = NULL;
}

struct kvd_market_window {
    uint32_t idx, first, last;     /* [first, last) */
    uint64_t bytes;                /* memory the planner gives it: weights (embedding, head, the MTP
                                    * blocks and their token_embd on the last) + KV */
};

/* The lease on one window (one row per window; a lapsed one lingers for the grace period). */
struct kvd_market_lease {
    uint32_t window;
    char node[65];
    int state;                     /* KVD_LEASE_* */
    double expires;                /* Unix seconds */
    double since;                  /* when the node claimed it; negated once the lease was
                                    * active (a reservation's fixed end applies to new claims
                                    * only), 0 when it was given back */
    char endpoint[KVD_MARKET_EP_MAX];
};

struct kvd_market_node {
    char id[65];
    uint64_t mem_bytes;
    char backend[16];
    bool inbound;
    double seen;
};

/* One side of a receipt: the sender's (rank's layer-tokens and the digest of the boundary
 * bytes it sent) or the receiver's countersignature (the digest it received). */
struct kvd_market_receipt {
    char session[65], model[65], node[65], digest[65];
    uint32_t rank;
    uint64_t t0, t1;               /* tokens [t0, t1) */
    int side;                      /* KVD_SIDE_* */
};

/* The storage operations. Every call returns 0 or a negative errno (-ENOENT: no such row,
 * -EEXIST: the row is there already, -EIO: the database failed, err says how). A request's
 * calls run between begin and commit (or rollback), so its writes land together or not. */
struct kvd_market_store_ops {
    int (*begin)(void *impl);
    int (*commit)(void *impl);
    void (*rollback)(void *impl);
    int (*model_put)(void *impl, const struct kvd_market_model *m);
    /* m's strings are the caller's to free (kvd_market__model_clear) */
    int (*model_get)(void *impl, const char *id, struct kvd_market_model *m);
    /* ids of every model, up to cap (64 bytes each, NUL-terminated) */
    int (*model_ids)(void *impl, char (*ids)[65], size_t cap, size_t *n);
    int (*model_demand_set)(void *impl, const char *id, double demand, double t);
    int (*windows_set)(void *impl, const char *model, const struct kvd_market_window *w, size_t n);
    int (*windows_get)(void *impl, const char *model, struct kvd_market_window *w, size_t cap,
                       size_t *n);
    int (*node_put)(void *impl, const struct kvd_market_node *n);
    /* nodes seen at or after since, up to cap */
    int (*nodes_recent)(void *impl, double since, struct kvd_market_node *out, size_t cap,
                        size_t *n);
    int (*lease_get)(void *impl, const char *model, uint32_t window, struct kvd_market_lease *l);
    int (*lease_put)(void *impl, const char *model, const struct kvd_market_lease *l);
    int (*lease_count)(void *impl, const char *model, size_t *n);
    /* -EEXIST when (node, nonce) was used; forgets nonces older than before */
    int (*nonce_use)(void *impl, const char *node, const char *nonce, double ts, double before);
    int (*receipt_put)(void *impl, const struct kvd_market_receipt *r);
    int (*receipt_get)(void *impl, const char *session, uint32_t rank, uint64_t t0, uint64_t t1,
                       int side, struct kvd_market_receipt *r);
    /* Credit (session, rank, [t0, t1)) to node: -EEXIST when any token of that range of that
     * (session, rank) was credited before, the ledger unchanged. */
    int (*credit_add)(void *impl, const char *session, uint32_t rank, uint64_t t0, uint64_t t1,
                      const char *node, uint64_t layer_tokens, double credit);
    int (*balance_get)(void *impl, const char *node, uint64_t *layer_tokens, double *credit);
    /* Small JSON documents by key (a model's probe set, a lease's pending probe, a node's
     * penalty): put replaces (value NULL deletes); get hands back a malloc'd copy (caller
     * frees), -ENOENT when there is none. */
    int (*blob_put)(void *impl, const char *key, const char *value);
    int (*blob_get)(void *impl, const char *key, char **value);
    /* Void the node's unpaid credit (its whole balance; nothing is paid out yet): the balance
     * becomes zero and a void row records what it was, when and why (*layer_tokens, *credit). */
    int (*credit_void)(void *impl, const char *node, double at, const char *reason,
                       uint64_t *layer_tokens, double *credit);
    /* Keys of the blobs whose key starts with prefix, in key order, up to cap (each at most
     * KVD_MARKET_KEY_MAX - 1 bytes; longer ones are skipped); with after (not NULL or empty)
     * only those past it, so a caller can walk more keys than cap a page at a time. */
    int (*blob_keys)(void *impl, const char *prefix, const char *after,
                     char (*keys)[KVD_MARKET_KEY_MAX], size_t cap, size_t *n);
    /* Remove a model with its windows, leases and the blobs keyed "<anything>/<id>..." that
     * hold its probes and checks: -ENOENT when there is no such model. */
    int (*model_delete)(void *impl, const char *id);
    void (*close)(void *impl);
};

struct kvd_market_store {
    const struct kvd_market_store_ops *ops;
    void *impl;
    char err[256];                 /* the last failure, for the log */
};

/* Open the SQLite store at path (created with the schema when new; WAL). */
int kvd_market__sqlite_open(struct kvd_market_store **out, const char *path, char *err,
                            size_t errlen);
/* Open the PostgreSQL store at a libpq URL (postgres://user@host:port/db; the schema is
 * created when missing). */
int kvd_market__pg_open(struct kvd_market_store **out, const char *url, char *err, size_t errlen);
/* Open a store by URL: a path (SQLite) or postgres://... (PostgreSQL). */
int kvd_market__store_open(struct kvd_market_store **out, const char *url, char *err,
                           size_t errlen);
void kvd_market__store_close(struct kvd_market_store *s);
struct cJSON;
/* A blob as JSON: the object (caller deletes), NULL when there is none or it is no JSON. */
struct cJSON *kvd_market__blob_load(struct kvd_market_store *s, const char *key);
/* Put o as the blob key: 0 or the store's failure (-ENOMEM). */
int kvd_market__blob_save(struct kvd_market_store *s, const char *key, const struct cJSON *o);

/* The market's tunables (kvd market options; docs/market.md has their meaning). */
struct kvd_market_config {
    const char *listen, *db;
    double lease_s;                /* an active lease lives this long past its heartbeat */
    double reserve_s;              /* a reserved lease, past its progress heartbeat */
    double grace_s;                /* a lapsed lease's window waits this long for its node */
    double clock_skew_s;           /* a signed call's timestamp may be this far off */
    double reward_base;            /* credit per layer-token of a covered window, no demand */
    double demand_ref;             /* requests/min at which demand doubles... half of it */
    double demand_tau_s;           /* the demand average's time constant */
    double poll_max_s;             /* the longest a manifest long-poll waits */
    bool probe;                    /* check a stage's endpoint and its probe before activating */
    double spot_check_s;           /* an active lease is probed again every 0.5..1.5 x this (0: never) */
    double penalty_s;              /* a node that failed a probe may not claim for this long */
    double pull_min_rate;          /* bytes/s: a reserved lease ends window bytes / this after
                                    * its claim (at least reserve_s) unless it became active */
    double lapse_refuse_s;         /* a node whose reservation ran out may not claim that window
                                    * again for this long */
    double claims_per_min_key;     /* claims a key may make per minute (a burst of as many) */
    double claims_per_min_addr;    /* claims one address (IPv6: its /64) may make per minute */
    uint32_t max_ranks_addr;       /* ranks of one model held from one address (0: no cap) */
    uint32_t max_ranks_relay_addr; /* the same for nodes reached through a relay (behind NAT) */
    const char *allowlist;         /* admission: only these node keys may claim (NULL: open) */
    const char *operator_keys;     /* keys that may change any model and add clients */
    double settle_wait_s;          /* how long a session's ring has to submit before the ranks
                                    * that did are paid without the ones that did not */
    double audit_rate;             /* the share of credited receipts audited (0: none) */
    double audit_deadline_s;       /* an audit unanswered this long after it was drawn fails */
    double audit_answer_kib;       /* what an audit's answer may take in all (in parts of at
                                    * most RING_AUDIT_PART_BYTES): it bounds the positions an
                                    * audit opens */
    const char *verify_model;      /* the whole GGUF audits recompute rows with (NULL: proofs only) */
};
void kvd_market__config_default(struct kvd_market_config *c);

/* Known-answer probes (docs/market.md, "Probes"). */
struct cJSON;
/* A registered probe set's shape and size against the model's: 0, or -EINVAL/-E2BIG with why. */
int kvd_market__probes_check(const struct cJSON *set, uint32_t n_layers, uint32_t n_embd, char *why,
                             size_t n);
/* A challenge for window [first, last) (the caller deletes it): id, layers and a random subset
 * of the set's sequences in a random order, each with its tokens (first == 0) or its input
 * boundary; *seqs gets the indices asked, in that order (the caller deletes). */
struct cJSON *kvd_market__probe_challenge(const struct cJSON *set, uint32_t first, uint32_t last, struct cJSON **seqs);
/* The challenge of sequences seqs (indices into the set) with that id again (a resend). */
struct cJSON *kvd_market__probe_build(const struct cJSON *set, uint32_t first, uint32_t last,
                                      const struct cJSON *seqs, const char *id);
/* The answer to a challenge of sequences seqs for a window ending at last: 0 when every output
 * boundary is within RING_PROBE_TOL NMSE (the worst in *nmse) or every clear greedy token
 * matches (last == n_layers); -EBADMSG for a wrong answer, -EINVAL for a malformed one, why
 * saying which. */
int kvd_market__probe_judge(const struct cJSON *set, uint32_t last, const struct cJSON *seqs,
                            const struct cJSON *outputs, double *nmse, char *why, size_t n);

/* ---- admission (admit.c) ---- */
struct kvd_market_admit;
/* The operator keys and allowlist of cfg loaded, the claim limits set: 0 or the reason. */
int kvd_market__admit_new(struct kvd_market_admit **out, const struct kvd_market_config *cfg,
                          char *err, size_t errlen);
void kvd_market__admit_free(struct kvd_market_admit *ad);
/* Whether node is one of the market's operator keys. */
bool kvd_market__admit_operator(const struct kvd_market_admit *ad, const char *node);
/* Whether node may claim (always, when admission is open). */
bool kvd_market__admit_allowed(const struct kvd_market_admit *ad, const char *node);
/* One claim by node from addr (net_http_req_addr): 0, or -EAGAIN over a rate limit, why
 * saying which and when to try again. */
int kvd_market__admit_claim(struct kvd_market_admit *ad, const char *node, const char *addr,
                            double now, char *why, size_t n);

/* ---- the ledger (ledger.c) ---- */

/* A ring generation: the nodes of one published manifest, rank by rank, and its life. */
struct kvd_market_gen {
    char model[65];
    char node[KVD_MARKET_MAX_WINDOWS][65];
    /* nodes that took the rank over in this generation (standby.c): their receipts count too */
    char took[KVD_MARKET_MAX_WINDOWS][KVD_MARKET_MAX_TOOK][65];
    uint32_t n_took[KVD_MARKET_MAX_WINDOWS];
    uint32_t first[KVD_MARKET_MAX_WINDOWS], last[KVD_MARKET_MAX_WINDOWS];
    size_t n;
    double since, until;           /* until 0: still the model's newest */
};
/* A paying client's account. */
struct kvd_market_client {
    char id[65], name[128];
    uint8_t verifier[32];
    double balance, spent, created;
};
/* What one settlement paid. */
struct kvd_market_settled {
    bool opened;                   /* a client opened the session */
    bool done;                     /* every rank was paid or held back for good */
    uint32_t ranks_paid;
    uint64_t layer_tokens;
    double credit;
};
/* The model's demand decayed to now (requests per minute). */
double kvd_market__demand_now(const struct kvd_market_config *c, const struct kvd_market_model *m,
                              double now);
/* Whether node's claims are refused after a failed probe (why says until when). */
bool kvd_market__penalized(struct kvd_market_store *st, const char *node, double now, char *why,
                           size_t n);
/* Record the generation of manifest (its SHA-256 sha) of model when it is new; the model's
 * previous one ends now. */
int kvd_market__gen_record(struct kvd_market_store *st, const char *model, const char *sha,
                           const char *manifest, double now);
/* -ENOENT when the market never published that manifest. */
int kvd_market__gen_load(struct kvd_market_store *st, const char *sha, struct kvd_market_gen *g);
/* Whether node may sign for rank in generation g: the node the manifest named, or one that
 * took the rank over in it. */
bool kvd_market__gen_may_sign(const struct kvd_market_gen *g, size_t rank, const char *node);
/* Record that node took rank over in generation sha (kept at KVD_MARKET_MAX_TOOK a rank). */
int kvd_market__gen_took(struct kvd_market_store *st, const char *sha, uint32_t rank, const char *node);

/* ---- standbys and takeovers (standby.c) ---- */
/* The node's live standby lease on the model (caller deletes), NULL when none. */
struct cJSON *kvd_market__standby_get(struct kvd_market_store *st, const char *model,
                                      const char *node, double now);
/* Save a standby lease (expires 0 ends it). */
int kvd_market__standby_put(struct kvd_market_store *st, const char *model, const char *node,
                            uint32_t window, const char *endpoint, double since, double expires);
/* The model's live standby leases as a JSON array (caller deletes), NULL on a store error. */
struct cJSON *kvd_market__standby_list(struct kvd_market_store *st, const char *model, double now);
/* The model's takeover records, {"<window>": {node, manifest, mnode, mendpoint, at}} (caller
 * deletes; NULL when none), one blob read for all windows; took_save sets one window's. */
struct cJSON *kvd_market__took_load(struct kvd_market_store *st, const char *model);
int kvd_market__took_save(struct kvd_market_store *st, const char *model, uint32_t window,
                          const char *node, const char *manifest, const char *mnode,
                          const char *mendpoint, double now);
/* The roster of generation sha: the nodes that took a rank over in it and the live standbys
 * with an endpoint, each for the rank of its window (leases[i] is rank i's window's lease;
 * took[i]: its holder took rank i over in generation sha).
 * NULL on a store error. */
struct cJSON *kvd_market__roster(struct kvd_market_store *st, const char *model, const char *sha,
                                 const struct kvd_market_lease *leases, const bool *took, size_t n,
                                 double now);
int kvd_market__client_get(struct kvd_market_store *st, const char *id, struct kvd_market_client *c);
int kvd_market__client_put(struct kvd_market_store *st, const struct kvd_market_client *c);
/* The ledger's key of a session: hex(SHA-256(model "|" manifest "|" session)). */
void kvd_market__session_key(const char *model, const char *manifest, const char *session,
                             char out[65]);
/* One rank's share of a session, as it is paid (for the audits of credited work). */
struct kvd_market_paid {
    const char *model, *manifest, *session, *key, *node, *digest;   /* digest: its sent root */
    uint32_t rank, n_ranks, first, last, n_embd;
    uint64_t t0, t1;
};
typedef int (*kvd_market_paid_cb)(void *ud, const struct kvd_market_paid *p, double now);
/* Pay what the session's receipts prove (docs/market.md, "Receipts and credit"): each rank
 * whose edges agree, once the whole ring's are in or the settle wait is over; the client who
 * opened it is debited what the ranks are credited; on_paid (may be NULL) hears of each share
 * paid, in the transaction. */
int kvd_market__session_settle(struct kvd_market_store *st, const struct kvd_market_config *cfg,
                               const char *key, double now, kvd_market_paid_cb on_paid, void *ud,
                               struct kvd_market_settled *out);
/* Record one side of the session's receipt (r->side: sent, received, or open with client and
 * r->t1 the tokens opened) and settle the session, on one read and one write of its record:
 * -EEXIST when that side was recorded before. */
int kvd_market__session_submit(struct kvd_market_store *st, const struct kvd_market_config *cfg,
                               const struct kvd_market_receipt *r, const char *manifest,
                               const char *key, const char *client, double now,
                               kvd_market_paid_cb on_paid, void *ud,
                               struct kvd_market_settled *out);
/* Settle the pending sessions whose wait is over, up to a bounded number per call, from the
 * cursor after (updated); *paid gets the ranks paid. */
int kvd_market__session_sweep(struct kvd_market_store *st, const struct kvd_market_config *cfg,
                              double now, char after[KVD_MARKET_KEY_MAX], kvd_market_paid_cb on_paid,
                              void *ud, size_t *paid);
/* Audits of credited work (docs/market.md, "Audits"). The verdict callback runs inside the
 * verdict's transaction when a recomputation found the node wrong (checks.c ends its lease, voids
 * its credit, refuses its claims): 0, or the store's failure (the verdict is rolled back). */
struct kvd_market_audit;
struct uv_loop_s;
typedef int (*kvd_market_audit_verdict_cb)(void *ud, const char *model, const char *node,
                                           const char *why, double now);
int kvd_market__audit_new(struct kvd_market_audit **out, struct uv_loop_s *loop,
                          struct kvd_market_store *st, const struct kvd_market_config *cfg,
                          kvd_market_audit_verdict_cb verdict, void *ud);
/* Free once the loop has run every queued recomputation (after uv_run returns). */
void kvd_market__audit_free(struct kvd_market_audit *au);
/* A credited receipt's work: who sent it, what it commits to. */
struct kvd_market_audit_work {
    const char *model, *node, *session, *digest;   /* digest: the sent root (64 hex) */
    const char *key;               /* the ledger's key of the session (its receipts' rows) */
    uint32_t rank, n_ranks, window, first, last, n_embd;
    uint64_t t0, t1;
};
/* Draw an audit of w with probability audit_rate (none while one is pending on the node), in
 * the open transaction: 0 or the store's failure. */
int kvd_market__audit_note(struct kvd_market_audit *au, const struct kvd_market_audit_work *w,
                           double now);
/* The node's pending audit at a heartbeat: 0 with *challenge (to send; the caller deletes) or
 * NULL when none is to be answered; 1 when it went unanswered past its deadline (settled as
 * failed, why set: the caller fails the node); or the store's failure. */
int kvd_market__audit_due(struct kvd_market_audit *au, const char *model, const char *node,
                          double now, struct cJSON **challenge, char *why, size_t n);
/* The node's answer (POST /v1/leases/audit), or a part of one ("part" k of "parts": kept until
 * the last, *verdict "more"), in the open transaction: 0 when accepted (*settled: judged
 * already, on its proofs alone, *verdict "pass" or "inconclusive"; else queued for
 * recomputation, the verdict later);
 * -EBADMSG when wrong (a proof that fails, a row that is no row, late: settled, why set, the
 * caller fails the node); -EINVAL malformed; -ENOENT no such audit pending; -EAGAIN the node's
 * received side of the session is not in yet (answer again); -EIO the store. */
int kvd_market__audit_answer(struct kvd_market_audit *au, const char *model, const char *node,
                             const struct cJSON *body, double now, bool *settled,
                             const char **verdict, char *why, size_t n);

/* ---- ringmap.c: the stages' reports (docs/market.md, "The map") ---- */
/* NULL when a heartbeat's report fields (manifest, links, last_token_age_s, api) are well
 * formed or absent, else why not (a static string). */
const char *kvd_market__report_bad(const struct cJSON *b);
/* Keep the report of a heartbeat b (checked) of node on window, when it names a manifest; an
 * API URL on a wildcard host gets peer (the heartbeat's address) instead. 0 or the store's
 * failure. */
int kvd_market__report_save(struct kvd_market_store *st, const char *model, uint32_t window,
                            const char *node, const struct cJSON *b, const char *peer, double now);
/* The window's last report, as the map shows it ({node, manifest, links, last_token_age_s?,
 * api?, age_s}; caller deletes), when node sent it about manifest within fresh_s; else NULL. */
struct cJSON *kvd_market__report_load(struct kvd_market_store *st, const char *model,
                                      uint32_t window, const char *node, const char *manifest,
                                      double now, double fresh_s);
/* Whether a report says rank's links are down: 0 when not, else why gets the reason, and 2
 * when the stage said why a link failed, 1 when not (a link that waits for its peer). */
int kvd_market__report_down(const struct cJSON *rep, uint32_t rank, char *why, size_t n);

/* ---- the HTTP API (http.c ... api.c) ---- */
struct net_http_server;
struct net_http_req;
struct kvd_market_poll;
struct kvd_market_api {
    uv_loop_t *loop;
    struct net_http_server *srv;
    struct kvd_market_store *st;
    struct kvd_market_config cfg;
    uv_timer_t tick;
    struct kvd_market_poll *polls;   /* the waiting manifest long-polls (manifest.c) */
    struct kvd_market_audit *audit;   /* audits of credited work (audit.c) */
    bool closed;
    struct kvd_market_admit *admit;
    char sweep_after[KVD_MARKET_KEY_MAX];   /* the settlement sweep's cursor */
    double sweep_next;
};

/* http.c. Every handler answers its request exactly once: "sent" below means answered. */
double kvd_market__now(void);
/* Answer o (taken) as JSON with status. */
void kvd_market__reply_json(struct net_http_req *req, int status, struct cJSON *o);
/* {"error": reason} with a 4xx/5xx status; extra (may be NULL) is merged in (taken). */
void kvd_market__reply_err(struct net_http_req *req, int status, struct cJSON *extra,
                           const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Whether s is lo to hi lowercase hex digits. */
bool kvd_market__is_hex(const char *s, size_t lo, size_t hi);
/* The request body as a JSON object (caller deletes), or NULL with a 400 sent. */
struct cJSON *kvd_market__body_json(struct net_http_req *req);
/* A whole number member in [lo, hi]: 0, or -EINVAL with why. */
int kvd_market__juint(const struct cJSON *o, const char *key, double lo, double hi, uint64_t *out,
                      char *why, size_t whylen);
/* Begin the request's transaction: 0, or the 503 sent. */
int kvd_market__begin(struct kvd_market_api *a, struct net_http_req *req);
/* Commit, then answer o (taken) with status; a failed commit answers 503. */
void kvd_market__commit_reply(struct kvd_market_api *a, struct net_http_req *req, int status,
                              struct cJSON *o);
/* Roll back and refuse with status and why (extra as for reply_err). */
void kvd_market__rollback_err(struct kvd_market_api *a, struct net_http_req *req, int status,
                              struct cJSON *extra, const char *why);
void kvd_market__rollback_errf(struct kvd_market_api *a, struct net_http_req *req, int status,
                               const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Begin, then check the signature: 0 with node (the caller's key, hex) set, or the refusal
 * sent. */
int kvd_market__begin_signed(struct kvd_market_api *a, struct net_http_req *req, char node[65]);
/* /v1/models/<id>[/<what>]: id and *what (the rest, "" when none), or a 400 sent. */
int kvd_market__path_model(struct net_http_req *req, const char *path, char id[65],
                           const char **what);

/* state.c: what a lease row means now (KVD_LS_*, named by kvd_market__lease_names). */
enum { KVD_LS_FREE = 0, KVD_LS_RESERVED = 1, KVD_LS_ACTIVE = 2, KVD_LS_GRACE = 3 };
extern const char *const kvd_market__lease_names[];
/* The model's windows and their leases (empty node for none). */
struct kvd_market_state {
    struct kvd_market_model m;
    struct kvd_market_window w[KVD_MARKET_MAX_WINDOWS];
    struct kvd_market_lease l[KVD_MARKET_MAX_WINDOWS];
    int ls[KVD_MARKET_MAX_WINDOWS];
    /* a standby took the window's rank over in generation took_sha (standby.c), and the
     * manifest of that generation names mnode at mendpoint for it: the manifest stays so while
     * the standby holds the window and nothing else changed */
    char took_sha[KVD_MARKET_MAX_WINDOWS][65], mnode[KVD_MARKET_MAX_WINDOWS][65];
    char mendpoint[KVD_MARKET_MAX_WINDOWS][KVD_MARKET_EP_MAX];
    size_t n;
};

/* A call on one window's lease (claims, heartbeats): its body, the signer, the model's state
 * and the window's index in it. */
struct kvd_market_lease_call {
    struct cJSON *b;
    struct kvd_market_state *ms;
    size_t wi;
    double now;
    char node[65];
};

int kvd_market__lease_now(const struct kvd_market_api *a, const struct kvd_market_lease *l,
                          double now);
/* Load model id's state: 0, -ENOENT or the store's failure (ms->m to clear on 0). */
int kvd_market__state_load(struct kvd_market_api *a, const char *id, struct kvd_market_state *ms,
                           double now);
/* The windows node may claim, as a JSON array (caller deletes). */
struct cJSON *kvd_market__free_windows(const struct kvd_market_state *ms, const char *node);
/* A lease as the API shows it (caller deletes). */
struct cJSON *kvd_market__lease_json(const struct kvd_market_api *a,
                                     const struct kvd_market_lease *l, int ls, double now);
/* Whether window i's active holder stopped heartbeating. */
bool kvd_market__lease_silent(const struct kvd_market_api *a, const struct kvd_market_state *ms,
                              size_t i, double now);
/* Refuse a call that loaded ms: its rows freed, rolled back, the refusal sent. */
void kvd_market__state_refuse(struct kvd_market_api *a, struct net_http_req *req,
                              struct kvd_market_state *ms, int status, struct cJSON *extra,
                              const char *why);
/* Open a call on one window's lease (check says why a body is malformed): 0, or the refusal
 * sent; lease_call_held also refuses a caller that holds no live lease on the window.
 * lease_call_end frees c either way. */
int kvd_market__lease_call_open(struct kvd_market_lease_call *c, struct kvd_market_api *a,
                                struct net_http_req *req,
                                const char *(*check)(const struct cJSON *b));
int kvd_market__lease_call_held(struct kvd_market_lease_call *c, struct kvd_market_api *a,
                                struct net_http_req *req);
void kvd_market__lease_call_end(struct kvd_market_lease_call *c);
/* The admission of a call that takes a window (rate: a new lease): 0, or the refusal sent. */
int kvd_market__admit_or_refuse(struct kvd_market_api *a, struct net_http_req *req,
                                struct kvd_market_lease_call *c, bool rate);
/* The per-address caps on ranks held: 0, or the 409 sent. */
int kvd_market__addr_cap_or_refuse(struct kvd_market_api *a, struct net_http_req *req,
                                   struct kvd_market_lease_call *c, bool relay);

/* manifest.c */
/* The ring's manifest once every window has an active stage (caller frees; else NULL), its
 * SHA-256 into hash. */
char *kvd_market__manifest_of(const struct kvd_market_state *ms, char hash[65]);
/* GET /v1/models/<id>/manifest: answered now or queued as a long-poll. */
void kvd_market__manifest_get(struct kvd_market_api *a, struct net_http_req *req, const char *id);
/* Answer the waiting long-polls whose manifest came or whose time is up; at close, all. */
void kvd_market__polls_tick(struct kvd_market_api *a);
void kvd_market__polls_close(struct kvd_market_api *a);

/* plan.c: re-plan a model whose windows nobody holds: 0 or negative. */
int kvd_market__replan_if_idle(struct kvd_market_api *a, const char *id, double now, char *err,
                               size_t errlen);

/* checks.c */
/* A probe (kind "activation" or "spot") issued and kept as the lease's pending check: the
 * challenge (caller deletes), NULL when the model has no probe set (*rc 0) or on a store
 * failure (*rc < 0). */
struct cJSON *kvd_market__probe_issue(struct kvd_market_api *a, const char *model,
                                      uint32_t window, uint32_t first, uint32_t last,
                                      const char *node, const char *kind, double now, int *rc);
/* A failed check: the lease ends, the node's claims are refused, after a spot check or an
 * audit its credit is voided; msg gets the reason. 0 or the store's failure. */
int kvd_market__probe_fail(struct kvd_market_api *a, const char *model, struct kvd_market_lease *l,
                           const char *kind, const char *why, double now, char *msg, size_t n);
/* The audits' verdict callback (kvd_market_audit_verdict_cb; ud is the API). */
int kvd_market__audit_verdict(void *ud, const char *model, const char *node, const char *why,
                              double now);
/* At a heartbeat of an active lease: 1 when its pending spot check ran past its deadline (msg
 * set), 0 with *ch a check to send or NULL, or the store's failure. */
int kvd_market__spot_tick(struct kvd_market_api *a, const struct kvd_market_state *ms, size_t wi,
                          struct kvd_market_lease *l, double now, struct cJSON **ch, char *msg,
                          size_t n);

/* leases.c: a heartbeat's fields well formed or absent: NULL, else why not. */
const char *kvd_market__heartbeat_bad(const struct cJSON *b);
/* standbys.c: GET /v1/models/<id>/roster. */
void kvd_market__roster_get(struct kvd_market_api *a, struct net_http_req *req, const char *id);
/* receipts.c: a share paid, noted for the audits (kvd_market_paid_cb; ud is the API). */
int kvd_market__on_paid(void *ud, const struct kvd_market_paid *p, double now);

/* The handlers of api.c's route table (net_http_handler_cb; ud is the API), by file. */
void kvd_market__h_probe(struct net_http_req *req, void *ud);           /* checks.c */
void kvd_market__h_audit(struct net_http_req *req, void *ud);
void kvd_market__h_claims(struct net_http_req *req, void *ud);          /* leases.c */
void kvd_market__h_heartbeat(struct net_http_req *req, void *ud);
void kvd_market__h_release(struct net_http_req *req, void *ud);
void kvd_market__h_standbys(struct net_http_req *req, void *ud);        /* standbys.c */
void kvd_market__h_receipts(struct net_http_req *req, void *ud);        /* receipts.c */
void kvd_market__h_clients_post(struct net_http_req *req, void *ud);    /* clients.c */
void kvd_market__h_clients_get(struct net_http_req *req, void *ud);
void kvd_market__h_client_credit(struct net_http_req *req, void *ud);
void kvd_market__h_nodes_post(struct net_http_req *req, void *ud);      /* nodes.c */
void kvd_market__h_node_get(struct net_http_req *req, void *ud);
void kvd_market__h_models_post(struct net_http_req *req, void *ud);     /* models.c */
void kvd_market__h_models_get(struct net_http_req *req, void *ud);
void kvd_market__h_model_get(struct net_http_req *req, void *ud);
void kvd_market__h_model_delete(struct net_http_req *req, void *ud);
/* The coverage page (kvd/market/page.html as a C array, made by the Makefile). */
extern const unsigned char kvd_market__page[];
extern const unsigned long kvd_market__page_len;

/* Put the API's routes on srv, backed by store (borrowed; both outlive the API). */
int kvd_market__api_new(struct kvd_market_api **out, struct uv_loop_s *loop,
                        struct net_http_server *srv, struct kvd_market_store *store,
                        const struct kvd_market_config *cfg, char *err, size_t errlen);
/* Answer the pending long-polls and stop the timer; free once the loop ran the close. */
void kvd_market__api_close(struct kvd_market_api *a);
void kvd_market__api_free(struct kvd_market_api *a);

/* The published reward per layer-token (docs/market.md, "Rewards"): covered is 1 for an
 * active stage, 0.5 for a reserved one, 0 for none; demand in requests per minute. */
double kvd_market__reward(const struct kvd_market_config *c, double demand, double covered);

#endif

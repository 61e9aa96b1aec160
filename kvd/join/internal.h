/* kvd/join/internal.h — cross-file internals of the join role (docs/market.md, "Joining"): a
 * node that knows only a market and a model id profiles itself, reads the coverage map, claims
 * the best-rewarded window it can hold (after a random delay, so a crowd does not herd onto one
 * window), pulls just that window verified against the model's catalog while heartbeats keep
 * the reserved lease, shows the market its endpoint answers, waits for the ring's manifest and
 * runs as that rank's stage, renewing its lease. The files form an order, each using only the
 * ones below it:
 *   call.c      calls to the market, the stop flag, a sleep it cuts short
 *   lease.c     heartbeats and what they report of the ring, probes and audits answered, a
 *               standby's lease and takeover, reclaiming and releasing the window
 *   claim.c     the node's profile, the coverage map, the claim of a window (or a standby lease)
 *   pull.c      the model's catalog, the window pulled from its sources
 *   stage.c     the endpoint listened on early, the stage child started and stopped on each
 *               manifest, the roster, a standby's start and takeover
 *   receipts.c  the stage's receipts submitted, the paying clients' keys for rank 0's API
 *   hold.c      the hold loop, and moving to a better window
 *   join.c      `kvd join`'s options and the claim, pull, hold loop */
#ifndef KV_KVD_JOIN_INTERNAL_H
#define KV_KVD_JOIN_INTERNAL_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvd/kvd.h"
#include "ring/ring.h"

struct cJSON;
struct net_identity;

#define CALL_MS 15000
#define CLIENTS_EVERY_S 3.0      /* how often a ring's API learns the market's paying clients */

struct join {
    const char *market, *model, *dir, *listen, *relay, *backend, *api;
    const char *api_keys;       /* --api-key-file: keys let in besides the market's clients */
    const char *chat_template;  /* --chat-template: the API's template family (NULL: the model's) */
    const char *advertise;      /* --advertise HOST:PORT: the endpoint others dial, when not --listen */
    char api_url[300];          /* rank 0's API as clients reach it (http://HOST:PORT) */
    char *market_clients;       /* the market's paying clients, as the lines last written */
    uint64_t mem;
    uint64_t rowlog_max;         /* the stage's row log cap (--rowlog) */
    int n_threads;
    uint32_t jitter_ms;
    struct net_identity *id;
    char node[65];
    char catalog_path[4096], window_path[4096], manifest_path[4096];
    char receipts_path[4096], offset_path[4096], clients_path[4096];
    double clients_next;        /* the next refresh of the paying clients' list */
    double receipts_next;       /* the next try at submitting receipts (a backoff) */
    uint32_t receipts_backoff_ms;
    /* moving (docs/market.md, "Moving"): to a free window worth move_ratio x ours or more,
     * held so for move_after_s, with no session open on our stage */
    double move_ratio, move_after_s;
    double better_since;        /* when a window first looked that much better (0: none) */
    int better, prefer;         /* that window; the one to claim first (-1: none) */
    int avoid;                  /* a window the market refuses us for a while (-1: none) ... */
    double avoid_until;         /* ... until then */
    char endpoint[RING_ENDPOINT_MAX];
    uint32_t window, first, last;
    double lease_s, reserve_s;
    char manifest_sha[65];
    int rank;                   /* our rank in the manifest the stage runs (-1: none) */
    /* a standby (docs/market.md, "Standbys"): holds a standby lease on window, its window
     * pulled ahead, its stage waiting to be dialled for rank standby_rank */
    bool standby;
    int standby_rank;
    bool took_pending_logged;   /* the market said a takeover waits for the holder to lapse */
    char roster_path[4096];
    char roster_sha[65];        /* the manifest the roster last written is for ("": none) */
    bool roster_me;             /* ... and whether it names this node */
    char *roster_text;          /* its text as last written */
    bool held;                  /* we hold a lease on window (given back on a clean exit) */
    int probe_fd;
    pid_t stage;
};

/* call.c */
extern volatile sig_atomic_t kvd_join__stop_flag;   /* set by SIGTERM and SIGINT */
void kvd_join__on_stop(int sig);
void kvd_join__sleep_ms(uint32_t ms);
uint32_t kvd_join__rand_u32(void);
struct cJSON *kvd_join__call(struct join *j, const char *method, const char *path, struct cJSON *body,
                             bool signed_, long *status);
const char *kvd_join__jstr_or(const struct cJSON *o, const char *key, const char *def);

/* lease.c */
struct cJSON *kvd_join__stage_status(struct join *j);
int kvd_join__heartbeat(struct join *j, const char *endpoint, uint64_t progress);
int kvd_join__standby_took(struct join *j, int rank);
int kvd_join__reclaim(struct join *j);
void kvd_join__release(struct join *j);

/* claim.c */
int kvd_join__profile(struct join *j);
int kvd_join__claim(struct join *j);

/* pull.c */
int kvd_join__fetch_catalog(struct join *j);
int kvd_join__pull(struct join *j);

/* stage.c */
void kvd_join__roster_refresh(struct join *j);
int kvd_join__tcp_listen(const char *hostport, uint16_t *port);
int kvd_join__probe_listen(struct join *j);
void kvd_join__probe_close(struct join *j);
void kvd_join__stage_stop(struct join *j);
int kvd_join__manifest_poll(struct join *j, double wait_s);
void kvd_join__standby_tick(struct join *j);

/* receipts.c */
int kvd_join__receipts_submit(struct join *j);
void kvd_join__clients_write(struct join *j);
void kvd_join__clients_refresh(struct join *j);
void kvd_join__receipts_tick(struct join *j);

/* hold.c */
int kvd_join__hold(struct join *j);

#endif

/* kvd — the daemon: its roles (stage, seeder, relay, market, join), each with a
 * `kvd_<role>_main` that parses that role's options, and the log every role writes to.
 *
 * Sections: [log], [config and service], [stage], [seeder], [relay], [market + join].
 */
#ifndef KV_KVD_H
#define KV_KVD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kern.h"

/* =================================== log =================================== */
enum kvd_log_level { KVD_LOG_ERROR, KVD_LOG_WARN, KVD_LOG_INFO, KVD_LOG_DEBUG };
/* One line per event on stderr: time, level, component, message. */
void kvd_log_set_level(int level);
void kvd_log_set_prefix(const char *prefix);
void kvd_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* One HTTP server's access-log line: "PEER METHOD PATH STATUS N bytes T ms" (info; 5xx warn). */
struct net_http_access;
void kvd_log_access(const struct net_http_access *a);
/* "error|warn|info|debug" -> KVD_LOG_*, or -EINVAL. */
int kvd_log_level_parse(const char *name);

/* ============================ config and service ============================ */
/* A role's command-line options, for the configuration file (kvd/config.c): the long name
 * without dashes, whether it takes a value, whether it may be given several times. The
 * array ends with a NULL name. */
struct kvd_optspec {
    const char *name;
    bool arg;
    bool repeat;
};
const struct kvd_optspec *kvd_stage_optspecs(void);
const struct kvd_optspec *kvd_relay_optspecs(void);
const struct kvd_optspec *kvd_seeder_optspecs(void);
/* The role a config file names (`role = ...`; "" when none), syntax checked. 0 or -errno. */
int kvd_config_role(const char *path, char *role, size_t n, char *err, size_t errlen);
/* The file's options as arguments (malloc'ed strings in a malloc'ed array, *n of them),
 * every key checked against specs: errors name file, line and key. The file is remembered
 * for kvd_config_reload. 0 or -errno. */
int kvd_config_args(const char *path, const struct kvd_optspec *specs, char ***out, int *n, char *err,
                    size_t errlen);
/* Whether kvd started from a config file. */
bool kvd_config_active(void);
/* SIGHUP with a config file: re-read and validate it; the log level applies at once, other
 * changes are logged as waiting for a restart; an invalid file keeps the running settings.
 * 0, -ENOENT (no file) or -EINVAL. */
int kvd_config_reload(void);
/* What SIGHUP means for this process: a reload when it runs from a config file without a
 * controlling terminal (a service), else a hang-up (the adb shell or terminal that started a
 * foreground kvd went away): a clean stop. Reloads when it should and returns false; true:
 * the caller stops. */
bool kvd_sighup_stops(void);
/* Service manager notifications (sd_notify, when built with libsystemd and started by
 * systemd with Type=notify; nothing otherwise): ready with a status line, reloading,
 * stopping. */
void kvd_service_ready(const char *status);
void kvd_service_reloading(void);
void kvd_service_stopping(void);
/* --port-file PATH of a role listening on port 0: the bound port, one line (for scripts and
 * tests); a file that cannot be written is logged. */
void kvd_port_file_write(const char *path, int port);
/* The end of a role's main (the relay, the seeder, the market): SIGINT, SIGTERM and SIGHUP
 * (unless kvd_sighup_stops reloads instead) stop it: the log says which, the service manager
 * hears it is stopping, the signal handles close and stop(ud) closes the role's own handles.
 * Tells the service manager the role is ready (status), then runs loop until nothing is left
 * in it. Returns uv_run's result. */
struct uv_loop_s;
int kvd_role_run(struct uv_loop_s *loop, const char *status, void (*stop)(void *ud), void *ud);

/* ================================== stage ================================== */
/* The stage role (docs/design.md, "The ring data path"): a kvd that holds the layer window
 * of one rank (manifest: ring/ring.h), links to its predecessor (in) and successor (out), runs
 * the window on a compute thread for every boundary that arrives, and (rank 0) serves clients
 * on a local control socket (STATE_DIR/kvd.sock, one JSON object per line; see docs/ring.md). */

#define KVD_BOUNDARY_LOG_DEFAULT (4ull << 20)
#define KVD_BOUNDARY_LOG_TOTAL_DEFAULT (64ull << 20)
struct kvd_stage_opts {
    const char *manifest;       /* path */
    int rank;
    const char *model;          /* full GGUF (only the window is mapped) */
    const char *window;         /* stage mini-GGUF (instead of model) */
    const char *listen;         /* "host:port"; default: the host:port of the own endpoint */
    const char *state_dir;      /* node key, control socket */
    const char *catalog;        /* the model's catalog (kvctl catalog): checks the window */
    int n_threads;
    uint32_t idle_timeout_s;    /* sessions with no progress are ended (default 300) */
    uint32_t chunk;             /* prefill chunk (tokens); 0: max_batch */
    uint32_t batch_wait_us;     /* a step waits this long for other sessions' to batch with */
    /* rank 0: the sessions' drafting when a request does not say (docs/ring.md, "Drafting"):
     * an enum model_draft (none, lookup, mtp, auto), and how many a pass verifies (0:
     * KVD_DRAFT_MAX_DEFAULT) */
    int draft;
    uint32_t draft_max;
    const char *backend;        /* a compute backend's name (kvd/stage's table); NULL: the model */
    const char *seed_listen;    /* "host:port": also seed the window/model held (seeder) */
    const char *receipts;       /* append each ended session's work receipts here as JSON
                                   lines (kvd join submits them; docs/market.md); NULL: none */
    uint64_t rowlog_max;        /* with receipts: the row log's cap in bytes (audits answer
                                   from it; 0: KVD_ROWLOG_MAX_BYTES) */
    /* Repair (docs/ring.md, "Repair"): is_standby starts this node as the manifest's standby
     * entry standby (rank -1), which takes over a dead rank when its predecessor dials it;
     * repair_wait_s: how long rank 0 pauses sessions waiting for a repair (set: repair_wait_set;
     * default 30 s when the manifest has standbys, else 0: a broken ring ends them); an
     * established link silent for link_timeout_ms is dead (0: 3000 ms + 4 x the link's RTT). */
    bool is_standby;
    uint32_t standby;
    uint32_t repair_wait_s;
    bool repair_wait_set;
    uint32_t link_timeout_ms;
    /* Boundary logs (docs/ring.md, "Repair"): the rows a stage sent downstream, kept per session
     * up to boundary_log_bytes (set: boundary_log_set; default KVD_BOUNDARY_LOG_DEFAULT, 0: no
     * logs) and boundary_log_total bytes in all (0: KVD_BOUNDARY_LOG_TOTAL_DEFAULT). */
    uint64_t boundary_log_bytes, boundary_log_total;
    bool boundary_log_set;
    /* A standby without a model file: pull the window of the rank it takes over from here
     * (a seeder or a GGUF URL, seed_window_from), verified against catalog. */
    const char *standby_window_from;
    /* A roster file (ring_roster_apply; kvd join writes it from the market): standbys named
     * beside the manifest, read at start and again whenever the file changes. With is_standby
     * and standby_by_key, this node's standby entry is the roster's entry for its own key
     * (standby is then ignored), and a window file given with it is the window of the one
     * rank that entry lists (pulled ahead of a takeover). */
    const char *roster;
    bool standby_by_key;
    const char *device;         /* --backend: the kernel device (cpu, opencl); NULL: the
                                   manifest rank's "backend", else cpu */
    /* --cl-platform, --cl-device, --cl-weights: the opencl device's settings; the indices
     * -1 when not given (the environment's then), so whoever fills these options sets them */
    struct kern_cl_opts cl;
    /* rank 0: the OpenAI-compatible API (docs/api.md) */
    const char *api_listen;     /* "host:port"; NULL: none */
    const char *api_key_file;   /* Bearer keys, one a line; NULL: no keys */
    bool api_keys_reload;       /* re-read api_key_file when it changes; it may be empty (a
                                 * market ring's paying clients, which kvd join keeps current) */
    bool api_open;              /* no keys on an address other than loopback is meant */
    const char *api_tls_cert, *api_tls_key; /* PEM files: the API serves HTTPS */
    uint32_t api_keepalive_s;   /* a kept-alive API connection idle this long closes (0: 30) */
    uint32_t api_max_sessions;  /* API generations at once (0: the manifest's max_sessions) */
    const char *chat_template;  /* a chat template family; NULL: the model's */
    /* Neighbour ranks (and standbys) the manifest names no node key for: linked only when
     * this is set (a warning names them), else the stage refuses to start. */
    bool allow_unpinned;
};
/* Run a stage until SIGTERM/SIGINT or a shutdown request: 0, or negative on a start failure
 * (logged). */
int kvd_stage_run(const struct kvd_stage_opts *o);
/* Answer a market's known-answer probe (docs/market.md, "Probes"): challenge is the JSON of
 * the market's "probe" object; each of its sequences runs as a fresh session through a new
 * instance of the compute backend named backend (NULL: the model) on the window file.
 * *outputs gets the JSON array of answers (malloc'd; the caller frees). 0, or negative with
 * err filled. */
int kvd_stage_probe(const char *backend, const char *window, int n_threads, const char *challenge,
                    char **outputs, char *err, size_t errlen);
/* Answer a market's audit of one session's work (docs/market.md, "Audits") from the row log
 * the stage keeps in state_dir/rows: challenge is the JSON of the market's "audit" object
 * (session, tokens [t0, t1), position, embed, head). *answer gets the JSON object to post
 * (id, outputs, and inputs with their Merkle proofs, or rank 0's token_ids; malloc'd, the
 * caller frees). 0, or negative with err filled (-ENOENT: the log does not hold the rows). */
int kvd_stage_audit(const char *state_dir, const char *challenge, char **answer, char *err,
                    size_t errlen);
/* `kvd stage ...` command line (options parsed here), returns the exit status. */
int kvd_stage_main(int argc, char **argv);

/* ================================= seeder ================================== */
/* `kvd seeder --serve FILE[,CATALOG]... --listen HOST:PORT` (also `kvd --role seeder ...`):
 * serves windows with seed/seed.h's seeder until SIGINT/SIGTERM; returns the exit status. */
int kvd_seeder_main(int argc, char **argv);

/* ================================== relay ================================== */

/* The relay role (docs/design.md, "The relay"): a TLS WebSocket server on /v1/bridge/<bridge-id>
 * that pairs the two ends of a ring edge which both dialled out, and forwards binary
 * messages between them unchanged and in order. The first message each end sends is one
 * byte, its role: KVD_RELAY_UPSTREAM (the end that sends on the edge, rank R) or
 * KVD_RELAY_DOWNSTREAM (rank R+1). Bridge ids are 32 to 64 lowercase hex characters.
 * GET /v1/relay/status answers JSON counts, GET /metrics the same in Prometheus text. */

struct uv_loop_s;

enum { KVD_RELAY_UPSTREAM = 0x01, KVD_RELAY_DOWNSTREAM = 0x02 };

struct kvd_relay_config {
    const char *listen;          /* "host:port", "[v6]:port"; port 0 picks one */
    const char *tls_cert;        /* PEM chain; with tls_key, required unless plain */
    const char *tls_key;
    bool plain;                  /* ws:// without TLS: tests and trusted LANs only */
    bool quiet;                  /* no log line per refusal or timeout */
    uint32_t max_bridges;        /* bridges (waiting or paired) at once; 0: 4096 */
    uint32_t max_per_addr;       /* connections from one source address; 0: 64 */
    uint32_t pair_timeout_ms;    /* time an end may wait for its role byte or partner; 0: 30 s */
    uint32_t idle_timeout_ms;    /* close an end that sent nothing (pongs count); 0: 90 s */
    uint32_t ping_interval_ms;   /* relay pings each end this often; 0: 20 s */
    uint64_t max_msg_bytes;      /* larger messages close with 1009; 0: 16 MiB */
    size_t high_water;           /* bytes queued toward one end before its partner is paused; 0: 64 KiB */
    /* Memory held for ends without a partner: past max_held bytes for one end (0: 1 MiB) it
     * is closed with 1009, past max_held_total for all (0: 64 MiB) with 1013. */
    uint64_t max_held, max_held_total;
    uint32_t max_fragments;      /* frames of one message (0: 1024); more close with 1009 */
    uint64_t max_assembly;       /* bytes of messages being assembled, all ends (0: 256 MiB) */
    /* The HTTP side (every connection, before and after the upgrade): connections from one
     * address (IPv4, IPv6 /64; 0: 2 x max_per_addr + 16, room for handshakes), the time for
     * the TLS handshake and the request head (0: 10 s), and for a socket that takes no bytes
     * while some wait (0: 30 s). */
    uint32_t max_conns_per_addr, header_timeout_ms, write_timeout_ms;
};

struct kvd_relay_stats {
    uint64_t connections;        /* open WebSocket connections */
    uint64_t bridges;            /* bridge ids with at least one end */
    uint64_t paired;             /* bridges with both ends */
    uint64_t waiting;            /* bridges with one end */
    uint64_t pairings_total;
    uint64_t messages_total;     /* messages forwarded */
    uint64_t bytes_total;        /* payload bytes forwarded */
    uint64_t refused_bad_bridge, refused_bad_role, refused_dup_role, refused_limit;
    uint64_t timeouts_partner, timeouts_idle, partner_gone;
    uint64_t held_bytes;         /* bytes held for ends without a partner yet */
    uint64_t queued_bytes;       /* bytes queued toward ends, not yet taken by the kernel */
    uint64_t assembling_bytes;   /* bytes of messages being assembled from fragments */
    uint64_t refused_held;       /* ends closed for holding too much without a partner */
    /* the HTTP side: every connection (handshaking, plain GETs, upgraded) */
    uint64_t http_conns, http_addrs, http_refused_addr, http_refused_conns;
    uint64_t http_timeouts;      /* handshake, header, body, idle and write-stall deadlines */
};

struct kvd_relay;
/* Start a relay on loop (listening at once). 0, or negative errno with err filled. */
int kvd_relay_new(struct kvd_relay **out, struct uv_loop_s *loop,
                  const struct kvd_relay_config *cfg, char *err, size_t errlen);
/* The port it listens on. */
int kvd_relay_port(const struct kvd_relay *r);
void kvd_relay_get_stats(const struct kvd_relay *r, struct kvd_relay_stats *out);
/* Stop listening, close every connection; r is freed once the loop has run the close
 * callbacks, and done (may be NULL) runs then. */
void kvd_relay_close(struct kvd_relay *r, void (*done)(void *ud), void *ud);
/* `kvd --role relay ...`: parse options, run until SIGINT/SIGTERM; returns the exit status. */
int kvd_relay_main(int argc, char **argv);

/* ============================== market + join ============================== */

struct model_sampler_params;
struct ring_open_params;
/* The sampler's parameters of an OPEN's (sampling.c): the stage's last rank samples by them,
 * the market judges its tokens by them. */
void kvd_sampler_params(struct model_sampler_params *sp, const struct ring_open_params *p);
/* The market role (docs/market.md): `kvd market --db PATH [--listen HOST:PORT]`, an HTTP JSON
 * API where nodes claim the windows of registered models, and where rings are assembled and
 * work is credited; runs until SIGINT/SIGTERM and returns the exit status. */
int kvd_market_main(int argc, char **argv);
/* The join role: `kvd join --market URL --model ID --state-dir DIR ...`: claim the
 * best-rewarded window this node can hold, pull it, wait for the ring's manifest, run as
 * its stage and keep the lease; returns the exit status. */
int kvd_join_main(int argc, char **argv);

#endif

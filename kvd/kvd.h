/* kvd — the daemon's roles: stage (issue 5), seeder (issue 7), relay (issue 8); config,
 * sessions and the control endpoint.
 *
 * Sections: [stage], [seeder], [relay].
 */
#ifndef KV_KVD_H
#define KV_KVD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ================================== stage ================================== */
/* The stage role (DESIGN.md sections 7-8): a kvd that holds the layer window of one rank,
 * links to its predecessor (in) and successor (out), runs the window on a compute thread for
 * every boundary that arrives, and (rank 0) serves clients on a local control socket
 * (STATE_DIR/kvd.sock, one JSON object per line; see docs/ring.md).
 *
 * The manifest (JSON): version, ring, model {name, catalog, arch, n_layers, n_embd}, wire
 * {dtype f32|f16}, optional limits {n_ctx, max_batch, max_sessions}, ranks [{rank, node,
 * layers [first,last], embed, head, backend, endpoint, mem_bytes, est_ms_per_token}]. */

#define KVD_MAX_RANKS 64
#define KVD_ENDPOINT_MAX 256

struct kvd_rank_info {
    uint32_t rank, first, last;
    bool embed, head, has_node;
    uint8_t node[32];                   /* Ed25519 public key (when has_node) */
    char endpoint[KVD_ENDPOINT_MAX];    /* "tcp://host:port" or "relay://host:port/b/<id>" */
    char backend[16];
    uint64_t mem_bytes;
    double est_ms_per_token;
};

struct kvd_manifest {
    uint32_t version;
    char ring[65];
    char model_name[128], catalog[65], arch[32];
    uint32_t n_layers, n_embd;
    char dtype[8];                      /* "f32" | "f16" */
    uint32_t wire_dsize;                /* bytes per boundary value: 4 or 2 */
    uint32_t n_ctx, max_batch, max_sessions;  /* limits (defaults filled in) */
    uint32_t n_ranks;
    struct kvd_rank_info ranks[KVD_MAX_RANKS];
    uint8_t hash[32];                   /* SHA-256 of the manifest bytes */
};

/* Parse and validate a manifest held in memory (windows contiguous, disjoint, covering
 * [0, n_layers); rank order; embed on rank 0 only, head on the last only). */
int kvd_manifest_parse(struct kvd_manifest *m, const char *json, size_t len, char *err,
                       size_t errlen);
/* Read, hash and parse a manifest file. */
int kvd_manifest_load(struct kvd_manifest *m, const char *path, char *err, size_t errlen);

enum kvd_log_level { KVD_LOG_ERROR, KVD_LOG_WARN, KVD_LOG_INFO, KVD_LOG_DEBUG };
/* One line per event on stderr: time, level, component, message. */
void kvd_log_set_level(int level);
void kvd_log_set_prefix(const char *prefix);
void kvd_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

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
    bool stub;                  /* tests: a deterministic stand-in compute, no model file */
    const char *seed_listen;    /* "host:port": also seed the window/model held (seeder) */
};
/* Run a stage until SIGTERM/SIGINT or a shutdown request: 0, or negative on a start failure
 * (logged). */
int kvd_stage_run(const struct kvd_stage_opts *o);
/* `kvd stage ...` command line (options parsed here), returns the exit status. */
int kvd_stage_main(int argc, char **argv);

/* Control client (kvctl): connect to a stage's control socket, send one JSON request line,
 * call on_line for every reply line until it returns non-zero or the daemon closes.
 * 0, or negative errno with err filled. */
typedef int (*kvd_ctl_line_cb)(const char *line, void *ud);
int kvd_ctl_request(const char *sock_path, const char *request, kvd_ctl_line_cb on_line, void *ud,
                    int timeout_ms, char *err, size_t errlen);

/* ================================= seeder ================================== */
/* The seeder role (DESIGN.md section 6): any kvd holding a model or a window serves windows
 * over HTTP (net_http server), and the fetch side that `kvctl pull` and `kvd --window-from`
 * share.
 *
 * Routes (model ids are catalog SHA-256s, windows half-open [first, last)):
 *   GET /v1/models                      {"models":[{"id","name","arch","n_layers","layers":[f,l],
 *                                         "size"}]}
 *   GET /v1/catalog/<id>                the catalog JSON (its SHA-256 is <id>)
 *   GET /v1/windows/<id>/<first>-<last> the stage mini-GGUF of that window, built on the fly:
 *                                       header in memory, tensor bytes straight from the
 *                                       mapped source; Content-Length, ETag, Range, zstd.
 *   GET /v1/seeder/stats                counters (requests, windows, body bytes sent)
 * Layers not held: 404 with the reason; malformed ids or ranges: 400. Only the files given
 * to kvd_seeder_add are ever read. */

struct net_http_server;
struct kvd_seeder;

/* Create a seeder and put its routes on srv (the server outlives the seeder's use). */
int kvd_seeder_new(struct kvd_seeder **out, struct net_http_server *srv);
/* Serve a model or window file. catalog_path: its catalog (required for a window file; for a
 * full model NULL builds it, hashing the file once). id_hex (may be NULL) gets the model id. */
int kvd_seeder_add(struct kvd_seeder *s, const char *path, const char *catalog_path,
                   char id_hex[65], char *err, size_t errlen);
/* Free after the server is closed. */
void kvd_seeder_free(struct kvd_seeder *s);
/* `kvd seeder --serve FILE[,CATALOG]... --listen HOST:PORT` (also `kvd --role seeder ...`). */
int kvd_seeder_main(int argc, char **argv);

/* Fetch a window: from a seeder (URL "http://host:port", no path) or from a plain HTTP(S)
 * URL of a full GGUF on any server that supports Range requests. The result is written to
 * out_path only when complete and verified (out_path.part + out_path.part.state hold a
 * resumable partial download meanwhile). */
struct kvd_pull_opts {
    const char *url;
    uint32_t first, last;       /* [first, last) */
    const char *catalog_path;   /* verify every tensor against it (NULL: the seeder's catalog,
                                 * or none for a plain URL) */
    const char *model_id;       /* pick a model on a seeder serving several (NULL: the
                                 * catalog's id, or the only one) */
    const char *source_sha256;  /* plain URL without catalog: kvasir.source.sha256 to write */
    const char *out_path;
    int progress;               /* 0 none, 1 bar on a TTY / a line per 10% otherwise */
    bool zstd;                  /* ask a seeder for zstd encoding */
    long timeout_s;             /* stall timeout (no bytes) per request; 0: 30 s */
    uint64_t max_rate;          /* bytes/s cap on receiving (0: none) */
    const char *ca_file;        /* HTTPS: trust these CA certificates (PEM) instead of the system's */
    const volatile int *cancel; /* set non-zero (any thread) to stop: -ECANCELED, resumable */
};
struct kvd_pull_stats {
    uint64_t bytes_fetched;     /* body bytes received (after decoding) */
    uint64_t bytes_resumed;     /* bytes found already done at the start */
    uint64_t requests;
    double seconds;             /* all of it */
    double verify_seconds;      /* of which: verifying and installing the window */
};
/* Blocking (libcurl easy interface): a running daemon calls it from a worker thread. */
int kvd_pull(const struct kvd_pull_opts *o, struct kvd_pull_stats *st, char *err,
             size_t errlen);
/* `kvd stage --window-from URL`: the window of `rank` in the manifest, pulled into
 * DIR/window-<first>-<last>.gguf (DIR = dir or "."; an existing file is reused) and verified
 * against catalog_path, or against the seeder's catalog when the manifest names the model's
 * catalog id. The path goes to out. */
int kvd_window_from(const char *manifest, int rank, const char *url, const char *catalog_path,
                    const char *dir, char *out, size_t outlen, char *err, size_t errlen);

/* ================================== relay ================================== */

/* The relay role (DESIGN.md section 9): a TLS WebSocket server on /v1/bridge/<bridge-id>
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
};

struct kvd_relay;
/* Start a relay on loop (listening at once). 0 or negative errno, reason on stderr. */
int kvd_relay_new(struct uv_loop_s *loop, const struct kvd_relay_config *cfg, struct kvd_relay **out);
/* The port it listens on. */
int kvd_relay_port(const struct kvd_relay *r);
void kvd_relay_get_stats(const struct kvd_relay *r, struct kvd_relay_stats *out);
/* Stop listening, close every connection; freed once the loop has run the close callbacks. */
void kvd_relay_close(struct kvd_relay *r);
/* `kvd --role relay ...`: parse options, run until SIGINT/SIGTERM; returns the exit status. */
int kvd_relay_main(int argc, char **argv);

#endif

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
    int n_threads;
    uint32_t idle_timeout_s;    /* sessions with no progress are ended (default 300) */
    uint32_t chunk;             /* prefill chunk (tokens); 0: max_batch */
    bool stub;                  /* tests: a deterministic stand-in compute, no model file */
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

/* ================================== relay ================================== */

#endif

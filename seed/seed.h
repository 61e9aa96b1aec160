/* seed — windows that travel: the seeder (any kvd holding a model or window serves windows
 * over the project's HTTP server) and the fetch side that `kvctl pull` and
 * `kvd --window-from` share.
 *
 * Routes (model ids are catalog SHA-256s, windows half-open [first, last)):
 *   GET /v1/models                      {"models":[{"id","name","arch","n_layers","layers":[f,l],
 *                                         "size"}]}
 *   GET /v1/catalog/<id>                the catalog JSON (its SHA-256 is <id>)
 *   GET /v1/windows/<id>/<first>-<last> the stage mini-GGUF of that window, built on the fly:
 *                                       header in memory, tensor bytes straight from the
 *                                       mapped source; Content-Length, ETag, Range, zstd.
 *   GET /v1/seeder/stats                counters (requests, windows, body bytes sent,
 *                                       connections, refusals, timeouts, queued bytes)
 * Layers not held: 404 with the reason; malformed ids or ranges: 400. Only the files given
 * to seed_server_add are ever read. */

#ifndef KV_SEED_H
#define KV_SEED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SEED_MAX_MODELS 64   /* files one seeder serves */

struct net_http_server;
struct seed_server;

/* Create a seeder and put its routes on srv (the server outlives the seeder's use). */
int seed_server_new(struct seed_server **out, struct net_http_server *srv);
/* Serve a model or window file. catalog_path: its catalog (required for a window file; for a
 * full model NULL builds it, hashing the file once). id_hex (may be NULL) gets the model id. */
int seed_server_add(struct seed_server *s, const char *path, const char *catalog_path,
                   char id_hex[65], char *err, size_t errlen);
/* Free after the server is closed. */
void seed_server_free(struct seed_server *s);

/* What a running pull has to say, handed to the caller's log callback (the library prints
 * nothing itself): SEED_PULL_LINE a whole line (a note such as "pull: resuming at ...", or a
 * progress line), without its newline; SEED_PULL_BAR a progress bar to draw over the previous
 * one ("\r" then line, no newline); SEED_PULL_BAR_END the bar is finished (end its line). */
enum { SEED_PULL_LINE, SEED_PULL_BAR, SEED_PULL_BAR_END };
typedef void (*seed_pull_log_cb)(void *ud, int kind, const char *line);
/* A seed_pull_log_cb that writes to the stdio stream ud (FILE *) chosen by the caller. */
void seed_pull_log_file(void *ud, int kind, const char *line);

/* Fetch a window: from a seeder (URL "http://host:port", no path) or from a plain HTTP(S)
 * URL of a full GGUF on any server that supports Range requests. The result is written to
 * out_path only when complete and verified (out_path.part + out_path.part.state hold a
 * resumable partial download meanwhile). */
struct seed_pull_opts {
    const char *url;
    uint32_t first, last;       /* [first, last) */
    const char *catalog_path;   /* verify every tensor against it (NULL: the seeder's catalog,
                                 * or none for a plain URL) */
    const char *model_id;       /* pick a model on a seeder serving several (NULL: the
                                 * catalog's id, or the only one) */
    const char *source_sha256;  /* plain URL without catalog: kvasir.source.sha256 to write */
    const char *out_path;
    int progress;               /* 0 none, 1 a line per 10%, 2 a redrawn bar (for a TTY) */
    seed_pull_log_cb log;       /* progress and notes go here (NULL: nowhere) */
    void *log_ud;
    bool zstd;                  /* ask a seeder for zstd encoding */
    long timeout_s;             /* stall timeout (no bytes) per request; 0: 30 s */
    uint64_t max_rate;          /* bytes/s cap on receiving (0: none) */
    const char *ca_file;        /* HTTPS: trust these CA certificates (PEM) instead of the system's */
    const volatile int *cancel; /* set non-zero (any thread) to stop: -ECANCELED, resumable */
};
struct seed_pull_stats {
    uint64_t bytes_fetched;     /* body bytes received (after decoding) */
    uint64_t bytes_resumed;     /* bytes found already done at the start */
    uint64_t requests;
    double seconds;             /* all of it */
    double verify_seconds;      /* of which: verifying and installing the window */
};
/* Blocking (libcurl easy interface): a running daemon calls it from a worker thread. */
int seed_pull(const struct seed_pull_opts *o, struct seed_pull_stats *st, char *err,
             size_t errlen);
/* `kvd stage --window-from URL`: the window of `rank` in the manifest, pulled into
 * DIR/window-<first>-<last>.gguf (DIR = dir or "."; an existing file is reused) and verified
 * against catalog_path, or against the seeder's catalog when the manifest names the model's
 * catalog id. The path goes to out. progress, log, log_ud: as in seed_pull_opts. */
int seed_window_from(const char *manifest, int rank, const char *url, const char *catalog_path,
                    const char *dir, int progress, seed_pull_log_cb log, void *log_ud, char *out,
                    size_t outlen, char *err, size_t errlen);

#endif

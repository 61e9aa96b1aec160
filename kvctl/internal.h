/* kvctl/internal.h — what kvctl's command files share besides common.c (internal to kvctl).
 * They form an order, each using only the ones above it:
 *   shape.c       model shapes for the planner: a GGUF header, a catalog, a shape descriptor
 *   plan.c        kvctl plan
 *   profile.c     kvctl profile
 *   ring_node.c   local nodes: directories, listening sockets handed to a kvd, pid checks,
 *                 control-socket status queries, the ring directory and its manifest
 *   ring_view.c   the ring as kvctl status shows it: a view per rank, the table, the JSON lines
 *   ring_up.c     kvctl ring up
 *   ring.c        kvctl ring (up, down) and kvctl status
 *   ring_gen.c    kvctl generate --ring */
#ifndef KV_KVCTL_INTERNAL_H
#define KV_KVCTL_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "kvctl/kvctl.h"
#include "planner/plan.h"
#include "ring/ring.h"

struct gguf_file;
struct gguf_catalog;

/* ---- kvctl/shape.c ---- */

/* A model's shape as kvctl plan and kvctl profile read it, and what it was read from. */
struct kvctl_model {
    struct gguf_file *gf;          /* --model GGUF: names borrowed from it */
    struct gguf_catalog *cat;      /* --catalog */
    struct plan_tensor *t;
    size_t nt;
    char *names;                   /* descriptor hparams: synthesised names */
    struct plan_layer *layers;     /* every block, the MTP ones last (shape.mtp sums them) */
    struct plan_shape shape;
    struct plan_model pm;          /* what the source says (plan_shape_of_model's input) */
    char name[128], arch[64], catalog[65];
    uint32_t kv_bytes, wire_bytes;
    char kind[16];                 /* "gguf", "catalog", "descriptor" */
};

/* The planner's view of GGUF header g (its architecture arch, borrowed): the tensors into *t
 * (the caller frees it; names borrowed from g), the blocks, the MTP ones (nextn_predict_layers),
 * the width and the experts as the header says them. 0, or -ENOMEM. */
int kvctl__gguf_plan_model(const struct gguf_file *g, const char *arch, struct plan_model *pm,
                           struct plan_tensor **t);
/* --model FILE into m (zeroed, kv_bytes/wire_bytes set): a GGUF (magic) or a JSON shape
 * descriptor. 0, or negative with err. m is freed with kvctl__model_free either way. */
int kvctl__model_load(struct kvctl_model *m, const char *path, char *err, size_t errlen);
/* --catalog FILE into m: used is --experts-used (0: none given), nextn --nextn (-1: the
 * catalog's own count of MTP blocks). 0, or negative with err. */
int kvctl__model_load_catalog(struct kvctl_model *m, const char *path, uint32_t used, int nextn, char *err,
                              size_t errlen);
/* What m holds (not m). */
void kvctl__model_free(struct kvctl_model *m);
/* JSON fields of the descriptor and the device profiles: an integer in [0, hi] (u64: [0, 2^52]),
 * absent unless required (out then untouched); 0, or -EINVAL with err naming ctx and key. */
int kvctl__json_u32(const cJSON *o, const char *key, uint32_t hi, bool required, uint32_t *out,
                    const char *ctx, char *err, size_t errlen);
int kvctl__json_u64(const cJSON *o, const char *key, bool required, uint64_t *out, const char *ctx,
                    char *err, size_t errlen);
/* A string field into buf (cut to n); buf untouched when absent. */
void kvctl__json_str(const cJSON *o, const char *key, char *buf, size_t n);

/* ---- kvctl/ring_node.c ---- */

/* mkdir -p dir: 0 or -errno. */
int kvctl__mkdir_p(const char *dir);
/* The kvd binary to start into out: $KVD_BIN when set, else the kvd next to this kvctl. 0, or
 * -ENOENT when it is not executable (out holds the path looked at), or -errno. */
int kvctl__kvd_path(char *out, size_t n);
/* In a forked child before exec: fds[0..n) (n <= 2) become fds 3.. with LISTEN_FDS/LISTEN_PID
 * set, as systemd hands listening sockets over. */
void kvctl__hand_over(const int *fds, int n);
/* Closes every fds[i] >= 0 and sets it to -1. */
void kvctl__close_fds(int *fds, uint32_t n);
/* Whether pid exists and is not a zombie. */
bool kvctl__pid_alive(int pid);
/* Whether pid is the kvd that its pid file (modified at pid_mtime) says: its executable is
 * kvd, its command line names want_a or want_b (absolute paths; NULL: none), and it started
 * before the pid file was written. A pid file outlives a crash, and the kernel hands its
 * number to another process; that one must never be signalled. false with the reason in why. */
bool kvctl__kvd_pid_is(int pid, const char *want_a, const char *want_b, time_t pid_mtime, char *why,
                       size_t n);
/* Whether pid is rank r's kvd of the ring in dir_abs (an absolute path). */
bool kvctl__ring_kvd_is(int pid, const char *dir_abs, uint32_t r, time_t pid_mtime, char *why,
                        size_t n);
/* A stage's status object from its control socket (the caller frees), or NULL with err set;
 * ring: with every rank as it last heard of them ("ranks") and the standbys. */
cJSON *kvctl__query_status_ring(const char *sock, bool ring, char *err, size_t errlen);
/* kvctl__query_status_ring without the ring's records. */
cJSON *kvctl__query_status(const char *sock, char *err, size_t errlen);
/* Where rank r's control socket is for a ring directory. */
void kvctl__rank_sock(const char *dir, uint32_t r, char *out, size_t n);
/* DIR, DIR/ring.json or a manifest path -> the ring directory: 0, or -errno (said). */
int kvctl__ring_dir(const char *arg, char *dir, size_t n);
/* DIR/ring.json into *m: 0, or -EINVAL (said). */
int kvctl__load_ring(const char *dir, struct ring_manifest *m);
/* As kvctl__load_ring, or the manifest file arg itself when it names a regular file. */
int kvctl__load_ring_at(const char *arg, const char *dir, struct ring_manifest *m);
/* The ring directory option of status and ring down (--dir DIR, --ring DIR, --dir=DIR,
 * --ring=DIR): the value (borrowed from argv) with *i moved past it, or NULL. */
const char *kvctl__dir_opt(int argc, char **argv, int *i);
/* `kvctl ring up`'s state directory when --dir is not given. */
#define KVCTL_RING_DIR "ring-state"
const char *kvctl__ring_dir_default(void);

/* ---- kvctl/ring_view.c ---- */

/* The ring as kvctl status shows it: one status object per rank, each its own control
 * socket's (a local ring's rank directory) or the record rank 0 heard over the ring's links
 * ("via": "rank 0", with its age), and rank 0's view of the ring. */
struct kvctl_ring_view {
    uint32_t n;
    char ring[72], model[128], arch[32], dtype[8];
    uint32_t n_layers, n_embd;
    cJSON *rows[RING_MAX_RANKS];        /* NULL: nothing known of the rank (why[r] says why) */
    char why[RING_MAX_RANKS][300];
    bool down[RING_MAX_RANKS];          /* no answer: its socket did not, or its record is old */
    cJSON *r0;                          /* rank 0's "ring": true status; NULL: it did not answer */
    const char *dir;                    /* a local ring's directory (standby sockets), or NULL */
    uint32_t n_standbys;
    uint32_t self;                      /* the rank whose socket was asked (unix:SOCKET) */
};

/* Frees what v holds and zeroes it. */
void kvctl__ring_view_free(struct kvctl_ring_view *v);
/* The view of a local ring directory with manifest m: each rank with a directory here asked
 * on its own socket, the others through rank 0. v holds dir (borrowed). */
void kvctl__ring_view_dir(struct kvctl_ring_view *v, const char *dir, const struct ring_manifest *m);
/* The view through one stage's control socket (rank 0's: every rank as it heard of them): 0,
 * or -1 with err set. */
int kvctl__ring_view_sock(struct kvctl_ring_view *v, const char *sock, char *err, size_t errlen);
/* The status table, the links not up, the standbys and the repair figures: how many stages
 * did not answer. */
int kvctl__ring_view_print(const struct kvctl_ring_view *v, FILE *out);
/* status --json: a status object per rank, one per line, then each standby's: 1 when a rank
 * is down or unreachable, else 0. */
int kvctl__ring_view_json(const struct kvctl_ring_view *v, FILE *out);
/* The table of a local ring (DIR, its manifest m): how many stages did not answer. */
int kvctl__ring_status_table(const char *dir, const struct ring_manifest *m, FILE *out);

/* ---- kvctl/ring_up.c ---- */

/* kvctl ring up (argv from "up"): the command's exit status. */
int kvctl__ring_up(int argc, char **argv);

#endif

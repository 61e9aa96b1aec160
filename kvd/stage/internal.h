/* kvd/stage/internal.h — cross-file internals of the stage role: the compute backend vtable and
 * the table of backends by name (the model; a build may add others, as the network tests'
 * stand-in in tests/tools/stub_backend.c), the compute thread, and the loop side's state (struct
 * stage) and files. The loop side's files form an order, each using only those before it:
 *   conn.c      a link's frame output, its closing, protocol violations, pings, the link notes
 *   client.c    rank 0's control-socket clients' output (JSON lines) and their memory
 *   rowlog.c    the row log of the sessions whose receipts this stage wrote (audits)
 *   receipt.c   the work receipts of sessions, and those parked for a replay
 *   session.c   sessions, their boundary logs, rank 0's client streams and generation
 *               (model_gen), compute results, rank 0's repair (pause, replay)
 *   status.c    the ring-wide status: this stage's record, every rank's last one, STATUS frames
 *   frames.c    the session frames arriving on a link, checked against the manifest
 *   link.c      predecessor and successor links: dial, accept, handshake, breakage
 *   control.c   the control socket (generate, status, probe, shutdown) and the status object
 *   api.c       rank 0's OpenAI-compatible API (api/api.h) over the sessions
 *   stage.c     the struct's start and stop, the periodic tick, signals, a standby's takeover
 *   main.c      `kvd stage`'s options
 * The calls upwards go through function pointers that stage.c sets in struct stage: control.c's
 * shutdown, and link.c's take_rank and pull_window (a standby taking a rank); stage.c hands the
 * compute thread's results to session.c, its probes' to control.c. The compute thread lies
 * below them all: backend.c and backend_model.c (what it runs), probe.c (a market's
 * known-answer probe on a backend: the thread's PROBE job, or kvd join's fresh instance),
 * sched.c (its batching scheduler) < compute.c (the thread, its jobs run on the backend).
 *
 * struct stage is in parts, each written by the file its comment names (stage.c sets every
 * part's first values): at the top the shape, settings and compute (stage.c); io, tick and
 * standby (stage.c); links (link.c, conn.c); sessions and repair (session.c); status
 * (status.c); stats (session.c, frames.c); receipts (receipt.c); probes (control.c). */
#ifndef KV_KVD_INTERNAL_H
#define KV_KVD_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>
#include <uv.h>

#include "kvd/kvd.h"
#include "ring/ring.h"

#include "net/net.h"
#include "util/err.h"
#include "util/util.h"

struct model_vocab;
struct model_gen;
struct gguf_file;
struct model_batch_row;

/* One window pass over rows of one or several sessions: a session's rows consecutive in the
 * batch and at consecutive positions (model_window_run_batch's rules); a batch of one session
 * is a single-session run (any number of rows). Rank 0 embeds the rows' tokens first, the last
 * rank gives the logits of the rows asked for after the window. */
struct kvd_backend_batch {
    const struct model_batch_row *rows;   /* [n]: each row's session and position */
    uint32_t n;
    const int32_t *tokens;   /* rank 0: [n] tokens, embedded into x; NULL elsewhere */
    float *x;                /* [n][n_embd]: the input on ranks > 0, the window's output */
    const uint32_t *head;    /* last rank: [n_head] rows (indices into x) whose logits are wanted */
    uint32_t n_head;
    float *logits;           /* [n_head][n_vocab] */
};

/* A compute backend: per-session state and one batched run. run returns -ENOENT, -EINVAL or
 * -ERANGE when it refused the batch before anything ran (a token outside the vocabulary, an
 * unknown session, a skipped position, past the context: x and every session untouched), any
 * other negative code when the pass itself failed; err names what failed. */
struct kvd_backend_ops {
    int (*session_new)(void *impl, uint64_t id);    /* -EEXIST, -ENOMEM */
    int (*session_free)(void *impl, uint64_t id);   /* -ENOENT */
    int (*run)(void *impl, const struct kvd_backend_batch *bt, char *err, size_t errlen);
    void (*free)(void *impl);
    /* A window whose sessions cannot go back to an earlier position (recurrent layers; the
     * backend's can_rewind is false): keep a session's state at its position now, and put it
     * back (a verifying pass of drafts, some rejected). NULL: no checkpoints, no drafting. */
    int (*checkpoint)(void *impl, uint64_t id);
    int (*restore)(void *impl, uint64_t id);
    /* Last rank with an MTP block (kvd_backend.mtp): model_mtp_draft. NULL: no MTP block. */
    int (*mtp_draft)(void *impl, uint64_t id, uint32_t pos, uint32_t n, const float *x,
                     const int32_t *hist, uint32_t n_hist, uint32_t k, int32_t *out);
};

struct kvd_backend {
    const struct kvd_backend_ops *ops;
    void *impl;
    uint32_t n_embd, n_vocab, n_layer, first, last, n_ctx_train;
    bool embed, head;
    bool mtp;                  /* last rank: the window holds the MTP block (ops->mtp_draft) */
    char arch[32];
    int32_t eos, bos;          /* -1 when unknown */
    bool add_bos;
    uint64_t weight_bytes;     /* bytes of the window's weights (mapped) */
    uint64_t kv_bytes_per_session;   /* K/V for the manifest's context and recurrent state */
    char device[16];           /* the kernel device ("cpu", "opencl"; "" without a model) */
    /* opencl: "map" (weights wrapped in place over the mapping) or "copy" (uploaded), and the
     * weight bytes each way (docs/opencl.md, "Memory"); "" and 0 on other devices */
    char cl_weights[8];
    uint64_t cl_weights_mapped, cl_weights_copied;
    /* Most rows one window run of several sessions may take with every row's result the one
     * it has alone (kern_dev_rows_exact of the window's weights on its device):
     * KERN_ROWS_EXACT_MAX with an F32 matmul weight on the cpu device or any weight on
     * opencl with prompt GEMMs from 16 rows, else what the executor holds; 0: the window's
     * weight types round differently batched. */
    uint32_t batch_rows;
    /* A session's rows split into runs of any sizes (in order) give the results of one run:
     * every layer weight row-exact at any row count on the device (no F32 on cpu, no prompt
     * GEMMs on opencl: a BLAS past some rows). The scheduler then splits long prompts into
     * chunks. */
    bool chunk_exact;
    /* A run may start at an earlier position than the session's end (its later rows are
     * overwritten): no recurrent layers in the window. Without it, going back takes
     * ops->checkpoint and ops->restore. */
    bool can_rewind;
    struct model_vocab *vocab; /* rank 0: the tokenizer (NULL without one); immutable */
};

/* What a backend is opened with: the manifest's shape and this rank's window, and the model
 * file where the backend reads one. */
struct kvd_backend_args {
    const char *path;          /* full GGUF or mini-GGUF; NULL for a backend without a file */
    int first, last;           /* the window to map from a full GGUF; -1: the file's own */
    uint32_t win_first, win_last;   /* this rank's window in the manifest */
    uint32_t n_layer, n_embd, n_ctx, max_batch;
    int n_threads;
    const char *device;        /* the kernel device the model runs on ("cpu", "opencl") */
    const struct kern_cl_opts *cl;  /* its opencl settings; NULL: the environment's */
};
typedef int (*kvd_backend_open_fn)(struct kvd_backend *b, const struct kvd_backend_args *a,
                                   char *err, size_t errlen);

/* The backends a kvd offers, by name. The model is built in (the default); a build may add
 * others before main runs (the network tests' stand-in in tests/tools/stub_backend.c), each selected
 * by a `kvd stage` option without argument. A backend without a model file has no catalog,
 * architecture or seeding checks (kvd_backend_gguf is NULL). */
struct kvd_backend_kind {
    const char *name;
    const char *option;        /* "--stub"; NULL: none (the model, chosen by --model/--window) */
    const char *help;
    kvd_backend_open_fn open;
};
#define KVD_BACKEND_KINDS_MAX 8
/* Add a backend kind (k must outlive the process): 0, -EEXIST for a name already there,
 * -ENOSPC past KVD_BACKEND_KINDS_MAX. */
int kvd_backend_register(const struct kvd_backend_kind *k);
/* The i-th kind (0: the model), NULL past the last; borrowed for the process's life. */
const struct kvd_backend_kind *kvd_backend_kind_at(size_t i);
const struct kvd_backend_kind *kvd_backend_kind_find(const char *name);

/* The model backend (model/model.h): a->path is a full GGUF or a mini-GGUF. */
int kvd_backend_open_model(struct kvd_backend *b, const struct kvd_backend_args *a, char *err,
                           size_t errlen);
void kvd_backend_close(struct kvd_backend *b);
/* The parsed model file with the window's tensors mapped (NULL for a backend without one). */
const struct gguf_file *kvd_backend_gguf(const struct kvd_backend *b);
/* Rank 0: text -> tokens (BOS as the vocabulary asks); -ENOSYS without a tokenizer. */
int kvd_backend_tokenize(struct kvd_backend *b, const char *text, int32_t **toks, uint32_t *n);

/* A market's known-answer probe (probe.c; docs/market.md, "Probes") on the open backend b,
 * whose window must be the challenge's (c, the market's probe object, parsed by the caller:
 * cJSON's parser writes a global, so the compute thread is handed the tree, which it only
 * reads): each sequence a fresh session of b, ids id0, id0 + 1,
 * ... (free in b), its rows in runs of at most max_rows. *outputs gets the JSON array of
 * answers (malloc'd). 0, or negative with err filled. Its sessions' ids start at
 * KVD_PROBE_ID0 ("probe") where they can: the probe tests' wrong-traffic backend
 * (tests/tools/stub_backend.c) tells probes from traffic by them. */
#define KVD_PROBE_ID0 0x70726f6265000000ull
struct cJSON;
int kvd_probe_run(struct kvd_backend *b, uint64_t id0, uint32_t max_rows, const struct cJSON *c,
                  char **outputs, char *err, size_t errlen);

/* PROBE: a market's known-answer probe (probe.c) run on the loaded backend between steps; its
 * challenge in probe, the answer's JSON (the outputs array) back in out. */
enum kvd_job_kind { KVD_JOB_OPEN, KVD_JOB_STEP, KVD_JOB_CLOSE, KVD_JOB_PROBE };

struct kvd_job {
    struct kvd_job *next;           /* the compute thread's queue */
    struct net_handoff_link back;   /* the way back to the loop, once run */
    int kind;
    uint64_t session;
    uint32_t pos, n;
    uint8_t flags;                  /* RING_FL_LAST, RING_FL_DRAFT, RING_FL_LOGITS */
    struct ring_open_params open;    /* OPEN */
    int32_t *tokens;                /* OPEN: prompt (sampler history); STEP on rank 0: to embed */
    uint32_t n_tokens;
    uint8_t *in;                    /* STEP on rank > 0: the ACT payload (wire dtype) */
    size_t in_len;
    /* results */
    int rc;
    char err[KV_ERR_MAX];
    int out_type;                   /* 0, RING_F_ACT or RING_F_TOKEN */
    uint8_t out_flags;
    uint32_t out_pos, out_n;        /* the frame's pos and n_tokens (a TOKEN: its first token's
                                     * position and how many it carries) */
    int32_t token;                  /* last rank: the first token sampled, and its logprob */
    float logprob;
    uint8_t *out;
    size_t out_len;
    double ms;                      /* compute time */
    double t_queued;                /* util_now_ms() at kvd_compute_submit, or at the end of
                                     * the run of the prompt chunk split off before it */
    uint32_t runs_waited;           /* step runs that ended while this step waited */
    bool piece;                     /* a chunk of a prompt the scheduler split, or its rest */
    uint32_t epoch;                 /* the session's incarnation it was submitted for: a result
                                     * for an earlier one (a session paused, dropped, replayed) is
                                     * dropped */
    struct cJSON *probe;            /* PROBE: the challenge (parsed on the loop thread) */
    uint64_t ticket;                /* PROBE: the control client waiting for it */
};

struct kvd_compute;
typedef void (*kvd_job_done_cb)(struct kvd_job *j, void *ud);
/* The compute thread: max_batch caps a window run's rows; a STEP taken waits up to
 * batch_wait_us for other sessions' steps to run with it (0: only those already queued). */
int kvd_compute_new(struct kvd_compute **out, uv_loop_t *loop, struct kvd_backend *b,
                    uint32_t wire_dsize, uint32_t max_batch, uint32_t batch_wait_us,
                    kvd_job_done_cb done, void *ud);
void kvd_compute_submit(struct kvd_compute *c, struct kvd_job *j);
/* jobs[0..n) queued at once, in order: the compute thread sees all of them in its next plan. */
void kvd_compute_submit_n(struct kvd_compute *c, struct kvd_job **jobs, uint32_t n);
/* Window runs that took steps of several sessions at once; every step's wait from being
 * submitted to its run starting (the scheduler's fairness: docs/ring.md), and the step runs'
 * times (batched or alone). */
struct kvd_compute_stats {
    uint64_t batches, batched_jobs, batched_rows;
    uint32_t max_jobs, max_rows;
    uint64_t steps_waited, step_runs;
    double wait_ms_total, wait_ms_max, run_ms_total, run_ms_max;
    double dec_wait_ms_max;     /* the longest wait of a one-row (decode) step */
    /* the most step runs that passed while one step waited (decode steps apart), and the
     * prompt chunks split off (docs/ring.md, "The batching scheduler") */
    uint32_t max_runs_waited, max_dec_runs_waited;
    uint64_t chunks;
    /* drafting: verifying passes run, rows of rejected drafts dropped, and on a window that
     * cannot rewind the checkpoints taken, restored, and the kept rows run again */
    uint64_t draft_passes, rows_dropped, checkpoints, restores, rows_rerun;
};
void kvd_compute_stats(struct kvd_compute *c, struct kvd_compute_stats *out);
/* Stop the thread (pending jobs are dropped, the thread joined) and close the results' queue
 * (jobs run and not yet delivered are dropped too). c is freed in the queue's close callback, which then calls closed(ud) (may be NULL): from
 * then on nothing of c touches the backend. c == NULL: nothing happens, closed is not called. */
typedef void (*kvd_compute_closed_cb)(void *ud);
void kvd_compute_stop(struct kvd_compute *c, kvd_compute_closed_cb closed, void *ud);
void kvd_job_free(struct kvd_job *j);

/* The compute thread's state (compute.c), which its batching scheduler (sched.c) reads and
 * whose queue it takes jobs from. At most KVD_BATCH_JOBS_MAX jobs run in one batch. */
#define KVD_BATCH_JOBS_MAX 32
struct csess;
struct kvd_compute {
    struct net_handoff *results;    /* jobs run, back to the loop thread */
    struct kvd_backend *b;
    uint32_t wire_dsize;
    kvd_job_done_cb done;
    void *ud;
    kvd_compute_closed_cb closed;   /* kvd_compute_stop's: after everything is freed */
    void *closed_ud;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct kvd_job *in_head, *in_tail;
    bool stop;
    struct csess *sessions;     /* compute thread only */
    /* compute thread scratch: a batch's rows, tokens (rank 0) and boundary, and its logits */
    struct model_batch_row *rows;
    int32_t *tok;
    float *x, *logits;
    size_t rows_cap, x_cap, logits_cap;
    uint32_t max_batch;         /* rows one window run may take */
    uint32_t batch_wait_us;     /* how long a batch waits for more steps (0: never) */
    bool last_solo;             /* the last step run: a prompt too long to batch, alone */
    bool last_prompt;           /* the last step run held a prompt (several rows) */
    struct kvd_compute_stats stats;   /* under mu */
    struct kvd_compute_stats dstats;  /* compute thread: the drafting counters, copied into
                                       * stats after each run */
};
/* The batching scheduler (sched.c). Rows one run of several sessions may take (0 or 1: every
 * run takes one session's step); whether a step is taken whole and first (a decode step or a
 * verifying pass); with c->mu held and the queue not empty, the jobs the next run takes into
 * batch[KVD_BATCH_JOBS_MAX] (how many; an OPEN or CLOSE alone). */
uint32_t kvd_sched_cap(const struct kvd_compute *c);
bool kvd_sched_step_whole(const struct kvd_job *j);
uint32_t kvd_sched_take(struct kvd_compute *c, struct kvd_job **batch);

/* ============================ the loop side ============================ */

/* Links in handshake: at most this many in all and from one source address; a new one over
 * a limit closes the oldest that has not sent a valid HELLO, else the oldest from the source
 * holding the most (a HELLO is public data: only the AUTH proves the key), so a restarted
 * neighbour always gets a slot. A valid HELLO must be followed by its AUTH within
 * AUTH_AFTER_HELLO_MS, about one round trip for a real peer (docs/security.md). */
#define MAX_PENDING_LINKS 32
#define MAX_PENDING_PER_SOURCE 4
#define AUTH_AFTER_HELLO_MS 3000
#define LINK_STABLE_MS 5000     /* a link up this long resets its redial backoff */
#define REJECT_LOG_MS 10000     /* warnings about refused peers: per source and interval, */
#define REJECT_LOG_LINES 16     /* each distinct line once and at most this many lines */
#define REJECT_LOG_SOURCES 16
#define CLOSED_RING 256
#define CTL_LINE_MAX (1u << 20)
/* An established link with nothing received (pings included) for its deadline is dead: the
 * --link-timeout-ms given, else LINK_SILENCE_MIN_MS + LINK_SILENCE_RTTS x the link's measured
 * round trip, at most LINK_SILENCE_MAX_MS. Pings are sent and answered by the event loop, never
 * the compute thread, so a window's time per token does not delay them (docs/ring.md,
 * "Repair"). */
#define LINK_SILENCE_MIN_MS 3000
#define LINK_SILENCE_RTTS 4
#define LINK_SILENCE_MAX_MS 15000
/* A dialled successor's handshake (two messages each way) must end within the --link-timeout-ms
 * given, else LINK_HS_MIN_MS + LINK_HS_RTTS x the last round trip measured to a successor: a
 * stopped node whose kernel still accepts is passed over quickly (docs/ring.md, "Repair"). */
#define LINK_HS_MIN_MS 1500
#define LINK_HS_RTTS 8
#define LINK_HS_MAX_MS 10000
#define PING_MS 1000            /* at most this long between pings; less for a short deadline */
#define RELAY_WAIT_MS 60000     /* an in-link through a relay that no predecessor came to is
                                 * dialled again after this (the relay usually ends it first) */
#define TICK_MS 250             /* the periodic check: pings, deadlines, idle sessions */
#define REPAIR_TICK_MS 50           /* rank 0 looks for a repaired ring this often */
#define REPAIR_GRACE_MS 10000       /* a ring starting: its stages may not listen yet */
#define REPLAY_BACKOFF_MAX_MS 2000  /* replays through a ring still broken back off up to this */
/* Until a link's handshake is done only HELLO, AUTH and ERROR may come: a small cap, so an
 * unauthenticated peer cannot make us buffer a boundary-sized frame. */
#define HS_MAX_PAYLOAD (4 + RING_ERRMSG_MAX)

enum { CONN_PENDING, CONN_IN, CONN_OUT };

struct conn {
    struct stage *st;
    struct ring_link *link;
    struct ring_handshake *hs;
    int role;
    bool up;
    uint32_t peer_rank;
    uint64_t last_rx_ms, ping_sent_ns;
    double rtt_ms;
    bool relay_in;              /* our in-link, dialled out to a relay (relay:// endpoint) */
    uint64_t start_ms, up_ms;   /* when the link was made and when it was established */
    uint64_t hello_ms;          /* when the peer's HELLO passed its check (0: not yet) */
    bool await_hello;           /* accepted: the handshake starts with the peer's HELLO, which
                                 * says which key to expect (a rank's or a standby's) */
    uint32_t as_rank;           /* the rank this side's HELLO claims (a standby's rank-to-be) */
    bool hung;                  /* closed for silence: a redial tries the next candidate first */
    struct conn *next;          /* pending list */
};

/* Rate limit of the warnings about refused or failed peers, per source address. */
struct kvd_reject_log {
    char src[64];
    uint64_t window_ms;                 /* start of the current interval */
    uint32_t lines[REJECT_LOG_LINES];   /* hashes of the lines logged in it */
    uint32_t n_lines, suppressed;
};

/* What a stage knows of the ring link rank r -> rank r + 1 (mod n): its own out link (r =
 * its rank), its in link (r = pred), and rank 0 (and each stage on the way) what stages
 * further on reported. A plain string with its time, for the client's error and status. */
#define KVD_REASON_MAX 512
struct kvd_link_note {
    bool down;                          /* down as last seen or reported */
    uint32_t by_rank;                   /* the rank that gave last_reason */
    char last_reason[KVD_REASON_MAX];   /* the last failure ("" none): printable, bounded */
    uint64_t last_reason_ms;            /* when it was recorded (util_now_ms) */
};

struct client;
struct sess;

/* One ACT frame a stage sent downstream, kept in its session's boundary log: a repair of a
 * rank downstream resends it instead of recomputing it (docs/ring.md, "Repair"). */
struct blog_entry {
    struct blog_entry *next;
    uint32_t pos, n;
    uint8_t *data;              /* n rows in the wire dtype */
    size_t len;
};

/* The ring-wide status (docs/design.md, "The ring data path"): every stage sends its own
 * record each tick on both links, and passes on a record fresher than the one it holds for
 * that rank; the table has one fixed slot per rank, so a peer's records cannot grow it. */
#define STATUS_ANSWER_MS 5000   /* a record older than this: the rank does not answer */
#define STATUS_STR_MAX 120      /* a string field of a record (longer ones are cut) */
#define STATUS_EVERY_MS 1000   /* how often a stage sends its own record */
struct kvd_status_slot {
    uint64_t rx_ms;             /* when the record came (0: none yet) */
    uint32_t age_rx;            /* its age then, in ms */
    char rec[RING_STATUS_MAX + 1];   /* the record, checked and re-encoded here */
    char who[40];               /* node and pid that served the rank (a repair changes it) */
    char who_seen[40];          /* the same as rank 0 last looked (status.c: note_repair) */
};

/* Rank 0: where a session's tokens and end go when a local API request (not a control-socket
 * client) asked for it (kvd/stage/api.c). done is the last call, from kvd_sess_finish or a
 * drop; the session is freed right after it. */
struct kvd_sess_sink {
    void (*token)(void *ud, struct sess *s, int32_t tok, const char *text, size_t len,
                  const float *logits);
    void (*done)(void *ud, struct sess *s, const char *reason, const char *error,
                 const char *tail, size_t tail_len);
};

struct sess {
    uint64_t id;
    struct sess *next;
    uint32_t n_ctx, next_pos;   /* next position expected on the in link */
    uint64_t last_active_ms;
    /* rank 0 */
    struct client *client;
    struct model_gen *gen;      /* history, streamed text, stop conditions */
    bool want_logits;
    float *last_logits;
    double t_start, t_first;
    uint32_t epoch;             /* this incarnation: jobs submitted for an earlier one are dropped */
    /* rank 0: repair (docs/ring.md, "Repair") */
    struct ring_open_params open;   /* what OPEN carried, for a replay */
    uint8_t open_flags;
    bool paused;                /* waiting for the ring's repair */
    bool replaying;             /* replayed; no token since */
    uint64_t broken_ms;         /* when the ring broke under it (0: running) */
    uint32_t replays;
    uint32_t replay_end;        /* ranks > 0: a replayed session's history length (positions
                                 * below it are recomputed), 0: not a replay */
    /* The boundary log (every rank but the last): the ACT frames sent for positions
     * [0, log_end), unless it outgrew its cap (log_dropped). A session whose out link broke
     * is held: its KV and log stay for the replay, its results are logged but not sent. */
    struct blog_entry *log_head, *log_tail;
    size_t log_bytes;
    uint32_t log_end;
    bool log_dropped;
    bool held;
    uint32_t kv_end;            /* positions submitted to compute (in the KV once they ran) */
    uint32_t skip_below;        /* a resumed session: ACT rows below it are in the KV already */
    /* Drafting (docs/ring.md, "Drafting"): the last rows run were a verifying pass from
     * draft_from, so the next step may start at any position in (draft_from, kv_end] (the
     * rows after it were rejected drafts: dropped) */
    bool drafted;
    uint32_t draft_from;
    /* rank 0: the drafts that pass verified (the rows after its first) */
    int32_t drafts[RING_DRAFTS_MAX];
    uint32_t n_drafts;
    uint64_t drafts_proposed, drafts_accepted, passes;
    uint64_t seq;               /* creation order: the oldest logs go first under the total cap */
    const struct kvd_sess_sink *sink;   /* instead of client: the API's request */
    void *sink_ud;
    struct kvd_receipt *receipt;   /* the work receipts' counters (receipt.c); NULL: none yet */
    /* rank 0: the paying client who opened it (its receipts bind the session to it) */
    bool has_client;
    char client_id[65];
    uint8_t client_v[32];          /* the client's verifier (ring_client_verifier), not its key */
};

struct client {
    uv_pipe_t pipe;
    struct stage *st;
    struct util_buf buf;   /* the request line as it comes (under CTL_LINE_MAX) */
    bool closing, got_request;
    struct sess *sess;
    uint64_t probe;        /* the ticket of the probe it waits for (0: none) */
    struct client *next;
};

/* ============================ struct stage ============================ */

/* The loop side's state, in parts. Each part below is written by the file its comment names
 * and only read elsewhere; stage.c, which starts and stops the stage, also sets every part's
 * first values and initialises and closes the libuv handles inside them. A file that needs
 * another part changed asks its owner (kvd_client_add, kvd_sess_closed_forget,
 * kvd_conn_pong, ...). */

/* stage.c: the ring listener, the control socket (control.c serves its connections), the
 * seeder and the signals, opened at start and closed at shutdown; api is api.c's
 * (kvd_api_start and kvd_api_stop, called from stage.c). */
struct stage_io {
    struct ring_listener *ls;
    uv_pipe_t ctl;
    bool ctl_open;
    char sock_path[512];
    struct net_http_server *http; /* --seed: windows of what this stage holds */
    struct seed_server *seeder;
    struct api_server *api;       /* --api (rank 0): the OpenAI-compatible API */
    uv_signal_t sigterm, sigint, sighup;
};

/* stage.c: the periodic tick (pings, deadlines, idle sessions, the roster). */
struct stage_tick {
    uv_timer_t timer;
    uint64_t last_ping_ms;
    uint64_t roster_checked_ms; /* the roster file (kvd_stage_opts.roster): when last looked at, */
    struct timespec roster_mtime;   /* ... and the mtime and size of the one read */
    long long roster_size;
};

/* stage.c: this node as a standby (docs/ring.md, "Repair"); read by link.c (which rank a
 * predecessor's HELLO may give it), status.c and control.c. */
struct stage_standby {
    int index;                  /* this node's standby entry, -1: a rank from the start */
    bool waiting;               /* a standby that has not taken over a rank yet */
    char pulled[4096];          /* the window pulled for pulled_rank ("" none yet) */
    uint32_t pulled_rank;
    bool pulling;
    uint64_t takeovers;         /* ranks taken over (0 or 1) */
};

/* The ring links: link.c (dial, accept, handshake, redial, the out link's failures) and below
 * it conn.c (the notes on every link, the reports back to rank 0, the successor's round
 * trip). The other files send on in and out (kvd_conn_in_up and kvd_conn_out_up say whether
 * they are up); frames.c, status.c and control.c read the notes; stage.c's tick closes links
 * past their deadlines. */
struct stage_links {
    struct conn *in, *out;      /* the predecessor's and the successor's link (NULL: none) */
    struct conn *pending;       /* links in handshake, newest first */
    uv_timer_t redial;          /* the out link's next dial, after redial_ms */
    uint32_t redial_ms;
    uv_timer_t redial_in;       /* relay:// endpoint: re-dial the relay for the in-link */
    uint32_t redial_in_ms;
    struct kvd_reject_log rejects[REJECT_LOG_SOURCES];
    uint32_t out_target;        /* the successor's candidate dialled: 0 its endpoint, k > 0 the
                                 * (k-1)-th standby that may serve it */
    bool pred_wait_logged;      /* said once that we wait for the predecessor (through a relay) */
    bool out_was_up;            /* the successor linked once (or this standby took over a rank
                                 * of a running ring): a failed redial may try standbys */
    uint32_t out_fail_hash;     /* the out link's failure logged last (0: none since up) */
    uint32_t out_fail_n;        /* failed attempts with that reason */
    uint64_t out_fail_log_ms;   /* when it was last logged */
    /* conn.c: why links are down (kvd_conn_note; docs/troubleshooting.md) */
    struct kvd_link_note note[RING_MAX_RANKS];   /* [r]: the link rank r -> rank r + 1 */
    uint32_t out_report_hash;   /* the out link's state last reported back (0: none; link.c
                                 * clears it for a new predecessor) */
    double succ_rtt_ms;         /* the last round trip measured to a successor */
};

/* session.c: the sessions, with their boundary logs, and rank 0's control-socket clients
 * (control.c hands each new one over: kvd_client_add). Read by frames.c and status.c (n),
 * control.c, and stage.c (the idle check, everything ended at shutdown). */
struct stage_sessions {
    struct sess *list;
    uint32_t n;
    uint64_t closed[CLOSED_RING];   /* sessions ended lately: frames still coming are dropped */
    uint32_t closed_pos;
    uint32_t epoch;             /* the last session incarnation handed out */
    uint64_t seq;               /* the last creation number (sess.seq) */
    struct client *clients;
    uint64_t blog_cap, blog_total_cap;   /* boundary logs: per session and in all (bytes) */
    uint64_t blog_bytes;        /* held by every session's log now */
};

/* session.c: rank 0's repair (docs/ring.md, "Repair"): sessions paused while the ring is
 * broken, replayed once it links again, and what the breaks cost. Read by control.c and
 * status.c. */
struct stage_repair {
    uint32_t wait_ms;           /* pause sessions this long for a repair; 0: end them */
    uv_timer_t timer;           /* while sessions are paused */
    bool timer_open;
    uint64_t next_replay_ms;
    uint32_t backoff_ms;        /* the next wait between replays through a ring still broken */
    uint32_t n_paused;
    uint64_t ring_breaks, resumed, replays, failed;
    double last_resume_ms, max_resume_ms;   /* ring broken -> the next token, per session */
};

/* status.c: the ring-wide status: every rank's last record, and rank 0's repairs as the
 * records show them. Read by control.c. */
struct stage_status {
    struct kvd_status_slot slot[RING_MAX_RANKS];
    uint64_t sent_ms;           /* when this stage last sent its own record */
    bool was_linked, broken;
    uint64_t repairs;           /* rank 0: the ring linked again after a break */
    int64_t last_repair_unix;
    int last_repair_rank;       /* the rank whose node or process changed last, -1: none */
};

/* The work counters of the status objects: session.c counts steps, frames, drafts and the
 * replays it serves; frames.c the replays that come to this stage (an OPEN flagged REPLAY,
 * the positions its ACTs recompute). Read by control.c and status.c. */
struct stage_stats {
    uint64_t steps, rows, act_frames_out, tok_frames_out, frame_bytes_out;
    uint64_t last_step_ms;      /* when the last step ran (0: none yet): the map's last token */
    double compute_ms;
    uint64_t dec_steps;
    double dec_ms;
    double ms_tok_avg;          /* moving average of a decode step's compute, ms */
    /* rank 0, drafting: verifying passes sent, the drafts they carried, and those accepted;
     * tokens that came back (one a pass without drafts) */
    uint64_t draft_passes, drafts_sent, drafts_accepted, tokens_in, passes_in;
    /* sessions this stage opened as replays (OPEN flagged REPLAY) and the positions of their
     * histories it recomputed; boundary logs dropped over a cap; replayed sessions this stage
     * served from its log */
    uint64_t replayed_sessions, replayed_positions;
    uint64_t blog_dropped, replays_from_log;
};

/* control.c: the market's probes its clients (kvd join) had run on the loaded window: the last
 * ticket handed out, and those answered and failed, with their time from asked to answered. */
struct stage_probes {
    uint64_t ticket, run, failed;
    double ms_total, ms_max;
};

/* receipt.c: receipts of sessions lost to a ring break, kept for their replay. */
struct stage_receipts {
    void *parked;
    uint32_t n_parked;
};

struct stage {
    /* The stage's shape, settings and compute: set by stage.c at start (the rank, the window
     * and the compute thread when a standby takes a rank; the manifest's standbys when the
     * roster changes) and read by every file. */
    uv_loop_t *loop;
    struct kvd_stage_opts o;
    struct ring_manifest m;
    uint32_t rank, n, pred, succ;
    bool is_last;
    struct net_identity *id;
    struct kvd_backend be;
    bool be_open;
    char backend_name[24];      /* the compute backend or kernel device the window runs on */
    struct kvd_compute *comp;
    uint32_t max_payload, chunk;
    uint64_t start_ms;          /* when the stage started: past REPAIR_GRACE_MS a successor
                                 * that never linked is passed over too */
    bool shutting_down;
    /* Set by stage.c: the control socket's shutdown request (control.c lies below it). */
    void (*shutdown)(struct stage *st, const char *why);
    /* Set by stage.c: a standby takes over rank (window, compute thread): 0 or -errno (logged). */
    int (*take_rank)(struct stage *st, uint32_t rank);
    /* Set by stage.c: a standby with --window-from: 1 when rank's window is here, 0 while it is
     * being pulled (started by this call when no pull runs), -errno when it cannot be. */
    int (*pull_window)(struct stage *st, uint32_t rank);

    struct stage_io io;
    struct stage_tick tick;
    struct stage_standby standby;
    struct stage_links links;
    struct stage_sessions sessions;
    struct stage_repair repair;
    struct stage_status status;
    struct stage_stats stats;
    struct stage_receipts receipts;
    struct stage_probes probes;
};

/* receipt.c: per session, the positions run and Merkle roots over the boundary rows sent and
 * received (one leaf per position); written to o.receipts when the session ends here
 * (kvd_receipt_close, from kvd_sess_drop). Each does nothing without o.receipts. ran: the
 * positions of a step (tokens: rank 0's ids it embedded, else NULL); sent and received: a
 * frame's rows as its header gives them (an ACT's n rows at pos, a TOKEN at pos). */
void kvd_receipt_ran(struct stage *st, struct sess *s, uint32_t pos, uint32_t n,
                     const int32_t *tokens);
void kvd_receipt_sent(struct stage *st, struct sess *s, uint32_t pos, uint32_t n, uint8_t flags,
                      const void *payload, size_t len);
void kvd_receipt_received(struct stage *st, struct sess *s, uint32_t pos, uint32_t n,
                          uint8_t flags, const void *payload, size_t len);
/* A replay of session s (docs/ring.md, "Repair"; rank 0 sending it, the last rank receiving
 * its OPEN) runs its whole history of n positions again as a prompt: the last rank samples
 * from none of them but the last, so whichever node serves the last rank now sends no TOKEN
 * for positions [0, n - 1). Their TOKEN leaves (rank 0's received side, the last rank's sent
 * side) are cleared at both ends when the replay's first TOKEN is sent and received, so the
 * two trees agree whether the last rank's node kept the session, took the rank over as a
 * standby or started again, and a replay that never reaches the last rank clears nothing;
 * the row log records it. */
void kvd_receipt_replayed(struct stage *st, struct sess *s, uint32_t n);
/* The session's OPEN payload (its sampling, the first RING_SAMPLING_LEN bytes), on rank 0 as it
 * sends it and on the last rank as it receives it: folded into the last edge's digests
 * (ring_receipt_fold) and kept in the row log for audits. */
void kvd_receipt_sampling(struct stage *st, struct sess *s, const uint8_t open[RING_OPEN_LEN]);
void kvd_receipt_close(struct stage *st, struct sess *s);
/* A session lost to a ring break: its receipt is kept aside (parked) for its replay, which
 * adopts it (kvd_receipt_adopt, from kvd_sess_new), instead of being written now; unpark
 * writes the parked receipt of a session rank 0 ended without a replay; park_tick writes those
 * parked longer than keep_ms; park_free writes every one left (shutdown). */
void kvd_receipt_park(struct stage *st, struct sess *s);
void kvd_receipt_adopt(struct stage *st, struct sess *s);
void kvd_receipt_unpark(struct stage *st, uint64_t id);
void kvd_receipt_park_tick(struct stage *st, uint64_t now_ms, uint64_t keep_ms);
void kvd_receipt_park_free(struct stage *st);

/* rowlog.c: the row log of the sessions whose receipts this stage wrote, kept for audits
 * (docs/market.md, "Audits"): DIR/rows/<session>.rows, one record per row, u8 kind | u32le pos
 * | u32le len | len bytes; files older than KVD_ROWLOG_KEEP_S go, and the oldest first while
 * they hold more than o.rowlog_max (KVD_ROWLOG_MAX_BYTES without). Only with o.receipts. */
enum { KVD_ROWLOG_RECEIVED = 1, KVD_ROWLOG_SENT = 2, KVD_ROWLOG_TOKEN = 3, KVD_ROWLOG_LOGITS = 4,
       KVD_ROWLOG_SAMPLING = 5 };
#define KVD_ROWLOG_KEEP_S 3600
#define KVD_ROWLOG_MAX_BYTES (1ull << 30)   /* the cap without o.rowlog_max */
#define KVD_ROWLOG_YOUNG_S 900              /* a session this recent may still be audited */
/* The session's log, opened for appending: a descriptor, or -1 (logged) when it cannot be. */
int kvd_rowlog_open(struct stage *st, uint64_t session);
/* Append a record (nothing for fd -1). */
void kvd_rowlog_put(int fd, int kind, uint32_t pos, const void *row, size_t len);
/* Close the session's log and, at most once a minute, drop what is past the retention. */
void kvd_rowlog_close(struct stage *st, int fd);

/* conn.c */
/* Whether the successor's (out) and the predecessor's (in) link are established. */
bool kvd_conn_out_up(struct stage *st);
bool kvd_conn_in_up(struct stage *st);
int kvd_conn_send(struct conn *c, uint8_t type, uint8_t flags, uint64_t session, uint32_t pos,
                  uint32_t n_tokens, const void *payload, size_t len);
void kvd_conn_send_error(struct conn *c, uint64_t session, uint32_t code, const char *msg);
void kvd_conn_close(struct conn *c, const char *reason);
/* Close the link for a protocol violation: log, tell the peer, close. */
void kvd_conn_violation(struct conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Close the link for a violation and leave the calling handler. */
#define VIOLATION(c, ...) do { kvd_conn_violation(c, __VA_ARGS__); return; } while (0)
void kvd_conn_ping(struct conn *c);
/* A PONG's payload came on c: on the out link, an answer to its last ping gives the round trip
 * (the link's deadline and the next successor's handshake deadline follow from it). */
void kvd_conn_pong(struct conn *c, const uint8_t payload[8]);
/* How long c may stay silent before it is dead: --link-timeout-ms, or derived from its RTT. */
uint32_t kvd_conn_deadline_ms(const struct conn *c);
/* How long the handshake of a successor dialled may take before the next candidate's turn. */
uint32_t kvd_conn_hs_deadline_ms(const struct stage *st);
/* Record the state of the link rank r -> r + 1 as seen here or reported by rank by: down with
 * reason (NULL: keep the last one), or up (reason ignored). */
void kvd_conn_note(struct stage *st, uint32_t r, bool down, uint32_t by, const char *reason);
/* Tell rank 0 (back over the in link) the state of this stage's out link (a link report). */
void kvd_conn_report_out(struct stage *st);
/* "ring not linked: link rank R -> rank S is down: <its last reason>" for a client of rank 0:
 * the first link down in ring order and the last reason any stage gave for it, then rank 0's
 * own links. */
void kvd_conn_ring_why(struct stage *st, char *msg, size_t n);
/* "ring not linked: link rank R -> rank S is down[: reason]" about this stage's out link. */
void kvd_conn_out_down_why(struct stage *st, char *msg, size_t n);

/* session.c */
struct cJSON;
struct sess *kvd_sess_find(struct stage *st, uint64_t id);
/* Whether session id ended here lately (frames still coming for it are dropped, not refused);
 * forget it among those (it opens again: a replay). */
bool kvd_sess_recently_closed(struct stage *st, uint64_t id);
void kvd_sess_closed_forget(struct stage *st, uint64_t id);
struct sess *kvd_sess_new(struct stage *st, uint64_t id, uint32_t n_ctx);
void kvd_sess_drop(struct stage *st, struct sess *s);
void kvd_sess_finish(struct stage *st, struct sess *s, const char *reason, const char *error);
void kvd_sess_fail(struct stage *st, struct sess *s, const char *msg);
/* The same with the ERROR code to send on (RING_ERR_SESSION, RING_ERR_RING). */
void kvd_sess_fail_code(struct stage *st, struct sess *s, uint32_t code, const char *msg);
/* Any rank: a ring link is down under every session here: rank 0 pauses them (or ends them
 * when it does not wait for repairs), the others pass an ERROR code RING_ERR_RING on and drop them, or,
 * when the link that broke is the out link (out), hold those with a whole boundary log. */
void kvd_sess_fail_all(struct stage *st, const char *msg, bool out);
/* Ranks > 0: the way downstream broke under s: hold it (KV and log kept for the replay) when
 * its log is whole, else drop it; pass an ERROR code RING_ERR_RING on towards rank 0 either way. */
void kvd_sess_hold(struct stage *st, struct sess *s, const char *msg);
/* Ranks > 0: OPEN flagged REPLAY (h, payload) for s, which this stage still has: pass the OPEN
 * on, resend s's log and skip what its KV holds (true), or false when it cannot (the last rank,
 * its log dropped): the caller drops it and recomputes it like a new session. */
bool kvd_sess_resume(struct stage *st, struct sess *s, const struct ring_frame_hdr *h,
                     const uint8_t *payload);
/* Rank 0: an ERROR came for s: code RING_ERR_RING pauses it for a repair, others end it. */
void kvd_sess_on_error(struct stage *st, struct sess *s, uint32_t code, const char *msg);
/* Rank 0: the ring broke under s: pause it (free its KV here, CLOSE it round the ring, note to
 * the client) until kvd_sess_repair_tick replays it, or end it when repairs are not awaited. */
void kvd_sess_pause(struct stage *st, struct sess *s, const char *why);
/* Rank 0: open s round the ring (OPEN with its history as the prompt) and send its history as
 * ACT chunks, the last one flagged LAST: a new session, or a paused one replayed. */
void kvd_sess_launch(struct stage *st, struct sess *s);
/* Rank 0: the periodic repair check: end sessions paused too long, replay the others once both
 * of rank 0's links are up. */
void kvd_sess_repair_tick(struct stage *st);
/* Queue session id's OPEN job (sampling params p; toks: its prompt, owned by the job from here
 * on, NULL where this rank needs none): 0, or -ENOMEM with toks freed. */
int kvd_sess_submit_open(struct stage *st, uint64_t id, const struct ring_open_params *p,
                         uint8_t flags, int32_t *toks, uint32_t n_toks);
void kvd_sess_submit_step(struct stage *st, struct sess *s, const int32_t *tokens, uint32_t n,
                          uint32_t pos, uint8_t flags);
/* The session's next incarnation number (sessions and the jobs submitted for them carry it). */
uint32_t kvd_sess_epoch_next(struct stage *st);
/* Rank 0: what a new generation session is opened with. */
struct kvd_sess_gen {
    int32_t *toks;                  /* the prompt, 1 <= n_toks < n_ctx: owned from the call on */
    uint32_t n_toks;
    struct ring_open_params p;       /* sampling; max_tokens and n_ctx are filled in */
    uint32_t max_gen;
    bool ignore_eos, want_logits;
    const char *const *stops;       /* at most MODEL_GEN_MAX_STOPS */
    uint32_t n_stops;
    struct client *client;          /* who hears of it: a control-socket client, */
    const struct kvd_sess_sink *sink;   /* or an API request */
    void *sink_ud;
    const char *client_key;         /* the paying client's key (RING_CLIENT_KEY_PREFIX...) that
                                     * opened it, or NULL; borrowed for the call */
};
/* Rank 0: a session's drafting, its OPEN's draft_max (the drafts its passes verify) and
 * draft_kind, into p, from a request's "draft" (-1: not said, else an enum model_draft) and
 * "draft_max" (0: not said; 1..14): what the request says wins, the stage's
 * --draft/--draft-max fill in the rest, and a request's draft_max alone asks for drafts (of
 * the stage's kind, prompt lookup when it has none). */
#define KVD_DRAFT_MAX_DEFAULT 8u
void kvd_sess_draft_set(const struct stage *st, int draft, uint32_t draft_max,
                        struct ring_open_params *p);
/* The "draft" and "draft_max" fields of a JSON request (control socket, API) into *draft and
 * *draft_max as kvd_sess_draft_set takes them: 0, or -EINVAL with msg naming the field. */
int kvd_sess_draft_parse(const void *json_obj, int *draft, uint32_t *draft_max, char *msg, size_t n);
/* Rank 0: open a generation round the ring (the session, its model_gen, OPEN and the
 * prompt's chunks, kvd_sess_launch), its client or sink attached: 0 and *out (NULL when it
 * has already ended, max_gen 0 or out of memory on the way, and its client or sink been
 * told), or -ENOTCONN (ring not linked), -EBUSY (the manifest's max_sessions), -ENOMEM, with
 * msg saying why and nobody told. */
int kvd_sess_start(struct stage *st, struct kvd_sess_gen *g, struct sess **out, char *msg,
                   size_t n);
/* Positions the session's history holds at rank 0 (prompt + generated), 0 elsewhere. */
uint32_t kvd_sess_n_hist(const struct sess *s);
void kvd_sess_on_token(struct stage *st, struct sess *s, const struct ring_frame_hdr *h,
                       const uint8_t *payload);
void kvd_sess_on_job_done(struct kvd_job *j, void *ud);
/* Rank 0's control-socket clients (control.c accepts them): add c, accepted, to its stage's
 * list, which kvd_client_close takes it off (ending its session round the ring). */
void kvd_client_add(struct client *c);
void kvd_client_close(struct client *c);

/* client.c: a line to client c (a newline added; nothing once it is closing), a JSON object
 * as one line (o freed), an {"error": msg} line; the close callback of its pipe (frees c). */
void kvd_client_send(struct client *c, const char *line);
void kvd_client_send_json(struct client *c, struct cJSON *o);
void kvd_client_error(struct client *c, const char *msg);
void kvd_client_on_closed(uv_handle_t *h);

/* status.c */
struct cJSON;
/* This stage's status record (docs/kvctl.md, "status"): rank, node, host, endpoint, window,
 * backend, links with their last error, ms/token, sessions, memory, uptime; the caller frees. */
struct cJSON *kvd_status_record(struct stage *st);
/* Each tick: this stage's record on both links; rank 0 also notes a repaired ring. */
void kvd_status_tick(struct stage *st);
/* A STATUS frame from c: 0, or -EPROTO with why (the caller closes the link for it). */
int kvd_status_on_frame(struct conn *c, const struct ring_frame_hdr *h, const uint8_t *payload,
                        char *why, size_t n);
/* Every rank's entry: this stage's own record, else the last one heard, with "age_ms" and
 * "answer" (false past STATUS_ANSWER_MS or when none came); the caller frees. */
struct cJSON *kvd_status_ring(struct stage *st);
/* A ring link closed: on rank 0, the ring counts as broken until it links again (a repair). */
void kvd_status_link_closed(struct stage *st);

/* frames.c: a frame on an established link. */
void kvd_frame_handle(struct conn *c, const struct ring_frame_hdr *h, const uint8_t *payload);

/* link.c */
extern const struct ring_link_cbs kvd_link_cbs;
void kvd_link_dial_out(struct stage *st);
void kvd_link_dial_in(struct stage *st);
void kvd_link_on_accept(struct ring_listener *ls, struct ring_link *l, void *ud);

/* control.c: the control socket's connection callback; a PROBE job run, to the client that
 * asked for it (j freed). */
void kvd_ctl_on_conn(uv_stream_t *server, int status);
void kvd_ctl_probe_done(struct stage *st, struct kvd_job *j);

/* api.c: rank 0's OpenAI-compatible API (--api): start it (0 when not asked for; an error is
 * logged) and stop it (its requests' sessions have ended or end now). */
/* The --api options, checked before the model loads (an address other than loopback needs
 * keys or --api-open; TLS needs both files): 0, or negative with the reason logged. */
int kvd_api_check(const struct kvd_stage_opts *o);
int kvd_api_start(struct stage *st);
void kvd_api_stop(struct stage *st);

#endif

/* kvctl/ring_up.c — `kvctl ring up`: the options, the model and its windows, DIR with the
 * catalog and manifest, one kvd per stage started on sockets bound here, and the wait until the
 * ring links. One function per step over `struct up`. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <openssl/rand.h>

#include "api/api.h"
#include "gguf/gguf.h"
#include "kvctl/internal.h"
#include "net/net.h"
#include "planner/plan.h"
#include "ring/ring.h"
#include "util/err.h"

#define MAX_STAGES RING_MAX_RANKS

/* Paths here are built from a directory path plus a short suffix; one longer than PATH_MAX is
 * cut, and then simply not found. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif

/* Windows for n identical local stages from the planner (planner/plan.h plan_even): the
 * model's shape from its tensor list, the main pass's layers (the MTP blocks, if any, count
 * as the last rank's work beside the head). */
static int plan_split(const struct gguf_file *g, const char *arch, uint32_t n, uint32_t *first,
                      uint32_t *last)
{
    struct plan_model pm;
    struct plan_tensor *t = NULL;
    struct plan_layer *layers = NULL;
    int rc = kvctl__gguf_plan_model(g, arch, &pm, &t);
    if (rc == 0 && !(layers = calloc(pm.n_blocks ? pm.n_blocks : 1, sizeof *layers)))
        rc = -ENOMEM;
    if (rc == 0) {
        struct plan_shape shape;
        char err[KV_ERR_MAX];
        rc = plan_shape_of_model(&pm, &shape, layers, err, sizeof err);
        if (rc == 0)
            rc = plan_even(&shape, n, first, last);
        if (rc < 0)
            fprintf(stderr, "kvctl ring up: planner: %s; splitting by layer bytes\n",
                    rc == -EINVAL ? err : strerror(-rc));
    }
    free(t);
    free(layers);
    return rc;
}

static void ring_up_usage(FILE *f)
{
    fprintf(f,
        "usage: kvctl ring up --model FILE --stages N [options]\n"
        "  --dtype f32|f16     boundary dtype on the wire (default f32: exact)\n"
        "  --base-port P       rank r listens on 127.0.0.1:P+r (default: free ports)\n"
        "  --dir DIR           manifest, state dirs and logs (default ./ring-state)\n"
        "  -t N                compute threads per stage (default 1)\n"
        "  --ctx N             context length (default: the model's, at most 4096)\n"
        "  --max-batch N       rows per ACT frame (prefill chunk, default 512)\n"
        "  --batch-wait-us N   each stage's compute waits up to N us for other sessions' steps\n"
        "                      to batch with (kvd stage --batch-wait-us; default 0)\n"
        "  --stub --layers L --embd E   tests: stand-in compute, no model file (needs the test\n"
        "                      build of kvd: KVD_BIN=build/tests/kvd-stub)\n"
        "  --window-from URL   stages pull their windows from a seeder or a GGUF URL\n"
        "                      (kvd stage --window-from) instead of mapping --model\n"
        "  --catalog FILE      the model's catalog (default: built into DIR/catalog.json);\n"
        "                      its id goes into the manifest, every stage verifies its window\n"
        "  --split A:B,B:C,... explicit windows, one per stage, contiguous from 0 to the\n"
        "                      model's layers (--stages may be left out)\n"
        "  --standby N         also start N standby nodes (DIR/standby-I) that may take over\n"
        "                      any rank but 0 when it dies (manifest standby entries)\n"
        "  --repair-wait S     rank 0 pauses sessions up to S s for a repair (kvd stage\n"
        "                      --repair-wait; default 30 with standbys, else 0: they end)\n"
        "  --link-timeout-ms N a link silent for N ms is dead (kvd stage --link-timeout-ms;\n"
        "                      default 3000 + 4 x the link's RTT)\n"
        "  --boundary-log-mb N each stage keeps up to N MiB (fractions allowed) of the\n"
        "                      boundaries it sent per session, for repairs (default 4; 0: none)\n"
        "  --backends B,B,...  each rank's kernel device (cpu, opencl) in the manifest's\n"
        "                      \"backend\" (default cpu for every rank)\n"
        "  --api HOST:PORT     rank 0 serves the OpenAI-compatible API there (docs/api.md; port\n"
        "                      0: a free one, printed),\n"
        "  --api-key-file F, --api-max-sessions N, --chat-template NAME, --api-open,\n"
        "  --api-tls-cert PEM, --api-tls-key PEM, --api-keepalive S  with these (kvd stage;\n"
        "                      an address other than loopback needs keys or --api-open)\n"
        "  --draft lookup|none, --draft-max K  rank 0's drafting for requests that do not say\n"
        "                      (kvd stage --draft; default none)\n"
        "Writes DIR/ring.json (the planner's even split by work unless --split), starts one kvd per\n"
        "stage on loopback, waits until the ring is linked and prints it.\n");
}

/* What `kvctl ring up` was asked for: its options, parsed (up_parse) and checked (up_check). */
struct up_opts {
    const char *model, *dtype, *dir;
    long stages, base_port, threads, ctx, max_batch;
    long batch_wait;                    /* -1: kvd stage's default */
    bool stub;
    long s_layers, s_embd;              /* --stub's stand-in shape */
    const char *window_from, *catalog, *backends;
    const char *split;                  /* --split as given (for messages) */
    uint32_t split_b[MAX_STAGES + 1];   /* its window bounds, split_n + 1 of them */
    long split_n;
    long n_standby, link_timeout;
    long repair_wait;                   /* -1: kvd stage's default */
    const char *blog_mb;                /* passed on as it is (kvd stage checks it) */
    /* rank 0's API and drafting options, passed on as they are (kvd stage checks them) */
    const char *api, *api_keys, *api_max, *chat_template, *api_cert, *api_tls_key, *api_keepalive;
    const char *draft, *draft_max;
    bool api_open;
    const char *extra;                  /* the first argument that is not an option */
    bool help;                          /* the usage went to stdout: nothing more to do */
};

/* A ring on its way up: what each step of ring_up works out for the steps after it. Nodes are
 * numbered ranks first, then the standbys (node stages + i is standby i). */
struct up {
    struct up_opts o;
    const char *api;                    /* --api as rank 0 gets it (a port 0 bound: api_bound) */
    int api_fd;                         /* rank 0's API socket when kvctl binds it (--api HOST:0) */
    char api_bound[160];
    /* the model */
    char arch[32], name[128];
    uint32_t n_layers, n_embd, n_ctx_train;
    uint64_t *lbytes;                   /* bytes per layer (NULL: every layer counts 1) */
    char model_abs[PATH_MAX];
    struct gguf_catalog *cat;           /* built here, saved into DIR (NULL: --catalog, --stub) */
    char cat_id[65], cat_path[PATH_MAX];
    /* the windows: rank r holds layers [bounds[r], bounds[r + 1]) */
    bool planned;                       /* the planner's split (plan_first, plan_last) */
    uint32_t plan_first[MAX_STAGES], plan_last[MAX_STAGES];
    uint32_t bounds[MAX_STAGES + 1];
    /* the ring on disk and its processes */
    char dir_abs[PATH_MAX], mpath[PATH_MAX], kvd[PATH_MAX];
    struct ring_manifest man;           /* the manifest written to mpath */
    struct ring_manifest loaded;        /* the same as the stages read it back */
    uint32_t n_procs;
    int lfd[MAX_STAGES + RING_MAX_STANDBYS];   /* each node's listening socket until it starts */
    pid_t pids[MAX_STAGES + RING_MAX_STANDBYS];
    double t0;                          /* when the wait for the links began */
};

static const struct option up_longopts[] = {
    {"model", required_argument, 0, 'm'}, {"stages", required_argument, 0, 's'},
    {"dtype", required_argument, 0, 'd'}, {"base-port", required_argument, 0, 'p'},
    {"dir", required_argument, 0, 'D'}, {"ctx", required_argument, 0, 'c'},
    {"max-batch", required_argument, 0, 'b'}, {"stub", no_argument, 0, 'S'},
    {"layers", required_argument, 0, 'L'}, {"embd", required_argument, 0, 'E'},
    {"window-from", required_argument, 0, 'W'}, {"catalog", required_argument, 0, 'C'},
    {"split", required_argument, 0, 'P'}, {"batch-wait-us", required_argument, 0, 'w'},
    {"standby", required_argument, 0, 'Y'}, {"repair-wait", required_argument, 0, 'R'},
    {"link-timeout-ms", required_argument, 0, 'T'}, {"backends", required_argument, 0, 'K'},
    {"api", required_argument, 0, 'A'}, {"api-key-file", required_argument, 0, 'k'},
    {"api-max-sessions", required_argument, 0, 'X'},
    {"api-open", no_argument, 0, 'O'}, {"api-tls-cert", required_argument, 0, 'Z'},
    {"api-tls-key", required_argument, 0, 'z'}, {"api-keepalive", required_argument, 0, 'V'},
    {"chat-template", required_argument, 0, 'J'},
    {"boundary-log-mb", required_argument, 0, 'G'},
    {"draft", required_argument, 0, 'F'}, {"draft-max", required_argument, 0, 'f'},
    {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};

/* --split "A:B,B:C,...": windows in ring order, non-empty, contiguous from 0, into o->split_b;
 * --stages becomes their count. 0, or 2 (said). */
static int up_parse_split(struct up_opts *o)
{
    const char *p = o->split;
    for (;;) {
        char *end;
        unsigned long a = strtoul(p, &end, 10);
        if (end == p || *end != ':' || o->split_n >= MAX_STAGES) {
            fprintf(stderr, "kvctl ring up: --split '%s': expected A:B,B:C,... (at most %d "
                    "windows)\n", o->split, MAX_STAGES);
            return 2;
        }
        p = end + 1;
        unsigned long b = strtoul(p, &end, 10);
        if (end == p || b <= a || b > 100000 ||
            (o->split_n == 0 ? a != 0 : a != o->split_b[o->split_n])) {
            fprintf(stderr, "kvctl ring up: --split '%s': windows must be non-empty, "
                    "contiguous and start at 0\n", o->split);
            return 2;
        }
        o->split_b[o->split_n] = (uint32_t)a;
        o->split_b[++o->split_n] = (uint32_t)b;
        if (*end == 0)
            break;
        if (*end != ',') {
            fprintf(stderr, "kvctl ring up: --split '%s': expected ',' after a window\n", o->split);
            return 2;
        }
        p = end + 1;
    }
    if (o->stages && o->stages != o->split_n) {
        fprintf(stderr, "kvctl ring up: --stages %ld but --split gives %ld windows\n", o->stages,
                o->split_n);
        return 2;
    }
    o->stages = o->split_n;
    return 0;
}

/* The command line into o (its defaults already there); --help prints the usage and sets
 * o->help. 0, or 2 for a malformed option (said). */
static int up_parse(struct up_opts *o, int argc, char **argv)
{
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:t:h", up_longopts, NULL)) != -1) {
        int rc = 0;
        switch (c) {
        case 'm': o->model = optarg; break;
        case 's': rc = kvctl_parse_long("--stages", optarg, 1, MAX_STAGES, &o->stages); break;
        case 'd': o->dtype = optarg; break;
        case 'p': rc = kvctl_parse_long("--base-port", optarg, 0, 65535 - MAX_STAGES, &o->base_port); break;
        case 'D': o->dir = optarg; break;
        case 't': rc = kvctl_parse_long("-t", optarg, 0, 1024, &o->threads); break;
        case 'c': rc = kvctl_parse_long("--ctx", optarg, 8, 1 << 20, &o->ctx); break;
        case 'b': rc = kvctl_parse_long("--max-batch", optarg, 1, 4096, &o->max_batch); break;
        case 'S': o->stub = true; break;
        case 'w': rc = kvctl_parse_long("--batch-wait-us", optarg, 0, 1000000, &o->batch_wait); break;
        case 'A': o->api = optarg; break;
        case 'k': o->api_keys = optarg; break;
        case 'X': o->api_max = optarg; break;
        case 'O': o->api_open = true; break;
        case 'Z': o->api_cert = optarg; break;
        case 'z': o->api_tls_key = optarg; break;
        case 'V': o->api_keepalive = optarg; break;
        case 'J': o->chat_template = optarg; break;
        case 'G': o->blog_mb = optarg; break;
        case 'F': o->draft = optarg; break;
        case 'f': o->draft_max = optarg; break;
        case 'W': o->window_from = optarg; break;
        case 'Y': rc = kvctl_parse_long("--standby", optarg, 0, RING_MAX_STANDBYS, &o->n_standby); break;
        case 'R': rc = kvctl_parse_long("--repair-wait", optarg, 0, 86400, &o->repair_wait); break;
        case 'T': rc = kvctl_parse_long("--link-timeout-ms", optarg, 100, 3600000, &o->link_timeout); break;
        case 'C': o->catalog = optarg; break;
        case 'P': o->split = optarg; break;
        case 'K': o->backends = optarg; break;
        case 'L': rc = kvctl_parse_long("--layers", optarg, 1, 100000, &o->s_layers); break;
        case 'E': rc = kvctl_parse_long("--embd", optarg, 1, 1 << 16, &o->s_embd); break;
        case 'h': ring_up_usage(stdout); o->help = true; return 0;
        default: ring_up_usage(stderr); return 2;
        }
        if (rc < 0)
            return 2;
    }
    o->extra = optind != argc ? argv[optind] : NULL;
    return o->split ? up_parse_split(o) : 0;
}

/* What the options must say together: a model (or --stub's shape), a stage count, a wire dtype,
 * and an API rank 0 will accept (it would refuse only after the ring started: say so now).
 * 0, or 2 (said). */
static int up_check(struct up *u)
{
    const struct up_opts *o = &u->o;
    const char *missing = o->extra ? "no arguments besides the options"
                        : !o->model && !o->stub ? "--model FILE"
                        : !o->stages ? "--stages N (or --split A:B,B:C,...)"
                        : o->stub && (!o->s_layers || !o->s_embd) ? "--layers L and --embd E with --stub"
                        : NULL;
    if (missing) {
        ring_up_usage(stderr);
        if (o->extra)
            fprintf(stderr, "kvctl ring up: unexpected argument '%s'\n", o->extra);
        else
            fprintf(stderr, "kvctl ring up: %s is required\n", missing);
        return 2;
    }
    if (strcmp(o->dtype, "f32") && strcmp(o->dtype, "f16")) {
        fprintf(stderr, "kvctl ring up: --dtype must be f32 or f16\n");
        return 2;
    }
    if (o->api) {
        struct api_config ac = {.listen = o->api, .key_file = o->api_keys, .open = o->api_open,
                                .tls_cert = o->api_cert, .tls_key = o->api_tls_key};
        char err[KV_ERR_MAX];
        if (api_config_check(&ac, err, sizeof err) < 0) {
            fprintf(stderr, "kvctl ring up: %s\n", err);
            return 2;
        }
    }
    return 0;
}

/* --api HOST:0: a free port, bound here and handed to rank 0 (and printed once the ring is up),
 * so that the address printed is the one it serves. 0, or 1 (said). */
static int up_bind_api(struct up *u)
{
    const char *api = u->o.api;
    const char *colon = api ? strrchr(api, ':') : NULL;
    if (!colon || strcmp(colon, ":0") != 0)
        return 0;
    int port = 0;
    u->api_fd = net_listen_fd(api, &port);
    if (u->api_fd < 0) {
        fprintf(stderr, "kvctl ring up: --api %s: %s\n", api, strerror(-u->api_fd));
        return 1;
    }
    snprintf(u->api_bound, sizeof u->api_bound, "%.*s:%d", (int)(colon - api), api, port);
    u->api = u->api_bound;
    return 0;
}

/* The model's shape from its GGUF header: architecture, the layers of the main pass, width,
 * trained context and name. 0, or 1 (said). */
static int up_model_shape(struct up *u, const struct gguf_file *g)
{
    const char *model = u->o.model;
    char key[96];
    int rc = gguf_get_str(g, "general.architecture", u->arch, sizeof u->arch);
    /* Multi-token-prediction blocks (qwen35moe and others) are not part of the main pass:
     * the ring's layers are block_count - nextn_predict_layers (as model_open counts). */
    if (rc == 0)
        rc = gguf_main_layers(g, &u->n_layers);
    snprintf(key, sizeof key, "%s.embedding_length", u->arch);
    if (rc == 0)
        rc = gguf_get_u32(g, key, &u->n_embd);
    snprintf(key, sizeof key, "%s.context_length", u->arch);
    if (gguf_get_u32(g, key, &u->n_ctx_train) < 0)
        u->n_ctx_train = 4096;
    if (gguf_get_str(g, "general.name", u->name, sizeof u->name) < 0) {
        char tmp[PATH_MAX];
        snprintf(tmp, sizeof tmp, "%s", model);
        snprintf(u->name, sizeof u->name, "%s", basename(tmp));
    }
    if (rc < 0 || u->n_layers == 0) {
        fprintf(stderr, "kvctl ring up: %s: no architecture / block_count / embedding_length\n", model);
        return 1;
    }
    return 0;
}

/* Bytes of each of the first n_layers blocks (the tensors named blk.N.*), zeroed and malloc'd
 * (the caller frees); NULL when out of memory. */
static uint64_t *layer_bytes(const struct gguf_file *g, uint32_t n_layers)
{
    uint64_t *lbytes = calloc(n_layers, sizeof *lbytes);
    for (uint64_t i = 0; lbytes && i < gguf_tensor_count(g); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(g, i);
        int l = gguf_tensor_layer(t->name);
        if (l >= 0 && (uint32_t)l < n_layers)
            lbytes[l] += t->size;
    }
    return lbytes;
}

/* The model's identity: its catalog (per-tensor SHA-256), which every stage checks its window
 * against. --catalog's is used as it is (its id names the model in the manifest); else one is
 * built from g, to be saved into DIR. 0, or 1 (said). */
static int up_catalog(struct up *u, const struct gguf_file *g)
{
    char err[KV_ERR_MAX] = "";
    struct gguf_catalog *cat;
    if (u->o.catalog) {
        if (gguf_catalog_load(&cat, u->o.catalog, u->cat_id, err, sizeof err) < 0) {
            fprintf(stderr, "kvctl ring up: catalog %s: %s\n", u->o.catalog, err);
            return 1;
        }
        gguf_catalog_free(cat);
        if (!realpath(u->o.catalog, u->cat_path)) {
            fprintf(stderr, "kvctl ring up: catalog %s: %s\n", u->o.catalog, err);
            return 1;
        }
        return 0;
    }
    if (gguf_catalog_build(&cat, g, err, sizeof err) < 0) {
        fprintf(stderr, "kvctl ring up: catalog of %s: %s\n", u->o.model, err);
        return 1;
    }
    u->cat = cat;
    return 0;
}

/* The model: its shape, the planner's split when it has one, bytes per layer, identity and
 * absolute path (--stub: the stand-in shape and nothing else). The planner reads the tensor
 * list, so it runs here while the file is open. 0, or 1 (said). */
static int up_model(struct up *u)
{
    const struct up_opts *o = &u->o;
    snprintf(u->arch, sizeof u->arch, "stub");
    snprintf(u->name, sizeof u->name, "stub");
    u->n_layers = (uint32_t)o->s_layers;
    u->n_embd = (uint32_t)o->s_embd;
    u->n_ctx_train = 4096;
    if (o->stub)
        return 0;
    char err[KV_ERR_MAX];
    struct gguf_file *g;
    if (gguf_file_open(&g, o->model, err, sizeof err) < 0) {
        fprintf(stderr, "kvctl ring up: %s\n", err);   /* err names the file */
        return 1;
    }
    int rc = up_model_shape(u, g);
    if (rc == 0) {
        /* The planner's even split for identical local processes (balanced by the work per
         * token, embedding and head included); the byte split is the fallback. */
        if (!o->split && (uint32_t)o->stages <= u->n_layers)
            u->planned = plan_split(g, u->arch, (uint32_t)o->stages, u->plan_first, u->plan_last) == 0;
        u->lbytes = layer_bytes(g, u->n_layers);
        rc = up_catalog(u, g);
    }
    gguf_file_free(g);
    if (rc == 0 && !realpath(o->model, u->model_abs)) {
        fprintf(stderr, "kvctl ring up: %s: %s\n", o->model, strerror(errno));
        rc = 1;
    }
    return rc;
}

/* An even split by layer bytes (lbytes NULL: by layers) into bounds[0..n]: stage k ends where
 * the running total first reaches (k+1)/n of the whole, leaving at least one layer for every
 * later stage. n_layers >= n >= 1. */
static void split_by_bytes(const uint64_t *lbytes, uint32_t n_layers, uint32_t n, uint32_t *bounds)
{
    uint64_t total = 0;
    for (uint32_t l = 0; l < n_layers; l++)
        total += lbytes ? lbytes[l] : 1;
    bounds[0] = 0;
    uint64_t acc = 0;
    uint32_t l = 0;
    for (uint32_t k = 0; k < n; k++) {
        if (k == n - 1) {
            bounds[k + 1] = n_layers;
            break;
        }
        double target = (double)total * (k + 1) / (double)n;
        do {
            acc += lbytes ? lbytes[l] : 1;
            l++;
        } while (l < n_layers - (n - 1 - k) && (double)acc + 0.5 * (lbytes ? lbytes[l] : 1) < target);
        bounds[k + 1] = l;
    }
}

/* Each rank's window: --split's, else the planner's, else the byte split. 0, or 1 (said). */
static int up_windows(struct up *u)
{
    const struct up_opts *o = &u->o;
    uint32_t n = (uint32_t)o->stages;
    if (n > u->n_layers) {
        fprintf(stderr, "kvctl ring up: %ld stages but the model has only %u layers\n", o->stages,
                u->n_layers);
        return 1;
    }
    if (o->split) {
        if (o->split_b[o->split_n] != u->n_layers) {
            fprintf(stderr, "kvctl ring up: --split ends at layer %u but the model has %u layers\n",
                    o->split_b[o->split_n], u->n_layers);
            return 1;
        }
        memcpy(u->bounds, o->split_b, ((size_t)o->split_n + 1) * sizeof *u->bounds);
    } else if (u->planned) {
        for (uint32_t k = 0; k < n; k++)
            u->bounds[k] = u->plan_first[k];
        u->bounds[n] = u->plan_last[n - 1];
    } else
        split_by_bytes(u->lbytes, u->n_layers, n, u->bounds);
    return 0;
}

/* DIR made and resolved (dir_abs), unless a ring still runs there. 0, or 1 (said). */
static int up_dir(struct up *u)
{
    const char *dir = u->o.dir;
    if (kvctl__mkdir_p(dir) < 0 || !realpath(dir, u->dir_abs)) {
        fprintf(stderr, "kvctl ring up: %s: %s\n", dir, strerror(errno));
        return 1;
    }
    for (uint32_t r = 0; r < MAX_STAGES; r++) {
        char pidf[PATH_MAX];
        snprintf(pidf, sizeof pidf, "%s/rank-%u/kvd.pid", u->dir_abs, r);
        FILE *f = fopen(pidf, "r");
        if (!f)
            break;
        int pid = 0;
        struct stat pst;
        char why[PATH_MAX * 2 + 64];
        bool running = fscanf(f, "%d", &pid) == 1 && pid > 0 && kvctl__pid_alive(pid) &&
                       fstat(fileno(f), &pst) == 0 &&
                       kvctl__ring_kvd_is(pid, u->dir_abs, r, pst.st_mtime, why, sizeof why);
        fclose(f);
        if (running) {
            fprintf(stderr, "kvctl ring up: a ring is already running in %s (rank %u, pid %d): "
                    "kvctl ring down --dir %s\n", dir, r, pid, dir);
            return 1;
        }
    }
    return 0;
}

/* The catalog built from the model, saved as DIR/catalog.json (its id for the manifest). 0, or
 * 1 (said). */
static int up_save_catalog(struct up *u)
{
    if (!u->cat)
        return 0;
    char err[KV_ERR_MAX];
    snprintf(u->cat_path, sizeof u->cat_path, "%s/catalog.json", u->dir_abs);
    int rc = gguf_catalog_save(u->cat, u->cat_path, u->cat_id, err, sizeof err);
    gguf_catalog_free(u->cat);
    u->cat = NULL;
    if (rc < 0) {
        fprintf(stderr, "kvctl ring up: %s\n", err);
        return 1;
    }
    return 0;
}

/* Node k's state dir: DIR/rank-k for a rank, DIR/standby-i for standby i. */
static void up_node_dir(const struct up *u, uint32_t k, char *out, size_t n)
{
    bool sb = k >= (uint32_t)u->o.stages;
    snprintf(out, n, "%s/%s-%u", u->dir_abs, sb ? "standby" : "rank", sb ? k - (uint32_t)u->o.stages : k);
}

/* The Ed25519 public key of the node whose state dir is sd (made there on first use). */
static int node_key(const char *sd, uint8_t key[32], char *err, size_t errlen)
{
    struct net_identity *id;
    int rc = net_identity_load(&id, sd, err, errlen);
    if (rc < 0)
        return rc;
    memcpy(key, net_identity_pub(id), 32);
    net_identity_free(id);
    return 0;
}

/* Node k's listening socket on loopback (--base-port + k, else a free port) into u->lfd[k], its
 * endpoint into ep; what and i name the node in a message. 0, or 1 (said). */
static int up_listen(struct up *u, uint32_t k, const char *what, uint32_t i, char *ep, size_t n)
{
    long base = u->o.base_port;
    int port = 0;
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%ld", base ? base + (long)k : 0L);
    int fd = net_listen_fd(addr, &port);
    if (fd < 0) {
        fprintf(stderr, "kvctl ring up: %s %u: listening on 127.0.0.1:%ld: %s\n", what, i,
                base ? base + (long)k : 0L, strerror(-fd));
        return 1;
    }
    u->lfd[k] = fd;
    snprintf(ep, n, "tcp://127.0.0.1:%d", port);
    return 0;
}

/* Entry r of a comma-separated --backends list into out; a missing or empty one is cpu. */
static void backend_at(const char *list, uint32_t r, char *out, size_t n)
{
    const char *bp = list;
    for (uint32_t i = 0; bp && i < r; i++)
        bp = (bp = strchr(bp, ',')) ? bp + 1 : NULL;
    snprintf(out, n, "cpu");
    if (bp && *bp && *bp != ',')
        snprintf(out, n, "%.*s", (int)strcspn(bp, ","), bp);
}

/* Rank r's manifest entry: its node key, window, backend and endpoint (its socket bound). 0, or
 * 1 (said). */
static int up_rank(struct up *u, uint32_t r)
{
    struct ring_rank_info *ri = &u->man.ranks[r];
    char sd[PATH_MAX], err[300];
    up_node_dir(u, r, sd, sizeof sd);
    if (node_key(sd, ri->node, err, sizeof err) < 0) {
        fprintf(stderr, "kvctl ring up: %s\n", err);
        return 1;
    }
    ri->has_node = true;
    ri->rank = r;
    ri->first = u->bounds[r];
    ri->last = u->bounds[r + 1];
    ri->embed = r == 0;
    ri->head = r == (uint32_t)u->o.stages - 1;
    backend_at(u->o.backends, r, ri->backend, sizeof ri->backend);
    return up_listen(u, r, "rank", r, ri->endpoint, sizeof ri->endpoint);
}

/* Standby i's manifest entry: a node that may take over any rank but 0 (its socket bound). 0,
 * or 1 (said). */
static int up_standby(struct up *u, uint32_t i)
{
    struct ring_standby_info *si = &u->man.standbys[i];
    uint32_t k = (uint32_t)u->o.stages + i;
    char sd[PATH_MAX], err[300];
    up_node_dir(u, k, sd, sizeof sd);
    int rc = kvctl__mkdir_p(sd);
    if (rc < 0)
        snprintf(err, sizeof err, "%s", strerror(-rc));
    if (rc < 0 || node_key(sd, si->node, err, sizeof err) < 0) {
        fprintf(stderr, "kvctl ring up: %s: %s\n", sd, err);
        return 1;
    }
    for (uint32_t r = 1; r < (uint32_t)u->o.stages; r++)
        si->ranks |= 1ull << r;
    return up_listen(u, k, "standby", i, si->endpoint, sizeof si->endpoint);
}

/* The manifest of a fresh ring: a random ring id, the model, the limits (--ctx, else the
 * model's context up to 4096; no batch longer than that), then every rank and standby. 0, or
 * 1 (said). */
static int up_manifest(struct up *u)
{
    const struct up_opts *o = &u->o;
    struct ring_manifest *m = &u->man;
    uint32_t n_ctx = o->ctx ? (uint32_t)o->ctx : u->n_ctx_train < 4096 ? u->n_ctx_train : 4096;
    uint32_t max_batch = (uint32_t)o->max_batch > n_ctx ? n_ctx : (uint32_t)o->max_batch;
    uint8_t rid[8];
    RAND_bytes(rid, sizeof rid);
    *m = (struct ring_manifest){.version = 1, .stated = RING_STATED_N_CTX | RING_STATED_MAX_BATCH,
                                .n_layers = u->n_layers, .n_embd = u->n_embd, .n_ctx = n_ctx,
                                .max_batch = max_batch, .n_ranks = (uint32_t)o->stages,
                                .n_standbys = (uint32_t)o->n_standby,
                                .n_own_standbys = (uint32_t)o->n_standby};
    util_hex_encode(rid, sizeof rid, m->ring);
    snprintf(m->model_name, sizeof m->model_name, "%s", u->name);
    snprintf(m->catalog, sizeof m->catalog, "%s", u->cat_id);
    snprintf(m->arch, sizeof m->arch, "%s", u->arch);
    snprintf(m->dtype, sizeof m->dtype, "%s", o->dtype);
    for (uint32_t r = 0; r < (uint32_t)o->stages; r++)
        if (up_rank(u, r) != 0)
            return 1;
    for (uint32_t i = 0; i < (uint32_t)o->n_standby; i++)
        if (up_standby(u, i) != 0)
            return 1;
    return 0;
}

/* The manifest as DIR/ring.json (mpath), with the local ring's bookkeeping that the stages
 * ignore: the model's path and whether the compute is the stand-in. 0, or 1 (said). */
static int up_write_manifest(struct up *u)
{
    cJSON *root;
    char err[KV_ERR_MAX];
    if (ring_manifest_to_json(&root, &u->man, err, sizeof err) < 0) {
        fprintf(stderr, "kvctl ring up: %s\n", err);
        return 1;
    }
    cJSON *jk = cJSON_AddObjectToObject(root, "local");
    cJSON_AddStringToObject(jk, "model_path", u->o.stub ? "" : u->model_abs);
    cJSON_AddBoolToObject(jk, "stub", u->o.stub);
    char *js = cJSON_Print(root);
    cJSON_Delete(root);
    snprintf(u->mpath, sizeof u->mpath, "%s/ring.json", u->dir_abs);
    FILE *f = fopen(u->mpath, "w");
    if (!f || fputs(js, f) < 0 || fputc('\n', f) < 0 || fclose(f) != 0) {
        fprintf(stderr, "kvctl ring up: writing %s: %s\n", u->mpath, strerror(errno));
        free(js);
        return 1;
    }
    free(js);
    return 0;
}

/* Text of the numbers on a node's command line. */
struct up_argtext {
    char index[16], threads[16], batch_wait[24], repair_wait[24], link_timeout[24];
};

/* Node k's `kvd stage` command line into args (room for 72, NULL-terminated); the strings live
 * in u, sd and t. */
static void up_stage_args(const struct up *u, uint32_t k, const char *sd, struct up_argtext *t,
                          const char **args)
{
    const struct up_opts *o = &u->o;
    bool sb = k >= (uint32_t)o->stages;
    snprintf(t->index, sizeof t->index, "%u", sb ? k - (uint32_t)o->stages : k);
    snprintf(t->threads, sizeof t->threads, "%ld", o->threads);
    snprintf(t->batch_wait, sizeof t->batch_wait, "%ld", o->batch_wait);
    snprintf(t->repair_wait, sizeof t->repair_wait, "%ld", o->repair_wait);
    snprintf(t->link_timeout, sizeof t->link_timeout, "%ld", o->link_timeout);
    int a = 0;
    args[a++] = u->kvd;
    args[a++] = "stage";
    args[a++] = "--manifest";
    args[a++] = u->mpath;
    args[a++] = sb ? "--standby" : "--rank";
    args[a++] = t->index;
    if (o->repair_wait >= 0) {
        args[a++] = "--repair-wait";
        args[a++] = t->repair_wait;
    }
    if (o->link_timeout) {
        args[a++] = "--link-timeout-ms";
        args[a++] = t->link_timeout;
    }
    if (o->blog_mb) {
        args[a++] = "--boundary-log-mb";
        args[a++] = o->blog_mb;
    }
    args[a++] = "--state-dir";
    args[a++] = sd;
    args[a++] = "-t";
    args[a++] = t->threads;
    if (o->batch_wait >= 0) {
        args[a++] = "--batch-wait-us";
        args[a++] = t->batch_wait;
    }
    if (k == 0) {
        const char *ao[][2] = {{"--api", u->api}, {"--api-key-file", o->api_keys},
                               {"--api-max-sessions", o->api_max},
                               {"--api-tls-cert", o->api_cert}, {"--api-tls-key", o->api_tls_key},
                               {"--api-keepalive", o->api_keepalive},
                               {"--chat-template", o->chat_template},
                               {"--draft", o->draft}, {"--draft-max", o->draft_max}};
        for (size_t i = 0; i < sizeof ao / sizeof ao[0]; i++)
            if (ao[i][1]) {
                args[a++] = ao[i][0];
                args[a++] = ao[i][1];
            }
        if (o->api_open)
            args[a++] = "--api-open";
    }
    if (o->stub)
        args[a++] = "--stub";
    else {
        if (o->window_from) {
            args[a++] = "--window-from";
            args[a++] = o->window_from;
        } else {
            args[a++] = "--model";
            args[a++] = u->model_abs;
        }
        args[a++] = "--catalog";
        args[a++] = u->cat_path;
    }
    args[a] = NULL;
}

/* In the forked child: become node k, a `kvd stage` in its own session, logging to its state
 * dir's kvd.log, with its listening socket (and rank 0's API socket) handed over. */
static _Noreturn void up_exec_node(const struct up *u, uint32_t k)
{
    char sd[PATH_MAX], logp[PATH_MAX];
    up_node_dir(u, k, sd, sizeof sd);
    snprintf(logp, sizeof logp, "%s/kvd.log", sd);
    setsid();
    int fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int nul = open("/dev/null", O_RDONLY);
    if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
    }
    if (nul >= 0)
        dup2(nul, 0);
    int hfd[2] = {u->lfd[k], u->api_fd};
    kvctl__hand_over(hfd, k == 0 && u->api_fd >= 0 ? 2 : 1);
    const char *args[72];   /* the most options up_stage_args gives, with room */
    struct up_argtext t;
    up_stage_args(u, k, sd, &t, args);
    execv(u->kvd, (char **)args);
    _exit(127);
}

/* One kvd per node, ranks first, each pid in its state dir's kvd.pid; the parent's copies of
 * the sockets handed over are closed. 0, or 1 (said). */
static int up_start(struct up *u)
{
    if (kvctl__kvd_path(u->kvd, sizeof u->kvd) < 0) {
        fprintf(stderr, "kvctl ring up: kvd not found %s (%s)\n",
                getenv("KVD_BIN") && *getenv("KVD_BIN") ? "at KVD_BIN" : "next to kvctl", u->kvd);
        return 1;
    }
    u->n_procs = (uint32_t)u->o.stages + (uint32_t)u->o.n_standby;
    for (uint32_t k = 0; k < u->n_procs; k++) {
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "kvctl ring up: fork: %s\n", strerror(errno));
            return 1;
        }
        if (pid == 0)
            up_exec_node(u, k);
        u->pids[k] = pid;
        close(u->lfd[k]);
        u->lfd[k] = -1;
        if (k == 0 && u->api_fd >= 0) {
            close(u->api_fd);
            u->api_fd = -1;
        }
        char pidf[PATH_MAX];
        up_node_dir(u, k, pidf, sizeof pidf);
        snprintf(pidf + strlen(pidf), sizeof pidf - strlen(pidf), "/kvd.pid");
        FILE *pf = fopen(pidf, "w");
        if (pf) {
            fprintf(pf, "%d\n", (int)pid);
            fclose(pf);
        }
    }
    return 0;
}

/* Node k exited before the ring linked: the others stopped, its log shown (with a hint when it
 * is a kvd without the stand-in compute that --stub needs). */
static void up_report_exit(const struct up *u, uint32_t k)
{
    char logp[PATH_MAX + 48], line[1024];
    up_node_dir(u, k, logp, sizeof logp);
    snprintf(logp + strlen(logp), sizeof logp - strlen(logp), "/kvd.log");
    for (uint32_t i = 0; i < u->n_procs; i++)
        if (i != k) {
            kill(u->pids[i], SIGTERM);
            waitpid(u->pids[i], NULL, 0);
        }
    fprintf(stderr, "kvctl ring up: stage %u exited; its log (%s):\n", k, logp);
    bool no_stub = false;
    FILE *lf = fopen(logp, "r");
    while (lf && fgets(line, sizeof line, lf)) {
        fprintf(stderr, "  %s", line);
        no_stub |= strstr(line, "unknown option '--stub'") != NULL;
    }
    if (lf)
        fclose(lf);
    if (no_stub)
        fprintf(stderr, "kvctl ring up: --stub needs the test build of kvd: "
                "KVD_BIN=build/tests/kvd-stub kvctl ring up ...\n");
}

/* Whether node k is up: a rank with both links up, a standby answering and waiting for a rank. */
static bool up_node_ready(const struct up *u, uint32_t k)
{
    char sock[PATH_MAX + 48], err[300];
    up_node_dir(u, k, sock, sizeof sock);
    snprintf(sock + strlen(sock), sizeof sock - strlen(sock), "/kvd.sock");
    cJSON *s = kvctl__query_status(sock, err, sizeof err);
    const char *key = k >= (uint32_t)u->o.stages ? "waiting" : "linked";
    bool ready = s && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, key));
    cJSON_Delete(s);
    return ready;
}

/* Wait up to 60 s until every node is up; a node that exits, or the time running out, ends
 * the wait with a report. 0, or 1 (said). */
static int up_wait_linked(struct up *u)
{
    if (kvctl__load_ring(u->dir_abs, &u->loaded) < 0)
        return 1;
    u->t0 = util_now_s();
    for (;;) {
        uint32_t ready = 0;
        for (uint32_t k = 0; k < u->n_procs; k++) {
            int st;
            if (waitpid(u->pids[k], &st, WNOHANG) == u->pids[k]) {
                up_report_exit(u, k);
                return 1;
            }
            ready += up_node_ready(u, k);
        }
        if (ready == u->n_procs)
            return 0;
        if (util_now_s() - u->t0 > 60) {
            fprintf(stderr, "kvctl ring up: the ring did not link within 60 s (logs in %s/rank-*/kvd.log)\n",
                    u->o.dir);
            kvctl__ring_status_table(u->dir_abs, &u->loaded, stderr);
            return 1;
        }
        usleep(50000);
    }
}

/* The ring that came up: how long it took, where its windows came from, its table, its API. */
static void up_print(const struct up *u)
{
    const struct up_opts *o = &u->o;
    printf("ring up in %.2f s (manifest %s)\n", util_now_s() - u->t0, u->mpath);
    printf("windows: %s\n", o->split ? "--split" : u->planned ? "the planner's split for identical local stages "
           "(balanced by work per token, embedding and head included)" : o->stub ? "even (stand-in compute)"
           : "by layer bytes (the planner refused: see above)");
    kvctl__ring_status_table(u->dir_abs, &u->loaded, stdout);
    if (u->api)
        printf("api: %s://%s/v1 (rank 0)\n", o->api_cert ? "https" : "http", u->api);
}

/* What ring_up still holds when it ends: the model's catalog and layer sizes, sockets not yet
 * handed over. */
static void up_free(struct up *u)
{
    free(u->lbytes);
    gguf_catalog_free(u->cat);
    kvctl__close_fds(u->lfd, MAX_STAGES + RING_MAX_STANDBYS);
    if (u->api_fd >= 0)
        close(u->api_fd);
}

/* The steps of ring up after the options are parsed, in order: each returns 0 to go on, or
 * the command's exit status (said). */
static int (*const up_steps[])(struct up *) = {
    up_check, up_bind_api, up_model, up_windows, up_dir, up_save_catalog, up_manifest,
    up_write_manifest, up_start, up_wait_linked,
};

/* kvctl ring up: the options, the model and its windows, DIR with the catalog and manifest,
 * the stages started on sockets bound here, and the wait until they link. */
int kvctl__ring_up(int argc, char **argv)
{
    struct up u = {.o = {.dtype = "f32", .dir = kvctl__ring_dir_default(), .threads = 1, .max_batch = 512,
                         .batch_wait = -1, .repair_wait = -1},
                   .api_fd = -1};
    for (size_t i = 0; i < sizeof u.lfd / sizeof u.lfd[0]; i++)
        u.lfd[i] = -1;
    int rc = up_parse(&u.o, argc, argv);
    if (rc != 0 || u.o.help)
        return rc;
    u.api = u.o.api;
    for (size_t i = 0; rc == 0 && i < sizeof up_steps / sizeof up_steps[0]; i++)
        rc = up_steps[i](&u);
    if (rc == 0)
        up_print(&u);
    up_free(&u);
    return rc;
}

/* main.c — `kvd stage` options: a table of (name, argument, help, setter). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/kern.h"
#include "kvd/kvd.h"
#include "kvd/stage/internal.h"
#include "model/model.h"
#include "ring/ring.h"
#include "seed/seed.h"
#include "net/net.h"
#include "util/util.h"
#include "util/err.h"

struct opt {
    const char *name, *arg, *help;
    int (*set)(struct kvd_stage_opts *o, const char *v);
};

static int parse_u32(const char *v, uint32_t lo, uint32_t hi, uint32_t *out)
{
    uint64_t x;
    if (util_parse_u64(v, lo, hi, 0, &x, NULL, 0) < 0)
        return -EINVAL;
    *out = (uint32_t)x;
    return 0;
}

static int set_manifest(struct kvd_stage_opts *o, const char *v) { o->manifest = v; return 0; }
static int set_model(struct kvd_stage_opts *o, const char *v) { o->model = v; return 0; }
static int set_window(struct kvd_stage_opts *o, const char *v) { o->window = v; return 0; }
static int set_listen(struct kvd_stage_opts *o, const char *v) { o->listen = v; return 0; }
static int set_state(struct kvd_stage_opts *o, const char *v) { o->state_dir = v; return 0; }
static const char *window_from, *window_catalog; /* the seeder section's --window-from */
/* One catalog serves both: the pulled window is verified against it, and the stage checks
 * its id against the manifest and its mapped tensors against it. */
static int set_catalog(struct kvd_stage_opts *o, const char *v) { o->catalog = v; window_catalog = v; return 0; }
static int set_window_from(struct kvd_stage_opts *o, const char *v) { (void)o; window_from = v; return 0; }
static int set_seed(struct kvd_stage_opts *o, const char *v) { o->seed_listen = v; return 0; }
static bool print_key;
static int set_print_key(struct kvd_stage_opts *o, const char *v) { (void)o; (void)v; print_key = true; return 0; }
static int set_fg(struct kvd_stage_opts *o, const char *v) { (void)o; (void)v; return 0; }
/* A whole number in [lo, hi] into an int option. */
static int parse_int(const char *v, uint32_t lo, uint32_t hi, int *out)
{
    uint32_t x;
    if (parse_u32(v, lo, hi, &x) < 0)
        return -EINVAL;
    *out = (int)x;
    return 0;
}
static int set_rank(struct kvd_stage_opts *o, const char *v) { return parse_int(v, 0, 63, &o->rank); }
static int set_threads(struct kvd_stage_opts *o, const char *v) { return parse_int(v, 0, 1024, &o->n_threads); }
static int set_idle(struct kvd_stage_opts *o, const char *v) { return parse_u32(v, 1, 86400 * 7, &o->idle_timeout_s); }
static int set_chunk(struct kvd_stage_opts *o, const char *v) { return parse_u32(v, 1, 4096, &o->chunk); }
static int set_batch_wait(struct kvd_stage_opts *o, const char *v) { return parse_u32(v, 0, 1000000, &o->batch_wait_us); }
static int set_draft(struct kvd_stage_opts *o, const char *v)
{
    int m = model_draft_mode(v);
    if (m < 0)
        return m;
    o->draft = m;
    return 0;
}
static int set_draft_max(struct kvd_stage_opts *o, const char *v) { return parse_u32(v, 1, RING_DRAFTS_MAX, &o->draft_max); }
static int set_standby(struct kvd_stage_opts *o, const char *v)
{
    o->is_standby = true;
    return parse_u32(v, 0, RING_MAX_STANDBYS - 1, &o->standby);
}
static int set_roster(struct kvd_stage_opts *o, const char *v) { o->roster = v; return 0; }
static int set_standby_key(struct kvd_stage_opts *o, const char *v)
{
    (void)v;
    o->is_standby = o->standby_by_key = true;
    return 0;
}
static int set_repair_wait(struct kvd_stage_opts *o, const char *v)
{
    o->repair_wait_set = true;
    return parse_u32(v, 0, 86400, &o->repair_wait_s);
}
static int set_link_timeout(struct kvd_stage_opts *o, const char *v) { return parse_u32(v, 100, 3600000, &o->link_timeout_ms); }
/* A size in MiB, fractions allowed (0.02: about 20 KiB), at most 1 TiB. */
static int parse_mib(const char *v, uint64_t *out)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !(x >= 0) || x > 1048576.0)
        return -EINVAL;
    *out = (uint64_t)(x * 1048576.0);
    return 0;
}
static int set_blog(struct kvd_stage_opts *o, const char *v)
{
    o->boundary_log_set = true;
    return parse_mib(v, &o->boundary_log_bytes);
}
static int set_blog_total(struct kvd_stage_opts *o, const char *v) { return parse_mib(v, &o->boundary_log_total); }
static int set_device(struct kvd_stage_opts *o, const char *v) { o->device = v; return 0; }
/* The OpenCL platform, device and weights: settings of the stage's opencl kernel device. */
static int set_cl_platform(struct kvd_stage_opts *o, const char *v) { return parse_int(v, 0, 64, &o->cl.platform); }
static int set_cl_device(struct kvd_stage_opts *o, const char *v) { return parse_int(v, 0, 64, &o->cl.device); }
static int set_cl_weights(struct kvd_stage_opts *o, const char *v)
{
    if (strcmp(v, "map") && strcmp(v, "copy") && strcmp(v, "auto"))
        return -EINVAL;
    o->cl.weights = v;
    return 0;
}
static int set_api(struct kvd_stage_opts *o, const char *v) { o->api_listen = v; return 0; }
static int set_api_keys(struct kvd_stage_opts *o, const char *v) { o->api_key_file = v; return 0; }
static int set_api_open(struct kvd_stage_opts *o, const char *v) { (void)v; o->api_open = true; return 0; }
static int set_api_cert(struct kvd_stage_opts *o, const char *v) { o->api_tls_cert = v; return 0; }
static int set_api_tls_key(struct kvd_stage_opts *o, const char *v) { o->api_tls_key = v; return 0; }
static int set_api_keepalive(struct kvd_stage_opts *o, const char *v) { return parse_u32(v, 1, 600, &o->api_keepalive_s); }
static int set_unpinned(struct kvd_stage_opts *o, const char *v) { (void)v; o->allow_unpinned = true; return 0; }
static int set_api_max(struct kvd_stage_opts *o, const char *v) { return parse_u32(v, 1, 65536, &o->api_max_sessions); }
static int set_chat_template(struct kvd_stage_opts *o, const char *v) { o->chat_template = v; return 0; }
/* The relay links read their CA from the environment (net/relay_link.c): this option sets it,
 * so KV_RELAY_CA keeps working and the command line says the same. */
static int set_relay_ca(struct kvd_stage_opts *o, const char *v)
{
    (void)o;
    if (access(v, R_OK))
        return -errno;
    return setenv("KV_RELAY_CA", v, 1) ? -errno : 0;
}
static int set_log(struct kvd_stage_opts *o, const char *v)
{
    (void)o;
    int level = kvd_log_level_parse(v);
    if (level < 0)
        return level;
    kvd_log_set_level(level);
    return 0;
}

static const struct opt opts[] = {
    {"--manifest", "FILE", "the ring manifest (JSON)", set_manifest},
    {"--rank", "R", "this stage's rank in the manifest", set_rank},
    {"--model", "FILE", "full GGUF; only this rank's window is mapped", set_model},
    {"--window", "FILE", "stage mini-GGUF holding this rank's window", set_window},
    {"--window-from", "URL", "pull this rank's window first (seeder or GGUF URL; docs/windows.md)", set_window_from},
    {"--listen", "HOST:PORT", "where the predecessor connects (default: own endpoint)", set_listen},
    {"--state-dir", "DIR", "node key and control socket (default .)", set_state},
    {"--seed", "HOST:PORT", "also serve windows of what this stage holds (seeder, docs/windows.md)", set_seed},
    {"--catalog", "FILE", "model catalog: id must be the manifest's; the (pulled) window is verified", set_catalog},
    {"-t", "N", "compute threads (default: all cores)", set_threads},
    {"--backend", "NAME", "kernel device: cpu or opencl (default: the manifest rank's backend)", set_device},
    {"--cl-platform", "N", "OpenCL platform index (clinfo -l; default 0)", set_cl_platform},
    {"--cl-device", "N", "OpenCL device index on that platform (default 0)", set_cl_device},
    {"--cl-weights", "MODE", "OpenCL weights: map (in place over the file), copy, auto (map on shared memory)", set_cl_weights},
    {"--idle-timeout", "S", "end sessions idle for S seconds (default 300)", set_idle},
    {"--chunk", "N", "prefill chunk in tokens (default: limits.max_batch)", set_chunk},
    {"--batch-wait-us", "N", "a step waits N us for other sessions' steps to batch with (default 0)", set_batch_wait},
    {"--draft", "MODE", "rank 0: lookup (prompt-lookup drafts, several tokens a ring pass), mtp (the model's MTP block on the last rank), auto (mtp where the last rank has the block, else lookup) or none, for requests that do not say (default none)", set_draft},
    {"--draft-max", "K", "rank 0: drafts a pass verifies, 1..14, for requests that do not say (default 8)", set_draft_max},
    {"--standby", "I", "instead of --rank: the manifest's standby entry I, taking over a dead rank", set_standby},
    {"--roster", "FILE", "standbys named beside the manifest (re-read when it changes; docs/market.md)", set_roster},
    {"--standby-by-key", NULL, "instead of --rank: the standby entry (manifest or --roster) naming this node's key", set_standby_key},
    {"--repair-wait", "S", "rank 0: pause sessions up to S s for a repair (default 30 with standbys, else 0)", set_repair_wait},
    {"--link-timeout-ms", "N", "an established link silent for N ms is dead (default 3000 + 4 x its RTT)", set_link_timeout},
    {"--boundary-log-mb", "N", "per session, keep up to N MiB of the boundaries sent, for repairs (default 4; 0: none)", set_blog},
    {"--boundary-log-total-mb", "N", "boundary logs of all sessions: at most N MiB, oldest dropped first (default 64)", set_blog_total},
    {"--api", "HOST:PORT", "rank 0: serve the OpenAI-compatible API (docs/api.md)", set_api},
    {"--api-key-file", "FILE", "API keys, one a line: requests need Authorization: Bearer KEY", set_api_keys},
    {"--api-open", NULL, "serve the API without keys on an address other than loopback", set_api_open},
    {"--api-tls-cert", "PEM", "serve the API over HTTPS with this certificate chain", set_api_cert},
    {"--api-tls-key", "PEM", "... and this private key", set_api_tls_key},
    {"--api-keepalive", "S", "close a kept-alive API connection idle for S s (default 30)", set_api_keepalive},
    {"--api-max-sessions", "N", "API generations at once, 429 beyond (default: the manifest's)", set_api_max},
    {"--chat-template", "NAME", "chat template family (chatml, llama3, ...; default: the model's)", set_chat_template},
    {"--relay-ca", "PEM", "relay certificates chain to this CA (as KV_RELAY_CA does)", set_relay_ca},
    {"--allow-unpinned", NULL, "link to neighbour ranks the manifest names no node key for (a warning names them)", set_unpinned},
    {"--log-level", "L", "error|warn|info|debug (default info)", set_log},
    {"--foreground", NULL, "stay in the foreground (the default; for service managers)", set_fg},
    {"--print-key", NULL, "create the node key in --state-dir if needed, print its public key, exit", set_print_key},
};

/* seed_window_from's lines: notes into the log, the progress bar (terminals only) as is. */
static void pull_log(void *ud, int kind, const char *line)
{
    if (kind == SEED_PULL_LINE)
        kvd_log(KVD_LOG_INFO, "%s", line);
    else
        seed_pull_log_file(stderr, kind, line);
    (void)ud;
}

const struct kvd_optspec *kvd_stage_optspecs(void)
{
    /* the table above plus the compute backends' switches, without the dashes */
    static struct kvd_optspec specs[sizeof opts / sizeof opts[0] + 16 + 1];
    if (!specs[0].name) {
        size_t n = 0;
        for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++)
            specs[n++] = (struct kvd_optspec){opts[k].name + 2, opts[k].arg != NULL, false};
        const struct kvd_backend_kind *bk;
        for (size_t k = 0; n < sizeof specs / sizeof specs[0] - 1 && (bk = kvd_backend_kind_at(k)); k++)
            if (bk->option)
                specs[n++] = (struct kvd_optspec){bk->option + 2, false, false};
    }
    return specs;
}

int kvd_stage_main(int argc, char **argv)
{
    struct kvd_stage_opts o = {.rank = -1, .cl = KERN_CL_OPTS_INIT};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: kvd [stage] --manifest FILE --rank R [options]\n\n");
            for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++)
                printf("  %-14s %-10s %s\n", opts[k].name, opts[k].arg ? opts[k].arg : "", opts[k].help);
            const struct kvd_backend_kind *bk;
            for (size_t k = 0; (bk = kvd_backend_kind_at(k)); k++)
                if (bk->option)
                    printf("  %-14s %-10s %s\n", bk->option, "", bk->help);
            return 0;
        }
        /* --name VALUE or --name=VALUE */
        const char *eq = !strncmp(argv[i], "--", 2) ? strchr(argv[i], '=') : NULL;
        size_t nlen = eq ? (size_t)(eq - argv[i]) : strlen(argv[i]);
        const struct opt *op = NULL;
        for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++)
            if (strlen(opts[k].name) == nlen && !strncmp(argv[i], opts[k].name, nlen))
                op = &opts[k];
        /* The options of the compute backends this build added (kvd/stage's table). */
        const struct kvd_backend_kind *bk = NULL;
        for (size_t k = 0; !op && (bk = kvd_backend_kind_at(k)); k++)
            if (bk->option && !strcmp(argv[i], bk->option))
                break;
        if (bk) {
            o.backend = bk->name;
            continue;
        }
        if (!op) {
            fprintf(stderr, "kvd stage: unknown option '%s' (--help lists them)\n", argv[i]);
            return 2;
        }
        const char *v = NULL;
        if (op->arg && eq) {
            v = eq + 1;
        } else if (op->arg) {
            if (i + 1 >= argc) {
                fprintf(stderr, "kvd stage: %s needs %s\n", op->name, op->arg);
                return 2;
            }
            v = argv[++i];
        } else if (eq) {
            fprintf(stderr, "kvd stage: %s takes no value\n", op->name);
            return 2;
        }
        if (op->set(&o, v) < 0) {
            fprintf(stderr, "kvd stage: bad value '%s' for %s\n", v ? v : "", op->name);
            return 2;
        }
    }
    if (print_key) {   /* for writing manifests: the "node" field of this host */
        char err[KV_ERR_MAX], hex[65];
        struct net_identity *id;
        if (net_identity_load(&id, o.state_dir ? o.state_dir : ".", err, sizeof err) < 0) {
            fprintf(stderr, "kvd stage: %s\n", err);
            return 1;
        }
        util_hex_encode(net_identity_pub(id), 32, hex);
        printf("%s\n", hex);
        net_identity_free(id);
        return 0;
    }
    if (!o.manifest || (o.rank < 0) == !o.is_standby) {
        fprintf(stderr, "kvd stage: --manifest and --rank (or --standby) are required\n");
        return 2;
    }
    if (o.is_standby && window_from) {
        /* a standby pulls the window of the rank it takes over, when it takes it */
        if (o.model || o.window) {
            fprintf(stderr, "kvd stage: --window-from replaces --model / --window\n");
            return 2;
        }
        o.standby_window_from = window_from;
        window_from = NULL;
    }
    static char pulled[4096];
    if (window_from) {
        if (o.model || o.window) {
            fprintf(stderr, "kvd stage: --window-from replaces --model / --window\n");
            return 2;
        }
        char err[KV_ERR_MAX];
        /* notes go to the log; progress only as a bar on a terminal (a log gets no ten
         * "pull: NN%" lines) */
        if (seed_window_from(o.manifest, o.rank, window_from, window_catalog, o.state_dir,
                             isatty(STDERR_FILENO) ? 2 : 0, pull_log, NULL, pulled, sizeof pulled, err,
                             sizeof err) < 0) {
            kvd_log(KVD_LOG_ERROR, "--window-from %s: %s", window_from, err);
            return 1;
        }
        kvd_log(KVD_LOG_INFO, "window pulled from %s: %s", window_from, pulled);
        o.window = pulled;
    }
    return kvd_stage_run(&o) < 0 ? 1 : 0;
}

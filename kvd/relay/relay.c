/* relay.c — the relay role's life: kvd_relay_new (limits, the WebSocket server, the periodic
 * timer), kvd_relay_close, and `kvd --role relay`'s options (kvd/relay/internal.h says what the
 * relay does). */
#include <assert.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "kvd/relay/internal.h"
#include "net/net.h"
#include "util/util.h"
#include "util/err.h"

/* ---------------------------------------------------------------- lifecycle */

static uint32_t min_u32(uint32_t a, uint32_t b)
{
    return a < b ? a : b;
}

/* The HTTP server's own lines (refused connections, dropped slow readers; rate-limited). */
static void http_log(void *ud, const char *line)
{
    kvd_relay__log(ud, KVD_LOG_WARN, "%s", line);
}

/* Plain HTTP requests (status, metrics; bridges are upgrades, logged per end): one line each. */
static void access_log(void *ud, const struct net_http_access *a)
{
    struct kvd_relay *r = ud;
    if (!r->cfg.quiet || a->status >= 500)
        kvd_log_access(a);
}

int kvd_relay_new(struct kvd_relay **out, struct uv_loop_s *loop,
                  const struct kvd_relay_config *cfg, char *err, size_t errlen)
{
    *out = NULL;
    struct kvd_relay *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    r->loop = loop;
    r->cfg = *cfg;
    struct kvd_relay_config *c = &r->cfg;
    if (!c->max_bridges) c->max_bridges = 4096;
    if (!c->max_per_addr) c->max_per_addr = 64;
    if (!c->pair_timeout_ms) c->pair_timeout_ms = 30000;
    if (!c->idle_timeout_ms) c->idle_timeout_ms = 90000;
    if (!c->ping_interval_ms) c->ping_interval_ms = 20000;
    if (!c->max_msg_bytes) c->max_msg_bytes = 16u << 20;
    if (!c->high_water) c->high_water = 64u << 10;
    if (!c->max_held) c->max_held = 1u << 20;
    if (!c->max_held_total) c->max_held_total = 64u << 20;
    if (!c->max_conns_per_addr) {
        uint64_t n = 2ull * c->max_per_addr + 16;
        c->max_conns_per_addr = n > (1u << 24) ? (1u << 24) : (uint32_t)n;
    }
    if (!c->max_fragments) c->max_fragments = 1024;
    if (!c->max_assembly) c->max_assembly = 256ull << 20;
    if (c->max_bridges > (1u << 24)) {
        snprintf(err, errlen, "max_bridges %u over the limit %u", c->max_bridges, 1u << 24);
        free(r);
        return -EINVAL;
    }
    if (c->max_msg_bytes > (1u << 30)) {
        snprintf(err, errlen, "max_msg_bytes %" PRIu64 " over the limit %u", c->max_msg_bytes,
                 1u << 30);
        free(r);
        return -EINVAL;
    }
    r->n_buckets = 64;
    while (r->n_buckets < c->max_bridges)
        r->n_buckets *= 2;
    r->buckets = calloc(r->n_buckets, sizeof *r->buckets);
    if (!r->buckets) {
        snprintf(err, errlen, "out of memory for %zu bridge slots", r->n_buckets);
        free(r);
        return -ENOMEM;
    }
    int rc;
    if (!c->plain) {
        rc = net_tls_ctx_server_new(&r->tls, c->tls_cert, c->tls_key, err, errlen);
        if (rc < 0)
            goto fail;
    }
    /* two ends per bridge, plus room for connections still in their handshake */
    uint64_t conns = 2ull * c->max_bridges + 1024;
    struct net_ws_limits lim = {.max_msg_bytes = c->max_msg_bytes, .low_water = c->high_water / 4,
                                .max_conns = conns > (1u << 24) ? (1u << 24) : (uint32_t)conns,
                                .max_fragments = c->max_fragments, .max_assembly = c->max_assembly,
                                .max_conns_per_addr = c->max_conns_per_addr,
                                .header_timeout_ms = c->header_timeout_ms,
                                .write_timeout_ms = c->write_timeout_ms};
    static const struct net_ws_server_handlers sh = {.on_upgrade = kvd_relay__on_upgrade, .on_get = kvd_relay__on_get};
    rc = net_ws_server_new(&r->srv, loop, c->listen, r->tls, &lim, &sh, r, err, errlen);
    if (rc < 0)
        goto fail;
    net_http_server_set_log(net_ws_server_http(r->srv), http_log, r);
    net_http_server_set_access_log(net_ws_server_http(r->srv), access_log, r);
    uv_timer_init(loop, &r->tick);
    r->tick.data = r;
    uint32_t period = min_u32(min_u32(c->pair_timeout_ms, c->idle_timeout_ms), c->ping_interval_ms) / 4;
    if (period < 20) period = 20;
    if (period > 1000) period = 1000;
    uv_timer_start(&r->tick, kvd_relay__on_tick, period, period);
    *out = r;
    return 0;
fail:
    net_tls_ctx_free(r->tls);
    free(r->buckets);
    free(r);
    return rc;
}

int kvd_relay_port(const struct kvd_relay *r)
{
    return net_ws_server_port(r->srv);
}

static void tick_closed(uv_handle_t *h)
{
    struct kvd_relay *r = h->data;
    r->tick_closed = true;
    free(r->buckets);
    r->buckets = NULL;
    kvd_relay__maybe_free(r);
}

static void srv_closed(void *ud)
{
    struct kvd_relay *r = ud;
    r->srv_closed = true;
    kvd_relay__maybe_free(r);
}

void kvd_relay_close(struct kvd_relay *r, void (*done)(void *ud), void *ud)
{
    if (!r || r->closing)
        return;
    r->closing = true;
    r->done = done;
    r->done_ud = ud;
    /* Ends see their connections drop; the server frees itself once they are gone. The
     * bridge table is no longer consulted after this. */
    for (size_t i = 0; i < r->n_buckets; i++) {
        for (struct relay_bridge *b = r->buckets[i]; b; b = b->hnext)
            for (int k = 1; k <= 2; k++)
                if (b->end[k])
                    b->end[k]->b = NULL;
        while (r->buckets[i]) {
            struct relay_bridge *b = r->buckets[i];
            r->buckets[i] = b->hnext;
            free(b);
        }
    }
    net_ws_server_close(r->srv, srv_closed, r);
    uv_timer_stop(&r->tick);
    uv_close((uv_handle_t *)&r->tick, tick_closed);
}

/* ---------------------------------------------------------------- kvd --role relay */

static void relay_stop(void *ud)
{
    kvd_relay_close(ud, NULL, NULL);
}

static void relay_usage(FILE *f)
{
    fprintf(f,
            "usage: kvd --role relay --listen HOST:PORT (--tls-cert PEM --tls-key PEM | --plain)\n"
            "           [--max-bridges N] [--max-per-addr N] [--pair-timeout MS]\n"
            "           [--idle-timeout MS] [--ping-interval MS] [--max-msg BYTES]\n"
            "           [--high-water BYTES] [--max-held BYTES] [--max-held-total BYTES]\n"
            "           [--max-fragments N] [--max-assembly BYTES] [--max-conns-per-addr N]\n"
            "           [--header-timeout MS] [--write-timeout MS] [--quiet]\n"
            "Pairs the two ends of each ring edge on wss://HOST:PORT/v1/bridge/<id>.\n"
            "GET /v1/relay/status (JSON) and /metrics (Prometheus) report counts.\n");
}

static int parse_u64(const char *opt, const char *s, uint64_t max, uint64_t *out)
{
    if (util_parse_u64(s, 0, max, 0, out, NULL, 0) < 0) {
        fprintf(stderr, "kvd relay: %s \"%s\": expected a whole number up to %" PRIu64 "\n", opt, s, max);
        return -EINVAL;
    }
    return 0;
}

/* The numeric options: each a whole number up to max, stored into a field of the config of
 * the given width (4 or 8 bytes). */
struct relay_num_opt {
    const char *name;
    uint64_t max;
    size_t off, size;
};
#define NUM_OPT(n, max, field) {n, max, offsetof(struct kvd_relay_config, field), \
                                sizeof(((struct kvd_relay_config *)0)->field)}
static const struct relay_num_opt num_opts[] = {
    NUM_OPT("max-bridges", 1u << 24, max_bridges),
    NUM_OPT("max-per-addr", 1u << 24, max_per_addr),
    NUM_OPT("pair-timeout", 86400000, pair_timeout_ms),
    NUM_OPT("idle-timeout", 86400000, idle_timeout_ms),
    NUM_OPT("ping-interval", 86400000, ping_interval_ms),
    NUM_OPT("max-msg", 1u << 30, max_msg_bytes),
    NUM_OPT("high-water", 1u << 30, high_water),
    NUM_OPT("max-held", 1u << 30, max_held),
    NUM_OPT("max-held-total", 1ull << 40, max_held_total),
    NUM_OPT("max-fragments", 1u << 24, max_fragments),
    NUM_OPT("max-assembly", 1ull << 40, max_assembly),
    NUM_OPT("max-conns-per-addr", 1u << 24, max_conns_per_addr),
    NUM_OPT("header-timeout", 86400000, header_timeout_ms),
    NUM_OPT("write-timeout", 86400000, write_timeout_ms),
};
#undef NUM_OPT
#define N_NUM_OPTS (sizeof num_opts / sizeof num_opts[0])

static int set_num_opt(struct kvd_relay_config *cfg, const struct relay_num_opt *o, const char *s)
{
    uint64_t v;
    char name[48];
    snprintf(name, sizeof name, "--%s", o->name);
    if (parse_u64(name, s, o->max, &v)) return -EINVAL;
    uint8_t *f = (uint8_t *)cfg + o->off;
    if (o->size == sizeof(uint32_t)) {
        uint32_t w = (uint32_t)v;
        memcpy(f, &w, sizeof w);
    } else {
        assert(o->size == sizeof(uint64_t));
        memcpy(f, &v, sizeof v);
    }
    return 0;
}

enum { O_ROLE = 1, O_LISTEN, O_CERT, O_KEY, O_PLAIN, O_QUIET, O_HELP, O_LOG, O_NUM = 0x100 };
static const struct option fixed[] = {
    {"role", required_argument, 0, O_ROLE},
    {"listen", required_argument, 0, O_LISTEN},
    {"tls-cert", required_argument, 0, O_CERT},
    {"tls-key", required_argument, 0, O_KEY},
    {"plain", no_argument, 0, O_PLAIN},
    {"quiet", no_argument, 0, O_QUIET},
    {"log-level", required_argument, 0, O_LOG},
    {"help", no_argument, 0, O_HELP},
};

const struct kvd_optspec *kvd_relay_optspecs(void)
{
    static struct kvd_optspec specs[sizeof fixed / sizeof fixed[0] + N_NUM_OPTS + 1];
    if (!specs[0].name) {
        size_t n = 0;
        for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
            if (fixed[i].val != O_HELP && fixed[i].val != O_ROLE)
                specs[n++] = (struct kvd_optspec){fixed[i].name, fixed[i].has_arg == required_argument, false};
        for (size_t i = 0; i < N_NUM_OPTS; i++)
            specs[n++] = (struct kvd_optspec){num_opts[i].name, true, false};
    }
    return specs;
}

int kvd_relay_main(int argc, char **argv)
{
    struct kvd_relay_config cfg = {0};
    struct option opts[sizeof fixed / sizeof fixed[0] + N_NUM_OPTS + 1];
    size_t n = 0;
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) opts[n++] = fixed[i];
    for (size_t i = 0; i < N_NUM_OPTS; i++)
        opts[n++] = (struct option){num_opts[i].name, required_argument, 0, O_NUM + (int)i};
    opts[n] = (struct option){0, 0, 0, 0};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c >= O_NUM && c < O_NUM + (int)N_NUM_OPTS) {
            if (set_num_opt(&cfg, &num_opts[c - O_NUM], optarg)) return 2;
            continue;
        }
        switch (c) {
        case O_ROLE:
            if (strcmp(optarg, "relay") != 0) {
                fprintf(stderr, "kvd relay: --role %s: this entry point runs only the relay\n", optarg);
                return 2;
            }
            break;
        case O_LISTEN: cfg.listen = optarg; break;
        case O_CERT: cfg.tls_cert = optarg; break;
        case O_KEY: cfg.tls_key = optarg; break;
        case O_PLAIN: cfg.plain = true; break;
        case O_QUIET: cfg.quiet = true; break;
        case O_LOG: {
            int level = kvd_log_level_parse(optarg);
            if (level < 0) {
                fprintf(stderr, "kvd relay: --log-level '%s' is not error|warn|info|debug\n", optarg);
                return 2;
            }
            kvd_log_set_level(level);
            break;
        }
        case O_HELP:
            relay_usage(stdout);
            return 0;
        default:
            relay_usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kvd relay: unexpected argument \"%s\"\n", argv[optind]);
        return 2;
    }
    if (!cfg.listen) {
        fprintf(stderr, "kvd relay: --listen HOST:PORT is required\n");
        relay_usage(stderr);
        return 2;
    }
    if (!cfg.plain && (!cfg.tls_cert || !cfg.tls_key)) {
        fprintf(stderr, "kvd relay: --tls-cert and --tls-key are required (or --plain for ws://)\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    kvd_log_set_prefix("relay");
    uv_loop_t *loop = uv_default_loop();
    char err[KV_ERR_MAX];
    struct kvd_relay *main_relay;
    int rc = kvd_relay_new(&main_relay, loop, &cfg, err, sizeof err);
    if (rc < 0) {
        kvd_log(KVD_LOG_ERROR, "%s", err);
        return 1;
    }
    kvd_log(KVD_LOG_INFO, "listening on %s port %d (%s)", cfg.listen, kvd_relay_port(main_relay),
            cfg.plain ? "plain ws" : "TLS");
    char status[128];
    snprintf(status, sizeof status, "relay on port %d", kvd_relay_port(main_relay));
    kvd_role_run(loop, status, relay_stop, main_relay);
    uv_loop_close(loop);
    return 0;
}

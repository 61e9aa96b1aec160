/* kvd seeder: the seeder role's command line and event loop around seed/seed.h's server. */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "kvd/kvd.h"
#include "net/net.h"
#include "seed/seed.h"
#include "util/util.h"
#include "util/err.h"

static void seeder_stop(void *ud)
{
    net_http_server_close(ud, NULL, NULL);
}

static void seeder_usage(FILE *out)
{
    fprintf(out,
            "usage: kvd seeder --serve FILE[,CATALOG] [--serve ...] [--listen HOST:PORT]\n"
            "       (also: kvd --role seeder ...)\n"
            "  Serves models and windows over HTTP: /v1/models, /v1/catalog/<id>,\n"
            "  /v1/windows/<id>/<first>-<last>. Default listen 127.0.0.1:7480.\n"
            "  --port-file PATH   write the bound port there (for --listen HOST:0)\n"
            "  --log-level L      error|warn|info|debug (default info)\n"
            "  --max-rate R       send at most R bytes/s per window transfer (K/M suffixes)\n"
            "  --header-timeout MS, --body-timeout MS, --idle-timeout MS, --write-timeout MS\n"
            "                     deadlines: request head, request body, keep-alive idle (and a\n"
            "                     handler's answer), a client that takes no bytes while some wait\n"
            "  --max-conns N      open connections (default 1024)\n"
            "  --max-conns-per-addr N  open connections from one address (default 256)\n"
            "  --max-zstd N       responses compressed at once; more go unencoded (default 16)\n");
}

/* The HTTP server's own lines (refused connections, dropped slow readers; rate-limited). */
static void http_log(void *ud, const char *line)
{
    (void)ud;
    kvd_log(KVD_LOG_WARN, "%s", line);
}

/* One line per request: who, what, the answer, how much and how long (never the bytes). */
static void access_log(void *ud, const struct net_http_access *a)
{
    (void)ud;
    kvd_log_access(a);
}

/* "--opt N" with N in 1..max into *out: 0, or -EINVAL after saying why. */
static int seeder_u32(const char *opt, const char *s, uint32_t max, uint32_t *out)
{
    uint64_t v;
    if (util_parse_u64(s, 1, max, 0, &v, NULL, 0) < 0) {
        fprintf(stderr, "kvd seeder: %s '%s': expected a whole number from 1 to %u\n", opt, s, max);
        return -EINVAL;
    }
    *out = (uint32_t)v;
    return 0;
}

const struct kvd_optspec *kvd_seeder_optspecs(void)
{
    /* the options kvd_seeder_main parses below */
    static const struct kvd_optspec specs[] = {
        {"serve", true, true}, {"listen", true, false}, {"max-rate", true, false},
        {"header-timeout", true, false}, {"body-timeout", true, false}, {"idle-timeout", true, false},
        {"write-timeout", true, false}, {"max-conns", true, false}, {"max-conns-per-addr", true, false},
        {"max-zstd", true, false}, {"port-file", true, false}, {"log-level", true, false},
        {NULL, false, false},
    };
    return specs;
}

int kvd_seeder_main(int argc, char **argv)
{
    const char *listen = "127.0.0.1:7480", *port_file = NULL;
    const char *serve[SEED_MAX_MODELS];
    struct net_http_limits lim = {0};
    int n_serve = 0;
    if (util_args_split_eq(&argc, &argv) < 0) {
        fprintf(stderr, "kvd seeder: out of memory\n");
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "seeder"))
            continue;
        if (!strcmp(a, "--role") && i + 1 < argc && !strcmp(argv[i + 1], "seeder")) {
            i++;
            continue;
        }
        if (!strcmp(a, "--serve") && i + 1 < argc && n_serve < SEED_MAX_MODELS) {
            serve[n_serve++] = argv[++i];
        } else if (!strcmp(a, "--listen") && i + 1 < argc) {
            listen = argv[++i];
        } else if (!strcmp(a, "--max-rate") && i + 1 < argc) {
            double r;
            if (util_parse_double(argv[++i], 1024, 1e13, UTIL_PARSE_SUFFIX, &r, NULL, 0) < 0) {
                fprintf(stderr, "kvd seeder: --max-rate '%s': bytes/s from 1K (K/M suffixes)\n",
                        argv[i]);
                return 2;
            }
            lim.max_send_rate = (uint64_t)r;
        } else if (i + 1 < argc && (!strcmp(a, "--header-timeout") || !strcmp(a, "--body-timeout") ||
                                    !strcmp(a, "--idle-timeout") || !strcmp(a, "--write-timeout"))) {
            uint32_t *f = a[2] == 'h' ? &lim.header_timeout_ms : a[2] == 'b' ? &lim.body_timeout_ms
                        : a[2] == 'i' ? &lim.idle_timeout_ms : &lim.write_timeout_ms;
            if (seeder_u32(a, argv[++i], 86400000, f) < 0)
                return 2;
        } else if (!strcmp(a, "--max-conns") && i + 1 < argc) {
            if (seeder_u32(a, argv[++i], 1u << 20, &lim.max_conns) < 0)
                return 2;
        } else if (!strcmp(a, "--max-conns-per-addr") && i + 1 < argc) {
            if (seeder_u32(a, argv[++i], 1u << 20, &lim.max_conns_per_addr) < 0)
                return 2;
        } else if (!strcmp(a, "--max-zstd") && i + 1 < argc) {
            if (seeder_u32(a, argv[++i], 4096, &lim.max_zstd_streams) < 0)
                return 2;
        } else if (!strcmp(a, "--log-level") && i + 1 < argc) {
            int level = kvd_log_level_parse(argv[++i]);
            if (level < 0) {
                fprintf(stderr, "kvd seeder: --log-level '%s' is not error|warn|info|debug\n", argv[i]);
                return 2;
            }
            kvd_log_set_level(level);
        } else if (!strcmp(a, "--port-file") && i + 1 < argc) {
            port_file = argv[++i];
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            seeder_usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "kvd seeder: unknown or incomplete option '%s'\n", a);
            seeder_usage(stderr);
            return 2;
        }
    }
    if (n_serve == 0) {
        seeder_usage(stderr);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    kvd_log_set_prefix("seeder");
    uv_loop_t *loop = uv_default_loop();
    struct net_http_server *srv;
    struct seed_server *sd;
    char err[KV_ERR_MAX];
    int rc = net_http_server_new(&srv, loop, &lim);
    if (rc || (rc = seed_server_new(&sd, srv))) {
        kvd_log(KVD_LOG_ERROR, "%s", strerror(-rc));
        return 1;
    }
    net_http_server_set_log(srv, http_log, NULL);
    net_http_server_set_access_log(srv, access_log, NULL);
    for (int i = 0; i < n_serve; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s", serve[i]);
        char *comma = strchr(path, ',');
        if (comma)
            *comma++ = 0;
        char id[65];
        err[0] = 0;
        if ((rc = seed_server_add(sd, path, comma, id, err, sizeof err))) {
            kvd_log(KVD_LOG_ERROR, "%s", err[0] ? err : strerror(-rc));
            return 1;
        }
        kvd_log(KVD_LOG_INFO, "serving %s as %s", path, id);
    }
    if ((rc = net_http_server_listen(srv, listen))) {
        kvd_log(KVD_LOG_ERROR, "listen on %s: %s", listen, uv_strerror(rc));
        return 1;
    }
    kvd_log(KVD_LOG_INFO, "listening on %s port %d", listen, net_http_server_port(srv));
    if (port_file)
        kvd_port_file_write(port_file, net_http_server_port(srv));
    char status[128];
    snprintf(status, sizeof status, "seeding on port %d", net_http_server_port(srv));
    kvd_role_run(loop, status, seeder_stop, srv);
    seed_server_free(sd);
    uv_loop_close(loop);
    return 0;
}

/* main.c — `kvd market` options and its event loop (docs/market.md, "Running a market"). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "kvd/kvd.h"
#include "kvd/market/internal.h"
#include "net/net.h"
#include "ring/ring.h"
#include "util/err.h"
#include "util/util.h"

static struct net_http_server *main_srv;
static struct kvd_market_api *main_api;

static void market_stop(void *ud)
{
    (void)ud;
    kvd_market__api_close(main_api);
    net_http_server_close(main_srv, NULL, NULL);
}

static void http_log(void *ud, const char *line)
{
    (void)ud;
    kvd_log(KVD_LOG_WARN, "%s", line);
}

static void usage(FILE *f)
{
    fprintf(f,
        "usage: kvd market --db PATH [--listen HOST:PORT] [options]\n"
        "  The market (docs/market.md): models, the coverage map, signed claims and leases,\n"
        "  ring manifests, receipts and balances over an HTTP JSON API, and a coverage page at /.\n"
        "  --db PATH           the SQLite database (created when missing; WAL)\n"
        "  --listen HOST:PORT  default 127.0.0.1:7490 (port 0 picks one)\n"
        "  --port-file PATH    write the bound port there\n"
        "  --tls-cert PEM      serve HTTPS with this certificate chain (with --tls-key)\n"
        "  --tls-key PEM       the certificate's private key\n"
        "  --lease-s S         an active lease lives S s past its heartbeat (default 20)\n"
        "  --reserve-s S       a reserved lease, past its download heartbeat (default 60)\n"
        "  --grace-s S         a lapsed window waits S s for its node to come back (default 30)\n"
        "  --clock-skew-s S    a signed call's time may be S s off (default 300)\n"
        "  --reward-base R     credit per layer-token of a covered window (default 0.001)\n"
        "  --no-probe          activate leases on reachability alone: no endpoint check, no\n"
        "                      known-answer probes, no spot checks\n"
        "  --spot-check-s S    probe an active stage again every 0.5..1.5 x S s (default 300;\n"
        "                      0: never)\n"
        "  --penalty-s S       a node that failed a probe may not claim for S s (default 600)\n"
        "  --pull-min-rate B   bytes/s: a reservation ends window bytes / B s after its claim\n"
        "                      (at least --reserve-s) unless it became active (default 1048576)\n"
        "  --lapse-refuse-s S  a node whose reservation ran out may not claim that window again\n"
        "                      for S s (default 600)\n"
        "  --claims-per-min-key N   claims one node key may make a minute (default 12; 0: no limit)\n"
        "  --claims-per-min-addr N  claims from one address (IPv6: a /64) a minute (default 60)\n"
        "  --max-ranks-per-addr N   ranks of one model held from one address by nodes with a\n"
        "                      direct endpoint (default 1; 0: no cap)\n"
        "  --max-ranks-per-relay-addr N  the same for nodes reached through a relay, which share\n"
        "                      carrier NAT addresses (default 4; 0: no cap)\n"
        "  --admission open|allowlist FILE  who may claim: anyone (default), or the node keys in FILE\n"
        "  --operator-key FILE the operators' node keys (64 hex a line): they may change or remove\n"
        "                      any model and add and credit clients\n"
        "  --settle-wait-s S   a session's ranks that submitted are paid without the ones that did\n"
        "                      not after S s (default 120)\n"
        "  --audit-rate R      audit this share of credited receipts afterwards (default 0.05;\n"
        "                      0: none)\n"
        "  --audit-deadline-s S  an audit unanswered S s after it was drawn fails (default 300)\n"
        "  --audit-answer-kib N  the positions an audit opens fit in N KiB of answer, sent in\n"
        "                      parts (default 65536, 16 to 129024)\n"
        "  --verify-model GGUF the whole model: audits recompute the rows on it (without it they\n"
        "                      check the Merkle proofs only)\n"
        "  --log-level L       error|warn|info|debug (default info)\n");
}

static int num(const char *opt, const char *v, double lo, double hi, double *out)
{
    if (util_parse_double(v, lo, hi, 0, out, NULL, 0) < 0) {
        fprintf(stderr, "kvd market: %s '%s': expected a number from %g to %g\n", opt, v, lo, hi);
        return -EINVAL;
    }
    return 0;
}

int kvd_market_main(int argc, char **argv)
{
    struct kvd_market_config cfg;
    kvd_market__config_default(&cfg);
    const char *port_file = NULL, *tls_cert = NULL, *tls_key = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--no-probe")) {
            cfg.probe = false;
            continue;
        }
        if (!v) {
            fprintf(stderr, "kvd market: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        i++;
        int rc = 0;
        if (!strcmp(a, "--db"))
            cfg.db = v;
        else if (!strcmp(a, "--listen"))
            cfg.listen = v;
        else if (!strcmp(a, "--port-file"))
            port_file = v;
        else if (!strcmp(a, "--tls-cert"))
            tls_cert = v;
        else if (!strcmp(a, "--tls-key"))
            tls_key = v;
        else if (!strcmp(a, "--lease-s"))
            rc = num(a, v, 1, 86400, &cfg.lease_s);
        else if (!strcmp(a, "--reserve-s"))
            rc = num(a, v, 1, 86400, &cfg.reserve_s);
        else if (!strcmp(a, "--grace-s"))
            rc = num(a, v, 0, 86400, &cfg.grace_s);
        else if (!strcmp(a, "--spot-check-s"))
            rc = num(a, v, 0, 86400 * 30, &cfg.spot_check_s);
        else if (!strcmp(a, "--penalty-s"))
            rc = num(a, v, 0, 86400 * 365, &cfg.penalty_s);
        else if (!strcmp(a, "--audit-rate"))
            rc = num(a, v, 0, 1, &cfg.audit_rate);
        else if (!strcmp(a, "--audit-deadline-s"))
            rc = num(a, v, 1, 86400, &cfg.audit_deadline_s);
        else if (!strcmp(a, "--audit-answer-kib"))
            rc = num(a, v, 16, 129024, &cfg.audit_answer_kib);   /* 512 parts of 252 KiB */
        else if (!strcmp(a, "--verify-model"))
            cfg.verify_model = v;
        else if (!strcmp(a, "--clock-skew-s"))
            rc = num(a, v, 1, 86400, &cfg.clock_skew_s);
        else if (!strcmp(a, "--reward-base"))
            rc = num(a, v, 1e-12, 1e12, &cfg.reward_base);
        else if (!strcmp(a, "--pull-min-rate"))
            rc = num(a, v, 1, 1e12, &cfg.pull_min_rate);
        else if (!strcmp(a, "--lapse-refuse-s"))
            rc = num(a, v, 0, 86400 * 30, &cfg.lapse_refuse_s);
        else if (!strcmp(a, "--claims-per-min-key"))
            rc = num(a, v, 0, 1e9, &cfg.claims_per_min_key);
        else if (!strcmp(a, "--claims-per-min-addr"))
            rc = num(a, v, 0, 1e9, &cfg.claims_per_min_addr);
        else if (!strcmp(a, "--settle-wait-s"))
            rc = num(a, v, 0, 86400 * 30, &cfg.settle_wait_s);
        else if (!strcmp(a, "--max-ranks-per-addr") || !strcmp(a, "--max-ranks-per-relay-addr")) {
            double d = 0;
            if (!(rc = num(a, v, 0, KVD_MARKET_MAX_WINDOWS, &d)) && d != (uint32_t)d) {
                fprintf(stderr, "kvd market: %s '%s': expected a whole number\n", a, v);
                rc = -EINVAL;
            }
            *(!strcmp(a, "--max-ranks-per-addr") ? &cfg.max_ranks_addr : &cfg.max_ranks_relay_addr) =
                (uint32_t)d;
        } else if (!strcmp(a, "--operator-key"))
            cfg.operator_keys = v;
        else if (!strcmp(a, "--admission")) {
            if (!strcmp(v, "open")) {
                cfg.allowlist = NULL;
            } else if (!strcmp(v, "allowlist") && i + 1 < argc) {
                cfg.allowlist = argv[++i];
            } else {
                fprintf(stderr, "kvd market: --admission '%s': expected open, or allowlist FILE\n", v);
                rc = -EINVAL;
            }
        }
        else if (!strcmp(a, "--log-level")) {
            static const char *names[] = {"error", "warn", "info", "debug"};
            rc = -EINVAL;
            for (int k = 0; k < 4; k++)
                if (!strcmp(v, names[k])) {
                    kvd_log_set_level(k);
                    rc = 0;
                }
        } else {
            fprintf(stderr, "kvd market: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (rc)
            return 2;
    }
    if (!cfg.db) {
        fprintf(stderr, "kvd market: --db is required\n");
        usage(stderr);
        return 2;
    }
    if (cfg.verify_model && access(cfg.verify_model, R_OK)) {
        fprintf(stderr, "kvd market: --verify-model %s: %s\n", cfg.verify_model, strerror(errno));
        return 2;
    }
    if (!tls_cert != !tls_key) {
        fprintf(stderr, "kvd market: --tls-cert and --tls-key go together\n");
        return 2;
    }
    kvd_log_set_prefix("market");
    signal(SIGPIPE, SIG_IGN);
    char err[KV_ERR_MAX];
    struct net_tls_ctx *tls = NULL;
    static struct net_http_filter tls_filter;
    if (tls_cert && net_tls_ctx_server_new(&tls, tls_cert, tls_key, err, sizeof err) < 0) {
        fprintf(stderr, "kvd market: %s\n", err);
        return 1;
    }
    struct kvd_market_store *st;
    int rc = kvd_market__store_open(&st, cfg.db, err, sizeof err);
    if (rc) {
        fprintf(stderr, "kvd market: %s\n", err);
        net_tls_ctx_free(tls);
        return 1;
    }
    uv_loop_t *loop = uv_default_loop();
    struct net_http_limits lim = {.max_body = RING_MARKET_BODY_MAX,
                                  .idle_timeout_ms = (uint32_t)(cfg.poll_max_s * 1000) + 10000};
    struct net_http_server *srv;
    if ((rc = net_http_server_new(&srv, loop, &lim))) {
        fprintf(stderr, "kvd market: %s\n", strerror(-rc));
        kvd_market__store_close(st);
        return 1;
    }
    net_http_server_set_log(srv, http_log, NULL);
    if (tls) {   /* HTTPS: TLS as the server's byte filter (net/tls.c) */
        net_tls_filter_init(&tls_filter, tls);
        net_http_server_set_filter(srv, &tls_filter);
    }
    if ((rc = kvd_market__api_new(&main_api, loop, srv, st, &cfg, err, sizeof err))) {
        fprintf(stderr, "kvd market: %s\n", err);
        return 1;
    }
    if ((rc = net_http_server_listen(srv, cfg.listen))) {
        fprintf(stderr, "kvd market: listen on %s: %s\n", cfg.listen, uv_strerror(rc));
        return 1;
    }
    kvd_log(KVD_LOG_INFO, "listening on port %d (%s), database %s", net_http_server_port(srv),
            tls ? "https" : "http", cfg.db);
    if (port_file)
        kvd_port_file_write(port_file, net_http_server_port(srv));
    main_srv = srv;
    char status[128];
    snprintf(status, sizeof status, "market on port %d", net_http_server_port(srv));
    kvd_role_run(loop, status, market_stop, NULL);
    kvd_market__api_free(main_api);
    kvd_market__store_close(st);
    uv_loop_close(loop);
    net_tls_ctx_free(tls);
    return 0;
}

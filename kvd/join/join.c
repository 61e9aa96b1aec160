/* join.c — `kvd join`: its options, the node's identity and endpoint, and the role's loop
 * (kvd/join/internal.h says what the role does): profile, catalog, claim, pull, listen, the
 * lease activated, hold. A new manifest (a replaced rank) restarts the stage on it; a lost
 * lease or a move sends the node back to claiming.
 *
 * The stage runs in a child process (kvd_stage_run, the stage role's entry point) that dies
 * with this one, so a restart on a new manifest starts from a clean loop. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <openssl/rand.h>

#include "kvd/join/internal.h"
#include "net/net.h"
#include "util/err.h"
#include "util/util.h"

static void join_usage(FILE *f)
{
    fprintf(f,
        "usage: kvd join --market URL --model ID --state-dir DIR [options]\n"
        "  Claims the best-rewarded free window of the model that fits, pulls it, waits for the\n"
        "  ring's manifest and runs as its stage (docs/market.md). Rank 0 serves clients on\n"
        "  DIR/kvd.sock. Once every window has a stage, it stands by for a window but rank 0's\n"
        "  instead: pulled ahead, named in the ring's roster, taking the rank over when its\n"
        "  stage dies (docs/market.md, \"Standbys\"; not with --relay).\n"
        "  --mem BYTES         memory for the window (K/M/G suffixes; default: half of MemAvailable)\n"
        "  --rowlog BYTES      disk for the rows kept for audits, DIR/rows (default: a quarter of\n"
        "                      the space free there at start, 1G to 64G)\n"
        "  --listen HOST:PORT  where the predecessor connects (default 127.0.0.1 and a free port;\n"
        "                      PORT 0: a free one, bound first and advertised)\n"
        "  --advertise HOST:PORT  the endpoint the market publishes, when not --listen's (a\n"
        "                      forwarded port)\n"
        "  --relay URL         no inbound: the in-edge goes through this relay (relay://HOST:PORT)\n"
        "  --relay-ca PEM      relay certificates chain to this CA (as KV_RELAY_CA does)\n"
        "  --api HOST:PORT     as rank 0, serve the OpenAI-compatible API there to the market's\n"
        "                      paying clients (Authorization: Bearer <client key>); the market\n"
        "                      publishes it in the map. A node of another rank serves nothing\n"
        "  --api-key-file F    keys let in besides the market's clients (plain or sha256:HEX lines)\n"
        "  --chat-template NAME  the API's chat template family (default: the model's)\n"
        "  --backend NAME      compute backend (default cpu)\n"
        "  --ca PEM            an https:// market's certificate must chain to this CA\n"
        "  -t N                compute threads (default: all cores)\n"
        "  --jitter-ms MS      random delay before each claim (default 1500)\n"
        "  --move-ratio R      move to a free window worth R x ours or more (default 1.5) ...\n"
        "  --move-after-s S    ... once that has lasted S s and no session runs (default 120)\n"
        "  --log-level L       error|warn|info|debug (default info)\n");
}

/* The row log's default cap: a quarter of the space free in DIR now, between 1 GiB and 64 GiB
 * (a busy node of a 4096-wide model logs about 32 KiB a position, and an audit comes minutes
 * after the session: 1 GiB may hold less than that). */
static uint64_t rowlog_default(const char *dir)
{
    struct statvfs v;
    uint64_t q = statvfs(dir, &v) == 0 ? (uint64_t)v.f_bavail * v.f_frsize / 4 : 0;
    return q < (1ull << 30) ? 1ull << 30 : q > (64ull << 30) ? 64ull << 30 : q;
}

static uint64_t mem_default(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    uint64_t kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lu kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb ? kb * 1024 / 2 : 1ull << 30;
}

static int free_port(char *out, size_t n)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) ||
        getsockname(fd, (struct sockaddr *)&sa, &sl)) {
        if (fd >= 0)
            close(fd);
        return -EADDRNOTAVAIL;
    }
    snprintf(out, n, "127.0.0.1:%d", ntohs(sa.sin_port));
    close(fd);
    return 0;
}

/* The URL clients reach --api HOST:PORT at: http://HOST:PORT (a wildcard host is sent as it
 * is; the market puts the address the heartbeat came from in its place). 0, or -EINVAL
 * without a port. */
static int api_url_of(const char *api, char *out, size_t n)
{
    const char *colon = strrchr(api, ':');
    if (!colon || atoi(colon + 1) <= 0 || atoi(colon + 1) > 65535 || colon == api)
        return -EINVAL;
    return snprintf(out, n, "http://%s", api) < (int)n ? 0 : -EINVAL;
}

int kvd_join_main(int argc, char **argv)
{
    struct join j = {.backend = "cpu", .jitter_ms = 1500, .probe_fd = -1, .move_ratio = 1.5,
                     .move_after_s = 120, .prefer = -1, .avoid = -1, .rank = -1};
    static char listen_buf[64];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            join_usage(stdout);
            return 0;
        }
        if (!v) {
            fprintf(stderr, "kvd join: unknown or incomplete option '%s'\n", a);
            join_usage(stderr);
            return 2;
        }
        i++;
        uint64_t x;
        if (!strcmp(a, "--market"))
            j.market = v;
        else if (!strcmp(a, "--model"))
            j.model = v;
        else if (!strcmp(a, "--state-dir"))
            j.dir = v;
        else if (!strcmp(a, "--listen"))
            j.listen = v;
        else if (!strcmp(a, "--relay"))
            j.relay = v;
        else if (!strcmp(a, "--api"))
            j.api = v;
        else if (!strcmp(a, "--api-key-file"))
            j.api_keys = v;
        else if (!strcmp(a, "--chat-template"))
            j.chat_template = v;
        else if (!strcmp(a, "--advertise"))
            j.advertise = v;
        else if (!strcmp(a, "--relay-ca")) {
            /* the stage's relay links read it from the environment (net/relay_link.c) */
            if (access(v, R_OK)) {
                fprintf(stderr, "kvd join: --relay-ca %s: %s\n", v, strerror(errno));
                return 2;
            }
            setenv("KV_RELAY_CA", v, 1);
        }
        else if (!strcmp(a, "--backend"))
            j.backend = v;
        else if (!strcmp(a, "--move-ratio") || !strcmp(a, "--move-after-s")) {
            double d;
            bool ratio = !strcmp(a, "--move-ratio");
            if (util_parse_double(v, ratio ? 1 : 0, 1e6, 0, &d, NULL, 0) < 0) {
                fprintf(stderr, "kvd join: bad value '%s' for %s\n", v, a);
                return 2;
            }
            *(ratio ? &j.move_ratio : &j.move_after_s) = d;
        } else if (!strcmp(a, "--ca"))
            ring_market_set_ca(v);   /* an https:// market's certificate chains to this CA */
        else if (!strcmp(a, "--rowlog")) {
            if (util_parse_u64(v, 1ull << 20, 1ull << 50, UTIL_PARSE_SUFFIX, &j.rowlog_max, NULL, 0) < 0) {
                fprintf(stderr, "kvd join: bad value '%s' for %s (bytes, 1M or more)\n", v, a);
                return 2;
            }
        } else if (!strcmp(a, "--mem") || !strcmp(a, "-t") || !strcmp(a, "--jitter-ms")) {
            bool mem = a[2] == 'm';
            if (util_parse_u64(v, mem ? 1 << 16 : 0, mem ? 1ull << 50 : 600000,
                               mem ? UTIL_PARSE_SUFFIX : 0, &x, NULL, 0) < 0) {
                fprintf(stderr, "kvd join: bad value '%s' for %s\n", v, a);
                return 2;
            }
            if (mem)
                j.mem = x;
            else if (a[1] == 't')
                j.n_threads = (int)x;
            else
                j.jitter_ms = (uint32_t)x;
        } else if (!strcmp(a, "--log-level")) {
            static const char *names[] = {"error", "warn", "info", "debug"};
            int k = 0;
            while (k < 4 && strcmp(v, names[k]))
                k++;
            if (k == 4) {
                fprintf(stderr, "kvd join: --log-level '%s': error|warn|info|debug\n", v);
                return 2;
            }
            kvd_log_set_level(k);
        } else {
            fprintf(stderr, "kvd join: unknown option '%s'\n", a);
            join_usage(stderr);
            return 2;
        }
    }
    if (!j.market || !j.model || !j.dir) {
        fprintf(stderr, "kvd join: --market, --model and --state-dir are required\n");
        return 2;
    }
    if (strlen(j.model) != 64 || strspn(j.model, "0123456789abcdef") != 64) {
        fprintf(stderr, "kvd join: --model '%s': expected the model id (64 hex digits)\n", j.model);
        return 2;
    }
    if (j.relay && strncmp(j.relay, "relay://", 8)) {
        fprintf(stderr, "kvd join: --relay '%s': expected relay://HOST:PORT\n", j.relay);
        return 2;
    }
    if ((j.api_keys || j.chat_template) && !j.api) {
        fprintf(stderr, "kvd join: --api-key-file and --chat-template are the API's: pass --api\n");
        return 2;
    }
    if (j.api_keys && access(j.api_keys, R_OK)) {
        fprintf(stderr, "kvd join: --api-key-file %s: %s\n", j.api_keys, strerror(errno));
        return 2;
    }
    if (j.advertise && (j.relay || !strrchr(j.advertise, ':') || !atoi(strrchr(j.advertise, ':') + 1))) {
        fprintf(stderr, "kvd join: --advertise '%s': expected HOST:PORT (not with --relay)\n",
                j.advertise);
        return 2;
    }
    if (j.api && api_url_of(j.api, j.api_url, sizeof j.api_url)) {
        fprintf(stderr, "kvd join: --api '%s': expected HOST:PORT with a port\n", j.api);
        return 2;
    }
    if (!j.mem)
        j.mem = mem_default();
    kvd_log_set_prefix("join");
    mkdir(j.dir, 0700);
    char err[KV_ERR_MAX];
    if (net_identity_load(&j.id, j.dir, err, sizeof err) < 0) {
        fprintf(stderr, "kvd join: %s\n", err);
        return 1;
    }
    util_hex_encode(net_identity_pub(j.id), 32, j.node);
    if (!j.rowlog_max)
        j.rowlog_max = rowlog_default(j.dir);
    if (!j.listen && !j.relay) {
        if (free_port(listen_buf, sizeof listen_buf)) {
            fprintf(stderr, "kvd join: no free port on 127.0.0.1 (pass --listen)\n");
            return 1;
        }
        j.listen = listen_buf;
    }
    const char *lc = j.listen && !j.relay ? strrchr(j.listen, ':') : NULL;
    if (lc && !strcmp(lc, ":0")) {   /* bind first, then advertise the port bound */
        uint16_t port;
        int fd = kvd_join__tcp_listen(j.listen, &port);
        if (fd < 0) {
            fprintf(stderr, "kvd join: --listen %s: %s\n", j.listen, strerror(-fd));
            return 1;
        }
        snprintf(listen_buf, sizeof listen_buf, "%.*s:%u", (int)(lc - j.listen), j.listen, port);
        j.listen = listen_buf;
        j.probe_fd = fd;
    }
    if (j.relay) {
        uint8_t b[16];
        char hex[33];
        RAND_bytes(b, sizeof b);
        util_hex_encode(b, sizeof b, hex);
        snprintf(j.endpoint, sizeof j.endpoint, "%s/b/%s", j.relay, hex);
    } else {
        snprintf(j.endpoint, sizeof j.endpoint, "tcp://%s", j.advertise ? j.advertise : j.listen);
    }
    snprintf(j.manifest_path, sizeof j.manifest_path, "%s/manifest.json", j.dir);
    snprintf(j.receipts_path, sizeof j.receipts_path, "%s/receipts.jsonl", j.dir);
    snprintf(j.offset_path, sizeof j.offset_path, "%s/receipts.offset", j.dir);
    snprintf(j.clients_path, sizeof j.clients_path, "%s/clients.keys", j.dir);
    snprintf(j.roster_path, sizeof j.roster_path, "%s/roster.json", j.dir);
    unlink(j.roster_path);   /* a roster of an earlier run names nothing we know of */
    if (j.api) {   /* --api-key-file's keys only until the market's list came */
        unlink(j.clients_path);
        kvd_join__clients_write(&j);
    }
    /* kvctl ring down --dir DIR stops this node through it (a clean stop gives the lease back) */
    char pid_path[4200];
    snprintf(pid_path, sizeof pid_path, "%s/join.pid", j.dir);
    FILE *pf = fopen(pid_path, "w");
    if (!pf || fprintf(pf, "%d\n", (int)getpid()) < 0 || fclose(pf))
        kvd_log(KVD_LOG_WARN, "%s: %s", pid_path, strerror(errno));
    kvd_log(KVD_LOG_INFO, "node %s joining model %.16s... at %s (memory %llu bytes, endpoint %s)",
            j.node, j.model, j.market, (unsigned long long)j.mem, j.endpoint);
    signal(SIGTERM, kvd_join__on_stop);
    signal(SIGINT, kvd_join__on_stop);
    signal(SIGPIPE, SIG_IGN);
    /* what a previous run of this node owes is submitted first: its receipts count for the
     * ranks it held when the sessions ran, whatever it will hold now */
    kvd_join__receipts_submit(&j);
    int rc = 0;
    uint32_t backoff = 500;
    while (!kvd_join__stop_flag) {
        rc = kvd_join__profile(&j);
        if (rc == 0)
            rc = kvd_join__fetch_catalog(&j);
        if (rc == 0)
            rc = kvd_join__claim(&j);
        if (rc == -EINVAL)
            break;   /* the market refuses this node or serves a wrong catalog: no retry helps */
        if (rc) {
            rc = 0;
            kvd_join__sleep_ms(backoff);
            backoff = backoff < 8000 ? backoff * 2 : 8000;
            continue;
        }
        j.held = !j.standby;
        backoff = 500;
        rc = kvd_join__pull(&j);
        if (rc == -EPERM || rc == -EAGAIN) {
            j.held = rc != -EPERM && !j.standby;
            j.standby = j.standby && rc != -EPERM;
            rc = 0;
            continue;
        }
        if (rc)
            break;
        if ((rc = kvd_join__probe_listen(&j)) == -EPERM) {
            j.held = j.standby = false;
            rc = 0;
            continue;
        }
        if (rc) {
            kvd_log(KVD_LOG_ERROR, "listen on %s: %s", j.listen, strerror(-rc));
            break;
        }
        if ((rc = kvd_join__heartbeat(&j, j.endpoint, 0)) == -EINVAL) {
            kvd_log(KVD_LOG_ERROR, "the market refused endpoint %s; stopping", j.endpoint);
            break;
        }
        if (rc) {
            kvd_log(KVD_LOG_WARN, "the market did not activate the lease; claiming again");
            kvd_join__probe_close(&j);
            rc = 0;
            continue;
        }
        if (j.standby)
            kvd_log(KVD_LOG_INFO, "standby for window %u at %s; waiting for the ring's roster to "
                    "name it", j.window, j.endpoint);
        else
            kvd_log(KVD_LOG_INFO, "lease on window %u active; waiting for the ring's manifest", j.window);
        rc = kvd_join__hold(&j);
        kvd_join__stage_stop(&j);
        kvd_join__probe_close(&j);
        j.manifest_sha[0] = 0;
        j.better_since = 0;
        j.rank = -1;
        if (rc == -EINVAL)
            break;
        if (rc == -EXDEV) {   /* moving: what we owe is submitted while we hold the rank */
            kvd_log(KVD_LOG_INFO, "moving from window %u to window %d", j.window, j.prefer);
            kvd_join__receipts_submit(&j);
            kvd_join__release(&j);
            j.held = false;
            unlink(j.window_path);   /* a node keeps only the window it serves */
            rc = 0;
            continue;
        }
        if (rc == -EPERM) {
            kvd_log(KVD_LOG_WARN, "lost the %slease on window %u; claiming again",
                    j.standby ? "standby " : "", j.window);
            j.held = j.standby = false;
            rc = 0;
        }
    }
    kvd_join__stage_stop(&j);
    kvd_join__probe_close(&j);
    if (j.held || j.standby) {   /* the window is free at once, not after the lease and its grace */
        kvd_join__release(&j);
        kvd_log(KVD_LOG_INFO, "gave the %slease on window %u back", j.standby ? "standby " : "",
                j.window);
    }
    /* on a clean exit, what the stage wrote last (its sessions end as it stops) */
    for (int i = 0; i < 3 && kvd_join__receipts_submit(&j); i++)
        kvd_join__sleep_ms(1000);
    unlink(pid_path);
    free(j.market_clients);
    free(j.roster_text);
    net_identity_free(j.id);
    kvd_log(KVD_LOG_INFO, "stopped");
    return rc < 0 ? 1 : 0;
}

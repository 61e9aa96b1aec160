/* kvctl/pull.c — `kvctl pull`: fetch a stage window from a seeder or a GGUF URL (seed_pull). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvctl/kvctl.h"
#include "seed/seed.h"
#include "util/err.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: kvctl pull --from URL --layers A:B [--catalog CAT] -o WINDOW.gguf\n"
            "  URL: a seeder (http://host:port) or an HTTP(S) URL of a full GGUF on a server\n"
            "       that supports range requests. Layers are half-open: 0:4 is layers 0..3.\n"
            "  --catalog CAT        verify every tensor against this catalog (default: the\n"
            "                       seeder's own catalog, checked against its id; none for a URL)\n"
            "  --model ID           model id on a seeder serving several\n"
            "  --source-sha256 HEX  kvasir.source.sha256 for a URL pulled without catalog\n"
            "  --zstd / --no-zstd   ask a seeder for zstd encoding (default: no)\n"
            "  --timeout S          give up on a stalled transfer after S seconds (30)\n"
            "  --limit-rate R       receive at most R bytes/s (K/M suffixes)\n"
            "  --cacert PEM         HTTPS: trust these CA certificates instead of the system's\n"
            "  -q                   no progress output\n"
            "  Interrupted pulls resume when run again (OUT.part, OUT.part.state); OUT appears\n"
            "  only when the window is complete and verified.\n");
}

static int parse_layers(const char *s, uint32_t *a, uint32_t *b)
{
    char *e;
    unsigned long x = strtoul(s, &e, 10);
    if (e == s || (*e != ':' && *e != '-'))
        return -EINVAL;
    const char *s2 = e + 1;
    unsigned long y = strtoul(s2, &e, 10);
    if (e == s2 || *e || x >= y || y > 1000000)
        return -EINVAL;
    *a = (uint32_t)x;
    *b = (uint32_t)y;
    return 0;
}

int kvctl_cmd_pull(int argc, char **argv)
{
    struct seed_pull_opts o = {.progress = isatty(STDERR_FILENO) ? 2 : 1,
                              .log = seed_pull_log_file, .log_ud = stderr};
    bool have_layers = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--from") && v) {
            o.url = v;
            i++;
        } else if (!strcmp(a, "--layers") && v) {
            if (parse_layers(v, &o.first, &o.last) != 0) {
                fprintf(stderr, "kvctl pull: --layers '%s': expected A:B with A < B\n", v);
                return 2;
            }
            have_layers = true;
            i++;
        } else if (!strcmp(a, "--catalog") && v) {
            o.catalog_path = v;
            i++;
        } else if (!strcmp(a, "--model") && v) {
            o.model_id = v;
            i++;
        } else if (!strcmp(a, "--source-sha256") && v) {
            o.source_sha256 = v;
            i++;
        } else if ((!strcmp(a, "-o") || !strcmp(a, "--out")) && v) {
            o.out_path = v;
            i++;
        } else if (!strcmp(a, "--timeout") && v) {
            o.timeout_s = strtol(v, NULL, 10);
            i++;
        } else if (!strcmp(a, "--cacert") && v) {
            o.ca_file = v;
            i++;
        } else if (!strcmp(a, "--limit-rate") && v) {
            double r;
            if (util_parse_double(v, 1, 1e15, UTIL_PARSE_SUFFIX, &r, NULL, 0) < 0) {
                fprintf(stderr, "kvctl pull: --limit-rate '%s': bytes per second (K/M suffix)\n", v);
                return 2;
            }
            o.max_rate = (uint64_t)r;
            i++;
        } else if (!strcmp(a, "--zstd")) {
            o.zstd = true;
        } else if (!strcmp(a, "--no-zstd")) {
            o.zstd = false;
        } else if (!strcmp(a, "-q")) {
            o.progress = 0;
        } else {
            fprintf(stderr, "kvctl pull: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!o.url || !have_layers || !o.out_path) {
        usage(stderr);
        return 2;
    }
    if (o.source_sha256 && strlen(o.source_sha256) != 64) {
        fprintf(stderr, "kvctl pull: --source-sha256 must be 64 hex digits\n");
        return 2;
    }
    char err[KV_ERR_MAX];
    struct seed_pull_stats st;
    int rc = seed_pull(&o, &st, err, sizeof err);
    if (rc) {
        fprintf(stderr, "kvctl pull: %s\n", err[0] ? err : strerror(-rc));
        return 1;
    }
    if (o.progress)
        fprintf(stderr,
                "pull: wrote %s (layers [%u, %u)): %" PRIu64 " bytes fetched in %" PRIu64
                " requests, %.2f s (transfer %.2f s = %.0f MB/s, verify + install %.2f s)\n",
                o.out_path, o.first, o.last, st.bytes_fetched, st.requests, st.seconds,
                st.seconds - st.verify_seconds,
                st.seconds - st.verify_seconds > 0
                    ? (double)(st.bytes_fetched - 0) / 1e6 / (st.seconds - st.verify_seconds) : 0.0,
                st.verify_seconds);
    return 0;
}

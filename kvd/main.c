/* kvd: the Kvasir daemon. `kvd [ROLE] [options]`: the role table below picks what this
 * process is (the stage when no role is named); each role parses its own options. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvd/kvd.h"
#include "net/net.h"
#include "util/util.h"

#ifndef KV_VERSION
#define KV_VERSION "unknown" /* set by the Makefile */
#endif

static const struct util_cmd roles[] = {
    {"stage", kvd_stage_main, "--manifest ring.json --rank R [--model FILE | --window MINI.gguf] ...  a ring stage"},
    {"relay", kvd_relay_main, "--listen HOST:PORT (--tls-cert C --tls-key K | --plain) ...  WebSocket relay for NAT'd stages"},
    {"market", kvd_market_main, "--db PATH [--listen HOST:PORT] ...  the market: claims, leases, manifests, credit"},
    {"join", kvd_join_main, "--market URL --model ID --state-dir DIR ...  claim a window, pull it, run as its stage"},
    {"seeder", kvd_seeder_main, "--serve FILE[,CATALOG]... --listen HOST:PORT  serves models and windows over HTTP"},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: kvd [ROLE] [options]   (ROLE defaults to stage)\n"
                 "       kvd [ROLE] --config FILE [options]   options from FILE (key = value lines;\n"
                 "                                            the command line wins)\n\nroles:\n");
    util_cmd_list(out, roles, sizeof roles / sizeof roles[0], 7);
    fprintf(out, "\n'kvd ROLE --help' describes a role's options; 'kvd --version' prints the version.\n");
}

/* --config FILE (or --config=FILE) anywhere on the command line: the file's options go
 * before the command line's (which win), its role applies when the command line names none.
 * Returns the exit status of the role, or -1 when there is no --config. */
static int run_with_config(int argc, char **argv)
{
    const char *path = NULL;
    int at = -1, skip = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config") && i + 1 < argc) {
            path = argv[i + 1];
            at = i;
            skip = 2;
        } else if (!strncmp(argv[i], "--config=", 9)) {
            path = argv[i] + 9;
            at = i;
            skip = 1;
        }
    }
    if (!path)
        return -1;
    char err[512], role[32];
    if (kvd_config_role(path, role, sizeof role, err, sizeof err) < 0) {
        fprintf(stderr, "kvd: config %s\n", err);
        return 2;
    }
    /* the command line's role (first argument not an option) wins over the file's */
    const char *cl_role = argc >= 2 && argv[1][0] != '-' && at != 1 ? argv[1] : NULL;
    if (cl_role && role[0] && strcmp(cl_role, role) != 0) {
        fprintf(stderr, "kvd: the command line's role '%s' is not the config's 'role = %s' (%s)\n", cl_role,
                role, path);
        return 2;
    }
    const char *name = cl_role ? cl_role : role[0] ? role : "stage";
    const struct util_cmd *r = util_cmd_find(roles, sizeof roles / sizeof roles[0], name);
    const struct kvd_optspec *specs = !r ? NULL : !strcmp(name, "stage") ? kvd_stage_optspecs()
                                    : !strcmp(name, "relay") ? kvd_relay_optspecs()
                                    : !strcmp(name, "seeder") ? kvd_seeder_optspecs() : NULL;
    if (!specs) {
        fprintf(stderr, "kvd: %s: %s role '%s'\n", path, r ? "no config file for the" : "unknown", name);
        return 2;
    }
    char **cargs;
    int nc;
    if (kvd_config_args(path, specs, &cargs, &nc, err, sizeof err) < 0) {
        fprintf(stderr, "kvd: config %s\n", err);
        return 2;
    }
    /* argv: role, the file's options, then the command line's (without the role, --config) */
    char **nv = calloc((size_t)argc + (size_t)nc + 2, sizeof *nv);
    if (!nv) {
        fprintf(stderr, "kvd: out of memory\n");
        return 1;
    }
    int n = 0;
    nv[n++] = (char *)name;
    for (int i = 0; i < nc; i++)
        nv[n++] = cargs[i];
    for (int i = cl_role ? 2 : 1; i < argc; i++) {
        if (i == at) {
            i += skip - 1;
            continue;
        }
        nv[n++] = argv[i];
    }
    nv[n] = NULL;
    int rc = r->fn(n, nv);
    for (int i = 0; i < nc; i++)
        free(cargs[i]);
    free(cargs);
    free(nv);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && util_is_help(argv[1])) {
        usage(stdout);
        return 0;
    }
    if (argc >= 2 && !strcmp(argv[1], "--version")) {
        printf("%s %s\n", "kvd", KV_VERSION);
        return 0;
    }
    /* sockets handed over by systemd or `kvctl ring up`, taken before any role forks */
    net_listen_inherit();
    int crc = run_with_config(argc, argv);
    if (crc >= 0)
        return crc;
    /* `kvd --role relay ...` is the relay's documented spelling */
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--role") && !strcmp(argv[i + 1], "relay"))
            return kvd_relay_main(argc, argv);
    if (argc >= 3 && !strcmp(argv[1], "--role")) { /* kvd --role NAME ... == kvd NAME ... */
        argv[1] = argv[0];
        argc--;
        argv++;
    }
    if (argc >= 2 && argv[1][0] != '-') {
        const struct util_cmd *r = util_cmd_find(roles, sizeof roles / sizeof roles[0], argv[1]);
        if (r)
            return r->fn(argc - 1, argv + 1);
        fprintf(stderr, "kvd: unknown role '%s'\n", argv[1]);
        usage(stderr);
        return 2;
    }
    argv[0] = (char *)"stage";
    return kvd_stage_main(argc, argv);
}

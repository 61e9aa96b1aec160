/* kvd: the Kvasir daemon. `kvd [ROLE] [options]`: the role table below picks what this
 * process is (the stage when no role is named); each role parses its own options. */
#include <stdio.h>
#include <string.h>

#include "kvd/kvd.h"
#include "util/util.h"

static const struct util_cmd roles[] = {
    {"stage", kvd_stage_main, "--manifest ring.json --rank R [--model FILE | --window MINI.gguf] ...  a ring stage"},
    {"relay", kvd_relay_main, "--listen HOST:PORT (--tls-cert C --tls-key K | --plain) ...  WebSocket relay for NAT'd stages"},
    {"market", kvd_market_main, "--db PATH [--listen HOST:PORT] ...  the market: claims, leases, manifests, credit"},
    {"join", kvd_join_main, "--market URL --model ID --state-dir DIR ...  claim a window, pull it, run as its stage"},
    {"seeder", kvd_seeder_main, "--serve FILE[,CATALOG]... --listen HOST:PORT  serves models and windows over HTTP"},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: kvd [ROLE] [options]   (ROLE defaults to stage)\n\nroles:\n");
    util_cmd_list(out, roles, sizeof roles / sizeof roles[0], 7);
    fprintf(out, "\n'kvd ROLE --help' describes a role's options.\n");
}

int main(int argc, char **argv)
{
    if (argc >= 2 && util_is_help(argv[1])) {
        usage(stdout);
        return 0;
    }
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

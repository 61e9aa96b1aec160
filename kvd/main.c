/* kvd: the Kvasir daemon. `kvd [ROLE] [options]`: the role table below picks what this
 * process is (the stage when no role is named); each role parses its own options. */
#include <stdio.h>
#include <string.h>

#include "kvd/kvd.h"

struct kvd_role {
    const char *name;
    int (*main)(int argc, char **argv);   /* argv[0] is the role name */
    const char *help;
};

static const struct kvd_role roles[] = {
    {"stage", kvd_stage_main, "--manifest ring.json --rank R [--model FILE | --window MINI.gguf] ...  a ring stage"},
    {"relay", kvd_relay_main, "--listen HOST:PORT (--tls-cert C --tls-key K | --plain) ...  WebSocket relay for NAT'd stages"},
    {"seeder", kvd_seeder_main, "--serve FILE[,CATALOG]... --listen HOST:PORT  serves models and windows over HTTP"},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: kvd [ROLE] [options]   (ROLE defaults to stage)\n\nroles:\n");
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++)
        fprintf(out, "  %-7s %s\n", roles[i].name, roles[i].help);
    fprintf(out, "\n'kvd ROLE --help' describes a role's options.\n");
}

int main(int argc, char **argv)
{
    if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help"))) {
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
        for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++)
            if (!strcmp(argv[1], roles[i].name))
                return roles[i].main(argc - 1, argv + 1);
        fprintf(stderr, "kvd: unknown role '%s'\n", argv[1]);
        usage(stderr);
        return 2;
    }
    argv[0] = (char *)"stage";
    return kvd_stage_main(argc, argv);
}

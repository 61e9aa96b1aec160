/* kvctl: dispatch to the command functions of kvctl.h. */
#include <stdio.h>
#include <string.h>

#include "kvctl/kvctl.h"
#include "util/util.h"

#ifndef KV_VERSION
#define KV_VERSION "unknown" /* set by the Makefile */
#endif

static const struct util_cmd commands[] = {
    {"inspect",    kvctl_cmd_inspect,    "FILE                      what a model holds: arch, shapes, tensors, bytes per layer"},
    {"slice",      kvctl_cmd_slice,      "FILE --layers A:B -o OUT  write the stage mini-GGUF of layers [A,B)"},
    {"catalog",    kvctl_cmd_catalog,    "FILE [-o cat.json]        per-tensor SHA-256 catalog; its own SHA-256 is the model id"},
    {"verify",     kvctl_cmd_verify,     "WINDOW --catalog CAT      check a window tensor by tensor against a catalog"},
    {"synth",      kvctl_cmd_synth,      "--arch A ... | --from F --nextn N  a random-weight model, or a copy with MTP blocks"},
    {"generate",   kvctl_cmd_generate,   "-m FILE|--ring DIR -p TEXT -n N [sampling]  generate text"},
    {"logits",     kvctl_cmd_logits,     "-m FILE --tokens ... -o OUT  teacher-forced logits"},
    {"bench",      kvctl_cmd_bench,      "-m FILE -p 64 -n 32 -t N  prompt and generation speed"},
    {"tokenize",   kvctl_cmd_tokenize,   "-m FILE [--ids] [--special] (TEXT | -f FILE | -f -)"},
    {"detokenize", kvctl_cmd_detokenize, "-m FILE [--special] IDS..."},
    {"ring",       kvctl_cmd_ring,       "up|down ...               start or stop a local ring"},
    {"status",     kvctl_cmd_status,     "--ring DIR                the ring at a glance"},
    {"plan",       kvctl_cmd_plan,       "--model FILE --devices J  plan a ring manifest"},
    {"profile",    kvctl_cmd_profile,    "--model FILE              this device's profile JSON"},
    {"serve",      kvctl_cmd_serve,      "-m FILE --listen HOST:PORT  the OpenAI-compatible API from one process"},
    {"pull",       kvctl_cmd_pull,       "--from URL --layers A:B -o OUT  fetch only a window"},
    {"market",     kvctl_cmd_market,     "add|remove|status|balance|client URL ...  a market's models, map, balances, clients"},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: kvctl COMMAND [options]\n\ncommands:\n");
    util_cmd_list(out, commands, sizeof commands / sizeof commands[0], 11);
    fprintf(out, "\n'kvctl COMMAND --help' describes one command; 'kvctl --version' prints the version.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (util_is_help(argv[1])) {
        usage(stdout);
        return 0;
    }
    if (argc >= 2 && !strcmp(argv[1], "--version")) {
        printf("%s %s\n", "kvctl", KV_VERSION);
        return 0;
    }
    const struct util_cmd *cmd = util_cmd_find(commands, sizeof commands / sizeof commands[0], argv[1]);
    if (cmd) {
        /* The commands with their own option loops see --opt=VALUE as --opt VALUE, as the
         * getopt-based ones (generate, logits, bench, tokenize, ring up) do by themselves. */
        static const char *const own_loops[] = {"inspect", "slice", "catalog", "verify", "synth",
                                                "plan", "profile", "pull"};
        int n = argc - 1;
        char **v = argv + 1;
        for (size_t i = 0; i < sizeof own_loops / sizeof own_loops[0]; i++)
            if (!strcmp(argv[1], own_loops[i]) && util_args_split_eq(&n, &v) < 0) {
                fprintf(stderr, "kvctl: out of memory\n");
                return 1;
            }
        return cmd->fn(n, v);
    }
    fprintf(stderr, "kvctl: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}

/* kvctl_model.c — placeholder until its issue lands. */
#include <stdio.h>
#include "kvd/kvctl.h"

int kvctl_cmd_generate(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "kvctl generate: not built yet\n");
    return 1;
}

int kvctl_cmd_logits(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "kvctl logits: not built yet\n");
    return 1;
}

int kvctl_cmd_bench(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "kvctl bench: not built yet\n");
    return 1;
}


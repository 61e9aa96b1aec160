/* kvctl_gguf.c — placeholder until its issue lands. */
#include <stdio.h>
#include "kvd/kvctl.h"

int kvctl_cmd_inspect(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "kvctl inspect: not built yet\n");
    return 1;
}

int kvctl_cmd_slice(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "kvctl slice: not built yet\n");
    return 1;
}

int kvctl_cmd_catalog(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "kvctl catalog: not built yet\n");
    return 1;
}

int kvctl_cmd_verify(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "kvctl verify: not built yet\n");
    return 1;
}

int kvctl_cmd_synth(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "kvctl synth: not built yet\n");
    return 1;
}


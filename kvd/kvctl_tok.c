/* kvctl_tok.c — placeholder until its issue lands. */
#include <stdio.h>
#include "kvd/kvctl.h"

int kvctl_cmd_tokenize(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "kvctl tokenize: not built yet\n");
    return 1;
}

int kvctl_cmd_detokenize(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "kvctl detokenize: not built yet\n");
    return 1;
}


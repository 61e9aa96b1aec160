/* kvctl_pull.c — placeholder until its issue lands. */
#include <stdio.h>
#include "kvd/kvctl.h"

int kvctl_cmd_pull(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "kvctl pull: not built yet\n");
    return 1;
}


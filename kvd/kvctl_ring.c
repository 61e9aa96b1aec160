/* kvctl_ring.c — placeholder until its issue lands. */
#include <stdio.h>
#include "kvd/kvctl.h"

int kvctl_cmd_ring(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "kvctl ring: not built yet\n");
    return 1;
}

int kvctl_cmd_status(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "kvctl status: not built yet\n");
    return 1;
}


/* kvctl_plan.c — placeholder until its issue lands. */
#include <stdio.h>
#include "kvd/kvctl.h"

int kvctl_cmd_plan(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "kvctl plan: not built yet\n");
    return 1;
}

int kvctl_cmd_profile(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "kvctl profile: not built yet\n");
    return 1;
}


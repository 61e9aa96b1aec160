/* util/cmd.c — the subcommand tables of kvd and kvctl. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "util/util.h"

const struct util_cmd *util_cmd_find(const struct util_cmd *cmds, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(cmds[i].name, name))
            return &cmds[i];
    return NULL;
}

void util_cmd_list(FILE *out, const struct util_cmd *cmds, size_t n, int width)
{
    for (size_t i = 0; i < n; i++)
        fprintf(out, "  %-*s %s\n", width, cmds[i].name, cmds[i].help);
}

bool util_is_help(const char *arg)
{
    return !strcmp(arg, "-h") || !strcmp(arg, "--help") || !strcmp(arg, "help");
}

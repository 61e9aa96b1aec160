/* util/cmd.c — the subcommand tables of kvd and kvctl, and their --opt=VALUE arguments. */
#include <stdbool.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
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

/* util_args_split_eq's arrays: reachable until exit (the command's argv and its names). */
static char **split_argv;
static char *split_names;

int util_args_split_eq(int *argc, char ***argv)
{
    int n = 0;
    size_t bytes = 0;
    for (int i = 0; i < *argc; i++) {
        const char *a = (*argv)[i], *eq = !strncmp(a, "--", 2) ? strchr(a, '=') : NULL;
        n += 1 + (eq != NULL);
        bytes += eq ? (size_t)(eq - a) + 1 : 0;
    }
    if (n == *argc)
        return 0;
    char **v = calloc((size_t)n + 1, sizeof *v);
    char *buf = malloc(bytes);
    if (!v || !buf) {
        free(v);
        free(buf);
        return -ENOMEM;
    }
    int k = 0;
    char *p = buf;
    for (int i = 0; i < *argc; i++) {
        char *a = (*argv)[i], *eq = !strncmp(a, "--", 2) ? strchr(a, '=') : NULL;
        if (!eq) {
            v[k++] = a;
            continue;
        }
        size_t len = (size_t)(eq - a);
        memcpy(p, a, len);
        p[len] = 0;
        v[k++] = p;
        p += len + 1;
        v[k++] = eq + 1;
    }
    split_argv = v;
    split_names = buf;
    *argc = n;
    *argv = split_argv;
    return 0;
}

/* kvctl/common.c — what several kvctl commands share: option-value parsing, the OpenCL device
 * options (generate, logits, bench, profile), the sampling options of generate (one
 * process and through a ring) with its stop strings and logits dump, token-id lists. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <float.h>
#include <sys/random.h>

#include "kernels/kern.h"
#include "kvctl/kvctl.h"
#include "model/model.h"
#include "util/util.h"
#include "util/err.h"

bool kvctl_is_help(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help"))
            return true;
    return false;
}

int kvctl_parse_long(const char *opt, const char *s, long lo, long hi, long *out)
{
    int64_t v;
    char err[KV_ERR_MAX];
    if (util_parse_i64(s, lo, hi, &v, err, sizeof err) < 0) {
        fprintf(stderr, "%s: %s\n", opt, err);
        return -EINVAL;
    }
    *out = (long)v;
    return 0;
}

int kvctl_parse_u64(const char *cmd, const char *opt, const char *s, uint64_t max, uint64_t *out)
{
    char err[KV_ERR_MAX];
    if (util_parse_u64(s, 0, max, 0, out, err, sizeof err) < 0) {
        fprintf(stderr, "kvctl %s: %s %s\n", cmd, opt, err);
        return -1;
    }
    return 0;
}

int kvctl_parse_float(const char *opt, const char *s, float *out)
{
    double v;
    if (util_parse_double(s, -FLT_MAX, FLT_MAX, 0, &v, NULL, 0) < 0) {
        fprintf(stderr, "%s: '%s' is not a number\n", opt, s);
        return -EINVAL;
    }
    *out = (float)v;
    return 0;
}

int kvctl_parse_num(const char *cmd, const char *opt, const char *s, double lo, double hi, double *out)
{
    char err[KV_ERR_MAX];
    if (util_parse_double(s, lo, hi, 0, out, err, sizeof err) < 0) {
        fprintf(stderr, "kvctl %s: %s %s\n", cmd, opt, err);
        return -1;
    }
    return 0;
}

int kvctl_cl_option(struct kern_cl_opts *o, const char *name, const char *val)
{
    if (!strcmp(name, "--cl-weights")) {
        if (strcmp(val, "map") && strcmp(val, "copy") && strcmp(val, "auto")) {
            fprintf(stderr, "kvctl: --cl-weights %s: map, copy or auto\n", val);
            return -EINVAL;
        }
        o->weights = val;
        return 0;
    }
    bool plat = !strcmp(name, "--cl-platform");
    if (!plat && strcmp(name, "--cl-device"))
        return -ENOENT;
    long v;
    int rc = kvctl_parse_long(name, val, 0, 64, &v);
    if (rc < 0)
        return rc;
    *(plat ? &o->platform : &o->device) = (int)v;
    return 0;
}

/* A number in [lo, hi]; the message names the option and the range. */
static int parse_float_in(const char *opt, const char *s, double lo, double hi, float *out)
{
    double v;
    if (util_parse_double(s, -FLT_MAX, FLT_MAX, 0, &v, NULL, 0) < 0) {
        fprintf(stderr, "%s: '%s' is not a number\n", opt, s);
        return -EINVAL;
    }
    if (!(v >= lo && v <= hi)) {
        fprintf(stderr, "%s: %s is out of range [%g, %g]\n", opt, s, lo, hi);
        return -ERANGE;
    }
    *out = (float)v;
    return 0;
}

int kvctl_parse_tokens(const char *s, uint32_t max, int32_t **out, uint32_t *n)
{
    *out = NULL;
    *n = 0;
    size_t cap = 1;
    for (const char *p = s; *p; p++)
        cap += *p == ',' || *p == ' ';
    if (cap > max) {
        fprintf(stderr, "--tokens: more than %u tokens\n", max);
        return -EINVAL;
    }
    int32_t *t = malloc(cap * sizeof *t);
    if (!t)
        return -ENOMEM;
    const char *p = s;
    while (*p) {
        while (*p == ',' || *p == ' ')
            p++;
        if (!*p)
            break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX || (*end && *end != ',' && *end != ' ')) {
            fprintf(stderr, "--tokens: '%s' is not a list of token ids\n", s);
            free(t);
            return -EINVAL;
        }
        t[(*n)++] = (int32_t)v;
        p = end;
    }
    *out = t;
    return 0;
}

/* Whether --seed was given (a CLI runs one command per process). */
static bool seed_given;

int kvctl_sampling_opt(int c, const char *arg, struct model_sampler_params *sp)
{
    long v;
    int rc;
    switch (c) {
    /* Ranges: temperature 0 (greedy) to 100; top-p and min-p are probabilities; the
     * penalties as OpenAI's API bounds them; repeat penalty above 0 (1: off). */
    case KVCTL_OPT_TEMP: return parse_float_in("--temp", arg, 0, 100, &sp->temperature);
    case KVCTL_OPT_TOPK:
        if ((rc = kvctl_parse_long("--top-k", arg, 0, INT32_MAX, &v)) == 0)
            sp->top_k = (int32_t)v;
        return rc;
    case KVCTL_OPT_TOPP: return parse_float_in("--top-p", arg, 0, 1, &sp->top_p);
    case KVCTL_OPT_MINP: return parse_float_in("--min-p", arg, 0, 1, &sp->min_p);
    case KVCTL_OPT_REPEAT:
        if ((rc = parse_float_in("--repeat-penalty", arg, 0, 100, &sp->repeat_penalty)) == 0 &&
            !(sp->repeat_penalty > 0)) {
            fprintf(stderr, "--repeat-penalty: must be above 0 (1: off)\n");
            return -ERANGE;
        }
        return rc;
    case KVCTL_OPT_REPEAT_N:
        if ((rc = kvctl_parse_long("--repeat-last-n", arg, 0, 1 << 20, &v)) == 0)
            sp->penalty_last_n = (int32_t)v;
        return rc;
    case KVCTL_OPT_FREQ: return parse_float_in("--freq-penalty", arg, -2, 2, &sp->freq_penalty);
    case KVCTL_OPT_PRES: return parse_float_in("--presence-penalty", arg, -2, 2, &sp->presence_penalty);
    case KVCTL_OPT_SEED: {
        /* "-N" wraps as strtoull does, so llama.cpp's habit of "--seed -1" keeps working
         * (it names one fixed seed, 2^64 - 1, here). */
        uint64_t s;
        bool neg = arg[0] == '-';
        if (util_parse_u64(arg + neg, 0, UINT64_MAX, 0, &s, NULL, 0) < 0) {
            fprintf(stderr, "--seed: '%s' is not an unsigned integer\n", arg);
            return -EINVAL;
        }
        sp->seed = neg ? 0 - s : s;
        seed_given = true;
        return 0;
    }
    default: return 1;
    }
}

int kvctl_sampling_seed(struct model_sampler_params *sp, const char *cmd)
{
    if (seed_given)
        return 0;
    /* 53 bits: the seed travels to a ring as a JSON number */
    uint64_t s;
    if (getrandom(&s, sizeof s, 0) != (ssize_t)sizeof s) {
        fprintf(stderr, "%s: no random seed: %s (pass --seed S)\n", cmd, strerror(errno));
        return -EIO;
    }
    sp->seed = s & ((1ull << 53) - 1);
    if (sp->temperature > 0)
        fprintf(stderr, "%s: seed %llu (--seed %llu repeats this run)\n", cmd,
                (unsigned long long)sp->seed, (unsigned long long)sp->seed);
    return 0;
}

int kvctl_stop_add(const char *s, const char **stops, uint32_t max, uint32_t *n)
{
    if (!s[0])
        return 0;
    if (strlen(s) > MODEL_GEN_STOP_MAX) {
        fprintf(stderr, "--stop: a stop string has at most %d bytes, '%.20s...' has %zu\n",
                MODEL_GEN_STOP_MAX, s, strlen(s));
        return -EINVAL;
    }
    if (*n >= max) {
        fprintf(stderr, "--stop: at most %u stop strings\n", max);
        return -EINVAL;
    }
    stops[(*n)++] = s;
    return 0;
}

int kvctl_dump_logits(const char *path, const float *logits, size_t n)
{
    FILE *f = logits ? fopen(path, "wb") : NULL;
    int rc = !logits ? -ENOENT : !f ? -errno : 0;
    if (f && fwrite(logits, sizeof *logits, n, f) != n)
        rc = -EIO;
    if (f && fclose(f) != 0 && rc == 0)
        rc = -EIO;
    if (rc < 0)
        fprintf(stderr, "kvctl generate: no logits to dump to %s\n", path);
    return rc;
}

/* kvctl — the control CLI: one function per command, each in the kvctl/<area>.c of its area.
 * A command gets argv starting at its own name and returns the process exit status
 * (0 ok, 1 failure, 2 usage). Only main.c's main() exits. */
#ifndef KV_KVCTL_H
#define KV_KVCTL_H

#include <stdbool.h>
#include <stdint.h>

#include "util/util.h" /* the shared helpers every command file uses (util_now_s, parsers) */

/* kvctl/gguf.c */
int kvctl_cmd_inspect(int argc, char **argv);
int kvctl_cmd_slice(int argc, char **argv);
int kvctl_cmd_catalog(int argc, char **argv);
int kvctl_cmd_verify(int argc, char **argv);
/* kvctl/synth.c */
int kvctl_cmd_synth(int argc, char **argv);
/* kvctl/model.c */
int kvctl_cmd_generate(int argc, char **argv);
int kvctl_cmd_logits(int argc, char **argv);
int kvctl_cmd_bench(int argc, char **argv);
/* kvctl/tok.c */
int kvctl_cmd_tokenize(int argc, char **argv);
int kvctl_cmd_detokenize(int argc, char **argv);
/* kvctl/ring.c, ring_up.c (ring up), ring_gen.c (generate --ring); their shared parts in
 * kvctl/internal.h */
int kvctl_cmd_ring(int argc, char **argv);
int kvctl_cmd_status(int argc, char **argv);
/* generate through a running ring (kvctl generate --ring ...). */
int kvctl_ring_generate(int argc, char **argv);
/* kvctl/plan.c, profile.c (both over shape.c) */
int kvctl_cmd_plan(int argc, char **argv);
int kvctl_cmd_profile(int argc, char **argv);
/* kvctl/serve.c: the OpenAI-compatible API from one process */
int kvctl_cmd_serve(int argc, char **argv);
/* kvctl/pull.c */
int kvctl_cmd_pull(int argc, char **argv);
/* kvctl/market.c */
int kvctl_cmd_market(int argc, char **argv);

/* kvctl/common.c — helpers the command files share (internal to kvctl). */
struct model_sampler_params;
/* True when argv[1..] holds -h or --help. */
bool kvctl_is_help(int argc, char **argv);
/* A decimal integer in [lo, hi] for option opt: 0, or -EINVAL after a message on stderr. */
int kvctl_parse_long(const char *opt, const char *s, long lo, long hi, long *out);
/* An OpenCL device option (--cl-platform N, --cl-device N, --cl-weights map|copy|auto) into
 * the opencl device's settings o (kernels/kern.h; val is kept, not copied): 0, -EINVAL (said
 * on stderr), or -ENOENT when name is none of them. */
struct kern_cl_opts;
int kvctl_cl_option(struct kern_cl_opts *o, const char *name, const char *val);
/* A decimal integer in [0, max] for option opt of command cmd: 0, or -1 after "kvctl CMD: OPT
 * <why>" on stderr. */
int kvctl_parse_u64(const char *cmd, const char *opt, const char *s, uint64_t max, uint64_t *out);
/* A number for option opt: 0, or -EINVAL after a message on stderr. */
int kvctl_parse_float(const char *opt, const char *s, float *out);
/* A number in [lo, hi] for option opt of command cmd: 0, or -1 after "kvctl CMD: OPT <why>" on
 * stderr. */
int kvctl_parse_num(const char *cmd, const char *opt, const char *s, double lo, double hi, double *out);
/* "1,2,3" (commas or blanks) -> at most max token ids in *out (caller frees) and their count:
 * 0, -EINVAL after a message on stderr, or -ENOMEM. */
int kvctl_parse_tokens(const char *s, uint32_t max, int32_t **out, uint32_t *n);
/* The sampling options generate takes, one process or through a ring: getopt_long codes and
 * the struct option entries (the user includes <getopt.h>). */
enum {
    KVCTL_OPT_TEMP = 1000, KVCTL_OPT_TOPK, KVCTL_OPT_TOPP, KVCTL_OPT_MINP, KVCTL_OPT_REPEAT,
    KVCTL_OPT_REPEAT_N, KVCTL_OPT_FREQ, KVCTL_OPT_PRES, KVCTL_OPT_SEED,
    KVCTL_OPT_SAMPLING_END   /* a command's own codes start here */
};
#define KVCTL_SAMPLING_OPTIONS \
    {"temp", required_argument, 0, KVCTL_OPT_TEMP}, \
    {"top-k", required_argument, 0, KVCTL_OPT_TOPK}, \
    {"top-p", required_argument, 0, KVCTL_OPT_TOPP}, \
    {"min-p", required_argument, 0, KVCTL_OPT_MINP}, \
    {"repeat-penalty", required_argument, 0, KVCTL_OPT_REPEAT}, \
    {"repeat-last-n", required_argument, 0, KVCTL_OPT_REPEAT_N}, \
    {"freq-penalty", required_argument, 0, KVCTL_OPT_FREQ}, \
    {"presence-penalty", required_argument, 0, KVCTL_OPT_PRES}, \
    {"seed", required_argument, 0, KVCTL_OPT_SEED}
/* Applies sampling option c (a KVCTL_OPT_* code) to *sp: 0, -EINVAL after a message on
 * stderr, or 1 when c is not a sampling option. */
int kvctl_sampling_opt(int c, const char *arg, struct model_sampler_params *sp);

/* After the options: without --seed, a random seed (53 bits), printed on stderr as
 * "CMD: seed N ..." when the run samples (temperature > 0), so it can be repeated.
 * 0, or -EIO when no randomness could be had. */
int kvctl_sampling_seed(struct model_sampler_params *sp, const char *cmd);
/* --stop S of generate (one process or through a ring): appends S to stops[*n] (borrowed),
 * at most max of them; an empty S is ignored, as rank 0 ignores it. 0, or -EINVAL after a
 * message on stderr (too many, or S longer than a stop string may be). */
int kvctl_stop_add(const char *s, const char **stops, uint32_t max, uint32_t *n);
/* --dump-logits FILE of generate: n floats, raw little-endian f32. 0, or -errno after
 * "kvctl generate: no logits to dump to FILE" on stderr. */
int kvctl_dump_logits(const char *path, const float *logits, size_t n);

#endif

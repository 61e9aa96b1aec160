/* kvctl — the control CLI: one function per command, each in the kvctl_<area>.c of its area.
 * A command gets argv starting at its own name and returns the process exit status
 * (0 ok, 1 failure, 2 usage). Only kvctl_main.c's main() exits. */
#ifndef KV_KVCTL_H
#define KV_KVCTL_H

/* kvctl_gguf.c */
int kvctl_cmd_inspect(int argc, char **argv);
int kvctl_cmd_slice(int argc, char **argv);
int kvctl_cmd_catalog(int argc, char **argv);
int kvctl_cmd_verify(int argc, char **argv);
int kvctl_cmd_synth(int argc, char **argv);
/* kvctl_model.c */
int kvctl_cmd_generate(int argc, char **argv);
int kvctl_cmd_logits(int argc, char **argv);
int kvctl_cmd_bench(int argc, char **argv);
/* kvctl_tok.c */
int kvctl_cmd_tokenize(int argc, char **argv);
int kvctl_cmd_detokenize(int argc, char **argv);
/* kvctl_ring.c */
int kvctl_cmd_ring(int argc, char **argv);
int kvctl_cmd_status(int argc, char **argv);
/* generate through a running ring (kvctl generate --ring ...). */
int kvctl_ring_generate(int argc, char **argv);
/* kvctl_plan.c */
int kvctl_cmd_plan(int argc, char **argv);
int kvctl_cmd_profile(int argc, char **argv);
/* kvctl_pull.c */
int kvctl_cmd_pull(int argc, char **argv);

#endif

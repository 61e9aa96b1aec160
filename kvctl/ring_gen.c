/* kvctl/ring_gen.c — `kvctl generate --ring`: the one-process generate's options and output,
 * through a running ring's rank 0. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kvctl/internal.h"
#include "model/model.h"
#include "ring/ring.h"
#include "util/err.h"

struct gen_state {
    uint32_t n_done, resumed;
    bool ids, error, done;
    double t_first;
    const char *dump_logits;
    cJSON *done_obj;
};

static int gen_line(const char *line, void *ud)
{
    struct gen_state *g = ud;
    cJSON *o = cJSON_Parse(line);
    if (!o) {
        fprintf(stderr, "kvctl generate: unreadable reply from the ring: %.100s\n", line);
        g->error = true;
        return 1;
    }
    const cJSON *note = cJSON_GetObjectItemCaseSensitive(o, "note");
    if (cJSON_IsString(note)) {   /* the ring broke and was repaired: said here, not in the text */
        fprintf(stderr, "kvctl generate: %s\n", note->valuestring);
        if (!strncmp(note->valuestring, "resumed", 7))
            g->resumed++;
        cJSON_Delete(o);
        return 0;
    }
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, "error");
    if (cJSON_IsString(e)) {
        if (g->n_done)
            printf("\n");
        fflush(stdout);
        fprintf(stderr, "kvctl generate: ring error: %s\n", e->valuestring);
        g->error = true;
        cJSON_Delete(o);
        return 1;
    }
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "done"))) {
        const cJSON *tail = cJSON_GetObjectItemCaseSensitive(o, "s");
        if (cJSON_IsString(tail) && !g->ids)
            fputs(tail->valuestring, stdout);
        g->done = true;
        g->done_obj = o;
        return 1;
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "t");
    if (cJSON_IsNumber(t)) {
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "s");
        g->n_done++;
        if (g->n_done == 1)
            g->t_first = util_now_s();
        if (cJSON_IsString(s) && !g->ids)
            fputs(s->valuestring, stdout);
        else
            printf("%s%.0f", g->n_done > 1 ? " " : "", t->valuedouble);   /* no int cast of a peer's number */
        fflush(stdout);
    }
    cJSON_Delete(o);
    return 0;
}

static void gen_usage(FILE *f)
{
    fprintf(f,
        "usage: kvctl generate --ring DIR|ring.json|unix:SOCKET (-p TEXT | --tokens 1,2,3) [-n N]\n"
        "                      [sampling] [--ignore-eos] [--ids]\n"
        "  The options and output of the one-process generate (kvctl generate --help), through\n"
        "  a running ring: text on stdout, statistics on stderr. unix:SOCKET is rank 0's control\n"
        "  socket (STATE_DIR/kvd.sock on rank 0's host). -m, -t and --ctx are accepted and\n"
        "  ignored: the ring's manifest fixes them.\n"
        "  --dump-logits FILE  write the last position's logits (raw f32) to FILE\n"
        "  --stop S            stop when the text contains S (repeatable)\n"
        "  --client-key KEY    a market ring: the paying client the session is for (kvctl market\n"
        "                      client add), so the ring is credited for it\n"
        "  --draft MODE        several tokens a ring pass, the same text: lookup (prompt-lookup\n"
        "                      drafts), mtp (the model's MTP block, on the last rank), auto (mtp\n"
        "                      where the last rank has it, else lookup) or none (default: rank\n"
        "                      0's kvd stage --draft, none unless set)\n"
        "  --draft-max K       drafts a pass verifies, 1..14 (default: rank 0's, 8)\n");
}

int kvctl_ring_generate(int argc, char **argv)
{
    enum { O_TOK = KVCTL_OPT_SAMPLING_END, O_CTX, O_IEOS, O_IDS, O_RING, O_DUMP, O_STOP, O_MODEL,
           O_CKEY, O_DRAFT, O_DRAFT_MAX };
    static const struct option opts[] = {
        {"ring", required_argument, 0, O_RING}, {"model", required_argument, 0, O_MODEL},
        {"draft", required_argument, 0, O_DRAFT}, {"draft-max", required_argument, 0, O_DRAFT_MAX},
        {"prompt", required_argument, 0, 'p'}, {"n-predict", required_argument, 0, 'n'},
        {"threads", required_argument, 0, 't'}, KVCTL_SAMPLING_OPTIONS,
        {"tokens", required_argument, 0, O_TOK}, {"ctx", required_argument, 0, O_CTX},
        {"ignore-eos", no_argument, 0, O_IEOS}, {"ids", no_argument, 0, O_IDS},
        {"dump-logits", required_argument, 0, O_DUMP}, {"stop", required_argument, 0, O_STOP},
        {"client-key", required_argument, 0, O_CKEY},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    const char *ring = NULL, *prompt = NULL, *toks = NULL, *dump = NULL, *ckey = NULL;
    long n_gen = 64, draft_max = 0;
    bool ignore_eos = false, ids = false;
    const char *draft = NULL;   /* not given: rank 0's --draft decides */
    struct model_sampler_params sp;
    model_sampler_params_default(&sp);
    const char *stops[MODEL_GEN_MAX_STOPS];
    uint32_t n_stops = 0;
    cJSON *req = cJSON_CreateObject();
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:p:n:t:h", opts, NULL)) != -1) {
        int rc = 0;
        switch (c) {
        case O_RING: ring = optarg; break;
        case 'm': case O_MODEL: break;   /* the ring holds the model */
        case 't': break;                 /* threads are the stages' business */
        case 'p': prompt = optarg; break;
        case 'n': rc = kvctl_parse_long("-n", optarg, 0, 1 << 20, &n_gen); break;
        case O_TOK: toks = optarg; break;
        case O_CTX: break;               /* the ring's context is in its manifest */
        case O_IEOS: ignore_eos = true; break;
        case O_IDS: ids = true; break;
        case O_DUMP: dump = optarg; break;
        case O_STOP: rc = kvctl_stop_add(optarg, stops, MODEL_GEN_MAX_STOPS, &n_stops); break;
        case O_CKEY: ckey = optarg; break;
        case O_DRAFT:
            if (model_draft_mode(optarg) < 0) {
                fprintf(stderr, "kvctl generate: --draft '%s': lookup, mtp, auto or none\n", optarg);
                rc = -EINVAL;
            }
            draft = optarg;
            break;
        case O_DRAFT_MAX: rc = kvctl_parse_long("--draft-max", optarg, 1, MODEL_DRAFT_MAX, &draft_max); break;
        case 'h': gen_usage(stdout); cJSON_Delete(req); return 0;
        default:
            if ((rc = kvctl_sampling_opt(c, optarg, &sp)) > 0) {
                gen_usage(stderr);
                cJSON_Delete(req);
                return 2;
            }
        }
        if (rc < 0) {
            cJSON_Delete(req);
            return 2;
        }
    }
    if (!ring || (!prompt && !toks) || optind != argc) {
        gen_usage(stderr);
        cJSON_Delete(req);
        return 2;
    }
    if (kvctl_sampling_seed(&sp, "kvctl generate") < 0) {
        cJSON_Delete(req);
        return 2;
    }
    cJSON_AddStringToObject(req, "op", "generate");
    if (toks) {
        int32_t *t;
        uint32_t n;
        if (kvctl_parse_tokens(toks, 1u << 20, &t, &n) < 0) {
            cJSON_Delete(req);
            return 2;
        }
        cJSON *a = cJSON_AddArrayToObject(req, "tokens");
        for (uint32_t i = 0; i < n; i++)
            cJSON_AddItemToArray(a, cJSON_CreateNumber((double)t[i]));
        free(t);
    } else
        cJSON_AddStringToObject(req, "prompt", prompt);
    cJSON_AddNumberToObject(req, "n", (double)n_gen);
    cJSON_AddNumberToObject(req, "seed", (double)sp.seed);
    cJSON_AddNumberToObject(req, "temp", sp.temperature);
    cJSON_AddNumberToObject(req, "top_k", sp.top_k);
    cJSON_AddNumberToObject(req, "top_p", sp.top_p);
    cJSON_AddNumberToObject(req, "min_p", sp.min_p);
    cJSON_AddNumberToObject(req, "repeat_penalty", sp.repeat_penalty);
    cJSON_AddNumberToObject(req, "repeat_last_n", sp.penalty_last_n);
    cJSON_AddNumberToObject(req, "freq_penalty", sp.freq_penalty);
    cJSON_AddNumberToObject(req, "presence_penalty", sp.presence_penalty);
    cJSON_AddBoolToObject(req, "ignore_eos", ignore_eos);
    cJSON_AddBoolToObject(req, "logits", dump != NULL);
    if (ckey)
        cJSON_AddStringToObject(req, "client_key", ckey);
    if (draft)
        cJSON_AddStringToObject(req, "draft", draft);
    if (draft_max)
        cJSON_AddNumberToObject(req, "draft_max", (double)draft_max);
    cJSON *stop = cJSON_AddArrayToObject(req, "stop");
    for (uint32_t i = 0; i < n_stops; i++)
        cJSON_AddItemToArray(stop, cJSON_CreateString(stops[i]));
    if (sp.seed > (1ull << 53))
        fprintf(stderr, "kvctl generate: warning: --seed above 2^53 loses precision in the request\n");
    char *line = cJSON_PrintUnformatted(req);
    cJSON_Delete(req);
    char sock[PATH_MAX];
    if (!strncmp(ring, "unix:", 5))
        snprintf(sock, sizeof sock, "%s", ring + 5);
    else {
        char dir[PATH_MAX];
        if (kvctl__ring_dir(ring, dir, sizeof dir) < 0) {
            free(line);
            return 1;
        }
        kvctl__rank_sock(dir, 0, sock, sizeof sock);
    }
    struct gen_state g = {.ids = ids, .dump_logits = dump};
    char err[KV_ERR_MAX];
    double t0 = util_now_s();
    int rc = ring_ctl_request(sock, line, gen_line, &g, 120000, err, sizeof err);
    free(line);
    if (rc < 0) {
        fprintf(stderr, "kvctl generate: %s\n", err);
        return 1;
    }
    if (g.error)
        return 1;
    if (!g.done) {
        if (g.n_done)
            printf("\n");
        /* rank 0 holds every session's history: when its stream ends without "done" it is
         * gone (killed, crashed, stopped), and so is the session; no repair brings it back */
        fprintf(stderr, "kvctl generate: the ring closed the stream before the end: rank 0 (%s) died or "
                "stopped; the session's history lived there, so it cannot resume\n", sock);
        return 1;
    }
    printf("\n");
    fflush(stdout);   /* the text, then the statistics */
    double t2 = util_now_s();
    double pms = util_json_number(g.done_obj, "prompt_ms", 0) / 1e3;
    double gms = util_json_number(g.done_obj, "gen_ms", 0) / 1e3;
    uint32_t n_prompt = (uint32_t)util_json_number(g.done_obj, "n_prompt", 0);
    uint32_t n_gen_done = (uint32_t)util_json_number(g.done_obj, "n_gen", 0);
    (void)t0;
    (void)t2;
    /* Same statistics line as the one-process generate (token counts as it counts them). */
    fprintf(stderr, "prompt: %u tokens in %.3f s (%.2f tok/s); generation: %u tokens in %.3f s "
            "(%.2f tok/s)\n", n_prompt, pms, pms > 0 ? n_prompt / pms : 0.0, n_gen_done, gms,
            gms > 0 && n_gen_done > 1 ? (n_gen_done - 1) / gms : 0.0);
    /* drafting: as the one-process generate reports it, the passes being ring passes */
    double passes = util_json_number(g.done_obj, "passes", 0);
    double proposed = util_json_number(g.done_obj, "drafts", 0);
    if (proposed > 0)
        fprintf(stderr, "drafts: %.0f proposed, %.0f accepted; %.0f passes for %u tokens (%.2f "
                "tokens a pass)\n", proposed, util_json_number(g.done_obj, "drafts_accepted", 0),
                passes, n_gen_done, passes > 0 ? n_gen_done / passes : 0.0);
    if (g.resumed)
        fprintf(stderr, "kvctl generate: resumed %u time%s after the ring was repaired; the text is "
                "the uninterrupted one\n", g.resumed, g.resumed == 1 ? "" : "s");
    const cJSON *why = cJSON_GetObjectItemCaseSensitive(g.done_obj, "reason");
    if (cJSON_IsString(why) && !strcmp(why->valuestring, "context"))
        fprintf(stderr, "kvctl generate: stopped at the context length: %u prompt + %u generated "
                "tokens (the ring's ctx)\n", n_prompt, n_gen_done);
    int ret = 0;
    if (dump) {   /* as the one-process generate writes them */
        const cJSON *lg = cJSON_GetObjectItemCaseSensitive(g.done_obj, "logits");
        int n = cJSON_IsArray(lg) ? cJSON_GetArraySize(lg) : 0;
        float *v = n > 0 ? malloc((size_t)n * sizeof *v) : NULL;
        if (v) {
            int i = 0;
            for (const cJSON *x = lg->child; x && i < n; x = x->next)
                v[i++] = (float)x->valuedouble;
        }
        if (kvctl_dump_logits(dump, v, v ? (size_t)n : 0) < 0)
            ret = 1;
        free(v);
    }
    cJSON_Delete(g.done_obj);
    return ret;
}

/* tool-ring-clients: concurrent sessions against a running ring, timed on the client side
 * (used by tests/bench.sh).
 *
 *   tool-ring-clients [--draft K] [--prompt TEXT] SOCK SESSIONS TOKENS [PROMPT_LEN[,...]]
 *       Opens SESSIONS generate requests at once on rank 0's control socket SOCK (one thread
 *       each, released together), greedy, --ignore-eos, TOKENS tokens each, session i's prompt
 *       being PROMPT_LEN (default 3) distinct small ids; with a list, session i takes its
 *       (i mod count)-th length (mixed prompts: prefill chunks beside decode steps); with
 *       --prompt every session's prompt is TEXT. --draft K asks for prompt-lookup drafts, K a
 *       pass ("draft": "lookup", "draft_max": K); --draft 0 for none ("draft": "none");
 *       without it the request leaves drafting to rank 0's default. Every
 *       streamed token line is
 *       timestamped. Prints one line per session (tokens, time to the first token, decode
 *       rate, the longest gap between two consecutive tokens) and a last line
 *       "total: sessions S tokens T wall_s W tok_s R max_gap_ms G ttft_max_ms F worst_session I
 *       ttft_mean_ms M" where W runs from the first request to the last end, F and M the
 *       longest and the mean time to a first token. Exits 1 when a session fails or is cut short.
 * Bounded: at most 256 sessions, 65536 tokens, 64 prompt tokens each and 16 lengths. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "ring/ring.h"
#include "util/err.h"
#include "util/util.h"

#define MAX_SESSIONS 256

struct client {
    pthread_t th;
    unsigned idx;
    char *req;
    double t_start, t_first, t_prev, t_end, max_gap;
    unsigned n_tok;
    bool done;
    int rc;
    char err[KV_ERR_MAX];
};

static const char *sock_path;
static pthread_barrier_t go;

static int on_line(const char *line, void *ud)
{
    struct client *c = ud;
    double now = util_now_s();
    cJSON *o = cJSON_Parse(line);
    if (!o) {
        snprintf(c->err, sizeof c->err, "unreadable reply: %.100s", line);
        return 1;
    }
    int stop = 0;
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, "error");
    if (cJSON_IsString(e)) {
        snprintf(c->err, sizeof c->err, "ring error: %s", e->valuestring);
        stop = 1;
    } else if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "done"))) {
        c->done = true;
        stop = 1;
    } else if (cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(o, "t"))) {
        if (c->n_tok == 0)
            c->t_first = now;
        else if (now - c->t_prev > c->max_gap)
            c->max_gap = now - c->t_prev;
        c->t_prev = now;
        c->n_tok++;
    }
    cJSON_Delete(o);
    return stop;
}

static void *run(void *arg)
{
    struct client *c = arg;
    pthread_barrier_wait(&go);
    c->t_start = util_now_s();
    c->rc = ring_ctl_request(sock_path, c->req, on_line, c, 300000, c->err, sizeof c->err);
    c->t_end = util_now_s();
    return NULL;
}

static long arg_long(const char *s, long lo, long hi, const char *what)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "tool-ring-clients: %s '%s': expected %ld..%ld\n", what, s, lo, hi);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv)
{
    long draft = -1;
    const char *text = NULL;
    while (argc > 2 && (!strcmp(argv[1], "--draft") || !strcmp(argv[1], "--prompt"))) {
        if (!strcmp(argv[1], "--draft"))
            draft = arg_long(argv[2], 0, 14, "--draft");
        else
            text = argv[2];
        argc -= 2;
        argv += 2;
    }
    if (argc < 4 || argc > 5) {
        fprintf(stderr, "usage: tool-ring-clients [--draft K] [--prompt TEXT] SOCK SESSIONS TOKENS "
                "[PROMPT_LEN[,PROMPT_LEN...]]\n");
        return 2;
    }
    sock_path = argv[1];
    unsigned n = (unsigned)arg_long(argv[2], 1, MAX_SESSIONS, "SESSIONS");
    long n_gen = arg_long(argv[3], 1, 65536, "TOKENS");
    unsigned plens[16] = {3}, n_plen = 1;
    if (argc > 4) {
        char list[256];
        snprintf(list, sizeof list, "%s", argv[4]);
        n_plen = 0;
        for (char *save = NULL, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            if (n_plen == 16) {
                fprintf(stderr, "tool-ring-clients: PROMPT_LEN '%s': at most 16 lengths\n", argv[4]);
                return 2;
            }
            plens[n_plen++] = (unsigned)arg_long(t, 1, 64, "PROMPT_LEN");
        }
        if (!n_plen)
            arg_long(argv[4], 1, 64, "PROMPT_LEN");   /* says what is expected, exits */
    }
    static struct client cs[MAX_SESSIONS];
    pthread_barrier_init(&go, NULL, n);
    for (unsigned i = 0; i < n; i++) {
        struct client *c = &cs[i];
        c->idx = i;
        cJSON *q = cJSON_CreateObject();
        cJSON_AddStringToObject(q, "op", "generate");
        if (text) {
            cJSON_AddStringToObject(q, "prompt", text);
        } else {
            /* ids 1, 100+i, 200+i, ...: distinct prompts, all below any test vocabulary's size */
            cJSON *a = cJSON_AddArrayToObject(q, "tokens");
            cJSON_AddItemToArray(a, cJSON_CreateNumber(1));
            for (unsigned k = 1, plen = plens[i % n_plen]; k < plen; k++)
                cJSON_AddItemToArray(a, cJSON_CreateNumber(100 * k + i % 97));
        }
        cJSON_AddNumberToObject(q, "n", (double)n_gen);
        cJSON_AddNumberToObject(q, "temp", 0);
        cJSON_AddBoolToObject(q, "ignore_eos", 1);
        if (draft >= 0)
            cJSON_AddStringToObject(q, "draft", draft ? "lookup" : "none");
        if (draft > 0)
            cJSON_AddNumberToObject(q, "draft_max", (double)draft);
        c->req = cJSON_PrintUnformatted(q);
        cJSON_Delete(q);
        if (!c->req) {
            fprintf(stderr, "tool-ring-clients: out of memory\n");
            return 1;
        }
        if (pthread_create(&c->th, NULL, run, c) != 0) {
            fprintf(stderr, "tool-ring-clients: cannot start thread %u\n", i);
            return 1;
        }
    }
    int bad = 0;
    double t0 = 0, t1 = 0, max_gap = 0, ttft_max = 0, ttft_sum = 0;
    unsigned long total = 0, worst = 0;
    for (unsigned i = 0; i < n; i++) {
        struct client *c = &cs[i];
        pthread_join(c->th, NULL);
        if (i == 0 || c->t_start < t0)
            t0 = c->t_start;
        if (c->t_end > t1)
            t1 = c->t_end;
        total += c->n_tok;
        double ttft = c->n_tok ? c->t_first - c->t_start : 0;
        double dec = c->n_tok > 1 ? (c->n_tok - 1) / (c->t_prev - c->t_first) : 0;
        printf("session %u: %u tokens, first after %.1f ms, decode %.2f tok/s, max gap %.1f ms\n",
               i, c->n_tok, ttft * 1e3, dec, c->max_gap * 1e3);
        if (c->rc < 0 || !c->done || c->err[0]) {
            fprintf(stderr, "tool-ring-clients: session %u: %s\n", i,
                    c->err[0] ? c->err : "the ring closed the stream before the end");
            bad = 1;
        }
        if (c->max_gap > max_gap)
            max_gap = c->max_gap, worst = i;
        free(c->req);
        if (ttft > ttft_max)
            ttft_max = ttft;
        ttft_sum += ttft;
    }
    pthread_barrier_destroy(&go);
    printf("total: sessions %u tokens %lu wall_s %.3f tok_s %.2f max_gap_ms %.1f ttft_max_ms %.1f "
           "worst_session %lu ttft_mean_ms %.1f\n", n, total, t1 - t0,
           t1 > t0 ? total / (t1 - t0) : 0.0, max_gap * 1e3, ttft_max * 1e3, worst,
           n ? ttft_sum / n * 1e3 : 0.0);
    return bad;
}

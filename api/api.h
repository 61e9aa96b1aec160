/* api/api.h — an OpenAI-compatible HTTP API (docs/api.md) served by the project's HTTP server
 * (net/net.h) on a libuv loop, over an abstract generator: start a generation (prompt tokens,
 * sampling parameters, a token budget, stop strings), receive its tokens as they come (with
 * the raw logits of each when logprobs are asked for), cancel it. Two generators exist: rank 0
 * of a ring (kvd/stage/api.c, driving the ring's sessions) and one process (kvctl serve, a
 * model on a worker thread). This module parses and checks requests, renders chat templates,
 * tokenises, holds back text that may turn out to be a stop string, and answers in JSON or as
 * server-sent events; it never computes on the loop thread. Every call is on the loop thread. */
#ifndef KV_API_API_H
#define KV_API_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

struct uv_loop_s;
struct gguf_file;

/* ================================ generator ================================ */

struct api_gen_req {
    const int32_t *prompt;       /* [n_prompt] ids, 1 <= n_prompt < n_ctx (borrowed) */
    uint32_t n_prompt;
    struct model_sampler_params sp;
    uint32_t max_tokens;         /* tokens to generate at most (the context also ends it) */
    const char *const *stops;    /* [n_stops] stop strings (borrowed): generation ends once
                                  * the text holds one */
    uint32_t n_stops;
    bool logits;                 /* every token comes with its position's raw logits */
    bool ignore_eos;             /* end-of-text tokens do not end it (llama.cpp's extension) */
    int draft;                   /* "draft": -1 not said (the server's default), else an enum
                                  * model_draft: "none", "lookup" (prompt-lookup drafts), "mtp"
                                  * (the model's MTP block), "auto" */
    uint32_t draft_max;          /* "draft_max": drafts a pass verifies, 1..MODEL_DRAFT_MAX;
                                  * 0 not said */
    const char *api_key;         /* the Bearer key the request was let in with, or NULL (no
                                  * key file); borrowed for the start call */
};

struct api_gen_token {
    int32_t id;
    const char *text;            /* the text this token completes (model_gen_step), borrowed */
    size_t len;
    const float *logits;         /* [n_vocab] raw logits it was sampled from, or NULL */
};

/* Where a generation's results go, on the loop thread; never called from inside start. */
struct api_gen_sink {
    void (*token)(void *ud, const struct api_gen_token *t);
    /* The last call: reason is model_gen_reason_name's ("eos", "length", "context", "stop"),
     * or NULL with error set; tail is the text still pending at the end (borrowed). */
    void (*done)(void *ud, const char *reason, const char *error, const char *tail,
                 size_t tail_len);
};

struct api_gen_ops {
    /* Start one generation: 0 and *handle, or -EBUSY (no room: 429), -ENOTCONN (not ready:
     * 503), -EINVAL / -ERANGE (the request: 400), another code (500); err says why. */
    int (*start)(void *impl, const struct api_gen_req *r, const struct api_gen_sink *sink,
                 void *sink_ud, void **handle, char *err, size_t errlen);
    /* Stop it now and free it everywhere (round the ring); no sink call follows. */
    void (*cancel)(void *impl, void *handle);
    /* Whether generations can start now; why not in why. */
    bool (*ready)(void *impl, char *why, size_t n);
    /* The generator's own Prometheus lines (per-stage ms/token, link bytes) into buf
     * (NUL-terminated, cut at cap). */
    void (*metrics)(void *impl, char *buf, size_t cap);
};

struct api_generator {
    const struct api_gen_ops *ops;
    void *impl;
    const struct model_vocab *vocab;   /* text in and out; NULL: token ids only */
    const struct gguf_file *gguf;      /* tokenizer.chat_template; may be NULL */
    uint32_t n_ctx, n_vocab;
    const char *model_id;              /* the name /v1/models lists (copied) */
};

/* ================================= server ================================= */

#define API_MAX_TOP_LOGPROBS 20

struct api_config {
    const char *listen;          /* "HOST:PORT" (port 0 picks one: api_server_port) */
    const char *key_file;        /* one API key a line ('#' comments; "sha256:HEX" names a key
                                  * by its SHA-256); NULL: no keys */
    bool key_file_reload;        /* re-read key_file when it changes (checked at most once a
                                  * second); it may hold no key, which lets nobody in */
    uint32_t max_sessions;       /* generations at once, 429 beyond (0: 16) */
    uint32_t max_body;           /* request body bytes, 413 beyond (0: 1 MiB) */
    const char *chat_template;   /* a family name; NULL: the model's template */
    /* An address other than loopback serves strangers: the server refuses to start there
     * without key_file unless open says that is meant. */
    bool open;
    const char *tls_cert, *tls_key; /* PEM files: serve HTTPS (both or neither) */
    uint32_t keepalive_s;        /* a kept-alive connection idle this long closes (0: 30);
                                  * an answer may take longer (API_ANSWER_MS) */
};
/* How long a non-streamed answer may take. */
#define API_ANSWER_MS (600u * 1000)
#define API_KEEPALIVE_DEFAULT_S 30

/* Check c before anything is opened (api_server_new does it too, so a caller may do it
 * early, before loading a model): 0, or -EPERM for an address others can reach with neither
 * key_file nor open (anyone there could use the model), -EINVAL for half a TLS pair or a
 * keep-alive time over an answer's; err says which and what to give. */
int api_config_check(const struct api_config *c, char *err, size_t errlen);

struct api_server;
/* Listen and serve: 0, or a negative code with err naming the address, key file, TLS file
 * or limit that failed (-EPERM: an address other than loopback with neither keys nor open).
 * gen is copied (its impl and vocab/gguf borrowed for s's life). */
int api_server_new(struct api_server **out, struct uv_loop_s *loop, const struct api_config *c,
                   const struct api_generator *gen, char *err, size_t errlen);
int api_server_port(const struct api_server *s);
/* Generations running now. */
uint32_t api_server_sessions(const struct api_server *s);
/* Cancel every generation, stop listening, close the connections and free s; done (may be
 * NULL) runs once everything is freed. */
void api_server_close(struct api_server *s, void (*done)(void *ud), void *ud);

#endif

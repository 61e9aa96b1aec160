/* audit.c — audits of credited work (docs/market.md, "Audits"): checks a stage cannot tell
 * from traffic, because they are made after the fact, of sessions it already served. When a
 * receipt is credited, the sending node is audited with probability audit_rate: the market
 * picks a position of that session at random and keeps the audit pending on the node (a blob,
 * "audit/<model>/<node>"); the node's next lease heartbeat carries it ("audit"); the node
 * answers from its row log (POST /v1/leases/audit) with the rows it received up to that
 * position and the row it sent there, each with its Merkle proof against the roots its
 * receipts committed to; the market checks the proofs, then recomputes the sent row from the
 * received ones on the window's weights (--verify-model, on a thread of libuv's pool) and
 * compares by NMSE; rank 0's answer also opens the TOKENs it received, and the ids it fed
 * after them must be theirs (feed_check). The API delivers and takes the answers (leases.c, checks.c); a failed
 * audit goes back to it through the verdict callback (checks.c's kvd_market__probe_fail: lease
 * over, credit voided, claims refused). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <uv.h>

#include "kvd/kvd.h"
#include "kvd/market/internal.h"
#include "model/model.h"
#include "ring/ring.h"
#include "util/util.h"

/* The last rank's token is found wrong when it was reported as the sampler's favourite
 * (logprob >= log 0.5) and the recomputed logits put another token this far ahead of it. */
#define AUDIT_HEAD_LEAD 4.0
/* With the session's sampling: how much wider than the sampler's own the set of the tokens a
 * node may have drawn is taken (judge_kept) */
#define AUDIT_KEPT_P 0.01f
#define AUDIT_KEPT_MINP 0.5f
#define AUDIT_KEPT_MARGIN 0.05f
#define AUDIT_LOGITS_MAX (16u << 20)   /* a TOKEN's first logits: a vocabulary of 4M entries */
#define AUDIT_VERIFY_THREADS 2
#define AUDIT_QUEUE_MAX 4   /* audits queued behind the pending one (each has the deadline's
                             * time once its turn comes: 4 x 300 s, well within the hour the
                             * nodes keep their row logs) */

struct kvd_market_audit {
    uv_loop_t *loop;
    struct kvd_market_store *st;
    struct kvd_market_config cfg;
    kvd_market_audit_verdict_cb verdict;
    void *ud;
};

struct job {
    uv_work_t w;
    struct kvd_market_audit *au;
    char model[65], node[65], id[17], session[17];
    uint32_t first, last, n_embd, n, rank, pos;
    bool embed, head;
    int32_t *tokens;        /* rank 0: [n] the ids embedded */
    float *x;               /* [n][n_embd]: the rows received, then the window's output */
    float *sent;            /* [n_embd]: the row the node sent (ranks but the last) */
    uint32_t toks[RING_TOKENS_MAX];   /* the last rank's TOKEN: its tokens (sampled from the */
    float lps[RING_TOKENS_MAX];       /* last tok_n rows), their logprobs, and */
    float *logits;          /* [n_logits] the logits it sent with its first (NULL: none) */
    uint32_t n_logits;
    bool raw;               /* from an older protocol's TOKEN: logits only where n_vocab fit */
    uint32_t tok_n;         /* the tokens that TOKEN carried (1 for an older protocol's) */
    uint8_t sampling[RING_SAMPLING_LEN];   /* the last edge's ends: the session's sampling */
    const uint8_t *sampling_in;            /* sampling, or NULL: none came */
    char note[160];         /* what a pass checked beyond the row (logged with it) */
    /* the verdict */
    int result;             /* 1 pass, 0 fail, -1 the verifier could not run */
    double nmse;
    char why[400];
};

int kvd_market__audit_new(struct kvd_market_audit **out, struct uv_loop_s *loop,
                          struct kvd_market_store *st, const struct kvd_market_config *cfg,
                          kvd_market_audit_verdict_cb verdict, void *ud)
{
    struct kvd_market_audit *au = calloc(1, sizeof *au);
    if (!au)
        return -ENOMEM;
    *au = (struct kvd_market_audit){.loop = loop, .st = st, .cfg = *cfg, .verdict = verdict,
                                    .ud = ud};
    *out = au;
    return 0;
}

void kvd_market__audit_free(struct kvd_market_audit *au)
{
    free(au);
}

static double unit(void)
{
    uint32_t r = 0;
    if (RAND_bytes((unsigned char *)&r, sizeof r) != 1)
        r = (uint32_t)rand();
    return r / 4294967296.0;
}

/* The node's audit record (a fresh one when it has none); key gets its key. */
static cJSON *record_load(struct kvd_market_audit *au, const char *model, const char *node,
                          char key[160])
{
    snprintf(key, 160, "audit/%s/%s", model, node);
    cJSON *r = kvd_market__blob_load(au->st, key);
    if (!cJSON_IsObject(r)) {
        cJSON_Delete(r);
        r = cJSON_CreateObject();
    }
    return r;
}

/* The last audit's result, the pending one cleared, and the node's count of that result;
 * the first audit queued behind it becomes the pending one, its deadline counted from now
 * (after a failure, which voided the node's credit, the queue goes). */
static void record_last(cJSON *r, const char *id, const char *result, double nmse,
                        const char *why, double now)
{
    cJSON *c = cJSON_GetObjectItemCaseSensitive(r, "counts");
    if (!cJSON_IsObject(c)) {
        cJSON_DeleteItemFromObject(r, "counts");
        c = cJSON_AddObjectToObject(r, "counts");
    }
    util_json_set(c, result, cJSON_CreateNumber(util_json_number(c, result, 0) + 1));
    cJSON_DeleteItemFromObject(r, "pending");
    cJSON_DeleteItemFromObject(r, "last");
    cJSON *l = cJSON_AddObjectToObject(r, "last");
    cJSON_AddStringToObject(l, "id", id);
    cJSON_AddStringToObject(l, "result", result);
    if (isfinite(nmse))
        cJSON_AddNumberToObject(l, "nmse", nmse);
    if (why)
        cJSON_AddStringToObject(l, "why", why);
    cJSON_AddNumberToObject(l, "at", now);
    cJSON *q = cJSON_GetObjectItemCaseSensitive(r, "queued");
    if (!strcmp(result, "fail") || !cJSON_IsArray(q) || !cJSON_GetArraySize(q)) {
        cJSON_DeleteItemFromObject(r, "queued");
        return;
    }
    cJSON *next = cJSON_DetachItemFromArray(q, 0);
    util_json_set(next, "deadline", cJSON_CreateNumber(now + util_json_number(next, "deadline_s", 0)));
    cJSON_DeleteItemFromObject(next, "deadline_s");
    cJSON_AddItemToObject(r, "pending", next);
    kvd_log(KVD_LOG_INFO, "audit %s (session %s, position %.0f): its turn, answer within %.0f s",
            util_json_string(next, "id") ? util_json_string(next, "id") : "?",
            util_json_string(next, "session") ? util_json_string(next, "session") : "?",
            util_json_number(next, "position", 0), util_json_number(next, "deadline", now) - now);
}

int kvd_market__audit_note(struct kvd_market_audit *au, const struct kvd_market_audit_work *w,
                           double now)
{
    if (!au || !(au->cfg.audit_rate > 0) || w->t0 != 0 || w->t1 <= w->t0 ||
        unit() >= au->cfg.audit_rate)
        return 0;   /* not drawn; a range from past 0 has no KV to recompute it from */
    char key[160];
    cJSON *r = record_load(au, w->model, w->node, key);
    /* one pending at a time, the draws meanwhile queued behind it: a node that knows one is
     * pending (its heartbeats carry it) gets no window free of audits by answering late */
    cJSON *qd = NULL;
    int nq = 0;
    if (cJSON_GetObjectItemCaseSensitive(r, "pending")) {
        qd = cJSON_GetObjectItemCaseSensitive(r, "queued");
        if (!cJSON_IsArray(qd)) {
            cJSON_DeleteItemFromObject(r, "queued");
            qd = cJSON_AddArrayToObject(r, "queued");
        }
        if ((nq = cJSON_GetArraySize(qd)) >= AUDIT_QUEUE_MAX) {
            kvd_log(KVD_LOG_DEBUG, "audit of node %.16s... not drawn: %d queued behind the "
                    "pending one", w->node, nq);
            cJSON_Delete(r);
            return 0;
        }
    }
    /* the positions whose rows (f32, base64) and proofs (two a position: the last rank opens
     * outputs and inputs from p to its first token) fit in an answer of --audit-answer-kib,
     * under the API's 1 MiB body cap: the audited position is drawn among the first of them */
    uint64_t per = (uint64_t)w->n_embd * 4 / 3 * 4 + 2 * RING_MERKLE_DEPTH_MAX * 67 + 64;
    uint64_t fit = (uint64_t)(au->cfg.audit_answer_kib * 1024) / per, span = w->t1 - w->t0;
    if (fit < 1)
        fit = 1;
    uint32_t pos = (uint32_t)(w->t0 + (uint64_t)(unit() * (double)(span < fit ? span : fit)));
    uint8_t idb[8];
    char id[17];
    if (RAND_bytes(idb, sizeof idb) != 1)
        memset(idb, 0, sizeof idb);
    util_hex_encode(idb, sizeof idb, id);
    cJSON *p = cJSON_CreateObject();
    if (qd)
        cJSON_AddItemToArray(qd, p);
    else
        cJSON_AddItemToObject(r, "pending", p);
    cJSON_AddStringToObject(p, "id", id);
    cJSON_AddStringToObject(p, "session", w->session);
    if (w->key)
        cJSON_AddStringToObject(p, "key", w->key);
    cJSON_AddNumberToObject(p, "rank", w->rank);
    cJSON_AddNumberToObject(p, "pred", w->rank ? w->rank - 1 : w->n_ranks - 1);
    cJSON_AddNumberToObject(p, "window", w->window);
    cJSON *ly = cJSON_AddArrayToObject(p, "layers");
    cJSON_AddItemToArray(ly, cJSON_CreateNumber(w->first));
    cJSON_AddItemToArray(ly, cJSON_CreateNumber(w->last));
    cJSON_AddNumberToObject(p, "n_embd", w->n_embd);
    cJSON_AddBoolToObject(p, "embed", w->rank == 0);
    cJSON_AddBoolToObject(p, "head", w->rank + 1 == w->n_ranks);
    cJSON *tk = cJSON_AddArrayToObject(p, "tokens");
    cJSON_AddItemToArray(tk, cJSON_CreateNumber((double)w->t0));
    cJSON_AddItemToArray(tk, cJSON_CreateNumber((double)w->t1));
    cJSON_AddNumberToObject(p, "position", pos);
    /* the last rank opens the empty leaves from pos to its first token (a prompt samples
     * none): no further than this many positions from t0, so that the answer fits */
    cJSON_AddNumberToObject(p, "max_positions", (double)fit);
    cJSON_AddStringToObject(p, "sent", w->digest);
    if (qd)   /* its deadline counts from its turn */
        cJSON_AddNumberToObject(p, "deadline_s", au->cfg.audit_deadline_s);
    else
        cJSON_AddNumberToObject(p, "deadline", now + au->cfg.audit_deadline_s);
    int rc = kvd_market__blob_save(au->st, key, r);
    cJSON_Delete(r);
    if (rc == 0 && qd)
        kvd_log(KVD_LOG_INFO, "audit %s of node %.16s...: rank %u, session %s, position %u "
                "(queued behind %d: answer within %.0f s of its turn)", id, w->node, w->rank,
                w->session, pos, nq + 1, au->cfg.audit_deadline_s);
    else if (rc == 0)
        kvd_log(KVD_LOG_INFO, "audit %s of node %.16s...: rank %u, session %s, position %u "
                "(answer within %.0f s)", id, w->node, w->rank, w->session, pos,
                au->cfg.audit_deadline_s);
    return rc;
}

/* The blob key of part k of audit id's answer; k < 0: the prefix of all its parts. */
static void part_key(char key[KVD_MARKET_KEY_MAX], const char *model, const char *node,
                     const char *id, int k)
{
    int n = snprintf(key, KVD_MARKET_KEY_MAX, "auditpart/%.64s/%.64s/%.16s/", model, node, id);
    if (k >= 0 && n > 0 && n < KVD_MARKET_KEY_MAX)
        snprintf(key + n, (size_t)(KVD_MARKET_KEY_MAX - n), "%03d", k);
}

/* The parts kept of audit id's answer (a node that never sent the last one), removed. */
static void parts_drop(struct kvd_market_audit *au, const char *model, const char *node,
                       const char *id)
{
    char prefix[KVD_MARKET_KEY_MAX], (*keys)[KVD_MARKET_KEY_MAX] = malloc(64 * sizeof *keys);
    size_t nk = 0;
    part_key(prefix, model, node, id, -1);
    char after[KVD_MARKET_KEY_MAX] = "";
    while (keys && au->st->ops->blob_keys(au->st->impl, prefix, after, keys, 64, &nk) == 0 && nk) {
        for (size_t i = 0; i < nk; i++)
            if (au->st->ops->blob_put(au->st->impl, keys[i], NULL))
                goto done;   /* the store failed: what is left goes with the next try */
        if (nk < 64)
            break;
        snprintf(after, sizeof after, "%s", keys[nk - 1]);
    }
done:
    free(keys);
}

int kvd_market__audit_due(struct kvd_market_audit *au, const char *model, const char *node,
                          double now, cJSON **challenge, char *why, size_t n)
{
    *challenge = NULL;
    if (!au)
        return 0;
    char key[160];
    cJSON *r = record_load(au, model, node, key);
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(r, "pending");
    const char *id = util_json_string(p, "id");
    int rc = 0;
    if (!id || cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "verifying"))) {
        cJSON_Delete(r);   /* none, or answered and being recomputed */
        return 0;
    }
    double deadline = util_json_number(p, "deadline", 0);
    if (now > deadline) {
        snprintf(why, n, "audit %s (session %s, position %.0f): no answer before its deadline", id,
                 util_json_string(p, "session") ? util_json_string(p, "session") : "?", util_json_number(p, "position", 0));
        char idc[17];
        snprintf(idc, sizeof idc, "%s", id);
        parts_drop(au, model, node, idc);
        record_last(r, idc, "fail", INFINITY, why, now);
        rc = kvd_market__blob_save(au->st, key, r);
        cJSON_Delete(r);
        return rc ? rc : 1;
    }
    cJSON *c = cJSON_CreateObject();
    static const char *const keep[] = {"id", "session", "rank", "window", "layers", "embed",
                                       "head", "tokens", "position", "max_positions"};
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++)
        cJSON_AddItemToObject(c, keep[i], cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(p, keep[i]), 1));
    cJSON_AddNumberToObject(c, "deadline_s", deadline - now);
    *challenge = c;
    cJSON_Delete(r);
    return 0;
}

/* base64 text (its length a multiple of 4) into malloc'd bytes *out, *len: 0, -EINVAL, -ENOMEM. */
static int b64_decode(const char *b64, uint8_t **out, uint32_t *len)
{
    size_t bl = strlen(b64);
    *out = NULL;
    *len = 0;
    if (bl % 4 || bl > RING_MARKET_BODY_MAX)
        return -EINVAL;
    uint8_t *b = malloc(bl / 4 * 3 + 1);
    if (!b)
        return -ENOMEM;
    int got = bl ? EVP_DecodeBlock(b, (const unsigned char *)b64, (int)bl) : 0;
    if (got < 0) {
        free(b);
        return -EINVAL;
    }
    /* EVP_DecodeBlock counts the padding as bytes */
    if (bl && b64[bl - 1] == '=')
        got -= 1 + (b64[bl - 2] == '=');
    *out = b;
    *len = (uint32_t)got;
    return 0;
}

/* One opened leaf {"pos", "row": base64, "path": [hex...]} at position want of the tree of
 * [t0, t1) whose digest is root (the tree's root, or with sampling, that root folded with it:
 * the last edge's, ring_receipt_fold): its row bytes (malloc'd into *row, *len), or
 * -EBADMSG/-EINVAL with why. */
static int open_leaf(const cJSON *o, uint32_t want, uint32_t t0, uint32_t t1, const uint8_t root[32],
                     const uint8_t *sampling, const char *what, uint8_t **row, uint32_t *len,
                     char *why, size_t n)
{
    *row = NULL;
    *len = 0;
    const cJSON *path = cJSON_GetObjectItemCaseSensitive(o, "path"), *h;
    const char *b64 = util_json_string(o, "row");
    size_t bl = b64 ? strlen(b64) : 0;
    if (util_json_number(o, "pos", -1) != want || !b64 || bl % 4 || bl > RING_MARKET_BODY_MAX ||
        !cJSON_IsArray(path) || cJSON_GetArraySize(path) > RING_MERKLE_DEPTH_MAX) {
        snprintf(why, n, "%s at position %u: expected {pos %u, row (base64), path (at most %d "
                 "hashes)}", what, want, want, RING_MERKLE_DEPTH_MAX);
        return -EINVAL;
    }
    uint8_t p[RING_MERKLE_DEPTH_MAX][32], leaf[32];
    size_t k = 0;
    cJSON_ArrayForEach(h, path) {
        if (!cJSON_IsString(h) || strlen(h->valuestring) != 64 || util_hex_decode(h->valuestring, p[k], 32)) {
            snprintf(why, n, "%s at position %u: a path hash is not 64 hex digits", what, want);
            return -EINVAL;
        }
        k++;
    }
    uint8_t *b;
    uint32_t got;
    int rc = b64_decode(b64, &b, &got);
    if (rc) {
        snprintf(why, n, rc == -ENOMEM ? "out of memory" : "%s at position %u: row is not base64",
                 what, want);
        return rc;
    }
    ring_merkle_leaf(want, b, (size_t)got, leaf);
    uint8_t top[32];
    bool ok = ring_merkle_root_from(leaf, want - t0, t1 - t0, (const uint8_t (*)[32])p, k, top);
    if (ok && sampling)
        ring_receipt_fold(top, sampling, top);
    if (!ok || memcmp(top, root, 32)) {
        free(b);
        snprintf(why, n, "%s at position %u: its Merkle proof does not lead to the root the "
                 "receipt committed to", what, want);
        return -EBADMSG;
    }
    *row = b;
    *len = got;
    return 0;
}

/* Wire bytes of one boundary row into x[n_embd]: 0, or -EBADMSG when it is no row of f32 or f16. */
static int row_decode(const uint8_t *b, uint32_t len, uint32_t n_embd, float *x)
{
    uint32_t ds = n_embd ? len / n_embd : 0;
    if ((ds != 4 && ds != 2) || len != ds * n_embd)
        return -EBADMSG;
    ring_wire_decode(b, n_embd, ds, x);
    return 0;
}

static void job_free(struct job *j)
{
    if (!j)
        return;
    free(j->tokens);
    free(j->x);
    free(j->sent);
    free(j->logits);
    free(j);
}

struct kept {
    struct ring_open_params op;
    struct model_sampler *smp;   /* NULL: the session's tokens are not judged by their set */
    float *cp;                   /* [n_vocab] scratch: the sampler takes its logits in place */
};

/* The sampler of j's session for judge_kept, made once for a TOKEN's tokens (k->smp NULL when
 * it has no sampling, penalties, or parameters no sampler takes). */
static void kept_open(const struct job *j, uint32_t n_vocab, struct kept *k)
{
    uint8_t open[RING_OPEN_LEN] = {0};
    struct model_sampler_params sp;
    *k = (struct kept){0};
    if (!j->sampling_in)
        return;
    memcpy(open, j->sampling, RING_SAMPLING_LEN);
    ring_open_decode(open, &k->op);
    kvd_sampler_params(&sp, &k->op);
    if ((sp.penalty_last_n > 0 && (sp.repeat_penalty != 1.0f || sp.freq_penalty != 0.0f ||
                                   sp.presence_penalty != 0.0f)) ||
        !isfinite(sp.temperature) || !isfinite(sp.top_p) || !isfinite(sp.min_p))
        return;
    if (sp.top_p < 1.0f)
        sp.top_p = sp.top_p + AUDIT_KEPT_P < 1.0f ? sp.top_p + AUDIT_KEPT_P : 1.0f;
    sp.min_p *= AUDIT_KEPT_MINP;
    if (!(k->cp = malloc((size_t)n_vocab * sizeof *k->cp)) || model_sampler_new(&k->smp, &sp, n_vocab)) {
        free(k->cp);
        *k = (struct kept){0};
    }
}

static void kept_close(struct kept *k)
{
    model_sampler_free(k->smp);
    free(k->cp);
}

/* The last rank's token against the set its sampler draws from (model_sampler_kept) for the
 * recomputed logits lg (kp: kept_open), by the session's sampling (j->sampling: the last
 * edge's digests fold it in, so it is what the last rank received). The node's logits differ from the recomputed ones
 * (another backend, f16 weights or kernels: within the probes' NMSE), so the set is taken
 * wider: top-p at AUDIT_KEPT_P more mass, min-p at AUDIT_KEPT_MINP of it, and a token passes
 * within twice that noise (at least AUDIT_KEPT_MARGIN) below the set's lowest logit.
 * Penalties need the history, which the answer does not hold: those sessions (and parameters
 * no sampler takes) are not judged here. 1 in the set, 0 not (j->why), -1 not judged. */
static int judge_kept(struct job *j, struct kept *kp, uint32_t t, uint32_t pos, const float *lg,
                      uint32_t n_vocab)
{
    const int32_t *ids;
    const float *probs;
    if (!kp->smp)
        return -1;
    memcpy(kp->cp, lg, (size_t)n_vocab * sizeof *kp->cp);
    int k = model_sampler_kept(kp->smp, kp->cp, &ids, &probs);
    if (k < 1)
        return -1;
    /* the margin: the noise a node's logits may carry and still pass as the recomputed ones
     * (NMSE RING_PROBE_TOL: an RMS difference of sqrt(TOL x mean square)), twice, at least
     * AUDIT_KEPT_MARGIN */
    double ms = 0;
    for (uint32_t v = 0; v < n_vocab; v++)
        ms += (double)lg[v] * lg[v];
    double margin = 2.0 * sqrt(RING_PROBE_TOL * ms / n_vocab);
    if (!(margin >= AUDIT_KEPT_MARGIN))
        margin = AUDIT_KEPT_MARGIN;
    float edge = INFINITY;
    bool in = false;
    for (int i = 0; i < k; i++) {
        in = in || (uint32_t)ids[i] == t;
        if (lg[ids[i]] < edge)
            edge = lg[ids[i]];
    }
    if (in || lg[t] >= edge - margin)
        return 1;
    snprintf(j->why, sizeof j->why, "position %u: token %u is none the sampler could draw "
             "(temperature %g, top_k %d, top_p %g, min_p %g): its logit %.3f is below %.3f, the "
             "lowest of the %d it draws from, by more than %.3f", pos, t, kp->op.temperature,
             kp->op.top_k, kp->op.top_p, kp->op.min_p, lg[t], edge, k, margin);
    return 0;
}

/* The last rank's TOKEN against the recomputed logits lg[tok_n][n_vocab] of the rows its tokens
 * were sampled from (docs/market.md, "Audits"): each token of the vocabulary with a logprob at
 * most 0, in the set the session's sampling draws from (or, without it, not trailing the
 * favourite it claims to be), and the first's logits, when they went along, within tolerance. */
static void judge_head(struct job *j, const float *lg, uint32_t n_vocab)
{
    j->result = 1;
    if (j->logits && j->raw && j->n_logits != n_vocab) {
        free(j->logits);   /* an older TOKEN's drafts or tokens, not one token's logits */
        j->logits = NULL;
    }
    if (j->logits && j->n_logits != n_vocab) {
        j->result = 0;
        snprintf(j->why, sizeof j->why, "position %u: the logits sent hold %u values, the "
                 "vocabulary %u", j->pos, j->n_logits, n_vocab);
        return;
    }
    if (j->logits) {   /* the logits went along: compare them */
        j->nmse = ring_probe_nmse(j->logits, lg, n_vocab);
        if (!(j->nmse <= RING_PROBE_TOL)) {
            j->result = 0;
            snprintf(j->why, sizeof j->why, "position %u: the logits sent are off by NMSE "
                     "%.3g (tolerance %g)", j->pos, j->nmse, RING_PROBE_TOL);
            return;
        }
    }
    int kept = -1;
    struct kept kp;
    kept_open(j, n_vocab, &kp);
    for (uint32_t i = 0; i < j->tok_n && j->result; i++, lg += n_vocab) {
        uint32_t t = j->toks[i], pos = j->pos + i;
        float lp = j->lps[i];
        if (t >= n_vocab || !isfinite(lp) || lp > 1e-3f) {
            j->result = 0;
            snprintf(j->why, sizeof j->why, "position %u: token %u with logprob %g is no sample "
                     "of a vocabulary of %u", pos, t, lp, n_vocab);
            break;
        }
        if ((kept = judge_kept(j, &kp, t, pos, lg, n_vocab)) == 0) {
            j->result = 0;
            break;
        }
        uint32_t g = 0;
        for (uint32_t v = 1; v < n_vocab; v++)
            if (lg[v] > lg[g])
                g = v;
        if (lp >= logf(0.5f) && t != g && lg[g] - lg[t] >= AUDIT_HEAD_LEAD) {
            j->result = 0;
            snprintf(j->why, sizeof j->why, "position %u: token %u reported as the favourite "
                     "(logprob %.3f), but token %u leads it by %.2f in the recomputed logits",
                     pos, t, lp, g, lg[g] - lg[t]);
        }
    }
    kept_close(&kp);
    if (!j->result)
        return;
    snprintf(j->note, sizeof j->note, "a TOKEN's %u tokens judged%s%s", j->tok_n,
             j->logits ? ", its logits compared" : "",
             kept > 0 ? ", in the set its sampling draws from" : "");
}

/* The answer's "logits": base64 pieces, joined into malloc'd *out, *len bytes (at most
 * AUDIT_LOGITS_MAX): 0, -EINVAL (none, or not base64 pieces), -E2BIG, -ENOMEM. */
static int logits_join(const cJSON *arr, uint8_t **out, uint32_t *len)
{
    const cJSON *it;
    uint8_t *all = NULL;
    size_t n = 0;
    int rc = cJSON_IsArray(arr) && cJSON_GetArraySize(arr) > 0 ? 0 : -EINVAL;
    cJSON_ArrayForEach(it, arr) {
        uint8_t *b = NULL, *na;
        uint32_t bl = 0;
        if (rc || !cJSON_IsString(it) || (rc = b64_decode(it->valuestring, &b, &bl))) {
            rc = rc ? rc : -EINVAL;
            break;
        }
        if (n + bl > AUDIT_LOGITS_MAX || !(na = realloc(all, n + bl + 1))) {
            free(b);
            rc = n + bl > AUDIT_LOGITS_MAX ? -E2BIG : -ENOMEM;
            break;
        }
        all = na;
        memcpy(all + n, b, bl);
        n += bl;
        free(b);
    }
    if (rc) {
        free(all);
        return rc;
    }
    *out = all;
    *len = (uint32_t)n;
    return 0;
}

/* The last rank's TOKEN at j->pos: from a summary (ring_token_leaf_parse), its tokens, their
 * logprobs and, when the logits went along, the first's logits, the answer's "logits" (pieces,
 * logits_join) checked against the hash the summary holds; from the raw payload of an older
 * protocol, i32 token | f32 logprob [| one token's logits]. 0, or -EINVAL/-EBADMSG/-ENOMEM
 * with why. */
static int head_token(struct job *j, const uint8_t *row, uint32_t len, const cJSON *body,
                      char *why, size_t n)
{
    struct ring_token_leaf tl;
    const uint8_t *lg = NULL;
    uint32_t nl = 0;
    uint8_t *b = NULL;
    int rc = ring_token_leaf_parse(row, len, &tl);
    if (rc == -ENOENT) {
        if (len < 8) {
            snprintf(why, n, "position %u: a TOKEN of %u bytes", j->pos, len);
            return -EBADMSG;
        }
        j->toks[0] = util_le32_get(row);
        j->tok_n = 1;
        /* its logprob is at byte 4 only if the TOKEN carried one token, which the raw payload
         * does not say: none is taken (the favourite rule is not applied) */
        j->lps[0] = -1.0f;
        if ((len - 8) % 4 == 0 && (len - 8) / 4 > RING_DRAFTS_MAX) {
            lg = row + 8;
            nl = (len - 8) / 4;
            j->raw = true;
        }
    } else if (rc) {
        snprintf(why, n, "position %u: the TOKEN's summary is malformed", j->pos);
        return -EBADMSG;
    } else {
        j->tok_n = tl.n;
        for (uint32_t i = 0; i < tl.n; i++) {
            j->toks[i] = util_le32_get(tl.tokens + 4 * i);
            memcpy(&j->lps[i], tl.logprobs + 4 * i, 4);
        }
        if (tl.logits_sha) {
            uint8_t md[EVP_MAX_MD_SIZE];
            unsigned ml = 0;
            if ((rc = logits_join(cJSON_GetObjectItemCaseSensitive(body, "logits"), &b, &nl))) {
                snprintf(why, n, rc == -ENOMEM ? "out of memory" : "position %u: the logits "
                         "went along with the TOKEN: expected them (\"logits\", base64 pieces "
                         "of at most %u bytes all told)", j->pos, AUDIT_LOGITS_MAX);
                return rc == -ENOMEM ? rc : -EINVAL;
            }
            if (!EVP_Digest(b, nl, md, &ml, EVP_sha256(), NULL) || ml != 32 ||
                memcmp(md, tl.logits_sha, 32) || nl % 4) {
                snprintf(why, n, "position %u: the logits opened are not the ones whose hash the "
                         "TOKEN's summary holds", j->pos);
                free(b);
                return -EBADMSG;
            }
            lg = b;
            nl /= 4;
        }
    }
    if (lg) {
        j->logits = malloc((size_t)nl * sizeof *j->logits + 1);
        if (j->logits)
            memcpy(j->logits, lg, (size_t)nl * 4);
        j->n_logits = nl;
    }
    free(b);
    return lg && !j->logits ? -ENOMEM : 0;
}

/* Rank 0's ids after its prompt against the TOKENs it received (docs/market.md, "Audits"): the
 * answer's "received" opens rank 0's received leaves t0 .. q against its received root. A
 * TOKEN at leaf y of n tokens gave positions y + 1 .. y + n: the first n - 1 are drafts rank 0
 * fed before the TOKEN accepted them, the last the token rank 0 feeds next, so the next
 * TOKEN's leaf is y + n. So from the first TOKEN on, every position a TOKEN gave must hold its
 * token, except the last one's where no TOKEN came from it (the session ended there, and the
 * rejected drafts after it were never a token of it). Leaves before the first TOKEN (the
 * prompt, or a history a replay cleared) hold no TOKEN. Summaries only: the raw payloads of an
 * older protocol are not checked. 0, or -EINVAL/-EBADMSG/-ENOMEM with why. */
static int feed_check(struct job *j, const cJSON *body, uint32_t t0, uint32_t t1,
                      const uint8_t rroot[32], char *why, size_t n)
{
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(body, "received"), *o;
    if (cJSON_GetArraySize(in) != (int)j->n) {
        snprintf(why, n, "received: expected %u openings (positions %u to %u)", j->n, t0, j->pos);
        return -EINVAL;
    }
    uint8_t **rows = calloc(j->n, sizeof *rows);
    uint32_t *lens = calloc(j->n, sizeof *lens), i = 0;
    int rc = rows && lens ? 0 : -ENOMEM;
    cJSON_ArrayForEach(o, in) {
        if (rc || (rc = open_leaf(o, t0 + i, t0, t1, rroot, j->sampling_in, "the TOKEN received", &rows[i],
                                  &lens[i], why, n)))
            break;
        i++;
    }
    int64_t next = -1;   /* the leaf of the next TOKEN, from the one before */
    uint32_t n_tok = 0, n_ids = 0, n_drafts = 0;
    for (i = 0; rc == 0 && i < j->n; i++) {
        struct ring_token_leaf tl;
        uint32_t y = t0 + i;
        if (!lens[i])
            continue;
        int pr = ring_token_leaf_parse(rows[i], lens[i], &tl);
        if (pr == -ENOENT)
            break;   /* an older protocol's leaves */
        if (pr) {
            snprintf(why, n, "position %u: the TOKEN received there is malformed", y);
            rc = -EBADMSG;
            break;
        }
        if (next >= 0 && y != next) {
            snprintf(why, n, "position %u: a TOKEN came from it, but the one before gave the "
                     "tokens up to %" PRId64 " and rank 0 fed %" PRId64 " next", y, next, next);
            rc = -EBADMSG;
            break;
        }
        for (uint32_t k = 0; k < tl.n && y + 1 + k <= j->pos; k++) {
            uint32_t x = y + 1 + k, want = util_le32_get(tl.tokens + 4 * k);
            bool fed_on = k + 1 < tl.n || lens[x - t0] > 0;   /* a TOKEN came from x */
            if (fed_on && (uint32_t)j->tokens[x - t0] != want) {
                snprintf(why, n, "position %u: rank 0 embedded token %d, but the TOKEN it "
                         "received at %u gave token %u there", x, j->tokens[x - t0], y, want);
                rc = -EBADMSG;
            }
            n_ids += fed_on;
            n_drafts += k + 1 < tl.n;
        }
        next = (int64_t)y + tl.n;
        n_tok++;
    }
    snprintf(j->note, sizeof j->note, "%u ids fed from %u TOKENs received checked, %u of them "
             "drafts they accepted", n_ids, n_tok, n_drafts);
    for (i = 0; rows && i < j->n; i++)
        free(rows[i]);
    free(rows);
    free(lens);
    if (rc == -ENOMEM)
        snprintf(why, n, "out of memory");
    return rc;
}

/* On a pool thread: the window over the opened inputs, the output compared. */
static void job_run(uv_work_t *w)
{
    struct job *j = w->data;
    struct model *m = NULL;
    struct model_exec *e = NULL;
    float *lg = NULL;
    char err[256];
    j->result = -1;
    j->nmse = INFINITY;
    int rc = model_open(&m, j->au->cfg.verify_model, (int)j->first, (int)j->last, err, sizeof err);
    if (rc == 0 && model_get_hparams(m)->n_embd != j->n_embd) {
        snprintf(err, sizeof err, "the verify model's n_embd is %u, the audited one's %u",
                 model_get_hparams(m)->n_embd, j->n_embd);
        rc = -EINVAL;
    }
    if (rc == 0)
        rc = model_exec_new(&e, m, AUDIT_VERIFY_THREADS, j->n, j->n < 32 ? j->n : 32);
    if (rc == 0)
        rc = model_session_new(e, 1);
    if (rc == 0 && j->embed)
        rc = model_embed(e, j->tokens, j->n, j->x);
    if (rc == 0)
        rc = model_window_run(e, 1, 0, j->n, j->x);
    const float *out = j->x + (size_t)(j->n - 1) * j->n_embd;
    if (rc == 0 && j->head) {   /* the rows the TOKEN's tokens were sampled from */
        uint32_t nv = model_get_hparams(m)->n_vocab;
        lg = malloc((size_t)nv * j->tok_n * sizeof *lg);
        rc = lg ? model_head(e, j->x + (size_t)(j->n - j->tok_n) * j->n_embd, j->tok_n, lg)
                : -ENOMEM;
        if (rc == 0)
            judge_head(j, lg, nv);
    } else if (rc == 0) {
        j->nmse = ring_probe_nmse(j->sent, out, j->n_embd);
        j->result = j->nmse <= RING_PROBE_TOL;
        if (!j->result)
            snprintf(j->why, sizeof j->why, "position %u: the row sent is off by NMSE %.3g from "
                     "the recomputed one (tolerance %g)", j->pos, j->nmse, RING_PROBE_TOL);
    }
    if (rc && j->result < 0)
        snprintf(j->why, sizeof j->why, "the verifier could not run: %s",
                 rc == -ENOMEM ? "out of memory" : err[0] ? err : strerror(-rc));
    free(lg);
    model_exec_free(e);
    model_free(m);
}

/* Back on the loop: the verdict in a transaction of its own. */
static void job_done(uv_work_t *w, int status)
{
    struct job *j = w->data;
    struct kvd_market_audit *au = j->au;
    if (status == UV_ECANCELED) {
        job_free(j);
        return;
    }
    const char *res = j->result > 0 ? "pass" : j->result == 0 ? "fail" : "inconclusive";
    char note[sizeof j->note + 4] = "";
    if (j->result > 0 && j->note[0])
        snprintf(note, sizeof note, " (%s)", j->note);
    kvd_log(j->result > 0 ? KVD_LOG_INFO : KVD_LOG_WARN, "audit %s of node %.16s... (rank %u, "
            "session %s, position %u): %s%s%s%s", j->id, j->node, j->rank, j->session, j->pos,
            res, j->why[0] ? ": " : "", j->why, note);
    if (au->st->ops->begin(au->st->impl)) {
        kvd_log(KVD_LOG_ERROR, "audit %s: store: %s", j->id, au->st->err);
        job_free(j);
        return;
    }
    char key[160];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);   /* the ledger's clock: Unix seconds */
    double now = (double)ts.tv_sec + ts.tv_nsec * 1e-9;
    cJSON *r = record_load(au, j->model, j->node, key);
    const char *pid = util_json_string(cJSON_GetObjectItemCaseSensitive(r, "pending"), "id");
    int rc = 0;
    if (!pid || strcmp(pid, j->id)) {   /* settled meanwhile (its deadline, say) */
        au->st->ops->rollback(au->st->impl);
        cJSON_Delete(r);
        job_free(j);
        return;
    }
    record_last(r, j->id, res, j->nmse, j->why[0] ? j->why : NULL, now);
    rc = kvd_market__blob_save(au->st, key, r);
    if (rc == 0 && j->result == 0)
        rc = au->verdict(au->ud, j->model, j->node, j->why, now);
    if (rc == 0 && au->st->ops->commit(au->st->impl))
        rc = -EIO;
    if (rc) {
        au->st->ops->rollback(au->st->impl);
        kvd_log(KVD_LOG_ERROR, "audit %s: store: %s", j->id, au->st->err);
    }
    cJSON_Delete(r);
    job_free(j);
}

/* An answer too large for one request comes in parts (docs/market.md, "Audits"), each with
 * "part" k of "parts" (2 to AUDIT_PARTS_MAX) and a piece of the answer's arrays, in order. */
#define AUDIT_PARTS_MAX 512
static const char *const part_arrays[] = RING_AUDIT_ARRAYS;


/* A part before the last is kept as a blob (1, or the store's failure); at the last, the earlier
 * parts' arrays and its own, in order, into *merged (0; the kept parts removed). The parts come
 * in order: part 0 starts the answer over (what was kept of it goes), each next one must be the
 * one pending says ("parts_n", "parts_next"), else -EINVAL with why; what they keep is bounded
 * by the answer's budget and one request. A whole answer: 0, *merged NULL (kept parts go). */
static int parts_gather(struct kvd_market_audit *au, const char *model, const char *node,
                        const char *id, const cJSON *body, cJSON *pending, cJSON **merged,
                        char *why, size_t n)
{
    char key[KVD_MARKET_KEY_MAX];
    *merged = NULL;
    double np = util_json_number(body, "parts", 1), k = util_json_number(body, "part", 0);
    bool kept_some = util_json_number(pending, "parts_n", 0) > 0;
    if (np == 1 && k == 0) {
        if (kept_some)
            parts_drop(au, model, node, id);
        return 0;
    }
    if (!(np >= 2 && np <= AUDIT_PARTS_MAX && np == floor(np) && k >= 0 && k < np &&
          k == floor(k))) {
        snprintf(why, n, "parts: expected part k (0 to parts - 1) of parts (2 to %d)", AUDIT_PARTS_MAX);
        return -EINVAL;
    }
    if (k == 0) {
        if (kept_some)
            parts_drop(au, model, node, id);
    } else if (np != util_json_number(pending, "parts_n", 0) ||
               k != util_json_number(pending, "parts_next", 0)) {
        snprintf(why, n, "parts: part %.0f of %.0f out of order (expected part %.0f of %.0f): send "
                 "the answer again from part 0", k, np, util_json_number(pending, "parts_next", 0),
                 util_json_number(pending, "parts_n", 0));
        return -EINVAL;
    }
    if (k < np - 1) {
        cJSON *keep = cJSON_CreateObject();
        for (size_t i = 0; i < sizeof part_arrays / sizeof part_arrays[0]; i++) {
            const cJSON *a = cJSON_GetObjectItemCaseSensitive(body, part_arrays[i]);
            if (cJSON_IsArray(a))
                cJSON_AddItemToObject(keep, part_arrays[i], cJSON_Duplicate(a, 1));
        }
        char *v = cJSON_PrintUnformatted(keep);
        cJSON_Delete(keep);
        if (!v)
            return -ENOMEM;
        double kept = (k == 0 ? 0 : util_json_number(pending, "kept_bytes", 0)) + (double)strlen(v);
        if (kept > au->cfg.audit_answer_kib * 1024 + RING_MARKET_BODY_MAX) {
            snprintf(why, n, "parts: the answer's parts take more than %.0f KiB", au->cfg.audit_answer_kib);
            free(v);
            return -EINVAL;
        }
        part_key(key, model, node, id, (int)k);
        int rc = au->st->ops->blob_put(au->st->impl, key, v);
        free(v);
        util_json_set(pending, "kept_bytes", cJSON_CreateNumber(kept));
        util_json_set(pending, "parts_n", cJSON_CreateNumber(np));
        util_json_set(pending, "parts_next", cJSON_CreateNumber(k + 1));
        return rc ? rc : 1;
    }
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", id);
    for (int i = 0; i <= (int)k; i++) {
        cJSON *kept = NULL;
        if (i < (int)k) {
            part_key(key, model, node, id, i);
            if (!(kept = kvd_market__blob_load(au->st, key))) {
                snprintf(why, n, "audit %s: part %d of %.0f is missing: send the answer again", id,
                         i, np);
                cJSON_Delete(m);
                return -EINVAL;
            }
        }
        const cJSON *src = kept ? kept : body;
        for (size_t a = 0; a < sizeof part_arrays / sizeof part_arrays[0]; a++) {
            const cJSON *arr = cJSON_GetObjectItemCaseSensitive(src, part_arrays[a]), *it;
            if (!cJSON_IsArray(arr))
                continue;
            cJSON *to = cJSON_GetObjectItemCaseSensitive(m, part_arrays[a]);
            if (!to)
                to = cJSON_AddArrayToObject(m, part_arrays[a]);
            cJSON_ArrayForEach(it, arr)
                cJSON_AddItemToArray(to, cJSON_Duplicate(it, 1));
        }
        cJSON_Delete(kept);
    }
    parts_drop(au, model, node, id);
    *merged = m;
    return 0;
}

int kvd_market__audit_answer(struct kvd_market_audit *au, const char *model, const char *node,
                             const cJSON *body, double now, bool *settled, const char **verdict,
                             char *why, size_t n)
{
    *settled = false;
    *verdict = "pass";
    char key[160];
    cJSON *r = record_load(au, model, node, key);
    cJSON *p = cJSON_GetObjectItemCaseSensitive(r, "pending");
    const char *id = util_json_string(body, "id"), *pid = util_json_string(p, "id"), *session = util_json_string(p, "session");
    const char *sent_hex = util_json_string(p, "sent");
    const cJSON *tk = cJSON_GetObjectItemCaseSensitive(p, "tokens");
    struct job *j = NULL;
    cJSON *merged = NULL;
    uint8_t *row = NULL;
    uint32_t len = 0;
    int rc;
    if (!id || !pid || strcmp(id, pid) || !session || !sent_hex || cJSON_GetArraySize(tk) != 2 ||
        cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "verifying"))) {
        snprintf(why, n, "no audit %s is pending on this node", id ? id : "(no id)");
        rc = -ENOENT;
        goto out;
    }
    uint32_t t0 = (uint32_t)cJSON_GetArrayItem(tk, 0)->valuedouble;
    uint32_t t1 = (uint32_t)cJSON_GetArrayItem(tk, 1)->valuedouble;
    uint32_t pos = (uint32_t)util_json_number(p, "position", 0);
    uint32_t rank = (uint32_t)util_json_number(p, "rank", 0);
    uint32_t pred = (uint32_t)util_json_number(p, "pred", 0);
    bool embed = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "embed"));
    bool head = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "head"));
    uint8_t sroot[32], rroot[32];
    util_hex_decode(sent_hex, sroot, 32);
    if (now > util_json_number(p, "deadline", 0)) {
        snprintf(why, n, "audit %s: answered after its deadline", id);
        rc = -EBADMSG;
        goto out;
    }
    if (!(embed && head)) {   /* the received root: the node's own countersignature of its
                               * predecessor (rank 0's: of the last rank's TOKENs) */
        struct kvd_market_receipt rc_;
        const char *lk = util_json_string(p, "key") ? util_json_string(p, "key") : session;   /* the ledger's key */
        rc = au->st->ops->receipt_get(au->st->impl, lk, pred, t0, t1, KVD_SIDE_RECEIVED, &rc_);
        if (rc == -ENOENT) {
            snprintf(why, n, "audit %s: this node's received side of session %s (rank %u, tokens "
                     "[%u, %u)) is not in yet: submit it, then answer", id, session, pred, t0, t1);
            rc = -EAGAIN;
            goto out;
        }
        if (rc)
            goto out;
        util_hex_decode(rc_.digest, rroot, 32);
    }
    /* an answer in parts: kept until the last, then judged whole (after the checks above, so
     * that a late or early answer costs the market no merge) */
    rc = parts_gather(au, model, node, id, body, p, &merged, why, n);
    if (rc == 1) {   /* a part kept: the rest to come */
        *verdict = "more";
        rc = kvd_market__blob_save(au->st, key, r);
        goto out;
    }
    if (rc)
        goto out;
    const cJSON *last = body;   /* the whole answer, or its last part */
    if (merged)
        body = merged;
    j = calloc(1, sizeof *j);
    if (!j) {
        rc = -ENOMEM;
        goto out;
    }
    j->au = au;
    snprintf(j->model, sizeof j->model, "%s", model);
    snprintf(j->node, sizeof j->node, "%s", node);
    snprintf(j->id, sizeof j->id, "%s", id);
    snprintf(j->session, sizeof j->session, "%.16s", session);
    const cJSON *ly = cJSON_GetObjectItemCaseSensitive(p, "layers");
    j->first = (uint32_t)cJSON_GetArrayItem(ly, 0)->valuedouble;
    j->last = (uint32_t)cJSON_GetArrayItem(ly, 1)->valuedouble;
    j->n_embd = (uint32_t)util_json_number(p, "n_embd", 0);
    j->rank = rank;
    j->embed = embed;
    j->head = head;
    /* the last edge's ends: the session's sampling, which their digests fold in (an answer from
     * a row log of an older protocol has none: its digests fold nothing) */
    const char *smp = embed != head ? util_json_string(last, "sampling") : NULL;
    if (smp) {
        uint8_t *b = NULL;
        uint32_t bl = 0;
        if ((rc = b64_decode(smp, &b, &bl)) || bl != RING_SAMPLING_LEN) {
            free(b);
            snprintf(why, n, rc == -ENOMEM ? "out of memory" : "sampling: expected base64 of the "
                     "OPEN's first %u bytes", RING_SAMPLING_LEN);
            rc = rc == -ENOMEM ? rc : -EINVAL;
            goto out;
        }
        memcpy(j->sampling, b, RING_SAMPLING_LEN);
        free(b);
        j->sampling_in = j->sampling;
    }
    /* the outputs: the sent row at pos; the last rank's TOKEN at the first position from pos
     * on that has one, the empty leaves before it opened */
    const cJSON *outs = cJSON_GetObjectItemCaseSensitive(body, "outputs"), *o;
    int no = cJSON_GetArraySize(outs);
    if (!cJSON_IsArray(outs) || no < 1 || (!head && no != 1) || (uint64_t)pos + (uint64_t)no > t1) {
        snprintf(why, n, "outputs: expected %s from position %u", head ? "the openings" : "one opening",
                 pos);
        rc = -EINVAL;
        goto out;
    }
    uint32_t q = pos;
    cJSON_ArrayForEach(o, outs) {
        free(row);
        if ((rc = open_leaf(o, q, t0, t1, sroot, head ? j->sampling_in : NULL, "the row sent", &row, &len, why, n)))
            goto out;
        bool last = o->next == NULL;
        if (head && !last && len) {
            snprintf(why, n, "outputs: position %u has a token; the opening must stop there", q);
            rc = -EINVAL;
            goto out;
        }
        if (!last)
            q++;
    }
    /* the last rank's openings stop at the range's end or at the answer's cap (pending records
     * from before the cap have none: the end only) */
    double cap = util_json_number(p, "max_positions", 0);
    bool capped = cap >= 1 && (double)(q - t0) + 1 >= cap;
    if (cap >= 1 && (double)(q - t0) + 1 > cap) {   /* more than the market takes to recompute */
        snprintf(why, n, "outputs: position %u is past the %.0f positions an answer may open", q, cap);
        rc = -EINVAL;
        goto out;
    }
    if (head && !len) {
        if (q + 1 != t1 && !capped) {
            snprintf(why, n, "outputs: position %u has no token and is not the last one", q);
            rc = -EINVAL;
            goto out;
        }
        /* the range's end: nothing was sampled from the position on (a pass); the cap: the
         * answer could not reach a token, nothing was judged (inconclusive: it costs the node
         * nothing and the next credited receipt may be drawn) */
        bool end = q + 1 == t1;
        const char *res = end ? "no token sampled from the position on"
                              : "no token sampled in the positions an answer holds: nothing judged";
        kvd_log(KVD_LOG_INFO, "audit %s of node %.16s... (rank %u, session %.16s, position %u): "
                "%s (%s; %u to %u opened empty)", id, node, rank, session, pos,
                end ? "pass" : "inconclusive", res, pos, q);
        *verdict = end ? "pass" : "inconclusive";
        record_last(r, id, *verdict, INFINITY, res, now);   /* frees the pending record */
        *settled = true;
        rc = kvd_market__blob_save(au->st, key, r);
        goto out;
    }
    j->pos = q;
    j->n = q - t0 + 1;
    if (head) {
        if ((rc = head_token(j, row, len, body, why, n)))
            goto out;
        /* the inputs go on to the row the TOKEN's last token was sampled from */
        if ((uint64_t)q + j->tok_n > t1) {
            snprintf(why, n, "position %u: a TOKEN of %u tokens sampled past the range's end %u",
                     q, j->tok_n, t1);
            rc = -EBADMSG;
            goto out;
        }
        j->n = q - t0 + j->tok_n;
    } else {
        j->sent = malloc((size_t)j->n_embd * sizeof *j->sent);
        if (!j->sent) {
            rc = -ENOMEM;
            goto out;
        }
        if (row_decode(row, len, j->n_embd, j->sent)) {
            snprintf(why, n, "position %u: the row sent is %u bytes, no boundary of %u values", q,
                     len, j->n_embd);
            rc = -EBADMSG;
            goto out;
        }
    }
    j->x = malloc((size_t)j->n * j->n_embd * sizeof *j->x);
    if (!j->x) {
        rc = -ENOMEM;
        goto out;
    }
    if (embed) {   /* rank 0: the ids it embedded (its own statement: see the docs' limits) */
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(body, "token_ids"), *v;
        j->tokens = malloc((size_t)j->n * sizeof *j->tokens);
        if (!j->tokens) {
            rc = -ENOMEM;
            goto out;
        }
        if (cJSON_GetArraySize(ids) != (int)j->n) {
            snprintf(why, n, "token_ids: expected %u ids (positions %u to %u)", j->n, t0, q);
            rc = -EINVAL;
            goto out;
        }
        uint32_t i = 0;
        cJSON_ArrayForEach(v, ids) {
            if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble < 2147483647.0)) {
                snprintf(why, n, "token_ids[%u]: expected a token id", i);
                rc = -EINVAL;
                goto out;
            }
            j->tokens[i++] = (int32_t)v->valuedouble;
        }
        if (!head && (rc = feed_check(j, body, t0, t1, rroot, why, n)))
            goto out;
    } else {       /* the rows received, each against the received root */
        const cJSON *in = cJSON_GetObjectItemCaseSensitive(body, "inputs");
        if (cJSON_GetArraySize(in) != (int)j->n) {
            snprintf(why, n, "inputs: expected %u openings (positions %u to %u)", j->n, t0, q);
            rc = -EINVAL;
            goto out;
        }
        uint32_t i = 0;
        cJSON_ArrayForEach(o, in) {
            free(row);
            if ((rc = open_leaf(o, t0 + i, t0, t1, rroot, NULL, "the row received", &row, &len, why, n)))
                goto out;
            if (row_decode(row, len, j->n_embd, j->x + (size_t)i * j->n_embd)) {
                snprintf(why, n, "position %u: the row received is %u bytes, no boundary of %u "
                         "values", t0 + i, len, j->n_embd);
                rc = -EBADMSG;
                goto out;
            }
            i++;
        }
    }
    if (!au->cfg.verify_model) {   /* no weights here: the proofs are all that is checked */
        record_last(r, id, "pass", INFINITY, "proofs only (no --verify-model)", now);
        *settled = true;
        rc = kvd_market__blob_save(au->st, key, r);
        kvd_log(KVD_LOG_INFO, "audit %s of node %.16s...: proofs right (not recomputed: no "
                "--verify-model)%s%s", id, node, j->note[0] ? "; " : "", j->note);
        goto out;
    }
    cJSON_AddBoolToObject(p, "verifying", true);
    if ((rc = kvd_market__blob_save(au->st, key, r)))
        goto out;
    j->w.data = j;
    if ((rc = uv_queue_work(au->loop, &j->w, job_run, job_done)))
        goto out;
    j = NULL;   /* the pool's now; job_done settles it */
out:
    if (rc == -EINVAL && merged)   /* assembled from the node's own parts: no retry costs a merge */
        rc = -EBADMSG;
    if (rc == -EBADMSG) {   /* a wrong answer settles the audit: the caller fails the node */
        if (util_json_number(p, "parts_n", 0) > 0)
            parts_drop(au, model, node, id);   /* what a late answer's parts kept */
        record_last(r, id, "fail", INFINITY, why, now);
        kvd_log(KVD_LOG_WARN, "audit %s of node %.16s...: fail: %s", id, node, why);
        if (kvd_market__blob_save(au->st, key, r))
            rc = -EIO;
    }
    free(row);
    job_free(j);
    cJSON_Delete(merged);
    cJSON_Delete(r);
    if (rc == -ENOMEM)
        snprintf(why, n, "out of memory");
    return rc;
}

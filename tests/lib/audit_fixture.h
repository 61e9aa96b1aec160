/* audit_fixture.h — pending audits of one made-up session, one per kind of rank, and the honest
 * answers to them, for the tests that answer audits without a ring (docs/market.md, "Audits"):
 * the fuzz target fuzz-audit (which restores the pending audits before each input), its seed
 * tool tool-seed-audit (which writes the honest answers as seeds) and test-market-store.
 *
 * The session: positions [0, AF_N) of a 3-rank ring, rows of AF_E f32 values, a vocabulary of
 * AF_V. A prompt of 6 (positions 0..5); then TOKENs (leaf: tokens it gave):
 *   5: 40 | 6: 41 42 43 (two drafts accepted) | 9: 44 (the pass at 9 fed drafts 90 91 at 10, 11,
 *   both rejected) | 10: 45 | 11: 46 47 | 13: 48 49 | 15: 50 51 | 17 .. 21: one each |
 *   22: 57, never fed (the session ends), so rank 0's id at AF_N - 1 is the pass's rejected draft.
 * The audited positions: rank 0's AF_N - 1; rank 1's 12; the last rank's 12, whose first TOKEN
 * is at 13 (two tokens).
 * Rank 0 (AF_RANK0) received the TOKENs as summaries (with each token's logits hashed); the last
 * rank (AF_LAST) sent them, and keeps its first tokens' logits; AF_LAST_RAW is the last rank of
 * a ring of protocol version 3, whose TOKEN leaves were raw payloads (i32 token | f32 logprob);
 * AF_MID is rank 1, its rows f32 both ways. */
#ifndef KV_TESTS_AUDIT_FIXTURE_H
#define KV_TESTS_AUDIT_FIXTURE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <openssl/evp.h>

#include "ring/ring.h"
#include "util/util.h"

#define AF_N 24
#define AF_E 4
#define AF_V 32
#define AF_ROW_MAX (RING_TOKEN_LEAF_MAX > AF_E * 4 ? RING_TOKEN_LEAF_MAX : AF_E * 4)

enum af_kind { AF_RANK0, AF_MID, AF_LAST, AF_LAST_RAW, AF_KINDS };

struct af {
    enum af_kind kind;
    uint32_t rank, pred, pos;          /* the audited rank, its predecessor, the position asked */
    char node[8], session[17], id[17];
    uint8_t sent[AF_N][32], recv[AF_N][32];   /* the leaves */
    uint8_t srow[AF_N][AF_ROW_MAX], rrow[AF_N][AF_ROW_MAX];
    size_t slen[AF_N], rlen[AF_N];
    float logits[AF_N][AF_V];          /* the last rank's: its TOKENs' first tokens' */
    int32_t ids[AF_N];                 /* rank 0's: the ids it embedded */
    uint8_t sampling[RING_OPEN_LEN];   /* the OPEN's, folded into the last edge's digests */
    const uint8_t *fold_sent, *fold_recv;   /* sampling for the last edge's side, or NULL */
};

/* The TOKEN whose leaf is pos: its tokens into t (its count, 0: none). */
static inline uint32_t af_token_at(uint32_t pos, int32_t t[3])
{
    static const struct {
        uint32_t leaf, n;
        int32_t t[3];
    } toks[] = {{5, 1, {40}}, {6, 3, {41, 42, 43}}, {9, 1, {44}}, {10, 1, {45}}, {11, 2, {46, 47}},
                {13, 2, {48, 49}}, {15, 2, {50, 51}}, {17, 1, {52}}, {18, 1, {53}}, {19, 1, {54}},
                {20, 1, {55}}, {21, 1, {56}}, {22, 1, {57}}};
    for (size_t i = 0; i < sizeof toks / sizeof toks[0]; i++)
        if (toks[i].leaf == pos) {
            memcpy(t, toks[i].t, sizeof toks[i].t);
            return toks[i].n;
        }
    return 0;
}

static inline void af_row(uint32_t pos, int side, float x[AF_E])
{
    for (int i = 0; i < AF_E; i++)
        x[i] = (float)(pos * 10 + i) * (side ? 1.5f : 0.5f) - 3.0f;
}

/* The TOKEN at leaf pos (n tokens t) as the last rank sent it: its leaf's row into row (a
 * summary, with its tokens' logits hashed; AF_LAST_RAW: the raw payload of its first token),
 * its first token's logits into lg: the row's length. */
static inline size_t af_token_row(enum af_kind k, uint32_t pos, uint32_t n, const int32_t *t,
                                  uint8_t *row, float lg[AF_V])
{
    uint8_t p[8 * 3 + 4 * 3 * AF_V];
    size_t o = 0, sl = 0, lo = 0;
    for (uint32_t i = 0; i < AF_V; i++)
        lg[i] = (float)((i * 7 + pos) % AF_V) * 0.25f;
    lg[t[0] % AF_V] = 20.0f;   /* the token sampled is the favourite */
    for (uint32_t i = 0; i < n; i++, o += 4)
        util_le32_put(p + o, (uint32_t)t[i]);
    for (uint32_t i = 0; i < n; i++, o += 4) {
        float lp = -0.01f;
        memcpy(p + o, &lp, 4);
    }
    if (k == AF_LAST_RAW) {
        memcpy(row, p, 4);
        memcpy(row + 4, p + 4 * n, 4);
        return 8;
    }
    for (uint32_t i = 0; i < n; i++, o += 4 * AF_V)
        memcpy(p + o, lg, sizeof(float) * AF_V);
    if (ring_token_leaf_make(p, o, n, AF_V, row, &sl, &lo))
        return 0;
    return sl;
}

static inline void af_build(struct af *a, enum af_kind k)
{
    memset(a, 0, sizeof *a);
    a->kind = k;
    a->rank = k == AF_RANK0 ? 0 : k == AF_MID ? 1 : 2;
    a->pred = (a->rank + 2) % 3;
    a->pos = k == AF_RANK0 ? AF_N - 1 : 12;
    snprintf(a->node, sizeof a->node, "n%u", (unsigned)k % 10u);
    snprintf(a->session, sizeof a->session, "5e55%012x", (unsigned)k);
    snprintf(a->id, sizeof a->id, "a0d1%012x", (unsigned)k);
    int32_t t[3];
    for (uint32_t p = 0; p < AF_N; p++) {
        float x[AF_E];
        uint32_t n = af_token_at(p, t);
        bool last = k == AF_LAST || k == AF_LAST_RAW;
        if (last) {   /* sent: the TOKENs; received: rows */
            a->slen[p] = n ? af_token_row(k, p, n, t, a->srow[p], a->logits[p]) : 0;
        } else {
            af_row(p, 1, x);
            memcpy(a->srow[p], x, sizeof x);
            a->slen[p] = sizeof x;
        }
        if (k == AF_RANK0) {   /* received: the TOKENs */
            float lg[AF_V];
            a->rlen[p] = n ? af_token_row(AF_LAST, p, n, t, a->rrow[p], lg) : 0;
        } else {
            af_row(p, 0, x);
            memcpy(a->rrow[p], x, sizeof x);
            a->rlen[p] = sizeof x;
        }
        ring_merkle_leaf(p, a->slen[p] ? a->srow[p] : NULL, a->slen[p], a->sent[p]);
        ring_merkle_leaf(p, a->rlen[p] ? a->rrow[p] : NULL, a->rlen[p], a->recv[p]);
    }
    /* rank 0's ids: the prompt, then what the TOKENs gave (the rejected drafts at 10, 11 and
     * AF_N - 1 overwritten where a later pass fed the TOKEN's token) */
    for (uint32_t p = 0; p < AF_N; p++)
        a->ids[p] = (int32_t)(p + 1);
    for (uint32_t y = 0; y < AF_N; y++) {
        uint32_t n = af_token_at(y, t);
        for (uint32_t i = 0; i < n && y + 1 + i < AF_N; i++)
            a->ids[y + 1 + i] = t[i];
    }
    a->ids[AF_N - 1] = 91;   /* the last TOKEN's token was never fed: a rejected draft stands */
    struct ring_open_params op = {.seed = 7, .temperature = 0.8f, .top_k = 40, .top_p = 0.95f,
                                  .min_p = 0.05f, .repeat_penalty = 1.0f, .n_ctx = 64};
    ring_open_encode(&op, a->sampling);
    a->fold_sent = k == AF_LAST ? a->sampling : NULL;   /* the raw one: no fold before version 4 */
    a->fold_recv = k == AF_RANK0 ? a->sampling : NULL;
}

/* The digest of a side of n leaves (folded with sampling, when not NULL), hex. */
static inline void af_digest_hex(const uint8_t (*leaves)[32], size_t n, const uint8_t *sampling,
                                 char hex[65])
{
    uint8_t r[32];
    ring_merkle_root(leaves, n, r);
    if (sampling)
        ring_receipt_fold(r, sampling, r);
    util_hex_encode(r, 32, hex);
}

/* o[name]: base64 of b[n] (a test's rows: small) */
static inline void af_b64(cJSON *o, const char *name, const void *b, size_t n)
{
    char s[4096];
    s[0] = 0;
    if (n && n <= sizeof s / 4 * 3 - 3)
        EVP_EncodeBlock((unsigned char *)s, (const unsigned char *)b, (int)n);
    cJSON_AddStringToObject(o, name, s);
}

/* {"pos", "row", "path"}: position pos of the tree of n leaves, its row row[len] */
static inline cJSON *af_open(const uint8_t (*leaves)[32], size_t n, const void *row, size_t len,
                             uint32_t pos)
{
    uint8_t path[RING_MERKLE_DEPTH_MAX][32];
    size_t plen = 0;
    char hex[65];
    ring_merkle_proof(leaves, n, pos, path, &plen);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "pos", pos);
    af_b64(o, "row", row, len);
    cJSON *pa = cJSON_AddArrayToObject(o, "path");
    for (size_t i = 0; i < plen; i++) {
        util_hex_encode(path[i], 32, hex);
        cJSON_AddItemToArray(pa, cJSON_CreateString(hex));
    }
    return o;
}

/* The honest answer, whole (as kvd join's kvd_stage_audit makes it). */
static inline cJSON *af_answer(const struct af *a)
{
    const uint8_t (*sl)[32] = (const uint8_t (*)[32])a->sent, (*rl)[32] = (const uint8_t (*)[32])a->recv;
    bool head = a->kind == AF_LAST || a->kind == AF_LAST_RAW;
    uint32_t q = a->pos;
    while (head && q + 1 < AF_N && !a->slen[q])
        q++;
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "id", a->id);
    cJSON *outs = cJSON_AddArrayToObject(b, "outputs");
    for (uint32_t p = a->pos; p <= q; p++)
        cJSON_AddItemToArray(outs, af_open(sl, AF_N, a->srow[p], a->slen[p], p));
    if (a->kind == AF_LAST) {   /* its TOKEN's first logits, in two pieces */
        cJSON *lg = cJSON_AddArrayToObject(b, "logits"), *piece;
        for (int h = 0; h < 2; h++) {
            af_b64(piece = cJSON_CreateObject(), "b", (const char *)a->logits[q] + h * AF_V * 2,
                   AF_V * 2);
            cJSON_AddItemToArray(lg, cJSON_DetachItemFromObject(piece, "b"));
            cJSON_Delete(piece);
        }
    }
    if (a->fold_sent || a->fold_recv)
        af_b64(b, "sampling", a->sampling, RING_SAMPLING_LEN);
    /* the last rank's inputs go on to the row its TOKEN's last token was sampled from */
    int32_t t[3];
    uint32_t qi = a->kind == AF_LAST ? q + af_token_at(q, t) - 1 : q;
    cJSON *in = cJSON_AddArrayToObject(b, a->kind == AF_RANK0 ? "received" : "inputs");
    for (uint32_t p = 0; p <= qi; p++)
        cJSON_AddItemToArray(in, af_open(rl, AF_N, a->rrow[p], a->rlen[p], p));
    if (a->kind == AF_RANK0) {
        cJSON *t = cJSON_AddArrayToObject(b, "token_ids");
        for (uint32_t p = 0; p <= q; p++)
            cJSON_AddItemToArray(t, cJSON_CreateNumber(a->ids[p]));
    }
    return b;
}

/* The answer in n parts: the items of its arrays spread in order (part k's share of each). */
static inline cJSON *af_part(const struct af *a, int k, int n)
{
    static const char *const names[] = RING_AUDIT_ARRAYS;
    cJSON *whole = af_answer(a), *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "id", a->id);
    cJSON_AddNumberToObject(b, "part", k);
    cJSON_AddNumberToObject(b, "parts", n);
    if (cJSON_GetObjectItemCaseSensitive(whole, "sampling"))
        cJSON_AddItemToObject(b, "sampling",
                              cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(whole, "sampling"), 0));
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        cJSON *arr = cJSON_GetObjectItemCaseSensitive(whole, names[i]);
        int c = cJSON_GetArraySize(arr), per = (c + n - 1) / n;
        if (!arr)
            continue;
        cJSON *to = cJSON_AddArrayToObject(b, names[i]);
        for (int j = k * per; j < c && j < (k + 1) * per; j++)
            cJSON_AddItemToArray(to, cJSON_Duplicate(cJSON_GetArrayItem(arr, j), 1));
    }
    cJSON_Delete(whole);
    return b;
}

#ifdef KV_KVD_MARKET_INTERNAL_H
/* The market's side (with kvd/market/internal.h): an audit of rank (of 3) of model "m" pending
 * on node, for session's range [0, n) whose sides' leaves are sent and recv (recv's side, of
 * the predecessor, put in; either folded with the sampling fs or fr when not NULL), drawn at
 * now, at position pos, with id (NULL: the drawn one). The
 * pending record as it then stands in *saved when saved is not NULL (the caller frees it).
 * 0, or -1. */
static inline int af_pending_on(struct kvd_market_store *st, struct kvd_market_audit *au,
                                const char *node, const char *session, uint32_t rank,
                                const uint8_t (*sent)[32], const uint8_t (*recv)[32], size_t n,
                                const uint8_t *fs, const uint8_t *fr, uint32_t pos,
                                const char *id, double now, char **saved)
{
    char shex[65], key[64];
    af_digest_hex(sent, n, fs, shex);
    struct kvd_market_receipt rc = {.rank = (rank + 2) % 3, .t0 = 0, .t1 = n,
                                    .side = KVD_SIDE_RECEIVED};
    snprintf(rc.session, sizeof rc.session, "%s", session);
    snprintf(rc.model, sizeof rc.model, "m");
    snprintf(rc.node, sizeof rc.node, "%s", node);
    af_digest_hex(recv, n, fr, rc.digest);
    if (st->ops->receipt_put(st->impl, &rc))
        return -1;
    struct kvd_market_audit_work w = {.model = "m", .node = node, .session = session,
                                      .digest = shex, .rank = rank, .n_ranks = 3,
                                      .window = rank, .first = rank, .last = rank,
                                      .n_embd = AF_E, .t0 = 0, .t1 = n};
    if (kvd_market__audit_note(au, &w, now))
        return -1;
    snprintf(key, sizeof key, "audit/m/%s", node);
    cJSON *r = kvd_market__blob_load(st, key), *p = cJSON_GetObjectItemCaseSensitive(r, "pending");
    if (!p) {
        cJSON_Delete(r);
        return -1;
    }
    util_json_set(p, "position", cJSON_CreateNumber(pos));
    if (id)
        util_json_set(p, "id", cJSON_CreateString(id));
    int rc2 = kvd_market__blob_save(st, key, r);
    if (saved)
        *saved = rc2 ? NULL : cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    return rc2 || (saved && !*saved) ? -1 : 0;
}

/* a's audit pending (af_pending_on). */
static inline int af_pending(struct kvd_market_store *st, struct kvd_market_audit *au,
                             const struct af *a, double now, char **saved)
{
    return af_pending_on(st, au, a->node, a->session, a->rank, (const uint8_t (*)[32])a->sent,
                         (const uint8_t (*)[32])a->recv, AF_N, a->fold_sent, a->fold_recv, a->pos,
                         a->id, now, saved);
}

/* Put a's pending audit back as af_pending left it (kept parts of an answer go with part 0). */
static inline int af_restore(struct kvd_market_store *st, const struct af *a, const char *saved)
{
    char key[64];
    snprintf(key, sizeof key, "audit/m/%s", a->node);
    cJSON *r = cJSON_Parse(saved);
    int rc = r ? kvd_market__blob_save(st, key, r) : -1;
    cJSON_Delete(r);
    return rc;
}
#endif

#endif

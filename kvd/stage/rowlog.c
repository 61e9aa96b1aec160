/* rowlog.c — the row log (docs/market.md, "Audits"): the boundary rows a stage received and
 * sent for each session it wrote receipts of, and on rank 0 the token ids it embedded, kept
 * in DIR/rows/<session>.rows for KVD_ROWLOG_KEEP_S (one hour) and at most o.rowlog_max bytes
 * in all (kvd join --rowlog; KVD_ROWLOG_MAX_BYTES without; the oldest files go first). The market audits credited work
 * after the fact: kvd join answers an audit from this log (kvd_stage_audit), opening the rows
 * of one session with Merkle proofs against the roots its receipts committed to.
 *
 * A record: u8 kind (KVD_ROWLOG_*) | u32le pos | u32le len | len bytes: a row received or sent
 * (a TOKEN's as its leaf's summary, ring_token_leaf_make), rank 0's token id at pos, or the
 * logits of the first token of a TOKEN the last rank sent (which an audit of it compares: the
 * summary holds their hash). Rows are appended on the loop as frames go and come (a write to
 * the page cache, like the receipts' lines); a row logged twice for one position (a session resumed on this stage) counts as its receipt's
 * leaf does: the last one. An empty record says the position has no row after all (a replay
 * cleared the last rank's TOKEN leaves: kvd_receipt_replayed). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <openssl/evp.h>

#include "kvd/stage/internal.h"

#define ROWLOG_RECORD_MAX (64u << 20)   /* the largest row a record may hold (a TOKEN's logits) */
#define ROWLOG_SWEEP_S 60               /* the retention is enforced at most this often */

static const char *dir_of(const char *state_dir)
{
    return state_dir ? state_dir : ".";
}

int kvd_rowlog_open(struct stage *st, uint64_t session)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/rows", dir_of(st->o.state_dir));
    mkdir(path, 0700);
    snprintf(path, sizeof path, "%s/rows/%016" PRIx64 ".rows", dir_of(st->o.state_dir), session);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        kvd_log(KVD_LOG_WARN, "row log %s: %s (this session cannot be audited)", path,
                strerror(errno));
    return fd;
}

void kvd_rowlog_put(int fd, int kind, uint32_t pos, const void *row, size_t len)
{
    if (fd < 0 || len > ROWLOG_RECORD_MAX)
        return;
    uint8_t h[9] = {(uint8_t)kind};
    util_le32_put(h + 1, pos);
    util_le32_put(h + 5, (uint32_t)len);
    struct piece {
        const void *b;
        size_t n;
    } v[2] = {{h, sizeof h}, {row, len}};
    for (int i = 0; i < 2; i++)
        for (size_t off = 0; off < v[i].n;) {
            ssize_t w = write(fd, (const uint8_t *)v[i].b + off, v[i].n - off);
            if (w <= 0)
                return;   /* a short log: the audit of this session fails at its proofs */
            off += (size_t)w;
        }
}

struct old {
    char name[40];
    time_t mtime;
    off_t size;
};

static int by_age(const void *a, const void *b)
{
    const struct old *x = a, *y = b;
    return x->mtime < y->mtime ? -1 : x->mtime > y->mtime;
}

/* Drop the files past the retention time, then the oldest while the rest exceed max, saying so
 * when that takes a session young enough to be audited yet (its audit would fail). */
static void sweep(const char *state_dir, uint64_t max)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/rows", dir_of(state_dir));
    DIR *d = opendir(path);
    if (!d)
        return;
    struct old *v = NULL;
    size_t n = 0, cap = 0;
    uint64_t total = 0;
    time_t now = time(NULL);
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        struct stat sb;
        if (len != 16 + 5 || strcmp(e->d_name + 16, ".rows"))
            continue;
        snprintf(path, sizeof path, "%s/rows/%s", dir_of(state_dir), e->d_name);
        if (stat(path, &sb))
            continue;
        if (now - sb.st_mtime > KVD_ROWLOG_KEEP_S) {
            unlink(path);
            continue;
        }
        if (n == cap && util_grow((void **)&v, &cap, sizeof *v, 64))
            break;
        memcpy(v[n].name, e->d_name, len + 1);   /* 21 bytes: checked above */
        v[n].mtime = sb.st_mtime;
        v[n].size = sb.st_size;
        total += (uint64_t)sb.st_size;
        n++;
    }
    closedir(d);
    qsort(v, n, sizeof *v, by_age);
    size_t young = 0;
    time_t youngest = 0;
    for (size_t i = 0; i < n && total > max; i++) {
        snprintf(path, sizeof path, "%s/rows/%s", dir_of(state_dir), v[i].name);
        unlink(path);
        total -= (uint64_t)v[i].size;
        if (now - v[i].mtime < KVD_ROWLOG_YOUNG_S) {
            young++;
            youngest = v[i].mtime;
        }
    }
    if (young)
        kvd_log(KVD_LOG_WARN, "row log: at its cap of %" PRIu64 " MiB, the rows of %zu sessions that "
                "ended within %d s went (the last %lld s ago): an audit of them would fail; give "
                "it more room (kvd join --rowlog)", max >> 20, young, KVD_ROWLOG_YOUNG_S,
                (long long)(now - youngest));
    free(v);
}

void kvd_rowlog_close(struct stage *st, int fd)
{
    static double last;
    if (fd >= 0)
        close(fd);
    double now = util_now_s();
    if (now - last >= ROWLOG_SWEEP_S) {
        last = now;
        sweep(st->o.state_dir, st->o.rowlog_max ? st->o.rowlog_max : KVD_ROWLOG_MAX_BYTES);
    }
}

/* ---- answering an audit (kvd join) ---- */

/* One side's rows of the session over the audited range [t0, t1): each position's leaf, and
 * the rows an answer may open (those before keep_end; NULL: none). */
struct side {
    uint8_t **row;
    uint32_t *len;
    uint8_t (*leaf)[32];   /* sent and received only */
    uint8_t *leafed;       /* leaf[i] was set from a record */
};

struct audit_log {
    uint32_t t0, t1, keep_end;
    uint32_t logits_from;             /* the logits kept: from the audited position on (a
                                       * vocabulary's each, and an answer opens one) */
    struct side recv, sent, logits;   /* logits: the last rank's first token's, by TOKEN */
    int32_t *tok;
    uint8_t *has_tok;
    bool has_sampling;                /* the last edge's ends: the session's sampling */
    uint8_t sampling[RING_SAMPLING_LEN];
};

static void side_free(struct side *sd, uint32_t n)
{
    for (uint32_t i = 0; sd->row && i < n; i++)
        free(sd->row[i]);
    free(sd->row);
    free(sd->len);
    free(sd->leaf);
    free(sd->leafed);
}

static void audit_log_free(struct audit_log *l)
{
    side_free(&l->recv, l->t1 - l->t0);
    side_free(&l->sent, l->t1 - l->t0);
    side_free(&l->logits, l->t1 - l->t0);
    free(l->tok);
    free(l->has_tok);
}

/* Position t0 + i of side sd is the row b[len] (NULL: no row): its leaf, and the row itself
 * when it is one an answer may open. 0, or -ENOMEM. */
static int side_put(struct audit_log *l, struct side *sd, uint32_t i, const uint8_t *b,
                    uint32_t len)
{
    if (sd->leaf) {
        ring_merkle_leaf(l->t0 + i, b, b ? len : 0, sd->leaf[i]);
        sd->leafed[i] = 1;
    }
    if (l->t0 + i >= l->keep_end || (sd == &l->logits && l->t0 + i < l->logits_from))
        return 0;
    free(sd->row[i]);
    sd->row[i] = NULL;
    sd->len[i] = 0;
    if (b && !(sd->row[i] = malloc(len + 1u)))
        return -ENOMEM;
    if (b) {
        memcpy(sd->row[i], b, len);
        sd->len[i] = len;
    }
    return 0;
}

/* Read the session's log, record by record (a long session's log can be larger than memory
 * should hold), into the leaves of its rows over [t0, t1) and the rows before keep_end (the
 * logits from logits_from only): 0, or negative with err. */
static int audit_log_load(struct audit_log *l, const char *state_dir, const char *session,
                          uint32_t t0, uint32_t t1, uint32_t keep_end, uint32_t logits_from,
                          char *err, size_t errlen)
{
    char path[4200];
    size_t n = t1 - t0;
    snprintf(path, sizeof path, "%s/rows/%s.rows", dir_of(state_dir), session);
    *l = (struct audit_log){.t0 = t0, .t1 = t1, .keep_end = keep_end, .logits_from = logits_from};
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "row log %s: %s", path, strerror(errno));
        return -ENOENT;
    }
    struct side *sides[] = {&l->recv, &l->sent, &l->logits};
    bool ok = true;
    for (int k = 0; k < 3; k++) {
        sides[k]->row = calloc(n, sizeof *sides[k]->row);
        sides[k]->len = calloc(n, sizeof *sides[k]->len);
        ok = ok && sides[k]->row && sides[k]->len;
    }
    l->recv.leaf = malloc(n * 32);
    l->sent.leaf = malloc(n * 32);
    l->recv.leafed = calloc(n, 1);
    l->sent.leafed = calloc(n, 1);
    l->tok = calloc(n, sizeof *l->tok);
    l->has_tok = calloc(n, 1);
    ok = ok && l->recv.leaf && l->sent.leaf && l->recv.leafed && l->sent.leafed && l->tok &&
         l->has_tok;
    uint8_t h[9], *buf = NULL;
    size_t cap = 0;
    int rc = ok ? 0 : -ENOMEM;
    while (rc == 0 && fread(h, 1, 9, f) == 9) {
        uint8_t kind = h[0];
        uint32_t pos = util_le32_get(h + 1), len = util_le32_get(h + 5);
        if (len > ROWLOG_RECORD_MAX)
            break;   /* no record of ours: what came before holds */
        if (kind == KVD_ROWLOG_SAMPLING && len == RING_SAMPLING_LEN) {
            if (fread(l->sampling, 1, len, f) != len)
                break;
            l->has_sampling = true;
            continue;
        }
        if (pos < t0 || pos >= t1) {
            if (fseek(f, len, SEEK_CUR))
                break;
            continue;
        }
        if (len > cap) {
            uint8_t *nb = realloc(buf, len);
            if (!nb) {
                rc = -ENOMEM;
                break;
            }
            buf = nb;
            cap = len;
        }
        if (len && fread(buf, 1, len, f) != len)
            break;   /* cut short (the stage died writing it): what came before holds */
        uint32_t i = pos - t0;
        /* an empty row record: no row here after all (a replay cleared its TOKEN leaf) */
        const uint8_t *row = len ? buf : NULL;
        if (kind == KVD_ROWLOG_RECEIVED)
            rc = side_put(l, &l->recv, i, row, len);
        else if (kind == KVD_ROWLOG_SENT)
            rc = side_put(l, &l->sent, i, row, len);
        else if (kind == KVD_ROWLOG_LOGITS)
            rc = side_put(l, &l->logits, i, row, len);
        else if (kind == KVD_ROWLOG_TOKEN && len == 4) {
            l->tok[i] = (int32_t)util_le32_get(buf);
            l->has_tok[i] = 1;
        }
    }
    free(buf);
    fclose(f);
    for (uint32_t i = 0; rc == 0 && i < n; i++) {   /* a position never logged: no row */
        if (!l->recv.leafed[i] || !l->sent.leafed[i]) {
            uint8_t e[32];
            ring_merkle_leaf(t0 + i, NULL, 0, e);
            if (!l->recv.leafed[i])
                memcpy(l->recv.leaf[i], e, 32);
            if (!l->sent.leafed[i])
                memcpy(l->sent.leaf[i], e, 32);
        }
    }
    if (rc) {
        snprintf(err, errlen, "row log %s: out of memory", path);
        audit_log_free(l);
    }
    return rc;
}

/* Base64 of len bytes at b, as a JSON string: o[name] (o an object), or appended (an array).
 * 0, or -ENOMEM. */
static int add_b64(cJSON *o, const char *name, const uint8_t *b, size_t len)
{
    char *b64 = malloc((len + 2) / 3 * 4 + 1);
    if (!b64)
        return -ENOMEM;
    b64[0] = 0;
    if (len)
        EVP_EncodeBlock((unsigned char *)b64, b, (int)len);
    cJSON *v = cJSON_CreateString(b64);
    free(b64);
    if (!v)
        return -ENOMEM;
    if (cJSON_IsArray(o))
        cJSON_AddItemToArray(o, v);
    else
        cJSON_AddItemToObject(o, name, v);
    return 0;
}

/* {"pos", "row": base64 of its bytes ("" for none), "path": [hex, ...]}: the opening of
 * position pos of one side, or NULL (out of memory). */
static cJSON *opening(const struct audit_log *l, const struct side *sd, uint8_t (*leaves)[32],
                      uint32_t pos)
{
    uint32_t n = l->t1 - l->t0, i = pos - l->t0;
    uint8_t path[RING_MERKLE_DEPTH_MAX][32];
    size_t plen = 0;
    if (ring_merkle_proof((const uint8_t (*)[32])leaves, n, i, path, &plen))
        return NULL;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "pos", pos);
    if (add_b64(o, "row", sd->row[i], sd->row[i] ? sd->len[i] : 0)) {
        cJSON_Delete(o);
        return NULL;
    }
    cJSON *pa = cJSON_AddArrayToObject(o, "path");
    for (size_t k = 0; k < plen; k++) {
        char hex[65];
        util_hex_encode(path[k], 32, hex);
        cJSON_AddItemToArray(pa, cJSON_CreateString(hex));
    }
    return o;
}

int kvd_stage_audit(const char *state_dir, const char *challenge, char **answer, char *err,
                    size_t errlen)
{
    *answer = NULL;
    cJSON *c = cJSON_Parse(challenge);
    const cJSON *sj = cJSON_GetObjectItemCaseSensitive(c, "session");
    const cJSON *tk = cJSON_GetObjectItemCaseSensitive(c, "tokens");
    double t0d = cJSON_GetArraySize(tk) == 2 ? cJSON_GetArrayItem(tk, 0)->valuedouble : -1;
    double t1d = cJSON_GetArraySize(tk) == 2 ? cJSON_GetArrayItem(tk, 1)->valuedouble : -1;
    double pd = util_json_number(c, "position", -1);
    bool embed = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "embed"));
    bool head = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "head"));
    if (!cJSON_IsString(sj) || strlen(sj->valuestring) != 16 ||
        strspn(sj->valuestring, "0123456789abcdef") != 16 || !(t0d >= 0) || !(t1d > t0d) ||
        t1d - t0d > RING_MERKLE_LEAVES_MAX || t1d > 4294967295.0 || !(pd >= t0d && pd < t1d)) {
        snprintf(err, errlen, "audit: expected session (16 hex), tokens [t0, t1) and a position "
                 "inside them");
        cJSON_Delete(c);
        return -EINVAL;
    }
    uint32_t t0 = (uint32_t)t0d, t1 = (uint32_t)t1d, p = (uint32_t)pd;
    /* the output: the sent row at p; the last rank's the first TOKEN at or after p (a prompt
     * row samples none), with the empty leaves before it opened to show there was none, but
     * no further than max_positions from t0 (the inputs t0 .. q must fit in the answer: the
     * market passes a run of empties that reaches it) */
    double mp = util_json_number(c, "max_positions", 0);
    uint32_t cap = mp >= 1 && mp < (double)(t1 - t0) ? (uint32_t)mp : t1 - t0;
    struct audit_log l;
    /* (the last rank's inputs go on to the rows its TOKEN's drafts were verified at, up to
     * RING_DRAFTS_MAX past the cap) */
    uint64_t keep = (uint64_t)(p >= t0 + cap ? p + 1 : t0 + cap) + RING_DRAFTS_MAX;
    int rc = audit_log_load(&l, state_dir, sj->valuestring, t0, t1,
                            keep < t1 ? (uint32_t)keep : t1, p, err, errlen);
    if (rc) {
        cJSON_Delete(c);
        return rc;
    }
    uint32_t q = p;
    while (head && q + 1 < t1 && q + 1 - t0 < cap && !l.sent.row[q - t0])
        q++;
    uint8_t (*sl)[32] = l.sent.leaf, (*rl)[32] = l.recv.leaf;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "id", cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(c, "id"), 0));
    cJSON *outs = cJSON_AddArrayToObject(o, "outputs");
    rc = sl && rl ? 0 : -ENOMEM;
    for (uint32_t i = p; rc == 0 && i <= q; i++) {
        cJSON *x = opening(&l, &l.sent, sl, i);
        if (!x)
            rc = -ENOMEM;
        cJSON_AddItemToArray(outs, x);
    }
    bool none = head && !l.sent.row[q - t0];   /* no token up to the range's end or the cap */
    struct ring_token_leaf tl;
    bool summary = rc == 0 && head && !none &&
                   ring_token_leaf_parse(l.sent.row[q - t0], l.sent.len[q - t0], &tl) == 0;
    uint32_t qi = q;   /* the last input: the row the TOKEN's last token was sampled from */
    if (summary && q + tl.n - 1 < t1)
        qi = q + tl.n - 1;
    if (summary && tl.logits_sha) {
        /* the TOKEN's first token's logits, which its summary holds the hash of */
        if (!l.logits.row[q - t0]) {
            snprintf(err, errlen, "audit: the row log of session %s holds no logits sent at %u",
                     sj->valuestring, q);
            rc = -ENOENT;
        } else {   /* in pieces, an array an answer in parts can split: a vocabulary's logits
                    * can be larger than one request */
            cJSON *lg = cJSON_AddArrayToObject(o, "logits");
            for (uint32_t off = 0; rc == 0 && off < l.logits.len[q - t0]; off += RING_AUDIT_LOGITS_PIECE) {
                uint32_t k = l.logits.len[q - t0] - off;
                rc = add_b64(lg, NULL, l.logits.row[q - t0] + off,
                             k < RING_AUDIT_LOGITS_PIECE ? k : RING_AUDIT_LOGITS_PIECE);
            }
        }
    }
    if (rc == 0 && !head && !l.sent.row[q - t0]) {
        snprintf(err, errlen, "audit: the row log of session %s holds no row sent at %u",
                 sj->valuestring, q);
        rc = -ENOENT;
    }
    if (rc == 0 && embed != head && l.has_sampling)   /* the last edge's digests fold it in */
        rc = add_b64(o, "sampling", l.sampling, RING_SAMPLING_LEN);
    if (rc == 0 && embed && !head) {   /* rank 0: the TOKENs it received, t0 .. q, which gave
                                        * the ids it embedded after its prompt */
        cJSON *in = cJSON_AddArrayToObject(o, "received");
        for (uint32_t i = t0; rc == 0 && i <= q; i++) {
            cJSON *x = opening(&l, &l.recv, rl, i);
            if (!x)
                rc = -ENOMEM;
            cJSON_AddItemToArray(in, x);
        }
    }
    if (rc == 0 && embed) {   /* rank 0: the token ids it embedded, t0 .. q */
        cJSON *t = cJSON_AddArrayToObject(o, "token_ids");
        for (uint32_t i = t0; rc == 0 && i <= q; i++) {
            if (!l.has_tok[i - t0]) {
                snprintf(err, errlen, "audit: the row log of session %s holds no token at %u",
                         sj->valuestring, i);
                rc = -ENOENT;
            }
            cJSON_AddItemToArray(t, cJSON_CreateNumber(l.tok[i - t0]));
        }
    } else if (rc == 0 && !none) {   /* the rows received, t0 .. qi, against the received root */
        cJSON *in = cJSON_AddArrayToObject(o, "inputs");
        for (uint32_t i = t0; rc == 0 && i <= qi; i++) {
            cJSON *x = l.recv.row[i - t0] ? opening(&l, &l.recv, rl, i) : NULL;
            if (!x) {
                snprintf(err, errlen, "audit: the row log of session %s holds no row received "
                         "at %u", sj->valuestring, i);
                rc = -ENOENT;
            }
            cJSON_AddItemToArray(in, x);
        }
    }
    if (rc == 0 && !(*answer = cJSON_PrintUnformatted(o)))
        rc = -ENOMEM;
    if (rc == -ENOMEM)
        snprintf(err, errlen, "audit: out of memory");
    cJSON_Delete(o);
    audit_log_free(&l);
    cJSON_Delete(c);
    return rc;
}

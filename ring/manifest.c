/* manifest.c — the rank manifest (docs/design.md, "The rank manifest"): parsed with cJSON, every field
 * checked (types, ranges, windows contiguous and covering the model). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <openssl/evp.h>

#include "ring/ring.h"
#include "net/net.h"
#include "util/util.h"

#define MANIFEST_MAX_BYTES (1u << 20)

/* The member key of o in *v: 0 (*v NULL when absent and not required), or -EINVAL naming
 * the missing member. */
static int member(const cJSON *o, const char *key, bool required, const cJSON **v,
                  const char *ctx, char *err, size_t errlen)
{
    *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!*v && required) {
        snprintf(err, errlen, "manifest: %s.%s is missing", ctx, key);
        return -EINVAL;
    }
    return 0;
}

static int get_str(const cJSON *o, const char *key, char *out, size_t n, bool required,
                   const char *ctx, char *err, size_t errlen)
{
    const cJSON *v;
    int rc = member(o, key, required, &v, ctx, err, errlen);
    if (rc || !v)
        return rc;
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= n) {
        snprintf(err, errlen, "manifest: %s.%s must be a string of at most %zu bytes", ctx, key, n - 1);
        return -EINVAL;
    }
    snprintf(out, n, "%s", v->valuestring);
    return 0;
}

static int get_u32(const cJSON *o, const char *key, uint32_t *out, uint32_t lo, uint32_t hi,
                   bool required, const char *ctx, char *err, size_t errlen)
{
    const cJSON *v;
    int rc = member(o, key, required, &v, ctx, err, errlen);
    if (rc || !v)
        return rc;
    if (!cJSON_IsNumber(v) || v->valuedouble < lo || v->valuedouble > hi ||
        v->valuedouble != (double)(uint32_t)v->valuedouble) {
        snprintf(err, errlen, "manifest: %s.%s = %g must be an integer in [%u, %u]", ctx, key,
                 cJSON_IsNumber(v) ? v->valuedouble : -1.0, lo, hi);
        return -EINVAL;
    }
    *out = (uint32_t)v->valuedouble;
    return 0;
}

static int get_bool(const cJSON *o, const char *key, bool *out, const char *ctx, char *err,
                    size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v)
        return 0;
    if (!cJSON_IsBool(v)) {
        snprintf(err, errlen, "manifest: %s.%s must be true or false", ctx, key);
        return -EINVAL;
    }
    *out = cJSON_IsTrue(v);
    return 0;
}

/* The standby entries (docs/ring.md, "Repair"): each names its node key (a standby without
 * one could be anyone), an endpoint, and optionally the ranks it may take over (default: every
 * rank but 0). */
static int parse_standbys(struct ring_manifest *m, const cJSON *sb, char *err, size_t errlen)
{
    m->n_standbys = m->n_own_standbys;
    if (!sb)
        return 0;
    if (!cJSON_IsArray(sb) || m->n_own_standbys + (uint32_t)cJSON_GetArraySize(sb) > RING_MAX_STANDBYS) {
        snprintf(err, errlen, "manifest: standby must be an array of at most %d entries (roster "
                 "entries included)", RING_MAX_STANDBYS);
        return -EINVAL;
    }
    uint32_t base = m->n_own_standbys, n = (uint32_t)cJSON_GetArraySize(sb);
    struct ring_standby_info parsed[RING_MAX_STANDBYS];
    memset(parsed, 0, sizeof parsed);
    for (uint32_t i = 0; i < n; i++) {
        const cJSON *e = cJSON_GetArrayItem(sb, (int)i);
        struct ring_standby_info *si = &parsed[i];
        char ctx[32], node[80] = "";
        int rc;
        snprintf(ctx, sizeof ctx, "standby[%u]", base + i);
        if (!cJSON_IsObject(e)) {
            snprintf(err, errlen, "manifest: %s must be an object", ctx);
            return -EINVAL;
        }
        if ((rc = get_str(e, "node", node, sizeof node, true, ctx, err, errlen)) < 0 ||
            (rc = get_str(e, "endpoint", si->endpoint, sizeof si->endpoint, true, ctx, err, errlen)) < 0)
            return rc;
        if (util_hex_decode(node, si->node, 32) != 0) {
            snprintf(err, errlen, "manifest: %s.node must be 64 hex digits (an Ed25519 key)", ctx);
            return -EINVAL;
        }
        if (!strstr(si->endpoint, "://")) {
            snprintf(err, errlen, "manifest: %s.endpoint '%s' is not scheme://address", ctx, si->endpoint);
            return -EINVAL;
        }
        for (uint32_t r = 0; r < m->n_ranks; r++)
            if (!strcmp(m->ranks[r].endpoint, si->endpoint)) {
                snprintf(err, errlen, "manifest: %s.endpoint '%s' is rank %u's", ctx, si->endpoint, r);
                return -EINVAL;
            }
        const cJSON *rk = cJSON_GetObjectItemCaseSensitive(e, "ranks");
        if (!rk) {
            for (uint32_t r = 1; r < m->n_ranks; r++)
                si->ranks |= 1ull << r;
            continue;
        }
        if (!cJSON_IsArray(rk) || cJSON_GetArraySize(rk) < 1) {
            snprintf(err, errlen, "manifest: %s.ranks must be a non-empty array of ranks", ctx);
            return -EINVAL;
        }
        for (int k = 0; k < cJSON_GetArraySize(rk); k++) {
            const cJSON *v = cJSON_GetArrayItem(rk, k);
            if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble >= m->n_ranks ||
                v->valuedouble != (double)(uint32_t)v->valuedouble) {
                snprintf(err, errlen, "manifest: %s.ranks[%d] must be a rank in [1, %u) (rank 0 "
                         "holds the sessions' history and has no standby)", ctx, k, m->n_ranks);
                return -EINVAL;
            }
            si->ranks |= 1ull << (uint32_t)v->valuedouble;
        }
    }
    /* parsed whole before any is taken: a bad roster leaves the standbys as they were */
    memcpy(&m->standbys[base], parsed, n * sizeof parsed[0]);
    m->n_standbys = base + n;
    return 0;
}

bool ring_manifest_may_serve(const struct ring_manifest *m, uint32_t rank, const uint8_t key[32])
{
    if (rank >= m->n_ranks)
        return false;
    if (!m->ranks[rank].has_node || !memcmp(m->ranks[rank].node, key, 32))
        return true;
    for (uint32_t i = 0; i < m->n_standbys; i++)
        if ((m->standbys[i].ranks >> rank & 1) && !memcmp(m->standbys[i].node, key, 32))
            return true;
    return false;
}

int ring_manifest_parse(struct ring_manifest *m, const char *json, size_t len, char *err,
                       size_t errlen)
{
    memset(m, 0, sizeof *m);
    if (len > MANIFEST_MAX_BYTES) {
        snprintf(err, errlen, "manifest: %zu bytes, the limit is %u", len, MANIFEST_MAX_BYTES);
        return -EFBIG;
    }
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root || !cJSON_IsObject(root)) {
        snprintf(err, errlen, "manifest: not a JSON object");
        cJSON_Delete(root);
        return -EINVAL;
    }
    int rc;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *wire = cJSON_GetObjectItemCaseSensitive(root, "wire");
    const cJSON *limits = cJSON_GetObjectItemCaseSensitive(root, "limits");
    const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(root, "ranks");
    if ((rc = get_u32(root, "version", &m->version, 1, 1, true, "", err, errlen)) < 0 ||
        (rc = get_str(root, "ring", m->ring, sizeof m->ring, true, "", err, errlen)) < 0)
        goto out;
    for (const char *p = m->ring; *p; p++)
        if (*p < 0x21 || *p > 0x7e) {
            snprintf(err, errlen, "manifest: ring id must be printable ASCII without spaces");
            rc = -EINVAL;
            goto out;
        }
    if (!m->ring[0]) {
        snprintf(err, errlen, "manifest: ring id is empty");
        rc = -EINVAL;
        goto out;
    }
    if (!cJSON_IsObject(model)) {
        snprintf(err, errlen, "manifest: model must be an object");
        rc = -EINVAL;
        goto out;
    }
    if ((rc = get_str(model, "name", m->model_name, sizeof m->model_name, false, "model", err, errlen)) < 0 ||
        (rc = get_str(model, "catalog", m->catalog, sizeof m->catalog, false, "model", err, errlen)) < 0 ||
        (rc = get_str(model, "arch", m->arch, sizeof m->arch, true, "model", err, errlen)) < 0 ||
        (rc = get_u32(model, "n_layers", &m->n_layers, 1, 100000, true, "model", err, errlen)) < 0 ||
        (rc = get_u32(model, "n_embd", &m->n_embd, 1, 1u << 20, true, "model", err, errlen)) < 0)
        goto out;
    snprintf(m->dtype, sizeof m->dtype, "f32");
    if (wire && (!cJSON_IsObject(wire) ||
                 (rc = get_str(wire, "dtype", m->dtype, sizeof m->dtype, false, "wire", err, errlen)) < 0)) {
        if (rc == 0)
            snprintf(err, errlen, "manifest: wire must be an object");
        rc = -EINVAL;
        goto out;
    }
    if (!strcmp(m->dtype, "f32"))
        m->wire_dsize = 4;
    else if (!strcmp(m->dtype, "f16"))
        m->wire_dsize = 2;
    else {
        snprintf(err, errlen, "manifest: wire.dtype '%s' is not f32 or f16", m->dtype);
        rc = -EINVAL;
        goto out;
    }
    m->n_ctx = 1024;
    m->max_batch = 64;
    m->max_sessions = 64;
    if (limits) {
        if (!cJSON_IsObject(limits)) {
            snprintf(err, errlen, "manifest: limits must be an object");
            rc = -EINVAL;
            goto out;
        }
        if ((rc = get_u32(limits, "n_ctx", &m->n_ctx, 8, 1u << 20, false, "limits", err, errlen)) < 0 ||
            (rc = get_u32(limits, "max_batch", &m->max_batch, 1, 4096, false, "limits", err, errlen)) < 0 ||
            (rc = get_u32(limits, "max_sessions", &m->max_sessions, 1, 4096, false, "limits", err, errlen)) < 0)
            goto out;
        static const struct { const char *key; uint32_t bit; } lim[] = {
            {"n_ctx", RING_STATED_N_CTX}, {"max_batch", RING_STATED_MAX_BATCH},
            {"max_sessions", RING_STATED_MAX_SESSIONS},
        };
        for (size_t i = 0; i < sizeof lim / sizeof lim[0]; i++)
            if (cJSON_GetObjectItemCaseSensitive(limits, lim[i].key))
                m->stated |= lim[i].bit;
    }
    if ((uint64_t)m->max_batch * m->n_embd * 4 > RING_PAYLOAD_HARD_MAX) {
        snprintf(err, errlen, "manifest: limits.max_batch %u x n_embd %u x 4 exceeds the frame cap %u",
                 m->max_batch, m->n_embd, RING_PAYLOAD_HARD_MAX);
        rc = -EINVAL;
        goto out;
    }
    if (!cJSON_IsArray(ranks) || cJSON_GetArraySize(ranks) < 1 ||
        cJSON_GetArraySize(ranks) > RING_MAX_RANKS) {
        snprintf(err, errlen, "manifest: ranks must be an array of 1..%d entries", RING_MAX_RANKS);
        rc = -EINVAL;
        goto out;
    }
    m->n_ranks = (uint32_t)cJSON_GetArraySize(ranks);
    uint32_t expect_first = 0;
    for (uint32_t i = 0; i < m->n_ranks; i++) {
        const cJSON *r = cJSON_GetArrayItem(ranks, (int)i);
        struct ring_rank_info *ri = &m->ranks[i];
        char ctx[32], node[80] = "";
        snprintf(ctx, sizeof ctx, "ranks[%u]", i);
        if (!cJSON_IsObject(r)) {
            snprintf(err, errlen, "manifest: %s must be an object", ctx);
            rc = -EINVAL;
            goto out;
        }
        if ((rc = get_u32(r, "rank", &ri->rank, i, i, true, ctx, err, errlen)) < 0 ||
            (rc = get_str(r, "node", node, sizeof node, false, ctx, err, errlen)) < 0 ||
            (rc = get_str(r, "endpoint", ri->endpoint, sizeof ri->endpoint, true, ctx, err, errlen)) < 0 ||
            (rc = get_str(r, "backend", ri->backend, sizeof ri->backend, false, ctx, err, errlen)) < 0 ||
            (rc = get_bool(r, "embed", &ri->embed, ctx, err, errlen)) < 0 ||
            (rc = get_bool(r, "head", &ri->head, ctx, err, errlen)) < 0)
            goto out;
        if (node[0]) {
            if (util_hex_decode(node, ri->node, 32) != 0) {
                snprintf(err, errlen, "manifest: %s.node must be 64 hex digits (an Ed25519 key)", ctx);
                rc = -EINVAL;
                goto out;
            }
            ri->has_node = true;
        }
        if (!strstr(ri->endpoint, "://")) {
            snprintf(err, errlen, "manifest: %s.endpoint '%s' is not scheme://address", ctx, ri->endpoint);
            rc = -EINVAL;
            goto out;
        }
        const cJSON *ly = cJSON_GetObjectItemCaseSensitive(r, "layers");
        if (!cJSON_IsArray(ly) || cJSON_GetArraySize(ly) != 2 ||
            !cJSON_IsNumber(cJSON_GetArrayItem(ly, 0)) || !cJSON_IsNumber(cJSON_GetArrayItem(ly, 1))) {
            snprintf(err, errlen, "manifest: %s.layers must be [first, last]", ctx);
            rc = -EINVAL;
            goto out;
        }
        double a = cJSON_GetArrayItem(ly, 0)->valuedouble, b = cJSON_GetArrayItem(ly, 1)->valuedouble;
        if (a != expect_first || b <= a || b > m->n_layers || b != (double)(uint32_t)b) {
            snprintf(err, errlen, "manifest: %s.layers [%g, %g) must start at %u, be non-empty and end "
                     "by n_layers %u (windows contiguous, disjoint, covering the model)",
                     ctx, a, b, expect_first, m->n_layers);
            rc = -EINVAL;
            goto out;
        }
        ri->first = (uint32_t)a;
        ri->last = (uint32_t)b;
        expect_first = ri->last;
        const cJSON *mb = cJSON_GetObjectItemCaseSensitive(r, "mem_bytes");
        if (cJSON_IsNumber(mb)) {
            /* checked before the conversion: a double past 2^64 has no uint64_t value */
            if (!(mb->valuedouble >= 0 && mb->valuedouble < 18446744073709551616.0)) {
                snprintf(err, errlen, "manifest: %s.mem_bytes %g out of range [0, 2^64)", ctx, mb->valuedouble);
                rc = -EINVAL;
                goto out;
            }
            ri->mem_bytes = (uint64_t)mb->valuedouble;
        }
        const cJSON *ms = cJSON_GetObjectItemCaseSensitive(r, "est_ms_per_token");
        if (cJSON_IsNumber(ms))
            ri->est_ms_per_token = ms->valuedouble;
        if (cJSON_IsNumber(mb) || cJSON_IsNumber(ms))
            m->stated |= RING_STATED_ESTIMATES;
        /* embed/head default to the position in the ring and must agree with it. */
        if (!cJSON_GetObjectItemCaseSensitive(r, "embed"))
            ri->embed = i == 0;
        if (!cJSON_GetObjectItemCaseSensitive(r, "head"))
            ri->head = i == m->n_ranks - 1;
        if (ri->embed != (i == 0) || ri->head != (i == m->n_ranks - 1)) {
            snprintf(err, errlen, "manifest: %s: embed belongs to rank 0 and head to the last rank", ctx);
            rc = -EINVAL;
            goto out;
        }
    }
    if (expect_first != m->n_layers) {
        snprintf(err, errlen, "manifest: windows end at layer %u, the model has %u", expect_first,
                 m->n_layers);
        rc = -EINVAL;
        goto out;
    }
    m->n_own_standbys = 0;
    if ((rc = parse_standbys(m, cJSON_GetObjectItemCaseSensitive(root, "standby"), err, errlen)) < 0)
        goto out;
    m->n_own_standbys = m->n_standbys;
    rc = 0;
out:
    cJSON_Delete(root);
    return rc;
}

int ring_manifest_load(struct ring_manifest *m, const char *path, char *err, size_t errlen)
{
    char *buf, e[512];
    size_t n;
    int rc = util_file_read(path, MANIFEST_MAX_BYTES, &buf, &n, e, sizeof e);
    if (rc < 0) {
        snprintf(err, errlen, "manifest %s", e);
        return rc;
    }
    rc = ring_manifest_parse(m, buf, n, err, errlen);
    if (rc == 0) {
        unsigned int hl = 32;
        if (EVP_Digest(buf, n, m->hash, &hl, EVP_sha256(), NULL) != 1)
            rc = -EIO;
    }
    free(buf);
    return rc;
}

/* ---- the writer: the fields the parser reads, in the order every manifest has them ---- */

static bool put_limits(cJSON *root, const struct ring_manifest *m)
{
    if (!(m->stated & (RING_STATED_N_CTX | RING_STATED_MAX_BATCH | RING_STATED_MAX_SESSIONS)))
        return true;
    cJSON *jl = cJSON_AddObjectToObject(root, "limits");
    return jl && (!(m->stated & RING_STATED_N_CTX) || cJSON_AddNumberToObject(jl, "n_ctx", m->n_ctx)) &&
           (!(m->stated & RING_STATED_MAX_BATCH) || cJSON_AddNumberToObject(jl, "max_batch", m->max_batch)) &&
           (!(m->stated & RING_STATED_MAX_SESSIONS) ||
            cJSON_AddNumberToObject(jl, "max_sessions", m->max_sessions));
}

/* A new object at the end of arr: NULL when out of memory. */
static cJSON *add_object(cJSON *arr)
{
    cJSON *x = cJSON_CreateObject();
    if (!cJSON_AddItemToArray(arr, x)) {
        cJSON_Delete(x);
        return NULL;
    }
    return x;
}

static bool put_rank(cJSON *jr, const struct ring_manifest *m, const struct ring_rank_info *ri)
{
    cJSON *x = add_object(jr), *ly = NULL;
    if (!x)
        return false;
    char node[65];
    util_hex_encode(ri->node, 32, node);
    bool ok = cJSON_AddNumberToObject(x, "rank", ri->rank) &&
              (!ri->has_node || cJSON_AddStringToObject(x, "node", node)) &&
              (ly = cJSON_AddArrayToObject(x, "layers")) &&
              cJSON_AddItemToArray(ly, cJSON_CreateNumber(ri->first)) &&
              cJSON_AddItemToArray(ly, cJSON_CreateNumber(ri->last)) &&
              cJSON_AddBoolToObject(x, "embed", ri->embed) && cJSON_AddBoolToObject(x, "head", ri->head) &&
              (!ri->backend[0] || cJSON_AddStringToObject(x, "backend", ri->backend)) &&
              cJSON_AddStringToObject(x, "endpoint", ri->endpoint);
    if (ok && (m->stated & RING_STATED_ESTIMATES))
        ok = cJSON_AddNumberToObject(x, "mem_bytes", (double)ri->mem_bytes) &&
             cJSON_AddNumberToObject(x, "est_ms_per_token", ri->est_ms_per_token);
    return ok;
}

/* A standby names the ranks it may take over unless that is every rank but 0 (the default). */
static bool put_standby(cJSON *jsb, const struct ring_manifest *m, const struct ring_standby_info *si)
{
    cJSON *x = add_object(jsb), *rk = NULL;
    if (!x)
        return false;
    char node[65];
    util_hex_encode(si->node, 32, node);
    uint64_t all = (m->n_ranks >= 64 ? ~0ull : (1ull << m->n_ranks) - 1) & ~1ull;
    bool ok = cJSON_AddStringToObject(x, "node", node) && cJSON_AddStringToObject(x, "endpoint", si->endpoint);
    if (!ok || si->ranks == all)
        return ok;
    ok = (rk = cJSON_AddArrayToObject(x, "ranks")) != NULL;
    for (uint32_t r = 0; ok && r < 64; r++)
        if (si->ranks >> r & 1)
            ok = cJSON_AddItemToArray(rk, cJSON_CreateNumber(r));
    return ok;
}

static bool put_manifest(cJSON *root, const struct ring_manifest *m)
{
    cJSON *jm = NULL, *jw = NULL, *jr = NULL, *jsb = NULL;
    bool ok = cJSON_AddNumberToObject(root, "version", m->version) &&
              cJSON_AddStringToObject(root, "ring", m->ring) &&
              (jm = cJSON_AddObjectToObject(root, "model")) &&
              cJSON_AddStringToObject(jm, "name", m->model_name) &&
              cJSON_AddStringToObject(jm, "catalog", m->catalog) &&
              cJSON_AddStringToObject(jm, "arch", m->arch) &&
              cJSON_AddNumberToObject(jm, "n_layers", m->n_layers) &&
              cJSON_AddNumberToObject(jm, "n_embd", m->n_embd) &&
              (jw = cJSON_AddObjectToObject(root, "wire")) &&
              cJSON_AddStringToObject(jw, "dtype", m->dtype) &&
              put_limits(root, m) &&
              (jr = cJSON_AddArrayToObject(root, "ranks"));
    for (uint32_t i = 0; ok && i < m->n_ranks; i++)
        ok = put_rank(jr, m, &m->ranks[i]);
    if (ok && m->n_own_standbys)
        ok = (jsb = cJSON_AddArrayToObject(root, "standby")) != NULL;
    for (uint32_t i = 0; ok && i < m->n_own_standbys; i++)
        ok = put_standby(jsb, m, &m->standbys[i]);
    return ok;
}

/* The tree of m and, checked by the parser, its text in cJSON_Print's layout (*text malloc'd). */
static int manifest_build(cJSON **tree, char **text, const struct ring_manifest *m, char *err, size_t errlen)
{
    *tree = NULL;
    *text = NULL;
    if (m->n_ranks > RING_MAX_RANKS || m->n_own_standbys > RING_MAX_STANDBYS) {
        snprintf(err, errlen, "manifest: %u ranks and %u standbys, at most %d and %d", m->n_ranks,
                 m->n_own_standbys, RING_MAX_RANKS, RING_MAX_STANDBYS);
        return -EINVAL;
    }
    for (uint32_t i = 0; (m->stated & RING_STATED_ESTIMATES) && i < m->n_ranks; i++)
        if (!isfinite(m->ranks[i].est_ms_per_token)) {
            snprintf(err, errlen, "manifest: ranks[%u].est_ms_per_token %g is not a finite number", i,
                     m->ranks[i].est_ms_per_token);
            return -EINVAL;
        }
    cJSON *root = cJSON_CreateObject();
    char *s = root && put_manifest(root, m) ? cJSON_Print(root) : NULL;
    if (!s) {
        cJSON_Delete(root);
        snprintf(err, errlen, "manifest: out of memory");
        return -ENOMEM;
    }
    struct ring_manifest *back = malloc(sizeof *back);
    int rc = back ? ring_manifest_parse(back, s, strlen(s), err, errlen) : -ENOMEM;
    free(back);
    if (rc < 0) {
        if (rc == -ENOMEM)
            snprintf(err, errlen, "manifest: out of memory");
        cJSON_Delete(root);
        free(s);
        return rc;
    }
    *tree = root;
    *text = s;
    return 0;
}

int ring_manifest_to_json(cJSON **out, const struct ring_manifest *m, char *err, size_t errlen)
{
    char *s;
    int rc = manifest_build(out, &s, m, err, errlen);
    free(s);
    return rc;
}

int ring_manifest_write(char **out, uint8_t hash[32], const struct ring_manifest *m, char *err,
                        size_t errlen)
{
    cJSON *tree;
    int rc = manifest_build(&tree, out, m, err, errlen);
    cJSON_Delete(tree);
    unsigned int hl = 32;
    if (rc == 0 && hash && EVP_Digest(*out, strlen(*out), hash, &hl, EVP_sha256(), NULL) != 1) {
        free(*out);
        *out = NULL;
        snprintf(err, errlen, "manifest: SHA-256 failed");
        rc = -EIO;
    }
    return rc;
}

int ring_roster_apply(struct ring_manifest *m, const char *json, size_t len, char *err, size_t errlen)
{
    if (len > MANIFEST_MAX_BYTES) {
        snprintf(err, errlen, "roster: %zu bytes, more than %d", len, MANIFEST_MAX_BYTES);
        return -EFBIG;
    }
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        snprintf(err, errlen, "roster: not a JSON object");
        return -EINVAL;
    }
    char want[65];
    util_hex_encode(m->hash, 32, want);
    const cJSON *man = cJSON_GetObjectItemCaseSensitive(root, "manifest");
    int rc;
    if (!cJSON_IsString(man) || strcmp(man->valuestring, want)) {
        snprintf(err, errlen, "roster: for manifest %.16s..., not this ring's %.16s...",
                 cJSON_IsString(man) ? man->valuestring : "(none)", want);
        rc = -ESTALE;
    } else {
        rc = parse_standbys(m, cJSON_GetObjectItemCaseSensitive(root, "standby"), err, errlen);
        if (rc < 0 && !strncmp(err, "manifest: ", 10))
            memcpy(err, "roster:   ", 10);
    }
    cJSON_Delete(root);
    return rc;
}

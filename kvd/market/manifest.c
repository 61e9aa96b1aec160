/* manifest.c — the ring's manifest as the market publishes it (docs/market.md, "The
 * manifest"): built from the plan and the leases once every window has an active stage, its
 * ring generation recorded when first served, and the long-poll stages wait on for a change. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <uv.h>

#include "kvd/kvd.h"
#include "kvd/market/internal.h"
#include "net/net.h"
#include "ring/ring.h"
#include "util/err.h"
#include "util/util.h"

struct kvd_market_poll {         /* a manifest long-poll waiting for a change */
    struct kvd_market_api *a;
    struct net_http_req *req;
    char model[65], after[65];
    double deadline;
    struct kvd_market_poll *next;
};

static bool complete(const struct kvd_market_state *ms)
{
    if (!ms->n)
        return false;
    for (size_t i = 0; i < ms->n; i++)
        if (ms->ls[i] != KVD_LS_ACTIVE)
            return false;
    return true;
}

/* ---- the manifest ---- */

/* The ring's manifest once every window has an active stage (else NULL); hash gets its
 * SHA-256. Built from the plan and leases only, so the same state gives the same bytes and a
 * replaced stage changes only its rank's entry. */
static char *manifest_build(const struct kvd_market_state *ms, const bool *keep, char hash[65]);

char *kvd_market__manifest_of(const struct kvd_market_state *ms, char hash[65])
{
    if (!complete(ms))
        return NULL;
    /* a rank a standby took over keeps its published entry, as long as the manifest is the
     * generation it was taken over in (the ring runs it); otherwise the manifest names the
     * windows' holders as they are */
    bool keep[KVD_MARKET_MAX_WINDOWS] = {false}, any = false;
    for (size_t i = 0; i < ms->n; i++)
        any |= keep[i] = ms->took_sha[i][0] != 0;
    char *s = manifest_build(ms, keep, hash);
    if (!any || !s)
        return s;
    bool again = false;
    for (size_t i = 0; i < ms->n; i++)
        if (keep[i] && strcmp(ms->took_sha[i], hash))
            keep[i] = false, again = true;
    if (!again)
        return s;
    free(s);
    return manifest_build(ms, keep, hash);
}

static char *manifest_build(const struct kvd_market_state *ms, const bool *keep, char hash[65])
{
    struct ring_manifest *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->version = 1;
    snprintf(m->ring, sizeof m->ring, "mkt-%.16s", ms->m.id);
    snprintf(m->model_name, sizeof m->model_name, "%s", ms->m.name);
    snprintf(m->catalog, sizeof m->catalog, "%s", ms->m.id);
    snprintf(m->arch, sizeof m->arch, "%s", ms->m.arch);
    m->n_layers = ms->m.n_layers;
    m->n_embd = ms->m.n_embd;
    snprintf(m->dtype, sizeof m->dtype, "f32");
    m->n_ranks = (uint32_t)ms->n;
    for (size_t i = 0; i < ms->n; i++) {
        struct ring_rank_info *ri = &m->ranks[i];
        ri->rank = (uint32_t)i;
        ri->has_node = util_hex_decode(keep[i] ? ms->mnode[i] : ms->l[i].node, ri->node, 32) == 0;
        ri->first = ms->w[i].first;
        ri->last = ms->w[i].last;
        ri->embed = i == 0;
        ri->head = i + 1 == ms->n;
        snprintf(ri->endpoint, sizeof ri->endpoint, "%s", keep[i] ? ms->mendpoint[i] : ms->l[i].endpoint);
    }
    char *s = NULL, err[KV_ERR_MAX];
    uint8_t dg[32];
    if (ring_manifest_write(&s, dg, m, err, sizeof err) == 0)
        util_hex_encode(dg, 32, hash);
    else
        kvd_log(KVD_LOG_ERROR, "model %.16s...: no manifest: %s", ms->m.id, err);
    free(m);
    return s;
}

static void answer_poll(struct kvd_market_poll *p, int status, char *man);

/* GET /v1/models/<id>/manifest?after=HASH&wait=S: the manifest once the ring is complete and
 * differs from HASH; waits up to S seconds for that (204 when it does not come). */
void kvd_market__manifest_get(struct kvd_market_api *a, struct net_http_req *req, const char *id)
{
    const char *q = net_http_req_query(req);
    char after[65] = "";
    double wait = 0;
    const char *x = strstr(q, "after=");
    if (x) {
        size_t n = strcspn(x + 6, "&");
        if (n > 64) {
            kvd_market__reply_err(req, 400, NULL, "after: expected a manifest's SHA-256 (64 hex digits)");
            return;
        }
        memcpy(after, x + 6, n);
        after[n] = 0;
    }
    if ((x = strstr(q, "wait="))) {
        wait = atof(x + 5);
        if (!(wait >= 0))
            wait = 0;
        if (wait > a->cfg.poll_max_s)
            wait = a->cfg.poll_max_s;
    }
    struct kvd_market_poll *p = calloc(1, sizeof *p);
    if (!p) {
        kvd_market__reply_err(req, 503, NULL, "out of memory");
        return;
    }
    p->a = a;
    p->req = req;
    snprintf(p->model, sizeof p->model, "%s", id);
    snprintf(p->after, sizeof p->after, "%s", after);
    p->deadline = kvd_market__now() + wait;
    answer_poll(p, 0, NULL);
}

/* Record the generation of a manifest about to be served (its own transaction): its nodes are
 * the ones whose receipts for sessions on it count (docs/market.md, "Receipts and credit"). */
static int gen_note(struct kvd_market_api *a, const char *model, const char *sha, const char *man,
                    double now)
{
    int rc = a->st->ops->begin(a->st->impl);
    if (rc == 0)
        rc = kvd_market__gen_record(a->st, model, sha, man, now);
    if (rc == 0)
        rc = a->st->ops->commit(a->st->impl);
    if (rc) {
        a->st->ops->rollback(a->st->impl);
        kvd_log(KVD_LOG_ERROR, "recording ring generation %.16s... of model %.16s...: %s", sha, model,
                a->st->err);
    }
    return rc;
}

/* Answer p if its manifest changed or its time is up: true when answered (p freed). */
static bool poll_try(struct kvd_market_poll *p)
{
    struct kvd_market_api *a = p->a;
    double now = kvd_market__now();
    struct kvd_market_state *ms = calloc(1, sizeof *ms);
    if (!ms || kvd_market__state_load(a, p->model, ms, now)) {
        if (ms && ms->m.catalog)
            kvd_market__model_clear(&ms->m);
        free(ms);
        kvd_market__reply_err(p->req, 404, NULL, "model %s is not registered", p->model);
        free(p);
        return true;
    }
    char hash[65];
    char *man = kvd_market__manifest_of(ms, hash);
    kvd_market__model_clear(&ms->m);
    free(ms);
    if (man && strcmp(hash, p->after) && gen_note(a, p->model, hash, man, now)) {
        kvd_market__reply_err(p->req, 503, NULL, "store: %s", a->st->err);
        free(man);
        free(p);
        return true;
    }
    if (man && strcmp(hash, p->after)) {
        char hdr[128];
        snprintf(hdr, sizeof hdr, "X-Kv-Manifest-Sha256: %s\r\nCache-Control: no-store\r\n", hash);
        net_http_reply(p->req, 200, "application/json", hdr, man, strlen(man));
        free(man);
        free(p);
        return true;
    }
    free(man);
    if (now >= p->deadline) {
        net_http_reply(p->req, 204, NULL, "Cache-Control: no-store\r\n", NULL, 0);
        free(p);
        return true;
    }
    return false;
}

static void poll_abort(void *ud)
{
    struct kvd_market_poll *p = ud;
    struct kvd_market_api *a = p->a;
    for (struct kvd_market_poll **pp = &a->polls; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    free(p);
}

static void answer_poll(struct kvd_market_poll *p, int status, char *man)
{
    (void)status;
    (void)man;
    if (poll_try(p))
        return;
    p->next = p->a->polls;
    p->a->polls = p;
    net_http_req_set_abort(p->req, poll_abort, p);
}

void kvd_market__polls_tick(struct kvd_market_api *a)
{
    struct kvd_market_poll **pp = &a->polls;
    while (*pp) {
        struct kvd_market_poll *p = *pp;
        *pp = p->next;
        net_http_req_set_abort(p->req, NULL, NULL);
        if (!poll_try(p)) {
            net_http_req_set_abort(p->req, poll_abort, p);
            p->next = *pp;
            *pp = p;
            pp = &p->next;
        }
    }
}

void kvd_market__polls_close(struct kvd_market_api *a)
{
    while (a->polls) {
        struct kvd_market_poll *p = a->polls;
        a->polls = p->next;
        net_http_req_set_abort(p->req, NULL, NULL);
        net_http_reply(p->req, 204, NULL, NULL, NULL, 0);
        free(p);
    }
}

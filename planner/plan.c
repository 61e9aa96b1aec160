/* plan.c — the planner's cost model and search (see plan.h for the model in short and
 * docs/planner.md for the long form). Pure: no I/O, no globals; scratch is allocated per call
 * and freed before returning. */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"
#include "planner/plan.h"
#include "util/util.h"
#include "util/err.h"

#define INF DBL_MAX
/* Relative tolerance when comparing periods and latencies of candidate plans. */
#define REL_EPS 1e-9
/* Heuristic search budget: DP runs in the local search, and their total work (devices x
 * layers^2 / 2 per run): keeps 1000 devices x 96 layers well under a second. */
#define LOCAL_MAX_DPS 400
#define LOCAL_MAX_WORK 1e7
/* Extra unused devices kept in the local-search pool. */
#define LOCAL_SPARE 16
/* Above this many devices the heuristic searches a pool (see search_heuristic). */
#define POOL_MIN 64
/* Dominance pruning compares devices pairwise: only up to this many. */
#define PRUNE_MAX 8192
#define POOL_SPARE 8
/* Exhaustive search is used only when its work (orders x devices x layers^2 / 2) fits here. */
#define EXHAUSTIVE_MAX_WORK 3e8

void plan_opts_default(struct plan_opts *o)
{
    memset(o, 0, sizeof *o);
    o->objective = PLAN_LATENCY;
    o->ctx = 4096;
    o->sessions = 4;
    o->headroom = 0.05;
    o->exhaustive_max = 6;
}

void plan_devices_local(struct plan_device *devs, const char *const *ids, size_t n,
                        uint64_t mem_bytes, double ms_per_layer_token)
{
    for (size_t i = 0; i < n; i++) {
        memset(&devs[i], 0, sizeof devs[i]);
        devs[i].id = ids[i];
        devs[i].backend = "cpu";
        devs[i].mem_bytes = mem_bytes;
        devs[i].ms_per_layer_token = ms_per_layer_token;
        devs[i].inbound = true;
    }
}

/* ------------------------------------------------------------------------------------------
 * Planning context: per usable device, prefix sums of layer time; per layer, memory. */

struct dev_info {
    uint32_t idx;          /* index into the caller's devices */
    uint64_t cap;          /* memory after headroom */
    uint64_t alloc;        /* largest allocation (0: no limit) */
    double embed_ms, head_ms;
    double rtt, bw;        /* bw 0: not limiting */
    double mean_layer_ms;  /* for ordering and explanations */
    double hop_key;        /* link cost of a middle rank, for ordering */
};

struct ctx {
    const struct plan_shape *s;
    const struct plan_device *devs;
    const struct plan_opts *o;
    uint32_t L, N;             /* layers, usable devices */
    struct dev_info *di;       /* N */
    double *T;                 /* N x (L+1) prefix sums of layer ms */
    uint64_t *M;               /* L+1 prefix sums of layer memory (weights + reserved KV/state) */
    uint64_t *A;               /* L+1 prefix sums of one session's K cache + state per layer */
    uint64_t embed_mem, head_mem;
    uint64_t head_embed_mem;   /* the drafter's token_embd on a last rank that is not rank 0 */
    uint64_t head_alloc;       /* one session's MTP K cache, beside the last window's */
    double wire, token;        /* bytes per token on the ranks' edges and the closing edge */
    /* DP scratch */
    double *D, *ND, *S, *NS;   /* value and secondary (latency under a period cap) */
    int32_t *choice;           /* (N) x (L+1): window start, or -1 skipped */
    uint64_t orders;
    double have;               /* memory of all usable devices (before pruning) */
    double *mean_ms;           /* per caller device: mean layer ms, then hop ms (2 x n) */
    uint32_t n_usable;
};

static uint64_t sat_add(uint64_t a, uint64_t b) { return a + b < a ? UINT64_MAX : a + b; }
static uint64_t sat_mul(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

struct stage {
    bool ok;
    double compute, link, xfer, lat, period;
    uint64_t mem;
};

static double layer_cost_ref(const struct plan_shape *s, bool *by_bytes)
{
    double sum = 0;
    uint32_t n = 0;
    bool bytes = false;
    for (uint32_t i = 0; i < s->n_layers; i++)
        if (s->layers[i].active_bytes) bytes = true;
    for (uint32_t i = 0; i < s->n_layers; i++) {
        double c = bytes ? (double)s->layers[i].active_bytes : s->layers[i].macs;
        if (c > 0) { sum += c; n++; }
    }
    *by_bytes = bytes;
    return n ? sum / n : 0;
}

/* ms per token for work (active bytes, macs) on device d; ref is the mean layer's cost. */
static double work_ms(const struct plan_device *d, double bytes, double macs, bool by_bytes,
                      double ref)
{
    if (d->ms_per_layer_token > 0) {
        double c = by_bytes ? bytes : macs;
        if (ref <= 0)
            return c > 0 ? d->ms_per_layer_token : 0;
        return d->ms_per_layer_token * c / ref;
    }
    double t = 0;
    if (d->flops > 0) t = fmax(t, 2.0 * macs / d->flops);
    if (d->mem_bw_bytes_s > 0) t = fmax(t, bytes / d->mem_bw_bytes_s);
    return t * 1000.0;
}

static struct stage stage_cost(const struct ctx *c, uint32_t k, uint32_t j, uint32_t j2)
{
    struct stage st = {0};
    const struct dev_info *d = &c->di[k];
    bool first = j == 0, last = j2 == c->L;
    uint64_t mem = c->M[j2] - c->M[j], alloc = c->A[j2] - c->A[j];
    if (first) mem = sat_add(mem, c->embed_mem);
    if (last) {
        mem = sat_add(mem, sat_add(c->head_mem, first ? 0 : c->head_embed_mem));
        alloc = sat_add(alloc, c->head_alloc);
    }
    if (mem > d->cap || (d->alloc && alloc > d->alloc))
        return st;
    st.mem = mem;
    st.compute = c->T[(size_t)k * (c->L + 1) + j2] - c->T[(size_t)k * (c->L + 1) + j];
    if (first) st.compute += d->embed_ms;
    if (last) st.compute += d->head_ms;
    if (!(first && last)) {
        double in = first ? c->token : c->wire, out = last ? c->token : c->wire;
        st.xfer = d->bw > 0 ? (in + out) / d->bw * 1000.0 : 0;
        st.link = d->rtt + st.xfer;
    }
    st.lat = st.compute + st.link;
    st.period = fmax(st.compute, st.xfer);
    st.ok = true;
    return st;
}

/* One DP over a device order (indices into di). mode 0: min latency (secondary: period);
 * mode 1: min period; mode 2: min latency subject to period <= cap. Returns the objective at
 * L (INF if infeasible); *reach gets the furthest layer prefix any partial plan covers.
 * The inner loop is stage_cost() unrolled: a window [j, j2) is a middle window unless it
 * starts at 0 (embedding, token in) or ends at L (head, token out). */
static double dp_run(struct ctx *c, const uint32_t *ord, uint32_t n, int mode, double cap,
                     double *second, uint32_t *reach)
{
    uint32_t L = c->L;
    double *D = c->D, *ND = c->ND, *S = c->S, *NS = c->NS;
    const uint64_t *M = c->M;
    for (uint32_t j = 0; j <= L; j++) D[j] = S[j] = INF;
    D[0] = S[0] = 0;
    uint32_t far = 0;
    c->orders++;
    for (uint32_t i = 0; i < n; i++) {
        const struct dev_info *d = &c->di[ord[i]];
        const double *T = c->T + (size_t)ord[i] * (L + 1);
        int32_t *ch = c->choice + (size_t)i * (L + 1);
        memcpy(ND, D, (L + 1) * sizeof *D);
        memcpy(NS, S, (L + 1) * sizeof *S);
        for (uint32_t j = 0; j <= L; j++) ch[j] = -1;
        /* link shares by position: middle, first (token in), last (token out) */
        double xm = d->bw > 0 ? 2 * c->wire / d->bw * 1000.0 : 0;
        double xe = d->bw > 0 ? (c->wire + c->token) / d->bw * 1000.0 : 0;
        for (uint32_t j = 0; j < L; j++) {
            if (D[j] == INF)
                continue;
            uint64_t room = d->cap;
            /* the last window's extras: the head, the MTP blocks and (not on rank 0) the
             * drafter's token_embd */
            uint64_t tail = sat_add(c->head_mem, j == 0 ? 0 : c->head_embed_mem);
            double extra = 0;
            if (j == 0) {
                if (c->embed_mem > room) continue;
                room -= c->embed_mem;
                extra = d->embed_ms;
            }
            uint64_t base = M[j], abase = c->A[j];
            double t0 = T[j] - extra, dj = D[j], sj = S[j];
            for (uint32_t j2 = j + 1; j2 <= L; j2++) {
                uint64_t mem = M[j2] - base;
                if (mem > room) break;      /* memory only grows with the window */
                if (d->alloc && c->A[j2] - abase > d->alloc) break;   /* so does the K cache */
                double comp = T[j2] - t0, x;
                if (j2 == L) {
                    if (sat_add(mem, tail) > room) continue;
                    if (d->alloc && sat_add(c->A[j2] - abase, c->head_alloc) > d->alloc) continue;
                    comp += d->head_ms;
                    x = j == 0 ? 0 : xe;
                } else {
                    x = j == 0 ? xe : xm;
                }
                double link = (j == 0 && j2 == L) ? 0 : d->rtt + x;
                double per = comp > x ? comp : x, lat = comp + link;
                if (j2 > far) far = j2;
                double v, w;
                if (mode == 1) {
                    v = dj > per ? dj : per;
                    w = sj + lat;
                } else {
                    if (mode == 2 && per > cap)
                        continue;
                    v = dj + lat;
                    w = sj > per ? sj : per;
                }
                if (v < ND[j2] || (v == ND[j2] && w < NS[j2])) {
                    ND[j2] = v;
                    NS[j2] = w;
                    ch[j2] = (int32_t)j;
                }
            }
        }
        double *t = D; D = ND; ND = t;
        t = S; S = NS; NS = t;
    }
    double res = D[L], sec = S[L];
    if (D != c->D) {
        memcpy(c->D, D, (L + 1) * sizeof *D);
        memcpy(c->S, S, (L + 1) * sizeof *S);
    }
    if (second) *second = sec;
    if (reach) *reach = far;
    return res;
}

/* Rebuild the windows of the last dp_run: fills used[] (positions in ord) and starts. */
static uint32_t dp_backtrack(const struct ctx *c, uint32_t n, uint32_t *pos, uint32_t *start,
                             uint32_t *end)
{
    uint32_t L = c->L, j = L, k = 0;
    for (uint32_t i = n; i-- > 0 && j > 0;) {
        int32_t s = c->choice[(size_t)i * (L + 1) + j];
        if (s < 0)
            continue;
        pos[k] = i;
        start[k] = (uint32_t)s;
        end[k] = j;
        k++;
        j = (uint32_t)s;
    }
    /* reverse into ring order */
    for (uint32_t a = 0, b = k ? k - 1 : 0; a < b; a++, b--) {
        uint32_t t = pos[a]; pos[a] = pos[b]; pos[b] = t;
        t = start[a]; start[a] = start[b]; start[b] = t;
        t = end[a]; end[a] = end[b]; end[b] = t;
    }
    return k;
}

static bool better(const struct ctx *c, double lat, double per, double blat, double bper)
{
    if (lat == INF)
        return false;
    if (blat == INF)
        return true;
    double p = c->o->objective == PLAN_THROUGHPUT ? per : lat;
    double s = c->o->objective == PLAN_THROUGHPUT ? lat : per;
    double bp = c->o->objective == PLAN_THROUGHPUT ? bper : blat;
    double bs = c->o->objective == PLAN_THROUGHPUT ? blat : bper;
    if (p < bp * (1 - REL_EPS))
        return true;
    if (p > bp * (1 + REL_EPS))
        return false;
    return s < bs * (1 - REL_EPS);
}

/* Evaluate an order under the objective: latency mode one DP; throughput mode min period,
 * then min latency under it. Fills *lat, *per; the DP scratch then holds the final run. */
static void eval_order(struct ctx *c, const uint32_t *ord, uint32_t n, double *lat, double *per,
                       uint32_t *reach)
{
    if (c->o->objective == PLAN_THROUGHPUT) {
        double p = dp_run(c, ord, n, 1, 0, NULL, reach);
        if (p == INF) { *lat = *per = INF; return; }
        double cap = p * (1 + REL_EPS) + 1e-12;
        double l = dp_run(c, ord, n, 2, cap, per, NULL);
        *lat = l;
        if (l == INF) *per = INF;
    } else {
        *lat = dp_run(c, ord, n, 0, 0, per, reach);
    }
}

/* ------------------------------------------------------------------------------------------
 * Orders for the heuristic search. */

/* Sort keys; ties go by index so that results do not depend on the sort algorithm. */
enum order_key { K_SLOW_FIRST, K_FAST_FIRST, K_MEM_DESC, K_MEM_ASC, K_HOP, K_VALUE, K_COUNT };

static double order_key(const struct ctx *c, uint32_t k, enum order_key key)
{
    const struct dev_info *x = &c->di[k];
    switch (key) {
    case K_SLOW_FIRST: return -x->mean_layer_ms;
    case K_FAST_FIRST: return x->mean_layer_ms;
    case K_MEM_DESC:   return -(double)x->cap;
    case K_MEM_ASC:    return (double)x->cap;
    case K_HOP:        return x->hop_key + x->mean_layer_ms;
    /* memory per unit of cost: big, fast devices last (the last rank carries the head) */
    case K_VALUE:      return (double)x->cap / (x->mean_layer_ms + x->hop_key + 1e-9);
    default:           return 0;
    }
}

struct sort_arg { const struct ctx *c; enum order_key key; };

static int cmp_order(const void *a, const void *b, void *arg)
{
    const struct sort_arg *sa = arg;
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    double kx = order_key(sa->c, x, sa->key), ky = order_key(sa->c, y, sa->key);
    if (kx < ky) return -1;
    if (kx > ky) return 1;
    return x < y ? -1 : x > y;
}

static void sort_order(const struct ctx *c, uint32_t *ord, uint32_t n, enum order_key key)
{
    struct sort_arg sa = {c, key};
    qsort_r(ord, n, sizeof *ord, cmp_order, &sa);
}

/* ------------------------------------------------------------------------------------------ */


/* Bytes of layer l on its device: its weights, and per session its KV and recurrent state;
 * with drafting, a recurrent layer's checkpoint (its state again) and the verifying pass's
 * input rows kept beside it (counted per layer, which overcounts a window of several). */
static uint64_t layer_mem(const struct plan_layer *l, const struct plan_shape *s,
                          const struct plan_opts *o)
{
    uint64_t per_session = sat_add(l->state_bytes, sat_mul(l->kv_bytes_per_token, o->ctx));
    if (o->draft_max && l->state_bytes)
        per_session = sat_add(per_session, sat_add(l->state_bytes,
                              sat_mul((uint64_t)o->draft_max + 1, (uint64_t)s->n_embd * 4)));
    return sat_add(l->weight_bytes, sat_mul(per_session, o->sessions));
}

/* One session's bytes of layer l in a single allocation of the runtime: its K cache (the V
 * cache is another, as large) and its recurrent state, counted together (conservative: they
 * are separate allocations too). */
static uint64_t layer_alloc(const struct plan_layer *l, const struct plan_opts *o)
{
    return sat_add(l->state_bytes, sat_mul(l->kv_bytes_per_token / 2, o->ctx));
}

static bool bad_num(double v) { return !(v >= 0) || isinf(v); }

static int validate(const struct plan_shape *s, const struct plan_device *devs, size_t n,
                    const struct plan_opts *o, char *err, size_t errlen)
{
    if (!s || !o) { util_seterr(err, errlen, "plan: no shape or options"); return -EINVAL; }
    if (s->n_layers == 0 || s->n_layers > PLAN_MAX_LAYERS) {
        util_seterr(err, errlen, "plan: n_layers %u out of range [1, %u]", s->n_layers, PLAN_MAX_LAYERS);
        return -EINVAL;
    }
    if (!s->layers) { util_seterr(err, errlen, "plan: shape has no layers"); return -EINVAL; }
    if (n == 0 || !devs) {
        util_seterr(err, errlen, "plan: no devices given (the device list is empty)");
        return -EINVAL;
    }
    if (n > PLAN_MAX_DEVICES) {
        util_seterr(err, errlen, "plan: %zu devices exceed the limit %u", n, PLAN_MAX_DEVICES);
        return -EINVAL;
    }
    if (!(o->headroom >= 0 && o->headroom <= 0.95)) {
        util_seterr(err, errlen, "plan: headroom %g out of range [0, 0.95]", o->headroom);
        return -EINVAL;
    }
    if (o->sessions == 0 || o->sessions > 1u << 20) {
        util_seterr(err, errlen, "plan: sessions %u out of range [1, %u]", o->sessions, 1u << 20);
        return -EINVAL;
    }
    if (o->draft_max > 64) {
        util_seterr(err, errlen, "plan: draft_max %u out of range [0, 64]", o->draft_max);
        return -EINVAL;
    }
    if (o->ctx > 1u << 26) {
        util_seterr(err, errlen, "plan: ctx %u exceeds %u", o->ctx, 1u << 26);
        return -EINVAL;
    }
    const uint64_t big = 1ull << 52;  /* 4.5 PB: anything above is a broken input */
    for (uint32_t i = 0; i < s->n_layers; i++) {
        const struct plan_layer *l = &s->layers[i];
        if (l->weight_bytes > big || l->active_bytes > big || l->kv_bytes_per_token > (1ull << 32) ||
            l->state_bytes > big || bad_num(l->macs) || l->macs > 1e18) {
            util_seterr(err, errlen, "plan: layer %u has an out-of-range size (weight %llu, active %llu, "
                       "kv/token %llu, state %llu, macs %g)", i, (unsigned long long)l->weight_bytes,
                       (unsigned long long)l->active_bytes, (unsigned long long)l->kv_bytes_per_token,
                       (unsigned long long)l->state_bytes, l->macs);
            return -EINVAL;
        }
    }
    if (s->embed_bytes > big || s->head_bytes > big || s->head_active_bytes > big ||
        s->embed_active_bytes > big || bad_num(s->head_macs) || s->wire_bytes_per_token > (1ull << 32)) {
        util_seterr(err, errlen, "plan: embedding/head/wire sizes out of range");
        return -EINVAL;
    }
    if (s->mtp_blocks > PLAN_MAX_LAYERS || s->mtp.weight_bytes > big || s->mtp.active_bytes > big ||
        s->mtp.kv_bytes_per_token > (1ull << 32) || s->mtp.state_bytes > big || bad_num(s->mtp.macs) ||
        s->mtp.macs > 1e18 || s->mtp_embed_bytes > big) {
        util_seterr(err, errlen, "plan: MTP blocks (%u) or their sizes out of range", s->mtp_blocks);
        return -EINVAL;
    }
    return 0;
}

static int excl_add(struct plan_result *r, uint32_t dev, enum plan_exclusion why, const char *fmt, ...)
{
    struct plan_excluded *e = &r->excluded[r->n_excluded++];
    e->device = dev;
    e->why = why;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->reason, sizeof e->reason, fmt, ap);
    va_end(ap);
    return 0;
}

static void ctx_free(struct ctx *c)
{
    free(c->di); free(c->T); free(c->M); free(c->A);
    free(c->D); free(c->ND); free(c->S); free(c->NS); free(c->choice); free(c->mean_ms);
}

/* Explain why an order search found nothing: bytes short and layers left. */
static void explain_infeasible(struct ctx *c, uint32_t reach, char *err, size_t errlen)
{
    const struct plan_opts *o = c->o;
    uint32_t L = c->L;
    /* a ring of two ranks or more: the last one keeps the drafter's token_embd too */
    double need = (double)c->M[L] + (double)c->embed_mem + (double)c->head_mem + (double)c->head_embed_mem;
    double have = c->have, largest = 0;
    for (uint32_t k = 0; k < c->N; k++)
        if (c->di[k].cap > largest) largest = (double)c->di[k].cap;
    char nb[32], hb[32], sb[32], rb[32];
    util_fmt_bytes(nb, sizeof nb, need, 2, UTIL_FMT_SI);
    util_fmt_bytes(hb, sizeof hb, have, 2, UTIL_FMT_SI);
    double rest = (double)(c->M[L] - c->M[reach]) + (double)c->head_mem +
                  (reach == 0 ? (double)c->embed_mem : (double)c->head_embed_mem);
    util_fmt_bytes(rb, sizeof rb, rest, 2, UTIL_FMT_SI);
    const char *tail = c->s->mtp_blocks && !o->no_mtp ? "head, MTP blocks" : "head";
    if (need > have) {
        util_fmt_bytes(sb, sizeof sb, need - have, 2, UTIL_FMT_SI);
        util_seterr(err, errlen, "does not fit: the model needs %.0f bytes (%s: %u layers with ctx %u x %u "
                   "sessions, embedding, %s) but the %u usable devices offer %.0f bytes (%s) after "
                   "%.0f%% headroom: short by %.0f bytes (%s); at best layers [0, %u) fit, layers [%u, %u) "
                   "(+ %s) find no room (%.0f bytes, %s)",
                   need, nb, L, o->ctx, o->sessions, tail, c->n_usable, have, hb, o->headroom * 100, need - have,
                   sb, reach, reach, L, tail, rest, rb);
    } else {
        util_seterr(err, errlen, "does not fit: the devices offer %.0f bytes (%s) for %.0f needed (%s), "
                   "but no cut into windows fits their sizes (largest device %.0f bytes); at best layers "
                   "[0, %u) fit, layers [%u, %u) (+ %s) find no room: short by %.0f bytes (%s)",
                   have, hb, need, nb, largest, reach, reach, L, tail, rest, rb);
    }
}

static int fill_result(struct ctx *c, const uint32_t *ord, uint32_t n, struct plan_result *r)
{
    uint32_t *pos = malloc(3 * (size_t)(c->L + 1) * sizeof *pos);
    if (!pos) return -ENOMEM;
    uint32_t *st = pos + c->L + 1, *en = st + c->L + 1;
    uint32_t k = dp_backtrack(c, n, pos, st, en);
    r->ranks = calloc(k ? k : 1, sizeof *r->ranks);
    if (!r->ranks) { free(pos); return -ENOMEM; }
    r->n_ranks = k;
    double lat = 0, per = 0;
    for (uint32_t i = 0; i < k; i++) {
        uint32_t dk = ord[pos[i]];
        struct stage s = stage_cost(c, dk, st[i], en[i]);
        struct plan_rank *rk = &r->ranks[i];
        rk->device = c->di[dk].idx;
        rk->first = st[i];
        rk->last = en[i];
        rk->embed = st[i] == 0;
        rk->head = en[i] == c->L;
        rk->relay = k > 1 && !c->devs[rk->device].inbound;
        rk->mem_bytes = s.mem;
        rk->mem_avail_bytes = c->di[dk].cap;
        for (uint32_t l = st[i]; l < en[i]; l++) {
            rk->expert_bytes += c->s->layers[l].expert_bytes;
            rk->active_bytes += c->s->layers[l].active_bytes;
        }
        if (rk->embed) rk->active_bytes += c->s->embed_active_bytes;
        if (rk->head) rk->active_bytes += c->s->head_active_bytes;
        if (rk->head && c->s->mtp_blocks && !c->o->no_mtp) {
            rk->mtp_blocks = c->s->mtp_blocks;
            rk->mtp_mem_bytes = sat_add(layer_mem(&c->s->mtp, c->s, c->o), rk->embed ? 0 : c->head_embed_mem);
            rk->expert_bytes += c->s->mtp.expert_bytes;
            rk->active_bytes += c->s->mtp.active_bytes;
        }
        rk->compute_ms = s.compute;
        rk->link_ms = s.link;
        rk->transfer_ms = s.xfer;
        rk->est_ms_per_token = s.lat;
        lat += s.lat;
        per = fmax(per, s.period);
    }
    free(pos);
    r->ms_per_token = lat;
    r->period_ms = per;
    r->tokens_per_s_1 = lat > 0 ? 1000.0 / lat : INFINITY;
    double tk = lat > 0 ? c->o->sessions * 1000.0 / lat : INFINITY;
    double tp = per > 0 ? 1000.0 / per : INFINITY;
    r->tokens_per_s_k = fmin(tk, tp);
    r->k = c->o->sessions;
    return 0;
}

/* a is at least as good as b in every respect that costs: memory, every layer's time, the
 * embedding and head, rtt and bandwidth. *same: equal in all of them. */
static bool dominates(const struct ctx *c, uint32_t a, uint32_t b, bool *same)
{
    const struct dev_info *x = &c->di[a], *y = &c->di[b];
    uint32_t L = c->L;
    const double *Ta = c->T + (size_t)a * (L + 1), *Tb = c->T + (size_t)b * (L + 1);
    if (x->cap < y->cap || x->rtt > y->rtt || x->embed_ms > y->embed_ms || x->head_ms > y->head_ms ||
        Ta[L] > Tb[L] || (x->alloc && (!y->alloc || x->alloc < y->alloc)))
        return false;
    if (x->bw > 0 && (y->bw == 0 || x->bw < y->bw))
        return false;
    bool eq = x->cap == y->cap && x->rtt == y->rtt && x->embed_ms == y->embed_ms &&
              x->head_ms == y->head_ms && x->bw == y->bw && x->alloc == y->alloc;
    for (uint32_t i = 0; i < L; i++) {
        double ta = Ta[i + 1] - Ta[i], tb = Tb[i + 1] - Tb[i];
        if (ta > tb) return false;
        if (ta != tb) eq = false;
    }
    *same = eq;
    return true;
}

static int cmp_total(const void *a, const void *b, void *arg)
{
    const struct ctx *c = arg;
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    double tx = c->T[(size_t)x * (c->L + 1) + c->L], ty = c->T[(size_t)y * (c->L + 1) + c->L];
    return tx < ty ? -1 : tx > ty ? 1 : (x < y ? -1 : x > y);
}

/* Exact pruning. A plan has at most R = min(L, N) ranks. If a device b has R others that
 * dominate it (strictly better somewhere, or identical with a lower index), any plan using
 * b leaves one of them unused, and putting it in b's place costs no more; repeating this
 * ends (each swap moves to a device earlier in a fixed total order), so some optimal plan
 * uses no pruned device. Pruned devices are listed as not needed. */
static int prune_dominated(struct ctx *c, struct plan_result *r)
{
    uint32_t N = c->N, R = c->L < N ? c->L : N;
    if (N <= 1 || N > PRUNE_MAX) return 0;   /* pairwise: above that the pool search copes */
    uint32_t *byt = malloc(N * sizeof *byt);
    bool *gone = calloc(N, sizeof *gone);
    uint32_t *cnt = calloc(N, sizeof *cnt);
    if (!byt || !gone || !cnt) { free(byt); free(gone); free(cnt); return -ENOMEM; }
    for (uint32_t i = 0; i < N; i++) byt[i] = i;
    qsort_r(byt, N, sizeof *byt, cmp_total, c);
    for (uint32_t bi = 0; bi < N; bi++) {
        uint32_t b = byt[bi], n = 0;
        double tb = c->T[(size_t)b * (c->L + 1) + c->L];
        for (uint32_t ai = 0; ai < N && n < R; ai++) {
            uint32_t a = byt[ai];
            if (a == b) continue;
            if (c->T[(size_t)a * (c->L + 1) + c->L] > tb) break;
            bool same;
            if (dominates(c, a, b, &same) && (!same || c->di[a].idx < c->di[b].idx))
                n++;
        }
        cnt[b] = n;
        gone[b] = n >= R;
    }
    uint32_t k = 0;
    for (uint32_t i = 0; i < N; i++) {
        if (gone[i]) {
            const struct plan_device *d = &c->devs[c->di[i].idx];
            excl_add(r, c->di[i].idx, PLAN_EX_NOT_NEEDED,
                     "%s: not needed: %u other devices are as big, as fast on every layer and as "
                     "well connected, more than a ring of %u layers can use", d->id ? d->id : "?",
                     cnt[i], c->L);
            continue;
        }
        if (k != i) {
            c->di[k] = c->di[i];
            memmove(c->T + (size_t)k * (c->L + 1), c->T + (size_t)i * (c->L + 1),
                    (c->L + 1) * sizeof *c->T);
        }
        k++;
    }
    c->N = k;
    free(byt); free(gone); free(cnt);
    return 0;
}

/* Heap's algorithm over all orders of the N usable devices. */
static void search_exhaustive(struct ctx *c, uint32_t *ord, uint32_t *best, double *blat,
                              double *bper, uint32_t *reach)
{
    uint32_t N = c->N, cnt[16] = {0};
    for (uint32_t i = 0; i < N; i++) ord[i] = i;
    bool thr = c->o->objective == PLAN_THROUGHPUT;
    /* Throughput: the optimal period first (min over orders), then min latency under it. */
    double pstar = INF;
    for (int pass = thr ? 0 : 1; pass < 2; pass++) {
        for (uint32_t i = 0; i < N; i++) { ord[i] = i; cnt[i] = 0; }
        uint32_t i = 0;
        for (;;) {
            uint32_t far = 0;
            if (pass == 0) {
                double p = dp_run(c, ord, N, 1, 0, NULL, &far);
                if (p < pstar) pstar = p;
            } else if (thr) {
                double per = INF;
                double l = pstar == INF ? INF
                         : dp_run(c, ord, N, 2, pstar * (1 + REL_EPS) + 1e-12, &per, &far);
                if (better(c, l, per, *blat, *bper)) {
                    *blat = l; *bper = per; memcpy(best, ord, N * sizeof *ord);
                }
            } else {
                double per = INF;
                double l = dp_run(c, ord, N, 0, 0, &per, &far);
                if (better(c, l, per, *blat, *bper)) {
                    *blat = l; *bper = per; memcpy(best, ord, N * sizeof *ord);
                }
            }
            if (far > *reach) *reach = far;
            /* next permutation (iterative Heap) */
            while (i < N && cnt[i] >= i) { cnt[i] = 0; i++; }
            if (i >= N) break;
            uint32_t a = (i % 2 == 0) ? 0 : cnt[i];
            uint32_t t = ord[a]; ord[a] = ord[i]; ord[i] = t;
            cnt[i]++;
            i = 1;
            if (N < 2) break;
        }
    }
}

static void search_heuristic(struct ctx *c, uint32_t *ord, uint32_t *best, uint32_t *bestn,
                             double *blat, double *bper, uint32_t *reach)
{
    uint32_t N = c->N;
    /* Many devices: search within a pool, the union over the ranking keys of the best
     * devices by that key: enough to hold the model twice over (latency) or one per layer
     * (throughput), plus a few spare. */
    uint32_t *cand = NULL, nc = N;
    if (N > POOL_MIN) {
        bool *inpool = calloc(N, sizeof *inpool);
        cand = malloc(N * sizeof *cand);
        if (inpool && cand) {
            double need = (double)c->M[c->L] + (double)c->embed_mem + (double)c->head_mem +
                          (double)c->head_embed_mem;
            nc = 0;
            for (int m = 0; m < K_COUNT; m++) {
                for (uint32_t i = 0; i < N; i++) ord[i] = i;
                sort_order(c, ord, N, (enum order_key)m);
                if (m == K_SLOW_FIRST || m == K_MEM_ASC) {   /* best last: walk from the end */
                    for (uint32_t a = 0, b = N - 1; a < b; a++, b--) { uint32_t t = ord[a]; ord[a] = ord[b]; ord[b] = t; }
                }
                double got = 0;
                uint32_t take = 0, lim = c->L + POOL_SPARE;
                for (uint32_t i = 0; i < N && take < lim; i++) {
                    if (c->o->objective == PLAN_LATENCY && got >= 2 * need && take >= POOL_SPARE)
                        break;
                    got += (double)c->di[ord[i]].cap;
                    take++;
                    if (!inpool[ord[i]]) { inpool[ord[i]] = true; cand[nc++] = ord[i]; }
                }
            }
        } else {
            free(cand);
            cand = NULL;
        }
        free(inpool);
    }
    for (int m = 0; m < K_COUNT; m++) {
        if (cand) memcpy(ord, cand, nc * sizeof *ord);
        else for (uint32_t i = 0; i < N; i++) ord[i] = i;
        N = nc;
        sort_order(c, ord, N, (enum order_key)m);
        double lat, per;
        uint32_t far = 0;
        eval_order(c, ord, N, &lat, &per, &far);
        if (far > *reach) *reach = far;
        if (better(c, lat, per, *blat, *bper)) {
            *blat = lat; *bper = per; *bestn = N;
            memcpy(best, ord, N * sizeof *ord);
        }
    }
    free(cand);
    N = c->N;
    if (*blat == INF)
        return;
    /* Local search: the devices used by the best order, then spare unused ones (fastest
     * first), in a pool; adjacent swaps and moves that lower the objective are kept. */
    eval_order(c, best, *bestn, &(double){0}, &(double){0}, NULL);
    uint32_t *pos = malloc(3 * (size_t)(c->L + 1) * sizeof *pos);
    bool *in = calloc(N, sizeof *in);
    if (!pos || !in) { free(pos); free(in); return; }
    uint32_t *st = pos + c->L + 1, *en = st + c->L + 1;
    uint32_t k = dp_backtrack(c, *bestn, pos, st, en), pn = 0;
    uint32_t *pool = ord; /* reuse */
    for (uint32_t i = 0; i < k; i++) { pool[pn++] = best[pos[i]]; in[best[pos[i]]] = true; }
    uint32_t *rest = malloc((N + 1) * sizeof *rest), rn = 0;
    if (rest) {
        for (uint32_t i = 0; i < N; i++) if (!in[i]) rest[rn++] = i;
        sort_order(c, rest, rn, K_FAST_FIRST);
        for (uint32_t i = 0; i < rn && i < LOCAL_SPARE; i++) pool[pn++] = rest[i];
    }
    free(rest); free(in); free(pos);
    double plat, pper;
    eval_order(c, pool, pn, &plat, &pper, NULL);
    if (better(c, plat, pper, *blat, *bper)) {
        *blat = plat; *bper = pper; *bestn = pn; memcpy(best, pool, pn * sizeof *pool);
    } else if (!(plat < INF)) {
        return;
    } else {
        /* the pool holds the best plan's devices in order: as good, keep it as the base */
        *blat = plat; *bper = pper; *bestn = pn; memcpy(best, pool, pn * sizeof *pool);
    }
    int dps = 0;
    double per_dp = (double)pn * ((double)c->L * c->L / 2 + c->L) *
                    (c->o->objective == PLAN_THROUGHPUT ? 2 : 1);
    int max_dps = (int)fmin(LOCAL_MAX_DPS, LOCAL_MAX_WORK / per_dp);
    bool improved = true;
    while (improved && dps < max_dps) {
        improved = false;
        for (uint32_t a = 0; a + 1 < pn && dps < max_dps; a++) {
            for (uint32_t b = a + 1; b < pn && dps < max_dps; b++) {
                uint32_t t = pool[a]; pool[a] = pool[b]; pool[b] = t;
                double l, p;
                eval_order(c, pool, pn, &l, &p, NULL);
                dps++;
                if (better(c, l, p, *blat, *bper)) {
                    *blat = l; *bper = p; memcpy(best, pool, pn * sizeof *pool);
                    improved = true;
                } else {
                    t = pool[a]; pool[a] = pool[b]; pool[b] = t;
                }
            }
        }
    }
}

/* Keep only the devices whose di index has keep[] set (order kept). */
static void keep_devices(struct ctx *c, const bool *keep)
{
    uint32_t k = 0;
    for (uint32_t i = 0; i < c->N; i++) {
        if (!keep[i]) continue;
        if (k != i) {
            c->di[k] = c->di[i];
            memmove(c->T + (size_t)k * (c->L + 1), c->T + (size_t)i * (c->L + 1), (c->L + 1) * sizeof *c->T);
        }
        k++;
    }
    c->N = k;
}

/* The plan uses more ranks than allowed: keep the max_ranks used devices that give the most
 * memory per unit of cost (then, if that does not fit, the ones with the most memory) and
 * plan again among them; the others are listed as dropped. */
static int limit_ranks(struct ctx *c, struct plan_result *r, uint32_t *ord, uint32_t *best,
                       char *err, size_t errlen)
{
    uint32_t maxr = c->o->max_ranks, n = r->n_ranks;
    uint32_t *u = malloc(n * sizeof *u);
    bool *keep = calloc(c->N, sizeof *keep);
    if (!u || !keep) { free(u); free(keep); return -ENOMEM; }
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t k = 0; k < c->N; k++)
            if (c->di[k].idx == r->ranks[i].device) u[i] = k;
    int rc = -ENOSPC;
    uint32_t N0 = c->N;
    size_t tn = (size_t)N0 * (c->L + 1);
    struct dev_info *di0 = malloc(N0 * sizeof *di0);
    double *T0 = malloc(tn * sizeof *T0);
    if (!di0 || !T0) { free(di0); free(T0); free(u); free(keep); return -ENOMEM; }
    memcpy(di0, c->di, N0 * sizeof *di0);
    memcpy(T0, c->T, tn * sizeof *T0);
    for (int attempt = 0; attempt < 2 && rc == -ENOSPC; attempt++) {
        c->N = N0;
        memcpy(c->di, di0, N0 * sizeof *di0);
        memcpy(c->T, T0, tn * sizeof *T0);
        sort_order(c, u, n, attempt == 0 ? K_VALUE : K_MEM_ASC);   /* best last */
        memset(keep, 0, N0 * sizeof *keep);
        for (uint32_t i = n - maxr; i < n; i++) keep[u[i]] = true;
        keep_devices(c, keep);
        double blat = INF, bper = INF;
        uint32_t reach = 0, bestn = c->N;
        search_heuristic(c, ord, best, &bestn, &blat, &bper, &reach);
        if (blat == INF) {
            /* say it in bytes and layers, for the devices kept */
            c->have = 0;
            for (uint32_t k = 0; k < c->N; k++) c->have += (double)c->di[k].cap;
            c->n_usable = c->N;
            char sub[KV_ERR_MAX - 64];
            explain_infeasible(c, reach, sub, sizeof sub);
            util_seterr(err, errlen, "in at most %u ranks (the unlimited plan needs %u): %s", maxr, n, sub);
            continue;
        }
        double l, p;
        eval_order(c, best, bestn, &l, &p, NULL);
        free(r->ranks);
        r->ranks = NULL;
        r->n_ranks = 0;
        rc = fill_result(c, best, bestn, r);
        if (rc) break;
        for (uint32_t i = 0; i < n; i++) {
            uint32_t dev = di0[u[i]].idx;
            bool still = false;
            for (uint32_t k = 0; k < r->n_ranks; k++) if (r->ranks[k].device == dev) still = true;
            if (!still)
                excl_add(r, dev, PLAN_EX_MAX_RANKS, "%s: dropped: a ring may have at most %u ranks",
                         c->devs[dev].id ? c->devs[dev].id : "?", maxr);
        }
    }
    free(di0);
    free(T0);
    free(u); free(keep);
    return rc;
}

int plan_make(struct plan_result **out, const struct plan_shape *s,
              const struct plan_device *devs, size_t n_devs, const struct plan_opts *o,
              char *err, size_t errlen)
{
    *out = NULL;
    int rc = validate(s, devs, n_devs, o, err, errlen);
    if (rc) return rc;
    struct ctx c = {.s = s, .devs = devs, .o = o, .L = s->n_layers};
    struct plan_result *r = calloc(1, sizeof *r);
    uint32_t *ord = NULL, *best = NULL;
    if (!r) return -ENOMEM;
    r->objective = o->objective;
    r->excluded = calloc(n_devs, sizeof *r->excluded);
    c.M = calloc(c.L + 1, sizeof *c.M);
    c.A = calloc(c.L + 1, sizeof *c.A);
    c.di = calloc(n_devs, sizeof *c.di);
    c.mean_ms = calloc(2 * n_devs, sizeof *c.mean_ms);
    if (!r->excluded || !c.M || !c.A || !c.di || !c.mean_ms) { rc = -ENOMEM; goto fail; }
    double *mean_ms = c.mean_ms, *hop_ms = c.mean_ms + n_devs;

    uint32_t L = c.L;
    uint64_t min_layer = UINT64_MAX, min_alloc = UINT64_MAX;
    for (uint32_t i = 0; i < L; i++) {
        uint64_t m = layer_mem(&s->layers[i], s, o), a = layer_alloc(&s->layers[i], o);
        c.M[i + 1] = sat_add(c.M[i], m);
        c.A[i + 1] = sat_add(c.A[i], a);
        if (m < min_layer) min_layer = m;
        if (a < min_alloc) min_alloc = a;
    }
    if (c.M[L] > (1ull << 62)) {
        util_seterr(err, errlen, "plan: the model's memory (%llu bytes with ctx %u x %u sessions) is out of range",
                   (unsigned long long)c.M[L], o->ctx, o->sessions);
        rc = -EINVAL;
        goto fail;
    }
    c.embed_mem = s->embed_bytes;
    c.head_mem = s->head_bytes;
    /* The MTP blocks travel with the head: the last rank holds them and runs them as its
     * drafter, with a token_embd of its own unless the head is token_embd or it is rank 0. */
    bool mtp = s->mtp_blocks && !o->no_mtp;
    if (mtp) {
        c.head_mem = sat_add(c.head_mem, layer_mem(&s->mtp, s, o));
        c.head_embed_mem = s->mtp_embed_bytes;
        c.head_alloc = layer_alloc(&s->mtp, o);
    }
    double head_active = (double)s->head_active_bytes + (mtp ? (double)s->mtp.active_bytes : 0);
    double head_macs = s->head_macs + (mtp ? s->mtp.macs : 0);
    c.wire = (double)s->wire_bytes_per_token;
    c.token = PLAN_TOKEN_BYTES;
    bool by_bytes;
    double ref = layer_cost_ref(s, &by_bytes);

    /* Usable devices. */
    for (size_t i = 0; i < n_devs; i++) {
        const struct plan_device *d = &devs[i];
        const char *id = d->id ? d->id : "?";
        if (bad_num(d->ms_per_layer_token) || bad_num(d->flops) || bad_num(d->mem_bw_bytes_s) ||
            bad_num(d->rtt_ms) || bad_num(d->bw_bytes_s)) {
            excl_add(r, (uint32_t)i, PLAN_EX_INVALID, "%s: a speed or link figure is negative or not a number", id);
            continue;
        }
        if (d->ms_per_layer_token <= 0 && d->flops <= 0 && d->mem_bw_bytes_s <= 0) {
            excl_add(r, (uint32_t)i, PLAN_EX_INVALID,
                     "%s: no speed: give ms_per_layer_token, or flops and mem_bw_bytes_s", id);
            continue;
        }
        if (d->mem_bytes == 0) {
            excl_add(r, (uint32_t)i, PLAN_EX_NO_MEMORY, "%s: mem_bytes is 0", id);
            continue;
        }
        uint64_t cap = (uint64_t)((double)d->mem_bytes * (1.0 - o->headroom));
        if (cap < min_layer) {
            char a[32], b[32];
            util_fmt_bytes(a, sizeof a, (double)cap, 2, UTIL_FMT_SI);
            util_fmt_bytes(b, sizeof b, (double)min_layer, 2, UTIL_FMT_SI);
            excl_add(r, (uint32_t)i, PLAN_EX_NO_MEMORY,
                     "%s: too little memory: %s usable, the smallest layer needs %s "
                     "(weights + KV/state for ctx %u x %u sessions)", id, a, b, o->ctx, o->sessions);
            continue;
        }
        if (d->max_alloc_bytes && d->max_alloc_bytes < min_alloc) {
            excl_add(r, (uint32_t)i, PLAN_EX_NO_MEMORY,
                     "%s: its largest allocation (%llu bytes) cannot hold one layer's K cache for ctx %u "
                     "(%llu bytes)", id, (unsigned long long)d->max_alloc_bytes, o->ctx,
                     (unsigned long long)min_alloc);
            continue;
        }
        struct dev_info *x = &c.di[c.N++];
        x->idx = (uint32_t)i;
        x->cap = cap;
        x->alloc = d->max_alloc_bytes;
        x->rtt = d->rtt_ms;
        x->bw = d->bw_bytes_s;
        x->embed_ms = work_ms(d, (double)s->embed_active_bytes, 0, by_bytes, ref);
        x->head_ms = work_ms(d, head_active, head_macs, by_bytes, ref);
        x->hop_key = d->rtt_ms + (d->bw_bytes_s > 0 ? 2 * c.wire / d->bw_bytes_s * 1000.0 : 0);
    }
    if (c.N == 0) {
        if (err && errlen) {
            double need = (double)c.M[L] + (double)c.embed_mem + (double)c.head_mem + (double)c.head_embed_mem,
                   have = 0;
            for (size_t i = 0; i < n_devs; i++)
                have += (double)devs[i].mem_bytes * (1.0 - o->headroom);
            uint32_t li = 0;
            for (uint32_t i = 0; i < L; i++)
                if (c.M[i + 1] - c.M[i] == min_layer) { li = i; break; }
            double max_cap = 0;   /* the largest device's usable memory */
            for (size_t i = 0; i < n_devs; i++)
                if ((double)devs[i].mem_bytes * (1.0 - o->headroom) > max_cap)
                    max_cap = (double)devs[i].mem_bytes * (1.0 - o->headroom);
            size_t off;
            if (need > have)
                off = (size_t)snprintf(err, errlen,
                    "does not fit: no usable device among the %zu given, so layers [0, %u) find no room: "
                    "the model needs %.0f bytes (ctx %u x %u sessions), the devices offer %.0f bytes "
                    "after headroom (short by %.0f bytes); the smallest layer (%u) alone needs %llu bytes.",
                    n_devs, L, need, o->ctx, o->sessions, have, need - have, li,
                    (unsigned long long)min_layer);
            else if (max_cap < (double)min_layer)   /* enough in all, but no device holds a layer */
                off = (size_t)snprintf(err, errlen,
                    "does not fit: no device given can hold a single layer, so layers [0, %u) find no room: "
                    "the smallest layer (%u) needs %llu bytes (weights + KV/state for ctx %u x %u "
                    "sessions), the largest device offers %.0f bytes after headroom (short by %.0f bytes).",
                    L, li, (unsigned long long)min_layer, o->ctx, o->sessions, max_cap,
                    (double)min_layer - max_cap);
            else   /* memory is not what is missing: say what is */
                off = (size_t)snprintf(err, errlen,
                    "no usable device among the %zu given, so layers [0, %u) have nowhere to run "
                    "(memory alone would do: the model needs %.0f bytes for ctx %u x %u sessions, the "
                    "devices offer %.0f bytes after headroom):", n_devs, L, need, o->ctx, o->sessions, have);
            for (uint32_t i = 0; i < r->n_excluded && off < errlen; i++)
                off += (size_t)snprintf(err + off, errlen - off, " %s;", r->excluded[i].reason);
        }
        rc = -ENOSPC;
        goto fail;
    }
    size_t NL = (size_t)c.N * (L + 1);
    c.T = malloc(NL * sizeof *c.T);
    c.D = malloc((L + 1) * sizeof *c.D);
    c.ND = malloc((L + 1) * sizeof *c.ND);
    c.S = malloc((L + 1) * sizeof *c.S);
    c.NS = malloc((L + 1) * sizeof *c.NS);
    c.choice = malloc(NL * sizeof *c.choice);
    ord = malloc((c.N + LOCAL_SPARE + 1) * sizeof *ord);
    best = malloc((c.N + LOCAL_SPARE + 1) * sizeof *best);
    if (!c.T || !c.D || !c.ND || !c.S || !c.NS || !c.choice || !ord || !best) { rc = -ENOMEM; goto fail; }
    for (uint32_t k = 0; k < c.N; k++) {
        const struct plan_device *d = &devs[c.di[k].idx];
        double *T = c.T + (size_t)k * (L + 1), busy = 0;
        uint32_t nb = 0;
        T[0] = 0;
        for (uint32_t i = 0; i < L; i++) {
            double t = work_ms(d, (double)s->layers[i].active_bytes, s->layers[i].macs, by_bytes, ref);
            T[i + 1] = T[i] + t;
            if (t > 0) { busy += t; nb++; }
        }
        c.di[k].mean_layer_ms = nb ? busy / nb : 0;
        mean_ms[c.di[k].idx] = c.di[k].mean_layer_ms;
        hop_ms[c.di[k].idx] = c.di[k].hop_key;
    }

    c.n_usable = c.N;
    for (uint32_t k = 0; k < c.N; k++) c.have += (double)c.di[k].cap;
    rc = prune_dominated(&c, r);
    if (rc) goto fail;
    double blat = INF, bper = INF;
    uint32_t reach = 0, bestn = c.N;
    double fact = 1;
    for (uint32_t i = 2; i <= c.N; i++) fact *= i;
    uint32_t exmax = o->exhaustive_max ? o->exhaustive_max : 6;
    if (exmax > 10) exmax = 10;
    bool exhaustive = c.N <= exmax &&
        fact * c.N * ((double)L * L / 2 + L) * (o->objective == PLAN_THROUGHPUT ? 2 : 1) <= EXHAUSTIVE_MAX_WORK;
    if (exhaustive)
        search_exhaustive(&c, ord, best, &blat, &bper, &reach);
    else
        search_heuristic(&c, ord, best, &bestn, &blat, &bper, &reach);
    r->exhaustive = exhaustive;
    r->orders_tried = c.orders;
    if (blat == INF) {
        explain_infeasible(&c, reach, err, errlen);
        rc = -ENOSPC;
        goto fail;
    }
    /* Re-run the winning order so the DP scratch holds its windows. */
    double l2, p2;
    eval_order(&c, best, bestn, &l2, &p2, NULL);
    rc = fill_result(&c, best, bestn, r);
    if (rc) goto fail;
    if (o->max_ranks && r->n_ranks > o->max_ranks) {
        rc = limit_ranks(&c, r, ord, best, err, errlen);
        if (rc) goto fail;
        r->exhaustive = false;
        r->orders_tried = c.orders;
    }

    /* Devices left out although usable: say why. */
    bool *used = calloc(n_devs, sizeof *used);
    if (!used) { rc = -ENOMEM; goto fail; }
    double used_ms = 0;
    for (uint32_t i = 0; i < r->n_ranks; i++) {   /* mean over the layers placed */
        used[r->ranks[i].device] = true;
        used_ms += mean_ms[r->ranks[i].device] * (r->ranks[i].last - r->ranks[i].first);
    }
    used_ms /= L;
    for (uint32_t e = 0; e < r->n_excluded; e++) used[r->excluded[e].device] = true;
    for (size_t i = 0; i < n_devs; i++) {
        if (used[i]) continue;
        const char *id = devs[i].id ? devs[i].id : "?";
        excl_add(r, (uint32_t)i, PLAN_EX_NOT_NEEDED,
                 "%s: not needed: the ring is %s without it (it runs a layer in %.3g ms vs %.3g ms "
                 "on the devices used; its links would add %.3g ms per token)", id,
                 o->objective == PLAN_THROUGHPUT ? "as fast or faster" : "faster or as fast",
                 mean_ms[i], used_ms, hop_ms[i]);
    }
    free(used);
    ctx_free(&c);
    free(ord);
    free(best);
    *out = r;
    return 0;
fail:
    ctx_free(&c);
    free(ord);
    free(best);
    plan_result_free(r);
    return rc;
}

void plan_result_free(struct plan_result *r)
{
    if (!r) return;
    free(r->ranks);
    free(r->excluded);
    free(r);
}

int plan_device_choose(const struct plan_device *opt, size_t n, const struct plan_shape *s,
                       const struct plan_opts *o, double *ms_model)
{
    if (!opt || !s || !o || !s->layers || s->n_layers == 0)
        return -EINVAL;
    bool by_bytes;
    double ref = layer_cost_ref(s, &by_bytes);
    uint64_t smallest = UINT64_MAX, smallest_alloc = UINT64_MAX;
    for (uint32_t i = 0; i < s->n_layers; i++)
        if (s->layers[i].weight_bytes) {
            if (layer_mem(&s->layers[i], s, o) < smallest)
                smallest = layer_mem(&s->layers[i], s, o);
            if (layer_alloc(&s->layers[i], o) < smallest_alloc)
                smallest_alloc = layer_alloc(&s->layers[i], o);
        }
    int best = -1;
    double best_ms = 0;
    for (size_t k = 0; k < n; k++) {
        const struct plan_device *d = &opt[k];
        if (bad_num(d->ms_per_layer_token) || bad_num(d->flops) || bad_num(d->mem_bw_bytes_s) ||
            (d->ms_per_layer_token <= 0 && d->flops <= 0 && d->mem_bw_bytes_s <= 0))
            continue;   /* no speed figure */
        if ((double)d->mem_bytes * (1.0 - o->headroom) < (double)smallest)
            continue;   /* cannot hold a layer */
        if (d->max_alloc_bytes && d->max_alloc_bytes < smallest_alloc)
            continue;   /* nor one layer's K cache in one allocation */
        double t = 0;
        for (uint32_t i = 0; i < s->n_layers; i++)
            t += work_ms(d, (double)s->layers[i].active_bytes, s->layers[i].macs, by_bytes, ref);
        if (best < 0 || t < best_ms) {
            best = (int)k;
            best_ms = t;
        }
    }
    if (best >= 0 && ms_model)
        *ms_model = best_ms;
    return best < 0 ? -ENOENT : best;
}

int plan_even(const struct plan_shape *s, uint32_t n, uint32_t *first, uint32_t *last)
{
    if (!s || !s->layers || n == 0 || n > s->n_layers || s->n_layers > PLAN_MAX_LAYERS)
        return -EINVAL;
    uint32_t L = s->n_layers;
    bool by_bytes;
    double ref = layer_cost_ref(s, &by_bytes);
    struct plan_device d = {.ms_per_layer_token = 1.0};
    double *P = malloc((L + 1) * sizeof *P);
    double *D = malloc((size_t)(n + 1) * (L + 1) * sizeof *D);
    uint32_t *B = malloc((size_t)(n + 1) * (L + 1) * sizeof *B);
    if (!P || !D || !B) { free(P); free(D); free(B); return -ENOMEM; }
    P[0] = 0;
    for (uint32_t i = 0; i < L; i++)
        P[i + 1] = P[i] + work_ms(&d, (double)s->layers[i].active_bytes, s->layers[i].macs, by_bytes, ref);
    double emb = work_ms(&d, (double)s->embed_active_bytes, 0, by_bytes, ref);
    double head = work_ms(&d, (double)(s->head_active_bytes + s->mtp.active_bytes), s->head_macs + s->mtp.macs,
                          by_bytes, ref);
    /* D[r][j]: min over cuts of the largest window's work covering [0, j) with r ranks. */
    for (size_t i = 0; i < (size_t)(n + 1) * (L + 1); i++) D[i] = INF;
    D[0] = 0;
    for (uint32_t r = 1; r <= n; r++)
        for (uint32_t j2 = r; j2 <= L; j2++)
            for (uint32_t j = r - 1; j < j2; j++) {
                double prev = D[(size_t)(r - 1) * (L + 1) + j];
                if (prev == INF) continue;
                double w = P[j2] - P[j] + (j == 0 ? emb : 0) + (j2 == L ? head : 0);
                /* tie-break: prefer even layer counts via a tiny length term */
                double v = fmax(prev, w + 1e-12 * (double)(j2 - j) * (j2 - j));
                if (v < D[(size_t)r * (L + 1) + j2]) {
                    D[(size_t)r * (L + 1) + j2] = v;
                    B[(size_t)r * (L + 1) + j2] = j;
                }
            }
    uint32_t j = L;
    for (uint32_t r = n; r >= 1; r--) {
        uint32_t j0 = B[(size_t)r * (L + 1) + j];
        first[r - 1] = j0;
        last[r - 1] = j;
        j = j0;
    }
    free(P); free(D); free(B);
    return 0;
}

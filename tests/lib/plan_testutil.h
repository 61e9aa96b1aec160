/* plan_testutil.h — random planner instances and an independent evaluation of the cost model
 * of docs/planner.md (written from the document, not from planner/plan.c), shared by the
 * planner tests. */
#ifndef KV_TESTS_PLAN_TESTUTIL_H
#define KV_TESTS_PLAN_TESTUTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "planner/plan.h"

#define PT_MAXL 128
#define PT_MAXD 1024

struct pt_inst {
    struct plan_layer layers[PT_MAXL];
    struct plan_shape shape;
    struct plan_device devs[PT_MAXD];
    char ids[PT_MAXD][16];
    size_t n_devs;
    struct plan_opts opts;
};

static uint64_t pt_rng_state = 88172645463325252ull;
static uint64_t pt_rand(void)
{
    pt_rng_state ^= pt_rng_state << 13;
    pt_rng_state ^= pt_rng_state >> 7;
    pt_rng_state ^= pt_rng_state << 17;
    return pt_rng_state;
}
static double pt_unif(double a, double b) { return a + (b - a) * (double)(pt_rand() >> 11) / 9007199254740992.0; }
static uint64_t pt_range(uint64_t a, uint64_t b) { return a + pt_rand() % (b - a + 1); }

/* A random instance: L layers, N devices; tight makes memory scarce (often infeasible). */
static void pt_make(struct pt_inst *in, uint32_t L, uint32_t N, int tight)
{
    memset(in, 0, sizeof *in);
    plan_opts_default(&in->opts);
    in->opts.objective = pt_rand() % 2 ? PLAN_THROUGHPUT : PLAN_LATENCY;
    in->opts.ctx = (uint32_t)pt_range(0, 2048);
    in->opts.sessions = (uint32_t)pt_range(1, 4);
    in->opts.headroom = pt_unif(0, 0.2);
    uint64_t total = 0;
    int moe = pt_rand() % 3 == 0;
    for (uint32_t i = 0; i < L; i++) {
        struct plan_layer *l = &in->layers[i];
        l->weight_bytes = pt_range(1000, 100000) * 1000;
        l->expert_bytes = moe ? l->weight_bytes * 9 / 10 : 0;
        l->active_bytes = moe ? l->weight_bytes / 10 + l->expert_bytes / 32 : l->weight_bytes;
        l->macs = (double)l->active_bytes * pt_unif(0.5, 2);
        if (pt_rand() % 4 == 0) l->state_bytes = pt_range(0, 4000000);
        else l->kv_bytes_per_token = pt_range(0, 4096);
        if (i == L - 1 && L > 2 && pt_rand() % 4 == 0) { l->active_bytes = 0; l->macs = 0; } /* no work */
        total += l->weight_bytes + in->opts.sessions * (l->state_bytes + l->kv_bytes_per_token * in->opts.ctx);
    }
    in->shape.n_layers = L;
    in->shape.n_embd = (uint32_t)pt_range(64, 4096);
    in->shape.wire_bytes_per_token = in->shape.n_embd * 4ull;
    in->shape.layers = in->layers;
    in->shape.embed_bytes = pt_range(0, 50000) * 1000;
    in->shape.embed_active_bytes = in->shape.n_embd * 2ull;
    in->shape.head_bytes = pt_range(0, 50000) * 1000;
    in->shape.head_active_bytes = in->shape.head_bytes;
    in->shape.head_macs = (double)in->shape.head_bytes;
    total += in->shape.embed_bytes + in->shape.head_bytes;
    if (pt_rand() % 3 == 0) {   /* MTP blocks: the last rank holds and runs them beside the head */
        struct plan_layer *m = &in->shape.mtp;
        in->shape.mtp_blocks = (uint32_t)pt_range(1, 2);
        m->weight_bytes = pt_range(1000, 100000) * 1000 * in->shape.mtp_blocks;
        m->expert_bytes = moe ? m->weight_bytes * 9 / 10 : 0;
        m->active_bytes = moe ? m->weight_bytes / 10 + m->expert_bytes / 32 : m->weight_bytes;
        m->macs = (double)m->active_bytes * pt_unif(0.5, 2);
        m->kv_bytes_per_token = pt_range(0, 4096);
        in->shape.mtp_embed_bytes = pt_rand() % 4 ? in->shape.embed_bytes : 0;   /* 0: tied */
        in->opts.no_mtp = pt_rand() % 4 == 0;
        if (!in->opts.no_mtp)
            total += m->weight_bytes + in->opts.sessions * m->kv_bytes_per_token * in->opts.ctx +
                     in->shape.mtp_embed_bytes;
    }
    in->n_devs = N;
    for (uint32_t d = 0; d < N; d++) {
        struct plan_device *x = &in->devs[d];
        snprintf(in->ids[d], sizeof in->ids[d], "dev%u", d);
        x->id = in->ids[d];
        x->backend = "cpu";
        double share = tight ? pt_unif(0.05, 0.6) : pt_unif(0.2, 1.5);
        x->mem_bytes = (uint64_t)((double)total * share);
        if (pt_rand() % 2) {
            x->ms_per_layer_token = pt_unif(0.1, 30);
        } else {
            x->flops = pt_unif(1e9, 1e13);
            x->mem_bw_bytes_s = pt_rand() % 5 ? pt_unif(1e9, 1e12) : 0;
        }
        x->rtt_ms = pt_rand() % 3 ? pt_unif(0, 50) : 0;
        x->bw_bytes_s = pt_rand() % 3 ? pt_unif(1e5, 1e9) : 0;
        x->inbound = pt_rand() % 3 != 0;
    }
}

/* ---- independent cost model ---- */

struct pt_model {
    uint32_t L, N;
    double cap[PT_MAXD];
    double lm[PT_MAXL + 1];                 /* prefix memory */
    double lt[PT_MAXD][PT_MAXL + 1];        /* prefix ms */
    double embed_ms[PT_MAXD], head_ms[PT_MAXD];
    double embed_mem, head_mem, wire;
    double head_embed_mem;                  /* the MTP drafter's token_embd, unless rank 0 is last */
    const struct plan_device *devs;
};

static double pt_work(const struct plan_device *d, double bytes, double macs, int by_bytes, double ref)
{
    if (d->ms_per_layer_token > 0) {
        double c = by_bytes ? bytes : macs;
        return ref > 0 ? d->ms_per_layer_token * c / ref : (c > 0 ? d->ms_per_layer_token : 0);
    }
    double a = d->flops > 0 ? 2 * macs / d->flops : 0;
    double b = d->mem_bw_bytes_s > 0 ? bytes / d->mem_bw_bytes_s : 0;
    return 1000 * (a > b ? a : b);
}

static void pt_model_init(struct pt_model *m, const struct pt_inst *in)
{
    const struct plan_shape *s = &in->shape;
    m->L = s->n_layers;
    m->N = (uint32_t)in->n_devs;
    m->devs = in->devs;
    int by_bytes = 0;
    for (uint32_t i = 0; i < m->L; i++) if (s->layers[i].active_bytes) by_bytes = 1;
    double ref = 0; int nref = 0;
    for (uint32_t i = 0; i < m->L; i++) {
        double c = by_bytes ? (double)s->layers[i].active_bytes : s->layers[i].macs;
        if (c > 0) { ref += c; nref++; }
    }
    ref = nref ? ref / nref : 0;
    m->lm[0] = 0;
    for (uint32_t i = 0; i < m->L; i++) {
        const struct plan_layer *l = &s->layers[i];
        m->lm[i + 1] = m->lm[i] + (double)l->weight_bytes +
            (double)in->opts.sessions * ((double)l->state_bytes + (double)l->kv_bytes_per_token * in->opts.ctx);
    }
    m->embed_mem = (double)s->embed_bytes;
    m->head_mem = (double)s->head_bytes;
    m->head_embed_mem = 0;
    /* docs/planner.md: the MTP blocks are the last rank's, memory like a layer's (weights + K/V
     * for every session), time like a layer's, and its own token_embd unless it is rank 0 */
    int mtp = s->mtp_blocks && !in->opts.no_mtp;
    if (mtp) {
        m->head_mem += (double)s->mtp.weight_bytes +
            (double)in->opts.sessions * ((double)s->mtp.state_bytes + (double)s->mtp.kv_bytes_per_token * in->opts.ctx);
        m->head_embed_mem = (double)s->mtp_embed_bytes;
    }
    m->wire = (double)s->wire_bytes_per_token;
    for (uint32_t d = 0; d < m->N; d++) {
        const struct plan_device *x = &in->devs[d];
        m->cap[d] = (double)(uint64_t)((double)x->mem_bytes * (1.0 - in->opts.headroom));
        m->lt[d][0] = 0;
        for (uint32_t i = 0; i < m->L; i++)
            m->lt[d][i + 1] = m->lt[d][i] + pt_work(x, (double)s->layers[i].active_bytes, s->layers[i].macs, by_bytes, ref);
        m->embed_ms[d] = pt_work(x, (double)s->embed_active_bytes, 0, by_bytes, ref);
        m->head_ms[d] = pt_work(x, (double)s->head_active_bytes + (mtp ? (double)s->mtp.active_bytes : 0),
                                s->head_macs + (mtp ? s->mtp.macs : 0), by_bytes, ref);
    }
}

/* Stage [j, j2) on device d: 0 if it does not fit; else lat and period contributions. */
static int pt_stage(const struct pt_model *m, uint32_t d, uint32_t j, uint32_t j2, double *lat,
                    double *per, double *mem)
{
    int first = j == 0, last = j2 == m->L;
    double mm = m->lm[j2] - m->lm[j] + (first ? m->embed_mem : 0) + (last ? m->head_mem : 0) +
                (last && !first ? m->head_embed_mem : 0);
    if (mem) *mem = mm;
    if (mm > m->cap[d]) return 0;
    double comp = m->lt[d][j2] - m->lt[d][j] + (first ? m->embed_ms[d] : 0) + (last ? m->head_ms[d] : 0);
    double link = 0, xfer = 0;
    if (!(first && last)) {
        double bytes = (first ? PLAN_TOKEN_BYTES : m->wire) + (last ? PLAN_TOKEN_BYTES : m->wire);
        xfer = m->devs[d].bw_bytes_s > 0 ? bytes / m->devs[d].bw_bytes_s * 1000 : 0;
        link = m->devs[d].rtt_ms + xfer;
    }
    *lat = comp + link;
    *per = comp > xfer ? comp : xfer;
    return 1;
}

static int pt_close(double a, double b, double rel)
{
    double s = fabs(a) > fabs(b) ? fabs(a) : fabs(b);
    return fabs(a - b) <= rel * (s > 1e-9 ? s : 1e-9);
}

#endif

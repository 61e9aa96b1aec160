/* test-plan-optimal: on small instances (<= 6 devices, <= 12 layers) the planner's objective
 * equals an exhaustive search's over device subsets, orders and window splits, for both
 * objectives; infeasible exactly when the exhaustive search finds nothing. The cost model is
 * evaluated independently (tests/lib/plan_testutil.h). */
#include <errno.h>
#include <float.h>

#include "tests/lib/t.h"
#include "tests/lib/plan_testutil.h"
#include "util/err.h"

struct bf {
    const struct pt_model *m;
    int mode;            /* 0: min latency; 1: min period; 2: min latency with period <= cap */
    double cap;
    double best, best_sec;
    long leaves;
};

static void bf_rec(struct bf *b, uint32_t j, uint32_t mask, double lat, double per)
{
    const struct pt_model *m = b->m;
    if (j == m->L) {
        b->leaves++;
        double v = b->mode == 1 ? per : lat, w = b->mode == 1 ? lat : per;
        if (v < b->best || (v == b->best && w < b->best_sec)) { b->best = v; b->best_sec = w; }
        return;
    }
    for (uint32_t d = 0; d < m->N; d++) {
        if (mask & (1u << d)) continue;
        for (uint32_t j2 = j + 1; j2 <= m->L; j2++) {
            double sl, sp;
            if (!pt_stage(m, d, j, j2, &sl, &sp, NULL)) continue;
            double np = per > sp ? per : sp;
            if (b->mode == 2 && np > b->cap) continue;
            bf_rec(b, j2, mask | (1u << d), lat + sl, np);
        }
    }
}

/* Evaluate the planner's ranks with the independent model. */
static int eval_result(const struct pt_model *m, const struct plan_result *r, double *lat, double *per)
{
    *lat = 0; *per = 0;
    uint32_t j = 0;
    for (uint32_t i = 0; i < r->n_ranks; i++) {
        const struct plan_rank *k = &r->ranks[i];
        if (k->first != j || k->last <= k->first) return 0;
        double sl, sp;
        if (!pt_stage(m, k->device, k->first, k->last, &sl, &sp, NULL)) return 0;
        *lat += sl;
        if (sp > *per) *per = sp;
        j = k->last;
    }
    return j == m->L;
}

static struct pt_inst inst;

T_CASE(optimal_vs_exhaustive)
{
    int n_feasible = 0, n_infeasible = 0, n_thr = 0, n_lat = 0;
    long leaves = 0;
    for (int it = 0; it < 1500; it++) {
        uint32_t L = (uint32_t)pt_range(1, 12), N = (uint32_t)pt_range(1, 6);
        if (it % 4 == 0) { L = (uint32_t)pt_range(8, 12); N = (uint32_t)pt_range(4, 6); }
        if (it % 4 == 1) { L = (uint32_t)pt_range(1, 12); N = (uint32_t)pt_range(1, 3); }
        if (it % 4 >= 2) { L = (uint32_t)pt_range(1, 7); N = (uint32_t)pt_range(1, 5); }
        pt_make(&inst, L, N, it % 3 == 0);
        struct pt_model m;
        pt_model_init(&m, &inst);
        struct bf b = {.m = &m, .mode = inst.opts.objective == PLAN_THROUGHPUT ? 1 : 0,
                       .best = DBL_MAX, .best_sec = DBL_MAX};
        bf_rec(&b, 0, 0, 0, 0);
        double bf_lat = b.best, bf_per = b.best_sec;
        if (inst.opts.objective == PLAN_THROUGHPUT && b.best < DBL_MAX) {
            bf_per = b.best;
            struct bf b2 = {.m = &m, .mode = 2, .cap = b.best * (1 + 1e-9) + 1e-12,
                            .best = DBL_MAX, .best_sec = DBL_MAX};
            bf_rec(&b2, 0, 0, 0, 0);
            bf_lat = b2.best;
            leaves += b2.leaves;
        }
        leaves += b.leaves;
        struct plan_result *r = NULL;
        char err[KV_ERR_MAX];
        int rc = plan_make(&r, &inst.shape, inst.devs, inst.n_devs, &inst.opts, err, sizeof err);
        if (b.best == DBL_MAX) {
            n_infeasible++;
            T_CHECK(rc == -ENOSPC, "instance %d (L %u N %u): exhaustive search finds no plan, planner rc %d", it, L, N, rc);
            if (rc == -ENOSPC)
                T_CHECK(strstr(err, "bytes") && strstr(err, "layers"), "instance %d: error names no bytes/layers: %s", it, err);
            plan_result_free(r);
            continue;
        }
        n_feasible++;
        T_CHECK(rc == 0, "instance %d (L %u N %u): exhaustive finds a plan (lat %g) but planner fails: %s", it, L, N, bf_lat, err);
        if (rc) continue;
        T_CHECK(r->exhaustive, "instance %d: small instance not searched exhaustively", it);
        double lat, per;
        T_CHECK(eval_result(&m, r, &lat, &per), "instance %d: planner's windows invalid or do not fit", it);
        T_CHECK(pt_close(lat, r->ms_per_token, 1e-9), "instance %d: reported ms/token %.12g, model says %.12g", it, r->ms_per_token, lat);
        T_CHECK(pt_close(per, r->period_ms, 1e-9), "instance %d: reported period %.12g, model says %.12g", it, r->period_ms, per);
        if (inst.opts.objective == PLAN_THROUGHPUT) {
            n_thr++;
            T_CHECK(pt_close(per, bf_per, 1e-7), "instance %d (L %u N %u, throughput): period %.12g, exhaustive %.12g", it, L, N, per, bf_per);
            T_CHECK(pt_close(lat, bf_lat, 1e-7), "instance %d (L %u N %u, throughput): latency under the optimal period %.12g, exhaustive %.12g (period %.15g vs %.15g)", it, L, N, lat, bf_lat, per, bf_per);
        } else {
            n_lat++;
            T_CHECK(pt_close(lat, bf_lat, 1e-7), "instance %d (L %u N %u, latency): %.12g ms/token, exhaustive %.12g", it, L, N, lat, bf_lat);
        }
        plan_result_free(r);
    }
    fprintf(stderr, "feasible %d (latency %d, throughput %d), infeasible %d, exhaustive leaves %ld\n",
            n_feasible, n_lat, n_thr, n_infeasible, leaves);
    T_CHECK(n_lat > 50 && n_thr > 50 && n_infeasible > 10, "instance mix too thin");
}

int main(int argc, char **argv)
{
    t_init(argc, argv);
    T_RUN(optimal_vs_exhaustive);
    return T_DONE();
}

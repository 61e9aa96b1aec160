/* tool-plan-bench: how long the planner takes at scale (make bench prints it).
 * 96 layers (a 1.6 GB-per-block MoE shape) over 1000 devices drawn from six classes (GPU
 * boxes, CPU servers, laptops, phones, NPUs, small boards) with +-30% jitter in every figure,
 * and over 1000 devices with independent random figures (little to prune). Prints the time of
 * plan_make for both objectives (best of a few runs) and the plan's size. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "planner/plan.h"
#include "util/util.h"
#include "util/err.h"

#define L 96
#define N 1000

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static double unif(double a, double b)
{
    rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17;
    return a + (b - a) * (double)(rs >> 11) / 9007199254740992.0;
}

int main(void)
{
    static struct plan_layer layers[L];
    static struct plan_device devs[N];
    static char ids[N][16];
    for (int i = 0; i < L; i++) {
        layers[i].weight_bytes = 1570000000ull;
        layers[i].expert_bytes = 1500000000ull;
        layers[i].active_bytes = 111000000ull;
        layers[i].macs = 178e6;
        if ((i + 1) % 4 == 0) layers[i].kv_bytes_per_token = 2048;
        else layers[i].state_bytes = 4341760;
    }
    struct plan_shape s = {.name = "bench", .arch = "qwen35moe", .n_layers = L, .n_embd = 3072,
                           .wire_bytes_per_token = 12288, .layers = layers, .embed_bytes = 475000000,
                           .embed_active_bytes = 6144, .head_bytes = 475000000,
                           .head_active_bytes = 475000000, .head_macs = 763e6};
    /* class: mem GB, flops, mem bw, rtt ms, link bw, inbound */
    static const double cls[6][6] = {
        {24, 8e13, 9e11, 1, 1.25e9, 1}, {64, 2e12, 1e11, 1, 1.25e9, 1}, {16, 1e12, 6e10, 15, 2.5e7, 1},
        {8, 1.5e12, 3e10, 40, 2.5e6, 0}, {12, 4e12, 5e10, 30, 5e6, 0}, {4, 2e11, 1.5e10, 10, 1.25e7, 1},
    };
    for (int set = 0; set < 2; set++) {
        for (int i = 0; i < N; i++) {
            struct plan_device *d = &devs[i];
            memset(d, 0, sizeof *d);
            snprintf(ids[i], sizeof ids[i], "d%d", i);
            d->id = ids[i];
            d->backend = "cpu";
            if (set == 0) {
                const double *c = cls[(int)unif(0, 6) % 6];
                d->mem_bytes = (uint64_t)(c[0] * 1e9 * unif(0.7, 1.3));
                d->flops = c[1] * unif(0.7, 1.3);
                d->mem_bw_bytes_s = c[2] * unif(0.7, 1.3);
                d->rtt_ms = c[3] * unif(0.7, 1.3);
                d->bw_bytes_s = c[4] * unif(0.7, 1.3);
                d->inbound = c[5] > 0;
            } else {
                d->mem_bytes = (uint64_t)unif(2e9, 80e9);
                d->flops = unif(1e11, 1e14);
                d->mem_bw_bytes_s = unif(1e10, 1e12);
                d->rtt_ms = unif(0, 60);
                d->bw_bytes_s = unif(1e6, 2e9);
                d->inbound = unif(0, 1) < 0.5;
            }
        }
        for (int obj = 0; obj < 2; obj++) {
            struct plan_opts o;
            plan_opts_default(&o);
            o.objective = obj ? PLAN_THROUGHPUT : PLAN_LATENCY;
            double best = 1e30;
            struct plan_result *keep = NULL;
            char err[KV_ERR_MAX];
            for (int rep = 0; rep < 3; rep++) {
                struct plan_result *r = NULL;
                double t0 = util_now_ms();
                int rc = plan_make(&r, &s, devs, N, &o, err, sizeof err);
                double dt = util_now_ms() - t0;
                if (rc) { fprintf(stderr, "plan failed: %s\n", err); return 1; }
                if (dt < best) best = dt;
                plan_result_free(keep);
                keep = r;
            }
            uint32_t pruned = 0;
            for (uint32_t e = 0; e < keep->n_excluded; e++)
                if (strstr(keep->excluded[e].reason, "other devices")) pruned++;
            printf("plan %d layers x %d devices (%s), %-10s %7.1f ms: %u ranks, %.1f ms/token, period %.2f ms, "
                   "%u pruned as dominated, %llu DP runs\n", L, N, set ? "random figures" : "six classes",
                   obj ? "throughput" : "latency", best, keep->n_ranks, keep->ms_per_token, keep->period_ms,
                   pruned, (unsigned long long)keep->orders_tried);
            plan_result_free(keep);
        }
    }
    return 0;
}

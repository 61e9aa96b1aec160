/* plan.c — a model's windows planned from the device profiles nodes sent lately (planner/),
 * and planned again while nobody holds one. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "gguf/gguf.h"
#include "kvd/market/internal.h"
#include "planner/plan.h"

#define MAX_PROFILES 256         /* device profiles the planner looks at */
#define PROFILE_AGE_S 600.0      /* profiles older than this are not planned with */

/* ---- planning ---- */

/* The planner's view of a catalog: shape (layers caller-freed through *layers). The model's
 * MTP blocks (n_layers - n_main) go to the last window, as gguf_window_wants gives them to it,
 * with the drafter's token_embd: its bytes count them (planner/plan.h). */
static int shape_of(const struct gguf_catalog *c, struct plan_shape *shape, struct plan_layer **layers,
                    char *err, size_t errlen)
{
    struct plan_tensor *t = calloc(c->n_tensors ? c->n_tensors : 1, sizeof *t);
    *layers = calloc(c->n_layers ? c->n_layers : 1, sizeof **layers);
    if (!t || !*layers) {
        free(t);
        free(*layers);
        *layers = NULL;
        return -ENOMEM;
    }
    for (uint64_t i = 0; i < c->n_tensors; i++) {
        t[i].name = c->tensors[i].name;
        t[i].n_dims = c->tensors[i].n_dims;
        memcpy(t[i].ne, c->tensors[i].ne, sizeof t[i].ne);
        t[i].bytes = c->tensors[i].size;
    }
    struct plan_model pm = {.arch = c->arch, .t = t, .n_tensors = (size_t)c->n_tensors,
                            .n_blocks = c->n_layers, .nextn_layers = c->n_layers - c->n_main};
    int rc = plan_shape_of_model(&pm, shape, *layers, err, errlen);
    free(t);
    if (rc) {
        free(*layers);
        *layers = NULL;
    }
    return rc;
}

static int cmp_mem(const void *x, const void *y)
{
    const struct kvd_market_node *a = x, *b = y;
    return a->mem_bytes < b->mem_bytes ? -1 : a->mem_bytes > b->mem_bytes;
}

/* Plan the model's windows from the device profiles seen lately: the planner over those
 * devices, the median one repeated until the population could hold the model (a crowd
 * like the nodes that came so far). With no profile yet, one window. 0 or negative. */
static int plan_windows(struct kvd_market_api *a, const struct kvd_market_model *m, double now,
                        struct kvd_market_window *w, size_t *n, char *err, size_t errlen)
{
    struct gguf_catalog *c = NULL;
    int rc = gguf_catalog_from_json(&c, m->catalog, strlen(m->catalog), NULL, err, errlen);
    if (rc)
        return rc;
    struct plan_shape shape;
    struct plan_layer *layers = NULL;
    struct kvd_market_node *nodes = calloc(MAX_PROFILES, sizeof *nodes);
    struct plan_device *devs = calloc(KVD_MARKET_MAX_WINDOWS, sizeof *devs);
    struct plan_result *pr = NULL;
    size_t nn = 0;
    if (!nodes || !devs) {
        rc = -ENOMEM;
        goto out;
    }
    if ((rc = shape_of(c, &shape, &layers, err, errlen)))
        goto out;
    shape.name = m->name;
    uint64_t total = shape.embed_bytes + shape.head_bytes + shape.mtp.weight_bytes + shape.mtp_embed_bytes;
    for (uint32_t i = 0; i < shape.n_layers; i++)
        total += layers[i].weight_bytes;
    if ((rc = a->st->ops->nodes_recent(a->st->impl, now - PROFILE_AGE_S, nodes, MAX_PROFILES, &nn)))
        goto out;
    qsort(nodes, nn, sizeof *nodes, cmp_mem);
    uint64_t med = nn ? nodes[nn / 2].mem_bytes : total * 4 + (256u << 20);
    /* the real devices (the largest first), then copies of the median one until it fits */
    size_t nd = 0;
    for (size_t i = nn; i-- > 0 && nd < KVD_MARKET_MAX_WINDOWS;)
        devs[nd++] = (struct plan_device){.id = nodes[i].id, .backend = "cpu",
                                          .mem_bytes = nodes[i].mem_bytes, .ms_per_layer_token = 1,
                                          .rtt_ms = 1, .inbound = nodes[i].inbound};
    struct plan_opts po;
    plan_opts_default(&po);
    po.objective = PLAN_LATENCY;
    po.ctx = 1024;
    po.max_ranks = KVD_MARKET_MAX_WINDOWS;
    for (;;) {
        rc = nd ? plan_make(&pr, &shape, devs, nd, &po, err, errlen) : -ENOSPC;
        if (rc != -ENOSPC || nd >= KVD_MARKET_MAX_WINDOWS)
            break;
        devs[nd++] = (struct plan_device){.id = "median", .backend = "cpu", .mem_bytes = med,
                                          .ms_per_layer_token = 1, .rtt_ms = 1, .inbound = true};
    }
    if (rc)
        goto out;
    *n = pr->n_ranks;
    for (uint32_t r = 0; r < pr->n_ranks; r++) {
        const struct plan_rank *k = &pr->ranks[r];
        w[r] = (struct kvd_market_window){.idx = r, .first = k->first, .last = k->last,
                                          .bytes = k->mem_bytes};
    }
out:
    plan_result_free(pr);
    free(devs);
    free(nodes);
    free(layers);
    gguf_catalog_free(c);
    return rc;
}

/* Re-plan a model whose windows nobody holds (nothing to disturb): 0 or negative. */
int kvd_market__replan_if_idle(struct kvd_market_api *a, const char *id, double now, char *err,
                               size_t errlen)
{
    struct kvd_market_state *ms = calloc(1, sizeof *ms);
    if (!ms)
        return -ENOMEM;
    int rc = kvd_market__state_load(a, id, ms, now);
    if (rc)
        goto out;
    bool idle = true;
    for (size_t i = 0; i < ms->n; i++)
        if (ms->ls[i] != KVD_LS_FREE)
            idle = false;
    if (idle) {
        struct kvd_market_window w[KVD_MARKET_MAX_WINDOWS];
        size_t n = 0;
        if ((rc = plan_windows(a, &ms->m, now, w, &n, err, errlen)) == 0)
            rc = a->st->ops->windows_set(a->st->impl, id, w, n);
    }
    kvd_market__model_clear(&ms->m);
out:
    free(ms);
    return rc;
}

/* api.c — the market's HTTP JSON API (docs/market.md): the route table, the coverage page
 * at GET /, the periodic tick (the settlement sweep, the waiting long-polls), and the API's
 * life. The handlers live in the files of their concern (internal.h lists them). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <uv.h>

#include "kvd/kvd.h"
#include "kvd/market/internal.h"
#include "net/net.h"
#include "util/util.h"

#define SWEEP_EVERY_S 2.0        /* how often pending sessions are looked at */

void kvd_market__config_default(struct kvd_market_config *c)
{
    memset(c, 0, sizeof *c);
    c->listen = "127.0.0.1:7490";
    c->lease_s = 20;
    c->reserve_s = 60;
    c->grace_s = 30;
    c->clock_skew_s = 300;
    c->reward_base = 0.001;
    c->demand_ref = 10;
    c->demand_tau_s = 300;
    c->poll_max_s = 25;
    c->probe = true;
    c->spot_check_s = 300;
    c->penalty_s = 600;
    c->pull_min_rate = 1 << 20;
    c->lapse_refuse_s = 600;
    c->claims_per_min_key = 12;
    c->claims_per_min_addr = 60;
    c->max_ranks_addr = 1;
    c->max_ranks_relay_addr = 4;
    c->settle_wait_s = 120;
    c->audit_rate = 0.05;
    c->audit_deadline_s = 300;
    c->audit_answer_kib = 65536;
}

/* Every 200 ms: the settlement sweep when due, and the waiting long-polls whose manifest
 * came or whose time is up. */
static void on_tick(uv_timer_t *t)
{
    struct kvd_market_api *a = t->data;
    double now = kvd_market__now();
    if (now >= a->sweep_next) {   /* sessions whose ring did not all submit: the settle wait */
        a->sweep_next = now + SWEEP_EVERY_S;
        size_t paid = 0;
        int rc = a->st->ops->begin(a->st->impl);
        if (rc == 0)
            rc = kvd_market__session_sweep(a->st, &a->cfg, now, a->sweep_after, kvd_market__on_paid, a, &paid);
        if (rc == 0)
            rc = a->st->ops->commit(a->st->impl);
        if (rc) {
            a->st->ops->rollback(a->st->impl);
            kvd_log(KVD_LOG_WARN, "settling pending sessions: %s", a->st->err);
        } else if (paid) {
            kvd_log(KVD_LOG_INFO, "settled %zu ranks' shares of sessions past their wait", paid);
        }
    }
    kvd_market__polls_tick(a);
}

/* GET /: the coverage page (page.html, compiled in by the Makefile). */
static void h_page(struct net_http_req *req, void *ud)
{
    (void)ud;
    net_http_reply(req, 200, "text/html; charset=utf-8", "Cache-Control: no-store\r\n",
                   kvd_market__page, kvd_market__page_len);
}

int kvd_market__api_new(struct kvd_market_api **out, struct uv_loop_s *loop,
                        struct net_http_server *srv, struct kvd_market_store *store,
                        const struct kvd_market_config *cfg, char *err, size_t errlen)
{
    *out = NULL;
    struct kvd_market_api *a = calloc(1, sizeof *a);
    if (!a)
        return -ENOMEM;
    a->loop = loop;
    a->srv = srv;
    a->st = store;
    a->cfg = *cfg;
    int arc = kvd_market__admit_new(&a->admit, cfg, err, errlen);
    if (arc) {
        free(a);
        return arc;
    }
    if (kvd_market__audit_new(&a->audit, loop, store, cfg, kvd_market__audit_verdict, a)) {
        kvd_market__admit_free(a->admit);
        free(a);
        return -ENOMEM;
    }
    static const struct {
        const char *method, *path;
        net_http_handler_cb cb;
    } routes[] = {
        {"GET", "/", h_page},
        {"GET", "/v1/models", kvd_market__h_models_get},
        {"POST", "/v1/models", kvd_market__h_models_post},
        {"GET", "/v1/models/*", kvd_market__h_model_get},
        {"POST", "/v1/nodes", kvd_market__h_nodes_post},
        {"GET", "/v1/nodes/*", kvd_market__h_node_get},
        {"POST", "/v1/claims", kvd_market__h_claims},
        {"POST", "/v1/leases/heartbeat", kvd_market__h_heartbeat},
        {"POST", "/v1/leases/release", kvd_market__h_release},
        {"POST", "/v1/leases/probe", kvd_market__h_probe},
        {"POST", "/v1/leases/audit", kvd_market__h_audit},
        {"POST", "/v1/standbys", kvd_market__h_standbys},
        {"POST", "/v1/receipts", kvd_market__h_receipts},
        {"DELETE", "/v1/models/*", kvd_market__h_model_delete},
        {"POST", "/v1/clients", kvd_market__h_clients_post},
        {"GET", "/v1/clients", kvd_market__h_clients_get},
        {"GET", "/v1/clients/*", kvd_market__h_clients_get},
        {"POST", "/v1/clients/*", kvd_market__h_client_credit},
    };
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        int rc = net_http_server_route(srv, routes[i].method, routes[i].path, routes[i].cb, a);
        if (rc) {
            util_seterr(err, errlen, "route %s %s: %s", routes[i].method, routes[i].path, strerror(-rc));
            kvd_market__admit_free(a->admit);
            kvd_market__audit_free(a->audit);
            free(a);
            return rc;
        }
    }
    uv_timer_init(loop, &a->tick);
    a->tick.data = a;
    uv_timer_start(&a->tick, on_tick, 200, 200);
    *out = a;
    return 0;
}

void kvd_market__api_close(struct kvd_market_api *a)
{
    if (!a || a->closed)
        return;
    a->closed = true;
    kvd_market__polls_close(a);
    uv_timer_stop(&a->tick);
    uv_close((uv_handle_t *)&a->tick, NULL);
}

void kvd_market__api_free(struct kvd_market_api *a)
{
    if (a) {
        kvd_market__admit_free(a->admit);
        kvd_market__audit_free(a->audit);
    }
    free(a);
}

/* status.c — the relay's plain HTTP side: its counters (kvd_relay_get_stats), the JSON status
 * at /v1/relay/status, Prometheus metrics at /metrics and the health check. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kvd/relay/internal.h"


/* The addresses with the most connections (the HTTP server counts every connection). */
#define TOP_ADDRS 16
struct top_addrs {
    size_t n;
    struct { char addr[64]; uint32_t n; } a[TOP_ADDRS];
};

static void top_addrs_add(void *ud, const char *addr, uint32_t n)
{
    struct top_addrs *t = ud;
    size_t i = t->n;
    if (i == TOP_ADDRS) {
        if (t->a[TOP_ADDRS - 1].n >= n)
            return;
        i = TOP_ADDRS - 1; /* the smallest makes room */
    } else {
        t->n++;
    }
    for (; i > 0 && t->a[i - 1].n < n; i--)
        t->a[i] = t->a[i - 1];
    snprintf(t->a[i].addr, sizeof t->a[i].addr, "%s", addr);
    t->a[i].n = n;
}

static void top_addrs_get(struct kvd_relay *r, struct top_addrs *t)
{
    memset(t, 0, sizeof *t);
    net_http_server_addrs(net_ws_server_http(r->srv), top_addrs_add, t);
}

static cJSON *stats_json(struct kvd_relay *r)
{
    cJSON *o = cJSON_CreateObject();
    struct kvd_relay_stats snap;
    kvd_relay_get_stats(r, &snap);
    const struct kvd_relay_stats *s = &snap;
    cJSON_AddNumberToObject(o, "connections", (double)s->connections);
    cJSON_AddNumberToObject(o, "bridges", (double)s->bridges);
    cJSON_AddNumberToObject(o, "paired", (double)s->paired);
    cJSON_AddNumberToObject(o, "waiting", (double)s->waiting);
    cJSON_AddNumberToObject(o, "pairings_total", (double)s->pairings_total);
    cJSON_AddNumberToObject(o, "messages_total", (double)s->messages_total);
    cJSON_AddNumberToObject(o, "bytes_total", (double)s->bytes_total);
    cJSON_AddNumberToObject(o, "held_bytes", (double)s->held_bytes);
    cJSON_AddNumberToObject(o, "queued_bytes", (double)s->queued_bytes);
    cJSON_AddNumberToObject(o, "assembling_bytes", (double)s->assembling_bytes);
    cJSON *http = cJSON_AddObjectToObject(o, "http");
    cJSON_AddNumberToObject(http, "connections", (double)s->http_conns);
    cJSON_AddNumberToObject(http, "addresses", (double)s->http_addrs);
    cJSON_AddNumberToObject(http, "refused_addr", (double)s->http_refused_addr);
    cJSON_AddNumberToObject(http, "refused_conns", (double)s->http_refused_conns);
    cJSON_AddNumberToObject(http, "timeouts", (double)s->http_timeouts);
    struct top_addrs top;
    top_addrs_get(r, &top);
    cJSON *pa = cJSON_AddObjectToObject(http, "per_addr");
    for (size_t i = 0; i < top.n; i++)
        cJSON_AddNumberToObject(pa, top.a[i].addr, top.a[i].n);
    cJSON *ref = cJSON_AddObjectToObject(o, "refused");
    cJSON_AddNumberToObject(ref, "bad_bridge", (double)s->refused_bad_bridge);
    cJSON_AddNumberToObject(ref, "bad_role", (double)s->refused_bad_role);
    cJSON_AddNumberToObject(ref, "dup_role", (double)s->refused_dup_role);
    cJSON_AddNumberToObject(ref, "limit", (double)s->refused_limit);
    cJSON_AddNumberToObject(ref, "held", (double)s->refused_held);
    cJSON *cl = cJSON_AddObjectToObject(o, "closed");
    cJSON_AddNumberToObject(cl, "partner_timeout", (double)s->timeouts_partner);
    cJSON_AddNumberToObject(cl, "idle_timeout", (double)s->timeouts_idle);
    cJSON_AddNumberToObject(cl, "partner_gone", (double)s->partner_gone);
    cJSON *lim = cJSON_AddObjectToObject(o, "limits");
    cJSON_AddNumberToObject(lim, "max_bridges", r->cfg.max_bridges);
    cJSON_AddNumberToObject(lim, "max_per_addr", r->cfg.max_per_addr);
    cJSON_AddNumberToObject(lim, "pair_timeout_ms", r->cfg.pair_timeout_ms);
    cJSON_AddNumberToObject(lim, "idle_timeout_ms", r->cfg.idle_timeout_ms);
    cJSON_AddNumberToObject(lim, "ping_interval_ms", r->cfg.ping_interval_ms);
    cJSON_AddNumberToObject(lim, "max_msg_bytes", (double)r->cfg.max_msg_bytes);
    cJSON_AddNumberToObject(lim, "max_held", (double)r->cfg.max_held);
    cJSON_AddNumberToObject(lim, "max_held_total", (double)r->cfg.max_held_total);
    cJSON_AddNumberToObject(lim, "max_fragments", r->cfg.max_fragments);
    cJSON_AddNumberToObject(lim, "max_assembly", (double)r->cfg.max_assembly);
    cJSON_AddNumberToObject(lim, "max_conns_per_addr", r->cfg.max_conns_per_addr);
    cJSON_AddBoolToObject(o, "tls", !r->cfg.plain);
    return o;
}

static char *metrics_text(struct kvd_relay *r, size_t *len)
{
    struct kvd_relay_stats snap;
    kvd_relay_get_stats(r, &snap);
    const struct kvd_relay_stats *s = &snap;
    char *buf = NULL;
    size_t cap = 0;
    FILE *f = open_memstream(&buf, &cap);
    if (!f)
        return NULL;
    fprintf(f, "# HELP kvasir_relay_connections Open WebSocket connections.\n"
               "# TYPE kvasir_relay_connections gauge\nkvasir_relay_connections %" PRIu64 "\n",
            s->connections);
    fprintf(f, "# HELP kvasir_relay_bridges Bridges by state.\n# TYPE kvasir_relay_bridges gauge\n"
               "kvasir_relay_bridges{state=\"paired\"} %" PRIu64 "\n"
               "kvasir_relay_bridges{state=\"waiting\"} %" PRIu64 "\n", s->paired, s->waiting);
    fprintf(f, "# HELP kvasir_relay_pairings_total Bridges that got both ends.\n"
               "# TYPE kvasir_relay_pairings_total counter\nkvasir_relay_pairings_total %" PRIu64 "\n",
            s->pairings_total);
    fprintf(f, "# HELP kvasir_relay_messages_total Messages forwarded.\n"
               "# TYPE kvasir_relay_messages_total counter\nkvasir_relay_messages_total %" PRIu64 "\n",
            s->messages_total);
    fprintf(f, "# HELP kvasir_relay_bytes_total Payload bytes forwarded.\n"
               "# TYPE kvasir_relay_bytes_total counter\nkvasir_relay_bytes_total %" PRIu64 "\n",
            s->bytes_total);
    fprintf(f, "# HELP kvasir_relay_held_bytes Bytes held for ends still waiting for a partner.\n"
               "# TYPE kvasir_relay_held_bytes gauge\nkvasir_relay_held_bytes %" PRIu64 "\n",
            s->held_bytes);
    fprintf(f, "# HELP kvasir_relay_queued_bytes Bytes queued toward ends, not yet sent.\n"
               "# TYPE kvasir_relay_queued_bytes gauge\nkvasir_relay_queued_bytes %" PRIu64 "\n",
            s->queued_bytes);
    fprintf(f, "# HELP kvasir_relay_refused_total Connections refused, by reason.\n"
               "# TYPE kvasir_relay_refused_total counter\n"
               "kvasir_relay_refused_total{reason=\"bad_bridge\"} %" PRIu64 "\n"
               "kvasir_relay_refused_total{reason=\"bad_role\"} %" PRIu64 "\n"
               "kvasir_relay_refused_total{reason=\"dup_role\"} %" PRIu64 "\n"
               "kvasir_relay_refused_total{reason=\"limit\"} %" PRIu64 "\n"
               "kvasir_relay_refused_total{reason=\"held\"} %" PRIu64 "\n"
               "kvasir_relay_refused_total{reason=\"http_per_addr\"} %" PRIu64 "\n"
               "kvasir_relay_refused_total{reason=\"http_conns\"} %" PRIu64 "\n",
            s->refused_bad_bridge, s->refused_bad_role, s->refused_dup_role, s->refused_limit,
            s->refused_held, s->http_refused_addr, s->http_refused_conns);
    fprintf(f, "# HELP kvasir_relay_held_bytes_by_kind Bytes the relay holds, by kind.\n"
               "# TYPE kvasir_relay_held_bytes_by_kind gauge\n"
               "kvasir_relay_held_bytes_by_kind{kind=\"unpaired\"} %" PRIu64 "\n"
               "kvasir_relay_held_bytes_by_kind{kind=\"queued\"} %" PRIu64 "\n"
               "kvasir_relay_held_bytes_by_kind{kind=\"assembling\"} %" PRIu64 "\n",
            s->held_bytes, s->queued_bytes, s->assembling_bytes);
    fprintf(f, "# HELP kvasir_relay_http_connections Open connections, every kind (handshaking, "
               "plain requests, upgraded).\n# TYPE kvasir_relay_http_connections gauge\n"
               "kvasir_relay_http_connections %" PRIu64 "\n", s->http_conns);
    fprintf(f, "# HELP kvasir_relay_http_timeouts_total Connections closed by a deadline "
               "(handshake, headers, body, idle, write stall).\n"
               "# TYPE kvasir_relay_http_timeouts_total counter\n"
               "kvasir_relay_http_timeouts_total %" PRIu64 "\n", s->http_timeouts);
    struct top_addrs top;
    top_addrs_get(r, &top);
    fprintf(f, "# HELP kvasir_relay_addr_connections Open connections from the %d busiest "
               "addresses (IPv6: /64).\n# TYPE kvasir_relay_addr_connections gauge\n", TOP_ADDRS);
    for (size_t i = 0; i < top.n; i++)
        fprintf(f, "kvasir_relay_addr_connections{addr=\"%s\"} %u\n", top.a[i].addr, top.a[i].n);
    fprintf(f, "# HELP kvasir_relay_closed_total Ends closed by the relay, by reason.\n"
               "# TYPE kvasir_relay_closed_total counter\n"
               "kvasir_relay_closed_total{reason=\"partner_timeout\"} %" PRIu64 "\n"
               "kvasir_relay_closed_total{reason=\"idle_timeout\"} %" PRIu64 "\n"
               "kvasir_relay_closed_total{reason=\"partner_gone\"} %" PRIu64 "\n",
            s->timeouts_partner, s->timeouts_idle, s->partner_gone);
    fprintf(f, "# HELP kvasir_relay_max_bridges Configured bridge limit.\n"
               "# TYPE kvasir_relay_max_bridges gauge\nkvasir_relay_max_bridges %u\n",
            r->cfg.max_bridges);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    *len = cap;
    return buf;
}

void kvd_relay__on_get(struct net_ws_server *srv, const char *path, struct net_ws_reply *rep, void *ud)
{
    struct kvd_relay *r = ud;
    if (!strcmp(path, "/v1/relay/status")) {
        cJSON *o = stats_json(r);
        char *s = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        if (!s) {
            rep->status = 500;
            return;
        }
        size_t n = strlen(s);
        rep->body = malloc(n + 2);
        if (!rep->body) {
            free(s);
            rep->status = 500;
            return;
        }
        memcpy(rep->body, s, n);
        rep->body[n] = '\n';
        rep->body[n + 1] = 0;
        free(s);
        rep->body_len = n + 1;
        rep->status = 200;
        rep->content_type = "application/json";
    } else if (!strcmp(path, "/metrics")) {
        rep->body = metrics_text(r, &rep->body_len);
        rep->status = rep->body ? 200 : 500;
        rep->content_type = "text/plain; version=0.0.4; charset=utf-8";
    } else if (!strcmp(path, "/") || !strcmp(path, "/healthz")) {
        rep->body = strdup("kvasir relay\n");
        rep->body_len = rep->body ? strlen(rep->body) : 0;
        rep->status = 200;
    }
}

void kvd_relay_get_stats(const struct kvd_relay *r, struct kvd_relay_stats *out)
{
    *out = r->st;
    out->queued_bytes = 0;
    for (const struct relay_end *e = r->ends; e; e = e->next)
        out->queued_bytes += net_ws_pending(e->ws);
    if (r->closing)
        return; /* the server may be gone */
    out->assembling_bytes = net_ws_server_assembling(r->srv);
    const struct net_http_stats *h = net_http_server_stats(net_ws_server_http(r->srv));
    out->http_conns = h->conns_open;
    out->http_addrs = h->addrs;
    out->http_refused_addr = h->conns_refused_addr;
    out->http_refused_conns = h->conns_refused;
    out->http_timeouts = h->timeouts_handshake + h->timeouts_header + h->timeouts_body +
                         h->timeouts_idle + h->timeouts_write;
}

/* kvctl/ring_view.c — the ring as kvctl status shows it: one status object per rank, each its
 * own control socket's or the record rank 0 heard over the ring's links; the table, the links
 * not up, the standbys, the repair figures, and the JSON lines. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "kvctl/internal.h"
#include "ring/ring.h"
#include "util/util.h"

/* Paths here are built from a directory path plus a short suffix; one longer than PATH_MAX is
 * cut, and then simply not found. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif

static const char *jstr(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

void kvctl__ring_view_free(struct kvctl_ring_view *v)
{
    for (uint32_t r = 0; r < v->n; r++)
        cJSON_Delete(v->rows[r]);
    cJSON_Delete(v->r0);
    memset(v, 0, sizeof *v);
}

/* Row r from rank 0's "ranks": a copy of the record, marked as heard through rank 0. */
static void view_from_r0(struct kvctl_ring_view *v, uint32_t r)
{
    const cJSON *ranks = v->r0 ? cJSON_GetObjectItemCaseSensitive(v->r0, "ranks") : NULL;
    const cJSON *e = cJSON_IsArray(ranks) ? cJSON_GetArrayItem(ranks, (int)r) : NULL;
    if (!e) {
        snprintf(v->why[r], sizeof v->why[r], "rank %u does not answer", v->self);
        v->down[r] = true;
        return;
    }
    cJSON *c = cJSON_Duplicate(e, 1);
    if (!c)
        return;
    char via[32];
    snprintf(via, sizeof via, "rank %u", v->self);
    cJSON_AddStringToObject(c, "via", via);
    if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "answer"))) {
        v->down[r] = true;
        const cJSON *age = cJSON_GetObjectItemCaseSensitive(c, "age_ms");
        if (jstr(c, "reason")[0])
            snprintf(v->why[r], sizeof v->why[r], "no answer: %s; last heard %.1f s ago", jstr(c, "reason"),
                     util_json_number(c, "age_ms", 0) / 1000);
        else if (cJSON_IsNumber(age))
            snprintf(v->why[r], sizeof v->why[r], "no answer: last heard %.1f s ago", age->valuedouble / 1000);
        else
            snprintf(v->why[r], sizeof v->why[r], "no answer: never heard of over the ring");
        cJSON_AddStringToObject(c, "error", v->why[r]);
        util_json_set(c, "linked", cJSON_CreateFalse());
    }
    v->rows[r] = c;
}

/* Rank 0's own object without the ring view it carries. */
static cJSON *r0_own(const cJSON *r0)
{
    cJSON *c = cJSON_Duplicate(r0, 1);
    cJSON_DeleteItemFromObjectCaseSensitive(c, "ranks");
    cJSON_DeleteItemFromObjectCaseSensitive(c, "standbys");
    return c;
}

/* A local ring directory (or a manifest next to rank directories): each rank with a
 * directory here answers on its own socket; the others through rank 0. */
void kvctl__ring_view_dir(struct kvctl_ring_view *v, const char *dir, const struct ring_manifest *m)
{
    memset(v, 0, sizeof *v);
    v->n = m->n_ranks;
    v->dir = dir;
    v->n_standbys = m->n_standbys;
    snprintf(v->ring, sizeof v->ring, "%s", m->ring);
    snprintf(v->model, sizeof v->model, "%s", m->model_name);
    snprintf(v->arch, sizeof v->arch, "%s", m->arch);
    snprintf(v->dtype, sizeof v->dtype, "%s", m->dtype);
    v->n_layers = m->n_layers;
    v->n_embd = m->n_embd;
    char sock[PATH_MAX], err[300];
    kvctl__rank_sock(dir, 0, sock, sizeof sock);
    v->r0 = kvctl__query_status_ring(sock, true, err, sizeof err);
    for (uint32_t r = 0; r < v->n; r++) {
        char rd[PATH_MAX + 16];
        snprintf(rd, sizeof rd, "%s/rank-%u", dir, r);
        if (r > 0 && access(rd, F_OK) != 0) {   /* not on this host: as rank 0 heard of it */
            view_from_r0(v, r);
            continue;
        }
        if (r == 0 && v->r0) {
            v->rows[0] = r0_own(v->r0);
            continue;
        }
        kvctl__rank_sock(dir, r, sock, sizeof sock);
        v->rows[r] = kvctl__query_status(sock, err, sizeof err);
        if (!v->rows[r]) {
            snprintf(v->why[r], sizeof v->why[r], "%s", err);
            v->down[r] = true;
        }
    }
}

/* Rank 0's control socket (unix:PATH): every rank as rank 0 heard of it. */
int kvctl__ring_view_sock(struct kvctl_ring_view *v, const char *sock, char *err, size_t errlen)
{
    memset(v, 0, sizeof *v);
    v->r0 = kvctl__query_status_ring(sock, true, err, errlen);
    if (!v->r0)
        return -1;
    /* Any stage holds the ring's records; rank 0's view is the one to ask (it is the ring's
     * entry and hears every rank), another stage's shows the ring as that stage hears it. */
    double me = util_json_number(v->r0, "rank", -1);
    if (me < 0) {
        snprintf(err, errlen, "%s is a standby that serves no rank yet: ask rank 0's control socket", sock);
        cJSON_Delete(v->r0);
        v->r0 = NULL;
        return -1;
    }
    v->self = (uint32_t)me;
    const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(v->r0, "ranks");
    int n = cJSON_GetArraySize(ranks);
    v->n_standbys = (uint32_t)cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(v->r0, "standbys"));
    v->n = n < 0 ? 0 : n > RING_MAX_RANKS ? RING_MAX_RANKS : (uint32_t)n;
    snprintf(v->ring, sizeof v->ring, "%s", jstr(v->r0, "ring"));
    snprintf(v->model, sizeof v->model, "%s", jstr(v->r0, "model"));
    snprintf(v->arch, sizeof v->arch, "%s", jstr(v->r0, "arch"));
    snprintf(v->dtype, sizeof v->dtype, "%s", jstr(v->r0, "dtype"));
    v->n_layers = (uint32_t)util_json_number(v->r0, "n_layers", 0);
    v->n_embd = (uint32_t)util_json_number(v->r0, "n_embd", 0);
    for (uint32_t r = 0; r < v->n; r++) {
        if (r == v->self)
            v->rows[r] = r0_own(v->r0);
        else
            view_from_r0(v, r);
    }
    return 0;
}

/* The standby nodes (a local ring's own sockets, else rank 0's view) and rank 0's repair
 * figures. */
static void print_repair(const struct kvctl_ring_view *v, FILE *out)
{
    char sock[PATH_MAX + 32], err[300];
    const cJSON *sbs = v->r0 ? cJSON_GetObjectItemCaseSensitive(v->r0, "standbys") : NULL;
    for (int i = 0; i < (int)v->n_standbys; i++) {
        const cJSON *e = cJSON_GetArrayItem(sbs, i);   /* NULL when rank 0 did not answer */
        const char *ep = jstr(e, "endpoint");
        if (!strncmp(ep, "tcp://", 6))
            ep += 6;
        snprintf(sock, sizeof sock, "%s/standby-%d/kvd.sock", v->dir ? v->dir : "", i);
        cJSON *s = v->dir && access(sock, F_OK) == 0 ? kvctl__query_status(sock, err, sizeof err) : NULL;
        if (v->dir && access(sock, F_OK) == 0 && !s)
            fprintf(out, "standby %d  %-22s down (%s)\n", i, ep, err);
        else if (s && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, "waiting")))
            fprintf(out, "standby %d  %-22s pid %.0f  waiting\n", i, ep, util_json_number(s, "pid", 0));
        else if (s)
            fprintf(out, "standby %d  %-22s pid %.0f  serves rank %.0f (in %s, out %s, %.0f sessions, "
                    "%.0f replayed: %.0f positions recomputed)\n", i, ep,
                    util_json_number(s, "pid", 0), util_json_number(s, "rank", 0),
                    jstr(cJSON_GetObjectItemCaseSensitive(s, "in"), "state"),
                    jstr(cJSON_GetObjectItemCaseSensitive(s, "out"), "state"), util_json_number(s, "sessions", 0),
                    util_json_number(s, "replayed_sessions", 0), util_json_number(s, "replayed_positions", 0));
        else if (util_json_number(e, "serves", -1) >= 0)
            fprintf(out, "standby %d  %-22s node %.16s  serves rank %.0f\n", i, ep, jstr(e, "node"),
                    util_json_number(e, "serves", -1));
        else
            fprintf(out, "standby %d  %-22s node %.16s  serves no rank (waiting, or not heard of)\n", i, ep,
                    jstr(e, "node"));
        cJSON_Delete(s);
    }
    const cJSON *r = v->r0 ? cJSON_GetObjectItemCaseSensitive(v->r0, "repair") : NULL;
    if (r && (v->n_standbys || util_json_number(r, "wait_s", 0) > 0 ||
              util_json_number(r, "ring_breaks", 0) > 0)) {
        fprintf(out, "repair: wait %.0f s, %.0f paused sessions, %.0f ring breaks, %.0f sessions resumed "
                "(%.0f replays), %.0f not repaired in time, break to next token last %.0f ms, max %.0f ms",
                util_json_number(r, "wait_s", 0), util_json_number(r, "paused_sessions", 0),
                util_json_number(r, "ring_breaks", 0), util_json_number(r, "resumed_sessions", 0),
                util_json_number(r, "replays", 0), util_json_number(r, "not_repaired", 0),
                util_json_number(r, "last_resume_ms", 0), util_json_number(r, "max_resume_ms", 0));
        double reps = util_json_number(r, "repairs", 0);
        if (reps > 0) {
            time_t t = (time_t)util_json_number(r, "last_repair_unix", 0);
            char when[40];
            struct tm tm;
            strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime_r(&t, &tm));
            double rk = util_json_number(r, "last_repair_rank", -1);
            fprintf(out, "; %.0f repairs, the last at %s", reps, when);
            if (rk >= 0)
                fprintf(out, " (rank %.0f)", rk);
        }
        fprintf(out, "\n");
    }
    /* What each rank's own node recomputed for replays (a standby's is on its line above); a
     * rank's own socket gives it, a record heard over the ring does not carry it. */
    for (uint32_t i = 0; v->n_standbys && i < v->n; i++) {
        const cJSON *row = v->rows[i];
        if (!row || !cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(row, "replayed_sessions")))
            continue;
        fprintf(out, "replayed on rank %u: %.0f sessions, %.0f positions recomputed\n", i,
                util_json_number(row, "replayed_sessions", 0), util_json_number(row, "replayed_positions", 0));
    }
}

/* One link's last error, when it is not up. */
static void print_link_error(FILE *out, uint32_t r, const cJSON *s, bool is_out)
{
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(s, is_out ? "out" : "in");
    const char *e = jstr(l, "error");
    if (!l || !e[0] || !strcmp(jstr(l, "state"), "up"))
        return;
    fprintf(out, "  rank %u %s link %s rank %.0f: %s: %s (%.0f s ago)\n", r, is_out ? "out" : "in",
            is_out ? "to" : "from", util_json_number(l, "peer_rank", 0), jstr(l, "state"), e,
            util_json_number(l, "error_age_s", 0));
}

/* The table; returns how many stages did not answer. */
int kvctl__ring_view_print(const struct kvctl_ring_view *v, FILE *out)
{
    int n_down = 0;
    fprintf(out, "ring %s  model %s (%s, %u layers, n_embd %u)  wire %s  %u stages\n", v->ring,
            v->model, v->arch, v->n_layers, v->n_embd, v->dtype, v->n);
    fprintf(out, "%-4s %-9s %-7s %-22s %-9s %-9s %-8s %-5s %-9s %-9s %-7s %s\n", "rank", "layers", "pid",
            "endpoint", "in", "out", "rtt_ms", "sess", "ms/tok", "B/tok out", "steps", "host");
    for (uint32_t r = 0; r < v->n; r++) {
        const cJSON *s = v->rows[r];
        char layers[32] = "-";
        const cJSON *w = cJSON_GetObjectItemCaseSensitive(s, "window");
        if (cJSON_GetArraySize(w) == 2)
            snprintf(layers, sizeof layers, "[%.0f, %.0f)", cJSON_GetArrayItem(w, 0)->valuedouble,
                     cJSON_GetArrayItem(w, 1)->valuedouble);
        const char *ep = jstr(s, "endpoint");
        if (!strncmp(ep, "tcp://", 6))
            ep += 6;
        if (v->down[r]) {
            n_down++;
            if (!s || !cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(s, "pid")))
                fprintf(out, "%-4u %-9s %-7s %-22s down (%s)\n", r, layers, "-", ep, v->why[r]);
            else   /* rank 0 heard of it once: when, and from where */
                fprintf(out, "%-4u %-9s %-7.0f %-22s down (%s; host %s)\n", r, layers,
                        util_json_number(s, "pid", 0), ep, v->why[r], jstr(s, "host"));
            continue;
        }
        const cJSON *in = cJSON_GetObjectItemCaseSensitive(s, "in");
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(s, "out");
        fprintf(out, "%-4u %-9s %-7.0f %-22s %-9s %-9s %-8.3f %-5.0f %-9.3f %-9.0f %-7.0f %s\n", r, layers,
                util_json_number(s, "pid", 0), ep, jstr(in, "state"), jstr(o, "state"),
                util_json_number(o, "rtt_ms", 0), util_json_number(s, "sessions", 0),
                util_json_number(s, "ms_per_token", 0), util_json_number(s, "bytes_per_token_out", 0),
                util_json_number(s, "steps", 0), jstr(s, "host"));
    }
    bool errs = false;
    for (uint32_t r = 0; r < v->n; r++)
        for (int k = 0; k < 2; k++) {
            const cJSON *l = cJSON_GetObjectItemCaseSensitive(v->rows[r], k ? "out" : "in");
            if (jstr(l, "error")[0] && strcmp(jstr(l, "state"), "up") != 0) {
                if (!errs)
                    fprintf(out, "links not up, with the reason each last closed:\n");
                errs = true;
                print_link_error(out, r, v->rows[r], k);
            }
        }
    print_repair(v, out);
    return n_down;
}

/* The table of a local ring (DIR, or its manifest); returns how many stages did not answer. */
int kvctl__ring_status_table(const char *dir, const struct ring_manifest *m, FILE *out)
{
    struct kvctl_ring_view v;
    kvctl__ring_view_dir(&v, dir, m);
    int n = kvctl__ring_view_print(&v, out);
    kvctl__ring_view_free(&v);
    return n;
}

/* One status --json block: a status object per rank, one per line, then each standby's. */
int kvctl__ring_view_json(const struct kvctl_ring_view *v, FILE *out)
{
    int bad = 0;
    for (uint32_t r = 0; r < v->n; r++) {
        if (!v->rows[r]) {
            fprintf(out, "{\"rank\":%u,\"error\":\"unreachable\"}\n", r);
            bad = 1;
            continue;
        }
        bad |= v->down[r];
        char *t = cJSON_PrintUnformatted(v->rows[r]);
        fprintf(out, "%s\n", t ? t : "{}");
        free(t);
    }
    const cJSON *sbs = v->r0 ? cJSON_GetObjectItemCaseSensitive(v->r0, "standbys") : NULL;
    for (uint32_t i = 0; i < v->n_standbys; i++) {   /* a local ring's standby answers itself */
        char sock[PATH_MAX + 32], err[300];
        snprintf(sock, sizeof sock, "%s/standby-%u/kvd.sock", v->dir ? v->dir : "", i);
        cJSON *s = v->dir && access(sock, F_OK) == 0 ? kvctl__query_status(sock, err, sizeof err) : NULL;
        if (v->dir && access(sock, F_OK) == 0 && !s) {
            fprintf(out, "{\"standby\":%u,\"error\":\"unreachable\"}\n", i);
            continue;
        }
        const cJSON *e = s ? s : cJSON_GetArrayItem(sbs, (int)i);
        char *t = e ? cJSON_PrintUnformatted(e) : NULL;
        if (t)
            fprintf(out, "%s\n", t);
        else
            fprintf(out, "{\"standby\":%u,\"error\":\"unreachable\"}\n", i);
        free(t);
        cJSON_Delete(s);
    }
    return bad;
}

/* A non-negative number of seconds (fractions allowed): 0, or -1. */

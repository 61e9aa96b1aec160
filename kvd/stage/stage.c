/* stage.c — the stage role: the struct's start (manifest, identity, window, compute thread,
 * listener, control socket, seeder) and its clean stop, the periodic tick (pings, silent
 * links, idle sessions) and signals. Everything here runs on the loop thread; compute goes to
 * compute.c, and the rest of the loop side to the files internal.h lists. */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "kvd/stage/internal.h"
#include "kvd/kvd.h"
#include "ring/ring.h"
#include "seed/seed.h"
#include "net/net.h"
#include "util/err.h"
#include "util/util.h"

/* ================================ periodic ================================ */

#define ROSTER_EVERY_MS 1000   /* how often the roster file is looked at for a change */

/* The roster beside the manifest (kvd_stage_opts.roster): read when its file changed since
 * the last look (or always, at start); its standbys follow the manifest's own. A stage that is
 * a standby keeps its roster as it was when a new one leaves its own key out (its entry is
 * what it serves under). 0, or -errno at start (logged); later errors are logged only. */
static int roster_read(struct stage *st, bool start)
{
    struct stat sb;
    if (stat(st->o.roster, &sb) < 0) {
        if (start && errno != ENOENT)
            kvd_log(KVD_LOG_WARN, "roster %s: %s", st->o.roster, strerror(errno));
        return 0;   /* none yet: the manifest's standbys only */
    }
    if (!start && sb.st_mtim.tv_sec == st->tick.roster_mtime.tv_sec &&
        sb.st_mtim.tv_nsec == st->tick.roster_mtime.tv_nsec && sb.st_size == st->tick.roster_size)
        return 0;
    char *buf, err[KV_ERR_MAX];
    size_t n;
    int rc = util_file_read(st->o.roster, 1u << 20, &buf, &n, err, sizeof err);
    if (rc < 0) {
        kvd_log(KVD_LOG_WARN, "roster %s: %s", st->o.roster, err);
        return start ? rc : 0;
    }
    st->tick.roster_mtime = sb.st_mtim;
    st->tick.roster_size = sb.st_size;
    struct ring_manifest *m = malloc(sizeof *m);
    if (!m) {
        free(buf);
        return -ENOMEM;
    }
    memcpy(m, &st->m, sizeof *m);
    rc = ring_roster_apply(m, buf, n, err, sizeof err);
    free(buf);
    int self = -1;
    for (uint32_t i = 0; rc == 0 && st->id && i < m->n_standbys; i++)
        if (!memcmp(m->standbys[i].node, net_identity_pub(st->id), 32))
            self = (int)i;
    if (rc == 0 && st->standby.index >= 0 && self < 0) {
        kvd_log(KVD_LOG_WARN, "roster %s leaves this standby out; keeping the one before", st->o.roster);
    } else if (rc == 0) {
        uint32_t before = st->m.n_standbys;
        memcpy(st->m.standbys, m->standbys, sizeof m->standbys);
        st->m.n_standbys = m->n_standbys;
        if (st->standby.index >= 0)
            st->standby.index = self;
        if (st->m.n_standbys != before)
            kvd_log(KVD_LOG_INFO, "roster: %u standby(s) for this ring", st->m.n_standbys);
    } else {
        kvd_log(KVD_LOG_WARN, "roster %s: %s", st->o.roster, err);
    }
    free(m);
    return 0;
}

static void tick_cb(uv_timer_t *t)
{
    struct stage *st = t->data;
    uint64_t now = (uint64_t)util_now_ms();
    /* Pings often enough that a deadline sees several: a quarter of it, at most PING_MS. */
    if (kvd_conn_out_up(st)) {
        uint32_t every = kvd_conn_deadline_ms(st->links.out) / 4;
        if (now - st->tick.last_ping_ms >= (every < PING_MS ? every : PING_MS)) {
            kvd_conn_ping(st->links.out);
            st->tick.last_ping_ms = now;
        }
    }
    kvd_status_tick(st);
    if (st->o.roster && now - st->tick.roster_checked_ms >= ROSTER_EVERY_MS) {
        st->tick.roster_checked_ms = now;
        roster_read(st, false);
    }
    struct conn *links[2] = {st->links.in, st->links.out};
    for (int i = 0; i < 2; i++)
        if (links[i] && links[i]->up && now - links[i]->last_rx_ms > kvd_conn_deadline_ms(links[i])) {
            char why[80];
            snprintf(why, sizeof why, "nothing received for %.1f s",
                     kvd_conn_deadline_ms(links[i]) / 1000.0);
            links[i]->hung = true;
            kvd_conn_close(links[i], why);
        }
    for (struct conn *p = st->links.pending; p; p = p->next) {
        /* our in-link through a relay that nothing came to yet waits for the predecessor,
         * which may not run yet: that is no handshake taking too long */
        bool waiting = p->relay_in && p->link && ring_link_bytes_in(p->link) == 0;
        if (waiting && now - p->last_rx_ms > RELAY_WAIT_MS)
            kvd_conn_close(p, "no predecessor came through the relay");
        else if (!waiting && now - p->last_rx_ms > 10000)
            kvd_conn_close(p, "handshake took more than 10 s");
        else if (p->hello_ms && now - p->hello_ms > AUTH_AFTER_HELLO_MS) {
            char why[120];
            snprintf(why, sizeof why, "no AUTH within %.1f s of its valid HELLO (a HELLO is public "
                     "data; only the AUTH proves the key)", AUTH_AFTER_HELLO_MS / 1000.0);
            kvd_conn_close(p, why);
        }
    }
    /* A successor that takes the connection but not the handshake (a stopped process whose
     * kernel still accepts) is dead after the handshake deadline, so the next candidate for
     * its rank gets its turn (docs/ring.md, "Repair"). */
    uint64_t hs_ms = kvd_conn_hs_deadline_ms(st);
    if (st->links.out && !st->links.out->up && st->links.out->hs && now - st->links.out->start_ms > hs_ms) {
        char why[80];
        snprintf(why, sizeof why, "handshake took more than %.1f s", hs_ms / 1000.0);
        kvd_conn_close(st->links.out, why);
    }
    uint64_t idle = (uint64_t)st->o.idle_timeout_s * 1000;
    kvd_receipt_park_tick(st, now, idle);
    for (struct sess *s = st->sessions.list, *next; s; s = next) {
        next = s->next;
        if (!s->paused && now - s->last_active_ms > idle) {
            char msg[200];
            snprintf(msg, sizeof msg, "session idle for more than %u s on rank %u", st->o.idle_timeout_s, st->rank);
            if (st->rank == 0)
                kvd_sess_finish(st, s, NULL, msg);
            else {
                kvd_log(KVD_LOG_WARN, "session %016" PRIx64 ": %s", s->id, msg);
                kvd_sess_drop(st, s);
            }
        }
    }
}

/* ================================ lifecycle ================================ */

static void close_walk(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

/* The compute thread is joined and its handle closed: nothing uses the backend any more. */
static void on_compute_closed(void *ud)
{
    struct stage *st = ud;
    if (st->be_open)
        kvd_backend_close(&st->be);
    st->be_open = false;
}

static void stage_shutdown(struct stage *st, const char *why)
{
    if (st->shutting_down)
        return;
    kvd_log(KVD_LOG_INFO, "shutting down: %s", why);
    kvd_service_stopping();
    st->shutting_down = true;
    while (st->sessions.list)
        kvd_sess_finish(st, st->sessions.list, NULL, "the daemon is shutting down");
    kvd_receipt_park_free(st);
    while (st->sessions.clients)
        kvd_client_close(st->sessions.clients);
    if (st->links.in)
        kvd_conn_close(st->links.in, "shutting down");
    if (st->links.out)
        kvd_conn_close(st->links.out, "shutting down");
    for (struct conn *p = st->links.pending; p; p = p->next)
        kvd_conn_close(p, "shutting down");
    if (st->io.ls)
        ring_listener_close(st->io.ls, NULL, NULL);
    st->io.ls = NULL;
    if (st->io.http)
        net_http_server_close(st->io.http, NULL, NULL);
    st->io.http = NULL;
    kvd_api_stop(st);
    if (st->io.ctl_open)
        uv_close((uv_handle_t *)&st->io.ctl, NULL);
    st->io.ctl_open = false;
    unlink(st->io.sock_path);
    uv_close((uv_handle_t *)&st->tick.timer, NULL);
    uv_close((uv_handle_t *)&st->links.redial, NULL);
    uv_close((uv_handle_t *)&st->links.redial_in, NULL);
    if (st->repair.timer_open)
        uv_close((uv_handle_t *)&st->repair.timer, NULL);
    st->repair.timer_open = false;
    uv_close((uv_handle_t *)&st->io.sigterm, NULL);
    uv_close((uv_handle_t *)&st->io.sigint, NULL);
    uv_close((uv_handle_t *)&st->io.sighup, NULL);
    kvd_compute_stop(st->comp, on_compute_closed, st);
    st->comp = NULL;
}

static void on_signal(uv_signal_t *h, int sig)
{
    struct stage *st = h->data;
    if (sig == SIGHUP && !kvd_sighup_stops())
        return;   /* a service's config reload */
    stage_shutdown(st, sig == SIGTERM ? "SIGTERM" : sig == SIGHUP ? "SIGHUP (hang-up)" : "SIGINT");
}

static int endpoint_hostport(const char *ep, char *out, size_t n)
{
    const char *p = strstr(ep, "://");
    if (!p || strncmp(ep, "tcp://", 6) != 0)
        return -EINVAL;
    snprintf(out, n, "%s", p + 3);
    return 0;
}

/* Model identity: the catalog's id must be the manifest's model.catalog, the window's header
 * metadata (vocabulary, hyperparameters, ...) must match the catalog's metadata digests, and
 * every tensor of the window that this stage mapped must match its catalog entry (type, shape,
 * size and the SHA-256 of its bytes). */
static int check_identity(struct stage *st, const struct kvd_stage_opts *o)
{
    if (!o->catalog) {
        if (st->m.catalog[0] && kvd_backend_gguf(&st->be))
            kvd_log(KVD_LOG_WARN, "manifest names model catalog %.16s... but no --catalog was given: "
                    "the window's identity is not checked", st->m.catalog);
        return 0;
    }
    char err[KV_ERR_MAX], id[65];
    struct gguf_catalog *c;
    int rc = gguf_catalog_load(&c, o->catalog, id, err, sizeof err);
    if (rc < 0) {
        kvd_log(KVD_LOG_ERROR, "catalog %s: %s", o->catalog, err);
        return rc;
    }
    if (st->m.catalog[0] && strcmp(id, st->m.catalog) != 0) {
        kvd_log(KVD_LOG_ERROR, "catalog %s has id %.16s..., the manifest's model is %.16s...", o->catalog, id,
                st->m.catalog);
        gguf_catalog_free(c);
        return -EPERM;
    }
    const struct gguf_file *f = kvd_backend_gguf(&st->be);
    if (!f) {   /* a backend without a model file: nothing mapped to check */
        gguf_catalog_free(c);
        return 0;
    }
    if ((rc = gguf_catalog_verify_metadata(c, f, err, sizeof err)) != 0) {
        kvd_log(KVD_LOG_ERROR, "window does not match catalog %s: %s", o->catalog, err);
        gguf_catalog_free(c);
        return rc;
    }
    uint64_t checked = 0, bytes = 0;
    for (uint64_t i = 0; f && i < gguf_tensor_count(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        if (!t->data)
            continue;   /* not part of this window */
        const struct gguf_catalog_tensor *ct = gguf_catalog_find(c, t->name);
        bool same = ct && ct->type == t->type && ct->n_dims == t->n_dims && ct->size == t->size;
        for (uint32_t d = 0; same && d < t->n_dims; d++)
            same = ct->ne[d] == t->ne[d];
        char hex[65] = "";
        if (same) {
            gguf_sha256_hex(t->data, t->size, hex);
            same = !strcmp(hex, ct->sha256);
            /* Hashing read every page: let them go again (a weight the device keeps in a
             * layout of its own must not be resident twice; others fault back in). */
            util_pages_drop(t->data, t->size);
        }
        if (!same) {
            kvd_log(KVD_LOG_ERROR, "tensor %s does not match catalog %s (%s)", t->name, o->catalog,
                    !ct ? "not in the catalog" : hex[0] ? "SHA-256 differs" : "type/shape/size differ");
            gguf_catalog_free(c);
            return -EBADMSG;
        }
        checked++;
        bytes += t->size;
    }
    gguf_catalog_free(c);
    if (checked == 0) {
        kvd_log(KVD_LOG_ERROR, "no mapped tensor to check against the catalog");
        return -EINVAL;
    }
    kvd_log(KVD_LOG_INFO, "window verified against catalog %.16s...: %" PRIu64 " tensors, %" PRIu64 " bytes",
            id, checked, bytes);
    return 0;
}

/* The compute thread's results, on the loop: a probe's to the control client that asked for
 * it, every other job's to its session. */
static void on_job_done(struct kvd_job *j, void *ud)
{
    if (j->kind == KVD_JOB_PROBE)
        kvd_ctl_probe_done(ud, j);
    else
        kvd_sess_on_job_done(j, ud);
}

/* Take rank: its window on the backend asked for (sliced from --model, or the --window file),
 * checked against the manifest and the catalog, the payload cap, and the compute thread. A
 * stage does it at start; a standby when its first predecessor has authenticated (link.c, through
 * st->take_rank). 0, or -errno (logged). */
static int stage_take_rank(struct stage *st, uint32_t rank)
{
    const struct kvd_stage_opts *o = &st->o;
    char err[KV_ERR_MAX];
    int rc;
    st->rank = rank;
    st->pred = (st->rank + st->n - 1) % st->n;
    st->succ = (st->rank + 1) % st->n;
    st->is_last = st->rank == st->n - 1;
    char prefix[64];
    if (st->standby.waiting)
        snprintf(prefix, sizeof prefix, "stage %u/%u (standby %u)", st->rank, st->n, st->standby.index);
    else
        snprintf(prefix, sizeof prefix, "stage %u/%u", st->rank, st->n);
    kvd_log_set_prefix(prefix);
    const struct ring_rank_info *me = &st->m.ranks[st->rank];
    if (!st->standby.waiting && me->has_node && memcmp(me->node, net_identity_pub(st->id), 32) != 0) {
        kvd_log(KVD_LOG_ERROR, "this node's key (%s/node.key) is not the one the manifest names for rank %u",
                o->state_dir ? o->state_dir : ".", st->rank);
        return -EPERM;
    }
    if (st->standby.waiting)
        kvd_log(KVD_LOG_INFO, "standby %u takes over rank %u: loading layers [%u, %u)", st->standby.index,
                rank, me->first, me->last);
    double t0 = util_now_ms();
    /* Load only this rank's window, on the backend asked for (the model unless a build's own). */
    const struct kvd_backend_kind *kind = kvd_backend_kind_find(o->backend ? o->backend : "model");
    if (!kind) {
        kvd_log(KVD_LOG_ERROR, "no compute backend named '%s' in this kvd", o->backend);
        return -EINVAL;
    }
    bool win = o->window || st->standby.pulled[0];   /* a window file, not a full model to slice */
    const char *path = st->standby.pulled[0] ? st->standby.pulled : o->window ? o->window : o->model;
    struct kvd_backend_args ba = {
        .path = path, .first = win ? -1 : (int)me->first, .last = win ? -1 : (int)me->last,
        .win_first = me->first, .win_last = me->last, .n_layer = st->m.n_layers,
        .n_embd = st->m.n_embd, .n_ctx = st->m.n_ctx, .max_batch = st->m.max_batch,
        .n_threads = o->n_threads,
        /* --backend, else the manifest's "backend" for this rank: a stage that cannot open it
         * refuses to start (docs/opencl.md) */
        .device = o->device ? o->device : me->backend[0] ? me->backend : "cpu",
        .cl = &o->cl,
    };
    err[0] = 0;
    rc = kind->open(&st->be, &ba, err, sizeof err);
    snprintf(st->backend_name, sizeof st->backend_name, "%s",
             kind->open == kvd_backend_open_model ? ba.device : kind->name);
    if (rc < 0) {
        if (path && kind->open == kvd_backend_open_model)
            kvd_log(KVD_LOG_ERROR, "model %s: %s", path, err);
        else
            kvd_log(KVD_LOG_ERROR, "%s backend: %s", kind->name, err);
        goto fail_be;
    }
    st->be_open = true;
    /* A backend without a model file (a stand-in) has no architecture to match. */
    bool has_file = kvd_backend_gguf(&st->be) != NULL;
    if (st->be.first != me->first || st->be.last != me->last || st->be.n_layer != st->m.n_layers ||
        st->be.n_embd != st->m.n_embd || (has_file && strcmp(st->be.arch, st->m.arch) != 0)) {
        kvd_log(KVD_LOG_ERROR, "the model does not match the manifest: window [%u, %u) vs [%u, %u), n_layers %u vs %u, "
                "n_embd %u vs %u, arch %s vs %s", st->be.first, st->be.last, me->first, me->last,
                st->be.n_layer, st->m.n_layers, st->be.n_embd, st->m.n_embd, st->be.arch, st->m.arch);
        rc = -EINVAL;
        goto fail_be;
    }
    if ((rc = check_identity(st, o)) < 0)
        goto fail_be;
    st->chunk = o->chunk && o->chunk < st->m.max_batch ? o->chunk : st->m.max_batch;
    /* The largest payload a peer may send us: an ACT of max_batch rows, an OPEN with a full
     * context of prompt, a TOKEN of a verifying pass's tokens with their logits and the next
     * drafts, or an ERROR. */
    uint64_t cap = (uint64_t)st->m.max_batch * st->m.n_embd * st->m.wire_dsize;
    uint64_t c2 = RING_OPEN_LEN + (uint64_t)st->m.n_ctx * 4;
    uint64_t c3 = (uint64_t)RING_TOKENS_MAX * (8 + (uint64_t)st->be.n_vocab * 4) + RING_DRAFTS_MAX * 4;
    if (c2 > cap) cap = c2;
    if (c3 > cap) cap = c3;
    if (4 + RING_ERRMSG_MAX > cap) cap = 4 + RING_ERRMSG_MAX;
    if (RING_HELLO_LEN > cap) cap = RING_HELLO_LEN;
    st->max_payload = cap > RING_PAYLOAD_HARD_MAX ? RING_PAYLOAD_HARD_MAX : (uint32_t)cap;
    rc = kvd_compute_new(&st->comp, st->loop, &st->be, st->m.wire_dsize, st->m.max_batch,
                         o->batch_wait_us, on_job_done, st);
    if (rc < 0) {
        kvd_log(KVD_LOG_ERROR, "compute thread: %s", uv_strerror(rc));
        goto fail_be;
    }
    if (st->standby.waiting) {
        st->standby.waiting = false;
        st->standby.takeovers++;
        kvd_log(KVD_LOG_INFO, "standby %u serves rank %u (window loaded in %.0f ms)", st->standby.index, rank,
                util_now_ms() - t0);
    }
    return 0;
fail_be:
    if (st->be_open)
        kvd_backend_close(&st->be);
    st->be_open = false;
    return rc;
}

/* A standby with --window-from: the pull of one rank's window, on a libuv worker thread. */
struct window_pull {
    uv_work_t req;
    struct stage *st;
    uint32_t rank;
    int rc;
    char path[4096], err[KV_ERR_MAX];
    double t0;
};

static void pull_work(uv_work_t *req)
{
    struct window_pull *p = req->data;
    const struct kvd_stage_opts *o = &p->st->o;
    p->rc = seed_window_from(o->manifest, (int)p->rank, o->standby_window_from, o->catalog,
                             o->state_dir, 0, NULL, NULL, p->path, sizeof p->path, p->err,
                             sizeof p->err);
}

static void pull_done(uv_work_t *req, int status)
{
    struct window_pull *p = req->data;
    struct stage *st = p->st;
    st->standby.pulling = false;
    if (status < 0 || p->rc < 0)
        kvd_log(KVD_LOG_ERROR, "standby %u: pulling the window of rank %u from %s failed: %s",
                st->standby.index, p->rank, st->o.standby_window_from,
                status < 0 ? uv_strerror(status) : p->err);
    else {
        snprintf(st->standby.pulled, sizeof st->standby.pulled, "%s", p->path);
        st->standby.pulled_rank = p->rank;
        kvd_log(KVD_LOG_INFO, "standby %u: window of rank %u pulled from %s in %.0f ms: %s",
                st->standby.index, p->rank, st->o.standby_window_from, util_now_ms() - p->t0, p->path);
    }
    free(p);
}

static int stage_pull_window(struct stage *st, uint32_t rank)
{
    if (!st->o.standby_window_from)
        return 1;   /* the window is sliced from --model */
    if (st->standby.pulled[0] && st->standby.pulled_rank == rank)
        return 1;
    if (st->standby.pulling || st->shutting_down)
        return 0;
    struct window_pull *p = calloc(1, sizeof *p);
    if (!p)
        return -ENOMEM;
    p->req.data = p;
    p->st = st;
    p->rank = rank;
    p->t0 = util_now_ms();
    st->standby.pulled[0] = 0;   /* another rank's window is of no use any more */
    int rc = uv_queue_work(st->loop, &p->req, pull_work, pull_done);
    if (rc < 0) {
        free(p);
        return rc;
    }
    st->standby.pulling = true;
    kvd_log(KVD_LOG_INFO, "standby %u: dialled for rank %u; pulling its window from %s first",
            st->standby.index, rank, st->o.standby_window_from);
    return 0;
}

/* The ranks this node links to (the predecessors and successors of the ranks it may serve:
 * its own, or a standby's) that the manifest names no node key for, as "rank 1, rank 3" into
 * out[n] (empty: every neighbour is pinned). Anyone could link as those: a relay or anyone on
 * the path could read and rewrite the ring's traffic by answering with its own key. */
static void unpinned_neighbours(const struct ring_manifest *m, const struct kvd_stage_opts *o,
                                char *out, size_t n)
{
    uint64_t serve = o->is_standby ? m->standbys[o->standby].ranks : (uint64_t)1 << o->rank;
    uint64_t peers = 0;
    for (uint32_t r = 0; r < m->n_ranks; r++)
        if (serve >> r & 1)
            peers |= (uint64_t)1 << (r + m->n_ranks - 1) % m->n_ranks |
                     (uint64_t)1 << (r + 1) % m->n_ranks;
    size_t at = 0;
    out[0] = 0;
    for (uint32_t r = 0; r < m->n_ranks; r++)
        if ((peers >> r & 1) && !m->ranks[r].has_node && at < n)
            at += (size_t)snprintf(out + at, n - at, "%srank %u", at ? ", " : "", r);
}

int kvd_stage_run(const struct kvd_stage_opts *o)
{
    char err[KV_ERR_MAX];
    struct stage *st = calloc(1, sizeof *st);
    if (!st)
        return -ENOMEM;
    st->o = *o;
    st->shutdown = stage_shutdown;
    if (!st->o.idle_timeout_s)
        st->o.idle_timeout_s = 300;
    int rc = ring_manifest_load(&st->m, o->manifest, err, sizeof err);
    if (rc < 0) {
        kvd_log(KVD_LOG_ERROR, "%s", err);
        free(st);
        return rc;
    }
    st->n = st->m.n_ranks;
    bool own_ok = o->is_standby ? o->standby < st->m.n_standbys : o->rank >= 0 && (uint32_t)o->rank < st->n;
    char unpinned[400];
    unpinned_neighbours(&st->m, o, unpinned, own_ok ? sizeof unpinned : 0);
    if (own_ok && unpinned[0] && !o->allow_unpinned) {
        kvd_log(KVD_LOG_ERROR, "%s names no node key for %s: whoever answers first (a relay, anyone "
                "on the path) could link as %s and read or rewrite what the ring computes. Name the "
                "keys (\"node\": `kvd stage --print-key --state-dir DIR` on each host, or `kvctl "
                "profile --state-dir DIR` for `kvctl plan`), or pass --allow-unpinned to link anyway",
                o->manifest, unpinned, strchr(unpinned, ',') ? "them" : "it");
        free(st);
        return -EPERM;
    }
    if (own_ok && unpinned[0])
        kvd_log(KVD_LOG_WARN, "--allow-unpinned: %s names no node key for %s; linking to whichever "
                "node answers for %s", o->manifest, unpinned, strchr(unpinned, ',') ? "them" : "it");
    if (kvd_api_check(o) < 0) {
        free(st);
        return -EINVAL;
    }
    st->standby.index = -1;
    st->status.last_repair_rank = -1;
    st->start_ms = (uint64_t)util_now_ms();
    st->take_rank = stage_take_rank;
    st->pull_window = stage_pull_window;
    st->sessions.blog_cap = o->boundary_log_set ? o->boundary_log_bytes : KVD_BOUNDARY_LOG_DEFAULT;
    st->sessions.blog_total_cap = o->boundary_log_total ? o->boundary_log_total
                                                        : KVD_BOUNDARY_LOG_TOTAL_DEFAULT;
    /* Repairs are awaited where the manifest names standbys, unless told otherwise: elsewhere
     * a broken ring ends its sessions at once, as a client without a standby would want. */
    st->repair.wait_ms = (o->repair_wait_set ? o->repair_wait_s :
                          st->m.n_standbys || o->roster ? 30 : 0) * 1000;
    st->loop = uv_default_loop();
    const char *state_dir = o->state_dir ? o->state_dir : ".";
    rc = net_identity_load(&st->id, state_dir, err, sizeof err);
    if (rc < 0) {
        kvd_log(KVD_LOG_ERROR, "node key: %s", err);
        goto fail;
    }
    if (o->roster && (rc = roster_read(st, true)) < 0)
        goto fail;
    const char *own_ep;
    if (o->is_standby) {
        char prefix[64];
        snprintf(prefix, sizeof prefix, "standby %u/%u", o->standby, st->n);
        kvd_log_set_prefix(prefix);
        rc = -EINVAL;
        uint32_t sbi = o->standby;
        if (o->standby_by_key) {   /* the roster's entry for this node's key */
            sbi = RING_MAX_STANDBYS;
            for (uint32_t i = 0; i < st->m.n_standbys; i++)
                if (!memcmp(st->m.standbys[i].node, net_identity_pub(st->id), 32))
                    sbi = i;
            if (sbi == RING_MAX_STANDBYS) {
                kvd_log(KVD_LOG_ERROR, "no standby entry for this node's key in the manifest or "
                        "roster %s", o->roster ? o->roster : "(none)");
                goto fail;
            }
            st->o.standby = sbi;
        }
        if (sbi >= st->m.n_standbys) {
            kvd_log(KVD_LOG_ERROR, "--standby %u not in the manifest's standby entries [0, %u)", o->standby,
                    st->m.n_standbys);
            goto fail;
        }
        uint64_t rk = st->m.standbys[sbi].ranks;
        if (o->window && (rk & (rk - 1))) {
            kvd_log(KVD_LOG_ERROR, "--window with --standby: the window file is one rank's, and "
                    "standby %u may serve several (ranks 0x%llx); give --model instead", sbi,
                    (unsigned long long)rk);
            goto fail;
        }
        if (memcmp(st->m.standbys[sbi].node, net_identity_pub(st->id), 32) != 0) {
            kvd_log(KVD_LOG_ERROR, "this node's key (%s/node.key) is not the one the manifest names for "
                    "standby %u", state_dir, sbi);
            rc = -EPERM;
            goto fail;
        }
        st->standby.index = (int)sbi;
        st->standby.waiting = true;
        own_ep = st->m.standbys[sbi].endpoint;
    } else {
        if (o->rank < 0 || (uint32_t)o->rank >= st->m.n_ranks) {
            kvd_log(KVD_LOG_ERROR, "--rank %d not in the manifest's ranks [0, %u)", o->rank, st->m.n_ranks);
            rc = -EINVAL;
            goto fail;
        }
        if ((rc = stage_take_rank(st, (uint32_t)o->rank)) < 0)
            goto fail;
        own_ep = st->m.ranks[st->rank].endpoint;
    }
    char listen[300];
    net_relay_transport_register();
    bool via_relay = net_relay_endpoint(own_ep) && !o->listen;
    uv_timer_init(st->loop, &st->links.redial_in);
    st->links.redial_in.data = st;
    if (via_relay)
        snprintf(listen, sizeof listen, "nothing (in-link through the relay %s)", own_ep);
    else if (o->listen)
        snprintf(listen, sizeof listen, "%s", o->listen);
    else if (endpoint_hostport(own_ep, listen, sizeof listen) < 0) {
        kvd_log(KVD_LOG_ERROR, "endpoint %s is not tcp:// or relay://: pass --listen", own_ep);
        rc = -EINVAL;
        goto fail_loop;
    }
    if (!via_relay) {
        rc = ring_listener_new(&st->io.ls, st->loop, listen, &kvd_link_cbs, kvd_link_on_accept, st,
                              HS_MAX_PAYLOAD, err, sizeof err);
        if (rc < 0) {
            if (o->listen)
                kvd_log(KVD_LOG_ERROR, "%s", err);
            else  /* the address came from the manifest: say how to bind another */
                kvd_log(KVD_LOG_ERROR, "%s (the manifest's endpoint for rank %u; pass --listen HOST:PORT, "
                        "e.g. 0.0.0.0:PORT, to listen on another address)", err, o->rank);
            goto fail_loop;
        }
    }
    /* Control socket. */
    snprintf(st->io.sock_path, sizeof st->io.sock_path, "%s/kvd.sock", state_dir);
    unlink(st->io.sock_path);
    uv_pipe_init(st->loop, &st->io.ctl, 0);
    st->io.ctl.data = st;
    st->io.ctl_open = true;
    rc = uv_pipe_bind(&st->io.ctl, st->io.sock_path);
    if (rc == 0 && chmod(st->io.sock_path, 0600) < 0)   /* the control socket is the owner's */
        rc = -errno;
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&st->io.ctl, 16, kvd_ctl_on_conn);
    if (rc < 0) {
        kvd_log(KVD_LOG_ERROR, "control socket %s: %s", st->io.sock_path, uv_strerror(rc));
        goto fail_loop;
    }
    uv_timer_init(st->loop, &st->tick.timer);
    uv_timer_init(st->loop, &st->links.redial);
    uv_timer_init(st->loop, &st->repair.timer);
    st->repair.timer_open = true;
    st->tick.timer.data = st->links.redial.data = st->repair.timer.data = st;
    uv_timer_start(&st->tick.timer, tick_cb, TICK_MS, TICK_MS);
    if (o->seed_listen && kvd_backend_gguf(&st->be)) { /* roles combine: this stage also seeds what it holds */
        char id[65];
        err[0] = 0;
        rc = net_http_server_new(&st->io.http, st->loop, NULL);
        if (!rc)
            rc = seed_server_new(&st->io.seeder, st->io.http);
        if (!rc)
            rc = seed_server_add(st->io.seeder, o->window ? o->window : o->model, o->catalog, id, err,
                                sizeof err);
        if (!rc)
            rc = net_http_server_listen(st->io.http, o->seed_listen);
        if (rc) {
            kvd_log(KVD_LOG_ERROR, "seeder on %s: %s", o->seed_listen, err[0] ? err : uv_strerror(rc));
            if (st->io.http)
                net_http_server_close(st->io.http, NULL, NULL);
            st->io.http = NULL;
            goto fail_loop;
        }
        kvd_log(KVD_LOG_INFO, "seeding %s (model %.16s...) on %s (port %d)",
                o->window ? o->window : o->model, id, o->seed_listen, net_http_server_port(st->io.http));
    }
    if ((rc = kvd_api_start(st)) < 0) {
        if (st->io.http)
            net_http_server_close(st->io.http, NULL, NULL);
        st->io.http = NULL;
        goto fail_loop;
    }
    uv_signal_init(st->loop, &st->io.sigterm);
    uv_signal_init(st->loop, &st->io.sigint);
    uv_signal_init(st->loop, &st->io.sighup);
    st->io.sigterm.data = st->io.sigint.data = st->io.sighup.data = st;
    uv_signal_start(&st->io.sigterm, on_signal, SIGTERM);
    uv_signal_start(&st->io.sigint, on_signal, SIGINT);
    uv_signal_start(&st->io.sighup, on_signal, SIGHUP);
    signal(SIGPIPE, SIG_IGN);
    char key[65];
    util_hex_encode(net_identity_pub(st->id), 32, key);
    if (st->standby.waiting) {
        kvd_log(KVD_LOG_INFO, "ring %s: standby %u of %u for ranks 0x%llx, listening on %s (port %d), node "
                "%.16s..., control %s", st->m.ring, st->standby.index, st->m.n_standbys,
                (unsigned long long)st->m.standbys[st->standby.index].ranks, listen,
                st->io.ls ? ring_listener_port(st->io.ls) : 0, key, st->io.sock_path);
        char status[160];
        snprintf(status, sizeof status, "standby %u of %u", st->standby.index, st->m.n_standbys);
        kvd_service_ready(status);
    } else {
        const struct ring_rank_info *me = &st->m.ranks[st->rank];
        kvd_log(KVD_LOG_INFO, "ring %s: rank %u of %u, layers [%u, %u)%s%s, listening on %s (port %d), node %.16s..., "
                "wire %s, control %s", st->m.ring, st->rank, st->n, me->first, me->last, me->embed ? " +embed" : "",
                me->head ? " +head" : "", listen, st->io.ls ? ring_listener_port(st->io.ls) : 0, key,
                st->m.dtype, st->io.sock_path);
        char status[160];
        snprintf(status, sizeof status, "rank %u of %u, layers [%u, %u)", st->rank, st->n, me->first, me->last);
        kvd_service_ready(status);
        if (st->repair.wait_ms && st->rank == 0)
            kvd_log(KVD_LOG_INFO, "a broken ring pauses sessions for up to %u s waiting for its repair",
                    st->repair.wait_ms / 1000);
        kvd_link_dial_out(st);
    }
    if (via_relay)
        kvd_link_dial_in(st);
    uv_run(st->loop, UV_RUN_DEFAULT);
    rc = 0;
    goto done;
fail_loop:
    st->shutting_down = true;
    if (st->io.ls)
        ring_listener_close(st->io.ls, NULL, NULL);
    if (st->io.ctl_open)
        uv_close((uv_handle_t *)&st->io.ctl, NULL);
    kvd_compute_stop(st->comp, on_compute_closed, st);
    st->comp = NULL;
    uv_walk(st->loop, close_walk, NULL);
    uv_run(st->loop, UV_RUN_DEFAULT);
done:
    uv_loop_close(st->loop);
    seed_server_free(st->io.seeder);
fail:
    if (st->be_open)
        kvd_backend_close(&st->be);
    net_identity_free(st->id);
    kvd_log(rc < 0 ? KVD_LOG_ERROR : KVD_LOG_INFO, "stopped%s", rc < 0 ? " (start failed)" : "");
    free(st);
    return rc;
}

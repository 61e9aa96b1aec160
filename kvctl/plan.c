/* kvctl/plan.c — `kvctl plan`: the I/O around the pure planner. Read a model shape (kvctl/shape.c:
 * a GGUF or mini-GGUF header, a catalog, or a JSON shape descriptor) and device profiles
 * (docs/design.md, "The rank manifest"), plan, print a table and write the rank manifest. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <openssl/rand.h>

#include "gguf/gguf.h"
#include "kvctl/internal.h"
#include "net/net.h"
#include "planner/plan.h"
#include "ring/ring.h"
#include "util/err.h"
#include "util/util.h"

#define DEVICES_MAX_BYTES (64u << 20)
#define MAX_DEVICE_FILES 64
#define RING_MAX_RANKS 64 /* what a stage accepts (RING_MAX_RANKS) */

/* ------------------------------------------------------------------ helpers */

static void hex_random(char *out, size_t nbytes)
{
    unsigned char b[32];
    if (nbytes > sizeof b) nbytes = sizeof b;
    if (RAND_bytes(b, (int)nbytes) != 1) {
        /* OpenSSL's generator failing is not recoverable here; fall back to urandom */
        FILE *f = fopen("/dev/urandom", "rb");
        if (!f || fread(b, 1, nbytes, f) != nbytes) memset(b, 0, nbytes);
        if (f) fclose(f);
    }
    for (size_t i = 0; i < nbytes; i++) sprintf(out + 2 * i, "%02x", b[i]);
    out[2 * nbytes] = 0;
}

/* ------------------------------------------------------------------ devices */

/* A profile's "backends": the kernel devices one machine offers (its CPU, an OpenCL GPU),
 * each with its own memory and speed; the planner picks one per machine (devset_choose). */
#define DEV_BACKENDS_MAX 8
struct devopt {
    size_t dev;                   /* the device (machine) it belongs to */
    struct plan_device d;         /* its figures; link fields are the machine's */
    char backend[32];
};

struct devset {
    struct plan_device *d;
    size_t n, cap;
    char **ids, **backends, **endpoints, **nodes; /* owned strings, per device */
    struct devopt *opt;
    size_t n_opt;
};

static void devset_free(struct devset *s)
{
    for (size_t i = 0; i < s->n; i++) {
        free(s->ids[i]); free(s->backends[i]); free(s->endpoints[i]); free(s->nodes[i]);
    }
    free(s->d); free(s->ids); free(s->backends); free(s->endpoints); free(s->nodes);
    free(s->opt);
}

/* A device's memory and speed figures from object o (ctx names it in messages). */
static int dev_figures(const cJSON *o, struct plan_device *d, const char *ctx, char *err, size_t errlen)
{
    int rc;
    if ((rc = kvctl__json_u64(o, "mem_bytes", true, &d->mem_bytes, ctx, err, errlen)) < 0 ||
        (rc = kvctl__json_u64(o, "max_alloc_bytes", false, &d->max_alloc_bytes, ctx, err, errlen)) < 0 ||
        (rc = util_json_number_in(o, "ms_per_layer_token", 0, 1e9, false, &d->ms_per_layer_token, ctx, err,
                                  errlen)) < 0 ||
        (rc = util_json_number_in(o, "flops", 0, 1e20, false, &d->flops, ctx, err, errlen)) < 0 ||
        (rc = util_json_number_in(o, "mem_bw_bytes_s", 0, 1e16, false, &d->mem_bw_bytes_s, ctx, err, errlen)) < 0)
        return rc;
    return 0;
}

/* The "backends" of device s->d[s->n] (about to be added), if any: each an object with a
 * "backend" name and its own figures. */
static int devset_add_backends(struct devset *s, const cJSON *o, const struct plan_device *base,
                               const char *ctx, char *err, size_t errlen)
{
    const cJSON *bs = cJSON_GetObjectItemCaseSensitive(o, "backends");
    if (!bs)
        return 0;
    int nb = cJSON_GetArraySize(bs);
    if (!cJSON_IsArray(bs) || nb < 1 || nb > DEV_BACKENDS_MAX) {
        snprintf(err, errlen, "%s: 'backends' must be an array of 1 to %d objects", ctx, DEV_BACKENDS_MAX);
        return -EINVAL;
    }
    struct devopt *no = realloc(s->opt, (s->n_opt + (size_t)nb) * sizeof *no);
    if (!no) { snprintf(err, errlen, "out of memory"); return -ENOMEM; }
    s->opt = no;
    const cJSON *b;
    cJSON_ArrayForEach(b, bs) {
        struct devopt *x = &s->opt[s->n_opt];
        *x = (struct devopt){.dev = s->n, .d = *base};
        x->d.ms_per_layer_token = x->d.flops = x->d.mem_bw_bytes_s = 0;
        x->d.max_alloc_bytes = 0;
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(b, "backend");
        if (!cJSON_IsObject(b) || !cJSON_IsString(name) || !name->valuestring[0] ||
            strlen(name->valuestring) >= sizeof x->backend) {
            snprintf(err, errlen, "%s: each of 'backends' needs a 'backend' name of at most %zu bytes", ctx,
                     sizeof x->backend - 1);
            return -EINVAL;
        }
        snprintf(x->backend, sizeof x->backend, "%s", name->valuestring);
        char c3[260];
        snprintf(c3, sizeof c3, "%s backend %s", ctx, x->backend);
        int rc = dev_figures(b, &x->d, c3, err, errlen);
        if (rc < 0)
            return rc;
        s->n_opt++;
    }
    return 0;
}

/* Each machine with "backends": the one the planner places its windows on for this model
 * (plan_device_choose), its figures and name in place of the profile's own. */
static int devset_choose(struct devset *s, const struct plan_shape *shape, const struct plan_opts *o,
                         char *err, size_t errlen)
{
    for (size_t i = 0; i < s->n; i++) {
        struct plan_device opts[DEV_BACKENDS_MAX];
        const char *names[DEV_BACKENDS_MAX];
        size_t n = 0;
        for (size_t k = 0; k < s->n_opt; k++)
            if (s->opt[k].dev == i && n < DEV_BACKENDS_MAX) {
                opts[n] = s->opt[k].d;
                names[n++] = s->opt[k].backend;
            }
        if (!n)
            continue;
        int c = plan_device_choose(opts, n, shape, o, NULL);
        if (c < 0)
            continue;   /* none holds a layer: the profile's own figures stand (and say so) */
        char *b = strdup(names[c]);
        if (!b) { snprintf(err, errlen, "out of memory"); return -ENOMEM; }
        free(s->backends[i]);
        s->backends[i] = b;
        s->d[i].backend = b;
        s->d[i].mem_bytes = opts[c].mem_bytes;
        s->d[i].ms_per_layer_token = opts[c].ms_per_layer_token;
        s->d[i].flops = opts[c].flops;
        s->d[i].mem_bw_bytes_s = opts[c].mem_bw_bytes_s;
        s->d[i].max_alloc_bytes = opts[c].max_alloc_bytes;
    }
    return 0;
}

static int devset_add(struct devset *s, const cJSON *o, const char *ctx, char *err, size_t errlen)
{
    if (s->n >= PLAN_MAX_DEVICES) {
        snprintf(err, errlen, "%s: more than %u devices", ctx, PLAN_MAX_DEVICES);
        return -EINVAL;
    }
    if (!cJSON_IsObject(o)) { snprintf(err, errlen, "%s: a device must be an object", ctx); return -EINVAL; }
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 16;
        struct plan_device *d = realloc(s->d, nc * sizeof *d);
        if (d) s->d = d;
        char **a = realloc(s->ids, nc * sizeof *a);
        if (a) s->ids = a;
        char **b = realloc(s->backends, nc * sizeof *b);
        if (b) s->backends = b;
        char **c = realloc(s->endpoints, nc * sizeof *c);
        if (c) s->endpoints = c;
        char **e = realloc(s->nodes, nc * sizeof *e);
        if (e) s->nodes = e;
        if (!d || !a || !b || !c || !e) { snprintf(err, errlen, "out of memory"); return -ENOMEM; }
        s->cap = nc;
    }
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(o, "id");
    if (!cJSON_IsString(id) || !id->valuestring[0] || strlen(id->valuestring) > 128) {
        snprintf(err, errlen, "%s: 'id' must be a non-empty string of at most 128 bytes", ctx);
        return -EINVAL;
    }
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->ids[i], id->valuestring)) {
            snprintf(err, errlen, "%s: device id '%s' appears twice", ctx, id->valuestring);
            return -EINVAL;
        }
    char c2[200];
    snprintf(c2, sizeof c2, "%s (%s)", ctx, id->valuestring);
    struct plan_device d = {.inbound = true};
    int rc;
    if ((rc = dev_figures(o, &d, c2, err, errlen)) < 0 ||
        (rc = util_json_number_in(o, "rtt_ms", 0, 1e6, false, &d.rtt_ms, c2, err, errlen)) < 0 ||
        (rc = util_json_number_in(o, "bw_bytes_s", 0, 1e15, false, &d.bw_bytes_s, c2, err, errlen)) < 0)
        return rc;
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(o, "inbound");
    if (in && !cJSON_IsBool(in)) { snprintf(err, errlen, "%s: 'inbound' must be true or false", c2); return -EINVAL; }
    if (in) d.inbound = cJSON_IsTrue(in);
    char backend[32] = "cpu", endpoint[256] = "", node[80] = "";
    kvctl__json_str(o, "backend", backend, sizeof backend);
    kvctl__json_str(o, "endpoint", endpoint, sizeof endpoint);
    kvctl__json_str(o, "node", node, sizeof node);
    if (endpoint[0] && !strstr(endpoint, "://")) {
        snprintf(err, errlen, "%s: endpoint '%s' is not scheme://address", c2, endpoint);
        return -EINVAL;
    }
    uint8_t key[32];
    if (node[0] && (strlen(node) != 64 || util_hex_decode(node, key, 32) != 0)) {
        snprintf(err, errlen, "%s: node must be 64 hex digits (an Ed25519 key)", c2);
        return -EINVAL;
    }
    if ((rc = devset_add_backends(s, o, &d, c2, err, errlen)) < 0)
        return rc;
    s->ids[s->n] = strdup(id->valuestring);
    s->backends[s->n] = strdup(backend);
    s->endpoints[s->n] = strdup(endpoint);
    s->nodes[s->n] = strdup(node);
    if (!s->ids[s->n] || !s->backends[s->n] || !s->endpoints[s->n] || !s->nodes[s->n]) {
        free(s->ids[s->n]); free(s->backends[s->n]); free(s->endpoints[s->n]); free(s->nodes[s->n]);
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    d.id = s->ids[s->n];
    d.backend = s->backends[s->n];
    s->d[s->n] = d;
    s->n++;
    return 0;
}

/* devices.json: {"devices": [...]}, a bare array, or one device object. */
static int load_devices(struct devset *s, const char *path, char *err, size_t errlen)
{
    size_t len;
    char *text;
    if (util_file_read(path, DEVICES_MAX_BYTES, &text, &len, err, errlen) < 0) return -EINVAL;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    int rc = 0;
    const cJSON *arr = root;
    if (cJSON_IsObject(root)) {
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(root, "devices");
        if (d) arr = d;
        else {
            rc = devset_add(s, root, path, err, errlen);
            goto out;
        }
    }
    if (!cJSON_IsArray(arr)) {
        snprintf(err, errlen, "%s: expected {\"devices\": [...]}, an array of devices or one device", path);
        rc = -EINVAL;
        goto out;
    }
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
        char ctx[300];
        snprintf(ctx, sizeof ctx, "%s: devices[%d]", path, i++);
        if ((rc = devset_add(s, e, ctx, err, errlen)) < 0) goto out;
    }
out:
    cJSON_Delete(root);
    return rc;
}

/* ------------------------------------------------------------------ model identity */

/* The manifest's model name and catalog id, so that a planned manifest runs unedited (a
 * stage started with --catalog checks the id). --model and --catalog together: the shape
 * from the GGUF, the id from the catalog, and the GGUF's header must be the catalog's.
 * --model alone: a full GGUF is hashed into its catalog for the id; a stage window or a
 * shape descriptor cannot give one, which is said. --catalog alone: the name is --name or
 * ARCH-ID12, since a catalog keeps digests of the metadata, not its values. */
static int model_identity(struct kvctl_model *m, const char *model, const char *catalog, const char *name,
                          char *err, size_t errlen)
{
    int rc;
    if (model && catalog) {
        if ((rc = gguf_catalog_load(&m->cat, catalog, m->catalog, err, errlen)) < 0) return rc;
        if (m->gf && (rc = gguf_catalog_verify_metadata(m->cat, m->gf, err, errlen)) < 0) {
            char why[KV_ERR_MAX];
            snprintf(why, sizeof why, "%s", err);
            snprintf(err, errlen, "%s is not the model of catalog %s: %.600s", model, catalog, why);
            return rc;
        }
        if (strcmp(m->arch, m->cat->arch) != 0 || m->pm.n_blocks != m->cat->n_layers) {
            snprintf(err, errlen, "%s (%s, %u layers) is not the model of catalog %s (%s, %u layers)", model,
                     m->arch, m->pm.n_blocks, catalog, m->cat->arch, m->cat->n_layers);
            return -EINVAL;
        }
    } else if (model && m->gf) {
        uint32_t wf, wl;
        if (gguf_window_get(m->gf, &wf, &wl) == 0) {
            fprintf(stderr, "kvctl plan: note: %s is a stage window; its model's catalog id is not known, so "
                    "the manifest has none (pass --catalog CAT to name it)\n", model);
        } else {
            fprintf(stderr, "kvctl plan: hashing %s for its catalog id (pass --catalog CAT to skip)\n", model);
            struct gguf_catalog *c;
            if ((rc = gguf_catalog_build(&c, m->gf, err, errlen)) < 0) return rc;
            char *js = NULL;
            size_t len;
            rc = gguf_catalog_to_json(c, &js, &len, m->catalog);
            free(js);
            gguf_catalog_free(c);
            if (rc < 0) { snprintf(err, errlen, "%s: catalog: %s", model, strerror(-rc)); return rc; }
        }
    } else if (model) {
        fprintf(stderr, "kvctl plan: note: %s is a shape descriptor: the manifest names no catalog id "
                "(pass --catalog CAT to name it)\n", model);
    }
    if (name)
        snprintf(m->name, sizeof m->name, "%s", name);
    else if (!m->name[0] && m->catalog[0])
        snprintf(m->name, sizeof m->name, "%s-%.12s", m->arch, m->catalog);
    return 0;
}

/* ------------------------------------------------------------------ plan */

static void plan_usage(FILE *o)
{
    fprintf(o,
        "usage: kvctl plan (--model FILE [--catalog CAT] | --catalog CAT) --devices devices.json [options]\n"
        "Plan a ring: cut the model's layers into windows over the devices and write the rank\n"
        "manifest (docs/design.md, \"The rank manifest\"), printing a table of the plan.\n"
        "  --model FILE         a GGUF or stage mini-GGUF (header only), or a JSON shape\n"
        "                       descriptor (docs/planner.md)\n"
        "  --catalog CAT        a catalog (kvctl catalog); MoE models need --experts-used N.\n"
        "                       The manifest names the model by catalog id: with --model alone\n"
        "                       a full GGUF is hashed for it; with both, the GGUF's header must\n"
        "                       match the catalog and the shape comes from the GGUF\n"
        "  --name NAME          the model's name in the manifest (default: general.name of the\n"
        "                       GGUF; with a catalog alone, ARCH-ID where ID is 12 hex digits)\n"
        "  --experts-used N     experts a token uses (catalogs only)\n"
        "  --nextn N            trailing MTP blocks (catalogs; default: the catalog's count)\n"
        "  --no-mtp             leave the model's MTP blocks out: the last rank will not draft\n"
        "                       with them (default: it holds them, their K/V and, unless it is\n"
        "                       rank 0 or the head is token_embd, a token_embd of its own)\n"
        "  --devices FILE       device profiles; repeat to merge several files\n"
        "  --objective O        latency (one session, default) or throughput (many sessions)\n"
        "  --ctx N              context tokens reserved per session (default 4096)\n"
        "  --sessions K         sessions reserved for and estimated (default 4)\n"
        "  --draft-max K        sessions draft K tokens a pass: recurrent windows keep a\n"
        "                       checkpoint of each session's state (default 0: no drafting)\n"
        "  --headroom F         fraction of each device's memory kept free (default 0.05)\n"
        "  --wire f32|f16       boundary dtype (default f32)\n"
        "  --kv-bytes N         bytes per cached K/V element (default 2, f16)\n"
        "  --relay HOST:PORT    relay for devices with \"inbound\": false (relay:// endpoints;\n"
        "                       ws://HOST:PORT for a plain relay: relay+ws://)\n"
        "  --max-ranks N        most ranks in the ring (default 64, what a stage accepts)\n"
        "  --allow-unpinned     write a manifest even where a device names no node key (its\n"
        "                       rank then admits whoever links first; the ranks are named)\n"
        "  -o FILE              write the manifest (default: print it only with --json)\n"
        "  --json               print the manifest on stdout instead of the table\n"
        "  --layers             also print the model's per-layer shape\n");
}

static const char *dev_endpoint(const struct devset *ds, uint32_t d, char *buf, size_t n)
{
    if (ds->endpoints[d][0]) return ds->endpoints[d];
    snprintf(buf, n, "tcp://%s:7100", ds->ids[d]);
    return buf;
}

/* src into a manifest field of n bytes: -EINVAL when it does not fit (cut, it would name
 * something else). */
static int field_set(char *dst, size_t n, const char *src, const char *what, char *err, size_t errlen)
{
    size_t len = strlen(src);
    if (len >= n) {
        snprintf(err, errlen, "%s '%s' is longer than a manifest takes (%zu bytes)", what, src, n - 1);
        return -EINVAL;
    }
    memcpy(dst, src, len + 1);
    return 0;
}

/* The manifest of the plan, with the planner's figures beside the ring's own fields: per rank
 * its device and estimates, and a "plan" object. */
static int manifest_json(cJSON **out, const struct kvctl_model *m, const struct devset *ds,
                         const struct plan_result *r, const struct plan_opts *o, const char *wire,
                         const char *relay, bool plain, char *err, size_t errlen)
{
    *out = NULL;
    if (r->n_ranks > RING_MAX_RANKS) {
        snprintf(err, errlen, "%u ranks (--max-ranks); a stage accepts manifests of at most %d", r->n_ranks,
                 RING_MAX_RANKS);
        return -EINVAL;
    }
    struct ring_manifest *man = calloc(1, sizeof *man);
    if (!man) { snprintf(err, errlen, "out of memory"); return -ENOMEM; }
    man->version = 1;
    man->stated = RING_STATED_N_CTX | RING_STATED_MAX_SESSIONS | RING_STATED_ESTIMATES;
    hex_random(man->ring, 16);
    snprintf(man->model_name, sizeof man->model_name, "%s", m->name);
    snprintf(man->catalog, sizeof man->catalog, "%s", m->catalog);
    man->n_layers = m->shape.n_layers;
    man->n_embd = m->shape.n_embd;
    man->n_ctx = o->ctx < 8 ? 8 : o->ctx;
    man->max_sessions = o->sessions;
    man->n_ranks = r->n_ranks;
    int rc = field_set(man->arch, sizeof man->arch, m->arch, "arch", err, errlen);
    if (rc == 0) rc = field_set(man->dtype, sizeof man->dtype, wire, "wire dtype", err, errlen);
    for (uint32_t i = 0; rc == 0 && i < r->n_ranks; i++) {
        const struct plan_rank *k = &r->ranks[i];
        struct ring_rank_info *ri = &man->ranks[i];
        char ep[300], tmp[300], what[64];
        ri->rank = i;
        ri->first = k->first;
        ri->last = k->last;
        ri->embed = k->embed;
        ri->head = k->head;
        ri->mem_bytes = k->mem_bytes;
        ri->est_ms_per_token = k->est_ms_per_token;
        ri->has_node = ds->nodes[k->device][0] != 0;
        if (ri->has_node) util_hex_decode(ds->nodes[k->device], ri->node, 32);   /* checked by devset_add */
        if (k->relay && relay) {
            char bridge[33];
            hex_random(bridge, 16);
            snprintf(ep, sizeof ep, "%s://%s/b/%s", plain ? "relay+ws" : "relay", relay, bridge);
        } else {
            snprintf(ep, sizeof ep, "%s", dev_endpoint(ds, k->device, tmp, sizeof tmp));
        }
        snprintf(what, sizeof what, "rank %u: backend", i);
        rc = field_set(ri->backend, sizeof ri->backend, ds->backends[k->device], what, err, errlen);
        snprintf(what, sizeof what, "rank %u: endpoint", i);
        if (rc == 0) rc = field_set(ri->endpoint, sizeof ri->endpoint, ep, what, err, errlen);
    }
    cJSON *root = NULL;
    if (rc == 0) rc = ring_manifest_to_json(&root, man, err, errlen);
    free(man);
    if (rc < 0) return rc;
    cJSON *jr = cJSON_GetObjectItemCaseSensitive(root, "ranks");
    for (uint32_t i = 0; i < r->n_ranks; i++) {
        const struct plan_rank *k = &r->ranks[i];
        cJSON *x = cJSON_GetArrayItem(jr, (int)i);
        cJSON_AddStringToObject(x, "device", ds->ids[k->device]);
        cJSON_AddNumberToObject(x, "mem_avail_bytes", (double)k->mem_avail_bytes);
        cJSON_AddNumberToObject(x, "expert_bytes", (double)k->expert_bytes);
        cJSON_AddNumberToObject(x, "active_bytes_per_token", (double)k->active_bytes);
        cJSON_AddNumberToObject(x, "compute_ms", k->compute_ms);
        cJSON_AddNumberToObject(x, "link_ms", k->link_ms);
        if (k->mtp_blocks) {   /* the blocks after the main pass [n_layers, n_layers + mtp_blocks) */
            cJSON_AddNumberToObject(x, "mtp_blocks", k->mtp_blocks);
            cJSON_AddNumberToObject(x, "mtp_mem_bytes", (double)k->mtp_mem_bytes);
        }
    }
    cJSON *jp = cJSON_AddObjectToObject(root, "plan");
    cJSON_AddStringToObject(jp, "objective", o->objective == PLAN_THROUGHPUT ? "throughput" : "latency");
    cJSON_AddNumberToObject(jp, "ctx", o->ctx);
    cJSON_AddNumberToObject(jp, "sessions", o->sessions);
    cJSON_AddNumberToObject(jp, "draft_max", o->draft_max);
    cJSON_AddNumberToObject(jp, "mtp_blocks", m->shape.mtp_blocks);
    cJSON_AddBoolToObject(jp, "mtp_placed", m->shape.mtp_blocks && !o->no_mtp);
    cJSON_AddNumberToObject(jp, "headroom", o->headroom);
    cJSON_AddNumberToObject(jp, "est_ms_per_token", r->ms_per_token);
    cJSON_AddNumberToObject(jp, "period_ms", r->period_ms);
    cJSON_AddNumberToObject(jp, "tokens_per_s_1", r->tokens_per_s_1);
    cJSON_AddNumberToObject(jp, "tokens_per_s_k", r->tokens_per_s_k);
    cJSON_AddNumberToObject(jp, "k", r->k);
    cJSON_AddBoolToObject(jp, "exhaustive", r->exhaustive);
    cJSON *je = cJSON_AddArrayToObject(jp, "excluded");
    for (uint32_t i = 0; i < r->n_excluded; i++) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "device", ds->ids[r->excluded[i].device]);
        cJSON_AddStringToObject(x, "reason", r->excluded[i].reason);
        cJSON_AddItemToArray(je, x);
    }
    *out = root;
    return 0;
}

static void print_table(FILE *out, const struct kvctl_model *m, const struct devset *ds,
                        const struct plan_result *r, const struct plan_opts *o)
{
    char a[32], b[32];
    double total = 0, experts = 0;
    for (uint32_t i = 0; i < m->shape.n_layers; i++) {
        total += (double)m->shape.layers[i].weight_bytes;
        experts += (double)m->shape.layers[i].expert_bytes;
    }
    total += (double)m->shape.embed_bytes + (double)m->shape.head_bytes;
    util_fmt_bytes(a, sizeof a, total, 2, UTIL_FMT_SI);
    util_fmt_bytes(b, sizeof b, experts, 2, UTIL_FMT_SI);
    fprintf(out, "model %s (%s, %s): %u layers, n_embd %u, %s of weights", m->name[0] ? m->name : "?",
            m->arch, m->kind, m->shape.n_layers, m->shape.n_embd, a);
    if (experts > 0) fprintf(out, " (%s routed experts)", b);
    uint32_t nm = m->shape.mtp_blocks;
    if (nm) {
        const struct plan_rank *last = &r->ranks[r->n_ranks - 1];
        util_fmt_bytes(a, sizeof a, (double)m->shape.mtp.weight_bytes, 2, UTIL_FMT_SI);
        fprintf(out, "\n+ %u MTP block%s ([%u, %u), %s) ", nm, nm > 1 ? "s" : "", m->shape.n_layers,
                m->shape.n_layers + nm, a);
        if (o->no_mtp) {
            fprintf(out, "left out (--no-mtp): the last rank neither loads nor drafts with %s",
                    nm > 1 ? "them" : "it");
        } else {
            util_fmt_bytes(b, sizeof b, (double)last->mtp_mem_bytes, 2, UTIL_FMT_SI);
            fprintf(out, "placed on rank %u with the head (drafting): %s there with %s K/V", r->n_ranks - 1, b,
                    nm > 1 ? "their" : "its");
            if (!last->embed && m->shape.mtp_embed_bytes) {
                util_fmt_bytes(a, sizeof a, (double)m->shape.mtp_embed_bytes, 2, UTIL_FMT_SI);
                fprintf(out, " and a token_embd of its own (%s)", a);
            }
        }
    }
    fprintf(out, "\nobjective %s, ctx %u x %u sessions, headroom %.0f%%, %zu devices, %s search\n\n",
            o->objective == PLAN_THROUGHPUT ? "throughput" : "latency", o->ctx, o->sessions,
            o->headroom * 100, ds->n, r->exhaustive ? "exhaustive (optimal)" : "heuristic");
    fprintf(out, "%-4s %-16s %-8s %-10s %-24s %10s %10s %9s %s\n", "rank", "device", "backend", "layers",
            "memory used / avail", "compute", "link", "ms/token", "");
    for (uint32_t i = 0; i < r->n_ranks; i++) {
        const struct plan_rank *k = &r->ranks[i];
        char lay[32], mem[72];
        snprintf(lay, sizeof lay, "[%u, %u)", k->first, k->last);
        util_fmt_bytes(a, sizeof a, (double)k->mem_bytes, 2, UTIL_FMT_SI);
        util_fmt_bytes(b, sizeof b, (double)k->mem_avail_bytes, 2, UTIL_FMT_SI);
        snprintf(mem, sizeof mem, "%s / %s", a, b);
        fprintf(out, "%-4u %-16.16s %-8.8s %-10s %-24s %10.2f %10.2f %9.2f %s%s%s%s\n", i, ds->ids[k->device],
                ds->backends[k->device], lay, mem, k->compute_ms, k->link_ms, k->est_ms_per_token,
                k->embed ? "embed " : "", k->head ? "head " : "", k->mtp_blocks ? "mtp " : "",
                k->relay ? "relay" : "");
    }
    fprintf(out, "\nestimate: %.1f ms/token for one session (%.2f tokens/s); period %.1f ms, "
            "%.2f tokens/s with %u sessions\n", r->ms_per_token, r->tokens_per_s_1, r->period_ms,
            r->tokens_per_s_k, r->k);
    if (r->n_excluded) {
        fprintf(out, "left out:\n");
        for (uint32_t i = 0; i < r->n_excluded; i++)
            fprintf(out, "  %s\n", r->excluded[i].reason);
    }
}

/* Per-layer shape, runs of equal layers folded into one line (the MTP blocks last). */
static void print_layers(FILE *out, const struct plan_shape *s, const struct plan_opts *o)
{
    uint32_t mtp = s->mtp_blocks;
    char a[32], b[32], c[32], d[32], e[32];
    fprintf(out, "%-10s %11s %11s %13s %11s %11s %12s\n", "layers", "weights", "experts", "read/token",
            "KV/token", "state", "reserved");
    for (uint32_t i = 0; i < s->n_layers + mtp;) {
        const struct plan_layer *l = &s->layers[i];
        uint32_t j = i + 1;
        while (j < s->n_layers + mtp && (j < s->n_layers) == (i < s->n_layers) &&
               !memcmp(&s->layers[j], l, sizeof *l)) j++;
        char lay[32];
        if (j - i == 1) snprintf(lay, sizeof lay, "%u", i);
        else snprintf(lay, sizeof lay, "[%u, %u)", i, j);
        util_fmt_bytes(a, sizeof a, (double)l->weight_bytes, 2, UTIL_FMT_SI);
        util_fmt_bytes(b, sizeof b, (double)l->expert_bytes, 2, UTIL_FMT_SI);
        util_fmt_bytes(c, sizeof c, (double)l->active_bytes, 2, UTIL_FMT_SI);
        util_fmt_bytes(d, sizeof d, (double)l->kv_bytes_per_token, 2, UTIL_FMT_SI);
        util_fmt_bytes(e, sizeof e, (double)l->state_bytes, 2, UTIL_FMT_SI);
        char rs[32];
        util_fmt_bytes(rs, sizeof rs, (double)o->sessions * ((double)l->state_bytes + (double)l->kv_bytes_per_token * o->ctx), 2, UTIL_FMT_SI);
        fprintf(out, "%-9s %11s %11s %13s %11s %11s %12s%s\n", lay, a, b, c, d, e, rs,
                i < s->n_layers ? "" : o->no_mtp ? "  MTP: left out (--no-mtp)" : "  MTP: last rank (drafter)");
        i = j;
    }
    util_fmt_bytes(a, sizeof a, (double)s->embed_bytes, 2, UTIL_FMT_SI);
    util_fmt_bytes(b, sizeof b, (double)s->head_bytes, 2, UTIL_FMT_SI);
    util_fmt_bytes(c, sizeof c, (double)s->head_active_bytes, 2, UTIL_FMT_SI);
    fprintf(out, "embedding %s (rank 0); head %s, reads %s per token (last rank)", a, b, c);
    if (mtp && !o->no_mtp && s->mtp_embed_bytes) {
        util_fmt_bytes(a, sizeof a, (double)s->mtp_embed_bytes, 2, UTIL_FMT_SI);
        fprintf(out, "; the drafter's token_embd %s (last rank, unless rank 0)", a);
    }
    fprintf(out, "; wire %llu bytes per token\n(reserved = KV/state for ctx %u x %u sessions)\n\n",
            (unsigned long long)s->wire_bytes_per_token, o->ctx, o->sessions);
}

int kvctl_cmd_plan(int argc, char **argv)
{
    if (kvctl_is_help(argc, argv)) { plan_usage(stdout); return 0; }
    const char *model = NULL, *catalog = NULL, *outp = NULL, *relay = NULL, *wire = "f32";
    const char *name = NULL;
    const char *devfiles[MAX_DEVICE_FILES];
    int ndev = 0, nextn = -1;
    bool json = false, show_layers = false, relay_plain = false, allow_unpinned = false;
    struct plan_opts o;
    plan_opts_default(&o);
    o.max_ranks = RING_MAX_RANKS;
    double v;
    uint32_t used = 0, kvb = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has = i + 1 < argc;
        if (!strcmp(a, "--json")) { json = true; continue; }
        if (!strcmp(a, "--layers")) { show_layers = true; continue; }
        if (!strcmp(a, "--allow-unpinned")) { allow_unpinned = true; continue; }
        if (!strcmp(a, "--no-mtp")) { o.no_mtp = true; continue; }
        if (!has) { fprintf(stderr, "kvctl plan: %s needs a value (or is unknown)\n", a); plan_usage(stderr); return 2; }
        const char *val = argv[++i];
        if (!strcmp(a, "--model") || !strcmp(a, "-m")) model = val;
        else if (!strcmp(a, "--catalog")) catalog = val;
        else if (!strcmp(a, "--name")) {
            if (!val[0] || strlen(val) >= sizeof ((struct kvctl_model *)0)->name) {
                fprintf(stderr, "kvctl plan: --name must be 1-%zu bytes\n", sizeof ((struct kvctl_model *)0)->name - 1);
                return 2;
            }
            name = val;
        } else if (!strcmp(a, "--devices")) {
            if (ndev >= MAX_DEVICE_FILES) { fprintf(stderr, "kvctl plan: more than %d --devices files\n", MAX_DEVICE_FILES); return 2; }
            devfiles[ndev++] = val;
        } else if (!strcmp(a, "--objective")) {
            if (!strcmp(val, "latency")) o.objective = PLAN_LATENCY;
            else if (!strcmp(val, "throughput")) o.objective = PLAN_THROUGHPUT;
            else { fprintf(stderr, "kvctl plan: --objective '%s' is not latency or throughput\n", val); return 2; }
        } else if (!strcmp(a, "--ctx")) {
            if (kvctl_parse_num("plan", a, val, 0, 1u << 26, &v)) return 2;
            o.ctx = (uint32_t)v;
        } else if (!strcmp(a, "--sessions")) {
            if (kvctl_parse_num("plan", a, val, 1, 1u << 20, &v)) return 2;
            o.sessions = (uint32_t)v;
        } else if (!strcmp(a, "--draft-max")) {
            if (kvctl_parse_num("plan", a, val, 0, RING_DRAFTS_MAX, &v)) return 2;
            o.draft_max = (uint32_t)v;
        } else if (!strcmp(a, "--headroom")) {
            if (kvctl_parse_num("plan", a, val, 0, 0.95, &o.headroom)) return 2;
        } else if (!strcmp(a, "--max-ranks")) {
            if (kvctl_parse_num("plan", a, val, 1, 100000, &v)) return 2;
            o.max_ranks = (uint32_t)v;
        } else if (!strcmp(a, "--experts-used")) {
            if (kvctl_parse_num("plan", a, val, 1, 4096, &v)) return 2;
            used = (uint32_t)v;
        } else if (!strcmp(a, "--nextn")) {
            if (kvctl_parse_num("plan", a, val, 0, 16, &v)) return 2;
            nextn = (int)v;
        } else if (!strcmp(a, "--kv-bytes")) {
            if (kvctl_parse_num("plan", a, val, 1, 8, &v)) return 2;
            kvb = (uint32_t)v;
        } else if (!strcmp(a, "--wire")) {
            if (strcmp(val, "f32") && strcmp(val, "f16")) { fprintf(stderr, "kvctl plan: --wire '%s' is not f32 or f16\n", val); return 2; }
            wire = val;
        } else if (!strcmp(a, "--relay")) {
            /* HOST:PORT or wss://HOST:PORT (TLS, relay://); ws://HOST:PORT (plain, relay+ws://) */
            relay_plain = !strncmp(val, "ws://", 5);
            if (relay_plain) val += 5;
            else if (!strncmp(val, "wss://", 6)) val += 6;
            const char *colon = strrchr(val, ':');
            if (!colon || colon == val || !colon[1] || strlen(val) > 200 || strchr(val, '/')) {
                fprintf(stderr, "kvctl plan: --relay '%s' is not [ws://|wss://]HOST:PORT\n", argv[i]);
                return 2;
            }
            relay = val;
        } else if (!strcmp(a, "-o")) outp = val;
        else { fprintf(stderr, "kvctl plan: unknown option %s\n", a); plan_usage(stderr); return 2; }
    }
    if ((!model && !catalog) || ndev == 0) {
        fprintf(stderr, "kvctl plan: give --model and/or --catalog, and --devices\n");
        plan_usage(stderr);
        return 2;
    }
    struct kvctl_model m;
    memset(&m, 0, sizeof m);
    m.kv_bytes = kvb;
    m.wire_bytes = !strcmp(wire, "f16") ? 2 : 4;
    struct devset ds;
    memset(&ds, 0, sizeof ds);
    char err[KV_ERR_MAX];
    int ret = 1, rc;
    struct plan_result *r = NULL;
    cJSON *root = NULL;
    rc = model ? kvctl__model_load(&m, model, err, sizeof err)
               : kvctl__model_load_catalog(&m, catalog, used, nextn, err, sizeof err);
    if (rc == 0) rc = model_identity(&m, model, catalog, name, err, sizeof err);
    if (rc) { fprintf(stderr, "kvctl plan: %s\n", err); goto out; }
    for (int i = 0; i < ndev; i++)
        if (load_devices(&ds, devfiles[i], err, sizeof err) < 0) { fprintf(stderr, "kvctl plan: %s\n", err); goto out; }
    if (show_layers && !json) print_layers(stdout, &m.shape, &o);
    if (devset_choose(&ds, &m.shape, &o, err, sizeof err) < 0) { fprintf(stderr, "kvctl plan: %s\n", err); goto out; }
    rc = plan_make(&r, &m.shape, ds.d, ds.n, &o, err, sizeof err);
    if (rc) {
        fprintf(stderr, "kvctl plan: %s\n", err);
        goto out;
    }
    if (!json) print_table(stdout, &m, &ds, r, &o);
    bool need_relay = false;
    for (uint32_t i = 0; i < r->n_ranks; i++)
        if (r->ranks[i].relay) need_relay = true;
    if (need_relay && !relay) {
        fprintf(stderr, "kvctl plan: ranks marked 'relay' accept no inbound connections: pass --relay HOST:PORT "
                "so their edges get relay:// endpoints (no manifest written)\n");
        goto out;
    }
    /* A rank without a node key admits whoever links first as that rank (a relay in the
     * middle, anyone on the path): the manifest's ranks name every key unless told otherwise. */
    char unpinned[600] = "";
    size_t at = 0;
    for (uint32_t i = 0; i < r->n_ranks && at < sizeof unpinned; i++)
        if (!ds.nodes[r->ranks[i].device][0])
            at += (size_t)snprintf(unpinned + at, sizeof unpinned - at, "%srank %u (device %s)",
                                   at ? ", " : "", i, ds.ids[r->ranks[i].device]);
    if (unpinned[0] && (json || outp) && !allow_unpinned) {
        fprintf(stderr, "kvctl plan: %s name%s no node key: whoever links first (a relay, anyone on "
                "the path) could serve %s and read or rewrite the ring's traffic. Profile each device "
                "with `kvctl profile --state-dir DIR` (DIR: the state dir its kvd runs with), or add "
                "\"node\": the output of `kvd stage --print-key --state-dir DIR` to its entry; "
                "--allow-unpinned writes the manifest anyway (no manifest written)\n", unpinned,
                strchr(unpinned, ',') ? "" : "s", strchr(unpinned, ',') ? "those ranks" : "that rank");
        goto out;
    }
    if (unpinned[0])
        fprintf(stderr, "kvctl plan: %s: %s name%s no node key%s\n",
                allow_unpinned ? "warning (--allow-unpinned)" : "note", unpinned,
                strchr(unpinned, ',') ? "" : "s",
                allow_unpinned ? ": any node may link as them" : " (a manifest written now would be refused)");
    if (r->n_ranks > RING_MAX_RANKS && !json && !outp)
        fprintf(stderr, "kvctl plan: note: %u ranks (--max-ranks); a stage accepts manifests of at most %d\n",
                r->n_ranks, RING_MAX_RANKS);
    if (!json && !outp) { ret = 0; goto out; }
    if (manifest_json(&root, &m, &ds, r, &o, wire, relay, relay_plain, err, sizeof err) < 0) {
        fprintf(stderr, "kvctl plan: %s (no manifest written)\n", err);
        goto out;
    }
    char *js = cJSON_Print(root);
    if (!js) { fprintf(stderr, "kvctl plan: out of memory\n"); goto out; }
    if (json) printf("%s\n", js);
    if (outp) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", outp);
        FILE *f = fopen(tmp, "w");
        if (!f || fputs(js, f) < 0 || fputc('\n', f) < 0 || fclose(f) != 0 || rename(tmp, outp) != 0) {
            fprintf(stderr, "kvctl plan: writing %s: %s\n", outp, strerror(errno));
            free(js);
            goto out;
        }
        if (!json) printf("manifest written to %s\n", outp);
    }
    free(js);
    ret = 0;
out:
    cJSON_Delete(root);
    plan_result_free(r);
    devset_free(&ds);
    kvctl__model_free(&m);
    return ret;
}

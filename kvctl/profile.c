/* kvctl/profile.c — `kvctl profile`: measure this machine for a model (kvctl/shape.c reads its
 * shape) and print its device profile, the one kvctl plan reads (docs/planner.md). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "gguf/gguf.h"
#include "kernels/kern.h"
#include "kvctl/internal.h"
#include "model/model.h"
#include "net/net.h"
#include "planner/plan.h"
#include "util/err.h"
#include "util/util.h"

static uint64_t meminfo_kb(const char *key)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    uint64_t v = 0;
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl) && line[kl] == ':') {
            v = strtoull(line + kl + 1, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

/* Memory read bandwidth: sum a buffer larger than the caches a few times. */
static double measure_bw(void)
{
    size_t n = (size_t)64 << 20;
    uint64_t *buf = malloc(n);
    if (!buf) return 0;
    for (size_t i = 0; i < n / 8; i++) buf[i] = i;
    volatile uint64_t sink = 0;
    double best = 0;
    for (int rep = 0; rep < 4; rep++) {
        double t0 = util_now_s();
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (size_t i = 0; i + 4 <= n / 8; i += 4) { s0 += buf[i]; s1 += buf[i + 1]; s2 += buf[i + 2]; s3 += buf[i + 3]; }
        sink += s0 + s1 + s2 + s3;
        double dt = util_now_s() - t0;
        if (dt > 0 && n / dt > best) best = n / dt;
    }
    (void)sink;
    free(buf);
    return best;
}

/* Run the model's layers on kernel device dev: one session, `tokens` single-token steps; *ms
 * is the best step's time per working layer. 0, or -1 (said on stderr) when it cannot run. */
static int measure_layers(const struct kvctl_model *m, const char *path, const char *dev,
                          const struct kern_cl_opts *cl, int threads, int tokens, double *ms)
{
    struct model *md = NULL;
    struct model_exec *ex = NULL;
    char merr[KV_ERR_MAX] = "";
    int rc = -1;
    struct model_exec_opts eo = {dev, threads, (uint32_t)tokens + 8, 1, cl};
    if (model_open(&md, path, -1, -1, merr, sizeof merr) < 0 ||
        model_exec_new_opts(&ex, md, &eo, merr, sizeof merr) < 0 || model_session_new(ex, 1) < 0) {
        fprintf(stderr, "kvctl profile: cannot run the model on %s here (%s)%s\n", dev,
                merr[0] ? merr : "executor", strcmp(dev, "cpu") ? "" : "; estimating from memory bandwidth");
        goto out;
    }
    const struct model_hparams *hp = model_get_hparams(md);
    uint32_t first, last;
    model_get_window(md, &first, &last);
    float *x = malloc((size_t)hp->n_embd * sizeof *x);
    if (!x)
        goto out;
    for (uint32_t k = 0; k < hp->n_embd; k++) x[k] = 0.01f * (float)((k * 7919u) % 200) - 1.0f;
    double best = 0;
    int ok = 1;
    for (int t = 0; t < tokens && ok; t++) {
        double t0 = util_now_s();
        ok = model_window_run(ex, 1, (uint32_t)t, 1, x) == 0;
        double dt = util_now_s() - t0;
        if (t >= 2 && (best == 0 || dt < best)) best = dt; /* skip warm-up steps */
        for (uint32_t k = 0; k < hp->n_embd; k++)  /* keep values tame */
            if (!(fabsf(x[k]) < 1e3f)) x[k] = 0;
    }
    free(x);
    uint32_t runs = last > first ? last - first : 0;
    if (ok && best > 0 && runs) {
        /* the window's MTP blocks are not in the main pass: count the layers it runs */
        uint32_t work = 0;
        for (uint32_t l = first; l < last && l < m->shape.n_layers; l++)
            if (m->shape.layers[l].active_bytes) work++;
        *ms = best * 1000.0 / (work ? work : runs);
        rc = 0;
    }
out:
    model_exec_free(ex);
    model_free(md);
    return rc;
}

/* The OpenCL device's facts and a matmul (one activation row, as generation runs) per weight
 * type the model's blocks use: GB/s of weights read and GFLOP/s. NULL (said on stderr) when
 * no OpenCL device opens. *bw is its measured read bandwidth (bytes/s), *mem the memory a
 * window may use there: its global memory, and on a device that shares host memory at most
 * what the host has available. */
static cJSON *probe_opencl(const struct kvctl_model *m, const struct kern_cl_opts *cl,
                           uint64_t host_avail, double *bw, uint64_t *mem, uint64_t *max_alloc)
{
    struct kern_dev *d;
    char err[KV_ERR_MAX];
    struct kern_dev_opts dopts = {.n_threads = 1, .cl = cl};
    if (kern_dev_new_opts(&d, "opencl", &dopts, err, sizeof err) < 0) {
        fprintf(stderr, "kvctl profile: --backend opencl: %s\n", err);
        return NULL;
    }
    struct kern_cl_info ci;
    kern_cl_info(d, &ci);
    *bw = kern_cl_bench_bandwidth(d, (size_t)64 << 20) * 1e9;
    *mem = ci.global_mem;
    *max_alloc = ci.max_alloc;
    if (ci.unified && host_avail && host_avail < *mem)
        *mem = host_avail;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "platform", ci.platform);
    cJSON_AddStringToObject(o, "device", ci.device);
    cJSON_AddNumberToObject(o, "global_mem_bytes", (double)ci.global_mem);
    cJSON_AddNumberToObject(o, "max_alloc_bytes", (double)ci.max_alloc);
    cJSON_AddBoolToObject(o, "unified_memory", ci.unified);
    cJSON_AddStringToObject(o, "weights", ci.weights);
    cJSON_AddStringToObject(o, "layout", ci.layout);
    cJSON_AddNumberToObject(o, "read_bw_bytes_s", *bw);
    cJSON *mm = cJSON_AddArrayToObject(o, "matmul");
    bool seen[KERN_T_COUNT] = {false};
    const int64_t cols = 4096;
    for (uint64_t i = 0; m->gf && i < gguf_tensor_count(m->gf); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(m->gf, i);
        if (gguf_tensor_layer(t->name) < 0 || t->n_dims < 2 || t->type >= KERN_T_COUNT || seen[t->type] ||
            !kern_type_supported(t->type))
            continue;
        seen[t->type] = true;
        /* rows x 4096 of the type, about 16 MiB: bytes 0x11 make small finite scales */
        size_t rb = kern_row_bytes(t->type, cols);
        if (!rb)
            continue;
        int64_t rows = (int64_t)(((size_t)16 << 20) / rb);
        rows = rows < 64 ? 64 : rows;
        unsigned char *w = malloc((size_t)rows * rb);
        struct kern_buf *wb = NULL, *xb = NULL, *yb = NULL;
        double best = 0;
        if (w) {
            memset(w, 0x11, (size_t)rows * rb);
            if (kern_buf_new(&wb, d, KERN_BUF_WEIGHT, (size_t)rows * rb, w) == 0 &&
                kern_buf_new(&xb, d, KERN_BUF_ACT, (size_t)cols * 4, NULL) == 0 &&
                kern_buf_new(&yb, d, KERN_BUF_ACT, (size_t)rows * 4, NULL) == 0) {
                for (int rep = 0; rep < 4; rep++) {
                    double t0 = util_now_s();
                    int rc = kern_dev_matmul(d, t->type, kern_at_make(wb, 0), rows, cols,
                                             kern_at_make(xb, 0), 1, kern_at_make(yb, 0));
                    if (rc == 0) rc = kern_dev_sync(d);
                    double dt = util_now_s() - t0;
                    if (rc < 0) { best = 0; break; }
                    if (rep > 0 && (best == 0 || dt < best)) best = dt; /* the first builds layouts */
                }
            }
        }
        kern_buf_free(wb); kern_buf_free(xb); kern_buf_free(yb);
        free(w);
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "type", kern_type_name(t->type));
        cJSON_AddNumberToObject(e, "rows", (double)rows);
        cJSON_AddNumberToObject(e, "cols", (double)cols);
        cJSON_AddNumberToObject(e, "gb_s", best > 0 ? (double)rows * rb / best / 1e9 : 0);
        cJSON_AddNumberToObject(e, "gflops", best > 0 ? 2.0 * rows * cols / best / 1e9 : 0);
        cJSON_AddItemToArray(mm, e);
    }
    kern_dev_free(d);
    return o;
}

static void profile_usage(FILE *o)
{
    fprintf(o,
        "usage: kvctl profile --model FILE --state-dir DIR [-t N] [--id ID] [--endpoint URL]\n"
        "                     [--rtt-ms X] [--bw BYTES_PER_S] [--no-inbound] [--tokens N]\n"
        "                     [--estimate] [--backend cpu|opencl] [--cl-platform N]\n"
        "                     [--cl-device N] [--cl-weights map|copy|auto] [--allow-unpinned]\n"
        "Measure this machine for a model: ms per layer-token (the model's layers run on this\n"
        "CPU with N threads), free memory (MemAvailable), memory bandwidth; print the device\n"
        "profile JSON for `kvctl plan --devices`. --backend opencl also measures the OpenCL\n"
        "device (its memory, bandwidth, a matmul per weight type, the layers run on it) and\n"
        "lists both under \"backends\"; the planner places the windows on the faster. --estimate skips running the model and\n"
        "estimates from the measured bandwidth and the bytes a token reads. --state-dir DIR\n"
        "records the node key of the kvd that will run there (DIR/node.key, created if missing,\n"
        "as `kvd stage --state-dir DIR --print-key` does), so a planned manifest admits only\n"
        "that node on its rank; without it the profile is refused unless --allow-unpinned\n"
        "(and `kvctl plan` then refuses the manifest unless --allow-unpinned too).\n");
}

int kvctl_cmd_profile(int argc, char **argv)
{
    if (kvctl_is_help(argc, argv)) { profile_usage(stdout); return 0; }
    const char *model = NULL, *id = NULL, *endpoint = NULL, *state_dir = NULL;
    double v, rtt = 0, bw = 0;
    int threads = 0, tokens = 16;
    bool inbound = true, estimate = false, allow_unpinned = false;
    const char *backend = "cpu";
    struct kern_cl_opts clo = KERN_CL_OPTS_INIT;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--no-inbound")) { inbound = false; continue; }
        if (!strcmp(a, "--estimate")) { estimate = true; continue; }
        if (!strcmp(a, "--allow-unpinned")) { allow_unpinned = true; continue; }
        if (i + 1 >= argc) { fprintf(stderr, "kvctl profile: %s needs a value (or is unknown)\n", a); profile_usage(stderr); return 2; }
        const char *val = argv[++i];
        if (!strcmp(a, "--model") || !strcmp(a, "-m")) model = val;
        else if (!strcmp(a, "-t")) { if (kvctl_parse_num("profile", a, val, 0, 1024, &v)) return 2; threads = (int)v; }
        else if (!strcmp(a, "--tokens")) { if (kvctl_parse_num("profile", a, val, 1, 4096, &v)) return 2; tokens = (int)v; }
        else if (!strcmp(a, "--id")) id = val;
        else if (!strcmp(a, "--endpoint")) endpoint = val;
        else if (!strcmp(a, "--state-dir")) state_dir = val;
        else if (!strcmp(a, "--backend") || !strcmp(a, "--device")) backend = val;
        else if (!strncmp(a, "--cl-", 5)) {
            int rc = kvctl_cl_option(&clo, a, val);
            if (rc == -ENOENT) { fprintf(stderr, "kvctl profile: unknown option %s\n", a); profile_usage(stderr); }
            if (rc < 0) return 2;
        }
        else if (!strcmp(a, "--rtt-ms")) { if (kvctl_parse_num("profile", a, val, 0, 1e6, &rtt)) return 2; }
        else if (!strcmp(a, "--bw")) { if (kvctl_parse_num("profile", a, val, 0, 1e15, &bw)) return 2; }
        else { fprintf(stderr, "kvctl profile: unknown option %s\n", a); profile_usage(stderr); return 2; }
    }
    if (!model) { fprintf(stderr, "kvctl profile: --model is required\n"); profile_usage(stderr); return 2; }
    if (!state_dir && !allow_unpinned) {
        fprintf(stderr, "kvctl profile: --state-dir DIR is required: the node key of the kvd that "
                "will run on this device (DIR/node.key, created if missing; the --state-dir its "
                "kvd stage runs with) goes into the profile, so a planned manifest admits only that "
                "node on its rank. --allow-unpinned profiles without it (any node could then link as "
                "its rank)\n");
        return 2;
    }
    bool cl = !strcmp(backend, "opencl");
    if (!cl && strcmp(backend, "cpu")) {
        fprintf(stderr, "kvctl profile: --backend %s: cpu or opencl\n", backend);
        return 2;
    }
    char host[128] = "localhost";
    gethostname(host, sizeof host - 1);
    if (!id) id = host;
    char err[KV_ERR_MAX];
    char node[65] = "";
    if (state_dir) {
        struct net_identity *ident;
        if (net_identity_load(&ident, state_dir, err, sizeof err) < 0) {
            fprintf(stderr, "kvctl profile: node key in %s: %s\n", state_dir, err);
            return 1;
        }
        util_hex_encode(net_identity_pub(ident), 32, node);
        net_identity_free(ident);
    }
    struct kvctl_model m;
    memset(&m, 0, sizeof m);
    if (kvctl__model_load(&m, model, err, sizeof err)) {
        fprintf(stderr, "kvctl profile: %s\n", err);
        kvctl__model_free(&m);
        return 1;
    }
    uint64_t avail = meminfo_kb("MemAvailable") * 1024;
    double membw = measure_bw();
    /* the average working layer: what ms_per_layer_token means to the planner */
    double act = 0;
    uint32_t nwork = 0;
    for (uint32_t i = 0; i < m.shape.n_layers; i++)
        if (m.shape.layers[i].active_bytes) { act += (double)m.shape.layers[i].active_bytes; nwork++; }
    act = nwork ? act / nwork : 0;
    double ms = 0;
    const char *how = "estimate";
    if (!estimate && !strcmp(m.kind, "gguf") && measure_layers(&m, model, "cpu", NULL, threads, tokens, &ms) == 0)
        how = "measured";
    if (ms == 0 && membw > 0)
        ms = act / membw * 1000.0;
    /* --backend opencl: the OpenCL device as a second option of this machine */
    struct plan_device opt[2] = {
        {.backend = "cpu", .mem_bytes = avail, .ms_per_layer_token = ms, .mem_bw_bytes_s = membw},
        {.backend = "opencl"},
    };
    const char *opt_how[2] = {how, "estimate"};
    cJSON *clinfo = NULL;
    char clname[160] = "";
    if (cl) {
        double clbw = 0;
        uint64_t clmem = 0, clalloc = 0;
        if (!(clinfo = probe_opencl(&m, &clo, avail, &clbw, &clmem, &clalloc))) {
            kvctl__model_free(&m);
            return 1;
        }
        double clms = 0;
        if (!estimate && !strcmp(m.kind, "gguf") && measure_layers(&m, model, "opencl", &clo, 1, tokens, &clms) == 0)
            opt_how[1] = "measured";
        else if (clbw > 0)
            clms = act / clbw * 1000.0;
        snprintf(clname, sizeof clname, "%s", cJSON_GetObjectItem(clinfo, "device")->valuestring);
        opt[1].mem_bytes = clmem;
        opt[1].max_alloc_bytes = clalloc;
        opt[1].ms_per_layer_token = clms;
        opt[1].mem_bw_bytes_s = clbw;
    }
    struct plan_opts po;
    plan_opts_default(&po);
    int pick = cl ? plan_device_choose(opt, 2, &m.shape, &po, NULL) : 0;
    if (pick < 0)
        pick = 0;
    cJSON *root = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(root, "devices");
    cJSON *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "id", id);
    cJSON_AddNumberToObject(d, "mem_bytes", (double)opt[pick].mem_bytes);
    cJSON_AddStringToObject(d, "backend", opt[pick].backend);
    cJSON_AddNumberToObject(d, "ms_per_layer_token", opt[pick].ms_per_layer_token);
    cJSON_AddNumberToObject(d, "mem_bw_bytes_s", opt[pick].mem_bw_bytes_s);
    if (opt[pick].max_alloc_bytes)
        cJSON_AddNumberToObject(d, "max_alloc_bytes", (double)opt[pick].max_alloc_bytes);
    cJSON_AddNumberToObject(d, "rtt_ms", rtt);
    cJSON_AddNumberToObject(d, "bw_bytes_s", bw);
    cJSON_AddBoolToObject(d, "inbound", inbound);
    if (endpoint) cJSON_AddStringToObject(d, "endpoint", endpoint);
    if (node[0]) cJSON_AddStringToObject(d, "node", node);
    cJSON_AddStringToObject(d, "ms_per_layer_token_is", opt_how[pick]);
    if (cl) {   /* both options, for `kvctl plan` to choose with its own context and sessions */
        cJSON *bs = cJSON_AddArrayToObject(d, "backends");
        for (int k = 0; k < 2; k++) {
            cJSON *b = cJSON_CreateObject();
            cJSON_AddStringToObject(b, "backend", opt[k].backend);
            cJSON_AddNumberToObject(b, "mem_bytes", (double)opt[k].mem_bytes);
            cJSON_AddNumberToObject(b, "ms_per_layer_token", opt[k].ms_per_layer_token);
            cJSON_AddNumberToObject(b, "mem_bw_bytes_s", opt[k].mem_bw_bytes_s);
            if (opt[k].max_alloc_bytes)
                cJSON_AddNumberToObject(b, "max_alloc_bytes", (double)opt[k].max_alloc_bytes);
            cJSON_AddStringToObject(b, "ms_per_layer_token_is", opt_how[k]);
            if (k == 1)
                cJSON_AddItemToObject(b, "opencl", clinfo);
            cJSON_AddItemToArray(bs, b);
        }
    }
    cJSON_AddItemToArray(arr, d);
    char *js = cJSON_Print(root);
    if (js) printf("%s\n", js);
    free(js);
    cJSON_Delete(root);
    char a[32], b[32];
    util_fmt_bytes(a, sizeof a, (double)avail, 2, UTIL_FMT_SI);
    util_fmt_bytes(b, sizeof b, membw, 2, UTIL_FMT_SI);
    fprintf(stderr, "profile: %s, %s available, %s/s memory bandwidth, %.4f ms per layer-token (%s, "
            "average layer reads %.0f bytes per token)\n", id, a, b, ms, how, act);
    if (cl) {
        util_fmt_bytes(a, sizeof a, (double)opt[1].mem_bytes, 2, UTIL_FMT_SI);
        util_fmt_bytes(b, sizeof b, opt[1].mem_bw_bytes_s, 2, UTIL_FMT_SI);
        fprintf(stderr, "profile: opencl %s, %s for windows, %s/s read bandwidth, %.4f ms per layer-token "
                "(%s); windows go on %s\n", clname, a, b,
                opt[1].ms_per_layer_token, opt_how[1], opt[pick].backend);
    }
    kvctl__model_free(&m);
    return 0;
}

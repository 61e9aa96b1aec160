/* ocl_dev.c — the "opencl" device: the forward pass's ops as OpenCL kernels (kern.cl,
 * embedded at build time) on buffers in the device's memory (docs/opencl.md).
 *
 * Weights are uploaded once when their buffer is made, or, on a device that shares host
 * memory (or when asked), wrapped in place over the mapped file (CL_MEM_USE_HOST_PTR) so the
 * window is not held twice. A device caps the size of one
 * allocation (CL_DEVICE_MAX_MEM_ALLOC_SIZE, 256 MB-1 GB on phones; KV_CL_ALLOC_CAP forces a
 * smaller one): a weight buffer over the cap is split into pieces of the cap, plus a "seam"
 * piece across each boundary holding the rows that straddle it, so every row a kernel reads
 * lies whole in one allocation. K/V, recurrent state and activations stay in device memory;
 * an IO buffer is a staging area the boundary rows are copied through. The program is built
 * once per device and its binary cached on disk, keyed on source, options, device and
 * driver. Ops are queued in order and run asynchronously; reads wait for them. */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <clblast_c.h>
#include <openssl/evp.h>

#include "kernels/internal.h"
#include "util/util.h"

extern const unsigned char kern__cl_src[];
extern const unsigned long kern__cl_src_len;

enum {
    K_MATMUL, K_GET_ROWS, K_RMSNORM, K_L2NORM, K_ROPE_ANGLES, K_ROPE_ROWS, K_KV_STORE,
    K_ATTENTION, K_SWIGLU, K_ADD, K_AXPY_ROWS, K_SIGMOID, K_CONV_SILU, K_MOE_ROUTE, K_DELTANET,
    K_COPY_ROWS, K_REPACK, K_MATMUL_SPLIT, K_GET_ROWS_SPLIT, K_BW_READ, K_DEQUANT_ROWS,
    K_DEQUANT_SPLIT, K_COUNT
};
static const char *const kernel_names[K_COUNT] = {
    "matmul", "get_rows", "rmsnorm", "l2norm", "rope_angles", "rope_rows", "kv_store",
    "attention", "swiglu", "add", "axpy_rows", "sigmoid", "conv_silu", "moe_route", "deltanet",
    "copy_rows", "repack_q", "matmul_split", "get_rows_split", "bw_read", "dequant_rows",
    "dequant_split",
};

#define NC 4          /* activation rows per matmul work-group (KV_NC in kern.cl) */
#define MAXD 512      /* the largest attention head (KV_MAXD) */
#define SEAM_MAX (4u << 20)
/* Prompt GEMMs (docs/opencl.md, "Prompt GEMMs"): matmuls of at least this many activation
 * rows go through CLBlast unless the device is told otherwise (the lowest threshold allowed:
 * on PoCL CLBlast wins from 8 rows, and at 16 runs 2.3x the fused kernels' speed); the f32
 * tile of dequantised weight rows they use holds at most GEMM_TILE_MAX bytes (and at most
 * the allocation cap). */
#define GEMM_ROWS_DEFAULT KERN_CL_GEMM_MIN
#define GEMM_TILE_MAX ((size_t)32 << 20)

/* One allocation of a buffer: bytes [lo, hi) of it; seam > 0 for a piece across boundary
 * seam that holds only the rows straddling it. A piece wrapped over the caller's bytes starts
 * `shift` bytes before lo (its host pointer aligned down to the device's base alignment):
 * buffer byte x is the allocation's byte x - lo + shift. */
struct piece {
    cl_mem mem;
    size_t lo, hi, seam;
    size_t shift;
    size_t mapped;    /* bytes wrapped in place (0: copied or device memory) */
    size_t copied;    /* weight bytes copied to the device */
};

/* Where buffer byte off of piece p lies in its allocation. */
static size_t in_piece(const struct piece *p, size_t off) { return off - p->lo + p->shift; }

struct cbuf {
    struct piece *p;
    int n;          /* pieces: the main ones first (n_main), then the seams */
    int n_main;
    /* The split layout (Q4_0/Q8_0 on the "adreno" layout), made at the first matmul: the
     * buffer is then rows x cols of type, its pieces released. */
    uint32_t sp_type;
    int64_t sp_rows, sp_cols;
    cl_mem sp_d, sp_q, sp_img;
};

struct ocl {
    cl_platform_id plat;
    cl_device_id dev;
    cl_context ctx;
    cl_command_queue q;
    cl_program prog;
    cl_kernel k[K_COUNT];
    cl_mem dummy;             /* stands for "no operand" */
    size_t wg;                /* work-group size of the reducing kernels */
    size_t cap;               /* weights are split into allocations of this size */
    size_t maxalloc;          /* the device's largest allocation */
    bool split_layout;        /* Q4_0/Q8_0 weights in the split, transposed, image layout */
    bool map_weights;         /* weights wrapped in place (CL_MEM_USE_HOST_PTR) where aligned */
    size_t img_max;           /* texels of an image1d_buffer_t at most */
    /* Prompt GEMMs: matmuls of at least gemm_rows activation rows (0: none) dequantise the
     * weight rows, a tile at a time, into gemm_tile (made at the first, gemm_tile_bytes) and
     * multiply with CLBlast's SGEMM, which may use gemm_tmp (grown as a GEMM asks, within
     * the device's largest allocation) for its padded copies. */
    uint32_t gemm_rows;
    cl_mem gemm_tile, gemm_tmp;
    size_t gemm_tile_bytes, gemm_tmp_bytes;
    int gemm_fault;           /* tests: the GEMMs report this CLBlast status instead of running */
    struct kern_cl_info info;
};

/* The OpenCL runtime (the ICD loader, PoCL and the LLVM it compiles with, and CLBlast's
 * cache of compiled kernels) keeps allocations
 * until the process exits, which LeakSanitizer reports in ASan builds. A program linking
 * this device ignores leaks allocated inside those libraries only; the sanitizer runtime calls
 * this hook by its fixed name (a weak symbol there, unused without ASan). */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libpocl.so\nleak:libLLVM\nleak:libOpenCL.so\nleak:libclang\nleak:libclblast\n";
}

#define OCL(d) ((struct ocl *)(d)->impl)

/* An OpenCL status as a negative errno: out of memory or resources -ENOMEM, else -EIO. */
static int cl_rc(cl_int e)
{
    if (e == CL_SUCCESS)
        return 0;
    if (e == CL_MEM_OBJECT_ALLOCATION_FAILURE || e == CL_OUT_OF_RESOURCES ||
        e == CL_OUT_OF_HOST_MEMORY || e == CL_INVALID_BUFFER_SIZE)
        return -ENOMEM;
    return -EIO;
}

static void msg(struct kern_dev *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void msg(struct kern_dev *d, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->msg, sizeof d->msg, fmt, ap);
    va_end(ap);
}

/* An option: the caller's value when >= 0 (or set), else the environment's, else def. */
static long opt_long(long given, const char *env, long def)
{
    if (given >= 0)
        return given;
    const char *s = getenv(env);
    if (s && *s) {
        char *end;
        long v = strtol(s, &end, 0);
        if (*end == 'k' || *end == 'K')
            v <<= 10, end++;
        else if (*end == 'm' || *end == 'M')
            v <<= 20, end++;
        if (!*end && v >= 0)
            return v;
    }
    return def;
}

static void str_info(cl_device_id dev, cl_device_info what, char *buf, size_t n)
{
    buf[0] = 0;
    if (clGetDeviceInfo(dev, what, n, buf, NULL) != CL_SUCCESS)
        buf[0] = 0;
    buf[n - 1] = 0;
}

/* "0: name, 1: name" of the platforms (or of platform p's devices when p is set). */
static void describe(char *buf, size_t n, cl_platform_id *plats, cl_uint np, cl_device_id *devs,
                     cl_uint nd)
{
    size_t at = 0;
    buf[0] = 0;
    for (cl_uint i = 0; i < (devs ? nd : np) && at < n; i++) {
        char name[128] = "";
        if (devs)
            str_info(devs[i], CL_DEVICE_NAME, name, sizeof name);
        else if (clGetPlatformInfo(plats[i], CL_PLATFORM_NAME, sizeof name, name, NULL) != CL_SUCCESS)
            name[0] = 0;
        name[sizeof name - 1] = 0;
        at += (size_t)snprintf(buf + at, n - at, "%s%u: %s", i ? ", " : "", i, name);
    }
}

/* ---- the program and its cache ---- */

static int mkdirs(const char *path)
{
    char p[4096];
    if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p)
        return -ENAMETOOLONG;
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            if (mkdir(p, 0700) < 0 && errno != EEXIST)
                return -errno;
            *s = '/';
        }
    return mkdir(p, 0700) < 0 && errno != EEXIST ? -errno : 0;
}

/* The cache folder: the option, KV_CL_CACHE ("off": none), $XDG_CACHE_HOME/kvasir/opencl,
 * ~/.cache/kvasir/opencl. Empty when there is none. */
static void cache_dir(const struct kern_cl_opts *co, char *buf, size_t n)
{
    const char *s = co->cache_dir ? co->cache_dir : getenv("KV_CL_CACHE");
    buf[0] = 0;
    if (s && !strcmp(s, "off"))
        return;
    if (s && *s) {
        snprintf(buf, n, "%s", s);
    } else if ((s = getenv("XDG_CACHE_HOME")) && *s) {
        snprintf(buf, n, "%s/kvasir/opencl", s);
    } else if ((s = getenv("HOME")) && *s) {
        snprintf(buf, n, "%s/.cache/kvasir/opencl", s);
    }
}

/* The cache file for this source, these options, this device and driver. */
static void cache_path(struct ocl *o, const char *dir, const char *opts, char *path, size_t n)
{
    char parts[4][256];
    str_info(o->dev, CL_DEVICE_NAME, parts[0], sizeof parts[0]);
    str_info(o->dev, CL_DEVICE_VERSION, parts[1], sizeof parts[1]);
    str_info(o->dev, CL_DRIVER_VERSION, parts[2], sizeof parts[2]);
    if (clGetPlatformInfo(o->plat, CL_PLATFORM_VERSION, sizeof parts[3], parts[3], NULL) != CL_SUCCESS)
        parts[3][0] = 0;
    parts[3][255] = 0;
    unsigned char md[32];
    unsigned int mdlen = 0;
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    bool ok = c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) &&
              EVP_DigestUpdate(c, kern__cl_src, kern__cl_src_len) &&
              EVP_DigestUpdate(c, opts, strlen(opts) + 1);
    for (int i = 0; i < 4 && ok; i++)
        ok = EVP_DigestUpdate(c, parts[i], strlen(parts[i]) + 1);
    ok = ok && EVP_DigestFinal_ex(c, md, &mdlen);
    EVP_MD_CTX_free(c);
    char hex[65] = "";
    if (ok)
        util_hex_encode(md, 32, hex);
    snprintf(path, n, "%s/%s.bin", dir, ok ? hex : "nohash");
}

static int build(struct kern_dev *d, const char *opts)
{
    struct ocl *o = OCL(d);
    cl_int e = clBuildProgram(o->prog, 1, &o->dev, opts, NULL, NULL);
    if (e == CL_SUCCESS)
        return 0;
    char log[3072] = "";
    size_t len = 0;
    clGetProgramBuildInfo(o->prog, o->dev, CL_PROGRAM_BUILD_LOG, sizeof log - 1, log, &len);
    log[sizeof log - 1] = 0;
    msg(d, "building the kernels (%s) failed (%d): %s", opts, (int)e, log);
    return e == CL_OUT_OF_HOST_MEMORY || e == CL_OUT_OF_RESOURCES ? -ENOMEM : -EIO;
}

static int program(struct kern_dev *d, const struct kern_cl_opts *co, const char *opts)
{
    struct ocl *o = OCL(d);
    char dir[4096], path[4200];
    cache_dir(co, dir, sizeof dir);
    cl_int e;
    if (dir[0]) {
        cache_path(o, dir, opts, path, sizeof path);
        snprintf(o->info.cache_file, sizeof o->info.cache_file, "%s", path);
        char *bin = NULL;
        size_t len = 0;
        if (util_file_read(path, 256u << 20, &bin, &len, NULL, 0) == 0) {
            const unsigned char *b = (const unsigned char *)bin;
            cl_int st;
            o->prog = clCreateProgramWithBinary(o->ctx, 1, &o->dev, &len, &b, &st, &e);
            free(bin);
            if (o->prog && e == CL_SUCCESS && st == CL_SUCCESS &&
                clBuildProgram(o->prog, 1, &o->dev, opts, NULL, NULL) == CL_SUCCESS) {
                o->info.from_cache = true;
                return 0;
            }
            if (o->prog)
                clReleaseProgram(o->prog);
            o->prog = NULL;
        }
    }
    const char *src = (const char *)kern__cl_src;
    size_t slen = kern__cl_src_len;
    o->prog = clCreateProgramWithSource(o->ctx, 1, &src, &slen, &e);
    if (!o->prog) {
        msg(d, "clCreateProgramWithSource: %d", (int)e);
        return cl_rc(e);
    }
    double t0 = util_now_ms();
    int rc = build(d, opts);
    o->info.build_ms = util_now_ms() - t0;
    if (rc < 0 || !dir[0])
        return rc;
    /* Cache the binary: written aside and renamed, so a reader never sees half of one. */
    size_t blen = 0;
    if (clGetProgramInfo(o->prog, CL_PROGRAM_BINARY_SIZES, sizeof blen, &blen, NULL) != CL_SUCCESS ||
        !blen || mkdirs(dir) < 0)
        return 0;
    unsigned char *bin = malloc(blen);
    if (!bin)
        return 0;
    if (clGetProgramInfo(o->prog, CL_PROGRAM_BINARIES, sizeof bin, &bin, NULL) == CL_SUCCESS) {
        char tmp[4300];
        snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
        FILE *f = fopen(tmp, "wb");
        bool ok = f && fwrite(bin, 1, blen, f) == blen;
        if (f && fclose(f) != 0)
            ok = false;
        if (!ok || rename(tmp, path) < 0)
            unlink(tmp);
    }
    free(bin);
    return 0;
}

/* ---- open and close ---- */

static void close_(struct kern_dev *d)
{
    struct ocl *o = OCL(d);
    if (!o)
        return;
    if (o->q)
        clFinish(o->q);
    for (int i = 0; i < K_COUNT; i++)
        if (o->k[i])
            clReleaseKernel(o->k[i]);
    if (o->dummy)
        clReleaseMemObject(o->dummy);
    if (o->gemm_tile)
        clReleaseMemObject(o->gemm_tile);
    if (o->gemm_tmp)
        clReleaseMemObject(o->gemm_tmp);
    if (o->prog)
        clReleaseProgram(o->prog);
    if (o->q)
        clReleaseCommandQueue(o->q);
    if (o->ctx)
        clReleaseContext(o->ctx);
    free(o);
    d->impl = NULL;
}

static int pick(struct kern_dev *d, struct ocl *o, const struct kern_cl_opts *co)
{
    cl_uint np = 0, nd = 0;
    cl_platform_id plats[16];
    cl_device_id devs[16];
    char list[512];
    if (clGetPlatformIDs(16, plats, &np) != CL_SUCCESS || np == 0) {
        msg(d, "no OpenCL platform found (no ICD installed, e.g. pocl-opencl-icd, or none "
               "loads)");
        return -ENODEV;
    }
    np = np > 16 ? 16 : np;
    long pi = opt_long(co->platform, "KV_CL_PLATFORM", 0);
    describe(list, sizeof list, plats, np, NULL, 0);
    if (pi >= (long)np) {
        msg(d, "OpenCL platform %ld: there are %u (%s)", pi, np, list);
        return -ENODEV;
    }
    o->plat = plats[pi];
    if (clGetDeviceIDs(o->plat, CL_DEVICE_TYPE_ALL, 16, devs, &nd) != CL_SUCCESS || nd == 0) {
        msg(d, "OpenCL platform %ld has no device (platforms: %s)", pi, list);
        return -ENODEV;
    }
    nd = nd > 16 ? 16 : nd;
    long di = opt_long(co->device, "KV_CL_DEVICE", 0);
    describe(list, sizeof list, NULL, 0, devs, nd);
    if (di >= (long)nd) {
        msg(d, "OpenCL device %ld of platform %ld: there are %u (%s)", di, pi, nd, list);
        return -ENODEV;
    }
    o->dev = devs[di];
    if (clGetPlatformInfo(o->plat, CL_PLATFORM_NAME, sizeof o->info.platform, o->info.platform,
                          NULL) != CL_SUCCESS)
        o->info.platform[0] = 0;
    o->info.platform[sizeof o->info.platform - 1] = 0;
    str_info(o->dev, CL_DEVICE_NAME, o->info.device, sizeof o->info.device);
    return 0;
}

/* A variant setting: the option (> 0 on, < 0 off), else the environment's ("1"/"on",
 * "0"/"off"), else off. -EINVAL for another value. */
static int variant_opt(struct kern_dev *d, int given, const char *env, bool *on)
{
    const char *s = getenv(env);
    if (given || !s || !*s) {
        *on = given > 0;
        return 0;
    }
    if (strcmp(s, "1") && strcmp(s, "on") && strcmp(s, "0") && strcmp(s, "off")) {
        msg(d, "%s %s: on (1) or off (0)", env, s);
        return -EINVAL;
    }
    *on = !strcmp(s, "1") || !strcmp(s, "on");
    return 0;
}

/* The kernels' variants the device offers (cl_khr_fp16; cl_khr_subgroups, which the kernels
 * use from OpenCL C 2.0) and those asked for: -ENODEV for one the device lacks. */
static int variants(struct kern_dev *d, struct ocl *o, const struct kern_cl_opts *co)
{
    size_t n = 0;
    if (clGetDeviceInfo(o->dev, CL_DEVICE_EXTENSIONS, 0, NULL, &n) != CL_SUCCESS)
        n = 0;
    char *ext = calloc(1, n + 1);
    if (!ext)
        return -ENOMEM;
    if (n && clGetDeviceInfo(o->dev, CL_DEVICE_EXTENSIONS, n, ext, NULL) != CL_SUCCESS)
        ext[0] = 0;
    char cver[128];
    str_info(o->dev, CL_DEVICE_OPENCL_C_VERSION, cver, sizeof cver);
    o->info.has_fp16 = strstr(ext, "cl_khr_fp16") != NULL;
    o->info.has_subgroups = strstr(ext, "cl_khr_subgroups") != NULL &&
                            (strstr(cver, "OpenCL C 2.") || strstr(cver, "OpenCL C 3."));
    free(ext);
    int rc = variant_opt(d, co->fp16, "KV_CL_FP16", &o->info.fp16);
    if (rc == 0)
        rc = variant_opt(d, co->subgroups, "KV_CL_SUBGROUPS", &o->info.subgroups);
    if (rc < 0)
        return rc;
    if ((o->info.fp16 && !o->info.has_fp16) || (o->info.subgroups && !o->info.has_subgroups)) {
        msg(d, "OpenCL device %s has no %s: the %s variant needs it", o->info.device,
            o->info.fp16 && !o->info.has_fp16 ? "cl_khr_fp16" : "cl_khr_subgroups (OpenCL C 2.0)",
            o->info.fp16 && !o->info.has_fp16 ? "fp16" : "subgroups");
        return -ENODEV;
    }
    return 0;
}

/* The prompt GEMMs' threshold: the option (negative: off), KV_CL_GEMM_ROWS (a number of rows,
 * "off" or 0), else GEMM_ROWS_DEFAULT; at least KERN_CL_GEMM_MIN, so a drafting pass (at most
 * KERN_ROWS_EXACT_MAX rows) always runs on the row-exact kernels. 0 (off) in *out. */
static int gemm_rows_opt(struct kern_dev *d, const struct kern_cl_opts *co, uint32_t *out)
{
    long v = co->gemm_rows;
    const char *s = getenv("KV_CL_GEMM_ROWS"), *what = "OpenCL GEMM rows";
    if (v == 0 && s && *s) {
        what = "KV_CL_GEMM_ROWS";
        char *end;
        errno = 0;
        v = !strcmp(s, "off") ? -1 : strtol(s, &end, 10);
        if (strcmp(s, "off") && (errno || *end || v < 0)) {
            msg(d, "KV_CL_GEMM_ROWS %s: a number of activation rows (at least %d) or off", s,
                KERN_CL_GEMM_MIN);
            return -EINVAL;
        }
        v = v == 0 ? -1 : v;
    } else if (v == 0) {
        v = GEMM_ROWS_DEFAULT;
    }
    if (v < 0) {
        *out = 0;
        return 0;
    }
    if (v < KERN_CL_GEMM_MIN || v > (long)UINT32_MAX) {
        msg(d, "%s %ld: at least %d (a drafting pass's %d rows stay on the row-exact "
               "kernels), or off", what, v, KERN_CL_GEMM_MIN, KERN_ROWS_EXACT_MAX);
        return -EINVAL;
    }
    *out = (uint32_t)v;
    return 0;
}

static int open_(struct kern_dev *d, const struct kern_dev_opts *dopts)
{
    static const struct kern_cl_opts none = KERN_CL_OPTS_INIT;
    const struct kern_cl_opts *co = dopts->cl ? dopts->cl : &none;
    d->n_threads = 1;
    struct ocl *o = calloc(1, sizeof *o);
    if (!o)
        return -ENOMEM;
    d->impl = o;
    int rc = pick(d, o, co);
    if (rc < 0)
        goto fail;
    cl_int e;
    o->ctx = clCreateContext(NULL, 1, &o->dev, NULL, NULL, &e);
    if (o->ctx)
        o->q = clCreateCommandQueue(o->ctx, o->dev, 0, &e);
    if (!o->ctx || !o->q) {
        msg(d, "OpenCL device %s: no context or queue (%d)", o->info.device, (int)e);
        rc = cl_rc(e);
        goto fail;
    }
    cl_ulong maxalloc = 0;
    size_t maxwg = 0;
    clGetDeviceInfo(o->dev, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof maxalloc, &maxalloc, NULL);
    clGetDeviceInfo(o->dev, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof maxwg, &maxwg, NULL);
    size_t cap = o->maxalloc = (size_t)maxalloc;
    long forced = opt_long(co->alloc_cap ? (long)co->alloc_cap : -1, "KV_CL_ALLOC_CAP", 0);
    if (forced > 0 && (size_t)forced < cap)
        cap = (size_t)forced;
    cap &= ~(size_t)4095;  /* pieces start 4 KiB-aligned: offsets keep their alignment */
    o->cap = o->info.alloc_cap = cap < 4096 ? 4096 : cap;
    size_t wg = (size_t)opt_long(co->wg ? co->wg : -1, "KV_CL_WG", 64);
    if (wg < 32 || wg > 256 || (wg & (wg - 1))) {
        msg(d, "OpenCL work-group size %zu: 32, 64, 128 or 256", wg);
        rc = -EINVAL;
        goto fail;
    }
    while (wg > 32 && wg > maxwg)
        wg /= 2;
    o->wg = o->info.wg = wg;
    o->info.max_wg = maxwg;
    /* The layout: the option, KV_CL_LAYOUT, else by device class (Adreno: split) */
    const char *lay = co->layout ? co->layout : getenv("KV_CL_LAYOUT");
    char vendor[128], name[128];
    str_info(o->dev, CL_DEVICE_VENDOR, vendor, sizeof vendor);
    str_info(o->dev, CL_DEVICE_NAME, name, sizeof name);
    cl_bool images = CL_FALSE;
    clGetDeviceInfo(o->dev, CL_DEVICE_IMAGE_SUPPORT, sizeof images, &images, NULL);
    clGetDeviceInfo(o->dev, CL_DEVICE_IMAGE_MAX_BUFFER_SIZE, sizeof o->img_max, &o->img_max, NULL);
    if (lay && *lay && strcmp(lay, "auto") && strcmp(lay, "plain") && strcmp(lay, "adreno")) {
        msg(d, "OpenCL layout %s: auto, plain or adreno", lay);
        rc = -EINVAL;
        goto fail;
    }
    if (lay && !strcmp(lay, "adreno"))
        o->split_layout = true;
    else if (!lay || !*lay || !strcmp(lay, "auto"))
        o->split_layout = strstr(vendor, "Qualcomm") || strstr(name, "Adreno");
    if (o->split_layout && !images) {
        msg(d, "OpenCL device %s has no image support: the adreno layout needs it", name);
        rc = -ENODEV;
        goto fail;
    }
    snprintf(o->info.layout, sizeof o->info.layout, "%s", o->split_layout ? "adreno" : "plain");
    /* Weights: wrapped in place where the device shares host memory (phones, integrated
     * GPUs, CPU devices), so the window is held once; copied to a discrete GPU's memory. */
    cl_bool unified = CL_FALSE;
    cl_uint align_bits = 0;
    cl_ulong gmem = 0;
    clGetDeviceInfo(o->dev, CL_DEVICE_HOST_UNIFIED_MEMORY, sizeof unified, &unified, NULL);
    clGetDeviceInfo(o->dev, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align_bits, &align_bits, NULL);
    clGetDeviceInfo(o->dev, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof gmem, &gmem, NULL);
    o->info.unified = unified == CL_TRUE;
    o->info.base_align = align_bits / 8 ? align_bits / 8 : 1;
    o->info.global_mem = gmem;
    o->info.max_alloc = maxalloc;
    const char *wm = co->weights ? co->weights : getenv("KV_CL_WEIGHTS");
    if (wm && *wm && strcmp(wm, "auto") && strcmp(wm, "map") && strcmp(wm, "copy")) {
        msg(d, "OpenCL weights %s: map, copy or auto", wm);
        rc = -EINVAL;
        goto fail;
    }
    o->map_weights = wm && !strcmp(wm, "map") ? true
                     : wm && !strcmp(wm, "copy") ? false : o->info.unified;
    snprintf(o->info.weights, sizeof o->info.weights, "%s", o->map_weights ? "map" : "copy");
    if ((rc = gemm_rows_opt(d, co, &o->gemm_rows)) < 0)
        goto fail;
    o->info.gemm_rows = o->gemm_rows;
    if ((rc = variants(d, o, co)) < 0)
        goto fail;
    char opts[256];
    snprintf(opts, sizeof opts, "-cl-std=%s -DKV_WG=%zu%s%s", o->info.subgroups ? "CL2.0" : "CL1.2",
             wg, o->info.fp16 ? " -DKV_FP16" : "", o->info.subgroups ? " -DKV_SUBGROUPS" : "");
    if ((rc = program(d, co, opts)) < 0)
        goto fail;
    for (int i = 0; i < K_COUNT; i++) {
        o->k[i] = clCreateKernel(o->prog, kernel_names[i], &e);
        if (!o->k[i]) {
            msg(d, "kernel %s: %d", kernel_names[i], (int)e);
            rc = cl_rc(e);
            goto fail;
        }
        /* the reducing kernels run work-groups of exactly wg: the device must take them */
        size_t kwg = 0;
        bool reduces = i == K_MATMUL || i == K_RMSNORM || i == K_L2NORM || i == K_ATTENTION;
        if (reduces && clGetKernelWorkGroupInfo(o->k[i], o->dev, CL_KERNEL_WORK_GROUP_SIZE,
                                                sizeof kwg, &kwg, NULL) == CL_SUCCESS && kwg < wg) {
            msg(d, "OpenCL device %s runs kernel %s in work-groups of at most %zu, below %zu "
                   "(set KV_CL_WG lower)", o->info.device, kernel_names[i], kwg, wg);
            rc = -EINVAL;
            goto fail;
        }
    }
    o->dummy = clCreateBuffer(o->ctx, CL_MEM_READ_WRITE, 16, NULL, &e);
    if (!o->dummy) {
        rc = cl_rc(e);
        goto fail;
    }
    return 0;
fail:
    close_(d);
    return rc;
}

int kern_cl_info(const struct kern_dev *d, struct kern_cl_info *info)
{
    if (!d || strcmp(d->ops->name, "opencl"))
        return -EINVAL;
    *info = OCL(d)->info;
    return 0;
}

static int sync_(struct kern_dev *d) { return cl_rc(clFinish(OCL(d)->q)); }

static size_t zero_scratch(const struct kern_dev *d, uint32_t t, int64_t a, int64_t b)
{
    (void)d, (void)t, (void)a, (void)b;
    return 0;
}
static size_t att_scratch(const struct kern_dev *d, int64_t n_ctx, int hd)
{
    (void)d, (void)n_ctx, (void)hd;
    return 0;
}
static size_t dn_scratch(const struct kern_dev *d, int ds)
{
    (void)d, (void)ds;
    return 0;
}
/* The kernels keep their intermediates in registers and local memory: no scratch. */
static int reserve(struct kern_dev *d, size_t bytes)
{
    (void)d, (void)bytes;
    return 0;
}

/* ---- buffers ---- */

static void buf_free(struct kern_buf *b)
{
    struct cbuf *c = b->impl;
    if (!c)
        return;
    struct ocl *o = OCL(b->dev);
    for (int i = 0; i < c->n; i++) {
        if (c->p[i].mem)
            clReleaseMemObject(c->p[i].mem);
        o->info.weights_mapped -= c->p[i].mapped;
        o->info.weights_copied -= c->p[i].copied;
    }
    cl_mem sp[3] = {c->sp_img, c->sp_d, c->sp_q};
    for (int i = 0; i < 3; i++)
        if (sp[i])
            clReleaseMemObject(sp[i]);
    free(c->p);
    free(c);
    b->impl = NULL;
}

/* Wrap bytes [lo, hi) of src in place: the pointer aligned down to the device's base
 * alignment, and at least 64 (the bytes before it lie in the same page, so they are mapped
 * too), and the length rounded up to 64 bytes (from a 64-byte boundary: still within the last
 * byte's page). NULL (a copy, then) when the bytes are
 * not 16-byte aligned (a kernel's vector reads then keep the alignment an upload gives them;
 * GGUF aligns tensors to 32), the device's alignment is above a page, or the runtime
 * refuses. */
static cl_mem wrap(struct ocl *o, const void *src, size_t lo, size_t hi, size_t *shift,
                   size_t *len)
{
    size_t al = o->info.base_align < 64 ? 64 : o->info.base_align, pg = 4096;
    uintptr_t a = (uintptr_t)src + lo;
    if (al > pg || (al & (al - 1)) || a % 16)
        return NULL;
    *shift = a % al;
    *len = (*shift + (hi - lo) + 63) & ~(size_t)63;
    cl_int e;
    return clCreateBuffer(o->ctx, CL_MEM_READ_ONLY | CL_MEM_USE_HOST_PTR, *len,
                          (void *)(a - *shift), &e);
}

static int add_piece(struct ocl *o, struct cbuf *c, size_t lo, size_t hi, size_t seam,
                     const void *src, cl_mem_flags fl)
{
    cl_int e = CL_SUCCESS;
    struct piece *p = &c->p[c->n];
    *p = (struct piece){.lo = lo, .hi = hi, .seam = seam};
    size_t n = hi > lo ? hi - lo : 1, len = 0;
    if (src && o->map_weights && hi > lo && (p->mem = wrap(o, src, lo, hi, &p->shift, &len)))
        p->mapped = len;
    if (!p->mem) {
        p->shift = 0;
        p->mem = clCreateBuffer(o->ctx, fl | (src ? CL_MEM_COPY_HOST_PTR : 0), n,
                                src ? (void *)((const char *)src + lo) : NULL, &e);
        p->copied = src ? n : 0;
    }
    if (!p->mem)
        return cl_rc(e);
    o->info.weights_mapped += p->mapped;
    o->info.weights_copied += p->copied;
    c->n++;
    if (!src) {
        unsigned char zero = 0;
        return cl_rc(clEnqueueFillBuffer(o->q, p->mem, &zero, 1, 0, n, 0, NULL, NULL));
    }
    return 0;
}

static int buf_new(struct kern_buf *b, const void *src)
{
    struct ocl *o = OCL(b->dev);
    struct cbuf *c = calloc(1, sizeof *c);
    if (!c)
        return -ENOMEM;
    b->impl = c;
    size_t size = b->cap, cap = o->cap;
    int rc = 0;
    if (b->kind != KERN_BUF_WEIGHT || size <= cap) {
        if (size > o->maxalloc) {
            buf_free(b);
            return -ENOMEM;  /* only weights are split (docs/opencl.md, "Caps") */
        }
        c->p = calloc(1, sizeof *c->p);
        rc = !c->p ? -ENOMEM
             : add_piece(o, c, 0, size, 0, src,
                         b->kind == KERN_BUF_WEIGHT ? CL_MEM_READ_ONLY : CL_MEM_READ_WRITE);
        c->n_main = c->n;
    } else {
        size_t nm = (size + cap - 1) / cap, seam = cap / 2 < SEAM_MAX ? cap / 2 : SEAM_MAX;
        c->p = calloc(2 * nm, sizeof *c->p);
        rc = c->p ? 0 : -ENOMEM;
        for (size_t i = 0; i < nm && rc == 0; i++)
            rc = add_piece(o, c, i * cap, (i + 1) * cap < size ? (i + 1) * cap : size, 0, src,
                           CL_MEM_READ_ONLY);
        c->n_main = c->n;
        for (size_t i = 1; i < nm && rc == 0; i++) {
            size_t at = i * cap, hi = at + seam < size ? at + seam : size;
            rc = add_piece(o, c, at - seam, hi, at, src, CL_MEM_READ_ONLY);
        }
    }
    if (rc < 0)
        buf_free(b);
    return rc;
}

int kern_cl_buf_pieces(const struct kern_buf *b)
{
    return b && !strcmp(b->dev->ops->name, "opencl") && b->impl ? ((struct cbuf *)b->impl)->n : 0;
}

bool kern_cl_buf_split(const struct kern_buf *b)
{
    return kern_cl_buf_pieces(b) && ((struct cbuf *)b->impl)->sp_img;
}

static int buf_write(struct kern_buf *b, size_t off, const void *src, size_t n)
{
    struct cbuf *c = b->impl;
    if (!n)
        return 0;
    return cl_rc(clEnqueueWriteBuffer(OCL(b->dev)->q, c->p[0].mem, CL_TRUE, off, n, src, 0, NULL,
                                      NULL));
}

static int buf_read(struct kern_buf *b, size_t off, void *dst, size_t n)
{
    struct cbuf *c = b->impl;
    struct ocl *o = OCL(b->dev);
    if (c->sp_img)
        return -EINVAL;  /* its bytes are the split layout's now */
    for (int i = 0; i < c->n_main && n; i++) {
        struct piece *p = &c->p[i];
        if (off >= p->hi)
            continue;
        size_t k = p->hi - off < n ? p->hi - off : n;
        cl_int e = clEnqueueReadBuffer(o->q, p->mem, CL_TRUE, in_piece(p, off), k, dst, 0, NULL,
                                       NULL);
        if (e != CL_SUCCESS)
            return cl_rc(e);
        off += k, n -= k, dst = (char *)dst + k;
    }
    return cl_rc(clFinish(o->q));
}

/* The piece of a's buffer holding bytes [a.off, a.off + len), NULL when none does (a split
 * weight's operand larger than its seam). */
static const struct piece *piece_of(struct kern_at a, size_t len)
{
    struct cbuf *c = a.buf->impl;
    for (int i = 0; i < c->n; i++)
        if (a.off >= c->p[i].lo && a.off + len <= c->p[i].hi)
            return &c->p[i];
    return NULL;
}

/* ---- kernel arguments and launches ---- */

struct args {
    struct ocl *o;
    cl_kernel k;
    cl_uint i;
    int rc;
};

static struct args args(struct ocl *o, int k) { return (struct args){o, o->k[k], 0, 0}; }

static void arg(struct args *a, size_t size, const void *v)
{
    if (a->rc == 0 && clSetKernelArg(a->k, a->i, size, v) != CL_SUCCESS)
        a->rc = -EIO;
    a->i++;
}
static void a_i(struct args *a, cl_int v) { arg(a, sizeof v, &v); }
static void a_u(struct args *a, int64_t v) { cl_uint x = (cl_uint)v; arg(a, sizeof x, &x); }
static void a_l(struct args *a, uint64_t v) { cl_ulong x = v; arg(a, sizeof x, &x); }
static void a_f(struct args *a, float v) { arg(a, sizeof v, &v); }
static void a_mem(struct args *a, cl_mem m) { arg(a, sizeof m, &m); }

/* Operand at of len bytes as (memory, offset); "no operand" as the dummy. */
static void a_at(struct args *a, struct kern_at at, size_t len)
{
    if (!at.buf) {
        a_mem(a, a->o->dummy);
        a_l(a, 0);
        return;
    }
    const struct piece *p = piece_of(at, len);
    if (!p || !p->mem) {
        if (a->rc == 0)
            a->rc = p ? -EINVAL : -E2BIG;
        a_mem(a, a->o->dummy);
        a_l(a, 0);
        return;
    }
    a_mem(a, p->mem);
    a_l(a, in_piece(p, at.off));
}

static size_t up(size_t n, size_t m) { return (n + m - 1) / m * m; }

/* Runs a's kernel over g0 x g1 x g2 work-items, work-groups of l0 x 1 x 1 (l0 0: the
 * runtime's choice); nothing for an empty range. */
static int launch(struct args *a, size_t g0, size_t g1, size_t g2, size_t l0)
{
    if (a->rc < 0)
        return a->rc;
    if (!g0 || !g1 || !g2)
        return 0;
    size_t g[3] = {l0 ? up(g0, l0) : g0, g1, g2}, l[3] = {l0, 1, 1};
    return cl_rc(clEnqueueNDRangeKernel(a->o->q, a->k, 3, NULL, g, l0 ? l : NULL, 0, NULL, NULL));
}

#define FB(n) ((size_t)(n) * sizeof(float))

/* ---- ops ---- */

static bool type_ok(uint32_t t)
{
    switch (t) {
    case KERN_T_F32: case KERN_T_F16: case KERN_T_BF16: case KERN_T_Q4_0: case KERN_T_Q4_1:
    case KERN_T_Q5_0: case KERN_T_Q5_1: case KERN_T_Q8_0: case KERN_T_Q4_K: case KERN_T_Q5_K:
    case KERN_T_Q6_K:
        return true;
    default:
        return false;
    }
}

/* rows rows of the weight from row r0 at (p, byte offset woff in p). */
static int matmul_run(struct kern_dev *d, uint32_t type, const struct piece *p, size_t woff,
                      size_t rb, int64_t r0, int64_t rows, int64_t cols, struct kern_at x,
                      int64_t n, struct kern_at y, int64_t ys)
{
    struct ocl *o = OCL(d);
    struct args a = args(o, K_MATMUL);
    a_i(&a, (cl_int)type);
    a_mem(&a, p->mem);
    a_l(&a, woff);
    a_l(&a, rb);
    a_u(&a, cols);
    a_at(&a, x, FB(n * cols));
    a_u(&a, n);
    a_at(&a, y, FB(n * ys));
    a_u(&a, ys);
    a_u(&a, r0);
    return launch(&a, (size_t)rows * o->wg, (size_t)(n + NC - 1) / NC, 1, o->wg);
}

/* Buffer c as the split layout for rows of type and cols: made now (on the device, the file's
 * blocks released) when the buffer is whole rows of a Q4_0/Q8_0 matrix in one piece. 1 when
 * c has that layout, 0 when it keeps the plain one, or a negative errno. */
static int split_layout(struct ocl *o, struct cbuf *c, uint32_t type, int64_t cols, size_t size)
{
    if (c->sp_img)
        return c->sp_type == type && c->sp_cols == cols ? 1 : -EINVAL;
    size_t rb = wtype_row_bytes(type, cols);
    if (!o->split_layout || (type != KERN_T_Q4_0 && type != KERN_T_Q8_0) || c->n != 1 ||
        size % rb || size / rb > UINT32_MAX)
        return 0;
    size_t R = size / rb, nb = (size_t)cols / 32, qb = type == KERN_T_Q4_0 ? 16 : 32;
    size_t texels = R * nb * qb / 16;
    if (texels > o->img_max || R * nb * qb > o->maxalloc)
        return 0;
    cl_int e;
    c->sp_d = clCreateBuffer(o->ctx, CL_MEM_READ_WRITE, R * nb * 2, NULL, &e);
    if (c->sp_d)
        c->sp_q = clCreateBuffer(o->ctx, CL_MEM_READ_WRITE, R * nb * qb, NULL, &e);
    struct args a = args(o, K_REPACK);
    a_i(&a, (cl_int)type);
    a_mem(&a, c->p[0].mem);
    a_l(&a, c->p[0].shift);
    a_u(&a, (int64_t)R);
    a_u(&a, (int64_t)nb);
    a_mem(&a, c->sp_d);
    a_mem(&a, c->sp_q);
    int rc = c->sp_q ? launch(&a, R, nb, 1, 0) : cl_rc(e);
    if (rc == 0) {
        cl_image_format fmt = {CL_RGBA, CL_UNSIGNED_INT32};
        cl_image_desc desc = {.image_type = CL_MEM_OBJECT_IMAGE1D_BUFFER, .image_width = texels,
                              .buffer = c->sp_q};
        c->sp_img = clCreateImage(o->ctx, CL_MEM_READ_ONLY, &fmt, &desc, NULL, &e);
        rc = c->sp_img ? 0 : cl_rc(e);
    }
    if (rc < 0) {
        if (c->sp_d)
            clReleaseMemObject(c->sp_d);
        if (c->sp_q)
            clReleaseMemObject(c->sp_q);
        c->sp_d = c->sp_q = NULL;
        return rc;
    }
    /* the file's blocks go once the repack has run (OpenCL keeps them until then) */
    clReleaseMemObject(c->p[0].mem);
    c->p[0].mem = NULL;
    o->info.weights_mapped -= c->p[0].mapped;
    o->info.weights_copied -= c->p[0].copied;
    c->p[0].mapped = c->p[0].copied = 0;
    c->sp_type = type;
    c->sp_rows = (int64_t)R;
    c->sp_cols = cols;
    return 1;
}

static void a_split(struct args *a, const struct cbuf *c)
{
    a_i(a, (cl_int)c->sp_type);
    a_mem(a, c->sp_d);
    a_mem(a, c->sp_img);
    a_u(a, c->sp_rows);
    a_u(a, c->sp_cols / 32);
}

/* The rows of c's weight (rb bytes a row) from byte s, *mp walking c's main pieces forward:
 * a run of whole rows inside one piece (at most want) in *p, or one row across a boundary from
 * its seam piece. The run's rows, or -E2BIG when no seam holds the row. */
static int64_t row_run(const struct cbuf *c, const struct piece **mp, size_t s, size_t rb,
                       int64_t want, const struct piece **p)
{
    while (s >= (*mp)->hi)
        (*mp)++;
    int64_t fit = (int64_t)(((*mp)->hi - s) / rb);
    if (fit > 0) {
        *p = *mp;
        return fit < want ? fit : want;
    }
    for (int i = c->n_main; i < c->n; i++)
        if (c->p[i].seam == (*mp)->hi && s >= c->p[i].lo && s + rb <= c->p[i].hi) {
            *p = &c->p[i];
            return 1;
        }
    return -E2BIG;
}

/* ---- prompt GEMMs through CLBlast (docs/opencl.md, "Prompt GEMMs") ---- */

/* CLBlast's name for a status (its enum's, for the messages). */
static const char *blast_status(int st)
{
    switch (st) {
    case CLBlastTempBufferAllocFailure: return "temporary buffer allocation failure";
    case CLBlastOpenCLOutOfResources: return "OpenCL out of resources";
    case CLBlastOpenCLOutOfHostMemory: return "OpenCL out of host memory";
    case CLBlastOpenCLBuildProgramFailure: return "kernel build failure";
    case CLBlastInvalidValue: return "invalid value";
    case CLBlastInvalidMemObject: return "invalid memory object";
    case CLBlastInvalidLocalThreadsTotal: return "work-group too large";
    case CLBlastNotImplemented: return "not implemented";
    case CLBlastInsufficientMemoryTemp: return "temporary buffer too small";
    case CLBlastInvalidLocalMemUsage: return "not enough local memory";
    case CLBlastUnknownError: return "unknown error";
    case CLBlastUnexpectedError: return "unexpected error";
    default: return "error";
    }
}

/* A GEMM failed: the device keeps to its own kernels from now on, and says why. */
static void gemm_off(struct ocl *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void gemm_off(struct ocl *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(o->info.gemm_error, sizeof o->info.gemm_error, fmt, ap);
    va_end(ap);
    o->gemm_rows = o->info.gemm_rows = 0;
    o->info.gemm_fallbacks++;
}

/* C (n rows of nw, ldc elements apart, from element coff of cm) = A (n x k from element aoff
 * of am) times B^T (nw rows of k from element boff of bm): CLBlast's SGEMM on the device's
 * queue, with gemm_tmp as its temporary buffer. 0, -EAGAIN (what it needs is over the
 * device's largest allocation: the caller's kernels then), or a CLBlast status (negative,
 * not an errno). */
static int sgemm(struct ocl *o, int64_t n, int64_t nw, int64_t k, cl_mem am, size_t aoff,
                 cl_mem bm, size_t boff, cl_mem cm, size_t coff, size_t ldc)
{
    if (o->gemm_fault)
        return o->gemm_fault;
    size_t need = 0;
    CLBlastStatusCode st = CLBlastSGemmTempBufferSize(
        CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeYes, (size_t)n, (size_t)nw,
        (size_t)k, aoff, (size_t)k, boff, (size_t)k, coff, ldc, &o->q, &need);
    if (st != CLBlastSuccess)
        return st;
    need = need ? need : 64;
    if (need > o->maxalloc)
        return -EAGAIN;
    if (need > o->gemm_tmp_bytes) {
        cl_int e;
        cl_mem t = clCreateBuffer(o->ctx, CL_MEM_READ_WRITE, need, NULL, &e);
        if (!t)
            return CLBlastTempBufferAllocFailure;
        if (o->gemm_tmp)
            clReleaseMemObject(o->gemm_tmp);
        o->gemm_tmp = t;
        o->gemm_tmp_bytes = o->info.gemm_tmp_bytes = need;
    }
    return CLBlastSgemmWithTempBuffer(CLBlastLayoutRowMajor, CLBlastTransposeNo,
                                      CLBlastTransposeYes, (size_t)n, (size_t)nw, (size_t)k,
                                      1.0f, am, aoff, (size_t)k, bm, boff, (size_t)k, 0.0f, cm,
                                      coff, ldc, &o->q, NULL, o->gemm_tmp);
}

/* The tile's first rows: nrows weight rows dequantised to f32, from (p, byte offset woff in
 * p) or, on the split layout, from row sr0 of c's matrix. */
static int dequant(struct ocl *o, uint32_t type, const struct cbuf *c, const struct piece *p,
                   size_t woff, size_t rb, int64_t sr0, int64_t nrows, int64_t cols)
{
    struct args a = args(o, p ? K_DEQUANT_ROWS : K_DEQUANT_SPLIT);
    if (p) {
        a_i(&a, (cl_int)type);
        a_mem(&a, p->mem);
        a_l(&a, woff);
        a_l(&a, rb);
        a_u(&a, cols);
    } else {
        a_split(&a, c);
        a_u(&a, sr0);
    }
    a_u(&a, nrows);
    a_mem(&a, o->gemm_tile);
    return launch(&a, (size_t)(cols + 31) / 32, (size_t)nrows, 1, 0);
}

/* The matmul as tiles of weight rows: each tile's rows dequantised into the f32 tile (an F32
 * weight's rows read where they lie), then SGEMM into its columns of y. 0; -EAGAIN when it
 * declines (a row longer than the tile, operands not at whole floats, a temporary buffer over
 * the cap) or CLBlast fails, which turns the GEMMs off (gemm_off) — the fused kernels then
 * compute the whole matmul, overwriting what the tiles wrote; or an OpenCL error. */
static int gemm(struct kern_dev *d, uint32_t type, struct cbuf *c, bool split, struct kern_at w,
                int64_t rows, int64_t cols, struct kern_at x, int64_t n, struct kern_at y)
{
    struct ocl *o = OCL(d);
    size_t rb = wtype_row_bytes(type, cols), rowf = FB(cols);
    if (!o->gemm_tile) {
        size_t bytes = GEMM_TILE_MAX < o->cap ? GEMM_TILE_MAX : o->cap;
        if (bytes < rowf)
            return -EAGAIN;
        cl_int e;
        o->gemm_tile = clCreateBuffer(o->ctx, CL_MEM_READ_WRITE, bytes, NULL, &e);
        if (!o->gemm_tile) {
            gemm_off(o, "the f32 weight tile (%zu bytes): OpenCL error %d", bytes, (int)e);
            return -EAGAIN;
        }
        o->gemm_tile_bytes = o->info.gemm_tile_bytes = bytes;
    }
    int64_t tile = (int64_t)(o->gemm_tile_bytes / rowf);
    const struct piece *xp = piece_of(x, FB(n * cols)), *yp = piece_of(y, FB(n * rows));
    if (tile < 1 || !xp || !yp || !xp->mem || !yp->mem || in_piece(xp, x.off) % 4 ||
        in_piece(yp, y.off) % 4)
        return -EAGAIN;
    size_t aoff = in_piece(xp, x.off) / 4, coff = in_piece(yp, y.off) / 4;
    const struct piece *mp = c->p;
    for (int64_t r = 0; r < rows;) {
        int64_t nw = rows - r < tile ? rows - r : tile;
        const struct piece *p = NULL;
        size_t s = w.off + (size_t)r * rb;
        if (!split) {   /* a run of whole rows inside one piece, or one row from its seam */
            int64_t fit = row_run(c, &mp, s, rb, nw, &p);
            if (fit < 0)
                return (int)fit;
            nw = fit;
        }
        cl_mem bm = o->gemm_tile;
        size_t boff = 0;
        int rc = 0;
        if (p && type == KERN_T_F32 && in_piece(p, s) % 4 == 0) {
            bm = p->mem;
            boff = in_piece(p, s) / 4;
        } else {
            rc = dequant(o, type, c, p, p ? in_piece(p, s) : 0, rb,
                         (int64_t)(w.off / rb) + r, nw, cols);
            if (rc < 0)
                return rc;
        }
        int st = sgemm(o, n, nw, cols, xp->mem, aoff, bm, boff, yp->mem, coff + (size_t)r,
                       (size_t)rows);
        if (st == -EAGAIN)
            return -EAGAIN;
        if (st != CLBlastSuccess) {
            gemm_off(o, "CLBlast SGEMM (%" PRId64 " x %" PRId64 " x %" PRId64 ", %s): status "
                     "%d (%s); the device's own kernels from now on", n, nw, cols,
                     kern_type_name(type), st, blast_status(st));
            return -EAGAIN;
        }
        r += nw;
    }
    o->info.gemm_calls++;
    return 0;
}

static int matmul(struct kern_dev *d, uint32_t type, struct kern_at w, int64_t rows,
                  int64_t cols, struct kern_at x, int64_t n, struct kern_at y)
{
    if (!type_ok(type) || cols <= 0 || rows > UINT32_MAX || n > UINT32_MAX)
        return -EINVAL;
    size_t rb = wtype_row_bytes(type, cols);
    struct cbuf *c = w.buf->impl;
    int sl = split_layout(OCL(d), c, type, cols, w.buf->cap);
    if (sl < 0)
        return sl;
    if (OCL(d)->gemm_rows && n >= OCL(d)->gemm_rows && rows > 0 && (!sl || w.off % rb == 0)) {
        int rc = gemm(d, type, c, sl, w, rows, cols, x, n, y);
        if (rc != -EAGAIN)
            return rc;
    }
    if (sl) {   /* rows from w.off / rb of the split matrix */
        struct ocl *o = OCL(d);
        struct args a = args(o, K_MATMUL_SPLIT);
        a_split(&a, c);
        a_u(&a, (int64_t)(w.off / rb));
        a_u(&a, rows);
        a_u(&a, cols);
        a_at(&a, x, FB(n * cols));
        a_u(&a, n);
        a_at(&a, y, FB(n * rows));
        a_u(&a, rows);
        a_u(&a, 0);
        return w.off % rb ? -EINVAL : launch(&a, (size_t)rows, (size_t)(n + NC - 1) / NC, 1, 0);
    }
    const struct piece *mp = c->p;
    /* Runs of whole rows inside one piece; a row across a boundary from its seam piece. */
    for (int64_t r = 0; r < rows;) {
        size_t s = w.off + (size_t)r * rb;
        const struct piece *p;
        int64_t fit = row_run(c, &mp, s, rb, rows - r, &p);
        if (fit < 0)
            return (int)fit;
        int rc = matmul_run(d, type, p, in_piece(p, s), rb, r, fit, cols, x, n, y, rows);
        if (rc < 0)
            return rc;
        r += fit;
    }
    return 0;
}

static int get_rows(struct kern_dev *d, uint32_t type, struct kern_at table, int64_t rows,
                    int64_t cols, struct kern_at ids, int64_t n, struct kern_at out)
{
    struct ocl *o = OCL(d);
    if (!type_ok(type) || rows > UINT32_MAX || cols > UINT32_MAX)
        return -EINVAL;
    size_t rb = wtype_row_bytes(type, cols);
    struct cbuf *c = table.buf->impl;
    int sl = split_layout(o, c, type, cols, table.buf->cap);
    if (sl < 0)
        return sl;
    if (sl) {
        if (table.off)
            return -EINVAL;
        struct args a = args(o, K_GET_ROWS_SPLIT);
        a_split(&a, c);
        a_at(&a, ids, n * sizeof(int32_t));
        a_at(&a, out, FB(n * cols));
        return launch(&a, (size_t)cols / 32, (size_t)n, 1, 0);
    }
    for (int i = 0; i < c->n; i++) {
        const struct piece *p = &c->p[i];
        if (p->hi <= table.off || p->lo >= table.off + (size_t)rows * rb)
            continue;
        struct args a = args(o, K_GET_ROWS);
        a_i(&a, (cl_int)type);
        /* the kernel's coordinates moved by the shift: a row it reads lies in the allocation
         * (a wrapped piece's rows just before lo are whole there too, and the same bytes) */
        a_mem(&a, p->mem);
        a_l(&a, table.off + p->shift);
        a_l(&a, p->lo);
        a_l(&a, p->hi + p->shift);
        a_l(&a, p->seam ? p->seam + p->shift : 0);
        a_l(&a, rb);
        a_u(&a, rows);
        a_u(&a, cols);
        a_at(&a, ids, n * sizeof(int32_t));
        a_at(&a, out, FB(n * cols));
        int rc = launch(&a, (size_t)(cols + 31) / 32, (size_t)n, 1, 0);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int norm(struct kern_dev *d, struct kern_at out, struct kern_at x, struct kern_at w,
                struct kern_at z, int64_t n, int64_t cols, float eps)
{
    struct ocl *o = OCL(d);
    struct args a = args(o, K_RMSNORM);
    a_at(&a, out, FB(n * cols));
    a_at(&a, x, FB(n * cols));
    a_at(&a, w, FB(cols));
    a_i(&a, w.buf != NULL);
    a_at(&a, z, FB(n * cols));
    a_i(&a, z.buf != NULL);
    a_u(&a, cols);
    a_f(&a, eps);
    return launch(&a, (size_t)n * o->wg, 1, 1, o->wg);
}

static int rmsnorm_rows(struct kern_dev *d, struct kern_at out, struct kern_at x,
                        struct kern_at w, int64_t n_rows, int64_t cols, float eps)
{
    return norm(d, out, x, w, kern_at_make(NULL, 0), n_rows, cols, eps);
}

static int rmsnorm_silu(struct kern_dev *d, struct kern_at out, struct kern_at x,
                        struct kern_at w, struct kern_at z, int64_t n, int64_t cols, float eps)
{
    return norm(d, out, x, w, z, n, cols, eps);
}

static int l2norm(struct kern_dev *d, struct kern_at x, int64_t n, size_t stride, int nh,
                  int dim, float eps)
{
    struct ocl *o = OCL(d);
    struct args a = args(o, K_L2NORM);
    a_at(&a, x, n ? FB((size_t)(n - 1) * stride + (size_t)nh * dim) : 0);
    a_l(&a, stride);
    a_u(&a, nh);
    a_u(&a, dim);
    a_f(&a, eps);
    return launch(&a, (size_t)n * nh * o->wg, 1, 1, o->wg);
}

static int rope_angles(struct kern_dev *d, struct kern_at cs, struct kern_at sn, int64_t n,
                       int64_t pos0, int n_rot, float freq_base, float freq_scale,
                       struct kern_at freq_div)
{
    struct args a = args(OCL(d), K_ROPE_ANGLES);
    int half = n_rot / 2;
    a_at(&a, cs, FB(n * half));
    a_at(&a, sn, FB(n * half));
    a_u(&a, half);
    a_l(&a, (uint64_t)pos0);
    a_f(&a, powf(freq_base, -2.0f / (float)n_rot));
    a_f(&a, freq_scale);
    a_at(&a, freq_div, FB(half));
    a_i(&a, freq_div.buf != NULL);
    return launch(&a, (size_t)half, (size_t)n, 1, 0);
}

static int rope_rows(struct kern_dev *d, struct kern_at x, int64_t n, size_t stride, int n_head,
                     int head_dim, int n_rot, struct kern_at cs, struct kern_at sn, bool neox)
{
    struct args a = args(OCL(d), K_ROPE_ROWS);
    int half = n_rot / 2;
    a_at(&a, x, n ? FB((size_t)(n - 1) * stride + (size_t)n_head * head_dim) : 0);
    a_l(&a, stride);
    a_u(&a, n_head);
    a_u(&a, head_dim);
    a_u(&a, half);
    a_at(&a, cs, FB(n * half));
    a_at(&a, sn, FB(n * half));
    a_i(&a, neox);
    return launch(&a, (size_t)half, (size_t)n_head, (size_t)n, 0);
}

static int kv_store(struct kern_dev *d, uint32_t kv_type, struct kern_at dst, size_t dst_stride,
                    struct kern_at src, int64_t n, int64_t dim)
{
    struct args a = args(OCL(d), K_KV_STORE);
    size_t es = kv_type == KERN_T_F16 ? 2 : 4;
    a_i(&a, kv_type == KERN_T_F16);
    a_at(&a, dst, n ? ((size_t)(n - 1) * dst_stride + (size_t)dim) * es : 0);
    a_l(&a, dst_stride);
    a_at(&a, src, FB(n * dim));
    a_u(&a, dim);
    return launch(&a, (size_t)dim, (size_t)n, 1, 0);
}

static int attention(struct kern_dev *d, uint32_t kv_type, struct kern_at out, struct kern_at q,
                     struct kern_at k, struct kern_at v, int64_t n, int64_t pos0, int n_head,
                     int n_kv_head, int head_dim, size_t kv_stride, float scale)
{
    struct ocl *o = OCL(d);
    if (head_dim > MAXD || (size_t)head_dim > o->wg * (MAXD / 32))
        return -EINVAL;
    size_t es = kv_type == KERN_T_F16 ? 2 : 4, qd = (size_t)n_head * head_dim;
    size_t kvb = ((size_t)(pos0 + n - 1) * kv_stride + (size_t)n_kv_head * head_dim) * es;
    struct args a = args(o, K_ATTENTION);
    a_i(&a, kv_type == KERN_T_F16);
    a_at(&a, out, FB(n * qd));
    a_at(&a, q, FB(n * qd));
    a_at(&a, k, n ? kvb : 0);
    a_at(&a, v, n ? kvb : 0);
    a_l(&a, (uint64_t)pos0);
    a_u(&a, n_head);
    a_u(&a, n_head / n_kv_head);
    a_u(&a, head_dim);
    a_l(&a, kv_stride);
    a_f(&a, scale);
    return launch(&a, (size_t)n * n_head * o->wg, 1, 1, o->wg);
}

static int swiglu(struct kern_dev *d, struct kern_at out, struct kern_at gate, struct kern_at up_,
                  int64_t n)
{
    struct args a = args(OCL(d), K_SWIGLU);
    a_at(&a, out, FB(n));
    a_at(&a, gate, FB(n));
    a_at(&a, up_, FB(n));
    a_l(&a, (uint64_t)n);
    return launch(&a, (size_t)n, 1, 1, 0);
}

static int add_cols(struct kern_dev *d, struct kern_at y, struct kern_at x, int64_t n,
                    int64_t cols)
{
    struct args a = args(OCL(d), K_ADD);
    a_at(&a, y, FB(n));
    a_at(&a, x, FB(cols));
    a_l(&a, (uint64_t)n);
    a_l(&a, (uint64_t)(cols ? cols : 1));
    return launch(&a, (size_t)n, 1, 1, 0);
}

static int add(struct kern_dev *d, struct kern_at y, struct kern_at x, int64_t n)
{
    return add_cols(d, y, x, n, n);
}

static int add_rows(struct kern_dev *d, struct kern_at y, struct kern_at b, int64_t n,
                    int64_t cols)
{
    return add_cols(d, y, b, n * cols, cols);
}

static int axpy_rows(struct kern_dev *d, struct kern_at y, int64_t y_rows, struct kern_at a_,
                     struct kern_at x, struct kern_at idx, int64_t n, int64_t cols)
{
    struct args a = args(OCL(d), K_AXPY_ROWS);
    a_at(&a, y, FB((idx.buf ? y_rows : n) * cols));
    a_u(&a, idx.buf ? y_rows : n);
    a_at(&a, a_, FB(n));
    a_at(&a, x, FB(n * cols));
    a_at(&a, idx, n * sizeof(uint32_t));
    a_i(&a, idx.buf != NULL);
    a_u(&a, n);
    a_u(&a, cols);
    return launch(&a, (size_t)cols, n ? 1 : 0, 1, 0);
}

static int sig(struct kern_dev *d, struct kern_at x, struct kern_at g, int64_t n)
{
    struct args a = args(OCL(d), K_SIGMOID);
    a_at(&a, x, FB(n));
    a_at(&a, g, FB(n));
    a_i(&a, g.buf != NULL);
    a_l(&a, (uint64_t)n);
    return launch(&a, (size_t)n, 1, 1, 0);
}

static int sigmoid(struct kern_dev *d, struct kern_at x, int64_t n)
{
    return sig(d, x, kern_at_make(NULL, 0), n);
}

static int mul_sigmoid(struct kern_dev *d, struct kern_at x, struct kern_at g, int64_t n)
{
    return sig(d, x, g, n);
}

static int conv_silu(struct kern_dev *d, struct kern_at out, struct kern_at x, struct kern_at w,
                     int64_t n, int64_t channels, int kernel)
{
    struct args a = args(OCL(d), K_CONV_SILU);
    a_at(&a, out, FB(n * channels));
    a_at(&a, x, FB((n + kernel - 1) * channels));
    a_at(&a, w, FB(channels * kernel));
    a_u(&a, channels);
    a_i(&a, kernel);
    return launch(&a, (size_t)channels, (size_t)n, 1, 0);
}

static int moe_route(struct kern_dev *d, struct kern_at sel, struct kern_at w,
                     struct kern_at logits, int64_t n, int n_expert, int k)
{
    struct args a = args(OCL(d), K_MOE_ROUTE);
    a_at(&a, sel, n * k * sizeof(uint32_t));
    a_at(&a, w, FB(n * k));
    a_at(&a, logits, FB(n * n_expert));
    a_u(&a, n);
    a_u(&a, n_expert);
    a_u(&a, k);
    return launch(&a, (size_t)n, 1, 1, 0);
}

static int deltanet(struct kern_dev *d, struct kern_at o_, struct kern_at S, struct kern_at q,
                    struct kern_at k, struct kern_at v, size_t stride, struct kern_at beta,
                    struct kern_at alpha, struct kern_at dt_bias, struct kern_at a_, int64_t n,
                    int n_k_head, int n_v_head, int dim)
{
    size_t kd = (size_t)n_k_head * dim, vd = (size_t)n_v_head * dim;
    size_t span = n ? (size_t)(n - 1) * stride : 0;
    struct args a = args(OCL(d), K_DELTANET);
    a_at(&a, o_, FB(n * vd));
    a_at(&a, S, FB(vd * dim));
    a_at(&a, q, n ? FB(span + kd) : 0);
    a_at(&a, k, n ? FB(span + kd) : 0);
    a_at(&a, v, n ? FB(span + vd) : 0);
    a_l(&a, stride);
    a_at(&a, beta, FB(n * n_v_head));
    a_at(&a, alpha, FB(n * n_v_head));
    a_at(&a, dt_bias, FB(n_v_head));
    a_at(&a, a_, FB(n_v_head));
    a_u(&a, n);
    a_u(&a, n_k_head);
    a_u(&a, n_v_head);
    a_u(&a, dim);
    return launch(&a, vd, n ? 1 : 0, 1, 0);
}

static int copy_rows(struct kern_dev *d, struct kern_at dst, size_t dst_stride,
                     struct kern_at src, size_t src_stride, int64_t src_rows,
                     struct kern_at idx, int64_t n, size_t row_bytes)
{
    int64_t sr = idx.buf ? src_rows : n;
    bool words = !((dst.off | dst_stride | src.off | src_stride | row_bytes) & 3);
    struct args a = args(OCL(d), K_COPY_ROWS);
    a_at(&a, dst, n ? (size_t)(n - 1) * dst_stride + row_bytes : 0);
    a_l(&a, dst_stride);
    a_at(&a, src, sr ? (size_t)(sr - 1) * src_stride + row_bytes : 0);
    a_l(&a, src_stride);
    a_u(&a, sr);
    a_at(&a, idx, n * sizeof(uint32_t));
    a_i(&a, idx.buf != NULL);
    a_l(&a, row_bytes);
    a_i(&a, words);
    return launch(&a, words ? row_bytes / 4 : row_bytes, (size_t)n, 1, 0);
}

static int zero(struct kern_dev *d, struct kern_at dst, size_t bytes)
{
    if (!bytes)
        return 0;
    const struct piece *p = piece_of(dst, bytes);
    if (!p)
        return -E2BIG;
    unsigned char z = 0;
    return cl_rc(clEnqueueFillBuffer(OCL(d)->q, p->mem, &z, 1, in_piece(p, dst.off), bytes, 0, NULL,
                                     NULL));
}

/* Row-exact at any number of rows, but where a matmul goes through CLBlast (its sums depend
 * on the shape: docs/opencl.md, "Prompt GEMMs"): below the GEMM threshold. */
static uint32_t rows_exact(const struct kern_dev *d, uint32_t type)
{
    const struct ocl *o = OCL(d);
    return o->gemm_rows && type_ok(type) ? o->gemm_rows - 1 : UINT32_MAX;
}

int kern__cl_gemm_fault(struct kern_dev *d, int status)
{
    if (!d || strcmp(d->ops->name, "opencl"))
        return -EINVAL;
    OCL(d)->gemm_fault = status;
    return 0;
}

double kern_cl_bench_bandwidth(struct kern_dev *d, size_t bytes)
{
    if (!d || strcmp(d->ops->name, "opencl"))
        return 0;
    struct ocl *o = OCL(d);
    bytes = bytes > o->maxalloc ? o->maxalloc : bytes;
    bytes &= ~(size_t)15;
    size_t items = 64 * 1024;
    cl_int e;
    cl_mem src = clCreateBuffer(o->ctx, CL_MEM_READ_ONLY, bytes, NULL, &e);
    cl_mem out = src ? clCreateBuffer(o->ctx, CL_MEM_WRITE_ONLY, items * 4, NULL, &e) : NULL;
    double best = 0;
    unsigned char one = 1;
    if (out && clEnqueueFillBuffer(o->q, src, &one, 1, 0, bytes, 0, NULL, NULL) == CL_SUCCESS &&
        clFinish(o->q) == CL_SUCCESS) {
        for (int rep = 0; rep < 4; rep++) {   /* the first pass warms up */
            struct args a = args(o, K_BW_READ);
            a_mem(&a, src);
            a_l(&a, bytes / 16);
            a_mem(&a, out);
            double t0 = util_now_s();
            if (launch(&a, items, 1, 1, 0) < 0 || clFinish(o->q) != CL_SUCCESS)
                break;
            double gbs = (double)bytes / (util_now_s() - t0) / 1e9;
            if (rep > 0 && gbs > best)
                best = gbs;
        }
    }
    if (out)
        clReleaseMemObject(out);
    if (src)
        clReleaseMemObject(src);
    return best;
}

const struct kern__dev_ops kern__dev_opencl = {
    .name = "opencl", .host = false, .open = open_, .close = close_, .sync = sync_,
    .matmul_scratch = zero_scratch, .attention_scratch = att_scratch,
    .deltanet_scratch = dn_scratch, .reserve = reserve, .buf_new = buf_new,
    .buf_free = buf_free, .buf_write = buf_write, .buf_read = buf_read, .matmul = matmul,
    .rmsnorm_rows = rmsnorm_rows, .rope_angles = rope_angles, .rope_rows = rope_rows,
    .kv_store = kv_store, .attention = attention, .swiglu = swiglu, .add = add,
    .add_rows = add_rows, .axpy_rows = axpy_rows, .sigmoid = sigmoid,
    .mul_sigmoid = mul_sigmoid, .l2norm = l2norm, .rmsnorm_silu = rmsnorm_silu,
    .conv_silu = conv_silu, .moe_route = moe_route, .deltanet = deltanet, .get_rows = get_rows,
    .copy_rows = copy_rows, .zero = zero, .rows_exact = rows_exact,
};

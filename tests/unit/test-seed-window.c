/* test-seed-window.c — the seeder and the pull client in one process: windows pulled from a
 * seeder (identity and zstd) and from a plain range server are byte-identical to the window
 * writer's file (what `kvctl slice` writes); a seeder holding only a window serves what it
 * holds and refuses the rest with 404; bytes transferred for a 1-layer window stay within 1%
 * (+ header) of the window; an interrupted plain pull resumes byte-identical; a corrupted
 * byte at the source fails the pull naming the tensor and leaves nothing at the output;
 * hostile window paths get 4xx. Model: the 8-layer synthetic qwen35moe of the shared data. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <curl/curl.h>
#include <uv.h>

#include "gguf/gguf.h"
#include "ring/ring.h"
#include "seed/seed.h"
#include "net/net.h"
#include "tests/lib/t.h"
#include "util/util.h"

#define FILE_MAX (1u << 30) /* a model or window file read whole */
#include "util/err.h"

static uv_loop_t loop;
static struct net_http_server *srv;
static struct seed_server *seeder;
static uv_async_t stop_async;
static int port;
static char model[512], dir[300], base[64], model_id[65], catalog_path[400];
static volatile uint64_t cut_after = UINT64_MAX; /* plain files: fail reads past this offset */
static volatile int etag_gen;                      /* bumped: the file "changed" */

/* ---- a plain range server for files (stand-in for nginx; the script test uses nginx) */
struct mfile {
    const char *name;
    char path[512];
    uint8_t *map;
    size_t size;
};
static struct mfile files[2] = {{"model.gguf", "", NULL, 0}, {"bad.gguf", "", NULL, 0}};

static ptrdiff_t file_read(void *ud, uint64_t off, void *scratch, size_t max, const void **ptr)
{
    struct mfile *f = ud;
    (void)scratch;
    if (off >= cut_after || off >= f->size)
        return -EIO;
    uint64_t n = f->size - off;
    if (n > max)
        n = max;
    if (cut_after != UINT64_MAX && off + n > cut_after)
        n = cut_after - off;
    *ptr = f->map + off;
    return (ptrdiff_t)n;
}

static void h_file(struct net_http_req *r, void *ud)
{
    const char *name = net_http_req_path(r) + strlen("/files/");
    for (size_t i = 0; i < 2; i++) {
        if (strcmp(name, files[i].name) == 0 && files[i].map) {
            char etag[64];
            snprintf(etag, sizeof etag, "\"f%zu-%zu-%d\"", i, files[i].size, etag_gen);
            struct net_http_body b = {files[i].size, etag, false, file_read, NULL, &files[i]};
            net_http_reply_body(r, 200, "application/octet-stream", NULL, &b);
            return;
        }
    }
    net_http_reply_error(r, 404, "no such file");
}

static void on_stop(uv_async_t *a)
{
    net_http_server_close(srv, NULL, NULL);
    uv_close((uv_handle_t *)&stop_async, NULL);
}

static void *loop_thread(void *arg)
{
    uv_run(&loop, UV_RUN_DEFAULT);
    return NULL;
}

/* ---- helpers */

static bool same_files(const char *a, const char *b)
{
    size_t na, nb;
    char *pa, *pb;
    util_file_read(a, FILE_MAX, &pa, &na, NULL, 0);
    util_file_read(b, FILE_MAX, &pb, &nb, NULL, 0);
    bool ok = pa && pb && na == nb && memcmp(pa, pb, na) == 0;
    free(pa);
    free(pb);
    return ok;
}

/* The reference window: the window writer's file (kvctl slice). */
static int slice(uint32_t first, uint32_t last, const char *out)
{
    struct gguf_file *f;
    char err[KV_ERR_MAX];
    int rc = gguf_file_open(&f, model, err, sizeof err);
    if (rc)
        return rc;
    struct gguf_window_opts o = {first, last, NULL};
    rc = gguf_window_write(f, &o, out, err, sizeof err);
    if (rc)
        fprintf(stderr, "slice: %s\n", err);
    gguf_file_free(f);
    return rc;
}

static int pull(const char *url, uint32_t a, uint32_t b, const char *cat, bool zstd,
                const char *out, struct seed_pull_stats *st, char *err, size_t errlen)
{
    struct seed_pull_opts o = {.url = url, .first = a, .last = b, .catalog_path = cat,
                              .out_path = out, .zstd = zstd, .timeout_s = 10};
    return seed_pull(&o, st, err, errlen);
}

static uint64_t body_sent(void) { return net_http_server_stats(srv)->body_bytes_sent; }

static uint64_t file_size(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 ? (uint64_t)sb.st_size : 0;
}

/* ---- cases */

T_CASE(seeder_windows_identical)
{
    uint32_t w[][2] = {{0, 1}, {3, 4}, {7, 8}, {2, 6}, {0, 8}};
    for (size_t i = 0; i < sizeof w / sizeof *w; i++) {
        char ref[400], got[400], err[KV_ERR_MAX] = "";
        snprintf(ref, sizeof ref, "%s/ref-%u-%u.gguf", dir, w[i][0], w[i][1]);
        snprintf(got, sizeof got, "%s/seed-%u-%u.gguf", dir, w[i][0], w[i][1]);
        T_ASSERT(slice(w[i][0], w[i][1], ref) == 0, "slice");
        struct seed_pull_stats st;
        int rc = pull(base, w[i][0], w[i][1], NULL, i % 2 == 1, got, &st, err, sizeof err);
        T_CHECK(rc == 0, "pull [%u,%u) from the seeder: %s", w[i][0], w[i][1], err);
        T_CHECK(same_files(ref, got), "[%u,%u) byte-identical to the window writer's file",
                w[i][0], w[i][1]);
        char part[420];
        snprintf(part, sizeof part, "%s.part", got);
        T_CHECK(access(part, F_OK) != 0, "no .part left");
    }
}

T_CASE(plain_url_windows_identical_and_bytes)
{
    char url[128];
    snprintf(url, sizeof url, "%s/files/model.gguf", base);
    uint32_t w[][2] = {{0, 1}, {4, 5}, {7, 8}, {1, 7}};
    for (size_t i = 0; i < sizeof w / sizeof *w; i++) {
        char ref[400], got[400], err[KV_ERR_MAX] = "";
        snprintf(ref, sizeof ref, "%s/ref-%u-%u.gguf", dir, w[i][0], w[i][1]);
        snprintf(got, sizeof got, "%s/url-%u-%u.gguf", dir, w[i][0], w[i][1]);
        T_ASSERT(slice(w[i][0], w[i][1], ref) == 0, "slice");
        uint64_t before = body_sent();
        struct seed_pull_stats st;
        int rc = pull(url, w[i][0], w[i][1], catalog_path, false, got, &st, err, sizeof err);
        uint64_t sent = body_sent() - before;
        T_CHECK(rc == 0, "pull [%u,%u) from a URL: %s", w[i][0], w[i][1], err);
        T_CHECK(same_files(ref, got), "[%u,%u) byte-identical", w[i][0], w[i][1]);
        /* the source header is read with growing ranges: at most twice its size */
        struct gguf_file *f;
        T_ASSERT(gguf_file_open(&f, model, err, sizeof err) == 0, "open");
        uint64_t hdr = gguf_file_data_offset(f), wsize = file_size(ref), msize = gguf_file_size(f);
        gguf_file_free(f);
        T_CHECK((double)sent <= 1.01 * (double)wsize + 2.0 * (double)hdr + 65536,
                "[%u,%u): %llu bytes sent for a %llu-byte window (model %llu, header %llu)",
                w[i][0], w[i][1], (unsigned long long)sent, (unsigned long long)wsize,
                (unsigned long long)msize, (unsigned long long)hdr);
        if (w[i][1] - w[i][0] == 1)
            T_CHECK(sent < msize / 3, "a 1-layer window moves far less than the model: %llu",
                    (unsigned long long)sent);
    }
    /* the seeder's counters: one window = its size + the models list and catalog */
    char got[400], err[KV_ERR_MAX] = "", ref[400];
    snprintf(ref, sizeof ref, "%s/ref-4-5.gguf", dir);
    snprintf(got, sizeof got, "%s/seed2-4-5.gguf", dir);
    uint64_t before = body_sent();
    T_CHECK(pull(base, 4, 5, catalog_path, false, got, NULL, err, sizeof err) == 0, "%s", err);
    uint64_t sent = body_sent() - before, wsize = file_size(ref);
    T_CHECK(sent >= wsize && (double)sent <= 1.01 * (double)wsize + 4096,
            "seeder sent %llu for a %llu-byte window", (unsigned long long)sent,
            (unsigned long long)wsize);
}

T_CASE(interrupted_plain_pull_resumes)
{
    char url[128], got[400], ref[400], err[KV_ERR_MAX] = "", statep[440];
    snprintf(url, sizeof url, "%s/files/model.gguf", base);
    snprintf(ref, sizeof ref, "%s/ref-2-6.gguf", dir);
    snprintf(got, sizeof got, "%s/resume-2-6.gguf", dir);
    snprintf(statep, sizeof statep, "%s.part.state", got);
    T_ASSERT(slice(2, 6, ref) == 0, "slice");
    /* cut the source mid-way through the window's tensors */
    struct gguf_file *f;
    T_ASSERT(gguf_file_open(&f, model, err, sizeof err) == 0, "open");
    const struct gguf_tensor *t = gguf_tensor_find(f, "blk.4.attn_norm.weight");
    T_ASSERT(t, "tensor blk.4.attn_norm.weight");
    cut_after = gguf_file_data_offset(f) + t->offset + 100;
    gguf_file_free(f);
    struct seed_pull_stats st;
    int rc = pull(url, 2, 6, catalog_path, false, got, &st, err, sizeof err);
    T_CHECK(rc != 0 && strstr(err, "resume"), "interrupted pull fails saying so: %s", err);
    T_CHECK(access(got, F_OK) != 0, "nothing at the output path");
    T_CHECK(access(statep, F_OK) == 0, "resume state kept");
    cut_after = UINT64_MAX;
    err[0] = 0;
    rc = pull(url, 2, 6, catalog_path, false, got, &st, err, sizeof err);
    T_CHECK(rc == 0, "second pull: %s", err);
    T_CHECK(st.bytes_resumed > 0, "resumed (%llu bytes already there)",
            (unsigned long long)st.bytes_resumed);
    T_CHECK(same_files(ref, got), "resumed window byte-identical");
    T_CHECK(access(statep, F_OK) != 0, "state removed");

    /* the source changes between the interruption and the next run: its new ETag makes the
     * pull start over instead of mixing old and new bytes */
    snprintf(got, sizeof got, "%s/changed-2-6.gguf", dir);
    T_ASSERT(gguf_file_open(&f, model, err, sizeof err) == 0, "open");
    t = gguf_tensor_find(f, "blk.4.attn_norm.weight");
    cut_after = gguf_file_data_offset(f) + t->offset + 100;
    gguf_file_free(f);
    rc = pull(url, 2, 6, catalog_path, false, got, &st, err, sizeof err);
    T_CHECK(rc != 0, "interrupted");
    cut_after = UINT64_MAX;
    etag_gen++;
    err[0] = 0;
    rc = pull(url, 2, 6, catalog_path, false, got, &st, err, sizeof err);
    T_CHECK(rc == 0 && st.bytes_resumed == 0, "a changed source is pulled afresh: %s (resumed %llu)",
            err, (unsigned long long)st.bytes_resumed);
    T_CHECK(same_files(ref, got), "byte-identical");
}

T_CASE(cancelled_pull)
{
    char got[400], err[KV_ERR_MAX] = "";
    snprintf(got, sizeof got, "%s/cancel-0-8.gguf", dir);
    volatile int cancel = 1;
    struct seed_pull_opts o = {.url = base, .first = 0, .last = 8, .out_path = got,
                              .timeout_s = 10, .cancel = &cancel};
    int rc = seed_pull(&o, NULL, err, sizeof err);
    T_CHECK(rc == -ECANCELED && strstr(err, "cancelled"), "cancelled: %d %s", rc, err);
    T_CHECK(access(got, F_OK) != 0, "nothing at the output path");
}

T_CASE(corrupted_source_refused)
{
    char url[128], got[400], err[KV_ERR_MAX] = "";
    snprintf(url, sizeof url, "%s/files/bad.gguf", base);
    snprintf(got, sizeof got, "%s/bad-3-4.gguf", dir);
    int rc = pull(url, 3, 4, catalog_path, false, got, NULL, err, sizeof err);
    T_CHECK(rc != 0 && strstr(err, "blk.3.ffn_gate_inp.weight"), "fails naming the tensor: %s",
            err);
    T_CHECK(access(got, F_OK) != 0, "nothing at the output path");
    char part[420];
    snprintf(part, sizeof part, "%s.part", got);
    T_CHECK(access(part, F_OK) != 0, "the bad bytes are not kept for a resume");
    /* a window that does not contain the bad tensor is fine */
    snprintf(got, sizeof got, "%s/bad-5-6.gguf", dir);
    rc = pull(url, 5, 6, catalog_path, false, got, NULL, err, sizeof err);
    T_CHECK(rc == 0, "another window of the same source: %s", err);
}

static long http_status(const char *path, char *body, size_t blen)
{
    CURL *c = curl_easy_init();
    char url[600];
    snprintf(url, sizeof url, "%s%s", base, path);
    FILE *fp = body ? fmemopen(body, blen, "w") : NULL;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_PATH_AS_IS, 1L);
    if (fp)
        curl_easy_setopt(c, CURLOPT_WRITEDATA, fp);
    else
        curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    long st = 0;
    if (curl_easy_perform(c) == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &st);
    if (fp)
        fclose(fp);
    curl_easy_cleanup(c);
    return st;
}

T_CASE(hostile_and_not_held)
{
    char p[600], body[1024];
    struct { const char *fmt; long want; } cases[] = {
        {"/v1/windows/%s/../../../etc/passwd", 400},
        {"/v1/windows/%s/%%2e%%2e/%%2e%%2e/etc/passwd", 400},
        {"/v1/windows/%s/5-3", 400},
        {"/v1/windows/%s/0-99", 400},
        {"/v1/windows/%s/0-", 400},
        {"/v1/windows/%s/-1-2", 400},
        {"/v1/windows/%s/00000001-2x", 400},
        {"/v1/windows/%s/99999999999-1", 400},
        {"/v1/windows/%s", 400},
        {"/v1/windows/%s/1-2/extra", 400},
        {"/v1/catalog/%s/../x", 400},
        {"//v1/windows/%s/1-2", 400},
        {"/v1/windows/%s/1-2%%00", 400},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(p, sizeof p, cases[i].fmt, model_id);
        memset(body, 0, sizeof body);
        long st = http_status(p, body, sizeof body - 1);
        T_CHECK(st == cases[i].want, "%s -> %ld (%s)", p, st, body);
    }
    long st = http_status("/v1/windows/0000000000000000000000000000000000000000000000000000000000000000/1-2",
                          body, sizeof body - 1);
    T_CHECK(st == 404, "unknown model: %ld", st);
    st = http_status("/etc/passwd", body, sizeof body - 1);
    T_CHECK(st == 404, "no file route: %ld", st);
    snprintf(p, sizeof p, "/v1/windows/%s/0-1", model_id);
    st = http_status(p, NULL, 0);
    T_CHECK(st == 200, "the full model serves [0,1): %ld", st);
    st = http_status("/v1/models", body, sizeof body - 1);
    T_CHECK(st == 200 && strstr(body, model_id), "models list names the model");
    T_CHECK(http_status("/v1/seeder/stats", body, sizeof body - 1) == 200, "stats");
}

/* A second seeder serving only a window file, on its own loop thread. */
static uv_loop_t l2;
static struct net_http_server *s2;
static uv_async_t stop2;
static void on_stop2(uv_async_t *a)
{
    net_http_server_close(s2, NULL, NULL);
    uv_close((uv_handle_t *)&stop2, NULL);
}
static void *loop2_thread(void *arg)
{
    uv_run(&l2, UV_RUN_DEFAULT);
    return NULL;
}

T_CASE(window_holder)
{
    char win[400], err[KV_ERR_MAX] = "";
    snprintf(win, sizeof win, "%s/held-2-5.gguf", dir);
    T_ASSERT(slice(2, 5, win) == 0, "slice");
    uv_loop_init(&l2);
    struct seed_server *sd2;
    T_ASSERT(net_http_server_new(&s2, &l2, NULL) == 0 && seed_server_new(&sd2, s2) == 0, "new");
    char id[65];
    int rc = seed_server_add(sd2, win, NULL, id, err, sizeof err);
    T_CHECK(rc != 0 && strstr(err, "catalog"), "a window without catalog is refused: %s", err);
    rc = seed_server_add(sd2, win, catalog_path, id, err, sizeof err);
    T_CHECK(rc == 0 && strcmp(id, model_id) == 0, "window served under the model id: %s", err);
    T_ASSERT(net_http_server_listen(s2, "127.0.0.1:0") == 0, "listen");
    uv_async_init(&l2, &stop2, on_stop2);
    pthread_t th;
    pthread_create(&th, NULL, loop2_thread, NULL);
    char base2[64], got[400], ref[400];
    snprintf(base2, sizeof base2, "http://127.0.0.1:%d", net_http_server_port(s2));
    snprintf(got, sizeof got, "%s/held-0-1.gguf", dir);
    rc = pull(base2, 0, 1, NULL, false, got, NULL, err, sizeof err);
    T_CHECK(rc != 0 && strstr(err, "[2, 5)"), "layers not held are refused: %s", err);
    /* the raw answer: 404 with the reason */
    CURL *c = curl_easy_init();
    char url[300], body[512] = "";
    snprintf(url, sizeof url, "%s/v1/windows/%s/0-1", base2, model_id);
    FILE *fp = fmemopen(body, sizeof body - 1, "w");
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, fp);
    long st = 0;
    if (curl_easy_perform(c) == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &st);
    fclose(fp);
    curl_easy_cleanup(c);
    T_CHECK(st == 404 && strstr(body, "not held"), "404 with a reason: %ld %s", st, body);
    snprintf(got, sizeof got, "%s/held-3-5.gguf", dir);
    snprintf(ref, sizeof ref, "%s/ref-3-5.gguf", dir);
    T_ASSERT(slice(3, 5, ref) == 0, "slice");
    rc = pull(base2, 3, 5, catalog_path, false, got, NULL, err, sizeof err);
    T_CHECK(rc == 0, "a window of the held window: %s", err);
    T_CHECK(same_files(ref, got), "byte-identical to slicing the full model");
    uv_async_send(&stop2);
    pthread_join(th, NULL);
    seed_server_free(sd2);
    T_CHECK(uv_loop_close(&l2) == 0, "second loop clean");
}

/* ---- fixture: a seeder of the model (and the plain file routes) on a loop of its own */

static pthread_t loop_th;

static int seeder_up(void)
{
    char err[KV_ERR_MAX] = "", id[65];
    uv_loop_init(&loop);
    if (net_http_server_new(&srv, &loop, NULL) || seed_server_new(&seeder, srv) ||
        net_http_server_route(srv, "GET", "/files/*", h_file, NULL) ||
        seed_server_add(seeder, model, NULL, id, err, sizeof err) ||
        net_http_server_listen(srv, "127.0.0.1:0")) {
        fprintf(stderr, "seeder set-up: %s\n", err);
        return -1;
    }
    if (strcmp(id, model_id) != 0) {
        fprintf(stderr, "seeder id %s differs from the catalog's %s\n", id, model_id);
        return -1;
    }
    port = net_http_server_port(srv);
    snprintf(base, sizeof base, "http://127.0.0.1:%d", port);
    uv_async_init(&loop, &stop_async, on_stop);
    return pthread_create(&loop_th, NULL, loop_thread, NULL) == 0 ? 0 : -1;
}

static void seeder_down(void)
{
    uv_async_send(&stop_async);
    pthread_join(loop_th, NULL);
    seed_server_free(seeder);
    T_CHECK(uv_loop_close(&loop) == 0, "loop closes with no handle left");
}

int main(int argc, char **argv)
{
    t_init(argc, argv);
    char rel[] = "models/synth-qwen35moe-bpe1024-q8_0.gguf";
    t_current = "setup";
    if (!t_data_path(model, sizeof model, rel))
        return T_DONE();
    snprintf(dir, sizeof dir, "%s", t_tmpdir());
    curl_global_init(CURL_GLOBAL_DEFAULT);
    /* catalog of the model, and a copy with one byte of blk.3.ffn_gate_inp.weight flipped */
    char err[KV_ERR_MAX] = "";
    struct gguf_file *f;
    struct gguf_catalog *cat;
    if (gguf_file_open(&f, model, err, sizeof err) || gguf_catalog_build(&cat, f, err, sizeof err)) {
        fprintf(stderr, "catalog: %s\n", err);
        return 1;
    }
    snprintf(catalog_path, sizeof catalog_path, "%s/model.catalog.json", dir);
    if (gguf_catalog_save(cat, catalog_path, model_id, err, sizeof err)) {
        fprintf(stderr, "catalog save: %s\n", err);
        return 1;
    }
    const struct gguf_tensor *bt = gguf_tensor_find(f, "blk.3.ffn_gate_inp.weight");
    uint64_t bad_off = bt ? gguf_file_data_offset(f) + bt->offset + bt->size / 2 : 0;
    gguf_catalog_free(cat);
    gguf_file_free(f);
    if (!bad_off) {
        fprintf(stderr, "model has no blk.3.ffn_gate_inp.weight\n");
        return 1;
    }
    snprintf(files[0].path, sizeof files[0].path, "%s", model);
    snprintf(files[1].path, sizeof files[1].path, "%s/bad.gguf", dir);
    size_t n;
    char *bytes;
    util_file_read(model, FILE_MAX, &bytes, &n, NULL, 0);
    if (!bytes || bad_off >= n) {
        fprintf(stderr, "%s: unreadable\n", model);
        return 1;
    }
    bytes[bad_off] ^= 0x01;
    FILE *fp = fopen(files[1].path, "wb");
    fwrite(bytes, 1, n, fp);
    fclose(fp);
    free(bytes);
    for (int i = 0; i < 2; i++) {
        int fd = open(files[i].path, O_RDONLY);
        struct stat sb;
        fstat(fd, &sb);
        files[i].size = (size_t)sb.st_size;
        files[i].map = mmap(NULL, files[i].size, PROT_READ, MAP_SHARED, fd, 0);
        close(fd);
    }

    T_FIXTURE(seeder_up, seeder_down);
    T_RUN(seeder_windows_identical);
    T_RUN(plain_url_windows_identical_and_bytes);
    T_RUN(interrupted_plain_pull_resumes);
    T_RUN(cancelled_pull);
    T_RUN(corrupted_source_refused);
    T_RUN(hostile_and_not_held);
    T_RUN(window_holder);

    for (int i = 0; i < 2; i++)
        munmap(files[i].map, files[i].size);
    curl_global_cleanup();
    return T_DONE();
}

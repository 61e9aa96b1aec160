/* tool-seed-gguf DIR: writes the seed corpus of fuzz-gguf into DIR — the crafted small file of
 * the parser tests (valid and a few broken variants), small writer-made files with every
 * tensor type, odd alignment, nested arrays, and the header bytes of every shared test model
 * ($KV_TESTDATA/models, when present). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>

#include "gguf/gguf.h"
#include "tests/lib/fuzz_seed.h"
#include "tests/lib/gguf_build.h"
#include "util/err.h"
#include "wtype/wtype.h"

static int n_written;

static void put_file(const char *dir, const char *name, const void *p, size_t n)
{
    fuzz_seed_put(dir, name, NULL, 0, p, n);
    n_written++;
}

static void crafted(const char *dir)
{
    struct { const char *name; struct gb_spec s; } v[] = {
        {"small", {0}},
        {"align64", {.set_align = 1, .align = 64}},
        {"v2", {.version = 2}},
        {"dupkey", {.dup_key = 1}},
        {"overlap", {.set_off = 1, .off = 96}},
        {"short", {.data_short = 5}},
        {"blocks", {.set_ne0 = 1, .ne0 = 48}},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        struct util_buf b = gb_small(&v[i].s);
        put_file(dir, v[i].name, b.p, b.len);
        free(b.p);
    }
}

static void made(const char *dir)
{
    char path[1024], err[KV_ERR_MAX];
    static uint8_t zeros[4096];
    for (int variant = 0; variant < 2; variant++) {
        struct gguf_writer *w;
        if (gguf_writer_new(&w))
            exit(1);
        gguf_writer_set_str(w, "general.architecture", "qwen3");
        gguf_writer_set_u32(w, "qwen3.block_count", 2);
        if (variant)
            gguf_writer_set_alignment(w, 128);
        const char *strs[] = {"a", "bc", ""};
        gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", 3, strs);
        int32_t ids[3] = {1, -2, 3};
        gguf_writer_set_arr(w, "x.ids", GGUF_V_I32, 3, ids);
        gguf_writer_set_bool(w, "x.b", true);
        gguf_writer_set_f32(w, "x.f", 0.25f);
        int n = 0;
        for (uint32_t t = 0; t < GGUF_T_COUNT; t++) {
            const struct wtype_info *ti = wtype_info(t);
            if (!ti)
                continue;
            uint64_t ne[2] = {ti->block_elems, 2};
            char name[64];
            snprintf(name, sizeof name, "blk.%d.%s.weight", n % 2, ti->name);
            gguf_writer_add_tensor(w, name, t, 2, ne, zeros);
            n++;
        }
        snprintf(path, sizeof path, "%s/types%d", dir, variant);
        if (gguf_writer_write(w, path, err, sizeof err)) {
            fprintf(stderr, "%s\n", err);
            exit(1);
        }
        gguf_writer_free(w);
        n_written++;
        /* its catalog, as a seed for the catalog JSON parser */
        struct gguf_file *f;
        struct gguf_catalog *c;
        if (gguf_file_open(&f, path, err, sizeof err) == 0) {
            if (gguf_catalog_build(&c, f, err, sizeof err) == 0) {
                char cpath[1100], id[65];
                snprintf(cpath, sizeof cpath, "%s/catalog%d.json", dir, variant);
                if (gguf_catalog_save(c, cpath, id, err, sizeof err) == 0)
                    n_written++;
                gguf_catalog_free(c);
            }
            gguf_file_free(f);
        }
    }
}

static void headers(const char *dir)
{
    const char *root = getenv("KV_TESTDATA");
    char mdir[1024];
    snprintf(mdir, sizeof mdir, "%s/models", root ? root : "../shared/testdata");
    DIR *d = opendir(mdir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 6 || strcmp(e->d_name + l - 5, ".gguf"))
            continue;
        char path[2048], err[KV_ERR_MAX];
        snprintf(path, sizeof path, "%s/%s", mdir, e->d_name);
        struct gguf_file *f;
        if (gguf_file_open(&f, path, err, sizeof err))
            continue;
        uint64_t n = gguf_file_header_len(f);
        gguf_file_free(f);
        if (n > (1u << 20))
            continue;
        FILE *fp = fopen(path, "rb");
        uint8_t *buf = malloc(n);
        if (fp && buf && fread(buf, 1, n, fp) == n) {
            char name[600];
            snprintf(name, sizeof name, "hdr-%s", e->d_name);
            put_file(dir, name, buf, n);
        }
        free(buf);
        if (fp)
            fclose(fp);
    }
    closedir(d);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: tool-seed-gguf DIR\n");
        return 2;
    }
    mkdir(argv[1], 0755);
    crafted(argv[1]);
    made(argv[1]);
    headers(argv[1]);
    printf("%d seeds in %s\n", n_written, argv[1]);
    return 0;
}

/* test-gguf-map: mapping a layer window of a large (64 MiB) synthetic model maps about the
 * window's bytes, not the file (checked in /proc/self/maps), and the views hold the right bytes. */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <sys/stat.h>

#include "gguf/gguf.h"
#include "tests/lib/t.h"
#include "util/err.h"

#define N_LAYERS 8
#define ROW 1024      /* floats per row */
#define ROWS 1024     /* rows per tensor: 4 MiB */

/* Bytes of a tensor depend on its name, so a view at the wrong place is caught. */
static int fill(void *ud, const char *name, void *buf, uint64_t size)
{
    (void)ud;
    uint32_t h = 2166136261u;
    for (const char *p = name; *p; p++)
        h = (h ^ (uint8_t)*p) * 16777619u;
    uint32_t *w = buf;
    for (uint64_t i = 0; i < size / 4; i++)
        w[i] = h + (uint32_t)i;
    return 0;
}

static bool check_bytes(const struct gguf_tensor *t)
{
    uint32_t h = 2166136261u;
    for (const char *p = t->name; *p; p++)
        h = (h ^ (uint8_t)*p) * 16777619u;
    const uint32_t *w = t->data;
    for (uint64_t i = 0; i < t->size / 4; i += 4093)
        if (w[i] != h + (uint32_t)i)
            return false;
    return w[t->size / 4 - 1] == h + (uint32_t)(t->size / 4 - 1);
}

/* Sum of the sizes of this process's mappings of path (from /proc/self/maps). */
static uint64_t mapped_from_proc(const char *path)
{
    FILE *fp = fopen("/proc/self/maps", "r");
    if (!fp)
        return UINT64_MAX;
    char line[1024];
    uint64_t total = 0;
    while (fgets(line, sizeof line, fp)) {
        unsigned long long a, b;
        char *p = strchr(line, '/');
        if (!p || sscanf(line, "%llx-%llx", &a, &b) != 2)
            continue;
        p[strcspn(p, "\n")] = 0;
        if (!strcmp(p, path))
            total += b - a;
    }
    fclose(fp);
    return total;
}

struct win {
    uint32_t first, last;
};

static bool want_window(const struct gguf_tensor *t, void *ud)
{
    const struct win *w = ud;
    return gguf_window_wants(t->name, w->first, w->last, N_LAYERS, N_LAYERS, true);
}

T_CASE(window_maps_only_its_pages)
{
    char path[512], err[KV_ERR_MAX];
    snprintf(path, sizeof path, "%s/big.gguf", t_tmpdir());
    struct gguf_writer *w;
    T_ASSERT(gguf_writer_new(&w) == 0, "writer");
    gguf_writer_set_str(w, "general.architecture", "llama");
    gguf_writer_set_u32(w, "llama.block_count", N_LAYERS);
    gguf_writer_set_alignment(w, 64);
    uint64_t ne[2] = {ROW, ROWS}, ne1[1] = {ROW};
    char name[64];
    T_CHECK(gguf_writer_add_tensor_fill(w, "token_embd.weight", GGUF_T_F32, 2, ne, fill, NULL) == 0, "embd");
    for (int l = 0; l < N_LAYERS; l++) {
        snprintf(name, sizeof name, "blk.%d.attn_norm.weight", l);
        gguf_writer_add_tensor_fill(w, name, GGUF_T_F32, 1, ne1, fill, NULL);
        snprintf(name, sizeof name, "blk.%d.ffn_up.weight", l);
        gguf_writer_add_tensor_fill(w, name, GGUF_T_F32, 2, ne, fill, NULL);
        snprintf(name, sizeof name, "blk.%d.ffn_down.weight", l);
        gguf_writer_add_tensor_fill(w, name, GGUF_T_F32, 2, ne, fill, NULL);
    }
    gguf_writer_add_tensor_fill(w, "output_norm.weight", GGUF_T_F32, 1, ne1, fill, NULL);
    gguf_writer_add_tensor_fill(w, "output.weight", GGUF_T_F32, 2, ne, fill, NULL);
    int rc = gguf_writer_write(w, path, err, sizeof err);
    gguf_writer_free(w);
    T_ASSERT(rc == 0, "write: %s", err);

    struct gguf_file *f;
    T_ASSERT(gguf_file_open(&f, path, err, sizeof err) == 0, "open: %s", err);
    T_CHECK(gguf_file_size(f) > 64ull << 20, "file is %" PRIu64 " bytes", gguf_file_size(f));
    T_CHECK(mapped_from_proc(path) == 0, "nothing mapped after open");

    /* one middle layer: two 4 MiB matrices and a norm, adjacent in the file */
    struct win win = {3, 4};
    T_ASSERT(gguf_file_map_tensors(f, want_window, &win, err, sizeof err) == 0, "map: %s", err);
    uint64_t layer = 2ull * ROW * ROWS * 4 + ROW * 4, page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t got = gguf_file_mapped_bytes(f), proc = mapped_from_proc(path);
    T_CHECK(got >= layer && got <= layer + 2 * page, "mapped %" PRIu64 " for a %" PRIu64 " layer", got, layer);
    T_CHECK(proc == got, "/proc/self/maps shows %" PRIu64 ", the module says %" PRIu64, proc, got);
    T_CHECK(proc < gguf_file_size(f) / 4, "mapped %" PRIu64 " of a %" PRIu64 " file", proc, gguf_file_size(f));
    int mapped = 0;
    for (uint64_t i = 0; i < gguf_tensor_count(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        bool in = want_window(t, &win);
        T_CHECK(in == (t->data != NULL), "%s: mapped %d, wanted %d", t->name, t->data != NULL, in);
        if (t->data) {
            mapped++;
            T_CHECK(check_bytes(t), "%s: wrong bytes in the view", t->name);
        }
    }
    T_CHECK(mapped == 3, "3 tensors mapped, got %d", mapped);

    /* rank 0 of two: token_embd + layers 0..3; a new call replaces the old mappings */
    win = (struct win){0, 4};
    T_ASSERT(gguf_file_map_tensors(f, want_window, &win, err, sizeof err) == 0, "map 2: %s", err);
    uint64_t want = 4 * layer + (uint64_t)ROW * ROWS * 4;
    got = gguf_file_mapped_bytes(f);
    proc = mapped_from_proc(path);
    T_CHECK(got >= want && got <= want + 2 * page * 9, "mapped %" PRIu64 " for %" PRIu64, got, want);
    T_CHECK(proc == got, "/proc shows %" PRIu64 " vs %" PRIu64, proc, got);
    T_CHECK(gguf_tensor_find(f, "blk.3.ffn_up.weight")->data && check_bytes(gguf_tensor_find(f, "blk.3.ffn_up.weight")),
            "view after remap");
    T_CHECK(gguf_tensor_find(f, "output.weight")->data == NULL, "head not mapped on rank 0");
    gguf_file_free(f);
    T_CHECK(mapped_from_proc(path) == 0, "all unmapped after free");
    unlink(path);

    /* a file parsed from memory cannot be mapped */
    struct gguf_file *m;
    uint8_t hdr[24] = {'G', 'G', 'U', 'F', 3};
    T_ASSERT(gguf_file_parse(&m, hdr, sizeof hdr, sizeof hdr, NULL, err, sizeof err) == 0, "%s", err);
    T_CHECK(gguf_file_map_tensors(m, NULL, NULL, err, sizeof err) == -EBADF, "memory parse map refused");
    gguf_file_free(m);
}

int main(int argc, char **argv)
{
    t_init(argc, argv);
    T_RUN(window_maps_only_its_pages);
    return T_DONE();
}

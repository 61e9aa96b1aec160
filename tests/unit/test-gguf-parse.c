/* test-gguf-parse: the GGUF reader on a small crafted file — every value, every broken-file
 * kind the reader must refuse, every truncation point (input against a guard page), the
 * -EAGAIN protocol. */
#include <errno.h>
#include <stdint.h>
#include <sys/mman.h>

#include "gguf/gguf.h"
#include "tests/lib/t.h"
#include "tests/lib/gguf_build.h"
#include "util/err.h"
#include "wtype/wtype.h"

/* Copy n bytes so that they end exactly at a PROT_NONE page: any over-read faults. */
struct guarded {
    uint8_t *base;
    size_t maplen;
    uint8_t *p;
};

static struct guarded guard_copy(const void *src, size_t n)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    size_t pages = (n + pg - 1) / pg + 1;
    struct guarded g;
    g.maplen = pages * pg;
    g.base = mmap(NULL, g.maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (g.base == MAP_FAILED)
        abort();
    mprotect(g.base + (pages - 1) * pg, pg, PROT_NONE);
    g.p = g.base + (pages - 1) * pg - n;
    memcpy(g.p, src, n);
    return g;
}

static void guard_free(struct guarded *g) { munmap(g->base, g->maplen); }

static int parse_bytes(const struct util_buf *b, char *err, struct gguf_file **out)
{
    struct guarded g = guard_copy(b->p, b->len);
    struct gguf_file *f = NULL;
    size_t need = 0;
    int rc = gguf_file_parse(&f, g.p, b->len, b->len, &need, err, KV_ERR_MAX);
    guard_free(&g);
    if (out)
        *out = f;
    else
        gguf_file_free(f);
    return rc;
}

T_CASE(valid_small_file)
{
    struct gb_spec s = {0};
    struct util_buf b = gb_small(&s);
    char err[KV_ERR_MAX];
    struct gguf_file *f;
    int rc = parse_bytes(&b, err, &f);
    T_ASSERT(rc == 0, "rc %d: %s", rc, err);
    T_CHECK(gguf_file_version(f) == 3, "version %u", gguf_file_version(f));
    T_CHECK(gguf_kv_count(f) == 17, "kv %llu", (unsigned long long)gguf_kv_count(f));
    T_CHECK(gguf_tensor_count(f) == 3, "tensors");
    char s1[32];
    T_CHECK(gguf_get_str(f, "general.architecture", s1, sizeof s1) == 0 && !strcmp(s1, "llama"), "arch");
    T_CHECK(gguf_get_str(f, "general.architecture", s1, 5) == -ENAMETOOLONG, "truncation reported");
    uint32_t u32;
    uint64_t u64;
    int64_t i64;
    float fl;
    bool bo;
    T_CHECK(gguf_block_count(f, &u32) == 0 && u32 == 2, "block count");
    T_CHECK(gguf_get_u32(f, "t.u8", &u32) == 0 && u32 == 200, "u8");
    T_CHECK(gguf_get_i64(f, "t.i8", &i64) == 0 && i64 == -5, "i8");
    T_CHECK(gguf_get_u32(f, "t.i8", &u32) == -EINVAL, "negative into u32");
    T_CHECK(gguf_get_u32(f, "t.u16", &u32) == 0 && u32 == 60000, "u16");
    T_CHECK(gguf_get_i64(f, "t.i16", &i64) == 0 && i64 == -300, "i16");
    T_CHECK(gguf_get_i64(f, "t.i32", &i64) == 0 && i64 == -70000, "i32");
    T_CHECK(gguf_get_f32(f, "t.f32", &fl) == 0 && fl == 1.5f, "f32");
    T_CHECK(gguf_get_f32(f, "t.f64", &fl) == 0 && fl == -2.25f, "f64");
    T_CHECK(gguf_get_bool(f, "t.bool", &bo) == 0 && bo, "bool");
    T_CHECK(gguf_get_u64(f, "t.u64", &u64) == 0 && u64 == 1ull << 40, "u64");
    T_CHECK(gguf_get_u32(f, "t.u64", &u32) == -EINVAL, "u64 too big for u32");
    T_CHECK(gguf_get_i64(f, "t.i64", &i64) == 0 && i64 == -(1ll << 40), "i64");
    T_CHECK(gguf_get_u32(f, "nope", &u32) == -ENOENT, "absent");
    T_CHECK(gguf_get_u32(f, "t.str", &u32) == -EINVAL, "string is not an int");
    const struct gguf_value *a;
    T_ASSERT(gguf_get_arr(f, "t.strs", &a) == 0, "strs");
    T_CHECK(a->v.arr.type == GGUF_V_STRING && a->v.arr.n == 3, "strs shape");
    T_CHECK(a->v.arr.items[0].v.str.len == 5 && !memcmp(a->v.arr.items[0].v.str.p, "<unk>", 5), "strs[0]");
    T_CHECK(a->v.arr.items[1].v.str.len == 0, "strs[1] empty");
    T_CHECK(a->v.arr.items[2].v.str.len == 5 && !memcmp(a->v.arr.items[2].v.str.p, "hello", 5), "strs[2]");
    T_ASSERT(gguf_get_arr(f, "t.nested", &a) == 0, "nested");
    T_CHECK(a->v.arr.type == GGUF_V_ARRAY && a->v.arr.n == 2, "nested shape");
    const struct gguf_value *in0 = &a->v.arr.items[0], *in1 = &a->v.arr.items[1];
    T_CHECK(in0->v.arr.type == GGUF_V_I32 && in0->v.arr.n == 2 &&
            ((const uint8_t *)in0->v.arr.data)[4] == 2, "inner 0");
    T_CHECK(in1->v.arr.type == GGUF_V_STRING && in1->v.arr.n == 1 && in1->v.arr.items[0].v.str.p[0] == 'x',
            "inner 1");
    T_ASSERT(gguf_get_arr(f, "t.f32s", &a) == 0, "f32s");
    float fv[2];
    memcpy(fv, a->v.arr.data, 8);
    T_CHECK(fv[0] == 0.5f && fv[1] == -1.0f, "f32 array");
    T_ASSERT(gguf_get_arr(f, "t.empty", &a) == 0 && a->v.arr.n == 0, "empty array");

    const struct gguf_tensor *t = gguf_tensor_find(f, "blk.1.attn_k.weight");
    T_ASSERT(t, "tensor by name");
    T_CHECK(t->type == GGUF_T_Q8_0 && t->ne[0] == 64 && t->ne[1] == 2 && t->ne[2] == 1 && t->size == 136,
            "q8_0 tensor %u %llu", t->type, (unsigned long long)t->size);
    T_CHECK(t->offset == 128, "offset");
    T_CHECK(gguf_tensor_find(f, "nope") == NULL, "absent tensor");
    T_CHECK(gguf_tensor_layer("blk.1.attn_k.weight") == 1 && gguf_tensor_layer("blk.17.x") == 17 &&
            gguf_tensor_layer("output.weight") == -1 && gguf_tensor_layer("blk.x") == -1 &&
            gguf_tensor_layer("blk.3") == -1, "tensor layer");
    T_CHECK(gguf_file_data_offset(f) % 32 == 0 && gguf_file_data_offset(f) >= gguf_file_header_len(f),
            "data offset aligned");
    gguf_file_free(f);
    free(b.p);
}

T_CASE(type_table)
{
    static const struct { uint32_t t; uint32_t be, bb; } want[] = {
        {GGUF_T_F32, 1, 4}, {GGUF_T_F16, 1, 2}, {GGUF_T_BF16, 1, 2}, {GGUF_T_Q4_0, 32, 18},
        {GGUF_T_Q4_1, 32, 20}, {GGUF_T_Q5_0, 32, 22}, {GGUF_T_Q5_1, 32, 24}, {GGUF_T_Q8_0, 32, 34},
        {GGUF_T_Q2_K, 256, 84}, {GGUF_T_Q3_K, 256, 110}, {GGUF_T_Q4_K, 256, 144},
        {GGUF_T_Q5_K, 256, 176}, {GGUF_T_Q6_K, 256, 210}, {GGUF_T_Q8_K, 256, 292},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const struct wtype_info *ti = wtype_info(want[i].t);
        T_ASSERT(ti, "type %u missing", want[i].t);
        T_CHECK(ti->block_elems == want[i].be && ti->block_bytes == want[i].bb, "type %s", ti->name);
        T_CHECK(wtype_by_name(ti->name) == (int)want[i].t, "by name %s", ti->name);
    }
    uint64_t n;
    T_CHECK(wtype_bytes(GGUF_T_Q4_K, 512, &n) == 0 && n == 288, "q4_k bytes");
    T_CHECK(wtype_bytes(GGUF_T_Q4_K, 100, &n) == -EINVAL, "not a block multiple");
    T_CHECK(wtype_bytes(GGUF_T_F32, UINT64_MAX / 2, &n) == -EOVERFLOW, "overflow");
    T_CHECK(wtype_info(4) == NULL && wtype_info(1000) == NULL, "unknown ids");
    T_CHECK(wtype_by_name("Q8_0") == GGUF_T_Q8_0 && wtype_by_name("zz") == -1, "names");
}

/* A broken file must fail with a message containing `frag`. */
static void expect_fail(const char *what, const struct gb_spec *s, const char *frag)
{
    struct util_buf b = gb_small(s);
    char err[KV_ERR_MAX] = "";
    int rc = parse_bytes(&b, err, NULL);
    T_CHECK(rc < 0 && rc != -EAGAIN, "%s: rc %d", what, rc);
    T_CHECK(strstr(err, frag) != NULL, "%s: message '%s' lacks '%s'", what, err, frag);
    free(b.p);
}

T_CASE(broken_files)
{
    expect_fail("bad magic", &(struct gb_spec){.magic = 0x46554748}, "magic");
    expect_fail("version 1", &(struct gb_spec){.version = 1}, "version 1 is not supported");
    expect_fail("future version", &(struct gb_spec){.version = 4}, "version: 4");
    expect_fail("huge tensor count", &(struct gb_spec){.set_n_tensors = 1, .n_tensors = 1ull << 40}, "exceeds cap");
    expect_fail("negative tensor count", &(struct gb_spec){.set_n_tensors = 1, .n_tensors = UINT64_MAX}, "tensor count");
    expect_fail("huge key count", &(struct gb_spec){.set_n_kv = 1, .n_kv = 1ull << 40}, "metadata key count");
    expect_fail("negative key count", &(struct gb_spec){.set_n_kv = 1, .n_kv = (uint64_t)-3}, "exceeds cap");
    expect_fail("more keys than present", &(struct gb_spec){.set_n_kv = 1, .n_kv = 1000}, "key 18");
    expect_fail("more tensors than present", &(struct gb_spec){.set_n_tensors = 1, .n_tensors = 1000}, "tensor");
    expect_fail("key length past end", &(struct gb_spec){.key_len_extra = 60000}, "truncated");
    expect_fail("key length huge", &(struct gb_spec){.key_len_extra = 1 << 30}, "exceeds cap");
    expect_fail("bad value type", &(struct gb_spec){.bad_vtype = 13}, "value type 13 unknown");
    expect_fail("duplicate key", &(struct gb_spec){.dup_key = 1}, "duplicate key");
    expect_fail("alignment not a power of two", &(struct gb_spec){.set_align = 1, .align = 48}, "general.alignment: 48");
    expect_fail("alignment zero", &(struct gb_spec){.set_align = 1, .align = 0}, "general.alignment: 0");
    expect_fail("alignment wrong type", &(struct gb_spec){.set_align = 1, .align = 64, .align_vtype = 5}, "must be u32");
    expect_fail("too many dims", &(struct gb_spec){.set_ndims = 1, .ndims = 5}, "n_dims 5");
    expect_fail("zero dims", &(struct gb_spec){.set_ndims = 1, .ndims = 0}, "n_dims 0");
    expect_fail("zero dim", &(struct gb_spec){.set_dim = 1, .dim = 0}, "dim 1 is 0");
    expect_fail("huge dim", &(struct gb_spec){.set_dim = 1, .dim = 1ull << 63}, "dim 1 is");
    expect_fail("dims overflow", &(struct gb_spec){.set_ndims = 1, .ndims = 4, .set_dim = 1, .dim = 1ull << 62},
                "overflow");
    expect_fail("size overflow", &(struct gb_spec){.set_dim = 1, .dim = 1ull << 59}, "overflow");
    expect_fail("not a block multiple", &(struct gb_spec){.set_ne0 = 1, .ne0 = 48}, "not a multiple of the q8_0 block size 32");
    expect_fail("bad type id", &(struct gb_spec){.set_type = 1, .type = 4}, "type id 4 unknown");
    expect_fail("bad type id big", &(struct gb_spec){.set_type = 1, .type = 0xffffffff}, "unknown");
    expect_fail("misaligned offset", &(struct gb_spec){.set_off = 1, .off = 130}, "offset 130 is not a multiple");
    expect_fail("offset past end", &(struct gb_spec){.set_off = 1, .off = 1 << 20}, "past the end");
    expect_fail("offset overflow", &(struct gb_spec){.set_off = 1, .off = UINT64_MAX - 31}, "overflows");
    expect_fail("overlap", &(struct gb_spec){.set_off = 1, .off = 96}, "overlap");
    expect_fail("duplicate tensor name", &(struct gb_spec){.dup_name = 1}, "duplicate tensor name");
    expect_fail("data section short", &(struct gb_spec){.data_short = 5}, "data section shorter");
    /* sanity: a non-default valid alignment is accepted */
    struct util_buf b = gb_small(&(struct gb_spec){.set_align = 1, .align = 64});
    char err[KV_ERR_MAX];
    struct gguf_file *f;
    T_CHECK(parse_bytes(&b, err, &f) == 0, "align 64: %s", err);
    if (f) {
        T_CHECK(gguf_file_alignment(f) == 64 && gguf_file_data_offset(f) % 64 == 0, "align 64 used");
        T_CHECK(gguf_tensor_find(f, "output_norm.weight")->offset % 64 == 0, "aligned offsets");
    }
    gguf_file_free(f);
    free(b.p);
}

T_CASE(every_truncation_point)
{
    struct gb_spec s = {0};
    struct util_buf b = gb_small(&s);
    char err[KV_ERR_MAX];
    int fails = 0;
    for (size_t len = 0; len < b.len; len++) {
        struct guarded g = guard_copy(b.p, len);
        struct gguf_file *f = NULL;
        size_t need = 0;
        /* known file size = the cut: always an error, never success or EAGAIN */
        int rc = gguf_file_parse(&f, g.p, len, len, &need, err, sizeof err);
        if (rc == 0 || rc == -EAGAIN || f) {
            if (fails++ < 5)
                T_CHECK(0, "cut at %zu: rc %d", len, rc);
        }
        gguf_file_free(f);
        f = NULL;
        /* unknown file size: the header part says "need more", the data part parses */
        rc = gguf_file_parse(&f, g.p, len, UINT64_MAX, &need, err, sizeof err);
        if (rc == -EAGAIN) {
            if (need <= len || need > b.len) {
                if (fails++ < 5)
                    T_CHECK(0, "cut at %zu: need %zu", len, need);
            }
        } else if (rc != 0) {
            if (fails++ < 5)
                T_CHECK(0, "cut at %zu unknown size: rc %d %s", len, rc, err);
        }
        gguf_file_free(f);
        guard_free(&g);
    }
    T_CHECK(fails == 0, "%d truncation failures", fails);
    /* growing to the reported need converges */
    size_t len = 8, need = 0, rounds = 0;
    struct gguf_file *f = NULL;
    int rc;
    while ((rc = gguf_file_parse(&f, b.p, len, b.len, &need, err, sizeof err)) == -EAGAIN) {
        T_ASSERT(need > len && need <= b.len, "need %zu at len %zu", need, len);
        len = need;
        rounds++;
    }
    T_CHECK(rc == 0 && rounds > 3, "grow: rc %d rounds %zu %s", rc, rounds, err);
    gguf_file_free(f);
    free(b.p);
}

T_CASE(copy_is_independent)
{
    struct gb_spec s = {0};
    struct util_buf b = gb_small(&s);
    char err[KV_ERR_MAX];
    struct gguf_file *f;
    T_ASSERT(gguf_file_parse(&f, b.p, b.len, b.len, NULL, err, sizeof err) == 0, "%s", err);
    memset(b.p, 0xAA, b.len);
    free(b.p);
    const struct gguf_value *a;
    T_ASSERT(gguf_get_arr(f, "t.strs", &a) == 0, "strs");
    T_CHECK(!memcmp(a->v.arr.items[2].v.str.p, "hello", 5), "string survives the caller's buffer");
    char s1[32];
    T_CHECK(gguf_get_str(f, "t.str", s1, sizeof s1) == 0 && !strcmp(s1, "a string"), "str");
    gguf_file_free(f);
}

/* A header whose index would take more memory than GGUF_MAX_MEMORY is refused before the
 * allocation: 14M empty strings are 112 MB of file but 560 MB of index. */
T_CASE(memory_cap)
{
    uint64_t n = 14000000;
    struct util_buf b = {0};
    gb_u32(&b, 0x46554747u);
    gb_u32(&b, 3);
    gb_u64(&b, 0);
    gb_u64(&b, 1);
    gb_str(&b, "a.b");
    gb_u32(&b, 9);
    gb_u32(&b, 8);
    gb_u64(&b, n);
    size_t len = b.len + n * 8;
    uint8_t *buf = calloc(1, len); /* zero pages: the empty strings' lengths */
    T_ASSERT(buf, "calloc");
    memcpy(buf, b.p, b.len);
    char err[KV_ERR_MAX];
    struct gguf_file *f = NULL;
    int rc = gguf_file_parse(&f, buf, len, len, NULL, err, sizeof err);
    T_CHECK(rc == -ENOMEM && strstr(err, "bytes of memory (cap)") && strstr(err, "a.b"), "rc %d: %s", rc, err);
    T_CHECK(f == NULL, "no file object");
    free(buf);
    free(b.p);
}

int main(int argc, char **argv)
{
    t_init(argc, argv);
    T_RUN(valid_small_file);
    T_RUN(type_table);
    T_RUN(broken_files);
    T_RUN(every_truncation_point);
    T_RUN(copy_is_independent);
    T_RUN(memory_cap);
    return T_DONE();
}

/* gguf_build.h — tests only: a raw GGUF byte builder that can write broken files on purpose
 * (the real writer refuses to), and the "small valid file" the parser tests mutate. */
#ifndef KV_TESTS_GGUF_BUILD_H
#define KV_TESTS_GGUF_BUILD_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"

/* The bytes go in a util_buf; a test that cannot allocate stops. */
static inline void gb_put(struct util_buf *b, const void *p, size_t n)
{
    if (util_buf_append(b, p, n, SIZE_MAX) < 0)
        abort();
}
static inline void gb_u8(struct util_buf *b, uint8_t v) { gb_put(b, &v, 1); }
static inline void gb_u16(struct util_buf *b, uint16_t v) { uint8_t x[2] = {(uint8_t)v, (uint8_t)(v >> 8)}; gb_put(b, x, 2); }
static inline void gb_u32(struct util_buf *b, uint32_t v)
{
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    gb_put(b, x, 4);
}
static inline void gb_u64(struct util_buf *b, uint64_t v) { gb_u32(b, (uint32_t)v); gb_u32(b, (uint32_t)(v >> 32)); }
static inline void gb_f32(struct util_buf *b, float f) { uint32_t u; memcpy(&u, &f, 4); gb_u32(b, u); }
static inline void gb_str(struct util_buf *b, const char *s) { gb_u64(b, strlen(s)); gb_put(b, s, strlen(s)); }
static inline void gb_pad(struct util_buf *b, size_t a) { while (b->len % a) gb_u8(b, 0); }

/* Knobs for the small test file; zero values mean "valid default". */
struct gb_spec {
    uint32_t magic, version;
    int set_n_tensors; uint64_t n_tensors;
    int set_n_kv; uint64_t n_kv;
    int key_len_extra;        /* add to the first key's declared length */
    int bad_vtype;            /* value type of the first key */
    int dup_key;              /* repeat the first key */
    int set_align; uint32_t align; uint32_t align_vtype;
    int set_ndims; uint32_t ndims;      /* of tensor 0 */
    int set_dim; uint64_t dim;          /* ne[1] of tensor 0 */
    int set_ne0; uint64_t ne0;          /* ne[0] of tensor 1 (q8_0) */
    int set_type; uint32_t type;        /* of tensor 0 */
    int set_off; uint64_t off;          /* offset of tensor 1 */
    int dup_name;             /* tensor 1 named like tensor 0 */
    int data_short;           /* bytes cut from the end of the data section */
};

/* A small valid GGUF (v3): every value type, a string array, a nested array, three tensors
 * (f32 [8,4], q8_0 [64,2], f16 [16]) with patterned data. */
static inline struct util_buf gb_small(const struct gb_spec *s)
{
    struct util_buf b = {0};
    uint32_t align = s->set_align && s->align && !(s->align & (s->align - 1)) ? s->align : 32;
    gb_u32(&b, s->magic ? s->magic : 0x46554747u);
    gb_u32(&b, s->version ? s->version : 3);
    gb_u64(&b, s->set_n_tensors ? s->n_tensors : 3);
    uint64_t nkv = 17 + (s->dup_key ? 1 : 0) + (s->set_align ? 1 : 0);
    gb_u64(&b, s->set_n_kv ? s->n_kv : nkv);
    /* key 0 */
    gb_u64(&b, strlen("general.architecture") + (uint64_t)(int64_t)s->key_len_extra);
    gb_put(&b, "general.architecture", strlen("general.architecture"));
    gb_u32(&b, s->bad_vtype ? (uint32_t)s->bad_vtype : 8);
    gb_str(&b, "llama");
    if (s->dup_key) { gb_str(&b, "general.architecture"); gb_u32(&b, 8); gb_str(&b, "llama"); }
    if (s->set_align) {
        gb_str(&b, "general.alignment");
        gb_u32(&b, s->align_vtype ? s->align_vtype : 4);
        gb_u32(&b, s->align);
    }
    gb_str(&b, "llama.block_count"); gb_u32(&b, 4); gb_u32(&b, 2);
    gb_str(&b, "t.u8"); gb_u32(&b, 0); gb_u8(&b, 200);
    gb_str(&b, "t.i8"); gb_u32(&b, 1); gb_u8(&b, (uint8_t)-5);
    gb_str(&b, "t.u16"); gb_u32(&b, 2); gb_u16(&b, 60000);
    gb_str(&b, "t.i16"); gb_u32(&b, 3); gb_u16(&b, (uint16_t)-300);
    gb_str(&b, "t.i32"); gb_u32(&b, 5); gb_u32(&b, (uint32_t)-70000);
    gb_str(&b, "t.f32"); gb_u32(&b, 6); gb_f32(&b, 1.5f);
    gb_str(&b, "t.bool"); gb_u32(&b, 7); gb_u8(&b, 1);
    gb_str(&b, "t.u64"); gb_u32(&b, 10); gb_u64(&b, 1ull << 40);
    gb_str(&b, "t.i64"); gb_u32(&b, 11); gb_u64(&b, (uint64_t)-(1ll << 40));
    gb_str(&b, "t.f64"); gb_u32(&b, 12); { double d = -2.25; uint64_t u; memcpy(&u, &d, 8); gb_u64(&b, u); }
    gb_str(&b, "t.strs"); gb_u32(&b, 9); gb_u32(&b, 8); gb_u64(&b, 3);
    gb_str(&b, "<unk>"); gb_str(&b, ""); gb_str(&b, "hello");
    gb_str(&b, "t.nested"); gb_u32(&b, 9); gb_u32(&b, 9); gb_u64(&b, 2);
    gb_u32(&b, 5); gb_u64(&b, 2); gb_u32(&b, 1); gb_u32(&b, 2);
    gb_u32(&b, 8); gb_u64(&b, 1); gb_str(&b, "x");
    gb_str(&b, "t.f32s"); gb_u32(&b, 9); gb_u32(&b, 6); gb_u64(&b, 2); gb_f32(&b, 0.5f); gb_f32(&b, -1.0f);
    gb_str(&b, "t.empty"); gb_u32(&b, 9); gb_u32(&b, 8); gb_u64(&b, 0);
    gb_str(&b, "t.str"); gb_u32(&b, 8); gb_str(&b, "a string");
    /* tensors: f32 [8,4] (128 B), q8_0 [64,2] (136 B), f16 [16] (32 B) */
    uint64_t off1 = 128, off2 = 128 + 136;
    off2 = (off2 + align - 1) / align * align;
    off1 = (off1 + align - 1) / align * align;
    gb_str(&b, "blk.0.attn_q.weight");
    gb_u32(&b, s->set_ndims ? s->ndims : 2);
    uint32_t nd = s->set_ndims ? s->ndims : 2;
    for (uint32_t d = 0; d < nd; d++)
        gb_u64(&b, d == 0 ? 8 : d == 1 ? (s->set_dim ? s->dim : 4) : 1);
    gb_u32(&b, s->set_type ? s->type : 0);
    gb_u64(&b, 0);
    gb_str(&b, s->dup_name ? "blk.0.attn_q.weight" : "blk.1.attn_k.weight");
    gb_u32(&b, 2); gb_u64(&b, s->set_ne0 ? s->ne0 : 64); gb_u64(&b, 2); gb_u32(&b, 8);
    gb_u64(&b, s->set_off ? s->off : off1);
    gb_str(&b, "output_norm.weight");
    gb_u32(&b, 1); gb_u64(&b, 16); gb_u32(&b, 1); gb_u64(&b, off2);
    gb_pad(&b, align);
    size_t data0 = b.len;
    size_t total = off2 + 32;
    for (size_t i = 0; i < total; i++)
        gb_u8(&b, (uint8_t)(i * 7 + 3));
    (void)data0;
    if (s->data_short && (size_t)s->data_short <= b.len)
        b.len -= (size_t)s->data_short;
    return b;
}

#endif

/* The type-traits table: per kern_type its name, block size and bytes, whether the matmuls
 * take it as a weight, the activation type its dot consumes, and its reference dequantiser,
 * quantiser and dot (ref_quant.c, ref_dot.c). Every per-type question of the module is
 * answered here. */
#include <errno.h>

#include "kernels/internal.h"

#define PLAIN(t, T, bytes, exact) \
    [KERN_T_##T] = {#t, 1, bytes, false, true, KERN_T_##T, kern__dequant_##t, kern__quant_##t, \
                    kern__dot_##t, exact}
/* A quantised weight type (vt: its activation type; exact: rows_exact) and an activation-only
 * one. Row-exact are the types whose multi-row dots repeat the one-row dot's floating-point
 * operations per row at every SIMD level (tests/test-kern-cpu matmul_rows_exact, and whole
 * windows in tests/test-model-batch): today every weight type. */
#define QUANT(t, T, elems, vt, exact) \
    [KERN_T_##T] = {#t, elems, sizeof(struct kern_block_##t), true, true, KERN_T_##vt, \
                    kern__dequant_##t, kern__quant_##t, kern__dot_##t, exact}
#define ACT(t, T, elems) \
    [KERN_T_##T] = {#t, elems, sizeof(struct kern_block_##t), true, false, KERN_T_F32, \
                    kern__dequant_##t, kern__quant_##t, NULL, false}
/* Known sizes, no kernels. */
#define SIZE_ONLY(t, T, elems) \
    [KERN_T_##T] = {#t, elems, sizeof(struct kern_block_##t), true, false, KERN_T_F32, NULL, \
                    NULL, NULL, false}

static const struct kern__type_traits traits[KERN_T_COUNT] = {
    PLAIN(f32, F32, 4, true),
    PLAIN(f16, F16, 2, true),
    PLAIN(bf16, BF16, 2, true),
    QUANT(q4_0, Q4_0, KERN_QK, Q8_0, true),
    QUANT(q4_1, Q4_1, KERN_QK, Q8_1, true),
    QUANT(q5_0, Q5_0, KERN_QK, Q8_0, true),
    QUANT(q5_1, Q5_1, KERN_QK, Q8_1, true),
    QUANT(q8_0, Q8_0, KERN_QK, Q8_0, true),
    ACT(q8_1, Q8_1, KERN_QK),
    SIZE_ONLY(q2_K, Q2_K, KERN_QK_K),
    SIZE_ONLY(q3_K, Q3_K, KERN_QK_K),
    QUANT(q4_K, Q4_K, KERN_QK_K, Q8_K, true),
    QUANT(q5_K, Q5_K, KERN_QK_K, Q8_K, true),
    QUANT(q6_K, Q6_K, KERN_QK_K, Q8_K, true),
    ACT(q8_K, Q8_K, KERN_QK_K),
};

const struct kern__type_traits *kern__type_traits(uint32_t type)
{
    return type < KERN_T_COUNT && traits[type].name ? &traits[type] : NULL;
}

const char *kern_type_name(uint32_t type)
{
    const struct kern__type_traits *t = kern__type_traits(type);
    return t ? t->name : NULL;
}

bool kern_type_supported(uint32_t type)
{
    const struct kern__type_traits *t = kern__type_traits(type);
    return t && t->weight;
}

bool kern_type_rows_exact(uint32_t type)
{
    const struct kern__type_traits *t = kern__type_traits(type);
    return t && t->weight && t->rows_exact;
}

uint32_t kern_block_elems(uint32_t type)
{
    const struct kern__type_traits *t = kern__type_traits(type);
    return t ? t->blck_size : 0;
}

uint32_t kern_block_bytes(uint32_t type)
{
    const struct kern__type_traits *t = kern__type_traits(type);
    return t ? t->type_size : 0;
}

size_t kern_row_bytes(uint32_t type, int64_t cols)
{
    const struct kern__type_traits *t = kern__type_traits(type);
    if (!t || cols < 0 || cols % t->blck_size != 0)
        return 0;
    uint64_t nb = (uint64_t)cols / t->blck_size;
    if (nb > SIZE_MAX / t->type_size)
        return 0;
    return (size_t)nb * t->type_size;
}

int kern_ref_dequant_row(uint32_t type, const void *src, float *dst, int64_t n)
{
    const struct kern__type_traits *t = kern__type_traits(type);
    if (!t || n < 0 || n % t->blck_size != 0)
        return -EINVAL;
    if (!t->to_float)
        return -ENOTSUP;
    t->to_float(src, dst, n / t->blck_size);
    return 0;
}

int kern_ref_quant_row(uint32_t type, const float *src, void *dst, int64_t n)
{
    const struct kern__type_traits *t = kern__type_traits(type);
    if (!t || n < 0 || n % t->blck_size != 0)
        return -EINVAL;
    if (!t->from_float_ref)
        return -ENOTSUP;
    t->from_float_ref(src, dst, n / t->blck_size);
    return 0;
}

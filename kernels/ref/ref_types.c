/* The type-traits table: per kern_type whether the matmuls take it as a weight, the
 * activation type its dot consumes, and its reference dequantiser, quantiser and dot
 * (ref_quant.c, ref_dot.c). Names and block sizes are the weight-type table's (wtype/). */
#include <errno.h>

#include "kernels/internal.h"

static_assert(KERN_T_COUNT == WTYPE_COUNT, "kernel type ids are wtype's");

#define PLAIN(t, T, exact) \
    [KERN_T_##T] = {true, true, KERN_T_##T, kern__dequant_##t, kern__quant_##t, kern__dot_##t, exact}
/* A quantised weight type (vt: its activation type; exact: rows_exact) and an activation-only
 * one. Row-exact are the types whose multi-row dots repeat the one-row dot's floating-point
 * operations per row at every SIMD level (tests/unit/test-kern-cpu matmul_rows_exact, and whole
 * windows in tests/unit/test-model-batch): today every weight type. */
#define QUANT(t, T, vt, exact) \
    [KERN_T_##T] = {true, true, KERN_T_##vt, kern__dequant_##t, kern__quant_##t, kern__dot_##t, exact}
#define ACT(t, T) [KERN_T_##T] = {true, false, KERN_T_F32, kern__dequant_##t, kern__quant_##t, NULL, false}
/* Known sizes, no kernels. */
#define SIZE_ONLY(T) [KERN_T_##T] = {true, false, KERN_T_F32, NULL, NULL, NULL, false}

static const struct kern__type_traits traits[KERN_T_COUNT] = {
    PLAIN(f32, F32, true),
    PLAIN(f16, F16, true),
    PLAIN(bf16, BF16, true),
    QUANT(q4_0, Q4_0, Q8_0, true),
    QUANT(q4_1, Q4_1, Q8_1, true),
    QUANT(q5_0, Q5_0, Q8_0, true),
    QUANT(q5_1, Q5_1, Q8_1, true),
    QUANT(q8_0, Q8_0, Q8_0, true),
    ACT(q8_1, Q8_1),
    SIZE_ONLY(Q2_K),
    SIZE_ONLY(Q3_K),
    QUANT(q4_K, Q4_K, Q8_K, true),
    QUANT(q5_K, Q5_K, Q8_K, true),
    QUANT(q6_K, Q6_K, Q8_K, true),
    ACT(q8_K, Q8_K),
};

const struct kern__type_traits *kern__type_traits(uint32_t type)
{
    return type < KERN_T_COUNT && traits[type].known ? &traits[type] : NULL;
}

/* The weight-type table's entry of a type the kernels know, NULL for any other. */
static const struct wtype_info *known(uint32_t type)
{
    return kern__type_traits(type) ? wtype_info(type) : NULL;
}

const char *kern_type_name(uint32_t type)
{
    const struct wtype_info *w = known(type);
    return w ? w->ggml_name : NULL;
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
    const struct wtype_info *w = known(type);
    return w ? w->block_elems : 0;
}

uint32_t kern_block_bytes(uint32_t type)
{
    const struct wtype_info *w = known(type);
    return w ? w->block_bytes : 0;
}

size_t kern_row_bytes(uint32_t type, int64_t cols)
{
    return kern__type_traits(type) ? wtype_row_bytes(type, cols) : 0;
}

int kern_ref_dequant_row(uint32_t type, const void *src, float *dst, int64_t n)
{
    const struct kern__type_traits *t = kern__type_traits(type);
    uint32_t be = kern_block_elems(type);
    if (!t || n < 0 || n % be != 0)
        return -EINVAL;
    if (!t->to_float)
        return -ENOTSUP;
    t->to_float(src, dst, n / be);
    return 0;
}

int kern_ref_quant_row(uint32_t type, const float *src, void *dst, int64_t n)
{
    const struct kern__type_traits *t = kern__type_traits(type);
    uint32_t be = kern_block_elems(type);
    if (!t || n < 0 || n % be != 0)
        return -EINVAL;
    if (!t->from_float_ref)
        return -ENOTSUP;
    t->from_float_ref(src, dst, n / be);
    return 0;
}

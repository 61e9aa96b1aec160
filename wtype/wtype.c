/* The weight-type table: every type id GGUF files may carry, its names and block geometry
 * (ggml's ggml_type_traits, the sizes only). */
#include <errno.h>
#include <stdint.h>
#include <strings.h>

#include "wtype/wtype.h"

#define TYPE(id, name, ggml_name, elems, bytes) [id] = {name, ggml_name, elems, bytes}

static const struct wtype_info table[WTYPE_COUNT] = {
    TYPE(0, "f32", "f32", 1, 4),             TYPE(1, "f16", "f16", 1, 2),
    TYPE(2, "q4_0", "q4_0", 32, 18),         TYPE(3, "q4_1", "q4_1", 32, 20),
    TYPE(6, "q5_0", "q5_0", 32, 22),         TYPE(7, "q5_1", "q5_1", 32, 24),
    TYPE(8, "q8_0", "q8_0", 32, 34),         TYPE(9, "q8_1", "q8_1", 32, 36),
    TYPE(10, "q2_k", "q2_K", 256, 84),       TYPE(11, "q3_k", "q3_K", 256, 110),
    TYPE(12, "q4_k", "q4_K", 256, 144),      TYPE(13, "q5_k", "q5_K", 256, 176),
    TYPE(14, "q6_k", "q6_K", 256, 210),      TYPE(15, "q8_k", "q8_K", 256, 292),
    TYPE(16, "iq2_xxs", "iq2_xxs", 256, 66), TYPE(17, "iq2_xs", "iq2_xs", 256, 74),
    TYPE(18, "iq3_xxs", "iq3_xxs", 256, 98), TYPE(19, "iq1_s", "iq1_s", 256, 50),
    TYPE(20, "iq4_nl", "iq4_nl", 32, 18),    TYPE(21, "iq3_s", "iq3_s", 256, 110),
    TYPE(22, "iq2_s", "iq2_s", 256, 82),     TYPE(23, "iq4_xs", "iq4_xs", 256, 136),
    TYPE(24, "i8", "i8", 1, 1),              TYPE(25, "i16", "i16", 1, 2),
    TYPE(26, "i32", "i32", 1, 4),            TYPE(27, "i64", "i64", 1, 8),
    TYPE(28, "f64", "f64", 1, 8),            TYPE(29, "iq1_m", "iq1_m", 256, 56),
    TYPE(30, "bf16", "bf16", 1, 2),          TYPE(34, "tq1_0", "tq1_0", 256, 54),
    TYPE(35, "tq2_0", "tq2_0", 256, 66),     TYPE(39, "mxfp4", "mxfp4", 32, 17),
};

const struct wtype_info *wtype_info(uint32_t type)
{
    return type < WTYPE_COUNT && table[type].name ? &table[type] : NULL;
}

int wtype_bytes(uint32_t type, uint64_t n, uint64_t *out)
{
    const struct wtype_info *ti = wtype_info(type);
    if (!ti || n % ti->block_elems)
        return -EINVAL;
    uint64_t blocks = n / ti->block_elems;
    if (blocks > UINT64_MAX / ti->block_bytes)
        return -EOVERFLOW;
    *out = blocks * ti->block_bytes;
    return 0;
}

size_t wtype_row_bytes(uint32_t type, int64_t cols)
{
    uint64_t b;
    if (cols < 0 || wtype_bytes(type, (uint64_t)cols, &b) || b > SIZE_MAX)
        return 0;
    return (size_t)b;
}

int wtype_by_name(const char *name)
{
    for (int i = 0; i < WTYPE_COUNT; i++)
        if (table[i].name && !strcasecmp(table[i].name, name))
            return i;
    return -1;
}

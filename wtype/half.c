/* f16 and bf16 from and to f32, rounding to nearest even as ggml does; NaNs stay NaNs. */
#include <string.h>

#include "wtype/wtype.h"

uint16_t wtype_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffff;
    if (ax > 0x7f800000) /* NaN: keep it quiet and keep the top payload bits */
        return (uint16_t)(sign | 0x7e00 | ((ax >> 13) & 0x3ff));
    if (ax >= 0x477ff000) /* rounds to >= 65520: infinity */
        return (uint16_t)(sign | 0x7c00);
    if (ax < 0x38800000) { /* below 2^-14: an f16 subnormal (or zero) */
        if (ax <= 0x33000000) /* <= 2^-25 rounds to zero (the tie goes to even 0) */
            return (uint16_t)sign;
        uint32_t mant = (ax & 0x7fffff) | 0x800000;
        int shift = 126 - (int)(ax >> 23); /* value = mant * 2^-shift units of 2^-24 */
        uint32_t r = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1)))
            r++;
        return (uint16_t)(sign | r);
    }
    uint32_t h = (ax >> 13) - ((127 - 15) << 10);
    uint32_t rem = ax & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
        h++;
    return (uint16_t)(sign | h);
}

float wtype_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff, x;
    if (e == 0x1f) {
        x = sign | 0x7f800000 | (m << 13);
    } else if (e != 0) {
        x = sign | ((e + 127 - 15) << 23) | (m << 13);
    } else if (m == 0) {
        x = sign;
    } else { /* subnormal: renormalise */
        e = 127 - 15 + 1;
        while (!(m & 0x400)) {
            m <<= 1;
            e--;
        }
        x = sign | (e << 23) | ((m & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}

uint16_t wtype_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000)
        return (uint16_t)((x >> 16) | 64); /* quiet NaN */
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

float wtype_bf16_to_f32(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

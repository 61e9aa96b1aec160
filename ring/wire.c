/* The boundary's wire encoding: little-endian f32, or f16 through the kernels' one converter
 * (so the wire and the KV cache round the same way). */
#include <string.h>

#include "wtype/wtype.h"
#include "ring/ring.h"

void ring_wire_encode(const float *x, size_t n, uint32_t dsize, uint8_t *out)
{
    if (dsize == 4) {
        memcpy(out, x, n * 4);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        uint16_t h = wtype_f32_to_f16(x[i]);
        out[2 * i] = (uint8_t)h;
        out[2 * i + 1] = (uint8_t)(h >> 8);
    }
}

void ring_wire_decode(const uint8_t *in, size_t n, uint32_t dsize, float *x)
{
    if (dsize == 4) {
        memcpy(x, in, n * 4);
        return;
    }
    for (size_t i = 0; i < n; i++)
        x[i] = wtype_f16_to_f32((uint16_t)(in[2 * i] | in[2 * i + 1] << 8));
}

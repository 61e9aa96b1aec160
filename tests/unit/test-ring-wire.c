/* test-ring-wire — the boundary's wire encoding: the f32 <-> f16 conversion it rounds with
 * (known values, round to nearest even, subnormals, overflow, inf and NaN, every half round
 * trips), and ring_wire_encode/ring_wire_decode for dsize 4 (bit-exact, little-endian) and
 * dsize 2 (little-endian halves, the kernels' rounding, every half round trips). */
#include <math.h>
#include <stdint.h>

#include "wtype/wtype.h"
#include "ring/ring.h"
#include "tests/lib/t.h"

T_CASE(f16_wire)
{
    T_CHECK(wtype_f32_to_f16(1.0f) == 0x3c00 && wtype_f32_to_f16(-2.0f) == 0xc000, "1, -2");
    T_CHECK(wtype_f32_to_f16(65504.0f) == 0x7bff && wtype_f32_to_f16(70000.0f) == 0x7c00, "max, overflow");
    T_CHECK(wtype_f32_to_f16(ldexpf(1, -24)) == 0x0001 && wtype_f32_to_f16(ldexpf(1, -26)) == 0, "subnormal");
    T_CHECK(wtype_f32_to_f16(1.0f + ldexpf(1, -11)) == 0x3c00, "tie to even (down)");
    T_CHECK(wtype_f32_to_f16(1.0f + 3 * ldexpf(1, -11)) == 0x3c02, "tie to even (up)");
    T_CHECK(wtype_f32_to_f16(INFINITY) == 0x7c00 && (wtype_f32_to_f16(NAN) & 0x7c00) == 0x7c00 &&
            (wtype_f32_to_f16(NAN) & 0x3ff), "inf, nan");
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff))
            continue;   /* NaNs */
        if (wtype_f32_to_f16(wtype_f16_to_f32((uint16_t)h)) != (uint16_t)h)
            bad++;
    }
    T_CHECK(bad == 0, "%d halves do not round trip", bad);
}


/* Values of every kind: normal, tiny, huge, signed zeros, subnormal, inf. */
static const float some[] = {0.0f, -0.0f, 1.0f, -2.0f, 0.333333f, 1e-3f, -7.5e-6f, 3.1e4f,
                             65504.0f, 70000.0f, 1e-30f, 1e30f, 5.9604645e-8f, INFINITY, -INFINITY};
#define N_SOME (sizeof some / sizeof *some)

T_CASE(wire_f32_round_trip)
{
    uint8_t b[N_SOME * 4];
    float back[N_SOME];
    ring_wire_encode(some, N_SOME, 4, b);
    T_CHECK(b[8] == 0x00 && b[9] == 0x00 && b[10] == 0x80 && b[11] == 0x3f,
            "1.0f as little-endian f32: %02x %02x %02x %02x", b[8], b[9], b[10], b[11]);
    ring_wire_decode(b, N_SOME, 4, back);
    T_CHECK(memcmp(back, some, sizeof some) == 0, "dsize 4 is bit-exact");
    float nan_in = NAN, nan_out = 0;
    ring_wire_encode(&nan_in, 1, 4, b);
    ring_wire_decode(b, 1, 4, &nan_out);
    T_CHECK(isnan(nan_out), "NaN stays NaN");
}

T_CASE(wire_f16_round_trip)
{
    uint8_t b[N_SOME * 2];
    float back[N_SOME];
    ring_wire_encode(some, N_SOME, 2, b);
    T_CHECK(b[4] == 0x00 && b[5] == 0x3c && b[6] == 0x00 && b[7] == 0xc0,
            "1, -2 as little-endian halves: %02x %02x %02x %02x", b[4], b[5], b[6], b[7]);
    for (size_t i = 0; i < N_SOME; i++) {
        uint16_t h = (uint16_t)(b[2 * i] | b[2 * i + 1] << 8);
        T_CHECK(h == wtype_f32_to_f16(some[i]), "%g: wire %04x, kernels %04x", some[i], h,
                wtype_f32_to_f16(some[i]));
    }
    ring_wire_decode(b, N_SOME, 2, back);
    for (size_t i = 0; i < N_SOME; i++) {
        float want = wtype_f16_to_f32(wtype_f32_to_f16(some[i]));
        T_CHECK(memcmp(&back[i], &want, sizeof want) == 0, "%g came back as %g, not %g", some[i],
                back[i], want);
        if (fabsf(some[i]) >= 6.103515625e-05f && fabsf(some[i]) <= 65504.0f)
            T_CHECK(fabsf(back[i] - some[i]) <= fabsf(some[i]) * 0x1p-11f,
                    "%g -> %g: more than half an f16 ulp off", some[i], back[i]);
    }
    /* every half (but NaNs) survives decode then encode, in one buffer of all of them */
    static uint8_t all[65536 * 2], again[65536 * 2];
    static float f[65536];
    for (uint32_t h = 0; h < 65536; h++) {
        all[2 * h] = (uint8_t)h;
        all[2 * h + 1] = (uint8_t)(h >> 8);
    }
    ring_wire_decode(all, 65536, 2, f);
    ring_wire_encode(f, 65536, 2, again);
    int bad = 0, nans = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) {
            nans += !isnan(f[h]);
            continue;
        }
        if (memcmp(all + 2 * h, again + 2 * h, 2) != 0)
            bad++;
    }
    T_CHECK(bad == 0, "%d halves do not round trip through the wire", bad);
    T_CHECK(nans == 0, "%d NaN halves decode to numbers", nans);
}

int main(int argc, char **argv)
{
    t_init(argc, argv);
    T_RUN(f16_wire);
    T_RUN(wire_f32_round_trip);
    T_RUN(wire_f16_round_trip);
    return T_DONE();
}

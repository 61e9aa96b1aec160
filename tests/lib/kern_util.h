/* Shared helpers for the kern tests: a seeded RNG and gaussian data (t_nmse, the error
 * measure, is in tests/lib/util.h). */
#ifndef KV_TESTS_KERN_UTIL_H
#define KV_TESTS_KERN_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "tests/lib/util.h"

static uint64_t ku_state = 0x9e3779b97f4a7c15ull;

static inline void ku_seed(uint64_t s) { ku_state = s * 0x9e3779b97f4a7c15ull + 1; }

static inline uint32_t ku_u32(void)
{
    ku_state ^= ku_state << 13;
    ku_state ^= ku_state >> 7;
    ku_state ^= ku_state << 17;
    return (uint32_t)(ku_state >> 11);
}

/* Uniform in [0, 1). */
static inline float ku_unif(void) { return (ku_u32() >> 8) * (1.0f / 16777216.0f); }

static inline float ku_gauss(void)
{
    float u = ku_unif() + 1e-7f, v = ku_unif();
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

static inline void ku_fill(float *x, int64_t n, float sd)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = ku_gauss() * sd;
}

#endif

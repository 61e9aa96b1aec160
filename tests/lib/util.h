/* util.h — small helpers the test files share (the harness itself is tests/lib/t.h).
 *
 * t_nmse(a, ref, n): normalised mean squared error of n floats a against a reference ref of
 * floats or doubles: sum (a - ref)^2 / sum ref^2. A reference that is all zeros has no scale
 * to normalise by; then the plain sum (a - ref)^2 is returned, so all-zero against all-zero is
 * 0 and anything else against zeros is non-zero (never a division by zero, never inf/nan).
 */
#ifndef KV_TESTS_UTIL_H
#define KV_TESTS_UTIL_H

#include <stdint.h>

/* The one rule for both reference types: err = sum (a - ref)^2, scale = sum ref^2. */
static inline double t_nmse_ratio(double err, double scale)
{
    return scale > 0 ? err / scale : err;
}

static inline double t_nmse_f32(const float *a, const float *ref, int64_t n)
{
    double err = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i];
        err += d * d;
        scale += (double)ref[i] * ref[i];
    }
    return t_nmse_ratio(err, scale);
}

static inline double t_nmse_f64(const float *a, const double *ref, int64_t n)
{
    double err = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i];
        err += d * d;
        scale += ref[i] * ref[i];
    }
    return t_nmse_ratio(err, scale);
}

#define t_nmse(a, ref, n) _Generic((ref), \
    const double *: t_nmse_f64, double *: t_nmse_f64, default: t_nmse_f32)((a), (ref), (int64_t)(n))

#endif

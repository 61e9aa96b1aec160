/* AVX2 + FMA + F16C build of the SIMD kernels (see simd.inc). */
#define SIMD_TABLE kern__simd_avx2
#define SIMD_NAME "avx2"
#include "kernels/cpu/simd.inc"

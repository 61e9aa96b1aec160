/* AVX-512 (VL/BW/VNNI) build of the SIMD kernels (see simd.inc). */
#define SIMD_TABLE kern__simd_avx512
#define SIMD_NAME "avx512"
#include "kernels/cpu/simd.inc"

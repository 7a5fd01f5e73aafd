/* matmul_avx2.c — matmul kernels for x86-64-v3 (AVX2, FMA): 8-float vectors and 16 registers: a 2x4 tile
 * (8 accumulators) holding the x pairs while W rows stream (measured best of 2x4, 4x2, 3x2, 3x3 either way). */
#if defined(__x86_64__)
#pragma GCC target("arch=x86-64-v3")
#define MMK_NAME mm_kernels_avx2
#define MMK_ISA "avx2"
#define MMK_VL 8
#define MMK_MR 2
#define MMK_NR 4
#include "matmul_kernel.inc"
#endif

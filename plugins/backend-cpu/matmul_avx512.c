/* matmul_avx512.c — matmul kernels for x86-64-v4 (AVX-512 F/BW/DQ/VL, FMA): 16-float vectors and 32 registers
 * hold a 5x4 tile (20 accumulators) plus the 4 widened W pairs while x rows stream past them. Measured on Zen 4
 * (M = 64, bf16): 5x4 holding W ~175 GFLOP/s on 2 cores, 4x4 holding x ~120 (GCC spills), 3x4 ~163. */
#if defined(__x86_64__)
#pragma GCC target("arch=x86-64-v4")
#define MMK_NAME mm_kernels_avx512
#define MMK_ISA "avx512"
#define MMK_VL 16
#define MMK_MR 5
#define MMK_NR 4
#define MMK_HOLD_W
#include "matmul_kernel.inc"
#endif

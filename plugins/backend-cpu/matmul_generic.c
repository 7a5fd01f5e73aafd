/* matmul_generic.c — portable matmul kernels (baseline ISA of the build: SSE2 on x86-64, NEON on aarch64):
 * 4-float vectors, a 2x4 tile. */
#define MMK_NAME mm_kernels_generic
#define MMK_ISA "generic"
#define MMK_VL 4
#define MMK_MR 2
#define MMK_NR 4
#include "matmul_kernel.inc"

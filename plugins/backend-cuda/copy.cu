/*
 * copy.cu — small stream-ordered copies as a kernel instead of a copy-engine transfer.
 *
 * Why: between two decode steps the runner puts a few tiny transfers on the stream (the step's packed metadata
 * from pinned memory, the sampled ids back to pinned memory, the fed ids device to device). Each cudaMemcpyAsync
 * is a copy-engine operation that the stream hands over and waits for: on the H200 ~2.5-7 us from the end of the
 * previous operation to the end of a 4-byte copy, while a dependent kernel follows its predecessor within ~1 us
 * (and, launched with PDL, is scheduled before it ends). Pinned host memory is mapped into the device's address
 * space under unified addressing (cudaMallocHost on a 64-bit host), so a kernel reads and writes it directly:
 * the loads cross PCIe once per round of a block, which for a few KiB is one round trip.
 *
 * Used by buffer_copy for copies of at most CU_COPY_KERNEL_MAX bytes with at least one side in device memory
 * (host to host stays with the runtime), when the device has unified addressing and BERTH_CUDA_COPY_KERNEL is not
 * 0. Stream order is kept both ways:
 *  - before it: the kernel follows cu_launch's PDL contract (every thread waits before its first read and write);
 *  - after it: a copy must stay a full stream dependency, as a copy-engine transfer is, because the decode
 *    attention, kv_append and the rms+RoPE kernels read the step's metadata before their own PDL wait on that
 *    assumption (attention_decode.cu, "Reads before the PDL wait"). So the kernel never triggers its successor,
 *    and it marks its stream (cu_pdl_barrier_set) so that the next cu_launch there goes without PDL: that kernel
 *    starts only once the copy has completed and its writes are visible, and everything PDL-launched after it is
 *    ordered after the copy too. A host that waits on an event recorded after the copy sees its writes to pinned
 *    memory.
 */
#include "cuda_internal.h"
#include "cuda_launch.cuh"

#include <stdint.h>

#define CU_COPY_THREADS 256
#define CU_COPY_BLOCK_BYTES (CU_COPY_THREADS * 16) /* one 16-byte vector per thread per round */

/* Bytes [0, n) from src to dst; each block copies its CU_COPY_BLOCK_BYTES slices, grid-strided. V = 16 when both
 * pointers and n are 16-byte aligned, 4 when 4-byte aligned, else 1. */
template <int V>
__global__ void __launch_bounds__(CU_COPY_THREADS) cu_copy_kernel(char *dst, const char *src, uint64_t n)
{
    cu_pdl_wait(); /* no cu_pdl_trigger(): see the top comment */
    const uint64_t per_block = (uint64_t)CU_COPY_BLOCK_BYTES;
    for (uint64_t base = (uint64_t)blockIdx.x * per_block; base < n; base += (uint64_t)gridDim.x * per_block) {
        if (V == 16) {
            for (uint64_t i = base + (uint64_t)threadIdx.x * 16; i < n && i < base + per_block; i += CU_COPY_THREADS * 16)
                *(int4 *)(dst + i) = *(const int4 *)(src + i);
        } else if (V == 4) {
            for (uint64_t i = base + (uint64_t)threadIdx.x * 4; i < n && i < base + per_block; i += CU_COPY_THREADS * 4)
                *(int32_t *)(dst + i) = *(const int32_t *)(src + i);
        } else {
            for (uint64_t i = base + threadIdx.x; i < n && i < base + per_block; i += CU_COPY_THREADS)
                dst[i] = src[i];
        }
    }
}

int cu_copy_kernel_fits(const berth_backend *be, const berth_buffer *dst, const berth_buffer *src, uint64_t nbytes)
{
    return be->copy_kernel && nbytes > 0 && nbytes <= CU_COPY_KERNEL_MAX && !(dst->pinned && src->pinned);
}

berth_status cu_copy_small(berth_backend *be, berth_stream *s, void *dst, const void *src, uint64_t nbytes)
{
    const uintptr_t a = (uintptr_t)dst | (uintptr_t)src | (uintptr_t)nbytes;
    const uint64_t blocks = (nbytes + CU_COPY_BLOCK_BYTES - 1) / CU_COPY_BLOCK_BYTES;
    const dim3 grid((unsigned)(blocks < 64 ? blocks : 64)), block(CU_COPY_THREADS);
    char *d = (char *)dst;
    const char *sp = (const char *)src;
    cudaError_t e;
    (void)cu_pdl_barrier_take(be, s->cs); /* the copy waits before touching memory: PDL is safe for it */
    if (a % 16 == 0)
        e = cu_launch(be, s->cs, grid, block, 0, cu_copy_kernel<16>, d, sp, nbytes);
    else if (a % 4 == 0)
        e = cu_launch(be, s->cs, grid, block, 0, cu_copy_kernel<4>, d, sp, nbytes);
    else
        e = cu_launch(be, s->cs, grid, block, 0, cu_copy_kernel<1>, d, sp, nbytes);
    if (e == cudaSuccess)
        cu_pdl_barrier_set(be, s); /* the next kernel waits for the whole copy (top comment) */
    return cu_check(be, e, "cu_copy_kernel");
}

/*
 * cuda_cluster.cuh — thread-block cluster primitives (sm_90) shared by the kernels that exchange partial results
 * through distributed shared memory: attention_decode.cu's decode kernel and matmul_pair.cu's pair kernel.
 *
 * The barrier is split (arrive, then wait) so a block can work between the two; every thread of every block of
 * the cluster must take part (.aligned: all threads of a warp execute it together). A store into another
 * block's shared memory is safe only once that block has started (a completed barrier after its first arrive)
 * and until it has passed a later barrier that the store precedes.
 */
#ifndef BERTH_CUDA_CLUSTER_CUH
#define BERTH_CUDA_CLUSTER_CUH

#include <stdint.h>

/* Arrive without ordering memory (e.g. "this block has started"). */
__device__ __forceinline__ void cu_cluster_arrive_relaxed()
{
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}

/* Arrive, releasing this thread's earlier memory operations to the cluster. */
__device__ __forceinline__ void cu_cluster_arrive_release()
{
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}

/* Wait until every thread of the cluster arrived; acquires what they released. */
__device__ __forceinline__ void cu_cluster_wait()
{
    asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

/* This block's rank in its cluster. */
__device__ __forceinline__ uint32_t cu_cluster_rank()
{
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}

/* The address of p (this block's shared memory) in cluster rank `rank`'s shared memory. */
template <typename T>
__device__ __forceinline__ T *cu_cluster_remote(T *p, int rank)
{
    return (T *)__cluster_map_shared_rank((void *)p, (unsigned)rank);
}

#endif

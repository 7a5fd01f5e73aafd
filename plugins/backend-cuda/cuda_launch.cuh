/*
 * cuda_launch.cuh — kernel launches with programmatic dependent launch (PDL, sm_90+), host and device halves.
 *
 * Why: a decode step is ~800 small kernels replayed as one CUDA graph. Between two dependent kernels the GPU
 * normally drains the first before it launches the second, and block scheduling, prologue and the first loads of
 * the second then cost microseconds every time. A kernel launched by cu_launch may be scheduled while its
 * predecessor in the stream is still running: it does what needs nothing from earlier kernels (index maths,
 * loading weights, which no kernel writes) and then waits in cu_pdl_wait() until the predecessor has completed
 * and its memory is visible.
 *
 * The contract for every kernel launched through cu_launch (all kernels of matmul.cu, norm.cu, elementwise.cu,
 * rope.cu and kv_append.cu):
 *   - every thread calls cu_pdl_wait() before its first read of memory an earlier kernel may write and before its
 *     first global write (an earlier kernel may still be reading what it overwrites), on every path, threads
 *     without work included: wait returns only when the direct predecessor has completed, so a grid in which
 *     every thread waited completes after its predecessor, and normally launched kernels that follow it stay
 *     ordered after everything before it;
 *   - data an earlier kernel may write is read with ordinary (coherent) loads, not __ldg / ld.global.nc, whose
 *     contract is data read-only for the grid's whole lifetime, which a grid started early does not have;
 *   - it calls cu_pdl_trigger() early (our kernels do it first): that only lets the next kernel be scheduled onto
 *     free SM resources and promises nothing about memory, so the next kernel's own wait still orders everything.
 *     Since a kernel's successor can launch only once every block of the kernel has started (or exited), at most
 *     one grid is ever waiting for SM resources and the early launches cannot starve an earlier grid.
 * Two deliberate exceptions, both in the decode attention kernels (attention_decode.cu, attention_decode_mma.cu):
 * the cluster kernel triggers after its key loop, not first (BERTH_CUDA_ATT_TRIGGER), and in causal calls both read the step's
 * metadata and the K/V of keys older than the batch's own rows before their wait (BERTH_CUDA_ATT_PREWAIT), on the
 * assumption about the host written in attention_decode.cu ("Reads before the PDL wait"); the split merge after
 * the tensor-core one reads its sequence's row range early under the same switch. Every thread still waits before
 * its first global write and before it exits.
 * One more exception, the other way: copy.cu's copy kernel stands for a copy, which must stay a full stream
 * dependency for those early readers, so it never triggers and marks its stream (cu_pdl_barrier_set), and the
 * next cu_launch on that stream goes without PDL (graph_end marks the stream too: a capture that fails is run
 * again eagerly, and the capture took the mark).
 * Kernels launched with <<<>>> (attention.cu's prefill and plan kernels, sample.cu's sampling kernels but not its
 * argmax, cuBLAS; the decode attention kernels use cu_launch) are unaffected: a normal launch still waits for
 * its predecessor's full completion, and a PDL launch after a kernel that never triggers starts when that
 * kernel's warps have finished (griddepcontrol.wait still waits for the memory flush).
 *
 * Graphs: stream capture records a PDL launch as a kernel node with a programmatic edge from the previous kernel
 * node (CUDA 12.3+), and the instantiated graph keeps it. What this relies on: CUDA Programming Guide, section
 * "Programmatic Dependent Launch and Synchronization", subsection "Use in CUDA Graphs" (PDL "can be used in CUDA
 * Graphs via stream capture or directly via edge data"; docs.nvidia.com/cuda/cuda-programming-guide/
 * 04-special-topics/programmatic-dependent-launch.html), and cudaGraphDependencyTypeProgrammatic /
 * cudaGraphKernelNodePortProgrammatic in driver_types.h (edge types of kernel-to-kernel graph edges).
 *
 * Switch: BERTH_CUDA_PDL=0 in the environment launches every kernel normally (read when the backend starts, as the
 * other switches: cuda_backend.cu), so both can be measured. A PDL launch that is refused (a driver without it) is retried without the
 * attribute, and PDL is then switched off for the backend with a warning in the log.
 */
#ifndef BERTH_CUDA_LAUNCH_CUH
#define BERTH_CUDA_LAUNCH_CUH

#include "cuda_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- device side ---- */

/* Wait until the grids this one depends on have completed and their writes are visible (a no-op without a
 * programmatic dependency). */
__device__ __forceinline__ void cu_pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Let the next kernel in the stream be scheduled (it still waits for this one in its own cu_pdl_wait). */
__device__ __forceinline__ void cu_pdl_trigger()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::);
#endif
}

/* ---- host side ---- */

static inline bool cu_pdl_enabled(const berth_backend *be)
{
    return be->pdl == CU_PDL_ON;
}

/* kernel<<<grid, block, smem, cs>>>(args...) in clusters of cluster blocks (cudaLaunchAttributeClusterDimension,
 * only when a dimension of cluster is > 1), with PDL when enabled. A refused PDL launch is retried with the
 * cluster attribute alone, and PDL is then off for the backend with a warning in the log. Returns the launch's
 * error (callers pass it to cu_check with the kernel's name). */
template <typename... KArgs, typename... Args>
static cudaError_t cu_launch_cluster(berth_backend *be, cudaStream_t cs, dim3 grid, dim3 block, size_t smem,
                                     dim3 cluster, void (*kernel)(KArgs...), const Args &...args)
{
    cudaLaunchAttribute attr[2] = {};
    unsigned n = 0;
    if (cluster.x > 1 || cluster.y > 1 || cluster.z > 1) {
        attr[n].id = cudaLaunchAttributeClusterDimension;
        attr[n].val.clusterDim.x = cluster.x;
        attr[n].val.clusterDim.y = cluster.y;
        attr[n].val.clusterDim.z = cluster.z;
        n++;
    }
    const unsigned plain_n = n; /* the attributes of a launch without PDL */
    const bool barrier = cu_pdl_barrier_take(be, cs); /* after a copy kernel (copy.cu) or a capture's end */
    if (cu_pdl_enabled(be) && !barrier) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n].val.programmaticStreamSerializationAllowed = 1;
        n++;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = cs;
    cfg.attrs = attr;
    cfg.numAttrs = n;
    const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, args...);
    if (e == cudaSuccess || n == plain_n)
        return e;
    (void)cudaGetLastError(); /* not sticky (a refused attribute): try without PDL */
    cfg.numAttrs = plain_n;
    const cudaError_t plain = cudaLaunchKernelEx(&cfg, kernel, args...);
    if (plain == cudaSuccess) {
        be->pdl = CU_PDL_OFF;
        if (be->host && be->host->log) {
            char msg[256];
            snprintf(msg, sizeof msg,
                     "cuda device %d: a launch with programmatic dependent launch failed (%s); launching without it",
                     be->device, cudaGetErrorName(e));
            be->host->log(be->host->ctx, BERTH_LOG_WARN, msg);
        }
    }
    return plain;
}

/* kernel<<<grid, block, smem, cs>>>(args...), with PDL when enabled (cu_launch_cluster without clusters). */
template <typename... KArgs, typename... Args>
static cudaError_t cu_launch(berth_backend *be, cudaStream_t cs, dim3 grid, dim3 block, size_t smem,
                             void (*kernel)(KArgs...), const Args &...args)
{
    return cu_launch_cluster(be, cs, grid, block, smem, dim3(1, 1, 1), kernel, args...);
}

#endif

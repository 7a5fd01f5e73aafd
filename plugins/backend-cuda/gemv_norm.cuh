/*
 * gemv_norm.cuh — a matmul's trailing norm (berth_matmul_params.y_norm) finished inside the GEMV kernel that
 * computes y (gemv.cu's M = 1 kernels, matmul.cu's mm_gemv_kernel for M <= 8) instead of a second launch.
 *
 * Why: at batch-1 decode the post-norms run one per projection (105 per Gemma 4 E2B step), each a kernel of a
 * few microseconds that is nearly all launch and latency; ~17% of the step.
 *
 * How: each block stores its outputs, then counts itself in a per-stream device counter (cu_ynorm_arrive: a
 * barrier, then thread 0 adds 1 with release and acquire semantics at GPU scope); the block that sees the count
 * reach gridDim.x - 1 arrived last, so every row of y is complete and visible to it. That block resets the counter
 * to 0 and runs the whole rms_norm on the M rows of y (cu_ynorm_row): a warp per row, or the block one row after
 * another. It reads y from L2 (ld.global.cg: this SM's L1 may hold older copies of those lines). No block ever
 * waits for another, so nothing depends on which blocks are resident.
 *
 * Same bits as the two-launch path: only rows norm.cu's fast kernel (nm_rms_vec_kernel) would take are fused,
 * and each thread owns exactly the float4s that thread of that kernel would (its team width: a warp, or the
 * block width it would launch; a wider GEMV block's extra threads own nothing and add zeros to the sums, which
 * changes no bit), sums them in the same order (its second output sums each float4 w, z, y, x) through the same
 * warp / block reductions, and rounds the same operations (explicit _rn intrinsics, no contraction into FMAs, as
 * the compiler leaves that kernel; keep the two in step). Not fused: rows of its general kernel (lengths that are
 * not whole float4s, unaligned rows or weights), rows whose team owns more than CU_YNORM_CHUNKS float4 per thread
 * (256 < n <= 512, n > 2048), the gated epilogue (its kernels carry no tail), and whatever the GEMV does not run
 * (the skinny kernel, cuBLAS); tests/cuda_ops/test_cuda_dense.c compares the two paths byte for byte.
 *
 * The counter (berth_stream.ynorm_count, cudaMalloc'd and zeroed when the stream is created, freed with it) is 0
 * between kernels: the last block puts it back, so graph replays need no reset. One per stream suffices because
 * the kernels that use it run one after another: a later kernel on the stream touches it only after its own
 * cu_pdl_wait (at the end of the kernel), which returns only once the previous grid has completed and flushed
 * its memory, and every earlier grid completed before that one (cuda_launch.cuh's contract: every thread of
 * every cu_launch kernel waits; a normal launch waits for full completion anyway). Other streams have their own
 * counters. A graph recorded on a stream keeps that stream's counter, as it keeps its workspace: replays must
 * not overlap other work on the stream, which berth's graph rules already require of the workspace.
 */
#ifndef BERTH_CUDA_GEMV_NORM_CUH
#define BERTH_CUDA_GEMV_NORM_CUH

#include "cuda_internal.h"
#include "norm_args.cuh"

#define CU_YNORM_THREADS 256 /* the GEMV kernels' block size: 8 warps, a warp per row for M <= 8 */
#define CU_YNORM_CHUNKS 2    /* float4 a thread of the tail keeps in registers */

/* The trailing norm as the GEMV kernel carries it (count NULL: none). */
struct cu_ynorm {
    nm_rms_args a;       /* rms_norm's arguments, as cu_op_rms_norm would launch them (rows = M) */
    unsigned int *count; /* the stream's arrival counter, or NULL */
    int32_t warp;        /* a warp per row (row m on warp m), else the block, one row after another */
    int32_t width;       /* threads per row, as norm.cu's fast kernel would launch them (warp teams: 32) */
};

/* Host (norm.cu): fill *out for yn on M rows when the GEMV can finish it (be->gemv_norm allows M; rows norm.cu's
 * fast kernel takes, with at most CU_YNORM_CHUNKS float4 per thread; no RoPE); false otherwise (the caller then
 * launches rms_norm itself). */
bool cu_ynorm_plan(const berth_backend *be, const berth_stream *s, const berth_rms_norm_params *yn, int64_t M,
                   cu_ynorm *out);

/* Called by every thread of every block of the grid, after the block's outputs are stored (a barrier: no thread
 * may have returned). True in the block that arrived last, which has reset the counter. The pattern of CUTLASS's
 * grid barriers: the barrier orders every thread's stores before thread 0's release; the add is also an acquire,
 * so the last block (after the second barrier) sees every other block's y. */
static __device__ __forceinline__ bool cu_ynorm_arrive(unsigned int *count)
{
    __shared__ unsigned int yn_last;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned int prev;
        asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], 1;" : "=r"(prev) : "l"(count) : "memory");
        yn_last = prev == gridDim.x - 1;
        if (yn_last) /* every block has arrived: nothing of this grid touches the counter again */
            asm volatile("st.relaxed.gpu.global.u32 [%0], 0;" ::"l"(count) : "memory");
    }
    __syncthreads();
    return yn_last != 0;
}

static __device__ __forceinline__ void cu_ynorm_f4(const float4 q, float (&o)[4])
{
    o[0] = q.x;
    o[1] = q.y;
    o[2] = q.z;
    o[3] = q.w;
}

/* The weight factors of elements 4q .. 4q + 3 (mode W: w, W_ONE_PLUS: 1 + w), widened exactly; w is aligned for
 * vector loads (norm.cu's fast kernel requires it). */
static __device__ __forceinline__ void cu_ynorm_w4(const nm_rms_args &a, int q, float (&f)[4])
{
    if (a.wdt == BERTH_DTYPE_F32) {
        cu_ynorm_f4(((const float4 *)a.w)[q], f);
    } else {
        const uint2 u = ((const uint2 *)a.w)[q];
        const uint32_t h[4] = {u.x & 0xffffu, u.x >> 16, u.y & 0xffffu, u.y >> 16};
#pragma unroll
        for (int c = 0; c < 4; c++)
            f[c] = a.wdt == BERTH_DTYPE_BF16 ? __uint_as_float(h[c] << 16)
                                             : __half2float(__ushort_as_half((unsigned short)h[c]));
    }
    if (a.wmode == BERTH_NORM_W_ONE_PLUS)
#pragma unroll
        for (int c = 0; c < 4; c++)
            f[c] = 1.0f + f[c];
}

/* rms_norm of one row of y by a team, as nm_rms_vec_kernel does it: the calling warp (t.warp) or the whole block
 * (it then contains barriers). Chunk j of thread `lane` is float4 lane + j * width of the row; chunks past the row,
 * and every chunk of a thread past the team, are absent (zeros). */
static __device__ __forceinline__ void cu_ynorm_row(const cu_ynorm &t, int64_t row, int lane, float *scratch)
{
    constexpr int J = CU_YNORM_CHUNKS;
    const nm_rms_args &a = t.a;
    const bool has_w = a.wmode == BERTH_NORM_W || a.wmode == BERTH_NORM_W_ONE_PLUS;
    const float4 *x = (const float4 *)nm_row(a.x, row);
    float4 *y = (float4 *)nm_row(a.y, row);
    float4 *res = a.rmode != BERTH_RESID_NONE ? (float4 *)nm_row(a.res, row) : nullptr;
    const int nv = lane < t.width ? (int)(a.n >> 2) : 0;
    float v[J][4], r[J][4], wf[J][4];
#pragma unroll
    for (int j = 0; j < J; j++) { /* every load of the row (and its weights) before any store */
        const int q = lane + j * t.width;
#pragma unroll
        for (int c = 0; c < 4; c++) {
            v[j][c] = r[j][c] = 0.0f;
            wf[j][c] = 1.0f;
        }
        if (q < nv) {
            cu_ynorm_f4(__ldcg(x + q), v[j]);
            if (a.rmode != BERTH_RESID_NONE)
                cu_ynorm_f4(__ldcg(res + q), r[j]);
            if (has_w)
                cu_ynorm_w4(a, q, wf[j]);
        }
    }
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < J; j++) { /* absent chunks hold 0: fmaf(0, 0, ss) == ss */
        if (a.rmode == BERTH_RESID_ADD_BEFORE) {
#pragma unroll
            for (int c = 0; c < 4; c++)
                v[j][c] = __fadd_rn(r[j][c], v[j][c]);
            if (lane + j * t.width < nv)
                res[lane + j * t.width] = make_float4(v[j][0], v[j][1], v[j][2], v[j][3]);
        }
#pragma unroll
        for (int c = 0; c < 4; c++)
            ss = fmaf(v[j][c], v[j][c], ss);
    }
    ss = t.warp ? cu_warp_sum(ss) : cu_block_sum(ss, scratch);
    const float inv = 1.0f / sqrtf(ss / (float)a.n + a.eps);
    float ss2 = 0.0f;
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int q = lane + j * t.width;
        if (q >= nv)
            continue;
#pragma unroll
        for (int c = 0; c < 4; c++) {
            float o = __fmul_rn(v[j][c], inv);
            if (has_w)
                o = __fmul_rn(o, wf[j][c]);
            if (a.rmode == BERTH_RESID_ADD_AFTER)
                o = __fadd_rn(r[j][c], o);
            if (a.oscale != 1.0f)
                o = __fmul_rn(o, a.oscale);
            v[j][c] = o; /* y's values stay for the second output */
        }
        y[q] = make_float4(v[j][0], v[j][1], v[j][2], v[j][3]);
        if (a.has_y2) /* the fast kernel's order: w, z, y, x */
            ss2 = fmaf(v[j][0], v[j][0], fmaf(v[j][1], v[j][1], fmaf(v[j][2], v[j][2], fmaf(v[j][3], v[j][3], ss2))));
    }
    if (!a.has_y2) /* uniform over the team */
        return;
    ss2 = t.warp ? cu_warp_sum(ss2) : cu_block_sum(ss2, scratch);
    const float inv2 = 1.0f / sqrtf(ss2 / (float)a.n + a.eps);
    float4 *y2 = (float4 *)nm_row(a.y2, row);
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int q = lane + j * t.width;
        if (q >= nv)
            continue;
        float o2[4];
#pragma unroll
        for (int c = 0; c < 4; c++)
            o2[c] = __fmul_rn(__fmul_rn(v[j][c], inv2), nm_factor(a.w2, a.w2dt, a.w2mode, 4 * q + c));
        y2[q] = make_float4(o2[0], o2[1], o2[2], o2[3]);
    }
}

/* The end of a GEMV kernel (every thread, no early return before it): nothing without a trailing norm; else
 * arrive, and in the last block the norm of all M rows. */
static __device__ __forceinline__ void cu_ynorm_finish(const cu_ynorm &t)
{
    __shared__ float yn_scratch[32];
    if (!t.count || !cu_ynorm_arrive(t.count))
        return;
    const int tid = (int)threadIdx.x;
    if (t.warp) { /* no barriers in warp teams */
        if ((tid >> 5) < t.a.rows)
            cu_ynorm_row(t, tid >> 5, tid & 31, yn_scratch);
        return;
    }
    for (int64_t row = 0; row < t.a.rows; row++) /* uniform over the block */
        cu_ynorm_row(t, row, tid, yn_scratch);
}

#endif

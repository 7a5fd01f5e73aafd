/*
 * gemv.cu — the batch-1 decode product y = x w^T (one row x, f32; w f32/bf16/f16 rows of whole 16-byte chunks;
 * fp32 accumulation), with bias, accumulate and the gated epilogue at the store. matmul.cu's mm_gemv sends M = 1
 * here when the layout allows it (see gemv.cuh) unless BERTH_CUDA_GEMV=old; everything else keeps its general
 * GEMV kernel.
 *
 * Why it is built this way (the H200 at batch 1 reads ~3.7 GB of weights per decode step; every product is bound
 * by how many bytes of weights are in flight, not by arithmetic):
 *  - Bytes in flight. DRAM answers in about 1-2 us under load, so 4.2 TB/s needs 5-8 MB of loads outstanding
 *    across the GPU (40-60 KB per SM) at every moment. matmul.cu's kernel issued 4 16-byte loads per thread (2
 *    rows x 2 chunks), then waited, computed, and only then issued the next 4: while a warp computed, it had
 *    nothing in flight. Here a thread owns U = 4 chunks of each of its 2 rows (8 loads, 128 bytes; 64 registers,
 *    4 blocks of 256 per SM: up to 128 KiB in flight per SM). The source reloads each chunk's registers as soon
 *    as the chunk has been multiplied, but ptxas (CUDA 13) moves those loads to the end of the step, so in SASS a
 *    warp still has nothing in flight while it computes; the async variant below (BERTH_CUDA_GEMV=async) keeps
 *    its loads in flight throughout, in shared memory, for the A/B run to decide.
 *  - Instructions per chunk. The general kernel's row pointers (64-bit products of runtime indices) were
 *    recomputed at every step to fit 48 registers: ~39 SASS instructions per 16-byte chunk at M = 1, bf16. Here
 *    the team size is a template argument, so every chunk's offset is an immediate in the load and a step costs
 *    three 64-bit pointer increments: per bf16 chunk 1 load, 1 x load (2 float4 shared by the 2 rows), 8
 *    widening ops (a shift or a mask per element: bf16 is exact in f32) and 8 FMAs: ~20 in SASS (163 per step
 *    of 8 chunks at 128 threads per row pair; f32 weights ~8 per chunk of 4).
 *  - x stays f32 (the numerics) and is read through L1 (K floats, at most 48 KiB); weights bypass L1
 *    (ld.global.L1::no_allocate) so they do not evict it. x is not staged in shared memory: that costs a barrier
 *    after the wait for the previous kernel, on the critical path of the small products.
 *  - The team rule is matmul.cu's: the largest power of two 32..256 threads per row pair that keeps the grid
 *    within one wave of 4 blocks of 256 threads per SM (the register budget of 64 at 8 loads per thread), and no
 *    wider than a row has chunks. Tall matrices (K = 6144..12288, N = 1536) get 128 threads per row pair, 12 or 6
 *    chunks each; short wide ones (gate|up, LM head) 32 threads and several waves, each block one or two steps.
 *  - No split-K across blocks: at the E2B shapes every small product (N = 256..2048, K = 256..2048) already has
 *    all of its loads issued in the first step by a grid that spans every SM, so its time is a launch, one DRAM
 *    round trip and the reduction; splitting K would add a second pass (or atomics, which are not deterministic)
 *    and save nothing.
 *  - Programmatic dependent launch (cuda_launch.cuh): the first step's weight loads are issued before the wait
 *    when w is a weights buffer (no kernel writes it); x, y, u and bias only after it.
 *  - A trailing norm (berth_matmul_params.y_norm, Gemma 4's post-norms) runs in the grid's last block instead of
 *    a second launch (gemv_norm.cuh): the instances with YN = true end with it; the others carry no code for it.
 *  - A norm before the product (berth_matmul_params.x_pre, Gemma 4's post-norms feeding the next projection) can
 *    run in every block's prologue (gemv_xpre.cuh; BERTH_CUDA_XPRE=1): the XP instances rebuild x in shared memory
 *    after the wait and read it from there, and are persistent (one wave of blocks), so the prologue runs once
 *    per block. Off by default: on the H200 it measured slower than the norm's own launch (467 against 482 tok/s
 *    at E2B batch 1; 461 before the instances were persistent) — every block re-reads 12 KB of inputs and runs
 *    two block reductions right after the wait, all at once, on the critical path.
 */
#include "gemv.cuh"

#include "cuda_device.cuh"
#include "cuda_launch.cuh"
#include "cuda_mma.cuh"

#define GV_THREADS 256
#define GV_MIN_BLOCKS 4       /* blocks per SM the registers must allow: 64 per thread */
#define GV_U 4                /* chunks of each row per thread per step */
#define GV_STAGES 5           /* async variant: chunk pairs per thread in shared memory (4 in flight) */
#define GV_ASYNC_MIN_BLOCKS 5 /* async variant: 5 x 40 KiB of stages per SM, 48 registers */
static_assert(GV_THREADS == CU_YNORM_THREADS, "the trailing norm (gemv_norm.cuh) assumes 8 warps per block");

/* E floats of x (16-byte aligned). */
template <int E>
static __device__ __forceinline__ void gv_ld_x(const float *p, float (&xv)[E])
{
#pragma unroll
    for (int q = 0; q < E / 4; q++) {
        const float4 v = reinterpret_cast<const float4 *>(p)[q];
        xv[4 * q + 0] = v.x;
        xv[4 * q + 1] = v.y;
        xv[4 * q + 2] = v.z;
        xv[4 * q + 3] = v.w;
    }
}

/* s + the dot product of one chunk of weights with its E values of x, in element order. bf16 widens with a
 * shift (low element) or a mask (high element), f16 with a conversion; both exact. */
template <int WDT, int E>
static __device__ __forceinline__ float gv_dot(const uint4 q, const float (&xv)[E], float s)
{
    const uint32_t word[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (WDT == BERTH_DTYPE_BF16) {
            s = fmaf(xv[2 * i], __uint_as_float(word[i] << 16), s);
            s = fmaf(xv[2 * i + 1], __uint_as_float(word[i] & 0xffff0000u), s);
        } else if (WDT == BERTH_DTYPE_F16) {
            s = fmaf(xv[2 * i], __half2float(__ushort_as_half((unsigned short)(word[i] & 0xffffu))), s);
            s = fmaf(xv[2 * i + 1], __half2float(__ushort_as_half((unsigned short)(word[i] >> 16))), s);
        } else {
            s = fmaf(xv[i], __uint_as_float(word[i]), s);
        }
    }
    return s;
}

/* Output n0 + t (t < outputs per team) from the row sums s0, s1: + bias, the gated epilogue, + old y. HALVES: s0
 * is the gate row's sum, s1 the up row's, one output n0. */
/* The GLU template argument: the epilogue's berth GLU mode, plus GV_GELU where the activation is GELU-tanh fixed at
 * compile time (Gemma's) — those instances carry no code for the other activations: 8 KB instead of 14 (machine
 * code a kernel carries costs at every launch: bench/RESULTS.md session 17). BERTH_CUDA_GEMV_GELU=0 keeps the
 * general instances. */
#define GV_GELU 16
static __host__ __device__ constexpr int gv_mode(int glu)
{
    return glu & (GV_GELU - 1);
}

template <int GLU>
static __device__ __forceinline__ float gv_act(const cu_gemv1_args &a, float v)
{
    if constexpr ((GLU & GV_GELU) != 0)
        return cu_gelu_tanh(v);
    else
        return cu_act(a.glu_act, v);
}

template <int GLU>
static __device__ __forceinline__ void gv_store(const cu_gemv1_args &a, int64_t n0, int t, float s0, float s1)
{
    constexpr int MODE = gv_mode(GLU);
    const int64_t n = MODE == BERTH_GLU_HALVES ? n0 : n0 + t;
    if (n >= a.N)
        return;
    float v = MODE == BERTH_GLU_HALVES || t == 0 ? s0 : s1;
    float vu = s1;
    if (a.bias) {
        v += cu_ld(a.bias, a.bias_dt, n);
        if (MODE == BERTH_GLU_HALVES)
            vu += cu_ld(a.bias, a.bias_dt, a.N + n);
    }
    if constexpr (MODE == BERTH_GLU_HALVES)
        v = gv_act<GLU>(a, v) * vu;
    else if constexpr (MODE == BERTH_GLU_MUL)
        v = gv_act<GLU>(a, v) * a.u[n];
    if (a.accumulate)
        v += a.y[n];
    a.y[n] = v;
}

/* The end of both kernels, for thread t of team `team` (outputs from n0; active: n0 < N): the partial row sums
 * s0, s1 of the team's threads are added up (through red when the team spans several warps: every thread of the
 * block comes here, for the __syncthreads), the team's first RO threads store its outputs, and YN instances
 * finish the trailing norm (gemv_norm.cuh). */
template <int TPR, int GLU, bool YN>
static __device__ __forceinline__ void gv_finish(const cu_gemv1_args &a, float (&red)[GV_THREADS / 32][2], int t,
                                                 int team, int64_t n0, bool active, float s0, float s1)
{
    constexpr int RO = gv_mode(GLU) == BERTH_GLU_HALVES ? 1 : 2; /* outputs per team */
    s0 = cu_warp_sum(s0);
    s1 = cu_warp_sum(s1);
    if constexpr (TPR > 32) { /* the team spans several warps: add their sums through shared memory */
        constexpr int WPT = TPR / 32;
        const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
        if (lane == 0) {
            red[warp][0] = s0;
            red[warp][1] = s1;
        }
        __syncthreads();
        if (t < RO) {
            s0 = s1 = 0.0f;
#pragma unroll
            for (int q = 0; q < WPT; q++) {
                s0 += red[team * WPT + q][0];
                s1 += red[team * WPT + q][1];
            }
        }
    }
    if (active && t < RO)
        gv_store<GLU>(a, n0, t, s0, s1);
    if constexpr (YN) /* the trailing norm (gemv_norm.cuh) */
        cu_ynorm_finish(a.yn);
}

/* A team of TPR threads computes one row pair: outputs n0, n0 + 1 (rows n0, n0 + 1 of w), or with HALVES output
 * n0 from gate row n0 and up row N + n0. Thread t takes chunks t, t + TPR, ... of both rows. */
template <int WDT, int TPR, int GLU, bool YN, bool XP>
__global__ void __launch_bounds__(GV_THREADS, GV_MIN_BLOCKS) gv_kernel(const cu_gemv1_args a)
{
    extern __shared__ __align__(16) char gv_smem[]; /* XP: x rebuilt by the prologue (gemv_xpre.cuh) */
    constexpr int U = GV_U;
    constexpr int TEAMS = GV_THREADS / TPR;
    constexpr int RO = gv_mode(GLU) == BERTH_GLU_HALVES ? 1 : 2; /* outputs per team */
    constexpr int E = WDT == BERTH_DTYPE_F32 ? 4 : 8;   /* elements per chunk */
    constexpr int WS = TPR * 16;                        /* bytes of a row from one chunk of a thread to its next */
    constexpr int XS = TPR * E;                         /* floats of x between them */
    __shared__ float red[GV_THREADS / 32][2];
    cu_pdl_trigger();
    const int t = (int)threadIdx.x % TPR, team = (int)threadIdx.x / TPR;
    /* XP instances are persistent (one wave of blocks, each taking row groups vb, vb + gridDim.x, ...: a.nvb in
     * all), so that the prologue runs once per block instead of once per wave; the others take group blockIdx.x */
    const int64_t nvb = XP ? a.nvb : (int64_t)gridDim.x;
    uint4 q0[U], q1[U]; /* slot u: chunk j + u of rows 0 and 1 during the step at j */
    for (int64_t vb = blockIdx.x; vb < nvb; vb += gridDim.x) {
        const int64_t n0 = (vb * TEAMS + team) * RO;
        const bool active = n0 < a.N; /* no early return: teams of > 32 threads meet at __syncthreads below */
        /* an inactive team, and the second row past N, point at row N - 1: in bounds, never loaded / stored */
        const int64_t na = active ? n0 : a.N - 1;
        const int64_t nb = RO == 1 ? a.N + na : na + 1 < a.N ? na + 1 : na;
        const char *w0 = a.w + na * a.ldw + t * 16, *w1 = a.w + nb * a.ldw + t * 16;
        const int nj = active && t < a.nch ? (a.nch - 1 - t) / TPR + 1 : 0; /* this thread's chunks of a row */

        /* the group's first step of weights: before the wait where w is a weights buffer (a.early), after it
         * otherwise; later groups of a persistent block are past the wait either way */
        auto load_first = [&]() {
#pragma unroll
            for (int u = 0; u < U; u++)
                if (u < nj) {
                    q0[u] = cu_ld_stream16(w0 + u * WS);
                    q1[u] = cu_ld_stream16(w1 + u * WS);
                }
        };
        if (a.early)
            load_first();
        if (vb == blockIdx.x) {
            if constexpr (XP)
                if (a.xp.early)
                    cu_xpre_load_weights(a.xp, (int64_t)a.nch * E, gv_smem);
            cu_pdl_wait();
        }
        if (!a.early)
            load_first();
        if constexpr (XP) { /* the norm before the product: x is rebuilt in shared memory, once per block */
            if (vb == blockIdx.x) {
                if (!a.xp.early)
                    cu_xpre_load_weights(a.xp, (int64_t)a.nch * E, gv_smem);
                cu_xpre_run(a.xp, (int64_t)a.nch * E, gv_smem);
            }
        }

        const float *xp = (XP ? reinterpret_cast<const float *>(gv_smem) : a.x) + t * E;
        float s0 = 0.0f, s1 = 0.0f;
        int j = 0;
        /* Whole steps: each slot, once multiplied, is reloaded with the same slot of the next step. */
        for (; j + U <= nj; j += U) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                float xv[E];
                gv_ld_x<E>(xp + u * XS, xv);
                s0 = gv_dot<WDT, E>(q0[u], xv, s0);
                s1 = gv_dot<WDT, E>(q1[u], xv, s1);
                if (j + U + u < nj) {
                    q0[u] = cu_ld_stream16(w0 + (U + u) * WS);
                    q1[u] = cu_ld_stream16(w1 + (U + u) * WS);
                }
            }
            w0 += U * WS;
            w1 += U * WS;
            xp += U * XS;
        }
        /* The last nj - j < U chunks, loaded by the last whole step (or before the loop) into slots 0.. */
#pragma unroll
        for (int u = 0; u < U - 1; u++)
            if (j + u < nj) {
                float xv[E];
                gv_ld_x<E>(xp + u * XS, xv);
                s0 = gv_dot<WDT, E>(q0[u], xv, s0);
                s1 = gv_dot<WDT, E>(q1[u], xv, s1);
            }

        gv_finish<TPR, GLU, YN>(a, red, t, team, n0, active, s0, s1);
        if constexpr (!XP)
            break;
        if constexpr (TPR > 32)
            __syncthreads(); /* red[] is read by gv_finish before the next group writes it */
    }
}

/* The same product with the weights staged through shared memory by cp.async (BERTH_CUDA_GEMV=async, for A/B
 * runs): each thread keeps GV_STAGES chunk pairs of its own (no barrier: a thread reads only what it copied),
 * GV_STAGES - 1 of them in flight at every moment, including while it computes, and registers hold no load
 * buffers (48 registers, 5 blocks and 40 warps per SM: up to 160 KiB in flight per SM against 128 KiB for the
 * register kernel, which has nothing in flight while it computes). Costs 2 shared loads per chunk pair. The
 * chunks are summed in the same order as gv_kernel's. */
template <int WDT, int TPR, int GLU, bool YN>
__global__ void __launch_bounds__(GV_THREADS, GV_ASYNC_MIN_BLOCKS)
gv_async_kernel(const cu_gemv1_args a)
{
    constexpr int S = GV_STAGES;
    constexpr int RO = gv_mode(GLU) == BERTH_GLU_HALVES ? 1 : 2;
    constexpr int E = WDT == BERTH_DTYPE_F32 ? 4 : 8;
    constexpr int WS = TPR * 16, XS = TPR * E;
    __shared__ uint4 stage[S][2][GV_THREADS]; /* [slot][row][thread]: a warp's 16-byte accesses are contiguous */
    __shared__ float red[GV_THREADS / 32][2];
    cu_pdl_trigger();
    const int tid = (int)threadIdx.x, t = tid % TPR, team = tid / TPR;
    const int64_t n0 = ((int64_t)blockIdx.x * (GV_THREADS / TPR) + team) * RO;
    const bool active = n0 < a.N;
    const int64_t na = active ? n0 : a.N - 1;
    const int64_t nb = RO == 1 ? a.N + na : na + 1 < a.N ? na + 1 : na;
    const char *w0 = a.w + na * a.ldw + t * 16, *w1 = a.w + nb * a.ldw + t * 16;
    const int nj = active && t < a.nch ? (a.nch - 1 - t) / TPR + 1 : 0;

    /* chunks 0 .. S - 2 into slots 0 .. S - 2, one commit group each (empty past nj) */
    if (a.early) {
#pragma unroll
        for (int u = 0; u < S - 1; u++) {
            if (u < nj) {
                cu_cp16((uint16_t *)&stage[u][0][tid], w0 + u * WS, 16);
                cu_cp16((uint16_t *)&stage[u][1][tid], w1 + u * WS, 16);
            }
            cu_cp_commit();
        }
    }
    cu_pdl_wait();
    if (!a.early) {
#pragma unroll
        for (int u = 0; u < S - 1; u++) {
            if (u < nj) {
                cu_cp16((uint16_t *)&stage[u][0][tid], w0 + u * WS, 16);
                cu_cp16((uint16_t *)&stage[u][1][tid], w1 + u * WS, 16);
            }
            cu_cp_commit();
        }
    }

    const float *xp = a.x + t * E;
    const char *p0 = w0 + (S - 1) * WS, *p1 = w1 + (S - 1) * WS; /* chunk j + S - 1 */
    float s0 = 0.0f, s1 = 0.0f;
    int rd = 0, wr = S - 1; /* slots of chunk j and of chunk j + S - 1 (the one chunk j - 1 left) */
    for (int j = 0; j < nj; j++) {
        cu_cp_wait<S - 2>(); /* groups 0 .. j are complete: chunk j is in slot rd */
        if (j + S - 1 < nj) {
            cu_cp16((uint16_t *)&stage[wr][0][tid], p0, 16);
            cu_cp16((uint16_t *)&stage[wr][1][tid], p1, 16);
        }
        cu_cp_commit();
        const uint4 q0 = stage[rd][0][tid], q1 = stage[rd][1][tid];
        float xv[E];
        gv_ld_x<E>(xp, xv);
        s0 = gv_dot<WDT, E>(q0, xv, s0);
        s1 = gv_dot<WDT, E>(q1, xv, s1);
        p0 += WS;
        p1 += WS;
        xp += XS;
        rd = rd + 1 == S ? 0 : rd + 1;
        wr = wr + 1 == S ? 0 : wr + 1;
    }

    gv_finish<TPR, GLU, YN>(a, red, t, team, n0, active, s0, s1);
}

/* YN: the kernel also finishes the trailing norm a.yn (gemv_norm.cuh); instances without it carry no code for
 * it, so products without a norm run exactly the kernels they ran before. */
template <int WDT, int GLU, bool YN, int TPR>
static cudaError_t gv_launch_tpr(berth_backend *be, cudaStream_t cs, dim3 grid, bool async, const cu_gemv1_args &a)
{
    if (a.xp.on) /* the norm before the product (cu_xpre_plan: never with the async kernel or a trailing norm) */
        return cu_launch(be, cs, dim3((unsigned)(a.nvb < a.wave ? a.nvb : a.wave)), dim3(GV_THREADS),
                         cu_xpre_smem((int64_t)a.nch * (WDT == BERTH_DTYPE_F32 ? 4 : 8), a.xp.es1, a.xp.es2),
                         gv_kernel<WDT, TPR, GLU, false, true>, a);
    return async ? cu_launch(be, cs, grid, dim3(GV_THREADS), 0, gv_async_kernel<WDT, TPR, GLU, YN>, a)
                 : cu_launch(be, cs, grid, dim3(GV_THREADS), 0, gv_kernel<WDT, TPR, GLU, YN, false>, a);
}

template <int WDT, int GLU, bool YN>
static cudaError_t gv_launch(berth_backend *be, cudaStream_t cs, dim3 grid, bool async, const cu_gemv1_args &a)
{
    switch (a.tpr_log2) {
    case 5: return gv_launch_tpr<WDT, GLU, YN, 32>(be, cs, grid, async, a);
    case 6: return gv_launch_tpr<WDT, GLU, YN, 64>(be, cs, grid, async, a);
    case 7: return gv_launch_tpr<WDT, GLU, YN, 128>(be, cs, grid, async, a);
    default: return gv_launch_tpr<WDT, GLU, YN, 256>(be, cs, grid, async, a);
    }
}

template <int WDT>
static cudaError_t gv_launch_w(berth_backend *be, cudaStream_t cs, dim3 grid, bool async, const cu_gemv1_args &a)
{
    /* the epilogue is a template argument: the plain kernel carries no activation code; the trailing norm only
     * follows a plain product (cu_ynorm_plan's caller) */
    if constexpr (WDT == BERTH_DTYPE_BF16) { /* GELU-tanh fixed: only where Gemma runs (bf16 weights) */
        if (be->gemv_gelu && a.glu_act == BERTH_ACT_GELU_TANH && a.glu == BERTH_GLU_HALVES)
            return gv_launch<WDT, BERTH_GLU_HALVES | GV_GELU, false>(be, cs, grid, async, a);
        if (be->gemv_gelu && a.glu_act == BERTH_ACT_GELU_TANH && a.glu == BERTH_GLU_MUL)
            return gv_launch<WDT, BERTH_GLU_MUL | GV_GELU, false>(be, cs, grid, async, a);
    }
    switch (a.glu) {
    case BERTH_GLU_HALVES: return gv_launch<WDT, BERTH_GLU_HALVES, false>(be, cs, grid, async, a);
    case BERTH_GLU_MUL: return gv_launch<WDT, BERTH_GLU_MUL, false>(be, cs, grid, async, a);
    default:
        return a.yn.count ? gv_launch<WDT, BERTH_GLU_NONE, true>(be, cs, grid, async, a)
                          : gv_launch<WDT, BERTH_GLU_NONE, false>(be, cs, grid, async, a);
    }
}

cudaError_t cu_gemv1(berth_backend *be, cudaStream_t cs, const cu_gemv1_args &a_in)
{
    cu_gemv1_args a = a_in;
    const int64_t RO = a.glu == BERTH_GLU_HALVES ? 1 : 2;
    const int64_t groups = (a.N + RO - 1) / RO;
    const bool async = be->gemv_mode == CU_GEMV_ASYNC;
    /* threads per row pair: the largest power of two that keeps groups * tpr within one wave (n_sms * 4 blocks
     * of 256, or be->gemv_bps; 5 for the async kernel), 32..256, and no wider than a row has chunks */
    const int bps = be->gemv_bps >= 1 && be->gemv_bps <= GV_MIN_BLOCKS ? be->gemv_bps : GV_MIN_BLOCKS;
    const int64_t want = (int64_t)(be->n_sms > 0 ? be->n_sms : 132) * (async ? GV_ASYNC_MIN_BLOCKS : bps) * GV_THREADS;
    int lg = 0;
    while (((int64_t)2 << lg) * groups <= want)
        lg++;
    int cap = 0;
    while (((int64_t)1 << cap) < a.nch)
        cap++;
    lg = lg > cap ? cap : lg;
    lg = lg < 5 ? 5 : lg > 8 ? 8 : lg;
    a.tpr_log2 = lg;
    const int64_t teams = GV_THREADS >> lg;
    const dim3 grid((unsigned)((groups + teams - 1) / teams));
    a.nvb = grid.x;
    a.wave = (int64_t)(be->n_sms > 0 ? be->n_sms : 132) * GV_MIN_BLOCKS;
    switch (a.wdt) {
    case BERTH_DTYPE_BF16: return gv_launch_w<BERTH_DTYPE_BF16>(be, cs, grid, async, a);
    case BERTH_DTYPE_F16: return gv_launch_w<BERTH_DTYPE_F16>(be, cs, grid, async, a);
    default: return gv_launch_w<BERTH_DTYPE_F32>(be, cs, grid, async, a);
    }
}

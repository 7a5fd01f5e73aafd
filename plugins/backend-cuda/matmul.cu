/*
 * matmul.cu — y[m, n] = sum_k x[m, k] w[n, k] (+ bias[n]) (+ y[m, n] if accumulate); x, y f32, w f32/bf16/f16
 * packed {K, N}, fp32 accumulation. Higher dims of x and y are flattened into M.
 *
 * Why it is built this way:
 *  - Decode (M <= MM_GEMV_MAX_M) reads every weight once and does 2*M flops per weight: it is bound by memory
 *    bandwidth, so the GEMV kernel only has to keep enough 16-byte weight loads in flight. A "team" of 32..256
 *    threads owns R consecutive rows of w and strides over K in 16-byte chunks (two chunks per step, so 2*R loads
 *    are outstanding per thread); the team size is picked so that up to n_sms * 1024 threads run, which gives
 *    short-and-wide matrices (N = 262144) a warp per row pair and tall-and-narrow ones (K = 12288, N = 1536) 128
 *    threads per row pair, all resident in one wave. Weights are streamed with ld.global.L1::no_allocate so
 *    they do not evict x, which every team re-reads through L1 (M*K floats: 48 KiB at K = 12288, M = 1).
 *    bf16/f16 are widened in registers (a shift or cvt), never converted up front. Rows of w that are not 16-byte
 *    aligned (odd K, K not a multiple of 16 bytes, odd offsets) take the same kernel with scalar loads; x rows
 *    that are not 16-byte aligned are gathered into the workspace first (M*K floats). M = 1 with 16-byte chunks
 *    goes to gemv.cu's kernel instead (8 loads in flight per thread instead of 4, ~20 SASS instructions per bf16
 *    chunk instead of ~39: see there); BERTH_CUDA_GEMV=old (read at init) keeps it on this one for A/B runs.
 *    Larger M stays here: its R = 4 rows and MB accumulators per thread leave no registers for more loads.
 *  - Batched decode (bf16 mode, bf16/f16 weights, 5 <= M <= 64 by default: BERTH_CUDA_SKINNY) is still weight
 *    bound and goes to the weight-streaming tensor-core kernel of matmul_skinny.cu (with the norm prologue and
 *    the gated epilogue) where its layout rules allow.
 *  - Larger M is compute bound: cuBLAS. In bf16 compute mode, bf16/f16 weights stay as stored and x is rounded to
 *    the weight dtype into the stream workspace, then a tensor-core GEMM with fp32 output and fp32 accumulation;
 *    f32 weights use CUBLAS_COMPUTE_32F_FAST_16BF. In fp32 mode f32 weights use CUBLAS_COMPUTE_32F (the handle
 *    is in default math mode: no TF32). bf16/f16 weights in fp32 mode are widened (exactly) into the workspace a
 *    slab of rows at a time and multiplied by fp32 cuBLAS: cuBLAS's fp32 kernels are far better tuned than a
 *    hand-written SIMT GEMM would be, and the widening pass costs about 3x the bf16 weight bytes of extra memory
 *    traffic, small next to the fp32 GEMM's compute time at M > 8; fp32 mode is the parity mode, not the fast one.
 *  - cuBLAS sees row-major y = x w^T as column-major Y^T (N x M, ld = y's row stride) = W (N x K) * X^T: w's
 *    K-contiguous rows are a column-major K x N matrix used transposed (lda = K), x's rows a column-major K x M
 *    matrix used as is (ldb = x's row stride). x rows that one stride cannot walk are gathered into the
 *    workspace; y rows that one stride cannot walk get a workspace result that an epilogue scatters.
 *  - Bias: folded into the GEMV's store; before a cuBLAS GEMM a small kernel sets y = (accumulate ? y : 0) + bias
 *    and the GEMM runs with beta = 1.
 *  - Launches go through cu_launch (cuda_launch.cuh, programmatic dependent launch). At decode most GEMVs are
 *    small enough that one round of weight loads is the whole kernel, so their time is latency: the launch, one
 *    DRAM round trip, the reduction. The GEMV therefore issues its first step of weight loads before it waits for
 *    the previous kernel (while that kernel still runs) when w lives in a BERTH_USAGE_WEIGHTS buffer, which no
 *    kernel writes; x, y and bias are touched only after the wait.
 *  - The RMS-norm prologue (x_norm_mode) is applied by the pass that gathers x (mm_pack_x: one block per row
 *    computes rstd and writes the normalised row, f32 for the GEMV, the weight dtype for cuBLAS), so the product
 *    kernels never see it; the skinny kernel applies it itself (matmul_skinny.cu). Folding it into the GEMV's
 *    dot products (squares summed alongside, the norm weight multiplied into x per chunk) was measured on the
 *    H200 and dropped: the M = 1 GEMV is close to the SM's instruction-issue limit at full bandwidth, and the
 *    extra multiply-adds per weight chunk made the qkv and gate|up products 1.5-2x slower than the gather launch
 *    they saved (batch-1 decode 372 -> 323 tok/s).
 *  - A norm before the product (x_pre, a post-norm whose output is x) is launched first (cu_matmul_run's pre),
 *    except at batch 1 where cu_xpre_plan may put it in the GEMV's prologue (off by default). On the cuBLAS path
 *    in bf16 mode its kernel also writes the rounded copy of x into the workspace (cu_rms_norm_packed), so no pack
 *    runs: one launch less per such product (+2.9% at 32 sequences, bench/RESULTS.md session 8).
 *  - A trailing norm (y_norm) after a plain GEMV product runs in the grid's last block (gemv_norm.cuh; the
 *    kernels' YN instances) instead of a second launch, where cu_ynorm_plan allows; cu_op_matmul_then_norm
 *    (norm.cu) launches it otherwise.
 *  - No split-K: at the Gemma 4 decode shapes the team-size rule below already has every (row, 16-byte chunk)
 *    load of the small matrices in flight at once (N = 256..512, K = 1536: 256-thread teams, one chunk per thread
 *    per row), and the tall ones (K = 6144..12288, N = 1536) fill the GPU in one wave with 4 loads per thread in
 *    flight; more blocks would only add a second wave and a reduction pass. x is read through L1 (6 KiB at K =
 *    1536), not staged in shared memory: staging costs a barrier after the wait, on the critical path.
 */
#include "cuda_internal.h"
#include "cuda_device.cuh"
#include "cuda_launch.cuh"
#include "gemv.cuh"

#include <inttypes.h>
#include <limits.h>
#include <string.h>

/* matmul_skinny.cu: the weight-streaming tensor-core kernel for be->skinny_min_m <= M <= 64 (bf16 mode); *ran
 * false when it does not apply (nothing enqueued). */
berth_status cu_matmul_skinny(berth_backend *be, berth_stream *s, const berth_matmul_params *p, int64_t M, int64_t N,
                              int64_t K, bool *ran, const berth_rms_norm_params *pre);

#define MM_GEMV_MAX_M 8                  /* M up to this uses the GEMV kernel in both compute modes */
#define MM_THREADS 256                   /* GEMV block size */
static_assert(MM_THREADS == CU_YNORM_THREADS && MM_GEMV_MAX_M <= CU_YNORM_THREADS / 32,
              "the trailing norm (gemv_norm.cuh): a warp per row");
#define MM_SLAB_BYTES ((int64_t)64 << 20) /* fp32 mode, bf16/f16 weights: widened rows per cuBLAS call */
#define MM_WS_ALIGN 256
/* GEMV blocks per SM the register allocation must allow (48 / 64 / 128 registers): 40 resident warps keep enough
 * loads in flight at M = 1; the M = 5..8 kernel needs its accumulators and stays at 16 warps. */
static constexpr int mm_min_blocks(int mb)
{
    return mb == 1 ? 5 : mb == 2 ? 4 : 2;
}

static int64_t mm_round_up(int64_t v, int64_t to)
{
    return (v + to - 1) / to * to;
}

static size_t mm_dtype_size(int dt)
{
    return dt == BERTH_DTYPE_F32 ? 4 : 2;
}

// ---------------------------------------------------------------------------------------------------------------
// GEMV (M <= MM_GEMV_MAX_M).

struct mm_gemv_args {
    const float *x[MM_GEMV_MAX_M]; /* row m of x (entries >= M repeat row 0: valid, never stored from) */
    float *y[MM_GEMV_MAX_M];
    const char *w;
    int64_t ldw;                   /* bytes from one row of w to the next */
    const void *bias;              /* NULL: none */
    int64_t K, N;
    int64_t nch;                   /* chunks per row of w: 16-byte chunks (vector kernel) or elements (scalar) */
    int32_t bias_dt;
    int32_t M;                     /* rows present, <= the kernel's MB */
    int32_t accumulate;
    int32_t tpr_log2;              /* threads per row team = 1 << tpr_log2, 32..MM_THREADS */
    int32_t early;                 /* w may be read before cu_pdl_wait (a weights buffer: no kernel writes it) */
    /* the gated epilogue: N counts outputs; with HALVES a team's first R/2 rows are gate rows n, the others the
     * up rows N + n of the same outputs */
    int32_t glu;                   /* BERTH_GLU_NONE / HALVES / MUL */
    int32_t glu_act;
    const float *u[MM_GEMV_MAX_M]; /* MUL: row m of y_glu_up */
    cu_ynorm yn;                   /* the trailing norm the last block runs on y (count NULL: none; gemv_norm.cuh) */
};

/* Factor the prologue's weight mode applies to x[k]: w, 1 + w, or 1 (UNIT). */
static __device__ __forceinline__ float mm_norm_factor(const void *nw, int dt, int mode, int64_t k)
{
    if (mode == BERTH_NORM_W)
        return cu_ld(nw, dt, k);
    if (mode == BERTH_NORM_W_ONE_PLUS)
        return 1.0f + cu_ld(nw, dt, k);
    return 1.0f;
}

/* One 32-bit word holding weights, widened: bf16 pair, f16 pair (element 0 in the low half) or one f32. */
template <int WDT>
static __device__ __forceinline__ void mm_widen_word(uint32_t u, float *f)
{
    if (WDT == BERTH_DTYPE_BF16) {
        f[0] = __uint_as_float(u << 16);
        f[1] = __uint_as_float(u & 0xffff0000u);
    } else if (WDT == BERTH_DTYPE_F16) {
        f[0] = __half2float(__ushort_as_half((unsigned short)(u & 0xffffu)));
        f[1] = __half2float(__ushort_as_half((unsigned short)(u >> 16)));
    } else {
        f[0] = __uint_as_float(u);
    }
}

/* Element k of a weight row, scalar path. */
template <int WDT>
static __device__ __forceinline__ float mm_ld_w1(const char *row, int64_t k)
{
    if (WDT == BERTH_DTYPE_BF16)
        return __uint_as_float((uint32_t)((const unsigned short *)row)[k] << 16);
    if (WDT == BERTH_DTYPE_F16)
        return __half2float(__ushort_as_half(((const unsigned short *)row)[k]));
    return ((const float *)row)[k];
}

/* A chunk of one weight row: 16 bytes (VEC) or one element. */
template <int WDT, bool VEC>
struct mm_chunk;

template <int WDT>
struct mm_chunk<WDT, true> {
    static constexpr int E = WDT == BERTH_DTYPE_F32 ? 4 : 8; /* elements per chunk */
    uint4 raw;
    __device__ __forceinline__ void load(const char *row, int64_t c) { raw = cu_ld_stream16(row + c * 16); }
    __device__ __forceinline__ void widen(float *f) const
    {
        constexpr int W = WDT == BERTH_DTYPE_F32 ? 1 : 2; /* elements per 32-bit word */
        mm_widen_word<WDT>(raw.x, f);
        mm_widen_word<WDT>(raw.y, f + W);
        mm_widen_word<WDT>(raw.z, f + 2 * W);
        mm_widen_word<WDT>(raw.w, f + 3 * W);
    }
};

template <int WDT>
struct mm_chunk<WDT, false> {
    static constexpr int E = 1;
    float v;
    __device__ __forceinline__ void load(const char *row, int64_t c) { v = mm_ld_w1<WDT>(row, c); }
    __device__ __forceinline__ void widen(float *f) const { f[0] = v; }
};

/* x[m][c*E .. c*E+E) (16-byte aligned when E > 1). */
template <int E>
static __device__ __forceinline__ void mm_ld_x(const float *xr, int64_t c, float *xv)
{
    if (E == 1) {
        xv[0] = xr[c];
    } else {
        const float4 *p = reinterpret_cast<const float4 *>(xr + c * E);
#pragma unroll
        for (int q = 0; q < E / 4; q++) {
            const float4 v = p[q];
            xv[4 * q + 0] = v.x;
            xv[4 * q + 1] = v.y;
            xv[4 * q + 2] = v.z;
            xv[4 * q + 3] = v.w;
        }
    }
}

/* acc[m][r] += x[m] . w[r] over chunk c. */
template <int WDT, int MB, int R, bool VEC>
static __device__ __forceinline__ void mm_fma_chunk(float (&acc)[MB][R], const mm_chunk<WDT, VEC> (&ch)[R],
                                                    const float *const (&xr)[MB], int64_t c)
{
    constexpr int E = mm_chunk<WDT, VEC>::E;
    float wf[R][E];
#pragma unroll
    for (int r = 0; r < R; r++)
        ch[r].widen(wf[r]);
#pragma unroll
    for (int m = 0; m < MB; m++) {
        float xv[E];
        mm_ld_x<E>(xr[m], c, xv);
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int e = 0; e < E; e++)
                acc[m][r] = fmaf(xv[e], wf[r][e], acc[m][r]);
    }
}

/* Final value of output (m, n0 + j): the product v (and vu, the up row's, with HALVES), + bias, then the gated
 * epilogue, + old y when accumulating (never with an epilogue). */
template <int MB, int GLU>
static __device__ __forceinline__ void mm_gemv_store(const mm_gemv_args &a, int64_t n0, int m, int j, float v,
                                                     float vu)
{
    const int64_t n = n0 + j;
    if (m >= a.M || n >= a.N)
        return;
    float *yr = a.y[0];
    const float *ur = a.u[0];
#pragma unroll
    for (int q = 1; q < MB; q++) /* static indices: a dynamic one would copy the params to local memory */
        if (q == m) {
            yr = a.y[q];
            ur = a.u[q];
        }
    if (a.bias) {
        v += cu_ld(a.bias, a.bias_dt, n);
        if (GLU == BERTH_GLU_HALVES)
            vu += cu_ld(a.bias, a.bias_dt, a.N + n);
    }
    if constexpr (GLU == BERTH_GLU_HALVES)
        v = cu_act(a.glu_act, v) * vu;
    else if constexpr (GLU == BERTH_GLU_MUL)
        v = cu_act(a.glu_act, v) * ur[n];
    if (a.accumulate)
        v += yr[n];
    yr[n] = v;
}

/* Lane t of a team of at most one warp stores output t = m * RO + j (RO outputs per team; the up row's sum sits at j + RO
 * when RO < R). RO is a template argument so that every index below is static: with a runtime RO the compiler
 * kept acc in local memory. */
template <int MB, int R, int RO, int GLU>
static __device__ __forceinline__ void mm_lane_store(const mm_gemv_args &a, int64_t n0, int t,
                                                     const float (&acc)[MB][R])
{
    float v = 0.0f, vu = 0.0f;
#pragma unroll
    for (int m = 0; m < MB; m++)
#pragma unroll
        for (int j = 0; j < RO; j++)
            if (t == m * RO + j) {
                v = acc[m][j];
                if (RO < R)
                    vu = acc[m][j + (RO < R ? RO : 0)];
            }
    mm_gemv_store<MB, GLU>(a, n0, t / RO, t % RO, v, vu);
}

/* One step's chunks of this thread: chunk c of each row into c0, chunk c + tpr into c1 (PAIR only), each only
 * where it exists (c < nch). */
template <int WDT, int R, bool VEC, bool PAIR>
static __device__ __forceinline__ void mm_step_loads(mm_chunk<WDT, VEC> (&c0)[R], mm_chunk<WDT, VEC> (&c1)[R],
                                                      const char *const (&wr)[R], int64_t c, int tpr, int64_t nch)
{
    if (c < nch)
#pragma unroll
        for (int r = 0; r < R; r++)
            c0[r].load(wr[r], c);
    if (PAIR && c + tpr < nch)
#pragma unroll
        for (int r = 0; r < R; r++)
            c1[r].load(wr[r], c + tpr);
}

template <int WDT, int MB, int R, bool VEC, int GLU, bool YN>
__global__ void __launch_bounds__(MM_THREADS, mm_min_blocks(MB))
mm_gemv_kernel(const mm_gemv_args a)
{
    __shared__ float red[MM_THREADS / 32][MB * R];
    cu_pdl_trigger();
    const int tpr = 1 << a.tpr_log2;
    const int team = (int)threadIdx.x >> a.tpr_log2;
    const int t = (int)threadIdx.x & (tpr - 1);
    constexpr int RO = GLU == BERTH_GLU_HALVES ? R / 2 : R; /* outputs per team */
    const int64_t n0 = ((int64_t)blockIdx.x * (MM_THREADS >> a.tpr_log2) + team) * RO;
    const bool active = n0 < a.N; /* no early return: teams of > 32 threads meet at __syncthreads below */

    const float *xr[MB];
#pragma unroll
    for (int m = 0; m < MB; m++)
        xr[m] = a.x[m];
    const char *wr[R];
#pragma unroll
    for (int r = 0; r < R; r++) { /* outputs past N repeat the last one: loads stay in bounds, results dropped */
        int64_t n = n0 + (r < RO ? r : r - RO);
        n = n < a.N ? n : a.N - 1;
        wr[r] = a.w + (r < RO ? n : a.N + n) * a.ldw; /* r >= RO only with HALVES: the up row of output n */
    }

    float acc[MB][R];
#pragma unroll
    for (int m = 0; m < MB; m++) {
#pragma unroll
        for (int r = 0; r < R; r++)
            acc[m][r] = 0.0f;
    }

    /* Two chunks per step (2*R loads in flight), except at MB = 8 where the second chunk's registers would spill:
     * there R = 4 loads per step are in flight. The first step's loads are issued before the wait for the previous
     * kernel when w is a weights buffer (a.early), else right after it. */
    constexpr bool PAIR = MB * R <= 16;
    int64_t c = t;
    const int64_t nch = active ? a.nch : 0; /* an inactive team loads and computes nothing */
    mm_chunk<WDT, VEC> c0[R], c1[R];       /* the step's chunks: c0 at chunk c, c1 at c + tpr */
    if (a.early)
        mm_step_loads<WDT, R, VEC, PAIR>(c0, c1, wr, c, tpr, nch);
    cu_pdl_wait();
    if (!a.early)
        mm_step_loads<WDT, R, VEC, PAIR>(c0, c1, wr, c, tpr, nch);

    /* Each step computes the chunks loaded for it, then loads the next step's (where they exist). */
    if constexpr (PAIR) {
        while (c + tpr < nch) {
            mm_fma_chunk<WDT, MB, R, VEC>(acc, c0, xr, c);
            mm_fma_chunk<WDT, MB, R, VEC>(acc, c1, xr, c + tpr);
            c += 2 * tpr;
            mm_step_loads<WDT, R, VEC, PAIR>(c0, c1, wr, c, tpr, nch);
        }
        if (c < nch) /* the odd last chunk */
            mm_fma_chunk<WDT, MB, R, VEC>(acc, c0, xr, c);
    } else {
#pragma unroll 1
        while (c < nch) {
            mm_fma_chunk<WDT, MB, R, VEC>(acc, c0, xr, c);
            c += tpr;
            mm_step_loads<WDT, R, VEC, PAIR>(c0, c1, wr, c, tpr, nch);
        }
    }

#pragma unroll
    for (int m = 0; m < MB; m++) {
#pragma unroll
        for (int r = 0; r < R; r++)
            acc[m][r] = cu_warp_sum(acc[m][r]);
    }

    if (tpr > 32) { /* the team spans several warps: add the warps' sums through shared memory */
        const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
        if (lane == 0)
#pragma unroll
            for (int m = 0; m < MB; m++) {
#pragma unroll
                for (int r = 0; r < R; r++)
                    red[warp][m * R + r] = acc[m][r];
            }
        __syncthreads();
        if (active && t < MB * RO) { /* thread t stores output (t / RO, n0 + t % RO) */
            const int wpt = tpr >> 5, w0 = team * wpt, m = t / RO, j = t % RO;
            float v = 0.0f, vu = 0.0f;
            for (int q = 0; q < wpt; q++) {
                v += red[w0 + q][m * R + j];
                if (RO < R)
                    vu += red[w0 + q][m * R + j + RO];
            }
            mm_gemv_store<MB, GLU>(a, n0, m, j, v, vu);
        }
    } else if (active && t < MB * RO) { /* every lane holds every sum: lane t stores output t */
        mm_lane_store<MB, R, RO, GLU>(a, n0, t, acc);
    }
    if constexpr (YN) /* the trailing norm (gemv_norm.cuh) */
        cu_ynorm_finish(a.yn);
}

template <int WDT, int MB>
static cudaError_t mm_gemv_launch_mb(berth_backend *be, bool vec, unsigned blocks, cudaStream_t cs,
                                     const mm_gemv_args &a)
{
    constexpr int R = MB <= 2 ? 2 : 4; /* more rows per team for larger M: each x load feeds R rows */
    const dim3 g(blocks), b(MM_THREADS);
    /* the gated epilogue is a template argument: the plain kernel carries no activation code (a runtime switch
     * over cu_act's formulas in every instance made the M = 8 kernel ~40% slower) */
    switch (a.glu) {
    case BERTH_GLU_HALVES:
        return vec ? cu_launch(be, cs, g, b, 0, mm_gemv_kernel<WDT, MB, R, true, BERTH_GLU_HALVES, false>, a)
                   : cu_launch(be, cs, g, b, 0, mm_gemv_kernel<WDT, MB, R, false, BERTH_GLU_HALVES, false>, a);
    case BERTH_GLU_MUL:
        return vec ? cu_launch(be, cs, g, b, 0, mm_gemv_kernel<WDT, MB, R, true, BERTH_GLU_MUL, false>, a)
                   : cu_launch(be, cs, g, b, 0, mm_gemv_kernel<WDT, MB, R, false, BERTH_GLU_MUL, false>, a);
    default: /* the trailing norm (a.yn) only follows a plain product; instances without it carry no code for it */
        if (a.yn.count)
            return vec ? cu_launch(be, cs, g, b, 0, mm_gemv_kernel<WDT, MB, R, true, BERTH_GLU_NONE, true>, a)
                       : cu_launch(be, cs, g, b, 0, mm_gemv_kernel<WDT, MB, R, false, BERTH_GLU_NONE, true>, a);
        return vec ? cu_launch(be, cs, g, b, 0, mm_gemv_kernel<WDT, MB, R, true, BERTH_GLU_NONE, false>, a)
                   : cu_launch(be, cs, g, b, 0, mm_gemv_kernel<WDT, MB, R, false, BERTH_GLU_NONE, false>, a);
    }
}

template <int WDT>
static cudaError_t mm_gemv_launch_w(berth_backend *be, int mb, bool vec, unsigned blocks, cudaStream_t cs,
                                    const mm_gemv_args &a)
{
    switch (mb) {
    case 1: return mm_gemv_launch_mb<WDT, 1>(be, vec, blocks, cs, a);
    case 2: return mm_gemv_launch_mb<WDT, 2>(be, vec, blocks, cs, a);
    case 4: return mm_gemv_launch_mb<WDT, 4>(be, vec, blocks, cs, a);
    default: return mm_gemv_launch_mb<WDT, 8>(be, vec, blocks, cs, a);
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Helper kernels of both paths.

/* The RMS-norm prologue as the gather pass applies it (mode BERTH_NORM_W_NONE: none). */
struct mm_norm {
    const void *w; /* ne {K} for modes W, W_ONE_PLUS, else NULL */
    int dt;
    int mode;
    float eps;
};

/* Four consecutive values to out_dt at element i of out (i a multiple of 4, out 16-byte aligned there for f32,
 * 8-byte for bf16/f16). */
static __device__ __forceinline__ void mm_st4(void *out, int dt, int64_t i, float4 v)
{
    if (dt == BERTH_DTYPE_F32) {
        reinterpret_cast<float4 *>((float *)out + i)[0] = v;
    } else if (dt == BERTH_DTYPE_BF16) {
        __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
        uint2 u;
        u.x = *reinterpret_cast<uint32_t *>(&lo);
        u.y = *reinterpret_cast<uint32_t *>(&hi);
        reinterpret_cast<uint2 *>((__nv_bfloat16 *)out + i)[0] = u;
    } else {
        __half2 lo = __floats2half2_rn(v.x, v.y), hi = __floats2half2_rn(v.z, v.w);
        uint2 u;
        u.x = *reinterpret_cast<uint32_t *>(&lo);
        u.y = *reinterpret_cast<uint32_t *>(&hi);
        reinterpret_cast<uint2 *>((__half *)out + i)[0] = u;
    }
}

/* out[m*ldo + k] = x[m][k] rounded to out_dt (f32: a plain gather). With the prologue, x[m][k] * rstd(m) * the
 * weight factor first. One block per row (the grid loops over rows): the block reduces the row's sum of squares
 * once, then converts the row; VEC (rows 16-byte aligned, K % 4 == 0) moves it in float4s. An earlier version
 * spread a row over several blocks of one element per thread, and every block recomputed rstd: at prefill sizes
 * that ran at a quarter of the bandwidth. */
template <bool VEC>
__global__ void mm_pack_x_kernel(const cu_rows x, int64_t M, int64_t K, void *out, int64_t ldo, int out_dt,
                                 const mm_norm nrm)
{
    __shared__ float scratch[32];
    cu_pdl_trigger();
    cu_pdl_wait();
    const bool norm = nrm.mode != BERTH_NORM_W_NONE;
    for (int64_t m = blockIdx.x; m < M; m += gridDim.x) { /* uniform over the block: cu_block_sum is safe */
        const float *xr = (const float *)cu_row(x, m);
        float rstd = 1.0f;
        if (norm) {
            float ss = 0.0f;
            if (VEC) {
                for (int64_t q = threadIdx.x; q < K / 4; q += blockDim.x) {
                    const float4 v = reinterpret_cast<const float4 *>(xr)[q];
                    ss = fmaf(v.x, v.x, fmaf(v.y, v.y, fmaf(v.z, v.z, fmaf(v.w, v.w, ss))));
                }
            } else {
                for (int64_t k = threadIdx.x; k < K; k += blockDim.x)
                    ss = fmaf(xr[k], xr[k], ss);
            }
            ss = cu_block_sum(ss, scratch);
            rstd = 1.0f / sqrtf(ss / (float)K + nrm.eps); /* rms_norm's rstd, as the CPU backend computes it */
        }
        if (VEC) {
            for (int64_t q = threadIdx.x; q < K / 4; q += blockDim.x) {
                float4 v = reinterpret_cast<const float4 *>(xr)[q];
                if (norm) {
                    v.x = v.x * rstd * mm_norm_factor(nrm.w, nrm.dt, nrm.mode, 4 * q + 0);
                    v.y = v.y * rstd * mm_norm_factor(nrm.w, nrm.dt, nrm.mode, 4 * q + 1);
                    v.z = v.z * rstd * mm_norm_factor(nrm.w, nrm.dt, nrm.mode, 4 * q + 2);
                    v.w = v.w * rstd * mm_norm_factor(nrm.w, nrm.dt, nrm.mode, 4 * q + 3);
                }
                mm_st4(out, out_dt, m * ldo + 4 * q, v);
            }
        } else {
            for (int64_t k = threadIdx.x; k < K; k += blockDim.x) {
                float v = xr[k];
                if (norm)
                    v = v * rstd * mm_norm_factor(nrm.w, nrm.dt, nrm.mode, k);
                cu_st(out, out_dt, m * ldo + k, v);
            }
        }
    }
}

/* y[m, n] = (accumulate ? y[m, n] : 0) + bias[n] + tmp[m*ldt + n], bias and tmp each optional (NULL). */
__global__ void mm_epilogue_kernel(const cu_rows y, int64_t M, int64_t N, const float *tmp, int64_t ldt,
                                   const void *bias, int bias_dt, int accumulate)
{
    cu_pdl_trigger();
    cu_pdl_wait();
    for (int64_t m = blockIdx.y; m < M; m += gridDim.y) {
        float *yr = (float *)(y.base + cu_row_off(y, m));
        for (int64_t n = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; n < N; n += (int64_t)gridDim.x * blockDim.x) {
            float v = accumulate ? yr[n] : 0.0f;
            if (bias)
                v += cu_ld(bias, bias_dt, n);
            if (tmp)
                v += tmp[m * ldt + n];
            yr[n] = v;
        }
    }
}

/* The gated epilogue after a cuBLAS product into z (rows ldz floats apart): y[m, n] = f(g) * u with g = z[m, n]
 * (+ bias[n]) and u = z[m, N + n] (+ bias[N + n]) for HALVES, y_glu_up[m][n] for MUL. Each thread takes a few
 * outputs of one row (the grid is sized for ~4 per thread). y may alias up (each element is read, then written,
 * by one thread); z is the workspace. */
__global__ void mm_glu_kernel(const float *__restrict__ z, int64_t ldz, const cu_rows y, const cu_rows up, int64_t M,
                              int64_t N, const void *bias, int bias_dt, int mode, int act)
{
    cu_pdl_trigger();
    cu_pdl_wait();
    for (int64_t m = blockIdx.y; m < M; m += gridDim.y) {
        float *yr = (float *)cu_row(y, m);
        const float *ur = mode == BERTH_GLU_MUL ? (const float *)cu_row(up, m) : nullptr;
        const float *zr = z + m * ldz;
        for (int64_t n = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; n < N; n += (int64_t)gridDim.x * blockDim.x) {
            float g = zr[n], u = mode == BERTH_GLU_HALVES ? zr[N + n] : ur[n];
            if (bias) {
                g += cu_ld(bias, bias_dt, n);
                if (mode == BERTH_GLU_HALVES)
                    u += cu_ld(bias, bias_dt, N + n);
            }
            yr[n] = cu_act(act, g) * u;
        }
    }
}

/* out[i] = w element (i / K, i % K) widened to f32, for rows*K elements (w rows ldw bytes apart). */
__global__ void mm_widen_w_kernel(const char *w, int64_t ldw, int dt, int64_t rows, int64_t K, float *out)
{
    cu_pdl_trigger();
    cu_pdl_wait();
    const int64_t total = rows * K;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = cu_ld(w + (i / K) * ldw, dt, i % K);
}

/* A 2-D launch over (columns, rows) for the helper kernels: 256 threads per block, capped grid (they loop). */
static void mm_grid2(int64_t cols, int64_t rows, dim3 *grid)
{
    int64_t gx = (cols + 255) / 256, gy = rows;
    grid->x = (unsigned)(gx < 1 ? 1 : gx > 65535 ? 65535 : gx);
    grid->y = (unsigned)(gy < 1 ? 1 : gy > 65535 ? 65535 : gy);
    grid->z = 1;
}

/* Gather x's rows into out (ldo elements apart, out_dt); p's RMS-norm prologue applied when with_norm. */
static berth_status mm_pack_x(berth_backend *be, berth_stream *s, const berth_matmul_params *p, bool with_norm,
                              int64_t M, int64_t K, void *out, int64_t ldo, int out_dt)
{
    mm_norm nrm;
    memset(&nrm, 0, sizeof nrm);
    nrm.mode = with_norm ? opck_matmul_norm_mode(p) : BERTH_NORM_W_NONE;
    if (nrm.mode != BERTH_NORM_W_NONE) {
        nrm.w = opck_norm_has_weight(nrm.mode) ? cu_ptr(&p->x_norm_w) : NULL;
        nrm.dt = p->x_norm_w.dtype;
        nrm.eps = p->x_norm_eps;
    }
    /* float4 reads need every row 16-byte aligned; the writes then are too (out is, and ldo * size is a multiple
     * of 16 bytes for the callers' ldo, rounded up to 4 or 8 elements) */
    const cu_rows xr = cu_rows_of(&p->x);
    const size_t os = mm_dtype_size(out_dt);
    const bool vec = K % 4 == 0 && (uintptr_t)xr.base % 16 == 0 && xr.nb1 % 16 == 0 && xr.nb2 % 16 == 0 &&
                     xr.nb3 % 16 == 0 && (uintptr_t)out % 16 == 0 && ((size_t)ldo * os) % 16 == 0;
    const unsigned blocks = (unsigned)(M < 65535 ? M : 65535);
    const cudaError_t e = vec ? cu_launch(be, s->cs, dim3(blocks), dim3(256), 0, mm_pack_x_kernel<true>, xr, M, K,
                                          out, ldo, out_dt, nrm)
                              : cu_launch(be, s->cs, dim3(blocks), dim3(256), 0, mm_pack_x_kernel<false>, xr, M, K,
                                          out, ldo, out_dt, nrm);
    return cu_check(be, e, "matmul: pack_x kernel");
}

/* Row 0 and the row pitch of t's first M rows when they are evenly spaced rows of K contiguous f32; false otherwise. */
static bool mm_rows_even(const berth_tensor *t, int64_t M, int64_t K, const char **row0, int64_t *nb)
{
    if (t->dtype != BERTH_DTYPE_F32 || t->nb[0] != 4 || t->ne[0] != K || M < 1)
        return false;
    const cu_rows r = cu_rows_of(t);
    *row0 = cu_row(r, 0);
    *nb = M > 1 ? (int64_t)(cu_row(r, 1) - *row0) : 0;
    for (int64_t m = 2; m < M; m++)
        if (cu_row(r, m) != *row0 + m * *nb)
            return false;
    return true;
}

const uint16_t *cu_xshadow_match(const berth_stream *s, const berth_matmul_params *p, int64_t M, int64_t K, int dt,
                                 int64_t *ld)
{
    const cu_xshadow *x = &s->xsh;
    const char *row0 = NULL;
    int64_t nb = 0;
    if (!s->xsh_buf || x->seq == 0 || x->seq + 1 != s->op_seq || x->M != M || x->K != K || x->dt != dt ||
        !mm_rows_even(&p->x, M, K, &row0, &nb) || row0 != x->row0 || (M > 1 && nb != x->row_nb))
        return NULL;
    *ld = x->ld;
    return s->xsh_buf;
}

uint16_t *cu_xshadow_claim(const berth_backend *be, berth_stream *s, const berth_tensor *y, int64_t M, int64_t N,
                           int dt, int64_t *ld)
{
    const char *row0 = NULL;
    int64_t nb = 0;
    if (!mm_rows_even(y, M, N, &row0, &nb)) {
        s->xsh.seq = 0;
        return NULL;
    }
    return cu_xshadow_claim_rows(be, s, row0, nb, M, N, dt, ld);
}

uint16_t *cu_xshadow_claim_rows(const berth_backend *be, berth_stream *s, const char *row0, int64_t nb, int64_t M,
                                int64_t N, int dt, int64_t *ld)
{
    cu_xshadow *x = &s->xsh;
    x->seq = 0;
    const int64_t ldy = (N + 7) / 8 * 8; /* the pack's pitch: 16-byte rows */
    /* only where a reader exists: matmul_skinny.cu's plain products (skinny_max_m < M <= skinny_plain) */
    if (!be->xshadow || M <= be->skinny_max_m || M > be->skinny_plain || !s->xsh_buf ||
        (dt != BERTH_DTYPE_BF16 && dt != BERTH_DTYPE_F16) || (size_t)(M * ldy) * 2 > CU_XSH_BYTES)
        return NULL;
    x->seq = s->op_seq;
    x->row0 = row0;
    x->row_nb = nb;
    x->M = M;
    x->K = N;
    x->ld = ldy;
    x->dt = dt;
    *ld = ldy;
    return s->xsh_buf;
}

berth_status cu_matmul_pack_x(berth_backend *be, berth_stream *s, const berth_matmul_params *p, int64_t M, int64_t K,
                              void *out, int64_t ldo, int out_dt)
{
    return mm_pack_x(be, s, p, false, M, K, out, ldo, out_dt);
}

/* y from z (M rows of Nz floats, ldz apart) through p's gated epilogue. */
static berth_status mm_glu(berth_backend *be, berth_stream *s, const berth_matmul_params *p, int64_t M, int64_t Nz,
                           const float *z, int64_t ldz)
{
    const int32_t mode = opck_matmul_glu(p);
    const int64_t N = mode == BERTH_GLU_HALVES ? Nz / 2 : Nz;
    int64_t gx = (N + 1023) / 1024, gy = M;
    const dim3 grid((unsigned)(gx < 1 ? 1 : gx > 65535 ? 65535 : gx), (unsigned)(gy > 65535 ? 65535 : gy), 1);
    const cu_rows up = mode == BERTH_GLU_MUL ? cu_rows_of(&p->y_glu_up) : cu_rows_of(&p->y);
    const cudaError_t e = cu_launch(be, s->cs, grid, dim3(256), 0, mm_glu_kernel, z, ldz, cu_rows_of(&p->y), up, M, N,
                                    (const void *)(p->bias.buf ? cu_ptr(&p->bias) : NULL), (int)p->bias.dtype,
                                    (int)mode, (int)p->y_glu_act);
    return cu_check(be, e, "matmul: glu epilogue kernel");
}

static berth_status mm_epilogue(berth_backend *be, berth_stream *s, const berth_matmul_params *p, int64_t M,
                                int64_t N, const float *tmp, int64_t ldt)
{
    dim3 grid;
    mm_grid2(N, M, &grid);
    const void *bias = p->bias.buf ? cu_ptr(&p->bias) : NULL;
    const cudaError_t e = cu_launch(be, s->cs, grid, dim3(256), 0, mm_epilogue_kernel, cu_rows_of(&p->y), M, N, tmp,
                                    ldt, bias, (int)p->bias.dtype, (int)p->accumulate);
    return cu_check(be, e, "matmul: epilogue kernel");
}

// ---------------------------------------------------------------------------------------------------------------
// Paths.

static int mm_log2_ceil(int64_t v)
{
    int l = 0;
    while (((int64_t)1 << l) < v)
        l++;
    return l;
}

static int mm_log2_floor(int64_t v) /* 0 for v <= 1 */
{
    int l = 0;
    while (((int64_t)2 << l) <= v)
        l++;
    return l;
}

/* A weight of the prologue: present (modes W, W_ONE_PLUS) in a dtype it widens, 16-byte chunks of K elements. */
static bool mm_xpre_weight(int32_t mode, const berth_tensor *w, int64_t K, const void **ptr, int32_t *es, bool *early)
{
    *ptr = NULL;
    *es = 0;
    if (mode != BERTH_NORM_W && mode != BERTH_NORM_W_ONE_PLUS)
        return true;
    if (w->dtype != BERTH_DTYPE_F32 && w->dtype != BERTH_DTYPE_BF16 && w->dtype != BERTH_DTYPE_F16)
        return false;
    *ptr = cu_ptr(w);
    *es = (int32_t)mm_dtype_size(w->dtype);
    *early = *early && w->buf->usage == BERTH_USAGE_WEIGHTS;
    return (uintptr_t)*ptr % 16 == 0 && (K * *es) % 16 == 0;
}

bool cu_xpre_plan(const berth_backend *be, const berth_matmul_params *p, cu_xpre *out)
{
    const berth_rms_norm_params *n = opck_matmul_x_pre(p);
    memset(out, 0, sizeof *out);
    if (!n || !be->xpre_fuse || be->gemv_mode != CU_GEMV_NEW || cu_nrows(&p->x) != 1 || cu_nrows(&n->x) != 1)
        return false;
    const int64_t N = p->w.ne[1], K = p->w.ne[0], es = (int64_t)mm_dtype_size(p->w.dtype);
    if ((be->skip & CU_SKIP_SMALL) && (K <= 512 || N <= 512)) /* the product is skipped: run the norm alone */
        return false;
    if (be->xpre_fuse == 2 && N > 8192) /* measurement: only the products with few rows */
        return false;
    /* the batch-1 kernel's layout (mm_gemv) */
    const int64_t ldw = N > 1 ? p->w.nb[1] : K * es;
    if ((uintptr_t)cu_ptr(&p->w) % 16 != 0 || ldw % 16 != 0 || (K * es) % 16 != 0)
        return false;
    const bool y2 = opck_rms_has_y2(n);
    if (n->resid_mode != BERTH_RESID_NONE && n->resid_mode != BERTH_RESID_ADD_AFTER)
        return false;
    if (K % 4 != 0 || n->x.dtype != BERTH_DTYPE_F32 || n->y.dtype != BERTH_DTYPE_F32)
        return false;
    out->x = (const float *)cu_ptr(&n->x);
    out->y = (float *)cu_ptr(&n->y);
    out->res = n->resid_mode == BERTH_RESID_ADD_AFTER ? (const float *)cu_ptr(&n->residual) : NULL;
    out->y2 = y2 ? (float *)cu_ptr(&n->y2) : NULL;
    if ((uintptr_t)out->x % 16 || (uintptr_t)out->y % 16 || (uintptr_t)out->res % 16 || (uintptr_t)out->y2 % 16)
        return false;
    bool early = true;
    out->wmode = n->weight_mode;
    out->w2mode = y2 ? n->y2_weight_mode : BERTH_NORM_W_NONE;
    out->wdt = n->w.dtype;
    out->w2dt = y2 ? n->y2_w.dtype : BERTH_DTYPE_F32;
    if (!mm_xpre_weight(out->wmode, &n->w, K, &out->w, &out->es1, &early) ||
        !mm_xpre_weight(out->w2mode, &n->y2_w, K, &out->w2, &out->es2, &early))
        return false;
    if (cu_xpre_smem(K, out->es1, out->es2) > CU_XPRE_SMEM_MAX)
        return false;
    /* Block 0 stores the norm's outputs while the other blocks still read every input of the op, and all blocks
     * store the product's y meanwhile: no output may overlap an input or the other outputs. (Weights buffers are
     * read-only, but a caller may pass the product's or the norm's weights in any buffer.) */
    const berth_tensor *outs[3] = {&n->y, y2 ? &n->y2 : NULL, &p->y};
    const berth_tensor *reads[7] = {&n->x,
                                    out->res ? &n->residual : NULL,
                                    out->w ? &n->w : NULL,
                                    out->w2 ? &n->y2_w : NULL,
                                    &p->w,
                                    p->bias.buf ? &p->bias : NULL,
                                    opck_matmul_glu(p) == BERTH_GLU_MUL ? &p->y_glu_up : NULL};
    for (int i = 0; i < 3; i++) {
        if (!outs[i])
            continue;
        for (int j = 0; j < 7; j++)
            if (reads[j] && opck_views_overlap(outs[i], reads[j]))
                return false;
        for (int j = i + 1; j < 3; j++)
            if (outs[j] && opck_views_overlap(outs[i], outs[j]))
                return false;
    }
    out->early = early;
    out->eps = n->eps;
    out->oscale = opck_rms_out_scale(n);
    out->on = 1;
    return true;
}

/* The GEMV paths; with yn_done, the kernel also finishes p's trailing norm where cu_ynorm_plan allows (then
 * *yn_done = true once it is enqueued); with xp (cu_xpre_plan said yes), the batch-1 kernel runs p's x_pre in its
 * prologue. */
static berth_status mm_gemv(berth_backend *be, berth_stream *s, const berth_matmul_params *p, int64_t M, int64_t N,
                            int64_t K, bool *yn_done, const cu_xpre *xp)
{
    const int wdt = p->w.dtype;
    const int64_t es = (int64_t)mm_dtype_size(wdt);
    mm_gemv_args a;
    memset(&a, 0, sizeof a);
    a.w = cu_ptr(&p->w);
    a.ldw = N > 1 ? p->w.nb[1] : K * es;
    a.K = K;
    a.glu = opck_matmul_glu(p);
    a.glu_act = a.glu != BERTH_GLU_NONE ? p->y_glu_act : BERTH_ACT_IDENTITY;
    a.N = a.glu == BERTH_GLU_HALVES ? N / 2 : N; /* outputs */
    a.M = (int32_t)M;
    a.accumulate = p->accumulate;
    a.bias = p->bias.buf ? cu_ptr(&p->bias) : NULL;
    a.bias_dt = p->bias.dtype;
    a.early = p->w.buf->usage == BERTH_USAGE_WEIGHTS &&
              (uint64_t)N * (uint64_t)a.ldw <= ((uint64_t)be->gemv_early_mib << 20);
    /* 16-byte chunks need every row of w to start 16-byte aligned and to be whole chunks long */
    const bool vec = (uintptr_t)a.w % 16 == 0 && a.ldw % 16 == 0 && (K * es) % 16 == 0;
    a.nch = vec ? K * es / 16 : K;

    const cu_rows xr = cu_rows_of(&p->x), yr = cu_rows_of(&p->y);
    const cu_rows ur = a.glu == BERTH_GLU_MUL ? cu_rows_of(&p->y_glu_up) : yr;
    bool x_aligned = true;
    for (int64_t m = 0; m < M; m++) {
        a.x[m] = (const float *)(xr.base + cu_row_off(xr, m));
        a.y[m] = (float *)(yr.base + cu_row_off(yr, m));
        a.u[m] = (const float *)(ur.base + cu_row_off(ur, m));
        x_aligned = x_aligned && (uintptr_t)a.x[m] % 16 == 0;
    }
    const bool norm = opck_matmul_norm_mode(p) != BERTH_NORM_W_NONE;
    /* the prologue, or float4 reads of unaligned rows: gather x, normalised (x_pre rebuilds x in the kernel) */
    if (!xp && (norm || (vec && !x_aligned))) {
        const int64_t ld = mm_round_up(K, 4);
        void *ws = NULL;
        berth_status st = cu_stream_ws(be, s, (size_t)(M * ld) * sizeof(float), &ws);
        if (st == BERTH_OK)
            st = mm_pack_x(be, s, p, true, M, K, ws, ld, BERTH_DTYPE_F32);
        if (st != BERTH_OK)
            return st;
        for (int64_t m = 0; m < M; m++)
            a.x[m] = (const float *)ws + m * ld;
    }
    /* the trailing norm in the kernel: after a plain product only (the kernels with an epilogue carry no tail) */
    const bool fuse = yn_done && opck_matmul_y_norm(p) && a.glu == BERTH_GLU_NONE &&
                      cu_ynorm_plan(be, s, opck_matmul_y_norm(p), M, &a.yn);
    if (M == 1 && vec && be->gemv_mode != CU_GEMV_OLD) { /* gemv.cu's batch-1 kernel (x is 16-byte aligned here) */
        cu_gemv1_args g;
        memset(&g, 0, sizeof g);
        g.x = a.x[0];
        g.y = a.y[0];
        g.u = a.u[0];
        g.w = a.w;
        g.ldw = a.ldw;
        g.bias = a.bias;
        g.N = a.N;
        g.nch = (int32_t)a.nch;
        g.wdt = wdt;
        g.bias_dt = a.bias_dt;
        g.accumulate = a.accumulate;
        g.glu = a.glu;
        g.glu_act = a.glu_act;
        g.early = a.early;
        g.yn = a.yn;
        if (xp)
            g.xp = *xp;
        const berth_status st = cu_check(be, cu_gemv1(be, s->cs, g), "matmul: gemv kernel (gemv.cu)");
        if (st == BERTH_OK && fuse)
            *yn_done = true;
        return st;
    }
    if (xp) /* cu_xpre_plan promised the batch-1 kernel: running the product without the norm would be wrong */
        return cu_fail(be->host, BERTH_E_INTERNAL, "matmul: x_pre planned for the batch-1 GEMV, but M = %" PRId64
                       " with this layout takes matmul.cu's GEMV", M);
    for (int64_t m = M; m < MM_GEMV_MAX_M; m++) {
        a.x[m] = a.x[0];
        a.y[m] = a.y[0];
        a.u[m] = a.u[0];
    }

    const int mb = M <= 1 ? 1 : M <= 2 ? 2 : M <= 4 ? 4 : 8;
    const int64_t R = mb <= 2 ? 2 : 4; /* as mm_gemv_launch_mb */
    const int64_t RO = a.glu == BERTH_GLU_HALVES ? R / 2 : R; /* outputs per team */
    const int64_t groups = (a.N + RO - 1) / RO;
    /* team size: the largest power of two that keeps groups * tpr within n_sms * 1024 threads (32 warps per SM:
     * one wave at the ~40 resident warps the M = 1 kernel's registers allow, and 16+ warps of loads in flight),
     * 32..256, and no wider than the row has chunks. (Teams of 8 or 16 lanes for the tall gate|up matrices, whose
     * grid is 1.2-2.3 waves at 32, measured no faster on the H200; their reduction, a loop over a runtime lane
     * count, also cost the M = 8 kernel, whose 32 sums per team are a good part of its work.) */
    const int floor_lg = 5;
    const int64_t want = (int64_t)(be->n_sms > 0 ? be->n_sms : 132) * 1024;
    int lg = mm_log2_floor(want / groups);
    int cap = mm_log2_ceil(a.nch);
    if (cap < floor_lg)
        cap = floor_lg;
    if (lg > cap)
        lg = cap;
    if (lg < floor_lg)
        lg = floor_lg;
    if (lg > 8)
        lg = 8;
    a.tpr_log2 = lg;
    const int64_t teams = MM_THREADS >> lg;
    const unsigned blocks = (unsigned)((groups + teams - 1) / teams);

    cudaError_t e;
    switch (wdt) {
    case BERTH_DTYPE_BF16: e = mm_gemv_launch_w<BERTH_DTYPE_BF16>(be, mb, vec, blocks, s->cs, a); break;
    case BERTH_DTYPE_F16: e = mm_gemv_launch_w<BERTH_DTYPE_F16>(be, mb, vec, blocks, s->cs, a); break;
    default: e = mm_gemv_launch_w<BERTH_DTYPE_F32>(be, mb, vec, blocks, s->cs, a); break;
    }
    const berth_status st = cu_check(be, e, "matmul: gemv kernel");
    if (st == BERTH_OK && fuse)
        *yn_done = true;
    return st;
}

/* The one byte stride that walks all rows of t in order, if there is one (a single row: 0). */
static bool mm_uniform_stride(const berth_tensor *t, int64_t *stride)
{
    bool have = false;
    int64_t s = 0, next = 0;
    for (int i = 1; i < 4; i++) {
        if (t->ne[i] == 1)
            continue;
        if (have && t->nb[i] != next)
            return false;
        if (!have)
            s = t->nb[i];
        have = true;
        next = t->nb[i] * t->ne[i];
    }
    *stride = have ? s : 0;
    return true;
}

/* Leading dimension (in f32 elements) cuBLAS can use for t's rows of `len` floats, or 0 when it cannot. */
static int64_t mm_blas_ld(const berth_tensor *t, int64_t len)
{
    int64_t st;
    if (!mm_uniform_stride(t, &st))
        return 0;
    if (st == 0) /* one row */
        return len > 0 ? len : 1;
    if (st % 4 != 0 || st / 4 < len || st / 4 > INT_MAX)
        return 0;
    return st / 4;
}

static cudaDataType mm_cuda_type(int dt)
{
    return dt == BERTH_DTYPE_BF16 ? CUDA_R_16BF : dt == BERTH_DTYPE_F16 ? CUDA_R_16F : CUDA_R_32F;
}

static berth_status mm_blas(berth_backend *be, berth_stream *s, const berth_matmul_params *p, int64_t M, int64_t N,
                            int64_t K, const berth_rms_norm_params *pre)
{
    const int wdt = p->w.dtype;
    const bool half_w = wdt != BERTH_DTYPE_F32;
    const bool tc = be->compute == CU_COMPUTE_BF16;
    const bool x_to_w = tc && half_w; /* x rounded to the weight dtype for the tensor cores */
    const int64_t wes = (int64_t)mm_dtype_size(wdt);
    const int64_t ldw = N > 1 ? p->w.nb[1] / wes : K; /* packed: K */
    berth_status st;

    const bool glu = opck_matmul_glu(p) != BERTH_GLU_NONE; /* z goes to the workspace, then the glu kernel */
    if (K == 0 && pre && (st = cu_op_rms_norm(be, s, pre)) != BERTH_OK)
        return st;
    if (K == 0 && !glu) /* no product: y = (accumulate ? y : 0) + bias */
        return mm_epilogue(be, s, p, M, N, NULL, 0);
    if (K == 0) { /* z = 0 (+ bias, which the glu kernel adds) */
        void *z = NULL;
        if ((st = cu_stream_ws(be, s, (size_t)(M * N) * sizeof(float), &z)) != BERTH_OK ||
            (st = cu_check(be, cudaMemsetAsync(z, 0, (size_t)(M * N) * sizeof(float), s->cs), "matmul: memset")) !=
                BERTH_OK)
            return st;
        return mm_glu(be, s, p, M, N, (const float *)z, N);
    }

    /* Operands and workspace layout: [x gathered/converted][y result][widened w slab]. The norm prologue is
     * applied by the gather, so x is then always gathered. */
    const bool norm = opck_matmul_norm_mode(p) != BERTH_NORM_W_NONE;
    const int64_t ldx_direct = x_to_w || norm ? 0 : mm_blas_ld(&p->x, K);
    const int64_t ldx = ldx_direct ? ldx_direct : mm_round_up(K, 8);
    const size_t x_bytes = ldx_direct ? 0 : (size_t)(M * ldx) * (x_to_w ? 2 : 4);
    const int64_t ldy_direct = glu ? 0 : mm_blas_ld(&p->y, N);
    const int64_t ldc = ldy_direct ? ldy_direct : N;
    const size_t t_bytes = ldy_direct ? 0 : (size_t)(M * N) * sizeof(float);
    int64_t slab = N;
    size_t s_bytes = 0;
    if (!tc && half_w) {
        slab = MM_SLAB_BYTES / (K * 4);
        slab = slab < 1 ? 1 : slab > N ? N : slab;
        s_bytes = (size_t)(slab * K) * sizeof(float);
    }
    const size_t x_off = 0, t_off = mm_round_up((int64_t)x_bytes, MM_WS_ALIGN);
    const size_t s_off = t_off + mm_round_up((int64_t)t_bytes, MM_WS_ALIGN);
    char *ws = NULL;
    if (s_off + s_bytes > 0) {
        void *w0 = NULL;
        if ((st = cu_stream_ws(be, s, s_off + s_bytes, &w0)) != BERTH_OK)
            return st;
        ws = (char *)w0;
    }

    /* x_pre (pre): the norm first; where x is rounded for the tensor cores, its kernel also writes that copy (one
     * launch less per product: Gemma 4's post-norms feed q|k|v and gate|up here; the PLE gate takes the skinny
     * kernel up to 64 rows) */
    bool packed = false;
    if (pre && !ldx_direct && x_to_w && !norm &&
        (st = cu_rms_norm_packed(be, s, pre, ws + x_off, ldx, wdt, &packed)) != BERTH_OK)
        return st;
    if (pre && !packed && (st = cu_op_rms_norm(be, s, pre)) != BERTH_OK)
        return st;
    const void *xb = cu_ptr(&p->x);
    if (!ldx_direct) {
        if (!packed &&
            (st = mm_pack_x(be, s, p, true, M, K, ws + x_off, ldx, x_to_w ? wdt : BERTH_DTYPE_F32)) != BERTH_OK)
            return st;
        xb = ws + x_off;
    }
    float *C;
    float beta;
    if (ldy_direct) {
        C = (float *)cu_ptr(&p->y);
        if (p->bias.buf) { /* y = (accumulate ? y : 0) + bias, then the GEMM adds onto it */
            if ((st = mm_epilogue(be, s, p, M, N, NULL, 0)) != BERTH_OK)
                return st;
            beta = 1.0f;
        } else {
            beta = p->accumulate ? 1.0f : 0.0f; /* beta 0: cuBLAS never reads C (y may hold NaN) */
        }
    } else {
        C = (float *)(ws + t_off);
        beta = 0.0f;
    }

    if ((st = cu_cublas_check(be, cublasSetStream(be->cublas, s->cs), "cublasSetStream")) != BERTH_OK)
        return st;
    /* after cublasSetStream: it resets the workspace to cuBLAS's own pool, which would allocate in a capture */
    if ((st = cu_cublas_check(be, cublasSetWorkspace(be->cublas, be->cublas_ws, be->cublas_ws_size),
                              "cublasSetWorkspace")) != BERTH_OK)
        return st;
    const float alpha = 1.0f;
    if (tc || !half_w) {
        const cudaDataType ab = x_to_w ? mm_cuda_type(wdt) : CUDA_R_32F;
        const cublasComputeType_t ct = tc && !half_w ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F;
        st = cu_cublas_check(be,
                             cublasGemmEx(be->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)M, (int)K, &alpha,
                                          cu_ptr(&p->w), mm_cuda_type(wdt), (int)ldw, xb, ab, (int)ldx, &beta, C,
                                          CUDA_R_32F, (int)ldc, ct, CUBLAS_GEMM_DEFAULT),
                             "cublasGemmEx (matmul)");
        if (st != BERTH_OK)
            return st;
    } else {
        float *wf = (float *)(ws + s_off);
        for (int64_t n0 = 0; n0 < N; n0 += slab) {
            const int64_t nr = N - n0 < slab ? N - n0 : slab;
            const int64_t total = nr * K;
            int64_t blocks = (total + 255) / 256;
            blocks = blocks > 65535 * 16 ? 65535 * 16 : blocks;
            const char *w0 = cu_ptr(&p->w) + n0 * ldw * wes;
            const cudaError_t e = cu_launch(be, s->cs, dim3((unsigned)blocks), dim3(256), 0, mm_widen_w_kernel, w0,
                                            ldw * wes, wdt, nr, K, wf);
            if ((st = cu_check(be, e, "matmul: widen_w kernel")) != BERTH_OK)
                return st;
            st = cu_cublas_check(be,
                                 cublasGemmEx(be->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, (int)M, (int)K, &alpha,
                                              wf, CUDA_R_32F, (int)K, xb, CUDA_R_32F, (int)ldx, &beta, C + n0,
                                              CUDA_R_32F, (int)ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                                 "cublasGemmEx (matmul, widened weights)");
            if (st != BERTH_OK)
                return st;
        }
    }
    if (glu)
        return mm_glu(be, s, p, M, N, C, N);
    if (!ldy_direct)
        return mm_epilogue(be, s, p, M, N, C, N);
    return BERTH_OK;
}

// ---------------------------------------------------------------------------------------------------------------
// Op.

bool cu_check_matmul(const berth_backend *be, struct opck *c, const berth_matmul_params *p)
{
    (void)be;
    if (!opck_matmul(c, p))
        return false;
    /* both products of a pair (y_then): K of the second is N of the first */
    const berth_matmul_params *q = opck_matmul_y_then(p);
    const int64_t M = cu_nrows(&p->x), N = p->w.ne[1], K = p->w.ne[0], N2 = q ? q->w.ne[1] : 0;
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX || N2 > INT_MAX)
        return opck_fail(c, BERTH_E_UNSUPPORTED,
                         "matmul: M = %" PRId64 ", N = %" PRId64 ", K = %" PRId64
                         " must each fit in 32 bits on the cuda backend (cuBLAS dimensions)",
                         M, N > N2 ? N : N2, K);
    return true;
}

berth_status cu_op_matmul(berth_backend *be, berth_stream *s, const berth_matmul_params *p)
{
    return cu_matmul_run(be, s, p, NULL, NULL, NULL);
}

berth_status cu_matmul_run(berth_backend *be, berth_stream *s, const berth_matmul_params *p, bool *yn_done,
                           const cu_xpre *xp, const berth_rms_norm_params *pre)
{
    CU_OP_BEGIN(be, matmul, p);
    const int64_t M = cu_nrows(&p->x), N = p->w.ne[1], K = p->w.ne[0];
    if (M == 0 || N == 0 || ((be->skip & CU_SKIP_SMALL) && (K <= 512 || N <= 512)))
        return pre ? cu_op_rms_norm(be, s, pre) : BERTH_OK;
    /* matmul_skinny.cu first: batched decode in bf16 mode (be->skinny_min_m <= M <= 64, its layout rules); when it
     * declines, the GEMV up to M = 8, cuBLAS above */
    if (xp) /* cu_xpre_plan planned gemv.cu's batch-1 kernel: mm_gemv serves the plan or fails */
        return mm_gemv(be, s, p, M, N, K, yn_done, xp);
    bool ran = false;
    berth_status st = cu_matmul_skinny(be, s, p, M, N, K, &ran, pre);
    if (st != BERTH_OK || ran)
        return st;
    if (M <= MM_GEMV_MAX_M) {
        if (pre && (st = cu_op_rms_norm(be, s, pre)) != BERTH_OK)
            return st;
        return mm_gemv(be, s, p, M, N, K, yn_done, xp);
    }
    return mm_blas(be, s, p, M, N, K, pre);
}

/*
 * matmul_skinny.cu — y[m, n] = sum_k x[m, k] w[n, k] (+ bias[n]) (+ y[m, n]) for 9 <= M <= 64 in BF16 compute
 * mode with bf16 / f16 weights: a weight-streaming tensor-core kernel (called by matmul.cu before its cuBLAS path).
 *
 * Why: at batched decode (M = 16..64 sequences) a matmul reads every weight once and does 2*M flops per weight, so
 * it is still bound by memory bandwidth, but cuBLAS's GEMM tiles are built for large M and reach a fraction of it
 * at these shapes, and the GEMV's registers do not scale past M = 8. Here each block owns SK_BN = 128 rows of w
 * and all M rows of x, and streams its w rows over K in 16-byte cp.async loads through a 3-4 stage shared-memory
 * ring (SK_BK = 64 columns per stage: 16 KiB of weights), so two blocks per SM keep 64+ KiB of loads in flight.
 * The x tile of the same columns (M x 64 floats, read from L2: x is small) rides in the same stage as f32 and is
 * rounded to the weight dtype while the A fragments are built; rows M..16*MT-1 are zeros. Each of the 4 warps
 * multiplies all of x by its 32 rows of w with mma.sync m16n8k16 (bf16 or f16 operands, fp32 accumulators): the
 * same numerics class as the cuBLAS bf16 path (x rounded to the weight dtype, fp32 accumulation).
 *
 * Split-K: when N / SK_BN blocks would not fill the GPU (N = 1536, 256, 2560 at K >= 1536), the K tiles are split
 * over blockIdx.y; each split writes its fp32 partial product to the stream workspace and a second kernel adds the
 * partials in split order (deterministic), the bias and the old y. Without a split the epilogue does that itself.
 *
 * PDL (cuda_launch.cuh): when w lives in a BERTH_USAGE_WEIGHTS buffer (no kernel writes it) the first stages'
 * weight loads are issued before cu_pdl_wait(); x, y, bias and the workspace are touched only after it.
 *
 * Opt-in for now: BERTH_CUDA_SKINNY=1 in the environment enables it (read at each call); otherwise matmul.cu
 * keeps its cuBLAS path for M > 8.
 */
#include "cuda_internal.h"
#include "cuda_device.cuh"
#include "cuda_launch.cuh"

#include <stdlib.h>
#include <string.h>

#define SK_MIN_M 9
#define SK_MAX_M 64
#define SK_BN 128                 /* rows of w per block */
#define SK_BK 64                  /* columns (k) per stage */
#define SK_THREADS 128            /* 4 warps, 32 rows of w each */
#define SK_WROW (SK_BK * 2 + 16)  /* bytes per w row in shared memory: padded so ldmatrix rows hit distinct banks */
#define SK_XROW (SK_BK + 8)       /* floats per x row in shared memory: padded so float2 fragment loads do not clash */
#define SK_MAX_SPLITS 32
#define SK_MIN_KT_PER_SPLIT 2     /* k tiles per split at least: fewer would be mostly prologue */

/* Stages of the ring for MT m16 tiles: 4 while x is small, 3 at M > 32, so two blocks fit an SM (< 113 KiB). */
#define SK_STAGES(MT) ((MT) <= 2 ? 4 : 3)

static constexpr size_t sk_smem_bytes(int mt)
{
    return (size_t)SK_STAGES(mt) * ((size_t)SK_BN * SK_WROW + (size_t)mt * 16 * SK_XROW * 4);
}

struct sk_args {
    const float *x[SK_MAX_M]; /* row m of x */
    float *y[SK_MAX_M];       /* row m of y */
    const char *w;
    int64_t ldw;              /* bytes between rows of w (a multiple of 16) */
    const void *bias;         /* NULL: none */
    float *part;              /* split-K partials [split][M][N]; NULL: one split, the epilogue writes y */
    int32_t M, N, K;
    int32_t kt_per_split;     /* k tiles per blockIdx.y */
    int32_t nkt;              /* k tiles in all: ceil(K / SK_BK) */
    int32_t splits;
    int32_t bias_dt;
    int32_t accumulate;
    int32_t early;            /* w may be read before cu_pdl_wait */
};

// ---------------------------------------------------------------------------------------------------------------
// Device helpers.

static __device__ __forceinline__ uint32_t sk_smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16 bytes global -> shared, L2 only (weights are streamed once); nbytes 0 fills zeros and reads nothing. */
static __device__ __forceinline__ void sk_cp16(uint32_t dst, const void *src, int nbytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(nbytes) : "memory");
}

/* 4 bytes global -> shared (x rows that are not 16-byte aligned); nbytes 0 fills zeros. */
static __device__ __forceinline__ void sk_cp4(uint32_t dst, const void *src, int nbytes)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(nbytes) : "memory");
}

static __device__ __forceinline__ void sk_commit()
{
    asm volatile("cp.async.commit_group;" ::: "memory");
}

template <int N>
static __device__ __forceinline__ void sk_wait_group()
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* Two floats as one register of the weight dtype's pair (lo in the low half), round to nearest even. */
template <int WDT>
static __device__ __forceinline__ uint32_t sk_pack2(float lo, float hi)
{
    if (WDT == BERTH_DTYPE_BF16) {
        const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<const uint32_t *>(&v);
    } else {
        const __half2 v = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<const uint32_t *>(&v);
    }
}

template <int WDT>
static __device__ __forceinline__ void sk_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    if (WDT == BERTH_DTYPE_BF16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ void sk_ldmatrix_x4(uint32_t addr, uint32_t (&r)[4])
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* Weight loads of k tile kt into stage buffer ws (SK_BN rows x SK_WROW bytes). Rows past N are never loaded (zeroed
 * once); columns past K are zero-filled. */
static __device__ __forceinline__ void sk_load_w(const sk_args &a, int n0, int kt, uint32_t ws)
{
    const int k0 = kt * SK_BK;
#pragma unroll
    for (int i = 0; i < SK_BN * (SK_BK / 8) / SK_THREADS; i++) {
        const int id = i * SK_THREADS + (int)threadIdx.x;
        const int r = id >> 3, c = id & 7; /* 8 chunks of 8 elements per row */
        if (n0 + r < a.N) {
            const int k = k0 + c * 8;
            const char *row = a.w + (int64_t)(n0 + r) * a.ldw;
            sk_cp16(ws + (uint32_t)(r * SK_WROW + c * 16), k < a.K ? row + (int64_t)k * 2 : row, k < a.K ? 16 : 0);
        }
    }
}

/* x loads of k tile kt into stage buffer xs (16*MT rows x SK_XROW floats). Rows past M are never loaded (zeroed
 * once); columns past K are zero-filled. XVEC: 16-byte chunks (rows 16-byte aligned, K a multiple of 4). */
template <int MT, bool XVEC>
static __device__ __forceinline__ void sk_load_x(const sk_args &a, int kt, uint32_t xs)
{
    const int k0 = kt * SK_BK;
    if (XVEC) {
#pragma unroll
        for (int i = 0; i < MT * 16 * (SK_BK / 4) / SK_THREADS; i++) {
            const int id = i * SK_THREADS + (int)threadIdx.x;
            const int r = id >> 4, c = id & 15; /* 16 chunks of 4 floats per row */
            if (r < a.M) {
                const int k = k0 + c * 4;
                const float *row = a.x[r];
                sk_cp16(xs + (uint32_t)((r * SK_XROW + c * 4) * 4), k < a.K ? row + k : row, k < a.K ? 16 : 0);
            }
        }
    } else {
#pragma unroll 4
        for (int i = 0; i < MT * 16 * SK_BK / SK_THREADS; i++) {
            const int id = i * SK_THREADS + (int)threadIdx.x;
            const int r = id >> 6, c = id & 63;
            if (r < a.M) {
                const int k = k0 + c;
                const float *row = a.x[r];
                sk_cp4(xs + (uint32_t)((r * SK_XROW + c) * 4), k < a.K ? row + k : row, k < a.K ? 4 : 0);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Kernels.

template <int WDT, int MT, bool XVEC>
__global__ void __launch_bounds__(SK_THREADS, 2) sk_kernel(const __grid_constant__ sk_args a)
{
    constexpr int S = SK_STAGES(MT);
    constexpr int WBYTES = SK_BN * SK_WROW, XBYTES = MT * 16 * SK_XROW * 4;
    extern __shared__ __align__(16) unsigned char sk_smem[];
    cu_pdl_trigger();

    const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
    const int n0 = (int)blockIdx.x * SK_BN;
    const int kt0 = (int)blockIdx.y * a.kt_per_split;
    int kt1 = kt0 + a.kt_per_split;
    kt1 = kt1 < a.nkt ? kt1 : a.nkt;
    const int nt = kt1 - kt0; /* >= 1: the host never makes an empty split */
    const uint32_t base = sk_smem_addr(sk_smem);
    /* stage s: w at base + s*WBYTES, x at base + S*WBYTES + s*XBYTES */

    /* Rows no load writes (w past N, x past M) are zero in every stage: products with them are 0, never NaN. */
    {
        const int wrows = a.N - n0 < SK_BN ? a.N - n0 : SK_BN;
        for (int s = 0; s < S; s++) {
            uint4 *wz = reinterpret_cast<uint4 *>(sk_smem + s * WBYTES + wrows * SK_WROW);
            for (int i = (int)threadIdx.x; i < (SK_BN - wrows) * SK_WROW / 16; i += SK_THREADS)
                wz[i] = make_uint4(0, 0, 0, 0);
            float4 *xz = reinterpret_cast<float4 *>(sk_smem + S * WBYTES + s * XBYTES + a.M * SK_XROW * 4);
            for (int i = (int)threadIdx.x; i < (MT * 16 - a.M) * SK_XROW / 4; i += SK_THREADS)
                xz[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    }

    /* Prologue: stages 0..S-2. Weights before the wait when they are a weights buffer; one commit group per stage
     * (the early weight loads join group 0, which completes first). */
    if (a.early)
        for (int s = 0; s < S - 1; s++)
            if (s < nt)
                sk_load_w(a, n0, kt0 + s, base + s * WBYTES);
    cu_pdl_wait();
    for (int s = 0; s < S - 1; s++) {
        if (s < nt) {
            if (!a.early)
                sk_load_w(a, n0, kt0 + s, base + s * WBYTES);
            sk_load_x<MT, XVEC>(a, kt0 + s, base + S * WBYTES + s * XBYTES);
        }
        sk_commit();
    }

    float acc[MT][4][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int q = 0; q < 4; q++)
                acc[m][j][q] = 0.0f;

    const int g = lane >> 2, t4 = lane & 3;
    /* ldmatrix.x4 row address of this lane: matrices (rows +0..7, k +0), (+0..7, k +8), (+8..15, k +0), (+8..15,
     * k +8) give b0/b1 of two n8 tiles */
    const uint32_t b_lane =
        (uint32_t)((warp * 32 + (lane & 7) + ((lane >> 4) << 3)) * SK_WROW + ((lane >> 3) & 1) * 16);

#pragma unroll 1
    for (int i = 0; i < nt; i++) {
        sk_wait_group<S - 2>(); /* tile i has landed (this thread's part) */
        __syncthreads();        /* ... everyone's; and the stage loaded below was consumed at step i-1 */
        {
            const int j = i + S - 1;
            if (j < nt) {
                const int s = j % S;
                sk_load_w(a, n0, kt0 + j, base + s * WBYTES);
                sk_load_x<MT, XVEC>(a, kt0 + j, base + S * WBYTES + s * XBYTES);
            }
            sk_commit();
        }
        const int s = i % S;
        const uint32_t wsb = base + s * WBYTES + b_lane;
        const float *xs = reinterpret_cast<const float *>(sk_smem + S * WBYTES + s * XBYTES);
#pragma unroll
        for (int kk = 0; kk < SK_BK / 16; kk++) {
            uint32_t b[2][4];
            sk_ldmatrix_x4(wsb + kk * 32, b[0]);
            sk_ldmatrix_x4(wsb + 16 * SK_WROW + kk * 32, b[1]);
#pragma unroll
            for (int m = 0; m < MT; m++) {
                const float *r0 = xs + (m * 16 + g) * SK_XROW + kk * 16 + 2 * t4;
                const float *r1 = r0 + 8 * SK_XROW;
                const float2 v0 = *reinterpret_cast<const float2 *>(r0);
                const float2 v1 = *reinterpret_cast<const float2 *>(r1);
                const float2 v2 = *reinterpret_cast<const float2 *>(r0 + 8);
                const float2 v3 = *reinterpret_cast<const float2 *>(r1 + 8);
                const uint32_t af[4] = {sk_pack2<WDT>(v0.x, v0.y), sk_pack2<WDT>(v1.x, v1.y),
                                        sk_pack2<WDT>(v2.x, v2.y), sk_pack2<WDT>(v3.x, v3.y)};
#pragma unroll
                for (int j = 0; j < 4; j++)
                    sk_mma<WDT>(acc[m][j], af, b[j >> 1][(j & 1) * 2], b[j >> 1][(j & 1) * 2 + 1]);
            }
        }
    }
    sk_wait_group<0>(); /* no cp.async may be left in flight at exit */

    /* Epilogue: acc[m][j][q] is y[m*16 + g + (q >> 1)*8, n0 + warp*32 + j*8 + 2*t4 + (q & 1)]. */
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int row = m * 16 + g + (q >> 1) * 8;
            if (row >= a.M)
                continue;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int n = n0 + warp * 32 + j * 8 + 2 * t4 + (q & 1);
                if (n >= a.N)
                    continue;
                float v = acc[m][j][q];
                if (a.part) {
                    a.part[((int64_t)blockIdx.y * a.M + row) * a.N + n] = v;
                } else {
                    float *yr = a.y[row];
                    if (a.bias)
                        v += cu_ld(a.bias, a.bias_dt, n);
                    if (a.accumulate)
                        v += yr[n];
                    yr[n] = v;
                }
            }
        }
}

/* y[m, n] = (accumulate ? y[m, n] : 0) + bias[n] + sum over splits (in order) of part[split][m][n]. */
__global__ void sk_reduce_kernel(const __grid_constant__ sk_args a)
{
    cu_pdl_trigger();
    cu_pdl_wait();
    const int m = (int)blockIdx.y;
    const int n = (int)blockIdx.x * (int)blockDim.x + (int)threadIdx.x;
    if (n >= a.N)
        return;
    float *yr = a.y[m];
    float v = a.accumulate ? yr[n] : 0.0f;
    if (a.bias)
        v += cu_ld(a.bias, a.bias_dt, n);
    const int64_t plane = (int64_t)a.M * a.N;
    const float *p = a.part + (int64_t)m * a.N + n;
#pragma unroll 4
    for (int z = 0; z < a.splits; z++)
        v += p[z * plane];
    yr[n] = v;
}

// ---------------------------------------------------------------------------------------------------------------
// Host side.

template <int WDT, int MT, bool XVEC>
static cudaError_t sk_launch_main(berth_backend *be, cudaStream_t cs, dim3 grid, const sk_args &a)
{
    constexpr size_t smem = sk_smem_bytes(MT);
    void (*const kern)(sk_args) = sk_kernel<WDT, MT, XVEC>;
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    /* all of the unified L1 as shared memory, so two blocks (2 x ~110 KiB) fit an SM */
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    if (e != cudaSuccess)
        return e;
    return cu_launch(be, cs, grid, dim3(SK_THREADS), smem, kern, a);
}

template <int WDT, int MT>
static cudaError_t sk_launch_mt(berth_backend *be, cudaStream_t cs, dim3 grid, bool xvec, const sk_args &a)
{
    return xvec ? sk_launch_main<WDT, MT, true>(be, cs, grid, a) : sk_launch_main<WDT, MT, false>(be, cs, grid, a);
}

template <int WDT>
static cudaError_t sk_launch_w(berth_backend *be, cudaStream_t cs, dim3 grid, int mt, bool xvec, const sk_args &a)
{
    switch (mt) {
    case 1: return sk_launch_mt<WDT, 1>(be, cs, grid, xvec, a);
    case 2: return sk_launch_mt<WDT, 2>(be, cs, grid, xvec, a);
    case 3: return sk_launch_mt<WDT, 3>(be, cs, grid, xvec, a);
    default: return sk_launch_mt<WDT, 4>(be, cs, grid, xvec, a);
    }
}

/* Byte offset of row r of t (rows flattened over ne[1..3], ne[1] fastest). */
static int64_t sk_row_off(const berth_tensor *t, int64_t r)
{
    const int64_t i1 = r % t->ne[1];
    r /= t->ne[1];
    const int64_t i2 = r % t->ne[2];
    const int64_t i3 = r / t->ne[2];
    return i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
}

static bool sk_enabled(void)
{
    const char *e = getenv("BERTH_CUDA_SKINNY");
    return e && strcmp(e, "1") == 0;
}

/* Runs the matmul (already checked by cu_check_matmul) with the skinny kernel when it applies: BF16 compute mode,
 * BERTH_CUDA_SKINNY=1, SK_MIN_M <= M <= SK_MAX_M, bf16/f16 w whose rows are 16-byte aligned whole 16-byte chunks
 * (K a multiple of 8), and enough opt-in shared memory. *ran says whether it did; when it did not, nothing was
 * enqueued and the caller takes another path. */
berth_status cu_matmul_skinny(berth_backend *be, berth_stream *s, const berth_matmul_params *p, int64_t M, int64_t N,
                              int64_t K, bool *ran)
{
    *ran = false;
    const int wdt = p->w.dtype;
    if (be->compute != CU_COMPUTE_BF16 || M < SK_MIN_M || M > SK_MAX_M || K <= 0 || K % 8 != 0 ||
        (wdt != BERTH_DTYPE_BF16 && wdt != BERTH_DTYPE_F16) || !sk_enabled())
        return BERTH_OK;
    const int64_t ldw = N > 1 ? p->w.nb[1] : K * 2;
    const char *w = cu_ptr(&p->w);
    if ((uintptr_t)w % 16 != 0 || ldw % 16 != 0 || ldw < K * 2)
        return BERTH_OK;
    const int mt = (int)((M + 15) / 16);
    const size_t smem = mt == 1 ? sk_smem_bytes(1) : mt == 2 ? sk_smem_bytes(2) : mt == 3 ? sk_smem_bytes(3)
                                                                                          : sk_smem_bytes(4);
    if (smem > be->smem_optin)
        return BERTH_OK;

    sk_args a;
    memset(&a, 0, sizeof a);
    bool xvec = true;
    for (int64_t m = 0; m < M; m++) {
        a.x[m] = (const float *)(cu_ptr(&p->x) + sk_row_off(&p->x, m));
        a.y[m] = (float *)(cu_ptr(&p->y) + sk_row_off(&p->y, m));
        xvec = xvec && (uintptr_t)a.x[m] % 16 == 0;
    }
    a.w = w;
    a.ldw = ldw;
    a.bias = p->bias.buf ? cu_ptr(&p->bias) : NULL;
    a.bias_dt = p->bias.dtype;
    a.accumulate = p->accumulate;
    a.early = p->w.buf->usage == BERTH_USAGE_WEIGHTS;
    a.M = (int32_t)M;
    a.N = (int32_t)N;
    a.K = (int32_t)K;
    a.nkt = (int32_t)((K + SK_BK - 1) / SK_BK);

    /* Split K into as many parts as keep the grid within one wave at two resident blocks per SM (a second, partial
     * wave would run a few blocks alone at the end), keeping >= SK_MIN_KT_PER_SPLIT k tiles per split; then even
     * out the splits so none is empty. Blocks stream at about (stages - 1) * 16 KiB per DRAM latency each, so 128+
     * concurrent blocks are enough for the bandwidth; N / SK_BN >= 2 * n_sms needs no split. */
    const int64_t bn = (N + SK_BN - 1) / SK_BN;
    const int64_t slots = 2 * (int64_t)(be->n_sms > 0 ? be->n_sms : 132);
    int64_t splits = slots / bn, cap = a.nkt / SK_MIN_KT_PER_SPLIT;
    cap = cap < 1 ? 1 : cap > SK_MAX_SPLITS ? SK_MAX_SPLITS : cap;
    splits = splits < 1 ? 1 : splits > cap ? cap : splits;
    const int64_t per = (a.nkt + splits - 1) / splits;
    splits = (a.nkt + per - 1) / per;
    a.kt_per_split = (int32_t)per;
    a.splits = (int32_t)splits;

    berth_status st;
    if (splits > 1) {
        void *ws = NULL;
        if ((st = cu_stream_ws(be, s, (size_t)(splits * M * N) * sizeof(float), &ws)) != BERTH_OK)
            return st;
        a.part = (float *)ws;
    }
    const dim3 grid((unsigned)bn, (unsigned)splits);
    cudaError_t e = wdt == BERTH_DTYPE_BF16 ? sk_launch_w<BERTH_DTYPE_BF16>(be, s->cs, grid, mt, xvec, a)
                                            : sk_launch_w<BERTH_DTYPE_F16>(be, s->cs, grid, mt, xvec, a);
    if ((st = cu_check(be, e, "matmul: skinny kernel")) != BERTH_OK)
        return st;
    *ran = true;
    if (splits > 1) {
        e = cu_launch(be, s->cs, dim3((unsigned)((N + 255) / 256), (unsigned)M), dim3(256), 0, sk_reduce_kernel, a);
        if ((st = cu_check(be, e, "matmul: skinny split-k reduce kernel")) != BERTH_OK)
            return st;
    }
    return BERTH_OK;
}

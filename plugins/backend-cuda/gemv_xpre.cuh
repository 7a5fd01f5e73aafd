/*
 * gemv_xpre.cuh — the norm before a batch-1 product (berth_matmul_params.x_pre) computed in the product's own
 * prologue: every block of gemv.cu's kernel rebuilds the one row x it multiplies, in shared memory, from the
 * norm's x and residual; block 0 also stores the norm's outputs. matmul.cu's cu_xpre_plan decides when.
 *
 * Why: Gemma 4's post-norms (y = residual + RMSNorm(a) * w, then the next pre-norm y2 = RMSNorm(y) * w2) are a
 * one-block kernel between two products. At batch 1 such a kernel costs ~2.5 us on the critical path (wait for the
 * product to drain, two reductions, stores, and the next product's wait for it), of which the arithmetic is a small
 * part. Done again by each block of the consumer, right after its PDL wait, it costs the consumer one L2 round trip
 * and two block reductions, and the boundary is gone. The inputs are K floats each (6 KB at E2B): read by every
 * block from L2, as the plain kernel reads x anyway.
 *
 * Measured (bench/RESULTS.md session 6): slower than the separate launch on the H200 (E2B batch 1: 467 against 482
 * tok/s), so BERTH_CUDA_XPRE defaults to 0. The likely cost: ~500 blocks each pulling 12 KB of inputs plus the
 * weights from L2 at the same moment, and three barriers, before any block can use its weights.
 *
 * Same arithmetic as norm.cu's fast rms_norm kernel — o = x * inv * w, + residual, * out_scale; y2 = o * inv2 * w2;
 * fp32 sums of squares with fmaf — but summed in another order, so y / y2 can differ from the separate launch's in
 * the last bit. Every block sums in the same order: all blocks use bit-identical rows.
 */
#ifndef BERTH_CUDA_GEMV_XPRE_CUH
#define BERTH_CUDA_GEMV_XPRE_CUH

#include "cuda_internal.h"
#include "cuda_device.cuh"
#include "cuda_mma.cuh"

#define CU_XPRE_SMEM_MAX (47 * 1024) /* dynamic shared memory without an opt-in (48 KiB) less the kernel's static */

/* One row of the norm: n = K floats, each pointer 16-byte aligned, K a multiple of 4 (weights: of 16 bytes). */
struct cu_xpre {
    const float *x;            /* the norm's x row */
    const float *res;          /* its residual row (NULL: BERTH_RESID_NONE) */
    float *y, *y2;             /* its outputs (y2 NULL: none, and the product's x is y) */
    const void *w, *w2;        /* weights (NULL: no weight) */
    int32_t wdt, wmode, w2dt, w2mode;
    int32_t early;             /* both weights may be read before cu_pdl_wait (weights buffers) */
    int32_t es1, es2;          /* weight element sizes (0: no weight) */
    float eps, oscale;         /* oscale 1: none */
    int32_t on;                /* 0: no prologue */
};

/* Shared memory the prologue needs for rows of K: x and the residual as f32, then the two weights raw. */
static inline size_t cu_xpre_smem(int64_t K, int es1, int es2)
{
    return (size_t)K * 8u + (size_t)K * (size_t)(es1 + es2);
}

/* Four weight factors of chunk c (elements 4c .. 4c + 3) from a raw weight in shared memory. */
static __device__ __forceinline__ float4 cu_xpre_factor(const char *ws, int dt, int mode, int c)
{
    float4 f = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
    if (mode != BERTH_NORM_W && mode != BERTH_NORM_W_ONE_PLUS)
        return f;
    if (dt == BERTH_DTYPE_BF16) {
        const uint2 q = reinterpret_cast<const uint2 *>(ws)[c];
        f = make_float4(__uint_as_float(q.x << 16), __uint_as_float(q.x & 0xffff0000u), __uint_as_float(q.y << 16),
                        __uint_as_float(q.y & 0xffff0000u));
    } else if (dt == BERTH_DTYPE_F16) {
        const uint2 q = reinterpret_cast<const uint2 *>(ws)[c];
        f = make_float4(__half2float(__ushort_as_half((unsigned short)(q.x & 0xffffu))),
                        __half2float(__ushort_as_half((unsigned short)(q.x >> 16))),
                        __half2float(__ushort_as_half((unsigned short)(q.y & 0xffffu))),
                        __half2float(__ushort_as_half((unsigned short)(q.y >> 16))));
    } else {
        f = reinterpret_cast<const float4 *>(ws)[c];
    }
    if (mode == BERTH_NORM_W_ONE_PLUS)
        f = make_float4(1.0f + f.x, 1.0f + f.y, 1.0f + f.z, 1.0f + f.w);
    return f;
}

/* Copy the two weights into shared memory (one cp.async group; call before the PDL wait when p.early). */
static __device__ __forceinline__ void cu_xpre_load_weights(const cu_xpre &p, int64_t K, char *smem)
{
    const int tid = (int)threadIdx.x, nt = (int)blockDim.x;
    char *w1s = smem + K * 8, *w2s = w1s + K * p.es1;
    const int n1 = (int)(K * p.es1 / 16), n2 = (int)(K * p.es2 / 16);
    for (int c = tid; c < n1; c += nt)
        cu_cp16((uint16_t *)(w1s + 16 * c), (const char *)p.w + 16 * c, 16);
    for (int c = tid; c < n2; c += nt)
        cu_cp16((uint16_t *)(w2s + 16 * c), (const char *)p.w2 + 16 * c, 16);
    cu_cp_commit();
}

/* After the PDL wait (and cu_xpre_load_weights): the norm's row into smem[0 .. K) as floats — the row the product
 * multiplies — with y (and y2) stored by block 0. Contains __syncthreads: every thread of the block calls it. */
static __device__ __forceinline__ void cu_xpre_run(const cu_xpre &p, int64_t K, char *smem)
{
    __shared__ float scratch[32];
    const int tid = (int)threadIdx.x, nt = (int)blockDim.x, nc = (int)(K / 4);
    float4 *xs = reinterpret_cast<float4 *>(smem), *rs = xs + nc;
    const char *w1s = smem + K * 8, *w2s = w1s + K * p.es1;
    for (int c = tid; c < nc; c += nt) {
        cu_cp16((uint16_t *)(xs + c), (const char *)(p.x + 4 * c), 16);
        if (p.res)
            cu_cp16((uint16_t *)(rs + c), (const char *)(p.res + 4 * c), 16);
    }
    cu_cp_commit();
    cu_cp_wait<0>(); /* this thread's chunks (and its share of the weights) have landed */
    float ss = 0.0f;
    for (int c = tid; c < nc; c += nt) {
        const float4 v = xs[c];
        ss = fmaf(v.x, v.x, ss);
        ss = fmaf(v.y, v.y, ss);
        ss = fmaf(v.z, v.z, ss);
        ss = fmaf(v.w, v.w, ss);
    }
    ss = cu_block_sum(ss, scratch); /* its barriers also publish every thread's weight chunks */
    const float inv = 1.0f / sqrtf(ss / (float)K + p.eps);
    const bool store = blockIdx.x == 0 && blockIdx.y == 0;
    float ss2 = 0.0f;
    for (int c = tid; c < nc; c += nt) {
        const float4 v = xs[c], f = cu_xpre_factor(w1s, p.wdt, p.wmode, c);
        float4 o = make_float4(v.x * inv * f.x, v.y * inv * f.y, v.z * inv * f.z, v.w * inv * f.w);
        if (p.res) {
            const float4 r = rs[c];
            o = make_float4(r.x + o.x, r.y + o.y, r.z + o.z, r.w + o.w);
        }
        if (p.oscale != 1.0f)
            o = make_float4(o.x * p.oscale, o.y * p.oscale, o.z * p.oscale, o.w * p.oscale);
        xs[c] = o;
        if (store)
            reinterpret_cast<float4 *>(p.y)[c] = o;
        ss2 = fmaf(o.x, o.x, fmaf(o.y, o.y, fmaf(o.z, o.z, fmaf(o.w, o.w, ss2))));
    }
    if (p.y2) {
        ss2 = cu_block_sum(ss2, scratch);
        const float inv2 = 1.0f / sqrtf(ss2 / (float)K + p.eps);
        for (int c = tid; c < nc; c += nt) {
            const float4 v = xs[c], f = cu_xpre_factor(w2s, p.w2dt, p.w2mode, c);
            const float4 o = make_float4(v.x * inv2 * f.x, v.y * inv2 * f.y, v.z * inv2 * f.z, v.w * inv2 * f.w);
            xs[c] = o;
            if (store)
                reinterpret_cast<float4 *>(p.y2)[c] = o;
        }
    }
    __syncthreads(); /* the row is whole */
}

#endif

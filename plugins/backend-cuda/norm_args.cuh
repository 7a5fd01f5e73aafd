/*
 * norm_args.cuh — rms_norm's kernel arguments (norm.cu) and the little its kernels share with the GEMV kernels
 * that finish a matmul's trailing norm themselves (gemv_norm.cuh), which take the same arguments.
 */
#ifndef BERTH_CUDA_NORM_ARGS_CUH
#define BERTH_CUDA_NORM_ARGS_CUH

#include "cuda_internal.h"
#include "cuda_device.cuh"

#define NM_WARP_MAX 1024    /* general kernels: rows up to this many elements get a warp each */
#define NM_VEC_WARP_MAX 512 /* fast rms_norm: rows up to this many elements get a warp each (4 float4 per lane) */
#define NM_VEC_MAX 8192     /* fast rms_norm: longest row (1024 threads x 2 float4) */
#define NM_WNONE (-1)       /* fast rms_norm weight template argument: no weight */

struct nm_rms_args {
    cu_rows x, y, res; /* res only with a residual mode */
    const void *w;     /* NULL unless weight mode W / W_ONE_PLUS */
    int32_t wdt, wmode, rmode;
    int32_t w_early;   /* fast kernel: the weight may be read before cu_pdl_wait (a weights buffer) */
    float eps;
    float oscale;      /* out_scale: y is multiplied by it (1: nothing to do) */
    int64_t n, rows;
    /* RoPE after the weight (nm_rms_rope_kernel only): row r is head r % heads of token r / heads */
    const int32_t *pos;
    const float *freqs;
    int64_t heads;
    int32_t rmode_rope, roff, np;
    int32_t f_early;   /* the RoPE frequencies may be read before cu_pdl_wait (a weights buffer) */
    int32_t pos_early; /* ... and the positions (metadata the host copies: be->att_prewait) */
    /* the second output (y2 = RMSNorm(y) * w2), rms_norm's kernels only */
    int32_t has_y2, w2dt, w2mode;
    const void *w2;    /* NULL unless w2mode W / W_ONE_PLUS */
    int32_t w2_early;  /* fast kernel: w2 may be read before cu_pdl_wait (a weights buffer) */
    cu_rows y2;
    /* fast kernel: a copy of the last output (y2, else y) rounded to bdt (bf16 / f16), row r at xb + r * ldb
     * elements: the packed x of the cuBLAS product that reads it (matmul.cu's mm_blas); NULL: none */
    void *xb;
    int64_t ldb;
    int32_t bdt;
};

/* Row i of a tensor whose rows the norms read and write as floats. */
static __device__ __forceinline__ float *nm_row(const cu_rows &r, int64_t i)
{
    return (float *)cu_row(r, i);
}

/* The weight factor of element i in mode `mode` (W: w, W_ONE_PLUS: 1 + w, otherwise 1). */
static __device__ __forceinline__ float nm_factor(const void *w, int dt, int mode, int64_t i)
{
    if (mode == BERTH_NORM_W)
        return cu_ld(w, dt, i);
    if (mode == BERTH_NORM_W_ONE_PLUS)
        return 1.0f + cu_ld(w, dt, i);
    return 1.0f;
}

/* Four elements of a norm's float4 paths, each step in rms_norm's order (the CPU backend's): */
/* y * inv * w (the weighted output; the second output: y * inv2 * w2) */
static __device__ __forceinline__ float4 nm_scale4(const float4 &y, float inv, const float4 &w)
{
    float4 o;
    o.x = y.x * inv * w.x;
    o.y = y.y * inv * w.y;
    o.z = y.z * inv * w.z;
    o.w = y.w * inv * w.w;
    return o;
}

/* then + the residual (ADD_AFTER: add), then * out_scale */
static __device__ __forceinline__ void nm_resid_scale4(float4 &o, bool add, const float4 &r, float oscale)
{
    if (add) {
        o.x = r.x + o.x;
        o.y = r.y + o.y;
        o.z = r.z + o.z;
        o.w = r.w + o.w;
    }
    if (oscale != 1.0f) {
        o.x *= oscale;
        o.y *= oscale;
        o.z *= oscale;
        o.w *= oscale;
    }
}

/* s + the output's sum of squares (for the second output's norm) */
static __device__ __forceinline__ float nm_sumsq4(const float4 &o, float s)
{
    return fmaf(o.x, o.x, fmaf(o.y, o.y, fmaf(o.z, o.z, fmaf(o.w, o.w, s))));
}

#endif

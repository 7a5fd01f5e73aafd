/*
 * norm.cu — normalisations over ne[0] of each row, fp32: rms_norm and layer_norm (weight and residual modes of
 * berth/backend.h) and gated_rms_norm (Qwen3.5 GDN output norm).
 *
 * rms_norm, the fast path (rows of n % 4 == 0 floats up to NM_VEC_MAX, 16-byte aligned rows, weight aligned to
 * its 4-element vector): a decode step runs ~270 of these on one row of 1536 or a few heads of 256/512, so each
 * call is pure latency. The row is read once, in 16-byte loads, into registers (V float4 per thread): x and the
 * residual are all loaded before anything is stored (a store may alias a later load, which would serialise them),
 * then one reduction, then the stores. The weight is the same for every row, so each thread loads its part once,
 * vectorised, before its first row; with programmatic dependent launch it does so before waiting for the previous
 * kernel when the weight lives in a BERTH_USAGE_WEIGHTS buffer (nothing writes weights). A row of up to 512
 * elements takes a warp (no shared memory, no barrier; up to 8 rows per block), a longer one a block of up to
 * 1024 threads, 8 elements per thread (1536: 192 threads).
 * Other rows (odd lengths, unaligned views, n > NM_VEC_MAX) and layer_norm / gated_rms_norm take the general
 * kernels: a team per row (a warp up to NM_WARP_MAX elements, else a block), fp32 tree reductions, each pass
 * re-reading the row (L1/L2 hits) instead of keeping it in registers, so any row length works.
 * Aliasing: y may alias x (and, element for element, the residual). Every element is read and written by the same
 * thread, reads first, so no thread reads an element another one has already rewritten. RESID_ADD_BEFORE writes
 * residual[i] += x[i] first and y[i] after it (y wins where they alias).
 * Every kernel is launched through cu_launch (cuda_launch.cuh) and follows its wait/trigger contract.
 * A matmul's trailing norm (y_norm) is this file's rms_norm after the product, unless the GEMV finishes it in its
 * last block (gemv_norm.cuh, which mirrors the fast kernel's arithmetic exactly: keep the two in step).
 */
#include "cuda_internal.h"
#include "cuda_device.cuh"
#include "cuda_launch.cuh"
#include "gemv_norm.cuh"
#include "norm_args.cuh"
#include "gemv_xpre.cuh"

#include <inttypes.h>
#include <string.h>

/* Float4 q of row `row` of the packed copy (nm_rms_args.xb), rounded to nearest even. */
static __device__ __forceinline__ void nm_st_packed(const nm_rms_args &a, int64_t row, int q, float4 v)
{
    uint2 pk;
    if (a.bdt == BERTH_DTYPE_BF16) {
        const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
        pk = make_uint2(*reinterpret_cast<const uint32_t *>(&lo), *reinterpret_cast<const uint32_t *>(&hi));
    } else {
        const __half2 lo = __floats2half2_rn(v.x, v.y), hi = __floats2half2_rn(v.z, v.w);
        pk = make_uint2(*reinterpret_cast<const uint32_t *>(&lo), *reinterpret_cast<const uint32_t *>(&hi));
    }
    reinterpret_cast<uint2 *>((char *)a.xb + (row * a.ldb + 4 * (int64_t)q) * 2)[0] = pk;
}

/* The rows a thread's team handles, its lane in the team and the team's sum. */
template <bool WARP>
struct nm_team {
    int64_t row0, rstep;
    int lane, width;
    __device__ __forceinline__ nm_team()
    {
        if (WARP) {
            lane = (int)threadIdx.x & 31;
            width = 32;
            row0 = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
            rstep = (int64_t)gridDim.x * (blockDim.x >> 5);
        } else {
            lane = (int)threadIdx.x;
            width = (int)blockDim.x;
            row0 = blockIdx.x;
            rstep = gridDim.x;
        }
    }
    /* Called by the whole team (the block in block mode: it contains barriers). */
    __device__ __forceinline__ float sum(float v, float *scratch) const
    {
        if constexpr (WARP)
            return cu_warp_sum(v);
        else
            return cu_block_sum(v, scratch);
    }
};

struct nm_launch {
    bool warp;
    unsigned grid, threads;
};

static nm_launch nm_shape(int64_t n, int64_t rows)
{
    nm_launch l;
    int64_t g;
    if (n <= NM_WARP_MAX) {
        l.warp = true;
        l.threads = 256;
        g = (rows + 7) / 8;
    } else {
        l.warp = false;
        unsigned t = 64;
        while (t < 1024 && (int64_t)t * 8 < n)
            t <<= 1;
        l.threads = t;
        g = rows;
    }
    l.grid = (unsigned)(g > (1 << 20) ? (1 << 20) : g); /* the kernels loop over further rows */
    return l;
}

// ---------------------------------------------------------------------------------------------------------------
// rms_norm

/* General kernel: any row length and layout. */
template <bool WARP>
__global__ void nm_rms_kernel(const nm_rms_args a)
{
    __shared__ float scratch[32];
    cu_pdl_trigger();
    cu_pdl_wait();
    const nm_team<WARP> tm;
    for (int64_t row = tm.row0; row < a.rows; row += tm.rstep) {
        const float *x = nm_row(a.x, row);
        float *y = nm_row(a.y, row);
        float *res = a.rmode != BERTH_RESID_NONE ? nm_row(a.res, row) : nullptr;
        float ss = 0.0f;
        for (int64_t i = tm.lane; i < a.n; i += tm.width) {
            float v = x[i];
            if (a.rmode == BERTH_RESID_ADD_BEFORE) {
                v = res[i] + v;
                res[i] = v;
            }
            ss = fmaf(v, v, ss);
        }
        ss = tm.sum(ss, scratch);
        const float inv = 1.0f / sqrtf(ss / (float)a.n + a.eps);
        for (int64_t i = tm.lane; i < a.n; i += tm.width) {
            float v = (a.rmode == BERTH_RESID_ADD_BEFORE ? res[i] : x[i]) * inv;
            if (a.wmode == BERTH_NORM_W)
                v *= cu_ld(a.w, a.wdt, i);
            else if (a.wmode == BERTH_NORM_W_ONE_PLUS)
                v *= 1.0f + cu_ld(a.w, a.wdt, i);
            v = a.rmode == BERTH_RESID_ADD_AFTER ? res[i] + v : v;
            y[i] = a.oscale != 1.0f ? v * a.oscale : v;
        }
        if (a.has_y2) { /* each thread re-reads the elements of y it wrote itself */
            float *y2 = nm_row(a.y2, row);
            float ss2 = 0.0f;
            for (int64_t i = tm.lane; i < a.n; i += tm.width)
                ss2 = fmaf(y[i], y[i], ss2);
            ss2 = tm.sum(ss2, scratch);
            const float inv2 = 1.0f / sqrtf(ss2 / (float)a.n + a.eps);
            for (int64_t i = tm.lane; i < a.n; i += tm.width)
                y2[i] = y[i] * inv2 * nm_factor(a.w2, a.w2dt, a.w2mode, i);
        }
    }
}

/* Weights [4q, 4q + 4) widened to float (f32: one 16-byte load; bf16/f16: one 8-byte load). Plain loads, not
 * __ldg: with PDL the grid may run while an earlier kernel still writes (see cuda_launch.cuh). */
template <int WDT>
static __device__ __forceinline__ float4 nm_ld_w4(const void *w, int q)
{
    if constexpr (WDT == BERTH_DTYPE_F32) {
        return ((const float4 *)w)[q];
    } else {
        const uint2 u = ((const uint2 *)w)[q];
        float4 f;
        if constexpr (WDT == BERTH_DTYPE_BF16) {
            f.x = __uint_as_float(u.x << 16);
            f.y = __uint_as_float(u.x & 0xffff0000u);
            f.z = __uint_as_float(u.y << 16);
            f.w = __uint_as_float(u.y & 0xffff0000u);
        } else {
            f.x = __half2float(__ushort_as_half((unsigned short)(u.x & 0xffffu)));
            f.y = __half2float(__ushort_as_half((unsigned short)(u.x >> 16)));
            f.z = __half2float(__ushort_as_half((unsigned short)(u.y & 0xffffu)));
            f.w = __half2float(__ushort_as_half((unsigned short)(u.y >> 16)));
        }
        return f;
    }
}

/* This thread's weights: float4 number lane + j * width for j < V (those below nv), 1 + w for W_ONE_PLUS (the
 * same sum the general kernel forms per element). */
template <int WDT, int V>
static __device__ __forceinline__ void nm_ld_weights(const nm_rms_args &a, int lane, int width, int nv, float4 (&wv)[V])
{
#pragma unroll
    for (int j = 0; j < V; j++) {
        const int q = lane + j * width;
        if (q < nv) {
            wv[j] = nm_ld_w4<WDT>(a.w, q);
            if (a.wmode == BERTH_NORM_W_ONE_PLUS) {
                wv[j].x = 1.0f + wv[j].x;
                wv[j].y = 1.0f + wv[j].y;
                wv[j].z = 1.0f + wv[j].z;
                wv[j].w = 1.0f + wv[j].w;
            }
        }
    }
}

/* Fast kernel (see the top comment): thread `lane` of a row's team owns float4 number lane + j * width of the
 * row, j < V. WDT: the weight dtype, or NM_WNONE for the weightless modes. */
template <int WDT, bool WARP, int V, bool PK>
__global__ void __launch_bounds__(WARP ? 256 : 1024) nm_rms_vec_kernel(const nm_rms_args a)
{
    __shared__ float scratch[32];
    cu_pdl_trigger();
    const nm_team<WARP> tm;
    const int nv = (int)(a.n >> 2), lane = tm.lane, width = tm.width;
    float4 wv[V];
#pragma unroll
    for (int j = 0; j < V; j++)
        wv[j] = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
    if constexpr (WDT != NM_WNONE)
        if (a.w_early)
            nm_ld_weights<WDT, V>(a, lane, width, nv, wv);
    /* The second output's factors, loaded with the first weights instead of after the second reduction (one
     * dependent round trip less at the end of the chain); the same values, so the same bits. */
    float4 w2v[V];
    auto ld_w2 = [&]() {
#pragma unroll
        for (int j = 0; j < V; j++) {
            const int q = lane + j * width;
            w2v[j] = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
            if (a.has_y2 && q < nv)
                w2v[j] = make_float4(nm_factor(a.w2, a.w2dt, a.w2mode, 4 * q + 0),
                                     nm_factor(a.w2, a.w2dt, a.w2mode, 4 * q + 1),
                                     nm_factor(a.w2, a.w2dt, a.w2mode, 4 * q + 2),
                                     nm_factor(a.w2, a.w2dt, a.w2mode, 4 * q + 3));
        }
    };
    if (a.w2_early)
        ld_w2();
    cu_pdl_wait();
    if constexpr (WDT != NM_WNONE)
        if (!a.w_early)
            nm_ld_weights<WDT, V>(a, lane, width, nv, wv);
    if (!a.w2_early)
        ld_w2();

    for (int64_t row = tm.row0; row < a.rows; row += tm.rstep) {
        const float4 *x = (const float4 *)nm_row(a.x, row);
        float4 *y = (float4 *)nm_row(a.y, row);
        float4 *res = a.rmode != BERTH_RESID_NONE ? (float4 *)nm_row(a.res, row) : nullptr;
        float4 v[V], r[V];
#pragma unroll
        for (int j = 0; j < V; j++) { /* every load of the row before any store */
            const int q = lane + j * width;
            v[j] = r[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (q < nv) {
                v[j] = x[q];
                if (a.rmode != BERTH_RESID_NONE)
                    r[j] = res[q];
            }
        }
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < V; j++) {
            if (a.rmode == BERTH_RESID_ADD_BEFORE) {
                v[j].x = r[j].x + v[j].x;
                v[j].y = r[j].y + v[j].y;
                v[j].z = r[j].z + v[j].z;
                v[j].w = r[j].w + v[j].w;
                const int q = lane + j * width;
                if (q < nv)
                    res[q] = v[j];
            }
            ss = fmaf(v[j].x, v[j].x, ss);
            ss = fmaf(v[j].y, v[j].y, ss);
            ss = fmaf(v[j].z, v[j].z, ss);
            ss = fmaf(v[j].w, v[j].w, ss);
        }
        ss = tm.sum(ss, scratch);
        const float inv = 1.0f / sqrtf(ss / (float)a.n + a.eps);
        float ss2 = 0.0f;
#pragma unroll
        for (int j = 0; j < V; j++) {
            const int q = lane + j * width;
            if (q >= nv)
                continue;
            float4 &o = v[j]; /* y's values stay in v[] for the second output */
            o.x = v[j].x * inv;
            o.y = v[j].y * inv;
            o.z = v[j].z * inv;
            o.w = v[j].w * inv;
            if constexpr (WDT != NM_WNONE) {
                o.x *= wv[j].x;
                o.y *= wv[j].y;
                o.z *= wv[j].z;
                o.w *= wv[j].w;
            }
            if (a.rmode == BERTH_RESID_ADD_AFTER) {
                o.x = r[j].x + o.x;
                o.y = r[j].y + o.y;
                o.z = r[j].z + o.z;
                o.w = r[j].w + o.w;
            }
            if (a.oscale != 1.0f) {
                o.x *= a.oscale;
                o.y *= a.oscale;
                o.z *= a.oscale;
                o.w *= a.oscale;
            }
            y[q] = o;
            if (a.has_y2)
                ss2 = fmaf(o.x, o.x, fmaf(o.y, o.y, fmaf(o.z, o.z, fmaf(o.w, o.w, ss2))));
            else if (PK)
                nm_st_packed(a, row, q, o);
        }
        if (a.has_y2) { /* uniform over the team: tm.sum's barriers are safe */
            float4 *y2 = (float4 *)nm_row(a.y2, row);
            ss2 = tm.sum(ss2, scratch);
            const float inv2 = 1.0f / sqrtf(ss2 / (float)a.n + a.eps);
#pragma unroll
            for (int j = 0; j < V; j++) {
                const int q = lane + j * width;
                if (q >= nv)
                    continue;
                float4 o2;
                o2.x = v[j].x * inv2 * w2v[j].x;
                o2.y = v[j].y * inv2 * w2v[j].y;
                o2.z = v[j].z * inv2 * w2v[j].z;
                o2.w = v[j].w * inv2 * w2v[j].w;
                y2[q] = o2;
                if constexpr (PK)
                    nm_st_packed(a, row, q, o2);
            }
        }
    }
}

/* The fast kernel's block-per-row case for Gemma's norms only (be->norm_lean): bf16 weight (W or W_ONE_PLUS), no
 * or an ADD_AFTER residual, evenly spaced rows (row r at base + r * nb1: no index split), 2 float4 per thread,
 * optional second output with a bf16 weight, optional packed copy. The arithmetic is nm_rms_vec_kernel's, step for
 * step (the same bits); what it leaves out is the code for every other case, which that kernel carries in its
 * 30 KB of machine code: 8-12 KB here, and the decode step 2-3% faster (bench/RESULTS.md session 17: machine
 * code a kernel carries but does not run costs at every launch). */
static __device__ __forceinline__ char *nm_lean_row(const cu_rows &r, int64_t i)
{
    return r.base + i * r.nb1;
}

/* cu_block_sum for four sums at once: each component through the same shuffle tree and the same second level, so
 * component x is bit for bit what cu_block_sum returns for it alone. */
static __device__ __forceinline__ float4 nm_block_sum4(float4 v, float4 *scratch)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v.x = cu_warp_sum(v.x);
    v.y = cu_warp_sum(v.y);
    v.z = cu_warp_sum(v.z);
    v.w = cu_warp_sum(v.w);
    __syncthreads(); /* scratch may still be read by a previous call */
    if (lane == 0)
        scratch[warp] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    v.x = cu_warp_sum(v.x);
    v.y = cu_warp_sum(v.y);
    v.z = cu_warp_sum(v.z);
    v.w = cu_warp_sum(v.w);
    return v;
}

/* ONE (be->norm_y2_onepass, with Y2 only): the second output's sum of squares without a second reduction. With
 * u = w * v (the weighted raw row; o = s (r + inv u), s = out_scale), sum o^2 = s^2 (sum r^2 + 2 inv sum r u +
 * inv^2 sum u^2): the three sums ride in the first reduction beside sum v^2 (nm_block_sum4: inv is bit for bit the
 * two-pass one). Only inv2 rounds differently (a few ulp; the expansion cancels only where h = r + inv u is small
 * against r and inv u, which Gemma's residual stream is not). The weight in u is the instance's wv (1 + w for
 * W_ONE_PLUS), as nm_scale4 applies it. */
template <bool Y2, bool PK, bool ONE = false>
__global__ void __launch_bounds__(1024) nm_rms_lean_kernel(const nm_rms_args a)
{
    static_assert(!ONE || Y2, "the one-pass sums serve the second output");
    constexpr int V = 2;
    __shared__ float scratch[32];
    [[maybe_unused]] __shared__ float4 scratch4[ONE ? 32 : 1];
    cu_pdl_trigger();
    const int nv = (int)(a.n >> 2), lane = (int)threadIdx.x, width = (int)blockDim.x;
    const bool one_plus = a.wmode == BERTH_NORM_W_ONE_PLUS;
    float4 wv[V], w2v[V];
    auto ld_w = [&]() {
#pragma unroll
        for (int j = 0; j < V; j++) {
            const int q = lane + j * width;
            wv[j] = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
            if (q < nv) {
                wv[j] = nm_ld_w4<BERTH_DTYPE_BF16>(a.w, q);
                if (one_plus) {
                    wv[j].x = 1.0f + wv[j].x;
                    wv[j].y = 1.0f + wv[j].y;
                    wv[j].z = 1.0f + wv[j].z;
                    wv[j].w = 1.0f + wv[j].w;
                }
            }
        }
    };
    auto ld_w2 = [&]() {
#pragma unroll
        for (int j = 0; j < V; j++) {
            const int q = lane + j * width;
            w2v[j] = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
            if (Y2 && q < nv && (a.w2mode == BERTH_NORM_W || a.w2mode == BERTH_NORM_W_ONE_PLUS)) {
                w2v[j] = nm_ld_w4<BERTH_DTYPE_BF16>(a.w2, q);
                if (a.w2mode == BERTH_NORM_W_ONE_PLUS) {
                    w2v[j].x = 1.0f + w2v[j].x;
                    w2v[j].y = 1.0f + w2v[j].y;
                    w2v[j].z = 1.0f + w2v[j].z;
                    w2v[j].w = 1.0f + w2v[j].w;
                }
            }
        }
    };
    if (a.w_early)
        ld_w();
    if (Y2 && a.w2_early)
        ld_w2();
    cu_pdl_wait();
    if (!a.w_early)
        ld_w();
    if (Y2 && !a.w2_early)
        ld_w2();
    const bool resid = a.rmode == BERTH_RESID_ADD_AFTER;

    for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
        const float4 *x = (const float4 *)nm_lean_row(a.x, row);
        float4 *y = (float4 *)nm_lean_row(a.y, row);
        const float4 *res = resid ? (const float4 *)nm_lean_row(a.res, row) : nullptr;
        float4 v[V], r[V];
#pragma unroll
        for (int j = 0; j < V; j++) { /* every load of the row before any store */
            const int q = lane + j * width;
            v[j] = r[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (q < nv) {
                v[j] = x[q];
                if (resid)
                    r[j] = res[q];
            }
        }
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < V; j++) {
            ss = fmaf(v[j].x, v[j].x, ss);
            ss = fmaf(v[j].y, v[j].y, ss);
            ss = fmaf(v[j].z, v[j].z, ss);
            ss = fmaf(v[j].w, v[j].w, ss);
        }
        [[maybe_unused]] float4 s4;
        if constexpr (ONE) { /* sum r^2, sum r u, sum u^2 beside sum v^2 (zeros past nv: v, r and so u are 0) */
            float sr = 0.0f, sru = 0.0f, suu = 0.0f;
#pragma unroll
            for (int j = 0; j < V; j++) {
                const float4 u = make_float4(wv[j].x * v[j].x, wv[j].y * v[j].y, wv[j].z * v[j].z, wv[j].w * v[j].w);
                suu = nm_sumsq4(u, suu);
                if (resid) {
                    sr = nm_sumsq4(r[j], sr);
                    sru = fmaf(r[j].x, u.x, fmaf(r[j].y, u.y, fmaf(r[j].z, u.z, fmaf(r[j].w, u.w, sru))));
                }
            }
            s4 = nm_block_sum4(make_float4(ss, sr, sru, suu), scratch4);
            ss = s4.x;
        } else {
            ss = cu_block_sum(ss, scratch);
        }
        const float inv = 1.0f / sqrtf(ss / (float)a.n + a.eps);
        float ss2 = 0.0f;
#pragma unroll
        for (int j = 0; j < V; j++) {
            const int q = lane + j * width;
            if (q >= nv)
                continue;
            float4 &o = v[j]; /* y's values stay in v[] for the second output */
            o = nm_scale4(v[j], inv, wv[j]);
            nm_resid_scale4(o, resid, r[j], a.oscale);
            y[q] = o;
            if constexpr (Y2 && !ONE)
                ss2 = nm_sumsq4(o, ss2);
            else if constexpr (PK && !Y2)
                nm_st_packed(a, row, q, o);
        }
        if constexpr (Y2) {
            float4 *y2 = (float4 *)nm_lean_row(a.y2, row);
            if constexpr (ONE) {
                ss2 = a.oscale * a.oscale * fmaf(inv * inv, s4.w, fmaf(2.0f * inv, s4.z, s4.y));
                ss2 = ss2 < 0.0f ? 0.0f : ss2; /* rounding below zero where the row is ~0; NaN passes, as in
                                                * the two-pass sum */
            } else {
                ss2 = cu_block_sum(ss2, scratch);
            }
            const float inv2 = 1.0f / sqrtf(ss2 / (float)a.n + a.eps);
#pragma unroll
            for (int j = 0; j < V; j++) {
                const int q = lane + j * width;
                if (q >= nv)
                    continue;
                const float4 o2 = nm_scale4(v[j], inv2, w2v[j]);
                y2[q] = o2;
                if constexpr (PK)
                    nm_st_packed(a, row, q, o2);
            }
        }
    }
}

/* RMS norm + weight + RoPE (q-norm and rotation in one launch): a block per row (a head, n <= NM_ROPE_MAX, a
 * thread per element), the raw row staged in shared memory so that a thread can read its pair partner; each
 * thread of the first n_pairs then rotates one whole pair (one sincosf, both elements written) exactly as
 * rp_rope_kernel does (fp32 angle (float)pos * freq, precise sincosf, the same two expressions) on the normalised,
 * weighted values ((x * rstd) * w, rms_norm's order), and the elements outside every pair are copied, times
 * out_scale. A warp per row with the lanes looping over the elements ran ~2.5x longer at decode (8 rows of 256):
 * the loops are serial latency. The row is read whole before anything is written, so y may alias x. */
#define NM_ROPE_MAX 1024
__global__ void __launch_bounds__(NM_ROPE_MAX) nm_rms_rope_kernel(const nm_rms_args a)
{
    extern __shared__ float nm_rope_smem[];
    __shared__ float scratch[32];
    cu_pdl_trigger();
    const int tid = (int)threadIdx.x;
    const bool half = a.rmode_rope == BERTH_ROPE_HALF;
    /* The thread's first pair (j = tid): its frequency and weight factors, before the wait where their buffers
     * hold weights; its sin / cos once the position is known, before the reduction (the decode case is one pair
     * per thread, and these loads and sincosf were the tail of the chain). Same values, same bits. */
    const bool wtd = a.wmode == BERTH_NORM_W || a.wmode == BERTH_NORM_W_ONE_PLUS;
    const bool mine = tid < a.np;
    const int64_t mi0 = half ? tid : 2 * (int64_t)tid, mi1 = half ? tid + a.roff : 2 * (int64_t)tid + 1;
    float fq = 0.0f, f0 = 1.0f, f1 = 1.0f;
    auto ld_f = [&]() {
        if (mine)
            fq = a.freqs[tid];
    };
    auto ld_w = [&]() {
        if (mine && wtd) {
            f0 = nm_factor(a.w, a.wdt, a.wmode, mi0);
            f1 = nm_factor(a.w, a.wdt, a.wmode, mi1);
        }
    };
    if (a.f_early)
        ld_f();
    if (a.w_early)
        ld_w();
    /* the block's first row's position and its pair's sin / cos before the wait, where positions count as
     * metadata the host wrote by a copy (pos_early: be->att_prewait, attention_decode.cu "Reads before the PDL
     * wait") and the frequency is already here: the decode case's sincosf leaves the critical path */
    const bool pre = a.pos_early && a.f_early && blockIdx.x < a.rows;
    float psn = 0.0f, pcs = 1.0f;
    if (pre && mine)
        cu_sincos((float)a.pos[blockIdx.x / a.heads] * fq, &psn, &pcs);
    cu_pdl_wait();
    if (!a.f_early)
        ld_f();
    if (!a.w_early)
        ld_w();
    for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) { /* uniform over the block */
        const float *x = nm_row(a.x, row);
        float *y = nm_row(a.y, row);
        const float p = (float)a.pos[row / a.heads];
        /* one element and at most one pair per thread: the launch gives a block at least n threads (n <=
         * NM_ROPE_MAX), so no loop over elements or pairs (loops with a second iteration that never ran were
         * most of this kernel's machine code) */
        float ss = 0.0f;
        if (tid < a.n) {
            const float v = x[tid];
            nm_rope_smem[tid] = v;
            ss = fmaf(v, v, ss);
        }
        float msn = psn, mcs = pcs;
        if (mine && !(pre && row == blockIdx.x))
            cu_sincos(p * fq, &msn, &mcs);
        ss = cu_block_sum(ss, scratch); /* its barriers also publish the staged row */
        const float inv = 1.0f / sqrtf(ss / (float)a.n + a.eps);
        if (mine) { /* pair j = tid */
            float x0 = nm_rope_smem[mi0] * inv, x1 = nm_rope_smem[mi1] * inv;
            if (wtd) {
                x0 *= f0;
                x1 *= f1;
            }
            const float o0 = x0 * mcs - x1 * msn, o1 = x1 * mcs + x0 * msn;
            y[mi0] = a.oscale != 1.0f ? o0 * a.oscale : o0;
            y[mi1] = a.oscale != 1.0f ? o1 * a.oscale : o1;
        }
        if (tid < a.n) { /* an element outside every pair */
            const int64_t i = tid;
            const bool rot = half ? i < a.np || (i >= a.roff && i < a.roff + a.np) : i < 2 * (int64_t)a.np;
            if (!rot) {
                float v = nm_rope_smem[i] * inv;
                if (a.wmode == BERTH_NORM_W)
                    v *= cu_ld(a.w, a.wdt, i);
                else if (a.wmode == BERTH_NORM_W_ONE_PLUS)
                    v *= 1.0f + cu_ld(a.w, a.wdt, i);
                y[i] = a.oscale != 1.0f ? v * a.oscale : v;
            }
        }
        __syncthreads(); /* the staged row is rewritten by the next one */
    }
}

/* The same op with a warp per row (8 rows per block, the rows staged in the warp's slice of shared memory): at
 * prefill sizes (16k rows of 256) the block-per-row kernel above runs ~2.5x longer than this one (ncu, H200),
 * at decode sizes (8-64 rows) this one is the slower (serial lanes). The launch picks by tokens (rows / heads),
 * not rows, so that a decode step of many sequences keeps the block kernel. */
#define NM_ROPE_WARPS 8
#define NM_ROPE_WARP_MIN_TOKENS 128 /* prefill chunks; decode steps (one token per sequence) stay below */
__global__ void __launch_bounds__(32 * NM_ROPE_WARPS) nm_rms_rope_warp_kernel(const nm_rms_args a)
{
    extern __shared__ float nm_rope_wsmem[];
    cu_pdl_trigger();
    cu_pdl_wait();
    const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
    float *buf = nm_rope_wsmem + (int64_t)warp * a.n;
    const bool half = a.rmode_rope == BERTH_ROPE_HALF;
    for (int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + warp; row < a.rows;
         row += (int64_t)gridDim.x * (blockDim.x >> 5)) {
        const float *x = nm_row(a.x, row);
        float *y = nm_row(a.y, row);
        float ss = 0.0f;
        for (int64_t i = lane; i < a.n; i += 32) {
            const float v = x[i];
            buf[i] = v;
            ss = fmaf(v, v, ss);
        }
        ss = cu_warp_sum(ss);
        const float inv = 1.0f / sqrtf(ss / (float)a.n + a.eps);
        for (int64_t i = lane; i < a.n; i += 32) { /* own elements only: no barrier needed before */
            float v = buf[i] * inv;
            if (a.wmode == BERTH_NORM_W)
                v *= cu_ld(a.w, a.wdt, i);
            else if (a.wmode == BERTH_NORM_W_ONE_PLUS)
                v *= 1.0f + cu_ld(a.w, a.wdt, i);
            buf[i] = v;
        }
        __syncwarp();
        const float p = (float)a.pos[row / a.heads];
        for (int64_t j = lane; j < a.np; j += 32) { /* pair j: one sincosf, both elements */
            const int64_t i0 = half ? j : 2 * j, i1 = half ? j + a.roff : 2 * j + 1;
            float sn, cs;
            sincosf(p * a.freqs[j], &sn, &cs);
            const float x0 = buf[i0], x1 = buf[i1];
            const float o0 = x0 * cs - x1 * sn, o1 = x1 * cs + x0 * sn;
            y[i0] = a.oscale != 1.0f ? o0 * a.oscale : o0;
            y[i1] = a.oscale != 1.0f ? o1 * a.oscale : o1;
        }
        for (int64_t i = lane; i < a.n; i += 32) { /* the elements outside every pair */
            const bool rot = half ? i < a.np || (i >= a.roff && i < a.roff + a.np) : i < 2 * (int64_t)a.np;
            if (!rot)
                y[i] = a.oscale != 1.0f ? buf[i] * a.oscale : buf[i];
        }
        __syncwarp(); /* buf is rewritten by the next row */
    }
}

/* Every row of t (ne[1..3]) starts 16-byte aligned. */
static bool nm_rows_aligned16(const berth_tensor *t)
{
    if ((uintptr_t)cu_ptr(t) % 16 != 0)
        return false;
    for (int d = 1; d < 4; d++)
        if (t->ne[d] > 1 && t->nb[d] % 16 != 0)
            return false;
    return true;
}

bool cu_check_rms_norm(const berth_backend *be, struct opck *c, const berth_rms_norm_params *p)
{
    (void)be;
    if (!opck_rms_norm(c, p))
        return false;
    if (opck_rms_rope_pairs(p) > 0 && p->x.ne[0] > NM_ROPE_MAX)
        return opck_fail(c, BERTH_E_UNSUPPORTED,
                         "rms_norm: RoPE on rows of %" PRId64 " elements (the cuda backend rotates rows of up to %d)",
                         p->x.ne[0], NM_ROPE_MAX);
    return true;
}

/* The fast kernel's block width for rows of nv float4 (n > NM_VEC_WARP_MAX): 2 float4 per thread, <= 1024 for
 * n <= NM_VEC_MAX. The GEMV's trailing norm (cu_ynorm_plan) uses the same rule. */
static int64_t nm_vec_block_threads(int64_t nv)
{
    return ((nv + 1) / 2 + 31) / 32 * 32;
}

/* The fast kernel for weight dtype WDT: a warp per row (V float4 per lane, 8 rows per block at most) or a block
 * per row (2 float4 per thread). PK: with the packed copy (a.xb; instances of their own, so that the plain norm's
 * code stays as it was: at batch 1 a uniform branch in it measured 0.5% of a token). */
template <int WDT, bool PK = false>
static cudaError_t nm_rms_vec_launch(berth_backend *be, cudaStream_t cs, const nm_rms_args &a)
{
    const int64_t nv = a.n / 4;
    if (a.n <= NM_VEC_WARP_MAX) {
        const int64_t wpb = a.rows < 8 ? a.rows : 8; /* warps (rows) per block */
        int64_t g = (a.rows + wpb - 1) / wpb;
        const dim3 grid((unsigned)(g > (1 << 20) ? (1 << 20) : g)), block((unsigned)(32 * wpb));
        if (nv <= 32)
            return cu_launch(be, cs, grid, block, 0, nm_rms_vec_kernel<WDT, true, 1, PK>, a);
        if (nv <= 64)
            return cu_launch(be, cs, grid, block, 0, nm_rms_vec_kernel<WDT, true, 2, PK>, a);
        return cu_launch(be, cs, grid, block, 0, nm_rms_vec_kernel<WDT, true, 4, PK>, a);
    }
    const int64_t threads = nm_vec_block_threads(nv);
    const dim3 grid((unsigned)(a.rows > (1 << 20) ? (1 << 20) : a.rows)), block((unsigned)threads);
    return cu_launch(be, cs, grid, block, 0, nm_rms_vec_kernel<WDT, false, 2, PK>, a);
}

/* rms_norm's kernel arguments for p, without the RoPE fields. */
static nm_rms_args nm_rms_args_of(const berth_rms_norm_params *p)
{
    const bool has_w = opck_norm_has_weight(p->weight_mode);
    nm_rms_args a;
    memset(&a, 0, sizeof a);
    a.x = cu_rows_of(&p->x);
    a.y = cu_rows_of(&p->y);
    a.rmode = p->resid_mode;
    a.res = a.rmode != BERTH_RESID_NONE ? cu_rows_of(&p->residual) : a.x;
    /* W_NONE and UNIT: no weight */
    a.wmode = has_w ? p->weight_mode : BERTH_NORM_UNIT;
    a.w = has_w ? cu_ptr(&p->w) : NULL;
    a.wdt = p->w.dtype;
    a.w_early = has_w && p->w.buf->usage == BERTH_USAGE_WEIGHTS;
    a.eps = p->eps;
    a.oscale = opck_rms_out_scale(p);
    a.n = p->x.ne[0];
    a.rows = cu_nrows(&p->x);
    a.has_y2 = opck_rms_has_y2(p);
    a.w2 = NULL;
    a.w2dt = BERTH_DTYPE_F32;
    a.w2mode = BERTH_NORM_UNIT;
    if (a.has_y2) {
        a.y2 = cu_rows_of(&p->y2);
        a.w2mode = opck_norm_has_weight(p->y2_weight_mode) ? p->y2_weight_mode : BERTH_NORM_UNIT;
        a.w2 = opck_norm_has_weight(p->y2_weight_mode) ? cu_ptr(&p->y2_w) : NULL;
        a.w2dt = p->y2_w.dtype;
        a.w2_early = a.w2 && p->y2_w.buf->usage == BERTH_USAGE_WEIGHTS;
    }
    return a;
}

/* The fast kernel's weight template argument for p (NM_WNONE: no weight), or NM_VEC_NO when its rows do not suit
 * it (lengths that are not whole float4s or over NM_VEC_MAX, rows or weights not aligned for vector loads). */
#define NM_VEC_NO (-2)
static int nm_vec_wdt(const berth_rms_norm_params *p, const nm_rms_args &a)
{
    const bool has_w = opck_norm_has_weight(p->weight_mode);
    const size_t wal = !has_w ? 1 : p->w.dtype == BERTH_DTYPE_F32 ? 16 : 8;
    const bool vec = a.n % 4 == 0 && a.n <= NM_VEC_MAX && nm_rows_aligned16(&p->x) && nm_rows_aligned16(&p->y) &&
                     (a.rmode == BERTH_RESID_NONE || nm_rows_aligned16(&p->residual)) &&
                     (!a.has_y2 || nm_rows_aligned16(&p->y2)) && (uintptr_t)a.w % wal == 0;
    if (!vec)
        return NM_VEC_NO;
    if (!has_w)
        return NM_WNONE;
    return p->w.dtype == BERTH_DTYPE_BF16 || p->w.dtype == BERTH_DTYPE_F16 ? p->w.dtype : BERTH_DTYPE_F32;
}

/* The fast kernel for p's rows (nm_vec_wdt picks the weight instance); false when its rows do not suit it (nothing
 * launched, *e untouched). PK: with the packed copy (a.xb). */
template <bool PK>
static bool nm_rms_vec_run(berth_backend *be, cudaStream_t cs, const berth_rms_norm_params *p, const nm_rms_args &a,
                           cudaError_t *e)
{
    const int wdt = nm_vec_wdt(p, a);
    if (be->norm_lean && wdt == BERTH_DTYPE_BF16 && a.n > NM_VEC_WARP_MAX &&
        (a.wmode == BERTH_NORM_W || a.wmode == BERTH_NORM_W_ONE_PLUS) &&
        (a.rmode == BERTH_RESID_NONE || a.rmode == BERTH_RESID_ADD_AFTER) && cu_rows_uniform(&p->x) &&
        cu_rows_uniform(&p->y) && (a.rmode == BERTH_RESID_NONE || cu_rows_uniform(&p->residual)) &&
        (!a.has_y2 || (cu_rows_uniform(&p->y2) && (a.w2 == NULL || (a.w2dt == BERTH_DTYPE_BF16 &&
                                                                    (uintptr_t)a.w2 % 8 == 0))))) {
        const int64_t threads = nm_vec_block_threads(a.n / 4); /* the fast kernel's block: 2 float4 per thread */
        const dim3 grid((unsigned)(a.rows > (1 << 20) ? (1 << 20) : a.rows)), block((unsigned)threads);
        if (a.has_y2 && be->norm_y2_onepass)
            *e = cu_launch(be, cs, grid, block, 0, nm_rms_lean_kernel<true, PK, true>, a);
        else if (a.has_y2)
            *e = cu_launch(be, cs, grid, block, 0, nm_rms_lean_kernel<true, PK>, a);
        else
            *e = cu_launch(be, cs, grid, block, 0, nm_rms_lean_kernel<false, PK>, a);
        return true;
    }
    switch (wdt) {
    case NM_WNONE: *e = nm_rms_vec_launch<NM_WNONE, PK>(be, cs, a); return true;
    case BERTH_DTYPE_BF16: *e = nm_rms_vec_launch<BERTH_DTYPE_BF16, PK>(be, cs, a); return true;
    case BERTH_DTYPE_F16: *e = nm_rms_vec_launch<BERTH_DTYPE_F16, PK>(be, cs, a); return true;
    case BERTH_DTYPE_F32: *e = nm_rms_vec_launch<BERTH_DTYPE_F32, PK>(be, cs, a); return true;
    default: return false;
    }
}

berth_status cu_op_rms_norm(berth_backend *be, berth_stream *s, const berth_rms_norm_params *p)
{
    CU_OP_BEGIN(be, rms_norm, p);
    const int64_t n = p->x.ne[0], rows = cu_nrows(&p->x);
    if (n == 0 || rows == 0)
        return BERTH_OK;
    nm_rms_args a = nm_rms_args_of(p);
    a.np = opck_rms_rope_pairs(p);
    if (be->skip & (a.np > 0 ? CU_SKIP_ROPE : CU_SKIP_NORM))
        return BERTH_OK;
    if (a.np > 0) {
        a.pos = (const int32_t *)cu_ptr(&p->rope_positions);
        a.freqs = (const float *)cu_ptr(&p->rope_freqs);
        a.f_early = p->rope_freqs.buf->usage == BERTH_USAGE_WEIGHTS;
        a.pos_early = be->att_prewait;
        a.heads = p->x.ne[1];
        a.rmode_rope = p->rope_mode;
        a.roff = p->rope_pair_offset;
        cudaError_t e;
        if (rows / (a.heads > 0 ? a.heads : 1) >= NM_ROPE_WARP_MIN_TOKENS) {
            const int64_t g = (rows + NM_ROPE_WARPS - 1) / NM_ROPE_WARPS;
            e = cu_launch(be, s->cs, dim3((unsigned)(g > (1 << 20) ? (1 << 20) : g)), dim3(32 * NM_ROPE_WARPS),
                          (size_t)(NM_ROPE_WARPS * n) * sizeof(float), nm_rms_rope_warp_kernel, a);
        } else {
            const int64_t threads = (n + 31) / 32 * 32; /* n <= NM_ROPE_MAX (cu_check_rms_norm) */
            e = cu_launch(be, s->cs, dim3((unsigned)rows), dim3((unsigned)threads), (size_t)n * sizeof(float),
                          nm_rms_rope_kernel, a);
        }
        return cu_check(be, e, "rms_norm (RoPE) kernel");
    }

    cudaError_t e;
    if (!nm_rms_vec_run<false>(be, s->cs, p, a, &e)) {
        const nm_launch l = nm_shape(n, rows);
        if (l.warp)
            e = cu_launch(be, s->cs, dim3(l.grid), dim3(l.threads), 0, nm_rms_kernel<true>, a);
        else
            e = cu_launch(be, s->cs, dim3(l.grid), dim3(l.threads), 0, nm_rms_kernel<false>, a);
    }
    return cu_check(be, e, "rms_norm kernel");
}

/* Whether cu_rms_norm_packed would run p with rows ldb elements apart in dtype bdt (a 16-byte aligned xb). */
bool cu_rms_norm_packable(const berth_backend *be, const berth_rms_norm_params *p, int64_t ldb, int bdt)
{
    const int64_t n = p->x.ne[0];
    if (n == 0 || cu_nrows(&p->x) == 0 || opck_rms_rope_pairs(p) > 0 || (be->skip & CU_SKIP_NORM) || ldb % 4 != 0 ||
        ldb < n || (bdt != BERTH_DTYPE_BF16 && bdt != BERTH_DTYPE_F16))
        return false;
    const nm_rms_args a = nm_rms_args_of(p);
    return nm_vec_wdt(p, a) != NM_VEC_NO;
}

/* rms_norm p (an x_pre: no RoPE) with the packed copy of its last output at xb (rows ldb elements apart, a
 * multiple of 4; dtype bdt, BF16 or F16), when the fast kernel takes its rows: *done says whether it ran (else
 * nothing was enqueued). */
berth_status cu_rms_norm_packed(berth_backend *be, berth_stream *s, const berth_rms_norm_params *p, void *xb,
                                int64_t ldb, int bdt, bool *done)
{
    *done = false;
    CU_OP_BEGIN(be, rms_norm, p);
    if ((uintptr_t)xb % 16 != 0 || !cu_rms_norm_packable(be, p, ldb, bdt))
        return BERTH_OK;
    nm_rms_args a = nm_rms_args_of(p);
    a.xb = xb;
    a.ldb = ldb;
    a.bdt = bdt;
    cudaError_t e;
    if (!nm_rms_vec_run<true>(be, s->cs, p, a, &e))
        return BERTH_OK; /* the general kernels carry no packed copy */
    const berth_status st = cu_check(be, e, "rms_norm kernel (with the packed product input)");
    *done = st == BERTH_OK;
    return st;
}

bool cu_ynorm_plan(const berth_backend *be, const berth_stream *s, const berth_rms_norm_params *yn, int64_t M,
                   cu_ynorm *out)
{
    memset(out, 0, sizeof *out);
    const int64_t n = yn->x.ne[0];
    if (!s->ynorm_count || M < 1 || M > be->gemv_norm || M > CU_YNORM_THREADS / 32 || cu_nrows(&yn->x) != M ||
        n < 1 || opck_rms_rope_pairs(yn) != 0)
        return false;
    out->a = nm_rms_args_of(yn);
    if (nm_vec_wdt(yn, out->a) == NM_VEC_NO) /* the general kernel's rows: not in the GEMV */
        return false;
    out->warp = n <= NM_VEC_WARP_MAX; /* nm_rms_vec_launch's teams */
    out->width = out->warp ? 32 : (int32_t)nm_vec_block_threads(n / 4);
    /* the tail keeps CU_YNORM_CHUNKS float4 per thread (warp rows up to 256, block rows up to 2048) */
    if (out->width > CU_YNORM_THREADS || (int64_t)out->width * 4 * CU_YNORM_CHUNKS < n)
        return false;
    out->count = s->ynorm_count;
    return true;
}

// ---------------------------------------------------------------------------------------------------------------
// layer_norm: (x - mean) / sqrt(var + eps), biased variance from a second pass (no E[x^2] - E[x]^2 cancellation)

struct nm_ln_args {
    cu_rows x, y, res;
    const void *w, *b; /* each NULL when absent */
    int32_t wdt, bdt, rmode;
    float eps;
    int64_t n, rows;
};

template <bool WARP>
__global__ void nm_ln_kernel(const nm_ln_args a)
{
    __shared__ float scratch[32];
    cu_pdl_trigger();
    cu_pdl_wait();
    const nm_team<WARP> tm;
    for (int64_t row = tm.row0; row < a.rows; row += tm.rstep) {
        const float *x = nm_row(a.x, row);
        float *y = nm_row(a.y, row);
        float *res = a.rmode != BERTH_RESID_NONE ? nm_row(a.res, row) : nullptr;
        const float *src = a.rmode == BERTH_RESID_ADD_BEFORE ? res : x;
        float sum = 0.0f;
        for (int64_t i = tm.lane; i < a.n; i += tm.width) {
            float v = x[i];
            if (a.rmode == BERTH_RESID_ADD_BEFORE) {
                v = res[i] + v;
                res[i] = v;
            }
            sum += v;
        }
        const float mean = tm.sum(sum, scratch) / (float)a.n;
        float var = 0.0f;
        for (int64_t i = tm.lane; i < a.n; i += tm.width) {
            const float d = src[i] - mean;
            var = fmaf(d, d, var);
        }
        var = tm.sum(var, scratch);
        const float inv = 1.0f / sqrtf(var / (float)a.n + a.eps);
        for (int64_t i = tm.lane; i < a.n; i += tm.width) {
            float v = (src[i] - mean) * inv;
            if (a.w)
                v *= cu_ld(a.w, a.wdt, i);
            if (a.b)
                v += cu_ld(a.b, a.bdt, i);
            y[i] = a.rmode == BERTH_RESID_ADD_AFTER ? res[i] + v : v;
        }
    }
}

bool cu_check_layer_norm(const berth_backend *be, struct opck *c, const berth_layer_norm_params *p)
{
    (void)be;
    return opck_layer_norm(c, p);
}

berth_status cu_op_layer_norm(berth_backend *be, berth_stream *s, const berth_layer_norm_params *p)
{
    CU_OP_BEGIN(be, layer_norm, p);
    const int64_t n = p->x.ne[0], rows = cu_nrows(&p->x);
    if (n == 0 || rows == 0)
        return BERTH_OK;
    nm_ln_args a;
    a.x = cu_rows_of(&p->x);
    a.y = cu_rows_of(&p->y);
    a.rmode = p->resid_mode;
    a.res = a.rmode != BERTH_RESID_NONE ? cu_rows_of(&p->residual) : a.x;
    a.w = p->w.buf ? cu_ptr(&p->w) : NULL;
    a.b = p->b.buf ? cu_ptr(&p->b) : NULL;
    a.wdt = p->w.dtype;
    a.bdt = p->b.dtype;
    a.eps = p->eps;
    a.n = n;
    a.rows = rows;
    const nm_launch l = nm_shape(n, rows);
    const cudaError_t e = l.warp ? cu_launch(be, s->cs, dim3(l.grid), dim3(l.threads), 0, nm_ln_kernel<true>, a)
                                 : cu_launch(be, s->cs, dim3(l.grid), dim3(l.threads), 0, nm_ln_kernel<false>, a);
    return cu_check(be, e, "layer_norm kernel");
}

// ---------------------------------------------------------------------------------------------------------------
// gated_rms_norm: y = rmsnorm(x) * w * f(z)

struct nm_gated_args {
    cu_rows x, z, y;
    const void *w;
    int32_t wdt, act;
    float eps;
    int64_t n, rows;
};

template <bool WARP>
__global__ void nm_gated_kernel(const nm_gated_args a)
{
    __shared__ float scratch[32];
    cu_pdl_trigger();
    cu_pdl_wait();
    const nm_team<WARP> tm;
    for (int64_t row = tm.row0; row < a.rows; row += tm.rstep) {
        const float *x = nm_row(a.x, row);
        const float *z = nm_row(a.z, row);
        float *y = nm_row(a.y, row);
        float ss = 0.0f;
        for (int64_t i = tm.lane; i < a.n; i += tm.width)
            ss = fmaf(x[i], x[i], ss);
        ss = tm.sum(ss, scratch);
        const float inv = 1.0f / sqrtf(ss / (float)a.n + a.eps);
        for (int64_t i = tm.lane; i < a.n; i += tm.width)
            y[i] = x[i] * inv * cu_ld(a.w, a.wdt, i) * cu_act(a.act, z[i]);
    }
}

bool cu_check_gated_rms_norm(const berth_backend *be, struct opck *c, const berth_gated_rms_norm_params *p)
{
    (void)be;
    return opck_gated_rms_norm(c, p);
}

berth_status cu_op_gated_rms_norm(berth_backend *be, berth_stream *s, const berth_gated_rms_norm_params *p)
{
    CU_OP_BEGIN(be, gated_rms_norm, p);
    const int64_t n = p->x.ne[0], rows = cu_nrows(&p->x);
    if (n == 0 || rows == 0)
        return BERTH_OK;
    nm_gated_args a;
    a.x = cu_rows_of(&p->x);
    a.z = cu_rows_of(&p->z);
    a.y = cu_rows_of(&p->y);
    a.w = cu_ptr(&p->w);
    a.wdt = p->w.dtype;
    a.act = p->act;
    a.eps = p->eps;
    a.n = n;
    a.rows = rows;
    const nm_launch l = nm_shape(n, rows);
    const cudaError_t e = l.warp ? cu_launch(be, s->cs, dim3(l.grid), dim3(l.threads), 0, nm_gated_kernel<true>, a)
                                 : cu_launch(be, s->cs, dim3(l.grid), dim3(l.threads), 0, nm_gated_kernel<false>, a);
    return cu_check(be, e, "gated_rms_norm kernel");
}

/* berth_matmul_params.x_pre / y_norm: the norm before the product, the product, then rms_norm on its finished y.
 * The batch-1 GEMV computes x_pre in its prologue where cu_xpre_plan allows (gemv_xpre.cuh), and finishes y_norm
 * in its last block where cu_ynorm_plan allows (gemv_norm.cuh); otherwise the norms are launched before / after the
 * product, and stream order makes every row complete. The matmul's check covers both norms' parameters
 * (opck_matmul checks them as rms_norms); a failing step enqueues nothing after it. */
static berth_status matmul_one(berth_backend *be, berth_stream *s, const berth_matmul_params *p);

/* The matmul member of the op table. A pair of products (y_then, ABI 0.6) is checked whole first, then runs as
 * matmul_pair.cu's one kernel where it fits, else as the two products in turn. */
berth_status cu_op_matmul_then_norm(berth_backend *be, berth_stream *s, const berth_matmul_params *p)
{
    const berth_matmul_params *q = p ? opck_matmul_y_then(p) : NULL;
    if (!q)
        return matmul_one(be, s, p);
    CU_OP_BEGIN(be, matmul, p);
    bool done = false;
    berth_status st = cu_matmul_pair(be, s, p, &done);
    if (st != BERTH_OK || done)
        return st;
    berth_matmul_params first = *p;
    first.y_then = NULL;
    st = matmul_one(be, s, &first);
    if (st != BERTH_OK)
        return st;
    /* the second product is the next op for the x shadow (cu_xshadow_match): it may use the first one's shadow of
     * its x, never an older one of the same buffer that the first product has just rewritten */
    if (s)
        s->op_seq++;
    return matmul_one(be, s, q);
}

static berth_status matmul_one(berth_backend *be, berth_stream *s, const berth_matmul_params *p)
{
    const berth_rms_norm_params *xn = p ? opck_matmul_x_pre(p) : NULL;
    const berth_rms_norm_params *yn = p ? opck_matmul_y_norm(p) : NULL;
    if (xn) /* the whole op is checked before the norm is enqueued (cu_matmul_run checks it again) */
        CU_OP_BEGIN(be, matmul, p);
    const bool skip = (be->skip & CU_SKIP_YNORM) != 0; /* the ablation switch covers post-norms either side */
    cu_xpre xp;
    const bool fuse = xn && !skip && cu_xpre_plan(be, p, &xp);
    bool done = false;
    /* not fused into the batch-1 GEMV: cu_matmul_run launches the norm first, or as the pass that packs x for
     * cuBLAS (its rounded copy of the product's input) */
    const berth_status st =
        cu_matmul_run(be, s, p, yn ? &done : NULL, fuse ? &xp : NULL, xn && !fuse && !skip ? xn : NULL);
    if (yn && s)
        s->xsh.seq = 0; /* y is normalised after the product: the shadow of the raw product is no copy of it */
    if (yn && skip)
        return st;
    return st == BERTH_OK && yn && !done ? cu_op_rms_norm(be, s, yn) : st;
}

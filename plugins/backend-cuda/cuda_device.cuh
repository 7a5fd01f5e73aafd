/*
 * cuda_device.cuh — device-side helpers shared by the CUDA backend's kernels: dtype loads/stores, the streamed
 * 16-byte weight load of the GEMV kernels, warp and block reductions, and the activation functions of
 * berth/backend.h (fp32, same formulas as the CPU backend).
 */
#ifndef BERTH_CUDA_DEVICE_CUH
#define BERTH_CUDA_DEVICE_CUH

#include <berth/backend.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

/* Element i of an array of dtype dt (f32, bf16, f16), widened to float exactly. */
__device__ __forceinline__ float cu_ld(const void *p, int dt, int64_t i)
{
    switch (dt) {
    case BERTH_DTYPE_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case BERTH_DTYPE_F16: return __half2float(((const __half *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

/* 16 bytes of weights, streamed past L1 (not kept there: x lives there). A coherent load, not ld.global.nc: with
 * programmatic dependent launch a grid can be running while the previous kernel still writes, and .nc only allows
 * data that is read-only for the grid's whole lifetime. volatile: the asm names no memory operand, so without it
 * the compiler could move the load across cu_pdl_wait(). */
__device__ __forceinline__ uint4 cu_ld_stream16(const void *p)
{
    uint4 v;
    asm volatile("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* Store v as dtype dt (round to nearest even for bf16/f16). */
__device__ __forceinline__ void cu_st(void *p, int dt, int64_t i, float v)
{
    switch (dt) {
    case BERTH_DTYPE_BF16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v); break;
    case BERTH_DTYPE_F16: ((__half *)p)[i] = __float2half_rn(v); break;
    default: ((float *)p)[i] = v; break;
    }
}

/* sincosf (same bits) as a call: its exact argument reduction is several KB of machine code, and the decode
 * kernels that rotate (kv_append, rms_norm with RoPE) would otherwise carry one inlined copy per call site and
 * unrolled element; code a kernel carries costs at every launch (bench/RESULTS.md, session 17). */
static __device__ __noinline__ float2 cu_sincos2(float x)
{
    float2 r;
    sincosf(x, &r.x, &r.y);
    return r;
}

__device__ __forceinline__ void cu_sincos(float x, float *sn, float *cs)
{
    const float2 r = cu_sincos2(x);
    *sn = r.x;
    *cs = r.y;
}

__device__ __forceinline__ float cu_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float cu_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
 * scratch: 32 floats of shared memory. Contains __syncthreads: call from all threads. */
__device__ __forceinline__ float cu_block_sum(float v, float *scratch)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = cu_warp_sum(v);
    __syncthreads(); /* scratch may still be read by a previous call */
    if (lane == 0)
        scratch[warp] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : 0.0f;
    return cu_warp_sum(v);
}

__device__ __forceinline__ float cu_block_max(float v, float *scratch)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = cu_warp_max(v);
    __syncthreads();
    if (lane == 0)
        scratch[warp] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : -INFINITY;
    return cu_warp_max(v);
}

/* GELU-tanh alone, for instances that fix the activation (gemv.cu); cu_act's case is this expression. */
__device__ __forceinline__ float cu_gelu_tanh(float x)
{
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

/* BERTH_ACT_* in fp32, the formulas of berth/backend.h (precise libm-equivalent functions, no fast-math). */
__device__ __forceinline__ float cu_act(int act, float x)
{
    switch (act) {
    case BERTH_ACT_GELU_TANH: return cu_gelu_tanh(x);
    case BERTH_ACT_GELU_ERF: return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
    case BERTH_ACT_SILU: return x / (1.0f + expf(-x));
    case BERTH_ACT_RELU: return x > 0.0f ? x : 0.0f;
    case BERTH_ACT_SIGMOID: return 1.0f / (1.0f + expf(-x));
    case BERTH_ACT_TANH: return tanhf(x);
    case BERTH_ACT_SOFTPLUS: return (x > 0.0f ? x : 0.0f) + log1pf(expf(-fabsf(x)));
    case BERTH_ACT_EXP: return expf(x);
    default: return x;
    }
}

#endif

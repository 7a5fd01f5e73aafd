/*
 * attention_decode_util.cuh — device helpers of the two fp32 (SIMT) decode attention kernels, attention.cu's
 * split kernel and attention_decode.cu's cluster kernel: a lane's K/V slice copied by cp.async and widened, the
 * warp reduce-scatter of per-head dot products, head broadcasts from shared memory; and the score (attention.cu's
 * prefill kernels use it too).
 */
#ifndef BERTH_CUDA_ATTENTION_DECODE_UTIL_CUH
#define BERTH_CUDA_ATTENTION_DECODE_UTIL_CUH

#include <berth/backend.h>
#include <cuda_fp16.h>
#include <stdint.h>

/* cp.async of PB (8 or 16) bytes, global -> shared; .cg (L2 only) for 16 bytes: K/V are streamed once. */
template <int PB>
__device__ __forceinline__ void cu_dec_cp(uint32_t dst, const void *src)
{
    if constexpr (PB == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(dst), "l"(src), "n"(PB) : "memory");
}

/* Commit / wait for this thread's copy groups (with a memory clobber, unlike cuda_mma.cuh's: the decode kernels
 * read the copied slots with ordinary loads right after the wait). */
__device__ __forceinline__ void cu_dec_cp_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/* Wait until at most N of this thread's most recent copy groups are still pending. */
template <int N>
__device__ __forceinline__ void cu_dec_cp_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Two packed 16-bit K/V elements (low half first) widened to fp32 exactly. */
template <int DT>
__device__ __forceinline__ void cu_dec_widen2(uint32_t w, float *f)
{
    if constexpr (DT == BERTH_DTYPE_BF16) {
        f[0] = __uint_as_float(w << 16);
        f[1] = __uint_as_float(w & 0xffff0000u);
    } else {
        f[0] = __half2float(__ushort_as_half((unsigned short)(w & 0xffffu)));
        f[1] = __half2float(__ushort_as_half((unsigned short)(w >> 16)));
    }
}

/* c ? x : y as one selp: written as a plain ?: on array elements, the compiler may turn it into a select of
 * addresses and move the array to local memory. */
__device__ __forceinline__ float cu_dec_sel(bool c, float x, float y)
{
    float r;
    asm("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %3, 0;\n\tselp.f32 %0, %1, %2, p;\n\t}\n"
        : "=f"(r)
        : "f"(x), "f"(y), "r"((int)c));
    return r;
}

/* Sum v[0..NR) over the warp; afterwards v[0] of lane L holds the sum of value r = L >> (5 - log2 NR) (every lane
 * of that group of 32 / NR lanes). Step STEP halves the values a lane carries: lanes with bit 16 >> STEP set keep
 * the upper half, the others the lower. (One template per step, so that every loop has a constant trip count and
 * fully unrolls.) */
template <int NR, int STEP = 0>
__device__ __forceinline__ void cu_dec_reduce_scatter(float v[NR], int lane)
{
    if constexpr ((NR >> STEP) > 1) {
        constexpr int o = 16 >> STEP, half = NR >> (STEP + 1);
        const bool up = (lane & o) != 0;
#pragma unroll
        for (int i = 0; i < half; i++) {
            const float send = cu_dec_sel(up, v[i], v[i + half]);
            const float keep = cu_dec_sel(up, v[i + half], v[i]);
            v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
        }
        cu_dec_reduce_scatter<NR, STEP + 1>(v, lane);
    } else {
#pragma unroll
        for (int o = 16 >> STEP; o > 0; o >>= 1)
            v[0] += __shfl_xor_sync(0xffffffffu, v[0], o);
    }
}

/* v[0..NR) = src[0..NR) from shared memory (16-byte loads when NR is a multiple of 4; every lane reads the same
 * addresses: broadcasts). */
template <int NR>
__device__ __forceinline__ void cu_dec_ld_heads(const float *src, float v[NR])
{
    if constexpr (NR % 4 == 0) {
#pragma unroll
        for (int r = 0; r < NR; r += 4) {
            const float4 x = *(const float4 *)(src + r);
            v[r] = x.x, v[r + 1] = x.y, v[r + 2] = x.z, v[r + 3] = x.w;
        }
    } else {
#pragma unroll
        for (int r = 0; r < NR; r++)
            v[r] = src[r];
    }
}

/* The score of a dot product: scale, then softcap (berth/backend.h order, the CPU's expression). A: any kernel
 * argument struct with scale and softcap. */
template <typename A>
__device__ __forceinline__ float cu_attn_score(const A &a, float dot)
{
    float sc = a.scale * dot;
    if (a.softcap > 0.0f)
        sc = a.softcap * tanhf(sc / a.softcap);
    return sc;
}

#endif

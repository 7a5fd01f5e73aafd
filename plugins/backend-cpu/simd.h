/*
 * simd.h — small vectorised reductions (dot products, sums of squares, axpy) over f32 rows, with the second
 * operand optionally bf16/f16 (KV cache, norm weights). Written with GCC vector extensions of 16 lanes: the
 * compiler lowers them to the vectors of whatever ISA the calling function is compiled for (functions marked
 * CPU_MULTIVERSION get an AVX-512, an AVX2 and a baseline clone picked at load time). Summation order is
 * fixed (16 lane partial sums, then the lanes in order, then the tail), so results never depend on how work
 * is split over threads.
 */
#ifndef CPU_SIMD_H
#define CPU_SIMD_H

#include <stdint.h>
#include <string.h>

#include "convert.h"

#if defined(__x86_64__) && !defined(__clang__)
#define CPU_MULTIVERSION __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CPU_MULTIVERSION
#endif

/* The helpers below are always inlined, so passing 64-byte vectors by value never crosses a real call. */
#pragma GCC diagnostic ignored "-Wpsabi"

#define CPU_VL 16
typedef float cpu_vf __attribute__((vector_size(CPU_VL * 4)));
typedef uint32_t cpu_vu __attribute__((vector_size(CPU_VL * 4)));
typedef uint16_t cpu_vh __attribute__((vector_size(CPU_VL * 2)));

#define CPU_INLINE static inline __attribute__((always_inline))

CPU_INLINE cpu_vf cpu_vld(const float *p)
{
    cpu_vf v;
    memcpy(&v, p, sizeof v);
    return v;
}
CPU_INLINE void cpu_vst(float *p, cpu_vf v)
{
    memcpy(p, &v, sizeof v);
}
/* 16 elements of dtype dt (F32/BF16/F16) at p as f32. */
CPU_INLINE cpu_vf cpu_vld_dt(const void *p, berth_dtype dt)
{
    if (dt == BERTH_DTYPE_F32)
        return cpu_vld(p);
    cpu_vh h;
    memcpy(&h, p, sizeof h);
    const cpu_vu u = __builtin_convertvector(h, cpu_vu);
    cpu_vu bits;
    if (dt == BERTH_DTYPE_BF16) {
        bits = u << 16;
    } else {
        const cpu_vu em = u & 0x7fffu;
        const cpu_vf m = (cpu_vf)(em << 13) * 0x1p112f;
        bits = ((u & 0x8000u) << 16) | (cpu_vu)m | ((cpu_vu)(em >= 0x7c00u) & 0x7f800000u);
    }
    cpu_vf v;
    memcpy(&v, &bits, sizeof v);
    return v;
}
CPU_INLINE float cpu_vsum(cpu_vf v)
{
    float s = 0.0f;
    for (int l = 0; l < CPU_VL; l++)
        s += v[l];
    return s;
}

/* sum a[i] * b[i], b of dtype bdt. */
CPU_INLINE float cpu_dot(const float *a, const void *b, berth_dtype bdt, int64_t n)
{
    const size_t es = bdt == BERTH_DTYPE_F32 ? 4 : 2;
    cpu_vf acc = {0};
    int64_t i = 0;
    for (; i + CPU_VL <= n; i += CPU_VL)
        acc += cpu_vld(a + i) * cpu_vld_dt((const char *)b + i * es, bdt);
    float s = cpu_vsum(acc);
    for (; i < n; i++)
        s += a[i] * cpu_load(b, bdt, i);
    return s;
}

/* y[i] += alpha * x[i], x of dtype xdt. */
CPU_INLINE void cpu_axpy(float *y, float alpha, const void *x, berth_dtype xdt, int64_t n)
{
    const size_t es = xdt == BERTH_DTYPE_F32 ? 4 : 2;
    int64_t i = 0;
    for (; i + CPU_VL <= n; i += CPU_VL)
        cpu_vst(y + i, cpu_vld(y + i) + alpha * cpu_vld_dt((const char *)x + i * es, xdt));
    for (; i < n; i++)
        y[i] += alpha * cpu_load(x, xdt, i);
}

/* sum x[i]^2 */
CPU_INLINE float cpu_sumsq(const float *x, int64_t n)
{
    return cpu_dot(x, x, BERTH_DTYPE_F32, n);
}

typedef int32_t cpu_vi __attribute__((vector_size(CPU_VL * 4)));

/* Lanes of a where the comparison mask m is set (all ones), else b. */
CPU_INLINE cpu_vf cpu_vsel(cpu_vi m, cpu_vf a, cpu_vf b)
{
    return (cpu_vf)(((cpu_vi)a & m) | ((cpu_vi)b & ~m));
}

/* e^x per lane, within ~2 ulp of expf for x in [-87, 88] (clamped there: e^-87 ~ 1.6e-38 stands in for 0 and
 * e^88 ~ 1.7e38 for overflow, so callers' 1/(1 + e^x) forms stay finite). x = n ln2 + r with |r| <= ln2/2,
 * e^r by its degree-7 Taylor polynomial (truncation < 1e-8 relative), times 2^n built in the exponent bits. */
CPU_INLINE cpu_vf cpu_vexp(cpu_vf x)
{
    x = cpu_vsel(x > 88.0f, (cpu_vf){0} + 88.0f, x);
    x = cpu_vsel(x < -87.0f, (cpu_vf){0} - 87.0f, x);
    const cpu_vf n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    const cpu_vf r = (x - n * 0.693145751953125f) - n * 1.42860682030941723e-6f; /* ln2 split hi + lo */
    cpu_vf e = 1.0f / 5040 + r * (1.0f / 40320);
    e = 1.0f / 720 + r * e;
    e = 1.0f / 120 + r * e;
    e = 1.0f / 24 + r * e;
    e = 1.0f / 6 + r * e;
    e = 0.5f + r * e;
    e = 1.0f + r * e;
    e = 1.0f + r * e;
    const cpu_vi bits = (__builtin_convertvector(n, cpu_vi) + 127) << 23;
    return e * (cpu_vf)bits;
}

/* tanh per lane within a few ulp: the odd Taylor series for |x| < 0.25 (where 1 - 2/(e^2x + 1) would lose
 * digits), else sign(x) (1 - 2/(e^2|x| + 1)). */
CPU_INLINE cpu_vf cpu_vtanh(cpu_vf x)
{
    const cpu_vi sign = (cpu_vi)x & (int32_t)0x80000000u;
    const cpu_vf a = (cpu_vf)((cpu_vi)x & 0x7fffffff);
    const cpu_vf big = 1.0f - 2.0f / (cpu_vexp(2.0f * a) + 1.0f);
    const cpu_vf z = a * a;
    cpu_vf s = -1382.0f / 155925 + z * (21844.0f / 6081075);
    s = 62.0f / 2835 + z * s;
    s = -17.0f / 315 + z * s;
    s = 2.0f / 15 + z * s;
    s = -1.0f / 3 + z * s;
    const cpu_vf small = a + a * z * s;
    return (cpu_vf)((cpu_vi)cpu_vsel(a < 0.25f, small, big) | sign);
}

#endif

/*
 * convert.h — scalar bf16/f16 <-> f32 conversions and dtype-generic element loads/stores.
 *
 * Narrowing rounds to nearest even and keeps NaN a (quiet) NaN; widening is exact. The f16 decode is
 * branch-free so loops using it still vectorise. Requires the default FP environment (no flush-to-zero),
 * which the plugin never changes.
 */
#ifndef CPU_CONVERT_H
#define CPU_CONVERT_H

#include <berth/plugin.h>
#include <stdint.h>
#include <string.h>

static inline float cpu_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline uint32_t cpu_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float cpu_bf16_to_f32(uint16_t h)
{
    return cpu_bits_f32((uint32_t)h << 16);
}

static inline uint16_t cpu_f32_to_bf16(float f)
{
    uint32_t u = cpu_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u); /* NaN: keep sign and top payload, force quiet */
    u += 0x7fffu + ((u >> 16) & 1u);          /* round half to even; overflow carries into inf correctly */
    return (uint16_t)(u >> 16);
}

/* f16 -> f32: place exponent+mantissa in an f32 and rescale by 2^112 (127 - 15), which also turns f16
 * subnormals (as f32 subnormals) into the right normal values; exponent 31 (inf/NaN) is forced to 255. */
static inline float cpu_f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t em = h & 0x7fffu;
    const uint32_t mag = cpu_f32_bits(cpu_bits_f32(em << 13) * 0x1p112f);
    const uint32_t special = em >= 0x7c00u ? 0x7f800000u : 0u;
    return cpu_bits_f32(sign | mag | special);
}

static inline uint16_t cpu_f32_to_f16(float f)
{
    uint32_t u = cpu_f32_bits(f);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    u &= 0x7fffffffu;
    if (u > 0x7f800000u)
        return sign | 0x7e00u; /* NaN */
    if (u >= 0x477ff000u)      /* >= 65520 (halfway above 65504, ties to even = 65536): inf */
        return sign | 0x7c00u;
    if (u < 0x38800000u) {
        /* below 2^-14: f16 subnormal (or 0). Adding 0.5 puts the value where the f32 ulp is 2^-24, the f16
         * subnormal step, so the FPU's round-to-nearest-even does the rounding; the difference of the bit
         * patterns is the f16 mantissa (0x400 = smallest normal when it rounds up). */
        const float a = cpu_bits_f32(u) + 0.5f;
        return sign | (uint16_t)(cpu_f32_bits(a) - 0x3f000000u);
    }
    /* normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits half to even */
    u += 0xc8000fffu + ((u >> 13) & 1u);
    return sign | (uint16_t)(u >> 13);
}

/* Element i of a row of dtype dt (F32, BF16 or F16) as f32. */
static inline float cpu_load(const void *row, berth_dtype dt, int64_t i)
{
    switch (dt) {
    case BERTH_DTYPE_BF16: return cpu_bf16_to_f32(((const uint16_t *)row)[i]);
    case BERTH_DTYPE_F16: return cpu_f16_to_f32(((const uint16_t *)row)[i]);
    default: return ((const float *)row)[i];
    }
}

static inline void cpu_store(void *row, berth_dtype dt, int64_t i, float v)
{
    switch (dt) {
    case BERTH_DTYPE_BF16: ((uint16_t *)row)[i] = cpu_f32_to_bf16(v); break;
    case BERTH_DTYPE_F16: ((uint16_t *)row)[i] = cpu_f32_to_f16(v); break;
    default: ((float *)row)[i] = v; break;
    }
}

/* n elements of dtype dt -> f32 (dst must not overlap src unless dt is F32 and they are equal). */
static inline void cpu_load_row(float *dst, const void *src, berth_dtype dt, int64_t n)
{
    if (dt == BERTH_DTYPE_BF16) {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = cpu_bf16_to_f32(s[i]);
    } else if (dt == BERTH_DTYPE_F16) {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = cpu_f16_to_f32(s[i]);
    } else if (dst != src) {
        memmove(dst, src, (size_t)n * sizeof(float));
    }
}

/* n f32 -> dtype dt. */
static inline void cpu_store_row(void *dst, berth_dtype dt, const float *src, int64_t n)
{
    if (dt == BERTH_DTYPE_BF16) {
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++)
            d[i] = cpu_f32_to_bf16(src[i]);
    } else if (dt == BERTH_DTYPE_F16) {
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++)
            d[i] = cpu_f32_to_f16(src[i]);
    } else if (dst != src) {
        memmove(dst, src, (size_t)n * sizeof(float));
    }
}

#endif

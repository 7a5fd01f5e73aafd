/*
 * gemma4_rope.c — inverse frequencies for Gemma 4 RoPE.
 *
 * transformers computes inv_freq = 1 / base ** (arange(0, d, 2).float() / d) in fp32: the exponent 2j/d is an
 * fp32 division, the power is an fp32 pow of the fp32-rounded base, and the reciprocal is fp32. The proportional
 * variant keeps the first n = floor(prf * d / 2) of those (exponent over the FULL d), divides them by factor and
 * zeroes the rest; HALF-mode rotation pairs dim j with j + d/2.
 */
#include "gemma4_rope.h"

#include <math.h>

int g4_rope_pairs(const struct g4_rope *ro, int d)
{
    if (!ro->proportional)
        return d / 2;
    /* Python: int((prf * d) // 2) */
    int n = (int)floor(ro->partial_rotary_factor * (double)d / 2.0);
    return n < 0 ? 0 : n > d / 2 ? d / 2 : n;
}

int g4_rope_freqs(const struct g4_rope *ro, int d, float *freqs)
{
    const int n = g4_rope_pairs(ro, d);
    const float base = (float)ro->theta;
    const float factor = (float)ro->factor;
    for (int j = 0; j < n; j++) {
        float expo = (float)(2 * j) / (float)d;
        float inv = 1.0f / powf(base, expo);
        freqs[j] = ro->proportional ? inv / factor : inv;
    }
    return n;
}

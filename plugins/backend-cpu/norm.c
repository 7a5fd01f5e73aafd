/*
 * norm.c — normalisations over ne[0] of each row, fp32: rms_norm and layer_norm (weight and residual modes)
 * and gated_rms_norm (Qwen3.5 GDN output norm). Parallel over rows. rms_norm's RoPE and out_scale run the same
 * row code as rms_norm followed by the rope op (and a scale), so the fused op matches the sequence bit for bit;
 * the second output (y2) is rms_norm's row routine run again on the finished row.
 */
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "cpu_backend.h"
#include "simd.h"

void cpu_rms_norm_row(float *v, int64_t n, float eps, int32_t weight_mode, const void *w, berth_dtype wdt)
{
    const float inv = 1.0f / sqrtf(cpu_sumsq(v, n) / (float)n + eps);
    if (weight_mode == BERTH_NORM_W)
        for (int64_t i = 0; i < n; i++)
            v[i] = v[i] * inv * cpu_load(w, wdt, i);
    else if (weight_mode == BERTH_NORM_W_ONE_PLUS)
        for (int64_t i = 0; i < n; i++)
            v[i] = v[i] * inv * (1.0f + cpu_load(w, wdt, i));
    else
        for (int64_t i = 0; i < n; i++)
            v[i] *= inv;
}

/* ---------------------------------------------------------------------------------------------------------
 * rms_norm */

/* Row r of y: the weight and residual modes (no rotation, no scale). */
static void rms_norm_row(const berth_rms_norm_params *p, const void *w, int64_t r)
{
    const int64_t n = p->x.ne[0];
    const float *x = (const float *)cpu_row(&p->x, r);
    float *y = (float *)cpu_row(&p->y, r);
    float *res = p->resid_mode != BERTH_RESID_NONE ? (float *)cpu_row(&p->residual, r) : NULL;
    const float *src = x;
    if (p->resid_mode == BERTH_RESID_ADD_BEFORE) {
        for (int64_t i = 0; i < n; i++)
            res[i] += x[i];
        src = res;
    }
    const float inv = 1.0f / sqrtf(cpu_sumsq(src, n) / (float)n + p->eps);
    for (int64_t i = 0; i < n; i++) {
        float v = src[i] * inv;
        if (p->weight_mode == BERTH_NORM_W)
            v *= cpu_load(w, p->w.dtype, i);
        else if (p->weight_mode == BERTH_NORM_W_ONE_PLUS)
            v *= 1.0f + cpu_load(w, p->w.dtype, i);
        y[i] = p->resid_mode == BERTH_RESID_ADD_AFTER ? res[i] + v : v;
    }
}

/* out_scale, applied last (skipped at 1: an exact no-op). */
static void scale_row(const berth_rms_norm_params *p, int64_t r, float s)
{
    float *y = (float *)cpu_row(&p->y, r);
    for (int64_t i = 0; i < p->x.ne[0]; i++)
        y[i] *= s;
}

/* The second output: y2 = RMSNorm(y) * w2 with the row routine rms_norm itself runs on y's finished row, so the
 * pair equals rms_norm followed by an rms_norm of y bit for bit. */
static void second_row(const berth_rms_norm_params *p, const void *w2, int64_t r)
{
    const int64_t n = p->x.ne[0];
    float *y2 = (float *)cpu_row(&p->y2, r);
    memcpy(y2, cpu_row(&p->y, r), (size_t)n * sizeof(float));
    cpu_rms_norm_row(y2, n, p->eps, p->y2_weight_mode, w2, p->y2_w.dtype);
}

static void rms_norm_range(const void *arg, int64_t r0, int64_t r1)
{
    const berth_rms_norm_params *p = arg;
    const void *w = opck_norm_has_weight(p->weight_mode) ? cpu_data(&p->w) : NULL;
    const float s = opck_rms_out_scale(p);
    const bool y2 = opck_rms_has_y2(p);
    const void *w2 = y2 && opck_norm_has_weight(p->y2_weight_mode) ? cpu_data(&p->y2_w) : NULL;
    for (int64_t r = r0; r < r1; r++) {
        rms_norm_row(p, w, r);
        if (s != 1.0f)
            scale_row(p, r, s);
        if (y2)
            second_row(p, w2, r);
    }
}

/* With RoPE the work items are tokens (rows t*heads .. t*heads + heads-1): each token's heads are normalised,
 * then rotated by the rope op's own routine (cos/sin once per token), then scaled. */
static void rms_norm_rope_range(const void *arg, int64_t t0, int64_t t1)
{
    const berth_rms_norm_params *p = arg;
    const void *w = opck_norm_has_weight(p->weight_mode) ? cpu_data(&p->w) : NULL;
    const float s = opck_rms_out_scale(p);
    const int64_t H = p->x.ne[1];
    const float *freqs = (const float *)cpu_data(&p->rope_freqs);
    for (int64_t t = t0; t < t1; t++) {
        for (int64_t h = 0; h < H; h++)
            rms_norm_row(p, w, t * H + h);
        cpu_rope_token(cpu_row(&p->y, t * H), p->y.nb[1], H, p->rope_mode, p->rope_pair_offset, p->rope_n_pairs,
                       (float)cpu_i32_at(&p->rope_positions, t), freqs);
        for (int64_t h = 0; s != 1.0f && h < H; h++)
            scale_row(p, t * H + h, s);
    }
}

berth_status cpu_op_rms_norm(berth_backend *be, berth_stream *s, const berth_rms_norm_params *p)
{
    CPU_OP_BEGIN(be, rms_norm, p);
    const int32_t pairs = opck_rms_rope_pairs(p);
    if (pairs > 0 && p->x.ne[1] > 0)
        cpu_parallel_for(be, cpu_nrows(&p->x) / p->x.ne[1],
                         (2.0 * (double)p->x.ne[0] + 2.0) * (double)p->x.ne[1] + 40.0 * pairs, rms_norm_rope_range, p);
    else if (pairs == 0)
        cpu_parallel_for(be, cpu_nrows(&p->x), (opck_rms_has_y2(p) ? 4.0 : 2.0) * (double)p->x.ne[0], rms_norm_range, p);
    CPU_OP_END(be);
    return BERTH_OK;
}

/* ---------------------------------------------------------------------------------------------------------
 * layer_norm */

static void layer_norm_range(const void *arg, int64_t r0, int64_t r1)
{
    const berth_layer_norm_params *p = arg;
    const int64_t n = p->x.ne[0];
    const void *w = p->w.buf ? cpu_data(&p->w) : NULL;
    const void *b = p->b.buf ? cpu_data(&p->b) : NULL;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = (const float *)cpu_row(&p->x, r);
        float *y = (float *)cpu_row(&p->y, r);
        float *res = p->resid_mode != BERTH_RESID_NONE ? (float *)cpu_row(&p->residual, r) : NULL;
        const float *src = x;
        if (p->resid_mode == BERTH_RESID_ADD_BEFORE) {
            for (int64_t i = 0; i < n; i++)
                res[i] += x[i];
            src = res;
        }
        float sum = 0.0f;
        for (int64_t i = 0; i < n; i++)
            sum += src[i];
        const float mean = sum / (float)n;
        float var = 0.0f; /* second pass: no cancellation from E[x^2] - E[x]^2 */
        for (int64_t i = 0; i < n; i++)
            var += (src[i] - mean) * (src[i] - mean);
        const float inv = 1.0f / sqrtf(var / (float)n + p->eps);
        for (int64_t i = 0; i < n; i++) {
            float v = (src[i] - mean) * inv;
            if (w)
                v *= cpu_load(w, p->w.dtype, i);
            if (b)
                v += cpu_load(b, p->b.dtype, i);
            y[i] = p->resid_mode == BERTH_RESID_ADD_AFTER ? res[i] + v : v;
        }
    }
}

berth_status cpu_op_layer_norm(berth_backend *be, berth_stream *s, const berth_layer_norm_params *p)
{
    CPU_OP_BEGIN(be, layer_norm, p);
    cpu_parallel_for(be, cpu_nrows(&p->x), 3.0 * (double)p->x.ne[0], layer_norm_range, p);
    CPU_OP_END(be);
    return BERTH_OK;
}

/* ---------------------------------------------------------------------------------------------------------
 * gated_rms_norm: y = rmsnorm(x) * w * f(z) */

static void gated_rms_norm_range(const void *arg, int64_t r0, int64_t r1)
{
    const berth_gated_rms_norm_params *p = arg;
    const int64_t n = p->x.ne[0];
    const void *w = cpu_data(&p->w);
    for (int64_t r = r0; r < r1; r++) {
        const float *x = (const float *)cpu_row(&p->x, r);
        const float *z = (const float *)cpu_row(&p->z, r);
        float *y = (float *)cpu_row(&p->y, r);
        const float inv = 1.0f / sqrtf(cpu_sumsq(x, n) / (float)n + p->eps);
        for (int64_t i = 0; i < n; i++)
            y[i] = x[i] * inv * cpu_load(w, p->w.dtype, i) * cpu_act(p->act, z[i]);
    }
}

berth_status cpu_op_gated_rms_norm(berth_backend *be, berth_stream *s, const berth_gated_rms_norm_params *p)
{
    CPU_OP_BEGIN(be, gated_rms_norm, p);
    cpu_parallel_for(be, cpu_nrows(&p->x), 8.0 * (double)p->x.ne[0], gated_rms_norm_range, p);
    CPU_OP_END(be);
    return BERTH_OK;
}

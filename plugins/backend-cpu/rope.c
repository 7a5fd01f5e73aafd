/*
 * rope.c — rotary position embedding (HALF / NeoX and INTERLEAVED / GPT-J pairings, partial: only n_pairs
 * pairs rotate). The angle is the fp32 product position * freq; cos and sin are computed once per (token,
 * pair) and shared by every head. Also used by kv_append to rotate K before it is stored.
 */
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "cpu_backend.h"

void cpu_rope_apply(float *v, int32_t mode, int32_t pair_offset, int32_t n_pairs, const float *cs, const float *sn)
{
    const int64_t stride = mode == BERTH_ROPE_HALF ? 1 : 2;
    const int64_t off = mode == BERTH_ROPE_HALF ? pair_offset : 1;
    for (int32_t j = 0; j < n_pairs; j++) {
        float *a = v + j * stride, *b = a + off;
        const float x0 = *a, x1 = *b;
        *a = x0 * cs[j] - x1 * sn[j];
        *b = x1 * cs[j] + x0 * sn[j];
    }
}

#define ROPE_CHUNK 64 /* pairs whose cos/sin are computed at once (stack arrays) */

void cpu_rope_token(char *y0, int64_t head_stride, int64_t heads, int32_t mode, int32_t pair_offset,
                    int32_t n_pairs, float pos, const float *freqs)
{
    for (int32_t j0 = 0; j0 < n_pairs; j0 += ROPE_CHUNK) {
        float cs[ROPE_CHUNK], sn[ROPE_CHUNK];
        const int32_t nj = n_pairs - j0 < ROPE_CHUNK ? n_pairs - j0 : ROPE_CHUNK;
        for (int32_t j = 0; j < nj; j++) {
            const float a = pos * freqs[j0 + j];
            cs[j] = cosf(a);
            sn[j] = sinf(a);
        }
        const int64_t first = mode == BERTH_ROPE_HALF ? j0 : 2 * (int64_t)j0;
        for (int64_t h = 0; h < heads; h++)
            cpu_rope_apply((float *)(y0 + h * head_stride) + first, mode, pair_offset, nj, cs, sn);
    }
}

static void rope_range(const void *arg, int64_t t0, int64_t t1)
{
    const berth_rope_params *p = arg;
    const int64_t d = p->x.ne[0], H = p->x.ne[1];
    const float *freqs = p->n_pairs > 0 ? (const float *)cpu_data(&p->freqs) : NULL;
    for (int64_t t = t0; t < t1; t++) {
        for (int64_t h = 0; h < H; h++) {
            const float *x = (const float *)(cpu_data(&p->x) + h * p->x.nb[1] + t * p->x.nb[2]);
            float *y = (float *)(cpu_data(&p->y) + h * p->y.nb[1] + t * p->y.nb[2]);
            if (x != y)
                memmove(y, x, (size_t)d * sizeof *y); /* unrotated elements pass through */
        }
        cpu_rope_token(cpu_data(&p->y) + t * p->y.nb[2], p->y.nb[1], H, p->mode, p->pair_offset, p->n_pairs,
                       (float)cpu_i32_at(&p->positions, t), freqs);
    }
}

berth_status cpu_op_rope(berth_backend *be, berth_stream *s, const berth_rope_params *p)
{
    CPU_OP_BEGIN(be, rope, p);
    cpu_parallel_for(be, p->x.ne[2], 2.0 * (double)(p->x.ne[0] * p->x.ne[1]) + 40.0 * p->n_pairs, rope_range, p);
    CPU_OP_END(be);
    return BERTH_OK;
}

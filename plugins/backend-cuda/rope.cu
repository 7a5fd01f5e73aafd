/*
 * rope.cu — rotary position embedding (HALF / NeoX and INTERLEAVED / GPT-J pairings; only n_pairs pairs rotate,
 * the other elements are copied). The angle is the fp32 product (float)position * freq and its sine and cosine
 * are the precise sincosf (no __sinf: angles reach thousands of radians, where the fast intrinsics lose digits).
 *
 * Work items per (token, head): one per rotated pair (the thread reads both elements and writes both, so y may
 * alias x) and one per unrotated element (copied; skipped when y is x itself). sincosf is recomputed per head:
 * it is cheap next to a launch, and it keeps the kernel free of shared-memory tables and their size limits.
 * Launched through cu_launch (cuda_launch.cuh): the kernel triggers its successor first, then waits for its
 * predecessor before touching memory.
 */
#include "cuda_internal.h"
#include "cuda_device.cuh"
#include "cuda_launch.cuh"

struct rp_args {
    const char *x;
    char *y;
    int64_t xnb1, xnb2, ynb1, ynb2;
    const int32_t *pos;
    const float *freqs; /* NULL when n_pairs is 0 */
    int64_t d, H, T;
    int64_t items;      /* work items per (token, head) */
    int32_t mode, off, np;
};

__global__ void rp_rope_kernel(const rp_args a)
{
    cu_pdl_trigger();
    cu_pdl_wait();
    const int64_t total = a.T * a.H * a.items;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t u = idx % a.items, th = idx / a.items;
        const int64_t h = th % a.H, t = th / a.H;
        const float *x = (const float *)(a.x + h * a.xnb1 + t * a.xnb2);
        float *y = (float *)(a.y + h * a.ynb1 + t * a.ynb2);
        if (u < a.np) {
            const int64_t i0 = a.mode == BERTH_ROPE_HALF ? u : 2 * u;
            const int64_t i1 = a.mode == BERTH_ROPE_HALF ? u + a.off : 2 * u + 1;
            const float ang = (float)a.pos[t] * a.freqs[u];
            float sn, cs;
            sincosf(ang, &sn, &cs);
            const float x0 = x[i0], x1 = x[i1];
            y[i0] = x0 * cs - x1 * sn;
            y[i1] = x1 * cs + x0 * sn;
        } else { /* the q-th element outside every pair */
            const int64_t q = u - a.np;
            int64_t i;
            if (a.np == 0)
                i = q;
            else if (a.mode == BERTH_ROPE_HALF) /* [np, off) then [off + np, d) */
                i = q < a.off - a.np ? a.np + q : q + 2 * (int64_t)a.np;
            else /* [2 np, d) */
                i = 2 * (int64_t)a.np + q;
            y[i] = x[i];
        }
    }
}

bool cu_check_rope(const berth_backend *be, struct opck *c, const berth_rope_params *p)
{
    (void)be;
    return opck_rope(c, p);
}

berth_status cu_op_rope(berth_backend *be, berth_stream *s, const berth_rope_params *p)
{
    CU_OP_BEGIN(be, rope, p);
    rp_args a;
    a.x = cu_ptr(&p->x);
    a.y = cu_ptr(&p->y);
    a.xnb1 = p->x.nb[1];
    a.xnb2 = p->x.nb[2];
    a.ynb1 = p->y.nb[1];
    a.ynb2 = p->y.nb[2];
    a.pos = (const int32_t *)cu_ptr(&p->positions);
    a.freqs = p->n_pairs > 0 ? (const float *)cu_ptr(&p->freqs) : NULL;
    a.d = p->x.ne[0];
    a.H = p->x.ne[1];
    a.T = p->x.ne[2];
    a.mode = p->mode;
    a.off = p->pair_offset;
    a.np = p->n_pairs;
    /* in place (same element addresses): only the pairs change */
    const bool in_place = a.x == a.y && a.xnb1 == a.ynb1 && a.xnb2 == a.ynb2;
    a.items = in_place ? a.np : a.d - a.np;
    const int64_t total = a.T * a.H * a.items;
    if (total == 0)
        return BERTH_OK;
    int64_t blocks = (total + 255) / 256;
    if (blocks > (1 << 20))
        blocks = 1 << 20; /* the kernel loops over the rest */
    return cu_check(be, cu_launch(be, s->cs, dim3((unsigned)blocks), dim3(256), 0, rp_rope_kernel, a), "rope kernel");
}

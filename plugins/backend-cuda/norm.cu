/*
 * norm.cu — normalisations over ne[0] of each row, fp32: rms_norm and layer_norm (weight and residual modes of
 * berth/backend.h) and gated_rms_norm (Qwen3.5 GDN output norm).
 *
 * A row is handled by a team: one warp for rows of up to NM_WARP_MAX elements (8 rows per 256-thread block, no
 * shared memory, no barriers), else one block of 64..1024 threads (about 8 elements per thread at most sizes, so
 * a 16k-element row still has only 16 per thread). The sums are fp32 tree reductions; each pass re-reads the row
 * (L1/L2 hits) rather than keeping it in registers, so any row length works.
 * Aliasing: y may alias x (and, element for element, the residual). Every element is read and written by the same
 * thread in every pass (same start and stride), so no thread reads an element another one has already rewritten.
 * RESID_ADD_BEFORE writes residual[i] += x[i] in the first pass and the later passes read it back (same thread).
 */
#include "cuda_internal.h"
#include "cuda_device.cuh"

#define NM_WARP_MAX 1024 /* rows up to this many elements get a warp each */

struct nm_rows {
    char *base;
    int64_t ne1, ne2, nb1, nb2, nb3;
};

static nm_rows nm_rows_of(const berth_tensor *t)
{
    nm_rows r;
    r.base = cu_ptr(t);
    r.ne1 = t->ne[1];
    r.ne2 = t->ne[2];
    r.nb1 = t->nb[1];
    r.nb2 = t->nb[2];
    r.nb3 = t->nb[3];
    return r;
}

static __device__ __forceinline__ float *nm_row(const nm_rows &r, int64_t i)
{
    const int64_t i1 = i % r.ne1;
    i /= r.ne1;
    const int64_t i2 = i % r.ne2;
    const int64_t i3 = i / r.ne2;
    return (float *)(r.base + i1 * r.nb1 + i2 * r.nb2 + i3 * r.nb3);
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

struct nm_rms_args {
    nm_rows x, y, res; /* res only with a residual mode */
    const void *w;     /* NULL unless weight mode W / W_ONE_PLUS */
    int32_t wdt, wmode, rmode;
    float eps;
    int64_t n, rows;
};

template <bool WARP>
__global__ void nm_rms_kernel(const nm_rms_args a)
{
    __shared__ float scratch[32];
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
            y[i] = a.rmode == BERTH_RESID_ADD_AFTER ? res[i] + v : v;
        }
    }
}

bool cu_check_rms_norm(const berth_backend *be, struct opck *c, const berth_rms_norm_params *p)
{
    (void)be;
    return opck_rms_norm(c, p);
}

berth_status cu_op_rms_norm(berth_backend *be, berth_stream *s, const berth_rms_norm_params *p)
{
    CU_OP_BEGIN(be, rms_norm, p);
    const int64_t n = p->x.ne[0], rows = cu_nrows(&p->x);
    if (n == 0 || rows == 0)
        return BERTH_OK;
    nm_rms_args a;
    a.x = nm_rows_of(&p->x);
    a.y = nm_rows_of(&p->y);
    a.rmode = p->resid_mode;
    a.res = a.rmode != BERTH_RESID_NONE ? nm_rows_of(&p->residual) : a.x;
    /* W_NONE and UNIT: no weight */
    a.wmode = opck_norm_has_weight(p->weight_mode) ? p->weight_mode : BERTH_NORM_UNIT;
    a.w = opck_norm_has_weight(p->weight_mode) ? cu_ptr(&p->w) : NULL;
    a.wdt = p->w.dtype;
    a.eps = p->eps;
    a.n = n;
    a.rows = rows;
    const nm_launch l = nm_shape(n, rows);
    if (l.warp)
        nm_rms_kernel<true><<<l.grid, l.threads, 0, s->cs>>>(a);
    else
        nm_rms_kernel<false><<<l.grid, l.threads, 0, s->cs>>>(a);
    return cu_check_launch(be, "rms_norm kernel");
}

// ---------------------------------------------------------------------------------------------------------------
// layer_norm: (x - mean) / sqrt(var + eps), biased variance from a second pass (no E[x^2] - E[x]^2 cancellation)

struct nm_ln_args {
    nm_rows x, y, res;
    const void *w, *b; /* each NULL when absent */
    int32_t wdt, bdt, rmode;
    float eps;
    int64_t n, rows;
};

template <bool WARP>
__global__ void nm_ln_kernel(const nm_ln_args a)
{
    __shared__ float scratch[32];
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
    a.x = nm_rows_of(&p->x);
    a.y = nm_rows_of(&p->y);
    a.rmode = p->resid_mode;
    a.res = a.rmode != BERTH_RESID_NONE ? nm_rows_of(&p->residual) : a.x;
    a.w = p->w.buf ? cu_ptr(&p->w) : NULL;
    a.b = p->b.buf ? cu_ptr(&p->b) : NULL;
    a.wdt = p->w.dtype;
    a.bdt = p->b.dtype;
    a.eps = p->eps;
    a.n = n;
    a.rows = rows;
    const nm_launch l = nm_shape(n, rows);
    if (l.warp)
        nm_ln_kernel<true><<<l.grid, l.threads, 0, s->cs>>>(a);
    else
        nm_ln_kernel<false><<<l.grid, l.threads, 0, s->cs>>>(a);
    return cu_check_launch(be, "layer_norm kernel");
}

// ---------------------------------------------------------------------------------------------------------------
// gated_rms_norm: y = rmsnorm(x) * w * f(z)

struct nm_gated_args {
    nm_rows x, z, y;
    const void *w;
    int32_t wdt, act;
    float eps;
    int64_t n, rows;
};

template <bool WARP>
__global__ void nm_gated_kernel(const nm_gated_args a)
{
    __shared__ float scratch[32];
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
    a.x = nm_rows_of(&p->x);
    a.z = nm_rows_of(&p->z);
    a.y = nm_rows_of(&p->y);
    a.w = cu_ptr(&p->w);
    a.wdt = p->w.dtype;
    a.act = p->act;
    a.eps = p->eps;
    a.n = n;
    a.rows = rows;
    const nm_launch l = nm_shape(n, rows);
    if (l.warp)
        nm_gated_kernel<true><<<l.grid, l.threads, 0, s->cs>>>(a);
    else
        nm_gated_kernel<false><<<l.grid, l.threads, 0, s->cs>>>(a);
    return cu_check_launch(be, "gated_rms_norm kernel");
}

/*
 * elementwise.cu — ops without reductions: get_rows (embedding lookup), unary, glu, binary (with broadcast) and
 * copy (dtype conversion), fp32 arithmetic, on row-regular views with any outer strides.
 *
 * These ops are bound by memory bandwidth, so what matters is how many bytes each SM keeps in flight and how
 * little each block spends on set-up (PDL wait, row address maths). One launch policy serves them all
 * (ew_shape):
 *   - vectors: when every row of every operand starts on a multiple of 4 elements' bytes (16 B for f32, 8 B for
 *     bf16/f16), a thread moves 4 consecutive elements per load/store (the V = 4 kernels; a row's last partial
 *     vector goes element by element); otherwise the same kernels run with V = 1. Decided on the host.
 *   - packed tensors: when every operand is one dense block (rows back to back), the op is a single long row, so
 *     short rows (ne[0] = 1 per-head scalars) still get full vectors;
 *   - a block is 256 threads laid out tx x ty (tx a power of two covering the row's vectors up to 256, ty = 256 /
 *     tx rows), so short rows still fill warps; along a long row each thread takes u (1..EW_U) vectors spaced tx
 *     apart, all loaded before any is used, so up to EW_U independent loads per operand are in flight;
 *   - the grid is capped at EW_BLOCKS_PER_SM blocks per SM (all resident at once: __launch_bounds__ guarantees
 *     the registers) and the kernels loop over rows and column chunks; u shrinks for small ops (decode: one row,
 *     or a few) until the chunks give every block slot work, so they get more blocks, not longer threads, and
 *     the chunks of a row are made equal so no block column carries a longer tail;
 *   - decode-sized ops are latency-bound: u = 1 runs a kernel instance without the unrolled slots (U = 1), and
 *     every kernel does its index maths (where it starts, its first row's addresses) before cu_pdl_wait, so that
 *     it overlaps the previous kernel and the first loads issue right after the wait.
 * Each thread owns whole elements and loads all of its elements of a chunk before it stores them: reading x[i]
 * and writing y[i] in one thread is what makes y aliasing an input (unary, glu, binary, copy allow it) safe.
 * Activations are the formulas of berth/backend.h through cu_act (precise libm functions, no fast-math).
 * Launches go through cu_launch (cuda_launch.cuh): each kernel triggers its successor first, then waits for its
 * predecessor before touching memory.
 */
#include "cuda_internal.h"
#include "cuda_device.cuh"
#include "cuda_launch.cuh"

#define EW_THREADS 256
#define EW_U 4              /* most vectors per thread and chunk: independent loads in flight per operand */
#define EW_BLOCKS_PER_SM 4  /* grid cap per SM; __launch_bounds__ keeps that many resident (<= 64 registers) */

// ---------------------------------------------------------------------------------------------------------------
// Launch policy (host)

/* What every kernel here needs about its iteration space. Rows are flattened over ne[1..3] (ne[1] fastest); row
 * r splits into (i1, i2, i3) with ne1, ne2. */
struct ew_geom {
    int64_t n;        /* elements per row */
    int64_t rows;
    int64_t ne1, ne2; /* of the operands' common row shape */
    int u;            /* vectors per thread and chunk, 1..EW_U */
};

struct ew_plan {
    dim3 grid, block;
    int v; /* elements per vector: 4, or 1 */
    ew_geom g;
};

static int64_t ew_cdiv(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

/* Launch plan for rows of n elements handled V at a time (n, rows > 0). */
static ew_plan ew_shape(const berth_backend *be, int64_t n, int64_t rows, int64_t ne1, int64_t ne2, int V)
{
    const int64_t nvec = ew_cdiv(n, V);
    unsigned tx = 1;
    while (tx < EW_THREADS && (int64_t)tx < nvec)
        tx <<= 1;
    const unsigned ty = EW_THREADS / tx;
    const int64_t rgroups = ew_cdiv(rows, ty);
    const int64_t cap = (int64_t)(be->n_sms > 0 ? be->n_sms : 132) * EW_BLOCKS_PER_SM;
    int u = 1;
    if (nvec > (int64_t)tx) { /* tx = 256: long rows */
        u = EW_U;
        /* small ops (decode) get more blocks rather than more vectors per thread */
        while (u > 1 && ew_cdiv(nvec, (int64_t)tx * u) * rgroups < cap)
            u--;
        /* equal chunks: a row of 2240 vectors is 3 x 768, not 1024 + 1024 + 192 */
        u = (int)ew_cdiv(nvec, ew_cdiv(nvec, (int64_t)tx * u) * tx);
    }
    const int64_t chunks = ew_cdiv(nvec, (int64_t)tx * u);
    const int64_t gx = chunks < cap ? chunks : cap;
    int64_t gy = cap / gx;
    if (gy > rgroups)
        gy = rgroups;
    if (gy > 65535)
        gy = 65535;
    if (gy < 1)
        gy = 1;
    ew_plan p;
    p.block = dim3(tx, ty, 1);
    p.grid = dim3((unsigned)gx, (unsigned)gy, 1);
    p.g.n = n;
    p.g.rows = rows;
    p.g.ne1 = ne1;
    p.g.ne2 = ne2;
    p.v = V;
    p.g.u = u;
    return p;
}

/* Every row of t starts on a multiple of `align` bytes (the base, and the stride of each dim with more than one
 * index; a negative stride's remainder is negative, so it counts as misaligned unless it is 0). */
static bool ew_aligned(const berth_tensor *t, int64_t align)
{
    if ((uintptr_t)cu_ptr(t) % (uintptr_t)align != 0)
        return false;
    for (int d = 1; d < 4; d++)
        if (t->ne[d] > 1 && t->nb[d] % align != 0)
            return false;
    return true;
}

/* t is one dense block: each dim with more than one index follows the previous ones without a gap. */
static bool ew_packed(const berth_tensor *t)
{
    int64_t want = t->ne[0] * t->nb[0];
    for (int d = 1; d < 4; d++) {
        if (t->ne[d] > 1 && t->nb[d] != want)
            return false;
        want *= t->ne[d];
    }
    return true;
}

/* Bytes of a 4-element vector of t's dtype: the alignment a V = 4 row needs. */
static int64_t ew_vec_bytes(const berth_tensor *t)
{
    return 4 * (int64_t)opck_dtype_size(t->dtype);
}

/* t's rows may be read/written as V = 4 vectors: every row (or, packed, the one row of all t) starts on a
 * multiple of 4 elements' bytes. */
static bool ew_vec_ok(const berth_tensor *t, bool packed)
{
    const int64_t a = ew_vec_bytes(t);
    return packed ? (uintptr_t)cu_ptr(t) % (uintptr_t)a == 0 : ew_aligned(t, a);
}

/* The rows of t as one row of all its elements (ew_packed(t)): row 0 at the base, no further rows. */
static cu_rows ew_one_row(const berth_tensor *t)
{
    cu_rows r = {};
    r.base = cu_ptr(t);
    r.ne1 = 1;
    r.ne2 = 1;
    return r;
}

// ---------------------------------------------------------------------------------------------------------------
// Device helpers

/* Row x of t (indices from cu_split_row, shared by the operands of one row). */
__device__ __forceinline__ char *ew_row(const cu_rows &t, const cu_row_idx &x)
{
    return t.base + x.i1 * t.nb1 + x.i2 * t.nb2 + x.i3 * t.nb3;
}

/* Elements i .. i+V-1 of a row of n elements of dtype dt, widened to float exactly (the formulas of cu_ld);
 * past n reads nothing and gives 0. V = 4 needs the row on a multiple of 4 elements' bytes and i % 4 == 0. */
template <int V>
__device__ __forceinline__ void ew_ld(const char *row, int dt, int64_t i, int64_t n, float (&v)[V])
{
    static_assert(V == 1 || V == 4, "V is 1 or 4");
    if (V == 1 || i + V > n) {
#pragma unroll
        for (int j = 0; j < V; j++)
            v[j] = i + j < n ? cu_ld(row, dt, i + j) : 0.0f;
        return;
    }
    if constexpr (V == 4) {
        switch (dt) {
        case BERTH_DTYPE_BF16: { /* bf16 -> f32 is the 16 bits shifted up: exact, as __bfloat162float */
            const uint2 w = *(const uint2 *)(row + i * 2);
            v[0] = __uint_as_float(w.x << 16);
            v[1] = __uint_as_float(w.x & 0xffff0000u);
            v[2] = __uint_as_float(w.y << 16);
            v[3] = __uint_as_float(w.y & 0xffff0000u);
            break;
        }
        case BERTH_DTYPE_F16: {
            const uint2 w = *(const uint2 *)(row + i * 2);
            v[0] = __half2float(__ushort_as_half((unsigned short)(w.x & 0xffffu)));
            v[1] = __half2float(__ushort_as_half((unsigned short)(w.x >> 16)));
            v[2] = __half2float(__ushort_as_half((unsigned short)(w.y & 0xffffu)));
            v[3] = __half2float(__ushort_as_half((unsigned short)(w.y >> 16)));
            break;
        }
        default: {
            const float4 w = *(const float4 *)(row + i * 4);
            v[0] = w.x;
            v[1] = w.y;
            v[2] = w.z;
            v[3] = w.w;
            break;
        }
        }
    }
}

/* Store v as elements i .. i+V-1 (those below n) of dtype dt, rounded as cu_st (nearest even). */
template <int V>
__device__ __forceinline__ void ew_st(char *row, int dt, int64_t i, int64_t n, const float (&v)[V])
{
    if (V == 1 || i + V > n) {
#pragma unroll
        for (int j = 0; j < V; j++)
            if (i + j < n)
                cu_st(row, dt, i + j, v[j]);
        return;
    }
    if constexpr (V == 4) {
        switch (dt) {
        case BERTH_DTYPE_BF16: {
            uint2 w;
            w.x = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(v[0])) |
                  (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(v[1])) << 16;
            w.y = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(v[2])) |
                  (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(v[3])) << 16;
            *(uint2 *)(row + i * 2) = w;
            break;
        }
        case BERTH_DTYPE_F16: {
            uint2 w;
            w.x = (uint32_t)__half_as_ushort(__float2half_rn(v[0])) |
                  (uint32_t)__half_as_ushort(__float2half_rn(v[1])) << 16;
            w.y = (uint32_t)__half_as_ushort(__float2half_rn(v[2])) |
                  (uint32_t)__half_as_ushort(__float2half_rn(v[3])) << 16;
            *(uint2 *)(row + i * 2) = w;
            break;
        }
        default: *(float4 *)(row + i * 4) = make_float4(v[0], v[1], v[2], v[3]); break;
        }
    }
}

/* Where a thread starts and how it steps (all index maths, done before cu_pdl_wait). Rows: r0, r0 + rstep, ...
 * (threadIdx.y picks the row inside a block). Columns: the thread's vector k (< u) of a chunk starting at column
 * c is at c + k * kstep, adjacent threads on adjacent vectors; c0 is its column in its block column's first chunk,
 * cstep the step to that block column's next chunk. */
struct ew_walk {
    int64_t r0, rstep;
    int64_t c0, cstep;
    int kstep; /* tx * V */
    int u;     /* vectors per thread and chunk: U, or the plan's u when U = EW_U */
};

template <int V, int U>
__device__ __forceinline__ ew_walk ew_walk_of(const ew_geom &g)
{
    ew_walk w;
    w.u = U == 1 ? 1 : g.u;
    w.r0 = (int64_t)blockIdx.y * blockDim.y + threadIdx.y;
    w.rstep = (int64_t)gridDim.y * blockDim.y;
    w.kstep = (int)blockDim.x * V;
    const int64_t chunk = (int64_t)w.kstep * w.u;
    w.c0 = (int64_t)blockIdx.x * chunk + (int64_t)threadIdx.x * V;
    w.cstep = (int64_t)gridDim.x * chunk;
    return w;
}

/* Slot k of the chunk at c is this thread's work: k < u (U = 1 has only k = 0) and the column inside the row. */
#define EW_LIVE(w, k, i, n) (((w).u > (k) || (k) == 0) && (i) < (n))

// ---------------------------------------------------------------------------------------------------------------
// get_rows: y[t, :] = scale * table[ids[t], :]. An id outside [0, N) is the caller's bug (berth/backend.h); it
// must still not read outside the table, so that row of y is written as zeros.

template <int TDT, int V, int U>
__global__ void __launch_bounds__(EW_THREADS, EW_BLOCKS_PER_SM)
ew_get_rows_kernel(const char *table, int64_t tnb1, int64_t N, const int32_t *ids, const cu_rows y, const ew_geom g,
                   float scale)
{
    cu_pdl_trigger();
    const ew_walk w = ew_walk_of<V, U>(g);
    int64_t t = w.r0;
    char *yr = t < g.rows ? ew_row(y, cu_split_row(t, g.ne1, g.ne2)) : nullptr;
    cu_pdl_wait();
    while (t < g.rows) {
        const int32_t id = ids[t];
        const bool ok = id >= 0 && (int64_t)id < N;
        const char *src = table + (ok ? (int64_t)id : 0) * tnb1;
        for (int64_t c = w.c0; c < g.n; c += w.cstep) {
            float v[U][V];
#pragma unroll
            for (int k = 0; k < U; k++) {
                const int64_t i = c + (int64_t)k * w.kstep;
                if (EW_LIVE(w, k, i, g.n)) {
                    if (ok)
                        ew_ld<V>(src, TDT, i, g.n, v[k]);
                    else
#pragma unroll
                        for (int j = 0; j < V; j++)
                            v[k][j] = 0.0f;
                }
            }
#pragma unroll
            for (int k = 0; k < U; k++) {
                const int64_t i = c + (int64_t)k * w.kstep;
                if (EW_LIVE(w, k, i, g.n)) {
#pragma unroll
                    for (int j = 0; j < V; j++)
                        v[k][j] = ok ? scale * v[k][j] : 0.0f;
                    ew_st<V>(yr, BERTH_DTYPE_F32, i, g.n, v[k]);
                }
            }
        }
        t += w.rstep;
        if (t < g.rows)
            yr = ew_row(y, cu_split_row(t, g.ne1, g.ne2));
    }
}

/* Calls f.template operator()<DT>() for a weight dtype (f32, bf16, f16): the sources of get_rows and binary's b
 * are template arguments, so the loads compile without a dtype switch. */
template <typename F>
static void ew_with_dt(int dt, F &&f)
{
    switch (dt) {
    case BERTH_DTYPE_BF16: f.template operator()<BERTH_DTYPE_BF16>(); break;
    case BERTH_DTYPE_F16: f.template operator()<BERTH_DTYPE_F16>(); break;
    default: f.template operator()<BERTH_DTYPE_F32>(); break;
    }
}

/* Calls f.template operator()<V, U>() for the plan's vector width and unroll (U = 1 when u = 1: decode-sized
 * ops get the short kernel, without the slots they would not use). */
template <typename F>
static void ew_with_vu(const ew_plan &l, F &&f)
{
    if (l.v == 4) {
        if (l.g.u == 1)
            f.template operator()<4, 1>();
        else
            f.template operator()<4, EW_U>();
    } else {
        if (l.g.u == 1)
            f.template operator()<1, 1>();
        else
            f.template operator()<1, EW_U>();
    }
}

bool cu_check_get_rows(const berth_backend *be, struct opck *c, const berth_get_rows_params *p)
{
    (void)be;
    return opck_get_rows(c, p);
}

berth_status cu_op_get_rows(berth_backend *be, berth_stream *s, const berth_get_rows_params *p)
{
    CU_OP_BEGIN(be, get_rows, p);
    const int64_t D = p->table.ne[0], T = p->ids.ne[0];
    if (D == 0 || T == 0)
        return BERTH_OK;
    /* table rows: the base and nb[1] (ne[2], ne[3] are 1); y rows: any view */
    const int64_t tvb = ew_vec_bytes(&p->table);
    const bool vec = (uintptr_t)cu_ptr(&p->table) % (uintptr_t)tvb == 0 &&
                     (p->table.ne[1] <= 1 || p->table.nb[1] % tvb == 0) && ew_vec_ok(&p->y, false);
    const ew_plan l = ew_shape(be, D, T, p->y.ne[1], p->y.ne[2], vec ? 4 : 1);
    const char *table = cu_ptr(&p->table);
    const int64_t tnb1 = p->table.nb[1], N = p->table.ne[1];
    const int tdt = (int)p->table.dtype;
    const cu_rows y = cu_rows_of(&p->y);
    const int32_t *ids = (const int32_t *)cu_ptr(&p->ids);
    const float scale = p->scale;
    const cudaStream_t cs = s->cs;
    cudaError_t e = cudaSuccess;
    ew_with_dt(tdt, [&]<int TDT>() {
        ew_with_vu(l, [&]<int V, int U>() {
            e = cu_launch(be, cs, l.grid, l.block, 0, ew_get_rows_kernel<TDT, V, U>, table, tnb1, N, ids, y, l.g,
                          scale);
        });
    });
    return cu_check(be, e, "get_rows kernel");
}

// ---------------------------------------------------------------------------------------------------------------
// unary: y = out_scale * f(in_scale * x). The activation is a template argument so each kernel is one formula.

/* y = f(x) element by element, x of dtype xdt and y of ydt (read and written as ew_ld / ew_st do): the walk of
 * unary and copy, which differ only in f and the dtypes (unary passes f32 constants, folded in at inlining). */
template <int V, int U, typename F>
__device__ __forceinline__ void ew_map1(const cu_rows &x, int xdt, const cu_rows &y, int ydt, const ew_geom &g, F f)
{
    const ew_walk w = ew_walk_of<V, U>(g);
    int64_t r = w.r0;
    const char *xr = nullptr;
    char *yr = nullptr;
    auto at = [&](int64_t row) {
        const cu_row_idx ix = cu_split_row(row, g.ne1, g.ne2);
        xr = ew_row(x, ix);
        yr = ew_row(y, ix);
    };
    if (r < g.rows)
        at(r);
    cu_pdl_wait();
    while (r < g.rows) {
        for (int64_t c = w.c0; c < g.n; c += w.cstep) {
            float v[U][V];
#pragma unroll
            for (int k = 0; k < U; k++) {
                const int64_t i = c + (int64_t)k * w.kstep;
                if (EW_LIVE(w, k, i, g.n))
                    ew_ld<V>(xr, xdt, i, g.n, v[k]);
            }
#pragma unroll
            for (int k = 0; k < U; k++) {
                const int64_t i = c + (int64_t)k * w.kstep;
                if (EW_LIVE(w, k, i, g.n)) {
#pragma unroll
                    for (int j = 0; j < V; j++)
                        v[k][j] = f(v[k][j]);
                    ew_st<V>(yr, ydt, i, g.n, v[k]);
                }
            }
        }
        r += w.rstep;
        if (r < g.rows)
            at(r);
    }
}

template <int ACT, int V, int U>
__global__ void __launch_bounds__(EW_THREADS, EW_BLOCKS_PER_SM)
ew_unary_kernel(const cu_rows x, const cu_rows y, const ew_geom g, float in_scale, float out_scale)
{
    cu_pdl_trigger();
    ew_map1<V, U>(x, BERTH_DTYPE_F32, y, BERTH_DTYPE_F32, g,
                  [=](float v) { return out_scale * cu_act(ACT, in_scale * v); });
}

/* Calls launch.template operator()<ACT>() for the runtime act (validated by the shared checks). */
template <typename F>
static void ew_with_act(int act, F &&launch)
{
    switch (act) {
    case BERTH_ACT_GELU_TANH: launch.template operator()<BERTH_ACT_GELU_TANH>(); break;
    case BERTH_ACT_GELU_ERF: launch.template operator()<BERTH_ACT_GELU_ERF>(); break;
    case BERTH_ACT_SILU: launch.template operator()<BERTH_ACT_SILU>(); break;
    case BERTH_ACT_RELU: launch.template operator()<BERTH_ACT_RELU>(); break;
    case BERTH_ACT_SIGMOID: launch.template operator()<BERTH_ACT_SIGMOID>(); break;
    case BERTH_ACT_TANH: launch.template operator()<BERTH_ACT_TANH>(); break;
    case BERTH_ACT_SOFTPLUS: launch.template operator()<BERTH_ACT_SOFTPLUS>(); break;
    case BERTH_ACT_EXP: launch.template operator()<BERTH_ACT_EXP>(); break;
    default: launch.template operator()<BERTH_ACT_IDENTITY>(); break;
    }
}

bool cu_check_unary(const berth_backend *be, struct opck *c, const berth_unary_params *p)
{
    (void)be;
    return opck_unary(c, p);
}

berth_status cu_op_unary(berth_backend *be, berth_stream *s, const berth_unary_params *p)
{
    CU_OP_BEGIN(be, unary, p);
    const int64_t n = p->x.ne[0], rows = cu_nrows(&p->x);
    if (n == 0 || rows == 0 || (be->skip & CU_SKIP_UNARY))
        return BERTH_OK;
    const bool packed = ew_packed(&p->x) && ew_packed(&p->y);
    const bool vec = ew_vec_ok(&p->x, packed) && ew_vec_ok(&p->y, packed);
    const ew_plan l = packed ? ew_shape(be, n * rows, 1, 1, 1, vec ? 4 : 1)
                             : ew_shape(be, n, rows, p->x.ne[1], p->x.ne[2], vec ? 4 : 1);
    const cu_rows x = packed ? ew_one_row(&p->x) : cu_rows_of(&p->x);
    const cu_rows y = packed ? ew_one_row(&p->y) : cu_rows_of(&p->y);
    const cudaStream_t cs = s->cs;
    const float in_scale = p->in_scale, out_scale = p->out_scale;
    cudaError_t e = cudaSuccess;
    ew_with_act(p->act, [&]<int ACT>() {
        ew_with_vu(l, [&]<int V, int U>() {
            e = cu_launch(be, cs, l.grid, l.block, 0, ew_unary_kernel<ACT, V, U>, x, y, l.g, in_scale, out_scale);
        });
    });
    return cu_check(be, e, "unary kernel");
}

// ---------------------------------------------------------------------------------------------------------------
// glu: y = f(gate) * up

template <int ACT, int V, int U>
__global__ void __launch_bounds__(EW_THREADS, EW_BLOCKS_PER_SM)
ew_glu_kernel(const cu_rows gate, const cu_rows up, const cu_rows y, const ew_geom g)
{
    cu_pdl_trigger();
    const ew_walk w = ew_walk_of<V, U>(g);
    int64_t r = w.r0;
    const char *gr = nullptr, *ur = nullptr;
    char *yr = nullptr;
    auto at = [&](int64_t row) {
        const cu_row_idx ix = cu_split_row(row, g.ne1, g.ne2);
        gr = ew_row(gate, ix);
        ur = ew_row(up, ix);
        yr = ew_row(y, ix);
    };
    if (r < g.rows)
        at(r);
    cu_pdl_wait();
    while (r < g.rows) {
        for (int64_t c = w.c0; c < g.n; c += w.cstep) {
            float gv[U][V], uv[U][V];
#pragma unroll
            for (int k = 0; k < U; k++) {
                const int64_t i = c + (int64_t)k * w.kstep;
                if (EW_LIVE(w, k, i, g.n)) {
                    ew_ld<V>(gr, BERTH_DTYPE_F32, i, g.n, gv[k]);
                    ew_ld<V>(ur, BERTH_DTYPE_F32, i, g.n, uv[k]);
                }
            }
#pragma unroll
            for (int k = 0; k < U; k++) {
                const int64_t i = c + (int64_t)k * w.kstep;
                if (EW_LIVE(w, k, i, g.n)) {
#pragma unroll
                    for (int j = 0; j < V; j++)
                        gv[k][j] = cu_act(ACT, gv[k][j]) * uv[k][j];
                    ew_st<V>(yr, BERTH_DTYPE_F32, i, g.n, gv[k]);
                }
            }
        }
        r += w.rstep;
        if (r < g.rows)
            at(r);
    }
}

bool cu_check_glu(const berth_backend *be, struct opck *c, const berth_glu_params *p)
{
    (void)be;
    return opck_glu(c, p);
}

berth_status cu_op_glu(berth_backend *be, berth_stream *s, const berth_glu_params *p)
{
    CU_OP_BEGIN(be, glu, p);
    const int64_t n = p->gate.ne[0], rows = cu_nrows(&p->gate);
    if (n == 0 || rows == 0)
        return BERTH_OK;
    const bool packed = ew_packed(&p->gate) && ew_packed(&p->up) && ew_packed(&p->y);
    const bool vec = ew_vec_ok(&p->gate, packed) && ew_vec_ok(&p->up, packed) && ew_vec_ok(&p->y, packed);
    const ew_plan l = packed ? ew_shape(be, n * rows, 1, 1, 1, vec ? 4 : 1)
                             : ew_shape(be, n, rows, p->gate.ne[1], p->gate.ne[2], vec ? 4 : 1);
    const cu_rows g = packed ? ew_one_row(&p->gate) : cu_rows_of(&p->gate);
    const cu_rows u = packed ? ew_one_row(&p->up) : cu_rows_of(&p->up);
    const cu_rows y = packed ? ew_one_row(&p->y) : cu_rows_of(&p->y);
    const cudaStream_t cs = s->cs;
    cudaError_t e = cudaSuccess;
    ew_with_act(p->act, [&]<int ACT>() {
        ew_with_vu(l, [&]<int V, int U>() {
            e = cu_launch(be, cs, l.grid, l.block, 0, ew_glu_kernel<ACT, V, U>, g, u, y, l.g);
        });
    });
    return cu_check(be, e, "glu kernel");
}

// ---------------------------------------------------------------------------------------------------------------
// binary: y = a + scale * b or a * b * scale, b broadcast along every dim where its ne is 1 (b any weight dtype).

struct ew_bcast {
    const char *base;
    int64_t nb0, nb1, nb2, nb3; /* 0 along broadcast dims */
};

template <int OP, int BDT, int V, int U>
__global__ void __launch_bounds__(EW_THREADS, EW_BLOCKS_PER_SM)
ew_binary_kernel(const cu_rows a, const ew_bcast b, const cu_rows y, const ew_geom g, float scale)
{
    cu_pdl_trigger();
    const ew_walk w = ew_walk_of<V, U>(g);
    int64_t r = w.r0;
    const char *ar = nullptr, *br = nullptr;
    char *yr = nullptr;
    auto at = [&](int64_t row) {
        const cu_row_idx ix = cu_split_row(row, g.ne1, g.ne2);
        ar = ew_row(a, ix);
        br = b.base + ix.i1 * b.nb1 + ix.i2 * b.nb2 + ix.i3 * b.nb3;
        yr = ew_row(y, ix);
    };
    if (r < g.rows)
        at(r);
    cu_pdl_wait();
    while (r < g.rows) {
        /* b broadcast along the row (nb0 = 0): one value for all of it */
        const float b_row = b.nb0 == 0 ? cu_ld(br, BDT, 0) : 0.0f;
        for (int64_t c = w.c0; c < g.n; c += w.cstep) {
            float av[U][V], bv[U][V];
#pragma unroll
            for (int k = 0; k < U; k++) {
                const int64_t i = c + (int64_t)k * w.kstep;
                if (EW_LIVE(w, k, i, g.n)) {
                    ew_ld<V>(ar, BERTH_DTYPE_F32, i, g.n, av[k]);
                    if (b.nb0 != 0)
                        ew_ld<V>(br, BDT, i, g.n, bv[k]); /* b.nb0 is its element size: a row like a's */
                    else
#pragma unroll
                        for (int j = 0; j < V; j++)
                            bv[k][j] = b_row;
                }
            }
#pragma unroll
            for (int k = 0; k < U; k++) {
                const int64_t i = c + (int64_t)k * w.kstep;
                if (EW_LIVE(w, k, i, g.n)) {
#pragma unroll
                    for (int j = 0; j < V; j++)
                        av[k][j] = OP == BERTH_BINARY_ADD ? av[k][j] + scale * bv[k][j] : av[k][j] * bv[k][j] * scale;
                    ew_st<V>(yr, BERTH_DTYPE_F32, i, g.n, av[k]);
                }
            }
        }
        r += w.rstep;
        if (r < g.rows)
            at(r);
    }
}

bool cu_check_binary(const berth_backend *be, struct opck *c, const berth_binary_params *p)
{
    (void)be;
    return opck_binary(c, p);
}

berth_status cu_op_binary(berth_backend *be, berth_stream *s, const berth_binary_params *p)
{
    CU_OP_BEGIN(be, binary, p);
    const int64_t n = p->a.ne[0], rows = cu_nrows(&p->a);
    if (n == 0 || rows == 0)
        return BERTH_OK;
    ew_bcast b;
    b.base = cu_ptr(&p->b);
    b.nb0 = p->b.ne[0] == 1 ? 0 : p->b.nb[0];
    b.nb1 = p->b.ne[1] == 1 ? 0 : p->b.nb[1];
    b.nb2 = p->b.ne[2] == 1 ? 0 : p->b.nb[2];
    b.nb3 = p->b.ne[3] == 1 ? 0 : p->b.nb[3];
    /* One long row when a and y are dense blocks and b is too (a's full shape) or is a single value. */
    bool b_full = true, b_single = true;
    for (int d = 0; d < 4; d++) {
        b_full = b_full && p->b.ne[d] == p->a.ne[d];
        b_single = b_single && p->b.ne[d] == 1;
    }
    const bool packed = ew_packed(&p->a) && ew_packed(&p->y) && (b_single || (b_full && ew_packed(&p->b)));
    if (packed) { /* row 0 only; b walks along it unless it is a single value (a.ne[0] = 1 set nb0 = 0 above) */
        b.nb0 = b_single ? 0 : p->b.nb[0];
        b.nb1 = b.nb2 = b.nb3 = 0;
    }
    /* b's rows need the vector alignment only where b is read as vectors (not broadcast along the row) */
    const int64_t bvb = ew_vec_bytes(&p->b);
    const bool b_vec = b.nb0 == 0 || ((uintptr_t)b.base % (uintptr_t)bvb == 0 && b.nb1 % bvb == 0 &&
                                      b.nb2 % bvb == 0 && b.nb3 % bvb == 0);
    const bool vec = ew_vec_ok(&p->a, packed) && ew_vec_ok(&p->y, packed) && b_vec;
    const ew_plan l = packed ? ew_shape(be, n * rows, 1, 1, 1, vec ? 4 : 1)
                             : ew_shape(be, n, rows, p->a.ne[1], p->a.ne[2], vec ? 4 : 1);
    const cu_rows ar = packed ? ew_one_row(&p->a) : cu_rows_of(&p->a);
    const cu_rows yr = packed ? ew_one_row(&p->y) : cu_rows_of(&p->y);
    const int bdt = p->b.dtype;
    const float sc = p->scale;
    const cudaStream_t cs = s->cs;
    cudaError_t e = cudaSuccess;
    const bool mul = p->op == BERTH_BINARY_MUL;
    ew_with_dt(bdt, [&]<int BDT>() {
        ew_with_vu(l, [&]<int V, int U>() {
            e = mul ? cu_launch(be, cs, l.grid, l.block, 0, ew_binary_kernel<BERTH_BINARY_MUL, BDT, V, U>, ar, b, yr,
                                l.g, sc)
                    : cu_launch(be, cs, l.grid, l.block, 0, ew_binary_kernel<BERTH_BINARY_ADD, BDT, V, U>, ar, b, yr,
                                l.g, sc);
        });
    });
    return cu_check(be, e, "binary kernel");
}

// ---------------------------------------------------------------------------------------------------------------
// copy: y = x converted between f32, bf16 and f16 (round to nearest even), any outer strides on both sides.

template <int V, int U>
__global__ void __launch_bounds__(EW_THREADS, EW_BLOCKS_PER_SM)
ew_copy_kernel(const cu_rows x, int xdt, const cu_rows y, int ydt, const ew_geom g)
{
    cu_pdl_trigger();
    ew_map1<V, U>(x, xdt, y, ydt, g, [](float v) { return v; }); /* exact for equal dtypes: widening is exact */
}

bool cu_check_copy(const berth_backend *be, struct opck *c, const berth_copy_params *p)
{
    (void)be;
    return opck_copy(c, p);
}

berth_status cu_op_copy(berth_backend *be, berth_stream *s, const berth_copy_params *p)
{
    CU_OP_BEGIN(be, copy, p);
    const int64_t n = p->x.ne[0], rows = cu_nrows(&p->x);
    if (n == 0 || rows == 0)
        return BERTH_OK;
    const bool packed = ew_packed(&p->x) && ew_packed(&p->y);
    const bool vec = ew_vec_ok(&p->x, packed) && ew_vec_ok(&p->y, packed);
    const ew_plan l = packed ? ew_shape(be, n * rows, 1, 1, 1, vec ? 4 : 1)
                             : ew_shape(be, n, rows, p->x.ne[1], p->x.ne[2], vec ? 4 : 1);
    const cu_rows x = packed ? ew_one_row(&p->x) : cu_rows_of(&p->x);
    const cu_rows y = packed ? ew_one_row(&p->y) : cu_rows_of(&p->y);
    const int xdt = (int)p->x.dtype, ydt = (int)p->y.dtype;
    const cudaStream_t cs = s->cs;
    cudaError_t e = cudaSuccess;
    ew_with_vu(l, [&]<int V, int U>() {
        e = cu_launch(be, cs, l.grid, l.block, 0, ew_copy_kernel<V, U>, x, xdt, y, ydt, l.g);
    });
    return cu_check(be, e, "copy kernel");
}

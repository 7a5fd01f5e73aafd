/*
 * elementwise.cu — ops without reductions: get_rows (embedding lookup), unary, glu, binary (with broadcast) and
 * copy (dtype conversion), fp32 arithmetic, on row-regular views with any outer strides.
 *
 * One launch shape serves them all: a block is 256 threads laid out tx x ty (tx a power of two covering ne[0] up
 * to 256, ty = 256 / tx rows), so short rows (a per-head scalar, ne[0] = 1) still fill warps; the grid is capped
 * and the kernels loop, so any row count or row length works. Each thread owns whole elements: reading x[i] and
 * writing y[i] in one thread is what makes y aliasing an input (unary, glu, binary, copy allow it) safe.
 * Activations are the formulas of berth/backend.h through cu_act (precise libm functions, no fast-math).
 * Launches go through cu_launch (cuda_launch.cuh): each kernel triggers its successor first, then waits for its
 * predecessor before touching memory.
 */
#include "cuda_internal.h"
#include "cuda_device.cuh"
#include "cuda_launch.cuh"


/* Launch shape over ne0 columns and `rows` rows (both > 0). */
struct ew_launch {
    dim3 grid, block;
};

static ew_launch ew_shape(int64_t ne0, int64_t rows)
{
    unsigned tx = 32;
    while (tx < 256 && (int64_t)tx < ne0)
        tx <<= 1;
    const unsigned ty = 256 / tx;
    int64_t gx = (ne0 + tx - 1) / tx, gy = (rows + ty - 1) / ty;
    ew_launch l;
    l.block = dim3(tx, ty, 1);
    l.grid = dim3((unsigned)(gx > 65535 ? 65535 : gx), (unsigned)(gy > 65535 ? 65535 : gy), 1);
    return l;
}

/* Loops of every kernel here: rows r and columns i this thread owns. */
#define EW_FOR_ROWS(r, rows)                                                                                   \
    for (int64_t r = (int64_t)blockIdx.y * blockDim.y + threadIdx.y; r < (rows); r += (int64_t)gridDim.y * blockDim.y)
#define EW_FOR_COLS(i, n)                                                                                      \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

// ---------------------------------------------------------------------------------------------------------------
// get_rows: y[t, :] = scale * table[ids[t], :]. An id outside [0, N) is the caller's bug (berth/backend.h); it
// must still not read outside the table, so that row of y is written as zeros.

__global__ void ew_get_rows_kernel(const char *table, int64_t tnb1, int tdt, int64_t D, int64_t N,
                                   const int32_t *ids, int64_t T, const cu_rows y, float scale)
{
    cu_pdl_trigger();
    cu_pdl_wait();
    EW_FOR_ROWS(t, T) {
        const int32_t id = ids[t];
        const bool ok = id >= 0 && (int64_t)id < N;
        const char *src = table + (ok ? (int64_t)id : 0) * tnb1;
        float *yr = (float *)cu_row(y, t);
        EW_FOR_COLS(i, D) yr[i] = ok ? scale * cu_ld(src, tdt, i) : 0.0f;
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
    const ew_launch l = ew_shape(D, T);
    const char *table = cu_ptr(&p->table);
    const cudaError_t e = cu_launch(be, s->cs, l.grid, l.block, 0, ew_get_rows_kernel, table, p->table.nb[1],
                                    (int)p->table.dtype, D, p->table.ne[1], (const int32_t *)cu_ptr(&p->ids), T,
                                    cu_rows_of(&p->y), p->scale);
    return cu_check(be, e, "get_rows kernel");
}

// ---------------------------------------------------------------------------------------------------------------
// unary: y = out_scale * f(in_scale * x). The activation is a template argument so each kernel is one formula.

template <int ACT>
__global__ void ew_unary_kernel(const cu_rows x, const cu_rows y, int64_t n, int64_t rows, float in_scale,
                                float out_scale)
{
    cu_pdl_trigger();
    cu_pdl_wait();
    EW_FOR_ROWS(r, rows) {
        const float *xr = (const float *)cu_row(x, r);
        float *yr = (float *)cu_row(y, r);
        EW_FOR_COLS(i, n) yr[i] = out_scale * cu_act(ACT, in_scale * xr[i]);
    }
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
    if (n == 0 || rows == 0)
        return BERTH_OK;
    const ew_launch l = ew_shape(n, rows);
    const cu_rows x = cu_rows_of(&p->x), y = cu_rows_of(&p->y);
    const cudaStream_t cs = s->cs;
    cudaError_t e = cudaSuccess;
    ew_with_act(p->act, [&]<int ACT>() {
        e = cu_launch(be, cs, l.grid, l.block, 0, ew_unary_kernel<ACT>, x, y, n, rows, p->in_scale, p->out_scale);
    });
    return cu_check(be, e, "unary kernel");
}

// ---------------------------------------------------------------------------------------------------------------
// glu: y = f(gate) * up

template <int ACT>
__global__ void ew_glu_kernel(const cu_rows gate, const cu_rows up, const cu_rows y, int64_t n, int64_t rows)
{
    cu_pdl_trigger();
    cu_pdl_wait();
    EW_FOR_ROWS(r, rows) {
        const float *gr = (const float *)cu_row(gate, r);
        const float *ur = (const float *)cu_row(up, r);
        float *yr = (float *)cu_row(y, r);
        EW_FOR_COLS(i, n) yr[i] = cu_act(ACT, gr[i]) * ur[i];
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
    const ew_launch l = ew_shape(n, rows);
    const cu_rows g = cu_rows_of(&p->gate), u = cu_rows_of(&p->up), y = cu_rows_of(&p->y);
    const cudaStream_t cs = s->cs;
    cudaError_t e = cudaSuccess;
    ew_with_act(p->act,
                [&]<int ACT>() { e = cu_launch(be, cs, l.grid, l.block, 0, ew_glu_kernel<ACT>, g, u, y, n, rows); });
    return cu_check(be, e, "glu kernel");
}

// ---------------------------------------------------------------------------------------------------------------
// binary: y = a + scale * b or a * b * scale, b broadcast along every dim where its ne is 1 (b any weight dtype).

struct ew_bcast {
    const char *base;
    int64_t nb0, nb1, nb2, nb3; /* 0 along broadcast dims */
};

template <int OP>
__global__ void ew_binary_kernel(const cu_rows a, const ew_bcast b, int bdt, const cu_rows y, int64_t n,
                                 int64_t rows, float scale)
{
    cu_pdl_trigger();
    cu_pdl_wait();
    EW_FOR_ROWS(r, rows) {
        const int64_t i1 = r % a.ne1, i2 = r / a.ne1 % a.ne2, i3 = r / a.ne1 / a.ne2;
        const char *br = b.base + i1 * b.nb1 + i2 * b.nb2 + i3 * b.nb3;
        const float *ar = (const float *)cu_row(a, r);
        float *yr = (float *)cu_row(y, r);
        EW_FOR_COLS(i, n)
        {
            const float bv = cu_ld(br + i * b.nb0, bdt, 0);
            yr[i] = OP == BERTH_BINARY_ADD ? ar[i] + scale * bv : ar[i] * bv * scale;
        }
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
    const ew_launch l = ew_shape(n, rows);
    const cu_rows ar = cu_rows_of(&p->a), yr = cu_rows_of(&p->y);
    const int bdt = p->b.dtype;
    const float sc = p->scale;
    const cudaError_t e =
        p->op == BERTH_BINARY_MUL
            ? cu_launch(be, s->cs, l.grid, l.block, 0, ew_binary_kernel<BERTH_BINARY_MUL>, ar, b, bdt, yr, n, rows, sc)
            : cu_launch(be, s->cs, l.grid, l.block, 0, ew_binary_kernel<BERTH_BINARY_ADD>, ar, b, bdt, yr, n, rows, sc);
    return cu_check(be, e, "binary kernel");
}

// ---------------------------------------------------------------------------------------------------------------
// copy: y = x converted between f32, bf16 and f16 (round to nearest even), any outer strides on both sides.

__global__ void ew_copy_kernel(const cu_rows x, int xdt, const cu_rows y, int ydt, int64_t n, int64_t rows)
{
    cu_pdl_trigger();
    cu_pdl_wait();
    EW_FOR_ROWS(r, rows) {
        const char *xr = cu_row(x, r);
        char *yr = cu_row(y, r);
        EW_FOR_COLS(i, n) cu_st(yr, ydt, i, cu_ld(xr, xdt, i)); /* exact for equal dtypes: widening is exact */
    }
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
    const ew_launch l = ew_shape(n, rows);
    const cudaError_t e = cu_launch(be, s->cs, l.grid, l.block, 0, ew_copy_kernel, cu_rows_of(&p->x),
                                    (int)p->x.dtype, cu_rows_of(&p->y), (int)p->y.dtype, n, rows);
    return cu_check(be, e, "copy kernel");
}

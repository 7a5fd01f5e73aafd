/*
 * elementwise.c — row-wise ops without reductions: get_rows (embedding lookup), unary, glu, binary (with
 * broadcast) and copy (dtype conversion). All work row by row on row-regular views, parallel over rows.
 */
#include <inttypes.h>

#include "convert.h"
#include "cpu_backend.h"
#include "simd.h"

/* ---------------------------------------------------------------------------------------------------------
 * get_rows: y[t, :] = scale * table[ids[t], :] */

static void get_rows_range(const void *arg, int64_t t0, int64_t t1)
{
    const berth_get_rows_params *p = arg;
    const int64_t D = p->table.ne[0];
    for (int64_t t = t0; t < t1; t++) {
        const char *src = cpu_data(&p->table) + (int64_t)cpu_i32_at(&p->ids, t) * p->table.nb[1];
        float *y = (float *)cpu_row(&p->y, t);
        cpu_load_row(y, src, p->table.dtype, D); /* y never aliases table (f32 scratch vs weights) */
        if (p->scale != 1.0f)
            for (int64_t i = 0; i < D; i++)
                y[i] *= p->scale;
    }
}

berth_status cpu_op_get_rows(berth_backend *be, berth_stream *s, const berth_get_rows_params *p)
{
    CPU_OP_BEGIN(be, get_rows, p);
    for (int64_t t = 0; t < p->ids.ne[0]; t++) {
        const int32_t id = cpu_i32_at(&p->ids, t);
        if (id < 0 || id >= p->table.ne[1]) {
            CPU_OP_END(be);
            struct opck c = {0};
            opck_fail(&c, BERTH_E_INVALID, "get_rows: ids[%" PRId64 "] = %d is outside the table's %" PRId64 " rows", t,
                      id, p->table.ne[1]);
            return cpu_report(be, &c);
        }
    }
    cpu_parallel_for(be, p->ids.ne[0], (double)p->table.ne[0], get_rows_range, p);
    CPU_OP_END(be);
    return BERTH_OK;
}

/* ---------------------------------------------------------------------------------------------------------
 * unary: y = out_scale * f(in_scale * x) */

/* f(x) on 16 lanes for the activations that have a vector form (true), else false. GELU-tanh as
 * x * sigmoid(2z), the same function as 0.5 x (1 + tanh z) without its cancellation for negative x. */
CPU_INLINE bool act_vec(int32_t act, cpu_vf x, cpu_vf *y)
{
    switch (act) {
    case BERTH_ACT_GELU_TANH: {
        const cpu_vf z = 0.7978845608028654f * (x + 0.044715f * x * x * x);
        *y = x / (1.0f + cpu_vexp(-2.0f * z));
        return true;
    }
    case BERTH_ACT_SILU: *y = x / (1.0f + cpu_vexp(-x)); return true;
    case BERTH_ACT_SIGMOID: *y = 1.0f / (1.0f + cpu_vexp(-x)); return true;
    case BERTH_ACT_TANH: *y = cpu_vtanh(x); return true;
    default: return false;
    }
}

/* cpu_act_row (cpu_backend.h). The vector form replaces scalar libm calls (GELU in every FFN, the logit
 * softcap's tanh over the vocabulary); the tail goes through a zero-padded vector so every element gets the same
 * formula wherever it sits in the row. */
static CPU_MULTIVERSION void act_row(int32_t act, float in_scale, float out_scale, const float *x, const float *u,
                                     float *y, int64_t n)
{
    cpu_vf v;
    if (!act_vec(act, (cpu_vf){0}, &v)) {
        for (int64_t i = 0; i < n; i++)
            y[i] = out_scale * cpu_act(act, in_scale * x[i]) * (u ? u[i] : 1.0f);
        return;
    }
    int64_t i = 0;
    for (; i + CPU_VL <= n; i += CPU_VL) {
        act_vec(act, in_scale * cpu_vld(x + i), &v);
        v *= out_scale;
        if (u)
            v *= cpu_vld(u + i);
        cpu_vst(y + i, v);
    }
    if (i < n) {
        float buf[CPU_VL] = {0};
        memcpy(buf, x + i, (size_t)(n - i) * sizeof *x);
        act_vec(act, in_scale * cpu_vld(buf), &v);
        v *= out_scale;
        for (int64_t l = 0; i + l < n; l++)
            y[i + l] = v[l] * (u ? u[i + l] : 1.0f);
    }
}

/* A plain function around the multiversioned one: target_clones would export a non-static symbol's resolver. */
void cpu_act_row(int32_t act, float in_scale, float out_scale, const float *x, const float *u, float *y, int64_t n)
{
    act_row(act, in_scale, out_scale, x, u, y, n);
}

static void unary_range(const void *arg, int64_t r0, int64_t r1)
{
    const berth_unary_params *p = arg;
    const int64_t n = p->x.ne[0];
    for (int64_t r = r0; r < r1; r++)
        act_row(p->act, p->in_scale, p->out_scale, (const float *)cpu_row(&p->x, r), NULL, (float *)cpu_row(&p->y, r),
                n);
}

berth_status cpu_op_unary(berth_backend *be, berth_stream *s, const berth_unary_params *p)
{
    CPU_OP_BEGIN(be, unary, p);
    cpu_parallel_for(be, cpu_nrows(&p->x), 8.0 * (double)p->x.ne[0], unary_range, p);
    CPU_OP_END(be);
    return BERTH_OK;
}

/* ---------------------------------------------------------------------------------------------------------
 * glu: y = f(gate) * up */

static void glu_range(const void *arg, int64_t r0, int64_t r1)
{
    const berth_glu_params *p = arg;
    const int64_t n = p->gate.ne[0];
    for (int64_t r = r0; r < r1; r++) {
        act_row(p->act, 1.0f, 1.0f, (const float *)cpu_row(&p->gate, r), (const float *)cpu_row(&p->up, r),
                (float *)cpu_row(&p->y, r), n);
    }
}

berth_status cpu_op_glu(berth_backend *be, berth_stream *s, const berth_glu_params *p)
{
    CPU_OP_BEGIN(be, glu, p);
    cpu_parallel_for(be, cpu_nrows(&p->gate), 8.0 * (double)p->gate.ne[0], glu_range, p);
    CPU_OP_END(be);
    return BERTH_OK;
}

/* ---------------------------------------------------------------------------------------------------------
 * binary: y = a + scale*b or a*b*scale, b broadcast over dims where its ne is 1. b may be any weight dtype
 * (per-layer scalars and scale vectors come straight from checkpoints). */

static void binary_range(const void *arg, int64_t r0, int64_t r1)
{
    const berth_binary_params *p = arg;
    const int64_t n = p->a.ne[0];
    const int64_t bstep = p->b.ne[0] == 1 ? 0 : 1;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i1 = r % p->a.ne[1], i2 = r / p->a.ne[1] % p->a.ne[2], i3 = r / p->a.ne[1] / p->a.ne[2];
        const char *brow = cpu_data(&p->b) + (p->b.ne[1] == 1 ? 0 : i1 * p->b.nb[1]) +
                           (p->b.ne[2] == 1 ? 0 : i2 * p->b.nb[2]) + (p->b.ne[3] == 1 ? 0 : i3 * p->b.nb[3]);
        const float *a = (const float *)cpu_row(&p->a, r);
        float *y = (float *)cpu_row(&p->y, r);
        if (p->op == BERTH_BINARY_ADD)
            for (int64_t i = 0; i < n; i++)
                y[i] = a[i] + p->scale * cpu_load(brow, p->b.dtype, i * bstep);
        else
            for (int64_t i = 0; i < n; i++)
                y[i] = a[i] * cpu_load(brow, p->b.dtype, i * bstep) * p->scale;
    }
}

berth_status cpu_op_binary(berth_backend *be, berth_stream *s, const berth_binary_params *p)
{
    CPU_OP_BEGIN(be, binary, p);
    cpu_parallel_for(be, cpu_nrows(&p->a), (double)p->a.ne[0], binary_range, p);
    CPU_OP_END(be);
    return BERTH_OK;
}

/* ---------------------------------------------------------------------------------------------------------
 * copy: y = x with dtype conversion, any outer strides on both sides. */

static void copy_range(const void *arg, int64_t r0, int64_t r1)
{
    const berth_copy_params *p = arg;
    const int64_t n = p->x.ne[0];
    for (int64_t r = r0; r < r1; r++) {
        const char *x = cpu_row(&p->x, r);
        char *y = cpu_row(&p->y, r);
        if (p->x.dtype == p->y.dtype)
            memmove(y, x, (size_t)n * opck_dtype_size(p->x.dtype));
        else if (p->x.dtype == BERTH_DTYPE_F32)
            cpu_store_row(y, p->y.dtype, (const float *)x, n);
        else if (p->y.dtype == BERTH_DTYPE_F32)
            cpu_load_row((float *)y, x, p->x.dtype, n);
        else /* bf16 <-> f16 through f32, element by element (in place safe: same element size) */
            for (int64_t i = 0; i < n; i++)
                cpu_store(y, p->y.dtype, i, cpu_load(x, p->x.dtype, i));
    }
}

berth_status cpu_op_copy(berth_backend *be, berth_stream *s, const berth_copy_params *p)
{
    CPU_OP_BEGIN(be, copy, p);
    cpu_parallel_for(be, cpu_nrows(&p->x), (double)p->x.ne[0], copy_range, p);
    CPU_OP_END(be);
    return BERTH_OK;
}

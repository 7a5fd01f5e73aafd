/*
 * cpu_backend.h — internal declarations shared by the CPU backend's files: the backend, buffer and stream
 * objects, tensor addressing helpers, per-thread scratch, and every op's check and run entry points.
 *
 * Every op follows one shape: opck_OP() (plugins/common/op_check.h, shared with the other backends) validates
 * parameters (dtypes, shapes, combinations; in exec mode also buffers and bounds) and serves both supports() and
 * execution so the two always agree; cpu_op_OP() is the berth_ops member: it checks, then computes synchronously
 * on the calling thread plus the backend's pool, validating whatever depends on tensor contents as it goes.
 */
#ifndef CPU_BACKEND_H
#define CPU_BACKEND_H

#include <berth/backend.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "op_check.h"
#include "threadpool.h"

struct mm_kernels; /* matmul_kernels.h */

/* Growable 64-byte-aligned scratch memory. */
struct cpu_scratch {
    void *ptr;
    size_t size;
};

struct berth_backend {
    const berth_host *host;
    int n_threads;                 /* pool size including the calling thread */
    struct cpu_pool *pool;
    pthread_mutex_t exec_mu;       /* ops from different streams share the pool and scratch: one op at a time */
    struct cpu_scratch shared;     /* scratch visible to all threads of one op (e.g. packed matmul input) */
    struct cpu_scratch *per_thread;/* n_threads private scratch areas (score rows, sampling workspaces) */
    const struct mm_kernels *mmk;  /* matmul kernels for the best ISA this CPU runs */
    struct opck_backend ck;        /* dtype sets, limits and buffer facts for the shared op checks */
};

struct berth_buffer {
    void *ptr;
    uint64_t size;
    int owned;     /* 1: allocated by buffer_alloc (freed by buffer_free); 0: wrapped caller memory */
    int read_only; /* wrapped with read_only: never written */
};

struct berth_stream {
    berth_backend *be;
};

/* ---- dtype sets ---- */
#define CPU_WEIGHT_DTYPES (BERTH_DTYPE_BIT(BERTH_DTYPE_F32) | BERTH_DTYPE_BIT(BERTH_DTYPE_BF16) | \
                           BERTH_DTYPE_BIT(BERTH_DTYPE_F16))
#define CPU_ACT_DTYPES BERTH_DTYPE_BIT(BERTH_DTYPE_F32)
#define CPU_KV_DTYPES CPU_WEIGHT_DTYPES

/* ---- limits (stack arrays in the kernels; declared to the shared checks in struct opck_backend) ---- */
#define CPU_ATTN_MAX_REP 64 /* query heads per KV head handled in one attention item */
#define CPU_CONV_MAX_K 64   /* conv1d_causal kernel width (the sliding window lives on the stack) */

/* ---- check failures (cpu_backend.c) ---- */
/* Report a failed check through the host (set_error). Returns c->code. */
berth_status cpu_report(const berth_backend *be, const struct opck *c);

/* ---- tensor addressing ---- */
static inline char *cpu_data(const berth_tensor *t)
{
    return (char *)t->buf->ptr + t->offset;
}
static inline int64_t cpu_nrows(const berth_tensor *t)
{
    return t->ne[1] * t->ne[2] * t->ne[3];
}
/* Address of flattened row r (r over ne[1]*ne[2]*ne[3], ne[1] fastest). */
static inline char *cpu_row(const berth_tensor *t, int64_t r)
{
    const int64_t i1 = r % t->ne[1];
    r /= t->ne[1];
    const int64_t i2 = r % t->ne[2];
    const int64_t i3 = r / t->ne[2];
    return cpu_data(t) + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
}
static inline int32_t cpu_i32_at(const berth_tensor *t, int64_t i)
{
    return ((const int32_t *)cpu_data(t))[i];
}

/* ---- scratch and threads (cpu_backend.c) ---- */
/* Ensure the shared scratch holds bytes; BERTH_E_NOMEM (message set) otherwise. */
berth_status cpu_scratch_shared(berth_backend *be, size_t bytes, void **out);
/* Ensure every per-thread scratch holds bytes. */
berth_status cpu_scratch_threads(berth_backend *be, size_t bytes);
static inline void *cpu_thread_scratch(const berth_backend *be, int tid)
{
    return be->per_thread[tid].ptr;
}
/* Threads worth using for `work` units when each thread should get at least min_per_thread. */
int cpu_threads_for(const berth_backend *be, double work, double min_per_thread);
/* Run fn(ctx, r0, r1) over [0, n) in contiguous chunks on as many threads as `cost_per_item` (rough work units,
 * ~1 per element touched) makes worthwhile. */
typedef void (*cpu_range_fn)(const void *ctx, int64_t r0, int64_t r1);
void cpu_parallel_for(berth_backend *be, int64_t n, double cost_per_item, cpu_range_fn fn, const void *ctx);
/* [*lo, *hi) = part tid of nth of [0, n), split in units of `unit` items. */
static inline void cpu_split(int64_t n, int64_t unit, int tid, int nth, int64_t *lo, int64_t *hi)
{
    const int64_t units = (n + unit - 1) / unit;
    const int64_t u0 = units * tid / nth, u1 = units * (tid + 1) / nth;
    *lo = u0 * unit < n ? u0 * unit : n;
    *hi = u1 * unit < n ? u1 * unit : n;
}

/* ---- ops (checked by opck_OP) ---- */
#define CPU_DECLARE_OP(name, ptype) berth_status cpu_op_##name(berth_backend *be, berth_stream *s, const ptype *p);
CPU_DECLARE_OP(matmul, berth_matmul_params)
CPU_DECLARE_OP(get_rows, berth_get_rows_params)
CPU_DECLARE_OP(rms_norm, berth_rms_norm_params)
CPU_DECLARE_OP(layer_norm, berth_layer_norm_params)
CPU_DECLARE_OP(rope, berth_rope_params)
CPU_DECLARE_OP(unary, berth_unary_params)
CPU_DECLARE_OP(glu, berth_glu_params)
CPU_DECLARE_OP(binary, berth_binary_params)
CPU_DECLARE_OP(copy, berth_copy_params)
CPU_DECLARE_OP(kv_append, berth_kv_append_params)
CPU_DECLARE_OP(attention, berth_attention_params)
CPU_DECLARE_OP(conv1d_causal, berth_conv1d_causal_params)
CPU_DECLARE_OP(gated_delta, berth_gated_delta_params)
CPU_DECLARE_OP(gated_rms_norm, berth_gated_rms_norm_params)
CPU_DECLARE_OP(log_softmax_topk, berth_log_softmax_topk_params)
CPU_DECLARE_OP(sample, berth_sample_params)
#undef CPU_DECLARE_OP

/* Common op prologue: check in exec mode (struct_size first: a larger one from a newer minor is fine, its extra
 * fields are ignored), then lock the backend. Used as: CPU_OP_BEGIN(be, name, p); ...; CPU_OP_END(be). */
#define CPU_OP_BEGIN(be, name, p)                                                                              \
    do {                                                                                                       \
        struct opck ck_ = {.exec = 1, .be = &(be)->ck};                                                        \
        if (!(p))                                                                                              \
            opck_fail(&ck_, BERTH_E_INVALID, #name ": params is NULL");                                        \
        if (!(p) || !opck_##name(&ck_, (p)))                                                                   \
            return cpu_report((be), &ck_);                                                                     \
    } while (0);                                                                                               \
    pthread_mutex_lock(&(be)->exec_mu)
#define CPU_OP_END(be) pthread_mutex_unlock(&(be)->exec_mu)

/* Shared pieces used by more than one op. */
/* RMS-normalise n floats in place (fp32): v *= 1/sqrt(mean(v^2) + eps), then the weight mode with w (dtype wdt;
 * NULL unless opck_norm_has_weight(weight_mode)). */
void cpu_rms_norm_row(float *v, int64_t n, float eps, int32_t weight_mode, const void *w, berth_dtype wdt);
/* Rotate the pairs of one head vector v (d floats) in place with precomputed cos/sin per pair. */
void cpu_rope_apply(float *v, int32_t mode, int32_t pair_offset, int32_t n_pairs, const float *cs, const float *sn);
/* y[i] = out_scale * f(in_scale * x[i]) (* u[i] when u is not NULL) over one row of n (elementwise.c): the one
 * activation routine of unary, glu and the matmul's gated epilogue, so fused and separate ops agree bit for bit.
 * Each element's result depends only on its inputs, not its place in the row; y may alias x or u. */
void cpu_act_row(int32_t act, float in_scale, float out_scale, const float *x, const float *u, float *y, int64_t n);
/* Rotate the heads of one token in place exactly as the rope op does: head h at y0 + h * head_stride bytes
 * (d floats each), angles (float)pos * freqs[j] for the n_pairs pairs (rope.c). */
void cpu_rope_token(char *y0, int64_t head_stride, int64_t heads, int32_t mode, int32_t pair_offset,
                    int32_t n_pairs, float pos, const float *freqs);
/* Activation functions (BERTH_ACT_*), fp32 through libm. */
static inline float cpu_act(int32_t act, float x)
{
    switch (act) {
    case BERTH_ACT_GELU_TANH: return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    case BERTH_ACT_GELU_ERF: return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
    case BERTH_ACT_SILU: return x / (1.0f + expf(-x));
    case BERTH_ACT_RELU: return x > 0.0f ? x : 0.0f;
    case BERTH_ACT_SIGMOID: return 1.0f / (1.0f + expf(-x));
    case BERTH_ACT_TANH: return tanhf(x);
    /* max(x, 0) + log1p(e^-|x|): no overflow for large x, no lost digits for very negative x. */
    case BERTH_ACT_SOFTPLUS: return (x > 0.0f ? x : 0.0f) + log1pf(expf(-fabsf(x)));
    case BERTH_ACT_EXP: return expf(x);
    default: return x;
    }
}

#endif

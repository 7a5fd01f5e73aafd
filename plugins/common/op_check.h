/*
 * op_check.h — validation of op parameters shared by every backend plugin in this tree (compiled into each
 * plugin, nothing exported): dtypes, shapes, combinations and, in execution mode, buffer bounds and alignment.
 *
 * Why shared: berth/backend.h fixes one meaning per op, and supports() must agree with execution. With one
 * implementation of the checks, the CPU and CUDA backends accept exactly the same parameters (up to the limits
 * each declares in struct opck_backend) and reject the rest with the same one-line messages ("attention: q must be
 * ne {head_dim 256, n_heads, T}, got ...").
 *
 * Checks read metadata only (params, tensor descriptors, buffer sizes), never tensor contents: on a GPU the
 * contents are not host-visible. Data-dependent validation (token ids, block-table entries, seq_q_start values)
 * is the op's own business at execution.
 */
#ifndef BERTH_PLUGINS_OP_CHECK_H
#define BERTH_PLUGINS_OP_CHECK_H

#include <berth/backend.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What a backend tells the shared checks about itself. Static per backend instance. */
struct opck_backend {
    uint32_t weight_dtypes;     /* BERTH_DTYPE_BIT set: matmul/get_rows weights, norm weights */
    uint32_t act_dtypes;        /* activations */
    uint32_t kv_dtypes;         /* KV-cache element types */
    int32_t attn_max_rep;       /* most query heads per KV head in attention (0 = no limit) */
    int32_t attn_max_head_dim;  /* largest head_dim / head_dim_v attention and kv_append take (0 = no limit) */
    /* Execution-mode facts about a buffer: its first byte's address (host or device, only used for alignment),
     * its size, and whether the backend must never write it. */
    void (*buffer_facts)(const berth_buffer *b, uintptr_t *addr, uint64_t *size, int *read_only);
    int32_t conv_max_k;         /* widest conv1d_causal kernel (0 = no limit) */
};

/* One check in progress. exec = 1: execution (buffers must exist and hold the views); 0: supports() query. */
struct opck {
    int exec;
    berth_status code;   /* first failure (BERTH_OK while none) */
    char msg[256];
    const struct opck_backend *be;
};

/* Record a failure (the first one wins) and return false, so checks read `return opck_fail(...)`. */
bool opck_fail(struct opck *c, berth_status code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Is an optional tensor present (berth/backend.h, top comment)? Execution: buf != NULL; query: ne[0] != 0. */
bool opck_present(const struct opck *c, const berth_tensor *t);
/* dtype in dtypes, ne >= 0, nb[0] == element size; in exec mode a buffer that holds the whole view with
 * element-aligned address and strides; `writes` rejects read-only buffers. */
bool opck_tensor(struct opck *c, const char *op, const char *name, const berth_tensor *t, uint32_t dtypes,
                 bool writes);
/* ne[0] == n (n < 0: any) and ne[1..3] == 1. */
bool opck_vector(struct opck *c, const char *op, const char *name, const berth_tensor *t, int64_t n);
/* t has exactly ref's ne. */
/* In execution: a and b are views of one buffer whose byte ranges intersect (absent views never overlap). */
bool opck_views_overlap(const berth_tensor *a, const berth_tensor *b);
bool opck_same_shape(struct opck *c, const char *op, const char *name, const berth_tensor *t, const char *ref_name,
                     const berth_tensor *ref);
/* Params struct_size covers the fields this ABI version's op reads (BERTH_E_ABI otherwise). */
bool opck_struct_size(struct opck *c, const char *op, uint32_t have, size_t need);
/* The paged KV view: dtype in kv_dtypes, dims >= 1, and in exec mode both pools' extents and alignment. */
bool opck_kv_view(struct opck *c, const char *op, const berth_kv_view *kv);
/* RoPE mode and pair layout fit a head of d elements (rope and kv_append). */
bool opck_rope_pairs(struct opck *c, const char *op, int32_t mode, int32_t pair_offset, int32_t n_pairs, int64_t d);
static inline bool opck_norm_has_weight(int32_t mode)
{
    return mode == BERTH_NORM_W || mode == BERTH_NORM_W_ONE_PLUS;
}
/* The matmul's x_norm_mode, BERTH_NORM_W_NONE (no prologue) when the caller's struct predates the fields. */
static inline int32_t opck_matmul_norm_mode(const berth_matmul_params *p)
{
    return BERTH_HAS(p, berth_matmul_params, x_norm_w) ? p->x_norm_mode : BERTH_NORM_W_NONE;
}
/* The matmul's trailing norm (y_norm), NULL when the caller's struct predates it. */
static inline const berth_rms_norm_params *opck_matmul_y_norm(const berth_matmul_params *p)
{
    return BERTH_HAS(p, berth_matmul_params, y_norm) ? p->y_norm : NULL;
}
/* The matmul's norm before the product (x_pre), NULL when the caller's struct predates it. */
static inline const berth_rms_norm_params *opck_matmul_x_pre(const berth_matmul_params *p)
{
    return BERTH_HAS(p, berth_matmul_params, x_pre) ? p->x_pre : NULL;
}
/* The matmul's second product (y_then), NULL when the caller's struct predates it. */
static inline const berth_matmul_params *opck_matmul_y_then(const berth_matmul_params *p)
{
    return BERTH_HAS(p, berth_matmul_params, y_then) ? p->y_then : NULL;
}
/* The two views are the same tensor: buffer, offset, dtype, ne and nb. */
bool opck_same_view(const berth_tensor *a, const berth_tensor *b);
/* Prefix the recorded failure message (a nested op's check: "matmul: x_pre: " + "rms_norm: ..."); returns false. */
bool opck_prefix(struct opck *c, const char *prefix);
/* The matmul's gated epilogue (y_glu, BERTH_GLU_*), BERTH_GLU_NONE when the caller's struct predates it. */
static inline int32_t opck_matmul_glu(const berth_matmul_params *p)
{
    return BERTH_HAS(p, berth_matmul_params, y_glu_up) ? p->y_glu : BERTH_GLU_NONE;
}
/* rms_norm's RoPE pairs (0: no rotation) and output scale (1.0f for the default 0.0f), the defaults when the
 * caller's struct predates the ABI 0.3 fields (they were appended together: rope_freqs is the last). */
static inline int32_t opck_rms_rope_pairs(const berth_rms_norm_params *p)
{
    return BERTH_HAS(p, berth_rms_norm_params, rope_freqs) ? p->rope_n_pairs : 0;
}
/* rms_norm's second output is present (an older caller: never); `query`: a supports() query, where presence is
 * ne[0] != 0 (backend.h, optional tensors), else buf != NULL. */
static inline bool opck_rms_has_y2_in(const berth_rms_norm_params *p, bool query)
{
    return BERTH_HAS(p, berth_rms_norm_params, y2) && (query ? p->y2.ne[0] != 0 : p->y2.buf != NULL);
}
/* The same in execution (the backends' op code). */
static inline bool opck_rms_has_y2(const berth_rms_norm_params *p)
{
    return opck_rms_has_y2_in(p, false);
}
static inline float opck_rms_out_scale(const berth_rms_norm_params *p)
{
    return BERTH_HAS(p, berth_rms_norm_params, rope_freqs) && p->out_scale != 0.0f ? p->out_scale : 1.0f;
}
static inline bool opck_act_valid(int32_t act)
{
    return act >= BERTH_ACT_IDENTITY && act <= BERTH_ACT_EXP;
}
const char *opck_dtype_name(berth_dtype t);
size_t opck_dtype_size(berth_dtype t); /* 0 for unknown */

/* Per-op checks: everything berth/backend.h requires of the parameters, plus the backend's declared limits. */
bool opck_matmul(struct opck *c, const berth_matmul_params *p);
bool opck_get_rows(struct opck *c, const berth_get_rows_params *p);
bool opck_rms_norm(struct opck *c, const berth_rms_norm_params *p);
bool opck_layer_norm(struct opck *c, const berth_layer_norm_params *p);
bool opck_rope(struct opck *c, const berth_rope_params *p);
bool opck_unary(struct opck *c, const berth_unary_params *p);
bool opck_glu(struct opck *c, const berth_glu_params *p);
bool opck_binary(struct opck *c, const berth_binary_params *p);
bool opck_copy(struct opck *c, const berth_copy_params *p);
bool opck_kv_append(struct opck *c, const berth_kv_append_params *p);
/* kv_append carries the query side (ABI 0.5): the fields are there and q is present. */
static inline bool opck_kv_append_has_q(const struct opck *c, const berth_kv_append_params *p)
{
    return BERTH_HAS(p, berth_kv_append_params, q_norm) && opck_present(c, &p->q);
}
/* The same for an executor, after the checks passed: execution mode's presence rule (a buffer). */
static inline bool opck_kv_append_runs_q(const berth_kv_append_params *p)
{
    return BERTH_HAS(p, berth_kv_append_params, q_norm) && p->q.buf != NULL;
}
bool opck_attention(struct opck *c, const berth_attention_params *p);
bool opck_conv1d_causal(struct opck *c, const berth_conv1d_causal_params *p);
bool opck_gated_delta(struct opck *c, const berth_gated_delta_params *p);
bool opck_gated_rms_norm(struct opck *c, const berth_gated_rms_norm_params *p);
bool opck_log_softmax_topk(struct opck *c, const berth_log_softmax_topk_params *p);
bool opck_sample(struct opck *c, const berth_sample_params *p);
/* sample's per-row HOST arrays (they are host-visible on every backend, so both check them the same way before
 * any work): repetition penalties > 0, history ranges and ids in [0, V), output starts inside their row's range,
 * and values no backend can sample with (NaN temperature / top_p / penalties, min_p NaN or > 1: nothing would
 * survive to be drawn). *max_hist = the longest row history. Execution only. */
bool opck_sample_rows(struct opck *c, const berth_sample_params *p, int64_t V, int64_t *max_hist);
/* sample's history_output_start (ABI 0.3, appended), NULL when the caller's struct predates it. */
static inline const int32_t *opck_sample_output_start(const berth_sample_params *p)
{
    return BERTH_HAS(p, berth_sample_params, history_output_start) ? p->history_output_start : NULL;
}
/* Where row r's output (what presence/frequency count) begins in history: history_start[r] without
 * history_output_start (the whole history is output). history_start must be non-NULL. */
static inline int32_t opck_sample_row_output_start(const berth_sample_params *p, int32_t r)
{
    const int32_t *os = opck_sample_output_start(p);
    return os ? os[r] : p->history_start[r];
}

#ifdef __cplusplus
}
#endif
#endif

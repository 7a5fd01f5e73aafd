/*
 * op_check_ops.c — the per-op parameter checks of op_check.h: everything berth/backend.h requires of each op's
 * params (dtypes, shapes, combinations; in exec mode also buffers and bounds through the generic helpers), plus
 * the limits the backend declares in struct opck_backend. Moved from the CPU backend, messages unchanged.
 *
 * Data-dependent checks (ids, slots, block-table entries, seq_q_start values, sampling histories) are not here:
 * they need tensor contents, which each backend validates itself while executing.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "op_check.h"

/* Parameters that have one dtype whatever the backend (indices, RoPE frequencies, recurrent state, logits). */
#define OPCK_F32 BERTH_DTYPE_BIT(BERTH_DTYPE_F32)
#define OPCK_I32 BERTH_DTYPE_BIT(BERTH_DTYPE_I32)

/* Rows of a view: everything above ne[0]. */
static int64_t nrows(const berth_tensor *t)
{
    return t->ne[1] * t->ne[2] * t->ne[3];
}

static bool check_feature_vector(struct opck *c, const char *op, const char *name, const berth_tensor *t,
                                 int64_t n);

/* The gated epilogue's own parameters (y_glu != NONE): activation, accumulate 0, and for MUL the up operand. */
static bool check_matmul_glu(struct opck *c, const berth_matmul_params *p, int32_t glu, int64_t N)
{
    static const char op[] = "matmul";
    if (!opck_act_valid(p->y_glu_act))
        return opck_fail(c, BERTH_E_UNSUPPORTED, "matmul: y_glu_act %d is not supported", p->y_glu_act);
    if (p->accumulate != 0)
        return opck_fail(c, BERTH_E_INVALID, "matmul: the y_glu epilogue needs accumulate = 0, got %d", p->accumulate);
    if (glu != BERTH_GLU_MUL)
        return true;
    if (!opck_tensor(c, op, "y_glu_up", &p->y_glu_up, OPCK_F32, false))
        return false;
    if (p->y_glu_up.ne[0] != N || nrows(&p->y_glu_up) != nrows(&p->y))
        return opck_fail(c, BERTH_E_INVALID,
                         "matmul: y_glu_up must be ne {N %" PRId64 ", %" PRId64 " rows} like y, got ne[0] = %" PRId64
                         " with %" PRId64 " rows", N, nrows(&p->y), p->y_glu_up.ne[0], nrows(&p->y_glu_up));
    return true;
}

/* One product with its own norms (opck_matmul checks the second product of a pair with it too). */
static bool check_matmul_one(struct opck *c, const berth_matmul_params *p)
{
    static const char op[] = "matmul";
    if (!opck_struct_size(c, op, p->struct_size, BERTH_SIZE_TO(berth_matmul_params, y)))
        return false;
    if (!opck_tensor(c, op, "x", &p->x, c->be->act_dtypes, false) ||
        !opck_tensor(c, op, "w", &p->w, c->be->weight_dtypes, false) ||
        !opck_tensor(c, op, "y", &p->y, c->be->act_dtypes, true))
        return false;
    const int32_t glu = opck_matmul_glu(p);
    if (glu != BERTH_GLU_NONE && glu != BERTH_GLU_HALVES && glu != BERTH_GLU_MUL)
        return opck_fail(c, BERTH_E_UNSUPPORTED, "matmul: y_glu %d is not supported", glu);
    /* W has K-wide rows: N of them, or 2N (gate rows, then up rows) for the HALVES epilogue; y is N wide. */
    const int64_t K = p->w.ne[0], WN = p->w.ne[1], N = glu == BERTH_GLU_HALVES ? WN / 2 : WN;
    if (p->w.ne[2] != 1 || p->w.ne[3] != 1)
        return opck_fail(c, BERTH_E_INVALID,
                         "matmul: w must be 2-D ne {K, N}, got ne[2] = %" PRId64 ", ne[3] = %" PRId64, p->w.ne[2],
                         p->w.ne[3]);
    if (WN > 1 && p->w.nb[1] != K * p->w.nb[0])
        return opck_fail(c, BERTH_E_UNSUPPORTED, "matmul: w must be packed (nb[1] = %" PRId64 ", expected %" PRId64 ")",
                         p->w.nb[1], K * p->w.nb[0]);
    if (p->x.ne[0] != K)
        return opck_fail(c, BERTH_E_INVALID, "matmul: x ne[0] = %" PRId64 " but w ne[0] (K) = %" PRId64, p->x.ne[0], K);
    if (glu == BERTH_GLU_HALVES && WN != 2 * p->y.ne[0])
        return opck_fail(c, BERTH_E_INVALID,
                         "matmul: y_glu HALVES needs w ne[1] = 2 * y ne[0] (%" PRId64 "), got %" PRId64,
                         2 * p->y.ne[0], WN);
    if (p->y.ne[0] != N)
        return opck_fail(c, BERTH_E_INVALID, "matmul: y ne[0] = %" PRId64 " but w ne[1] (N) = %" PRId64, p->y.ne[0], N);
    if (nrows(&p->y) != nrows(&p->x))
        return opck_fail(c, BERTH_E_INVALID, "matmul: y has %" PRId64 " rows but x has %" PRId64, nrows(&p->y),
                         nrows(&p->x));
    if (p->accumulate != 0 && p->accumulate != 1)
        return opck_fail(c, BERTH_E_INVALID, "matmul: accumulate = %d must be 0 or 1", p->accumulate);
    if (opck_present(c, &p->bias) && !(opck_tensor(c, op, "bias", &p->bias, c->be->weight_dtypes, false) &&
                                         opck_vector(c, op, "bias", &p->bias, WN)))
        return false;
    if (glu != BERTH_GLU_NONE && !check_matmul_glu(c, p, glu, N))
        return false;
    const berth_rms_norm_params *yn = opck_matmul_y_norm(p);
    if (yn) {
        /* the trailing norm: an rms_norm of its own whose x is this product's y, without RoPE */
        if (!opck_same_view(&yn->x, &p->y))
            return opck_fail(c, BERTH_E_INVALID, "matmul: y_norm's x must be the matmul's y (same buffer, offset, "
                             "dtype, shape and strides)");
        if (!opck_rms_norm(c, yn))
            return opck_prefix(c, "matmul: y_norm: ");
        if (opck_rms_rope_pairs(yn) != 0)
            return opck_fail(c, BERTH_E_UNSUPPORTED, "matmul: y_norm cannot apply RoPE");
        if (p->accumulate != 0)
            return opck_fail(c, BERTH_E_UNSUPPORTED, "matmul: y_norm needs accumulate 0");
    }
    const berth_rms_norm_params *xp = opck_matmul_x_pre(p);
    if (xp) {
        /* the norm before the product: an rms_norm of its own whose y2 (else y) is this product's x, no RoPE */
        if (!opck_rms_norm(c, xp))
            return opck_prefix(c, "matmul: x_pre: ");
        if (opck_rms_rope_pairs(xp) != 0)
            return opck_fail(c, BERTH_E_UNSUPPORTED, "matmul: x_pre cannot apply RoPE");
        const bool y2 = opck_rms_has_y2_in(xp, !c->exec);
        if (!opck_same_view(y2 ? &xp->y2 : &xp->y, &p->x))
            return opck_fail(c, BERTH_E_INVALID,
                             "matmul: x must be x_pre's %s (same buffer, offset, dtype, shape and strides)",
                             y2 ? "y2" : "y");
        if (opck_matmul_norm_mode(p) != BERTH_NORM_W_NONE)
            return opck_fail(c, BERTH_E_UNSUPPORTED, "matmul: x_pre and an x_norm prologue cannot be combined");
        if (yn)
            return opck_fail(c, BERTH_E_UNSUPPORTED, "matmul: x_pre and y_norm cannot be combined");
    }
    const int32_t norm = opck_matmul_norm_mode(p);
    if (norm == BERTH_NORM_W_NONE)
        return true;
    if (norm != BERTH_NORM_W && norm != BERTH_NORM_W_ONE_PLUS && norm != BERTH_NORM_UNIT)
        return opck_fail(c, BERTH_E_UNSUPPORTED, "matmul: x_norm_mode %d is not supported", norm);
    if (!(p->x_norm_eps > 0.0f) || !isfinite(p->x_norm_eps))
        return opck_fail(c, BERTH_E_INVALID, "matmul: x_norm_eps = %g must be positive and finite",
                         (double)p->x_norm_eps);
    if (p->x.dtype != BERTH_DTYPE_F32)
        return opck_fail(c, BERTH_E_UNSUPPORTED, "matmul: the x_norm prologue needs x f32, got %s",
                         opck_dtype_name(p->x.dtype));
    if (opck_norm_has_weight(norm))
        return check_feature_vector(c, op, "x_norm_w", &p->x_norm_w, K);
    return true;
}

bool opck_matmul(struct opck *c, const berth_matmul_params *p)
{
    if (!check_matmul_one(c, p))
        return false;
    const berth_matmul_params *q = opck_matmul_y_then(p);
    if (!q)
        return true;
    /* the second product of a pair: a matmul of its own whose x is this product's y, with at most a y_norm */
    if (opck_matmul_y_norm(p))
        return opck_fail(c, BERTH_E_UNSUPPORTED, "matmul: y_then and y_norm cannot be combined");
    if (p->accumulate != 0)
        return opck_fail(c, BERTH_E_UNSUPPORTED, "matmul: y_then needs accumulate 0");
    /* its own rules after the pair's: a forbidden part is named as such, not by that part's own checks */
    if (!opck_struct_size(c, "matmul", q->struct_size, BERTH_SIZE_TO(berth_matmul_params, y)))
        return opck_prefix(c, "matmul: y_then: ");
    if (opck_matmul_x_pre(q) || opck_matmul_norm_mode(q) != BERTH_NORM_W_NONE || q->accumulate != 0 ||
        opck_matmul_y_then(q))
        return opck_fail(c, BERTH_E_UNSUPPORTED,
                         "matmul: y_then may have no x_pre, x_norm prologue, accumulate or y_then of its own");
    if (!check_matmul_one(c, q))
        return opck_prefix(c, "matmul: y_then: ");
    if (!opck_same_view(&q->x, &p->y))
        return opck_fail(c, BERTH_E_INVALID, "matmul: y_then's x must be the matmul's y (same buffer, offset, dtype, "
                         "shape and strides)");
    return true;
}

bool opck_get_rows(struct opck *c, const berth_get_rows_params *p)
{
    static const char op[] = "get_rows";
    if (!opck_struct_size(c, op, p->struct_size, BERTH_SIZE_TO(berth_get_rows_params, y)))
        return false;
    if (!opck_tensor(c, op, "table", &p->table, c->be->weight_dtypes, false) ||
        !opck_tensor(c, op, "ids", &p->ids, OPCK_I32, false) ||
        !opck_tensor(c, op, "y", &p->y, c->be->act_dtypes, true))
        return false;
    if (p->table.ne[2] != 1 || p->table.ne[3] != 1)
        return opck_fail(c, BERTH_E_INVALID, "get_rows: table must be 2-D ne {D, N}");
    if (!opck_vector(c, op, "ids", &p->ids, -1))
        return false;
    if (p->y.ne[0] != p->table.ne[0])
        return opck_fail(c, BERTH_E_INVALID, "get_rows: y ne[0] = %" PRId64 " but table ne[0] (D) = %" PRId64,
                         p->y.ne[0], p->table.ne[0]);
    if (nrows(&p->y) != p->ids.ne[0])
        return opck_fail(c, BERTH_E_INVALID, "get_rows: y has %" PRId64 " rows but ids has %" PRId64 " entries",
                         nrows(&p->y), p->ids.ne[0]);
    return true;
}

/* RoPE's operands as rope, rms_norm and kv_append take them: positions i32 ne {T}; freqs f32 ne {n_pairs}. */
static bool check_rope_tensors(struct opck *c, const char *op, const char *pos_name, const berth_tensor *positions,
                               int64_t T, const char *freqs_name, const berth_tensor *freqs, int32_t n_pairs)
{
    if (!opck_tensor(c, op, pos_name, positions, OPCK_I32, false) || !opck_vector(c, op, pos_name, positions, T))
        return false;
    if (n_pairs > 0)
        return opck_tensor(c, op, freqs_name, freqs, OPCK_F32, false) &&
               opck_vector(c, op, freqs_name, freqs, n_pairs);
    return true;
}

/* Checks shared by rms_norm and layer_norm: x/y/residual f32 of one shape, the residual mode. */
static bool check_norm_common(struct opck *c, const char *op, int32_t resid_mode, const berth_tensor *x,
                              const berth_tensor *residual, const berth_tensor *y)
{
    if (resid_mode < BERTH_RESID_NONE || resid_mode > BERTH_RESID_ADD_BEFORE)
        return opck_fail(c, BERTH_E_UNSUPPORTED, "%s: resid_mode %d is not supported", op, resid_mode);
    if (!opck_tensor(c, op, "x", x, c->be->act_dtypes, false) || !opck_tensor(c, op, "y", y, c->be->act_dtypes, true) ||
        !opck_same_shape(c, op, "y", y, "x", x))
        return false;
    if (resid_mode != BERTH_RESID_NONE)
        return opck_tensor(c, op, "residual", residual, c->be->act_dtypes, resid_mode == BERTH_RESID_ADD_BEFORE) &&
               opck_same_shape(c, op, "residual", residual, "x", x);
    return true;
}

/* A per-feature vector (norm weight or bias) of n elements, any weight dtype. */
static bool check_feature_vector(struct opck *c, const char *op, const char *name, const berth_tensor *t,
                                 int64_t n)
{
    return opck_tensor(c, op, name, t, c->be->weight_dtypes, false) && opck_vector(c, op, name, t, n);
}

bool opck_rms_norm(struct opck *c, const berth_rms_norm_params *p)
{
    static const char op[] = "rms_norm";
    if (!opck_struct_size(c, op, p->struct_size, BERTH_SIZE_TO(berth_rms_norm_params, y)))
        return false;
    if (p->weight_mode < BERTH_NORM_W_NONE || p->weight_mode > BERTH_NORM_UNIT)
        return opck_fail(c, BERTH_E_UNSUPPORTED, "rms_norm: weight_mode %d is not supported", p->weight_mode);
    if (!check_norm_common(c, op, p->resid_mode, &p->x, &p->residual, &p->y))
        return false;
    if (opck_norm_has_weight(p->weight_mode) && /* W_NONE and UNIT: no weight */
        !check_feature_vector(c, op, "w", &p->w, p->x.ne[0]))
        return false;
    if (!BERTH_HAS(p, berth_rms_norm_params, rope_freqs))
        return true; /* an ABI 0.2 caller: no rotation, no scale */
    if (!isfinite(p->out_scale))
        return opck_fail(c, BERTH_E_INVALID, "rms_norm: out_scale %g must be finite", (double)p->out_scale);
    const int32_t pairs = p->rope_n_pairs;
    if (pairs < 0)
        return opck_fail(c, BERTH_E_INVALID, "rms_norm: rope_n_pairs %d is negative", pairs);
    if (opck_rms_has_y2_in(p, !c->exec)) {
        if (pairs > 0)
            return opck_fail(c, BERTH_E_UNSUPPORTED, "rms_norm: a second output (y2) and RoPE cannot be combined");
        if (p->y2_weight_mode < BERTH_NORM_W_NONE || p->y2_weight_mode > BERTH_NORM_UNIT)
            return opck_fail(c, BERTH_E_UNSUPPORTED, "rms_norm: y2_weight_mode %d is not supported",
                             p->y2_weight_mode);
        if (!opck_tensor(c, op, "y2", &p->y2, c->be->act_dtypes, true) ||
            !opck_same_shape(c, op, "y2", &p->y2, "y", &p->y))
            return false;
        if (p->y2.dtype != BERTH_DTYPE_F32)
            return opck_fail(c, BERTH_E_UNSUPPORTED, "rms_norm: y2 must be f32, got %s", opck_dtype_name(p->y2.dtype));
        /* no shared bytes (a query's NULL buffers never overlap): kernels read x, y and the residual of other
         * rows after writing a row of y2 */
        if (opck_views_overlap(&p->y2, &p->y))
            return opck_fail(c, BERTH_E_INVALID, "rms_norm: y2 overlaps y");
        if (opck_views_overlap(&p->y2, &p->x))
            return opck_fail(c, BERTH_E_INVALID, "rms_norm: y2 overlaps x");
        if (p->resid_mode != BERTH_RESID_NONE && opck_views_overlap(&p->y2, &p->residual))
            return opck_fail(c, BERTH_E_INVALID, "rms_norm: y2 overlaps the residual");
        if (opck_norm_has_weight(p->y2_weight_mode) && !check_feature_vector(c, op, "y2_w", &p->y2_w, p->x.ne[0]))
            return false;
    }
    if (pairs == 0)
        return true;
    if (p->resid_mode != BERTH_RESID_NONE)
        return opck_fail(c, BERTH_E_UNSUPPORTED, "rms_norm: RoPE (rope_n_pairs %d) needs resid_mode NONE, got %d",
                         pairs, p->resid_mode);
    /* rows are (head, token) pairs: x ne {d, heads, T} (higher dims flattened into T) */
    const int64_t heads = p->x.ne[1], T = heads > 0 ? nrows(&p->x) / heads : 0;
    return opck_rope_pairs(c, op, p->rope_mode, p->rope_pair_offset, pairs, p->x.ne[0]) &&
           check_rope_tensors(c, op, "rope_positions", &p->rope_positions, T, "rope_freqs", &p->rope_freqs, pairs);
}

bool opck_layer_norm(struct opck *c, const berth_layer_norm_params *p)
{
    static const char op[] = "layer_norm";
    if (!opck_struct_size(c, op, p->struct_size, BERTH_SIZE_TO(berth_layer_norm_params, y)))
        return false;
    if (!check_norm_common(c, op, p->resid_mode, &p->x, &p->residual, &p->y))
        return false;
    if (opck_present(c, &p->w) && !check_feature_vector(c, op, "w", &p->w, p->x.ne[0]))
        return false;
    if (opck_present(c, &p->b) && !check_feature_vector(c, op, "b", &p->b, p->x.ne[0]))
        return false;
    return true;
}

bool opck_rope(struct opck *c, const berth_rope_params *p)
{
    static const char op[] = "rope";
    if (!opck_struct_size(c, op, p->struct_size, BERTH_SIZE_TO(berth_rope_params, y)))
        return false;
    if (!opck_tensor(c, op, "x", &p->x, c->be->act_dtypes, false) ||
        !opck_tensor(c, op, "y", &p->y, c->be->act_dtypes, true) ||
        !opck_same_shape(c, op, "y", &p->y, "x", &p->x))
        return false;
    if (p->x.ne[3] != 1)
        return opck_fail(c, BERTH_E_INVALID, "rope: x must be ne {d, heads, T}, got ne[3] = %" PRId64, p->x.ne[3]);
    return opck_rope_pairs(c, op, p->mode, p->pair_offset, p->n_pairs, p->x.ne[0]) &&
           check_rope_tensors(c, op, "positions", &p->positions, p->x.ne[2], "freqs", &p->freqs, p->n_pairs);
}

bool opck_unary(struct opck *c, const berth_unary_params *p)
{
    static const char op[] = "unary";
    if (!opck_struct_size(c, op, p->struct_size, BERTH_SIZE_TO(berth_unary_params, y)))
        return false;
    if (!opck_act_valid(p->act))
        return opck_fail(c, BERTH_E_UNSUPPORTED, "unary: activation %d is not supported", p->act);
    return opck_tensor(c, op, "x", &p->x, c->be->act_dtypes, false) &&
           opck_tensor(c, op, "y", &p->y, c->be->act_dtypes, true) &&
           opck_same_shape(c, op, "y", &p->y, "x", &p->x);
}

bool opck_glu(struct opck *c, const berth_glu_params *p)
{
    static const char op[] = "glu";
    if (!opck_struct_size(c, op, p->struct_size, BERTH_SIZE_TO(berth_glu_params, y)))
        return false;
    if (!opck_act_valid(p->act))
        return opck_fail(c, BERTH_E_UNSUPPORTED, "glu: activation %d is not supported", p->act);
    return opck_tensor(c, op, "gate", &p->gate, c->be->act_dtypes, false) &&
           opck_tensor(c, op, "up", &p->up, c->be->act_dtypes, false) &&
           opck_tensor(c, op, "y", &p->y, c->be->act_dtypes, true) &&
           opck_same_shape(c, op, "up", &p->up, "gate", &p->gate) &&
           opck_same_shape(c, op, "y", &p->y, "gate", &p->gate);
}

bool opck_binary(struct opck *c, const berth_binary_params *p)
{
    static const char op[] = "binary";
    if (!opck_struct_size(c, op, p->struct_size, BERTH_SIZE_TO(berth_binary_params, y)))
        return false;
    if (p->op != BERTH_BINARY_ADD && p->op != BERTH_BINARY_MUL)
        return opck_fail(c, BERTH_E_UNSUPPORTED, "binary: op %d is not supported", p->op);
    if (!opck_tensor(c, op, "a", &p->a, c->be->act_dtypes, false) ||
        !opck_tensor(c, op, "b", &p->b, c->be->weight_dtypes, false) ||
        !opck_tensor(c, op, "y", &p->y, c->be->act_dtypes, true) || !opck_same_shape(c, op, "y", &p->y, "a", &p->a))
        return false;
    for (int i = 0; i < 4; i++)
        if (p->b.ne[i] != 1 && p->b.ne[i] != p->a.ne[i])
            return opck_fail(c, BERTH_E_INVALID, "binary: b ne[%d] = %" PRId64 " must be 1 or a's %" PRId64, i,
                             p->b.ne[i], p->a.ne[i]);
    return true;
}

bool opck_copy(struct opck *c, const berth_copy_params *p)
{
    static const char op[] = "copy";
    if (!opck_struct_size(c, op, p->struct_size, BERTH_SIZE_TO(berth_copy_params, y)))
        return false;
    return opck_tensor(c, op, "x", &p->x, c->be->weight_dtypes, false) &&
           opck_tensor(c, op, "y", &p->y, c->be->weight_dtypes, true) &&
           opck_same_shape(c, op, "y", &p->y, "x", &p->x);
}

/* The backend's limit on head sizes (attn_max_head_dim, 0 = none): attention and kv_append alike, so a cache
 * this backend could not attend over is never written either. */
static bool check_head_dims(struct opck *c, const char *op, const berth_kv_view *kv)
{
    const int32_t most = c->be->attn_max_head_dim;
    if (most > 0 && (kv->head_dim > most || kv->head_dim_v > most))
        return opck_fail(c, BERTH_E_UNSUPPORTED, "%s: head_dim %d / head_dim_v %d exceeds this backend's limit of %d",
                         op, kv->head_dim, kv->head_dim_v, most);
    return true;
}

/* Whether q and x (both ne {d, heads, T}, f32) share an element. Views of one fused projection output (Gemma's
 * q|k|v rows) interleave token by token, so their byte spans overlap while their elements do not: with one token
 * stride P, each token's row of q is [qo, qo + qspan) and of x [xo, xo + xspan) modulo P, and they are disjoint
 * when those per-token intervals are. Otherwise the span test decides (conservative). */
static bool q_shares_elements(const berth_tensor *q, const berth_tensor *x)
{
    if (!opck_views_overlap(q, x))
        return false;
    const int64_t P = q->nb[2];
    if (q->buf != x->buf || x->nb[2] != P || P <= 0 || q->nb[1] < 0 || x->nb[1] < 0 || q->ne[2] != x->ne[2])
        return true;
    const int64_t qspan = (q->ne[1] - 1) * q->nb[1] + q->ne[0] * 4, xspan = (x->ne[1] - 1) * x->nb[1] + x->ne[0] * 4;
    if (qspan > P || xspan > P)
        return true;
    int64_t d = ((int64_t)x->offset - (int64_t)q->offset) % P; /* x's row start relative to q's, in [0, P) */
    if (d < 0)
        d += P;
    return d < qspan || d + xspan > P; /* x's row starts inside q's, or wraps into the next token's q */
}

/* Whether view t may touch kv's pool: t in a pool buffer with its byte span inside the blocks' range (conservative:
 * the range of the whole blocks from the lower of the two pool offsets). */
static bool kv_pool_overlaps(const berth_tensor *t, const berth_kv_view *kv)
{
    if (t->buf != kv->k_buf && t->buf != kv->v_buf)
        return false;
    berth_tensor pool;
    memset(&pool, 0, sizeof pool);
    pool.buf = t->buf;
    pool.dtype = BERTH_DTYPE_U8;
    pool.ndim = 1;
    pool.offset = kv->k_offset < kv->v_offset ? kv->k_offset : kv->v_offset;
    const uint64_t hi = (kv->k_offset > kv->v_offset ? kv->k_offset : kv->v_offset) +
                        (uint64_t)kv->n_blocks * kv->block_stride;
    pool.ne[0] = (int64_t)(hi - pool.offset);
    pool.ne[1] = pool.ne[2] = pool.ne[3] = 1;
    pool.nb[0] = 1;
    pool.nb[1] = pool.nb[2] = pool.nb[3] = pool.ne[0];
    return opck_views_overlap(t, &pool);
}

/* One of kv_append's norms (side "k", "v" or "q"): a mode it knows, and in the weighted modes a weight vector of n
 * elements in a weight dtype. */
static bool check_kv_norm(struct opck *c, const char *side, int32_t mode, const berth_tensor *w, int64_t n)
{
    static const char op[] = "kv_append";
    char name[8];
    snprintf(name, sizeof name, "%s_norm", side);
    if (mode < BERTH_NORM_W_NONE || mode > BERTH_NORM_UNIT)
        return opck_fail(c, BERTH_E_UNSUPPORTED, "kv_append: %s_mode %d is not supported", name, mode);
    if (!opck_norm_has_weight(mode))
        return true;
    if (!opck_present(c, w))
        return opck_fail(c, BERTH_E_INVALID, "kv_append: %s_mode %d needs the %s weight, which is absent", name, mode,
                         name);
    return opck_tensor(c, op, name, w, c->be->weight_dtypes, false) && opck_vector(c, op, name, w, n);
}

bool opck_kv_append(struct opck *c, const berth_kv_append_params *p)
{
    static const char op[] = "kv_append";
    if (!opck_struct_size(c, op, p->struct_size, BERTH_SIZE_TO(berth_kv_append_params, kv)))
        return false;
    const berth_kv_view *kv = &p->kv;
    if (!opck_kv_view(c, op, kv) || !check_head_dims(c, op, kv))
        return false;
    if (c->exec) {
        uintptr_t addr;
        uint64_t size;
        int k_read_only, v_read_only;
        c->be->buffer_facts(kv->k_buf, &addr, &size, &k_read_only);
        c->be->buffer_facts(kv->v_buf, &addr, &size, &v_read_only);
        if (k_read_only || v_read_only)
            return opck_fail(c, BERTH_E_INVALID, "kv_append: the KV cache is in a read-only buffer");
    }
    if (!opck_tensor(c, op, "k", &p->k, c->be->act_dtypes, false) ||
        !opck_tensor(c, op, "v", &p->v, c->be->act_dtypes, false) ||
        !opck_tensor(c, op, "slots", &p->slots, OPCK_I32, false))
        return false;
    const int64_t T = p->k.ne[2];
    if (p->k.ne[0] != kv->head_dim || p->k.ne[1] != kv->n_kv_heads || p->k.ne[3] != 1)
        return opck_fail(c, BERTH_E_INVALID,
                         "kv_append: k must be ne {head_dim %d, n_kv_heads %d, T}, got {%" PRId64 ", %" PRId64
                         ", %" PRId64 ", %" PRId64 "}", kv->head_dim, kv->n_kv_heads, p->k.ne[0], p->k.ne[1],
                         p->k.ne[2], p->k.ne[3]);
    if (p->v.ne[0] != kv->head_dim_v || p->v.ne[1] != kv->n_kv_heads || p->v.ne[2] != T || p->v.ne[3] != 1)
        return opck_fail(c, BERTH_E_INVALID,
                         "kv_append: v must be ne {head_dim_v %d, n_kv_heads %d, T %" PRId64 "}, got {%" PRId64
                         ", %" PRId64 ", %" PRId64 ", %" PRId64 "}", kv->head_dim_v, kv->n_kv_heads, T, p->v.ne[0],
                         p->v.ne[1], p->v.ne[2], p->v.ne[3]);
    if (!opck_vector(c, op, "slots", &p->slots, T))
        return false;
    if (!check_kv_norm(c, "k", p->k_norm_mode, &p->k_norm, kv->head_dim) ||
        !check_kv_norm(c, "v", p->v_norm_mode, &p->v_norm, kv->head_dim_v))
        return false;
    if (p->rope_n_pairs != 0) {
        if (!opck_rope_pairs(c, op, p->rope_mode, p->rope_pair_offset, p->rope_n_pairs, kv->head_dim) ||
            !check_rope_tensors(c, op, "positions", &p->positions, T, "rope_freqs", &p->rope_freqs, p->rope_n_pairs))
            return false;
    }
    if (!opck_kv_append_has_q(c, p))
        return true;
    /* the query side (ABI 0.5): q normalised and rotated in place */
    if (!opck_tensor(c, op, "q", &p->q, OPCK_F32, true))
        return false;
    if (p->q.ne[0] != kv->head_dim || p->q.ne[1] < 1 || p->q.ne[2] != T || p->q.ne[3] != 1)
        return opck_fail(c, BERTH_E_INVALID,
                         "kv_append: q must be ne {head_dim %d, n_q_heads, T %" PRId64 "}, got {%" PRId64 ", %" PRId64
                         ", %" PRId64 ", %" PRId64 "}", kv->head_dim, T, p->q.ne[0], p->q.ne[1], p->q.ne[2],
                         p->q.ne[3]);
    if (!check_kv_norm(c, "q", p->q_norm_mode, &p->q_norm, kv->head_dim))
        return false;
    if (c->exec) { /* q is written in place while the other tensors are read, in any order */
        if (q_shares_elements(&p->q, &p->k) || q_shares_elements(&p->q, &p->v))
            return opck_fail(c, BERTH_E_INVALID, "kv_append: q shares elements with k or v");
        const berth_tensor *const others[] = {&p->slots, &p->positions, &p->rope_freqs, &p->k_norm, &p->v_norm,
                                              &p->q_norm};
        for (size_t i = 0; i < sizeof others / sizeof others[0]; i++)
            if (opck_present(c, others[i]) && opck_views_overlap(&p->q, others[i]))
                return opck_fail(c, BERTH_E_INVALID, "kv_append: q overlaps one of its other inputs");
        if (kv_pool_overlaps(&p->q, kv))
            return opck_fail(c, BERTH_E_INVALID, "kv_append: q overlaps the KV cache");
    }
    return true;
}

bool opck_attention(struct opck *c, const berth_attention_params *p)
{
    static const char op[] = "attention";
    if (!opck_struct_size(c, op, p->struct_size, BERTH_SIZE_TO(berth_attention_params, kv)))
        return false;
    const berth_kv_view *kv = &p->kv;
    if (p->mask != BERTH_MASK_CAUSAL && p->mask != BERTH_MASK_NONE)
        return opck_fail(c, BERTH_E_UNSUPPORTED, "attention: mask %d is not supported", p->mask);
    if (p->window < 0)
        return opck_fail(c, BERTH_E_INVALID, "attention: window %d is negative", p->window);
    if (p->window > 0 && p->mask != BERTH_MASK_CAUSAL)
        return opck_fail(c, BERTH_E_UNSUPPORTED, "attention: a sliding window (%d) needs the causal mask", p->window);
    if (!(p->softcap >= 0.0f))
        return opck_fail(c, BERTH_E_INVALID, "attention: softcap %g must be >= 0", (double)p->softcap);
    if (p->n_seqs < 0)
        return opck_fail(c, BERTH_E_INVALID, "attention: n_seqs %d is negative", p->n_seqs);
    if (!opck_kv_view(c, op, kv) || !check_head_dims(c, op, kv))
        return false;
    if (!opck_tensor(c, op, "q", &p->q, c->be->act_dtypes, false) ||
        !opck_tensor(c, op, "out", &p->out, c->be->act_dtypes, true))
        return false;
    const int64_t H = p->q.ne[1], T = p->q.ne[2];
    if (p->q.ne[0] != kv->head_dim || p->q.ne[3] != 1)
        return opck_fail(c, BERTH_E_INVALID, "attention: q must be ne {head_dim %d, n_heads, T}, got ne[0] = %" PRId64
                         ", ne[3] = %" PRId64, kv->head_dim, p->q.ne[0], p->q.ne[3]);
    if (p->out.ne[0] != kv->head_dim_v || p->out.ne[1] != H || p->out.ne[2] != T || p->out.ne[3] != 1)
        return opck_fail(c, BERTH_E_INVALID, "attention: out must be ne {head_dim_v %d, n_heads %" PRId64 ", T %" PRId64
                         "}, got {%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "}", kv->head_dim_v, H, T,
                         p->out.ne[0], p->out.ne[1], p->out.ne[2], p->out.ne[3]);
    if (H % kv->n_kv_heads != 0)
        return opck_fail(c, BERTH_E_INVALID, "attention: n_heads %" PRId64 " is not a multiple of n_kv_heads %d", H,
                         kv->n_kv_heads);
    if (c->be->attn_max_rep > 0 && H / kv->n_kv_heads > c->be->attn_max_rep)
        return opck_fail(c, BERTH_E_UNSUPPORTED, "attention: %" PRId64 " query heads per KV head (most: %d)",
                         H / kv->n_kv_heads, c->be->attn_max_rep);
    if (opck_present(c, &p->gate) &&
        (!opck_tensor(c, op, "gate", &p->gate, c->be->act_dtypes, false) ||
         !opck_same_shape(c, op, "gate", &p->gate, "out", &p->out)))
        return false;
    if (!opck_tensor(c, op, "positions", &p->positions, OPCK_I32, false) ||
        !opck_vector(c, op, "positions", &p->positions, T) ||
        !opck_tensor(c, op, "seq_q_start", &p->seq_q_start, OPCK_I32, false) ||
        !opck_vector(c, op, "seq_q_start", &p->seq_q_start, (int64_t)p->n_seqs + 1) ||
        !opck_tensor(c, op, "seq_kv_len", &p->seq_kv_len, OPCK_I32, false) ||
        !opck_vector(c, op, "seq_kv_len", &p->seq_kv_len, p->n_seqs) ||
        !opck_tensor(c, op, "block_table", &p->block_table, OPCK_I32, false))
        return false;
    if (p->block_table.ne[1] != p->n_seqs || p->block_table.ne[2] != 1 || p->block_table.ne[3] != 1)
        return opck_fail(c, BERTH_E_INVALID,
                         "attention: block_table must be ne {max_blocks, n_seqs %d}, got ne[1] = %" PRId64, p->n_seqs,
                         p->block_table.ne[1]);
    return true;
}

static bool check_seq_tensors(struct opck *c, const char *op, const berth_tensor *seq_q_start,
                              const berth_tensor *state_slots, int32_t n_seqs)
{
    if (n_seqs < 0)
        return opck_fail(c, BERTH_E_INVALID, "%s: n_seqs %d is negative", op, n_seqs);
    return opck_tensor(c, op, "state_slots", state_slots, OPCK_I32, false) &&
           opck_vector(c, op, "state_slots", state_slots, n_seqs) &&
           opck_tensor(c, op, "seq_q_start", seq_q_start, OPCK_I32, false) &&
           opck_vector(c, op, "seq_q_start", seq_q_start, (int64_t)n_seqs + 1);
}

bool opck_conv1d_causal(struct opck *c, const berth_conv1d_causal_params *p)
{
    static const char op[] = "conv1d_causal";
    if (!opck_struct_size(c, op, p->struct_size, BERTH_SIZE_TO(berth_conv1d_causal_params, seq_q_start)))
        return false;
    if (!opck_act_valid(p->act))
        return opck_fail(c, BERTH_E_UNSUPPORTED, "conv1d_causal: activation %d is not supported", p->act);
    if (!opck_tensor(c, op, "x", &p->x, c->be->act_dtypes, false) ||
        !opck_tensor(c, op, "w", &p->w, c->be->weight_dtypes, false) ||
        !opck_tensor(c, op, "y", &p->y, c->be->act_dtypes, true) ||
        !opck_tensor(c, op, "state", &p->state, OPCK_F32, true) ||
        !check_seq_tensors(c, op, &p->seq_q_start, &p->state_slots, p->n_seqs))
        return false;
    const int64_t C = p->x.ne[0], K = p->w.ne[0];
    if (p->x.ne[2] != 1 || p->x.ne[3] != 1)
        return opck_fail(c, BERTH_E_INVALID, "conv1d_causal: x must be 2-D ne {C, T}");
    if (!opck_same_shape(c, op, "y", &p->y, "x", &p->x))
        return false;
    if (p->w.ne[1] != C || p->w.ne[2] != 1 || p->w.ne[3] != 1)
        return opck_fail(c, BERTH_E_INVALID, "conv1d_causal: w must be ne {K, C %" PRId64 "}, got ne[1] = %" PRId64, C,
                         p->w.ne[1]);
    if (c->be->conv_max_k > 0 && (K < 1 || K > c->be->conv_max_k))
        return opck_fail(c, BERTH_E_UNSUPPORTED, "conv1d_causal: kernel width %" PRId64 " is not in 1..%d", K,
                         c->be->conv_max_k);
    if (K < 1)
        return opck_fail(c, BERTH_E_UNSUPPORTED, "conv1d_causal: kernel width %" PRId64 " is not >= 1", K);
    if (p->state.ne[0] != K - 1 || p->state.ne[1] != C || p->state.ne[3] != 1)
        return opck_fail(c, BERTH_E_INVALID, "conv1d_causal: state must be ne {K-1 %" PRId64 ", C %" PRId64
                         ", n_slots}, got {%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "}", K - 1, C,
                         p->state.ne[0], p->state.ne[1], p->state.ne[2], p->state.ne[3]);
    if (opck_present(c, &p->bias))
        return opck_tensor(c, op, "bias", &p->bias, c->be->weight_dtypes, false) &&
               opck_vector(c, op, "bias", &p->bias, C);
    return true;
}

bool opck_gated_delta(struct opck *c, const berth_gated_delta_params *p)
{
    static const char op[] = "gated_delta";
    if (!opck_struct_size(c, op, p->struct_size, BERTH_SIZE_TO(berth_gated_delta_params, seq_q_start)))
        return false;
    if (p->qk_l2norm != 0 && p->qk_l2norm != 1)
        return opck_fail(c, BERTH_E_INVALID, "gated_delta: qk_l2norm = %d must be 0 or 1", p->qk_l2norm);
    if (p->chunk_size < 0)
        return opck_fail(c, BERTH_E_INVALID, "gated_delta: chunk_size %d is negative", p->chunk_size);
    static const char *const names[] = {"q", "k", "v", "g", "beta", "out"};
    const berth_tensor *ts[] = {&p->q, &p->k, &p->v, &p->g, &p->beta, &p->out};
    for (int i = 0; i < 6; i++)
        if (!opck_tensor(c, op, names[i], ts[i], c->be->act_dtypes, i == 5))
            return false;
    if (!opck_tensor(c, op, "state", &p->state, OPCK_F32, true) ||
        !check_seq_tensors(c, op, &p->seq_q_start, &p->state_slots, p->n_seqs))
        return false;
    const int64_t dk = p->q.ne[0], Hk = p->q.ne[1], T = p->q.ne[2], dv = p->v.ne[0], Hv = p->v.ne[1];
    if (p->q.ne[3] != 1 || !opck_same_shape(c, op, "k", &p->k, "q", &p->q))
        return p->q.ne[3] != 1 ? opck_fail(c, BERTH_E_INVALID, "gated_delta: q must be ne {d_k, n_k_heads, T}") : false;
    if (p->v.ne[2] != T || p->v.ne[3] != 1)
        return opck_fail(c, BERTH_E_INVALID, "gated_delta: v must be ne {d_v, n_v_heads, T %" PRId64 "}", T);
    if (!opck_same_shape(c, op, "out", &p->out, "v", &p->v))
        return false;
    if (Hk < 1 || Hv % Hk != 0)
        return opck_fail(c, BERTH_E_INVALID,
                         "gated_delta: n_v_heads %" PRId64 " is not a multiple of n_k_heads %" PRId64, Hv, Hk);
    const berth_tensor *gb[2] = {&p->g, &p->beta};
    for (int i = 0; i < 2; i++)
        if (gb[i]->ne[0] != Hv || gb[i]->ne[1] != T || gb[i]->ne[2] != 1 || gb[i]->ne[3] != 1)
            return opck_fail(c, BERTH_E_INVALID, "gated_delta: %s must be ne {n_v_heads %" PRId64 ", T %" PRId64 "}",
                             i ? "beta" : "g", Hv, T);
    if (p->state.ne[0] != dv || p->state.ne[1] != dk || p->state.ne[2] != Hv)
        return opck_fail(c, BERTH_E_INVALID, "gated_delta: state must be ne {d_v %" PRId64 ", d_k %" PRId64
                         ", n_v_heads %" PRId64 ", n_slots}, got {%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "}",
                         dv, dk, Hv, p->state.ne[0], p->state.ne[1], p->state.ne[2], p->state.ne[3]);
    return true;
}

bool opck_gated_rms_norm(struct opck *c, const berth_gated_rms_norm_params *p)
{
    static const char op[] = "gated_rms_norm";
    if (!opck_struct_size(c, op, p->struct_size, BERTH_SIZE_TO(berth_gated_rms_norm_params, y)))
        return false;
    if (!opck_act_valid(p->act))
        return opck_fail(c, BERTH_E_UNSUPPORTED, "gated_rms_norm: activation %d is not supported", p->act);
    return opck_tensor(c, op, "x", &p->x, c->be->act_dtypes, false) &&
           opck_tensor(c, op, "z", &p->z, c->be->act_dtypes, false) &&
           opck_tensor(c, op, "y", &p->y, c->be->act_dtypes, true) && opck_same_shape(c, op, "z", &p->z, "x", &p->x) &&
           opck_same_shape(c, op, "y", &p->y, "x", &p->x) && check_feature_vector(c, op, "w", &p->w, p->x.ne[0]);
}

bool opck_log_softmax_topk(struct opck *c, const berth_log_softmax_topk_params *p)
{
    static const char op[] = "log_softmax_topk";
    if (!opck_struct_size(c, op, p->struct_size, BERTH_SIZE_TO(berth_log_softmax_topk_params, indices)))
        return false;
    if (!opck_tensor(c, op, "logits", &p->logits, OPCK_F32, false) ||
        !opck_tensor(c, op, "values", &p->values, OPCK_F32, true) ||
        !opck_tensor(c, op, "indices", &p->indices, OPCK_I32, true))
        return false;
    const int64_t V = p->logits.ne[0], R = p->logits.ne[1];
    if (p->logits.ne[2] != 1 || p->logits.ne[3] != 1)
        return opck_fail(c, BERTH_E_INVALID, "log_softmax_topk: logits must be 2-D ne {V, R}");
    if (p->k < 1 || p->k > V)
        return opck_fail(c, BERTH_E_INVALID, "log_softmax_topk: k = %d must be in 1..V (%" PRId64 ")", p->k, V);
    const berth_tensor *outs[2] = {&p->values, &p->indices};
    for (int i = 0; i < 2; i++)
        if (outs[i]->ne[0] != p->k || outs[i]->ne[1] != R || outs[i]->ne[2] != 1 || outs[i]->ne[3] != 1)
            return opck_fail(c, BERTH_E_INVALID, "log_softmax_topk: %s must be ne {k %d, R %" PRId64 "}",
                             i ? "indices" : "values", p->k, R);
    if (opck_present(c, &p->row_bias))
        return opck_tensor(c, op, "row_bias", &p->row_bias, OPCK_F32, false) &&
               opck_vector(c, op, "row_bias", &p->row_bias, R);
    return true;
}

bool opck_sample(struct opck *c, const berth_sample_params *p)
{
    static const char op[] = "sample";
    if (!opck_struct_size(c, op, p->struct_size, BERTH_SIZE_TO(berth_sample_params, top_logprobs)))
        return false;
    if (!opck_tensor(c, op, "logits", &p->logits, OPCK_F32, false) ||
        !opck_tensor(c, op, "ids", &p->ids, OPCK_I32, true))
        return false;
    const int64_t V = p->logits.ne[0], R = p->logits.ne[1];
    if (p->logits.ne[2] != 1 || p->logits.ne[3] != 1)
        return opck_fail(c, BERTH_E_INVALID, "sample: logits must be 2-D ne {V, R}");
    if (p->n_rows != R)
        return opck_fail(c, BERTH_E_INVALID, "sample: n_rows %d differs from logits' %" PRId64 " rows", p->n_rows, R);
    if (V < 1 || V > INT32_MAX)
        return opck_fail(c, BERTH_E_INVALID, "sample: vocabulary size %" PRId64 " is out of range", V);
    if (!opck_vector(c, op, "ids", &p->ids, R))
        return false;
    if (opck_present(c, &p->logprob) &&
        (!opck_tensor(c, op, "logprob", &p->logprob, OPCK_F32, true) || !opck_vector(c, op, "logprob", &p->logprob, R)))
        return false;
    if (p->n_top < 0 || p->n_top > V)
        return opck_fail(c, BERTH_E_INVALID, "sample: n_top = %d must be in 0..V (%" PRId64 ")", p->n_top, V);
    if (p->n_top > 0) {
        if (!opck_tensor(c, op, "top_ids", &p->top_ids, OPCK_I32, true) ||
            !opck_tensor(c, op, "top_logprobs", &p->top_logprobs, OPCK_F32, true))
            return false;
        const berth_tensor *outs[2] = {&p->top_ids, &p->top_logprobs};
        for (int i = 0; i < 2; i++)
            if (outs[i]->ne[0] != p->n_top || outs[i]->ne[1] != R || outs[i]->ne[2] != 1 || outs[i]->ne[3] != 1)
                return opck_fail(c, BERTH_E_INVALID, "sample: %s must be ne {n_top %d, R %" PRId64 "}",
                                 i ? "top_logprobs" : "top_ids", p->n_top, R);
    }
    return true;
}

bool opck_sample_rows(struct opck *c, const berth_sample_params *p, int64_t V, int64_t *max_hist)
{
    *max_hist = 0;
    const int32_t *out_start = opck_sample_output_start(p);
    if (out_start && !p->history_start)
        return opck_fail(c, BERTH_E_INVALID, "sample: history_output_start is given without history_start");
    for (int32_t r = 0; r < p->n_rows; r++) {
        if (p->repetition_penalty && !(p->repetition_penalty[r] > 0.0f))
            return opck_fail(c, BERTH_E_INVALID, "sample: row %d repetition_penalty %g must be > 0", r,
                             (double)p->repetition_penalty[r]);
        if (!p->history_start)
            continue;
        const int32_t h0 = p->history_start[r], h1 = p->history_start[r + 1];
        if (h0 < 0 || h1 < h0)
            return opck_fail(c, BERTH_E_INVALID, "sample: history_start[%d..%d] = %d, %d is not a valid range", r,
                             r + 1, h0, h1);
        if (h1 > h0 && !p->history)
            return opck_fail(c, BERTH_E_INVALID, "sample: row %d has history but history is NULL", r);
        if (out_start && (out_start[r] < h0 || out_start[r] > h1))
            return opck_fail(c, BERTH_E_INVALID,
                             "sample: row %d history_output_start %d is outside its history [%d, %d]", r, out_start[r],
                             h0, h1);
        for (int32_t i = h0; i < h1; i++)
            if (p->history[i] < 0 || p->history[i] >= V)
                return opck_fail(c, BERTH_E_INVALID, "sample: history[%d] = %d is not a token id (V = %" PRId64 ")", i,
                                 p->history[i], V);
        if (h1 - h0 > *max_hist)
            *max_hist = h1 - h0;
    }
    for (int32_t r = 0; r < p->n_rows; r++) {
        if (p->temperature && isnan(p->temperature[r]))
            return opck_fail(c, BERTH_E_INVALID, "sample: row %d temperature is NaN", r);
        if (p->top_p && isnan(p->top_p[r]))
            return opck_fail(c, BERTH_E_INVALID, "sample: row %d top_p is NaN", r);
        if (p->min_p && (isnan(p->min_p[r]) || p->min_p[r] > 1.0f))
            return opck_fail(c, BERTH_E_INVALID, "sample: row %d min_p %g must be <= 1", r, (double)p->min_p[r]);
        if (p->presence_penalty && isnan(p->presence_penalty[r]))
            return opck_fail(c, BERTH_E_INVALID, "sample: row %d presence_penalty is NaN", r);
        if (p->frequency_penalty && isnan(p->frequency_penalty[r]))
            return opck_fail(c, BERTH_E_INVALID, "sample: row %d frequency_penalty is NaN", r);
    }
    return true;
}

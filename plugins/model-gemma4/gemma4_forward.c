/*
 * gemma4_forward.c — one decoder step of Gemma 4 composed from backend ops (spec gemma4.md §3).
 *
 * All activations stay f32 in one scratch buffer laid out for max_batch_tokens rows; nothing here touches
 * activation memory directly (the backend may be a GPU). The same code runs in a recording mode, where each op
 * call is collected as a requirement instead of executed (see gemma4_requirements.c).
 *
 * Per layer (§3.3): input norm -> q proj (layer 0: the norm is the projections' matmul prologue; later layers: the
 * previous layer's last norm wrote it as its second output) -> q norm + RoPE (one rms_norm) -> [owners: k/v proj,
 * then kv_append with K norm + RoPE and the weightless V norm] -> attention over the cache (scale 1, causal, window
 * on sliding layers; shared layers read their source's cache) -> o proj -> the post-attention norm (added to the
 * residual), which also writes the pre-FF norm -> gate/up with the GELU-tanh GLU as the gate product's epilogue ->
 * down -> the post-FF norm -> PLE block (its gate product's epilogue multiplies by the per-layer input; the
 * projection is the gate's y_then) -> the post-PLE norm * layer_scalar (its out_scale), which also writes the next
 * layer's input norm.
 *
 * Each post-norm travels with the product that reads its output, as that matmul's x_pre (the norm, then the
 * product, in one op): the post-attention norm with gate|up (or up), the post-FF norm with the PLE gate (without
 * PLE: with the next layer's q|k|v or q), the post-PLE norm with the next layer's q|k|v or q. A backend can compute
 * the norm in the consumer's prologue; at batch 1 that saves a kernel boundary per post-norm on CUDA. run() holds
 * each post-norm back until it sees the next op and sends it alone when that op does not read it (the last layer's
 * last norm, before the final norm and LM head). The residual stream ping-pongs between two buffers because the
 * norm ops only promise y may alias x, not the residual.
 */
#include "gemma4_model.h"
#include "gemma4_util.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define G4_ALIGN 256u

struct g4_step {
    berth_model *m;
    berth_stream *s;
    const berth_batch *b;
    int record;                /* collect requirements instead of running */
    berth_buffer *buf;         /* scratch buffer (NULL when recording) */
    const struct g4_scratch *sc;
    int64_t T;                 /* tokens in the step */
    int cur;                   /* which of sc->x holds the residual stream */
    int fused;                 /* use the fused q|k|v and gate|up projections where the layer has them */
    int u_normed;              /* sc->u holds the next projection's pre-norm of the residual stream, written as
                                * the second output (y2) of the norm before it: the projection needs no prologue */
    int norm_pending;          /* pending holds a post-norm not sent yet: run() sends it with the next op */
    berth_rms_norm_params pending;
    const char *pending_site;
};

/* --- dispatch ---------------------------------------------------------------------------------------------- */

/* One op to the backend, or to the requirement list when recording. */
static berth_status dispatch(struct g4_step *st, int32_t op, const void *p, const char *site)
{
    berth_model *m = st->m;
    if (st->record)
        return g4_req_record(m, op, p, site);
    const berth_ops *o = m->be->ops;
    berth_backend *be = m->be->be;
#define G4_CALL(field, type)                                                                                    \
    if (!o || !BERTH_HAS(o, berth_ops, field) || !o->field)                                                     \
        return g4_fail(m->host, BERTH_E_UNSUPPORTED, "gemma4: the backend has no " #field " op (needed for %s)", \
                       site);                                                                                   \
    return o->field(be, st->s, (const type *)p)
    switch (op) {
    case BERTH_OP_MATMUL: G4_CALL(matmul, berth_matmul_params);
    case BERTH_OP_GET_ROWS: G4_CALL(get_rows, berth_get_rows_params);
    case BERTH_OP_RMS_NORM: G4_CALL(rms_norm, berth_rms_norm_params);
    case BERTH_OP_UNARY: G4_CALL(unary, berth_unary_params);
    case BERTH_OP_KV_APPEND: G4_CALL(kv_append, berth_kv_append_params);
    case BERTH_OP_ATTENTION: G4_CALL(attention, berth_attention_params);
    default: return g4_fail(m->host, BERTH_E_INTERNAL, "gemma4: unexpected op %d", (int)op);
    }
#undef G4_CALL
}

/* Whether the matmul p can carry the pending norm as its x_pre: it reads exactly the norm's y2 (its y without
 * one) and has neither a norm prologue nor a trailing norm of its own. (Recording, every view has buffer NULL and
 * offset 0; the op after each post-norm is the same in both modes, and so is the answer.) */
static int takes_pending(const struct g4_step *st, const berth_matmul_params *p)
{
    const berth_rms_norm_params *n = &st->pending;
    const berth_tensor *out = n->y2.ne[0] != 0 ? &n->y2 : &n->y;
    return p->x_norm_mode == BERTH_NORM_W_NONE && !p->y_norm && !p->x_pre && p->x.buf == out->buf &&
           p->x.offset == out->offset && p->x.dtype == out->dtype && memcmp(p->x.ne, out->ne, sizeof out->ne) == 0 &&
           memcmp(p->x.nb, out->nb, sizeof out->nb) == 0;
}

/* The one way ops leave this file (executed or recorded alike). A pending post-norm goes first: as the x_pre of
 * this op when it is the matmul that reads the norm's output (a backend can then compute the norm in the
 * product's prologue instead of a launch of its own), else as an rms_norm op of its own. */
static berth_status run(struct g4_step *st, int32_t op, const void *p, const char *site)
{
    if (st->norm_pending) {
        st->norm_pending = 0;
        if (op == BERTH_OP_MATMUL && takes_pending(st, p)) {
            berth_matmul_params q = *(const berth_matmul_params *)p;
            q.x_pre = &st->pending;
            char both[192];
            snprintf(both, sizeof both, "%s, then %s", st->pending_site, site);
            return dispatch(st, op, &q, both);
        }
        const berth_status r = dispatch(st, BERTH_OP_RMS_NORM, &st->pending, st->pending_site);
        if (r != BERTH_OK)
            return r;
    }
    return dispatch(st, op, p, site);
}

/* Sends a post-norm still pending at the end of the step (no op came after it). */
static berth_status flush_pending(struct g4_step *st)
{
    if (!st->norm_pending)
        return BERTH_OK;
    st->norm_pending = 0;
    return dispatch(st, BERTH_OP_RMS_NORM, &st->pending, st->pending_site);
}

static berth_tensor act(const struct g4_step *st, uint64_t off, int64_t ne0, int64_t ne1, int64_t ne2)
{
    return g4_f32(st->buf, off, ne0, ne1, ne2);
}

/* y = x w^T, or with norm_w: y = (RMSNorm(x) * norm_w) w^T through the matmul's norm prologue (one op instead of
 * rms_norm + matmul; the norm is recomputed by each product that reads the same x). With glu (BERTH_GLU_*) the
 * product z goes through the gated epilogue instead of being stored: HALVES (w = [gate | up] rows): y =
 * gelu_tanh(z_gate) * z_up; MUL: y = gelu_tanh(z) * up. One op instead of matmul + glu. */
static void matmul_params(const struct g4_step *st, berth_tensor x, const berth_tensor *w, berth_tensor y,
                          const berth_tensor *norm_w, int32_t glu, const berth_tensor *up, berth_matmul_params *p)
{
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    p->x = x;
    p->w = *w;
    p->y = y;
    if (norm_w) {
        p->x_norm_mode = BERTH_NORM_W;
        p->x_norm_eps = (float)st->m->cfg->eps;
        p->x_norm_w = *norm_w;
    }
    if (glu != BERTH_GLU_NONE) {
        p->y_glu = glu;
        p->y_glu_act = BERTH_ACT_GELU_TANH;
        if (up)
            p->y_glu_up = *up;
    }
}

static berth_status op_matmul_glu(struct g4_step *st, berth_tensor x, const berth_tensor *w, berth_tensor y,
                                  const berth_tensor *norm_w, int32_t glu, const berth_tensor *up, const char *site)
{
    berth_matmul_params p;
    matmul_params(st, x, w, y, norm_w, glu, up, &p);
    return run(st, BERTH_OP_MATMUL, &p, site);
}

static berth_status op_matmul_norm(struct g4_step *st, berth_tensor x, const berth_tensor *w, berth_tensor y,
                                   const berth_tensor *norm_w, const char *site)
{
    return op_matmul_glu(st, x, w, y, norm_w, BERTH_GLU_NONE, NULL, site);
}

static berth_status op_matmul(struct g4_step *st, berth_tensor x, const berth_tensor *w, berth_tensor y,
                              const char *site)
{
    return op_matmul_norm(st, x, w, y, NULL, site);
}

static berth_status op_get_rows(struct g4_step *st, const berth_tensor *table, berth_tensor ids, berth_tensor y,
                                float scale, const char *site)
{
    berth_get_rows_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.scale = scale;
    p.table = *table;
    p.ids = ids;
    p.y = y;
    return run(st, BERTH_OP_GET_ROWS, &p, site);
}

static void rms_params(const struct g4_step *st, berth_tensor x, const berth_tensor *w, const berth_tensor *residual,
                       berth_tensor y, berth_rms_norm_params *p)
{
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    p->weight_mode = BERTH_NORM_W;
    p->resid_mode = residual ? BERTH_RESID_ADD_AFTER : BERTH_RESID_NONE;
    p->eps = (float)st->m->cfg->eps;
    p->x = x;
    p->w = *w;
    if (residual)
        p->residual = *residual;
    p->y = y;
}

/* y = [residual +] RMSNorm(x) * w. */
static berth_status op_rms(struct g4_step *st, berth_tensor x, const berth_tensor *w, const berth_tensor *residual,
                           berth_tensor y, const char *site)
{
    berth_rms_norm_params p;
    rms_params(st, x, w, residual, y, &p);
    return run(st, BERTH_OP_RMS_NORM, &p, site);
}

/* A post-norm y = (residual + RMSNorm(x) * w) * scale (scale 0: none) that also writes the next projection's
 * pre-norm u = RMSNorm(y) * next_w as its second output (next_w NULL: no second output), so that projection
 * reads u without a norm prologue: one op where the prologue cost the product a gather of x. */
static void rms_then_params(struct g4_step *st, berth_tensor x, const berth_tensor *w, const berth_tensor *residual,
                            berth_tensor y, float scale, const berth_tensor *next_w, berth_rms_norm_params *p)
{
    rms_params(st, x, w, residual, y, p);
    p->out_scale = scale;
    if (next_w) {
        p->y2_weight_mode = BERTH_NORM_W;
        p->y2_w = *next_w;
        p->y2 = act(st, st->sc->u, y.ne[0], y.ne[1], 1);
    }
    st->u_normed = next_w != NULL;
}

/* a = x w^T, then the post-norm y = (residual + RMSNorm(a) * norm_w) * scale (0: none) with the next projection's
 * pre-norm as its second output (next_w; NULL: none). The product runs now; the norm is left pending so that run()
 * sends it as the x_pre of the product that reads its output (a backend can compute it in that product's prologue:
 * at batch 1 the CUDA GEMV saves a kernel boundary per post-norm), or alone when no product reads it. The layer's
 * last norm takes layer_scalar as its scale and the next layer's input norm as next_w. */
static berth_status op_matmul_rms_then(struct g4_step *st, berth_tensor x, const berth_tensor *w, berth_tensor a,
                                       const berth_tensor *norm_w, const berth_tensor *residual, berth_tensor y,
                                       float scale, const berth_tensor *next_w, const char *site,
                                       const char *norm_site)
{
    const berth_status r = op_matmul(st, x, w, a, site);
    if (r != BERTH_OK)
        return r;
    rms_then_params(st, a, norm_w, residual, y, scale, next_w, &st->pending);
    st->pending_site = norm_site;
    st->norm_pending = 1;
    return BERTH_OK;
}

/* The input norm of layer i + 1 (the second output of layer i's last norm), or NULL after the last layer. */
static const berth_tensor *next_input_norm(const struct g4_step *st, int i)
{
    return i + 1 < st->m->cfg->n_layers ? &st->m->w.layers[i + 1].input_norm : NULL;
}

/* x = out_scale * f(in_scale * x), in place. */
static berth_status op_unary(struct g4_step *st, berth_tensor x, int32_t fn, float in_scale, float out_scale,
                             const char *site)
{
    berth_unary_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.act = fn;
    p.in_scale = in_scale;
    p.out_scale = out_scale;
    p.x = x;
    p.y = x;
    return run(st, BERTH_OP_UNARY, &p, site);
}

static berth_tensor rope_table(const struct g4_step *st, int type)
{
    const berth_model *m = st->m;
    return g4_f32(m->const_buf, m->rope_off[type], m->rope_pairs[type], 1, 1);
}

/* Heads [row0, row0 + heads * hd) of the fused q|k|v output (rows of nrow floats per token): ne {hd, heads, T}. */
static berth_tensor qkv_view(const struct g4_step *st, int64_t row0, int64_t hd, int64_t heads, int64_t nrow)
{
    berth_tensor t = g4_f32(st->buf, st->sc->qkv + (uint64_t)row0 * 4u, hd, heads, st->T);
    t.nb[2] = nrow * 4;
    t.nb[3] = t.nb[2] * st->T;
    return t;
}

/* Cache of layer `index` inside group g. */
static berth_kv_view layer_view(const berth_kv_group_batch *g, int index)
{
    berth_kv_view v = g->pool;
    v.k_offset += (uint64_t)index * g->layer_stride;
    v.v_offset += (uint64_t)index * g->layer_stride;
    return v;
}

/* --- embeddings and per-layer inputs (§3.2) ---------------------------------------------------------------- */

/* ple = (RMSNorm(ple; w) + token part) * 2^-1/2 in place: the final scale is the norm's out_scale. */
/* ple = (RMSNorm(z * in_scale; w) + tok) * 2^-1/2 in place, z = ple's rows. RMSNorm(s z) = z / sqrt(mean(z^2) +
 * eps / s^2) exactly, so the input scale s rides in the norm's eps instead of a pass over z of its own (one kernel
 * less per step on a GPU; the same value up to fp32 rounding). */
static berth_status op_ple_norm(struct g4_step *st, berth_tensor ple, const berth_tensor *w, const berth_tensor *tok,
                                double in_scale)
{
    berth_rms_norm_params p;
    rms_params(st, ple, w, tok, ple, &p);
    p.eps = (float)(st->m->cfg->eps / (in_scale * in_scale));
    p.out_scale = (float)pow(2.0, -0.5);
    return run(st, BERTH_OP_RMS_NORM, &p, "per_layer_projection_norm (* 2^-1/2; the D^-1/2 scale in eps)");
}

static berth_status embed(struct g4_step *st)
{
    const berth_model *m = st->m;
    const struct g4_config *c = m->cfg;
    const struct g4_scratch *sc = st->sc;
    const int64_t T = st->T, D = c->hidden, Dp = c->ple_dim, LDp = (int64_t)c->n_layers * c->ple_dim;
    berth_status r;

    /* e = E[x] * sqrt(D), the scale in fp32 (fp32 references; a bf16 table is upcast exactly). */
    berth_tensor x0 = act(st, sc->x[0], D, T, 1);
    st->cur = 0;
    if ((r = op_get_rows(st, &m->w.embed, st->b->tokens, x0, (float)sqrt((double)D), "embed_tokens")) != BERTH_OK)
        return r;
    if (Dp == 0)
        return BERTH_OK;

    /* ple = (RMSNorm((P e) * D^-1/2; w_pln) + E_ple[x] * sqrt(Dp)) * 2^-1/2, per [L, Dp] slice. */
    berth_tensor pa = act(st, sc->ple_a, LDp, T, 1), pl = act(st, sc->ple, LDp, T, 1);
    berth_tensor pa_rows = act(st, sc->ple_a, Dp, c->n_layers * T, 1);
    berth_tensor pl_rows = act(st, sc->ple, Dp, c->n_layers * T, 1);
    if ((r = op_get_rows(st, &m->w.ple_embed, st->b->tokens, pa, (float)sqrt((double)Dp),
                         "embed_tokens_per_layer")) != BERTH_OK ||
        (r = op_matmul(st, x0, &m->w.ple_model_proj, pl, "per_layer_model_projection")) != BERTH_OK ||
        (r = op_ple_norm(st, pl_rows, &m->w.ple_proj_norm, &pa_rows, pow((double)D, -0.5))) != BERTH_OK)
        return r;
    return BERTH_OK;
}

/* --- one decoder layer (§3.3) ------------------------------------------------------------------------------ */

static berth_status attention_block(struct g4_step *st, int i)
{
    const berth_model *m = st->m;
    const struct g4_config *c = m->cfg;
    const struct g4_layer *ly = &c->layers[i];
    const struct g4_layer_weights *lw = &m->w.layers[i];
    const struct g4_scratch *sc = st->sc;
    const berth_batch *b = st->b;
    const berth_kv_group_batch *g = &b->kv[ly->kv_group];
    const int64_t T = st->T, D = c->hidden, H = c->n_heads, hd = ly->head_dim, K = ly->n_kv_heads;
    const int pairs = m->rope_pairs[ly->type];
    const berth_kv_view cache = layer_view(g, ly->kv_index);
    berth_status r;

    berth_tensor xin = act(st, sc->x[st->cur], D, T, 1), xout = act(st, sc->x[1 - st->cur], D, T, 1);
    berth_tensor a = act(st, sc->a, D, T, 1);
    berth_tensor q = act(st, sc->q, hd, H, T), att = act(st, sc->att, hd, H, T);
    berth_tensor k = act(st, sc->k, hd, K, T), v = act(st, sc->v, hd, K, T);

    /* input_layernorm: the previous layer's last norm wrote it to u (its second output); the first layer's
     * projections apply it as their norm prologue on the residual stream */
    const int pre = st->u_normed;
    const berth_tensor *in_norm = pre ? NULL : &lw->input_norm;
    const berth_tensor xn = pre ? act(st, sc->u, D, T, 1) : xin;
    const int fused_qkv = st->fused && lw->qkv.ne[0] != 0;
    if (fused_qkv) {
        /* One product into rows of [q | k | v]; q, k and v are strided views of it. */
        const int64_t nq = H * hd, nk = K * hd, nrow = lw->qkv.ne[1];
        if ((r = op_matmul_norm(st, xn, &lw->qkv, act(st, sc->qkv, nrow, T, 1), in_norm,
                                pre ? "q_proj + k_proj + v_proj" : "q_proj + k_proj + v_proj (input_layernorm prologue)")) != BERTH_OK)
            return r;
        q = qkv_view(st, 0, hd, H, nrow);
        k = qkv_view(st, nq, hd, K, nrow);
        v = ly->v_from_k ? k : qkv_view(st, nq + nk, hd, K, nrow);
    } else if ((r = op_matmul_norm(st, xn, &lw->q_proj, act(st, sc->q, H * hd, T, 1), in_norm,
                                   pre ? "q_proj" : "q_proj (input_layernorm prologue)")) != BERTH_OK) {
        return r;
    }
    /* q_norm per head, then RoPE on the normalised heads: in the layer's kv_append when it stores K/V (ABI 0.5:
     * one launch fewer), else as one rms_norm */
    /* load() reads the setting; requirements are recorded in both forms (the host checks before load) */
    const int q_in_kv = !ly->kv_shared && (st->record || m->q_in_kv);
    if (!q_in_kv || st->record) {
        berth_rms_norm_params p;
        rms_params(st, q, &lw->q_norm, NULL, q, &p);
        if (pairs > 0) {
            p.rope_mode = BERTH_ROPE_HALF;
            p.rope_pair_offset = (int32_t)(hd / 2);
            p.rope_n_pairs = pairs;
            p.rope_positions = b->positions;
            p.rope_freqs = rope_table(st, ly->type);
        }
        if ((r = run(st, BERTH_OP_RMS_NORM, &p,
                     ly->type == G4_FULL ? "q_norm + RoPE (full layers)" : "q_norm + RoPE (sliding layers)")) !=
            BERTH_OK)
            return r;
    }

    if (!ly->kv_shared) {
        if (!fused_qkv && (r = op_matmul_norm(st, xn, &lw->k_proj, act(st, sc->k, K * hd, T, 1), in_norm,
                                              pre ? "k_proj" : "k_proj (input_layernorm prologue)")) != BERTH_OK)
            return r;
        /* With attention_k_eq_v (full layers) V is the raw K projection (before k_norm and RoPE). */
        if (!fused_qkv && !ly->v_from_k &&
            (r = op_matmul_norm(st, xn, &lw->v_proj, act(st, sc->v, K * hd, T, 1), in_norm,
                                pre ? "v_proj" : "v_proj (input_layernorm prologue)")) != BERTH_OK)
            return r;
        berth_kv_append_params p;
        memset(&p, 0, sizeof p);
        p.struct_size = sizeof p;
        p.k_norm_mode = BERTH_NORM_W;
        p.v_norm_mode = BERTH_NORM_UNIT; /* v_norm is a weightless RMSNorm; v_norm (the tensor) stays absent */
        p.eps = (float)c->eps;
        p.rope_mode = BERTH_ROPE_HALF;
        p.rope_pair_offset = (int32_t)(hd / 2);
        p.rope_n_pairs = pairs;
        p.k = k;
        p.v = ly->v_from_k ? k : v;
        p.slots = g->slots;
        p.k_norm = lw->k_norm;
        if (pairs > 0) {
            p.positions = b->positions;
            p.rope_freqs = rope_table(st, ly->type);
        }
        p.kv = cache;
        if (q_in_kv) {
            p.q = q;
            p.q_norm_mode = BERTH_NORM_W;
            p.q_norm = lw->q_norm;
        }
        const char *site = ly->type == G4_FULL ? (q_in_kv ? "q_norm + RoPE, k/v store (full layers)" : "full layers")
                           : (q_in_kv ? "q_norm + RoPE, k/v store (sliding layers)" : "sliding layers");
        if ((r = run(st, BERTH_OP_KV_APPEND, &p, site)) !=
            BERTH_OK)
            return r;
    }

    berth_attention_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.mask = BERTH_MASK_CAUSAL;
    p.window = ly->type == G4_SLIDING ? c->window : 0;
    p.scale = 1.0f; /* q_norm/k_norm replace 1/sqrt(hd) */
    p.softcap = 0.0f;
    p.n_seqs = b->n_seqs;
    p.max_q_len = b->max_q_len;
    p.max_kv_len = b->max_kv_len;
    p.q = q;
    p.out = att;
    p.positions = b->positions;
    p.seq_q_start = b->seq_q_start;
    p.seq_kv_len = b->seq_kv_len;
    p.block_table = g->block_table;
    p.kv = cache;
    if ((r = run(st, BERTH_OP_ATTENTION, &p, ly->type == G4_FULL ? "full layers" : "sliding layers")) != BERTH_OK ||
        (r = op_matmul_rms_then(st, act(st, sc->att, H * hd, T, 1), &lw->o_proj, a, &lw->post_attn_norm, &xin, xout,
                                0.0f, &lw->pre_ff_norm, "o_proj",
                                "post_attention_layernorm (+ pre_feedforward_layernorm)")) != BERTH_OK)
        return r;
    st->cur = 1 - st->cur;
    return BERTH_OK;
}

static berth_status mlp_block(struct g4_step *st, int i)
{
    const berth_model *m = st->m;
    const struct g4_config *c = m->cfg;
    const struct g4_layer_weights *lw = &m->w.layers[i];
    const struct g4_scratch *sc = st->sc;
    const int64_t T = st->T, D = c->hidden, I = c->layers[i].mlp_width;
    berth_status r;

    berth_tensor xin = act(st, sc->x[st->cur], D, T, 1), xout = act(st, sc->x[1 - st->cur], D, T, 1);
    berth_tensor a = act(st, sc->a, D, T, 1);
    berth_tensor gate = act(st, sc->gate, I, T, 1), up = act(st, sc->up, I, T, 1);
    /* pre_feedforward_layernorm: the post-attention norm's second output, u; the GLU is the epilogue of the
     * product that yields the gate: gate = gelu_tanh(u Wg^T) * (u Wu^T) */
    const berth_tensor u = act(st, sc->u, D, T, 1);
    const berth_tensor *ff_norm = NULL;
    if (st->fused && lw->gate_up.ne[0] != 0) {
        /* One product over the [gate | up] rows; the epilogue pairs its halves. */
        if ((r = op_matmul_glu(st, u, &lw->gate_up, gate, ff_norm, BERTH_GLU_HALVES, NULL,
                               "mlp.gate_proj + mlp.up_proj")) != BERTH_OK)
            return r;
    } else if ((r = op_matmul_norm(st, u, &lw->up_proj, up, ff_norm,
                                   "mlp.up_proj")) != BERTH_OK ||
               (r = op_matmul_glu(st, u, &lw->gate_proj, gate, ff_norm, BERTH_GLU_MUL, &up,
                                  "mlp.gate_proj")) != BERTH_OK) {
        return r;
    }
    /* the post-FF norm follows the down product (sent with the PLE gate, or without PLE with the next layer's
     * projections); without PLE it is the layer's last norm: layer_scalar is its out_scale and the next layer's
     * input norm its second output */
    r = c->ple_dim > 0 ? op_matmul_rms_then(st, gate, &lw->down_proj, a, &lw->post_ff_norm, &xin, xout, 0.0f, NULL,
                                            "mlp.down_proj", "post_feedforward_layernorm")
                       : op_matmul_rms_then(st, gate, &lw->down_proj, a, &lw->post_ff_norm, &xin, xout,
                                            lw->layer_scalar, next_input_norm(st, i), "mlp.down_proj",
                                            i + 1 < c->n_layers
                                                ? "post_feedforward_layernorm (* layer_scalar, + input_layernorm)"
                                                : "post_feedforward_layernorm (* layer_scalar)");
    if (r != BERTH_OK)
        return r;
    st->cur = 1 - st->cur;
    return BERTH_OK;
}

/* h += RMSNorm(Wproj (gelu(Wgate h) * ple_i); post_per_layer_input_norm) */
static berth_status ple_block(struct g4_step *st, int i)
{
    const berth_model *m = st->m;
    const struct g4_config *c = m->cfg;
    const struct g4_layer_weights *lw = &m->w.layers[i];
    const struct g4_scratch *sc = st->sc;
    const int64_t T = st->T, D = c->hidden, Dp = c->ple_dim, LDp = (int64_t)c->n_layers * c->ple_dim;
    berth_status r;

    berth_tensor xin = act(st, sc->x[st->cur], D, T, 1), xout = act(st, sc->x[1 - st->cur], D, T, 1);
    berth_tensor a = act(st, sc->a, D, T, 1), pg = act(st, sc->pg, Dp, T, 1);
    /* Layer i's slice of the per-layer inputs: rows of Dp, L*Dp apart. */
    berth_tensor ple_i = act(st, sc->ple + (uint64_t)i * (uint64_t)Dp * 4u, Dp, T, 1);
    ple_i.nb[1] = LDp * 4;
    ple_i.nb[2] = ple_i.nb[3] = ple_i.nb[1] * T;
    /* One op: the gate product (with the pending post-FF norm as its x_pre, gelu(.) * ple_i as its epilogue), then
     * the projection of its 256-wide output (y_then, ABI 0.6), so a backend can keep the narrow middle on chip.
     * The post-PLE norm stays pending, as every post-norm: the x_pre of the next layer's q|k|v (on CUDA a skinny
     * product at 17..64 rows packs its x inside that norm; as the projection's y_norm it would not). */
    berth_matmul_params proj, gate;
    matmul_params(st, pg, &lw->ple_proj, a, NULL, BERTH_GLU_NONE, NULL, &proj);
    matmul_params(st, xin, &lw->ple_gate, pg, NULL, BERTH_GLU_MUL, &ple_i, &gate);
    gate.y_then = &proj;
    if ((r = run(st, BERTH_OP_MATMUL, &gate, "per_layer_input_gate, per_layer_projection")) != BERTH_OK)
        return r;
    rms_then_params(st, a, &lw->ple_post_norm, &xin, xout, lw->layer_scalar, next_input_norm(st, i), &st->pending);
    st->pending_site = i + 1 < c->n_layers ? "post_per_layer_input_norm (* layer_scalar, + input_layernorm)"
                                           : "post_per_layer_input_norm (* layer_scalar)";
    st->norm_pending = 1;
    st->cur = 1 - st->cur;
    return BERTH_OK;
}

static berth_status head(struct g4_step *st)
{
    const berth_model *m = st->m;
    const struct g4_config *c = m->cfg;
    const berth_batch *b = st->b;
    const int64_t T = st->T, D = c->hidden, n = b->n_logits;
    berth_status r;
    if (n == 0)
        return BERTH_OK;
    /* Gather the wanted rows first: the norm is per row, so the LM head only runs on them. When every token is
     * one (a decode step), logit_rows is 0 .. T-1 (ascending and distinct: model.h), so the norm reads x itself. */
    berth_tensor x = act(st, st->sc->x[st->cur], D, T, 1), z = act(st, st->sc->u, D, n, 1);
    if (n != T && (r = op_get_rows(st, &x, b->logit_rows, z, 1.0f, "logit rows")) != BERTH_OK)
        return r;
    if ((r = op_rms(st, n != T ? z : x, &m->w.final_norm, NULL, z, "norm")) != BERTH_OK ||
        (r = op_matmul(st, z, &m->w.lm_head, b->logits, c->tied ? "lm_head (tied to embed_tokens)" : "lm_head")) !=
            BERTH_OK)
        return r;
    if (c->softcap > 0.0)
        return op_unary(st, b->logits, BERTH_ACT_TANH, (float)(1.0 / c->softcap), (float)c->softcap,
                        "final_logit_softcapping");
    return BERTH_OK;
}

static berth_status run_step(struct g4_step *st)
{
    const berth_model *m = st->m;
    const struct g4_config *c = m->cfg;
    berth_status r = embed(st);
    for (int i = 0; r == BERTH_OK && i < c->n_layers; i++) {
        if ((r = attention_block(st, i)) != BERTH_OK || (r = mlp_block(st, i)) != BERTH_OK)
            break;
        /* layer_scalar multiplies the whole hidden state: it is the out_scale of the layer's last norm */
        if (c->ple_dim > 0 && (r = ple_block(st, i)) != BERTH_OK)
            break;
    }
    if (r == BERTH_OK)
        r = head(st);
    if (r == BERTH_OK) /* no logit rows: the last layer's last norm is still pending */
        r = flush_pending(st);
    return r;
}

/* --- scratch, requirements, forward ------------------------------------------------------------------------ */

static uint64_t take(uint64_t *at, uint64_t elems)
{
    uint64_t off = *at;
    *at += (elems * 4u + G4_ALIGN - 1) / G4_ALIGN * G4_ALIGN;
    return off;
}

static void scratch_layout(const struct g4_config *c, int64_t T, struct g4_scratch *sc)
{
    int64_t qmax = 0, kvmax = 0, imax = 0;
    for (int i = 0; i < c->n_layers; i++) {
        const struct g4_layer *ly = &c->layers[i];
        int64_t qw = (int64_t)c->n_heads * ly->head_dim, kw = (int64_t)ly->n_kv_heads * ly->head_dim;
        qmax = qw > qmax ? qw : qmax;
        kvmax = !ly->kv_shared && kw > kvmax ? kw : kvmax;
        imax = ly->mlp_width > imax ? ly->mlp_width : imax;
    }
    const uint64_t t = (uint64_t)T, D = (uint64_t)c->hidden, LDp = (uint64_t)c->n_layers * (uint64_t)c->ple_dim;
    uint64_t at = 0;
    memset(sc, 0, sizeof *sc);
    sc->x[0] = take(&at, D * t);
    sc->x[1] = take(&at, D * t);
    sc->u = take(&at, D * t);
    sc->a = take(&at, D * t);
    sc->q = take(&at, (uint64_t)qmax * t);
    sc->att = take(&at, (uint64_t)qmax * t);
    sc->k = take(&at, (uint64_t)kvmax * t);
    sc->v = take(&at, (uint64_t)kvmax * t);
    sc->qkv = take(&at, ((uint64_t)qmax + 2u * (uint64_t)kvmax) * t);
    sc->gate = take(&at, (uint64_t)imax * t); /* the GLU is the projection's epilogue: I_i columns */
    sc->up = take(&at, (uint64_t)imax * t);
    if (c->ple_dim > 0) {
        sc->ple_a = take(&at, LDp * t);
        sc->ple = take(&at, LDp * t);
        sc->pg = take(&at, (uint64_t)c->ple_dim * t);
    }
    sc->bytes = at;
}

berth_status g4_scratch_alloc(berth_model *m, int max_tokens)
{
    scratch_layout(m->cfg, max_tokens, &m->scratch);
    berth_status r = m->be->vt->buffer_alloc(m->be->be, m->scratch.bytes, BERTH_USAGE_ACTIVATIONS, &m->scratch_buf);
    if (r != BERTH_OK)
        return r;
    m->max_tokens = max_tokens;
    return BERTH_OK;
}

berth_status g4_requirements_build(berth_model *m)
{
    const struct g4_config *c = m->cfg;
    berth_batch b;
    berth_kv_group_batch kv[G4_N_TYPES];
    struct g4_scratch sc;
    memset(&b, 0, sizeof b);
    memset(kv, 0, sizeof kv);
    memset(&sc, 0, sizeof sc);

    /* A one-token, one-sequence batch: only dtypes and shapes matter to supports(). The KV views describe the
     * geometry of each group; the cache dtype is the host's choice at load, f32 is assumed here. */
    b.struct_size = sizeof b;
    b.n_tokens = b.n_seqs = b.n_logits = b.max_q_len = b.max_kv_len = 1;
    b.tokens = g4_view(NULL, 0, BERTH_DTYPE_I32, 1, 1, 1);
    b.positions = b.tokens;
    b.seq_q_start = g4_view(NULL, 0, BERTH_DTYPE_I32, 2, 1, 1);
    b.seq_kv_len = b.tokens;
    b.logit_rows = b.tokens;
    for (int g = 0; g < c->n_kv_groups; g++) {
        const int t = c->group_type[g];
        berth_kv_view *v = &kv[g].pool;
        v->dtype = BERTH_DTYPE_F32;
        v->block_size = 16;
        v->n_blocks = 1;
        v->n_kv_heads = c->type_kv_heads[t];
        v->head_dim = v->head_dim_v = c->type_head_dim[t];
        v->head_stride = (uint64_t)v->head_dim * 4u;
        v->token_stride = (uint64_t)v->n_kv_heads * v->head_stride;
        v->v_head_stride = (uint64_t)v->head_dim_v * 4u;
        v->v_token_stride = (uint64_t)v->n_kv_heads * v->v_head_stride;
        kv[g].layer_stride = (uint64_t)v->block_size * (v->token_stride + v->v_token_stride);
        v->block_stride = (uint64_t)c->group_layers[g] * kv[g].layer_stride;
        v->v_offset = (uint64_t)v->block_size * v->token_stride;
        kv[g].block_table = g4_view(NULL, 0, BERTH_DTYPE_I32, 1, 1, 1);
        kv[g].slots = b.tokens;
    }
    b.n_kv_groups = c->n_kv_groups;
    b.kv = kv;
    b.logits = g4_f32(NULL, 0, c->vocab, 1, 1);

    /* Both forms: whether the weights get fused is only known at load(), after the backend was chosen. */
    struct g4_step st = {.m = m, .b = &b, .record = 1, .sc = &sc, .T = 1};
    berth_status r = run_step(&st);
    if (r == BERTH_OK) {
        struct g4_step fst = {.m = m, .b = &b, .record = 1, .sc = &sc, .T = 1, .fused = 1};
        r = run_step(&fst);
    }
    return r;
}

static berth_status check_batch(const berth_model *m, const berth_batch *b)
{
    const berth_host *h = m->host;
    const struct g4_config *c = m->cfg;
    if (!b || b->struct_size < BERTH_SIZE_TO(berth_batch, logits))
        return g4_fail(h, BERTH_E_ABI, "gemma4: forward batch struct is too small");
    const int T = b->n_tokens;
    if (T < 1 || T > m->max_tokens)
        return g4_fail(h, BERTH_E_INVALID, "gemma4: batch of %d tokens (max_batch_tokens is %d)", T, m->max_tokens);
    if (b->n_seqs < 1 || b->n_seqs > T || b->n_logits < 0 || b->n_logits > T)
        return g4_fail(h, BERTH_E_INVALID, "gemma4: batch has %d sequences and %d logit rows for %d tokens", b->n_seqs,
                       b->n_logits, T);
    if (b->n_kv_groups != c->n_kv_groups || (c->n_kv_groups > 0 && !b->kv))
        return g4_fail(h, BERTH_E_INVALID, "gemma4: batch has %d KV groups, the model declared %d", b->n_kv_groups,
                       c->n_kv_groups);
    /* h_tokens may be NULL (model_info.h_tokens_optional): the ids were sampled on the device from this model's
     * logits, so they are below vocab, and info() only allows it when that also bounds the per-layer table. */
    if (!b->h_positions || !b->h_seq_q_start || (b->n_logits > 0 && !b->h_logit_rows))
        return g4_fail(h, BERTH_E_INVALID, "gemma4: batch lacks its host copies (h_positions, h_seq_q_start, ...)");
    if (!b->h_tokens && c->ple_dim > 0 && c->ple_vocab < c->vocab)
        return g4_fail(h, BERTH_E_INVALID, "gemma4: batch has no h_tokens, which this checkpoint needs "
                       "(vocab_size_per_layer_input %d < vocab_size %d)", c->ple_vocab, c->vocab);
    for (int t = 0; t < T; t++) {
        int32_t id = b->h_tokens ? b->h_tokens[t] : 0;
        if (id < 0 || id >= c->vocab || (c->ple_dim > 0 && id >= c->ple_vocab))
            return g4_fail(h, BERTH_E_INVALID, "gemma4: token id %d at batch row %d is outside the vocabulary (%d)",
                           (int)id, t, c->ple_dim > 0 && c->ple_vocab < c->vocab ? c->ple_vocab : c->vocab);
        if (b->h_positions[t] < 0)
            return g4_fail(h, BERTH_E_INVALID, "gemma4: negative position %d at batch row %d", (int)b->h_positions[t],
                           t);
    }
    if (b->h_seq_q_start[0] != 0 || b->h_seq_q_start[b->n_seqs] != T)
        return g4_fail(h, BERTH_E_INVALID, "gemma4: seq_q_start must run from 0 to n_tokens = %d", T);
    for (int s = 0; s < b->n_seqs; s++)
        if (b->h_seq_q_start[s + 1] <= b->h_seq_q_start[s])
            return g4_fail(h, BERTH_E_INVALID, "gemma4: sequence %d of the batch has no new tokens", s);
    for (int r = 0; r < b->n_logits; r++) {
        if (b->h_logit_rows[r] < 0 || b->h_logit_rows[r] >= T)
            return g4_fail(h, BERTH_E_INVALID, "gemma4: logit row %d names token %d of a %d-token batch", r,
                           (int)b->h_logit_rows[r], T);
        if (r > 0 && b->h_logit_rows[r] <= b->h_logit_rows[r - 1]) /* head() relies on it (model.h) */
            return g4_fail(h, BERTH_E_INVALID, "gemma4: logit rows must be ascending and distinct: row %d names "
                           "token %d after token %d", r, (int)b->h_logit_rows[r], (int)b->h_logit_rows[r - 1]);
    }
    return BERTH_OK;
}

berth_status g4_forward(berth_model *m, berth_stream *s, const berth_batch *b)
{
    if (!m->loaded)
        return g4_fail(m->host, BERTH_E_INVALID, "gemma4: forward called before load");
    berth_status r = check_batch(m, b);
    if (r != BERTH_OK)
        return r;
    struct g4_step st = {.m = m, .s = s, .b = b, .buf = m->scratch_buf, .sc = &m->scratch, .T = b->n_tokens,
                          .fused = m->fused};
    if ((r = run_step(&st)) != BERTH_OK)
        return r;

    /* Counters: a sequence stepping one token at a position > 0 is a decode step; every other sequence's new
     * tokens (prompt chunks, and a one-token prompt at position 0) count as prefill tokens. */
    m->n_forward_calls++;
    m->n_logit_rows += b->n_logits;
    for (int q = 0; q < b->n_seqs; q++) {
        int32_t start = b->h_seq_q_start[q], n = b->h_seq_q_start[q + 1] - start;
        if (n == 1 && b->h_positions[start] > 0)
            m->n_decode_steps++;
        else
            m->n_prefill_tokens += n;
    }
    return BERTH_OK;
}

/*
 * gemma4_requirements.c — the requirement list (model.h requirements()).
 *
 * The list is produced by running forward() once in recording mode (gemma4_forward.c): every op call is handed
 * here instead of to a backend, reduced to what supports() looks at (buffers NULL, offsets 0, packed strides;
 * absent optional tensors stay all-zero) and kept if no equal call was recorded before. So the list is exactly
 * the set of distinct op + parameter combinations forward() issues, never a hand-kept copy of it.
 */
#include "gemma4_model.h"
#include "gemma4_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void canon_tensor(berth_tensor *t)
{
    if (t->ne[0] == 0) { /* absent in a supports() query (berth/backend.h): keep it all-zero */
        memset(t, 0, sizeof *t);
        return;
    }
    t->buf = NULL;
    t->offset = 0;
    g4_pack_strides(t);
}

static void canon_kv(berth_kv_view *v)
{
    v->k_buf = v->v_buf = NULL;
    v->k_offset = v->v_offset = 0;
}

static size_t params_size(int32_t op)
{
    switch (op) {
    case BERTH_OP_MATMUL: return sizeof(berth_matmul_params);
    case BERTH_OP_GET_ROWS: return sizeof(berth_get_rows_params);
    case BERTH_OP_RMS_NORM: return sizeof(berth_rms_norm_params);
    case BERTH_OP_UNARY: return sizeof(berth_unary_params);
    case BERTH_OP_KV_APPEND: return sizeof(berth_kv_append_params);
    case BERTH_OP_ATTENTION: return sizeof(berth_attention_params);
    default: return 0;
    }
}

static void canon(int32_t op, void *p)
{
    switch (op) {
    case BERTH_OP_MATMUL: {
        berth_matmul_params *q = p;
        canon_tensor(&q->x), canon_tensor(&q->w), canon_tensor(&q->bias), canon_tensor(&q->y);
        canon_tensor(&q->x_norm_w), canon_tensor(&q->y_glu_up);
        if (q->y_norm) /* the recorded copy's own trailing norm (g4_req_record) */
            canon(BERTH_OP_RMS_NORM, (void *)q->y_norm);
        if (q->x_pre) /* and its own norm before the product */
            canon(BERTH_OP_RMS_NORM, (void *)q->x_pre);
        if (q->y_then) /* and its own second product */
            canon(BERTH_OP_MATMUL, (void *)q->y_then);
        break;
    }
    case BERTH_OP_GET_ROWS: {
        berth_get_rows_params *q = p;
        canon_tensor(&q->table), canon_tensor(&q->ids), canon_tensor(&q->y);
        break;
    }
    case BERTH_OP_RMS_NORM: {
        berth_rms_norm_params *q = p;
        canon_tensor(&q->x), canon_tensor(&q->w), canon_tensor(&q->residual), canon_tensor(&q->y);
        canon_tensor(&q->rope_positions), canon_tensor(&q->rope_freqs);
        canon_tensor(&q->y2_w), canon_tensor(&q->y2);
        break;
    }
    case BERTH_OP_UNARY: {
        berth_unary_params *q = p;
        canon_tensor(&q->x), canon_tensor(&q->y);
        break;
    }
    case BERTH_OP_KV_APPEND: {
        berth_kv_append_params *q = p;
        canon_tensor(&q->k), canon_tensor(&q->v), canon_tensor(&q->slots), canon_tensor(&q->k_norm);
        canon_tensor(&q->v_norm), canon_tensor(&q->positions), canon_tensor(&q->rope_freqs);
        canon_tensor(&q->q), canon_tensor(&q->q_norm);
        canon_kv(&q->kv);
        break;
    }
    case BERTH_OP_ATTENTION: {
        berth_attention_params *q = p;
        canon_tensor(&q->q), canon_tensor(&q->out), canon_tensor(&q->gate), canon_tensor(&q->positions);
        canon_tensor(&q->seq_q_start), canon_tensor(&q->seq_kv_len), canon_tensor(&q->block_table);
        canon_kv(&q->kv);
        break;
    }
    default: break;
    }
}

static const char *act_name(int32_t act)
{
    switch (act) {
    case BERTH_ACT_IDENTITY: return "scale";
    case BERTH_ACT_GELU_TANH: return "gelu_tanh";
    case BERTH_ACT_TANH: return "tanh softcap";
    default: return "activation";
    }
}

static const char *norm_name(int32_t mode)
{
    switch (mode) {
    case BERTH_NORM_W: return "weight";
    case BERTH_NORM_W_ONE_PLUS: return "1+weight";
    case BERTH_NORM_UNIT: return "no weight";
    default: return "none";
    }
}

/* A sentence for error messages: "matmul q_proj (bf16 weight [2048, 1536])". */
static void describe(int32_t op, const void *p, const char *site, char *out, size_t n)
{
    switch (op) {
    case BERTH_OP_MATMUL: {
        const berth_matmul_params *q = p;
        char ndesc[64] = "", gdesc[64] = "";
        if (q->x_norm_mode != BERTH_NORM_W_NONE)
            snprintf(ndesc, sizeof ndesc, ", RMS-norm prologue with %s %s", g4_dtype_name(q->x_norm_w.dtype),
                     norm_name(q->x_norm_mode));
        if (q->y_glu != BERTH_GLU_NONE)
            snprintf(gdesc, sizeof gdesc, ", %s GLU epilogue (%s)", act_name(q->y_glu_act),
                     q->y_glu == BERTH_GLU_HALVES ? "gate and up halves" : "times y_glu_up");
        char tdesc[96] = "";
        if (q->y_then)
            snprintf(tdesc, sizeof tdesc, ", then a matmul of y by a %s weight [%lld, %lld]%s",
                     g4_dtype_name(q->y_then->w.dtype), (long long)q->y_then->w.ne[1], (long long)q->y_then->w.ne[0],
                     q->y_then->y_norm ? " and an rms_norm of its y" : "");
        snprintf(out, n, "matmul %s (%s weight [%lld, %lld], f32 activations%s%s%s%s%s)", site,
                 g4_dtype_name(q->w.dtype), (long long)q->w.ne[1], (long long)q->w.ne[0],
                 q->x_pre ? ", x from an rms_norm before it" : "", ndesc, gdesc,
                 q->y_norm ? ", then an rms_norm of y" : "", tdesc);
        break;
    }
    case BERTH_OP_GET_ROWS: {
        const berth_get_rows_params *q = p;
        snprintf(out, n, "get_rows %s (%s table [%lld, %lld])", site, g4_dtype_name(q->table.dtype),
                 (long long)q->table.ne[1], (long long)q->table.ne[0]);
        break;
    }
    case BERTH_OP_RMS_NORM: {
        const berth_rms_norm_params *q = p;
        char wdesc[48];
        if (q->weight_mode == BERTH_NORM_W_NONE || q->weight_mode == BERTH_NORM_UNIT)
            snprintf(wdesc, sizeof wdesc, "no weight");
        else
            snprintf(wdesc, sizeof wdesc, "%s %s", g4_dtype_name(q->w.dtype), norm_name(q->weight_mode));
        char rdesc[64] = "";
        if (q->rope_n_pairs > 0)
            snprintf(rdesc, sizeof rdesc, ", RoPE half split at %d, %d rotated pairs", q->rope_pair_offset,
                     q->rope_n_pairs);
        char ydesc[64] = "";
        if (q->y2.ne[0] != 0)
            snprintf(ydesc, sizeof ydesc, ", second output normalised again (%s %s)", g4_dtype_name(q->y2_w.dtype),
                     norm_name(q->y2_weight_mode));
        snprintf(out, n, "rms_norm %s (rows of %lld, %s%s%s%s%s)", site, (long long)q->x.ne[0], wdesc,
                 q->resid_mode == BERTH_RESID_ADD_AFTER ? ", residual added after" : "", rdesc,
                 q->out_scale != 0.0f ? ", output scaled" : "", ydesc);
        break;
    }
    case BERTH_OP_UNARY: {
        const berth_unary_params *q = p;
        snprintf(out, n, "unary %s (%s)", site, act_name(q->act));
        break;
    }
    case BERTH_OP_KV_APPEND: {
        const berth_kv_append_params *q = p;
        char qs[64] = "";
        if (q->q.ne[0] != 0)
            snprintf(qs, sizeof qs, ", %lld query heads normed %s", (long long)q->q.ne[1], norm_name(q->q_norm_mode));
        snprintf(out, n, "kv_append %s (head_dim %d, %d kv heads, K norm %s, RoPE half %d pairs, V norm %s%s, %s cache)",
                 site, q->kv.head_dim, q->kv.n_kv_heads, norm_name(q->k_norm_mode), q->rope_n_pairs,
                 norm_name(q->v_norm_mode), qs, g4_dtype_name(q->kv.dtype));
        break;
    }
    case BERTH_OP_ATTENTION: {
        const berth_attention_params *q = p;
        snprintf(out, n, "attention %s (head_dim %d, %lld heads / %d kv heads, causal, window %d, scale %g, %s cache)",
                 site, q->kv.head_dim, (long long)q->q.ne[1], q->kv.n_kv_heads, q->window, (double)q->scale,
                 g4_dtype_name(q->kv.dtype));
        break;
    }
    default: snprintf(out, n, "op %d %s", (int)op, site); break;
    }
}

/* Two optional norms (NULL or recorded copies) are the same: both absent, or equal bytes. */
static int same_norm(const berth_rms_norm_params *a, const berth_rms_norm_params *b)
{
    return a && b ? memcmp(a, b, sizeof *a) == 0 : a == b;
}

/* Same recorded matmuls: bytes, except that the y_norm, x_pre and y_then pointers are compared by what they point
 * to. */
static int same_matmul(const berth_matmul_params *a, const berth_matmul_params *b)
{
    if (!a || !b)
        return a == b;
    berth_matmul_params x = *a, y = *b;
    x.y_norm = y.y_norm = NULL;
    x.x_pre = y.x_pre = NULL;
    x.y_then = y.y_then = NULL;
    return memcmp(&x, &y, sizeof x) == 0 && same_norm(a->y_norm, b->y_norm) && same_norm(a->x_pre, b->x_pre) &&
           same_matmul(a->y_then, b->y_then);
}

static int same_params(int32_t op, const void *a, const void *b)
{
    return op == BERTH_OP_MATMUL ? same_matmul(a, b) : memcmp(a, b, params_size(op)) == 0;
}

/* Room for a deep copy of matmul p (its norms, its second product and that one's norms). */
static size_t matmul_copy_size(const berth_matmul_params *p)
{
    return sizeof *p + ((p->y_norm != NULL) + (p->x_pre != NULL)) * sizeof(berth_rms_norm_params) +
           (p->y_then ? matmul_copy_size(p->y_then) : 0);
}

/* Deep-copies p to dst (matmul_copy_size(p) bytes): the matmul, then its trailing norm (y_norm), its norm before
 * the product (x_pre) and its second product (y_then, copied the same way), in that order. Returns the end. */
static char *matmul_copy(const berth_matmul_params *p, char *dst)
{
    berth_matmul_params *c = (berth_matmul_params *)dst;
    memcpy(c, p, sizeof *p);
    char *at = dst + sizeof *p;
    if (p->y_norm) {
        memcpy(at, p->y_norm, sizeof *p->y_norm);
        c->y_norm = (const berth_rms_norm_params *)at;
        at += sizeof *p->y_norm;
    }
    if (p->x_pre) {
        memcpy(at, p->x_pre, sizeof *p->x_pre);
        c->x_pre = (const berth_rms_norm_params *)at;
        at += sizeof *p->x_pre;
    }
    if (p->y_then) {
        c->y_then = (const berth_matmul_params *)at;
        at = matmul_copy(p->y_then, at);
    }
    return at;
}

berth_status g4_req_record(berth_model *m, int32_t op, const void *params, const char *site)
{
    size_t sz = params_size(op);
    if (sz == 0)
        return g4_fail(m->host, BERTH_E_INTERNAL, "gemma4: recording unknown op %d", (int)op);
    /* A matmul's norms and second product are copied into the same allocation, after it (matmul_copy). All the
     * structs have pointer alignment and sizes that keep it. */
    const berth_matmul_params *mp = op == BERTH_OP_MATMUL ? params : NULL;
    void *copy = malloc(mp ? matmul_copy_size(mp) : sz);
    if (!copy)
        return g4_fail(m->host, BERTH_E_NOMEM, "out of memory recording requirements");
    if (mp)
        matmul_copy(mp, copy);
    else
        memcpy(copy, params, sz);
    canon(op, copy);
    for (int i = 0; i < m->n_reqs; i++) {
        if (m->reqs[i]->op == op && same_params(op, m->req_params[i], copy)) {
            free(copy);
            return BERTH_OK;
        }
    }
    if (m->n_reqs == m->cap_reqs) {
        int ncap = m->cap_reqs ? 2 * m->cap_reqs : 32;
        berth_requirement **r = realloc(m->reqs, (size_t)ncap * sizeof *r);
        if (r)
            m->reqs = r;
        void **pp = r ? realloc(m->req_params, (size_t)ncap * sizeof *pp) : NULL;
        if (pp)
            m->req_params = pp;
        char **ww = pp ? realloc(m->req_what, (size_t)ncap * sizeof *ww) : NULL;
        if (!ww) {
            free(copy);
            return g4_fail(m->host, BERTH_E_NOMEM, "out of memory recording requirements");
        }
        m->req_what = ww;
        m->cap_reqs = ncap;
    }
    char what[512];
    describe(op, copy, site, what, sizeof what);
    char *w = strdup(what);
    berth_requirement *r = w ? calloc(1, sizeof *r) : NULL;
    if (!r) {
        free(w);
        free(copy);
        return g4_fail(m->host, BERTH_E_NOMEM, "out of memory recording requirements");
    }
    /* Each requirement is its own allocation, so the pointers requirements() hands out stay valid when the
     * arrays grow. */
    r->struct_size = sizeof *r;
    r->op = op;
    r->params = copy;
    r->what = w;
    m->reqs[m->n_reqs] = r;
    m->req_params[m->n_reqs] = copy;
    m->req_what[m->n_reqs] = w;
    m->n_reqs++;
    return BERTH_OK;
}

void g4_req_free(berth_model *m)
{
    for (int i = 0; i < m->n_reqs; i++) {
        free(m->reqs[i]);
        free(m->req_params[i]);
        free(m->req_what[i]);
    }
    free(m->reqs);
    free(m->req_params);
    free(m->req_what);
    m->reqs = NULL;
    m->req_params = NULL;
    m->req_what = NULL;
    m->n_reqs = m->cap_reqs = 0;
}

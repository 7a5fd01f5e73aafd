/*
 * kv.c — kv_append: write the K and V of new tokens into the paged cache, optionally RMS-normalising K (then
 * rotating it) and V per head first, all in fp32, then storing in the cache dtype (f32, bf16 or f16,
 * rounded to nearest even). Norm mode W_NONE stores the vector as given, UNIT normalises without a weight.
 * K and V are addressed with their own token/head strides. Negative slots skip their token (its K and V; the
 * query side, when given, is normalised and rotated in place for every token, with rms_norm's and rope's own row
 * routines, so the result equals rms_norm with RoPE bit for bit).
 */
#include <inttypes.h>
#include <math.h>

#include "convert.h"
#include "cpu_backend.h"

#define KV_ROPE_CHUNK 64

/* Normalise, rotate and store one head vector: src (n f32) -> dst (cache dtype), via the f32 buffer tmp. */
static void kv_store_head(const berth_kv_append_params *p, const float *src, int64_t n, int32_t norm_mode,
                          const berth_tensor *norm_w, int rotate, const float *cs, const float *sn, float *tmp,
                          void *dst)
{
    if (norm_mode == BERTH_NORM_W_NONE && !rotate) {
        cpu_store_row(dst, p->kv.dtype, src, n);
        return;
    }
    memcpy(tmp, src, (size_t)n * sizeof *tmp);
    if (norm_mode != BERTH_NORM_W_NONE) /* UNIT: normalise, no weight (norm_w may be absent) */
        cpu_rms_norm_row(tmp, n, p->eps, norm_mode, opck_norm_has_weight(norm_mode) ? cpu_data(norm_w) : NULL,
                         norm_w->dtype);
    if (rotate)
        for (int32_t j0 = 0; j0 < p->rope_n_pairs; j0 += KV_ROPE_CHUNK) {
            const int32_t nj = p->rope_n_pairs - j0 < KV_ROPE_CHUNK ? p->rope_n_pairs - j0 : KV_ROPE_CHUNK;
            const int64_t first = p->rope_mode == BERTH_ROPE_HALF ? j0 : 2 * (int64_t)j0;
            cpu_rope_apply(tmp + first, p->rope_mode, p->rope_pair_offset, nj, cs + j0, sn + j0);
        }
    cpu_store_row(dst, p->kv.dtype, tmp, n);
}

struct kv_ctx {
    const berth_kv_append_params *p;
    berth_backend *be;
    int has_q; /* the query side (ABI 0.5) is present */
};

static void kv_task(void *arg, int tid, int nth)
{
    const struct kv_ctx *c = arg;
    const berth_kv_append_params *p = c->p;
    const berth_kv_view *kv = &p->kv;
    const int64_t T = p->k.ne[2];
    const int64_t dmax = kv->head_dim > kv->head_dim_v ? kv->head_dim : kv->head_dim_v;
    float *tmp = cpu_thread_scratch(c->be, tid);
    float *cs = tmp + dmax, *sn = cs + p->rope_n_pairs;
    int64_t t0, t1;
    cpu_split(T, 1, tid, nth, &t0, &t1);
    const int has_q = c->has_q;
    for (int64_t t = t0; t < t1; t++) {
        if (has_q) { /* the query side: rms_norm's row routine, then the rope op's, in place (as rms_norm + RoPE) */
            const int64_t H = p->q.ne[1];
            char *q0 = cpu_data(&p->q) + t * p->q.nb[2];
            if (p->q_norm_mode != BERTH_NORM_W_NONE)
                for (int64_t h = 0; h < H; h++)
                    cpu_rms_norm_row((float *)(q0 + h * p->q.nb[1]), p->q.ne[0], p->eps, p->q_norm_mode,
                                     opck_norm_has_weight(p->q_norm_mode) ? cpu_data(&p->q_norm) : NULL,
                                     p->q_norm.dtype);
            if (p->rope_n_pairs > 0)
                cpu_rope_token(q0, p->q.nb[1], H, p->rope_mode, p->rope_pair_offset, p->rope_n_pairs,
                               (float)cpu_i32_at(&p->positions, t), (const float *)cpu_data(&p->rope_freqs));
        }
        const int32_t slot = cpu_i32_at(&p->slots, t);
        if (slot < 0)
            continue;
        if (p->rope_n_pairs > 0) {
            const float pos = (float)cpu_i32_at(&p->positions, t);
            const float *freqs = (const float *)cpu_data(&p->rope_freqs);
            for (int32_t j = 0; j < p->rope_n_pairs; j++) {
                const float a = pos * freqs[j];
                cs[j] = cosf(a);
                sn[j] = sinf(a);
            }
        }
        const uint64_t boff = (uint64_t)(slot / kv->block_size) * kv->block_stride;
        const uint64_t s_in_block = (uint64_t)(slot % kv->block_size);
        const uint64_t koff = boff + s_in_block * kv->token_stride, voff = boff + s_in_block * kv->v_token_stride;
        for (int32_t h = 0; h < kv->n_kv_heads; h++) {
            const float *k = (const float *)(cpu_data(&p->k) + h * p->k.nb[1] + t * p->k.nb[2]);
            const float *v = (const float *)(cpu_data(&p->v) + h * p->v.nb[1] + t * p->v.nb[2]);
            kv_store_head(p, k, kv->head_dim, p->k_norm_mode, &p->k_norm, p->rope_n_pairs > 0, cs, sn, tmp,
                          (char *)kv->k_buf->ptr + kv->k_offset + koff + (uint64_t)h * kv->head_stride);
            kv_store_head(p, v, kv->head_dim_v, p->v_norm_mode, &p->v_norm, 0, NULL, NULL, tmp,
                          (char *)kv->v_buf->ptr + kv->v_offset + voff + (uint64_t)h * kv->v_head_stride);
        }
    }
}

berth_status cpu_op_kv_append(berth_backend *be, berth_stream *s, const berth_kv_append_params *p)
{
    CPU_OP_BEGIN(be, kv_append, p);
    const berth_kv_view *kv = &p->kv;
    const int64_t T = p->k.ne[2];
    const int64_t capacity = (int64_t)kv->n_blocks * kv->block_size;
    berth_status st = BERTH_OK;
    for (int64_t t = 0; t < T; t++) {
        const int32_t slot = cpu_i32_at(&p->slots, t);
        if (slot >= capacity) {
            struct opck c = {0};
            opck_fail(&c, BERTH_E_INVALID, "kv_append: slots[%" PRId64 "] = %d is outside the pool (0..%" PRId64 ")",
                      t, slot, capacity - 1);
            st = cpu_report(be, &c);
            goto out;
        }
    }
    const int64_t dmax = kv->head_dim > kv->head_dim_v ? kv->head_dim : kv->head_dim_v;
    st = cpu_scratch_threads(be, (size_t)(dmax + 2 * (int64_t)p->rope_n_pairs) * sizeof(float));
    if (st != BERTH_OK)
        goto out;
    struct kv_ctx c = {.p = p, .be = be, .has_q = opck_kv_append_runs_q(p)};
    const double work = (double)T * kv->n_kv_heads * (double)(kv->head_dim + kv->head_dim_v) * 4.0 +
                        (c.has_q ? (double)T * (double)p->q.ne[1] * (double)p->q.ne[0] * 4.0 : 0.0);
    int nth = cpu_threads_for(be, work, 16384.0);
    cpu_pool_run(be->pool, nth > T ? (int)(T > 0 ? T : 1) : nth, kv_task, &c);
out:
    CPU_OP_END(be);
    return st;
}

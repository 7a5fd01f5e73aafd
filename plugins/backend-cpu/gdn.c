/*
 * gdn.c — the recurrent ops of Gated DeltaNet layers (Qwen3.5): conv1d_causal (depthwise causal conv with a
 * carried window) and gated_delta (the gated delta rule), each over a batch of sequences whose state lives in
 * host-managed pools.
 *
 * Parallel over channels (conv) or value heads (delta rule), with the sequences and their tokens done in order
 * inside: each thread owns whole state rows, so two sequences naming the same slot cannot race.
 *
 * gated_delta evaluates the recurrence token by token whatever chunk_size says (a hint the header lets a backend
 * ignore: the chunked form equals the recurrence up to rounding). Its state matrix S (d_k x d_v, row index = key
 * dim) is stored as berth/backend.h and Hugging Face lay it out, [slot][head][d_k][d_v], i.e.
 * ne {d_v, d_k, n_v_heads, n_slots}: each key row of S is d_v contiguous floats.
 */
#include <inttypes.h>
#include <math.h>

#include "convert.h"
#include "cpu_backend.h"
#include "simd.h"

/* seq_q_start rises from 0 to T and state_slots name slots of the pool. */
static bool check_seq_layout(struct opck *c, const char *op, const berth_tensor *seq_q_start,
                             const berth_tensor *state_slots, int32_t n_seqs, int64_t T, int64_t n_slots)
{
    for (int32_t i = 0; i < n_seqs; i++) {
        const int32_t q0 = cpu_i32_at(seq_q_start, i), q1 = cpu_i32_at(seq_q_start, i + 1);
        if ((i == 0 && q0 != 0) || q1 < q0 || q1 > T || (i + 1 == n_seqs && q1 != T))
            return opck_fail(c, BERTH_E_INVALID,
                             "%s: seq_q_start must rise from 0 to T = %" PRId64 " (seq %d: [%d, %d))", op, T, i, q0, q1);
        const int32_t slot = cpu_i32_at(state_slots, i);
        if (slot < 0 || slot >= n_slots)
            return opck_fail(c, BERTH_E_INVALID, "%s: state_slots[%d] = %d is not a slot of the pool (0..%" PRId64 ")",
                             op, i, slot, n_slots - 1);
    }
    if (n_seqs == 0 && T > 0)
        return opck_fail(c, BERTH_E_INVALID, "%s: %" PRId64 " tokens but no sequence", op, T);
    return true;
}

/* ---------------------------------------------------------------------------------------------------------
 * conv1d_causal */

static void conv_range(const void *arg, int64_t c0, int64_t c1)
{
    const berth_conv1d_causal_params *p = arg;
    const int64_t K = p->w.ne[0];
    for (int64_t ch = c0; ch < c1; ch++) {
        float w[CPU_CONV_MAX_K];
        cpu_load_row(w, cpu_data(&p->w) + ch * p->w.nb[1], p->w.dtype, K);
        const float bias = p->bias.buf ? cpu_load(cpu_data(&p->bias), p->bias.dtype, ch) : 0.0f;
        for (int32_t i = 0; i < p->n_seqs; i++) {
            const int32_t q0 = cpu_i32_at(&p->seq_q_start, i), q1 = cpu_i32_at(&p->seq_q_start, i + 1);
            float *state = (float *)(cpu_data(&p->state) + ch * p->state.nb[1] +
                                     cpu_i32_at(&p->state_slots, i) * p->state.nb[2]);
            float win[CPU_CONV_MAX_K]; /* win[0..K-2]: previous inputs, oldest first; win[K-1]: current */
            memcpy(win, state, (size_t)(K - 1) * sizeof *win);
            for (int32_t t = q0; t < q1; t++) {
                win[K - 1] = ((const float *)(cpu_data(&p->x) + t * p->x.nb[1]))[ch];
                float acc = bias;
                for (int64_t j = 0; j < K; j++)
                    acc += w[j] * win[j];
                ((float *)(cpu_data(&p->y) + t * p->y.nb[1]))[ch] = cpu_act(p->act, acc);
                memmove(win, win + 1, (size_t)(K - 1) * sizeof *win);
            }
            memcpy(state, win, (size_t)(K - 1) * sizeof *win);
        }
    }
}

berth_status cpu_op_conv1d_causal(berth_backend *be, berth_stream *s, const berth_conv1d_causal_params *p)
{
    CPU_OP_BEGIN(be, conv1d_causal, p);
    struct opck ck = {0};
    berth_status st = BERTH_OK;
    if (!check_seq_layout(&ck, "conv1d_causal", &p->seq_q_start, &p->state_slots, p->n_seqs, p->x.ne[1],
                          p->state.ne[2]))
        st = cpu_report(be, &ck);
    else
        cpu_parallel_for(be, p->x.ne[0], 4.0 * (double)p->x.ne[1] * (double)p->w.ne[0], conv_range, p);
    CPU_OP_END(be);
    return st;
}

/* ---------------------------------------------------------------------------------------------------------
 * gated_delta */

struct delta_ctx {
    const berth_gated_delta_params *p;
    berth_backend *be;
};

/* The recurrence for value head h over every sequence; tmp holds 2*d_k + 3*d_v floats. */
CPU_MULTIVERSION
static void delta_head(const berth_gated_delta_params *p, int64_t h, float *tmp)
{
    const int64_t dk = p->q.ne[0], dv = p->v.ne[0], rep = p->v.ne[1] / p->q.ne[1];
    const int64_t kh = h / rep;
    float *q = tmp, *k = q + dk, *u = k + dk, *delta = u + dv, *o = delta + dv;
    for (int32_t i = 0; i < p->n_seqs; i++) {
        const int32_t q0 = cpu_i32_at(&p->seq_q_start, i), q1 = cpu_i32_at(&p->seq_q_start, i + 1);
        char *S = cpu_data(&p->state) + h * p->state.nb[2] + cpu_i32_at(&p->state_slots, i) * p->state.nb[3];
        for (int32_t t = q0; t < q1; t++) {
            memcpy(q, cpu_data(&p->q) + kh * p->q.nb[1] + t * p->q.nb[2], (size_t)dk * sizeof *q);
            memcpy(k, cpu_data(&p->k) + kh * p->k.nb[1] + t * p->k.nb[2], (size_t)dk * sizeof *k);
            float qs = p->scale;
            if (p->qk_l2norm) {
                const float kinv = 1.0f / sqrtf(cpu_sumsq(k, dk) + 1e-6f);
                for (int64_t j = 0; j < dk; j++)
                    k[j] *= kinv;
                qs *= 1.0f / sqrtf(cpu_sumsq(q, dk) + 1e-6f);
            }
            for (int64_t j = 0; j < dk; j++)
                q[j] *= qs;
            const float decay = expf(((const float *)(cpu_data(&p->g) + t * p->g.nb[1]))[h]);
            const float beta = ((const float *)(cpu_data(&p->beta) + t * p->beta.nb[1]))[h];
            const float *v = (const float *)(cpu_data(&p->v) + h * p->v.nb[1] + t * p->v.nb[2]);
            /* S = decay * S; u = S^T k */
            memset(u, 0, (size_t)dv * sizeof *u);
            for (int64_t r = 0; r < dk; r++) {
                float *row = (float *)(S + r * p->state.nb[1]);
                for (int64_t j = 0; j < dv; j++)
                    row[j] *= decay;
                cpu_axpy(u, k[r], row, BERTH_DTYPE_F32, dv);
            }
            for (int64_t j = 0; j < dv; j++)
                delta[j] = beta * (v[j] - u[j]);
            /* S += k delta^T; out = S^T q */
            memset(o, 0, (size_t)dv * sizeof *o);
            for (int64_t r = 0; r < dk; r++) {
                float *row = (float *)(S + r * p->state.nb[1]);
                cpu_axpy(row, k[r], delta, BERTH_DTYPE_F32, dv);
                cpu_axpy(o, q[r], row, BERTH_DTYPE_F32, dv);
            }
            memcpy(cpu_data(&p->out) + h * p->out.nb[1] + t * p->out.nb[2], o, (size_t)dv * sizeof *o);
        }
    }
}

static void delta_task(void *arg, int tid, int nth)
{
    const struct delta_ctx *c = arg;
    float *tmp = cpu_thread_scratch(c->be, tid);
    int64_t h0, h1;
    cpu_split(c->p->v.ne[1], 1, tid, nth, &h0, &h1);
    for (int64_t h = h0; h < h1; h++)
        delta_head(c->p, h, tmp);
}

berth_status cpu_op_gated_delta(berth_backend *be, berth_stream *s, const berth_gated_delta_params *p)
{
    CPU_OP_BEGIN(be, gated_delta, p);
    struct opck ck = {0};
    berth_status st = BERTH_OK;
    const int64_t dk = p->q.ne[0], dv = p->v.ne[0], Hv = p->v.ne[1], T = p->q.ne[2];
    if (!check_seq_layout(&ck, "gated_delta", &p->seq_q_start, &p->state_slots, p->n_seqs, T, p->state.ne[3])) {
        st = cpu_report(be, &ck);
    } else {
        st = cpu_scratch_threads(be, (size_t)(2 * dk + 3 * dv) * sizeof(float));
        if (st == BERTH_OK && Hv > 0) {
            struct delta_ctx c = {.p = p, .be = be};
            int nth = cpu_threads_for(be, (double)Hv * (double)T * (double)(dk * dv) * 4.0, 32768.0);
            cpu_pool_run(be->pool, nth > Hv ? (int)Hv : nth, delta_task, &c);
        }
    }
    CPU_OP_END(be);
    return st;
}

/*
 * attention.c — attention of mixed prefill chunks and decode rows over the paged KV cache.
 *
 * One work item is (query row, KV head): the n_rep query heads that share a KV head are done together, so
 * every K and V vector is read once per item and used n_rep times (GQA). Items are handed out dynamically
 * (an atomic counter) because causal rows differ in length. Softmax is exact two-pass fp32 over one score row
 * per query head, kept in the thread's scratch (n_rep x visible keys floats): no T x T memory anywhere.
 * A query row that sees no key at all (empty sequence, window before the first key) gets zeros.
 */
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>

#include "cpu_backend.h"
#include "simd.h"

struct attn_ctx {
    const berth_attention_params *p;
    berth_backend *be;
    const int32_t *row_seq; /* sequence of each query row */
    int64_t n_items;        /* T * n_kv_heads */
    int32_t n_rep;
    int64_t max_keys;       /* score row capacity per head */
    atomic_llong next;
    atomic_int failed;      /* first bad block-table entry wins */
    int32_t bad_seq, bad_index, bad_value;
};

/* Keys [*lo, *hi) that query row t (in sequence seq) sees. */
static void visible_keys(const berth_attention_params *p, int64_t t, int32_t kv_len, int64_t *lo, int64_t *hi)
{
    if (p->mask == BERTH_MASK_NONE) {
        *lo = 0;
        *hi = kv_len;
        return;
    }
    const int64_t pos = cpu_i32_at(&p->positions, t);
    int64_t h = pos + 1 < kv_len ? pos + 1 : kv_len;
    int64_t l = p->window > 0 ? pos - p->window + 1 : 0;
    *lo = l > 0 ? l : 0;
    *hi = h > *lo ? h : *lo;
}

/* Byte offset of the block holding key j of a sequence, or -1 (and the failure recorded) for a bad table entry.
 * The key's slot in that block is j % block_size; K and V step over slots with their own token strides. */
static int64_t key_block_offset(struct attn_ctx *c, int32_t seq, const int32_t *bt, int64_t j)
{
    const berth_kv_view *kv = &c->p->kv;
    const int32_t b = bt[j / kv->block_size];
    if (b < 0 || b >= kv->n_blocks) {
        int expected = 0;
        if (atomic_compare_exchange_strong(&c->failed, &expected, 1)) {
            c->bad_seq = seq;
            c->bad_index = (int32_t)(j / kv->block_size);
            c->bad_value = b;
        }
        return -1;
    }
    return (int64_t)((uint64_t)b * kv->block_stride);
}

CPU_MULTIVERSION
static void attn_item(struct attn_ctx *c, int64_t item, float *scratch)
{
    const berth_attention_params *p = c->p;
    const berth_kv_view *kv = &p->kv;
    const int64_t t = item / kv->n_kv_heads;
    const int32_t g = (int32_t)(item % kv->n_kv_heads);
    const int32_t seq = c->row_seq[t];
    const int32_t kv_len = cpu_i32_at(&p->seq_kv_len, seq);
    const int32_t *bt = (const int32_t *)(cpu_data(&p->block_table) + seq * p->block_table.nb[1]);
    const int64_t hd = kv->head_dim, hdv = kv->head_dim_v;
    const int32_t n_rep = c->n_rep;
    const char *kbase = (const char *)kv->k_buf->ptr + kv->k_offset + (uint64_t)g * kv->head_stride;
    const char *vbase = (const char *)kv->v_buf->ptr + kv->v_offset + (uint64_t)g * kv->v_head_stride;

    int64_t lo, hi;
    visible_keys(p, t, kv_len, &lo, &hi);
    const int64_t n = hi - lo;
    float *scores = scratch;                 /* n_rep x n */
    float *acc = scratch + n_rep * c->max_keys; /* n_rep x hdv */

    const float *q[CPU_ATTN_MAX_REP];
    float denom[CPU_ATTN_MAX_REP], mx[CPU_ATTN_MAX_REP];
    for (int32_t r = 0; r < n_rep; r++)
        q[r] = (const float *)(cpu_data(&p->q) + (g * n_rep + r) * p->q.nb[1] + t * p->q.nb[2]);

    /* pass 1: scores and their max */
    for (int32_t r = 0; r < n_rep; r++)
        mx[r] = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        const int64_t boff = key_block_offset(c, seq, bt, lo + j);
        if (boff < 0)
            return;
        const char *k = kbase + boff + (uint64_t)((lo + j) % kv->block_size) * kv->token_stride;
        for (int32_t r = 0; r < n_rep; r++) {
            float sc = p->scale * cpu_dot(q[r], k, kv->dtype, hd);
            if (p->softcap > 0.0f)
                sc = p->softcap * tanhf(sc / p->softcap);
            scores[r * n + j] = sc;
            mx[r] = sc > mx[r] ? sc : mx[r];
        }
    }
    /* pass 2: probabilities (unnormalised) and their sum */
    for (int32_t r = 0; r < n_rep; r++) {
        float sum = 0.0f;
        for (int64_t j = 0; j < n; j++) {
            const float e = expf(scores[r * n + j] - mx[r]);
            scores[r * n + j] = e;
            sum += e;
        }
        denom[r] = sum;
        memset(acc + r * hdv, 0, (size_t)hdv * sizeof *acc);
    }
    /* pass 3: weighted sum of V */
    for (int64_t j = 0; j < n; j++) {
        const char *v = vbase + key_block_offset(c, seq, bt, lo + j) +
                        (uint64_t)((lo + j) % kv->block_size) * kv->v_token_stride;
        for (int32_t r = 0; r < n_rep; r++)
            cpu_axpy(acc + r * hdv, scores[r * n + j], v, kv->dtype, hdv);
    }
    for (int32_t r = 0; r < n_rep; r++) {
        const int64_t h = g * n_rep + r;
        float *out = (float *)(cpu_data(&p->out) + h * p->out.nb[1] + t * p->out.nb[2]);
        const float inv = n > 0 ? 1.0f / denom[r] : 0.0f;
        const float *gate = p->gate.buf ? (const float *)(cpu_data(&p->gate) + h * p->gate.nb[1] + t * p->gate.nb[2])
                                        : NULL;
        for (int64_t i = 0; i < hdv; i++) {
            float o = acc[r * hdv + i] * inv;
            if (gate)
                o *= 1.0f / (1.0f + expf(-gate[i]));
            out[i] = o;
        }
    }
}

static void attn_task(void *arg, int tid, int nth)
{
    struct attn_ctx *c = arg;
    float *scratch = cpu_thread_scratch(c->be, tid);
    for (;;) {
        const int64_t item = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed);
        if (item >= c->n_items || atomic_load_explicit(&c->failed, memory_order_relaxed))
            return;
        attn_item(c, item, scratch);
    }
}

berth_status cpu_op_attention(berth_backend *be, berth_stream *s, const berth_attention_params *p)
{
    CPU_OP_BEGIN(be, attention, p);
    const berth_kv_view *kv = &p->kv;
    const int64_t T = p->q.ne[2], H = p->q.ne[1];
    const int32_t n_rep = (int32_t)(H / kv->n_kv_heads);
    struct opck ck = {0};
    berth_status st = BERTH_OK;
    int32_t *row_seq = NULL;

    /* Host-written metadata: validate before any thread reads through it. */
    if (T > 0 && p->n_seqs == 0) {
        opck_fail(&ck, BERTH_E_INVALID, "attention: %" PRId64 " query rows but no sequence", T);
        goto fail;
    }
    st = cpu_scratch_shared(be, (size_t)(T > 0 ? T : 1) * sizeof(int32_t), (void **)&row_seq);
    if (st != BERTH_OK)
        goto out;
    int64_t max_keys = 1;
    const int64_t max_blocks = p->block_table.ne[0];
    for (int32_t i = 0; i < p->n_seqs; i++) {
        const int32_t q0 = cpu_i32_at(&p->seq_q_start, i), q1 = cpu_i32_at(&p->seq_q_start, i + 1);
        const int32_t kv_len = cpu_i32_at(&p->seq_kv_len, i);
        if ((i == 0 && q0 != 0) || q1 < q0 || q1 > T || (i + 1 == p->n_seqs && q1 != T)) {
            opck_fail(&ck, BERTH_E_INVALID, "attention: seq_q_start must rise from 0 to T = %" PRId64
                      " (seq %d: [%d, %d))", T, i, q0, q1);
            goto fail;
        }
        if (kv_len < 0 || (kv_len + (int64_t)kv->block_size - 1) / kv->block_size > max_blocks) {
            opck_fail(&ck, BERTH_E_INVALID, "attention: seq_kv_len[%d] = %d does not fit %" PRId64 " blocks of %d", i,
                      kv_len, max_blocks, kv->block_size);
            goto fail;
        }
        for (int32_t t = q0; t < q1; t++) {
            row_seq[t] = i;
            int64_t lo, hi;
            visible_keys(p, t, kv_len, &lo, &hi);
            max_keys = hi - lo > max_keys ? hi - lo : max_keys;
        }
    }
    st = cpu_scratch_threads(be, ((size_t)n_rep * (size_t)max_keys + (size_t)n_rep * (size_t)kv->head_dim_v) *
                                     sizeof(float));
    if (st != BERTH_OK)
        goto out;

    struct attn_ctx c = {
        .p = p, .be = be, .row_seq = row_seq, .n_items = T * kv->n_kv_heads, .n_rep = n_rep, .max_keys = max_keys,
    };
    atomic_init(&c.next, 0);
    atomic_init(&c.failed, 0);
    const double work = (double)T * (double)H * (double)max_keys * (double)(kv->head_dim + kv->head_dim_v);
    int nth = cpu_threads_for(be, work, 32768.0);
    if (nth > c.n_items)
        nth = (int)(c.n_items > 0 ? c.n_items : 1);
    cpu_pool_run(be->pool, nth, attn_task, &c);
    if (atomic_load(&c.failed)) {
        opck_fail(&ck, BERTH_E_INVALID, "attention: block_table[seq %d][%d] = %d is not a block of the pool (0..%d)",
                  c.bad_seq, c.bad_index, c.bad_value, kv->n_blocks - 1);
        goto fail;
    }
    goto out;
fail:
    st = cpu_report(be, &ck);
out:
    CPU_OP_END(be);
    return st;
}

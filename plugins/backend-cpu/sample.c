/*
 * sample.c — token selection over the vocabulary: log_softmax_topk (beam search) and sample.
 *
 * Sampling, per row, exactly (so another backend can match it):
 *   z = logits with penalties over the row's history (each distinct id: repetition r divides a positive logit
 *       by r and multiplies a negative one by r; then, with o the id's count in the row's output — the history
 *       from history_output_start on, all of it without one —, z -= presence if o > 0; z -= frequency*o);
 *   logprob / top logprobs = z - logsumexp(z) (temperature-free), top ids ordered by z descending, ties to the
 *       lower id;
 *   temperature <= 0: the id of max z (ties: lower id). Otherwise w = z / temperature;
 *   top-k (0 < k < V): keep the k largest w (ties: lower id);
 *   softmax over the kept set;
 *   top-p (< 1): order kept ids by probability descending (ties: lower id), keep the shortest prefix whose
 *       cumulative probability reaches top_p (at least one id);
 *   min-p (> 0): keep ids with probability >= min_p * (largest probability);
 *   draw: u in [0, 1) from Philox-4x32-10 with key (seed & 0xffffffff, seed >> 32) and counter
 *       (counter & 0xffffffff, counter >> 32, 0, 0); with outputs r0, r1: u = ((r0 << 32 | r1) >> 11) * 2^-53.
 *       Walk the survivors in increasing id order summing their probabilities; the first id where the sum
 *       exceeds u * (sum over all survivors) is chosen (the last survivor if rounding leaves none).
 *   u depends only on (seed, counter), so a row's token never depends on the other rows of the batch.
 * NULL per-row arrays mean "off" (temperature NULL: greedy; seed and counter NULL: 0).
 */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_backend.h"

/* ---------------------------------------------------------------------------------------------------------
 * Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011). */

static void philox4x32_10(uint32_t ctr[4], uint32_t k0, uint32_t k1)
{
    for (int round = 0; round < 10; round++) {
        const uint64_t p0 = (uint64_t)0xD2511F53u * ctr[0];
        const uint64_t p1 = (uint64_t)0xCD9E8D57u * ctr[2];
        const uint32_t c0 = (uint32_t)(p1 >> 32) ^ ctr[1] ^ k0;
        const uint32_t c2 = (uint32_t)(p0 >> 32) ^ ctr[3] ^ k1;
        ctr[1] = (uint32_t)p1;
        ctr[3] = (uint32_t)p0;
        ctr[0] = c0;
        ctr[2] = c2;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
}

static double uniform01(uint64_t seed, uint64_t counter)
{
    uint32_t ctr[4] = {(uint32_t)counter, (uint32_t)(counter >> 32), 0, 0};
    philox4x32_10(ctr, (uint32_t)seed, (uint32_t)(seed >> 32));
    return (double)((((uint64_t)ctr[0] << 32) | ctr[1]) >> 11) * 0x1p-53;
}

/* ---------------------------------------------------------------------------------------------------------
 * Ordering helpers: id a ranks before id b when v[a] > v[b], or equal and a < b. Heaps of ids keep the
 * worst-ranked id at the root. */

static inline bool ranks_before(const float *v, int32_t a, int32_t b)
{
    return v[a] > v[b] || (v[a] == v[b] && a < b);
}

static void sift_down(int32_t *h, int64_t n, int64_t i, const float *v)
{
    for (;;) {
        int64_t worst = i;
        const int64_t l = 2 * i + 1, r = l + 1;
        if (l < n && ranks_before(v, h[worst], h[l]))
            worst = l;
        if (r < n && ranks_before(v, h[worst], h[r]))
            worst = r;
        if (worst == i)
            return;
        const int32_t t = h[i];
        h[i] = h[worst];
        h[worst] = t;
        i = worst;
    }
}

/* The k best-ranked ids of [0, V) into out[0..k), best first. */
static void top_ids(const float *v, int64_t V, int64_t k, int32_t *out)
{
    int64_t n = 0;
    for (int32_t id = 0; id < V; id++) {
        if (n < k) {
            out[n++] = id;
            if (n == k)
                for (int64_t i = k / 2; i-- > 0;)
                    sift_down(out, k, i, v);
        } else if (ranks_before(v, id, out[0])) {
            out[0] = id;
            sift_down(out, k, 0, v);
        }
    }
    /* heap sort: move the worst to the end each time -> best first */
    for (int64_t end = n - 1; end > 0; end--) {
        const int32_t t = out[0];
        out[0] = out[end];
        out[end] = t;
        sift_down(out, end, 0, v);
    }
}

/* Sort ids[0..n) best first by v (heap sort, in place). */
static void sort_ids(int32_t *ids, int64_t n, const float *v)
{
    for (int64_t i = n / 2; i-- > 0;)
        sift_down(ids, n, i, v);
    for (int64_t end = n - 1; end > 0; end--) {
        const int32_t t = ids[0];
        ids[0] = ids[end];
        ids[end] = t;
        sift_down(ids, end, 0, v);
    }
}

static int cmp_i32(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* log(sum exp(v)) over n values (max-shifted, double accumulation). */
static float log_sum_exp(const float *v, int64_t n)
{
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        mx = v[i] > mx ? v[i] : mx;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += expf(v[i] - mx);
    return mx + (float)log(sum);
}

/* ---------------------------------------------------------------------------------------------------------
 * log_softmax_topk */

struct lst_ctx {
    const berth_log_softmax_topk_params *p;
    berth_backend *be;
};

static void lst_task(void *arg, int tid, int nth)
{
    const struct lst_ctx *c = arg;
    const berth_log_softmax_topk_params *p = c->p;
    const int64_t V = p->logits.ne[0], R = p->logits.ne[1];
    float *s = cpu_thread_scratch(c->be, tid);
    int32_t *heap = (int32_t *)(s + V);
    int64_t r0, r1;
    cpu_split(R, 1, tid, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const float *x = (const float *)cpu_row(&p->logits, r);
        const float shift = log_sum_exp(x, V) - (p->row_bias.buf ? ((const float *)cpu_data(&p->row_bias))[r] : 0.0f);
        for (int64_t i = 0; i < V; i++)
            s[i] = x[i] - shift;
        top_ids(s, V, p->k, heap);
        float *values = (float *)cpu_row(&p->values, r);
        int32_t *indices = (int32_t *)cpu_row(&p->indices, r);
        for (int32_t i = 0; i < p->k; i++) {
            indices[i] = heap[i];
            values[i] = s[heap[i]];
        }
    }
}

berth_status cpu_op_log_softmax_topk(berth_backend *be, berth_stream *st, const berth_log_softmax_topk_params *p)
{
    CPU_OP_BEGIN(be, log_softmax_topk, p);
    const int64_t V = p->logits.ne[0], R = p->logits.ne[1];
    berth_status status = cpu_scratch_threads(be, (size_t)V * sizeof(float) + (size_t)p->k * sizeof(int32_t));
    if (status == BERTH_OK && R > 0) {
        struct lst_ctx c = {.p = p, .be = be};
        int nth = cpu_threads_for(be, (double)R * (double)V * 4.0, 65536.0);
        cpu_pool_run(be->pool, nth > R ? (int)R : nth, lst_task, &c);
    }
    CPU_OP_END(be);
    return status;
}

/* ---------------------------------------------------------------------------------------------------------
 * sample */

struct sample_ctx {
    const berth_sample_params *p;
    berth_backend *be;
    int64_t V;
};

/* Apply the history penalties of row r to z (hist: scratch for a sorted copy of the history). Repetition counts
 * every id of the row's history, presence and frequency only those from its output start on (all of them when the
 * caller gives no history_output_start). */
static void apply_penalties(const berth_sample_params *p, int64_t r, float *z, int32_t *hist)
{
    const float rep = p->repetition_penalty ? p->repetition_penalty[r] : 1.0f;
    const float pres = p->presence_penalty ? p->presence_penalty[r] : 0.0f;
    const float freq = p->frequency_penalty ? p->frequency_penalty[r] : 0.0f;
    if (!p->history_start || (rep == 1.0f && pres == 0.0f && freq == 0.0f))
        return;
    const int32_t out = opck_sample_row_output_start(p, (int32_t)r);
    /* without a repetition penalty the ids before the output change nothing: read only the output */
    const int32_t lo = rep != 1.0f ? p->history_start[r] : out;
    const int32_t n = p->history_start[r + 1] - lo, n_in = out - lo; /* hist[0..n_in): before the output */
    if (n <= 0)
        return;
    memcpy(hist, p->history + lo, (size_t)n * sizeof *hist);
    qsort(hist, (size_t)n_in, sizeof *hist, cmp_i32);
    qsort(hist + n_in, (size_t)(n - n_in), sizeof *hist, cmp_i32);
    /* walk the two sorted runs together: each distinct id once, with its count in the output */
    for (int32_t i = 0, j = n_in; i < n_in || j < n;) {
        const int32_t id = i < n_in && (j >= n || hist[i] <= hist[j]) ? hist[i] : hist[j];
        int32_t cnt = 0;
        while (i < n_in && hist[i] == id)
            i++;
        while (j < n && hist[j] == id) {
            j++;
            cnt++;
        }
        float v = z[id];
        if (rep != 1.0f)
            v = v > 0.0f ? v / rep : v * rep;
        if (cnt > 0) {
            v -= pres;
            v -= freq * (float)cnt;
        }
        z[id] = v;
    }
}

/* Shorten the best-first list ids[0..*n) to its shortest prefix whose probabilities reach top_p (at least one
 * id). Returns whether the sum reached top_p inside the list. */
static bool nucleus(const float *prob, const int32_t *ids, int64_t *n, float top_p)
{
    double cum = 0.0; /* a nucleus can hold most of the vocabulary: a float sum would drift by ~1e-4 */
    for (int64_t i = 0; i < *n; i++) {
        cum += prob[ids[i]];
        if (cum >= top_p) {
            *n = i + 1;
            return true;
        }
    }
    return false;
}

/* Choose the token of one row (temperature > 0) from w = z / temperature. prob and ids are V-sized scratch. */
static int32_t draw(const berth_sample_params *p, int64_t r, int64_t V, float *w, float *prob, int32_t *ids)
{
    const int32_t top_k = p->top_k ? p->top_k[r] : 0;
    const float top_p = p->top_p ? p->top_p[r] : 1.0f;
    const float min_p = p->min_p ? p->min_p[r] : 0.0f;
    /* kept set: ids[0..n) (best first) when a list exists, else all of [0, V) */
    int64_t n = V;
    bool listed = false;
    if (top_k > 0 && top_k < V) {
        top_ids(w, V, top_k, ids);
        n = top_k;
        listed = true;
    }
    /* softmax over the kept set */
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        const float v = w[listed ? ids[i] : i];
        mx = v > mx ? v : mx;
    }
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const int32_t id = listed ? ids[i] : (int32_t)i;
        prob[id] = expf(w[id] - mx);
        sum += prob[id];
    }
    const float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) {
        const int32_t id = listed ? ids[i] : (int32_t)i;
        prob[id] *= inv;
    }
    if (top_p < 1.0f) {
        if (!listed) {
            /* The nucleus is a prefix of the ids sorted by w. Sort only the ids whose weight exp(w - max) is at
             * least thr (itself a prefix of that order), lowering thr until the walk reaches top_p inside it:
             * the same answer as sorting all V ids, at the cost of sorting what the nucleus needs. */
            for (float thr = 0x1p-8f;; thr = thr < 0x1p-120f ? 0.0f : thr * 0x1p-8f) {
                const float cut = thr > 0.0f ? thr * inv : -1.0f;
                double mass = 0.0;
                n = 0;
                for (int32_t id = 0; id < V; id++)
                    if (prob[id] >= cut) {
                        ids[n++] = id;
                        mass += prob[id];
                    }
                if (mass < top_p && thr > 0.0f)
                    continue;
                sort_ids(ids, n, w);
                if (nucleus(prob, ids, &n, top_p) || thr == 0.0f)
                    break;
            }
            listed = true;
        } else {
            nucleus(prob, ids, &n, top_p);
        }
    }
    const float pmax = listed ? prob[ids[0]] : inv; /* exp(0) * inv: the most likely id's probability */
    const float floor_p = min_p > 0.0f ? min_p * pmax : -1.0f;
    if (listed) {
        int64_t m = 0;
        for (int64_t i = 0; i < n; i++)
            if (prob[ids[i]] >= floor_p)
                ids[m++] = ids[i];
        n = m;
        qsort(ids, (size_t)n, sizeof *ids, cmp_i32);
    }
    double total = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const int32_t id = listed ? ids[i] : (int32_t)i;
        if (prob[id] >= floor_p)
            total += prob[id];
    }
    const double target = uniform01(p->seed ? p->seed[r] : 0, p->counter ? p->counter[r] : 0) * total;
    double cum = 0.0;
    int32_t last = -1;
    for (int64_t i = 0; i < n; i++) {
        const int32_t id = listed ? ids[i] : (int32_t)i;
        if (prob[id] < floor_p)
            continue;
        last = id;
        cum += prob[id];
        if (cum > target)
            return id;
    }
    return last;
}

static void sample_task(void *arg, int tid, int nth)
{
    const struct sample_ctx *c = arg;
    const berth_sample_params *p = c->p;
    const int64_t V = c->V;
    float *z = cpu_thread_scratch(c->be, tid);
    float *w = z + V, *prob = w + V;
    int32_t *ids = (int32_t *)(prob + V), *hist = ids + V;
    int64_t r0, r1;
    cpu_split(p->n_rows, 1, tid, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        memcpy(z, cpu_row(&p->logits, r), (size_t)V * sizeof *z);
        apply_penalties(p, r, z, hist);
        const float temp = p->temperature ? p->temperature[r] : 0.0f;
        int32_t id;
        if (temp <= 0.0f) {
            id = 0;
            for (int32_t i = 1; i < V; i++)
                if (z[i] > z[id])
                    id = i;
        } else {
            for (int64_t i = 0; i < V; i++)
                w[i] = z[i] / temp;
            id = draw(p, r, V, w, prob, ids);
        }
        ((int32_t *)cpu_data(&p->ids))[r] = id;
        if (p->logprob.buf || p->n_top > 0) {
            const float lse = log_sum_exp(z, V);
            if (p->logprob.buf)
                ((float *)cpu_data(&p->logprob))[r] = z[id] - lse;
            if (p->n_top > 0) {
                top_ids(z, V, p->n_top, ids);
                int32_t *tids = (int32_t *)cpu_row(&p->top_ids, r);
                float *tlp = (float *)cpu_row(&p->top_logprobs, r);
                for (int32_t i = 0; i < p->n_top; i++) {
                    tids[i] = ids[i];
                    tlp[i] = z[ids[i]] - lse;
                }
            }
        }
    }
}

berth_status cpu_op_sample(berth_backend *be, berth_stream *s, const berth_sample_params *p)
{
    CPU_OP_BEGIN(be, sample, p);
    const int64_t V = p->logits.ne[0];
    struct opck ck = {0};
    int64_t max_hist;
    berth_status st = BERTH_OK;
    if (!opck_sample_rows(&ck, p, V, &max_hist)) {
        st = cpu_report(be, &ck);
    } else {
        st = cpu_scratch_threads(be, (size_t)(4 * V + max_hist) * sizeof(float));
        if (st == BERTH_OK && p->n_rows > 0) {
            struct sample_ctx c = {.p = p, .be = be, .V = V};
            int nth = cpu_threads_for(be, (double)p->n_rows * (double)V * 8.0, 65536.0);
            cpu_pool_run(be->pool, nth > p->n_rows ? p->n_rows : nth, sample_task, &c);
        }
    }
    CPU_OP_END(be);
    return st;
}

/*
 * sample.cu — token selection on the GPU: sample and log_softmax_topk (berth/backend.h), making the decisions of
 * the CPU backend (plugins/backend-cpu/sample.c) exactly: the same fp32 operations in the same order wherever a
 * value decides something (penalties, w = z / temperature, orderings, ties), exp and the double sums being the only
 * places where the two may differ, by rounding.
 *
 * One block of SMP_THREADS threads per row. The row is read from global memory in passes (a 262144-entry row does
 * not fit in shared memory); nothing is sorted over the whole vocabulary. Per row of sample:
 *   penalties  rows with penalties get a scratch copy z of their logits; history ids are counted with atomics in a
 *              scratch count row (the output ids' count in the low 31 bits, bit 31 marking "in the history", so an
 *              id seen only before history_output_start is still handed out), and atomicExch hands each distinct
 *              id's word to exactly one thread, which applies the penalties to z[id];
 *   greedy     argmax of z over (value, id) pairs, ties to the lower id;
 *   top-k      radix select (11/11/10-bit digits, shared-memory histograms) of the k-th largest w's key, then the
 *              id cut among the ids tied at that key (block scan over id-contiguous chunks);
 *   softmax    fp32 exp(w - max) over the kept ids, the sum in double;
 *   top-p      the same radix select with probability-mass histograms instead of counts (fixed point, 2^-62 per
 *              unit, so sums are exact and independent of order), ties at the boundary resolved by id; the order is
 *              by w, as on the CPU (the probability order, except that distinct w rounding to one probability
 *              stay in w order);
 *   min-p      a per-id comparison with min_p * (the largest probability);
 *   draw       Philox-4x32-10 u; block-wide exclusive scan in double over id-contiguous chunks of survivors, the
 *              first id whose running sum exceeds u * total;
 *   outputs    logprob = z[id] - logsumexp(z); the n_top best z via the count select, collected and bitonic-sorted
 *              as (~key, id) pairs (in shared memory, or in scratch when n_top is large).
 * The ordering of the CPU (value descending, ties to the lower id, under float comparison) is reproduced by ordered
 * unsigned keys of the float bits, with -0 folded onto +0 (they compare equal as floats). NaN logits rank as -inf
 * (the CPU's comparisons pass over them; the result differs only for NaN input, and is always a valid id).
 * When every row is greedy and neither logprobs nor top lists are wanted (and no penalties apply), a multi-block
 * argmax (segments of the row, then a merge: smp_argmax) reads the logits directly and the per-row parameters are
 * not copied at all.
 */
#include "cuda_device.cuh"
#include "cuda_internal.h"
#include "cuda_launch.cuh"

#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <string.h>

#define SMP_THREADS 1024
#define SMP_WARPS (SMP_THREADS / 32)
#define SMP_BUCKETS 2048      /* 11-bit digits: radix passes over bits 31..21, 20..10, 9..0 */
#define SMP_SORT_SMEM 2048    /* top lists padded to at most this many entries sort in shared memory */
#define SMP_MAX_V (1 << 28)   /* keeps every id, chunk bound and sort size in int range */
#define SMP_MASS_ONE 0x1p62   /* fixed-point unit of probability mass: sums of <= 1 + rounding stay < 2^63 */

typedef unsigned long long smp_u64;

/* Per-row parameters as the kernel reads them (packed on the host, one copy per call). */
struct smp_row {
    float temperature, top_p, min_p, rep, pres, freq;
    int32_t top_k;
    int32_t hist_off; /* the row's ids in the packed history */
    int32_t hist_len; /* 0: no penalties for this row */
    int32_t hist_out; /* the row's staged ids from this one on are output (presence/frequency count them) */
    int32_t zslot;    /* scratch slot of the penalised logits; -1 when hist_len is 0 */
    uint64_t seed, counter;
};

struct smp_args {
    const char *logits;
    int64_t logits_nb1;
    int32_t V;
    int32_t n_top;
    const struct smp_row *rows;
    const int32_t *hist;
    float *zbuf;     /* n_pen rows of V */
    int32_t *cbuf;   /* n_pen rows of V */
    int32_t *ids;
    float *logprob;  /* NULL: not wanted */
    char *top_ids;
    int64_t top_ids_nb1;
    char *top_lp;
    int64_t top_lp_nb1;
    unsigned long long *sort_buf; /* per row sort_cap entries when the top list does not fit in shared memory */
    int64_t sort_cap;
    int32_t sort_n;               /* n_top padded to a power of two */
};

struct smp_smem {
    unsigned hist_lo[SMP_BUCKETS]; /* bucket weights, split in 32-bit halves (smp_hist_add) */
    unsigned hist_hi[SMP_BUCKETS];
    unsigned long long sort[SMP_SORT_SMEM];
    unsigned long long ru[SMP_WARPS];
    double rd[SMP_WARPS];
    float rf[SMP_WARPS];
    int ri[SMP_WARPS];
    unsigned long long bgt;
    int bsel;
    int cut;
    unsigned int n;
};

// ---------------------------------------------------------------------------------------------------------------
// Keys, generator.

/* Ordered key of a float: a > b as floats iff key(a) > key(b) (for non-NaN values; -0 and +0 share a key). */
__device__ __forceinline__ uint32_t smp_key(float x)
{
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) == 0)
        u = 0;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float smp_unkey(uint32_t k)
{
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

__device__ __forceinline__ float smp_nonan(float v)
{
    return isnan(v) ? -INFINITY : v;
}

/* Probability in fixed point (units of 2^-62). p is in [0, 1] or NaN (degenerate rows): NaN weighs nothing. */
__device__ __forceinline__ smp_u64 smp_mass(float p)
{
    if (!(p > 0.0f))
        return 0;
    if (p >= 1.0f)
        return (smp_u64)1 << 62;
    return __float2ull_rn(__fmul_rn(p, 0x1p62f));
}

/* u in [0, 1) from Philox-4x32-10 of counter words (counter lo, hi, 0, 0) under key (seed lo, hi). */
__device__ double smp_uniform(smp_u64 seed, smp_u64 counter)
{
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int round = 0; round < 10; round++) {
        const smp_u64 p0 = (smp_u64)0xD2511F53u * c0;
        const smp_u64 p1 = (smp_u64)0xCD9E8D57u * c2;
        const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        const uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    return (double)(((((smp_u64)c0) << 32) | c1) >> 11) * 0x1p-53;
}

// ---------------------------------------------------------------------------------------------------------------
// Block-wide building blocks. Each is called by every thread of the block (they contain __syncthreads) and leaves
// the same result in every thread.

__device__ __forceinline__ double smp_sum_d(double v, double *sh)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o); /* a + b == b + a: every lane ends with the same bits */
    __syncthreads();
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    v = lane < SMP_WARPS ? sh[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ int smp_min_i(int v, int *sh)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1)
        v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    v = lane < SMP_WARPS ? sh[lane] : INT_MAX;
    for (int o = 16; o > 0; o >>= 1)
        v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ int smp_max_i(int v, int *sh)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1)
        v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    v = lane < SMP_WARPS ? sh[lane] : INT_MIN;
    for (int o = 16; o > 0; o >>= 1)
        v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* (av, ai) ranks before (bv, bi): larger value, ties to the lower id; id < 0 is "nothing yet". */
__device__ __forceinline__ bool smp_better(float av, int ai, float bv, int bi)
{
    return ai >= 0 && (bi < 0 || av > bv || (av == bv && ai < bi));
}

__device__ __forceinline__ void smp_argbest_warp(float &v, int &i)
{
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (smp_better(ov, oi, v, i)) {
            v = ov;
            i = oi;
        }
    }
}

/* Block argmax with ties to the lower id (values are never NaN here, so the order is total). */
__device__ __forceinline__ void smp_argbest(float &v, int &i, float *shv, int *shi)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    smp_argbest_warp(v, i);
    __syncthreads();
    if (lane == 0) {
        shv[warp] = v;
        shi[warp] = i;
    }
    __syncthreads();
    v = lane < SMP_WARPS ? shv[lane] : -INFINITY;
    i = lane < SMP_WARPS ? shi[lane] : -1;
    smp_argbest_warp(v, i);
}

/* Exclusive prefix sum over the block in thread order; *total gets the sum of all. */
template <class T>
__device__ __forceinline__ T smp_scan_excl(T v, T *total, T *sh)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    T x = v;
    for (int o = 1; o < 32; o <<= 1) {
        const T y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o)
            x += y;
    }
    T ex = __shfl_up_sync(0xffffffffu, x, 1);
    if (lane == 0)
        ex = T(0);
    __syncthreads(); /* sh may still be read by a previous call */
    if (lane == 31)
        sh[warp] = x;
    __syncthreads();
    if (warp == 0) {
        T t = lane < SMP_WARPS ? sh[lane] : T(0);
        for (int o = 1; o < 32; o <<= 1) {
            const T y = __shfl_up_sync(0xffffffffu, t, o);
            if (lane >= o)
                t += y;
        }
        if (lane < SMP_WARPS)
            sh[lane] = t;
    }
    __syncthreads();
    *total = sh[SMP_WARPS - 1];
    return (warp ? sh[warp - 1] : T(0)) + ex;
}

/* Ids [*a0, *a1) of this thread when [0, V) is cut into one contiguous chunk per thread, in thread order (so a
 * block scan over per-thread sums walks the ids in increasing order). */
__device__ __forceinline__ void smp_chunk(int V, int *a0, int *a1)
{
    const int C = (V + SMP_THREADS - 1) / SMP_THREADS;
    *a0 = min(V, (int)threadIdx.x * C);
    *a1 = min(V, *a0 + C);
}

struct smp_sel {
    uint32_t key;   /* the boundary key */
    smp_u64 above; /* weight of the candidates with a larger key */
    smp_u64 eq;    /* weight of the candidates with exactly this key */
    bool reached;   /* false when all candidates together weigh less than the target */
};

/* Add w to histogram bucket (lo, hi) with 32-bit shared atomics (64-bit ones are compare-and-swap loops, slow
 * under the contention a histogram of a whole vocabulary has): the thread whose add wraps lo carries into hi. */
__device__ __forceinline__ void smp_hist_add(unsigned *lo, unsigned *hi, smp_u64 w)
{
    const unsigned wl = (unsigned)w;
    unsigned wh = (unsigned)(w >> 32);
    if (wl) {
        const unsigned old = atomicAdd(lo, wl);
        if (old + wl < old)
            wh++;
    }
    if (wh)
        atomicAdd(hi, wh);
}

/* Radix select: walking the candidates by key, largest first, the key at which the accumulated weight reaches
 * target (> 0): above < target <= above + eq. cand(i, &key) says whether id i is a candidate and gives its key;
 * weight(key) is the weight of a candidate with that key (computed only for candidates the pass still looks at).
 * Both must answer the same in every pass. Weights are integers, so every sum is exact. */
template <class C, class W>
__device__ smp_sel smp_select(C cand, W weight, int V, smp_u64 target, smp_smem &S)
{
    smp_sel out = {0, 0, 0, false};
    uint32_t prefix = 0;
    smp_u64 above = 0, eq = 0;
    for (int level = 0; level < 3; level++) {
        const int shift = level == 0 ? 21 : level == 1 ? 10 : 0;
        const int bits = level == 2 ? 10 : 11;
        __syncthreads(); /* the previous user of the histogram is done with it */
        for (int b = threadIdx.x; b < SMP_BUCKETS; b += SMP_THREADS) {
            S.hist_lo[b] = 0;
            S.hist_hi[b] = 0;
        }
        __syncthreads();
        for (int i = threadIdx.x; i < V; i += SMP_THREADS) {
            uint32_t key;
            if (!cand(i, key))
                continue;
            if (level > 0 && (key >> (shift + bits)) != prefix)
                continue;
            const smp_u64 w = weight(key);
            if (w) {
                const uint32_t b = (key >> shift) & ((1u << bits) - 1u);
                smp_hist_add(&S.hist_lo[b], &S.hist_hi[b], w);
            }
        }
        __syncthreads();
        /* buckets from the largest down: thread t holds positions t*PER .. t*PER+PER-1 of that order */
        const int PER = SMP_BUCKETS / SMP_THREADS;
        const smp_u64 need = target - above;
        smp_u64 h[SMP_BUCKETS / SMP_THREADS], local = 0;
        for (int q = 0; q < PER; q++) {
            const int b = SMP_BUCKETS - 1 - ((int)threadIdx.x * PER + q);
            h[q] = ((smp_u64)S.hist_hi[b] << 32) | S.hist_lo[b];
            local += h[q];
        }
        smp_u64 total;
        smp_u64 e = smp_scan_excl<smp_u64>(local, &total, S.ru);
        if (total < need)
            return out; /* only possible at level 0: every level keeps above < target <= above + total */
        for (int q = 0; q < PER; q++) {
            if (e < need && e + h[q] >= need) {
                S.bsel = SMP_BUCKETS - 1 - ((int)threadIdx.x * PER + q);
                S.bgt = e;
            }
            e += h[q];
        }
        __syncthreads();
        const uint32_t b = (uint32_t)S.bsel;
        above += S.bgt;
        eq = ((smp_u64)S.hist_hi[b] << 32) | S.hist_lo[b];
        prefix = (prefix << bits) | b;
    }
    __syncthreads();
    out.key = prefix;
    out.above = above;
    out.eq = eq;
    out.reached = true;
    return out;
}

/* The id of the m-th (1-based) i with pred(i), in increasing id order (INT_MAX if there are fewer). */
template <class F>
__device__ int smp_nth(F pred, int V, smp_u64 m, smp_smem &S)
{
    int a0, a1;
    smp_chunk(V, &a0, &a1);
    smp_u64 c = 0;
    for (int i = a0; i < a1; i++)
        c += pred(i) ? 1 : 0;
    if (threadIdx.x == 0)
        S.cut = INT_MAX;
    smp_u64 total;
    smp_u64 e = smp_scan_excl<smp_u64>(c, &total, S.ru);
    if (e < m && m <= e + c) {
        for (int i = a0; i < a1; i++)
            if (pred(i) && ++e == m) {
                S.cut = i;
                break;
            }
    }
    __syncthreads();
    const int cut = S.cut;
    __syncthreads();
    return cut;
}

/* Sort a[0..n) ascending (n a power of two; shared or global memory, the block's own). */
__device__ void smp_bitonic(smp_u64 *a, int n)
{
    for (int k = 2; k <= n; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < n; i += SMP_THREADS) {
                const int l = i ^ j;
                if (l > i) {
                    const smp_u64 x = a[i], y = a[l];
                    if (((i & k) == 0) == (x > y)) {
                        a[i] = y;
                        a[l] = x;
                    }
                }
            }
            __syncthreads();
        }
}

/* The k best ids by key (ties: lower id) into buf[0..k), best first, as (~key << 32 | id); buf has n >= k entries
 * (a power of two), the rest end up ~0. */
template <class K>
__device__ void smp_top_list(K key, int V, int k, smp_u64 *buf, int n, smp_smem &S)
{
    uint32_t kk = 0; /* keep key > kk, and key == kk up to id ck: everything by default */
    int ck = INT_MAX;
    if (k < V) {
        const smp_sel s = smp_select(
            [&](int i, uint32_t &kv) {
                kv = key(i);
                return true;
            },
            [](uint32_t) { return (smp_u64)1; }, V, (smp_u64)k, S);
        kk = s.key;
        const smp_u64 m = (smp_u64)k - s.above;
        if (s.eq > m)
            ck = smp_nth([&](int i) { return key(i) == kk; }, V, m, S);
    }
    for (int j = threadIdx.x; j < n; j += SMP_THREADS)
        buf[j] = ~0ull;
    if (threadIdx.x == 0)
        S.n = 0;
    __syncthreads();
    const int lane = threadIdx.x & 31;
    for (int base = 0; base < V; base += SMP_THREADS) {
        const int i = base + (int)threadIdx.x;
        uint32_t kv = 0;
        bool keep = false;
        if (i < V) {
            kv = key(i);
            keep = kv > kk || (kv == kk && i <= ck);
        }
        const unsigned mask = __ballot_sync(0xffffffffu, keep);
        unsigned pos = 0;
        if (lane == 0 && mask)
            pos = atomicAdd(&S.n, (unsigned)__popc(mask));
        pos = __shfl_sync(0xffffffffu, pos, 0) + (unsigned)__popc(mask & ((1u << lane) - 1u));
        if (keep && pos < (unsigned)n)
            buf[pos] = ((smp_u64)(~kv) << 32) | (unsigned)i;
    }
    __syncthreads();
    smp_bitonic(buf, n);
}

// ---------------------------------------------------------------------------------------------------------------
// sample

/* Step 1: the row's penalised logits (a scratch copy) or the logits themselves when no penalty applies. */
__device__ const float *smp_penalise(const smp_args &a, const smp_row &P, const float *lrow)
{
    if (P.zslot < 0)
        return lrow;
    const int V = a.V;
    float *z = a.zbuf + (size_t)P.zslot * (size_t)V;
    int *cnt = a.cbuf + (size_t)P.zslot * (size_t)V;
    for (int i = threadIdx.x; i < V; i += SMP_THREADS) {
        z[i] = lrow[i];
        cnt[i] = 0;
    }
    __syncthreads();
    const int32_t *h = a.hist + P.hist_off;
    unsigned *word = (unsigned *)cnt;
    for (int j = threadIdx.x; j < P.hist_len; j += SMP_THREADS) {
        if (j >= P.hist_out)
            atomicAdd(&word[h[j]], 1u); /* < 2^31 ids per call: the count never reaches the mark */
        atomicOr(&word[h[j]], 0x80000000u);
    }
    __syncthreads();
    for (int j = threadIdx.x; j < P.hist_len; j += SMP_THREADS) {
        const int id = h[j];
        const unsigned w = atomicExch(&word[id], 0u); /* exactly one entry of each distinct id sees its word */
        if (w != 0u) {
            const int c = (int)(w & 0x7fffffffu); /* its count in the output */
            float v = z[id];
            if (P.rep != 1.0f)
                v = v > 0.0f ? __fdiv_rn(v, P.rep) : __fmul_rn(v, P.rep);
            if (c > 0) {
                v = __fsub_rn(v, P.pres);
                v = __fsub_rn(v, __fmul_rn(P.freq, (float)c));
            }
            z[id] = v;
        }
    }
    __syncthreads();
    return z;
}

/* Steps 3-7 for a row with temperature > 0. zmax/zarg: the largest z and its id (the fallback when nothing
 * survives, which only degenerate rows reach). */
__device__ int smp_draw(const smp_args &a, const smp_row &P, const float *z, float zmax, int zarg, smp_smem &S)
{
    const int V = a.V;
    const float temp = P.temperature;
    const float mx = smp_nonan(__fdiv_rn(zmax, temp)); /* division rounds monotonically: max w = max z / temp */
    auto wof = [&](int i) { return smp_nonan(__fdiv_rn(smp_nonan(z[i]), temp)); };

    /* top-k: keep key > kk, and key == kk up to id ck */
    uint32_t kk = 0;
    int ck = INT_MAX;
    if (P.top_k > 0 && P.top_k < V) {
        const smp_sel s = smp_select(
            [&](int i, uint32_t &key) {
                key = smp_key(wof(i));
                return true;
            },
            [](uint32_t) { return (smp_u64)1; }, V, (smp_u64)P.top_k, S);
        kk = s.key;
        const smp_u64 m = (smp_u64)P.top_k - s.above;
        if (s.eq > m)
            ck = smp_nth([&](int i) { return smp_key(wof(i)) == kk; }, V, m, S);
    }
    auto keep_k = [&](int i, uint32_t key) { return key > kk || (key == kk && i <= ck); };

    /* softmax over the kept ids */
    double sum = 0.0;
    for (int i = threadIdx.x; i < V; i += SMP_THREADS) {
        const float w = wof(i);
        if (keep_k(i, smp_key(w)))
            sum += (double)expf(__fsub_rn(w, mx));
    }
    sum = smp_sum_d(sum, S.rd);
    const float inv = (float)(1.0 / sum);
    auto prob = [&](float w) { return __fmul_rn(expf(__fsub_rn(w, mx)), inv); };

    /* top-p: the shortest best-first prefix of the kept ids whose mass reaches top_p */
    uint32_t kp = 0;
    int cp = INT_MAX;
    if (P.top_p < 1.0f) {
        const double t = ceil((double)P.top_p * SMP_MASS_ONE);
        const smp_u64 target = t < 1.0 ? 1 : (smp_u64)t;
        /* a candidate's weight from its key: ids with one key have one w (-0 folded onto +0 gives the same
         * exp(w - max)), hence one probability */
        auto mass_of = [&](uint32_t key) { return smp_mass(prob(smp_unkey(key))); };
        const smp_sel s = smp_select(
            [&](int i, uint32_t &key) {
                key = smp_key(wof(i));
                return keep_k(i, key);
            },
            mass_of, V, target, S);
        if (s.reached) { /* else the kept ids hold less than top_p (rounding): keep them all, as the CPU does */
            kp = s.key;
            smp_u64 w0 = mass_of(kp); /* every id with this key has this weight */
            if (w0 == 0)
                w0 = 1;
            const smp_u64 m = (target - s.above + w0 - 1) / w0; /* tied ids needed to reach top_p */
            if (s.eq / w0 > m)
                cp = smp_nth(
                    [&](int i) {
                        const uint32_t key = smp_key(wof(i));
                        return key == kp && keep_k(i, key);
                    },
                    V, m, S);
        }
    }
    auto keep_p = [&](int i, uint32_t key) { return key > kp || (key == kp && i <= cp); };

    /* min-p, then the draw over the survivors in increasing id order */
    const float pmax = prob(mx);
    const float floor_p = P.min_p > 0.0f ? __fmul_rn(P.min_p, pmax) : -1.0f;
    auto survives = [&](int i, float &p) {
        const float w = wof(i);
        const uint32_t key = smp_key(w);
        if (!keep_k(i, key) || !keep_p(i, key))
            return false;
        p = prob(w);
        return p >= floor_p;
    };
    int a0, a1;
    smp_chunk(V, &a0, &a1);
    double part = 0.0;
    int last = -1;
    for (int i = a0; i < a1; i++) {
        float p;
        if (survives(i, p)) {
            part += (double)p;
            last = i;
        }
    }
    double total;
    const double before = smp_scan_excl<double>(part, &total, S.rd);
    const double target = smp_uniform(P.seed, P.counter) * total;
    int claim = INT_MAX;
    if (last >= 0 && before + part > target) {
        double cum = before;
        for (int i = a0; i < a1; i++) {
            float p;
            if (survives(i, p)) {
                cum += (double)p;
                if (cum > target) {
                    claim = i;
                    break;
                }
            }
        }
    }
    int chosen = smp_min_i(claim, S.ri);
    if (chosen == INT_MAX) { /* rounding left the sum short of the target: the last survivor */
        chosen = smp_max_i(last, S.ri);
        if (chosen < 0)
            chosen = zarg;
    }
    return chosen;
}

__global__ void __launch_bounds__(SMP_THREADS) smp_rows_kernel(const smp_args a)
{
    __shared__ smp_smem S;
    const int r = blockIdx.x, V = a.V;
    const smp_row P = a.rows[r];
    const float *z = smp_penalise(a, P, (const float *)(a.logits + (int64_t)r * a.logits_nb1));

    float zmax = -INFINITY;
    int zarg = -1;
    for (int i = threadIdx.x; i < V; i += SMP_THREADS) {
        const float v = smp_nonan(z[i]);
        if (zarg < 0 || v > zmax) {
            zmax = v;
            zarg = i;
        }
    }
    smp_argbest(zmax, zarg, S.rf, S.ri);
    const int chosen = P.temperature > 0.0f ? smp_draw(a, P, z, zmax, zarg, S) : zarg;
    if (threadIdx.x == 0)
        a.ids[r] = chosen;
    if (!a.logprob && a.n_top <= 0)
        return;

    /* outputs over the temperature-free z: log-softmax at the chosen id, the n_top best */
    double sum = 0.0;
    for (int i = threadIdx.x; i < V; i += SMP_THREADS)
        sum += (double)expf(__fsub_rn(smp_nonan(z[i]), zmax));
    sum = smp_sum_d(sum, S.rd);
    const float lse = __fadd_rn(zmax, (float)log(sum));
    if (a.logprob && threadIdx.x == 0)
        a.logprob[r] = __fsub_rn(z[chosen], lse);
    if (a.n_top > 0) {
        smp_u64 *buf = a.sort_cap ? a.sort_buf + (int64_t)r * a.sort_cap : S.sort;
        smp_top_list([&](int i) { return smp_key(smp_nonan(z[i])); }, V, a.n_top, buf, a.sort_n, S);
        int32_t *tids = (int32_t *)(a.top_ids + (int64_t)r * a.top_ids_nb1);
        float *tlp = (float *)(a.top_lp + (int64_t)r * a.top_lp_nb1);
        for (int j = threadIdx.x; j < a.n_top; j += SMP_THREADS) {
            const int id = (int)(uint32_t)buf[j];
            tids[j] = id;
            tlp[j] = __fsub_rn(z[id], lse);
        }
    }
}

/* Fast path: greedy rows without penalties, logprobs or top lists. A row (262144 entries at Gemma's vocabulary)
 * is cut into up to SMP_AM_MAX_BLOCKS contiguous segments of at least SMP_AM_SEG entries, one block of
 * SMP_AM_THREADS each (one block of 1024 threads per row took 16 us at batch 1: one SM cannot pull a 1 MiB row
 * faster); each block writes its segment's (best value, lowest id) and a one-warp kernel per row merges the
 * segments in id order. The result is the lowest id of the largest value (NaN as -inf), whatever the split. */
#define SMP_AM_THREADS 256
#define SMP_AM_SEG 2048        /* fewest entries per block: 8 per thread */
#define SMP_AM_MAX_BLOCKS 1024 /* segments per row (the merge's warp takes 32 each at most) */
#define SMP_AM_UNROLL 8        /* loads in flight per thread */
/* Rows of 16-byte aligned float4s (V % 4 == 0, aligned rows): each thread loads SMP_AM_VUNROLL float4s a round, and a
 * block takes at least SMP_AM_VSEG entries (two rounds; the whole row when V is shorter). At E2B's 262144 logits x 32
 * rows that is 1024 blocks instead of 4096 one-round blocks of scalar loads: the logits the LM head just wrote are read
 * in ~one wave with 64 bytes in flight per thread (the scalar path: 13.7 us a decode step at 32 sequences,
 * bench/RESULTS.md session 25). Only where that still makes SMP_AM_VGRID blocks in all: with fewer rows the scalar
 * path's smaller segments pull a row faster (one row of 262144 in 32 float4 blocks cost ~2 us a step at batch 1 against
 * 128 scalar ones, bench/RESULTS.md session 26). */
#define SMP_AM_VUNROLL 4
#define SMP_AM_VGRID 1024
#define SMP_AM_VSEG (2 * SMP_AM_VUNROLL * 4 * SMP_AM_THREADS)

/* The best (value, id) of segment blockIdx.x of row r, by the whole block, stored as smp_argmax_part_kernel says.
 * VEC: float4 loads (V, seg and the row's address multiples of 4 floats). */
template <bool VEC>
__device__ __forceinline__ void smp_argmax_segment(const char *logits, int64_t nb1, int V, int r, int seg,
                                                   float *part_v, int *part_i, int32_t *ids, float *shv, int *shi)
{
    const int b = blockIdx.x;
    const float *x = (const float *)(logits + (int64_t)r * nb1);
    const int start = b * seg, end = V - start < seg ? V : start + seg;
    float best = -INFINITY;
    int arg = -1;
    if constexpr (VEC) {
        const float4 *x4 = (const float4 *)x;
        const int end4 = end / 4;
        for (int j0 = start / 4 + (int)threadIdx.x; j0 < end4; j0 += SMP_AM_VUNROLL * SMP_AM_THREADS) {
            float4 v[SMP_AM_VUNROLL];
#pragma unroll
            for (int k = 0; k < SMP_AM_VUNROLL; k++) {
                const int j = j0 + k * SMP_AM_THREADS;
                v[k] = j < end4 ? x4[j] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int k = 0; k < SMP_AM_VUNROLL; k++) { /* ids rise with k, then within the float4 */
                const int j = j0 + k * SMP_AM_THREADS;
                const float f[4] = {smp_nonan(v[k].x), smp_nonan(v[k].y), smp_nonan(v[k].z), smp_nonan(v[k].w)};
#pragma unroll
                for (int c = 0; c < 4; c++)
                    if (j < end4 && (arg < 0 || f[c] > best)) {
                        best = f[c];
                        arg = 4 * j + c;
                    }
            }
        }
    } else {
        for (int i0 = start + (int)threadIdx.x; i0 < end; i0 += SMP_AM_UNROLL * SMP_AM_THREADS) {
            float v[SMP_AM_UNROLL];
#pragma unroll
            for (int k = 0; k < SMP_AM_UNROLL; k++) {
                const int i = i0 + k * SMP_AM_THREADS;
                v[k] = i < end ? x[i] : 0.0f;
            }
#pragma unroll
            for (int k = 0; k < SMP_AM_UNROLL; k++) { /* ids rise with k: a strict > keeps the first of equals */
                const int i = i0 + k * SMP_AM_THREADS;
                const float f = smp_nonan(v[k]);
                if (i < end && (arg < 0 || f > best)) {
                    best = f;
                    arg = i;
                }
            }
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    smp_argbest_warp(best, arg);
    if (lane == 0) {
        shv[warp] = best;
        shi[warp] = arg;
    }
    __syncthreads();
    if (warp == 0) {
        best = lane < SMP_AM_THREADS / 32 ? shv[lane] : -INFINITY;
        arg = lane < SMP_AM_THREADS / 32 ? shi[lane] : -1;
        smp_argbest_warp(best, arg);
        if (lane == 0) {
            if (gridDim.x == 1) {
                ids[r] = arg;
            } else {
                part_v[(int64_t)r * gridDim.x + b] = best;
                part_i[(int64_t)r * gridDim.x + b] = arg;
            }
        }
    }
    __syncthreads(); /* shv / shi are reused by the block's next row */
}

/* One block per (segment, row) (rows beyond gridDim.y loop): the segment's best (value, id) to
 * part[r * gridDim.x + b], or, when the row is a single segment, its id to ids[r]. Launched through cu_launch
 * (cuda_launch.cuh's contract). VEC: smp_argmax_segment's float4 loads. */
template <bool VEC>
__global__ void __launch_bounds__(SMP_AM_THREADS) smp_argmax_part_kernel(const char *logits, int64_t nb1, int V,
                                                                          int R, int seg, float *part_v,
                                                                          int *part_i, int32_t *ids)
{
    __shared__ float shv[SMP_AM_THREADS / 32];
    __shared__ int shi[SMP_AM_THREADS / 32];
    cu_pdl_trigger();
    cu_pdl_wait();
    for (int r = blockIdx.y; r < R; r += gridDim.y) /* uniform over the block */
        smp_argmax_segment<VEC>(logits, nb1, V, r, seg, part_v, part_i, ids, shv, shi);
}

/* One warp per row: the best of the row's nparts segment results (ties to the lower id). */
__global__ void __launch_bounds__(32) smp_argmax_merge_kernel(const float *part_v, const int *part_i, int nparts,
                                                              int32_t *ids)
{
    cu_pdl_trigger();
    cu_pdl_wait();
    const int r = blockIdx.x;
    float best = -INFINITY;
    int arg = -1;
    for (int b = (int)threadIdx.x; b < nparts; b += 32) {
        const float v = part_v[(int64_t)r * nparts + b];
        const int i = part_i[(int64_t)r * nparts + b];
        if (smp_better(v, i, best, arg)) {
            best = v;
            arg = i;
        }
    }
    smp_argbest_warp(best, arg);
    if (threadIdx.x == 0)
        ids[r] = arg;
}

/* Greedy ids of R rows of V logits: the two kernels above (one when a row is a single segment). */
static berth_status smp_argmax(berth_backend *be, berth_stream *s, const berth_sample_params *p, int64_t V,
                               int32_t R, int32_t *ids)
{
    const char *lg = (const char *)cu_ptr(&p->logits);
    const bool vec = V % 4 == 0 && p->logits.nb[1] % 16 == 0 && ((uintptr_t)lg & 15u) == 0 &&
                     (int64_t)R * ((V + SMP_AM_VSEG - 1) / SMP_AM_VSEG) >= SMP_AM_VGRID;
    const int64_t min_seg = vec ? SMP_AM_VSEG : SMP_AM_SEG;
    int64_t nparts = (V + min_seg - 1) / min_seg;
    nparts = nparts < 1 ? 1 : nparts > SMP_AM_MAX_BLOCKS ? SMP_AM_MAX_BLOCKS : nparts;
    int seg = (int)((V + nparts - 1) / nparts);
    if (vec) /* whole float4s: segment b starts at float4 b * seg / 4 */
        seg = (seg + 3) / 4 * 4;
    float *part_v = NULL;
    int *part_i = NULL;
    if (nparts > 1) {
        void *ws = NULL;
        const size_t n = (size_t)R * (size_t)nparts;
        const berth_status st = cu_stream_ws(be, s, n * (sizeof(float) + sizeof(int)), &ws);
        if (st != BERTH_OK)
            return st;
        part_v = (float *)ws;
        part_i = (int *)(part_v + n);
    }
    const dim3 grid((unsigned)nparts, (unsigned)(R < 65535 ? R : 65535));
    cudaError_t e = cu_launch(be, s->cs, grid, dim3(SMP_AM_THREADS), 0,
                              vec ? smp_argmax_part_kernel<true> : smp_argmax_part_kernel<false>, lg,
                              (int64_t)p->logits.nb[1], (int)V, (int)R, seg, part_v, part_i, ids);
    berth_status st = cu_check(be, e, "sample: smp_argmax_part_kernel");
    if (st != BERTH_OK || nparts == 1)
        return st;
    e = cu_launch(be, s->cs, dim3((unsigned)R), dim3(32), 0, smp_argmax_merge_kernel, (const float *)part_v,
                  (const int *)part_i, (int)nparts, ids);
    return cu_check(be, e, "sample: smp_argmax_merge_kernel");
}

static uint32_t smp_pow2(uint32_t n)
{
    uint32_t p = 1;
    while (p < n)
        p <<= 1;
    return p;
}

/* The part of row r's history its penalties read, as the CPU decides it: history[*lo .. *lo + length), the
 * output from *lo + *n_in on; returns the length (0: no penalty applies). Without a repetition penalty the ids
 * before the output change nothing, so only the output is staged. */
static int32_t smp_penalty_span(const berth_sample_params *p, int32_t r, int32_t *lo, int32_t *n_in)
{
    *lo = 0;
    *n_in = 0;
    if (!p->history_start)
        return 0;
    const float rep = p->repetition_penalty ? p->repetition_penalty[r] : 1.0f;
    const float pres = p->presence_penalty ? p->presence_penalty[r] : 0.0f;
    const float freq = p->frequency_penalty ? p->frequency_penalty[r] : 0.0f;
    if (rep == 1.0f && pres == 0.0f && freq == 0.0f)
        return 0;
    const int32_t out = opck_sample_row_output_start(p, r);
    *lo = rep != 1.0f ? p->history_start[r] : out;
    *n_in = out - *lo;
    const int32_t n = p->history_start[r + 1] - *lo;
    return n > 0 ? n : 0;
}

bool cu_check_sample(const berth_backend *be, struct opck *c, const berth_sample_params *p)
{
    (void)be;
    if (!opck_sample(c, p))
        return false;
    if (p->logits.ne[0] > SMP_MAX_V)
        return opck_fail(c, BERTH_E_UNSUPPORTED,
                         "sample: vocabulary size %" PRId64 " is over the CUDA backend's limit (%d)",
                         p->logits.ne[0], SMP_MAX_V);
    return true;
}

berth_status cu_op_sample(berth_backend *be, berth_stream *s, const berth_sample_params *p)
{
    CU_OP_BEGIN(be, sample, p);
    if (!s)
        return cu_fail(be->host, BERTH_E_INVALID, "sample: stream is NULL");
    if (be->capturing) /* berth/backend.h: no sample between graph_begin and graph_end (host arrays per call) */
        return cu_fail(be->host, BERTH_E_INVALID, "sample: cannot be recorded into a graph (it reads host arrays)");
    const int64_t V = p->logits.ne[0];
    const int32_t R = p->n_rows;
    struct opck ck = {};
    ck.exec = 1;
    ck.be = &be->ck;
    int64_t max_hist = 0;
    if (!opck_sample_rows(&ck, p, V, &max_hist)) /* the host arrays, before anything is enqueued */
        return cu_fail(be->host, ck.code, "%s", ck.msg);
    if (R <= 0)
        return BERTH_OK;

    int any_drawn = 0;
    int32_t n_pen = 0;
    int64_t n_hist = 0;
    for (int32_t r = 0; r < R; r++) {
        if (p->temperature && p->temperature[r] > 0.0f)
            any_drawn = 1;
        int32_t lo, n_in;
        const int32_t len = smp_penalty_span(p, r, &lo, &n_in);
        if (len > 0) {
            n_pen++;
            n_hist += len;
        }
    }
    if (n_hist > INT32_MAX)
        return cu_fail(be->host, BERTH_E_UNSUPPORTED,
                       "sample: %" PRId64 " penalty history ids in one call is over the CUDA backend's limit", n_hist);
    const int want_lp = p->logprob.buf != NULL;
    const int32_t n_top = p->n_top > 0 ? p->n_top : 0;
    int32_t *ids = (int32_t *)cu_ptr(&p->ids);
    berth_status st;

    if (!any_drawn && n_pen == 0 && !want_lp && n_top == 0) {
        return smp_argmax(be, s, p, V, R, ids);
    }

    /* Host workspace: rows, then the histories of the penalised rows. Device workspace: the same bytes, then
     * the penalised rows' z and count scratch, then the sort space of large top lists. */
    const size_t rows_bytes = (size_t)R * sizeof(smp_row);
    const size_t host_bytes = rows_bytes + (size_t)n_hist * sizeof(int32_t);
    const size_t align = 256;
    const size_t z_off = (host_bytes + align - 1) / align * align;
    const size_t z_bytes = (size_t)n_pen * (size_t)V * sizeof(float);
    const size_t c_off = z_off + (z_bytes + align - 1) / align * align;
    const uint32_t sort_n = n_top > 0 ? smp_pow2((uint32_t)n_top) : 1;
    const int64_t sort_cap = sort_n > SMP_SORT_SMEM ? (int64_t)sort_n : 0;
    const size_t sort_off = c_off + (z_bytes + align - 1) / align * align;
    const size_t dev_bytes = sort_off + (size_t)R * (size_t)sort_cap * sizeof(unsigned long long);

    void *dws = NULL, *hws = NULL;
    if ((st = cu_stream_ws(be, s, dev_bytes, &dws)) != BERTH_OK)
        return st;
    if ((st = cu_stream_host_ws(be, s, host_bytes, &hws)) != BERTH_OK)
        return st;
    smp_row *rows = (smp_row *)hws;
    int32_t *hist = (int32_t *)((char *)hws + rows_bytes);
    int32_t off = 0, slot = 0;
    for (int32_t r = 0; r < R; r++) {
        smp_row *w = &rows[r];
        w->temperature = p->temperature ? p->temperature[r] : 0.0f;
        w->top_p = p->top_p ? p->top_p[r] : 1.0f;
        w->min_p = p->min_p ? p->min_p[r] : 0.0f;
        w->rep = p->repetition_penalty ? p->repetition_penalty[r] : 1.0f;
        w->pres = p->presence_penalty ? p->presence_penalty[r] : 0.0f;
        w->freq = p->frequency_penalty ? p->frequency_penalty[r] : 0.0f;
        w->top_k = p->top_k ? p->top_k[r] : 0;
        w->seed = p->seed ? p->seed[r] : 0;
        w->counter = p->counter ? p->counter[r] : 0;
        int32_t lo, n_in;
        const int32_t len = smp_penalty_span(p, r, &lo, &n_in);
        w->hist_off = off;
        w->hist_len = len;
        w->hist_out = n_in;
        w->zslot = len > 0 ? slot++ : -1;
        if (len > 0) {
            memcpy(hist + off, p->history + lo, (size_t)len * sizeof(int32_t));
            off += len;
        }
    }
    st = cu_check(be, cudaMemcpyAsync(dws, hws, host_bytes, cudaMemcpyHostToDevice, s->cs),
                  "sample: cudaMemcpyAsync (row parameters)");
    const berth_status st_done = cu_stream_host_ws_done(be, s);
    if (st != BERTH_OK)
        return st;
    if (st_done != BERTH_OK)
        return st_done;

    smp_args a;
    memset(&a, 0, sizeof a);
    a.logits = cu_ptr(&p->logits);
    a.logits_nb1 = p->logits.nb[1];
    a.V = (int32_t)V;
    a.n_top = n_top;
    a.rows = (const smp_row *)dws;
    a.hist = (const int32_t *)((const char *)dws + rows_bytes);
    a.zbuf = (float *)((char *)dws + z_off);
    a.cbuf = (int32_t *)((char *)dws + c_off);
    a.ids = ids;
    a.logprob = want_lp ? (float *)cu_ptr(&p->logprob) : NULL;
    if (n_top > 0) {
        a.top_ids = cu_ptr(&p->top_ids);
        a.top_ids_nb1 = p->top_ids.nb[1];
        a.top_lp = cu_ptr(&p->top_logprobs);
        a.top_lp_nb1 = p->top_logprobs.nb[1];
    }
    a.sort_buf = (unsigned long long *)((char *)dws + sort_off);
    a.sort_cap = sort_cap;
    a.sort_n = (int32_t)sort_n;
    smp_rows_kernel<<<R, SMP_THREADS, 0, s->cs>>>(a);
    return cu_check_launch(be, "sample: smp_rows_kernel");
}

// ---------------------------------------------------------------------------------------------------------------
// log_softmax_topk

__global__ void __launch_bounds__(SMP_THREADS)
    smp_lst_kernel(const char *logits, int64_t nb1, int V, const float *bias, int k, char *values, int64_t v_nb1,
                   char *indices, int64_t i_nb1, unsigned long long *sort_buf, int64_t sort_cap, int sort_n)
{
    __shared__ smp_smem S;
    const int r = blockIdx.x;
    const float *x = (const float *)(logits + (int64_t)r * nb1);
    /* the CPU's log_sum_exp: max (NaN passed over), double sum of fp32 exp(x - max) */
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < V; i += SMP_THREADS)
        mx = fmaxf(mx, x[i]);
    mx = cu_block_max(mx, S.rf);
    double sum = 0.0;
    for (int i = threadIdx.x; i < V; i += SMP_THREADS)
        sum += (double)expf(__fsub_rn(x[i], mx));
    sum = smp_sum_d(sum, S.rd);
    const float shift = __fsub_rn(__fadd_rn(mx, (float)log(sum)), bias ? bias[r] : 0.0f);
    unsigned long long *buf = sort_cap ? sort_buf + (int64_t)r * sort_cap : S.sort;
    smp_top_list([&](int i) { return smp_key(smp_nonan(__fsub_rn(x[i], shift))); }, V, k, buf, sort_n, S);
    float *vals = (float *)(values + (int64_t)r * v_nb1);
    int32_t *idx = (int32_t *)(indices + (int64_t)r * i_nb1);
    for (int j = threadIdx.x; j < k; j += SMP_THREADS) {
        const int id = (int)(uint32_t)buf[j];
        idx[j] = id;
        vals[j] = __fsub_rn(x[id], shift);
    }
}

bool cu_check_log_softmax_topk(const berth_backend *be, struct opck *c, const berth_log_softmax_topk_params *p)
{
    (void)be;
    if (!opck_log_softmax_topk(c, p))
        return false;
    if (p->logits.ne[0] > SMP_MAX_V)
        return opck_fail(c, BERTH_E_UNSUPPORTED,
                         "log_softmax_topk: vocabulary size %" PRId64 " is over the CUDA backend's limit (%d)",
                         p->logits.ne[0], SMP_MAX_V);
    if (p->logits.ne[1] > INT32_MAX)
        return opck_fail(c, BERTH_E_UNSUPPORTED,
                         "log_softmax_topk: %" PRId64 " rows is over the CUDA backend's limit (%d)", p->logits.ne[1],
                         INT32_MAX);
    return true;
}

berth_status cu_op_log_softmax_topk(berth_backend *be, berth_stream *s, const berth_log_softmax_topk_params *p)
{
    CU_OP_BEGIN(be, log_softmax_topk, p);
    if (!s)
        return cu_fail(be->host, BERTH_E_INVALID, "log_softmax_topk: stream is NULL");
    const int64_t V = p->logits.ne[0], R = p->logits.ne[1];
    if (R <= 0)
        return BERTH_OK;
    const uint32_t sort_n = smp_pow2((uint32_t)p->k);
    const int64_t sort_cap = sort_n > SMP_SORT_SMEM ? (int64_t)sort_n : 0;
    void *ws = NULL;
    if (sort_cap) {
        berth_status st = cu_stream_ws(be, s, (size_t)R * (size_t)sort_cap * sizeof(unsigned long long), &ws);
        if (st != BERTH_OK)
            return st;
    }
    smp_lst_kernel<<<(unsigned)R, SMP_THREADS, 0, s->cs>>>(
        cu_ptr(&p->logits), p->logits.nb[1], (int)V, p->row_bias.buf ? (const float *)cu_ptr(&p->row_bias) : NULL,
        p->k, cu_ptr(&p->values), p->values.nb[1], cu_ptr(&p->indices), p->indices.nb[1],
        (unsigned long long *)ws, sort_cap, (int)sort_n);
    return cu_check_launch(be, "log_softmax_topk: smp_lst_kernel");
}

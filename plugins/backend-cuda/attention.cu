/*
 * attention.cu — attention of mixed prefill chunks and decode rows over the paged KV cache (berth/backend.h,
 * ATTENTION), fp32 throughout: K/V widened from f32/bf16/f16, scores, softmax and the weighted sum in fp32.
 *
 * Two paths, chosen on the host from shapes only (so a captured launch stays valid on replay):
 *   - decode (T == n_seqs, the usual one query row per sequence): flash-decoding. Grid (sequence, KV head,
 *     split of the key range); one block serves all n_rep query heads of its KV head, so each K/V vector is read
 *     once per block (GQA). Each split keeps an online softmax over key tiles and writes a partial (max, sum,
 *     unnormalised output); a combine kernel merges the splits. With one split the block writes the output
 *     directly. The split count comes from max_kv_len (eager) or the block table's capacity (graph capture);
 *     each sequence then cuts its OWN visible range (read on the device) into that many pieces, so a split past
 *     the sequence's length just records "empty".
 *   - prefill / mixed: a tiled flash-attention kernel, one block per (64-row query tile of one sequence, query
 *     head): Q tile in shared memory, key tiles of K then V through one shared buffer, online softmax in fp32,
 *     SIMT FMA micro-tiles. A small plan kernel turns seq_q_start (device data) into each sequence's first tile
 *     number; the grid is the shape bound ceil(T/64) + n_seqs and surplus blocks leave at once.
 *
 * Metadata (seq_q_start, seq_kv_len, positions, block_table) lives on the device and is never read back (no
 * synchronisation), so the kernels defend themselves instead of reporting: a sequence whose seq_q_start range is
 * not inside [0, T] is skipped, seq_kv_len is clamped to [0, max_blocks * block_size], and a key whose
 * block-table entry is negative or not a block of the pool is treated as absent (never dereferenced). Rows that
 * see no key write zeros. (The CPU backend reports those cases as BERTH_E_INVALID; an asynchronous backend could
 * only do so through a device-side error word checked at stream_sync, which does not exist yet.)
 *
 * Tensor-core path (not here yet): the prefill kernel's two inner products (S = Q K^T over the head dim, O += P V
 * over the key tile) are the only places that would change to mma.sync (bf16 m16n8k16 in BF16 compute mode,
 * 3xTF32 m16n8k8 split products for fp32-accurate FP32 mode): Q/K/V tiles would be stored as fragments-ready
 * halves/tf32 pairs, each warp would own 16 query rows (so the row max/sum stay inside a warp, as now inside 16
 * lanes), and K/V tile loads would become cp.async double-buffered.
 */
#include "cuda_device.cuh"
#include "cuda_internal.h"

#include <inttypes.h>

// ---------------------------------------------------------------------------------------------------------------
// Shared definitions.

#define ATT_BM 64              /* prefill: query rows per tile */
#define ATT_PF_THREADS 256     /* prefill: 16 x 16 threads */
#define ATT_DEC_THREADS 128    /* decode: 4 warps */
#define ATT_DEC_KT 32          /* decode: keys per tile */
#define ATT_DEC_MIN_CHUNK 64   /* decode: fewest keys worth a split of their own */
#define ATT_DEC_MAX_SPLITS 64
#define ATT_DEC_PART_BYTES (32u << 20) /* decode: most workspace the split partials may take */
#define ATT_COMBINE_THREADS 128

/* What every attention kernel reads, flattened from the params (device addresses, byte strides). */
struct attn_args {
    const char *q;
    int64_t q_nb1, q_nb2;
    char *out;
    int64_t out_nb1, out_nb2;
    const char *gate; /* nullptr when absent */
    int64_t gate_nb1, gate_nb2;
    int32_t q_dt, out_dt, gate_dt;
    const int32_t *positions, *seq_q_start, *seq_kv_len, *block_table;
    int64_t bt_stride; /* elements between block-table rows */
    int32_t bt_width;  /* max_blocks */
    const char *kbase, *vbase; /* pool + view offset */
    int64_t block_stride, token_stride, head_stride, v_token_stride, v_head_stride;
    int32_t kv_dt, block_size, n_blocks;
    int32_t D, DV, n_heads, n_rep, T, n_seqs;
    int32_t mask, window;
    float scale, softcap;
    int32_t vec;   /* K/V vectors and strides are 16-byte aligned: 16-byte loads allowed */
    int32_t q_vec; /* the same for q's rows (prefill Q tile, decode q) */
    /* decode */
    int32_t ns;       /* splits */
    int32_t direct;   /* ns == 1: write the output, no partials */
    float *part_ml;   /* [T][H][ns][2]: running max, sum */
    float *part_o;    /* [T][H][ns][DV]: unnormalised output */
    /* prefill */
    const int32_t *tile_start; /* [n_seqs + 1]: first tile of each sequence, then the total */
};

/* Keys [lo, hi) that a query at pos sees among kv_len keys (hi == lo: none). */
__device__ __forceinline__ void att_row_range(const attn_args &a, int32_t pos, int32_t kv_len, int32_t *lo,
                                              int32_t *hi)
{
    if (a.mask == BERTH_MASK_NONE) {
        *lo = 0;
        *hi = kv_len;
        return;
    }
    int64_t h = (int64_t)pos + 1 < kv_len ? (int64_t)pos + 1 : kv_len;
    int64_t l = a.window > 0 ? (int64_t)pos - a.window + 1 : 0;
    l = l > 0 ? l : 0;
    h = h > l ? h : l;
    *lo = (int32_t)l;
    *hi = (int32_t)h;
}

/* seq_kv_len[seq] clamped to what its block-table row can address. */
__device__ __forceinline__ int32_t att_kv_len(const attn_args &a, int seq)
{
    const int64_t cap = (int64_t)a.bt_width * a.block_size;
    int64_t n = a.seq_kv_len[seq];
    n = n < 0 ? 0 : n;
    return (int32_t)(n < cap ? n : cap);
}

/* Byte offsets (from the pool bases, head g included) of key j's K and V vectors, or -1 when its block-table
 * entry is not a block of the pool. j < kv_len <= bt_width * block_size, so the table read is inside the row. */
__device__ __forceinline__ void att_key_offsets(const attn_args &a, const int32_t *bt, int32_t j, int g,
                                                int64_t *koff, int64_t *voff)
{
    const int32_t b = bt[j / a.block_size];
    if (b < 0 || b >= a.n_blocks) {
        *koff = *voff = -1;
        return;
    }
    const int64_t slot = j % a.block_size;
    *koff = (int64_t)b * a.block_stride + slot * a.token_stride + (int64_t)g * a.head_stride;
    *voff = (int64_t)b * a.block_stride + slot * a.v_token_stride + (int64_t)g * a.v_head_stride;
}

/* Eight elements of a K/V vector starting at p (element c*8 of the vector), widened to fp32; elements at or past
 * nvalid read as 0 and are not touched. vec: p is 16-byte aligned, so a full chunk is one (bf16/f16) or two (f32)
 * 16-byte loads. */
template <int DT>
__device__ __forceinline__ void att_ld8(const char *p, int nvalid, bool vec, float f[8])
{
    if (vec && nvalid >= 8) {
        if constexpr (DT == BERTH_DTYPE_F32) {
            const float4 x = ((const float4 *)p)[0], y = ((const float4 *)p)[1];
            f[0] = x.x, f[1] = x.y, f[2] = x.z, f[3] = x.w, f[4] = y.x, f[5] = y.y, f[6] = y.z, f[7] = y.w;
        } else {
            const uint4 u = *(const uint4 *)p;
            const uint32_t w[4] = {u.x, u.y, u.z, u.w}; /* constant indices only: stays in registers */
#pragma unroll
            for (int i = 0; i < 4; i++) {
                if constexpr (DT == BERTH_DTYPE_BF16) {
                    f[2 * i] = __uint_as_float(w[i] << 16);
                    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
                } else {
                    f[2 * i] = __half2float(__ushort_as_half((unsigned short)(w[i] & 0xffffu)));
                    f[2 * i + 1] = __half2float(__ushort_as_half((unsigned short)(w[i] >> 16)));
                }
            }
        }
        return;
    }
#pragma unroll
    for (int e = 0; e < 8; e++)
        f[e] = e < nvalid ? cu_ld(p, DT, e) : 0.0f;
}

/* scale, then softcap (berth/backend.h order; the CPU's expression). */
__device__ __forceinline__ float att_score(const attn_args &a, float dot)
{
    float sc = a.scale * dot;
    if (a.softcap > 0.0f)
        sc = a.softcap * tanhf(sc / a.softcap);
    return sc;
}

/* Final value of one output element: acc / l (0 when the row saw no key), times sigmoid(gate) when present. */
__device__ __forceinline__ void att_store_out(const attn_args &a, int64_t t, int h, int d, float acc, float l)
{
    float o = l > 0.0f ? acc * (1.0f / l) : 0.0f;
    if (a.gate) {
        const float g = cu_ld(a.gate + t * a.gate_nb2 + (int64_t)h * a.gate_nb1, a.gate_dt, d);
        o *= 1.0f / (1.0f + expf(-g));
    }
    cu_st(a.out + t * a.out_nb2 + (int64_t)h * a.out_nb1, a.out_dt, d, o);
}

// ---------------------------------------------------------------------------------------------------------------
// Prefill plan: tile_start[i] = number of ATT_BM-row tiles of sequences before i (a sequence whose range is not
// inside [0, T] gets none), tile_start[n_seqs] = the total. One block of 1024 threads, a scan per 1024 sequences.

#define ATT_PLAN_THREADS 1024

__global__ void __launch_bounds__(ATT_PLAN_THREADS) attn_plan_kernel(const int32_t *seq_q_start, int32_t n_seqs,
                                                                     int32_t T, int32_t *tile_start)
{
    __shared__ int32_t warp_tot[32];
    __shared__ int32_t carry_s;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (threadIdx.x == 0)
        carry_s = 0;
    __syncthreads();
    for (int32_t base = 0; base < n_seqs; base += ATT_PLAN_THREADS) {
        const int32_t i = base + (int32_t)threadIdx.x;
        int32_t n = 0;
        if (i < n_seqs) {
            const int32_t q0 = seq_q_start[i], q1 = seq_q_start[i + 1];
            if (q0 >= 0 && q1 >= q0 && q1 <= T)
                n = (q1 - q0 + ATT_BM - 1) / ATT_BM;
        }
        int32_t incl = n; /* inclusive scan inside the warp */
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int32_t y = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o)
                incl += y;
        }
        if (lane == 31)
            warp_tot[warp] = incl;
        __syncthreads();
        if (warp == 0) {
            int32_t w = warp_tot[lane]; /* 32 warps of 32 threads */
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int32_t y = __shfl_up_sync(0xffffffffu, w, o);
                if (lane >= o)
                    w += y;
            }
            warp_tot[lane] = w; /* inclusive over warps */
        }
        __syncthreads();
        const int32_t carry = carry_s;
        const int32_t before = (warp > 0 ? warp_tot[warp - 1] : 0) + incl - n;
        if (i < n_seqs)
            tile_start[i] = carry + before;
        __syncthreads(); /* everyone has read carry_s and warp_tot */
        if (threadIdx.x == 0)
            carry_s = carry + warp_tot[31];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        tile_start[n_seqs] = carry_s;
}

// ---------------------------------------------------------------------------------------------------------------
// Prefill / mixed: tiled flash attention, SIMT fp32.
//
// DP: head dims padded to a multiple of 64 (>= D and DV; padding is zero in Q, K and V). BN keys per tile.
// Thread (ty, tx) of 16 x 16 owns query rows ty + 16 i (i < BM/16), keys tx + 16 j (j < BN/16) of the score
// tile and output columns tx*4 + 64 jj .. +3 (jj < DP/64) of its rows: a row's 16 owners are one half-warp, so
// row max and sum are 4 shuffles. Shared memory (floats): Q [BM][DP+4], K-then-V [BN][DP+4], P [BM][BN+16];
// the +4 / +16 pads make the K-column and P-row accesses conflict-free.

template <int DP, int BN>
struct att_pf_cfg {
    static constexpr int BM = ATT_BM;
    static constexpr int RM = BM / 16, RN = BN / 16, CG = DP / 64;
    static constexpr int QS = DP + 4, PS = BN + 16;
    static constexpr size_t smem_floats = (size_t)BM * QS + (size_t)BN * QS + (size_t)BM * PS;
};

/* Rows [0, R) of a tile into dst (R x DP floats, row stride DP + 4): row r is n elements of dtype dt at rowp[r]
 * (nullptr: an absent row, all zeros); columns at or past n are zeros. vec: every row pointer is 16-byte aligned.
 * Each thread issues G 16-byte loads before it converts and stores any of them, so a tile costs a few memory
 * latencies instead of one per load. */
template <int DP, int R, int G>
__device__ __forceinline__ void att_tile_load(float *dst, const char *const *rowp, int n, int dt, bool vec)
{
    constexpr int QS = DP + 4;
    const int tid = threadIdx.x;
    if (!vec) {
        for (int it = tid; it < R * DP; it += ATT_PF_THREADS) {
            const int r = it / DP, d = it % DP;
            const char *p = rowp[r];
            dst[r * QS + d] = p && d < n ? cu_ld(p, dt, d) : 0.0f;
        }
        return;
    }
    const int epv = dt == BERTH_DTYPE_F32 ? 4 : 8; /* elements per 16-byte load */
    const int esz = 16 / epv;
    const int vpr = DP / epv;
    const int total = R * vpr;
    for (int it0 = 0; it0 < total; it0 += ATT_PF_THREADS * G) {
        uint4 raw[G];
#pragma unroll
        for (int k = 0; k < G; k++) {
            const int it = it0 + k * ATT_PF_THREADS + tid;
            raw[k] = make_uint4(0u, 0u, 0u, 0u);
            if (it < total) {
                const int r = it / vpr, d0 = (it % vpr) * epv;
                const char *p = rowp[r];
                if (p && d0 + epv <= n)
                    raw[k] = *(const uint4 *)(p + (size_t)d0 * esz);
            }
        }
#pragma unroll
        for (int k = 0; k < G; k++) {
            const int it = it0 + k * ATT_PF_THREADS + tid;
            if (it >= total)
                continue;
            const int r = it / vpr, d0 = (it % vpr) * epv;
            const char *p = rowp[r];
            float *o = dst + r * QS + d0;
            if (p && d0 < n && d0 + epv > n) { /* the row's last, partial vector: element by element */
                for (int e = 0; e < epv; e++)
                    o[e] = d0 + e < n ? cu_ld(p, dt, d0 + e) : 0.0f;
            } else if (dt == BERTH_DTYPE_F32) {
                *(float4 *)o = make_float4(__uint_as_float(raw[k].x), __uint_as_float(raw[k].y),
                                           __uint_as_float(raw[k].z), __uint_as_float(raw[k].w));
            } else {
                const uint32_t w[4] = {raw[k].x, raw[k].y, raw[k].z, raw[k].w};
                float f[8];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    if (dt == BERTH_DTYPE_BF16) {
                        f[2 * i] = __uint_as_float(w[i] << 16);
                        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
                    } else {
                        f[2 * i] = __half2float(__ushort_as_half((unsigned short)(w[i] & 0xffffu)));
                        f[2 * i + 1] = __half2float(__ushort_as_half((unsigned short)(w[i] >> 16)));
                    }
                }
                ((float4 *)o)[0] = make_float4(f[0], f[1], f[2], f[3]);
                ((float4 *)o)[1] = make_float4(f[4], f[5], f[6], f[7]);
            }
        }
    }
}

template <int DP, int BN, int MINB>
__global__ void __launch_bounds__(ATT_PF_THREADS, MINB) attn_prefill_kernel(const attn_args a)
{
    using C = att_pf_cfg<DP, BN>;
    constexpr int BM = C::BM, RM = C::RM, RN = C::RN, CG = C::CG, QS = C::QS, PS = C::PS;
    constexpr int G = DP >= 512 ? 4 : 8; /* loads in flight per thread in att_tile_load (registers) */
    extern __shared__ float4 att_smem4[];
    float *Qs = (float *)att_smem4;
    float *KVs = Qs + BM * QS;
    float *Ps = KVs + BN * QS;
    __shared__ int32_t row_lo[BM], row_hi[BM];
    __shared__ const char *qp_s[BM];
    __shared__ const char *kp_s[BN], *vp_s[BN];
    __shared__ int32_t seq_s, tile_s, kmin_s, kmax_s;

    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int h = (int)(blockIdx.x % (unsigned)a.n_heads), g = h / a.n_rep;
    const int32_t bt_idx = (int32_t)(blockIdx.x / (unsigned)a.n_heads); /* tile slot, heads innermost */

    /* Which sequence and tile: binary search of tile_start. Blocks take tiles from the last one backwards (all
     * heads of a tile together), so the causal tiles with the most keys start first and short ones fill the tail. */
    if (tid == 0) {
        const int32_t total = a.tile_start[a.n_seqs];
        const int32_t b = total - 1 - bt_idx;
        int32_t seq = -1;
        if (bt_idx < total) {
            int32_t lo = 0, hi = a.n_seqs - 1; /* largest i with tile_start[i] <= b */
            while (lo < hi) {
                const int32_t mid = (lo + hi + 1) >> 1;
                if (a.tile_start[mid] <= b)
                    lo = mid;
                else
                    hi = mid - 1;
            }
            seq = lo;
        }
        seq_s = seq;
        tile_s = b;
        kmin_s = INT32_MAX;
        kmax_s = 0;
    }
    __syncthreads();
    const int32_t seq = seq_s;
    if (seq < 0)
        return;
    const int32_t q0 = a.seq_q_start[seq];
    const int64_t r0 = (int64_t)q0 + (int64_t)(tile_s - a.tile_start[seq]) * BM;
    const int64_t qend = a.seq_q_start[seq + 1];
    const int nrows = (int)(qend - r0 < BM ? qend - r0 : BM); /* >= 1: the plan gave this sequence this tile */
    const int32_t kv_len = att_kv_len(a, seq);
    const int32_t *bt = a.block_table + (int64_t)seq * a.bt_stride;

    /* Per-row visible ranges and their hull; the rows' q vectors. */
    if (tid < BM) {
        int32_t lo = 0, hi = 0;
        if (tid < nrows)
            att_row_range(a, a.positions[r0 + tid], kv_len, &lo, &hi);
        row_lo[tid] = lo;
        row_hi[tid] = hi;
        if (hi > lo) {
            atomicMin(&kmin_s, lo);
            atomicMax(&kmax_s, hi);
        }
        qp_s[tid] = tid < nrows ? a.q + (r0 + tid) * a.q_nb2 + (int64_t)h * a.q_nb1 : nullptr;
    }
    __syncthreads();
    /* Q tile (zero past the rows and past D). */
    att_tile_load<DP, BM, G>(Qs, qp_s, a.D, a.q_dt, a.q_vec != 0);
    __syncthreads();
    const int32_t kmin = kmin_s, kmax = kmax_s;

    float m[RM], l[RM];
    float4 o[RM][CG];
#pragma unroll
    for (int i = 0; i < RM; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
#pragma unroll
        for (int jj = 0; jj < CG; jj++)
            o[i][jj] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    const bool vec = a.vec != 0;

    for (int32_t k0 = kmin; k0 < kmax; k0 += BN) {
        /* Skip a tile no row of this block sees (also the barrier before kp_s / KVs are rewritten). */
        const bool sees = tid < nrows && row_lo[tid] < row_hi[tid] && row_lo[tid] < k0 + BN && row_hi[tid] > k0;
        if (!__syncthreads_or(sees))
            continue;
        if (tid < BN) {
            const int32_t j = k0 + tid;
            int64_t ko = -1, vo = -1;
            if (j < kmax)
                att_key_offsets(a, bt, j, g, &ko, &vo);
            kp_s[tid] = ko >= 0 ? a.kbase + ko : nullptr;
            vp_s[tid] = vo >= 0 ? a.vbase + vo : nullptr;
        }
        __syncthreads();
        /* K tile, widened; absent keys and the padding are zeros. */
        att_tile_load<DP, BN, G>(KVs, kp_s, a.D, a.kv_dt, vec);
        __syncthreads();

        /* S = Q K^T on the micro-tile. (MMA: this loop.) */
        float sc[RM][RN];
#pragma unroll
        for (int i = 0; i < RM; i++)
#pragma unroll
            for (int j = 0; j < RN; j++)
                sc[i][j] = 0.0f;
#pragma unroll 4
        for (int d = 0; d < DP; d += 4) {
            float4 qa[RM], kb[RN];
#pragma unroll
            for (int i = 0; i < RM; i++)
                qa[i] = *(const float4 *)(Qs + (ty + 16 * i) * QS + d);
#pragma unroll
            for (int j = 0; j < RN; j++)
                kb[j] = *(const float4 *)(KVs + (tx + 16 * j) * QS + d);
#pragma unroll
            for (int i = 0; i < RM; i++)
#pragma unroll
                for (int j = 0; j < RN; j++) {
                    sc[i][j] = fmaf(qa[i].x, kb[j].x, sc[i][j]);
                    sc[i][j] = fmaf(qa[i].y, kb[j].y, sc[i][j]);
                    sc[i][j] = fmaf(qa[i].z, kb[j].z, sc[i][j]);
                    sc[i][j] = fmaf(qa[i].w, kb[j].w, sc[i][j]);
                }
        }

        /* Scale, softcap, mask; online softmax per row; P to shared memory. */
#pragma unroll
        for (int i = 0; i < RM; i++) {
            const int r = ty + 16 * i;
            const int32_t lo = row_lo[r], hi = row_hi[r];
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < RN; j++) {
                const int kj = tx + 16 * j;
                const int32_t key = k0 + kj;
                const bool vis = key >= lo && key < hi && kp_s[kj] != nullptr;
                sc[i][j] = vis ? att_score(a, sc[i][j]) : -INFINITY;
                mx = fmaxf(mx, sc[i][j]);
            }
#pragma unroll
            for (int off = 8; off > 0; off >>= 1)
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            const float m_new = fmaxf(m[i], mx);
            float alpha = 1.0f, sum = 0.0f;
            if (m_new == -INFINITY) {
#pragma unroll
                for (int j = 0; j < RN; j++)
                    sc[i][j] = 0.0f;
            } else {
                alpha = expf(m[i] - m_new);
#pragma unroll
                for (int j = 0; j < RN; j++) {
                    sc[i][j] = expf(sc[i][j] - m_new);
                    sum += sc[i][j];
                }
            }
#pragma unroll
            for (int off = 8; off > 0; off >>= 1)
                sum += __shfl_xor_sync(0xffffffffu, sum, off);
            m[i] = m_new;
            l[i] = l[i] * alpha + sum;
#pragma unroll
            for (int jj = 0; jj < CG; jj++) {
                o[i][jj].x *= alpha;
                o[i][jj].y *= alpha;
                o[i][jj].z *= alpha;
                o[i][jj].w *= alpha;
            }
#pragma unroll
            for (int j = 0; j < RN; j++)
                Ps[r * PS + tx + 16 * j] = sc[i][j];
        }
        __syncthreads(); /* K no longer read; P complete */

        /* V tile into the same buffer. */
        att_tile_load<DP, BN, G>(KVs, vp_s, a.DV, a.kv_dt, vec);
        __syncthreads();

        /* O += P V. (MMA: this loop.) */
#pragma unroll 2
        for (int k = 0; k < BN; k++) {
            float pk[RM];
#pragma unroll
            for (int i = 0; i < RM; i++)
                pk[i] = Ps[(ty + 16 * i) * PS + k];
#pragma unroll
            for (int jj = 0; jj < CG; jj++) {
                const float4 v = *(const float4 *)(KVs + k * QS + tx * 4 + 64 * jj);
#pragma unroll
                for (int i = 0; i < RM; i++) {
                    o[i][jj].x = fmaf(pk[i], v.x, o[i][jj].x);
                    o[i][jj].y = fmaf(pk[i], v.y, o[i][jj].y);
                    o[i][jj].z = fmaf(pk[i], v.z, o[i][jj].z);
                    o[i][jj].w = fmaf(pk[i], v.w, o[i][jj].w);
                }
            }
        }
        /* The next iteration's __syncthreads_or is the barrier before KVs / Ps / kp_s are rewritten. */
    }

#pragma unroll
    for (int i = 0; i < RM; i++) {
        const int r = ty + 16 * i;
        if (r >= nrows)
            continue;
#pragma unroll
        for (int jj = 0; jj < CG; jj++) {
            const int d0 = tx * 4 + 64 * jj;
            const float ov[4] = {o[i][jj].x, o[i][jj].y, o[i][jj].z, o[i][jj].w};
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (d0 + e < a.DV)
                    att_store_out(a, r0 + r, h, d0 + e, ov[e], l[i]);
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Decode: flash-decoding.
//
// Block (sequence, KV head g, split), 4 warps; NR = n_rep rounded up to a power of two (<= 16); CPL = 8-element
// chunks of the head dim per lane (1: D <= 256, 2: D <= 512). Per key tile of 32:
//   A. scores: warp w takes keys 8w..8w+7, four at a time (two when NR = 16); lane L holds chunks L + 32 cc of
//      each K vector (16-byte loads) and dots them with q (fp32, shared memory) for all NR heads; the NR partial
//      sums are reduced with a reduce-scatter (each step halves the values a lane carries), so head r's score ends
//      in the lanes with L >> (5 - log2 NR) == r.
//   B. online softmax per head (one warp per head, a lane per key).
//   C. O += P V: thread = (chunk c of 8 output dims, head group); it loads its V chunk once per key and
//      updates its heads' accumulators in registers.

template <int NR>
struct att_log2 {
    static constexpr int v = NR >= 16 ? 4 : NR >= 8 ? 3 : NR >= 4 ? 2 : NR >= 2 ? 1 : 0;
};

/* Sum v[0..NR) over the warp; afterwards v[0] of lane L holds the sum of value r = L >> (5 - log2 NR). */
template <int NR>
__device__ __forceinline__ void att_reduce_scatter(float v[NR], int lane)
{
    constexpr int LG = att_log2<NR>::v;
#pragma unroll
    for (int step = 0; step < LG; step++) {
        const int o = 16 >> step;
        const int half = NR >> (step + 1);
        const bool up = (lane & o) != 0;
#pragma unroll
        for (int i = 0; i < half; i++) {
            const float send = up ? v[i] : v[i + half];
            const float keep = up ? v[i + half] : v[i];
            v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
        }
    }
#pragma unroll
    for (int o = 16 >> LG; o > 0; o >>= 1)
        v[0] += __shfl_xor_sync(0xffffffffu, v[0], o);
}

template <int DT, int NR, int CPL>
__global__ void __launch_bounds__(ATT_DEC_THREADS, 1) attn_decode_kernel(const attn_args a)
{
    constexpr int LG = att_log2<NR>::v;
    constexpr int QW = CPL * 256;      /* floats of q per head in shared memory */
    constexpr int HPT = (NR + 1) / 2;  /* most heads one thread accumulates in phase C (head groups >= 2) */
    constexpr int KT = ATT_DEC_KT;
    constexpr int KG = NR >= 16 ? 2 : 4; /* keys a warp scores at once (register budget) */
    constexpr int VG = NR >= 16 ? 2 : 4; /* keys whose V chunks a thread loads at once in phase C */
    __shared__ __align__(16) float q_s[NR * QW];
    __shared__ float s_s[NR * KT];
    __shared__ float m_s[NR], l_s[NR], al_s[NR];
    __shared__ int64_t koff_s[KT], voff_s[KT];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int seq = blockIdx.x, g = blockIdx.y, split = blockIdx.z;
    const int32_t q0 = a.seq_q_start[seq], q1 = a.seq_q_start[seq + 1];
    if (q0 < 0 || q1 < q0 || q1 > a.T)
        return;
    const int32_t kv_len = att_kv_len(a, seq);
    const int32_t *bt = a.block_table + (int64_t)seq * a.bt_stride;
    const int n_rep = a.n_rep, H = a.n_heads;
    constexpr size_t esz = DT == BERTH_DTYPE_F32 ? 4 : 2;
    const bool vec = a.vec != 0;

    /* Phase C mapping. */
    const int NC = (a.DV + 7) / 8;             /* <= 64 */
    const int HG = ATT_DEC_THREADS / NC;       /* >= 2 */
    const int c_c = tid % NC, hg = tid / NC;
    const bool c_on = hg < HG;

    for (int32_t t = q0; t < q1; t++) {
        int32_t lo, hi;
        att_row_range(a, a.positions[t], kv_len, &lo, &hi);
        /* This split's share of [lo, hi): chunks of at least ATT_DEC_MIN_CHUNK keys, a multiple of KT. */
        const int64_t len = (int64_t)hi - lo;
        int64_t chunk = (len + a.ns - 1) / a.ns;
        chunk = chunk < ATT_DEC_MIN_CHUNK ? ATT_DEC_MIN_CHUNK : chunk;
        chunk = (chunk + KT - 1) / KT * KT;
        const int64_t kb64 = (int64_t)lo + (int64_t)split * chunk;
        const int32_t k_begin = kb64 < hi ? (int32_t)kb64 : hi;
        const int32_t k_end = (int64_t)k_begin + chunk < hi ? (int32_t)(k_begin + chunk) : hi;
        const int64_t ml_base = ((int64_t)t * H + (int64_t)g * n_rep) * a.ns + split; /* head r: + r * ns */

        __syncthreads(); /* the previous row is done with the shared arrays */
        if (k_begin >= k_end) {
            if (a.direct) {
                for (int it = tid; it < n_rep * a.DV; it += ATT_DEC_THREADS)
                    att_store_out(a, t, g * n_rep + it / a.DV, it % a.DV, 0.0f, 0.0f);
            } else if (tid < n_rep) {
                a.part_ml[(ml_base + (int64_t)tid * a.ns) * 2] = -INFINITY;
                a.part_ml[(ml_base + (int64_t)tid * a.ns) * 2 + 1] = 0.0f;
            }
            continue;
        }

        /* q of the NR heads (zeros past n_rep and past D), 4 floats per step, all loads issued first. */
        {
            constexpr int Q4 = NR * QW / 4, QIT = (Q4 + ATT_DEC_THREADS - 1) / ATT_DEC_THREADS;
            float4 qv[QIT];
#pragma unroll
            for (int k = 0; k < QIT; k++) {
                const int it = tid + k * ATT_DEC_THREADS, r = it / (QW / 4), d0 = it % (QW / 4) * 4;
                qv[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (it < Q4 && r < n_rep && d0 < a.D) {
                    const char *qr = a.q + (int64_t)t * a.q_nb2 + (int64_t)(g * n_rep + r) * a.q_nb1;
                    if (a.q_vec && d0 + 4 <= a.D)
                        qv[k] = *(const float4 *)(qr + (size_t)d0 * 4);
                    else
                        qv[k] = make_float4(cu_ld(qr, a.q_dt, d0), d0 + 1 < a.D ? cu_ld(qr, a.q_dt, d0 + 1) : 0.0f,
                                            d0 + 2 < a.D ? cu_ld(qr, a.q_dt, d0 + 2) : 0.0f,
                                            d0 + 3 < a.D ? cu_ld(qr, a.q_dt, d0 + 3) : 0.0f);
                }
            }
#pragma unroll
            for (int k = 0; k < QIT; k++) {
                const int it = tid + k * ATT_DEC_THREADS;
                if (it < Q4)
                    *(float4 *)(q_s + it * 4) = qv[k];
            }
        }
        if (tid < NR) {
            m_s[tid] = -INFINITY;
            l_s[tid] = 0.0f;
        }
        float acc[HPT][8];
#pragma unroll
        for (int i = 0; i < HPT; i++)
#pragma unroll
            for (int e = 0; e < 8; e++)
                acc[i][e] = 0.0f;

        for (int32_t k0 = k_begin; k0 < k_end; k0 += KT) {
            if (tid < KT) {
                const int32_t j = k0 + tid;
                int64_t ko = -1, vo = -1;
                if (j < k_end)
                    att_key_offsets(a, bt, j, g, &ko, &vo);
                koff_s[tid] = ko;
                voff_s[tid] = vo;
            }
            __syncthreads(); /* also: q_s, m_s, l_s ready; the previous tile's phase C is done with s_s */

            /* A. scores */
#pragma unroll
            for (int grp = 0; grp < 8 / KG; grp++) {
                const int jb = warp * 8 + grp * KG;
                float dot[KG][NR];
#pragma unroll
                for (int kk = 0; kk < KG; kk++)
#pragma unroll
                    for (int r = 0; r < NR; r++)
                        dot[kk][r] = 0.0f;
#pragma unroll
                for (int cc = 0; cc < CPL; cc++) {
                    const int d0 = (lane + 32 * cc) * 8;
                    if (d0 >= a.D)
                        continue; /* lane-divergent, but no shuffle inside */
                    float kf[KG][8];
#pragma unroll
                    for (int kk = 0; kk < KG; kk++) {
                        const int64_t ko = koff_s[jb + kk];
                        if (ko >= 0)
                            att_ld8<DT>(a.kbase + ko + (int64_t)d0 * esz, a.D - d0, vec, kf[kk]);
                        else
#pragma unroll
                            for (int e = 0; e < 8; e++)
                                kf[kk][e] = 0.0f;
                    }
#pragma unroll
                    for (int r = 0; r < NR; r++) {
                        const float4 qa = *(const float4 *)(q_s + r * QW + d0);
                        const float4 qb = *(const float4 *)(q_s + r * QW + d0 + 4);
#pragma unroll
                        for (int kk = 0; kk < KG; kk++) {
                            float s = dot[kk][r];
                            s = fmaf(qa.x, kf[kk][0], s);
                            s = fmaf(qa.y, kf[kk][1], s);
                            s = fmaf(qa.z, kf[kk][2], s);
                            s = fmaf(qa.w, kf[kk][3], s);
                            s = fmaf(qb.x, kf[kk][4], s);
                            s = fmaf(qb.y, kf[kk][5], s);
                            s = fmaf(qb.z, kf[kk][6], s);
                            s = fmaf(qb.w, kf[kk][7], s);
                            dot[kk][r] = s;
                        }
                    }
                }
#pragma unroll
                for (int kk = 0; kk < KG; kk++) {
                    att_reduce_scatter<NR>(dot[kk], lane);
                    const int r = lane >> (5 - LG);
                    if ((lane & ((32 >> LG) - 1)) == 0 && r < n_rep) {
                        const int j = jb + kk;
                        s_s[r * KT + j] = koff_s[j] >= 0 ? att_score(a, dot[kk][0]) : -INFINITY;
                    }
                }
            }
            __syncthreads();

            /* B. online softmax, one warp per head */
            for (int r = warp; r < n_rep; r += ATT_DEC_THREADS / 32) {
                const float s = s_s[r * KT + lane];
                float mx = cu_warp_max(s);
                const float m_old = m_s[r];
                const float m_new = fmaxf(m_old, mx);
                float p = 0.0f, alpha = 1.0f;
                if (m_new != -INFINITY) {
                    p = expf(s - m_new);
                    alpha = expf(m_old - m_new);
                }
                const float sum = cu_warp_sum(p);
                s_s[r * KT + lane] = p;
                if (lane == 0) {
                    m_s[r] = m_new;
                    l_s[r] = l_s[r] * alpha + sum;
                    al_s[r] = alpha;
                }
            }
            __syncthreads();

            /* C. O += P V */
            if (c_on) {
                const int d0 = c_c * 8;
#pragma unroll
                for (int i = 0; i < HPT; i++) {
                    const int r = hg + i * HG;
                    if (r < n_rep) {
                        const float al = al_s[r];
#pragma unroll
                        for (int e = 0; e < 8; e++)
                            acc[i][e] *= al;
                    }
                }
                for (int j0 = 0; j0 < KT; j0 += VG) {
                    /* VG keys' V chunks loaded before use; absent keys (p is 0) read as zeros, never from memory */
                    float vf[VG][8];
#pragma unroll
                    for (int jj = 0; jj < VG; jj++) {
                        const int64_t vo = voff_s[j0 + jj];
                        if (vo >= 0)
                            att_ld8<DT>(a.vbase + vo + (int64_t)d0 * esz, a.DV - d0, vec, vf[jj]);
                        else
#pragma unroll
                            for (int e = 0; e < 8; e++)
                                vf[jj][e] = 0.0f;
                    }
#pragma unroll
                    for (int jj = 0; jj < VG; jj++)
#pragma unroll
                        for (int i = 0; i < HPT; i++) {
                            const int r = hg + i * HG;
                            if (r < n_rep) {
                                const float p = s_s[r * KT + j0 + jj];
#pragma unroll
                                for (int e = 0; e < 8; e++)
                                    acc[i][e] = fmaf(p, vf[jj][e], acc[i][e]);
                            }
                        }
                }
            }
            __syncthreads(); /* phase C done before the next tile rewrites koff_s / s_s */
        }

        /* Results of this row. */
        if (c_on) {
            const int d0 = c_c * 8;
#pragma unroll
            for (int i = 0; i < HPT; i++) {
                const int r = hg + i * HG;
                if (r >= n_rep)
                    continue;
                const int h = g * n_rep + r;
                if (a.direct) {
                    const float l = l_s[r];
#pragma unroll
                    for (int e = 0; e < 8; e++)
                        if (d0 + e < a.DV)
                            att_store_out(a, t, h, d0 + e, acc[i][e], l);
                } else {
                    float *po = a.part_o + (((int64_t)t * H + h) * a.ns + split) * a.DV;
#pragma unroll
                    for (int e = 0; e < 8; e++)
                        if (d0 + e < a.DV)
                            po[d0 + e] = acc[i][e];
                }
            }
        }
        if (!a.direct && tid < n_rep) {
            a.part_ml[(ml_base + (int64_t)tid * a.ns) * 2] = m_s[tid];
            a.part_ml[(ml_base + (int64_t)tid * a.ns) * 2 + 1] = l_s[tid];
        }
    }
}

/* Merge the ns split partials of each (row, head): weights e^(m_s - M), out = sum w_s O_s / sum w_s l_s. Splits
 * that saw no key (l == 0) are skipped without reading their O (never written). Block per (row, head). */
__global__ void __launch_bounds__(ATT_COMBINE_THREADS) attn_combine_kernel(const attn_args a)
{
    __shared__ float w_s[ATT_DEC_MAX_SPLITS];
    const int64_t th = blockIdx.x; /* t * H + h */
    const int64_t t = th / a.n_heads;
    const int h = (int)(th % a.n_heads);
    const int ns = a.ns;
    const float *ml = a.part_ml + th * ns * 2;
    float M = -INFINITY;
    for (int s = 0; s < ns; s++)
        if (ml[2 * s + 1] > 0.0f)
            M = fmaxf(M, ml[2 * s]);
    if (threadIdx.x < ns) {
        const int s = threadIdx.x;
        w_s[s] = ml[2 * s + 1] > 0.0f && M != -INFINITY ? expf(ml[2 * s] - M) : 0.0f;
    }
    __syncthreads();
    float L = 0.0f;
    for (int s = 0; s < ns; s++)
        if (w_s[s] > 0.0f)
            L += w_s[s] * ml[2 * s + 1];
    const float *po = a.part_o + th * ns * a.DV;
    for (int d = threadIdx.x; d < a.DV; d += ATT_COMBINE_THREADS) {
        float acc = 0.0f;
        for (int s = 0; s < ns; s++)
            if (w_s[s] > 0.0f)
                acc = fmaf(w_s[s], po[(int64_t)s * a.DV + d], acc);
        att_store_out(a, t, h, d, acc, L);
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Host side.

/* Padded head dim of the prefill kernel. */
static int att_dp(int D, int DV)
{
    const int m = D > DV ? D : DV;
    return m <= 64 ? 64 : m <= 128 ? 128 : m <= 256 ? 256 : 512;
}

/* Tile config per padded head dim: (DP, BN, min blocks per SM). */
#define ATT_PF_CONFIGS(X) X(64, 64, 2) X(128, 64, 2) X(256, 32, 1) X(512, 32, 1)

/* Shared memory of the prefill kernel (dynamic part) for head dims D, DV. */
static size_t att_pf_smem(int D, int DV)
{
    switch (att_dp(D, DV)) {
#define X(dp, bn, minb)                                                                                            \
    case dp:                                                                                                       \
        return att_pf_cfg<dp, bn>::smem_floats * sizeof(float);
        ATT_PF_CONFIGS(X)
#undef X
    }
    return 0;
}

/* Static shared memory of the prefill kernel, with room to spare (row ranges, key offsets, a few ints). */
#define ATT_PF_STATIC_SMEM 4096

bool cu_check_attention(const berth_backend *be, struct opck *c, const berth_attention_params *p)
{
    if (!opck_attention(c, p))
        return false;
    const berth_kv_view *kv = &p->kv;
    const int64_t H = p->q.ne[1];
    /* be->ck limits normally make opck reject these first; the guards only speak if it did not. */
    if (kv->head_dim > CU_MAX_HEAD_DIM || kv->head_dim_v > CU_MAX_HEAD_DIM)
        return opck_fail(c, BERTH_E_UNSUPPORTED,
                         "attention: head_dim %d / head_dim_v %d exceeds this backend's limit of %d", kv->head_dim,
                         kv->head_dim_v, CU_MAX_HEAD_DIM);
    if (H / kv->n_kv_heads > CU_MAX_REP)
        return opck_fail(c, BERTH_E_UNSUPPORTED, "attention: %" PRId64 " query heads per KV head (most: %d)",
                         H / kv->n_kv_heads, CU_MAX_REP);
    /* The kernels read q/gate and write out through cu_ld/cu_st, but this backend lists f32 activations only. */
    const bool gate = opck_present(c, &p->gate);
    if (p->q.dtype != BERTH_DTYPE_F32 || p->out.dtype != BERTH_DTYPE_F32 || (gate && p->gate.dtype != BERTH_DTYPE_F32))
        return opck_fail(c, BERTH_E_UNSUPPORTED, "attention: q, out and gate must be f32 on this backend");
    if (H > 65535 || p->q.ne[2] > INT32_MAX || p->n_seqs > INT32_MAX - 1 || (int64_t)p->q.ne[2] * H > INT32_MAX)
        return opck_fail(c, BERTH_E_UNSUPPORTED, "attention: %" PRId64 " heads x %" PRId64
                         " rows is more than this backend's grid limits", H, p->q.ne[2]);
    const size_t smem = att_pf_smem(kv->head_dim, kv->head_dim_v) + ATT_PF_STATIC_SMEM;
    if (smem > be->smem_optin)
        return opck_fail(c, BERTH_E_UNSUPPORTED, "attention: head_dim %d / head_dim_v %d needs %zu bytes of shared "
                         "memory per block, the device allows %zu", kv->head_dim, kv->head_dim_v, smem, be->smem_optin);
    return true;
}

/* Split count of the decode path for an upper bound kv_bound of keys per sequence. */
static int att_dec_splits(const berth_backend *be, int64_t kv_bound, int32_t n_seqs, int32_t n_kv_heads, int64_t T,
                          int64_t H, int32_t DV)
{
    const int64_t base = (int64_t)n_seqs * n_kv_heads;
    const int64_t target = 2 * (int64_t)(be->n_sms > 0 ? be->n_sms : 132);
    int64_t ns = (target + base - 1) / (base > 0 ? base : 1);
    const int64_t by_len = (kv_bound + ATT_DEC_MIN_CHUNK - 1) / ATT_DEC_MIN_CHUNK;
    ns = ns < by_len ? ns : by_len;
    ns = ns < ATT_DEC_MAX_SPLITS ? ns : ATT_DEC_MAX_SPLITS;
    const int64_t per_split = T * H * ((int64_t)DV + 2) * (int64_t)sizeof(float);
    const int64_t by_ws = per_split > 0 ? (int64_t)ATT_DEC_PART_BYTES / per_split : ns;
    ns = ns < by_ws ? ns : by_ws;
    return ns < 1 ? 1 : (int)ns;
}

template <int DT, int NR>
static void att_launch_decode_nr(dim3 grid, cudaStream_t cs, const attn_args &a)
{
    if (a.D <= 256)
        attn_decode_kernel<DT, NR, 1><<<grid, ATT_DEC_THREADS, 0, cs>>>(a);
    else
        attn_decode_kernel<DT, NR, 2><<<grid, ATT_DEC_THREADS, 0, cs>>>(a);
}

template <int DT>
static void att_launch_decode_dt(dim3 grid, cudaStream_t cs, const attn_args &a)
{
    if (a.n_rep <= 1)
        att_launch_decode_nr<DT, 1>(grid, cs, a);
    else if (a.n_rep <= 2)
        att_launch_decode_nr<DT, 2>(grid, cs, a);
    else if (a.n_rep <= 4)
        att_launch_decode_nr<DT, 4>(grid, cs, a);
    else if (a.n_rep <= 8)
        att_launch_decode_nr<DT, 8>(grid, cs, a);
    else
        att_launch_decode_nr<DT, 16>(grid, cs, a);
}

static berth_status att_run_decode(berth_backend *be, berth_stream *s, const berth_attention_params *p, attn_args a)
{
    const berth_kv_view *kv = &p->kv;
    const int64_t cap = (int64_t)a.bt_width * kv->block_size;
    /* Launch sizing: from max_kv_len, except during graph capture (then the block table's capacity). The
     * workspace is always sized for the capacity bound so that a capture after an eager step never grows it. */
    int64_t kv_bound = be->capturing ? cap : (p->max_kv_len < cap ? p->max_kv_len : cap);
    kv_bound = kv_bound > 0 ? kv_bound : 0;
    const int ns = att_dec_splits(be, kv_bound, a.n_seqs, kv->n_kv_heads, a.T, a.n_heads, a.DV);
    const int ns_ws = att_dec_splits(be, cap, a.n_seqs, kv->n_kv_heads, a.T, a.n_heads, a.DV);
    a.ns = ns;
    a.direct = ns == 1;
    if (ns_ws > 1) {
        const size_t n_ml = (size_t)a.T * (size_t)a.n_heads * (size_t)ns_ws * 2;
        const size_t n_o = (size_t)a.T * (size_t)a.n_heads * (size_t)ns_ws * (size_t)a.DV;
        void *ws = nullptr;
        berth_status st = cu_stream_ws(be, s, (n_ml + n_o) * sizeof(float), &ws);
        if (st != BERTH_OK)
            return st;
        a.part_ml = (float *)ws;
        a.part_o = (float *)ws + (size_t)a.T * (size_t)a.n_heads * (size_t)ns * 2;
    }
    const dim3 grid((unsigned)a.n_seqs, (unsigned)kv->n_kv_heads, (unsigned)ns);
    if (kv->dtype == BERTH_DTYPE_BF16)
        att_launch_decode_dt<BERTH_DTYPE_BF16>(grid, s->cs, a);
    else if (kv->dtype == BERTH_DTYPE_F16)
        att_launch_decode_dt<BERTH_DTYPE_F16>(grid, s->cs, a);
    else
        att_launch_decode_dt<BERTH_DTYPE_F32>(grid, s->cs, a);
    berth_status st = cu_check_launch(be, "attn_decode_kernel");
    if (st != BERTH_OK || a.direct)
        return st;
    attn_combine_kernel<<<(unsigned)((int64_t)a.T * a.n_heads), ATT_COMBINE_THREADS, 0, s->cs>>>(a);
    return cu_check_launch(be, "attn_combine_kernel");
}

template <int DP, int BN, int MINB>
static berth_status att_launch_prefill(berth_backend *be, berth_stream *s, const attn_args &a, unsigned n_tiles)
{
    const size_t smem = att_pf_cfg<DP, BN>::smem_floats * sizeof(float);
    berth_status st = cu_check(be,
                               cudaFuncSetAttribute(attn_prefill_kernel<DP, BN, MINB>,
                                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                               "cudaFuncSetAttribute (attn_prefill_kernel shared memory)");
    if (st != BERTH_OK)
        return st;
    attn_prefill_kernel<DP, BN, MINB><<<n_tiles * (unsigned)a.n_heads, ATT_PF_THREADS, smem, s->cs>>>(a);
    return cu_check_launch(be, "attn_prefill_kernel");
}

static berth_status att_run_prefill(berth_backend *be, berth_stream *s, attn_args a)
{
    /* Sum over sequences of ceil(rows / BM) <= ceil(T / BM) + n_seqs: a grid bound from shapes only. */
    const int64_t tiles = ((int64_t)a.T + ATT_BM - 1) / ATT_BM + a.n_seqs;
    if (tiles * a.n_heads > INT32_MAX)
        return cu_fail(be->host, BERTH_E_UNSUPPORTED, "attention: %" PRId64 " query tiles x %d heads is more than this "
                       "backend's grid limit", tiles, a.n_heads);
    void *ws = nullptr;
    berth_status st = cu_stream_ws(be, s, ((size_t)a.n_seqs + 1) * sizeof(int32_t), &ws);
    if (st != BERTH_OK)
        return st;
    a.tile_start = (const int32_t *)ws;
    attn_plan_kernel<<<1, ATT_PLAN_THREADS, 0, s->cs>>>(a.seq_q_start, a.n_seqs, a.T, (int32_t *)ws);
    if ((st = cu_check_launch(be, "attn_plan_kernel")) != BERTH_OK)
        return st;
    switch (att_dp(a.D, a.DV)) {
#define X(dp, bn, minb)                                                                                            \
    case dp:                                                                                                       \
        return att_launch_prefill<dp, bn, minb>(be, s, a, (unsigned)tiles);
        ATT_PF_CONFIGS(X)
#undef X
    }
    return cu_fail(be->host, BERTH_E_BACKEND, "attention: no prefill kernel for head dims %d / %d", a.D, a.DV);
}

berth_status cu_op_attention(berth_backend *be, berth_stream *s, const berth_attention_params *p)
{
    CU_OP_BEGIN(be, attention, p);
    const berth_kv_view *kv = &p->kv;
    const int64_t T = p->q.ne[2], H = p->q.ne[1];
    if (T > 0 && p->n_seqs == 0)
        return cu_fail(be->host, BERTH_E_INVALID, "attention: %" PRId64 " query rows but no sequence", T);
    if (T == 0 || H == 0)
        return BERTH_OK;
    const bool gate = p->gate.buf != nullptr;
    attn_args a = {};
    a.q = cu_ptr(&p->q);
    a.q_nb1 = p->q.nb[1];
    a.q_nb2 = p->q.nb[2];
    a.q_dt = p->q.dtype;
    a.out = cu_ptr(&p->out);
    a.out_nb1 = p->out.nb[1];
    a.out_nb2 = p->out.nb[2];
    a.out_dt = p->out.dtype;
    a.gate = gate ? cu_ptr(&p->gate) : nullptr;
    a.gate_nb1 = gate ? p->gate.nb[1] : 0;
    a.gate_nb2 = gate ? p->gate.nb[2] : 0;
    a.gate_dt = gate ? p->gate.dtype : BERTH_DTYPE_F32;
    a.positions = (const int32_t *)cu_ptr(&p->positions);
    a.seq_q_start = (const int32_t *)cu_ptr(&p->seq_q_start);
    a.seq_kv_len = (const int32_t *)cu_ptr(&p->seq_kv_len);
    a.block_table = (const int32_t *)cu_ptr(&p->block_table);
    a.bt_stride = p->block_table.nb[1] / (int64_t)sizeof(int32_t);
    a.bt_width = (int32_t)(p->block_table.ne[0] < INT32_MAX ? p->block_table.ne[0] : INT32_MAX);
    a.kbase = (const char *)kv->k_buf->ptr + kv->k_offset;
    a.vbase = (const char *)kv->v_buf->ptr + kv->v_offset;
    a.block_stride = (int64_t)kv->block_stride;
    a.token_stride = (int64_t)kv->token_stride;
    a.head_stride = (int64_t)kv->head_stride;
    a.v_token_stride = (int64_t)kv->v_token_stride;
    a.v_head_stride = (int64_t)kv->v_head_stride;
    a.kv_dt = kv->dtype;
    a.block_size = kv->block_size;
    a.n_blocks = kv->n_blocks;
    a.D = kv->head_dim;
    a.DV = kv->head_dim_v;
    a.n_heads = (int32_t)H;
    a.n_rep = (int32_t)(H / kv->n_kv_heads);
    a.T = (int32_t)T;
    a.n_seqs = p->n_seqs;
    a.mask = p->mask;
    a.window = p->mask == BERTH_MASK_CAUSAL ? p->window : 0;
    a.scale = p->scale;
    a.softcap = p->softcap;
    const uint64_t align = (uintptr_t)a.kbase | (uintptr_t)a.vbase | kv->block_stride | kv->token_stride |
                           kv->head_stride | kv->v_token_stride | kv->v_head_stride;
    a.vec = (align & 15u) == 0;
    a.q_vec = (((uintptr_t)a.q | (uint64_t)p->q.nb[1] | (uint64_t)p->q.nb[2]) & 15u) == 0;
    if (T == p->n_seqs)
        return att_run_decode(be, s, p, a);
    return att_run_prefill(be, s, a);
}

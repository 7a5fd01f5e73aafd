/*
 * attention.cu — attention of mixed prefill chunks and decode rows over the paged KV cache (berth/backend.h,
 * ATTENTION), fp32 throughout: K/V widened from f32/bf16/f16, scores, softmax and the weighted sum in fp32.
 *
 * Two paths, chosen on the host from shapes only (so a captured launch stays valid on replay):
 *   - decode (T == n_seqs and max_q_len 1: one query row per sequence): attention_decode.cu's one-launch cluster kernel
 *     serves it when it can; otherwise (or with BERTH_CUDA_ATT_DECODE=old) flash-decoding here. Grid (sequence,
 *     KV head, split of the key range); one block serves all n_rep query heads of its KV head, so each K/V vector is read
 *     once per block (GQA), with q and the output accumulators of all those heads in registers and K/V streamed
 *     through shared memory by cp.async (details at the kernel). Each split keeps an online softmax and writes a
 *     partial (max, sum, unnormalised output); a combine kernel merges the splits. With one split the block
 *     writes the output directly. The split count (enough blocks for one wave of the GPU, at least 16 keys each)
 *     comes from max_kv_len (eager) or the block table's capacity (graph capture), capped by the window; each
 *     sequence then cuts its OWN visible range (read on the device) into that many pieces, so a split past the
 *     sequence's length just records "empty".
 *   - prefill / mixed: a tiled flash-attention kernel, one block per (64-row query tile of one sequence, query
 *     head): Q tile in shared memory, key tiles of K then V through one shared buffer, online softmax in fp32,
 *     SIMT FMA micro-tiles; or its tensor-core twin (below). A small plan kernel turns seq_q_start (device data)
 *     into each sequence's first tile number; the grid is the shape bound ceil(T/64) + n_seqs and surplus blocks
 *     leave at once.
 *
 * Metadata (seq_q_start, seq_kv_len, positions, block_table) lives on the device and is never read back (no
 * synchronisation), so the kernels defend themselves instead of reporting: a sequence whose seq_q_start range is
 * not inside [0, T] is skipped, seq_kv_len is clamped to [0, max_blocks * block_size], and a key whose
 * block-table entry is negative or not a block of the pool is treated as absent (never dereferenced). Rows that
 * see no key write zeros. (The CPU backend reports those cases as BERTH_E_INVALID; an asynchronous backend could
 * only do so through a device-side error word checked at stream_sync, which does not exist yet.)
 *
 * Tensor-core prefill (attn_prefill_mma_kernel, the one exception to "fp32 throughout"): in BF16 compute mode with
 * a bf16 (f16) cache and head dims that are multiples of 16, S = Q K^T and O += P V run as mma.sync m16n8k16 with
 * fp32 accumulation; q and P are rounded to bf16 (f16) for them, K and V are used as stored, and everything else
 * (scores, softcap, mask, softmax, row sums, output) stays fp32. FP32 compute mode (the parity mode) and f32
 * caches keep the SIMT kernel. (An fp32-accurate tensor-core FP32 mode would need 3xTF32 split products.)
 */
#include "attention_args.cuh"
#include "cuda_device.cuh"
#include "cuda_internal.h"
#include "cuda_launch.cuh"
#include "attention_decode_util.cuh"
#include "cuda_mma.cuh"

#include <inttypes.h>

/* attention_prefill.cu: the tensor-core prefill kernel with GQA-packed rows (*ran false: the case is not
 * covered and nothing was enqueued; then the kernels below run). BERTH_CUDA_ATT_PREFILL=old keeps them. */
berth_status cu_attention_prefill_fast(berth_backend *be, berth_stream *s, const berth_attention_params *p, bool *ran);
/* attention_decode.cu: the one-launch cluster decode kernel (*ran false: not covered or BERTH_CUDA_ATT_DECODE=old,
 * nothing enqueued; then the split-K kernel and combine below run). */
berth_status cu_attention_decode_fast(berth_backend *be, berth_stream *s, const berth_attention_params *p,
                                      bool below_mma, bool *ran);
/* attention_decode_mma.cu: the tensor-core decode kernel (BF16 compute mode, bf16/f16 cache; *ran false: not
 * covered, nothing enqueued). */
berth_status cu_attention_decode_mma(berth_backend *be, berth_stream *s, const berth_attention_params *p, bool *ran);
/* ... and the workspace a capture of the call would need from it (eager calls; nothing enqueued). */
berth_status cu_attention_decode_mma_reserve(berth_backend *be, berth_stream *s, const berth_attention_params *p);

// ---------------------------------------------------------------------------------------------------------------
// Shared definitions.

#define ATT_BM 64              /* prefill: query rows per tile */
#define ATT_PF_THREADS 256     /* prefill: 16 x 16 threads */
#define ATT_DEC_THREADS 128    /* decode: 4 warps */
#define ATT_DEC_MIN_CHUNK 16   /* decode: fewest keys per split (a batch per warp) */
#define ATT_DEC_DIRECT_KEYS 64 /* decode: rows that see at most this many keys: one block, no split */
#define ATT_DEC_MAX_SPLITS 128
#define ATT_DEC_PART_BYTES (32u << 20) /* decode: most workspace the split partials may take */
#define ATT_CMB_THREADS 128    /* decode: combine kernel */

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
        int32_t seq, tile;
        cu_attn_tile_of(a.tile_start, a.n_seqs, bt_idx, &seq, &tile);
        seq_s = seq;
        tile_s = tile;
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
    const int32_t kv_len = cu_attn_kv_len(a, a.seq_kv_len[seq]);
    const int32_t *bt = a.block_table + (int64_t)seq * a.bt_stride;

    /* Per-row visible ranges and their hull; the rows' q vectors. */
    if (tid < BM) {
        int32_t lo = 0, hi = 0;
        if (tid < nrows)
            cu_attn_row_range(a.mask, a.window, a.positions[r0 + tid], kv_len, &lo, &hi);
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
                sc[i][j] = vis ? cu_attn_score(a, sc[i][j]) : -INFINITY;
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
// Prefill / mixed on the tensor cores: BF16 compute mode with a bf16 (or f16) KV cache, head dims that are
// multiples of 16, 16-byte aligned K/V rows (att_mma_ok). Same block <-> (query tile, head) mapping, plan and row
// ranges as the SIMT kernel above, and the same results up to the rounding of q and P to the KV dtype (K and V are
// stored in it already); scores, softmax, row sums and the output accumulate in fp32.
//
// 64 query rows per block in 4 row groups of 16; WD warps per row group (1: DP <= 256, 4 warps; 2: DP = 512, 8
// warps) split the work of those 16 rows: warp half hw computes S for keys [hw*KW, (hw+1)*KW) of each BN-key tile
// over the whole head dim, and O for output columns [hw*OW, (hw+1)*OW) over all BN keys, so a thread keeps at most
// 16 x 256 fp32 outputs / 32 lanes = 128 accumulators. Per tile:
//   S = Q K^T      mma.sync m16n8k16 (A = Q from shared memory via ldmatrix, B = K rows via ldmatrix);
//   softmax        scale, softcap, mask (per-row [lo, hi) and per-key block-table validity) on the fp32
//                  accumulators; row max over a quad (2 shuffles; WD = 2: plus the partner warp's through shared
//                  memory and a 64-thread named barrier); P = e^(s - m) rounded to bf16/f16, and the row sum
//                  accumulates the ROUNDED values, so O / l is an exact weighted mean with weights off by at
//                  most one rounding each (the bound tests/cuda_ops/test_cuda_attention.c checks);
//   O += P V       A = P straight from the S accumulators (WD = 1) or from shared memory (WD = 2), B = V rows via
//                  ldmatrix.trans.
// K and V tiles come from the paged cache by 16-byte cp.async into padded rows (stride DP + 8 halves: the 8 rows
// an ldmatrix reads fall in distinct banks), one buffer each, FlashAttention-2 order: V(t) loads during S(t),
// K(t+1) during P(t)V(t). A key whose block-table entry is bad, or at/after the last key any row sees, is
// zero-filled (cp.async source size 0: never read) and masked. Tiles start at the first key some row sees and
// jump over gaps no row sees (every warp derives the same tile sequence from the row ranges, so no barrier is
// needed to agree on it); inside a tile, 16-key chunks that no row of a row group sees are skipped by its warps.
// f16 caches: q is rounded to f16 too, so |q| beyond f16's range (65504) overflows, like K/V stored in that cache.

#define ATT_MMA_BN 64 /* keys per tile */

template <int DP, int WD>
struct att_mma_cfg {
    static constexpr int BM = ATT_BM, RG = ATT_BM / 16, BN = ATT_MMA_BN;
    static constexpr int WARPS = RG * WD, THREADS = WARPS * 32;
    static constexpr int KW = BN / WD; /* keys of a tile whose scores one warp computes */
    static constexpr int OW = DP / WD; /* output columns one warp accumulates */
    static constexpr int ST = DP + 8;  /* row stride (halves) of the Q, K and V tiles */
    static constexpr int PST = BN + 8; /* row stride of the P tile (WD > 1) */
    static constexpr size_t smem_bytes =
        ((size_t)(BM + 2 * BN) * ST + (WD > 1 ? (size_t)BM * PST : 0)) * sizeof(uint16_t);
};

/* Barrier of the WD warps of one row group (ids 1..4; __syncthreads owns 0). */
template <int WD>
__device__ __forceinline__ void att_group_bar(int rg)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(rg + 1), "r"(WD * 32) : "memory"); /* orders the shared exchanges */
}

/* First key >= k that some row of the tile sees (INT32_MAX: none). Lane L holds rows L and L + 32's ranges; every
 * warp gets the same answer. */
__device__ __forceinline__ int32_t att_mma_next(int32_t k, int32_t lo0, int32_t hi0, int32_t lo1, int32_t hi1)
{
    int32_t v = INT32_MAX;
    if (lo0 < hi0 && hi0 > k)
        v = lo0 > k ? lo0 : k;
    if (lo1 < hi1 && hi1 > k)
        v = min(v, lo1 > k ? lo1 : k);
    return __reduce_min_sync(0xffffffffu, v);
}

/* Rows of a K or V tile: row r (< BN) is a 16-byte-aligned vector of ncol8 * 8 halves at base + off[r], or zeros
 * when off[r] < 0. Warp w copies rows w, w + WARPS, ...; its lanes take consecutive 16-byte pieces. */
template <int WARPS, int BN, int ST>
__device__ __forceinline__ void att_mma_issue(uint16_t *dst, const char *base, const int64_t *off, int ncol8)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int r = warp; r < BN; r += WARPS) {
        const int64_t o = off[r];
        const char *src = base + (o >= 0 ? o : 0);
        const int bytes = o >= 0 ? 16 : 0;
        for (int c8 = lane; c8 < ncol8; c8 += 32)
            cu_cp16(dst + r * ST + c8 * 8, src + (size_t)c8 * 16, bytes);
    }
}

template <int DP, int WD, bool F16, int MINB>
__global__ void __launch_bounds__(att_mma_cfg<DP, WD>::THREADS, MINB) attn_prefill_mma_kernel(const attn_args a)
{
    using C = att_mma_cfg<DP, WD>;
    constexpr int BM = C::BM, BN = C::BN, RG = C::RG, WARPS = C::WARPS, KW = C::KW, OW = C::OW, ST = C::ST,
                  PST = C::PST;
    constexpr int NKC = KW / 16; /* 16-key chunks of a warp's scores */
    constexpr int NPC = BN / 16; /* 16-key chunks of the P V product */
    constexpr int NO = OW / 8;   /* 8-column output tiles of a warp */
    constexpr float LOG2E = 1.4426950408889634f;
    static_assert(RG == 4 && KW % 16 == 0 && OW % 16 == 0, "tile shape");
    extern __shared__ float4 att_smem4[];
    uint16_t *Qs = (uint16_t *)att_smem4;
    uint16_t *Ks = Qs + BM * ST;
    uint16_t *Vs = Ks + BN * ST;
    uint16_t *Ps = Vs + BN * ST; /* WD > 1 only */
    __shared__ int32_t row_lo[BM], row_hi[BM];
    __shared__ int64_t koff_s[2][BN], voff_s[2][BN];
    __shared__ uint32_t kval_s[2][BN / 32]; /* bit j: key j of the tile exists */
    __shared__ float xch_s[RG][WD][16];     /* row max / row sum exchange between a row group's warps */
    __shared__ int32_t seq_s, tile_s;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int rg = warp / WD, hw = warp % WD;
    const int gq = lane >> 2, cq = lane & 3; /* MMA fragment coordinates: row gq (and gq + 8), column pair cq */
    const int h = (int)(blockIdx.x % (unsigned)a.n_heads), kvh = h / a.n_rep;
    const int32_t bt_idx = (int32_t)(blockIdx.x / (unsigned)a.n_heads);

    /* Sequence and tile: as in attn_prefill_kernel (last tile first). */
    if (tid == 0) {
        int32_t seq, tile;
        cu_attn_tile_of(a.tile_start, a.n_seqs, bt_idx, &seq, &tile);
        seq_s = seq;
        tile_s = tile;
    }
    __syncthreads();
    const int32_t seq = seq_s;
    if (seq < 0)
        return;
    const int64_t r0 = (int64_t)a.seq_q_start[seq] + (int64_t)(tile_s - a.tile_start[seq]) * BM;
    const int64_t qend = a.seq_q_start[seq + 1];
    const int nrows = (int)(qend - r0 < BM ? qend - r0 : BM);
    const int32_t kv_len = cu_attn_kv_len(a, a.seq_kv_len[seq]);
    const int32_t *bt = a.block_table + (int64_t)seq * a.bt_stride;

    if (tid < BM) {
        int32_t lo = 0, hi = 0;
        if (tid < nrows)
            cu_attn_row_range(a.mask, a.window, a.positions[r0 + tid], kv_len, &lo, &hi);
        row_lo[tid] = lo;
        row_hi[tid] = hi;
    }
    __syncthreads();
    /* Every lane: two rows' ranges for the tile walk. Every thread: its own two rows (gq, gq + 8 of its group). */
    const int32_t wlo0 = row_lo[lane], whi0 = row_hi[lane], wlo1 = row_lo[lane + 32], whi1 = row_hi[lane + 32];
    const int rA = rg * 16 + gq, rB = rA + 8;
    const int32_t loA = row_lo[rA], hiA = row_hi[rA], loB = row_lo[rB], hiB = row_hi[rB];
    /* The row group's hull (chunk skipping) and the tile's last seen key + 1 (keys past it are never loaded). */
    int32_t glo = INT32_MAX, ghi = 0;
    if (loA < hiA)
        glo = loA, ghi = hiA;
    if (loB < hiB)
        glo = min(glo, loB), ghi = max(ghi, hiB);
    glo = __reduce_min_sync(0xffffffffu, glo);
    ghi = __reduce_max_sync(0xffffffffu, ghi);
    const int32_t kmax = __reduce_max_sync(0xffffffffu, max(wlo0 < whi0 ? whi0 : 0, wlo1 < whi1 ? whi1 : 0));

    float o[NO][4];
#pragma unroll
    for (int n = 0; n < NO; n++)
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float mA = -INFINITY, mB = -INFINITY, lA = 0.0f, lB = 0.0f; /* this thread's partial row sums */

    /* Key j's K/V offsets for tile buffer b (threads < BN; whole warps, BN % 32 == 0). */
    auto key_offsets = [&](int32_t k0, int b, int32_t entry) {
        const int64_t j = (int64_t)k0 + tid;
        int64_t ko = -1, vo = -1;
        if (j < kmax && entry >= 0 && entry < a.n_blocks) {
            const int64_t slot = j % a.block_size;
            ko = (int64_t)entry * a.block_stride + slot * a.token_stride + (int64_t)kvh * a.head_stride;
            vo = (int64_t)entry * a.block_stride + slot * a.v_token_stride + (int64_t)kvh * a.v_head_stride;
        }
        koff_s[b][tid] = ko;
        voff_s[b][tid] = vo;
        const uint32_t bits = __ballot_sync(0xffffffffu, ko >= 0);
        if (lane == 0)
            kval_s[b][tid >> 5] = bits;
    };
    auto table_entry = [&](int32_t k0) -> int32_t {
        const int64_t j = (int64_t)k0 + tid;
        return j < kmax ? bt[j / a.block_size] : -1;
    };

    int32_t k0 = att_mma_next(0, wlo0, whi0, wlo1, whi1);
    if (k0 != INT32_MAX) {
        if (tid < BN)
            key_offsets(k0, 0, table_entry(k0));
        __syncthreads();
        att_mma_issue<WARPS, BN, ST>(Ks, a.kbase, koff_s[0], a.D / 8);
        cu_cp_commit();
    }
    /* Q tile, rounded to the MMA type (rows past nrows: zeros). Visible after the loop's first barrier. */
    for (int r = warp; r < BM; r += WARPS) {
        const float *qr = r < nrows ? (const float *)(a.q + (r0 + r) * a.q_nb2 + (int64_t)h * a.q_nb1) : nullptr;
        for (int d4 = lane; d4 < a.D / 4; d4 += 32) {
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (qr)
                v = a.q_vec ? ((const float4 *)qr)[d4]
                            : make_float4(qr[4 * d4], qr[4 * d4 + 1], qr[4 * d4 + 2], qr[4 * d4 + 3]);
            *(uint2 *)(Qs + r * ST + d4 * 4) = make_uint2(cu_pack2<F16>(v.x, v.y), cu_pack2<F16>(v.z, v.w));
        }
    }

    const uint16_t *qa = Qs + (rg * 16 + (lane & 15)) * ST + (lane >> 4) * 8;
    const uint16_t *kb = Ks + (hw * KW + (lane & 7) + ((lane >> 4) << 3)) * ST + ((lane >> 3) & 1) * 8;
    const uint16_t *vb = Vs + (lane & 15) * ST + hw * OW + (lane >> 4) * 8;
    const int nks = a.D / 16;
    int buf = 0;
    while (k0 != INT32_MAX) {
        const int32_t k1 = k0 < kmax - BN ? att_mma_next(k0 + BN, wlo0, whi0, wlo1, whi1) : INT32_MAX;
        const int32_t entry1 = k1 != INT32_MAX && tid < BN ? table_entry(k1) : -1; /* used after S: latency hidden */
        cu_cp_wait<0>();
        __syncthreads(); /* K(k0) and Q visible; every warp is done with V, P and the offsets of the last tile */
        att_mma_issue<WARPS, BN, ST>(Vs, a.vbase, voff_s[buf], a.DV / 8);
        cu_cp_commit();

        /* S = Q K^T over this warp's keys, skipping 16-key chunks its row group does not see. */
        bool act[NKC];
        bool any = false;
#pragma unroll
        for (int kc = 0; kc < NKC; kc++) {
            const int32_t c0 = k0 + hw * KW + kc * 16;
            act[kc] = c0 < ghi && c0 + 16 > glo;
            any |= act[kc];
        }
        float s[2 * NKC][4];
#pragma unroll
        for (int n = 0; n < 2 * NKC; n++)
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
        if (any) {
#pragma unroll 2
            for (int ks = 0; ks < nks; ks++) {
                uint32_t af[4];
                cu_ldsm4(af, qa + ks * 16);
#pragma unroll
                for (int kc = 0; kc < NKC; kc++) {
                    if (!act[kc])
                        continue;
                    uint32_t bf[4];
                    cu_ldsm4(bf, kb + kc * 16 * ST + ks * 16);
                    cu_mma16816<F16>(s[2 * kc], af, bf[0], bf[1]);
                    cu_mma16816<F16>(s[2 * kc + 1], af, bf[2], bf[3]);
                }
            }
        }

        /* Scale, softcap, mask; online softmax on rows A = gq and B = gq + 8 of the row group. Most tiles lie
         * inside both rows' ranges with every key present: those skip the per-key tests. */
        const uint64_t kval = (uint64_t)kval_s[buf][0] | (BN > 32 ? (uint64_t)kval_s[buf][BN / 32 - 1] << 32 : 0);
        const uint64_t wmask = KW >= 64 ? ~0ull : ((1ull << (KW & 63)) - 1) << (hw * KW);
        const int32_t kw0 = k0 + hw * KW;
        const bool inside = (kval & wmask) == wmask && kw0 >= loA && (int64_t)kw0 + KW <= hiA && kw0 >= loB &&
                            (int64_t)kw0 + KW <= hiB;
        float mxA = -INFINITY, mxB = -INFINITY;
        if (inside) {
#pragma unroll
            for (int n = 0; n < 2 * NKC; n++) {
#pragma unroll
                for (int e = 0; e < 4; e++)
                    s[n][e] = cu_attn_score(a, s[n][e]);
                mxA = fmaxf(mxA, fmaxf(s[n][0], s[n][1]));
                mxB = fmaxf(mxB, fmaxf(s[n][2], s[n][3]));
            }
        } else {
#pragma unroll
            for (int n = 0; n < 2 * NKC; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int kt = hw * KW + n * 8 + 2 * cq + (e & 1); /* key within the tile */
                    const int32_t j = k0 + kt;
                    const bool vis = (kval >> kt & 1u) && (e < 2 ? j >= loA && j < hiA : j >= loB && j < hiB);
                    s[n][e] = vis ? cu_attn_score(a, s[n][e]) : -INFINITY;
                    if (e < 2)
                        mxA = fmaxf(mxA, s[n][e]);
                    else
                        mxB = fmaxf(mxB, s[n][e]);
                }
        }
#pragma unroll
        for (int off = 1; off <= 2; off <<= 1) {
            mxA = fmaxf(mxA, __shfl_xor_sync(0xffffffffu, mxA, off));
            mxB = fmaxf(mxB, __shfl_xor_sync(0xffffffffu, mxB, off));
        }
        if constexpr (WD > 1) {
            if (cq == 0) {
                xch_s[rg][hw][gq] = mxA;
                xch_s[rg][hw][gq + 8] = mxB;
            }
            att_group_bar<WD>(rg);
#pragma unroll
            for (int w = 0; w < WD; w++) {
                mxA = fmaxf(mxA, xch_s[rg][w][gq]);
                mxB = fmaxf(mxB, xch_s[rg][w][gq + 8]);
            }
        }
        const float nmA = fmaxf(mA, mxA), nmB = fmaxf(mB, mxB);
        /* A row that has seen nothing yet keeps m = -inf, P = 0 and alpha = 1. */
        const float alA = nmA == -INFINITY ? 1.0f : exp2f((mA - nmA) * LOG2E);
        const float alB = nmB == -INFINITY ? 1.0f : exp2f((mB - nmB) * LOG2E);
        mA = nmA;
        mB = nmB;
        uint32_t pk[2 * NKC][2]; /* P rounded, packed: [8-key tile][row A, row B] */
        float sumA = 0.0f, sumB = 0.0f;
#pragma unroll
        for (int n = 0; n < 2 * NKC; n++) {
            const float p0 = nmA == -INFINITY ? 0.0f : exp2f((s[n][0] - nmA) * LOG2E);
            const float p1 = nmA == -INFINITY ? 0.0f : exp2f((s[n][1] - nmA) * LOG2E);
            const float p2 = nmB == -INFINITY ? 0.0f : exp2f((s[n][2] - nmB) * LOG2E);
            const float p3 = nmB == -INFINITY ? 0.0f : exp2f((s[n][3] - nmB) * LOG2E);
            pk[n][0] = cu_pack2<F16>(p0, p1);
            pk[n][1] = cu_pack2<F16>(p2, p3);
            sumA += cu_unpack2_sum<F16>(pk[n][0]);
            sumB += cu_unpack2_sum<F16>(pk[n][1]);
        }
        lA = lA * alA + sumA;
        lB = lB * alB + sumB;
        if (!__all_sync(0xffffffffu, alA == 1.0f && alB == 1.0f)) { /* some row's max moved */
#pragma unroll
            for (int n = 0; n < NO; n++) {
                o[n][0] *= alA;
                o[n][1] *= alA;
                o[n][2] *= alB;
                o[n][3] *= alB;
            }
        }
        if constexpr (WD > 1) {
#pragma unroll
            for (int n = 0; n < 2 * NKC; n++) {
                const int kt = hw * KW + n * 8 + 2 * cq;
                *(uint32_t *)(Ps + rA * PST + kt) = pk[n][0];
                *(uint32_t *)(Ps + rB * PST + kt) = pk[n][1];
            }
        }
        if (k1 != INT32_MAX && tid < BN)
            key_offsets(k1, buf ^ 1, entry1);
        __syncthreads(); /* every warp is done with K; P (WD > 1) and the next offsets are visible */
        if (k1 != INT32_MAX) {
            att_mma_issue<WARPS, BN, ST>(Ks, a.kbase, koff_s[buf ^ 1], a.D / 8);
            cu_cp_commit();
            cu_cp_wait<1>();
        } else {
            cu_cp_wait<0>();
        }
        __syncthreads(); /* V(k0) visible */

        /* O += P V over the 16-key chunks the row group sees, this warp's output columns below DV. */
#pragma unroll
        for (int kc = 0; kc < NPC; kc++) {
            const int32_t c0 = k0 + kc * 16;
            if (!(c0 < ghi && c0 + 16 > glo))
                continue;
            uint32_t af[4];
            if constexpr (WD == 1) {
                af[0] = pk[2 * kc][0];
                af[1] = pk[2 * kc][1];
                af[2] = pk[2 * kc + 1][0];
                af[3] = pk[2 * kc + 1][1];
            } else {
                cu_ldsm4(af, Ps + (rg * 16 + (lane & 15)) * PST + kc * 16 + (lane >> 4) * 8);
            }
#pragma unroll
            for (int nd = 0; nd < NO / 2; nd++) {
                if (hw * OW + nd * 16 >= a.DV)
                    break;
                uint32_t bf[4];
                cu_ldsm4_t(bf, vb + kc * 16 * ST + nd * 16);
                cu_mma16816<F16>(o[2 * nd], af, bf[0], bf[1]);
                cu_mma16816<F16>(o[2 * nd + 1], af, bf[2], bf[3]);
            }
        }
        k0 = k1;
        buf ^= 1;
    }

    /* Row sums: over the quad, then over the row group's warps. */
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
        lA += __shfl_xor_sync(0xffffffffu, lA, off);
        lB += __shfl_xor_sync(0xffffffffu, lB, off);
    }
    if constexpr (WD > 1) {
        /* xch_s is free: every warp read the last tile's row maxima before that tile's second block barrier */
        if (cq == 0) {
            xch_s[rg][hw][gq] = lA;
            xch_s[rg][hw][gq + 8] = lB;
        }
        att_group_bar<WD>(rg);
        lA = lB = 0.0f;
#pragma unroll
        for (int w = 0; w < WD; w++) {
            lA += xch_s[rg][w][gq];
            lB += xch_s[rg][w][gq + 8];
        }
    }
#pragma unroll
    for (int n = 0; n < NO; n++) {
        const int d = hw * OW + n * 8 + 2 * cq;
        if (d >= a.DV)
            break;
        if (rA < nrows) {
            att_store_out(a, r0 + rA, h, d, o[n][0], lA);
            att_store_out(a, r0 + rA, h, d + 1, o[n][1], lA);
        }
        if (rB < nrows) {
            att_store_out(a, r0 + rB, h, d, o[n][2], lB);
            att_store_out(a, r0 + rB, h, d + 1, o[n][3], lB);
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Decode: flash-decoding.
//
// Block (sequence, KV head g, split) of 4 warps; NR = n_rep rounded up to a power of two (<= 16). Lanes split the
// head dim: lane L of a warp owns E consecutive dims (E = 8 when NR <= 8, else 4, so that q and the output
// accumulators of all NR heads stay in registers: 2 * NR * E <= 128 floats). A team of WT warps covers the head
// dim (WT = ceil(max(D, DV) / (32 E))); the block's 4 / WT teams take batches of KB keys of the split in turn and
// keep their own online softmax, merged once at the end through shared memory. Per batch, a team:
//   - has the batch's K and V slices already in shared memory: each lane copies exactly the bytes it will read
//     (cp.async, ATT_DEC_STAGES batches deep: the next two in flight while this one is used), so no barrier
//     guards the copies;
//   - dots its K slices with q for all NR heads (fp32 FMA in registers) and sums the partials over the warp with a
//     reduce-scatter, which leaves head r's score in the lanes L >> (5 - log2 NR) == r (teams of 2-4 warps add
//     their warps' partials through shared memory behind a named barrier of the team);
//   - runs the online softmax of its head in each lane (no shuffles), publishes p and the rescale factors in
//     shared memory (__syncwarp) and accumulates O += p V on its V slices for all heads.
// The loop has no block-wide barrier; the block-table entries of batch i + 3 are read while batch i is used.
// With one split the block writes the output directly; otherwise it writes a partial (max, sum, unnormalised O)
// per head and attn_combine_kernel merges the splits. Both kernels are launched by cu_launch (PDL: trigger, then
// wait before touching memory, as cuda_launch.cuh requires).

#define ATT_DEC_WARPS (ATT_DEC_THREADS / 32)
#define ATT_DEC_STAGES 3     /* K/V batches per warp in shared memory: one used, two in flight */
#define ATT_DEC_MIN_BLOCKS 2 /* q and O of 8 heads x 8 dims per lane need ~210 registers: 2 blocks per SM */

template <int NR>
struct att_log2 {
    static constexpr int v = NR >= 16 ? 4 : NR >= 8 ? 3 : NR >= 4 ? 2 : NR >= 2 ? 1 : 0;
};

template <int DT, int NR>
struct att_dec_cfg {
    static constexpr int ESZ = DT == BERTH_DTYPE_F32 ? 4 : 2;
    static constexpr int E = NR <= 8 ? 8 : 4; /* head-dim elements per lane */
    static constexpr int CB = E * ESZ;        /* bytes of a lane's slice of one K or V vector: 8, 16 or 32 */
    static constexpr int PB = CB < 16 ? CB : 16; /* bytes per copy and per shared load */
    static constexpr int NP = CB / PB;           /* copies per slice */
    static constexpr int PE = PB / ESZ;          /* elements per copy */
    static constexpr int KB = ESZ == 4 ? 2 : 4;  /* keys per batch */
    static constexpr int S = ATT_DEC_STAGES;
    static constexpr int LG = att_log2<NR>::v;
    static constexpr int RL = 32 >> LG; /* lanes that hold one head's score after the reduce-scatter */
    static constexpr int WARP_RING = S * KB * 2 * 32 * CB;           /* bytes per warp */
    static constexpr int RING = ATT_DEC_WARPS * WARP_RING;           /* bytes */
    static constexpr int MERGE = ATT_DEC_THREADS * E * NR * 4;       /* bytes: every lane's accumulators */
    static constexpr int SMEM = RING > MERGE ? RING : MERGE; /* dynamic shared memory of the kernel */
    /* byte offset of a lane's slice (stage st, key kb, 0 = K / 1 = V) inside its warp's ring; copy c of the slice
     * is at + c * 32 * PB, so consecutive lanes read consecutive PB-byte words (no bank conflicts) */
    static __device__ __forceinline__ int slice(int st, int kb, int kv, int lane)
    {
        return ((st * KB + kb) * 2 + kv) * NP * 32 * PB + lane * PB;
    }
};

/* Barrier of the WT warps of team `team` (ids 1 and 2, immediates: 0 is __syncthreads; at most 2 teams of 2+). */
template <int WT>
__device__ __forceinline__ void att_dec_team_bar(int team)
{
    if (team == 0)
        asm volatile("bar.sync 1, %0;\n" ::"n"(WT * 32) : "memory");
    else
        asm volatile("bar.sync 2, %0;\n" ::"n"(WT * 32) : "memory");
}

/* A lane's slice of one K/V vector, element by element (rows not 16-byte aligned, or the slice that straddles the
 * end of the vector): elements at or past nvalid are stored as zeros and never read. Same layout as the copies. */
template <int DT, int NR>
__device__ __forceinline__ void att_dec_copy_elems(unsigned char *dst, const char *src, int nvalid)
{
    using C = att_dec_cfg<DT, NR>;
#pragma unroll
    for (int e = 0; e < C::E; e++) {
        unsigned char *d = dst + (e / C::PE) * 32 * C::PB + (e % C::PE) * C::ESZ;
        if constexpr (C::ESZ == 2)
            *(uint16_t *)d = e < nvalid ? ((const uint16_t *)src)[e] : (uint16_t)0;
        else
            *(uint32_t *)d = e < nvalid ? ((const uint32_t *)src)[e] : 0u;
    }
}

/* A lane's slice (E elements) from shared memory, widened to fp32. */
template <int DT, int NR>
__device__ __forceinline__ void att_dec_widen(const unsigned char *src, float f[])
{
    using C = att_dec_cfg<DT, NR>;
    if constexpr (C::PB == 16) {
#pragma unroll
        for (int c = 0; c < C::NP; c++) {
            const uint4 u = *(const uint4 *)(src + c * 32 * 16);
            if constexpr (C::ESZ == 4) {
                f[c * 4 + 0] = __uint_as_float(u.x);
                f[c * 4 + 1] = __uint_as_float(u.y);
                f[c * 4 + 2] = __uint_as_float(u.z);
                f[c * 4 + 3] = __uint_as_float(u.w);
            } else {
                cu_dec_widen2<DT>(u.x, f + c * 8 + 0);
                cu_dec_widen2<DT>(u.y, f + c * 8 + 2);
                cu_dec_widen2<DT>(u.z, f + c * 8 + 4);
                cu_dec_widen2<DT>(u.w, f + c * 8 + 6);
            }
        }
    } else { /* 8 bytes: four 16-bit elements */
        const uint2 u = *(const uint2 *)src;
        cu_dec_widen2<DT>(u.x, f + 0);
        cu_dec_widen2<DT>(u.y, f + 2);
    }
}

template <int DT, int NR, int WT>
__global__ void __launch_bounds__(ATT_DEC_THREADS, ATT_DEC_MIN_BLOCKS) attn_decode_kernel(const attn_args a)
{
    using C = att_dec_cfg<DT, NR>;
    constexpr int E = C::E, KB = C::KB, S = C::S, LG = C::LG, RL = C::RL, NP = C::NP, PB = C::PB;
    constexpr int NT = ATT_DEC_WARPS / WT; /* teams */
    constexpr int TW = 32 * E * WT;        /* head-dim columns a team covers */
    static_assert(WT == 1 || NT <= 2, "att_dec_team_bar has two barrier ids");
    extern __shared__ __align__(16) unsigned char att_dec_smem[]; /* C::SMEM: K/V rings; at the end, the merge */
    __shared__ __align__(16) float pw_s[ATT_DEC_WARPS][KB][NR]; /* p of the batch, per warp */
    __shared__ __align__(16) float alw_s[ATT_DEC_WARPS][NR];    /* rescale factors of the batch, per warp */
    __shared__ float sx_s[WT > 1 ? 2 : 1][ATT_DEC_WARPS][KB][NR]; /* teams: partial scores per warp */
    __shared__ float tm_s[NT][NR], tl_s[NT][NR], tw_s[NT][NR], tl_all_s[NR];

    /* Launched by cu_launch (cuda_launch.cuh): let the next kernel be scheduled, then wait for the previous one
     * (everything this kernel reads, metadata included, may come from earlier work of the stream). */
    cu_pdl_trigger();
    cu_pdl_wait();

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, team = warp / WT, wi = warp % WT;
    const int seq = blockIdx.x, g = blockIdx.y, split = blockIdx.z;
    /* Independent loads first: with one row per sequence (the usual decode batch) row seq is the row. */
    const int32_t q0 = a.seq_q_start[seq], q1 = a.seq_q_start[seq + 1];
    const int32_t kv_len = cu_attn_kv_len(a, a.seq_kv_len[seq]);
    const int32_t pos_seq = a.positions[seq]; /* seq < n_seqs == T */
    if (q0 < 0 || q1 < q0 || q1 > a.T)
        return;
    const int32_t *bt = a.block_table + (int64_t)seq * a.bt_stride;
    const int n_rep = a.n_rep, H = a.n_heads, ns = a.ns, D = a.D, DV = a.DV;
    const int r_own = lane >> (5 - LG);      /* the head whose score this lane holds */
    const bool owner = (lane & (RL - 1)) == 0; /* one lane per head writes it */
    const int dim0 = (wi * 32 + lane) * E;   /* this lane's dims of K, q, V and the output */
    const bool k_on = dim0 < D, v_on = dim0 < DV;
    const bool k_full = a.vec && dim0 + E <= D, v_full = a.vec && dim0 + E <= DV;
    const int64_t kdim = (int64_t)g * a.head_stride + (int64_t)dim0 * C::ESZ;
    const int64_t vdim = (int64_t)g * a.v_head_stride + (int64_t)dim0 * C::ESZ;
    unsigned char *ring = att_dec_smem + warp * C::WARP_RING;
    const uint32_t ring_s = (uint32_t)__cvta_generic_to_shared(ring);
    float *mo = (float *)att_dec_smem; /* merge: [NT][NR][TW] */

    for (int32_t t = q0; t < q1; t++) {
        const int32_t pos = t == seq ? pos_seq : a.positions[t];
        int32_t lo, hi;
        cu_attn_row_range(a.mask, a.window, pos, kv_len, &lo, &hi);
        /* This split's share of [lo, hi): chunks of at least ATT_DEC_MIN_CHUNK keys, a multiple of it. */
        const int32_t len = hi - lo; /* 32-bit division: no 64-bit division routine in the kernel */
        int64_t chunk = (int64_t)((uint32_t)len / (uint32_t)ns) + ((uint32_t)len % (uint32_t)ns != 0u);
        chunk = (chunk + ATT_DEC_MIN_CHUNK - 1) / ATT_DEC_MIN_CHUNK * ATT_DEC_MIN_CHUNK;
        chunk = chunk > 0 ? chunk : ATT_DEC_MIN_CHUNK;
        const int64_t kb64 = (int64_t)lo + (int64_t)split * chunk;
        const int32_t k_begin = kb64 < hi ? (int32_t)kb64 : hi;
        const int32_t k_end = (int64_t)k_begin + chunk < hi ? (int32_t)(k_begin + chunk) : hi;
        const int64_t ml_base = ((int64_t)t * H + (int64_t)g * n_rep) * ns + split; /* head r: + r * ns */

        if (t > q0)
            __syncthreads(); /* the previous row's merge is done with the shared arrays */
        if (k_begin >= k_end) {
            if (a.direct) {
                for (int it = tid; it < n_rep * DV; it += ATT_DEC_THREADS)
                    att_store_out(a, t, g * n_rep + it / DV, it % DV, 0.0f, 0.0f);
            } else if (tid < n_rep) {
                a.part_ml[(ml_base + (int64_t)tid * ns) * 2] = -INFINITY;
                a.part_ml[(ml_base + (int64_t)tid * ns) * 2 + 1] = 0.0f;
            }
            continue;
        }

        /* Batches of KB keys from k_begin; this team takes batches team, team + NT, ... */
        const int32_t nb = (k_end - k_begin + KB - 1) / KB;
        const int32_t nbt = nb > team ? (nb - team + NT - 1) / NT : 0;

        /* The next batch to copy: block numbers (read one batch ahead), slots in the block, keys present. */
        int32_t nx_blk[KB], nx_slot[KB];
#pragma unroll
        for (int kb = 0; kb < KB; kb++)
            nx_blk[kb] = -1, nx_slot[kb] = 0;
        uint32_t nx_mask = 0;
        auto fetch = [&](int32_t i) { /* block-table entries of this team's batch i */
            nx_mask = 0;
            if (i < nbt) {
                const int32_t j0 = k_begin + (team + i * NT) * KB; /* < k_end */
                int32_t blk = j0 / a.block_size, sl = j0 - blk * a.block_size;
#pragma unroll
                for (int kb = 0; kb < KB; kb++) {
                    if (kb > 0 && ++sl == a.block_size) {
                        sl = 0;
                        blk++;
                    }
                    nx_slot[kb] = sl;
                    nx_blk[kb] = -1;
                    if (j0 + kb < k_end) { /* then blk < bt_width: inside the table row */
                        nx_blk[kb] = bt[blk];
                        nx_mask |= 1u << kb;
                    }
                }
            }
        };
        uint32_t vmask = 0; /* bit st * KB + kb: key kb of the batch in stage st is present */
        auto issue = [&](int st) { /* copy the fetched batch into stage st (one copy group, maybe empty) */
#pragma unroll
            for (int kb = 0; kb < KB; kb++) {
                const int32_t b = nx_blk[kb];
                const bool present = (nx_mask >> kb & 1u) && b >= 0 && b < a.n_blocks;
                const uint32_t bit = 1u << (st * KB + kb);
                vmask = present ? vmask | bit : vmask & ~bit;
                if (!present)
                    continue; /* never dereferenced: its score is -inf and its V is skipped */
                const int64_t boff = (int64_t)b * a.block_stride;
                const char *kp = a.kbase + boff + (int64_t)nx_slot[kb] * a.token_stride + kdim;
                const char *vp = a.vbase + boff + (int64_t)nx_slot[kb] * a.v_token_stride + vdim;
                const int ko = C::slice(st, kb, 0, lane), vo = C::slice(st, kb, 1, lane);
                if (k_full) {
#pragma unroll
                    for (int c = 0; c < NP; c++)
                        cu_dec_cp<PB>(ring_s + ko + c * 32 * PB, kp + c * PB);
                } else if (k_on) {
                    att_dec_copy_elems<DT, NR>(ring + ko, kp, D - dim0);
                }
                if (v_full) {
#pragma unroll
                    for (int c = 0; c < NP; c++)
                        cu_dec_cp<PB>(ring_s + vo + c * 32 * PB, vp + c * PB);
                } else if (v_on) {
                    att_dec_copy_elems<DT, NR>(ring + vo, vp, DV - dim0);
                }
            }
            cu_dec_cp_commit();
        };

        fetch(0);
        /* q of the NR heads on this lane's dims (zeros past n_rep and past D), fp32 in registers */
        float q[NR][E];
#pragma unroll
        for (int r = 0; r < NR; r++) {
#pragma unroll
            for (int e = 0; e < E; e++)
                q[r][e] = 0.0f;
            if (r < n_rep && k_on) {
                const char *qr = a.q + (int64_t)t * a.q_nb2 + (int64_t)(g * n_rep + r) * a.q_nb1;
                if (a.q_vec && dim0 + E <= D) {
#pragma unroll
                    for (int e = 0; e < E; e += 4) {
                        const float4 x = *(const float4 *)(qr + (size_t)(dim0 + e) * 4);
                        q[r][e] = x.x, q[r][e + 1] = x.y, q[r][e + 2] = x.z, q[r][e + 3] = x.w;
                    }
                } else {
#pragma unroll
                    for (int e = 0; e < E; e++)
                        if (dim0 + e < D)
                            q[r][e] = cu_ld(qr, a.q_dt, dim0 + e);
                }
            }
        }
#pragma unroll
        for (int i = 0; i < S - 1; i++) {
            issue(i);
            fetch(i + 1);
        }

        float m = -INFINITY, l = 0.0f; /* online softmax of head r_own */
        float acc[NR][E];
#pragma unroll
        for (int r = 0; r < NR; r++)
#pragma unroll
            for (int e = 0; e < E; e++)
                acc[r][e] = 0.0f;
        int par = 0;

        for (int32_t i = 0; i < nbt; i++) {
            const int st = i % S;
            issue((i + S - 1) % S); /* batch i + S - 1 into the stage used by batch i - 1 */
            fetch(i + S);
            cu_dec_cp_wait<S - 1>(); /* batch i has landed (this lane's copies: the only ones it reads) */
            const uint32_t vb = vmask >> (st * KB);

            /* scores: this lane's dims of each key dotted with q of all heads, summed over the warp */
            float s[KB];
#pragma unroll
            for (int kb = 0; kb < KB; kb++) {
                float dot[NR];
#pragma unroll
                for (int r = 0; r < NR; r++)
                    dot[r] = 0.0f;
                if (k_on) {
                    float kf[E];
                    att_dec_widen<DT, NR>(ring + C::slice(st, kb, 0, lane), kf);
#pragma unroll
                    for (int e = 0; e < E; e++)
#pragma unroll
                        for (int r = 0; r < NR; r++)
                            dot[r] = fmaf(q[r][e], kf[e], dot[r]);
                }
                cu_dec_reduce_scatter<NR>(dot, lane);
                s[kb] = dot[0];
            }
            if constexpr (WT > 1) { /* add the team's warps' partials, in the same order in every warp */
                if (owner)
#pragma unroll
                    for (int kb = 0; kb < KB; kb++)
                        sx_s[par][warp][kb][r_own] = s[kb];
                att_dec_team_bar<WT>(team);
#pragma unroll
                for (int kb = 0; kb < KB; kb++) {
                    float v = 0.0f;
#pragma unroll
                    for (int w = 0; w < WT; w++)
                        v += sx_s[par][team * WT + w][kb][r_own];
                    s[kb] = v;
                }
                par ^= 1; /* the other buffer next: a warp passes the next barrier only after all have read */
            }

            /* online softmax of head r_own over the batch */
            float mx = -INFINITY;
#pragma unroll
            for (int kb = 0; kb < KB; kb++) {
                s[kb] = (vb >> kb & 1u) && r_own < n_rep ? cu_attn_score(a, s[kb]) : -INFINITY;
                mx = fmaxf(mx, s[kb]);
            }
            const float m_new = fmaxf(m, mx);
            float alpha = 1.0f, psum = 0.0f;
#pragma unroll
            for (int kb = 0; kb < KB; kb++) {
                s[kb] = m_new == -INFINITY ? 0.0f : expf(s[kb] - m_new);
                psum += s[kb];
            }
            if (m_new != -INFINITY)
                alpha = expf(m - m_new);
            l = l * alpha + psum;
            m = m_new;
            if (owner) {
#pragma unroll
                for (int kb = 0; kb < KB; kb++)
                    pw_s[warp][kb][r_own] = s[kb];
                alw_s[warp][r_own] = alpha;
            }
            __syncwarp();

            /* O = alpha O + sum_k p_k V_k on this lane's dims, all heads */
            if (v_on) {
                float al[NR];
                cu_dec_ld_heads<NR>(alw_s[warp], al);
                bool rescale = false;
#pragma unroll
                for (int r = 0; r < NR; r++)
                    rescale |= al[r] != 1.0f;
                if (rescale) /* the same in every lane: the running max moved for some head */
#pragma unroll
                    for (int r = 0; r < NR; r++)
#pragma unroll
                        for (int e = 0; e < E; e++)
                            acc[r][e] *= al[r];
#pragma unroll
                for (int kb = 0; kb < KB; kb++) {
                    if (!(vb >> kb & 1u))
                        continue; /* absent key: p is 0 and its slice was not copied */
                    float p[NR], vf[E];
                    cu_dec_ld_heads<NR>(pw_s[warp][kb], p);
                    att_dec_widen<DT, NR>(ring + C::slice(st, kb, 1, lane), vf);
#pragma unroll
                    for (int r = 0; r < NR; r++)
#pragma unroll
                        for (int e = 0; e < E; e++)
                            acc[r][e] = fmaf(p[r], vf[e], acc[r][e]);
                }
            }
            __syncwarp(); /* pw_s / alw_s are rewritten by the next batch */
        }

        /* Merge the teams: M = max m_t, weights e^(m_t - M), L = sum w_t l_t, O = sum w_t O_t. */
        cu_dec_cp_wait<0>();
        __syncthreads(); /* every warp is done with its ring: the merge buffer overlays them */
        if (wi == 0 && owner) {
            tm_s[team][r_own] = m;
            tl_s[team][r_own] = l;
        }
#pragma unroll
        for (int r = 0; r < NR; r++)
#pragma unroll
            for (int e = 0; e < E; e += 4)
                *(float4 *)(mo + (team * NR + r) * TW + dim0 + e) =
                    make_float4(acc[r][e], acc[r][e + 1], acc[r][e + 2], acc[r][e + 3]);
        __syncthreads();
        if (tid < NR) {
            float M = -INFINITY;
#pragma unroll
            for (int tm = 0; tm < NT; tm++)
                M = fmaxf(M, tm_s[tm][tid]);
            float L = 0.0f;
#pragma unroll
            for (int tm = 0; tm < NT; tm++) {
                const float w = tm_s[tm][tid] == -INFINITY ? 0.0f : expf(tm_s[tm][tid] - M);
                tw_s[tm][tid] = w;
                L = fmaf(w, tl_s[tm][tid], L);
            }
            tl_all_s[tid] = L;
            if (!a.direct && tid < n_rep) {
                a.part_ml[(ml_base + (int64_t)tid * ns) * 2] = M;
                a.part_ml[(ml_base + (int64_t)tid * ns) * 2 + 1] = L;
            }
        }
        __syncthreads();
        for (int it = tid; it < n_rep * DV; it += ATT_DEC_THREADS) {
            const int r = it / DV, d = it - r * DV;
            float o = 0.0f;
#pragma unroll
            for (int tm = 0; tm < NT; tm++)
                o = fmaf(tw_s[tm][r], mo[(tm * NR + r) * TW + d], o);
            if (a.direct)
                att_store_out(a, t, g * n_rep + r, d, o, tl_all_s[r]);
            else
                a.part_o[(((int64_t)t * H + g * n_rep + r) * ns + split) * DV + d] = o;
        }
    }
}

/* Merge the ns split partials of each (row, head): weights e^(m_s - M), out = sum w_s O_s / sum w_s l_s. Splits
 * that saw no key (l == 0) get weight 0 and their O (never written) is not used. Block per (row, head, 64 output
 * columns): warp 0 computes the weights, then 16 column groups of 4 x 8 subsets of the splits accumulate, and a
 * shared-memory sum finishes. */
#define ATT_CMB_COLS 64
#define ATT_CMB_SUBS (ATT_CMB_THREADS / (ATT_CMB_COLS / 4))

__global__ void __launch_bounds__(ATT_CMB_THREADS) attn_combine_kernel(const attn_args a)
{
    constexpr int CG = ATT_CMB_COLS / 4;
    __shared__ float w_s[ATT_DEC_MAX_SPLITS];
    __shared__ float L_s;
    __shared__ float4 red_s[ATT_CMB_SUBS - 1][CG];
    cu_pdl_trigger();
    cu_pdl_wait(); /* the decode kernel's partials */
    const int tid = threadIdx.x, lane = tid & 31;
    const int64_t th = blockIdx.x; /* t * H + h (< 2^31: the checks bound T * H) */
    const int64_t t = blockIdx.x / (unsigned)a.n_heads;
    const int h = (int)(blockIdx.x % (unsigned)a.n_heads);
    const int ns = a.ns, DV = a.DV;
    if (tid < 32) {
        const float *ml = a.part_ml + th * ns * 2;
        float M = -INFINITY;
        for (int s = lane; s < ns; s += 32)
            if (ml[2 * s + 1] > 0.0f)
                M = fmaxf(M, ml[2 * s]);
        M = cu_warp_max(M);
        float L = 0.0f;
        for (int s = lane; s < ns; s += 32) {
            const float ls = ml[2 * s + 1];
            const float w = ls > 0.0f ? expf(ml[2 * s] - M) : 0.0f;
            w_s[s] = w;
            L = fmaf(w, ls, L);
        }
        L = cu_warp_sum(L);
        if (lane == 0)
            L_s = L;
    }
    __syncthreads();
    const int cg = tid % CG, sub = tid / CG;
    const int d0 = (int)blockIdx.y * ATT_CMB_COLS + cg * 4;
    const float *po = a.part_o + th * ns * DV + d0;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (d0 + 4 <= DV && (DV & 3) == 0) { /* rows of part_o are 16-byte aligned */
#pragma unroll 4
        for (int s = sub; s < ns; s += ATT_CMB_SUBS) {
            const float w = w_s[s];
            const float4 o = *(const float4 *)(po + (int64_t)s * DV); /* inside the workspace even if unwritten */
            if (w > 0.0f) {
                acc[0] = fmaf(w, o.x, acc[0]);
                acc[1] = fmaf(w, o.y, acc[1]);
                acc[2] = fmaf(w, o.z, acc[2]);
                acc[3] = fmaf(w, o.w, acc[3]);
            }
        }
    } else if (d0 < DV) {
        for (int s = sub; s < ns; s += ATT_CMB_SUBS) {
            const float w = w_s[s];
            if (w > 0.0f)
                for (int e = 0; e < 4 && d0 + e < DV; e++)
                    acc[e] = fmaf(w, po[(int64_t)s * DV + e], acc[e]);
        }
    }
    if (sub > 0)
        red_s[sub - 1][cg] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    __syncthreads();
    if (sub == 0 && d0 < DV) {
#pragma unroll
        for (int k = 0; k < ATT_CMB_SUBS - 1; k++) {
            const float4 o = red_s[k][cg];
            acc[0] += o.x, acc[1] += o.y, acc[2] += o.z, acc[3] += o.w;
        }
        const float L = L_s;
        for (int e = 0; e < 4 && d0 + e < DV; e++)
            att_store_out(a, t, h, d0 + e, acc[e], L);
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

/* Split count of the decode path for an upper bound kv_bound of keys per sequence (window: the mask's window, 0 for
 * none). Enough blocks to fill one wave of the GPU (wave = resident blocks of the decode kernel per SM x SMs), but
 * never past one wave (a second, partial wave would cost a whole block time), never below ATT_DEC_MIN_CHUNK keys
 * per split, and none for short ranges (one block is quicker than splits plus the combine kernel). Monotone in
 * kv_bound, so that a workspace sized for the capture bound covers every smaller bound. */
static int att_dec_splits(const berth_backend *be, int64_t kv_bound, int32_t window, int32_t n_seqs,
                          int32_t n_kv_heads, int64_t T, int64_t H, int32_t DV, int blocks_per_sm)
{
    const int64_t kv = window > 0 && window < kv_bound ? window : kv_bound; /* keys one row can see */
    if (kv <= ATT_DEC_DIRECT_KEYS)
        return 1;
    const int64_t base = (int64_t)n_seqs * n_kv_heads;
    const int64_t wave = (int64_t)(be->n_sms > 0 ? be->n_sms : 132) * (blocks_per_sm > 0 ? blocks_per_sm : 1);
    int64_t ns = base > 0 && base < wave ? wave / base : 1;
    /* be->att_split_keys (BERTH_CUDA_ATT_SPLIT_KEYS, read at init; a multiple of ATT_DEC_MIN_CHUNK): the fewest
     * keys per split, for tuning runs (fewer, longer splits: less partial traffic and combine work, a longer key
     * loop per block). Default 16. */
    const int64_t min_keys = be->att_split_keys >= ATT_DEC_MIN_CHUNK ? be->att_split_keys : ATT_DEC_MIN_CHUNK;
    const int64_t by_len = (kv + min_keys - 1) / min_keys;
    ns = ns < by_len ? ns : by_len;
    ns = ns < ATT_DEC_MAX_SPLITS ? ns : ATT_DEC_MAX_SPLITS;
    const int64_t per_split = T * H * ((int64_t)DV + 2) * (int64_t)sizeof(float);
    const int64_t by_ws = per_split > 0 ? (int64_t)ATT_DEC_PART_BYTES / per_split : ns;
    ns = ns < by_ws ? ns : by_ws;
    return ns < 1 ? 1 : (int)ns;
}

/* What a decode kernel instance needs on the host, found once per device: cudaFuncSetAttribute and the occupancy
 * query cost microseconds of host time, which every call paid (eager steps run ~35 attention calls each).
 * word[dev] = 0 not set up yet, else resident blocks per SM. Atomics: backends of two devices may set up the same
 * instance from two threads (both store the same value). */
#define ATT_DEC_CACHE_DEVICES 16
struct att_dec_cache {
    int word[ATT_DEC_CACHE_DEVICES];
};

/* A decode kernel instance, its dynamic shared memory and its set-up cache. */
struct att_dec_kernel {
    void (*fn)(const attn_args);
    size_t smem;
    att_dec_cache *cache;
};

template <int DT, int NR, int WT>
static att_dec_kernel att_dec_inst()
{
    static att_dec_cache cache; /* one per template instance, zero-initialised */
    return {attn_decode_kernel<DT, NR, WT>, (size_t)att_dec_cfg<DT, NR>::SMEM, &cache};
}

/* The decode kernel for dtype DT, NR heads per block and head dims up to need (<= CU_MAX_HEAD_DIM). */
template <int DT, int NR>
static att_dec_kernel att_dec_pick_wt(int need)
{
    constexpr int cover = 32 * att_dec_cfg<DT, NR>::E; /* head dims one warp covers */
    if (need <= cover)
        return att_dec_inst<DT, NR, 1>();
    if (need <= 2 * cover || NR <= 8) /* E = 8: 2 warps cover 512 */
        return att_dec_inst<DT, NR, 2>();
    if constexpr (NR > 8)
        return att_dec_inst<DT, NR, 4>();
    return {nullptr, 0, nullptr};
}

template <int DT>
static att_dec_kernel att_dec_pick_nr(int n_rep, int need)
{
    if (n_rep <= 1)
        return att_dec_pick_wt<DT, 1>(need);
    if (n_rep <= 2)
        return att_dec_pick_wt<DT, 2>(need);
    if (n_rep <= 4)
        return att_dec_pick_wt<DT, 4>(need);
    if (n_rep <= 8)
        return att_dec_pick_wt<DT, 8>(need);
    return att_dec_pick_wt<DT, 16>(need);
}

static att_dec_kernel att_dec_pick(int32_t dt, int n_rep, int need)
{
    if (dt == BERTH_DTYPE_BF16)
        return att_dec_pick_nr<BERTH_DTYPE_BF16>(n_rep, need);
    if (dt == BERTH_DTYPE_F16)
        return att_dec_pick_nr<BERTH_DTYPE_F16>(n_rep, need);
    return att_dec_pick_nr<BERTH_DTYPE_F32>(n_rep, need);
}

/* Set up kern on this device once (shared-memory opt-in, resident blocks per SM); *bps: resident blocks per SM. */
static berth_status att_dec_setup(berth_backend *be, const att_dec_kernel &kern, int *bps)
{
    int *slot = be->device >= 0 && be->device < ATT_DEC_CACHE_DEVICES ? &kern.cache->word[be->device] : nullptr;
    const int w = slot ? __atomic_load_n(slot, __ATOMIC_ACQUIRE) : 0;
    if (w > 0) {
        *bps = w;
        return BERTH_OK;
    }
    berth_status st = cu_check(be, cudaFuncSetAttribute(kern.fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                        (int)kern.smem),
                               "cudaFuncSetAttribute (attn_decode_kernel shared memory)");
    if (st != BERTH_OK)
        return st;
    /* Resident blocks per SM (registers and shared memory decide); a host-side query, no stream work. */
    int b = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kern.fn, ATT_DEC_THREADS, kern.smem) != cudaSuccess ||
        b < 1) {
        (void)cudaGetLastError(); /* not a launch error: size as if one block fits */
        b = 1;
    }
    if (slot)
        __atomic_store_n(slot, b, __ATOMIC_RELEASE);
    *bps = b;
    return BERTH_OK;
}

/* Floats of part_ml before part_o, rounded to 4 so that part_o's rows stay 16-byte aligned. */
static size_t att_dec_ml_floats(int64_t T, int64_t H, int ns)
{
    return ((size_t)T * (size_t)H * (size_t)ns * 2 + 3) & ~(size_t)3;
}

static berth_status att_run_decode(berth_backend *be, berth_stream *s, const berth_attention_params *p, attn_args a)
{
    const berth_kv_view *kv = &p->kv;
    const att_dec_kernel kern = att_dec_pick(kv->dtype, a.n_rep, a.D > a.DV ? a.D : a.DV);
    if (!kern.fn)
        return cu_fail(be->host, BERTH_E_BACKEND, "attention: no decode kernel for head dims %d / %d, %d heads per "
                       "KV head", a.D, a.DV, a.n_rep);
    int bps = 1;
    berth_status st = att_dec_setup(be, kern, &bps);
    if (st != BERTH_OK)
        return st;
    const int64_t cap = (int64_t)a.bt_width * kv->block_size;
    /* Launch sizing: from max_kv_len, except during graph capture (then the block table's capacity). The
     * workspace is always sized for the capacity bound so that a capture after an eager step never grows it. */
    int64_t kv_bound = be->capturing ? cap : (p->max_kv_len < cap ? p->max_kv_len : cap);
    kv_bound = kv_bound > 0 ? kv_bound : 0;
    const int ns = att_dec_splits(be, kv_bound, a.window, a.n_seqs, kv->n_kv_heads, a.T, a.n_heads, a.DV, bps);
    const int ns_ws = att_dec_splits(be, cap, a.window, a.n_seqs, kv->n_kv_heads, a.T, a.n_heads, a.DV, bps);
    a.ns = ns;
    a.direct = ns == 1;
    if (ns_ws > 1) {
        const size_t n_ml = att_dec_ml_floats(a.T, a.n_heads, ns_ws);
        const size_t n_o = (size_t)a.T * (size_t)a.n_heads * (size_t)ns_ws * (size_t)a.DV;
        void *ws = nullptr;
        if ((st = cu_stream_ws(be, s, (n_ml + n_o) * sizeof(float), &ws)) != BERTH_OK)
            return st;
        a.part_ml = (float *)ws;
        a.part_o = (float *)ws + att_dec_ml_floats(a.T, a.n_heads, ns);
    }
    const dim3 grid((unsigned)a.n_seqs, (unsigned)kv->n_kv_heads, (unsigned)ns);
    st = cu_check(be, cu_launch(be, s->cs, grid, dim3(ATT_DEC_THREADS), kern.smem, kern.fn, a), "attn_decode_kernel");
    if (st != BERTH_OK && be->device >= 0 && be->device < ATT_DEC_CACHE_DEVICES)
        __atomic_store_n(&kern.cache->word[be->device], 0, __ATOMIC_RELEASE); /* set it up again next time */
    if (st != BERTH_OK || a.direct)
        return st;
    /* With PDL the combine blocks may be scheduled while the decode grid's last blocks run; cu_pdl_wait inside
     * holds them until the partials are complete and visible. */
    const dim3 cgrid((unsigned)((int64_t)a.T * a.n_heads), (unsigned)((a.DV + ATT_CMB_COLS - 1) / ATT_CMB_COLS));
    return cu_check(be, cu_launch(be, s->cs, cgrid, dim3(ATT_CMB_THREADS), 0, attn_combine_kernel, a),
                    "attn_combine_kernel");
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

/* Tensor-core prefill configs per padded head dim: (DP, warps per row group, min blocks per SM). */
#define ATT_MMA_CONFIGS(X) X(64, 1, 2) X(128, 1, 2) X(256, 1, 2) X(512, 2, 1)

static size_t att_mma_smem(int dp)
{
    switch (dp) {
#define X(dp_, wd, minb)                                                                                           \
    case dp_:                                                                                                      \
        return att_mma_cfg<dp_, wd>::smem_bytes;
        ATT_MMA_CONFIGS(X)
#undef X
    }
    return SIZE_MAX;
}

/* The tensor-core kernel serves this call: BF16 compute mode, a bf16/f16 cache (the MMA's input type, so K and V
 * are used as stored), head dims that are whole k-steps / column tiles (multiples of 16), 16-byte aligned K/V
 * rows (cp.async), and shared memory for it. Everything else (FP32 parity mode included) takes the SIMT kernel. */
static bool att_mma_ok(const berth_backend *be, const attn_args &a)
{
    return be->compute == CU_COMPUTE_BF16 && (a.kv_dt == BERTH_DTYPE_BF16 || a.kv_dt == BERTH_DTYPE_F16) &&
           a.D > 0 && a.DV > 0 && a.D % 16 == 0 && a.DV % 16 == 0 && a.vec &&
           att_mma_smem(att_dp(a.D, a.DV)) + ATT_PF_STATIC_SMEM <= be->smem_optin;
}

template <int DP, int WD, int MINB, bool F16>
static berth_status att_launch_prefill_mma(berth_backend *be, berth_stream *s, const attn_args &a, unsigned n_tiles)
{
    using C = att_mma_cfg<DP, WD>;
    berth_status st = cu_check(be,
                               cudaFuncSetAttribute(attn_prefill_mma_kernel<DP, WD, F16, MINB>,
                                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)C::smem_bytes),
                               "cudaFuncSetAttribute (attn_prefill_mma_kernel shared memory)");
    if (st != BERTH_OK)
        return st;
    attn_prefill_mma_kernel<DP, WD, F16, MINB>
        <<<n_tiles * (unsigned)a.n_heads, C::THREADS, C::smem_bytes, s->cs>>>(a);
    return cu_check_launch(be, "attn_prefill_mma_kernel");
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
    if (att_mma_ok(be, a)) {
        const bool f16 = a.kv_dt == BERTH_DTYPE_F16;
        switch (att_dp(a.D, a.DV)) {
#define X(dp, wd, minb)                                                                                            \
    case dp:                                                                                                       \
        return f16 ? att_launch_prefill_mma<dp, wd, minb, true>(be, s, a, (unsigned)tiles)                        \
                   : att_launch_prefill_mma<dp, wd, minb, false>(be, s, a, (unsigned)tiles);
            ATT_MMA_CONFIGS(X)
#undef X
        }
    }
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
    if (be->skip & CU_SKIP_ATTN)
        return BERTH_OK;
    if (T > 0 && p->n_seqs == 0)
        return cu_fail(be->host, BERTH_E_INVALID, "attention: %" PRId64 " query rows but no sequence", T);
    if (T == 0 || H == 0)
        return BERTH_OK;
    const bool gate = p->gate.buf != nullptr;
    attn_args a = {};
    cu_attn_args_fill(a, p);
    a.q_dt = p->q.dtype;
    a.out_dt = p->out.dtype;
    a.gate_dt = gate ? p->gate.dtype : BERTH_DTYPE_F32;
    a.kv_dt = kv->dtype;
    a.D = kv->head_dim;
    a.DV = kv->head_dim_v;
    a.n_heads = (int32_t)H;
    a.n_rep = (int32_t)(H / kv->n_kv_heads);
    a.T = (int32_t)T;
    a.n_seqs = p->n_seqs;
    a.vec = cu_kv_aligned16(kv);
    a.q_vec = (((uintptr_t)a.q | (uint64_t)p->q.nb[1] | (uint64_t)p->q.nb[2]) & 15u) == 0;
    /* Decode kernels for one query row per sequence: T == n_seqs with max_q_len 1 (an upper bound, so every
     * sequence has exactly one row). T == n_seqs alone also holds when a sequence with no row sits beside one with
     * two: those go to the prefill kernels (the decode kernels' loop over several rows of a sequence computed the
     * second row wrongly in a bf16 random test, session 15). */
    if (T == p->n_seqs && p->max_q_len <= 1) {
        /* Which decode kernel (BERTH_CUDA_ATT_DECODE, docs/config.md): by default the one-launch cluster kernel for
         * the smallest calls, the tensor-core kernel for the rest where it serves (BF16 mode, bf16/f16 cache), the
         * cluster kernel for small calls it does not serve, the split kernel otherwise; =mma puts the tensor-core
         * kernel first, =new/c8 skip it, =old keeps the split kernel. */
        bool dec_ran = false;
        berth_status dst = BERTH_OK;
        const bool aut = be->att_decode == CU_ATT_DECODE_AUTO;
        if (be->att_decode == CU_ATT_DECODE_MMA && ((dst = cu_attention_decode_mma(be, s, p, &dec_ran)) != BERTH_OK ||
                                                    dec_ran))
            return dst;
        if (aut && (dst = cu_attention_decode_mma_reserve(be, s, p)) != BERTH_OK)
            return dst;
        if ((dst = cu_attention_decode_fast(be, s, p, aut, &dec_ran)) != BERTH_OK || dec_ran)
            return dst;
        if (aut && ((dst = cu_attention_decode_mma(be, s, p, &dec_ran)) != BERTH_OK || dec_ran))
            return dst;
        if (aut && ((dst = cu_attention_decode_fast(be, s, p, false, &dec_ran)) != BERTH_OK || dec_ran))
            return dst;
        return att_run_decode(be, s, p, a);
    }
    bool ran = false;
    const berth_status pst = cu_attention_prefill_fast(be, s, p, &ran);
    if (pst != BERTH_OK || ran)
        return pst;
    return att_run_prefill(be, s, a);
}

/*
 * attention_prefill.cu — the fast tensor-core prefill path of ATTENTION (berth/backend.h): the same semantics and
 * the same arithmetic contract as attention.cu's attn_prefill_mma_kernel (read its header comment first), laid
 * out for throughput. attention.cu's prefill dispatch calls cu_attention_prefill_fast() first; it serves BF16
 * compute mode with a bf16/f16 cache, head dims that are multiples of 16 up to 512 and 16-byte aligned K/V rows,
 * and answers *ran = false (nothing enqueued) for everything else, which keeps the older kernels. The environment
 * variable BERTH_CUDA_ATT_PREFILL=old forces that fallback (A/B measurements).
 *
 * Why another kernel: the older one gives each (64-row query tile, query head) its own block, so with GQA every
 * K/V tile is fetched once per query head, and each block runs a serial load -> MMA -> softmax -> load chain with
 * one K and one V buffer. Here:
 *   - GQA packing: a block serves one KV head and M "packed rows", packed row i of a sequence being query row
 *     q0 + i / n_rep of query head kvh * n_rep + i % n_rep (FlashInfer's layout). All n_rep heads of a token share
 *     its mask, and each K/V tile is fetched once for all of them: with 8 heads per KV head, a 128-row tile spans
 *     16 tokens, so the causal diagonal costs little and L2 traffic drops n_rep-fold.
 *   - A two-stage cp.async pipeline with one block barrier per key tile: tile t+1's K and V pieces are issued
 *     between the MMAs of tile t's S (after the barrier that frees tile t-1's stage), so their loads overlap all
 *     of tile t's work. The block-table reads for tile t+2 are issued at the top of tile t and consumed after its
 *     scores; offsets and key-validity bits live in a 3-slot ring, so no extra barrier is needed. Past the last
 *     tile the pieces only zero-fill the free stage (no branches around them).
 *   - ldmatrix fragments are loaded a few MMA steps ahead; partly visible tiles run whole (the mask zeroes P),
 *     so each warp runs one straight-line S and P V body (instruction-cache footprint matters at 1 block/SM).
 *   - Lazy rescaling: a row's reference maximum moves only when its scores exceed it by more than a factor 2^8
 *     (APF_LAZY), so most tiles skip the O rescale; P <= 2^8, its bf16/f16 rounding is still relative and the
 *     row sums still add the rounded values, so the error bound of the test holds unchanged.
 *   - Output through shared memory: whole rows leave as coalesced 16-byte stores, the gate applied on the way.
 *   - Head dims up to 256 (DP = 64/128/256): 8 warps x 16 packed rows (M = 128), key tiles of 64; each warp
 *     computes S = Q K^T for its rows over the whole head dim, keeps P in registers as the A operand of O += P V,
 *     and owns all DP output columns (128 fp32 accumulators per thread at DP = 256).
 *   - Head dim 512: 4 row groups x 2 warps (M = 64), key tiles of 32. The 16 x 512 fp32 output of a row group does
 *     not fit one warp's registers, so warp hw of the pair owns output columns [256 hw, 256 hw + 256), and also
 *     computes S over head-dim columns [256 hw, 256 hw + 256) only: the two fp32 partial score tiles are swapped
 *     through shared memory (a 64-thread named barrier) and added, in the same order-independent way (a + b ==
 *     b + a), so both warps hold identical full scores, maxima, P and row sums without any other exchange.
 *   - Work order: the last (heaviest, causal) tile first, so that the second wave of a causal prefill fills the
 *     gaps the first leaves.
 * Arithmetic (same contract as attn_prefill_mma_kernel, which tests/cuda_ops/test_cuda_attention.c bounds): q
 * and P are rounded to the cache's type (bf16/f16, nearest even) for mma.sync m16n8k16 with fp32 accumulation;
 * K and V are used as stored; scale, softcap, mask, the online softmax (exp2 of scores pre-multiplied by log2 e),
 * the row sums (of the ROUNDED P values) and the output are fp32. Head dims below the tile's DP are zero-padded in
 * shared memory (cp.async with source size 0), which adds exact zeros to the dot products.
 *
 * Robustness, as in attention.cu (metadata is device data, never read back): sequences whose seq_q_start range
 * is not inside [0, T] get no tiles, seq_kv_len is clamped to the block table's row, keys whose block-table entry
 * is not a block of the pool are zero-filled and masked (never dereferenced), rows that see no key write zeros.
 */
#include "attention_args.cuh"
#include "cuda_device.cuh"
#include "cuda_internal.h"
#include "cuda_mma.cuh"

#include <stdlib.h>
#include <string.h>

/* The entry point attention.cu's prefill dispatch calls (declared there too). */
berth_status cu_attention_prefill_fast(berth_backend *be, berth_stream *s, const berth_attention_params *p,
                                       bool *ran);

// ---------------------------------------------------------------------------------------------------------------
// Configuration.

template <int DP, int WD_>
struct apf_cfg {
    static constexpr int WD = WD_;                        /* warps per 16-row group (head-dim split) */
    static constexpr int RG = WD > 1 && DP > 256 ? 4 : 8; /* 16-row groups */
    static constexpr int M = RG * 16;                     /* packed rows per tile */
    static constexpr int WARPS = RG * WD, THREADS = WARPS * 32;
    static constexpr int BN = WD > 1 ? 32 : 64;           /* keys per K/V tile */
    static constexpr int ST = DP + 8;                     /* shared row stride (halves): ldmatrix conflict-free */
    static constexpr int KD = DP / WD;                    /* head-dim columns of S one warp contracts */
    static constexpr int OW = DP / WD;                    /* output columns one warp accumulates */
    static constexpr size_t q_bytes = (size_t)M * ST * 2;
    static constexpr size_t kv_bytes = (size_t)BN * ST * 2; /* one K or V tile */
    static constexpr size_t x_bytes = WD > 1 ? (size_t)RG * WD * (BN / 8) * 32 * 16 : 0; /* partial-S swap */
    static constexpr size_t smem_bytes = q_bytes + 4 * kv_bytes + x_bytes;
};

/* Static shared memory of the kernel is at most this (row data, offset ring); checked against the opt-in limit. */
#define APF_STATIC_SMEM 8192

#define APF_PLAN_THREADS 1024

/* Lazy softmax rescaling: the running maximum a row's P are taken against moves only when the row's scores
 * exceed it by more than this many powers of two (so P <= 2^APF_LAZY; rounding P stays relative). */
#define APF_LAZY 8.0f

/* What the kernels read, flattened from the params (device addresses, byte strides). */
struct apf_args {
    const char *q;
    int64_t q_nb1, q_nb2;
    char *out;
    int64_t out_nb1, out_nb2;
    const char *gate; /* nullptr when absent */
    int64_t gate_nb1, gate_nb2;
    const int32_t *positions, *seq_q_start, *seq_kv_len, *block_table;
    int64_t bt_stride; /* elements between block-table rows */
    int32_t bt_width;  /* max_blocks */
    const char *kbase, *vbase;
    int64_t block_stride, token_stride, head_stride, v_token_stride, v_head_stride;
    int32_t block_size, n_blocks;
    int32_t bs_shift; /* log2(block_size) when a power of two, else -1 */
    int32_t D, DV, n_rep, n_kv_heads, T, n_seqs;
    int32_t mask, window;
    float scale, softcap;
    float sl2;       /* scale * log2(e) */
    int32_t q_vec;   /* q rows 16-byte aligned: float4 loads */
    int32_t out_vec;  /* out rows 16-byte aligned: float4 stores */
    int32_t gate_vec; /* gate rows 16-byte aligned: float4 loads */
    const int32_t *tile_start; /* [n_seqs + 1]: first tile of each sequence, then the total */
};

// ---------------------------------------------------------------------------------------------------------------
// Device helpers.

/* 2^x (MUFU.EX2, relative error ~2^-22; results below 2^-126 flush to 0, which no rounded P can tell). */
__device__ __forceinline__ float apf_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* Barrier of the two warps of row group rg (ids 1..RG; __syncthreads owns 0). */
__device__ __forceinline__ void apf_pair_bar(int rg)
{
    asm volatile("bar.sync %0, 64;\n" ::"r"(rg + 1) : "memory");
}

// ---------------------------------------------------------------------------------------------------------------
// Plan: tile_start[i] = number of M-row packed tiles of sequences before i (a sequence whose range is not inside
// [0, T] gets none), tile_start[n_seqs] = the total. One block, a scan per APF_PLAN_THREADS sequences.

__global__ void __launch_bounds__(APF_PLAN_THREADS) apf_plan_kernel(const int32_t *seq_q_start, int32_t n_seqs,
                                                                    int32_t T, int32_t n_rep, int32_t M,
                                                                    int32_t *tile_start)
{
    __shared__ int32_t warp_tot[32];
    __shared__ int32_t carry_s;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (threadIdx.x == 0)
        carry_s = 0;
    __syncthreads();
    for (int32_t base = 0; base < n_seqs; base += APF_PLAN_THREADS) {
        const int32_t i = base + (int32_t)threadIdx.x;
        int32_t n = 0;
        if (i < n_seqs) {
            const int32_t q0 = seq_q_start[i], q1 = seq_q_start[i + 1];
            if (q0 >= 0 && q1 >= q0 && q1 <= T)
                n = (int32_t)(((int64_t)(q1 - q0) * n_rep + M - 1) / M);
        }
        int32_t incl = n;
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
            int32_t w = warp_tot[lane];
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int32_t y = __shfl_up_sync(0xffffffffu, w, o);
                if (lane >= o)
                    w += y;
            }
            warp_tot[lane] = w;
        }
        __syncthreads();
        const int32_t carry = carry_s;
        const int32_t before = (warp > 0 ? warp_tot[warp - 1] : 0) + incl - n;
        if (i < n_seqs)
            tile_start[i] = carry + before;
        __syncthreads();
        if (threadIdx.x == 0)
            carry_s = carry + warp_tot[31];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        tile_start[n_seqs] = carry_s;
}

// ---------------------------------------------------------------------------------------------------------------
// The attention kernel. Grid: (tile bound) x n_kv_heads, KV head fastest; block b serves tile total - 1 - b / nkvh.

template <int DP, int WD_, bool F16>
__global__ void __launch_bounds__(apf_cfg<DP, WD_>::THREADS, 1) apf_kernel(const apf_args a)
{
    using C = apf_cfg<DP, WD_>;
    constexpr int M = C::M, BN = C::BN, WD = C::WD, ST = C::ST, THREADS = C::THREADS;
    constexpr int NT = BN / 8;      /* 8-key n-tiles of a warp's scores (every warp: all BN keys) */
    constexpr int NKC = BN / 16;    /* 16-key chunks */
    constexpr int NKS = C::KD / 16; /* k-steps of a warp's S */
    constexpr int NO = C::OW / 8;   /* 8-column output tiles of a warp */
    constexpr int CPR = DP / 8;     /* 16-byte pieces per K/V row */
    constexpr int PER = BN * CPR / THREADS;
    constexpr float LOG2E = 1.4426950408889634f;
    static_assert(BN * CPR % THREADS == 0 && BN % 32 == 0 && M <= THREADS && NO % 2 == 0, "tile shape");

    extern __shared__ float4 apf_dsmem[];
    uint16_t *Qs = (uint16_t *)apf_dsmem;
    uint16_t *KVs = Qs + M * ST;                    /* stage s: K at KVs + 2s BN ST, V after it */
    float4 *Xs = (float4 *)(KVs + 4 * BN * ST);     /* WD > 1: [RG][WD][NT][32 lanes] partial scores */
    __shared__ int32_t row_lo[M], row_hi[M], row_tok[M], row_head[M];
    __shared__ longlong2 off_s[3][BN];      /* key j of a tile: K and V byte offsets (0 when absent) */
    __shared__ uint32_t kval_s[3][BN / 32]; /* bit j: key j of the tile exists */
    __shared__ int32_t seq_s, tile_s;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int rg = warp / WD, hw = warp % WD;
    const int gq = lane >> 2, cq = lane & 3; /* MMA fragment coordinates: rows gq, gq + 8; column pair cq */
    const int kvh = (int)(blockIdx.x % (unsigned)a.n_kv_heads);
    const int32_t tix = (int32_t)(blockIdx.x / (unsigned)a.n_kv_heads);

    if (tid == 0) {
        int32_t seq, tile;
        cu_attn_tile_of(a.tile_start, a.n_seqs, tix, &seq, &tile);
        seq_s = seq;
        tile_s = tile;
    }
    __syncthreads();
    const int32_t seq = seq_s;
    if (seq < 0)
        return;
    const int32_t q0 = a.seq_q_start[seq];
    const int64_t npacked = (int64_t)(a.seq_q_start[seq + 1] - q0) * a.n_rep;
    const int64_t p0 = (int64_t)(tile_s - a.tile_start[seq]) * M;
    const int32_t kv_len = cu_attn_kv_len(a, a.seq_kv_len[seq]);
    const int32_t *bt = a.block_table + (int64_t)seq * a.bt_stride;

    if (tid < M) {
        const int64_t pp = p0 + tid;
        int32_t lo = 0, hi = 0, tok = -1, head = 0;
        if (pp < npacked) {
            tok = q0 + (int32_t)(pp / a.n_rep);
            head = kvh * a.n_rep + (int32_t)(pp % a.n_rep);
            cu_attn_row_range(a.mask, a.window, a.positions[tok], kv_len, &lo, &hi);
        }
        row_lo[tid] = lo;
        row_hi[tid] = hi;
        row_tok[tid] = tok;
        row_head[tid] = head;
    }
    __syncthreads();

    /* The block's key hull [klo, khi) (every warp computes the same), this warp's hull [wlo, whi) for chunk
     * skipping, and [wlo_max, whi_min): the keys every row of the warp sees (tiles inside it need no mask). */
    int32_t klo = INT32_MAX, khi = 0;
#pragma unroll
    for (int r = lane; r < M; r += 32) {
        const int32_t lo = row_lo[r], hi = row_hi[r];
        if (lo < hi)
            klo = min(klo, lo), khi = max(khi, hi);
    }
    klo = __reduce_min_sync(0xffffffffu, klo);
    khi = __reduce_max_sync(0xffffffffu, khi);
    const int rA = rg * 16 + gq, rB = rA + 8;
    const int32_t loA = row_lo[rA], hiA = row_hi[rA], loB = row_lo[rB], hiB = row_hi[rB];
    int32_t wlo, whi, wlo_max, whi_min;
    {
        const int32_t lo = row_lo[rg * 16 + (lane & 15)], hi = row_hi[rg * 16 + (lane & 15)];
        wlo = __reduce_min_sync(0xffffffffu, lo < hi ? lo : INT32_MAX);
        whi = __reduce_max_sync(0xffffffffu, lo < hi ? hi : 0);
        wlo_max = __reduce_max_sync(0xffffffffu, lo);
        whi_min = __reduce_min_sync(0xffffffffu, hi);
    }
    const int32_t nt = khi > klo ? (khi - klo + BN - 1) / BN : 0;

    /* Block-table entry of key k of tile t (threads < BN; -1 past the hull), then the tile's offsets into ring
     * slot t % 3. Tiles past the last (t >= nt) get no keys: their pieces zero-fill (see the loop). */
    auto tile_entry = [&](int t) -> int32_t {
        const int64_t j = (int64_t)klo + (int64_t)t * BN + tid;
        if (t >= nt || j >= khi)
            return -1;
        return bt[a.bs_shift >= 0 ? (int32_t)j >> a.bs_shift : (int32_t)j / a.block_size]; /* j < khi: 32 bits */
    };
    auto tile_offsets = [&](int t, int32_t entry) {
        const int64_t j = (int64_t)klo + (int64_t)t * BN + tid;
        const bool ok = t < nt && j < khi && entry >= 0 && entry < a.n_blocks;
        int64_t ko = 0, vo = 0;
        if (ok) {
            const int64_t slot = a.bs_shift >= 0 ? (int32_t)j & (a.block_size - 1) : (int32_t)j % a.block_size;
            ko = (int64_t)entry * a.block_stride + slot * a.token_stride + (int64_t)kvh * a.head_stride;
            vo = (int64_t)entry * a.block_stride + slot * a.v_token_stride + (int64_t)kvh * a.v_head_stride;
        }
        const int r = t % 3;
        off_s[r][tid] = make_longlong2(ko, vo);
        const uint32_t bits = __ballot_sync(0xffffffffu, ok);
        if (lane == 0)
            kval_s[r][tid >> 5] = bits;
    };
    /* K/V pieces: thread tid copies the 16-byte column c = tid % CPR of rows r0 + i RSTEP (i < PER) of a tile,
     * zero-filling columns past the head dim and absent keys. */
    constexpr int RSTEP = THREADS / CPR;
    static_assert(THREADS % CPR == 0 && RSTEP * PER == BN, "K/V pieces");
    const int pc = tid % CPR, pr0 = tid / CPR;
    const char *ksrc = a.kbase + pc * 16, *vsrc = a.vbase + pc * 16;
    const int kbytes = pc * 8 < a.D ? 16 : 0, vbytes = pc * 8 < a.DV ? 16 : 0;
    const int pdst = pr0 * ST + pc * 8;
    auto tile_valid = [&](int t) -> uint64_t {
        uint64_t v = kval_s[t % 3][0];
        if constexpr (BN > 32)
            v |= (uint64_t)kval_s[t % 3][1] << 32;
        return v;
    };
    auto issue_piece = [&](uint16_t *Kd, const longlong2 &off, uint64_t valid, int i) {
        const bool ok = valid >> (pr0 + i * RSTEP) & 1u;
        cu_cp16(Kd + pdst + i * RSTEP * ST, ksrc + off.x, ok ? kbytes : 0);
        cu_cp16(Kd + BN * ST + pdst + i * RSTEP * ST, vsrc + off.y, ok ? vbytes : 0);
    };

    if (tid < BN) {
        const int32_t e0 = tile_entry(0), e1 = tile_entry(1);
        tile_offsets(0, e0);
        tile_offsets(1, e1);
    }
    __syncthreads();
    {
        const uint64_t valid = tile_valid(0);
#pragma unroll
        for (int i = 0; i < PER; i++)
            issue_piece(KVs, off_s[0][pr0 + i * RSTEP], valid, i);
        cu_cp_commit();
    }

    /* Q tile rounded to the MMA type; padding rows and columns zero. 16-byte rows: a thread's loads are all in
     * flight (up to QMAX) before its first store. Visible after the loop's first barrier. */
    {
        constexpr int C4 = DP / 4, NQ = M * C4 / THREADS, QMAX = THREADS > 256 ? 8 : 32;
        constexpr int QB = NQ < QMAX ? NQ : QMAX;
        static_assert(M * C4 % THREADS == 0 && NQ % QB == 0, "Q tile");
        if (a.q_vec) {
#pragma unroll 1
            for (int i0 = 0; i0 < NQ; i0 += QB) {
                float4 v[QB];
#pragma unroll
                for (int i = 0; i < QB; i++) {
                    const int idx = tid + (i0 + i) * THREADS, m = idx / C4, d4 = idx % C4;
                    const int32_t tok = row_tok[m];
                    v[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                    if (tok >= 0 && d4 * 4 < a.D)
                        v[i] = ((const float4 *)(a.q + (int64_t)tok * a.q_nb2 + (int64_t)row_head[m] * a.q_nb1))[d4];
                }
#pragma unroll
                for (int i = 0; i < QB; i++) {
                    const int idx = tid + (i0 + i) * THREADS, m = idx / C4, d4 = idx % C4;
                    *(uint2 *)(Qs + m * ST + d4 * 4) =
                        make_uint2(cu_pack2<F16>(v[i].x, v[i].y), cu_pack2<F16>(v[i].z, v[i].w));
                }
            }
        } else {
#pragma unroll 1
            for (int idx = tid; idx < M * C4; idx += THREADS) {
                const int m = idx / C4, d4 = idx % C4;
                const int32_t tok = row_tok[m];
                float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (tok >= 0 && d4 * 4 < a.D) {
                    const float *qr =
                        (const float *)(a.q + (int64_t)tok * a.q_nb2 + (int64_t)row_head[m] * a.q_nb1) + 4 * d4;
                    v = make_float4(qr[0], qr[1], qr[2], qr[3]);
                }
                *(uint2 *)(Qs + m * ST + d4 * 4) = make_uint2(cu_pack2<F16>(v.x, v.y), cu_pack2<F16>(v.z, v.w));
            }
        }
    }

    float o[NO][4];
#pragma unroll
    for (int n = 0; n < NO; n++)
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float mA = -INFINITY, mB = -INFINITY, lA = 0.0f, lB = 0.0f; /* running max (log2 units), partial row sums */

    const uint16_t *qa = Qs + (rg * 16 + (lane & 15)) * ST + (lane >> 4) * 8 + hw * C::KD;
    const int kb_off = ((lane & 7) + ((lane >> 4) << 3)) * ST + ((lane >> 3) & 1) * 8 + hw * C::KD;
    const int vb_off = (lane & 15) * ST + (lane >> 4) * 8 + hw * C::OW;

    for (int t = 0; t < nt; t++) {
        const int32_t e2 = tid < BN ? tile_entry(t + 2) : -1; /* consumed after S: its latency is hidden */
        cu_cp_wait<0>();
        __syncthreads(); /* tile t's K/V (and, at t = 0, Q) visible; every warp is done with tile t - 1 */
        const uint16_t *Ks = KVs + (size_t)(2 * (t & 1)) * BN * ST;
        const uint16_t *Vs = Ks + BN * ST;
        const int32_t k0 = klo + t * BN;
        /* Tile t + 1 into the other stage (tile t - 1's, free since the barrier), its pieces issued between the
         * MMAs of S; past the last tile they only zero-fill that free stage. Offsets: one piece ahead. */
        uint16_t *Kn = KVs + (size_t)(2 * ((t + 1) & 1)) * BN * ST;
        const longlong2 *offn = off_s[(t + 1) % 3] + pr0;
        const uint64_t validn = tile_valid(t + 1);
        longlong2 offp = offn[0];

        /* Does this warp see any key of the tile? (Partly visible tiles run whole; the mask zeroes the rest.) */
        const bool wact = (int64_t)k0 < whi && (int64_t)k0 + BN > wlo;

        /* S = Q K^T (WD = 2: over this warp's half of the head dim). A step is one 16-key chunk of one k-step
         * (an ldmatrix of K for two MMAs); K fragments are loaded LAB steps ahead, Q's one k-step ahead. */
        float s[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++)
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
        static_assert(PER <= NKS, "K/V pieces ride on the k-steps of S");
        if (wact) {
            constexpr int NSTEP = NKS * NKC, LAB = THREADS > 256 ? 1 : NKC >= 4 ? 2 : 4, RB = LAB + 1;
            uint32_t af[2][4], bf[RB][4];
            cu_ldsm4(af[0], qa);
#pragma unroll
            for (int i = 0; i < LAB; i++)
                cu_ldsm4(bf[i % RB], Ks + kb_off + (i % NKC) * 16 * ST + (i / NKC) * 16);
#pragma unroll
            for (int i = 0; i < NSTEP; i++) {
                const int ks = i / NKC, kc = i % NKC;
                if (kc == 0 && ks + 1 < NKS)
                    cu_ldsm4(af[(ks + 1) & 1], qa + (ks + 1) * 16);
                if (i + LAB < NSTEP)
                    cu_ldsm4(bf[(i + LAB) % RB], Ks + kb_off + ((i + LAB) % NKC) * 16 * ST + ((i + LAB) / NKC) * 16);
                if (kc == 0 && ks < PER) {
                    const longlong2 cur = offp;
                    if (ks + 1 < PER)
                        offp = offn[(ks + 1) * RSTEP];
                    issue_piece(Kn, cur, validn, ks);
                }
                cu_mma16816<F16>(s[2 * kc], af[ks & 1], bf[i % RB][0], bf[i % RB][1]);
                cu_mma16816<F16>(s[2 * kc + 1], af[ks & 1], bf[i % RB][2], bf[i % RB][3]);
            }
        } else {
#pragma unroll
            for (int i = 0; i < PER; i++)
                issue_piece(Kn, offn[i * RSTEP], validn, i);
        }
        cu_cp_commit();
        if constexpr (WD > 1) {
            /* Swap the partial scores with the partner warp and add (the same sum in both warps). */
            float4 *mine = Xs + (size_t)((rg * WD + hw) * NT) * 32 + lane;
            const float4 *other = Xs + (size_t)((rg * WD + (hw ^ 1)) * NT) * 32 + lane;
#pragma unroll
            for (int n = 0; n < NT; n++)
                mine[n * 32] = make_float4(s[n][0], s[n][1], s[n][2], s[n][3]);
            apf_pair_bar(rg);
#pragma unroll
            for (int n = 0; n < NT; n++) {
                const float4 x = other[n * 32];
                s[n][0] += x.x;
                s[n][1] += x.y;
                s[n][2] += x.z;
                s[n][3] += x.w;
            }
        }

        /* Scores in log2 units: scale (and softcap), then the mask unless every key is visible to every row. */
        if (a.softcap > 0.0f) {
            const float c = a.softcap; /* attention.cu's expression, then log2 units */
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    s[n][e] = c * tanhf(a.scale * s[n][e] / c) * LOG2E;
        } else {
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    s[n][e] *= a.sl2;
        }
        const uint64_t kval = tile_valid(t);
        constexpr uint64_t all_keys = BN >= 64 ? ~0ull : (1ull << BN) - 1;
        const bool inside = kval == all_keys && k0 >= wlo_max && (int64_t)k0 + BN <= whi_min;
        if (!inside) {
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int kt = n * 8 + 2 * cq + (e & 1);
                    const int32_t j = k0 + kt;
                    const bool vis = (kval >> kt & 1u) && (e < 2 ? j >= loA && j < hiA : j >= loB && j < hiB);
                    s[n][e] = vis ? s[n][e] : -INFINITY;
                }
        }

        /* Online softmax on rows A = gq and B = gq + 8 of the row group. */
        float mxA = -INFINITY, mxB = -INFINITY;
#pragma unroll
        for (int n = 0; n < NT; n++) {
            mxA = fmaxf(mxA, fmaxf(s[n][0], s[n][1]));
            mxB = fmaxf(mxB, fmaxf(s[n][2], s[n][3]));
        }
#pragma unroll
        for (int off = 1; off <= 2; off <<= 1) {
            mxA = fmaxf(mxA, __shfl_xor_sync(0xffffffffu, mxA, off));
            mxB = fmaxf(mxB, __shfl_xor_sync(0xffffffffu, mxB, off));
        }
        /* The reference maxima mA, mB move only when some row of the warp outgrew its own by more than
         * APF_LAZY (log2 units), so P = 2^(s - m) <= 2^APF_LAZY and most tiles skip the O rescale. Rows that
         * have seen nothing keep m = -inf and subtract 0 (P = 2^-inf = 0); their alpha 2^-inf = 0 scales zeros. */
        if (__any_sync(0xffffffffu, mxA > mA + APF_LAZY || mxB > mB + APF_LAZY)) {
            const float nmA = fmaxf(mA, mxA), nmB = fmaxf(mB, mxB);
            const float alA = apf_exp2(mA - (nmA == -INFINITY ? 0.0f : nmA));
            const float alB = apf_exp2(mB - (nmB == -INFINITY ? 0.0f : nmB));
            mA = nmA;
            mB = nmB;
            lA *= alA;
            lB *= alB;
#pragma unroll
            for (int n = 0; n < NO; n++) {
                o[n][0] *= alA;
                o[n][1] *= alA;
                o[n][2] *= alB;
                o[n][3] *= alB;
            }
        }
        const float msA = mA == -INFINITY ? 0.0f : mA, msB = mB == -INFINITY ? 0.0f : mB;
        uint32_t pk[NT][2]; /* P rounded, packed: [8-key tile][row A, row B] */
#pragma unroll
        for (int n = 0; n < NT; n++) {
            pk[n][0] = cu_pack2<F16>(apf_exp2(s[n][0] - msA), apf_exp2(s[n][1] - msA));
            pk[n][1] = cu_pack2<F16>(apf_exp2(s[n][2] - msB), apf_exp2(s[n][3] - msB));
            lA += cu_unpack2_sum<F16>(pk[n][0]);
            lB += cu_unpack2_sum<F16>(pk[n][1]);
        }

        /* Tile t + 2's offsets into ring slot (t + 2) % 3, last used by tile t - 1 (done: barrier above). */
        if (tid < BN)
            tile_offsets(t + 2, e2);

        /* O += P V over this warp's output columns; V fragments LA steps ahead (a step: 16 keys x 16 columns,
         * one ldmatrix for two MMAs). */
        if (wact) {
            constexpr int NDS = NO / 2, NSTEP = NKC * NDS, LA = THREADS > 256 ? 2 : 3, RING = LA + 1;
            uint32_t vf[RING][4];
#pragma unroll
            for (int i = 0; i < LA; i++)
                cu_ldsm4_t(vf[i % RING], Vs + vb_off + (i / NDS) * 16 * ST + (i % NDS) * 16);
#pragma unroll
            for (int i = 0; i < NSTEP; i++) {
                if (i + LA < NSTEP)
                    cu_ldsm4_t(vf[(i + LA) % RING], Vs + vb_off + ((i + LA) / NDS) * 16 * ST + ((i + LA) % NDS) * 16);
                const int kc = i / NDS, nd = i % NDS;
                const uint32_t af[4] = {pk[2 * kc][0], pk[2 * kc][1], pk[2 * kc + 1][0], pk[2 * kc + 1][1]};
                cu_mma16816<F16>(o[2 * nd], af, vf[i % RING][0], vf[i % RING][1]);
                cu_mma16816<F16>(o[2 * nd + 1], af, vf[i % RING][2], vf[i % RING][3]);
            }
        }
    }

    /* Row sums over the quad (both warps of a WD = 2 pair hold the same full sums). */
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
        lA += __shfl_xor_sync(0xffffffffu, lA, off);
        lB += __shfl_xor_sync(0xffffffffu, lB, off);
    }
    const float invA = lA > 0.0f ? 1.0f / lA : 0.0f, invB = lB > 0.0f ? 1.0f / lB : 0.0f;

    /* Output: the normalised rows go through shared memory (the tiles' space; row stride DP + 8 floats keeps the
     * fragment stores conflict-free), then leave as whole rows: coalesced 16-byte stores, the gate applied on the
     * way. The last zero-fill pieces land first (nothing reads them, but they write this space). */
    constexpr int OST = DP + 8;
    static_assert((size_t)M * OST * sizeof(float) <= C::smem_bytes, "output staging");
    cu_cp_wait<0>();
    __syncthreads(); /* every warp is done with Q, K and V */
    float *Os = (float *)apf_dsmem;
#pragma unroll
    for (int n = 0; n < NO; n++) {
        const int d = hw * C::OW + n * 8 + 2 * cq;
        *(float2 *)(Os + rA * OST + d) = make_float2(o[n][0] * invA, o[n][1] * invA);
        *(float2 *)(Os + rB * OST + d) = make_float2(o[n][2] * invB, o[n][3] * invB);
    }
    __syncthreads();
    {
        constexpr int C4 = DP / 4;
#pragma unroll 4
        for (int idx = tid; idx < M * C4; idx += THREADS) {
            const int m = idx / C4, c = idx % C4;
            const int32_t tok = row_tok[m];
            if (tok < 0 || c * 4 >= a.DV)
                continue;
            float4 v = *(const float4 *)(Os + m * OST + c * 4);
            if (a.gate) {
                const float *g =
                    (const float *)(a.gate + (int64_t)tok * a.gate_nb2 + (int64_t)row_head[m] * a.gate_nb1) + c * 4;
                const float4 gv = a.gate_vec ? *(const float4 *)g : make_float4(g[0], g[1], g[2], g[3]);
                v.x *= 1.0f / (1.0f + expf(-gv.x));
                v.y *= 1.0f / (1.0f + expf(-gv.y));
                v.z *= 1.0f / (1.0f + expf(-gv.z));
                v.w *= 1.0f / (1.0f + expf(-gv.w));
            }
            float *orow = (float *)(a.out + (int64_t)tok * a.out_nb2 + (int64_t)row_head[m] * a.out_nb1) + c * 4;
            if (a.out_vec) {
                *(float4 *)orow = v;
            } else {
                orow[0] = v.x;
                orow[1] = v.y;
                orow[2] = v.z;
                orow[3] = v.w;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Host side.

template <int DP, int WD, bool F16>
static berth_status apf_launch(berth_backend *be, berth_stream *s, const apf_args &a, unsigned blocks)
{
    using C = apf_cfg<DP, WD>;
    berth_status st = cu_check(be,
                               cudaFuncSetAttribute(apf_kernel<DP, WD, F16>,
                                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)C::smem_bytes),
                               "cudaFuncSetAttribute (apf_kernel shared memory)");
    if (st != BERTH_OK)
        return st;
    apf_kernel<DP, WD, F16><<<blocks, C::THREADS, C::smem_bytes, s->cs>>>(a);
    return cu_check_launch(be, "apf_kernel");
}

/* The kernel instances: padded head dim DP (the smallest of 64, 128, 256, 512 that holds D and DV) and WD. */
struct apf_kind {
    int dp, wd;
};

static apf_kind apf_pick(int D, int DV)
{
    const int m = D > DV ? D : DV;
    const int dp = m <= 64 ? 64 : m <= 128 ? 128 : m <= 256 ? 256 : 512;
    return {dp, dp > 256 ? 2 : 1};
}

#define APF_KINDS(X) X(64, 1) X(128, 1) X(256, 1) X(512, 2)

static size_t apf_smem(apf_kind k)
{
#define X(dp_, wd_)                                                                                                \
    if (k.dp == dp_ && k.wd == wd_)                                                                                \
        return apf_cfg<dp_, wd_>::smem_bytes;
    APF_KINDS(X)
#undef X
    return SIZE_MAX;
}

static int apf_rows(apf_kind k)
{
#define X(dp_, wd_)                                                                                                \
    if (k.dp == dp_ && k.wd == wd_)                                                                                \
        return apf_cfg<dp_, wd_>::M;
    APF_KINDS(X)
#undef X
    return 0;
}

berth_status cu_attention_prefill_fast(berth_backend *be, berth_stream *s, const berth_attention_params *p, bool *ran)
{
    *ran = false;
    /* read at every call, unlike the switches read at init (cuda_backend.cu): bench_cuda_attention flips it between
     * calls in one process to time both kernels side by side */
    const char *env = getenv("BERTH_CUDA_ATT_PREFILL");
    if (env && strcmp(env, "old") == 0)
        return BERTH_OK;
    const berth_kv_view *kv = &p->kv;
    const int64_t T = p->q.ne[2], H = p->q.ne[1];
    const int D = kv->head_dim, DV = kv->head_dim_v;
    /* What this kernel covers; everything else keeps attention.cu's kernels. */
    if (be->compute != CU_COMPUTE_BF16 || (kv->dtype != BERTH_DTYPE_BF16 && kv->dtype != BERTH_DTYPE_F16))
        return BERTH_OK;
    if (T <= 0 || H <= 0 || p->n_seqs <= 0 || kv->n_kv_heads <= 0 || H % kv->n_kv_heads != 0)
        return BERTH_OK;
    if (D <= 0 || DV <= 0 || D % 16 != 0 || DV % 16 != 0 || D > 512 || DV > 512)
        return BERTH_OK;
    const bool gate = p->gate.buf != nullptr;
    if (p->q.dtype != BERTH_DTYPE_F32 || p->out.dtype != BERTH_DTYPE_F32 ||
        (gate && p->gate.dtype != BERTH_DTYPE_F32))
        return BERTH_OK;
    const int64_t n_rep = H / kv->n_kv_heads;
    if (n_rep > CU_MAX_REP || T > INT32_MAX / CU_MAX_REP)
        return BERTH_OK;

    apf_args a = {};
    cu_attn_args_fill(a, p);
    a.bs_shift = cu_block_shift(kv->block_size);
    a.D = D;
    a.DV = DV;
    a.n_rep = (int32_t)n_rep;
    a.n_kv_heads = kv->n_kv_heads;
    a.T = (int32_t)T;
    a.n_seqs = p->n_seqs;
    a.sl2 = p->scale * 1.4426950408889634f;
    /* cp.async moves 16-byte pieces: K/V rows, strides and bases must be 16-byte aligned. */
    if (!cu_kv_aligned16(kv) || kv->block_size <= 0)
        return BERTH_OK;
    a.q_vec = (((uintptr_t)a.q | (uint64_t)p->q.nb[1] | (uint64_t)p->q.nb[2]) & 15u) == 0;
    a.out_vec = (((uintptr_t)a.out | (uint64_t)p->out.nb[1] | (uint64_t)p->out.nb[2]) & 15u) == 0;
    a.gate_vec = gate && (((uintptr_t)a.gate | (uint64_t)p->gate.nb[1] | (uint64_t)p->gate.nb[2]) & 15u) == 0;

    const apf_kind kind = apf_pick(D, DV);
    if (apf_smem(kind) + APF_STATIC_SMEM > be->smem_optin)
        return BERTH_OK;
    const int M = apf_rows(kind);
    /* Sum over sequences of ceil(rows * n_rep / M) <= ceil(T * n_rep / M) + n_seqs: a bound from shapes only. */
    const int64_t tiles = (T * n_rep + M - 1) / M + p->n_seqs;
    if (tiles * kv->n_kv_heads > INT32_MAX)
        return BERTH_OK;

    void *ws = nullptr;
    berth_status st = cu_stream_ws(be, s, ((size_t)p->n_seqs + 1) * sizeof(int32_t), &ws);
    if (st != BERTH_OK)
        return st;
    a.tile_start = (const int32_t *)ws;
    apf_plan_kernel<<<1, APF_PLAN_THREADS, 0, s->cs>>>(a.seq_q_start, a.n_seqs, a.T, a.n_rep, M, (int32_t *)ws);
    if ((st = cu_check_launch(be, "apf_plan_kernel")) != BERTH_OK)
        return st;
    const unsigned blocks = (unsigned)(tiles * kv->n_kv_heads);
    const bool f16 = kv->dtype == BERTH_DTYPE_F16;
    st = BERTH_E_BACKEND;
#define X(dp_, wd_)                                                                                                \
    if (kind.dp == dp_ && kind.wd == wd_)                                                                          \
        st = f16 ? apf_launch<dp_, wd_, true>(be, s, a, blocks) : apf_launch<dp_, wd_, false>(be, s, a, blocks);
    APF_KINDS(X)
#undef X
    if (st == BERTH_OK)
        *ran = true;
    return st;
}

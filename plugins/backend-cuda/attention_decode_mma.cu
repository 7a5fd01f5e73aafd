/*
 * attention_decode_mma.cu — the tensor-core decode path of ATTENTION (berth/backend.h): one query row per
 * sequence (T == n_seqs), BF16 compute mode, a bf16/f16 cache, head dims that are multiples of 16 up to 512, up
 * to 8 query heads per KV head. attention.cu's decode dispatch calls cu_attention_decode_mma() (which kernel
 * serves which call: the policy there); *ran = false means nothing was enqueued.
 *
 * Why: the other decode kernels (attention_decode.cu, attention.cu's split kernel) are fp32 SIMT: every key costs
 * each lane E widening conversions, E FMAs per head and a warp reduction, so at 32-128 sequences they stream K/V
 * at a third to a quarter of the memory bandwidth (bench/RESULTS.md). Here the dot products are tensor-core
 * products with the roles turned so that the 8 query heads of a KV head fill the MMA's N = 8 and nothing is
 * padded: S^T (keys x heads) = K Q^T, then O^T (dims x heads) += V^T P^T, both mma.sync m16n8k16 with fp32
 * accumulators. Decode is then a pure stream of K/V through shared memory.
 *
 * Work split (from shapes only, so a captured launch replays with any lengths): a block serves one (sequence, KV
 * head, split of the row's visible keys); the split count fills about one wave of the GPU and gives each split
 * at least a tile of keys; each row cuts its OWN visible range (read on the device) into that many pieces. A block
 * of 4 warps streams its keys in tiles of BN (32, 16 at head dim 512) through a 3-stage cp.async ring (two tiles
 * in flight from the start); at head dim 256, splits of two tiles at most (E2B's sliding layers at 8-32
 * sequences) go by default to the one-pass instance instead: the split's keys as one 64-key tile in one stage, so
 * the chain below runs once (BERTH_CUDA_ATT_ONEPASS, adm_fn_onepass); with BERTH_CUDA_ATT_D512_WARPS=8 the head
 * dim 512 instances have 8 warps (each an eighth where the text below says a quarter; eight parts of the scores,
 * added in warp order; the softmax on the first 4 warps). Per tile, three barriers:
 *   (A) tile t landed; tile t+2 is issued into the stage tile t-1 left;
 *   each warp contracts its quarter of the head dim: partial S^T of all BN keys x 8 heads (ldmatrix K as A, q^T
 *   fragments in registers as B), written to shared memory; (B) the softmax threads (16 per head) add the four
 *   quarters in a fixed order, scale/softcap/mask in log2 units, keep the head's running max and sum, write P^T
 *   rounded to the MMA type and each head's rescale factor; (C) each warp rescales and accumulates its quarter of
 *   the output dims: O^T += V^T (ldmatrix.trans) P^T.
 * Splits: each block writes its partial (unnormalised O, max, sum) to the stream's workspace; adm_merge_kernel,
 * launched right after (PDL), merges them in split order (deterministic), applies the gate and writes the output,
 * spread over the GPU. BERTH_CUDA_ATT_MERGE=last keeps the older way: each block counts itself in a per-(sequence,
 * KV head) counter of the stream (release/acquire at GPU scope, as gemv_norm.cuh) and the block that arrives last
 * resets the counter and merges. With one split the block writes the output directly.
 *
 * Arithmetic (the contract of attention.cu's tensor-core prefill, held by tests/cuda_ops/test_cuda_attention.c's
 * bound in BF16 mode): q and P rounded to the cache's type (nearest even), K and V used as stored; scale, softcap,
 * mask, the online softmax (exp2 of scores in log2 units), the sums of the ROUNDED P values and the merge in fp32.
 *
 * Robustness as attention.cu (metadata is device data, never read back): a sequence whose seq_q_start range is
 * not inside [0, T] is skipped (its rows of out, and of the x shadow the merge writes, keep what they held),
 * seq_kv_len is clamped to the block table's row, keys whose block-table entry is not a block of the pool are
 * zero-filled and masked (never dereferenced), rows that see no key write zeros. A split never takes more than the
 * launch's bound of keys (per_max): keys beyond it, possible only when max_kv_len understated the lengths, are
 * dropped rather than read past the table window in shared memory.
 */
#include "attention_args.cuh"
#include "cuda_device.cuh"
#include "cuda_internal.h"
#include "cuda_launch.cuh"
#include "cuda_mma.cuh"

#include <math.h>
#include <stdlib.h>
#include <string.h>

berth_status cu_attention_decode_mma(berth_backend *be, berth_stream *s, const berth_attention_params *p, bool *ran);
berth_status cu_attention_decode_mma_reserve(berth_backend *be, berth_stream *s, const berth_attention_params *p);

#define ADM_THREADS 128          /* threads of a block of 4 warps (the usual instances, the merge kernel): the softmax's
                                  * 16 threads per head */
#define ADM_D512_DP 512          /* the head-dim bucket BERTH_CUDA_ATT_D512_WARPS=8 serves with 8 warps a block */
#define ADM_HEADS 8              /* query heads per KV head the MMA's N covers (fewer: zero rows of q) */
#define ADM_STAGES 3
#define ADM_KMAX 2048            /* keys one split may take (its block-table window lives in shared memory) */
#define ADM_MAX_SPLITS 128
#define ADM_PART_BYTES (64u << 20) /* most workspace the split partials may take */

static_assert(ADM_THREADS == 16 * ADM_HEADS, "the softmax gives each head 16 threads");

/* STG: ring stages (ADM_STAGES; 2 in the instances for calls whose splits take at most two tiles, where the third
 * stage is never used: BERTH_CUDA_ATT_RING2; 1 in the one-pass instance, below). BNO: keys per tile when not 0
 * (the one-pass instance: a split's 64 keys as one tile, scored before one softmax: BERTH_CUDA_ATT_ONEPASS). NW:
 * warps per block, 4 but in the head-dim-512 instances of BERTH_CUDA_ATT_D512_WARPS=8 (each warp an eighth of the
 * head dim for S and of the output dims for PV: half the per-tile MMA chain per warp; the softmax stays on the
 * first 4 warps' 16 threads per head, the others wait at its barriers). */
template <int DP, int STG = ADM_STAGES, int BNO = 0, int NW = 4>
struct adm_cfg {
    static constexpr int NT = 32 * NW;              /* threads per block */
    static constexpr int BN0 = DP > 256 ? 16 : 32;  /* the usual keys per tile: ~32 KB of K and V per tile */
    static constexpr int BN = BNO ? BNO : BN0;      /* keys per tile */
    static constexpr int ST = DP + 8;             /* shared row stride (halves): ldmatrix conflict-free */
    static constexpr int DW = DP / NW;            /* head-dim columns per warp */
    static constexpr int PST = BN + 8;            /* P^T row stride (halves) */
    static constexpr size_t q_bytes = (size_t)ADM_HEADS * ST * 2;
    static constexpr size_t tile_bytes = (size_t)BN * ST * 2; /* one K or V tile */
    static constexpr size_t k_off = q_bytes;
    static constexpr size_t v_off = k_off + STG * tile_bytes;
    static constexpr size_t s_off = v_off + STG * tile_bytes; /* partial scores [NW][BN][8] fp32 */
    static constexpr size_t p_off = s_off + (size_t)NW * BN * ADM_HEADS * 4;
    static constexpr size_t bt_off = (p_off + (size_t)ADM_HEADS * PST * 2 + 15) & ~(size_t)15;
    static_assert(DW % 16 == 0 && BN % 16 == 0, "whole MMA tiles");
    static_assert(NW == 4 || NW == 8, "4 or 8 warps (the softmax takes the first 4)");
    static_assert((size_t)ADM_MAX_SPLITS * ADM_HEADS * 4 <= tile_bytes * STG, "merge weights fit stage K");
};

struct adm_args {
    const float *q;
    int64_t q_nb1, q_nb2; /* bytes */
    char *out;
    int64_t out_nb1, out_nb2;
    const char *gate; /* nullptr when absent */
    int64_t gate_nb1, gate_nb2;
    const int32_t *positions, *seq_q_start, *seq_kv_len, *block_table;
    int64_t bt_stride;
    int32_t bt_width;
    const char *kbase, *vbase;
    int64_t block_stride, token_stride, head_stride, v_token_stride, v_head_stride;
    int32_t block_size, bs_shift, n_blocks; /* bs_shift: log2(block_size), -1 when not a power of two */
    int32_t D, DV, n_rep, n_kv_heads, T;
    int32_t mask, window;
    float scale, softcap, sl2; /* sl2 = scale * log2(e) */
    int32_t ns;                /* splits per row */
    int32_t per_max;           /* most keys a split takes (a multiple of BN, <= ADM_KMAX) */
    int32_t bt_n;              /* block-table entries a split's window holds */
    int32_t out_vec;           /* out (and gate) rows 16-byte aligned */
    float *part_o;             /* [T][n_kv_heads][ns][8][DV] unnormalised outputs (ns > 1) */
    float2 *part_ml;           /* [T][n_kv_heads][ns][8] (max in log2 units, sum) */
    unsigned int *count;       /* [n_seqs * n_kv_heads] arrival counters, 0 between kernels (ns > 1) */
    int32_t late;              /* PDL trigger after the key loop (BERTH_CUDA_ATT_TRIGGER=late) */
    int32_t prewait;           /* metadata, block table and older keys' K/V before the PDL wait (attention_decode.cu) */
    unsigned long long *prof;  /* BERTH_CUDA_ATT_PROF=1: ADM_STAMPS global-timer stamps per block (NULL: none) */
    int32_t merge_kernel;      /* ns > 1: adm_merge_kernel merges the partials (no counters); 0: the last block */
    int32_t m_chunks;          /* adm_merge_kernel: blocks per (sequence, KV head) */
    uint16_t *ysh;             /* adm_merge_kernel: NULL, or out rounded to ysh_dt as well, row t at ysh + t * ldysh
                                * (the stream's x shadow for the o-projection next, cuda_internal.h) */
    int64_t ldysh;
    int32_t ysh_dt;
};

/* BERTH_CUDA_ATT_PROF=1 (a measurement switch, eager calls only): thread 0 of every block records the global timer
 * at each phase boundary (cu_att_prof_report prints them). */
#define ADM_STAMPS 7
#define ADM_STAMP(k) cu_att_stamp(a.prof, ADM_STAMPS, (k))

__device__ __forceinline__ float adm_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* Two 8 x 8 b16 matrices (lanes 0..15 give the row addresses). */
__device__ __forceinline__ void adm_ldsm2(uint32_t r[2], const uint16_t *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(cu_smem_addr(p)));
}

template <bool F16>
__device__ __forceinline__ uint16_t adm_round(float x)
{
    if constexpr (F16)
        return __half_as_ushort(__float2half_rn(x));
    else
        return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

template <bool F16>
__device__ __forceinline__ float adm_widen(uint16_t h)
{
    if constexpr (F16)
        return __half2float(__ushort_as_half(h));
    else
        return __uint_as_float((uint32_t)h << 16);
}

/* Block-table entry index of key j (entries count from the start of the row). */
__device__ __forceinline__ int32_t adm_entry(const adm_args &a, int32_t j)
{
    return a.bs_shift >= 0 ? j >> a.bs_shift : j / a.block_size;
}

/* The 16-byte pieces of keys [kt0, kt0 + BN) of K and V into stage st; zero-filled for keys past k1, keys whose
 * block is not in the pool and head dims past D / DV. Keys below k1 outside [jlo, jhi) are left alone. */
template <int DP, int STG = ADM_STAGES, int BNO = 0, int NW = 4>
__device__ __forceinline__ void adm_issue(const adm_args &a, unsigned char *sm, const int32_t *bt_s, int32_t e0,
                                          int32_t kt0, int32_t k1, int g, int st, int32_t jlo = INT32_MIN,
                                          int32_t jhi = INT32_MAX)
{
    using C = adm_cfg<DP, STG, BNO, NW>;
    constexpr int NT = C::NT;
    constexpr int CPR = DP / 8; /* pieces per row */
    uint16_t *Kd = (uint16_t *)(sm + C::k_off + st * C::tile_bytes);
    uint16_t *Vd = (uint16_t *)(sm + C::v_off + st * C::tile_bytes);
    /* A fixed trip count, rolled: unrolled by 4 (with its remainder loop) at five call sites this copy was 64 KB of
     * the kernel's 140 (machine code a kernel carries costs at every launch: bench/RESULTS.md session 17) */
    static_assert(C::BN * CPR % NT == 0, "every thread copies the same number of pieces");
#pragma unroll 1
    for (int k = 0; k < C::BN * CPR / NT; k++) {
        const int c = threadIdx.x + k * NT;
        const int r = c / CPR, ch = c % CPR;
        const int32_t j = kt0 + r;
        if (j < k1 && (j < jlo || j >= jhi)) /* another call copies this key (before / after the PDL wait); keys past
                                              * k1 are zero-filled by every call (zeros either way) */
            continue;
        const char *ks = a.kbase, *vs = a.vbase;
        bool ok = j < k1;
        if (ok) {
            const int32_t e = adm_entry(a, j) - e0;
            const int32_t b = e < a.bt_n ? bt_s[e] : -1;
            ok = b >= 0 && b < a.n_blocks;
            if (ok) {
                const int32_t off = a.bs_shift >= 0 ? j & (a.block_size - 1) : j % a.block_size;
                ks = a.kbase + (int64_t)b * a.block_stride + (int64_t)off * a.token_stride +
                     (int64_t)g * a.head_stride + ch * 16;
                vs = a.vbase + (int64_t)b * a.block_stride + (int64_t)off * a.v_token_stride +
                     (int64_t)g * a.v_head_stride + ch * 16;
            }
        }
        cu_cp16(Kd + r * C::ST + ch * 8, ks, ok && ch * 8 < a.D ? 16 : 0);
        cu_cp16(Vd + r * C::ST + ch * 8, vs, ok && ch * 8 < a.DV ? 16 : 0);
    }
}

/* Counts this block in *count (every thread calls it, after its partial stores); true in the block that arrived
 * last of n, which has reset the counter. */
__device__ __forceinline__ bool adm_arrive(unsigned int *count, int n)
{
    __shared__ unsigned int last;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned int prev;
        asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], 1;" : "=r"(prev) : "l"(count) : "memory");
        last = prev == (unsigned int)n - 1;
        if (last)
            asm volatile("st.relaxed.gpu.global.u32 [%0], 0;" ::"l"(count) : "memory");
    }
    __syncthreads();
    return last != 0;
}

/* v * sigmoid(gv), as a call: expf inlined at every output of the unrolled stores was a fifth of the kernel's
 * code, carried by every model's launches and run only by gated attention (machine code a kernel carries costs
 * at every launch: bench/RESULTS.md session 17). */
static __device__ __noinline__ float adm_gate_mul(float v, float gv)
{
    return v * (1.0f / (1.0f + expf(-gv)));
}

/* out[t, h0 + h, d] = v (times sigmoid(gate) when gated). */
__device__ __forceinline__ float adm_gated(const adm_args &a, int64_t t, int hq, int d, float v)
{
    if (a.gate) {
        const float gv = *(const float *)(a.gate + t * a.gate_nb2 + (int64_t)hq * a.gate_nb1 + (int64_t)d * 4);
        v = adm_gate_mul(v, gv);
    }
    return v;
}

// ---------------------------------------------------------------------------------------------------------------
// The kernel. Grid: ns * n_kv_heads * n_seqs blocks in one dimension, split fastest.

template <int DP, bool F16, bool MK, int STG, int BNO, int NW>
struct adm_min_blocks { /* __launch_bounds__'s second argument: 0 (none) but for the one-pass instance, whose
                         * shared memory allows two blocks an SM anyway: without it ptxas capped that instance at
                         * 128 registers and spilled (a helper's review, session 25); and the 8-warp instances,
                         * whose shared memory allows two blocks an SM too (~110 KiB), which 256 threads keep only
                         * at 128 registers or fewer */
    static constexpr int value = STG == 1 || NW == 8 ? 2 : 0;
};

template <int DP, bool F16, bool MK, int STG = ADM_STAGES, int BNO = 0, int NW = 4>
__global__ void __launch_bounds__(32 * NW, (adm_min_blocks<DP, F16, MK, STG, BNO, NW>::value))
    attn_decode_mma_kernel(const adm_args a)
{
    using C = adm_cfg<DP, STG, BNO, NW>;
    constexpr int NT = C::NT;
    /* the softmax's threads (16 per head): every thread of 4 warps, the first 4 warps of 8 (warp-uniform) */
#define ADM_SMX (NT == ADM_THREADS || tid < ADM_THREADS)
    static_assert(STG >= 1 && STG <= 3, "a ring of one to three stages");
    constexpr int PRE = STG < 2 ? STG : 2; /* tiles issued before the key loop */
    constexpr int BN = C::BN, ST = C::ST, DW = C::DW, PST = C::PST, H = ADM_HEADS;
    constexpr int MT = DW / 16; /* output m-tiles (16 dims) per warp */
    constexpr int KS = DW / 16; /* k-steps of S per warp */
    constexpr float LOG2E = 1.4426950408889634f;
    extern __shared__ __align__(16) unsigned char sm[];
    uint16_t *Qs = (uint16_t *)sm;
    float *Sred = (float *)(sm + C::s_off);
    uint16_t *Ps = (uint16_t *)(sm + C::p_off);
    int32_t *bt_s = (int32_t *)(sm + C::bt_off);
    __shared__ float alpha_s[H];
    __shared__ float2 ml_s[H];

    ADM_STAMP(0);
    if (!a.late)
        cu_pdl_trigger();
    bool waited = !a.prewait; /* every path below waits before it exits, writes or reads q (the ATT_PROF stamps
                               * excepted: a buffer only this kernel touches, zeroed by a synchronous call before) */
    if (waited) {
        cu_pdl_wait();
        ADM_STAMP(1);
    }

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const unsigned bx = blockIdx.x;
    const int split = (int)(bx % (unsigned)a.ns);
    const unsigned rest = bx / (unsigned)a.ns;
    const int g = (int)(rest % (unsigned)a.n_kv_heads);
    const int seq = (int)(rest / (unsigned)a.n_kv_heads);
    const int32_t q0 = a.seq_q_start[seq], q1 = a.seq_q_start[seq + 1];
    if (!cu_attn_rows_ok(a, q0, q1)) { /* the same in every block of this (sequence, KV head): none arrives */
        if (!waited)
            cu_pdl_wait();
        return;
    }
    const int32_t kv_len = cu_attn_kv_len(a, a.seq_kv_len[seq]);
    const int32_t *bt = a.block_table + (int64_t)seq * a.bt_stride;
    const int h0 = g * a.n_rep;
    const int sh = tid >> 4, sub = tid & 15; /* softmax: head sh, keys sub + 16 r */

    for (int32_t t = q0; t < q1; t++) {
        int32_t lo, hi;
        cu_attn_row_range(a.mask, a.window, a.positions[t], kv_len, &lo, &hi);
        int32_t per = (hi - lo + a.ns - 1) / a.ns;
        per = (per + C::BN0 - 1) / C::BN0 * C::BN0; /* the usual tiles' multiple: the same splits in every instance */
        per = per < a.per_max ? per : a.per_max;
        const int32_t k0 = lo + split * per;
        int32_t k1 = k0 + per < hi ? k0 + per : hi;
        k1 = k1 > k0 ? k1 : k0;
        const int ntiles = (k1 - k0 + BN - 1) / BN;
        const int32_t e0 = k1 > k0 ? adm_entry(a, k0) : 0;

        /* The split's block-table window; then its first two tiles go in flight while q is rounded into shared
         * memory (zeros past n_rep heads and past D). */
        {
            const int32_t ne = k1 > k0 ? adm_entry(a, k1 - 1) - e0 + 1 : 0;
            for (int i = tid; i < ne && i < a.bt_n; i += NT)
                bt_s[i] = e0 + i < a.bt_width ? bt[e0 + i] : -1;
        }
        __syncthreads();
        /* Before the PDL wait only keys of earlier steps: this batch appended keys safe_hi .. (kv_append, the
         * kernel before); those are copied after the wait. */
        const int32_t safe_hi = waited ? INT32_MAX : kv_len - (q1 - q0);
#pragma unroll 1
        for (int s0 = 0; s0 < PRE; s0++) { /* the first two tiles (one-pass: its one), one group each */
            if (ntiles > s0)
                adm_issue<DP, STG, BNO, NW>(a, sm, bt_s, e0, k0 + s0 * BN, k1, g, s0, INT32_MIN, safe_hi);
            cu_cp_commit();
        }
        if (!waited) {
            cu_pdl_wait();
            ADM_STAMP(1);
            waited = true;
            if (ntiles > 0 && k1 > safe_hi && k0 + PRE * BN > safe_hi) { /* the same in the whole block */
#pragma unroll 1
                for (int s0 = 0; s0 < PRE && s0 < ntiles; s0++)
                    adm_issue<DP, STG, BNO, NW>(a, sm, bt_s, e0, k0 + s0 * BN, k1, g, s0, safe_hi);
                cu_cp_commit();
                cu_cp_wait<0>(); /* that group came last: let both tiles land before the loop counts groups */
            }
        }
        {
            constexpr int QK = ADM_HEADS * (DP / 2) / NT; /* pairs of q per thread */
            static_assert(ADM_HEADS * (DP / 2) % NT == 0, "every thread rounds the same number of pairs");
            float x[QK][2];
#pragma unroll
            for (int k = 0; k < QK; k++) { /* all loads first: one round trip */
                const int i = tid + k * NT, h = i / (DP / 2), d = 2 * (i % (DP / 2));
                x[k][0] = x[k][1] = 0.0f;
                if (h < a.n_rep && d < a.D) {
                    const float *qr = (const float *)((const char *)a.q + (int64_t)t * a.q_nb2 +
                                                      (int64_t)(h0 + h) * a.q_nb1);
                    x[k][0] = qr[d];
                    x[k][1] = qr[d + 1]; /* D is even */
                }
            }
#pragma unroll
            for (int k = 0; k < QK; k++) {
                const int i = tid + k * NT, h = i / (DP / 2), d = 2 * (i % (DP / 2));
                Qs[h * ST + d] = adm_round<F16>(x[k][0]);
                Qs[h * ST + d + 1] = adm_round<F16>(x[k][1]);
            }
        }
        __syncthreads();

        ADM_STAMP(2);
        /* q^T fragments of this warp's head-dim quarter (eighth with 8 warps) (B operands of S^T = K q^T) */
        uint32_t qf[KS][2];
#pragma unroll
        for (int ks = 0; ks < KS; ks++)
            adm_ldsm2(qf[ks], Qs + (lane & 7) * ST + warp * DW + ks * 16 + ((lane >> 3) & 1) * 8);

        float o[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
            o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.0f;
        float m_run = -INFINITY, l_run = 0.0f; /* head sh, replicated over its 16 threads */

        for (int it = 0; it < ntiles; it++) {
            const int st = it % STG;
            if constexpr (STG == 3) {
                cu_cp_wait<1>();
                __syncthreads(); /* (A) tile it is visible; every thread is done with tile it - 1 */
                if (it + 2 < ntiles)
                    adm_issue<DP, STG, BNO, NW>(a, sm, bt_s, e0, k0 + (it + 2) * BN, k1, g, (it + 2) % STG);
                cu_cp_commit();
            } else if constexpr (STG == 2) { /* tile it + 1 (from tile 2 on; tiles 0 and 1 went before the loop)
                                              * goes into tile it - 1's stage once every thread is done with it,
                                              * one tile ahead instead of two */
                if (it == 0)
                    cu_cp_wait<1>();
                else
                    cu_cp_wait<0>();
                __syncthreads(); /* (A) */
                if (it >= 1 && it + 1 < ntiles)
                    adm_issue<DP, STG, BNO, NW>(a, sm, bt_s, e0, k0 + (it + 1) * BN, k1, g, (it + 1) % STG);
                cu_cp_commit();
            } else { /* one stage (the one-pass instance, whose splits are one tile: the loop runs once; a longer
                      * split, never planned, still comes out right, each further tile loaded after the last) */
                if (it > 0) {
                    __syncthreads(); /* every thread is done with tile it - 1 */
                    adm_issue<DP, STG, BNO, NW>(a, sm, bt_s, e0, k0 + it * BN, k1, g, 0);
                    cu_cp_commit();
                }
                cu_cp_wait<0>();
                __syncthreads(); /* (A) */
            }
            const uint16_t *Kt = (const uint16_t *)(sm + C::k_off + st * C::tile_bytes);
            const uint16_t *Vt = (const uint16_t *)(sm + C::v_off + st * C::tile_bytes);

            /* partial S^T over this warp's head-dim quarter (eighth) */
#pragma unroll
            for (int mt = 0; mt < BN / 16; mt++) {
                float sacc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int ks = 0; ks < KS; ks++) {
                    uint32_t af[4];
                    cu_ldsm4(af, Kt + (mt * 16 + (lane & 15)) * ST + warp * DW + ks * 16 + (lane >> 4) * 8);
                    cu_mma16816<F16>(sacc, af, qf[ks][0], qf[ks][1]);
                }
                float *sr = Sred + ((warp * BN + mt * 16 + (lane >> 2)) * H + 2 * (lane & 3));
                *(float2 *)sr = make_float2(sacc[0], sacc[1]);
                *(float2 *)(sr + 8 * H) = make_float2(sacc[2], sacc[3]);
            }
            __syncthreads(); /* (B) */

            /* softmax of head sh over the tile's keys sub, sub + 16, ... (the first 4 warps; the NW parts added in
             * warp order) */
            if (ADM_SMX) {
                constexpr int R = BN / 16;
                float sc[R];
                float tmax = -INFINITY;
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const int kt = sub + 16 * r;
                    const int32_t j = k0 + it * BN + kt;
                    float sv = Sred[(0 * BN + kt) * H + sh] + Sred[(1 * BN + kt) * H + sh];
#pragma unroll
                    for (int w = 2; w < NW; w++)
                        sv += Sred[(w * BN + kt) * H + sh];
                    if (a.softcap > 0.0f)
                        sv = a.softcap * tanhf(a.scale * sv / a.softcap) * LOG2E;
                    else
                        sv *= a.sl2;
                    bool vis = j < k1;
                    if (vis) {
                        const int32_t e = adm_entry(a, j) - e0;
                        const int32_t b = e < a.bt_n ? bt_s[e] : -1;
                        vis = b >= 0 && b < a.n_blocks;
                    }
                    sc[r] = vis ? sv : -INFINITY;
                    tmax = fmaxf(tmax, sc[r]);
                }
#pragma unroll
                for (int off = 8; off >= 1; off >>= 1)
                    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, off));
                const float m_new = fmaxf(m_run, tmax);
                const float alpha = m_new == -INFINITY ? 1.0f : adm_exp2(m_run - m_new);
                float psum = 0.0f;
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const float pv = m_new == -INFINITY ? 0.0f : adm_exp2(sc[r] - m_new);
                    const uint16_t pr = adm_round<F16>(pv);
                    Ps[sh * PST + sub + 16 * r] = pr;
                    psum += adm_widen<F16>(pr);
                }
#pragma unroll
                for (int off = 8; off >= 1; off >>= 1)
                    psum += __shfl_xor_sync(0xffffffffu, psum, off);
                l_run = l_run * alpha + psum;
                m_run = m_new;
                if (sub == 0)
                    alpha_s[sh] = alpha;
            }
            __syncthreads(); /* (C) */

            /* O^T (this warp's dims) = alpha O^T + V^T P^T */
            {
                const float al0 = alpha_s[2 * (lane & 3)], al1 = alpha_s[2 * (lane & 3) + 1];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    o[mt][0] *= al0;
                    o[mt][1] *= al1;
                    o[mt][2] *= al0;
                    o[mt][3] *= al1;
                }
#pragma unroll
                for (int ks = 0; ks < BN / 16; ks++) {
                    uint32_t pb[2];
                    adm_ldsm2(pb, Ps + (lane & 7) * PST + ks * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        uint32_t vf[4];
                        cu_ldsm4_t(vf, Vt + (ks * 16 + (lane & 7) + ((lane >> 4) & 1) * 8) * ST + warp * DW +
                                           mt * 16 + ((lane >> 3) & 1) * 8);
                        cu_mma16816<F16>(o[mt], vf, pb[0], pb[1]);
                    }
                }
            }
        }
        cu_cp_wait<0>();
        ADM_STAMP(3);
        if (a.late) /* the next kernel's early loads no longer compete with this one's */
            cu_pdl_trigger();

        /* this split's result for row t: the output itself (one split) or its partial */
        if (sub == 0 && ADM_SMX)
            ml_s[sh] = make_float2(m_run, l_run);
        __syncthreads();
        const int hA = 2 * (lane & 3), hB = hA + 1;
        if (a.ns == 1) {
            const float lA = ml_s[hA].y, lB = ml_s[hB].y;
            const float iA = lA > 0.0f ? 1.0f / lA : 0.0f, iB = lB > 0.0f ? 1.0f / lB : 0.0f;
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int d = warp * DW + mt * 16 + (lane >> 2) + (e >= 2 ? 8 : 0);
                    const int h = e & 1 ? hB : hA;
                    if (h < a.n_rep && d < a.DV) {
                        const float v = adm_gated(a, t, h0 + h, d, o[mt][e] * (e & 1 ? iB : iA));
                        *(float *)(a.out + (int64_t)t * a.out_nb2 + (int64_t)(h0 + h) * a.out_nb1 +
                                   (int64_t)d * 4) = v;
                    }
                }
        } else {
            const int64_t slot = ((int64_t)t * a.n_kv_heads + g) * a.ns + split;
            float *po = a.part_o + slot * H * a.DV;
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int d = warp * DW + mt * 16 + (lane >> 2) + (e >= 2 ? 8 : 0);
                    const int h = e & 1 ? hB : hA;
                    if (d < a.DV)
                        po[(int64_t)h * a.DV + d] = o[mt][e];
                }
            if (tid < H)
                a.part_ml[slot * H + tid] = ml_s[tid];
        }
        __syncthreads(); /* Qs, bt_s, ml_s and the stages are free for the next row */
    }
    if constexpr (MK) { /* adm_merge_kernel, launched after this one, merges; this instance carries no code for
                         * merging by the last block (machine code a kernel carries costs at every launch:
                         * bench/RESULTS.md session 17) */
        ADM_STAMP(4);
        return;
    }
    const bool last = a.ns > 1 && adm_arrive(a.count + (int64_t)seq * a.n_kv_heads + g, a.ns);
    ADM_STAMP(4);
    if (!last)
        return;

    /* The last block of this (sequence, KV head): merge every row's splits in split order. */
    float *wgt = (float *)(sm + C::k_off); /* [ns][8]: each split's weight in the final output */
    for (int32_t t = q0; t < q1; t++) {
        const int64_t slot0 = ((int64_t)t * a.n_kv_heads + g) * a.ns;
        if (ADM_SMX) {
            float mx = -INFINITY;
            for (int sp = sub; sp < a.ns; sp += 16)
                mx = fmaxf(mx, __ldcg(&a.part_ml[(slot0 + sp) * H + sh].x));
#pragma unroll
            for (int off = 8; off >= 1; off >>= 1)
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            float l = 0.0f;
            for (int sp = sub; sp < a.ns; sp += 16) {
                const float2 ml = __ldcg(&a.part_ml[(slot0 + sp) * H + sh]);
                const float w = ml.x == -INFINITY ? 0.0f : adm_exp2(ml.x - mx);
                wgt[sp * H + sh] = w;
                l += w * ml.y;
            }
#pragma unroll
            for (int off = 8; off >= 1; off >>= 1)
                l += __shfl_xor_sync(0xffffffffu, l, off);
            if (sub == 0)
                alpha_s[sh] = l > 0.0f ? 1.0f / l : 0.0f;
        }
        __syncthreads();
        ADM_STAMP(5);
        /* Each thread 4 output float4s, the splits 4 at a time: 16 loads in flight per round trip, summed in split
         * order. Every split wrote its partial (zeros when it saw no key), so every load is of written data. */
        const int c4n = a.DV / 4; /* DV is a multiple of 16 */
        const int total = a.n_rep * c4n;
        const int64_t sst = (int64_t)H * a.DV / 4; /* float4s from one split's partial to the next's */
        const float4 *pb = (const float4 *)(a.part_o + slot0 * H * a.DV);
        for (int i0 = tid; i0 < total; i0 += 4 * NT) {
            int hh[4], cc[4];
            float4 acc[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int i = i0 + u * NT;
                hh[u] = i < total ? i / c4n : -1;
                cc[u] = i < total ? i % c4n : 0;
                acc[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
            for (int sp = 0; sp < a.ns; sp += 4) {
                float4 v[4][4];
#pragma unroll
                for (int q = 0; q < 4; q++)
#pragma unroll
                    for (int u = 0; u < 4; u++)
                        v[q][u] = sp + q < a.ns && hh[u] >= 0
                                      ? __ldcg(pb + (sp + q) * sst + (int64_t)hh[u] * c4n + cc[u])
                                      : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
                for (int q = 0; q < 4; q++)
#pragma unroll
                    for (int u = 0; u < 4; u++) {
                        const float w = sp + q < a.ns && hh[u] >= 0 ? wgt[(sp + q) * H + hh[u]] : 0.0f;
                        acc[u].x = fmaf(w, v[q][u].x, acc[u].x);
                        acc[u].y = fmaf(w, v[q][u].y, acc[u].y);
                        acc[u].z = fmaf(w, v[q][u].z, acc[u].z);
                        acc[u].w = fmaf(w, v[q][u].w, acc[u].w);
                    }
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                if (hh[u] < 0)
                    continue;
                const int h = hh[u], d = 4 * cc[u];
                const float li = alpha_s[h];
                float r[4] = {acc[u].x * li, acc[u].y * li, acc[u].z * li, acc[u].w * li};
#pragma unroll
                for (int e = 0; e < 4; e++)
                    r[e] = adm_gated(a, t, h0 + h, d + e, r[e]);
                float *orow = (float *)(a.out + (int64_t)t * a.out_nb2 + (int64_t)(h0 + h) * a.out_nb1) + d;
                if (a.out_vec) {
                    *(float4 *)orow = make_float4(r[0], r[1], r[2], r[3]);
                } else {
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        orow[e] = r[e];
                }
            }
        }
        __syncthreads();
    }
    ADM_STAMP(6);
#undef ADM_SMX
}

// ---------------------------------------------------------------------------------------------------------------
// The split merge as a kernel of its own (BERTH_CUDA_ATT_MERGE=kernel, the default). Why: merged by the last block
// of each (sequence, KV head), the weighted sum over the splits' partials (64 KB per pair at head dim 256, 8
// splits) runs through one SM per pair after that pair's key loop, and at 32 sequences it took about half of the
// kernel's time (bench/RESULTS.md, session 10). Here every thread owns one float4 of one head's output, so a pair's
// merge is spread over m_chunks blocks across the GPU. Grid: m_chunks * n_kv_heads * n_seqs blocks of
// ADM_THREADS, chunk fastest. The sum runs in split order (deterministic).
// The chain after the PDL wait is what this kernel costs in a decode step (docs/cuda-decode-step.md): with
// a.prewait the sequence's row range is read before the wait (the attention kernel's own rule: the host copied the
// metadata before the step), and up to ADM_MERGE_BATCH splits' statistics and partials are loaded in one batch, so
// the wait is followed by one round trip to L2 and the stores. More splits take the two-pass loop (max, then sum);
// both give the same bits for the same splits (same operations in the same order).

#define ADM_MERGE_BATCH 8

__global__ void __launch_bounds__(ADM_THREADS) adm_merge_kernel(const adm_args a)
{
    cu_pdl_trigger();
    if (!a.prewait)
        cu_pdl_wait(); /* the partials (and, without prewait, everything else read here) come from before */
    const unsigned bx = blockIdx.x;
    const int chunk = (int)(bx % (unsigned)a.m_chunks);
    const unsigned rest = bx / (unsigned)a.m_chunks;
    const int g = (int)(rest % (unsigned)a.n_kv_heads);
    const int seq = (int)(rest / (unsigned)a.n_kv_heads);
    const int32_t q0 = a.seq_q_start[seq], q1 = a.seq_q_start[seq + 1];
    if (a.prewait)
        cu_pdl_wait(); /* on every path (cuda_launch.cuh), threads without work included */
    if (!cu_attn_rows_ok(a, q0, q1))
        return;
    const int c4n = a.DV / 4; /* DV is a multiple of 16 */
    const int i = chunk * ADM_THREADS + (int)threadIdx.x;
    if (i >= a.n_rep * c4n)
        return;
    const int h = i / c4n, d = 4 * (i % c4n);
    const int64_t sst = (int64_t)ADM_HEADS * a.DV / 4; /* float4s from one split's partial to the next's */
    for (int32_t t = q0; t < q1; t++) {
        const int64_t slot0 = ((int64_t)t * a.n_kv_heads + g) * a.ns;
        const float2 *ml = a.part_ml + slot0 * ADM_HEADS + h;
        const float4 *po = (const float4 *)(a.part_o + slot0 * ADM_HEADS * a.DV) + (int64_t)h * c4n + d / 4;
        float mx = -INFINITY, l = 0.0f;
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (a.ns <= ADM_MERGE_BATCH) {
            float2 mb[ADM_MERGE_BATCH];
            float4 vb[ADM_MERGE_BATCH];
#pragma unroll
            for (int sp = 0; sp < ADM_MERGE_BATCH; sp++) /* every load before any use */
                if (sp < a.ns) {
                    mb[sp] = __ldcg(&ml[sp * ADM_HEADS]);
                    vb[sp] = __ldcg(po + sp * sst);
                }
#pragma unroll
            for (int sp = 0; sp < ADM_MERGE_BATCH; sp++)
                if (sp < a.ns)
                    mx = fmaxf(mx, mb[sp].x);
#pragma unroll
            for (int sp = 0; sp < ADM_MERGE_BATCH; sp++)
                if (sp < a.ns) {
                    const float w = mb[sp].x == -INFINITY ? 0.0f : adm_exp2(mb[sp].x - mx);
                    l = fmaf(w, mb[sp].y, l);
                    acc.x = fmaf(w, vb[sp].x, acc.x);
                    acc.y = fmaf(w, vb[sp].y, acc.y);
                    acc.z = fmaf(w, vb[sp].z, acc.z);
                    acc.w = fmaf(w, vb[sp].w, acc.w);
                }
        } else {
#pragma unroll 8
            for (int sp = 0; sp < a.ns; sp++)
                mx = fmaxf(mx, __ldcg(&ml[sp * ADM_HEADS].x));
#pragma unroll 8
            for (int sp = 0; sp < a.ns; sp++) {
                const float2 m = __ldcg(&ml[sp * ADM_HEADS]);
                const float4 v = __ldcg(po + sp * sst);
                const float w = m.x == -INFINITY ? 0.0f : adm_exp2(m.x - mx);
                l = fmaf(w, m.y, l);
                acc.x = fmaf(w, v.x, acc.x);
                acc.y = fmaf(w, v.y, acc.y);
                acc.z = fmaf(w, v.z, acc.z);
                acc.w = fmaf(w, v.w, acc.w);
            }
        }
        const float li = l > 0.0f ? 1.0f / l : 0.0f;
        float r[4] = {acc.x * li, acc.y * li, acc.z * li, acc.w * li};
#pragma unroll
        for (int e = 0; e < 4; e++)
            r[e] = adm_gated(a, t, g * a.n_rep + h, d + e, r[e]);
        float *orow = (float *)(a.out + (int64_t)t * a.out_nb2 + (int64_t)(g * a.n_rep + h) * a.out_nb1) + d;
        if (a.out_vec) {
            *(float4 *)orow = make_float4(r[0], r[1], r[2], r[3]);
        } else {
#pragma unroll
            for (int e = 0; e < 4; e++)
                orow[e] = r[e];
        }
        if (a.ysh) /* heads contiguous in a row (the host checked): the row's element (g n_rep + h) DV + d */
#pragma unroll
            for (int e = 0; e < 4; e++)
                cu_st(a.ysh, a.ysh_dt, (int64_t)t * a.ldysh + (int64_t)(g * a.n_rep + h) * a.DV + d + e, r[e]);
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Host side.

#define ADM_CACHE_DEVICES 16
struct adm_cache {
    int bps[ADM_CACHE_DEVICES]; /* resident blocks per SM at the largest table window, 0: not set up */
};

template <int DP, bool F16, int STG, int BNO = 0, int NW = 4>
static void (*adm_fn(bool mk))(const adm_args)
{
    return mk ? attn_decode_mma_kernel<DP, F16, true, STG, BNO, NW>
              : attn_decode_mma_kernel<DP, F16, false, STG, BNO, NW>;
}

/* The instance for head-dim bucket dp (adm_dp), cache dtype, merge mode, ring stages (2 or 3) and warps per block
 * (adm_warps: 8 only at head dim 512). */
template <int STG>
static void (*adm_fn_of(int dp, bool f16, bool mk, int nw))(const adm_args)
{
    switch (dp) {
    case 64: return f16 ? adm_fn<64, true, STG>(mk) : adm_fn<64, false, STG>(mk);
    case 128: return f16 ? adm_fn<128, true, STG>(mk) : adm_fn<128, false, STG>(mk);
    case 256: return f16 ? adm_fn<256, true, STG>(mk) : adm_fn<256, false, STG>(mk);
    default:
        if (nw == 8)
            return f16 ? adm_fn<ADM_D512_DP, true, STG, 0, 8>(mk) : adm_fn<ADM_D512_DP, false, STG, 0, 8>(mk);
        return f16 ? adm_fn<512, true, STG>(mk) : adm_fn<512, false, STG>(mk);
    }
}

/* Warps per block of the instance for head-dim bucket dp: 8 at head dim 512 with BERTH_CUDA_ATT_D512_WARPS=8. */
static int adm_warps(const berth_backend *be, int dp)
{
    return dp == ADM_D512_DP && be->att_d512_warps == 8 ? 8 : 4;
}

static int adm_dp(int dmax)
{
    return dmax <= 64 ? 64 : dmax <= 128 ? 128 : dmax <= 256 ? 256 : 512;
}

template <int STG>
static size_t adm_bt_off(int dp, int nw)
{
    switch (dp) {
    case 64: return adm_cfg<64, STG>::bt_off;
    case 128: return adm_cfg<128, STG>::bt_off;
    case 256: return adm_cfg<256, STG>::bt_off;
    default: return nw == 8 ? adm_cfg<ADM_D512_DP, STG, 0, 8>::bt_off : adm_cfg<512, STG>::bt_off;
    }
}

static size_t adm_smem(int dp, int bt_n, int stg = ADM_STAGES, int nw = 4)
{
    const size_t off = stg == 2 ? adm_bt_off<2>(dp, nw) : adm_bt_off<ADM_STAGES>(dp, nw);
    return off + (((size_t)bt_n * 4 + 15) & ~(size_t)15);
}

/* The one-pass instance (BERTH_CUDA_ATT_ONEPASS): head dim 256, splits of up to 64 keys (two of the usual tiles)
 * as one tile in one stage, so each split runs the tile chain (barrier, scores, barrier, softmax, barrier, PV)
 * once instead of twice. Its K and V stage take the shared memory of the two-stage ring's two stages (~81 KiB a
 * block: two blocks an SM, as the three-stage default; the two-stage instance fits three). The keys of a split are
 * the other instances' (per rounded to their 32-key tiles); its P is rounded against the maximum over the split's
 * 64 keys rather than over the first 32, so results agree within the rounding contract, not bit for bit. */
#define ADM_ONEPASS_DP 256
#define ADM_ONEPASS_BN 64
static void (*adm_fn_onepass(bool f16, bool mk))(const adm_args)
{
    return f16 ? adm_fn<ADM_ONEPASS_DP, true, 1, ADM_ONEPASS_BN>(mk)
               : adm_fn<ADM_ONEPASS_DP, false, 1, ADM_ONEPASS_BN>(mk);
}

static size_t adm_smem_onepass(int bt_n)
{
    return adm_cfg<ADM_ONEPASS_DP, 1, ADM_ONEPASS_BN>::bt_off + (((size_t)bt_n * 4 + 15) & ~(size_t)15);
}

static int adm_bn(int dp)
{
    return dp > 256 ? adm_cfg<512>::BN : adm_cfg<256>::BN;
}

/* Keys one row can see, as the launch is sized: the block table's capacity while capturing (a recorded graph
 * replays with any lengths), max_kv_len otherwise; the window caps both. */
static int64_t adm_key_bound(const berth_backend *be, const berth_attention_params *p, int64_t *cap_out)
{
    const berth_kv_view *kv = &p->kv;
    const int64_t cap = (int64_t)p->block_table.ne[0] * kv->block_size;
    int64_t kvb = be->capturing ? cap : (p->max_kv_len < cap ? p->max_kv_len : cap);
    if (p->mask == BERTH_MASK_CAUSAL && p->window > 0 && p->window < kvb)
        kvb = p->window;
    *cap_out = p->mask == BERTH_MASK_CAUSAL && p->window > 0 && p->window < cap ? p->window : cap;
    return kvb > 0 ? kvb : 0;
}

/* Splits per row for kvb keys: about one wave of blocks (bps per SM), two tiles of keys at least per split, at most
 * ADM_KMAX keys per split; 0 when more than ADM_MAX_SPLITS would be needed. */
static int adm_splits(const berth_backend *be, int64_t kvb, int64_t base, int bps, int bn)
{
    const int64_t wave = (int64_t)(be->n_sms > 0 ? be->n_sms : 132) * (bps > 0 ? bps : 1);
    int64_t ns = base < wave ? wave / base : 1;
    const int64_t by_len = (kvb + 2 * bn - 1) / (2 * bn); /* two tiles at least: fewer partials to merge */
    ns = ns < by_len ? ns : by_len;
    const int64_t need = (kvb + ADM_KMAX - 1) / ADM_KMAX;
    ns = ns > need ? ns : need;
    if (ns > ADM_MAX_SPLITS)
        return 0;
    return ns < 1 ? 1 : (int)ns;
}

/* BERTH_CUDA_ATT_PROF's host side, shared with attention_decode.cu (attention_args.cuh). This kernel's stamps: 0
 * start, 1 after the PDL wait, 2 q in shared memory, 3 keys done, 4 partial written and counted, 5 the merge's
 * weights (last blocks), 6 merge done; with several rows per sequence stamps 2, 3 and 5 are the last row's. */
static int adm_cmp_double(const void *x, const void *y)
{
    const double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

unsigned long long *cu_att_prof_buffer(berth_backend *be, berth_stream *s, int64_t blocks, int stamps)
{
    (void)be;
    const int64_t need = blocks * stamps; /* att_prof_cap counts stamps */
    if (s->att_prof_cap < need) {
        if (s->att_prof)
            (void)cudaFree(s->att_prof);
        s->att_prof = nullptr;
        s->att_prof_cap = 0;
        const size_t bytes = (size_t)need * sizeof *s->att_prof;
        if (cudaMalloc((void **)&s->att_prof, bytes) == cudaSuccess &&
            cudaMemsetAsync(s->att_prof, 0, bytes, s->cs) == cudaSuccess) /* in stream order before the call */
            s->att_prof_cap = need;
        else
            (void)cudaGetLastError(); /* no stamps this call; not a launch error */
    }
    return s->att_prof_cap >= need ? s->att_prof : nullptr;
}

unsigned long long *cu_att_prof_for(berth_backend *be, berth_stream *s, int64_t blocks, int stamps, const char *what)
{
    if (be->att_prof == CU_ATT_PROF_EAGER && !be->capturing)
        return cu_att_prof_buffer(be, s, blocks, stamps);
    return cu_att_prof_graph(be, s, blocks, stamps, what); /* NULL unless =graph and capturing */
}

/* Appends to msg (n characters so far, cap in all) " K:MIN/MED/MAX(COUNT)" per stamp K of t ([blocks][stamps]
 * global-timer values), in us from origin, over the blocks whose stamp is at least floor (0 reads "never written");
 * v: room for `blocks` values. Returns the new length. */
static int adm_stamp_line(char *msg, int cap, int n, const unsigned long long *t, int blocks, int stamps,
                          unsigned long long floor, unsigned long long origin, double *v)
{
    for (int k = 0; k < stamps && n > 0 && n < cap; k++) {
        int c = 0;
        for (int b = 0; b < blocks; b++) {
            const unsigned long long x = t[(size_t)b * stamps + k];
            if (x && x >= floor)
                v[c++] = (double)(x - origin) / 1000.0;
        }
        if (c == 0)
            continue;
        qsort(v, (size_t)c, sizeof *v, adm_cmp_double);
        n += snprintf(msg + n, (size_t)(cap - n), " %d:%.2f/%.2f/%.2f(%d)", k, v[0], v[c / 2], v[c - 1], c);
    }
    return n;
}

berth_status cu_att_prof_report(berth_backend *be, berth_stream *s, unsigned long long *prof, int blocks, int stamps,
                                const char *what)
{
    berth_status st = cu_check(be, cudaStreamSynchronize(s->cs), "cudaStreamSynchronize (BERTH_CUDA_ATT_PROF)");
    const size_t n_st = (size_t)blocks * stamps;
    unsigned long long *t = (unsigned long long *)malloc(n_st * sizeof *t);
    double *v = (double *)malloc((size_t)blocks * sizeof *v);
    if (st != BERTH_OK || !t || !v || cudaMemcpy(t, prof, n_st * sizeof *t, cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaMemsetAsync(prof, 0, n_st * sizeof *t, s->cs) != cudaSuccess) {
        (void)cudaGetLastError();
        free(t);
        free(v);
        return st;
    }
    unsigned long long t0 = ~0ull;
    for (int b = 0; b < blocks; b++)
        if (t[(size_t)b * stamps] && t[(size_t)b * stamps] < t0)
            t0 = t[(size_t)b * stamps];
    char msg[600];
    const int n = snprintf(msg, sizeof msg, "%s: stamp min/med/max us:", what);
    adm_stamp_line(msg, (int)sizeof msg, n, t, blocks, stamps, 1, t0, v);
    free(v);
    free(t);
    if (be->host && be->host->log)
        be->host->log(be->host->ctx, BERTH_LOG_WARN, msg);
    return BERTH_OK;
}

unsigned long long *cu_att_prof_graph(berth_backend *be, berth_stream *s, int64_t blocks, int stamps, const char *what)
{
    if (be->att_prof != CU_ATT_PROF_GRAPH || !be->capturing || !s->gprof ||
        blocks * stamps > CU_GPROF_STAMPS - s->gprof_used)
        return nullptr;
    if (s->gprof_n == s->gprof_cap) {
        const int cap = s->gprof_cap ? 2 * s->gprof_cap : 256;
        cu_gprof_region *r = (cu_gprof_region *)realloc(s->gprof_reg, (size_t)cap * sizeof *r);
        if (!r)
            return nullptr;
        s->gprof_reg = r;
        s->gprof_cap = cap;
    }
    cu_gprof_region *r = &s->gprof_reg[s->gprof_n++];
    r->off = s->gprof_used;
    r->blocks = (int32_t)blocks;
    r->stamps = stamps;
    r->graph = s->gprof_graph;
    snprintf(r->what, sizeof r->what, "%s", what);
    s->gprof_used += blocks * stamps;
    return s->gprof + r->off;
}

void cu_att_prof_graph_report(berth_backend *be, berth_stream *s)
{
    if (!s->gprof_n || !s->gprof)
        return;
    unsigned long long *t = (unsigned long long *)malloc((size_t)s->gprof_used * sizeof *t);
    int64_t most = 0;
    for (int i = 0; i < s->gprof_n; i++)
        most = s->gprof_reg[i].blocks > most ? s->gprof_reg[i].blocks : most;
    double *v = (double *)malloc((size_t)(most > 0 ? most : 1) * sizeof *v);
    if (t && v && cudaStreamSynchronize(s->cs) == cudaSuccess &&
        cudaMemcpy(t, s->gprof, (size_t)s->gprof_used * sizeof *t, cudaMemcpyDeviceToHost) == cudaSuccess) {
        for (int i0 = 0; i0 < s->gprof_n;) { /* one graph's regions: i0 .. i1 - 1 (capture order) */
            int i1 = i0;
            unsigned long long t0 = ~0ull;
            while (i1 < s->gprof_n && s->gprof_reg[i1].graph == s->gprof_reg[i0].graph) {
                const cu_gprof_region *r = &s->gprof_reg[i1++];
                for (int64_t k = 0; k < (int64_t)r->blocks * r->stamps; k++)
                    if (t[r->off + k] && t[r->off + k] < t0)
                        t0 = t[r->off + k];
            }
            for (int i = i0; i < i1 && t0 != ~0ull; i++) {
                const cu_gprof_region *r = &s->gprof_reg[i];
                char msg[700];
                const int n = snprintf(msg, sizeof msg, "graph %d #%d %s: stamp min/med/max us:", r->graph, i - i0,
                                       r->what);
                adm_stamp_line(msg, (int)sizeof msg, n, t + r->off, r->blocks, r->stamps, t0, t0, v);
                if (be->host && be->host->log)
                    be->host->log(be->host->ctx, BERTH_LOG_WARN, msg);
            }
            i0 = i1;
        }
    }
    (void)cudaGetLastError();
    free(t);
    free(v);
    free(s->gprof_reg);
    s->gprof_reg = nullptr;
    s->gprof_n = s->gprof_cap = 0;
}

/* The call, or with reserve_only just the workspace a capture of it would need (nothing enqueued). */
static berth_status adm_run(berth_backend *be, berth_stream *s, const berth_attention_params *p, bool *ran,
                            bool reserve_only)
{
    *ran = false;
    const berth_kv_view *kv = &p->kv;
    const int64_t T = p->q.ne[2], H = p->q.ne[1];
    const int D = kv->head_dim, DV = kv->head_dim_v;
    if (be->compute != CU_COMPUTE_BF16 || (kv->dtype != BERTH_DTYPE_BF16 && kv->dtype != BERTH_DTYPE_F16))
        return BERTH_OK;
    if (T != p->n_seqs || T <= 0 || H <= 0 || kv->n_kv_heads <= 0 || H % kv->n_kv_heads != 0 ||
        kv->block_size <= 0)
        return BERTH_OK;
    if (D <= 0 || DV <= 0 || D % 16 != 0 || DV % 16 != 0 || D > 512 || DV > 512)
        return BERTH_OK;
    const int64_t n_rep = H / kv->n_kv_heads;
    if (n_rep > ADM_HEADS)
        return BERTH_OK;
    const bool gate = p->gate.buf != nullptr;
    if (p->q.dtype != BERTH_DTYPE_F32 || p->out.dtype != BERTH_DTYPE_F32 ||
        (gate && p->gate.dtype != BERTH_DTYPE_F32))
        return BERTH_OK;
    if (!cu_kv_aligned16(kv) || !s->att_count)
        return BERTH_OK;

    const int dp = adm_dp(D > DV ? D : DV), bn = adm_bn(dp);
    const bool f16 = kv->dtype == BERTH_DTYPE_F16;
    const bool mk = be->att_merge_kernel != 0; /* merged by adm_merge_kernel: no counters needed */
    const int nw = adm_warps(be, dp), nt = 32 * nw; /* BERTH_CUDA_ATT_D512_WARPS */
    void (*fn)(const adm_args) = adm_fn_of<ADM_STAGES>(dp, f16, mk, nw);

    /* Set up once per device at the largest shared memory any call of this instance asks for (a table window of
     * ADM_KMAX keys at block size 1), so that occupancy is one number per instance. */
    static adm_cache caches[2][2][5];
    int *slot = be->device >= 0 && be->device < ADM_CACHE_DEVICES
                    ? &caches[mk][f16][dp == 64 ? 0 : dp == 128 ? 1 : dp == 256 ? 2 : nw == 8 ? 4 : 3].bps[be->device]
                    : nullptr;
    int bps = slot ? __atomic_load_n(slot, __ATOMIC_ACQUIRE) : 0;
    const size_t smem_max = adm_smem(dp, ADM_KMAX + 2, ADM_STAGES, nw);
    if (smem_max > be->smem_optin)
        return BERTH_OK;
    if (bps <= 0) {
        berth_status st = cu_check(be, cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                            (int)smem_max),
                                   "cudaFuncSetAttribute (attn_decode_mma_kernel shared memory)");
        if (st != BERTH_OK)
            return st;
        int b = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, fn, nt, adm_smem(dp, 256 / 16 + 2, ADM_STAGES, nw)) !=
                cudaSuccess ||
            b < 1) {
            (void)cudaGetLastError();
            b = 1;
        }
        bps = b;
        if (slot)
            __atomic_store_n(slot, bps, __ATOMIC_RELEASE);
    }

    int64_t cap = 0;
    const int64_t kvb = adm_key_bound(be, p, &cap);
    const int64_t base = (int64_t)p->n_seqs * kv->n_kv_heads;
    const int wbps = be->att_mma_bps > 0 ? be->att_mma_bps : bps; /* BERTH_CUDA_ATT_MMA_BPS: tuning runs */
    int ns = adm_splits(be, kvb, base, wbps, bn);
    const int ns_ws = adm_splits(be, cap, base, wbps, bn); /* the workspace is sized for the capacity bound */
    if (reserve_only) { /* the capture sizes by the table's capacity: reserve that now (no growth while capturing) */
        ns = ns_ws;
        if (ns == 0 || (ns > 1 && !mk && base > CU_ATT_COUNTERS))
            return BERTH_OK;
    }
    if (ns == 0 || ns_ws == 0)
        return BERTH_OK;
    if (ns > 1 && !mk && base > CU_ATT_COUNTERS)
        return BERTH_OK; /* more (sequence, KV head) pairs than counters: the other kernels serve it */
    int64_t per_max = (kvb + ns - 1) / ns;
    per_max = (per_max + bn - 1) / bn * bn;
    per_max = per_max > bn ? per_max : bn;
    if (per_max > ADM_KMAX)
        return BERTH_OK;
    const int bt_n = (int)((per_max + kv->block_size - 1) / kv->block_size + 1);
    size_t smem = adm_smem(dp, bt_n, ADM_STAGES, nw);
    /* Another instance for the same splits (one of the two below): its shared-memory attribute set to the largest
     * any call of it asks for, as the three-stage instance's (not while only reserving: graphs keep theirs). */
    auto use = [&](void (*f)(const adm_args), size_t f_smem, size_t f_smem_max) -> berth_status {
        if (!reserve_only) {
            berth_status st = cu_check(be, cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                                (int)f_smem_max),
                                       "cudaFuncSetAttribute (attn_decode_mma_kernel shared memory)");
            if (st != BERTH_OK)
                return st;
        }
        fn = f;
        smem = f_smem;
        return BERTH_OK;
    };
    /* BERTH_CUDA_ATT_ONEPASS (over BERTH_CUDA_ATT_RING2 where both apply): splits of two tiles at most at head
     * dim 256 whose bound is two (E2B's sliding layers at 8-32 sequences) on the one-pass instance: the same
     * splits, one tile each. Its table window: per_max keys at block size 1 at most, plus the entry a split may
     * straddle. BERTH_CUDA_ATT_RING2: splits of at most two tiles never use the ring's third stage; the two-stage
     * instance asks for a third less shared memory (d256: ~77 instead of 108 KiB), so that more of its blocks get
     * resident beside the kernels before it under PDL (bench/RESULTS.md session 21). The split count stays the
     * three-stage instance's either way. */
    berth_status use_st = BERTH_OK;
    if (be->att_onepass && dp == ADM_ONEPASS_DP && per_max == ADM_ONEPASS_BN && bn * 2 == ADM_ONEPASS_BN)
        use_st = use(adm_fn_onepass(f16, mk), adm_smem_onepass(bt_n), adm_smem_onepass(ADM_ONEPASS_BN + 2));
    else if (be->att_ring2 && per_max <= 2 * bn)
        use_st = use(adm_fn_of<2>(dp, f16, mk, nw), adm_smem(dp, bt_n, 2, nw), adm_smem(dp, ADM_KMAX + 2, 2, nw));
    if (use_st != BERTH_OK)
        return use_st;
    const int64_t blocks = (int64_t)ns * base;
    const int64_t m_chunks = (n_rep * (DV / 4) + ADM_THREADS - 1) / ADM_THREADS;
    if (blocks > INT32_MAX || m_chunks * base > INT32_MAX)
        return BERTH_OK;

    adm_args a = {};
    if (ns_ws > 1 || ns > 1) {
        const int nsw = ns_ws > ns ? ns_ws : ns;
        const size_t n_o = (size_t)T * kv->n_kv_heads * nsw * ADM_HEADS * DV;
        const size_t n_ml = (size_t)T * kv->n_kv_heads * nsw * ADM_HEADS;
        if ((n_o + 2 * n_ml) * sizeof(float) > ADM_PART_BYTES)
            return BERTH_OK;
        void *ws = nullptr;
        berth_status st = cu_stream_ws(be, s, (n_o + 2 * n_ml) * sizeof(float), &ws);
        if (st != BERTH_OK)
            return st;
        a.part_ml = (float2 *)ws;
        a.part_o = (float *)ws + 2 * n_ml;
    }
    if (reserve_only)
        return BERTH_OK;
    cu_attn_args_fill(a, p);
    if (s->kvlocal_bt && (int64_t)T * a.bt_stride <= CU_KVLOCAL_ENTRIES && a.n_blocks >= CU_KVLOCAL_BLOCKS)
        a.block_table = s->kvlocal_bt; /* BERTH_CUDA_SKIP=kvlocal (an ablation: wrong outputs) */
    a.bs_shift = cu_block_shift(kv->block_size);
    a.D = D;
    a.DV = DV;
    a.n_rep = (int32_t)n_rep;
    a.n_kv_heads = kv->n_kv_heads;
    a.T = (int32_t)T;
    a.sl2 = p->scale * 1.4426950408889634f;
    a.ns = ns;
    a.per_max = (int32_t)per_max;
    a.bt_n = bt_n;
    a.out_vec = (((uintptr_t)a.out | (uint64_t)p->out.nb[1] | (uint64_t)p->out.nb[2]) & 15u) == 0;
    a.count = s->att_count;
    a.merge_kernel = mk && ns > 1;
    /* the o-projection reads these rows next: the merge rounds them for it (cuda_internal.h, struct cu_xshadow;
     * the rounding follows the cache's dtype, the usual weight dtype — a product of another dtype packs as before) */
    if (a.merge_kernel && p->out.nb[0] == 4 && p->out.nb[1] == (int64_t)DV * 4) {
        int64_t ld = 0;
        a.ysh_dt = f16 ? BERTH_DTYPE_F16 : BERTH_DTYPE_BF16;
        a.ysh = cu_xshadow_claim_rows(be, s, (const char *)cu_ptr(&p->out), p->out.nb[2], T, H * DV, a.ysh_dt, &ld);
        a.ldysh = ld;
    }
    a.m_chunks = (int32_t)m_chunks;
    a.late = be->att_trigger == CU_ATT_TRIGGER_LATE;
    a.prewait = be->att_prewait && p->mask == BERTH_MASK_CAUSAL; /* attention_decode.cu: causal self-attention only */
    char what[96] = "";
    if (be->att_prof != CU_ATT_PROF_OFF) {
        snprintf(what, sizeof what, "attn_decode_mma d%d%s T=%d ns=%d blocks=%d", dp, nw == 8 ? "w8" : "", a.T,
                 a.ns, (int)blocks);
        a.prof = cu_att_prof_for(be, s, blocks, ADM_STAMPS, what);
    }
    berth_status st = cu_check(be, cu_launch(be, s->cs, dim3((unsigned)blocks), dim3((unsigned)nt), smem, fn, a),
                               "attn_decode_mma_kernel");
    if (st == BERTH_OK && a.merge_kernel)
        st = cu_check(be, cu_launch(be, s->cs, dim3((unsigned)(a.m_chunks * base)), dim3(ADM_THREADS), 0,
                                    adm_merge_kernel, a),
                      "adm_merge_kernel");
    if (st == BERTH_OK)
        *ran = true;
    else if (a.ysh)
        s->xsh.seq = 0; /* claimed, never (completely) written */
    if (st == BERTH_OK && a.prof && !be->capturing)
        return cu_att_prof_report(be, s, a.prof, (int)blocks, ADM_STAMPS, what);
    return st;
}

berth_status cu_attention_decode_mma(berth_backend *be, berth_stream *s, const berth_attention_params *p, bool *ran)
{
    return adm_run(be, s, p, ran, false);
}

/* In eager calls that another decode kernel serves: grow the stream's workspace now to what this kernel would need
 * if a graph capture of the same call chose it (the capture sizes from the block table's capacity, where the
 * cluster kernel may decline; growing during a capture fails and turns the runner's graphs off). */
berth_status cu_attention_decode_mma_reserve(berth_backend *be, berth_stream *s, const berth_attention_params *p)
{
    bool ran = false;
    return be->capturing ? BERTH_OK : adm_run(be, s, p, &ran, true);
}

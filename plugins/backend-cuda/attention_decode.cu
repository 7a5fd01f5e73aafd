/*
 * attention_decode.cu — the low-latency decode path of ATTENTION (berth/backend.h): one query row per sequence
 * (T == n_seqs), any KV dtype of this backend, head dims up to 512, up to 16 query heads per KV head. Same
 * semantics and arithmetic class as attention.cu's split-K kernel (fp32 scores, softmax and weighted sum; K/V
 * widened exactly; expf), which BERTH_CUDA_ATT_DECODE=old keeps (A/B measurements). attention.cu's decode dispatch
 * calls cu_attention_decode_fast() first; *ran = false means nothing was enqueued and the old kernels run.
 *
 * Why: a decode call reads well under 1 MB of K/V per layer at batch 1, so its time is a chain of latencies, not
 * bandwidth. The old path paid two kernel boundaries (split kernel, then a combine kernel), three dependent
 * global round trips before the first K/V byte arrived, and a partials round trip through L2. Here one launch
 * does everything, and a call is: PDL wait -> one round trip (sequence metadata, the whole block-table row, q)
 * -> one round trip (every K/V row this block needs, cp.async, all in flight at once when they fit) -> fp32
 * math -> a merge through distributed shared memory -> the output.
 *
 * Work split (chosen on the host from shapes and the block table's width only, so a captured launch replays
 * correctly with any lengths): a cluster of CS blocks (thread-block cluster, sm_90; CS <= 16) serves one
 * (sequence, KV head, head group). A head group is NRW query heads of the KV head; fewer heads per block and
 * more groups spread a small batch over more SMs (each group re-reads the same K/V, from L2: sibling groups are
 * adjacent in the grid, so they run together). The W warps of each block (ADC_WARPS_OF: 8 for narrow head groups,
 * else 4), CS * W in all, take the sequence's visible keys round robin (key lo + w, lo + w + W CS, ...), so every
 * warp gets the same number of keys within one. Inside a warp, lanes split the head dim (E = 4, 8 or 16 elements
 * each, NRW * E <= 64 so that q and the output accumulators of all NRW heads stay in registers):
 *   - the block-table row is loaded into shared memory right after the PDL wait, together with the sequence's
 *     length, position and q (one round trip), so K/V addresses need no further dependent global load;
 *   - each lane copies (cp.async) exactly the K/V bytes it will read into its warp's ring of R key slots,
 *     batches of 4 keys, all batches in flight at once when R covers the warp's keys; no barrier guards them;
 *   - per batch: dot products of the lane's K slice with q of all NRW heads, a warp reduce-scatter that leaves
 *     head r's score in lanes r * 32 / NRW.., an online softmax per head (fp32, expf), p and the rescale factors
 *     broadcast through shared memory (__syncwarp), and O += p V on the lane's V slice for all heads;
 *   - merge: the W warps' (max, sum, O) combine in shared memory; each block then pushes its block-level partial
 *     of output columns [k * per, (k + 1) * per) to cluster rank k's shared memory (st.shared::cluster), one
 *     cluster barrier (release/acquire), and rank k finishes its columns for all heads of the group and writes
 *     them (gate applied). Nothing goes through global memory but the output.
 * Cluster barrier protocol (every thread of every block of the cluster, uniformly): arrive.relaxed at the start
 * (non-blocking); wait before the first remote store (all blocks have started: their shared memory exists, and
 * for a second row, everyone is done reading the previous row's partials); arrive.release + wait.acquire after
 * the remote stores; read the local partials; for another row, arrive.relaxed again. A block never touches
 * another's shared memory after the second barrier, so blocks exit independently.
 *
 * Reads before the PDL wait (be->att_prewait, default on; BERTH_CUDA_ATT_PREWAIT=0 turns it off): the sequence
 * metadata, the block-table row and the K/V of every key older than the call's own rows are read (copied) while
 * the previous kernel still runs; q and the newest keys (from seq_kv_len - rows of the sequence on: what this
 * batch's kv_append wrote) only after the wait. That departs from cuda_launch.cuh's rule (read nothing an earlier
 * kernel may write before the wait) on two assumptions, both true of berth's runner and models: (1) the metadata
 * arrays and the keys of earlier forwards were written before the last full stream dependency (a copy, an event
 * wait or a graph launch boundary: every runner step starts by uploading its metadata with a copy, and
 * copy-on-write block copies are copies; the copy kernel of copy.cu keeps that true by having the kernel after it
 * launched without PDL), so no kernel still in flight writes them; (2) a forward writes a
 * sequence's keys only at its own rows — true of causal self-attention, where a forward appends exactly the
 * tokens it processes, so only causal calls do it (cross-attention, MASK_NONE, may append a whole encoder
 * sequence in the forward that first reads it). A host that computes metadata on the device, or runs forwards
 * back to back with no copy between them, must set BERTH_CUDA_ATT_PREWAIT=0. attention_decode_mma.cu follows
 * the same rule.
 *
 * Robustness as attention.cu (metadata is device data, never read back): a sequence whose seq_q_start range is
 * not inside [0, T] is skipped, seq_kv_len is clamped to the block table's row, a key whose block-table entry is
 * not a block of the pool is skipped (never dereferenced: score -inf, no V), rows that see no key write zeros.
 * Unaligned K/V or q rows, head dims that are not a multiple of 8 and softcap are left to the other kernels
 * (cu_attention_decode_fast returns with *ran = false): this kernel carries code for none of them.
 */
#include "attention_args.cuh"
#include "cuda_cluster.cuh"
#include "cuda_device.cuh"
#include "cuda_internal.h"
#include "cuda_launch.cuh"
#include "cuda_mma.cuh"
#include "attention_decode_util.cuh"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* The entry point attention.cu's decode dispatch calls (declared there too). below_mma: serve only calls of at
 * most ADC_MMA_FROM_WORK_KEYS (the dispatcher then offers the rest to the tensor-core kernel first). */
berth_status cu_attention_decode_fast(berth_backend *be, berth_stream *s, const berth_attention_params *p,
                                      bool below_mma, bool *ran);

#define ADC_MAX_KEYS 1024       /* visible keys per sequence above which the split kernel serves the call */
#define ADC_MAX_WORK_KEYS 8192  /* sequences x visible keys above which it does too */
/* ... and above which the tensor-core kernel (attention_decode_mma.cu) is faster where it serves. On the H200 (E2B
 * bf16 decode, 512 / 640 visible keys on sliding / full layers; bench/RESULTS.md session 12): the cluster kernel
 * wins up to 4 sequences (2048 / 2560 keys; 1492 against 1481 tok/s at 4, 947 against 908 at 2), the tensor-core
 * kernel from 6 on (3072 / 3840: 2156 against 2107 at 6, 2862 against 2762 at 8, 4929 against 4699 at 16). */
#define ADC_MMA_FROM_WORK_KEYS 2560
/* Warps per block: 8 where a block serves few query heads (NRW <= 4 at head dims up to 256, NRW <= 2 at 512), so
 * that each warp's serial chain of keys is half as long (the kernel is bound by dependent-instruction latency at
 * about one warp per scheduler); 4 for wider head groups, whose q and accumulators at 256 threads cost more than
 * the shorter chain saves. At 512 the ring shrinks to fit the budget (adc_shape: one batch of 4 keys per warp in
 * flight at E2B's lengths). Measured on the H200 (bench/RESULTS.md session 7): head dims <= 256 +4% at batch 1,
 * +3% at 4 sequences, -4% at 8 with NRW 8 (so NRW 8 keeps 4); then 512 at NRW <= 2: +1.8% at batch 1, +5.6% at 2.
 * f32 caches (the fp32 parity mode) take 8 only at NRW <= 2 below 512: an f32 row of 512 is 2 KiB, so 8 warps'
 * smallest rings (4 keys) would not fit the budget (the split kernel would serve every such call), and the f32
 * NRW = 4 instance needs 174 registers (one block per SM at 256 threads). */
#define ADC_MAX_WARPS 8
#define ADC_WARPS_OF(DT, E, NRW)                                                                                   \
    ((DT) == BERTH_DTYPE_F32 ? ((E) <= 8 && (NRW) <= 2 ? 8 : 4)                                                    \
                             : (((E) <= 8 && (NRW) <= 4) || ((E) == 16 && (NRW) <= 2)) ? 8 : 4)
/* Fewest query heads per block where a KV head has more: one head per block spread a batch-1 call over 128 SMs
 * (E2B: 8 heads x 16-block clusters) and measured slower than two (64 blocks, each K/V row read 4 times from L2
 * instead of 8): 533.0 against 524.4 tok/s at batch 1, unchanged at 2 and 4 sequences, whose shapes already had
 * two or more (H200, bench/RESULTS.md session 13). */
#define ADC_MIN_NRW 2
#define ADC_KB 4                  /* keys per batch (a cp.async group, one softmax step) */
#define ADC_MAX_CS 16             /* blocks per cluster (above 8: the non-portable size) */
#define ADC_BT_MAX 1024           /* block-table entries preloaded into shared memory (4 or 8 per thread) */
#define ADC_RING_MAX 16           /* key slots per warp (4 batches in flight) */
#define ADC_SMEM_BUDGET (108u << 10) /* dynamic shared memory per block: two blocks fit on an SM */
#define ADC_CACHE_DEVICES 16

/* What the kernel reads (device addresses, byte strides) and the launch shape. */
struct adc_args {
    const char *q;
    int64_t q_nb1, q_nb2;
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
    float scale, softcap;
    int32_t late;       /* PDL trigger after the key loop instead of at the start (BERTH_CUDA_ATT_TRIGGER=late) */
    int32_t prewait;    /* metadata, block table and the K/V of earlier steps' keys before the PDL wait (see top) */
    /* launch shape */
    int32_t cs, hg;     /* blocks per cluster, head groups per KV head */
    int32_t ring;       /* key slots per warp (a multiple of ADC_KB, <= ADC_RING_MAX) */
    int32_t per;        /* output columns each cluster rank finishes (a multiple of 4) */
    int32_t bt_n;       /* block-table entries preloaded: min(bt_width, ADC_BT_MAX) */
    unsigned long long *prof; /* BERTH_CUDA_ATT_PROF=1: ADC_STAMPS global-timer stamps per block (NULL: none) */
    uint32_t region;    /* bytes of a warp's region of dynamic shared memory (ring, then its partial) */
    uint32_t bt_off, recv_off; /* byte offsets of the table and of the cluster partials */
};

template <int NR>
struct adc_log2 {
    static constexpr int v = NR >= 16 ? 4 : NR >= 8 ? 3 : NR >= 4 ? 2 : NR >= 2 ? 1 : 0;
};

template <int DT, int E, int NRW>
struct adc_cfg {
    static constexpr int ESZ = DT == BERTH_DTYPE_F32 ? 4 : 2;
    static constexpr int CE = E < 16 / ESZ ? E : 16 / ESZ; /* elements per copy piece ("chunk") */
    static constexpr int CB = CE * ESZ;                    /* bytes per chunk: 8 or 16 */
    static constexpr int NC = E / CE;                      /* chunks per lane */
    static constexpr int DP = 32 * E;                      /* head dims a warp covers */
    static constexpr int ROW = DP * ESZ;                   /* bytes of a K (or V) slot */
    static constexpr int LG = adc_log2<NRW>::v;
    static constexpr int RL = 32 >> LG; /* lanes holding one head's score after the reduce-scatter */
    static_assert(NRW * E <= 64 && (1 << LG) == NRW, "q and O of NRW heads in registers");
    /* chunk c of lane L covers elements (c * 32 + L) * CE .. + CE of a row: consecutive lanes, consecutive
     * pieces (conflict-free shared loads; the slot is the row itself, padded to DP) */
};

// ---------------------------------------------------------------------------------------------------------------
// Device helpers.

/* Wait until at most n (0..3, more is treated as 3: waits longer, never too short) groups are pending. */
__device__ __forceinline__ void adc_cp_wait_dyn(int n)
{
    if (n <= 0)
        cu_dec_cp_wait<0>();
    else if (n == 1)
        cu_dec_cp_wait<1>();
    else if (n == 2)
        cu_dec_cp_wait<2>();
    else
        cu_dec_cp_wait<3>();
}

/* One chunk (CE elements) from shared memory, widened to fp32. */
template <int DT, int CE>
__device__ __forceinline__ void adc_widen(const unsigned char *p, float f[CE])
{
    if constexpr (DT == BERTH_DTYPE_F32) {
        static_assert(CE == 4, "f32 chunks are 16 bytes");
        const float4 x = *(const float4 *)p;
        f[0] = x.x, f[1] = x.y, f[2] = x.z, f[3] = x.w;
    } else if constexpr (CE == 8) {
        const uint4 u = *(const uint4 *)p;
        cu_dec_widen2<DT>(u.x, f + 0);
        cu_dec_widen2<DT>(u.y, f + 2);
        cu_dec_widen2<DT>(u.z, f + 4);
        cu_dec_widen2<DT>(u.w, f + 6);
    } else {
        const uint2 u = *(const uint2 *)p;
        cu_dec_widen2<DT>(u.x, f + 0);
        cu_dec_widen2<DT>(u.y, f + 2);
    }
}

/* q of row t, heads h0 .. h0 + NRW - 1 (zeros for heads at or past nrv and dims at or past D), this lane's dims:
 * whole float4 loads (the launch takes only 16-byte aligned q rows and head dims that are whole chunks). */
template <int E, int NRW, int CE, int NC>
__device__ __forceinline__ void adc_load_q(const adc_args &a, int64_t t, int h0, int nrv, int lane, float q[NRW][E])
{
#pragma unroll
    for (int r = 0; r < NRW; r++) {
        const float *qr = (const float *)(a.q + t * a.q_nb2 + (int64_t)(h0 + r) * a.q_nb1);
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const int d0 = (c * 32 + lane) * CE;
            if (r < nrv && d0 < a.D) { /* then d0 + CE <= D */
#pragma unroll
                for (int e = 0; e < CE; e += 4) {
                    const float4 x = *(const float4 *)(qr + d0 + e);
                    q[r][c * CE + e] = x.x, q[r][c * CE + e + 1] = x.y;
                    q[r][c * CE + e + 2] = x.z, q[r][c * CE + e + 3] = x.w;
                }
            } else {
#pragma unroll
                for (int e = 0; e < CE; e++)
                    q[r][c * CE + e] = 0.0f;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The kernel. Grid: cs * hg * n_kv_heads * n_seqs blocks in one dimension, cluster rank fastest, then head group,
// KV head, sequence; clusters of cs blocks (none when cs == 1). Launched with PDL (trigger, then wait before
// touching memory, as cuda_launch.cuh requires).

/* BERTH_CUDA_ATT_PROF=1 in a measurement build (meson -Dattention_stamps=true, which defines BERTH_ADC_STAMPS; a
 * normal build compiles no stamp, so the tuned kernel's registers stay as they are: the stamps' code moved them by
 * up to 50 per thread in some instances), eager calls only: thread 0 of every block records the global timer when
 * it issues 0 its start, 1 the loads of q past the PDL wait, 2 the end of its warp's keys (warp 0), 3 the block
 * partial merged, 4 past the cluster barrier (the ranks' partials of its columns landed), 5 its columns' stores
 * (2..5: the last row's); cu_att_prof_report prints them. Stamp 0 is a global write before the PDL wait, an
 * exception to cuda_launch.cuh's rule that is safe because no other kernel touches the stamp buffer. */
#ifndef BERTH_ADC_STAMPS
#define BERTH_ADC_STAMPS 0
#endif
#define ADC_STAMPS 6
#if BERTH_ADC_STAMPS
#define ADC_STAMP(k) cu_att_stamp(a.prof, ADC_STAMPS, (k))
#else
#define ADC_STAMP(k)                                                                                           \
    do {                                                                                                       \
    } while (0)
#endif

template <int DT, int E, int NRW>
__global__ void __launch_bounds__(ADC_WARPS_OF(DT, E, NRW) * 32) attn_decode_cluster_kernel(const adc_args a)
{
    using C = adc_cfg<DT, E, NRW>;
    constexpr int CE = C::CE, CB = C::CB, NC = C::NC, DP = C::DP, ROW = C::ROW, LG = C::LG, RL = C::RL;
    constexpr int KB = ADC_KB;
    constexpr int W = ADC_WARPS_OF(DT, E, NRW), THREADS = W * 32; /* warps and threads per block */
    static_assert((W & (W - 1)) == 0 && W <= ADC_MAX_WARPS && ADC_BT_MAX % THREADS == 0,
                  "W a power of two (M2's xor shuffles stay inside each head's W lanes); the table preload even");
    extern __shared__ __align__(16) unsigned char adc_smem[];
    __shared__ __align__(16) float pw_s[W][KB][NRW]; /* p of the batch, per warp */
    __shared__ __align__(16) float alw_s[W][NRW];    /* rescale factors of the batch, per warp */
    __shared__ float2 wml_s[W][NRW];                 /* each warp's (max, sum) per head */
    __shared__ float wt_s[W][NRW];                   /* the warps' weights in the block partial */
    __shared__ float2 cml_s[NRW];                            /* the block partial's (max, sum) */
    __shared__ float2 rml_s[ADC_MAX_CS][NRW];                /* every rank's (max, sum), pushed by the ranks */
    __shared__ float rw_s[NRW][ADC_MAX_CS];                  /* the ranks' weights */
    __shared__ float rli_s[NRW];                             /* 1 / total sum (0: no key) */

    if (!a.late)
        cu_pdl_trigger();
    ADC_STAMP(0);
    const bool clu = a.cs > 1;
    if (clu)
        cu_cluster_arrive_relaxed(); /* phase A of row 0: this block has started */
    bool waited = !a.prewait; /* every path below waits before it exits, writes or reads q */
    if (waited)
        cu_pdl_wait();

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const unsigned bx = blockIdx.x, ucs = (unsigned)a.cs;
    const int rank = clu ? (int)cu_cluster_rank() : 0; /* == bx % cs: clusters tile the grid along x */
    unsigned rest = bx / ucs;
    const int hg = (int)(rest % (unsigned)a.hg);
    rest /= (unsigned)a.hg;
    const int g = (int)(rest % (unsigned)a.n_kv_heads);
    const int seq = (int)(rest / (unsigned)a.n_kv_heads);

    /* One round trip: sequence metadata, the block-table row, q (row seq: the row when the sequence has one). */
    const int32_t q0 = a.seq_q_start[seq], q1 = a.seq_q_start[seq + 1];
    const int32_t kv_raw = a.seq_kv_len[seq];
    const int32_t pos_seq = a.positions[seq]; /* seq < n_seqs == T */
    const int32_t *bt = a.block_table + (int64_t)seq * a.bt_stride;
    int32_t *bt_s = (int32_t *)(adc_smem + a.bt_off);
    {
        int32_t v[ADC_BT_MAX / THREADS];
#pragma unroll
        for (int k = 0; k < ADC_BT_MAX / THREADS; k++) {
            const int i = tid + k * THREADS;
            v[k] = i < a.bt_n ? bt[i] : -1;
        }
#pragma unroll
        for (int k = 0; k < ADC_BT_MAX / THREADS; k++) {
            const int i = tid + k * THREADS;
            if (i < a.bt_n)
                bt_s[i] = v[k];
        }
    }
    const int nrv = NRW < a.n_rep - hg * NRW ? NRW : a.n_rep - hg * NRW; /* real heads of this group */
    const int h0 = g * a.n_rep + hg * NRW;                                /* its first query head */
    float q[NRW][E];
    if (waited) {
        adc_load_q<E, NRW, CE, NC>(a, seq, h0, nrv, lane, q);
        ADC_STAMP(1);
    }
    __syncthreads(); /* bt_s */
    if (!cu_attn_rows_ok(a, q0, q1)) { /* the same in every block of the cluster */
        if (!waited)
            cu_pdl_wait();
        if (clu)
            cu_cluster_wait();
        return;
    }
    const int32_t kv_len = cu_attn_kv_len(a, kv_raw);

    const int nwt = a.cs * W, gw = rank * W + warp; /* warps of the cluster, this one's index */
    const int64_t kdim = (int64_t)g * a.head_stride, vdim = (int64_t)g * a.v_head_stride;
    unsigned char *region = adc_smem + (size_t)warp * a.region;
    const uint32_t region_s = cu_smem_addr(region);
    /* this lane's chunk c of a K / V row is whole (the launch takes only aligned rows and head dims that are whole
     * chunks) or past the row */
    bool kin[NC], vin[NC];
#pragma unroll
    for (int c = 0; c < NC; c++) {
        kin[c] = (c * 32 + lane) * CE < a.D;
        vin[c] = (c * 32 + lane) * CE < a.DV;
    }
    const int r_own = lane >> (5 - LG);       /* the head whose score this lane holds */
    const bool owner = (lane & (RL - 1)) == 0; /* one lane per head publishes it */
    const bool head_ok = r_own < nrv;
    const int rb = a.ring / KB; /* batch slots of the ring */
    float *recv = (float *)(adc_smem + a.recv_off); /* [cs][NRW][per]: the ranks' partials of my columns */

    /* Keys from safe_hi on were appended by this batch (kv_append, the kernel before): before the PDL wait they
     * are not copied (deferred), everything older may be. */
    const int32_t safe_hi = kv_len - (q1 - q0);
    for (int32_t t = q0; t < q1; t++) {
        const int32_t pos = t == seq ? pos_seq : a.positions[t];
        if (waited && t != seq)
            adc_load_q<E, NRW, CE, NC>(a, t, h0, nrv, lane, q);
        int32_t lo, hi;
        cu_attn_row_range(a.mask, a.window, pos, kv_len, &lo, &hi);
        const uint32_t len = (uint32_t)(hi - lo);
        const int32_t nk = /* keys of this warp: lo + gw, lo + gw + nwt, ... below hi */
            len > (uint32_t)gw ? (int32_t)((len - (uint32_t)gw + (uint32_t)nwt - 1u) / (uint32_t)nwt) : 0;
        const int32_t nbat = (nk + KB - 1) / KB;

        /* Batch b (keys b * KB .. of this warp) into ring batch slot st: each lane copies its own chunks. */
        uint32_t vmask = 0; /* bit st * KB + kb: that slot holds a present key */
        uint32_t defer = 0; /* bit st * KB + kb: present, copy deferred until after the PDL wait */
        /* only_deferred: copy just the deferred keys of the batch */
        auto issue = [&](int32_t b, int st, bool only_deferred) {
#pragma unroll
            for (int kb = 0; kb < KB; kb++) {
                const int32_t i = b * KB + kb;
                const int slot = st * KB + kb;
                bool present = false;
                if (i < nk) {
                    const int32_t j = lo + gw + i * nwt; /* < hi <= kv_len <= bt_width * block_size */
                    const int32_t blk = a.bs_shift >= 0 ? j >> a.bs_shift
                                                        : (int32_t)((uint32_t)j / (uint32_t)a.block_size);
                    const int32_t off = j - blk * a.block_size;
                    const int32_t e = blk < a.bt_n ? bt_s[blk] : bt[blk];
                    present = e >= 0 && e < a.n_blocks;
                    const uint32_t sbit = 1u << slot;
                    bool copy = present;
                    if (only_deferred) {
                        copy = (defer & sbit) != 0;
                        defer &= ~sbit;
                    } else if (present && !waited && j >= safe_hi) {
                        copy = false;
                        defer |= sbit;
                    }
                    if (copy) {
                        const int64_t boff = (int64_t)e * a.block_stride;
                        const char *kp = a.kbase + boff + (int64_t)off * a.token_stride + kdim;
                        const char *vp = a.vbase + boff + (int64_t)off * a.v_token_stride + vdim;
                        const int ko = slot * 2 * ROW, vo = ko + ROW;
#pragma unroll
                        for (int c = 0; c < NC; c++) {
                            const int po = (c * 32 + lane) * CB; /* the chunk's byte offset in the row */
                            if (kin[c])
                                cu_dec_cp<CB>(region_s + ko + po, kp + po);
                            if (vin[c])
                                cu_dec_cp<CB>(region_s + vo + po, vp + po);
                        }
                    }
                }
                if (!only_deferred) {
                    const uint32_t bit = 1u << slot;
                    vmask = present ? vmask | bit : vmask & ~bit;
                }
            }
            cu_dec_cp_commit(); /* one group per batch, maybe empty: the wait counts stay exact */
        };

        /* The first rb batches (one issue site for both passes: the code stays small); then, on the first row, the
         * PDL wait and what the previous kernel wrote: a second pass over the same batches copies the deferred
         * keys. */
        const int32_t issued_pre = nbat < rb ? nbat : rb;
        int32_t issued = issued_pre;
        bool second = false;
#pragma unroll 1
        for (int32_t b = 0;; b++) {
            if (b == issued_pre) {
                if (waited) /* no second pass, or it is done */
                    break;
                /* the first row: its older keys are in flight; now what the previous kernel wrote */
                cu_pdl_wait();
                waited = true;
                adc_load_q<E, NRW, CE, NC>(a, t, h0, nrv, lane, q);
                ADC_STAMP(1);
                if (!__any_sync(0xffffffffu, defer != 0))
                    break;
                second = true; /* defer != 0 somewhere: some batch was issued (issued_pre > 0) */
                b = 0;
            }
            issue(b, b, second);
        }
        /* The second pass added one group per batch, in batch order, after the regular ones: batch b's two groups
         * are complete once at most issued - b - 1 are pending — the loop's own wait — as long as the loop issues
         * nothing more (every batch already in flight). Then the older batches are processed while the newest
         * keys' copies are still on their way; otherwise let them all land first. */
        if (second && nbat > rb)
            cu_dec_cp_wait<0>();

        float m = -INFINITY, l = 0.0f; /* online softmax of head r_own */
        float acc[NRW][E];
#pragma unroll
        for (int r = 0; r < NRW; r++)
#pragma unroll
            for (int e = 0; e < E; e++)
                acc[r][e] = 0.0f;

        int st = 0;
        for (int32_t b = 0; b < nbat; b++) {
            adc_cp_wait_dyn(issued - b - 1); /* batch b has landed (this lane's copies: all it reads) */
            const uint32_t vb = vmask >> (st * KB);
            const unsigned char *slot0 = region + st * KB * 2 * ROW;

            /* scores of the batch's keys for head r_own. The KB keys' dot products and warp reductions are
             * computed side by side, with no branch between them (a key whose slot holds nothing gets a score of
             * -inf by selection afterwards; its garbage never reaches arithmetic that is kept): per key the work
             * is a chain of dependent FMAs and shuffles, and a branch per key made the batch pay KB chains in
             * sequence (~2700 cycles per batch at head dim 256 on the H200; bench/RESULTS.md session 6). */
            float s[KB];
            {
                float dot[KB][NRW];
#pragma unroll
                for (int kb = 0; kb < KB; kb++)
#pragma unroll
                    for (int r = 0; r < NRW; r++)
                        dot[kb][r] = 0.0f;
#pragma unroll
                for (int c = 0; c < NC; c++) {
                    if (kin[c]) {
#pragma unroll
                        for (int kb = 0; kb < KB; kb++) {
                            float kf[CE];
                            adc_widen<DT, CE>(slot0 + kb * 2 * ROW + (c * 32 + lane) * CB, kf);
#pragma unroll
                            for (int e = 0; e < CE; e++)
#pragma unroll
                                for (int r = 0; r < NRW; r++)
                                    dot[kb][r] = fmaf(q[r][c * CE + e], kf[e], dot[kb][r]);
                        }
                    }
                }
#pragma unroll
                for (int kb = 0; kb < KB; kb++)
                    cu_dec_reduce_scatter<NRW>(dot[kb], lane);
#pragma unroll
                for (int kb = 0; kb < KB; kb++) {
                    const float sc = a.scale * dot[kb][0]; /* cu_attn_score without softcap (the launch's rule) */
                    s[kb] = (vb >> kb & 1u) && head_ok ? sc : -INFINITY;
                }
            }

            /* online softmax of head r_own over the batch */
            float mx = -INFINITY;
#pragma unroll
            for (int kb = 0; kb < KB; kb++)
                mx = fmaxf(mx, s[kb]);
            const float m_new = fmaxf(m, mx);
            float alpha = 1.0f, psum = 0.0f;
            float pk[KB];
#pragma unroll
            for (int kb = 0; kb < KB; kb++) {
                pk[kb] = m_new == -INFINITY ? 0.0f : expf(s[kb] - m_new);
                psum += pk[kb];
            }
            if (m_new != -INFINITY)
                alpha = expf(m - m_new);
            l = l * alpha + psum;
            m = m_new;

            float al[NRW];
            if constexpr (NRW > 1) {
                if (owner) {
#pragma unroll
                    for (int kb = 0; kb < KB; kb++)
                        pw_s[warp][kb][r_own] = pk[kb];
                    alw_s[warp][r_own] = alpha;
                }
                __syncwarp();
                cu_dec_ld_heads<NRW>(alw_s[warp], al);
            } else {
                al[0] = alpha; /* a full warp sum: every lane has the same score, p and alpha */
            }

            /* O = alpha O + sum_k p_k V_k on this lane's dims, all heads */
            bool rescale = false;
#pragma unroll
            for (int r = 0; r < NRW; r++)
                rescale |= al[r] != 1.0f;
            if (rescale) /* the same in every lane: the running max moved for some head */
#pragma unroll
                for (int r = 0; r < NRW; r++)
#pragma unroll
                    for (int e = 0; e < E; e++)
                        acc[r][e] *= al[r];
#pragma unroll
            for (int kb = 0; kb < KB; kb++) {
                /* absent key (its slot was not copied): selected out below, no branch between the keys */
                const bool pres = (vb >> kb & 1u) != 0;
                float p[NRW];
                if constexpr (NRW > 1)
                    cu_dec_ld_heads<NRW>(pw_s[warp][kb], p);
                else
                    p[0] = pk[kb];
#pragma unroll
                for (int c = 0; c < NC; c++) {
                    if (vin[c]) {
                        float vf[CE];
                        adc_widen<DT, CE>(slot0 + kb * 2 * ROW + ROW + (c * 32 + lane) * CB, vf);
#pragma unroll
                        for (int e = 0; e < CE; e++)
#pragma unroll
                            for (int r = 0; r < NRW; r++)
                                acc[r][c * CE + e] =
                                    pres ? fmaf(p[r], vf[e], acc[r][c * CE + e]) : acc[r][c * CE + e];
                    }
                }
            }
            if constexpr (NRW > 1)
                __syncwarp(); /* pw_s / alw_s are rewritten by the next batch */
            /* the batch slot is free (each lane read only what it copied): the next batch goes there */
            if (issued < nbat) {
                issue(issued, st, false);
                issued++;
            }
            st = st + 1 == rb ? 0 : st + 1;
        }
        cu_dec_cp_wait<0>();
        __syncwarp(); /* every copy of the warp has landed: its ring becomes its partial */
        ADC_STAMP(2);
        if (a.late) /* the next kernel's early loads no longer compete with this one's */
            cu_pdl_trigger();

        /* M1: the warp's partial: (max, sum) per head, O (unnormalised, relative to its max) [NRW][DP] */
        float *wo = (float *)region;
        if (owner)
            wml_s[warp][r_own] = make_float2(m, l);
#pragma unroll
        for (int r = 0; r < NRW; r++)
#pragma unroll
            for (int c = 0; c < NC; c++)
#pragma unroll
                for (int e = 0; e < CE; e += 4)
                    *(float4 *)(wo + r * DP + (c * 32 + lane) * CE + e) =
                        make_float4(acc[r][c * CE + e], acc[r][c * CE + e + 1], acc[r][c * CE + e + 2],
                                    acc[r][c * CE + e + 3]);
        __syncthreads();

        /* M2: the block's (max, sum) per head and the warps' weights (lanes W r .. W r + W - 1: head r's warps) */
        if (tid < 32 * ((NRW * W + 31) / 32)) {
            const bool v = tid < NRW * W;
            const int r = tid / W, w = tid % W;
            const float2 ml = v ? wml_s[w][r] : make_float2(-INFINITY, 0.0f);
            float M = ml.x;
#pragma unroll
            for (int o = 1; o < W; o <<= 1)
                M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
            const float wt = ml.x == -INFINITY ? 0.0f : expf(ml.x - M);
            float L = wt * ml.y;
#pragma unroll
            for (int o = 1; o < W; o <<= 1)
                L += __shfl_xor_sync(0xffffffffu, L, o);
            if (v) {
                wt_s[w][r] = wt;
                if (w == 0)
                    cml_s[r] = make_float2(M, L);
            }
        }
        __syncthreads();
        ADC_STAMP(3);
        if (clu)
            cu_cluster_wait(); /* phase A: every block started and is done with the previous row's partials */

        /* M3: the block partial of each (head, 4 columns), pushed to the rank that finishes those columns */
        {
            const int nf4 = (a.DV + 3) >> 2;
            for (int it = tid; it < nrv * nf4; it += THREADS) {
                const int r = it / nf4, d = (it - r * nf4) * 4;
                float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
                for (int w = 0; w < W; w++) { /* all loads at once; a zero-weight warp is selected out */
                    const float wt = wt_s[w][r];
                    const float4 x = *(const float4 *)((const float *)(adc_smem + (size_t)w * a.region) + r * DP + d);
                    const bool use = wt > 0.0f;
                    o.x = use ? fmaf(wt, x.x, o.x) : o.x;
                    o.y = use ? fmaf(wt, x.y, o.y) : o.y;
                    o.z = use ? fmaf(wt, x.z, o.z) : o.z;
                    o.w = use ? fmaf(wt, x.w, o.w) : o.w;
                }
                const int dst = d / a.per;
                float4 *pp = (float4 *)(recv + ((size_t)(rank * NRW + r) * a.per + (d - dst * a.per)));
                if (clu)
                    pp = cu_cluster_remote(pp, dst);
                *pp = o;
            }
            for (int it = tid; it < a.cs * NRW; it += THREADS) {
                const int dst = it / NRW, r = it - dst * NRW;
                float2 *pp = &rml_s[rank][r];
                if (clu)
                    pp = cu_cluster_remote(pp, dst);
                *pp = cml_s[r];
            }
        }
        if (clu) { /* phase B: every rank's partials of my columns have landed */
            __syncwarp(); /* the .aligned barrier instructions want converged warps */
            cu_cluster_arrive_release();
            cu_cluster_wait();
        } else {
            __syncthreads();
        }
        ADC_STAMP(4);

        /* M4: the ranks' weights per head (16 lanes per head, lane c: rank c) */
#pragma unroll
        for (int r0 = 0; r0 < NRW; r0 += THREADS / 16) {
            const int r = r0 + (tid >> 4), c = tid & 15;
            const bool v = r < NRW && c < a.cs;
            const float2 ml = v ? rml_s[c][r] : make_float2(-INFINITY, 0.0f);
            float M = ml.x;
#pragma unroll
            for (int o = 8; o > 0; o >>= 1)
                M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
            const float w = ml.x == -INFINITY ? 0.0f : expf(ml.x - M);
            float L = w * ml.y;
#pragma unroll
            for (int o = 8; o > 0; o >>= 1)
                L += __shfl_xor_sync(0xffffffffu, L, o);
            if (v)
                rw_s[r][c] = w;
            if (r < NRW && c == 0)
                rli_s[r] = L > 0.0f ? 1.0f / L : 0.0f;
        }
        __syncthreads();

        /* M5: my columns [rank * per, + per) of every head of the group: merge, normalise, gate, store */
        {
            const int d0 = rank * a.per;
            const int cnt = a.DV - d0 < a.per ? a.DV - d0 : a.per;
            for (int it = tid; cnt > 0 && it < nrv * cnt; it += THREADS) {
                const int r = it / cnt, dl = it - r * cnt;
                /* every rank's partial loaded at once (unrolled, no branch between the loads: the loop with a
                 * branch per rank was a chain of 16 dependent shared-memory round trips, ~3300 cycles at batch
                 * 1); a rank of weight 0 is selected out, so its partial never reaches the sum */
                float o = 0.0f;
#pragma unroll
                for (int c = 0; c < ADC_MAX_CS; c++) {
                    if (c < a.cs) {
                        const float w = rw_s[r][c], x = recv[(size_t)(c * NRW + r) * a.per + dl];
                        o = w > 0.0f ? fmaf(w, x, o) : o;
                    }
                }
                o *= rli_s[r];
                const int h = h0 + r, d = d0 + dl;
                if (a.gate) {
                    const float gv = ((const float *)(a.gate + (int64_t)t * a.gate_nb2 + (int64_t)h * a.gate_nb1))[d];
                    o *= 1.0f / (1.0f + expf(-gv));
                }
                ((float *)(a.out + (int64_t)t * a.out_nb2 + (int64_t)h * a.out_nb1))[d] = o;
            }
        }
        ADC_STAMP(5);
        if (t + 1 < q1) { /* another row: its phase A starts once this block is done with the partials */
            if (clu) {
                __syncwarp();
                cu_cluster_arrive_relaxed();
            } else {
                __syncthreads();
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Host side.

/* What a kernel instance needs on the host, found once per device (cudaFuncSetAttribute and the occupancy queries
 * cost microseconds of host time, which every eager call would pay). ready[dev]: 0 not yet, 1 set up. Atomics:
 * backends of two devices may set up the same instance from two threads. */
struct adc_cache {
    int ready[ADC_CACHE_DEVICES];
    int max_cs[ADC_CACHE_DEVICES];   /* largest cluster size allowed: 16 or 8 */
    int c16[ADC_CACHE_DEVICES];      /* clusters of 16 that can be resident at once (0: none) */
    int smem_max[ADC_CACHE_DEVICES]; /* dynamic shared memory the instance may use */
};

struct adc_kernel {
    void (*fn)(const adc_args);
    adc_cache *cache;
    int threads; /* its block size: ADC_WARPS_OF(DT, E, NRW) * 32 */
};

template <int DT, int E, int NRW>
static adc_kernel adc_inst()
{
    static adc_cache cache; /* one per template instance, zero-initialised */
    return {attn_decode_cluster_kernel<DT, E, NRW>, &cache, ADC_WARPS_OF(DT, E, NRW) * 32};
}

template <int DT, int E>
static adc_kernel adc_pick_nrw(int nrw)
{
    if constexpr (E <= 4) {
        if (nrw == 16)
            return adc_inst<DT, E, 16>();
    }
    if constexpr (E <= 8) {
        if (nrw == 8)
            return adc_inst<DT, E, 8>();
    }
    switch (nrw) {
    case 4: return adc_inst<DT, E, 4>();
    case 2: return adc_inst<DT, E, 2>();
    case 1: return adc_inst<DT, E, 1>();
    }
    return {nullptr, nullptr, 0};
}

template <int DT>
static adc_kernel adc_pick_e(int E, int nrw)
{
    switch (E) {
    case 4: return adc_pick_nrw<DT, 4>(nrw);
    case 8: return adc_pick_nrw<DT, 8>(nrw);
    case 16: return adc_pick_nrw<DT, 16>(nrw);
    }
    return {nullptr, nullptr, 0};
}

static adc_kernel adc_pick(int32_t dt, int E, int nrw)
{
    if (dt == BERTH_DTYPE_BF16)
        return adc_pick_e<BERTH_DTYPE_BF16>(E, nrw);
    if (dt == BERTH_DTYPE_F16)
        return adc_pick_e<BERTH_DTYPE_F16>(E, nrw);
    return adc_pick_e<BERTH_DTYPE_F32>(E, nrw);
}

struct adc_info {
    int max_cs, c16, smem_max;
};

/* Set kern up on this device once: shared-memory opt-in, non-portable cluster sizes, and whether (how many)
 * clusters of 16 can be resident. Failures of the cluster queries only cap the cluster size at 8. */
static berth_status adc_setup(berth_backend *be, cudaStream_t stream, const adc_kernel &k, adc_info *info)
{
    const int dev = be->device;
    const bool cached = dev >= 0 && dev < ADC_CACHE_DEVICES;
    if (cached && __atomic_load_n(&k.cache->ready[dev], __ATOMIC_ACQUIRE)) {
        info->max_cs = k.cache->max_cs[dev];
        info->c16 = k.cache->c16[dev];
        info->smem_max = k.cache->smem_max[dev];
        return BERTH_OK;
    }
    cudaFuncAttributes fa;
    berth_status st =
        cu_check(be, cudaFuncGetAttributes(&fa, k.fn), "cudaFuncGetAttributes (attn_decode_cluster_kernel)");
    if (st != BERTH_OK)
        return st;
    size_t lim = be->smem_optin > fa.sharedSizeBytes ? be->smem_optin - fa.sharedSizeBytes : 0;
    lim = lim < ADC_SMEM_BUDGET ? lim : ADC_SMEM_BUDGET;
    st = cu_check(be, cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)lim),
                  "cudaFuncSetAttribute (attn_decode_cluster_kernel shared memory)");
    if (st != BERTH_OK)
        return st;
    int max_cs = 8, c16 = 0;
    if (cudaFuncSetAttribute(k.fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess) {
        cudaLaunchAttribute attr[1] = {};
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = 16;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(16);
        cfg.blockDim = dim3((unsigned)k.threads);
        cfg.dynamicSmemBytes = lim;
        cfg.stream = stream; /* a query: nothing is enqueued (the stream may be capturing) */
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        int n = 0;
        if (cudaOccupancyMaxActiveClusters(&n, k.fn, &cfg) == cudaSuccess && n > 0) {
            max_cs = 16;
            c16 = n;
        }
    }
    (void)cudaGetLastError(); /* a refused attribute or query is not a launch error */
    info->max_cs = max_cs;
    info->c16 = c16;
    info->smem_max = (int)lim;
    if (cached) {
        k.cache->max_cs[dev] = max_cs;
        k.cache->c16[dev] = c16;
        k.cache->smem_max[dev] = (int)lim;
        __atomic_store_n(&k.cache->ready[dev], 1, __ATOMIC_RELEASE);
    }
    return BERTH_OK;
}

static int64_t adc_cdiv(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

/* The launch shape for this call (from shapes, the block table's width during capture, and max_kv_len
 * otherwise). */
struct adc_plan {
    int E, nrw, hg, cs, ring, per, bt_n;
    size_t region, bt_off, recv_off, smem;
};

static void adc_shape(const berth_backend *be, const berth_attention_params *p, int n_rep, int max_cs, int c16,
                      adc_plan *pl)
{
    const berth_kv_view *kv = &p->kv;
    const int D = kv->head_dim, DV = kv->head_dim_v, dmax = D > DV ? D : DV;
    const int esz = kv->dtype == BERTH_DTYPE_F32 ? 4 : 2;
    pl->E = dmax <= 128 ? 4 : dmax <= 256 ? 8 : 16;
    int nrw = 1;
    while (nrw < n_rep)
        nrw <<= 1;
    const int nrw_max = 64 / pl->E;
    nrw = nrw < nrw_max ? nrw : nrw_max;

    /* keys one row can see: bounded by the table (capture) or max_kv_len, and the window */
    const int64_t cap = (int64_t)p->block_table.ne[0] * kv->block_size;
    int64_t kvb = be->capturing ? cap : (p->max_kv_len < cap ? p->max_kv_len : cap);
    if (p->mask == BERTH_MASK_CAUSAL && p->window > 0 && p->window < kvb)
        kvb = p->window;
    kvb = kvb > 0 ? kvb : 0;

    /* Cluster size: enough blocks for about two per SM over the whole call, at least att_split_keys keys each
     * (BERTH_CUDA_ATT_SPLIT_KEYS, default 16). Then head groups: halve the heads per block while the call still
     * fits one block per SM (a small batch spreads over more SMs; each group re-reads K/V from L2), down to
     * ADC_MIN_NRW heads. */
    const int64_t base = (int64_t)p->n_seqs * kv->n_kv_heads;
    const int64_t sms = be->n_sms > 0 ? be->n_sms : 132;
    int64_t hg = adc_cdiv(n_rep, nrw);
    const int64_t min_keys = be->att_split_keys >= 16 ? be->att_split_keys : 16;
    int64_t cs = adc_cdiv(kvb, min_keys);
    cs = cs < max_cs ? cs : max_cs;
    const int64_t by_wave = 2 * sms / (base * hg);
    cs = cs < by_wave ? cs : by_wave;
    cs = cs > 1 ? cs : 1;
    while (nrw > ADC_MIN_NRW) {
        const int64_t hg2 = adc_cdiv(n_rep, nrw / 2);
        if (base * hg2 * cs > sms)
            break;
        nrw /= 2;
        hg = hg2;
    }
    if (cs > 8 && base * hg > c16) /* more clusters of 16 than can be resident at once */
        cs = 8;
    pl->nrw = nrw;
    pl->hg = (int)hg;
    pl->cs = (int)cs;

    const int DVr = (DV + 3) & ~3;
    pl->per = (int)((adc_cdiv(DVr, cs) + 3) & ~3);
    pl->bt_n = (int)(p->block_table.ne[0] < ADC_BT_MAX ? p->block_table.ne[0] : ADC_BT_MAX);
    const size_t bt_bytes = ((size_t)pl->bt_n * 4 + 15) & ~(size_t)15;
    const size_t recv_bytes = (size_t)cs * nrw * pl->per * 4;
    const size_t row = (size_t)32 * pl->E * esz;
    const size_t merge = (size_t)nrw * 32 * pl->E * 4;
    /* Ring: every key of the warp in flight at once when that fits the budget (a multiple of the batch). */
    const int W = ADC_WARPS_OF(kv->dtype, pl->E, pl->nrw);
    const int64_t kpw = adc_cdiv(kvb, cs * W);
    int64_t ring = (kpw + ADC_KB - 1) / ADC_KB * ADC_KB;
    ring = ring < ADC_RING_MAX ? ring : ADC_RING_MAX;
    ring = ring > ADC_KB ? ring : ADC_KB;
    auto total = [&](int64_t r) {
        const size_t ringb = (size_t)r * 2 * row;
        const size_t region = ringb > merge ? ringb : merge;
        return (size_t)W * region + bt_bytes + recv_bytes;
    };
    while (ring > ADC_KB && total(ring) > ADC_SMEM_BUDGET)
        ring -= ADC_KB;
    pl->ring = (int)ring;
    const size_t ringb = (size_t)ring * 2 * row;
    pl->region = ringb > merge ? ringb : merge;
    pl->bt_off = (size_t)W * pl->region;
    pl->recv_off = pl->bt_off + bt_bytes;
    pl->smem = pl->recv_off + recv_bytes;
}

/* A call in the kernel's range (a small decode call of a supported shape) that it does not serve after all: the
 * caller falls back to the split kernel (BERTH_OK, *ran false) — or, under the test switch BERTH_CUDA_ATT_STRICT=1,
 * fails with what did not fit, so that a fallback the kernel tests would pass through unnoticed is an error there
 * (session 7: f32 caches at head dim 512 and 8 warps fell back on every call). */
static berth_status adc_decline(berth_backend *be, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static berth_status adc_decline(berth_backend *be, const char *fmt, ...)
{
    if (!be->att_strict)
        return BERTH_OK;
    char why[192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return cu_fail(be->host, BERTH_E_INTERNAL, "attention: the cluster decode kernel declined a call in its range (%s)",
                   why);
}

berth_status cu_attention_decode_fast(berth_backend *be, berth_stream *s, const berth_attention_params *p,
                                      bool below_mma, bool *ran)
{
    *ran = false;
    if (be->att_decode == CU_ATT_DECODE_OLD)
        return BERTH_OK;
    const berth_kv_view *kv = &p->kv;
    const int64_t T = p->q.ne[2], H = p->q.ne[1];
    const int D = kv->head_dim, DV = kv->head_dim_v;
    if (T != p->n_seqs || T <= 0 || H <= 0 || kv->n_kv_heads <= 0 || H % kv->n_kv_heads != 0)
        return BERTH_OK;
    if (D <= 0 || DV <= 0 || D > 512 || DV > 512 || kv->block_size <= 0)
        return BERTH_OK;
    const int64_t n_rep = H / kv->n_kv_heads;
    if (n_rep > CU_MAX_REP)
        return BERTH_OK;
    const bool gate = p->gate.buf != nullptr;
    if (p->q.dtype != BERTH_DTYPE_F32 || p->out.dtype != BERTH_DTYPE_F32 ||
        (gate && p->gate.dtype != BERTH_DTYPE_F32))
        return BERTH_OK;
    /* Softcap goes to the other decode kernels: none of the models here uses it in attention, and its tanhf,
     * inlined once per key of the unrolled batch, was 4-5.5 KB of this kernel's machine code (code a kernel
     * carries costs at every launch: bench/RESULTS.md session 17). */
    if (p->softcap > 0.0f)
        return BERTH_OK;
    /* So do unaligned rows and head dims that are not whole 16-byte chunks (8 bf16 / f16, 4 f32 elements; 8 for
     * all: a chunk is never cut): every row a model lays out is aligned and every head dim a multiple of 8, and the
     * element-wise copies for the rest were a fifth of this kernel's code. */
    if (!cu_kv_aligned16(kv) || D % 8 != 0 || DV % 8 != 0 ||
        (((uintptr_t)cu_ptr(&p->q) | (uint64_t)p->q.nb[1] | (uint64_t)p->q.nb[2]) & 15u) != 0)
        return BERTH_OK;

    /* Small calls only. Measured on the H200 (bench_cuda_attention, bench/RESULTS.md session 4): one launch wins
     * while a call's work is small — batch 1: 5.3 / 8.6 us against 16.1 / 11.7 at 64 / 640 keys (head dim 256),
     * 11.9 against 17.7 at 640 (512); 32 sequences x 64 keys: 10.2 against 16.6 — and loses from about 8 x 1024
     * visible keys on (32 x 512: 35.8 against 20.8; 1 x 4096 at head dim 512: 51.0 against 22.5), where the split
     * kernel's many blocks stream K/V better. The bound uses the same key bound as the launch shape (capture: the
     * block table's width), so a recorded graph keeps its choice. */
    {
        const int64_t cap = (int64_t)p->block_table.ne[0] * kv->block_size;
        int64_t kvb = be->capturing ? cap : (p->max_kv_len < cap ? p->max_kv_len : cap);
        if (p->mask == BERTH_MASK_CAUSAL && p->window > 0 && p->window < kvb)
            kvb = p->window;
        if (kvb > ADC_MAX_KEYS ||
            (int64_t)p->n_seqs * kvb > (below_mma ? ADC_MMA_FROM_WORK_KEYS : ADC_MAX_WORK_KEYS))
            return BERTH_OK;
    }
    /* Set up the NRW = 1 instance first: its cluster limits stand for the call (the instances of a head dim share
     * the shared-memory budget and it has the most threads per block; a wider NRW uses more registers, which its
     * query does not see — fine at one block per SM, the plan's target; the chosen instance is checked below). */
    adc_plan pl;
    adc_info info;
    {
        const int dmax = D > DV ? D : DV;
        const int E = dmax <= 128 ? 4 : dmax <= 256 ? 8 : 16;
        const adc_kernel k0 = adc_pick(kv->dtype, E, 1);
        if (!k0.fn)
            return adc_decline(be, "no instance for head dim %d (NRW 1)", dmax);
        berth_status st = adc_setup(be, s->cs, k0, &info);
        if (st != BERTH_OK)
            return st;
    }
    const int max_cs = be->att_decode == CU_ATT_DECODE_CLUSTER8 && info.max_cs > 8 ? 8 : info.max_cs;
    adc_shape(be, p, (int)n_rep, max_cs, info.c16, &pl);
    adc_kernel k = adc_pick(kv->dtype, pl.E, pl.nrw);
    if (!k.fn)
        return adc_decline(be, "no instance for E %d, NRW %d", pl.E, pl.nrw);
    adc_info info2;
    berth_status st = adc_setup(be, s->cs, k, &info2);
    if (st != BERTH_OK)
        return st;
    /* this instance refused clusters of 16, or cannot keep all of the call's clusters of 16 resident at once (its
     * own limit: registers, threads and shared memory differ from the NRW = 1 instance that planned the shape) */
    if (pl.cs > info2.max_cs || (pl.cs > 8 && (int64_t)pl.hg * kv->n_kv_heads * p->n_seqs > info2.c16)) {
        adc_shape(be, p, (int)n_rep, 8, 0, &pl);
        k = adc_pick(kv->dtype, pl.E, pl.nrw);
        if (!k.fn)
            return adc_decline(be, "no instance for E %d, NRW %d", pl.E, pl.nrw);
        if ((st = adc_setup(be, s->cs, k, &info2)) != BERTH_OK)
            return st;
    }
    const int64_t blocks = (int64_t)pl.cs * pl.hg * kv->n_kv_heads * p->n_seqs;
    if (blocks > INT32_MAX || pl.smem > (size_t)info2.smem_max || pl.cs > info2.max_cs) /* the old kernels serve it */
        return adc_decline(be, "%lld blocks, %zu bytes of shared memory (limit %d), clusters of %d (limit %d), E %d, "
                           "NRW %d, %d warps", (long long)blocks, pl.smem, info2.smem_max, pl.cs, info2.max_cs, pl.E,
                           pl.nrw, k.threads / 32);

    adc_args a = {};
    cu_attn_args_fill(a, p);
    a.bs_shift = cu_block_shift(kv->block_size);
    a.D = D;
    a.DV = DV;
    a.n_rep = (int32_t)n_rep;
    a.n_kv_heads = kv->n_kv_heads;
    a.T = (int32_t)T;
    a.late = be->att_trigger != CU_ATT_TRIGGER_EARLY;
    /* causal self-attention only: there a forward appends exactly the batch's own rows; cross-attention (MASK_NONE)
     * may append the whole encoder sequence in the same forward */
    a.prewait = be->att_prewait && p->mask == BERTH_MASK_CAUSAL;
    a.cs = pl.cs;
    a.hg = pl.hg;
    a.ring = pl.ring;
    a.per = pl.per;
    a.bt_n = pl.bt_n;
    a.region = (uint32_t)pl.region;
    a.bt_off = (uint32_t)pl.bt_off;
    a.recv_off = (uint32_t)pl.recv_off;

    char what[128] = "";
    if (BERTH_ADC_STAMPS && be->att_prof != CU_ATT_PROF_OFF) {
        snprintf(what, sizeof what, "attn_decode_cluster d%d T=%d cs=%d hg=%d nrw=%d warps=%d blocks=%d", D, a.T,
                 pl.cs, pl.hg, pl.nrw, k.threads / 32, (int)blocks);
        a.prof = cu_att_prof_for(be, s, blocks, ADC_STAMPS, what);
    }

    /* clusters of pl.cs blocks (none when pl.cs is 1), with PDL when enabled */
    const dim3 cluster(pl.cs > 1 ? (unsigned)pl.cs : 1u, 1, 1);
    st = cu_check(be,
                  cu_launch_cluster(be, s->cs, dim3((unsigned)blocks), dim3((unsigned)k.threads), pl.smem, cluster,
                                    k.fn, a),
                  "attn_decode_cluster_kernel");
    if (st == BERTH_OK)
        *ran = true;
    if (st == BERTH_OK && a.prof && !be->capturing)
        return cu_att_prof_report(be, s, a.prof, (int)blocks, ADC_STAMPS, what);
    return st;
}

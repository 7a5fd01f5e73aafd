/*
 * matmul_skinny.cu — batched-decode products (2 <= M <= 64 rows of x) in BF16 compute mode with bf16 / f16 weights:
 * y[m, n] = sum_k x[m, k] w[n, k], with matmul's RMS-norm prologue, bias, accumulate and gated (GLU) epilogue, on
 * the tensor cores, streaming every weight once. matmul.cu calls it first for M in [be->skinny_min_m, 64].
 *
 * Why it is built this way:
 *  - At decode a product reads each weight once and does 2*M flops per weight: it is bound by memory bandwidth up
 *    to M = 64 (64 flops per weight byte; mma.sync sustains ~150 per byte of the H200's bandwidth), and at the
 *    small E2B matrices (1-8 MB) by latency. So the kernel's only jobs are to keep enough weight bytes in flight,
 *    to start them early, and to finish in one launch. cuBLAS's GEMMs needed an x gather before and a GLU/reduce
 *    kernel after.
 *  - Weights are the mma's A operand (m16n8k16: 16 rows of w x 16 k), x is the B operand (8 sequences per n8
 *    tile), so M = 2..8 costs one n8 tile and no padded mma rows; accumulators are fp32. Each warp owns 32 rows of
 *    w (two m16 tiles) and all NT = ceil(M / 8) (bucketed 1, 2, 4, 6, 8) n8 tiles: every x fragment read from
 *    shared memory feeds two mmas, every w fragment NT.
 *  - A block owns BN rows of w (32, 64, 128 or 256; the host picks per shape) and a range of K. Its w rows stream in
 *    16-byte cp.async chunks (L2 only) through an S-stage ring of 64-column k tiles (rows XOR-swizzled in 16-byte
 *    units, so ldmatrix reads them without bank conflicts); the f32 x tile of the same columns (and the norm
 *    weight's) rides in the same stage. S is as deep as the shared-memory budget allows: two blocks per SM for
 *    BN <= 128 (<= 110 KiB each, leaving room for a small successor kernel under PDL), one for BN = 256.
 *  - x is converted once per k tile, by all threads, into a bf16 (f16) tile that every warp then reads with
 *    ldmatrix; the norm prologue's weight multiplies x there and its sum of squares is gathered there. So x is
 *    rounded to the weight dtype exactly as the cuBLAS path rounds it, with one difference under the prologue: the
 *    row's 1/rms is applied to the fp32 product in the epilogue (it needs the whole row; a block may see only a
 *    K range) instead of before the rounding — the same error class (one 2^-9 rounding per product term).
 *  - Split-K without a second kernel: when N / BN blocks leave the GPU short of loads in flight, the K tiles are
 *    split over a thread-block cluster along gridDim.y (up to 8, or 16 where the device schedules it). Each block
 *    leaves its fp32 partial tile in its own shared memory; after a cluster barrier every block sums a slice of
 *    the outputs over all blocks' partials through distributed shared memory, in block order (deterministic),
 *    and applies the epilogue. Without a split the same code runs on the block's own partials.
 *  - The epilogue goes through shared memory so that a thread writes consecutive n of one row (coalesced), and so
 *    that a block of the HALVES epilogue, which holds BN/2 gate rows and the BN/2 matching up rows, pairs them.
 *  - PDL (cuda_launch.cuh): when w is a BERTH_USAGE_WEIGHTS buffer (no kernel writes it) the first S-1 stages of
 *    weight loads are issued before cu_pdl_wait(), while the previous kernel still runs; x, the norm weight, bias
 *    and y are touched only after it.
 *
 * Layout rules (else the caller's GEMV / cuBLAS path runs): w 16-byte aligned with rows a multiple of 16 bytes
 * apart and K a multiple of 8; the norm weight (modes W, W_ONE_PLUS) 16-byte aligned. x and y rows are free
 * (per-row pointers; 16-byte x loads where every row is 16-byte aligned, else 4-byte ones).
 *
 * Row groups: a product of more rows can run as ceil(M / mg) groups of mg rows along gridDim.z, each block with
 * the narrow x tile of its group and all of the group's blocks reading the same weights (the later groups mostly
 * from L2). Measured only worth it for small products (K or N <= CU_SKINNY_SMALL_KN, at most CU_SKINNY_SMALL_BYTES
 * of weights: Gemma 4's PLE gate and projection), which take the kernel up to 64 rows that way.
 *
 * Switches (read at backend init, cuda_backend.cu; docs/config.md): BERTH_CUDA_SKINNY 0 off, 2..64 the smallest M
 * it takes (default CU_SKINNY_MIN_M), BERTH_CUDA_SKINNY_MAX the largest (default CU_SKINNY_MAX_M);
 * BERTH_CUDA_SKINNY_SMALL 0 keeps the small products above that on cuBLAS; BERTH_CUDA_SKINNY_MG 8 / 16 / 32 puts
 * every product above that many rows in row groups; BERTH_CUDA_SKINNY_BN 32 / 64 / 128 / 256 fixes the tile width,
 * BERTH_CUDA_SKINNY_BN_UNSPLIT (default 32) that of products without a K split (see sk_choose);
 * BERTH_CUDA_SKINNY_WGMMA 0 / 1 (default) / 2: the 32-row-x XH products on mma.sync, on wgmma with the ring filled
 * by cp.async, or by TMA (sm_90a image only: elsewhere the twins run mma.sync);
 * BERTH_CUDA_SKINNY_XPRE (0 off, 1 up to 64 rows, 2..64 the bound; default CU_SKINNY_XPRE_M) sends products with
 * an x_pre norm above the range and up to that many rows to the XH instances (x rounded by the norm: sk_shape);
 * BERTH_CUDA_SKINNY_PLAIN (0 off, else the bound; default CU_SKINNY_PLAIN_M) does the same for products without any
 * norm, x rounded by matmul.cu's pack (cu_matmul_pack_x) — at 32 rows cheaper than cuBLAS mostly because the
 * kernels around it keep their PDL overlap;
 * BERTH_CUDA_SKINNY_STRICT 1 makes a call in the kernel's range that its plan declines an error (tests);
 * BERTH_CUDA_SKINNY_PUSH 1 (default; 0 pulls as before) runs the split 64-row-tile XH products at 9-32 rows on
 * the push twins (the cluster reduction by st.async into the owner's shared memory: sk_kernel's PUSH), 2 the same
 * with a relaxed cluster barrier before exit.
 */
#include "cuda_cluster.cuh"
#include "cuda_internal.h"
#include "cuda_device.cuh"
#include "cuda_launch.cuh"
#ifdef BERTH_SK_STAMPS
#include "attention_args.cuh" /* cu_att_prof_for / cu_att_prof_report */
#endif

#include <cooperative_groups.h>
#include <cudaTypedefs.h> /* PFN_cuTensorMapEncodeTiled_v12000 */
#include <cuda.h> /* CUtensorMap (the TMA instances' descriptors; encoded through the runtime's driver entry point) */

/* wgmma (sm_90a only): compiled where nvcc targets the architecture-specific features */
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SK_WGMMA 1
#else
#define SK_WGMMA 0
#endif
#include <string.h>

namespace cg = cooperative_groups;

#define SK_MAX_M 64
#define SK_BK 64                 /* k columns per stage */
#define SK_MAX_STAGES 8
#define SK_PORTABLE_CLUSTER 8
#define SK_MAX_CLUSTER 16        /* non-portable cluster size (sm_90); used only where the occupancy query allows */
#define SK_MIN_KT_PER_SPLIT 2    /* k tiles per split at least */
#define SK_GPC_SMS 16            /* SMs of the smallest GPC (H100 / H200: 16 or 18), where a cluster must fit */
/* Dynamic shared memory per block: two blocks per SM (BN <= 128) or one (BN = 256), each leaving ~6 KiB of the
 * SM's 228 KiB for a block of the next kernel (PDL) and the 1 KiB the runtime reserves per block. */
#define SK_SMEM_TWO (110 * 1024)
#define SK_SMEM_ONE (220 * 1024)

/* The tiling of one kernel instance: BN rows of w per block, NT n8 tiles of x; XH: x arrives already rounded to
 * the weight dtype (sk_args.xh), so each stage holds that tile in the layout ldmatrix reads and nothing converts. */
template <int BN, int NT, bool XH = false>
struct sk_shape {
    static constexpr int MP = NT * 8;                  /* x rows in the tile (M padded) */
    static constexpr int THREADS = BN == 256 ? 256 : 128;
    static constexpr int RG = BN / 32;                 /* warps along w rows (32 rows each) */
    static constexpr int KP = THREADS / 32 / RG;       /* warps along k within a tile (BN = 64: 2) */
    static constexpr int WBYTES = BN * SK_BK * 2;      /* w tile: BN rows of 128 bytes, swizzled */
    static constexpr int XBYTES = MP * SK_BK * (XH ? 2 : 4); /* x tile: f32 rows of 256 bytes (XH: 128, swizzled) */
    static constexpr int GBYTES = XH ? 0 : SK_BK * 4;  /* the norm weight's 64 values, raw (<= 4 bytes each) */
    static constexpr int STAGE = WBYTES + XBYTES + GBYTES;
    static constexpr int XB = XH ? 0 : MP * SK_BK * 2; /* the converted x tile: bf16/f16 rows of 128 bytes */
    static constexpr int SSB = SK_MAX_M * 4;           /* the block's sums of squares per x row */
    static constexpr int BUDGET = BN == 256 ? SK_SMEM_ONE : SK_SMEM_TWO;
    static constexpr int S0 = (BUDGET - XB - SSB) / STAGE;
    static constexpr int S = S0 > SK_MAX_STAGES ? SK_MAX_STAGES : S0;
    static constexpr int PITCH = BN + 4;               /* floats per row of the partial tile: conflict-free stores */
    static constexpr int PART = KP * MP * PITCH * 4;   /* partial tile [KP][MP][PITCH], over the ring at the end */
    static constexpr size_t SMEM = (size_t)S * STAGE + XB + SSB;
    static constexpr int WCH = BN * 8 / THREADS;       /* 16-byte w chunks per thread per stage */
    static constexpr int XCH = MP * 16 / THREADS;      /* 16-byte x chunks per thread per stage */
    static constexpr int XEL = MP * SK_BK / THREADS;   /* x elements per thread per stage (4-byte loads) */
    static_assert(S >= 3, "at least two stages in flight");
    static_assert(PART <= S * STAGE, "the partial tile reuses the ring");
    static_assert(XCH >= 1 && THREADS % 64 == 0, "thread mappings");
    static_assert(!XH || (MP * 8) % THREADS == 0, "XH: whole 16-byte x chunks per thread");
};

struct sk_args {
    const float *x[SK_MAX_M]; /* row m of x */
    float *y[SK_MAX_M];       /* row m of y */
    const float *u[SK_MAX_M]; /* GLU MUL: row m of y_glu_up */
    const char *w;
    int64_t ldw;              /* bytes between rows of w (a multiple of 16) */
    const void *bias;         /* NULL: none (HALVES: 2N entries) */
    const void *gw;           /* norm weight (modes W, W_ONE_PLUS; 16-byte aligned), else NULL */
    int32_t M, N, K;          /* N: outputs (HALVES: half the rows of w) */
    int32_t mg;               /* rows of x per block: blockIdx.z takes rows [z * mg, z * mg + mg) (mg = M: one) */
    int32_t nkt;              /* k tiles: ceil(K / SK_BK) */
    int32_t kt_per_split;     /* k tiles per block of a cluster (gridDim.y blocks split K) */
    int32_t bias_dt;
    int32_t g_dt, g_es;       /* norm weight dtype and element size */
    int32_t norm_mode;        /* BERTH_NORM_*: W_NONE = no prologue */
    float eps;
    int32_t glu, act;         /* BERTH_GLU_*, BERTH_ACT_* */
    int32_t accumulate;
    int32_t early;            /* w may be read before cu_pdl_wait */
    int32_t u_prefetch;       /* XH, GLU MUL: this thread's y_glu_up elements prefetched into L2 at entry */
    int32_t end_relaxed;      /* the last cluster barrier arrives relaxed (no wait for the stores' acknowledgement) */
    int32_t xvec;             /* every x row 16-byte aligned: 16-byte x loads */
    const uint16_t *xh;       /* XH instances: x rounded to the weight dtype, row m at xh + m * ldxh (16-byte rows) */
    int64_t ldxh;
    uint16_t *ysh;            /* NULL, or y rounded to ysh_dt as well, row m at ysh + m * ldysh (the stream's x
                               * shadow, cuda_internal.h: the next product's x without a pack) */
    int64_t ldysh;
    int32_t ysh_dt;
    int32_t push_end;         /* the push instances: a relaxed cluster barrier before exit (BERTH_CUDA_SKINNY_PUSH=2;
                               * in padding before tmw: the other fields' offsets are unchanged) */
#ifdef BERTH_SK_STAMPS
    unsigned long long *prof; /* BERTH_CUDA_ATT_PROF=1 in a -Dskinny_stamps=true build: SK_STAMPS per block */
#endif
    /* The TMA instances (WG 2): w as [rows][K] and xh as [M][K], boxes of 64 columns x (BN or BN/2) / 32 rows in the
     * 128-byte swizzle; zeros past the tensor's edges (64-byte aligned: CUtensorMap) */
    CUtensorMap tmw, tmx;
};

/* Measurement build only (meson -Dskinny_stamps=true; BERTH_CUDA_ATT_PROF=1, eager calls): thread 0 of every block
 * records the global timer at the kernel's phase boundaries: 0 entry, 1 early weights issued, 2 after the PDL wait,
 * 3 prologue issued, 4 first tile landed, 5 k loop done, 6 partials visible (cluster barrier), 7 outputs stored,
 * 8 exit (after the last cluster barrier). Without the option the kernel's code is as tuned. */
#define SK_STAMPS 9
#ifdef BERTH_SK_STAMPS
#define SK_STAMP(k)                                                                                                   \
    do {                                                                                                              \
        if (a.prof && threadIdx.x == 0) {                                                                             \
            unsigned long long t_;                                                                                    \
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_));                                                   \
            a.prof[((size_t)blockIdx.x + gridDim.x * ((size_t)blockIdx.y + gridDim.y * blockIdx.z)) * SK_STAMPS +  \
                   (k)] = t_;                                                                                         \
        }                                                                                                             \
    } while (0)
#else
#define SK_STAMP(k) ((void)0)
#endif

// ---------------------------------------------------------------------------------------------------------------
// Device helpers.

static __device__ __forceinline__ uint32_t sk_smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16 bytes global -> shared, L2 only (weights are streamed once); nbytes 0 fills zeros and reads nothing. */
static __device__ __forceinline__ void sk_cp16(uint32_t dst, const void *src, int nbytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(nbytes) : "memory");
}

/* 4 bytes global -> shared (x rows that are not 16-byte aligned); nbytes 0 fills zeros. */
static __device__ __forceinline__ void sk_cp4(uint32_t dst, const void *src, int nbytes)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(nbytes) : "memory");
}

static __device__ __forceinline__ void sk_commit()
{
    asm volatile("cp.async.commit_group;" ::: "memory");
}

template <int N>
static __device__ __forceinline__ void sk_wait_group()
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* Two floats as one register of the weight dtype's pair (lo in the low half), round to nearest even. */
template <int WDT>
static __device__ __forceinline__ uint32_t sk_pack2(float lo, float hi)
{
    if (WDT == BERTH_DTYPE_BF16) {
        const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<const uint32_t *>(&v);
    } else {
        const __half2 v = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<const uint32_t *>(&v);
    }
}

template <int WDT>
static __device__ __forceinline__ void sk_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    if (WDT == BERTH_DTYPE_BF16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ void sk_ldsm4(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2,
                                                uint32_t &r3)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

static __device__ __forceinline__ void sk_ldsm2(uint32_t addr, uint32_t &r0, uint32_t &r1)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(addr));
}

/* wgmma (sm_90): the shared-memory matrix descriptor of a K-major tile of 128-byte rows in the 128-byte swizzle
 * (sk_swz's layout: 8-row atoms of 1024 bytes, 16-byte chunks XORed with the row's low 3 bits; the tile 1024-byte
 * aligned): start address >> 4, leading offset unused (1), stride offset 1024 bytes between 8-row groups, swizzle
 * mode 1 (128 B). A k16 step inside the 64-column tile starts 32 bytes further. */
static __device__ __forceinline__ uint32_t sk_wg_desc_lo(uint32_t saddr)
{
    return ((saddr & 0x3FFFF) >> 4) | (1u << 16);
}

/* The whole descriptor from its low word: the high word is a constant (stride offset, swizzle mode). Adding a
 * tile's byte offset >> 4 to the low word moves the start field only (shared addresses < 2^18: no carry out). */
static __device__ __forceinline__ uint64_t sk_wg_desc_of(uint32_t lo)
{
    return (uint64_t)lo | ((uint64_t)((1024 >> 4) | (1u << 30)) << 32);
}

/* D (64 x 32, fp32: 16 registers a thread) += A (64 x 16, smem) B^T (32 x 16, smem), both K-major. */
template <int WDT>
static __device__ __forceinline__ void sk_wgmma_64x32(float (&d)[16], uint64_t da, uint64_t db)
{
#define SK_WG_ARGS                                                                                                    \
    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),    \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])                        \
    : "l"(da), "l"(db)
    if (WDT == BERTH_DTYPE_BF16)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, "
                     "%10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}" SK_WG_ARGS);
    else
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, "
                     "%10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}" SK_WG_ARGS);
#undef SK_WG_ARGS
}

/* The TMA ring (sm_90): one mbarrier per stage, armed by thread 0 with the stage's byte count, completed by the
 * tensor copies themselves; the block waits on its phase parity. */
[[maybe_unused]] static __device__ __forceinline__ void sk_bar_init(uint32_t bar)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
}

[[maybe_unused]] static __device__ __forceinline__ void sk_bar_expect(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

[[maybe_unused]] static __device__ __forceinline__ void sk_bar_wait(uint32_t bar, uint32_t parity)
{
    asm volatile("{\n.reg .pred p;\nSK_BAR_WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra SK_BAR_WAIT;\n}" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}

/* The push reduction (PUSH instances, BERTH_CUDA_SKINNY_PUSH): the address of this block's shared address in
 * cluster rank `rank`'s window; a 4-byte store into another block's shared memory that completes its bytes on
 * that block's mbarrier (remote_bar, mapped as well); a wait on this block's mbarrier phase that acquires at
 * cluster scope (the stores came from other blocks). */
[[maybe_unused]] static __device__ __forceinline__ uint32_t sk_mapa(uint32_t saddr, uint32_t rank)
{
    uint32_t r;
    asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(saddr), "r"(rank)); /* pure: may be hoisted */
    return r;
}

[[maybe_unused]] static __device__ __forceinline__ void sk_st_async(uint32_t remote, float v, uint32_t remote_bar)
{
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(remote),
                 "r"(__float_as_uint(v)), "r"(remote_bar)
                 : "memory");
}

[[maybe_unused]] static __device__ __forceinline__ void sk_bar_wait_cluster(uint32_t bar, uint32_t parity)
{
    asm volatile("{\n.reg .pred p;\nSK_BAR_WAIT_CL:\n"
                 "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra SK_BAR_WAIT_CL;\n}" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}

/* Box (c0 = first column, c1 = first row) of the tensor map into shared memory at dst, completing on bar. */
[[maybe_unused]] static __device__ __forceinline__ void sk_tma(uint32_t dst, const CUtensorMap *map, int c0, int c1,
                                                               uint32_t bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
                 "%3}], [%4];" ::"r"(dst),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}

/* Byte offset of 16-byte chunk c of row r in a tile of 128-byte rows: chunks are XOR-swizzled by the row's low 3
 * bits, so the 8 rows an ldmatrix reads at one logical chunk hit 8 different 16-byte bank groups. */
static __host__ __device__ __forceinline__ uint32_t sk_swz(int r, int c)
{
    return (uint32_t)(r * 128 + ((c ^ (r & 7)) << 4));
}

/* The factor the prologue's weight mode applies to x[k] (g widened from the stage's raw copy). */
static __device__ __forceinline__ float sk_norm_factor(int mode, float g)
{
    return mode == BERTH_NORM_W_ONE_PLUS ? 1.0f + g : g;
}

/* The gated epilogue's activation as a call: cu_act's switch over every activation, inlined at each use, is code
 * that every block carries (machine code costs at every launch: bench/RESULTS.md session 17). */
static __device__ __noinline__ float sk_act(int act, float x)
{
    return cu_act(act, x);
}

/* Output (m, n) of the block's row group from its summed product z (HALVES: and the up row's zu), after any 1/rms:
 * bias, the gated epilogue, accumulate, the store, and the rounded copy for the next product (a.ysh). Both
 * epilogues end here; inlined, so each instance's code is as if written in place. GELU: Gemma's GELU-tanh inline,
 * the other activations through the call (a __noinline__ call in this epilogue costs: bench/RESULTS.md sessions 20
 * and 21, +1.4% at 32 sequences for this). Only the XH instances (9-64 rows) pass true; the others keep the call. */
template <bool GELU = false>
static __device__ __forceinline__ void sk_store_output(const sk_args &a, float *const *Y, const float *const *U,
                                                       int mz, int m, int n, float z, float zu, bool halves)
{
    if (a.bias) {
        z += cu_ld(a.bias, a.bias_dt, n);
        if (halves)
            zu += cu_ld(a.bias, a.bias_dt, (int64_t)a.N + n);
    }
    float v = z;
    if constexpr (GELU) {
        if (halves || a.glu == BERTH_GLU_MUL) {
            const float f = a.act == BERTH_ACT_GELU_TANH ? cu_gelu_tanh(z) : sk_act(a.act, z);
            v = f * (halves ? zu : U[m][n]);
        }
    } else {
        if (halves)
            v = sk_act(a.act, z) * zu;
        else if (a.glu == BERTH_GLU_MUL)
            v = sk_act(a.act, z) * U[m][n];
    }
    float *yr = Y[m];
    if (a.accumulate)
        v += yr[n];
    yr[n] = v;
    if (a.ysh)
        cu_st(a.ysh, a.ysh_dt, (int64_t)(mz + m) * a.ldysh + n, v);
}

/* Ranks of a cluster whose partials one output's sum has in flight at once: 16 loads (32 with the up half). */
#define SK_EPI_LOADS 16

/* The gated epilogue's second operand under BERTH_GLU_MUL (Gemma 4's per-layer input, written at the start of the
 * step and evicted from L2 by every layer's weights since) is read last, after the cluster reduction: a DRAM round
 * trip at the kernel's end. This prefetches the elements of this thread's outputs in sk_outputs_xh (the same
 * slicing; one at the E2B gate) into L2 at entry. A hint that reads no value, so it may precede the PDL wait: L2
 * is where global memory is coherent, and a write after it updates the line. */
template <int BN, int THREADS>
static __device__ __forceinline__ void sk_prefetch_u(const sk_args &a, int splits, int rank, int Mb, int mz, int n0)
{
    const int lno = __ffs(BN) - 1; /* GLU MUL: BN outputs per block */
    const int NO = 1 << lno;
    const int total = Mb * NO;
    const int share = (total + splits - 1) / splits;
    const int i0 = rank * share, i1 = i0 + share < total ? i0 + share : total;
    for (int idx = i0 + (int)threadIdx.x; idx < i1; idx += THREADS) {
        const int m = idx >> lno, n = n0 + (idx & (NO - 1));
        if (n < a.N)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(a.u[mz + m] + n));
    }
}

/* The outputs of an XH instance's block (m, n0 + r): its slice of the cluster's Mb * NO, each the partial tiles of
 * every block of the cluster (rank order) and every k phase summed in that order, then bias, the gated epilogue,
 * accumulate (XH instances carry no norm prologue). The remote partials of up to SK_EPI_LOADS / KP ranks are
 * loaded before any is added — the same sums in the same order as the rolled loop the other instances keep, which
 * waits on each rank in turn. E2B decode on the H200 (bench/RESULTS.md session 20, same-call A/Bs): this loop in
 * the XH instances only, +2.7% at 16 sequences and +3.9% at 32, 8 even; in every instance, +2.4% at 32 but -2.5% at
 * 8 (the f32-x instances, <= 8 rows, keep the rolled loop); as a __noinline__ call, -2.9% / -5.0% at 32 / 8, and
 * the rolled loop unchanged behind such a call -5.3% / -6.5% — keep it inlined. */
template <int BN, int KP, int MP, int PITCH, int THREADS>
static __device__ __forceinline__ void sk_outputs_xh(const sk_args &a, const float *part, int splits, int rank,
                                                     int Mb, int mz, int n0)
{
    constexpr int QC = SK_EPI_LOADS / KP > 1 ? SK_EPI_LOADS / KP : 1; /* ranks per chunk of loads */
    const bool halves = a.glu == BERTH_GLU_HALVES;
    const int lno = halves ? __ffs(BN / 2) - 1 : __ffs(BN) - 1; /* outputs per block: 1 << lno (a power of 2) */
    const int NO = 1 << lno;
    const int total = Mb * NO;
    const int share = (total + splits - 1) / splits;
    const int i0 = rank * share, i1 = i0 + share < total ? i0 + share : total;
    const float *const *const U = a.u + mz;
    float *const *const Y = a.y + mz;
    for (int idx = i0 + (int)threadIdx.x; idx < i1; idx += THREADS) {
        const int m = idx >> lno, r = idx & (NO - 1), n = n0 + r;
        if (n >= a.N)
            continue;
        const int off = m * PITCH + r;
        float z = 0.0f, zu = 0.0f;
        if (splits > 1) {
            cg::cluster_group cl = cg::this_cluster();
#pragma unroll 1
            for (int q0 = 0; q0 < splits; q0 += QC) {
                float pz[QC][KP], pu[QC][KP];
#pragma unroll
                for (int j = 0; j < QC; j++) {
                    if (q0 + j < splits) {
                        const float *pq = cl.map_shared_rank(part, (unsigned)(q0 + j));
#pragma unroll
                        for (int p = 0; p < KP; p++) {
                            pz[j][p] = pq[p * MP * PITCH + off];
                            pu[j][p] = halves ? pq[p * MP * PITCH + off + BN / 2] : 0.0f;
                        }
                    }
                }
#pragma unroll
                for (int j = 0; j < QC; j++) {
                    if (q0 + j < splits) {
                        float s = 0.0f, su = 0.0f;
#pragma unroll
                        for (int p = 0; p < KP; p++) {
                            s += pz[j][p];
                            su += pu[j][p];
                        }
                        z += s;
                        zu += su;
                    }
                }
            }
        } else {
#pragma unroll
            for (int p = 0; p < KP; p++) {
                z += part[p * MP * PITCH + off];
                if (halves)
                    zu += part[p * MP * PITCH + off + BN / 2];
            }
        }
        sk_store_output<true>(a, Y, U, mz, m, n, z, zu, halves);
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The kernel.

/* One block: BN rows of w (HALVES: BN/2 gate rows and their BN/2 up rows) x the mg rows of x of its row group
 * (blockIdx.z), over k tiles
 * [blockIdx.y * kt_per_split, ...). gridDim.y > 1 only as a cluster of that many blocks (see the top comment). */
template <int WDT, int NT, int BN, bool XH, int WG = 0, bool PUSH = false>
__global__ void __launch_bounds__(sk_shape<BN, NT, XH>::THREADS, BN == 256 ? 1 : 2)
    sk_kernel(const __grid_constant__ sk_args a)
{
    using C = sk_shape<BN, NT, XH>;
    /* WG (BERTH_CUDA_SKINNY_WGMMA, the XH instances of NT 4 and BN 32 / 64): one wgmma m64n32k16 per k16 step for
     * the whole block instead of per-warp ldmatrix + mma.sync. BN 64: A = the 64 weight rows, B = the 32 x rows.
     * BN 32: A = the x tile (32 rows; its rows 32..63 read the weight tile that follows it in the stage: garbage
     * rows of D, never stored), B = the 32 weight rows; the stage then holds x first. Tiles 1024-byte aligned (the
     * 128-byte swizzle's atom); the partial tile has one k phase. */
    static_assert(!WG || (XH && NT == 4 && (BN == 32 || BN == 64) && C::STAGE % 1024 == 0 && C::WBYTES % 1024 == 0),
                  "the wgmma instances");
    /* wgmma exists only in the sm_90a image (this file is built for it too); the sm_90 image's and the PTX's twins
     * run the mma.sync path */
    constexpr bool WGX = WG && SK_WGMMA;
    /* WG 2: the ring filled by the tensor memory accelerator — one thread issues each stage's w and x boxes
     * (sk_args.tmw / tmx) against the stage's mbarrier, instead of every thread its 16-byte cp.async chunks */
    constexpr bool TMA = WGX && WG == 2;
    constexpr bool XFIRST = WGX && BN == 32;
    /* PUSH (BERTH_CUDA_SKINNY_PUSH; the host launches it only for XH products with a K split, no HALVES epilogue,
     * no accumulate): the cluster reduction pushes instead of pulling. Each block sums its k phases of every output
     * and stores that sum (st.async) into the owning block's receive area, recv[q * share + j] (q: the sender's
     * rank, j: the output's index in the owner's slice), past everything else in shared memory (a fast block may
     * push while the owner still runs its k loop); the stores complete bytes on the owner's mbarrier, which the
     * owner waits on before it sums recv in rank order (the pull path's sums, in its order: bit-identical). No
     * cluster barrier after the k loop (only the wait on the entry arrive, which orders the pushes after every
     * mbarrier's initialisation) and none at the end: no block reads another's shared memory. */
    static_assert(!PUSH || (XH && WG != 2), "the push instances: XH, ring by cp.async");
    constexpr uint32_t W_OFF = XFIRST ? C::XBYTES : 0, X_OFF = XFIRST ? 0 : C::WBYTES;
    constexpr int KPE = WGX ? 1 : C::KP; /* k phases of the partial tile */
    constexpr int S = C::S, MP = C::MP, THREADS = C::THREADS;
    /* 1024: the 128-byte swizzle's atom, which the wgmma descriptors assume of every tile (no static shared memory
     * here, so the dynamic base is where the alignment lands; the WG instances check it) */
    extern __shared__ __align__(1024) unsigned char sk_smem[];
    SK_STAMP(0);
    cu_pdl_trigger();

    const int t = (int)threadIdx.x, lane = t & 31, warp = t >> 5;
    const int splits = (int)gridDim.y, rank = (int)blockIdx.y;
    /* this block's rows of x: mz .. mz + Mb - 1 (row groups along z; the weights are read by every group, the
     * later ones mostly from L2) */
    const int mz = (int)blockIdx.z * a.mg, Mb = a.M - mz < a.mg ? a.M - mz : a.mg;
    const float *const *const X = a.x + mz;
    [[maybe_unused]] float *const *const Y = a.y + mz;       /* the rolled epilogue's (not XH) */
    [[maybe_unused]] const float *const *const U = a.u + mz;
    const int kt0 = rank * a.kt_per_split;
    const int nt = (a.nkt - kt0 < a.kt_per_split ? a.nkt - kt0 : a.kt_per_split); /* >= 1: no empty split */
    const bool halves = a.glu == BERTH_GLU_HALVES;
    const int NO = halves ? BN / 2 : BN; /* outputs per block */
    const int n0 = (int)blockIdx.x * NO;
    const uint32_t base = sk_smem_addr(sk_smem);
    if constexpr (WGX)
        if (base & 1023u) /* a misaligned tile would be read with the wrong swizzle phase: fail loudly */
            __trap();
    /* PUSH: the mbarrier at base + SMEM (8 bytes, 16 reserved), recv from + 16: splits * share floats. Thread 0
     * arms it for the bytes this block will receive (splits * its output count: 0 allowed, then the phase completes
     * at the arrive), makes the initialisation visible to the cluster, and every thread arrives on the cluster
     * barrier whose wait precedes this block's first push (so no block pushes into an uninitialised mbarrier). */
    if constexpr (PUSH) {
        const uint32_t pbar = base + (uint32_t)C::SMEM;
        const int ptotal = Mb * BN; /* NO = BN (no HALVES) */
        const int pshare = (ptotal + splits - 1) / splits;
        const int pi0 = rank * pshare, pi1 = pi0 + pshare < ptotal ? pi0 + pshare : ptotal;
        if (t == 0) {
            const int cnt = pi1 > pi0 ? pi1 - pi0 : 0;
            sk_bar_init(pbar);
            sk_bar_expect(pbar, (uint32_t)(splits * cnt * 4));
            asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        }
        __syncwarp(); /* converged for .aligned after thread 0's branch */
        cu_cluster_arrive_relaxed();
    }
    /* stage s: w at base + s*STAGE, x at + WBYTES (f32; XH: the rounded tile itself), norm weight at + WBYTES +
     * XBYTES (not XH); then xb (not XH), then ssp */
    const uint32_t xb = base + S * C::STAGE;
    float *const ssp = reinterpret_cast<float *>(sk_smem + S * C::STAGE + C::XB);

    /* This thread's w chunks: column chunk wc of rows (t >> 3) + j * THREADS/8. Each chunk's shared-memory offset
     * is fixed for the kernel and its source advances by a tile per call (k tiles are issued in order): the k loop
     * neither rebuilds addresses nor branches around a copy. A row past N (w) or past the group's Mb (x), and a
     * chunk past K, take a zero-byte copy from the tensor's first element (zeros in shared memory, which reach only
     * outputs nobody stores). Written with a branch and the addresses rebuilt per tile, the loop was 151
     * instructions per warp and tile at the 32-row XH instance for 16 that move or multiply data (bench/RESULTS.md
     * session 23); with the sources fixed but offset by kt each call, ptxas still rebuilt them from row x stride
     * (92 at that instance, ~55 of the wgmma twin's 104: session 24). */
    const int wc = t & 7;
    const char *wcur[C::WCH]; /* the chunk of the next k tile to issue */
    uint32_t wdst[C::WCH];
    bool wok[C::WCH];
#pragma unroll
    for (int j = 0; j < C::WCH; j++) {
        const int r = j * (THREADS / 8) + (t >> 3);
        const int o = n0 + (halves && r >= BN / 2 ? r - BN / 2 : r);
        const int64_t row = halves && r >= BN / 2 ? (int64_t)a.N + o : o;
        wok[j] = o < a.N;
        wcur[j] = wok[j] ? a.w + row * a.ldw + wc * 16 + (int64_t)kt0 * (SK_BK * 2) : a.w;
        wdst[j] = sk_swz(r, wc);
    }
    int kw = kt0 * SK_BK + wc * 8; /* this thread's first k in the next w tile */
    auto load_w = [&](int s) {     /* the next k tile's w into stage s */
        const uint32_t ws = base + s * C::STAGE + W_OFF;
        const bool in = kw < a.K; /* chunks past K are zero-filled */
#pragma unroll
        for (int j = 0; j < C::WCH; j++) {
            const bool on = in && wok[j];
            sk_cp16(ws + wdst[j], on ? wcur[j] : a.w, on ? 16 : 0);
            wcur[j] += SK_BK * 2;
        }
        kw += SK_BK;
    };
    /* XH: this thread's x chunks (row m, 16-byte column chunk c of each k tile), as the w chunks */
    constexpr int XHC = XH ? MP * 8 / THREADS : 1;
    [[maybe_unused]] const uint16_t *xcur[XHC]; /* the chunk of the next k tile to issue */
    [[maybe_unused]] uint32_t xdst[XHC];
    [[maybe_unused]] bool xok[XHC];
    [[maybe_unused]] int kx = kt0 * SK_BK + (t & 7) * 8; /* this thread's first k in the next x tile */
    if constexpr (XH) {
#pragma unroll
        for (int j = 0; j < XHC; j++) {
            const int q = j * THREADS + t, m = q >> 3;
            xok[j] = m < Mb;
            xcur[j] = xok[j] ? a.xh + (int64_t)(mz + m) * a.ldxh + kx : a.xh;
            xdst[j] = sk_swz(m, q & 7);
        }
    }
    /* f32 x (not XH) with 16-byte rows: this thread's chunks (row m, float4 fc4 of each k tile), fixed */
    constexpr int FXC = XH ? 1 : C::XCH;
    [[maybe_unused]] const float *frow[FXC];
    [[maybe_unused]] uint32_t fdst[FXC];
    [[maybe_unused]] bool fok[FXC];
    [[maybe_unused]] const int fc4 = t & 15;
    if constexpr (!XH) {
#pragma unroll
        for (int j = 0; j < FXC; j++) {
            const int m = j * (THREADS / 16) + (t >> 4);
            fok[j] = m < Mb;
            frow[j] = (fok[j] ? X[m] : X[0]) + fc4 * 4;
            fdst[j] = m * 256 + fc4 * 16;
        }
    }
    /* x (and the norm weight) of k tile kt into stage s; rows past the group's Mb are zero-filled under XH, never
     * loaded otherwise (the conversion writes zeros for them); columns past K are zero-filled. */
    auto load_x = [&](int kt, int s) {
        const uint32_t xs = base + s * C::STAGE + X_OFF;
        if constexpr (XH) { /* 8 chunks of 16 bytes per row, straight into the swizzled tile (K % 8 == 0); the
                             * next k tile (kt is that tile: issued in order) */
            const bool in = kx < a.K;
#pragma unroll
            for (int j = 0; j < XHC; j++) {
                const bool on = in && xok[j];
                sk_cp16(xs + xdst[j], on ? xcur[j] : a.xh, on ? 16 : 0);
                xcur[j] += SK_BK;
            }
            kx += SK_BK;
            (void)kt;
        } else {
            const int k0 = kt * SK_BK;
            if (a.xvec) { /* as the XH chunks: fixed row pointers, no branch (rows past Mb: zero bytes from row 0,
                           * never converted) */
                const bool in = k0 + fc4 * 4 < a.K;
#pragma unroll
                for (int j = 0; j < C::XCH; j++) {
                    const bool on = in && fok[j];
                    sk_cp16(xs + fdst[j], on ? frow[j] + k0 : X[0], on ? 16 : 0);
                }
            } else {
                const int kc = t & 63;
                const bool in = k0 + kc < a.K;
#pragma unroll 4
                for (int j = 0; j < C::XEL; j++) {
                    const int m = j * (THREADS / 64) + (t >> 6);
                    if (m < Mb)
                        sk_cp4(xs + m * 256 + kc * 4, in ? X[m] + k0 + kc : X[m], in ? 4 : 0);
                }
            }
            if (a.gw) {
                const int per = 16 / a.g_es; /* elements per 16-byte chunk */
                if (t < SK_BK / per) {
                    const bool in = k0 + t * per < a.K;
                    const char *g = static_cast<const char *>(a.gw);
                    sk_cp16(xs + C::XBYTES + t * 16, in ? g + (int64_t)k0 * a.g_es + t * 16 : g, in ? 16 : 0);
                }
            }
        }
    };

    /* TMA: stage s's mbarrier at bars + 8 s, in ssp's place (XH instances have no norm prologue); thread 0 arms a
     * stage for its whole bytes (w and x) before its first box, so the phase ends only when both have landed */
    [[maybe_unused]] const uint32_t bars = base + S * C::STAGE + C::XB;
    [[maybe_unused]] auto tma_w = [&](int kt, int s) {
        const uint32_t ws = base + s * C::STAGE + W_OFF, bar = bars + 8 * s;
        if (halves) { /* the BN/2 gate rows, then the matching up rows N further down */
            sk_tma(ws, &a.tmw, kt * SK_BK, n0, bar);
            sk_tma(ws + (BN / 2) * 128, &a.tmw, kt * SK_BK, a.N + n0, bar);
        } else {
            sk_tma(ws, &a.tmw, kt * SK_BK, n0, bar);
        }
    };
    [[maybe_unused]] auto tma_x = [&](int kt, int s) {
        sk_tma(base + s * C::STAGE + X_OFF, &a.tmx, kt * SK_BK, mz, bars + 8 * s);
    };

    if constexpr (XH)
        if (a.u_prefetch)
            sk_prefetch_u<BN, THREADS>(a, splits, rank, Mb, mz, n0);

    /* Prologue: stages 0..S-2, one commit group each; weights before the wait when they are a weights buffer
     * (uncommitted, they join group 0, which then completes no later than the others). */
    if constexpr (TMA) {
        if (t == 0) { /* the barriers, visible to the async proxy before the first copy (all issued by thread 0;
                       * the others first wait after the loop's first __syncthreads) */
#pragma unroll
            for (int s = 0; s < S; s++)
                sk_bar_init(bars + 8 * s);
            asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
            if (a.early)
                for (int s = 0; s < S - 1 && s < nt; s++) {
                    sk_bar_expect(bars + 8 * s, C::STAGE);
                    tma_w(kt0 + s, s);
                }
        }
        SK_STAMP(1);
        cu_pdl_wait();
        SK_STAMP(2);
        if (t == 0)
            for (int s = 0; s < S - 1 && s < nt; s++) {
                if (!a.early) {
                    sk_bar_expect(bars + 8 * s, C::STAGE);
                    tma_w(kt0 + s, s);
                }
                tma_x(kt0 + s, s);
            }
    } else {
        if (a.early)
            for (int s = 0; s < S - 1; s++)
                if (s < nt)
                    load_w(s);
        SK_STAMP(1);
        cu_pdl_wait();
        SK_STAMP(2);
        for (int s = 0; s < S - 1; s++) {
            if (s < nt) {
                if (!a.early)
                    load_w(s);
                load_x(kt0 + s, s);
            }
            sk_commit();
        }
    }
    SK_STAMP(3);

    const bool norm = !XH && a.norm_mode != BERTH_NORM_W_NONE; /* XH: the host never pairs it with a prologue */
    float acc[2][NT][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int q = 0; q < 4; q++)
                acc[mt][j][q] = 0.0f;
    float ss[C::XCH]; /* the prologue's sum of x^2 of this thread's conversion rows */
#pragma unroll
    for (int j = 0; j < C::XCH; j++)
        ss[j] = 0.0f;

    /* ldmatrix lane addresses. A (w, 16 x 16 per m16 tile): lanes 0-7 rows 0-7 / k 0-7, 8-15 rows 8-15 / k 0-7,
     * 16-23 rows 0-7 / k 8-15, 24-31 rows 8-15 / k 8-15 -> a0..a3. B (x, rows = sequences): lanes 0-7 rows 0-7 /
     * k 0-7, 8-15 rows 0-7 / k 8-15, 16-23 rows 8-15 / k 0-7, 24-31 rows 8-15 / k 8-15 -> b0, b1 of n8 tile j and
     * b0, b1 of tile j + 1. Row & 7 == lane & 7 in both, the swizzle key. */
    const int rg = C::KP == 1 ? warp : warp % C::RG, kp = C::KP == 1 ? 0 : warp / C::RG;
    const int a_row = rg * 32 + (lane & 7) + ((lane >> 3) & 1) * 8, a_hi = lane >> 4;
    const int b_row = (lane & 7) + ((lane >> 4) << 3), b_hi = (lane >> 3) & 1;

    [[maybe_unused]] float wacc[16];
    [[maybe_unused]] const uint32_t wg_lo0 = sk_wg_desc_lo(base);
    if constexpr (WGX) {
#pragma unroll
        for (int q = 0; q < 16; q++)
            wacc[q] = 0.0f;
    }
#pragma unroll 1
    for (int i = 0; i < nt; i++) {
        if constexpr (WGX) /* tile i-1's wgmmas are done reading its stage, which this iteration refills */
            asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
        if constexpr (!TMA) {
            sk_wait_group<S - 2>(); /* this thread's part of tile i has landed */
            if constexpr (WGX)      /* the copies, written through the generic proxy, visible to wgmma's async proxy */
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        }
        __syncthreads(); /* everyone's; and every warp is done with tile i-1 (its stage and xb are free) */
        if (i == 0)
            SK_STAMP(4);
        {
            const int j = i + S - 1;
            if constexpr (TMA) {
                if (t == 0 && j < nt) {
                    sk_bar_expect(bars + 8 * (j % S), C::STAGE);
                    tma_w(kt0 + j, j % S);
                    tma_x(kt0 + j, j % S);
                }
            } else {
                if (j < nt) {
                    load_w(j % S);
                    load_x(kt0 + j, j % S);
                }
                sk_commit();
            }
        }
        const int s = i % S;
        if constexpr (TMA) /* tile i's boxes have landed (its stage's (i / S)-th phase) */
            sk_bar_wait(bars + 8 * s, (uint32_t)(i / S) & 1u);
        if constexpr (!XH) {
            /* x tile -> xb in the weight dtype: thread t converts float4 chunk c4 of rows (t >> 4) + j *
             * THREADS/16, applying the prologue's weight and summing squares. */
            const float *xs = reinterpret_cast<const float *>(sk_smem + s * C::STAGE + C::WBYTES);
            const int c4 = t & 15;
            float f[4] = {1.0f, 1.0f, 1.0f, 1.0f};
            if (a.gw) {
                const void *gs = sk_smem + s * C::STAGE + C::WBYTES + C::XBYTES;
#pragma unroll
                for (int e = 0; e < 4; e++)
                    f[e] = sk_norm_factor(a.norm_mode, cu_ld(gs, a.g_dt, c4 * 4 + e));
            }
#pragma unroll
            for (int j = 0; j < C::XCH; j++) {
                const int m = j * (THREADS / 16) + (t >> 4);
                float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (m < Mb)
                    v = reinterpret_cast<const float4 *>(xs + m * SK_BK)[c4];
                if (norm) {
                    ss[j] = fmaf(v.x, v.x, fmaf(v.y, v.y, fmaf(v.z, v.z, fmaf(v.w, v.w, ss[j]))));
                    v.x *= f[0];
                    v.y *= f[1];
                    v.z *= f[2];
                    v.w *= f[3];
                }
                uint2 pk;
                pk.x = sk_pack2<WDT>(v.x, v.y);
                pk.y = sk_pack2<WDT>(v.z, v.w);
                *reinterpret_cast<uint2 *>(sk_smem + S * C::STAGE + sk_swz(m, c4 >> 1) + (c4 & 1) * 8) = pk;
            }
        }
        if constexpr (!XH)
            __syncthreads(); /* xb complete */

        if constexpr (WGX) {
            /* the stage's descriptors: only the low word's start field moves (by the stage and 32 bytes per k16) */
            const uint32_t dlo = wg_lo0 + (uint32_t)s * (C::STAGE >> 4);
            constexpr uint32_t B_OFF = (XFIRST ? W_OFF : X_OFF) >> 4;
#pragma unroll
            for (int q = 0; q < 16; q++) /* the accumulators stay in their registers around the async MMAs */
                asm volatile("" : "+f"(wacc[q])::"memory");
            asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
            for (int kk = 0; kk < SK_BK / 16; kk++)
                /* XFIRST: D = x w^T (rows 0..31 real), else D = w x^T */
                sk_wgmma_64x32<WDT>(wacc, sk_wg_desc_of(dlo + kk * 2), sk_wg_desc_of(dlo + B_OFF + kk * 2));
            asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#pragma unroll
            for (int q = 0; q < 16; q++)
                asm volatile("" : "+f"(wacc[q])::"memory");
            continue;
        }
        const uint32_t ws = base + s * C::STAGE;
        const uint32_t xt = XH ? ws + C::WBYTES : xb; /* the bf16 / f16 x tile the B fragments come from */
#pragma unroll
        for (int kq = 0; kq < SK_BK / 16 / C::KP; kq++) {
            const int kk = kq * C::KP + kp; /* this warp's k16 steps of the tile */
            uint32_t af[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
                sk_ldsm4(ws + sk_swz(a_row + mt * 16, 2 * kk + a_hi), af[mt][0], af[mt][1], af[mt][2], af[mt][3]);
            uint32_t bf[NT][2];
            if constexpr (NT == 1) {
                sk_ldsm2(xt + sk_swz(lane & 7, 2 * kk + b_hi), bf[0][0], bf[0][1]);
            } else {
#pragma unroll
                for (int jp = 0; jp < NT / 2; jp++)
                    sk_ldsm4(xt + sk_swz(jp * 16 + b_row, 2 * kk + b_hi), bf[2 * jp][0], bf[2 * jp][1],
                             bf[2 * jp + 1][0], bf[2 * jp + 1][1]);
            }
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int j = 0; j < NT; j++)
                    sk_mma<WDT>(acc[mt][j], af[mt], bf[j][0], bf[j][1]);
        }
    }
    if constexpr (WGX) {
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
        for (int q = 0; q < 16; q++) /* the accumulators are final from here on */
            asm volatile("" : "+f"(wacc[q])::"memory");
    }
    sk_wait_group<0>(); /* only empty groups can be left; none may be in flight when the ring is reused */
    __syncthreads();    /* every warp is done reading the ring */
    SK_STAMP(5);

    /* The block's partial tile part[kp][m][r] (r: the block's w row) over the ring; acc[mt][j][q] is w row
     * rg*32 + mt*16 + lane/4 + (q/2)*8, x row j*8 + 2*(lane%4) + q%2. PITCH = BN + 4 spreads the lanes over all
     * 32 banks. */
    float *const part = reinterpret_cast<float *>(sk_smem);
    if constexpr (WGX) { /* wacc[4c + q]: D row 16 warp + lane/4 + (q/2) 8, column 8c + 2 (lane%4) + q%2 — BN 32:
                         * row = x row m (warps 2 and 3 hold the garbage rows 32..63), column = w row r; BN 64:
                         * row = w row r, column = x row m */
#pragma unroll
        for (int c = 0; c < 4; c++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int dr = warp * 16 + (lane >> 2) + (q >> 1) * 8, dc = c * 8 + 2 * (lane & 3) + (q & 1);
                if constexpr (XFIRST) {
                    if (warp < 2)
                        part[dr * C::PITCH + dc] = wacc[4 * c + q];
                } else {
                    part[dc * C::PITCH + dr] = wacc[4 * c + q];
                }
            }
    } else
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int r = rg * 32 + mt * 16 + (lane >> 2) + (q >> 1) * 8;
                const int m = j * 8 + 2 * (lane & 3) + (q & 1);
                part[(kp * MP + m) * C::PITCH + r] = acc[mt][j][q];
            }
    if (norm)
#pragma unroll
        for (int j = 0; j < C::XCH; j++) { /* the 16 lanes converting one row hold its partial sums */
            float v = ss[j];
            v += __shfl_xor_sync(0xffffffffu, v, 8);
            v += __shfl_xor_sync(0xffffffffu, v, 4);
            v += __shfl_xor_sync(0xffffffffu, v, 2);
            v += __shfl_xor_sync(0xffffffffu, v, 1);
            if ((t & 15) == 0)
                ssp[j * (THREADS / 16) + (t >> 4)] = v;
        }
    if constexpr (PUSH) {
        __syncthreads(); /* the block's partial tile is complete */
        cu_cluster_wait(); /* every block's mbarrier is initialised and armed (the entry arrive) */
    } else {
        if (splits > 1)
            cg::this_cluster().sync();
        else
            __syncthreads();
    }
    SK_STAMP(6);

    if constexpr (PUSH) {
        /* push: every output of the cluster's Mb * BN (those past N too, so the owners' byte counts are exact),
         * this block's k phases summed as the pull path sums them, to its owner o = e / share at recv slot
         * (rank, e - o * share) */
        constexpr int lno = BN == 32 ? 5 : BN == 64 ? 6 : BN == 128 ? 7 : 8;
        const uint32_t pbar = base + (uint32_t)C::SMEM, precv = pbar + 16;
        const int ptotal = Mb * BN; /* NO = BN (no HALVES) */
        const int pshare = (ptotal + splits - 1) / splits;
        const int pi0 = rank * pshare, pi1 = pi0 + pshare < ptotal ? pi0 + pshare : ptotal;
        for (int e = t; e < ptotal; e += THREADS) {
            const int o = e / pshare, j = e - o * pshare;
            const int off = (e >> lno) * C::PITCH + (e & (BN - 1));
            float sv = 0.0f;
#pragma unroll
            for (int p = 0; p < KPE; p++)
                sv += part[p * MP * C::PITCH + off];
            sk_st_async(sk_mapa(precv + (uint32_t)(rank * pshare + j) * 4u, (uint32_t)o), sv,
                        sk_mapa(pbar, (uint32_t)o));
        }
        /* own: every block's sums have landed (phase 0 completes when all splits * cnt * 4 bytes have) */
        sk_bar_wait_cluster(pbar, 0);
        const float *const recv = reinterpret_cast<const float *>(sk_smem + C::SMEM + 16);
        for (int idx = pi0 + t; idx < pi1; idx += THREADS) {
            const int m = idx >> lno, r = idx & (BN - 1), n = n0 + r;
            if (n >= a.N)
                continue;
            const int j = idx - pi0;
            float z = 0.0f;
#pragma unroll
            for (int q = 0; q < SK_MAX_CLUSTER; q++) /* the loads may all be in flight; added in rank order */
                if (q < splits)
                    z += recv[q * pshare + j];
            sk_store_output<true>(a, Y, U, mz, m, n, z, 0.0f, false);
        }
    } else if constexpr (XH) {
        sk_outputs_xh<BN, KPE, MP, C::PITCH, THREADS>(a, part, splits, rank, Mb, mz, n0);
    } else {
        /* Outputs (m, n0 + r), this block's slice of the M * NO of the cluster: the partials of every block of the
         * cluster and every k phase, summed in that order, then 1/rms, bias, the gated epilogue, accumulate. */
        const int total = Mb * NO;
        const int share = (total + splits - 1) / splits;
        const int i0 = rank * share, i1 = i0 + share < total ? i0 + share : total;
        for (int idx = i0 + t; idx < i1; idx += THREADS) {
            const int m = idx / NO, r = idx - m * NO, n = n0 + r;
            if (n >= a.N)
                continue;
            const int off = m * C::PITCH + r;
            float z = 0.0f, zu = 0.0f, sq = 0.0f;
            if (splits > 1) {
                /* A rolled loop (the same sums in the same order): unrolled over SK_MAX_CLUSTER ranks, with every
                 * rank's loads in flight at once, it was most of the kernel's code (27 KB -> 21 KB at the XH instance)
                 * and the decode step at 32 sequences 1.6% slower (bench/RESULTS.md session 17) */
                cg::cluster_group cl = cg::this_cluster();
#pragma unroll 1
                for (int q = 0; q < splits; q++) {
                    const float *pq = cl.map_shared_rank(part, (unsigned)q);
                    float pz = 0.0f, pu = 0.0f;
#pragma unroll
                    for (int p = 0; p < C::KP; p++) {
                        pz += pq[p * MP * C::PITCH + off];
                        if (halves)
                            pu += pq[p * MP * C::PITCH + off + BN / 2];
                    }
                    z += pz;
                    zu += pu;
                    if (norm)
                        sq += cl.map_shared_rank(ssp, (unsigned)q)[m];
                }
            } else {
#pragma unroll
                for (int p = 0; p < C::KP; p++) {
                    z += part[p * MP * C::PITCH + off];
                    if (halves)
                        zu += part[p * MP * C::PITCH + off + BN / 2];
                }
                if (norm)
                    sq = ssp[m];
            }
            if (norm) {
                const float rstd = 1.0f / sqrtf(sq / (float)a.K + a.eps); /* rms_norm's rstd, as the CPU backend's */
                z *= rstd;
                zu *= rstd;
            }
            sk_store_output(a, Y, U, mz, m, n, z, zu, halves);
        }
    }
    SK_STAMP(7);
    if constexpr (PUSH) {
        /* PUSH 2 only (a.push_end): every block stays until all have passed their wait, i.e. until every push of
         * the cluster has landed — for the case that a block's exit with its st.async still in flight were not
         * allowed (no PTX rule found that says so; PUSH 1 goes without). Converged for .aligned. */
        if (a.push_end) {
            __syncwarp();
            cu_cluster_arrive_relaxed();
            cu_cluster_wait();
        }
    }
    if (!PUSH && splits > 1) { /* no block may leave while another still reads its shared memory */
        if (a.end_relaxed) {
            /* Relaxed: every remote load of this thread fed a store issued before this point, so it has returned;
             * the stores need no ordering here (the grid's end publishes them to the next kernel's PDL wait). A
             * release arrive would first wait for their acknowledgement from L2. Converged for .aligned. */
            __syncwarp();
            cu_cluster_arrive_relaxed();
            cu_cluster_wait();
        } else {
            cg::this_cluster().sync();
        }
    }
    SK_STAMP(8);
}

// ---------------------------------------------------------------------------------------------------------------
// Host side: instances, plan, launch.

/* The TMA instances' tensor maps (sk_args.tmw over wrows rows of w, boxes of box_w rows; tmx over the M rows of
 * xh, boxes of 32): false where the driver has no encoder or declines the shape (the cp.async twin runs). */
static bool sk_tmaps(const berth_backend *be, sk_args *a, int wdt, int64_t wrows, int box_w)
{
    if (!be->tmap_encode)
        return false;
    const PFN_cuTensorMapEncodeTiled_v12000 enc = (PFN_cuTensorMapEncodeTiled_v12000)be->tmap_encode;
    const CUtensorMapDataType dt =
        wdt == BERTH_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    const cuuint32_t es[2] = {1, 1};
    const cuuint64_t wd[2] = {(cuuint64_t)a->K, (cuuint64_t)wrows}, wst[1] = {(cuuint64_t)a->ldw};
    const cuuint32_t wb[2] = {SK_BK, (cuuint32_t)box_w};
    const cuuint64_t xd[2] = {(cuuint64_t)a->K, (cuuint64_t)a->M}, xst[1] = {(cuuint64_t)a->ldxh * 2};
    const cuuint32_t xb[2] = {SK_BK, 32};
    return enc(&a->tmw, dt, 2, (void *)a->w, wd, wst, wb, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS &&
           enc(&a->tmx, dt, 2, (void *)a->xh, xd, xst, xb, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* The wgmma twin of the 32- or 64-row-tile XH instance at 32 x rows: WG 1 (ring by cp.async) or 2 (by TMA). */
template <int WDT>
static void (*sk_wg_kernel(int bn, bool tma))(sk_args)
{
    if (bn == 32)
        return tma ? sk_kernel<WDT, 4, 32, true, 2> : sk_kernel<WDT, 4, 32, true, 1>;
    return tma ? sk_kernel<WDT, 4, 64, true, 2> : sk_kernel<WDT, 4, 64, true, 1>;
}

/* The push-reduction twin (BERTH_CUDA_SKINNY_PUSH) of the 64-row-tile XH instance at 32 x rows, bf16 weights:
 * WG 1 (wgmma, ring by cp.async) or 0 (mma.sync); its dynamic shared memory: the instance's, an mbarrier (16
 * bytes reserved) and the receive area of a cluster of `splits` blocks over mg rows of x. */
static void (*sk_push_kernel(bool wgmma))(sk_args)
{
    return wgmma ? sk_kernel<BERTH_DTYPE_BF16, 4, 64, true, 1, true>
                 : sk_kernel<BERTH_DTYPE_BF16, 4, 64, true, 0, true>;
}

static size_t sk_push_smem(int splits, int mg)
{
    const int total = mg * 64, share = (total + splits - 1) / splits;
    return sk_shape<64, 4, true>::SMEM + 16 + (size_t)splits * share * 4;
}

/* One instance as the planner sees it. */
struct sk_kinfo {
    void (*fn)(sk_args);
    size_t smem;
    int threads, stages, per_sm;
    size_t stage, part; /* bytes of one ring stage, of the partial tile laid over the ring */
    bool xh;
};

template <int WDT, int NT, int BN, bool XH = false>
static sk_kinfo sk_info_of()
{
    using C = sk_shape<BN, NT, XH>;
    sk_kinfo k;
    k.fn = sk_kernel<WDT, NT, BN, XH>;
    k.smem = C::SMEM;
    k.threads = C::THREADS;
    k.stages = C::S;
    k.per_sm = BN == 256 ? 1 : 2;
    k.stage = C::STAGE;
    k.part = C::PART;
    k.xh = XH;
    return k;
}

/* Instances: bf16 / f16 weights x NT 1, 2, 4, 6, 8 x BN 64, 128, and 256 for NT >= 4 (where x's traffic from L2
 * and its shared-memory reads start to matter); the XH ones: NT 4, 8 x BN 32, 64, 128 (32: one warp along w rows,
 * four along k — for the unsplit products' finer grid). */
template <int WDT, int NT>
static bool sk_info_nt(int bn, bool xh, sk_kinfo *k)
{
    if (xh) { /* x already rounded (sk_args.xh): NT 4 and 8, BN 32, 64 and 128 */
        if constexpr (NT == 4 || NT == 8) {
            if (bn == 32)
                *k = sk_info_of<WDT, NT, 32, true>();
            else if (bn == 64)
                *k = sk_info_of<WDT, NT, 64, true>();
            else if (bn == 128)
                *k = sk_info_of<WDT, NT, 128, true>();
            else
                return false;
            return true;
        }
        return false;
    }
    if (bn == 64)
        *k = sk_info_of<WDT, NT, 64>();
    else if (bn == 128)
        *k = sk_info_of<WDT, NT, 128>();
    else if constexpr (NT >= 4) {
        if (bn != 256)
            return false;
        *k = sk_info_of<WDT, NT, 256>();
    } else {
        return false;
    }
    return true;
}

template <int WDT>
static bool sk_info_w(int nt, int bn, bool xh, sk_kinfo *k)
{
    switch (nt) {
    case 1: return sk_info_nt<WDT, 1>(bn, xh, k);
    case 2: return sk_info_nt<WDT, 2>(bn, xh, k);
    case 4: return sk_info_nt<WDT, 4>(bn, xh, k);
    case 6: return sk_info_nt<WDT, 6>(bn, xh, k);
    default: return sk_info_nt<WDT, 8>(bn, xh, k);
    }
}

static bool sk_info(int wdt, int nt, int bn, bool xh, sk_kinfo *k)
{
    return wdt == BERTH_DTYPE_BF16 ? sk_info_w<BERTH_DTYPE_BF16>(nt, bn, xh, k)
                                   : sk_info_w<BERTH_DTYPE_F16>(nt, bn, xh, k);
}

static int sk_nt(int64_t M)
{
    return M <= 8 ? 1 : M <= 16 ? 2 : M <= 32 ? 4 : M <= 48 ? 6 : 8;
}

/* A rough model of the H200, only to rank tilings (bytes per microsecond, microseconds): a plan streams its weights
 * after one loaded DRAM latency at the least of the DRAM bandwidth, its share of the L2 -> SM bandwidth (weights
 * and every block's x) and the load bandwidth of the SMs it occupies — unless its bytes in flight refill too
 * slowly (one latency per ring's worth: Little's law); plus a ramp per extra wave and the cluster reduction. */
#define SK_DRAM_BPUS 4.2e6
#define SK_L2_BPUS 9.0e6
#define SK_LAT_US 1.5
#define SK_SM_BPUS 6.0e4
#define SK_SPLIT_US 0.3
#define SK_PER_SPLIT_US 0.03

struct sk_plan {
    sk_kinfo k;
    int bn, splits, per;
    int64_t blocks, waves; /* waves: of the blocks the SMs hold at once (per_sm each) */
    double cost;
};

/* The plan of tile width bn: split K over a cluster as far as the blocks stay within one wave (at least
 * SK_MIN_KT_PER_SPLIT tiles each, at most max_cluster blocks), splits evened out so none is empty; its modelled
 * time. False when the instance does not exist or does not fit. */
static bool sk_plan_bn(const berth_backend *be, int wdt, int nt, int bn, int64_t M, int64_t Nout, int64_t K,
                       bool halves, int max_cluster, int groups, bool xh, sk_plan *pl)
{
    if (!sk_info(wdt, nt, bn, xh, &pl->k) || pl->k.smem > be->smem_optin)
        return false;
    const int64_t n_sms = be->n_sms > 0 ? be->n_sms : 132;
    const int64_t no = halves ? bn / 2 : bn;
    const int64_t cb = (Nout + no - 1) / no * groups; /* clusters: column blocks x row groups */
    const int64_t nkt = (K + SK_BK - 1) / SK_BK;
    const int64_t slots = n_sms * pl->k.per_sm;
    int64_t splits = slots / cb, cap = nkt / SK_MIN_KT_PER_SPLIT;
    cap = cap < 1 ? 1 : cap > max_cluster ? max_cluster : cap;
    splits = splits < 1 ? 1 : splits > cap ? cap : splits;
    /* a cluster runs inside one GPC (>= SK_GPC_SMS SMs): all cb clusters must fit at once, or a second wave of
     * them doubles the time */
    const int64_t n_gpc = n_sms / SK_GPC_SMS > 0 ? n_sms / SK_GPC_SMS : 1;
    while (splits > 1 && cb > n_gpc * (SK_GPC_SMS * pl->k.per_sm / splits))
        splits--;
    const int64_t per = (nkt + splits - 1) / splits;
    splits = (nkt + per - 1) / per;
    pl->bn = bn;
    pl->splits = (int)splits;
    pl->per = (int)per;
    pl->blocks = cb * splits;

    /* every row group streams the weights (all but the first mostly from L2; costed at the DRAM rate all the same) */
    const double wbytes = (double)(halves ? 2 * Nout : Nout) * (double)K * 2.0 * groups;
    const double xbytes = (double)cb * (double)M / groups * (double)K * (xh ? 2.0 : 4.0);
    const int64_t resident = pl->blocks < slots ? pl->blocks : slots;
    const int64_t tiles = per < pl->k.stages - 1 ? per : pl->k.stages - 1;
    const double inflight = (double)resident * (double)tiles * bn * SK_BK * 2.0;
    const double sms = (double)(resident < n_sms ? resident : n_sms);
    double rate = SK_DRAM_BPUS;
    const double l2 = SK_L2_BPUS * wbytes / (wbytes + xbytes), port = sms * SK_SM_BPUS;
    rate = rate < l2 ? rate : l2;
    rate = rate < port ? rate : port;
    double c = SK_LAT_US + wbytes / rate;
    const double refill = SK_LAT_US * wbytes / inflight;
    c = c > refill ? c : refill;
    const int64_t waves = (pl->blocks + slots - 1) / slots;
    pl->waves = waves;
    c += (double)(waves - 1) * SK_LAT_US / pl->k.per_sm; /* a new wave's ramp; half hidden by a second block */
    if (splits > 1)
        c += SK_SPLIT_US + SK_PER_SPLIT_US * (double)splits;
    pl->cost = c;
    return true;
}

/* The cheapest plan over the tile widths (a wider one wins unless a narrower one is 3% cheaper: less x traffic);
 * be->skinny_bn (BERTH_CUDA_SKINNY_BN) forces one where it exists (else 64 where that exists, else the model
 * chooses); a plan without a K split then takes be->skinny_bn_unsplit's width instead where that exists
 * (BERTH_CUDA_SKINNY_BN_UNSPLIT), whichever way it was chosen. */
static bool sk_choose(const berth_backend *be, int wdt, int nt, int64_t M, int64_t Nout, int64_t K, bool halves,
                      int max_cluster, int groups, bool xh, sk_plan *best)
{
    static const int widths[] = {256, 128, 64};
    bool have = be->skinny_bn &&
                (sk_plan_bn(be, wdt, nt, be->skinny_bn, M, Nout, K, halves, max_cluster, groups, xh, best) ||
                 sk_plan_bn(be, wdt, nt, 64, M, Nout, K, halves, max_cluster, groups, xh, best));
    if (!have) /* auto, or no forced tile for this shape: the model's choice */
        for (int i = 0; i < 3; i++) {
            sk_plan pl;
            if (!sk_plan_bn(be, wdt, nt, widths[i], M, Nout, K, halves, max_cluster, groups, xh, &pl))
                continue;
            if (!have || pl.cost < 0.97 * best->cost) {
                *best = pl;
                have = true;
            }
        }
    sk_plan un;
    /* be->skinny_unsplit_waves (BERTH_CUDA_SKINNY_UNSPLIT_WAVES): only where the chosen plan fills at most that many
     * waves — many waves have no tail worth a finer grid, and narrower blocks read x from L2 once more each */
    if (have && best->splits == 1 && (be->skinny_unsplit_waves <= 0 || best->waves <= be->skinny_unsplit_waves) &&
        be->skinny_bn_unsplit && be->skinny_bn_unsplit != best->bn &&
        sk_plan_bn(be, wdt, nt, be->skinny_bn_unsplit, M, Nout, K, halves, max_cluster, groups, xh, &un) &&
        un.splits == 1)
        *best = un;
    return have;
}

/* The dynamic shared memory a launch of the plan asks for. The instance's full ring by default; with
 * be->skinny_trim (BERTH_CUDA_SKINNY_TRIM) an XH instance whose splits take fewer k tiles than its ring has stages
 * asks only for what it touches: stages 0 .. per-1 (stage j % S holds tile j, j < per) and the partial tile over
 * them; the XH instances keep nothing past the ring (no converted x, no sums of squares). The freed memory lets the
 * next kernels' blocks become resident beside this one under PDL (E2B at 32 sequences: the decode attention's
 * 108 KiB blocks beside the q product's, bench/RESULTS.md session 21). */
static size_t sk_launch_smem(const berth_backend *be, const sk_plan &pl, bool tma)
{
    if (!be->skinny_trim || !pl.k.xh || pl.per >= pl.k.stages || tma)
        return pl.k.smem; /* a TMA twin (tma: this launch runs one) keeps its mbarriers past the ring */
    const size_t ring = (size_t)pl.per * pl.k.stage;
    return ring > pl.k.part ? ring : pl.k.part;
}

/* The attributes the plan's instance needs: its dynamic shared memory, all of the unified L1 as shared memory (so
 * two blocks of ~110 KiB fit an SM), non-portable cluster sizes above 8. */
static cudaError_t sk_prepare(const sk_plan &pl)
{
    cudaError_t e = cudaFuncSetAttribute(pl.k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)pl.k.smem);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(pl.k.fn, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 cudaSharedmemCarveoutMaxShared);
    if (e == cudaSuccess && pl.splits > SK_PORTABLE_CLUSTER)
        e = cudaFuncSetAttribute(pl.k.fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    return e;
}

/* Whether all of the plan's clusters (one per column block and row group) can be resident at once on this device,
 * as the occupancy calculator sees it (the planner's GPC rule is a guess). */
static bool sk_clusters_fit(const sk_plan &pl, int groups)
{
    if (sk_prepare(pl) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    cudaLaunchAttribute attr[1] = {};
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 1;
    attr[0].val.clusterDim.y = (unsigned)pl.splits;
    attr[0].val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)(pl.blocks / pl.splits / groups), (unsigned)pl.splits, (unsigned)groups);
    cfg.blockDim = dim3((unsigned)pl.k.threads);
    cfg.dynamicSmemBytes = pl.k.smem;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, pl.k.fn, &cfg) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return n > 0 && (int64_t)n >= pl.blocks / pl.splits;
}

/* A call in the kernel's range (rows, layout) that its plan declines: the caller's other paths take it, or with
 * BERTH_CUDA_SKINNY_STRICT=1 (tests) the call fails, so that a silent fallback cannot pass a kernel test. */
static berth_status sk_decline(berth_backend *be, int64_t M, int64_t N, int64_t K, const char *why)
{
    if (!be->skinny_strict)
        return BERTH_OK;
    return cu_fail(be->host, BERTH_E_INTERNAL,
                   "matmul: the skinny kernel declined M = %lld, N = %lld, K = %lld in its range (%s)", (long long)M,
                   (long long)N, (long long)K, why);
}

/* Runs the matmul (already checked by cu_check_matmul) with the skinny kernel when it applies: BF16 compute mode,
 * be->skinny_min_m <= M <= SK_MAX_M, bf16/f16 w under the layout rules of the top comment, and enough opt-in
 * shared memory. *ran says whether it did; when it did not, nothing was enqueued and the caller takes another
 * path. pre (p's x_pre, or NULL): the norm is launched just before the kernel. */
berth_status cu_matmul_skinny(berth_backend *be, berth_stream *s, const berth_matmul_params *p, int64_t M, int64_t N,
                              int64_t K, bool *ran, const berth_rms_norm_params *pre)
{
    *ran = false;
    const int wdt = p->w.dtype;
    /* small products (K or N at most CU_SKINNY_SMALL_KN: the PLE gate and projection) up to SK_MAX_M rows, in row
     * groups: there cuBLAS's fixed cost (a pack, the GEMM, a GLU kernel) outweighs the weights (be->skinny_small) */
    const bool small = be->skinny_small && M > be->skinny_max_m &&
                       (K <= CU_SKINNY_SMALL_KN || N <= CU_SKINNY_SMALL_KN) &&
                       K * N * 2 <= CU_SKINNY_SMALL_BYTES; /* bf16 / f16 weights (checked below) */
    /* a product with its norm (x_pre) above skinny_max_m rows, up to be->skinny_xpre (BERTH_CUDA_SKINNY_XPRE): the
     * norm writes x rounded to the weight dtype (cu_rms_norm_packed) and the XH instance streams it as is */
    const int64_t ldxh = (K + 7) / 8 * 8;
    /* be->skinny_small_xh (BERTH_CUDA_SKINNY_SMALL_XH): the small products take the XH instances too, in their row
     * groups, x rounded by the norm, a pack or the previous product's shadow */
    const bool small_f32 = small && !be->skinny_small_xh;
    const bool xpre = pre && !small_f32 && M > be->skinny_max_m && M <= be->skinny_xpre &&
                      opck_matmul_norm_mode(p) == BERTH_NORM_W_NONE && cu_rms_norm_packable(be, pre, ldxh, wdt);
    /* a plain product (no norm of any kind) above skinny_max_m rows, up to be->skinny_plain (BERTH_CUDA_SKINNY_PLAIN):
     * x rounded to the weight dtype by matmul.cu's pack (the cuBLAS path's own), then the XH instance */
    const bool plain = !pre && !small_f32 && !xpre && M > be->skinny_max_m && M <= be->skinny_plain &&
                       opck_matmul_norm_mode(p) == BERTH_NORM_W_NONE;
    const bool xh = xpre || plain;
    if (be->skinny_min_m <= 0 || be->compute != CU_COMPUTE_BF16 || M < be->skinny_min_m ||
        (M > be->skinny_max_m && !small && !xh) || M > SK_MAX_M || K <= 0 || K % 8 != 0 ||
        (wdt != BERTH_DTYPE_BF16 && wdt != BERTH_DTYPE_F16))
        return BERTH_OK;
    const int64_t ldw = N > 1 ? p->w.nb[1] : K * 2;
    const char *w = cu_ptr(&p->w);
    if ((uintptr_t)w % 16 != 0 || ldw % 16 != 0 || ldw < K * 2)
        return BERTH_OK;
    const int32_t norm = opck_matmul_norm_mode(p), glu = opck_matmul_glu(p);
    const void *gw = norm != BERTH_NORM_W_NONE && opck_norm_has_weight(norm) ? cu_ptr(&p->x_norm_w) : NULL;
    if (gw && (uintptr_t)gw % 16 != 0)
        return BERTH_OK;
    const bool halves = glu == BERTH_GLU_HALVES;
    const int64_t Nout = halves ? N / 2 : N;
    /* row groups (be->skinny_mg, BERTH_CUDA_SKINNY_MG): M > mg rows run as ceil(M / mg) groups of mg along
     * gridDim.z, each with the narrower x tile of mg rows */
    int mg = be->skinny_mg > 0 && M > be->skinny_mg ? be->skinny_mg : (int)M;
    if (small && be->skinny_mg == 0) /* op bench at M = 32 (bench/RESULTS.md session 8): 8 rows for short K, else 16 */
        mg = (int)(K <= CU_SKINNY_SMALL_KN ? (M > 8 ? 8 : M) : (M > 16 ? 16 : M));
    const int groups = (int)((M + mg - 1) / mg);
    const int nt = xh ? (mg <= 32 ? 4 : 8) : sk_nt(mg); /* the XH instances: NT 4 and 8 */

    sk_plan pl;
    const int max_cluster = small && be->skinny_small_splits < SK_MAX_CLUSTER ? be->skinny_small_splits : SK_MAX_CLUSTER;
    if (!sk_choose(be, wdt, nt, M, Nout, K, halves, max_cluster, groups, xh, &pl))
        return sk_decline(be, M, N, K, "no tiling fits the device");
    while (pl.splits > 1 && !sk_clusters_fit(pl, groups)) /* fewer, smaller clusters until all fit (1: none) */
        if (!sk_choose(be, wdt, nt, M, Nout, K, halves, pl.splits - 1, groups, xh, &pl))
            return sk_decline(be, M, N, K, "no cluster size fits the device");
    const int64_t cb = pl.blocks / pl.splits / groups; /* column blocks: gridDim.x (N < 2^31: cu_check_matmul) */
    /* be->skinny_wgmma (BERTH_CUDA_SKINNY_WGMMA): the XH instances of 32- and 64-row tiles at 32 x rows run as their
     * wgmma twins (selected below, once x is in place) */
    const bool wg = be->skinny_wgmma && xh && nt == 4 && (pl.bn == 32 || pl.bn == 64);
    /* tests (strict): a TMA run without the driver's encoder fails here, before anything is enqueued (a shape the
     * encoder declines is caught at the selection below, after x_pre / the pack) */
    if (wg && be->skinny_wgmma == 2 && !be->tmap_encode && be->skinny_strict)
        return sk_decline(be, M, N, K, "no TMA tensor-map encoder");

    sk_args a;
    memset(&a, 0, sizeof a);
    const cu_rows xr = cu_rows_of(&p->x), yr = cu_rows_of(&p->y);
    const cu_rows ur = glu == BERTH_GLU_MUL ? cu_rows_of(&p->y_glu_up) : yr;
    bool xvec = true;
    for (int64_t m = 0; m < M; m++) {
        a.x[m] = (const float *)cu_row(xr, m);
        a.y[m] = (float *)cu_row(yr, m);
        a.u[m] = (const float *)cu_row(ur, m);
        xvec = xvec && (uintptr_t)a.x[m] % 16 == 0;
    }
    a.w = w;
    a.ldw = ldw;
    a.bias = p->bias.buf ? cu_ptr(&p->bias) : NULL;
    a.bias_dt = p->bias.dtype;
    a.gw = gw;
    a.g_dt = gw ? p->x_norm_w.dtype : BERTH_DTYPE_F32;
    a.g_es = a.g_dt == BERTH_DTYPE_F32 ? 4 : 2;
    a.norm_mode = norm;
    a.eps = norm != BERTH_NORM_W_NONE ? p->x_norm_eps : 0.0f;
    a.glu = glu;
    a.act = glu != BERTH_GLU_NONE ? p->y_glu_act : BERTH_ACT_IDENTITY;
    a.accumulate = p->accumulate;
    a.early = p->w.buf->usage == BERTH_USAGE_WEIGHTS;
    a.u_prefetch = glu == BERTH_GLU_MUL && be->skinny_u_prefetch;
    a.end_relaxed = be->skinny_end_relaxed;
    a.push_end = be->skinny_push == 2;
    a.xvec = xvec;
    a.M = (int32_t)M;
    a.mg = mg;
    a.N = (int32_t)Nout;
    a.K = (int32_t)K;
    a.nkt = (int32_t)((K + SK_BK - 1) / SK_BK);
    a.kt_per_split = pl.per;

    if (xpre) { /* x_pre: the norm first, writing the rounded x the XH instance reads */
        void *ws = NULL;
        bool done = false;
        berth_status st = cu_stream_ws(be, s, (size_t)(M * ldxh) * 2, &ws);
        if (st == BERTH_OK)
            st = cu_rms_norm_packed(be, s, pre, ws, ldxh, wdt, &done);
        if (st == BERTH_OK && !done) /* cu_rms_norm_packable said yes */
            st = cu_fail(be->host, BERTH_E_INTERNAL, "matmul: the skinny kernel's packed norm declined");
        if (st != BERTH_OK)
            return st;
        a.xh = (const uint16_t *)ws;
        a.ldxh = ldxh;
    } else if (plain) { /* x rounded to the weight dtype: the previous product's shadow of it, or packed here as
                         * the cuBLAS path packs it */
        int64_t ld = 0;
        const uint16_t *sh = cu_xshadow_match(s, p, M, K, wdt, &ld); /* NULL with the shadow off: no buffer */
        if (sh) {
            a.xh = sh;
            a.ldxh = ld;
        } else {
            void *ws = NULL;
            berth_status st = cu_stream_ws(be, s, (size_t)(M * ldxh) * 2, &ws);
            if (st == BERTH_OK)
                st = cu_matmul_pack_x(be, s, p, M, K, ws, ldxh, wdt);
            if (st != BERTH_OK)
                return st;
            a.xh = (const uint16_t *)ws;
            a.ldxh = ldxh;
        }
    } else if (pre) { /* x_pre: the norm first (the kernel reads its output as x) */
        const berth_status st = cu_op_rms_norm(be, s, pre);
        if (st != BERTH_OK)
            return st;
    }
    /* the wgmma twins (same ring, same grid; the partial tile has one k phase); at 2 with the ring filled by TMA
     * where the driver encodes the tensor maps (else the cp.async twin) */
    bool tma = false;
    if (wg) {
        tma = be->skinny_wgmma == 2 && sk_tmaps(be, &a, wdt, halves ? 2 * Nout : Nout, halves ? pl.bn / 2 : pl.bn);
        if (be->skinny_wgmma == 2 && !tma && be->skinny_strict) /* tests: the TMA path must be the one tested */
            return cu_fail(be->host, BERTH_E_INTERNAL, "matmul: no TMA tensor maps for M = %lld, N = %lld, K = %lld",
                           (long long)M, (long long)N, (long long)K);
        pl.k.fn = wdt == BERTH_DTYPE_BF16 ? sk_wg_kernel<BERTH_DTYPE_BF16>(pl.bn, tma)
                                          : sk_wg_kernel<BERTH_DTYPE_F16>(pl.bn, tma);
    }
    /* be->skinny_push (BERTH_CUDA_SKINNY_PUSH): the split 64-row-tile XH products at 32 x rows (bf16 weights, no
     * HALVES epilogue, no accumulate) reduce through the push twin (the cp.async wgmma one or the mma.sync one);
     * its launch asks for its receive area on top of the instance's whole ring (no trim) */
    bool push = be->skinny_push && xh && nt == 4 && pl.bn == 64 && pl.splits > 1 && !tma &&
                wdt == BERTH_DTYPE_BF16 && !halves && !p->accumulate;
    if (push) { /* (its few KiB more still leave two blocks per SM: checked, else the usual instance runs) */
        const sk_kinfo usual = pl.k;
        pl.k.fn = sk_push_kernel(wg);
        pl.k.smem = sk_push_smem(pl.splits, mg);
        if (!sk_clusters_fit(pl, groups)) {
            if (be->skinny_strict) /* tests: the push twin must be the one tested */
                return cu_fail(be->host, BERTH_E_INTERNAL,
                               "matmul: the push twin's clusters do not fit for M = %lld, N = %lld, K = %lld",
                               (long long)M, (long long)N, (long long)K);
            pl.k = usual;
            push = false;
        }
    }
    /* a gated product's output is the input of the product next (the MLP's down projection; the PLE projection
     * after the PLE gate): round it once here, where that product takes the XH instances (the plain path; the
     * claim checks its row range). A small gated product's successor is small too, and reads f32 unless
     * be->skinny_small_xh sends the small products to the XH instances. */
    if (glu != BERTH_GLU_NONE && (be->skinny_small_xh || (!small && Nout > CU_SKINNY_SMALL_KN)) &&
        a.xh != s->xsh_buf) { /* not while this kernel reads the buffer as its x */
        int64_t ld = 0;
        a.ysh = cu_xshadow_claim(be, s, &p->y, M, Nout, wdt, &ld);
        a.ldysh = ld;
        a.ysh_dt = wdt;
    }
#ifdef BERTH_SK_STAMPS
    char what[160];
    snprintf(what, sizeof what, "skinny M=%d N=%d K=%d grid=%lldx%dx%d bn=%d xh=%d glu=%d", (int)M, (int)Nout, (int)K,
             (long long)cb, pl.splits, groups, pl.bn, a.xh != NULL, glu);
    a.prof = cu_att_prof_for(be, s, pl.blocks, SK_STAMPS, what);
#endif
    cudaError_t e = sk_prepare(pl);
    if (e == cudaSuccess) /* one launch: a cluster (1, splits, 1) when K is split, with PDL when enabled */
        e = cu_launch_cluster(be, s->cs, dim3((unsigned)cb, (unsigned)pl.splits, (unsigned)groups),
                              dim3((unsigned)pl.k.threads),
                              push ? pl.k.smem : sk_launch_smem(be, pl, tma),
                              dim3(1, pl.splits > 1 ? (unsigned)pl.splits : 1u, 1), pl.k.fn,
                              a);
    berth_status st = cu_check(be, e, "matmul: skinny kernel");
    if (st == BERTH_OK)
        *ran = true;
    else if (a.ysh)
        s->xsh.seq = 0; /* claimed, never written */
#ifdef BERTH_SK_STAMPS
    if (st == BERTH_OK && a.prof && !be->capturing) /* after *ran: a failed report must not make the caller run the
                                                      * product again */
        st = cu_att_prof_report(be, s, a.prof, (int)pl.blocks, SK_STAMPS, what);
#endif
    return st;
}

/*
 * cuda_internal.h — what the CUDA backend's files share: the backend, buffer and stream objects, error helpers,
 * per-stream workspaces, tensor addressing, and every op's check and run entry points.
 *
 * Every op follows one shape (as in the CPU backend): cu_check_OP() runs the shared parameter checks
 * (plugins/common/op_check.h) plus this backend's own limits, and serves both supports() (exec = 0) and execution;
 * cu_op_OP() is the berth_ops member: it checks, then enqueues kernels on the stream and returns without waiting.
 * Launch errors are read back with cudaGetLastError (cu_check_launch) so a bad launch fails the op that made it.
 *
 * Compute modes ([backend.cuda] compute): BF16 keeps the model's weights as stored and runs large matmuls on the
 * tensor cores with bf16 operands and fp32 accumulation; FP32 computes every product in fp32 (bf16/f16 weights
 * widened exactly), the parity mode tests use. Everything else (norms, softmax, attention, sampling) is fp32 in
 * both modes.
 *
 * Graph capture: while be->capturing is set (a decode step is being recorded into a CUDA graph) an op must not
 * allocate, synchronise, or size a launch from per-step values (max_kv_len, max_q_len): only from shapes and from
 * fixed bounds (block-table width), so that the recorded launch stays valid when replayed with new metadata.
 */
#ifndef BERTH_CUDA_INTERNAL_H
#define BERTH_CUDA_INTERNAL_H

#include <berth/backend.h>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdint.h>

#include "../common/op_check.h"

#define CU_COMPUTE_BF16 0
#define CU_COMPUTE_FP32 1

/* Dtype sets (BERTH_DTYPE_BIT). Activations are f32 in this release (the model plugins keep f32 residuals). */
#define CU_WEIGHT_DTYPES (BERTH_DTYPE_BIT(BERTH_DTYPE_F32) | BERTH_DTYPE_BIT(BERTH_DTYPE_BF16) | \
                          BERTH_DTYPE_BIT(BERTH_DTYPE_F16))
#define CU_ACT_DTYPES BERTH_DTYPE_BIT(BERTH_DTYPE_F32)
#define CU_KV_DTYPES CU_WEIGHT_DTYPES
#define CU_F32 BERTH_DTYPE_BIT(BERTH_DTYPE_F32)
#define CU_I32 BERTH_DTYPE_BIT(BERTH_DTYPE_I32)
#define CU_MAX_HEAD_DIM 512 /* attention / kv_append kernels keep a head vector per block */
#define CU_MAX_REP 16       /* query heads per KV head in one attention block */

struct berth_buffer {
    struct berth_buffer *prev, *next;
    void *ptr;     /* device pointer, or pinned host pointer when pinned; NULL for a 0-byte buffer */
    uint64_t size;
    int32_t usage; /* BERTH_USAGE_* */
    int pinned;    /* allocated with cudaMallocHost (BERTH_USAGE_STAGING) */
};

/* Scratch memory owned by a stream: ops on one stream run in order, so each op may use the whole workspace for
 * its own duration. Grown on demand (outside graph capture), after the stream drained. A recorded graph keeps the
 * address it was recorded with, so an outgrown device workspace is retired, not freed, until the stream goes. */
struct cu_workspace {
    void *ptr;
    size_t size;
};

struct cu_retired {
    void *ptr;
    struct cu_retired *next;
};

/* The rounded copy of a product's output that its kernel wrote beside y (matmul_skinny.cu, gated products), so that
 * the next op, when it is a product over exactly those rows, skips its pack of x: the pack costs a launch and ~4 us
 * before the down projection at 32 sequences (bench/RESULTS.md session 11). Valid only for the op right after the
 * one that wrote it (seq == that op's berth_stream.op_seq): any op in between may have rewritten y; uploads,
 * copies, fills and graph begin / end / launch on the stream clear it, as does a failed launch of its writer. A
 * write to y from ANOTHER stream between the two ops is not seen: the ABI orders streams only through events,
 * and a host that writes an op's output from elsewhere before the next op reads it breaks stream order anyway. */
struct cu_xshadow {
    uint64_t seq;          /* op_seq of the op that wrote it; 0: none */
    const char *row0;      /* y's row 0 (fp32, K contiguous floats), rows row_nb bytes apart */
    int64_t row_nb, M, K;
    int64_t ld;            /* elements between rows of berth_stream.xsh_buf */
    int dt;                /* BERTH_DTYPE_BF16 / F16: what it was rounded to (nearest even, as the pack rounds) */
};
#define CU_XSH_BYTES ((size_t)4 << 20) /* per stream: 64 rows of K <= 32768 */

struct berth_stream {
    struct berth_stream *prev, *next;
    cudaStream_t cs;
    struct cu_workspace dev;    /* device scratch */
    struct cu_retired *retired; /* outgrown device scratch that recorded graphs may still use */
    struct cu_workspace host;   /* pinned host scratch for per-call host arrays (sampling parameters) */
    cudaEvent_t host_free;      /* recorded after the last copy out of `host`: wait before rewriting it */
    int host_pending;           /* host_free was recorded and not yet waited for */
    unsigned int *ynorm_count;  /* device: the GEMV's arrival counter for a trailing norm it finishes itself
                                 * (gemv_norm.cuh); 0 between kernels; made and zeroed with the stream */
    unsigned int *att_count;    /* device: CU_ATT_COUNTERS arrival counters of the tensor-core decode attention's
                                 * split merge (attention_decode_mma.cu), one per (sequence, KV head); 0 between
                                 * kernels; made and zeroed with the stream */
    unsigned long long *att_prof; /* device: BERTH_CUDA_ATT_PROF's stamps (both decode attention kernels),
                                   * att_prof_cap of them, zero before each profiled call; NULL until the switch needs
                                   * it */
    int64_t att_prof_cap;
    unsigned long long *gprof;  /* device: BERTH_CUDA_ATT_PROF=graph's arena, CU_GPROF_STAMPS zeroed stamps made with the
                                 * stream; regions of it go to stamped launches while a graph is captured */
    int64_t gprof_used;
    struct cu_gprof_region *gprof_reg; /* host: the regions handed out, in capture order */
    int gprof_n, gprof_cap;
    int gprof_graph;            /* captures begun on this stream: the regions' graph number */
    uint64_t op_seq;            /* ops called on this stream (cuda_backend.cu's op table counts them) */
    uint16_t *xsh_buf;          /* device: CU_XSH_BYTES for xsh (BF16 compute mode; else NULL) */
    int32_t *kvlocal_bt;        /* device: BERTH_CUDA_SKIP=kvlocal's stand-in block table (entry i: i mod
                                 * CU_KVLOCAL_BLOCKS), CU_KVLOCAL_ENTRIES of them; NULL without the switch */
    struct cu_xshadow xsh;
    int pdl_barrier;            /* the next cu_launch on this stream goes without PDL: a full dependency after a copy
                                 * kernel (copy.cu) or a capture's end (cu_pdl_barrier_set / _take) */
};

#define CU_ATT_COUNTERS 4096
#define CU_ATT_PROF_OFF 0
#define CU_ATT_PROF_EAGER 1
#define CU_ATT_PROF_GRAPH 2
#define CU_GPROF_STAMPS (1 << 22) /* =graph: stamps of all captured calls of a stream (32 MiB) */

/* BERTH_CUDA_ATT_PROF=graph: one stamped launch recorded into a graph — its stamps at off in the stream's arena,
 * written again at every replay (the last replay's are logged). */
struct cu_gprof_region {
    int64_t off;
    int32_t blocks, stamps, graph;
    char what[120];
};

struct berth_backend {
    const berth_host *host;
    int device;
    cublasHandle_t cublas;      /* one per device context; ops set its stream per call */
    cublasLtHandle_t lt;
    void *cublas_ws;            /* cuBLAS workspace (fixed, so graph capture never makes cuBLAS allocate) */
    size_t cublas_ws_size;
    int lost;                   /* a sticky error happened; lost_reason says which */
    char lost_reason[256];
    struct berth_buffer *buffers;
    struct berth_stream *streams;
    int compute;                /* CU_COMPUTE_* from [backend.cuda] compute */
    int n_sms;
    size_t smem_optin;          /* most dynamic shared memory a block may opt in to */
    int capturing;              /* a graph capture is in progress on some stream (see the top comment) */
    struct opck_backend ck;     /* what the shared checks need to know about this backend */
    int pdl;                    /* programmatic dependent launch for cu_launch (cuda_launch.cuh): CU_PDL_ON or
                                 * CU_PDL_OFF (env BERTH_CUDA_PDL=1|0, read at init; a refused PDL launch turns it
                                 * off) */
    int att_split_keys;         /* decode attention: fewest keys per split (env BERTH_CUDA_ATT_SPLIT_KEYS, read at
                                 * init; default 16) */
    int att_decode;             /* decode attention path: CU_ATT_DECODE_* (env BERTH_CUDA_ATT_DECODE, read at init) */
    int att_mma_bps;            /* tensor-core decode attention: blocks per SM its split count fills (0: as many as
                                 * fit; env BERTH_CUDA_ATT_MMA_BPS=0..8, read at init; tuning runs) */
    int att_trigger;            /* where the decode attention kernels let the next kernel launch: CU_ATT_TRIGGER_*
                                 * (env BERTH_CUDA_ATT_TRIGGER=late|early|auto, read at init; default auto) */
    int att_ring2;              /* tensor-core decode attention: calls whose splits take at most two key tiles on the
                                 * instances with a two-stage ring (less shared memory; env BERTH_CUDA_ATT_RING2=0|1,
                                 * read at init; default 0 until measured) */
    int att_onepass;            /* tensor-core decode attention: head-dim-256 calls whose splits take two key tiles on
                                 * the one-pass instance (a split's keys as one tile, one softmax; env
                                 * BERTH_CUDA_ATT_ONEPASS=0|1, read at init; default 1: +1.1% at 32 sequences) */
    int att_d512_warps;         /* tensor-core decode attention: warps per block of the head-dim-512 instances (8: each
                                 * warp half the per-tile MMA chain; env BERTH_CUDA_ATT_D512_WARPS=4|8, read at init;
                                 * default 8: -5% a call at 32 x 640 keys, -19% at 32 x 4096) */
    int att_merge_kernel;       /* tensor-core decode attention: split partials merged by a kernel of their own (1) or by
                                 * the last block of each pair (0) (env BERTH_CUDA_ATT_MERGE=kernel|last; default
                                 * kernel) */
    int gemv_gelu;              /* the batch-1 GEMV's gated epilogue with GELU-tanh (bf16 weights) on instances with that
                                 * activation fixed (env BERTH_CUDA_GEMV_GELU=0|1, default 1) */
    int kv_lean;                /* kv_append: Gemma's bf16 decode dtypes on an instance with them fixed (env
                                 * BERTH_CUDA_KV_LEAN=0|1, default 1) */
    int norm_lean;              /* rms_norm: Gemma's common case (bf16 weights, no or an ADD_AFTER residual, evenly
                                 * spaced rows longer than a warp's) on a kernel of its own with only that code (env
                                 * BERTH_CUDA_NORM_LEAN=0|1, default 1) */
    int norm_y2_onepass;        /* rms_norm, the lean kernel with a second output: the second norm's sum of squares
                                 * from the first reduction (sum r^2, sum r*wv, sum wv^2 beside sum v^2), so one block
                                 * reduction instead of two in series; the second output's rstd rounds differently
                                 * (env BERTH_CUDA_NORM_Y2_ONEPASS=1|0, read at init; default 1: +0.2%) */
    int att_prof;               /* CU_ATT_PROF_*: the decode attention kernels (and the skinny products in a build
                                 * with -Dskinny_stamps=true; the cluster kernel only with -Dattention_stamps=true)
                                 * log their blocks' phase times per eager call (env BERTH_CUDA_ATT_PROF=1) or, with
                                 * =graph, record them in captured graphs, logged when the stream goes (a measurement
                                 * switch) */
    int att_strict;             /* test switch: the cluster decode kernel fails a call in its range that it cannot serve
                                 * instead of leaving it to the split kernel (env BERTH_CUDA_ATT_STRICT=1, read at
                                 * init; default 0) */
    int att_prewait;            /* the decode attention kernels read metadata and older keys' K/V before their PDL wait,
                                 * kv_append its slots and positions, the rms+RoPE kernel its first row's position
                                 * (env BERTH_CUDA_ATT_PREWAIT=1|0, read at init; default 1) */
    int gemv_mode;              /* M = 1 products: CU_GEMV_* (env BERTH_CUDA_GEMV=new|async|old, read at init;
                                 * default new; for A/B runs) */
    int gemv_early_mib;         /* GEMV products (gemv.cu's and matmul.cu's kernels, M <= 8): weights of at most this
                                 * many MiB are loaded before the PDL wait (env BERTH_CUDA_GEMV_EARLY_MIB, read at init; default CU_GEMV_EARLY_ALL: all;
                                 * a measurement switch: do a big product's early loads delay the kernel before it?) */
    int gemv_bps;               /* M = 1 products (gemv.cu, not the async kernel): blocks of 256 threads per SM that the
                                 * team rule fills, 1..4 (env BERTH_CUDA_GEMV_BPS, read at init; default 4; fewer
                                 * leave room beside a product for the next kernels' blocks; a tuning switch) */
    int skinny_min_m;           /* bf16 mode: products of this many rows up to 64 go to matmul_skinny.cu; 0 = never
                                 * (env BERTH_CUDA_SKINNY: 0 off, 2..64 the bound, read at init; default below) */
    int skinny_max_m;           /* ... and at most this many (env BERTH_CUDA_SKINNY_MAX, 2..64, read at init) */
    int skinny_plain;           /* plain products (no norm) above skinny_max_m and up to this many rows: x packed
                                 * rounded, then the skinny kernel's XH instance (env BERTH_CUDA_SKINNY_PLAIN, 0
                                 * off; default CU_SKINNY_PLAIN_M) */
    int xshadow;                /* gated products on matmul_skinny.cu write the stream's x shadow for the next product
                                 * (env BERTH_CUDA_XSHADOW=1|0, read at init; default 1) */
    int skinny_small;           /* small products (CU_SKINNY_SMALL_KN) above skinny_max_m rows on matmul_skinny.cu too
                                 * (env BERTH_CUDA_SKINNY_SMALL=1|0, read at init; default 1) */
    int skinny_xpre;            /* products with an x_pre above skinny_max_m rows and up to this many on
                                 * matmul_skinny.cu, x rounded by the norm; 0 = never (env BERTH_CUDA_SKINNY_XPRE: 0
                                 * off, 1 up to 64, 2..64 the bound, read at init; default CU_SKINNY_XPRE_M) */
    int skinny_strict;          /* a plan that declines a call in matmul_skinny.cu's range fails it (env
                                 * BERTH_CUDA_SKINNY_STRICT=1, read at init; tests) */
    int skinny_mg;              /* matmul_skinny.cu: products of more rows run as row groups of this many (8 / 16 /
                                 * 32) along gridDim.z; 0: one group (env BERTH_CUDA_SKINNY_MG, read at init) */
    int skinny_small_splits;    /* matmul_skinny.cu: the small products' (PLE gate / projection) K split over a cluster
                                 * at most this many ways, 1..16 (env BERTH_CUDA_SKINNY_SMALL_SPLITS, read at init;
                                 * default 16 = the planner's limit; a tuning switch) */
    int skinny_bn;              /* matmul_skinny.cu's tile width (rows of w per block) when 32 / 64 / 128 / 256
                                 * (default 64), 0: its own choice per shape (env BERTH_CUDA_SKINNY_BN=32|64|128|256|auto,
                                 * read at init; for tuning runs) */
    int skinny_bn_unsplit;      /* the tile width of products whose plan has no K split, where it exists (default 32;
                                 * 0: as skinny_bn; env BERTH_CUDA_SKINNY_BN_UNSPLIT, read at init) */
    int skinny_unsplit_waves;   /* skinny_bn_unsplit only for plans of at most this many waves; 0: always (env
                                 * BERTH_CUDA_SKINNY_UNSPLIT_WAVES=0..64, read at init; default 0) */
    int skinny_u_prefetch;      /* matmul_skinny.cu: GLU MUL's second operand prefetched into L2 at entry (XH instances;
                                 * env BERTH_CUDA_SKINNY_UPREFETCH=0|1, read at init; default 1) */
    int skinny_end_relaxed;     /* matmul_skinny.cu: the split products' last cluster barrier arrives relaxed (env
                                 * BERTH_CUDA_SKINNY_END_RELAXED=0|1, read at init; default 1) */
    int skinny_push;            /* matmul_skinny.cu: the 64-row-tile XH products at 9-32 rows with a K split reduce
                                 * by pushing each block's sums into the owner's shared memory (st.async + mbarrier)
                                 * instead of pulling; 2: the same with a relaxed last cluster barrier (env
                                 * BERTH_CUDA_SKINNY_PUSH=0|1|2, read at init; default 1) */
    int skinny_trim;            /* matmul_skinny.cu: an XH launch whose K split needs fewer ring stages than the instance
                                 * has asks for only the shared memory it touches, so that neighbouring kernels' blocks
                                 * fit beside it under PDL (env BERTH_CUDA_SKINNY_TRIM=0|1, read at init; default 0
                                 * until measured) */
    int skinny_wgmma;           /* matmul_skinny.cu: the 32- and 64-row-tile XH products at 9-32 rows on the wgmma
                                 * instances, 2: with the ring filled by TMA (env BERTH_CUDA_SKINNY_WGMMA=0|1|2, read
                                 * at init; default 1: +1-2% at 32 sequences, bench/RESULTS.md session 24; 2 measured
                                 * slower than 1) */
    void *tmap_encode;          /* the driver's cuTensorMapEncodeTiled (PFN_cuTensorMapEncodeTiled_v12000), or NULL */
    int skinny_small_xh;        /* matmul_skinny.cu: the small products above skinny_max_m rows on the XH instances
                                 * (x rounded once) instead of f32 x, and a small gated product writes the x shadow of
                                 * its successor (env BERTH_CUDA_SKINNY_SMALL_XH=0|1, read at init; default 1) */
    int gemv_norm;              /* a matmul's trailing norm (y_norm) runs inside the GEMV kernel up to this M, 0 = never
                                 * (env BERTH_CUDA_GEMV_NORM: 0..8, read at init; default 0; for A/B runs) */
    int copy_kernel;            /* small buffer_copy calls run as a kernel (copy.cu): the device has unified addressing
                                 * and env BERTH_CUDA_COPY_KERNEL is not 0 (read at init; default 1) */
    int pdl_barriers;           /* streams whose pdl_barrier is set (cu_pdl_barrier_take looks only when > 0): copies
                                 * count as full dependencies for the kernels that read metadata before their PDL
                                 * wait (copy.cu) */
    int pair;                   /* a pair of products (y_then) runs as matmul_pair.cu's one kernel where it fits (env
                                 * BERTH_CUDA_PAIR=0|1|2, read at init; default 0 (slower on the H200); 2 for tests: a
                                 * pair the kernel declines fails) */
    int xpre_fuse;              /* a matmul's norm before the product (x_pre) runs in the batch-1 GEMV's prologue (env
                                 * BERTH_CUDA_XPRE=0|1|2 (2: products of <= 8192 rows only), read at init; default 0;
                                 * for A/B runs) */
    unsigned skip;              /* CU_SKIP_* bits: ops enqueued as nothing (env BERTH_CUDA_SKIP, read at init). A
                                 * measurement switch for ablation runs: results are wrong by design; the time a
                                 * step loses tells what those launches cost on the critical path */
};
/* Mark s: its next cu_launch goes without PDL (copy.cu, graph_end). */
static inline void cu_pdl_barrier_set(berth_backend *be, berth_stream *s)
{
    if (!s->pdl_barrier) {
        s->pdl_barrier = 1;
        be->pdl_barriers++;
    }
}

/* Whether the stream with handle cs is marked; clears the mark (cu_launch_cluster, copy.cu). */
static inline bool cu_pdl_barrier_take(berth_backend *be, cudaStream_t cs)
{
    if (be->pdl_barriers == 0)
        return false;
    for (berth_stream *s = be->streams; s; s = s->next)
        if (s->cs == cs) {
            if (!s->pdl_barrier)
                return false;
            s->pdl_barrier = 0;
            be->pdl_barriers--;
            return true;
        }
    return false;
}


#define CU_SKIP_YNORM 1u  /* a matmul's trailing norm (y_norm) */
#define CU_SKIP_ROPE 2u   /* rms_norm ops with RoPE (q-norm + RoPE) */
#define CU_SKIP_NORM 4u   /* other rms_norm ops */
#define CU_SKIP_KV 8u     /* kv_append (with its query side: Gemma 4's owner layers' q-norm + RoPE) */
#define CU_SKIP_ATTN 16u  /* attention */
#define CU_SKIP_SMALL 32u /* matmuls with K or N <= 512 (Gemma 4's per-layer-input products) */
#define CU_SKIP_KVLOCAL 64u /* not a skip: the tensor-core decode attention reads every key from the pool's first
                             * CU_KVLOCAL_BLOCKS blocks (L2-resident), i.e. what streaming K/V from DRAM costs */
#define CU_SKIP_UNARY 128u /* unary ops (Gemma 4's final logit softcap) */
#define CU_KVLOCAL_BLOCKS 64
#define CU_KVLOCAL_ENTRIES (1 << 20) /* block-table entries of the stand-in table (rows x stride at most) */

#define CU_SKINNY_MIN_M 5 /* below: the GEMV, whose fp32 FMAs per weight are cheap enough up to M = 4 */
/* The most rows matmul_skinny.cu takes with x in f32 (converted per tile in the kernel). Above it the products
 * with a norm (x_pre) or none run on its XH instances up to CU_SKINNY_XPRE_M / CU_SKINNY_PLAIN_M rows, x rounded
 * once by the norm or a pack — E2B decode on the H200 with 8 here instead of 16: +8.8% / +8.7% / +9.2% at 10 / 12 /
 * 16 sequences, 8 even (bench/RESULTS.md session 19: the f32-x instances' k loop is 2-4x the XH one's) — and
 * the rest on cuBLAS (measured faster than the f32-x kernel from M = 32, session 4). */
#define CU_SKINNY_MAX_M 8
#define CU_SKINNY_XPRE_M 32 /* products with an x_pre on matmul_skinny.cu up to this many rows (session 9) */
#define CU_SKINNY_PLAIN_M 32 /* plain products on its XH instances after a pack up to this many rows (session 11) */
/* ... except products with K or N at most this, which stay on it up to M = 64, in row groups (the PLE gate and
 * projection at 32 rows: 5.0 / 3.9 us against 7.2 / 4.3 through cuBLAS; bench/RESULTS.md session 8) */
#define CU_SKINNY_SMALL_KN 512
#define CU_SKINNY_SMALL_BYTES (4u << 20) /* ... and at most this many bytes of weights (each row group reads them) */

#define CU_PDL_OFF 1
#define CU_PDL_ON 2

#define CU_ATT_DECODE_CLUSTER 0  /* attention_decode.cu: one launch, clusters of up to 16 blocks (default) */
#define CU_ATT_DECODE_CLUSTER8 1 /* the same, clusters of at most 8 blocks (BERTH_CUDA_ATT_DECODE=c8) */
#define CU_ATT_DECODE_OLD 2      /* attention.cu's split-K kernel + combine kernel (BERTH_CUDA_ATT_DECODE=old) */
#define CU_ATT_DECODE_MMA 3      /* attention_decode_mma.cu wherever it serves, else as CLUSTER (=mma) */
#define CU_ATT_DECODE_AUTO 4     /* small calls CLUSTER, the rest attention_decode_mma.cu where it serves (=auto) */

/* BERTH_CUDA_ATT_TRIGGER: where the decode attention kernels trigger the next kernel's launch (PDL) */
#define CU_ATT_TRIGGER_EARLY 0 /* at their start, as every other kernel (=early) */
#define CU_ATT_TRIGGER_LATE 1  /* after their key loop (=late) */
#define CU_ATT_TRIGGER_AUTO 2  /* late in the one-launch cluster kernel, early in the tensor-core kernel (=auto) */

#define CU_GEMV_EARLY_ALL 1048576 /* BERTH_CUDA_GEMV_EARLY_MIB's default: every weights buffer loads early */
#define CU_GEMV_NEW 0   /* gemv.cu, loads into registers */
#define CU_GEMV_OLD 1   /* matmul.cu's general GEMV kernel */
#define CU_GEMV_ASYNC 2 /* gemv.cu, cp.async loads through shared memory */

/* ---- errors (cuda_backend.cu) ---- */
berth_status cu_fail(const berth_host *host, berth_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A failed CUDA call: status + message "cuda device N: what: cudaErrorX: text"; marks the backend lost on
 * sticky errors. BERTH_OK for cudaSuccess. */
berth_status cu_check(berth_backend *be, cudaError_t e, const char *what);
/* After a kernel launch: cu_check(be, cudaGetLastError(), kernel). */
berth_status cu_check_launch(berth_backend *be, const char *kernel);
berth_status cu_cublas_check(berth_backend *be, cublasStatus_t s, const char *what);
/* Every entry point that touches the device starts here: refuse a lost device, make ours current. */
berth_status cu_enter(berth_backend *be);
/* BERTH_CUDA_ATT_PROF=graph (attention_decode_mma.cu), when a stream goes: synchronise, then log at WARN, per launch
 * recorded into its graphs (capture order), the minimum / upper median / maximum of each stamp over the blocks, in
 * us from the earliest stamp of that launch's graph — the last replay's, so a timeline of one step's stamped
 * kernels. Frees the list of regions; nothing without them. */
void cu_att_prof_graph_report(berth_backend *be, berth_stream *s);

/* ---- small copies as a kernel (copy.cu) ---- */
#define CU_COPY_KERNEL_MAX (256u << 10) /* larger copies go to the copy engine */
/* 1 when buffer_copy of nbytes from src to dst should take cu_copy_small: enabled, small, not host to host. */
int cu_copy_kernel_fits(const berth_backend *be, const berth_buffer *dst, const berth_buffer *src, uint64_t nbytes);
/* nbytes from src to dst (device or pinned host pointers) in stream order on s, as one kernel launch. */
berth_status cu_copy_small(berth_backend *be, berth_stream *s, void *dst, const void *src, uint64_t nbytes);

/* ---- workspaces (cuda_backend.cu) ---- */
/* Device scratch of at least bytes on stream s, valid until the op returns (the next op may reuse it). Fails
 * with a message if it would have to grow during graph capture. */
berth_status cu_stream_ws(berth_backend *be, berth_stream *s, size_t bytes, void **out);
/* Pinned host scratch of at least bytes on stream s. Waits until copies enqueued from the previous use have
 * finished; after enqueuing copies out of it, call cu_stream_host_ws_done(). */
berth_status cu_stream_host_ws(berth_backend *be, berth_stream *s, size_t bytes, void **out);
berth_status cu_stream_host_ws_done(berth_backend *be, berth_stream *s);

/* ---- tensor addressing ---- */
static inline char *cu_ptr(const berth_tensor *t)
{
    return (char *)t->buf->ptr + t->offset;
}
static inline int64_t cu_nrows(const berth_tensor *t)
{
    return t->ne[1] * t->ne[2] * t->ne[3];
}
/* The rows of a tensor (flattened over ne[1..3], ne[1] fastest) as a kernel argument: row i starts at
 * base + cu_row_off(r, i). Each row is element-contiguous (nb[0] = element size). */
struct cu_rows {
    char *base;
    int64_t ne1, ne2, nb1, nb2, nb3;
};
static inline cu_rows cu_rows_of(const berth_tensor *t)
{
    cu_rows r;
    r.base = cu_ptr(t);
    r.ne1 = t->ne[1];
    r.ne2 = t->ne[2];
    r.nb1 = t->nb[1];
    r.nb2 = t->nb[2];
    r.nb3 = t->nb[3];
    return r;
}
/* Row i of a row shape (ne1, ne2) as its indices (i1, i2, i3), ne1 fastest. The common cases go without 64-bit
 * division (a few hundred instructions each on the GPU, per thread and row): a 2-D view (every row index is
 * below ne1), then indices that fit 32 bits. */
struct cu_row_idx {
    int64_t i1, i2, i3;
};
#ifdef __CUDACC__
/* The 64-bit fallback as a call on the device: inlined, its three divisions were hundreds of instructions in every
 * kernel that addresses rows (e.g. 4 of the norm kernel's 30 KB), never run by the model's shapes (machine code a
 * kernel carries costs at every launch: bench/RESULTS.md session 17). */
static __device__ __noinline__ cu_row_idx cu_split_row_wide(int64_t i, int64_t ne1, int64_t ne2)
{
    cu_row_idx x;
    x.i1 = i % ne1;
    x.i2 = i / ne1 % ne2;
    x.i3 = i / ne1 / ne2;
    return x;
}
#endif
static __host__ __device__ __forceinline__ cu_row_idx cu_split_row(int64_t i, int64_t ne1, int64_t ne2)
{
    cu_row_idx x;
    if (i < ne1) {
        x.i1 = i;
        x.i2 = x.i3 = 0;
    } else if (((uint64_t)i | (uint64_t)ne1 | (uint64_t)ne2) <= 0x7fffffffu) {
        const uint32_t u = (uint32_t)i, n1 = (uint32_t)ne1, n2 = (uint32_t)ne2;
        const uint32_t q1 = u / n1, q2 = q1 / n2;
        x.i1 = u - q1 * n1;
        x.i2 = q1 - q2 * n2;
        x.i3 = q2;
    } else {
#ifdef __CUDA_ARCH__
        x = cu_split_row_wide(i, ne1, ne2);
#else
        x.i1 = i % ne1;
        x.i2 = i / ne1 % ne2;
        x.i3 = i / ne1 / ne2;
#endif
    }
    return x;
}
static __host__ __device__ __forceinline__ int64_t cu_row_off(const cu_rows &r, int64_t i)
{
    const cu_row_idx x = cu_split_row(i, r.ne1, r.ne2);
    return x.i1 * r.nb1 + x.i2 * r.nb2 + x.i3 * r.nb3;
}
static __host__ __device__ __forceinline__ char *cu_row(const cu_rows &r, int64_t i)
{
    return r.base + cu_row_off(r, i);
}
/* Rows of t are evenly spaced (a single stride nb[1] walks all of ne[1]*ne[2]*ne[3] rows: row i at i * nb[1]).
 * The stride of a size-1 dimension is never used, so it is not compared (an {n, 1, 1, T} view of one head may
 * carry any nb[2]): each used stride must equal nb[1] times the rows below it. */
static inline bool cu_rows_uniform(const berth_tensor *t)
{
    int64_t want = t->nb[1] * t->ne[1];
    if (t->ne[2] > 1 && t->nb[2] != want)
        return false;
    want *= t->ne[2];
    return t->ne[3] == 1 || t->nb[3] == want;
}
static inline int cu_blocks(int64_t n, int per_block)
{
    return (int)((n + per_block - 1) / per_block);
}

/* ---- ops: check (query and exec) and run ---- */
#define CU_DECLARE_OP(name, ptype)                                                                             \
    bool cu_check_##name(const berth_backend *be, struct opck *c, const ptype *p);                             \
    berth_status cu_op_##name(berth_backend *be, berth_stream *s, const ptype *p);
CU_DECLARE_OP(matmul, berth_matmul_params)
CU_DECLARE_OP(get_rows, berth_get_rows_params)
CU_DECLARE_OP(rms_norm, berth_rms_norm_params)
CU_DECLARE_OP(layer_norm, berth_layer_norm_params)
CU_DECLARE_OP(rope, berth_rope_params)
CU_DECLARE_OP(unary, berth_unary_params)
CU_DECLARE_OP(glu, berth_glu_params)
CU_DECLARE_OP(binary, berth_binary_params)
CU_DECLARE_OP(copy, berth_copy_params)
CU_DECLARE_OP(kv_append, berth_kv_append_params)
CU_DECLARE_OP(attention, berth_attention_params)
CU_DECLARE_OP(gated_rms_norm, berth_gated_rms_norm_params)
CU_DECLARE_OP(log_softmax_topk, berth_log_softmax_topk_params)
CU_DECLARE_OP(sample, berth_sample_params)
#undef CU_DECLARE_OP
/* The matmul member of the op table (norm.cu): the norm before the product (x_pre) when given, cu_op_matmul, then
 * the trailing rms_norm (y_norm) when given. */
berth_status cu_op_matmul_then_norm(berth_backend *be, berth_stream *s, const berth_matmul_params *p);
struct cu_xpre; /* gemv_xpre.cuh */
/* cu_op_matmul (matmul.cu) that may also finish p's trailing norm: when yn_done is not NULL and the product's
 * kernel can (gemv_norm.cuh), it does and sets *yn_done; otherwise *yn_done is left alone and nothing of the norm
 * is enqueued. xp (from cu_xpre_plan, or NULL): the batch-1 GEMV runs p's x_pre in its prologue. pre (p's x_pre,
 * or NULL): the norm is launched before the product's kernels — on the cuBLAS path as the pass that also writes
 * the packed x (cu_rms_norm_packed) instead of a pack of its own. */
berth_status cu_matmul_run(berth_backend *be, berth_stream *s, const berth_matmul_params *p, bool *yn_done,
                           const struct cu_xpre *xp, const berth_rms_norm_params *pre);
/* norm.cu: rms_norm p that also writes its last output rounded to bdt (BF16 / F16) at xb, rows ldb elements apart,
 * where the fast kernel takes p's rows (*done true); otherwise nothing is enqueued. */
berth_status cu_rms_norm_packed(berth_backend *be, berth_stream *s, const berth_rms_norm_params *p, void *xb,
                                int64_t ldb, int bdt, bool *done);
/* matmul.cu: x's M rows of K into out (ldo elements apart, 16-byte aligned), converted to out_dt (rounded to nearest
 * even), without p's norm prologue: the cuBLAS path's pack, for matmul_skinny.cu's XH instances. */
berth_status cu_matmul_pack_x(berth_backend *be, berth_stream *s, const berth_matmul_params *p, int64_t M, int64_t K,
                              void *out, int64_t ldo, int out_dt);
/* matmul.cu: the stream's shadow of p's x (M rows of K, rounded to dt) when the op before this one wrote exactly
 * those rows, with *ld its row pitch in elements; NULL otherwise. */
const uint16_t *cu_xshadow_match(const berth_stream *s, const berth_matmul_params *p, int64_t M, int64_t K, int dt,
                                 int64_t *ld);
/* matmul.cu: claims the shadow for this op's output y (M rows of N fp32), to be rounded to dt by the caller's
 * kernel into the returned buffer (row pitch *ld); NULL (and the shadow cleared) when the shadow is off
 * (be->xshadow), M is outside the row range whose products read it, y's rows are not evenly spaced contiguous
 * fp32, or they do not fit. */
uint16_t *cu_xshadow_claim(const berth_backend *be, berth_stream *s, const berth_tensor *y, int64_t M, int64_t N,
                           int dt, int64_t *ld);
/* The same for M rows of N contiguous fp32 at row0, nb bytes apart (an output that is no single tensor view). */
uint16_t *cu_xshadow_claim_rows(const berth_backend *be, berth_stream *s, const char *row0, int64_t nb, int64_t M,
                                int64_t N, int dt, int64_t *ld);
/* Whether cu_rms_norm_packed would run p (a 16-byte aligned xb assumed). */
bool cu_rms_norm_packable(const berth_backend *be, const berth_rms_norm_params *p, int64_t ldb, int bdt);
/* Can p's x_pre (the norm before the product) run in the product kernel's prologue (gemv_xpre.cuh)? Fills *out
 * when it can; otherwise the caller runs the norm as an op of its own first. */
bool cu_xpre_plan(const berth_backend *be, const berth_matmul_params *p, struct cu_xpre *out);
/* matmul_pair.cu: p and its second product (y_then) with their norms as one kernel, when they fit it (bf16 weights,
 * up to 64 rows, widths that split over a cluster, the memory rules in the file); *done = false, BERTH_OK: not
 * taken, nothing enqueued. p is checked by the caller. */
berth_status cu_matmul_pair(berth_backend *be, berth_stream *s, const berth_matmul_params *p, bool *done);

/* Common op prologue: exec-mode check (message through the host), then cu_enter. Used as the first line of each
 * cu_op_NAME: CU_OP_BEGIN(be, NAME, p); */
#define CU_OP_BEGIN(be, name, p)                                                                               \
    do {                                                                                                       \
        struct opck ck_ = {};                                                                                  \
        ck_.exec = 1;                                                                                          \
        ck_.be = &(be)->ck;                                                                                    \
        if (!(p))                                                                                              \
            opck_fail(&ck_, BERTH_E_INVALID, #name ": params is NULL");                                        \
        if (!(p) || !cu_check_##name((be), &ck_, (p)))                                                         \
            return cu_fail((be)->host, ck_.code, "%s", ck_.msg);                                               \
        berth_status st_ = cu_enter(be);                                                                       \
        if (st_ != BERTH_OK)                                                                                   \
            return st_;                                                                                        \
    } while (0)

#endif

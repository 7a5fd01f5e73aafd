/*
 * matmul_pair.cu — a pair of products with a narrow middle (berth_matmul_params.y_then, ABI 0.6) and the norms on
 * either side (the first product's x_pre, the second's y_norm), as one kernel for up to MP_MAX_M rows.
 *
 * Status: OFF by default (BERTH_CUDA_PAIR=1 turns it on). On the H200 it is slower than the launches it replaces:
 * E2B batch 1 516-529 tok/s against 539-541 (bench/RESULTS.md session 15). The kernel takes ~9 us from its start
 * at batch 1 where the four launches took ~8.3 us exposed; the launch, the cluster and the PDL wait alone are ~2 us,
 * so ~6 us go to the dependent phases below, with weight loads, remote stores and x loads each switched off making
 * no difference (measured with switches since removed). Where that time goes is the open question (instruction
 * fetch of a 46 KB kernel run once per layer on cold SMs is one candidate). Kept, tested, for that work.
 *
 * Why: Gemma 4's per-layer-input block is four dependent launches at decode — the post-FF norm, the gate (1536 ->
 * 256, with gelu(.) * the per-layer input as its epilogue), the projection (256 -> 1536) and the post-PLE norm (+
 * the next layer's input norm) — ~8 us of a batch-1 step per layer for 1.6 MB of weights, nearly all of it kernel
 * boundaries (bench/RESULTS.md session 14). Here one cluster of MP_CS blocks per R rows does the products (and the
 * norms when the op carries them): each block loads its slice of both weight matrices into registers before the
 * PDL wait, and the only exchanges left go through distributed shared memory.
 *
 * Per cluster (rows m0 .. m0 + R - 1; every block of the cluster holds those rows):
 *   A  every block computes the x_pre norm of its rows in full (the same arithmetic in every block, so every block
 *      holds bit-identical rows) into sX;
 *   B  block r computes columns [r n1b, (r + 1) n1b) of the first product (+ its GLU epilogue), a warp per column,
 *      and pushes them into every block's sG (st.shared::cluster), then a cluster barrier;
 *   C  block r computes columns [r n2b, (r + 1) n2b) of the second product from sG, a warp per column;
 *   D  y_norm: each block's partial sums of squares of its columns go to every block (a barrier), every block
 *      finishes its columns; the second output the same way once more;
 *   then every block stores its share of every output (all global stores last: see the end of the kernel).
 *
 * Same formulas as norm.cu's rms_norm (x * inv, * w, + residual, * out_scale; inv = 1 / sqrt(mean + eps)) and the
 * GEMV's fp32 products of bf16 weights, but summed in other orders, so results differ from the separate launches
 * in the last bits (tests/cuda_ops/test_cuda_pair.c compares with the CPU backend's four ops).
 *
 * Memory rules (cu_matmul_pair checks them and declines otherwise): the inputs are read before the second
 * cluster barrier (the GLU factor in phase B, the rest before the first), except y_norm's residual (phase D),
 * which is either x_pre's y (then read from sX, never from memory), or exactly y_norm's y (each element read,
 * then written, by one thread of one block), or overlaps no output. Outputs overlap each other nowhere; an output
 * may be exactly an input (the same view: Gemma 4's projection writes the buffer the post-FF norm reads, and its
 * post-PLE norm the residual stream the post-FF norm read) because clusters own disjoint rows and every output is
 * stored after the cluster's last barrier, and otherwise overlaps none.
 */
#include "cuda_cluster.cuh"
#include "cuda_device.cuh"
#include "cuda_internal.h"
#include "cuda_launch.cuh"
#include "norm_args.cuh"

#include <string.h>

#define MP_CS 16              /* blocks per cluster (non-portable size: mp_setup checks the device allows it) */
#define MP_THREADS 512        /* 16 warps */
#define MP_WARPS (MP_THREADS / 32)
#define MP_ROWS 4             /* rows per cluster at most (registers: phase A holds R float4 of x per thread) */
#define MP_MAX_M 64           /* rows of the op at most: 16 clusters of 16 blocks */
#define MP_CACHE_DEVICES 64
#define MP_WB 6               /* 16-byte weight chunks per lane in phase B: K1 <= 8 * 32 * 6 = 1536 */
#define MP_WC 6               /* columns per warp in phase C: N2 <= MP_CS * MP_WARPS * 6 = 1536 */

/* One rms_norm of the pair (x_pre or y_norm): device addresses, row strides in floats. */
struct mp_norm {
    const float *x, *res; /* res NULL: no residual */
    float *y, *y2;        /* y2 NULL: no second output */
    int64_t ldx, ldr, ldy, ldy2;
    const void *w, *w2;   /* NULL: no weight (UNIT / W_NONE) */
    int32_t wdt, w2dt, wmode, w2mode; /* the weights' dtypes and modes (norm_args.cuh's nm_factor) */
    float eps, oscale;
    int32_t on;
};

struct mp_args {
    mp_norm pre, post;
    const float *x;           /* the first product's x when there is no x_pre */
    int64_t ldx;
    const uint16_t *w1, *w2;  /* bf16, packed: [N1][K1] and [N2][N1] */
    float *y1, *y2;           /* the products' outputs */
    int64_t ldy1, ldy2;
    const float *up;          /* the first product's GLU MUL factor (NULL: no epilogue) */
    int64_t ldup;
    int32_t act;
    int32_t M, K1, N1, N2;
    int32_t early;            /* the weights (and the norms' weights) may be read before the PDL wait */
    int32_t res_from_x;       /* y_norm's residual is x_pre's y, which sX holds */
    uint32_t o_x, o_y, o_g, o_a, o_p, o_pw, o_pw2, o_qw, o_qw2, o_part; /* shared memory offsets (bytes) */
};

/* The GLU's activation: GELU-tanh (Gemma) inline, the others through one out-of-line copy of cu_act (the kernel
 * runs once per layer, so every instruction it executes is a cold instruction-cache miss: keep it small). */
static __device__ __noinline__ float mp_act_other(int act, float x)
{
    return cu_act(act, x);
}
__device__ __forceinline__ float mp_act(int act, float x)
{
    if (act == BERTH_ACT_GELU_TANH)
        return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    return mp_act_other(act, x);
}

/* Eight bf16 (a 16-byte chunk) widened exactly. */
__device__ __forceinline__ void mp_widen8(const uint4 q, float *f)
{
    const uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(u[i] << 16);
        f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
}

template <int R>
__global__ void __launch_bounds__(MP_THREADS, 1) mp_pair_kernel(const mp_args a)
{
    extern __shared__ __align__(16) unsigned char mp_smem[];
    cu_pdl_trigger();
    cu_cluster_arrive_relaxed(); /* this block has started: the first remote store (phase B) waits for all */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int rank = (int)cu_cluster_rank();
    const int m0 = (int)(blockIdx.x / MP_CS) * R;
    const int mr = a.M - m0 < R ? a.M - m0 : R; /* >= 1: the grid has ceil(M / R) clusters */
    const int K1 = a.K1, N1 = a.N1, N2 = a.N2, n1b = N1 / MP_CS, n2b = N2 / MP_CS;
    float *sX = (float *)(mp_smem + a.o_x);         /* [R][K1]: the first product's x rows */
    float *sG = (float *)(mp_smem + a.o_g);         /* [R][N1]: its y rows, from every block */
    float *sY = (float *)(mp_smem + a.o_y);         /* [R][K1]: x_pre's y when sX holds its y2 */
    float *sA = (float *)(mp_smem + a.o_a);         /* [R][n2b]: this block's columns of y_norm's y */
    float *sP = (float *)(mp_smem + a.o_p);         /* [R][n2b]: this block's columns of the second product */
    float *sPW = (float *)(mp_smem + a.o_pw);       /* [K1] x_pre's weight factors */
    float *sPW2 = (float *)(mp_smem + a.o_pw2);     /* [K1] its second output's */
    float *sQW = (float *)(mp_smem + a.o_qw);       /* [n2b] y_norm's, this block's columns */
    float *sQW2 = (float *)(mp_smem + a.o_qw2);     /* [n2b] its second output's */
    float *sPart = (float *)(mp_smem + a.o_part);   /* [2][MP_CS][R] the blocks' partial sums of squares */

    /* This block's weights in registers: phase B's warp owns column j = warp (n1b <= MP_WARPS) and its lane the
     * chunks c = lane + 32 u (u < MP_WB); phase C's warp owns columns j = warp + MP_WARPS t (t < MP_WC) and its lane
     * chunk c = lane (N1 <= 256). mp_plan keeps the shapes inside that. The norms' factors go to shared memory. */
    uint4 wb[MP_WB], wc[MP_WC];
    auto load_weights = [&]() {
        const bool b_on = warp < n1b;
        const uint16_t *g1 = a.w1 + ((int64_t)rank * n1b + warp) * K1;
#pragma unroll
        for (int u = 0; u < MP_WB; u++) {
            const int c = lane + 32 * u;
            if (b_on && c < K1 / 8)
                wb[u] = cu_ld_stream16(g1 + c * 8);
        }
#pragma unroll
        for (int t = 0; t < MP_WC; t++) {
            const int j = warp + MP_WARPS * t;
            if (j < n2b && lane < N1 / 8)
                wc[t] = cu_ld_stream16(a.w2 + ((int64_t)rank * n2b + j) * N1 + lane * 8);
        }
        /* every load issued before any store: the compiler may not move a load above a store it cannot prove
         * apart, and one round trip per element group would cost microseconds */
        constexpr int FK = 4; /* factors per thread: K1 <= 4 * MP_THREADS (mp_plan) */
        float f1[FK], f2[FK], q1 = 1.0f, q2 = 1.0f;
#pragma unroll
        for (int k = 0; k < FK; k++) {
            const int i = tid + k * MP_THREADS;
            f1[k] = a.pre.on && i < K1 ? nm_factor(a.pre.w, a.pre.wdt, a.pre.wmode, i) : 1.0f;
            f2[k] = a.pre.on && i < K1 ? nm_factor(a.pre.w2, a.pre.w2dt, a.pre.w2mode, i) : 1.0f;
        }
        const bool qon = a.post.on && tid < n2b; /* n2b <= MP_THREADS (mp_plan) */
        if (qon) {
            q1 = nm_factor(a.post.w, a.post.wdt, a.post.wmode, (int64_t)rank * n2b + tid);
            q2 = nm_factor(a.post.w2, a.post.w2dt, a.post.w2mode, (int64_t)rank * n2b + tid);
        }
#pragma unroll
        for (int k = 0; k < FK; k++) {
            const int i = tid + k * MP_THREADS;
            if (a.pre.on && i < K1) {
                sPW[i] = f1[k];
                sPW2[i] = f2[k];
            }
        }
        if (qon) {
            sQW[tid] = q1;
            sQW2[tid] = q2;
        }
    };
    if (a.early)
        load_weights();
    cu_pdl_wait();
    if (!a.early)
        load_weights();
    __syncthreads(); /* the norms' factors */

    /* A: the first product's x rows. Each row is spread over TPR threads, every load of a thread issued before any
     * use (one round trip to L2 for the row, not one per element group), the sums of squares reduced in a fixed
     * order (every block of the cluster holds bit-identical rows). */
    {
        constexpr int TPR = MP_THREADS / R, WPR = TPR / 32; /* threads and warps per row */
        float *red = sPart; /* [R][WPR] = MP_WARPS floats of the 2 MP_CS R: free until phase D */
        const int r = tid / TPR, l = tid - r * TPR, wr = l >> 5;
        const bool row = r < mr;
        const int64_t m = m0 + r;
        const int nv = K1 / 4; /* <= R * TPR: K1 <= 4 * MP_THREADS (mp_plan) */
        float *xs = sX + (int64_t)r * K1;
        float4 v[R], rv[R];
        const mp_norm &n = a.pre;
        const float4 *xr = (const float4 *)(n.on ? n.x + m * n.ldx : a.x + m * a.ldx);
        const float4 *rr = n.on && n.res ? (const float4 *)(n.res + m * n.ldr) : nullptr;
#pragma unroll
        for (int k = 0; k < R; k++) {
            const int q = l + k * TPR;
            if (row && q < nv) {
                v[k] = xr[q];
                if (rr)
                    rv[k] = rr[q];
            }
        }
        if (!n.on) {
#pragma unroll
            for (int k = 0; k < R; k++) {
                const int q = l + k * TPR;
                if (row && q < nv)
                    ((float4 *)xs)[q] = v[k];
            }
        } else {
            /* the row's sum of squares: lanes, then the row's warps in order */
            auto row_sum = [&](float ss) {
                ss = cu_warp_sum(ss);
                if (row && lane == 0)
                    red[r * WPR + wr] = ss;
                __syncthreads();
                float t = 0.0f;
                if (row)
                    for (int k = 0; k < WPR; k++)
                        t += red[r * WPR + k];
                __syncthreads(); /* red is reused by the second sum */
                return t;
            };
            float ss = 0.0f;
#pragma unroll
            for (int k = 0; k < R; k++) {
                const int q = l + k * TPR;
                if (row && q < nv) {
                    ss = fmaf(v[k].x, v[k].x, ss);
                    ss = fmaf(v[k].y, v[k].y, ss);
                    ss = fmaf(v[k].z, v[k].z, ss);
                    ss = fmaf(v[k].w, v[k].w, ss);
                }
            }
            const float inv = 1.0f / sqrtf(row_sum(ss) / (float)K1 + n.eps);
            float ss2 = 0.0f;
#pragma unroll
            for (int k = 0; k < R; k++) {
                const int q = l + k * TPR;
                if (!(row && q < nv))
                    continue;
                const float4 f = ((const float4 *)sPW)[q];
                float4 o = nm_scale4(v[k], inv, f);
                nm_resid_scale4(o, rr, rv[k], n.oscale);
                v[k] = o;
                if (n.y2)
                    ((float4 *)(sY + (int64_t)r * K1))[q] = o;
                ss2 = nm_sumsq4(o, ss2);
            }
            if (n.y2) { /* uniform: row_sum's barriers are safe */
                const float inv2 = 1.0f / sqrtf(row_sum(ss2) / (float)K1 + n.eps);
#pragma unroll
                for (int k = 0; k < R; k++) {
                    const int q = l + k * TPR;
                    if (!(row && q < nv))
                        continue;
                    const float4 f = ((const float4 *)sPW2)[q];
                    v[k] = nm_scale4(v[k], inv2, f);
                }
            }
#pragma unroll
            for (int k = 0; k < R; k++) {
                const int q = l + k * TPR;
                if (row && q < nv)
                    ((float4 *)xs)[q] = v[k];
            }
        }
    }
    __syncthreads(); /* sX */

    /* B: columns of the first product, a warp per column, R rows at once; pushed to every block's sG. */
    cu_cluster_wait(); /* every block of the cluster has started */
    if (warp < n1b) {
        const int j = warp, jg = rank * n1b + j;
        float acc[R], upv[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            acc[r] = 0.0f;
            upv[r] = a.up && r < mr ? a.up[(int64_t)(m0 + r) * a.ldup + jg] : 1.0f; /* in flight during the sums */
        }
#pragma unroll
        for (int u = 0; u < MP_WB; u++) {
            const int c = lane + 32 * u;
            if (c >= K1 / 8)
                break;
            float wf[8];
            mp_widen8(wb[u], wf);
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (r < mr) {
                    const float4 x0 = *(const float4 *)(sX + (int64_t)r * K1 + c * 8);
                    const float4 x1 = *(const float4 *)(sX + (int64_t)r * K1 + c * 8 + 4);
                    acc[r] = fmaf(wf[0], x0.x, acc[r]);
                    acc[r] = fmaf(wf[1], x0.y, acc[r]);
                    acc[r] = fmaf(wf[2], x0.z, acc[r]);
                    acc[r] = fmaf(wf[3], x0.w, acc[r]);
                    acc[r] = fmaf(wf[4], x1.x, acc[r]);
                    acc[r] = fmaf(wf[5], x1.y, acc[r]);
                    acc[r] = fmaf(wf[6], x1.z, acc[r]);
                    acc[r] = fmaf(wf[7], x1.w, acc[r]);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++)
            acc[r] = cu_warp_sum(acc[r]); /* R independent reductions, interleaved */
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (r >= mr)
                break;
            const float z = acc[r];
            const float g = a.up ? mp_act(a.act, z) * upv[r] : z;
            if (lane < MP_CS)
                *cu_cluster_remote(sG + (int64_t)r * N1 + jg, lane) = g;
        }
    }
    cu_cluster_arrive_release();
    cu_cluster_wait(); /* sG complete in every block */

    /* C: this block's columns of the second product. */
    {
        float gv[R][8]; /* this lane's chunk of every middle row */
#pragma unroll
        for (int r = 0; r < R; r++) {
            const bool on = r < mr && lane < N1 / 8;
            const float4 g0 = on ? *(const float4 *)(sG + (int64_t)r * N1 + lane * 8) : make_float4(0, 0, 0, 0);
            const float4 g1 = on ? *(const float4 *)(sG + (int64_t)r * N1 + lane * 8 + 4) : make_float4(0, 0, 0, 0);
            gv[r][0] = g0.x, gv[r][1] = g0.y, gv[r][2] = g0.z, gv[r][3] = g0.w;
            gv[r][4] = g1.x, gv[r][5] = g1.y, gv[r][6] = g1.z, gv[r][7] = g1.w;
        }
#pragma unroll
        for (int t = 0; t < MP_WC; t++) {
            const int j = warp + MP_WARPS * t;
            if (j >= n2b)
                break;
            float wf[8];
            if (lane < N1 / 8)
                mp_widen8(wc[t], wf);
            else
                for (int e = 0; e < 8; e++)
                    wf[e] = 0.0f;
            float acc[R];
#pragma unroll
            for (int r = 0; r < R; r++) {
                acc[r] = 0.0f;
#pragma unroll
                for (int e = 0; e < 8; e++)
                    acc[r] = fmaf(wf[e], gv[r][e], acc[r]);
            }
#pragma unroll
            for (int r = 0; r < R; r++)
                acc[r] = cu_warp_sum(acc[r]);
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (r >= mr)
                    break;
                if (lane == 0)
                    sP[r * n2b + j] = sA[r * n2b + j] = acc[r];
            }
        }
    }
    __syncthreads(); /* sA, sP */

    /* D: y_norm over the N2 columns of each row, spread over the cluster: partial sums, a barrier, the rest. */
    const mp_norm &n = a.post;
    const int passes = !n.on ? 0 : n.y2 ? 2 : 1;
    for (int pass = 0; pass < passes; pass++) {
        if (warp < mr) {
            float ss = 0.0f;
            for (int j = lane; j < n2b; j += 32)
                ss = fmaf(sA[warp * n2b + j], sA[warp * n2b + j], ss);
            ss = cu_warp_sum(ss);
            if (lane < MP_CS)
                *cu_cluster_remote(sPart + (pass * MP_CS + rank) * R + warp, lane) = ss;
        }
        cu_cluster_arrive_release();
        cu_cluster_wait();
        for (int i = tid; i < mr * n2b; i += MP_THREADS) {
            const int r = i / n2b, j = i - r * n2b;
            const int64_t m = m0 + r, jg = (int64_t)rank * n2b + j;
            float ss = 0.0f;
            for (int k = 0; k < MP_CS; k++) /* the same order in every block */
                ss += sPart[(pass * MP_CS + k) * R + r];
            const float inv = 1.0f / sqrtf(ss / (float)N2 + n.eps);
            const float v = sA[i];
            if (pass == 0) {
                float o = v * inv * sQW[j];
                if (n.res)
                    o = (a.res_from_x ? sX[r * K1 + jg] : n.res[m * n.ldr + jg]) + o;
                if (n.oscale != 1.0f)
                    o *= n.oscale;
                sA[i] = o;
            } else {
                n.y2[m * n.ldy2 + jg] = v * inv * sQW2[j]; /* past the last barrier */
            }
        }
        __syncthreads(); /* sA holds y for the second pass and the stores below */
    }

    /* Every global store last: a cluster barrier's release waits for the block's earlier stores to complete, so
     * stores before the barriers above would each have cost a round trip on the critical path. Nothing is written
     * into this block's shared memory any more. Each block stores its own columns (and its share of x_pre's
     * rows: every MP_CS-th float4). */
    if (a.pre.on) {
        const int nv = K1 / 4, cpr = (nv + MP_CS - 1) / MP_CS; /* this block's float4 per row */
        const float *ys = a.pre.y2 ? sY : sX;
        for (int i = tid; i < mr * cpr; i += MP_THREADS) {
            const int r = i / cpr, q = rank + MP_CS * (i - r * cpr);
            if (q >= nv)
                continue;
            const int64_t m = m0 + r;
            ((float4 *)(a.pre.y + m * a.pre.ldy))[q] = ((const float4 *)(ys + (int64_t)r * K1))[q];
            if (a.pre.y2)
                ((float4 *)(a.pre.y2 + m * a.pre.ldy2))[q] = ((const float4 *)(sX + (int64_t)r * K1))[q];
        }
    }
    for (int i = tid; i < mr * n1b; i += MP_THREADS) {
        const int r = i / n1b, jg = rank * n1b + (i - r * n1b);
        a.y1[(int64_t)(m0 + r) * a.ldy1 + jg] = sG[(int64_t)r * N1 + jg];
    }
    for (int i = tid; i < mr * n2b; i += MP_THREADS) {
        const int r = i / n2b, jg = rank * n2b + (i - r * n2b);
        const int64_t m = m0 + r;
        a.y2[m * a.ldy2 + jg] = sP[i];
        if (n.on)
            n.y[m * n.ldy + jg] = sA[i];
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Host side.

/* Per kernel instance and device: the shared-memory opt-in and the cluster size set once (they cost microseconds
 * of host time per call otherwise); ok: clusters of MP_CS can be resident with that much shared memory. */
struct mp_cache {
    int ready[MP_CACHE_DEVICES];
    int ok[MP_CACHE_DEVICES];
    int smem[MP_CACHE_DEVICES];
};

struct mp_kernel {
    void (*fn)(const mp_args);
    mp_cache *cache;
    int rows;
};

template <int R>
static mp_kernel mp_inst()
{
    static mp_cache cache; /* one per template instance, zero-initialised */
    return {mp_pair_kernel<R>, &cache, R};
}

static mp_kernel mp_pick(int64_t M)
{
    if (M <= 1)
        return mp_inst<1>();
    if (M <= 2)
        return mp_inst<2>();
    return mp_inst<MP_ROWS>();
}

/* Whether clusters of MP_CS blocks with smem bytes each can run on this device (set up once per instance). */
static bool mp_setup(berth_backend *be, cudaStream_t stream, const mp_kernel &k, size_t smem)
{
    const int dev = be->device;
    if (dev < 0 || dev >= MP_CACHE_DEVICES)
        return false;
    if (!__atomic_load_n(&k.cache->ready[dev], __ATOMIC_ACQUIRE)) {
        int ok = 0, lim = 0;
        cudaFuncAttributes fa;
        if (cudaFuncGetAttributes(&fa, k.fn) == cudaSuccess && be->smem_optin > fa.sharedSizeBytes) {
            lim = (int)(be->smem_optin - fa.sharedSizeBytes);
            if (cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, lim) == cudaSuccess &&
                cudaFuncSetAttribute(k.fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess) {
                cudaLaunchAttribute attr[1] = {};
                attr[0].id = cudaLaunchAttributeClusterDimension;
                attr[0].val.clusterDim.x = MP_CS;
                attr[0].val.clusterDim.y = 1;
                attr[0].val.clusterDim.z = 1;
                cudaLaunchConfig_t cfg = {};
                cfg.gridDim = dim3(MP_CS);
                cfg.blockDim = dim3(MP_THREADS);
                cfg.dynamicSmemBytes = (size_t)lim;
                cfg.stream = stream; /* a query: nothing is enqueued (the stream may be capturing) */
                cfg.attrs = attr;
                cfg.numAttrs = 1;
                int n = 0;
                ok = cudaOccupancyMaxActiveClusters(&n, k.fn, &cfg) == cudaSuccess && n > 0;
            }
        }
        (void)cudaGetLastError(); /* a refused attribute or query is not a launch error */
        k.cache->ok[dev] = ok;
        k.cache->smem[dev] = lim;
        __atomic_store_n(&k.cache->ready[dev], 1, __ATOMIC_RELEASE);
    }
    return k.cache->ok[dev] && smem <= (size_t)k.cache->smem[dev];
}

/* A 2-D f32 view with element-contiguous rows, 16-byte aligned rows: its first row and row stride (floats). */
static bool mp_rows(const berth_tensor *t, int64_t M, const float **p, int64_t *ld)
{
    if (t->dtype != BERTH_DTYPE_F32 || cu_nrows(t) != M || (M > 1 && t->ne[1] != M) || t->nb[0] != 4 ||
        t->nb[1] % 16 != 0 || (uintptr_t)cu_ptr(t) % 16 != 0)
        return false;
    *p = (const float *)cu_ptr(t);
    *ld = t->nb[1] / 4;
    return true;
}

/* A norm weight the kernel reads element by element (modes W, W_ONE_PLUS; UNIT / W_NONE: none). */
static bool mp_norm_weight(int32_t mode, const berth_tensor *w, const void **ptr, int32_t *dt, int32_t *wmode,
                           bool *early)
{
    *ptr = NULL;
    *dt = BERTH_DTYPE_F32;
    *wmode = mode;
    if (mode != BERTH_NORM_W && mode != BERTH_NORM_W_ONE_PLUS)
        return true;
    if (w->dtype != BERTH_DTYPE_F32 && w->dtype != BERTH_DTYPE_BF16 && w->dtype != BERTH_DTYPE_F16)
        return false;
    *ptr = cu_ptr(w);
    *dt = w->dtype;
    *early = *early && w->buf->usage == BERTH_USAGE_WEIGHTS;
    return true;
}

/* n as the kernel's mp_norm over M rows of K, with the views it reads and writes; false: not this kernel's. */
static bool mp_norm_plan(const berth_rms_norm_params *n, int64_t M, int64_t K, mp_norm *out, bool *early)
{
    memset(out, 0, sizeof *out);
    if (!n)
        return true;
    if (n->resid_mode != BERTH_RESID_NONE && n->resid_mode != BERTH_RESID_ADD_AFTER)
        return false;
    if (opck_rms_rope_pairs(n) != 0 || n->x.ne[0] != K || K % 4 != 0)
        return false;
    const bool y2 = opck_rms_has_y2(n);
    const float *p;
    if (!mp_rows(&n->x, M, &out->x, &out->ldx) || !mp_rows(&n->y, M, &p, &out->ldy))
        return false;
    out->y = (float *)p;
    if (n->resid_mode == BERTH_RESID_ADD_AFTER && !mp_rows(&n->residual, M, &out->res, &out->ldr))
        return false;
    if (y2) {
        if (!mp_rows(&n->y2, M, &p, &out->ldy2))
            return false;
        out->y2 = (float *)p;
    }
    if (!mp_norm_weight(n->weight_mode, &n->w, &out->w, &out->wdt, &out->wmode, early) ||
        !mp_norm_weight(y2 ? n->y2_weight_mode : BERTH_NORM_W_NONE, &n->y2_w, &out->w2, &out->w2dt, &out->w2mode,
                        early))
        return false;
    out->eps = n->eps;
    out->oscale = opck_rms_out_scale(n);
    out->on = 1;
    return true;
}

static bool mp_overlap(const berth_tensor *a, const berth_tensor *b)
{
    return a && b && opck_views_overlap(a, b);
}

static bool mp_same(const berth_tensor *a, const berth_tensor *b)
{
    return a && b && opck_same_view(a, b);
}

/* A pair the kernel does not take: the caller runs the two products in turn, or with BERTH_CUDA_PAIR=2 (tests:
 * a case meant to fuse must) the op fails. */
static berth_status mp_decline(berth_backend *be)
{
    if (be->pair == 2)
        return cu_fail(be->host, BERTH_E_UNSUPPORTED,
                       "cuda: matmul: y_then: the pair kernel does not take this pair (BERTH_CUDA_PAIR=2)");
    return BERTH_OK;
}

berth_status cu_matmul_pair(berth_backend *be, berth_stream *s, const berth_matmul_params *p, bool *done)
{
    *done = false;
    const berth_matmul_params *q = opck_matmul_y_then(p);
    if (!be->pair || !q || !s || (be->skip & (CU_SKIP_SMALL | CU_SKIP_YNORM)))
        return BERTH_OK; /* switched off: never strict */
    const berth_rms_norm_params *pre = opck_matmul_x_pre(p), *post = opck_matmul_y_norm(q);
    const int64_t M = cu_nrows(&p->y), K1 = p->w.ne[0], N1 = p->w.ne[1], N2 = q->w.ne[1];
    if (M == 0 || N2 == 0) /* nothing for the kernel: the two products in turn (which do nothing) */
        return BERTH_OK;
    /* the shapes and kinds of this kernel: bf16 weights, no bias, a GLU MUL epilogue or none on the first product,
     * none on the second, no x_norm prologues (opck_matmul: q has none), f32 rows */
    if (M < 1 || M > MP_MAX_M || N1 % MP_CS != 0 || N2 % MP_CS != 0 || K1 % 8 != 0 || N1 % 8 != 0 ||
        p->w.dtype != BERTH_DTYPE_BF16 || q->w.dtype != BERTH_DTYPE_BF16 || p->bias.buf || q->bias.buf ||
        opck_matmul_norm_mode(p) != BERTH_NORM_W_NONE || opck_matmul_glu(q) != BERTH_GLU_NONE ||
        (opck_matmul_glu(p) != BERTH_GLU_NONE && opck_matmul_glu(p) != BERTH_GLU_MUL) ||
        (uintptr_t)cu_ptr(&p->w) % 16 != 0 || (uintptr_t)cu_ptr(&q->w) % 16 != 0)
        return mp_decline(be);
    mp_args a;
    memset(&a, 0, sizeof a);
    bool early = p->w.buf->usage == BERTH_USAGE_WEIGHTS && q->w.buf->usage == BERTH_USAGE_WEIGHTS;
    if (!mp_norm_plan(pre, M, K1, &a.pre, &early) || !mp_norm_plan(post, M, N2, &a.post, &early))
        return mp_decline(be);
    const float *c;
    if (!pre && !mp_rows(&p->x, M, &a.x, &a.ldx))
        return mp_decline(be);
    if (!mp_rows(&p->y, M, &c, &a.ldy1) || !mp_rows(&q->y, M, &c, &a.ldy2))
        return mp_decline(be);
    a.y1 = (float *)cu_ptr(&p->y);
    a.y2 = (float *)cu_ptr(&q->y);
    if (opck_matmul_glu(p) == BERTH_GLU_MUL) {
        if (!mp_rows(&p->y_glu_up, M, &a.up, &a.ldup))
            return mp_decline(be);
        a.act = p->y_glu_act;
    }
    /* y_norm's residual: x_pre's y (from sX, when sX holds it: no second output) or an input of its own */
    a.res_from_x = pre && post && post->resid_mode == BERTH_RESID_ADD_AFTER && !opck_rms_has_y2(pre) &&
                   mp_same(&post->residual, &pre->y);
    /* the memory rules of the file comment */
    const bool pre_res = pre && pre->resid_mode == BERTH_RESID_ADD_AFTER;
    const bool pre_y2 = pre && opck_rms_has_y2(pre), post_y2 = post && opck_rms_has_y2(post);
    const bool post_res = post && post->resid_mode == BERTH_RESID_ADD_AFTER;
    /* every input but y_norm's residual, the weights included (a caller may pass them in any buffer) */
    const berth_tensor *in_ab[9] = {pre ? &pre->x : &p->x,
                                    pre_res ? &pre->residual : NULL,
                                    opck_matmul_glu(p) == BERTH_GLU_MUL ? &p->y_glu_up : NULL,
                                    &p->w,
                                    &q->w,
                                    a.pre.w ? &pre->w : NULL,
                                    a.pre.w2 ? &pre->y2_w : NULL,
                                    a.post.w ? &post->w : NULL,
                                    a.post.w2 ? &post->y2_w : NULL};
    const berth_tensor *out_ab[3] = {pre ? &pre->y : NULL, pre_y2 ? &pre->y2 : NULL, &p->y};
    const berth_tensor *out_cd[3] = {&q->y, post ? &post->y : NULL, post_y2 ? &post->y2 : NULL};
    const berth_tensor *res_d = post_res && !a.res_from_x ? &post->residual : NULL;
    for (int i = 0; i < 3; i++) {
        for (int j = 0; j < 9; j++)
            if (mp_overlap(out_ab[i], in_ab[j]) ||
                (mp_overlap(out_cd[i], in_ab[j]) && !mp_same(out_cd[i], in_ab[j])))
                return mp_decline(be);
        for (int j = 0; j < 3; j++)
            if (mp_overlap(out_ab[i], out_cd[j]))
                return mp_decline(be);
        if (mp_overlap(out_ab[i], res_d))
            return mp_decline(be);
        if (mp_overlap(out_cd[i], res_d) && !(i == 1 && mp_same(out_cd[i], res_d)))
            return mp_decline(be);
        for (int j = i + 1; j < 3; j++)
            if (mp_overlap(out_ab[i], out_ab[j]) || mp_overlap(out_cd[i], out_cd[j]))
                return mp_decline(be);
    }
    /* shared memory: x (and x_pre's y) rows, the middle rows, this block's second-product columns, the factors */
    const mp_kernel k = mp_pick(M);
    const int64_t R = k.rows, n1b = N1 / MP_CS, n2b = N2 / MP_CS;
    /* the register budget: phase A's share of a row, phase B's chunks, phase C's columns and its middle chunk */
    if (K1 > 4 * MP_THREADS || n1b > MP_WARPS || K1 / 8 > 32 * MP_WB || n2b > MP_WARPS * MP_WC || N1 / 8 > 32)
        return mp_decline(be);
    int64_t off = 0;
    a.o_x = (uint32_t)off;
    off += R * K1 * 4;
    a.o_y = (uint32_t)off;
    off += pre && opck_rms_has_y2(pre) ? R * K1 * 4 : 0;
    a.o_g = (uint32_t)off;
    off += R * N1 * 4;
    a.o_a = (uint32_t)off;
    off += (R * n2b * 4 + 15) / 16 * 16;
    a.o_p = (uint32_t)off;
    off += (R * n2b * 4 + 15) / 16 * 16;
    a.o_pw = (uint32_t)off;
    off += K1 * 4;
    a.o_pw2 = (uint32_t)off;
    off += K1 * 4;
    a.o_qw = (uint32_t)off;
    off += (n2b * 4 + 15) / 16 * 16;
    a.o_qw2 = (uint32_t)off;
    off += (n2b * 4 + 15) / 16 * 16;
    a.o_part = (uint32_t)off;
    off += 2 * MP_CS * R * 4;
    if (!mp_setup(be, s->cs, k, (size_t)off))
        return mp_decline(be);
    a.w1 = (const uint16_t *)cu_ptr(&p->w);
    a.w2 = (const uint16_t *)cu_ptr(&q->w);
    a.M = (int32_t)M;
    a.K1 = (int32_t)K1;
    a.N1 = (int32_t)N1;
    a.N2 = (int32_t)N2;
    a.early = early;
    const unsigned clusters = (unsigned)((M + R - 1) / R);
    const cudaError_t e = cu_launch_cluster(be, s->cs, dim3(clusters * MP_CS), dim3(MP_THREADS), (size_t)off,
                                            dim3(MP_CS, 1, 1), k.fn, a);
    const berth_status st = cu_check(be, e, "matmul pair kernel");
    *done = st == BERTH_OK;
    return st;
}

/*
 * kv_append.cu — kv_append: write the K and V of T new tokens into the paged cache, optionally RMS-normalising
 * K (then rotating it) and V per head first, all in fp32, then storing in the cache dtype (f32, bf16 or f16,
 * round to nearest even). Same formulas and order as the CPU backend (plugins/backend-cpu/kv.c).
 *
 * Two blocks per (token, KV head), one for K and one for V, and with the query side (ABI 0.5) one per (token,
 * query head) that normalises and rotates it in place as rms_norm with RoPE would, 128 threads each: each thread
 * keeps up to CU_MAX_HEAD_DIM / 128 elements of the head vector in registers; the RMS sum is a block reduction;
 * RoPE pairs cross threads, so the normalised K goes through shared memory once before the rotation. At decode
 * this is a chain of dependent steps, so it is latency: K and V in blocks of their own run their chains side by
 * side (one block doing K then V took ~5 us of a decode step's critical path on the H200, session 9's kernel
 * timeline), and
 * the norm weights (no kernel writes a BERTH_USAGE_WEIGHTS buffer) are loaded before waiting for the previous
 * kernel (cu_launch, cuda_launch.cuh: programmatic dependent launch).
 *
 * Slots are data on the device, so the host cannot validate them without a synchronisation: a negative slot
 * skips its token (the contract), and a slot beyond the pool (n_blocks * block_size) also skips it, so a bad
 * slot can never make the kernel write outside the pool. (The CPU backend reports the latter as
 * BERTH_E_INVALID; here it is silently dropped.)
 */
#include "cuda_device.cuh"
#include "cuda_internal.h"
#include "cuda_launch.cuh"

#include <inttypes.h>

#define KVA_THREADS 128
#define KVA_EPT (CU_MAX_HEAD_DIM / KVA_THREADS) /* elements per thread */

/* Everything the kernel reads, flattened from the params (device addresses, byte strides). */
struct kva_args {
    const char *k, *v;          /* element (0, 0, 0) of the inputs */
    int64_t k_nb1, k_nb2, v_nb1, v_nb2;
    int32_t k_dt, v_dt;
    const int32_t *slots;       /* ne {T}, contiguous */
    const int32_t *positions;   /* ne {T} (RoPE only) */
    const float *freqs;         /* ne {n_pairs} (RoPE only) */
    const char *k_w, *v_w;      /* norm weights (W / W_ONE_PLUS modes only) */
    int32_t k_w_dt, v_w_dt;
    int32_t w_early;            /* the norm weights may be read before cu_pdl_wait (weights buffers) */
    int32_t f_early;            /* the RoPE frequencies may too (a weights buffer) */
    int32_t meta_early;         /* slots and positions may too (be->att_prewait: the host writes them by copies) */
    int32_t k_mode, v_mode;
    float eps;
    int32_t rope_mode, rope_off, n_pairs;
    float *q;                   /* the query side (ABI 0.5; NULL: none): element (0, 0, 0), normalised and rotated in
                                 * place */
    int64_t q_nb1, q_nb2;
    const char *q_w;            /* its norm weight (W / W_ONE_PLUS) */
    int32_t q_w_dt, q_mode, q_heads;
    char *k_dst, *v_dst;        /* pool base + view offset */
    uint64_t block_stride, token_stride, head_stride, v_token_stride, v_head_stride;
    int32_t dt, block_size, n_blocks, D, DV;
};

/* In place over the thread's elements x[e] = element tid + e * KVA_THREADS (< n): the norm of `mode`
 * (never called for W_NONE); w[e]: the thread's weights (W / W_ONE_PLUS). Formula and order as
 * cpu_rms_norm_row: x * inv (* w or * (1 + w)). */
__device__ __forceinline__ void kva_norm(float *x, int n, int mode, float eps, const float *w, float *red)
{
    float ss = 0.0f;
#pragma unroll
    for (int e = 0; e < KVA_EPT; e++) {
        const int i = threadIdx.x + e * KVA_THREADS;
        if (i < n)
            ss += x[e] * x[e];
    }
    ss = cu_block_sum(ss, red);
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
#pragma unroll
    for (int e = 0; e < KVA_EPT; e++) {
        const int i = threadIdx.x + e * KVA_THREADS;
        if (i >= n)
            continue;
        if (mode == BERTH_NORM_W)
            x[e] = x[e] * inv * w[e];
        else if (mode == BERTH_NORM_W_ONE_PLUS)
            x[e] = x[e] * inv * (1.0f + w[e]);
        else
            x[e] = x[e] * inv;
    }
}

/* The thread's elements of a norm weight of n elements (only read in the weighted modes). */
__device__ __forceinline__ void kva_ld_weights(float *w, int n, int mode, const char *src, int dt)
{
    const bool weighted = mode == BERTH_NORM_W || mode == BERTH_NORM_W_ONE_PLUS;
#pragma unroll
    for (int e = 0; e < KVA_EPT; e++) {
        const int i = threadIdx.x + e * KVA_THREADS;
        w[e] = weighted && i < n ? cu_ld(src, dt, i) : 0.0f;
    }
}

/* The RoPE pair of element i of a head of n elements (berth/backend.h, ROPE): pair index j (-1: i is in no pair),
 * its partner and whether i is the pair's first element. */
__device__ __forceinline__ int kva_pair(const kva_args &a, int i, int n, int *partner, bool *first)
{
    int j = -1, pt = -1;
    bool f = false;
    if (a.rope_mode == BERTH_ROPE_HALF) {
        if (i < a.n_pairs) {
            j = i, pt = i + a.rope_off, f = true;
        } else if (i >= a.rope_off && i - a.rope_off < a.n_pairs) {
            j = i - a.rope_off, pt = j, f = false;
        }
    } else if (i < 2 * a.n_pairs) {
        j = i >> 1;
        f = (i & 1) == 0;
        pt = f ? i + 1 : i - 1;
    }
    if (j < 0 || pt < 0 || pt >= n) /* not in a pair (or a layout the checks reject) */
        return -1;
    *partner = pt;
    *first = f;
    return j;
}

/* The thread's frequencies (0 past the pairs): loaded apart from the position so that they can be read before
 * the PDL wait. */
__device__ __forceinline__ void kva_ld_freqs(const kva_args &a, int n, float *fr)
{
#pragma unroll
    for (int e = 0; e < KVA_EPT; e++) {
        const int i = threadIdx.x + e * KVA_THREADS;
        int partner;
        bool first;
        const int j = i < n ? kva_pair(a, i, n, &partner, &first) : -1;
        fr[e] = j >= 0 ? a.freqs[j] : 0.0f;
    }
}

/* Rotate the thread's elements of a head of n elements with their precomputed sin / cos (sincosf of pos * freq,
 * computed while the norm runs). The products are rounded separately (no FMA contraction) so the result matches
 * the CPU's x0 * cos - x1 * sin to the bit for equal sin/cos. buf: CU_MAX_HEAD_DIM floats of shared memory.
 * Contains __syncthreads: call from all threads. */
__device__ __forceinline__ void kva_rope(float *x, int n, const kva_args &a, const float *sn, const float *cs,
                                         float *buf)
{
#pragma unroll
    for (int e = 0; e < KVA_EPT; e++) {
        const int i = threadIdx.x + e * KVA_THREADS;
        if (i < n)
            buf[i] = x[e];
    }
    __syncthreads();
#pragma unroll
    for (int e = 0; e < KVA_EPT; e++) {
        const int i = threadIdx.x + e * KVA_THREADS;
        if (i >= n)
            continue;
        int partner;
        bool first;
        if (kva_pair(a, i, n, &partner, &first) < 0)
            continue;
        const float xi = buf[i], xp = buf[partner];
        x[e] = first ? __fsub_rn(__fmul_rn(xi, cs[e]), __fmul_rn(xp, sn[e]))
                     : __fadd_rn(__fmul_rn(xi, cs[e]), __fmul_rn(xp, sn[e]));
    }
}

/* SDT (K and V), DT (the cache), WDT (the norm weights): dtypes fixed at compile time, or -1: read from the
 * arguments (the general instance) */
template <int SDT, int DT, int WDT>
__global__ void __launch_bounds__(KVA_THREADS) kv_append_kernel(const kva_args a)
{
    __shared__ float buf[CU_MAX_HEAD_DIM];
    __shared__ float red[32];
    cu_pdl_trigger();
    const int64_t t = blockIdx.x;
    /* K and V of a head are two blocks (z = 0, 1): two short chains instead of one long; query heads (z >= 2)
     * one block each, (z - 2) * gridDim.y + y */
    const bool isv = blockIdx.z == 1, isq = blockIdx.z >= 2;
    const int h = isq ? (int)((blockIdx.z - 2) * gridDim.y + blockIdx.y) : (int)blockIdx.y;
    if (isq && h >= a.q_heads) {
        cu_pdl_wait(); /* every thread waits before it exits (cuda_launch.cuh) */
        return;
    }
    const int n = isv ? a.DV : a.D, mode = isv ? a.v_mode : isq ? a.q_mode : a.k_mode;
    const bool rope = !isv && a.n_pairs > 0;
    const char *wsrc = isv ? a.v_w : isq ? a.q_w : a.k_w;
    const int wdt = WDT >= 0 ? WDT : isv ? a.v_w_dt : isq ? a.q_w_dt : a.k_w_dt;
    float w[KVA_EPT], fr[KVA_EPT];
    if (a.w_early)
        kva_ld_weights(w, n, mode, wsrc, wdt);
    if (rope && a.f_early)
        kva_ld_freqs(a, a.D, fr);
    /* the slot and the position: metadata, before the wait under the decode attention's host assumption
     * (meta_early; attention_decode.cu, "Reads before the PDL wait"), so the rotation's sin / cos are ready then */
    int32_t slot = 0;
    float pos = 0.0f;
    float sn[KVA_EPT], cs[KVA_EPT];
    auto ld_meta = [&]() {
        slot = a.slots[t];
        pos = rope ? (float)a.positions[t] : 0.0f;
        if (rope) {
#pragma unroll
            for (int e = 0; e < KVA_EPT; e++)
                cu_sincos(__fmul_rn(pos, fr[e]), &sn[e], &cs[e]);
        }
    };
    const bool meta_pre = a.meta_early && (!rope || a.f_early); /* the frequencies are needed for sin / cos */
    if (meta_pre)
        ld_meta();
    cu_pdl_wait();
    if (!a.w_early)
        kva_ld_weights(w, n, mode, wsrc, wdt);
    if (rope && !a.f_early)
        kva_ld_freqs(a, a.D, fr);

    /* One round trip: the vector (and the slot and the position, when not read yet: all in flight at once; the
     * vector does not depend on the slot) */
    float x[KVA_EPT];
    const char *src = isv ? a.v + t * a.v_nb2 + h * a.v_nb1
                    : isq ? (const char *)a.q + t * a.q_nb2 + h * a.q_nb1 : a.k + t * a.k_nb2 + h * a.k_nb1;
    const int sdt = isq ? (int)BERTH_DTYPE_F32 : SDT >= 0 ? SDT : isv ? a.v_dt : a.k_dt;
#pragma unroll
    for (int e = 0; e < KVA_EPT; e++) {
        const int i = threadIdx.x + e * KVA_THREADS;
        x[e] = i < n ? cu_ld(src, sdt, i) : 0.0f;
    }
    if (!meta_pre)
        ld_meta(); /* sin / cos: independent of K, so computed before the norm's reduction */
    if (isq) { /* the query head: as rms_norm with RoPE, in place, whatever the slot */
        if (mode != BERTH_NORM_W_NONE)
            kva_norm(x, n, mode, a.eps, w, red);
        if (rope)
            kva_rope(x, a.D, a, sn, cs, buf);
        float *qd = (float *)((char *)a.q + t * a.q_nb2 + h * a.q_nb1);
#pragma unroll
        for (int e = 0; e < KVA_EPT; e++) {
            const int i = threadIdx.x + e * KVA_THREADS;
            if (i < n)
                qd[i] = x[e];
        }
        return;
    }
    if (slot < 0 || (int64_t)slot >= (int64_t)a.n_blocks * a.block_size)
        return; /* the whole block leaves together: no barrier is skipped by part of it */
    const uint64_t blk = (uint64_t)(slot / a.block_size), off = (uint64_t)(slot % a.block_size);

    /* K: norm, RoPE, store; V: norm, store (never rotated) */
    if (mode != BERTH_NORM_W_NONE)
        kva_norm(x, n, mode, a.eps, w, red);
    if (rope)
        kva_rope(x, a.D, a, sn, cs, buf);
    char *d = isv ? a.v_dst + blk * a.block_stride + off * a.v_token_stride + (uint64_t)h * a.v_head_stride
                  : a.k_dst + blk * a.block_stride + off * a.token_stride + (uint64_t)h * a.head_stride;
#pragma unroll
    for (int e = 0; e < KVA_EPT; e++) {
        const int i = threadIdx.x + e * KVA_THREADS;
        if (i < n)
            cu_st(d, DT >= 0 ? DT : a.dt, i, x[e]);
    }
}

bool cu_check_kv_append(const berth_backend *be, struct opck *c, const berth_kv_append_params *p)
{
    (void)be;
    if (!opck_kv_append(c, p))
        return false;
    /* The kernel keeps a head vector in registers (CU_MAX_HEAD_DIM). be->ck.attn_max_head_dim normally makes
     * opck reject larger heads first; this guard only speaks if it did not. */
    const berth_kv_view *kv = &p->kv;
    if (kv->head_dim > CU_MAX_HEAD_DIM || kv->head_dim_v > CU_MAX_HEAD_DIM)
        return opck_fail(c, BERTH_E_UNSUPPORTED,
                         "kv_append: head_dim %d / head_dim_v %d exceeds this backend's limit of %d", kv->head_dim,
                         kv->head_dim_v, CU_MAX_HEAD_DIM);
    if (kv->n_kv_heads > 65535)
        return opck_fail(c, BERTH_E_UNSUPPORTED, "kv_append: n_kv_heads %d is more than this backend's 65535",
                         kv->n_kv_heads);
    if (opck_kv_append_has_q(c, p) &&
        (p->q.ne[1] > INT32_MAX || (p->q.ne[1] + kv->n_kv_heads - 1) / kv->n_kv_heads > 65533))
        return opck_fail(c, BERTH_E_UNSUPPORTED, "kv_append: %" PRId64 " query heads over %d KV heads is more than "
                         "this backend's grid allows", p->q.ne[1], kv->n_kv_heads);
    if (p->k.ne[2] > INT32_MAX)
        return opck_fail(c, BERTH_E_UNSUPPORTED, "kv_append: %" PRId64 " tokens is more than this backend's %d",
                         p->k.ne[2], INT32_MAX);
    return true;
}

berth_status cu_op_kv_append(berth_backend *be, berth_stream *s, const berth_kv_append_params *p)
{
    CU_OP_BEGIN(be, kv_append, p);
    const berth_kv_view *kv = &p->kv;
    const int64_t T = p->k.ne[2];
    if (T == 0 || kv->n_kv_heads == 0 || (be->skip & CU_SKIP_KV))
        return BERTH_OK;
    const bool kw = opck_norm_has_weight(p->k_norm_mode), vw = opck_norm_has_weight(p->v_norm_mode);
    const bool rope = p->rope_n_pairs > 0;
    const bool hq = opck_kv_append_runs_q(p), qw = hq && opck_norm_has_weight(p->q_norm_mode);
    kva_args a = {};
    if (hq) {
        a.q = (float *)cu_ptr(&p->q);
        a.q_nb1 = p->q.nb[1];
        a.q_nb2 = p->q.nb[2];
        a.q_w = qw ? cu_ptr(&p->q_norm) : nullptr;
        a.q_w_dt = qw ? p->q_norm.dtype : BERTH_DTYPE_F32;
        a.q_mode = p->q_norm_mode;
        a.q_heads = (int32_t)p->q.ne[1];
    }
    a.k = cu_ptr(&p->k);
    a.v = cu_ptr(&p->v);
    a.k_nb1 = p->k.nb[1];
    a.k_nb2 = p->k.nb[2];
    a.v_nb1 = p->v.nb[1];
    a.v_nb2 = p->v.nb[2];
    a.k_dt = p->k.dtype;
    a.v_dt = p->v.dtype;
    a.slots = (const int32_t *)cu_ptr(&p->slots);
    a.positions = rope ? (const int32_t *)cu_ptr(&p->positions) : nullptr;
    a.freqs = rope ? (const float *)cu_ptr(&p->rope_freqs) : nullptr;
    a.k_w = kw ? cu_ptr(&p->k_norm) : nullptr;
    a.v_w = vw ? cu_ptr(&p->v_norm) : nullptr;
    a.k_w_dt = kw ? p->k_norm.dtype : BERTH_DTYPE_F32;
    a.v_w_dt = vw ? p->v_norm.dtype : BERTH_DTYPE_F32;
    a.f_early = rope && p->rope_freqs.buf->usage == BERTH_USAGE_WEIGHTS;
    a.w_early = (!kw || p->k_norm.buf->usage == BERTH_USAGE_WEIGHTS) &&
                (!vw || p->v_norm.buf->usage == BERTH_USAGE_WEIGHTS) &&
                (!qw || p->q_norm.buf->usage == BERTH_USAGE_WEIGHTS);
    a.meta_early = be->att_prewait;
    a.k_mode = p->k_norm_mode;
    a.v_mode = p->v_norm_mode;
    a.eps = p->eps;
    a.rope_mode = p->rope_mode;
    a.rope_off = p->rope_pair_offset;
    a.n_pairs = rope ? p->rope_n_pairs : 0;
    a.k_dst = (char *)kv->k_buf->ptr + kv->k_offset;
    a.v_dst = (char *)kv->v_buf->ptr + kv->v_offset;
    a.block_stride = kv->block_stride;
    a.token_stride = kv->token_stride;
    a.head_stride = kv->head_stride;
    a.v_token_stride = kv->v_token_stride;
    a.v_head_stride = kv->v_head_stride;
    a.dt = kv->dtype;
    a.block_size = kv->block_size;
    a.n_blocks = kv->n_blocks;
    a.D = kv->head_dim;
    a.DV = kv->head_dim_v;
    /* z: K, V, then the query heads in groups of n_kv_heads */
    const int64_t qz = hq ? (p->q.ne[1] + kv->n_kv_heads - 1) / kv->n_kv_heads : 0;
    const dim3 grid((unsigned)T, (unsigned)kv->n_kv_heads, (unsigned)(2 + qz));
    /* Gemma's bf16 decode (fp32 K / V / Q, bf16 cache, bf16 norm weights) on an instance with the dtypes fixed:
     * ~28 KB of machine code against the general one's ~31 (code a kernel carries costs at every launch) */
    const bool lean = be->kv_lean && a.k_dt == BERTH_DTYPE_F32 && a.v_dt == BERTH_DTYPE_F32 &&
                      a.dt == BERTH_DTYPE_BF16 && (!kw || a.k_w_dt == BERTH_DTYPE_BF16) &&
                      (!vw || a.v_w_dt == BERTH_DTYPE_BF16) && (!qw || a.q_w_dt == BERTH_DTYPE_BF16);
    const cudaError_t e =
        lean ? cu_launch(be, s->cs, grid, dim3(KVA_THREADS), 0,
                         kv_append_kernel<BERTH_DTYPE_F32, BERTH_DTYPE_BF16, BERTH_DTYPE_BF16>, a)
             : cu_launch(be, s->cs, grid, dim3(KVA_THREADS), 0, kv_append_kernel<-1, -1, -1>, a);
    return cu_check(be, e, "kv_append_kernel");
}

/*
 * matmul.c — y[m, n] = sum_k x[m, k] w[n, k] (+ bias[n]) (+ y[m, n]), fp32 accumulation, f32/bf16/f16 weights.
 *
 * Why it is built this way:
 *  - Decode (M = 1) reads every weight once and does 2 flops per weight: it is bound by memory bandwidth, so
 *    the only goals are to stream W at full speed and keep the conversion cheap. Each thread owns a disjoint,
 *    contiguous slice of output features (rows of W), so the threads stream disjoint memory and never share
 *    an output cache line except at slice ends. bf16 weights are widened in registers (a shift and a mask per
 *    two vectors: see matmul_kernel.inc) — a weight matrix is never converted up front, which would double
 *    the bytes read and cost memory proportional to the model.
 *  - Prefill (M > 1) is compute bound: a register tile of MR x rows by NR w rows loads each widened W vector
 *    once for MR rows of x and each x vector once for NR rows of W. W tiles are the outer loop so a tile stays
 *    in L1 while all x rows pass over it; x is blocked (MB rows x KB columns, ~256 KiB) so the x block a thread
 *    sweeps stays in L2.
 *  - One kernel source (matmul_kernel.inc, GCC vector extensions) is compiled per ISA: AVX-512 (16-float
 *    vectors, 32 registers: 5x4 tile), AVX2+FMA (8-float, 16 registers: 2x4), and the build's baseline. The
 *    choice is made at run time with __builtin_cpu_supports, so one .so is fast on new CPUs and correct on
 *    any x86-64. Per-ISA objects (rather than target_clones) let the tile shape follow the register count.
 *  - x is packed once per call into scratch (rows contiguous; for bf16, and f16 without F16C, de-interleaved to
 *    match the in-register widening); that is M*K floats, negligible next to N*K weights. The RMS-norm prologue
 *    (x_norm_mode) normalises each row with rms_norm's own row routine just before packing it, so a fused
 *    norm + matmul gives bit-for-bit the result of the two ops.
 *  - The gated epilogue (y_glu) keeps each thread on its own output columns: it computes the gate (and, for
 *    HALVES, the matching up) columns of a block of rows into its private scratch and applies the glu op's
 *    activation routine there, so no second pass over memory and no barrier between threads.
 */
#include <inttypes.h>
#include <string.h>

#include "convert.h"
#include "cpu_backend.h"
#include "matmul_kernels.h"

#define MM_X_BLOCK_BYTES (256 * 1024) /* x block (MB rows x KB floats) kept in L2 while W tiles pass over it */
#define MM_MB 64                      /* x rows per block */
#define MM_MIN_MACS_PER_THREAD 32768.0 /* below this a thread costs more to wake than it saves */

static bool cpu_has_avx512(void)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma");
#else
    return false;
#endif
}

static bool cpu_has_avx2(void)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") &&
           __builtin_cpu_supports("bmi2");
#else
    return false;
#endif
}

const struct mm_kernels *mm_kernels_select(void)
{
#if defined(__x86_64__)
    if (cpu_has_avx512())
        return &mm_kernels_avx512;
    if (cpu_has_avx2())
        return &mm_kernels_avx2;
#endif
    return &mm_kernels_generic;
}

const struct mm_kernels *mm_kernels_by_name(const char *isa)
{
    if (strcmp(isa, "generic") == 0)
        return &mm_kernels_generic;
#if defined(__x86_64__)
    if (strcmp(isa, "avx2") == 0 && cpu_has_avx2())
        return &mm_kernels_avx2;
    if (strcmp(isa, "avx512") == 0 && cpu_has_avx512())
        return &mm_kernels_avx512;
#endif
    return NULL;
}

struct mm_ctx {
    const struct mm_kernels *k;
    struct mm_job job;
    int64_t M, N, K;     /* N: columns of y (for the HALVES epilogue, half the rows of w) */
    int64_t kb;          /* K block */
    int accumulate;
    const void *bias;    /* NULL when absent */
    berth_dtype bias_dt;
    /* the gated epilogue (y_glu != NONE): z goes to per-thread scratch, then y = f(gate) * up */
    const berth_backend *be;
    const berth_matmul_params *p;
    int32_t glu, act;
};

static void mm_task(void *arg, int tid, int nth)
{
    const struct mm_ctx *c = arg;
    int64_t n0, n1;
    cpu_split(c->N, c->k->nr, tid, nth, &n0, &n1);
    if (n0 >= n1)
        return;
    /* y = (accumulate ? y : 0) + bias over this thread's slice, then the kernels add partial products */
    for (int64_t m = 0; m < c->M; m++) {
        float *y = c->job.y[m];
        for (int64_t n = n0; n < n1; n++) {
            const float b = c->bias ? cpu_load(c->bias, c->bias_dt, n) : 0.0f;
            y[n] = (c->accumulate ? y[n] : 0.0f) + b;
        }
    }
    for (int64_t m0 = 0; m0 < c->M; m0 += MM_MB) {
        const int64_t m1 = m0 + MM_MB < c->M ? m0 + MM_MB : c->M;
        for (int64_t k0 = 0; k0 < c->K; k0 += c->kb) {
            const int64_t k1 = c->K - k0 > c->kb ? k0 + c->kb : c->K;
            c->k->run(&c->job, m0, m1, n0, n1, k0, k1);
        }
    }
}

/* The gated epilogue: this thread's columns [n0, n1) of y, a block of MM_MB rows at a time. The products the
 * epilogue reads (gate columns n0..n1 and, for HALVES, up columns N+n0..N+n1) go to the thread's own scratch, so
 * no thread waits for another's columns. Each element's sum runs over the same K blocks in the same order as in
 * the plain product (the kernels' per-element arithmetic does not depend on the tile it sits in), and the
 * activation is the glu op's cpu_act_row: the result equals matmul followed by glu bit for bit. */
static void mm_glu_task(void *arg, int tid, int nth)
{
    const struct mm_ctx *c = arg;
    const berth_matmul_params *p = c->p;
    int64_t n0, n1;
    cpu_split(c->N, c->k->nr, tid, nth, &n0, &n1);
    if (n0 >= n1)
        return;
    const int64_t wn = n1 - n0, rows = c->M < MM_MB ? c->M : MM_MB;
    const int halves = c->glu == BERTH_GLU_HALVES;
    float **zrow = cpu_thread_scratch(c->be, tid); /* rows pointers for gate, then up (HALVES) */
    float *z = (float *)(zrow + 2 * MM_MB);
    /* [0]: gate columns n0.. of w; [1]: up columns N+n0.. (HALVES) */
    struct mm_job jobs[2] = {c->job, c->job};
    for (int h = 0; h <= halves; h++) {
        jobs[h].w = c->job.w + (h * c->N + n0) * c->job.ldw;
        jobs[h].y = zrow + h * MM_MB;
        for (int64_t r = 0; r < rows; r++)
            zrow[h * MM_MB + r] = z + (h * rows + r) * wn;
    }
    for (int64_t m0 = 0; m0 < c->M; m0 += MM_MB) {
        const int64_t m1 = m0 + MM_MB < c->M ? m0 + MM_MB : c->M;
        for (int h = 0; h <= halves; h++) {
            jobs[h].xp = c->job.xp + m0 * c->job.ldx;
            for (int64_t r = 0; r < m1 - m0; r++)
                for (int64_t n = 0; n < wn; n++)
                    zrow[h * MM_MB + r][n] = c->bias ? cpu_load(c->bias, c->bias_dt, h * c->N + n0 + n) : 0.0f;
            for (int64_t k0 = 0; k0 < c->K; k0 += c->kb) {
                const int64_t k1 = c->K - k0 > c->kb ? k0 + c->kb : c->K;
                c->k->run(&jobs[h], 0, m1 - m0, 0, wn, k0, k1);
            }
        }
        for (int64_t m = m0; m < m1; m++) {
            const float *up = halves ? zrow[MM_MB + m - m0] : (const float *)cpu_row(&p->y_glu_up, m) + n0;
            cpu_act_row(c->act, 1.0f, 1.0f, zrow[m - m0], up, (float *)cpu_row(&p->y, m) + n0, wn);
        }
    }
}

/* K block: the whole row when a handful of x rows are in flight (decode: one pass over each W row keeps the
 * prefetchers streaming), else about MM_X_BLOCK_BYTES of x per block, a multiple of 2*vl. */
static int64_t pick_kb(const struct mm_kernels *k, int64_t M, int64_t K)
{
    if (M <= k->mr)
        return K;
    const int64_t rows = M < MM_MB ? M : MM_MB;
    const int64_t step = 2 * k->vl;
    int64_t kb = MM_X_BLOCK_BYTES / (rows * (int64_t)sizeof(float)) / step * step;
    if (kb < 8 * step)
        kb = 8 * step;
    return kb + kb / 2 >= K ? K : kb; /* no block shorter than half a block at the end */
}

berth_status cpu_op_matmul(berth_backend *be, berth_stream *s, const berth_matmul_params *p)
{
    /* the norm before the product (x_pre) is the rms_norm op, then the product on its y2 (else y): bit for bit the
     * two-op sequence. The whole op is checked first, so that a bad product leaves the norm's outputs unwritten. */
    const berth_rms_norm_params *pre = p ? opck_matmul_x_pre(p) : NULL;
    if (pre) {
        struct opck ck = {.exec = 1, .be = &be->ck};
        if (!opck_matmul(&ck, p))
            return cpu_report(be, &ck);
        const berth_status nst = cpu_op_rms_norm(be, s, pre);
        if (nst != BERTH_OK)
            return nst;
    }
    CPU_OP_BEGIN(be, matmul, p);
    const struct mm_kernels *k = be->mmk;
    const int32_t glu = opck_matmul_glu(p);
    const int64_t M = cpu_nrows(&p->x), WN = p->w.ne[1], K = p->w.ne[0];
    const int64_t N = glu == BERTH_GLU_HALVES ? WN / 2 : WN;
    berth_status st = BERTH_OK;
    if (M == 0 || N == 0)
        goto out;
    const int64_t step = 2 * k->vl;
    const int64_t ldx = (K + step - 1) / step * step; /* keeps every packed row 64-byte aligned for vl >= 8 */
    const size_t ptr_bytes = ((size_t)M * sizeof(float *) + 63) / 64 * 64;
    const int32_t norm = opck_matmul_norm_mode(p);
    const size_t xp_floats = (size_t)(M + (norm != BERTH_NORM_W_NONE)) * (size_t)ldx; /* + one norm row */
    void *scratch;
    st = cpu_scratch_shared(be, ptr_bytes + xp_floats * sizeof(float), &scratch);
    if (st != BERTH_OK)
        goto out;
    float **yrows = scratch;
    float *xp = (float *)((char *)scratch + ptr_bytes);
    float *nrow = xp + M * ldx; /* prologue: the normalised row, then packed like any x row */
    const void *nw = opck_norm_has_weight(norm) ? cpu_data(&p->x_norm_w) : NULL;
    for (int64_t m = 0; m < M; m++) {
        const float *xr = (const float *)cpu_row(&p->x, m);
        if (norm != BERTH_NORM_W_NONE) {
            memcpy(nrow, xr, (size_t)K * sizeof(float));
            cpu_rms_norm_row(nrow, K, p->x_norm_eps, norm, nw, p->x_norm_w.dtype);
            xr = nrow;
        }
        k->pack_row(xr, K, p->w.dtype, xp + m * ldx);
        yrows[m] = (float *)cpu_row(&p->y, m);
    }
    struct mm_ctx c = {
        .k = k,
        .job = {.xp = xp, .ldx = ldx, .w = cpu_data(&p->w), .ldw = p->w.nb[1], .wdt = p->w.dtype, .y = yrows,
                .K = K},
        .M = M, .N = N, .K = K,
        .kb = pick_kb(k, M, K),
        .accumulate = p->accumulate,
        .bias = p->bias.buf ? cpu_data(&p->bias) : NULL,
        .bias_dt = p->bias.dtype,
        .be = be,
        .p = p,
        .glu = glu,
        .act = glu != BERTH_GLU_NONE ? p->y_glu_act : BERTH_ACT_IDENTITY,
    };
    const int64_t units = (N + k->nr - 1) / k->nr;
    int nth = cpu_threads_for(be, (double)M * (double)WN * (double)K, MM_MIN_MACS_PER_THREAD);
    if (nth > units)
        nth = (int)units;
    if (glu == BERTH_GLU_NONE) {
        cpu_pool_run(be->pool, nth, mm_task, &c);
        goto out;
    }
    /* per thread: 2 * MM_MB row pointers, then up to MM_MB rows of its widest slice (twice for HALVES) */
    const int64_t wn_max = (units + nth - 1) / nth * k->nr, rows = M < MM_MB ? M : MM_MB;
    const size_t zbytes = 2 * MM_MB * sizeof(float *) +
                          (size_t)((glu == BERTH_GLU_HALVES ? 2 : 1) * rows * wn_max) * sizeof(float);
    if ((st = cpu_scratch_threads(be, zbytes)) == BERTH_OK)
        cpu_pool_run(be->pool, nth, mm_glu_task, &c);
out:
    CPU_OP_END(be);
    /* the trailing norm (y_norm) is the rms_norm op on the finished y: bit for bit the two-op sequence */
    if (st == BERTH_OK && opck_matmul_y_norm(p))
        st = cpu_op_rms_norm(be, s, opck_matmul_y_norm(p));
    /* the second product of a pair (y_then) is the matmul op on the finished y (checked with this one above) */
    if (st == BERTH_OK && opck_matmul_y_then(p))
        st = cpu_op_matmul(be, s, opck_matmul_y_then(p));
    return st;
}

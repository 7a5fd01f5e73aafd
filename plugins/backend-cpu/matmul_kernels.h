/*
 * matmul_kernels.h — the per-ISA matmul micro-kernels (matmul_kernel.inc compiled once per ISA by
 * matmul_avx512.c, matmul_avx2.c and matmul_generic.c) and the runtime choice between them.
 */
#ifndef CPU_MATMUL_KERNELS_H
#define CPU_MATMUL_KERNELS_H

#include <berth/plugin.h>
#include <stdint.h>

/* One matmul as the kernels see it. */
struct mm_job {
    const float *xp;  /* packed activations: M rows of ldx floats (pack_row layout) */
    int64_t ldx;
    const char *w;    /* weight row n starts at w + n * ldw bytes; K elements of wdt */
    int64_t ldw;
    berth_dtype wdt;
    float *const *y;  /* M output row pointers; the kernels add their dot products into y[m][n] */
    int64_t K;
};

struct mm_kernels {
    const char *isa; /* "avx512", "avx2", "generic" */
    int vl;          /* floats per vector; x is packed in blocks of 2*vl */
    int mr, nr;      /* register tile: rows of x by rows of w */
    /* Pack one activation row of K floats for weights of dtype wdt into dst (ldx floats). */
    void (*pack_row)(const float *x, int64_t K, berth_dtype wdt, float *dst);
    /* y[m][n] += sum_{k0 <= k < k1} x[m][k] * w[n][k] for m in [m0, m1), n in [n0, n1). k0 is a multiple of
     * 2*vl; k1 is too unless it is K. */
    void (*run)(const struct mm_job *j, int64_t m0, int64_t m1, int64_t n0, int64_t n1, int64_t k0, int64_t k1);
};

extern const struct mm_kernels mm_kernels_generic;
#if defined(__x86_64__)
extern const struct mm_kernels mm_kernels_avx2;
extern const struct mm_kernels mm_kernels_avx512;
#endif

/* The best kernels this CPU can run (pure; cheap). */
const struct mm_kernels *mm_kernels_select(void);
/* Kernels by ISA name ("avx512", "avx2", "generic"), or NULL when unknown or this CPU cannot run them. */
const struct mm_kernels *mm_kernels_by_name(const char *isa);

#endif

/*
 * gemv.cuh — the M = 1 streaming GEMV of gemv.cu, as matmul.cu's mm_gemv calls it (the kernel and its reasons
 * are in gemv.cu).
 */
#ifndef BERTH_CUDA_GEMV_CUH
#define BERTH_CUDA_GEMV_CUH

#include "cuda_internal.h"
#include "gemv_norm.cuh"
#include "gemv_xpre.cuh"

/* One product y = x w^T (+ bias) (+ y | the gated epilogue) for a single row x. The caller has checked the
 * layout this kernel needs: w and ldw 16-byte aligned, each row of w a whole number of 16-byte chunks, x 16-byte
 * aligned. */
struct cu_gemv1_args {
    const float *x;        /* K floats */
    float *y;              /* N outputs */
    const float *u;        /* BERTH_GLU_MUL: the up row (N floats; may be y), else unused */
    const char *w;         /* rows ldw bytes apart; HALVES: the gate rows, then the up rows at N */
    int64_t ldw;
    const void *bias;      /* NULL: none; HALVES: 2N entries (gate, then up) */
    int64_t N;             /* outputs */
    int32_t nch;           /* 16-byte chunks per row of w */
    int32_t wdt;           /* BERTH_DTYPE_F32 / F16 / BF16 */
    int32_t bias_dt;
    int32_t accumulate;    /* y += (never with an epilogue) */
    int32_t glu;           /* BERTH_GLU_NONE / HALVES / MUL */
    int32_t glu_act;
    int32_t early;         /* w may be read before cu_pdl_wait (a weights buffer: no kernel writes it) */
    int32_t tpr_log2;      /* threads per row pair = 1 << tpr_log2, 5..8 (cu_gemv1 sets it) */
    int64_t nvb, wave;     /* row groups of TEAMS teams, blocks per wave (cu_gemv1 sets them; XP: persistent) */
    cu_ynorm yn;           /* the trailing norm the last block runs on y (count NULL: none; gemv_norm.cuh) */
    cu_xpre xp;            /* the norm each block runs before the product (on 0: none; x unused; gemv_xpre.cuh) */
};

/* Enqueue the kernel of be->gemv_mode (CU_GEMV_NEW or CU_GEMV_ASYNC) on cs, through cu_launch. Returns the
 * launch's error. */
cudaError_t cu_gemv1(berth_backend *be, cudaStream_t cs, const cu_gemv1_args &a);

#endif

/*
 * test_cuda_elementwise_shapes.c — the launch-policy paths of the CUDA element-wise kernels (elementwise.cu)
 * against the CPU backend: 4-element vectors with and without a partial last vector, the scalar fallback for
 * misaligned views, packed tensors run as one long row, several vectors per thread (prefill-sized rows, chunks
 * evened out), grid-stride loops over rows and chunks, 3-D and 4-D row walks, and in-place (aliased) outputs on
 * each of those paths. test_cuda_dense.c covers the ops' semantics at small sizes; this file covers the shapes.
 *
 * Which path a case takes (elementwise.cu, ew_shape with 132 SMs: grid cap 528 blocks):
 *   - V = 4 when every row of every operand starts on a multiple of 16 bytes (8 for bf16/f16 sources);
 *   - several vectors per thread when a row has more than 256 vectors and rows * chunks >= 528.
 * Tolerances as test_cuda_dense.c: atol 1e-6, rtol 1e-5; copy exact. Outputs start as NaN bytes and strided
 * outputs are compared over their whole tensor, so a missed element or a write outside the view fails.
 */
#include "harness.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define F32 BERTH_DTYPE_F32
#define F16 BERTH_DTYPE_F16
#define BF16 BERTH_DTYPE_BF16
#define I32 BERTH_DTYPE_I32

#define EW_ATOL 1e-6
#define EW_RTOL 1e-5

/* ---------------------------------------------------------------------------------------------------------------
 * glu on the two halves of a fused projection output F {2 * pitch, T}: gate at element off_g, up at pitch + off_g
 * of each row, rows 2 * pitch apart (pitch >= D + off_g). */

static void glu_case(int act, int64_t D, int64_t pitch, int64_t off_g, int64_t T, bool alias)
{
    char what[128];
    snprintf(what, sizeof what, "glu act=%d D=%lld pitch=%lld off=%lld T=%lld%s", act, (long long)D,
             (long long)pitch, (long long)off_g, (long long)T, alias ? " y=gate" : "");
    struct hx_tensor F = hx_new(F32, 2 * pitch, T, 0, 0), Y = hx_new(F32, D, T, 0, 0);
    hx_rand(&F, -4.0f, 4.0f);
    berth_glu_params p[2];
    for (int s = 0; s < 2; s++) {
        memset(&p[s], 0, sizeof p[s]);
        p[s].struct_size = sizeof p[s];
        p[s].act = act;
        p[s].gate = hx_view(&F, s, off_g, D, T, 1, 1, 2 * pitch, 2 * pitch * T, 2 * pitch * T);
        p[s].up = hx_view(&F, s, pitch + off_g, D, T, 1, 1, 2 * pitch, 2 * pitch * T, 2 * pitch * T);
        p[s].y = alias ? p[s].gate : Y.t[s];
    }
    hx_run_both(BERTH_OP_GLU, &p[HX_CPU], &p[HX_GPU], what);
    if (!alias)
        hx_expect_close(&Y, EW_ATOL, EW_RTOL, what);
    hx_expect_close(&F, EW_ATOL, EW_RTOL, what);
    hx_free(&F);
    hx_free(&Y);
}

START_TEST(test_glu_shapes)
{
    glu_case(BERTH_ACT_GELU_TANH, 37, 40, 0, 9, true);    /* V = 4, last vector 1 element, in place */
    glu_case(BERTH_ACT_GELU_TANH, 37, 40, 0, 9, false);   /* y rows 148 B apart: V = 1 */
    glu_case(BERTH_ACT_SILU, 38, 40, 0, 7, true);         /* V = 4, last vector 2 elements, in place */
    glu_case(BERTH_ACT_GELU_ERF, 1, 4, 0, 300, true);     /* 1 element per row, 256 rows per block */
    glu_case(BERTH_ACT_GELU_TANH, 12288, 12288, 0, 200, true); /* Gemma prefill row: 3 chunks x u 4, in place */
    glu_case(BERTH_ACT_GELU_TANH, 8960, 8960, 0, 200, false);  /* 2240 vectors: chunks 768 each (u 3) */
    glu_case(BERTH_ACT_SILU, 1001, 1002, 1, 600, true);   /* misaligned: V = 1, u 4, in place */
    glu_case(BERTH_ACT_RELU, 24576, 24576, 0, 1, false);  /* decode: one long row, u 1 */
    glu_case(BERTH_ACT_SIGMOID, 1536, 1536, 0, 32, true); /* decode batch */
}
END_TEST

/* ---------------------------------------------------------------------------------------------------------------
 * unary: x a view {n, ne1, ne2, ne3} with rows `pitch` elements apart at element offset off of a tensor X;
 * y a packed tensor, or x itself. */

static void unary_case(int act, int64_t n, int64_t ne1, int64_t ne2, int64_t ne3, int64_t pitch, int64_t off,
                       bool alias)
{
    char what[160];
    snprintf(what, sizeof what, "unary act=%d n=%lld rows={%lld,%lld,%lld} pitch=%lld off=%lld%s", act,
             (long long)n, (long long)ne1, (long long)ne2, (long long)ne3, (long long)pitch, (long long)off,
             alias ? " y=x" : "");
    const int64_t rows = ne1 * ne2 * ne3;
    struct hx_tensor X = hx_new(F32, off + pitch * rows, 0, 0, 0), Y = hx_new(F32, n, ne1, ne2, ne3);
    hx_rand(&X, -4.0f, 4.0f);
    berth_unary_params p[2];
    for (int s = 0; s < 2; s++) {
        memset(&p[s], 0, sizeof p[s]);
        p[s].struct_size = sizeof p[s];
        p[s].act = act;
        p[s].in_scale = 0.75f;
        p[s].out_scale = 1.25f;
        p[s].x = hx_view(&X, s, off, n, ne1, ne2, ne3, pitch, pitch * ne1, pitch * ne1 * ne2);
        p[s].y = alias ? p[s].x : Y.t[s];
    }
    hx_run_both(BERTH_OP_UNARY, &p[HX_CPU], &p[HX_GPU], what);
    if (!alias)
        hx_expect_close(&Y, EW_ATOL, EW_RTOL, what);
    hx_expect_close(&X, EW_ATOL, EW_RTOL, what);
    hx_free(&X);
    hx_free(&Y);
}

START_TEST(test_unary_shapes)
{
    unary_case(BERTH_ACT_TANH, 1, 37, 1, 1, 1, 0, false);       /* packed: one row of 37, last vector 1 */
    unary_case(BERTH_ACT_SILU, 1, 37, 1, 1, 1, 0, true);        /* the same in place */
    unary_case(BERTH_ACT_SILU, 1, 8, 5, 3, 1, 1, false);        /* packed at a 4-byte offset: V = 1 */
    unary_case(BERTH_ACT_GELU_TANH, 7, 3, 5, 2, 8, 0, true);    /* 4-D, rows 32 B apart: V = 4, last 3 */
    unary_case(BERTH_ACT_GELU_ERF, 7, 3, 5, 2, 9, 2, false);    /* 4-D, misaligned: V = 1 */
    unary_case(BERTH_ACT_EXP, 8960, 256, 1, 1, 8964, 0, false); /* prefill row: u 3, V = 4 */
    unary_case(BERTH_ACT_SOFTPLUS, 8960, 16, 16, 1, 8963, 0, true); /* 3-D, V = 1, u 4, in place */
    unary_case(BERTH_ACT_TANH, 4194310, 1, 1, 1, 4194310, 0, true); /* one row of 1025 chunks: 528 blocks loop */
}
END_TEST

/* ---------------------------------------------------------------------------------------------------------------
 * get_rows: a table view {D, N} with rows `pitch` elements apart at element offset off; y a view {D, T} with rows
 * ypitch apart (the gaps hold the same random values on both sides and must keep them). */

static void get_rows_case(berth_dtype tdt, int64_t D, int64_t pitch, int64_t off, int64_t Nrows, int64_t T,
                          int64_t ypitch, bool bad_ids)
{
    char what[160];
    snprintf(what, sizeof what, "get_rows dt=%d D=%lld pitch=%lld off=%lld N=%lld T=%lld ypitch=%lld%s", (int)tdt,
             (long long)D, (long long)pitch, (long long)off, (long long)Nrows, (long long)T, (long long)ypitch,
             bad_ids ? " bad ids" : "");
    struct hx_tensor tab = hx_new(tdt, off + pitch * Nrows, 0, 0, 0), ids = hx_new(I32, T, 0, 0, 0);
    struct hx_tensor bad = hx_new(I32, T, 0, 0, 0), Y = hx_new(F32, ypitch * T, 0, 0, 0);
    hx_rand(&tab, -2.0f, 2.0f);
    hx_rand(&Y, -1.0f, 1.0f);
    hx_rand_int(&ids, 0, (int32_t)Nrows - 1);
    /* The CPU backend refuses out-of-range ids: it gets the valid ids; the GPU gets every 5th id out of range
     * (alternately negative and >= N), and must write zeros for those rows. */
    int32_t *h = malloc((size_t)T * sizeof *h);
    ck_assert_ptr_nonnull(h);
    hx_get(&ids, HX_CPU, h);
    for (int64_t t = 0; t < T; t++)
        if (bad_ids && t % 5 == 2)
            h[t] = t % 2 ? -1 - (int32_t)t : (int32_t)(Nrows + t);
    hx_set(&bad, h);
    berth_get_rows_params p[2];
    for (int s = 0; s < 2; s++) {
        memset(&p[s], 0, sizeof p[s]);
        p[s].struct_size = sizeof p[s];
        p[s].scale = 0.5f;
        p[s].table = hx_view(&tab, s, off, D, Nrows, 1, 1, pitch, pitch * Nrows, pitch * Nrows);
        p[s].ids = s == HX_GPU ? bad.t[s] : ids.t[s];
        p[s].y = hx_view(&Y, s, 0, D, T, 1, 1, ypitch, ypitch * T, ypitch * T);
    }
    hx_run_both(BERTH_OP_GET_ROWS, &p[HX_CPU], &p[HX_GPU], what);
    if (!bad_ids) {
        hx_expect_close(&Y, EW_ATOL, EW_RTOL, what);
    } else {
        const int64_t ne = ypitch * T;
        float *cpu = malloc((size_t)ne * sizeof *cpu), *gpu = malloc((size_t)ne * sizeof *gpu);
        ck_assert_ptr_nonnull(cpu);
        ck_assert_ptr_nonnull(gpu);
        hx_get_f32(&Y, HX_CPU, cpu);
        hx_get_f32(&Y, HX_GPU, gpu);
        for (int64_t t = 0; t < T; t++)
            for (int64_t i = 0; i < ypitch; i++) {
                const float want = t % 5 == 2 && i < D ? 0.0f : cpu[t * ypitch + i];
                ck_assert_msg(gpu[t * ypitch + i] == want, "%s: y[%lld][%lld] = %g, expected %g", what,
                              (long long)t, (long long)i, (double)gpu[t * ypitch + i], (double)want);
            }
        free(cpu);
        free(gpu);
    }
    free(h);
    hx_free(&tab);
    hx_free(&ids);
    hx_free(&bad);
    hx_free(&Y);
}

START_TEST(test_get_rows_shapes)
{
    get_rows_case(BF16, 37, 40, 0, 30, 11, 40, false);       /* 80-byte table rows: V = 4, last vector 1 */
    get_rows_case(BF16, 37, 40, 0, 30, 11, 40, true);        /* the same with ids out of range */
    get_rows_case(F16, 36, 36, 0, 30, 11, 36, false);        /* 72-byte rows: V = 4 */
    get_rows_case(F16, 38, 38, 0, 30, 11, 40, false);        /* 76-byte rows: V = 1 */
    get_rows_case(F32, 36, 36, 1, 30, 11, 36, false);        /* table at a 4-byte offset: V = 1 */
    get_rows_case(F32, 36, 36, 0, 30, 11, 37, false);        /* y rows 148 B apart: V = 1 */
    get_rows_case(BF16, 8960, 8960, 0, 64, 300, 8960, false); /* prefill embedding rows: u 3 */
    get_rows_case(F32, 8960, 8960, 0, 64, 300, 8964, true);  /* the same with ids out of range */
    get_rows_case(F16, 1536, 1536, 0, 100, 1, 1536, false);  /* decode: one row */
}
END_TEST

/* ---------------------------------------------------------------------------------------------------------------
 * binary: a {D, H, T} (rows `pitch` apart), b {b0, b1, b2} of dtype bdt at element offset boff of its tensor. */

static void binary_case(int op, berth_dtype bdt, int64_t D, int64_t H, int64_t T, int64_t pitch, int64_t b0,
                        int64_t b1, int64_t b2, int64_t boff, bool alias)
{
    char what[160];
    snprintf(what, sizeof what, "binary op=%d a={%lld,%lld,%lld} pitch=%lld b=%d{%lld,%lld,%lld}+%lld%s", op,
             (long long)D, (long long)H, (long long)T, (long long)pitch, (int)bdt, (long long)b0, (long long)b1,
             (long long)b2, (long long)boff, alias ? " y=a" : "");
    struct hx_tensor A = hx_new(F32, pitch * H * T, 0, 0, 0), Bt = hx_new(bdt, boff + b0 * b1 * b2, 0, 0, 0);
    struct hx_tensor Y = hx_new(F32, D, H, T, 0);
    hx_rand(&A, -2.0f, 2.0f);
    hx_rand(&Bt, -2.0f, 2.0f);
    berth_binary_params p[2];
    for (int s = 0; s < 2; s++) {
        memset(&p[s], 0, sizeof p[s]);
        p[s].struct_size = sizeof p[s];
        p[s].op = op;
        p[s].scale = 0.75f;
        p[s].a = hx_view(&A, s, 0, D, H, T, 1, pitch, pitch * H, pitch * H * T);
        p[s].b = hx_view(&Bt, s, boff, b0, b1, b2, 1, b0, b0 * b1, b0 * b1 * b2);
        p[s].y = alias ? p[s].a : Y.t[s];
    }
    hx_run_both(BERTH_OP_BINARY, &p[HX_CPU], &p[HX_GPU], what);
    if (!alias)
        hx_expect_close(&Y, EW_ATOL, EW_RTOL, what);
    hx_expect_close(&A, EW_ATOL, EW_RTOL, what);
    hx_free(&A);
    hx_free(&Bt);
    hx_free(&Y);
}

START_TEST(test_binary_shapes)
{
    for (int op = BERTH_BINARY_ADD; op <= BERTH_BINARY_MUL; op++) {
        binary_case(op, F32, 1, 4, 5, 1, 1, 4, 5, 0, false);         /* packed, ne[0] = 1, b full: one row */
        binary_case(op, BF16, 1, 4, 5, 1, 1, 4, 5, 1, true);         /* the same, b at an odd offset, in place */
        binary_case(op, F32, 1, 4, 5, 1, 1, 4, 1, 0, false);         /* ne[0] = 1, b per head */
        binary_case(op, F16, 37, 3, 5, 40, 37, 3, 5, 0, true);       /* b rows 74 B: V = 1 */
        binary_case(op, F16, 36, 3, 5, 40, 36, 1, 5, 0, false);      /* b rows 72 B: V = 4 */
        binary_case(op, F32, 37, 3, 5, 40, 37, 1, 1, 0, true);       /* per feature, last vector 1 */
        binary_case(op, BF16, 8960, 1, 256, 8960, 8960, 1, 1, 0, false); /* prefill per feature: u 3 */
        binary_case(op, F32, 8960, 1, 256, 8960, 8960, 1, 256, 0, true); /* packed, full b, in place */
        binary_case(op, F32, 8960, 1, 256, 8964, 1, 1, 256, 0, false);   /* per token scalar, strided a */
        binary_case(op, F32, 1536, 1, 1, 1536, 1, 1, 1, 0, true);        /* decode: one row, scalar b */
    }
}
END_TEST

/* ---------------------------------------------------------------------------------------------------------------
 * copy: x {D, H, T} rows `xpitch` apart at element offset xoff; y a view of {D, HY, T} (heads 1..H), or packed. */

static void copy_case(berth_dtype xdt, berth_dtype ydt, int64_t D, int64_t H, int64_t T, int64_t xpitch,
                      int64_t xoff, bool y_view)
{
    char what[160];
    snprintf(what, sizeof what, "copy %d -> %d D=%lld H=%lld T=%lld xpitch=%lld xoff=%lld%s", (int)xdt, (int)ydt,
             (long long)D, (long long)H, (long long)T, (long long)xpitch, (long long)xoff, y_view ? " y view" : "");
    const int64_t HY = y_view ? H + 2 : H;
    struct hx_tensor X = hx_new(xdt, xoff + xpitch * H * T, 0, 0, 0), Y = hx_new(ydt, D, HY, T, 0);
    hx_rand(&X, -3.0f, 3.0f);
    hx_rand(&Y, -1.0f, 1.0f);
    berth_copy_params p[2];
    for (int s = 0; s < 2; s++) {
        memset(&p[s], 0, sizeof p[s]);
        p[s].struct_size = sizeof p[s];
        p[s].x = hx_view(&X, s, xoff, D, H, T, 1, xpitch, xpitch * H, xpitch * H * T);
        p[s].y = y_view ? hx_view(&Y, s, D, D, H, T, 1, D, D * HY, D * HY * T) : Y.t[s];
    }
    hx_run_both(BERTH_OP_COPY, &p[HX_CPU], &p[HX_GPU], what);
    hx_expect_equal(&Y, what);
    hx_free(&X);
    hx_free(&Y);
}

START_TEST(test_copy_shapes)
{
    copy_case(F32, BF16, 37, 3, 1, 37, 0, false); /* packed: one row of 111, last vector 3 */
    copy_case(BF16, F16, 37, 3, 1, 37, 0, false);
    copy_case(F16, F32, 36, 3, 4, 36, 2, true);   /* x at 4 bytes past 8: V = 1 */
    copy_case(F32, F16, 36, 3, 4, 40, 0, true);   /* 8-byte y rows, 16-byte x rows: V = 4 */
    copy_case(BF16, BF16, 38, 3, 4, 40, 0, true); /* y rows 76 B apart: V = 1 */
    copy_case(F32, BF16, 8960, 4, 64, 8960, 0, true); /* long rows: u 3 */
    copy_case(BF16, F32, 8960, 4, 64, 8960, 0, false); /* packed: one row, capped grid */
}
END_TEST

static Suite *make_suite(void)
{
    Suite *s = suite_create("cuda_elementwise_shapes");
    TCase *tc = tcase_create("shapes");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_glu_shapes);
    tcase_add_test(tc, test_unary_shapes);
    tcase_add_test(tc, test_get_rows_shapes);
    tcase_add_test(tc, test_binary_shapes);
    tcase_add_test(tc, test_copy_shapes);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv)
{
    return hx_main(argc, argv, make_suite);
}

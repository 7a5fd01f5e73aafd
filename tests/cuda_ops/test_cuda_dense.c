/*
 * test_cuda_dense.c — the CUDA backend's dense ops (matmul with its norm prologue, gated epilogue and trailing
 * norm, get_rows, rms_norm, layer_norm, gated_rms_norm, rope, unary, glu, binary, copy) against the CPU backend on
 * fresh random inputs (tests/cuda_ops/harness.h).
 *
 * Tolerances. Both backends compute in fp32 but sum in different orders, so results agree to rounding:
 *  - matmul: |y| is about sqrt(K)/3 for inputs in [-1, 1]; the fp32 bound is atol 1e-5 * sqrt(K) (about 3e-5 of
 *    |y|) plus rtol 1e-5. In bf16 compute mode (HX_COMPUTE=bf16), M > 8 runs on the tensor cores with x (and f32
 *    weights) rounded to bf16, 2^-9 relative each: the error of y is about 5e-4 * sqrt(K) rms, so those cases
 *    use atol 6e-3 * sqrt(K) (about 10 sigma), rtol 0. So do the products of matmul_skinny.cu's kernel (bf16
 *    mode, bf16/f16 w, K a multiple of 8, M from BERTH_CUDA_SKINNY's bound — 5 by default — up to 64: x rounded
 *    to the weight dtype); other products with M <= 8 are the fp32 GEMV in both modes (mm_x_rounded says which).
 *    cuda_ops_dense_skinny runs this file in bf16 mode with BERTH_CUDA_SKINNY=2 (the kernel from M = 2),
 *    cuda_ops_dense_bf16 with BERTH_CUDA_SKINNY=0 (the GEMV and cuBLAS).
 *  - elementwise ops, norms, rope: atol 1e-6, rtol 1e-5 (libm vs CUDA's precise functions differ by an ulp or two;
 *    the CPU's vector exp/tanh by ~2 ulp).
 *  - copy: exact (round to nearest even on both sides).
 * Outputs start as NaN bytes, so an element a kernel forgot fails; where an output is a strided view, the whole
 * tensor is filled with the same random values on both sides first, so the bytes outside the view must match too
 * (a kernel writing outside its view fails).
 */
#include "harness.h"

#include <math.h>
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

static bool bf16_mode(void)
{
    const char *m = getenv("HX_COMPUTE");
    return m && strcmp(m, "bf16") == 0;
}

/* Whether the CUDA side rounds x to the weight dtype in an M-row product: in bf16 mode cuBLAS does above M = 8,
 * and matmul_skinny.cu does for bf16/f16 w with K a multiple of 8 from BERTH_CUDA_SKINNY's bound up to M = 64
 * (as cuda_backend.cu reads it: unset / 1: 5; 0: never; 2..64: that M). */
static bool mm_x_rounded(int64_t M, int64_t K, berth_dtype wdt)
{
    if (!bf16_mode())
        return false;
    if (M > 8)
        return true;
    const char *e = getenv("BERTH_CUDA_SKINNY");
    long lo = 5;
    if (e && *e && strcmp(e, "1") != 0) {
        char *end = NULL;
        const long v = strtol(e, &end, 10);
        if (end != e && *end == '\0' && (v == 0 || (v >= 2 && v <= 64)))
            lo = v;
    }
    return lo > 0 && M >= lo && wdt != F32 && K % 8 == 0;
}

/* ---------------------------------------------------------------------------------------------------------------
 * matmul */

enum { XV_PACKED, XV_PADDED, XV_3D }; /* x layouts: contiguous; rows K+7 apart at a 3-float offset; 3-D with gaps */

struct mm_case {
    int64_t M, K, N;
    berth_dtype wdt;
    int bias;            /* 0: none; else 1 + bias dtype */
    int acc;
    int xview;
    int yview;           /* 1: y rows N+3 apart */
};

static const struct mm_case mm_cases[] = {
    /* odd sizes: scalar weight loads, every GEMV bucket and the cuBLAS paths */
    {1, 77, 33, F32, 0, 0, 0, 0},   {3, 77, 33, F32, 0, 0, 0, 0},   {8, 77, 33, F32, 0, 0, 0, 0},
    {9, 77, 33, F32, 0, 0, 0, 0},   {64, 77, 33, F32, 0, 0, 0, 0},  {200, 77, 33, F32, 0, 0, 0, 0},
    {1, 77, 33, BF16, 0, 0, 0, 0},  {3, 77, 33, BF16, 0, 0, 0, 0},  {8, 77, 33, BF16, 0, 0, 0, 0},
    {9, 77, 33, BF16, 0, 0, 0, 0},  {64, 77, 33, BF16, 0, 0, 0, 0}, {200, 77, 33, BF16, 0, 0, 0, 0},
    {1, 77, 33, F16, 0, 0, 0, 0},   {3, 77, 33, F16, 0, 0, 0, 0},   {8, 77, 33, F16, 0, 0, 0, 0},
    {9, 77, 33, F16, 0, 0, 0, 0},   {64, 77, 33, F16, 0, 0, 0, 0},  {200, 77, 33, F16, 0, 0, 0, 0},
    /* K a multiple of 16 bytes: 16-byte weight loads, every GEMV bucket (1, 2, 4, 8) */
    {1, 264, 37, F32, 0, 0, 0, 0},  {2, 264, 37, BF16, 0, 0, 0, 0}, {4, 264, 37, F16, 0, 0, 0, 0},
    {5, 264, 37, BF16, 0, 0, 0, 0}, {1, 264, 37, BF16, 0, 0, 0, 0}, {1, 264, 37, F16, 0, 0, 0, 0},
    /* K = 100: 16-byte loads for f32 rows (400 bytes), scalar for bf16/f16 rows (200 bytes) */
    {1, 100, 19, F32, 0, 0, 0, 0},  {1, 100, 19, BF16, 0, 0, 0, 0}, {2, 100, 19, F16, 0, 0, 0, 0},
    /* Gemma 4 E2B shapes: decode (M = 1, and a warp per row pair at N = 12288) and a prefill chunk */
    {1, 1536, 2048, BF16, 0, 0, 0, 0},  {1, 6144, 1536, BF16, 0, 0, 0, 0}, {1, 1536, 12288, BF16, 0, 0, 0, 0},
    {8, 1536, 12288, BF16, 0, 0, 0, 0}, {32, 1536, 2048, BF16, 0, 0, 0, 0}, {32, 6144, 1536, BF16, 0, 0, 0, 0},
    {1, 6144, 1536, F32, 0, 0, 0, 0},   {32, 6144, 1536, F32, 0, 0, 0, 0},
    /* M = 1 with 16-byte weight chunks (gemv.cu; matmul.cu's general kernel under BERTH_CUDA_GEMV=old): teams of
     * 32 / 64 / 128 / 256 threads per row pair, chunk counts that leave every remainder after the 4-chunk steps
     * (the lanes of a team differ by one chunk), odd N (the last team's second row absent), bias, accumulate,
     * padded y, unaligned x (gathered first) */
    {1, 1544, 4500, BF16, 0, 0, 0, 0},       {1, 2040, 4500, F16, 0, 0, 0, 0},
    {1, 1032, 4501, F32, 1 + F32, 0, 0, 0},  {1, 1544, 4500, BF16, 1 + BF16, 1, 0, 0},
    {1, 1536, 2561, BF16, 0, 1, 0, 0},       {1, 6152, 1537, BF16, 1 + F32, 0, 0, 0},
    {1, 8200, 5, BF16, 0, 0, 0, 0},          {1, 4104, 3, F16, 1 + F16, 1, 0, 1},
    {1, 264, 33, BF16, 0, 0, XV_PADDED, 0},  {1, 12288, 1536, BF16, 0, 0, 0, 0},
    /* bias (f32 / bf16) and accumulate */
    {1, 264, 40, BF16, 1 + F32, 0, 0, 0},  {64, 264, 40, BF16, 1 + BF16, 0, 0, 0},
    {64, 77, 40, F32, 1 + F32, 0, 0, 0},   {3, 264, 40, BF16, 0, 1, 0, 0},
    {64, 264, 40, F16, 0, 1, 0, 0},        {1, 77, 40, BF16, 1 + BF16, 1, 0, 0},
    {64, 264, 40, F32, 1 + F16, 1, 0, 0},  {9, 264, 40, BF16, 1 + F32, 1, 0, 0},
    /* strided x: padded rows at an unaligned offset (GEMV gathers, cuBLAS reads them in place); 3-D x whose rows no
     * single stride walks (GEMV per-row pointers, cuBLAS gathers); padded y rows (cuBLAS ldc; with accumulate) */
    {5, 264, 33, BF16, 0, 0, XV_PADDED, 0}, {8, 77, 33, F32, 0, 0, XV_PADDED, 0},
    {64, 264, 33, BF16, 0, 0, XV_PADDED, 0}, {64, 264, 33, F32, 0, 0, XV_PADDED, 0},
    {8, 264, 33, BF16, 0, 0, XV_3D, 0},     {64, 264, 33, BF16, 1 + F32, 0, XV_3D, 0},
    {64, 77, 33, F16, 0, 1, XV_3D, 0},      {4, 264, 33, BF16, 1 + F32, 1, 0, 1},
    {64, 264, 33, BF16, 0, 1, XV_PADDED, 1}, {64, 264, 33, F16, 1 + BF16, 0, 0, 1},
    /* batched decode, 9 <= M <= 64 with K a multiple of 8 (matmul_skinny.cu when BERTH_CUDA_SKINNY=1 in bf16 mode,
     * else cuBLAS): every m16-tile count (M = 9..16, 17..32, 33..48, 49..64), split-K (N / 128 blocks short of a
     * wave) and one split (N = 40000; K < 192), a K tail shorter than one 64-column tile (K = 40, 136, 264), odd N,
     * bias, accumulate, unaligned / 3-D x (4-byte x loads) and padded y */
    {16, 1536, 2560, BF16, 0, 0, 0, 0},             {32, 1536, 2560, BF16, 1 + F32, 0, 0, 0},
    {64, 1536, 256, BF16, 1 + F32, 1, 0, 0},         {48, 4096, 1536, BF16, 0, 0, 0, 0},
    {17, 6144, 1536, F16, 1 + F32, 1, 0, 0},         {33, 264, 257, F16, 1 + BF16, 1, XV_PADDED, 1},
    {16, 256, 1536, BF16, 0, 1, XV_3D, 0},           {24, 40, 300, BF16, 0, 0, 0, 0},
    {9, 264, 40000, BF16, 1 + F32, 1, 0, 0},         {32, 264, 1001, BF16, 0, 1, XV_PADDED, 1},
    {56, 136, 999, F16, 1 + BF16, 1, XV_PADDED, 0},
    /* f16 weights on the wgmma twins (sm_90a; 9-32 rows after the pack, x rounded to f16): the 32-row tile of an
     * unsplit product (N / 64 column blocks leave no room for a K split), bias, accumulate, an 8-column K tail */
    {32, 520, 12288, F16, 0, 0, 0, 0},               {20, 520, 9000, F16, 1 + F32, 1, 0, 0},
};
#define N_MM_CASES ((int)(sizeof mm_cases / sizeof mm_cases[0]))

static void mm_run(const struct mm_case *c)
{
    const int64_t M = c->M, K = c->K, N = c->N;
    char what[160];
    snprintf(what, sizeof what, "matmul M=%lld K=%lld N=%lld w=%s bias=%s acc=%d xview=%d yview=%d", (long long)M,
             (long long)K, (long long)N, hx_dtype_name(c->wdt), c->bias ? hx_dtype_name((berth_dtype)(c->bias - 1)) : "none",
             c->acc, c->xview, c->yview);

    struct hx_tensor X = c->xview == XV_PACKED   ? hx_new(F32, K, M, 0, 0)
                         : c->xview == XV_PADDED ? hx_new(F32, K + 7, M, 0, 0)
                                                 : hx_new(F32, 2 * K + 5, M / 2, 0, 0);
    hx_rand(&X, -1.0f, 1.0f);
    struct hx_tensor W = hx_new(c->wdt, K, N, 0, 0);
    hx_rand(&W, -1.0f, 1.0f);
    struct hx_tensor B;
    memset(&B, 0, sizeof B);
    if (c->bias) {
        B = hx_new((berth_dtype)(c->bias - 1), N, 0, 0, 0);
        hx_rand(&B, -1.0f, 1.0f);
    }
    struct hx_tensor Y = hx_new(F32, c->yview ? N + 3 : N, M, 0, 0);
    if (c->acc || c->yview)
        hx_rand(&Y, -1.0f, 1.0f);

    berth_matmul_params p[2];
    for (int s = 0; s < 2; s++) {
        memset(&p[s], 0, sizeof p[s]);
        p[s].struct_size = sizeof p[s];
        p[s].accumulate = c->acc;
        if (c->xview == XV_PACKED)
            p[s].x = X.t[s];
        else if (c->xview == XV_PADDED)
            p[s].x = hx_view(&X, s, 3, K, M, 1, 1, K + 7, (K + 7) * M, (K + 7) * M);
        else
            p[s].x = hx_view(&X, s, 0, K, 2, M / 2, 1, K, 2 * K + 5, (2 * K + 5) * (M / 2));
        p[s].w = W.t[s];
        if (c->bias)
            p[s].bias = B.t[s];
        p[s].y = c->yview ? hx_view(&Y, s, 0, N, M, 1, 1, N + 3, (N + 3) * M, (N + 3) * M) : Y.t[s];
    }
    hx_run_both(BERTH_OP_MATMUL, &p[HX_CPU], &p[HX_GPU], what);

    const double scale = sqrt((double)K);
    if (mm_x_rounded(M, K, c->wdt))
        hx_expect_close(&Y, 6e-3 * scale, 0.0, what);
    else
        hx_expect_close(&Y, 1e-5 * scale, 1e-5, what);
    hx_free(&X);
    hx_free(&W);
    if (c->bias)
        hx_free(&B);
    hx_free(&Y);
}

START_TEST(test_matmul)
{
    mm_run(&mm_cases[_i]);
}
END_TEST

/* A weight dtype no backend supports is refused by supports() on both sides, with the shared check's message;
 * the same query with bf16 weights is accepted by both. */
START_TEST(test_matmul_supports)
{
    berth_matmul_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    const int64_t K = 64, N = 32, M = 4;
    p.x.dtype = F32;
    p.w.dtype = I32;
    p.y.dtype = F32;
    const int64_t xne[4] = {K, M, 1, 1}, wne[4] = {K, N, 1, 1}, yne[4] = {N, M, 1, 1};
    memcpy(p.x.ne, xne, sizeof xne);
    memcpy(p.w.ne, wne, sizeof wne);
    memcpy(p.y.ne, yne, sizeof yne);
    p.x.ndim = p.w.ndim = p.y.ndim = 2;
    for (int i = 0; i < 4; i++) {
        p.x.nb[i] = i == 0 ? 4 : p.x.nb[i - 1] * p.x.ne[i - 1];
        p.w.nb[i] = i == 0 ? 4 : p.w.nb[i - 1] * p.w.ne[i - 1];
        p.y.nb[i] = i == 0 ? 4 : p.y.nb[i - 1] * p.y.ne[i - 1];
    }
    static const char want[] = "matmul: w dtype i32 is not supported (supported: f32, f16, bf16)";
    for (int s = 0; s < 2; s++) {
        const berth_status st = hx_supports(s, BERTH_OP_MATMUL, &p);
        ck_assert_msg(st == BERTH_E_UNSUPPORTED, "side %d: supports(matmul, i32 w) = %d (%s)", s, (int)st,
                      hx_last_error);
        ck_assert_str_eq(hx_last_error, want);
    }
    p.w.dtype = BF16;
    for (int i = 0; i < 4; i++)
        p.w.nb[i] = i == 0 ? 2 : p.w.nb[i - 1] * p.w.ne[i - 1];
    for (int s = 0; s < 2; s++) {
        const berth_status st = hx_supports(s, BERTH_OP_MATMUL, &p);
        ck_assert_msg(st == BERTH_OK, "side %d: supports(matmul, bf16 w) = %d (%s)", s, (int)st, hx_last_error);
    }
}
END_TEST

/* ---------------------------------------------------------------------------------------------------------------
 * get_rows */

static void get_rows_case(berth_dtype tdt, int64_t D, int64_t Nrows, int64_t T, float scale)
{
    char what[96];
    snprintf(what, sizeof what, "get_rows table=%s D=%lld N=%lld T=%lld scale=%g", hx_dtype_name(tdt), (long long)D,
             (long long)Nrows, (long long)T, (double)scale);
    struct hx_tensor tab = hx_new(tdt, D, Nrows, 0, 0), ids = hx_new(I32, T, 0, 0, 0), Y = hx_new(F32, D, T, 0, 0);
    hx_rand(&tab, -2.0f, 2.0f);
    hx_rand_int(&ids, 0, (int32_t)Nrows - 1);
    berth_get_rows_params p[2];
    for (int s = 0; s < 2; s++) {
        memset(&p[s], 0, sizeof p[s]);
        p[s].struct_size = sizeof p[s];
        p[s].scale = scale;
        p[s].table = tab.t[s];
        p[s].ids = ids.t[s];
        p[s].y = Y.t[s];
    }
    hx_run_both(BERTH_OP_GET_ROWS, &p[HX_CPU], &p[HX_GPU], what);
    hx_expect_close(&Y, EW_ATOL, EW_RTOL, what);
    hx_free(&tab);
    hx_free(&ids);
    hx_free(&Y);
}

START_TEST(test_get_rows)
{
    get_rows_case(BF16, 300, 50, 9, 0.125f);
    get_rows_case(BF16, 1536, 1000, 4, 39.191836f); /* Gemma's sqrt(hidden) embedding scale */
    get_rows_case(F32, 33, 7, 12, 1.0f);
    get_rows_case(F16, 64, 20, 1, -0.5f);
}
END_TEST

/* An id outside [0, N) (the caller's bug) must not read outside the table: the CUDA kernel writes zeros for that
 * row. The CPU backend refuses such ids, so the CUDA run is compared with a CPU run whose ids are all valid. */
START_TEST(test_get_rows_bad_id)
{
    const int64_t D = 40, Nrows = 10, T = 6;
    struct hx_tensor tab = hx_new(BF16, D, Nrows, 0, 0), ok = hx_new(I32, T, 0, 0, 0), bad = hx_new(I32, T, 0, 0, 0);
    struct hx_tensor Y = hx_new(F32, D, T, 0, 0);
    hx_rand(&tab, -2.0f, 2.0f);
    const int32_t ok_ids[6] = {3, 0, 9, 4, 9, 1}, bad_ids[6] = {3, 0, -1, 4, 10, 1};
    hx_set(&ok, ok_ids);
    hx_set(&bad, bad_ids);
    berth_get_rows_params p[2];
    for (int s = 0; s < 2; s++) {
        memset(&p[s], 0, sizeof p[s]);
        p[s].struct_size = sizeof p[s];
        p[s].scale = 2.0f;
        p[s].table = tab.t[s];
        p[s].ids = s == HX_CPU ? ok.t[s] : bad.t[s];
        p[s].y = Y.t[s];
    }
    hx_run_both(BERTH_OP_GET_ROWS, &p[HX_CPU], &p[HX_GPU], "get_rows with ids -1 and N");
    float cpu[6 * 40], gpu[6 * 40];
    hx_get_f32(&Y, HX_CPU, cpu);
    hx_get_f32(&Y, HX_GPU, gpu);
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < D; i++) {
            const float want = (t == 2 || t == 4) ? 0.0f : cpu[t * D + i];
            ck_assert_msg(gpu[t * D + i] == want, "get_rows bad id: y[%lld][%lld] = %g, expected %g", (long long)t,
                          (long long)i, (double)gpu[t * D + i], (double)want);
        }
    hx_free(&tab);
    hx_free(&ok);
    hx_free(&bad);
    hx_free(&Y);
}
END_TEST

/* ---------------------------------------------------------------------------------------------------------------
 * rms_norm */

static const char *const wmode_names[] = {"W_NONE", "W", "W_ONE_PLUS", "UNIT"};

/* The RMS-norm prologue (x_norm_mode): every path (GEMV buckets with 16-byte and scalar loads, the cuBLAS gather;
 * matmul_skinny.cu declines it), weight modes W / W_ONE_PLUS (bf16 or f32 norm weight) and UNIT, strided x.
 * The normalised rows have rms about 1 (w_norm in [-1, 1]), about sqrt(3) times the plain cases' x: the same
 * bounds, doubled. */
struct mm_norm_case {
    int64_t M, K, N;
    berth_dtype wdt;
    int mode;
    berth_dtype nwdt;
    int xview;
};

static const struct mm_norm_case mm_norm_cases[] = {
    {1, 1536, 2048, BF16, BERTH_NORM_W, BF16, XV_PACKED},   {3, 1536, 2048, BF16, BERTH_NORM_W, BF16, XV_PACKED},
    {8, 1536, 2048, BF16, BERTH_NORM_W, BF16, XV_PACKED},   {32, 1536, 2048, BF16, BERTH_NORM_W, BF16, XV_PACKED},
    {1, 1536, 2048, BF16, BERTH_NORM_UNIT, BF16, XV_PACKED}, {3, 1536, 2048, BF16, BERTH_NORM_UNIT, BF16, XV_PACKED},
    {8, 1536, 2048, BF16, BERTH_NORM_UNIT, BF16, XV_PACKED}, {32, 1536, 2048, BF16, BERTH_NORM_UNIT, BF16, XV_PACKED},
    {1, 1536, 12288, BF16, BERTH_NORM_W, BF16, XV_PACKED},  {2, 264, 37, F16, BERTH_NORM_W_ONE_PLUS, BF16, XV_PACKED},
    {1, 77, 33, F32, BERTH_NORM_W, F32, XV_PACKED},         {5, 77, 33, BF16, BERTH_NORM_W_ONE_PLUS, F32, XV_PACKED},
    {4, 264, 33, F32, BERTH_NORM_UNIT, BF16, XV_PADDED},    {8, 264, 33, BF16, BERTH_NORM_W, BF16, XV_3D},
    {64, 264, 33, BF16, BERTH_NORM_W, BF16, XV_PADDED},     {64, 77, 33, F16, BERTH_NORM_UNIT, BF16, XV_3D},
    {32, 1536, 2048, F32, BERTH_NORM_W, BF16, XV_PACKED},   {200, 1536, 513, BF16, BERTH_NORM_W_ONE_PLUS, BF16, XV_PACKED},
};
#define N_MM_NORM_CASES ((int)(sizeof mm_norm_cases / sizeof mm_norm_cases[0]))

static void mm_norm_run(const struct mm_norm_case *c)
{
    const int64_t M = c->M, K = c->K, N = c->N;
    char what[160];
    snprintf(what, sizeof what, "matmul norm prologue %s (w %s) M=%lld K=%lld N=%lld w=%s xview=%d",
             wmode_names[c->mode], hx_dtype_name(c->nwdt), (long long)M, (long long)K, (long long)N, hx_dtype_name(c->wdt),
             c->xview);
    struct hx_tensor X = c->xview == XV_PACKED   ? hx_new(F32, K, M, 0, 0)
                         : c->xview == XV_PADDED ? hx_new(F32, K + 7, M, 0, 0)
                                                 : hx_new(F32, 2 * K + 5, M / 2, 0, 0);
    hx_rand(&X, -3.0f, 3.0f);
    struct hx_tensor W = hx_new(c->wdt, K, N, 0, 0), NW = hx_new(c->nwdt, K, 0, 0, 0);
    hx_rand(&W, -1.0f, 1.0f);
    hx_rand(&NW, -1.0f, 1.0f);
    struct hx_tensor Y = hx_new(F32, N, M, 0, 0);
    berth_matmul_params p[2];
    for (int s = 0; s < 2; s++) {
        memset(&p[s], 0, sizeof p[s]);
        p[s].struct_size = sizeof p[s];
        if (c->xview == XV_PACKED)
            p[s].x = X.t[s];
        else if (c->xview == XV_PADDED)
            p[s].x = hx_view(&X, s, 3, K, M, 1, 1, K + 7, (K + 7) * M, (K + 7) * M);
        else
            p[s].x = hx_view(&X, s, 0, K, 2, M / 2, 1, K, 2 * K + 5, (2 * K + 5) * (M / 2));
        p[s].w = W.t[s];
        p[s].y = Y.t[s];
        p[s].x_norm_mode = c->mode;
        p[s].x_norm_eps = 1e-6f;
        if (c->mode != BERTH_NORM_UNIT)
            p[s].x_norm_w = NW.t[s];
    }
    hx_run_both(BERTH_OP_MATMUL, &p[HX_CPU], &p[HX_GPU], what);
    const double scale = sqrt((double)K);
    if (mm_x_rounded(M, K, c->wdt))
        hx_expect_close(&Y, 1.2e-2 * scale, 0.0, what);
    else
        hx_expect_close(&Y, 2e-5 * scale, 1e-5, what);
    hx_expect_close(&X, 0.0, 0.0, what); /* x is read, never written */
    hx_free(&X);
    hx_free(&W);
    hx_free(&NW);
    hx_free(&Y);
}

START_TEST(test_matmul_norm_prologue)
{
    mm_norm_run(&mm_norm_cases[_i]);
}
END_TEST

/* The gated epilogue (y_glu): HALVES (w = [gate | up] rows, optional bias over both halves) and MUL (y = f(z) *
 * y_glu_up, which may be y itself or a strided view), on every path (GEMV buckets 1/2/4/8 with 16-byte and
 * scalar weight loads, cuBLAS with its glu kernel; the skinny kernel declines it), with and without the norm
 * prologue. act is GELU-tanh (Gemma) or SiLU (Qwen). The product's bounds as plain matmul, times |f| <= |z| and
 * |up| about sqrt(K)/3: the bound scaled by sqrt(K). */
struct mm_glu_case {
    int64_t M, K, N; /* N outputs (HALVES: w has 2N rows) */
    berth_dtype wdt;
    int mode;
    int act;
    int bias;        /* HALVES: bias ne {2N} f32 */
    int norm;        /* RMS-norm prologue, bf16 weight */
    int up_view;     /* MUL: 0 separate contiguous, 1 y itself, 2 rows of a wider tensor (stride 2N + 3) */
};

static const struct mm_glu_case mm_glu_cases[] = {
    {1, 1536, 6144, BF16, BERTH_GLU_HALVES, BERTH_ACT_GELU_TANH, 0, 1, 0},
    {1, 1536, 12288, BF16, BERTH_GLU_HALVES, BERTH_ACT_GELU_TANH, 0, 1, 0},
    {2, 264, 37, BF16, BERTH_GLU_HALVES, BERTH_ACT_SILU, 1, 0, 0},
    {3, 77, 33, F32, BERTH_GLU_HALVES, BERTH_ACT_GELU_TANH, 1, 1, 0},
    {8, 1536, 6144, BF16, BERTH_GLU_HALVES, BERTH_ACT_GELU_TANH, 0, 1, 0},
    {5, 264, 41, F16, BERTH_GLU_HALVES, BERTH_ACT_GELU_TANH, 0, 0, 0},
    {32, 1536, 2048, BF16, BERTH_GLU_HALVES, BERTH_ACT_GELU_TANH, 0, 1, 0},
    {200, 264, 37, BF16, BERTH_GLU_HALVES, BERTH_ACT_SILU, 1, 0, 0},
    {64, 77, 33, F32, BERTH_GLU_HALVES, BERTH_ACT_GELU_TANH, 0, 1, 0},
    {1, 264, 37, BF16, BERTH_GLU_HALVES, BERTH_ACT_SILU, 1, 0, 0},
    {1, 1544, 2500, F16, BERTH_GLU_HALVES, BERTH_ACT_GELU_TANH, 1, 0, 0},
    {1, 1032, 33, F32, BERTH_GLU_MUL, BERTH_ACT_SILU, 1, 0, 1},
    {1, 6152, 301, BF16, BERTH_GLU_MUL, BERTH_ACT_GELU_TANH, 1, 0, 2},
    {1, 1536, 256, BF16, BERTH_GLU_MUL, BERTH_ACT_GELU_TANH, 0, 0, 2},
    {1, 1536, 256, BF16, BERTH_GLU_MUL, BERTH_ACT_GELU_TANH, 0, 0, 1},
    {4, 264, 37, BF16, BERTH_GLU_MUL, BERTH_ACT_SILU, 0, 1, 0},
    {8, 77, 33, F16, BERTH_GLU_MUL, BERTH_ACT_GELU_TANH, 0, 0, 2},
    {32, 1536, 256, BF16, BERTH_GLU_MUL, BERTH_ACT_GELU_TANH, 0, 0, 2},
    {100, 264, 37, F32, BERTH_GLU_MUL, BERTH_ACT_SILU, 0, 1, 1},
};
#define N_MM_GLU_CASES ((int)(sizeof mm_glu_cases / sizeof mm_glu_cases[0]))

static void mm_glu_run(const struct mm_glu_case *c)
{
    const int64_t M = c->M, K = c->K, N = c->N, NZ = c->mode == BERTH_GLU_HALVES ? 2 * N : N;
    char what[192];
    snprintf(what, sizeof what, "matmul glu %s act=%d M=%lld K=%lld N=%lld w=%s bias=%d norm=%d up_view=%d",
             c->mode == BERTH_GLU_HALVES ? "HALVES" : "MUL", c->act, (long long)M, (long long)K, (long long)N,
             hx_dtype_name(c->wdt), c->bias, c->norm, c->up_view);
    struct hx_tensor X = hx_new(F32, K, M, 0, 0), W = hx_new(c->wdt, K, NZ, 0, 0), B = hx_new(F32, NZ, 0, 0, 0);
    struct hx_tensor NW = hx_new(BF16, K, 0, 0, 0);
    const int64_t ustride = c->up_view == 2 ? 2 * N + 3 : N;
    struct hx_tensor U = hx_new(F32, ustride, M, 0, 0), Y = hx_new(F32, N, M, 0, 0);
    hx_rand(&X, -1.0f, 1.0f);
    hx_rand(&W, -1.0f, 1.0f);
    hx_rand(&B, -1.0f, 1.0f);
    hx_rand(&NW, -1.0f, 1.0f);
    hx_rand(&U, -1.0f, 1.0f);
    if (c->up_view == 1)
        hx_rand(&Y, -1.0f, 1.0f); /* y is the up operand: it starts as data, not poison */
    berth_matmul_params p[2];
    for (int s = 0; s < 2; s++) {
        memset(&p[s], 0, sizeof p[s]);
        p[s].struct_size = sizeof p[s];
        p[s].x = X.t[s];
        p[s].w = W.t[s];
        p[s].y = Y.t[s];
        if (c->bias)
            p[s].bias = B.t[s];
        if (c->norm) {
            p[s].x_norm_mode = BERTH_NORM_W;
            p[s].x_norm_eps = 1e-6f;
            p[s].x_norm_w = NW.t[s];
        }
        p[s].y_glu = c->mode;
        p[s].y_glu_act = c->act;
        if (c->mode == BERTH_GLU_MUL)
            p[s].y_glu_up = c->up_view == 1 ? Y.t[s]
                            : c->up_view == 2 ? hx_view(&U, s, 3, N, M, 1, 1, ustride, ustride * M, ustride * M)
                                              : U.t[s];
    }
    hx_run_both(BERTH_OP_MATMUL, &p[HX_CPU], &p[HX_GPU], what);
    const double scale = sqrt((double)K) * (c->norm ? 3.0 : 1.0);
    if (mm_x_rounded(M, K, c->wdt))
        hx_expect_close(&Y, 1.2e-2 * scale * scale, 0.0, what);
    else
        hx_expect_close(&Y, 2e-5 * scale * scale, 1e-5, what);
    hx_expect_close(&U, 0.0, 0.0, what); /* read only (the view's padding too) */
    hx_free(&X);
    hx_free(&W);
    hx_free(&B);
    hx_free(&NW);
    hx_free(&U);
    hx_free(&Y);
}

START_TEST(test_matmul_glu_epilogue)
{
    mm_glu_run(&mm_glu_cases[_i]);
}
END_TEST

/* ---------------------------------------------------------------------------------------------------------------
 * matmul_skinny.cu's cases: batched decode (M = 2..64) with every feature the kernel folds in — the RMS-norm
 * prologue (W / W_ONE_PLUS / UNIT, bf16 / f16 / f32 norm weight), bias, accumulate, both gated epilogues — at
 * the M bucket edges (2, 5, 8, 9, 16, 17, 24, 33, 48, 64; 65 is cuBLAS's), N short of a tile and past many waves,
 * K tails shorter than a 64-column tile, K split over a cluster (small N, large K; up to 16 blocks at N = 64),
 * unaligned and 3-D x (4-byte x loads; 3-D views need an even M), padded y. In cuda_ops_dense_skinny (BERTH_CUDA_SKINNY=2, bf16 mode) they
 * run on the skinny kernel; elsewhere on the GEMV / cuBLAS, against the same CPU results. Each case without
 * accumulate (and not multiplying into y itself) then runs again on the GPU: the split-K sum is in a fixed order,
 * so the second result must be bitwise the first. Bounds as the plain, prologue and GLU cases above. */
struct sk_case {
    int64_t M, K, N;  /* N outputs (HALVES: w has 2N rows) */
    berth_dtype wdt;
    int bias;         /* 0: none; else 1 + bias dtype (HALVES: ne {2N}) */
    int acc;
    int xview, yview; /* XV_*; yview 1: y rows N + 3 apart */
    int norm;         /* BERTH_NORM_* (W_NONE: no prologue) */
    berth_dtype nwdt; /* norm weight dtype (modes W, W_ONE_PLUS) */
    int glu, act;     /* BERTH_GLU_*, BERTH_ACT_* */
    int up_view;      /* MUL: 0 a separate tensor, 1 y itself, 2 rows of a wider tensor (stride 2N + 3) */
};

#define SK_GELU BERTH_ACT_GELU_TANH
#define SK_SILU BERTH_ACT_SILU
#define SK_HALVES BERTH_GLU_HALVES
#define SK_MUL BERTH_GLU_MUL

static const struct sk_case sk_cases[] = {
    /* plain products at the E2B shapes and odd ones */
    {2, 1536, 2560, BF16, 0, 0, XV_PACKED, 0, 0, BF16, 0, 0, 0},
    {8, 2048, 1536, BF16, 1 + F32, 0, XV_PACKED, 0, 0, BF16, 0, 0, 0},
    {9, 6144, 1536, BF16, 0, 1, XV_PACKED, 0, 0, BF16, 0, 0, 0},
    {33, 1536, 2560, F16, 1 + BF16, 1, XV_PACKED, 0, 0, BF16, 0, 0, 0},
    {64, 12288, 1536, BF16, 0, 0, XV_PACKED, 0, 0, BF16, 0, 0, 0},
    {64, 1536, 4500, BF16, 0, 0, XV_PADDED, 1, 0, BF16, 0, 0, 0},
    {17, 40, 300, BF16, 0, 0, XV_PACKED, 0, 0, BF16, 0, 0, 0},
    {48, 136, 999, F16, 1 + F32, 1, XV_3D, 0, 0, BF16, 0, 0, 0},
    {5, 4096, 64, BF16, 0, 0, XV_PACKED, 0, 0, BF16, 0, 0, 0},
    {24, 264, 40000, BF16, 1 + F32, 0, XV_PACKED, 0, 0, BF16, 0, 0, 0},
    {64, 200, 77, BF16, 0, 1, XV_PADDED, 1, 0, BF16, 0, 0, 0},
    {16, 1032, 129, F16, 0, 0, XV_3D, 1, 0, BF16, 0, 0, 0},
    {65, 264, 100, BF16, 1 + F32, 0, XV_PACKED, 0, 0, BF16, 0, 0, 0},
    /* the RMS-norm prologue */
    {2, 1536, 2560, BF16, 0, 0, XV_PACKED, 0, BERTH_NORM_W, BF16, 0, 0, 0},
    {8, 1536, 2048, BF16, 0, 0, XV_PADDED, 0, BERTH_NORM_W_ONE_PLUS, F32, 0, 0, 0},
    {33, 1032, 513, F16, 0, 0, XV_PACKED, 0, BERTH_NORM_UNIT, BF16, 0, 0, 0},
    {64, 1536, 2560, BF16, 1 + F32, 0, XV_PACKED, 0, BERTH_NORM_W, BF16, 0, 0, 0},
    {10, 520, 100, BF16, 0, 0, XV_3D, 1, BERTH_NORM_W, F16, 0, 0, 0},
    {48, 6144, 256, BF16, 0, 0, XV_PACKED, 0, BERTH_NORM_W, BF16, 0, 0, 0},
    /* the gated epilogue, HALVES (w = [gate | up]) */
    {8, 1536, 6144, BF16, 0, 0, XV_PACKED, 0, 0, BF16, SK_HALVES, SK_GELU, 0},
    {64, 1536, 6144, BF16, 1 + F32, 0, XV_PACKED, 0, 0, BF16, SK_HALVES, SK_GELU, 0},
    {16, 264, 37, F16, 1 + BF16, 0, XV_PACKED, 0, BERTH_NORM_W, BF16, SK_HALVES, SK_SILU, 0},
    {33, 1536, 12288, BF16, 0, 0, XV_PACKED, 0, 0, BF16, SK_HALVES, SK_GELU, 0},
    {2, 2048, 100, BF16, 0, 0, XV_PADDED, 1, 0, BF16, SK_HALVES, SK_GELU, 0},
    /* the gated epilogue, MUL (times y_glu_up) */
    {8, 1536, 256, BF16, 0, 0, XV_PACKED, 0, 0, BF16, SK_MUL, SK_GELU, 2},
    {64, 1536, 256, BF16, 0, 0, XV_PACKED, 0, 0, BF16, SK_MUL, SK_GELU, 1},
    {5, 264, 37, F16, 1 + F32, 0, XV_PACKED, 0, BERTH_NORM_UNIT, BF16, SK_MUL, SK_SILU, 0},
    {48, 1536, 300, BF16, 0, 0, XV_PADDED, 0, 0, BF16, SK_MUL, SK_GELU, 2},
    /* 9..32 rows, big N without a K split (the XH instances' unsplit 32-row tiles over several waves, as Gemma 4's
     * gate|up at 32 sequences), K of E2B / E4B / odd tails */
    {32, 1536, 6144, BF16, 0, 0, XV_PACKED, 0, 0, BF16, SK_HALVES, SK_GELU, 0},
    {17, 1536, 12288, BF16, 1 + F32, 0, XV_PADDED, 1, 0, BF16, SK_HALVES, SK_GELU, 0},
    {32, 2560, 10240, F16, 0, 1, XV_PACKED, 0, 0, BF16, 0, 0, 0},
    {10, 1000, 9000, BF16, 0, 0, XV_3D, 0, 0, BF16, 0, 0, 0},
    {24, 520, 9000, BF16, 0, 0, XV_PACKED, 0, 0, BF16, SK_MUL, SK_GELU, 2},
    {32, 4096, 9000, BF16, 0, 0, XV_PACKED, 0, 0, BF16, 0, 0, 0},
};
#define N_SK_CASES ((int)(sizeof sk_cases / sizeof sk_cases[0]))

static void sk_run(const struct sk_case *c)
{
    const int64_t M = c->M, K = c->K, N = c->N, NZ = c->glu == BERTH_GLU_HALVES ? 2 * N : N;
    char what[224];
    snprintf(what, sizeof what,
             "matmul (skinny case) M=%lld K=%lld N=%lld w=%s bias=%s acc=%d xview=%d yview=%d norm=%s(%s) glu=%d "
             "act=%d up_view=%d",
             (long long)M, (long long)K, (long long)N, hx_dtype_name(c->wdt),
             c->bias ? hx_dtype_name((berth_dtype)(c->bias - 1)) : "none", c->acc, c->xview, c->yview,
             wmode_names[c->norm], hx_dtype_name(c->nwdt), c->glu, c->act, c->up_view);
    struct hx_tensor X = c->xview == XV_PACKED   ? hx_new(F32, K, M, 0, 0)
                         : c->xview == XV_PADDED ? hx_new(F32, K + 7, M, 0, 0)
                                                 : hx_new(F32, 2 * K + 5, M / 2, 0, 0);
    hx_rand(&X, -1.0f, 1.0f);
    struct hx_tensor W = hx_new(c->wdt, K, NZ, 0, 0), NW = hx_new(c->nwdt, K, 0, 0, 0);
    hx_rand(&W, -1.0f, 1.0f);
    hx_rand(&NW, -1.0f, 1.0f);
    struct hx_tensor B;
    memset(&B, 0, sizeof B);
    if (c->bias) {
        B = hx_new((berth_dtype)(c->bias - 1), NZ, 0, 0, 0);
        hx_rand(&B, -1.0f, 1.0f);
    }
    const int64_t ldy = c->yview ? N + 3 : N, ldu = c->up_view == 2 ? 2 * N + 3 : N;
    struct hx_tensor Y = hx_new(F32, ldy, M, 0, 0), U = hx_new(F32, ldu, M, 0, 0);
    hx_rand(&U, -1.0f, 1.0f);
    if (c->acc || c->yview || c->up_view == 1)
        hx_rand(&Y, -1.0f, 1.0f); /* read (accumulate, the up operand) or partly outside the view */

    berth_matmul_params p[2];
    for (int s = 0; s < 2; s++) {
        memset(&p[s], 0, sizeof p[s]);
        p[s].struct_size = sizeof p[s];
        p[s].accumulate = c->acc;
        if (c->xview == XV_PACKED)
            p[s].x = X.t[s];
        else if (c->xview == XV_PADDED)
            p[s].x = hx_view(&X, s, 3, K, M, 1, 1, K + 7, (K + 7) * M, (K + 7) * M);
        else
            p[s].x = hx_view(&X, s, 0, K, 2, M / 2, 1, K, 2 * K + 5, (2 * K + 5) * (M / 2));
        p[s].w = W.t[s];
        if (c->bias)
            p[s].bias = B.t[s];
        p[s].y = c->yview ? hx_view(&Y, s, 0, N, M, 1, 1, ldy, ldy * M, ldy * M) : Y.t[s];
        if (c->norm != BERTH_NORM_W_NONE) {
            p[s].x_norm_mode = c->norm;
            p[s].x_norm_eps = 1e-6f;
            if (c->norm != BERTH_NORM_UNIT)
                p[s].x_norm_w = NW.t[s];
        }
        if (c->glu != BERTH_GLU_NONE) {
            p[s].y_glu = c->glu;
            p[s].y_glu_act = c->act;
        }
        if (c->glu == BERTH_GLU_MUL)
            p[s].y_glu_up = c->up_view == 1 ? p[s].y
                            : c->up_view == 2 ? hx_view(&U, s, 3, N, M, 1, 1, ldu, ldu * M, ldu * M)
                                              : U.t[s];
    }
    hx_run_both(BERTH_OP_MATMUL, &p[HX_CPU], &p[HX_GPU], what);

    /* the normalised rows have rms about 1 (x's about 0.58), each GLU output is a product of two sums */
    double scale = sqrt((double)K) * (c->norm != BERTH_NORM_W_NONE ? 2.0 : 1.0);
    if (c->glu != BERTH_GLU_NONE)
        scale *= sqrt((double)K);
    if (mm_x_rounded(M, K, c->wdt))
        hx_expect_close(&Y, 6e-3 * scale, 0.0, what);
    else
        hx_expect_close(&Y, 1e-5 * scale, 1e-5, what);
    hx_expect_close(&X, 0.0, 0.0, what); /* read only */
    hx_expect_close(&U, 0.0, 0.0, what);

    if (!c->acc && c->up_view != 1) { /* the same product again: bitwise the same result */
        float *first = malloc(Y.bytes), *again = malloc(Y.bytes);
        ck_assert(first && again);
        hx_get(&Y, HX_GPU, first);
        ck_assert_msg(hx_op(HX_GPU, BERTH_OP_MATMUL, &p[HX_GPU]) == BERTH_OK, "%s: rerun: %s", what, hx_last_error);
        hx_sync();
        hx_get(&Y, HX_GPU, again);
        ck_assert_msg(memcmp(first, again, Y.bytes) == 0, "%s: a second run differs from the first (seed %llu)",
                      what, (unsigned long long)hx->seed);
        free(first);
        free(again);
    }
    hx_free(&X);
    hx_free(&W);
    hx_free(&NW);
    if (c->bias)
        hx_free(&B);
    hx_free(&Y);
    hx_free(&U);
}

START_TEST(test_matmul_skinny)
{
    sk_run(&sk_cases[_i]);
}
END_TEST

static const char *const rmode_names[] = {"NONE", "ADD_AFTER", "ADD_BEFORE"};

/* alias: y is x itself. strided: x (and y, residual) are rows of n inside rows of n + 9, 3-D. */
static void rms_case(int wmode, int rmode, int64_t n, int64_t rows, berth_dtype wdt, bool alias, bool strided)
{
    char what[128];
    snprintf(what, sizeof what, "rms_norm weight=%s resid=%s n=%lld rows=%lld w=%s%s%s", wmode_names[wmode],
             rmode_names[rmode], (long long)n, (long long)rows, hx_dtype_name(wdt), alias ? " y=x" : "",
             strided ? " strided" : "");
    const int64_t pad = strided ? 9 : 0;
    struct hx_tensor X = hx_new(F32, n + pad, rows, 0, 0), R = hx_new(F32, n + pad, rows, 0, 0);
    struct hx_tensor Y = hx_new(F32, n + pad, rows, 0, 0), Wt = hx_new(wdt, n, 0, 0, 0);
    hx_rand(&X, -2.0f, 2.0f);
    hx_rand(&R, -1.0f, 1.0f);
    hx_rand(&Y, -1.0f, 1.0f);
    hx_rand(&Wt, -1.0f, 1.0f);
    berth_rms_norm_params p[2];
    for (int s = 0; s < 2; s++) {
        memset(&p[s], 0, sizeof p[s]);
        p[s].struct_size = sizeof p[s];
        p[s].weight_mode = wmode;
        p[s].resid_mode = rmode;
        p[s].eps = 1e-6f;
        if (strided) { /* rows as {n, 2, rows/2}: the second dim's stride skips the padding */
            p[s].x = hx_view(&X, s, 4, n, 2, rows / 2, 1, n + pad, 2 * (n + pad), rows * (n + pad));
            p[s].residual = hx_view(&R, s, 4, n, 2, rows / 2, 1, n + pad, 2 * (n + pad), rows * (n + pad));
            p[s].y = hx_view(&Y, s, 4, n, 2, rows / 2, 1, n + pad, 2 * (n + pad), rows * (n + pad));
        } else {
            p[s].x = X.t[s];
            p[s].residual = R.t[s];
            p[s].y = Y.t[s];
        }
        if (alias)
            p[s].y = p[s].x;
        if (wmode == BERTH_NORM_W || wmode == BERTH_NORM_W_ONE_PLUS)
            p[s].w = Wt.t[s];
        if (rmode == BERTH_RESID_NONE)
            memset(&p[s].residual, 0, sizeof p[s].residual);
    }
    hx_run_both(BERTH_OP_RMS_NORM, &p[HX_CPU], &p[HX_GPU], what);
    hx_expect_close(alias ? &X : &Y, EW_ATOL, EW_RTOL, what);
    if (rmode == BERTH_RESID_ADD_BEFORE)
        hx_expect_close(&R, EW_ATOL, EW_RTOL, what);
    hx_free(&X);
    hx_free(&R);
    hx_free(&Y);
    hx_free(&Wt);
}

START_TEST(test_rms_norm_modes)
{
    /* _i: weight mode x residual mode; each at a warp-per-row size and a block-per-row size */
    const int wmode = _i / 3, rmode = _i % 3;
    const berth_dtype wdt = wmode == BERTH_NORM_W_ONE_PLUS ? BF16 : F32;
    rms_case(wmode, rmode, 96, 5, wdt, false, false);
    rms_case(wmode, rmode, 1536, 3, wdt, false, false);
}
END_TEST

START_TEST(test_rms_norm_alias_strided)
{
    for (int rmode = 0; rmode < 3; rmode++) {
        rms_case(BERTH_NORM_W_ONE_PLUS, rmode, 1536, 4, BF16, true, false);
        rms_case(BERTH_NORM_W, rmode, 200, 8, F16, true, false);
        rms_case(BERTH_NORM_W, rmode, 2048, 6, BF16, false, true);
        rms_case(BERTH_NORM_UNIT, rmode, 256, 10, F32, true, true);
    }
    rms_case(BERTH_NORM_W, BERTH_RESID_ADD_BEFORE, 16384, 3, BF16, false, false); /* 1024-thread blocks */
    rms_case(BERTH_NORM_W, BERTH_RESID_NONE, 1, 33, F32, false, false);
}
END_TEST

/* ---------------------------------------------------------------------------------------------------------------
 * layer_norm */

#define LN_ATOL 2e-5
static void layer_norm_case(int with_w, int with_b, int rmode, int64_t n, int64_t rows, bool alias)
{
    char what[128];
    snprintf(what, sizeof what, "layer_norm w=%d b=%d resid=%s n=%lld rows=%lld%s", with_w, with_b,
             rmode_names[rmode], (long long)n, (long long)rows, alias ? " y=x" : "");
    struct hx_tensor X = hx_new(F32, n, rows, 0, 0), R = hx_new(F32, n, rows, 0, 0), Y = hx_new(F32, n, rows, 0, 0);
    struct hx_tensor Wt = hx_new(BF16, n, 0, 0, 0), Bt = hx_new(F32, n, 0, 0, 0);
    hx_rand(&X, -1.0f, 3.0f); /* a mean away from 0 */
    hx_rand(&R, -1.0f, 1.0f);
    hx_rand(&Wt, -1.0f, 1.0f);
    hx_rand(&Bt, -1.0f, 1.0f);
    berth_layer_norm_params p[2];
    for (int s = 0; s < 2; s++) {
        memset(&p[s], 0, sizeof p[s]);
        p[s].struct_size = sizeof p[s];
        p[s].resid_mode = rmode;
        p[s].eps = 1e-5f;
        p[s].x = X.t[s];
        p[s].y = alias ? X.t[s] : Y.t[s];
        if (rmode != BERTH_RESID_NONE)
            p[s].residual = R.t[s];
        if (with_w)
            p[s].w = Wt.t[s];
        if (with_b)
            p[s].b = Bt.t[s];
    }
    hx_run_both(BERTH_OP_LAYER_NORM, &p[HX_CPU], &p[HX_GPU], what);
    /* (x - mean) / sd over thousands of elements: the two backends sum in different orders, and a bias near 1
     * cancels against normalised values near -1, so the absolute error is that of the normalised value. */
    hx_expect_close(alias ? &X : &Y, LN_ATOL, EW_RTOL, what);
    if (rmode == BERTH_RESID_ADD_BEFORE)
        hx_expect_close(&R, LN_ATOL, EW_RTOL, what);
    hx_free(&X);
    hx_free(&R);
    hx_free(&Y);
    hx_free(&Wt);
    hx_free(&Bt);
}

START_TEST(test_layer_norm)
{
    for (int rmode = 0; rmode < 3; rmode++) {
        layer_norm_case(1, 1, rmode, 96, 5, false);
        layer_norm_case(1, 0, rmode, 1536, 3, false);
        layer_norm_case(0, 0, rmode, 1024, 4, false);
        layer_norm_case(0, 1, rmode, 5000, 2, true);
    }
}
END_TEST

/* ---------------------------------------------------------------------------------------------------------------
 * gated_rms_norm */

static void gated_case(int act, int64_t n, int64_t rows, berth_dtype wdt)
{
    char what[96];
    snprintf(what, sizeof what, "gated_rms_norm act=%d n=%lld rows=%lld w=%s", act, (long long)n, (long long)rows,
             hx_dtype_name(wdt));
    struct hx_tensor X = hx_new(F32, n, rows, 0, 0), Z = hx_new(F32, n, rows, 0, 0), Y = hx_new(F32, n, rows, 0, 0);
    struct hx_tensor Wt = hx_new(wdt, n, 0, 0, 0);
    hx_rand(&X, -2.0f, 2.0f);
    hx_rand(&Z, -4.0f, 4.0f);
    hx_rand(&Wt, -1.0f, 1.0f);
    berth_gated_rms_norm_params p[2];
    for (int s = 0; s < 2; s++) {
        memset(&p[s], 0, sizeof p[s]);
        p[s].struct_size = sizeof p[s];
        p[s].act = act;
        p[s].eps = 1e-6f;
        p[s].x = X.t[s];
        p[s].z = Z.t[s];
        p[s].w = Wt.t[s];
        p[s].y = Y.t[s];
    }
    hx_run_both(BERTH_OP_GATED_RMS_NORM, &p[HX_CPU], &p[HX_GPU], what);
    hx_expect_close(&Y, EW_ATOL, EW_RTOL, what);
    hx_free(&X);
    hx_free(&Z);
    hx_free(&Y);
    hx_free(&Wt);
}

START_TEST(test_gated_rms_norm)
{
    gated_case(BERTH_ACT_SILU, 128, 6, F32);
    gated_case(BERTH_ACT_SILU, 2048, 3, BF16);
    gated_case(BERTH_ACT_SIGMOID, 77, 4, F16);
}
END_TEST

/* ---------------------------------------------------------------------------------------------------------------
 * unary */

static void unary_case(int act, float in_scale, float out_scale, float lo, float hi, int64_t n, int64_t rows,
                       bool alias, bool strided)
{
    char what[128];
    snprintf(what, sizeof what, "unary act=%d in=%g out=%g n=%lld rows=%lld%s%s", act, (double)in_scale,
             (double)out_scale, (long long)n, (long long)rows, alias ? " y=x" : "", strided ? " strided" : "");
    const int64_t pad = strided ? 5 : 0;
    struct hx_tensor X = hx_new(F32, n + pad, rows, 0, 0), Y = hx_new(F32, n, rows, 0, 0);
    hx_rand(&X, lo, hi);
    berth_unary_params p[2];
    for (int s = 0; s < 2; s++) {
        memset(&p[s], 0, sizeof p[s]);
        p[s].struct_size = sizeof p[s];
        p[s].act = act;
        p[s].in_scale = in_scale;
        p[s].out_scale = out_scale;
        p[s].x = strided ? hx_view(&X, s, 1, n, 3, rows / 3, 1, n + pad, 3 * (n + pad), rows * (n + pad)) : X.t[s];
        p[s].y = alias ? p[s].x : strided ? hx_view(&Y, s, 0, n, 3, rows / 3, 1, n, 3 * n, rows * n) : Y.t[s];
    }
    hx_run_both(BERTH_OP_UNARY, &p[HX_CPU], &p[HX_GPU], what);
    if (!alias)
        hx_expect_close(&Y, EW_ATOL, EW_RTOL, what);
    hx_expect_close(&X, EW_ATOL, EW_RTOL, what); /* unchanged, or the aliased result */
    hx_free(&X);
    hx_free(&Y);
}

START_TEST(test_unary)
{
    for (int act = BERTH_ACT_IDENTITY; act <= BERTH_ACT_EXP; act++) {
        unary_case(act, 0.7f, 1.3f, -4.0f, 4.0f, 300, 7, false, false);
        unary_case(act, 1.0f, 1.0f, -4.0f, 4.0f, 1, 37, false, false);
    }
    /* logit softcap in place: 30 tanh(x / 30) */
    unary_case(BERTH_ACT_TANH, 1.0f / 30.0f, 30.0f, -60.0f, 60.0f, 1000, 3, true, false);
    unary_case(BERTH_ACT_GELU_TANH, 1.0f, 1.0f, -4.0f, 4.0f, 64, 6, false, true);
    unary_case(BERTH_ACT_SILU, 0.5f, 2.0f, -4.0f, 4.0f, 64, 9, true, true);
}
END_TEST

/* ---------------------------------------------------------------------------------------------------------------
 * glu: gate and up are the two halves of one fused projection output, as the models use them. */

static void glu_case(int act, int64_t D, int64_t T, bool alias)
{
    char what[96];
    snprintf(what, sizeof what, "glu act=%d D=%lld T=%lld%s", act, (long long)D, (long long)T,
             alias ? " y=gate" : "");
    struct hx_tensor F = hx_new(F32, 2 * D, T, 0, 0), Y = hx_new(F32, D, T, 0, 0);
    hx_rand(&F, -4.0f, 4.0f);
    berth_glu_params p[2];
    for (int s = 0; s < 2; s++) {
        memset(&p[s], 0, sizeof p[s]);
        p[s].struct_size = sizeof p[s];
        p[s].act = act;
        p[s].gate = hx_view(&F, s, 0, D, T, 1, 1, 2 * D, 2 * D * T, 2 * D * T);
        p[s].up = hx_view(&F, s, D, D, T, 1, 1, 2 * D, 2 * D * T, 2 * D * T);
        p[s].y = alias ? p[s].gate : Y.t[s];
    }
    hx_run_both(BERTH_OP_GLU, &p[HX_CPU], &p[HX_GPU], what);
    if (!alias)
        hx_expect_close(&Y, EW_ATOL, EW_RTOL, what);
    hx_expect_close(&F, EW_ATOL, EW_RTOL, what);
    hx_free(&F);
    hx_free(&Y);
}

START_TEST(test_glu)
{
    for (int act = BERTH_ACT_IDENTITY; act <= BERTH_ACT_EXP; act++)
        glu_case(act, 100, 3, false);
    glu_case(BERTH_ACT_GELU_TANH, 6144, 2, false);
    glu_case(BERTH_ACT_SILU, 333, 5, true);
}
END_TEST

/* ---------------------------------------------------------------------------------------------------------------
 * binary: a ne {48, 4, 5}; b broadcast along the dims where its ne is 1 */

static void binary_case(int op, berth_dtype bdt, int64_t b0, int64_t b1, int64_t b2, float scale, bool alias)
{
    const int64_t D = 48, H = 4, T = 5;
    char what[96];
    snprintf(what, sizeof what, "binary op=%d b=%s {%lld,%lld,%lld} scale=%g%s", op, hx_dtype_name(bdt), (long long)b0,
             (long long)b1, (long long)b2, (double)scale, alias ? " y=a" : "");
    struct hx_tensor A = hx_new(F32, D, H, T, 0), Bt = hx_new(bdt, b0, b1, b2, 0), Y = hx_new(F32, D, H, T, 0);
    hx_rand(&A, -2.0f, 2.0f);
    hx_rand(&Bt, -2.0f, 2.0f);
    berth_binary_params p[2];
    for (int s = 0; s < 2; s++) {
        memset(&p[s], 0, sizeof p[s]);
        p[s].struct_size = sizeof p[s];
        p[s].op = op;
        p[s].scale = scale;
        p[s].a = A.t[s];
        p[s].b = Bt.t[s];
        p[s].y = alias ? A.t[s] : Y.t[s];
    }
    hx_run_both(BERTH_OP_BINARY, &p[HX_CPU], &p[HX_GPU], what);
    hx_expect_close(alias ? &A : &Y, EW_ATOL, EW_RTOL, what);
    hx_free(&A);
    hx_free(&Bt);
    hx_free(&Y);
}

START_TEST(test_binary)
{
    for (int op = BERTH_BINARY_ADD; op <= BERTH_BINARY_MUL; op++) {
        binary_case(op, F32, 48, 1, 1, 0.5f, false);  /* per feature */
        binary_case(op, BF16, 1, 4, 1, 1.0f, false);  /* per head */
        binary_case(op, F32, 1, 1, 1, -2.0f, false);  /* scalar */
        binary_case(op, F16, 48, 1, 5, 0.25f, false); /* per token and feature */
        binary_case(op, F32, 48, 4, 5, 1.0f, true);   /* full shape, in place */
        binary_case(op, BF16, 1, 4, 5, 3.0f, true);
    }
}
END_TEST

/* ---------------------------------------------------------------------------------------------------------------
 * copy: x {40, 3, 6} (optionally a view with padded rows) into a view of a {40, 5, 6} tensor (KV-cache-like) */

static void copy_case(berth_dtype xdt, berth_dtype ydt, bool x_strided)
{
    const int64_t D = 40, H = 3, T = 6, HY = 5;
    char what[96];
    snprintf(what, sizeof what, "copy %s -> %s%s", hx_dtype_name(xdt), hx_dtype_name(ydt), x_strided ? " (strided x)" : "");
    struct hx_tensor X = hx_new(xdt, x_strided ? D + 3 : D, H, T, 0), Y = hx_new(ydt, D, HY, T, 0);
    hx_rand(&X, -3.0f, 3.0f);
    hx_rand(&Y, -1.0f, 1.0f); /* the rows outside the view must stay as they are */
    berth_copy_params p[2];
    for (int s = 0; s < 2; s++) {
        memset(&p[s], 0, sizeof p[s]);
        p[s].struct_size = sizeof p[s];
        p[s].x = x_strided ? hx_view(&X, s, 2, D, H, T, 1, D + 3, (D + 3) * H, (D + 3) * H * T) : X.t[s];
        p[s].y = hx_view(&Y, s, D, D, H, T, 1, D, D * HY, D * HY * T); /* heads 1..3 of 5 */
    }
    hx_run_both(BERTH_OP_COPY, &p[HX_CPU], &p[HX_GPU], what);
    hx_expect_equal(&Y, what);
    hx_free(&X);
    hx_free(&Y);
}

START_TEST(test_copy)
{
    copy_case(F32, BF16, false);
    copy_case(F32, F16, true);
    copy_case(BF16, F32, false);
    copy_case(F16, F32, true);
    copy_case(F16, BF16, false);
    copy_case(BF16, F16, false);
    copy_case(F32, F32, true);
    copy_case(BF16, BF16, true);
}
END_TEST

/* ---------------------------------------------------------------------------------------------------------------
 * rope: x {d, H, T}; positions up to 8000 (angles of thousands of radians); freqs 10000^(-2j/d) */

static void rope_case(int mode, int64_t d, int64_t H, int64_t T, int32_t off, int32_t np, bool in_place,
                      bool strided)
{
    char what[128];
    snprintf(what, sizeof what, "rope %s d=%lld H=%lld T=%lld pair_offset=%d n_pairs=%d%s%s",
             mode == BERTH_ROPE_HALF ? "HALF" : "INTERLEAVED", (long long)d, (long long)H, (long long)T, off, np,
             in_place ? " in place" : "", strided ? " strided" : "");
    const int64_t heads_x = strided ? H + 2 : H; /* strided: q inside a fused {d, H + 2, T} projection */
    struct hx_tensor X = hx_new(F32, d, heads_x, T, 0), Y = hx_new(F32, d, H, T, 0), P = hx_new(I32, T, 0, 0, 0);
    struct hx_tensor Fq = hx_new(F32, np > 0 ? np : 1, 0, 0, 0);
    hx_rand(&X, -1.0f, 1.0f);
    hx_rand_int(&P, 0, 8000);
    float *fr = malloc((size_t)(np > 0 ? np : 1) * sizeof *fr);
    ck_assert_ptr_nonnull(fr);
    for (int32_t j = 0; j < (np > 0 ? np : 1); j++)
        fr[j] = powf(10000.0f, -2.0f * (float)j / (float)d);
    hx_set(&Fq, fr);
    free(fr);
    berth_rope_params p[2];
    for (int s = 0; s < 2; s++) {
        memset(&p[s], 0, sizeof p[s]);
        p[s].struct_size = sizeof p[s];
        p[s].mode = mode;
        p[s].pair_offset = off;
        p[s].n_pairs = np;
        p[s].x = strided ? hx_view(&X, s, d, d, H, T, 1, d, d * heads_x, d * heads_x * T) : X.t[s];
        p[s].y = in_place ? p[s].x : Y.t[s];
        p[s].positions = P.t[s];
        if (np > 0)
            p[s].freqs = Fq.t[s];
    }
    hx_run_both(BERTH_OP_ROPE, &p[HX_CPU], &p[HX_GPU], what);
    if (!in_place)
        hx_expect_close(&Y, EW_ATOL, EW_RTOL, what);
    hx_expect_close(&X, EW_ATOL, EW_RTOL, what);
    hx_free(&X);
    hx_free(&Y);
    hx_free(&P);
    hx_free(&Fq);
}

START_TEST(test_rope)
{
    rope_case(BERTH_ROPE_HALF, 64, 3, 5, 32, 16, false, false);    /* n_pairs < d/2 */
    rope_case(BERTH_ROPE_HALF, 512, 2, 3, 256, 64, false, false);  /* Gemma 4 full-attention layers */
    rope_case(BERTH_ROPE_HALF, 256, 4, 2, 32, 32, false, false);   /* Qwen3.5 partial rotary */
    rope_case(BERTH_ROPE_HALF, 256, 8, 7, 128, 128, false, true);  /* full rotary, q inside fused qkv */
    rope_case(BERTH_ROPE_HALF, 64, 3, 4, 32, 0, false, false);     /* nothing rotates: a copy */
    rope_case(BERTH_ROPE_HALF, 64, 3, 4, 40, 20, true, false);     /* in place, unrotated middle and tail */
    rope_case(BERTH_ROPE_INTERLEAVED, 64, 3, 5, 0, 20, false, false);
    rope_case(BERTH_ROPE_INTERLEAVED, 64, 2, 3, 0, 32, true, false);
    rope_case(BERTH_ROPE_INTERLEAVED, 96, 2, 6, 0, 17, false, true);
}
END_TEST

/* rms_norm with the RoPE fields (q-norm + rotation in one op) against the CPU's same fused op, and out_scale. */
static void rms_rope_case(int rope_mode, int64_t d, int64_t H, int64_t T, int32_t off, int32_t np, int wmode,
                          bool in_place, bool strided)
{
    char what[160];
    snprintf(what, sizeof what, "rms_norm+rope %s d=%lld H=%lld T=%lld off=%d np=%d weight=%s%s%s",
             rope_mode == BERTH_ROPE_HALF ? "HALF" : "INTERLEAVED", (long long)d, (long long)H, (long long)T, off, np,
             wmode_names[wmode], in_place ? " in place" : "", strided ? " strided" : "");
    const int64_t heads_x = strided ? H + 2 : H;
    struct hx_tensor X = hx_new(F32, d, heads_x, T, 0), Y = hx_new(F32, d, H, T, 0), P = hx_new(I32, T, 0, 0, 0);
    struct hx_tensor Fq = hx_new(F32, np, 0, 0, 0), Wt = hx_new(BF16, d, 0, 0, 0);
    hx_rand(&X, -2.0f, 2.0f);
    hx_rand(&Wt, -1.0f, 1.0f);
    hx_rand_int(&P, 0, 8000);
    float *fr = malloc((size_t)np * sizeof *fr);
    ck_assert_ptr_nonnull(fr);
    for (int32_t j = 0; j < np; j++)
        fr[j] = powf(10000.0f, -2.0f * (float)j / (float)d);
    hx_set(&Fq, fr);
    free(fr);
    berth_rms_norm_params p[2];
    for (int s = 0; s < 2; s++) {
        memset(&p[s], 0, sizeof p[s]);
        p[s].struct_size = sizeof p[s];
        p[s].weight_mode = wmode;
        p[s].eps = 1e-6f;
        p[s].x = strided ? hx_view(&X, s, d, d, H, T, 1, d, d * heads_x, d * heads_x * T) : X.t[s];
        p[s].y = in_place ? p[s].x : Y.t[s];
        if (wmode == BERTH_NORM_W || wmode == BERTH_NORM_W_ONE_PLUS)
            p[s].w = Wt.t[s];
        p[s].rope_mode = rope_mode;
        p[s].rope_pair_offset = off;
        p[s].rope_n_pairs = np;
        p[s].rope_positions = P.t[s];
        p[s].rope_freqs = Fq.t[s];
    }
    hx_run_both(BERTH_OP_RMS_NORM, &p[HX_CPU], &p[HX_GPU], what);
    if (!in_place)
        hx_expect_close(&Y, EW_ATOL, EW_RTOL, what);
    hx_expect_close(&X, EW_ATOL, EW_RTOL, what);
    hx_free(&X);
    hx_free(&Y);
    hx_free(&P);
    hx_free(&Fq);
    hx_free(&Wt);
}

START_TEST(test_rms_norm_rope)
{
    rms_rope_case(BERTH_ROPE_HALF, 256, 8, 1, 128, 128, BERTH_NORM_W, true, true);    /* Gemma 4 sliding, decode */
    rms_rope_case(BERTH_ROPE_HALF, 256, 8, 7, 128, 128, BERTH_NORM_W, true, true);    /* ... prefill, in fused qkv */
    rms_rope_case(BERTH_ROPE_HALF, 512, 8, 3, 256, 64, BERTH_NORM_W, true, true);     /* Gemma 4 full layers */
    rms_rope_case(BERTH_ROPE_HALF, 256, 4, 2, 32, 32, BERTH_NORM_W_ONE_PLUS, false, false); /* partial rotary */
    rms_rope_case(BERTH_ROPE_HALF, 64, 3, 4, 40, 20, BERTH_NORM_UNIT, true, false);   /* unrotated middle, tail */
    rms_rope_case(BERTH_ROPE_INTERLEAVED, 96, 2, 6, 0, 17, BERTH_NORM_W, false, true);
    rms_rope_case(BERTH_ROPE_INTERLEAVED, 64, 2, 3, 0, 32, BERTH_NORM_W_NONE, true, false);
    rms_rope_case(BERTH_ROPE_HALF, 1000, 3, 20, 500, 250, BERTH_NORM_W, false, false); /* 60 rows, 8 per block */
    rms_rope_case(BERTH_ROPE_HALF, 256, 8, 130, 128, 128, BERTH_NORM_W, true, true); /* 130 tokens: a warp per row */
    rms_rope_case(BERTH_ROPE_INTERLEAVED, 96, 6, 200, 0, 17, BERTH_NORM_W_ONE_PLUS, false, false);
}
END_TEST

/* out_scale on both rms kernels (vector rows of 1536, general rows of 77) and every residual mode. */
START_TEST(test_rms_norm_out_scale)
{
    for (int rmode = 0; rmode < 3; rmode++)
        for (int k = 0; k < 2; k++) {
            const int64_t n = k ? 77 : 1536, rows = 5;
            char what[96];
            snprintf(what, sizeof what, "rms_norm out_scale 0.37 resid=%s n=%lld", rmode_names[rmode], (long long)n);
            struct hx_tensor X = hx_new(F32, n, rows, 0, 0), R = hx_new(F32, n, rows, 0, 0);
            struct hx_tensor Y = hx_new(F32, n, rows, 0, 0), Wt = hx_new(BF16, n, 0, 0, 0);
            hx_rand(&X, -2.0f, 2.0f);
            hx_rand(&R, -1.0f, 1.0f);
            hx_rand(&Wt, -1.0f, 1.0f);
            berth_rms_norm_params p[2];
            for (int s = 0; s < 2; s++) {
                memset(&p[s], 0, sizeof p[s]);
                p[s].struct_size = sizeof p[s];
                p[s].weight_mode = BERTH_NORM_W;
                p[s].resid_mode = rmode;
                p[s].eps = 1e-6f;
                p[s].x = X.t[s];
                p[s].y = Y.t[s];
                p[s].w = Wt.t[s];
                if (rmode != BERTH_RESID_NONE)
                    p[s].residual = R.t[s];
                p[s].out_scale = 0.37f;
            }
            hx_run_both(BERTH_OP_RMS_NORM, &p[HX_CPU], &p[HX_GPU], what);
            hx_expect_close(&Y, EW_ATOL, EW_RTOL, what);
            hx_expect_close(&R, EW_ATOL, EW_RTOL, what);
            hx_free(&X);
            hx_free(&R);
            hx_free(&Y);
            hx_free(&Wt);
        }
}
END_TEST

/* The second output y2 = RMSNorm(y) * w2 on every rms kernel shape (vector rows: 256 a warp each, 1536 a block
 * each; general rows: 77 a warp each, 1030 a block each, two block reductions per row), every residual mode and
 * y2 weight mode, with out_scale. */
START_TEST(test_rms_norm_second_output)
{
    static const int64_t sizes[4] = {256, 1536, 77, 1030};
    for (int rmode = 0; rmode < 3; rmode++)
        for (int wm2 = 0; wm2 < 4; wm2++)
            for (int k = 0; k < 4; k++) {
                const int64_t n = sizes[k], rows = 5;
                char what[112];
                snprintf(what, sizeof what, "rms_norm y2 resid=%s y2 weight=%s n=%lld", rmode_names[rmode],
                         wmode_names[wm2], (long long)n);
                struct hx_tensor X = hx_new(F32, n, rows, 0, 0), R = hx_new(F32, n, rows, 0, 0);
                struct hx_tensor Y = hx_new(F32, n, rows, 0, 0), Y2 = hx_new(F32, n, rows, 0, 0);
                struct hx_tensor Wt = hx_new(BF16, n, 0, 0, 0), W2 = hx_new(wm2 == 2 ? BF16 : F32, n, 0, 0, 0);
                hx_rand(&X, -2.0f, 2.0f);
                hx_rand(&R, -1.0f, 1.0f);
                hx_rand(&Wt, -1.0f, 1.0f);
                hx_rand(&W2, -1.0f, 1.0f);
                berth_rms_norm_params p[2];
                for (int s = 0; s < 2; s++) {
                    memset(&p[s], 0, sizeof p[s]);
                    p[s].struct_size = sizeof p[s];
                    p[s].weight_mode = BERTH_NORM_W;
                    p[s].resid_mode = rmode;
                    p[s].eps = 1e-6f;
                    p[s].x = X.t[s];
                    p[s].y = Y.t[s];
                    p[s].w = Wt.t[s];
                    if (rmode != BERTH_RESID_NONE)
                        p[s].residual = R.t[s];
                    p[s].out_scale = rmode == BERTH_RESID_ADD_AFTER ? 0.37f : 0.0f;
                    p[s].y2_weight_mode = wm2;
                    if (wm2 == BERTH_NORM_W || wm2 == BERTH_NORM_W_ONE_PLUS)
                        p[s].y2_w = W2.t[s];
                    p[s].y2 = Y2.t[s];
                }
                hx_run_both(BERTH_OP_RMS_NORM, &p[HX_CPU], &p[HX_GPU], what);
                hx_expect_close(&Y, EW_ATOL, EW_RTOL, what);
                hx_expect_close(&Y2, EW_ATOL, EW_RTOL, what);
                hx_expect_close(&R, EW_ATOL, EW_RTOL, what);
                hx_free(&X);
                hx_free(&R);
                hx_free(&Y);
                hx_free(&Y2);
                hx_free(&Wt);
                hx_free(&W2);
            }
}
END_TEST

/* ---------------------------------------------------------------------------------------------------------------
 * matmul with a trailing norm (y_norm): the product, then an rms_norm whose x is the product's y, as one op. The
 * CUDA backend finishes the norm inside its GEMV kernels (M <= 8, rows norm.cu's fast kernel takes with at most 2
 * float4 per thread: n <= 256 a warp per row, 512 < n <= 2048 a block; plugins/backend-cuda/gemv_norm.cuh) and
 * launches the norm after the product otherwise (M = 9, n = 512 or 2560, odd n, unaligned y rows, the skinny
 * kernel and cuBLAS). Each case runs three times:
 *  1. on both backends, compared: y to the product's bound; the norm's outputs (rms about 1, |y2 weight| <= 2)
 *     to the product's relative error (about 3e-5 in fp32) times a few;
 *  2. the CUDA side again, its outputs poisoned and the residual restored first: the same bytes (the GEMV's
 *     arrival counter must be back at 0, or the norm would be skipped and leave NaN);
 *  3. the CUDA side as two ops (matmul without y_norm, then rms_norm): the same bytes again — the fused norm owns,
 *     sums and rounds every element as norm.cu's kernels do.
 * Outputs start as NaN bytes. */

enum { YN_OWN, YN_INTO_RESIDUAL, YN_INTO_X }; /* norm.y: its own tensor, the residual (in place, as Gemma 4 writes
                                               * its post-norms), or the product's y (the norm's x) */

struct yn_case {
    int64_t M, K, N;
    berth_dtype wdt; /* the product's weights */
    int wmode;       /* the norm: weight mode, weight dtype (also the second output's), residual mode */
    berth_dtype nwdt;
    int rmode;
    float oscale;    /* 0: none */
    int y2mode;      /* -1: no second output */
    int out;         /* YN_* */
    int ypad;        /* the product's y rows N + ypad floats apart (0: packed) */
};

static const struct yn_case yn_cases[] = {
    /* Gemma 4 E2B: o_proj + post_attention_layernorm into the residual with the next pre-norm; down_proj +
     * post_feedforward_layernorm with the layer scalar; the per-layer-input projection + its norm */
    {1, 2048, 1536, BF16, BERTH_NORM_W, F32, BERTH_RESID_ADD_AFTER, 0.0f, BERTH_NORM_W, YN_INTO_RESIDUAL, 0},
    {1, 6144, 1536, BF16, BERTH_NORM_W, BF16, BERTH_RESID_ADD_AFTER, 0.37f, BERTH_NORM_W, YN_INTO_RESIDUAL, 0},
    {1, 256, 1536, BF16, BERTH_NORM_W, BF16, BERTH_RESID_ADD_AFTER, 0.5f, BERTH_NORM_W, YN_INTO_RESIDUAL, 0},
    /* M = 2, 5, 8 (matmul.cu's GEMV; in bf16 mode 5 and 8 with bf16/f16 w are the skinny kernel's), M = 9 */
    {2, 1536, 1536, F32, BERTH_NORM_W_ONE_PLUS, BF16, BERTH_RESID_NONE, 0.0f, -1, YN_OWN, 0},
    {5, 264, 1536, BF16, BERTH_NORM_UNIT, F32, BERTH_RESID_ADD_BEFORE, 0.0f, BERTH_NORM_W_ONE_PLUS, YN_OWN, 0},
    {8, 264, 1536, F16, BERTH_NORM_W, F16, BERTH_RESID_ADD_AFTER, 0.37f, BERTH_NORM_UNIT, YN_INTO_RESIDUAL, 0},
    {8, 1536, 1536, BF16, BERTH_NORM_W, BF16, BERTH_RESID_ADD_AFTER, 0.0f, BERTH_NORM_W, YN_OWN, 0},
    {8, 264, 1536, F32, BERTH_NORM_W_NONE, F32, BERTH_RESID_ADD_BEFORE, 0.37f, BERTH_NORM_W, YN_INTO_RESIDUAL, 0},
    {9, 264, 1536, BF16, BERTH_NORM_W, F32, BERTH_RESID_ADD_AFTER, 0.37f, BERTH_NORM_W, YN_INTO_RESIDUAL, 0},
    /* row lengths: a warp per row (96: 1 float4 per lane, 256: 2), 512 (4 per lane: not fused), a block of 256
     * threads (2048), 2560 (not fused); odd lengths and unaligned rows (norm.cu's general kernel: not fused) */
    {4, 264, 96, F32, BERTH_NORM_W_ONE_PLUS, F32, BERTH_RESID_ADD_AFTER, 0.0f, BERTH_NORM_UNIT, YN_OWN, 0},
    {1, 264, 256, BF16, BERTH_NORM_W, BF16, BERTH_RESID_ADD_BEFORE, 0.0f, BERTH_NORM_W, YN_OWN, 0},
    {3, 264, 256, F16, BERTH_NORM_W, F16, BERTH_RESID_ADD_AFTER, 0.0f, BERTH_NORM_W_NONE, YN_INTO_RESIDUAL, 0},
    {1, 264, 512, BF16, BERTH_NORM_W, F32, BERTH_RESID_NONE, 0.0f, BERTH_NORM_W, YN_OWN, 0},
    {1, 264, 2048, BF16, BERTH_NORM_W, BF16, BERTH_RESID_ADD_AFTER, 0.0f, BERTH_NORM_W, YN_INTO_RESIDUAL, 0},
    {2, 264, 2048, BF16, BERTH_NORM_W_ONE_PLUS, BF16, BERTH_RESID_ADD_BEFORE, 0.37f, BERTH_NORM_W, YN_OWN, 0},
    {1, 264, 2560, BF16, BERTH_NORM_W, BF16, BERTH_RESID_ADD_AFTER, 0.0f, BERTH_NORM_W, YN_INTO_RESIDUAL, 0},
    {1, 77, 333, F32, BERTH_NORM_W, F32, BERTH_RESID_ADD_AFTER, 0.0f, BERTH_NORM_W, YN_INTO_RESIDUAL, 0},
    {3, 264, 1537, BF16, BERTH_NORM_W_NONE, BF16, BERTH_RESID_ADD_AFTER, 0.0f, -1, YN_OWN, 0},
    /* scalar weight loads (K = 77: matmul.cu's GEMV at M = 1 too), padded y rows (aligned: fused; 3 floats:
     * not), and the norm in place over the product's y */
    {1, 77, 1536, BF16, BERTH_NORM_W, BF16, BERTH_RESID_ADD_AFTER, 0.37f, BERTH_NORM_W, YN_INTO_RESIDUAL, 0},
    {2, 77, 1536, F16, BERTH_NORM_W, F32, BERTH_RESID_ADD_BEFORE, 0.0f, BERTH_NORM_W, YN_OWN, 0},
    {1, 1536, 1536, BF16, BERTH_NORM_W, BF16, BERTH_RESID_ADD_AFTER, 0.0f, BERTH_NORM_W, YN_OWN, 4},
    {2, 264, 1536, BF16, BERTH_NORM_W, BF16, BERTH_RESID_ADD_AFTER, 0.0f, BERTH_NORM_W, YN_OWN, 3},
    {1, 1536, 1536, BF16, BERTH_NORM_W, BF16, BERTH_RESID_ADD_AFTER, 0.37f, BERTH_NORM_W, YN_INTO_X, 0},
    {4, 264, 1536, F32, BERTH_NORM_UNIT, F32, BERTH_RESID_NONE, 0.0f, BERTH_NORM_UNIT, YN_INTO_X, 0},
};
#define N_YN_CASES ((int)(sizeof yn_cases / sizeof yn_cases[0]))

/* One case's tensors and both sides' params (rp: the norm, p: the product pointing at it). */
struct yn_op {
    struct hx_tensor X, W, T, R, O, NW, Y2, W2;
    float *rinit, *tinit;          /* the first contents of the residual and of the product's y (padded rows) */
    berth_rms_norm_params rp[2];
    berth_matmul_params p[2];
    const struct hx_tensor *outs[4]; /* what the op writes: the product's y, the norm's y, the residual, y2 */
    int n_outs;
};

static void yn_add_out(struct yn_op *o, const struct hx_tensor *t)
{
    for (int i = 0; i < o->n_outs; i++)
        if (o->outs[i] == t)
            return;
    o->outs[o->n_outs++] = t;
}

static void yn_setup(const struct yn_case *c, struct yn_op *o)
{
    const int64_t M = c->M, K = c->K, N = c->N, ld = N + c->ypad;
    memset(o, 0, sizeof *o);
    o->X = hx_new(F32, K, M, 0, 0);
    hx_rand(&o->X, -1.0f, 1.0f);
    o->W = hx_new(c->wdt, K, N, 0, 0);
    hx_rand(&o->W, -1.0f, 1.0f);
    o->T = hx_new(F32, ld, M, 0, 0);
    if (c->ypad) /* the padding must come back unchanged: finite values on both sides */
        hx_rand(&o->T, -1.0f, 1.0f);
    o->tinit = malloc(o->T.bytes);
    ck_assert_ptr_nonnull(o->tinit);
    hx_get(&o->T, HX_CPU, o->tinit);
    o->R = hx_new(F32, N, M, 0, 0);
    o->O = hx_new(F32, N, M, 0, 0);
    o->Y2 = hx_new(F32, N, M, 0, 0);
    o->NW = hx_new(c->nwdt, N, 0, 0, 0);
    o->W2 = hx_new(c->nwdt, N, 0, 0, 0);
    hx_rand(&o->NW, -1.0f, 1.0f);
    hx_rand(&o->W2, -1.0f, 1.0f);
    o->rinit = malloc((size_t)(N * M) * sizeof(float));
    ck_assert_ptr_nonnull(o->rinit);
    for (int64_t i = 0; i < N * M; i++)
        o->rinit[i] = hx_rand_uniform(-1.0f, 1.0f);
    hx_set(&o->R, o->rinit);
    for (int s = 0; s < 2; s++) {
        berth_rms_norm_params *r = &o->rp[s];
        memset(r, 0, sizeof *r);
        r->struct_size = sizeof *r;
        r->weight_mode = c->wmode;
        r->resid_mode = c->rmode;
        r->eps = 1e-6f;
        const berth_tensor t = c->ypad ? hx_view(&o->T, s, 0, N, M, 1, 1, ld, ld * M, ld * M) : o->T.t[s];
        r->x = t;
        if (c->wmode == BERTH_NORM_W || c->wmode == BERTH_NORM_W_ONE_PLUS)
            r->w = o->NW.t[s];
        if (c->rmode != BERTH_RESID_NONE)
            r->residual = o->R.t[s];
        r->y = c->out == YN_OWN ? o->O.t[s] : c->out == YN_INTO_RESIDUAL ? o->R.t[s] : t;
        r->out_scale = c->oscale;
        if (c->y2mode >= 0) {
            r->y2_weight_mode = c->y2mode;
            if (c->y2mode == BERTH_NORM_W || c->y2mode == BERTH_NORM_W_ONE_PLUS)
                r->y2_w = o->W2.t[s];
            r->y2 = o->Y2.t[s];
        }
        berth_matmul_params *m = &o->p[s];
        memset(m, 0, sizeof *m);
        m->struct_size = sizeof *m;
        m->x = o->X.t[s];
        m->w = o->W.t[s];
        m->y = t;
        m->y_norm = r;
    }
    yn_add_out(o, &o->T);
    yn_add_out(o, c->out == YN_OWN ? &o->O : c->out == YN_INTO_RESIDUAL ? &o->R : &o->T);
    if (c->rmode == BERTH_RESID_ADD_BEFORE)
        yn_add_out(o, &o->R);
    if (c->y2mode >= 0)
        yn_add_out(o, &o->Y2);
}

static void yn_free(struct yn_op *o)
{
    hx_free(&o->X);
    hx_free(&o->W);
    hx_free(&o->T);
    hx_free(&o->R);
    hx_free(&o->O);
    hx_free(&o->Y2);
    hx_free(&o->NW);
    hx_free(&o->W2);
    free(o->rinit);
    free(o->tinit);
}

/* Compare run 1 of both sides: the product's y (unless the norm overwrote it) to the product's bound, the rest
 * (the norm's outputs; the residual of ADD_BEFORE is residual + y) to nbound. */
static void yn_expect_close(const struct yn_case *c, const struct yn_op *o, const char *what)
{
    const double scale = sqrt((double)c->K);
    const bool rounded = mm_x_rounded(c->M, c->K, c->wdt);
    const double yatol = rounded ? 6e-3 * scale : 1e-5 * scale, yrtol = rounded ? 0.0 : 1e-5;
    const double natol = rounded ? 0.15 : 3e-4, nrtol = rounded ? 0.0 : 1e-4;
    char w2[200];
    if (c->out != YN_INTO_X) {
        snprintf(w2, sizeof w2, "%s: product y", what);
        hx_expect_close(&o->T, yatol, yrtol, w2);
    }
    const struct hx_tensor *ny = c->out == YN_OWN ? &o->O : c->out == YN_INTO_RESIDUAL ? &o->R : &o->T;
    snprintf(w2, sizeof w2, "%s: norm y", what);
    hx_expect_close(ny, natol, nrtol, w2);
    if (c->rmode == BERTH_RESID_ADD_BEFORE && c->out != YN_INTO_RESIDUAL) {
        snprintf(w2, sizeof w2, "%s: residual", what);
        hx_expect_close(&o->R, yatol, yrtol, w2);
    }
    if (c->y2mode >= 0) {
        snprintf(w2, sizeof w2, "%s: y2", what);
        hx_expect_close(&o->Y2, natol, nrtol, w2);
    }
}

/* The GPU side's bytes of every output, malloc'd (caller frees each). */
static void yn_snapshot(const struct yn_op *o, void *snap[4])
{
    for (int i = 0; i < o->n_outs; i++) {
        snap[i] = malloc(o->outs[i]->bytes);
        ck_assert_ptr_nonnull(snap[i]);
        hx_get(o->outs[i], HX_GPU, snap[i]);
    }
}

/* Before a GPU-only rerun: the residual and the product's y back to their first contents (NaN rows, padding
 * kept), the norm's own outputs poisoned. */
static void yn_reset_gpu(const struct yn_op *o)
{
    const struct hx_side *g = &hx->side[HX_GPU];
    ck_assert(g->vt->buffer_upload(g->be, g->s, o->R.buf[HX_GPU], 0, o->rinit, o->R.bytes) == BERTH_OK);
    ck_assert(g->vt->buffer_upload(g->be, g->s, o->T.buf[HX_GPU], 0, o->tinit, o->T.bytes) == BERTH_OK);
    for (int i = 0; i < o->n_outs; i++)
        if (o->outs[i] != &o->R && o->outs[i] != &o->T)
            ck_assert(g->vt->buffer_fill(g->be, g->s, o->outs[i]->buf[HX_GPU], 0, 0xFF, o->outs[i]->bytes) ==
                      BERTH_OK);
}

/* The GPU side's outputs are byte for byte the snapshot. */
static void yn_expect_snapshot(const struct yn_op *o, void *const snap[4], const char *what, const char *run)
{
    for (int i = 0; i < o->n_outs; i++) {
        const struct hx_tensor *t = o->outs[i];
        float *got = malloc(t->bytes);
        ck_assert_ptr_nonnull(got);
        hx_get(t, HX_GPU, got);
        const float *want = snap[i];
        const int64_t n = (int64_t)(t->bytes / sizeof(float));
        for (int64_t k = 0; k < n; k++)
            if (memcmp(&got[k], &want[k], sizeof(float)) != 0) {
                const double g = got[k], w = want[k];
                free(got);
                ck_abort_msg("%s: %s: output %d element %lld is %.9g, the first run wrote %.9g", what, run, i,
                             (long long)k, g, w);
            }
        free(got);
    }
}

static void yn_run(const struct yn_case *c)
{
    char what[200];
    snprintf(what, sizeof what,
             "matmul + y_norm M=%lld K=%lld N=%lld w=%s norm %s (%s) resid=%s out_scale=%g y2=%s out=%d ypad=%d",
             (long long)c->M, (long long)c->K, (long long)c->N, hx_dtype_name(c->wdt), wmode_names[c->wmode],
             hx_dtype_name(c->nwdt), rmode_names[c->rmode], (double)c->oscale,
             c->y2mode >= 0 ? wmode_names[c->y2mode] : "none", c->out, c->ypad);
    struct yn_op o;
    yn_setup(c, &o);
    hx_run_both(BERTH_OP_MATMUL, &o.p[HX_CPU], &o.p[HX_GPU], what);
    yn_expect_close(c, &o, what);

    void *snap[4] = {NULL, NULL, NULL, NULL};
    yn_snapshot(&o, snap);
    yn_reset_gpu(&o);
    ck_assert_msg(hx_op(HX_GPU, BERTH_OP_MATMUL, &o.p[HX_GPU]) == BERTH_OK, "%s: second run: %s", what,
                  hx_last_error);
    hx_sync();
    yn_expect_snapshot(&o, snap, what, "second run");

    yn_reset_gpu(&o);
    berth_matmul_params plain = o.p[HX_GPU];
    plain.y_norm = NULL;
    ck_assert_msg(hx_op(HX_GPU, BERTH_OP_MATMUL, &plain) == BERTH_OK, "%s: matmul alone: %s", what, hx_last_error);
    ck_assert_msg(hx_op(HX_GPU, BERTH_OP_RMS_NORM, &o.rp[HX_GPU]) == BERTH_OK, "%s: rms_norm alone: %s", what,
                  hx_last_error);
    hx_sync();
    yn_expect_snapshot(&o, snap, what, "matmul, then rms_norm");
    for (int i = 0; i < o.n_outs; i++)
        free(snap[i]);
    yn_free(&o);
}

START_TEST(test_matmul_y_norm)
{
    yn_run(&yn_cases[_i]);
}
END_TEST

/* The fused op recorded once in a CUDA graph and replayed with new x and residual contents: each replay matches
 * the CPU backend (the GEMV's counter is back at 0 after every replay, with no reset on the host). Both a
 * batch-1 shape (gemv.cu) and M = 3 (matmul.cu's GEMV). */
START_TEST(test_matmul_y_norm_graph)
{
    const struct hx_side *g = &hx->side[HX_GPU];
    ck_assert_ptr_nonnull(g->vt->graph_begin);
    static const struct yn_case gc[2] = {
        {1, 2048, 1536, BF16, BERTH_NORM_W, BF16, BERTH_RESID_ADD_AFTER, 0.37f, BERTH_NORM_W, YN_INTO_RESIDUAL, 0},
        {3, 264, 1536, F32, BERTH_NORM_W, F32, BERTH_RESID_ADD_AFTER, 0.0f, BERTH_NORM_W, YN_OWN, 0},
    };
    for (int k = 0; k < 2; k++) {
        const struct yn_case *c = &gc[k];
        struct yn_op o;
        yn_setup(c, &o);
        char what[128];
        snprintf(what, sizeof what, "matmul + y_norm in a graph, M=%lld K=%lld", (long long)c->M, (long long)c->K);
        hx_run_both(BERTH_OP_MATMUL, &o.p[HX_CPU], &o.p[HX_GPU], what);
        yn_expect_close(c, &o, what);
        berth_graph *graph = NULL;
        ck_assert_msg(g->vt->graph_begin(g->be, g->s) == BERTH_OK, "%s: graph_begin: %s", what, hx_last_error);
        const berth_status st_op = hx_op(HX_GPU, BERTH_OP_MATMUL, &o.p[HX_GPU]);
        char op_err[512];
        snprintf(op_err, sizeof op_err, "%s", hx_last_error);
        const berth_status st_end = g->vt->graph_end(g->be, g->s, &graph); /* ends the capture even on failure */
        ck_assert_msg(st_op == BERTH_OK, "%s: while recording: %s", what, op_err);
        ck_assert_msg(st_end == BERTH_OK && graph, "%s: graph_end: %s", what, hx_last_error);
        for (int r = 0; r < 3; r++) {
            char wr[160];
            snprintf(wr, sizeof wr, "%s, replay %d", what, r);
            hx_rand(&o.X, -1.0f, 1.0f);
            for (int64_t i = 0; i < c->N * c->M; i++)
                o.rinit[i] = hx_rand_uniform(-1.0f, 1.0f);
            hx_set(&o.R, o.rinit);
            yn_reset_gpu(&o);
            ck_assert_msg(g->vt->graph_launch(g->be, g->s, graph) == BERTH_OK, "%s: graph_launch: %s", wr,
                          hx_last_error);
            ck_assert_msg(hx_op(HX_CPU, BERTH_OP_MATMUL, &o.p[HX_CPU]) == BERTH_OK, "%s: cpu: %s", wr, hx_last_error);
            hx_sync();
            yn_expect_close(c, &o, wr);
        }
        g->vt->graph_destroy(g->be, graph);
        yn_free(&o);
    }
}
END_TEST

/* ---------------------------------------------------------------------------------------------------------------
 * matmul with a norm before the product (x_pre): an rms_norm whose y2 (or y) is the product's x, then the product,
 * as one op. The CUDA backend computes the norm in every block of its batch-1 GEMV (plugins/backend-cuda/
 * gemv_xpre.cuh; block 0 stores the norm's outputs) where cu_xpre_plan allows, and launches the norm first
 * otherwise (M > 1, ADD_BEFORE, outputs that overlap inputs, K not a multiple of 4, rows too long for its shared
 * memory). Each case runs three times:
 *  1. on both backends, compared: the norm's outputs to a few times fp32 rounding, the product to its bound;
 *  2. the CUDA side again with its outputs poisoned: the same bytes (every block rebuilt the same row);
 *  3. the CUDA side as two ops (rms_norm, then the plain matmul): close to run 1 (the fused norm sums in another
 *     order, so not always the same bytes).
 * Outputs start as NaN bytes. */

struct xp_case {
    int64_t M, K, N;  /* K: the norm's row length and the product's depth */
    berth_dtype wdt;  /* the product's weights */
    int glu;          /* BERTH_GLU_NONE / HALVES / MUL */
    int wmode;        /* the norm: weight mode, weight dtype (also y2's), residual mode, out_scale (0: none) */
    berth_dtype nwdt;
    int rmode;
    float oscale;
    int y2mode;       /* -1: no second output: the product reads the norm's y */
    int alias;        /* the norm's y: 0 its own tensor, 1 its residual, 2 its x (rms_norm's "y may alias x"); 1 and
                       * 2 are not fused (block 0 would overwrite what other blocks still read) */
};

static const struct xp_case xp_cases[] = {
    /* Gemma 4 E2B: post-attention norm + pre-FF norm feeding gate|up; post-FF norm feeding the PLE gate (x = y);
     * the post-PLE norm with the layer scalar feeding the next layer's q|k|v */
    {1, 1536, 6144, BF16, BERTH_GLU_HALVES, BERTH_NORM_W, BF16, BERTH_RESID_ADD_AFTER, 0.0f, BERTH_NORM_W, 0},
    {1, 1536, 256, BF16, BERTH_GLU_MUL, BERTH_NORM_W, BF16, BERTH_RESID_ADD_AFTER, 0.0f, -1, 0},
    {1, 1536, 2560, BF16, BERTH_GLU_NONE, BERTH_NORM_W, BF16, BERTH_RESID_ADD_AFTER, 0.37f, BERTH_NORM_W, 0},
    /* several waves of blocks (block 0 stores while later blocks still read) */
    {1, 1536, 24576, BF16, BERTH_GLU_HALVES, BERTH_NORM_W, F32, BERTH_RESID_ADD_AFTER, 0.0f, BERTH_NORM_W, 0},
    /* f32 / f16 weights, the other weight modes, no residual, a short row */
    {1, 1536, 512, F32, BERTH_GLU_NONE, BERTH_NORM_W_ONE_PLUS, F32, BERTH_RESID_ADD_AFTER, 0.0f, BERTH_NORM_UNIT, 0},
    {1, 264, 1536, F16, BERTH_GLU_NONE, BERTH_NORM_UNIT, F16, BERTH_RESID_NONE, 0.0f, BERTH_NORM_W, 0},
    {1, 512, 777, BF16, BERTH_GLU_MUL, BERTH_NORM_W_NONE, BF16, BERTH_RESID_ADD_AFTER, 2.0f, BERTH_NORM_W_ONE_PLUS, 0},
    {1, 4096, 1536, BF16, BERTH_GLU_NONE, BERTH_NORM_W, BF16, BERTH_RESID_ADD_AFTER, 0.0f, BERTH_NORM_W, 0},
    /* launched as two ops: y into the residual or over x, ADD_BEFORE, M > 1 (GEMV, skinny, cuBLAS), K = 77, a
     * row too long */
    {1, 1536, 1536, BF16, BERTH_GLU_NONE, BERTH_NORM_W, BF16, BERTH_RESID_ADD_AFTER, 0.0f, BERTH_NORM_W, 1},
    {1, 1536, 1536, BF16, BERTH_GLU_NONE, BERTH_NORM_W, BF16, BERTH_RESID_ADD_AFTER, 0.37f, BERTH_NORM_W, 2},
    {1, 1536, 256, BF16, BERTH_GLU_MUL, BERTH_NORM_W, BF16, BERTH_RESID_ADD_AFTER, 0.0f, -1, 2},
    {1, 1536, 1536, BF16, BERTH_GLU_NONE, BERTH_NORM_W, BF16, BERTH_RESID_ADD_BEFORE, 0.0f, BERTH_NORM_W, 0},
    {3, 1536, 1536, BF16, BERTH_GLU_HALVES, BERTH_NORM_W, BF16, BERTH_RESID_ADD_AFTER, 0.0f, BERTH_NORM_W, 0},
    {8, 1536, 1536, BF16, BERTH_GLU_NONE, BERTH_NORM_W, BF16, BERTH_RESID_ADD_AFTER, 0.37f, -1, 0},
    {20, 1536, 1536, BF16, BERTH_GLU_NONE, BERTH_NORM_W, BF16, BERTH_RESID_ADD_AFTER, 0.0f, BERTH_NORM_W, 0},
    /* f16 weights, 9-32 rows: x rounded to f16 by the norm, the gated product on the wgmma twins (unsplit: 32-row
     * tile; split: the 64-row tile's cluster sum) */
    {24, 520, 4500, F16, BERTH_GLU_HALVES, BERTH_NORM_W, F16, BERTH_RESID_ADD_AFTER, 0.0f, BERTH_NORM_W, 0},
    {32, 1536, 1536, F16, BERTH_GLU_NONE, BERTH_NORM_W, F16, BERTH_RESID_ADD_AFTER, 0.0f, -1, 0},
    {1, 77, 1536, F32, BERTH_GLU_NONE, BERTH_NORM_W, F32, BERTH_RESID_ADD_AFTER, 0.0f, BERTH_NORM_W, 0},
    /* more rows: in BF16 mode on cuBLAS the norm also writes the packed x (f16 copy, no y2; a warp per row at K =
     * 512), and the PLE gate's shape at 32 rows (the skinny kernel's row groups by default) */
    {32, 1536, 1536, F16, BERTH_GLU_HALVES, BERTH_NORM_W, BF16, BERTH_RESID_ADD_AFTER, 0.0f, -1, 0},
    {72, 512, 1536, BF16, BERTH_GLU_MUL, BERTH_NORM_W, BF16, BERTH_RESID_ADD_AFTER, 0.5f, -1, 0},
    {32, 1536, 256, BF16, BERTH_GLU_MUL, BERTH_NORM_W, BF16, BERTH_RESID_ADD_AFTER, 0.0f, -1, 0},
    /* 33..64 rows (the skinny kernel's NT 8 instances when products with their norm take it) */
    {48, 1536, 1536, BF16, BERTH_GLU_NONE, BERTH_NORM_W, BF16, BERTH_RESID_ADD_AFTER, 0.0f, BERTH_NORM_W, 0},
    {64, 2048, 6144, BF16, BERTH_GLU_HALVES, BERTH_NORM_W, BF16, BERTH_RESID_ADD_AFTER, 0.0f, -1, 0},
    {1, 6144, 256, BF16, BERTH_GLU_NONE, BERTH_NORM_W, F32, BERTH_RESID_ADD_AFTER, 0.0f, BERTH_NORM_W, 0},
};
#define N_XP_CASES ((int)(sizeof xp_cases / sizeof xp_cases[0]))

static void xp_run(const struct xp_case *c)
{
    const int64_t M = c->M, K = c->K, N = c->N, WN = c->glu == BERTH_GLU_HALVES ? 2 * N : N;
    char what[220];
    snprintf(what, sizeof what,
             "matmul + x_pre M=%lld K=%lld N=%lld w=%s glu=%d norm %s (%s) resid=%s out_scale=%g y2=%s alias=%d",
             (long long)M, (long long)K, (long long)N, hx_dtype_name(c->wdt), c->glu, wmode_names[c->wmode],
             hx_dtype_name(c->nwdt), rmode_names[c->rmode], (double)c->oscale,
             c->y2mode >= 0 ? wmode_names[c->y2mode] : "none", c->alias);
    struct hx_tensor T = hx_new(F32, K, M, 0, 0), R = hx_new(F32, K, M, 0, 0), NY = hx_new(F32, K, M, 0, 0),
                     Y2 = hx_new(F32, K, M, 0, 0), NW = hx_new(c->nwdt, K, 0, 0, 0), W2 = hx_new(c->nwdt, K, 0, 0, 0),
                     W = hx_new(c->wdt, K, WN, 0, 0), U = hx_new(F32, N, M, 0, 0), Y = hx_new(F32, N, M, 0, 0);
    hx_rand(&T, -1.0f, 1.0f);
    hx_rand(&R, -1.0f, 1.0f);
    hx_rand(&NW, -1.0f, 1.0f);
    hx_rand(&W2, -1.0f, 1.0f);
    hx_rand(&W, -1.0f, 1.0f);
    hx_rand(&U, -1.0f, 1.0f);
    float *rinit = malloc(R.bytes), *tinit = malloc(T.bytes);
    ck_assert(rinit && tinit);
    hx_get(&R, HX_CPU, rinit);
    hx_get(&T, HX_CPU, tinit);
    berth_rms_norm_params rp[2];
    berth_matmul_params p[2];
    for (int s = 0; s < 2; s++) {
        berth_rms_norm_params *r = &rp[s];
        memset(r, 0, sizeof *r);
        r->struct_size = sizeof *r;
        r->weight_mode = c->wmode;
        r->resid_mode = c->rmode;
        r->eps = 1e-6f;
        r->x = T.t[s];
        if (c->wmode == BERTH_NORM_W || c->wmode == BERTH_NORM_W_ONE_PLUS)
            r->w = NW.t[s];
        if (c->rmode != BERTH_RESID_NONE)
            r->residual = R.t[s];
        r->y = c->alias == 1 ? R.t[s] : c->alias == 2 ? T.t[s] : NY.t[s];
        r->out_scale = c->oscale;
        if (c->y2mode >= 0) {
            r->y2_weight_mode = c->y2mode;
            if (c->y2mode == BERTH_NORM_W || c->y2mode == BERTH_NORM_W_ONE_PLUS)
                r->y2_w = W2.t[s];
            r->y2 = Y2.t[s];
        }
        berth_matmul_params *m = &p[s];
        memset(m, 0, sizeof *m);
        m->struct_size = sizeof *m;
        m->x = c->y2mode >= 0 ? r->y2 : r->y;
        m->w = W.t[s];
        m->y = Y.t[s];
        m->y_glu = c->glu;
        m->y_glu_act = BERTH_ACT_GELU_TANH;
        if (c->glu == BERTH_GLU_MUL)
            m->y_glu_up = U.t[s];
        m->x_pre = r;
    }
    /* what the op writes: the product's y, the norm's y (or the residual), y2, the residual of ADD_BEFORE */
    const struct hx_tensor *outs[4] = {&Y, c->alias == 1 ? &R : c->alias == 2 ? &T : &NY,
                                       c->y2mode >= 0 ? &Y2 : NULL,
                                       c->rmode == BERTH_RESID_ADD_BEFORE && c->alias != 1 ? &R : NULL};
    hx_run_both(BERTH_OP_MATMUL, &p[HX_CPU], &p[HX_GPU], what);
    /* the normalised rows have rms about 1 (|weight| <= 2); each GLU output is a product of two sums */
    double scale = 2.0 * sqrt((double)K);
    if (c->glu == BERTH_GLU_HALVES)
        scale *= 2.0 * sqrt((double)K);
    const bool rounded = mm_x_rounded(M, K, c->wdt);
    const double yatol = rounded ? 6e-3 * scale : 3e-5 * scale, yrtol = rounded ? 0.0 : 1e-5;
    char w2[300];
    snprintf(w2, sizeof w2, "%s: product y", what);
    hx_expect_close(&Y, yatol, yrtol, w2);
    for (int i = 1; i < 4; i++)
        if (outs[i]) {
            snprintf(w2, sizeof w2, "%s: norm output %d", what, i);
            hx_expect_close(outs[i], 3e-5 * fmax(1.0, c->oscale), 1e-5, w2);
        }

    /* 2: again, outputs poisoned and the residual restored: the same bytes */
    const struct hx_side *g = &hx->side[HX_GPU];
    void *snap[4] = {NULL, NULL, NULL, NULL};
    for (int i = 0; i < 4; i++)
        if (outs[i]) {
            snap[i] = malloc(outs[i]->bytes);
            ck_assert_ptr_nonnull(snap[i]);
            hx_get(outs[i], HX_GPU, snap[i]);
        }
    for (int run = 0; run < 2; run++) {
        ck_assert(g->vt->buffer_upload(g->be, g->s, R.buf[HX_GPU], 0, rinit, R.bytes) == BERTH_OK);
        ck_assert(g->vt->buffer_upload(g->be, g->s, T.buf[HX_GPU], 0, tinit, T.bytes) == BERTH_OK);
        for (int i = 0; i < 4; i++)
            if (outs[i] && outs[i] != &R && outs[i] != &T) /* inputs are restored, not poisoned */
                ck_assert(g->vt->buffer_fill(g->be, g->s, outs[i]->buf[HX_GPU], 0, 0xFF, outs[i]->bytes) ==
                          BERTH_OK);
        if (run == 0) {
            ck_assert_msg(hx_op(HX_GPU, BERTH_OP_MATMUL, &p[HX_GPU]) == BERTH_OK, "%s: second run: %s", what,
                          hx_last_error);
        } else { /* 3: as two ops */
            berth_matmul_params plain = p[HX_GPU];
            plain.x_pre = NULL;
            ck_assert_msg(hx_op(HX_GPU, BERTH_OP_RMS_NORM, &rp[HX_GPU]) == BERTH_OK, "%s: rms_norm alone: %s", what,
                          hx_last_error);
            ck_assert_msg(hx_op(HX_GPU, BERTH_OP_MATMUL, &plain) == BERTH_OK, "%s: matmul alone: %s", what,
                          hx_last_error);
        }
        hx_sync();
        for (int i = 0; i < 4; i++) {
            if (!outs[i])
                continue;
            const int64_t n = (int64_t)(outs[i]->bytes / sizeof(float));
            float *got = malloc(outs[i]->bytes);
            ck_assert_ptr_nonnull(got);
            hx_get(outs[i], HX_GPU, got);
            const float *want = snap[i];
            const double tol = i == 0 ? yatol : 3e-5 * fmax(1.0, c->oscale);
            for (int64_t k = 0; k < n; k++) {
                const bool same = memcmp(&got[k], &want[k], sizeof(float)) == 0;
                if (run == 0 ? !same : !(fabs((double)got[k] - (double)want[k]) <= tol + 1e-5 * fabs(want[k]))) {
                    const double gv = got[k], wv = want[k];
                    free(got);
                    ck_abort_msg("%s: %s: output %d element %lld is %.9g, the first run wrote %.9g", what,
                                 run == 0 ? "second run" : "rms_norm, then matmul", i, (long long)k, gv, wv);
                }
            }
            free(got);
        }
    }
    for (int i = 0; i < 4; i++)
        free(snap[i]);
    free(rinit);
    free(tinit);
    hx_free(&T);
    hx_free(&R);
    hx_free(&NY);
    hx_free(&Y2);
    hx_free(&NW);
    hx_free(&W2);
    hx_free(&W);
    hx_free(&U);
    hx_free(&Y);
}

START_TEST(test_matmul_x_pre)
{
    xp_run(&xp_cases[_i]);
}
END_TEST

/* A gated product's output straight into the next product (an MLP's gate|up -> down), at the row counts where the
 * CUDA backend's skinny kernel writes a rounded copy of y for the next op to use instead of packing x again
 * (BF16 mode, 9..32 rows by default: cuda_internal.h, struct cu_xshadow). between = 1 puts an in-place y *= 2 between the
 * two products and between = 2 a product over other rows: the second product must then read the current y, not a
 * stale copy (a stale one is off by the whole of z, far past the bound). between = 3 puts a second gated product
 * over y between them (y -> y2, then y2 -> z): it reads the copy of y and must not write its own copy of y2 over
 * the buffer it is reading. between = 4 uploads new rows into y between them (no op, but stream work that
 * rewrites y: the copy is dead). */
struct xs_case {
    int64_t M, K, N, K2; /* gate|up: K -> N (w has 2N rows); down: N -> K2 */
    int between;
};

static const struct xs_case xs_cases[] = {
    {24, 1536, 2048, 1536, 0}, {32, 1536, 6144, 1536, 0}, {17, 264, 1032, 520, 0},
    {32, 1536, 2048, 1536, 1}, {24, 1536, 2048, 1536, 2}, {8, 1536, 2048, 1536, 0}, {48, 1536, 2048, 1536, 0},
    {24, 1536, 2048, 1536, 3}, {32, 1536, 2048, 1536, 4},
};
#define N_XS_CASES ((int)(sizeof xs_cases / sizeof xs_cases[0]))

static void xs_run(const struct xs_case *c)
{
    const int64_t M = c->M, K = c->K, N = c->N, K2 = c->K2;
    char what[160];
    snprintf(what, sizeof what, "gated product -> product M=%lld K=%lld N=%lld K2=%lld between=%d", (long long)M,
             (long long)K, (long long)N, (long long)K2, c->between);
    struct hx_tensor X = hx_new(F32, K, M, 0, 0), W = hx_new(BF16, K, 2 * N, 0, 0), Y = hx_new(F32, N, M, 0, 0);
    struct hx_tensor W2 = hx_new(BF16, N, K2, 0, 0), Z = hx_new(F32, K2, M, 0, 0);
    struct hx_tensor X3 = hx_new(F32, N, M, 0, 0), Z3 = hx_new(F32, K2, M, 0, 0);
    struct hx_tensor WG = hx_new(BF16, N, 2 * N, 0, 0), Y2 = hx_new(F32, N, M, 0, 0);
    hx_rand(&X, -1.0f, 1.0f);
    hx_rand(&WG, -0.05f, 0.05f);
    hx_rand(&W, -0.05f, 0.05f);
    hx_rand(&W2, -0.05f, 0.05f);
    hx_rand(&X3, -1.0f, 1.0f);
    berth_matmul_params up[2], down[2], other[2], up2[2];
    for (int s = 0; s < 2; s++) {
        memset(&up[s], 0, sizeof up[s]);
        up[s].struct_size = sizeof up[s];
        up[s].x = X.t[s];
        up[s].w = W.t[s];
        up[s].y = Y.t[s];
        up[s].y_glu = BERTH_GLU_HALVES;
        up[s].y_glu_act = BERTH_ACT_GELU_TANH;
        memset(&down[s], 0, sizeof down[s]);
        down[s].struct_size = sizeof down[s];
        down[s].x = Y.t[s];
        down[s].w = W2.t[s];
        down[s].y = Z.t[s];
        other[s] = down[s];
        other[s].x = X3.t[s];
        other[s].y = Z3.t[s];
        up2[s] = up[s];
        up2[s].x = Y.t[s];
        up2[s].w = WG.t[s];
        up2[s].y = Y2.t[s];
        if (c->between == 3)
            down[s].x = Y2.t[s];
    }
    hx_run_both(BERTH_OP_MATMUL, &up[HX_CPU], &up[HX_GPU], what);
    if (c->between == 1)
        hx_scale_both(&Y, 2.0f, what);
    if (c->between == 2)
        hx_run_both(BERTH_OP_MATMUL, &other[HX_CPU], &other[HX_GPU], what);
    if (c->between == 3)
        hx_run_both(BERTH_OP_MATMUL, &up2[HX_CPU], &up2[HX_GPU], what);
    if (c->between == 4)
        hx_rand(&Y, -0.5f, 0.5f); /* both sides, by buffer_upload on each side's stream */
    hx_run_both(BERTH_OP_MATMUL, &down[HX_CPU], &down[HX_GPU], what);
    /* |y| and |z| about 0.3-1 here; x rounded to bf16 on the way into each product (2^-9 relative per term) */
    hx_expect_close(&Y, 3e-2, 2e-2, what);
    hx_expect_close(&Z, 3e-2, 2e-2, what);
    if (c->between == 2)
        hx_expect_close(&Z3, 3e-2, 2e-2, what);
    if (c->between == 3)
        hx_expect_close(&Y2, 3e-2, 2e-2, what);
    hx_free(&X);
    hx_free(&WG);
    hx_free(&Y2);
    hx_free(&W);
    hx_free(&Y);
    hx_free(&W2);
    hx_free(&Z);
    hx_free(&X3);
    hx_free(&Z3);
}

START_TEST(test_matmul_gated_then_product)
{
    xs_run(&xs_cases[_i]);
}
END_TEST

/* --------------------------------------------------------------------------------------------------------------- */

static Suite *make_suite(void)
{
    Suite *s = suite_create("cuda_ops_dense");
    TCase *tc = tcase_create("matmul");
    tcase_set_timeout(tc, 240);
    tcase_add_loop_test(tc, test_matmul, 0, N_MM_CASES);
    tcase_add_test(tc, test_matmul_supports);
    tcase_add_loop_test(tc, test_matmul_norm_prologue, 0, N_MM_NORM_CASES);
    tcase_add_loop_test(tc, test_matmul_glu_epilogue, 0, N_MM_GLU_CASES);
    tcase_add_loop_test(tc, test_matmul_skinny, 0, N_SK_CASES);
    tcase_add_loop_test(tc, test_matmul_y_norm, 0, N_YN_CASES);
    tcase_add_test(tc, test_matmul_y_norm_graph);
    tcase_add_loop_test(tc, test_matmul_x_pre, 0, N_XP_CASES);
    tcase_add_loop_test(tc, test_matmul_gated_then_product, 0, N_XS_CASES);
    suite_add_tcase(s, tc);
    tc = tcase_create("norm");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_rms_norm_modes, 0, 12);
    tcase_add_test(tc, test_rms_norm_alias_strided);
    tcase_add_test(tc, test_layer_norm);
    tcase_add_test(tc, test_gated_rms_norm);
    suite_add_tcase(s, tc);
    tc = tcase_create("elementwise");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_get_rows);
    tcase_add_test(tc, test_get_rows_bad_id);
    tcase_add_test(tc, test_unary);
    tcase_add_test(tc, test_glu);
    tcase_add_test(tc, test_binary);
    tcase_add_test(tc, test_copy);
    tcase_add_test(tc, test_rope);
    tcase_add_test(tc, test_rms_norm_rope);
    tcase_add_test(tc, test_rms_norm_out_scale);
    tcase_add_test(tc, test_rms_norm_second_output);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv)
{
    return hx_main(argc, argv, make_suite);
}

/*
 * test_cpu_ops.c — CPU backend plugin: descriptor, probe, config, buffers, matmul (and its norm prologue), get_rows, norms, rope, elementwise ops, and supports() rejections.
 * Harness and conventions: test_cpu_harness.h.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_cpu_harness.h"

/* ---------------------------------------------------------------------------------------------------------------
 * Descriptor, probe, config, buffers. */

START_TEST(test_descriptor)
{
    ck_assert_uint_eq(g_desc->magic, BERTH_PLUGIN_MAGIC);
    ck_assert_int_eq(g_desc->kind, BERTH_PLUGIN_BACKEND);
    ck_assert_str_eq(g_desc->name, "cpu");
    ck_assert_uint_eq(g_desc->required_services, BERTH_SVC_LOG | BERTH_SVC_CONFIG);
    ck_assert_ptr_null(g_entry(BERTH_ABI_MAJOR + 1, 0)); /* another major: no descriptor */
    ck_assert_ptr_eq(g_entry(BERTH_ABI_MAJOR, BERTH_ABI_MINOR + 5), g_desc); /* a newer minor is fine */

    berth_probe_info pi = {.struct_size = sizeof pi};
    ck_assert_int_eq(vt->probe(&g_host, &pi), BERTH_OK);
    ck_assert_int_eq(pi.n_devices, 1);

    berth_device_info di = {.struct_size = sizeof di};
    ck_assert_int_eq(vt->device_info(&g_host, 0, &di), BERTH_OK);
    ck_assert_msg(strncmp(di.name, "x86_64 CPU (3 threads, ", 23) == 0, "device name '%s'", di.name);
    ck_assert_uint_eq(di.caps, BERTH_CAP_WRAP_HOST | BERTH_CAP_HOST_VISIBLE);
    const uint32_t w = BERTH_DTYPE_BIT(BERTH_DTYPE_F32) | BERTH_DTYPE_BIT(BERTH_DTYPE_BF16) |
                       BERTH_DTYPE_BIT(BERTH_DTYPE_F16);
    ck_assert_uint_eq(di.weight_dtypes, w);
    ck_assert_uint_eq(di.act_dtypes, BERTH_DTYPE_BIT(BERTH_DTYPE_F32));
    ck_assert_uint_eq(di.kv_dtypes, w);
    ck_assert_int_eq(di.compute_units, 3);
    ck_assert_uint_eq(di.total_memory, (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE));

    /* an out-struct from an older caller: only the fields it has are written */
    berth_device_info older;
    memset(&older, 0xab, sizeof older);
    older.struct_size = BERTH_SIZE_TO(berth_device_info, name);
    ck_assert_int_eq(vt->device_info(&g_host, 0, &older), BERTH_OK);
    ck_assert_str_eq(older.name, di.name);
    for (size_t i = BERTH_SIZE_TO(berth_device_info, name); i < sizeof older; i++)
        ck_assert_uint_eq(((unsigned char *)&older)[i], 0xab);
    expect_error(vt->device_info(&g_host, 1, &di), BERTH_E_NOT_FOUND, "cpu: device 1 does not exist (1 device)");
}
END_TEST

START_TEST(test_config_threads)
{
    berth_backend *b2;
    snprintf(g_threads, sizeof g_threads, "abc");
    expect_error(vt->init(&g_host, 0, &b2), BERTH_E_INVALID, "[backend.cpu] threads = 'abc' is not an integer in 0..1024");
    snprintf(g_threads, sizeof g_threads, "-2");
    expect_error(vt->init(&g_host, 0, &b2), BERTH_E_INVALID, "[backend.cpu] threads = '-2' is not an integer in 0..1024");
    snprintf(g_threads, sizeof g_threads, "0");
    snprintf(g_isa, sizeof g_isa, "neon");
    expect_error(vt->init(&g_host, 0, &b2), BERTH_E_INVALID,
                 "[backend.cpu] isa = 'neon' is not one of auto, avx512, avx2, generic that this CPU runs");
    snprintf(g_isa, sizeof g_isa, "generic");
    berth_device_info dg = {.struct_size = sizeof dg};
    ck_assert_int_eq(vt->device_info(&g_host, 0, &dg), BERTH_OK);
    ck_assert_msg(strstr(dg.name, ", generic)") != NULL, "device name '%s'", dg.name);
    g_isa[0] = '\0';
    ck_assert_int_eq(vt->init(&g_host, 0, &b2), BERTH_OK);
    berth_device_info di = {.struct_size = sizeof di};
    ck_assert_int_eq(vt->device_info(&g_host, 0, &di), BERTH_OK);
    ck_assert_int_eq(di.compute_units, (int)sysconf(_SC_NPROCESSORS_ONLN));
    vt->destroy(b2);
    snprintf(g_threads, sizeof g_threads, "3");
}
END_TEST

START_TEST(test_buffers)
{
    berth_buffer *b;
    void *p;
    ck_assert_int_eq(vt->buffer_alloc(be, 1000, BERTH_USAGE_ACTIVATIONS, &b), BERTH_OK);
    ck_assert_int_eq(vt->buffer_host_ptr(be, b, &p), BERTH_OK);
    ck_assert_uint_eq((uintptr_t)p % 64, 0);
    unsigned char src[100], dst[100];
    for (int i = 0; i < 100; i++)
        src[i] = (unsigned char)rng_next();
    ck_assert_int_eq(vt->buffer_upload(be, st, b, 900, src, 100), BERTH_OK);
    ck_assert_int_eq(vt->buffer_copy(be, st, b, 10, b, 900, 100), BERTH_OK);
    ck_assert_int_eq(vt->buffer_fill(be, st, b, 900, 0x5a, 50), BERTH_OK);
    ck_assert_int_eq(vt->stream_sync(be, st), BERTH_OK);
    ck_assert_int_eq(vt->buffer_download(be, st, b, 10, dst, 100), BERTH_OK);
    ck_assert_mem_eq(dst, src, 100);
    ck_assert_int_eq(vt->buffer_download(be, st, b, 900, dst, 100), BERTH_OK);
    for (int i = 0; i < 50; i++)
        ck_assert_uint_eq(dst[i], 0x5a);
    ck_assert_mem_eq(dst + 50, src + 50, 50);
    expect_error(vt->buffer_upload(be, st, b, 901, src, 100), BERTH_E_INVALID,
                 "cpu: buffer_upload: bytes [901, +100) outside the 1000-byte buffer");
    expect_error(vt->buffer_download(be, st, b, UINT64_MAX, dst, 2), BERTH_E_INVALID,
                 "cpu: buffer_download: bytes [18446744073709551615, +2) outside the 1000-byte buffer");
    vt->buffer_free(be, b);
    vt->buffer_free(be, NULL);

    /* wrapped host memory: same address; read-only is never written */
    float host[16] = {0};
    ck_assert_int_eq(vt->buffer_wrap_host(be, host, sizeof host, 1, &b), BERTH_OK);
    ck_assert_int_eq(vt->buffer_host_ptr(be, b, &p), BERTH_OK);
    ck_assert_ptr_eq(p, host);
    expect_error(vt->buffer_upload(be, st, b, 0, src, 4), BERTH_E_INVALID,
                 "cpu: buffer_upload: destination buffer is read-only");
    expect_error(vt->buffer_fill(be, st, b, 0, 0, 4), BERTH_E_INVALID, "cpu: buffer_fill: destination buffer is read-only");
    berth_unary_params u = {.struct_size = sizeof u, .act = BERTH_ACT_IDENTITY, .in_scale = 1, .out_scale = 1};
    u.x = (berth_tensor){.buf = b, .dtype = BERTH_DTYPE_F32, .ndim = 1, .ne = {16, 1, 1, 1}, .nb = {4, 64, 64, 64}};
    u.y = u.x;
    expect_error(ops->unary(be, st, &u), BERTH_E_INVALID, "unary: y is in a read-only buffer");
    vt->buffer_free(be, b);
    ck_assert_int_eq(vt->buffer_wrap_host(be, host, sizeof host, 0, &b), BERTH_OK);
    u.x.buf = u.y.buf = b;
    host[3] = 2.5f;
    u.out_scale = 2;
    ck_assert_int_eq(ops->unary(be, st, &u), BERTH_OK);
    ck_assert_float_eq(host[3], 5.0f);
    /* a view reaching past the buffer is rejected, not read */
    u.x.ne[0] = 17;
    u.y.ne[0] = 17;
    expect_error(ops->unary(be, st, &u), BERTH_E_INVALID, "unary: x view (offset 0) reaches outside its 64-byte buffer");
    vt->buffer_free(be, b);
}
END_TEST

/* ---------------------------------------------------------------------------------------------------------------
 * matmul */

/* One matmul case: x {K, M} (rows as ne1 x ne2 = M), w {K, N} of wdt, optional bias, accumulate. */
static void matmul_case(int64_t K, int64_t N, int64_t M1, int64_t M2, berth_dtype wdt, int pad, int bias_mode,
                        int accumulate)
{
    struct tt x = tt_new(BERTH_DTYPE_F32, K, M1, M2, 1, pad);
    struct tt w = tt_new(wdt, K, N, 1, 1, 0);
    struct tt y = tt_new(BERTH_DTYPE_F32, N, M1 * M2, 1, 1, pad ? 3 : 0);
    struct tt bias = tt_new(bias_mode == 2 ? BERTH_DTYPE_BF16 : BERTH_DTYPE_F32, N, 1, 1, 1, 0);
    trand(&x.t, -1, 1);
    trand(&w.t, -1, 1);
    trand(&bias.t, -1, 1);
    const int64_t M = M1 * M2;
    double *y0 = malloc(sizeof(double) * (size_t)(M * N));
    if (accumulate) {
        trand(&y.t, -1, 1);
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++)
                y0[m * N + n] = tget(&y.t, n, m, 0, 0);
    } else {
        tpoison(&y.t);
    }
    tsnap(&y);
    berth_matmul_params p = {.struct_size = sizeof p, .accumulate = accumulate, .x = x.t, .w = w.t, .y = y.t};
    p.bias = bias_mode ? bias.t : absent;
    ck_assert_int_eq(vt->supports(be, BERTH_OP_MATMUL, &p), BERTH_OK);
    CHECK(ops->matmul(be, st, &p) == BERTH_OK, "matmul: %s", g_last_error);
    char what[96];
    snprintf(what, sizeof what, "matmul K%" PRId64 " N%" PRId64 " M%" PRId64 " %s pad%d bias%d acc%d", K, N, M, dtn(wdt),
             pad, bias_mode, accumulate);
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double ref = 0, scale = 0;
            for (int64_t k = 0; k < K; k++) {
                const double t = tget(&x.t, k, m % M1, m / M1, 0) * tget(&w.t, k, n, 0, 0);
                ref += t;
                scale += fabs(t);
            }
            if (bias_mode) {
                ref += tget(&bias.t, n, 0, 0, 0);
                scale += fabs(tget(&bias.t, n, 0, 0, 0));
            }
            if (accumulate) {
                ref += y0[m * N + n];
                scale += fabs(y0[m * N + n]);
            }
            check_close(tget(&y.t, n, m, 0, 0), ref, scale, 1e-5, what, n, m, 0, 0);
        }
    tcheck_outside(&y, &y.t, what);
    free(y0);
    tt_free(&x);
    tt_free(&w);
    tt_free(&y);
    tt_free(&bias);
}

/* Runs cases() once per kernel ISA this CPU runs (the plugin's `isa` key pins one; the generic kernels must always
 * be there), with be swapped for a backend pinned to it, so the portable kernels are tested too. */
static void for_each_isa(void (*cases)(void))
{
    static const char *const isas[] = {"generic", "avx2", "avx512"};
    berth_backend *const main_be = be;
    for (int i = 0; i < 3; i++) {
        snprintf(g_isa, sizeof g_isa, "%s", isas[i]);
        berth_backend *b2;
        if (vt->init(&g_host, 0, &b2) != BERTH_OK) {
            ck_assert_msg(i > 0, "generic kernels must always be available: %s", g_last_error);
            continue; /* this CPU lacks the ISA */
        }
        be = b2;
        cases();
        be = main_be;
        vt->destroy(b2);
    }
    g_isa[0] = '\0';
}

static void matmul_cases(void)
{
    for (int d = 0; d < 3; d++) {
        matmul_case(67, 131, 1, 1, wdts[d], 0, 0, 0);  /* decode */
        matmul_case(67, 131, 5, 1, wdts[d], 1, 1, 0);  /* small prefill, strided x and y, f32 bias */
        matmul_case(67, 131, 2, 3, wdts[d], 0, 2, 1);  /* x 3-D flattened, bf16 bias, accumulate */
        matmul_case(96, 9, 3, 1, wdts[d], 2, 0, 1);    /* K a multiple of every vector block, N < threads * tile */
        matmul_case(1, 5, 7, 1, wdts[d], 0, 1, 0);     /* K = 1: all tail */
    }
    /* x blocks: more rows than one block (64) and K split in several blocks */
    matmul_case(1700, 21, 70, 1, BERTH_DTYPE_BF16, 0, 1, 0);
    matmul_case(1300, 13, 9, 1, BERTH_DTYPE_F16, 1, 0, 1);
    matmul_case(2100, 7, 33, 1, BERTH_DTYPE_F32, 0, 0, 0);
}

/* Every kernel ISA this CPU runs. */
START_TEST(test_matmul)
{
    for_each_isa(matmul_cases);
}
END_TEST

/* Special f16 and bf16 weights (subnormals, infinities excluded: they would poison sums) widen exactly. */
START_TEST(test_matmul_special_weights)
{
    const int64_t K = 80;
    for (int d = 1; d < 3; d++) {
        struct tt x = tt_new(BERTH_DTYPE_F32, K, 1, 1, 1, 0);
        struct tt w = tt_new(wdts[d], K, 4, 1, 1, 0);
        struct tt y = tt_new(BERTH_DTYPE_F32, 4, 1, 1, 1, 0);
        /* one-hot x picks single weights, so y is each weight widened */
        for (int64_t n = 0; n < 4; n++)
            for (int64_t k = 0; k < K; k++) {
                uint16_t h = (uint16_t)rng_next();
                if (wdts[d] == BERTH_DTYPE_F16 && (h & 0x7c00) == 0x7c00)
                    h &= 0x83ff; /* make inf/NaN a subnormal */
                if (wdts[d] == BERTH_DTYPE_BF16 && (h & 0x7f80) == 0x7f80)
                    h &= 0x807f;
                memcpy(tptr(&w.t, k, n, 0, 0), &h, 2);
            }
        for (int64_t k = 0; k < K; k++) {
            FOR_EACH(&x.t, a, b, c, e) tset(&x.t, a, b, c, e, a == k ? 1.0 : 0.0);
            berth_matmul_params p = {.struct_size = sizeof p, .x = x.t, .w = w.t, .y = y.t};
            ck_assert_int_eq(ops->matmul(be, st, &p), BERTH_OK);
            for (int64_t n = 0; n < 4; n++)
                CHECK(tget(&y.t, n, 0, 0, 0) == tget(&w.t, k, n, 0, 0), "%s weight k%" PRId64 " n%" PRId64 ": %.9g vs %.9g",
                      dtn(wdts[d]), k, n, tget(&y.t, n, 0, 0, 0), tget(&w.t, k, n, 0, 0));
        }
        tt_free(&x);
        tt_free(&w);
        tt_free(&y);
    }
}
END_TEST

/* Results do not depend on the thread count: a 1-thread backend gives bit-identical outputs. */
START_TEST(test_matmul_threads_invariant)
{
    snprintf(g_threads, sizeof g_threads, "1");
    berth_backend *b1;
    ck_assert_int_eq(vt->init(&g_host, 0, &b1), BERTH_OK);
    snprintf(g_threads, sizeof g_threads, "3");
    struct tt x = tt_new(BERTH_DTYPE_F32, 300, 6, 1, 1, 0);
    struct tt w = tt_new(BERTH_DTYPE_BF16, 300, 77, 1, 1, 0);
    struct tt y1 = tt_new(BERTH_DTYPE_F32, 77, 6, 1, 1, 0), y3 = tt_new(BERTH_DTYPE_F32, 77, 6, 1, 1, 0);
    trand(&x.t, -1, 1);
    trand(&w.t, -1, 1);
    berth_matmul_params p = {.struct_size = sizeof p, .x = x.t, .w = w.t, .y = y1.t};
    ck_assert_int_eq(vt->get_ops(b1)->matmul(b1, st, &p), BERTH_OK);
    p.y = y3.t;
    ck_assert_int_eq(ops->matmul(be, st, &p), BERTH_OK);
    ck_assert_mem_eq(y1.host, y3.host, y1.bytes);
    vt->destroy(b1);
    tt_free(&x);
    tt_free(&w);
    tt_free(&y1);
    tt_free(&y3);
}
END_TEST

/* The RMS-norm prologue: matmul(x, prologue) is bit-identical to rms_norm(x) -> u; matmul(u), for every weight
 * mode, norm-weight and matrix dtype, strided x, and M on both sides of the kernels' blocking; x is untouched. */
static void matmul_norm_case(int64_t K, int64_t N, int64_t M, int pad, int32_t mode, berth_dtype wdt, berth_dtype nwdt)
{
    struct tt x = tt_new(BERTH_DTYPE_F32, K, M, 1, 1, pad);
    struct tt u = tt_new(BERTH_DTYPE_F32, K, M, 1, 1, 0);
    struct tt w = tt_new(wdt, K, N, 1, 1, 0);
    struct tt nw = tt_new(nwdt, K, 1, 1, 1, 0);
    struct tt y1 = tt_new(BERTH_DTYPE_F32, N, M, 1, 1, 0), y2 = tt_new(BERTH_DTYPE_F32, N, M, 1, 1, 0);
    trand(&x.t, -3, 3);
    trand(&w.t, -1, 1);
    trand(&nw.t, -1, 1);
    double *x0 = tload(&x.t);
    const float eps = 1e-6f;
    const int weighted = mode == BERTH_NORM_W || mode == BERTH_NORM_W_ONE_PLUS;
    berth_rms_norm_params rp = {.struct_size = sizeof rp, .weight_mode = mode, .eps = eps, .x = x.t,
                                .w = weighted ? nw.t : absent, .residual = absent, .y = u.t};
    CHECK(ops->rms_norm(be, st, &rp) == BERTH_OK, "%s", g_last_error);
    berth_matmul_params p = {.struct_size = sizeof p, .x = u.t, .w = w.t, .y = y1.t};
    CHECK(ops->matmul(be, st, &p) == BERTH_OK, "%s", g_last_error);
    p.x = x.t;
    p.y = y2.t;
    p.x_norm_mode = mode;
    p.x_norm_eps = eps;
    p.x_norm_w = weighted ? nw.t : absent;
    ck_assert_int_eq(vt->supports(be, BERTH_OP_MATMUL, &p), BERTH_OK);
    CHECK(ops->matmul(be, st, &p) == BERTH_OK, "%s", g_last_error);
    CHECK(memcmp(y1.host, y2.host, y1.bytes) == 0, "matmul prologue K%" PRId64 " N%" PRId64 " M%" PRId64
          " mode %d w %s norm w %s: differs from rms_norm + matmul", K, N, M, (int)mode, dtn(wdt), dtn(nwdt));
    double *x1 = tload(&x.t);
    CHECK(memcmp(x0, x1, sizeof(double) * (size_t)(K * M)) == 0, "matmul prologue modified x");
    free(x0);
    free(x1);
    tt_free(&x);
    tt_free(&u);
    tt_free(&w);
    tt_free(&nw);
    tt_free(&y1);
    tt_free(&y2);
}

START_TEST(test_matmul_norm_prologue)
{
    static const int32_t modes[] = {BERTH_NORM_W, BERTH_NORM_W_ONE_PLUS, BERTH_NORM_UNIT};
    for (int i = 0; i < 3; i++) {
        matmul_norm_case(67, 131, 1, 0, modes[i], wdts[i], wdts[(i + 1) % 3]);
        matmul_norm_case(96, 9, 5, 1, modes[i], wdts[(i + 1) % 3], wdts[(i + 2) % 3]);
        matmul_norm_case(300, 21, 70, 2, modes[i], wdts[(i + 2) % 3], wdts[i]);
    }
}
END_TEST

/* A caller compiled before the prologue (struct_size up to y) gets a plain matmul whatever follows in memory;
 * x_norm_mode W_NONE is a plain matmul too. */
START_TEST(test_matmul_norm_prologue_old_caller)
{
    const int64_t K = 40, N = 7, M = 3;
    struct tt x = tt_new(BERTH_DTYPE_F32, K, M, 1, 1, 0);
    struct tt w = tt_new(BERTH_DTYPE_BF16, K, N, 1, 1, 0);
    struct tt y1 = tt_new(BERTH_DTYPE_F32, N, M, 1, 1, 0), y2 = tt_new(BERTH_DTYPE_F32, N, M, 1, 1, 0);
    trand(&x.t, -2, 2);
    trand(&w.t, -1, 1);
    berth_matmul_params p = {.struct_size = sizeof p, .x = x.t, .w = w.t, .y = y1.t};
    ck_assert_int_eq(ops->matmul(be, st, &p), BERTH_OK);
    p.y = y2.t;
    p.struct_size = (uint32_t)BERTH_SIZE_TO(berth_matmul_params, y);
    p.x_norm_mode = 77; /* beyond struct_size: never read */
    p.x_norm_eps = -1.0f;
    ck_assert_int_eq(vt->supports(be, BERTH_OP_MATMUL, &p), BERTH_OK);
    CHECK(ops->matmul(be, st, &p) == BERTH_OK, "%s", g_last_error);
    ck_assert_mem_eq(y1.host, y2.host, y1.bytes);
    tt_free(&x);
    tt_free(&w);
    tt_free(&y1);
    tt_free(&y2);
}
END_TEST

/* Two f32 views hold the same bits element by element (and were written: not NaN). */
static void same_bits(const berth_tensor *got, const berth_tensor *ref, const char *what)
{
    FOR_EACH(got, a, b, c, d)
    {
        const float g = (float)tget(got, a, b, c, d), r = (float)tget(ref, a, b, c, d);
        CHECK(!isnan(r) && memcmp(tptr(got, a, b, c, d), tptr(ref, a, b, c, d), 4) == 0,
              "%s: element (%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 ") %.9g, unfused %.9g", what, a, b, c, d,
              (double)g, (double)r);
    }
}

/* A fresh tensor of src's shape (padding pad) holding src's values. */
static struct tt tt_copy(const berth_tensor *src, int pad)
{
    struct tt c = tt_new(src->dtype, src->ne[0], src->ne[1], src->ne[2], src->ne[3], pad);
    FOR_EACH(src, a, b, d, e) memcpy(tptr(&c.t, a, b, d, e), tptr(src, a, b, d, e), dt_size(src->dtype));
    return c;
}

/* The gated epilogue is bit-identical to matmul (into z) followed by glu: HALVES (w = [gate | up] rows, bias
 * {2N}) and MUL (a given up with strided rows, or y itself), with and without the norm prologue. M1 x M2 = rows
 * of x (y and up are {N, M}). */
static void matmul_glu_case(int32_t glu, int act, int64_t K, int64_t N, int64_t M1, int64_t M2, berth_dtype wdt,
                            int pad, int bias, int alias, int prologue)
{
    const int64_t M = M1 * M2, WN = glu == BERTH_GLU_HALVES ? 2 * N : N;
    struct tt x = tt_new(BERTH_DTYPE_F32, K, M1, M2, 1, pad);
    struct tt w = tt_new(wdt, K, WN, 1, 1, 0);
    struct tt b = tt_new(BERTH_DTYPE_BF16, WN, 1, 1, 1, 0);
    struct tt nw = tt_new(BERTH_DTYPE_F32, K, 1, 1, 1, 0);
    struct tt z = tt_new(BERTH_DTYPE_F32, WN, M, 1, 1, 0);
    struct tt up = tt_new(BERTH_DTYPE_F32, N, M, 1, 1, 2);
    struct tt y1 = tt_new(BERTH_DTYPE_F32, N, M, 1, 1, 0), y2 = tt_new(BERTH_DTYPE_F32, N, M, 1, 1, pad);
    trand(&x.t, -2, 2);
    trand(&w.t, -1, 1);
    trand(&b.t, -1, 1);
    trand(&nw.t, -1, 1);
    trand(&up.t, -2, 2);
    tpoison(&z.t);
    tpoison(&y1.t);
    tpoison(&y2.t);
    tsnap(&y2);
    struct tt up2 = tt_copy(&up.t, 1); /* operand and output of the aliased run */
    tsnap(&up2);
    char what[160];
    snprintf(what, sizeof what, "matmul glu %d act %d K%" PRId64 " N%" PRId64 " M%" PRId64 " %s pad%d bias%d alias%d "
             "prologue%d", glu, act, K, N, M, dtn(wdt), pad, bias, alias, prologue);

    /* unfused: z = x w^T (+ b), then glu over z's halves or with up */
    berth_matmul_params p = {.struct_size = sizeof p, .x = x.t, .w = w.t, .bias = bias ? b.t : absent, .y = z.t};
    if (prologue) {
        p.x_norm_mode = BERTH_NORM_W;
        p.x_norm_eps = 1e-6f;
        p.x_norm_w = nw.t;
    }
    CHECK(ops->matmul(be, st, &p) == BERTH_OK, "%s: %s", what, g_last_error);
    const int64_t ne[4] = {N, M, 1, 1}, nb[4] = {4, z.t.nb[1], z.t.nb[2], z.t.nb[3]};
    berth_glu_params gp = {.struct_size = sizeof gp, .act = act, .gate = view_of(&z, BERTH_DTYPE_F32, 0, ne, nb),
                           .up = glu == BERTH_GLU_HALVES ? view_of(&z, BERTH_DTYPE_F32, 4 * (uint64_t)N, ne, nb) : up.t,
                           .y = y1.t};
    CHECK(ops->glu(be, st, &gp) == BERTH_OK, "%s: %s", what, g_last_error);

    /* fused */
    struct tt *out = alias ? &up2 : &y2;
    p.y = out->t;
    p.y_glu = glu;
    p.y_glu_act = act;
    p.y_glu_up = glu == BERTH_GLU_MUL ? (alias ? up2.t : up.t) : absent;
    ck_assert_int_eq(vt->supports(be, BERTH_OP_MATMUL, &p), BERTH_OK);
    CHECK(ops->matmul(be, st, &p) == BERTH_OK, "%s: %s", what, g_last_error);
    same_bits(&out->t, &y1.t, what);
    tcheck_outside(out, &out->t, what);
    tt_free(&x);
    tt_free(&w);
    tt_free(&b);
    tt_free(&nw);
    tt_free(&z);
    tt_free(&up);
    tt_free(&up2);
    tt_free(&y1);
    tt_free(&y2);
}

static void matmul_glu_cases(void)
{
    for (int d = 0; d < 3; d++) {
        matmul_glu_case(BERTH_GLU_HALVES, BERTH_ACT_GELU_TANH, 67, 131, 1, 1, wdts[d], 0, 0, 0, 0); /* decode */
        matmul_glu_case(BERTH_GLU_HALVES, BERTH_ACT_SILU, 67, 37, 5, 1, wdts[d], 1, 1, 0, 1);
        matmul_glu_case(BERTH_GLU_MUL, BERTH_ACT_GELU_TANH, 67, 131, 1, 1, wdts[d], 0, 0, 0, 0);
        matmul_glu_case(BERTH_GLU_MUL, BERTH_ACT_GELU_ERF, 96, 9, 2, 3, wdts[d], 1, 1, 0, 1);
        matmul_glu_case(BERTH_GLU_MUL, BERTH_ACT_GELU_TANH, 45, 23, 7, 1, wdts[d], 0, 0, 1, 0); /* y is up */
    }
    matmul_glu_case(BERTH_GLU_HALVES, BERTH_ACT_GELU_TANH, 1300, 21, 70, 1, BERTH_DTYPE_BF16, 0, 1, 0, 1);
    matmul_glu_case(BERTH_GLU_MUL, BERTH_ACT_GELU_TANH, 1700, 13, 67, 1, BERTH_DTYPE_F16, 0, 0, 1, 1);
    matmul_glu_case(BERTH_GLU_HALVES, BERTH_ACT_IDENTITY, 1, 5, 9, 1, BERTH_DTYPE_F32, 1, 1, 0, 0); /* K = 1 */
}

/* Every kernel ISA this CPU runs, 3 threads (uneven column slices), odd sizes, M across the 64-row blocks and K
 * across several K blocks. */
START_TEST(test_matmul_glu_epilogue)
{
    for_each_isa(matmul_glu_cases);
}
END_TEST

/* A caller compiled before the epilogue (struct_size up to x_norm_w) gets a plain matmul; y_glu NONE too. */
START_TEST(test_matmul_glu_old_caller)
{
    const int64_t K = 40, N = 7, M = 3;
    struct tt x = tt_new(BERTH_DTYPE_F32, K, M, 1, 1, 0);
    struct tt w = tt_new(BERTH_DTYPE_BF16, K, N, 1, 1, 0);
    struct tt y1 = tt_new(BERTH_DTYPE_F32, N, M, 1, 1, 0), y2 = tt_new(BERTH_DTYPE_F32, N, M, 1, 1, 0);
    trand(&x.t, -2, 2);
    trand(&w.t, -1, 1);
    berth_matmul_params p = {.struct_size = sizeof p, .accumulate = 1, .x = x.t, .w = w.t, .y = y1.t};
    trand(&y1.t, -1, 1);
    memcpy(y2.host, y1.host, y1.bytes);
    ck_assert_int_eq(ops->matmul(be, st, &p), BERTH_OK);
    p.y = y2.t;
    p.struct_size = (uint32_t)BERTH_SIZE_TO(berth_matmul_params, x_norm_w);
    p.y_glu = 77; /* beyond struct_size: never read (and accumulate stays legal) */
    p.y_glu_act = -3;
    ck_assert_int_eq(vt->supports(be, BERTH_OP_MATMUL, &p), BERTH_OK);
    CHECK(ops->matmul(be, st, &p) == BERTH_OK, "%s", g_last_error);
    ck_assert_mem_eq(y1.host, y2.host, y1.bytes);
    tt_free(&x);
    tt_free(&w);
    tt_free(&y1);
    tt_free(&y2);
}
END_TEST

/* ---------------------------------------------------------------------------------------------------------------
 * get_rows */

START_TEST(test_get_rows)
{
    for (int d = 0; d < 3; d++) {
        const int64_t D = 37, N = 50, T = 9;
        struct tt table = tt_new(wdts[d], D, N, 1, 1, d == 0 ? 2 : 0);
        struct tt y = tt_new(BERTH_DTYPE_F32, D, T, 1, 1, 1);
        int32_t idv[9];
        for (int i = 0; i < T; i++)
            idv[i] = irand(0, (int)N - 1);
        idv[3] = idv[1]; /* repeated id */
        struct tt ids = ivec(idv, T);
        trand(&table.t, -2, 2);
        tpoison(&y.t);
        tsnap(&y);
        const float scale = (float)urand(0.5, 3);
        berth_get_rows_params p = {.struct_size = sizeof p, .scale = scale, .table = table.t, .ids = ids.t, .y = y.t};
        ck_assert_int_eq(vt->supports(be, BERTH_OP_GET_ROWS, &p), BERTH_OK);
        CHECK(ops->get_rows(be, st, &p) == BERTH_OK, "%s", g_last_error);
        FOR_EACH(&y.t, a, b, c, e)
        {
            const double ref = (double)scale * tget(&table.t, a, idv[b], 0, 0);
            check_close(tget(&y.t, a, b, c, e), ref, fabs(ref), 1e-6, "get_rows", a, b, c, e);
        }
        tcheck_outside(&y, &y.t, "get_rows");
        idv[4] = (int32_t)N;
        tset(&ids.t, 4, 0, 0, 0, N);
        expect_error(ops->get_rows(be, st, &p), BERTH_E_INVALID, "get_rows: ids[4] = 50 is outside the table's 50 rows");
        tt_free(&table);
        tt_free(&y);
        tt_free(&ids);
    }
}
END_TEST

/* ---------------------------------------------------------------------------------------------------------------
 * rms_norm, layer_norm, gated_rms_norm */

START_TEST(test_rms_norm)
{
    const int64_t n = 67, R1 = 3, R2 = 2;
    int round = 0;
    for (int wm = 0; wm <= BERTH_NORM_UNIT; wm++) /* UNIT: the same as W_NONE here */
        for (int rm = 0; rm < 3; rm++)
            for (int alias = 0; alias < 2; alias++, round++) {
                const berth_dtype wdt = wdts[round % 3];
                struct tt x = tt_new(BERTH_DTYPE_F32, n, R1, R2, 1, 1);
                struct tt y = tt_new(BERTH_DTYPE_F32, n, R1, R2, 1, 2);
                struct tt r = tt_new(BERTH_DTYPE_F32, n, R1, R2, 1, 0);
                struct tt w = tt_new(wdt, n, 1, 1, 1, 0);
                trand(&x.t, -3, 3);
                trand(&r.t, -1, 1);
                trand(&w.t, -1, 1);
                double *xv = tload(&x.t), *rv = tload(&r.t);
                const berth_tensor *out = alias ? &x.t : &y.t;
                if (!alias)
                    tpoison(&y.t);
                const float eps = 1e-5f;
                berth_rms_norm_params p = {.struct_size = sizeof p, .weight_mode = wm, .resid_mode = rm, .eps = eps,
                                           .x = x.t, .w = absent, .residual = rm ? r.t : absent, .y = *out};
                if (wm == BERTH_NORM_W || wm == BERTH_NORM_W_ONE_PLUS) /* W_NONE, UNIT: no weight tensor */
                    p.w = w.t;
                ck_assert_int_eq(vt->supports(be, BERTH_OP_RMS_NORM, &p), BERTH_OK);
                CHECK(ops->rms_norm(be, st, &p) == BERTH_OK, "%s", g_last_error);
                char what[64];
                snprintf(what, sizeof what, "rms_norm w%d r%d alias%d %s", wm, rm, alias, dtn(wdt));
                for (int64_t row = 0; row < R1 * R2; row++) {
                    double src[67], ss = 0;
                    for (int64_t i = 0; i < n; i++) {
                        src[i] = rm == BERTH_RESID_ADD_BEFORE ? (double)(float)(rv[row * n + i] + xv[row * n + i])
                                                              : xv[row * n + i];
                        ss += src[i] * src[i];
                    }
                    const double inv = 1.0 / sqrt(ss / n + eps);
                    for (int64_t i = 0; i < n; i++) {
                        double v = src[i] * inv;
                        const double wi = tget(&w.t, i, 0, 0, 0);
                        v *= wm == BERTH_NORM_W ? wi : wm == BERTH_NORM_W_ONE_PLUS ? 1 + wi : 1;
                        if (rm == BERTH_RESID_ADD_AFTER)
                            v += rv[row * n + i];
                        check_close(tget(out, i, row % R1, row / R1, 0), v, fabs(v) + 1, 2e-6, what, i, row, 0, 0);
                        if (rm == BERTH_RESID_ADD_BEFORE)
                            CHECK(tget(&r.t, i, row % R1, row / R1, 0) == src[i], "%s residual not updated", what);
                        else
                            CHECK(tget(&r.t, i, row % R1, row / R1, 0) == rv[row * n + i], "%s residual changed", what);
                    }
                }
                free(xv);
                free(rv);
                tt_free(&x);
                tt_free(&y);
                tt_free(&r);
                tt_free(&w);
            }
}
END_TEST

START_TEST(test_layer_norm)
{
    const int64_t n = 45, R = 5;
    for (int mask = 0; mask < 4; mask++)
        for (int rm = 0; rm < 3; rm++) {
            const berth_dtype wdt = wdts[(mask + rm) % 3];
            struct tt x = tt_new(BERTH_DTYPE_F32, n, R, 1, 1, 1);
            struct tt y = tt_new(BERTH_DTYPE_F32, n, R, 1, 1, 0);
            struct tt r = tt_new(BERTH_DTYPE_F32, n, R, 1, 1, 3);
            struct tt w = tt_new(wdt, n, 1, 1, 1, 0), b = tt_new(wdt, n, 1, 1, 1, 0);
            trand(&x.t, 1, 4); /* a large mean: the variance must not cancel */
            trand(&r.t, -1, 1);
            trand(&w.t, -1, 1);
            trand(&b.t, -1, 1);
            double *xv = tload(&x.t), *rv = tload(&r.t);
            tpoison(&y.t);
            berth_layer_norm_params p = {.struct_size = sizeof p, .resid_mode = rm, .eps = 1e-5f, .x = x.t,
                                         .w = (mask & 1) ? w.t : absent, .b = (mask & 2) ? b.t : absent,
                                         .residual = rm ? r.t : absent, .y = y.t};
            ck_assert_int_eq(vt->supports(be, BERTH_OP_LAYER_NORM, &p), BERTH_OK);
            CHECK(ops->layer_norm(be, st, &p) == BERTH_OK, "%s", g_last_error);
            for (int64_t row = 0; row < R; row++) {
                double src[45], mean = 0, var = 0;
                for (int64_t i = 0; i < n; i++) {
                    src[i] = rm == BERTH_RESID_ADD_BEFORE ? (double)(float)(rv[row * n + i] + xv[row * n + i])
                                                          : xv[row * n + i];
                    mean += src[i] / n;
                }
                for (int64_t i = 0; i < n; i++)
                    var += (src[i] - mean) * (src[i] - mean) / n;
                for (int64_t i = 0; i < n; i++) {
                    double v = (src[i] - mean) / sqrt(var + 1e-5);
                    if (mask & 1)
                        v *= tget(&w.t, i, 0, 0, 0);
                    if (mask & 2)
                        v += tget(&b.t, i, 0, 0, 0);
                    if (rm == BERTH_RESID_ADD_AFTER)
                        v += rv[row * n + i];
                    check_close(tget(&y.t, i, row, 0, 0), v, fabs(v) + 1, 1e-5, "layer_norm", i, row, mask, rm);
                }
            }
            free(xv);
            free(rv);
            tt_free(&x);
            tt_free(&y);
            tt_free(&r);
            tt_free(&w);
            tt_free(&b);
        }
}
END_TEST

START_TEST(test_gated_rms_norm)
{
    const int64_t n = 33, H = 3, T = 4;
    for (int d = 0; d < 3; d++) {
        struct tt x = tt_new(BERTH_DTYPE_F32, n, H, T, 1, 1), z = tt_new(BERTH_DTYPE_F32, n, H, T, 1, 0);
        struct tt y = tt_new(BERTH_DTYPE_F32, n, H, T, 1, 2), w = tt_new(wdts[d], n, 1, 1, 1, 0);
        trand(&x.t, -2, 2);
        trand(&z.t, -3, 3);
        trand(&w.t, 0.5, 1.5);
        tpoison(&y.t);
        berth_gated_rms_norm_params p = {.struct_size = sizeof p, .act = BERTH_ACT_SILU, .eps = 1e-6f,
                                         .x = x.t, .z = z.t, .w = w.t, .y = y.t};
        ck_assert_int_eq(vt->supports(be, BERTH_OP_GATED_RMS_NORM, &p), BERTH_OK);
        CHECK(ops->gated_rms_norm(be, st, &p) == BERTH_OK, "%s", g_last_error);
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < H; h++) {
                double ss = 0;
                for (int64_t i = 0; i < n; i++)
                    ss += tget(&x.t, i, h, t, 0) * tget(&x.t, i, h, t, 0);
                const double inv = 1 / sqrt(ss / n + 1e-6);
                for (int64_t i = 0; i < n; i++) {
                    const double ref = tget(&x.t, i, h, t, 0) * inv * tget(&w.t, i, 0, 0, 0) *
                                       act_ref(BERTH_ACT_SILU, tget(&z.t, i, h, t, 0));
                    check_close(tget(&y.t, i, h, t, 0), ref, fabs(ref), 1e-5, "gated_rms_norm", i, h, t, d);
                }
            }
        tt_free(&x);
        tt_free(&z);
        tt_free(&y);
        tt_free(&w);
    }
}
END_TEST

/* ---------------------------------------------------------------------------------------------------------------
 * rope */

static void rope_case(int mode, int64_t d, int32_t pair_offset, int32_t n_pairs, int in_place, int pad)
{
    const int64_t H = 3, T = 5;
    struct tt x = tt_new(BERTH_DTYPE_F32, d, H, T, 1, pad);
    struct tt y = tt_new(BERTH_DTYPE_F32, d, H, T, 1, 1);
    struct tt freqs = tt_new(BERTH_DTYPE_F32, n_pairs > 0 ? n_pairs : 1, 1, 1, 1, 0);
    int32_t posv[5];
    for (int t = 0; t < T; t++)
        posv[t] = irand(0, 5000);
    struct tt pos = ivec(posv, T);
    for (int32_t j = 0; j < n_pairs; j++) /* Gemma-style proportional frequencies */
        tset(&freqs.t, j, 0, 0, 0, pow(10000.0, -2.0 * j / (double)d));
    trand(&x.t, -1, 1);
    double *xv = tload(&x.t);
    const berth_tensor *out = in_place ? &x.t : &y.t;
    if (!in_place)
        tpoison(&y.t);
    berth_rope_params p = {.struct_size = sizeof p, .mode = mode, .pair_offset = pair_offset, .n_pairs = n_pairs,
                           .x = x.t, .positions = pos.t, .freqs = n_pairs ? freqs.t : absent, .y = *out};
    ck_assert_int_eq(vt->supports(be, BERTH_OP_ROPE, &p), BERTH_OK);
    CHECK(ops->rope(be, st, &p) == BERTH_OK, "%s", g_last_error);
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++) {
            double ref[512];
            for (int64_t i = 0; i < d; i++)
                ref[i] = xv[(t * H + h) * d + i];
            for (int32_t j = 0; j < n_pairs; j++) {
                const float a = (float)posv[t] * (float)tget(&freqs.t, j, 0, 0, 0);
                const int64_t i0 = mode == BERTH_ROPE_HALF ? j : 2 * j;
                const int64_t i1 = mode == BERTH_ROPE_HALF ? j + pair_offset : 2 * j + 1;
                const double x0 = xv[(t * H + h) * d + i0], x1 = xv[(t * H + h) * d + i1];
                ref[i0] = x0 * cos(a) - x1 * sin(a);
                ref[i1] = x1 * cos(a) + x0 * sin(a);
            }
            for (int64_t i = 0; i < d; i++)
                check_close(tget(out, i, h, t, 0), ref[i], 1, 2e-6, mode ? "rope interleaved" : "rope half", i, h, t,
                            n_pairs);
        }
    free(xv);
    tt_free(&x);
    tt_free(&y);
    tt_free(&freqs);
    tt_free(&pos);
}

START_TEST(test_rope)
{
    rope_case(BERTH_ROPE_HALF, 32, 16, 4, 0, 1);   /* Gemma full layer in miniature: partial pairs */
    rope_case(BERTH_ROPE_HALF, 32, 16, 4, 1, 0);
    rope_case(BERTH_ROPE_HALF, 64, 32, 32, 0, 0);  /* every dim rotates */
    rope_case(BERTH_ROPE_HALF, 256, 32, 32, 1, 2); /* Qwen3.5: rotary slice inside a wider head */
    rope_case(BERTH_ROPE_HALF, 512, 256, 64, 0, 0); /* Gemma 4 full layer shape; > 1 chunk of pairs */
    rope_case(BERTH_ROPE_HALF, 512, 256, 100, 1, 0);
    rope_case(BERTH_ROPE_INTERLEAVED, 32, 0, 8, 0, 1);
    rope_case(BERTH_ROPE_INTERLEAVED, 32, 0, 16, 1, 0);
    rope_case(BERTH_ROPE_HALF, 16, 8, 0, 0, 1);    /* no pairs: a copy */
}
END_TEST

/* rms_norm with RoPE (and out_scale) is bit-identical to rms_norm, then rope, then a unary scale: HALF with a
 * partial pair count (Gemma 4 full layers: pair_offset d/2, n_pairs < d/2), more pairs than one chunk,
 * INTERLEAVED, strided x, in place, T as ne[2] x ne[3]. */
static void rms_rope_case(int mode, int64_t d, int32_t pair_offset, int32_t n_pairs, int32_t wm, int in_place,
                          int pad, float out_scale)
{
    const int64_t H = 3, T2 = 2, T3 = 3, T = T2 * T3;
    struct tt x = tt_new(BERTH_DTYPE_F32, d, H, T2, T3, pad);
    struct tt y1 = tt_new(BERTH_DTYPE_F32, d, H, T2, T3, 0), y2 = tt_new(BERTH_DTYPE_F32, d, H, T2, T3, 1);
    struct tt w = tt_new(BERTH_DTYPE_BF16, d, 1, 1, 1, 0);
    struct tt freqs = tt_new(BERTH_DTYPE_F32, n_pairs, 1, 1, 1, 0);
    int32_t posv[6];
    for (int t = 0; t < T; t++)
        posv[t] = irand(0, 70000);
    struct tt pos = ivec(posv, T);
    for (int32_t j = 0; j < n_pairs; j++)
        tset(&freqs.t, j, 0, 0, 0, pow(1e6, -2.0 * j / (double)d));
    trand(&x.t, -3, 3);
    trand(&w.t, -1, 1);
    tpoison(&y1.t);
    tpoison(&y2.t);
    tsnap(&y2);
    char what[128];
    snprintf(what, sizeof what, "rms_norm rope mode %d d%" PRId64 " off %d pairs %d w%d in_place%d pad%d scale %g",
             mode, d, pair_offset, n_pairs, wm, in_place, pad, (double)out_scale);

    /* unfused: rms_norm -> y1, rope in place over {d, H, T}, then the scale */
    berth_rms_norm_params rp = {.struct_size = sizeof rp, .weight_mode = wm, .eps = 1e-6f, .x = x.t, .w = w.t,
                                .residual = absent, .y = y1.t};
    CHECK(ops->rms_norm(be, st, &rp) == BERTH_OK, "%s: %s", what, g_last_error);
    berth_tensor y1t = y1.t; /* rope takes {d, heads, T}: the two token dims flattened */
    y1t.ne[2] = T, y1t.ne[3] = 1;
    berth_rope_params ro = {.struct_size = sizeof ro, .mode = mode, .pair_offset = pair_offset, .n_pairs = n_pairs,
                            .x = y1t, .positions = pos.t, .freqs = freqs.t, .y = y1t};
    CHECK(ops->rope(be, st, &ro) == BERTH_OK, "%s: %s", what, g_last_error);
    if (out_scale != 0.0f && out_scale != 1.0f) {
        berth_unary_params up = {.struct_size = sizeof up, .act = BERTH_ACT_IDENTITY, .in_scale = 1,
                                 .out_scale = out_scale, .x = y1.t, .y = y1.t};
        CHECK(ops->unary(be, st, &up) == BERTH_OK, "%s: %s", what, g_last_error);
    }

    /* fused */
    rp.y = in_place ? x.t : y2.t;
    rp.rope_mode = mode;
    rp.rope_pair_offset = pair_offset;
    rp.rope_n_pairs = n_pairs;
    rp.rope_positions = pos.t;
    rp.rope_freqs = freqs.t;
    rp.out_scale = out_scale;
    ck_assert_int_eq(vt->supports(be, BERTH_OP_RMS_NORM, &rp), BERTH_OK);
    CHECK(ops->rms_norm(be, st, &rp) == BERTH_OK, "%s: %s", what, g_last_error);
    same_bits(in_place ? &x.t : &y2.t, &y1.t, what);
    if (!in_place)
        tcheck_outside(&y2, &y2.t, what);
    tt_free(&x);
    tt_free(&y1);
    tt_free(&y2);
    tt_free(&w);
    tt_free(&freqs);
    tt_free(&pos);
}

START_TEST(test_rms_norm_rope)
{
    rms_rope_case(BERTH_ROPE_HALF, 32, 16, 4, BERTH_NORM_W, 0, 1, 0.0f);       /* full layer in miniature */
    rms_rope_case(BERTH_ROPE_HALF, 32, 16, 16, BERTH_NORM_W_ONE_PLUS, 1, 0, 1.0f); /* every dim, in place */
    rms_rope_case(BERTH_ROPE_HALF, 512, 256, 64, BERTH_NORM_W, 0, 0, 0.0f);    /* Gemma 4 full layer */
    rms_rope_case(BERTH_ROPE_HALF, 256, 128, 128, BERTH_NORM_W, 1, 2, 0.0f);   /* sliding: 2 chunks of pairs */
    rms_rope_case(BERTH_ROPE_HALF, 46, 23, 5, BERTH_NORM_UNIT, 0, 1, -0.375f); /* odd d, rotated and scaled */
    rms_rope_case(BERTH_ROPE_INTERLEAVED, 34, 0, 8, BERTH_NORM_W, 0, 1, 0.0f);
    rms_rope_case(BERTH_ROPE_INTERLEAVED, 34, 0, 17, BERTH_NORM_W, 1, 0, 1.75f);
}
END_TEST

/* out_scale: y = (residual + norm(x)) * s bit-identical to rms_norm ADD_AFTER then a unary scale; ADD_BEFORE
 * scales y but not the updated residual; 0 and 1 change nothing. */
START_TEST(test_rms_norm_out_scale)
{
    const int64_t n = 61, R = 5;
    for (int rm = 0; rm < 3; rm++)
        for (int k = 0; k < 3; k++) {
            const float s = k == 0 ? 0.0f : k == 1 ? 1.0f : (float)urand(-2, 2);
            struct tt x = tt_new(BERTH_DTYPE_F32, n, R, 1, 1, 1), w = tt_new(BERTH_DTYPE_F16, n, 1, 1, 1, 0);
            struct tt r = tt_new(BERTH_DTYPE_F32, n, R, 1, 1, 0);
            struct tt y1 = tt_new(BERTH_DTYPE_F32, n, R, 1, 1, 0), y2 = tt_new(BERTH_DTYPE_F32, n, R, 1, 1, 2);
            trand(&x.t, -3, 3);
            trand(&w.t, -1, 1);
            trand(&r.t, -1, 1);
            struct tt r2 = tt_copy(&r.t, 0);
            tpoison(&y1.t);
            tpoison(&y2.t);
            tsnap(&y2);
            char what[64];
            snprintf(what, sizeof what, "rms_norm out_scale %g resid %d", (double)s, rm);
            berth_rms_norm_params p = {.struct_size = sizeof p, .weight_mode = BERTH_NORM_W, .resid_mode = rm,
                                       .eps = 1e-5f, .x = x.t, .w = w.t, .residual = rm ? r.t : absent, .y = y1.t};
            CHECK(ops->rms_norm(be, st, &p) == BERTH_OK, "%s", g_last_error);
            if (k == 2) {
                berth_unary_params u = {.struct_size = sizeof u, .act = BERTH_ACT_IDENTITY, .in_scale = 1,
                                        .out_scale = s, .x = y1.t, .y = y1.t};
                CHECK(ops->unary(be, st, &u) == BERTH_OK, "%s", g_last_error);
            }
            p.residual = rm ? r2.t : absent;
            p.y = y2.t;
            p.out_scale = s;
            ck_assert_int_eq(vt->supports(be, BERTH_OP_RMS_NORM, &p), BERTH_OK);
            CHECK(ops->rms_norm(be, st, &p) == BERTH_OK, "%s", g_last_error);
            same_bits(&y2.t, &y1.t, what);
            tcheck_outside(&y2, &y2.t, what);
            same_bits(&r2.t, &r.t, what); /* the residual (updated by ADD_BEFORE) is never scaled */
            tt_free(&x);
            tt_free(&w);
            tt_free(&r);
            tt_free(&r2);
            tt_free(&y1);
            tt_free(&y2);
        }
}
END_TEST

/* The second output: y2 = RMSNorm(y) * w2 bit-identical to rms_norm, then another rms_norm of y; every residual
 * mode, with out_scale, each y2 weight mode (bf16 / f32 weights), strided y2 rows. */
START_TEST(test_rms_norm_second_output)
{
    const int64_t n = 77, R = 6;
    for (int rm = 0; rm < 3; rm++)
        for (int wm2 = 0; wm2 < 4; wm2++) {
            const float s = rm == 1 ? 0.75f : 0.0f;
            struct tt x = tt_new(BERTH_DTYPE_F32, n, R, 1, 1, 1), w = tt_new(BERTH_DTYPE_F32, n, 1, 1, 1, 0);
            struct tt w2 = tt_new(wm2 == 2 ? BERTH_DTYPE_BF16 : BERTH_DTYPE_F32, n, 1, 1, 1, 0);
            struct tt r = tt_new(BERTH_DTYPE_F32, n, R, 1, 1, 0), y = tt_new(BERTH_DTYPE_F32, n, R, 1, 1, 0);
            struct tt z1 = tt_new(BERTH_DTYPE_F32, n, R, 1, 1, 0), z2 = tt_new(BERTH_DTYPE_F32, n, R, 1, 1, 3);
            trand(&x.t, -3, 3);
            trand(&w.t, -1, 1);
            trand(&w2.t, -1, 1);
            trand(&r.t, -1, 1);
            struct tt r2 = tt_copy(&r.t, 0), y1 = tt_copy(&y.t, 0);
            tpoison(&y.t);
            tpoison(&y1.t);
            tpoison(&z1.t);
            tpoison(&z2.t);
            tsnap(&z2);
            char what[64];
            snprintf(what, sizeof what, "rms_norm y2 resid %d y2 weight %d", rm, wm2);
            /* reference: the post-norm, then a separate rms_norm of its output */
            berth_rms_norm_params p = {.struct_size = sizeof p, .weight_mode = BERTH_NORM_W, .resid_mode = rm,
                                       .eps = 1e-5f, .x = x.t, .w = w.t, .residual = rm ? r.t : absent, .y = y1.t,
                                       .out_scale = s};
            CHECK(ops->rms_norm(be, st, &p) == BERTH_OK, "%s", g_last_error);
            berth_rms_norm_params q = {.struct_size = sizeof q, .weight_mode = wm2, .eps = 1e-5f, .x = y1.t,
                                       .w = (wm2 == BERTH_NORM_W || wm2 == BERTH_NORM_W_ONE_PLUS) ? w2.t : absent, .residual = absent,
                                       .y = z1.t};
            CHECK(ops->rms_norm(be, st, &q) == BERTH_OK, "%s", g_last_error);
            /* fused */
            p.residual = rm ? r2.t : absent;
            p.y = y.t;
            p.y2_weight_mode = wm2;
            p.y2_w = (wm2 == BERTH_NORM_W || wm2 == BERTH_NORM_W_ONE_PLUS) ? w2.t : absent;
            p.y2 = z2.t;
            ck_assert_int_eq(vt->supports(be, BERTH_OP_RMS_NORM, &p), BERTH_OK);
            CHECK(ops->rms_norm(be, st, &p) == BERTH_OK, "%s", g_last_error);
            same_bits(&y.t, &y1.t, what);
            same_bits(&z2.t, &z1.t, what);
            tcheck_outside(&z2, &z2.t, what);
            same_bits(&r2.t, &r.t, what);
            if (rm == 1 && wm2 == 1) { /* y2 sharing bytes with y, x or the residual is refused at execution */
                p.y = y.t;
                p.y2 = y.t;
                expect_error(ops->rms_norm(be, st, &p), BERTH_E_INVALID, "rms_norm: y2 overlaps y");
                p.y2 = x.t;
                expect_error(ops->rms_norm(be, st, &p), BERTH_E_INVALID, "rms_norm: y2 overlaps x");
                p.y2 = r2.t;
                expect_error(ops->rms_norm(be, st, &p), BERTH_E_INVALID, "rms_norm: y2 overlaps the residual");
            }
            tt_free(&x);
            tt_free(&w);
            tt_free(&w2);
            tt_free(&r);
            tt_free(&r2);
            tt_free(&y);
            tt_free(&y1);
            tt_free(&z1);
            tt_free(&z2);
        }
}
END_TEST

/* The matmul's trailing norm (y_norm): bit-identical to matmul, then rms_norm on its y (residual, out_scale and a
 * second output included); y_norm's x must be the product's y; no RoPE. */
START_TEST(test_matmul_then_norm)
{
    const int64_t K = 96, N = 77;
    for (int64_t M = 1; M <= 9; M += 4) {
        struct tt x = tt_new(BERTH_DTYPE_F32, K, M, 1, 1, 1), w = tt_new(BERTH_DTYPE_BF16, K, N, 1, 1, 0);
        struct tt nw = tt_new(BERTH_DTYPE_F32, N, 1, 1, 1, 0), nw2 = tt_new(BERTH_DTYPE_F32, N, 1, 1, 1, 0);
        struct tt r = tt_new(BERTH_DTYPE_F32, N, M, 1, 1, 0);
        struct tt a1 = tt_new(BERTH_DTYPE_F32, N, M, 1, 1, 0), a2 = tt_new(BERTH_DTYPE_F32, N, M, 1, 1, 0);
        struct tt y1 = tt_new(BERTH_DTYPE_F32, N, M, 1, 1, 0), y2 = tt_new(BERTH_DTYPE_F32, N, M, 1, 1, 0);
        struct tt u1 = tt_new(BERTH_DTYPE_F32, N, M, 1, 1, 0), u2 = tt_new(BERTH_DTYPE_F32, N, M, 1, 1, 0);
        trand(&x.t, -2, 2);
        trand(&w.t, -1, 1);
        trand(&nw.t, -1, 1);
        trand(&nw2.t, -1, 1);
        trand(&r.t, -1, 1);
        /* reference: two ops */
        berth_matmul_params p = {.struct_size = sizeof p, .x = x.t, .w = w.t, .y = a1.t};
        CHECK(ops->matmul(be, st, &p) == BERTH_OK, "%s", g_last_error);
        berth_rms_norm_params q = {.struct_size = sizeof q, .weight_mode = BERTH_NORM_W,
                                   .resid_mode = BERTH_RESID_ADD_AFTER, .eps = 1e-6f, .x = a1.t, .w = nw.t,
                                   .residual = r.t, .y = y1.t, .out_scale = 0.5f, .y2_weight_mode = BERTH_NORM_W,
                                   .y2_w = nw2.t, .y2 = u1.t};
        CHECK(ops->rms_norm(be, st, &q) == BERTH_OK, "%s", g_last_error);
        /* one op */
        q.x = a2.t;
        q.y = y2.t;
        q.y2 = u2.t;
        p.y = a2.t;
        p.y_norm = &q;
        ck_assert_int_eq(vt->supports(be, BERTH_OP_MATMUL, &p), BERTH_OK);
        CHECK(ops->matmul(be, st, &p) == BERTH_OK, "%s", g_last_error);
        same_bits(&a2.t, &a1.t, "matmul y_norm: the product");
        same_bits(&y2.t, &y1.t, "matmul y_norm: the norm");
        same_bits(&u2.t, &u1.t, "matmul y_norm: the second output");
        /* the norm's x is not the product's y */
        q.x = a1.t;
        expect_error(ops->matmul(be, st, &p), BERTH_E_INVALID,
                     "matmul: y_norm's x must be the matmul's y (same buffer, offset, dtype, shape and strides)");
        q.x = a2.t;
        q.weight_mode = 9;
        expect_error(ops->matmul(be, st, &p), BERTH_E_UNSUPPORTED,
                     "matmul: y_norm: rms_norm: weight_mode 9 is not supported");
        tt_free(&x);
        tt_free(&w);
        tt_free(&nw);
        tt_free(&nw2);
        tt_free(&r);
        tt_free(&a1);
        tt_free(&a2);
        tt_free(&y1);
        tt_free(&y2);
        tt_free(&u1);
        tt_free(&u2);
    }
}
END_TEST

static void expect_unsupported(int32_t op, const void *params, const char *msg); /* supports() refuses with msg */

/* Every element of t is still NaN (tpoison): a refused op wrote nothing there. */
static void still_poisoned(const berth_tensor *t, const char *what)
{
    FOR_EACH(t, i0, i1, i2, i3)
        ck_assert_msg(isnan(tget(t, i0, i1, i2, i3)), "%s: [%lld, %lld] was written", what, (long long)i0,
                      (long long)i1);
}

/* The matmul's norm before the product (x_pre): bit-identical to rms_norm (residual ADD_AFTER, out_scale, with and
 * without a second output), then matmul on the norm's y2 (else its y), every output of the norm written; x must be
 * that output; no RoPE, no x_norm prologue, no y_norm; a refused op writes none of the norm's outputs. */
START_TEST(test_norm_then_matmul)
{
    const int64_t K = 96, N = 77;
    for (int64_t M = 1; M <= 9; M += 4)
        for (int with_y2 = 0; with_y2 < 2; with_y2++) {
            struct tt x = tt_new(BERTH_DTYPE_F32, K, M, 1, 1, 1), w = tt_new(BERTH_DTYPE_BF16, K, N, 1, 1, 0);
            struct tt nw = tt_new(BERTH_DTYPE_F32, K, 1, 1, 1, 0), nw2 = tt_new(BERTH_DTYPE_F32, K, 1, 1, 1, 0);
            struct tt r = tt_new(BERTH_DTYPE_F32, K, M, 1, 1, 0);
            struct tt y1 = tt_new(BERTH_DTYPE_F32, K, M, 1, 1, 0), y2 = tt_new(BERTH_DTYPE_F32, K, M, 1, 1, 0);
            struct tt u1 = tt_new(BERTH_DTYPE_F32, K, M, 1, 1, 0), u2 = tt_new(BERTH_DTYPE_F32, K, M, 1, 1, 0);
            struct tt a1 = tt_new(BERTH_DTYPE_F32, N, M, 1, 1, 0), a2 = tt_new(BERTH_DTYPE_F32, N, M, 1, 1, 0);
            trand(&x.t, -2, 2);
            trand(&w.t, -1, 1);
            trand(&nw.t, -1, 1);
            trand(&nw2.t, -1, 1);
            trand(&r.t, -1, 1);
            char what[96];
            snprintf(what, sizeof what, "matmul x_pre M=%lld %s", (long long)M, with_y2 ? "x = y2" : "x = y");
            /* reference: two ops */
            berth_rms_norm_params q = {.struct_size = sizeof q, .weight_mode = BERTH_NORM_W,
                                       .resid_mode = BERTH_RESID_ADD_AFTER, .eps = 1e-6f, .x = x.t, .w = nw.t,
                                       .residual = r.t, .y = y1.t, .out_scale = 0.5f};
            if (with_y2) {
                q.y2_weight_mode = BERTH_NORM_W;
                q.y2_w = nw2.t;
                q.y2 = u1.t;
            }
            CHECK(ops->rms_norm(be, st, &q) == BERTH_OK, "%s", g_last_error);
            berth_matmul_params p = {.struct_size = sizeof p, .x = with_y2 ? u1.t : y1.t, .w = w.t, .y = a1.t};
            CHECK(ops->matmul(be, st, &p) == BERTH_OK, "%s", g_last_error);
            /* one op */
            q.y = y2.t;
            if (with_y2)
                q.y2 = u2.t;
            p.x = with_y2 ? u2.t : y2.t;
            p.y = a2.t;
            p.x_pre = &q;
            ck_assert_int_eq(vt->supports(be, BERTH_OP_MATMUL, &p), BERTH_OK);
            CHECK(ops->matmul(be, st, &p) == BERTH_OK, "%s", g_last_error);
            same_bits(&y2.t, &y1.t, what);
            if (with_y2)
                same_bits(&u2.t, &u1.t, what);
            same_bits(&a2.t, &a1.t, what);
            /* refusals, before the norm writes anything */
            tpoison(&y2.t);
            tpoison(&u2.t);
            tpoison(&a2.t);
            p.x = with_y2 ? y2.t : x.t; /* not the output the product reads */
            expect_error(ops->matmul(be, st, &p), BERTH_E_INVALID,
                         with_y2 ? "matmul: x must be x_pre's y2 (same buffer, offset, dtype, shape and strides)"
                                 : "matmul: x must be x_pre's y (same buffer, offset, dtype, shape and strides)");
            p.x = with_y2 ? u2.t : y2.t;
            p.x_norm_mode = BERTH_NORM_UNIT;
            p.x_norm_eps = 1e-6f;
            expect_error(ops->matmul(be, st, &p), BERTH_E_UNSUPPORTED,
                         "matmul: x_pre and an x_norm prologue cannot be combined");
            expect_unsupported(BERTH_OP_MATMUL, &p, "matmul: x_pre and an x_norm prologue cannot be combined");
            p.x_norm_mode = BERTH_NORM_W_NONE;
            berth_rms_norm_params yn = {.struct_size = sizeof yn, .weight_mode = BERTH_NORM_UNIT, .eps = 1e-6f,
                                        .x = a2.t, .residual = absent, .y = a1.t};
            p.y_norm = &yn;
            expect_error(ops->matmul(be, st, &p), BERTH_E_UNSUPPORTED, "matmul: x_pre and y_norm cannot be combined");
            expect_unsupported(BERTH_OP_MATMUL, &p, "matmul: x_pre and y_norm cannot be combined");
            p.y_norm = NULL;
            q.weight_mode = 9; /* the norm obeys every rms_norm rule */
            expect_error(ops->matmul(be, st, &p), BERTH_E_UNSUPPORTED,
                         "matmul: x_pre: rms_norm: weight_mode 9 is not supported");
            q.weight_mode = BERTH_NORM_W;
            still_poisoned(&y2.t, what);
            still_poisoned(&u2.t, what);
            still_poisoned(&a2.t, what);
            tt_free(&x);
            tt_free(&w);
            tt_free(&nw);
            tt_free(&nw2);
            tt_free(&r);
            tt_free(&y1);
            tt_free(&y2);
            tt_free(&u1);
            tt_free(&u2);
            tt_free(&a1);
            tt_free(&a2);
        }

    /* a q-norm + RoPE cannot be the norm before a product (x {d, heads, T}: the product's rows are heads * T) */
    const int64_t d = 32, H = 2, T = 3;
    struct tt x = tt_new(BERTH_DTYPE_F32, d, H, T, 1, 0), y = tt_new(BERTH_DTYPE_F32, d, H, T, 1, 0);
    struct tt w = tt_new(BERTH_DTYPE_BF16, d, 8, 1, 1, 0), a = tt_new(BERTH_DTYPE_F32, 8, H, T, 1, 0);
    struct tt freqs = tt_new(BERTH_DTYPE_F32, 4, 1, 1, 1, 0);
    const int32_t posv[3] = {0, 5, 9};
    struct tt pos = ivec(posv, T);
    trand(&x.t, -2, 2);
    trand(&freqs.t, 0, 1);
    tpoison(&y.t);
    berth_rms_norm_params q = {.struct_size = sizeof q, .weight_mode = BERTH_NORM_UNIT, .eps = 1e-6f, .x = x.t,
                               .residual = absent, .y = y.t, .rope_mode = BERTH_ROPE_HALF, .rope_pair_offset = 16,
                               .rope_n_pairs = 4, .rope_positions = pos.t, .rope_freqs = freqs.t};
    ck_assert_int_eq(vt->supports(be, BERTH_OP_RMS_NORM, &q), BERTH_OK);
    berth_matmul_params p = {.struct_size = sizeof p, .x = y.t, .w = w.t, .y = a.t, .x_pre = &q};
    expect_error(ops->matmul(be, st, &p), BERTH_E_UNSUPPORTED, "matmul: x_pre cannot apply RoPE");
    expect_unsupported(BERTH_OP_MATMUL, &p, "matmul: x_pre cannot apply RoPE");
    still_poisoned(&y.t, "matmul x_pre with RoPE");
    q.rope_n_pairs = 0; /* the same norm without RoPE is fine */
    CHECK(ops->matmul(be, st, &p) == BERTH_OK, "%s", g_last_error);
    tt_free(&x);
    tt_free(&y);
    tt_free(&w);
    tt_free(&a);
    tt_free(&freqs);
    tt_free(&pos);
}
END_TEST

/* A pair of products (y_then, ABI 0.6), shaped as Gemma 4's per-layer-input block: the post-FF norm (x_pre), the
 * gate with gelu(.) * up (strided rows) as its epilogue, then the projection of that narrow y with the post-PLE
 * norm (* scale, second output) as its y_norm — bit-identical to the four ops in turn, every output written; the
 * second product's x must be the first's y; it takes no x_pre, x_norm, accumulate or y_then of its own, and the
 * first no y_norm; a refused pair writes nothing. */
START_TEST(test_matmul_pair)
{
    const int64_t D = 96, P = 24;
    for (int64_t M = 1; M <= 9; M += 4) {
        char what[64];
        snprintf(what, sizeof what, "matmul pair M=%lld", (long long)M);
        struct tt a0 = tt_new(BERTH_DTYPE_F32, D, M, 1, 1, 1), res = tt_new(BERTH_DTYPE_F32, D, M, 1, 1, 0);
        struct tt fw = tt_new(BERTH_DTYPE_BF16, D, 1, 1, 1, 0), pw = tt_new(BERTH_DTYPE_BF16, D, 1, 1, 1, 0);
        struct tt nw = tt_new(BERTH_DTYPE_BF16, D, 1, 1, 1, 0);
        struct tt wg = tt_new(BERTH_DTYPE_BF16, D, P, 1, 1, 0), wp = tt_new(BERTH_DTYPE_BF16, P, D, 1, 1, 0);
        struct tt up = tt_new(BERTH_DTYPE_F32, P, M, 1, 1, 3); /* strided rows, as a layer's slice of the table */
        struct tt h[2], g[2], a[2], o[2], u[2];
        for (int k = 0; k < 2; k++) {
            h[k] = tt_new(BERTH_DTYPE_F32, D, M, 1, 1, 0);
            g[k] = tt_new(BERTH_DTYPE_F32, P, M, 1, 1, 0);
            a[k] = tt_new(BERTH_DTYPE_F32, D, M, 1, 1, 0);
            o[k] = tt_new(BERTH_DTYPE_F32, D, M, 1, 1, 0);
            u[k] = tt_new(BERTH_DTYPE_F32, D, M, 1, 1, 0);
        }
        trand(&a0.t, -2, 2);
        trand(&res.t, -1, 1);
        trand(&fw.t, -1, 1);
        trand(&pw.t, -1, 1);
        trand(&nw.t, -1, 1);
        trand(&wg.t, -0.3, 0.3);
        trand(&wp.t, -0.3, 0.3);
        trand(&up.t, -2, 2);
        berth_rms_norm_params ff[2], post[2];
        berth_matmul_params gate[2], proj[2];
        for (int k = 0; k < 2; k++) {
            ff[k] = (berth_rms_norm_params){.struct_size = sizeof ff[k], .weight_mode = BERTH_NORM_W,
                                            .resid_mode = BERTH_RESID_ADD_AFTER, .eps = 1e-6f, .x = a0.t,
                                            .w = fw.t, .residual = res.t, .y = h[k].t};
            gate[k] = (berth_matmul_params){.struct_size = sizeof gate[k], .x = h[k].t, .w = wg.t, .y = g[k].t,
                                            .y_glu = BERTH_GLU_MUL, .y_glu_act = BERTH_ACT_GELU_TANH,
                                            .y_glu_up = up.t};
            post[k] = (berth_rms_norm_params){.struct_size = sizeof post[k], .weight_mode = BERTH_NORM_W,
                                              .resid_mode = BERTH_RESID_ADD_AFTER, .eps = 1e-6f, .x = a[k].t,
                                              .w = pw.t, .residual = h[k].t, .y = o[k].t, .out_scale = 0.75f,
                                              .y2_weight_mode = BERTH_NORM_W, .y2_w = nw.t, .y2 = u[k].t};
            proj[k] = (berth_matmul_params){.struct_size = sizeof proj[k], .x = g[k].t, .w = wp.t, .y = a[k].t};
        }
        /* reference: four ops */
        CHECK(ops->rms_norm(be, st, &ff[0]) == BERTH_OK, "%s", g_last_error);
        CHECK(ops->matmul(be, st, &gate[0]) == BERTH_OK, "%s", g_last_error);
        CHECK(ops->matmul(be, st, &proj[0]) == BERTH_OK, "%s", g_last_error);
        CHECK(ops->rms_norm(be, st, &post[0]) == BERTH_OK, "%s", g_last_error);
        /* one op */
        gate[1].x_pre = &ff[1];
        gate[1].y_then = &proj[1];
        proj[1].y_norm = &post[1];
        ck_assert_int_eq(vt->supports(be, BERTH_OP_MATMUL, &gate[1]), BERTH_OK);
        CHECK(ops->matmul(be, st, &gate[1]) == BERTH_OK, "%s", g_last_error);
        same_bits(&h[1].t, &h[0].t, what);
        same_bits(&g[1].t, &g[0].t, what);
        same_bits(&a[1].t, &a[0].t, what);
        same_bits(&o[1].t, &o[0].t, what);
        same_bits(&u[1].t, &u[0].t, what);
        /* refusals, before anything is written */
        tpoison(&h[1].t);
        tpoison(&g[1].t);
        tpoison(&a[1].t);
        tpoison(&o[1].t);
        tpoison(&u[1].t);
        proj[1].x = g[0].t; /* not the first product's y */
        expect_error(ops->matmul(be, st, &gate[1]), BERTH_E_INVALID,
                     "matmul: y_then's x must be the matmul's y (same buffer, offset, dtype, shape and strides)");
        expect_unsupported(BERTH_OP_MATMUL, &gate[1],
                           "matmul: y_then's x must be the matmul's y (same buffer, offset, dtype, shape and strides)");
        proj[1].x = g[1].t;
        proj[1].w.ne[0] = P - 1; /* the second product's own rules, named as its */
        proj[1].w.nb[1] = (P - 1) * 2;
        expect_error(ops->matmul(be, st, &gate[1]), BERTH_E_INVALID,
                     "matmul: y_then: matmul: x ne[0] = 24 but w ne[0] (K) = 23");
        proj[1].w = wp.t;
        proj[1].accumulate = 1;
        proj[1].y_norm = NULL;
        expect_error(ops->matmul(be, st, &gate[1]), BERTH_E_UNSUPPORTED,
                     "matmul: y_then may have no x_pre, x_norm prologue, accumulate or y_then of its own");
        expect_unsupported(BERTH_OP_MATMUL, &gate[1],
                           "matmul: y_then may have no x_pre, x_norm prologue, accumulate or y_then of its own");
        proj[1].accumulate = 0;
        proj[1].y_norm = &post[1];
        berth_rms_norm_params yn = {.struct_size = sizeof yn, .weight_mode = BERTH_NORM_UNIT, .eps = 1e-6f,
                                    .x = g[1].t, .residual = absent, .y = g[1].t};
        berth_matmul_params plain = gate[1];
        plain.x_pre = NULL;
        plain.y_norm = &yn;
        expect_error(ops->matmul(be, st, &plain), BERTH_E_UNSUPPORTED, "matmul: y_then and y_norm cannot be combined");
        expect_unsupported(BERTH_OP_MATMUL, &plain, "matmul: y_then and y_norm cannot be combined");
        still_poisoned(&h[1].t, what);
        still_poisoned(&g[1].t, what);
        still_poisoned(&a[1].t, what);
        still_poisoned(&o[1].t, what);
        still_poisoned(&u[1].t, what);
        /* an older caller's struct stops before y_then: the first product alone */
        gate[1].struct_size = BERTH_SIZE_TO(berth_matmul_params, x_pre);
        CHECK(ops->matmul(be, st, &gate[1]) == BERTH_OK, "%s", g_last_error);
        same_bits(&g[1].t, &g[0].t, what);
        still_poisoned(&a[1].t, what);
        tt_free(&a0);
        tt_free(&res);
        tt_free(&fw);
        tt_free(&pw);
        tt_free(&nw);
        tt_free(&wg);
        tt_free(&wp);
        tt_free(&up);
        for (int k = 0; k < 2; k++) {
            tt_free(&h[k]);
            tt_free(&g[k]);
            tt_free(&a[k]);
            tt_free(&o[k]);
            tt_free(&u[k]);
        }
    }
}
END_TEST

/* A caller compiled before the 0.3 fields (struct_size up to y) gets a plain rms_norm whatever follows. */
START_TEST(test_rms_norm_old_caller)
{
    struct tt x = tt_new(BERTH_DTYPE_F32, 16, 2, 3, 1, 0);
    struct tt y1 = tt_new(BERTH_DTYPE_F32, 16, 2, 3, 1, 0), y2 = tt_new(BERTH_DTYPE_F32, 16, 2, 3, 1, 0);
    trand(&x.t, -2, 2);
    berth_rms_norm_params p = {.struct_size = sizeof p, .weight_mode = BERTH_NORM_UNIT, .eps = 1e-6f, .x = x.t,
                               .w = absent, .residual = absent, .y = y1.t};
    ck_assert_int_eq(ops->rms_norm(be, st, &p), BERTH_OK);
    p.struct_size = (uint32_t)BERTH_SIZE_TO(berth_rms_norm_params, y);
    p.y = y2.t;
    p.rope_mode = 9; /* beyond struct_size: never read */
    p.rope_n_pairs = 4;
    p.out_scale = NAN;
    ck_assert_int_eq(vt->supports(be, BERTH_OP_RMS_NORM, &p), BERTH_OK);
    CHECK(ops->rms_norm(be, st, &p) == BERTH_OK, "%s", g_last_error);
    ck_assert_mem_eq(y1.host, y2.host, y1.bytes);
    tt_free(&x);
    tt_free(&y1);
    tt_free(&y2);
}
END_TEST

/* ---------------------------------------------------------------------------------------------------------------
 * unary, glu, binary, copy */

START_TEST(test_unary)
{
    for (int act = BERTH_ACT_IDENTITY; act <= BERTH_ACT_EXP; act++)
        for (int in_place = 0; in_place < 2; in_place++) {
            struct tt x = tt_new(BERTH_DTYPE_F32, 29, 3, 2, 2, 1), y = tt_new(BERTH_DTYPE_F32, 29, 3, 2, 2, 2);
            trand(&x.t, -6, 6);
            double *xv = tload(&x.t);
            const berth_tensor *out = in_place ? &x.t : &y.t;
            tpoison(&y.t);
            tsnap(&y);
            const float is = (float)urand(0.2, 2), os = (float)urand(-3, 3);
            berth_unary_params p = {.struct_size = sizeof p, .act = act, .in_scale = is, .out_scale = os, .x = x.t,
                                    .y = *out};
            ck_assert_int_eq(vt->supports(be, BERTH_OP_UNARY, &p), BERTH_OK);
            CHECK(ops->unary(be, st, &p) == BERTH_OK, "%s", g_last_error);
            size_t i = 0;
            FOR_EACH(&x.t, a, b, c, d)
            {
                const double ref = os * act_ref(act, (double)(float)(is * xv[i++]));
                check_close(tget(out, a, b, c, d), ref, fabs(ref) + fabs(os), 2e-6, "unary", a, b, c, act);
            }
            if (!in_place)
                tcheck_outside(&y, &y.t, "unary");
            free(xv);
            tt_free(&x);
            tt_free(&y);
        }
}
END_TEST

/* softplus where the naive log(1 + e^x) overflows (x >= 89 in fp32) or loses everything (x << 0); exp where fp32
 * underflows to denormals and zero. */
START_TEST(test_unary_softplus_exp_extremes)
{
    const float xs[10] = {-1000.0f, -100.0f, -30.0f, -1e-3f, 0.0f, 1e-3f, 20.0f, 30.0f, 88.8f, 1000.0f};
    struct tt x = tt_new(BERTH_DTYPE_F32, 10, 1, 1, 1, 0), y = tt_new(BERTH_DTYPE_F32, 10, 1, 1, 1, 0);
    for (int i = 0; i < 10; i++)
        tset(&x.t, i, 0, 0, 0, xs[i]);
    for (int act = BERTH_ACT_SOFTPLUS; act <= BERTH_ACT_EXP; act++) {
        tpoison(&y.t);
        berth_unary_params p = {.struct_size = sizeof p, .act = act, .in_scale = 1, .out_scale = 1, .x = x.t, .y = y.t};
        CHECK(ops->unary(be, st, &p) == BERTH_OK, "%s", g_last_error);
        for (int i = 0; i < 10; i++) {
            const double got = tget(&y.t, i, 0, 0, 0), ref = act_ref(act, xs[i]);
            if (act == BERTH_ACT_EXP && xs[i] >= 88.8f) { /* beyond FLT_MAX */
                CHECK(isinf(got) && got > 0, "exp(%g) = %g, expected +inf", (double)xs[i], got);
                continue;
            }
            CHECK(isfinite(got), "act %d of %g = %g", act, (double)xs[i], got);
            check_close(got, ref, fabs(ref), 2e-6, act == BERTH_ACT_EXP ? "exp" : "softplus", i, 0, 0, 0);
        }
    }
    tt_free(&x);
    tt_free(&y);
}
END_TEST

START_TEST(test_glu)
{
    const int64_t F = 37, T = 5;
    for (int act = BERTH_ACT_IDENTITY; act <= BERTH_ACT_EXP; act++) {
        /* gate and up are the two halves of one fused projection output {2F, T} */
        struct tt fused = tt_new(BERTH_DTYPE_F32, 2 * F, T, 1, 1, 0);
        struct tt y = tt_new(BERTH_DTYPE_F32, F, T, 1, 1, 1);
        trand(&fused.t, -4, 4);
        const int64_t ne[4] = {F, T, 1, 1}, nb[4] = {4, fused.t.nb[1], fused.t.nb[2], fused.t.nb[3]};
        const berth_tensor gate = view_of(&fused, BERTH_DTYPE_F32, 0, ne, nb);
        const berth_tensor up = view_of(&fused, BERTH_DTYPE_F32, 4 * F, ne, nb);
        double *gv = tload(&gate), *uv = tload(&up);
        const int alias = act % 2; /* odd acts write into up, in place */
        const berth_tensor out = alias ? up : y.t;
        tpoison(&y.t);
        berth_glu_params p = {.struct_size = sizeof p, .act = act, .gate = gate, .up = up, .y = out};
        ck_assert_int_eq(vt->supports(be, BERTH_OP_GLU, &p), BERTH_OK);
        CHECK(ops->glu(be, st, &p) == BERTH_OK, "%s", g_last_error);
        size_t i = 0;
        FOR_EACH(&gate, a, b, c, d)
        {
            const double ref = act_ref(act, gv[i]) * uv[i];
            i++;
            check_close(tget(&out, a, b, c, d), ref, fabs(ref) + 1e-3, 2e-6, "glu", a, b, act, alias);
        }
        free(gv);
        free(uv);
        tt_free(&fused);
        tt_free(&y);
    }
}
END_TEST

START_TEST(test_binary)
{
    static const int64_t shapes[][4] = {{23, 4, 3, 2}, {23, 1, 1, 1}, {1, 4, 1, 1}, {1, 1, 3, 2}, {1, 1, 1, 1}, {23, 4, 1, 2}};
    int round = 0;
    for (int op = 0; op < 2; op++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++, round++) {
            const berth_dtype bdt = wdts[round % 3];
            struct tt a = tt_new(BERTH_DTYPE_F32, 23, 4, 3, 2, 1);
            struct tt b = tt_new(bdt, shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], round % 2);
            struct tt y = tt_new(BERTH_DTYPE_F32, 23, 4, 3, 2, 2);
            trand(&a.t, -2, 2);
            trand(&b.t, -2, 2);
            double *av = tload(&a.t);
            const int alias = round % 4 == 3;
            const berth_tensor *out = alias ? &a.t : &y.t;
            tpoison(&y.t);
            const float scale = (float)urand(-2, 2);
            berth_binary_params p = {.struct_size = sizeof p, .op = op, .scale = scale, .a = a.t, .b = b.t, .y = *out};
            ck_assert_int_eq(vt->supports(be, BERTH_OP_BINARY, &p), BERTH_OK);
            CHECK(ops->binary(be, st, &p) == BERTH_OK, "%s", g_last_error);
            size_t i = 0;
            FOR_EACH(&a.t, i0, i1, i2, i3)
            {
                const double bv = tget(&b.t, shapes[s][0] == 1 ? 0 : i0, shapes[s][1] == 1 ? 0 : i1,
                                       shapes[s][2] == 1 ? 0 : i2, shapes[s][3] == 1 ? 0 : i3);
                const double ref = op == BERTH_BINARY_ADD ? av[i] + scale * bv : av[i] * bv * scale;
                check_close(tget(out, i0, i1, i2, i3), ref, fabs(av[i]) + fabs(scale * bv) + fabs(ref), 1e-6,
                            op ? "binary mul" : "binary add", i0, i1, i2, (int64_t)s);
                i++;
            }
            free(av);
            tt_free(&a);
            tt_free(&b);
            tt_free(&y);
        }
}
END_TEST

START_TEST(test_copy)
{
    for (int sd = 0; sd < 3; sd++)
        for (int dd = 0; dd < 3; dd++) {
            struct tt x = tt_new(wdts[sd], 19, 3, 2, 1, 1);
            struct tt y = tt_new(wdts[dd], 19, 3, 2, 1, 2);
            trand(&x.t, -70000, 70000);
            /* some exact halfway cases and specials in f32 sources */
            if (wdts[sd] == BERTH_DTYPE_F32) {
                const float sp[] = {bits_f(0x3f808000u), bits_f(0x3f818000u), bits_f(0x38800000u) * 1.5f, 1e-7f,
                                    -2.98e-8f, 65504.0f, 65519.0f, 65520.0f, INFINITY, -INFINITY, NAN, 0.0f, -0.0f,
                                    bits_f(0x7f7fffffu), 1e-40f, 3.0e-5f, 1.0009765625f + 0x1p-11f};
                for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++)
                    tset(&x.t, (int64_t)i, 1, 1, 0, sp[i]);
            }
            tpoison(&y.t);
            tsnap(&y);
            berth_copy_params p = {.struct_size = sizeof p, .x = x.t, .y = y.t};
            ck_assert_int_eq(vt->supports(be, BERTH_OP_COPY, &p), BERTH_OK);
            CHECK(ops->copy(be, st, &p) == BERTH_OK, "%s", g_last_error);
            FOR_EACH(&x.t, a, b, c, d)
            {
                const float v = (float)tget(&x.t, a, b, c, d);
                uint16_t got16;
                memcpy(&got16, tptr(&y.t, a, b, c, d), 2);
                if (wdts[dd] == BERTH_DTYPE_F32) {
                    const float g = (float)tget(&y.t, a, b, c, d);
                    CHECK(f_bits(g) == f_bits(v) || (isnan(g) && isnan(v)), "copy %s->f32 [%" PRId64 ",%" PRId64 "] %.9g vs %.9g",
                          dtn(wdts[sd]), a, b, g, v);
                } else if (wdts[dd] == BERTH_DTYPE_BF16) {
                    CHECK(got16 == f_bf16(v) || (isnan(v) && (got16 & 0x7fff) > 0x7f80),
                          "copy %s->bf16 of %.9g: 0x%04x, expected 0x%04x", dtn(wdts[sd]), v, got16, f_bf16(v));
                } else {
                    CHECK(got16 == f_f16(v) || (isnan(v) && (got16 & 0x7fff) > 0x7c00),
                          "copy %s->f16 of %.9g: 0x%04x, expected 0x%04x", dtn(wdts[sd]), v, got16, f_f16(v));
                }
            }
            tcheck_outside(&y, &y.t, "copy");
            tt_free(&x);
            tt_free(&y);
        }
}
END_TEST

/* ---------------------------------------------------------------------------------------------------------------
 * supports(): rejections with exact messages, agreement with execution. */

static berth_tensor qt(berth_dtype dt, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3)
{
    berth_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dt;
    t.ndim = 4;
    t.ne[0] = ne0;
    t.ne[1] = ne1;
    t.ne[2] = ne2;
    t.ne[3] = ne3;
    t.nb[0] = (int64_t)dt_size(dt);
    t.nb[1] = t.nb[0] * ne0;
    t.nb[2] = t.nb[1] * ne1;
    t.nb[3] = t.nb[2] * ne2;
    return t;
}

static void expect_unsupported(int32_t op, const void *params, const char *msg)
{
    expect_error(vt->supports(be, op, params), BERTH_E_UNSUPPORTED, msg);
}

START_TEST(test_supports_rejections)
{
    const berth_dtype F32 = BERTH_DTYPE_F32;
    berth_matmul_params mm = {.struct_size = sizeof mm, .x = qt(F32, 67, 5, 1, 1), .w = qt(BERTH_DTYPE_BF16, 67, 131, 1, 1),
                              .y = qt(F32, 131, 5, 1, 1)};
    ck_assert_int_eq(vt->supports(be, BERTH_OP_MATMUL, &mm), BERTH_OK);
    mm.w.dtype = BERTH_DTYPE_I32;
    expect_unsupported(BERTH_OP_MATMUL, &mm, "matmul: w dtype i32 is not supported (supported: f32, f16, bf16)");
    mm.w = qt(BERTH_DTYPE_F16, 68, 131, 1, 1);
    expect_unsupported(BERTH_OP_MATMUL, &mm, "matmul: x ne[0] = 67 but w ne[0] (K) = 68");
    mm.w = qt(BERTH_DTYPE_F16, 67, 131, 1, 1);
    mm.x = qt(BERTH_DTYPE_BF16, 67, 5, 1, 1);
    expect_unsupported(BERTH_OP_MATMUL, &mm, "matmul: x dtype bf16 is not supported (supported: f32)");
    mm.x = qt(F32, 67, 5, 1, 1);
    mm.bias = qt(F32, 130, 1, 1, 1); /* present in a query: its shape is filled in */
    expect_unsupported(BERTH_OP_MATMUL, &mm, "matmul: bias must be ne {131}, got {130, 1, 1, 1}");
    mm.bias = absent;
    mm.w.nb[1] += 2;
    expect_unsupported(BERTH_OP_MATMUL, &mm, "matmul: w must be packed (nb[1] = 136, expected 134)");
    mm.w.nb[1] -= 2;
    mm.struct_size = 8;
    char msg[128];
    snprintf(msg, sizeof msg, "matmul: params struct_size 8 is smaller than ABI %d.%d's %zu", BERTH_ABI_MAJOR,
             BERTH_ABI_MINOR, (size_t)BERTH_SIZE_TO(berth_matmul_params, y));
    expect_unsupported(BERTH_OP_MATMUL, &mm, msg);
    mm.struct_size = sizeof mm;
    /* An optional tensor in a query is absent exactly when ne[0] == 0 (berth/backend.h), whatever else it holds. */
    mm.bias = absent;
    mm.bias.ndim = 1;
    mm.bias.ne[1] = mm.bias.ne[2] = mm.bias.ne[3] = 1;
    mm.bias.dtype = BERTH_DTYPE_I32; /* would be refused if it were read */
    ck_assert_int_eq(vt->supports(be, BERTH_OP_MATMUL, &mm), BERTH_OK);
    mm.bias.ne[0] = 131;
    expect_unsupported(BERTH_OP_MATMUL, &mm, "matmul: bias dtype i32 is not supported (supported: f32, f16, bf16)");
    mm.bias = absent;
    /* the RMS-norm prologue */
    mm.x_norm_mode = 4;
    mm.x_norm_eps = 1e-6f;
    expect_unsupported(BERTH_OP_MATMUL, &mm, "matmul: x_norm_mode 4 is not supported");
    mm.x_norm_mode = BERTH_NORM_UNIT; /* weightless: no x_norm_w needed */
    ck_assert_int_eq(vt->supports(be, BERTH_OP_MATMUL, &mm), BERTH_OK);
    mm.x_norm_mode = BERTH_NORM_W;
    mm.x_norm_w = qt(BERTH_DTYPE_BF16, 66, 1, 1, 1);
    expect_unsupported(BERTH_OP_MATMUL, &mm, "matmul: x_norm_w must be ne {67}, got {66, 1, 1, 1}");
    mm.x_norm_w = qt(BERTH_DTYPE_BF16, 67, 1, 1, 1);
    ck_assert_int_eq(vt->supports(be, BERTH_OP_MATMUL, &mm), BERTH_OK);
    mm.x_norm_eps = 0.0f;
    expect_unsupported(BERTH_OP_MATMUL, &mm, "matmul: x_norm_eps = 0 must be positive and finite");
    mm.x_norm_eps = NAN;
    expect_unsupported(BERTH_OP_MATMUL, &mm, "matmul: x_norm_eps = nan must be positive and finite");
    mm.x_norm_mode = BERTH_NORM_W_NONE; /* no prologue: eps and x_norm_w are not read */
    ck_assert_int_eq(vt->supports(be, BERTH_OP_MATMUL, &mm), BERTH_OK);
    mm.x_norm_w = absent;
    /* the gated epilogue */
    mm.y_glu = 3;
    expect_unsupported(BERTH_OP_MATMUL, &mm, "matmul: y_glu 3 is not supported");
    mm.y_glu = BERTH_GLU_MUL;
    mm.y_glu_act = 9;
    mm.y_glu_up = qt(F32, 131, 5, 1, 1);
    expect_unsupported(BERTH_OP_MATMUL, &mm, "matmul: y_glu_act 9 is not supported");
    mm.y_glu_act = BERTH_ACT_GELU_TANH;
    ck_assert_int_eq(vt->supports(be, BERTH_OP_MATMUL, &mm), BERTH_OK);
    mm.accumulate = 1;
    expect_unsupported(BERTH_OP_MATMUL, &mm, "matmul: the y_glu epilogue needs accumulate = 0, got 1");
    mm.accumulate = 0;
    mm.y_glu_up = qt(F32, 131, 4, 1, 1);
    expect_unsupported(BERTH_OP_MATMUL, &mm, "matmul: y_glu_up must be ne {N 131, 5 rows} like y, got ne[0] = 131 "
                                             "with 4 rows");
    mm.y_glu_up = qt(BERTH_DTYPE_BF16, 131, 5, 1, 1);
    expect_unsupported(BERTH_OP_MATMUL, &mm, "matmul: y_glu_up dtype bf16 is not supported (supported: f32)");
    mm.y_glu_up = absent;
    mm.y_glu = BERTH_GLU_HALVES; /* w's 131 rows cannot be two halves of y's */
    expect_unsupported(BERTH_OP_MATMUL, &mm, "matmul: y_glu HALVES needs w ne[1] = 2 * y ne[0] (262), got 131");
    mm.y = qt(F32, 65, 5, 1, 1);
    expect_unsupported(BERTH_OP_MATMUL, &mm, "matmul: y_glu HALVES needs w ne[1] = 2 * y ne[0] (130), got 131");
    mm.w = qt(BERTH_DTYPE_F16, 67, 130, 1, 1);
    ck_assert_int_eq(vt->supports(be, BERTH_OP_MATMUL, &mm), BERTH_OK);
    mm.bias = qt(F32, 65, 1, 1, 1); /* the bias covers all of w's rows */
    expect_unsupported(BERTH_OP_MATMUL, &mm, "matmul: bias must be ne {130}, got {65, 1, 1, 1}");
    mm.bias = qt(F32, 130, 1, 1, 1);
    ck_assert_int_eq(vt->supports(be, BERTH_OP_MATMUL, &mm), BERTH_OK);
    mm.bias = absent;

    /* rms_norm: RoPE and out_scale */
    berth_rms_norm_params rn = {.struct_size = sizeof rn, .weight_mode = BERTH_NORM_UNIT, .eps = 1e-6f,
                                .x = qt(F32, 32, 2, 3, 1), .y = qt(F32, 32, 2, 3, 1), .rope_mode = BERTH_ROPE_HALF,
                                .rope_pair_offset = 16, .rope_n_pairs = 4,
                                .rope_positions = qt(BERTH_DTYPE_I32, 3, 1, 1, 1), .rope_freqs = qt(F32, 4, 1, 1, 1),
                                .out_scale = 0.5f};
    ck_assert_int_eq(vt->supports(be, BERTH_OP_RMS_NORM, &rn), BERTH_OK);
    rn.rope_n_pairs = -1;
    expect_unsupported(BERTH_OP_RMS_NORM, &rn, "rms_norm: rope_n_pairs -1 is negative");
    rn.rope_n_pairs = 4;
    rn.resid_mode = BERTH_RESID_ADD_AFTER;
    rn.residual = qt(F32, 32, 2, 3, 1);
    expect_unsupported(BERTH_OP_RMS_NORM, &rn, "rms_norm: RoPE (rope_n_pairs 4) needs resid_mode NONE, got 1");
    rn.resid_mode = BERTH_RESID_NONE;
    rn.residual = absent;
    rn.rope_mode = 2;
    expect_unsupported(BERTH_OP_RMS_NORM, &rn, "rms_norm: rope mode 2 is not supported");
    rn.rope_mode = BERTH_ROPE_HALF;
    rn.rope_pair_offset = 30;
    expect_unsupported(BERTH_OP_RMS_NORM, &rn, "rms_norm: pair_offset 30 with 4 pairs needs n_pairs <= pair_offset "
                                               "and pair_offset + n_pairs <= head dim 32");
    rn.rope_pair_offset = 16;
    rn.rope_positions = qt(BERTH_DTYPE_I32, 6, 1, 1, 1); /* one per token, not per row */
    expect_unsupported(BERTH_OP_RMS_NORM, &rn, "rms_norm: rope_positions must be ne {3}, got {6, 1, 1, 1}");
    rn.rope_positions = qt(BERTH_DTYPE_I32, 3, 1, 1, 1);
    rn.rope_freqs = qt(F32, 5, 1, 1, 1);
    expect_unsupported(BERTH_OP_RMS_NORM, &rn, "rms_norm: rope_freqs must be ne {4}, got {5, 1, 1, 1}");
    rn.rope_freqs = qt(F32, 4, 1, 1, 1);
    rn.out_scale = INFINITY;
    expect_unsupported(BERTH_OP_RMS_NORM, &rn, "rms_norm: out_scale inf must be finite");
    rn.rope_n_pairs = 0; /* out_scale is checked without RoPE too */
    rn.out_scale = NAN;
    expect_unsupported(BERTH_OP_RMS_NORM, &rn, "rms_norm: out_scale nan must be finite");
    rn.out_scale = 1.0f;
    rn.y2 = qt(F32, 32, 2, 3, 1); /* the second output */
    rn.y2_weight_mode = BERTH_NORM_W;
    rn.y2_w = qt(BERTH_DTYPE_BF16, 32, 1, 1, 1);
    ck_assert_int_eq(vt->supports(be, BERTH_OP_RMS_NORM, &rn), BERTH_OK);
    rn.rope_n_pairs = 4;
    expect_unsupported(BERTH_OP_RMS_NORM, &rn, "rms_norm: a second output (y2) and RoPE cannot be combined");
    rn.rope_n_pairs = 0;
    rn.y2_weight_mode = 7;
    expect_unsupported(BERTH_OP_RMS_NORM, &rn, "rms_norm: y2_weight_mode 7 is not supported");
    rn.y2_weight_mode = BERTH_NORM_W;
    rn.y2 = qt(F32, 32, 3, 2, 1);
    expect_unsupported(BERTH_OP_RMS_NORM, &rn, "rms_norm: y2 ne[1] = 3 differs from y ne[1] = 2");
    rn.y2 = qt(F32, 32, 2, 3, 1);
    rn.y2_w = qt(BERTH_DTYPE_BF16, 31, 1, 1, 1);
    expect_unsupported(BERTH_OP_RMS_NORM, &rn, "rms_norm: y2_w must be ne {32}, got {31, 1, 1, 1}");
    rn.y2_w = absent;
    rn.y2 = absent;

    berth_unary_params un = {.struct_size = sizeof un, .act = 9, .x = qt(F32, 8, 2, 1, 1), .y = qt(F32, 8, 2, 1, 1)};
    expect_unsupported(BERTH_OP_UNARY, &un, "unary: activation 9 is not supported");
    un.act = BERTH_ACT_SILU;
    un.x.nb[0] = 8;
    expect_unsupported(BERTH_OP_UNARY, &un, "unary: x nb[0] = 8 must be the element size 4");

    berth_rope_params rp = {.struct_size = sizeof rp, .mode = BERTH_ROPE_HALF, .pair_offset = 2, .n_pairs = 4,
                            .x = qt(F32, 32, 2, 3, 1), .positions = qt(BERTH_DTYPE_I32, 3, 1, 1, 1),
                            .freqs = qt(F32, 4, 1, 1, 1), .y = qt(F32, 32, 2, 3, 1)};
    expect_unsupported(BERTH_OP_ROPE, &rp, "rope: pair_offset 2 with 4 pairs needs n_pairs <= pair_offset and "
                                           "pair_offset + n_pairs <= head dim 32");
    rp.pair_offset = 16;
    ck_assert_int_eq(vt->supports(be, BERTH_OP_ROPE, &rp), BERTH_OK);
    rp.mode = 2;
    expect_unsupported(BERTH_OP_ROPE, &rp, "rope: rope mode 2 is not supported");

    berth_binary_params bp = {.struct_size = sizeof bp, .op = BERTH_BINARY_ADD, .scale = 1, .a = qt(F32, 8, 4, 1, 1),
                              .b = qt(F32, 8, 3, 1, 1), .y = qt(F32, 8, 4, 1, 1)};
    expect_unsupported(BERTH_OP_BINARY, &bp, "binary: b ne[1] = 3 must be 1 or a's 4");
    berth_copy_params cp = {.struct_size = sizeof cp, .x = qt(BERTH_DTYPE_I32, 8, 1, 1, 1), .y = qt(F32, 8, 1, 1, 1)};
    expect_unsupported(BERTH_OP_COPY, &cp, "copy: x dtype i32 is not supported (supported: f32, f16, bf16)");

    berth_kv_view kv = {.dtype = BERTH_DTYPE_BF16, .block_size = 16, .n_blocks = 8, .n_kv_heads = 1, .head_dim = 64,
                        .head_dim_v = 64};
    berth_attention_params at = {.struct_size = sizeof at, .mask = BERTH_MASK_CAUSAL, .scale = 1, .n_seqs = 2,
                                 .q = qt(F32, 64, 8, 5, 1), .out = qt(F32, 64, 8, 5, 1),
                                 .positions = qt(BERTH_DTYPE_I32, 5, 1, 1, 1),
                                 .seq_q_start = qt(BERTH_DTYPE_I32, 3, 1, 1, 1),
                                 .seq_kv_len = qt(BERTH_DTYPE_I32, 2, 1, 1, 1),
                                 .block_table = qt(BERTH_DTYPE_I32, 4, 2, 1, 1), .kv = kv};
    ck_assert_int_eq(vt->supports(be, BERTH_OP_ATTENTION, &at), BERTH_OK);
    at.mask = 7;
    expect_unsupported(BERTH_OP_ATTENTION, &at, "attention: mask 7 is not supported");
    at.mask = BERTH_MASK_NONE;
    at.window = 4;
    expect_unsupported(BERTH_OP_ATTENTION, &at, "attention: a sliding window (4) needs the causal mask");
    at.mask = BERTH_MASK_CAUSAL;
    at.kv.dtype = BERTH_DTYPE_I32;
    expect_unsupported(BERTH_OP_ATTENTION, &at, "attention: KV dtype i32 is not supported (supported: f32, f16, bf16)");
    at.kv.dtype = BERTH_DTYPE_F32;
    at.q = qt(F32, 64, 65, 5, 1);
    at.out = qt(F32, 64, 65, 5, 1);
    expect_unsupported(BERTH_OP_ATTENTION, &at, "attention: 65 query heads per KV head (most: 64)");
    at.kv.n_kv_heads = 2;
    expect_unsupported(BERTH_OP_ATTENTION, &at, "attention: n_heads 65 is not a multiple of n_kv_heads 2");

    berth_kv_append_params ka = {.struct_size = sizeof ka, .k_norm_mode = 4, .k = qt(F32, 64, 1, 5, 1),
                                 .v = qt(F32, 64, 1, 5, 1), .slots = qt(BERTH_DTYPE_I32, 5, 1, 1, 1), .kv = kv};
    expect_unsupported(BERTH_OP_KV_APPEND, &ka, "kv_append: k_norm_mode 4 is not supported");
    ka.k_norm_mode = BERTH_NORM_UNIT; /* weightless: no k_norm tensor needed */
    ka.v_norm_mode = BERTH_NORM_UNIT;
    ck_assert_int_eq(vt->supports(be, BERTH_OP_KV_APPEND, &ka), BERTH_OK);
    ka.v_norm_mode = BERTH_NORM_W; /* a weight mode needs the weight */
    expect_unsupported(BERTH_OP_KV_APPEND, &ka, "kv_append: v_norm_mode 1 needs the v_norm weight, which is absent");

    berth_sample_params sp = {.struct_size = sizeof sp, .n_rows = 2, .n_top = 11, .logits = qt(F32, 10, 2, 1, 1),
                              .ids = qt(BERTH_DTYPE_I32, 2, 1, 1, 1)};
    expect_unsupported(BERTH_OP_SAMPLE, &sp, "sample: n_top = 11 must be in 0..V (10)");
    berth_conv1d_causal_params cv = {.struct_size = sizeof cv, .act = BERTH_ACT_SILU, .n_seqs = 1,
                                     .x = qt(F32, 8, 3, 1, 1), .w = qt(F32, 65, 8, 1, 1), .y = qt(F32, 8, 3, 1, 1),
                                     .state = qt(F32, 64, 8, 2, 1), .state_slots = qt(BERTH_DTYPE_I32, 1, 1, 1, 1),
                                     .seq_q_start = qt(BERTH_DTYPE_I32, 2, 1, 1, 1)};
    expect_unsupported(BERTH_OP_CONV1D_CAUSAL, &cv, "conv1d_causal: kernel width 65 is not in 1..64");
    berth_gated_delta_params gd = {.struct_size = sizeof gd, .scale = 1, .n_seqs = 1, .q = qt(F32, 16, 2, 3, 1),
                                   .k = qt(F32, 16, 2, 3, 1), .v = qt(F32, 12, 4, 3, 1), .g = qt(F32, 4, 3, 1, 1),
                                   .beta = qt(F32, 4, 3, 1, 1), .out = qt(F32, 12, 4, 3, 1),
                                   .state = qt(F32, 16, 12, 4, 2), .state_slots = qt(BERTH_DTYPE_I32, 1, 1, 1, 1),
                                   .seq_q_start = qt(BERTH_DTYPE_I32, 2, 1, 1, 1)};
    expect_unsupported(BERTH_OP_GATED_DELTA, &gd, "gated_delta: state must be ne {d_v 12, d_k 16, n_v_heads 4, n_slots}, "
                                                  "got {16, 12, 4, 2}");
    expect_unsupported(99, &mm, "supports: unknown op 99");
    expect_unsupported(BERTH_OP_MATMUL, NULL, "supports: params is NULL (op 0)");
    expect_error(ops->attention(be, st, NULL), BERTH_E_INVALID, "attention: params is NULL");

    /* execution reports the same problem, with the code of its kind */
    struct tt x = tt_new(F32, 8, 4, 1, 1, 0), b = tt_new(F32, 8, 3, 1, 1, 0);
    bp.a = bp.y = x.t;
    bp.b = b.t;
    expect_error(ops->binary(be, st, &bp), BERTH_E_INVALID, "binary: b ne[1] = 3 must be 1 or a's 4");
    struct tt q = tt_new(F32, 8, 2, 3, 1, 0), pos = tt_new(BERTH_DTYPE_I32, 2, 1, 1, 1, 0);
    struct tt fr = tt_new(F32, 2, 1, 1, 1, 0);
    rn.x = rn.y = q.t;
    rn.rope_n_pairs = 2;
    rn.rope_pair_offset = 4;
    rn.rope_positions = pos.t;
    rn.rope_freqs = fr.t;
    rn.out_scale = 1.0f;
    expect_error(ops->rms_norm(be, st, &rn), BERTH_E_INVALID,
                 "rms_norm: rope_positions must be ne {3}, got {2, 1, 1, 1}");
    struct tt w2 = tt_new(F32, 8, 4, 1, 1, 0), y4 = tt_new(F32, 4, 4, 1, 1, 0);
    berth_matmul_params mx = {.struct_size = sizeof mx, .x = x.t, .w = w2.t, .y = y4.t, .y_glu = BERTH_GLU_HALVES,
                              .y_glu_act = BERTH_ACT_SILU};
    expect_error(ops->matmul(be, st, &mx), BERTH_E_INVALID,
                 "matmul: y_glu HALVES needs w ne[1] = 2 * y ne[0] (8), got 4");
    tt_free(&q);
    tt_free(&pos);
    tt_free(&fr);
    tt_free(&w2);
    tt_free(&y4);
    tt_free(&x);
    tt_free(&b);
}
END_TEST

static void add_tests(TCase *tc)
{
    tcase_add_test(tc, test_descriptor);
    tcase_add_test(tc, test_config_threads);
    tcase_add_test(tc, test_buffers);
    tcase_add_test(tc, test_matmul);
    tcase_add_test(tc, test_matmul_special_weights);
    tcase_add_test(tc, test_matmul_threads_invariant);
    tcase_add_test(tc, test_matmul_norm_prologue);
    tcase_add_test(tc, test_matmul_norm_prologue_old_caller);
    tcase_add_test(tc, test_matmul_glu_epilogue);
    tcase_add_test(tc, test_matmul_glu_old_caller);
    tcase_add_test(tc, test_get_rows);
    tcase_add_test(tc, test_rms_norm);
    tcase_add_test(tc, test_layer_norm);
    tcase_add_test(tc, test_gated_rms_norm);
    tcase_add_test(tc, test_rope);
    tcase_add_test(tc, test_rms_norm_rope);
    tcase_add_test(tc, test_rms_norm_out_scale);
    tcase_add_test(tc, test_rms_norm_second_output);
    tcase_add_test(tc, test_matmul_then_norm);
    tcase_add_test(tc, test_norm_then_matmul);
    tcase_add_test(tc, test_matmul_pair);
    tcase_add_test(tc, test_rms_norm_old_caller);
    tcase_add_test(tc, test_unary);
    tcase_add_test(tc, test_unary_softplus_exp_extremes);
    tcase_add_test(tc, test_glu);
    tcase_add_test(tc, test_binary);
    tcase_add_test(tc, test_copy);
    tcase_add_test(tc, test_supports_rejections);
}

int main(void)
{
    return cpu_test_run("cpu_ops", add_tests);
}

/*
 * test_example_backend.c — drives berth-backend-example.so through its descriptor, the way the berth host does.
 * Usage: test_example_backend PATH/berth-backend-example.so
 */
#include <berth/backend.h>

#include <check.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *plugin_path;
static char last_error[256];

static void t_log(berth_host_ctx *ctx, int32_t level, const char *msg)
{
    (void)ctx;
    (void)level;
    (void)msg;
}

static void t_set_error(berth_host_ctx *ctx, berth_status code, const char *msg)
{
    (void)ctx;
    (void)code;
    snprintf(last_error, sizeof last_error, "%s", msg);
}

static berth_host host;
static const berth_plugin_desc *desc;
static const berth_backend_vtable *vt;
static berth_backend *be;
static berth_stream *st;

static void setup(void)
{
    void *so = dlopen(plugin_path, RTLD_NOW | RTLD_LOCAL);
    ck_assert_msg(so != NULL, "dlopen: %s", dlerror());
    berth_plugin_entry_fn entry = (berth_plugin_entry_fn)dlsym(so, BERTH_PLUGIN_ENTRY_SYMBOL);
    ck_assert_ptr_nonnull(entry);
    desc = entry(BERTH_ABI_MAJOR, BERTH_ABI_MINOR);
    ck_assert_ptr_nonnull(desc);
    vt = desc->vtable;
    memset(&host, 0, sizeof host);
    host.struct_size = (uint32_t)BERTH_SIZE_TO(berth_host, set_error);
    host.abi_major = BERTH_ABI_MAJOR;
    host.abi_minor = BERTH_ABI_MINOR;
    host.services = BERTH_SVC_LOG;
    host.log = t_log;
    host.set_error = t_set_error;
    ck_assert_int_eq(vt->init(&host, 0, &be), BERTH_OK);
    ck_assert_int_eq(vt->stream_create(be, &st), BERTH_OK);
}

static void teardown(void)
{
    vt->stream_destroy(be, st);
    vt->destroy(be);
}

/* A packed f32 tensor of shape ne (ggml order) at byte offset off of buf. */
static berth_tensor f32(berth_buffer *buf, uint64_t off, int64_t ne0, int64_t ne1)
{
    berth_tensor t;
    memset(&t, 0, sizeof t);
    t.buf = buf;
    t.offset = off;
    t.dtype = BERTH_DTYPE_F32;
    t.ndim = 2;
    t.ne[0] = ne0;
    t.ne[1] = ne1;
    t.ne[2] = t.ne[3] = 1;
    t.nb[0] = 4;
    t.nb[1] = 4 * ne0;
    t.nb[2] = t.nb[3] = 4 * ne0 * ne1;
    return t;
}

START_TEST(descriptor_and_probe)
{
    ck_assert_uint_eq(desc->magic, BERTH_PLUGIN_MAGIC);
    ck_assert_uint_eq(desc->abi_major, BERTH_ABI_MAJOR);
    ck_assert_str_eq(desc->name, "example");
    ck_assert_int_eq(desc->kind, BERTH_PLUGIN_BACKEND);
    berth_probe_info pi;
    memset(&pi, 0, sizeof pi);
    pi.struct_size = (uint32_t)sizeof pi;
    ck_assert_int_eq(vt->probe(&host, &pi), BERTH_OK);
    ck_assert_int_eq(pi.n_devices, 1);
    berth_device_info di;
    memset(&di, 0, sizeof di);
    di.struct_size = (uint32_t)sizeof di;
    ck_assert_int_eq(vt->device_info(&host, 0, &di), BERTH_OK);
    ck_assert_str_eq(di.name, "example (host memory)");
    ck_assert_uint_eq(di.caps, BERTH_CAP_WRAP_HOST | BERTH_CAP_HOST_VISIBLE);
    ck_assert_int_eq(vt->device_info(&host, 1, &di), BERTH_E_NOT_FOUND);
    ck_assert_str_eq(last_error, "example: device 1 does not exist (1 device)");
}
END_TEST

START_TEST(unary_softcap_and_silu)
{
    float x[6] = {-3.0f, -0.5f, 0.0f, 0.25f, 2.0f, 40.0f}, y[6];
    berth_buffer *bx, *by;
    ck_assert_int_eq(vt->buffer_wrap_host(be, x, sizeof x, 1, &bx), BERTH_OK);
    ck_assert_int_eq(vt->buffer_wrap_host(be, y, sizeof y, 0, &by), BERTH_OK);
    /* Softcap c * tanh(x / c), c = 30. */
    berth_unary_params p = {.struct_size = sizeof p, .act = BERTH_ACT_TANH, .in_scale = 1.0f / 30, .out_scale = 30};
    p.x = f32(bx, 0, 3, 2);
    p.y = f32(by, 0, 3, 2);
    ck_assert_int_eq(vt->supports(be, BERTH_OP_UNARY, &p), BERTH_OK);
    ck_assert_int_eq(vt->get_ops(be)->unary(be, st, &p), BERTH_OK);
    for (int i = 0; i < 6; i++)
        ck_assert_double_eq_tol(y[i], 30.0 * tanh(x[i] / 30.0), 1e-5);
    p.act = BERTH_ACT_SILU;
    p.in_scale = p.out_scale = 1.0f;
    ck_assert_int_eq(vt->get_ops(be)->unary(be, st, &p), BERTH_OK);
    for (int i = 0; i < 6; i++)
        ck_assert_double_eq_tol(y[i], x[i] / (1.0 + exp(-x[i])), 1e-5);
    /* Softplus (ABI 0.2) without overflow at x = 40 * 3 (e^120 is beyond fp32), and exp. */
    p.act = BERTH_ACT_SOFTPLUS;
    p.in_scale = 3.0f;
    ck_assert_int_eq(vt->supports(be, BERTH_OP_UNARY, &p), BERTH_OK);
    ck_assert_int_eq(vt->get_ops(be)->unary(be, st, &p), BERTH_OK);
    for (int i = 0; i < 6; i++) {
        const double z = 3.0 * x[i], ref = z > 0 ? z + log1p(exp(-z)) : log1p(exp(z));
        ck_assert_double_eq_tol(y[i], ref, 1e-5 * (1 + fabs(ref)));
    }
    p.act = BERTH_ACT_EXP;
    p.in_scale = 0.5f;
    ck_assert_int_eq(vt->get_ops(be)->unary(be, st, &p), BERTH_OK);
    for (int i = 0; i < 6; i++)
        ck_assert_double_eq_tol(y[i], exp(0.5 * x[i]), 1e-5 * exp(0.5 * x[i]));
    p.act = BERTH_ACT_EXP + 1;
    ck_assert_int_eq(vt->supports(be, BERTH_OP_UNARY, &p), BERTH_E_UNSUPPORTED);
    ck_assert_str_eq(last_error, "example: unary: unknown activation 9");
    p.act = BERTH_ACT_SILU;
    p.in_scale = 1.0f;
    /* x is read-only: writing it is refused, not done. */
    p.y = p.x;
    ck_assert_int_eq(vt->get_ops(be)->unary(be, st, &p), BERTH_E_INVALID);
    ck_assert_str_eq(last_error, "example: unary: y is in a read-only buffer");
    ck_assert_double_eq(x[0], -3.0);
    vt->buffer_free(be, bx);
    vt->buffer_free(be, by);
}
END_TEST

START_TEST(binary_broadcast_in_place)
{
    berth_buffer *buf;
    ck_assert_int_eq(vt->buffer_alloc(be, 9 * sizeof(float), BERTH_USAGE_ACTIVATIONS, &buf), BERTH_OK);
    const float init[9] = {1, 2, 3, 4, 5, 6, 10, 20, 30}; /* a = 3x2, then b = 3x1 */
    ck_assert_int_eq(vt->buffer_upload(be, st, buf, 0, init, sizeof init), BERTH_OK);
    berth_binary_params p = {.struct_size = sizeof p, .op = BERTH_BINARY_ADD, .scale = 0.5f};
    p.a = f32(buf, 0, 3, 2);
    p.b = f32(buf, 24, 3, 1);
    p.y = p.a; /* in place */
    ck_assert_int_eq(vt->get_ops(be)->binary(be, st, &p), BERTH_OK);
    p.op = BERTH_BINARY_MUL;
    p.scale = 2.0f;
    ck_assert_int_eq(vt->get_ops(be)->binary(be, st, &p), BERTH_OK);
    float out[6];
    ck_assert_int_eq(vt->buffer_download(be, st, buf, 0, out, sizeof out), BERTH_OK);
    ck_assert_int_eq(vt->stream_sync(be, st), BERTH_OK);
    for (int i = 0; i < 6; i++) {
        float b = init[6 + i % 3];
        ck_assert_double_eq_tol(out[i], (init[i] + 0.5f * b) * b * 2.0f, 1e-4);
    }
    p.b = f32(buf, 24, 2, 1); /* ne0 2 cannot broadcast to 3 */
    ck_assert_int_eq(vt->supports(be, BERTH_OP_BINARY, &p), BERTH_E_INVALID);
    ck_assert_str_eq(last_error, "example: binary: b.ne[0] = 2 cannot broadcast to 3");
    vt->buffer_free(be, buf);
}
END_TEST

START_TEST(supports_is_honest)
{
    berth_unary_params u = {.struct_size = sizeof u, .act = BERTH_ACT_GELU_TANH, .in_scale = 1, .out_scale = 1};
    u.x = f32(NULL, 0, 8, 4);
    u.y = u.x;
    ck_assert_int_eq(vt->supports(be, BERTH_OP_UNARY, &u), BERTH_OK);
    u.x.dtype = BERTH_DTYPE_BF16;
    u.x.nb[0] = 2;
    ck_assert_int_eq(vt->supports(be, BERTH_OP_UNARY, &u), BERTH_E_UNSUPPORTED);
    ck_assert_str_eq(last_error, "example: unary: x has dtype 2; only f32 (0) is supported");
    ck_assert_int_eq(vt->supports(be, BERTH_OP_ATTENTION, NULL), BERTH_E_UNSUPPORTED);
    ck_assert_str_eq(last_error, "example: op attention is not implemented");
    ck_assert_int_eq(vt->supports(be, 999, NULL), BERTH_E_UNSUPPORTED);
    ck_assert_str_eq(last_error, "example: unknown op 999");
    const berth_ops *ops = vt->get_ops(be);
    ck_assert_ptr_null(ops->matmul);
    ck_assert_ptr_null(ops->attention);
}
END_TEST

START_TEST(out_of_bounds_is_refused)
{
    berth_buffer *buf;
    ck_assert_int_eq(vt->buffer_alloc(be, 24, BERTH_USAGE_ACTIVATIONS, &buf), BERTH_OK);
    berth_unary_params p = {.struct_size = sizeof p, .act = BERTH_ACT_RELU, .in_scale = 1, .out_scale = 1};
    p.x = f32(buf, 0, 3, 2);
    p.y = f32(buf, 4, 3, 2); /* one float past the end */
    ck_assert_int_eq(vt->get_ops(be)->unary(be, st, &p), BERTH_E_INVALID);
    ck_assert_str_eq(last_error, "example: unary: y ends at byte 28 of a 24-byte buffer");
    ck_assert_int_eq(vt->buffer_fill(be, st, buf, 20, 0, 8), BERTH_E_INVALID);
    ck_assert_str_eq(last_error, "example: buffer_fill: 8 bytes at offset 20 exceed the 24-byte buffer");
    vt->buffer_free(be, buf);
}
END_TEST

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s PATH/berth-backend-example.so\n", argv[0]);
        return 2;
    }
    plugin_path = argv[1];
    Suite *s = suite_create("example_backend");
    TCase *tc = tcase_create("ops");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, descriptor_and_probe);
    tcase_add_test(tc, unary_softcap_and_silu);
    tcase_add_test(tc, binary_broadcast_in_place);
    tcase_add_test(tc, supports_is_honest);
    tcase_add_test(tc, out_of_bounds_is_refused);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}

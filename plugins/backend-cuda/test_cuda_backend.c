/*
 * test_cuda_backend.c — check suite for the CUDA backend plugin, driven through its descriptor like the host.
 *
 * Usage: test_cuda_backend probe|gpu PATH/berth-backend-cuda.so
 *   probe: what must hold on every machine, GPU or not — the .so loads, the descriptor is complete, probe()
 *          succeeds and, without devices, says why in the exact "0 CUDA devices: <name>: <string>" form, and
 *          device_info/init refuse with exact messages. Runs in check's fork mode (no CUDA in the parent).
 *   gpu:   needs a device (exits 77 = skipped otherwise): device info, init, the op table, supports(), graphs,
 *          streams, buffers and every transfer, range errors, out-of-memory, destroy with live objects.
 *          No fork: CUDA must not be used across fork(), so the device check and the tests share one process.
 */
#include <berth/backend.h>

#include <check.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *plugin_path;

/* ---- a minimal host: records the last error and counts log lines ---------------------------------------------- */
static char last_error[512];
static berth_status last_code;
static int n_logs;

static void t_log(berth_host_ctx *ctx, int32_t level, const char *msg)
{
    (void)ctx;
    (void)level;
    (void)msg;
    n_logs++;
}

static void t_set_error(berth_host_ctx *ctx, berth_status code, const char *msg)
{
    (void)ctx;
    last_code = code;
    snprintf(last_error, sizeof last_error, "%s", msg);
}

static berth_host test_host(void)
{
    berth_host h;
    memset(&h, 0, sizeof h);
    h.struct_size = (uint32_t)BERTH_SIZE_TO(berth_host, set_error);
    h.abi_major = BERTH_ABI_MAJOR;
    h.abi_minor = BERTH_ABI_MINOR;
    h.host_version = "test";
    h.services = BERTH_SVC_LOG;
    h.log = t_log;
    h.set_error = t_set_error;
    return h;
}

static const berth_plugin_desc *load_desc(void)
{
    void *so = dlopen(plugin_path, RTLD_NOW | RTLD_LOCAL);
    ck_assert_msg(so != NULL, "dlopen %s: %s", plugin_path, dlerror());
    berth_plugin_entry_fn entry = (berth_plugin_entry_fn)dlsym(so, BERTH_PLUGIN_ENTRY_SYMBOL);
    ck_assert_msg(entry != NULL, "no %s in %s", BERTH_PLUGIN_ENTRY_SYMBOL, plugin_path);
    const berth_plugin_desc *d = entry(BERTH_ABI_MAJOR, BERTH_ABI_MINOR);
    ck_assert_ptr_nonnull(d);
    return d;
}

static const berth_backend_vtable *load_vt(void)
{
    return (const berth_backend_vtable *)load_desc()->vtable;
}

static int probe_count(const berth_backend_vtable *vt, const berth_host *h, berth_probe_info *pi)
{
    memset(pi, 0, sizeof *pi);
    pi->struct_size = (uint32_t)sizeof *pi;
    ck_assert_int_eq(vt->probe(h, pi), BERTH_OK);
    return pi->n_devices;
}

/* ---- probe suite ---------------------------------------------------------------------------------------------- */

START_TEST(descriptor_is_complete)
{
    const berth_plugin_desc *d = load_desc();
    ck_assert_uint_eq(d->magic, BERTH_PLUGIN_MAGIC);
    ck_assert_uint_eq(d->struct_size, BERTH_SIZE_TO(berth_plugin_desc, vtable));
    ck_assert_uint_eq(d->abi_major, BERTH_ABI_MAJOR);
    ck_assert_uint_eq(d->abi_minor, BERTH_ABI_MINOR);
    ck_assert_int_eq(d->kind, BERTH_PLUGIN_BACKEND);
    ck_assert_str_eq(d->name, "cuda");
    ck_assert_uint_eq(d->required_services, BERTH_SVC_LOG);
    const berth_backend_vtable *vt = (const berth_backend_vtable *)d->vtable;
    ck_assert_ptr_nonnull(vt);
    ck_assert_uint_eq(vt->struct_size, BERTH_SIZE_TO(berth_backend_vtable, event_sync));
    ck_assert(vt->graph_begin && vt->graph_end && vt->graph_launch && vt->graph_destroy);
    ck_assert(vt->event_create && vt->event_destroy && vt->event_record && vt->event_sync);
    ck_assert(vt->probe && vt->device_info && vt->init && vt->destroy && vt->supports && vt->get_ops);
    ck_assert(vt->stream_create && vt->stream_destroy && vt->stream_sync);
    ck_assert(vt->buffer_alloc && vt->buffer_free && vt->buffer_upload && vt->buffer_download);
    ck_assert(vt->buffer_copy && vt->buffer_fill);
    /* No WRAP_HOST cap; buffer_host_ptr serves staging buffers only (no HOST_VISIBLE cap). */
    ck_assert_ptr_null(vt->buffer_wrap_host);
    ck_assert_ptr_nonnull(vt->buffer_host_ptr);
}
END_TEST

START_TEST(probe_reports_devices_or_why_not)
{
    const berth_backend_vtable *vt = load_vt();
    berth_host h = test_host();
    berth_probe_info pi;
    int n = probe_count(vt, &h, &pi);
    /* What the runtime itself says, for the exact expected message. */
    int rt_n = -1;
    cudaError_t e = cudaGetDeviceCount(&rt_n);
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) {
        char want[256];
        snprintf(want, sizeof want, "0 CUDA devices: %s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
        ck_assert_int_eq(n, 0);
        ck_assert_str_eq(pi.message, want);
    } else {
        ck_assert_int_eq(e, cudaSuccess);
        ck_assert_int_eq(n, rt_n);
        regex_t re;
        ck_assert_int_eq(regcomp(&re, "^[0-9]+ CUDA devices? \\(runtime [0-9]+\\.[0-9]+, driver [0-9]+\\.[0-9]+\\)$",
                                 REG_EXTENDED), 0);
        ck_assert_msg(regexec(&re, pi.message, 0, NULL, 0) == 0, "probe message: %s", pi.message);
        regfree(&re);
    }
}
END_TEST

START_TEST(probe_writes_only_what_fits)
{
    const berth_backend_vtable *vt = load_vt();
    berth_host h = test_host();
    berth_probe_info pi;
    memset(&pi, 'Z', sizeof pi);
    pi.struct_size = (uint32_t)BERTH_SIZE_TO(berth_probe_info, n_devices); /* an older caller: no message */
    ck_assert_int_eq(vt->probe(&h, &pi), BERTH_OK);
    ck_assert_uint_eq(pi.struct_size, BERTH_SIZE_TO(berth_probe_info, n_devices));
    ck_assert_int_ge(pi.n_devices, 0);
    for (size_t i = 0; i < sizeof pi.message; i++)
        ck_assert_int_eq(pi.message[i], 'Z');
    pi.struct_size = 2; /* cannot even hold n_devices */
    ck_assert_int_eq(vt->probe(&h, &pi), BERTH_E_ABI);
    ck_assert_str_eq(last_error, "cuda: probe: out is NULL or its struct_size is too small");
}
END_TEST

START_TEST(device_info_rejects_missing_device)
{
    const berth_backend_vtable *vt = load_vt();
    berth_host h = test_host();
    berth_probe_info pi;
    int n = probe_count(vt, &h, &pi);
    berth_device_info di;
    memset(&di, 0, sizeof di);
    di.struct_size = (uint32_t)sizeof di;
    ck_assert_int_eq(vt->device_info(&h, n, &di), BERTH_E_NOT_FOUND);
    char want[128];
    snprintf(want, sizeof want, "cuda: device_info: device %d does not exist (%d CUDA device%s)", n, n,
             n == 1 ? "" : "s");
    ck_assert_str_eq(last_error, want);
    ck_assert_int_eq(vt->device_info(&h, -1, &di), BERTH_E_NOT_FOUND);
}
END_TEST

START_TEST(init_fails_cleanly)
{
    const berth_backend_vtable *vt = load_vt();
    berth_host h = test_host();
    berth_probe_info pi;
    int n = probe_count(vt, &h, &pi);
    berth_backend *be = (berth_backend *)&be; /* must stay untouched on failure */
    berth_backend *const sentinel = be;
    if (n == 0) {
        ck_assert_int_eq(vt->init(&h, 0, &be), BERTH_E_NO_DEVICE);
        char want[320];
        snprintf(want, sizeof want, "cuda: init: %s", pi.message);
        ck_assert_str_eq(last_error, want);
    } else {
        ck_assert_int_eq(vt->init(&h, n, &be), BERTH_E_NOT_FOUND);
        char want[128];
        snprintf(want, sizeof want, "cuda: init: device %d does not exist (%d CUDA device%s)", n, n,
                 n == 1 ? "" : "s");
        ck_assert_str_eq(last_error, want);
    }
    ck_assert_ptr_eq(be, sentinel);
    vt->destroy(NULL); /* accepts NULL */
}
END_TEST

/* ---- gpu suite ------------------------------------------------------------------------------------------------ */

static const berth_backend_vtable *g_vt;
static berth_host g_host;
static berth_backend *g_be;

static void gpu_setup(void)
{
    g_vt = load_vt();
    g_host = test_host();
    ck_assert_int_eq(g_vt->init(&g_host, 0, &g_be), BERTH_OK);
}

static void gpu_teardown(void)
{
    g_vt->destroy(g_be);
    g_be = NULL;
}

START_TEST(gpu_device_info)
{
    berth_device_info di;
    memset(&di, 0, sizeof di);
    di.struct_size = (uint32_t)sizeof di;
    ck_assert_int_eq(g_vt->device_info(&g_host, 0, &di), BERTH_OK);
    struct cudaDeviceProp prop;
    ck_assert_int_eq(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
    char want[160];
    snprintf(want, sizeof want, "%.100s (sm_%d%d)", prop.name, prop.major, prop.minor);
    ck_assert_str_eq(di.name, want);
    ck_assert_int_eq(di.index, 0);
    ck_assert_uint_eq(di.total_memory, prop.totalGlobalMem);
    ck_assert_int_eq(di.compute_units, prop.multiProcessorCount);
    ck_assert_uint_eq(di.caps, BERTH_CAP_ASYNC | BERTH_CAP_GRAPHS);
    ck_assert_uint_eq(di.weight_dtypes, BERTH_DTYPE_BIT(BERTH_DTYPE_F32) | BERTH_DTYPE_BIT(BERTH_DTYPE_BF16) |
                                            BERTH_DTYPE_BIT(BERTH_DTYPE_F16));
    ck_assert_uint_eq(di.kv_dtypes, di.weight_dtypes);
    ck_assert_uint_eq(di.act_dtypes, BERTH_DTYPE_BIT(BERTH_DTYPE_F32));
    /* No config (this test host has no config service): bf16 compute, so bf16 KV is preferred. */
    ck_assert_int_eq(di.preferred_kv_dtype, BERTH_DTYPE_BF16);
}
END_TEST

START_TEST(gpu_op_table)
{
    const berth_ops *ops = g_vt->get_ops(g_be);
    ck_assert_ptr_nonnull(ops);
    ck_assert_uint_eq(ops->struct_size, BERTH_SIZE_TO(berth_ops, sample));
    /* Every op Gemma 4 (and NLLB's dense path) needs is there; Qwen3.5's recurrent ops are not yet. */
    ck_assert(ops->matmul && ops->get_rows && ops->rms_norm && ops->layer_norm && ops->rope && ops->unary &&
              ops->glu && ops->binary && ops->copy && ops->kv_append && ops->attention && ops->gated_rms_norm &&
              ops->log_softmax_topk && ops->sample);
    ck_assert_ptr_null(ops->conv1d_causal);
    ck_assert_ptr_null(ops->gated_delta);
    last_error[0] = 0;
    ck_assert_int_eq(g_vt->supports(g_be, BERTH_OP_GATED_DELTA, &(berth_gated_delta_params){0}),
                     BERTH_E_UNSUPPORTED);
    ck_assert_str_eq(last_error, "cuda: gated_delta is not implemented on CUDA yet");
    ck_assert_int_eq(g_vt->supports(g_be, BERTH_OP_COUNT, &(berth_matmul_params){0}), BERTH_E_UNSUPPORTED);
    ck_assert_str_eq(last_error, "cuda: unknown op 16");
    ck_assert_int_eq(g_vt->supports(g_be, BERTH_OP_MATMUL, NULL), BERTH_E_INVALID);
    ck_assert_str_eq(last_error, "cuda: supports: params is NULL");
}
END_TEST

/* Staging buffers are host memory the host may write; device buffers are refused with a reason. */
START_TEST(gpu_staging_host_ptr)
{
    enum { N = 4096 };
    berth_stream *s = NULL;
    berth_buffer *stage = NULL, *dev = NULL;
    void *p = NULL;
    ck_assert_int_eq(g_vt->stream_create(g_be, &s), BERTH_OK);
    ck_assert_int_eq(g_vt->buffer_alloc(g_be, N, BERTH_USAGE_STAGING, &stage), BERTH_OK);
    ck_assert_int_eq(g_vt->buffer_alloc(g_be, N, BERTH_USAGE_ACTIVATIONS, &dev), BERTH_OK);
    ck_assert_int_eq(g_vt->buffer_host_ptr(g_be, stage, &p), BERTH_OK);
    ck_assert_ptr_nonnull(p);
    memset(p, 0x5a, N);
    ck_assert_int_eq(g_vt->buffer_copy(g_be, s, dev, 0, stage, 0, N), BERTH_OK);
    unsigned char back[N];
    ck_assert_int_eq(g_vt->buffer_download(g_be, s, dev, 0, back, N), BERTH_OK);
    ck_assert_int_eq(g_vt->stream_sync(g_be, s), BERTH_OK);
    for (int i = 0; i < N; i++) ck_assert_uint_eq(back[i], 0x5a);
    void *q = (void *)1;
    ck_assert_int_eq(g_vt->buffer_host_ptr(g_be, dev, &q), BERTH_E_UNSUPPORTED);
    ck_assert_str_eq(last_error, "cuda: buffer_host_ptr: only staging buffers (BERTH_USAGE_STAGING) are host memory");
    g_vt->buffer_free(g_be, stage);
    g_vt->buffer_free(g_be, dev);
    g_vt->stream_destroy(g_be, s);
}
END_TEST

/* A recorded fill + copy replays with whatever the source holds at launch time. */
/* An event waits for the work recorded before it, not for later work: the fill copied to pinned memory before the
 * record is there after event_sync; an event never recorded syncs at once; NULLs are refused with a message. */
START_TEST(gpu_event_marks_stream_order)
{
    enum { N = 1 << 20 };
    berth_stream *s = NULL;
    berth_buffer *stage = NULL, *dev = NULL;
    berth_event *e = NULL, *never = NULL;
    unsigned char *p = NULL;
    ck_assert_int_eq(g_vt->stream_create(g_be, &s), BERTH_OK);
    ck_assert_int_eq(g_vt->buffer_alloc(g_be, N, BERTH_USAGE_STAGING, &stage), BERTH_OK);
    ck_assert_int_eq(g_vt->buffer_alloc(g_be, N, BERTH_USAGE_ACTIVATIONS, &dev), BERTH_OK);
    ck_assert_int_eq(g_vt->buffer_host_ptr(g_be, stage, (void **)&p), BERTH_OK);
    ck_assert_int_eq(g_vt->event_create(g_be, &e), BERTH_OK);
    ck_assert_int_eq(g_vt->event_create(g_be, &never), BERTH_OK);
    ck_assert_int_eq(g_vt->event_sync(g_be, never), BERTH_OK);
    for (int round = 0; round < 3; round++) {
        memset(p, 0, N);
        ck_assert_int_eq(g_vt->buffer_fill(g_be, s, dev, 0, (uint8_t)(0x11 * (round + 1)), N), BERTH_OK);
        ck_assert_int_eq(g_vt->buffer_copy(g_be, s, stage, 0, dev, 0, N), BERTH_OK);
        ck_assert_int_eq(g_vt->event_record(g_be, s, e), BERTH_OK);
        /* later work on the stream, which the event does not cover */
        ck_assert_int_eq(g_vt->buffer_fill(g_be, s, dev, 0, 0xee, N), BERTH_OK);
        ck_assert_int_eq(g_vt->event_sync(g_be, e), BERTH_OK);
        ck_assert_uint_eq(p[0], 0x11 * (round + 1));
        ck_assert_uint_eq(p[N - 1], 0x11 * (round + 1));
    }
    ck_assert_int_eq(g_vt->stream_sync(g_be, s), BERTH_OK);
    ck_assert_int_eq(g_vt->event_record(g_be, NULL, e), BERTH_E_INVALID);
    ck_assert_str_eq(last_error, "cuda: event_record: stream or event is NULL");
    ck_assert_int_eq(g_vt->event_sync(g_be, NULL), BERTH_E_INVALID);
    ck_assert_str_eq(last_error, "cuda: event_sync: event is NULL");
    g_vt->event_destroy(g_be, e);
    g_vt->event_destroy(g_be, never);
    g_vt->event_destroy(g_be, NULL);
    g_vt->buffer_free(g_be, stage);
    g_vt->buffer_free(g_be, dev);
    g_vt->stream_destroy(g_be, s);
}
END_TEST

/* buffer_copy at the sizes and alignments the runner's small transfers have (copy.cu runs those up to 256 KiB as
 * a kernel that reads and writes pinned memory directly; larger ones go to the copy engine): pinned -> device ->
 * device -> pinned at odd offsets, in stream order, read on the host after an event (no stream sync): the copied
 * bytes arrive and the bytes around each range stay untouched. Fresh random bytes each run. */
START_TEST(gpu_small_copies_keep_bytes_and_order)
{
    enum { CAP = (256 << 10) + 64 };
    static const struct { uint64_t n, src_off, dst_off; } cases[] = {
        {1, 0, 0},       {3, 1, 5},       {4, 0, 0},     {4, 4, 8},         {17, 3, 0},  {2560, 0, 0},
        {4101, 7, 2},    {4096, 16, 32},  {65536, 0, 0}, {262144, 0, 0},    {262145, 1, 3}, {262144, 16, 48},
    };
    berth_stream *s = NULL;
    berth_buffer *hsrc = NULL, *hdst = NULL, *d1 = NULL, *d2 = NULL;
    berth_event *e = NULL;
    unsigned char *src = NULL, *dst = NULL;
    ck_assert_int_eq(g_vt->stream_create(g_be, &s), BERTH_OK);
    ck_assert_int_eq(g_vt->buffer_alloc(g_be, CAP, BERTH_USAGE_STAGING, &hsrc), BERTH_OK);
    ck_assert_int_eq(g_vt->buffer_alloc(g_be, CAP, BERTH_USAGE_STAGING, &hdst), BERTH_OK);
    ck_assert_int_eq(g_vt->buffer_alloc(g_be, CAP, BERTH_USAGE_ACTIVATIONS, &d1), BERTH_OK);
    ck_assert_int_eq(g_vt->buffer_alloc(g_be, CAP, BERTH_USAGE_ACTIVATIONS, &d2), BERTH_OK);
    ck_assert_int_eq(g_vt->buffer_host_ptr(g_be, hsrc, (void **)&src), BERTH_OK);
    ck_assert_int_eq(g_vt->buffer_host_ptr(g_be, hdst, (void **)&dst), BERTH_OK);
    ck_assert_int_eq(g_vt->event_create(g_be, &e), BERTH_OK);
    srand((unsigned)time(NULL));
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const uint64_t n = cases[c].n, so = cases[c].src_off, dof = cases[c].dst_off;
        for (int i = 0; i < CAP; i++) src[i] = (unsigned char)rand();
        memset(dst, 0xc3, CAP);
        ck_assert_int_eq(g_vt->buffer_fill(g_be, s, d1, 0, 0x5e, CAP), BERTH_OK);
        ck_assert_int_eq(g_vt->buffer_fill(g_be, s, d2, 0, 0x6f, CAP), BERTH_OK);
        ck_assert_int_eq(g_vt->buffer_copy(g_be, s, d1, dof, hsrc, so, n), BERTH_OK);     /* pinned -> device */
        ck_assert_int_eq(g_vt->buffer_copy(g_be, s, d2, so, d1, dof, n), BERTH_OK);       /* device -> device */
        ck_assert_int_eq(g_vt->buffer_copy(g_be, s, hdst, dof, d2, so, n), BERTH_OK);     /* device -> pinned */
        ck_assert_int_eq(g_vt->event_record(g_be, s, e), BERTH_OK);
        ck_assert_int_eq(g_vt->event_sync(g_be, e), BERTH_OK);
        for (uint64_t i = 0; i < (uint64_t)CAP; i++) {
            const unsigned char want = i >= dof && i < dof + n ? src[so + (i - dof)] : 0xc3;
            ck_assert_msg(dst[i] == want, "case %zu (n %llu, src +%llu, dst +%llu): byte %llu is %u, not %u", c,
                          (unsigned long long)n, (unsigned long long)so, (unsigned long long)dof,
                          (unsigned long long)i, dst[i], want);
        }
        ck_assert_int_eq(g_vt->stream_sync(g_be, s), BERTH_OK);
    }
    g_vt->event_destroy(g_be, e);
    g_vt->buffer_free(g_be, hsrc);
    g_vt->buffer_free(g_be, hdst);
    g_vt->buffer_free(g_be, d1);
    g_vt->buffer_free(g_be, d2);
    g_vt->stream_destroy(g_be, s);
}
END_TEST

START_TEST(gpu_graph_replays_with_new_contents)
{
    enum { N = 4096 };
    berth_stream *s = NULL;
    berth_buffer *src = NULL, *dst = NULL;
    ck_assert_int_eq(g_vt->stream_create(g_be, &s), BERTH_OK);
    ck_assert_int_eq(g_vt->buffer_alloc(g_be, N, BERTH_USAGE_ACTIVATIONS, &src), BERTH_OK);
    ck_assert_int_eq(g_vt->buffer_alloc(g_be, N, BERTH_USAGE_ACTIVATIONS, &dst), BERTH_OK);
    ck_assert_int_eq(g_vt->graph_begin(g_be, s), BERTH_OK);
    ck_assert_int_eq(g_vt->graph_begin(g_be, s), BERTH_E_INVALID);
    ck_assert_str_eq(last_error, "cuda: graph_begin: a capture is already in progress");
    ck_assert_int_eq(g_vt->buffer_copy(g_be, s, dst, 0, src, 0, N), BERTH_OK);
    berth_graph *g = NULL;
    ck_assert_int_eq(g_vt->graph_end(g_be, s, &g), BERTH_OK);
    ck_assert_ptr_nonnull(g);
    unsigned char host[N], back[N];
    for (int round = 0; round < 3; round++) {
        memset(host, 0x11 * (round + 1), N);
        ck_assert_int_eq(g_vt->buffer_upload(g_be, s, src, 0, host, N), BERTH_OK);
        ck_assert_int_eq(g_vt->graph_launch(g_be, s, g), BERTH_OK);
        ck_assert_int_eq(g_vt->buffer_download(g_be, s, dst, 0, back, N), BERTH_OK);
        ck_assert_int_eq(g_vt->stream_sync(g_be, s), BERTH_OK);
        ck_assert_int_eq(memcmp(host, back, N), 0);
    }
    g_vt->graph_destroy(g_be, g);
    ck_assert_int_eq(g_vt->graph_end(g_be, s, &g), BERTH_E_INVALID);
    ck_assert_str_eq(last_error, "cuda: graph_end: no capture in progress");
    g_vt->buffer_free(g_be, src);
    g_vt->buffer_free(g_be, dst);
    g_vt->stream_destroy(g_be, s);
}
END_TEST

START_TEST(gpu_buffers_round_trip)
{
    enum { N = 1 << 20 };
    berth_stream *s = NULL;
    berth_buffer *a = NULL, *b = NULL, *st = NULL;
    ck_assert_int_eq(g_vt->stream_create(g_be, &s), BERTH_OK);
    ck_assert_int_eq(g_vt->buffer_alloc(g_be, N, BERTH_USAGE_ACTIVATIONS, &a), BERTH_OK);
    ck_assert_int_eq(g_vt->buffer_alloc(g_be, N, BERTH_USAGE_KV, &b), BERTH_OK);
    ck_assert_int_eq(g_vt->buffer_alloc(g_be, N, BERTH_USAGE_STAGING, &st), BERTH_OK);
    unsigned char *src = malloc(N), *dst = malloc(N);
    ck_assert(src && dst);
    for (int i = 0; i < N; i++)
        src[i] = (unsigned char)(i * 7 + 3);
    ck_assert_int_eq(g_vt->buffer_upload(g_be, s, a, 0, src, N), BERTH_OK);
    memset(src, 0, N); /* upload has read src by the time it returned */
    ck_assert_int_eq(g_vt->buffer_copy(g_be, s, b, 0, a, 0, N), BERTH_OK);
    ck_assert_int_eq(g_vt->buffer_fill(g_be, s, b, 100, 0xAB, 28), BERTH_OK);
    ck_assert_int_eq(g_vt->buffer_copy(g_be, s, st, 0, b, 0, N), BERTH_OK); /* device -> pinned */
    ck_assert_int_eq(g_vt->buffer_fill(g_be, s, st, 0, 0x11, 4), BERTH_OK);  /* pinned fill keeps order */
    ck_assert_int_eq(g_vt->buffer_download(g_be, s, st, 0, dst, N), BERTH_OK);
    ck_assert_int_eq(g_vt->stream_sync(g_be, s), BERTH_OK);
    for (int i = 0; i < N; i++) {
        unsigned char want = (unsigned char)(i * 7 + 3);
        if (i < 4)
            want = 0x11;
        else if (i >= 100 && i < 128)
            want = 0xAB;
        ck_assert_msg(dst[i] == want, "byte %d: %u != %u", i, dst[i], want);
    }
    free(src);
    free(dst);
    g_vt->buffer_free(g_be, a);
    g_vt->buffer_free(g_be, NULL);
    g_vt->stream_destroy(g_be, s);
    /* b and st stay alive on purpose: destroy releases them. */
}
END_TEST

START_TEST(gpu_range_and_argument_errors)
{
    berth_stream *s = NULL;
    berth_buffer *a = NULL;
    unsigned char tmp[64] = {0};
    ck_assert_int_eq(g_vt->stream_create(g_be, &s), BERTH_OK);
    ck_assert_int_eq(g_vt->buffer_alloc(g_be, 64, BERTH_USAGE_WEIGHTS, &a), BERTH_OK);
    ck_assert_int_eq(g_vt->buffer_upload(g_be, s, a, 60, tmp, 8), BERTH_E_INVALID);
    ck_assert_str_eq(last_error, "cuda: buffer_upload: range [60, 60 + 8) is outside the buffer of 64 bytes");
    ck_assert_int_eq(g_vt->buffer_download(g_be, s, a, UINT64_MAX, tmp, 2), BERTH_E_INVALID);
    ck_assert_int_eq(g_vt->buffer_fill(g_be, NULL, a, 0, 0, 1), BERTH_E_INVALID);
    ck_assert_str_eq(last_error, "cuda: buffer_fill: stream is NULL");
    ck_assert_int_eq(g_vt->buffer_alloc(g_be, 8, 99, &a), BERTH_E_INVALID);
    ck_assert_str_eq(last_error, "cuda: buffer_alloc: unknown usage 99");
    ck_assert_int_eq(g_vt->buffer_upload(g_be, s, a, 64, tmp, 0), BERTH_OK); /* empty range at the end */
    ck_assert_int_eq(g_vt->stream_sync(g_be, s), BERTH_OK);
}
END_TEST

START_TEST(gpu_out_of_memory_is_reported_and_recoverable)
{
    berth_buffer *huge = NULL;
    ck_assert_int_eq(g_vt->buffer_alloc(g_be, 1ull << 50, BERTH_USAGE_WEIGHTS, &huge), BERTH_E_DEVICE_OOM);
    ck_assert_ptr_null(huge);
    ck_assert_str_eq(last_error, "cuda device 0: cudaMalloc(1125899906842624 bytes): cudaErrorMemoryAllocation: "
                                 "out of memory");
    berth_buffer *small = NULL; /* not sticky: the device keeps working */
    ck_assert_int_eq(g_vt->buffer_alloc(g_be, 4096, BERTH_USAGE_WEIGHTS, &small), BERTH_OK);
    g_vt->buffer_free(g_be, small);
}
END_TEST

START_TEST(gpu_zero_byte_buffer)
{
    berth_buffer *z = NULL;
    berth_stream *s = NULL;
    ck_assert_int_eq(g_vt->stream_create(g_be, &s), BERTH_OK);
    ck_assert_int_eq(g_vt->buffer_alloc(g_be, 0, BERTH_USAGE_ACTIVATIONS, &z), BERTH_OK);
    ck_assert_ptr_nonnull(z);
    ck_assert_int_eq(g_vt->buffer_fill(g_be, s, z, 0, 0, 0), BERTH_OK);
    ck_assert_int_eq(g_vt->buffer_fill(g_be, s, z, 0, 0, 1), BERTH_E_INVALID);
    g_vt->buffer_free(g_be, z);
}
END_TEST

int main(int argc, char **argv)
{
    if (argc != 3 || (strcmp(argv[1], "probe") != 0 && strcmp(argv[1], "gpu") != 0)) {
        fprintf(stderr, "usage: %s probe|gpu PATH/berth-backend-cuda.so\n", argv[0]);
        return 2;
    }
    plugin_path = argv[2];
    Suite *suite = suite_create("cuda_backend");
    SRunner *sr;
    if (strcmp(argv[1], "probe") == 0) {
        TCase *tc = tcase_create("probe");
        /* Each test dlopens the plugin (23 MB of sm_90 code and PTX, registered with cudart at load): more than
         * check's default 4 s on a loaded two-core CI machine. */
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, descriptor_is_complete);
        tcase_add_test(tc, probe_reports_devices_or_why_not);
        tcase_add_test(tc, probe_writes_only_what_fits);
        tcase_add_test(tc, device_info_rejects_missing_device);
        tcase_add_test(tc, init_fails_cleanly);
        suite_add_tcase(suite, tc);
        sr = srunner_create(suite);
    } else {
        /* Decide skip-or-run in this process, then run without fork (CUDA does not survive fork). */
        void *so = dlopen(plugin_path, RTLD_NOW | RTLD_LOCAL);
        if (!so) {
            fprintf(stderr, "dlopen %s: %s\n", plugin_path, dlerror());
            return 1;
        }
        berth_plugin_entry_fn entry = (berth_plugin_entry_fn)dlsym(so, BERTH_PLUGIN_ENTRY_SYMBOL);
        const berth_backend_vtable *vt = (const berth_backend_vtable *)entry(BERTH_ABI_MAJOR, BERTH_ABI_MINOR)->vtable;
        berth_host h = test_host();
        berth_probe_info pi;
        memset(&pi, 0, sizeof pi);
        pi.struct_size = (uint32_t)sizeof pi;
        if (vt->probe(&h, &pi) != BERTH_OK || pi.n_devices == 0) {
            printf("skipped: %s\n", pi.message);
            return 77;
        }
        TCase *tc = tcase_create("gpu");
        tcase_add_checked_fixture(tc, gpu_setup, gpu_teardown);
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, gpu_device_info);
        tcase_add_test(tc, gpu_op_table);
        tcase_add_test(tc, gpu_graph_replays_with_new_contents);
        tcase_add_test(tc, gpu_staging_host_ptr);
        tcase_add_test(tc, gpu_event_marks_stream_order);
        tcase_add_test(tc, gpu_small_copies_keep_bytes_and_order);
        tcase_add_test(tc, gpu_buffers_round_trip);
        tcase_add_test(tc, gpu_range_and_argument_errors);
        tcase_add_test(tc, gpu_out_of_memory_is_reported_and_recoverable);
        tcase_add_test(tc, gpu_zero_byte_buffer);
        suite_add_tcase(suite, tc);
        sr = srunner_create(suite);
        srunner_set_fork_status(sr, CK_NOFORK);
    }
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}

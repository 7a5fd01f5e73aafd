/*
 * test_backend.c — a small backend plugin for the loader conformance and selection tests.
 *
 * Built several times by tests/plugins/meson.build: the plain build ("testcpu") is a well-formed backend with one
 * host-memory "device"; each -D switch below breaks exactly one thing the loader or the selection checks. Buffers
 * and streams work (plain host memory); ops only exist so that op-table and supports() checks have something to
 * look at: executing one fails with BERTH_E_UNSUPPORTED and says so. This is test scaffolding, not a backend.
 *
 * Switches: TB_NAME, TB_MAGIC, TB_ABI_MAJOR, TB_ABI_MINOR, TB_DESC_SIZE, TB_KIND, TB_SERVICES, TB_VTABLE_SIZE,
 * TB_N_DEVICES, TB_NO_ENTRY, TB_ENTRY_NULL, TB_NULL_VTABLE, TB_NULL_BUFFER_ALLOC, TB_PROBE_FAIL, TB_INIT_FAIL,
 * TB_NO_ATTENTION.
 */
#include <berth/backend.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef TB_NAME
#define TB_NAME "testcpu"
#endif
#ifndef TB_MAGIC
#define TB_MAGIC BERTH_PLUGIN_MAGIC
#endif
#ifndef TB_ABI_MAJOR
#define TB_ABI_MAJOR BERTH_ABI_MAJOR
#endif
#ifndef TB_ABI_MINOR
#define TB_ABI_MINOR BERTH_ABI_MINOR
#endif
#ifndef TB_DESC_SIZE
#define TB_DESC_SIZE BERTH_SIZE_TO(berth_plugin_desc, vtable)
#endif
#ifndef TB_KIND
#define TB_KIND BERTH_PLUGIN_BACKEND
#endif
#ifndef TB_SERVICES
#define TB_SERVICES (BERTH_SVC_LOG | BERTH_SVC_CONFIG)
#endif
#ifndef TB_VTABLE_SIZE
#define TB_VTABLE_SIZE sizeof(berth_backend_vtable)
#endif
#ifndef TB_N_DEVICES
#define TB_N_DEVICES 1
#endif
/* The largest attention head_dim supports() accepts, so a model can ask for more than this backend does. */
#define TB_MAX_HEAD_DIM 256

struct berth_backend {
    const berth_host *host;
    int32_t device;
};

struct berth_buffer {
    uint64_t nbytes;
    int wrapped;
    unsigned char *data;
};

struct berth_stream {
    int unused;
};

static berth_status fail(const berth_host *host, berth_status code, const char *msg)
{
    host->set_error(host->ctx, code, msg);
    return code;
}

static berth_status tb_probe(const berth_host *host, berth_probe_info *out)
{
#ifdef TB_PROBE_FAIL
    return fail(host, BERTH_E_BACKEND, TB_NAME ": driver not responding");
#else
    (void)host;
    out->n_devices = TB_N_DEVICES;
    snprintf(out->message, sizeof out->message, "%s",
             TB_N_DEVICES ? "1 test device" : "0 TEST devices: no test accelerator here");
    return BERTH_OK;
#endif
}

static berth_status tb_device_info(const berth_host *host, int32_t idx, berth_device_info *out)
{
    if (idx < 0 || idx >= TB_N_DEVICES)
        return fail(host, BERTH_E_NOT_FOUND, TB_NAME ": no such device");
    out->index = idx;
    snprintf(out->name, sizeof out->name, "Test CPU device %d", (int)idx);
    out->total_memory = 1ull << 30;
    out->free_memory = 1ull << 29;
    out->caps = BERTH_CAP_WRAP_HOST | BERTH_CAP_HOST_VISIBLE;
    out->weight_dtypes = BERTH_DTYPE_BIT(BERTH_DTYPE_F32) | BERTH_DTYPE_BIT(BERTH_DTYPE_BF16);
    out->act_dtypes = BERTH_DTYPE_BIT(BERTH_DTYPE_F32);
    out->kv_dtypes = BERTH_DTYPE_BIT(BERTH_DTYPE_F32);
    out->compute_units = 2;
    return BERTH_OK;
}

static berth_status tb_init(const berth_host *host, int32_t idx, berth_backend **out)
{
#ifdef TB_INIT_FAIL
    /* The message comes from [backend.NAME] message= when set, to show config_get reaching the plugin. */
    const char *m = host->config_get(host->ctx, "message");
    return fail(host, BERTH_E_BACKEND, m ? m : TB_NAME ": init failed");
#else
    if (idx < 0 || idx >= TB_N_DEVICES)
        return fail(host, BERTH_E_NOT_FOUND, TB_NAME ": no such device");
    berth_backend *be = calloc(1, sizeof *be);
    if (!be)
        return fail(host, BERTH_E_NOMEM, TB_NAME ": out of memory");
    be->host = host;
    be->device = idx;
    host->log(host->ctx, BERTH_LOG_INFO, "opened device 0");
    *out = be;
    return BERTH_OK;
#endif
}

static void tb_destroy(berth_backend *be) { free(be); }

static berth_status tb_supports(berth_backend *be, int32_t op, const void *params)
{
    switch (op) {
    case BERTH_OP_MATMUL:
    case BERTH_OP_RMS_NORM:
        return BERTH_OK;
#ifndef TB_NO_ATTENTION
    case BERTH_OP_ATTENTION: {
        const berth_attention_params *p = params;
        if (p && p->q.ne[0] > TB_MAX_HEAD_DIM) {
            char msg[128];
            snprintf(msg, sizeof msg, TB_NAME ": attention head_dim %lld exceeds %d", (long long)p->q.ne[0],
                     TB_MAX_HEAD_DIM);
            return fail(be->host, BERTH_E_UNSUPPORTED, msg);
        }
        return BERTH_OK;
    }
#endif
    default:
        return fail(be->host, BERTH_E_UNSUPPORTED, TB_NAME ": op not supported");
    }
}

static berth_status tb_no_exec(berth_backend *be)
{
    return fail(be->host, BERTH_E_UNSUPPORTED, TB_NAME ": the test backend does not execute ops");
}
static berth_status tb_matmul(berth_backend *be, berth_stream *s, const berth_matmul_params *p) { return tb_no_exec(be); }
static berth_status tb_rms_norm(berth_backend *be, berth_stream *s, const berth_rms_norm_params *p) { return tb_no_exec(be); }
#ifndef TB_NO_ATTENTION
static berth_status tb_attention(berth_backend *be, berth_stream *s, const berth_attention_params *p) { return tb_no_exec(be); }
#endif

static const berth_ops tb_ops = {
    .struct_size = sizeof(berth_ops),
    .matmul = tb_matmul,
    .rms_norm = tb_rms_norm,
#ifndef TB_NO_ATTENTION
    .attention = tb_attention,
#endif
};

static const berth_ops *tb_get_ops(berth_backend *be) { return &tb_ops; }

static berth_status tb_stream_create(berth_backend *be, berth_stream **out)
{
    berth_stream *s = calloc(1, sizeof *s);
    if (!s)
        return fail(be->host, BERTH_E_NOMEM, TB_NAME ": out of memory");
    *out = s;
    return BERTH_OK;
}
static void tb_stream_destroy(berth_backend *be, berth_stream *s) { free(s); }
static berth_status tb_stream_sync(berth_backend *be, berth_stream *s) { return BERTH_OK; }

/* unused in the TB_NULL_BUFFER_ALLOC build */
__attribute__((unused)) static berth_status tb_buffer_alloc(berth_backend *be, uint64_t nbytes, int32_t usage,
                                                            berth_buffer **out)
{
    berth_buffer *b = calloc(1, sizeof *b);
    if (b)
        b->data = malloc(nbytes ? nbytes : 1);
    if (!b || !b->data) {
        free(b);
        return fail(be->host, BERTH_E_NOMEM, TB_NAME ": out of memory");
    }
    b->nbytes = nbytes;
    *out = b;
    return BERTH_OK;
}
static void tb_buffer_free(berth_backend *be, berth_buffer *b)
{
    if (b && !b->wrapped)
        free(b->data);
    free(b);
}
static berth_status tb_buffer_wrap_host(berth_backend *be, void *ptr, uint64_t nbytes, int32_t read_only,
                                        berth_buffer **out)
{
    berth_buffer *b = calloc(1, sizeof *b);
    if (!b)
        return fail(be->host, BERTH_E_NOMEM, TB_NAME ": out of memory");
    b->data = ptr;
    b->nbytes = nbytes;
    b->wrapped = 1;
    *out = b;
    return BERTH_OK;
}
static berth_status tb_buffer_host_ptr(berth_backend *be, berth_buffer *b, void **out)
{
    *out = b->data;
    return BERTH_OK;
}
static int in_range(const berth_buffer *b, uint64_t off, uint64_t n) { return off <= b->nbytes && n <= b->nbytes - off; }
static berth_status tb_upload(berth_backend *be, berth_stream *s, berth_buffer *dst, uint64_t off, const void *src,
                              uint64_t n)
{
    if (!in_range(dst, off, n))
        return fail(be->host, BERTH_E_INVALID, TB_NAME ": upload out of range");
    memcpy(dst->data + off, src, n);
    return BERTH_OK;
}
static berth_status tb_download(berth_backend *be, berth_stream *s, const berth_buffer *src, uint64_t off, void *dst,
                                uint64_t n)
{
    if (!in_range(src, off, n))
        return fail(be->host, BERTH_E_INVALID, TB_NAME ": download out of range");
    memcpy(dst, src->data + off, n);
    return BERTH_OK;
}
static berth_status tb_copy(berth_backend *be, berth_stream *s, berth_buffer *dst, uint64_t doff,
                            const berth_buffer *src, uint64_t soff, uint64_t n)
{
    if (!in_range(dst, doff, n) || !in_range(src, soff, n))
        return fail(be->host, BERTH_E_INVALID, TB_NAME ": copy out of range");
    memmove(dst->data + doff, src->data + soff, n);
    return BERTH_OK;
}
static berth_status tb_fill(berth_backend *be, berth_stream *s, berth_buffer *dst, uint64_t off, uint8_t byte,
                            uint64_t n)
{
    if (!in_range(dst, off, n))
        return fail(be->host, BERTH_E_INVALID, TB_NAME ": fill out of range");
    memset(dst->data + off, byte, n);
    return BERTH_OK;
}

__attribute__((unused)) static const berth_backend_vtable tb_vtable = {
    .struct_size = TB_VTABLE_SIZE,
    .probe = tb_probe,
    .device_info = tb_device_info,
    .init = tb_init,
    .destroy = tb_destroy,
    .supports = tb_supports,
    .get_ops = tb_get_ops,
    .stream_create = tb_stream_create,
    .stream_destroy = tb_stream_destroy,
    .stream_sync = tb_stream_sync,
#ifdef TB_NULL_BUFFER_ALLOC
    .buffer_alloc = NULL,
#else
    .buffer_alloc = tb_buffer_alloc,
#endif
    .buffer_free = tb_buffer_free,
    .buffer_wrap_host = tb_buffer_wrap_host,
    .buffer_host_ptr = tb_buffer_host_ptr,
    .buffer_upload = tb_upload,
    .buffer_download = tb_download,
    .buffer_copy = tb_copy,
    .buffer_fill = tb_fill,
};

__attribute__((unused)) static const berth_plugin_desc tb_desc = {
    .magic = TB_MAGIC,
    .struct_size = TB_DESC_SIZE,
    .abi_major = TB_ABI_MAJOR,
    .abi_minor = TB_ABI_MINOR,
    .kind = TB_KIND,
    .name = TB_NAME,
    .version = "0.1.0",
    .description = "test backend (" TB_NAME ")",
    .required_services = TB_SERVICES,
#ifdef TB_NULL_VTABLE
    .vtable = NULL,
#else
    .vtable = &tb_vtable,
#endif
};

#ifdef TB_NO_ENTRY
/* Exports something, just not the entry point. */
BERTH_EXPORT const berth_plugin_desc *berth_plugin_entry_v0(uint32_t major, uint32_t minor);
const berth_plugin_desc *berth_plugin_entry_v0(uint32_t major, uint32_t minor) { return &tb_desc; }
#else
BERTH_EXPORT const berth_plugin_desc *berth_plugin_entry(uint32_t major, uint32_t minor);
const berth_plugin_desc *berth_plugin_entry(uint32_t major, uint32_t minor)
{
#ifdef TB_ENTRY_NULL
    return NULL;
#else
    return &tb_desc;
#endif
}
#endif

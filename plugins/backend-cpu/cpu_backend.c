/*
 * cpu_backend.c — the CPU backend plugin: descriptor, vtable, probe/device info, init (thread pool, ISA choice),
 * buffers (64-byte aligned malloc or wrapped host memory), trivial streams (ops run synchronously), scratch
 * memory, supports() and the op table.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_backend.h"
#include "matmul_kernels.h"

#define CPU_ALIGN 64
#define CPU_MAX_THREADS 1024

/* ---- configuration ---- */

/* Thread count from [backend.cpu] threads (absent or 0: one per online core). */
static berth_status read_threads(const berth_host *host, int *out)
{
    const char *v = host->config_get ? host->config_get(host->ctx, "threads") : NULL;
    long n = 0;
    if (v && *v) {
        char *end;
        errno = 0;
        n = strtol(v, &end, 10);
        while (*end == ' ' || *end == '\t')
            end++;
        if (errno || *end || n < 0 || n > CPU_MAX_THREADS) {
            char msg[160];
            snprintf(msg, sizeof msg, "[backend.cpu] threads = '%.60s' is not an integer in 0..%d", v,
                     CPU_MAX_THREADS);
            host->set_error(host->ctx, BERTH_E_INVALID, msg);
            return BERTH_E_INVALID;
        }
    }
    if (n == 0) {
        n = sysconf(_SC_NPROCESSORS_ONLN);
        if (n < 1)
            n = 1;
        if (n > CPU_MAX_THREADS)
            n = CPU_MAX_THREADS;
    }
    *out = (int)n;
    return BERTH_OK;
}

/* Matmul kernels from [backend.cpu] isa (absent or "auto": the best this CPU runs; "avx512", "avx2" or
 * "generic" pin one, e.g. to test the portable kernels on a new CPU). */
static berth_status read_isa(const berth_host *host, const struct mm_kernels **out)
{
    const char *v = host->config_get ? host->config_get(host->ctx, "isa") : NULL;
    if (!v || !*v || strcmp(v, "auto") == 0) {
        *out = mm_kernels_select();
        return BERTH_OK;
    }
    *out = mm_kernels_by_name(v);
    if (!*out) {
        char msg[160];
        snprintf(msg, sizeof msg, "[backend.cpu] isa = '%.40s' is not one of auto, avx512, avx2, generic that this CPU runs",
                 v);
        host->set_error(host->ctx, BERTH_E_INVALID, msg);
        return BERTH_E_INVALID;
    }
    return BERTH_OK;
}

/* ---- probe and device info ---- */

static berth_status cpu_probe(const berth_host *host, berth_probe_info *out)
{
    if (BERTH_HAS(out, berth_probe_info, n_devices))
        out->n_devices = 1;
    if (BERTH_HAS(out, berth_probe_info, message))
        snprintf(out->message, sizeof out->message, "1 CPU device");
    return BERTH_OK;
}

static berth_status cpu_device_info(const berth_host *host, int32_t idx, berth_device_info *out)
{
    if (idx != 0) {
        char msg[96];
        snprintf(msg, sizeof msg, "cpu: device %d does not exist (1 device)", idx);
        host->set_error(host->ctx, BERTH_E_NOT_FOUND, msg);
        return BERTH_E_NOT_FOUND;
    }
    int threads;
    const struct mm_kernels *mmk;
    berth_status st = read_threads(host, &threads);
    if (st == BERTH_OK)
        st = read_isa(host, &mmk);
    if (st != BERTH_OK)
        return st;
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    berth_device_info d;
    memset(&d, 0, sizeof d);
    d.struct_size = out->struct_size;
    d.index = 0;
#if defined(__x86_64__)
    const char *arch = "x86_64";
#elif defined(__aarch64__)
    const char *arch = "aarch64";
#else
    const char *arch = "generic";
#endif
    snprintf(d.name, sizeof d.name, "%s CPU (%d threads, %s)", arch, threads, mmk->isa);
    d.total_memory = (uint64_t)sysconf(_SC_PHYS_PAGES) * page;
    d.free_memory = (uint64_t)sysconf(_SC_AVPHYS_PAGES) * page;
    d.caps = BERTH_CAP_WRAP_HOST | BERTH_CAP_HOST_VISIBLE;
    d.weight_dtypes = CPU_WEIGHT_DTYPES;
    d.act_dtypes = CPU_ACT_DTYPES;
    d.kv_dtypes = CPU_KV_DTYPES;
    d.compute_units = threads;
    /* out-struct: write only what the caller's struct_size covers */
    size_t n = out->struct_size < sizeof d ? out->struct_size : sizeof d;
    memcpy(out, &d, n);
    return BERTH_OK;
}

/* ---- what the shared op checks need (plugins/common/op_check.h) ---- */

static void cpu_buffer_facts(const berth_buffer *b, uintptr_t *addr, uint64_t *size, int *read_only)
{
    *addr = (uintptr_t)b->ptr;
    *size = b->size;
    *read_only = b->read_only;
}

static const struct opck_backend cpu_opck = {
    .weight_dtypes = CPU_WEIGHT_DTYPES,
    .act_dtypes = CPU_ACT_DTYPES,
    .kv_dtypes = CPU_KV_DTYPES,
    .attn_max_rep = CPU_ATTN_MAX_REP,
    .attn_max_head_dim = 0, /* head vectors live in per-thread scratch sized per call */
    .buffer_facts = cpu_buffer_facts,
    .conv_max_k = CPU_CONV_MAX_K,
};

berth_status cpu_report(const berth_backend *be, const struct opck *c)
{
    be->host->set_error(be->host->ctx, c->code, c->msg);
    return c->code;
}

/* A check's failure as supports() answers it: always BERTH_E_UNSUPPORTED, same message. */
static berth_status cpu_report_unsupported(const berth_backend *be, const struct opck *c)
{
    be->host->set_error(be->host->ctx, BERTH_E_UNSUPPORTED, c->msg);
    return BERTH_E_UNSUPPORTED;
}

/* ---- init / destroy ---- */

static void cpu_destroy(berth_backend *be)
{
    if (!be)
        return;
    cpu_pool_destroy(be->pool);
    if (be->per_thread)
        for (int i = 0; i < be->n_threads; i++)
            free(be->per_thread[i].ptr);
    free(be->per_thread);
    free(be->shared.ptr);
    pthread_mutex_destroy(&be->exec_mu);
    free(be);
}

static berth_status cpu_init(const berth_host *host, int32_t idx, berth_backend **out)
{
    if (idx != 0) {
        char msg[96];
        snprintf(msg, sizeof msg, "cpu: device %d does not exist (1 device)", idx);
        host->set_error(host->ctx, BERTH_E_NOT_FOUND, msg);
        return BERTH_E_NOT_FOUND;
    }
    int threads;
    const struct mm_kernels *mmk;
    berth_status st = read_threads(host, &threads);
    if (st == BERTH_OK)
        st = read_isa(host, &mmk);
    if (st != BERTH_OK)
        return st;
    berth_backend *be = calloc(1, sizeof *be);
    if (!be) {
        host->set_error(host->ctx, BERTH_E_NOMEM, "cpu: out of memory creating the backend");
        return BERTH_E_NOMEM;
    }
    be->host = host;
    be->n_threads = threads;
    be->mmk = mmk;
    be->ck = cpu_opck;
    pthread_mutex_init(&be->exec_mu, NULL);
    be->per_thread = calloc((size_t)threads, sizeof *be->per_thread);
    if (!be->per_thread) {
        cpu_destroy(be);
        host->set_error(host->ctx, BERTH_E_NOMEM, "cpu: out of memory creating the backend");
        return BERTH_E_NOMEM;
    }
    const int err = cpu_pool_create(threads, &be->pool);
    if (err) {
        char msg[128];
        snprintf(msg, sizeof msg, "cpu: cannot start %d worker threads: %s", threads - 1, strerror(err));
        cpu_destroy(be);
        host->set_error(host->ctx, BERTH_E_BACKEND, msg);
        return BERTH_E_BACKEND;
    }
    if (host->log) {
        char msg[128];
        snprintf(msg, sizeof msg, "cpu backend: %d threads, %s matmul kernels", threads, be->mmk->isa);
        host->log(host->ctx, BERTH_LOG_INFO, msg);
    }
    *out = be;
    return BERTH_OK;
}

/* ---- scratch ---- */

static bool scratch_grow(struct cpu_scratch *s, size_t bytes)
{
    if (s->size >= bytes)
        return true;
    const size_t want = (bytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN;
    void *p = aligned_alloc(CPU_ALIGN, want);
    if (!p)
        return false;
    free(s->ptr);
    s->ptr = p;
    s->size = want;
    return true;
}

berth_status cpu_scratch_shared(berth_backend *be, size_t bytes, void **out)
{
    if (!scratch_grow(&be->shared, bytes)) {
        char msg[96];
        snprintf(msg, sizeof msg, "cpu: out of memory allocating %zu bytes of scratch", bytes);
        be->host->set_error(be->host->ctx, BERTH_E_NOMEM, msg);
        return BERTH_E_NOMEM;
    }
    *out = be->shared.ptr;
    return BERTH_OK;
}

berth_status cpu_scratch_threads(berth_backend *be, size_t bytes)
{
    for (int i = 0; i < be->n_threads; i++)
        if (!scratch_grow(&be->per_thread[i], bytes)) {
            char msg[96];
            snprintf(msg, sizeof msg, "cpu: out of memory allocating %zu bytes of scratch per thread", bytes);
            be->host->set_error(be->host->ctx, BERTH_E_NOMEM, msg);
            return BERTH_E_NOMEM;
        }
    return BERTH_OK;
}

int cpu_threads_for(const berth_backend *be, double work, double min_per_thread)
{
    const double n = work / min_per_thread;
    if (n < 2.0)
        return 1;
    return n >= be->n_threads ? be->n_threads : (int)n;
}

struct range_job {
    cpu_range_fn fn;
    const void *ctx;
    int64_t n;
};

static void range_task(void *arg, int tid, int nth)
{
    const struct range_job *j = arg;
    int64_t lo, hi;
    cpu_split(j->n, 1, tid, nth, &lo, &hi);
    if (lo < hi)
        j->fn(j->ctx, lo, hi);
}

/* Elements' worth of work below which waking another thread does not pay. */
#define CPU_MIN_WORK_PER_THREAD 16384.0

void cpu_parallel_for(berth_backend *be, int64_t n, double cost_per_item, cpu_range_fn fn, const void *ctx)
{
    if (n <= 0)
        return;
    int nth = cpu_threads_for(be, (double)n * cost_per_item, CPU_MIN_WORK_PER_THREAD);
    if (nth > n)
        nth = (int)n;
    if (nth <= 1) {
        fn(ctx, 0, n);
        return;
    }
    struct range_job j = {.fn = fn, .ctx = ctx, .n = n};
    cpu_pool_run(be->pool, nth, range_task, &j);
}

/* ---- streams ---- */

static berth_status cpu_stream_create(berth_backend *be, berth_stream **out)
{
    berth_stream *s = calloc(1, sizeof *s);
    if (!s) {
        be->host->set_error(be->host->ctx, BERTH_E_NOMEM, "cpu: out of memory creating a stream");
        return BERTH_E_NOMEM;
    }
    s->be = be;
    *out = s;
    return BERTH_OK;
}

static void cpu_stream_destroy(berth_backend *be, berth_stream *s)
{
    free(s);
}

static berth_status cpu_stream_sync(berth_backend *be, berth_stream *s)
{
    return BERTH_OK; /* every op and transfer completed before it returned */
}

/* ---- buffers ---- */

static berth_status buf_fail(const berth_backend *be, berth_status code, const char *msg)
{
    be->host->set_error(be->host->ctx, code, msg);
    return code;
}

static berth_status cpu_buffer_alloc(berth_backend *be, uint64_t nbytes, int32_t usage, berth_buffer **out)
{
    berth_buffer *b = calloc(1, sizeof *b);
    const uint64_t rounded = (nbytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN;
    void *p = b && rounded >= nbytes && rounded <= SIZE_MAX ? aligned_alloc(CPU_ALIGN, rounded ? rounded : CPU_ALIGN)
                                                            : NULL;
    if (!p) {
        free(b);
        char msg[96];
        snprintf(msg, sizeof msg, "cpu: out of memory allocating a %" PRIu64 "-byte buffer", nbytes);
        return buf_fail(be, BERTH_E_NOMEM, msg);
    }
    b->ptr = p;
    b->size = nbytes;
    b->owned = 1;
    *out = b;
    return BERTH_OK;
}

static void cpu_buffer_free(berth_backend *be, berth_buffer *buf)
{
    if (!buf)
        return;
    if (buf->owned)
        free(buf->ptr);
    free(buf);
}

static berth_status cpu_buffer_wrap_host(berth_backend *be, void *ptr, uint64_t nbytes, int32_t read_only,
                                         berth_buffer **out)
{
    if (!ptr && nbytes)
        return buf_fail(be, BERTH_E_INVALID, "cpu: buffer_wrap_host: NULL pointer");
    berth_buffer *b = calloc(1, sizeof *b);
    if (!b)
        return buf_fail(be, BERTH_E_NOMEM, "cpu: out of memory wrapping host memory");
    b->ptr = ptr;
    b->size = nbytes;
    b->owned = 0;
    b->read_only = read_only != 0;
    *out = b;
    return BERTH_OK;
}

static berth_status cpu_buffer_host_ptr(berth_backend *be, berth_buffer *buf, void **out)
{
    if (!buf)
        return buf_fail(be, BERTH_E_INVALID, "cpu: buffer_host_ptr: NULL buffer");
    *out = buf->ptr;
    return BERTH_OK;
}

/* offset + n within size, without overflow. */
static bool in_range(const berth_buffer *b, uint64_t offset, uint64_t n)
{
    return offset <= b->size && n <= b->size - offset;
}

static berth_status range_fail(const berth_backend *be, const char *what, const berth_buffer *b, uint64_t offset,
                               uint64_t n)
{
    char msg[160];
    if (!b)
        snprintf(msg, sizeof msg, "cpu: %s: NULL buffer", what);
    else
        snprintf(msg, sizeof msg, "cpu: %s: bytes [%" PRIu64 ", +%" PRIu64 ") outside the %" PRIu64 "-byte buffer",
                 what, offset, n, b->size);
    return buf_fail(be, BERTH_E_INVALID, msg);
}

static berth_status cpu_buffer_upload(berth_backend *be, berth_stream *s, berth_buffer *dst, uint64_t offset,
                                      const void *src, uint64_t nbytes)
{
    if (!dst || !in_range(dst, offset, nbytes))
        return range_fail(be, "buffer_upload", dst, offset, nbytes);
    if (dst->read_only)
        return buf_fail(be, BERTH_E_INVALID, "cpu: buffer_upload: destination buffer is read-only");
    if (nbytes)
        memcpy((char *)dst->ptr + offset, src, nbytes);
    return BERTH_OK;
}

static berth_status cpu_buffer_download(berth_backend *be, berth_stream *s, const berth_buffer *src, uint64_t offset,
                                        void *dst, uint64_t nbytes)
{
    if (!src || !in_range(src, offset, nbytes))
        return range_fail(be, "buffer_download", src, offset, nbytes);
    if (nbytes)
        memcpy(dst, (const char *)src->ptr + offset, nbytes);
    return BERTH_OK;
}

static berth_status cpu_buffer_copy(berth_backend *be, berth_stream *s, berth_buffer *dst, uint64_t dst_offset,
                                    const berth_buffer *src, uint64_t src_offset, uint64_t nbytes)
{
    if (!dst || !in_range(dst, dst_offset, nbytes))
        return range_fail(be, "buffer_copy (destination)", dst, dst_offset, nbytes);
    if (!src || !in_range(src, src_offset, nbytes))
        return range_fail(be, "buffer_copy (source)", src, src_offset, nbytes);
    if (dst->read_only)
        return buf_fail(be, BERTH_E_INVALID, "cpu: buffer_copy: destination buffer is read-only");
    if (nbytes)
        memmove((char *)dst->ptr + dst_offset, (const char *)src->ptr + src_offset, nbytes);
    return BERTH_OK;
}

static berth_status cpu_buffer_fill(berth_backend *be, berth_stream *s, berth_buffer *dst, uint64_t offset,
                                    uint8_t byte, uint64_t nbytes)
{
    if (!dst || !in_range(dst, offset, nbytes))
        return range_fail(be, "buffer_fill", dst, offset, nbytes);
    if (dst->read_only)
        return buf_fail(be, BERTH_E_INVALID, "cpu: buffer_fill: destination buffer is read-only");
    if (nbytes)
        memset((char *)dst->ptr + offset, byte, nbytes);
    return BERTH_OK;
}

/* ---- ops ---- */

static const berth_ops cpu_ops = {
    .struct_size = BERTH_SIZE_TO(berth_ops, sample),
    .matmul = cpu_op_matmul,
    .get_rows = cpu_op_get_rows,
    .rms_norm = cpu_op_rms_norm,
    .layer_norm = cpu_op_layer_norm,
    .rope = cpu_op_rope,
    .unary = cpu_op_unary,
    .glu = cpu_op_glu,
    .binary = cpu_op_binary,
    .copy = cpu_op_copy,
    .kv_append = cpu_op_kv_append,
    .attention = cpu_op_attention,
    .conv1d_causal = cpu_op_conv1d_causal,
    .gated_delta = cpu_op_gated_delta,
    .gated_rms_norm = cpu_op_gated_rms_norm,
    .log_softmax_topk = cpu_op_log_softmax_topk,
    .sample = cpu_op_sample,
};

static const berth_ops *cpu_get_ops(berth_backend *be)
{
    return &cpu_ops;
}

static berth_status cpu_supports(berth_backend *be, int32_t op, const void *params)
{
    struct opck c = {.exec = 0, .be = &be->ck};
    bool ok;
    if (!params) {
        opck_fail(&c, BERTH_E_UNSUPPORTED, "supports: params is NULL (op %d)", op);
        return cpu_report_unsupported(be, &c);
    }
    switch (op) {
#define CPU_SUPPORTS_CASE(ID, name, ptype)                                                                      \
    case ID: ok = opck_##name(&c, (const ptype *)params); break;
        CPU_SUPPORTS_CASE(BERTH_OP_MATMUL, matmul, berth_matmul_params)
        CPU_SUPPORTS_CASE(BERTH_OP_GET_ROWS, get_rows, berth_get_rows_params)
        CPU_SUPPORTS_CASE(BERTH_OP_RMS_NORM, rms_norm, berth_rms_norm_params)
        CPU_SUPPORTS_CASE(BERTH_OP_LAYER_NORM, layer_norm, berth_layer_norm_params)
        CPU_SUPPORTS_CASE(BERTH_OP_ROPE, rope, berth_rope_params)
        CPU_SUPPORTS_CASE(BERTH_OP_UNARY, unary, berth_unary_params)
        CPU_SUPPORTS_CASE(BERTH_OP_GLU, glu, berth_glu_params)
        CPU_SUPPORTS_CASE(BERTH_OP_BINARY, binary, berth_binary_params)
        CPU_SUPPORTS_CASE(BERTH_OP_COPY, copy, berth_copy_params)
        CPU_SUPPORTS_CASE(BERTH_OP_KV_APPEND, kv_append, berth_kv_append_params)
        CPU_SUPPORTS_CASE(BERTH_OP_ATTENTION, attention, berth_attention_params)
        CPU_SUPPORTS_CASE(BERTH_OP_CONV1D_CAUSAL, conv1d_causal, berth_conv1d_causal_params)
        CPU_SUPPORTS_CASE(BERTH_OP_GATED_DELTA, gated_delta, berth_gated_delta_params)
        CPU_SUPPORTS_CASE(BERTH_OP_GATED_RMS_NORM, gated_rms_norm, berth_gated_rms_norm_params)
        CPU_SUPPORTS_CASE(BERTH_OP_LOG_SOFTMAX_TOPK, log_softmax_topk, berth_log_softmax_topk_params)
        CPU_SUPPORTS_CASE(BERTH_OP_SAMPLE, sample, berth_sample_params)
#undef CPU_SUPPORTS_CASE
    default:
        ok = opck_fail(&c, BERTH_E_UNSUPPORTED, "supports: unknown op %d", op);
        break;
    }
    return ok ? BERTH_OK : cpu_report_unsupported(be, &c);
}

/* ---- descriptor ---- */

static const berth_backend_vtable cpu_vtable = {
    .struct_size = BERTH_SIZE_TO(berth_backend_vtable, buffer_fill),
    .probe = cpu_probe,
    .device_info = cpu_device_info,
    .init = cpu_init,
    .destroy = cpu_destroy,
    .supports = cpu_supports,
    .get_ops = cpu_get_ops,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .stream_sync = cpu_stream_sync,
    .buffer_alloc = cpu_buffer_alloc,
    .buffer_free = cpu_buffer_free,
    .buffer_wrap_host = cpu_buffer_wrap_host,
    .buffer_host_ptr = cpu_buffer_host_ptr,
    .buffer_upload = cpu_buffer_upload,
    .buffer_download = cpu_buffer_download,
    .buffer_copy = cpu_buffer_copy,
    .buffer_fill = cpu_buffer_fill,
};

static const berth_plugin_desc cpu_desc = {
    .magic = BERTH_PLUGIN_MAGIC,
    .struct_size = BERTH_SIZE_TO(berth_plugin_desc, vtable),
    .abi_major = BERTH_ABI_MAJOR,
    .abi_minor = BERTH_ABI_MINOR,
    .kind = BERTH_PLUGIN_BACKEND,
    .name = "cpu",
    .version = "0.1.0",
    .description = "CPU backend: fp32 compute on f32/bf16/f16 weights, threaded, AVX-512/AVX2 kernels",
    .required_services = BERTH_SVC_LOG | BERTH_SVC_CONFIG,
    .vtable = &cpu_vtable,
};

BERTH_EXPORT const berth_plugin_desc *berth_plugin_entry(uint32_t host_abi_major, uint32_t host_abi_minor);
const berth_plugin_desc *berth_plugin_entry(uint32_t host_abi_major, uint32_t host_abi_minor)
{
    return host_abi_major == BERTH_ABI_MAJOR ? &cpu_desc : NULL;
}

/*
 * cuda_backend.cu — the CUDA backend plugin: device probe, device info, context, streams and buffers.
 *
 * What is here is real and complete for its scope: probing (cudaGetDeviceCount, tolerant of a missing driver or
 * GPU), device description (cudaGetDeviceProperties), a per-device context (current device + one cuBLAS handle),
 * streams (cudaStream_t) and buffers (cudaMalloc, pinned cudaMallocHost for staging) with ordered transfers.
 * What is NOT here yet is every compute op: get_ops() returns a table whose op pointers are all NULL and
 * supports() answers BERTH_E_UNSUPPORTED, so the registry never picks this backend for a model. The CUDA issue
 * fills in the ops (and then the dtype sets and BERTH_CAP_GRAPHS), matching what berth/backend.h fixes as of
 * ABI 0.2 so both backends agree: the sampling draw (Philox-4x32-10, increasing-id walk), the attention edge
 * cases, kv_append's norm modes (W_NONE = no norm, UNIT = weightless), K and V addressed with their own strides,
 * the gated_delta state layout, and absent optional tensors (buf NULL; ne[0] == 0 in supports()).
 *
 * Rules this file keeps (plugin.h): CUDA is initialised lazily — nothing in berth_plugin_entry or in static
 * constructors touches the runtime, so the .so loads on machines without a driver. Every CUDA/cuBLAS error
 * becomes a berth_status plus a one-line message through host->set_error; nothing aborts, throws or prints.
 * A sticky device error (illegal address, launch failure, ...) marks the backend lost: every later call fails
 * with BERTH_E_DEVICE_LOST. Only berth_plugin_entry is exported (meson builds with hidden visibility).
 */
#include <berth/backend.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The oldest compute capability the fatbinary can run (meson passes it with the matching -gencode flags). */
#ifndef CUDA_MIN_SM
#define CUDA_MIN_SM 90
#endif

// ---------------------------------------------------------------------------------------------------------------
// Objects. The backend keeps every buffer and stream it created on a list so destroy() can release them.

struct berth_buffer {
    struct berth_buffer *prev, *next;
    void *ptr;     /* device pointer, or pinned host pointer when pinned; NULL for a 0-byte buffer */
    uint64_t size;
    int32_t usage; /* BERTH_USAGE_* */
    int pinned;    /* allocated with cudaMallocHost (BERTH_USAGE_STAGING) */
};

struct berth_stream {
    struct berth_stream *prev, *next;
    cudaStream_t cs;
};

struct berth_backend {
    const berth_host *host;
    int device;
    cublasHandle_t cublas; /* one per device context; ops set its stream per call */
    int lost;              /* a sticky error happened; lost_reason says which */
    char lost_reason[256];
    struct berth_buffer *buffers;
    struct berth_stream *streams;
};

// ---------------------------------------------------------------------------------------------------------------
// Errors.

static berth_status cuda_fail(const berth_host *host, berth_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static berth_status cuda_fail(const berth_host *host, berth_status code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (host && host->set_error)
        host->set_error(host->ctx, code, msg);
    return code;
}

static void cuda_log(const berth_host *host, int32_t level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void cuda_log(const berth_host *host, int32_t level, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (host && host->log)
        host->log(host->ctx, level, msg);
}

/* Errors after which the CUDA context is unusable (the runtime reports them for every later call). */
static int cuda_error_is_sticky(cudaError_t e)
{
    switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
    case cudaErrorUnknown:
        return 1;
    default:
        return 0;
    }
}

static berth_status cuda_status_of(cudaError_t e)
{
    if (e == cudaErrorMemoryAllocation)
        return BERTH_E_DEVICE_OOM;
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver)
        return BERTH_E_NO_DEVICE;
    if (cuda_error_is_sticky(e))
        return BERTH_E_DEVICE_LOST;
    return BERTH_E_BACKEND;
}

/* Turn a failed CUDA call on backend be into a status + message ("what" names the call and its arguments). */
static berth_status cuda_check(berth_backend *be, cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return BERTH_OK;
    berth_status st = cuda_status_of(e);
    if (st == BERTH_E_DEVICE_LOST && !be->lost) {
        be->lost = 1;
        snprintf(be->lost_reason, sizeof be->lost_reason, "%s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
    }
    (void)cudaGetLastError(); /* clear a non-sticky error so it does not resurface in an unrelated call */
    return cuda_fail(be->host, st, "cuda device %d: %s: %s: %s", be->device, what, cudaGetErrorName(e),
                     cudaGetErrorString(e));
}

static berth_status cublas_check(berth_backend *be, cublasStatus_t s, const char *what)
{
    if (s == CUBLAS_STATUS_SUCCESS)
        return BERTH_OK;
    berth_status st = s == CUBLAS_STATUS_ALLOC_FAILED ? BERTH_E_DEVICE_OOM : BERTH_E_BACKEND;
    return cuda_fail(be->host, st, "cuda device %d: %s: %s: %s", be->device, what, cublasGetStatusName(s),
                     cublasGetStatusString(s));
}

/* Every entry point that touches the device starts here: refuse a lost device, make ours current (a host
 * thread may drive several devices). */
static berth_status cuda_enter(berth_backend *be)
{
    if (be->lost)
        return cuda_fail(be->host, BERTH_E_DEVICE_LOST, "cuda device %d: device lost after an earlier error (%s)",
                         be->device, be->lost_reason);
    return cuda_check(be, cudaSetDevice(be->device), "cudaSetDevice");
}

/* Copy a filled out-struct into the caller's, writing only the bytes the caller's struct_size covers. */
static void cuda_copy_out(void *out, const void *full, size_t full_size, uint32_t caller_size)
{
    size_t n = caller_size < full_size ? caller_size : full_size;
    memcpy((char *)out + sizeof(uint32_t), (const char *)full + sizeof(uint32_t), n - sizeof(uint32_t));
}

// ---------------------------------------------------------------------------------------------------------------
// Probe and device info. No context is created here: listing plugins must stay cheap on an 8-GPU machine.

/* Device count, treating "no GPU" and "no (new enough) driver" as 0 devices. why gets the reason when 0. */
static berth_status cuda_device_count(const berth_host *host, int *count, char *why, size_t why_size)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) {
        (void)cudaGetLastError();
        *count = 0;
        snprintf(why, why_size, "0 CUDA devices: %s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
        return BERTH_OK;
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *count = 0;
        snprintf(why, why_size, "0 CUDA devices: %s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
        return cuda_fail(host, BERTH_E_BACKEND, "cuda: cudaGetDeviceCount: %s: %s", cudaGetErrorName(e),
                         cudaGetErrorString(e));
    }
    *count = n;
    if (n == 0)
        snprintf(why, why_size, "0 CUDA devices: cudaGetDeviceCount returned 0");
    return BERTH_OK;
}

static berth_status cuda_probe(const berth_host *host, berth_probe_info *out)
{
    if (!out || out->struct_size < BERTH_SIZE_TO(berth_probe_info, n_devices))
        return cuda_fail(host, BERTH_E_ABI, "cuda: probe: out is NULL or its struct_size is too small");
    berth_probe_info info;
    memset(&info, 0, sizeof info);
    int n = 0;
    berth_status st = cuda_device_count(host, &n, info.message, sizeof info.message);
    info.n_devices = n;
    if (st == BERTH_OK && n > 0) {
        int rt = 0, drv = 0;
        (void)cudaRuntimeGetVersion(&rt);
        (void)cudaDriverGetVersion(&drv);
        snprintf(info.message, sizeof info.message, "%d CUDA device%s (runtime %d.%d, driver %d.%d)", n,
                 n == 1 ? "" : "s", rt / 1000, rt % 1000 / 10, drv / 1000, drv % 1000 / 10);
    }
    cuda_copy_out(out, &info, sizeof info, out->struct_size);
    return st;
}

static berth_status cuda_device_info(const berth_host *host, int32_t idx, berth_device_info *out)
{
    if (!out || out->struct_size < BERTH_SIZE_TO(berth_device_info, index))
        return cuda_fail(host, BERTH_E_ABI, "cuda: device_info: out is NULL or its struct_size is too small");
    int n = 0;
    char why[256];
    berth_status st = cuda_device_count(host, &n, why, sizeof why);
    if (st != BERTH_OK)
        return st;
    if (idx < 0 || idx >= n)
        return cuda_fail(host, BERTH_E_NOT_FOUND, "cuda: device_info: device %d does not exist (%d CUDA device%s)",
                         idx, n, n == 1 ? "" : "s");
    cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, idx);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return cuda_fail(host, cuda_status_of(e), "cuda: cudaGetDeviceProperties(%d): %s: %s", idx,
                         cudaGetErrorName(e), cudaGetErrorString(e));
    }
    berth_device_info info;
    memset(&info, 0, sizeof info);
    info.index = idx;
    snprintf(info.name, sizeof info.name, "%.100s (sm_%d%d)", prop.name, prop.major, prop.minor);
    info.total_memory = prop.totalGlobalMem;
    /* Reading free memory needs a context (cudaMemGetInfo); creating one per device just to list them costs
     * hundreds of MiB each, so report the total here and let init log the real figure. */
    info.free_memory = prop.totalGlobalMem;
    info.caps = BERTH_CAP_ASYNC;
    info.weight_dtypes = BERTH_DTYPE_BIT(BERTH_DTYPE_F32) | BERTH_DTYPE_BIT(BERTH_DTYPE_BF16) |
                         BERTH_DTYPE_BIT(BERTH_DTYPE_F16);
    info.act_dtypes = BERTH_DTYPE_BIT(BERTH_DTYPE_F32);
    info.kv_dtypes = BERTH_DTYPE_BIT(BERTH_DTYPE_F32);
    info.compute_units = prop.multiProcessorCount;
    cuda_copy_out(out, &info, sizeof info, out->struct_size);
    return BERTH_OK;
}

// ---------------------------------------------------------------------------------------------------------------
// Context.

static void cuda_destroy(berth_backend *be);

static berth_status cuda_init(const berth_host *host, int32_t idx, berth_backend **out)
{
    if (!out)
        return cuda_fail(host, BERTH_E_INVALID, "cuda: init: out is NULL");
    int n = 0;
    char why[256];
    berth_status st = cuda_device_count(host, &n, why, sizeof why);
    if (st != BERTH_OK)
        return st;
    if (n == 0)
        return cuda_fail(host, BERTH_E_NO_DEVICE, "cuda: init: %s", why);
    if (idx < 0 || idx >= n)
        return cuda_fail(host, BERTH_E_NOT_FOUND, "cuda: init: device %d does not exist (%d CUDA device%s)", idx, n,
                         n == 1 ? "" : "s");
    cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, idx);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return cuda_fail(host, cuda_status_of(e), "cuda: cudaGetDeviceProperties(%d): %s: %s", idx,
                         cudaGetErrorName(e), cudaGetErrorString(e));
    }
    if (prop.major * 10 + prop.minor < CUDA_MIN_SM)
        return cuda_fail(host, BERTH_E_UNSUPPORTED, "cuda: device %d (%s) is sm_%d%d; this build needs sm_%d or newer",
                         idx, prop.name, prop.major, prop.minor, CUDA_MIN_SM);

    berth_backend *be = (berth_backend *)calloc(1, sizeof *be);
    if (!be)
        return cuda_fail(host, BERTH_E_NOMEM, "cuda: init: out of host memory");
    be->host = host;
    be->device = idx;
    st = cuda_check(be, cudaSetDevice(idx), "cudaSetDevice");
    if (st == BERTH_OK)
        st = cuda_check(be, cudaFree(0), "creating the context (cudaFree(0))");
    if (st == BERTH_OK)
        st = cublas_check(be, cublasCreate(&be->cublas), "cublasCreate");
    if (st != BERTH_OK) {
        cuda_destroy(be);
        return st;
    }
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess)
        (void)cudaGetLastError();
    cuda_log(host, BERTH_LOG_INFO, "cuda device %d: %s, sm_%d%d, %d SMs, %.1f of %.1f GiB free", idx, prop.name,
             prop.major, prop.minor, prop.multiProcessorCount, (double)free_b / (1u << 30),
             (double)total_b / (1u << 30));
    *out = be;
    return BERTH_OK;
}

static void cuda_destroy(berth_backend *be)
{
    if (!be)
        return;
    /* Best effort: a lost device still gets its host-side bookkeeping freed; runtime errors here are ignored
     * because destroy cannot report them. */
    (void)cudaSetDevice(be->device);
    while (be->streams) {
        struct berth_stream *s = be->streams;
        be->streams = s->next;
        (void)cudaStreamDestroy(s->cs);
        free(s);
    }
    while (be->buffers) {
        struct berth_buffer *b = be->buffers;
        be->buffers = b->next;
        if (b->pinned)
            (void)cudaFreeHost(b->ptr);
        else
            (void)cudaFree(b->ptr);
        free(b);
    }
    if (be->cublas)
        (void)cublasDestroy(be->cublas);
    (void)cudaGetLastError();
    free(be);
}

// ---------------------------------------------------------------------------------------------------------------
// Capabilities and ops. The CUDA issue replaces both: until then nothing is supported.

static berth_status cuda_supports(berth_backend *be, int32_t op, const void *params)
{
    (void)op;
    (void)params;
    return cuda_fail(be ? be->host : NULL, BERTH_E_UNSUPPORTED, "cuda backend: no ops implemented yet");
}

static const berth_ops cuda_ops = {
    .struct_size = BERTH_SIZE_TO(berth_ops, sample),
    .matmul = NULL,
    .get_rows = NULL,
    .rms_norm = NULL,
    .layer_norm = NULL,
    .rope = NULL,
    .unary = NULL,
    .glu = NULL,
    .binary = NULL,
    .copy = NULL,
    .kv_append = NULL,
    .attention = NULL,
    .conv1d_causal = NULL,
    .gated_delta = NULL,
    .gated_rms_norm = NULL,
    .log_softmax_topk = NULL,
    .sample = NULL,
};

static const berth_ops *cuda_get_ops(berth_backend *be)
{
    (void)be;
    return &cuda_ops;
}

// ---------------------------------------------------------------------------------------------------------------
// Streams.

static berth_status cuda_stream_create(berth_backend *be, berth_stream **out)
{
    if (!out)
        return cuda_fail(be->host, BERTH_E_INVALID, "cuda: stream_create: out is NULL");
    berth_status st = cuda_enter(be);
    if (st != BERTH_OK)
        return st;
    berth_stream *s = (berth_stream *)calloc(1, sizeof *s);
    if (!s)
        return cuda_fail(be->host, BERTH_E_NOMEM, "cuda: stream_create: out of host memory");
    st = cuda_check(be, cudaStreamCreateWithFlags(&s->cs, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    if (st != BERTH_OK) {
        free(s);
        return st;
    }
    s->next = be->streams;
    if (be->streams)
        be->streams->prev = s;
    be->streams = s;
    *out = s;
    return BERTH_OK;
}

static void cuda_stream_destroy(berth_backend *be, berth_stream *s)
{
    if (!s)
        return;
    (void)cudaSetDevice(be->device);
    (void)cudaStreamDestroy(s->cs); /* returns at once; the runtime frees it when its work is done */
    (void)cudaGetLastError();
    if (s->prev)
        s->prev->next = s->next;
    else
        be->streams = s->next;
    if (s->next)
        s->next->prev = s->prev;
    free(s);
}

static berth_status cuda_stream_sync(berth_backend *be, berth_stream *s)
{
    if (!s)
        return cuda_fail(be->host, BERTH_E_INVALID, "cuda: stream_sync: stream is NULL");
    berth_status st = cuda_enter(be);
    if (st != BERTH_OK)
        return st;
    return cuda_check(be, cudaStreamSynchronize(s->cs), "cudaStreamSynchronize");
}

// ---------------------------------------------------------------------------------------------------------------
// Buffers and transfers.

static berth_status cuda_buffer_alloc(berth_backend *be, uint64_t nbytes, int32_t usage, berth_buffer **out)
{
    if (!out)
        return cuda_fail(be->host, BERTH_E_INVALID, "cuda: buffer_alloc: out is NULL");
    if (usage < BERTH_USAGE_WEIGHTS || usage > BERTH_USAGE_STAGING)
        return cuda_fail(be->host, BERTH_E_INVALID, "cuda: buffer_alloc: unknown usage %d", usage);
    berth_status st = cuda_enter(be);
    if (st != BERTH_OK)
        return st;
    berth_buffer *b = (berth_buffer *)calloc(1, sizeof *b);
    if (!b)
        return cuda_fail(be->host, BERTH_E_NOMEM, "cuda: buffer_alloc: out of host memory");
    b->size = nbytes;
    b->usage = usage;
    b->pinned = usage == BERTH_USAGE_STAGING;
    if (nbytes > 0) {
        char what[96];
        snprintf(what, sizeof what, "%s(%llu bytes)", b->pinned ? "cudaMallocHost" : "cudaMalloc",
                 (unsigned long long)nbytes);
        st = cuda_check(be, b->pinned ? cudaMallocHost(&b->ptr, nbytes) : cudaMalloc(&b->ptr, nbytes), what);
        if (st != BERTH_OK) {
            free(b);
            return st;
        }
    }
    b->next = be->buffers;
    if (be->buffers)
        be->buffers->prev = b;
    be->buffers = b;
    *out = b;
    return BERTH_OK;
}

static void cuda_buffer_free(berth_backend *be, berth_buffer *b)
{
    if (!b)
        return;
    (void)cudaSetDevice(be->device);
    if (b->pinned)
        (void)cudaFreeHost(b->ptr);
    else
        (void)cudaFree(b->ptr); /* implicitly synchronises the device, so pending work on b finishes first */
    (void)cudaGetLastError();
    if (b->prev)
        b->prev->next = b->next;
    else
        be->buffers = b->next;
    if (b->next)
        b->next->prev = b->prev;
    free(b);
}

/* Common argument checks of the transfer calls: stream present, [offset, offset + nbytes) inside buf. */
static berth_status cuda_check_range(berth_backend *be, const char *call, const berth_stream *s,
                                     const berth_buffer *buf, uint64_t offset, uint64_t nbytes)
{
    if (!s)
        return cuda_fail(be->host, BERTH_E_INVALID, "cuda: %s: stream is NULL", call);
    if (!buf)
        return cuda_fail(be->host, BERTH_E_INVALID, "cuda: %s: buffer is NULL", call);
    if (offset > buf->size || nbytes > buf->size - offset)
        return cuda_fail(be->host, BERTH_E_INVALID,
                         "cuda: %s: range [%llu, %llu + %llu) is outside the buffer of %llu bytes", call,
                         (unsigned long long)offset, (unsigned long long)offset, (unsigned long long)nbytes,
                         (unsigned long long)buf->size);
    return BERTH_OK;
}

static berth_status cuda_buffer_upload(berth_backend *be, berth_stream *s, berth_buffer *dst, uint64_t offset,
                                       const void *src, uint64_t nbytes)
{
    berth_status st = cuda_check_range(be, "buffer_upload", s, dst, offset, nbytes);
    if (st != BERTH_OK)
        return st;
    if (nbytes == 0)
        return BERTH_OK;
    if (!src)
        return cuda_fail(be->host, BERTH_E_INVALID, "cuda: buffer_upload: src is NULL");
    if ((st = cuda_enter(be)) != BERTH_OK)
        return st;
    st = cuda_check(be, cudaMemcpyAsync((char *)dst->ptr + offset, src, nbytes, cudaMemcpyDefault, s->cs),
                    "cudaMemcpyAsync (upload)");
    if (st != BERTH_OK)
        return st;
    /* The contract: src is read before upload returns. From pageable memory the runtime stages the copy and
     * guarantees that; from pinned memory the DMA may still be reading it, so wait. */
    cudaPointerAttributes attr;
    if (cudaPointerGetAttributes(&attr, src) != cudaSuccess) {
        (void)cudaGetLastError();
        attr.type = cudaMemoryTypeHost; /* unknown: be safe */
    }
    if (attr.type == cudaMemoryTypeHost)
        st = cuda_check(be, cudaStreamSynchronize(s->cs), "cudaStreamSynchronize (upload from pinned memory)");
    return st;
}

static berth_status cuda_buffer_download(berth_backend *be, berth_stream *s, const berth_buffer *src,
                                         uint64_t offset, void *dst, uint64_t nbytes)
{
    berth_status st = cuda_check_range(be, "buffer_download", s, src, offset, nbytes);
    if (st != BERTH_OK)
        return st;
    if (nbytes == 0)
        return BERTH_OK;
    if (!dst)
        return cuda_fail(be->host, BERTH_E_INVALID, "cuda: buffer_download: dst is NULL");
    if ((st = cuda_enter(be)) != BERTH_OK)
        return st;
    return cuda_check(be, cudaMemcpyAsync(dst, (const char *)src->ptr + offset, nbytes, cudaMemcpyDefault, s->cs),
                      "cudaMemcpyAsync (download)");
}

static berth_status cuda_buffer_copy(berth_backend *be, berth_stream *s, berth_buffer *dst, uint64_t dst_offset,
                                     const berth_buffer *src, uint64_t src_offset, uint64_t nbytes)
{
    berth_status st = cuda_check_range(be, "buffer_copy (dst)", s, dst, dst_offset, nbytes);
    if (st == BERTH_OK)
        st = cuda_check_range(be, "buffer_copy (src)", s, src, src_offset, nbytes);
    if (st != BERTH_OK || nbytes == 0)
        return st;
    if ((st = cuda_enter(be)) != BERTH_OK)
        return st;
    return cuda_check(be,
                      cudaMemcpyAsync((char *)dst->ptr + dst_offset, (const char *)src->ptr + src_offset, nbytes,
                                      cudaMemcpyDefault, s->cs),
                      "cudaMemcpyAsync (copy)");
}

static berth_status cuda_buffer_fill(berth_backend *be, berth_stream *s, berth_buffer *dst, uint64_t offset,
                                     uint8_t byte, uint64_t nbytes)
{
    berth_status st = cuda_check_range(be, "buffer_fill", s, dst, offset, nbytes);
    if (st != BERTH_OK || nbytes == 0)
        return st;
    if ((st = cuda_enter(be)) != BERTH_OK)
        return st;
    if (dst->pinned) {
        /* Staging memory is host memory: keep stream order by waiting for earlier work, then fill on the CPU. */
        st = cuda_check(be, cudaStreamSynchronize(s->cs), "cudaStreamSynchronize (fill)");
        if (st == BERTH_OK)
            memset((char *)dst->ptr + offset, byte, nbytes);
        return st;
    }
    return cuda_check(be, cudaMemsetAsync((char *)dst->ptr + offset, byte, nbytes, s->cs), "cudaMemsetAsync");
}

// ---------------------------------------------------------------------------------------------------------------
// Descriptor.

static const berth_backend_vtable cuda_vtable = {
    .struct_size = BERTH_SIZE_TO(berth_backend_vtable, buffer_fill),
    .probe = cuda_probe,
    .device_info = cuda_device_info,
    .init = cuda_init,
    .destroy = cuda_destroy,
    .supports = cuda_supports,
    .get_ops = cuda_get_ops,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_sync = cuda_stream_sync,
    .buffer_alloc = cuda_buffer_alloc,
    .buffer_free = cuda_buffer_free,
    .buffer_wrap_host = NULL, /* no BERTH_CAP_WRAP_HOST: weights are uploaded */
    .buffer_host_ptr = NULL,  /* no BERTH_CAP_HOST_VISIBLE */
    .buffer_upload = cuda_buffer_upload,
    .buffer_download = cuda_buffer_download,
    .buffer_copy = cuda_buffer_copy,
    .buffer_fill = cuda_buffer_fill,
};

static const berth_plugin_desc cuda_desc = {
    .magic = BERTH_PLUGIN_MAGIC,
    .struct_size = BERTH_SIZE_TO(berth_plugin_desc, vtable),
    .abi_major = BERTH_ABI_MAJOR,
    .abi_minor = BERTH_ABI_MINOR,
    .kind = BERTH_PLUGIN_BACKEND,
    .name = "cuda",
    .version = "0.1.0",
    .description = "NVIDIA GPUs through the CUDA runtime and cuBLAS (device, buffers and streams; ops pending)",
    .required_services = BERTH_SVC_LOG,
    .vtable = &cuda_vtable,
};

/* The one exported symbol. Pure: no CUDA call here (CUDA is initialised by probe/init). The descriptor is
 * returned whatever the host's version, so the host can name both versions if they disagree. */
extern "C" BERTH_EXPORT const berth_plugin_desc *berth_plugin_entry(uint32_t host_abi_major,
                                                                    uint32_t host_abi_minor)
{
    (void)host_abi_major;
    (void)host_abi_minor;
    return &cuda_desc;
}

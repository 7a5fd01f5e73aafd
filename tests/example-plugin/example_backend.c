/*
 * example_backend.c — a small, complete berth backend built outside the berth tree.
 *
 * It drives one "device" made of host memory and implements two ops, UNARY and BINARY, for f32 tensors. Ops run
 * at once on the calling thread, so streams are just tokens and stream_sync has nothing to wait for. supports()
 * answers exactly what the ops accept (the host relies on that to choose backends), and every op checks its
 * arguments again, because bad input must never crash the host.
 *
 * It includes only the installed ABI headers (found through `pkg-config berth-plugin`) and exports only
 * berth_plugin_entry; everything the host offers arrives through struct berth_host.
 */
#include <berth/backend.h>

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// ---------------------------------------------------------------------------------------------------------------
// Objects.

struct berth_backend {
    const berth_host *host; /* valid until destroy */
};

struct berth_buffer {
    unsigned char *ptr; /* NULL for a 0-byte buffer */
    uint64_t size;
    int owned;     /* allocated by us (else wrapped caller memory) */
    int read_only; /* wrapped with read_only: ops and transfers must not write it */
};

struct berth_stream {
    int unused; /* ops run at once: a stream carries no state */
};

static berth_status ex_fail(const berth_host *host, berth_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static berth_status ex_fail(const berth_host *host, berth_status code, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (host && host->set_error)
        host->set_error(host->ctx, code, msg);
    return code;
}

// ---------------------------------------------------------------------------------------------------------------
// Probe, device info, life cycle.

static berth_status ex_probe(const berth_host *host, berth_probe_info *out)
{
    if (!out || out->struct_size < BERTH_SIZE_TO(berth_probe_info, n_devices))
        return ex_fail(host, BERTH_E_ABI, "example: probe: out is NULL or its struct_size is too small");
    out->n_devices = 1;
    if (BERTH_HAS(out, berth_probe_info, message))
        snprintf(out->message, sizeof out->message, "1 example device (host memory, ops run at once)");
    return BERTH_OK;
}

static berth_status ex_device_info(const berth_host *host, int32_t idx, berth_device_info *out)
{
    if (!out || out->struct_size < BERTH_SIZE_TO(berth_device_info, index))
        return ex_fail(host, BERTH_E_ABI, "example: device_info: out is NULL or its struct_size is too small");
    if (idx != 0)
        return ex_fail(host, BERTH_E_NOT_FOUND, "example: device %d does not exist (1 device)", idx);
    /* Fill a full struct, then copy only what the caller's struct_size covers. */
    berth_device_info d;
    memset(&d, 0, sizeof d);
    d.index = 0;
    snprintf(d.name, sizeof d.name, "example (host memory)");
    long page = sysconf(_SC_PAGESIZE), pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES);
    d.total_memory = page > 0 && pages > 0 ? (uint64_t)page * (uint64_t)pages : 0;
    d.free_memory = page > 0 && avail > 0 ? (uint64_t)page * (uint64_t)avail : 0;
    d.caps = BERTH_CAP_WRAP_HOST | BERTH_CAP_HOST_VISIBLE;
    d.weight_dtypes = BERTH_DTYPE_BIT(BERTH_DTYPE_F32);
    d.act_dtypes = BERTH_DTYPE_BIT(BERTH_DTYPE_F32);
    d.kv_dtypes = BERTH_DTYPE_BIT(BERTH_DTYPE_F32);
    d.compute_units = 1;
    uint32_t n = out->struct_size < sizeof d ? out->struct_size : (uint32_t)sizeof d;
    memcpy((char *)out + sizeof(uint32_t), (const char *)&d + sizeof(uint32_t), n - sizeof(uint32_t));
    return BERTH_OK;
}

static berth_status ex_init(const berth_host *host, int32_t idx, berth_backend **out)
{
    if (idx != 0)
        return ex_fail(host, BERTH_E_NOT_FOUND, "example: device %d does not exist (1 device)", idx);
    berth_backend *be = calloc(1, sizeof *be);
    if (!be)
        return ex_fail(host, BERTH_E_NOMEM, "example: init: out of memory");
    be->host = host;
    *out = be;
    return BERTH_OK;
}

static void ex_destroy(berth_backend *be)
{
    free(be);
}

// ---------------------------------------------------------------------------------------------------------------
// Tensor checks shared by supports() (shapes only) and the ops (shapes and memory).

/* f32, ne >= 1, nb[0] = 4, strides non-negative. what names the tensor in messages. */
static berth_status ex_check_shape(const berth_host *host, const char *op, const char *what, const berth_tensor *t)
{
    if (t->dtype != BERTH_DTYPE_F32)
        return ex_fail(host, BERTH_E_UNSUPPORTED, "example: %s: %s has dtype %d; only f32 (0) is supported", op,
                       what, t->dtype);
    for (int d = 0; d < 4; d++) {
        if (t->ne[d] < 1)
            return ex_fail(host, BERTH_E_INVALID, "example: %s: %s.ne[%d] = %lld is not positive", op, what, d,
                           (long long)t->ne[d]);
        if (t->nb[d] < 0)
            return ex_fail(host, BERTH_E_INVALID, "example: %s: %s.nb[%d] = %lld is negative", op, what, d,
                           (long long)t->nb[d]);
    }
    if (t->nb[0] != (int64_t)sizeof(float))
        return ex_fail(host, BERTH_E_UNSUPPORTED, "example: %s: %s.nb[0] = %lld; elements must be contiguous", op,
                       what, (long long)t->nb[0]);
    return BERTH_OK;
}

/* The tensor's last byte lies inside its buffer (and the buffer is writable if we write it). */
static berth_status ex_check_memory(const berth_host *host, const char *op, const char *what, const berth_tensor *t,
                                    int writes)
{
    if (!t->buf)
        return ex_fail(host, BERTH_E_INVALID, "example: %s: %s has no buffer", op, what);
    if (writes && t->buf->read_only)
        return ex_fail(host, BERTH_E_INVALID, "example: %s: %s is in a read-only buffer", op, what);
    /* Bound each term so the sum cannot overflow: a tensor extent beyond 2^62 bytes is rejected anyway. */
    uint64_t end = t->offset, lim = 1ull << 62;
    for (int d = 0; d < 4; d++) {
        uint64_t span = (uint64_t)(t->ne[d] - 1), stride = (uint64_t)t->nb[d];
        if (stride && span > lim / stride)
            return ex_fail(host, BERTH_E_INVALID, "example: %s: %s is too large", op, what);
        end += span * stride;
        if (end > lim)
            return ex_fail(host, BERTH_E_INVALID, "example: %s: %s is too large", op, what);
    }
    end += sizeof(float);
    if (end > t->buf->size)
        return ex_fail(host, BERTH_E_INVALID, "example: %s: %s ends at byte %llu of a %llu-byte buffer", op, what,
                       (unsigned long long)end, (unsigned long long)t->buf->size);
    return BERTH_OK;
}

static float *ex_at(const berth_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3)
{
    return (float *)(t->buf->ptr + t->offset + i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3]);
}

static int ex_same_ne(const berth_tensor *a, const berth_tensor *b)
{
    return a->ne[0] == b->ne[0] && a->ne[1] == b->ne[1] && a->ne[2] == b->ne[2] && a->ne[3] == b->ne[3];
}

// ---------------------------------------------------------------------------------------------------------------
// UNARY: y = out_scale * f(in_scale * x).

static float ex_act(int32_t act, float x)
{
    switch (act) {
    case BERTH_ACT_GELU_TANH:
        return 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)));
    case BERTH_ACT_GELU_ERF:
        return 0.5f * x * (1.0f + erff(x * 0.70710678118f));
    case BERTH_ACT_SILU:
        return x / (1.0f + expf(-x));
    case BERTH_ACT_RELU:
        return x > 0.0f ? x : 0.0f;
    case BERTH_ACT_SIGMOID:
        return 1.0f / (1.0f + expf(-x));
    case BERTH_ACT_TANH:
        return tanhf(x);
    case BERTH_ACT_SOFTPLUS: /* max(x, 0) + log1p(e^-|x|): neither overflows nor cancels */
        return (x > 0.0f ? x : 0.0f) + log1pf(expf(-fabsf(x)));
    case BERTH_ACT_EXP:
        return expf(x);
    default: /* BERTH_ACT_IDENTITY; others are refused before we get here */
        return x;
    }
}

static berth_status ex_unary_check(const berth_host *host, const berth_unary_params *p)
{
    if (!p || p->struct_size < BERTH_SIZE_TO(berth_unary_params, y))
        return ex_fail(host, BERTH_E_ABI, "example: unary: params missing or struct_size too small");
    if (p->act < BERTH_ACT_IDENTITY || p->act > BERTH_ACT_EXP)
        return ex_fail(host, BERTH_E_UNSUPPORTED, "example: unary: unknown activation %d", p->act);
    berth_status st = ex_check_shape(host, "unary", "x", &p->x);
    if (st == BERTH_OK)
        st = ex_check_shape(host, "unary", "y", &p->y);
    if (st == BERTH_OK && !ex_same_ne(&p->x, &p->y))
        st = ex_fail(host, BERTH_E_INVALID, "example: unary: x and y differ in shape");
    return st;
}

static berth_status ex_unary(berth_backend *be, berth_stream *s, const berth_unary_params *p)
{
    (void)s;
    berth_status st = ex_unary_check(be->host, p);
    if (st == BERTH_OK)
        st = ex_check_memory(be->host, "unary", "x", &p->x, 0);
    if (st == BERTH_OK)
        st = ex_check_memory(be->host, "unary", "y", &p->y, 1);
    if (st != BERTH_OK)
        return st;
    /* Element by element, so y may alias x. */
    for (int64_t i3 = 0; i3 < p->x.ne[3]; i3++)
        for (int64_t i2 = 0; i2 < p->x.ne[2]; i2++)
            for (int64_t i1 = 0; i1 < p->x.ne[1]; i1++)
                for (int64_t i0 = 0; i0 < p->x.ne[0]; i0++)
                    *ex_at(&p->y, i0, i1, i2, i3) =
                        p->out_scale * ex_act(p->act, p->in_scale * *ex_at(&p->x, i0, i1, i2, i3));
    return BERTH_OK;
}

// ---------------------------------------------------------------------------------------------------------------
// BINARY: y = a + scale * b, or y = a * b * scale, with b broadcast over dims where it has ne = 1.

static berth_status ex_binary_check(const berth_host *host, const berth_binary_params *p)
{
    if (!p || p->struct_size < BERTH_SIZE_TO(berth_binary_params, y))
        return ex_fail(host, BERTH_E_ABI, "example: binary: params missing or struct_size too small");
    if (p->op != BERTH_BINARY_ADD && p->op != BERTH_BINARY_MUL)
        return ex_fail(host, BERTH_E_UNSUPPORTED, "example: binary: unknown op %d", p->op);
    berth_status st = ex_check_shape(host, "binary", "a", &p->a);
    if (st == BERTH_OK)
        st = ex_check_shape(host, "binary", "b", &p->b);
    if (st == BERTH_OK)
        st = ex_check_shape(host, "binary", "y", &p->y);
    if (st != BERTH_OK)
        return st;
    if (!ex_same_ne(&p->a, &p->y))
        return ex_fail(host, BERTH_E_INVALID, "example: binary: a and y differ in shape");
    for (int d = 0; d < 4; d++)
        if (p->b.ne[d] != 1 && p->b.ne[d] != p->a.ne[d])
            return ex_fail(host, BERTH_E_INVALID, "example: binary: b.ne[%d] = %lld cannot broadcast to %lld", d,
                           (long long)p->b.ne[d], (long long)p->a.ne[d]);
    return BERTH_OK;
}

static berth_status ex_binary(berth_backend *be, berth_stream *s, const berth_binary_params *p)
{
    (void)s;
    berth_status st = ex_binary_check(be->host, p);
    if (st == BERTH_OK)
        st = ex_check_memory(be->host, "binary", "a", &p->a, 0);
    if (st == BERTH_OK)
        st = ex_check_memory(be->host, "binary", "b", &p->b, 0);
    if (st == BERTH_OK)
        st = ex_check_memory(be->host, "binary", "y", &p->y, 1);
    if (st != BERTH_OK)
        return st;
    const int64_t *bne = p->b.ne;
    for (int64_t i3 = 0; i3 < p->a.ne[3]; i3++)
        for (int64_t i2 = 0; i2 < p->a.ne[2]; i2++)
            for (int64_t i1 = 0; i1 < p->a.ne[1]; i1++)
                for (int64_t i0 = 0; i0 < p->a.ne[0]; i0++) {
                    float a = *ex_at(&p->a, i0, i1, i2, i3);
                    float b = *ex_at(&p->b, bne[0] == 1 ? 0 : i0, bne[1] == 1 ? 0 : i1, bne[2] == 1 ? 0 : i2,
                                     bne[3] == 1 ? 0 : i3);
                    *ex_at(&p->y, i0, i1, i2, i3) = p->op == BERTH_BINARY_ADD ? a + p->scale * b : a * b * p->scale;
                }
    return BERTH_OK;
}

// ---------------------------------------------------------------------------------------------------------------
// Capabilities: the same checks the ops run, minus memory. Everything else is honestly refused.

static const char *const ex_op_names[BERTH_OP_COUNT] = {
    "matmul", "get_rows", "rms_norm", "layer_norm", "rope", "unary", "glu", "binary",
    "copy", "kv_append", "attention", "conv1d_causal", "gated_delta", "gated_rms_norm", "log_softmax_topk", "sample",
};

static berth_status ex_supports(berth_backend *be, int32_t op, const void *params)
{
    switch (op) {
    case BERTH_OP_UNARY:
        return ex_unary_check(be->host, params);
    case BERTH_OP_BINARY:
        return ex_binary_check(be->host, params);
    default:
        if (op >= 0 && op < BERTH_OP_COUNT)
            return ex_fail(be->host, BERTH_E_UNSUPPORTED, "example: op %s is not implemented", ex_op_names[op]);
        return ex_fail(be->host, BERTH_E_UNSUPPORTED, "example: unknown op %d", op);
    }
}

static const berth_ops ex_ops = {
    .struct_size = BERTH_SIZE_TO(berth_ops, sample),
    .unary = ex_unary,
    .binary = ex_binary,
};

static const berth_ops *ex_get_ops(berth_backend *be)
{
    (void)be;
    return &ex_ops;
}

// ---------------------------------------------------------------------------------------------------------------
// Streams: ops and transfers complete before they return, so there is nothing to queue or wait for.

static berth_status ex_stream_create(berth_backend *be, berth_stream **out)
{
    berth_stream *s = calloc(1, sizeof *s);
    if (!s)
        return ex_fail(be->host, BERTH_E_NOMEM, "example: stream_create: out of memory");
    *out = s;
    return BERTH_OK;
}

static void ex_stream_destroy(berth_backend *be, berth_stream *s)
{
    (void)be;
    free(s);
}

static berth_status ex_stream_sync(berth_backend *be, berth_stream *s)
{
    (void)be;
    (void)s;
    return BERTH_OK;
}

// ---------------------------------------------------------------------------------------------------------------
// Buffers: plain host memory.

static berth_status ex_buffer_alloc(berth_backend *be, uint64_t nbytes, int32_t usage, berth_buffer **out)
{
    (void)usage;
    berth_buffer *b = calloc(1, sizeof *b);
    if (!b)
        return ex_fail(be->host, BERTH_E_NOMEM, "example: buffer_alloc: out of memory");
    if (nbytes > 0) {
        /* 64-byte alignment for vector loads; aligned_alloc wants a multiple of the alignment. */
        if (nbytes > UINT64_MAX - 63 || (b->ptr = aligned_alloc(64, (size_t)((nbytes + 63) & ~63ull))) == NULL) {
            free(b);
            return ex_fail(be->host, BERTH_E_NOMEM, "example: buffer_alloc: cannot allocate %llu bytes",
                           (unsigned long long)nbytes);
        }
    }
    b->size = nbytes;
    b->owned = 1;
    *out = b;
    return BERTH_OK;
}

static void ex_buffer_free(berth_backend *be, berth_buffer *b)
{
    (void)be;
    if (!b)
        return;
    if (b->owned)
        free(b->ptr);
    free(b);
}

static berth_status ex_buffer_wrap_host(berth_backend *be, void *ptr, uint64_t nbytes, int32_t read_only,
                                        berth_buffer **out)
{
    if (!ptr && nbytes > 0)
        return ex_fail(be->host, BERTH_E_INVALID, "example: buffer_wrap_host: ptr is NULL");
    berth_buffer *b = calloc(1, sizeof *b);
    if (!b)
        return ex_fail(be->host, BERTH_E_NOMEM, "example: buffer_wrap_host: out of memory");
    b->ptr = ptr;
    b->size = nbytes;
    b->read_only = read_only != 0;
    *out = b;
    return BERTH_OK;
}

static berth_status ex_buffer_host_ptr(berth_backend *be, berth_buffer *b, void **out)
{
    if (!b)
        return ex_fail(be->host, BERTH_E_INVALID, "example: buffer_host_ptr: buffer is NULL");
    *out = b->ptr;
    return BERTH_OK;
}

static berth_status ex_range(berth_backend *be, const char *call, const berth_buffer *b, uint64_t offset,
                             uint64_t nbytes, int writes)
{
    if (!b)
        return ex_fail(be->host, BERTH_E_INVALID, "example: %s: buffer is NULL", call);
    if (offset > b->size || nbytes > b->size - offset)
        return ex_fail(be->host, BERTH_E_INVALID, "example: %s: %llu bytes at offset %llu exceed the %llu-byte buffer",
                       call, (unsigned long long)nbytes, (unsigned long long)offset, (unsigned long long)b->size);
    if (writes && b->read_only && nbytes > 0)
        return ex_fail(be->host, BERTH_E_INVALID, "example: %s: buffer is read-only", call);
    return BERTH_OK;
}

static berth_status ex_buffer_upload(berth_backend *be, berth_stream *s, berth_buffer *dst, uint64_t offset,
                                     const void *src, uint64_t nbytes)
{
    (void)s;
    berth_status st = ex_range(be, "buffer_upload", dst, offset, nbytes, 1);
    if (st == BERTH_OK && nbytes > 0 && !src)
        st = ex_fail(be->host, BERTH_E_INVALID, "example: buffer_upload: src is NULL");
    if (st == BERTH_OK && nbytes > 0)
        memcpy(dst->ptr + offset, src, (size_t)nbytes);
    return st;
}

static berth_status ex_buffer_download(berth_backend *be, berth_stream *s, const berth_buffer *src, uint64_t offset,
                                       void *dst, uint64_t nbytes)
{
    (void)s;
    berth_status st = ex_range(be, "buffer_download", src, offset, nbytes, 0);
    if (st == BERTH_OK && nbytes > 0 && !dst)
        st = ex_fail(be->host, BERTH_E_INVALID, "example: buffer_download: dst is NULL");
    if (st == BERTH_OK && nbytes > 0)
        memcpy(dst, src->ptr + offset, (size_t)nbytes);
    return st;
}

static berth_status ex_buffer_copy(berth_backend *be, berth_stream *s, berth_buffer *dst, uint64_t dst_offset,
                                   const berth_buffer *src, uint64_t src_offset, uint64_t nbytes)
{
    (void)s;
    berth_status st = ex_range(be, "buffer_copy", dst, dst_offset, nbytes, 1);
    if (st == BERTH_OK)
        st = ex_range(be, "buffer_copy", src, src_offset, nbytes, 0);
    if (st == BERTH_OK && nbytes > 0)
        memmove(dst->ptr + dst_offset, src->ptr + src_offset, (size_t)nbytes); /* ranges may overlap */
    return st;
}

static berth_status ex_buffer_fill(berth_backend *be, berth_stream *s, berth_buffer *dst, uint64_t offset,
                                   uint8_t byte, uint64_t nbytes)
{
    (void)s;
    berth_status st = ex_range(be, "buffer_fill", dst, offset, nbytes, 1);
    if (st == BERTH_OK && nbytes > 0)
        memset(dst->ptr + offset, byte, (size_t)nbytes);
    return st;
}

// ---------------------------------------------------------------------------------------------------------------
// Descriptor.

static const berth_backend_vtable ex_vtable = {
    .struct_size = BERTH_SIZE_TO(berth_backend_vtable, buffer_fill),
    .probe = ex_probe,
    .device_info = ex_device_info,
    .init = ex_init,
    .destroy = ex_destroy,
    .supports = ex_supports,
    .get_ops = ex_get_ops,
    .stream_create = ex_stream_create,
    .stream_destroy = ex_stream_destroy,
    .stream_sync = ex_stream_sync,
    .buffer_alloc = ex_buffer_alloc,
    .buffer_free = ex_buffer_free,
    .buffer_wrap_host = ex_buffer_wrap_host,
    .buffer_host_ptr = ex_buffer_host_ptr,
    .buffer_upload = ex_buffer_upload,
    .buffer_download = ex_buffer_download,
    .buffer_copy = ex_buffer_copy,
    .buffer_fill = ex_buffer_fill,
};

static const berth_plugin_desc ex_desc = {
    .magic = BERTH_PLUGIN_MAGIC,
    .struct_size = BERTH_SIZE_TO(berth_plugin_desc, vtable),
    .abi_major = BERTH_ABI_MAJOR,
    .abi_minor = BERTH_ABI_MINOR,
    .kind = BERTH_PLUGIN_BACKEND,
    .name = "example",
    .version = "0.1.0",
    .description = "out-of-tree example: host memory, f32 unary and binary ops",
    .required_services = BERTH_SVC_LOG,
    .vtable = &ex_vtable,
};

BERTH_EXPORT const berth_plugin_desc *berth_plugin_entry(uint32_t host_abi_major, uint32_t host_abi_minor)
{
    (void)host_abi_major;
    (void)host_abi_minor;
    return &ex_desc;
}

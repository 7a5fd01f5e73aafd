/* gemma4_util.c — error/log formatting and tensor views for the Gemma 4 plugin. */
#include "gemma4_util.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

berth_status g4_fail(const berth_host *host, berth_status code, const char *fmt, ...)
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

void g4_log(const berth_host *host, int32_t level, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    if (!host || !host->log)
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    host->log(host->ctx, level, msg);
}

uint32_t g4_dtype_size(berth_dtype dtype)
{
    switch (dtype) {
    case BERTH_DTYPE_F32: return 4;
    case BERTH_DTYPE_F16: return 2;
    case BERTH_DTYPE_BF16: return 2;
    case BERTH_DTYPE_I32: return 4;
    case BERTH_DTYPE_I64: return 8;
    case BERTH_DTYPE_U8: return 1;
    default: return 0;
    }
}

const char *g4_dtype_name(berth_dtype dtype)
{
    switch (dtype) {
    case BERTH_DTYPE_F32: return "f32";
    case BERTH_DTYPE_F16: return "f16";
    case BERTH_DTYPE_BF16: return "bf16";
    case BERTH_DTYPE_I32: return "i32";
    case BERTH_DTYPE_I64: return "i64";
    case BERTH_DTYPE_U8: return "u8";
    default: return "unknown dtype";
    }
}

void g4_pack_strides(berth_tensor *t)
{
    t->nb[0] = g4_dtype_size(t->dtype);
    for (int i = 1; i < 4; i++)
        t->nb[i] = t->nb[i - 1] * t->ne[i - 1];
}

berth_tensor g4_view(berth_buffer *buf, uint64_t off, berth_dtype dtype, int64_t ne0, int64_t ne1, int64_t ne2)
{
    berth_tensor t;
    memset(&t, 0, sizeof t);
    t.buf = buf;
    t.offset = off;
    t.dtype = dtype;
    t.ne[0] = ne0;
    t.ne[1] = ne1;
    t.ne[2] = ne2;
    t.ne[3] = 1;
    t.ndim = ne2 > 1 ? 3 : ne1 > 1 ? 2 : 1;
    g4_pack_strides(&t);
    return t;
}

berth_tensor g4_f32(berth_buffer *buf, uint64_t off, int64_t ne0, int64_t ne1, int64_t ne2)
{
    return g4_view(buf, off, BERTH_DTYPE_F32, ne0, ne1, ne2);
}

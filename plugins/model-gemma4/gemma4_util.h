/*
 * gemma4_util.h — small helpers shared by the Gemma 4 plugin's files: error/log lines through the host table and
 * berth_tensor views over backend buffers.
 */
#ifndef BERTH_GEMMA4_UTIL_H
#define BERTH_GEMMA4_UTIL_H

#include <berth/backend.h>
#include <berth/plugin.h>

/* Format a one-line message, hand it to host->set_error and return code (so callers `return g4_fail(...)`). */
berth_status g4_fail(const berth_host *host, berth_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Log one formatted line at level (BERTH_LOG_*). */
void g4_log(const berth_host *host, int32_t level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Packed view of dtype elements in buf at byte offset off with ne {ne0, ne1, ne2} (pass 1 for unused dims). */
berth_tensor g4_view(berth_buffer *buf, uint64_t off, berth_dtype dtype, int64_t ne0, int64_t ne1, int64_t ne2);
/* Packed f32 view; the common case for activations. */
berth_tensor g4_f32(berth_buffer *buf, uint64_t off, int64_t ne0, int64_t ne1, int64_t ne2);
/* Bytes of one element of dtype (0 for an unknown dtype). */
uint32_t g4_dtype_size(berth_dtype dtype);
/* "f32", "bf16", ... for messages. */
const char *g4_dtype_name(berth_dtype dtype);
/* Recompute t->nb as packed strides from t->ne and t->dtype. */
void g4_pack_strides(berth_tensor *t);

#endif

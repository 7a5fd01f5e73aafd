/*
 * op_check.c — the generic helpers of op_check.h: failure recording, dtype names and sizes, tensor and KV-view
 * validation (in exec mode through the backend's buffer_facts), RoPE pair layout. Moved from the CPU backend,
 * messages unchanged.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "op_check.h"

bool opck_fail(struct opck *c, berth_status code, const char *fmt, ...)
{
    if (c->code == BERTH_OK) {
        c->code = code;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->msg, sizeof c->msg, fmt, ap);
        va_end(ap);
    }
    return false;
}

bool opck_prefix(struct opck *c, const char *prefix)
{
    char msg[sizeof c->msg];
    snprintf(msg, sizeof msg, "%s%s", prefix, c->msg);
    memcpy(c->msg, msg, sizeof msg);
    return false;
}

const char *opck_dtype_name(berth_dtype t)
{
    static const char *const names[BERTH_DTYPE_COUNT] = {"f32", "f16", "bf16", "i32", "i64", "u8"};
    return t >= 0 && t < BERTH_DTYPE_COUNT ? names[t] : "unknown";
}

size_t opck_dtype_size(berth_dtype t)
{
    static const size_t sizes[BERTH_DTYPE_COUNT] = {4, 2, 2, 4, 8, 1};
    return t >= 0 && t < BERTH_DTYPE_COUNT ? sizes[t] : 0;
}

/* "f32, bf16, f16" for a dtype set, in BERTH_DTYPE order. */
static void dtype_list(uint32_t dtypes, char *out, size_t cap)
{
    size_t len = 0;
    out[0] = '\0';
    for (berth_dtype t = 0; t < BERTH_DTYPE_COUNT; t++)
        if (dtypes & BERTH_DTYPE_BIT(t))
            len += (size_t)snprintf(out + len, len < cap ? cap - len : 0, "%s%s", len ? ", " : "", opck_dtype_name(t));
}

bool opck_present(const struct opck *c, const berth_tensor *t)
{
    if (c->exec)
        return t->buf != NULL;
    return t->ne[0] != 0;
}

bool opck_struct_size(struct opck *c, const char *op, uint32_t have, size_t need)
{
    if (have < need)
        return opck_fail(c, BERTH_E_ABI, "%s: params struct_size %" PRIu32 " is smaller than ABI %d.%d's %zu", op, have,
                         BERTH_ABI_MAJOR, BERTH_ABI_MINOR, need);
    return true;
}

/* [lo, hi) byte range a view touches relative to its offset; false on overflow. */
static bool view_extent(const berth_tensor *t, size_t es, int64_t *lo, int64_t *hi)
{
    int64_t l = 0, h = (int64_t)es;
    for (int i = 0; i < 4; i++) {
        int64_t span;
        if (t->ne[i] == 0) {
            *lo = *hi = 0;
            return true;
        }
        if (__builtin_mul_overflow(t->ne[i] - 1, t->nb[i], &span))
            return false;
        if (span < 0 ? __builtin_add_overflow(l, span, &l) : __builtin_add_overflow(h, span, &h))
            return false;
    }
    *lo = l;
    *hi = h;
    return true;
}

bool opck_same_view(const berth_tensor *a, const berth_tensor *b)
{
    if (a->buf != b->buf || a->offset != b->offset || a->dtype != b->dtype)
        return false;
    for (int i = 0; i < 4; i++)
        if (a->ne[i] != b->ne[i] || a->nb[i] != b->nb[i])
            return false;
    return true;
}

bool opck_views_overlap(const berth_tensor *a, const berth_tensor *b)
{
    if (!a->buf || a->buf != b->buf)
        return false;
    int64_t alo, ahi, blo, bhi;
    if (!view_extent(a, opck_dtype_size(a->dtype), &alo, &ahi) ||
        !view_extent(b, opck_dtype_size(b->dtype), &blo, &bhi))
        return true; /* a view past int64 is refused elsewhere; call it overlapping to be safe */
    if (alo == ahi || blo == bhi)
        return false;
    const int64_t a0 = (int64_t)a->offset + alo, a1 = (int64_t)a->offset + ahi;
    const int64_t b0 = (int64_t)b->offset + blo, b1 = (int64_t)b->offset + bhi;
    return a0 < b1 && b0 < a1;
}

bool opck_tensor(struct opck *c, const char *op, const char *name, const berth_tensor *t, uint32_t dtypes,
                 bool writes)
{
    if (t->dtype < 0 || t->dtype >= BERTH_DTYPE_COUNT || !(dtypes & BERTH_DTYPE_BIT(t->dtype))) {
        char list[64];
        dtype_list(dtypes, list, sizeof list);
        return opck_fail(c, BERTH_E_UNSUPPORTED, "%s: %s dtype %s is not supported (supported: %s)", op, name,
                         opck_dtype_name(t->dtype), list);
    }
    const size_t es = opck_dtype_size(t->dtype);
    int64_t count = 1;
    for (int i = 0; i < 4; i++) {
        if (t->ne[i] < 0)
            return opck_fail(c, BERTH_E_INVALID, "%s: %s ne[%d] = %" PRId64 " is negative", op, name, i, t->ne[i]);
        if (__builtin_mul_overflow(count, t->ne[i], &count) || count > ((int64_t)1 << 48))
            return opck_fail(c, BERTH_E_INVALID, "%s: %s has too many elements", op, name);
    }
    if (t->nb[0] != (int64_t)es)
        return opck_fail(c, BERTH_E_UNSUPPORTED, "%s: %s nb[0] = %" PRId64 " must be the element size %zu", op, name,
                         t->nb[0], es);
    if (!c->exec)
        return true;
    if (!t->buf)
        return opck_fail(c, BERTH_E_INVALID, "%s: %s has no buffer", op, name);
    uintptr_t addr;
    uint64_t size;
    int read_only;
    c->be->buffer_facts(t->buf, &addr, &size, &read_only);
    if (writes && read_only)
        return opck_fail(c, BERTH_E_INVALID, "%s: %s is in a read-only buffer", op, name);
    int64_t lo, hi;
    if (!view_extent(t, es, &lo, &hi) || (lo < 0 && (uint64_t)-lo > t->offset) || t->offset > size ||
        (hi > 0 && (uint64_t)hi > size - t->offset))
        return opck_fail(c, BERTH_E_INVALID, "%s: %s view (offset %" PRIu64 ") reaches outside its %" PRIu64
                         "-byte buffer", op, name, t->offset, size);
    int misaligned = (addr + (uintptr_t)t->offset) % es != 0;
    for (int i = 1; i < 4; i++)
        misaligned |= t->nb[i] % (int64_t)es != 0;
    if (misaligned)
        return opck_fail(c, BERTH_E_INVALID, "%s: %s address or strides are not multiples of its element size %zu", op,
                         name, es);
    return true;
}

bool opck_vector(struct opck *c, const char *op, const char *name, const berth_tensor *t, int64_t n)
{
    if ((n >= 0 && t->ne[0] != n) || t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1) {
        if (n >= 0)
            return opck_fail(c, BERTH_E_INVALID, "%s: %s must be ne {%" PRId64 "}, got {%" PRId64 ", %" PRId64
                             ", %" PRId64 ", %" PRId64 "}", op, name, n, t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
        return opck_fail(c, BERTH_E_INVALID, "%s: %s must be 1-D, got ne {%" PRId64 ", %" PRId64 ", %" PRId64
                         ", %" PRId64 "}", op, name, t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
    }
    return true;
}

bool opck_same_shape(struct opck *c, const char *op, const char *name, const berth_tensor *t, const char *ref_name,
                     const berth_tensor *ref)
{
    for (int i = 0; i < 4; i++)
        if (t->ne[i] != ref->ne[i])
            return opck_fail(c, BERTH_E_INVALID, "%s: %s ne[%d] = %" PRId64 " differs from %s ne[%d] = %" PRId64, op,
                             name, i, t->ne[i], ref_name, i, ref->ne[i]);
    return true;
}

/* Byte extent of one pool (K or V, with that side's strides) of a KV view; false on overflow. */
static bool kv_pool_end(const berth_kv_view *kv, uint64_t offset, uint64_t token_stride, uint64_t head_stride,
                        int32_t dim, uint64_t *end)
{
    uint64_t a, b, t;
    const size_t es = opck_dtype_size(kv->dtype);
    if (__builtin_mul_overflow((uint64_t)(kv->n_blocks - 1), kv->block_stride, &a) ||
        __builtin_mul_overflow((uint64_t)(kv->block_size - 1), token_stride, &b) ||
        __builtin_add_overflow(a, b, &a) ||
        __builtin_mul_overflow((uint64_t)(kv->n_kv_heads - 1), head_stride, &b) ||
        __builtin_add_overflow(a, b, &a) || __builtin_add_overflow(a, (uint64_t)dim * es, &t) ||
        __builtin_add_overflow(t, offset, end))
        return false;
    return true;
}

bool opck_kv_view(struct opck *c, const char *op, const berth_kv_view *kv)
{
    if (kv->dtype < 0 || kv->dtype >= BERTH_DTYPE_COUNT || !(c->be->kv_dtypes & BERTH_DTYPE_BIT(kv->dtype))) {
        char list[64];
        dtype_list(c->be->kv_dtypes, list, sizeof list);
        return opck_fail(c, BERTH_E_UNSUPPORTED, "%s: KV dtype %s is not supported (supported: %s)", op,
                         opck_dtype_name(kv->dtype), list);
    }
    if (kv->block_size < 1 || kv->n_blocks < 1 || kv->n_kv_heads < 1 || kv->head_dim < 1 || kv->head_dim_v < 1)
        return opck_fail(c, BERTH_E_INVALID,
                         "%s: KV view needs block_size, n_blocks, n_kv_heads, head_dim, head_dim_v >= 1 (got %d, %d, "
                         "%d, %d, %d)", op, kv->block_size, kv->n_blocks, kv->n_kv_heads, kv->head_dim,
                         kv->head_dim_v);
    if (!c->exec)
        return true;
    const size_t es = opck_dtype_size(kv->dtype);
    if (!kv->k_buf || !kv->v_buf)
        return opck_fail(c, BERTH_E_INVALID, "%s: KV view has no %s buffer", op, kv->k_buf ? "V" : "K");
    uintptr_t k_addr, v_addr;
    uint64_t k_size, v_size;
    int k_read_only, v_read_only;
    c->be->buffer_facts(kv->k_buf, &k_addr, &k_size, &k_read_only);
    c->be->buffer_facts(kv->v_buf, &v_addr, &v_size, &v_read_only);
    if ((kv->block_stride | kv->token_stride | kv->head_stride | kv->v_token_stride | kv->v_head_stride |
         kv->k_offset | kv->v_offset) % es != 0 ||
        k_addr % es != 0 || v_addr % es != 0)
        return opck_fail(c, BERTH_E_INVALID,
                         "%s: KV view offsets and strides must be multiples of the element size %zu", op, es);
    uint64_t end;
    if (!kv_pool_end(kv, kv->k_offset, kv->token_stride, kv->head_stride, kv->head_dim, &end) || end > k_size)
        return opck_fail(c, BERTH_E_INVALID, "%s: KV view's K pool reaches outside its %" PRIu64 "-byte buffer", op,
                         k_size);
    if (!kv_pool_end(kv, kv->v_offset, kv->v_token_stride, kv->v_head_stride, kv->head_dim_v, &end) || end > v_size)
        return opck_fail(c, BERTH_E_INVALID, "%s: KV view's V pool reaches outside its %" PRIu64 "-byte buffer", op,
                         v_size);
    return true;
}

bool opck_rope_pairs(struct opck *c, const char *op, int32_t mode, int32_t pair_offset, int32_t n_pairs, int64_t d)
{
    if (mode != BERTH_ROPE_HALF && mode != BERTH_ROPE_INTERLEAVED)
        return opck_fail(c, BERTH_E_UNSUPPORTED, "%s: rope mode %d is not supported", op, mode);
    if (n_pairs < 0)
        return opck_fail(c, BERTH_E_INVALID, "%s: n_pairs %d is negative", op, n_pairs);
    if (mode == BERTH_ROPE_INTERLEAVED && 2 * (int64_t)n_pairs > d)
        return opck_fail(c, BERTH_E_INVALID, "%s: %d interleaved pairs need head dim >= %d, got %" PRId64, op, n_pairs,
                         2 * n_pairs, d);
    if (mode == BERTH_ROPE_HALF && n_pairs > 0 && (pair_offset < n_pairs || (int64_t)pair_offset + n_pairs > d))
        return opck_fail(c, BERTH_E_INVALID,
                         "%s: pair_offset %d with %d pairs needs n_pairs <= pair_offset and pair_offset + n_pairs <= "
                         "head dim %" PRId64, op, pair_offset, n_pairs, d);
    return true;
}

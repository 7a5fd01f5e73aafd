/* test_kv_cache_alloc.c — the paged KV block allocator: layout strides, memory split, sliding-window release,
 * exhaustion errors, and invariants under random alloc/grow/free sequences. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "kv_cache.h"
#include "check_run.h"

/* A backend that only allocates: records what the cache asks for. */
static int n_live_buffers;
static uint64_t last_alloc_bytes[8];
static int n_allocs;
static int32_t last_usage;

static berth_status fake_alloc(berth_backend *be, uint64_t nbytes, int32_t usage, berth_buffer **out)
{
    (void)be;
    void *p = malloc(nbytes ? nbytes : 1);
    if (!p) return BERTH_E_NOMEM;
    if (n_allocs < 8) last_alloc_bytes[n_allocs] = nbytes;
    n_allocs++;
    last_usage = usage;
    n_live_buffers++;
    *out = (berth_buffer *)p;
    return BERTH_OK;
}

static void fake_free(berth_backend *be, berth_buffer *buf)
{
    (void)be;
    if (buf) n_live_buffers--;
    free(buf);
}

static berth_backend_vtable fake_vt;
static berth_backend_api fake_api;

static const berth_backend_api *fake_backend(void)
{
    memset(&fake_vt, 0, sizeof fake_vt);
    fake_vt.struct_size = sizeof fake_vt;
    fake_vt.buffer_alloc = fake_alloc;
    fake_vt.buffer_free = fake_free;
    memset(&fake_api, 0, sizeof fake_api);
    fake_api.struct_size = sizeof fake_api;
    fake_api.vt = &fake_vt;
    n_allocs = 0;
    n_live_buffers = 0;
    return &fake_api;
}

/* Two groups: 'sliding' (window 8, 2 layers, 2 KV heads, head_dim 4) and 'full' (1 layer, 1 head, K 8, V 6). */
static berth_kv_group_desc g_sliding, g_full;
static const berth_kv_group_desc *groups2[2];
static berth_memory_layout layout2;

static void make_layout(void)
{
    memset(&g_sliding, 0, sizeof g_sliding);
    g_sliding.struct_size = sizeof g_sliding;
    g_sliding.kind = BERTH_KV_SLIDING;
    g_sliding.window = 8;
    g_sliding.n_layers = 2;
    g_sliding.n_kv_heads = 2;
    g_sliding.head_dim = 4;
    g_sliding.head_dim_v = 4;
    strcpy(g_sliding.name, "sliding");
    memset(&g_full, 0, sizeof g_full);
    g_full.struct_size = sizeof g_full;
    g_full.kind = BERTH_KV_FULL;
    g_full.n_layers = 1;
    g_full.n_kv_heads = 1;
    g_full.head_dim = 8;
    g_full.head_dim_v = 6;
    strcpy(g_full.name, "full");
    groups2[0] = &g_sliding;
    groups2[1] = &g_full;
    memset(&layout2, 0, sizeof layout2);
    layout2.struct_size = sizeof layout2;
    layout2.n_kv_groups = 2;
    layout2.kv_groups = groups2;
}

/* block_size 4, f32: sliding block = 2 layers * 2 planes * 4 tokens * 2 heads * 4 elems * 4 B = 512 B;
 * full block = 1 * 2 * 4 * 1 * max(8, 6) * 4 = 256 B. */
static struct kv_cache_params params(uint64_t memory, int32_t max_seqs)
{
    struct kv_cache_params p = {0};
    p.block_size = 4;
    p.memory_bytes = memory;
    p.max_seqs = max_seqs;
    p.max_seq_len = 64;
    p.max_chunk = 4;
    p.dtype = BERTH_DTYPE_F32;
    return p;
}

START_TEST(test_strides_and_view)
{
    make_layout();
    struct kv_cache *kv = NULL;
    struct kv_cache_params p = params(7680, 2);
    ck_assert_int_eq(kv_cache_create(fake_backend(), &layout2, &p, &kv), BERTH_OK);
    ck_assert_uint_eq(kv_block_bytes(kv, 0), 512);
    ck_assert_uint_eq(kv_block_bytes(kv, 1), 224); /* K 4 tokens * 8 f32 + V 4 tokens * 6 f32: no padding */
    ck_assert_int_eq(n_allocs, 2);
    ck_assert_int_eq(last_usage, BERTH_USAGE_KV);
    ck_assert_uint_eq(last_alloc_bytes[0], (uint64_t)kv_blocks_total(kv, 0) * 512);
    ck_assert_uint_eq(last_alloc_bytes[1], (uint64_t)kv_blocks_total(kv, 1) * 224);

    berth_tensor bt = {0}, sl = {0};
    bt.ne[0] = 3;
    sl.ne[0] = 5;
    berth_kv_group_batch gb;
    kv_group_batch(kv, 1, &bt, &sl, &gb);
    ck_assert_ptr_nonnull(gb.pool.k_buf);
    ck_assert_ptr_eq(gb.pool.k_buf, gb.pool.v_buf);
    ck_assert_uint_eq(gb.pool.head_stride, 32);    /* K: 8 f32 */
    ck_assert_uint_eq(gb.pool.token_stride, 32);   /* one head */
    ck_assert_uint_eq(gb.pool.v_head_stride, 24);  /* V: its own 6 f32, not max(8, 6) */
    ck_assert_uint_eq(gb.pool.v_token_stride, 24);
    ck_assert_uint_eq(gb.pool.k_offset, 0);
    ck_assert_uint_eq(gb.pool.v_offset, 128);      /* after the K plane: 4 tokens * 32 B */
    ck_assert_uint_eq(gb.layer_stride, 224);       /* K plane 128 + V plane 96 */
    ck_assert_uint_eq(gb.pool.block_stride, 224);
    /* the host leaves the per-group key counts absent: berth_batch.seq_kv_len applies */
    ck_assert_ptr_null(gb.seq_kv_len.buf);
    ck_assert_int_eq(gb.seq_kv_len.ne[0], 0);
    ck_assert_ptr_null(gb.h_seq_kv_len);
    ck_assert_int_eq(gb.pool.block_size, 4);
    ck_assert_int_eq(gb.pool.head_dim, 8);
    ck_assert_int_eq(gb.pool.head_dim_v, 6);
    ck_assert_int_eq(gb.pool.n_kv_heads, 1);
    ck_assert_int_eq(gb.pool.n_blocks, kv_blocks_total(kv, 1));
    ck_assert_int_eq(gb.pool.dtype, BERTH_DTYPE_F32);
    ck_assert_int_eq(gb.block_table.ne[0], 3);
    ck_assert_int_eq(gb.slots.ne[0], 5);

    kv_group_batch(kv, 0, &bt, &sl, &gb);
    ck_assert_uint_eq(gb.pool.head_stride, 16);
    ck_assert_uint_eq(gb.pool.token_stride, 32);
    ck_assert_uint_eq(gb.pool.v_head_stride, 16);
    ck_assert_uint_eq(gb.pool.v_token_stride, 32);
    ck_assert_uint_eq(gb.pool.v_offset, 128);
    ck_assert_uint_eq(gb.layer_stride, 256);
    ck_assert_uint_eq(gb.pool.block_stride, 512);
    kv_cache_free(kv);
    ck_assert_int_eq(n_live_buffers, 0);
}
END_TEST

START_TEST(test_memory_split)
{
    make_layout();
    struct kv_cache *kv = NULL;
    /* 7680 B / 736 B per block pair = 10 each; sliding cap = 2 seqs * (ceil((8 + 4 - 1) / 4) + 1) = 8 < 10, so
     * sliding gets 8 and full gets (7680 - 8 * 512) / 224 = 16. */
    struct kv_cache_params p = params(7680, 2);
    ck_assert_int_eq(kv_cache_create(NULL, &layout2, &p, &kv), BERTH_OK);
    ck_assert_int_eq(kv_blocks_total(kv, 0), 8);
    ck_assert_int_eq(kv_blocks_total(kv, 1), 16);
    ck_assert_int_eq(kv_blocks_in_use(kv, 0), 0);
    kv_cache_free(kv);

    /* Plenty of memory: both capped; full at 2 seqs * 16 blocks (64 tokens / 4). */
    p = params(1u << 20, 2);
    ck_assert_int_eq(kv_cache_create(NULL, &layout2, &p, &kv), BERTH_OK);
    ck_assert_int_eq(kv_blocks_total(kv, 0), 8);
    ck_assert_int_eq(kv_blocks_total(kv, 1), 32);
    kv_cache_free(kv);

    /* Scarce: 2304 B / 736 B per block pair: 3 blocks each, none capped. */
    p = params(2304, 2);
    ck_assert_int_eq(kv_cache_create(NULL, &layout2, &p, &kv), BERTH_OK);
    ck_assert_int_eq(kv_blocks_total(kv, 0), 3);
    ck_assert_int_eq(kv_blocks_total(kv, 1), 3);
    kv_cache_free(kv);

    /* Too little for one block of each. */
    p = params(700, 2);
    ck_assert_int_eq(kv_cache_create(NULL, &layout2, &p, &kv), BERTH_E_INVALID);
    ck_assert_ptr_null(kv);
    ck_assert_str_eq(berth_last_error(), "[kv] memory = 700 bytes cannot hold one block of each page group (needs "
                                         "736; group 'sliding' has 512-byte blocks)");

    p = params(2304, 2);
    p.block_size = 0;
    ck_assert_int_eq(kv_cache_create(NULL, &layout2, &p, &kv), BERTH_E_INVALID);
    ck_assert_str_eq(berth_last_error(), "[kv] block_size = 0 must be at least 1");
}
END_TEST

START_TEST(test_exhaustion_is_atomic)
{
    make_layout();
    struct kv_cache *kv = NULL;
    struct kv_cache_params p = params(2304, 2); /* 3 blocks per group */
    p.max_chunk = 64;
    ck_assert_int_eq(kv_cache_create(NULL, &layout2, &p, &kv), BERTH_OK);
    int32_t a, b;
    ck_assert_int_eq(kv_seq_new(kv, &a), BERTH_OK);
    ck_assert_int_eq(kv_seq_new(kv, &b), BERTH_OK);
    ck_assert_int_ne(a, b);
    int32_t c;
    ck_assert_int_eq(kv_seq_new(kv, &c), BERTH_E_NOMEM);
    ck_assert_str_eq(berth_last_error(),
                     "all 2 sequence slots of the KV cache are in use (raise [scheduler] max_seqs)");

    /* 20 tokens = 5 blocks in both groups; only 3 of each exist. */
    ck_assert_int_eq(kv_seq_ensure(kv, a, 20), BERTH_E_DEVICE_OOM);
    ck_assert_str_eq(berth_last_error(),
                     "KV cache exhausted: group 'sliding' needs 5 more blocks, 3 free (raise [kv] memory)");
    ck_assert_int_eq(kv_blocks_in_use(kv, 0), 0);
    ck_assert_int_eq(kv_blocks_in_use(kv, 1), 0);
    ck_assert_int_eq(kv_seq_len(kv, a), 0);

    ck_assert_int_eq(kv_seq_ensure(kv, a, 8), BERTH_OK);
    ck_assert_int_eq(kv_blocks_in_use(kv, 1), 2);
    ck_assert_int_eq(kv_seq_ensure(kv, b, 9), BERTH_E_DEVICE_OOM);
    ck_assert_str_eq(berth_last_error(),
                     "KV cache exhausted: group 'sliding' needs 3 more blocks, 1 free (raise [kv] memory)");
    ck_assert_int_eq(kv_seq_ensure(kv, b, 4), BERTH_OK);
    ck_assert_int_eq(kv_blocks_in_use(kv, 1), 3);
    /* a at 8 -> 12: the sliding group releases nothing yet (queries at 8 see keys from 1), full has no block. */
    ck_assert_int_eq(kv_seq_ensure(kv, a, 12), BERTH_E_DEVICE_OOM);
    ck_assert_str_eq(berth_last_error(),
                     "KV cache exhausted: group 'sliding' needs 1 more blocks, 0 free (raise [kv] memory)");
    ck_assert_int_eq(kv_cache_validate(kv), BERTH_OK);
    kv_seq_free(kv, b);
    ck_assert_int_eq(kv_blocks_in_use(kv, 1), 2);
    ck_assert_int_eq(kv_seq_ensure(kv, a, 12), BERTH_OK);
    ck_assert_int_eq(kv_seq_ensure(kv, a, 13), BERTH_E_DEVICE_OOM);
    ck_assert_str_eq(berth_last_error(),
                     "KV cache exhausted: group 'full' needs 1 more blocks, 0 free (raise [kv] memory)");
    ck_assert_int_eq(kv_seq_len(kv, a), 12);
    ck_assert_int_eq(kv_cache_validate(kv), BERTH_OK);

    ck_assert_int_eq(kv_seq_ensure(kv, a, 11), BERTH_E_INVALID);
    ck_assert_str_eq(berth_last_error(), "KV cache: sequence 0 cannot shrink from 12 to 11 tokens");
    ck_assert_int_eq(kv_seq_ensure(kv, 1, 4), BERTH_E_INVALID);
    ck_assert_str_eq(berth_last_error(), "KV cache: sequence 1 is not in use");
    ck_assert_int_eq(kv_seq_ensure(kv, a, 65), BERTH_E_INVALID);
    ck_assert_str_eq(berth_last_error(), "KV cache: sequence 0 of 65 tokens exceeds the limit of 64");
    kv_cache_free(kv);
}
END_TEST

START_TEST(test_sliding_release)
{
    make_layout();
    struct kv_cache *kv = NULL;
    struct kv_cache_params p = params(1u << 20, 1);
    p.max_chunk = 1;
    ck_assert_int_eq(kv_cache_create(NULL, &layout2, &p, &kv), BERTH_OK);
    int32_t s;
    ck_assert_int_eq(kv_seq_new(kv, &s), BERTH_OK);
    /* Decode one token at a time to 64: queries at q see keys q-7..q. */
    for (int32_t len = 1; len <= 64; len++) {
        ck_assert_int_eq(kv_seq_ensure(kv, s, len), BERTH_OK);
        int32_t q = len - 1;
        for (int32_t pos = 0; pos < len; pos++) {
            int32_t blk = kv_seq_block(kv, s, 0, pos);
            int32_t block_lo = pos / 4 * 4, block_hi = block_lo + 3;
            int visible_block = block_hi >= q - 7; /* some key of the block is visible to the query at q */
            if (visible_block) ck_assert_int_ge(blk, 0);
            /* full group never releases */
            ck_assert_int_ge(kv_seq_block(kv, s, 1, pos), 0);
        }
        /* Blocks that ended before the previous query's window are gone. */
        int32_t lowest = (len - 1) - 8 + 1;
        for (int32_t pos = 0; pos + 4 <= (lowest > 0 ? lowest / 4 * 4 : 0); pos += 4)
            ck_assert_int_eq(kv_seq_block(kv, s, 0, pos), -1);
        ck_assert_int_le(kv_blocks_in_use(kv, 0), 3); /* ceil((8 + 1 - 1) / 4) + 1 */
        ck_assert_int_eq(kv_blocks_in_use(kv, 1), (len + 3) / 4);
        ck_assert_int_eq(kv_cache_validate(kv), BERTH_OK);
    }
    ck_assert_int_eq(kv_blocks_in_use(kv, 0), 2); /* keys 57..63 for the next query at 64: blocks 14, 15 */
    kv_seq_free(kv, s);
    ck_assert_int_eq(kv_blocks_in_use(kv, 0), 0);
    ck_assert_int_eq(kv_blocks_in_use(kv, 1), 0);
    ck_assert_int_eq(kv_cache_validate(kv), BERTH_OK);
    kv_cache_free(kv);
}
END_TEST

START_TEST(test_batch_tables)
{
    make_layout();
    struct kv_cache *kv = NULL;
    struct kv_cache_params p = params(1u << 20, 2);
    ck_assert_int_eq(kv_cache_create(NULL, &layout2, &p, &kv), BERTH_OK);
    int32_t a, b;
    ck_assert_int_eq(kv_seq_new(kv, &a), BERTH_OK);
    ck_assert_int_eq(kv_seq_new(kv, &b), BERTH_OK);
    ck_assert_int_eq(kv_seq_ensure(kv, a, 3), BERTH_OK);
    ck_assert_int_eq(kv_seq_ensure(kv, b, 4), BERTH_OK);
    ck_assert_int_eq(kv_seq_ensure(kv, a, 6), BERTH_OK);
    ck_assert_int_eq(kv_seq_ensure(kv, b, 5), BERTH_OK);
    struct kv_seq_span spans[2] = {{a, 3, 3}, {b, 4, 1}};
    int32_t width = kv_batch_table_width(kv, spans, 2);
    ck_assert_int_eq(width, 2);
    int32_t table[4], slots[4];
    for (int32_t g = 0; g < 2; g++) {
        ck_assert_int_eq(kv_batch_tables(kv, g, spans, 2, width, table, slots), BERTH_OK);
        ck_assert_int_eq(table[0], kv_seq_block(kv, a, g, 0));
        ck_assert_int_eq(table[1], kv_seq_block(kv, a, g, 4));
        ck_assert_int_eq(table[2], kv_seq_block(kv, b, g, 0));
        ck_assert_int_eq(table[3], kv_seq_block(kv, b, g, 4));
        /* Allocation order: a0 b0 a1 b1 -> blocks 0 1 2 3 */
        ck_assert_int_eq(table[0], 0);
        ck_assert_int_eq(table[2], 1);
        ck_assert_int_eq(table[1], 2);
        ck_assert_int_eq(table[3], 3);
        ck_assert_int_eq(slots[0], 0 * 4 + 3);
        ck_assert_int_eq(slots[1], 2 * 4 + 0);
        ck_assert_int_eq(slots[2], 2 * 4 + 1);
        ck_assert_int_eq(slots[3], 3 * 4 + 0);
    }
    struct kv_seq_span bad = {a, 5, 2};
    ck_assert_int_eq(kv_batch_tables(kv, 0, &bad, 1, 2, table, slots), BERTH_E_INTERNAL);
    ck_assert_str_eq(berth_last_error(), "KV cache: positions 5..6 of sequence 0 were not ensured (length 6)");
    kv_cache_free(kv);
}
END_TEST

/* xorshift64*: deterministic, no libc rand state. */
static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

START_TEST(test_random_invariants)
{
    make_layout();
    uint64_t seed = 0x9e3779b97f4a7c15ull + (uint64_t)_i * 7919u;
    struct kv_cache *kv = NULL;
    struct kv_cache_params p = params(6 * 768 + 4 * 256, 4); /* tight: exhaustion happens often */
    p.max_chunk = 6;
    ck_assert_int_eq(kv_cache_create(fake_backend(), &layout2, &p, &kv), BERTH_OK);
    int live[4] = {0};
    int32_t ids[4];
    int n_exhausted = 0, n_grown = 0, n_released_seen = 0;
    for (int step = 0; step < 3000; step++) {
        uint64_t r = rng_next(&seed);
        int k = (int)(r % 4);
        int op = (int)((r >> 8) % 10);
        if (!live[k]) {
            ck_assert_int_eq(kv_seq_new(kv, &ids[k]), BERTH_OK);
            live[k] = 1;
        } else if (op == 0) {
            kv_seq_free(kv, ids[k]);
            live[k] = 0;
        } else {
            int32_t len = kv_seq_len(kv, ids[k]);
            int32_t grow = 1 + (int32_t)((r >> 16) % 6);
            if (len + grow > 64) {
                kv_seq_free(kv, ids[k]);
                live[k] = 0;
            } else {
                int32_t used0 = kv_blocks_in_use(kv, 0), used1 = kv_blocks_in_use(kv, 1);
                berth_status st = kv_seq_ensure(kv, ids[k], len + grow);
                if (st == BERTH_E_DEVICE_OOM) {
                    n_exhausted++;
                    ck_assert_int_eq(kv_seq_len(kv, ids[k]), len);
                    ck_assert_int_le(kv_blocks_in_use(kv, 0), used0); /* only sliding releases happened */
                    ck_assert_int_eq(kv_blocks_in_use(kv, 1), used1);
                    ck_assert_ptr_nonnull(strstr(berth_last_error(), "KV cache exhausted: group '"));
                } else {
                    ck_assert_int_eq(st, BERTH_OK);
                    n_grown++;
                    int32_t nl = len + grow;
                    /* Everything a query at >= len can see is present; released blocks read -1. */
                    for (int32_t pos = 0; pos < nl; pos++) {
                        int32_t blk = kv_seq_block(kv, ids[k], 0, pos);
                        if (pos >= len - 8 + 1) ck_assert_int_ge(blk, 0);
                        if (blk < 0) n_released_seen++;
                        ck_assert_int_ge(kv_seq_block(kv, ids[k], 1, pos), 0);
                    }
                }
            }
        }
        ck_assert_msg(kv_cache_validate(kv) == BERTH_OK, "step %d: %s", step, berth_last_error());
        int32_t total_len_blocks = 0;
        for (int j = 0; j < 4; j++)
            if (live[j]) total_len_blocks += (kv_seq_len(kv, ids[j]) + 3) / 4;
        ck_assert_int_eq(kv_blocks_in_use(kv, 1), total_len_blocks);
    }
    ck_assert_int_gt(n_exhausted, 0);
    ck_assert_int_gt(n_grown, 100);
    ck_assert_int_gt(n_released_seen, 0);
    kv_cache_free(kv);
    ck_assert_int_eq(n_live_buffers, 0);
}
END_TEST

static Suite *kv_suite(void)
{
    Suite *s = suite_create("kv_cache");
    TCase *tc = tcase_create("alloc");
    tcase_add_test(tc, test_strides_and_view);
    tcase_add_test(tc, test_memory_split);
    tcase_add_test(tc, test_exhaustion_is_atomic);
    tcase_add_test(tc, test_sliding_release);
    tcase_add_test(tc, test_batch_tables);
    tcase_add_loop_test(tc, test_random_invariants, 0, 4);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return check_run(kv_suite(), 0) ? EXIT_FAILURE : EXIT_SUCCESS;
}

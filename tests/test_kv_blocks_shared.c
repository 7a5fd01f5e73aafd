/* test_kv_blocks_shared.c — the KV cache's shared blocks: reference counts, fork with copy-on-write of the last
 * partial block (through buffer_copy), the prefix cache (publish, attach, LRU eviction, the sliding-window hit
 * rule), recurrent-state slots and the snapshot pool, and invariants under random
 * alloc/grow/fork/publish/attach/free sequences. A fake backend keeps buffers in host memory so copies can be
 * checked byte for byte. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "kv_cache.h"
#include "check_run.h"

/* ---- a host-memory backend: alloc/free/copy/fill ---- */
struct fbuf {
    uint64_t n;
    unsigned char d[];
};
static int n_live, n_copies, n_fills;

static berth_status f_alloc(berth_backend *be, uint64_t nbytes, int32_t usage, berth_buffer **out)
{
    (void)be;
    (void)usage;
    struct fbuf *b = calloc(1, sizeof *b + (nbytes ? nbytes : 1));
    if (!b) return BERTH_E_NOMEM;
    b->n = nbytes;
    memset(b->d, 0xAB, nbytes); /* garbage, so zeroing is observable */
    n_live++;
    *out = (berth_buffer *)b;
    return BERTH_OK;
}
static void f_free(berth_backend *be, berth_buffer *buf)
{
    (void)be;
    if (buf) n_live--;
    free(buf);
}
static berth_status f_copy(berth_backend *be, berth_stream *s, berth_buffer *dst, uint64_t doff, const berth_buffer *src,
                           uint64_t soff, uint64_t n)
{
    (void)be;
    (void)s;
    struct fbuf *d = (struct fbuf *)dst;
    const struct fbuf *sb = (const struct fbuf *)src;
    ck_assert_uint_le(doff + n, d->n);
    ck_assert_uint_le(soff + n, sb->n);
    memmove(d->d + doff, sb->d + soff, n);
    n_copies++;
    return BERTH_OK;
}
static berth_status f_fill(berth_backend *be, berth_stream *s, berth_buffer *dst, uint64_t off, uint8_t byte,
                           uint64_t n)
{
    (void)be;
    (void)s;
    struct fbuf *d = (struct fbuf *)dst;
    ck_assert_uint_le(off + n, d->n);
    memset(d->d + off, byte, n);
    n_fills++;
    return BERTH_OK;
}
static berth_backend_vtable vt;
static berth_backend_api api;
static const berth_backend_api *mem_backend(void)
{
    memset(&vt, 0, sizeof vt);
    vt.struct_size = sizeof vt;
    vt.buffer_alloc = f_alloc;
    vt.buffer_free = f_free;
    vt.buffer_copy = f_copy;
    vt.buffer_fill = f_fill;
    memset(&api, 0, sizeof api);
    api.struct_size = sizeof api;
    api.vt = &vt;
    n_live = n_copies = n_fills = 0;
    return &api;
}
static berth_stream *const STREAM = (berth_stream *)&api; /* any non-NULL handle: the fake ignores it */

/* ---- layouts: 'sliding' (window 8) + 'full', block_size 4; optionally one recurrent state of 6 f32 ---- */
static berth_kv_group_desc g_sl, g_fu;
static const berth_kv_group_desc *groups[2];
static berth_state_desc st_desc;
static const berth_state_desc *states[1];
static berth_memory_layout layout;

static void make_layout(int with_sliding, int with_state)
{
    memset(&g_sl, 0, sizeof g_sl);
    g_sl.struct_size = sizeof g_sl;
    g_sl.kind = BERTH_KV_SLIDING;
    g_sl.window = 8;
    g_sl.n_layers = 1;
    g_sl.n_kv_heads = 1;
    g_sl.head_dim = 2;
    g_sl.head_dim_v = 2;
    strcpy(g_sl.name, "sliding");
    g_fu = g_sl;
    g_fu.kind = BERTH_KV_FULL;
    g_fu.window = 0;
    strcpy(g_fu.name, "full");
    int n = 0;
    if (with_sliding) groups[n++] = &g_sl;
    groups[n++] = &g_fu;
    memset(&st_desc, 0, sizeof st_desc);
    st_desc.struct_size = sizeof st_desc;
    st_desc.dtype = BERTH_DTYPE_F32;
    st_desc.ndim = 1;
    st_desc.ne[0] = 6;
    strcpy(st_desc.name, "conv");
    states[0] = &st_desc;
    memset(&layout, 0, sizeof layout);
    layout.struct_size = sizeof layout;
    layout.n_kv_groups = n;
    layout.kv_groups = groups;
    layout.n_states = with_state ? 1 : 0;
    layout.states = with_state ? states : NULL;
}

/* Block bytes: 1 layer * (K 4 tokens * 2 f32 + V the same) = 64 B per block in either group. */
static struct kv_cache_params params(int32_t blocks_each, int32_t max_seqs)
{
    struct kv_cache_params p = {0};
    p.block_size = 4;
    p.memory_bytes = (uint64_t)blocks_each * 64 * (uint64_t)layout.n_kv_groups;
    p.max_seqs = max_seqs;
    p.max_seq_len = 64;
    p.max_chunk = 4;
    p.dtype = BERTH_DTYPE_F32;
    return p;
}

static unsigned char *block_bytes(struct kv_cache *kv, int32_t g, int32_t b)
{
    berth_tensor t = {0};
    berth_kv_group_batch gb;
    kv_group_batch(kv, g, &t, &t, &gb);
    return ((struct fbuf *)gb.pool.k_buf)->d + (uint64_t)b * gb.pool.block_stride;
}

static void valid(struct kv_cache *kv)
{
    ck_assert_msg(kv_cache_validate(kv) == BERTH_OK, "%s", berth_last_error());
}

/* Grow seq by the tokens ids[len..to) in chunks of at most 4 and publish them, as the runner does per step. */
static void run_to(struct kv_cache *kv, int32_t seq, const int32_t *ids, int32_t to)
{
    for (int32_t len = kv_seq_len(kv, seq); len < to;) {
        int32_t n = to - len < 4 ? to - len : 4;
        ck_assert_msg(kv_seq_ensure(kv, seq, len + n) == BERTH_OK, "%s", berth_last_error());
        ck_assert_msg(kv_seq_publish(kv, seq, len, ids + len, n) == BERTH_OK, "%s", berth_last_error());
        len += n;
        valid(kv);
    }
}

START_TEST(test_fork_copy_on_write)
{
    make_layout(0, 0);
    struct kv_cache *kv = NULL;
    struct kv_cache_params p = params(16, 4);
    ck_assert_int_eq(kv_cache_create(mem_backend(), &layout, &p, &kv), BERTH_OK);
    kv_cache_set_stream(kv, STREAM);
    int32_t ids[16] = {1, 2, 3, 4, 5, 6};
    int32_t a, b;
    ck_assert_int_eq(kv_seq_new(kv, &a), BERTH_OK);
    run_to(kv, a, ids, 6); /* one full block + 2 tokens of the second */
    int32_t b0 = kv_seq_block(kv, a, 0, 0), b1 = kv_seq_block(kv, a, 0, 4);
    memset(block_bytes(kv, 0, b1), 0x5A, 64); /* "written K/V" of the partial block */
    ck_assert_int_eq(kv_seq_fork(kv, a, &b), BERTH_OK);
    valid(kv);
    ck_assert_int_eq(kv_seq_len(kv, b), 6);
    ck_assert_int_eq(kv_seq_block(kv, b, 0, 0), b0);
    ck_assert_int_eq(kv_seq_block(kv, b, 0, 4), b1);
    ck_assert_int_eq(kv_block_refs(kv, 0, b0), 2);
    ck_assert_int_eq(kv_block_refs(kv, 0, b1), 2);
    ck_assert_int_eq(kv_blocks_in_use(kv, 0), 2);
    /* b writes position 6: its own copy of the partial block, same bytes; the full block stays shared. */
    int copies0 = n_copies;
    ck_assert_int_eq(kv_seq_ensure(kv, b, 7), BERTH_OK);
    int32_t nb = kv_seq_block(kv, b, 0, 4);
    ck_assert_int_ne(nb, b1);
    ck_assert_int_eq(n_copies - copies0, 1);
    ck_assert_int_eq(memcmp(block_bytes(kv, 0, nb), block_bytes(kv, 0, b1), 64), 0);
    ck_assert_int_eq(kv_block_refs(kv, 0, b1), 1);
    ck_assert_int_eq(kv_block_refs(kv, 0, b0), 2);
    ck_assert_int_eq(kv_counters(kv)->cow_copies, 1);
    /* a now owns b1 alone: writing into it copies nothing. */
    ck_assert_int_eq(kv_seq_ensure(kv, a, 8), BERTH_OK);
    ck_assert_int_eq(kv_seq_block(kv, a, 0, 4), b1);
    ck_assert_int_eq(n_copies - copies0, 1);
    valid(kv);
    /* A fork at a block boundary shares everything and copies nothing on growth. */
    int32_t c;
    ck_assert_int_eq(kv_seq_fork(kv, a, &c), BERTH_OK);
    ck_assert_int_eq(kv_seq_ensure(kv, c, 9), BERTH_OK);
    ck_assert_int_eq(n_copies - copies0, 1);
    ck_assert_int_eq(kv_blocks_in_use(kv, 0), 4); /* b0 shared by 3, b1 (a, c), nb (b), c's new block */
    valid(kv);
    kv_seq_free(kv, a);
    kv_seq_free(kv, b);
    kv_seq_free(kv, c);
    valid(kv);
    ck_assert_int_eq(kv_blocks_in_use(kv, 0), 0);
    /* Exhausted sequence slots: fork fails cleanly. */
    int32_t s[4], d;
    for (int i = 0; i < 4; i++) ck_assert_int_eq(kv_seq_new(kv, &s[i]), BERTH_OK);
    ck_assert_int_eq(kv_seq_fork(kv, s[0], &d), BERTH_E_NOMEM);
    ck_assert_int_eq(d, -1);
    ck_assert_int_eq(kv_seq_fork(kv, 9, &d), BERTH_E_INVALID);
    ck_assert_str_eq(berth_last_error(), "KV cache: sequence 9 is not in use");
    kv_cache_free(kv);
    ck_assert_int_eq(n_live, 0);
}
END_TEST

START_TEST(test_prefix_reuse_and_lru)
{
    make_layout(0, 0);
    struct kv_cache *kv = NULL;
    struct kv_cache_params p = params(8, 4);
    ck_assert_int_eq(kv_cache_create(mem_backend(), &layout, &p, &kv), BERTH_OK);
    kv_cache_set_stream(kv, STREAM);
    int32_t A[12] = {7, 7, 1, 2, 3, 4, 5, 6, 9, 9, 9, 9};
    int32_t a, b;
    ck_assert_int_eq(kv_seq_new(kv, &a), BERTH_OK);
    run_to(kv, a, A, 10);
    ck_assert_int_eq(kv_prefix_match(kv, A, 12), 8); /* held blocks are shareable too */
    kv_seq_free(kv, a);
    valid(kv);
    ck_assert_int_eq(kv_blocks_in_use(kv, 0), 0);
    ck_assert_int_eq(kv_blocks_cached(kv, 0), 2); /* the two full blocks; the partial one is free */
    ck_assert_int_eq(kv_blocks_available(kv, 0), 8);
    /* One token must remain to compute: 8 tokens of prompt give 4 cached. */
    ck_assert_int_eq(kv_prefix_match(kv, A, 8), 4);
    ck_assert_int_eq(kv_prefix_match(kv, A, 9), 8);
    ck_assert_int_eq(kv_prefix_match(kv, A, 3), 0);
    int32_t other[9] = {7, 7, 1, 2, 3, 4, 5, 0, 9}; /* second block differs */
    ck_assert_int_eq(kv_prefix_match(kv, other, 9), 4);
    int32_t other2[9] = {7, 8, 1, 2, 3, 4, 5, 6, 9}; /* first block differs: the chain breaks */
    ck_assert_int_eq(kv_prefix_match(kv, other2, 9), 0);

    ck_assert_int_eq(kv_seq_new(kv, &b), BERTH_OK);
    int32_t cached = -1;
    ck_assert_int_eq(kv_prefix_attach(kv, b, A, 11, &cached), BERTH_OK);
    ck_assert_int_eq(cached, 8);
    ck_assert_int_eq(kv_seq_len(kv, b), 8);
    ck_assert_int_eq(kv_blocks_cached(kv, 0), 0);
    ck_assert_int_eq(kv_blocks_in_use(kv, 0), 2);
    ck_assert_int_eq(kv_counters(kv)->hit_tokens, 8);
    valid(kv);
    run_to(kv, b, A, 11);
    ck_assert_int_eq(kv_prefix_attach(kv, b, A, 11, &cached), BERTH_E_INVALID);
    kv_seq_free(kv, b);

    /* LRU: fill the pool with other content; the cached blocks go, oldest first, only when needed. */
    int32_t Z[32];
    for (int i = 0; i < 32; i++) Z[i] = 100 + i;
    int32_t z;
    ck_assert_int_eq(kv_seq_new(kv, &z), BERTH_OK);
    run_to(kv, z, Z, 24); /* 6 blocks: exactly the free ones */
    ck_assert_int_eq(kv_counters(kv)->evicted_blocks, 0);
    ck_assert_int_eq(kv_prefix_match(kv, A, 11), 8);
    run_to(kv, z, Z, 28); /* the 7th block: the least recently used cached block must go — A's tail, since a
                           * freed sequence queues its blocks last first and the shared head stays longest */
    ck_assert_int_eq(kv_counters(kv)->evicted_blocks, 1);
    ck_assert_int_eq(kv_prefix_match(kv, A, 11), 4);
    run_to(kv, z, Z, 32);
    ck_assert_int_eq(kv_counters(kv)->evicted_blocks, 2);
    ck_assert_int_eq(kv_prefix_match(kv, A, 11), 0); /* now the head went too */
    ck_assert_int_eq(kv_seq_ensure(kv, z, 33), BERTH_E_DEVICE_OOM);
    ck_assert_str_eq(berth_last_error(), "KV cache exhausted: group 'full' needs 1 more blocks, 0 free (raise [kv] memory)");
    valid(kv);
    kv_seq_free(kv, z);
    ck_assert_int_eq(kv_prefix_match(kv, Z, 32), 28);
    kv_cache_free(kv);
    ck_assert_int_eq(n_live, 0);
}
END_TEST

/* Sliding groups: a hit needs the blocks a query right after the prefix sees; older ones may be gone. */
START_TEST(test_prefix_sliding_window_rule)
{
    make_layout(1, 0);
    struct kv_cache *kv = NULL;
    struct kv_cache_params p = params(12, 1);
    ck_assert_int_eq(kv_cache_create(mem_backend(), &layout, &p, &kv), BERTH_OK);
    kv_cache_set_stream(kv, STREAM);
    /* sliding cap per sequence: ceil((8 + 4 - 1) / 4) + 1 = 4 blocks, and max_seqs 1: the group has 4 blocks */
    ck_assert_int_eq(kv_blocks_total(kv, 0), 4);
    ck_assert_int_eq(kv_group_seq_cap(kv, 0), 4);
    int32_t T[41];
    for (int i = 0; i < 41; i++) T[i] = i % 7 + 3 * (i / 7);
    int32_t a;
    ck_assert_int_eq(kv_seq_new(kv, &a), BERTH_OK);
    run_to(kv, a, T, 40);
    ck_assert_int_le(kv_blocks_in_use(kv, 0), 4);
    ck_assert_int_gt(kv_counters(kv)->evicted_blocks, 0); /* released sliding blocks were cached, then reused */
    kv_seq_free(kv, a);
    valid(kv);
    /* 41 tokens: 10 blocks; the next query (position 40) sees keys 33..40: sliding blocks 8, 9 are cached. */
    ck_assert_int_eq(kv_prefix_match(kv, T, 41), 40);
    /* 21 tokens: a 5-block prefix needs sliding blocks 3, 4 (long evicted), and so does every shorter one down to
     * 2 blocks (blocks 0, 1): no hit although the full group has them all. */
    ck_assert_int_eq(kv_prefix_match(kv, T, 21), 0);
    int32_t b, cached;
    ck_assert_int_eq(kv_seq_new(kv, &b), BERTH_OK);
    ck_assert_int_eq(kv_prefix_attach(kv, b, T, 41, &cached), BERTH_OK);
    ck_assert_int_eq(cached, 40);
    /* The sliding group holds exactly blocks 8, 9, as a fresh prefill leaves it; the full group all ten. */
    for (int32_t pos = 0; pos < 40; pos += 4) {
        if (pos < 32)
            ck_assert_int_eq(kv_seq_block(kv, b, 0, pos), -1);
        else
            ck_assert_int_ge(kv_seq_block(kv, b, 0, pos), 0);
        ck_assert_int_ge(kv_seq_block(kv, b, 1, pos), 0);
    }
    ck_assert_int_eq(kv_blocks_in_use(kv, 0), 2);
    valid(kv);
    run_to(kv, b, T, 41);
    kv_seq_free(kv, b);
    valid(kv);
    kv_cache_free(kv);
}
END_TEST

static float *slot_f32(struct kv_cache *kv, int32_t seq)
{
    return (float *)(((struct fbuf *)kv_state_pool(kv, 0))->d + (uint64_t)seq * kv_state_slot_bytes(kv, 0));
}

START_TEST(test_state_slots_and_snapshots)
{
    make_layout(0, 1);
    struct kv_cache *kv = NULL;
    struct kv_cache_params p = params(16, 3);
    p.n_snapshots = 2;
    ck_assert_int_eq(kv_cache_create(mem_backend(), &layout, &p, &kv), BERTH_OK);
    ck_assert_int_eq(n_live, 3); /* KV pool, state slots, snapshot slots */
    ck_assert_int_eq(kv_n_states(kv), 1);
    ck_assert_uint_eq(kv_state_slot_bytes(kv, 0), 24);
    int32_t a, b;
    /* Without a stream there is nothing to zero a slot with. */
    ck_assert_int_eq(kv_seq_new(kv, &a), BERTH_E_INTERNAL);
    kv_cache_set_stream(kv, STREAM);
    ck_assert_int_eq(kv_seq_new(kv, &a), BERTH_OK);
    for (int i = 0; i < 6; i++) ck_assert_float_eq(slot_f32(kv, a)[i], 0.0f);
    int32_t T[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    /* After each step the "model" leaves state = the step's end position in every element. */
    for (int32_t len = 0; len < 10;) {
        int32_t n = len == 4 ? 2 : 4 - len % 4; /* steps end at 4, 6, 8, 10 */
        if (len + n > 10) n = 10 - len;
        ck_assert_int_eq(kv_seq_ensure(kv, a, len + n), BERTH_OK);
        for (int i = 0; i < 6; i++) slot_f32(kv, a)[i] = (float)(len + n);
        ck_assert_int_eq(kv_seq_publish(kv, a, len, T + len, n), BERTH_OK);
        len += n;
    }
    /* Snapshots at boundaries 4 and 8 (steps ending there); 6 and 10 are not block ends. */
    ck_assert_int_eq(kv_counters(kv)->snapshots_saved, 2);
    ck_assert_int_eq(kv_snapshots_in_use(kv), 2);
    /* Fork copies the state. */
    ck_assert_int_eq(kv_seq_fork(kv, a, &b), BERTH_OK);
    ck_assert_float_eq(slot_f32(kv, b)[5], 10.0f);
    kv_seq_free(kv, b);
    kv_seq_free(kv, a);
    valid(kv);
    /* A hit resumes from the snapshot at its last block: state 8 at 8 tokens. */
    ck_assert_int_eq(kv_prefix_match(kv, T, 12), 8);
    int32_t c, cached;
    ck_assert_int_eq(kv_seq_new(kv, &c), BERTH_OK);
    ck_assert_float_eq(slot_f32(kv, c)[0], 0.0f);
    ck_assert_int_eq(kv_prefix_attach(kv, c, T, 12, &cached), BERTH_OK);
    ck_assert_int_eq(cached, 8);
    for (int i = 0; i < 6; i++) ck_assert_float_eq(slot_f32(kv, c)[i], 8.0f);
    ck_assert_int_eq(kv_counters(kv)->snapshots_restored, 1);
    /* Grow c to 12 and 16 on boundaries: two more snapshots, evicting the LRU one (block 1, key of 4 tokens). */
    ck_assert_int_eq(kv_seq_ensure(kv, c, 12), BERTH_OK);
    ck_assert_int_eq(kv_seq_publish(kv, c, 8, T + 8, 4), BERTH_OK);
    ck_assert_int_eq(kv_counters(kv)->evicted_snapshots, 1);
    ck_assert_int_eq(kv_prefix_match(kv, T, 6), 0); /* the block-1 snapshot is gone: no state to resume at 4 */
    ck_assert_int_eq(kv_prefix_match(kv, T, 13), 12);
    kv_seq_free(kv, c);
    valid(kv);
    kv_cache_free(kv);
    ck_assert_int_eq(n_live, 0);
}
END_TEST

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

/* Random alloc/grow/fork/publish/attach/free with invariants checked after every step; tokens from a tiny
 * alphabet so prefixes collide, sequences diverge after forks, and memory is tight enough to evict. */
START_TEST(test_random_shared_invariants)
{
    make_layout(_i % 2, 0);
    uint64_t seed = 0x2545F4914F6CDD1Dull + (uint64_t)_i * 104729u;
    struct kv_cache *kv = NULL;
    struct kv_cache_params p = params(20, 5);
    ck_assert_int_eq(kv_cache_create(mem_backend(), &layout, &p, &kv), BERTH_OK);
    kv_cache_set_stream(kv, STREAM);
    int live[5] = {0};
    int32_t ids[5], toks[5][64];
    int n_oom = 0, n_fork = 0, n_hit = 0, n_grow = 0;
    for (int step = 0; step < 2500; step++) {
        uint64_t r = rng_next(&seed);
        int k = (int)(r % 5), op = (int)((r >> 8) % 12);
        if (!live[k]) {
            if (kv_seq_new(kv, &ids[k]) != BERTH_OK) continue;
            live[k] = 1;
            for (int i = 0; i < 64; i++) toks[k][i] = (int32_t)((r >> (i % 48)) & 1);
            if (op < 6) { /* try the prefix cache for a 40-token prompt */
                int32_t cached;
                int32_t expect = kv_prefix_match(kv, toks[k], 40);
                ck_assert_int_eq(kv_prefix_attach(kv, ids[k], toks[k], 40, &cached), BERTH_OK);
                ck_assert_int_eq(cached, expect);
                ck_assert_int_eq(cached % 4, 0);
                if (cached) n_hit++;
            }
        } else if (op == 0) {
            kv_seq_free(kv, ids[k]);
            live[k] = 0;
        } else if (op == 1) {
            int j = -1;
            for (int x = 0; x < 5; x++)
                if (!live[x]) j = x;
            if (j >= 0 && kv_seq_fork(kv, ids[k], &ids[j]) == BERTH_OK) {
                live[j] = 1;
                memcpy(toks[j], toks[k], sizeof toks[j]);
                toks[j][kv_seq_len(kv, ids[j]) % 64] ^= 1; /* diverge after the fork point */
                n_fork++;
            }
        } else {
            int32_t len = kv_seq_len(kv, ids[k]), grow = 1 + (int32_t)((r >> 16) % 4);
            if (len + grow > 64) {
                kv_seq_free(kv, ids[k]);
                live[k] = 0;
            } else {
                berth_status st = kv_seq_ensure(kv, ids[k], len + grow);
                if (st == BERTH_E_DEVICE_OOM) {
                    n_oom++;
                    ck_assert_int_eq(kv_seq_len(kv, ids[k]), len);
                } else {
                    ck_assert_msg(st == BERTH_OK, "%s", berth_last_error());
                    ck_assert_int_eq(kv_seq_publish(kv, ids[k], len, toks[k] + len, grow), BERTH_OK);
                    n_grow++;
                }
            }
        }
        ck_assert_msg(kv_cache_validate(kv) == BERTH_OK, "step %d: %s", step, berth_last_error());
    }
    ck_assert_int_gt(n_oom, 0);
    ck_assert_int_gt(n_fork, 10);
    ck_assert_int_gt(n_hit, 3);
    ck_assert_int_gt(n_grow, 200);
    ck_assert_int_gt(kv_counters(kv)->evicted_blocks, 0);
    for (int k = 0; k < 5; k++)
        if (live[k]) kv_seq_free(kv, ids[k]);
    valid(kv);
    for (int32_t g = 0; g < kv_n_groups(kv); g++) ck_assert_int_eq(kv_blocks_in_use(kv, g), 0);
    kv_cache_free(kv);
    ck_assert_int_eq(n_live, 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kv_blocks_shared");
    TCase *tc = tcase_create("shared");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_fork_copy_on_write);
    tcase_add_test(tc, test_prefix_reuse_and_lru);
    tcase_add_test(tc, test_prefix_sliding_window_rule);
    tcase_add_test(tc, test_state_slots_and_snapshots);
    tcase_add_loop_test(tc, test_random_shared_invariants, 0, 4);
    suite_add_tcase(s, tc);
    return check_run(s, 0) ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* kv_cache.c — paged KV block pools, reference-counted blocks, per-sequence block tables, fork, the prefix cache
 * (chained block hashes, LRU eviction), recurrent-state slots and state snapshots (see kv_cache.h). */
#include "kv_cache.h"

#include "errors.h"
#include "prefix_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kv_group {
    berth_kv_group_desc desc; /* copied: the plugin's array outlives us, but a copy keeps this self-contained */
    int sliding;              /* kind SLIDING with window > 0: blocks behind the window are released */
    uint64_t head_stride, token_stride, k_plane_bytes; /* K */
    uint64_t v_head_stride, v_token_stride;             /* V */
    uint64_t layer_stride, block_stride;
    int32_t n_blocks;
    int32_t seq_cap;          /* most blocks one sequence holds at once */
    berth_buffer *pool;       /* NULL without a backend */
    int32_t *free_list;       /* stack of free (unreferenced, unindexed) block ids; n_free valid entries */
    int32_t n_free;
    /* Per block: references from sequence tables; prefix-cache identity (hashed: indexed under hash, with its
     * parent's hash and its tokens to rule out collisions); LRU links while unreferenced but indexed. */
    int32_t *ref;
    uint8_t *hashed;
    uint64_t *hash, *parent;
    int32_t *tokens;          /* [n_blocks][block_size] */
    int32_t *lru_prev, *lru_next;
    int32_t lru_head, lru_tail, n_cached;
    struct prefix_map *index; /* hash -> block */
};

struct kv_seq {
    int live;
    int32_t len;
    int32_t *table;           /* [n_groups][max_blocks_per_seq], -1 = none */
    int32_t *first_live;      /* [n_groups]: lowest table index that may still hold a block */
    int32_t *toks;            /* token ids at positions [0, n_toks) (as published) */
    int32_t n_toks, toks_cap;
    int32_t n_hashed;         /* leading full blocks whose chain hash is known */
    uint64_t chain;           /* hash of block n_hashed - 1 (PREFIX_HASH_ROOT when none) */
};

struct kv_state {
    berth_state_desc desc;
    uint64_t slot_bytes;
    berth_buffer *seq_pool;   /* max_seqs slots, slot = sequence id */
    berth_buffer *snap_pool;  /* n_snapshots slots */
};

struct kv_cache {
    const berth_backend_api *be;
    berth_stream *stream;     /* for buffer_copy / buffer_fill (CoW, state slots); set by kv_cache_set_stream */
    struct kv_cache_params p;
    int32_t elem_size;
    int32_t n_groups;
    struct kv_group *groups;
    int32_t max_blocks;       /* table width per sequence and group: ceil(max_seq_len / block_size) */
    struct kv_seq *seqs;      /* [max_seqs] */
    int32_t n_states;
    struct kv_state *states;
    /* Snapshots: slot -> key, LRU of the used ones (all are evictable: no sequence references a snapshot). */
    struct prefix_map *snap_index;
    uint64_t *snap_key;
    uint8_t *snap_used;
    int32_t *snap_prev, *snap_next;
    int32_t snap_head, snap_tail, n_snap_used;
    struct kv_cache_counters counters;
};

static int32_t ceil_div(int64_t a, int64_t b) { return (int32_t)((a + b - 1) / b); }

static int32_t dtype_size(berth_dtype t)
{
    switch (t) {
    case BERTH_DTYPE_F32: return 4;
    case BERTH_DTYPE_F16:
    case BERTH_DTYPE_BF16: return 2;
    default: return 0;
    }
}

/* Blocks one sequence can hold in a group at once. Sliding: a step whose queries sit at [p, p + C) sees keys
 * p - window + 1 .. p + C - 1, window + C - 1 positions, which touch at most ceil((window + C - 1 - 1) / bs) + 1
 * blocks; ceil((window + C - 1) / bs) + 1 is the simple safe bound. */
static int32_t seq_block_cap(const struct kv_cache *kv, const struct kv_group *g)
{
    int32_t cap = kv->max_blocks;
    if (g->sliding) {
        int32_t s = ceil_div((int64_t)g->desc.window + kv->p.max_chunk - 1, kv->p.block_size) + 1;
        if (s < cap) cap = s;
    }
    return cap;
}

/* Split memory_bytes across groups (water-filling): all uncapped groups get the same block count N (a share
 * proportional to bytes per token); a group whose cap (max_seqs sequences at their per-sequence bound) is below
 * N gets its cap and the memory it leaves goes to the rest. */
static berth_status split_memory(struct kv_cache *kv)
{
    int32_t ng = kv->n_groups;
    int *capped = calloc((size_t)ng, sizeof *capped);
    if (!capped) return berth_fail(BERTH_E_NOMEM, "KV cache: out of host memory");
    int changed = 1;
    int64_t n_common = 0;
    while (changed) {
        changed = 0;
        uint64_t left = kv->p.memory_bytes, per_block = 0;
        for (int32_t g = 0; g < ng; g++) {
            const struct kv_group *gr = &kv->groups[g];
            uint64_t capbytes = (uint64_t)kv->p.max_seqs * (uint64_t)gr->seq_cap * gr->block_stride;
            if (capped[g])
                left = left > capbytes ? left - capbytes : 0;
            else
                per_block += gr->block_stride;
        }
        if (per_block == 0) break;
        n_common = (int64_t)(left / per_block);
        for (int32_t g = 0; g < ng; g++) {
            const struct kv_group *gr = &kv->groups[g];
            if (!capped[g] && (int64_t)kv->p.max_seqs * gr->seq_cap <= n_common) {
                capped[g] = 1;
                changed = 1;
            }
        }
    }
    for (int32_t g = 0; g < ng; g++) {
        struct kv_group *gr = &kv->groups[g];
        int64_t n = capped[g] ? (int64_t)kv->p.max_seqs * gr->seq_cap : n_common;
        if (n > INT32_MAX) n = INT32_MAX;
        gr->n_blocks = (int32_t)n;
    }
    free(capped);
    for (int32_t g = 0; g < ng; g++) {
        const struct kv_group *gr = &kv->groups[g];
        if (gr->n_blocks < 1) {
            uint64_t all = 0;
            for (int32_t h = 0; h < ng; h++) all += kv->groups[h].block_stride;
            return berth_fail(BERTH_E_INVALID,
                              "[kv] memory = %llu bytes cannot hold one block of each page group (needs %llu; "
                              "group '%s' has %llu-byte blocks)",
                              (unsigned long long)kv->p.memory_bytes, (unsigned long long)all, gr->desc.name,
                              (unsigned long long)gr->block_stride);
        }
    }
    return BERTH_OK;
}

static berth_status init_group(struct kv_cache *kv, struct kv_group *gr, const berth_kv_group_desc *d, int32_t idx)
{
    memset(gr, 0, sizeof *gr);
    size_t sz = d->struct_size < sizeof gr->desc ? d->struct_size : sizeof gr->desc;
    memcpy(&gr->desc, d, sz);
    gr->desc.struct_size = sizeof gr->desc;
    gr->desc.name[sizeof gr->desc.name - 1] = '\0';
    if (!gr->desc.name[0]) snprintf(gr->desc.name, sizeof gr->desc.name, "group%d", (int)idx);
    if (gr->desc.n_layers < 1 || gr->desc.n_kv_heads < 1 || gr->desc.head_dim < 1 || gr->desc.head_dim_v < 0)
        return berth_fail(BERTH_E_INVALID,
                          "KV page group '%s' has a bad geometry (n_layers %d, n_kv_heads %d, head_dim %d, "
                          "head_dim_v %d)",
                          gr->desc.name, (int)gr->desc.n_layers, (int)gr->desc.n_kv_heads, (int)gr->desc.head_dim,
                          (int)gr->desc.head_dim_v);
    gr->sliding = gr->desc.kind == BERTH_KV_SLIDING && gr->desc.window > 0;
    gr->head_stride = (uint64_t)gr->desc.head_dim * (uint64_t)kv->elem_size;
    gr->token_stride = (uint64_t)gr->desc.n_kv_heads * gr->head_stride;
    gr->k_plane_bytes = (uint64_t)kv->p.block_size * gr->token_stride;
    gr->v_head_stride = (uint64_t)gr->desc.head_dim_v * (uint64_t)kv->elem_size;
    gr->v_token_stride = (uint64_t)gr->desc.n_kv_heads * gr->v_head_stride;
    gr->layer_stride = gr->k_plane_bytes + (uint64_t)kv->p.block_size * gr->v_token_stride;
    gr->block_stride = (uint64_t)gr->desc.n_layers * gr->layer_stride;
    gr->seq_cap = seq_block_cap(kv, gr);
    return BERTH_OK;
}


/* ---- LRU lists (intrusive, by index) ---- */
static void lru_unlink(int32_t *prev, int32_t *next, int32_t *head, int32_t *tail, int32_t b)
{
    if (prev[b] >= 0) next[prev[b]] = next[b]; else *head = next[b];
    if (next[b] >= 0) prev[next[b]] = prev[b]; else *tail = prev[b];
    prev[b] = next[b] = -1;
}

static void lru_push_tail(int32_t *prev, int32_t *next, int32_t *head, int32_t *tail, int32_t b)
{
    prev[b] = *tail;
    next[b] = -1;
    if (*tail >= 0) next[*tail] = b; else *head = b;
    *tail = b;
}

static berth_status fail_backend(berth_status st, const char *what)
{
    char inner[512];
    snprintf(inner, sizeof inner, "%s", berth_last_error());
    return berth_fail(st, "KV cache: %s: %s", what, inner[0] ? inner : berth_status_str(st));
}

static berth_status alloc_group_arrays(struct kv_group *gr, int32_t bs)
{
    size_t n = (size_t)gr->n_blocks;
    gr->free_list = malloc(n * sizeof *gr->free_list);
    gr->ref = calloc(n, sizeof *gr->ref);
    gr->hashed = calloc(n, 1);
    gr->hash = calloc(n, sizeof *gr->hash);
    gr->parent = calloc(n, sizeof *gr->parent);
    gr->tokens = malloc(n * (size_t)bs * sizeof *gr->tokens);
    gr->lru_prev = malloc(n * sizeof *gr->lru_prev);
    gr->lru_next = malloc(n * sizeof *gr->lru_next);
    if (!gr->free_list || !gr->ref || !gr->hashed || !gr->hash || !gr->parent || !gr->tokens || !gr->lru_prev ||
        !gr->lru_next)
        return berth_fail(BERTH_E_NOMEM, "KV cache: out of host memory");
    /* Hand out low ids first: the stack pops from the end. */
    for (int32_t b = 0; b < gr->n_blocks; b++) {
        gr->free_list[b] = gr->n_blocks - 1 - b;
        gr->lru_prev[b] = gr->lru_next[b] = -1;
    }
    gr->n_free = gr->n_blocks;
    gr->lru_head = gr->lru_tail = -1;
    return prefix_map_create(gr->n_blocks, &gr->index);
}

static berth_status alloc_states(struct kv_cache *kv, const berth_memory_layout *layout)
{
    kv->n_states = layout->n_states > 0 ? layout->n_states : 0;
    if (kv->n_states == 0) return BERTH_OK;
    kv->states = calloc((size_t)kv->n_states, sizeof *kv->states);
    if (!kv->states) return berth_fail(BERTH_E_NOMEM, "KV cache: out of host memory");
    for (int32_t i = 0; i < kv->n_states; i++) {
        const berth_state_desc *d = layout->states ? layout->states[i] : NULL;
        if (!d || d->ndim < 1 || d->ndim > 3 || (dtype_size(d->dtype) == 0 && d->dtype != BERTH_DTYPE_I32))
            return berth_fail(BERTH_E_INVALID, "memory layout: state %d has a bad shape or dtype", (int)i);
        struct kv_state *s = &kv->states[i];
        size_t sz = d->struct_size < sizeof s->desc ? d->struct_size : sizeof s->desc;
        memcpy(&s->desc, d, sz);
        s->desc.name[sizeof s->desc.name - 1] = '\0';
        uint64_t bytes = d->dtype == BERTH_DTYPE_I32 ? 4 : (uint64_t)dtype_size(d->dtype);
        for (int j = 0; j < d->ndim; j++) {
            if (d->ne[j] < 1)
                return berth_fail(BERTH_E_INVALID, "memory layout: state '%s' has ne[%d] = %lld", s->desc.name, j,
                                  (long long)d->ne[j]);
            bytes *= (uint64_t)d->ne[j];
        }
        s->slot_bytes = bytes;
        if (!kv->be) continue;
        berth_status st = kv->be->vt->buffer_alloc(kv->be->be, bytes * (uint64_t)kv->p.max_seqs, BERTH_USAGE_STATE,
                                                   &s->seq_pool);
        if (st) {
            s->seq_pool = NULL;
            return fail_backend(st, "cannot allocate a recurrent-state pool");
        }
        if (kv->p.n_snapshots > 0) {
            st = kv->be->vt->buffer_alloc(kv->be->be, bytes * (uint64_t)kv->p.n_snapshots, BERTH_USAGE_STATE,
                                          &s->snap_pool);
            if (st) {
                s->snap_pool = NULL;
                return fail_backend(st, "cannot allocate a state-snapshot pool");
            }
        }
    }
    if (kv->p.n_snapshots > 0) {
        size_t n = (size_t)kv->p.n_snapshots;
        kv->snap_key = calloc(n, sizeof *kv->snap_key);
        kv->snap_used = calloc(n, 1);
        kv->snap_prev = malloc(n * sizeof *kv->snap_prev);
        kv->snap_next = malloc(n * sizeof *kv->snap_next);
        if (!kv->snap_key || !kv->snap_used || !kv->snap_prev || !kv->snap_next)
            return berth_fail(BERTH_E_NOMEM, "KV cache: out of host memory");
        for (size_t i = 0; i < n; i++) kv->snap_prev[i] = kv->snap_next[i] = -1;
        kv->snap_head = kv->snap_tail = -1;
        return prefix_map_create(kv->p.n_snapshots, &kv->snap_index);
    }
    return BERTH_OK;
}

berth_status kv_cache_create(const berth_backend_api *be, const berth_memory_layout *layout,
                             const struct kv_cache_params *p, struct kv_cache **out)
{
    *out = NULL;
    if (p->block_size < 1)
        return berth_fail(BERTH_E_INVALID, "[kv] block_size = %d must be at least 1", (int)p->block_size);
    if (p->max_seqs < 1 || p->max_seq_len < 1 || p->max_chunk < 1)
        return berth_fail(BERTH_E_INVALID, "KV cache: max_seqs (%d), max_seq_len (%d) and max_chunk (%d) must be "
                          "positive", (int)p->max_seqs, (int)p->max_seq_len, (int)p->max_chunk);
    if (p->n_snapshots < 0)
        return berth_fail(BERTH_E_INVALID, "KV cache: n_snapshots = %d must not be negative", (int)p->n_snapshots);
    if (dtype_size(p->dtype) == 0)
        return berth_fail(BERTH_E_UNSUPPORTED, "KV cache: dtype %d is not a KV dtype (f32, f16, bf16)",
                          (int)p->dtype);
    if (layout->n_kv_groups < 0)
        return berth_fail(BERTH_E_INVALID, "memory layout reports %d KV page groups", (int)layout->n_kv_groups);

    struct kv_cache *kv = calloc(1, sizeof *kv);
    if (!kv) return berth_fail(BERTH_E_NOMEM, "KV cache: out of host memory");
    kv->be = be;
    kv->p = *p;
    kv->elem_size = dtype_size(p->dtype);
    kv->n_groups = layout->n_kv_groups;
    kv->max_blocks = ceil_div(p->max_seq_len, p->block_size);
    kv->groups = calloc((size_t)(kv->n_groups ? kv->n_groups : 1), sizeof *kv->groups);
    kv->seqs = calloc((size_t)p->max_seqs, sizeof *kv->seqs);
    berth_status st = BERTH_OK;
    if (!kv->groups || !kv->seqs) {
        st = berth_fail(BERTH_E_NOMEM, "KV cache: out of host memory");
        goto fail;
    }
    for (int32_t g = 0; g < kv->n_groups; g++) {
        if (!layout->kv_groups || !layout->kv_groups[g]) {
            st = berth_fail(BERTH_E_INVALID, "memory layout: KV page group %d is NULL", (int)g);
            goto fail;
        }
        st = init_group(kv, &kv->groups[g], layout->kv_groups[g], g);
        if (st) goto fail;
    }
    if (kv->n_groups > 0) {
        st = split_memory(kv);
        if (st) goto fail;
    }
    for (int32_t g = 0; g < kv->n_groups; g++) {
        struct kv_group *gr = &kv->groups[g];
        st = alloc_group_arrays(gr, p->block_size);
        if (st) goto fail;
        if (be) {
            uint64_t bytes = (uint64_t)gr->n_blocks * gr->block_stride;
            st = be->vt->buffer_alloc(be->be, bytes, BERTH_USAGE_KV, &gr->pool);
            if (st) {
                char inner[512];
                snprintf(inner, sizeof inner, "%s", berth_last_error());
                st = berth_fail(st, "KV cache: cannot allocate %llu bytes for group '%s' (%d blocks; lower [kv] "
                                "memory): %s",
                                (unsigned long long)bytes, gr->desc.name, (int)gr->n_blocks, inner);
                gr->pool = NULL;
                goto fail;
            }
        }
    }
    st = alloc_states(kv, layout);
    if (st) goto fail;
    for (int32_t s = 0; s < p->max_seqs; s++) {
        struct kv_seq *sq = &kv->seqs[s];
        size_t n = (size_t)(kv->n_groups ? kv->n_groups : 1);
        sq->table = malloc(n * (size_t)kv->max_blocks * sizeof *sq->table);
        sq->first_live = calloc(n, sizeof *sq->first_live);
        if (!sq->table || !sq->first_live) {
            st = berth_fail(BERTH_E_NOMEM, "KV cache: out of host memory for block tables");
            goto fail;
        }
        for (size_t i = 0; i < n * (size_t)kv->max_blocks; i++) sq->table[i] = -1;
    }
    *out = kv;
    return BERTH_OK;
fail:
    kv_cache_free(kv);
    return st;
}

void kv_cache_free(struct kv_cache *kv)
{
    if (!kv) return;
    if (kv->groups) {
        for (int32_t g = 0; g < kv->n_groups; g++) {
            struct kv_group *gr = &kv->groups[g];
            if (gr->pool) kv->be->vt->buffer_free(kv->be->be, gr->pool);
            free(gr->free_list);
            free(gr->ref);
            free(gr->hashed);
            free(gr->hash);
            free(gr->parent);
            free(gr->tokens);
            free(gr->lru_prev);
            free(gr->lru_next);
            prefix_map_free(gr->index);
        }
    }
    if (kv->states) {
        for (int32_t i = 0; i < kv->n_states; i++) {
            if (kv->states[i].seq_pool) kv->be->vt->buffer_free(kv->be->be, kv->states[i].seq_pool);
            if (kv->states[i].snap_pool) kv->be->vt->buffer_free(kv->be->be, kv->states[i].snap_pool);
        }
    }
    if (kv->seqs) {
        for (int32_t s = 0; s < kv->p.max_seqs; s++) {
            free(kv->seqs[s].table);
            free(kv->seqs[s].first_live);
            free(kv->seqs[s].toks);
        }
    }
    free(kv->states);
    prefix_map_free(kv->snap_index);
    free(kv->snap_key);
    free(kv->snap_used);
    free(kv->snap_prev);
    free(kv->snap_next);
    free(kv->groups);
    free(kv->seqs);
    free(kv);
}

void kv_cache_set_stream(struct kv_cache *kv, berth_stream *s) { kv->stream = s; }
int32_t kv_n_groups(const struct kv_cache *kv) { return kv->n_groups; }
int32_t kv_block_size(const struct kv_cache *kv) { return kv->p.block_size; }
const char *kv_group_name(const struct kv_cache *kv, int32_t g) { return kv->groups[g].desc.name; }
int32_t kv_blocks_total(const struct kv_cache *kv, int32_t g) { return kv->groups[g].n_blocks; }
int32_t kv_blocks_in_use(const struct kv_cache *kv, int32_t g)
{
    return kv->groups[g].n_blocks - kv->groups[g].n_free - kv->groups[g].n_cached;
}
int32_t kv_blocks_cached(const struct kv_cache *kv, int32_t g) { return kv->groups[g].n_cached; }
int32_t kv_blocks_available(const struct kv_cache *kv, int32_t g)
{
    return kv->groups[g].n_free + kv->groups[g].n_cached;
}
int32_t kv_block_refs(const struct kv_cache *kv, int32_t g, int32_t block)
{
    if (g < 0 || g >= kv->n_groups || block < 0 || block >= kv->groups[g].n_blocks) return -1;
    return kv->groups[g].ref[block];
}
int kv_group_is_sliding(const struct kv_cache *kv, int32_t g) { return kv->groups[g].sliding; }
int32_t kv_group_seq_cap(const struct kv_cache *kv, int32_t g) { return kv->groups[g].seq_cap; }
int32_t kv_max_blocks_per_seq(const struct kv_cache *kv, int32_t g) { (void)g; return kv->max_blocks; }
uint64_t kv_block_bytes(const struct kv_cache *kv, int32_t g) { return kv->groups[g].block_stride; }
const struct kv_cache_counters *kv_counters(const struct kv_cache *kv) { return &kv->counters; }

static int32_t *seq_table(const struct kv_cache *kv, int32_t seq, int32_t g)
{
    return kv->seqs[seq].table + (size_t)g * (size_t)kv->max_blocks;
}

static int seq_valid(const struct kv_cache *kv, int32_t seq)
{
    return seq >= 0 && seq < kv->p.max_seqs && kv->seqs[seq].live;
}

/* ---- block lifecycle: free -> referenced -> (indexed: cached in LRU | not: free) ---- */

static void unindex(struct kv_group *gr, int32_t b)
{
    if (!gr->hashed[b]) return;
    if (prefix_map_get(gr->index, gr->hash[b]) == b) prefix_map_del(gr->index, gr->hash[b]);
    gr->hashed[b] = 0;
}

/* A block with no references: from the free list, else the least recently used cached one (evicted). */
static int32_t take_block(struct kv_cache *kv, struct kv_group *gr)
{
    int32_t b;
    if (gr->n_free > 0) {
        b = gr->free_list[--gr->n_free];
    } else {
        b = gr->lru_head;
        lru_unlink(gr->lru_prev, gr->lru_next, &gr->lru_head, &gr->lru_tail, b);
        gr->n_cached--;
        unindex(gr, b);
        kv->counters.evicted_blocks++;
    }
    gr->ref[b] = 1;
    return b;
}

static void ref_block(struct kv_group *gr, int32_t b)
{
    if (gr->ref[b] == 0 && gr->hashed[b]) {
        lru_unlink(gr->lru_prev, gr->lru_next, &gr->lru_head, &gr->lru_tail, b);
        gr->n_cached--;
    }
    gr->ref[b]++;
}

static void unref_block(struct kv_group *gr, int32_t b)
{
    if (--gr->ref[b] > 0) return;
    if (gr->hashed[b]) {
        lru_push_tail(gr->lru_prev, gr->lru_next, &gr->lru_head, &gr->lru_tail, b);
        gr->n_cached++;
    } else {
        gr->free_list[gr->n_free++] = b;
    }
}

static berth_status zero_states(struct kv_cache *kv, int32_t seq)
{
    if (!kv->be || !kv->stream) return BERTH_OK;
    for (int32_t i = 0; i < kv->n_states; i++) {
        berth_status st = kv->be->vt->buffer_fill(kv->be->be, kv->stream, kv->states[i].seq_pool,
                                                  (uint64_t)seq * kv->states[i].slot_bytes, 0,
                                                  kv->states[i].slot_bytes);
        if (st) return fail_backend(st, "cannot zero a recurrent-state slot");
    }
    return BERTH_OK;
}

static berth_status take_seq(struct kv_cache *kv, int32_t *seq)
{
    for (int32_t s = 0; s < kv->p.max_seqs; s++) {
        struct kv_seq *sq = &kv->seqs[s];
        if (!sq->live) {
            sq->live = 1;
            sq->len = 0;
            sq->n_toks = 0;
            sq->n_hashed = 0;
            sq->chain = PREFIX_HASH_ROOT;
            for (int32_t g = 0; g < kv->n_groups; g++) sq->first_live[g] = 0;
            *seq = s;
            return BERTH_OK;
        }
    }
    return berth_fail(BERTH_E_NOMEM, "all %d sequence slots of the KV cache are in use (raise [scheduler] max_seqs)",
                      (int)kv->p.max_seqs);
}

berth_status kv_seq_new(struct kv_cache *kv, int32_t *seq)
{
    berth_status st = take_seq(kv, seq);
    if (st) return st;
    if (kv->n_states > 0 && kv->be && !kv->stream) {
        kv->seqs[*seq].live = 0;
        return berth_fail(BERTH_E_INTERNAL, "KV cache: recurrent states need a stream (kv_cache_set_stream)");
    }
    st = zero_states(kv, *seq);
    if (st) kv->seqs[*seq].live = 0;
    return st;
}

void kv_seq_free(struct kv_cache *kv, int32_t seq)
{
    if (!seq_valid(kv, seq)) return;
    struct kv_seq *sq = &kv->seqs[seq];
    for (int32_t g = 0; g < kv->n_groups; g++) {
        struct kv_group *gr = &kv->groups[g];
        int32_t *t = seq_table(kv, seq, g);
        /* Last block first: a cached chain then leaves the LRU list tail first, so its head (the part other
         * requests share, and without which the rest of the chain cannot hit) is evicted last. */
        for (int32_t i = kv->max_blocks - 1; i >= 0; i--) {
            if (t[i] >= 0) unref_block(gr, t[i]);
            t[i] = -1;
        }
        sq->first_live[g] = 0;
    }
    sq->live = 0;
    sq->len = 0;
    sq->n_toks = 0;
    sq->n_hashed = 0;
}

int32_t kv_seq_len(const struct kv_cache *kv, int32_t seq) { return seq_valid(kv, seq) ? kv->seqs[seq].len : 0; }

int32_t kv_seq_block(const struct kv_cache *kv, int32_t seq, int32_t g, int32_t pos)
{
    if (!seq_valid(kv, seq) || g < 0 || g >= kv->n_groups || pos < 0 || pos >= kv->p.max_seq_len) return -1;
    return seq_table(kv, seq, g)[pos / kv->p.block_size];
}

/* Table index below which a sliding group's blocks are invisible to every query at position >= first_q: the
 * lowest visible key is first_q - window + 1, so block i is dead when (i + 1) * bs <= first_q - window + 1. */
static int32_t sliding_dead_below(const struct kv_cache *kv, const struct kv_group *gr, int32_t first_q)
{
    int64_t lowest = (int64_t)first_q - gr->desc.window + 1;
    if (lowest <= 0) return 0;
    return (int32_t)(lowest / kv->p.block_size);
}

static void release_sliding(struct kv_cache *kv, int32_t seq)
{
    struct kv_seq *sq = &kv->seqs[seq];
    for (int32_t g = 0; g < kv->n_groups; g++) {
        struct kv_group *gr = &kv->groups[g];
        if (!gr->sliding) continue;
        int32_t dead = sliding_dead_below(kv, gr, sq->len);
        int32_t *t = seq_table(kv, seq, g);
        for (int32_t i = sq->first_live[g]; i < dead && i < kv->max_blocks; i++) {
            if (t[i] >= 0) unref_block(gr, t[i]);
            t[i] = -1;
        }
        if (dead > sq->first_live[g]) sq->first_live[g] = dead;
    }
}

int32_t kv_seq_blocks_needed(const struct kv_cache *kv, int32_t seq, int32_t g, int32_t new_len)
{
    if (!seq_valid(kv, seq) || g < 0 || g >= kv->n_groups) return 0;
    const struct kv_seq *sq = &kv->seqs[seq];
    const struct kv_group *gr = &kv->groups[g];
    if (new_len <= sq->len) return 0;
    int32_t bs = kv->p.block_size, hi = ceil_div(new_len < kv->p.max_seq_len ? new_len : kv->p.max_seq_len, bs);
    int32_t cow = sq->len % bs != 0 ? sq->len / bs : -1;
    int32_t lo = sq->first_live[g];
    if (gr->sliding) {
        int32_t dead = sliding_dead_below(kv, gr, sq->len);
        if (dead > lo) lo = dead;
    }
    const int32_t *t = seq_table(kv, seq, g);
    int32_t need = 0;
    for (int32_t i = lo; i < hi; i++)
        if (t[i] < 0 || (i == cow && gr->ref[t[i]] > 1)) need++;
    return need;
}

berth_status kv_seq_ensure(struct kv_cache *kv, int32_t seq, int32_t new_len)
{
    if (!seq_valid(kv, seq)) return berth_fail(BERTH_E_INVALID, "KV cache: sequence %d is not in use", (int)seq);
    struct kv_seq *sq = &kv->seqs[seq];
    if (new_len < sq->len)
        return berth_fail(BERTH_E_INVALID, "KV cache: sequence %d cannot shrink from %d to %d tokens", (int)seq,
                          (int)sq->len, (int)new_len);
    if (new_len > kv->p.max_seq_len)
        return berth_fail(BERTH_E_INVALID, "KV cache: sequence %d of %d tokens exceeds the limit of %d", (int)seq,
                          (int)new_len, (int)kv->p.max_seq_len);
    if (new_len - sq->len > kv->p.max_chunk)
        return berth_fail(BERTH_E_INVALID, "KV cache: sequence %d grows by %d tokens in one step, more than "
                          "max_chunk %d", (int)seq, (int)(new_len - sq->len), (int)kv->p.max_chunk);
    int32_t bs = kv->p.block_size;
    int32_t hi = ceil_div(new_len, bs); /* table entries [0, hi) must exist, except released ones */
    /* The block the step starts writing into is shared (a fork's last partial block): copy it first. */
    int32_t cow = new_len > sq->len && sq->len % bs != 0 ? sq->len / bs : -1;

    /* Release first, so the blocks freed can serve this very step. */
    release_sliding(kv, seq);
    /* Check every group before touching any, so exhaustion allocates nothing. */
    for (int32_t g = 0; g < kv->n_groups; g++) {
        const struct kv_group *gr = &kv->groups[g];
        const int32_t *t = seq_table(kv, seq, g);
        int32_t need = 0;
        for (int32_t i = sq->first_live[g]; i < hi; i++)
            if (t[i] < 0 || (i == cow && gr->ref[t[i]] > 1)) need++;
        if (need > gr->n_free + gr->n_cached)
            return berth_fail(BERTH_E_DEVICE_OOM,
                              "KV cache exhausted: group '%s' needs %d more blocks, %d free (raise [kv] memory)",
                              gr->desc.name, (int)need, (int)(gr->n_free + gr->n_cached));
    }
    for (int32_t g = 0; g < kv->n_groups; g++) {
        struct kv_group *gr = &kv->groups[g];
        int32_t *t = seq_table(kv, seq, g);
        for (int32_t i = sq->first_live[g]; i < hi; i++) {
            if (t[i] >= 0 && i == cow && gr->ref[t[i]] > 1) {
                int32_t old = t[i], nb = take_block(kv, gr);
                if (gr->pool && kv->stream) {
                    berth_status st = kv->be->vt->buffer_copy(kv->be->be, kv->stream, gr->pool,
                                                              (uint64_t)nb * gr->block_stride, gr->pool,
                                                              (uint64_t)old * gr->block_stride, gr->block_stride);
                    if (st) {
                        unref_block(gr, nb);
                        return fail_backend(st, "copy-on-write of a shared block failed");
                    }
                }
                unref_block(gr, old);
                t[i] = nb;
                kv->counters.cow_copies++;
            } else if (t[i] < 0) {
                t[i] = take_block(kv, gr);
            }
        }
    }
    sq->len = new_len;
    return BERTH_OK;
}

/* Copy every state of slot src_slot (a sequence's, or a snapshot's with src_is_snap) to dst_slot likewise. */
static berth_status copy_states(struct kv_cache *kv, int32_t dst_slot, int dst_is_snap, int32_t src_slot,
                                int src_is_snap)
{
    if (!kv->be || !kv->stream) return BERTH_OK;
    for (int32_t i = 0; i < kv->n_states; i++) {
        struct kv_state *s = &kv->states[i];
        berth_buffer *dst = dst_is_snap ? s->snap_pool : s->seq_pool;
        berth_buffer *src = src_is_snap ? s->snap_pool : s->seq_pool;
        berth_status st = kv->be->vt->buffer_copy(kv->be->be, kv->stream, dst, (uint64_t)dst_slot * s->slot_bytes,
                                                  src, (uint64_t)src_slot * s->slot_bytes, s->slot_bytes);
        if (st) return fail_backend(st, "cannot copy a recurrent state");
    }
    return BERTH_OK;
}

static berth_status grow_toks(struct kv_seq *sq, int32_t need)
{
    if (need <= sq->toks_cap) return BERTH_OK;
    int32_t cap = sq->toks_cap ? sq->toks_cap : 64;
    while (cap < need) cap *= 2;
    int32_t *t = realloc(sq->toks, (size_t)cap * sizeof *t);
    if (!t) return berth_fail(BERTH_E_NOMEM, "KV cache: out of host memory");
    sq->toks = t;
    sq->toks_cap = cap;
    return BERTH_OK;
}

berth_status kv_seq_fork(struct kv_cache *kv, int32_t src, int32_t *dst)
{
    *dst = -1;
    if (!seq_valid(kv, src)) return berth_fail(BERTH_E_INVALID, "KV cache: sequence %d is not in use", (int)src);
    int32_t d = -1; /* set by take_seq on success; initialised for gcc -O2 -Wmaybe-uninitialized */
    berth_status st = take_seq(kv, &d);
    if (st) return st;
    struct kv_seq *s = &kv->seqs[src], *q = &kv->seqs[d];
    if ((st = grow_toks(q, s->n_toks))) {
        q->live = 0;
        return st;
    }
    if ((st = copy_states(kv, d, 0, src, 0))) {
        q->live = 0;
        return st;
    }
    for (int32_t g = 0; g < kv->n_groups; g++) {
        const int32_t *ts = seq_table(kv, src, g);
        int32_t *td = seq_table(kv, d, g);
        for (int32_t i = 0; i < kv->max_blocks; i++) {
            td[i] = ts[i];
            if (ts[i] >= 0) ref_block(&kv->groups[g], ts[i]);
        }
        q->first_live[g] = s->first_live[g];
    }
    q->len = s->len;
    if (s->n_toks) memcpy(q->toks, s->toks, (size_t)s->n_toks * sizeof *q->toks);
    q->n_toks = s->n_toks;
    q->n_hashed = s->n_hashed;
    q->chain = s->chain;
    kv->counters.forks++;
    *dst = d;
    return BERTH_OK;
}

/* ---- state snapshots: an LRU pool of slots keyed by the chain hash of the block they end ---- */

static int32_t snap_take(struct kv_cache *kv)
{
    int32_t n = kv->p.n_snapshots;
    for (int32_t i = 0; i < n; i++)
        if (!kv->snap_used[i]) return i;
    int32_t v = kv->snap_head; /* all used: evict the least recently used */
    lru_unlink(kv->snap_prev, kv->snap_next, &kv->snap_head, &kv->snap_tail, v);
    prefix_map_del(kv->snap_index, kv->snap_key[v]);
    kv->snap_used[v] = 0;
    kv->n_snap_used--;
    kv->counters.evicted_snapshots++;
    return v;
}

berth_status kv_snapshot_save(struct kv_cache *kv, int32_t seq, uint64_t key)
{
    if (!seq_valid(kv, seq)) return berth_fail(BERTH_E_INVALID, "KV cache: sequence %d is not in use", (int)seq);
    if (kv->p.n_snapshots == 0 || kv->n_states == 0) return BERTH_OK;
    int32_t v = prefix_map_get(kv->snap_index, key);
    if (v >= 0) { /* already there: only refresh its recency */
        lru_unlink(kv->snap_prev, kv->snap_next, &kv->snap_head, &kv->snap_tail, v);
        lru_push_tail(kv->snap_prev, kv->snap_next, &kv->snap_head, &kv->snap_tail, v);
        return BERTH_OK;
    }
    v = snap_take(kv);
    berth_status st = copy_states(kv, v, 1, seq, 0);
    if (st) return st;
    st = prefix_map_put(kv->snap_index, key, v);
    if (st) return st;
    kv->snap_key[v] = key;
    kv->snap_used[v] = 1;
    kv->n_snap_used++;
    lru_push_tail(kv->snap_prev, kv->snap_next, &kv->snap_head, &kv->snap_tail, v);
    kv->counters.snapshots_saved++;
    return BERTH_OK;
}

int32_t kv_snapshot_find(const struct kv_cache *kv, uint64_t key)
{
    return kv->snap_index ? prefix_map_get(kv->snap_index, key) : -1;
}

int32_t kv_snapshots_in_use(const struct kv_cache *kv) { return kv->n_snap_used; }

static berth_status snapshot_restore(struct kv_cache *kv, int32_t v, int32_t seq)
{
    berth_status st = copy_states(kv, seq, 0, v, 1);
    if (st) return st;
    lru_unlink(kv->snap_prev, kv->snap_next, &kv->snap_head, &kv->snap_tail, v);
    lru_push_tail(kv->snap_prev, kv->snap_next, &kv->snap_head, &kv->snap_tail, v);
    kv->counters.snapshots_restored++;
    return BERTH_OK;
}

int32_t kv_n_states(const struct kv_cache *kv) { return kv->n_states; }
berth_buffer *kv_state_pool(const struct kv_cache *kv, int32_t i) { return kv->states[i].seq_pool; }
uint64_t kv_state_slot_bytes(const struct kv_cache *kv, int32_t i) { return kv->states[i].slot_bytes; }
const berth_state_desc *kv_state_desc(const struct kv_cache *kv, int32_t i) { return &kv->states[i].desc; }

/* ---- prefix cache: publish full blocks, match and attach cached prefixes ---- */

berth_status kv_seq_publish(struct kv_cache *kv, int32_t seq, int32_t start, const int32_t *ids, int32_t n)
{
    if (!seq_valid(kv, seq)) return berth_fail(BERTH_E_INVALID, "KV cache: sequence %d is not in use", (int)seq);
    struct kv_seq *sq = &kv->seqs[seq];
    if (start != sq->n_toks || start + n > sq->len)
        return berth_fail(BERTH_E_INTERNAL, "KV cache: sequence %d publishes tokens %d..%d, has %d recorded and %d "
                          "ensured", (int)seq, (int)start, (int)(start + n - 1), (int)sq->n_toks, (int)sq->len);
    berth_status st = grow_toks(sq, start + n);
    if (st) return st;
    if (n) memcpy(sq->toks + start, ids, (size_t)n * sizeof *ids);
    sq->n_toks = start + n;
    int32_t bs = kv->p.block_size;
    while ((sq->n_hashed + 1) * bs <= sq->n_toks) {
        int32_t i = sq->n_hashed;
        const int32_t *bt = sq->toks + (size_t)i * (size_t)bs;
        uint64_t parent = sq->chain, h = prefix_hash_block(parent, bt, bs);
        for (int32_t g = 0; g < kv->n_groups; g++) {
            struct kv_group *gr = &kv->groups[g];
            int32_t b = seq_table(kv, seq, g)[i];
            if (b < 0 || gr->hashed[b]) continue; /* released already, or a shared cached block */
            if (prefix_map_get(gr->index, h) >= 0) continue; /* another block holds this content */
            st = prefix_map_put(gr->index, h, b);
            if (st) return st;
            gr->hashed[b] = 1;
            gr->hash[b] = h;
            gr->parent[b] = parent;
            memcpy(gr->tokens + (size_t)b * (size_t)bs, bt, (size_t)bs * sizeof *bt);
        }
        sq->chain = h;
        sq->n_hashed = i + 1;
        /* Recurrent models can resume only where a snapshot was taken: at the end of a step on a boundary. */
        if (kv->n_states > 0 && sq->n_hashed * bs == sq->len && sq->len == sq->n_toks) {
            st = kv_snapshot_save(kv, seq, h);
            if (st) return st;
        }
    }
    return BERTH_OK;
}

/* Cached block of group g holding block i of a prefix with chain hash h (parent hash parent, tokens bt), or -1. */
static int32_t cached_block(const struct kv_cache *kv, const struct kv_group *gr, uint64_t h, uint64_t parent,
                            const int32_t *bt)
{
    int32_t b = prefix_map_get(gr->index, h);
    if (b < 0 || !gr->hashed[b] || gr->parent[b] != parent) return -1;
    if (memcmp(gr->tokens + (size_t)b * (size_t)kv->p.block_size, bt, (size_t)kv->p.block_size * sizeof *bt))
        return -1;
    return b;
}

/* Longest usable cached prefix of ids, in blocks (at most (n - 1) / bs: one token always remains to compute),
 * with the chain hashes of its blocks in hashes[] (caller sizes it (n - 1) / bs + 1). A usable prefix of k blocks
 * has every block 0..k-1 cached in every full group, the blocks a query at position k * bs still sees in every
 * sliding group, and, for recurrent models, a state snapshot at block k - 1. */
static int32_t match_blocks(const struct kv_cache *kv, const int32_t *ids, int32_t n, uint64_t *hashes)
{
    int32_t bs = kv->p.block_size;
    int32_t kmax = n > 0 ? (n - 1) / bs : 0;
    if (kmax > kv->max_blocks) kmax = kv->max_blocks;
    uint64_t parent = PREFIX_HASH_ROOT;
    int32_t kfull = 0;
    /* present[g][i] folded: a sliding group needs only a tail, so record per block whether each group has it. */
    for (; kfull < kmax; kfull++) {
        const int32_t *bt = ids + (size_t)kfull * (size_t)bs;
        uint64_t h = prefix_hash_block(parent, bt, bs);
        int ok = 1;
        for (int32_t g = 0; g < kv->n_groups && ok; g++)
            if (!kv->groups[g].sliding && cached_block(kv, &kv->groups[g], h, parent, bt) < 0) ok = 0;
        if (!ok) break;
        hashes[kfull] = h;
        parent = h;
    }
    for (int32_t k = kfull; k > 0; k--) {
        int ok = 1;
        for (int32_t g = 0; g < kv->n_groups && ok; g++) {
            const struct kv_group *gr = &kv->groups[g];
            if (!gr->sliding) continue;
            for (int32_t i = sliding_dead_below(kv, gr, k * bs); i < k && ok; i++)
                if (cached_block(kv, gr, hashes[i], i ? hashes[i - 1] : PREFIX_HASH_ROOT,
                                 ids + (size_t)i * (size_t)bs) < 0)
                    ok = 0;
        }
        if (ok && kv->n_states > 0 && kv_snapshot_find(kv, hashes[k - 1]) < 0) ok = 0;
        if (ok) return k;
    }
    return 0;
}

int32_t kv_prefix_match(const struct kv_cache *kv, const int32_t *ids, int32_t n)
{
    if (n < 2) return 0;
    uint64_t *hashes = malloc((size_t)((n - 1) / kv->p.block_size + 1) * sizeof *hashes);
    if (!hashes) return 0;
    int32_t k = match_blocks(kv, ids, n, hashes);
    free(hashes);
    return k * kv->p.block_size;
}

berth_status kv_prefix_attach(struct kv_cache *kv, int32_t seq, const int32_t *ids, int32_t n, int32_t *cached)
{
    *cached = 0;
    if (!seq_valid(kv, seq)) return berth_fail(BERTH_E_INVALID, "KV cache: sequence %d is not in use", (int)seq);
    struct kv_seq *sq = &kv->seqs[seq];
    if (sq->len != 0)
        return berth_fail(BERTH_E_INVALID, "KV cache: a prefix attaches only to an empty sequence (%d holds %d)",
                          (int)seq, (int)sq->len);
    if (n < 2) return BERTH_OK;
    int32_t bs = kv->p.block_size;
    uint64_t *hashes = malloc((size_t)((n - 1) / bs + 1) * sizeof *hashes);
    if (!hashes) return berth_fail(BERTH_E_NOMEM, "KV cache: out of host memory");
    int32_t k = match_blocks(kv, ids, n, hashes);
    berth_status st = BERTH_OK;
    if (k > 0) st = grow_toks(sq, k * bs);
    if (k > 0 && kv->n_states > 0 && !st) st = snapshot_restore(kv, kv_snapshot_find(kv, hashes[k - 1]), seq);
    if (k > 0 && !st) {
        for (int32_t g = 0; g < kv->n_groups; g++) {
            struct kv_group *gr = &kv->groups[g];
            int32_t lo = gr->sliding ? sliding_dead_below(kv, gr, k * bs) : 0;
            int32_t *t = seq_table(kv, seq, g);
            for (int32_t i = lo; i < k; i++) {
                int32_t b = cached_block(kv, gr, hashes[i], i ? hashes[i - 1] : PREFIX_HASH_ROOT,
                                         ids + (size_t)i * (size_t)bs);
                ref_block(gr, b);
                t[i] = b;
            }
            sq->first_live[g] = lo;
        }
        sq->len = k * bs;
        memcpy(sq->toks, ids, (size_t)(k * bs) * sizeof *ids);
        sq->n_toks = k * bs;
        sq->n_hashed = k;
        sq->chain = hashes[k - 1];
        kv->counters.hit_tokens += k * bs;
        *cached = k * bs;
    }
    free(hashes);
    return st;
}

void kv_prefix_attach_undo_counters(struct kv_cache *kv, int32_t cached)
{
    if (cached <= 0) return;
    kv->counters.hit_tokens -= cached;
    if (kv->n_states > 0) kv->counters.snapshots_restored--; /* an attach restores one snapshot */
}

int32_t kv_batch_table_width(const struct kv_cache *kv, const struct kv_seq_span *spans, int32_t n_seqs)
{
    int32_t w = 1;
    for (int32_t i = 0; i < n_seqs; i++) {
        int32_t b = ceil_div((int64_t)spans[i].start + spans[i].n, kv->p.block_size);
        if (b > w) w = b;
    }
    return w;
}

berth_status kv_batch_tables(const struct kv_cache *kv, int32_t g, const struct kv_seq_span *spans, int32_t n_seqs,
                             int32_t width, int32_t *block_table, int32_t *slots)
{
    int32_t bs = kv->p.block_size;
    size_t tok = 0;
    for (int32_t i = 0; i < n_seqs; i++) {
        const struct kv_seq_span *sp = &spans[i];
        if (!seq_valid(kv, sp->seq))
            return berth_fail(BERTH_E_INVALID, "KV cache: sequence %d is not in use", (int)sp->seq);
        if (sp->start < 0 || sp->n < 0 || sp->start + sp->n > kv->seqs[sp->seq].len)
            return berth_fail(BERTH_E_INTERNAL,
                              "KV cache: positions %d..%d of sequence %d were not ensured (length %d)",
                              (int)sp->start, (int)(sp->start + sp->n - 1), (int)sp->seq,
                              (int)kv->seqs[sp->seq].len);
        if (ceil_div((int64_t)sp->start + sp->n, bs) > width)
            return berth_fail(BERTH_E_INTERNAL, "KV cache: block table width %d too small", (int)width);
        const int32_t *t = seq_table(kv, sp->seq, g);
        for (int32_t j = 0; j < width; j++) block_table[(size_t)i * (size_t)width + (size_t)j] = j < kv->max_blocks ? t[j] : -1;
        for (int32_t k = 0; k < sp->n; k++) {
            int32_t pos = sp->start + k;
            int32_t b = t[pos / bs];
            if (b < 0)
                return berth_fail(BERTH_E_INTERNAL, "KV cache: position %d of sequence %d has no block in group '%s'",
                                  (int)pos, (int)sp->seq, kv->groups[g].desc.name);
            slots[tok++] = b * bs + pos % bs;
        }
    }
    return BERTH_OK;
}

void kv_group_batch(const struct kv_cache *kv, int32_t g, const berth_tensor *block_table,
                    const berth_tensor *slots, berth_kv_group_batch *out)
{
    const struct kv_group *gr = &kv->groups[g];
    memset(out, 0, sizeof *out); /* also leaves seq_kv_len absent and h_seq_kv_len NULL (see kv_cache.h) */
    berth_kv_view *v = &out->pool;
    v->k_buf = gr->pool;
    v->v_buf = gr->pool;
    v->k_offset = 0;
    v->v_offset = gr->k_plane_bytes;
    v->block_stride = gr->block_stride;
    v->token_stride = gr->token_stride;
    v->head_stride = gr->head_stride;
    v->v_token_stride = gr->v_token_stride;
    v->v_head_stride = gr->v_head_stride;
    v->dtype = kv->p.dtype;
    v->block_size = kv->p.block_size;
    v->n_blocks = gr->n_blocks;
    v->n_kv_heads = gr->desc.n_kv_heads;
    v->head_dim = gr->desc.head_dim;
    v->head_dim_v = gr->desc.head_dim_v;
    out->layer_stride = gr->layer_stride;
    out->block_table = *block_table;
    out->slots = *slots;
}


berth_status kv_cache_validate(const struct kv_cache *kv)
{
    berth_status st = BERTH_OK;
    int32_t bs = kv->p.block_size;
    for (int32_t g = 0; g < kv->n_groups && !st; g++) {
        const struct kv_group *gr = &kv->groups[g];
        const char *name = gr->desc.name;
        int32_t *refs = calloc((size_t)gr->n_blocks, sizeof *refs); /* references counted from the tables */
        uint8_t *seen = calloc((size_t)gr->n_blocks, 1);               /* 1 free list, 2 LRU */
        if (!refs || !seen) {
            free(refs);
            free(seen);
            return berth_fail(BERTH_E_NOMEM, "KV cache: out of host memory");
        }
        if (gr->n_free < 0 || gr->n_free > gr->n_blocks)
            st = berth_fail(BERTH_E_INTERNAL, "group '%s': %d free of %d blocks", name, (int)gr->n_free,
                            (int)gr->n_blocks);
        for (int32_t i = 0; i < gr->n_free && !st; i++) {
            int32_t b = gr->free_list[i];
            if (b < 0 || b >= gr->n_blocks)
                st = berth_fail(BERTH_E_INTERNAL, "group '%s': free list holds bad block %d", name, (int)b);
            else if (seen[b])
                st = berth_fail(BERTH_E_INTERNAL, "group '%s': block %d is on the free list twice", name, (int)b);
            else if (gr->ref[b] != 0 || gr->hashed[b])
                st = berth_fail(BERTH_E_INTERNAL, "group '%s': free block %d has %d references%s", name, (int)b,
                                (int)gr->ref[b], gr->hashed[b] ? " and is indexed" : "");
            else
                seen[b] = 1;
        }
        int32_t n_lru = 0;
        for (int32_t b = gr->lru_head, prev = -1; b >= 0 && !st; prev = b, b = gr->lru_next[b]) {
            if (b >= gr->n_blocks || seen[b] || gr->lru_prev[b] != prev)
                st = berth_fail(BERTH_E_INTERNAL, "group '%s': the cached list is corrupt at block %d", name, (int)b);
            else if (gr->ref[b] != 0 || !gr->hashed[b])
                st = berth_fail(BERTH_E_INTERNAL, "group '%s': cached block %d has %d references%s", name, (int)b,
                                (int)gr->ref[b], gr->hashed[b] ? "" : " and no hash");
            else
                seen[b] = 2, n_lru++;
        }
        if (!st && n_lru != gr->n_cached)
            st = berth_fail(BERTH_E_INTERNAL, "group '%s': %d blocks on the cached list, counted %d", name,
                            (int)n_lru, (int)gr->n_cached);
        for (int32_t s = 0; s < kv->p.max_seqs && !st; s++) {
            const struct kv_seq *sq = &kv->seqs[s];
            const int32_t *t = seq_table(kv, s, g);
            int32_t held = 0;
            for (int32_t i = 0; i < kv->max_blocks && !st; i++) {
                int32_t b = t[i];
                if (b < 0) continue;
                if (!sq->live)
                    st = berth_fail(BERTH_E_INTERNAL, "group '%s': free sequence %d holds block %d", name, (int)s,
                                    (int)b);
                else if (b >= gr->n_blocks)
                    st = berth_fail(BERTH_E_INTERNAL, "group '%s': sequence %d holds bad block %d", name, (int)s,
                                    (int)b);
                else if (seen[b])
                    st = berth_fail(BERTH_E_INTERNAL, "group '%s': block %d is both %s and held by sequence %d", name,
                                    (int)b, seen[b] == 1 ? "free" : "cached", (int)s);
                else if ((int64_t)i * bs >= sq->len)
                    st = berth_fail(BERTH_E_INTERNAL, "group '%s': sequence %d of length %d holds table entry %d",
                                    name, (int)s, (int)sq->len, (int)i);
                else if (gr->hashed[b] && (i >= sq->n_hashed || (i + 1) * bs > sq->n_toks ||
                                           memcmp(gr->tokens + (size_t)b * (size_t)bs, sq->toks + (size_t)i * (size_t)bs,
                                                  (size_t)bs * sizeof(int32_t))))
                    st = berth_fail(BERTH_E_INTERNAL, "group '%s': indexed block %d at entry %d of sequence %d does "
                                    "not hold that sequence's tokens", name, (int)b, (int)i, (int)s);
                else {
                    refs[b]++;
                    held++;
                }
            }
            if (!st && sq->live) {
                /* Every needed entry is present: all of [first_live, ceil(len/bs)). */
                int32_t hi = ceil_div(sq->len, bs);
                for (int32_t i = sq->first_live[g]; i < hi && !st; i++)
                    if (t[i] < 0)
                        st = berth_fail(BERTH_E_INTERNAL, "group '%s': sequence %d misses table entry %d", name,
                                        (int)s, (int)i);
                if (!st && held > gr->seq_cap)
                    st = berth_fail(BERTH_E_INTERNAL, "group '%s': sequence %d holds %d blocks, bound %d", name,
                                    (int)s, (int)held, (int)gr->seq_cap);
            }
        }
        int32_t used = 0;
        for (int32_t b = 0; b < gr->n_blocks && !st; b++) {
            if (refs[b] != gr->ref[b])
                st = berth_fail(BERTH_E_INTERNAL, "group '%s': block %d counts %d references, tables hold %d", name,
                                (int)b, (int)gr->ref[b], (int)refs[b]);
            else if (!seen[b] && refs[b] == 0)
                st = berth_fail(BERTH_E_INTERNAL, "group '%s': block %d is lost (not free, cached or held)", name,
                                (int)b);
            else if (gr->hashed[b] && prefix_map_get(gr->index, gr->hash[b]) != b)
                st = berth_fail(BERTH_E_INTERNAL, "group '%s': block %d is marked indexed but the index disagrees",
                                name, (int)b);
            used += refs[b] > 0;
        }
        if (!st && used + gr->n_free + gr->n_cached != gr->n_blocks)
            st = berth_fail(BERTH_E_INTERNAL, "group '%s': %d used + %d free + %d cached != %d total", name,
                            (int)used, (int)gr->n_free, (int)gr->n_cached, (int)gr->n_blocks);
        if (!st) { /* every index entry is a block marked indexed (cached or held) */
            int32_t hashed = 0;
            for (int32_t b = 0; b < gr->n_blocks; b++) hashed += gr->hashed[b];
            if (hashed != prefix_map_count(gr->index))
                st = berth_fail(BERTH_E_INTERNAL, "group '%s': %d indexed blocks, index holds %d", name, (int)hashed,
                                (int)prefix_map_count(gr->index));
        }
        free(refs);
        free(seen);
    }
    if (!st && kv->snap_index && prefix_map_count(kv->snap_index) != kv->n_snap_used)
        st = berth_fail(BERTH_E_INTERNAL, "snapshots: %d used, index holds %d", (int)kv->n_snap_used,
                        (int)prefix_map_count(kv->snap_index));
    return st;
}

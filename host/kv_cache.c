/* kv_cache.c — paged KV block pools, free-list allocator and per-sequence block tables (see kv_cache.h). */
#include "kv_cache.h"

#include "errors.h"

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
    int32_t *free_list;       /* stack of free block ids; n_free valid entries */
    int32_t n_free;
};

struct kv_seq {
    int live;
    int32_t len;
    int32_t *table;           /* [n_groups][max_blocks_per_seq], -1 = none */
    int32_t *first_live;      /* [n_groups]: lowest table index that may still hold a block */
};

struct kv_cache {
    const berth_backend_api *be;
    struct kv_cache_params p;
    int32_t elem_size;
    int32_t n_groups;
    struct kv_group *groups;
    int32_t max_blocks;       /* table width per sequence and group: ceil(max_seq_len / block_size) */
    struct kv_seq *seqs;      /* [max_seqs] */
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

berth_status kv_cache_create(const berth_backend_api *be, const berth_memory_layout *layout,
                             const struct kv_cache_params *p, struct kv_cache **out)
{
    *out = NULL;
    if (p->block_size < 1)
        return berth_fail(BERTH_E_INVALID, "[kv] block_size = %d must be at least 1", (int)p->block_size);
    if (p->max_seqs < 1 || p->max_seq_len < 1 || p->max_chunk < 1)
        return berth_fail(BERTH_E_INVALID, "KV cache: max_seqs (%d), max_seq_len (%d) and max_chunk (%d) must be "
                          "positive", (int)p->max_seqs, (int)p->max_seq_len, (int)p->max_chunk);
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
        gr->free_list = malloc((size_t)gr->n_blocks * sizeof *gr->free_list);
        if (!gr->free_list) {
            st = berth_fail(BERTH_E_NOMEM, "KV cache: out of host memory for %d blocks of group '%s'",
                            (int)gr->n_blocks, gr->desc.name);
            goto fail;
        }
        /* Pushed in reverse so allocation hands out block 0, 1, 2, ... first. */
        for (int32_t b = 0; b < gr->n_blocks; b++) gr->free_list[b] = gr->n_blocks - 1 - b;
        gr->n_free = gr->n_blocks;
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
            if (kv->groups[g].pool) kv->be->vt->buffer_free(kv->be->be, kv->groups[g].pool);
            free(kv->groups[g].free_list);
        }
    }
    if (kv->seqs) {
        for (int32_t s = 0; s < kv->p.max_seqs; s++) {
            free(kv->seqs[s].table);
            free(kv->seqs[s].first_live);
        }
    }
    free(kv->groups);
    free(kv->seqs);
    free(kv);
}

int32_t kv_n_groups(const struct kv_cache *kv) { return kv->n_groups; }
int32_t kv_block_size(const struct kv_cache *kv) { return kv->p.block_size; }
const char *kv_group_name(const struct kv_cache *kv, int32_t g) { return kv->groups[g].desc.name; }
int32_t kv_blocks_total(const struct kv_cache *kv, int32_t g) { return kv->groups[g].n_blocks; }
int32_t kv_blocks_in_use(const struct kv_cache *kv, int32_t g)
{
    return kv->groups[g].n_blocks - kv->groups[g].n_free;
}
int32_t kv_max_blocks_per_seq(const struct kv_cache *kv, int32_t g) { (void)g; return kv->max_blocks; }
uint64_t kv_block_bytes(const struct kv_cache *kv, int32_t g) { return kv->groups[g].block_stride; }

static int32_t *seq_table(const struct kv_cache *kv, int32_t seq, int32_t g)
{
    return kv->seqs[seq].table + (size_t)g * (size_t)kv->max_blocks;
}

static int seq_valid(const struct kv_cache *kv, int32_t seq)
{
    return seq >= 0 && seq < kv->p.max_seqs && kv->seqs[seq].live;
}

berth_status kv_seq_new(struct kv_cache *kv, int32_t *seq)
{
    for (int32_t s = 0; s < kv->p.max_seqs; s++) {
        if (!kv->seqs[s].live) {
            kv->seqs[s].live = 1;
            kv->seqs[s].len = 0;
            *seq = s;
            return BERTH_OK;
        }
    }
    return berth_fail(BERTH_E_NOMEM, "all %d sequence slots of the KV cache are in use (raise [scheduler] max_seqs)",
                      (int)kv->p.max_seqs);
}

void kv_seq_free(struct kv_cache *kv, int32_t seq)
{
    if (!seq_valid(kv, seq)) return;
    struct kv_seq *sq = &kv->seqs[seq];
    for (int32_t g = 0; g < kv->n_groups; g++) {
        struct kv_group *gr = &kv->groups[g];
        int32_t *t = seq_table(kv, seq, g);
        for (int32_t i = 0; i < kv->max_blocks; i++) {
            if (t[i] >= 0) gr->free_list[gr->n_free++] = t[i];
            t[i] = -1;
        }
        sq->first_live[g] = 0;
    }
    sq->live = 0;
    sq->len = 0;
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

    /* Release first, so the blocks freed can serve this very step. */
    for (int32_t g = 0; g < kv->n_groups; g++) {
        struct kv_group *gr = &kv->groups[g];
        if (!gr->sliding) continue;
        int32_t dead = sliding_dead_below(kv, gr, sq->len);
        int32_t *t = seq_table(kv, seq, g);
        for (int32_t i = sq->first_live[g]; i < dead && i < kv->max_blocks; i++) {
            if (t[i] >= 0) gr->free_list[gr->n_free++] = t[i];
            t[i] = -1;
        }
        if (dead > sq->first_live[g]) sq->first_live[g] = dead;
    }
    /* Check every group before touching any, so exhaustion allocates nothing. */
    for (int32_t g = 0; g < kv->n_groups; g++) {
        const struct kv_group *gr = &kv->groups[g];
        const int32_t *t = seq_table(kv, seq, g);
        int32_t need = 0;
        for (int32_t i = sq->first_live[g]; i < hi; i++)
            if (t[i] < 0) need++;
        if (need > gr->n_free)
            return berth_fail(BERTH_E_DEVICE_OOM,
                              "KV cache exhausted: group '%s' needs %d more blocks, %d free (raise [kv] memory)",
                              gr->desc.name, (int)need, (int)gr->n_free);
    }
    for (int32_t g = 0; g < kv->n_groups; g++) {
        struct kv_group *gr = &kv->groups[g];
        int32_t *t = seq_table(kv, seq, g);
        for (int32_t i = sq->first_live[g]; i < hi; i++)
            if (t[i] < 0) t[i] = gr->free_list[--gr->n_free];
    }
    sq->len = new_len;
    return BERTH_OK;
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
    for (int32_t g = 0; g < kv->n_groups && !st; g++) {
        const struct kv_group *gr = &kv->groups[g];
        int32_t *owner = malloc((size_t)gr->n_blocks * sizeof *owner); /* -2 free, -1 unseen, else seq */
        if (!owner) return berth_fail(BERTH_E_NOMEM, "KV cache: out of host memory");
        for (int32_t b = 0; b < gr->n_blocks; b++) owner[b] = -1;
        if (gr->n_free < 0 || gr->n_free > gr->n_blocks)
            st = berth_fail(BERTH_E_INTERNAL, "group '%s': %d free of %d blocks", gr->desc.name, (int)gr->n_free,
                            (int)gr->n_blocks);
        for (int32_t i = 0; i < gr->n_free && !st; i++) {
            int32_t b = gr->free_list[i];
            if (b < 0 || b >= gr->n_blocks)
                st = berth_fail(BERTH_E_INTERNAL, "group '%s': free list holds bad block %d", gr->desc.name, (int)b);
            else if (owner[b] != -1)
                st = berth_fail(BERTH_E_INTERNAL, "group '%s': block %d is on the free list twice", gr->desc.name,
                                (int)b);
            else
                owner[b] = -2;
        }
        int64_t used = 0;
        for (int32_t s = 0; s < kv->p.max_seqs && !st; s++) {
            const struct kv_seq *sq = &kv->seqs[s];
            const int32_t *t = seq_table(kv, s, g);
            int32_t held = 0;
            for (int32_t i = 0; i < kv->max_blocks && !st; i++) {
                int32_t b = t[i];
                if (b < 0) continue;
                if (!sq->live)
                    st = berth_fail(BERTH_E_INTERNAL, "group '%s': free sequence %d holds block %d", gr->desc.name,
                                    (int)s, (int)b);
                else if (b >= gr->n_blocks)
                    st = berth_fail(BERTH_E_INTERNAL, "group '%s': sequence %d holds bad block %d", gr->desc.name,
                                    (int)s, (int)b);
                else if (owner[b] == -2)
                    st = berth_fail(BERTH_E_INTERNAL, "group '%s': block %d is both free and owned by sequence %d",
                                    gr->desc.name, (int)b, (int)s);
                else if (owner[b] >= 0)
                    st = berth_fail(BERTH_E_INTERNAL, "group '%s': block %d is owned by sequences %d and %d",
                                    gr->desc.name, (int)b, (int)owner[b], (int)s);
                else if ((int64_t)i * kv->p.block_size >= sq->len)
                    st = berth_fail(BERTH_E_INTERNAL, "group '%s': sequence %d of length %d holds table entry %d",
                                    gr->desc.name, (int)s, (int)sq->len, (int)i);
                else {
                    owner[b] = s;
                    held++;
                    used++;
                }
            }
            if (!st && sq->live) {
                /* Every needed entry is present: all of [first_live, ceil(len/bs)). */
                int32_t hi = ceil_div(sq->len, kv->p.block_size);
                for (int32_t i = sq->first_live[g]; i < hi && !st; i++)
                    if (t[i] < 0)
                        st = berth_fail(BERTH_E_INTERNAL, "group '%s': sequence %d misses table entry %d",
                                        gr->desc.name, (int)s, (int)i);
                if (!st && held > gr->seq_cap)
                    st = berth_fail(BERTH_E_INTERNAL, "group '%s': sequence %d holds %d blocks, bound %d",
                                    gr->desc.name, (int)s, (int)held, (int)gr->seq_cap);
            }
        }
        if (!st && used + gr->n_free != gr->n_blocks)
            st = berth_fail(BERTH_E_INTERNAL, "group '%s': %lld used + %d free != %d total", gr->desc.name,
                            (long long)used, (int)gr->n_free, (int)gr->n_blocks);
        free(owner);
    }
    return st;
}

/*
 * kv_cache.h — the host's paged KV cache: one block pool per page group of the model, a free-list block
 * allocator, and per-sequence block tables.
 *
 * Memory layout of a group's pool (one backend buffer, usage BERTH_USAGE_KV, n_blocks blocks), block-major so a
 * block is one contiguous range that a later prefix cache can share or copy whole:
 *
 *     block b:  layer 0: K plane, V plane | layer 1: K plane, V plane | ... | layer n_layers-1: K, V
 *     K plane:  block_size token rows of n_kv_heads heads of head_dim elements
 *     V plane:  block_size token rows of n_kv_heads heads of head_dim_v elements
 *
 *   head_stride   = head_dim * elem_size                 v_head_stride  = head_dim_v * elem_size
 *   token_stride  = n_kv_heads * head_stride             v_token_stride = n_kv_heads * v_head_stride
 *   k_plane_bytes = block_size * token_stride            v_plane_bytes  = block_size * v_token_stride
 *   layer_stride  = k_plane_bytes + v_plane_bytes        (berth_kv_group_batch.layer_stride)
 *   block_stride  = n_layers * layer_stride
 *   K of (b, layer l, slot s, head h) = b*block_stride + l*layer_stride + s*token_stride + h*head_stride
 *   V of the same                     = b*block_stride + l*layer_stride + k_plane_bytes + s*v_token_stride
 *                                       + h*v_head_stride
 * so K and V of different widths each take only their own size (berth_kv_view has a stride pair for each).
 *
 * Sizing: [kv] memory is split across groups in proportion to their bytes per token (every position needs an
 * entry in every group), which gives every group the same block count. A SLIDING group never needs more than
 * ceil((window - 1 + max_chunk) / block_size) + 1 blocks per sequence, so its share is capped at what max_seqs
 * sequences can use and the rest goes to the other groups.
 *
 * Sliding groups release blocks wholly outside the window as a sequence grows (their table entries become -1).
 *
 * Blocks are reference-counted: kv_seq_fork shares every block of a sequence with a new one; the first write
 * into a shared partial block copies it (copy-on-write, through the backend's buffer_copy on the stream given
 * to kv_cache_set_stream). Full blocks are never written again, so they stay shared.
 *
 * Prefix cache: kv_seq_publish records a sequence's tokens once they are computed and indexes each full block
 * under its chained hash (prefix_cache.h). A block whose last reference goes away stays indexed and moves to
 * an LRU list ("cached"): still reusable, evicted (oldest first) only when an allocation finds no free block.
 * kv_prefix_attach gives an empty sequence the longest cached prefix of a prompt; a sliding group only needs
 * (and a hit requires) the blocks a query right after the prefix still sees, so a hit restores exactly what a
 * fresh prefill leaves.
 *
 * Recurrent states (memory_layout.states): one pool per state with a slot per sequence (slot = sequence id),
 * zeroed by kv_seq_new and copied by kv_seq_fork, and a separate pool of n_snapshots slots, an LRU cache of
 * states keyed by the chain hash of the block they end (saved by kv_seq_publish when a step ends on a block
 * boundary); a prefix hit on a recurrent model needs the snapshot at its last block and restores it.
 *
 * Sequences are small integers in [0, max_seqs) handed out by kv_seq_new. Single-threaded: one owner drives it.
 */
#ifndef BERTH_HOST_KV_CACHE_H
#define BERTH_HOST_KV_CACHE_H

#include <berth/model.h>
#include <stdint.h>

struct kv_cache;

struct kv_cache_params {
    int32_t block_size;     /* [kv] block_size: token slots per block */
    uint64_t memory_bytes;  /* [kv] memory: bytes for all pools together */
    int32_t max_seqs;       /* sequences alive at once */
    int32_t max_seq_len;    /* longest sequence (sizes the block tables); the model's context limit */
    int32_t max_chunk;      /* most new tokens of one sequence in one step ([scheduler] max_batch_tokens) */
    berth_dtype dtype;      /* element type of the pools: F32, F16 or BF16 */
    int32_t n_snapshots;    /* state-snapshot slots (0: no snapshots; only used when the model has states) */
};

/* Counters since creation (observability; tests assert the mechanisms ran). */
struct kv_cache_counters {
    int64_t hit_tokens;         /* tokens attached from the prefix cache */
    int64_t evicted_blocks;     /* cached blocks reused for new data */
    int64_t cow_copies;         /* shared partial blocks copied before a write */
    int64_t forks;
    int64_t snapshots_saved, snapshots_restored, evicted_snapshots;
};

/* Create pools for every group of layout on backend be (be may be NULL: bookkeeping only, no buffers — for tests
 * and dry sizing). Fails with a message naming the group when memory_bytes cannot hold one block of it or when a
 * buffer allocation fails. Caller frees with kv_cache_free (before the backend is destroyed). */
berth_status kv_cache_create(const berth_backend_api *be, const berth_memory_layout *layout,
                             const struct kv_cache_params *p, struct kv_cache **out);
void kv_cache_free(struct kv_cache *kv);
/* The stream copy-on-write and state copies/zeroing run on (required with a backend and states or forks). */
void kv_cache_set_stream(struct kv_cache *kv, berth_stream *s);
const struct kv_cache_counters *kv_counters(const struct kv_cache *kv);

int32_t kv_n_groups(const struct kv_cache *kv);
int32_t kv_block_size(const struct kv_cache *kv);
const char *kv_group_name(const struct kv_cache *kv, int32_t g);
int32_t kv_blocks_total(const struct kv_cache *kv, int32_t g);
/* Blocks referenced by some sequence. */
int32_t kv_blocks_in_use(const struct kv_cache *kv, int32_t g);
/* Unreferenced blocks kept for the prefix cache (evictable). */
int32_t kv_blocks_cached(const struct kv_cache *kv, int32_t g);
/* Blocks an allocation may take: free + cached. */
int32_t kv_blocks_available(const struct kv_cache *kv, int32_t g);
/* References to block of group g (-1 for a bad id). */
int32_t kv_block_refs(const struct kv_cache *kv, int32_t g, int32_t block);
int kv_group_is_sliding(const struct kv_cache *kv, int32_t g);
/* Most blocks one sequence holds at once in group g (a sliding group's window bound; else the table width). */
int32_t kv_group_seq_cap(const struct kv_cache *kv, int32_t g);
/* Blocks one sequence can hold at most in group g (the block-table width). */
int32_t kv_max_blocks_per_seq(const struct kv_cache *kv, int32_t g);
/* Bytes of one block of group g (all layers, K and V). */
uint64_t kv_block_bytes(const struct kv_cache *kv, int32_t g);

/* A free sequence id, length 0, no blocks. BERTH_E_NOMEM "all N sequence slots ..." when none is free. */
berth_status kv_seq_new(struct kv_cache *kv, int32_t *seq);
/* A new sequence sharing every block (and token history, and recurrent state) of src. BERTH_E_NOMEM when no
 * sequence slot is free. */
berth_status kv_seq_fork(struct kv_cache *kv, int32_t src, int32_t *dst);
/* Drop seq's reference to each of its blocks (unreferenced indexed blocks become cached, others free) and return
 * the id to the pool. Ignores ids that are not in use. */
void kv_seq_free(struct kv_cache *kv, int32_t seq);
/* Tokens the sequence holds (the new_len of its last successful kv_seq_ensure). */
int32_t kv_seq_len(const struct kv_cache *kv, int32_t seq);
/* Block of seq holding position pos in group g, or -1 (not allocated or released). */
int32_t kv_seq_block(const struct kv_cache *kv, int32_t seq, int32_t g, int32_t pos);

/* Make room for positions [kv_seq_len(seq), new_len) in every group, before the step that writes them. First
 * releases sliding-window blocks no query at position >= kv_seq_len(seq) can see, then allocates. All or
 * nothing: on exhaustion nothing is allocated and the error reads
 *   KV cache exhausted: group 'full' needs 5 more blocks, 2 free (raise [kv] memory)
 * new_len below the current length is BERTH_E_INVALID; above max_seq_len too. */
berth_status kv_seq_ensure(struct kv_cache *kv, int32_t seq, int32_t new_len);
/* Blocks of group g kv_seq_ensure(seq, new_len) would take (after its sliding releases, which it does not
 * credit): new table entries plus a copy-on-write. Requests whose needs sum to at most kv_blocks_available in
 * every group all succeed. */
int32_t kv_seq_blocks_needed(const struct kv_cache *kv, int32_t seq, int32_t g, int32_t new_len);

/* Record tokens ids[0..n) at positions [start, start + n) of seq after the step that wrote their K/V
 * succeeded (start = the tokens recorded so far; start + n <= kv_seq_len), and index every block they complete. */
berth_status kv_seq_publish(struct kv_cache *kv, int32_t seq, int32_t start, const int32_t *ids, int32_t n);
/* Tokens of ids[0..n) the prefix cache could serve now (a multiple of block_size, at most n - 1). */
int32_t kv_prefix_match(const struct kv_cache *kv, const int32_t *ids, int32_t n);
/* Give the empty sequence seq the longest cached prefix of ids (*cached tokens, as kv_prefix_match): its length
 * becomes *cached and the caller computes ids[*cached..n). Restores the state snapshot on recurrent models. */
berth_status kv_prefix_attach(struct kv_cache *kv, int32_t seq, const int32_t *ids, int32_t n, int32_t *cached);
/* Take back the counter effects of a kv_prefix_attach that served `cached` tokens to a sequence the caller is
 * about to free without running it (an admission that did not fit), so the counters report only real reuse. */
void kv_prefix_attach_undo_counters(struct kv_cache *kv, int32_t cached);

/* Recurrent states (see above). */
int32_t kv_n_states(const struct kv_cache *kv);
berth_buffer *kv_state_pool(const struct kv_cache *kv, int32_t i);   /* max_seqs slots; NULL without backend */
uint64_t kv_state_slot_bytes(const struct kv_cache *kv, int32_t i);
const berth_state_desc *kv_state_desc(const struct kv_cache *kv, int32_t i);
/* Copy seq's states into the snapshot slot of key (evicting the least recently used snapshot when all are
 * taken); a no-op without snapshot slots. */
berth_status kv_snapshot_save(struct kv_cache *kv, int32_t seq, uint64_t key);
/* Snapshot slot holding key, or -1. */
int32_t kv_snapshot_find(const struct kv_cache *kv, uint64_t key);
int32_t kv_snapshots_in_use(const struct kv_cache *kv);

/* One sequence's part of a step: new tokens at positions [start, start + n). */
struct kv_seq_span {
    int32_t seq;
    int32_t start;
    int32_t n;
};

/* Block-table width a step over spans needs: max over spans of ceil((start + n) / block_size). */
int32_t kv_batch_table_width(const struct kv_cache *kv, const struct kv_seq_span *spans, int32_t n_seqs);
/* Fill the host copies of group g's block table (width x n_seqs i32, row i = spans[i].seq's table, -1 beyond
 * its blocks) and slots (one i32 per new token, sequences back to back: block * block_size + offset). The
 * positions must have been ensured. */
berth_status kv_batch_tables(const struct kv_cache *kv, int32_t g, const struct kv_seq_span *spans, int32_t n_seqs,
                             int32_t width, int32_t *block_table, int32_t *slots);
/* The berth_kv_group_batch of group g for a step whose block table and slots were uploaded as the given tensors
 * (block_table ne {width, n_seqs}, slots ne {n_tokens}). Requires pools (be != NULL at create). Its per-group
 * seq_kv_len is left absent (h_seq_kv_len NULL): every group uses berth_batch.seq_kv_len until CROSS groups
 * (encoder lengths) exist. */
void kv_group_batch(const struct kv_cache *kv, int32_t g, const berth_tensor *block_table,
                    const berth_tensor *slots, berth_kv_group_batch *out);

/* Check the allocator's invariants: every block is exactly one of free (once on the free list, unindexed),
 * cached (on the LRU list, indexed, no references) or held (its reference count equals the table entries naming
 * it); indexed blocks hold their sequences' tokens and the index agrees; free + cached + held = total; sliding
 * sequences hold at most their bound. BERTH_OK, or BERTH_E_INTERNAL naming the first violation. For tests. */
berth_status kv_cache_validate(const struct kv_cache *kv);

#endif

/*
 * prefix_cache.h — the pieces of the prefix cache that know nothing about blocks: the chained hash of a full
 * block's token content, and an open-addressing map from such a hash to a small integer (a block id or a
 * snapshot slot). kv_cache.c owns one map per page group plus one for state snapshots and decides what is kept
 * and what is evicted (LRU); see kv_cache.h.
 *
 * Chained hashes: h(block i) = mix(h(block i-1), tokens of block i), h(-1) = PREFIX_HASH_ROOT, so equal hashes
 * mean (up to 64-bit collisions, which kv_cache.c also guards against by comparing the block's own tokens and
 * its parent hash) the same whole prefix, not merely the same block.
 */
#ifndef BERTH_HOST_PREFIX_CACHE_H
#define BERTH_HOST_PREFIX_CACHE_H

#include <berth/plugin.h>
#include <stdint.h>

#define PREFIX_HASH_ROOT 0x6a09e667f3bcc908ull

/* Hash of a block of n tokens whose predecessor block hashed to parent. */
uint64_t prefix_hash_block(uint64_t parent, const int32_t *tokens, int32_t n);

struct prefix_map;

/* A map able to hold at least capacity entries (it never grows: callers bound their entries by construction).
 * Caller frees with prefix_map_free. */
berth_status prefix_map_create(int32_t capacity, struct prefix_map **out);
void prefix_map_free(struct prefix_map *m);
/* The value stored under key, or -1. */
int32_t prefix_map_get(const struct prefix_map *m, uint64_t key);
/* Store value (>= 0) under key, replacing any old value. BERTH_E_INTERNAL when the map is full. */
berth_status prefix_map_put(struct prefix_map *m, uint64_t key, int32_t value);
/* Remove key if present. */
void prefix_map_del(struct prefix_map *m, uint64_t key);
int32_t prefix_map_count(const struct prefix_map *m);

#endif

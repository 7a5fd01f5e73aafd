/* prefix_cache.c — chained block hashes and the hash -> id map of the prefix cache (see prefix_cache.h). */
#include "prefix_cache.h"

#include "errors.h"

#include <stdlib.h>

static uint64_t mix64(uint64_t x)
{
    /* splitmix64's finaliser: every input bit reaches every output bit. */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

uint64_t prefix_hash_block(uint64_t parent, const int32_t *tokens, int32_t n)
{
    uint64_t h = mix64(parent ^ 0x9e3779b97f4a7c15ull) ^ (uint64_t)(uint32_t)n;
    for (int32_t i = 0; i < n; i++) h = mix64(h + (uint64_t)(uint32_t)tokens[i] * 0x9e3779b97f4a7c15ull + 1);
    return h;
}

struct prefix_map {
    uint32_t mask;    /* slots - 1, slots a power of two */
    int32_t count;
    uint64_t *keys;
    int32_t *values;  /* -1 = empty slot */
};

berth_status prefix_map_create(int32_t capacity, struct prefix_map **out)
{
    *out = NULL;
    uint64_t slots = 16;
    while (slots < (uint64_t)(capacity > 0 ? capacity : 1) * 2) slots <<= 1;
    if (slots > (1ull << 31)) return berth_fail(BERTH_E_INVALID, "prefix cache: %d entries is too many", (int)capacity);
    struct prefix_map *m = calloc(1, sizeof *m);
    if (!m) return berth_fail(BERTH_E_NOMEM, "prefix cache: out of host memory");
    m->mask = (uint32_t)(slots - 1);
    m->keys = calloc(slots, sizeof *m->keys);
    m->values = malloc(slots * sizeof *m->values);
    if (!m->keys || !m->values) {
        prefix_map_free(m);
        return berth_fail(BERTH_E_NOMEM, "prefix cache: out of host memory");
    }
    for (uint64_t i = 0; i < slots; i++) m->values[i] = -1;
    *out = m;
    return BERTH_OK;
}

void prefix_map_free(struct prefix_map *m)
{
    if (!m) return;
    free(m->keys);
    free(m->values);
    free(m);
}

static uint32_t home(const struct prefix_map *m, uint64_t key) { return (uint32_t)mix64(key) & m->mask; }

int32_t prefix_map_get(const struct prefix_map *m, uint64_t key)
{
    for (uint32_t i = home(m, key);; i = (i + 1) & m->mask) {
        if (m->values[i] < 0) return -1;
        if (m->keys[i] == key) return m->values[i];
    }
}

berth_status prefix_map_put(struct prefix_map *m, uint64_t key, int32_t value)
{
    uint32_t i = home(m, key);
    for (; m->values[i] >= 0; i = (i + 1) & m->mask)
        if (m->keys[i] == key) {
            m->values[i] = value;
            return BERTH_OK;
        }
    /* Keep at least one empty slot so lookups terminate; capacity*2 slots make this unreachable in practice. */
    if ((uint32_t)m->count + 1 >= m->mask)
        return berth_fail(BERTH_E_INTERNAL, "prefix cache: map full at %d entries", (int)m->count);
    m->keys[i] = key;
    m->values[i] = value;
    m->count++;
    return BERTH_OK;
}

void prefix_map_del(struct prefix_map *m, uint64_t key)
{
    uint32_t i = home(m, key);
    for (;; i = (i + 1) & m->mask) {
        if (m->values[i] < 0) return;
        if (m->keys[i] == key) break;
    }
    /* Backward-shift deletion: move later members of the probe run into the hole so no tombstones are needed. */
    uint32_t hole = i;
    for (uint32_t j = (i + 1) & m->mask; m->values[j] >= 0; j = (j + 1) & m->mask) {
        uint32_t h = home(m, m->keys[j]);
        /* j's entry may fill the hole when its home is not in the cyclic range (hole, j]. */
        int in_range = hole <= j ? (h > hole && h <= j) : (h > hole || h <= j);
        if (!in_range) {
            m->keys[hole] = m->keys[j];
            m->values[hole] = m->values[j];
            hole = j;
        }
    }
    m->values[hole] = -1;
    m->count--;
}

int32_t prefix_map_count(const struct prefix_map *m) { return m->count; }

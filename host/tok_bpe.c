/*
 * tok_bpe.c — the BPE model: merges in both file forms ("a b" and ["a","b"]), byte fallback (<0xXX> pieces),
 * unk with fuse_unk, continuing_subword_prefix / end_of_word_suffix, ignore_merges, and a word cache.
 *
 * Merging follows the Hugging Face library exactly: a hash map (left id, right id) -> (rank, merged id) and a
 * binary heap of candidate pairs ordered by (rank, position), with stale entries skipped when popped — one
 * O(log n) step per merge instead of rescanning the word.
 */
#include "tok_internal.h"

#include "errors.h"

#include <stdlib.h>
#include <string.h>

#define CACHE_MAX 20000 /* words; the cache is cleared when full */

typedef struct {
    uint64_t key;   /* (left << 32 | right) + 1; 0 = empty */
    int32_t rank, id;
} merge_slot;

typedef struct {
    tok_model base;
    merge_slot *merges;
    size_t merge_cap;
    int32_t byte_ids[256];
    int32_t unk_id;
    bool byte_fallback, fuse_unk, ignore_merges;
    char *prefix, *suffix;   /* continuing_subword_prefix, end_of_word_suffix ("" if none) */
    size_t prefix_len, suffix_len;
    tok_strmap cache;        /* word -> index into cache_ids */
    int32_t **cache_ids;
    size_t *cache_n;
    size_t cache_used;
} bpe;

static uint64_t mkey(int32_t a, int32_t b) { return (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1; }

static merge_slot *merge_find(const bpe *m, int32_t a, int32_t b)
{
    uint64_t k = mkey(a, b);
    size_t j = tok_hash(&k, sizeof k) & (m->merge_cap - 1);
    while (m->merges[j].key) {
        if (m->merges[j].key == k) return &m->merges[j];
        j = (j + 1) & (m->merge_cap - 1);
    }
    return NULL;
}

static void merge_put(bpe *m, int32_t a, int32_t b, int32_t rank, int32_t id)
{
    uint64_t k = mkey(a, b);
    size_t j = tok_hash(&k, sizeof k) & (m->merge_cap - 1);
    while (m->merges[j].key && m->merges[j].key != k) j = (j + 1) & (m->merge_cap - 1);
    m->merges[j] = (merge_slot){k, rank, id}; /* a repeated pair: the later rank wins, as in HF's HashMap */
}

static void cache_clear(bpe *m)
{
    for (size_t i = 0; i < m->cache_used; i++) free(m->cache_ids[i]);
    m->cache_used = 0;
    tok_strmap_free(&m->cache);
}

static void bpe_free(tok_model *base)
{
    bpe *m = (bpe *)base;
    cache_clear(m);
    free(m->cache_ids);
    free(m->cache_n);
    free(m->merges);
    free(m->prefix);
    free(m->suffix);
    free(m);
}

typedef struct { int32_t id; int32_t prev, next; bool alive; } sym;
typedef struct { int32_t rank; int32_t pos; int32_t id; } cand;

static bool cand_less(cand a, cand b) { return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos; }

static bool heap_push(cand **h, size_t *n, size_t *cap, cand c)
{
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 64;
        cand *p = realloc(*h, nc * sizeof *p);
        if (!p) return false;
        *h = p, *cap = nc;
    }
    size_t i = (*n)++;
    while (i && cand_less(c, (*h)[(i - 1) / 2])) { (*h)[i] = (*h)[(i - 1) / 2]; i = (i - 1) / 2; }
    (*h)[i] = c;
    return true;
}

static cand heap_pop(cand *h, size_t *n)
{
    cand top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && cand_less(h[c + 1], h[c])) c++;
        if (!cand_less(h[c], last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

#define OOM() berth_fail(BERTH_E_NOMEM, "tokenizer: out of memory")

/* Symbols of one word before merging: vocabulary chars, byte-fallback bytes, or (fused) unk. */
static berth_status word_symbols(const bpe *m, const berth_tokenizer *t, const char *s, size_t n, sym **out,
                                 size_t *nout)
{
    sym *v = malloc((n + 1) * sizeof *v); /* at most one symbol per byte */
    if (!v) return OOM();
    size_t k = 0;
    bool prev_unk = false;
    tok_buf tmp = {0};
    for (size_t i = 0; i < n;) {
        size_t cl = tok_utf8_len(s + i, n - i);
        int32_t id;
        const char *key = s + i;
        size_t klen = cl;
        if ((m->prefix_len && i > 0) || (m->suffix_len && i + cl == n)) {
            tmp.len = 0;
            if ((i > 0 && !tok_buf_put(&tmp, m->prefix, m->prefix_len)) || !tok_buf_put(&tmp, s + i, cl) ||
                (i + cl == n && !tok_buf_put(&tmp, m->suffix, m->suffix_len))) {
                free(v), tok_buf_free(&tmp);
                return OOM();
            }
            key = tmp.p, klen = tmp.len;
        }
        id = tok_strmap_get(&t->vocab, key, klen);
        if (id >= 0) {
            v[k++] = (sym){id, 0, 0, true};
            prev_unk = false;
        } else {
            bool done = false;
            if (m->byte_fallback) {
                bool all = true;
                for (size_t b = 0; b < cl; b++) all = all && m->byte_ids[(uint8_t)s[i + b]] >= 0;
                if (all) {
                    for (size_t b = 0; b < cl; b++) v[k++] = (sym){m->byte_ids[(uint8_t)s[i + b]], 0, 0, true};
                    done = true;
                    prev_unk = false;
                }
            }
            if (!done && m->unk_id >= 0) {
                if (!(m->fuse_unk && prev_unk)) v[k++] = (sym){m->unk_id, 0, 0, true};
                prev_unk = true;
            }
        }
        i += cl;
    }
    tok_buf_free(&tmp);
    for (size_t i = 0; i < k; i++) {
        v[i].prev = (int32_t)i - 1;
        v[i].next = i + 1 < k ? (int32_t)i + 1 : -1;
    }
    *out = v;
    *nout = k;
    return BERTH_OK;
}

static berth_status bpe_word(bpe *m, const berth_tokenizer *t, const char *s, size_t n, int32_t **ids, size_t *nids,
                             size_t *cap)
{
    if (m->ignore_merges) {
        int32_t id = tok_strmap_get(&t->vocab, s, n);
        if (id >= 0) return tok_ids_push(ids, nids, cap, id) ? BERTH_OK : OOM();
    }
    int32_t ci = tok_strmap_get(&m->cache, s, n);
    if (ci >= 0) {
        for (size_t i = 0; i < m->cache_n[ci]; i++)
            if (!tok_ids_push(ids, nids, cap, m->cache_ids[ci][i])) return OOM();
        return BERTH_OK;
    }
    sym *v = NULL;
    size_t k = 0;
    berth_status st = word_symbols(m, t, s, n, &v, &k);
    if (st) return st;
    cand *h = NULL;
    size_t hn = 0, hcap = 0;
    bool ok = true;
    for (size_t i = 0; i + 1 < k && ok; i++) {
        merge_slot *ms = merge_find(m, v[i].id, v[i + 1].id);
        if (ms) ok = heap_push(&h, &hn, &hcap, (cand){ms->rank, (int32_t)i, ms->id});
    }
    while (ok && hn) {
        cand c = heap_pop(h, &hn);
        sym *a = &v[c.pos];
        if (!a->alive || a->next < 0) continue;
        sym *b = &v[a->next];
        merge_slot *ms = merge_find(m, a->id, b->id);
        if (!ms || ms->rank != c.rank || ms->id != c.id) continue; /* stale */
        a->id = c.id;
        b->alive = false;
        a->next = b->next;
        if (b->next >= 0) v[b->next].prev = c.pos;
        if (a->prev >= 0) {
            merge_slot *pm = merge_find(m, v[a->prev].id, a->id);
            if (pm) ok = heap_push(&h, &hn, &hcap, (cand){pm->rank, a->prev, pm->id});
        }
        if (ok && a->next >= 0) {
            merge_slot *nm = merge_find(m, a->id, v[a->next].id);
            if (nm) ok = heap_push(&h, &hn, &hcap, (cand){nm->rank, c.pos, nm->id});
        }
    }
    free(h);
    size_t start = *nids;
    for (size_t i = 0; i < k && ok; i++)
        if (v[i].alive) ok = tok_ids_push(ids, nids, cap, v[i].id);
    free(v);
    if (!ok) return OOM();
    /* remember the word */
    if (m->cache_used == CACHE_MAX) cache_clear(m);
    size_t cnt = *nids - start;
    int32_t *copy = malloc((cnt ? cnt : 1) * sizeof *copy);
    if (copy && tok_strmap_put(&m->cache, s, n, (int32_t)m->cache_used)) {
        memcpy(copy, *ids + start, cnt * sizeof *copy);
        m->cache_ids[m->cache_used] = copy;
        m->cache_n[m->cache_used++] = cnt;
    } else {
        free(copy); /* caching is best effort */
    }
    return BERTH_OK;
}

static berth_status bpe_encode(tok_model *base, const berth_tokenizer *t, const char *s, size_t n, int32_t **ids,
                               size_t *nids, size_t *cap)
{
    return bpe_word((bpe *)base, t, s, n, ids, nids, cap);
}

static berth_status opt_str(const json_t *model, const char *key, const char *file, char **out, size_t *len)
{
    const json_t *v = json_object_get(model, key);
    const char *s = "";
    if (v && !json_is_null(v)) {
        if (!json_is_string(v)) return berth_fail(BERTH_E_INVALID, "%s: model.%s: expected a string or null", file, key);
        s = json_string_value(v);
    }
    *len = strlen(s);
    *out = strdup(s);
    return *out ? BERTH_OK : OOM();
}

static berth_status opt_bool(const json_t *model, const char *key, const char *file, bool *out)
{
    const json_t *v = json_object_get(model, key);
    *out = false;
    if (!v || json_is_null(v)) return BERTH_OK;
    if (!json_is_boolean(v)) return berth_fail(BERTH_E_INVALID, "%s: model.%s: expected a boolean", file, key);
    *out = json_is_true(v);
    return BERTH_OK;
}

/* Fills t->vocab / t->pieces from model.vocab (an object piece -> id). */
static berth_status load_vocab(berth_tokenizer *t, const json_t *vocab, const char *file)
{
    if (!json_is_object(vocab)) return berth_fail(BERTH_E_INVALID, "%s: model.vocab: expected an object", file);
    const char *k;
    const json_t *v;
    int64_t max = -1;
    json_object_foreach((json_t *)vocab, k, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= INT32_MAX / 2)
            return berth_fail(BERTH_E_INVALID, "%s: model.vocab[\"%.64s\"]: expected an id in [0, 2^30)", file, k);
        if (json_integer_value(v) > max) max = json_integer_value(v);
    }
    t->n_ids = (size_t)(max + 1);
    t->pieces = calloc(t->n_ids ? t->n_ids : 1, sizeof *t->pieces);
    t->piece_len = calloc(t->n_ids ? t->n_ids : 1, sizeof *t->piece_len);
    if (!t->pieces || !t->piece_len) return OOM();
    json_object_foreach((json_t *)vocab, k, v) {
        size_t len = json_object_iter_key_len(json_object_key_to_iter(k));
        int32_t id = (int32_t)json_integer_value(v);
        if (t->pieces[id]) return berth_fail(BERTH_E_INVALID, "%s: model.vocab[\"%.64s\"]: id %d is used twice", file, k, id);
        if (!(t->pieces[id] = malloc(len + 1))) return OOM();
        memcpy(t->pieces[id], k, len + 1);
        t->piece_len[id] = (uint32_t)len;
        if (!tok_strmap_put(&t->vocab, k, len, id)) return OOM();
    }
    return BERTH_OK;
}

static berth_status load_merges(bpe *m, const berth_tokenizer *t, const json_t *merges, const char *file)
{
    if (!json_is_array(merges)) return berth_fail(BERTH_E_INVALID, "%s: model.merges: expected an array", file);
    size_t n = json_array_size(merges);
    m->merge_cap = 16;
    while (m->merge_cap < 2 * n + 16) m->merge_cap *= 2;
    if (!(m->merges = calloc(m->merge_cap, sizeof *m->merges))) return OOM();
    tok_buf joined = {0};
    berth_status st = BERTH_OK;
    for (size_t i = 0; i < n && !st; i++) {
        const json_t *e = json_array_get(merges, i);
        const char *a, *b;
        size_t al, bl;
        if (json_is_string(e)) { /* legacy "a b" form */
            a = json_string_value(e);
            const char *sp = memchr(a, ' ', json_string_length(e));
            if (!sp || memchr(sp + 1, ' ', json_string_length(e) - (size_t)(sp + 1 - a))) {
                st = berth_fail(BERTH_E_INVALID, "%s: model.merges[%zu]: expected \"left right\" with one space", file, i);
                break;
            }
            al = (size_t)(sp - a), b = sp + 1, bl = json_string_length(e) - al - 1;
        } else if (json_is_array(e) && json_array_size(e) == 2 && json_is_string(json_array_get(e, 0)) &&
                   json_is_string(json_array_get(e, 1))) {
            a = json_string_value(json_array_get(e, 0)), al = json_string_length(json_array_get(e, 0));
            b = json_string_value(json_array_get(e, 1)), bl = json_string_length(json_array_get(e, 1));
        } else {
            st = berth_fail(BERTH_E_INVALID, "%s: model.merges[%zu]: expected \"left right\" or [\"left\", \"right\"]", file, i);
            break;
        }
        int32_t ia = tok_strmap_get(&t->vocab, a, al), ib = tok_strmap_get(&t->vocab, b, bl);
        if (ia < 0 || ib < 0) {
            st = berth_fail(BERTH_E_INVALID, "%s: model.merges[%zu]: token \"%.*s\" is not in model.vocab", file, i,
                            (int)(ia < 0 ? (al > 64 ? 64 : al) : (bl > 64 ? 64 : bl)), ia < 0 ? a : b);
            break;
        }
        /* the merged token drops the right side's continuing_subword_prefix */
        size_t skip = (m->prefix_len && bl >= m->prefix_len && !memcmp(b, m->prefix, m->prefix_len)) ? m->prefix_len : 0;
        joined.len = 0;
        if (!tok_buf_put(&joined, a, al) || !tok_buf_put(&joined, b + skip, bl - skip)) { st = OOM(); break; }
        int32_t id = tok_strmap_get(&t->vocab, joined.p, joined.len);
        if (id < 0) {
            st = berth_fail(BERTH_E_INVALID, "%s: model.merges[%zu]: merged token \"%.*s\" is not in model.vocab", file,
                            i, (int)(joined.len > 64 ? 64 : joined.len), joined.p);
            break;
        }
        merge_put(m, ia, ib, (int32_t)i, id);
    }
    tok_buf_free(&joined);
    return st;
}

berth_status tok_bpe_parse(berth_tokenizer *t, const json_t *model, const char *file, tok_model **out)
{
    bpe *m = calloc(1, sizeof *m);
    if (!m) return OOM();
    m->base.encode = bpe_encode;
    m->base.free = bpe_free;
    m->cache_ids = calloc(CACHE_MAX, sizeof *m->cache_ids);
    m->cache_n = calloc(CACHE_MAX, sizeof *m->cache_n);
    berth_status st = (m->cache_ids && m->cache_n) ? BERTH_OK : OOM();
    if (!st) st = opt_str(model, "continuing_subword_prefix", file, &m->prefix, &m->prefix_len);
    if (!st) st = opt_str(model, "end_of_word_suffix", file, &m->suffix, &m->suffix_len);
    if (!st) st = opt_bool(model, "byte_fallback", file, &m->byte_fallback);
    if (!st) st = opt_bool(model, "fuse_unk", file, &m->fuse_unk);
    if (!st) st = opt_bool(model, "ignore_merges", file, &m->ignore_merges);
    const json_t *dropout = json_object_get(model, "dropout");
    if (!st && dropout && !json_is_null(dropout) && !(json_is_number(dropout) && json_number_value(dropout) == 0.0))
        st = berth_fail(BERTH_E_UNSUPPORTED, "%s: model.dropout: BPE dropout is not supported (expected null)", file);
    if (!st) st = load_vocab(t, json_object_get(model, "vocab"), file);
    if (!st) st = load_merges(m, t, json_object_get(model, "merges"), file);
    m->unk_id = -1;
    const json_t *unk = json_object_get(model, "unk_token");
    if (!st && unk && !json_is_null(unk)) {
        if (!json_is_string(unk)) st = berth_fail(BERTH_E_INVALID, "%s: model.unk_token: expected a string or null", file);
        else if ((m->unk_id = tok_strmap_get(&t->vocab, json_string_value(unk), json_string_length(unk))) < 0)
            st = berth_fail(BERTH_E_INVALID, "%s: model.unk_token: \"%.64s\" is not in model.vocab", file,
                            json_string_value(unk));
    }
    for (int b = 0; b < 256 && !st; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        m->byte_ids[b] = tok_strmap_get(&t->vocab, name, 6);
    }
    if (st) {
        bpe_free(&m->base);
        return st;
    }
    *out = &m->base;
    return BERTH_OK;
}

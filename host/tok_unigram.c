/*
 * tok_unigram.c — the Unigram model: Viterbi over the scored vocabulary (best total log-probability), unknown
 * characters scored min_score - 10 and fused into one unk, byte fallback, as the Hugging Face library does.
 */
#include "tok_internal.h"

#include "errors.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define OOM() berth_fail(BERTH_E_NOMEM, "tokenizer: out of memory")
#define UNK_PENALTY 10.0

typedef struct {
    tok_model base;
    double *scores;
    size_t n;
    int32_t unk_id;
    bool byte_fallback;
    int32_t byte_ids[256];
    size_t max_len;        /* longest piece in bytes */
    double unk_score;
} unigram;

static void unigram_free(tok_model *base)
{
    unigram *m = (unigram *)base;
    free(m->scores);
    free(m);
}

typedef struct { double score; size_t start; int32_t id; bool set; } node;

static berth_status unigram_encode(tok_model *base, const berth_tokenizer *t, const char *s, size_t n, int32_t **ids,
                                   size_t *nids, size_t *cap)
{
    unigram *m = (unigram *)base;
    node *best = calloc(n + 1, sizeof *best);
    size_t *starts = malloc((n + 1) * sizeof *starts);
    if (!best || !starts) { free(best), free(starts); return OOM(); }
    best[0].set = true;
    for (size_t pos = 0; pos < n;) {
        size_t cl = tok_utf8_len(s + pos, n - pos);
        if (best[pos].set) {
            bool single = false;
            /* every vocabulary piece starting here, shortest first (ties keep the first found, as in HF) */
            for (size_t len = 1; len <= m->max_len && pos + len <= n; len++) {
                if (pos + len < n && ((unsigned char)s[pos + len] & 0xC0) == 0x80) continue;
                int32_t id = tok_strmap_get(&t->vocab, s + pos, len);
                if (id < 0 || (size_t)id >= m->n) continue;
                if (len == cl) single = true;
                double sc = best[pos].score + m->scores[id];
                node *e = &best[pos + len];
                if (!e->set || sc > e->score) *e = (node){sc, pos, id, true};
            }
            if (!single) {
                double sc = best[pos].score + m->unk_score;
                node *e = &best[pos + cl];
                if (!e->set || sc > e->score) *e = (node){sc, pos, m->unk_id, true};
            }
        }
        pos += cl;
    }
    /* walk back, then emit forward; runs of unk become one piece */
    size_t k = 0;
    for (size_t at = n; at > 0; at = best[at].start) starts[k++] = at;
    berth_status st = BERTH_OK;
    size_t prev_end = 0;
    for (size_t i = k; i-- > 0 && !st;) {
        size_t end = starts[i], b = prev_end;
        int32_t id = best[end].id;
        prev_end = end;
        if (id == m->unk_id) {
            while (i > 0 && best[starts[i - 1]].id == m->unk_id) end = starts[--i];
            prev_end = end;
            if (m->unk_id < 0) { st = berth_fail(BERTH_E_INVALID, "tok_encode: unknown character and the Unigram model has no unk_id"); break; }
            /* the fused text may itself be a piece (HF looks the string up again) */
            int32_t again = tok_strmap_get(&t->vocab, s + b, end - b);
            if (again >= 0) { if (!tok_ids_push(ids, nids, cap, again)) st = OOM(); continue; }
            if (m->byte_fallback) {
                bool all = true;
                for (size_t q = b; q < end; q++) all = all && m->byte_ids[(uint8_t)s[q]] >= 0;
                if (all) {
                    for (size_t q = b; q < end && !st; q++)
                        if (!tok_ids_push(ids, nids, cap, m->byte_ids[(uint8_t)s[q]])) st = OOM();
                    continue;
                }
            }
        }
        if (!st && !tok_ids_push(ids, nids, cap, id)) st = OOM();
    }
    free(best);
    free(starts);
    return st;
}

berth_status tok_unigram_parse(berth_tokenizer *t, const json_t *model, const char *file, tok_model **out)
{
    const json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_array(vocab)) return berth_fail(BERTH_E_INVALID, "%s: model.vocab: expected an array", file);
    unigram *m = calloc(1, sizeof *m);
    if (!m) return OOM();
    m->base.encode = unigram_encode;
    m->base.free = unigram_free;
    m->n = json_array_size(vocab);
    berth_status st = BERTH_OK;
    t->n_ids = m->n;
    m->scores = calloc(m->n ? m->n : 1, sizeof *m->scores);
    t->pieces = calloc(m->n ? m->n : 1, sizeof *t->pieces);
    t->piece_len = calloc(m->n ? m->n : 1, sizeof *t->piece_len);
    if (!m->scores || !t->pieces || !t->piece_len) st = OOM();
    double min = INFINITY;
    for (size_t i = 0; i < m->n && !st; i++) {
        const json_t *e = json_array_get(vocab, i);
        const json_t *p = json_array_get(e, 0), *sc = json_array_get(e, 1);
        if (!json_is_array(e) || json_array_size(e) != 2 || !json_is_string(p) || !json_is_number(sc)) {
            st = berth_fail(BERTH_E_INVALID, "%s: model.vocab[%zu]: expected [\"piece\", score]", file, i);
            break;
        }
        size_t len = json_string_length(p);
        if (!(t->pieces[i] = malloc(len + 1))) { st = OOM(); break; }
        memcpy(t->pieces[i], json_string_value(p), len + 1);
        t->piece_len[i] = (uint32_t)len;
        m->scores[i] = json_number_value(sc);
        if (m->scores[i] < min) min = m->scores[i];
        if (len > m->max_len) m->max_len = len;
        if (tok_strmap_get(&t->vocab, json_string_value(p), len) < 0 &&
            !tok_strmap_put(&t->vocab, json_string_value(p), len, (int32_t)i))
            st = OOM();
    }
    m->unk_score = (m->n ? min : 0.0) - UNK_PENALTY;
    m->unk_id = -1;
    const json_t *unk = json_object_get(model, "unk_id");
    if (!st && unk && !json_is_null(unk)) {
        if (!json_is_integer(unk) || json_integer_value(unk) < 0 || (size_t)json_integer_value(unk) >= m->n)
            st = berth_fail(BERTH_E_INVALID, "%s: model.unk_id: expected an index into model.vocab", file);
        else m->unk_id = (int32_t)json_integer_value(unk);
    }
    const json_t *bf = json_object_get(model, "byte_fallback");
    if (!st && bf && !json_is_null(bf) && !json_is_boolean(bf))
        st = berth_fail(BERTH_E_INVALID, "%s: model.byte_fallback: expected a boolean", file);
    m->byte_fallback = json_is_true(bf);
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        m->byte_ids[b] = tok_strmap_get(&t->vocab, name, 6);
    }
    if (st) {
        unigram_free(&m->base);
        return st;
    }
    *out = &m->base;
    return BERTH_OK;
}

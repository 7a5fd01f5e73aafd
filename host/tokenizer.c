/*
 * tokenizer.c — loading tokenizer.json / tokenizer_config.json and the encode pipeline: added tokens first,
 * then normalizer, pre-tokenizer and model per remaining segment, then the post-processor template.
 * Decoding and streaming live in tok_decode.c; the model, normalizer and pre-tokenizer parts in tok_*.c.
 */
#include "tok_internal.h"

#include "errors.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>
#include <zlib.h>

#define OOM() berth_fail(BERTH_E_NOMEM, "tokenizer: out of memory")
#define MAX_FILE_BYTES ((size_t)1 << 30)

/* Whole file, gzip or plain (zlib reads both). Caller frees *out. */
static berth_status read_file(const char *path, char **out, size_t *len)
{
    gzFile f = gzopen(path, "rb");
    if (!f) return berth_fail(BERTH_E_IO, "%s: cannot open", path);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) { gzclose(f); return OOM(); }
        if (cap - n < (1 << 16)) {
            if (cap >= MAX_FILE_BYTES) { free(buf); gzclose(f); return berth_fail(BERTH_E_INVALID, "%s: larger than 1 GiB", path); }
            char *nb = realloc(buf, cap * 2);
            if (!nb) { free(buf); gzclose(f); return OOM(); }
            buf = nb, cap *= 2;
        }
        int r = gzread(f, buf + n, (unsigned)(cap - n));
        if (r < 0) {
            int e;
            const char *msg = gzerror(f, &e);
            berth_status st = berth_fail(BERTH_E_IO, "%s: read error: %s", path, msg);
            free(buf);
            gzclose(f);
            return st;
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    gzclose(f);
    *out = buf;
    *len = n;
    return BERTH_OK;
}

static berth_status load_json(const char *path, size_t flags, json_t **out)
{
    char *buf = NULL;
    size_t len = 0;
    berth_status st = read_file(path, &buf, &len);
    if (st) return st;
    json_error_t err;
    *out = json_loadb(buf, len, JSON_ALLOW_NUL | flags, &err);
    free(buf);
    if (!*out) return berth_fail(BERTH_E_INVALID, "%s: JSON error at line %d column %d: %s", path, err.line, err.column,
                                 err.text);
    return BERTH_OK;
}

void tok_free(berth_tokenizer *t)
{
    if (!t) return;
    if (t->model) t->model->free(t->model);
    tok_normalizer_free(t->normalizer);
    tok_pretok_free(t->pretok);
    tok_decoder_free(t->decoder);
    for (size_t i = 0; i < t->n_ids; i++) free(t->pieces[i]);
    free(t->pieces);
    free(t->piece_len);
    free(t->is_special);
    for (size_t i = 0; i < t->n_added; i++) free(t->added[i].content), free(t->added[i].norm);
    free(t->added);
    free(t->added_lens);
    free(t->added_norm_lens);
    tok_strmap_free(&t->vocab);
    tok_strmap_free(&t->added_raw);
    tok_strmap_free(&t->added_norm);
    for (size_t i = 0; i < t->n_tmpl; i++) free(t->tmpl[i].ids);
    free(t->tmpl);
    free(t->file);
    free(t);
}

static berth_status ensure_ids(berth_tokenizer *t, size_t n)
{
    if (n <= t->n_ids) return BERTH_OK;
    char **p = realloc(t->pieces, n * sizeof *p);
    if (!p) return OOM();
    t->pieces = p;
    uint32_t *l = realloc(t->piece_len, n * sizeof *l);
    if (!l) return OOM();
    t->piece_len = l;
    for (size_t i = t->n_ids; i < n; i++) p[i] = NULL, l[i] = 0;
    t->n_ids = n;
    return BERTH_OK;
}

static berth_status add_len(size_t **lens, size_t *n, size_t len)
{
    for (size_t i = 0; i < *n; i++)
        if ((*lens)[i] == len) return BERTH_OK;
    size_t *p = realloc(*lens, (*n + 1) * sizeof *p);
    if (!p) return OOM();
    *lens = p;
    size_t i = (*n)++;
    while (i && p[i - 1] < len) { p[i] = p[i - 1]; i--; } /* longest first */
    p[i] = len;
    return BERTH_OK;
}

static berth_status flag(const json_t *o, const char *key, const char *file, size_t i, bool *out)
{
    const json_t *v = json_object_get(o, key);
    *out = false;
    if (!v) return BERTH_OK;
    if (!json_is_boolean(v)) return berth_fail(BERTH_E_INVALID, "%s: added_tokens[%zu].%s: expected a boolean", file, i, key);
    *out = json_is_true(v);
    return BERTH_OK;
}

static berth_status load_added(berth_tokenizer *t, const json_t *arr, const char *file)
{
    if (!arr || json_is_null(arr)) return BERTH_OK;
    if (!json_is_array(arr)) return berth_fail(BERTH_E_INVALID, "%s: added_tokens: expected an array", file);
    size_t n = json_array_size(arr);
    if (n && !(t->added = calloc(n, sizeof *t->added))) return OOM();
    for (size_t i = 0; i < n; i++) {
        const json_t *o = json_array_get(arr, i), *id = json_object_get(o, "id"), *c = json_object_get(o, "content");
        if (!json_is_object(o)) return berth_fail(BERTH_E_INVALID, "%s: added_tokens[%zu]: expected an object", file, i);
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= INT32_MAX / 2)
            return berth_fail(BERTH_E_INVALID, "%s: added_tokens[%zu].id: expected an id in [0, 2^30)", file, i);
        if (!json_is_string(c) || json_string_length(c) == 0)
            return berth_fail(BERTH_E_INVALID, "%s: added_tokens[%zu].content: expected a non-empty string", file, i);
        tok_added *a = &t->added[t->n_added++];
        a->id = (int32_t)json_integer_value(id);
        a->len = json_string_length(c);
        if (!(a->content = malloc(a->len + 1))) return OOM();
        memcpy(a->content, json_string_value(c), a->len + 1);
        berth_status st;
        if ((st = flag(o, "special", file, i, &a->special)) || (st = flag(o, "lstrip", file, i, &a->lstrip)) ||
            (st = flag(o, "rstrip", file, i, &a->rstrip)) || (st = flag(o, "single_word", file, i, &a->single_word)) ||
            (st = flag(o, "normalized", file, i, &a->normalized)))
            return st;
        if ((st = ensure_ids(t, (size_t)a->id + 1))) return st;
        if (!t->pieces[a->id]) {
            if (!(t->pieces[a->id] = malloc(a->len + 1))) return OOM();
            memcpy(t->pieces[a->id], a->content, a->len + 1);
            t->piece_len[a->id] = (uint32_t)a->len;
        }
        if (a->normalized && t->normalizer) {
            tok_buf nb = {0};
            if ((st = tok_normalize(t->normalizer, a->content, a->len, &nb))) return st;
            a->norm = nb.p, a->norm_len = nb.len;
            if (!a->norm_len) continue; /* normalizes to nothing: can never match */
            if (!tok_strmap_put(&t->added_norm, a->norm, a->norm_len, (int32_t)(t->n_added - 1))) return OOM();
            if ((st = add_len(&t->added_norm_lens, &t->n_added_norm_lens, a->norm_len))) return st;
            t->added_norm_first[(uint8_t)a->norm[0] >> 3] |= (uint8_t)(1u << ((uint8_t)a->norm[0] & 7));
        } else {
            if (!tok_strmap_put(&t->added_raw, a->content, a->len, (int32_t)(t->n_added - 1))) return OOM();
            if ((st = add_len(&t->added_lens, &t->n_added_lens, a->len))) return st;
            t->added_first[(uint8_t)a->content[0] >> 3] |= (uint8_t)(1u << ((uint8_t)a->content[0] & 7));
        }
    }
    return BERTH_OK;
}

/* Token name -> id through the added tokens or the vocabulary. */
int32_t tok_piece_to_id(const berth_tokenizer *t, const char *piece)
{
    size_t n = strlen(piece);
    int32_t a = tok_strmap_get(&t->added_raw, piece, n);
    if (a >= 0) return t->added[a].id;
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && !memcmp(t->added[i].content, piece, n)) return t->added[i].id;
    return tok_strmap_get(&t->vocab, piece, n);
}

static berth_status tmpl_push(berth_tokenizer *t, bool is_seq, const int32_t *ids, size_t n)
{
    tok_tmpl_item *p = realloc(t->tmpl, (t->n_tmpl + 1) * sizeof *p);
    if (!p) return OOM();
    t->tmpl = p;
    tok_tmpl_item *it = &p[t->n_tmpl];
    it->is_seq = is_seq;
    it->n = n;
    it->ids = NULL;
    if (n && !(it->ids = malloc(n * sizeof *ids))) return OOM();
    if (n) memcpy(it->ids, ids, n * sizeof *ids);
    t->n_tmpl++;
    return BERTH_OK;
}

static berth_status check_id(const berth_tokenizer *t, int64_t id, const char *file, const char *field)
{
    if (id < 0 || (size_t)id >= t->n_ids || !t->pieces[id])
        return berth_fail(BERTH_E_INVALID, "%s: %s: id %lld is not in the vocabulary", file, field, (long long)id);
    return BERTH_OK;
}

static berth_status load_post(berth_tokenizer *t, const json_t *j, const char *file, const char *field)
{
    if (!j || json_is_null(j)) return BERTH_OK;
    const json_t *type = json_is_object(j) ? json_object_get(j, "type") : NULL;
    if (!json_is_string(type)) return berth_fail(BERTH_E_INVALID, "%s: %s.type: expected a string", file, field);
    const char *ty = json_string_value(type);
    char f[256];
    berth_status st;
    if (!strcmp(ty, "ByteLevel")) return BERTH_OK; /* only adjusts offsets */
    if (!strcmp(ty, "Sequence")) {
        const json_t *arr = json_object_get(j, "processors");
        if (!json_is_array(arr)) return berth_fail(BERTH_E_INVALID, "%s: %s.processors: expected an array", file, field);
        for (size_t i = 0; i < json_array_size(arr); i++) {
            snprintf(f, sizeof f, "%s.processors[%zu]", field, i);
            size_t before = t->n_tmpl;
            if ((st = load_post(t, json_array_get(arr, i), file, f))) return st;
            if (before && t->n_tmpl != before)
                return berth_fail(BERTH_E_UNSUPPORTED, "%s: %s: more than one template post-processor", file, f);
        }
        return BERTH_OK;
    }
    if (!strcmp(ty, "BertProcessing") || !strcmp(ty, "RobertaProcessing")) {
        const json_t *cls = json_object_get(j, "cls"), *sep = json_object_get(j, "sep");
        if (!json_is_array(cls) || !json_is_integer(json_array_get(cls, 1)) || !json_is_array(sep) ||
            !json_is_integer(json_array_get(sep, 1)))
            return berth_fail(BERTH_E_INVALID, "%s: %s: cls/sep: expected [\"token\", id]", file, field);
        int32_t c = (int32_t)json_integer_value(json_array_get(cls, 1)), s = (int32_t)json_integer_value(json_array_get(sep, 1));
        if ((st = check_id(t, json_integer_value(json_array_get(cls, 1)), file, field)) ||
            (st = check_id(t, json_integer_value(json_array_get(sep, 1)), file, field)))
            return st;
        if ((st = tmpl_push(t, false, &c, 1)) || (st = tmpl_push(t, true, NULL, 0)) || (st = tmpl_push(t, false, &s, 1)))
            return st;
        return BERTH_OK;
    }
    if (strcmp(ty, "TemplateProcessing"))
        return berth_fail(BERTH_E_UNSUPPORTED, "%s: %s.type: unsupported post-processor \"%s\"", file, field, ty);
    const json_t *single = json_object_get(j, "single"), *specials = json_object_get(j, "special_tokens");
    if (!json_is_array(single)) return berth_fail(BERTH_E_INVALID, "%s: %s.single: expected an array", file, field);
    if (!json_is_object(specials))
        return berth_fail(BERTH_E_INVALID, "%s: %s.special_tokens: expected an object", file, field);
    for (size_t i = 0; i < json_array_size(single); i++) {
        const json_t *it = json_array_get(single, i);
        const json_t *sp = json_object_get(it, "SpecialToken"), *sq = json_object_get(it, "Sequence");
        if (json_is_object(sq)) {
            if ((st = tmpl_push(t, true, NULL, 0))) return st;
            continue;
        }
        const json_t *name = json_object_get(sp, "id");
        if (!json_is_string(name))
            return berth_fail(BERTH_E_INVALID, "%s: %s.single[%zu]: expected {\"SpecialToken\": {\"id\": ...}} or "
                              "{\"Sequence\": ...}", file, field, i);
        const json_t *def = json_object_get(specials, json_string_value(name));
        const json_t *ids = json_object_get(def, "ids");
        if (!json_is_array(ids))
            return berth_fail(BERTH_E_INVALID, "%s: %s.special_tokens[\"%.64s\"].ids: expected an array", file, field,
                              json_string_value(name));
        int32_t v[64];
        size_t n = json_array_size(ids);
        if (n > 64) return berth_fail(BERTH_E_INVALID, "%s: %s.special_tokens[\"%.64s\"].ids: more than 64 ids", file,
                                      field, json_string_value(name));
        for (size_t k = 0; k < n; k++) {
            const json_t *x = json_array_get(ids, k);
            snprintf(f, sizeof f, "%s.special_tokens[\"%.64s\"].ids[%zu]", field, json_string_value(name), k);
            if (!json_is_integer(x)) return berth_fail(BERTH_E_INVALID, "%s: %s: expected an integer", file, f);
            if ((st = check_id(t, json_integer_value(x), file, f))) return st;
            v[k] = (int32_t)json_integer_value(x);
        }
        if ((st = tmpl_push(t, false, v, n))) return st;
    }
    return BERTH_OK;
}

/* bos_token / eos_token in tokenizer_config.json: a string, {"content": ...} or null. */
static berth_status config_token(berth_tokenizer *t, const json_t *cfg, const char *key, const char *file, int32_t *out)
{
    const json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v)) return BERTH_OK;
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v)) return berth_fail(BERTH_E_INVALID, "%s: %s: expected a string, {\"content\": ...} or null", file, key);
    int32_t id = tok_piece_to_id(t, json_string_value(v));
    if (id < 0) return berth_fail(BERTH_E_INVALID, "%s: %s: \"%.64s\" is not a token of the tokenizer", file, key,
                                  json_string_value(v));
    *out = id;
    return BERTH_OK;
}

static berth_status load_config(berth_tokenizer *t, const char *path)
{
    json_t *cfg;
    /* real files hold integers past 2^63 (model_max_length = 1e30 written as an integer); only strings are read
     * here, so numbers may become doubles */
    berth_status st = load_json(path, JSON_DECODE_INT_AS_REAL, &cfg);
    if (st) return st;
    if (!json_is_object(cfg)) st = berth_fail(BERTH_E_INVALID, "%s: expected a JSON object", path);
    if (!st) st = config_token(t, cfg, "bos_token", path, &t->bos_id);
    if (!st) st = config_token(t, cfg, "eos_token", path, &t->eos_id);
    json_decref(cfg);
    return st;
}

berth_status tok_load(const char *path, const char *config_path, berth_tokenizer **out)
{
    *out = NULL;
    json_t *root;
    berth_status st = load_json(path, 0, &root);
    if (st) return st;
    berth_tokenizer *t = calloc(1, sizeof *t);
    if (!t || !(t->file = strdup(path))) {
        free(t);
        json_decref(root);
        return OOM();
    }
    t->bos_id = t->eos_id = -1;
    const json_t *model = json_object_get(root, "model");
    const json_t *mtype = json_object_get(model, "type");
    if (!json_is_object(root)) st = berth_fail(BERTH_E_INVALID, "%s: expected a JSON object", path);
    else if (!json_is_object(model)) st = berth_fail(BERTH_E_INVALID, "%s: model: expected an object", path);
    if (!st) st = tok_normalizer_parse(json_object_get(root, "normalizer"), path, "normalizer", &t->normalizer);
    if (!st) st = tok_pretok_parse(json_object_get(root, "pre_tokenizer"), path, "pre_tokenizer", &t->pretok);
    if (!st) {
        /* older files omit model.type for BPE */
        const char *ty = json_is_string(mtype) ? json_string_value(mtype) : (mtype ? NULL : "BPE");
        if (!ty) st = berth_fail(BERTH_E_INVALID, "%s: model.type: expected a string", path);
        else if (!strcmp(ty, "BPE")) st = tok_bpe_parse(t, model, path, &t->model);
        else if (!strcmp(ty, "Unigram")) st = tok_unigram_parse(t, model, path, &t->model);
        else st = berth_fail(BERTH_E_UNSUPPORTED, "%s: model.type: unsupported model \"%s\"", path, ty);
    }
    if (!st) st = load_added(t, json_object_get(root, "added_tokens"), path);
    if (!st && !(t->is_special = calloc(t->n_ids ? t->n_ids : 1, 1))) st = OOM();
    for (size_t i = 0; !st && i < t->n_added; i++) t->is_special[t->added[i].id] = t->added[i].special;
    if (!st) st = load_post(t, json_object_get(root, "post_processor"), path, "post_processor");
    if (!st) st = tok_decoder_parse(json_object_get(root, "decoder"), path, "decoder", &t->decoder);
    for (size_t i = 0; !st && i < t->n_tmpl; i++)
        if (!t->tmpl[i].is_seq && t->tmpl[i].n) { t->bos_id = t->tmpl[i].ids[0]; break; }
    if (t->n_tmpl && t->tmpl[0].is_seq) t->bos_id = -1; /* template adds nothing in front */
    if (!st && config_path) st = load_config(t, config_path);
    json_decref(root);
    if (st) {
        tok_free(t);
        return st;
    }
    *out = t;
    return BERTH_OK;
}

/* ---------------------------------------------------------------------------------------------------------------
 * Encoding */

typedef struct {
    const char *s;
    size_t n;
    int32_t added; /* index into t->added, or -1 for text */
    size_t off;    /* byte offset in the text it came from */
} piece;

typedef struct {
    piece *v;
    size_t n, cap;
} pieces;

static bool pieces_push(pieces *p, piece x)
{
    if (p->n == p->cap) {
        size_t c = p->cap ? p->cap * 2 : 16;
        piece *nv = realloc(p->v, c * sizeof *nv);
        if (!nv) return false;
        p->v = nv, p->cap = c;
    }
    p->v[p->n++] = x;
    return true;
}

static bool is_word_char(int32_t cp)
{
    if (cp == '_') return true;
    if (cp < 0) return false;
    utf8proc_category_t c = utf8proc_category(cp);
    return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) || (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
}

static int32_t cp_before(const char *s, size_t at)
{
    size_t k = at - 1, adv;
    while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
    return tok_utf8_decode(s + k, at - k, &adv);
}

/* Splits s at added tokens (leftmost, longest first), honouring single_word, lstrip and rstrip. */
static berth_status split_added(const berth_tokenizer *t, const tok_strmap *map, const size_t *lens, size_t nlens,
                                const uint8_t first[32], bool norm, const char *s, size_t n, size_t base_off,
                                pieces *out)
{
    size_t seg = 0, i = 0;
    while (i < n && nlens) {
        int32_t hit = -1;
        size_t hl = 0;
        const uint8_t c0 = (uint8_t)s[i];
        /* No added token starts with this byte: skip the per-length lookups (each hashes lens[k] bytes). */
        for (size_t k = 0; k < nlens && (first[c0 >> 3] >> (c0 & 7) & 1); k++) {
            if (i + lens[k] > n) continue;
            int32_t a = tok_strmap_get(map, s + i, lens[k]);
            if (a >= 0) { hit = a, hl = lens[k]; break; }
        }
        if (hit < 0) {
            i += tok_utf8_len(s + i, n - i);
            continue;
        }
        const tok_added *a = &t->added[hit];
        size_t b = i, e = i + hl, adv;
        if (a->single_word) {
            bool ok_l = b == 0 || !is_word_char(cp_before(s, b));
            bool ok_r = e == n || !is_word_char(tok_utf8_decode(s + e, n - e, &adv));
            if (!ok_l || !ok_r) { i = e; continue; }
        }
        if (a->lstrip) {
            for (;;) {
                if (b <= seg) break;
                size_t k = b - 1;
                while (k > seg && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
                if (!tok_is_whitespace(tok_utf8_decode(s + k, b - k, &adv))) break;
                b = k;
            }
        }
        if (a->rstrip)
            while (e < n) {
                int32_t cp = tok_utf8_decode(s + e, n - e, &adv);
                if (!tok_is_whitespace(cp)) break;
                e += adv;
            }
        if (b > seg && !pieces_push(out, (piece){s + seg, b - seg, -1, base_off + seg})) return OOM();
        if (!pieces_push(out, (piece){s + b, e - b, hit, base_off + b})) return OOM();
        seg = i = e;
    }
    (void)norm;
    if (n > seg && !pieces_push(out, (piece){s + seg, n - seg, -1, base_off + seg})) return OOM();
    return BERTH_OK;
}

/* Normalize, pre-tokenize and run the model over one text segment. */
static berth_status encode_text(berth_tokenizer *t, const char *s, size_t n, size_t off, int32_t **ids, size_t *nids,
                                size_t *cap)
{
    tok_buf nb = {0};
    berth_status st = tok_normalize(t->normalizer, s, n, &nb);
    pieces sub = {0};
    if (!st) {
        if (t->n_added_norm_lens)
            st = split_added(t, &t->added_norm, t->added_norm_lens, t->n_added_norm_lens, t->added_norm_first, true,
                             nb.p, nb.len, 0, &sub);
        else if (nb.len && !pieces_push(&sub, (piece){nb.p, nb.len, -1, 0}))
            st = OOM();
    }
    for (size_t i = 0; i < sub.n && !st; i++) {
        if (sub.v[i].added >= 0) {
            if (!tok_ids_push(ids, nids, cap, t->added[sub.v[i].added].id)) st = OOM();
            continue;
        }
        tok_strs words = {0};
        st = tok_pretokenize(t->pretok, sub.v[i].s, sub.v[i].n, off == 0 && sub.v[i].off == 0, &words);
        for (size_t w = 0; w < words.n && !st; w++) st = t->model->encode(t->model, t, words.s[w], words.len[w], ids, nids, cap);
        tok_strs_free(&words);
    }
    free(sub.v);
    tok_buf_free(&nb);
    return st;
}

berth_status tok_encode(berth_tokenizer *t, const char *text, size_t len, int add_special, int32_t **out_ids,
                        size_t *out_n)
{
    *out_ids = NULL;
    *out_n = 0;
    for (size_t i = 0; i < len;) {
        size_t adv;
        if (tok_utf8_decode(text + i, len - i, &adv) < 0)
            return berth_fail(BERTH_E_INVALID, "tok_encode: invalid UTF-8 at byte %zu", i);
        i += adv;
    }
    pieces top = {0};
    berth_status st = split_added(t, &t->added_raw, t->added_lens, t->n_added_lens, t->added_first, false, text, len,
                                  0, &top);
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    for (size_t i = 0; i < top.n && !st; i++) {
        if (top.v[i].added >= 0) st = tok_ids_push(&ids, &n, &cap, t->added[top.v[i].added].id) ? BERTH_OK : OOM();
        else st = encode_text(t, top.v[i].s, top.v[i].n, top.v[i].off, &ids, &n, &cap);
    }
    free(top.v);
    if (!st && add_special && t->n_tmpl) {
        int32_t *res = NULL;
        size_t rn = 0, rcap = 0;
        bool ok = true;
        for (size_t i = 0; i < t->n_tmpl && ok; i++) {
            if (t->tmpl[i].is_seq)
                for (size_t k = 0; k < n && ok; k++) ok = tok_ids_push(&res, &rn, &rcap, ids[k]);
            else
                for (size_t k = 0; k < t->tmpl[i].n && ok; k++) ok = tok_ids_push(&res, &rn, &rcap, t->tmpl[i].ids[k]);
        }
        free(ids);
        ids = res, n = rn;
        if (!ok) st = OOM();
    }
    if (st) {
        free(ids);
        return st;
    }
    if (!ids && !(ids = malloc(sizeof *ids))) return OOM(); /* never hand back NULL on success */
    *out_ids = ids;
    *out_n = n;
    return BERTH_OK;
}

const char *tok_id_to_piece(const berth_tokenizer *t, int32_t id)
{
    return (id >= 0 && (size_t)id < t->n_ids) ? t->pieces[id] : NULL;
}

size_t tok_vocab_size(const berth_tokenizer *t) { return t->n_ids; }
int32_t tok_bos_id(const berth_tokenizer *t) { return t->bos_id; }
int32_t tok_eos_id(const berth_tokenizer *t) { return t->eos_id; }
int tok_is_special(const berth_tokenizer *t, int32_t id)
{
    return id >= 0 && (size_t)id < t->n_ids && t->is_special[id];
}

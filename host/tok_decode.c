/*
 * tok_decode.c — decoders (ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence), tok_decode and
 * the streaming detokenizer.
 */
#include "tok_internal.h"

#include "errors.h"

#include <stdlib.h>
#include <string.h>

#define OOM() berth_fail(BERTH_E_NOMEM, "tokenizer: out of memory")

enum { D_BYTELEVEL, D_METASPACE, D_REPLACE, D_BYTEFALLBACK, D_FUSE, D_STRIP, D_SEQ };

struct tok_decoder {
    int kind;
    tok_pattern *pat;        /* D_REPLACE */
    char *text;              /* D_REPLACE content; D_STRIP / D_METASPACE character */
    size_t text_len;
    bool prepend;            /* D_METASPACE: strip the space it prepended to the first token */
    size_t start, stop;      /* D_STRIP */
    tok_decoder **items;
    size_t n_items;
};

void tok_decoder_free(tok_decoder *d)
{
    if (!d) return;
    tok_pattern_free(d->pat);
    free(d->text);
    for (size_t i = 0; i < d->n_items; i++) tok_decoder_free(d->items[i]);
    free(d->items);
    free(d);
}

static berth_status one_char(const json_t *j, const char *key, const char *file, const char *field, char **out,
                             size_t *len)
{
    const json_t *v = json_object_get(j, key);
    size_t adv;
    if (!json_is_string(v) || tok_utf8_decode(json_string_value(v), json_string_length(v), &adv) < 0 ||
        adv != json_string_length(v))
        return berth_fail(BERTH_E_INVALID, "%s: %s.%s: expected a one-character string", file, field, key);
    if (!(*out = strdup(json_string_value(v)))) return OOM();
    *len = adv;
    return BERTH_OK;
}

static berth_status count(const json_t *j, const char *key, const char *file, const char *field, size_t *out)
{
    const json_t *v = json_object_get(j, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 1000000)
        return berth_fail(BERTH_E_INVALID, "%s: %s.%s: expected a non-negative integer", file, field, key);
    *out = (size_t)json_integer_value(v);
    return BERTH_OK;
}

berth_status tok_decoder_parse(const json_t *j, const char *file, const char *field, tok_decoder **out)
{
    *out = NULL;
    if (!j || json_is_null(j)) return BERTH_OK;
    const json_t *type = json_is_object(j) ? json_object_get(j, "type") : NULL;
    if (!json_is_string(type)) return berth_fail(BERTH_E_INVALID, "%s: %s.type: expected a string", file, field);
    const char *ty = json_string_value(type);
    tok_decoder *d = calloc(1, sizeof *d);
    if (!d) return OOM();
    berth_status st = BERTH_OK;
    char f[256];
    if (!strcmp(ty, "ByteLevel")) d->kind = D_BYTELEVEL;
    else if (!strcmp(ty, "ByteFallback")) d->kind = D_BYTEFALLBACK;
    else if (!strcmp(ty, "Fuse")) d->kind = D_FUSE;
    else if (!strcmp(ty, "Replace")) {
        d->kind = D_REPLACE;
        snprintf(f, sizeof f, "%s.pattern", field);
        st = tok_pattern_parse(json_object_get(j, "pattern"), file, f, &d->pat);
        const json_t *c = json_object_get(j, "content");
        if (!st && !json_is_string(c)) st = berth_fail(BERTH_E_INVALID, "%s: %s.content: expected a string", file, field);
        if (!st && !(d->text = strdup(json_string_value(c)))) st = OOM();
        if (!st) d->text_len = strlen(d->text);
    } else if (!strcmp(ty, "Strip")) {
        d->kind = D_STRIP;
        st = one_char(j, "content", file, field, &d->text, &d->text_len);
        if (!st) st = count(j, "start", file, field, &d->start);
        if (!st) st = count(j, "stop", file, field, &d->stop);
    } else if (!strcmp(ty, "Metaspace")) {
        d->kind = D_METASPACE;
        st = one_char(j, "replacement", file, field, &d->text, &d->text_len);
        const json_t *ps = json_object_get(j, "prepend_scheme"), *aps = json_object_get(j, "add_prefix_space");
        d->prepend = true;
        if (json_is_string(ps)) d->prepend = strcmp(json_string_value(ps), "never") != 0;
        else if (json_is_boolean(aps)) d->prepend = json_is_true(aps);
    } else if (!strcmp(ty, "Sequence")) {
        d->kind = D_SEQ;
        const json_t *arr = json_object_get(j, "decoders");
        if (!json_is_array(arr)) {
            st = berth_fail(BERTH_E_INVALID, "%s: %s.decoders: expected an array", file, field);
        } else if (json_array_size(arr) && !(d->items = calloc(json_array_size(arr), sizeof *d->items))) {
            st = OOM();
        } else {
            for (size_t i = 0; i < json_array_size(arr) && !st; i++) {
                snprintf(f, sizeof f, "%s.decoders[%zu]", field, i);
                st = tok_decoder_parse(json_array_get(arr, i), file, f, &d->items[i]);
                d->n_items = i + 1;
            }
        }
    } else {
        st = berth_fail(BERTH_E_UNSUPPORTED, "%s: %s.type: unsupported decoder \"%s\"", file, field, ty);
    }
    if (st) {
        tok_decoder_free(d);
        return st;
    }
    *out = d;
    return BERTH_OK;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* "<0xAB>" -> 0xAB, else -1 */
static int byte_token(const char *s, size_t n)
{
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    int h = hexval(s[3]), l = hexval(s[4]);
    return (h < 0 || l < 0) ? -1 : h * 16 + l;
}

static bool replace_all(const tok_pattern *p, const char *rep, size_t rl, const char *s, size_t n, tok_buf *out)
{
    size_t at = 0, ms, me;
    while (tok_pattern_next(p, s, n, at, &ms, &me)) {
        if (!tok_buf_put(out, s + at, ms - at) || !tok_buf_put(out, rep, rl)) return false;
        at = me;
    }
    return tok_buf_put(out, s + at, n - at);
}

/* One decoder step: in -> out (a new token list). */
static berth_status step(const tok_decoder *d, tok_strs *in, tok_strs *out)
{
    bool ok = true;
    switch (d->kind) {
    case D_BYTELEVEL: {
        tok_buf bytes = {0}, txt = {0};
        for (size_t i = 0; i < in->n && ok; i++) {
            size_t mark = bytes.len;
            bool all = true;
            for (size_t k = 0; k < in->len[i] && all && ok;) {
                size_t adv;
                int b = tok_bytelevel_byte(tok_utf8_decode(in->s[i] + k, in->len[i] - k, &adv));
                if (b < 0) all = false;
                else { char c = (char)b; ok = tok_buf_put(&bytes, &c, 1); }
                k += adv;
            }
            if (!all && ok) { bytes.len = mark; ok = tok_buf_put(&bytes, in->s[i], in->len[i]); }
        }
        if (ok) ok = tok_utf8_lossy(bytes.p ? bytes.p : "", bytes.len, &txt);
        if (ok) ok = tok_strs_push(out, txt.p ? txt.p : "", txt.len);
        tok_buf_free(&bytes);
        tok_buf_free(&txt);
        break;
    }
    case D_BYTEFALLBACK: {
        tok_buf pend = {0};
        size_t npend = 0;
        for (size_t i = 0; i <= in->n && ok; i++) {
            int b = i < in->n ? byte_token(in->s[i], in->len[i]) : -1;
            if (b >= 0) {
                char c = (char)b;
                ok = tok_buf_put(&pend, &c, 1);
                npend++;
                continue;
            }
            if (npend) {
                size_t k = 0, adv;
                while (k < pend.len && tok_utf8_decode(pend.p + k, pend.len - k, &adv) >= 0) k += adv;
                if (k == pend.len) ok = tok_strs_push(out, pend.p, pend.len);
                else /* invalid bytes: one U+FFFD per byte token, as HF does */
                    for (size_t r = 0; r < npend && ok; r++) ok = tok_strs_push(out, "\xEF\xBF\xBD", 3);
                pend.len = 0;
                npend = 0;
            }
            if (i < in->n && ok) ok = tok_strs_push(out, in->s[i], in->len[i]);
        }
        tok_buf_free(&pend);
        break;
    }
    case D_FUSE: {
        tok_buf all = {0};
        for (size_t i = 0; i < in->n && ok; i++) ok = tok_buf_put(&all, in->s[i], in->len[i]);
        if (ok) ok = tok_strs_push(out, all.p ? all.p : "", all.len);
        tok_buf_free(&all);
        break;
    }
    case D_REPLACE:
        for (size_t i = 0; i < in->n && ok; i++) {
            tok_buf b = {0};
            ok = replace_all(d->pat, d->text, d->text_len, in->s[i], in->len[i], &b) &&
                 tok_strs_push(out, b.p ? b.p : "", b.len);
            tok_buf_free(&b);
        }
        break;
    case D_STRIP:
        for (size_t i = 0; i < in->n && ok; i++) {
            const char *s = in->s[i];
            size_t b = 0, e = in->len[i];
            for (size_t k = 0; k < d->start && e - b >= d->text_len && !memcmp(s + b, d->text, d->text_len); k++)
                b += d->text_len;
            for (size_t k = 0; k < d->stop && e - b >= d->text_len && !memcmp(s + e - d->text_len, d->text, d->text_len); k++)
                e -= d->text_len;
            ok = tok_strs_push(out, s + b, e - b);
        }
        break;
    case D_METASPACE:
        for (size_t i = 0; i < in->n && ok; i++) {
            tok_buf b = {0};
            const char *s = in->s[i];
            size_t n = in->len[i];
            for (size_t k = 0; k < n && ok;) {
                if (n - k >= d->text_len && !memcmp(s + k, d->text, d->text_len)) {
                    ok = tok_buf_put(&b, " ", 1);
                    k += d->text_len;
                } else {
                    ok = tok_buf_put(&b, s + k, 1);
                    k++;
                }
            }
            size_t skip = (ok && i == 0 && d->prepend && b.len && b.p[0] == ' ') ? 1 : 0;
            if (ok) ok = tok_strs_push(out, b.p ? b.p + skip : "", b.len - skip);
            tok_buf_free(&b);
        }
        break;
    default: { /* D_SEQ */
        tok_strs cur = *in;
        memset(in, 0, sizeof *in);
        for (size_t i = 0; i < d->n_items; i++) {
            tok_strs next = {0};
            berth_status st = step(d->items[i], &cur, &next);
            tok_strs_free(&cur);
            if (st) { tok_strs_free(&next); return st; }
            cur = next;
        }
        *out = cur;
        return BERTH_OK;
    }
    }
    return ok ? BERTH_OK : OOM();
}

berth_status tok_decoder_run(const tok_decoder *d, tok_strs *tokens, tok_buf *out)
{
    tok_strs res = {0};
    berth_status st = BERTH_OK;
    if (d) {
        st = step(d, tokens, &res);
    } else { /* no decoder: HF joins the tokens with spaces */
        for (size_t i = 0; i < tokens->n && !st; i++)
            if ((i && !tok_buf_put(out, " ", 1)) || !tok_buf_put(out, tokens->s[i], tokens->len[i])) st = OOM();
    }
    for (size_t i = 0; i < res.n && !st; i++)
        if (!tok_buf_put(out, res.s[i], res.len[i])) st = OOM();
    if (!st && !tok_buf_put(out, "", 0)) st = OOM();
    tok_strs_free(&res);
    return st;
}

static berth_status decode_buf(const berth_tokenizer *t, const int32_t *ids, size_t n, bool skip_special, tok_buf *out)
{
    tok_strs toks = {0};
    berth_status st = BERTH_OK;
    for (size_t i = 0; i < n && !st; i++) {
        if (ids[i] < 0 || (size_t)ids[i] >= t->n_ids || !t->pieces[ids[i]]) {
            st = berth_fail(BERTH_E_INVALID, "tok_decode: id %d is not in the vocabulary (size %zu)", ids[i], t->n_ids);
            break;
        }
        if (skip_special && t->is_special[ids[i]]) continue;
        if (!tok_strs_push(&toks, t->pieces[ids[i]], t->piece_len[ids[i]])) st = OOM();
    }
    if (!st) st = tok_decoder_run(t->decoder, &toks, out);
    tok_strs_free(&toks);
    return st;
}

berth_status tok_decode(const berth_tokenizer *t, const int32_t *ids, size_t n, int skip_special, char **text)
{
    size_t len;
    return tok_decode_n(t, ids, n, skip_special, text, &len);
}

berth_status tok_decode_n(const berth_tokenizer *t, const int32_t *ids, size_t n, int skip_special, char **text,
                          size_t *len)
{
    tok_buf b = {0};
    *text = NULL;
    *len = 0;
    berth_status st = decode_buf(t, ids, n, skip_special, &b);
    if (st) {
        tok_buf_free(&b);
        return st;
    }
    *text = b.p;
    *len = b.len;
    return BERTH_OK;
}

/* ---------------------------------------------------------------------------------------------------------------
 * Streaming. Like HF's DecodeStream: keep the ids since read_idx; prefix = decode(ids[read..prefix)); on a push,
 * decode(ids[read..]) and emit what extends the prefix, unless it ends in U+FFFD (an incomplete UTF-8 sequence,
 * possibly completed by the next id). Decoding a short window keeps each push O(1) in the stream length; the
 * window still holds earlier ids so context-dependent decoders (Metaspace's first-token rule) see the same
 * neighbours as a full decode would. */

struct berth_tok_stream {
    const berth_tokenizer *t;
    bool skip_special;
    int32_t *ids;
    size_t n, cap;
    size_t prefix_idx;   /* ids[0..prefix_idx) are emitted; ids[0] is the window start (read index) */
    size_t prefix_len;   /* bytes of decode(ids[0..prefix_idx)) */
};

berth_status tok_stream_new(const berth_tokenizer *t, int skip_special, berth_tok_stream **out)
{
    *out = calloc(1, sizeof **out);
    if (!*out) return OOM();
    (*out)->t = t;
    (*out)->skip_special = skip_special;
    return BERTH_OK;
}

void tok_stream_free(berth_tok_stream *s)
{
    if (!s) return;
    free(s->ids);
    free(s);
}

static bool ends_with_fffd(const tok_buf *b) { return b->len >= 3 && !memcmp(b->p + b->len - 3, "\xEF\xBF\xBD", 3); }

static berth_status emit(berth_tok_stream *s, bool final, char **piece, size_t *plen)
{
    *piece = NULL;
    *plen = 0;
    size_t rl = 0;
    tok_buf full = {0};
    berth_status st = decode_buf(s->t, s->ids, s->n, s->skip_special, &full);
    if (st) {
        tok_buf_free(&full);
        return st;
    }
    const char *p = full.p ? full.p : "";
    char *res;
    if ((final || (full.len > s->prefix_len && !ends_with_fffd(&full)))) {
        /* A decoder whose output for the window does not extend the prefix would break the guarantee; the
         * supported decoders never do that, but never index past the end. */
        size_t from = s->prefix_len <= full.len ? s->prefix_len : full.len;
        rl = full.len - from;
        if ((res = malloc(rl + 1))) memcpy(res, p + from, rl), res[rl] = '\0';
        /* slide the window: the last emitted chunk becomes the context */
        size_t keep = s->n - s->prefix_idx;
        if (keep) memmove(s->ids, s->ids + s->prefix_idx, keep * sizeof *s->ids);
        s->n = keep;
        s->prefix_idx = keep;
        tok_buf_free(&full);
        st = decode_buf(s->t, s->ids, s->n, s->skip_special, &full);
        s->prefix_len = full.len;
    } else {
        res = strdup("");
    }
    tok_buf_free(&full);
    if (!res) return OOM();
    if (st) { free(res); return st; }
    *piece = res;
    *plen = rl;
    return BERTH_OK;
}

berth_status tok_stream_push(berth_tok_stream *s, int32_t id, char **piece)
{
    size_t len;
    return tok_stream_push_n(s, id, piece, &len);
}

berth_status tok_stream_finish(berth_tok_stream *s, char **piece)
{
    size_t len;
    return tok_stream_finish_n(s, piece, &len);
}

berth_status tok_stream_push_n(berth_tok_stream *s, int32_t id, char **piece, size_t *len)
{
    *piece = NULL;
    *len = 0;
    const berth_tokenizer *t = s->t;
    if (id < 0 || (size_t)id >= t->n_ids || !t->pieces[id])
        return berth_fail(BERTH_E_INVALID, "tok_stream_push: id %d is not in the vocabulary (size %zu)", id, t->n_ids);
    if (!tok_ids_push(&s->ids, &s->n, &s->cap, id)) return OOM();
    return emit(s, false, piece, len);
}

berth_status tok_stream_finish_n(berth_tok_stream *s, char **piece, size_t *len)
{
    return emit(s, true, piece, len);
}

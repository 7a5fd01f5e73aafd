/*
 * tok_normalize.c — tokenizer.json normalizers: NFC/NFD/NFKC/NFKD (utf8proc, a maintained Unicode library rather
 * than hand-written tables), Lowercase, Replace, Prepend, Strip, StripAccents, Precompiled (tok_precompiled.c)
 * and Sequence.
 */
#include "tok_internal.h"

#include "errors.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

enum { N_UNICODE, N_LOWER, N_REPLACE, N_PREPEND, N_STRIP, N_STRIP_ACCENTS, N_PRECOMPILED, N_SEQ };

struct tok_normalizer {
    int kind;
    utf8proc_option_t uopt;   /* N_UNICODE */
    tok_pattern *pat;         /* N_REPLACE */
    char *text;               /* N_REPLACE content, N_PREPEND prepend */
    size_t text_len;
    bool left, right;         /* N_STRIP */
    tok_precompiled *pre;     /* N_PRECOMPILED */
    tok_normalizer **items;   /* N_SEQ */
    size_t n_items;
};

void tok_normalizer_free(tok_normalizer *n)
{
    if (!n) return;
    tok_pattern_free(n->pat);
    tok_precompiled_free(n->pre);
    free(n->text);
    for (size_t i = 0; i < n->n_items; i++) tok_normalizer_free(n->items[i]);
    free(n->items);
    free(n);
}

static berth_status get_str(const json_t *j, const char *key, const char *file, const char *field, char **out,
                            size_t *len)
{
    const json_t *v = json_object_get(j, key);
    if (!json_is_string(v))
        return berth_fail(BERTH_E_INVALID, "%s: %s.%s: expected a string", file, field, key);
    *len = json_string_length(v);
    if (!(*out = malloc(*len + 1))) return berth_fail(BERTH_E_NOMEM, "%s: %s: out of memory", file, field);
    memcpy(*out, json_string_value(v), *len + 1);
    return BERTH_OK;
}

berth_status tok_normalizer_parse(const json_t *j, const char *file, const char *field, tok_normalizer **out)
{
    *out = NULL;
    if (!j || json_is_null(j)) return BERTH_OK;
    const json_t *type = json_is_object(j) ? json_object_get(j, "type") : NULL;
    if (!json_is_string(type)) return berth_fail(BERTH_E_INVALID, "%s: %s.type: expected a string", file, field);
    const char *ty = json_string_value(type);
    tok_normalizer *n = calloc(1, sizeof *n);
    if (!n) return berth_fail(BERTH_E_NOMEM, "%s: %s: out of memory", file, field);
    berth_status st = BERTH_OK;
    char f[256];
    if (!strcmp(ty, "NFC")) n->kind = N_UNICODE, n->uopt = UTF8PROC_STABLE | UTF8PROC_COMPOSE;
    else if (!strcmp(ty, "NFD")) n->kind = N_UNICODE, n->uopt = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE;
    else if (!strcmp(ty, "NFKC")) n->kind = N_UNICODE, n->uopt = UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    else if (!strcmp(ty, "NFKD")) n->kind = N_UNICODE, n->uopt = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    else if (!strcmp(ty, "Lowercase")) n->kind = N_LOWER;
    else if (!strcmp(ty, "StripAccents")) n->kind = N_STRIP_ACCENTS;
    else if (!strcmp(ty, "Precompiled")) {
        n->kind = N_PRECOMPILED;
        st = tok_precompiled_parse(j, file, field, &n->pre);
    }
    else if (!strcmp(ty, "Replace")) {
        n->kind = N_REPLACE;
        snprintf(f, sizeof f, "%s.pattern", field);
        st = tok_pattern_parse(json_object_get(j, "pattern"), file, f, &n->pat);
        if (!st) st = get_str(j, "content", file, field, &n->text, &n->text_len);
    } else if (!strcmp(ty, "Prepend")) {
        n->kind = N_PREPEND;
        st = get_str(j, "prepend", file, field, &n->text, &n->text_len);
    } else if (!strcmp(ty, "Strip")) {
        n->kind = N_STRIP;
        const json_t *l = json_object_get(j, "strip_left"), *r = json_object_get(j, "strip_right");
        if (!json_is_boolean(l) || !json_is_boolean(r))
            st = berth_fail(BERTH_E_INVALID, "%s: %s: strip_left/strip_right: expected booleans", file, field);
        else n->left = json_is_true(l), n->right = json_is_true(r);
    } else if (!strcmp(ty, "Sequence")) {
        n->kind = N_SEQ;
        const json_t *arr = json_object_get(j, "normalizers");
        if (!json_is_array(arr)) {
            st = berth_fail(BERTH_E_INVALID, "%s: %s.normalizers: expected an array", file, field);
        } else if (json_array_size(arr) && !(n->items = calloc(json_array_size(arr), sizeof *n->items))) {
            st = berth_fail(BERTH_E_NOMEM, "%s: %s: out of memory", file, field);
        } else {
            for (size_t i = 0; i < json_array_size(arr) && !st; i++) {
                snprintf(f, sizeof f, "%s.normalizers[%zu]", field, i);
                st = tok_normalizer_parse(json_array_get(arr, i), file, f, &n->items[i]);
                n->n_items = i + 1;
            }
        }
    } else {
        st = berth_fail(BERTH_E_UNSUPPORTED, "%s: %s.type: unsupported normalizer \"%s\"", file, field, ty);
    }
    if (st) {
        tok_normalizer_free(n);
        return st;
    }
    *out = n;
    return BERTH_OK;
}

static berth_status apply(const tok_normalizer *n, const char *s, size_t len, tok_buf *out)
{
    switch (n->kind) {
    case N_UNICODE: {
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &dst, n->uopt);
        if (r < 0) return berth_fail(BERTH_E_INVALID, "tokenizer: normalizer: %s", utf8proc_errmsg(r));
        bool ok = tok_buf_put(out, dst, (size_t)r);
        free(dst);
        return ok ? BERTH_OK : berth_fail(BERTH_E_NOMEM, "tokenizer: out of memory");
    }
    case N_LOWER:
        for (size_t i = 0; i < len;) {
            size_t adv;
            int32_t cp = tok_utf8_decode(s + i, len - i, &adv);
            char u[4];
            size_t k = tok_utf8_encode(utf8proc_tolower(cp < 0 ? 0xFFFD : cp), u);
            if (!tok_buf_put(out, u, k)) return berth_fail(BERTH_E_NOMEM, "tokenizer: out of memory");
            i += adv;
        }
        return BERTH_OK;
    case N_STRIP_ACCENTS:
        /* HF drops combining marks (General_Category M: Mn, Mc, Me); meant to follow NFD/NFKD */
        for (size_t i = 0; i < len;) {
            size_t adv;
            int32_t cp = tok_utf8_decode(s + i, len - i, &adv);
            utf8proc_category_t c = utf8proc_category(cp);
            bool mark = c == UTF8PROC_CATEGORY_MN || c == UTF8PROC_CATEGORY_MC || c == UTF8PROC_CATEGORY_ME;
            if (!mark && !tok_buf_put(out, s + i, adv)) return berth_fail(BERTH_E_NOMEM, "tokenizer: out of memory");
            i += adv;
        }
        return BERTH_OK;
    case N_PRECOMPILED:
        return tok_precompiled_apply(n->pre, s, len, out);
    case N_REPLACE: {
        size_t at = 0, ms, me;
        while (tok_pattern_next(n->pat, s, len, at, &ms, &me)) {
            if (!tok_buf_put(out, s + at, ms - at) || !tok_buf_put(out, n->text, n->text_len))
                return berth_fail(BERTH_E_NOMEM, "tokenizer: out of memory");
            at = me;
        }
        return tok_buf_put(out, s + at, len - at) ? BERTH_OK : berth_fail(BERTH_E_NOMEM, "tokenizer: out of memory");
    }
    case N_PREPEND:
        /* HF prepends only to non-empty text. */
        if (len && !tok_buf_put(out, n->text, n->text_len)) return berth_fail(BERTH_E_NOMEM, "tokenizer: out of memory");
        return tok_buf_put(out, s, len) ? BERTH_OK : berth_fail(BERTH_E_NOMEM, "tokenizer: out of memory");
    case N_STRIP: {
        size_t b = 0, e = len, adv;
        while (n->left && b < e && tok_is_whitespace(tok_utf8_decode(s + b, e - b, &adv))) b += adv;
        while (n->right && e > b) {
            size_t k = e - 1;
            while (k > b && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
            if (!tok_is_whitespace(tok_utf8_decode(s + k, e - k, &adv))) break;
            e = k;
        }
        return tok_buf_put(out, s + b, e - b) ? BERTH_OK : berth_fail(BERTH_E_NOMEM, "tokenizer: out of memory");
    }
    default: { /* N_SEQ */
        tok_buf cur = {0};
        if (!tok_buf_put(&cur, s, len)) return berth_fail(BERTH_E_NOMEM, "tokenizer: out of memory");
        for (size_t i = 0; i < n->n_items; i++) {
            tok_buf next = {0};
            berth_status st = tok_normalize(n->items[i], cur.p, cur.len, &next);
            tok_buf_free(&cur);
            if (st) {
                tok_buf_free(&next);
                return st;
            }
            cur = next;
        }
        bool ok = tok_buf_put(out, cur.p, cur.len);
        tok_buf_free(&cur);
        return ok ? BERTH_OK : berth_fail(BERTH_E_NOMEM, "tokenizer: out of memory");
    }
    }
}

berth_status tok_normalize(const tok_normalizer *n, const char *s, size_t len, tok_buf *out)
{
    if (!n) return tok_buf_put(out, s, len) ? BERTH_OK : berth_fail(BERTH_E_NOMEM, "tokenizer: out of memory");
    if (len == 0) return tok_buf_put(out, "", 0) ? BERTH_OK : berth_fail(BERTH_E_NOMEM, "tokenizer: out of memory");
    return apply(n, s, len, out);
}

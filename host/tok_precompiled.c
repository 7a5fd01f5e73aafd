/*
 * tok_precompiled.c — the "Precompiled" normalizer: SentencePiece's compiled character map (nmt_nfkc and the like,
 * used by ALBERT, T5, NLLB), applied the way the Hugging Face library applies it.
 *
 * The blob (base64 in tokenizer.json) is: u32 little-endian trie size in bytes, that many bytes of a darts-clone
 * double-array trie (u32 units), then NUL-separated replacement strings. A trie value is the offset of a
 * replacement. HF walks the text by extended grapheme cluster: a cluster shorter than 6 bytes is looked up whole;
 * otherwise (or when it has no entry) each of its characters is looked up alone. A lookup takes the FIRST (shortest)
 * prefix match, not the longest — odd, but that is what HF does and what its goldens hold. The blob is untrusted:
 * every trie step and replacement offset is bounds-checked.
 */
#include "tok_internal.h"

#include "errors.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

struct tok_precompiled {
    uint32_t *units;
    size_t n_units;
    char *norm;          /* replacement strings, NUL-separated */
    size_t norm_len;
};

void tok_precompiled_free(tok_precompiled *p)
{
    if (!p) return;
    free(p->units);
    free(p->norm);
    free(p);
}

static int b64_val(unsigned char c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Standard base64 with optional '=' padding; false on any other character. *out: caller frees. */
static bool b64_decode(const char *s, size_t n, unsigned char **out, size_t *out_len)
{
    while (n && s[n - 1] == '=') n--;
    unsigned char *o = malloc(n / 4 * 3 + 3);
    if (!o) return false;
    size_t k = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        int v = b64_val((unsigned char)s[i]);
        if (v < 0) {
            free(o);
            return false;
        }
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            o[k++] = (unsigned char)(acc >> bits);
        }
    }
    *out = o;
    *out_len = k;
    return true;
}

berth_status tok_precompiled_parse(const json_t *j, const char *file, const char *field, tok_precompiled **out)
{
    *out = NULL;
    const json_t *cm = json_object_get(j, "precompiled_charsmap");
    if (!json_is_string(cm))
        return berth_fail(BERTH_E_INVALID, "%s: %s.precompiled_charsmap: expected a base64 string", file, field);
    unsigned char *blob;
    size_t bl;
    if (!b64_decode(json_string_value(cm), json_string_length(cm), &blob, &bl))
        return berth_fail(BERTH_E_INVALID, "%s: %s.precompiled_charsmap: not valid base64", file, field);
    berth_status st = BERTH_OK;
    tok_precompiled *p = calloc(1, sizeof *p);
    if (!p) {
        free(blob);
        return berth_fail(BERTH_E_NOMEM, "%s: %s: out of memory", file, field);
    }
    uint32_t trie_bytes = bl >= 4 ? (uint32_t)blob[0] | (uint32_t)blob[1] << 8 | (uint32_t)blob[2] << 16 |
                                        (uint32_t)blob[3] << 24
                                  : 0;
    if (bl < 4 || trie_bytes > bl - 4 || trie_bytes % 4 || trie_bytes == 0) {
        st = berth_fail(BERTH_E_INVALID, "%s: %s.precompiled_charsmap: trie size %u does not fit the %zu-byte blob",
                        file, field, trie_bytes, bl);
        goto done;
    }
    p->n_units = trie_bytes / 4;
    p->norm_len = bl - 4 - trie_bytes;
    if (!(p->units = malloc(trie_bytes)) || !(p->norm = malloc(p->norm_len + 1))) {
        st = berth_fail(BERTH_E_NOMEM, "%s: %s: out of memory", file, field);
        goto done;
    }
    for (size_t i = 0; i < p->n_units; i++) {
        const unsigned char *u = blob + 4 + 4 * i;
        p->units[i] = (uint32_t)u[0] | (uint32_t)u[1] << 8 | (uint32_t)u[2] << 16 | (uint32_t)u[3] << 24;
    }
    memcpy(p->norm, blob + 4 + trie_bytes, p->norm_len);
    p->norm[p->norm_len] = '\0';
done:
    free(blob);
    if (st) {
        tok_precompiled_free(p);
        return st;
    }
    *out = p;
    return BERTH_OK;
}

/* darts-clone unit fields */
static uint32_t u_offset(uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); }
static uint32_t u_label(uint32_t u) { return u & ((1u << 31) | 0xFFu); }
static bool u_has_leaf(uint32_t u) { return (u >> 8) & 1; }
static uint32_t u_value(uint32_t u) { return u & ((1u << 31) - 1); }

/* Shortest entry that is a prefix of s[0..n): its replacement in *rep / *rep_len. False when none. */
static bool lookup(const tok_precompiled *p, const char *s, size_t n, const char **rep, size_t *rep_len)
{
    size_t pos = u_offset(p->units[0]);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == 0) return false;
        pos ^= c;
        if (pos >= p->n_units) return false;
        uint32_t u = p->units[pos];
        if (u_label(u) != c) return false;
        pos ^= u_offset(u);
        if (pos >= p->n_units) return false;
        if (u_has_leaf(u)) {
            size_t at = u_value(p->units[pos]);
            if (at > p->norm_len) return false;
            *rep = p->norm + at;
            *rep_len = strlen(p->norm + at); /* norm is NUL-terminated past its end */
            return true;
        }
    }
    return false;
}

static berth_status put_rep(const char *rep, size_t rl, tok_buf *out)
{
    for (size_t i = 0; i < rl;) { /* a corrupt blob could point into the middle of a character */
        size_t adv;
        if (tok_utf8_decode(rep + i, rl - i, &adv) < 0)
            return berth_fail(BERTH_E_INVALID, "tokenizer: normalizer: Precompiled: replacement is not valid UTF-8");
        i += adv;
    }
    return tok_buf_put(out, rep, rl) ? BERTH_OK : berth_fail(BERTH_E_NOMEM, "tokenizer: out of memory");
}

/* s is valid UTF-8 (tok_encode checks). */
berth_status tok_precompiled_apply(const tok_precompiled *p, const char *s, size_t len, tok_buf *out)
{
    berth_status st = BERTH_OK;
    utf8proc_int32_t state = 0;
    for (size_t g = 0; g < len && !st;) {
        /* extent of the grapheme cluster starting at g */
        size_t adv, e = g;
        int32_t prev = tok_utf8_decode(s + e, len - e, &adv);
        e += adv;
        while (e < len) {
            int32_t cp = tok_utf8_decode(s + e, len - e, &adv);
            if (utf8proc_grapheme_break_stateful(prev, cp, &state)) break;
            prev = cp;
            e += adv;
        }
        const char *rep;
        size_t rl;
        if (e - g < 6 && lookup(p, s + g, e - g, &rep, &rl)) {
            st = put_rep(rep, rl, out);
        } else {
            for (size_t i = g; i < e && !st; i += adv) {
                adv = tok_utf8_len(s + i, e - i);
                if (lookup(p, s + i, adv, &rep, &rl)) st = put_rep(rep, rl, out);
                else if (!tok_buf_put(out, s + i, adv)) st = berth_fail(BERTH_E_NOMEM, "tokenizer: out of memory");
            }
        }
        g = e;
    }
    return st;
}

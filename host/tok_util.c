/* tok_util.c — small containers and UTF-8 helpers shared by the tokenizer files. */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>

bool tok_buf_put(tok_buf *b, const void *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return false;
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return true;
}

void tok_buf_free(tok_buf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

bool tok_strs_push(tok_strs *l, const char *s, size_t n)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        char **ns = realloc(l->s, cap * sizeof *ns);
        if (!ns) return false;
        l->s = ns;
        size_t *nl = realloc(l->len, cap * sizeof *nl);
        if (!nl) return false;
        l->len = nl;
        l->cap = cap;
    }
    char *c = malloc(n + 1);
    if (!c) return false;
    if (n) memcpy(c, s, n);
    c[n] = '\0';
    l->s[l->n] = c;
    l->len[l->n++] = n;
    return true;
}

void tok_strs_free(tok_strs *l)
{
    for (size_t i = 0; i < l->n; i++) free(l->s[i]);
    free(l->s);
    free(l->len);
    memset(l, 0, sizeof *l);
}

uint64_t tok_hash(const void *p, size_t n)
{
    /* FNV-1a with a final mix: keys are short token strings. */
    const unsigned char *s = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 32);
}

static bool strmap_grow(tok_strmap *m)
{
    size_t cap = m->cap ? m->cap * 2 : 1024;
    tok_strmap nm = {calloc(cap, sizeof(char *)), calloc(cap, sizeof(uint32_t)), calloc(cap, sizeof(int32_t)), cap, 0};
    if (!nm.keys || !nm.klen || !nm.vals) {
        free(nm.keys), free(nm.klen), free(nm.vals);
        return false;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->keys[i]) continue;
        size_t j = tok_hash(m->keys[i], m->klen[i]) & (cap - 1);
        while (nm.keys[j]) j = (j + 1) & (cap - 1);
        nm.keys[j] = m->keys[i];
        nm.klen[j] = m->klen[i];
        nm.vals[j] = m->vals[i];
        nm.n++;
    }
    free(m->keys), free(m->klen), free(m->vals);
    *m = nm;
    return true;
}

bool tok_strmap_put(tok_strmap *m, const char *k, size_t n, int32_t v)
{
    if ((m->n + 1) * 2 > m->cap && !strmap_grow(m)) return false;
    size_t j = tok_hash(k, n) & (m->cap - 1);
    while (m->keys[j]) {
        if (m->klen[j] == n && memcmp(m->keys[j], k, n) == 0) {
            m->vals[j] = v;
            return true;
        }
        j = (j + 1) & (m->cap - 1);
    }
    char *c = malloc(n + 1);
    if (!c) return false;
    memcpy(c, k, n);
    c[n] = '\0';
    m->keys[j] = c;
    m->klen[j] = (uint32_t)n;
    m->vals[j] = v;
    m->n++;
    return true;
}

int32_t tok_strmap_get(const tok_strmap *m, const char *k, size_t n)
{
    if (!m->cap) return -1;
    size_t j = tok_hash(k, n) & (m->cap - 1);
    while (m->keys[j]) {
        if (m->klen[j] == n && memcmp(m->keys[j], k, n) == 0) return m->vals[j];
        j = (j + 1) & (m->cap - 1);
    }
    return -1;
}

void tok_strmap_free(tok_strmap *m)
{
    for (size_t i = 0; i < m->cap; i++) free(m->keys[i]);
    free(m->keys), free(m->klen), free(m->vals);
    memset(m, 0, sizeof *m);
}

int32_t tok_utf8_decode(const char *str, size_t n, size_t *adv)
{
    const unsigned char *s = (const unsigned char *)str;
    *adv = 1;
    if (n == 0) return -1;
    unsigned c = s[0];
    if (c < 0x80) return (int32_t)c;
    size_t need;
    int32_t cp, min;
    if (c >= 0xC2 && c <= 0xDF) need = 1, cp = c & 0x1F, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF) need = 2, cp = c & 0x0F, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4) need = 3, cp = c & 0x07, min = 0x10000;
    else return -1;
    if (n < need + 1) return -1;
    for (size_t i = 1; i <= need; i++) {
        if ((s[i] & 0xC0) != 0x80) return -1;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return -1;
    *adv = need + 1;
    return cp;
}

size_t tok_utf8_len(const char *s, size_t n)
{
    size_t adv;
    tok_utf8_decode(s, n, &adv);
    return adv;
}

size_t tok_utf8_encode(int32_t cp, char out[4])
{
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) { out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12)); out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18)); out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Length of the maximal prefix of an invalid sequence at s that could start a valid one (Unicode "maximal
 * subpart"); at least 1. Matches Rust's from_utf8_lossy, which HF decoders use. */
static size_t maximal_subpart(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c >= 0xE0 && c <= 0xEF) { need = 2; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { need = 3; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
    else return 1;
    size_t i = 1;
    if (i < n && s[i] >= lo && s[i] <= hi) {
        i++;
        while (i <= need && i < n && (s[i] & 0xC0) == 0x80) i++;
    }
    return i;
}

bool tok_utf8_lossy(const char *str, size_t n, tok_buf *out)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0, run = 0;
    while (i < n) {
        size_t adv;
        if (tok_utf8_decode(str + i, n - i, &adv) >= 0) {
            i += adv;
            continue;
        }
        if (!tok_buf_put(out, str + run, i - run) || !tok_buf_put(out, "\xEF\xBF\xBD", 3)) return false;
        i += maximal_subpart(s + i, n - i);
        run = i;
    }
    return tok_buf_put(out, str + run, n - run);
}

bool tok_ids_push(int32_t **ids, size_t *n, size_t *cap, int32_t id)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 64;
        int32_t *p = realloc(*ids, c * sizeof *p);
        if (!p) return false;
        *ids = p;
        *cap = c;
    }
    (*ids)[(*n)++] = id;
    return true;
}

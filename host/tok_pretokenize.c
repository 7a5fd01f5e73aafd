/*
 * tok_pretokenize.c — tokenizer.json pre-tokenizers: Split (String or PCRE2 regex, every split behaviour),
 * ByteLevel (GPT-2 byte alphabet), Metaspace, Whitespace, WhitespaceSplit, Digits and Sequence. Each one maps
 * a list of pieces to a new list, as in the Hugging Face library; empty pieces are dropped.
 */
#include "tok_internal.h"

#include "errors.h"

#include <stdlib.h>
#include <string.h>

enum { P_SPLIT, P_BYTELEVEL, P_METASPACE, P_SEQ };
enum { B_REMOVED, B_ISOLATED, B_MERGED_PREV, B_MERGED_NEXT, B_CONTIGUOUS };
enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER };

/* GPT-2's ByteLevel regex (used when ByteLevel.use_regex is true). */
static const char gpt2_regex[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

struct tok_pretok {
    int kind;
    tok_pattern *pat;       /* P_SPLIT; P_BYTELEVEL when use_regex */
    int behavior;
    bool invert;
    bool add_prefix_space;  /* P_BYTELEVEL */
    char repl[4];           /* P_METASPACE replacement char */
    size_t repl_len;
    int prepend;
    bool split;
    tok_pretok **items;     /* P_SEQ */
    size_t n_items;
};

void tok_pretok_free(tok_pretok *p)
{
    if (!p) return;
    tok_pattern_free(p->pat);
    for (size_t i = 0; i < p->n_items; i++) tok_pretok_free(p->items[i]);
    free(p->items);
    free(p);
}

static berth_status get_bool(const json_t *j, const char *key, bool dflt, const char *file, const char *field,
                             bool *out)
{
    const json_t *v = json_object_get(j, key);
    if (!v) { *out = dflt; return BERTH_OK; }
    if (!json_is_boolean(v)) return berth_fail(BERTH_E_INVALID, "%s: %s.%s: expected a boolean", file, field, key);
    *out = json_is_true(v);
    return BERTH_OK;
}

berth_status tok_pretok_parse(const json_t *j, const char *file, const char *field, tok_pretok **out)
{
    *out = NULL;
    if (!j || json_is_null(j)) return BERTH_OK;
    const json_t *type = json_is_object(j) ? json_object_get(j, "type") : NULL;
    if (!json_is_string(type)) return berth_fail(BERTH_E_INVALID, "%s: %s.type: expected a string", file, field);
    const char *ty = json_string_value(type);
    tok_pretok *p = calloc(1, sizeof *p);
    if (!p) return berth_fail(BERTH_E_NOMEM, "%s: %s: out of memory", file, field);
    berth_status st = BERTH_OK;
    char f[256];
    if (!strcmp(ty, "Split")) {
        p->kind = P_SPLIT;
        snprintf(f, sizeof f, "%s.pattern", field);
        st = tok_pattern_parse(json_object_get(j, "pattern"), file, f, &p->pat);
        const json_t *b = json_object_get(j, "behavior");
        const char *bs = json_is_string(b) ? json_string_value(b) : "";
        static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
        p->behavior = -1;
        for (int i = 0; i < 5; i++)
            if (!strcmp(bs, names[i])) p->behavior = i;
        if (!st && p->behavior < 0)
            st = berth_fail(BERTH_E_INVALID, "%s: %s.behavior: expected one of Removed, Isolated, MergedWithPrevious, "
                            "MergedWithNext, Contiguous", file, field);
        if (!st) st = get_bool(j, "invert", false, file, field, &p->invert);
    } else if (!strcmp(ty, "Whitespace") || !strcmp(ty, "WhitespaceSplit") || !strcmp(ty, "Digits")) {
        /* Expressed as Split: Whitespace keeps runs of \w or of other non-space chars; WhitespaceSplit drops
         * whitespace; Digits isolates digits (individually or as runs). */
        p->kind = P_SPLIT;
        const char *re = "\\w+|[^\\w\\s]+";
        p->behavior = B_REMOVED;
        p->invert = true;
        if (!strcmp(ty, "WhitespaceSplit")) re = "\\s+", p->invert = false;
        if (!strcmp(ty, "Digits")) {
            bool indiv = false;
            st = get_bool(j, "individual_digits", false, file, field, &indiv);
            re = "\\p{N}";
            p->invert = false;
            p->behavior = indiv ? B_ISOLATED : B_CONTIGUOUS;
        }
        if (!st) st = tok_regex_compile(re, file, field, &p->pat);
    } else if (!strcmp(ty, "ByteLevel")) {
        p->kind = P_BYTELEVEL;
        bool use_regex = true;
        st = get_bool(j, "add_prefix_space", true, file, field, &p->add_prefix_space);
        if (!st) st = get_bool(j, "use_regex", true, file, field, &use_regex);
        if (!st && use_regex) st = tok_regex_compile(gpt2_regex, file, field, &p->pat);
    } else if (!strcmp(ty, "Metaspace")) {
        p->kind = P_METASPACE;
        const json_t *r = json_object_get(j, "replacement");
        size_t adv;
        if (!json_is_string(r) || tok_utf8_decode(json_string_value(r), json_string_length(r), &adv) < 0 ||
            adv != json_string_length(r)) {
            st = berth_fail(BERTH_E_INVALID, "%s: %s.replacement: expected a one-character string", file, field);
        } else {
            memcpy(p->repl, json_string_value(r), adv);
            p->repl_len = adv;
        }
        const json_t *ps = json_object_get(j, "prepend_scheme");
        p->prepend = PREPEND_ALWAYS;
        if (!st && json_is_string(ps)) {
            const char *v = json_string_value(ps);
            if (!strcmp(v, "always")) p->prepend = PREPEND_ALWAYS;
            else if (!strcmp(v, "first")) p->prepend = PREPEND_FIRST;
            else if (!strcmp(v, "never")) p->prepend = PREPEND_NEVER;
            else st = berth_fail(BERTH_E_INVALID, "%s: %s.prepend_scheme: unknown value \"%s\"", file, field, v);
        } else if (!st) { /* older files: add_prefix_space */
            bool aps = true;
            st = get_bool(j, "add_prefix_space", true, file, field, &aps);
            p->prepend = aps ? PREPEND_ALWAYS : PREPEND_NEVER;
        }
        if (!st) st = get_bool(j, "split", true, file, field, &p->split);
    } else if (!strcmp(ty, "Sequence")) {
        p->kind = P_SEQ;
        const json_t *arr = json_object_get(j, "pretokenizers");
        if (!json_is_array(arr)) {
            st = berth_fail(BERTH_E_INVALID, "%s: %s.pretokenizers: expected an array", file, field);
        } else if (json_array_size(arr) && !(p->items = calloc(json_array_size(arr), sizeof *p->items))) {
            st = berth_fail(BERTH_E_NOMEM, "%s: %s: out of memory", file, field);
        } else {
            for (size_t i = 0; i < json_array_size(arr) && !st; i++) {
                snprintf(f, sizeof f, "%s.pretokenizers[%zu]", field, i);
                st = tok_pretok_parse(json_array_get(arr, i), file, f, &p->items[i]);
                p->n_items = i + 1;
            }
        }
    } else {
        st = berth_fail(BERTH_E_UNSUPPORTED, "%s: %s.type: unsupported pre-tokenizer \"%s\"", file, field, ty);
    }
    if (st) {
        tok_pretok_free(p);
        return st;
    }
    *out = p;
    return BERTH_OK;
}

/* ---- GPT-2 byte alphabet: printable Latin-1 bytes stand for themselves, the rest map to U+0100.. ---- */
static char bl_utf8[256][2];
static uint8_t bl_len[256];
static int16_t bl_rev[512]; /* code point (< 0x144) -> byte */
static bool bl_ready;

static void bytelevel_init(void)
{
    if (bl_ready) return; /* idempotent and deterministic: a race would write the same values */
    int next = 256;
    for (int i = 0; i < 512; i++) bl_rev[i] = -1;
    for (int b = 0; b < 256; b++) {
        int cp = ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) ? b : next++;
        char u[4];
        bl_len[b] = (uint8_t)tok_utf8_encode(cp, u);
        memcpy(bl_utf8[b], u, bl_len[b]);
        bl_rev[cp] = (int16_t)b;
    }
    bl_ready = true;
}

const char *tok_bytelevel_char(uint8_t b, size_t *n)
{
    bytelevel_init();
    *n = bl_len[b];
    return bl_utf8[b];
}

int tok_bytelevel_byte(int32_t cp)
{
    bytelevel_init();
    return (cp >= 0 && cp < 512) ? bl_rev[cp] : -1;
}

#define OOM() berth_fail(BERTH_E_NOMEM, "tokenizer: out of memory")

typedef struct { size_t b, e; bool m; } seg;

static berth_status split_one(const tok_pretok *p, const tok_pattern *pat, int behavior, bool invert,
                              const char *s, size_t n, tok_strs *out)
{
    seg *v = NULL;
    size_t nv = 0, cap = 0, at = 0, ms, me;
    berth_status st = BERTH_OK;
#define PUSH(B, E, M) do { \
        if (nv == cap) { cap = cap ? cap * 2 : 16; seg *nvp = realloc(v, cap * sizeof *v); \
            if (!nvp) { free(v); return OOM(); } v = nvp; } \
        v[nv++] = (seg){(B), (E), (M)}; } while (0)
    while (at < n && tok_pattern_next(pat, s, n, at, &ms, &me)) {
        if (ms > at) PUSH(at, ms, invert);
        PUSH(ms, me, !invert);
        at = me;
    }
    if (at < n) PUSH(at, n, invert);
    /* Fold the segments according to the behaviour (same rules as HF's SplitDelimiterBehavior). */
    size_t k = 0;
    bool prev = false;
    switch (behavior) {
    case B_REMOVED:
        for (size_t i = 0; i < nv; i++) if (!v[i].m) v[k++] = v[i];
        break;
    case B_ISOLATED:
        k = nv;
        break;
    case B_MERGED_PREV:
        for (size_t i = 0; i < nv; i++) {
            if (v[i].m && !prev && k) v[k - 1].e = v[i].e;
            else v[k++] = v[i];
            prev = v[i].m;
        }
        break;
    case B_MERGED_NEXT: /* mirror image: walk backwards */
        for (size_t i = nv; i-- > 0;) {
            if (v[i].m && !prev && k) v[k - 1].b = v[i].b;
            else v[k++] = v[i];
            prev = v[i].m;
        }
        for (size_t i = 0; i < k / 2; i++) { seg t = v[i]; v[i] = v[k - 1 - i]; v[k - 1 - i] = t; }
        break;
    default: /* B_CONTIGUOUS */
        for (size_t i = 0; i < nv; i++) {
            if (k && v[i].m == prev) v[k - 1].e = v[i].e;
            else v[k++] = v[i];
            prev = v[i].m;
        }
        break;
    }
    (void)p;
    for (size_t i = 0; i < k && !st; i++)
        if (v[i].e > v[i].b && !tok_strs_push(out, s + v[i].b, v[i].e - v[i].b)) st = OOM();
    free(v);
    return st;
#undef PUSH
}

static berth_status apply_one(const tok_pretok *p, const char *s, size_t n, bool first, tok_strs *out)
{
    switch (p->kind) {
    case P_SPLIT:
        return split_one(p, p->pat, p->behavior, p->invert, s, n, out);
    case P_BYTELEVEL: {
        tok_buf src = {0};
        if (p->add_prefix_space && (n == 0 || s[0] != ' ') && !tok_buf_put(&src, " ", 1)) return OOM();
        if (!tok_buf_put(&src, s, n)) { tok_buf_free(&src); return OOM(); }
        tok_strs parts = {0};
        berth_status st = BERTH_OK;
        if (p->pat) st = split_one(p, p->pat, B_ISOLATED, false, src.p, src.len, &parts);
        else if (src.len && !tok_strs_push(&parts, src.p, src.len)) st = OOM();
        tok_buf_free(&src);
        for (size_t i = 0; i < parts.n && !st; i++) {
            tok_buf b = {0};
            for (size_t k = 0; k < parts.len[i]; k++) {
                size_t cl;
                const char *c = tok_bytelevel_char((uint8_t)parts.s[i][k], &cl);
                if (!tok_buf_put(&b, c, cl)) st = OOM();
            }
            if (!st && !tok_strs_push(out, b.p, b.len)) st = OOM();
            tok_buf_free(&b);
        }
        tok_strs_free(&parts);
        return st;
    }
    case P_METASPACE: {
        tok_buf b = {0};
        bool ok = true;
        bool starts = n >= p->repl_len && memcmp(s, p->repl, p->repl_len) == 0;
        /* prepend before replacing: a leading space becomes the replacement char anyway */
        bool lead = (n && s[0] == ' ') || starts;
        if (!lead && (p->prepend == PREPEND_ALWAYS || (p->prepend == PREPEND_FIRST && first)))
            ok = tok_buf_put(&b, p->repl, p->repl_len);
        for (size_t i = 0; i < n && ok; i++)
            ok = s[i] == ' ' ? tok_buf_put(&b, p->repl, p->repl_len) : tok_buf_put(&b, s + i, 1);
        if (!ok) { tok_buf_free(&b); return OOM(); }
        berth_status st = BERTH_OK;
        if (p->split) {
            /* MergedWithNext on the replacement char: each piece starts with it */
            size_t start = 0;
            for (size_t i = 0; i <= b.len && !st; i++) {
                bool at_rep = i < b.len && i + p->repl_len <= b.len && memcmp(b.p + i, p->repl, p->repl_len) == 0;
                if ((at_rep && i > start) || i == b.len) {
                    if (i > start && !tok_strs_push(out, b.p + start, i - start)) st = OOM();
                    start = i;
                }
                if (at_rep) i += p->repl_len - 1;
            }
        } else if (b.len && !tok_strs_push(out, b.p, b.len)) {
            st = OOM();
        }
        tok_buf_free(&b);
        return st;
    }
    default: { /* P_SEQ */
        tok_strs cur = {0};
        if (n && !tok_strs_push(&cur, s, n)) return OOM();
        for (size_t i = 0; i < p->n_items; i++) {
            tok_strs next = {0};
            for (size_t k = 0; k < cur.n; k++) {
                berth_status st = apply_one(p->items[i], cur.s[k], cur.len[k], first && k == 0, &next);
                if (st) { tok_strs_free(&cur); tok_strs_free(&next); return st; }
            }
            tok_strs_free(&cur);
            cur = next;
        }
        berth_status st = BERTH_OK;
        for (size_t k = 0; k < cur.n && !st; k++)
            if (!tok_strs_push(out, cur.s[k], cur.len[k])) st = OOM();
        tok_strs_free(&cur);
        return st;
    }
    }
}

berth_status tok_pretokenize(const tok_pretok *p, const char *s, size_t len, bool first, tok_strs *out)
{
    if (!len) return BERTH_OK;
    if (!p) return tok_strs_push(out, s, len) ? BERTH_OK : OOM();
    return apply_one(p, s, len, first, out);
}

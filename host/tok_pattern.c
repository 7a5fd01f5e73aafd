/*
 * tok_pattern.c — the String/Regex patterns of tokenizer.json (Split, Replace).
 *
 * Regexes go to PCRE2 with PCRE2_UTF | PCRE2_UCP so \p{L}, \s and lookaheads behave like the Oniguruma
 * regexes the Hugging Face library uses; a hand-written matcher would drift on Unicode classes.
 */
#include "tok_internal.h"

#include "errors.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

struct tok_pattern {
    char *lit;          /* String pattern, or NULL */
    size_t lit_len;
    pcre2_code *re;     /* Regex pattern */
    pcre2_match_data *md;
};

berth_status tok_regex_compile(const char *re, const char *file, const char *field, tok_pattern **out)
{
    int err;
    PCRE2_SIZE off;
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &off, NULL);
    if (!code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return berth_fail(BERTH_E_INVALID, "%s: %s: bad regex at offset %zu: %s", file, field, (size_t)off,
                          (const char *)msg);
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE); /* optional speed-up; interpretation works without it */
    tok_pattern *p = calloc(1, sizeof *p);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(code, NULL);
    if (!p || !md) {
        free(p);
        pcre2_match_data_free(md);
        pcre2_code_free(code);
        return berth_fail(BERTH_E_NOMEM, "%s: %s: out of memory", file, field);
    }
    p->re = code;
    p->md = md;
    *out = p;
    return BERTH_OK;
}

berth_status tok_pattern_parse(const json_t *j, const char *file, const char *field, tok_pattern **out)
{
    const json_t *s = json_is_object(j) ? json_object_get(j, "String") : NULL;
    const json_t *r = json_is_object(j) ? json_object_get(j, "Regex") : NULL;
    if (s && json_is_string(s)) {
        if (json_string_length(s) == 0) return berth_fail(BERTH_E_INVALID, "%s: %s.String: empty pattern", file, field);
        tok_pattern *p = calloc(1, sizeof *p);
        if (!p || !(p->lit = malloc(json_string_length(s) + 1))) {
            free(p);
            return berth_fail(BERTH_E_NOMEM, "%s: %s: out of memory", file, field);
        }
        p->lit_len = json_string_length(s);
        memcpy(p->lit, json_string_value(s), p->lit_len + 1);
        *out = p;
        return BERTH_OK;
    }
    if (r && json_is_string(r)) {
        char f[256];
        snprintf(f, sizeof f, "%s.Regex", field);
        if (strlen(json_string_value(r)) != json_string_length(r))
            return berth_fail(BERTH_E_INVALID, "%s: %s: NUL byte in regex", file, f);
        return tok_regex_compile(json_string_value(r), file, f, out);
    }
    return berth_fail(BERTH_E_INVALID, "%s: %s: expected {\"String\": ...} or {\"Regex\": ...}", file, field);
}

bool tok_pattern_next(const tok_pattern *p, const char *s, size_t n, size_t from, size_t *ms, size_t *me)
{
    if (p->lit) {
        if (n < p->lit_len) return false;
        for (size_t i = from; i + p->lit_len <= n; i++) {
            if (memcmp(s + i, p->lit, p->lit_len) == 0) {
                *ms = i;
                *me = i + p->lit_len;
                return true;
            }
        }
        return false;
    }
    size_t at = from;
    while (at <= n) {
        /* Callers pass valid UTF-8 (checked once at tok_encode), so skip PCRE2's per-call check. */
        int rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, at, PCRE2_NO_UTF_CHECK, p->md, NULL);
        if (rc < 0) return false;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(p->md);
        if (ov[1] > ov[0]) {
            *ms = ov[0];
            *me = ov[1];
            return true;
        }
        /* empty match: retry one character further */
        if (ov[0] >= n) return false;
        at = ov[0] + tok_utf8_len(s + ov[0], n - ov[0]);
    }
    return false;
}

void tok_pattern_free(tok_pattern *p)
{
    if (!p) return;
    free(p->lit);
    pcre2_match_data_free(p->md);
    pcre2_code_free(p->re);
    free(p);
}

bool tok_is_whitespace(int32_t c)
{
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

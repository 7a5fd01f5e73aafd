/*
 * chat_template.c — per-family chat formatters and their recognition (see chat_template.h for why not Jinja).
 * Each formatter follows its Jinja template line by line; the comments quote the lines they implement.
 */
#include "chat_template.h"

#include <jansson.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"

/* ---- a growable string ---- */
typedef struct {
    char *p;
    size_t len, cap;
    bool oom;
} sb;

static void sb_putn(sb *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (b->len + n + 1 > cap) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q, b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_put(sb *b, const char *s) { sb_putn(b, s, strlen(s)); }

/* ---- Python string semantics on [s, s + n) ---- */
typedef struct {
    const char *s;
    size_t n;
} span;

static span sp(const char *s) { return (span){s, strlen(s)}; }

/* Python str.isspace for one code point at s (its UTF-8 length in *k). */
static bool py_space_at(const char *s, size_t n, size_t *k)
{
    unsigned char c = (unsigned char)s[0];
    *k = 1;
    if (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f)) return true;
    if (c < 0x80) return false;
    static const char *const ws[] = {"\xc2\x85", "\xc2\xa0", "\xe1\x9a\x80", "\xe2\x80\xa8", "\xe2\x80\xa9",
                                     "\xe2\x80\xaf", "\xe2\x81\x9f", "\xe3\x80\x80"};
    for (size_t i = 0; i < sizeof ws / sizeof *ws; i++) {
        size_t l = strlen(ws[i]);
        if (n >= l && !memcmp(s, ws[i], l)) return *k = l, true;
    }
    if (n >= 3 && c == 0xe2 && (unsigned char)s[1] == 0x80 && (unsigned char)s[2] >= 0x80 &&
        (unsigned char)s[2] <= 0x8a) /* U+2000..U+200A */
        return *k = 3, true;
    return false;
}

/* str.strip() (chars NULL: whitespace) / strip(chars) where chars is one ASCII character. */
static span py_strip(span x, bool left, bool right, int ch)
{
    size_t k;
    while (left && x.n && (ch ? x.s[0] == ch : py_space_at(x.s, x.n, &k))) {
        size_t adv = ch ? 1 : k;
        x.s += adv, x.n -= adv;
    }
    while (right && x.n) {
        if (ch) {
            if (x.s[x.n - 1] != ch) break;
            x.n--;
            continue;
        }
        size_t b = x.n - 1; /* start of the last character */
        while (b > 0 && ((unsigned char)x.s[b] & 0xC0) == 0x80) b--;
        if (!py_space_at(x.s + b, x.n - b, &k) || b + k != x.n) break;
        x.n = b;
    }
    return x;
}

static const char *find(span x, const char *needle)
{
    size_t m = strlen(needle);
    for (size_t i = 0; m <= x.n && i <= x.n - m; i++)
        if (!memcmp(x.s + i, needle, m)) return x.s + i;
    return NULL;
}

/* x.split(sep)[0] and x.split(sep)[-1] */
static span split_first(span x, const char *sep)
{
    const char *f = find(x, sep);
    return f ? (span){x.s, (size_t)(f - x.s)} : x;
}

static span split_last(span x, const char *sep)
{
    size_t m = strlen(sep);
    const char *last = NULL;
    for (span r = x; (r.s = find(r, sep)) != NULL;) {
        last = r.s;
        r.s += m;
        r.n = x.n - (size_t)(r.s - x.s);
    }
    return last ? (span){last + m, x.n - (size_t)(last + m - x.s)} : x;
}

static bool starts(span x, const char *p) { return x.n >= strlen(p) && !memcmp(x.s, p, strlen(p)); }
static bool ends(span x, const char *p)
{
    size_t m = strlen(p);
    return x.n >= m && !memcmp(x.s + x.n - m, p, m);
}

static bool is(const char *a, const char *b) { return strcmp(a, b) == 0; }

/* ---- Gemma 3 (tokenizer_config.json of google/gemma-3-*) ---- */
static berth_status render_gemma3(const struct chat_template *t, const struct chat_message *m, size_t n, int gen,
                                  sb *o)
{
    sb_put(o, t->bos_token); /* {{ bos_token }} */
    /* {%- if messages[0]['role'] == 'system' -%} first_user_prefix = content + '\n\n'; loop_messages = [1:] */
    span prefix = {"", 0};
    size_t first = 0;
    if (n && is(m[0].role, "system")) prefix = sp(m[0].content), first = 1;
    for (size_t i = first; i < n; i++) {
        size_t idx = i - first; /* loop.index0 */
        if (is(m[i].role, "user") != (idx % 2 == 0))
            return berth_fail(BERTH_E_INVALID, "chat template: Conversation roles must alternate "
                                               "user/assistant/user/assistant/... (message %zu is \"%s\")",
                              i, m[i].role);
        const char *role = is(m[i].role, "assistant") ? "model" : m[i].role;
        sb_put(o, "<start_of_turn>");
        sb_put(o, role);
        sb_put(o, "\n");
        if (idx == 0 && first) { /* (first_user_prefix if loop.first else "") */
            sb_putn(o, prefix.s, prefix.n);
            sb_put(o, "\n\n");
        }
        span c = py_strip(sp(m[i].content), true, true, 0); /* message['content'] | trim */
        sb_putn(o, c.s, c.n);
        sb_put(o, "<end_of_turn>\n");
    }
    if (gen) sb_put(o, "<start_of_turn>model\n");
    return BERTH_OK;
}

/* ---- Qwen3 (tokenizer_config.json of Qwen/Qwen3-*), without tools ---- */
static berth_status render_qwen3(const struct chat_message *m, size_t n, int gen, int thinking, sb *o)
{
    /* {%- if messages[0].role == 'system' %} '<|im_start|>system\n' + content + '<|im_end|>\n' */
    if (n && is(m[0].role, "system")) {
        sb_put(o, "<|im_start|>system\n");
        sb_put(o, m[0].content);
        sb_put(o, "<|im_end|>\n");
    }
    /* ns.last_query_index: the last user message that is not a wrapped <tool_response> (default: the last index) */
    size_t last_query = n ? n - 1 : 0;
    for (size_t k = n; k-- > 0;) {
        span c = sp(m[k].content);
        if (is(m[k].role, "user") && !(starts(c, "<tool_response>") && ends(c, "</tool_response>"))) {
            last_query = k;
            break;
        }
    }
    for (size_t i = 0; i < n; i++) {
        const char *role = m[i].role;
        span c = sp(m[i].content);
        if (is(role, "user") || (is(role, "system") && i > 0)) {
            sb_put(o, "<|im_start|>");
            sb_put(o, role);
            sb_put(o, "\n");
            sb_putn(o, c.s, c.n);
            sb_put(o, "<|im_end|>\n");
        } else if (is(role, "assistant")) {
            span content = c, reasoning = {"", 0};
            if (find(c, "</think>")) {
                content = py_strip(split_last(c, "</think>"), true, false, '\n');
                reasoning = py_strip(split_last(py_strip(split_first(c, "</think>"), false, true, '\n'), "<think>"),
                                     true, false, '\n');
            }
            sb_put(o, "<|im_start|>assistant\n");
            if (i > last_query && (i == n - 1 || reasoning.n)) {
                span r = py_strip(reasoning, true, true, '\n');
                sb_put(o, "<think>\n");
                sb_putn(o, r.s, r.n);
                sb_put(o, "\n</think>\n\n");
                content = py_strip(content, true, false, '\n');
            }
            sb_putn(o, content.s, content.n);
            sb_put(o, "<|im_end|>\n");
        } else if (is(role, "tool")) {
            if (i == 0 || !is(m[i - 1].role, "tool")) sb_put(o, "<|im_start|>user");
            sb_put(o, "\n<tool_response>\n");
            sb_putn(o, c.s, c.n);
            sb_put(o, "\n</tool_response>");
            if (i == n - 1 || !is(m[i + 1].role, "tool")) sb_put(o, "<|im_end|>\n");
        }
        /* a first system message was rendered above; other roles render nothing */
    }
    if (gen) {
        sb_put(o, "<|im_start|>assistant\n");
        if (thinking == 0) sb_put(o, "<think>\n\n</think>\n\n");
    }
    return BERTH_OK;
}

berth_status chat_render(const struct chat_template *t, const struct chat_message *msgs, size_t n,
                         int add_generation_prompt, int enable_thinking, char **out)
{
    *out = NULL;
    for (size_t i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content)
            return berth_fail(BERTH_E_INVALID, "chat message %zu: role and content are required", i);
    sb o = {0};
    sb_put(&o, "");
    berth_status st = t->format == CHAT_FORMAT_GEMMA3 ? render_gemma3(t, msgs, n, add_generation_prompt, &o)
                      : t->format == CHAT_FORMAT_QWEN3
                          ? render_qwen3(msgs, n, add_generation_prompt, enable_thinking, &o)
                          : berth_fail(BERTH_E_INVALID, "chat template: no format chosen");
    if (!st && o.oom) st = berth_fail(BERTH_E_NOMEM, "chat template: out of memory");
    if (st) {
        free(o.p);
        return st;
    }
    *out = o.p;
    return BERTH_OK;
}

berth_status chat_format_from_name(const char *name, chat_format *out)
{
    if (is(name, "gemma3")) *out = CHAT_FORMAT_GEMMA3;
    else if (is(name, "qwen3")) *out = CHAT_FORMAT_QWEN3;
    else return berth_fail(BERTH_E_INVALID, "unknown chat format \"%s\" (known: gemma3, qwen3)", name);
    return BERTH_OK;
}

const char *chat_format_name(chat_format f)
{
    return f == CHAT_FORMAT_GEMMA3 ? "gemma3" : f == CHAT_FORMAT_QWEN3 ? "qwen3" : "?";
}

berth_status chat_format_detect(const char *j, chat_format *out)
{
    span s = sp(j);
    /* markers that are specific to each template, not just to its special tokens */
    if (find(s, "<start_of_turn>") && find(s, "first_user_prefix") && find(s, "<end_of_turn>")) {
        *out = CHAT_FORMAT_GEMMA3;
        return BERTH_OK;
    }
    if (find(s, "<|im_start|>") && find(s, "last_query_index") && find(s, "</think>")) {
        *out = CHAT_FORMAT_QWEN3;
        return BERTH_OK;
    }
    return berth_fail(BERTH_E_UNSUPPORTED,
                      "unrecognised chat template (berth renders the gemma3 and qwen3 families; pass --chat-format)");
}

void chat_template_free(struct chat_template *t)
{
    if (!t) return;
    free(t->bos_token);
    t->bos_token = NULL;
}

berth_status chat_template_load(const char *model_dir, const char *format_name, struct chat_template *out)
{
    memset(out, 0, sizeof *out);
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/tokenizer_config.json", model_dir) >= sizeof path)
        return berth_fail(BERTH_E_INVALID, "%s: model folder path too long", model_dir);
    json_error_t je;
    json_t *cfg = json_load_file(path, 0, &je);
    if (!cfg && !format_name) return berth_fail(BERTH_E_IO, "%s: %s", path, je.text);
    berth_status st = chat_template_from_config(cfg, path, format_name, out);
    json_decref(cfg);
    return st;
}

berth_status chat_template_from_config(const json_t *cfg, const char *path, const char *format_name,
                                       struct chat_template *out)
{
    memset(out, 0, sizeof *out);
    berth_status st = BERTH_OK;
    const json_t *bos = json_object_get(cfg, "bos_token");
    if (json_is_object(bos)) bos = json_object_get(bos, "content");
    out->bos_token = strdup(json_is_string(bos) ? json_string_value(bos) : "");
    if (!out->bos_token) st = berth_fail(BERTH_E_NOMEM, "out of memory");
    if (!st && format_name) {
        st = chat_format_from_name(format_name, &out->format);
    } else if (!st) {
        const json_t *ct = json_object_get(cfg, "chat_template");
        if (json_is_array(ct)) { /* [{"name": "default", "template": ...}, ...] */
            const json_t *pick = NULL;
            size_t i;
            json_t *e;
            json_array_foreach(ct, i, e) if (json_is_string(json_object_get(e, "name")) &&
                                             is(json_string_value(json_object_get(e, "name")), "default")) pick = e;
            ct = pick ? json_object_get(pick, "template") : NULL;
        }
        if (!json_is_string(ct))
            st = berth_fail(BERTH_E_NOT_FOUND, "%s: no chat_template (pass --chat-format gemma3|qwen3)", path);
        else if ((st = chat_format_detect(json_string_value(ct), &out->format))) {
            char why[512];
            snprintf(why, sizeof why, "%s", berth_last_error()); /* berth_fail reuses the message buffer */
            st = berth_fail(st, "%s: chat_template: %s", path, why);
        }
    }
    if (st) chat_template_free(out);
    return st;
}

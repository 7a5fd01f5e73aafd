/*
 * test_chat_template.c — chat formatting against apply_chat_template output (tests/fixtures/chat/
 * apply_chat_template_expected.json: system message, multi-turn history, the generation prompt, Qwen3 thinking and
 * tool turns, Gemma's alternation error).
 *
 * Usage: test_chat_template TOKENIZER_JSON EXPECTED_JSON TOKENIZER_CONFIG[.gz]
 * The family comes from recognising the config's own chat_template; every case with an expected string (or error)
 * for that family is rendered and compared exactly. The rendered prompt is then encoded without special tokens,
 * as apply_chat_template(tokenize=True) does, and each turn marker must come out as its one special-token id.
 * Exits 77 when the tokenizer is absent (the fetched Gemma files when offline).
 */
#include "chat_template.h"
#include "errors.h"
#include "tokenizer.h"

#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>
#include "check_run.h"

static const char *g_tok, *g_expected, *g_cfg;

static json_t *load_json_maybe_gz(const char *path)
{
    gzFile f = gzopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    int k;
    while ((k = gzread(f, b + n, (unsigned)(cap - n))) > 0) {
        n += (size_t)k;
        if (n == cap) b = realloc(b, cap *= 2);
    }
    gzclose(f);
    json_error_t e;
    json_t *j = json_loadb(b, n, 0, &e);
    ck_assert_msg(j != NULL, "%s: %s", path, e.text);
    free(b);
    return j;
}

static size_t count_sub(const char *s, const char *sub)
{
    size_t c = 0;
    for (const char *p = s; (p = strstr(p, sub)); p += strlen(sub)) c++;
    return c;
}

START_TEST(expected_renders)
{
    json_t *cfg = load_json_maybe_gz(g_cfg), *doc = load_json_maybe_gz(g_expected);
    struct chat_template t;
    ck_assert_msg(chat_template_from_config(cfg, g_cfg, NULL, &t) == BERTH_OK, "%s", berth_last_error());
    const char *fam = chat_format_name(t.format);
    berth_tokenizer *tok;
    ck_assert_msg(tok_load(g_tok, NULL, &tok) == BERTH_OK, "%s", berth_last_error());
    const char *open_marker = t.format == CHAT_FORMAT_GEMMA3 ? "<start_of_turn>" : "<|im_start|>";
    int32_t open_id = tok_piece_to_id(tok, open_marker);
    ck_assert_int_ge(open_id, 0);
    size_t i, tested = 0;
    json_t *c;
    json_array_foreach(json_object_get(doc, "cases"), i, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        const json_t *want = json_object_get(json_object_get(c, "expected"), fam);
        const json_t *want_err = json_object_get(json_object_get(c, "expected_error"), fam);
        if (!want && !want_err) continue;
        const json_t *jm = json_object_get(c, "messages");
        struct chat_message msgs[16];
        size_t n = json_array_size(jm);
        ck_assert_uint_le(n, 16);
        for (size_t k = 0; k < n; k++) {
            msgs[k].role = json_string_value(json_object_get(json_array_get(jm, k), "role"));
            msgs[k].content = json_string_value(json_object_get(json_array_get(jm, k), "content"));
        }
        const json_t *et = json_object_get(c, "enable_thinking");
        int thinking = et ? json_is_true(et) : -1;
        char *out = NULL;
        berth_status st = chat_render(&t, msgs, n, json_is_true(json_object_get(c, "add_generation_prompt")),
                                      thinking, &out);
        if (want_err) {
            ck_assert_msg(st == BERTH_E_INVALID, "%s/%s: expected an error", fam, name);
            ck_assert_str_eq(berth_last_error(), json_string_value(want_err));
        } else {
            ck_assert_msg(st == BERTH_OK, "%s/%s: %s", fam, name, berth_last_error());
            if (strcmp(out, json_string_value(want)) != 0)
                ck_abort_msg("%s/%s:\n got: %s\nwant: %s", fam, name, json_dumps(json_string(out), JSON_ENCODE_ANY),
                             json_dumps(want, JSON_ENCODE_ANY));
            int32_t *ids;
            size_t nids, opens = 0;
            ck_assert_int_eq(tok_encode(tok, out, strlen(out), 0, &ids, &nids), BERTH_OK);
            for (size_t k = 0; k < nids; k++) opens += ids[k] == open_id;
            ck_assert_uint_eq(opens, count_sub(out, open_marker));
            free(ids);
        }
        free(out);
        tested++;
    }
    ck_assert_uint_ge(tested, 5);
    /* overriding by name, and a template that is neither family */
    chat_template_free(&t);
    ck_assert_int_eq(chat_template_from_config(cfg, g_cfg, "llama", &t), BERTH_E_INVALID);
    ck_assert_str_eq(berth_last_error(), "unknown chat format \"llama\" (known: gemma3, qwen3)");
    json_t *other = json_pack("{s:s}", "chat_template", "{% for m in messages %}{{ m.content }}{% endfor %}");
    ck_assert_int_eq(chat_template_from_config(other, "x/tokenizer_config.json", NULL, &t), BERTH_E_UNSUPPORTED);
    ck_assert_str_eq(berth_last_error(), "x/tokenizer_config.json: chat_template: unrecognised chat template (berth "
                                         "renders the gemma3 and qwen3 families; pass --chat-format)");
    json_decref(other);
    tok_free(tok);
    json_decref(cfg);
    json_decref(doc);
}
END_TEST

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s TOKENIZER_JSON EXPECTED_JSON TOKENIZER_CONFIG\n", argv[0]);
        return 2;
    }
    g_tok = argv[1], g_expected = argv[2], g_cfg = argv[3];
    if (access(g_tok, R_OK) != 0) {
        fprintf(stderr, "SKIP: %s is not available (see tests/fixtures/tokenizers/README.md)\n", g_tok);
        return 77;
    }
    Suite *s = suite_create("chat_template");
    TCase *tc = tcase_create("chat_template");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, expected_renders);
    suite_add_tcase(s, tc);
    return check_run(s, 0) ? EXIT_FAILURE : EXIT_SUCCESS;
}

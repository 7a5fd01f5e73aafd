/*
 * test_tokenizer_golden.c — encodings and decodings against goldens from the Hugging Face tokenizers library.
 *
 * Usage: test_tokenizer_golden TOKENIZER_JSON[.gz] GOLDEN.jsonl [TOKENIZER_CONFIG|-]
 * Each golden line: {"text", "add_special_tokens", "ids", "decoded", "decoded_skip_special"}. For every line the
 * encoding must equal ids, decode(ids) and decode(ids, skip_special) the two decoded fields, and streaming the
 * ids one by one must concatenate to the full decode. Exits 77 (skip) when the tokenizer file is absent (the
 * fetched Gemma files when offline).
 */
#include "errors.h"
#include "tokenizer.h"

#include <check.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check_run.h"

static const char *g_tok, *g_golden, *g_cfg;

static void show(const char *what, const char *text, size_t k)
{
    fprintf(stderr, "MISMATCH %s at line %zu for text %s\n", what, k, text);
}

/* Streams ids and returns the concatenation (caller frees). */
static char *stream_all(const berth_tokenizer *t, const int32_t *ids, size_t n, int skip, size_t *out_len)
{
    berth_tok_stream *s;
    ck_assert_int_eq(tok_stream_new(t, skip, &s), BERTH_OK);
    size_t cap = 64, len = 0;
    char *acc = calloc(1, cap);
    for (size_t i = 0; i <= n; i++) {
        char *piece;
        size_t pl;
        berth_status st = i < n ? tok_stream_push_n(s, ids[i], &piece, &pl) : tok_stream_finish_n(s, &piece, &pl);
        ck_assert_msg(st == BERTH_OK, "%s", berth_last_error());
        while (len + pl + 1 > cap) acc = realloc(acc, cap *= 2);
        memcpy(acc + len, piece, pl);
        acc[len + pl] = '\0';
        len += pl;
        free(piece);
    }
    tok_stream_free(s);
    *out_len = len;
    return acc;
}

START_TEST(golden_lines)
{
    berth_tokenizer *t;
    berth_status st = tok_load(g_tok, g_cfg, &t);
    ck_assert_msg(st == BERTH_OK, "%s", berth_last_error());
    FILE *f = fopen(g_golden, "r");
    ck_assert_msg(f != NULL, "cannot open %s", g_golden);
    char *line = NULL;
    size_t lcap = 0, k = 0, bad_ids = 0, bad_dec = 0, bad_skip = 0, bad_stream = 0;
    while (getline(&line, &lcap, f) > 0) {
        k++;
        json_error_t err;
        json_t *g = json_loads(line, JSON_ALLOW_NUL, &err);
        ck_assert_msg(g != NULL, "%s:%zu: %s", g_golden, k, err.text);
        const json_t *text = json_object_get(g, "text"), *gids = json_object_get(g, "ids");
        int add = json_is_true(json_object_get(g, "add_special_tokens"));
        int32_t *ids;
        size_t n;
        st = tok_encode(t, json_string_value(text), json_string_length(text), add, &ids, &n);
        ck_assert_msg(st == BERTH_OK, "%s", berth_last_error());
        bool same = n == json_array_size(gids);
        for (size_t i = 0; same && i < n; i++) same = ids[i] == json_integer_value(json_array_get(gids, i));
        char *dump = json_dumps(text, JSON_ENCODE_ANY);
        if (!same) {
            bad_ids++;
            show(add ? "ids (add_special)" : "ids", dump, k);
            fprintf(stderr, "  got:");
            for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
            fprintf(stderr, "\n  want: %s\n", json_dumps(gids, 0));
        }
        /* decode the golden ids, so a decoder bug is seen apart from an encoder bug */
        size_t gn = json_array_size(gids);
        int32_t *gv = malloc((gn + 1) * sizeof *gv);
        for (size_t i = 0; i < gn; i++) gv[i] = (int32_t)json_integer_value(json_array_get(gids, i));
        for (int skip = 0; skip < 2; skip++) {
            const json_t *want = json_object_get(g, skip ? "decoded_skip_special" : "decoded");
            char *dec;
            size_t dl, sl;
            st = tok_decode_n(t, gv, gn, skip, &dec, &dl);
            ck_assert_msg(st == BERTH_OK, "%s", berth_last_error());
            if (dl != json_string_length(want) || memcmp(dec, json_string_value(want), dl)) {
                skip ? bad_skip++ : bad_dec++;
                show(skip ? "decoded_skip_special" : "decoded", dump, k);
                fprintf(stderr, "  got:  [%s]\n  want: [%s]\n", dec, json_string_value(want));
            }
            char *streamed = stream_all(t, gv, gn, skip, &sl);
            if (sl != dl || memcmp(streamed, dec, dl)) {
                bad_stream++;
                show("stream", dump, k);
                fprintf(stderr, "  got:  [%s]\n  want: [%s]\n", streamed, dec);
            }
            free(streamed);
            free(dec);
        }
        free(gv);
        free(dump);
        free(ids);
        json_decref(g);
    }
    free(line);
    fclose(f);
    fprintf(stderr, "%s: %zu lines, mismatches: ids %zu, decoded %zu, decoded_skip_special %zu, stream %zu\n", g_golden,
            k, bad_ids, bad_dec, bad_skip, bad_stream);
    ck_assert_uint_gt(k, 0);
    ck_assert_uint_eq(bad_ids + bad_dec + bad_skip + bad_stream, 0);
    tok_free(t);
}
END_TEST

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s TOKENIZER_JSON GOLDEN_JSONL [CONFIG|-]\n", argv[0]);
        return 2;
    }
    g_tok = argv[1], g_golden = argv[2];
    g_cfg = (argc > 3 && strcmp(argv[3], "-")) ? argv[3] : NULL;
    if (access(g_tok, R_OK) != 0) {
        fprintf(stderr, "SKIP: %s is not available (see tests/fixtures/tokenizers/README.md)\n", g_tok);
        return 77;
    }
    Suite *s = suite_create("tokenizer_golden");
    TCase *tc = tcase_create("golden");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, golden_lines);
    suite_add_tcase(s, tc);
    return check_run(s, 0) ? EXIT_FAILURE : EXIT_SUCCESS;
}

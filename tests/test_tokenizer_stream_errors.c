/*
 * test_tokenizer_stream_errors.c — streaming detokenization on random id sequences (multi-byte characters split
 * across tokens included), and malformed tokenizer.json files, each failing with its exact message.
 */
#include "errors.h"
#include "tok_internal.h"
#include "tokenizer.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check_run.h"

static char g_tmp[256];

static const char *src_root(void)
{
    const char *r = getenv("BERTH_SOURCE_ROOT");
    return r ? r : ".";
}

/* Random ids, streamed: the concatenated pieces equal tok_decode of all ids. */
static void stream_random(const char *path, unsigned seed)
{
    berth_tokenizer *t;
    ck_assert_msg(tok_load(path, NULL, &t) == BERTH_OK, "%s", berth_last_error());
    srand(seed);
    size_t V = tok_vocab_size(t);
    for (int round = 0; round < 200; round++) {
        size_t n = (size_t)(rand() % 40);
        int32_t ids[40];
        for (size_t i = 0; i < n; i++) {
            do ids[i] = (int32_t)((unsigned)rand() % V); while (!tok_id_to_piece(t, ids[i]));
        }
        for (int skip = 0; skip < 2; skip++) {
            char *full;
            size_t fl;
            ck_assert_int_eq(tok_decode_n(t, ids, n, skip, &full, &fl), BERTH_OK);
            berth_tok_stream *s;
            ck_assert_int_eq(tok_stream_new(t, skip, &s), BERTH_OK);
            char *acc = malloc(fl + 1);
            size_t al = 0;
            for (size_t i = 0; i <= n; i++) {
                char *p;
                size_t pl;
                ck_assert_int_eq(i < n ? tok_stream_push_n(s, ids[i], &p, &pl) : tok_stream_finish_n(s, &p, &pl), BERTH_OK);
                ck_assert_uint_le(al + pl, fl);
                memcpy(acc + al, p, pl);
                al += pl;
                free(p);
            }
            ck_assert_uint_eq(al, fl);
            ck_assert_int_eq(memcmp(acc, full, fl), 0);
            free(acc);
            free(full);
            tok_stream_free(s);
        }
    }
    tok_free(t);
}

START_TEST(stream_random_qwen3)
{
    char p[512];
    snprintf(p, sizeof p, "%s/tests/fixtures/tokenizers/qwen3/tokenizer.json.gz", src_root());
    stream_random(p, 1234);
}
END_TEST

START_TEST(stream_random_tiny_gemma4)
{
    char p[512];
    snprintf(p, sizeof p, "%s/tests/fixtures/tiny-gemma4/tokenizer.json", src_root());
    stream_random(p, 99);
}
END_TEST

/* "€" split over byte-level tokens: nothing is emitted until the character is complete. */
START_TEST(stream_holds_partial_utf8)
{
    char p[512];
    snprintf(p, sizeof p, "%s/tests/fixtures/tokenizers/qwen3/tokenizer.json.gz", src_root());
    berth_tokenizer *t;
    ck_assert_int_eq(tok_load(p, NULL, &t), BERTH_OK);
    /* byte-level pieces of 0xE2 0x82 0xAC */
    int32_t bid[3];
    const uint8_t euro[3] = {0xE2, 0x82, 0xAC};
    for (int i = 0; i < 3; i++) {
        size_t cl;
        const char *c = tok_bytelevel_char(euro[i], &cl);
        char name[8] = {0};
        memcpy(name, c, cl);
        bid[i] = tok_piece_to_id(t, name);
    }
    int32_t e2 = bid[0], b82 = bid[1], bac = bid[2];
    ck_assert(e2 >= 0 && b82 >= 0 && bac >= 0);
    berth_tok_stream *s;
    ck_assert_int_eq(tok_stream_new(t, 0, &s), BERTH_OK);
    char *piece;
    ck_assert_int_eq(tok_stream_push(s, e2, &piece), BERTH_OK);
    ck_assert_str_eq(piece, "");
    free(piece);
    ck_assert_int_eq(tok_stream_push(s, b82, &piece), BERTH_OK);
    ck_assert_str_eq(piece, "");
    free(piece);
    ck_assert_int_eq(tok_stream_push(s, bac, &piece), BERTH_OK);
    ck_assert_str_eq(piece, "\xE2\x82\xAC");
    free(piece);
    ck_assert_int_eq(tok_stream_finish(s, &piece), BERTH_OK);
    ck_assert_str_eq(piece, "");
    free(piece);
    ck_assert_int_eq(tok_stream_push(s, 1 << 29, &piece), BERTH_E_INVALID);
    ck_assert_str_eq(berth_last_error(), "tok_stream_push: id 536870912 is not in the vocabulary (size 151669)");
    tok_stream_free(s);
    tok_free(t);
}
END_TEST

/* Writes body to a temp file and expects tok_load to fail with code and message "<file>: <msg>". */
static void expect_fail(const char *body, berth_status code, const char *msg)
{
    FILE *f = fopen(g_tmp, "w");
    ck_assert(f != NULL);
    fputs(body, f);
    fclose(f);
    berth_tokenizer *t = (berth_tokenizer *)1;
    ck_assert_int_eq(tok_load(g_tmp, NULL, &t), code);
    ck_assert_ptr_null(t);
    char want[1024];
    snprintf(want, sizeof want, "%s: %s", g_tmp, msg);
    ck_assert_str_eq(berth_last_error(), want);
}

#define MODEL_OK "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\"]}"

START_TEST(malformed_files)
{
    expect_fail("{\"model\": {\"type\": \"BPE\", \"vocab\": {", BERTH_E_INVALID,
                "JSON error at line 1 column 36: string or '}' expected near end of file");
    expect_fail("[]", BERTH_E_INVALID, "expected a JSON object");
    expect_fail("{}", BERTH_E_INVALID, "model: expected an object");
    expect_fail("{\"model\":{\"type\":\"BPE\",\"vocab\":[],\"merges\":[]}}", BERTH_E_INVALID,
                "model.vocab: expected an object");
    expect_fail("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":\"x\"},\"merges\":[]}}", BERTH_E_INVALID,
                "model.vocab[\"a\"]: expected an id in [0, 2^30)");
    expect_fail("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a z\"]}}", BERTH_E_INVALID,
                "model.merges[0]: token \"z\" is not in model.vocab");
    expect_fail("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[[\"a\",\"b\"]]}}", BERTH_E_INVALID,
                "model.merges[0]: merged token \"ab\" is not in model.vocab");
    expect_fail("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[7]}}", BERTH_E_INVALID,
                "model.merges[0]: expected \"left right\" or [\"left\", \"right\"]");
    expect_fail("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a\"]}}", BERTH_E_INVALID,
                "model.merges[0]: expected \"left right\" with one space");
    expect_fail("{\"model\":{\"type\":\"WordPiece\"}}", BERTH_E_UNSUPPORTED,
                "model.type: unsupported model \"WordPiece\"");
    expect_fail("{" MODEL_OK ",\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(a\"},"
                "\"behavior\":\"Isolated\"}}", BERTH_E_INVALID,
                "pre_tokenizer.pattern.Regex: bad regex at offset 2: missing closing parenthesis");
    expect_fail("{" MODEL_OK ",\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\"},"
                "\"behavior\":\"Sideways\"}}", BERTH_E_INVALID,
                "pre_tokenizer.behavior: expected one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous");
    expect_fail("{" MODEL_OK ",\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Replace\","
                "\"pattern\":{\"String\":\"x\"},\"content\":3}]}}", BERTH_E_INVALID,
                "normalizer.normalizers[0].content: expected a string");
    expect_fail("{" MODEL_OK ",\"normalizer\":{\"type\":\"Shout\"}}", BERTH_E_UNSUPPORTED,
                "normalizer.type: unsupported normalizer \"Shout\"");
    expect_fail("{" MODEL_OK ",\"normalizer\":{\"type\":\"Precompiled\",\"precompiled_charsmap\":\"A!\"}}",
                BERTH_E_INVALID, "normalizer.precompiled_charsmap: not valid base64");
    expect_fail("{" MODEL_OK ",\"normalizer\":{\"type\":\"Precompiled\",\"precompiled_charsmap\":null}}",
                BERTH_E_INVALID, "normalizer.precompiled_charsmap: expected a base64 string");
    expect_fail("{" MODEL_OK ",\"normalizer\":{\"type\":\"Precompiled\",\"precompiled_charsmap\":\"ZAAAAA==\"}}",
                BERTH_E_INVALID, "normalizer.precompiled_charsmap: trie size 100 does not fit the 4-byte blob");
    expect_fail("{" MODEL_OK ",\"added_tokens\":[{\"id\":-1,\"content\":\"<s>\"}]}", BERTH_E_INVALID,
                "added_tokens[0].id: expected an id in [0, 2^30)");
    expect_fail("{" MODEL_OK ",\"added_tokens\":[{\"id\":3,\"content\":\"<s>\",\"special\":\"yes\"}]}", BERTH_E_INVALID,
                "added_tokens[0].special: expected a boolean");
    expect_fail("{" MODEL_OK ",\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":"
                "{\"id\":\"<s>\"}}],\"special_tokens\":{\"<s>\":{\"ids\":[99]}}}}", BERTH_E_INVALID,
                "post_processor.special_tokens[\"<s>\"].ids[0]: id 99 is not in the vocabulary");
    expect_fail("{" MODEL_OK ",\"decoder\":{\"type\":\"Strip\",\"content\":\"ab\",\"start\":1,\"stop\":0}}",
                BERTH_E_INVALID, "decoder.content: expected a one-character string");
    /* a good file still loads and encodes after all that */
    FILE *f = fopen(g_tmp, "w");
    fputs("{" MODEL_OK "}", f);
    fclose(f);
    berth_tokenizer *t;
    ck_assert_int_eq(tok_load(g_tmp, NULL, &t), BERTH_OK);
    int32_t *ids;
    size_t n;
    ck_assert_int_eq(tok_encode(t, "abab", 4, 1, &ids, &n), BERTH_OK);
    /* no pre-tokenizer: one word; "a b" merges twice and "ab ab" has no merge */
    ck_assert_uint_eq(n, 2);
    ck_assert_int_eq(ids[0], 2);
    ck_assert_int_eq(ids[1], 2);
    free(ids);
    ck_assert_int_eq(tok_encode(t, "\xff", 1, 0, &ids, &n), BERTH_E_INVALID);
    ck_assert_str_eq(berth_last_error(), "tok_encode: invalid UTF-8 at byte 0");
    tok_free(t);
}
END_TEST

int main(void)
{
    snprintf(g_tmp, sizeof g_tmp, "/tmp/berth_tok_%d.json", (int)getpid());
    Suite *s = suite_create("tokenizer_stream_errors");
    TCase *tc = tcase_create("all");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, stream_random_qwen3);
    tcase_add_test(tc, stream_random_tiny_gemma4);
    tcase_add_test(tc, stream_holds_partial_utf8);
    tcase_add_test(tc, malformed_files);
    suite_add_tcase(s, tc);
    const int failed = check_run(s, 1);
    unlink(g_tmp);
    return failed ? 1 : 0;
}

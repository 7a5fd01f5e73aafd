/* test_text_cli.c — text in and out of the CLI: `berth tokenize` and `berth generate --prompt`, run as child
 * processes on the tiny Gemma 4 checkpoint (tests/fixtures/tiny-gemma4, which has a tokenizer.json).
 *
 * The ids `generate --prompt TEXT` feeds the model equal `berth tokenize TEXT`'s (same prompt length, and the same
 * generated tokens as `--prompt-ids` with those ids); tokenize's ids and pieces equal the library's; the "text" of
 * --json equals tok_decode(tokens, skip_special) and plain --prompt output streams exactly that text. `berth chat`
 * with two piped lines replies exactly what `berth generate` gives for the rendered conversation of each turn.
 *
 * argv[1] = path of the berth binary, argv[2] = the parity config (CPU backend only). */
#include <check.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "chat_template.h"
#include "errors.h"
#include "tokenizer.h"
#include "check_run.h"

static const char *berth_bin, *config_path;
static char tiny[1024];

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    size_t k;
    while ((k = fread(b + n, 1, cap - n - 1, f)) > 0) {
        n += k;
        if (n + 1 == cap) b = realloc(b, cap *= 2);
    }
    fclose(f);
    b[n] = '\0';
    if (len) *len = n;
    return b;
}

/* Runs `berth ARGS` (a shell-quoted string) with optional stdin text; returns the exit status, out/err caller-frees. */
static int run(const char *args, const char *stdin_text, char **out, size_t *out_len, char **err)
{
    char o[256], e[256], i[256], cmd[8192];
    snprintf(o, sizeof o, "/tmp/berth_text_cli_%d.out", (int)getpid());
    snprintf(e, sizeof e, "/tmp/berth_text_cli_%d.err", (int)getpid());
    snprintf(i, sizeof i, "/tmp/berth_text_cli_%d.in", (int)getpid());
    FILE *f = fopen(i, "wb");
    if (stdin_text) fputs(stdin_text, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "timeout 60 '%s' %s <%s >%s 2>%s", berth_bin, args, i, o, e);
    int st = system(cmd);
    ck_assert_msg(WIFEXITED(st), "berth %s: did not exit normally", args);
    *out = slurp(o, out_len);
    *err = slurp(e, NULL);
    unlink(o), unlink(e), unlink(i);
    return WEXITSTATUS(st);
}

static json_t *run_json(const char *args)
{
    char *out, *err;
    size_t n;
    int rc = run(args, NULL, &out, &n, &err);
    ck_assert_msg(rc == 0, "berth %s: exit %d: %s", args, rc, err);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    ck_assert_msg(j != NULL, "berth %s: bad JSON (%s): %s", args, je.text, out);
    free(out), free(err);
    return j;
}

static berth_tokenizer *load_tiny(void)
{
    char tj[1200], tc[1200];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", tiny);
    snprintf(tc, sizeof tc, "%s/tokenizer_config.json", tiny);
    berth_tokenizer *t;
    ck_assert_msg(tok_load(tj, tc, &t) == BERTH_OK, "%s", berth_last_error());
    return t;
}

static const char *const PROMPT = "Hello world, héllo wörld! 12 + 34";

START_TEST(tokenize_matches_library)
{
    berth_tokenizer *t = load_tiny();
    int32_t *ids;
    size_t n;
    ck_assert_int_eq(tok_encode(t, PROMPT, strlen(PROMPT), 1, &ids, &n), BERTH_OK);
    char args[4096];
    snprintf(args, sizeof args, "tokenize --json --model '%s' '%s'", tiny, PROMPT);
    json_t *j = run_json(args);
    const json_t *jids = json_object_get(j, "ids"), *jp = json_object_get(j, "pieces");
    ck_assert_uint_eq(json_array_size(jids), n);
    ck_assert_uint_eq(json_array_size(jp), n);
    ck_assert_int_eq(ids[0], tok_bos_id(t)); /* the post-processor's BOS */
    for (size_t i = 0; i < n; i++) {
        ck_assert_int_eq(json_integer_value(json_array_get(jids, i)), ids[i]);
        ck_assert_str_eq(json_string_value(json_array_get(jp, i)), tok_id_to_piece(t, ids[i]));
    }
    json_decref(j);
    /* --no-special drops BOS; plain output is "ID<TAB>PIECE" a line, control characters escaped */
    char *out, *err;
    size_t ol;
    snprintf(args, sizeof args, "tokenize --no-special --model '%s' -", tiny);
    ck_assert_int_eq(run(args, "a\nb", &out, &ol, &err), 0);
    int32_t *ids2;
    size_t n2;
    ck_assert_int_eq(tok_encode(t, "a\nb", 3, 0, &ids2, &n2), BERTH_OK);
    char want[1024] = "";
    for (size_t i = 0; i < n2; i++) {
        char line[128];
        const char *p = tok_id_to_piece(t, ids2[i]);
        snprintf(line, sizeof line, "%d\t%s\n", ids2[i], strcmp(p, "\n") ? p : "\\n");
        strcat(want, line);
    }
    ck_assert_str_eq(out, want);
    free(out), free(err), free(ids2), free(ids);
    tok_free(t);
}
END_TEST

START_TEST(generate_prompt_text)
{
    berth_tokenizer *t = load_tiny();
    char args[4096];
    snprintf(args, sizeof args, "tokenize --json --model '%s' '%s'", tiny, PROMPT);
    json_t *tj = run_json(args);
    const json_t *tids = json_object_get(tj, "ids");
    snprintf(args, sizeof args, "generate --config '%s' --model '%s' --prompt '%s' --max-new-tokens 12 --ignore-eos --json",
             config_path, tiny, PROMPT);
    json_t *g = run_json(args);
    ck_assert_int_eq(json_integer_value(json_object_get(g, "prompt_tokens")), (json_int_t)json_array_size(tids));
    const json_t *toks = json_object_get(g, "tokens");
    size_t n = json_array_size(toks);
    ck_assert_uint_eq(n, 12);
    int32_t gen[12];
    for (size_t i = 0; i < n; i++) gen[i] = (int32_t)json_integer_value(json_array_get(toks, i));
    char *dec;
    size_t dl;
    ck_assert_int_eq(tok_decode_n(t, gen, n, 1, &dec, &dl), BERTH_OK);
    const json_t *text = json_object_get(g, "text");
    ck_assert_msg(json_is_string(text), "no \"text\" in the --json output");
    ck_assert_uint_eq(json_string_length(text), dl);
    ck_assert_int_eq(memcmp(json_string_value(text), dec, dl), 0);

    /* the same ids through --prompt-ids generate the same tokens (greedy) */
    char list[2048] = "";
    for (size_t i = 0; i < json_array_size(tids); i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%lld", i ? "," : "",
                 (long long)json_integer_value(json_array_get(tids, i)));
    snprintf(args, sizeof args, "generate --config '%s' --model '%s' --prompt-ids %s --max-new-tokens 12 --ignore-eos --json",
             config_path, tiny, list);
    json_t *g2 = run_json(args);
    ck_assert(json_equal(json_object_get(g2, "tokens"), toks));
    ck_assert(json_equal(json_object_get(g2, "text"), text)); /* "text" comes with --prompt-ids too */

    /* plain output streams the text, then a newline */
    snprintf(args, sizeof args, "generate --config '%s' --model '%s' --prompt '%s' --max-new-tokens 12 --ignore-eos",
             config_path, tiny, PROMPT);
    char *out, *err;
    size_t ol;
    ck_assert_int_eq(run(args, NULL, &out, &ol, &err), 0);
    ck_assert_uint_eq(ol, dl + 1);
    ck_assert_int_eq(memcmp(out, dec, dl), 0);
    ck_assert_int_eq(out[dl], '\n');
    free(out), free(err), free(dec);
    json_decref(g), json_decref(g2), json_decref(tj);
    tok_free(t);
}
END_TEST

/* `berth generate --prompt-ids` on the rendered conversation: its "text" (caller frees). */
static char *reply_for(berth_tokenizer *t, const struct chat_template *ct, const struct chat_message *m, size_t n)
{
    char *prompt;
    ck_assert_int_eq(chat_render(ct, m, n, 1, -1, &prompt), BERTH_OK);
    int32_t *ids;
    size_t k;
    ck_assert_int_eq(tok_encode(t, prompt, strlen(prompt), 0, &ids, &k), BERTH_OK);
    ck_assert_int_eq(ids[0], tok_bos_id(t)); /* the template's "<bos>" text is the BOS token */
    char args[8192];
    int at = snprintf(args, sizeof args, "generate --config '%s' --model '%s' --max-new-tokens 8 --json --prompt-ids ",
                      config_path, tiny);
    for (size_t i = 0; i < k; i++) at += snprintf(args + at, sizeof args - (size_t)at, "%s%d", i ? "," : "", ids[i]);
    json_t *g = run_json(args);
    char *text = strdup(json_string_value(json_object_get(g, "text")));
    json_decref(g);
    free(ids), free(prompt);
    return text;
}

START_TEST(chat_piped)
{
    berth_tokenizer *t = load_tiny();
    struct chat_template ct;
    json_t *cfg = json_pack("{s:s}", "bos_token", "<bos>");
    ck_assert_int_eq(chat_template_from_config(cfg, "tiny", "gemma3", &ct), BERTH_OK);
    struct chat_message m[3] = {{"user", "Hello there"}, {"assistant", NULL}, {"user", "And again?"}};
    char *r1 = reply_for(t, &ct, m, 1);
    m[1].content = r1;
    char *r2 = reply_for(t, &ct, m, 3);
    char args[4096], *out, *err;
    size_t ol;
    snprintf(args, sizeof args, "chat --config '%s' --model '%s' --chat-format gemma3 --max-new-tokens 8", config_path, tiny);
    ck_assert_int_eq(run(args, "Hello there\nAnd again?\n", &out, &ol, &err), 0);
    char *want = malloc(strlen(r1) + strlen(r2) + 3);
    sprintf(want, "%s\n%s\n", r1, r2);
    ck_assert_uint_eq(ol, strlen(want));
    ck_assert_int_eq(memcmp(out, want, ol), 0);
    ck_assert_str_eq(err, "");
    free(out), free(err), free(want), free(r1), free(r2);
    /* without a chat_template and without --chat-format */
    snprintf(args, sizeof args, "chat --config '%s' --model '%s'", config_path, tiny);
    ck_assert_int_eq(run(args, "hi\n", &out, &ol, &err), 1);
    char msg[2048];
    snprintf(msg, sizeof msg, "berth: error: %s/tokenizer_config.json: no chat_template (pass --chat-format gemma3|qwen3)\n", tiny);
    ck_assert_str_eq(err, msg);
    free(out), free(err);
    chat_template_free(&ct);
    json_decref(cfg);
    tok_free(t);
}
END_TEST

START_TEST(text_errors)
{
    char args[4096], *out, *err;
    size_t ol;
    /* a folder without tokenizer.json */
    char dir[] = "/tmp/berth_text_cli_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(args, sizeof args, "tokenize --model %s hi", dir);
    ck_assert_int_eq(run(args, NULL, &out, &ol, &err), 1);
    char want[512];
    snprintf(want, sizeof want, "berth: error: %s/tokenizer.json: not found; text prompts need the checkpoint's tokenizer\n", dir);
    ck_assert_str_eq(err, want);
    ck_assert_str_eq(out, "");
    free(out), free(err);
    rmdir(dir);
    /* invalid UTF-8 in the text */
    snprintf(args, sizeof args, "tokenize --model '%s' -", tiny);
    ck_assert_int_eq(run(args, "ok\xff", &out, &ol, &err), 1);
    ck_assert_str_eq(err, "berth: error: tok_encode: invalid UTF-8 at byte 2\n");
    free(out), free(err);
    /* --prompt and --prompt-ids together; tokenize without TEXT: usage errors */
    snprintf(args, sizeof args, "generate --config '%s' --model '%s' --prompt hi --prompt-ids 2", config_path, tiny);
    ck_assert_int_eq(run(args, NULL, &out, &ol, &err), 2);
    ck_assert_msg(strncmp(err, "berth generate: --prompt and --prompt-ids exclude each other\n", 61) == 0, "%s", err);
    free(out), free(err);
    snprintf(args, sizeof args, "tokenize --model '%s'", tiny);
    ck_assert_int_eq(run(args, NULL, &out, &ol, &err), 2);
    ck_assert_msg(strncmp(err, "berth tokenize: TEXT is required\n", 33) == 0, "%s", err);
    free(out), free(err);
}
END_TEST

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s BERTH_BIN CONFIG\n", argv[0]);
        return 2;
    }
    berth_bin = argv[1], config_path = argv[2];
    const char *root = getenv("BERTH_SOURCE_ROOT");
    snprintf(tiny, sizeof tiny, "%s/tests/fixtures/tiny-gemma4", root ? root : ".");
    Suite *s = suite_create("text_cli");
    TCase *tc = tcase_create("text_cli");
    tcase_set_timeout(tc, 180);
    tcase_add_test(tc, tokenize_matches_library);
    tcase_add_test(tc, generate_prompt_text);
    tcase_add_test(tc, chat_piped);
    tcase_add_test(tc, text_errors);
    suite_add_tcase(s, tc);
    return check_run(s, 0) ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* test_engine_cli.c — `berth generate --prompts-file` (host/cmd_generate_batch.c through the engine) and
 * `berth bench` (host/cmd_bench.c) on the tiny Gemma 4 fixture with the CPU backend:
 *  - --json prints one object per prompt in input order whose tokens equal a one-prompt `berth generate` run,
 *    with prompt_tokens and cached_tokens (a repeated 40-token prompt reports 32 cached with 16-token blocks);
 *  - --stats prints the engine counters on stderr;
 *  - a malformed line is a one-line error naming the file and line;
 *  - berth bench prints one JSON object per concurrency level, with decode_tok_s (null when --gen-len is 1);
 *    --warmup once|each, anything else a usage error.
 * Args: the berth executable and the parity config. Exits 77 without the fixture. */
#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check_run.h"

static const char *berth_bin, *config_path;
static char model_dir[1024];

/* Run cmd with sh; stdout into *out (caller frees), stderr into *err; returns the exit status. */
static int run(const char *cmd, char **out, char **err)
{
    char ebuf[] = "/tmp/berth-engine-cli-XXXXXX";
    int efd = mkstemp(ebuf);
    ck_assert_int_ge(efd, 0);
    close(efd);
    char full[8192];
    snprintf(full, sizeof full, "%s 2>%s", cmd, ebuf);
    FILE *p = popen(full, "r");
    ck_assert_ptr_nonnull(p);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while ((got = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += got;
        if (n + 1 == cap) buf = realloc(buf, cap *= 2);
    }
    buf[n] = 0;
    int st = pclose(p);
    FILE *f = fopen(ebuf, "r");
    char *e = calloc(1, 1 << 16);
    if (f) {
        size_t m = fread(e, 1, (1 << 16) - 1, f);
        e[m] = 0;
        fclose(f);
    }
    unlink(ebuf);
    *out = buf;
    *err = e;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static const char *P[3] = {"2,214,88,182,203", "2,91,145,202,48,186,136,50,152,181,100,187,134", NULL};
static char long_prompt[512];

START_TEST(test_prompts_file)
{
    char path[] = "/tmp/berth-prompts-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "# comment\n%s\n\n%s\n%s\n%s\n", P[0], long_prompt, P[1], long_prompt);
    fclose(f);
    char cmd[4096], *out, *err;
    snprintf(cmd, sizeof cmd, "%s generate --config %s --model %s --prompts-file %s --max-new-tokens 5 --ignore-eos "
             "--json --stats", berth_bin, config_path, model_dir, path);
    ck_assert_msg(run(cmd, &out, &err) == 0, "%s", err);
    const char *lines_prompt[4] = {P[0], long_prompt, P[1], long_prompt};
    char *save = NULL, *line = strtok_r(out, "\n", &save);
    for (int i = 0; i < 4; i++) {
        ck_assert_msg(line != NULL, "only %d lines", i);
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        ck_assert_msg(o != NULL, "bad JSON: %s", line);
        ck_assert_int_eq(json_integer_value(json_object_get(o, "index")), i);
        ck_assert_str_eq(json_string_value(json_object_get(o, "finish_reason")), "length");
        int n_commas = 0;
        for (const char *c = lines_prompt[i]; *c; c++) n_commas += *c == ',';
        ck_assert_int_eq(json_integer_value(json_object_get(o, "prompt_tokens")), n_commas + 1);
        /* parity config: max_seqs 1, blocks of 16: the second 40-token prompt finds 32 tokens cached */
        ck_assert_int_eq(json_integer_value(json_object_get(o, "cached_tokens")), i == 3 ? 32 : 0);
        /* the same tokens as a one-prompt run */
        char cmd1[4096], *out1, *err1;
        snprintf(cmd1, sizeof cmd1, "%s generate --config %s --model %s --prompt-ids %s --max-new-tokens 5 "
                 "--ignore-eos --json", berth_bin, config_path, model_dir, lines_prompt[i]);
        ck_assert_msg(run(cmd1, &out1, &err1) == 0, "%s", err1);
        json_t *o1 = json_loads(out1, 0, &je);
        ck_assert_msg(o1 != NULL, "bad JSON: %s", out1);
        ck_assert_msg(json_equal(json_object_get(o, "tokens"), json_object_get(o1, "tokens")), "prompt %d: %s vs %s",
                      i, line, out1);
        json_decref(o1);
        free(out1);
        free(err1);
        json_decref(o);
        line = strtok_r(NULL, "\n", &save);
    }
    ck_assert_ptr_null(line);
    ck_assert_msg(strstr(err, "{\"stats\":{\"steps\":") != NULL, "%s", err);
    ck_assert_msg(strstr(err, "\"cached_tokens\":32") != NULL, "%s", err);
    free(out);
    free(err);

    /* a bad line */
    f = fopen(path, "w");
    fprintf(f, "%s\n2,x,3\n", P[0]);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s generate --config %s --model %s --prompts-file %s", berth_bin, config_path,
             model_dir, path);
    ck_assert_int_eq(run(cmd, &out, &err), 1);
    char want[1024];
    snprintf(want, sizeof want, "--prompts-file %s:2: not a comma-separated list of token ids", path);
    ck_assert_msg(strstr(err, want) != NULL, "%s", err);
    free(out);
    free(err);
    unlink(path);
}
END_TEST

/* --logprobs N and the penalty flags of the one-prompt path: greedy, so each token is its own top-1. */
START_TEST(test_generate_logprobs)
{
    char cmd[4096], *out, *err;
    snprintf(cmd, sizeof cmd, "%s generate --config %s --model %s --prompt-ids %s --max-new-tokens 4 --ignore-eos "
             "--json --logprobs 3 --repetition-penalty 1.3 --presence-penalty 0.5 --frequency-penalty 0.25 "
             "--min-p 0.01", berth_bin, config_path, model_dir, P[0]);
    ck_assert_msg(run(cmd, &out, &err) == 0, "%s", err);
    json_error_t je;
    json_t *o = json_loads(out, 0, &je);
    ck_assert_msg(o != NULL, "bad JSON: %s", out);
    json_t *toks = json_object_get(o, "tokens"), *lps = json_object_get(o, "logprobs");
    ck_assert_int_eq(json_array_size(toks), 4);
    ck_assert_int_eq(json_array_size(lps), 4);
    for (size_t i = 0; i < 4; i++) {
        json_t *e = json_array_get(lps, i), *top = json_object_get(e, "top");
        ck_assert_int_eq(json_integer_value(json_object_get(e, "token")), json_integer_value(json_array_get(toks, i)));
        ck_assert_int_eq(json_array_size(top), 3);
        json_t *t0 = json_array_get(top, 0);
        ck_assert_int_eq(json_integer_value(json_object_get(t0, "token")), json_integer_value(json_array_get(toks, i)));
        double lp = json_real_value(json_object_get(e, "logprob"));
        ck_assert(lp <= 0.0 && lp == json_real_value(json_object_get(t0, "logprob")));
        ck_assert(json_real_value(json_object_get(json_array_get(top, 2), "logprob")) <= lp);
    }
    json_decref(o);
    free(out);
    free(err);
    snprintf(cmd, sizeof cmd, "%s generate --config %s --model %s --prompt-ids %s --logprobs 21", berth_bin,
             config_path, model_dir, P[0]);
    ck_assert_int_ne(run(cmd, &out, &err), 0);
    ck_assert_msg(strstr(err, "--logprobs '21' is not a count in 0..20") != NULL, "%s", err);
    free(out);
    free(err);
}
END_TEST

/* --logprobs N on the --prompts-file path: per prompt the same logprobs (tokens, values to JSON's 6 digits, top
 * lists) as the one-prompt path prints for that prompt alone; without --json it is refused. */
START_TEST(test_prompts_file_logprobs)
{
    char path[] = "/tmp/berth-prompts-lp-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "%s\n%s\n", P[0], P[1]);
    fclose(f);
    const char *flags = "--max-new-tokens 4 --ignore-eos --json --logprobs 3 --repetition-penalty 1.3 "
                        "--presence-penalty 0.5";
    char cmd[4096], *out, *err;
    snprintf(cmd, sizeof cmd, "%s generate --config %s --model %s --prompts-file %s %s", berth_bin, config_path,
             model_dir, path, flags);
    ck_assert_msg(run(cmd, &out, &err) == 0, "%s", err);
    char *save = NULL, *line = strtok_r(out, "\n", &save);
    for (int i = 0; i < 2; i++, line = strtok_r(NULL, "\n", &save)) {
        ck_assert_ptr_nonnull(line);
        char cmd1[4096], *out1, *err1;
        snprintf(cmd1, sizeof cmd1, "%s generate --config %s --model %s --prompt-ids %s %s", berth_bin, config_path,
                 model_dir, P[i], flags);
        ck_assert_msg(run(cmd1, &out1, &err1) == 0, "%s", err1);
        json_error_t je;
        json_t *a = json_loads(line, 0, &je), *one = json_loads(out1, 0, &je);
        ck_assert_msg(a && one, "bad JSON: %s / %s", line, out1);
        json_t *lps = json_object_get(a, "logprobs");
        ck_assert_int_eq(json_array_size(lps), 4);
        ck_assert_int_eq(json_array_size(json_object_get(json_array_get(lps, 0), "top")), 3);
        ck_assert(json_equal(json_object_get(a, "tokens"), json_object_get(one, "tokens")));
        char *la = json_dumps(lps, JSON_COMPACT | JSON_REAL_PRECISION(6));
        char *lo = json_dumps(json_object_get(one, "logprobs"), JSON_COMPACT | JSON_REAL_PRECISION(6));
        ck_assert_msg(la && lo && strcmp(la, lo) == 0, "prompt %d: %s\nvs one prompt: %s", i, la, lo);
        free(la);
        free(lo);
        json_decref(a);
        json_decref(one);
        free(out1);
        free(err1);
    }
    free(out);
    free(err);
    snprintf(cmd, sizeof cmd, "%s generate --config %s --model %s --prompts-file %s --logprobs 2", berth_bin,
             config_path, model_dir, path);
    ck_assert_int_eq(run(cmd, &out, &err), 2);
    ck_assert_msg(strstr(err, "berth generate: --logprobs needs --json (the logprobs are JSON fields)") != NULL, "%s",
                  err);
    free(out);
    free(err);
    unlink(path);
}
END_TEST

/* A --prompts-file line that is not an id list is text, encoded with the checkpoint's tokenizer.json exactly as
 * --prompt encodes it; a checkpoint without a tokenizer makes such a line a clear error. */
START_TEST(test_prompts_file_text)
{
    const char *src = getenv("BERTH_SOURCE_ROOT");
    char tiny[1100], file[] = "/tmp/berth-prompts-text-XXXXXX", cmd[4096], *out, *err, *out1, *err1;
    snprintf(tiny, sizeof tiny, "%s/tests/fixtures/tiny-gemma4", src ? src : ".");
    int fd = mkstemp(file);
    ck_assert_int_ge(fd, 0);
    const char body[] = "The quick brown fox\n2,17,99\n";
    ck_assert_int_eq(write(fd, body, sizeof body - 1), (ssize_t)(sizeof body - 1));
    close(fd);

    snprintf(cmd, sizeof cmd, "%s generate --config %s --model %s --prompts-file %s --max-new-tokens 5 --ignore-eos "
             "--json", berth_bin, config_path, tiny, file);
    ck_assert_msg(run(cmd, &out, &err) == 0, "%s", err);
    snprintf(cmd, sizeof cmd, "%s generate --config %s --model %s --prompt 'The quick brown fox' --max-new-tokens 5 "
             "--ignore-eos --json", berth_bin, config_path, tiny);
    ck_assert_msg(run(cmd, &out1, &err1) == 0, "%s", err1);
    json_error_t je;
    char *nl = strchr(out, '\n');
    ck_assert_ptr_nonnull(nl);
    *nl = 0;
    json_t *a = json_loads(out, 0, &je), *b = json_loads(nl + 1, 0, &je), *one = json_loads(out1, 0, &je);
    ck_assert(a && b && one);
    ck_assert_int_eq(json_integer_value(json_object_get(a, "prompt_tokens")),
                     json_integer_value(json_object_get(one, "prompt_tokens")));
    ck_assert(json_equal(json_object_get(a, "tokens"), json_object_get(one, "tokens")));
    ck_assert_int_eq(json_integer_value(json_object_get(b, "prompt_tokens")), 3);
    json_decref(a);
    json_decref(b);
    json_decref(one);
    free(out);
    free(err);
    free(out1);
    free(err1);

    snprintf(cmd, sizeof cmd, "%s generate --config %s --model %s --prompts-file %s --max-new-tokens 2", berth_bin,
             config_path, model_dir, file);
    ck_assert_int_eq(run(cmd, &out, &err), 1);
    char want[2048];
    snprintf(want, sizeof want, "berth: error: --prompts-file %s:1: not a comma-separated list of token ids, and text "
             "needs the tokenizer: %s/tokenizer.json: not found; text prompts need the checkpoint's tokenizer\n",
             file, model_dir);
    ck_assert_str_eq(err, want);
    free(out);
    free(err);
    unlink(file);
}
END_TEST

/* The sampling flags reach the engine on the --prompts-file path exactly as on the single-prompt path: seeded
 * sampling with min-p and penalties gives the same tokens both ways, and min-p changes the outcome. */
START_TEST(test_prompts_file_sampling_flags)
{
    const char *src = getenv("BERTH_SOURCE_ROOT");
    char tiny[1100], file[] = "/tmp/berth-prompts-flags-XXXXXX", cmd[4096], *o[3], *e[3];
    snprintf(tiny, sizeof tiny, "%s/tests/fixtures/tiny-gemma4", src ? src : ".");
    int fd = mkstemp(file);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "2,17,99\n", 8), 8);
    close(fd);
    const char *flags = "--max-new-tokens 12 --ignore-eos --json --temperature 1 --seed 7";
    const char *pen = "--min-p 0.9 --repetition-penalty 1.3 --presence-penalty 0.5 --frequency-penalty 0.25";
    snprintf(cmd, sizeof cmd, "%s generate --config %s --model %s --prompts-file %s %s %s", berth_bin, config_path,
             tiny, file, flags, pen);
    ck_assert_msg(run(cmd, &o[0], &e[0]) == 0, "%s", e[0]);
    snprintf(cmd, sizeof cmd, "%s generate --config %s --model %s --prompt-ids 2,17,99 %s %s", berth_bin,
             config_path, tiny, flags, pen);
    ck_assert_msg(run(cmd, &o[1], &e[1]) == 0, "%s", e[1]);
    snprintf(cmd, sizeof cmd, "%s generate --config %s --model %s --prompts-file %s %s", berth_bin, config_path, tiny,
             file, flags);
    ck_assert_msg(run(cmd, &o[2], &e[2]) == 0, "%s", e[2]);
    json_error_t je;
    json_t *j[3];
    for (int i = 0; i < 3; i++) {
        j[i] = json_loads(o[i], 0, &je);
        ck_assert_msg(j[i] != NULL, "bad JSON: %s", o[i]);
    }
    ck_assert_int_eq(json_array_size(json_object_get(j[0], "tokens")), 12);
    ck_assert(json_equal(json_object_get(j[0], "tokens"), json_object_get(j[1], "tokens")));
    ck_assert(!json_equal(json_object_get(j[0], "tokens"), json_object_get(j[2], "tokens")));
    for (int i = 0; i < 3; i++) {
        json_decref(j[i]);
        free(o[i]);
        free(e[i]);
    }
    unlink(file);
}
END_TEST

START_TEST(test_bench_json)
{
    char cmd[4096], *out, *err;
    snprintf(cmd, sizeof cmd, "%s bench --config %s --model %s --concurrency 1,2 --prompt-len 8 --gen-len 4 --json",
             berth_bin, config_path, model_dir);
    ck_assert_msg(run(cmd, &out, &err) == 0, "%s", err);
    char *save = NULL, *line = strtok_r(out, "\n", &save);
    for (int c = 1; c <= 2; c++) {
        ck_assert_ptr_nonnull(line);
        json_t *o = json_loads(line, 0, NULL);
        ck_assert_msg(o != NULL, "%s", line);
        ck_assert_int_eq(json_integer_value(json_object_get(o, "concurrency")), c);
        ck_assert_int_eq(json_integer_value(json_object_get(o, "tokens")), 4 * c);
        ck_assert(json_real_value(json_object_get(o, "tokens_per_s")) > 0);
        ck_assert(json_real_value(json_object_get(o, "ttft_p50_s")) > 0);
        ck_assert(json_real_value(json_object_get(o, "itl_p99_s")) >= json_real_value(json_object_get(o, "itl_p50_s")));
        /* decode tok/s counts at most the c * 3 tokens after the first ones, over a window shorter than the
         * level's wall time: positive, finite, and above (c * 3) / seconds. */
        json_t *d = json_object_get(o, "decode_tok_s");
        ck_assert_msg(json_is_real(d), "%s", line);
        ck_assert(json_real_value(d) > 0 && json_real_value(d) < 1e9);
        ck_assert(json_real_value(d) > 3.0 * c / json_real_value(json_object_get(o, "seconds")));
        json_decref(o);
        line = strtok_r(NULL, "\n", &save);
    }
    free(out);
    free(err);
    /* --gen-len 1: no token after the first, so no decode figure (null, the key still present). */
    snprintf(cmd, sizeof cmd, "%s bench --config %s --model %s --concurrency 2 --prompt-len 8 --gen-len 1 --json",
             berth_bin, config_path, model_dir);
    ck_assert_msg(run(cmd, &out, &err) == 0, "%s", err);
    {
        json_t *o = json_loads(out, 0, NULL);
        ck_assert_msg(o != NULL, "%s", out);
        ck_assert_int_eq(json_integer_value(json_object_get(o, "tokens")), 2);
        ck_assert(json_is_null(json_object_get(o, "decode_tok_s")));
        json_decref(o);
    }
    free(out);
    free(err);
    /* The table has the decode column last; with one generated token it reads "-". */
    snprintf(cmd, sizeof cmd, "%s bench --config %s --model %s --concurrency 1 --prompt-len 8 --gen-len 1", berth_bin,
             config_path, model_dir);
    ck_assert_msg(run(cmd, &out, &err) == 0, "%s", err);
    ck_assert_msg(strstr(out, "preempt decode_t/s\n") != NULL, "%s", out);
    ck_assert_msg(strstr(out, " -\n") != NULL, "%s", out);
    free(out);
    free(err);
    /* The old single short warm-up request; a bad --warmup value is a usage error naming it. */
    snprintf(cmd, sizeof cmd, "%s bench --config %s --model %s --concurrency 2 --prompt-len 8 --gen-len 3 --warmup once "
             "--json", berth_bin, config_path, model_dir);
    ck_assert_msg(run(cmd, &out, &err) == 0, "%s", err);
    {
        json_t *o = json_loads(out, 0, NULL);
        ck_assert_msg(o != NULL, "%s", out);
        ck_assert_int_eq(json_integer_value(json_object_get(o, "tokens")), 6);
        json_decref(o);
    }
    free(out);
    free(err);
    snprintf(cmd, sizeof cmd, "%s bench --config %s --warmup twice", berth_bin, config_path);
    ck_assert_int_eq(run(cmd, &out, &err), 2);
    ck_assert_msg(strstr(err, "--warmup 'twice' is not 'each' or 'once'") != NULL, "%s", err);
    free(out);
    free(err);
    snprintf(cmd, sizeof cmd, "%s bench --config %s --concurrency 0", berth_bin, config_path);
    ck_assert_int_eq(run(cmd, &out, &err), 2);
    ck_assert_msg(strstr(err, "--concurrency '0' is not a comma-separated list of counts in 1..4096") != NULL, "%s",
                  err);
    free(out);
    free(err);
}
END_TEST

int main(int argc, char **argv)
{
    if (argc < 3) return 2;
    berth_bin = argv[1];
    config_path = argv[2];
    const char *src = getenv("BERTH_SOURCE_ROOT");
    snprintf(model_dir, sizeof model_dir, "%s/tests/fixtures/gemma4/tiny", src ? src : ".");
    struct stat sb;
    char cfgjson[1100];
    snprintf(cfgjson, sizeof cfgjson, "%s/config.json", model_dir);
    if (stat(cfgjson, &sb) != 0) {
        printf("SKIP: no %s\n", cfgjson);
        return 77;
    }
    int n = 0;
    for (int i = 0; i < 40; i++) n += snprintf(long_prompt + n, sizeof long_prompt - (size_t)n, i ? ",%d" : "%d", 2 + (i * 37) % 200);
    Suite *su = suite_create("engine_cli");
    TCase *tc = tcase_create("cli");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_prompts_file);
    tcase_add_test(tc, test_prompts_file_text);
    tcase_add_test(tc, test_prompts_file_sampling_flags);
    tcase_add_test(tc, test_bench_json);
    tcase_add_test(tc, test_generate_logprobs);
    tcase_add_test(tc, test_prompts_file_logprobs);
    suite_add_tcase(su, tc);
    return check_run(su, 0) ? EXIT_FAILURE : EXIT_SUCCESS;
}

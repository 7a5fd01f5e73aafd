/*
 * test_config_parse.c — host/config.c: the shipped configs, every class of error (syntax, unreadable file, bad
 * value) with its exact "file:line:" message, every warning, value formats and path resolution.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "errors.h"
#include "test_registry_support.h"
#include "check_run.h"

static char *tmp;

static void setup(void) { tmp = ts_tmpdir(); }
static void teardown(void)
{
    ts_rmtree(tmp);
    free(tmp);
}

/* Write n bytes (NULs allowed) as tmp/berth.ini and load it. Returns the status; *path gets the file name (caller
 * frees). */
static berth_status load_bytes(const char *data, size_t n, struct berth_config **cfg, char **path)
{
    *path = ts_write_bytes(tmp, "berth.ini", data, n);
    berth_clear_error();
    return config_load(*path, cfg);
}

static berth_status load_text(const char *text, struct berth_config **cfg, char **path)
{
    return load_bytes(text, strlen(text), cfg, path);
}

/* Expect config_load of n bytes to fail with code and exactly "<path>:<msg>" (msg starts with the line, e.g.
 * "3: ..."). */
static void expect_error_bytes(const char *data, size_t n, berth_status code, const char *msg)
{
    struct berth_config *cfg = (void *)1;
    char *path;
    berth_status st = load_bytes(data, n, &cfg, &path);
    char *want = ts_fmt("%s:%s", path, msg);
    ck_assert_int_eq(st, code);
    ck_assert_ptr_null(cfg);
    ck_assert_str_eq(berth_last_error(), want);
    free(want);
    free(path);
}

static void expect_error(const char *text, berth_status code, const char *msg)
{
    expect_error_bytes(text, strlen(text), code, msg);
}

static struct berth_config *load_ok(const char *text, char **path)
{
    struct berth_config *cfg = NULL;
    berth_status st = load_text(text, &cfg, path);
    ck_assert_msg(st == BERTH_OK, "config_load failed: %s", berth_last_error());
    return cfg;
}

START_TEST(shipped_cpu_ini)
{
    char *path = ts_fmt("%s/configs/cpu.ini", ts_source_root());
    struct berth_config *cfg = NULL;
    ck_assert_msg(config_load(path, &cfg) == BERTH_OK, "%s", berth_last_error());
    ck_assert_int_eq(cfg->n_warnings, 0);
    char *dir = ts_fmt("%s/configs/../build/plugins", ts_source_root());
    ck_assert_int_eq(cfg->n_plugin_dirs, 1);
    ck_assert_str_eq(cfg->plugin_dirs[0], dir);
    ck_assert_int_eq(cfg->plugin_dir_lines[0], 4);
    ck_assert_int_eq(cfg->default_plugin_dir, 0);
    ck_assert_int_eq(cfg->n_backends, 2);
    ck_assert_str_eq(cfg->backends[0].name, "cpu");
    ck_assert_int_eq(cfg->backends[0].enabled, 1);
    ck_assert_int_eq(cfg->backends[0].priority, 10);
    ck_assert_str_eq(cfg_section_get(cfg->backends[0].section, "threads"), "0");
    ck_assert_str_eq(cfg->backends[1].name, "cuda");
    ck_assert_int_eq(cfg->backends[1].enabled, 0);
    ck_assert_int_eq(cfg->backends[1].priority, 100);
    ck_assert_int_eq(cfg->backends[1].line, 12);
    ck_assert_int_eq(cfg->kv_block_size, 16);
    ck_assert_uint_eq(cfg->kv_memory_bytes, 512ull << 20);
    ck_assert_int_eq(cfg->sched_max_batch_tokens, 512);
    ck_assert_int_eq(cfg->sched_max_seqs, 64);
    ck_assert_int_eq(cfg->kv_dtype, -1); /* auto */
    ck_assert_int_eq(cfg->sched_graphs, 1);
    ck_assert_str_eq(cfg->server_host, "127.0.0.1");
    ck_assert_int_eq(cfg->server_port, 8080);
    ck_assert_ptr_null(cfg->model_path);
    config_free(cfg);
    free(dir);
    free(path);
}
END_TEST

START_TEST(shipped_cuda_ini)
{
    char *path = ts_fmt("%s/configs/cuda.ini", ts_source_root());
    struct berth_config *cfg = NULL;
    ck_assert_msg(config_load(path, &cfg) == BERTH_OK, "%s", berth_last_error());
    ck_assert_int_eq(cfg->n_warnings, 0);
    ck_assert_int_eq(cfg->n_backends, 2);
    ck_assert_str_eq(cfg->backends[0].name, "cuda");
    ck_assert_int_eq(cfg->backends[0].enabled, 1);
    ck_assert_int_eq(cfg->backends[0].priority, 100);
    ck_assert_int_eq(cfg->backends[0].device, 0);
    ck_assert_str_eq(cfg_section_get(cfg->backends[0].section, "compute"), "bf16");
    ck_assert_ptr_null(cfg_section_get(cfg->backends[0].section, "threads"));
    ck_assert_str_eq(cfg->backends[1].name, "cpu");
    ck_assert_int_eq(cfg->backends[1].priority, 10);
    config_free(cfg);
    free(path);
}
END_TEST

START_TEST(defaults_and_default_plugin_dir)
{
    char *path;
    struct berth_config *cfg = load_ok("; nothing but a comment\n", &path);
    ck_assert_int_eq(cfg->n_plugin_dirs, 1);
    ck_assert_str_eq(cfg->plugin_dirs[0], BERTH_DEFAULT_PLUGIN_DIR);
    ck_assert_int_eq(cfg->plugin_dir_lines[0], 0);
    ck_assert_int_eq(cfg->default_plugin_dir, 1);
    ck_assert_int_eq(cfg->n_plugin_paths, 0);
    ck_assert_int_eq(cfg->n_backends, 0);
    ck_assert_int_eq(cfg->kv_block_size, 16);
    ck_assert_uint_eq(cfg->kv_memory_bytes, 512ull << 20);
    ck_assert_int_eq(cfg->sched_max_batch_tokens, 512);
    ck_assert_int_eq(cfg->sched_max_seqs, 64);
    ck_assert_str_eq(cfg->server_host, "127.0.0.1");
    ck_assert_int_eq(cfg->server_port, 8080);
    config_free(cfg);
    free(path);

    /* An empty [plugins] section means "no plugin folders", not the default. */
    cfg = load_ok("[plugins]\n", &path);
    ck_assert_int_eq(cfg->n_plugin_dirs, 0);
    ck_assert_int_eq(cfg->default_plugin_dir, 0);
    config_free(cfg);
    free(path);
}
END_TEST

START_TEST(syntax_errors)
{
    expect_error("[kv]\nblock_size = 8\n[scheduler\nmax_seqs = 4\n", BERTH_E_INVALID,
                 "3: syntax error: section header without closing ']'");
    expect_error("[kv]\nblock_size 16\n", BERTH_E_INVALID, "2: syntax error: expected 'key = value' or '[section]'");
    expect_error("[kv]\n= 16\n", BERTH_E_INVALID, "2: syntax error: no key before '='");
    /* inih's buffer holds 198 characters of a line; longer lines are an error, not silently cut. */
    char text[400] = "[server]\nhost = ";
    size_t n = strlen(text);
    memset(text + n, 'h', 200);
    strcpy(text + n + 200, "\n");
    expect_error(text, BERTH_E_INVALID, "2: line is longer than 198 characters");
    /* A short line ending in hundreds of '\r' is a short line: it once overflowed inih's line buffer (the copy went
     * by the raw length; tests/fuzz/fuzz_config_load found it). Read as "host = h", and the line after it as
     * usual. */
    char cr[1024] = "[server]\nhost = h";
    n = strlen(cr);
    memset(cr + n, '\r', 600);
    strcpy(cr + n + 600, "\nport = 9\n");
    char *path;
    struct berth_config *cfg = load_ok(cr, &path);
    ck_assert_str_eq(cfg->server_host, "h");
    ck_assert_int_eq(cfg->server_port, 9);
    config_free(cfg);
    free(path);
    /* A NUL byte inside a line is an error naming the line, not a silently shortened value. */
    static const char nul[] = "[server]\nhost = a\0b\n";
    expect_error_bytes(nul, sizeof nul - 1, BERTH_E_INVALID, "2: line contains a NUL byte");
}
END_TEST

START_TEST(first_problem_in_file_order_wins)
{
    expect_error("[backend.cpu]\npriority = high\nenabled = maybe\nbroken line\n", BERTH_E_INVALID,
                 "2: [backend.cpu] priority: invalid integer 'high'");
    expect_error("[backend.cpu]\nbroken line\npriority = high\n", BERTH_E_INVALID,
                 "2: syntax error: expected 'key = value' or '[section]'");
}
END_TEST

START_TEST(warnings_after_a_fatal_error_are_not_logged)
{
    /* The broken header at line 3 makes line 4 look like a [kv] key; only the warning before it is real. */
    ts_capture_begin();
    expect_error("[kv]\nsize = 1\n[backend.cpu\npriority = 1\n", BERTH_E_INVALID,
                 "3: syntax error: section header without closing ']'");
    char *err = ts_capture_end();
    char *want = ts_fmt("berth: warning: %s/berth.ini:2: unknown key 'size' in [kv] (ignored)\n", tmp);
    ck_assert_str_eq(err, want);
    free(want);
    free(err);
}
END_TEST

START_TEST(unreadable_files)
{
    char *missing = ts_fmt("%s/nope.ini", tmp);
    struct berth_config *cfg = (void *)1;
    ck_assert_int_eq(config_load(missing, &cfg), BERTH_E_IO);
    ck_assert_ptr_null(cfg);
    char *want = ts_fmt("%s: cannot read: No such file or directory", missing);
    ck_assert_str_eq(berth_last_error(), want);
    free(want);
    free(missing);

    ck_assert_int_eq(config_load(tmp, &cfg), BERTH_E_IO);
    want = ts_fmt("%s: cannot read: Is a directory", tmp);
    ck_assert_str_eq(berth_last_error(), want);
    free(want);
}
END_TEST

START_TEST(bad_values)
{
    expect_error("[backend.cpu]\nenabled = true\npriority = abc\n", BERTH_E_INVALID,
                 "3: [backend.cpu] priority: invalid integer 'abc'");
    expect_error("[backend.cuda]\nenabled = maybe\n", BERTH_E_INVALID,
                 "2: [backend.cuda] enabled: invalid boolean 'maybe' (use true/false, yes/no, on/off or 1/0)");
    expect_error("[kv]\nmemory = 12XB\n", BERTH_E_INVALID,
                 "2: [kv] memory: invalid size '12XB' (use a number with an optional K, M, G, T, KiB, MiB, GiB or "
                 "TiB suffix)");
    expect_error("[kv]\ndtype = f8\n", BERTH_E_INVALID, "2: [kv] dtype: 'f8' is not one of auto, f32, bf16, f16");
    expect_error("[scheduler]\ngraphs = sometimes\n", BERTH_E_INVALID,
                 "2: [scheduler] graphs: invalid boolean 'sometimes' (use true/false, yes/no, on/off or 1/0)");
    expect_error("[backend.cpu]\ndevice = -1\n", BERTH_E_INVALID, "2: [backend.cpu] device: must be >= 0, got '-1'");
    expect_error("[backend.cpu]\npriority = 99999999999\n", BERTH_E_INVALID,
                 "2: [backend.cpu] priority: must be -2147483648..2147483647, got '99999999999'");
    expect_error("[kv]\nblock_size = 0\n", BERTH_E_INVALID, "2: [kv] block_size: must be >= 1, got '0'");
    expect_error("[scheduler]\nmax_seqs = 4x\n", BERTH_E_INVALID, "2: [scheduler] max_seqs: invalid integer '4x'");
    expect_error("[server]\nport = 70000\n", BERTH_E_INVALID, "2: [server] port: must be 1..65535, got '70000'");
    expect_error("[plugins]\ndir =\n", BERTH_E_INVALID, "2: [plugins] dir: empty value");
    expect_error("[model]\nplugin = \n", BERTH_E_INVALID, "2: [model] plugin: empty value");
    expect_error("[backend.cpu]\npriority =\n", BERTH_E_INVALID, "2: [backend.cpu] priority: invalid integer ''");
}
END_TEST

START_TEST(value_formats)
{
    static const struct {
        const char *text;
        unsigned long long bytes;
    } sizes[] = {{"4096", 4096},        {"3K", 3ull << 10}, {"512MiB", 512ull << 20}, {"1G", 1ull << 30},
                 {"2 GiB", 2ull << 30}, {"1T", 1ull << 40}, {"7B", 7},                {"0", 0}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        char *text = ts_fmt("[kv]\nmemory = %s\n", sizes[i].text), *path;
        struct berth_config *cfg = load_ok(text, &path);
        ck_assert_msg(cfg->kv_memory_bytes == sizes[i].bytes, "%s", sizes[i].text);
        config_free(cfg);
        free(text);
        free(path);
    }
    static const struct {
        const char *text;
        int dtype;
    } dtypes[] = {{"auto", -1}, {"f32", BERTH_DTYPE_F32}, {"bf16", BERTH_DTYPE_BF16}, {"f16", BERTH_DTYPE_F16}};
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++) {
        char *text = ts_fmt("[kv]\ndtype = %s\n[scheduler]\ngraphs = off\n", dtypes[i].text), *path;
        struct berth_config *cfg = load_ok(text, &path);
        ck_assert_msg(cfg->kv_dtype == dtypes[i].dtype, "%s", dtypes[i].text);
        ck_assert_int_eq(cfg->sched_graphs, 0);
        config_free(cfg);
        free(text);
        free(path);
    }
    static const char *const bad_sizes[] = {"1.5G", "-1", "G", "1GB", "99999999999999999999", "20000000T"};
    for (size_t i = 0; i < sizeof bad_sizes / sizeof bad_sizes[0]; i++) {
        char *text = ts_fmt("[kv]\nmemory = %s\n", bad_sizes[i]);
        char *msg = ts_fmt("2: [kv] memory: invalid size '%s' (use a number with an optional K, M, G, T, KiB, MiB, "
                           "GiB or TiB suffix)",
                           bad_sizes[i]);
        expect_error(text, BERTH_E_INVALID, msg);
        free(text);
        free(msg);
    }
    static const struct {
        const char *text;
        int value;
    } bools[] = {{"true", 1}, {"TRUE", 1}, {"yes", 1}, {"on", 1}, {"1", 1},
                 {"false", 0}, {"No", 0},  {"off", 0}, {"0", 0}};
    for (size_t i = 0; i < sizeof bools / sizeof bools[0]; i++) {
        char *text = ts_fmt("[backend.x]\nenabled = %s\n", bools[i].text), *path;
        struct berth_config *cfg = load_ok(text, &path);
        ck_assert_int_eq(cfg->n_backends, 1);
        ck_assert_msg(cfg->backends[0].enabled == bools[i].value, "%s", bools[i].text);
        config_free(cfg);
        free(text);
        free(path);
    }
    /* Inline comments need a blank before ';'. Indented lines are ordinary keys, never continuations. */
    char *path;
    struct berth_config *cfg = load_ok("[backend.cpu]\npriority = 5 ; five\n    device = 2\n\tenabled = off\n"
                                       "[kv]\nblock_size = 8\n  memory = 1M\n",
                                       &path);
    ck_assert_int_eq(cfg->backends[0].priority, 5);
    ck_assert_int_eq(cfg->backends[0].device, 2);
    ck_assert_int_eq(cfg->backends[0].enabled, 0);
    ck_assert_int_eq(cfg->kv_block_size, 8);
    ck_assert_uint_eq(cfg->kv_memory_bytes, 1ull << 20);
    ck_assert_int_eq(cfg->n_warnings, 0);
    config_free(cfg);
    free(path);
}
END_TEST

START_TEST(warnings_name_file_and_line)
{
    char *path;
    const char *text = "stray = 1\n"               /* 1 */
                       "[plugins]\n"               /* 2 */
                       "dirs = /x\n"               /* 3 */
                       "[kv]\n"                    /* 4 */
                       "block_size = 8\n"          /* 5 */
                       "block_size = 32\n"         /* 6 */
                       "[gpu]\n"                   /* 7 */
                       "anything = 1\n"            /* 8 */
                       "[kv]\n"                    /* 9 */
                       "[model]\n"                 /* 10 */
                       "weights = here\n"          /* 11 */
                       "[backend.cpu]\n"           /* 12 */
                       "threads = 4\n";            /* 13: backend keys belong to the plugin: no warning */
    ts_capture_begin();
    struct berth_config *cfg = load_ok(text, &path);
    char *err = ts_capture_end();
    const char *want[] = {
        "1: key 'stray' outside any section (ignored)",
        "3: unknown key 'dirs' in [plugins] (ignored)",
        "6: [kv] block_size: duplicate key (first at line 5); the last value wins",
        "7: unknown section [gpu] (ignored)",
        "9: section [kv] repeated (first at line 4); its keys are merged",
        "11: unknown key 'weights' in [model] (ignored)",
    };
    size_t n = sizeof want / sizeof want[0];
    ck_assert_int_eq(cfg->n_warnings, (int)n);
    char *expected_log = strdup("");
    for (size_t i = 0; i < n; i++) {
        char *w = ts_fmt("%s:%s", path, want[i]);
        ck_assert_str_eq(cfg->warnings[i], w);
        char *log = ts_fmt("%sberth: warning: %s\n", expected_log, w);
        free(expected_log);
        expected_log = log;
        free(w);
    }
    ck_assert_str_eq(err, expected_log);
    ck_assert_int_eq(cfg->kv_block_size, 32);
    ck_assert_str_eq(cfg_section_get(config_section(cfg, "kv"), "block_size"), "32");
    ck_assert_str_eq(cfg_section_get(cfg->backends[0].section, "threads"), "4");
    ck_assert_int_eq(config_section(cfg, "gpu")->line, 7);
    free(expected_log);
    free(err);
    config_free(cfg);
    free(path);
}
END_TEST

START_TEST(paths_resolve_against_the_config_folder)
{
    char *sub = ts_fmt("%s/sub", tmp);
    ck_assert_int_eq(mkdir(sub, 0700), 0);
    char *path = ts_write(sub, "x.ini",
                          "[plugins]\ndir = ../plugins\ndir = /abs/plugins\npath = one.so\npath = /abs/two.so\n"
                          "[model]\npath = ckpt\nplugin = gemma4\nbackend = cpu\n");
    struct berth_config *cfg = NULL;
    ck_assert_msg(config_load(path, &cfg) == BERTH_OK, "%s", berth_last_error());
    char *want = ts_fmt("%s/../plugins", sub);
    ck_assert_int_eq(cfg->n_plugin_dirs, 2);
    ck_assert_str_eq(cfg->plugin_dirs[0], want);
    ck_assert_str_eq(cfg->plugin_dirs[1], "/abs/plugins");
    ck_assert_int_eq(cfg->plugin_dir_lines[1], 3);
    free(want);
    want = ts_fmt("%s/one.so", sub);
    ck_assert_int_eq(cfg->n_plugin_paths, 2);
    ck_assert_str_eq(cfg->plugin_paths[0], want);
    ck_assert_str_eq(cfg->plugin_paths[1], "/abs/two.so");
    ck_assert_int_eq(cfg->plugin_path_lines[0], 4);
    free(want);
    want = ts_fmt("%s/ckpt", sub);
    ck_assert_str_eq(cfg->model_path, want);
    ck_assert_str_eq(cfg->model_plugin, "gemma4");
    ck_assert_int_eq(cfg->model_plugin_line, 8);
    ck_assert_str_eq(cfg->model_backend, "cpu");
    ck_assert_int_eq(cfg->model_backend_line, 9);
    free(want);
    config_free(cfg);

    /* A config named without a folder resolves against the current directory. */
    ck_assert_int_eq(chdir(sub), 0);
    ck_assert_msg(config_load("x.ini", &cfg) == BERTH_OK, "%s", berth_last_error());
    ck_assert_str_eq(cfg->plugin_dirs[0], "./../plugins");
    ck_assert_str_eq(cfg->dir, ".");
    config_free(cfg);
    free(path);
    free(sub);
}
END_TEST

START_TEST(section_lookup)
{
    char *path;
    struct berth_config *cfg = load_ok("[model.gemma4]\nkv_dtype = bf16\nkv_dtype = f32\n[backend.cuda]\n", &path);
    const struct cfg_section *s = config_section(cfg, "model.gemma4");
    ck_assert_ptr_nonnull(s);
    ck_assert_int_eq(s->n_entries, 2);
    ck_assert_str_eq(cfg_section_get(s, "kv_dtype"), "f32"); /* last one wins */
    ck_assert_int_eq(s->entries[0].line, 2);
    ck_assert_ptr_null(cfg_section_get(s, "nothing"));
    ck_assert_ptr_null(config_section(cfg, "model.qwen"));
    /* A header without keys still declares the backend (with defaults). */
    ck_assert_int_eq(cfg->n_backends, 1);
    ck_assert_str_eq(cfg->backends[0].name, "cuda");
    ck_assert_int_eq(cfg->backends[0].enabled, 1);
    ck_assert_int_eq(cfg->backends[0].priority, 0);
    ck_assert_int_eq(cfg->backends[0].line, 4);
    ck_assert_ptr_eq(cfg->backends[0].section, config_section(cfg, "backend.cuda"));
    config_free(cfg);
    free(path);
}
END_TEST

START_TEST(odd_input_never_crashes)
{
    static const char *const odd[] = {
        "[", "]", "[]\nx = 1\n", "=\n", ":\n", "[kv]\n:\n", "\xef\xbb\xbf[kv]\nblock_size = 4\n",
        "[backend.]\npriority = 1\n", "[model.]\n", "[kv]\nmemory = 18446744073709551615\n",
        "[kv]\r\nblock_size = 4\r\n", "[kv]]\n", "[ kv ]\n", "\t\t\n\n;\n#\n", "[plugins]\ndir = ;\n",
    };
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
        struct berth_config *cfg = NULL;
        char *path;
        ts_capture_begin();
        berth_status st = load_text(odd[i], &cfg, &path);
        free(ts_capture_end());
        ck_assert_msg(st == BERTH_OK || st == BERTH_E_INVALID, "input %zu: %d", i, st);
        if (st != BERTH_OK)
            ck_assert_msg(strncmp(berth_last_error(), path, strlen(path)) == 0, "%s", berth_last_error());
        config_free(cfg);
        free(path);
    }
    /* Random bytes, fixed seed: only OK or INVALID with a file-named message. */
    unsigned seed = 12345;
    for (int round = 0; round < 300; round++) {
        char text[400];
        size_t n = (size_t)(rand_r(&seed) % 399);
        for (size_t i = 0; i < n; i++) {
            static const char alphabet[] = "[]=:;# \t\nabkv.0123456789\r\x01\xff";
            text[i] = alphabet[rand_r(&seed) % (sizeof alphabet - 1)];
        }
        text[n] = '\0';
        struct berth_config *cfg = NULL;
        char *path;
        ts_capture_begin();
        berth_status st = load_text(text, &cfg, &path);
        free(ts_capture_end());
        ck_assert_msg(st == BERTH_OK || st == BERTH_E_INVALID, "round %d: %d", round, st);
        config_free(cfg);
        free(path);
    }
    /* The BOM is skipped and the CRLF file reads like the LF one. */
    char *path;
    struct berth_config *cfg = load_ok("\xef\xbb\xbf[kv]\r\nblock_size = 4\r\n", &path);
    ck_assert_int_eq(cfg->kv_block_size, 4);
    ck_assert_int_eq(cfg->n_warnings, 0);
    config_free(cfg);
    free(path);
}
END_TEST

static Suite *config_suite(void)
{
    Suite *s = suite_create("config");
    TCase *tc = tcase_create("parse");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, shipped_cpu_ini);
    tcase_add_test(tc, shipped_cuda_ini);
    tcase_add_test(tc, defaults_and_default_plugin_dir);
    tcase_add_test(tc, syntax_errors);
    tcase_add_test(tc, first_problem_in_file_order_wins);
    tcase_add_test(tc, warnings_after_a_fatal_error_are_not_logged);
    tcase_add_test(tc, unreadable_files);
    tcase_add_test(tc, bad_values);
    tcase_add_test(tc, value_formats);
    tcase_add_test(tc, warnings_name_file_and_line);
    tcase_add_test(tc, paths_resolve_against_the_config_folder);
    tcase_add_test(tc, section_lookup);
    tcase_add_test(tc, odd_input_never_crashes);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return check_run(config_suite(), 0) ? EXIT_FAILURE : EXIT_SUCCESS;
}

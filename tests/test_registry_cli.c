/*
 * test_registry_cli.c — the berth executable: --help, --version, usage errors, and `berth plugins` on the shipped
 * CPU config, on the conformance config (every row, every reason), on a broken config, and with --model.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_registry_support.h"
#include "check_run.h"

static char *tmp, *plugdir, *berth;

static void setup(void)
{
    unsetenv("BERTH_BACKEND");
    tmp = ts_tmpdir();
    plugdir = ts_test_plugin_dir();
    berth = ts_fmt("%s/host/berth", ts_build_root());
}

static void teardown(void)
{
    ts_rmtree(tmp);
    free(tmp);
    free(plugdir);
    free(berth);
}

/* Run berth with up to 6 arguments (NULL-terminated) and optional env entries. */
static int run(char **out, char **err, const char *const env[], const char *a1, const char *a2, const char *a3,
               const char *a4, const char *a5)
{
    char *argv[] = {berth, (char *)a1, (char *)a2, (char *)a3, (char *)a4, (char *)a5, NULL};
    return ts_run(argv, env, out, err);
}

/* The output line that contains needle, as a new string, or NULL. */
static char *line_with(const char *text, const char *needle)
{
    const char *at = strstr(text, needle);
    if (!at)
        return NULL;
    const char *start = at;
    while (start > text && start[-1] != '\n')
        start--;
    const char *end = strchr(at, '\n');
    return strndup(start, end ? (size_t)(end - start) : strlen(start));
}

/* The line after the one containing needle. */
static char *line_after(const char *text, const char *needle)
{
    const char *at = strstr(text, needle);
    ck_assert_msg(at != NULL, "no line with %s in:\n%s", needle, text);
    const char *nl = strchr(at, '\n');
    ck_assert_ptr_nonnull(nl);
    const char *end = strchr(nl + 1, '\n');
    return strndup(nl + 1, end ? (size_t)(end - nl - 1) : strlen(nl + 1));
}

START_TEST(version_and_help)
{
    char *out, *err;
    ck_assert_int_eq(run(&out, &err, NULL, "--version", NULL, NULL, NULL, NULL), 0);
    ck_assert_str_eq(out, "berth " BERTH_VERSION " (plugin ABI 1.0)\n");
    ck_assert_str_eq(err, "");
    free(out), free(err);

    ck_assert_int_eq(run(&out, &err, NULL, "--help", NULL, NULL, NULL, NULL), 0);
    ck_assert_msg(strncmp(out, "usage: berth [-v | -vv] COMMAND [OPTIONS]\n", 42) == 0, "%s", out);
    ck_assert_ptr_nonnull(strstr(out, "\n  plugins --config FILE [--model DIR]\n"));
    ck_assert_ptr_nonnull(strstr(out, "\n  BERTH_BACKEND=NAME"));
    free(out), free(err);

    ck_assert_int_eq(run(&out, &err, NULL, "plugins", "--help", NULL, NULL, NULL), 0);
    ck_assert_msg(strncmp(out, "usage: berth plugins --config FILE", 34) == 0, "%s", out);
    free(out), free(err);
}
END_TEST

START_TEST(usage_errors_exit_2)
{
    char *out, *err;
    ck_assert_int_eq(run(&out, &err, NULL, NULL, NULL, NULL, NULL, NULL), 2);
    ck_assert_msg(strncmp(err, "berth: no command given\n\nusage: berth", 37) == 0, "%s", err);
    free(out), free(err);

    ck_assert_int_eq(run(&out, &err, NULL, "frobnicate", NULL, NULL, NULL, NULL), 2);
    ck_assert_msg(strncmp(err, "berth: unknown command 'frobnicate'\n\nusage: berth", 49) == 0, "%s", err);
    ck_assert_str_eq(out, "");
    free(out), free(err);

    ck_assert_int_eq(run(&out, &err, NULL, "--frob", "plugins", NULL, NULL, NULL), 2);
    ck_assert_msg(strncmp(err, "berth: unknown option '--frob'\n", 31) == 0, "%s", err);
    free(out), free(err);

    ck_assert_int_eq(run(&out, &err, NULL, "plugins", NULL, NULL, NULL, NULL), 2);
    ck_assert_msg(strncmp(err, "berth plugins: --config FILE is required\n", 41) == 0, "%s", err);
    free(out), free(err);

    ck_assert_int_eq(run(&out, &err, NULL, "plugins", "--config", NULL, NULL, NULL), 2);
    ck_assert_msg(strncmp(err, "berth plugins: --config needs a value\n", 38) == 0, "%s", err);
    free(out), free(err);

    ck_assert_int_eq(run(&out, &err, NULL, "plugins", "--config", "x.ini", "--bogus", NULL), 2);
    ck_assert_msg(strncmp(err, "berth plugins: unknown argument '--bogus'\n", 42) == 0, "%s", err);
    free(out), free(err);
}
END_TEST

START_TEST(shipped_cpu_config_lists_the_build_plugins)
{
    /* configs/cpu.ini as shipped, with its ../build/plugins pointed at this build's plugins folder. */
    char *src = ts_fmt("%s/configs/cpu.ini", ts_source_root());
    char *text = ts_read(src);
    ck_assert_ptr_nonnull(text);
    char *dirline = strstr(text, "dir = ../build/plugins\n");
    ck_assert_msg(dirline != NULL, "configs/cpu.ini no longer says dir = ../build/plugins");
    *dirline = '\0';
    char *patched = ts_fmt("%sdir = %s/plugins\n%s", text, ts_build_root(), dirline + strlen("dir = ../build/plugins\n"));
    char *ini = ts_write(tmp, "cpu.ini", patched);
    char *out, *err;
    ck_assert_int_eq(run(&out, &err, NULL, "plugins", "--config", ini, NULL, NULL), 0);
    /* No config warnings (plugins may log their own). */
    ck_assert_msg(strstr(err, ini) == NULL, "%s", err);
    char *head = ts_fmt("berth " BERTH_VERSION " (plugin ABI 1.0), config %s\n", ini);
    ck_assert_msg(strncmp(out, head, strlen(head)) == 0, "%s", out);
    /* Every plugin file the build made has a row, loaded or rejected with a reason. */
    static const char *const files[] = {"berth-backend-cpu.so", "berth-model-gemma4.so", "berth-backend-cuda.so"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char *path = ts_fmt("%s/plugins/%s", ts_build_root(), files[i]);
        if (access(path, F_OK) == 0) {
            char *row = line_with(out, path);
            ck_assert_msg(row != NULL, "no row for %s:\n%s", path, out);
            ck_assert_msg(strncmp(row, "  loaded ", 9) == 0 || strncmp(row, "  rejected ", 11) == 0, "%s", row);
            free(row);
        }
        free(path);
    }
    free(out), free(err);
    free(head);
    free(ini);
    free(patched);
    free(text);
    free(src);
}
END_TEST

START_TEST(conformance_listing)
{
    char *ini = ts_conformance_ini();
    char *out, *err;
    ck_assert_int_eq(run(&out, &err, NULL, "plugins", "--config", ini, NULL, NULL), 0);
    char *warning = ts_fmt("berth: warning: %s:9: [plugins] path '%s/backend_absent.so': No such file or directory "
                           "(skipped)\n",
                           ini, plugdir);
    ck_assert_str_eq(err, warning);
    char *folders = ts_fmt("Plugin folders:\n  %s: 22 plugin files\n\nPlugins: 23 found, 7 loaded\n", plugdir);
    ck_assert_msg(strstr(out, folders) != NULL, "%s", out);

    static const struct {
        const char *file, *row, *next;
    } rows[] = {
        {"backend_abi06.so", "  rejected  -        -             -        0.6    ",
         "            why: ABI major mismatch: plugin ABI 0.6, host ABI 1.0"},
        {"backend_abimajor.so", "  rejected  -        -             -        2.0    ",
         "            why: ABI major mismatch: plugin ABI 2.0, host ABI 1.0"},
        {"backend_testcpu.so", "  loaded    backend  testcpu       0.1.0    1.0    ",
         "            test backend (testcpu)"},
        {"backend_newminor.so", "  loaded    backend  newminor      0.1.0    1.9    ",
         "            note: plugin ABI 1.9 is newer than host ABI 1.0 (accepted)"},
        {"backend_nullmember.so", "  rejected  backend  nullmember    0.1.0    1.0    ",
         "            why: backend vtable member 'buffer_alloc' is NULL"},
        {"backend_zerodev.so", "  loaded    backend  zerodev       0.1.0    1.0    ",
         "            note: no devices: 0 TEST devices: no test accelerator here"},
        {"model_testmodel.so", "  loaded    model    testmodel     0.1.0    1.0    ",
         "            test model (testmodel)"},
        {"backend_absent.so", "  missing   -        -             -        -      ", NULL},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        char *path = ts_fmt("%s/%s", plugdir, rows[i].file);
        char *want = ts_fmt("%s%s", rows[i].row, path);
        char *row = line_with(out, path);
        ck_assert_msg(row != NULL, "no row for %s", path);
        ck_assert_str_eq(row, want);
        if (rows[i].next) {
            char *next = line_after(out, want);
            ck_assert_str_eq(next, rows[i].next);
            free(next);
        }
        free(row);
        free(want);
        free(path);
    }
    /* Devices and capabilities of a loaded backend; the disabled one says so. */
    ck_assert_ptr_nonnull(strstr(out, "            test backend (testcpu)\n"
                                      "            config: [backend.testcpu] line 11: enabled, priority 10, device 0\n"
                                      "            devices: 1\n"
                                      "              [0] Test CPU device 0: 1.0 GiB (0.5 GiB free), 2 compute units\n"
                                      "                  caps: wrap_host host_visible; weights: f32 bf16; "
                                      "activations: f32; kv: f32\n"));
    ck_assert_ptr_nonnull(strstr(out, "config: [backend.newminor] line 28: disabled, priority 200, device 0\n"));
    ck_assert_ptr_nonnull(strstr(out, "            devices: 0 (0 TEST devices: no test accelerator here)\n"));
    ck_assert_ptr_nonnull(strstr(out, "            model types: berth_test\n"));
    free(out), free(err);
    free(folders);
    free(warning);
    free(ini);
}
END_TEST

START_TEST(fatal_config_errors_exit_1_with_file_and_line)
{
    char *ini = ts_write(tmp, "bad.ini", "[plugins]\ndir = /x\n[backend.cpu\npriority = 1\n");
    char *out, *err;
    ck_assert_int_eq(run(&out, &err, NULL, "plugins", "--config", ini, NULL, NULL), 1);
    char *want = ts_fmt("berth: error: %s:3: syntax error: section header without closing ']'\n", ini);
    ck_assert_str_eq(err, want);
    ck_assert_str_eq(out, "");
    free(out), free(err), free(want), free(ini);

    ini = ts_write(tmp, "bad2.ini", "[backend.cuda]\nenabled = maybe\n");
    ck_assert_int_eq(run(&out, &err, NULL, "plugins", "--config", ini, NULL, NULL), 1);
    want = ts_fmt("berth: error: %s:2: [backend.cuda] enabled: invalid boolean 'maybe' (use true/false, yes/no, "
                  "on/off or 1/0)\n",
                  ini);
    ck_assert_str_eq(err, want);
    free(out), free(err), free(want), free(ini);

    char *missing = ts_fmt("%s/none.ini", tmp);
    ck_assert_int_eq(run(&out, &err, NULL, "plugins", "--config", missing, NULL, NULL), 1);
    want = ts_fmt("berth: error: %s: cannot read: No such file or directory\n", missing);
    ck_assert_str_eq(err, want);
    free(out), free(err), free(want), free(missing);
}
END_TEST

START_TEST(missing_folder_and_path_are_warnings)
{
    char *text = ts_fmt("[plugins]\ndir = %s/gone\npath = %s/gone.so\n", tmp, tmp);
    char *ini = ts_write(tmp, "w.ini", text);
    char *out, *err;
    ck_assert_int_eq(run(&out, &err, NULL, "plugins", "--config", ini, NULL, NULL), 0);
    char *want = ts_fmt("berth: warning: %s:2: [plugins] dir '%s/gone': No such file or directory (skipped)\n"
                        "berth: warning: %s:3: [plugins] path '%s/gone.so': No such file or directory (skipped)\n",
                        ini, tmp, ini, tmp);
    ck_assert_str_eq(err, want);
    char *listing = ts_fmt("Plugin folders:\n  %s/gone: unreadable (skipped)\n\nPlugins: 1 found, 0 loaded\n", tmp);
    ck_assert_msg(strstr(out, listing) != NULL, "%s", out);
    char *row = ts_fmt("  missing   -        -     -        -      %s/gone.so\n"
                       "            why: %s:3: [plugins] path: No such file or directory\n",
                       tmp, ini);
    ck_assert_msg(strstr(out, row) != NULL, "%s", out);
    free(row), free(listing), free(want), free(out), free(err), free(ini), free(text);
}
END_TEST

START_TEST(model_selection_is_printed)
{
    char *ck = ts_fmt("%s/ckpt", tmp);
    ck_assert_int_eq(mkdir(ck, 0700), 0);
    ts_make_checkpoint(ck, "berth_test");
    char *ini = ts_conformance_ini();
    char *out, *err;
    ck_assert_int_eq(run(&out, &err, NULL, "plugins", "--config", ini, "--model", ck), 0);
    char *sel = ts_fmt("\nSelection for %s:\n"
                       "model plugin: testmodel 0.1.0 (accepts model_type 'berth_test')\n"
                       "  picky: declined: model_type 'berth_test' is not picky_arch\n"
                       "backend: testcpu 0.1.0, device 0 (Test CPU device 0), priority 10\n"
                       "  newminor: disabled in config\n"
                       "  zerodev: no devices: 0 TEST devices: no test accelerator here\n"
                       "  initfail: init of device 0 failed: initfail: simulated init failure\n"
                       "  noattn: lacks op attention (head_dim 64, window 0) required by testmodel: no 'attention' "
                       "in its op table\n",
                       ck);
    ck_assert_msg(strstr(out, sel) != NULL, "%s", out);
    ck_assert_ptr_nonnull(strstr(err, "berth: warning: using backend 'testcpu' for testmodel: zerodev: no devices"));
    ck_assert_ptr_null(strstr(err, "berth: [testcpu] opened device 0")); /* INFO: hidden by default */
    free(out), free(err);

    /* -v shows plugin INFO lines, tagged with the plugin's name. */
    ck_assert_int_eq(run(&out, &err, NULL, "-v", "plugins", "--config", ini, "--model"), 2); /* --model needs DIR */
    free(out), free(err);
    char *argv[] = {berth, "-v", "plugins", "--config", ini, "--model", ck, NULL};
    ck_assert_int_eq(ts_run(argv, NULL, &out, &err), 0);
    ck_assert_ptr_nonnull(strstr(err, "\nberth: [testcpu] opened device 0\n"));
    free(out), free(err);

    /* BERTH_BACKEND naming nothing loaded: fatal, exit 1, the listing still printed. */
    const char *const env[] = {"BERTH_BACKEND=nosuch", NULL};
    ck_assert_int_eq(run(&out, &err, env, "plugins", "--config", ini, "--model", ck), 1);
    ck_assert_ptr_nonnull(strstr(err, "berth: error: BERTH_BACKEND=nosuch: no backend plugin named 'nosuch' is loaded "
                                      "(loaded backends: initfail, newminor, noattn, testcpu, zerodev)\n"));
    ck_assert_ptr_nonnull(strstr(out, "Plugins: 23 found, 7 loaded\n"));
    free(out), free(err);

    /* A folder that is not a checkpoint: checkpoint.c's message, exit 1. */
    char *none = ts_fmt("%s/nockpt", tmp);
    ck_assert_int_eq(run(&out, &err, NULL, "plugins", "--config", ini, "--model", none), 1);
    char *errline = line_with(err, "berth: error: ");
    ck_assert_msg(errline && strstr(errline, none), "%s", err);
    free(errline);
    free(out), free(err);
    free(none), free(sel), free(ini), free(ck);
}
END_TEST

static Suite *cli_suite(void)
{
    Suite *s = suite_create("cli");
    TCase *tc = tcase_create("berth");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, version_and_help);
    tcase_add_test(tc, usage_errors_exit_2);
    tcase_add_test(tc, shipped_cpu_config_lists_the_build_plugins);
    tcase_add_test(tc, conformance_listing);
    tcase_add_test(tc, fatal_config_errors_exit_1_with_file_and_line);
    tcase_add_test(tc, missing_folder_and_path_are_warnings);
    tcase_add_test(tc, model_selection_is_printed);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return check_run(cli_suite(), 0) ? EXIT_FAILURE : EXIT_SUCCESS;
}

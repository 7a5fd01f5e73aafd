/*
 * test_backend_selection.c — registry_select(): which model plugin and backend run a checkpoint, and the exact
 * reason recorded for every one not chosen. Uses the test plugins (tests/plugins/) and a tiny checkpoint written
 * at run time, opened with the real host/checkpoint.c.
 *
 * The backends of conformance.ini, by priority: newminor 200 (disabled), zerodev 100 (no devices), initfail 80
 * (init fails), noattn 50 (no attention op), testcpu 10 (good). The model testmodel needs matmul + attention.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "config.h"
#include "errors.h"
#include "registry.h"
#include "test_registry_support.h"
#include "check_run.h"

static char *tmp, *plugdir, *ckdir;
static berth_checkpoint *ck;
static struct berth_config *cfg;
static struct registry *reg;

static void setup(void)
{
    unsetenv("BERTH_BACKEND");
    tmp = ts_tmpdir();
    plugdir = ts_test_plugin_dir();
    ckdir = ts_fmt("%s/ckpt", tmp);
    ck_assert_int_eq(mkdir(ckdir, 0700), 0);
    ts_make_checkpoint(ckdir, "berth_test");
    ck_assert_msg(ckpt_open(ckdir, &ck) == BERTH_OK, "ckpt_open: %s", berth_last_error());
    cfg = NULL;
    reg = NULL;
}

static void teardown(void)
{
    registry_free(reg);
    config_free(cfg);
    ckpt_close(ck);
    ts_rmtree(tmp);
    free(ckdir);
    free(plugdir);
    free(tmp);
}

/* Load a config file and its registry into the globals. */
static void load(const char *ini)
{
    ck_assert_msg(config_load(ini, &cfg) == BERTH_OK, "%s", berth_last_error());
    ck_assert_msg(registry_load(cfg, &reg) == BERTH_OK, "%s", berth_last_error());
}

static void load_conformance(void)
{
    char *ini = ts_conformance_ini();
    ts_capture_begin(); /* its missing path= warns */
    load(ini);
    free(ts_capture_end());
    free(ini);
}

/* A config naming plugins of the test folder by path ("testcpu" -> backend_testcpu.so) plus extra text. */
static char *write_config(const char *const files[], const char *extra)
{
    char *text = strdup("[plugins]\n");
    for (const char *const *f = files; *f; f++) {
        char *t = ts_fmt("%spath = %s/%s.so\n", text, plugdir, *f);
        free(text);
        text = t;
    }
    char *t = ts_fmt("%s%s", text, extra);
    char *path = ts_write(tmp, "berth.ini", t);
    free(t);
    free(text);
    return path;
}

/* Expect registry_select to fail with exactly msg; nothing stays created. */
static void expect_fail(berth_status code, const char *msg)
{
    struct selection sel;
    berth_status st = registry_select(reg, ck, &sel);
    ck_assert_int_eq(st, code);
    ck_assert_str_eq(berth_last_error(), msg);
    ck_assert_ptr_null(sel.model);
    ck_assert_ptr_null(sel.backend);
    ck_assert_ptr_null(sel.backend_plugin);
}

START_TEST(conformance_config_picks_testcpu_with_every_reason)
{
    load_conformance();
    struct selection sel;
    ts_capture_begin();
    berth_status st = registry_select(reg, ck, &sel);
    char *err = ts_capture_end();
    ck_assert_msg(st == BERTH_OK, "%s", berth_last_error());
    ck_assert_str_eq(sel.why,
                     "model plugin: testmodel 0.1.0 (accepts model_type 'berth_test')\n"
                     "  picky: declined: model_type 'berth_test' is not picky_arch\n"
                     "backend: testcpu 0.1.0, device 0 (Test CPU device 0), priority 10\n"
                     "  newminor: disabled in config\n"
                     "  zerodev: no devices: 0 TEST devices: no test accelerator here\n"
                     "  initfail: init of device 0 failed: initfail: simulated init failure\n"
                     "  noattn: lacks op attention (head_dim 64, window 0) required by testmodel: no 'attention' in "
                     "its op table\n");
    /* Falling back past enabled backends is said on stderr; the disabled one is not a fallback. */
    ck_assert_str_eq(err, "berth: warning: using backend 'testcpu' for testmodel: zerodev: no devices: 0 TEST "
                          "devices: no test accelerator here; initfail: init of device 0 failed: initfail: "
                          "simulated init failure; noattn: lacks op attention (head_dim 64, window 0) required by "
                          "testmodel: no 'attention' in its op table\n");
    struct plugin *cpu = registry_find(reg, BERTH_PLUGIN_BACKEND, "testcpu");
    ck_assert_ptr_eq(sel.model_plugin, registry_find(reg, BERTH_PLUGIN_MODEL, "testmodel"));
    ck_assert_ptr_eq(sel.backend_plugin, cpu);
    ck_assert_int_eq(sel.device, 0);
    ck_assert_ptr_nonnull(sel.model);
    ck_assert_ptr_nonnull(sel.backend);
    /* The api handed to load(): the initialised backend, its tables and its device. */
    ck_assert_uint_eq(sel.api.struct_size, sizeof(berth_backend_api));
    ck_assert_int_eq(sel.api.device_index, 0);
    ck_assert_ptr_eq(sel.api.vt, cpu->desc->vtable);
    ck_assert_ptr_eq(sel.api.be, sel.backend);
    ck_assert_ptr_eq(sel.api.ops, sel.api.vt->get_ops(sel.backend));
    ck_assert_ptr_eq(sel.api.device, &cpu->devices[0]);
    ck_assert_ptr_nonnull(sel.api.ops->attention);
    ck_assert_str_eq(berth_last_error(), "");
    selection_destroy_model(&sel);
    ck_assert_ptr_null(sel.model);
    ck_assert_ptr_nonnull(sel.backend);
    selection_release(&sel);
    ck_assert_ptr_null(sel.model);
    ck_assert_ptr_null(sel.backend);
    selection_release(&sel); /* twice is harmless */
    free(err);
}
END_TEST

START_TEST(gpu_backend_enabled_without_gpu_falls_back_to_cpu)
{
    /* zerodev plays a GPU backend on a machine without the GPU: enabled, highest priority, 0 devices. */
    static const char *const files[] = {"backend_testcpu", "backend_zerodev", "model_testmodel", NULL};
    char *ini = write_config(files, "[backend.zerodev]\nenabled = true\npriority = 100\n"
                                    "[backend.testcpu]\nenabled = true\npriority = 10\n");
    load(ini);
    struct selection sel;
    ts_capture_begin();
    berth_status st = registry_select(reg, ck, &sel);
    char *err = ts_capture_end();
    ck_assert_msg(st == BERTH_OK, "%s", berth_last_error());
    ck_assert_str_eq(sel.backend_plugin->desc->name, "testcpu");
    ck_assert_str_eq(sel.why, "model plugin: testmodel 0.1.0 (accepts model_type 'berth_test')\n"
                              "backend: testcpu 0.1.0, device 0 (Test CPU device 0), priority 10\n"
                              "  zerodev: no devices: 0 TEST devices: no test accelerator here\n");
    ck_assert_str_eq(err, "berth: warning: using backend 'testcpu' for testmodel: zerodev: no devices: 0 TEST "
                          "devices: no test accelerator here\n");
    selection_release(&sel);
    free(err);
    free(ini);
}
END_TEST

START_TEST(real_cuda_plugin_without_gpu_falls_back_to_cpu)
{
    /* Only meaningful where the CUDA plugin was built, loads, and finds no GPU (like the CI machine). */
    char *cuda = ts_fmt("%s/plugins/berth-backend-cuda.so", ts_build_root());
    if (access(cuda, R_OK) != 0) {
        free(cuda);
        return;
    }
    char *text = ts_fmt("[plugins]\npath = %s\npath = %s/backend_testcpu.so\npath = %s/model_testmodel.so\n"
                        "[backend.cuda]\nenabled = true\npriority = 100\n[backend.testcpu]\npriority = 10\n",
                        cuda, plugdir, plugdir);
    char *ini = ts_write(tmp, "berth.ini", text);
    load(ini);
    struct plugin *cp = registry_find(reg, BERTH_PLUGIN_BACKEND, "cuda");
    if (cp && cp->probe.n_devices == 0) {
        struct selection sel;
        ts_capture_begin();
        berth_status st = registry_select(reg, ck, &sel);
        free(ts_capture_end());
        ck_assert_msg(st == BERTH_OK, "%s", berth_last_error());
        ck_assert_str_eq(sel.backend_plugin->desc->name, "testcpu");
        char *line = ts_fmt("\n  cuda: no devices: %s\n", cp->probe.message);
        ck_assert_msg(strstr(sel.why, line) != NULL, "why lacks '%s':\n%s", line, sel.why);
        ck_assert_str_ne(cp->probe.message, "");
        free(line);
        selection_release(&sel);
    }
    free(ini);
    free(text);
    free(cuda);
}
END_TEST

START_TEST(berth_backend_forces_even_a_disabled_backend)
{
    load_conformance();
    setenv("BERTH_BACKEND", "newminor", 1);
    struct selection sel;
    berth_status st = registry_select(reg, ck, &sel);
    ck_assert_msg(st == BERTH_OK, "%s", berth_last_error());
    ck_assert_str_eq(sel.backend_plugin->desc->name, "newminor");
    ck_assert_str_eq(sel.why,
                     "model plugin: testmodel 0.1.0 (accepts model_type 'berth_test')\n"
                     "  picky: declined: model_type 'berth_test' is not picky_arch\n"
                     "backend: newminor 0.1.0, device 0 (Test CPU device 0), priority 200, forced by "
                     "BERTH_BACKEND=newminor\n"
                     "  zerodev: not selected: BERTH_BACKEND=newminor\n"
                     "  initfail: not selected: BERTH_BACKEND=newminor\n"
                     "  noattn: not selected: BERTH_BACKEND=newminor\n"
                     "  testcpu: not selected: BERTH_BACKEND=newminor\n");
    selection_release(&sel);
}
END_TEST

START_TEST(berth_backend_unknown_or_unusable_is_fatal)
{
    load_conformance();
    setenv("BERTH_BACKEND", "nosuch", 1);
    expect_fail(BERTH_E_NOT_FOUND, "BERTH_BACKEND=nosuch: no backend plugin named 'nosuch' is loaded (loaded "
                                   "backends: initfail, newminor, noattn, testcpu, zerodev)");
    /* A rejected plugin's name is as unknown as a made-up one. */
    setenv("BERTH_BACKEND", "nullmember", 1);
    expect_fail(BERTH_E_NOT_FOUND, "BERTH_BACKEND=nullmember: no backend plugin named 'nullmember' is loaded "
                                   "(loaded backends: initfail, newminor, noattn, testcpu, zerodev)");
    /* Forced onto a backend that cannot run the model: no fallback. */
    setenv("BERTH_BACKEND", "noattn", 1);
    expect_fail(BERTH_E_UNSUPPORTED, "no usable backend for testmodel (BERTH_BACKEND=noattn): noattn: lacks op "
                                     "attention (head_dim 64, window 0) required by testmodel: no 'attention' in "
                                     "its op table");
    setenv("BERTH_BACKEND", "zerodev", 1);
    expect_fail(BERTH_E_UNSUPPORTED, "no usable backend for testmodel (BERTH_BACKEND=zerodev): zerodev: no "
                                     "devices: 0 TEST devices: no test accelerator here");
    /* An empty BERTH_BACKEND is the same as none. */
    setenv("BERTH_BACKEND", "", 1);
    struct selection sel;
    ts_capture_begin();
    ck_assert_int_eq(registry_select(reg, ck, &sel), BERTH_OK);
    free(ts_capture_end());
    ck_assert_str_eq(sel.backend_plugin->desc->name, "testcpu");
    selection_release(&sel);
}
END_TEST

START_TEST(model_section_backend_and_plugin)
{
    static const char *const files[] = {"backend_testcpu", "backend_noattn", "model_testmodel", "model_picky", NULL};
    char *ini = write_config(files, "[backend.noattn]\npriority = 50\n[model]\nbackend = testcpu\n");
    load(ini);
    struct selection sel;
    ck_assert_msg(registry_select(reg, ck, &sel) == BERTH_OK, "%s", berth_last_error());
    ck_assert_str_eq(sel.why, "model plugin: testmodel 0.1.0 (accepts model_type 'berth_test')\n"
                              "  picky: declined: model_type 'berth_test' is not picky_arch\n"
                              "backend: testcpu 0.1.0, device 0 (Test CPU device 0), priority 0, forced by [model] "
                              "backend = testcpu\n"
                              "  noattn: not selected: [model] backend = testcpu\n");
    selection_release(&sel);
    /* BERTH_BACKEND beats the config file. */
    setenv("BERTH_BACKEND", "noattn", 1);
    expect_fail(BERTH_E_UNSUPPORTED, "no usable backend for testmodel (BERTH_BACKEND=noattn): noattn: lacks op "
                                     "attention (head_dim 64, window 0) required by testmodel: no 'attention' in "
                                     "its op table");
    unsetenv("BERTH_BACKEND");
    registry_free(reg);
    config_free(cfg);
    free(ini);

    ini = write_config(files, "[model]\nplugin = testmodel\nbackend = cuda\n");
    load(ini);
    char *msg = ts_fmt("%s:8: [model] backend: no backend plugin named 'cuda' is loaded (loaded backends: testcpu, "
                       "noattn)",
                       ini);
    expect_fail(BERTH_E_NOT_FOUND, msg);
    free(msg);
    registry_free(reg);
    config_free(cfg);
    free(ini);

    ini = write_config(files, "[model]\nplugin = gemma4\n");
    load(ini);
    msg = ts_fmt("%s:7: [model] plugin: no model plugin named 'gemma4' is loaded (loaded model plugins: testmodel, "
                 "picky)",
                 ini);
    expect_fail(BERTH_E_NOT_FOUND, msg);
    free(msg);
    registry_free(reg);
    config_free(cfg);
    free(ini);

    ini = write_config(files, "[model]\nplugin = picky\n");
    load(ini);
    msg = ts_fmt("%s:7: [model] plugin: model plugin 'picky' does not accept %s (model_type 'berth_test'): "
                 "model_type 'berth_test' is not picky_arch",
                 ini, ckdir);
    expect_fail(BERTH_E_UNSUPPORTED, msg);
    free(msg);
    registry_free(reg);
    config_free(cfg);
    free(ini);

    /* Without sections both backends have priority 0: name order tries noattn first. */
    ini = write_config(files, "[model]\nplugin = testmodel\n");
    load(ini);
    ts_capture_begin();
    berth_status st = registry_select(reg, ck, &sel);
    free(ts_capture_end());
    ck_assert_msg(st == BERTH_OK, "%s", berth_last_error());
    ck_assert_str_eq(sel.why, "model plugin: testmodel 0.1.0 (accepts model_type 'berth_test'; forced by [model] "
                              "plugin)\n"
                              "backend: testcpu 0.1.0, device 0 (Test CPU device 0), priority 0\n"
                              "  noattn: lacks op attention (head_dim 64, window 0) required by testmodel: no "
                              "'attention' in its op table\n");
    selection_release(&sel);
    free(ini);
}
END_TEST

START_TEST(supports_refusal_and_no_usable_backend)
{
    /* The model asks for head_dim 512; testcpu's supports() stops at 256. */
    static const char *const files[] = {"backend_testcpu", "backend_noattn", "model_testmodel", NULL};
    char *ini = write_config(files, "[backend.testcpu]\npriority = 10\n[model.testmodel]\nhead_dim = 512\n");
    load(ini);
    expect_fail(BERTH_E_UNSUPPORTED, "no usable backend for testmodel: testcpu: lacks op attention (head_dim 512, "
                                     "window 0) required by testmodel: testcpu: attention head_dim 512 exceeds 256; "
                                     "noattn: lacks op attention (head_dim 512, window 0) required by testmodel: no "
                                     "'attention' in its op table");
    struct selection sel;
    registry_select(reg, ck, &sel);
    ck_assert_str_eq(sel.why, "model plugin: testmodel 0.1.0 (accepts model_type 'berth_test')\n"
                              "backend: none usable\n"
                              "  testcpu: lacks op attention (head_dim 512, window 0) required by testmodel: testcpu: "
                              "attention head_dim 512 exceeds 256\n"
                              "  noattn: lacks op attention (head_dim 512, window 0) required by testmodel: no "
                              "'attention' in its op table\n");
    free(ini);
}
END_TEST

/* A malformed requirement list (a NULL entry, or one whose struct_size does not reach params) is refused with a
 * reason, never dereferenced. */
START_TEST(malformed_requirement_is_refused)
{
    static const char *const files[] = {"backend_testcpu", "model_testmodel", NULL};
    char *ini = write_config(files, "[model.testmodel]\nbad_requirement = null\n");
    load(ini);
    expect_fail(BERTH_E_UNSUPPORTED, "no usable backend for testmodel: testcpu: cannot check requirement 1 of "
                                     "testmodel: it is NULL");
    registry_free(reg);
    config_free(cfg);
    free(ini);
    ini = write_config(files, "[model.testmodel]\nbad_requirement = small\n");
    load(ini);
    expect_fail(BERTH_E_UNSUPPORTED, "no usable backend for testmodel: testcpu: cannot check requirement 1 of "
                                     "testmodel: it is too small (struct_size)");
    free(ini);
}
END_TEST

START_TEST(model_plugin_problems)
{
    static const char *const files[] = {"backend_testcpu", "model_testmodel", "model_picky", NULL};
    char *ini = write_config(files, "[model.testmodel]\nhead_dim = abc\n");
    load(ini);
    expect_fail(BERTH_E_UNSUPPORTED,
                "model plugin 'testmodel': create failed: [model.testmodel] head_dim: not a positive integer");
    /* No plugin takes this model_type: every decline is named. */
    berth_checkpoint *other = NULL;
    char *odir = ts_fmt("%s/other", tmp);
    ck_assert_int_eq(mkdir(odir, 0700), 0);
    ts_make_checkpoint(odir, "llama");
    ck_assert_msg(ckpt_open(odir, &other) == BERTH_OK, "%s", berth_last_error());
    struct selection sel;
    ck_assert_int_eq(registry_select(reg, other, &sel), BERTH_E_UNSUPPORTED);
    char *want = ts_fmt("no model plugin accepts %s (model_type 'llama'): picky: declined: model_type 'llama' is "
                        "not picky_arch; testmodel: declined: model_type 'llama' is not berth_test",
                        odir);
    ck_assert_str_eq(berth_last_error(), want);
    free(want);
    ck_assert_ptr_null(sel.model);
    ckpt_close(other);
    free(odir);
    registry_free(reg);
    config_free(cfg);
    free(ini);

    static const char *const no_models[] = {"backend_testcpu", NULL};
    ini = write_config(no_models, "");
    load(ini);
    char *msg = ts_fmt("no model plugin is loaded (see `berth plugins --config %s`)", ini);
    expect_fail(BERTH_E_NOT_FOUND, msg);
    free(msg);
    free(ini);
}
END_TEST

START_TEST(device_index_and_ties)
{
    static const char *const files[] = {"backend_testcpu", "backend_newminor", "model_testmodel", NULL};
    /* Equal priority: name order decides (newminor before testcpu). */
    char *ini = write_config(files, "[backend.testcpu]\npriority = 10\n[backend.newminor]\npriority = 10\n");
    load(ini);
    struct selection sel;
    ck_assert_msg(registry_select(reg, ck, &sel) == BERTH_OK, "%s", berth_last_error());
    ck_assert_str_eq(sel.why, "model plugin: testmodel 0.1.0 (accepts model_type 'berth_test')\n"
                              "backend: newminor 0.1.0, device 0 (Test CPU device 0), priority 10\n"
                              "  testcpu: not tried: newminor (priority 10) comes first (priority 10)\n");
    selection_release(&sel);
    registry_free(reg);
    config_free(cfg);
    free(ini);

    /* A device the backend does not have. */
    ini = write_config(files, "[backend.newminor]\nenabled = false\n[backend.testcpu]\ndevice = 3\n");
    load(ini);
    expect_fail(BERTH_E_UNSUPPORTED, "no usable backend for testmodel: newminor: disabled in config; testcpu: device 3 "
                                     "not present (1 device)");
    free(ini);
}
END_TEST

static Suite *selection_suite(void)
{
    Suite *s = suite_create("backend_selection");
    TCase *tc = tcase_create("select");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, conformance_config_picks_testcpu_with_every_reason);
    tcase_add_test(tc, gpu_backend_enabled_without_gpu_falls_back_to_cpu);
    tcase_add_test(tc, real_cuda_plugin_without_gpu_falls_back_to_cpu);
    tcase_add_test(tc, berth_backend_forces_even_a_disabled_backend);
    tcase_add_test(tc, berth_backend_unknown_or_unusable_is_fatal);
    tcase_add_test(tc, model_section_backend_and_plugin);
    tcase_add_test(tc, supports_refusal_and_no_usable_backend);
    tcase_add_test(tc, model_plugin_problems);
    tcase_add_test(tc, malformed_requirement_is_refused);
    tcase_add_test(tc, device_index_and_ties);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return check_run(selection_suite(), 0) ? EXIT_FAILURE : EXIT_SUCCESS;
}
